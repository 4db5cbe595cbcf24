// p2pmem from user space: the kernel's allocator behind /sys/bus/pci/devices/<bdf>/p2pmem/allocate
// (Linux 6.2 and later). A shared mmap of that file, at offset 0, allocates the mapping's length
// (whole pages) from the device's P2PDMA pool; munmap gives it back. The mapping is ZONE_DEVICE
// pages, meant for O_DIRECT and RDMA registration; whether a pinning path accepts them is the
// running kernel's to say (a registration fails otherwise). CPU access goes over PCIe (slow reads).
//
// The kernel calls go through P2pmemKernel so that tests run a double that answers as the kernel
// does: EINVAL for a private mapping or a non-zero offset, ENODEV when the device has no P2PDMA
// pool (or is going away), ENOMEM when the pool has no contiguous range of that length, and
// open()'s errors (ENOENT: the kernel predates 6.2 or the BAR is not set up; EACCES: the file is
// 0660 root). Thread-safety: implementations are safe to call from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "dmx/status.h"

namespace dmx::topo {

class P2pmemKernel {
 public:
  virtual ~P2pmemKernel() = default;
  // open(path, O_RDWR), mmap(len, PROT_READ|PROT_WRITE, MAP_SHARED or MAP_PRIVATE, offset), close.
  // Errors carry the failing call, the path and errno (kUnavailable for ENOENT/EACCES/ENODEV,
  // kResourceExhausted for ENOMEM, kInvalidArgument for EINVAL).
  virtual Result<void*> map(const std::string& allocate_path, size_t len, bool shared, uint64_t offset) = 0;
  // munmap: the pages go back to the device's pool.
  virtual void unmap(void* p, size_t len) = 0;
};

// The real kernel (open/mmap/munmap).
std::shared_ptr<P2pmemKernel> kernel_p2pmem();

// Maps an errno of the allocate file to dmx's code (the table in the comment above).
Code p2pmem_errno_code(int err);

}  // namespace dmx::topo
