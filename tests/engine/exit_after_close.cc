// A process that moves messages over loopback pairs (shm path and TCP streams), closes its
// endpoints and returns from main at once. Run by ShutdownExit.ProcessExitsCleanlyRightAfterClose:
// under ThreadSanitizer any race with the exit (a dmx thread still running while statics such as
// the logger are destroyed) fails it through the exit status.
#include <cstdio>
#include <cstring>
#include <vector>

#include "dmx/dmx.h"

int main() {
  using namespace dmx;
  Options o;
  o.set("auth_key", "dmx-test-key-0123456789").set("streams", "2").set("log_level", "warn");
  auto ctx = Context::create(o);
  if (!ctx.ok()) return std::fprintf(stderr, "%s\n", ctx.status().to_string().c_str()), 2;
  auto l = ctx->listen("tcp://127.0.0.1:0");
  if (!l.ok()) return std::fprintf(stderr, "%s\n", l.status().to_string().c_str()), 2;
  for (int i = 0; i < 4; ++i) {
    auto c = ctx->connect(l->address());
    if (!c.ok()) return std::fprintf(stderr, "%s\n", c.status().to_string().c_str()), 2;
    auto s = l->accept(std::chrono::seconds(10));
    if (!s.ok()) return std::fprintf(stderr, "%s\n", s.status().to_string().c_str()), 2;
    std::vector<unsigned char> out(100000, 7), in(out.size());
    Request r = s->recv(MemRegion{in.data(), in.size()}, 1);
    Request w = c->send(MemRegion{out.data(), out.size()}, 1);
    if (!w.wait(std::chrono::seconds(30)).ok() || !r.wait(std::chrono::seconds(30)).ok())
      return std::fprintf(stderr, "transfer failed\n"), 3;
    if (std::memcmp(in.data(), out.data(), in.size()) != 0) return std::fprintf(stderr, "payload differs\n"), 3;
    // Alternate which side closes first; the other learns it from the peer.
    Status a = i % 2 ? c->close() : s->close();
    Status b = i % 2 ? s->close() : c->close();
    if (!a.ok() || !b.ok()) return std::fprintf(stderr, "close: %s / %s\n", a.to_string().c_str(), b.to_string().c_str()), 4;
  }
  return 0;
}
