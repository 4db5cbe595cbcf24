// dmx bench: the client side of one size.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/trace.h"
#include "tools/dmx/bench.h"

namespace dmx::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kControlTimeout = std::chrono::seconds(120);
constexpr auto kDataTimeout = std::chrono::seconds(300);

// The q-quantile of sorted samples (nearest rank).
double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  size_t i = static_cast<size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(i, sorted.size() - 1)];
}

// 1 GiB in flight, at most 64 operations (osu_bw's default window): the next message's receive is
// posted only once the application saw an earlier one complete, so a shallow window measures that
// turn-around rather than the transport (docs/performance.md, "Pushed messages").
uint32_t auto_window(uint64_t size) {
  uint64_t n = (uint64_t{1} << 30) / std::max<uint64_t>(size, 1);
  return static_cast<uint32_t>(std::clamp<uint64_t>(n, 2, 64));
}

// Posts `iters` operations keeping `window` in flight; `post(i)` starts operation i; `done(r)`
// sees each completed one.
template <typename Post, typename Done>
Status windowed(uint32_t iters, uint32_t window, Post post, Done done) {
  std::vector<Request> reqs(window);
  for (uint32_t i = 0; i < std::min(window, iters); ++i) reqs[i] = post(i);
  for (uint32_t i = 0; i < iters; ++i) {
    DMX_RETURN_IF_ERROR(reqs[i % window].wait());
    done(reqs[i % window]);
    if (i + window < iters) reqs[i % window] = post(i + window);
  }
  return Status();
}

}  // namespace

Status quit(Endpoint& ep) {
  Plan p;
  p.quit = true;
  return send_text(ep, kPlanTag, to_json(p), kControlTimeout);
}

namespace {

// What one plan measured.
struct Phase {
  double secs = 0;          // the windowed operations
  std::vector<double> lat;  // microseconds, one per latency sample
  bool verified = false;
  bool crc_ok = true;  // every operation's CRC32C was the expected one (ClientOptions::checksum)
  Reply final_reply;
};

// One plan on the server's fresh buffers: warm-up, `p.iters` windowed operations, then
// `p.lat_iters` operations one at a time. `local` holds the source (send/write) or the read slots.
Result<Phase> run_plan(Endpoint& ep, const ClientOptions& o, const Plan& p, const Buffer& local, const Buffer& pong) {
  Phase out;
  uint64_t size = p.size;
  uint32_t w = p.window;
  MemRegion src = local.region().sub(0, size);
  DMX_RETURN_IF_ERROR(send_text(ep, kPlanTag, to_json(p), kControlTimeout));
  DMX_ASSIGN_OR_RETURN(std::string rtext, recv_text(ep, kReplyTag, kControlTimeout));
  DMX_ASSIGN_OR_RETURN(Reply reply, reply_from_json(rtext));
  if (!reply.ok) return Status(Code::kPeerFailed, "bench server: " + reply.error);

  OpOptions data = with_timeout(kDataTimeout);
  auto slot = [&](uint32_t i) { return local.region().sub(uint64_t{i % w} * size, size); };
  const uint32_t want_crc = o.op == "read" ? reply.crc : p.crc;
  auto check = [&](const Request& r) { out.crc_ok = out.crc_ok && (!o.checksum || r.crc32c() == want_crc); };
  for (uint32_t i = 0; i < p.warmup; ++i) {  // untimed (Plan::warmup)
    Request r = o.op == "send"    ? ep.send(src, kDataTag, data)
                : o.op == "write" ? ep.write(src, reply.region, 0, data)
                                  : ep.read(slot(0), reply.region, 0, data);
    DMX_RETURN_IF_ERROR(r.wait());
    check(r);
  }
  auto t0 = Clock::now();
  if (o.op == "send") {
    DMX_RETURN_IF_ERROR(windowed(p.iters, w, [&](uint32_t) { return ep.send(src, kDataTag, data); }, check));
    DMX_RETURN_IF_ERROR(recv_text(ep, kDoneTag, kDataTimeout).status());
  } else if (o.op == "write") {
    DMX_RETURN_IF_ERROR(windowed(p.iters, w, [&](uint32_t i) {
      return ep.write(src, reply.region, uint64_t{i % w} * size, data);
    }, check));
  } else {
    DMX_RETURN_IF_ERROR(
        windowed(p.iters, w, [&](uint32_t i) { return ep.read(slot(i), reply.region, 0, data); }, check));
  }
  out.secs = std::chrono::duration<double>(Clock::now() - t0).count();
  out.lat.reserve(p.lat_iters);
  if (o.op != "send") {
    // One-sided latency: each operation alone, its completion time (data landed / arrived).
    for (uint32_t j = 0; j < p.lat_iters; ++j) {
      auto t = Clock::now();
      Request r = o.op == "write" ? ep.write(src, reply.region, 0, data) : ep.read(slot(0), reply.region, 0, data);
      DMX_RETURN_IF_ERROR(r.wait());
      check(r);
      out.lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
    }
    DMX_RETURN_IF_ERROR(send_text(ep, kDoneTag, "done", kControlTimeout));
  } else {
    for (uint32_t j = 0; j < p.lat_iters; ++j) {
      auto t = Clock::now();
      Request r = ep.recv(pong.region().sub(0, size), kPongTag, data);
      Request s = ep.send(src, kPingTag, data);
      DMX_RETURN_IF_ERROR(s.wait());
      DMX_RETURN_IF_ERROR(r.wait());
      check(s);
      check(r);  // the echo of the same bytes
      out.lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count() / 2);
    }
  }
  DMX_ASSIGN_OR_RETURN(std::string ftext, recv_text(ep, kReplyTag, kDataTimeout));
  DMX_ASSIGN_OR_RETURN(out.final_reply, reply_from_json(ftext));
  out.crc_ok = out.crc_ok && out.final_reply.crc_ok;

