// Socket helpers for the TCP control channel and data streams.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "core/clock.h"
#include "core/sys.h"
#include "dmx/status.h"

namespace dmx::stream {

struct Address {
  std::string host;  // as written (no brackets)
  uint16_t port = 0;
  std::string to_string() const;  // "tcp://host:port" ("tcp://[::1]:port" for IPv6)
};

// "tcp://host:port", "tcp://[v6]:port" or "host:port".
Result<Address> parse_address(const std::string& url);

// A listening socket bound to `addr` (port 0: any free port).
Result<UniqueFd> listen_on(const Address& addr, int backlog = 128);
// The address a socket is bound to / connected to, as "host:port".
std::string local_name(int fd);
std::string peer_name(int fd);

// Connects with a deadline (non-blocking connect + poll). The socket is returned non-blocking.
// A non-empty `bind_device` is applied with SO_BINDTODEVICE before connect (the route then leaves
// through it; binding a connected socket would reset its route). A refusal (nobody listens at
// `addr`) fails at once with "connection refused by ADDR: nobody listens there" and sets *refused.
Result<UniqueFd> connect_to(const Address& addr, Deadline deadline, const std::string& bind_device = {},
                            bool* refused = nullptr);

struct StreamOptions {
  int socket_buffer = 0;                 // 0 keeps the kernel's autotuning
  unsigned user_timeout_ms = 0;          // TCP_USER_TIMEOUT; 0 leaves the default
};
Status configure_stream(int fd, const StreamOptions& o);
// TCP_USER_TIMEOUT for a stream whose own checks use `peer_timeout` (from the last byte it wrote
// or read): a backstop behind them, as they name the cause. Twice peer_timeout: the kernel counts
// from when the peer's receive window closed, which can come seconds before the stream's last
// write into a send buffer still filling (a peer that floods us and reads none of the replies).
unsigned user_timeout_ms(std::chrono::microseconds peer_timeout);

// Blocking-with-deadline exact I/O for the handshake (sockets are non-blocking).
Status send_exact(int fd, const void* data, size_t n, Deadline deadline, const std::string& peer);
Status recv_exact(int fd, void* data, size_t n, Deadline deadline, const std::string& peer);

}  // namespace dmx::stream
