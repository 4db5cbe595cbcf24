// Tests of the cuda_ipc payload path (src/engine/ipc_path.*).
//
// CudaIpcPath.*: the CUDA-free logic (chunk descriptor format and validation, drops, stop,
// lifetime), run everywhere in this process, which never initialises CUDA.
// CudaIpcPathGpu.*: two processes on real GPUs. CUDA cannot be used in a child forked after the
// parent initialised it, so (as in tests/transport/cuda_ipc_gpu_test.cc) the probe and both peers
// run in forked children; skipped with the reason when there is no usable GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>

#include "engine/ipc_path.h"
#include "memory/backend.h"
#include "transport/transport_test_util.h"

namespace dmx {
namespace {

using cuda_ipc::IpcDescriptor;
using shm::UnixChannel;
using testing::secs;
using namespace std::chrono_literals;

#define CHILD_CHECK(cond, code)                                                               \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "child %d: check failed: %s (line %d)\n", ::getpid(), #cond, __LINE__); \
      return code;                                                                            \
    }                                                                                         \
  } while (0)

// Records what a path reports; waits with deadlines.
class Recorder final : public PayloadPath::Events {
 public:
  void on_path_tx_done(PathKind, uint64_t, const Status&) override {
    std::lock_guard lock(mu_);
    ++tx_done;
  }
  void on_path_rx_done(PathKind kind, uint64_t seq, const Status& s) override {
    std::lock_guard lock(mu_);
    EXPECT_EQ(kind, PathKind::kCudaIpc);
    rx[seq] = s;
    ++rx_count[seq];
    ++rx_total;
    if (stopped != 0) ++rx_after_stop;
    if (on_rx) on_rx(seq);
    cv_.notify_all();
  }
  void on_path_failed(PathKind, const Status& s) override {
    std::lock_guard lock(mu_);
    ++failed;
    failure = s;
    cv_.notify_all();
  }
  void on_path_stopped(PathKind) override {
    std::lock_guard lock(mu_);
    ++stopped;
    cv_.notify_all();
  }
  bool wait_rx(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return rx_total >= n; });
  }
  bool wait_stopped(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return stopped > 0; });
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Status> rx;
  std::map<uint64_t, int> rx_count;
  size_t rx_total = 0, rx_after_stop = 0;
  int tx_done = 0, failed = 0, stopped = 0;
  Status failure;
  std::function<void(uint64_t)> on_rx;  // called under mu_ on the path's thread
};

Config config() {
  auto c = Config::resolve();
  EXPECT_TRUE(c.ok());
  return *c;
}

IpcDescriptor sample_descriptor() {
  IpcDescriptor d;
  for (size_t i = 0; i < d.handle.size(); ++i) d.handle[i] = static_cast<uint8_t>(i * 7 + 1);
  d.device_uuid[0] = 0xab;
  d.device = 1;
  d.owner_pid = 4242;
  d.alloc_id = 3;
  d.alloc_size = 8 << 20;
  d.offset = 4097;
  d.length = (1 << 20) + 3;
  return d;
}

std::vector<unsigned char> sample_bytes(std::vector<uint64_t> retired = {}) {
  return IpcChunkDescriptor{sample_descriptor(), std::move(retired)}.encode();
}

// ---- CUDA-free ----

TEST(CudaIpcPath, ChunkDescriptorRoundTrip) {
  for (size_t n : {size_t(0), size_t(1), kCudaIpcMaxRetired}) {
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < n; ++i) ids.push_back(100 + i);
    auto bytes = sample_bytes(ids);
    EXPECT_EQ(bytes.size(), IpcDescriptor::kWireSize + 8 * n);
    EXPECT_LE(bytes.size(), kMaxPathDescriptor);
    auto d = IpcChunkDescriptor::decode(bytes);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(d->retired, ids);
    EXPECT_EQ(d->source.handle, sample_descriptor().handle);
    EXPECT_EQ(d->source.length, sample_descriptor().length);
    EXPECT_EQ(d->source.offset, sample_descriptor().offset);
    EXPECT_EQ(d->source.owner_pid, 4242);
  }
}

TEST(CudaIpcPath, ChunkDescriptorRejectsMalformed) {
  auto good = sample_bytes({5});
  auto bad = [](std::vector<unsigned char> b) {
    auto d = IpcChunkDescriptor::decode(b);
    return !d.ok() && d.status().code() == Code::kProtocol;
  };
  EXPECT_TRUE(bad({}));
  EXPECT_TRUE(bad(std::vector<unsigned char>(good.begin(), good.begin() + IpcDescriptor::kWireSize - 1)));
  auto odd = good;
  odd.push_back(0);  // trailer not a multiple of 8
  EXPECT_TRUE(bad(odd));
  auto too_many = sample_bytes();
  for (size_t i = 0; i <= kCudaIpcMaxRetired; ++i) {
    uint64_t id = i + 1;
    too_many.insert(too_many.end(), reinterpret_cast<unsigned char*>(&id), reinterpret_cast<unsigned char*>(&id) + 8);
  }
  EXPECT_TRUE(bad(too_many));
  auto zero = good;
  std::memset(zero.data() + IpcDescriptor::kWireSize, 0, 8);  // retired id 0
  EXPECT_TRUE(bad(zero));
  auto magic = good;
  magic[0] ^= 1;
  EXPECT_TRUE(bad(magic));
  // Region past its allocation: offset is at byte 8+4+4+64+16+8+8 = 112.
  auto past = good;
  uint64_t off = (8 << 20) - 10;
  std::memcpy(past.data() + 112, &off, 8);
  EXPECT_TRUE(bad(past));
}

