// cuda_ipc pieces that need no GPU: the descriptor wire format (untrusted input) and the import
// cache's hit/miss/invalidate/drop logic with a fake opener; availability reasons.
#include <dlfcn.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "transport/cuda_ipc/cuda_ipc.h"
#include "transport/transport_test_util.h"
#include "test_env.h"

namespace dmx::cuda_ipc {
namespace {

IpcDescriptor sample() {
  IpcDescriptor d;
  for (size_t i = 0; i < d.handle.size(); ++i) d.handle[i] = static_cast<uint8_t>(i * 7);
  d.device_uuid[3] = 9;
  d.device = 1;
  d.owner_pid = 4242;
  d.alloc_id = 17;
  d.alloc_size = 1 << 20;
  d.offset = 4097;
  d.length = 12345;
  return d;
}

TEST(IpcDescriptor, RoundTrip) {
  IpcDescriptor d = sample();
  auto bytes = d.encode();
  ASSERT_EQ(bytes.size(), IpcDescriptor::kWireSize);
  auto back = IpcDescriptor::decode(bytes);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->handle, d.handle);
  EXPECT_EQ(back->device_uuid, d.device_uuid);
  EXPECT_EQ(back->alloc_id, 17u);
  EXPECT_EQ(back->offset, 4097u);
  EXPECT_EQ(back->length, 12345u);
  EXPECT_EQ(back->owner_pid, 4242);
}

TEST(IpcDescriptor, RejectsBadInput) {
  auto bytes = sample().encode();
  EXPECT_EQ(IpcDescriptor::decode(std::span(bytes).first(bytes.size() - 1)).status().code(), Code::kProtocol);
  auto bad = bytes;
  bad[0] = std::byte{0};
  EXPECT_EQ(IpcDescriptor::decode(bad).status().code(), Code::kProtocol);
  for (auto [off, len, size] : {std::tuple<uint64_t, uint64_t, uint64_t>{10, 10, 15}, {~0ull, 2, 100}, {1, ~0ull, 100},
                                {0, 1, 0}}) {
    IpcDescriptor d = sample();
    d.offset = off;
    d.length = len;
    d.alloc_size = size;
    auto r = IpcDescriptor::decode(d.encode());
    EXPECT_EQ(r.status().code(), Code::kProtocol) << off << " " << len << " " << size;
  }
  // Random bytes and single-byte flips never crash and never yield a region outside its allocation.
  std::mt19937_64 rng(1);
  for (int i = 0; i < 20000; ++i) {
    auto v = bytes;
    if (i % 2) {
      for (auto& b : v) b = std::byte(rng());
    } else {
      v[rng() % v.size()] = std::byte(rng());
    }
    auto r = IpcDescriptor::decode(v);
    if (r.ok()) {
      EXPECT_LE(r->offset + r->length, r->alloc_size);
    }
  }
}

// A cuMem allocation: no handle bytes (its fd travels beside the descriptor); the kind survives the
// wire, and the combinations that make no sense are refused.
TEST(IpcDescriptor, CuMemKind) {
  IpcDescriptor d = sample();
  d.kind = IpcDescriptor::Kind::kCuMemFd;
  d.handle = {};
  auto back = IpcDescriptor::decode(d.encode());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->kind, IpcDescriptor::Kind::kCuMemFd);
  EXPECT_EQ(IpcDescriptor::decode(sample().encode())->kind, IpcDescriptor::Kind::kIpcHandle);

  d.handle[5] = 1;  // handle bytes on a cuMem descriptor
  EXPECT_EQ(IpcDescriptor::decode(d.encode()).status().code(), Code::kProtocol);

