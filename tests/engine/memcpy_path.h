// A test transport whose payload path takes lists (PayloadPath::max_list), "memcpy": between two
// endpoints of one process, the receiver copies each chunk, or each piece of a list, straight out
// of the sender's memory (host, pinned or sim) on the path's own thread; the endpoint then answers
// PATH_DONE (receiver_releases), as it does for cuda_ipc, the one real path that takes lists. It
// needs no GPU, so table chunks (docs/wire.md "Tables") are tested on any machine.
//
// Descriptor (both kinds of chunk): n (u32), the sources' MemKind (u8) and device (u8), 2 zero
// bytes, then n x (address u64, length u64), little-endian; a single chunk has n = 1. The receiver
// checks it strictly against what the endpoint hands it (count, each length): kProtocol otherwise.
//
// MemcpyHooks, shared by the paths a transport makes (both sides of a test's pair when both
// contexts use one transport object, else one per context): counters that show how chunks went,
// and knobs that make the sender lie or the copies slow. Test-only: the descriptor is an address
// in this process, so the transport must never meet a peer in another process (compatible() does
// not check: a test's raw peer plays the client from this process).
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transport/path_base.h"
#include "transport/transport.h"
#include "wire/le.h"

namespace dmx::test {

// How the sender's next list descriptor lies (MemcpyHooks::lie).
enum class MemcpyLie : int {
  kNone = 0,
  kDropPiece,   // one piece fewer than the table (a well-formed descriptor)
  kLength,      // the first piece one byte longer than the table says
  kCountField,  // the count field one more than the entries that follow
  kTrailing,    // a stray byte after the entries
};

struct MemcpyHooks {
  std::atomic<size_t> max_list{128};      // what max_list() says (0: no lists)
  std::atomic<size_t> take_at_most{0};    // post_tx_list takes at most this many (0: all it may)
  std::atomic<bool> refuse_lists{false};  // post_tx_list says kUnavailable (send them one by one)
  std::atomic<int> lie{0};                // a MemcpyLie for the next list descriptor, then kNone
  std::atomic<int> copy_delay_us{0};      // each chunk or list copy takes at least this long
  std::atomic<int> rx_refuse{0};          // the next this many post_rx_list calls fail (kUnavailable)
  std::atomic<int> rx_refuse_chunks{0};   // the same for post_rx
  std::atomic<int> tx_fail{0};            // the next this many post_tx or post_tx_list calls fail (kIo)
  std::atomic<uint64_t> lists_sent{0}, pieces_sent{0}, chunks_sent{0};
  std::atomic<uint64_t> lists_received{0}, pieces_received{0}, chunks_received{0}, dropped{0};
  std::atomic<uint64_t> bytes_copied{0};
  // The largest list taken (pieces), by post_tx_list.
  std::atomic<uint64_t> longest_list{0};
};

namespace memcpy_path {

inline constexpr uint64_t kMaxChunk = 1 << 20;
inline constexpr size_t kHeader = 8, kEntry = 16;

struct Piece {
  uint64_t addr, len;
};
struct Decoded {
  MemSpec where;
  std::vector<Piece> pieces;
};

inline std::vector<unsigned char> encode(const MemSpec& where, std::span<const MemRegion> srcs) {
  std::vector<unsigned char> d(kHeader + kEntry * srcs.size(), 0);
  wire::put_u32(d.data(), static_cast<uint32_t>(srcs.size()));
  d[4] = static_cast<unsigned char>(where.kind);
  d[5] = static_cast<unsigned char>(where.device);
  for (size_t k = 0; k < srcs.size(); ++k) {
    wire::put_u64(d.data() + kHeader + kEntry * k, reinterpret_cast<uintptr_t>(srcs[k].ptr));
    wire::put_u64(d.data() + kHeader + kEntry * k + 8, srcs[k].size);
  }
  return d;
}

inline Result<Decoded> decode(std::span<const unsigned char> d) {
  if (d.size() < kHeader) return Status(Code::kProtocol, fmt::format("memcpy path: a {}-byte descriptor", d.size()));
  uint32_t n = wire::get_u32(d.data());
  if (n == 0 || n > 4096 || d.size() != kHeader + kEntry * size_t{n} || d[4] > 3 || d[6] != 0 || d[7] != 0)
    return Status(Code::kProtocol, fmt::format("memcpy path: a {}-byte descriptor of {} pieces", d.size(), n));
  Decoded out;
  out.where = MemSpec{static_cast<MemKind>(d[4]), d[5]};
  for (uint32_t k = 0; k < n; ++k) {
    uint64_t addr = wire::get_u64(d.data() + kHeader + kEntry * k), len = wire::get_u64(d.data() + kHeader + kEntry * k + 8);
    if (len == 0 || len > kMaxChunk || (addr == 0))
      return Status(Code::kProtocol, fmt::format("memcpy path: piece {} of {} B at 0x{:x}", k, len, addr));
    out.pieces.push_back(Piece{addr, len});
  }
  return out;
}

inline bool carried(const MemSpec& m) {
  return m.kind == MemKind::kHost || m.kind == MemKind::kPinned || m.kind == MemKind::kSim;
}

// Reads the sender's memory. The descriptor came over the control stream, an ordering
// ThreadSanitizer cannot see (two processes would not share the memory at all): left out of its
// view, as the loop transport's copy is (tests/transport/loop_transport.cc).
__attribute__((no_sanitize("thread"), noinline)) inline void copy_host(void* dst, const void* src, uint64_t n) {
  auto* d = static_cast<unsigned char*>(dst);
  const volatile auto* s = static_cast<const volatile unsigned char*>(src);
  for (uint64_t i = 0; i < n; ++i) d[i] = s[i];
}

class MemcpyPath final : public PathBase {
 public:
  MemcpyPath(std::string name, std::shared_ptr<MemcpyHooks> hooks)
      : PathBase({.thread_name = "dmx-memcpy", .stopped = Status(Code::kClosed, "memcpy path: stopped")}),
        name_(std::move(name)),
        hooks_(std::move(hooks)) {}
  ~MemcpyPath() override { end_thread(); }

