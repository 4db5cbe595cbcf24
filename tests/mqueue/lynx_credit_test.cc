// Credits: a full queue back-pressures (the request waits) instead of overwriting a slot, and
// every request is answered, byte-exact and in order, once the workers go on.
#include <random>

#include "mqueue_test_util.h"

namespace dmx::mqueue {
namespace {

using testing::Events;
using testing::frame;

constexpr uint32_t kSlots = 4;
constexpr uint32_t kRequests = 3 * kSlots + 1;

std::vector<std::vector<uint8_t>> payloads(uint32_t n) {
  std::mt19937 rng(std::random_device{}());
  std::vector<std::vector<uint8_t>> p(n);
  for (uint32_t i = 0; i < n; ++i) {
    p[i].resize(1 + rng() % 300);
    for (auto& b : p[i]) b = static_cast<uint8_t>(rng());
  }
  return p;
}

void expect_answer(const WireHeader& h, const std::vector<uint8_t>& got, const std::vector<uint8_t>& sent) {
  EXPECT_EQ(h.magic, kResponseMagic);
  ASSERT_EQ(got.size(), sent.size());
  for (size_t k = 0; k < got.size(); ++k) ASSERT_EQ(got[k], sent[k] ^ kXorKey) << "byte " << k;
}

class LynxCredits : public ::testing::TestWithParam<bool> {};

TEST_P(LynxCredits, FullQueueBackPressuresInsteadOfOverwriting) {
  const bool udp = GetParam();
  Events ev;
  ServerConfig cfg = testing::host_config(ev, 1, kSlots, 512);
  cfg.dispatch.credit_batch = 2;
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  (*server)->cpu_workers()->set_paused(true);
  Dispatcher& d = (*server)->dispatcher();

  auto addr = resolve(udp ? d.udp_address() : d.tcp_address());
  ASSERT_TRUE(addr.ok());
  Fd fd;
  if (udp) {
    fd = Fd(::socket(AF_INET, SOCK_DGRAM, 0));
    ASSERT_EQ(::connect(fd.get(), addr->sa(), addr->len), 0);
  } else {
    auto c = tcp_connect(*addr, std::chrono::seconds(5));
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    fd = std::move(*c);
  }
  ASSERT_TRUE(set_io_timeout(fd.get(), std::chrono::seconds(10)).ok());
  auto sent = payloads(kRequests);
  for (uint32_t i = 0; i < kRequests; ++i) {
    auto f = frame(kRequestMagic, static_cast<uint32_t>(sent[i].size()), i, sent[i]);
    ASSERT_EQ(::send(fd.get(), f.data(), f.size(), 0), static_cast<ssize_t>(f.size()));
  }
  // The ring takes kSlots requests; the rest wait for credits (never more in the queue).
  ASSERT_TRUE(testing::eventually([&] { return d.stats().requests == kSlots && d.stats().backpressure > 0; }))
      << "requests " << d.stats().requests;
  EXPECT_EQ(d.stats().max_occupancy, kSlots);
  EXPECT_EQ(d.stats().responses, 0u);
  (*server)->cpu_workers()->set_paused(false);

  for (uint32_t i = 0; i < kRequests; ++i) {
    WireHeader h{};
    std::vector<uint8_t> got(600);
    if (udp) {
      iovec iov[2] = {{&h, sizeof h}, {got.data(), got.size()}};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = 2;
      ssize_t n = ::recvmsg(fd.get(), &msg, 0);
      ASSERT_GE(n, static_cast<ssize_t>(sizeof h)) << "answer " << i << ": " << std::strerror(errno);
      got.resize(static_cast<size_t>(n) - sizeof h);
    } else {
      ASSERT_TRUE(read_all(fd.get(), &h, sizeof h, "server").ok()) << "answer " << i;
      ASSERT_LE(h.len, got.size());
      got.resize(h.len);
      ASSERT_TRUE(read_all(fd.get(), got.data(), h.len, "server").ok());
    }
    ASSERT_EQ(h.tag, i);  // one worker: answers in request order
    expect_answer(h, got, sent[i]);
  }
  ASSERT_TRUE((*server)->stop().ok());
  DispatcherStats st = d.stats();
  EXPECT_EQ(st.responses, kRequests);
  EXPECT_LE(st.max_occupancy, kSlots);
  EXPECT_GE(st.credit_writes, 1u);                  // credits went back,
  EXPECT_LT(st.credit_writes, uint64_t{kRequests});  // in batches, not one per response
}

INSTANTIATE_TEST_SUITE_P(Lynx, LynxCredits, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Udp" : "Tcp"; });

// Every wait has a deadline: a client of a server whose workers never answer gets its timeout.
TEST(LynxDeadlines, ClientOfAStuckServerTimesOut) {
  Events ev;
  auto server = Server::start(testing::host_config(ev, 1, 2));
  ASSERT_TRUE(server.ok());
  (*server)->cpu_workers()->set_paused(true);
  LoadConfig load;
  load.address = (*server)->dispatcher().udp_address();
  load.clients = 1;
  load.requests = 1;
  load.timeout = std::chrono::milliseconds(100);
  auto r = run_load(load);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->lost, 1u);
  EXPECT_TRUE((*server)->stop().ok());  // and stop does not wait for the stuck request
}

}  // namespace
}  // namespace dmx::mqueue
