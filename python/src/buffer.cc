#include "buffer.h"

#include <string>
#include <string_view>

#include "dlpack.h"
#include "errors.h"
#include "profile.h"

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


// PyTorch's names, looked up in sys.modules at each call (a dict lookup): torch is never imported
// here (a program holding tensors has imported it), and a module replaced in sys.modules (tests)
// is followed. Borrowed references, valid with the GIL held.
struct TorchNames {
  PyObject* module = nullptr;
  PyObject* tensor_type = nullptr;  // torch.Tensor
  PyObject* strided = nullptr;      // torch.strided
};

const TorchNames* torch_names() {
  static TorchNames cached;  // strong references, kept for the process's life
  PyObject* module = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed; no error set
  if (module == nullptr) return nullptr;
  if (module != cached.module) {
    // Half-imported (its import still running) or not PyTorch: not cached, looked up again later.
    PyObject* type = PyObject_GetAttrString(module, "Tensor");
    PyObject* strided = PyObject_GetAttrString(module, "strided");
    if (type == nullptr || strided == nullptr || !PyType_Check(type)) {
      PyErr_Clear();
      Py_XDECREF(type);
      Py_XDECREF(strided);
      return nullptr;
    }
    Py_XDECREF(cached.tensor_type);
    Py_XDECREF(cached.strided);
    Py_XDECREF(cached.module);
    Py_INCREF(module);
    cached = TorchNames{module, type, strided};
  }
  return &cached;
}

PyObject* interned(const char* name) { return PyUnicode_InternFromString(name); }  // kept for good

}  // namespace

// A torch.Tensor read through its attributes, all implemented in C by PyTorch (about 10 attribute
// reads, well under a microsecond), where DLPack costs PyTorch's Python-level __dlpack__ (device
// and stream checks, two stream objects), the capsule, and a torch.cuda.device switch around it for
// a tensor off the current device. Same acceptance as DLPack: PyTorch refuses to export a tensor
// that requires grad, has the conjugate or negative bit, or is not strided, and so does this path
// by handing those to DLPack (whose error then says why), as it does tensors off CPU and CUDA, and
// non-contiguous ones (the DLPack path's message names the strides). A CPU tensor is host memory
// (as PyTorch's DLPack says, pinned or not). Returns false, no Python error pending, when the tensor
// goes by DLPack.
bool BufferRef::from_torch(py::handle obj) {
  static PyObject* const kLayout = interned("layout");
  static PyObject* const kRequiresGrad = interned("requires_grad");
  static PyObject* const kIsConj = interned("is_conj");
  static PyObject* const kIsNeg = interned("is_neg");
  static PyObject* const kIsQuantized = interned("is_quantized");
  static PyObject* const kIsCuda = interned("is_cuda");
  static PyObject* const kIsCpu = interned("is_cpu");
  static PyObject* const kGetDevice = interned("get_device");
  static PyObject* const kIsContiguous = interned("is_contiguous");
  static PyObject* const kNbytes = interned("nbytes");
  static PyObject* const kDataPtr = interned("data_ptr");
  const TorchNames* torch = torch_names();
  if (torch == nullptr || Py_TYPE(obj.ptr()) != reinterpret_cast<PyTypeObject*>(torch->tensor_type)) return false;
  PyObject* o = obj.ptr();
  auto get = [o](PyObject* name) { return py::reinterpret_steal<py::object>(PyObject_GetAttr(o, name)); };
  auto call = [o](PyObject* name) {  // no bound-method object
    PyObject* args[] = {o};
    return py::reinterpret_steal<py::object>(
        PyObject_VectorcallMethod(name, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
  };
  auto is = [](const py::object& v, PyObject* want) { return v && v.ptr() == want; };
  bool ok = [&] {
    if (!is(get(kLayout), torch->strided) || !is(get(kRequiresGrad), Py_False) || !is(call(kIsConj), Py_False) ||
        !is(call(kIsNeg), Py_False) || !is(get(kIsQuantized), Py_False) || !is(call(kIsContiguous), Py_True))
      return false;
    dmx::MemSpec where;
    if (is(get(kIsCuda), Py_True)) {
      py::object dev = call(kGetDevice);
      if (!dev || !PyLong_Check(dev.ptr())) return false;
      long d = PyLong_AsLong(dev.ptr());
      if (d < 0 || d > 1 << 16) return false;
      where = {dmx::MemKind::kCuda, static_cast<int>(d)};
    } else if (is(get(kIsCpu), Py_True)) {
      where = {dmx::MemKind::kHost, 0};
    } else {
      return false;
    }
    py::object nbytes = get(kNbytes), ptr = call(kDataPtr);
    if (!nbytes || !ptr || !PyLong_Check(nbytes.ptr()) || !PyLong_Check(ptr.ptr())) return false;
    unsigned long long n = PyLong_AsUnsignedLongLong(nbytes.ptr());
    unsigned long long p = PyLong_AsUnsignedLongLong(ptr.ptr());
    if (PyErr_Occurred()) return false;
    region_ = dmx::MemRegion{reinterpret_cast<void*>(static_cast<uintptr_t>(p)), static_cast<size_t>(n), where};
    return true;
  }();
  if (!ok) {
    PyErr_Clear();
    return false;
  }
  owner_ = py::reinterpret_borrow<py::object>(obj);
  return true;
}

std::unique_ptr<BufferRef> BufferRef::acquire(py::handle obj, bool writable, const char* what,
                                              bool torch_attributes) {
  profile::Timer timer(profile::kAcquire);
  std::unique_ptr<BufferRef> b(new BufferRef());
  // The buffer protocol first where both exist (NumPy): it is cheaper, and it can export
  // read-only arrays, which DLPack before v1 cannot.
  if (PyObject_CheckBuffer(obj.ptr())) {
    if (b->from_buffer(obj, writable, what)) return b;
  } else if (torch_attributes && b->from_torch(obj)) {
    return b;
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
