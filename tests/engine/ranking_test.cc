// The transport ranking (engine/ranking.h) on the server fixtures of tests/fixtures/topo: the order
// changes with the distance between the GPU and the NIC, and the engine sends by that order.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "engine/context_impl.h"
#include "engine/ranking.h"
#include "engine/test_util.h"
#include "topo/advisor.h"
#include "topo/topo_fixture.h"
#include "transport/loop_transport.h"

namespace dmx::test {
namespace {

// Only its name and what it gives matter to the ranking.
class NamedTransport final : public Transport {
 public:
  NamedTransport(std::string name, Gives gives, bool offers = true)
      : name_(std::move(name)), gives_(gives), offers_(offers) {}
  std::string_view name() const override { return name_; }
  Gives gives() const override { return gives_; }
  Result<std::vector<unsigned char>> offer(const Config&) override {
    if (!offers_) return Status(Code::kUnavailable, name_ + ": left out by the test");
    return std::vector<unsigned char>{1};
  }
  Status compatible(std::span<const unsigned char>, std::span<const unsigned char>, const PeerPair&) const override {
    return Status();
  }
  std::string role(const PeerPair&) const override { return name_; }
  std::string when() const override { return "tests only"; }
  Result<TransportLink> connect(Bootstrap&) override { return TransportLink{}; }

