// NIC state, the kernel NicOps (ethtool ioctl + ethtool netlink) and the setup/teardown plan.
#include "transport/devmem/nic.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/sys.h"
#include "transport/devmem/kernel_abi.h"
#include "transport/devmem/netlink.h"

namespace dmx::devmem {
namespace {

// One SIOCETHTOOL call; `data` points at the ethtool command struct.
Status ethtool_ioctl(const std::string& ifname, void* data, const char* what) {
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno_status("socket(AF_INET)", errno);
  ifreq ifr{};
  if (ifname.size() >= IFNAMSIZ) return Status(Code::kInvalidArgument, "interface name too long: " + ifname);
  std::memcpy(ifr.ifr_name, ifname.c_str(), ifname.size());
  ifr.ifr_data = static_cast<char*>(data);
  if (::ioctl(fd.get(), SIOCETHTOOL, &ifr) < 0) {
    int e = errno;
    return errno_status(fmt::format("ethtool {} ({})", what, ifname), e,
                        e == EOPNOTSUPP || e == EPERM ? Code::kUnavailable : Code::kIo);
  }
  return Status();
}

Result<nl::Family> ethtool_family(nl::GenlSocket& s) { return s.resolve(abi::kEthtoolFamilyName); }

Status read_rings(const std::string& ifname, NicState* st) {
  DMX_ASSIGN_OR_RETURN(auto sock, nl::GenlSocket::open());
  DMX_ASSIGN_OR_RETURN(auto fam, ethtool_family(sock));
  nl::GenlMessage m(fam.id, abi::kEthtoolMsgRingsGet, 1, 0);
  size_t h = m.begin_nest(abi::kRingsHeader);
  m.put_str(abi::kEthtoolHeaderDevName, ifname);
  m.end_nest(h);
  DMX_ASSIGN_OR_RETURN(auto replies, sock.request(m, fmt::format("ethtool rings-get({})", ifname)));
  for (const auto& r : replies) {
    auto attrs = nl::parse_attrs(r);
    if (auto* a = nl::find_attr(attrs, abi::kRingsTcpDataSplit)) st->tcp_data_split = a->u8();
    if (auto* a = nl::find_attr(attrs, abi::kRingsHdsThresh)) st->hds_thresh = a->u32();
  }
  return Status();
}

class KernelNicOps final : public NicOps {
 public:
  Result<NicState> read(const std::string& ifname) override { return read_nic_state(ifname); }

  Status set_header_split(const std::string& ifname, uint8_t split, std::optional<uint32_t> thresh) override {
    DMX_ASSIGN_OR_RETURN(auto sock, nl::GenlSocket::open());
    DMX_ASSIGN_OR_RETURN(auto fam, ethtool_family(sock));
    nl::GenlMessage m(fam.id, abi::kEthtoolMsgRingsSet, 1, 0);
    size_t h = m.begin_nest(abi::kRingsHeader);
    m.put_str(abi::kEthtoolHeaderDevName, ifname);
    m.end_nest(h);
    m.put_u8(abi::kRingsTcpDataSplit, split);
    if (thresh) m.put_u32(abi::kRingsHdsThresh, *thresh);
    auto r = sock.request(m, fmt::format("ethtool rings-set({}, tcp-data-split {}, hds-thresh {})", ifname, split,
                                         thresh ? std::to_string(*thresh) : "unchanged"));
    return r.ok() ? Status() : r.status();
  }

  Status set_ntuple(const std::string& ifname, bool on) override {
    ethtool_value v{ETHTOOL_GFLAGS, 0};
    DMX_RETURN_IF_ERROR(ethtool_ioctl(ifname, &v, "get flags"));
    v.cmd = ETHTOOL_SFLAGS;
    v.data = on ? (v.data | ETH_FLAG_NTUPLE) : (v.data & ~uint32_t{ETH_FLAG_NTUPLE});
    return ethtool_ioctl(ifname, &v, on ? "set ntuple on" : "set ntuple off");
  }

