// Placeholder until the topo command lands.
#include <cstdio>

#include "tools/dmx/commands.h"

namespace dmx::cli {

void add_topo_command(CLI::App& app, int* exit_code) {
  app.add_subcommand("topo", "(topo: not built yet)")->callback([exit_code] {
    std::fprintf(stderr, "dmx topo: not built yet\n");
    *exit_code = 2;
  });
}

}  // namespace dmx::cli
