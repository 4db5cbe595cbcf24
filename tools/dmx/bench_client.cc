// dmx bench: the client side of one size.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "tools/dmx/bench.h"

namespace dmx::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kControlTimeout = std::chrono::seconds(120);
constexpr auto kDataTimeout = std::chrono::seconds(300);

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

uint32_t auto_iters(uint64_t size) {
  uint64_t n = (uint64_t{4} << 30) / std::max<uint64_t>(size, 1);
  return static_cast<uint32_t>(std::clamp<uint64_t>(n, 8, 2000));
}

uint32_t auto_window(uint64_t size) {
  uint64_t n = (uint64_t{1} << 30) / std::max<uint64_t>(size, 1);
  return static_cast<uint32_t>(std::clamp<uint64_t>(n, 2, 16));
}

uint32_t auto_lat_iters(uint64_t size) {
  uint64_t n = (uint64_t{1} << 30) / std::max<uint64_t>(size, 1);
  return static_cast<uint32_t>(std::clamp<uint64_t>(n, 5, 1000));
}

// Posts `iters` operations keeping `window` in flight; `post(i)` starts operation i.
template <typename Post>
Status windowed(uint32_t iters, uint32_t window, Post post) {
  std::vector<Request> reqs(window);
  for (uint32_t i = 0; i < std::min(window, iters); ++i) reqs[i] = post(i);
  for (uint32_t i = 0; i < iters; ++i) {
    DMX_RETURN_IF_ERROR(reqs[i % window].wait());
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

Result<Result1> run_size(Endpoint& ep, const ClientOptions& o, uint64_t size) {
  Result1 out;
  Plan& p = out.plan;
  p.op = o.op;
  p.size = size;
  p.iters = o.iters ? o.iters : auto_iters(size);
  p.window = std::min(auto_window(size), p.iters);
  p.lat_iters = std::min(auto_lat_iters(size), std::max<uint32_t>(p.iters, 5));
  p.peer_mem = to_string(o.peer_mem);
  p.verify = o.verify;
  uint32_t w = p.window;

  // Source for send/write (one buffer, sent repeatedly); destination slots for read.
  uint32_t slots = o.op == "read" ? w : 1;
  auto allocate = [&](uint64_t n) {
    n = std::max<uint64_t>(1, n);
    return o.cumem_block ? Buffer::allocate_cumem(o.mem.device, n, o.cumem_block) : Buffer::allocate(o.mem, n);
  };
  DMX_ASSIGN_OR_RETURN(Buffer local, allocate(uint64_t{slots} * size));
  DMX_ASSIGN_OR_RETURN(Buffer pong, allocate(size));
  MemRegion src = local.region().sub(0, size);
  for (Buffer* b : {&local, &pong})  // touch host memory once, untimed (page faults are not transfer time)
    if (!o.mem.is_device()) std::memset(b->data(), 0x5a, b->size());
  if (o.op != "read") {
    DMX_ASSIGN_OR_RETURN(p.checksum, fill_random(src));
  }

  DMX_RETURN_IF_ERROR(send_text(ep, kPlanTag, to_json(p), kControlTimeout));
  DMX_ASSIGN_OR_RETURN(std::string rtext, recv_text(ep, kReplyTag, kControlTimeout));
  DMX_ASSIGN_OR_RETURN(Reply reply, reply_from_json(rtext));
  if (!reply.ok) return Status(Code::kPeerFailed, "bench server: " + reply.error);

  OpOptions data = with_timeout(kDataTimeout);
  auto slot = [&](uint32_t i) { return local.region().sub(uint64_t{i % w} * size, size); };
  for (uint32_t i = 0; i < p.warmup; ++i) {  // untimed (Plan::warmup)
    Request r = o.op == "send"    ? ep.send(src, kDataTag, data)
                : o.op == "write" ? ep.write(src, reply.region, 0, data)
                                  : ep.read(slot(0), reply.region, 0, data);
    DMX_RETURN_IF_ERROR(r.wait());
  }
  auto t0 = Clock::now();
  if (o.op == "send") {
    DMX_RETURN_IF_ERROR(windowed(p.iters, w, [&](uint32_t) { return ep.send(src, kDataTag, data); }));
    DMX_RETURN_IF_ERROR(recv_text(ep, kDoneTag, kDataTimeout).status());
  } else if (o.op == "write") {
    DMX_RETURN_IF_ERROR(windowed(p.iters, w, [&](uint32_t i) {
      return ep.write(src, reply.region, uint64_t{i % w} * size, data);
    }));
  } else {
    DMX_RETURN_IF_ERROR(windowed(p.iters, w, [&](uint32_t i) { return ep.read(slot(i), reply.region, 0, data); }));
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  out.gb_per_s = secs > 0 ? static_cast<double>(size) * p.iters / secs / 1e9 : 0;
  std::vector<double> lat;
  if (o.op != "send") {
    // One-sided latency: each operation alone, its completion time (data landed / arrived).
    for (uint32_t j = 0; j < p.lat_iters; ++j) {
      auto t = Clock::now();
      Request r = o.op == "write" ? ep.write(src, reply.region, 0, data) : ep.read(slot(0), reply.region, 0, data);
      DMX_RETURN_IF_ERROR(r.wait());
      lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
    }
    DMX_RETURN_IF_ERROR(send_text(ep, kDoneTag, "done", kControlTimeout));
  } else {
    for (uint32_t j = 0; j < p.lat_iters; ++j) {
      auto t = Clock::now();
      Request r = ep.recv(pong.region().sub(0, size), kPongTag, data);
      DMX_RETURN_IF_ERROR(ep.send(src, kPingTag, data).wait());
      DMX_RETURN_IF_ERROR(r.wait());
      lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count() / 2);
    }
  }
  DMX_ASSIGN_OR_RETURN(std::string ftext, recv_text(ep, kReplyTag, kDataTimeout));
  DMX_ASSIGN_OR_RETURN(Reply final_reply, reply_from_json(ftext));
  out.peer_path_chunks_received = final_reply.path_chunks_received;
  out.peer_path_chunks_inline = final_reply.path_chunks_inline;
  out.lat_p50_us = percentile(lat, 0.5);
  out.lat_p99_us = percentile(lat, 0.99);

  if (o.verify) {
    if (o.op == "send") {
      DMX_ASSIGN_OR_RETURN(uint64_t echo, checksum_region(pong.region().sub(0, size)));
      out.verified = final_reply.verified && (p.lat_iters == 0 || echo == p.checksum);
    } else if (o.op == "write") {
      out.verified = final_reply.verified;
    } else {
      out.verified = true;
      for (uint32_t i = 0; i < std::min(w, p.iters); ++i) {
        DMX_ASSIGN_OR_RETURN(uint64_t got, checksum_region(slot(i)));
        out.verified = out.verified && got == reply.checksum;
      }
    }
  }
  return out;
}

}  // namespace dmx::bench
