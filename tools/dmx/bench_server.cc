// dmx bench: the server side of a session (the client decides the run). A plan's buffer is charged to
// the context's peer_memory_budget; a client that sends no plan, or moves no data during one, for
// the idle bound loses its session, and the buffer is freed.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "tools/dmx/bench.h"

namespace dmx::bench {
namespace {

constexpr auto kControlTimeout = std::chrono::seconds(120);
constexpr auto kDataTimeout = std::chrono::seconds(300);
constexpr auto kIdlePoll = std::chrono::milliseconds(100);

// Payload bytes the endpoint has moved either way, on its streams and its paths.
uint64_t bytes_moved(const Endpoint& ep) {
  EndpointStats st = ep.stats();
  uint64_t n = st.bytes_sent + st.bytes_received;
  for (const auto& p : st.paths) n += p.bytes_sent + p.bytes_received;
  return n;
}

// Waits for `r` while the endpoint moves data: kTimeout once no byte has moved either way for
// `idle` (a client that asked for a buffer and sends nothing must not hold it for kDataTimeout).
Status wait_moving(Endpoint& ep, const Request& r, Duration idle) {
  uint64_t seen = bytes_moved(ep);
  auto last = std::chrono::steady_clock::now();
  for (;;) {
    Status s = r.wait(kIdlePoll);
    if (s.code() != Code::kTimeout || r.test()) return s;
    uint64_t now_seen = bytes_moved(ep);
    auto now = std::chrono::steady_clock::now();
    if (now_seen != seen) {
      seen = now_seen;
      last = now;
    } else if (now - last >= idle) {
      // The caller frees the buffer next: the operation must be over first (cancel completes it).
      r.cancel();
      (void)r.wait(kControlTimeout);
      return Status(Code::kTimeout,
                    fmt::format("bench: the client moved no data for {} ms during a plan (--idle-timeout); the plan "
                                "is dropped and its buffer freed",
                                std::chrono::duration_cast<std::chrono::milliseconds>(idle).count()));
    }
  }
}

// Checks that each of the first `n` slots of `buf` has checksum `want`.
Result<bool> slots_match(const Buffer& buf, uint64_t size, uint32_t n, uint64_t want) {
  for (uint32_t i = 0; i < n; ++i) {
    DMX_ASSIGN_OR_RETURN(uint64_t got, checksum_region(buf.region().sub(i * size, size)));
    if (got != want) return false;
  }
  return true;
}

// The final reply's view of this side's payload paths (Reply::path_chunks_*).
void note_paths(const Endpoint& ep, Reply* reply) {
  reply->path_chunks_received = reply->path_chunks_inline = 0;
  for (const auto& path : ep.stats().paths) {
    reply->path_chunks_received += path.chunks_received;
    reply->path_chunks_inline += path.chunks_inline;
  }
}

Status serve_send(Endpoint& ep, const Plan& p, Buffer& buf, Reply& reply, Duration idle) {
  DMX_RETURN_IF_ERROR(send_text(ep, kReplyTag, to_json(reply), kControlTimeout));
  uint32_t w = std::min(p.window, std::max<uint32_t>(p.iters, 1));
  std::vector<Request> reqs(w);
  auto slot = [&](uint32_t i) { return buf.region().sub(uint64_t{i % w} * p.size, p.size); };
  uint32_t total = p.iters + p.warmup;  // the client's untimed warm-up sends come first
  for (uint32_t i = 0; i < std::min(w, total); ++i) reqs[i] = ep.recv(slot(i), kDataTag, with_timeout(kDataTimeout));
  // With checksums every operation reports a CRC32C (else 0); each must be the source's.
  const bool checksums = ep.stats().checksum;
  auto check = [&](const Request& r) { reply.crc_ok = reply.crc_ok && (!checksums || r.crc32c() == p.crc); };
  for (uint32_t i = 0; i < total; ++i) {
    DMX_RETURN_IF_ERROR(wait_moving(ep, reqs[i % w], idle));
    check(reqs[i % w]);
    if (reqs[i % w].bytes() != p.size) return Status(Code::kInternal, "bench: short message");
    if (i + w < total) reqs[i % w] = ep.recv(slot(i), kDataTag, with_timeout(kDataTimeout));
  }
  DMX_RETURN_IF_ERROR(send_text(ep, kDoneTag, "done", kControlTimeout));
  // Ping-pong. With two slots the receive of the next ping is posted before the pong goes out, as a
  // latency-minded application does: a send of device memory by cuda_ipc completes only once the
  // peer has copied it, and a ping arriving before its receive would wait as unexpected (copied
  // twice). With one slot the echo must finish before the slot is reused.
  // The slots are the plan's window, also in a latency-only plan (iters 0).
  bool alternate = p.window >= 2;
  auto ping_slot = [&](uint32_t j) { return buf.region().sub(uint64_t{alternate ? j % 2 : 0} * p.size, p.size); };
  Request r;
  if (p.lat_iters > 0) r = ep.recv(ping_slot(0), kPingTag, with_timeout(kDataTimeout));
  for (uint32_t j = 0; j < p.lat_iters; ++j) {
    DMX_RETURN_IF_ERROR(wait_moving(ep, r, idle));
    check(r);
    bool more = j + 1 < p.lat_iters;
    if (more && alternate) r = ep.recv(ping_slot(j + 1), kPingTag, with_timeout(kDataTimeout));
    Request pong = ep.send(ping_slot(j), kPongTag, with_timeout(kDataTimeout));
    DMX_RETURN_IF_ERROR(pong.wait());
    check(pong);
    if (more && !alternate) r = ep.recv(ping_slot(0), kPingTag, with_timeout(kDataTimeout));
  }
  if (p.verify) {  // every slot that received data: the windowed sends' and the pings'
    uint32_t used = std::max({std::min(w, total), std::min(p.lat_iters, alternate ? 2u : 1u)});
    DMX_ASSIGN_OR_RETURN(reply.verified, slots_match(buf, p.size, used, p.checksum));
  }
  note_paths(ep, &reply);
  return send_text(ep, kReplyTag, to_json(reply), kControlTimeout);
}

Status serve_one_sided(Endpoint& ep, const Plan& p, Context& ctx, Buffer& buf, Reply& reply, Duration idle) {
  uint32_t w = p.op == "write" ? std::min(p.window, std::max<uint32_t>(p.iters, 1)) : 1;
  if (p.op == "read") {
    DMX_ASSIGN_OR_RETURN(reply.checksum, fill_random(buf.region().sub(0, p.size)));
    if (ep.stats().checksum) {
      DMX_ASSIGN_OR_RETURN(reply.crc, crc32c_region(buf.region().sub(0, p.size)));
    }
  }
  DMX_ASSIGN_OR_RETURN(Registration reg, ctx.register_memory(buf.region().sub(0, uint64_t{w} * p.size)));
  reply.region = reg.remote();
  DMX_RETURN_IF_ERROR(send_text(ep, kReplyTag, to_json(reply), kControlTimeout));
  std::string done(kControlMax, '\0');
  Request got = ep.recv(MemRegion{done.data(), done.size(), {}}, kDoneTag, with_timeout(kDataTimeout));
  if (p.blocks > 0 && p.op == "write") {  // each notification goes back to the client at once
    auto last = std::chrono::steady_clock::now();
    while (!got.test()) {
      auto note = ep.next_notification(std::chrono::milliseconds(50));
      if (!note.ok()) {
        if (note.status().code() != Code::kTimeout) return note.status();
        if (std::chrono::steady_clock::now() - last > idle) break;  // wait_moving below ends it
        continue;
      }
      last = std::chrono::steady_clock::now();
      uint64_t value = note->value;
      DMX_RETURN_IF_ERROR(ep.send(MemRegion{&value, sizeof value, {}}, kPongTag).wait(kControlTimeout));
    }
  }
  DMX_RETURN_IF_ERROR(wait_moving(ep, got, idle));
  if (p.op == "write" && p.verify) {
    DMX_ASSIGN_OR_RETURN(reply.verified, slots_match(buf, p.size, std::min(w, p.iters), p.checksum));
  }
  note_paths(ep, &reply);
  return send_text(ep, kReplyTag, to_json(reply), kControlTimeout);
}

}  // namespace

Status serve(Context ctx, Endpoint& ep, Duration idle) {
  for (;;) {
    auto text = recv_text(ep, kPlanTag, idle);
    if (text.status().code() == Code::kTimeout) {
      (void)ep.close();
      return Status(Code::kTimeout, fmt::format("bench: no plan from the client for {} ms (--idle-timeout); session "
                                                "ended",
                                                std::chrono::duration_cast<std::chrono::milliseconds>(idle).count()));
    }
    if (!text.ok()) return text.status().code() == Code::kClosed ? Status() : text.status();
    Reply reply;
    EndpointStats st = ep.stats();
    reply.transport = st.transport;
    reply.reason = st.reason;
    auto plan = plan_from_json(*text);
    Result<MemSpec> mem = plan.ok() ? parse_mem_spec(plan->peer_mem) : Result<MemSpec>(plan.status());
    Result<Buffer> buf = Status(Code::kInternal, "unset");
    MemoryCharge held;  // the buffer's bytes in peer_memory_budget, until the plan is done
    if (plan.ok() && plan->quit) return Status();
    if (mem.ok()) {
      uint32_t slots = plan->op == "read" ? 1 : plan->window;
      uint64_t bytes = std::max<uint64_t>(1, uint64_t{slots} * plan->size);  // plan_from_json bounds both
      auto charge = ctx.charge_memory(bytes, ep.peer(), "a bench plan's buffer");
      if (charge.ok()) {
        held = std::move(*charge);
        buf = Buffer::allocate(*mem, bytes);
      } else {
        buf = charge.status();
      }
      // Touch host memory once, untimed, so page faults are not measured as transfer time.
      if (buf.ok() && !mem->is_device()) std::memset(buf->data(), 0x5a, buf->size());
    }
    Status bad = !plan.ok() ? plan.status() : !mem.ok() ? mem.status() : buf.status();
    if (!bad.ok()) {
      reply.ok = false;
      reply.error = bad.to_string();
      DMX_RETURN_IF_ERROR(send_text(ep, kReplyTag, to_json(reply), kControlTimeout));
      continue;
    }
    Status s = plan->op == "send" ? serve_send(ep, *plan, *buf, reply, idle)
                                  : serve_one_sided(ep, *plan, ctx, *buf, reply, idle);
    if (!s.ok()) {
      // Receives may still be posted into the buffer: once close() returns, nothing touches it.
      (void)ep.close();
      return s;
    }
  }
}

}  // namespace dmx::bench
