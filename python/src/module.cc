// python/src/module.cc — the extension dmx._dmx: bindings of include/dmx for the package dmx.
// The package (python/dmx/__init__.py) re-exports these names with the error classes and the
// asyncio glue; python/dmx/__init__.pyi documents the surface.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "buffer.h"
#include "dmx/dmx.h"
#include "endpoint.h"
#include "errors.h"
#include "future.h"
#include "log.h"
#include "profile.h"
#include "store.h"
#include "vec.h"

namespace py = pybind11;
using dmxpy::EndpointState;
using dmxpy::Future;

namespace {

// Each wrapper drops its dmx handle with the GIL released: the last handle of a context, listener
// or registration joins threads or waits for transfers, and those may need nothing from Python,
// but a waiting thread must never hold the GIL.
struct ContextW {
  dmx::Context ctx;
  ~ContextW() {
    py::gil_scoped_release nogil;
    ctx = dmx::Context();
  }
};

struct ListenerW {
  dmx::Listener lis;
  ~ListenerW() { close(); }
  void close() {
    py::gil_scoped_release nogil;
    lis.close();
  }
};

struct RegistrationW {
  dmx::Registration reg;
  std::unique_ptr<dmxpy::BufferRef> buf;
  dmx::RemoteRegion remote;
  ~RegistrationW() {
    if (buf) (void)finish();
  }
  dmx::Status finish() {
    dmx::Status st;
    {
      py::gil_scoped_release nogil;
      st = reg.deregister();
    }
    // dmx could not make sure that no transfer uses the memory: keep the object alive for good.
    if (st.ok()) buf.reset();
    else (void)buf.release();  // NOLINT: deliberate leak
    return st;
  }
  void deregister() {
    if (buf) dmxpy::check(finish());
  }
};

std::string setting_text(py::handle v) {
  if (PyBool_Check(v.ptr())) return v.ptr() == Py_True ? "true" : "false";
  return py::str(v);
}

dmx::RemoteRegion to_remote(py::handle obj) { return dmxpy::remote_region(obj); }

py::bytes to_bytes(const std::vector<unsigned char>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

py::dict stats_dict(const dmx::EndpointStats& s) {
  py::dict d;
  d["transport"] = s.transport;
  d["reason"] = s.reason;
  d["control_stream"] = s.control_stream;
  d["peer"] = s.peer;
  d["streams"] = s.streams;
  d["bytes_sent"] = s.bytes_sent;
  d["bytes_received"] = s.bytes_received;
  d["messages_sent"] = s.messages_sent;
  d["messages_received"] = s.messages_received;
  d["writes"] = s.writes;
  d["reads"] = s.reads;
  d["d2h_copies"] = s.d2h_copies;
  d["h2d_copies"] = s.h2d_copies;
  d["staging_lists"] = s.staging_lists;
  d["host_copies"] = s.host_copies;
  return d;
}

}  // namespace

PYBIND11_MODULE(_dmx, m) {
  m.doc() = "dmx extension: bindings of the C++ API (include/dmx). Import the package dmx instead.";
  m.attr("ANY_TAG") = py::int_(dmx::kAnyTag);
  m.def("build_info", [] {
    const auto& b = dmx::build_info();
    py::dict d;
    d["version"] = b.version;
    d["git_revision"] = b.git_revision;
    d["options"] = b.options;
    return d;
  });

  // Internal: per-stage timing (profile.h) and the buffer path, for bench/python_overhead.py
  // --profile and the tests.
  m.def(
      "_profile",
      [](bool on) {
        for (auto& c : dmxpy::profile::counters) c = {};
        dmxpy::profile::enabled = on;
      },
      py::arg("on"));
  m.def("_profile_take", [] {
    py::dict d;
    for (int i = 0; i < dmxpy::profile::kStages; ++i) {
      const auto& c = dmxpy::profile::counters[i];
      d[dmxpy::profile::kStageNames[i]] = py::make_tuple(c.calls, static_cast<double>(c.ns) * 1e-9);
    }
    for (auto& c : dmxpy::profile::counters) c = {};
    return d;
  });
  m.def(
      "_region_of",
      [](py::handle obj, bool writable, bool torch_attributes) {
        auto b = dmxpy::BufferRef::acquire(obj, writable, "_region_of", torch_attributes);
        const dmx::MemRegion& r = b->region();
        return py::make_tuple(reinterpret_cast<uintptr_t>(r.ptr), r.size, dmx::to_string(r.where));
      },
      py::arg("obj"), py::arg("writable") = false, py::arg("torch_attributes") = true,
      "(pointer, size, memory) of what an operation on `obj` would use.");
  m.def(
      "_time_acquire",
      [](py::handle obj, bool writable, uint32_t n, bool torch_attributes) {
        auto t0 = std::chrono::steady_clock::now();
        for (uint32_t i = 0; i < n; ++i) (void)dmxpy::BufferRef::acquire(obj, writable, "_time_acquire", torch_attributes);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / std::max(n, 1u);
      },
      py::arg("obj"), py::arg("writable"), py::arg("n"), py::arg("torch_attributes") = true,
      "Seconds per acquire and release of `obj`'s memory (the first stage of every operation).");

  m.def(
      "_blocks_entries",
      [](size_t locals, size_t remotes, py::handle lo, py::handle ro, py::handle lengths) {
        dmxpy::EntryList list;
        dmxpy::EntryList::from_blocks(list, locals, remotes, lo, ro, lengths);
        auto s = list.span();
        return py::bytes(reinterpret_cast<const char*>(s.data()), s.size_bytes());
      },
      "The entries write_blocks would post, as bytes (view them as dmx.IO_ENTRY).");
  m.def(
      "_entries",
      [](py::handle entries) {
        dmxpy::EntryList list;
        dmxpy::EntryList::from_entries(list, entries);
        auto s = list.span();
        return py::bytes(reinterpret_cast<const char*>(s.data()), s.size_bytes());
      },
      "The entries write_vec would post, as bytes.");

  m.def("_log_start", &dmxpy::log_start, py::arg("after_fork"));
  m.def("_log_take", &dmxpy::log_take, py::arg("timeout"));
  m.def("_log_stop", &dmxpy::log_stop);

  py::class_<dmx::RemoteRegion>(m, "RemoteRegion", "A region the peer registered (from its descriptor bytes).")
      .def_static(
          "from_descriptor",
          [](py::handle b) { return to_remote(b); }, py::arg("descriptor"),
          "Parses Registration.descriptor() bytes; raises InvalidArgumentError when malformed.")
      .def_readonly("key", &dmx::RemoteRegion::key)
      .def_readonly("size", &dmx::RemoteRegion::size)
      .def("descriptor", [](const dmx::RemoteRegion& r) { return to_bytes(r.serialize()); })
      .def("__repr__", [](const dmx::RemoteRegion& r) {
        return "RemoteRegion(key=" + std::to_string(r.key) + ", size=" + std::to_string(r.size) + ")";
      });

  py::class_<dmx::Notification>(m, "Notification", "A notifying write the peer made into our memory.")
      .def_readonly("value", &dmx::Notification::value)
      .def_readonly("key", &dmx::Notification::key)
      .def_readonly("length", &dmx::Notification::length)
      .def("__repr__", [](const dmx::Notification& n) {
        return "Notification(value=" + std::to_string(n.value) + ", key=" + std::to_string(n.key) +
               ", length=" + std::to_string(n.length) + ")";
      });

  py::class_<dmxpy::Waker, std::shared_ptr<dmxpy::Waker>>(m, "_Waker")
      .def(py::init<>())
      .def("fileno", &dmxpy::Waker::fileno)
      .def("drain", &dmxpy::Waker::drain);

  py::class_<Future>(m, "Future", "An operation in flight. Awaitable in asyncio.")
      .def("wait", &Future::wait, py::arg("timeout") = py::none(),
           "Waits for completion (GIL released) and returns the bytes moved (a recv: the message size).\n"
           "Raises the operation's dmx.Error, or dmx.TimeoutError when `timeout` seconds pass first\n"
           "(the operation then continues).")
      .def("result", &Future::wait, py::arg("timeout") = py::none(), "Same as wait().")
      .def("done", &Future::done, "True once the operation has completed (successfully or not).")
      .def("cancel", &Future::cancel,
           "Asks for completion with CancelledError; no effect after completion (data already on its\n"
           "way may still complete the operation successfully).")
      .def_property_readonly("tag", &Future::tag, "recv: the tag of the matched message.")
      .def_property_readonly("failed_entry", &Future::failed_entry,
                             "A vectored operation refused for a bad entry: that entry's index; else -1.")
      .def_property_readonly("crc32c", &Future::crc32c,
                             "The CRC32C of the bytes moved, when the endpoint checksums (checksum='crc32c' on\n"
                             "either side); else 0.")
      .def("_watch", &Future::watch);

  py::class_<EndpointState, std::shared_ptr<EndpointState>>(m, "Endpoint", "A connection to one peer.")
      .def("send", &dmxpy::post_send, py::arg("buf"), py::arg("tag") = 0, py::kw_only(),
           py::arg("timeout") = py::none(), "Sends the bytes of `buf` to the peer's recv with `tag`.")
      .def("recv", &dmxpy::post_recv, py::arg("buf"), py::arg("tag") = 0, py::kw_only(),
           py::arg("timeout") = py::none(),
           "Receives the next message with `tag` (ANY_TAG: any) into `buf`; wait() returns its size.")
      .def(
          "write",
          [](const std::shared_ptr<EndpointState>& s, py::handle buf, py::handle remote, uint64_t offset,
             std::optional<uint64_t> notify, std::optional<double> timeout) {
            return dmxpy::post_write(s, buf, to_remote(remote), offset, notify, timeout);
          },
          py::arg("buf"), py::arg("remote"), py::arg("offset") = 0, py::kw_only(), py::arg("notify") = py::none(),
          py::arg("timeout") = py::none(),
          "Writes `buf` into the peer's registered region at `offset`; completes once landed.\n"
          "notify=VALUE: the peer's next_notification() then returns VALUE.")
      .def(
          "read",
          [](const std::shared_ptr<EndpointState>& s, py::handle buf, py::handle remote, uint64_t offset,
             std::optional<double> timeout) { return dmxpy::post_read(s, buf, to_remote(remote), offset, timeout); },
          py::arg("buf"), py::arg("remote"), py::arg("offset") = 0, py::kw_only(), py::arg("timeout") = py::none(),
          "Reads len(buf) bytes from the peer's registered region at `offset` into `buf`.")
      .def("write_vec", &dmxpy::post_write_vec, py::arg("local"), py::arg("remote"), py::arg("entries"),
           py::kw_only(), py::arg("notify") = py::none(), py::arg("timeout") = py::none(),
           "Writes a list of ranges as one operation (one completion, one notification once all landed).\n"
           "local: a buffer or a list of buffers; remote: a descriptor or a list; entries: a NumPy array\n"
           "of dtype dmx.IO_ENTRY, or integers of shape (n, 5): local index, remote index, local offset,\n"
           "remote offset, length. A bad entry fails the whole list before a byte moves; its error says\n"
           "'entry <i>:' and Future.failed_entry is i.")
      .def("read_vec", &dmxpy::post_read_vec, py::arg("local"), py::arg("remote"), py::arg("entries"), py::kw_only(),
           py::arg("timeout") = py::none(), "The read of write_vec's list: remote ranges into local ones.")
      .def("write_blocks", &dmxpy::post_write_blocks, py::arg("local"), py::arg("remote"), py::arg("local_offsets"),
           py::arg("remote_offsets"), py::arg("lengths"), py::kw_only(), py::arg("notify") = py::none(),
           py::arg("timeout") = py::none(),
           "write_vec of blocks: for each buffer i of `local` (one or a list) and remote region i (or the\n"
           "only one), every block j: local_offsets[j] -> remote_offsets[j], lengths[j] bytes (or one length\n"
           "for all). Offsets and lengths: integer arrays (NumPy, array.array, a CPU tensor), read in C++.")
      .def("read_blocks", &dmxpy::post_read_blocks, py::arg("local"), py::arg("remote"), py::arg("local_offsets"),
           py::arg("remote_offsets"), py::arg("lengths"), py::kw_only(), py::arg("timeout") = py::none(),
           "read_vec of blocks (as write_blocks): remote_offsets[j] -> local_offsets[j].")
      .def("send_vec", &dmxpy::post_send_vec, py::arg("local"), py::arg("pieces"), py::arg("tag") = 0, py::kw_only(),
           py::arg("timeout") = py::none(),
           "Sends one message gathered from pieces: a NumPy array of dtype dmx.IO_PIECE, or integers of\n"
           "shape (n, 3): buffer index, offset, length. Matches any recv of the tag.")
      .def("recv_vec", &dmxpy::post_recv_vec, py::arg("local"), py::arg("pieces"), py::arg("tag") = 0, py::kw_only(),
           py::arg("timeout") = py::none(), "Receives one message scattered over pieces (as send_vec).")
      .def("send_blocks", &dmxpy::post_send_blocks, py::arg("local"), py::arg("offsets"), py::arg("lengths"),
           py::arg("tag") = 0, py::kw_only(), py::arg("timeout") = py::none(),
           "send_vec of blocks: for each buffer of `local` in turn, every block offsets[j], lengths[j].")
      .def("recv_blocks", &dmxpy::post_recv_blocks, py::arg("local"), py::arg("offsets"), py::arg("lengths"),
           py::arg("tag") = 0, py::kw_only(), py::arg("timeout") = py::none(),
           "recv_vec of blocks (as send_blocks).")
      .def(
          "next_notification",
          [](EndpointState& s, std::optional<double> timeout) {
            dmx::Duration limit = dmxpy::to_duration(timeout, "next_notification(timeout)");
            std::optional<dmx::Result<dmx::Notification>> got;
            bool done = dmxpy::wait_in_slices(limit, [&](dmx::Duration slice) {
              auto r = s.ep.next_notification(slice);
              if (!r.ok() && r.status().code() == dmx::Code::kTimeout) return false;
              got.emplace(std::move(r));
              return true;
            });
            if (!done)
              dmxpy::raise_error(dmx::Code::kTimeout, "next_notification: none arrived in time [peer " + s.ep.peer() + "]");
            return dmxpy::unwrap(std::move(*got));
          },
          py::arg("timeout") = py::none(), "The next notification of a write the peer made into our memory.")
      .def_property_readonly("peer", [](EndpointState& s) { return s.ep.peer(); })
      .def("stats", [](EndpointState& s) { return stats_dict(s.ep.stats()); })
      .def("close", &EndpointState::close,
           "Closes the endpoint: pending operations fail with ClosedError. Idempotent.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](EndpointState& s, py::args) { s.close(); });

  py::class_<RegistrationW>(m, "Registration", "Memory that the peers of a context may write and read.")
      .def("descriptor", [](RegistrationW& r) { return to_bytes(r.remote.serialize()); },
           "The bytes that name the region for a peer (give them to its write/read).")
      .def_property_readonly("remote", [](RegistrationW& r) { return r.remote; })
      .def("deregister", &RegistrationW::deregister,
           "Withdraws the region (peers' operations on it fail) and waits until no transfer uses it.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](RegistrationW& r, py::args) { r.deregister(); });

  py::class_<ListenerW>(m, "Listener", "Accepts endpoints on an address.")
      .def_property_readonly("address", [](ListenerW& l) { return l.lis.address(); })
      .def(
          "accept",
          [](ListenerW& l, std::optional<double> timeout) {
            dmx::Duration limit = dmxpy::to_duration(timeout, "accept(timeout)");
            std::optional<dmx::Result<dmx::Endpoint>> got;
            bool done = dmxpy::wait_in_slices(limit, [&](dmx::Duration slice) {
              auto r = l.lis.accept(slice);
              if (!r.ok() && r.status().code() == dmx::Code::kTimeout) return false;
              got.emplace(std::move(r));
              return true;
            });
            if (!done) dmxpy::raise_error(dmx::Code::kTimeout, "accept on " + l.lis.address() + ": no peer in time");
            return std::make_shared<EndpointState>(dmxpy::unwrap(std::move(*got)));
          },
          py::arg("timeout") = py::none(), "The next authenticated endpoint; TimeoutError when none comes in time.")
      .def("close", &ListenerW::close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](ListenerW& l, py::args) { l.close(); });

  py::class_<ContextW>(m, "Context", "Configuration, listening, connecting, registering memory.")
      .def(py::init([](py::kwargs settings) {
             dmx::Options o;
             // dmx logs what logging.getLogger("dmx") would show, unless told otherwise.
             if (std::getenv("DMX_LOG_LEVEL") == nullptr) o.set("log_level", dmxpy::python_log_level());
             for (auto kv : settings) o.set(py::str(kv.first), setting_text(kv.second));
             auto c = std::make_unique<ContextW>();
             dmx::Result<dmx::Context> r = dmx::Status(dmx::Code::kInternal, "not created");
             {
               py::gil_scoped_release nogil;
               r = dmx::Context::create(o);
             }
             c->ctx = dmxpy::unwrap(std::move(r));
             return c;
           }),
           "Context(**settings): settings by name as in `dmx probe --config` (streams=4, transport='tcp').\n"
           "log_level defaults to the level of logging.getLogger('dmx') (or DMX_LOG_LEVEL where set).")
      .def(
          "listen",
          [](ContextW& c, const std::string& address) {
            dmx::Result<dmx::Listener> r = dmx::Status(dmx::Code::kInternal, "not listening");
            {
              py::gil_scoped_release nogil;
              r = c.ctx.listen(address);
            }
            auto l = std::make_unique<ListenerW>();
            l->lis = dmxpy::unwrap(std::move(r));
            return l;
          },
          py::arg("address"), "Listens on 'tcp://host:port' (port 0: any); Listener.address has the real port.")
      .def(
          "connect",
          [](ContextW& c, const std::string& address) {
            dmx::Result<dmx::Endpoint> r = dmx::Status(dmx::Code::kInternal, "not connected");
            {
              py::gil_scoped_release nogil;
              r = c.ctx.connect(address);
            }
            return std::make_shared<EndpointState>(dmxpy::unwrap(std::move(r)));
          },
          py::arg("address"), "Connects and authenticates within the connect_timeout setting.")
      .def(
          "register",
          [](ContextW& c, py::handle obj) {
            auto reg = std::make_unique<RegistrationW>();
            auto buf = dmxpy::BufferRef::acquire(obj, true, "register");
            dmx::Result<dmx::Registration> r = dmx::Status(dmx::Code::kInternal, "not registered");
            {
              py::gil_scoped_release nogil;
              r = c.ctx.register_memory(buf->region());
            }
            reg->reg = dmxpy::unwrap(std::move(r));
            reg->remote = reg->reg.remote();
            reg->buf = std::move(buf);
            return reg;
          },
          py::arg("buf"), "Registers `buf` (writable) for peers' write/read; descriptor() names it.")
      .def("metrics_text", [](ContextW& c) { return dmx::to_prometheus(c.ctx.metrics()); },
           "The context's counters and latency histograms in the Prometheus text format.");
  dmxpy::add_store(m, [](py::handle h) -> dmx::Context& { return h.cast<ContextW&>().ctx; }, [](py::handle h) -> const dmx::Registration& { return h.cast<RegistrationW&>().reg; });
}
