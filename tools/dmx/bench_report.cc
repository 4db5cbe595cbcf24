#include "tools/dmx/bench_report.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/units.h"

namespace dmx::bench {

// The streams the endpoint opened, and why they differ from the streams setting where they do: a
// payload path (shm, cuda_ipc, devmem) carries the bulk data, so only the control stream is TCP.
std::string streams_text(const ClientOptions& co, const EndpointStats& st) {
  if (!st.paths.empty())
    return fmt::format("{} ({} carries the payload; --streams applies to tcp{})", st.streams, st.transport,
                       co.streams_asked > 1 ? fmt::format(", {} asked", co.streams_asked) : "");
  if (st.streams > 1) return fmt::format("{} ({} data + 1 control)", st.streams, st.streams - 1);
  return fmt::format("{}", st.streams);
}

void print_header(const ClientOptions& co, const EndpointStats& st) {
  fmt::print("# dmx bench: op {}, {}{} -> {}, peer {}\n", co.op, to_string(co.mem),
             co.cumem_block ? fmt::format(" (cuMem blocks of {} B)", co.cumem_block) : "", to_string(co.peer_mem),
             st.peer);
  fmt::print("# streams: {}\n", streams_text(co, st));
  // On one host auto picks shm or cuda_ipc: the reason says so ("auto: same host; …"), or that
  // --transport forced the choice, rather than leave it implied.
  fmt::print("# transport: {} ({})\n", st.transport, st.reason);
  fmt::print("# control stream: {}\n", st.control_stream);
  for (const auto& p : st.paths) fmt::print("# payload path: {}\n", p.detail);
  if (co.mem.is_device()) fmt::print("# gpu push (this side): {}\n", st.gpu_push);
  fmt::print("# warm-up: {} untimed operation(s) per size before each phase (first use of fresh buffers)\n",
             Plan{}.warmup);
  fmt::print("# throughput: {}; time = per operation; GB/s = 1e9 bytes/s\n",
             co.iters ? fmt::format("{} operations per size (--iters)", co.iters)
                      : "operations moving ~4 GiB per size, 8 to 2000, a window in flight");
  if (co.checksum) fmt::print("# checksum: crc32c on every chunk, each operation's CRC checked (checksum_ok)\n");
  fmt::print("# latency: {}; samples: {}\n", co.op == "send" ? "half round trip (ping-pong)" : "operation completion time",
             co.iters ? fmt::format("{} per size (--iters)", co.iters)
                      : fmt::format("{}, or as many as fit in {:g} s when that takes longer (at least {})", kMinSamples,
                                    kLatencyBudgetSeconds, kMinLargeSamples));
  fmt::print("#{:>11} {:>7} {:>10} {:>8} {:>10} {:>7} {:>9} {:>9} {:>9} {:>6} {:>8}\n", "size", "iters", "time us",
             "GB/s", "msg/s", "samples", "p50 us", "p99 us", "p999 us", "CPU %", "verified");
}

void print_row(const Result1& r, bool json, const ClientOptions& co, const EndpointStats& st) {
  double time_us = r.plan.iters ? r.seconds / r.plan.iters * 1e6 : 0;
  if (json) {
    nlohmann::json j{{"size_bytes", r.plan.size},
                     {"iters", r.plan.iters},
                     {"time_us", time_us},
                     {"gb_per_s", r.gb_per_s},
                     {"msg_per_s", r.msg_per_s},
                     {"lat_samples", r.lat_samples},
                     {"p50_us", r.p50_us},
                     {"p99_us", r.p99_us},
                     {"p999_us", r.p999_us},
                     {"warmup", r.plan.warmup},
                     {"transport", st.transport},
                     {"reason", st.reason},
                     {"control_stream", st.control_stream},
                     {"mem", to_string(co.mem)},
                     {"cumem_block", co.cumem_block},
                     {"peer_mem", to_string(co.peer_mem)},
                     {"streams", st.streams},
                     {"verified", r.verified},
                     {"op", co.op},
                     {"window", r.plan.window},
                     {"cpu_pct", r.cpu_pct},
                     {"d2h_copies", st.d2h_copies},
                     {"h2d_copies", st.h2d_copies},
                     {"gpu_pushes", st.gpu_pushes},
                     {"staging_lists", st.staging_lists},
                     {"gpu_push", st.gpu_push},
                     {"peer_path_chunks_received", r.peer_path_chunks_received},
                     {"peer_path_chunks_inline", r.peer_path_chunks_inline},
                     {"stream_bytes_sent", r.stream_bytes_sent}};
    for (const auto& p : st.paths)
      j["paths"].push_back({{"name", p.name},
                            {"detail", p.detail},
                            {"chunks_sent", p.chunks_sent},
                            {"bytes_sent", p.bytes_sent},
                            {"chunks_received", p.chunks_received},
                            {"chunks_inline", p.chunks_inline},
                            {"host_copies", p.host_copies},
                            {"device_copies", p.device_copies}});
    if (co.checksum) {
      j["checksum"] = "crc32c";
      j["checksum_ok"] = r.checksum_ok;
    }
    if (!r.error.empty()) j["error"] = r.error;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print(" {:>11} {:>7} {:>10.2f} {:>8.2f} {:>10.0f} {:>7} {:>9.1f} {:>9.1f} {:>9.1f} {:>6.0f} {:>8}\n",
               format_size(r.plan.size), r.plan.iters, time_us, r.gb_per_s, r.msg_per_s, r.lat_samples, r.p50_us,
               r.p99_us, r.p999_us, r.cpu_pct,
               !r.error.empty() ? "ERROR" : !co.verify ? "-" : r.verified ? "yes" : "NO");
    if (!r.error.empty()) fmt::print("#   error: {}\n", r.error);
    if (co.checksum && r.error.empty() && !r.checksum_ok) fmt::print("#   checksum: an operation's CRC32C differed\n");
  }
  std::fflush(stdout);
}

Progress::Progress(bool on) : on_(on) {
  if (on_) thread_ = std::thread([this] { loop(); });
}

Progress::~Progress() {
  if (!on_) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Progress::begin(size_t index, size_t count, uint64_t size) {
  std::lock_guard<std::mutex> l(mu_);
  index_ = index, count_ = count, size_ = size, active_ = true;
  start_ = std::chrono::steady_clock::now();
}

void Progress::end() {
  std::lock_guard<std::mutex> l(mu_);
  active_ = false;
  if (shown_) fmt::print(stderr, "\r\033[K");
  shown_ = false;
  std::fflush(stderr);
}

void Progress::loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    cv_.wait_for(l, std::chrono::milliseconds(250));
    if (stop_ || !active_) continue;
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (secs < 1) continue;
    fmt::print(stderr, "\r\033[K[{}/{}] {}: {}, {:.0f} s", index_ + 1, count_, format_size(size_), phase.load(), secs);
    std::fflush(stderr);
    shown_ = true;
  }
}

}  // namespace dmx::bench
