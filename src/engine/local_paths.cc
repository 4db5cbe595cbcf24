#include "engine/local_paths.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <tuple>

#include "core/log.h"
#include "engine/auth.h"
#include "engine/control_pipe.h"
#include "engine/devmem_path.h"
#include "engine/ipc_path.h"
#include "engine/shm_path.h"

namespace dmx {
namespace {

// Whether a side channel's peer, as the kernel reports it (SO_PEERCRED), is this process.
bool same_process(const LocalChannels& channels) {
  for (const auto* ch : {&channels.shm, &channels.control, &channels.fds})
    if (ch->has_value() && (*ch)->peer_pid() == ::getpid()) return true;
  return false;
}

bool allowed(const std::string& forced, std::string_view path) { return forced == "auto" || forced == path; }

void note(std::string* out, const std::string& text) {
  if (!out->empty()) *out += "; ";
  *out += text;
}

// What a side channel is for: the server's first message on it says so.
enum class Purpose : unsigned char { kShm = 's', kControl = 'c', kFds = 'f' };

// The server's first message on a side channel: session id, proof, purpose.
std::vector<std::byte> channel_proof(const ContextImpl& ctx, const wire::Hello& client, const wire::Hello& server,
                                     Purpose purpose) {
  std::vector<std::byte> m(8 + 32 + 1);
  std::memcpy(m.data(), &server.session, 8);
  if (!ctx.auth().insecure) {
    wire::Proof p = make_proof(ctx.auth(), kLocalLabel, client.nonce, server.nonce, server.session);
    std::memcpy(m.data() + 8, p.data(), p.size());
  }
  m[40] = static_cast<std::byte>(purpose);
  return m;
}

// Client: accepts the server's side channels on `listener` and sorts them by purpose. Each must
// prove the session; `count` are expected.
Status accept_channels(const ContextImpl& ctx, const wire::Hello& client, const wire::Hello& server,
                       shm::UnixListener& listener, int count, LocalChannels* out, const std::string& peer,
                       Deadline deadline) {
  for (int i = 0; i < count; ++i) {
    DMX_ASSIGN_OR_RETURN(shm::UnixChannel ch, listener.accept(deadline));
    std::vector<std::byte> msg;
    std::vector<UniqueFd> fds;
    DMX_RETURN_IF_ERROR(ch.recv(&msg, 0, &fds, deadline));
    Purpose purpose = Purpose::kShm;
    if (msg.size() == 41 && msg[40] == std::byte{'c'}) purpose = Purpose::kControl;
    if (msg.size() == 41 && msg[40] == std::byte{'f'}) purpose = Purpose::kFds;
    std::vector<std::byte> expect = channel_proof(ctx, client, server, purpose);
    auto& slot = purpose == Purpose::kControl ? out->control : purpose == Purpose::kFds ? out->fds : out->shm;
    if (msg.size() != expect.size() || std::memcmp(msg.data(), expect.data(), expect.size()) != 0 || slot)
      return Status(Code::kAuth, fmt::format("a side channel from {} did not prove the session", ch.peer_name()))
          .with_peer(peer);
    slot.emplace(std::move(ch));
  }
  return Status();
}

}  // namespace

void offer_paths(const ContextImpl& ctx, wire::Hello* hello, std::optional<shm::UnixListener>* listener,
                 std::string* why_not) {
  const std::string& forced = ctx.params().transport;
  bool want_shm = allowed(forced, "shm");
  bool want_pipe = forced != "tcp" && forced != "devmem" && ctx.config().get_bool("control_pipe");
  Status ipc = allowed(forced, "cuda_ipc") ? cuda_ipc_path_available() : Status(Code::kUnavailable, "not asked");
  // The Unix socket serves the shm path, the control pipe and cuda_ipc's fd channel.
  if (want_shm || want_pipe || ipc.ok()) {
    Status s = shm::available();
    if (s.ok() && listener != nullptr) {
      auto l = shm::UnixListener::listen();
      if (l.ok()) {
        hello->local_channel = l->path();
        listener->emplace(std::move(*l));
      } else {
        s = l.status();
      }
    }
    if (s.ok()) hello->transports |= (want_shm ? uint64_t{wire::kTransportShm} : 0) |
                                     (want_pipe ? uint64_t{wire::kTransportControlPipe} : 0);
    else note(why_not, s.message().starts_with("shm") ? s.message() : "shm: " + s.message());
  }
  if (allowed(forced, "cuda_ipc")) {
    if (ipc.ok())
      hello->transports |= wire::kTransportCudaIpc;
    else
      note(why_not, ipc.message().starts_with("cuda_ipc") ? ipc.message() : "cuda_ipc: " + ipc.message());
  }
  if (allowed(forced, "devmem")) {
    Status s = devmem_offer(ctx);
    if (s.ok()) hello->transports |= wire::kTransportDevmem;
    else note(why_not, s.message().starts_with("devmem") ? s.message() : "devmem: " + s.message());
  }
}

Status devmem_offer(const ContextImpl& ctx) {
  if (ctx.devmem_factory()) return Status();  // a test double stands in for the NIC
  return devmem_path_offer(ctx.config());
}

void accept_paths(const ContextImpl& ctx, const wire::Hello& client, wire::Hello* server, LocalChannels* channels,
                  std::string* why_not) {
  uint64_t local = wire::kTransportShm | wire::kTransportCudaIpc | wire::kTransportControlPipe;
  uint64_t both = client.transports & server->transports & local;
  bool same_host = !client.boot_id.empty() && client.boot_id == server->boot_id && client.hostname == server->hostname;
  // devmem is for peers on different hosts (between two processes of one host the route is
  // loopback, which cannot carry devmem). Only a server forced to devmem keeps it for a same-host
  // client: then both sides decide from the same HELLOs whichever side was forced.
  if (client.transports & server->transports & wire::kTransportDevmem) {
    if (same_host && ctx.params().transport != "devmem") {
      server->transports &= ~uint64_t{wire::kTransportDevmem};
      note(why_not, "devmem not used: both ends are on one host (set transport=devmem on the server to force it)");
    }
  } else if (server->transports & wire::kTransportDevmem) {
    note(why_not, "devmem not used: the client does not offer it (see its log)");
  }
  if (both == 0) {
    server->transports &= ~local;
    return;
  }
  if (!same_host) {
    server->transports &= ~local;
    if (both & (wire::kTransportShm | wire::kTransportCudaIpc)) note(why_not, "shm and cuda_ipc need both ends on one host");
    return;
  }
  // Each side channel: connected now, proven by the first message.
  // cuda_ipc's channel carries the fds of cuMem allocations (engine/ipc_fds.h); cuda_ipc is not used
  // without it, so that both sides count the same channels.
  for (auto [bit, purpose, name] :
       {std::tuple{uint64_t{wire::kTransportShm}, Purpose::kShm, "shm"},
        std::tuple{uint64_t{wire::kTransportControlPipe}, Purpose::kControl, "control pipe"},
        std::tuple{uint64_t{wire::kTransportCudaIpc}, Purpose::kFds, "cuda_ipc"}}) {
    if ((both & bit) == 0) continue;
    Deadline deadline = Deadline::after(std::chrono::seconds(1));
    Status s;
    if (client.local_channel.empty()) {
      s = Status(Code::kProtocol, fmt::format("the client offered the {} without a side channel", name));
    } else {
      auto ch = shm::UnixChannel::connect(client.local_channel, deadline);
      if (ch.ok()) {
        s = ch->send(channel_proof(ctx, client, *server, purpose), {}, deadline);
        if (s.ok())
          (purpose == Purpose::kShm   ? channels->shm
           : purpose == Purpose::kFds ? channels->fds
                                      : channels->control)
              .emplace(std::move(*ch));
      } else {
        s = ch.status();
      }
    }
    if (!s.ok()) {
      server->transports &= ~bit;
      note(why_not, fmt::format("{} not used: the client's side channel {} could not be reached ({}; another "
                                "network namespace?)",
                                name, client.local_channel, s.message()));
    }
  }
  // After the side channels: their kernel credentials tell whether the client is this process.
  if (both & wire::kTransportCudaIpc) {
    if (Status s = cuda_ipc_usable_between(server->pid, client.pid, same_process(*channels)); !s.ok()) {
      server->transports &= ~uint64_t{wire::kTransportCudaIpc};
      note(why_not, fmt::format("cuda_ipc not used: {}", s.message()));
    }
  }
}

Result<LocalLinks> build_paths(const ContextImpl& ctx, uint64_t agreed_bits, const wire::Hello& client,
                               const wire::Hello& server, std::optional<shm::UnixListener> listener,
                               LocalChannels channels, UniqueFd data_socket, const std::string& peer,
                               Deadline deadline) {
  LocalLinks links;
  auto& paths = links.paths;
  if (agreed_bits & wire::kTransportDevmem) {
    if (!data_socket.valid()) return Status(Code::kInternal, "devmem agreed without a data socket");
    Result<std::unique_ptr<PayloadPath>> p = Status(Code::kInternal, "unset");
    if (auto factory = ctx.devmem_factory()) p = factory(std::move(data_socket), peer);
    else p = make_devmem_path(std::move(data_socket), ctx.config(), peer, static_cast<int>(ctx.config().get_int("devmem_gpu")));
    if (!p.ok()) return p.status().with_peer(peer);
    paths.push_back(std::move(*p));
  }
  bool creator = listener.has_value();
  int expect = ((agreed_bits & wire::kTransportShm) ? 1 : 0) + ((agreed_bits & wire::kTransportControlPipe) ? 1 : 0) +
               ((agreed_bits & wire::kTransportCudaIpc) ? 1 : 0);
  if (creator && expect > 0)
    DMX_RETURN_IF_ERROR(accept_channels(ctx, client, server, *listener, expect, &channels, peer, deadline));
  // cuda_ipc between endpoints of one process shares pointers: only when the kernel says so (a
  // peer's HELLO could claim our pid; the server checked the same before agreeing).
  bool in_process = client.pid == server.pid;
  if ((agreed_bits & wire::kTransportCudaIpc) && in_process && !same_process(channels))
    return Status(Code::kProtocol, fmt::format("cuda_ipc was agreed within one process (pid {}), but no side channel "
                                               "comes from this process",
                                               client.pid))
        .with_peer(peer);
  if (agreed_bits & wire::kTransportControlPipe) {
    if (!channels.control) return Status(Code::kInternal, "the control pipe was agreed without a side channel");
    auto c = make_control_pipe(std::move(*channels.control), creator, deadline);
    if (!c.ok()) return c.status().with_peer(peer);
    links.control = std::move(*c);
  }
  if (agreed_bits & wire::kTransportShm) {
    if (!channels.shm) return Status(Code::kInternal, "shm agreed without a side channel");
    auto p = make_shm_path(std::move(*channels.shm), creator, ctx.config(), deadline);
    if (!p.ok()) return p.status().with_peer(peer);
    paths.push_back(std::move(*p));
  }
  if (agreed_bits & wire::kTransportCudaIpc) {
    if (!channels.fds) return Status(Code::kInternal, "cuda_ipc agreed without its fd channel");
    auto p = make_cuda_ipc_path(ctx.config(), peer, in_process, std::move(channels.fds));
    if (!p.ok()) return p.status().with_peer(peer);
    paths.push_back(std::move(*p));
  }
  return links;
}

std::vector<std::unique_ptr<tcp::Conduit>> stream_conduits(std::vector<UniqueFd> fds,
                                                           std::unique_ptr<tcp::Conduit> control) {
  std::vector<std::unique_ptr<tcp::Conduit>> out;
  for (auto& fd : fds) out.push_back(std::make_unique<tcp::SocketConduit>(std::move(fd)));
  if (control && !out.empty()) out[0] = std::move(control);
  return out;
}

}  // namespace dmx
