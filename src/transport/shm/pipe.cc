// ShmPipe: a byte stream between two processes of one host. One SPSC byte ring per direction in a
// sealed memfd, an eventfd doorbell per side, the side channel's hang-up as the death notice.
//
//   [PipeHeader]        page 0; written once by the creator before the fd is sent
//   [PipeControl]       page 1; 64-byte words: head and tail of each ring, then per side the
//                       "asleep, want data", "asleep, want room" and "closed" words
//   [ring 0] [ring 1]   ring_bytes each; ring d carries side d -> side 1-d (side 0 = creator)
//
// Counters are monotonic 64-bit byte counts; byte c of a ring lives at c & (ring_bytes - 1). Each
// side keeps its own counters privately and only reads the peer's, validating it (monotonic,
// head - tail within [0, ring_bytes]) before use. Setup is ShmLink's:
//
//   creator: memfd + seals, map, header; eventfd E0
//   send Hello, fds [memfd, E0]  ---->  recv exactly 2 fds; fstat + seals + header check; map; E1
//   recv exactly 1 fd            <----  send Hello, fds [E1]
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "core/log.h"
#include "transport/shm/ring.h"
#include "transport/shm/shm.h"

namespace dmx::shm {
namespace {

constexpr uint64_t kPipeMagic = 0x646d782d70697031ull;  // "dmx-pip1"
constexpr uint32_t kPipeVersion = 1;
constexpr size_t kMinRing = 4096, kMaxRing = 64ull << 20;
constexpr size_t kPage = 4096, kControlOffset = kPage, kDataOffset = 2 * kPage;
// An empty read or a full write looks at the clock every kIdleOpsPerClock calls, and at the side
// channel (a poll system call) when kCheckInterval has passed since the last look.
constexpr uint32_t kIdleOpsPerClock = 256;
constexpr auto kCheckInterval = std::chrono::milliseconds(1);

struct PipeHeader {  // also the setup message (Hello), without creator_pid
  uint64_t magic;
  uint32_t version;
  uint32_t reserved;
  uint64_t ring_bytes;
  uint64_t total_size;
  int64_t creator_pid;
};
constexpr size_t kHelloSize = offsetof(PipeHeader, creator_pid);

struct PipeControl {
  RingControl ring[2];
  SharedWord want_data[2], want_room[2], closed[2];
};
static_assert(sizeof(PipeControl) <= kPage);

size_t total_size(size_t ring_bytes) {
  return kDataOffset + 2 * ring_bytes;
}

// Empty when ring_bytes is allowed, else what is wrong with it.
std::string ring_problem(uint64_t ring_bytes) {
  if (ring_bytes >= kMinRing && ring_bytes <= kMaxRing && (ring_bytes & (ring_bytes - 1)) == 0) return {};
  return fmt::format("a ring of {} B (allowed: a power of two, {}-{} B)", ring_bytes, kMinRing, kMaxRing);
}

Result<UniqueFd> make_eventfd() {
  UniqueFd fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!fd.valid()) return errno_status("eventfd", errno);
  return fd;
}

// The peer's doorbell must be an eventfd: writing to anything else (a pipe) could block us.
Status check_eventfd(int fd, const std::string& peer) {
  char target[64] = {};
  std::string link = fmt::format("/proc/self/fd/{}", fd);
  ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
  if (n <= 0 || std::string_view(target) != "anon_inode:[eventfd]")
    return Status(Code::kProtocol,
                  fmt::format("shm pipe setup: doorbell fd from peer {} is not an eventfd ('{}')", peer, target))
        .with_peer(peer);
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return errno_status("fcntl(peer doorbell, O_NONBLOCK)", errno);
  return Status();
}

Result<char*> map_region(int fd, size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return errno_status(fmt::format("mmap(shm pipe, {} B)", size), errno, Code::kResourceExhausted);
  return static_cast<char*>(p);
}

class PipeImpl final : public ShmPipe {
 public:
  PipeImpl(UnixChannel channel, char* base, size_t ring_bytes, int side)
      : channel_(std::move(channel)), base_(base), ring_(ring_bytes), side_(side) {
    ctl_ = reinterpret_cast<PipeControl*>(base_ + kControlOffset);
    tx_ = &ctl_->ring[side_];
    rx_ = &ctl_->ring[1 - side_];
    tx_data_ = base_ + kDataOffset + size_t(side_) * ring_;
    rx_data_ = base_ + kDataOffset + size_t(1 - side_) * ring_;
  }
  ~PipeImpl() override {
    if (bells_ready_) shutdown();
    ::munmap(base_, total_size(ring_));
  }