TEST(CudaIpcPath, ChunkDescriptorFuzzNeverCrashes) {
  std::mt19937_64 rng(11);
  auto good = sample_bytes({7, 8, 9});
  size_t accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<unsigned char> b;
    if (i % 2 == 0) {
      b = good;
      for (int k = 0; k < 1 + int(rng() % 4); ++k) b[rng() % b.size()] ^= static_cast<unsigned char>(1u << (rng() % 8));
      if (rng() % 8 == 0) b.resize(rng() % (kMaxPathDescriptor + 40));
    } else {
      b.resize(rng() % (kMaxPathDescriptor + 40));
      for (auto& c : b) c = static_cast<unsigned char>(rng());
    }
    auto d = IpcChunkDescriptor::decode(b);
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), Code::kProtocol);
      continue;
    }
    ++accepted;
    EXPECT_LE(d->source.offset, d->source.alloc_size);
    EXPECT_LE(d->source.length, d->source.alloc_size - d->source.offset);
    EXPECT_LE(d->retired.size(), kCudaIpcMaxRetired);
  }
  EXPECT_GT(accepted, 0u);  // flips in the handle, uuid, pid still decode
}

TEST(CudaIpcPath, AvailabilitySaysWhy) {
  // Asked in a child: this process must not initialise CUDA (the GPU tests fork after it).
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t child = testing::fork_child([&] {
    Status s = cuda_ipc_path_available();
    std::string msg = s.ok() ? "ok" : std::string(code_name(s.code())) + ": " + s.message();
    (void)!::write(fds[1], msg.data(), msg.size());
    return 0;
  });
  ::close(fds[1]);
  char buf[2048] = {};
  ssize_t got = ::read(fds[0], buf, sizeof buf - 1);
  ::close(fds[0]);
  EXPECT_EQ(testing::wait_child(child), 0);
  std::string text(buf, got > 0 ? size_t(got) : 0);
  std::cout << "cuda_ipc_path_available(): " << text << "\n";
  if (text == "ok") return;  // a GPU machine
  EXPECT_EQ(text.rfind(std::string(code_name(Code::kUnavailable)) + ": cuda_ipc: ", 0), 0u) << text;
#if DMX_HAVE_CUDA
  EXPECT_NE(text.find("driver"), std::string::npos) << text;  // "no CUDA driver ..." / "driver ... too old"
#else
  EXPECT_NE(text.find("built without CUDA"), std::string::npos) << text;
#endif
}

TEST(CudaIpcPath, OneProcessIsRefusedWithTheReason) {
  Status s = cuda_ipc_usable_between(1234, 1234);
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_NE(s.message().find("one process (pid 1234)"), std::string::npos) << s.message();
  EXPECT_TRUE(cuda_ipc_usable_between(1234, 1235).ok());
}

TEST(CudaIpcPath, Properties) {
  auto p = new_cuda_ipc_path(config(), "peer-x");
  EXPECT_EQ(p->kind(), PathKind::kCudaIpc);
  EXPECT_TRUE(p->receiver_releases());
  EXPECT_TRUE(p->carries({MemKind::kCuda, 0}));
  EXPECT_TRUE(p->carries({MemKind::kCuda, 3}));
  EXPECT_FALSE(p->carries({MemKind::kHost, 0}));
  EXPECT_FALSE(p->carries({MemKind::kPinned, 0}));
  EXPECT_FALSE(p->carries({MemKind::kSim, 0}));
  EXPECT_EQ(p->max_chunk(), uint64_t{256} << 20);  // the default of cuda_ipc_chunk
  EXPECT_GE(p->max_chunk(), uint64_t{4} << 20);
  std::vector<char> host(64);
  auto tx = p->post_tx(0, {host.data(), host.size(), {MemKind::kHost, 0}});
  ASSERT_FALSE(tx.ok());
  EXPECT_EQ(tx.status().code(), Code::kInvalidArgument);
  EXPECT_NE(p->describe().find("cuda_ipc"), std::string::npos);
}

