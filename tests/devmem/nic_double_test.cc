// NIC setup/teardown plans against a NicOps double (every machine). Names say "Double".
#include <gtest/gtest.h>

#include <linux/ethtool.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/config.h"
#include "transport/devmem/kernel_abi.h"
#include "transport/devmem/nic.h"
#include "transport/devmem/rule_ledger.h"
#include "transport/devmem/rx.h"

namespace dmx::devmem {
namespace {

// A NIC as its driver answers the ethtool calls dmx makes (6.18), in one of three flavours:
//   mlx5: 1024 rule locations, no RX_CLS_LOC_SPECIAL; a location >= 1024 (RX_CLS_LOC_ANY too) is
//         ENOSPC (validate_flow); an insert at a used location REPLACES that rule;
//   gve:  max_flow_rules locations (the device's), no RX_CLS_LOC_SPECIAL; the device refuses a
//         location outside them (EINVAL here) and an occupied one (EEXIST here: our inference);
//   special: a driver that advertises RX_CLS_LOC_SPECIAL and picks for RX_CLS_LOC_ANY.
// The RSS table carries the driver's "user configured" flag (netif_is_rxfh_configured): any
// written table sets it, a size-0 write restores the default spread and clears it. A 6.12 kernel
// has no hds-thresh: rings-get does not report it and rings-set with it is refused.
class NicDouble final : public NicOps {
 public:
  NicState state;
  std::string flavour = "mlx5";
  uint32_t table_size = 1024;
  bool kernel_has_hds_thresh = true;
  bool rss_configured = false;
  std::map<uint32_t, FlowRule> rules;
  std::string fail_on;  // "header_split", "ntuple", "rss"
  std::vector<std::string> calls;