  std::string_view name() const override { return name_; }
  bool carries(const MemSpec& src) const override { return carried(src); }
  uint64_t max_chunk() const override { return kMaxChunk; }
  bool receiver_releases() const override { return true; }
  size_t max_list() const override { return hooks_->max_list.load(); }
  std::string describe() const override { return "memcpy (test transport: copies lists from the sender's pointers)"; }

  Result<std::vector<unsigned char>> post_tx(uint64_t seq, const MemRegion& src, bool) override {
    if (stopping() || failed()) return gate();
    if (Status st = tx_hook(seq); !st.ok()) return st;
    if (!carries(src.where) || src.size == 0 || src.size > kMaxChunk)
      return Status(Code::kInvalidArgument, fmt::format("memcpy path post_tx(seq {}): {} B of {}", seq, src.size,
                                                        to_string(src.where)));
    hooks_->chunks_sent.fetch_add(1);
    PathCounters::add(counters_.chunks_sent);
    PathCounters::add(counters_.bytes_sent, src.size);
    return encode(src.where, std::span<const MemRegion>(&src, 1));
  }

  Result<std::vector<unsigned char>> post_tx_list(uint64_t seq, std::span<const MemRegion> srcs,
                                                  size_t* taken) override {
    if (stopping() || failed()) return gate();
    size_t max = hooks_->max_list.load();
    if (max == 0 || hooks_->refuse_lists.load())
      return Status(Code::kUnavailable, "memcpy path: lists are off (test hook)");
    if (Status st = tx_hook(seq); !st.ok()) return st;
    if (srcs.empty() || !carries(srcs[0].where))
      return Status(Code::kInvalidArgument, fmt::format("memcpy path post_tx_list(seq {}): no sources it carries", seq));
    size_t n = std::min(srcs.size(), max);
    if (size_t most = hooks_->take_at_most.load(); most > 0) n = std::min(n, most);
    for (size_t k = 0; k < n; ++k) {
      if (srcs[k].size == 0 || srcs[k].size > kMaxChunk)
        return Status(Code::kInvalidArgument, fmt::format("memcpy path post_tx_list(seq {}): piece {} of {} B", seq,
                                                          k, srcs[k].size));
      if (srcs[k].where != srcs[0].where) {  // another kind of memory: the next list
        n = k;
        break;
      }
    }
    std::vector<unsigned char> d = encode(srcs[0].where, srcs.first(n));
    switch (static_cast<MemcpyLie>(hooks_->lie.exchange(0))) {
      case MemcpyLie::kNone: break;
      case MemcpyLie::kDropPiece:
        if (n > 1) d = encode(srcs[0].where, srcs.first(n - 1));
        else d = encode(srcs[0].where, std::vector<MemRegion>{srcs[0], srcs[0]});  // one more instead
        break;
      case MemcpyLie::kLength: wire::put_u64(d.data() + kHeader + 8, srcs[0].size + 1); break;
      case MemcpyLie::kCountField: wire::put_u32(d.data(), static_cast<uint32_t>(n + 1)); break;
      case MemcpyLie::kTrailing: d.push_back(0x5a); break;
    }
    *taken = n;
    uint64_t bytes = 0;
    for (size_t k = 0; k < n; ++k) bytes += srcs[k].size;
    hooks_->lists_sent.fetch_add(1);
    hooks_->pieces_sent.fetch_add(n);
    for (uint64_t seen = hooks_->longest_list.load(); n > seen && !hooks_->longest_list.compare_exchange_weak(seen, n);) {
    }
    PathCounters::add(counters_.chunks_sent);
    PathCounters::add(counters_.bytes_sent, bytes);
    return d;
  }

