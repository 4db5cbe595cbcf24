// Byte-exact delivery over each data path (staged TCP, and the same-host paths auto picks): every
// memory kind pair, odd sizes, offsets, both operation styles.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "engine/context_impl.h"
#include "engine/test_util.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;

struct KindPair {
  const char* src;
  const char* dst;
  const char* transport;  // "tcp", or "auto" (same host: shm, cuda_ipc for device sources)
};
void PrintTo(const KindPair& k, std::ostream* os) { *os << k.src << " -> " << k.dst << " over " << k.transport; }

class Transfer : public ::testing::TestWithParam<KindPair> {
 protected:
  void SetUp() override {
    src_ = *parse_mem_spec(GetParam().src);
    dst_ = *parse_mem_spec(GetParam().dst);
    for (MemSpec m : {src_, dst_})
      if (Status s = mem_available(m); !s.ok()) DMX_SKIP(kNoGpu) << s.message();
  }
  Pair connect_pair() {
    Options o = test_options();
    o.set("transport", GetParam().transport);
    Pair p = test::connect_pair(o);
    std::string want = GetParam().transport;
    EndpointStats st = p.client.stats();
    if (want == "tcp") EXPECT_EQ(st.transport, "tcp");
    else EXPECT_NE(st.transport, "tcp") << "auto should pick a same-host path here: " << st.reason;
    return p;
  }
  MemSpec src_, dst_;
};

TEST_P(Transfer, SendRecvSizes) {
  Pair p = connect_pair();
  for (size_t n : {size_t{0}, size_t{1}, size_t{4097}, size_t{100000}, size_t{(64u << 20) + 3}}) {
    Filled src = filled(src_, n);
    Buffer dst = poisoned(dst_, n + 16);
    Request r = p.server.recv(dst.region(), 42);
    Request s = p.client.send(src.buf.region(), 42);
    ASSERT_TRUE(s.wait(kEventually).ok()) << n << ": " << s.status().to_string();
    ASSERT_TRUE(r.wait(kEventually).ok()) << n << ": " << r.status().to_string();
    EXPECT_EQ(r.bytes(), n);
    EXPECT_EQ(r.tag(), 42u);
    auto got = read_back(dst.region());
    ASSERT_TRUE(std::equal(src.data.begin(), src.data.end(), got.begin())) << "payload differs at size " << n;
    for (size_t i = n; i < n + 16; ++i) ASSERT_EQ(got[i], 0xA5) << "wrote past the message at size " << n;
  }
}

TEST_P(Transfer, SendAtOffsets) {
  Pair p = connect_pair();
  size_t n = 3 * (1 << 20) + 17;
  Filled src = filled(src_, n + 5);
  Buffer dst = poisoned(dst_, n + 11);
  Request r = p.server.recv(dst.region().sub(11, n), 7);
  Request s = p.client.send(src.buf.region().sub(5, n), 7);
  ASSERT_TRUE(s.wait(kEventually).ok());
  ASSERT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
  auto got = read_back(dst.region());
  EXPECT_TRUE(std::equal(src.data.begin() + 5, src.data.end(), got.begin() + 11));
  for (size_t i = 0; i < 11; ++i) ASSERT_EQ(got[i], 0xA5);
}

TEST_P(Transfer, WriteAndReadOneSided) {
  Pair p = connect_pair();
  size_t n = 5 * (1 << 20) + 1;
  Buffer target = poisoned(dst_, n + 100);
  auto reg = p.ctx.register_memory(target.region());
  ASSERT_TRUE(reg.ok());
  RemoteRegion remote = reg->remote();
  Filled src = filled(src_, n);
  OpOptions o;
  o.notify = true;
  o.notify_value = 0xfeed;
  Request w = p.client.write(src.buf.region(), remote, 50, o);
  ASSERT_TRUE(w.wait(kEventually).ok()) << w.status().to_string();
  auto note = p.server.next_notification(10s);
  ASSERT_TRUE(note.ok()) << note.status().to_string();
  EXPECT_EQ(note->value, 0xfeedu);
  EXPECT_EQ(note->length, n);
  auto got = read_back(target.region());
  EXPECT_TRUE(std::equal(src.data.begin(), src.data.end(), got.begin() + 50));
  EXPECT_EQ(got[49], 0xA5);
  EXPECT_EQ(got[50 + n], 0xA5);

  // Read it back into memory of the source's kind, from an offset.
  Buffer back = poisoned(src_, n - 7);
  Request rd = p.client.read(back.region(), remote, 57);
  ASSERT_TRUE(rd.wait(kEventually).ok()) << rd.status().to_string();
  auto again = read_back(back.region());
  EXPECT_TRUE(std::equal(again.begin(), again.end(), src.data.begin() + 7));
}

