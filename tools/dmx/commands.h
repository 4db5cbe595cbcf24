// Subcommands of the dmx tool. Each lives in its own file and registers itself on the app;
// the callback it sets runs the command and stores the process exit code in *exit_code.
#pragma once

#include <CLI/CLI.hpp>

namespace dmx::cli {

void add_bench_command(CLI::App& app, int* exit_code);   // bench_cmd.cc
void add_probe_command(CLI::App& app, int* exit_code);   // probe_cmd.cc
void add_topo_command(CLI::App& app, int* exit_code);    // topo_cmd.cc
void add_devmem_command(CLI::App& app, int* exit_code);  // devmem_cmd.cc
void add_rpc_command(CLI::App& app, int* exit_code);     // rpc_cmd.cc
void add_mqueue_command(CLI::App& app, int* exit_code);  // mqueue_cmd.cc

}  // namespace dmx::cli