  Result<uint64_t> chunk_length(std::span<const unsigned char> d) override {
    DMX_ASSIGN_OR_RETURN(Decoded got, decode(d));
    if (got.pieces.size() != 1)
      return Status(Code::kProtocol, fmt::format("memcpy path: a chunk's descriptor of {} pieces", got.pieces.size()));
    return got.pieces[0].len;
  }

  Status post_rx(uint64_t seq, std::span<const unsigned char> d, const MemRegion& dst) override {
    DMX_ASSIGN_OR_RETURN(Decoded got, decode(d));
    if (got.pieces.size() != 1)
      return Status(Code::kProtocol, fmt::format("memcpy path: a chunk's descriptor of {} pieces", got.pieces.size()));
    if (hooks_->rx_refuse_chunks.load() > 0 && hooks_->rx_refuse_chunks.fetch_sub(1) > 0)
      // Named the path's own way, as shm names its peer "pid N": the endpoint must rename it.
      return Status(Code::kUnavailable, fmt::format("memcpy path chunk {}: refused (test hook)", seq))
          .with_peer("the memcpy twin");
    if (dst.ptr != nullptr && dst.size != got.pieces[0].len)
      return Status(Code::kInvalidArgument, fmt::format("memcpy path post_rx(seq {}): a {} B destination for {} B",
                                                        seq, dst.size, got.pieces[0].len));
    Job j{seq, false, {}};
    j.copies.push_back(Copy{MemRegion{reinterpret_cast<void*>(got.pieces[0].addr), got.pieces[0].len, got.where}, dst});
    return post([&] { jobs_.push_back(std::move(j)); });
  }

  Status post_rx_list(uint64_t seq, std::span<const unsigned char> d, std::span<const MemRegion> dsts) override {
    DMX_ASSIGN_OR_RETURN(Decoded got, decode(d));
    if (got.pieces.size() != dsts.size())
      return Status(Code::kProtocol, fmt::format("memcpy path list {}: the descriptor names {} pieces, the table {}",
                                                 seq, got.pieces.size(), dsts.size()));
    if (dsts.size() > hooks_->max_list.load())
      return Status(Code::kProtocol, fmt::format("memcpy path list {}: {} pieces", seq, dsts.size()));
    if (hooks_->rx_refuse.load() > 0 && hooks_->rx_refuse.fetch_sub(1) > 0)
      return Status(Code::kUnavailable, fmt::format("memcpy path list {}: refused (test hook)", seq));
    bool drop = dsts[0].ptr == nullptr;
    Job j{seq, true, {}};
    for (size_t k = 0; k < dsts.size(); ++k) {
      if (got.pieces[k].len != dsts[k].size)
        return Status(Code::kProtocol, fmt::format("memcpy path list {}: piece {} is {} B, the table says {} B", seq,
                                                   k, got.pieces[k].len, dsts[k].size));
      if ((dsts[k].ptr == nullptr) != drop)
        return Status(Code::kInvalidArgument, fmt::format("memcpy path list {}: some destinations null", seq));
      j.copies.push_back(
          Copy{MemRegion{reinterpret_cast<void*>(got.pieces[k].addr), got.pieces[k].len, got.where}, dsts[k]});
    }
    return post([&] { jobs_.push_back(std::move(j)); });
  }

