#include "buffer.h"

#include <string>
#include <string_view>

#include "dlpack.h"
#include "errors.h"

namespace py = pybind11;

namespace dmxpy {
namespace {

std::string type_name(py::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

// The pending Python exception's text, cleared.
std::string take_python_error() {
  py::error_already_set e;
  return e.what();
}

const char* device_name(int32_t type) {
  switch (type) {
    case dlpack::kDLCUDAManaged: return "CUDA managed memory";
    case 4: return "OpenCL";
    case 7: return "Vulkan";
    case 8: return "Metal";
    case 10: return "ROCm";
    case 11: return "ROCm host";
    default: return "this device type";
  }
}

// Whether the items of a buffer of this format (the struct module's syntax, PEP 3118) are plain
// data, which another process can read as bytes: numbers, bools, characters, strings, padding,
// and structs and arrays of these. Objects ('O'), pointers ('P', 'z', '&'), function pointers ('X')
// and anything unknown here are not: moving them would send our heap addresses, or write a
// peer's bytes over a Python object's pointers.
bool plain_data_format(std::string_view format) {
  constexpr std::string_view kItems = "xcbB?hHiIlLqQnNefdgspuwZ";  // Z: complex, before f/d/g
  constexpr std::string_view kSyntax = "@=<>!^T{}(),0123456789 \t\n";
  for (size_t i = 0; i < format.size(); ++i) {
    char c = format[i];
    if (c == ':') {  // a field name, up to the next ':'
      i = format.find(':', i + 1);
      if (i == std::string_view::npos) return false;
    } else if (kItems.find(c) == std::string_view::npos && kSyntax.find(c) == std::string_view::npos) {
      return false;
    }
  }
  return true;
}

// DLPack's element types that are plain data: all but opaque handles (pointers) and unknown codes.
bool plain_data_code(uint8_t code) {
  return code <= dlpack::kDLFloat4E2m1fn && code != dlpack::kDLOpaqueHandle;
}

}  // namespace

std::unique_ptr<BufferRef> BufferRef::acquire(py::handle obj, bool writable, const char* what) {
  std::unique_ptr<BufferRef> b(new BufferRef());
  // The buffer protocol first where both exist (NumPy): it is cheaper, and it can export
  // read-only arrays, which DLPack before v1 cannot.
  if (PyObject_CheckBuffer(obj.ptr())) {
    if (b->from_buffer(obj, writable, what)) return b;
  } else if (PyObject_HasAttrString(obj.ptr(), "__dlpack__")) {
    b->from_dlpack(obj, writable, what);
    return b;
  }
  raise_error(dmx::Code::kInvalidArgument, std::string(what) + ": expected an object with __dlpack__ or the buffer " +
                                               "protocol (NumPy array, tensor, bytearray, memoryview), got " +
                                               type_name(obj));
}

bool BufferRef::from_buffer(py::handle obj, bool writable, const char* what) {
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) {
    std::string why = take_python_error();
    raise_error(dmx::Code::kInvalidArgument,
                std::string(what) + ": " + type_name(obj) + " cannot be used: " + why +
                    (writable ? " (dmx writes into it: it must be writable and C-contiguous)"
                              : " (it must be C-contiguous: copy it, e.g. numpy.ascontiguousarray)"));
  }
  has_view_ = true;
  // No format means unsigned bytes.
  if (view_.format != nullptr && !plain_data_format(view_.format))
    raise_error(dmx::Code::kInvalidArgument,
                std::string(what) + ": " + type_name(obj) + " of item format '" + view_.format +
                    "' is not plain data: dmx moves bytes, and these items hold Python objects or pointers");
  region_ = dmx::MemRegion{view_.buf, static_cast<size_t>(view_.len), dmx::MemSpec{dmx::MemKind::kHost, 0}};
  return true;
}

// PyTorch exports a CUDA tensor only while its device is the current one ("Can't export tensors
// on a different CUDA device index"): a tensor on cuda:1 is exported inside torch.cuda.device(1).
class TorchDeviceGuard {
 public:
  explicit TorchDeviceGuard(py::handle obj) {
    py::object module = py::type::handle_of(obj).attr("__module__");
    if (!py::isinstance<py::str>(module) || module.cast<std::string>().rfind("torch", 0) != 0 ||
        !py::hasattr(obj, "__dlpack_device__"))
      return;
    py::tuple dev = obj.attr("__dlpack_device__")();
    if (dev.size() != 2 || dev[0].cast<int>() != dlpack::kDLCUDA) return;
    guard_ = py::module_::import("torch").attr("cuda").attr("device")(dev[1]);
    guard_.attr("__enter__")();
  }
  ~TorchDeviceGuard() {
    if (!guard_) return;
    try {
      guard_.attr("__exit__")(py::none(), py::none(), py::none());
    } catch (py::error_already_set&) {  // nothing to do about it here; the export's error wins
    }
  }

