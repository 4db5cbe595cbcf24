// Finding a client's TCP streams from inside the test process, to cut them (multilink, reconnect).
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace dmx::test {

inline uint16_t port_of(const std::string& address) {
  return static_cast<uint16_t>(std::atoi(address.substr(address.rfind(':') + 1).c_str()));
}

// This process's TCP sockets connected to `port` (the client's streams), in fd order: stream 0
// was opened first.
inline std::vector<int> client_sockets(uint16_t port) {
  std::vector<int> fds;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return fds;
  while (dirent* e = ::readdir(d)) {
    int fd = std::atoi(e->d_name);
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (fd <= 2 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) continue;
    if (ss.ss_family == AF_INET && ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port) == port) fds.push_back(fd);
  }
  ::closedir(d);
  std::sort(fds.begin(), fds.end());
  return fds;
}

}  // namespace dmx::test