  auto bytes = sample().encode();
  for (uint32_t kind : {0u, 3u, 0xffffffffu}) {  // offset 12: the kind
    auto v = bytes;
    std::memcpy(v.data() + 12, &kind, 4);
    auto r = IpcDescriptor::decode(v);
    EXPECT_EQ(r.status().code(), Code::kProtocol) << kind;
    EXPECT_NE(r.status().message().find("unknown kind"), std::string::npos) << r.status().message();
  }
  auto v1 = bytes;  // a version-1 peer (reserved zero where the kind is)
  uint32_t one = 1, zero = 0;
  std::memcpy(v1.data() + 8, &one, 4);
  std::memcpy(v1.data() + 12, &zero, 4);
  auto r = IpcDescriptor::decode(v1);
  EXPECT_EQ(r.status().code(), Code::kProtocol);
  EXPECT_NE(r.status().message().find("version 1 (we speak 2)"), std::string::npos) << r.status().message();
}

// The cache keys an allocation by (peer, id) and trusts an entry only for the same kind.
TEST(ImportCache, KindChangeReplacesTheMapping) {
  struct Counting : ImportCache::Opener {
    Result<void*> open(const IpcDescriptor&) override { return reinterpret_cast<void*>(0x1000 * ++opened); }
    void close(void*) override { ++closed; }
    int opened = 0, closed = 0;
  } opener;
  ImportCache cache(&opener);
  IpcDescriptor d = sample();
  ASSERT_TRUE(cache.acquire("p", d).ok());
  cache.release("p", d.alloc_id);
  d.kind = IpcDescriptor::Kind::kCuMemFd;
  d.handle = {};
  ASSERT_TRUE(cache.acquire("p", d).ok());
  cache.release("p", d.alloc_id);
  EXPECT_EQ(opener.opened, 2);
  EXPECT_EQ(opener.closed, 1);
}

class FakeOpener : public ImportCache::Opener {
 public:
  Result<void*> open(const IpcDescriptor& d) override {
    if (fail_next) {
      fail_next = false;
      return Status(Code::kIo, "fake open failed");
    }
    void* p = reinterpret_cast<void*>(0x1000 * ++opened);
    open_set.insert(p);
    return p;
  }
  void close(void* base) override {
    EXPECT_EQ(open_set.erase(base), 1u) << "closed twice or never opened";
  }
  int opened = 0;
  bool fail_next = false;
  std::set<void*> open_set;
};

TEST(ImportCache, HitsMissesAndInvalidation) {
  FakeOpener opener;
  {
    ImportCache cache(&opener);
    IpcDescriptor d = sample();
    auto a = cache.acquire("pid 1", d);
    ASSERT_TRUE(a.ok());
    cache.release("pid 1", d.alloc_id);
    auto b = cache.acquire("pid 1", d);  // hit: same mapping
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(*a, *b);
    cache.release("pid 1", d.alloc_id);
    EXPECT_EQ(cache.stats().hits, 1u);
    EXPECT_EQ(cache.stats().misses, 1u);
    // Another peer with the same id is another mapping.
    auto c = cache.acquire("pid 2", d);
    ASSERT_TRUE(c.ok());
    EXPECT_NE(*a, *c);
    cache.release("pid 2", d.alloc_id);
    EXPECT_EQ(opener.open_set.size(), 2u);

    cache.invalidate("pid 1", d.alloc_id);  // not in use: closed now
    EXPECT_EQ(opener.open_set.size(), 1u);
    EXPECT_EQ(cache.size(), 1u);

    // In use: closed only at the last release; a new acquire after invalidation opens anew.
    auto e = cache.acquire("pid 2", d);
    ASSERT_TRUE(e.ok());
    cache.invalidate("pid 2", d.alloc_id);
    EXPECT_EQ(opener.open_set.count(*e), 1u);
    cache.release("pid 2", d.alloc_id);
    EXPECT_EQ(opener.open_set.count(*e), 0u);
    EXPECT_EQ(cache.size(), 0u);
  }
  EXPECT_TRUE(opener.open_set.empty());
}

