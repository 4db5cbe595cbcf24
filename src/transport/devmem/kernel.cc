// The real kernel side of the seam: netdev genl bind-rx / bind-tx and a TCP socket's syscalls.
#include "transport/devmem/kernel.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/utsname.h>

#include <cerrno>
#include <cstdio>

#include "transport/devmem/kernel_abi.h"
#include "transport/devmem/netlink.h"

namespace dmx::devmem {
namespace {

class NetlinkBinding final : public Binding {
 public:
  NetlinkBinding(nl::GenlSocket sock, uint32_t id) : sock_(std::move(sock)), id_(id) {}
  uint32_t id() const override { return id_; }

 private:
  nl::GenlSocket sock_;  // closing it unbinds
  uint32_t id_;
};

class KernelNetlinkOps final : public NetlinkOps {
 public:
  const void* kernel_id() const override {
    static const char kRunningKernel = 0;
    return &kRunningKernel;
  }
  NetdevSupport detect() override {
    NetdevSupport s;
    auto sock = nl::GenlSocket::open();
    if (!sock.ok()) {
      s.detail = sock.status().message();
      return s;
    }
    auto fam = sock->resolve(abi::kNetdevFamilyName);
    if (!fam.ok()) {
      s.detail = fam.status().message();
      return s;
    }
    s.family = true;
    s.bind_rx = fam->has_op(abi::kCmdBindRx);
    s.bind_tx = fam->has_op(abi::kCmdBindTx);
    return s;
  }

  Result<std::unique_ptr<Binding>> bind_rx(int ifindex, int dmabuf_fd, std::span<const uint32_t> queues) override {
    std::string what = fmt::format("netdev bind-rx(ifindex {}, dmabuf fd {}, {} queues)", ifindex, dmabuf_fd, queues.size());
    return bind(abi::kCmdBindRx, ifindex, dmabuf_fd, queues, what);
  }
  Result<std::unique_ptr<Binding>> bind_tx(int ifindex, int dmabuf_fd) override {
    std::string what = fmt::format("netdev bind-tx(ifindex {}, dmabuf fd {})", ifindex, dmabuf_fd);
    return bind(abi::kCmdBindTx, ifindex, dmabuf_fd, {}, what);
  }

 private:
  static Result<std::unique_ptr<Binding>> bind(uint8_t cmd, int ifindex, int fd, std::span<const uint32_t> queues,
                                               const std::string& what) {
    // One socket per binding: the kernel ties the binding to the socket that made it.
    DMX_ASSIGN_OR_RETURN(auto sock, nl::GenlSocket::open());
    DMX_ASSIGN_OR_RETURN(auto fam, sock.resolve(abi::kNetdevFamilyName));
    if (!fam.has_op(cmd))
      return Status(Code::kUnavailable, fmt::format("{}: this kernel's netdev family has no op {} ({})", what, cmd,
                                                    cmd == abi::kCmdBindRx ? "Linux >= 6.12" : "Linux >= 6.16"));
    nl::GenlMessage m(fam.id, cmd, abi::kNetdevFamilyVersion, 0);
    m.put_u32(abi::kDmabufIfindex, static_cast<uint32_t>(ifindex));
    for (uint32_t q : queues) {
      size_t nest = m.begin_nest(abi::kDmabufQueues);
      m.put_u32(abi::kQueueId, q);
      m.put_u32(abi::kQueueType, abi::kQueueTypeRx);
      m.end_nest(nest);
    }
    m.put_u32(abi::kDmabufFd, static_cast<uint32_t>(fd));
    DMX_ASSIGN_OR_RETURN(auto replies, sock.request(m, what));
    for (const auto& r : replies) {
      auto attrs = nl::parse_attrs(r);
      if (const auto* id = nl::find_attr(attrs, abi::kDmabufId); id && id->u32())
        return std::unique_ptr<Binding>(new NetlinkBinding(std::move(sock), *id->u32()));
    }
    return Status(Code::kProtocol, what + ": the kernel's reply has no binding id");
  }
};

class PosixKernelSocket final : public KernelSocket {
 public:
  explicit PosixKernelSocket(int fd) : fd_(fd) {}
  ssize_t recvmsg(msghdr* msg, int flags) override {
    ssize_t n;
    do n = ::recvmsg(fd_, msg, flags);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : n;
  }
  ssize_t sendmsg(const msghdr* msg, int flags) override {
    ssize_t n;
    do n = ::sendmsg(fd_, msg, flags);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : n;
  }
  int setsockopt(int level, int name, const void* value, socklen_t len) override {
    int r = ::setsockopt(fd_, level, name, value, len);
    return r < 0 ? -errno : r;
  }
  int poll(short events, int timeout_ms) override {
    pollfd p{fd_, events, 0};
    int r;
    do r = ::poll(&p, 1, timeout_ms);
    while (r < 0 && errno == EINTR);
    if (r < 0) return -errno;
    return r == 0 ? 0 : p.revents;
  }

 private:
  int fd_;
};

}  // namespace

std::unique_ptr<NetlinkOps> make_kernel_netlink_ops() { return std::make_unique<KernelNetlinkOps>(); }
std::unique_ptr<KernelSocket> make_kernel_socket(int fd) { return std::make_unique<PosixKernelSocket>(fd); }

bool running_kernel_before(int major, int minor) {
  utsname u{};
  if (::uname(&u) != 0) return false;
  int a = 0, b = 0;
  if (std::sscanf(u.release, "%d.%d", &a, &b) != 2) return false;
  return a < major || (a == major && b < minor);
}

}  // namespace dmx::devmem