TEST(CudaIpcPath, ChunkLengthAndPostRxValidate) {
  auto p = new_cuda_ipc_path(config(), "peer-x");
  auto good = sample_bytes({4});
  auto len = p->chunk_length(good);
  ASSERT_TRUE(len.ok());
  EXPECT_EQ(*len, (1u << 20) + 3);
  std::vector<unsigned char> junk(IpcDescriptor::kWireSize, 0x5a);
  auto bad = p->chunk_length(junk);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kProtocol);
  EXPECT_EQ(bad.status().peer(), "peer-x");
  EXPECT_EQ(p->post_rx(1, junk, {nullptr, 0, {}}).code(), Code::kProtocol);
  std::vector<char> host((1 << 20) + 3);
  EXPECT_EQ(p->post_rx(1, good, {host.data(), host.size() - 1, {MemKind::kHost, 0}}).code(), Code::kInvalidArgument);
  EXPECT_EQ(p->post_rx(1, good, {host.data(), host.size(), {MemKind::kSim, 0}}).code(), Code::kInvalidArgument);
}

TEST(CudaIpcPath, DroppedChunksCompleteWithoutCopies) {
  Recorder rec;
  auto p = new_cuda_ipc_path(config(), "peer-x");
  p->start(&rec, nullptr);
  for (uint64_t seq = 0; seq < 5; ++seq)
    ASSERT_TRUE(p->post_rx(seq, sample_bytes({seq + 1}), {nullptr, (1 << 20) + 3, {}}).ok());
  ASSERT_TRUE(rec.wait_rx(5, 5000ms));
  p->stop();
  std::lock_guard lock(rec.mu_);
  for (uint64_t seq = 0; seq < 5; ++seq) {
    EXPECT_EQ(rec.rx_count[seq], 1);
    EXPECT_TRUE(rec.rx[seq].ok()) << rec.rx[seq].to_string();
  }
  EXPECT_EQ(rec.failed, 0);
  EXPECT_EQ(rec.tx_done, 0);  // receiver_releases: the path never reports tx completions
  EXPECT_EQ(rec.stopped, 1);
  PathStats s = p->stats();
  EXPECT_EQ(s.device_copies, 0u);
  EXPECT_EQ(s.bytes_received, 0u);
}

TEST(CudaIpcPath, StopWithNothingPendingIsPromptAndIdempotent) {
  Recorder rec;
  auto keep = std::make_shared<int>(1);
  std::weak_ptr<int> watch = keep;
  auto p = new_cuda_ipc_path(config(), "peer-x");
  p->start(&rec, std::move(keep));
  std::this_thread::sleep_for(10ms);  // let the thread go to sleep on its condition variable
  auto t0 = Clock::now();
  p->stop();
  EXPECT_LT(Clock::now() - t0, 1s);
  EXPECT_TRUE(watch.expired());  // keep_alive released once on_path_stopped returned
  p->stop();
  {
    std::lock_guard lock(rec.mu_);
    EXPECT_EQ(rec.stopped, 1);
    EXPECT_EQ(rec.rx_total, 0u);
  }
  EXPECT_EQ(p->post_rx(9, sample_bytes(), {nullptr, (1 << 20) + 3, {}}).code(), Code::kClosed);
  std::vector<char> dummy(8);
  EXPECT_EQ(p->post_tx(9, {dummy.data(), dummy.size(), {MemKind::kCuda, 0}}).status().code(), Code::kClosed);
  p.reset();
  std::lock_guard lock(rec.mu_);
  EXPECT_EQ(rec.stopped, 1);
}

TEST(CudaIpcPath, StopWithoutStartAndDestroy) {
  auto p = new_cuda_ipc_path(config(), "peer-x");
  p->stop();
  p->stop();
  p.reset();  // no thread, no events, no hang
}