  if (o.verify) {
    if (o.op == "send") {
      DMX_ASSIGN_OR_RETURN(uint64_t echo, checksum_region(pong.region().sub(0, size)));
      out.verified = out.final_reply.verified && (p.lat_iters == 0 || echo == p.checksum);
    } else if (o.op == "write") {
      out.verified = out.final_reply.verified;
    } else {
      out.verified = true;
      uint32_t n = std::min(w, std::max(p.iters, std::min(p.lat_iters, 1u)));
      for (uint32_t i = 0; i < n; ++i) {
        DMX_ASSIGN_OR_RETURN(uint64_t got, checksum_region(slot(i)));
        out.verified = out.verified && got == reply.checksum;
      }
    }
  }
  return out;
}

}  // namespace

// Two plans: the throughput phase, then the latency phase, whose sample count depends on the
// time per operation the first measured (latency_samples).
Result<Result1> run_size(Endpoint& ep, const ClientOptions& o, uint64_t size) {
  Result1 out;
  Plan& p = out.plan;
  p.op = o.op;
  p.size = size;
  p.iters = o.iters ? o.iters : throughput_iters(size);
  p.window = std::min(o.window ? o.window : auto_window(size), p.iters);
  p.lat_iters = 0;
  p.peer_mem = to_string(o.peer_mem);
  p.verify = o.verify;

  // Source for send/write (one buffer, sent repeatedly); destination slots for read.
  uint32_t slots = o.op == "read" ? p.window : 1;
  auto allocate = [&](uint64_t n) {
    n = std::max<uint64_t>(1, n);
    return o.cumem_block ? Buffer::allocate_cumem(o.mem.device, n, o.cumem_block) : Buffer::allocate(o.mem, n);
  };
  DMX_ASSIGN_OR_RETURN(Buffer local, allocate(uint64_t{slots} * size));
  DMX_ASSIGN_OR_RETURN(Buffer pong, allocate(size));
  for (Buffer* b : {&local, &pong})  // touch host memory once, untimed (page faults are not transfer time)
    if (!o.mem.is_device()) std::memset(b->data(), 0x5a, b->size());
  if (o.op != "read") {
    DMX_ASSIGN_OR_RETURN(p.checksum, fill_random(local.region().sub(0, size)));
    if (o.checksum) {
      DMX_ASSIGN_OR_RETURN(p.crc, crc32c_region(local.region().sub(0, size)));
    }
  }

  if (o.phase) o.phase->store("throughput");
  DMX_TRACE_POINT("bench.throughput");  // scripts/stage-times.py: the phase's records
  std::vector<uint64_t> before = ep.stats().stream_bytes_sent;
  DMX_ASSIGN_OR_RETURN(Phase bw, run_plan(ep, o, p, local, pong));
  out.stream_bytes_sent = ep.stats().stream_bytes_sent;
  for (size_t i = 0; i < out.stream_bytes_sent.size() && i < before.size(); ++i)
    out.stream_bytes_sent[i] -= before[i];
  out.seconds = bw.secs;
  out.gb_per_s = bw.secs > 0 ? static_cast<double>(size) * p.iters / bw.secs / 1e9 : 0;
  out.msg_per_s = bw.secs > 0 ? p.iters / bw.secs : 0;

  // A ping-pong is two transfers; a one-sided operation one.
  double op_seconds = p.iters ? bw.secs / p.iters * (o.op == "send" ? 2 : 1) : 0;
  Plan lp = p;
  lp.iters = 0;  // the window stays: the server's ping-pong alternates between its slots
  lp.lat_iters = o.iters ? o.iters : latency_samples(op_seconds);
  if (o.phase) o.phase->store("latency");
  DMX_TRACE_POINT("bench.latency");
  DMX_ASSIGN_OR_RETURN(Phase lat, run_plan(ep, o, lp, local, pong));
  std::sort(lat.lat.begin(), lat.lat.end());
  out.lat_samples = lp.lat_iters;
  out.p50_us = percentile(lat.lat, 0.5);
  out.p99_us = percentile(lat.lat, 0.99);
  out.p999_us = percentile(lat.lat, 0.999);
  out.peer_path_chunks_received = lat.final_reply.path_chunks_received;
  out.peer_path_chunks_inline = lat.final_reply.path_chunks_inline;
  out.verified = bw.verified && lat.verified;
  out.checksum_ok = o.checksum && bw.crc_ok && lat.crc_ok;
  return out;
}

}  // namespace dmx::bench