 private:
  py::object guard_;
};

void BufferRef::from_dlpack(py::handle obj, bool writable, const char* what) {
  TorchDeviceGuard device_guard(obj);
  py::object export_fn = obj.attr("__dlpack__");
  py::object capsule;
  // Ask for a versioned capsule (it says whether the memory is read-only); producers older than
  // DLPack 1.0 do not know max_version and raise TypeError: ask again the old way.
  try {
    capsule = export_fn(py::arg("max_version") = py::make_tuple(1, 1));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) {
      raise_error(dmx::Code::kInvalidArgument,
                  std::string(what) + ": " + type_name(obj) + ".__dlpack__() failed: " + e.what());
    }
  }
  if (!capsule) {
    try {
      capsule = export_fn();
    } catch (py::error_already_set& e) {
      raise_error(dmx::Code::kInvalidArgument,
                  std::string(what) + ": " + type_name(obj) + ".__dlpack__() failed: " + e.what());
    }
  }
  PyObject* cap = capsule.ptr();
  dlpack::DLTensor* t = nullptr;
  uint64_t flags = 0;
  if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
    auto* m = static_cast<dlpack::DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
    PyCapsule_SetName(cap, "used_dltensor_versioned");  // ours now: the capsule no longer frees it
    managed_ = m;
    versioned_ = true;
    if (m->version.major != 1)
      raise_error(dmx::Code::kInvalidArgument, std::string(what) + ": DLPack version " +
                                                   std::to_string(m->version.major) + "." +
                                                   std::to_string(m->version.minor) + " is not supported (1.x is)");
    t = &m->dl_tensor;
    flags = m->flags;
  } else if (PyCapsule_IsValid(cap, "dltensor")) {
    auto* m = static_cast<dlpack::DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
    PyCapsule_SetName(cap, "used_dltensor");
    managed_ = m;
    t = &m->dl_tensor;
  } else {
    raise_error(dmx::Code::kInvalidArgument,
                std::string(what) + ": " + type_name(obj) + ".__dlpack__() returned no DLPack capsule");
  }
  if (writable && (flags & dlpack::kFlagReadOnly))
    raise_error(dmx::Code::kInvalidArgument, std::string(what) + ": " + type_name(obj) +
                                                 " is read-only (DLPack), and dmx writes into it");

  dmx::MemSpec where;
  switch (t->device.device_type) {
    case dlpack::kDLCPU: where = {dmx::MemKind::kHost, 0}; break;
    case dlpack::kDLCUDAHost: where = {dmx::MemKind::kPinned, 0}; break;
    case dlpack::kDLCUDA: where = {dmx::MemKind::kCuda, t->device.device_id}; break;
    default:
      raise_error(dmx::Code::kInvalidArgument,
                  std::string(what) + ": DLPack device type " + std::to_string(t->device.device_type) + " (" +
                      device_name(t->device.device_type) + ") is not supported: host, pinned host and CUDA are");
  }
  if (!plain_data_code(t->dtype.code))
    raise_error(dmx::Code::kInvalidArgument,
                std::string(what) + ": " + type_name(obj) + " of DLPack dtype code " + std::to_string(t->dtype.code) +
                    (t->dtype.code == dlpack::kDLOpaqueHandle ? " (opaque handle)" : " (unknown)") +
                    " is not plain data: dmx moves bytes, and these items are pointers or unknown");
  unsigned bits = unsigned{t->dtype.bits} * t->dtype.lanes;
  if (bits == 0 || bits % 8 != 0)
    raise_error(dmx::Code::kInvalidArgument,
                std::string(what) + ": elements of " + std::to_string(bits) + " bits are not whole bytes");
  if (t->ndim < 0 || (t->ndim > 0 && t->shape == nullptr))
    raise_error(dmx::Code::kInvalidArgument, std::string(what) + ": malformed DLPack tensor (ndim/shape)");
  uint64_t count = 1;
  for (int32_t i = 0; i < t->ndim; ++i) {
    if (t->shape[i] < 0) raise_error(dmx::Code::kInvalidArgument, std::string(what) + ": negative DLPack shape");
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(t->shape[i]), &count))
      raise_error(dmx::Code::kInvalidArgument, std::string(what) + ": DLPack tensor size overflows");
  }
  uint64_t nbytes;
  if (__builtin_mul_overflow(count, uint64_t{bits / 8}, &nbytes))
    raise_error(dmx::Code::kInvalidArgument, std::string(what) + ": DLPack tensor size overflows");
  // Row-major and compact; dimensions of extent 1 may carry any stride, and nothing matters when
  // the tensor is empty.
  if (t->strides != nullptr && nbytes > 0) {
    int64_t expected = 1;
    for (int32_t i = t->ndim - 1; i >= 0; --i) {
      if (t->shape[i] != 1 && t->strides[i] != expected)
        raise_error(dmx::Code::kInvalidArgument,
                    std::string(what) + ": " + type_name(obj) +
                        " is not contiguous (strides): dmx moves one contiguous range; "
                        "copy it first (e.g. tensor.contiguous())");
      expected *= t->shape[i];
    }
  }
  region_ = dmx::MemRegion{static_cast<char*>(t->data) + t->byte_offset, static_cast<size_t>(nbytes), where};
}

BufferRef::~BufferRef() {
  if (has_view_) PyBuffer_Release(&view_);
  if (managed_ != nullptr) {
    if (versioned_) {
      auto* m = static_cast<dlpack::DLManagedTensorVersioned*>(managed_);
      if (m->deleter) m->deleter(m);
    } else {
      auto* m = static_cast<dlpack::DLManagedTensor*>(managed_);
      if (m->deleter) m->deleter(m);
    }
  }
}

}  // namespace dmxpy
