// The metrics port's request head parser (metrics_http.h serves; tests/fuzz/fuzz_metrics_request.cc
// fuzzes): a pure function over the bytes a peer has sent so far on one connection.
//
// Only `GET /metrics` and `HEAD /metrics` (a query string is ignored) over HTTP/1.0 or 1.1 are
// served. A scrape has no body: a nonzero Content-Length or any Transfer-Encoding is refused. Range
// and every other header are ignored. The head (request line, headers, blank line) must fit in
// kMaxRequestHead bytes with at most kMaxRequestHeaders header lines; lines end in CRLF or LF.
// The verdict depends only on the head: bytes after it never change it. Thread-safe (no state).
#pragma once

#include <cstddef>
#include <string_view>

namespace dmx::cli {

inline constexpr size_t kMaxRequestHead = 8192;
inline constexpr size_t kMaxRequestHeaders = 64;

struct RequestHead {
  enum class Verdict {
    kNeedMore,  // no verdict yet: read more (never with kMaxRequestHead bytes or more)
    kServe,     // a valid scrape: answer 200 with the page (head_only: no body)
    kRefuse,    // answer `status` with `reason`, then close
  };
  Verdict verdict = Verdict::kNeedMore;
  int status = 0;           // kServe: 200; kRefuse: 400, 404, 405, 413, 431 or 505
  std::string_view reason;  // kRefuse: a static text for the reply and the log
  bool head_only = false;   // kServe: the method was HEAD
  size_t length = 0;        // kServe: bytes of the head, blank line included
};

RequestHead parse_request_head(std::string_view bytes);

// "Not Found" for 404 and so on; "Error" for a status parse_request_head never returns.
std::string_view status_text(int status);

}  // namespace dmx::cli
