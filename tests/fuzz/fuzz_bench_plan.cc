// Fuzzes the bench protocol's JSON, which `dmx bench` reads from its peer: the plan a server gets
// from a client (plan_from_json) and the reply a client gets back (reply_from_json). A plan that
// parses must be within the documented bounds and survive to_json -> plan_from_json unchanged.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tools/dmx/bench.h"

using namespace dmx;
using namespace dmx::bench;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto p = plan_from_json(text);
  if (p.ok()) {
    if (p->op != "send" && p->op != "write" && p->op != "read") std::abort();
    if (p->window < 1 || p->window > 64 || p->warmup > 16) std::abort();
    auto again = plan_from_json(to_json(*p));
    if (!again.ok()) std::abort();
    if (again->op != p->op || again->size != p->size || again->iters != p->iters || again->window != p->window ||
        again->lat_iters != p->lat_iters || again->warmup != p->warmup || again->peer_mem != p->peer_mem ||
        again->verify != p->verify || again->checksum != p->checksum || again->crc != p->crc || again->quit != p->quit)
      std::abort();
  } else if (p.status().code() != Code::kProtocol) {
    std::abort();
  }
  auto r = reply_from_json(text);
  if (r.ok()) {
    auto again = reply_from_json(to_json(*r));
    if (!again.ok() || again->region.key != r->region.key || again->region.size != r->region.size ||
        again->error != r->error || again->transport != r->transport)
      std::abort();
  } else if (r.status().code() != Code::kProtocol) {
    std::abort();
  }
  return 0;
}