// Empty one-sided operations complete (with the notification) on every path, like empty sends.
TEST_P(Transfer, ZeroByteWriteAndRead) {
  Pair p = connect_pair();
  Buffer target = poisoned(dst_, 64);
  auto reg = p.ctx.register_memory(target.region());
  ASSERT_TRUE(reg.ok());
  Buffer local = poisoned(src_, 64);
  OpOptions o;
  o.notify = true;
  o.notify_value = 7;
  Request w = p.client.write(local.region().sub(3, 0), reg->remote(), 10, o);
  ASSERT_TRUE(w.wait(kEventually).ok()) << w.status().to_string();
  auto note = p.server.next_notification(10s);
  ASSERT_TRUE(note.ok()) << note.status().to_string();
  EXPECT_EQ(note->length, 0u);
  Request r = p.client.read(local.region().sub(5, 0), reg->remote(), 20);
  ASSERT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
  EXPECT_EQ(r.bytes(), 0u);
  for (unsigned char c : read_back(target.region())) ASSERT_EQ(c, 0xA5);
}

// Endpoint::on_notification: a notification that waited goes to the handler when it is set, later
// ones as their writes land, in order, each after its bytes; next_notification then gets none.
// OpOptions::on_complete_tag tells a kAnyTag receive's callback which message it got; an eager
// send (below eager_limit) goes from its buffer, without a CPU copy, and arrives byte-exact.
TEST_P(Transfer, NotificationHandlerAndTaggedReceives) {
  Pair p = connect_pair();
  const size_t n = 3001;
  Buffer target = poisoned(dst_, 4 * n);
  auto reg = p.ctx.register_memory(target.region());
  ASSERT_TRUE(reg.ok());
  Filled src = filled(src_, 4 * n);
  auto write = [&](int i) {
    OpOptions o;
    o.notify = true;
    o.notify_value = 100 + i;
    return p.client.write(src.buf.region().sub(i * n, n - i), reg->remote(), i * n, o);
  };
  ASSERT_TRUE(write(0).wait(kEventually).ok());  // waits for a handler
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Notification> got;
  std::vector<bool> landed;
  p.server.on_notification([&](const Notification& note) {
    auto bytes = read_back(target.region().sub((note.value - 100) * n, note.length));
    size_t off = (note.value - 100) * n;
    bool exact = std::equal(bytes.begin(), bytes.end(), src.data.begin() + static_cast<long>(off));
    std::lock_guard<std::mutex> lock(mu);
    got.push_back(note);
    landed.push_back(exact);
    cv.notify_all();
  });
  for (int i = 1; i < 4; ++i) ASSERT_TRUE(write(i).wait(kEventually).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return got.size() == 4; }));
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(got[i].value, 100 + i);
      EXPECT_EQ(got[i].key, reg->remote().key);
      EXPECT_EQ(got[i].length, n - i);
      EXPECT_TRUE(landed[i]) << "notification " << i << " came before its bytes";
    }
  }
  EXPECT_EQ(p.server.next_notification(50ms).status().code(), Code::kTimeout);

  // Two receives of any tag, told apart by the tag their callbacks get.
  const size_t m = 1000;  // eager: below the default eager_limit
  Buffer in = poisoned(dst_, 2 * m);
  std::vector<std::pair<uint64_t, size_t>> tags;
  for (int i = 0; i < 2; ++i) {
    OpOptions o;
    o.on_complete_tag = [&](const Status& st, size_t bytes, uint64_t tag) {
      std::lock_guard<std::mutex> lock(mu);
      tags.emplace_back(st.ok() ? tag : 0, bytes);
      cv.notify_all();
    };
    (void)p.server.recv(in.region().sub(i * m, m), kAnyTag, o);
  }
  uint64_t copies = p.client.stats().host_copies;
  ASSERT_TRUE(p.client.send(src.buf.region().sub(1, m), 9).wait(kEventually).ok());
  ASSERT_TRUE(p.client.send(src.buf.region().sub(7, m - 3), 5).wait(kEventually).ok());
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return tags.size() == 2; }));
  EXPECT_EQ(tags[0], std::make_pair(uint64_t{9}, m));
  EXPECT_EQ(tags[1], std::make_pair(uint64_t{5}, m - 3));
  auto back = read_back(in.region());
  EXPECT_TRUE(std::equal(back.begin(), back.begin() + m, src.data.begin() + 1));
  EXPECT_TRUE(std::equal(back.begin() + m, back.begin() + 2 * m - 3, src.data.begin() + 7));
  EXPECT_EQ(p.client.stats().host_copies, copies) << "an eager send goes from its buffer, uncopied";
}

