// Tests of the cuda_ipc payload path (src/transport/cuda_ipc/ipc_path.*).
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

#include "transport/cuda_ipc/ipc_path.h"
#include "memory/backend.h"
#include "engine/ipc_path_test_util.h"
#include "transport/transport_test_util.h"
#include "test_env.h"

namespace dmx {
namespace {

using cuda_ipc::IpcDescriptor;
using testing::Recorder;
using testing::config;
using testing::secs;
using namespace std::chrono_literals;

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
  int rc = -1;
  std::string text = testing::text_from_child(
      [] {
        Status s = cuda_ipc_path_available();
        return s.ok() ? "ok" : std::string(code_name(s.code())) + ": " + s.message();
      },
      &rc);
  EXPECT_EQ(rc, 0);
  std::cout << "cuda_ipc_path_available(): " << text << "\n";
  if (text == "ok") return;  // a GPU machine
  EXPECT_EQ(text.rfind(std::string(code_name(Code::kUnavailable)) + ": cuda_ipc: ", 0), 0u) << text;
#if DMX_HAVE_CUDA
  EXPECT_NE(text.find("driver"), std::string::npos) << text;  // "no CUDA driver ..." / "driver ... too old"
#else
  EXPECT_NE(text.find("built without CUDA"), std::string::npos) << text;
#endif
}

// Memory that CUDA IPC cannot export (here host memory labelled as device memory: the export
// fails, with or without a GPU) is kUnavailable, "try the next path", which the endpoint answers by
// staging the transfer; a region past its allocation stays the caller's error (GPU test).
TEST(CudaIpcPath, SourceItCannotExportIsUnavailable) {
  int rc = -1;
  std::string text = testing::text_from_child(  // touches CUDA: not in this process
      [] {
        auto p = new_cuda_ipc_path(config(), "peer-x");
        std::vector<char> host(4096);
        auto tx = p->post_tx(0, {host.data(), host.size(), {MemKind::kCuda, 0}}, true);
        return tx.ok() ? "ok" : std::string(code_name(tx.status().code())) + ": " + tx.status().message();
      },
      &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(text.rfind(std::string(code_name(Code::kUnavailable)) + ": cuda_ipc cannot export this memory: ", 0), 0u)
      << text;
}

TEST(CudaIpcPath, OneProcessOnlyWhenTheKernelProvesIt) {
  Status s = cuda_ipc_usable_between(1234, 1234, /*proven_same_process=*/false);
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_NE(s.message().find("one process (pid 1234), and no side channel proves it"), std::string::npos)
      << s.message();
  EXPECT_TRUE(cuda_ipc_usable_between(1234, 1234, /*proven_same_process=*/true).ok());
  EXPECT_TRUE(cuda_ipc_usable_between(1234, 1235, false).ok());
}

TEST(CudaIpcPath, Properties) {
  auto p = new_cuda_ipc_path(config(), "peer-x");
  EXPECT_EQ(p->name(), "cuda_ipc");
  EXPECT_TRUE(p->receiver_releases());
  EXPECT_TRUE(p->carries({MemKind::kCuda, 0}));
  EXPECT_TRUE(p->carries({MemKind::kCuda, 3}));
  EXPECT_FALSE(p->carries({MemKind::kHost, 0}));
  EXPECT_FALSE(p->carries({MemKind::kPinned, 0}));
  EXPECT_FALSE(p->carries({MemKind::kSim, 0}));
  EXPECT_EQ(p->max_chunk(), uint64_t{256} << 20);  // the default of cuda_ipc_chunk
  EXPECT_GE(p->max_chunk(), uint64_t{4} << 20);
  std::vector<char> host(64);
  auto tx = p->post_tx(0, {host.data(), host.size(), {MemKind::kHost, 0}}, true);
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
  std::this_thread::sleep_for(10ms);  // let the thread go to sleep (PathBase::sleep_on)
  auto t0 = Clock::now();
  p->stop();
  EXPECT_LT(Clock::now() - t0, test::kLoadSlack);  // not woken, it would sleep for ever
  EXPECT_TRUE(watch.expired());  // keep_alive released once on_path_stopped returned
  p->stop();
  {
    std::lock_guard lock(rec.mu_);
    EXPECT_EQ(rec.stopped, 1);
    EXPECT_EQ(rec.rx_total, 0u);
  }
  EXPECT_EQ(p->post_rx(9, sample_bytes(), {nullptr, (1 << 20) + 3, {}}).code(), Code::kClosed);
  std::vector<char> dummy(8);
  EXPECT_EQ(p->post_tx(9, {dummy.data(), dummy.size(), {MemKind::kCuda, 0}}, true).status().code(), Code::kClosed);
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

// ---- lists (table chunks, docs/wire.md "Tables"), CUDA-free ----

std::vector<unsigned char> list_bytes(std::vector<uint64_t> offsets, std::vector<uint64_t> retired = {}) {
  IpcListDescriptor d;
  d.source = sample_descriptor();
  d.offsets = std::move(offsets);
  d.retired = std::move(retired);
  return d.encode();
}

// The header of a list descriptor: IpcDescriptor, then n and r (u32 each).
void set_counts(std::vector<unsigned char>& b, uint32_t n, uint32_t r) {
  std::memcpy(b.data() + IpcDescriptor::kWireSize, &n, 4);
  std::memcpy(b.data() + IpcDescriptor::kWireSize + 4, &r, 4);
}

TEST(CudaIpcPath, ListDescriptorRoundTrip) {
  for (size_t n : {size_t(1), size_t(2), size_t(127), kCudaIpcMaxList}) {
    for (size_t r : {size_t(0), size_t(1), kCudaIpcMaxRetired}) {
      std::vector<uint64_t> offsets, ids;
      for (size_t i = 0; i < n; ++i) offsets.push_back(i * 4099 + (i % 3));
      for (size_t i = 0; i < r; ++i) ids.push_back(1000 + i);
      auto bytes = list_bytes(offsets, ids);
      EXPECT_EQ(bytes.size(), IpcDescriptor::kWireSize + 8 + 8 * (n + r));
      EXPECT_LE(bytes.size(), kMaxListDescriptor);
      auto d = IpcListDescriptor::decode(bytes);
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      EXPECT_EQ(d->offsets, offsets);
      EXPECT_EQ(d->retired, ids);
      EXPECT_EQ(d->source.handle, sample_descriptor().handle);
      EXPECT_EQ(d->source.offset, sample_descriptor().offset);
      EXPECT_EQ(d->source.length, sample_descriptor().length);
      EXPECT_EQ(d->source.owner_pid, 4242);
    }
  }
}

TEST(CudaIpcPath, ListDescriptorRejectsMalformed) {
  auto good = list_bytes({0, 100, 4096}, {7});
  ASSERT_TRUE(IpcListDescriptor::decode(good).ok());
  auto bad = [](const std::vector<unsigned char>& b) {
    auto d = IpcListDescriptor::decode(b);
    return !d.ok() && d.status().code() == Code::kProtocol;
  };
  EXPECT_TRUE(bad({}));
  // Shorter than its header, one byte short, one byte long.
  EXPECT_TRUE(bad(std::vector<unsigned char>(good.begin(), good.begin() + IpcDescriptor::kWireSize + 7)));
  EXPECT_TRUE(bad(std::vector<unsigned char>(good.begin(), good.end() - 1)));
  auto longer = good;
  longer.push_back(1);
  EXPECT_TRUE(bad(longer));
  // Counts: n = 0, n over kCudaIpcMaxList (with the bytes to match), r over kCudaIpcMaxRetired,
  // and counts that disagree with the size.
  auto zero = good;
  set_counts(zero, 0, 4);  // 4 retired ids of 8 B: the size would fit
  EXPECT_TRUE(bad(zero));
  std::vector<uint64_t> many(kCudaIpcMaxList, 8);
  auto over = list_bytes(many);
  over.resize(over.size() + 8, 0);
  set_counts(over, kCudaIpcMaxList + 1, 0);
  EXPECT_TRUE(bad(over));
  auto huge = good;
  set_counts(huge, 0xffffffffu, 0xffffffffu);  // far over both limits
  EXPECT_TRUE(bad(huge));
  std::vector<uint64_t> ids(kCudaIpcMaxRetired + 1, 9);
  std::vector<unsigned char> retired = list_bytes({1});
  for (uint64_t id : ids)
    retired.insert(retired.end(), reinterpret_cast<unsigned char*>(&id), reinterpret_cast<unsigned char*>(&id) + 8);
  set_counts(retired, 1, static_cast<uint32_t>(ids.size()));
  EXPECT_TRUE(bad(retired));
  auto mismatch = good;
  set_counts(mismatch, 4, 1);  // one piece more than the bytes hold
  EXPECT_TRUE(bad(mismatch));
  set_counts(mismatch, 3, 0);  // the retired id's bytes left over
  EXPECT_TRUE(bad(mismatch));
  // A retired id of zero.
  auto zero_id = good;
  std::memset(zero_id.data() + zero_id.size() - 8, 0, 8);
  EXPECT_TRUE(bad(zero_id));
  // The inner IpcDescriptor: bad magic, and a region past its allocation (offset at byte 112).
  auto magic = good;
  magic[0] ^= 1;
  EXPECT_TRUE(bad(magic));
  auto past = good;
  uint64_t off = (8 << 20) - 10;
  std::memcpy(past.data() + 112, &off, 8);
  EXPECT_TRUE(bad(past));
}

TEST(CudaIpcPath, ListDescriptorFuzzNeverCrashes) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<uint64_t> offsets;
  for (uint64_t i = 0; i < 40; ++i) offsets.push_back(i * 512);
  auto good = list_bytes(offsets, {7, 8, 9});
  size_t accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<unsigned char> b;
    if (i % 2 == 0) {
      b = good;
      for (int k = 0; k < 1 + int(rng() % 4); ++k) b[rng() % b.size()] ^= static_cast<unsigned char>(1u << (rng() % 8));
      if (rng() % 8 == 0) b.resize(rng() % (kMaxListDescriptor + 40));
    } else {
      b.resize(rng() % (kMaxListDescriptor + 40));
      for (auto& c : b) c = static_cast<unsigned char>(rng());
    }
    auto d = IpcListDescriptor::decode(b);
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), Code::kProtocol);
      continue;
    }
    ++accepted;
    EXPECT_GE(d->offsets.size(), 1u);
    EXPECT_LE(d->offsets.size(), kCudaIpcMaxList);
    EXPECT_LE(d->retired.size(), kCudaIpcMaxRetired);
    EXPECT_EQ(b.size(), IpcDescriptor::kWireSize + 8 + 8 * (d->offsets.size() + d->retired.size()));
    for (uint64_t id : d->retired) EXPECT_NE(id, 0u);
  }
  EXPECT_GT(accepted, 0u);  // flips in the handle, uuid, pid, offsets still decode
}

