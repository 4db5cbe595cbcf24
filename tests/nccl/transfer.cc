// The harness's send and receive loops, and its memory (host, or CUDA through dmx::Buffer).
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <thread>

#if DMX_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "dmx/dmx.h"
#include "memory/backend.h"
#include "memory/cumem.h"
#include "memory/dmabuf.h"
#include "tests/nccl/harness.h"

namespace dmx::nccl::test {

namespace {

constexpr unsigned char kPoison = 0xa5;

bool expired(std::chrono::steady_clock::time_point t0, double seconds) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds;
}

std::string rc(const char* what, NcclResult r) { return std::string(what) + " returned " + std::to_string(int(r)); }

}  // namespace

std::string make_region(bool cuda, size_t bytes, Region* out) {
  return make_region(cuda ? RegionKind::kCuda : RegionKind::kHost, 0, bytes, out);
}

std::string make_region(RegionKind kind, int gpu, size_t bytes, Region* out) {
  out->kind = kind;
  out->gpu = gpu;
  if (kind == RegionKind::kHost) {
    out->host.assign(bytes, kPoison);
    return {};
  }
  if (kind == RegionKind::kCuda) {
    auto b = Buffer::allocate(MemSpec{MemKind::kCuda, gpu}, bytes);
    if (!b.ok()) return b.status().to_string();
    auto owned = std::make_shared<Buffer>(*std::move(b));
    out->device = owned->data();
    out->owner = owned;
  } else {
    auto p = cuda_cumem_alloc_owner_only(gpu, bytes);  // as NCCL's ncclCuMemAlloc
    if (!p.ok()) return p.status().to_string();
    out->device = *p;
    out->owner = std::shared_ptr<void>(*p, [](void* q) { cuda_cumem_free(q); });
  }
  return write_region(*out, std::vector<unsigned char>(bytes, kPoison));
}

std::string register_region(Api& api, void* comm, Region& r, size_t bytes, void** mh, std::string* how) {
  std::string used = "regMr";
  NcclResult rc;
  if (r.kind == RegionKind::kNcclCuMem) {
    auto d = export_dmabuf(MemRegion{r.device, bytes, {MemKind::kCuda, r.gpu}});
    if (d.ok()) {
      used = "regMrDmaBuf";
      rc = api.reg_mr_dma_buf(comm, r.device, bytes, kPtrCuda, d->offset, d->fd.get(), mh);
      // d->fd closes here, as NCCL closes its fd after the call.
    } else {
      used = "regMr (no dma-buf: " + d.status().to_string() + ")";
      rc = api.reg_mr(comm, r.device, bytes, kPtrCuda, mh);
    }
  } else {
    rc = api.reg_mr(comm, r.data(), bytes, r.kind == RegionKind::kHost ? kPtrHost : kPtrCuda, mh);
  }
  if (how != nullptr) *how = used;
  return rc == kSuccess ? std::string() : used + " returned " + std::to_string(int(rc));
}

std::string use_gpu(int gpu) {
#if DMX_HAVE_CUDA
  cudaError_t e = cudaSetDevice(gpu);
  return e == cudaSuccess ? std::string() : std::string("cudaSetDevice: ") + cudaGetErrorName(e);
#else
  return "built without CUDA";
#endif
}

int gpu_count(std::string* why) {
  auto n = cuda_device_count();
  if (!n.ok()) {
    if (why != nullptr) *why = n.status().message();
    return 0;
  }
  return *n;
}

std::string write_region(Region& r, const std::vector<unsigned char>& bytes) {
  if (!r.device) {
    std::memcpy(r.host.data(), bytes.data(), bytes.size());
    return {};
  }
  Status s = copy_memory(MemRegion{r.device, bytes.size(), {MemKind::kCuda, r.gpu}},
                         MemRegion{const_cast<unsigned char*>(bytes.data()), bytes.size(), {}});
  return s.ok() ? std::string() : s.to_string();
}

std::string read_region(Region& r, std::vector<unsigned char>* bytes) {
  if (!r.device) {
    *bytes = r.host;
    return {};
  }
  Status s = copy_memory(MemRegion{bytes->data(), bytes->size(), {}},
                         MemRegion{r.device, bytes->size(), {MemKind::kCuda, r.gpu}});
  return s.ok() ? std::string() : s.to_string();
}

std::vector<unsigned char> sender_bytes(const Plan& plan, uint64_t seed) {
  std::vector<unsigned char> out(plan.region_bytes, kPoison);
  for (const auto& g : plan.groups)
    for (const auto& m : g) fill(seed, m, out.data() + m.offset);
  return out;
}