#define DMX_KIND_PAIRS(t)                                                                                   \
  KindPair{"host", "host", t}, KindPair{"host", "sim", t}, KindPair{"sim", "host", t},                      \
      KindPair{"sim", "sim:1", t}, KindPair{"cuda:0", "cuda:0", t}, KindPair{"cuda:0", "host", t},          \
      KindPair{"host", "cuda:0", t}, KindPair{"pinned", "cuda:0", t}

std::string kind_pair_name(const ::testing::TestParamInfo<KindPair>& info) {
  std::string n = std::string(info.param.src) + "_to_" + info.param.dst;
  for (char& c : n)
    if (c == ':') c = '_';
  return n;
}

// Same host: stream 0 runs on the shared-memory control pipe unless either side turns it off
// (control_pipe=false) or forces tcp; data arrives byte-exact either way.
TEST(ControlPipe, UsedOnOneHostUnlessEitherSideSaysNo) {
  struct Case {
    const char* client_pipe;
    const char* server_pipe;
    const char* client_transport;
    const char* expect;
  };
  for (const Case& c : {Case{"true", "true", "auto", "shm pipe"}, Case{"false", "true", "auto", "tcp"},
                        Case{"true", "false", "auto", "tcp"}, Case{"true", "true", "tcp", "tcp"}}) {
    SCOPED_TRACE(::testing::Message() << "client control_pipe=" << c.client_pipe << " server control_pipe="
                                      << c.server_pipe << " client transport=" << c.client_transport);
    Options so = test_options();
    so.set("control_pipe", c.server_pipe);
    Options co = test_options();
    co.set("control_pipe", c.client_pipe).set("transport", c.client_transport);
    auto sctx = Context::create(so);
    auto cctx = Context::create(co);
    ASSERT_TRUE(sctx.ok() && cctx.ok());
    auto l = sctx->listen("tcp://127.0.0.1:0");
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    auto client = cctx->connect(l->address());
    ASSERT_TRUE(client.ok()) << client.status().to_string();
    auto server = l->accept(10s);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    EXPECT_EQ(client->stats().control_stream, c.expect) << client->stats().reason;
    EXPECT_EQ(server->stats().control_stream, c.expect) << server->stats().reason;
    bool piped = std::string(c.expect) == "shm pipe";
    EXPECT_EQ(client->stats().reason.find("control stream on an shm pipe") != std::string::npos, piped)
        << client->stats().reason;
    for (size_t n : {size_t{8}, size_t{(1 << 20) + 3}}) {
      Filled src = filled(MemSpec{}, n);
      Buffer dst = poisoned(MemSpec{}, n);
      Request r = server->recv(dst.region(), 5);
      ASSERT_TRUE(client->send(src.buf.region(), 5).wait(kEventually).ok());
      ASSERT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
      ASSERT_EQ(read_back(dst.region()), src.data) << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tcp, Transfer, ::testing::Values(DMX_KIND_PAIRS("tcp")), kind_pair_name);
INSTANTIATE_TEST_SUITE_P(SameHost, Transfer, ::testing::Values(DMX_KIND_PAIRS("auto")), kind_pair_name);

}  // namespace
}  // namespace dmx::test

