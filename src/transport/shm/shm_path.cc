// The shm payload path: a progress thread (PathBase) that owns an shm::ShmLink (see shm_path.h).
#include "transport/shm/shm_path.h"

#include <fmt/format.h>
#include <poll.h>

#include <map>
#include <mutex>
#include <thread>

#include "core/log.h"
#include "core/units.h"
#include "memory/bounce_pool.h"
#include "transport/path_base.h"

namespace dmx {
namespace {

std::vector<unsigned char> encode_length(uint64_t n) {
  std::vector<unsigned char> d(kShmDescriptorSize);
  for (size_t i = 0; i < kShmDescriptorSize; ++i) d[i] = static_cast<unsigned char>(n >> (8 * i));
  return d;
}

class ShmPath final : public PathBase {
 public:
  ShmPath(std::unique_ptr<shm::ShmLink> link, std::chrono::microseconds spin)
      : PathBase({.thread_name = "dmx-shm",
                  .spin = spin,
                  .stopped = Status(Code::kClosed, fmt::format("shm path to peer {} stopped", link->peer_name()))
                                 .with_peer(link->peer_name())
                                 .with_origin("shm")}),
        peer_(link->peer_name()),
        describe_(fmt::format("shm {} x {} slots{}", link->options().slots, format_size(link->options().slot_size),
                              link->options().crew != nullptr
                                  ? fmt::format(", {} copy threads", link->options().crew->threads())
                                  : "")),
        link_(std::move(link)) {}

  ~ShmPath() override { end_thread(); }

  std::string_view name() const override { return "shm"; }
  bool carries(const MemSpec& src) const override;
  uint64_t max_chunk() const override { return kShmMaxChunk; }
  Result<std::vector<unsigned char>> post_tx(uint64_t seq, const MemRegion& src, bool whole) override;
  Result<uint64_t> chunk_length(std::span<const unsigned char> descriptor) override;
  Status post_rx(uint64_t seq, std::span<const unsigned char> descriptor, const MemRegion& dst) override;
  size_t max_list() const override { return kShmMaxList; }
  Result<std::vector<unsigned char>> post_tx_list(uint64_t seq, std::span<const MemRegion> srcs,
                                                  size_t* taken) override;
  Status post_rx_list(uint64_t seq, std::span<const unsigned char> descriptor,
                      std::span<const MemRegion> dsts) override;
  bool receiver_releases() const override { return false; }
  std::string describe() const override { return describe_; }

 private:
  // A post as the engine made it, queued until the thread hands it to the link. rx with a null
  // region.ptr and no pieces: discard region.size bytes. A list: its pieces, region its total.
  struct Post {
    bool tx;
    uint64_t seq;
    MemRegion region;
    std::vector<MemRegion> pieces{};
  };

  // PathBase's hooks. stop() destroys the link itself (quiesce): it waits for the thread's current
  // round or sleep (which stop()'s wake-up ends), never for an event callback.
  bool progress(std::vector<Done>* done) override;
  bool idle() override;
  void release(const Status& why, std::vector<Done>* done) override;
  void quiesce() override {
    std::lock_guard lk(link_mu_);
    shutdown_locked();
  }

  // The thread's work, link_mu_ held. `apply_locked` and `take_completions_locked` may end the link.
  void apply_locked(Post& p, std::vector<Done>* done);
  void take_completions_locked(std::vector<Done>* done);
  // Destroys the link (waiting for device copies in flight: after this no user memory is touched).
  // Idempotent.
  void shutdown_locked();
  // The link is broken: fail the path and end the link. `log`: found here (not by the link, which
  // logged it).
  void fail_locked(const Status& why, bool log);
  void publish_stats_locked();

  const std::string peer_;
  const std::string describe_;