  Status set_rss_indir(const std::string& ifname, const std::vector<uint32_t>& table) override {
    std::vector<uint32_t> buf(2 + table.size());
    buf[0] = ETHTOOL_SRXFHINDIR;
    buf[1] = static_cast<uint32_t>(table.size());
    std::copy(table.begin(), table.end(), buf.begin() + 2);
    return ethtool_ioctl(ifname, buf.data(), "set rxfh-indir");
  }

  Result<RuleTable> rule_table(const std::string& ifname) override {
    ethtool_rxnfc cnt{};
    cnt.cmd = ETHTOOL_GRXCLSRLCNT;
    DMX_RETURN_IF_ERROR(ethtool_ioctl(ifname, &cnt, "get flow rule count"));
    RuleTable t;
    t.special = (cnt.data & RX_CLS_LOC_SPECIAL) != 0;
    t.size = static_cast<uint32_t>(cnt.data & ~uint64_t{RX_CLS_LOC_SPECIAL});
    if (cnt.rule_cnt == 0) return t;
    if (cnt.rule_cnt > (1u << 20)) return Status(Code::kProtocol, fmt::format("{}: {} flow rules?", ifname, cnt.rule_cnt));
    // ethtool_rxnfc ends in a flexible array of rule locations.
    std::vector<uint8_t> buf(sizeof(ethtool_rxnfc) + size_t{cnt.rule_cnt} * sizeof(uint32_t));
    ethtool_rxnfc all{};
    all.cmd = ETHTOOL_GRXCLSRLALL;
    all.rule_cnt = cnt.rule_cnt;
    std::memcpy(buf.data(), &all, sizeof all);
    DMX_RETURN_IF_ERROR(ethtool_ioctl(ifname, buf.data(), "get flow rule locations"));
    std::memcpy(&all, buf.data(), sizeof all);
    uint32_t n = std::min(all.rule_cnt, cnt.rule_cnt);
    t.used.resize(n);
    std::memcpy(t.used.data(), buf.data() + offsetof(ethtool_rxnfc, rule_locs), n * sizeof(uint32_t));
    return t;
  }

  Result<uint32_t> insert_flow_rule(const std::string& ifname, const FlowRule& r, uint32_t location) override {
    ethtool_rxnfc n{};
    n.cmd = ETHTOOL_SRXCLSRLINS;
    if (r.ipv6) {
      n.fs.flow_type = TCP_V6_FLOW;
      auto& h = n.fs.h_u.tcp_ip6_spec;
      auto& m = n.fs.m_u.tcp_ip6_spec;
      bool src_any = r.src_ip6 == std::array<uint32_t, 4>{};
      for (int i = 0; i < 4; ++i) {
        h.ip6dst[i] = r.dst_ip6[i];
        m.ip6dst[i] = 0xffffffffu;
        h.ip6src[i] = r.src_ip6[i];
        m.ip6src[i] = src_any ? 0 : 0xffffffffu;
      }
      h.pdst = htons(r.dst_port);
      m.pdst = r.dst_port ? 0xffff : 0;
      h.psrc = htons(r.src_port);
      m.psrc = r.src_port ? 0xffff : 0;
    } else {
      n.fs.flow_type = TCP_V4_FLOW;
      n.fs.h_u.tcp_ip4_spec.ip4dst = r.dst_ip;
      n.fs.m_u.tcp_ip4_spec.ip4dst = r.dst_ip ? 0xffffffffu : 0;
      n.fs.h_u.tcp_ip4_spec.pdst = htons(r.dst_port);
      n.fs.m_u.tcp_ip4_spec.pdst = r.dst_port ? 0xffff : 0;
      n.fs.h_u.tcp_ip4_spec.ip4src = r.src_ip;
      n.fs.m_u.tcp_ip4_spec.ip4src = r.src_ip ? 0xffffffffu : 0;
      n.fs.h_u.tcp_ip4_spec.psrc = htons(r.src_port);
      n.fs.m_u.tcp_ip4_spec.psrc = r.src_port ? 0xffff : 0;
    }
    n.fs.ring_cookie = r.queue;
    n.fs.location = location;
    DMX_RETURN_IF_ERROR(ethtool_ioctl(ifname, &n, fmt::format("insert flow rule at {}", location == RX_CLS_LOC_ANY ? std::string("any") : std::to_string(location)).c_str()));
    return n.fs.location;
  }

