// dmx: device memory exchange command-line tool.
#include <fmt/format.h>

#include <csignal>
#include <cstdlib>

#include "dmx/version.h"
#include "tools/dmx/commands.h"

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"dmx — move bytes between GPU, pinned and host memory across processes and hosts"};
  const dmx::BuildInfo& b = dmx::build_info();
  app.set_version_flag("--version", fmt::format("dmx {}\ngit revision: {}\nbuild: {}", b.version, b.git_revision,
                                                b.options));
  app.require_subcommand(1);
  // The CLI is quiet by default: warnings and errors only. -v shows info, -vv debug; without -v,
  // DMX_LOG_LEVEL (or --option log_level=...) still decides.
  int verbose = 0;
  app.add_flag("-v,--verbose", verbose, "log more: -v info, -vv debug (default: warnings only)");
  app.fallthrough();  // -v after the subcommand too
  app.parse_complete_callback([&verbose] {
    if (verbose > 0) ::setenv("DMX_LOG_LEVEL", verbose == 1 ? "info" : "debug", 1);
    else ::setenv("DMX_LOG_LEVEL", "warn", 0);
  });
  int exit_code = 0;
  dmx::cli::add_bench_command(app, &exit_code);
  dmx::cli::add_probe_command(app, &exit_code);
  dmx::cli::add_topo_command(app, &exit_code);
  dmx::cli::add_devmem_command(app, &exit_code);
  dmx::cli::add_rpc_command(app, &exit_code);
  dmx::cli::add_mqueue_command(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
