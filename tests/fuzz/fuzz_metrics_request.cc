// Fuzzes parse_request_head, which reads every byte a peer sends to `dmx bench --metrics-port`.
// A verdict must be one of the documented ones, must stand whatever bytes follow (the server
// judges a head while it is still arriving), and a served head must end in a line end within
// kMaxRequestHead bytes and parse the same on its own.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tools/dmx/metrics_request.h"

using namespace dmx::cli;
using Verdict = RequestHead::Verdict;

namespace {

bool same(const RequestHead& a, const RequestHead& b) {
  return a.verdict == b.verdict && a.status == b.status && a.reason == b.reason && a.head_only == b.head_only &&
         a.length == b.length;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  RequestHead r = parse_request_head(in);
  switch (r.verdict) {
    case Verdict::kNeedMore:
      if (size >= kMaxRequestHead || r.status != 0) std::abort();
      break;
    case Verdict::kServe: {
      if (r.status != 200 || r.length == 0 || r.length > size || r.length > kMaxRequestHead) std::abort();
      if (in[r.length - 1] != '\n') std::abort();
      if (!in.starts_with(r.head_only ? "HEAD /metrics" : "GET /metrics")) std::abort();
      if (!same(parse_request_head(in.substr(0, r.length)), r)) std::abort();
      break;
    }
    case Verdict::kRefuse:
      if (r.reason.empty() || r.length != 0) std::abort();
      if (r.status != 400 && r.status != 404 && r.status != 405 && r.status != 413 && r.status != 431 &&
          r.status != 505)
        std::abort();
      if (status_text(r.status) == "Error") std::abort();
      break;
  }
  // More bytes never change a verdict, and a verdict on a prefix is the verdict on the whole.
  if (r.verdict != Verdict::kNeedMore) {
    std::string more(in);
    more += "GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\n";
    if (!same(parse_request_head(more), r)) std::abort();
  }
  RequestHead half = parse_request_head(in.substr(0, size / 2));
  if (half.verdict != Verdict::kNeedMore && !same(half, r)) std::abort();
  return 0;
}
