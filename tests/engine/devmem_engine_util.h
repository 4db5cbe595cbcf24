// Helpers of the engine's tests over the devmem socket-pair double (devmem_engine_test.cc,
// devmem_engine_one_sided_test.cc): payload paths that change one thing each, two "hosts" (contexts
// with their own SimNic as the devmem transport's path factory) joined by a real loopback
// connection, and what an endpoint's statistics say of its devmem path.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "devmem/socket_double.h"
#include "engine/context_impl.h"
#include "engine/test_util.h"
#include "engine/transport_setup.h"
#include "topo/placement.h"
#include "transport/devmem/devmem_path.h"
#include "transport/devmem/devmem_transport.h"

namespace dmx::test::devmem_engine {

using namespace std::chrono_literals;
using devmem::testing::SimNic;
using devmem::testing::SimNicOptions;

inline const MemSpec kSim{MemKind::kSim, 0};
inline const MemSpec kHost{};

// A payload path that forwards everything to another; the test paths below change one thing each.
class ForwardingPath : public PayloadPath {
 public:
  explicit ForwardingPath(std::unique_ptr<PayloadPath> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  void start(Events* e, std::shared_ptr<void> k) override { inner_->start(e, std::move(k)); }
  bool carries(const MemSpec& src) const override { return inner_->carries(src); }
  bool accepts(const MemSpec& dst) const override { return inner_->accepts(dst); }
  bool accepts_any() const override { return inner_->accepts_any(); }
  bool lands_writes() const override { return inner_->lands_writes(); }
  uint64_t max_chunk() const override { return inner_->max_chunk(); }
  Result<std::vector<unsigned char>> post_tx(uint64_t seq, const MemRegion& src, bool whole) override {
    return inner_->post_tx(seq, src, whole);
  }
  Result<uint64_t> chunk_length(std::span<const unsigned char> d) override { return inner_->chunk_length(d); }
  Status post_rx(uint64_t seq, std::span<const unsigned char> d, const MemRegion& dst) override {
    return inner_->post_rx(seq, d, dst);
  }
  Result<bool> post_rx_now(uint64_t seq, std::span<const unsigned char> d, const MemRegion& dst) override {
    return inner_->post_rx_now(seq, d, dst);
  }
  bool receiver_releases() const override { return inner_->receiver_releases(); }
  void stop() override { inner_->stop(); }
  PathStats stats() const override { return inner_->stats(); }
  std::string describe() const override { return inner_->describe(); }

 private:
  std::unique_ptr<PayloadPath> inner_;
};

// A devmem path that accepts only sim destinations: stands in for a GPU pool whose gatherer cannot
// write host memory, so the engine must keep such transfers inline.
class SimOnlyPath final : public ForwardingPath {
 public:
  using ForwardingPath::ForwardingPath;
  bool accepts(const MemSpec& dst) const override { return dst.kind == MemKind::kSim; }
  std::string describe() const override { return ForwardingPath::describe() + " (sim destinations only)"; }
};

// A devmem path that, like cuda_ipc at the end of a cuMem block, takes only a prefix of a chunk it
// may cut (PayloadPath::post_tx, whole == false): at most kTake bytes, so the endpoint must send
// the rest as further chunks.
class PrefixPath final : public ForwardingPath {
 public:
  static constexpr size_t kTake = 100003;
  using ForwardingPath::ForwardingPath;
  Result<std::vector<unsigned char>> post_tx(uint64_t seq, const MemRegion& src, bool whole) override {
    if (whole || src.size <= kTake) return ForwardingPath::post_tx(seq, src, whole);
    ++cuts_;
    return ForwardingPath::post_tx(seq, src.sub(0, kTake), whole);
  }
  std::string describe() const override {
    return ForwardingPath::describe() + fmt::format(" ({} chunks cut)", cuts_.load());
  }

 private:
  std::atomic<uint64_t> cuts_{0};
};

// A devmem path that counts how the receiving endpoint hands it chunks: post_rx_now (the
// small-chunk lane may take it on the stream's thread) or post_rx (more frames wait behind it on
// the control stream: EndpointImpl::on_path_header, Stream::rx_backlog).
class LaneCountingPath final : public ForwardingPath {
 public:
  using ForwardingPath::ForwardingPath;
  Status post_rx(uint64_t seq, std::span<const unsigned char> d, const MemRegion& dst) override {
    ++queued_;
    return ForwardingPath::post_rx(seq, d, dst);
  }
  Result<bool> post_rx_now(uint64_t seq, std::span<const unsigned char> d, const MemRegion& dst) override {
    ++offered_now_;
    return ForwardingPath::post_rx_now(seq, d, dst);
  }
  std::string describe() const override {
    return ForwardingPath::describe() +
           fmt::format(" (lane offered {}, queued {})", offered_now_.load(), queued_.load());
  }

