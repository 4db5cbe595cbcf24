// Fuzzes the shm link and the shm pipe from a hostile writer: this process plays the creator by
// hand (as tests/transport/shm_pipe_test.cc's HandMadeCreator does), so it holds the shared
// region the real acceptor maps, and the input writes whatever it likes into the words the peer
// controls (the ring counters, the slot headers, the pipe's flags) between the acceptor's calls.
// The acceptor must never touch memory outside the ring or its caller's buffers (ASan: every
// receive buffer is a heap block of exactly its size), and must fail with a Status, not crash.
// Deterministic: one thread, no waits (every call used here is non-blocking).
//
// Input: byte 0 picks link or pipe and the geometry; then ops of 1 byte + arguments (see run_*).
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "transport/shm/ring.h"
#include "transport/shm/shm.h"

using namespace dmx;
using namespace dmx::shm;

namespace {

constexpr int kMaxOps = 64;
constexpr uint64_t kPipeMagic = 0x646d782d70697031ull;  // "dmx-pip1" (pipe.cc)

// Reads the input front to back; zeros once it runs out.
struct Input {
  const uint8_t* p;
  size_t n;
  bool empty() const { return n == 0; }
  uint8_t u8() { return n ? (--n, *p++) : 0; }
  uint64_t u64() {
    uint64_t v = 0;
    size_t k = std::min<size_t>(8, n);
    std::memcpy(&v, p, k);
    p += k, n -= k;
    return v;
  }
  // Small numbers most of the time, any 64-bit value sometimes: counters near the real ones.
  uint64_t count() {
    uint8_t sel = u8();
    return (sel & 0x80) ? u64() : (sel & 0x7f);
  }
};

// The creator's half: a sealed memfd of `total` bytes, mapped here, and the setup message sent
// with its fds over a socket pair whose other end the real accept() reads.
struct Forgery {
  UniqueFd mem, bell;
  UnixChannel mine;
  char* base = nullptr;
  size_t total = 0;
  ~Forgery() {
    if (base != nullptr) ::munmap(base, total);
  }
  UnixChannel make(size_t size) {
    auto p = UnixChannel::pair();
    if (!p.ok()) std::abort();
    mine = std::move(p->first);
    total = size;
    mem.reset(::memfd_create("fuzz-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!mem.valid() || ::ftruncate(mem.get(), static_cast<off_t>(total)) != 0) std::abort();
    void* m = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, mem.get(), 0);
    if (m == MAP_FAILED) std::abort();
    base = static_cast<char*>(m);
    if (::fcntl(mem.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) std::abort();
    bell.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    return std::move(p->second);
  }
  void send(const void* hello, size_t len) {
    int fds[2] = {mem.get(), bell.get()};
    Status s = mine.send({static_cast<const std::byte*>(hello), len}, fds, Deadline::after(std::chrono::seconds(5)));
    if (!s.ok()) std::abort();
  }
  std::atomic<uint64_t>& word(size_t offset) { return *reinterpret_cast<std::atomic<uint64_t>*>(base + offset); }
};

// Receive buffers of exactly the posted size, alive until the input ends (a link may still write
// into a posted buffer until the operation completes; the link is destroyed first).
using Buffers = std::vector<std::unique_ptr<char[]>>;
char* buffer(Buffers* b, size_t n) { return b->emplace_back(new char[std::max<size_t>(n, 1)]).get(); }

void run_link(Input in) {
  uint32_t slots = 2 + in.u8() % 7;
  size_t slot_size = kMinSlotSize * (1 + in.u8() % 2);
  auto layout = compute_layout(slots, slot_size);
  if (!layout.ok()) std::abort();
  Forgery f;
  UnixChannel theirs = f.make(layout->total);
  struct {
    uint64_t magic;
    uint32_t version, slots;
    uint64_t slot_size, total;
    int64_t pid;
  } hdr{kRegionMagic, kRegionVersion, slots, slot_size, layout->total, ::getpid()};
  std::memcpy(f.base, &hdr, sizeof hdr);
  f.send(&hdr, 32);  // the Hello is the header without the pid
  Buffers buffers;
  auto link = ShmLink::accept(std::move(theirs), Deadline::after(std::chrono::seconds(5)));
  if (!link.ok()) std::abort();  // a valid creator must be accepted
  ShmLink& l = **link;
  // The acceptor (side 1) receives on ring 0 and sends on ring 1.
  size_t rx_head = layout->control, tx_tail = layout->control + sizeof(RingControl) + sizeof(SharedWord);
  std::vector<Completion> out;
  for (int op = 0; op < kMaxOps && !in.empty(); ++op) {
    switch (in.u8() % 9) {
      case 0: f.word(rx_head).store(in.count()); break;
      case 1: f.word(tx_tail).store(in.count()); break;
      case 2: {  // a slot header of ring 0
        size_t h = layout->header_offset(0, in.u8() % slots);
        f.word(h).store(in.u8());              // msg_id
        f.word(h + 8).store(in.count());       // offset
        f.word(h + 16).store(in.count());      // total
        f.word(h + 24).store(in.count());      // len
        break;
      }
      case 3: {
        uint64_t id = in.u8();
        size_t n = in.count() % (64 << 10);
        (void)l.post_recv(id, MemRegion{buffer(&buffers, n), n, {}});
        break;
      }
      case 4: {
        uint64_t id = in.u8();
        (void)l.post_discard(id, in.count() % (64 << 10));
        break;
      }
      case 5: {
        uint64_t id = in.u8();
        size_t n = in.count() % (64 << 10);
        char* src = buffer(&buffers, n);
        std::memset(src, 0x5a, n);
        (void)l.post_send(id, MemRegion{src, n, {}});
        break;
      }
      case 6: l.progress(&out); break;
      case 7: (void)l.check_peer(&out); break;
      case 8: f.mine = UnixChannel(); break;  // the creator dies
    }
  }
  l.progress(&out);
  for (const Completion& c : out)
    if (!c.status.ok() && c.status.code() != Code::kProtocol && c.status.code() != Code::kPeerFailed &&
        c.status.code() != Code::kTruncated && c.status.code() != Code::kClosed)
      std::abort();
}

void run_pipe(Input in) {
  size_t ring = size_t{4096} << (in.u8() % 3);
  Forgery f;
  UnixChannel theirs = f.make(8192 + 2 * ring);
  uint64_t hdr[5] = {kPipeMagic, 1, ring, 8192 + 2 * ring, uint64_t(::getpid())};
  std::memcpy(f.base, hdr, sizeof hdr);
  f.send(hdr, 32);
  auto pipe = ShmPipe::accept(std::move(theirs), Deadline::after(std::chrono::seconds(5)));
  if (!pipe.ok()) std::abort();
  ShmPipe& p = **pipe;
  Buffers buffers;
  for (int op = 0; op < kMaxOps && !in.empty(); ++op) {
    switch (in.u8() % 7) {
      case 0: f.word(4096 + 64 * (in.u8() % 10)).store(in.count()); break;  // any control word
      case 1: {
        size_t n = in.count() % (4 * ring);
        auto r = p.read(buffer(&buffers, n), n);
        if (r.ok() && *r > n) std::abort();
        break;
      }
      case 2: {
        size_t n = in.count() % (4 * ring);
        char* src = buffer(&buffers, n);
        std::memset(src, 0x5a, n);
        iovec iov{src, n};
        auto r = p.write({&iov, 1});
        if (r.ok() && *r > n) std::abort();
        break;
      }
      case 3:
        if (p.arm(in.u8() & 1)) p.disarm();
        break;
      case 4: {
        pollfd fds[2];
        if (p.pollfds(fds) > 2) std::abort();
        break;
      }
      case 5: p.shutdown(); break;
      case 6: f.mine = UnixChannel(); break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Input in{data + 1, size - 1};
  if (data[0] & 1)
    run_pipe(in);
  else
    run_link(in);
  return 0;
}