  UnixChannel& channel() { return channel_; }
  Status set_doorbells(UniqueFd mine, UniqueFd peers) {
    my_bell_ = std::move(mine);
    peer_bell_ = std::move(peers);
    DMX_RETURN_IF_ERROR(check_eventfd(peer_bell_.get(), peer_name()));
    bells_ready_ = true;
    return Status();
  }

  Result<size_t> write(std::span<const iovec> buffers) override;
  Result<size_t> read(void* dst, size_t n) override;
  bool arm(bool want_room) override;
  void disarm() override;
  int pollfds(pollfd* out) const override {
    out[0] = pollfd{my_bell_.get(), POLLIN, 0};
    out[1] = pollfd{channel_.fd(), POLLIN | POLLRDHUP, 0};
    return 2;
  }
  void shutdown() override;
  const Status& error() const override { return error_; }
  std::string peer_name() const override { return channel_.peer_name(); }
  uint64_t wakeups_sent() const override { return wakeups_; }

 private:
  bool usable();                 // false (error_ set) when we shut down or the pipe broke
  const Status& fail(Status s);  // sets error_ (once); returns it
  Status closed_by_peer(bool died) const;
  bool load_peer_head();  // false: corrupt (error_ set)
  bool load_peer_tail();
  void idle_check();
  void wake_peer(SharedWord& flag);
  bool peer_closed() const { return ctl_->closed[1 - side_].v.load(std::memory_order_acquire) != 0; }

  UnixChannel channel_;
  char* base_;
  size_t ring_;
  int side_;  // 0 creator, 1 acceptor; we write ring side_, read ring 1 - side_
  PipeControl* ctl_;
  RingControl *tx_, *rx_;
  char *tx_data_, *rx_data_;
  UniqueFd my_bell_, peer_bell_;
  bool bells_ready_ = false;
  std::atomic<bool> shut_{false};

  uint64_t tx_head_ = 0, peer_tail_ = 0;  // producer: ours, and the peer's validated
  uint64_t rx_tail_ = 0, peer_head_ = 0;  // consumer: ours, and the peer's validated
  uint32_t idle_ops_ = 0;
  Clock::time_point last_check_ = Clock::now();
  bool check_now_ = false;  // look at the side channel at the next idle op (after a sleep)
  bool peer_died_ = false;  // the side channel hung up
  uint64_t wakeups_ = 0;
  Status error_;
};

const Status& PipeImpl::fail(Status s) {
  if (error_.ok()) {
    error_ = s.with_peer(peer_name()).with_origin("shm pipe");
    if (s.code() == Code::kProtocol) DMX_LOG_WARN("shm pipe to peer {} broken: {}", peer_name(), error_.to_string());
  }
  return error_;
}

Status PipeImpl::closed_by_peer(bool died) const {
  return Status(Code::kPeerFailed,
                fmt::format("shm pipe: closed by the peer ({}){}", peer_name(),
                            died ? ": its side channel hung up (process exited or was killed)" : ""));
}

bool PipeImpl::usable() {
  if (shut_.load(std::memory_order_relaxed) && error_.ok())
    error_ = Status(Code::kClosed, "shm pipe: shut down on this side").with_peer(peer_name()).with_origin("shm pipe");
  return error_.ok();
}

bool PipeImpl::load_peer_head() {
  uint64_t h = rx_->head.v.load(std::memory_order_acquire);
  if (h == peer_head_) return true;
  if (h < peer_head_ || h - rx_tail_ > ring_) {
    fail(Status(Code::kProtocol, fmt::format("shm pipe corrupt: peer {} moved its head to {} (was {}, our tail {}, "
                                             "ring {} B)",
                                             peer_name(), h, peer_head_, rx_tail_, ring_)));
    return false;
  }
  peer_head_ = h;
  return true;
}

bool PipeImpl::load_peer_tail() {
  uint64_t t = tx_->tail.v.load(std::memory_order_acquire);
  if (t == peer_tail_) return true;
  if (t < peer_tail_ || t > tx_head_) {
    fail(Status(Code::kProtocol, fmt::format("shm pipe corrupt: peer {} moved its tail to {} (was {}, our head {})",
                                             peer_name(), t, peer_tail_, tx_head_)));
    return false;
  }
  peer_tail_ = t;
  return true;
}

// After we published (head or tail): ring the peer if it announced that it sleeps. The fence
// pairs with the one in the peer's arm() between setting its flag and re-checking our counter:
// either it sees what we published, or we see its flag. Clearing the flag here rings once per sleep.
void PipeImpl::wake_peer(SharedWord& flag) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (flag.v.load(std::memory_order_relaxed) == 0 || flag.v.exchange(0) == 0) return;
  uint64_t one = 1;
  if (::write(peer_bell_.get(), &one, sizeof one) == sizeof one) ++wakeups_;
}

