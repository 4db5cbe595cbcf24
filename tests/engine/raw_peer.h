// A hand-driven dmx client for tests: completes a real handshake (with the test key), then sends
// whatever frames a test crafts — to play a buggy or hostile peer.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "engine/auth.h"
#include "engine/handshake.h"
#include "stream/socket.h"
#include "wire/frame.h"

namespace dmx::test {

class RawPeer {
 public:
  // Connects and authenticates with key `key` (empty: insecure), asking for `streams` data streams:
  // beside more than one, socket 0 is the control stream and sockets 1..streams the data streams.
  // `multilink`: asks for several links (wire::Multilink::kOn; a server left at auto agrees), so
  // data frames are counted per stream and LINK_ACK / LINK_DOWN apply (endpoint/links.cc).
  // `offers`: the transports it offers (empty: tcp alone, chunks inline on the streams); the
  // server's choice is agreed(), whose position + 1 is a path's id on the wire.
  static Result<RawPeer> connect(const std::string& address, const std::string& key, uint16_t streams = 1,
                                 bool multilink = false, std::vector<wire::Offer> offers = {}) {
    RawPeer p;
    DMX_ASSIGN_OR_RETURN(stream::Address addr, stream::parse_address(address));
    Deadline d = Deadline::after(std::chrono::seconds(10));
    DMX_ASSIGN_OR_RETURN(p.fd_, stream::connect_to(addr, d));
    Options o;
    if (key.empty()) o.set("insecure", "true");
    else o.set("auth_key", key);
    DMX_ASSIGN_OR_RETURN(Config config, Config::resolve(o));
    DMX_ASSIGN_OR_RETURN(AuthKey auth, load_auth_key(config));
    wire::Hello h;
    h.version = wire::kProtocolVersion;
    h.role = wire::Role::kClient;
    h.auth = key.empty() ? wire::AuthMode::kInsecure : wire::AuthMode::kHmacSha256;
    h.streams = streams;
    h.chunk_size = 1 << 20;
    h.eager_limit = 16 << 10;
    h.unexpected_budget = 1 << 20;
    h.nonce[0] = 7;
    h.boot_id = "raw-peer";
    h.hostname = "raw-peer";
    h.peer_timeout_ms = 10000;
    h.offers = {wire::Offer{"tcp", {1}}};  // chunks inline on the streams
    if (!offers.empty()) h.offers = std::move(offers);
    if (multilink) h.multilink = static_cast<uint8_t>(wire::Multilink::kOn);
    std::string peer = "test-server";
    DMX_RETURN_IF_ERROR(send_frame(p.fd_.get(), wire::FrameType::kHello, wire::encode_hello(h), d, peer));
    DMX_ASSIGN_OR_RETURN(Frame f, recv_frame(p.fd_.get(), d, peer));
    if (f.header.type != wire::FrameType::kHello) return Status(Code::kProtocol, "raw peer: no HELLO back");
    DMX_ASSIGN_OR_RETURN(wire::Hello s, wire::decode_hello(f.payload.data(), f.payload.size()));
    p.address_ = address;
    for (const wire::Offer& o : s.offers) p.agreed_.push_back(o.name);
    p.auth_ = auth;
    p.session_.session_id = s.session;
    p.session_.client_nonce = h.nonce;
    p.session_.server_nonce = s.nonce;
    p.server_epoch_ = s.epoch;
    if (!key.empty()) {
      wire::Proof proof = make_proof(auth, kClientLabel, h.nonce, s.nonce, s.session);
      DMX_RETURN_IF_ERROR(send_frame(p.fd_.get(), wire::FrameType::kAuth,
                                     std::vector<unsigned char>(proof.begin(), proof.end()), d, peer));
    }
    DMX_ASSIGN_OR_RETURN(Frame w, recv_frame(p.fd_.get(), d, peer));
    if (w.header.type != wire::FrameType::kWelcome) return Status(Code::kAuth, "raw peer: not welcomed");
    const uint16_t sockets = wire::stream_sockets(streams);
    for (uint16_t i = 1; i < sockets; ++i) {
      DMX_ASSIGN_OR_RETURN(UniqueFd fd, stream::connect_to(addr, d));
      wire::Join j;
      j.session = s.session;
      j.index = i;
      j.streams = sockets;
      if (!key.empty()) j.proof = make_proof(auth, kJoinLabel, h.nonce, s.nonce, s.session, i);
      DMX_RETURN_IF_ERROR(send_frame(fd.get(), wire::FrameType::kJoin, wire::encode_join(j), d, peer));
      DMX_ASSIGN_OR_RETURN(Frame ok, recv_frame(fd.get(), d, peer));
      if (ok.header.type != wire::FrameType::kWelcome) return Status(Code::kAuth, "raw peer: JOIN not welcomed");
      p.more_.push_back(std::move(fd));
    }
    return p;
  }

