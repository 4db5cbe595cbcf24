// Corrupted bytes are caught by the chunk checksums (checksum=crc32c): a byte flipped on the wire
// (a proxy between two TCP endpoints) or by a payload path as it lands (the loop transport) fails
// that operation with kDataLoss, is counted, and the endpoint goes on.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "core/crc32c.h"
#include "core/sys.h"
#include "engine/test_util.h"
#include "transport/conformance.h"
#include "transport/loop_transport.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;

const Harness& harness(const char* name) {  // (a std::string: GCC 13 warns -Wdangling-reference)
  for (const Harness& h : harnesses())
    if (h.name == name) return h;
  throw std::runtime_error(std::string("no harness ") + name);
}

// Dials `address` (the listener's, or a proxy's in front of it) and accepts: client, server.
std::pair<Endpoint, Endpoint> dial(Context& client, Listener& l, const std::string& address) {
  auto c = client.connect(address);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  auto s = l.accept(kEventually);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  if (!c.ok() || !s.ok()) return {};
  return {std::move(*c), std::move(*s)};
}

Options checked() {
  Options o = test_options(1);
  o.set("chunk_size", "1M").set("checksum", "crc32c").set("peer_timeout", kPatientPeerTimeout);
  return o;
}

// Forwards one TCP connection each way. Client to server it reads frame by frame (56-byte header,
// payload_len at byte 8, type at byte 4) and flips one bit in the middle of the payload of the
// `nth` SEND_DATA frame (counting from 1).
class FlippingProxy {
 public:
  FlippingProxy(uint16_t target, int nth) : target_(target), nth_(nth) {
    listen_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    EXPECT_EQ(::bind(listen_.get(), reinterpret_cast<sockaddr*>(&a), len), 0);
    EXPECT_EQ(::listen(listen_.get(), 4), 0);
    EXPECT_EQ(::getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~FlippingProxy() {
    stop_ = true;
    thread_.join();
  }
  std::string address() const { return "tcp://127.0.0.1:" + std::to_string(port_); }
  bool flipped() const { return flipped_; }

 private:
  void run() {
    pollfd pl{listen_.get(), POLLIN, 0};
    while (!stop_ && ::poll(&pl, 1, 50) == 0) {
    }
    if (stop_) return;
    UniqueFd client(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    UniqueFd server(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(target_);
    if (::connect(server.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    std::vector<unsigned char> buf(1 << 16);
    size_t header_got = 0, payload_left = 0, payload_pos = 0, payload_len = 0;
    unsigned char header[56];
    int data_frames = 0;
    bool flip_this = false;
    while (!stop_) {
      pollfd p[2] = {{client.get(), POLLIN, 0}, {server.get(), POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      if (p[1].revents) {  // server -> client: as is
        ssize_t k = ::read(server.get(), buf.data(), buf.size());
        if (k <= 0 || !write_all(client.get(), buf.data(), static_cast<size_t>(k))) return;
      }
      if (!p[0].revents) continue;
      ssize_t k = ::read(client.get(), buf.data(), buf.size());
      if (k <= 0) return;
      for (size_t i = 0; i < static_cast<size_t>(k); ++i) {  // frame by frame, byte by byte
        if (payload_left == 0) {
          header[header_got++] = buf[i];
          if (header_got == 56) {
            header_got = 0;
            std::memcpy(&payload_len, header + 8, 4);
            payload_len &= 0xffffffffu;
            payload_left = payload_len;
            payload_pos = 0;
            flip_this = header[4] == 19 && ++data_frames == nth_ && payload_len > 0;  // SEND_DATA
          }
        } else {
          if (flip_this && payload_pos == payload_len / 2) {
            buf[i] ^= 0x08;
            flipped_ = true;
          }
          ++payload_pos;
          --payload_left;
        }
      }
      if (!write_all(server.get(), buf.data(), static_cast<size_t>(k))) return;
    }
  }
  static bool write_all(int fd, const unsigned char* p, size_t n) {
    while (n > 0) {
      ssize_t k = ::write(fd, p, n);
      if (k <= 0) return false;
      p += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }

  UniqueFd listen_;
  uint16_t port_ = 0;
  const uint16_t target_;
  const int nth_;
  std::atomic<bool> stop_{false}, flipped_{false};
  std::thread thread_;
};

// The corrupted message fails at the receiver with kDataLoss; the next one arrives intact.
void expect_loss_then_recovery(Endpoint& client, Endpoint& server, size_t n) {
  const uint64_t errors = server.stats().checksum_errors;
  Filled a = filled(MemSpec{}, n), b = filled(MemSpec{}, n);
  Buffer da = poisoned(MemSpec{}, n), db = poisoned(MemSpec{}, n);
  Request r1 = server.recv(da.region(), 1);
  Request s1 = client.send(a.buf.region(), 1);
  Status got = r1.wait(kEventually);
  EXPECT_EQ(got.code(), Code::kDataLoss) << got.to_string();
  EXPECT_NE(got.message().find("CRC32C"), std::string::npos) << got.to_string();
  EXPECT_TRUE(s1.wait(kEventually).code() != Code::kTimeout) << "the sender's operation never ended";
  Request r2 = server.recv(db.region(), 2);
  Request s2 = client.send(b.buf.region(), 2);
  ASSERT_TRUE(s2.wait(kEventually).ok()) << s2.status().to_string();
  ASSERT_TRUE(r2.wait(kEventually).ok()) << r2.status().to_string();
  EXPECT_EQ(read_back(db.region()), b.data);
  EXPECT_EQ(r2.crc32c(), crc32c::of(b.data.data(), n));
  EXPECT_EQ(server.stats().checksum_errors, errors + 1);
  EXPECT_TRUE(server.health().ok()) << server.health().to_string();
}

TEST(ChecksumCorruption, TcpBitFlippedOnTheWireFailsOnlyThatMessage) {
  auto ctx = harness("tcp").make_context(0, checked());
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  auto l = ctx->listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok());
  const std::string addr = l->address();
  uint16_t port = static_cast<uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1)));
  FlippingProxy proxy(port, 2);  // the second chunk of the first message
  auto [c, s] = dial(*ctx, *l, proxy.address());
  ASSERT_TRUE(c.valid() && s.valid());
  ASSERT_NO_FATAL_FAILURE(expect_loss_then_recovery(c, s, 3 * (1 << 20) + 11));
  EXPECT_TRUE(proxy.flipped());
}

TEST(ChecksumCorruption, LoopPathChunkCorruptedAsItLandsFailsOnlyThatMessage) {
  const Harness& h = harness("loop");
  auto sc = h.make_context(0, checked());
  auto cc = h.make_context(1, checked());
  ASSERT_TRUE(sc.ok() && cc.ok());
  auto l = sc->listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok());
  auto [c, s] = dial(*cc, *l, l->address());
  ASSERT_TRUE(c.valid() && s.valid());
  ASSERT_EQ(s.stats().transport, "loop");
  corrupt_loop_chunks(1);
  ASSERT_NO_FATAL_FAILURE(expect_loss_then_recovery(c, s, 3 * (1 << 20) + 11));
  // An eager message by the path, too.
  corrupt_loop_chunks(1);
  ASSERT_NO_FATAL_FAILURE(expect_loss_then_recovery(c, s, 100));
  // And one that arrives before its receive: kept as unexpected, it fails the receive that takes it.
  corrupt_loop_chunks(1);
  Filled early = filled(MemSpec{}, 100);
  Buffer into = poisoned(MemSpec{}, 100);
  ASSERT_TRUE(c.send(early.buf.region(), 9).wait(kEventually).ok());
  Status late = s.recv(into.region(), 9).wait(kEventually);
  EXPECT_EQ(late.code(), Code::kDataLoss) << late.to_string();
  EXPECT_TRUE(s.health().ok());
}

// Device memory over the staged TCP path: the device computes each chunk's CRC beside its staging
// copy, both ways, eager messages included (sim memory here, CUDA memory on the GPU machine).
class ChecksumStaged : public ::testing::TestWithParam<MemKind> {};

TEST_P(ChecksumStaged, DeviceMemoryChunksCarryTheDevicesCrc) {
  const MemSpec mem{GetParam(), 0};
  if (Status s = mem_available(mem); !s.ok()) DMX_SKIP(kNoGpu) << s.message();
  auto ctx = harness("tcp").make_context(0, checked().set("streams", "2"));
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  auto l = ctx->listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok());
  auto [c, s] = dial(*ctx, *l, l->address());
  ASSERT_TRUE(c.valid() && s.valid());
  for (size_t n : {size_t{0}, size_t{8}, size_t{4097}, (size_t{1} << 20) + 1, (size_t{5} << 20) + 3}) {
    Filled src = filled(mem, n + 1);
    Buffer dst = poisoned(mem, n + 2);
    Request r = s.recv(dst.region().sub(2, n), 7);
    Request q = c.send(src.buf.region().sub(1, n), 7);
    ASSERT_TRUE(q.wait(kEventually).ok()) << n << " B: " << q.status().to_string();
    ASSERT_TRUE(r.wait(kEventually).ok()) << n << " B: " << r.status().to_string();
    std::vector<unsigned char> got = read_back(dst.region());
    ASSERT_TRUE(std::equal(src.data.begin() + 1, src.data.end(), got.begin() + 2)) << n << " B differ";
    EXPECT_EQ(q.crc32c(), crc32c::of(src.data.data() + 1, n)) << n;
    EXPECT_EQ(r.crc32c(), q.crc32c()) << n;
  }
  EXPECT_GT(s.stats().h2d_copies, 0u);
  EXPECT_EQ(s.stats().checksum_errors, 0u);
}

INSTANTIATE_TEST_SUITE_P(Kinds, ChecksumStaged, ::testing::Values(MemKind::kSim, MemKind::kCuda),
                         [](const auto& info) { return info.param == MemKind::kSim ? "Sim" : "Cuda"; });

}  // namespace
}  // namespace dmx::test