 private:
  // A send that fails on the path, named the path's own way (as shm names its peer "pid N").
  Status tx_hook(uint64_t seq) {
    if (hooks_->tx_fail.load() <= 0 || hooks_->tx_fail.fetch_sub(1) <= 0) return Status();
    return Status(Code::kIo, fmt::format("memcpy path chunk {}: send failed (test hook)", seq))
        .with_peer("the memcpy twin");
  }

  struct Copy {
    MemRegion src, dst;  // dst.ptr null: dropped
  };
  struct Job {
    uint64_t seq;
    bool list;
    std::vector<Copy> copies;
  };

  bool progress(std::vector<Done>* done) override {
    std::deque<Job> jobs;
    take_posts([&] { jobs.swap(jobs_); });
    for (const Job& j : jobs) {
      if (int us = hooks_->copy_delay_us.load(); us > 0 && !stopping())
        std::this_thread::sleep_for(std::chrono::microseconds(us));
      Status s;
      uint64_t bytes = 0;
      bool dropped = false;
      for (const Copy& c : j.copies) {
        if (c.dst.ptr == nullptr) {
          dropped = true;
          continue;
        }
        bool host = c.src.where.kind != MemKind::kSim && c.dst.where.kind != MemKind::kSim;
        if (host) copy_host(c.dst.ptr, c.src.ptr, c.src.size);
        else if (Status cs = copy_memory(c.dst, c.src); !cs.ok() && s.ok()) s = cs;
        bytes += c.src.size;
      }
      if (dropped) hooks_->dropped.fetch_add(1);
      if (j.list) {
        hooks_->lists_received.fetch_add(1);
        hooks_->pieces_received.fetch_add(j.copies.size());
      } else {
        hooks_->chunks_received.fetch_add(1);
      }
      hooks_->bytes_copied.fetch_add(bytes);
      PathCounters::add(counters_.chunks_received);
      PathCounters::add(counters_.bytes_received, bytes);
      if (bytes > 0) PathCounters::add(counters_.host_copies);
      done->push_back({false, j.seq, s});
    }
    return !jobs.empty();
  }
  void release(const Status& why, std::vector<Done>* done) override {
    std::deque<Job> left;
    take_posts([&] { left.swap(jobs_); });
    for (const Job& j : left) done->push_back({false, j.seq, why});
  }

  const std::string name_;
  const std::shared_ptr<MemcpyHooks> hooks_;
  std::deque<Job> jobs_;  // under the post lock (PathBase::post)
};

class MemcpyTransport final : public Transport {
 public:
  MemcpyTransport(std::string name, std::shared_ptr<MemcpyHooks> hooks) : name_(std::move(name)), hooks_(std::move(hooks)) {}
  std::string_view name() const override { return name_; }
  Result<std::vector<unsigned char>> offer(const Config& config) override {
    if (!transport_allowed(config, name_)) return Status(Code::kUnavailable, name_ + ": not asked");
    return std::vector<unsigned char>{1};
  }
  Status compatible(std::span<const unsigned char> a, std::span<const unsigned char> b,
                    const PeerPair&) const override {
    if (a.size() != 1 || b.size() != 1 || a[0] != 1 || b[0] != 1)
      return Status(Code::kUnavailable, name_ + ": version");
    return Status();
  }
  std::string role(const PeerPair&) const override { return "sources go by " + name_; }
  std::string when() const override { return "tests only"; }
  Result<TransportLink> connect(Bootstrap&) override {
    TransportLink link;
    link.path = std::make_unique<MemcpyPath>(name_, hooks_);
    return link;
  }

 private:
  const std::string name_;
  const std::shared_ptr<MemcpyHooks> hooks_;
};

}  // namespace memcpy_path

inline std::shared_ptr<Transport> make_memcpy_transport(std::shared_ptr<MemcpyHooks> hooks,
                                                        std::string name = "memcpy") {
  return std::make_shared<memcpy_path::MemcpyTransport>(std::move(name), std::move(hooks));
}

}  // namespace dmx::test
