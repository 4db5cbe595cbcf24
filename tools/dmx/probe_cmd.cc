// Placeholder until the probe command lands.
#include <cstdio>

#include "tools/dmx/commands.h"

namespace dmx::cli {

void add_probe_command(CLI::App& app, int* exit_code) {
  app.add_subcommand("probe", "(probe: not built yet)")->callback([exit_code] {
    std::fprintf(stderr, "dmx probe: not built yet\n");
    *exit_code = 2;
  });
}

}  // namespace dmx::cli
