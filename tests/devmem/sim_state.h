// SimNic's shared state (socket_double.cc: bindings, devmem RX/TX; sim_zcrx.cc: zcrx ifqs).
#pragma once

#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <vector>

#include "devmem/kernel_double.h"
#include "devmem/socket_double.h"

namespace dmx::devmem::testing {

inline constexpr uint32_t kPage = 4096;

struct SimNic::State {
  explicit State(SimNicOptions o) : opt(std::move(o)), rng(opt.seed) {}
  SimNicOptions opt;
  mutable std::mutex mu;
  std::mt19937_64 rng;

  struct Export {
    MemRegion memory;
  };
  std::map<int, Export> exports;  // memfd stand-in fd -> what it exports
  struct Bound {
    MemRegion memory;
    bool rx;
  };
  std::map<uint32_t, Bound> bindings;
  uint32_t next_id = 7;
  BindModel nic;  // ifindex 1000, 16 queues; `bound` holds the queues of live RX bindings and zcrx ifqs

  // RX pages of the current RX binding (one pool per SimNic).
  uint32_t rx_id = 0;
  std::vector<uint32_t> free_pages;
  std::map<uint32_t, uint32_t> tokens;  // token -> page
  std::set<uint32_t> free_tokens;
  uint32_t next_token = 0;

  uint32_t corrupt_id = 0;
  bool corrupt_offset = false, corrupt_token = false, plain_next = false;
  size_t unknown_returns = 0, reused = 0, frags = 0, linear = 0, sends = 0, etoosmall = 0;

  // zcrx (sim_zcrx.cc): fault for the next CQE, and accounting over every ifq of this NIC.
  ZcrxFault zcrx_fault = ZcrxFault::kNone;
  size_t zcrx_ifqs = 0, zcrx_cqes = 0, zcrx_held = 0, zcrx_refilled = 0, zcrx_bad_refills = 0, zcrx_ends = 0;

  uint32_t alloc_token() {
    if (!free_tokens.empty()) {
      uint32_t t = *free_tokens.begin();
      free_tokens.erase(free_tokens.begin());
      return t;
    }
    return next_token++;
  }
  void free_page(uint32_t page) {
    auto it = bindings.find(rx_id);
    if (it != bindings.end())
      std::memset(static_cast<uint8_t*>(it->second.memory.ptr) + size_t{page} * kPage, 0xEE, kPage);
    free_pages.push_back(page);
  }
};


// SimNic::seams().zcrx: the zcrx double over the real socket `sock_fd` (sim_zcrx.cc).
Result<std::unique_ptr<ZcrxKernel>> open_sim_zcrx(std::shared_ptr<SimNic::State> st, int ifindex, uint32_t queue,
                                                  int sock_fd, int dmabuf_fd, uint64_t dmabuf_size,
                                                  uint32_t rq_entries);

}  // namespace dmx::devmem::testing