  Status delete_flow_rule(const std::string& ifname, uint32_t location) override {
    ethtool_rxnfc n{};
    n.cmd = ETHTOOL_SRXCLSRLDEL;
    n.fs.location = location;
    return ethtool_ioctl(ifname, &n, "delete flow rule");
  }
};

}  // namespace

std::string driver_name(const std::string& ifname) {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/sys/class/net/" + ifname + "/device/driver", ec);
  return ec ? std::string() : p.filename().string();
}

Result<NicState> read_nic_state(const std::string& ifname) {
  if (::if_nametoindex(ifname.c_str()) == 0) return errno_status(fmt::format("if_nametoindex({})", ifname), errno, Code::kNotFound);
  NicState st;
  st.ifname = ifname;
  st.driver = driver_name(ifname);
  ethtool_channels ch{};
  ch.cmd = ETHTOOL_GCHANNELS;
  if (Status s = ethtool_ioctl(ifname, &ch, "get channels"); s.ok()) {
    st.rx_queues = ch.combined_count + ch.rx_count;
  } else {
    st.notes.push_back(s.message());
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/sys/class/net/" + ifname + "/queues", ec))
      if (e.path().filename().string().rfind("rx-", 0) == 0) ++st.rx_queues;
  }
  ethtool_value v{ETHTOOL_GFLAGS, 0};
  if (Status s = ethtool_ioctl(ifname, &v, "get flags"); s.ok())
    st.ntuple = (v.data & ETH_FLAG_NTUPLE) != 0;
  else
    st.notes.push_back(s.message());
  std::vector<uint32_t> ind(2, 0);
  ind[0] = ETHTOOL_GRXFHINDIR;
  if (Status s = ethtool_ioctl(ifname, ind.data(), "get rxfh-indir size"); s.ok() && ind[1] > 0) {
    uint32_t n = ind[1];
    ind.assign(2 + n, 0);
    ind[0] = ETHTOOL_GRXFHINDIR;
    ind[1] = n;
    if (Status s2 = ethtool_ioctl(ifname, ind.data(), "get rxfh-indir"); s2.ok())
      st.rss_indir.assign(ind.begin() + 2, ind.end());
    else
      st.notes.push_back(s2.message());
  } else if (!s.ok()) {
    st.notes.push_back(s.message());
  }
  if (Status s = read_rings(ifname, &st); !s.ok()) st.notes.push_back(s.message());
  return st;
}

std::string describe(const NicState& s) {
  auto split = [&]() -> std::string {
    if (!s.tcp_data_split) return "unknown";
    switch (*s.tcp_data_split) {
      case abi::kTcpDataSplitEnabled: return "on";
      case abi::kTcpDataSplitDisabled: return "off";
      default: return "unknown";
    }
  };
  return fmt::format("driver {}, {} rx queues, tcp-data-split {}, hds-thresh {}, ntuple {}, rss table {}",
                     s.driver.empty() ? "?" : s.driver, s.rx_queues, split(),
                     s.hds_thresh ? std::to_string(*s.hds_thresh) : "n/a",
                     s.ntuple ? (*s.ntuple ? "on" : "off") : "unknown",
                     s.rss_indir.empty() ? std::string("unreadable") : fmt::format("{} entries", s.rss_indir.size()));
}

bool header_split_ready(const NicState& s) {
  return s.tcp_data_split == abi::kTcpDataSplitEnabled && s.hds_thresh.value_or(0) == 0;
}

std::vector<uint32_t> default_indir(uint32_t rx_queues, size_t size) {
  std::vector<uint32_t> t(size);
  for (size_t i = 0; i < size && rx_queues > 0; ++i) t[i] = static_cast<uint32_t>(i % rx_queues);
  return t;
}

Result<uint32_t> choose_rule_location(const RuleTable& t) {
  if (t.special) return uint32_t{RX_CLS_LOC_ANY};
  std::vector<bool> used(t.size, false);
  for (uint32_t l : t.used)
    if (l < t.size) used[l] = true;
  for (uint32_t l = t.size; l-- > 0;)  // the last free one: lowest priority, as ethtool does
    if (!used[l]) return l;
  return Status(Code::kResourceExhausted, fmt::format("all {} flow-rule locations are in use", t.size));
}

Result<uint32_t> add_flow_rule(NicOps& ops, const std::string& ifname, const FlowRule& rule) {
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    DMX_ASSIGN_OR_RETURN(RuleTable t, ops.rule_table(ifname));
    DMX_ASSIGN_OR_RETURN(uint32_t loc, choose_rule_location(t));
    auto r = ops.insert_flow_rule(ifname, rule, loc);
    if (r.ok()) return r;
    last = r.status();
    const std::string& m = last.message();
    bool raced = m.find(fmt::format("(errno {})", EEXIST)) != std::string::npos ||
                 m.find(fmt::format("(errno {})", EBUSY)) != std::string::npos;
    if (!raced) break;
  }
  return last;
}

