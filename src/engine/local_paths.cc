#include "engine/local_paths.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstring>

#include "core/log.h"
#include "engine/auth.h"
#include "engine/devmem_path.h"
#include "engine/ipc_path.h"
#include "engine/shm_path.h"

namespace dmx {
namespace {

bool allowed(const std::string& forced, std::string_view path) { return forced == "auto" || forced == path; }

void note(std::string* out, const std::string& text) {
  if (!out->empty()) *out += "; ";
  *out += text;
}

// The server's first message on the side channel: session id and proof.
std::vector<std::byte> channel_proof(const ContextImpl& ctx, const wire::Hello& client, const wire::Hello& server) {
  std::vector<std::byte> m(8 + 32);
  std::memcpy(m.data(), &server.session, 8);
  if (!ctx.auth().insecure) {
    wire::Proof p = make_proof(ctx.auth(), kLocalLabel, client.nonce, server.nonce, server.session);
    std::memcpy(m.data() + 8, p.data(), p.size());
  }
  return m;
}

}  // namespace

void offer_paths(const ContextImpl& ctx, wire::Hello* hello, std::optional<shm::UnixListener>* listener,
                 std::string* why_not) {
  const std::string& forced = ctx.params().transport;
  if (allowed(forced, "shm")) {
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
    if (s.ok()) hello->transports |= wire::kTransportShm;
    else note(why_not, s.message().starts_with("shm") ? s.message() : "shm: " + s.message());
  }
  if (allowed(forced, "cuda_ipc")) {
    Status s = cuda_ipc_path_available();
    if (s.ok()) hello->transports |= wire::kTransportCudaIpc;
    else note(why_not, s.message().starts_with("cuda_ipc") ? s.message() : "cuda_ipc: " + s.message());
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

void accept_paths(const ContextImpl& ctx, const wire::Hello& client, wire::Hello* server,
                  std::optional<shm::UnixChannel>* channel, std::string* why_not) {
  uint64_t local = wire::kTransportShm | wire::kTransportCudaIpc;
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
    note(why_not, "shm and cuda_ipc need both ends on one host");
    return;
  }
  if (both & wire::kTransportCudaIpc) {
    if (Status s = cuda_ipc_usable_between(server->pid, client.pid); !s.ok()) {
      server->transports &= ~uint64_t{wire::kTransportCudaIpc};
      note(why_not, fmt::format("cuda_ipc not used: {}", s.message()));
    }
  }
  if (both & wire::kTransportShm) {
    Deadline deadline = Deadline::after(std::chrono::seconds(1));
    Status s;
    if (client.local_channel.empty()) {
      s = Status(Code::kProtocol, "the client offered shm without a side channel");
    } else {
      auto ch = shm::UnixChannel::connect(client.local_channel, deadline);
      if (ch.ok()) {
        s = ch->send(channel_proof(ctx, client, *server), {}, deadline);
        if (s.ok()) channel->emplace(std::move(*ch));
      } else {
        s = ch.status();
      }
    }
    if (!s.ok()) {
      server->transports &= ~uint64_t{wire::kTransportShm};
      note(why_not, fmt::format("shm not used: the client's side channel {} could not be reached ({}; another "
                                "network namespace?)",
                                client.local_channel, s.message()));
    }
  }
}

Result<std::vector<std::unique_ptr<PayloadPath>>> build_paths(const ContextImpl& ctx, uint64_t agreed_bits,
                                                              const wire::Hello& client, const wire::Hello& server,
                                                              std::optional<shm::UnixListener> listener,
                                                              std::optional<shm::UnixChannel> channel,
                                                              UniqueFd data_socket, const std::string& peer,
                                                              Deadline deadline) {
  std::vector<std::unique_ptr<PayloadPath>> paths;
  if (agreed_bits & wire::kTransportDevmem) {
    if (!data_socket.valid()) return Status(Code::kInternal, "devmem agreed without a data socket");
    Result<std::unique_ptr<PayloadPath>> p = Status(Code::kInternal, "unset");
    if (auto factory = ctx.devmem_factory()) p = factory(std::move(data_socket), peer);
    else p = make_devmem_path(std::move(data_socket), ctx.config(), peer, static_cast<int>(ctx.config().get_int("devmem_gpu")));
    if (!p.ok()) return p.status().with_peer(peer);
    paths.push_back(std::move(*p));
  }
  if (agreed_bits & wire::kTransportShm) {
    bool creator = listener.has_value();
    if (creator) {
      DMX_ASSIGN_OR_RETURN(shm::UnixChannel ch, listener->accept(deadline));
      std::vector<std::byte> msg;
      std::vector<UniqueFd> fds;
      DMX_RETURN_IF_ERROR(ch.recv(&msg, 0, &fds, deadline));
      std::vector<std::byte> expect = channel_proof(ctx, client, server);
      if (msg.size() != expect.size() || std::memcmp(msg.data(), expect.data(), expect.size()) != 0)
        return Status(Code::kAuth, fmt::format("the shm side channel from {} did not prove the session", ch.peer_name()))
            .with_peer(peer);
      channel.emplace(std::move(ch));
    }
    if (!channel) return Status(Code::kInternal, "shm agreed without a side channel");
    auto p = make_shm_path(std::move(*channel), creator, ctx.config(), deadline);
    if (!p.ok()) return p.status().with_peer(peer);
    paths.push_back(std::move(*p));
  }
  if (agreed_bits & wire::kTransportCudaIpc) {
    auto p = make_cuda_ipc_path(ctx.config(), peer);
    if (!p.ok()) return p.status().with_peer(peer);
    paths.push_back(std::move(*p));
  }
  return paths;
}

}  // namespace dmx