std::string verify(const std::vector<unsigned char>& got, const Plan& plan, uint64_t seed) {
  std::vector<unsigned char> want(plan.region_bytes, kPoison);
  for (const auto& g : plan.groups)
    for (const auto& m : g) fill(seed, m, want.data() + m.offset);
  if (got.size() != want.size()) return "region size differs";
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) {
      for (const auto& g : plan.groups)
        for (const auto& m : g)
          if (i >= m.offset && i < m.offset + m.recv_size + 64)
            return "byte " + std::to_string(i - m.offset) + " of the " + std::to_string(m.size) + "-byte message (tag " +
                   std::to_string(m.tag) + ") differs" + (i - m.offset >= m.size ? ": written past the message" : "");
      return "byte " + std::to_string(i) + " outside every buffer differs";
    }
  return {};
}

std::string run_sends(Side& s, const Plan& plan, uint64_t seed, int window, double seconds) {
  struct InFlight {
    void* req;
    size_t size;
  };
  std::deque<InFlight> flying;
  size_t next = 0;
  auto t0 = std::chrono::steady_clock::now();
  while (next < plan.send_order.size() || !flying.empty()) {
    while (next < plan.send_order.size() && static_cast<int>(flying.size()) < window) {
      const Msg& m = plan.send_order[next];
      void* req = nullptr;
      NcclResult r = s.api->isend(s.comm, s.base + m.offset, m.size, m.tag, s.mh, &req);
      if (r != kSuccess) return rc("isend", r);
      if (req == nullptr) break;  // NCCL's "try again"
      flying.push_back({req, m.size});
      ++next;
    }
    for (auto it = flying.begin(); it != flying.end();) {
      int done = 0, size = -1;
      NcclResult r = s.api->test(it->req, &done, &size);
      if (r != kSuccess) return rc("test(isend)", r);
      if (!done) {
        ++it;
        continue;
      }
      if (size != static_cast<int>(it->size))
        return "isend of " + std::to_string(it->size) + " B: test said " + std::to_string(size);
      it = flying.erase(it);
    }
    if (expired(t0, seconds)) return "sends did not finish in time (" + std::to_string(flying.size()) + " in flight)";
  }
  return {};
}

std::string run_recvs(Side& s, const Plan& plan, uint64_t seed, int window, double seconds) {
  struct InFlight {
    void* req;
    size_t group;
  };
  std::deque<InFlight> flying;
  size_t next = 0;
  auto t0 = std::chrono::steady_clock::now();
  while (next < plan.groups.size() || !flying.empty()) {
    while (next < plan.groups.size() && static_cast<int>(flying.size()) < window) {
      const auto& g = plan.groups[next];
      void* data[8];
      size_t sizes[8];
      int tags[8];
      void* mhs[8];
      for (size_t i = 0; i < g.size(); ++i) {
        data[i] = s.base + g[i].offset;
        sizes[i] = g[i].recv_size;
        tags[i] = g[i].tag;
        mhs[i] = s.mh;
      }
      void* req = nullptr;
      NcclResult r = s.api->irecv(s.comm, static_cast<int>(g.size()), data, sizes, tags, mhs, &req);
      if (r != kSuccess) return rc("irecv", r);
      if (req == nullptr) break;
      flying.push_back({req, next});
      ++next;
    }
    for (auto it = flying.begin(); it != flying.end();) {
      int done = 0, sizes[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
      NcclResult r = s.api->test(it->req, &done, sizes);
      if (r != kSuccess) return rc("test(irecv)", r);
      if (!done) {
        ++it;
        continue;
      }
      const auto& g = plan.groups[it->group];
      for (size_t i = 0; i < g.size(); ++i)
        if (sizes[i] != static_cast<int>(g[i].size))
          return "group " + std::to_string(it->group) + " buffer " + std::to_string(i) + ": test said " +
                 std::to_string(sizes[i]) + " B, sent " + std::to_string(g[i].size);
      if (s.cuda) {  // completion of a receive into GPU memory: NCCL flushes then
        void* freq = nullptr;
        int fs[8] = {};
        void* data[8] = {};
        void* mhs[8] = {};
        if (NcclResult f = s.api->iflush(s.comm, static_cast<int>(g.size()), data, fs, mhs, &freq); f != kSuccess)
          return rc("iflush", f);
        int fdone = 0;
        while (!fdone)
          if (NcclResult f = s.api->test(freq, &fdone, nullptr); f != kSuccess) return rc("test(iflush)", f);
      }
      it = flying.erase(it);
    }
    if (expired(t0, seconds)) return "receives did not finish in time (" + std::to_string(flying.size()) + " in flight)";
  }
  return {};
}

}  // namespace dmx::nccl::test
