#include "endpoint.h"

#include <algorithm>
#include <vector>

#include "errors.h"
#include "profile.h"
#include "vec.h"

namespace py = pybind11;

namespace dmxpy {

EndpointState::~EndpointState() {
  {
    py::gil_scoped_release nogil;
    (void)ep.close();
  }
  // After close nothing touches the buffers (unless close reported otherwise: then leak them, as
  // freeing memory dmx may still write would be worse).
  bool all_done = std::all_of(orphans_.begin(), orphans_.end(), [](auto& o) { return o.first.test(); });
  if (!all_done)
    for (auto& o : orphans_)
      for (auto& b : o.second) (void)b.release();  // NOLINT: a deliberate leak, see above
  orphans_.clear();
}

void EndpointState::adopt(dmx::Request req, Keep keep) { orphans_.emplace_back(std::move(req), std::move(keep)); }

void EndpointState::sweep() {
  std::erase_if(orphans_, [](auto& o) { return o.first.test(); });
}

void EndpointState::close() {
  dmx::Status st;
  {
    py::gil_scoped_release nogil;
    st = ep.close();
  }
  sweep();
  check(st);
}

dmx::RemoteRegion remote_region(py::handle obj) {
  if (py::isinstance<dmx::RemoteRegion>(obj)) return obj.cast<dmx::RemoteRegion>();
  if (!PyObject_CheckBuffer(obj.ptr()))
    raise_error(dmx::Code::kInvalidArgument,
                std::string("remote: expected the bytes of Registration.descriptor() or a RemoteRegion, got ") +
                    Py_TYPE(obj.ptr())->tp_name);
  // C-contiguous bytes only: a strided view's length is not the span that follows its pointer.
  Py_buffer view;
  if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
    PyErr_Clear();
    raise_error(dmx::Code::kInvalidArgument, std::string("remote: a descriptor must be contiguous bytes (") +
                                                 Py_TYPE(obj.ptr())->tp_name + " is not)");
  }
  auto r = dmx::RemoteRegion::parse(static_cast<const unsigned char*>(view.buf), static_cast<size_t>(view.len));
  PyBuffer_Release(&view);
  return unwrap(std::move(r));
}

namespace {

dmx::OpOptions options(std::optional<double> timeout, const std::shared_ptr<Watch>& w) {
  dmx::OpOptions o;
  o.timeout = to_duration(timeout, "timeout");
  o.on_complete = [w](const dmx::Status&, size_t) { w->fire(); };
  return o;
}

template <typename Post>
std::unique_ptr<Future> post(const std::shared_ptr<EndpointState>& s, py::handle obj, bool writable, const char* what,
                             std::optional<double> timeout, Post do_post) {
  if (!s->orphans_.empty()) s->sweep();
  Keep keep;
  keep.push_back(BufferRef::acquire(obj, writable, what));
  dmx::MemRegion region = keep.back()->region();
  std::shared_ptr<Watch> w;
  dmx::OpOptions o;
  {
    profile::Timer timer(profile::kFuture);
    w = std::make_shared<Watch>();
    o = options(timeout, w);
  }
  dmx::Request req;
  {
    profile::Timer timer(profile::kPost);
    py::gil_scoped_release nogil;
    req = do_post(region, std::move(o));
  }
  profile::Timer timer(profile::kFuture, false);
  return std::make_unique<Future>(std::move(req), std::move(w), std::move(keep), s);
}

// A vectored operation: its buffers are held (Keep) until it completes, like a single one's.
template <typename Post>
std::unique_ptr<Future> post_list(const std::shared_ptr<EndpointState>& s, Buffers&& b, std::optional<double> timeout,
                                  Post do_post) {
  if (!s->orphans_.empty()) s->sweep();
  std::shared_ptr<Watch> w;
  dmx::OpOptions o;
  {
    profile::Timer timer(profile::kFuture);
    w = std::make_shared<Watch>();
    o = options(timeout, w);
  }
  dmx::Request req;
  {
    profile::Timer timer(profile::kPost);
    py::gil_scoped_release nogil;
    req = do_post(std::span<const dmx::MemRegion>(b.regions), std::move(o));
  }
  profile::Timer timer(profile::kFuture, false);
  return std::make_unique<Future>(std::move(req), std::move(w), std::move(b.keep), s);
}

void set_notify(dmx::OpOptions& o, std::optional<uint64_t> notify) {
  if (notify) {
    o.notify = true;
    o.notify_value = *notify;
  }
}

// One vectored write or read of a built list; only a write can ask for a notification.
std::unique_ptr<Future> post_entries(const std::shared_ptr<EndpointState>& s, Buffers b,
                                     const std::vector<dmx::RemoteRegion>& r, const EntryList& list, bool write,
                                     std::optional<uint64_t> notify, std::optional<double> timeout) {
  return post_list(s, std::move(b), timeout, [&](std::span<const dmx::MemRegion> l, dmx::OpOptions o) {
    if (!write) return s->ep.read_vec(l, r, list.span(), std::move(o));
    set_notify(o, notify);
    return s->ep.write_vec(l, r, list.span(), std::move(o));
  });
}

}  // namespace

std::unique_ptr<Future> post_write_vec(const std::shared_ptr<EndpointState>& s, py::handle local, py::handle remote,
                                       py::handle entries, std::optional<uint64_t> notify,
                                       std::optional<double> timeout) {
  Buffers b = acquire_buffers(local, false, "write_vec local");
  EntryList list;
  EntryList::from_entries(list, entries);
  return post_entries(s, std::move(b), remote_regions(remote, "remote"), list, true, notify, timeout);
}

