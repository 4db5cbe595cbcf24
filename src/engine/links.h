// Several NICs: which local interfaces an endpoint's data streams leave from, and which of the
// peer's addresses each reaches (docs/architecture.md, "Several NICs").
//
// The server lists in its HELLO the addresses of its other interfaces that take streams on the
// listener's port (a listener bound to a wildcard address only). The client pairs each of its own
// interfaces with a listed address in the same subnet: each such pair is a link, the first being
// the one stream 0 took. Data streams go round the links. The `nics` setting (interface names,
// comma-separated) narrows both sides' lists; empty takes every interface that is up, not
// loopback, with an address. Pure functions over getifaddrs(); thread-safe.
#pragma once

#include <string>
#include <vector>

#include "core/sys.h"
#include "dmx/status.h"

namespace dmx {

// An address of a local interface.
struct LocalAddress {
  std::string ifname;
  std::string address;  // literal, no port
  int family = 0;       // AF_INET, AF_INET6
  unsigned prefix = 0;  // bits of the subnet
};

// The interfaces' addresses that are up and not loopback, narrowed to `nics` (comma-separated
// names; empty: all).
std::vector<LocalAddress> local_addresses(const std::string& nics);

// Server: what its HELLO lists besides `primary` (the address the client reached), when the
// listener took `listen_host` (only a wildcard listener takes streams on other addresses).
std::vector<std::string> advertised_addresses(const std::string& listen_host, const std::string& primary,
                                              const std::string& nics);

// One link: data streams leave from `ifname` (empty: where the route says) for `remote`.
struct Link {
  std::string ifname, local, remote;
};

// Client: the links to a server reached at `remote` from `local` (stream 0's socket), given the
// server's listed addresses. Link 0 is stream 0's (left out when `nics` does not name it and a
// named one matches); the others pair another local interface with a listed address in its subnet.
// One link when no other interface matches.
std::vector<Link> plan_links(const std::string& local, const std::string& remote,
                             const std::vector<std::string>& listed, const std::string& nics);

// Per socket: "local -> remote" (stream::local_name, peer_name).
std::vector<std::string> stream_routes(const std::vector<UniqueFd>& fds);

// "eth0 10.0.0.1 -> 10.0.0.2, eth1 10.0.1.1 -> 10.0.1.2", for logs and the session's reason.
std::string describe_links(const std::vector<Link>& links);

}  // namespace dmx
