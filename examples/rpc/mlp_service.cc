// SplitRPC example: an inference-like service (a two-layer perceptron) whose requests' control
// headers go to a CPU handler while their payloads land straight in the work memory. Runs the
// server and a client in one process, on host memory, or on GPU memory given `cuda:0`:
//   rpc_mlp_service [host|cuda:N] [cpu|batch|gpu]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "dmx/dmx.h"
#include "rpc/client.h"
#include "rpc/server.h"
#include "rpc/service.h"

static int fail(const dmx::Status& s) {
  std::fprintf(stderr, "rpc_mlp_service failed: %s\n", s.to_string().c_str());
  return 1;
}

int main(int argc, char** argv) {
  using namespace dmx;
  auto mem = parse_mem_spec(argc > 1 ? argv[1] : "host");
  if (!mem.ok()) return fail(mem.status());
  if (Status s = mem_available(*mem); !s.ok()) {
    std::printf("rpc_mlp_service: skipped: %s\n", s.to_string().c_str());
    return 0;
  }
  auto mode = rpc::parse_mode(argc > 2 ? argv[2] : "cpu");
  if (!mode.ok()) return fail(mode.status());

  // The server: a pool of 2 clients x 8 slots of 64 KiB in the chosen memory.
  auto ctx = Context::create();  // settings: DMX_* environment (the auth key in ~/.config/dmx)
  if (!ctx.ok()) return fail(ctx.status());
  rpc::ServerConfig config;
  config.pool = rpc::PoolShape{*mem, 2, 8, 64 << 10};
  config.orchestration.mode = *mode;
  auto server = rpc::Server::start(*ctx, "tcp://127.0.0.1:0", config);
  if (!server.ok()) return fail(server.status());

  // A client asks for 32 samples of 64 floats; the answer is 16 floats per sample.
  auto client = rpc::Client::connect(*ctx, (*server)->address());
  if (!client.ok()) return fail(client.status());
  const size_t samples = 32;
  std::vector<float> x(samples * rpc::kMlpIn), y(samples * rpc::kMlpOut), want(y.size());
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& v : x) v = dist(rng);
  auto n = (*client)->call(rpc::Method::kMlp, {x.data(), x.size() * 4, {}}, {y.data(), y.size() * 4, {}},
                           std::chrono::seconds(10));
  if (!n.ok()) return fail(n.status());
  rpc::run_host(rpc::Method::kMlp, reinterpret_cast<const unsigned char*>(x.data()), x.size() * 4,
                reinterpret_cast<unsigned char*>(want.data()));
  for (size_t i = 0; i < y.size(); ++i)
    if (std::fabs(y[i] - want[i]) > 1e-3f) return fail(Status(Code::kInternal, "the answer differs from the host's"));
  std::printf("rpc_mlp_service: %zu samples on %s in %s mode over %s, answers verified (y[0] = %.4f)\n", samples,
              to_string(*mem).c_str(), std::string(rpc::mode_name(*mode)).c_str(), (*client)->transport().c_str(), y[0]);
  return 0;
}
