#include "engine/transport_setup.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstring>

#include "core/log.h"
#include "engine/auth.h"

namespace dmx {
namespace {

void note(std::string* out, const std::string& text) {
  if (!out->empty()) *out += "; ";
  *out += text;
}

bool same_process(const SideChannels& channels) {
  for (const auto& [name, ch] : channels)
    if (ch.peer_pid() == ::getpid()) return true;
  return false;
}

std::shared_ptr<Transport> find(const TransportList& list, std::string_view name) {
  for (const auto& t : list)
    if (t->name() == name) return t;
  return nullptr;
}

// The server's first message on a side channel: session id, proof, the transport's name.
std::vector<std::byte> channel_proof(const ContextImpl& ctx, const wire::Hello& client, const wire::Hello& server,
                                     std::string_view name) {
  std::vector<std::byte> m(8 + 32 + name.size());
  std::memcpy(m.data(), &server.session, 8);
  if (!ctx.auth().insecure) {
    wire::Proof p = make_proof(ctx.auth(), kLocalLabel, client.nonce, server.nonce, server.session);
    std::memcpy(m.data() + 8, p.data(), p.size());
  }
  std::memcpy(m.data() + 40, name.data(), name.size());
  return m;
}

// Client: accepts the server's side channels on `listener`, one for each agreed transport that
// needs one. Each must prove the session and name a transport that is owed one.
Status accept_channels(const ContextImpl& ctx, const TransportList& agreed, const wire::Hello& client,
                       const wire::Hello& server, UnixListener& listener, SideChannels* out, const std::string& peer,
                       Deadline deadline) {
  size_t count = 0;
  for (const auto& t : agreed) count += t->needs().side_channel ? 1 : 0;
  for (size_t i = 0; i < count; ++i) {
    DMX_ASSIGN_OR_RETURN(UnixChannel ch, listener.accept(deadline));
    std::vector<std::byte> msg;
    std::vector<UniqueFd> fds;
    DMX_RETURN_IF_ERROR(ch.recv(&msg, 0, &fds, deadline));
    std::string name;
    if (msg.size() > 40 && msg.size() <= 40 + wire::kMaxOfferName)
      name.assign(reinterpret_cast<const char*>(msg.data()) + 40, msg.size() - 40);
    auto t = find(agreed, name);
    bool owed = t && t->needs().side_channel;
    for (const auto& [have, c] : *out) owed = owed && have != name;
    std::vector<std::byte> expect = channel_proof(ctx, client, server, name);
    if (!owed || !same_bytes(msg, expect))
      return Status(Code::kAuth, fmt::format("a side channel from {} did not prove the session", ch.peer_name()))
          .with_peer(peer);
    out->emplace_back(std::move(name), std::move(ch));
  }
  return Status();
}

// What connect() gets from the engine for one transport.
class EngineBootstrap final : public Bootstrap {
 public:
  EngineBootstrap(const ContextImpl& ctx, const std::string& peer, bool client, Deadline deadline, bool same_process,
                  PeerPair pair, std::optional<UnixChannel> channel, UniqueFd data)
      : ctx_(ctx), peer_(peer), client_(client), deadline_(deadline), same_process_(same_process), pair_(pair),
        channel_(std::move(channel)), data_(std::move(data)) {}
  const Config& config() const override { return ctx_.config(); }
  const std::string& peer() const override { return peer_; }
  bool client() const override { return client_; }
  Deadline deadline() const override { return deadline_; }
  bool same_process() const override { return same_process_; }
  const PeerPair& pair() const override { return pair_; }
  Result<UnixChannel> side_channel() override {
    if (!channel_) return Status(Code::kInternal, "no side channel for this transport (or taken already)");
    UnixChannel ch = std::move(*channel_);
    channel_.reset();
    return ch;
  }
  Result<UniqueFd> data_socket() override {
    if (!data_.valid()) return Status(Code::kInternal, "no data socket for this transport (or taken already)");
    return std::move(data_);
  }

