// dmx rpc bench: closed-loop load against a SplitRPC server or the gRPC baseline.
#pragma once

#include <cstdint>
#include <string>

#include "dmx/context.h"
#include "rpc/header.h"

namespace dmx::cli::rpcbench {

struct Load {
  uint32_t clients = 2, depth = 4;  // connections, and calls in flight on each
  size_t payload = 64 << 10;
  double seconds = 2.0, warmup = 0.3;
  bool verify = false;
  rpc::Method method = rpc::Method::kVecop;
};

struct Row {
  std::string system, transport, mem;
  size_t payload_bytes = 0;
  uint64_t requests = 0, errors = 0, wrong = 0;
  double req_per_s = 0, p50_us = 0, p99_us = 0;
  std::string first_error;
};

// Runs the load against the SplitRPC server at `address` (clients made with `ctx`).
Result<Row> run_dmx(Context ctx, const std::string& address, const Load& load);
// Runs the load against a gRPC server at `target` ("host:port").
Result<Row> run_grpc(const std::string& target, const Load& load);

}  // namespace dmx::cli::rpcbench
