// Subcommands of the dmx tool. Each lives in its own file and registers itself on the app;
// the callback it sets runs the command and stores the process exit code in *exit_code.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "dmx/options.h"
#include "dmx/status.h"

namespace dmx::cli {

void add_bench_command(CLI::App& app, int* exit_code);   // bench_cmd.cc
void add_probe_command(CLI::App& app, int* exit_code);   // probe_cmd.cc
void add_topo_command(CLI::App& app, int* exit_code);    // topo_cmd.cc
void add_ls_command(CLI::App& app, int* exit_code);      // ls_cmd.cc
void add_devmem_command(CLI::App& app, int* exit_code);  // devmem_cmd.cc
void add_rpc_command(CLI::App& app, int* exit_code);     // rpc_cmd.cc
void add_mqueue_command(CLI::App& app, int* exit_code);  // mqueue_cmd.cc

// Settings, one rule for every command (main.cc): flag > --option > DMX_<NAME> > default, where
// "default" is the command's own (Options::set_default) where it has one, else the table's.
// --option NAME=VALUE items into `o` (source "option"); a flag's value then goes in with
// set(name, value, "flag --NAME"), after them.
Status add_option_values(Options& o, const std::vector<std::string>& name_values);
// Last: the log level. -v/-vv are its flag; without them the tool logs warnings only, as its own
// default (below DMX_LOG_LEVEL and --option log_level).
void add_log_level(Options& o);

}  // namespace dmx::cli