namespace dmx::test {
namespace {

std::string topo_fixture(const std::string& name) {
  const char* base = std::getenv("DMX_TEST_FIXTURES");
  return std::string(base ? base : "tests/fixtures") + "/topo/" + name;
}

// Staging slots come from the machine's placement (topo/placement.h) by the P2PDMA rule, booked to
// the context until it ends. Forced to tcp: a pair in one process would agree on shm, which stages
// nothing. On the two-socket fixture (no CUDA overlay: sim devices 0 and 1 stand for the GPUs in
// PCI order, 03:00.0 on node 0 and 83:00.0 on node 1), each device's slots land on its own node.
TEST(Staging, SlotsArePlacedAndAccountedByTheOrchestrator) {
  std::string root = topo_fixture("dual-socket-icelake");
  std::shared_ptr<topo::Placement> placement;
  {
    Pair p = connect_pair(test_options(2).set("transport", "tcp").set("sysfs_root", root));
    ASSERT_EQ(p.client.stats().transport, "tcp") << p.client.stats().reason;
    size_t n = 3 << 20;
    Filled src = filled(MemSpec{MemKind::kSim, 0}, n);
    Buffer dst = poisoned(MemSpec{MemKind::kSim, 1}, n);
    Request r = p.server.recv(dst.region(), 1);
    ASSERT_TRUE(p.client.send(src.buf.region(), 1).wait(kEventually).ok());
    ASSERT_TRUE(r.wait(kEventually).ok());
    EXPECT_EQ(read_back(dst.region()), src.data);
    const StagingPlacement& sp = p.ctx.impl()->placement();
    placement = sp.placement();
    ASSERT_NE(placement, nullptr) << "the fixture's topology was not read";
    uint64_t used = 0, gpu_pools = 0;
    std::map<int, uint64_t> by_node;
    for (const auto& u : placement->usage()) {
      used += u.used;
      if (u.desc.kind == topo::PoolKind::kPinnedHost) by_node[u.desc.numa_node] += u.used;
      if (u.desc.kind == topo::PoolKind::kGpu) ++gpu_pools;
      for (const auto& [owner, bytes] : u.owners) EXPECT_NE(owner.find("staging of context"), std::string::npos) << owner;
    }
    EXPECT_EQ(gpu_pools, 2u);  // one per GPU of the fixture
    // 2 streams x 2 endpoints x (2 x 4 slots + 1 reserved) slots of 1 MiB, at most.
    EXPECT_GT(by_node[0], 0u) << "sim:0's staging (GPU 03:00.0, node 0)";
    EXPECT_GT(by_node[1], 0u) << "sim:1's staging (GPU 83:00.0, node 1)";
    EXPECT_LE(used, uint64_t{2 * 2 * 9} << 20);
    EXPECT_EQ(p.ctx.impl()->staging().allocated() << 20, used);
    EXPECT_EQ(sp.booked(), used);
  }
  // The context is gone: its staging is no longer booked on the machine's pools.
  uint64_t left = 0;
  for (const auto& u : placement->usage()) left += u.used;
  EXPECT_EQ(left, 0u);
}

// On a GPU machine the engine's GPU pools have CUDA memory behind them: a buffer from GPU 0's pool
// holds what is copied into it. Needs a GPU (skips elsewhere).
TEST(Placement, EngineGpuPoolsHaveCudaMemoryBehindThem) {
  DMX_SKIP_WITHOUT_GPU();
  auto ctx = Context::create(test_options(1));
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  std::shared_ptr<topo::Placement> machine = ctx->impl()->placement().machine();
  if (!machine) DMX_SKIP(kNotExercised) << "this machine's topology could not be read";
  const topo::Topology& t = machine->topology();
  int gpu = t.device_of_cuda(0);
  ASSERT_GE(gpu, 0) << "CUDA device 0 is not in the topology";
  std::string clients[] = {t.devices[static_cast<size_t>(gpu)].addr.to_string()};
  auto b = machine->allocate_gpu(clients, (1 << 20) + 3, "test");
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ASSERT_NE(b->data(), nullptr);
  EXPECT_EQ(b->cuda_device(), 0);
  MemRegion r{b->data(), (1 << 20) + 3, MemSpec{MemKind::kCuda, 0}};
  std::vector<unsigned char> data = random_bytes(r.size);
  ASSERT_TRUE(copy_memory(r, MemRegion{data.data(), data.size(), {}}).ok());
  EXPECT_EQ(read_back(r), data);
}

}  // namespace
}  // namespace dmx::test
