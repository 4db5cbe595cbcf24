// Placeholder until the bench command lands.
#include <cstdio>

#include "tools/dmx/commands.h"

namespace dmx::cli {

void add_bench_command(CLI::App& app, int* exit_code) {
  app.add_subcommand("bench", "(bench: not built yet)")->callback([exit_code] {
    std::fprintf(stderr, "dmx bench: not built yet\n");
    *exit_code = 2;
  });
}

}  // namespace dmx::cli