TEST(CudaIpcPath, LastOwnerReleasedOnThePathsOwnThread) {
  // The engine hands the path a keep_alive that owns the path itself; a stop() from an event
  // callback then ends with the path destroyed on its own thread (it must detach, not join itself).
  Recorder rec;
  std::atomic<bool> destroyed{false};
  struct Holder {
    std::unique_ptr<PayloadPath> path;
    std::atomic<bool>* destroyed = nullptr;
    ~Holder() {
      path.reset();
      *destroyed = true;
    }
  };
  auto holder = std::make_shared<Holder>();
  holder->path = new_cuda_ipc_path(config(), "peer-x");
  holder->destroyed = &destroyed;
  PayloadPath* p = holder->path.get();
  rec.on_rx = [p](uint64_t) { p->stop(); };  // on the path's thread
  p->start(&rec, holder);
  holder.reset();
  ASSERT_TRUE(p->post_rx(1, sample_bytes(), {nullptr, (1 << 20) + 3, {}}).ok());
  ASSERT_TRUE(rec.wait_stopped(5000ms));
  for (int i = 0; i < 500 && !destroyed; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(destroyed);
  std::lock_guard lock(rec.mu_);
  EXPECT_EQ(rec.stopped, 1);
  EXPECT_EQ(rec.rx_count[1], 1);
}

// ---- on GPUs, two processes ----

// Number of GPUs usable for cuda_ipc, probed in a child; 0 and the reason when none.
int probe_gpus(std::string* reason) {
  int fds[2];
  if (::pipe(fds) != 0) return 0;
  pid_t child = testing::fork_child([&] {
    Status s = cuda_ipc_path_available();
    auto n = cuda_device_count();
    std::string msg = s.ok() ? (n.ok() ? std::to_string(*n) : "0" + n.status().message()) : "0" + s.message();
    (void)!::write(fds[1], msg.data(), msg.size());
    return 0;
  });
  ::close(fds[1]);
  char buf[1024] = {};
  ssize_t got = ::read(fds[0], buf, sizeof buf - 1);
  ::close(fds[0]);
  testing::wait_child(child);
  std::string text(buf, got > 0 ? size_t(got) : 0);
  if (text.empty()) {
    *reason = "GPU probe child failed";
    return 0;
  }
  if (text[0] == '0') {
    *reason = text.size() > 1 ? text.substr(1) : "no CUDA device";
    return 0;
  }
  return std::stoi(text);
}

#define REQUIRE_GPUS(n_var)                                       \
  std::string why;                                                \
  int n_var = probe_gpus(&why);                                   \
  if (n_var < 1) GTEST_SKIP() << "no usable GPU: " << why

// Runs `a` and `b` in two forked children joined by a Unix socket pair; their exit codes.
void run_pair(const std::function<int(UnixChannel)>& a, const std::function<int(UnixChannel)>& b, int* ra, int* rb) {
  auto p = UnixChannel::pair();
  ASSERT_TRUE(p.ok());
  pid_t ca = testing::fork_child([&] {
    { UnixChannel drop = std::move(p->second); }
    return a(std::move(p->first));
  });
  pid_t cb = testing::fork_child([&] {
    { UnixChannel drop = std::move(p->first); }
    return b(std::move(p->second));
  });
  { UnixChannel d1 = std::move(p->first), d2 = std::move(p->second); }
  *rb = testing::wait_child(cb, std::chrono::seconds(200));
  *ra = testing::wait_child(ca, std::chrono::seconds(30));
}

// What the sender tells the receiver about one chunk, followed by the path's descriptor bytes.
struct ChunkNote {
  uint32_t transfer = 0;  // index into the plan
  uint32_t dst_kind = 0;  // index into kDstKinds
  uint64_t offset = 0;    // of the chunk inside its transfer
  uint64_t seed = 0;      // of the data: byte i of the source allocation is pattern_byte(seed, i)
  uint64_t src_offset = 0;  // of the chunk inside the source allocation
};

std::vector<std::byte> note_message(const ChunkNote& n, std::span<const unsigned char> desc) {
  std::vector<std::byte> m(sizeof n + desc.size());
  std::memcpy(m.data(), &n, sizeof n);
  std::memcpy(m.data() + sizeof n, desc.data(), desc.size());
  return m;
}

bool parse_note(const std::vector<std::byte>& m, ChunkNote* n, std::span<const unsigned char>* desc) {
  if (m.size() < sizeof *n) return false;
  std::memcpy(n, m.data(), sizeof *n);
  *desc = {reinterpret_cast<const unsigned char*>(m.data()) + sizeof *n, m.size() - sizeof *n};
  return true;
}

std::vector<std::byte> word(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size()};
}
bool is_word(const std::vector<std::byte>& m, std::string_view s) {
  return m.size() == s.size() && std::memcmp(m.data(), s.data(), s.size()) == 0;
}

uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) | rd();
}

// Source (one allocation; transfers at odd offsets) and destination layout, the same in both
// children.
struct Transfer {
  size_t size, src_offset, dst_offset;
};
constexpr MemKind kDstKinds[] = {MemKind::kCuda, MemKind::kHost, MemKind::kPinned};
std::vector<Transfer> plan(size_t* src_total, size_t* dst_total) {
  std::vector<Transfer> t;
  size_t src = 4097, dst = 7;
  for (size_t size : {size_t(1), size_t(4097), size_t((1 << 20) + 3), size_t((64 << 20) + 3)}) {
    t.push_back({size, src, dst});
    src += size + 13;
    dst += size + 5;
  }
  *src_total = src + 11;
  *dst_total = dst + 9;
  return t;
}

Status host_to(const MemRegion& dst, const void* src) {
  return copy_memory(dst, {const_cast<void*>(src), dst.size, {}});
}

