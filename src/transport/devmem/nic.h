// NIC configuration for devmem TCP (privileged: CAP_NET_ADMIN), behind an interface so that it can
// run in a helper process and be replaced by a double in tests.
//
// What devmem RX needs from the NIC (Documentation/networking/devmem.rst, 6.18):
//   header/data split on (ethtool -G IF tcp-data-split on) with threshold 0 (hds-thresh 0);
//   ntuple filters on (ethtool -K IF ntuple on);
//   ordinary traffic kept off the devmem queues: here, the RSS indirection table spread over
//     the queues outside [first, last] (like ethtool -X IF equal N when they are the top ones);
//   one flow-steering rule per dmx connection sending it to a devmem queue.
// setup_nic() applies these and, on any failure, undoes what it did; teardown_nic() restores the
// state recorded before setup (kept in a SetupRecord, saved as JSON by `dmx devmem setup`).
//
// Drivers differ (6.18): hds-thresh exists from 6.13 only (it is set only where rings-get reports
// it); flow-rule locations: a driver that advertises RX_CLS_LOC_SPECIAL picks one itself, others
// need a free location below their table size (mlx5: 1024, ENOSPC beyond, and an insert at a used
// location REPLACES that rule; gve: the device's max_flow_rules), so add_flow_rule() reads the
// count and the used locations and takes the highest free one, as `ethtool -N` does in user space
// (rxclass.c rmgr). Restoring RSS writes a size-0 table, as `ethtool -X default` does: writing the
// old table back would leave the driver's "user configured" flag set.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dmx/status.h"

namespace dmx::devmem {

struct NicState {
  std::string ifname;
  std::string driver;
  uint32_t rx_queues = 0;
  std::optional<uint8_t> tcp_data_split;  // abi::kTcpDataSplit*; nullopt: the driver does not say
  std::optional<uint32_t> hds_thresh;     // nullopt: not reported (kernel < 6.13 or driver)
  std::optional<bool> ntuple;
  std::vector<uint32_t> rss_indir;        // empty: not readable
  std::vector<std::string> notes;         // what could not be read, and why
};

// Reads the state without changing anything (most of it needs no privilege).
Result<NicState> read_nic_state(const std::string& ifname);
std::string describe(const NicState& s);
std::string driver_name(const std::string& ifname);  // from sysfs; "" when unknown

// Header split as devmem needs it: on, and threshold 0 where the kernel has the setting (6.13+).
bool header_split_ready(const NicState& s);

struct FlowRule {  // tcp4, or tcp6 when ipv6
  bool ipv6 = false;
  uint32_t dst_ip = 0;    // IPv4, network byte order
  uint32_t src_ip = 0;    // 0: any
  std::array<uint32_t, 4> dst_ip6{};  // IPv6, network byte order words (ethtool_tcpip6_spec)
  std::array<uint32_t, 4> src_ip6{};  // all zero: any
  uint16_t dst_port = 0;  // host byte order
  uint16_t src_port = 0;  // 0: any
  uint32_t queue = 0;
};

// The driver's flow-rule table (ETHTOOL_GRXCLSRLCNT + ETHTOOL_GRXCLSRLALL).
struct RuleTable {
  uint32_t size = 0;            // locations 0 .. size-1
  bool special = false;         // RX_CLS_LOC_SPECIAL: the driver picks locations (RX_CLS_LOC_ANY)
  std::vector<uint32_t> used;   // locations holding a rule
};
// Where to insert the next rule: RX_CLS_LOC_ANY when the driver picks, else the highest free
// location (ethtool's rule manager for `ethtool -N ... ` without `loc`); kResourceExhausted when full.
Result<uint32_t> choose_rule_location(const RuleTable& t);

class NicOps {
 public:
  virtual ~NicOps() = default;
  virtual Result<NicState> read(const std::string& ifname) = 0;
  virtual Status set_header_split(const std::string& ifname, uint8_t tcp_data_split, std::optional<uint32_t> hds_thresh) = 0;
  virtual Status set_ntuple(const std::string& ifname, bool on) = 0;
  // An empty table restores the driver's default spread (ETHTOOL_SRXFHINDIR with size 0).
  virtual Status set_rss_indir(const std::string& ifname, const std::vector<uint32_t>& table) = 0;
  virtual Result<RuleTable> rule_table(const std::string& ifname) = 0;
  // Inserts at `location` (or RX_CLS_LOC_ANY); returns the location the driver used.
  virtual Result<uint32_t> insert_flow_rule(const std::string& ifname, const FlowRule& rule, uint32_t location) = 0;
  virtual Status delete_flow_rule(const std::string& ifname, uint32_t location) = 0;
};

// Reads the table, picks a location (choose_rule_location) and inserts; when another process took
// that location meanwhile (EEXIST / EBUSY), reads again (3 tries). Returns the location.
Result<uint32_t> add_flow_rule(NicOps& ops, const std::string& ifname, const FlowRule& rule);

// ethtool ioctl (SIOCETHTOOL) and ethtool netlink (rings: header split).
std::unique_ptr<NicOps> make_kernel_nic_ops();

// The default RSS table of `size` entries over `rx_queues` (what the driver sets: i % rx_queues).
std::vector<uint32_t> default_indir(uint32_t rx_queues, size_t size);

struct SetupRecord {
  std::string ifname;
  uint32_t first_queue = 0;
  uint32_t last_queue = 0;
  NicState before;
  bool changed_header_split = false;
  bool changed_ntuple = false;
  bool changed_rss = false;
  std::vector<uint32_t> flow_rules;  // locations installed (by connections; removed at teardown)

  std::string to_json() const;
  static Result<SetupRecord> from_json(const std::string& text);
};

// The RSS table that keeps traffic on queues outside [first, last], same size as `current`.
Result<std::vector<uint32_t>> isolating_indir(uint32_t rx_queues, size_t table_size, uint32_t first, uint32_t last);

Result<SetupRecord> setup_nic(NicOps& ops, const std::string& ifname, uint32_t first_queue, uint32_t last_queue);
// Restores everything `rec` changed, and removes the flow rules at `extra_rules` (those the
// connections recorded: RuleLedger); attempts every step and returns the first error.
Status teardown_nic(NicOps& ops, const SetupRecord& rec, const std::vector<uint32_t>& extra_rules = {});

}  // namespace dmx::devmem