 private:
  std::atomic<uint64_t> offered_now_{0}, queued_{0};
};

// A devmem path whose stop() is ignored: stands in for a path whose copies wedged, so that its
// on_path_stopped does not come while the endpoint closes. Destroying it (the real path's
// destructor) still stops and joins the real path.
class StuckStopPath final : public ForwardingPath {
 public:
  using ForwardingPath::ForwardingPath;
  void stop() override {}
};

inline Options devmem_options(const char* transport = "devmem") {
  Options o = test_options(2);
  o.set("transport", transport).set("devmem_rx_pool", "32M");
  return o;
}

struct Host {
  std::shared_ptr<SimNic> nic;
  Context ctx;
};

// A context whose devmem path is the double. The factory holds the NIC; the context's config is
// read through a raw pointer (the factory lives in that context, so it cannot outlive it).
enum class Wrap { kNone, kSimOnly, kPrefix, kLaneCounting, kStuckStop };

// `placement`: the host's machine, whose GPU pools the path's memory comes from (HostSeams::place);
// null: the path's own memory.
inline Host make_host(uint64_t seed, Options o = devmem_options(), Wrap wrap = Wrap::kNone, SimNicOptions no = {},
               std::shared_ptr<topo::Placement> placement = nullptr) {
  Host h;
  no.seed = seed;
  h.nic = std::make_shared<SimNic>(no);
  auto c = Context::create(o);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  h.ctx = *c;
  ContextImpl* impl = h.ctx.impl().get();
  impl->register_transport(make_devmem_transport(
      [nic = h.nic, wrap, placement](UniqueFd fd, const Config& config,
                                     const std::string& peer) -> Result<std::unique_ptr<PayloadPath>> {
        devmem::HostSeams seams = nic->seams();
        if (placement)  // the double's pools are host memory: GPU pools of host memory stand for them
          seams.place = devmem::placement_memory([placement] { return Result<std::shared_ptr<topo::Placement>>(placement); },
                                                 seams.ifname, 0, seams.memory);
        auto p = make_devmem_path(std::move(fd), config, peer, std::move(seams));
        if (!p.ok() || wrap == Wrap::kNone) return p;
        if (wrap == Wrap::kPrefix) return std::unique_ptr<PayloadPath>(std::make_unique<PrefixPath>(std::move(*p)));
        if (wrap == Wrap::kLaneCounting)
          return std::unique_ptr<PayloadPath>(std::make_unique<LaneCountingPath>(std::move(*p)));
        if (wrap == Wrap::kStuckStop)
          return std::unique_ptr<PayloadPath>(std::make_unique<StuckStopPath>(std::move(*p)));
        return std::unique_ptr<PayloadPath>(std::make_unique<SimOnlyPath>(std::move(*p)));
      }));
  return h;
}

// Two "hosts" (contexts with their own SimNic), the client on b, the server on a.
struct DevmemPair {
  Host a, b;
  Listener listener;
  Endpoint client, server;
};

inline DevmemPair connect_devmem(Wrap wrap = Wrap::kNone, const Options& o = devmem_options(), SimNicOptions no = {},
                          std::shared_ptr<topo::Placement> pa = nullptr, std::shared_ptr<topo::Placement> pb = nullptr) {
  DevmemPair p;
  p.a = make_host(11, o, wrap, no, std::move(pa));
  p.b = make_host(22, o, wrap, no, std::move(pb));
  auto l = p.a.ctx.listen("tcp://127.0.0.1:0");
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  p.listener = std::move(*l);
  auto c = p.b.ctx.connect(p.listener.address());
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (c.ok()) p.client = std::move(*c);
  auto s = p.listener.accept(10s);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  if (s.ok()) p.server = std::move(*s);
  return p;
}

inline uint64_t devmem_bytes_sent(const Endpoint& e) {
  for (const auto& u : e.stats().paths)
    if (u.name == "devmem") return u.bytes_sent;
  return 0;
}
inline uint64_t devmem_bytes_received(const Endpoint& e) {
  for (const auto& u : e.stats().paths)
    if (u.name == "devmem") return u.bytes_received;
  return 0;
}
inline uint64_t devmem_chunks_received(const Endpoint& e) {
  for (const auto& u : e.stats().paths)
    if (u.name == "devmem") return u.chunks_received;
  return 0;
}

inline uint64_t inline_bytes_received(const Endpoint& e) {
  EndpointStats st = e.stats();
  return st.bytes_received;
}

inline std::string devmem_detail(const Endpoint& e) {
  for (const auto& u : e.stats().paths)
    if (u.name == "devmem") return u.detail;
  return "";
}

}  // namespace dmx::test::devmem_engine
