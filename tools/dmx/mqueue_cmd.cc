// dmx mqueue bench — Lynx (dispatcher + message queues + persistent workers) against the
// host-centric baseline (a server thread per request: copy in, start the worker, copy out), over
// UDP and TCP, with closed-loop clients; one JSON row per system, protocol and payload size.
#include <fmt/format.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "mqueue/host_centric.h"
#include "mqueue/load.h"
#include "mqueue/server.h"
#include "tools/dmx/commands.h"

namespace dmx::cli {
namespace {

using namespace dmx::mqueue;

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

struct Args {
  bool loopback = false, json = false;
  std::string listen, connect, mem = "host", proto = "udp,tcp", systems = "lynx,host-centric";
  std::string payload = "64,784,4096", policy = "rr";
  uint32_t clients = 8, workers = 2, slots = 64, gpu_threads = 128;
  double seconds = 2;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

Result<uint32_t> parse_size(const std::string& s) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) return Status(Code::kInvalidArgument, "bad size '" + s + "'");
  if (*end == 'K' || *end == 'k') v <<= 10, ++end;
  else if (*end == 'M' || *end == 'm') v <<= 20, ++end;
  if (*end != '\0' || v > kMaxPayload) return Status(Code::kInvalidArgument, "bad size '" + s + "' (at most 16M)");
  return static_cast<uint32_t>(v);
}

double process_cpu() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

// A running server of either system, on one port for UDP and TCP.
struct AnyServer {
  std::unique_ptr<Server> lynx;
  std::unique_ptr<HostCentricServer> baseline;
  std::string address(bool udp, bool dmx = false) const {
    if (lynx && dmx) return lynx->dispatcher().dmx_address();
    if (lynx) return udp ? lynx->dispatcher().udp_address() : lynx->dispatcher().tcp_address();
    return udp ? baseline->udp_address() : baseline->tcp_address();
  }
  void stop() {
    if (lynx) (void)lynx->stop();
    if (baseline) baseline->stop();
  }
};

// `proto` dmx: the dispatcher's dmx face (two-sided); remote: every worker's ring a remote queue.
Result<AnyServer> start_server(const Args& a, const std::string& system, MemSpec mem, uint32_t max_payload,
                               const std::string& bind_udp, const std::string& bind_tcp, const std::string& proto = "") {
  AnyServer s;
  if (system == "lynx" || system == "lynx-sync") {
    ServerConfig c;
    c.stream_writes = system == "lynx";  // lynx-sync: every write into GPU memory by dmx::copy_memory
    c.geometry.workers = a.workers;
    if (proto == "dmx" || proto == "remote") c.dispatch.dmx = "tcp://127.0.0.1:0";
    if (proto == "remote") c.dispatch.remote_queues = a.workers;
    c.geometry.slots = a.slots;
    c.geometry.max_request = c.geometry.max_response = max_payload;
    c.memory = mem;
    c.gpu_threads = a.gpu_threads;
    c.dispatch.udp = bind_udp;
    c.dispatch.tcp = bind_tcp;
    c.dispatch.policy = a.policy == "ll" ? Policy::kLeastLoaded : Policy::kRoundRobin;
    DMX_ASSIGN_OR_RETURN(s.lynx, Server::start(c));
  } else if (system == "host-centric") {
    BaselineConfig c;
    c.udp = bind_udp;
    c.tcp = bind_tcp;
    c.memory = mem;
    c.max_request = max_payload;
    c.udp_threads = a.workers;  // as many servers as Lynx has workers: a fair comparison
    DMX_ASSIGN_OR_RETURN(s.baseline, HostCentricServer::start(c));
  } else {
    return Status(Code::kInvalidArgument, "unknown system '" + system + "' (lynx, lynx-sync, host-centric)");
  }
  return s;
}

nlohmann::json row(const std::string& system, const std::string& proto, const Args& a, uint32_t size,
                   const LoadResult& r, double server_cpu) {
  nlohmann::json j;
  j["system"] = (system == "host-centric" ? "host-centric-" : "dmx-" + system + "-") + proto;
  j["proto"] = proto;
  j["mem"] = a.mem;
  j["payload_bytes"] = size;
  j["clients"] = a.clients;
  j["workers"] = a.workers;
  j["req_per_s"] = r.seconds > 0 ? static_cast<double>(r.ok) / r.seconds : 0.0;
  j["p50_us"] = r.percentile(50);
  j["p99_us"] = r.percentile(99);
  j["responses_ok"] = r.ok;
  j["responses_bad"] = r.bad;
  j["responses_lost"] = r.lost;
  if (server_cpu >= 0 && r.ok > 0) j["server_cpu_us_per_req"] = server_cpu * 1e6 / static_cast<double>(r.ok);
  if (!r.first_error.empty()) j["first_error"] = r.first_error;
  return j;
}

void print(const nlohmann::json& j, bool json) {
  if (json) {
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("{:<22} {:>8} B  {:>10.0f} req/s  p50 {:>8.1f} us  p99 {:>8.1f} us  ok {} bad {} lost {}{}\n",
               j["system"].get<std::string>(), j["payload_bytes"].get<uint32_t>(), j["req_per_s"].get<double>(),
               j["p50_us"].get<double>(), j["p99_us"].get<double>(), j["responses_ok"].get<uint64_t>(),
               j["responses_bad"].get<uint64_t>(), j["responses_lost"].get<uint64_t>(),
               j.contains("server_cpu_us_per_req")
                   ? fmt::format("  server cpu {:.1f} us/req", j["server_cpu_us_per_req"].get<double>())
                   : "");
  }
  std::fflush(stdout);
}

LoadConfig load_for(const Args& a, const std::string& address, const std::string& proto, uint32_t size) {
  LoadConfig l;
  l.address = address;
  l.udp = proto == "udp";
  l.clients = a.clients;
  if (proto == "dmx") l.face = LoadConfig::Face::kDmx;
  if (proto == "remote") {
    // One queue per worker, holding the clients' requests between them: as many outstanding as
    // --clients closed-loop clients would have.
    l.face = LoadConfig::Face::kRemote;
    l.clients = std::min(a.clients, a.workers);
    l.depth = std::min(a.slots, (a.clients + l.clients - 1) / l.clients);
  }
  l.duration = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(a.seconds));
  l.sizes = {size};
  l.seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  l.timeout = std::chrono::seconds(1);
  return l;
}

