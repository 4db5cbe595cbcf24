#include "transport/rdma/p2pmem.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "core/sys.h"

namespace dmx::rdma {

P2pmemMapping::~P2pmemMapping() {
  if (ptr_) ::munmap(ptr_, size_);
}

Result<std::unique_ptr<P2pmemMapping>> map_p2pmem(const std::string& sysfs_root, const std::string& bdf, size_t size) {
  const std::string dir = fmt::format("{}/bus/pci/devices/{}/p2pmem", sysfs_root, bdf);
  if (::access(dir.c_str(), F_OK) != 0)
    return Status(Code::kUnavailable, fmt::format("p2pmem: {} has no {} ({}: the device publishes no P2PDMA memory)",
                                                  bdf, dir, errno_text(errno)));
  const std::string file = dir + "/allocate";
  UniqueFd fd(::open(file.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid())
    return Status(Code::kUnavailable, fmt::format("p2pmem: open({}) failed: {} (kernel 5.19+ maps p2pmem from it)", file,
                                                  errno_text(errno)));
  long page = ::sysconf(_SC_PAGESIZE);
  size_t len = (size + static_cast<size_t>(page) - 1) / static_cast<size_t>(page) * static_cast<size_t>(page);
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED)
    return Status(Code::kUnavailable,
                  fmt::format("p2pmem: the kernel refused to map {} B of {}'s p2pmem: mmap({}) failed: {}", len, bdf,
                              file, errno_text(errno)));
  auto m = std::unique_ptr<P2pmemMapping>(new P2pmemMapping());
  m->ptr_ = p;
  m->size_ = len;
  m->bdf_ = bdf;
  return m;
}

Result<std::shared_ptr<Mr>> register_p2pmem(const std::shared_ptr<Pd>& pd, const P2pmemMapping& m) {
  ibv_mr* mr = ibv_reg_mr(pd->get(), m.data(), m.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  if (!mr)
    return Status(Code::kUnavailable,
                  fmt::format("p2pmem: the kernel refused to register {} B of {}'s p2pmem with the NIC: ibv_reg_mr "
                              "failed: {}{}",
                              m.size(), m.device(), errno_text(errno),
                              errno == EFAULT || errno == EOPNOTSUPP || errno == EREMOTEIO
                                  ? " (ib_umem cannot pin P2PDMA pages, or the host bridge is not on the kernel's "
                                    "P2PDMA list)"
                                  : ""));
  return std::make_shared<Mr>(pd, mr, "p2pmem");
}

}  // namespace dmx::rdma
