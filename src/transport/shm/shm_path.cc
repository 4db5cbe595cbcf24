// The shm payload path: a progress thread that owns an shm::ShmLink (see shm_path.h).
#include "transport/shm/shm_path.h"

#include <fmt/format.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include "core/log.h"
#include "core/reaper.h"
#include "core/sys.h"
#include "core/units.h"

namespace dmx {
namespace {

std::vector<unsigned char> encode_length(uint64_t n) {
  std::vector<unsigned char> d(kShmDescriptorSize);
  for (size_t i = 0; i < kShmDescriptorSize; ++i) d[i] = static_cast<unsigned char>(n >> (8 * i));
  return d;
}

class ShmPath final : public PayloadPath {
 public:
  ShmPath(std::unique_ptr<shm::ShmLink> link, UniqueFd wake, std::chrono::microseconds spin)
      : peer_(link->peer_name()),
        describe_(fmt::format("shm {} x {} slots", link->options().slots, format_size(link->options().slot_size))),
        spin_(spin),
        wake_(std::move(wake)),
        link_(std::move(link)) {}

  ~ShmPath() override {
    stop();
    // The last keep_alive may be dropped on the path's own thread, destroying the path there: the
    // reaper then joins that thread.
    join_or_reap(thread_);
  }

  std::string_view name() const override { return "shm"; }
  void start(Events* events, std::shared_ptr<void> keep_alive) override;
  bool carries(const MemSpec& src) const override;
  uint64_t max_chunk() const override { return kShmMaxChunk; }
  Result<std::vector<unsigned char>> post_tx(uint64_t seq, const MemRegion& src, bool whole) override;
  Result<uint64_t> chunk_length(std::span<const unsigned char> descriptor) override;
  Status post_rx(uint64_t seq, std::span<const unsigned char> descriptor, const MemRegion& dst) override;
  bool receiver_releases() const override { return false; }
  void stop() override;
  PathStats stats() const override {
    std::lock_guard lk(mu_);
    return stats_;
  }
  std::string describe() const override { return describe_; }

 private:
  // A post as the engine made it, queued until the thread hands it to the link. rx with a null
  // region.ptr: discard region.size bytes.
  struct Post {
    bool tx;
    uint64_t seq;
    MemRegion region;
  };
  // A completion gathered under link_mu_ and delivered without it.
  struct Done {
    bool tx;
    uint64_t seq;
    Status status;
  };

  void run(std::shared_ptr<void> keep_alive);
  // The thread's work, link_mu_ held. Each returns whether anything moved; each may end the link
  // (shutdown_locked), after which link_ is null.
  bool round_locked(std::vector<Done>* done);
  bool sleep_locked(std::vector<Done>* done);
  void apply_locked(const Post& p, std::vector<Done>* done);
  void take_completions_locked(std::vector<Done>* done);
  // Destroys the link (waiting for device copies in flight: after this no user memory is touched),
  // closes the post queue and moves what it held to the pending chunks. Idempotent: the first
  // reason wins. `log`: the failure was found here (not by the link, which logged it).
  void shutdown_locked(Status why, bool failure, bool log);
  void publish_stats_locked();
  Status enqueue(const Post& p);
  void deliver(std::vector<Done>* done);
  Status closed_status() const {
    return Status(Code::kClosed, fmt::format("shm path to peer {} stopped", peer_)).with_peer(peer_).with_origin("shm");
  }

  const std::string peer_;
  const std::string describe_;
  const std::chrono::microseconds spin_;
  const UniqueFd wake_;  // eventfd: posters and stop() ring it to wake the thread

  Events* events_ = nullptr;  // set by start(), before the thread exists
  std::thread thread_;
  std::atomic<bool> stop_requested_{false};

  // Lock order: link_mu_, then mu_. Neither is held while calling Events.
  //
  // link_mu_ guards the link and the chunks handed to it. The thread holds it for one round of
  // work or one sleep (bounded: a sleep ends when stop() rings wake_), stop() to destroy the link.
  std::mutex link_mu_;
  std::unique_ptr<shm::ShmLink> link_;
  std::map<uint64_t, uint64_t> tx_pending_, rx_pending_;  // seq -> chunk length, in seq order
  std::vector<shm::Completion> out_;
  Status end_;                  // why the link is gone
  bool end_is_failure_ = false;  // (else: stop)
  shm::LinkStats link_stats_;
  uint64_t chunks_sent_ = 0, chunks_received_ = 0, wakeups_ = 0;

