// python/src/endpoint.h — the Python-side state of an endpoint, and its operations.
//
// EndpointState owns the dmx::Endpoint; Futures and the Python Endpoint share it, so the endpoint
// lives while any of them does. Buffers of operations whose Future was dropped before completion
// are adopted here and let go once complete (swept at each new operation and at close).
// Everything here runs with the GIL held, which also guards `orphans_`; blocking calls into dmx
// release it.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "dmx/endpoint.h"
#include "future.h"

namespace dmxpy {

struct EndpointState {
  explicit EndpointState(dmx::Endpoint e) : ep(std::move(e)) {}
  ~EndpointState();  // closes the endpoint (GIL released), then lets go of every buffer

  void adopt(dmx::Request req, Keep keep);
  void sweep();  // drops the buffers of completed orphans
  void close();  // raises dmx.Error if dmx could not stop touching the buffers

  dmx::Endpoint ep;
  std::vector<std::pair<dmx::Request, Keep>> orphans_;
};

// A remote region from Registration.descriptor() bytes (any contiguous buffer) or a RemoteRegion.
// Raises InvalidArgumentError when malformed.
dmx::RemoteRegion remote_region(pybind11::handle obj);

// The operations. `obj` is any buffer (buffer.h); `remote` a descriptor (bytes) from
// Registration.descriptor(); timeouts in seconds (None: no deadline).
std::unique_ptr<Future> post_send(const std::shared_ptr<EndpointState>& s, pybind11::handle obj, uint64_t tag,
                                  std::optional<double> timeout);
std::unique_ptr<Future> post_recv(const std::shared_ptr<EndpointState>& s, pybind11::handle obj, uint64_t tag,
                                  std::optional<double> timeout);
std::unique_ptr<Future> post_write(const std::shared_ptr<EndpointState>& s, pybind11::handle obj,
                                   const dmx::RemoteRegion& remote, uint64_t offset,
                                   std::optional<uint64_t> notify, std::optional<double> timeout);
std::unique_ptr<Future> post_read(const std::shared_ptr<EndpointState>& s, pybind11::handle obj,
                                  const dmx::RemoteRegion& remote, uint64_t offset, std::optional<double> timeout);

// Vectored (vec.h): `local` one buffer or a list of them, `remote` one descriptor or a list; the
// list from `entries` (IO_ENTRY / IO_PIECE array, or integers of shape (n, 5) / (n, 3)) or, for
// the *_blocks forms, from arrays of offsets and lengths applied to each buffer.
std::unique_ptr<Future> post_write_vec(const std::shared_ptr<EndpointState>& s, pybind11::handle local,
                                       pybind11::handle remote, pybind11::handle entries,
                                       std::optional<uint64_t> notify, std::optional<double> timeout);
std::unique_ptr<Future> post_read_vec(const std::shared_ptr<EndpointState>& s, pybind11::handle local,
                                      pybind11::handle remote, pybind11::handle entries,
                                      std::optional<double> timeout);
std::unique_ptr<Future> post_write_blocks(const std::shared_ptr<EndpointState>& s, pybind11::handle local,
                                          pybind11::handle remote, pybind11::handle local_offsets,
                                          pybind11::handle remote_offsets, pybind11::handle lengths,
                                          std::optional<uint64_t> notify, std::optional<double> timeout);
std::unique_ptr<Future> post_read_blocks(const std::shared_ptr<EndpointState>& s, pybind11::handle local,
                                         pybind11::handle remote, pybind11::handle local_offsets,
                                         pybind11::handle remote_offsets, pybind11::handle lengths,
                                         std::optional<double> timeout);
std::unique_ptr<Future> post_send_vec(const std::shared_ptr<EndpointState>& s, pybind11::handle local,
                                      pybind11::handle pieces, uint64_t tag, std::optional<double> timeout);
std::unique_ptr<Future> post_recv_vec(const std::shared_ptr<EndpointState>& s, pybind11::handle local,
                                      pybind11::handle pieces, uint64_t tag, std::optional<double> timeout);
std::unique_ptr<Future> post_send_blocks(const std::shared_ptr<EndpointState>& s, pybind11::handle local,
                                         pybind11::handle offsets, pybind11::handle lengths, uint64_t tag,
                                         std::optional<double> timeout);
std::unique_ptr<Future> post_recv_blocks(const std::shared_ptr<EndpointState>& s, pybind11::handle local,
                                         pybind11::handle offsets, pybind11::handle lengths, uint64_t tag,
                                         std::optional<double> timeout);

}  // namespace dmxpy