Result<std::vector<uint32_t>> isolating_indir(uint32_t rx_queues, size_t table_size, uint32_t first, uint32_t last) {
  if (first > last || last >= rx_queues)
    return Status(Code::kInvalidArgument, fmt::format("queues {}-{} are not inside the NIC's {} rx queues", first, last, rx_queues));
  std::vector<uint32_t> others;
  for (uint32_t q = 0; q < rx_queues; ++q)
    if (q < first || q > last) others.push_back(q);
  if (others.empty())
    return Status(Code::kInvalidArgument, fmt::format("queues {}-{} are all of the NIC's queues: none left for ordinary traffic", first, last));
  if (table_size == 0) return Status(Code::kUnavailable, "the NIC's RSS indirection table is not readable");
  std::vector<uint32_t> t(table_size);
  for (size_t i = 0; i < table_size; ++i) t[i] = others[i % others.size()];
  return t;
}

Result<SetupRecord> setup_nic(NicOps& ops, const std::string& ifname, uint32_t first, uint32_t last) {
  SetupRecord rec;
  rec.ifname = ifname;
  rec.first_queue = first;
  rec.last_queue = last;
  DMX_ASSIGN_OR_RETURN(rec.before, ops.read(ifname));
  DMX_ASSIGN_OR_RETURN(auto table, isolating_indir(rec.before.rx_queues, rec.before.rss_indir.size(), first, last));
  auto undo_and_fail = [&](Status s) -> Status {
    (void)teardown_nic(ops, rec);
    return s;
  };
  if (!header_split_ready(rec.before)) {
    rec.changed_header_split = true;
    // hds-thresh only where rings-get reported it: 6.12 has no such attribute and refuses it.
    std::optional<uint32_t> thresh = rec.before.hds_thresh ? std::optional<uint32_t>(0) : std::nullopt;
    if (Status s = ops.set_header_split(ifname, abi::kTcpDataSplitEnabled, thresh); !s.ok()) return undo_and_fail(s);
  }
  if (rec.before.ntuple != true) {
    rec.changed_ntuple = true;
    if (Status s = ops.set_ntuple(ifname, true); !s.ok()) return undo_and_fail(s);
  }
  if (table != rec.before.rss_indir) {
    rec.changed_rss = true;
    if (Status s = ops.set_rss_indir(ifname, table); !s.ok()) return undo_and_fail(s);
  }
  return rec;
}

