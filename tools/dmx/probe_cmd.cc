// dmx probe: what this host can do, one line per capability: "available: ..." or
// "unavailable: <exact reason>"; --json for machines; --config prints the settings table.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "core/config.h"
#include "probe/probe.h"
#include "tools/dmx/commands.h"

namespace dmx::cli {

namespace {

struct ProbeArgs {
  bool json = false;
  bool config = false;
  bool no_cuda = false;
  bool no_devmem = false;
  std::string sysfs_root;
};

int print_config(const Config& config, bool json) {
  if (json) {
    nlohmann::json j = nlohmann::json::array();
    for (const Config::Item& it : config.items())
      j.push_back({{"name", it.entry->name},
                   {"value", shown_value(*it.entry, it.value)},  // a secret: only whether it is set
                   {"source", it.source},
                   {"help", it.entry->help},
                   {"default", it.entry->default_value}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  size_t w = 4;
  for (const Config::Item& it : config.items()) w = std::max(w, it.entry->name.size());
  for (const Config::Item& it : config.items()) {
    std::string value = shown_value(*it.entry, it.value);
    std::printf("%-*.*s  %-10s  %-22s  %.*s\n", static_cast<int>(w), static_cast<int>(it.entry->name.size()),
                it.entry->name.data(), value.empty() ? "\"\"" : value.c_str(), it.source.c_str(),
                static_cast<int>(it.entry->help.size()), it.entry->help.data());
  }
  // Unknown DMX_* variables end the table (the JSON form: a warning on stderr when resolving).
  for (const UnknownEnv& u : unknown_env_settings())
    std::printf("%-*s  %-10s  %-22s  %s: ignored\n", static_cast<int>(w), u.name.c_str(), "-", "env (unknown)",
                u.to_string().c_str());
  return 0;
}

int run_probe(const ProbeArgs& args) {
  Options options;
  if (!args.sysfs_root.empty()) options.set("sysfs_root", args.sysfs_root, "flag --sysfs-root");
  add_log_level(options);
  auto config = Config::resolve(options);
  if (!config.ok()) {
    std::fprintf(stderr, "dmx probe: %s\n", config.status().to_string().c_str());
    return 2;
  }
  if (args.config) return print_config(*config, args.json);
  probe::ProbeOptions po;
  po.sysfs_root = config->get_string("sysfs_root");
  po.cuda = !args.no_cuda;
  po.devmem = !args.no_devmem;
  std::vector<Capability> caps = probe::probe_all(po);
  if (args.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const Capability& c : caps) {
      nlohmann::json facts = nlohmann::json::object();
      for (const auto& [k, v] : c.facts) facts[k] = v;
      j.push_back({{"name", c.name}, {"available", c.available}, {"detail", c.detail}, {"facts", facts}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  size_t w = 8;
  for (const Capability& c : caps) w = std::max(w, c.name.size());
  for (const Capability& c : caps) {
    std::printf("%-*s  %s: %s\n", static_cast<int>(w), c.name.c_str(), c.available ? "available" : "unavailable",
                c.detail.c_str());
    for (const auto& [k, v] : c.facts) std::printf("%-*s    %s = %s\n", static_cast<int>(w), "", k.c_str(), v.c_str());
  }
  return 0;
}

}  // namespace

void add_probe_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ProbeArgs>();
  CLI::App* cmd = app.add_subcommand("probe", "What this host can do: each capability available, or why not");
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->add_flag("--config", args->config,
                "print the settings table (name, value, source, help; secrets redacted) instead");
  cmd->add_flag("--no-cuda", args->no_cuda, "skip the CUDA checks");
  cmd->add_flag("--no-devmem", args->no_devmem, "skip the devmem TCP checks (netlink, bind attempts)");
  cmd->add_option("--sysfs-root", args->sysfs_root, "read topology from this sysfs tree instead of /sys");
  cmd->callback([args, exit_code] { *exit_code = run_probe(*args); });
}

}  // namespace dmx::cli
