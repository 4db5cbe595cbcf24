// Setting up the devmem payload path on the real NIC: whether it can be offered, and the flow rule
// that steers the data socket's packets to a devmem RX queue (see devmem_path.h).
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <optional>

#include "core/log.h"
#include "transport/devmem/devmem_path.h"
#include "transport/devmem/devmem.h"
#include "transport/devmem/nic.h"
#include "transport/devmem/probe_bind.h"
#include "transport/devmem/rule_ledger.h"

namespace dmx {

Status devmem_path_offer(const Config& config) {
  DMX_RETURN_IF_ERROR(devmem::usable(config.get_string("devmem_ifname")));
  const std::string& queues = config.get_string("devmem_queues");
  if (queues.empty())
    return Status(Code::kUnavailable, "devmem: setting devmem_queues is empty (the RX queues given to dmx devmem setup)");
  if (auto q = devmem::parse_queue_range(queues); !q.ok()) return Status(Code::kUnavailable, q.status().message());
  return Status();
}

Status devmem_zcrx_offer(const Config& config) {
  const std::string& ifname = config.get_string("devmem_ifname");
  auto seams = devmem::kernel_seams(config, static_cast<int>(config.get_int("devmem_gpu")));
  if (!seams.ok()) return Status(Code::kUnavailable, seams.status().message());
  // The probe reaches the dma-buf import without touching a queue; the queue API verdict is bind-rx's.
  uint32_t queue = seams->queues.empty() ? 0 : seams->queues.back();
  Capability rx = devmem::probe_bind_rx(*seams->netlink, ifname, seams->ifindex, queue);
  Capability z = devmem::probe_zcrx(ifname, seams->ifindex, queue, rx);
  if (!z.available) return Status(Code::kUnavailable, "zcrx: " + z.detail);
  return Status();
}

namespace {

// Removes a flow rule when the last holder lets go (the path, after its socket closed), and its
// line in the rule ledger (rule_ledger.h), which records it meanwhile for `dmx devmem teardown`.
struct FlowRuleGuard {
  std::unique_ptr<devmem::NicOps> nic;
  std::unique_ptr<devmem::RuleLedger> ledger;
  std::string ifname, peer;
  uint32_t location = 0;
  ~FlowRuleGuard() {
    if (Status s = nic->delete_flow_rule(ifname, location); !s.ok()) {
      DMX_LOG_WARN("devmem path to {}: removing flow rule {} of {}: {} (left in {} for dmx devmem teardown)", peer,
                   location, ifname, s.message(), ledger->path());
      return;
    }
    if (Status s = ledger->remove(location); !s.ok())
      DMX_LOG_WARN("devmem path to {}: rule ledger {}: {}", peer, ledger->path(), s.message());
  }
};

// The rule that steers packets from `remote` to `local` (tcp4 or tcp6) to `queue`.
Result<devmem::FlowRule> rule_for(const sockaddr_storage& local, const sockaddr_storage& remote, uint32_t queue) {
  devmem::FlowRule rule;
  rule.queue = queue;
  if (local.ss_family == AF_INET && remote.ss_family == AF_INET) {
    auto& l = reinterpret_cast<const sockaddr_in&>(local);
    auto& r = reinterpret_cast<const sockaddr_in&>(remote);
    rule.dst_ip = l.sin_addr.s_addr;
    rule.dst_port = ntohs(l.sin_port);
    rule.src_ip = r.sin_addr.s_addr;
    rule.src_port = ntohs(r.sin_port);
    return rule;
  }
  if (local.ss_family == AF_INET6 && remote.ss_family == AF_INET6) {
    auto& l = reinterpret_cast<const sockaddr_in6&>(local);
    auto& r = reinterpret_cast<const sockaddr_in6&>(remote);
    if (IN6_IS_ADDR_V4MAPPED(&l.sin6_addr)) {  // an IPv4 peer on a dual-stack socket: a tcp4 rule
      rule.dst_ip = l.sin6_addr.s6_addr32[3];
      rule.src_ip = r.sin6_addr.s6_addr32[3];
    } else {
      rule.ipv6 = true;
      std::memcpy(rule.dst_ip6.data(), &l.sin6_addr, 16);
      std::memcpy(rule.src_ip6.data(), &r.sin6_addr, 16);
    }
    rule.dst_port = ntohs(l.sin6_port);
    rule.src_port = ntohs(r.sin6_port);
    return rule;
  }
  return Status(Code::kUnavailable, "devmem path: the data socket is neither TCP over IPv4 nor over IPv6");
}

// Steers this data socket's incoming packets to `queue` (zcrx's) or, when nullopt, to one of the
// devmem RX queues chosen by port (ETHTOOL_SRXCLSRLINS at a free location, dst = our address and
// port, src = the peer's), so that its payload lands in the bound pool or the zcrx area.
Result<std::shared_ptr<void>> steer_data_socket(int fd, const devmem::HostSeams& seams, const std::string& peer,
                                                const std::string& state_dir, std::optional<uint32_t> queue) {
  sockaddr_storage local{}, remote{};
  socklen_t ll = sizeof local, rl = sizeof remote;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) return errno_status("getsockname", errno);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &rl) != 0) return errno_status("getpeername", errno);
  if (seams.queues.empty()) return Status(Code::kUnavailable, "devmem path: no devmem RX queues (devmem_queues)");
  uint16_t port = local.ss_family == AF_INET6 ? ntohs(reinterpret_cast<const sockaddr_in6&>(local).sin6_port)
                                              : ntohs(reinterpret_cast<const sockaddr_in&>(local).sin_port);
  DMX_ASSIGN_OR_RETURN(devmem::FlowRule rule,
                       rule_for(local, remote, queue ? *queue : seams.queues[port % seams.queues.size()]));
  auto g = std::make_shared<FlowRuleGuard>();
  g->nic = devmem::make_kernel_nic_ops();
  g->ledger = std::make_unique<devmem::RuleLedger>(devmem::RuleLedger::path_for(state_dir, seams.ifname));
  g->ifname = seams.ifname;
  g->peer = peer;
  auto loc = devmem::add_flow_rule(*g->nic, seams.ifname, rule);
  if (!loc.ok())
    return Status(loc.status().code(), fmt::format("devmem path: steering the data socket to queue {} of {}: {}",
                                                   rule.queue, seams.ifname, loc.status().message()));
  g->location = *loc;
  if (Status s = g->ledger->add(*loc); !s.ok())
    DMX_LOG_WARN("devmem path to {}: rule ledger {}: {} (rule {} is not recorded for teardown)", peer,
                 g->ledger->path(), s.message(), *loc);
  DMX_LOG_INFO("devmem path to {}: flow rule {} on {} steers {} port {} to queue {}", peer, *loc, seams.ifname,
               rule.ipv6 ? "tcp6" : "tcp4", rule.dst_port, rule.queue);
  return std::shared_ptr<void>(std::move(g));
}

}  // namespace

Result<std::unique_ptr<PayloadPath>> make_devmem_path(UniqueFd data_socket, const Config& config, std::string peer,
                                                      int cuda_device) {
  DMX_ASSIGN_OR_RETURN(devmem::HostSeams seams, devmem::kernel_seams(config, cuda_device));
  if (!data_socket.valid()) return Status(Code::kInvalidArgument, "devmem path: no data socket");
  int fd = data_socket.get();
  DevmemSteer steer = [fd, seams, peer, dir = config.get_string("devmem_state_dir")](std::optional<uint32_t> q) {
    return steer_data_socket(fd, seams, peer, dir, q);
  };
  return make_devmem_path(std::move(data_socket), config, std::move(peer), std::move(seams), std::move(steer));
}

}  // namespace dmx