// Sender: fills the source with fresh random data, cuts every transfer into max_chunk() pieces,
// exports them all (once per destination kind) and sends the notes; waits for "done".
int deliver_sender(UnixChannel ch, int device) {
  Recorder rec;  // outlives the path, which reports to it until stopped
  auto path = make_cuda_ipc_path(config(), ch.peer_name());
  CHILD_CHECK(path.ok(), 10);
  (*path)->start(&rec, nullptr);
  size_t src_total = 0, dst_total = 0;
  auto transfers = plan(&src_total, &dst_total);
  auto src = Buffer::allocate({MemKind::kCuda, device}, src_total);
  CHILD_CHECK(src.ok(), 11);
  uint64_t seed = fresh_seed();
  std::vector<uint8_t> host(src_total);
  testing::fill_pattern(host.data(), host.size(), seed);
  CHILD_CHECK(host_to(src->region(), host.data()).ok(), 12);
  uint64_t seq = 0, max = (*path)->max_chunk();
  for (uint32_t k = 0; k < std::size(kDstKinds); ++k)
    for (uint32_t i = 0; i < transfers.size(); ++i)
      for (uint64_t off = 0; off < transfers[i].size; off += max) {
        size_t n = std::min<uint64_t>(max, transfers[i].size - off);
        size_t at = transfers[i].src_offset + off;
        auto desc = (*path)->post_tx(seq++, src->region().sub(at, n));
        CHILD_CHECK(desc.ok(), 13);
        CHILD_CHECK(desc->size() <= kMaxPathDescriptor, 14);
        CHILD_CHECK(ch.send(note_message({i, k, off, seed, at}, *desc), {}, secs(10)).ok(), 15);
      }
  CHILD_CHECK(ch.send(word("end"), {}, secs(10)).ok(), 16);
  std::vector<std::byte> msg;
  CHILD_CHECK(ch.recv(&msg, 0, nullptr, secs(150)).ok() && is_word(msg, "done"), 17);  // src in use until then
  PathStats s = (*path)->stats();
  CHILD_CHECK(s.chunks_sent == seq, 18);
  (*path)->stop();
  CHILD_CHECK(rec.tx_done == 0, 19);
  return 0;
}

// Receiver: posts every chunk as it arrives (all in flight together), waits for all, then checks
// every destination byte: the source's bytes inside transfers, the guard value outside.
int deliver_receiver(UnixChannel ch, int device) {
  Recorder rec;  // outlives the path, which reports to it until stopped
  auto path = make_cuda_ipc_path(config(), ch.peer_name());
  CHILD_CHECK(path.ok(), 30);
  (*path)->start(&rec, nullptr);
  size_t src_total = 0, dst_total = 0;
  auto transfers = plan(&src_total, &dst_total);
  std::vector<Buffer> dst;
  std::vector<uint8_t> guard(dst_total, 0xEE);
  for (MemKind k : kDstKinds) {
    auto b = Buffer::allocate({k, k == MemKind::kCuda ? device : 0}, dst_total);
    CHILD_CHECK(b.ok(), 31);
    CHILD_CHECK(host_to(b->region(), guard.data()).ok(), 32);
    dst.push_back(std::move(*b));
  }
  uint64_t seq = 0, seed = 0;
  for (;;) {
    std::vector<std::byte> msg;
    CHILD_CHECK(ch.recv(&msg, 0, nullptr, secs(60)).ok(), 33);
    if (is_word(msg, "end")) break;
    ChunkNote note;
    std::span<const unsigned char> desc;
    CHILD_CHECK(parse_note(msg, &note, &desc), 34);
    seed = note.seed;
    auto len = (*path)->chunk_length(desc);
    CHILD_CHECK(len.ok() && note.transfer < transfers.size() && note.dst_kind < dst.size(), 35);
    const Transfer& t = transfers[note.transfer];
    CHILD_CHECK(*len <= (*path)->max_chunk() && note.offset + *len <= t.size, 36);
    MemRegion where = dst[note.dst_kind].region().sub(t.dst_offset + note.offset, *len);
    Status s = (*path)->post_rx(seq++, desc, where);
    if (!s.ok()) fprintf(stderr, "post_rx: %s\n", s.to_string().c_str());
    CHILD_CHECK(s.ok(), 37);
  }
  CHILD_CHECK(rec.wait_rx(seq, 60s), 38);
  {
    std::lock_guard lock(rec.mu_);
    for (uint64_t i = 0; i < seq; ++i) {
      if (!rec.rx[i].ok()) fprintf(stderr, "chunk %llu: %s\n", (unsigned long long)i, rec.rx[i].to_string().c_str());
      CHILD_CHECK(rec.rx_count[i] == 1 && rec.rx[i].ok(), 39);
    }
    CHILD_CHECK(rec.failed == 0, 40);
  }
  fprintf(stderr, "receiver: %s\n", (*path)->describe().c_str());
  PathStats s = (*path)->stats();
  CHILD_CHECK(s.device_copies == seq && s.chunks_received == seq, 41);
  CHILD_CHECK(ch.send(word("done"), {}, secs(10)).ok(), 42);
  std::vector<uint8_t> back(dst_total);
  for (size_t k = 0; k < dst.size(); ++k) {
    CHILD_CHECK(copy_memory({back.data(), back.size(), {}}, dst[k].region()).ok(), 43);
    size_t at = 0;
    for (const Transfer& t : transfers) {
      for (; at < t.dst_offset; ++at) CHILD_CHECK(back[at] == 0xEE, 44);
      for (size_t i = 0; i < t.size; ++i, ++at)
        if (back[at] != testing::pattern_byte(seed, t.src_offset + i)) {
          fprintf(stderr, "dst kind %zu transfer of %zu B: byte %zu differs\n", k, t.size, i);
          return 45;
        }
    }
    for (; at < dst_total; ++at) CHILD_CHECK(back[at] == 0xEE, 46);
  }
  auto t0 = Clock::now();
  (*path)->stop();
  CHILD_CHECK(Clock::now() - t0 < 5s && rec.stopped == 1, 47);
  return 0;
}

