// dmx bench — the main job: measure transfers, side by side with what the peer sees.
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <nlohmann/json.hpp>
#include <memory>
#include <thread>
#include <vector>

#include "core/config.h"
#include "core/units.h"
#include "memory/backend.h"
#include "tools/dmx/bench.h"
#include "tools/dmx/bench_report.h"
#include "tools/dmx/commands.h"
#include "tools/dmx/metrics_http.h"

namespace dmx::cli {
namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

struct Args {
  bool loopback = false, json = false, verify = false, insecure = false;
  std::string listen, connect, mem, peer_mem, op = "send";
  // Flags of settings: empty when not given, so that --option, DMX_<NAME> and the default decide
  // (commands.h); given, they win.
  std::string transport, checksum, gpu_push;
  std::string sizes, min_bytes, max_bytes, step_factor;  // empty: not given
  std::string chunk, cuda_alloc = "cudamalloc";
  std::string streams;  // empty: not given; else passed on as given, for the library to judge
  uint32_t iters = 0, window = 0;
  std::string blocks, block_size;  // --blocks N --block-size S: the KV-cache block run (bench_blocks.cc)
  std::vector<std::string> options;
  int metrics_port = -1;  // --listen: serve GET /metrics (metrics_http.h); -1: not
  std::string idle_timeout = "60s";  // --listen: a session idle this long ends (bench::serve)
};

double cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

Result<Options> make_options(const Args& a) {
  Options o;
  DMX_RETURN_IF_ERROR(add_option_values(o, a.options));
  if (!a.streams.empty()) o.set("streams", a.streams, "flag --streams");
  if (!a.chunk.empty()) o.set("chunk_size", a.chunk, "flag --chunk-size");
  if (!a.transport.empty()) o.set("transport", a.transport, "flag --transport");
  if (a.insecure) o.set("insecure", "true", "flag --insecure");
  if (!a.checksum.empty()) o.set("checksum", a.checksum, "flag --checksum");
  if (!a.gpu_push.empty()) o.set("gpu_push", a.gpu_push, "flag --gpu-push");
  add_log_level(o);
  return o;
}

// Default memory: GPU memory when a GPU is present, else host memory. In loopback with two GPUs
// the peer uses the second one.
Status pick_memory(const Args& a, bench::ClientOptions& co) {
  auto gpus = cuda_device_count();
  int n = gpus.ok() ? *gpus : 0;
  if (a.mem.empty()) co.mem = n > 0 ? MemSpec{MemKind::kCuda, 0} : MemSpec{MemKind::kHost, 0};
  else {
    DMX_ASSIGN_OR_RETURN(co.mem, parse_mem_spec(a.mem));
  }
  if (a.peer_mem.empty()) {
    co.peer_mem = co.mem;
    if (co.mem.kind == MemKind::kCuda && n > 1) co.peer_mem.device = (co.mem.device + 1) % n;
  } else {
    DMX_ASSIGN_OR_RETURN(co.peer_mem, parse_mem_spec(a.peer_mem));
  }
  return mem_available(co.mem);
}

// --cuda-alloc: cudamalloc, or cumem[:BLOCK] (cuMem allocations of BLOCK bytes, default 20M: the
// block PyTorch's expandable segments use for large tensors).
Status pick_alloc(const Args& a, bench::ClientOptions& co) {
  if (a.cuda_alloc == "cudamalloc") return Status();
  if (a.cuda_alloc != "cumem" && !a.cuda_alloc.starts_with("cumem:"))
    return Status(Code::kInvalidArgument, fmt::format("'{}': expected cudamalloc or cumem[:BLOCK]", a.cuda_alloc));
  co.cumem_block = 20 << 20;
  if (a.cuda_alloc.size() > 6) {
    DMX_ASSIGN_OR_RETURN(co.cumem_block, parse_size(a.cuda_alloc.substr(6)));
  }
  if (co.cumem_block == 0) return Status(Code::kInvalidArgument, "cumem block of 0 bytes");
  if (co.mem.kind != MemKind::kCuda)
    return Status(Code::kInvalidArgument,
                  fmt::format("cumem needs GPU memory (--mem cuda[:N]), not {}{}", to_string(co.mem),
                              a.mem.empty() ? " (the default where no GPU is usable: see dmx probe)" : ""));
  return Status();
}

constexpr const char* kDefaultSizes = "8,4K,64K,1M,16M,256M";

Result<uint64_t> size_option(const std::string& text, const char* fallback, const char* name) {
  auto v = parse_size(text.empty() ? fallback : text);
  if (!v.ok()) return Status(Code::kInvalidArgument, fmt::format("{}: {}", name, v.status().message()));
  return v;
}

// --sizes, or a range as nccl-tests takes it (-b/-e/-f), never both; neither: kDefaultSizes.
Result<std::vector<uint64_t>> pick_sizes(const Args& a) {
  bool range = !a.min_bytes.empty() || !a.max_bytes.empty() || !a.step_factor.empty();
  if (!range) {
    auto list = bench::parse_size_list(a.sizes.empty() ? kDefaultSizes : a.sizes);
    if (!list.ok()) return Status(Code::kInvalidArgument, "--sizes: " + list.status().message());
    return list;
  }
  if (!a.sizes.empty()) return Status(Code::kInvalidArgument, "give --sizes or -b/-e/-f, not both");
  DMX_ASSIGN_OR_RETURN(uint64_t min, size_option(a.min_bytes, "8", "-b/--min-bytes"));
  DMX_ASSIGN_OR_RETURN(uint64_t max, size_option(a.max_bytes, "256M", "-e/--max-bytes"));
  auto factor = parse_int(a.step_factor.empty() ? "2" : a.step_factor);
  if (!factor.ok() || *factor < 2)
    return Status(Code::kInvalidArgument,
                  fmt::format("-f/--step-factor: expected an integer of 2 or more, got '{}'", a.step_factor));
  return bench::size_range(min, max, static_cast<uint64_t>(*factor));
}

int run_client(Endpoint& ep, const Args& a, bench::ClientOptions co) {
  if (!a.blocks.empty()) {
    auto n = parse_size(a.blocks);
    auto s = parse_size(a.block_size.empty() ? "64K" : a.block_size);
    if (!n.ok() || !s.ok())
      return fmt::print(stderr, "dmx bench: --blocks/--block-size: {}\n",
                        (!n.ok() ? n.status() : s.status()).message()), 2;
    Status st = bench::run_blocks(ep, co, *n, *s, a.iters ? a.iters : 3, a.json);
    if (!st.ok()) return fmt::print(stderr, "dmx bench: {}\n", st.to_string()), 1;
    (void)bench::quit(ep);
    return 0;
  }
  EndpointStats st = ep.stats();
  if (!a.json) bench::print_header(co, st);
  bench::Progress progress(::isatty(1) && ::isatty(2));
  co.phase = &progress.phase;
  int rc = 0;
  for (size_t i = 0; i < co.sizes.size(); ++i) {
    uint64_t size = co.sizes[i];
    progress.begin(i, co.sizes.size(), size);
    double c0 = cpu_seconds();
    auto t0 = std::chrono::steady_clock::now();
    auto r = bench::run_size(ep, co, size);
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    progress.end();
    bench::Result1 row;
    if (r.ok()) {
      row = *r;
    } else {
      row.plan.size = size;
      row.error = r.status().to_string();
      rc = 1;
    }
    row.cpu_pct = wall > 0 ? 100.0 * (cpu_seconds() - c0) / wall : 0;
    if (co.verify && r.ok() && !row.verified) rc = 1;
    if (co.checksum && r.ok() && !row.checksum_ok) rc = 1;
    bench::print_row(row, a.json, co, ep.stats());
    if (!r.ok()) break;  // the endpoint is likely gone
  }
  if (rc == 0) (void)bench::quit(ep);
  return rc;
}

int run(const Args& a) {
  auto options = make_options(a);
  if (!options.ok()) return fmt::print(stderr, "dmx bench: {}\n", options.status().to_string()), 2;
  // Every setting checked (and the effective checksum setting known) before anything runs.
  auto config = Config::resolve(*options);
  if (!config.ok()) return fmt::print(stderr, "dmx bench: {}\n", config.status().to_string()), 2;
  auto ctx = Context::create(*options);
  if (!ctx.ok()) return fmt::print(stderr, "dmx bench: {}\n", ctx.status().to_string()), 2;
  int modes = a.loopback + !a.listen.empty() + !a.connect.empty();
  if (modes != 1) return fmt::print(stderr, "dmx bench: give exactly one of --loopback, --listen, --connect\n"), 2;

  if (a.metrics_port >= 0 && a.listen.empty()) return fmt::print(stderr, "dmx bench: --metrics-port needs --listen\n"), 2;

  if (!a.listen.empty()) {
    auto idle = parse_duration(a.idle_timeout);
    if (!idle.ok() || idle->count() <= 0)
      return fmt::print(stderr, "dmx bench: --idle-timeout '{}': expected a positive duration\n", a.idle_timeout), 2;
    auto l = ctx->listen(a.listen);
    if (!l.ok()) return fmt::print(stderr, "dmx bench: {}\n", l.status().to_string()), 1;
    std::unique_ptr<MetricsServer> metrics;  // destroyed (its thread joined) after the sessions
    if (a.metrics_port >= 0) {
      auto m = MetricsServer::start(*ctx, a.metrics_port);
      if (!m.ok()) return fmt::print(stderr, "dmx bench: {}\n", m.status().to_string()), 2;
      metrics = std::move(*m);
      fmt::print(stderr, "dmx bench: metrics on http://127.0.0.1:{}/metrics\n", metrics->port());
    }
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    fmt::print(stderr, "dmx bench: serving on {} until interrupted\n", l->address());
    // One thread per session, joined here: when it ends, or at the signal after closing its
    // endpoint (which ends the session's wait for the client).
    struct Session {
      std::shared_ptr<Endpoint> ep;
      std::shared_ptr<std::atomic<bool>> done = std::make_shared<std::atomic<bool>>(false);
      std::thread thread;
    };
    std::vector<Session> sessions;
    while (!g_stop.load()) {
      std::erase_if(sessions, [](Session& s) {
        if (!s.done->load()) return false;
        s.thread.join();
        return true;
      });
      auto ep = l->accept(std::chrono::milliseconds(200));
      if (!ep.ok()) continue;
      Session s;
      s.ep = std::make_shared<Endpoint>(std::move(*ep));
      s.thread = std::thread([c = *ctx, e = s.ep, done = s.done, idle = *idle] {
        std::string peer = e->peer();
        Status st = bench::serve(c, *e, idle);
        if (!st.ok()) fmt::print(stderr, "dmx bench: session with {} ended: {}\n", peer, st.to_string());
        done->store(true);
      });
      sessions.push_back(std::move(s));
    }
    for (auto& s : sessions) (void)s.ep->close();
    for (auto& s : sessions) s.thread.join();
    return 0;
  }

  bench::ClientOptions co;
  co.op = a.op;
  co.iters = a.iters;
  co.window = a.window;
  co.verify = a.verify;
  co.checksum = config->get_string("checksum") == "crc32c";
  co.streams_asked = config->get_int("streams");
  if (Status s = pick_memory(a, co); !s.ok()) return fmt::print(stderr, "dmx bench: --mem: {}\n", s.to_string()), 2;
  if (Status s = pick_alloc(a, co); !s.ok())
    return fmt::print(stderr, "dmx bench: --cuda-alloc: {}\n", s.to_string()), 2;
  auto sizes = pick_sizes(a);
  if (!sizes.ok()) return fmt::print(stderr, "dmx bench: {}\n", sizes.status().message()), 2;
  co.sizes = *sizes;

  if (a.loopback) {
    auto l = ctx->listen("tcp://127.0.0.1:0");
    if (!l.ok()) return fmt::print(stderr, "dmx bench: {}\n", l.status().to_string()), 1;
    std::thread server([&] {
      auto ep = l->accept(std::chrono::seconds(30));
      if (ep.ok()) (void)bench::serve(*ctx, *ep);
    });
    auto ep = ctx->connect(l->address());
    int rc = 1;
    if (ep.ok()) rc = run_client(*ep, a, co);
    else fmt::print(stderr, "dmx bench: {}\n", ep.status().to_string());
    if (ep.ok()) (void)ep->close();
    l->close();  // ends the server's wait for a client that never came (a refused forced transport)
    server.join();
    return rc;
  }
  auto ep = ctx->connect(a.connect);
  if (!ep.ok()) return fmt::print(stderr, "dmx bench: {}\n", ep.status().to_string()), 1;
  return run_client(*ep, a, co);
}

}  // namespace