int run(const Args& a) {
  auto mem = parse_mem_spec(a.mem);
  if (!mem.ok()) return fmt::print(stderr, "dmx mqueue bench: {}\n", mem.status().to_string()), 2;
  std::vector<uint32_t> sizes;
  for (const auto& s : split(a.payload)) {
    auto v = parse_size(s);
    if (!v.ok()) return fmt::print(stderr, "dmx mqueue bench: --payload: {}\n", v.status().to_string()), 2;
    sizes.push_back(*v);
  }
  std::vector<std::string> protos = split(a.proto), systems = split(a.systems);
  for (const auto& p : protos) {
    if (p != "udp" && p != "tcp" && p != "dmx" && p != "remote")
      return fmt::print(stderr, "dmx mqueue bench: --proto {}: udp, tcp, dmx or remote\n", p), 2;
    if ((p == "dmx" || p == "remote") && !a.loopback)
      return fmt::print(stderr, "dmx mqueue bench: --proto {} runs with --loopback only\n", p), 2;
  }
  const uint32_t max_payload = sizes.empty() ? 64 : *std::max_element(sizes.begin(), sizes.end());
  int modes = a.loopback + !a.listen.empty() + !a.connect.empty();
  if (modes != 1) return fmt::print(stderr, "dmx mqueue bench: give one of --loopback, --listen, --connect\n"), 2;

  // The other side runs one system: name it (rows are labelled with it).
  if (!a.loopback && systems.size() != 1)
    return fmt::print(stderr, "dmx mqueue bench --listen/--connect: give one --system\n"), 2;
  if (!a.listen.empty()) {  // serve until Ctrl-C
    auto s = start_server(a, systems[0], *mem, max_payload, a.listen, a.listen);
    if (!s.ok()) return fmt::print(stderr, "dmx mqueue bench: {}\n", s.status().to_string()), 1;
    fmt::print(stderr, "dmx mqueue bench: {} serving on udp {} and tcp {}; Ctrl-C ends\n", systems[0],
               s->address(true), s->address(false));
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    s->stop();
    return 0;
  }
  int rc = 0;
  for (const auto& system : systems) {
    for (const auto& proto : protos) {
      const bool dmx_face = proto == "dmx" || proto == "remote";
      if (dmx_face && system == "host-centric") continue;  // the baseline speaks sockets only
      for (uint32_t size : sizes) {
        const bool udp = proto == "udp";
        if (!a.connect.empty()) {
          auto r = run_load(load_for(a, a.connect, proto, size));
          if (!r.ok()) return fmt::print(stderr, "dmx mqueue bench: {}\n", r.status().to_string()), 1;
          print(row(system, proto, a, size, *r, -1), a.json);
          rc |= r->bad ? 1 : 0;
          continue;
        }
        auto s = start_server(a, system, *mem, max_payload, udp ? "127.0.0.1:0" : "",
                              udp || dmx_face ? "" : "127.0.0.1:0", proto);
        if (!s.ok()) return fmt::print(stderr, "dmx mqueue bench: {}\n", s.status().to_string()), 1;
        const double cpu0 = process_cpu();
        auto r = run_load(load_for(a, s->address(udp, dmx_face), proto, size));
        const double cpu = process_cpu() - cpu0;
        s->stop();
        if (!r.ok()) return fmt::print(stderr, "dmx mqueue bench: {}\n", r.status().to_string()), 1;
        // dmx faces: the clients' dmx threads run in this process too, so its CPU time is not the
        // server's alone: no CPU figure.
        print(row(system, proto, a, size, *r, dmx_face ? -1 : cpu - r->client_cpu_seconds), a.json);
        rc |= r->bad ? 1 : 0;
      }
    }
  }
  return rc;
}

}  // namespace

