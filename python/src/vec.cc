#include "vec.h"

#include <cstring>
#include <limits>
#include <string_view>

#include "buffer.h"
#include "endpoint.h"
#include "errors.h"
#include "profile.h"

namespace py = pybind11;

namespace dmxpy {
namespace {

std::string type_name(py::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

[[noreturn]] void refuse(std::string message) { raise_error(dmx::Code::kInvalidArgument, std::move(message)); }

bool is_list(py::handle obj) { return PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr()); }

// The item formats NumPy gives these structured dtypes (native byte order; u8 is 'L' on LP64, 'Q'
// where long is 4 bytes).
bool io_entry_format(std::string_view f) {
  return f == "T{I:local:I:remote:L:local_offset:L:remote_offset:L:length:}" ||
         f == "T{I:local:I:remote:Q:local_offset:Q:remote_offset:Q:length:}";
}
bool io_piece_format(std::string_view f) {
  return f == "T{I:region:I:reserved:L:offset:L:length:}" || f == "T{I:region:I:reserved:Q:offset:Q:length:}";
}

// An integer array held for reading in C++: a Python int (where a scalar is allowed), an object with
// the buffer protocol whose items are integers, or a CPU torch tensor (its .numpy()). `cols` 0: one
// dimension (or none, for a scalar); else two, the second of extent `cols`.
class IntArray {
 public:
  IntArray(py::handle obj, std::string what, size_t cols, bool scalar_ok) : what_(std::move(what)), cols_(cols) {
    if (scalar_ok && PyLong_Check(obj.ptr())) {
      int overflow = 0;
      long long v = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
      if (overflow != 0 || v < 0) refuse(what_ + ": " + py::str(obj).cast<std::string>() + " is not a length");
      scalar_ = python_int_ = true;
      value_ = static_cast<uint64_t>(v);
      rows_ = 1;
      return;
    }
    if (cols_ == 0 && is_list(obj)) {  // a list of Python ints: read in C++ too
      py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
      list_.resize(seq.size());
      for (size_t i = 0; i < list_.size(); ++i) {
        PyObject* item = PySequence_Fast_GET_ITEM(obj.ptr(), static_cast<Py_ssize_t>(i));
        int overflow = 0;
        long long v = PyLong_Check(item) ? PyLong_AsLongLongAndOverflow(item, &overflow) : -1;
        if (!PyLong_Check(item) || overflow != 0)
          refuse(what_ + "[" + std::to_string(i) + "]: expected an int, got " + type_name(item));
        if (v < 0) negative(i, 0, v);
        list_[i] = static_cast<uint64_t>(v);
      }
      from_list_ = true;
      rows_ = list_.size();
      return;
    }
    py::handle src = obj;
    if (!PyObject_CheckBuffer(obj.ptr()) && PyObject_HasAttrString(obj.ptr(), "__dlpack__") &&
        PyObject_HasAttrString(obj.ptr(), "numpy")) {
      try {
        owner_ = obj.attr("numpy")();  // a CPU torch tensor: its memory as NumPy; refused off the CPU
      } catch (py::error_already_set& e) {
        refuse(what_ + ": an array of integers in host memory is needed (" + type_name(obj) +
               ".numpy() failed: " + e.what() + ")");
      }
      src = owner_;
    }
    if (!PyObject_CheckBuffer(src.ptr()))
      refuse(what_ + ": expected an array of integers (NumPy, array.array, a CPU tensor, a list of ints)" +
             (scalar_ok ? std::string(" or an int") : std::string()) + ", got " + type_name(obj));
    if (PyObject_GetBuffer(src.ptr(), &view_.v, PyBUF_RECORDS_RO) != 0) {
      py::error_already_set e;
      refuse(what_ + ": " + type_name(obj) + " cannot be read: " + e.what());
    }
    view_.held = true;
    std::string_view f = view_.v.format != nullptr ? view_.v.format : "B";
    char order = f.empty() ? '@' : f[0];
    if (order == '@' || order == '=' || order == '<' || order == '>' || order == '!') f.remove_prefix(1);
    else order = '@';
    if (order == '>' || order == '!')
      refuse(what_ + ": big-endian integers ('" + std::string(view_.v.format) + "') are not read; convert them "
             "(e.g. numpy.asarray(a, dtype=numpy.int64))");
    if (f.size() != 1 || std::string_view("bBhHiIlLqQnN").find(f[0]) == std::string_view::npos ||
        (view_.v.itemsize != 1 && view_.v.itemsize != 2 && view_.v.itemsize != 4 && view_.v.itemsize != 8))
      refuse(what_ + ": expected integers, got items of format '" + std::string(view_.v.format ? view_.v.format : "B") +
             "' (" + type_name(obj) + "); e.g. numpy.asarray(a, dtype=numpy.int64)");
    signed_ = f[0] >= 'a' && f[0] <= 'z';
    bool shape_ok = cols_ == 0 ? view_.v.ndim == 1 || (scalar_ok && view_.v.ndim == 0)
                               : view_.v.ndim == 2 && static_cast<size_t>(view_.v.shape[1]) == cols_;
    if (!shape_ok) {
      std::string shape = "(";
      for (int i = 0; i < view_.v.ndim; ++i) shape += (i ? ", " : "") + std::to_string(view_.v.shape[i]);
      shape += view_.v.ndim == 1 ? ",)" : ")";
      refuse(what_ + ": expected " +
             (cols_ == 0 ? std::string(scalar_ok ? "one dimension (or a single int)" : "one dimension")
                         : "shape (n, " + std::to_string(cols_) + ")") +
             ", got shape " + shape);
    }
    scalar_ = view_.v.ndim == 0;
    rows_ = scalar_ ? 1 : static_cast<size_t>(view_.v.shape[0]);
    row_stride_ = scalar_ ? 0 : view_.v.strides[0];
  }
  IntArray(const IntArray&) = delete;
  IntArray& operator=(const IntArray&) = delete;

