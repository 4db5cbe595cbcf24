// dmx topo: the PCI tree, GPU x GPU and GPU x NIC matrices (path class, kernel P2PDMA distance and
// map type), and the path advisor's recommendations; --json for machines; --capture DIR copies
// the sysfs subset discovery read, for bug reports and test fixtures.
#include <sys/utsname.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>

#include "core/config.h"
#include "core/sys.h"
#include "tools/dmx/commands.h"
#include "topo/placement.h"
#include "topo/push.h"
#include "topo/report.h"
#include "topo/sysfs.h"
#include "topo/topology.h"

namespace dmx::cli {

namespace {

struct TopoArgs {
  std::string sysfs_root;
  bool json = false;
  std::string capture;
  bool no_cuda = false;
};

int run_topo(const TopoArgs& args) {
  Options options;
  if (!args.sysfs_root.empty()) options.set("sysfs_root", args.sysfs_root, "flag --sysfs-root");
  add_log_level(options);
  auto config = Config::resolve(options);
  if (!config.ok()) {
    std::fprintf(stderr, "dmx topo: %s\n", config.status().to_string().c_str());
    return 2;
  }
  topo::SysfsTree tree(config->get_string("sysfs_root"));
  tree.set_recording(!args.capture.empty());
  auto topo = topo::discover(tree);
  if (!topo.ok()) {
    std::fprintf(stderr, "dmx topo: %s\n", topo.status().to_string().c_str());
    return 1;
  }
  // The CUDA overlay describes this process's GPUs: only meaningful for the live tree.
  bool live = args.sysfs_root.empty() && config->get_string("sysfs_root") == "/sys";
  if (!args.no_cuda && live) {
    topo::apply_cuda_overlay(*topo, topo::query_cuda_overlay());
  } else {
    topo::CudaOverlay none;
    none.reason = args.no_cuda ? "skipped (--no-cuda)" : "not queried: the sysfs root is not this machine's /sys";
    topo::apply_cuda_overlay(*topo, std::move(none));
  }
  if (!args.capture.empty()) {
    Status s = topo::capture_tree(tree, args.capture);
    if (!s.ok()) {
      std::fprintf(stderr, "dmx topo: capture to %s failed: %s\n", args.capture.c_str(), s.to_string().c_str());
      return 1;
    }
    // Where the capture came from, for whoever reads the bug report; discovery ignores the file.
    struct utsname u {};
    ::uname(&u);
    std::time_t now = std::time(nullptr);
    char when[64] = {};
    std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    std::ofstream(args.capture + "/dmx-capture.txt") << "dmx topo --capture of " << tree.root() << ", " << u.sysname
                                                     << " " << u.release << " " << u.machine << ", " << when << "\n";
    std::fprintf(stderr, "dmx topo: captured %zu sysfs paths into %s (replay with --sysfs-root %s)\n",
                 tree.recorded().size(), args.capture.c_str(), args.capture.c_str());
  }
  // The pools an engine of this machine publishes. This process allocates nothing: its books are
  // empty; a p2pmem BAR's line says what the kernel has handed out to every process.
  auto shared = std::make_shared<const topo::Topology>(std::move(*topo));
  auto placement = topo::Placement::create(shared, topo::kernel_p2pmem());
  std::string out;
  if (args.json) {
    out = topo::render_json(*shared, 2, config->get_string("gpu_nics"));
    // One object: the topology's fields plus "pools".
    if (!out.empty() && out.back() == '}') {
      out.pop_back();
      while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
      out += ",\n  \"pools\": " + topo::render_pools_json(*shared, placement->usage(), -1) + "\n}";
    }
    out += "\n";
  } else {
    auto push = topo::parse_push_mode(config->get_string("gpu_push"));
    out = topo::render_text(*shared, config->get_string("gpu_nics")) + topo::render_pools_text(*shared, placement->usage()) +
          topo::render_push_text(*shared, push.ok() ? *push : topo::PushMode::kAuto, config->get_size("gpu_push_max"));
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

void add_topo_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<TopoArgs>();
  CLI::App* cmd = app.add_subcommand(
      "topo", "Show the PCI tree, GPU/NIC distances (path class, kernel P2PDMA rule) and path advice");
  cmd->add_option("--sysfs-root", args->sysfs_root, "read this sysfs tree instead of /sys (a --capture copy)");
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->add_option("--capture", args->capture, "copy the sysfs subset that was read into DIR");
  cmd->add_flag("--no-cuda", args->no_cuda, "do not query CUDA for the NVLink/P2P overlay");
  cmd->callback([args, exit_code] { *exit_code = run_topo(*args); });
}

}  // namespace dmx::cli
