#include "store.h"

#include <pybind11/stl.h>

#include "errors.h"

namespace py = pybind11;

namespace dmxpy {
namespace {

py::dict peer_dict(const dmx::PeerInfo& p) {
  py::dict d;
  d["name"] = p.name;
  d["epoch"] = p.epoch;
  d["addresses"] = p.addresses;
  d["transports"] = p.transports;
  d["host"] = p.host;
  d["pid"] = p.pid;
  d["lease"] = p.lease;
  return d;
}

py::dict region_dict(const dmx::PublishedRegion& r) {
  py::dict d;
  d["name"] = r.name;
  d["owner"] = r.owner;
  d["owner_epoch"] = r.owner_epoch;
  d["region"] = py::cast(r.region);  // a RemoteRegion that keeps the owner's epoch
  d["size"] = r.region.size;
  d["memory"] = r.memory;
  d["device"] = r.device;
  d["host"] = r.host;
  d["lease"] = r.lease;
  return d;
}

// The keys and values of `dmx ls --json`'s pools.
py::dict pool_dict(const dmx::PublishedPool& p) {
  py::dict d;
  d["host"] = p.host;
  d["name"] = p.name;
  d["kind"] = p.kind;
  d["device"] = p.device;
  d["numa"] = p.numa;
  d["bytes"] = p.bytes;
  return d;
}

}  // namespace

void add_store(py::module_& m, std::function<dmx::Context&(py::handle)> context_of,
               std::function<const dmx::Registration&(py::handle)> registration_of) {
  py::object cls = m.attr("Context");
  auto method = [&](const char* name, py::cpp_function f) { py::setattr(cls, name, f); };
  method("publish", py::cpp_function(
                        [context_of, registration_of](py::handle self, const std::string& name, py::handle reg) {
                          dmx::Context& c = context_of(self);
                          const dmx::Registration& r = registration_of(reg);
                          dmx::Status s;
                          {
                            py::gil_scoped_release nogil;
                            s = c.publish(name, r);
                          }
                          check(s);
                        },
                        py::is_method(cls), py::arg("name"), py::arg("registration"),
                        "Publishes a Registration under `name` in the store (needs a listener with store_name)."));
  method("unpublish", py::cpp_function(
                          [context_of](py::handle self, const std::string& name) {
                            dmx::Context& c = context_of(self);
                            dmx::Status s;
                            {
                              py::gil_scoped_release nogil;
                              s = c.unpublish(name);
                            }
                            check(s);
                          },
                          py::is_method(cls), py::arg("name"), "Withdraws a region published under `name`."));
  method("lookup", py::cpp_function(
                       [context_of](py::handle self, const std::string& name) {
                         dmx::Context& c = context_of(self);
                         dmx::Result<dmx::PublishedRegion> r = dmx::Status(dmx::Code::kInternal, "not looked up");
                         {
                           py::gil_scoped_release nogil;
                           r = c.lookup(name);
                         }
                         return region_dict(unwrap(std::move(r)));
                       },
                       py::is_method(cls), py::arg("name"),
                       "A region another process published: a dict with 'region' (a RemoteRegion for write/read), "
                       "'owner' (connect to dmx://<job>/<owner>), 'owner_epoch', 'memory', 'device', 'host'."));
  method("lookup_peer", py::cpp_function(
                            [context_of](py::handle self, const std::string& name) {
                              dmx::Context& c = context_of(self);
                              dmx::Result<dmx::PeerInfo> r = dmx::Status(dmx::Code::kInternal, "not looked up");
                              {
                                py::gil_scoped_release nogil;
                                r = c.lookup_peer(name);
                              }
                              return peer_dict(unwrap(std::move(r)));
                            },
                            py::is_method(cls), py::arg("name"), "A peer's store entry as a dict."));
  method("cluster", py::cpp_function(
                        [context_of](py::handle self) {
                          dmx::Context& c = context_of(self);
                          dmx::Result<dmx::ClusterListing> r = dmx::Status(dmx::Code::kInternal, "not listed");
                          {
                            py::gil_scoped_release nogil;
                            r = c.cluster();
                          }
                          dmx::ClusterListing l = unwrap(std::move(r));
                          py::dict d;
                          d["store"] = l.store;
                          d["job"] = l.job;
                          py::list peers, regions, pools;
                          for (const auto& p : l.peers) peers.append(peer_dict(p));
                          for (const auto& x : l.regions) regions.append(region_dict(x));
                          for (const auto& p : l.pools) pools.append(pool_dict(p));
                          d["peers"] = peers;
                          d["regions"] = regions;
                          d["pools"] = pools;
                          d["refused"] = l.refused;
                          return d;
                        },
                        py::is_method(cls), "The job's peers, regions, pools (host, name, kind, device, numa, bytes) and refused entries "
                        "(what `dmx ls --json` prints)."));
  method("epoch", py::cpp_function([context_of](py::handle self) { return context_of(self).epoch(); },
                                   py::is_method(cls), "This process's epoch in the store (0 before it registered)."));
}

}  // namespace dmxpy
