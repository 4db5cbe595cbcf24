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

void RegisteredRegion::track(const std::shared_ptr<Mr>& mr) {
  std::lock_guard lock(mu_);
  std::erase_if(windows_, [](const std::weak_ptr<Mr>& w) { return w.expired(); });
  windows_.push_back(mr);
}

RegisteredRegion::~RegisteredRegion() {
  for (auto& w : windows_)
    if (auto mr = w.lock()) mr->revoke();
  if (auto t = table_.lock()) t->remove(id_, region_);
}

std::shared_ptr<RegisteredRegion> RegionTable::add(const MemRegion& r) {
  const auto base = reinterpret_cast<uintptr_t>(r.ptr);
  // Entries locked here let go after the lock: the last reference's destructor takes it (remove).
  std::vector<std::shared_ptr<RegisteredRegion>> later;
  std::lock_guard lock(mu_);
  for (auto [it, end] = by_base_.equal_range(base); it != end; ++it) {
    auto e = later.emplace_back(by_id_[it->second].lock());
    if (e && e->region().size == r.size && e->region().where == r.where) return e;
  }
  const uint64_t id = next_id_++;
  auto e = std::make_shared<RegisteredRegion>(r, id, weak_from_this());
  by_id_[id] = e;
  by_base_.emplace(base, id);
  return e;
}

void RegionTable::remove(uint64_t id, const MemRegion& r) {
  const auto base = reinterpret_cast<uintptr_t>(r.ptr);
  std::lock_guard lock(mu_);
  by_id_.erase(id);
  for (auto [it, end] = by_base_.equal_range(base); it != end; ++it)
    if (it->second == id) {
      by_base_.erase(it);
      break;
    }
  gtlb_.invalidate(base, r.size);
}

std::shared_ptr<RegisteredRegion> RegionTable::find(const void* ptr, uint64_t len, const MemSpec& where) {
  constexpr int kScan = 64;  // a miss only costs a registration of the chunk itself
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  auto fits = [&](const std::shared_ptr<RegisteredRegion>& e) {
    if (!e) return false;
    const MemRegion& r = e->region();
    auto base = reinterpret_cast<uintptr_t>(r.ptr);
    return r.where == where && a >= base && a - base <= r.size && len <= r.size - (a - base);
  };
  std::vector<std::shared_ptr<RegisteredRegion>> later;  // as in add()
  std::lock_guard lock(mu_);
  if (auto hit = gtlb_.lookup(a, len)) {
    auto it = by_id_.find(hit->value);
    if (it != by_id_.end())
      if (auto e = later.emplace_back(it->second.lock()); fits(e)) return e;
  }
  auto it = by_base_.upper_bound(a);
  for (int i = 0; i < kScan && it != by_base_.begin(); ++i) {
    --it;
    auto e = later.emplace_back(by_id_[it->second].lock());
    if (!fits(e)) continue;
    const MemRegion& r = e->region();
    gtlb_.fill(GtlbEntry{reinterpret_cast<uintptr_t>(r.ptr), r.size, 0, it->second}, a, len);
    return e;
  }
  return nullptr;
}

GtlbCounters RegionTable::translations() const {
  std::lock_guard lock(mu_);
  return gtlb_.counters();
}

}  // namespace dmx::rdma
