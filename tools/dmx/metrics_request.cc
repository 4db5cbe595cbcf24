// The metrics port's request head parser (metrics_request.h). Lines are judged in order as they
// complete, and the first verdict stands: a later byte can never change it.
#include "tools/dmx/metrics_request.h"

#include <algorithm>
#include <cstring>

namespace dmx::cli {
namespace {

using Verdict = RequestHead::Verdict;

RequestHead refuse(int status, std::string_view reason) {
  return {Verdict::kRefuse, status, reason, false, 0};
}

bool is_tchar(unsigned char c) {
  return c != '\0' && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                       std::strchr("!#$%&'*+-.^_`|~", c) != nullptr);
}

bool is_token(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return is_tchar(static_cast<unsigned char>(c)); });
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
           return lower(x) == lower(y);
         });
}

// The request line: METHOD SP TARGET SP HTTP/D.D. A verdict, or kNeedMore when it is a scrape.
RequestHead request_line(std::string_view line, bool* head_only) {
  size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos) return refuse(400, "malformed request line");
  size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return refuse(400, "malformed request line");
  std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (!is_token(method)) return refuse(400, "malformed method");
  if (target.empty() || !std::all_of(target.begin(), target.end(), [](char c) {
        auto u = static_cast<unsigned char>(c);
        return u > 0x20 && u < 0x7f;
      }))
    return refuse(400, "malformed request target");
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.' || version[5] < '0' ||
      version[5] > '9' || version[7] < '0' || version[7] > '9')
    return refuse(400, "malformed HTTP version");
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return refuse(505, "only HTTP/1.0 and HTTP/1.1 are served");
  if (method != "GET" && method != "HEAD") return refuse(405, "only GET and HEAD are served");
  if (target.substr(0, target.find('?')) != "/metrics") return refuse(404, "only /metrics is served");
  *head_only = method == "HEAD";
  return {};
}

// One header line (not empty). A verdict, or kNeedMore to go on.
RequestHead header_line(std::string_view line) {
  if (line[0] == ' ' || line[0] == '\t') return refuse(400, "folded header line");
  size_t colon = line.find(':');
  if (colon == std::string_view::npos || !is_token(line.substr(0, colon))) return refuse(400, "malformed header line");
  std::string_view name = line.substr(0, colon);
  std::string_view value = line.substr(colon + 1);
  for (char c : value) {
    auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && u != '\t') || u == 0x7f) return refuse(400, "control character in a header value");
  }
  auto ows = [](char c) { return c == ' ' || c == '\t'; };
  while (!value.empty() && ows(value.front())) value.remove_prefix(1);
  while (!value.empty() && ows(value.back())) value.remove_suffix(1);
  if (iequals(name, "transfer-encoding")) return refuse(413, "a scrape has no body (Transfer-Encoding)");
  if (iequals(name, "content-length")) {
    if (value.empty() || !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return refuse(400, "malformed Content-Length");
    if (value.find_first_not_of('0') != std::string_view::npos) return refuse(413, "a scrape has no body");
  }
  return {};
}

}  // namespace

RequestHead parse_request_head(std::string_view bytes) {
  // Only the first kMaxRequestHead bytes are looked at: a head must end within them.
  std::string_view window = bytes.substr(0, kMaxRequestHead);
  bool head_only = false;
  size_t headers = 0;
  size_t pos = 0;
  for (bool first = true;; first = false) {
    size_t nl = window.find('\n', pos);
    if (nl == std::string_view::npos) break;
    std::string_view line = window.substr(pos, nl - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find('\r') != std::string_view::npos) return refuse(400, "bare CR in the request head");
    pos = nl + 1;
    if (first) {
      if (line.empty()) return refuse(400, "empty request line");
      RequestHead r = request_line(line, &head_only);
      if (r.verdict != Verdict::kNeedMore) return r;
      continue;
    }
    if (line.empty()) return {Verdict::kServe, 200, {}, head_only, pos};
    if (++headers > kMaxRequestHeaders) return refuse(431, "too many header lines");
    RequestHead r = header_line(line);
    if (r.verdict != Verdict::kNeedMore) return r;
  }
  if (bytes.size() >= kMaxRequestHead) return refuse(431, "request head over 8192 bytes");
  return {};
}

std::string_view status_text(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Error";
  }
}

}  // namespace dmx::cli
