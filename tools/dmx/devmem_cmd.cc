// dmx devmem setup|status|teardown: prepare a NIC for devmem TCP and undo it.
//
//   dmx devmem setup    --ifname IF --queues A-B [--gpu N] [--state-dir D] [--state-file F]
//   dmx devmem status   --ifname IF [--state-dir D] [--state-file F] [--json]
//   dmx devmem teardown --ifname IF [--state-dir D] [--state-file F]
//
// setup turns header split on (threshold 0 where the kernel has it) and ntuple on, and moves RSS
// off queues A-B, saving the previous state to the state file (default D/devmem-IF.json, D =
// /run/dmx, the setting devmem_state_dir); with --gpu N it also binds a dmabuf of GPU N's memory
// to queues A-B once, to prove the whole chain, and releases it. Any failure restores what was
// changed. teardown removes the flow rules connections recorded in D/devmem-IF.rules (also those
// of crashed processes), then restores the saved state (RSS: the default, as ethtool -X default).
// Needs CAP_NET_ADMIN.
#include <net/if.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "dmx/memory.h"
#include "tools/dmx/commands.h"
#include "tools/dmx/devmem_selftest.h"
#include "transport/devmem/devmem.h"
#include "transport/devmem/kernel.h"
#include "transport/devmem/nic.h"
#include "transport/devmem/region.h"
#include "transport/devmem/rule_ledger.h"

