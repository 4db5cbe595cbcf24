#include "probe/probe.h"

#include <functional>

#include "core/config.h"
#include "engine/paths.h"
#include "transport/devmem/devmem.h"
#include "transport/rdma/rdma_transport.h"

namespace dmx::probe {

namespace {

struct Check {
  const char* name;  // for --only style filtering later
  std::function<std::vector<Capability>(const ProbeOptions&)> run;
};

// Every check, in print order. Add transport lines here.
const std::vector<Check>& checks() {
  static const std::vector<Check> kChecks = {
      {"kernel", [](const ProbeOptions&) { return probe_kernel(); }},
      {"cuda",
       [](const ProbeOptions& o) {
         if (o.cuda) return probe_cuda();
         return std::vector<Capability>{{"cuda.driver", false, "not probed (--no-cuda)"}};
       }},
      {"topo", [](const ProbeOptions& o) { return probe_topology(o.sysfs_root); }},
      {"devmem",
       [](const ProbeOptions& o) {
         if (o.devmem) return devmem::probe();
         return std::vector<Capability>{{"devmem", false, "not probed (--no-devmem)"}};
       }},
      {"rdma", [](const ProbeOptions& o) { return probe_rdma(o.sysfs_root, o.cuda); }},
      {"io_uring", [](const ProbeOptions&) { return probe_io_uring_zcrx(); }},
      {"netns", [](const ProbeOptions&) { return probe_network_namespaces(); }},
      {"engine",
       [](const ProbeOptions&) {
         auto config = Config::resolve();
         if (!config.ok()) return std::vector<Capability>{{"engine", false, config.status().to_string()}};
         return probe_engine_paths(*config);
       }},
  };
  return kChecks;
}

}  // namespace

std::vector<Capability> probe_all(const ProbeOptions& options) {
  std::vector<Capability> out;
  for (const Check& c : checks()) {
    std::vector<Capability> part = c.run(options);
    out.insert(out.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  return out;
}

}  // namespace dmx::probe