  Status send(const wire::FrameHeader& h, const std::vector<unsigned char>& payload = {}) {
    wire::HeaderBytes b = wire::encode_header(h);
    Deadline d = Deadline::after(std::chrono::seconds(10));
    DMX_RETURN_IF_ERROR(stream::send_exact(fd_.get(), b.data(), b.size(), d, "server"));
    if (!payload.empty())
      DMX_RETURN_IF_ERROR(stream::send_exact(fd_.get(), payload.data(), payload.size(), d, "server"));
    return Status();
  }
  // The next frame on stream socket `stream`, its payload up to `limit` bytes (data frames too,
  // which recv_frame, made for the handshake, refuses).
  Result<Frame> read(size_t stream, uint32_t limit = 1 << 20) {
    Deadline d = Deadline::after(std::chrono::seconds(10));
    unsigned char hb[wire::kHeaderSize];
    DMX_RETURN_IF_ERROR(stream::recv_exact(fd(stream), hb, sizeof hb, d, "server"));
    Frame f;
    DMX_ASSIGN_OR_RETURN(f.header, wire::decode_header(hb, wire::Limits{limit, limit}));
    f.payload.resize(f.header.payload_len);
    if (!f.payload.empty())
      DMX_RETURN_IF_ERROR(stream::recv_exact(fd(stream), f.payload.data(), f.payload.size(), d, "server"));
    return f;
  }
  Status send_bytes(const void* p, size_t n) {
    return stream::send_exact(fd_.get(), p, n, Deadline::after(std::chrono::seconds(10)), "server");
  }
  // Reconnect (endpoint/reconnect.cc): the REJOIN of this session for stream `index` (in the round
  // from `first`), as the client's dmx would send it, and the listener's answer to it on a new
  // connection; the connection is kept in `*kept` when given.
  std::vector<unsigned char> rejoin_bytes(uint16_t first, uint16_t index) const {
    wire::Rejoin r;
    r.session = session_.session_id;
    r.server_epoch = server_epoch_;
    r.first = first;
    r.index = index;
    if (!auth_.insecure) r.proof = rejoin_proof(auth_, session_, first, index);
    return wire::encode_rejoin(r);
  }
  Result<Frame> rejoin(uint16_t first, uint16_t index, UniqueFd* kept = nullptr) const {
    DMX_ASSIGN_OR_RETURN(stream::Address addr, stream::parse_address(address_));
    Deadline d = Deadline::after(std::chrono::seconds(10));
    DMX_ASSIGN_OR_RETURN(UniqueFd fd, stream::connect_to(addr, d));
    DMX_RETURN_IF_ERROR(send_frame(fd.get(), wire::FrameType::kRejoin, rejoin_bytes(first, index), d, "server"));
    DMX_ASSIGN_OR_RETURN(Frame f, recv_frame(fd.get(), d, "server"));
    if (kept != nullptr) *kept = std::move(fd);
    return f;
  }
  // The transports the server agreed, in its order: path ids 1, 2, ...; 0 when `name` is not there.
  uint8_t path_id(const std::string& name) const {
    for (size_t i = 0; i < agreed_.size(); ++i)
      if (agreed_[i] == name) return static_cast<uint8_t>(i + 1);
    return 0;
  }
  int fd() const { return fd_.get(); }
  int fd(size_t stream) const { return stream == 0 ? fd_.get() : more_.at(stream - 1).get(); }

 private:
  std::string address_;
  std::vector<std::string> agreed_;
  AuthKey auth_;
  Session session_;  // its id and both nonces: what a REJOIN's proof is bound to
  uint64_t server_epoch_ = 0;
  UniqueFd fd_;                 // stream 0
  std::vector<UniqueFd> more_;  // the other stream sockets
};

}  // namespace dmx::test
