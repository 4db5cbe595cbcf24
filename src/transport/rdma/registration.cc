#include "transport/rdma/registration.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "core/sys.h"
#include "memory/dmabuf.h"

namespace dmx::rdma {

bool peermem_loaded(std::string* what) {
  std::error_code ec;
  if (std::filesystem::exists("/sys/kernel/mm/memory_peers/nv_mem/version", ec)) {
    *what = "nv_peer_mem (/sys/kernel/mm/memory_peers/nv_mem/version)";
    return true;
  }
  if (std::filesystem::exists("/sys/module/nvidia_peermem", ec)) {
    *what = "nvidia_peermem (/sys/module/nvidia_peermem)";
    return true;
  }
  *what = "no peer-memory module (neither /sys/kernel/mm/memory_peers/nv_mem/version nor /sys/module/nvidia_peermem)";
  return false;
}

GpuRegistration gpu_registration(const std::string& setting) {
  GpuRegistration g;
  std::string pm;
  bool have_pm = peermem_loaded(&pm);
#if DMX_HAVE_CUDA
  const bool cuda = true;
#else
  const bool cuda = false;
#endif
  if (setting == "off") {
    g.why = "GPU memory goes by other paths (rdma_gpu=off)";
    return g;
  }
  if (!cuda) {
    g.why = "GPU memory goes by other paths: dmx was built without CUDA";
    return g;
  }
  g.dmabuf = setting == "auto" || setting == "dmabuf";
  g.peermem = (setting == "auto" || setting == "peermem") && have_pm;
  if (g.dmabuf && g.peermem)
    g.why = "GPU memory by ibv_reg_dmabuf_mr on a CUDA dma-buf, else by peer memory: " + pm;
  else if (g.dmabuf)
    g.why = "GPU memory by ibv_reg_dmabuf_mr on a CUDA dma-buf (" + pm + ")";
  else if (g.peermem)
    g.why = "GPU memory by peer memory: " + pm;
  else
    g.why = "GPU memory goes by other paths: rdma_gpu=peermem but " + pm;
  return g;
}

bool GpuRegistration::direct(const MemSpec& m) const {
  if (m.kind != MemKind::kCuda || !(dmabuf || peermem)) return false;
  for (int g : staged)
    if (g == m.device) return false;
  return true;
}

Result<std::shared_ptr<Mr>> register_region(const std::shared_ptr<Pd>& pd, const MemRegion& r, int access,
                                            const GpuRegistration& gpu) {
  if (r.size == 0 || r.ptr == nullptr) return Status(Code::kInvalidArgument, "rdma: registering an empty region");
  if (r.where.kind == MemKind::kHost || r.where.kind == MemKind::kPinned) {
    ibv_mr* mr = ibv_reg_mr(pd->get(), r.ptr, r.size, access);
    if (!mr)
      return Status(Code::kUnavailable,
                    fmt::format("rdma: ibv_reg_mr({} B of {} memory) failed: {}", r.size, to_string(r.where),
                                errno_text(errno)));
    return std::make_shared<Mr>(pd, mr, "ibv_reg_mr");
  }
  if (r.where.kind != MemKind::kCuda)
    return Status(Code::kUnavailable, fmt::format("rdma cannot register {} memory", to_string(r.where)));
  std::string tried;
  if (gpu.dmabuf) {
    auto e = export_dmabuf(r);
    if (e.ok()) {
      ibv_mr* mr = ibv_reg_dmabuf_mr(pd->get(), e->offset, r.size, reinterpret_cast<uintptr_t>(r.ptr), e->fd.get(),
                                     access);
      if (mr) return std::make_shared<Mr>(pd, mr, "dma-buf");
      tried = fmt::format("ibv_reg_dmabuf_mr failed: {}", errno_text(errno));
    } else {
      tried = fmt::format("no dma-buf: {}", e.status().message());
    }
  }
  if (gpu.peermem) {
    ibv_mr* mr = ibv_reg_mr(pd->get(), r.ptr, r.size, access);
    if (mr) return std::make_shared<Mr>(pd, mr, "peer memory");
    tried += fmt::format("{}ibv_reg_mr on the device pointer (peer memory) failed: {}", tried.empty() ? "" : "; ",
                         errno_text(errno));
  }
  if (tried.empty()) tried = gpu.why;
  return Status(Code::kUnavailable, fmt::format("rdma cannot register {} memory: {}", to_string(r.where), tried));
}

Result<std::shared_ptr<Mr>> RegisteredRegion::mr_for(const std::shared_ptr<Pd>& pd, int access,
                                                     const GpuRegistration& gpu) {
  std::lock_guard lock(mu_);
  if (auto it = mrs_.find(pd.get()); it != mrs_.end()) return it->second;
  DMX_ASSIGN_OR_RETURN(std::shared_ptr<Mr> mr, register_region(pd, region_, access, gpu));
  mrs_[pd.get()] = mr;
  return mr;
}

void RegisteredRegion::forget(const Pd* pd) {
  std::shared_ptr<Mr> gone;  // deregistered outside the lock
  std::lock_guard lock(mu_);
  if (auto it = mrs_.find(pd); it != mrs_.end()) {
    gone = std::move(it->second);
    mrs_.erase(it);
  }
}

std::shared_ptr<RegisteredRegion> RegionTable::add(const MemRegion& r) {
  auto e = std::make_shared<RegisteredRegion>(r);
  std::lock_guard lock(mu_);
  std::erase_if(by_base_, [](const auto& kv) { return kv.second.expired(); });
  by_base_.emplace(reinterpret_cast<uintptr_t>(r.ptr), e);
  return e;
}

std::shared_ptr<RegisteredRegion> RegionTable::find(const void* ptr, uint64_t len, const MemSpec& where) {
  constexpr int kScan = 64;  // a miss only costs a registration of the chunk itself
  auto a = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard lock(mu_);
  auto it = by_base_.upper_bound(a);
  for (int i = 0; i < kScan && it != by_base_.begin(); ++i) {
    --it;
    auto e = it->second.lock();
    if (!e) continue;
    const MemRegion& r = e->region();
    auto base = reinterpret_cast<uintptr_t>(r.ptr);
    if (r.where == where && a - base <= r.size && len <= r.size - (a - base)) return e;
  }
  return nullptr;
}

}  // namespace dmx::rdma