// On an empty read or a full write: is the peer still alive? Costs a system call only now and
// then, or at once after a sleep (the side channel may be why we woke).
void PipeImpl::idle_check() {
  if (peer_died_) return;
  if (!check_now_) {
    if (++idle_ops_ < kIdleOpsPerClock) return;
    idle_ops_ = 0;
    auto now = Clock::now();
    if (now - last_check_ < kCheckInterval) return;
    last_check_ = now;
  }
  check_now_ = false;
  pollfd p{channel_.fd(), POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return;
  if (p.revents & (POLLHUP | POLLRDHUP | POLLERR)) {
    peer_died_ = true;
  } else if (p.revents & POLLIN) {
    // Nothing is sent on the channel after setup; a message would keep the owner's poll awake.
    fail(Status(Code::kProtocol,
                fmt::format("shm pipe: unexpected message from peer {} on the side channel", peer_name())));
  }
}

Result<size_t> PipeImpl::write(std::span<const iovec> buffers) {
  if (!usable()) return error_;
  if (peer_died_ || peer_closed()) return fail(closed_by_peer(peer_died_));
  if (!load_peer_tail()) return error_;
  size_t room = ring_ - (tx_head_ - peer_tail_);
  size_t done = 0;
  for (const iovec& b : buffers) {
    size_t len = std::min(b.iov_len, room - done);
    const char* src = static_cast<const char*>(b.iov_base);
    for (size_t copied = 0; copied < len;) {
      size_t at = (tx_head_ + done) & (ring_ - 1);
      size_t piece = std::min(len - copied, ring_ - at);  // up to the end of the ring, then wrap
      std::memcpy(tx_data_ + at, src + copied, piece);
      copied += piece;
      done += piece;
    }
    if (done == room) break;
  }
  if (done == 0) {
    bool want = false;
    for (const iovec& b : buffers) want |= b.iov_len != 0;
    if (want) idle_check();  // full: the peer may be dead
    if (!error_.ok()) return error_;
    if (peer_died_) return fail(closed_by_peer(true));
    return size_t{0};
  }
  tx_head_ += done;
  tx_->head.v.store(tx_head_, std::memory_order_release);
  wake_peer(ctl_->want_data[1 - side_]);
  return done;
}

Result<size_t> PipeImpl::read(void* dst, size_t n) {
  // A peer failure still lets us read what the peer had published; anything else does not.
  if (!usable() && (error_.code() != Code::kPeerFailed || shut_.load(std::memory_order_relaxed))) return error_;
  if (!load_peer_head()) return error_;
  if (peer_head_ == rx_tail_ && n != 0) {
    if (!error_.ok()) return error_;  // the peer is gone and everything it sent was read
    bool closed = peer_closed();
    if (!closed) idle_check();
    if (!error_.ok()) return error_;
    if (!closed && !peer_died_) return size_t{0};
    // The peer is done; what it published before is still ours (the flag or the hang-up came
    // after its last head store).
    if (!load_peer_head()) return error_;
    if (peer_head_ == rx_tail_) return fail(closed_by_peer(!closed));
  }
  size_t len = std::min<uint64_t>(n, peer_head_ - rx_tail_);
  if (len == 0) return size_t{0};
  size_t at = rx_tail_ & (ring_ - 1);
  size_t first = std::min(len, ring_ - at);
  std::memcpy(dst, rx_data_ + at, first);
  std::memcpy(static_cast<char*>(dst) + first, rx_data_, len - first);
  rx_tail_ += len;
  rx_->tail.v.store(rx_tail_, std::memory_order_release);
  wake_peer(ctl_->want_room[1 - side_]);
  return len;
}

bool PipeImpl::arm(bool want_room) {
  if (check_now_) idle_check();  // woken by the side channel, and nothing read since?
  if (!usable() || peer_died_) return false;
  ctl_->want_data[side_].v.store(1, std::memory_order_relaxed);
  if (want_room) ctl_->want_room[side_].v.store(1, std::memory_order_relaxed);
  // Pairs with the fence in the peer's wake_peer(): see there.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  bool busy = rx_->head.v.load(std::memory_order_acquire) != rx_tail_ || peer_closed();
  if (want_room && !busy) {
    uint64_t t = tx_->tail.v.load(std::memory_order_acquire);
    busy = t != peer_tail_ || tx_head_ - peer_tail_ < ring_;  // a changed tail: let write() judge it
  }
  if (busy) {
    ctl_->want_data[side_].v.store(0, std::memory_order_relaxed);
    ctl_->want_room[side_].v.store(0, std::memory_order_relaxed);
  }
  return !busy;
}

void PipeImpl::disarm() {
  ctl_->want_data[side_].v.store(0, std::memory_order_relaxed);
  ctl_->want_room[side_].v.store(0, std::memory_order_relaxed);
  uint64_t drained;
  (void)!::read(my_bell_.get(), &drained, sizeof drained);  // one read resets an eventfd
  check_now_ = true;
}

void PipeImpl::shutdown() {
  if (shut_.exchange(true)) return;
  ctl_->closed[side_].v.store(1, std::memory_order_seq_cst);
  uint64_t one = 1;
  (void)!::write(peer_bell_.get(), &one, sizeof one);
  (void)!::write(my_bell_.get(), &one, sizeof one);  // our own owner, if it sleeps
}

}  // namespace

