// Contexts that meet through the store (etcd on loopback): connect by name, publish and look up
// regions, a peer that restarts (its partners fail at once naming it, its old regions are refused,
// its name finds the new process), the store going away and coming back.
// Entries are written with designated initializers, naming only the fields a test is about.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "dmx/dmx.h"
#include "store/entries.h"
#include "store/etcd_server.h"
#include "test_env.h"

namespace dmx {
namespace {

using testing::EtcdServer;
using test::kEventually;

Context make(const EtcdServer& etcd, const std::string& name, const std::string& key = "cluster-test-key-123") {
  Options o;
  o.set("store", etcd.url()).set("store_job", "t").set("auth_key", key).set("store_watch_interval", "200ms");
  o.set("store_lease_ttl", "3s").set("streams", "2");
  if (!name.empty()) o.set("store_name", name);
  auto c = Context::create(o);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return std::move(*c);
}

std::vector<unsigned char> random_bytes(size_t n) {
  std::vector<unsigned char> v(n);
  std::mt19937_64 rng(std::random_device{}());
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

MemRegion host(std::vector<unsigned char>& v) { return MemRegion{v.data(), v.size(), {MemKind::kHost, 0}}; }

// A write the target is told of. Its memory is read once the notification came (the data has
// landed there), not on the writer's completion alone: both contexts are in this process, and the
// completion's way between them is shared memory mapped twice, which ThreadSanitizer does not see.
OpOptions notified() {
  OpOptions o;
  o.notify = true;
  return o;
}

struct Server {
  Context ctx;
  Listener listener;
  std::vector<unsigned char> buf;
  Registration reg;
};

std::unique_ptr<Server> serve(const EtcdServer& etcd, const std::string& name) {
  auto s = std::make_unique<Server>(Server{make(etcd, name), {}, std::vector<unsigned char>(1 << 20), {}});
  auto l = s->ctx.listen("tcp://127.0.0.1:0");
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  s->listener = std::move(*l);
  auto r = s->ctx.register_memory(host(s->buf));
  EXPECT_TRUE(r.ok());
  s->reg = std::move(*r);
  EXPECT_TRUE(s->ctx.publish("buf-of-" + name, s->reg).ok());
  return s;
}

TEST(Cluster, ConnectByNameWriteIntoAPublishedRegion) {
  DMX_NEED_ETCD(etcd);
  auto a = serve(etcd, "a");
  EXPECT_GT(a->ctx.epoch(), 0u);
  Context b = make(etcd, "");
  auto ep = b.connect("dmx://t/a");
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  auto acc = a->listener.accept(std::chrono::seconds(10));
  ASSERT_TRUE(acc.ok());
  auto region = b.lookup("buf-of-a");
  ASSERT_TRUE(region.ok()) << region.status().to_string();
  EXPECT_EQ(region->owner, "a");
  EXPECT_EQ(region->owner_epoch, a->ctx.epoch());
  auto data = random_bytes(300001);
  ASSERT_TRUE(ep->write(host(data), region->region, 4099, notified()).wait().ok());
  ASSERT_TRUE(acc->next_notification(kEventually).ok());  // landed: see notified()
  EXPECT_EQ(0, std::memcmp(a->buf.data() + 4099, data.data(), data.size()));
  auto listing = b.cluster();
  ASSERT_TRUE(listing.ok());
  EXPECT_EQ(listing->peers.size(), 1u);
  EXPECT_EQ(listing->regions.size(), 1u);
  // Unknown names, another job, no store: each says so.
  EXPECT_EQ(b.connect("dmx://t/nobody").status().code(), Code::kNotFound);
  EXPECT_EQ(b.connect("dmx://other/a").status().code(), Code::kInvalidArgument);
  auto plain = Context::create();
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->connect("dmx://t/a").status().code(), Code::kInvalidArgument);
}

TEST(Cluster, RestartedPeerFailsItsPartnersAndItsOldRegionsAreRefused) {
  DMX_NEED_ETCD(etcd);
  auto a = serve(etcd, "a");
  uint64_t old_epoch = a->ctx.epoch();
  Context b = make(etcd, "b");
  auto lb = b.listen("tcp://127.0.0.1:0");  // b is named too: a's side watches b
  ASSERT_TRUE(lb.ok());
  auto ep = b.connect("dmx://t/a");
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  auto acc = a->listener.accept(std::chrono::seconds(10));
  ASSERT_TRUE(acc.ok());
  auto region = b.lookup("buf-of-a");
  ASSERT_TRUE(region.ok());
  std::vector<unsigned char> sink(64);
  Request pending = ep->recv(host(sink), 77);  // never sent: it must fail when a goes

  // a "restarts": a new process registers the name while the old one still holds its connection
  // (a stale process the store no longer knows, e.g. one partitioned away).
  auto a2 = serve(etcd, "a");
  EXPECT_GT(a2->ctx.epoch(), old_epoch);
  Status s = pending.wait(kEventually);
  EXPECT_EQ(s.code(), Code::kPeerFailed) << s.to_string();
  EXPECT_NE(s.to_string().find("dmx://t/a"), std::string::npos) << s.to_string();
  EXPECT_NE(s.to_string().find("restarted"), std::string::npos) << s.to_string();
  auto data = random_bytes(4096);
  EXPECT_EQ(ep->write(host(data), region->region, 0).wait().code(), Code::kPeerFailed);

  // The name finds the new process; the region cached from the old epoch is refused there, and
  // nothing of it lands.
  std::vector<unsigned char> before = a2->buf;
  auto ep2 = b.connect("dmx://t/a");
  ASSERT_TRUE(ep2.ok()) << ep2.status().to_string();
  auto acc2 = a2->listener.accept(std::chrono::seconds(10));
  ASSERT_TRUE(acc2.ok());
  Status stale = ep2->write(host(data), region->region, 0).wait(kEventually);
  EXPECT_EQ(stale.code(), Code::kPeerFailed) << stale.to_string();
  EXPECT_NE(stale.message().find("stale"), std::string::npos) << stale.to_string();
  // Carried by hand (no epoch), the old key is unknown to the new process.
  RemoteRegion by_hand{region->region.key, region->region.size};
  EXPECT_FALSE(ep2->write(host(data), by_hand, 0).wait(kEventually).ok());
  EXPECT_EQ(before, a2->buf);
  EXPECT_EQ(b.lookup("buf-of-a")->owner_epoch, a2->ctx.epoch());
  auto fresh = b.lookup("buf-of-a");
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE(ep2->write(host(data), fresh->region, 0, notified()).wait(kEventually).ok());
  ASSERT_TRUE(acc2->next_notification(kEventually).ok());
  EXPECT_EQ(0, std::memcmp(a2->buf.data(), data.data(), data.size()));
}

TEST(Cluster, EndedLeaseFailsThePartners) {
  DMX_NEED_ETCD(etcd);
  auto a = serve(etcd, "a");
  Context b = make(etcd, "");
  auto ep = b.connect("dmx://t/a");
  ASSERT_TRUE(ep.ok());
  std::vector<unsigned char> sink(64);
  Request pending = ep->recv(host(sink), 1);
  // a's entry goes (as when its lease ends) while its connection stays up.
  auto raw = store::open_store(etcd.url(), std::chrono::milliseconds(2000));
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE((*raw)->remove("dmx/t/peers/a").ok());
  Status s = pending.wait(kEventually);
  EXPECT_EQ(s.code(), Code::kPeerFailed) << s.to_string();
  EXPECT_NE(s.to_string().find("lease"), std::string::npos) << s.to_string();
}

TEST(Cluster, StaleEntryPointingAtAnotherProcessIsRefusedInTheHandshake) {
  DMX_NEED_ETCD(etcd);
  auto a = serve(etcd, "a");
  auto c = serve(etcd, "c");
  // Someone with the key points a's entry at c's address: the handshake says c is not a.
  auto raw = store::open_store(etcd.url(), std::chrono::milliseconds(2000));
  ASSERT_TRUE(raw.ok());
  auto entry = (*raw)->get("dmx/t/peers/a");
  ASSERT_TRUE(entry.ok() && entry->has_value());
  auto p = make(etcd, "").lookup_peer("a");
  ASSERT_TRUE(p.ok());
  Context b = make(etcd, "");
  // Re-sign a's entry with c's address (a holder of the key can; an outsider cannot: store_test).
  store::PeerEntry forged{.job = "t", .name = "a", .epoch = p->epoch, .addresses = {c->listener.address()}};
  std::string k = "cluster-test-key-123";
  ASSERT_TRUE((*raw)->put("dmx/t/peers/a", store::encode(forged, store::Secret{false, {k.begin(), k.end()}}), 0).ok());
  auto ep = b.connect("dmx://t/a");
  ASSERT_FALSE(ep.ok());
  EXPECT_EQ(ep.status().code(), Code::kAuth) << ep.status().to_string();
  EXPECT_NE(ep.status().message().find("the process at"), std::string::npos) << ep.status().to_string();
}

TEST(Cluster, StoreAwayKeepsEndpointsFailsLookupsAndComesBack) {
  DMX_NEED_ETCD(etcd);
  auto a = serve(etcd, "a");
  Context b = make(etcd, "");
  auto ep = b.connect("dmx://t/a");
  ASSERT_TRUE(ep.ok());
  auto acc = a->listener.accept(std::chrono::seconds(10));
  ASSERT_TRUE(acc.ok());
  auto region = b.lookup("buf-of-a");
  ASSERT_TRUE(region.ok());
  etcd.stop();
  auto l = b.lookup("buf-of-a");
  EXPECT_EQ(l.status().code(), Code::kUnavailable) << l.status().to_string();
  EXPECT_NE(l.status().message().find("etcd http://127.0.0.1"), std::string::npos);
  // Established endpoints go on, past the lease TTL.
  std::this_thread::sleep_for(std::chrono::seconds(4));
  auto data = random_bytes(100000);
  ASSERT_TRUE(ep->write(host(data), region->region, 7, notified()).wait(kEventually).ok());
  ASSERT_TRUE(acc->next_notification(kEventually).ok());
  EXPECT_EQ(0, std::memcmp(a->buf.data() + 7, data.data(), data.size()));
  EXPECT_TRUE(ep->health().ok());
  ASSERT_TRUE(etcd.start());
  auto until = std::chrono::steady_clock::now() + kEventually;
  Result<PublishedRegion> back = Status(Code::kUnavailable, "not yet");
  while (!back.ok() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    back = b.lookup("buf-of-a");
  }
  EXPECT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(ep->health().ok()) << ep->health().to_string();
}

// A wildcard listener is reached at the host's addresses, so those go in the store, never
// 0.0.0.0 (a peer would dial itself); the port is the listener's. Looked up only: connecting to
// a non-loopback address stays for tests/netns (scripts/soak-cluster.sh with SOAK_LINKS=2).
TEST(Cluster, AWildcardListenerPublishesTheHostsAddresses) {
  DMX_NEED_ETCD(etcd);
  Context a = make(etcd, "wild-" + std::to_string(std::random_device{}()));
  auto l = a.listen("tcp://0.0.0.0:0");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  std::string port = l->address().substr(l->address().rfind(':'));
  Context b = make(etcd, "");
  auto peers = b.cluster();
  ASSERT_TRUE(peers.ok()) << peers.status().to_string();
  ASSERT_EQ(peers->peers.size(), 1u);
  const PeerInfo& p = peers->peers[0];
  ASSERT_FALSE(p.addresses.empty());
  for (const std::string& addr : p.addresses) {
    EXPECT_EQ(addr.find("0.0.0.0"), std::string::npos) << addr;
    EXPECT_EQ(addr.rfind("tcp://", 0), 0u) << addr;
    EXPECT_EQ(addr.substr(addr.rfind(':')), port) << addr;
  }
}

// The engine publishes the machine's pools (topo/placement.h) with where they are once it has a
// name (each entry named after it), and they go with its lease. On the two-socket fixture: a pinned pool per NUMA node, a GPU
// pool per GPU (03:00.0 on node 0, 83:00.0 on node 1; no CUDA overlay: ordinals in PCI order) and
// the NVMe's published p2pmem (05:00.0, node 0).
TEST(Cluster, TheEnginePublishesItsPoolsWithTheirPlacement) {
  DMX_NEED_ETCD(etcd);
  const char* base = std::getenv("DMX_TEST_FIXTURES");
  std::string root = std::string(base ? base : "tests/fixtures") + "/topo/dual-socket-icelake";
  Options o;
  o.set("store", etcd.url()).set("store_job", "t").set("auth_key", "cluster-test-key-123");
  o.set("store_lease_ttl", "3s").set("store_name", "pools").set("sysfs_root", root);
  auto created = Context::create(o);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  std::optional<Context> a(std::move(*created));
  Context b = make(etcd, "");
  auto before = b.cluster();
  ASSERT_TRUE(before.ok()) << before.status().to_string();
  EXPECT_TRUE(before->pools.empty()) << "published once the process has a name (its first listener)";
  {
    auto l = a->listen("tcp://127.0.0.1:0");
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    auto listing = b.cluster();
    ASSERT_TRUE(listing.ok()) << listing.status().to_string();
    EXPECT_TRUE(listing->refused.empty());
    std::map<std::string, PublishedPool> by_name;
    for (const auto& p : listing->pools) by_name[p.name] = p;
    ASSERT_EQ(by_name.size(), 5u) << "2 NUMA nodes, 2 GPUs, 1 p2pmem BAR";
    struct Want {
      const char* name;
      const char* kind;
      int numa, device;
    };
    for (const Want& w : {Want{"pools:host-node0", "pinned-host", 0, -1}, Want{"pools:host-node1", "pinned-host", 1, -1},
                          Want{"pools:gpu-0000:03:00.0", "gpu", 0, 0}, Want{"pools:gpu-0000:83:00.0", "gpu", 1, 1},
                          Want{"pools:p2pmem-0000:05:00.0", "device-bar", 0, -1}}) {
      ASSERT_EQ(by_name.count(w.name), 1u) << w.name;
      const PublishedPool& p = by_name[w.name];
      EXPECT_EQ(p.kind, w.kind) << w.name;
      EXPECT_EQ(p.numa, w.numa) << w.name;
      EXPECT_EQ(p.device, w.device) << w.name;
      EXPECT_GT(p.bytes, 0u) << w.name;
      EXPECT_FALSE(p.host.empty()) << w.name;
    }
  }
  a.reset();  // the process is gone: its lease, and its pools with it, end within the TTL
  auto until = std::chrono::steady_clock::now() + kEventually;
  size_t left = 5;
  while (left > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto l = b.cluster();
    if (l.ok()) left = l->pools.size();
  }
  EXPECT_EQ(left, 0u);
}

}  // namespace
}  // namespace dmx