  // Lock order: link_mu_, then the post lock (PathBase). link_mu_ guards the link and the chunks
  // handed to it; the thread holds it for one round or one sleep, stop() to destroy the link.
  std::mutex link_mu_;
  std::unique_ptr<shm::ShmLink> link_;
  std::map<uint64_t, uint64_t> tx_pending_, rx_pending_;  // seq -> chunk length, in seq order
  std::vector<shm::Completion> out_;
  shm::LinkStats link_stats_;
  uint64_t chunks_sent_ = 0, chunks_received_ = 0;
  std::vector<Done> end_done_;  // completions found at the peer's hang-up, delivered with the end
  std::vector<Post> queue_;  // posts not yet taken: under the post lock (PathBase::post)
};

bool ShmPath::carries(const MemSpec& src) const {
  switch (src.kind) {
    case MemKind::kHost:
    case MemKind::kPinned:
    case MemKind::kCuda:  // staged through the slots by the link
    case MemKind::kSim:
      return true;
  }
  return false;
}

Result<uint64_t> ShmPath::chunk_length(std::span<const unsigned char> d) {
  return decode_length_descriptor(d, kShmMaxChunk, "shm", peer_);
}

Result<std::vector<unsigned char>> ShmPath::post_tx(uint64_t seq, const MemRegion& src, bool /*whole*/) {
  if (src.size > kShmMaxChunk)
    return Status(Code::kInvalidArgument,
                  fmt::format("shm path post_tx(seq {}): {} B over the {} B chunk limit", seq, src.size, kShmMaxChunk));
  if (src.ptr == nullptr && src.size != 0)
    return Status(Code::kInvalidArgument, fmt::format("shm path post_tx(seq {}): null source", seq));
  if (!carries(src.where))
    return Status(Code::kInvalidArgument, fmt::format("shm path post_tx(seq {}): memory kind {} not carried", seq,
                                                      to_string(src.where)));
  DMX_RETURN_IF_ERROR(post([&] { queue_.push_back(Post{true, seq, src}); }));
  return encode_length(src.size);
}

Status ShmPath::post_rx(uint64_t seq, std::span<const unsigned char> descriptor, const MemRegion& dst) {
  DMX_ASSIGN_OR_RETURN(uint64_t n, chunk_length(descriptor));
  MemRegion r = dst;
  if (dst.ptr == nullptr) {
    r = MemRegion{nullptr, n, {}};
  } else if (dst.size != n) {
    return Status(Code::kInvalidArgument,
                  fmt::format("shm path post_rx(seq {}): a {} B destination for a {} B chunk", seq, dst.size, n));
  } else if (!carries(dst.where)) {
    return Status(Code::kInvalidArgument, fmt::format("shm path post_rx(seq {}): memory kind {} not carried", seq,
                                                      to_string(dst.where)));
  }
  return post([&] { queue_.push_back(Post{false, seq, r}); });
}

Result<std::vector<unsigned char>> ShmPath::post_tx_list(uint64_t seq, std::span<const MemRegion> srcs,
                                                         size_t* taken) {
  // Gathered into the slots by this thread's memcpy: device memory goes chunk by chunk.
  if (srcs.empty() || srcs[0].where.is_device())
    return Status(Code::kUnavailable, "shm path: lists gather host memory only");
  size_t n = 0;
  uint64_t total = 0;
  for (; n < srcs.size() && n < kShmMaxList; ++n) {
    const MemRegion& r = srcs[n];
    if (r.where.is_device() || r.ptr == nullptr || r.size == 0 || r.size > kShmMaxChunk - total)
      break;
    total += r.size;
  }
  if (n == 0)
    return Status(Code::kInvalidArgument,
                  fmt::format("shm path post_tx_list(seq {}): a first piece of {} bytes", seq, srcs[0].size));
  Post p{true, seq, MemRegion{nullptr, total, srcs[0].where}};
  p.pieces.assign(srcs.begin(), srcs.begin() + static_cast<ptrdiff_t>(n));
  DMX_RETURN_IF_ERROR(post([&] { queue_.push_back(std::move(p)); }));
  *taken = n;
  return encode_length(total);
}

Status ShmPath::post_rx_list(uint64_t seq, std::span<const unsigned char> descriptor,
                             std::span<const MemRegion> dsts) {
  DMX_ASSIGN_OR_RETURN(uint64_t len, chunk_length(descriptor));
  if (dsts.empty() || dsts.size() > kShmMaxList)
    return Status(Code::kProtocol, fmt::format("shm path: a list of {} pieces from peer {}", dsts.size(), peer_))
        .with_peer(peer_);
  const bool drop = dsts[0].ptr == nullptr;
  uint64_t sum = 0;
  for (const MemRegion& d : dsts) {
    if ((d.ptr == nullptr) != drop)
      return Status(Code::kInvalidArgument, "shm path post_rx_list: a list with some destinations null");
    if (!drop && !carries(d.where))
      return Status(Code::kInvalidArgument, fmt::format("shm path post_rx_list(seq {}): memory kind {} not carried",
                                                        seq, to_string(d.where)));
    if (d.size > len - sum)  // the pieces' sum within the descriptor's length, which is bounded
      return Status(Code::kProtocol, fmt::format("shm path: a list descriptor of {} bytes from peer {} for more "
                                                 "bytes of pieces",
                                                 len, peer_))
          .with_peer(peer_);
    sum += d.size;
  }
  if (sum != len)
    return Status(Code::kProtocol, fmt::format("shm path: a list descriptor of {} bytes from peer {} for pieces of {} "
                                               "bytes",
                                               len, peer_, sum))
        .with_peer(peer_);
  Post p{false, seq, MemRegion{nullptr, len, {}}};
  if (!drop) p.pieces.assign(dsts.begin(), dsts.end());
  return post([&] { queue_.push_back(std::move(p)); });
}

void ShmPath::shutdown_locked() {
  if (link_ == nullptr) return;
  link_stats_ = link_->stats();
  link_.reset();  // waits for device copies in flight; unmaps the region; the peer sees a hang-up
  out_.clear();
  publish_stats_locked();
}

void ShmPath::fail_locked(const Status& why, bool log) {
  if (link_ == nullptr) return;
  if (log) DMX_LOG_WARN("shm path to peer {} failed: {}", peer_, why.to_string());
  fail(why);
  shutdown_locked();
}

void ShmPath::publish_stats_locked() {
  if (link_ != nullptr) link_stats_ = link_->stats();
  counters_.set({.chunks_sent = chunks_sent_,
                 .chunks_received = chunks_received_,
                 .bytes_sent = link_stats_.bytes_sent,
                 .bytes_received = link_stats_.bytes_received,
                 .host_copies = link_stats_.host_copies,
                 .device_copies = link_stats_.device_copies});
}

void ShmPath::apply_locked(Post& p, std::vector<Done>* done) {
  auto& pending = p.tx ? tx_pending_ : rx_pending_;
  if (!pending.emplace(p.seq, p.region.size).second) {
    done->push_back({p.tx, p.seq,
                     Status(Code::kInvalidArgument, fmt::format("shm path: {} seq {} is already in flight",
                                                                p.tx ? "tx" : "rx", p.seq))});
    return;
  }
  Status s;
  if (!p.pieces.empty())
    s = p.tx ? link_->post_send_list(p.seq, std::move(p.pieces)) : link_->post_recv_list(p.seq, std::move(p.pieces));
  else if (p.tx)
    s = link_->post_send(p.seq, p.region);
  else if (p.region.ptr == nullptr)
    s = link_->post_discard(p.seq, p.region.size);
  else
    s = link_->post_recv(p.seq, p.region);
  if (!s.ok()) {  // this chunk only (e.g. device memory this process cannot use)
    pending.erase(p.seq);
    done->push_back({p.tx, p.seq, s.with_peer(peer_).with_origin("shm")});
  }
}

// Maps the link's completions (out_) to chunk completions; a chunk whose length disagrees with its
// descriptor means the peer is broken: the path fails.
void ShmPath::take_completions_locked(std::vector<Done>* done) {
  Status broken;
  for (shm::Completion& c : out_) {
    bool tx = c.kind == shm::Completion::kSend;
    auto& pending = tx ? tx_pending_ : rx_pending_;
    auto it = pending.find(c.id);
    assert(it != pending.end() && "the link completed a chunk the path did not post");
    if (it == pending.end()) continue;
    uint64_t expected = it->second;
    pending.erase(it);
    Status s = std::move(c.status);
    if (!tx && (s.code() == Code::kTruncated || (s.ok() && c.bytes != expected))) {
      s = Status(Code::kProtocol, fmt::format("shm path: chunk seq {} from peer {} is {} B, its descriptor said {} B",
                                              c.id, peer_, c.bytes, expected))
              .with_peer(peer_)
              .with_origin("shm");
      if (broken.ok()) broken = s;
    }
    if (s.ok()) ++(tx ? chunks_sent_ : chunks_received_);
    done->push_back({tx, c.id, std::move(s)});
  }
  out_.clear();
  if (!link_->error().ok())
    fail_locked(link_->error(), /*log=*/false);
  else if (!broken.ok())
    fail_locked(broken, /*log=*/true);
}

bool ShmPath::progress(std::vector<Done>* done) {
  std::lock_guard lk(link_mu_);
  if (link_ == nullptr) return false;  // stopped
  std::vector<Post> posts;
  take_posts([&] { posts.swap(queue_); });
  for (Post& p : posts) apply_locked(p, done);
  shm::LinkStats before = link_->stats();
  link_->progress(&out_);
  shm::LinkStats after = link_->stats();
  bool moved = !posts.empty() || !out_.empty() || after.host_copies != before.host_copies ||
               after.device_copies != before.device_copies || after.bytes_sent != before.bytes_sent;
  take_completions_locked(done);
  if (moved && link_ != nullptr) publish_stats_locked();
  return moved;
}

// Sleeps until a poster, stop(), the peer's doorbell or the peer's death wakes us.
bool ShmPath::idle() {
  std::lock_guard lk(link_mu_);
  if (link_ == nullptr) return false;
  bool slept = false, hangup = false;
  if (link_->arm_wakeup()) {
    pollfd fds[2] = {{link_->wake_fd(), POLLIN, 0}, {link_->channel_fd(), POLLRDHUP, 0}};
    slept = sleep_on(fds, std::nullopt);
    hangup = (fds[1].revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
  }
  // else: work already there, or device copies in flight that nothing will ring us for.
  link_->disarm_wakeup();
  if (failed()) {  // the sleep itself failed (ppoll)
    shutdown_locked();
  } else if (hangup) {
    // Takes what the peer published before it went, then fails the link (even if idle). The
    // completions found go out with the end (PathBase::finish).
    std::vector<Done> done;
    Status s = link_->check_peer(&out_);
    take_completions_locked(&done);
    if (s.ok() && link_ != nullptr)  // a hang-up that check_peer did not see: still the end
      fail_locked(Status(Code::kPeerFailed, fmt::format("shm path: peer {} hung up", peer_)).with_peer(peer_),
                  /*log=*/true);
    end_done_ = std::move(done);
  } else if (!slept) {
    std::this_thread::yield();
  }
  return slept;
}

// The end: destroy the link, then every chunk posted or handed to it completes with `why`, in seq
// order.
void ShmPath::release(const Status& why, std::vector<Done>* done) {
  std::lock_guard lk(link_mu_);
  shutdown_locked();
  for (Done& d : end_done_) done->push_back(std::move(d));
  std::vector<Post> left;
  take_posts([&] { left.swap(queue_); });
  // Posted but never handed to the link: they complete with the same error.
  for (const Post& p : left) (p.tx ? tx_pending_ : rx_pending_).emplace(p.seq, p.region.size);
  for (auto& [seq, len] : tx_pending_) done->push_back({true, seq, why});
  for (auto& [seq, len] : rx_pending_) done->push_back({false, seq, why});
  tx_pending_.clear();
  rx_pending_.clear();
}

}  // namespace

Result<std::unique_ptr<PayloadPath>> make_shm_path(UnixChannel channel, bool creator, const shm::LinkOptions& options,
                                                   Deadline deadline) {
  raise_bounce_limit(options.bounce_pool);
  std::unique_ptr<shm::ShmLink> link;
  if (creator) {
    DMX_ASSIGN_OR_RETURN(link, shm::ShmLink::create(std::move(channel), options, deadline));
  } else {
    DMX_ASSIGN_OR_RETURN(link, shm::ShmLink::accept(std::move(channel), deadline, options.crew, options.nt_receive_min));
  }
  auto path = std::make_unique<ShmPath>(std::move(link), options.spin);
  DMX_LOG_DEBUG("{} ready", path->describe());
  return std::unique_ptr<PayloadPath>(std::move(path));
}

}  // namespace dmx