  size_t rows() const { return rows_; }
  bool scalar() const { return scalar_; }
  const std::string& what() const { return what_; }

  // f(row, value) for every row of column `col`, in order (a scalar: one row); a negative value is
  // refused, naming it.
  template <typename F>
  void each(size_t col, F f) const {
    if (python_int_) return f(0, value_);
    if (from_list_) {
      for (size_t i = 0; i < rows_; ++i) f(i, list_[i]);
      return;
    }
    switch (view_.v.itemsize * (signed_ ? -1 : 1)) {
      case 1: return loop<uint8_t>(col, f);
      case 2: return loop<uint16_t>(col, f);
      case 4: return loop<uint32_t>(col, f);
      case 8: return loop<uint64_t>(col, f);
      case -1: return loop<int8_t>(col, f);
      case -2: return loop<int16_t>(col, f);
      case -4: return loop<int32_t>(col, f);
      default: return loop<int64_t>(col, f);
    }
  }

 private:
  template <typename T, typename F>
  void loop(size_t col, F& f) const {
    const char* p = static_cast<const char*>(view_.v.buf);
    if (cols_ != 0) p += static_cast<Py_ssize_t>(col) * view_.v.strides[1];
    for (size_t i = 0; i < rows_; ++i, p += row_stride_) {
      T v;
      std::memcpy(&v, p, sizeof v);
      if constexpr (std::numeric_limits<T>::is_signed) {
        if (v < 0) negative(i, col, static_cast<long long>(v));
      }
      f(i, static_cast<uint64_t>(v));
    }
  }
  [[noreturn]] void negative(size_t row, size_t col, long long v) const {
    refuse(what_ + "[" + std::to_string(row) + (cols_ ? ", " + std::to_string(col) : std::string()) +
           "] = " + std::to_string(v) + ": offsets, lengths and indices must not be negative");
  }