 private:
  const ContextImpl& ctx_;
  const std::string& peer_;
  bool client_;
  Deadline deadline_;
  bool same_process_;
  PeerPair pair_;
  std::optional<UnixChannel> channel_;
  UniqueFd data_;
};

}  // namespace

PeerPair peer_pair(const wire::Hello& client, const wire::Hello& server) {
  PeerPair p;
  p.same_host = !client.boot_id.empty() && client.boot_id == server.boot_id && client.hostname == server.hostname;
  p.same_pid = p.same_host && client.pid == server.pid;
  p.pid = p.same_pid ? client.pid : 0;
  return p;
}

void offer_transports(const ContextImpl& ctx, wire::Hello* hello, std::optional<UnixListener>* listener,
                      std::string* why_not) {
  bool channels = false;
  for (const auto& t : ctx.transports()) {
    if (hello->offers.size() >= wire::kMaxOffers) {
      note(why_not, fmt::format("{}: more than {} transports registered", t->name(), wire::kMaxOffers));
      continue;
    }
    auto d = t->offer(ctx.config());
    if (!d.ok()) {
      note(why_not, d.status().message());
      continue;
    }
    if (d->size() > wire::kMaxOfferDescriptor || t->name().empty() || t->name().size() > wire::kMaxOfferName) {
      note(why_not, fmt::format("{}: its name or {}-byte descriptor does not fit the HELLO", t->name(), d->size()));
      continue;
    }
    channels = channels || t->needs().side_channel;
    hello->offers.push_back(wire::Offer{std::string(t->name()), std::move(*d)});
  }
  if (!channels || listener == nullptr) return;
  auto l = UnixListener::listen();
  if (l.ok()) {
    hello->local_channel = l->path();
    listener->emplace(std::move(*l));
    return;
  }
  Status s = l.status();
  // No side channels: no transport that needs one.
  std::erase_if(hello->offers, [&](const wire::Offer& o) {
    auto t = find(ctx.transports(), o.name);
    if (!t || !t->needs().side_channel) return false;
    note(why_not, fmt::format("{}: no side channel ({})", o.name, s.message()));
    return true;
  });
}

void accept_transports(const ContextImpl& ctx, const wire::Hello& client, wire::Hello* server,
                       SideChannels* channels, std::string* why_not) {
  PeerPair pair = peer_pair(client, *server);
  TransportList list = ctx.transports();
  std::vector<wire::Offer> kept;
  for (auto& mine : server->offers) {
    auto t = find(list, mine.name);
    const wire::Offer* theirs = client.offer(mine.name);
    if (!t || !theirs) {
      note(why_not, fmt::format("{} not used: the client does not offer it (see its log)", mine.name));
      continue;
    }
    if (Status s = t->compatible(theirs->descriptor, mine.descriptor, pair); !s.ok()) {
      note(why_not, s.message());
      continue;
    }
    if (t->needs().side_channel) {
      Deadline deadline = Deadline::after(std::chrono::seconds(1));
      Status s;
      if (client.local_channel.empty()) {
        s = Status(Code::kProtocol, "the client offered it without a side channel");
      } else {
        auto ch = UnixChannel::connect(client.local_channel, deadline);
        if (ch.ok()) s = ch->send(channel_proof(ctx, client, *server, mine.name), {}, deadline);
        if (ch.ok() && s.ok()) channels->emplace_back(mine.name, std::move(*ch));
        if (!ch.ok()) s = ch.status();
      }
      if (!s.ok()) {
        note(why_not, fmt::format("{} not used: the client's side channel {} could not be reached ({}; another "
                                  "network namespace?)",
                                  mine.name, client.local_channel, s.message()));
        continue;
      }
    }
    kept.push_back(std::move(mine));
  }
  // After the side channels: their kernel credentials tell whether the client is this process.
  bool one_process = same_process(*channels);
  std::erase_if(kept, [&](const wire::Offer& o) {
    Status s = find(list, o.name)->admit(pair, one_process);
    if (s.ok()) return false;
    note(why_not, s.message());
    std::erase_if(*channels, [&](const auto& c) { return c.first == o.name; });
    return true;
  });
  // One conduit for stream 0: the first in the registry's order.
  bool control = false;
  std::erase_if(kept, [&](const wire::Offer& o) {
    if (find(list, o.name)->gives() != Gives::kControl) return false;
    if (!control) return !(control = true);
    note(why_not, fmt::format("{} not used: stream 0 runs on an earlier transport's conduit", o.name));
    std::erase_if(*channels, [&](const auto& c) { return c.first == o.name; });
    return true;
  });
  server->offers = std::move(kept);
}

Result<TransportList> agree(const ContextImpl& ctx, const wire::Hello& client, const wire::Hello& server) {
  PeerPair pair = peer_pair(client, server);
  TransportList list = ctx.transports(), agreed;
  for (const wire::Offer& o : server.offers) {
    auto t = find(list, o.name);
    const wire::Offer* c = client.offer(o.name);
    if (!t || !c)
      return Status(Code::kProtocol, fmt::format("the server accepted transport {}, which the client did not offer",
                                                 o.name));
    if (Status s = t->compatible(c->descriptor, o.descriptor, pair); !s.ok())
      return Status(Code::kProtocol,
                    fmt::format("the server accepted transport {}, which this side finds unusable: {}", o.name,
                                s.message()));
    agreed.push_back(std::move(t));
  }
  return agreed;
}

size_t data_sockets_needed(const TransportList& agreed) {
  size_t n = 0;
  for (const auto& t : agreed) n += t->needs().data_socket ? 1 : 0;
  return n;
}

Result<TransportLinks> connect_transports(const ContextImpl& ctx, const TransportList& agreed,
                                          const wire::Hello& client, const wire::Hello& server, bool is_client,
                                          std::optional<UnixListener> listener, SideChannels channels,
                                          std::vector<UniqueFd> data_sockets, const std::string& peer,
                                          Deadline deadline) {
  if (listener)
    DMX_RETURN_IF_ERROR(accept_channels(ctx, agreed, client, server, *listener, &channels, peer, deadline));
  if (data_sockets.size() != data_sockets_needed(agreed))
    return Status(Code::kInternal, fmt::format("{} data sockets for {} transports that need one", data_sockets.size(),
                                               data_sockets_needed(agreed)));
  PeerPair pair = peer_pair(client, server);
  bool one_process = same_process(channels);
  TransportLinks links;
  size_t next_data = 0;
  for (const auto& t : agreed) {
    std::optional<UnixChannel> ch;
    for (auto& [name, c] : channels)
      if (name == t->name()) ch.emplace(std::move(c));
    if (t->needs().side_channel && !ch)
      return Status(Code::kInternal, fmt::format("{} agreed without its side channel", t->name()));
    UniqueFd data;
    if (t->needs().data_socket) data = std::move(data_sockets[next_data++]);
    EngineBootstrap b(ctx, peer, is_client, deadline, one_process, pair, std::move(ch), std::move(data));
    auto link = t->connect(b);
    if (!link.ok()) return link.status().with_peer(peer);
    // negotiate() counted the streams from gives(): a path from another kind would break that.
    if ((link->path != nullptr) != (t->gives() == Gives::kPath) ||
        (link->control != nullptr) != (t->gives() == Gives::kControl))
      return Status(Code::kInternal, fmt::format("{}: connect() did not make what gives() says", t->name()));
    if (link->control && links.control)
      return Status(Code::kInternal, fmt::format("{}: a second conduit for stream 0", t->name()));
    if (link->control) links.control = std::move(link->control);
    links.paths.push_back(std::move(link->path));
  }
  return links;
}

std::vector<std::unique_ptr<stream::Conduit>> stream_conduits(std::vector<UniqueFd> fds,
                                                              std::unique_ptr<stream::Conduit> control) {
  std::vector<std::unique_ptr<stream::Conduit>> out;
  for (auto& fd : fds) out.push_back(std::make_unique<stream::SocketConduit>(std::move(fd)));
  if (control && !out.empty()) out[0] = std::move(control);
  return out;
}

}  // namespace dmx