Result<std::unique_ptr<ShmPipe>> ShmPipe::create(UnixChannel channel, const PipeOptions& options, Deadline deadline) {
  if (std::string bad = ring_problem(options.ring_bytes); !bad.empty())
    return Status(Code::kInvalidArgument, "shm pipe: requested " + bad);
  const size_t total = total_size(options.ring_bytes);
  UniqueFd mem(::memfd_create("dmx-shm-pipe", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!mem.valid()) return errno_status("memfd_create(dmx-shm-pipe)", errno, Code::kUnavailable);
  if (::ftruncate(mem.get(), static_cast<off_t>(total)) != 0)
    return errno_status(fmt::format("ftruncate(shm pipe, {} B)", total), errno, Code::kResourceExhausted);
  // Neither side may resize the region later: a shrink would make the other side's accesses SIGBUS.
  if (::fcntl(mem.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return errno_status("fcntl(F_ADD_SEALS)", errno);
  DMX_ASSIGN_OR_RETURN(char* base, map_region(mem.get(), total));
  PipeHeader hdr{kPipeMagic, kPipeVersion, 0, options.ring_bytes, total, ::getpid()};
  std::memcpy(base, &hdr, sizeof hdr);
  auto pipe = std::make_unique<PipeImpl>(std::move(channel), base, options.ring_bytes, /*side=*/0);
  DMX_ASSIGN_OR_RETURN(UniqueFd my_bell, make_eventfd());

  int fds[2] = {mem.get(), my_bell.get()};
  DMX_RETURN_IF_ERROR(pipe->channel().send({reinterpret_cast<const std::byte*>(&hdr), kHelloSize}, fds, deadline));
  std::vector<std::byte> msg;
  std::vector<UniqueFd> got;
  DMX_RETURN_IF_ERROR(pipe->channel().recv(&msg, 1, &got, deadline));
  PipeHeader ack{};
  if (msg.size() == kHelloSize) std::memcpy(&ack, msg.data(), kHelloSize);
  if (ack.magic != kPipeMagic || ack.version != kPipeVersion || ack.ring_bytes != options.ring_bytes ||
      ack.total_size != total)
    return Status(Code::kProtocol, fmt::format("shm pipe setup: peer {} did not acknowledge the region ({} B answer)",
                                               pipe->peer_name(), msg.size()))
        .with_peer(pipe->peer_name());
  DMX_RETURN_IF_ERROR(pipe->set_doorbells(std::move(my_bell), std::move(got[0])));
  DMX_LOG_DEBUG("shm pipe to peer {}: {} B per direction", pipe->peer_name(), options.ring_bytes);
  return std::unique_ptr<ShmPipe>(std::move(pipe));
}

Result<std::unique_ptr<ShmPipe>> ShmPipe::accept(UnixChannel channel, Deadline deadline) {
  std::vector<std::byte> msg;
  std::vector<UniqueFd> got;
  DMX_RETURN_IF_ERROR(channel.recv(&msg, 2, &got, deadline));
  const std::string peer = channel.peer_name();
  auto refuse = [&](std::string what) {
    return Status(Code::kProtocol, fmt::format("shm pipe setup: peer {} {}", peer, what)).with_peer(peer);
  };
  PipeHeader hello{};
  if (msg.size() != kHelloSize) return refuse(fmt::format("sent {} B, expected {}", msg.size(), kHelloSize));
  std::memcpy(&hello, msg.data(), kHelloSize);
  if (hello.magic != kPipeMagic || hello.version != kPipeVersion)
    return refuse(fmt::format("speaks another protocol (magic {:x}, version {})", hello.magic, hello.version));
  if (std::string bad = ring_problem(hello.ring_bytes); !bad.empty()) return refuse("announced " + bad);
  const size_t total = total_size(hello.ring_bytes);
  if (hello.total_size != total)
    return refuse(fmt::format("announced {} B for a region of {} B", hello.total_size, total));
  // The fd must be what was announced: a sealed memfd of exactly that size.
  struct stat st {};
  if (::fstat(got[0].get(), &st) != 0) return errno_status("fstat(shm pipe region)", errno);
  if (!S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) != total)
    return refuse(fmt::format("sent a region fd of {} B, expected {}", static_cast<long long>(st.st_size), total));
  int seals = ::fcntl(got[0].get(), F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
    return refuse("sent a region fd that is not sealed against resizing");
  DMX_RETURN_IF_ERROR(check_eventfd(got[1].get(), peer));
  DMX_ASSIGN_OR_RETURN(char* base, map_region(got[0].get(), total));
  PipeHeader hdr;
  std::memcpy(&hdr, base, sizeof hdr);
  if (hdr.magic != kPipeMagic || hdr.version != kPipeVersion || hdr.ring_bytes != hello.ring_bytes ||
      hdr.total_size != total) {
    ::munmap(base, total);
    return refuse("sent a region whose header disagrees with its hello");
  }
  auto pipe = std::make_unique<PipeImpl>(std::move(channel), base, hello.ring_bytes, /*side=*/1);
  DMX_ASSIGN_OR_RETURN(UniqueFd my_bell, make_eventfd());
  int fds[1] = {my_bell.get()};
  DMX_RETURN_IF_ERROR(pipe->set_doorbells(std::move(my_bell), std::move(got[1])));
  DMX_RETURN_IF_ERROR(pipe->channel().send({reinterpret_cast<const std::byte*>(&hello), kHelloSize}, fds, deadline));
  return std::unique_ptr<ShmPipe>(std::move(pipe));
}

}  // namespace dmx::shm
