// dmx ls: what a job has in the store (docs/cluster.md): peers with their epochs, addresses and
// leases, published regions with where they live, the orchestrator's pools, and every entry
// refused (forged, altered, stale) with why. --json for machines.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "dmx/dmx.h"
#include "tools/dmx/commands.h"

namespace dmx::cli {

namespace {

struct LsArgs {
  std::string store, job;
  std::vector<std::string> options;
  bool json = false;
};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

int run_ls(const LsArgs& args) {
  Options o;
  if (Status s = add_option_values(o, args.options); !s.ok()) {
    std::fprintf(stderr, "dmx ls: %s\n", s.to_string().c_str());
    return 2;
  }
  if (!args.store.empty()) o.set("store", args.store, "flag --store");
  if (!args.job.empty()) o.set("store_job", args.job, "flag --job");
  o.set("store_name", "", "dmx ls (only reads)");
  add_log_level(o);
  auto ctx = Context::create(o);
  if (!ctx.ok()) {
    std::fprintf(stderr, "dmx ls: %s\n", ctx.status().to_string().c_str());
    return 2;
  }
  auto l = ctx->cluster();
  if (!l.ok()) {
    std::fprintf(stderr, "dmx ls: %s\n", l.status().to_string().c_str());
    return l.status().code() == Code::kInvalidArgument ? 2 : 1;
  }
  if (args.json) {
    nlohmann::json j{{"store", l->store}, {"job", l->job}, {"peers", nlohmann::json::array()},
                     {"regions", nlohmann::json::array()}, {"pools", nlohmann::json::array()}, {"refused", l->refused}};
    for (const auto& p : l->peers)
      j["peers"].push_back({{"name", p.name}, {"epoch", p.epoch}, {"addresses", p.addresses},
                            {"transports", p.transports}, {"host", p.host}, {"pid", p.pid}, {"lease", p.lease}});
    for (const auto& r : l->regions)
      j["regions"].push_back({{"name", r.name}, {"owner", r.owner}, {"owner_epoch", r.owner_epoch},
                              {"size", r.region.size}, {"memory", r.memory}, {"device", r.device}, {"host", r.host},
                              {"lease", r.lease}});
    for (const auto& p : l->pools)
      j["pools"].push_back({{"host", p.host}, {"name", p.name}, {"kind", p.kind}, {"device", p.device},
                            {"numa", p.numa}, {"bytes", p.bytes}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("store %s, job %s\n", l->store.c_str(), l->job.c_str());
  std::printf("peers (%zu):\n", l->peers.size());
  for (const auto& p : l->peers)
    std::printf("  %-20s epoch %-8llu lease %-16llx %s  host %s pid %u  transports %s\n", p.name.c_str(),
                static_cast<unsigned long long>(p.epoch), static_cast<unsigned long long>(p.lease),
                join(p.addresses).c_str(), p.host.c_str(), p.pid, join(p.transports).c_str());
  std::printf("regions (%zu):\n", l->regions.size());
  for (const auto& r : l->regions)
    std::printf("  %-20s owner %s epoch %llu  %llu B  %s%s  host %s\n", r.name.c_str(), r.owner.c_str(),
                static_cast<unsigned long long>(r.owner_epoch), static_cast<unsigned long long>(r.region.size),
                r.memory.c_str(), r.device >= 0 ? (":" + std::to_string(r.device)).c_str() : "", r.host.c_str());
  if (!l->pools.empty()) {
    std::printf("pools (%zu):\n", l->pools.size());
    for (const auto& p : l->pools)
      std::printf("  %-24s %-11s on %s  node %d%s  %llu B\n", p.name.c_str(), p.kind.c_str(), p.host.c_str(), p.numa,
                  p.device >= 0 ? (" cuda:" + std::to_string(p.device)).c_str() : "",
                  static_cast<unsigned long long>(p.bytes));
  }
  if (!l->refused.empty()) {
    std::printf("refused (%zu):\n", l->refused.size());
    for (const auto& r : l->refused) std::printf("  %s\n", r.c_str());
  }
  return 0;
}

}  // namespace

void add_ls_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<LsArgs>();
  CLI::App* cmd = app.add_subcommand("ls", "List a job's peers (epochs, addresses, leases), published regions and pools "
                                           "in the store (etcd or a torch TCPStore)");
  cmd->add_option("--store", args->store, "etcd://host:port or tcpstore://host:port (else the store setting)");
  cmd->add_option("--job", args->job, "the job (else the store_job setting)");
  cmd->add_option("--option", args->options, "NAME=VALUE: a setting (dmx probe --config lists them)");
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->callback([args, exit_code] { *exit_code = run_ls(*args); });
}

}  // namespace dmx::cli