  std::string what_;
  size_t cols_;
  py::object owner_;  // .numpy() of a tensor
  // A member, so that the view is released also when the constructor refuses the array.
  struct HeldView {
    Py_buffer v{};
    bool held = false;
    ~HeldView() {
      if (held) PyBuffer_Release(&v);
    }
  } view_;
  bool signed_ = false;
  bool scalar_ = false;      // one value for every block: a Python int or a 0-D array
  bool python_int_ = false;  // `value_` holds it
  bool from_list_ = false;   // a list or tuple of ints: `list_` holds them
  std::vector<uint64_t> list_;
  uint64_t value_ = 0;
  size_t rows_ = 0;
  Py_ssize_t row_stride_ = 0;
};

uint32_t index32(const IntArray& a, size_t row, size_t col, uint64_t v) {
  if (v > std::numeric_limits<uint32_t>::max())
    refuse(a.what() + "[" + std::to_string(row) + ", " + std::to_string(col) + "] = " + std::to_string(v) +
           ": an index of a buffer or remote region (at most 2**32 - 1)");
  return static_cast<uint32_t>(v);
}

// How many entries `buffers` buffers of `blocks` blocks make, refused past dmx's limit.
size_t entry_count(size_t buffers, size_t blocks) {
  size_t n;
  if (__builtin_mul_overflow(buffers, blocks, &n) || n > dmx::kMaxIoEntries)
    refuse("too many entries: " + std::to_string(buffers) + " buffers of " + std::to_string(blocks) +
           " blocks each; one operation takes at most " + std::to_string(dmx::kMaxIoEntries));
  return n;
}

// Opens `obj`'s buffer when it is a structured array of the record `ok_format` names; false when it
// is not structured at all (then it is read as integers). A structured array of another record is
// refused.
bool open_records(py::handle obj, Py_buffer* view, size_t itemsize, bool (*ok_format)(std::string_view),
                  const char* what, const char* dtype) {
  if (!PyObject_CheckBuffer(obj.ptr())) return false;
  if (PyObject_GetBuffer(obj.ptr(), view, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    return false;
  }
  std::string_view f = view->format != nullptr ? view->format : "B";
  if (f.rfind("T{", 0) != 0) {
    PyBuffer_Release(view);
    return false;
  }
  if (!ok_format(f) || static_cast<size_t>(view->itemsize) != itemsize || view->ndim != 1) {
    std::string got(f);
    int ndim = view->ndim;
    PyBuffer_Release(view);
    refuse(std::string(what) + ": a structured array must be one-dimensional, of dtype dmx." + dtype + "; got " +
           std::to_string(ndim) + " dimensions of format '" + got + "'");
  }
  return true;
}

// Records of `view` (one dimension), copied: the post runs without the GIL, and another Python
// thread could change the array while dmx checks and reads the list (a copy of 100,000 entries is
// about 0.3 ms).
template <typename T>
void copy_records(const Py_buffer& view, std::vector<T>& out) {
  size_t n = static_cast<size_t>(view.shape[0]);
  if (n > dmx::kMaxIoEntries)
    refuse(std::to_string(n) + " entries are too many (at most " + std::to_string(dmx::kMaxIoEntries) + ")");
  out.resize(n);
  const char* p = static_cast<const char*>(view.buf);
  if (view.strides[0] == static_cast<Py_ssize_t>(sizeof(T))) {
    std::memcpy(static_cast<void*>(out.data()), p, n * sizeof(T));
    return;
  }
  for (size_t i = 0; i < n; ++i)
    std::memcpy(static_cast<void*>(&out[i]), p + static_cast<Py_ssize_t>(i) * view.strides[0], sizeof(T));
}

// A held buffer view, released at the end of the scope.
struct ViewGuard {
  Py_buffer* view;
  ~ViewGuard() { PyBuffer_Release(view); }
};

}  // namespace

Buffers acquire_buffers(py::handle obj, bool writable, const char* what) {
  Buffers b;
  if (is_list(obj)) {
    py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
    size_t n = seq.size();
    if (n > dmx::kMaxIoEntries) refuse(std::string(what) + ": " + std::to_string(n) + " buffers are too many");
    b.keep.reserve(n);
    b.regions.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      std::string name = std::string(what) + "[" + std::to_string(i) + "]";
      b.keep.push_back(BufferRef::acquire(seq[i], writable, name.c_str()));
      b.regions.push_back(b.keep.back()->region());
    }
  } else {
    b.keep.push_back(BufferRef::acquire(obj, writable, what));
    b.regions.push_back(b.keep.back()->region());
  }
  return b;
}

std::vector<dmx::RemoteRegion> remote_regions(py::handle obj, const char* what) {
  std::vector<dmx::RemoteRegion> out;
  if (is_list(obj)) {
    py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
    out.reserve(seq.size());
    for (size_t i = 0; i < seq.size(); ++i) out.push_back(remote_region(seq[i]));
  } else {
    out.push_back(remote_region(obj));
  }
  (void)what;
  return out;
}

void EntryList::from_entries(EntryList& out, py::handle entries) {
  profile::Timer timer(profile::kList);
  Py_buffer view;
  if (open_records(entries, &view, sizeof(dmx::IoEntry), io_entry_format, "entries", "IO_ENTRY")) {
    ViewGuard guard{&view};
    copy_records(view, out.owned_);
    out.span_ = out.owned_;
    return;
  }
  IntArray a(entries, "entries", 5, false);
  if (a.rows() > dmx::kMaxIoEntries)
    refuse("entries: " + std::to_string(a.rows()) + " are too many (at most " + std::to_string(dmx::kMaxIoEntries) +
           ")");
  out.owned_.resize(a.rows());
  auto& e = out.owned_;
  a.each(0, [&](size_t i, uint64_t v) { e[i].local = index32(a, i, 0, v); });
  a.each(1, [&](size_t i, uint64_t v) { e[i].remote = index32(a, i, 1, v); });
  a.each(2, [&](size_t i, uint64_t v) { e[i].local_offset = v; });
  a.each(3, [&](size_t i, uint64_t v) { e[i].remote_offset = v; });
  a.each(4, [&](size_t i, uint64_t v) { e[i].length = v; });
  out.span_ = out.owned_;
}

void EntryList::from_blocks(EntryList& out, size_t locals, size_t remotes, py::handle local_offsets,
                            py::handle remote_offsets, py::handle lengths) {
  profile::Timer timer(profile::kList);
  if (remotes != 1 && remotes != locals)
    refuse("remote: " + std::to_string(remotes) + " regions for " + std::to_string(locals) +
           " buffers; give one region, or one per buffer");
  IntArray lo(local_offsets, "local_offsets", 0, false);
  IntArray ro(remote_offsets, "remote_offsets", 0, false);
  IntArray len(lengths, "lengths", 0, true);
  size_t n = lo.rows();
  if (ro.rows() != n || (!len.scalar() && len.rows() != n))
    refuse("local_offsets, remote_offsets and lengths must have one value per block (or lengths one for all); got " +
           std::to_string(n) + ", " + std::to_string(ro.rows()) + " and " +
           (len.scalar() ? std::string("one") : std::to_string(len.rows())));
  size_t total = entry_count(locals, n);
  out.owned_.resize(total);
  auto& e = out.owned_;
  lo.each(0, [&](size_t j, uint64_t v) { e[j].local_offset = v; });
  ro.each(0, [&](size_t j, uint64_t v) { e[j].remote_offset = v; });
  if (len.scalar()) {
    len.each(0, [&](size_t, uint64_t v) {
      for (size_t j = 0; j < n; ++j) e[j].length = v;
    });
  } else {
    len.each(0, [&](size_t j, uint64_t v) { e[j].length = v; });
  }
  for (size_t i = 1; i < locals; ++i) {
    dmx::IoEntry* row = e.data() + i * n;
    std::memcpy(static_cast<void*>(row), e.data(), n * sizeof(dmx::IoEntry));
    for (size_t j = 0; j < n; ++j) {
      row[j].local = static_cast<uint32_t>(i);
      row[j].remote = remotes == 1 ? 0 : static_cast<uint32_t>(i);
    }
  }
  out.span_ = out.owned_;
}

void PieceList::from_pieces(PieceList& out, py::handle pieces) {
  profile::Timer timer(profile::kList);
  Py_buffer view;
  if (open_records(pieces, &view, sizeof(dmx::IoPiece), io_piece_format, "pieces", "IO_PIECE")) {
    ViewGuard guard{&view};
    copy_records(view, out.owned_);
    out.span_ = out.owned_;
    return;
  }
  IntArray a(pieces, "pieces", 3, false);
  if (a.rows() > dmx::kMaxIoEntries)
    refuse("pieces: " + std::to_string(a.rows()) + " are too many (at most " + std::to_string(dmx::kMaxIoEntries) +
           ")");
  out.owned_.resize(a.rows());
  auto& p = out.owned_;
  a.each(0, [&](size_t i, uint64_t v) { p[i].region = index32(a, i, 0, v); });
  a.each(1, [&](size_t i, uint64_t v) { p[i].offset = v; });
  a.each(2, [&](size_t i, uint64_t v) { p[i].length = v; });
  out.span_ = out.owned_;
}

void PieceList::from_blocks(PieceList& out, size_t locals, py::handle offsets, py::handle lengths) {
  profile::Timer timer(profile::kList);
  IntArray off(offsets, "offsets", 0, false);
  IntArray len(lengths, "lengths", 0, true);
  size_t n = off.rows();
  if (!len.scalar() && len.rows() != n)
    refuse("offsets and lengths must have one value per block (or lengths one for all); got " + std::to_string(n) +
           " and " + std::to_string(len.rows()));
  size_t total = entry_count(locals, n);
  out.owned_.resize(total);
  auto& p = out.owned_;
  off.each(0, [&](size_t j, uint64_t v) { p[j].offset = v; });
  if (len.scalar()) {
    len.each(0, [&](size_t, uint64_t v) {
      for (size_t j = 0; j < n; ++j) p[j].length = v;
    });
  } else {
    len.each(0, [&](size_t j, uint64_t v) { p[j].length = v; });
  }
  for (size_t i = 1; i < locals; ++i) {
    dmx::IoPiece* row = p.data() + i * n;
    std::memcpy(static_cast<void*>(row), p.data(), n * sizeof(dmx::IoPiece));
    for (size_t j = 0; j < n; ++j) row[j].region = static_cast<uint32_t>(i);
  }
  out.span_ = out.owned_;
}

}  // namespace dmxpy
