// Placeholder until the devmem command lands.
#include <cstdio>

#include "tools/dmx/commands.h"

namespace dmx::cli {

void add_devmem_command(CLI::App& app, int* exit_code) {
  app.add_subcommand("devmem", "(devmem: not built yet)")->callback([exit_code] {
    std::fprintf(stderr, "dmx devmem: not built yet\n");
    *exit_code = 2;
  });
}

}  // namespace dmx::cli
