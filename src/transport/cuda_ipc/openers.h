// The cuda_ipc copy engine's openers (openers.cc; CUDA builds only): how a peer's descriptor
// becomes a pointer this process can copy from.
#pragma once

#include <cstdint>
#include <map>

#include "memory/cuda/driver.h"
#include "transport/cuda_ipc/cuda_ipc.h"

namespace dmx::cuda_ipc::detail {

// Legacy IPC handles, mapped once per process and counted (Mappings in openers.cc).
Result<void*> open_ipc_mapping(const IpcDescriptor& desc, int device);
void close_ipc_mapping(void* base);

// This process's exports, for peers in this process (Options::in_process), by allocation id; the
// ids come from one process-wide counter.
uint64_t next_alloc_id();
void add_in_process_export(uint64_t id, uintptr_t base, uint64_t size, uint64_t buffer_id);
void remove_in_process_export(uint64_t id);

// A peer in this process: the exporter's own pointer, still the allocation that was exported.
class InProcessOpener final : public ImportCache::Opener {
 public:
  Result<void*> open(const IpcDescriptor& desc) override;
  void close(void*) override {}  // nothing was mapped
};

// Legacy handles through the process-wide mappings; cuMem allocations from their fds, mapped once
// per opener (a cuMem import may be mapped any number of times, so no process-wide table).
class CudaOpener final : public ImportCache::Opener {
 public:
  CudaOpener(int device, FdSource* fds) : device_(device), fds_(fds) {}
  ~CudaOpener() override;
  Result<void*> open(const IpcDescriptor& desc) override;
  void close(void* base) override;

 private:
  int device_;
  FdSource* fds_;
  std::map<void*, cuda::driver::CuMemMapping> cumem_;  // what open() mapped from fds, by base
};

}  // namespace dmx::cuda_ipc::detail