void add_bench_command(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<Args>();
  CLI::App* b = app.add_subcommand("bench", "measure transfers (loopback, or between two processes or hosts)");
  b->add_flag("--loopback", a->loopback, "server and client in this process");
  b->add_option("--listen", a->listen, "serve clients on ADDR (tcp://host:port) until interrupted");
  b->add_option("--connect", a->connect, "run against a server at ADDR");
  b->add_option("--mem", a->mem, "this side's memory: host|pinned|cuda[:N]|sim[:N] (default: cuda:0 if a GPU is present, else host)");
  b->add_option("--peer-mem", a->peer_mem, "the server's memory (default: like --mem; the next GPU when there are two)");
  b->add_option("--cuda-alloc", a->cuda_alloc,
                "this side's CUDA buffers: cudamalloc (default) | cumem[:BLOCK] (cuMem allocations of BLOCK bytes in "
                "one range, as PyTorch's expandable segments; default block 20M)");
  b->add_option("--op", a->op, "send (two-sided) | write | read (one-sided)")->check(CLI::IsMember({"send", "write", "read"}));
  b->add_option("--transport", a->transport, "auto | tcp | devmem | rdma | shm | cuda_ipc (default: the transport setting)");
  b->add_option("--sizes", a->sizes, fmt::format("comma-separated sizes, e.g. 8,4K,1M,256M (default {})", kDefaultSizes));
  b->add_option("-b,--min-bytes", a->min_bytes,
                "a size range as nccl-tests: MIN, MIN*F, MIN*F^2 ... while <= MAX; MIN (default 8)");
  b->add_option("-e,--max-bytes", a->max_bytes, "the range's MAX (default 256M)");
  b->add_option("-f,--step-factor", a->step_factor, "the range's F, an integer >= 2 (default 2); not with --sizes");
  b->add_option("--streams", a->streams, "TCP data streams per endpoint, 1-64, plus a control stream beside more than one (default: the streams setting)");
  b->add_option("--chunk-size", a->chunk, "striping/staging chunk (default: the chunk_size setting)");
  b->add_option("--iters", a->iters,
                "operations per size in the throughput phase, and latency samples (default: throughput ~4 GiB "
                "per size, 8 to 2000 operations; latency 1000 samples, or as many as fit in 2 s when 1000 would "
                "take longer, at least 10; one untimed warm-up operation before each phase)");
  b->add_option("--window", a->window,
                "operations in flight in the throughput phase, 1-64 (default: 1 GiB / size, 2 to 64)")
      ->check(CLI::Range(1, 64));
  b->add_option("--blocks", a->blocks,
                "KV-cache run: N blocks at random ids of a paged cache to random ids of the peer's, as one "
                "contiguous op, one op per block and one vectored op (--op write|read; --iters: runs, default 3)");
  b->add_option("--block-size", a->block_size, "with --blocks: bytes per block (default 64K)");
  b->add_flag("--verify", a->verify, "check an end-to-end checksum of fresh random data in every buffer");
  b->add_option("--checksum", a->checksum,
                "crc32c: every chunk carries its CRC32C, checked where it lands (computed by the GPU for GPU memory); "
                "each operation's CRC is compared with the source's (checksum_ok); none (default: the checksum setting)");
  b->add_option("--gpu-push", a->gpu_push,
                "on | off | auto: small device copies (cuda_ipc chunks, staged eager payloads) by the GPU's SMs "
                "instead of a copy engine (docs/gpu-push.md; default: the gpu_push setting). Give it to both sides: "
                "the receiver makes cuda_ipc copies and staged receive copies")
      ->check(CLI::IsMember({"on", "off", "auto"}));
  b->add_flag("--json", a->json, "one JSON object per line per size");
  b->add_flag("--insecure", a->insecure, "no peer authentication (both sides must agree)");
  b->add_option("--option", a->options, "any setting as NAME=VALUE (see dmx probe --config)");
  b->add_option("--metrics-port", a->metrics_port,
                "with --listen: serve Prometheus metrics on http://127.0.0.1:PORT/metrics (0: any free port)");
  b->add_option("--idle-timeout", a->idle_timeout,
                "with --listen: a client that sends no plan, or moves no data during one, for this long loses its "
                "session and the plan's buffer is freed (default 60s)");
  b->callback([a, exit_code] { *exit_code = run(*a); });
}

}  // namespace dmx::cli