TEST(CudaIpcPathGpu, DeliversByteExactToCudaHostAndPinned) {
  REQUIRE_GPUS(n);
  int src_dev = n >= 2 ? 1 : 0;  // two GPUs: across the peer link; one: two processes share it
  int ra = -1, rb = -1;
  run_pair([&](UnixChannel c) { return deliver_sender(std::move(c), src_dev); },
           [&](UnixChannel c) { return deliver_receiver(std::move(c), 0); }, &ra, &rb);
  EXPECT_EQ(rb, 0);
  EXPECT_EQ(ra, 0);
}

TEST(CudaIpcPathGpu, DeliversWithinOneGpu) {
  REQUIRE_GPUS(n);
  int ra = -1, rb = -1;
  run_pair([&](UnixChannel c) { return deliver_sender(std::move(c), 0); },
           [&](UnixChannel c) { return deliver_receiver(std::move(c), 0); }, &ra, &rb);
  EXPECT_EQ(rb, 0);
  EXPECT_EQ(ra, 0);
}

// The sender frees its buffer and allocates one of the same size, which cudaMalloc puts at the same
// address: the next export must carry the new allocation's handle (a stale cached one would make
// the receiver read the old, freed memory: the old data), and retire the old id.
constexpr size_t kStaleAlloc = (4 << 20) + 1;
constexpr size_t kStaleOffset = 3, kStaleLen = (1 << 20) + 5;

int stale_sender(UnixChannel ch, int device) {
  auto path = make_cuda_ipc_path(config(), ch.peer_name());
  CHILD_CHECK(path.ok(), 10);
  std::vector<uint8_t> host(kStaleAlloc);
  std::vector<std::byte> msg;
  IpcChunkDescriptor first;
  void* first_ptr = nullptr;
  bool reused = false;
  for (uint64_t round = 0; round < 3; ++round) {
    auto buf = Buffer::allocate({MemKind::kCuda, device}, kStaleAlloc);
    CHILD_CHECK(buf.ok(), 11);
    uint64_t seed = fresh_seed();
    testing::fill_pattern(host.data(), host.size(), seed);
    CHILD_CHECK(host_to(buf->region(), host.data()).ok(), 12);
    // Rounds 1 and 2 export twice: the second export of the same allocation hits the cache.
    for (int twice = 0; twice < (round == 0 ? 1 : 2); ++twice) {
      auto desc = (*path)->post_tx(round * 2 + twice, buf->region().sub(kStaleOffset, kStaleLen));
      CHILD_CHECK(desc.ok(), 13);
      auto d = IpcChunkDescriptor::decode(*desc);
      CHILD_CHECK(d.ok(), 14);
      if (round == 0) {
        first = *d;
        first_ptr = buf->data();
      } else if (buf->data() == first_ptr && twice == 0 && round == 1) {
        reused = true;
        CHILD_CHECK(d->source.alloc_id != first.source.alloc_id, 15);
        CHILD_CHECK(d->source.handle != first.source.handle, 16);
        CHILD_CHECK(d->retired.size() == 1 && d->retired[0] == first.source.alloc_id, 17);
      }
      CHILD_CHECK(ch.send(note_message({0, 0, 0, seed, kStaleOffset}, *desc), {}, secs(10)).ok(), 18);
      CHILD_CHECK(ch.recv(&msg, 0, nullptr, secs(60)).ok() && is_word(msg, "ok"), 19);
    }
    // `buf` is freed here, while the receiver still has it mapped (as a user would).
  }
  CHILD_CHECK(ch.send(word("end"), {}, secs(10)).ok(), 20);
  fprintf(stderr, "stale sender: the freed buffer's address %s\n", reused ? "was reused" : "was NOT reused");
  return reused ? 0 : 3;  // 3: cudaMalloc did not give the same address; the case was not exercised
}

int stale_receiver(UnixChannel ch, int device) {
  Recorder rec;  // outlives the path, which reports to it until stopped
  auto path = make_cuda_ipc_path(config(), ch.peer_name());
  CHILD_CHECK(path.ok(), 30);
  (*path)->start(&rec, nullptr);
  auto dst = Buffer::allocate({MemKind::kCuda, device}, kStaleLen + 1);
  CHILD_CHECK(dst.ok(), 31);
  std::vector<uint8_t> back(kStaleLen);
  for (uint64_t seq = 0;; ++seq) {
    std::vector<std::byte> msg;
    CHILD_CHECK(ch.recv(&msg, 0, nullptr, secs(60)).ok(), 32);
    if (is_word(msg, "end")) break;
    ChunkNote note;
    std::span<const unsigned char> desc;
    CHILD_CHECK(parse_note(msg, &note, &desc), 33);
    CHILD_CHECK((*path)->post_rx(seq, desc, dst->region().sub(1, kStaleLen)).ok(), 34);
    CHILD_CHECK(rec.wait_rx(seq + 1, 30s), 35);
    {
      std::lock_guard lock(rec.mu_);
      if (!rec.rx[seq].ok()) fprintf(stderr, "chunk %llu: %s\n", (unsigned long long)seq, rec.rx[seq].to_string().c_str());
      CHILD_CHECK(rec.rx[seq].ok(), 36);
    }
    CHILD_CHECK(copy_memory({back.data(), back.size(), {}}, dst->region().sub(1, kStaleLen)).ok(), 37);
    for (size_t i = 0; i < kStaleLen; ++i)
      if (back[i] != testing::pattern_byte(note.seed, note.src_offset + i)) {
        fprintf(stderr, "chunk %llu: byte %zu is not this round's data (a stale mapping?)\n", (unsigned long long)seq, i);
        return 38;
      }
    CHILD_CHECK(ch.send(word("ok"), {}, secs(10)).ok(), 39);
  }
  (*path)->stop();
  return 0;
}