  explicit NicDouble(std::string f = "mlx5") : flavour(std::move(f)) {
    state.ifname = "eth1";
    state.driver = flavour;
    state.rx_queues = 16;
    state.tcp_data_split = abi::kTcpDataSplitDisabled;
    state.hds_thresh = 256;
    state.ntuple = false;
    state.rss_indir = default_indir(16, 128);
    if (flavour == "gve") table_size = 256;
  }
  Result<NicState> read(const std::string&) override {
    NicState s = state;
    if (!kernel_has_hds_thresh) s.hds_thresh.reset();
    return s;
  }
  Status set_header_split(const std::string&, uint8_t split, std::optional<uint32_t> thresh) override {
    calls.push_back("header_split");
    if (thresh && !kernel_has_hds_thresh)
      return errno_status("ethtool rings-set(eth1)", EINVAL);  // unknown attribute type 17 on 6.12
    if (fail_on == "header_split") return Status(Code::kIo, "rings-set failed: Invalid argument (errno 22); kernel: hds-thresh is not zero");
    state.tcp_data_split = split;
    if (thresh) state.hds_thresh = thresh;
    return Status();
  }
  Status set_ntuple(const std::string&, bool on) override {
    calls.push_back("ntuple");
    if (fail_on == "ntuple") return Status(Code::kIo, "set ntuple failed");
    state.ntuple = on;
    return Status();
  }
  Status set_rss_indir(const std::string&, const std::vector<uint32_t>& t) override {
    calls.push_back("rss");
    if (fail_on == "rss") return Status(Code::kIo, "set rxfh-indir failed: Operation not supported (errno 95)");
    if (t.empty()) {  // ETHTOOL_SRXFHINDIR size 0: the default, not "configured"
      state.rss_indir = default_indir(state.rx_queues, state.rss_indir.size());
      rss_configured = false;
      return Status();
    }
    if (t.size() != state.rss_indir.size()) return errno_status("ethtool set rxfh-indir (eth1)", EINVAL);
    state.rss_indir = t;
    rss_configured = true;
    return Status();
  }
  Result<RuleTable> rule_table(const std::string&) override {
    RuleTable t;
    t.size = table_size;
    t.special = flavour == "special";
    for (const auto& [loc, r] : rules) t.used.push_back(loc);
    return t;
  }
  Result<uint32_t> insert_flow_rule(const std::string&, const FlowRule& r, uint32_t loc) override {
    if (loc == RX_CLS_LOC_ANY && flavour == "special") {
      for (loc = 0; rules.count(loc); ++loc) {
      }
    } else if (loc >= table_size) {
      return errno_status("ethtool insert flow rule (eth1)", flavour == "mlx5" ? ENOSPC : EINVAL);
    } else if (rules.count(loc) && flavour == "gve") {
      return errno_status("ethtool insert flow rule (eth1)", EEXIST);
    }
    if (rules.count(loc)) ++replaced;  // mlx5: the old rule is gone
    rules[loc] = r;
    return loc;
  }
  Status delete_flow_rule(const std::string&, uint32_t loc) override {
    if (!rules.erase(loc)) return errno_status("ethtool delete flow rule (eth1)", ENOENT);
    return Status();
  }
  size_t replaced = 0;
};

TEST(NicDouble, SetupIsolatesQueuesAndTeardownRestores) {
  NicDouble nic;
  NicState original = nic.state;
  auto rec = setup_nic(nic, "eth1", 12, 15);
  ASSERT_TRUE(rec.ok()) << rec.status().to_string();
  EXPECT_EQ(nic.state.tcp_data_split, abi::kTcpDataSplitEnabled);
  EXPECT_EQ(nic.state.hds_thresh, 0u);
  EXPECT_EQ(nic.state.ntuple, true);
  for (uint32_t q : nic.state.rss_indir) EXPECT_LT(q, 12u);  // no ordinary traffic on 12-15
  ASSERT_EQ(nic.state.rss_indir.size(), original.rss_indir.size());
  // A connection's steering rule, then teardown removes it and restores everything.
  FlowRule fr;
  fr.dst_ip = 0x0100000a;
  fr.dst_port = 7000;
  fr.queue = 13;
  auto loc = add_flow_rule(nic, "eth1", fr);
  ASSERT_TRUE(loc.ok());
  rec->flow_rules.push_back(*loc);
  auto again = SetupRecord::from_json(rec->to_json());
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  ASSERT_TRUE(teardown_nic(nic, *again).ok());
  EXPECT_EQ(nic.state.tcp_data_split, original.tcp_data_split);
  EXPECT_EQ(nic.state.hds_thresh, original.hds_thresh);
  EXPECT_EQ(nic.state.ntuple, original.ntuple);
  EXPECT_EQ(nic.state.rss_indir, original.rss_indir);
  EXPECT_TRUE(nic.rules.empty());
}

TEST(NicDouble, FailureHalfwayRestoresWhatWasChanged) {
  NicDouble nic;
  NicState original = nic.state;
  nic.fail_on = "rss";
  auto rec = setup_nic(nic, "eth1", 12, 15);
  ASSERT_FALSE(rec.ok());
  EXPECT_NE(rec.status().message().find("errno 95"), std::string::npos);
  EXPECT_EQ(nic.state.tcp_data_split, original.tcp_data_split);
  EXPECT_EQ(nic.state.hds_thresh, original.hds_thresh);
  EXPECT_EQ(nic.state.ntuple, original.ntuple);
  EXPECT_EQ(nic.state.rss_indir, original.rss_indir);
}

TEST(NicDouble, AlreadyConfiguredNicIsLeftAlone) {
  NicDouble nic;
  nic.state.tcp_data_split = abi::kTcpDataSplitEnabled;
  nic.state.hds_thresh = 0;
  nic.state.ntuple = true;
  nic.state.rss_indir = *isolating_indir(16, 128, 12, 15);
  auto rec = setup_nic(nic, "eth1", 12, 15);
  ASSERT_TRUE(rec.ok());
  EXPECT_TRUE(nic.calls.empty());
  EXPECT_FALSE(rec->changed_header_split || rec->changed_ntuple || rec->changed_rss);
}

TEST(NicDouble, BadQueueRangesAreRefused) {
  EXPECT_FALSE(isolating_indir(16, 128, 12, 16).ok());  // past the last queue
  EXPECT_FALSE(isolating_indir(16, 128, 0, 15).ok());   // nothing left for ordinary traffic
  EXPECT_FALSE(isolating_indir(16, 128, 5, 4).ok());
  EXPECT_FALSE(isolating_indir(16, 0, 12, 15).ok());    // table unreadable
  EXPECT_FALSE(SetupRecord::from_json("{\"ifname\": 3}").ok());
  EXPECT_FALSE(SetupRecord::from_json("not json").ok());
}

// Defect 3: RX_CLS_LOC_ANY is ENOSPC on mlx5 and not advertised by gve: a free location is chosen
// from the rule count and the used locations, never one that holds someone else's rule.
TEST(DevmemNicDouble, FlowRuleLocationsLikeEthtool) {
  for (std::string flavour : {"mlx5", "gve", "special"}) {
    NicDouble nic(flavour);
    FlowRule theirs;
    theirs.queue = 1;
    nic.rules[nic.table_size - 1] = theirs;  // another tool's rule at the last location
    FlowRule mine;
    mine.dst_ip = 0x0200000a;
    mine.dst_port = 7001;
    mine.queue = 12;
    auto a = add_flow_rule(nic, "eth1", mine);
    ASSERT_TRUE(a.ok()) << flavour << ": " << a.status().to_string();
    auto b = add_flow_rule(nic, "eth1", mine);
    ASSERT_TRUE(b.ok()) << flavour << ": " << b.status().to_string();
    EXPECT_NE(*a, *b) << flavour;
    EXPECT_EQ(nic.replaced, 0u) << flavour << ": a rule was overwritten";
    EXPECT_EQ(nic.rules.size(), 3u) << flavour;
    EXPECT_EQ(nic.rules[nic.table_size - 1].queue, 1u) << flavour;
    if (flavour != "special") {
      EXPECT_EQ(*a, nic.table_size - 2) << flavour;  // the highest free one, as ethtool -N
    }
  }
  NicDouble full("gve");
  full.table_size = 2;
  full.rules[0] = FlowRule{};
  full.rules[1] = FlowRule{};
  auto r = add_flow_rule(full, "eth1", FlowRule{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kResourceExhausted) << r.status().to_string();
}

// Defect 3: every rule a connection installs is in the ledger; teardown (also after a crash, from
// the file alone) removes exactly those, and leaves other rules alone.
TEST(DevmemNicDouble, TeardownRemovesExactlyTheRecordedRules) {
  NicDouble nic("mlx5");
  auto rec = setup_nic(nic, "eth1", 12, 15);
  ASSERT_TRUE(rec.ok()) << rec.status().to_string();
  FlowRule other;
  other.queue = 2;
  nic.rules[5] = other;  // not ours
  std::string dir = ::testing::TempDir() + "/dmx-ledger-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  RuleLedger ledger(RuleLedger::path_for(dir, "eth1"));
  std::vector<uint32_t> ours;
  for (int i = 0; i < 3; ++i) {
    FlowRule f;
    f.dst_port = static_cast<uint16_t>(7000 + i);
    f.queue = 12;
    auto loc = add_flow_rule(nic, "eth1", f);
    ASSERT_TRUE(loc.ok());
    ASSERT_TRUE(ledger.add(*loc).ok());
    ours.push_back(*loc);
  }
  ASSERT_TRUE(ledger.remove(ours[1]).ok());  // a connection that closed normally
  ASSERT_TRUE(nic.delete_flow_rule("eth1", ours[1]).ok());
  // "Crash": a fresh ledger object reads the file.
  auto listed = RuleLedger(RuleLedger::path_for(dir, "eth1")).list();
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  EXPECT_EQ(*listed, std::vector<uint32_t>({ours[0], ours[2]}));
  ASSERT_TRUE(teardown_nic(nic, *rec, *listed).ok());
  EXPECT_EQ(nic.rules.size(), 1u);
  EXPECT_EQ(nic.rules.count(5), 1u);
  std::filesystem::remove_all(dir);
  // A malformed ledger is an error, not silently empty.
  std::filesystem::create_directories(dir);
  { std::ofstream(RuleLedger::path_for(dir, "eth1")) << "12 34\nnot a rule\n"; }
  EXPECT_FALSE(RuleLedger(RuleLedger::path_for(dir, "eth1")).list().ok());
  std::filesystem::remove_all(dir);
}

// Defect 4: teardown of a default RSS table restores it with size 0 (ethtool -X default), which
// clears the driver's "configured" flag; writing the old table back would leave it set.
TEST(DevmemNicDouble, RssRestoreClearsTheConfiguredFlag) {
  NicDouble nic;
  auto rec = setup_nic(nic, "eth1", 12, 15);
  ASSERT_TRUE(rec.ok());
  EXPECT_TRUE(nic.rss_configured);
  ASSERT_TRUE(teardown_nic(nic, *rec).ok());
  EXPECT_FALSE(nic.rss_configured);
  EXPECT_EQ(nic.state.rss_indir, default_indir(16, 128));
  // A table the user had configured is written back as it was.
  NicDouble custom;
  std::vector<uint32_t> t(128);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint32_t>((i * 7) % 11);
  ASSERT_TRUE(custom.set_rss_indir("eth1", t).ok());
  auto rec2 = setup_nic(custom, "eth1", 12, 15);
  ASSERT_TRUE(rec2.ok());
  ASSERT_TRUE(teardown_nic(custom, *rec2).ok());
  EXPECT_EQ(custom.state.rss_indir, t);
  EXPECT_TRUE(custom.rss_configured);
}

// Defect 6: a 6.12 kernel has no hds-thresh; setup must not send it, and the NIC counts as ready
// with header split on alone.
TEST(DevmemNicDouble, HdsThreshOnlyWhereTheKernelHasIt) {
  NicDouble nic;
  nic.kernel_has_hds_thresh = false;
  auto rec = setup_nic(nic, "eth1", 12, 15);
  ASSERT_TRUE(rec.ok()) << rec.status().to_string();
  EXPECT_EQ(nic.state.tcp_data_split, abi::kTcpDataSplitEnabled);
  auto st = nic.read("eth1");
  EXPECT_TRUE(header_split_ready(*st));
  ASSERT_TRUE(teardown_nic(nic, *rec).ok()) ;
  EXPECT_EQ(nic.state.tcp_data_split, abi::kTcpDataSplitDisabled);
}

// Defect 6: tcp6 rules carry the IPv6 addresses; choose/insert work the same.
TEST(DevmemNicDouble, Ipv6RulesAreAccepted) {
  NicDouble nic("gve");
  FlowRule r;
  r.ipv6 = true;
  r.dst_ip6 = {0x20010db8u, 0, 0, 1};
  r.dst_port = 7100;
  r.queue = 13;
  auto loc = add_flow_rule(nic, "eth1", r);
  ASSERT_TRUE(loc.ok()) << loc.status().to_string();
  EXPECT_TRUE(nic.rules[*loc].ipv6);
  EXPECT_EQ(nic.rules[*loc].dst_ip6[0], 0x20010db8u);
}

TEST(DevmemConfigDouble, RxOptionsComeFromTheTable) {
  Options o;
  o.set("devmem_recv_chunk", "2M");
  o.set("devmem_control_buffer", "128K");
  auto c = Config::resolve(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  RxOptions r = rx_options(*c);
  EXPECT_EQ(r.recv_chunk, 2u << 20);
  EXPECT_EQ(r.control_size, 128u << 10);
  EXPECT_EQ(r.max_outstanding_frags, 16384u);
}

}  // namespace
}  // namespace dmx::devmem
