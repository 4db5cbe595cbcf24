// dmx devmem selftest (devmem_selftest.cc): what it takes, and the entry point.
#pragma once

#include <cstddef>
#include <string>

namespace dmx::cli {

struct SelftestArgs {
  std::string ifname, queues, peer_ifname, peer_queues, listen, connect, state_dir = "/run/dmx";
  int gpu = 0;
  size_t size_mib = 64;
  int timeout_s = 60;
};

// Runs every step and prints each with its verdict; 0 only when all passed.
int run_devmem_selftest(const SelftestArgs& a);

}  // namespace dmx::cli
