// python/src/buffer.h — the memory of a Python object as a dmx::MemRegion.
//
// Accepts objects with __dlpack__ (PyTorch, CuPy, JAX, NumPy ...) and the buffer protocol
// (bytearray, memoryview, NumPy ...); only contiguous memory. A BufferRef holds the memory for as
// long as it lives (a buffer view, or the DLPack tensor whose deleter it calls at the end), so an
// operation keeps one until it completes. Create and destroy with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "dmx/memory.h"

namespace dmxpy {

class BufferRef {
 public:
  // `writable`: dmx will write into the memory (recv, read, register). Raises dmx.Error
  // (InvalidArgumentError) with the reason when the object cannot be used.
  static std::unique_ptr<BufferRef> acquire(pybind11::handle obj, bool writable, const char* what);
  ~BufferRef();
  BufferRef(const BufferRef&) = delete;
  BufferRef& operator=(const BufferRef&) = delete;

  const dmx::MemRegion& region() const { return region_; }

 private:
  BufferRef() = default;
  bool from_buffer(pybind11::handle obj, bool writable, const char* what);
  void from_dlpack(pybind11::handle obj, bool writable, const char* what);

  dmx::MemRegion region_;
  Py_buffer view_{};
  bool has_view_ = false;
  void* managed_ = nullptr;  // DLManagedTensor or DLManagedTensorVersioned
  bool versioned_ = false;
};

}  // namespace dmxpy
