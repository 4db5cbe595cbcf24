#include "store/store.h"

#include <fmt/format.h>

#include <charconv>

namespace dmx::store {

Result<std::unique_ptr<Store>> open_store(const std::string& url, std::chrono::milliseconds call_timeout) {
  std::string_view u = url;
  std::string scheme;
  if (auto p = u.find("://"); p != std::string_view::npos) {
    scheme = std::string(u.substr(0, p));
    u.remove_prefix(p + 3);
  }
  if (!u.empty() && u.back() == '/') u.remove_suffix(1);
  auto colon = u.rfind(':');
  int port = 0;
  std::string host;
  if (colon != std::string_view::npos) {
    host = std::string(u.substr(0, colon));
    auto ps = u.substr(colon + 1);
    auto [ptr, ec] = std::from_chars(ps.data(), ps.data() + ps.size(), port);
    if (ec != std::errc() || ptr != ps.data() + ps.size() || port <= 0 || port > 65535) port = -1;
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty() || port <= 0)
    return Status(Code::kInvalidArgument,
                  fmt::format("store address '{}': want etcd://host:port or tcpstore://host:port", url));
  if (scheme == "etcd" || scheme == "http") return make_etcd_store(host, port, call_timeout);
  if (scheme == "tcpstore" || scheme == "tcp") return make_tcp_store(host, port, call_timeout);
  return Status(Code::kInvalidArgument,
                fmt::format("store address '{}': unknown scheme '{}' (etcd://host:port or tcpstore://host:port)", url,
                            scheme));
}

}  // namespace dmx::store