std::unique_ptr<Future> post_read_vec(const std::shared_ptr<EndpointState>& s, py::handle local, py::handle remote,
                                      py::handle entries, std::optional<double> timeout) {
  Buffers b = acquire_buffers(local, true, "read_vec local");
  EntryList list;
  EntryList::from_entries(list, entries);
  return post_entries(s, std::move(b), remote_regions(remote, "remote"), list, false, std::nullopt, timeout);
}

std::unique_ptr<Future> post_write_blocks(const std::shared_ptr<EndpointState>& s, py::handle local,
                                          py::handle remote, py::handle local_offsets, py::handle remote_offsets,
                                          py::handle lengths, std::optional<uint64_t> notify,
                                          std::optional<double> timeout) {
  Buffers b = acquire_buffers(local, false, "write_blocks local");
  std::vector<dmx::RemoteRegion> r = remote_regions(remote, "remote");
  EntryList list;
  EntryList::from_blocks(list, b.regions.size(), r.size(), local_offsets, remote_offsets, lengths);
  return post_entries(s, std::move(b), r, list, true, notify, timeout);
}

std::unique_ptr<Future> post_read_blocks(const std::shared_ptr<EndpointState>& s, py::handle local,
                                         py::handle remote, py::handle local_offsets, py::handle remote_offsets,
                                         py::handle lengths, std::optional<double> timeout) {
  Buffers b = acquire_buffers(local, true, "read_blocks local");
  std::vector<dmx::RemoteRegion> r = remote_regions(remote, "remote");
  EntryList list;
  EntryList::from_blocks(list, b.regions.size(), r.size(), local_offsets, remote_offsets, lengths);
  return post_entries(s, std::move(b), r, list, false, std::nullopt, timeout);
}

std::unique_ptr<Future> post_send_vec(const std::shared_ptr<EndpointState>& s, py::handle local, py::handle pieces,
                                      uint64_t tag, std::optional<double> timeout) {
  Buffers b = acquire_buffers(local, false, "send_vec local");
  PieceList list;
  PieceList::from_pieces(list, pieces);
  return post_list(s, std::move(b), timeout, [&](std::span<const dmx::MemRegion> l, dmx::OpOptions o) {
    return s->ep.send_vec(l, list.span(), tag, std::move(o));
  });
}

std::unique_ptr<Future> post_recv_vec(const std::shared_ptr<EndpointState>& s, py::handle local, py::handle pieces,
                                      uint64_t tag, std::optional<double> timeout) {
  Buffers b = acquire_buffers(local, true, "recv_vec local");
  PieceList list;
  PieceList::from_pieces(list, pieces);
  return post_list(s, std::move(b), timeout, [&](std::span<const dmx::MemRegion> l, dmx::OpOptions o) {
    return s->ep.recv_vec(l, list.span(), tag, std::move(o));
  });
}

std::unique_ptr<Future> post_send_blocks(const std::shared_ptr<EndpointState>& s, py::handle local,
                                         py::handle offsets, py::handle lengths, uint64_t tag,
                                         std::optional<double> timeout) {
  Buffers b = acquire_buffers(local, false, "send_blocks local");
  PieceList list;
  PieceList::from_blocks(list, b.regions.size(), offsets, lengths);
  return post_list(s, std::move(b), timeout, [&](std::span<const dmx::MemRegion> l, dmx::OpOptions o) {
    return s->ep.send_vec(l, list.span(), tag, std::move(o));
  });
}

std::unique_ptr<Future> post_recv_blocks(const std::shared_ptr<EndpointState>& s, py::handle local,
                                         py::handle offsets, py::handle lengths, uint64_t tag,
                                         std::optional<double> timeout) {
  Buffers b = acquire_buffers(local, true, "recv_blocks local");
  PieceList list;
  PieceList::from_blocks(list, b.regions.size(), offsets, lengths);
  return post_list(s, std::move(b), timeout, [&](std::span<const dmx::MemRegion> l, dmx::OpOptions o) {
    return s->ep.recv_vec(l, list.span(), tag, std::move(o));
  });
}

std::unique_ptr<Future> post_send(const std::shared_ptr<EndpointState>& s, py::handle obj, uint64_t tag,
                                  std::optional<double> timeout) {
  return post(s, obj, false, "send", timeout,
              [&](const dmx::MemRegion& r, dmx::OpOptions o) { return s->ep.send(r, tag, std::move(o)); });
}

std::unique_ptr<Future> post_recv(const std::shared_ptr<EndpointState>& s, py::handle obj, uint64_t tag,
                                  std::optional<double> timeout) {
  return post(s, obj, true, "recv", timeout,
              [&](const dmx::MemRegion& r, dmx::OpOptions o) { return s->ep.recv(r, tag, std::move(o)); });
}

std::unique_ptr<Future> post_write(const std::shared_ptr<EndpointState>& s, py::handle obj,
                                   const dmx::RemoteRegion& remote, uint64_t offset, std::optional<uint64_t> notify,
                                   std::optional<double> timeout) {
  return post(s, obj, false, "write", timeout, [&](const dmx::MemRegion& r, dmx::OpOptions o) {
    if (notify) {
      o.notify = true;
      o.notify_value = *notify;
    }
    return s->ep.write(r, remote, offset, std::move(o));
  });
}

std::unique_ptr<Future> post_read(const std::shared_ptr<EndpointState>& s, py::handle obj,
                                  const dmx::RemoteRegion& remote, uint64_t offset, std::optional<double> timeout) {
  return post(s, obj, true, "read", timeout, [&](const dmx::MemRegion& r, dmx::OpOptions o) {
    return s->ep.read(r, remote, offset, std::move(o));
  });
}

}  // namespace dmxpy
