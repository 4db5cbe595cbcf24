// The flow rules dmx connections installed on one NIC, kept in a file so that a crash leaves a
// record `dmx devmem teardown` acts on: it removes exactly these locations, never someone else's.
//
// One line per rule: "<location> <pid>". Every change rereads and rewrites the file (write to a
// temporary, rename) under flock(LOCK_EX) on a lock file beside it, so processes sharing the NIC
// never lose each other's lines. A rule is recorded right after the driver accepted it (a crash
// in between leaves one unrecorded rule; ethtool -n shows it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dmx/status.h"

namespace dmx::devmem {

class RuleLedger {
 public:
  explicit RuleLedger(std::string path) : path_(std::move(path)) {}
  // <state_dir>/devmem-<ifname>.rules
  static std::string path_for(const std::string& state_dir, const std::string& ifname);

  const std::string& path() const { return path_; }
  Status add(uint32_t location);
  Status remove(uint32_t location);
  // Every recorded location (an absent file: none). Malformed lines are an error, not skipped.
  Result<std::vector<uint32_t>> list() const;
  // Forgets `locations` (after teardown removed them).
  Status forget(const std::vector<uint32_t>& locations);

 private:
  std::string path_;
};

}  // namespace dmx::devmem
