#include "endpoint.h"

#include <algorithm>

#include "errors.h"
#include "profile.h"

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

}  // namespace

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