TEST(CudaIpcPathGpu, FreeAndReallocAtTheSameAddressSendsAFreshHandle) {
  REQUIRE_GPUS(n);
  int src_dev = n >= 2 ? 1 : 0;
  int ra = -1, rb = -1;
  run_pair([&](UnixChannel c) { return stale_sender(std::move(c), src_dev); },
           [&](UnixChannel c) { return stale_receiver(std::move(c), 0); }, &ra, &rb);
  EXPECT_EQ(rb, 0);
  if (ra == 3) GTEST_SKIP() << "cudaMalloc did not return the freed address again; the stale case was not exercised";
  EXPECT_EQ(ra, 0);
}

// Sender side of the stop and kill tests: `chunks` chunks of max_chunk() from one allocation, then
// `late` more from a second allocation; then waits for "done" (or is killed).
int bulk_sender(UnixChannel ch, int device, int chunks, int late) {
  auto path = make_cuda_ipc_path(config(), ch.peer_name());
  CHILD_CHECK(path.ok(), 10);
  uint64_t max = (*path)->max_chunk();
  auto a = Buffer::allocate({MemKind::kCuda, device}, max * chunks);
  auto b = Buffer::allocate({MemKind::kCuda, device}, max * std::max(late, 1));
  CHILD_CHECK(a.ok() && b.ok(), 11);
  uint64_t seq = 0;
  for (int i = 0; i < chunks + late; ++i) {
    const Buffer& from = i < chunks ? *a : *b;
    size_t at = (i < chunks ? i : i - chunks) * max;
    auto desc = (*path)->post_tx(seq++, from.region().sub(at, max));
    CHILD_CHECK(desc.ok(), 12);
    CHILD_CHECK(ch.send(note_message({0, 0, 0, 0, at}, *desc), {}, secs(10)).ok(), 13);
  }
  std::vector<std::byte> msg;
  CHILD_CHECK(ch.recv(&msg, 0, nullptr, secs(120)).ok() && is_word(msg, "done"), 14);
  return 0;
}

TEST(CudaIpcPathGpu, StopWaitsForCopiesInFlight) {
  REQUIRE_GPUS(n);
  int src_dev = n >= 2 ? 1 : 0;
  constexpr int kChunks = 8;
  int ra = -1, rb = -1;
  auto receiver = [&](UnixChannel ch) {
    Recorder rec;  // outlives the path, which reports to it until stopped
    auto path = make_cuda_ipc_path(config(), ch.peer_name());
    CHILD_CHECK(path.ok(), 30);
    (*path)->start(&rec, nullptr);
    uint64_t max = (*path)->max_chunk();
    auto dst = Buffer::allocate({MemKind::kCuda, 0}, max * kChunks);
    CHILD_CHECK(dst.ok(), 31);
    std::vector<std::vector<std::byte>> msgs(kChunks);
    for (auto& m : msgs) CHILD_CHECK(ch.recv(&m, 0, nullptr, secs(60)).ok(), 32);
    for (int i = 0; i < kChunks; ++i) {
      ChunkNote note;
      std::span<const unsigned char> desc;
      CHILD_CHECK(parse_note(msgs[i], &note, &desc), 33);
      CHILD_CHECK((*path)->post_rx(i, desc, dst->region().sub(i * max, max)).ok(), 34);
    }
    auto t0 = Clock::now();
    (*path)->stop();  // at once: the copies are (mostly) in flight
    CHILD_CHECK(Clock::now() - t0 < 5s, 35);
    {
      std::lock_guard lock(rec.mu_);
      CHILD_CHECK(rec.stopped == 1, 36);
      CHILD_CHECK(rec.rx_total == size_t(kChunks) && rec.rx_after_stop == 0, 37);  // all reported, before stopped
      int copied = 0;
      for (int i = 0; i < kChunks; ++i) {
        CHILD_CHECK(rec.rx_count[i] == 1, 38);
        copied += rec.rx[i].ok();
        if (!rec.rx[i].ok()) CHILD_CHECK(rec.rx[i].code() == Code::kCancelled, 39);
      }
      fprintf(stderr, "stop: %d of %d chunks were copied, the others cancelled\n", copied, kChunks);
    }
    CHILD_CHECK(ch.send(word("done"), {}, secs(10)).ok(), 40);
    return 0;
  };
  run_pair([&](UnixChannel c) { return bulk_sender(std::move(c), src_dev, kChunks, 0); }, receiver, &ra, &rb);
  EXPECT_EQ(rb, 0);
  EXPECT_EQ(ra, 0);
}