namespace dmx::cli {

namespace {

struct DevmemArgs {
  std::string ifname;
  std::string queues;
  int gpu = -1;
  std::string state_file;
  std::string state_dir = "/run/dmx";
  bool json = false;
};

std::string state_path(const DevmemArgs& a) {
  return a.state_file.empty() ? a.state_dir + "/devmem-" + a.ifname + ".json" : a.state_file;
}
devmem::RuleLedger ledger(const DevmemArgs& a) {
  return devmem::RuleLedger(devmem::RuleLedger::path_for(a.state_dir, a.ifname));
}

bool parse_queues(const std::string& text, uint32_t* first, uint32_t* last) {
  unsigned a = 0, b = 0;
  char dash = 0;
  std::istringstream in(text);
  if (!(in >> a)) return false;
  if (in >> dash) {
    if (dash != '-' || !(in >> b)) return false;
  } else {
    b = a;
  }
  *first = a;
  *last = b;
  return a <= b;
}

int fail(const char* what, const Status& s) {
  std::fprintf(stderr, "dmx devmem %s: %s\n", what, s.to_string().c_str());
  return 1;
}

// Binds `gpu`'s memory to the queues once and releases it: the whole chain works, or why not.
Status try_bind(const DevmemArgs& a, uint32_t first, uint32_t last) {
  auto buf = Buffer::allocate({MemKind::kCuda, a.gpu}, 4 << 20);
  if (!buf.ok()) return buf.status();
  std::vector<uint32_t> qs;
  for (uint32_t q = first; q <= last; ++q) qs.push_back(q);
  auto ops = devmem::make_kernel_netlink_ops();
  auto region = devmem::BoundRegion::bind_rx(*ops, static_cast<int>(::if_nametoindex(a.ifname.c_str())), qs, buf->region());
  if (!region.ok()) return region.status();
  std::printf("bound 4 MiB of cuda:%d to %s queues %u-%u as dmabuf binding %u (released again)\n", a.gpu,
              a.ifname.c_str(), first, last, (*region)->id());
  return Status();
}

int run_setup(const DevmemArgs& a) {
  uint32_t first = 0, last = 0;
  if (!parse_queues(a.queues, &first, &last)) {
    std::fprintf(stderr, "dmx devmem setup: --queues wants A-B (e.g. 12-15), got '%s'\n", a.queues.c_str());
    return 2;
  }
  std::string path = state_path(a);
  if (std::filesystem::exists(path)) {
    std::fprintf(stderr, "dmx devmem setup: %s exists: %s is set up already (run teardown first)\n", path.c_str(),
                 a.ifname.c_str());
    return 1;
  }
  auto ops = devmem::make_kernel_nic_ops();
  auto rec = devmem::setup_nic(*ops, a.ifname, first, last);
  if (!rec.ok()) return fail("setup", rec.status());
  if (a.gpu >= 0) {
    if (Status s = try_bind(a, first, last); !s.ok()) {
      Status t = devmem::teardown_nic(*ops, *rec);
      if (!t.ok()) std::fprintf(stderr, "dmx devmem setup: restoring %s also failed: %s\n", a.ifname.c_str(), t.to_string().c_str());
      return fail("setup (bind check; NIC settings restored)", s);
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::ofstream out(path);
  out << rec->to_json() << "\n";
  if (!out) {
    (void)devmem::teardown_nic(*ops, *rec);
    std::fprintf(stderr, "dmx devmem setup: cannot write %s; NIC settings restored\n", path.c_str());
    return 1;
  }
  std::printf("%s ready for devmem on queues %u-%u (header split %s, ntuple %s, rss %s); undo with: dmx devmem teardown --ifname %s\n",
              a.ifname.c_str(), first, last, rec->changed_header_split ? "turned on" : "was on",
              rec->changed_ntuple ? "turned on" : "was on", rec->changed_rss ? "moved off those queues" : "already off them",
              a.ifname.c_str());
  return 0;
}

int run_status(const DevmemArgs& a) {
  auto st = devmem::read_nic_state(a.ifname);
  if (!st.ok()) return fail("status", st.status());
  std::ifstream in(state_path(a));
  std::string saved((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Capability> caps;
  for (auto& c : devmem::probe())
    if (c.name.find('[') == std::string::npos || c.name.find("[" + a.ifname + "]") != std::string::npos) caps.push_back(c);
  if (a.json) {
    nlohmann::json j;
    j["ifname"] = a.ifname;
    j["nic"] = devmem::describe(*st);
    j["notes"] = st->notes;
    j["setup"] = saved.empty() ? nlohmann::json(nullptr) : nlohmann::json::parse(saved, nullptr, false);
    for (const auto& c : caps) j["capabilities"].push_back({{"name", c.name}, {"available", c.available}, {"detail", c.detail}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s: %s\n", a.ifname.c_str(), devmem::describe(*st).c_str());
  for (const auto& n : st->notes) std::printf("  note: %s\n", n.c_str());
  std::printf("setup: %s\n", saved.empty() ? "none recorded" : ("recorded in " + state_path(a)).c_str());
  auto rules = ledger(a).list();
  if (rules.ok())
    std::printf("flow rules of dmx connections: %zu (%s)\n", rules->size(), ledger(a).path().c_str());
  else
    std::printf("flow rules of dmx connections: %s\n", rules.status().message().c_str());
  for (const auto& c : caps)
    std::printf("%-28s %-11s %s\n", c.name.c_str(), c.available ? "available" : "unavailable", c.detail.c_str());
  return 0;
}

int run_teardown(const DevmemArgs& a) {
  std::string path = state_path(a);
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "dmx devmem teardown: no setup recorded for %s (%s)\n", a.ifname.c_str(), path.c_str());
    return 1;
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto rec = devmem::SetupRecord::from_json(text);
  if (!rec.ok()) return fail("teardown", rec.status());
  auto l = ledger(a);
  auto rules = l.list();
  if (!rules.ok()) return fail("teardown (rule ledger unreadable; nothing changed)", rules.status());
  auto ops = devmem::make_kernel_nic_ops();
  if (Status s = devmem::teardown_nic(*ops, *rec, *rules); !s.ok()) return fail("teardown (state files kept)", s);
  if (Status s = l.forget(*rules); !s.ok()) std::fprintf(stderr, "dmx devmem teardown: %s\n", s.to_string().c_str());
  std::filesystem::remove(path);
  std::printf("%s restored to its state before setup (%zu flow rules of dmx connections removed)\n", a.ifname.c_str(),
              rules->size());
  return 0;
}

}  // namespace

void add_devmem_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<DevmemArgs>();
  auto* cmd = app.add_subcommand("devmem", "Linux devmem TCP: prepare a NIC (setup|status|teardown|selftest)");
  cmd->require_subcommand(1);
  auto common = [&](CLI::App* sub) {
    sub->add_option("--ifname", args->ifname, "network interface")->required();
    sub->add_option("--state-file", args->state_file, "where setup saves the previous NIC state");
    sub->add_option("--state-dir", args->state_dir, "state directory (the setting devmem_state_dir; default /run/dmx)");
  };
  auto* setup = cmd->add_subcommand("setup", "header split on (threshold 0), ntuple on, RSS off queues A-B");
  common(setup);
  setup->add_option("--queues", args->queues, "devmem queues, A-B")->required();
  setup->add_option("--gpu", args->gpu, "also bind GPU N's memory to the queues once, as a check");
  setup->callback([args, exit_code] { *exit_code = run_setup(*args); });
  auto* status = cmd->add_subcommand("status", "NIC state, recorded setup, devmem capabilities");
  common(status);
  status->add_flag("--json", args->json, "machine-readable output");
  status->callback([args, exit_code] { *exit_code = run_status(*args); });
  auto st = std::make_shared<SelftestArgs>();
  auto* self = cmd->add_subcommand("selftest", "set up, move verified GPU data both ways by devmem, check zcrx, tear down");
  self->add_option("--ifname", st->ifname, "this side's devmem NIC")->required();
  self->add_option("--queues", st->queues, "its devmem queues, A-B")->required();
  self->add_option("--listen", st->listen, "listen here (tcp://IP_OF_IFNAME:PORT) and echo");
  self->add_option("--connect", st->connect, "connect there, send and compare");
  self->add_option("--peer-ifname", st->peer_ifname, "one host, two ports: the other port (the client side)");
  self->add_option("--peer-queues", st->peer_queues, "its devmem queues, C-D");
  self->add_option("--gpu", st->gpu, "CUDA device (default 0)");
  self->add_option("--size-mib", st->size_mib, "MiB each way (plus 4093 bytes; default 64)");
  self->add_option("--timeout", st->timeout_s, "seconds for each wait (default 60)");
  self->add_option("--state-dir", st->state_dir, "state directory (default /run/dmx)");
  self->callback([st, exit_code] { *exit_code = run_devmem_selftest(*st); });
  auto* teardown = cmd->add_subcommand("teardown", "restore the NIC state saved by setup");
  common(teardown);
  teardown->callback([args, exit_code] { *exit_code = run_teardown(*args); });
}

}  // namespace dmx::cli
