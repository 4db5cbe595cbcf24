// The seam between devmem logic and the kernel.
//
// Everything above this file (fragment bookkeeping, gather, token return, TX completions, NIC
// setup plans) is tested on every machine against a test double (tests/devmem/kernel_double.*)
// that reproduces what Linux 6.18 does. Everything below it is small: a few system calls.
//
//  - NetlinkOps: privileged binding of dmabufs to NIC queues (netdev genl bind-rx / bind-tx).
//    It can live in a helper process; a Binding's netlink socket fd can be passed over
//    SCM_RIGHTS, since the binding belongs to whoever holds that socket.
//  - KernelSocket: one connected TCP socket's devmem calls, returning -errno on failure like
//    the raw syscalls, so the double can reproduce the kernel's errors exactly.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/sys.h"
#include "dmx/status.h"

namespace dmx::devmem {

// A dmabuf bound to a NIC. Destroying it unbinds (it closes the netlink socket that created it;
// the kernel has no explicit unbind). Thread-safety: immutable after creation.
class Binding {
 public:
  virtual ~Binding() = default;
  virtual uint32_t id() const = 0;  // the kernel's binding id (dmabuf_id in cmsgs)
};

struct NetdevSupport {
  bool family = false;   // the "netdev" generic-netlink family exists
  bool bind_rx = false;  // op 13 offered (Linux >= 6.12)
  bool bind_tx = false;  // op 15 offered (Linux >= 6.16)
  std::string detail;    // why not, when !family
};

// Thread-safety: calls may come from any thread; each call uses its own netlink socket.
class NetlinkOps {
 public:
  virtual ~NetlinkOps() = default;
  virtual NetdevSupport detect() = 0;
  // Which kernel answers: bindings made through ops with one id share one set of NIC queues (the
  // running kernel: one static address for every instance; a double: its own state).
  virtual const void* kernel_id() const = 0;
  // Errors carry the kernel's errno text and extended-ack message verbatim.
  virtual Result<std::unique_ptr<Binding>> bind_rx(int ifindex, int dmabuf_fd, std::span<const uint32_t> queues) = 0;
  virtual Result<std::unique_ptr<Binding>> bind_tx(int ifindex, int dmabuf_fd) = 0;
};

// The real one: one netlink socket per binding, kept open for the binding's lifetime.
std::unique_ptr<NetlinkOps> make_kernel_netlink_ops();

// One TCP socket's devmem system calls. Return values follow the syscalls but errors are
// returned as -errno (never through the global errno). Owned by one thread at a time.
class KernelSocket {
 public:
  virtual ~KernelSocket() = default;
  virtual ssize_t recvmsg(msghdr* msg, int flags) = 0;
  virtual ssize_t sendmsg(const msghdr* msg, int flags) = 0;
  // setsockopt returning the kernel's return value (SO_DEVMEM_DONTNEED returns a count).
  virtual int setsockopt(int level, int name, const void* value, socklen_t len) = 0;
  // poll(2) on this socket: revents, 0 on timeout, or -errno.
  virtual int poll(short events, int timeout_ms) = 0;
};

// Whether the running kernel (uname) is older than major.minor; false when it cannot be parsed.
bool running_kernel_before(int major, int minor);

// Wraps a connected TCP socket (not owned: the caller keeps the fd open longer than this).
std::unique_ptr<KernelSocket> make_kernel_socket(int fd);

}  // namespace dmx::devmem