 private:
  std::string name_;
  Gives gives_;
  bool offers_;
};

std::shared_ptr<Transport> path(const std::string& name) {
  return std::make_shared<NamedTransport>(name, Gives::kPath);
}
std::shared_ptr<Transport> streams() {
  return std::make_shared<NamedTransport>("tcp", Gives::kStreams);
}

RankingInputs between_hosts(const std::string& fixture, TransportList agreed) {
  RankingInputs in;
  in.agreed = std::move(agreed);
  in.pair.same_host = false;
  in.topo = std::make_shared<const topo::Topology>(topo::testing::load(fixture));
  return in;
}

std::vector<std::string> names(const KindRanking& r) {
  std::vector<std::string> out;
  for (const RankedPath& p : r.order) out.push_back(p.name);
  return out;
}

const MemSpec kHost{MemKind::kHost, 0};
const MemSpec kCuda0{MemKind::kCuda, 0};
const MemSpec kCuda1{MemKind::kCuda, 1};

// dual-socket-icelake: cuda:0 (03:00.0) shares a PCIe switch with mlx5_0 (ens1); cuda:1 (83:00.0)
// sits below socket 1's switch beside mlx5_1, but ACS redirect on its port sends the traffic
// through the host bridge. Seed 002: GPUDirect only below the root complex.
TEST(Ranking, RdmaGpuDirectWhereGpuAndNicShareASwitchStagedThroughTheRootComplex) {
  RankingInputs in = between_hosts("dual-socket-icelake", {path("rdma"), streams()});
  KindRanking near = rank_transports(in, kCuda0);
  ASSERT_EQ(names(near), (std::vector<std::string>{"rdma", "tcp"})) << near.text;
  EXPECT_EQ(near.order[0].id, 1);
  EXPECT_EQ(near.order[1].id, 0) << "tcp's chunks ride the streams: inline";
  EXPECT_NE(near.order[0].how.find("GPUDirect by ens1"), std::string::npos) << near.text;
  EXPECT_NE(near.order[0].how.find("0 host passes, 0 copies"), std::string::npos) << near.text;
  // The seed's arithmetic: 128 B completions below the root complex, 256 B posted writes.
  EXPECT_NE(near.text.find("86.5 %"), std::string::npos) << near.text;
  EXPECT_NE(near.text.find("91.4 %"), std::string::npos) << near.text;
  EXPECT_NE(near.text.find("rdma won: fewer host-memory passes per byte (0 against 4)"), std::string::npos)
      << near.text;

  KindRanking far = rank_transports(in, kCuda1);
  ASSERT_EQ(names(far), (std::vector<std::string>{"rdma", "tcp"})) << far.text;
  EXPECT_NE(far.order[0].how.find("staged by ens2"), std::string::npos) << far.text;
  EXPECT_NE(far.order[0].how.find("2 host passes, 2 copies"), std::string::npos) << far.text;
  EXPECT_NE(far.text.find("staged through pinned host memory on NUMA node 1"), std::string::npos) << far.text;
  EXPECT_NE(far.text.find("ACS redirect"), std::string::npos) << far.text;
  EXPECT_NE(far.text.find("76.2 %"), std::string::npos) << "64 B root-complex completions: " << far.text;

  // Host memory: the NIC reads registered memory itself.
  KindRanking host = rank_transports(in, kHost);
  EXPECT_EQ(names(host), (std::vector<std::string>{"rdma", "tcp"})) << host.text;
}

// dual-socket-haswell: the GPU (02:00.0) and the ConnectX NIC (03:00.0) meet only at socket 0's
// root complex (PHB), the other GPU is on socket 1 (SYS).
TEST(Ranking, RdmaStagedWhereGpuAndNicMeetOnlyAtTheRootComplex) {
  RankingInputs in = between_hosts("dual-socket-haswell", {path("rdma"), streams()});
  ASSERT_TRUE(in.topo->nics.size() > 0 && !in.topo->nics[0].rdma.empty()) << "the fixture's NIC has an RDMA device";
  for (const MemSpec& m : {kCuda0, kCuda1}) {
    KindRanking r = rank_transports(in, m);
    ASSERT_EQ(names(r), (std::vector<std::string>{"rdma", "tcp"})) << r.text;
    EXPECT_NE(r.order[0].how.find("staged by ens2f0"), std::string::npos) << r.text;
  }
  KindRanking phb = rank_transports(in, kCuda0);
  EXPECT_NE(phb.text.find("PHB"), std::string::npos) << phb.text;
  EXPECT_NE(phb.text.find("slower than staging"), std::string::npos) << phb.text;
}

// devmem has no staging of its own: where the advisor favours staging, the streams (which stage
// through pinned host memory) rank above it; where the GPU and the NIC share a switch, devmem wins.
TEST(Ranking, DevmemRanksBelowTheStreamsWhenTheGpuIsFarFromItsNic) {
  RankingInputs in = between_hosts("dual-socket-icelake", {path("devmem"), streams()});
  in.devmem_ifname = "ens1";
  KindRanking near = rank_transports(in, kCuda0);
  EXPECT_EQ(names(near), (std::vector<std::string>{"devmem", "tcp"})) << near.text;
  KindRanking far = rank_transports(in, kCuda1);  // socket 1's GPU against socket 0's NIC: SYS
  EXPECT_EQ(names(far), (std::vector<std::string>{"tcp", "devmem"})) << far.text;
  EXPECT_NE(far.text.find("tcp won: the advisor favours staging"), std::string::npos) << far.text;
  EXPECT_NE(far.text.find("SYS"), std::string::npos) << far.text;
  // A forced transport goes first whatever the advisor says.
  in.forced = "devmem";
  EXPECT_EQ(names(rank_transports(in, kCuda1)), (std::vector<std::string>{"devmem", "tcp"}));
}

// Both NIC transports: rdma runs the protocol in the NIC, devmem in the kernel's TCP.
TEST(Ranking, RdmaAboveDevmemAboveTheStreamsNearTheNic) {
  RankingInputs in = between_hosts("dual-socket-icelake", {path("devmem"), streams(), path("rdma")});
  in.devmem_ifname = "ens1";
  KindRanking r = rank_transports(in, kCuda0);
  EXPECT_EQ(names(r), (std::vector<std::string>{"rdma", "devmem", "tcp"})) << r.text;
  EXPECT_NE(r.text.find("rdma won: the NIC runs the protocol"), std::string::npos) << r.text;
}

// gpu-h200x2 is a capture of the GPU machine: virtio-net, no RDMA device. An rdma transport agreed
// there is a software one (soft-RoCE): the streams rank above it.
TEST(Ranking, RdmaBelowTcpWithoutAnRdmaDeviceOnAPciFunction) {
  RankingInputs in = between_hosts("gpu-h200x2", {path("rdma"), streams()});
  ASSERT_TRUE(in.topo->rdma.empty());
  for (const MemSpec& m : {kHost, kCuda0}) {
    KindRanking r = rank_transports(in, m);
    EXPECT_EQ(names(r), (std::vector<std::string>{"tcp", "rdma"})) << r.text;
    EXPECT_NE(r.text.find("needs an RDMA device on a PCI function"), std::string::npos) << r.text;
  }
  in.forced = "rdma";
  EXPECT_EQ(names(rank_transports(in, kHost)), (std::vector<std::string>{"rdma", "tcp"}));
}

TEST(Ranking, SameHostTransportsRankByCopiesAndHostPasses) {
  RankingInputs in;
  in.agreed = {path("cuda_ipc"), path("shm"), std::make_shared<NamedTransport>("shm_pipe", Gives::kControl),
               streams(), path("rdma")};
  in.pair.same_host = true;
  in.topo = std::make_shared<const topo::Topology>(topo::testing::load("dual-socket-icelake"));
  KindRanking host = rank_transports(in, kHost);
  EXPECT_EQ(names(host), (std::vector<std::string>{"shm", "rdma", "tcp"})) << host.text;
  EXPECT_NE(host.text.find("shm won: on one host shm moves bytes through memory only"), std::string::npos)
      << host.text;
  KindRanking dev = rank_transports(in, kCuda0);
  EXPECT_EQ(names(dev), (std::vector<std::string>{"cuda_ipc", "shm", "rdma", "tcp"})) << dev.text;
  EXPECT_EQ(dev.order[0].id, 1);
  EXPECT_EQ(dev.order[1].id, 2);
  EXPECT_EQ(dev.order[2].id, 5) << "path ids stay positions in the agreed list";
}

// A transport without costs (a test's) keeps its old place: after the known paths, before the streams.
TEST(Ranking, TransportWithoutCostsRanksAfterKnownPathsBeforeTheStreams) {
  RankingInputs in;
  in.agreed = {path("loop"), path("shm"), streams()};
  in.pair.same_host = true;
  KindRanking r = rank_transports(in, kHost);
  EXPECT_EQ(names(r), (std::vector<std::string>{"shm", "loop", "tcp"})) << r.text;
  in.forced = "loop";
  EXPECT_EQ(names(rank_transports(in, kHost)), (std::vector<std::string>{"loop", "shm", "tcp"}));
}

// The engine sends by the ranking, not by path id: a host send with "rdma" agreed (the loop
// transport under that name) goes by it where the host has an RDMA device on a PCI function, and
// inline on the streams where it has none. shm and cuda_ipc are left out (a GPU host would agree
// cuda_ipc too) so that only rdma and the streams compete.
struct Sent {
  uint64_t rdma_bytes = 0;
  std::string transport, reason;
};

Sent host_send_with_rdma_on(const std::string& fixture) {
  Sent out;
  Options o = test_options(1);
  o.set("sysfs_root", topo::testing::fixture_root(fixture));
  auto ctx = Context::create(o);
  EXPECT_TRUE(ctx.ok()) << ctx.status().to_string();
  if (!ctx.ok()) return out;
  ctx->impl()->register_transport(make_loop_transport("rdma"));
  ctx->impl()->register_transport(std::make_shared<NamedTransport>("shm", Gives::kPath, /*offers=*/false));
  ctx->impl()->register_transport(std::make_shared<NamedTransport>("cuda_ipc", Gives::kPath, /*offers=*/false));
  auto l = ctx->listen("tcp://127.0.0.1:0");
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  if (!l.ok()) return out;
  auto c = ctx->connect(l->address());
  auto s = l->accept(kEventually);
  EXPECT_TRUE(c.ok() && s.ok()) << c.status().to_string() << " " << s.status().to_string();
  if (!c.ok() || !s.ok()) return out;
  const size_t n = (256 << 10) + 77;
  Filled src = filled(MemSpec{MemKind::kHost, 0}, n);
  Buffer dst = poisoned(MemSpec{MemKind::kHost, 0}, n);
  Request r = s->recv(dst.region(), 7);
  Request w = c->send(src.buf.region(), 7);
  EXPECT_TRUE(w.wait(kEventually).ok()) << w.status().to_string();
  EXPECT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
  EXPECT_EQ(read_back(dst.region()), src.data);
  EndpointStats st = c->stats();
  out.transport = st.transport;
  out.reason = st.reason;
  for (const auto& p : st.paths)
    if (p.name == "rdma") out.rdma_bytes += p.bytes_sent;
  return out;
}

TEST(Ranking, EngineSendsByRdmaOnlyWhereAnRdmaDeviceExists) {
  Sent with = host_send_with_rdma_on("dual-socket-icelake");
  EXPECT_EQ(with.transport, "rdma");
  EXPECT_EQ(with.rdma_bytes, (256u << 10) + 77) << with.reason;
  EXPECT_NE(with.reason.find("host memory: rdma"), std::string::npos) << with.reason;

  Sent without = host_send_with_rdma_on("gpu-h200x2");
  EXPECT_EQ(without.transport, "rdma") << "agreed, ranked below the streams";
  EXPECT_EQ(without.rdma_bytes, 0u) << "the streams rank above a software rdma: " << without.reason;
  EXPECT_NE(without.reason.find("host memory: tcp inline (2 host passes, 2 copies) > rdma"), std::string::npos) << without.reason;
  EXPECT_NE(without.reason.find("needs an RDMA device on a PCI function"), std::string::npos) << without.reason;
}

}  // namespace
}  // namespace dmx::test
