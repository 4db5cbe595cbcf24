#include "topo/p2pmem.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "core/sys.h"

namespace dmx::topo {

Code p2pmem_errno_code(int err) {
  switch (err) {
    case ENOMEM:
      return Code::kResourceExhausted;
    case EINVAL:
      return Code::kInvalidArgument;
    case ENOENT:
    case EACCES:
    case EPERM:
    case ENODEV:
    case ENXIO:
      return Code::kUnavailable;
    default:
      return Code::kIo;
  }
}

namespace {

class RealP2pmem final : public P2pmemKernel {
 public:
  Result<void*> map(const std::string& path, size_t len, bool shared, uint64_t offset) override {
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      int e = errno;
      return Status(p2pmem_errno_code(e), fmt::format("open({}) failed: {}{}", path, errno_text(e),
                                                      e == ENOENT ? " (p2pmem allocation needs Linux 6.2 or later)"
                                                                  : ""));
    }
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, shared ? MAP_SHARED : MAP_PRIVATE, fd,
                     static_cast<off_t>(offset));
    int e = errno;
    ::close(fd);  // the mapping holds the file
    if (p == MAP_FAILED)
      return Status(p2pmem_errno_code(e), fmt::format("mmap({}, {} bytes) failed: {}", path, len, errno_text(e)));
    return p;
  }
  void unmap(void* p, size_t len) override { ::munmap(p, len); }
};

}  // namespace

std::shared_ptr<P2pmemKernel> kernel_p2pmem() {
  static std::shared_ptr<P2pmemKernel> k = std::make_shared<RealP2pmem>();
  return k;
}

}  // namespace dmx::topo