TEST(CudaIpcPathGpu, PeerKilledMidTransferNeverHangs) {
  REQUIRE_GPUS(n);
  int src_dev = n >= 2 ? 1 : 0;
  constexpr int kChunks = 16, kLate = 4;
  int ra = -1, rb = -1;
  auto receiver = [&](UnixChannel ch) {
    Recorder rec;  // outlives the path, which reports to it until stopped
    auto path = make_cuda_ipc_path(config(), ch.peer_name());
    CHILD_CHECK(path.ok(), 30);
    (*path)->start(&rec, nullptr);
    uint64_t max = (*path)->max_chunk();
    auto dst = Buffer::allocate({MemKind::kCuda, 0}, max * (kChunks + kLate));
    CHILD_CHECK(dst.ok(), 31);
    std::vector<std::vector<std::byte>> msgs(kChunks + kLate);
    for (auto& m : msgs) CHILD_CHECK(ch.recv(&m, 0, nullptr, secs(60)).ok(), 32);
    int32_t owner = 0;
    for (int i = 0; i < kChunks + kLate; ++i) {
      ChunkNote note;
      std::span<const unsigned char> desc;
      CHILD_CHECK(parse_note(msgs[i], &note, &desc), 33);
      auto d = IpcChunkDescriptor::decode(desc);
      CHILD_CHECK(d.ok(), 34);
      owner = d->source.owner_pid;
      if (i == kChunks) {
        ::kill(owner, SIGKILL);  // dies with the first 16 copies in flight; the last 4 map a dead process
        std::this_thread::sleep_for(50ms);
      }
      CHILD_CHECK((*path)->post_rx(i, desc, dst->region().sub(i * max, max)).ok(), 35);
    }
    auto t0 = Clock::now();
    CHILD_CHECK(rec.wait_rx(kChunks + kLate, 20s), 36);  // every chunk completes, ok or not
    int failures = 0;
    {
      std::lock_guard lock(rec.mu_);
      for (int i = 0; i < kChunks + kLate; ++i) {
        CHILD_CHECK(rec.rx_count[i] == 1, 37);
        if (!rec.rx[i].ok()) {
          ++failures;
          fprintf(stderr, "chunk %d: %s\n", i, rec.rx[i].to_string().c_str());
        }
      }
    }
    (*path)->stop();
    CHILD_CHECK(Clock::now() - t0 < 30s && rec.stopped == 1, 38);
    fprintf(stderr, "peer killed: %d of %d chunks failed; path failed: %d\n", failures, kChunks + kLate, rec.failed);
    (void)owner;
    return 0;
  };
  run_pair([&](UnixChannel c) { return bulk_sender(std::move(c), src_dev, kChunks, kLate); }, receiver, &ra, &rb);
  EXPECT_EQ(rb, 0);
  EXPECT_EQ(ra, 128 + SIGKILL);
}

// Both ends in one process: the engine does not choose cuda_ipc then (cuda_ipc_usable_between), but
// a descriptor of our own process must fail its chunk with the reason, not crash or hang.
TEST(CudaIpcPathGpu, OwnProcessDescriptorFailsItsChunkWithTheReason) {
  REQUIRE_GPUS(n);
  pid_t child = testing::fork_child([&] {
    Recorder rec;  // outlives the paths
    auto tx = make_cuda_ipc_path(config(), "self");
    auto rx = make_cuda_ipc_path(config(), "self");
    CHILD_CHECK(tx.ok() && rx.ok(), 10);
    (*rx)->start(&rec, nullptr);
    auto src = Buffer::allocate({MemKind::kCuda, 0}, 4096);
    auto dst = Buffer::allocate({MemKind::kCuda, 0}, 4096);
    CHILD_CHECK(src.ok() && dst.ok(), 11);
    auto desc = (*tx)->post_tx(0, src->region());
    CHILD_CHECK(desc.ok(), 12);
    CHILD_CHECK((*rx)->post_rx(0, *desc, dst->region()).ok(), 13);
    CHILD_CHECK(rec.wait_rx(1, 10s), 14);
    std::lock_guard lock(rec.mu_);
    fprintf(stderr, "own-process chunk: %s\n", rec.rx[0].to_string().c_str());
    if (!rec.rx[0].ok()) CHILD_CHECK(rec.rx[0].message().find("this process") != std::string::npos, 15);
    return 0;
  });
  EXPECT_EQ(testing::wait_child(child, std::chrono::seconds(60)), 0);
}

}  // namespace
}  // namespace dmx
