// The production HostSeams (see devmem.h).
#include <fmt/format.h>
#include <net/if.h>

#include <charconv>

#include "core/config.h"
#include "memory/backend.h"
#include "topo/placement.h"
#include "transport/devmem/devmem.h"

namespace dmx::devmem {

Result<std::vector<uint32_t>> parse_queue_range(const std::string& text) {
  auto bad = [&] {
    return Status(Code::kInvalidArgument, fmt::format("devmem queues '{}': expected A-B or A (queue ids)", text));
  };
  uint32_t first = 0, last = 0;
  const char* b = text.data();
  const char* e = b + text.size();
  auto r = std::from_chars(b, e, first);
  if (r.ec != std::errc() || r.ptr == b) return bad();
  last = first;
  if (r.ptr != e) {
    if (*r.ptr != '-') return bad();
    auto r2 = std::from_chars(r.ptr + 1, e, last);
    if (r2.ec != std::errc() || r2.ptr != e || r2.ptr == r.ptr + 1) return bad();
  }
  if (last < first || last - first >= 1024) return bad();
  std::vector<uint32_t> q;
  for (uint32_t i = first; i <= last; ++i) q.push_back(i);
  return q;
}

Result<HostSeams> kernel_seams(const Config& config, int cuda_device) {
  HostSeams s;
  s.ifname = config.get_string("devmem_ifname");
  if (s.ifname.empty()) return Status(Code::kUnavailable, "devmem: off (setting devmem_ifname is empty)");
  s.ifindex = static_cast<int>(::if_nametoindex(s.ifname.c_str()));
  if (s.ifindex == 0) return Status(Code::kUnavailable, fmt::format("devmem: no interface named {}", s.ifname));
  const std::string& queues = config.get_string("devmem_queues");
  if (queues.empty())
    return Status(Code::kUnavailable, "devmem: setting devmem_queues is empty (the RX queues given to dmx devmem setup)");
  DMX_ASSIGN_OR_RETURN(s.queues, parse_queue_range(queues));
  s.netlink = std::shared_ptr<NetlinkOps>(make_kernel_netlink_ops());
  s.exporter = export_dmabuf;
  s.socket = [](int fd) { return make_kernel_socket(fd); };
  s.gatherer = [cuda_device] { return make_cuda_gatherer(cuda_device); };
  s.memory = MemSpec{MemKind::kCuda, cuda_device};
  // The RX pool, TX rings, zcrx areas and landing zones from the machine's placement, whose GPU
  // pools get CUDA memory (as the engine's).
  s.place = placement_memory(
      [root = config.get_string("sysfs_root")]() -> Result<std::shared_ptr<topo::Placement>> {
        return topo::Placement::for_root(root, topo::DeviceMemory{
                                                   [](int ordinal, uint64_t bytes) -> Result<void*> {
                                                     DMX_ASSIGN_OR_RETURN(MemoryBackend * b,
                                                                          backend_for(MemSpec{MemKind::kCuda, ordinal}));
                                                     return b->allocate(bytes);
                                                   },
                                                   [](int ordinal, void* p, uint64_t bytes) {
                                                     if (auto b = backend_for(MemSpec{MemKind::kCuda, ordinal}); b.ok())
                                                       (*b)->free(p, bytes);
                                                   }});
      },
      s.ifname, cuda_device, s.memory);
  s.zcrx = [](int ifindex, uint32_t queue, int sock, int dmabuf_fd, uint64_t size,
              uint32_t rq_entries) -> Result<std::unique_ptr<ZcrxKernel>> {
    // The kernel would answer EINVAL for either; the version says which.
    if (running_kernel_before(6, 15)) return Status(Code::kUnavailable, "the kernel has no io_uring zcrx (needs Linux 6.15)");
    if (running_kernel_before(6, 16))
      return Status(Code::kUnavailable, "the kernel's zcrx has no dma-buf areas (needs Linux 6.16)");
    return open_kernel_zcrx(ifindex, queue, sock, dmabuf_fd, size, rq_entries);
  };
  return s;
}

}  // namespace dmx::devmem
