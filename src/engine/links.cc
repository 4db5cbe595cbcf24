#include "engine/links.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <array>
#include <cstring>
#include <sstream>

#include "stream/socket.h"

namespace dmx {
namespace {

using Bytes = std::array<unsigned char, 16>;

bool parse(const std::string& text, int* family, Bytes* out) {
  std::string t = text;
  if (t.size() > 2 && t.front() == '[' && t.back() == ']') t = t.substr(1, t.size() - 2);
  out->fill(0);
  if (::inet_pton(AF_INET, t.c_str(), out->data()) == 1) {
    *family = AF_INET;
    return true;
  }
  if (::inet_pton(AF_INET6, t.c_str(), out->data()) == 1) {
    *family = AF_INET6;
    return true;
  }
  return false;
}

unsigned prefix_of(const sockaddr* mask) {
  const unsigned char* b = nullptr;
  size_t n = 0;
  if (mask->sa_family == AF_INET) {
    b = reinterpret_cast<const unsigned char*>(&reinterpret_cast<const sockaddr_in*>(mask)->sin_addr);
    n = 4;
  } else if (mask->sa_family == AF_INET6) {
    b = reinterpret_cast<const unsigned char*>(&reinterpret_cast<const sockaddr_in6*>(mask)->sin6_addr);
    n = 16;
  }
  unsigned bits = 0;
  for (size_t i = 0; i < n; ++i) bits += static_cast<unsigned>(__builtin_popcount(b[i]));
  return bits;
}

bool same_subnet(const LocalAddress& mine, const std::string& other) {
  int fa = 0, fb = 0;
  Bytes a{}, b{};
  if (!parse(mine.address, &fa, &a) || !parse(other, &fb, &b) || fa != fb) return false;
  unsigned bits = mine.prefix;
  for (size_t i = 0; i < 16 && bits > 0; ++i, bits = bits >= 8 ? bits - 8 : 0) {
    unsigned char m = bits >= 8 ? 0xff : static_cast<unsigned char>(0xff << (8 - bits));
    if ((a[i] & m) != (b[i] & m)) return false;
  }
  return true;
}

bool same_address(const std::string& x, const std::string& y) {
  int fa = 0, fb = 0;
  Bytes a{}, b{};
  return parse(x, &fa, &a) && parse(y, &fb, &b) && fa == fb && a == b;
}

bool named(const std::string& nics, const std::string& ifname) {
  if (nics.empty()) return true;
  std::stringstream ss(nics);
  for (std::string item; std::getline(ss, item, ',');)
    if (item == ifname) return true;
  return false;
}

}  // namespace

std::vector<LocalAddress> local_addresses(const std::string& nics) {
  std::vector<LocalAddress> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_netmask == nullptr) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (!named(nics, i->ifa_name)) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw = family == AF_INET
                          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr)
                          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr);
    if (family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(static_cast<const in6_addr*>(raw))) continue;  // needs a scope
    if (::inet_ntop(family, raw, text, sizeof text) == nullptr) continue;
    out.push_back(LocalAddress{i->ifa_name, text, family, prefix_of(i->ifa_netmask)});
  }
  ::freeifaddrs(list);
  return out;
}

std::vector<std::string> advertised_addresses(const std::string& listen_host, const std::string& primary,
                                              const std::string& nics) {
  std::vector<std::string> out;
  if (listen_host != "0.0.0.0" && listen_host != "::" && listen_host != "[::]" && !listen_host.empty()) return out;
  for (const LocalAddress& a : local_addresses(nics)) {
    if (same_address(a.address, primary) || out.size() >= 16) continue;
    bool dup = false;
    for (const auto& o : out) dup = dup || o == a.address;
    if (!dup) out.push_back(a.address);
  }
  return out;
}

std::vector<Link> plan_links(const std::string& local, const std::string& remote,
                             const std::vector<std::string>& listed, const std::string& nics) {
  std::vector<LocalAddress> mine = local_addresses(nics);
  Link first{"", local, remote};
  for (const LocalAddress& a : local_addresses(""))  // stream 0's interface, named or not
    if (same_address(a.address, local)) first.ifname = a.ifname;
  std::vector<Link> links{first};
  for (const LocalAddress& a : mine) {
    bool taken = false;
    for (const Link& l : links) taken = taken || l.ifname == a.ifname || same_address(l.local, a.address);
    if (taken) continue;
    for (const std::string& r : listed) {
      bool used = false;
      for (const Link& l : links) used = used || same_address(l.remote, r);
      if (!used && same_subnet(a, r)) {
        links.push_back(Link{a.ifname, a.address, r});
        break;
      }
    }
  }
  // Named interfaces only, where any of them reaches the server: stream 0 went where the address
  // routes, which may be another NIC.
  if (!nics.empty() && links.size() > 1 && !named(nics, links[0].ifname)) links.erase(links.begin());
  return links;
}

std::vector<std::string> stream_routes(const std::vector<UniqueFd>& fds) {
  std::vector<std::string> out;
  for (const auto& fd : fds) out.push_back(fmt::format("{} -> {}", stream::local_name(fd.get()), stream::peer_name(fd.get())));
  return out;
}

std::string describe_links(const std::vector<Link>& links) {
  std::string s;
  for (const Link& l : links)
    s += fmt::format("{}{}{} -> {}", s.empty() ? "" : ", ", l.ifname.empty() ? "" : l.ifname + " ", l.local, l.remote);
  return s;
}

}  // namespace dmx
