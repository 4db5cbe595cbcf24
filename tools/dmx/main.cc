// dmx: device memory exchange command-line tool.
#include <fmt/format.h>

#include <csignal>
#include <cstdlib>

#include "core/log.h"
#include "dmx/version.h"
#include "tools/dmx/cli_hints.h"
#include "tools/dmx/commands.h"

namespace dmx::cli {
namespace {
int g_verbose = 0;  // -v count; set once while parsing, read by the commands after
}  // namespace

Status add_option_values(Options& o, const std::vector<std::string>& name_values) {
  for (const auto& kv : name_values) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      return Status(Code::kInvalidArgument, fmt::format("--option '{}': expected NAME=VALUE", kv));
    o.set(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return Status();
}

void add_log_level(Options& o) {
  if (g_verbose > 0) o.set("log_level", g_verbose == 1 ? "info" : "debug", g_verbose == 1 ? "flag -v" : "flag -vv");
  else o.set_default("log_level", "warn", "dmx default");
}

}  // namespace dmx::cli

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"dmx — move bytes between GPU, pinned and host memory across processes and hosts"};
  const dmx::BuildInfo& b = dmx::build_info();
  app.set_version_flag("--version", fmt::format("dmx {}\ngit revision: {}\nbuild: {}", b.version, b.git_revision,
                                                b.options));
  app.require_subcommand(1);
  // The CLI is quiet by default: warnings and errors only. -v shows info, -vv debug; without -v,
  // DMX_LOG_LEVEL (or --option log_level=...) still decides. A context created later sets the
  // level again from its settings (add_log_level), for the lines logged before: here.
  app.add_flag("-v,--verbose", dmx::cli::g_verbose, "log more: -v info, -vv debug (default: warnings only)");
  app.fallthrough();  // -v after the subcommand too
  app.parse_complete_callback([] {
    if (dmx::cli::g_verbose > 0) dmx::set_log_level(dmx::cli::g_verbose == 1 ? "info" : "debug");
    else if (std::getenv("DMX_LOG_LEVEL") == nullptr) dmx::set_log_level("warn");
  });
  int exit_code = 0;
  dmx::cli::add_bench_command(app, &exit_code);
  dmx::cli::add_probe_command(app, &exit_code);
  dmx::cli::add_topo_command(app, &exit_code);
  dmx::cli::add_ls_command(app, &exit_code);
  dmx::cli::add_devmem_command(app, &exit_code);
  dmx::cli::add_rpc_command(app, &exit_code);
  dmx::cli::add_mqueue_command(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);  // --help and --version end here too, with 0
    if (rc == 0) return 0;
    for (const std::string& hint : dmx::cli::parse_hints(app, argc, argv)) fmt::print(stderr, "{}\n", hint);
    return 2;  // a command line that does not parse, as a bad setting
  }
  return exit_code;
}
