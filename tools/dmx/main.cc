// dmx: device memory exchange command-line tool.
#include <csignal>

#include "tools/dmx/commands.h"

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"dmx — move bytes between GPU, pinned and host memory across processes and hosts"};
  app.require_subcommand(1);
  int exit_code = 0;
  dmx::cli::add_bench_command(app, &exit_code);
  dmx::cli::add_probe_command(app, &exit_code);
  dmx::cli::add_topo_command(app, &exit_code);
  dmx::cli::add_devmem_command(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
