// NIC setup/teardown plans against a NicOps double (every machine). Names say "Double".
#include <gtest/gtest.h>

#include <map>

#include "core/config.h"
#include "transport/devmem/kernel_abi.h"
#include "transport/devmem/nic.h"
#include "transport/devmem/rx.h"

namespace dmx::devmem {
namespace {

class NicDouble final : public NicOps {
 public:
  NicState state;
  std::map<uint32_t, FlowRule> rules;
  std::string fail_on;  // "header_split", "ntuple", "rss"
  std::vector<std::string> calls;

  NicDouble() {
    state.ifname = "eth1";
    state.driver = "gve";
    state.rx_queues = 16;
    state.tcp_data_split = abi::kTcpDataSplitDisabled;
    state.hds_thresh = 256;
    state.ntuple = false;
    for (uint32_t i = 0; i < 128; ++i) state.rss_indir.push_back(i % 16);
  }
  Result<NicState> read(const std::string&) override { return state; }
  Status set_header_split(const std::string&, uint8_t split, std::optional<uint32_t> thresh) override {
    calls.push_back("header_split");
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
    state.rss_indir = t;
    return Status();
  }
  Result<uint32_t> add_flow_rule(const std::string&, const FlowRule& r) override {
    uint32_t loc = static_cast<uint32_t>(rules.size()) + 100;
    rules[loc] = r;
    return loc;
  }
  Status delete_flow_rule(const std::string&, uint32_t loc) override {
    rules.erase(loc);
    return Status();
  }
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
  auto loc = nic.add_flow_rule("eth1", FlowRule{0x0100000a, 7000, 0, 0, 13});
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