  // mu_ guards the post queue and the statistics snapshot.
  mutable std::mutex mu_;
  std::vector<Post> queue_;
  bool sleeping_ = false;  // the thread sleeps (or is about to): a poster must ring wake_
  bool closed_ = false;    // the link is gone: posts are refused with closed_why_
  Status closed_why_;
  PathStats stats_;
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
  DMX_RETURN_IF_ERROR(enqueue(Post{true, seq, src}));
  return encode_length(src.size);
}

Status ShmPath::post_rx(uint64_t seq, std::span<const unsigned char> descriptor, const MemRegion& dst) {
  DMX_ASSIGN_OR_RETURN(uint64_t n, chunk_length(descriptor));
  if (dst.ptr == nullptr) return enqueue(Post{false, seq, MemRegion{nullptr, n, {}}});
  if (dst.size != n)
    return Status(Code::kInvalidArgument,
                  fmt::format("shm path post_rx(seq {}): a {} B destination for a {} B chunk", seq, dst.size, n));
  if (!carries(dst.where))
    return Status(Code::kInvalidArgument, fmt::format("shm path post_rx(seq {}): memory kind {} not carried", seq,
                                                      to_string(dst.where)));
  return enqueue(Post{false, seq, dst});
}

Status ShmPath::enqueue(const Post& p) {
  bool ring = false;
  {
    std::lock_guard lk(mu_);
    if (closed_) return closed_why_;
    queue_.push_back(p);
    ring = std::exchange(sleeping_, false);
  }
  if (ring) {
    uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
  }
  return Status();
}

void ShmPath::start(Events* events, std::shared_ptr<void> keep_alive) {
  assert(events != nullptr && !thread_.joinable() && events_ == nullptr && "start() is called once");
  events_ = events;
  thread_ = std::thread([this, keep_alive = std::move(keep_alive)]() mutable { run(std::move(keep_alive)); });
}

void ShmPath::stop() {
  stop_requested_.store(true, std::memory_order_release);
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof one);
  // The thread holds link_mu_ for one round or one sleep (which the write above ends), never while
  // it calls Events: so this is prompt, and safe from an event callback too.
  std::lock_guard lk(link_mu_);
  shutdown_locked(closed_status(), /*failure=*/false, /*log=*/false);
}

void ShmPath::shutdown_locked(Status why, bool failure, bool log) {
  if (link_ == nullptr) return;
  if (log) DMX_LOG_WARN("shm path to peer {} failed: {}", peer_, why.to_string());
  end_ = std::move(why);
  end_is_failure_ = failure;
  link_stats_ = link_->stats();
  link_.reset();  // waits for device copies in flight; unmaps the region; the peer sees a hang-up
  out_.clear();
  std::vector<Post> left;
  {
    std::lock_guard lk(mu_);
    closed_ = true;
    closed_why_ = end_;
    left.swap(queue_);
  }
  // Posted but never handed to the link: they complete with the same error.
  for (const Post& p : left) (p.tx ? tx_pending_ : rx_pending_).emplace(p.seq, p.region.size);
  publish_stats_locked();
}

void ShmPath::publish_stats_locked() {
  if (link_ != nullptr) link_stats_ = link_->stats();
  std::lock_guard lk(mu_);
  stats_.chunks_sent = chunks_sent_;
  stats_.chunks_received = chunks_received_;
  stats_.bytes_sent = link_stats_.bytes_sent;
  stats_.bytes_received = link_stats_.bytes_received;
  stats_.host_copies = link_stats_.host_copies;
  stats_.device_copies = link_stats_.device_copies;
  stats_.wakeups = wakeups_;
}

void ShmPath::apply_locked(const Post& p, std::vector<Done>* done) {
  auto& pending = p.tx ? tx_pending_ : rx_pending_;
  if (!pending.emplace(p.seq, p.region.size).second) {
    done->push_back({p.tx, p.seq,
                     Status(Code::kInvalidArgument, fmt::format("shm path: {} seq {} is already in flight",
                                                                p.tx ? "tx" : "rx", p.seq))});
    return;
  }
  Status s = p.tx                       ? link_->post_send(p.seq, p.region)
             : p.region.ptr == nullptr ? link_->post_discard(p.seq, p.region.size)
                                       : link_->post_recv(p.seq, p.region);
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
    shutdown_locked(link_->error(), /*failure=*/true, /*log=*/false);
  else if (!broken.ok())
    shutdown_locked(broken, /*failure=*/true, /*log=*/true);
}

bool ShmPath::round_locked(std::vector<Done>* done) {
  std::vector<Post> posts;
  {
    std::lock_guard lk(mu_);
    posts.swap(queue_);
  }
  for (const Post& p : posts) apply_locked(p, done);
  shm::LinkStats before = link_->stats();
  link_->progress(&out_);
  shm::LinkStats after = link_->stats();
  bool moved = !posts.empty() || !out_.empty() || after.host_copies != before.host_copies ||
               after.device_copies != before.device_copies || after.bytes_sent != before.bytes_sent;
  take_completions_locked(done);
  if (moved && link_ != nullptr) publish_stats_locked();
  return moved;
}

// Sleeps until a poster, stop(), the peer's doorbell or the peer's death wakes us. Returns whether
// something woke us (false: there was work already, nothing slept).
bool ShmPath::sleep_locked(std::vector<Done>* done) {
  {
    std::lock_guard lk(mu_);
    if (!queue_.empty() || stop_requested_.load(std::memory_order_acquire)) return true;
    sleeping_ = true;
  }
  bool slept = false, hangup = false;
  Status poll_error;
  if (link_->arm_wakeup()) {
    pollfd fds[3] = {{wake_.get(), POLLIN, 0}, {link_->wake_fd(), POLLIN, 0}, {link_->channel_fd(), POLLRDHUP, 0}};
    int n = ::ppoll(fds, 3, nullptr, nullptr);
    if (n < 0 && errno != EINTR) poll_error = errno_status(fmt::format("ppoll(shm path, peer {})", peer_), errno);
    if (n > 0) {
      slept = true;
      ++wakeups_;
      hangup = (fds[2].revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
    }
  }
  // else: work already there, or device copies in flight that nothing will ring us for.
  link_->disarm_wakeup();
  {
    std::lock_guard lk(mu_);
    sleeping_ = false;
  }
  uint64_t drained;
  while (::read(wake_.get(), &drained, sizeof drained) == sizeof drained) {
  }
  if (!poll_error.ok()) {
    shutdown_locked(poll_error, /*failure=*/true, /*log=*/true);
  } else if (hangup) {
    // Takes what the peer published before it went, then fails the link (even if idle).
    Status s = link_->check_peer(&out_);
    take_completions_locked(done);
    if (s.ok() && link_ != nullptr)  // a hang-up that check_peer did not see: still the end
      shutdown_locked(Status(Code::kPeerFailed, fmt::format("shm path: peer {} hung up", peer_)).with_peer(peer_),
                      /*failure=*/true, /*log=*/true);
  } else if (!slept) {
    std::this_thread::yield();
  }
  return slept;
}

void ShmPath::deliver(std::vector<Done>* done) {
  for (Done& d : *done) {
    if (d.tx)
      events_->on_path_tx_done(d.seq, d.status);
    else
      events_->on_path_rx_done(d.seq, d.status);
  }
  done->clear();
}

void ShmPath::run(std::shared_ptr<void> keep_alive) {
  pthread_setname_np(pthread_self(), "dmx-shm");
  std::vector<Done> done;
  auto last_activity = Clock::now();
  for (;;) {
    bool ended = false;
    {
      std::lock_guard lk(link_mu_);
      ended = link_ == nullptr || stop_requested_.load(std::memory_order_acquire);
      if (!ended) {
        bool moved = round_locked(&done);
        if (link_ != nullptr && !moved && Clock::now() - last_activity >= spin_) moved = sleep_locked(&done);
        if (moved) last_activity = Clock::now();
        ended = link_ == nullptr;
      }
    }
    if (ended) break;
    if (done.empty())
      cpu_relax();
    else
      deliver(&done);
  }

  // The end: what completed in the last round first, then on_path_failed (a failure, not a stop),
  // then every chunk still pending, with the error, in seq order; then on_path_stopped.
  Status end;
  bool failure;
  {
    std::lock_guard lk(link_mu_);
    shutdown_locked(closed_status(), /*failure=*/false, /*log=*/false);  // no-op unless stopping
    end = end_;
    failure = end_is_failure_;
    for (auto& [seq, len] : tx_pending_) done.push_back({true, seq, end});
    for (auto& [seq, len] : rx_pending_) done.push_back({false, seq, end});
    tx_pending_.clear();
    rx_pending_.clear();
  }
  auto first_error = std::stable_partition(done.begin(), done.end(), [](const Done& d) { return d.status.ok(); });
  std::vector<Done> errors(std::make_move_iterator(first_error), std::make_move_iterator(done.end()));
  done.erase(first_error, done.end());
  deliver(&done);
  if (failure) events_->on_path_failed(end);
  deliver(&errors);
  events_->on_path_stopped();
  keep_alive.reset();  // may destroy this path (the destructor then reaps us): touch nothing after
}

}  // namespace

Result<std::unique_ptr<PayloadPath>> make_shm_path(shm::UnixChannel channel, bool creator, const Config& config,
                                                   Deadline deadline) {
  DMX_ASSIGN_OR_RETURN(shm::LinkOptions options, shm::link_options(config));
  std::unique_ptr<shm::ShmLink> link;
  if (creator) {
    DMX_ASSIGN_OR_RETURN(link, shm::ShmLink::create(std::move(channel), options, deadline));
  } else {
    DMX_ASSIGN_OR_RETURN(link, shm::ShmLink::accept(std::move(channel), deadline));
  }
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return errno_status("eventfd(shm path)", errno);
  auto path = std::make_unique<ShmPath>(std::move(link), std::move(wake), options.spin);
  DMX_LOG_DEBUG("{} ready", path->describe());
  return std::unique_ptr<PayloadPath>(std::move(path));
}

}  // namespace dmx
