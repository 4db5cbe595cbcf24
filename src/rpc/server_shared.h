// rpc/server_shared.h — what a server's connections share. Internal to src/rpc.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "rpc/orchestrator.h"
#include "rpc/pool.h"
#include "rpc/server.h"

namespace dmx::rpc {

struct ServerShared {
  ServerConfig config;
  std::unique_ptr<Pool> pool;
  std::unique_ptr<Orchestrator> orchestrator;
  std::atomic<uint64_t> accepted{0}, requests{0}, error_responses{0}, refused{0}, disconnects{0};
  std::mutex mu;  // guards last_refusal; wake is notified under it
  std::string last_refusal;
  std::condition_variable wake;  // a connection died: the reaper should look

  void warn(const std::string& line) {
    if (!config.quiet) std::fprintf(stderr, "dmx rpc: %s\n", line.c_str());
  }
  void note_refusal(const std::string& line) {
    ++refused;
    warn(line);
    std::lock_guard<std::mutex> lock(mu);
    last_refusal = line;
    wake.notify_all();
  }
  void note_dead() {
    std::lock_guard<std::mutex> lock(mu);
    wake.notify_all();
  }
};

}  // namespace dmx::rpc
