#include "engine/ranking.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "topo/advisor.h"

namespace dmx {

namespace {

bool host_kind(const MemSpec& m) {
  return m.kind == MemKind::kHost || m.kind == MemKind::kPinned;
}

std::string plural(int n, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

// One agreed transport, scored for one kind. Ranked by key(): lower first.
struct Scored {
  RankedPath p;
  size_t index = 0;       // in the agreed list: the tie-break
  bool known = true;      // in the costs table
  bool forced = false;    // the transport setting names it
  bool demoted = false;   // the advisor (or the hardware) says another way is faster
  std::string demoted_why;
  bool off_host = false;  // within one host, but through the network stack or a NIC
  int passes = 0;
  int copies = 0;
  int cpu = 0;  // per-packet CPU work: the kernel's TCP (tcp, devmem)
  std::string advice;  // the advisor's reason, for a NIC transport on device memory

  auto key() const { return std::make_tuple(!forced, demoted, off_host, passes, copies, cpu, index); }
};

// Why `a` ranks above `b`, in words.
std::string why_above(const Scored& a, const Scored& b, const std::string& forced) {
  if (a.forced) return fmt::format("forced by configuration (transport={})", forced);
  if (!b.known) return fmt::format("{} has no costs in the table, so it ranks after those that have", b.p.name);
  if (b.demoted && !a.demoted) return b.demoted_why;
  if (a.off_host != b.off_host)
    return fmt::format("on one host {} moves bytes through memory only, {} through the network stack or a NIC",
                       a.p.name, b.p.name);
  if (a.passes != b.passes)
    return fmt::format("fewer host-memory passes per byte ({} against {})", a.passes, b.passes);
  if (a.copies != b.copies) return fmt::format("fewer copies per byte ({} against {})", a.copies, b.copies);
  if (a.cpu != b.cpu) return "the NIC runs the protocol: no per-packet CPU work";
  return "equal costs: the earlier in the agreed list";
}

std::string label(const Scored& s) {
  return s.p.id == 0 ? fmt::format("{} inline", s.p.name) : s.p.name;
}

}  // namespace

bool ranking_needs_topology(const TransportList& agreed) {
  for (const auto& t : agreed)
    if (t->gives() == Gives::kPath && transport_costs(t->name()).nic) return true;
  return false;
}

KindRanking rank_transports(const RankingInputs& in, const MemSpec& src) {
  const bool host = host_kind(src);
  const topo::Topology* topo = in.topo.get();
  std::vector<Scored> known, unknown;
  for (size_t i = 0; i < in.agreed.size(); ++i) {
    const Transport& t = *in.agreed[i];
    if (t.gives() == Gives::kControl) continue;
    Scored s;
    s.index = i;
    s.p.id = t.gives() == Gives::kStreams ? 0 : static_cast<uint8_t>(i + 1);
    s.p.name = std::string(t.name());
    s.forced = in.forced == t.name();
    TransportCosts c = transport_costs(t.name());
    if (!c.known) {
      s.known = false;
      s.p.how = "no costs known";
      (s.forced ? known : unknown).push_back(std::move(s));
      continue;
    }
    TransportCosts::Cost cost = host ? c.host : c.device;
    if (!cost.carries) continue;
    s.off_host = in.pair.same_host && !c.same_host_only;
    s.cpu = (t.gives() == Gives::kStreams || (c.nic && !c.offloaded)) ? 1 : 0;
    std::string mode;
    if (c.nic && topo == nullptr) {
      mode = fmt::format("topology unknown ({}): nominal costs", in.topo_why);
    } else if (c.nic && c.stages) {  // rdma: the NIC it needs decides first, then GPUDirect or staging
      int gpu = host ? -1 : topo::gpu_of_ordinal(*topo, src.device);
      int nic = -1;
      if (gpu >= 0) {
        nic = topo::nearest_rdma_nic(*topo, gpu);
      } else {
        for (size_t n = 0; n < topo->nics.size() && nic < 0; ++n)
          if (topo->nics[n].pci >= 0 && !topo->nics[n].rdma.empty()) nic = static_cast<int>(n);
      }
      if (nic < 0) {
        s.demoted = true;
        s.demoted_why = fmt::format(
            "{} needs {} to beat the streams, and this host's topology has none (a software device such as "
            "soft-RoCE does the NIC's work on the CPU)",
            s.p.name, c.needs);
        mode = "no RDMA device on a PCI function";
      } else if (!host && gpu < 0) {
        mode = fmt::format("{} is not a GPU of this topology: nominal costs", to_string(src));
      } else if (!host) {
        topo::RdmaChoice choice = topo::rdma_choice(*topo, gpu, nic);
        if (!choice.gpudirect) cost = c.device_staged;
        mode = fmt::format("{} by {}", choice.gpudirect ? "GPUDirect" : "staged", topo->nics[nic].name);
        s.advice = choice.why;
      } else {
        mode = fmt::format("by {}", topo->nics[nic].name);
      }
    } else if (c.nic && !host) {  // devmem: NIC-direct or nothing
      int gpu = topo::gpu_of_ordinal(*topo, src.device);
      int nic = topo->nic_by_name(in.devmem_ifname);
      if (gpu < 0 || nic < 0) {
        mode = fmt::format("GPU {} or NIC '{}' not in this topology: nominal costs", to_string(src), in.devmem_ifname);
      } else {
        topo::Advice a = topo::advise(*topo, gpu, nic, topo::Direction::kSend);
        s.advice = a.why;
        mode = fmt::format("{} by {}", topo::verdict_name(a.verdict), topo->nics[nic].name);
        if (a.verdict != topo::Verdict::kNicDirect) {
          s.demoted = true;
          s.demoted_why = fmt::format(
              "the advisor favours staging through host memory over {}'s NIC-direct access for {} ({})", s.p.name,
              to_string(src), mode);
        }
      }
    }
    s.passes = cost.host_passes;
    s.copies = cost.copies;
    s.p.how = fmt::format("{}, {}{}", plural(s.passes, "host pass", "host passes"), plural(s.copies, "copy", "copies"),
                          mode.empty() ? "" : "; " + mode);
    known.push_back(std::move(s));
  }
  std::sort(known.begin(), known.end(), [](const Scored& a, const Scored& b) { return a.key() < b.key(); });
  // Transports without costs go after the known paths, before the streams: where they are agreed,
  // a test or a newer transport asked for them, and a path beats the streams as it did before.
  auto at = std::find_if(known.begin(), known.end(), [](const Scored& s) { return !s.forced && (s.p.id == 0 || s.demoted); });
  known.insert(at, std::make_move_iterator(unknown.begin()), std::make_move_iterator(unknown.end()));

  KindRanking r;
  std::string chain;
  for (const Scored& s : known) {
    r.order.push_back(s.p);
    chain += fmt::format("{}{} ({})", chain.empty() ? "" : " > ", label(s), s.p.how);
  }
  if (known.empty()) {
    r.text = "no agreed transport carries it: inline on stream 0";
  } else if (known.size() == 1) {
    r.text = fmt::format("{}: the only agreed transport that carries it", chain);
  } else {
    r.text = fmt::format("{}; {} won: {}", chain, known[0].p.name, why_above(known[0], known[1], in.forced));
  }
  if (!known.empty() && !known[0].advice.empty()) r.text += fmt::format(" [advisor: {}]", known[0].advice);
  for (size_t i = 1; i < known.size(); ++i)
    if (!known[i].advice.empty()) r.text += fmt::format(" [advisor on {}: {}]", known[i].p.name, known[i].advice);
  return r;
}

TransportRanking::TransportRanking(RankingInputs in)
    : in_(std::move(in)), host_(std::make_shared<const KindRanking>(rank_transports(in_, MemSpec{MemKind::kHost, 0}))) {}

std::shared_ptr<const KindRanking> TransportRanking::rank(const MemSpec& src) const {
  if (host_kind(src)) return host_;
  std::pair<int, int> key{static_cast<int>(src.kind), src.device};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  }
  auto r = std::make_shared<const KindRanking>(rank_transports(in_, src));
  std::lock_guard<std::mutex> lock(mu_);
  if (cache_.size() < kMaxCached) cache_.emplace(key, r);
  return r;
}

std::string TransportRanking::summary() const {
  std::string out = fmt::format("host memory: {}", rank(MemSpec{MemKind::kHost, 0})->text);
  if (in_.topo && ranking_needs_topology(in_.agreed) && !in_.topo->gpus.empty()) {
    for (size_t g = 0; g < in_.topo->gpus.size(); ++g) {
      int dev = topo::gpu_of_ordinal(*in_.topo, static_cast<int>(g));
      out += fmt::format("; cuda:{} ({}): {}", g, dev >= 0 ? in_.topo->devices[dev].addr.to_string() : "not matched",
                         rank(MemSpec{MemKind::kCuda, static_cast<int>(g)})->text);
    }
  } else {
    out += fmt::format("; device memory: {}", rank(MemSpec{MemKind::kCuda, 0})->text);
  }
  return out;
}

}  // namespace dmx