// post_rx_list checks the descriptor against the endpoint's table before any copy (no CUDA call).
TEST(CudaIpcPath, PostRxListValidates) {
  Recorder rec;
  auto p = new_cuda_ipc_path(config(), "peer-x");
  p->start(&rec, nullptr);
  EXPECT_EQ(p->max_list(), kCudaIpcMaxList);
  std::vector<MemRegion> two = {{nullptr, 10, {}}, {nullptr, 20, {}}};
  // Three pieces in the descriptor, two in the table (and the other way round).
  Status s = p->post_rx_list(1, list_bytes({0, 10, 30}), two);
  EXPECT_EQ(s.code(), Code::kProtocol) << s.to_string();
  EXPECT_EQ(s.peer(), "peer-x");
  EXPECT_EQ(p->post_rx_list(1, list_bytes({0}), two).code(), Code::kProtocol);
  // A piece past the source region (its length (1 MiB + 3) from sample_descriptor), and one whose
  // offset + length would wrap.
  const uint64_t region = sample_descriptor().length;
  s = p->post_rx_list(1, list_bytes({0, region - 19}), two);
  EXPECT_EQ(s.code(), Code::kProtocol) << s.to_string();
  EXPECT_NE(s.message().find("outside"), std::string::npos) << s.to_string();
  EXPECT_EQ(p->post_rx_list(1, list_bytes({0, region + 1}), two).code(), Code::kProtocol);
  EXPECT_EQ(p->post_rx_list(1, list_bytes({0, UINT64_MAX - 5}), two).code(), Code::kProtocol);
  // Malformed bytes.
  std::vector<unsigned char> junk(IpcDescriptor::kWireSize + 16, 0x5a);
  EXPECT_EQ(p->post_rx_list(1, junk, two).code(), Code::kProtocol);
  // Simulated device memory cannot receive CUDA copies: the caller's error, not the peer's.
  std::vector<char> host(64);
  std::vector<MemRegion> sim = {{host.data(), 10, {MemKind::kSim, 0}}, {host.data() + 10, 20, {MemKind::kSim, 0}}};
  EXPECT_EQ(p->post_rx_list(1, list_bytes({0, 10}), sim).code(), Code::kInvalidArgument);
  p->stop();
  std::lock_guard lock(rec.mu_);
  EXPECT_EQ(rec.rx_total, 0u) << "a refused list has no event";
}