Status teardown_nic(NicOps& ops, const SetupRecord& rec, const std::vector<uint32_t>& extra_rules) {
  Status first;
  auto keep = [&first](Status s) {
    if (first.ok() && !s.ok()) first = std::move(s);
  };
  std::vector<uint32_t> rules = rec.flow_rules;
  rules.insert(rules.end(), extra_rules.begin(), extra_rules.end());
  std::sort(rules.begin(), rules.end());
  rules.erase(std::unique(rules.begin(), rules.end()), rules.end());
  for (uint32_t loc : rules) keep(ops.delete_flow_rule(rec.ifname, loc));
  if (rec.changed_rss && !rec.before.rss_indir.empty()) {
    // The default spread goes back as size 0 (ethtool -X default), which also clears the driver's
    // "configured" flag; a table the user had set is written back as it was.
    bool was_default = rec.before.rss_indir == default_indir(rec.before.rx_queues, rec.before.rss_indir.size());
    keep(ops.set_rss_indir(rec.ifname, was_default ? std::vector<uint32_t>{} : rec.before.rss_indir));
  }
  if (rec.changed_ntuple && rec.before.ntuple.has_value()) keep(ops.set_ntuple(rec.ifname, *rec.before.ntuple));
  if (rec.changed_header_split)
    keep(ops.set_header_split(rec.ifname, rec.before.tcp_data_split.value_or(abi::kTcpDataSplitUnknown),
                              rec.before.hds_thresh));
  return first;
}

std::string SetupRecord::to_json() const {
  nlohmann::json j;
  j["ifname"] = ifname;
  j["first_queue"] = first_queue;
  j["last_queue"] = last_queue;
  j["changed"] = {{"header_split", changed_header_split}, {"ntuple", changed_ntuple}, {"rss", changed_rss}};
  j["flow_rules"] = flow_rules;
  nlohmann::json b;
  b["driver"] = before.driver;
  b["rx_queues"] = before.rx_queues;
  if (before.tcp_data_split) b["tcp_data_split"] = *before.tcp_data_split;
  if (before.hds_thresh) b["hds_thresh"] = *before.hds_thresh;
  if (before.ntuple) b["ntuple"] = *before.ntuple;
  b["rss_indir"] = before.rss_indir;
  j["before"] = b;
  return j.dump(2);
}

Result<SetupRecord> SetupRecord::from_json(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status(Code::kInvalidArgument, "devmem setup record: not JSON");
  try {
    SetupRecord r;
    r.ifname = j.at("ifname").get<std::string>();
    r.first_queue = j.at("first_queue").get<uint32_t>();
    r.last_queue = j.at("last_queue").get<uint32_t>();
    r.changed_header_split = j.at("changed").at("header_split").get<bool>();
    r.changed_ntuple = j.at("changed").at("ntuple").get<bool>();
    r.changed_rss = j.at("changed").at("rss").get<bool>();
    r.flow_rules = j.at("flow_rules").get<std::vector<uint32_t>>();
    const auto& b = j.at("before");
    r.before.ifname = r.ifname;
    r.before.driver = b.value("driver", "");
    r.before.rx_queues = b.value("rx_queues", 0u);
    if (b.contains("tcp_data_split")) r.before.tcp_data_split = b["tcp_data_split"].get<uint8_t>();
    if (b.contains("hds_thresh")) r.before.hds_thresh = b["hds_thresh"].get<uint32_t>();
    if (b.contains("ntuple")) r.before.ntuple = b["ntuple"].get<bool>();
    r.before.rss_indir = b.value("rss_indir", std::vector<uint32_t>{});
    return r;
  } catch (const nlohmann::json::exception& e) {
    return Status(Code::kInvalidArgument, fmt::format("devmem setup record: {}", e.what()));
  }
}

std::unique_ptr<NicOps> make_kernel_nic_ops() { return std::make_unique<KernelNicOps>(); }

}  // namespace dmx::devmem
