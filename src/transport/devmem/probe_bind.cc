#include "transport/devmem/probe_bind.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/udmabuf.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

namespace dmx::devmem {
namespace {

bool contains(const std::string& s, std::string_view what) { return s.find(what) != std::string::npos; }
bool has_errno(const std::string& m, int e) { return contains(m, fmt::format("(errno {})", e)); }

UniqueFd memfd() { return UniqueFd(::memfd_create("dmx-devmem-probe", MFD_CLOEXEC)); }

}  // namespace

Result<UniqueFd> make_udmabuf(size_t size) {
  UniqueFd dev(::open("/dev/udmabuf", O_RDWR | O_CLOEXEC));
  if (!dev.valid()) return errno_status("open(/dev/udmabuf)", errno, Code::kUnavailable);
  UniqueFd mem(::memfd_create("dmx-devmem-udmabuf", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!mem.valid()) return errno_status("memfd_create(udmabuf)", errno);
  size = (size + 4095) / 4096 * 4096;
  if (::ftruncate(mem.get(), static_cast<off_t>(size)) != 0) return errno_status("ftruncate(udmabuf memfd)", errno);
  if (::fcntl(mem.get(), F_ADD_SEALS, F_SEAL_SHRINK) != 0) return errno_status("F_ADD_SEALS(udmabuf memfd)", errno);
  udmabuf_create c{};
  c.memfd = static_cast<uint32_t>(mem.get());
  c.flags = UDMABUF_FLAGS_CLOEXEC;
  c.size = size;
  int fd = ::ioctl(dev.get(), UDMABUF_CREATE, &c);
  if (fd < 0) return errno_status("ioctl(UDMABUF_CREATE)", errno, Code::kUnavailable);
  return UniqueFd(fd);
}

Capability classify_bind(const std::string& name, const Status& s, bool tx, ProbeFd kind) {
  const char* how = kind == ProbeFd::kUdmabuf     ? "bind with a udmabuf (host memory)"
                    : kind == ProbeFd::kGpuDmabuf ? "bind with a dma-buf of GPU memory"
                                                  : "bind with a memfd, classified";
  if (s.ok())
    return {name, true, kind != ProbeFd::kMemfd ? fmt::format("{}: bound and released", how)
                                                : "the kernel bound a memfd (not a dma-buf): unexpected kernel"};
  const std::string& m = s.message();
  Capability c{name, false, fmt::format("{}: {}", how, m)};
  bool extack = contains(m, "; kernel:");
  if (has_errno(m, EOPNOTSUPP)) {
    c.detail = fmt::format("{} ({}): {}", tx ? "driver has no netmem TX" : "driver has no queue API for memory providers", how, m);
  } else if (has_errno(m, EPERM) || has_errno(m, EACCES)) {
    c.detail = fmt::format("unknown: binding needs CAP_NET_ADMIN ({}: {})", how, m);
  } else if (has_errno(m, ENODEV)) {
    c.detail = fmt::format("no such device ({}: {})", how, m);
  } else if (has_errno(m, EINVAL) && !extack && kind == ProbeFd::kMemfd) {
    // dma_buf_get() refused the memfd: everything about the device before it passed.
    c.available = true;
    c.detail = fmt::format("device checks passed; the kernel refused the probe memfd as not a dma-buf (EINVAL from "
                           "dma_buf_get), as expected; the dma-buf import{} is first tried by a real bind",
                           tx ? "" : " and the per-queue checks (header split, queue free)");
  } else if (has_errno(m, EINVAL) && (contains(m, "tcp-data-split") || contains(m, "hds-thresh"))) {
    c.detail = fmt::format("driver supports devmem but the NIC needs `dmx devmem setup` ({}: {})", how, m);
  } else if (has_errno(m, EINVAL) && contains(m, "attribute at offset")) {
    c.detail = fmt::format("the kernel refused the queue id (out of range?) ({}: {})", how, m);
  } else if (has_errno(m, 524)) {  // ENOTSUPP, kernel-internal: the exporter refused the attach
    c.detail = fmt::format("the GPU driver refused the NIC's attach of its memory (NVIDIA's PCIe topology check: "
                           "ENOTSUPP 524; GPU and NIC need a path it accepts) ({}: {})", how, m);
  } else if (has_errno(m, EEXIST)) {
    c.detail = fmt::format("queue already in use by a memory provider or XDP ({}: {})", how, m);
  }
  return c;
}

Capability probe_bind_rx(NetlinkOps& ops, const std::string& ifname, int ifindex, uint32_t queue) {
  std::string name = fmt::format("devmem.bind_rx[{}]", ifname);
  UniqueFd fd = memfd();
  if (!fd.valid()) return {name, false, errno_status("memfd_create", errno).message()};
  uint32_t q[] = {queue};
  auto b = ops.bind_rx(ifindex, fd.get(), q);
  return classify_bind(name, b.ok() ? Status() : b.status(), false, ProbeFd::kMemfd);
}

Capability probe_bind_tx(NetlinkOps& ops, const std::string& ifname, int ifindex,
                         const std::function<Result<UniqueFd>()>& udmabuf) {
  std::string name = fmt::format("devmem.bind_tx[{}]", ifname);
  auto real = udmabuf ? udmabuf() : Result<UniqueFd>(Status(Code::kUnavailable, "no udmabuf source"));
  if (real.ok()) {
    auto b = ops.bind_tx(ifindex, real->get());  // released at once: closing its netlink socket unbinds
    return classify_bind(name, b.ok() ? Status() : b.status(), true, ProbeFd::kUdmabuf);
  }
  UniqueFd fd = memfd();
  if (!fd.valid()) return {name, false, errno_status("memfd_create", errno).message()};
  auto b = ops.bind_tx(ifindex, fd.get());
  Capability c = classify_bind(name, b.ok() ? Status() : b.status(), true, ProbeFd::kMemfd);
  c.detail += fmt::format(" (no udmabuf: {})", real.status().message());
  return c;
}

}  // namespace dmx::devmem