// All destinations null (a refused or cancelled write): consumed without a copy, one completion
// per list.
TEST(CudaIpcPath, DroppedListsCompleteWithoutCopies) {
  Recorder rec;
  auto p = new_cuda_ipc_path(config(), "peer-x");
  p->start(&rec, nullptr);
  for (uint64_t seq = 0; seq < 5; ++seq) {
    std::vector<uint64_t> offsets;
    std::vector<MemRegion> dsts;
    for (uint64_t k = 0; k <= seq * 31; ++k) {
      offsets.push_back(k * 100);
      dsts.push_back({nullptr, 100, {}});
    }
    ASSERT_TRUE(p->post_rx_list(seq, list_bytes(offsets), dsts).ok()) << seq;
  }
  ASSERT_TRUE(rec.wait_rx(5, 5000ms));
  p->stop();
  std::lock_guard lock(rec.mu_);
  for (uint64_t seq = 0; seq < 5; ++seq) {
    EXPECT_EQ(rec.rx_count[seq], 1);
    EXPECT_TRUE(rec.rx[seq].ok()) << rec.rx[seq].to_string();
  }
  EXPECT_EQ(rec.failed, 0);
  EXPECT_EQ(rec.stopped, 1);
  PathStats s = p->stats();
  EXPECT_EQ(s.device_copies, 0u);
  EXPECT_EQ(s.bytes_received, 0u);
}

}  // namespace
}  // namespace dmx