void add_mqueue_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("mqueue", "Lynx-style server with message queues in worker memory");
  cmd->require_subcommand(1);
  auto* bench = cmd->add_subcommand("bench", "Lynx vs a host-centric server: req/s, p50/p99, server CPU per request");
  bench->add_flag("--loopback", args->loopback, "server and clients in this process on 127.0.0.1");
  bench->add_option("--listen", args->listen, "serve on HOST:PORT (UDP and TCP) until Ctrl-C");
  bench->add_option("--connect", args->connect, "load a server at HOST:PORT");
  bench->add_option("--mem", args->mem, "worker memory: host (CPU workers) or cuda:N (GPU kernel)");
  bench->add_option("--proto", args->proto,
                    "udp,tcp (raw sockets); dmx (dmx endpoints), remote (remote queues: one-sided writes); "
                    "dmx and remote: Lynx only, --loopback only");
  bench->add_option("--system", args->systems,
                    "lynx,host-centric (lynx-sync: GPU queue writes by dmx::copy_memory, waited for)");
  bench->add_option("--payload", args->payload, "payload sizes, e.g. 64,784,4K");
  bench->add_option("--clients", args->clients, "closed-loop clients, one request outstanding each");
  bench->add_option("--workers", args->workers, "Lynx workers (CPU threads or GPU thread blocks)");
  bench->add_option("--slots", args->slots, "Lynx queue slots per worker (power of two)");
  bench->add_option("--policy", args->policy, "Lynx dispatch: rr (round-robin) or ll (least-loaded)");
  bench->add_option("--gpu-threads", args->gpu_threads, "threads per GPU worker block");
  bench->add_option("--seconds", args->seconds, "seconds per row");
  bench->add_flag("--json", args->json, "one JSON object per line");
  bench->callback([args, exit_code] { *exit_code = run(*args); });
}

}  // namespace dmx::cli
