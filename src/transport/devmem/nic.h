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
#pragma once

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

struct FlowRule {  // tcp4 only for now
  uint32_t dst_ip = 0;    // network byte order
  uint16_t dst_port = 0;  // host byte order
  uint32_t src_ip = 0;    // 0: any
  uint16_t src_port = 0;  // 0: any
  uint32_t queue = 0;
};

class NicOps {
 public:
  virtual ~NicOps() = default;
  virtual Result<NicState> read(const std::string& ifname) = 0;
  virtual Status set_header_split(const std::string& ifname, uint8_t tcp_data_split, std::optional<uint32_t> hds_thresh) = 0;
  virtual Status set_ntuple(const std::string& ifname, bool on) = 0;
  virtual Status set_rss_indir(const std::string& ifname, const std::vector<uint32_t>& table) = 0;
  virtual Result<uint32_t> add_flow_rule(const std::string& ifname, const FlowRule& rule) = 0;  // its location
  virtual Status delete_flow_rule(const std::string& ifname, uint32_t location) = 0;
};

// ethtool ioctl (SIOCETHTOOL) and ethtool netlink (rings: header split).
std::unique_ptr<NicOps> make_kernel_nic_ops();

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
// Restores everything `rec` changed; attempts every step and returns the first error.
Status teardown_nic(NicOps& ops, const SetupRecord& rec);

}  // namespace dmx::devmem
