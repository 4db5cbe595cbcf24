// python/src/buffer.h — the memory of a Python object as a dmx::MemRegion.
//
// Accepts objects with __dlpack__ (PyTorch, CuPy, JAX, NumPy ...) and the buffer protocol
// (bytearray, memoryview, NumPy ...); only contiguous memory. A torch.Tensor (that exact type) is
// read through its own attributes (data_ptr, nbytes, device): no DLPack capsule and no switch of
// the current CUDA device per call, which cost more than the transfer of a small tensor. A
// BufferRef holds the memory for as long as it lives (a buffer view, the tensor object, or the
// DLPack tensor whose deleter it calls at the end), so an operation keeps one until it completes.
// Create and destroy with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "dmx/memory.h"

namespace dmxpy {

class BufferRef {
 public:
  // `writable`: dmx will write into the memory (recv, read, register). Raises dmx.Error
  // (InvalidArgumentError) with the reason when the object cannot be used.
  // `torch_attributes` false: a torch.Tensor goes by DLPack too (the profile's comparison).
  static std::unique_ptr<BufferRef> acquire(pybind11::handle obj, bool writable, const char* what,
                                            bool torch_attributes = true);
  ~BufferRef();
  BufferRef(const BufferRef&) = delete;
  BufferRef& operator=(const BufferRef&) = delete;

  const dmx::MemRegion& region() const { return region_; }

 private:
  BufferRef() = default;
  bool from_buffer(pybind11::handle obj, bool writable, const char* what);
  bool from_torch(pybind11::handle obj);
  void from_dlpack(pybind11::handle obj, bool writable, const char* what);

  dmx::MemRegion region_;
  pybind11::object owner_;  // the torch.Tensor read by from_torch
  Py_buffer view_{};
  bool has_view_ = false;
  void* managed_ = nullptr;  // DLManagedTensor or DLManagedTensorVersioned
  bool versioned_ = false;
};

}  // namespace dmxpy
