// dmx rpc bench — SplitRPC (docs/rpc.md) against a host-centric gRPC server doing the same work.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/units.h"
#include "rpc/grpc/baseline.h"
#include "rpc/server.h"
#include "tools/dmx/commands.h"
#include "tools/dmx/rpc_bench.h"

namespace dmx::cli {
namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

struct RpcArgs {
  bool loopback = false, json = false, verify = false;
  std::string listen, connect, mem = "host", payload = "64K", modes = "cpu", baseline, method = "vecop";
  std::string transport, streams, slot_size;  // settings' flags: empty when not given (commands.h)
  uint32_t clients = 2, depth = 4, slots = 16, max_batch = 16;
  double seconds = 2.0;
  std::vector<std::string> options;
};

// `slot`: the pool's slot size. A response up to it goes as one eager frame (no RTS/CTS round trip
// per call) unless --option eager_limit says otherwise; the eager limit is at most the chunk size.
Result<Options> options_of(const RpcArgs& a, uint64_t slot) {
  Options o;
  DMX_RETURN_IF_ERROR(add_option_values(o, a.options));
  if (!o.values().count("eager_limit")) {
    uint64_t chunk = 1 << 20;  // the default chunk_size
    if (auto it = o.values().find("chunk_size"); it != o.values().end())
      if (auto c = parse_size(it->second); c.ok()) chunk = *c;
    o.set("eager_limit", std::to_string(std::clamp<uint64_t>(slot, 16 << 10, chunk)));
  }
  // This command's own defaults: one stream, and tcp (loopback like gRPC; shm costs a thread per
  // endpoint); below DMX_STREAMS and DMX_TRANSPORT, as every default.
  o.set_default("streams", "1", "dmx rpc bench default");
  o.set_default("transport", "tcp", "dmx rpc bench default");
  if (!a.streams.empty()) o.set("streams", a.streams, "flag --streams");
  if (!a.transport.empty()) o.set("transport", a.transport, "flag --transport");
  add_log_level(o);
  return o;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

void print(const rpcbench::Row& r, const RpcArgs& a, std::string_view mode) {
  if (a.json) {
    nlohmann::json j{{"system", r.system}, {"payload_bytes", r.payload_bytes}, {"req_per_s", r.req_per_s},
                     {"p50_us", r.p50_us}, {"p99_us", r.p99_us}, {"requests", r.requests}, {"errors", r.errors},
                     {"mem", a.mem}, {"clients", a.clients}, {"depth", a.depth}, {"transport", r.transport},
                     {"method", a.method}};
    if (a.verify) j["wrong"] = r.wrong;
    if (!r.first_error.empty()) j["first_error"] = r.first_error;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("{:<22} {:>9} B {:>11.0f} req/s  p50 {:>8.1f} us  p99 {:>8.1f} us  errors {}{}  [{}]\n", r.system,
               r.payload_bytes, r.req_per_s, r.p50_us, r.p99_us, r.errors,
               a.verify ? fmt::format("  wrong {}", r.wrong) : "", r.transport);
  }
  if (!r.first_error.empty()) fmt::print(stderr, "dmx rpc bench: {}: first error: {}\n", r.system, r.first_error);
}

Result<rpc::ServerConfig> server_config(const RpcArgs& a, rpc::Mode mode, uint32_t slot_size) {
  rpc::ServerConfig c;
  DMX_ASSIGN_OR_RETURN(c.pool.mem, parse_mem_spec(a.mem));
  c.pool.clients = std::max<uint32_t>(a.clients, 1) + 2;  // room for a reconnecting client
  c.pool.slots = std::max(a.slots, a.depth);
  c.pool.slot_size = slot_size;
  c.orchestration.mode = mode;
  c.orchestration.max_batch = a.max_batch;
  return c;
}

int run(const RpcArgs& a) {
  if (int(a.loopback) + int(!a.listen.empty()) + int(!a.connect.empty()) != 1)
    return fmt::print(stderr, "dmx rpc bench: give one of --loopback, --listen ADDR, --connect ADDR\n"), 2;
  auto payload = parse_size(a.payload);
  if (!payload.ok() || *payload > (64u << 20))
    return fmt::print(stderr, "dmx rpc bench: --payload: a size up to 64M\n"), 2;
  uint64_t slot = *payload;
  if (!a.slot_size.empty()) {
    auto s = parse_size(a.slot_size);
    if (!s.ok() || *s < *payload || *s > (64u << 20))
      return fmt::print(stderr, "dmx rpc bench: --slot-size: at least the payload, at most 64M\n"), 2;
    slot = *s;
  }
  slot = std::max<uint64_t>(slot, 1);
  rpcbench::Load load;
  load.clients = a.clients;
  load.depth = a.depth;
  load.payload = *payload;
  load.seconds = a.seconds;
  load.verify = a.verify;
  load.method = a.method == "mlp" ? rpc::Method::kMlp : rpc::Method::kVecop;
  if (!a.baseline.empty()) {
    if (a.baseline != "grpc") return fmt::print(stderr, "dmx rpc bench: --baseline: only grpc\n"), 2;
    if (!a.loopback) return fmt::print(stderr, "dmx rpc bench: --baseline grpc runs with --loopback only\n"), 2;
    if (Status s = rpc::grpcb::available(); !s.ok())
      return fmt::print(stderr, "dmx rpc bench: --baseline grpc is unavailable: {}\n", s.message()), 2;
  }
  std::vector<rpc::Mode> modes;
  for (const auto& m : split(a.modes)) {
    auto mode = rpc::parse_mode(m);
    if (!mode.ok()) return fmt::print(stderr, "dmx rpc bench: --mode: {}\n", mode.status().message()), 2;
    modes.push_back(*mode);
  }
  auto opts = options_of(a, slot);
  if (!opts.ok()) return fmt::print(stderr, "dmx rpc bench: {}\n", opts.status().message()), 2;
  auto ctx = Context::create(*opts);
  if (!ctx.ok())
    return fmt::print(stderr, "dmx rpc bench: {}\n", ctx.status().to_string()),
           ctx.status().code() == Code::kInvalidArgument ? 2 : 1;

  if (!a.listen.empty()) {  // serve until interrupted (or --seconds, when given with --listen)
    auto cfg = server_config(a, modes.at(0), static_cast<uint32_t>(slot));
    if (!cfg.ok()) return fmt::print(stderr, "dmx rpc bench: {}\n", cfg.status().to_string()), 2;
    auto server = rpc::Server::start(*ctx, a.listen, *cfg);
    if (!server.ok()) return fmt::print(stderr, "dmx rpc bench: {}\n", server.status().to_string()), 1;
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    fmt::print(stderr, "dmx rpc bench: serving {} mode on {} ({}), Ctrl-C to stop\n", rpc::mode_name(modes[0]),
               (*server)->address(), a.mem);
    while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (*server)->stop();
    return 0;
  }
  int rc = 0;
  for (rpc::Mode mode : modes) {
    std::unique_ptr<rpc::Server> server;
    std::string address = a.connect;
    if (a.loopback) {
      auto cfg = server_config(a, mode, static_cast<uint32_t>(slot));
      if (!cfg.ok()) return fmt::print(stderr, "dmx rpc bench: {}\n", cfg.status().to_string()), 2;
      auto s = rpc::Server::start(*ctx, "tcp://127.0.0.1:0", *cfg);
      if (!s.ok()) return fmt::print(stderr, "dmx rpc bench: {}\n", s.status().to_string()), 1;
      server = std::move(*s);
      address = server->address();
    }
    auto row = rpcbench::run_dmx(*ctx, address, load);
    if (!row.ok()) return fmt::print(stderr, "dmx rpc bench: {}\n", row.status().to_string()), 1;
    row->system = fmt::format("dmx-splitrpc-{}", rpc::mode_name(mode));
    print(*row, a, rpc::mode_name(mode));
    if (row->errors > 0 || row->wrong > 0) rc = 1;
    if (server) server->stop();
  }
  if (a.baseline == "grpc") {
    auto mem = parse_mem_spec(a.mem);
    if (!mem.ok()) return fmt::print(stderr, "dmx rpc bench: --mem: {}\n", mem.status().message()), 2;
    auto gs = rpc::grpcb::Server::start("127.0.0.1:0", *mem, static_cast<uint32_t>(slot),
                                        static_cast<int>(a.clients * a.depth));
    if (!gs.ok()) return fmt::print(stderr, "dmx rpc bench: grpc: {}\n", gs.status().to_string()), 1;
    auto row = rpcbench::run_grpc((*gs)->target(), load);
    (*gs)->stop();
    if (!row.ok()) return fmt::print(stderr, "dmx rpc bench: grpc: {}\n", row.status().to_string()), 1;
    row->system = "grpc";
    print(*row, a, "grpc");
    if (row->errors > 0 || row->wrong > 0) rc = 1;
  }
  return rc;
}

}  // namespace

void add_rpc_command(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<RpcArgs>();
  CLI::App* rpc = app.add_subcommand("rpc", "SplitRPC: control to the CPU, payload straight into the work memory");
  rpc->require_subcommand(1);
  CLI::App* b = rpc->add_subcommand("bench", "closed-loop requests/s and latency, against a gRPC baseline");
  b->add_flag("--loopback", a->loopback, "server and clients in this process");
  b->add_option("--listen", a->listen, "serve on ADDR (tcp://host:port) until interrupted (first --mode)");
  b->add_option("--connect", a->connect, "load a server at ADDR (give the server's --mode for the row's name)");
  b->add_option("--mem", a->mem, "the server's work memory: host | cuda[:N] (default host)");
  b->add_option("--payload", a->payload, "request payload size, e.g. 64K (default 64K)");
  b->add_option("--slot-size", a->slot_size, "pool slot size (default: the payload size)");
  b->add_option("--mode", a->modes, "cpu | batch | gpu | graph, or a comma list (default cpu)");
  b->add_option("--method", a->method, "vecop | mlp (default vecop)")->check(CLI::IsMember({"vecop", "mlp"}));
  b->add_option("--baseline", a->baseline, "grpc: also run a gRPC server doing the same work (--loopback)");
  b->add_option("--clients", a->clients, "connections (default 2)")->check(CLI::Range(1, 64));
  b->add_option("--depth", a->depth, "calls in flight per connection (default 4)")->check(CLI::Range(1, 256));
  b->add_option("--slots", a->slots, "pool slots per client (default 16, at least --depth)")->check(CLI::Range(1, 4096));
  b->add_option("--max-batch", a->max_batch, "batch mode: requests per launch (default 16)")->check(CLI::Range(1, 1024));
  b->add_option("--seconds", a->seconds, "measured time per system (default 2; 0.3 s warm-up before)");
  b->add_option("--streams", a->streams, "dmx TCP streams per endpoint, 1-64 (default 1)");
  b->add_option("--transport", a->transport,
                "dmx data path: tcp (default: loopback like gRPC; shm costs a thread per endpoint) | auto | shm");
  b->add_option("--option", a->options, "any dmx setting as NAME=VALUE (see dmx probe --config)");
  b->add_flag("--verify", a->verify, "compare every response with the host computation");
  b->add_flag("--json", a->json, "one JSON object per line per system");
  b->callback([a, exit_code] { *exit_code = run(*a); });
}

}  // namespace dmx::cli
