// run_load's dmx faces: closed-loop clients over dmx endpoints of one Context, two-sided or by
// remote queues, polled on the calling thread.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <random>
#include <thread>

#include "mqueue/load.h"
#include "mqueue/remote_queue.h"

namespace dmx::mqueue {
namespace {

using Clock = std::chrono::steady_clock;

struct Outstanding {
  uint64_t tag = 0;
  Clock::time_point sent;
  std::vector<uint8_t> req;
};

// A connection with up to `depth` requests outstanding (answers come in order).
struct DmxClient {
  std::unique_ptr<DmxRequester> two_sided;
  std::unique_ptr<RemoteQueueClient> remote;
  std::deque<Outstanding> out;
};

}  // namespace

Result<LoadResult> run_dmx_load(const LoadConfig& cfg) {
  if (cfg.clients == 0 || cfg.sizes.empty()) return Status(Code::kInvalidArgument, "load: no clients or no sizes");
  const bool remote = cfg.face == LoadConfig::Face::kRemote;
  DMX_ASSIGN_OR_RETURN(Context ctx, Context::create(cfg.dmx_options));
  const uint32_t max_size = *std::max_element(cfg.sizes.begin(), cfg.sizes.end());
  auto open = [&](DmxClient& c) -> Status {
    c.two_sided.reset();
    c.remote.reset();
    if (remote) {
      DMX_ASSIGN_OR_RETURN(c.remote, RemoteQueueClient::connect(ctx, cfg.address, cfg.timeout));
    } else {
      DMX_ASSIGN_OR_RETURN(c.two_sided, DmxRequester::connect(ctx, cfg.address, max_size));
    }
    return Status();
  };
  std::vector<DmxClient> clients(cfg.clients);
  for (DmxClient& c : clients) DMX_RETURN_IF_ERROR(open(c));

  std::mt19937_64 rng(cfg.seed);
  LoadResult r;
  const auto start = Clock::now();
  const double cpu0 = thread_cpu_seconds();
  const bool timed = cfg.duration.count() > 0;
  const auto end = start + std::chrono::duration_cast<Clock::duration>(cfg.duration);
  uint64_t next_tag = 1;
  auto fail = [&](const std::string& what) {
    if (r.first_error.empty()) r.first_error = what;
  };
  auto more = [&] { return timed ? Clock::now() < end : r.sent < cfg.requests; };
  const uint32_t depth = remote ? std::max(1u, cfg.depth) : 1u;
  auto send = [&](DmxClient& c) -> Status {
    uint64_t index = r.sent;
    Outstanding o;
    o.req.resize(cfg.sizes[index % cfg.sizes.size()]);
    if (cfg.make) {
      cfg.make(o.req, index);
    } else {
      for (size_t i = 0; i < o.req.size(); i += 8) {
        uint64_t v = rng();
        std::memcpy(o.req.data() + i, &v, std::min<size_t>(8, o.req.size() - i));
      }
    }
    o.sent = Clock::now();
    if (remote) {
      DMX_ASSIGN_OR_RETURN(o.tag, c.remote->submit(o.req));
    } else {
      o.tag = next_tag++;
      DMX_RETURN_IF_ERROR(c.two_sided->submit(o.req, o.tag));
    }
    c.out.push_back(std::move(o));
    r.sent++;
    return Status();
  };
  auto lost = [&](DmxClient& c, const std::string& why) -> Status {
    r.lost += c.out.size();
    c.out.clear();
    fail(why);
    return open(c);  // a late answer would confuse the next request: start afresh
  };

  for (DmxClient& c : clients)
    while (c.out.size() < depth && more()) DMX_RETURN_IF_ERROR(send(c));
  for (;;) {
    bool any_busy = false, any_answer = false;
    for (DmxClient& c : clients) {
      if (c.out.empty()) continue;
      any_busy = true;
      Outstanding& o = c.out.front();
      Result<Answer> a = remote ? c.remote->next_answer(Duration(0)) : c.two_sided->next_answer(Duration(0));
      if (!a.ok() && a.status().code() == Code::kTimeout) {
        if (Clock::now() - o.sent > cfg.timeout)
          DMX_RETURN_IF_ERROR(lost(c, "no answer to a " + std::to_string(o.req.size()) + " B request in time"));
      } else if (!a.ok()) {
        DMX_RETURN_IF_ERROR(lost(c, a.status().to_string()));
      } else {
        any_answer = true;
        const std::vector<uint8_t>& p = a->payload;
        bool good = a->ok && a->index == o.tag &&
                    (cfg.check ? cfg.check(o.req, p)
                               : p.size() == o.req.size() &&
                                     std::equal(p.begin(), p.end(), o.req.begin(),
                                                [](uint8_t x, uint8_t y) { return x == (y ^ kXorKey); }));
        if (good) {
          r.ok++;
          r.latency_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - o.sent).count());
        } else {
          r.bad++;
          fail("a wrong answer to a " + std::to_string(o.req.size()) + " B request (" + std::to_string(p.size()) +
               " B, " + (a->ok ? "ok" : "error") + ")");
        }
        c.out.pop_front();
      }
      while (c.out.size() < depth && more()) DMX_RETURN_IF_ERROR(send(c));
    }
    if (!any_busy) break;
    if (!any_answer) std::this_thread::yield();  // the server may share our core
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.client_cpu_seconds = thread_cpu_seconds() - cpu0;
  return r;
}

}  // namespace dmx::mqueue
