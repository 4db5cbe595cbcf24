#include "plugins/nccl/devices.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

namespace dmx::nccl {

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

void read_sysfs(Nic& nic) {
  std::ifstream speed("/sys/class/net/" + nic.name + "/speed");
  long mbps = 0;
  // Virtual NICs have no speed (EINVAL on read) or report -1.
  if (speed >> mbps && mbps > 0 && mbps <= INT_MAX) {
    nic.speed_mbps = static_cast<int>(mbps);
    nic.speed_known = true;
  }
  char resolved[PATH_MAX];
  std::string dev = "/sys/class/net/" + nic.name + "/device";
  if (::realpath(dev.c_str(), resolved) != nullptr && std::string(resolved).find("/pci") != std::string::npos)
    nic.pci_path = resolved;
}

}  // namespace

bool interface_selected(const std::string& name, const std::string& filter) {
  if (filter.empty()) {
    for (const char* p : {"lo", "docker", "virbr"})
      if (name.rfind(p, 0) == 0) return false;
    return true;
  }
  std::string f = filter;
  bool exclude = false, exact = false;
  if (!f.empty() && f[0] == '^') exclude = true, f.erase(0, 1);
  if (!f.empty() && f[0] == '=') exact = true, f.erase(0, 1);
  bool hit = false;
  for (const auto& item : split(f)) hit = hit || (exact ? name == item : name.rfind(item, 0) == 0);
  return exclude ? !hit : hit;
}

std::vector<Nic> discover_nics(std::string* note) {
  const char* env = std::getenv("DMX_NCCL_IFNAME");
  if (env == nullptr) env = std::getenv("NCCL_SOCKET_IFNAME");
  const std::string filter = env != nullptr ? env : "";

  ifaddrs* list = nullptr;
  std::map<std::string, Nic> v4, v6;
  std::vector<std::string> order;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr || (a->ifa_flags & IFF_UP) == 0 || (a->ifa_flags & IFF_RUNNING) == 0) continue;
      std::string name = a->ifa_name;
      if (!interface_selected(name, filter)) continue;
      char text[INET6_ADDRSTRLEN] = {};
      Nic nic;
      nic.name = name;
      if (a->ifa_addr->sa_family == AF_INET) {
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
        nic.host = text;
        if (!v4.count(name)) v4.emplace(name, nic);
      } else if (a->ifa_addr->sa_family == AF_INET6) {
        auto* s6 = reinterpret_cast<sockaddr_in6*>(a->ifa_addr);
        ::inet_ntop(AF_INET6, &s6->sin6_addr, text, sizeof text);
        nic.host = "[" + std::string(text) + (IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr) ? "%" + name : "") + "]";
        if (!v6.count(name)) v6.emplace(name, nic);
      } else {
        continue;
      }
      bool seen = false;
      for (const auto& o : order) seen = seen || o == name;
      if (!seen) order.push_back(name);
    }
    ::freeifaddrs(list);
  }
  std::vector<Nic> nics;
  for (const auto& name : order) {
    if (static_cast<int>(nics.size()) == kMaxDevices) break;
    auto it = v4.find(name);
    Nic nic = it != v4.end() ? it->second : v6.at(name);
    read_sysfs(nic);
    nics.push_back(nic);
  }
  if (nics.empty()) {
    Nic lo;
    lo.name = "lo";
    lo.host = "127.0.0.1";
    nics.push_back(lo);
    *note = filter.empty() ? "no interface up with an address beside lo: loopback only (one host)"
                           : "no interface matches '" + filter + "': loopback only (one host)";
  }
  return nics;
}

}  // namespace dmx::nccl