TEST(ImportCache, ReusedIdWithAnotherHandleReplacesTheMapping) {
  FakeOpener opener;
  ImportCache cache(&opener);
  IpcDescriptor d = sample();
  auto a = cache.acquire("p", d);
  ASSERT_TRUE(a.ok());
  IpcDescriptor other = d;
  other.handle[0] ^= 1;
  // In use: refusing is the only safe answer.
  EXPECT_EQ(cache.acquire("p", other).status().code(), Code::kProtocol);
  cache.release("p", d.alloc_id);
  auto b = cache.acquire("p", other);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_EQ(opener.open_set.size(), 1u);
  cache.release("p", d.alloc_id);
}

TEST(ImportCache, DropPeerAndOpenFailure) {
  FakeOpener opener;
  ImportCache cache(&opener);
  IpcDescriptor d = sample();
  for (uint64_t id = 1; id <= 5; ++id) {
    d.alloc_id = id;
    ASSERT_TRUE(cache.acquire("dead", d).ok());
    cache.release("dead", id);
    ASSERT_TRUE(cache.acquire("alive", d).ok());
    cache.release("alive", id);
  }
  cache.drop_peer("dead");
  EXPECT_EQ(cache.size(), 5u);
  EXPECT_EQ(opener.open_set.size(), 5u);
  opener.fail_next = true;
  d.alloc_id = 99;
  EXPECT_EQ(cache.acquire("alive", d).status().code(), Code::kIo);
  EXPECT_EQ(cache.size(), 5u);
}

// Without a usable CUDA device (no CUDA build, no driver, no device) every entry point fails with
// kUnavailable and the memory layer's reason for it. In a child: the GPU tests of this binary fork
// children that use CUDA, which they cannot once this process has initialised it.
TEST(CudaIpc, UnavailableSaysWhy) {
  std::string text = testing::text_from_child([] {
    Status gpu = mem_available(MemSpec{MemKind::kCuda, 0});
    if (gpu.ok()) return std::string();
    std::vector<char> host(64);
    Exporter ex;
    std::string out = gpu.message();
    for (const Status& s : {available(), CopyEngine::create({}).status(),
                            ex.export_region(MemRegion{host.data(), host.size(), MemSpec{MemKind::kCuda, 0}}).status()})
      out += "\n" + std::to_string(static_cast<int>(s.code())) + " " + s.message();
    // Whether this machine has a driver at all, asked of the loader, not of dmx (in the child:
    // a driver loaded here would stay for the GPU tests' children).
    void* driver = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    out += driver != nullptr ? "\ndriver" : "\nno driver";
    if (driver != nullptr) ::dlclose(driver);
    return out;
  });
  if (text.empty()) DMX_SKIP(::dmx::test::kHasGpu) << "this test covers machines without one";
  std::vector<std::string> lines;
  for (size_t at = 0, nl; at <= text.size(); at = nl + 1) {
    nl = std::min(text.find('\n', at), text.size());
    lines.push_back(text.substr(at, nl - at));
  }
  ASSERT_EQ(lines.size(), 5u) << text;
  const std::string& why = lines[0];
  EXPECT_FALSE(why.empty());
  // Where it says most: a CUDA build on a machine without the driver names the missing driver.
#if defined(DMX_HAVE_CUDA) && DMX_HAVE_CUDA
  if (lines[4] == "no driver") {
    EXPECT_NE(why.find("no CUDA driver (libcuda.so.1)"), std::string::npos) << why;
  }
#else
  EXPECT_NE(why.find("built without CUDA"), std::string::npos) << why;
#endif
  const std::string unavailable = std::to_string(static_cast<int>(Code::kUnavailable)) + " cuda_ipc: ";
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_TRUE(lines[i].starts_with(unavailable)) << lines[i];
    EXPECT_NE(lines[i].find(why), std::string::npos) << "not the memory layer's reason (" << why << "): " << lines[i];
  }
  std::printf("cuda_ipc unavailable: %s\n", lines[1].c_str());
}

}  // namespace
}  // namespace dmx::cuda_ipc
