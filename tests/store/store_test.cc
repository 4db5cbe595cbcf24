// The store layer against a real etcd (started here, on loopback): leases, epochs, signed entries.
// Entries are written with designated initializers, naming only the fields a test is about.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "store/directory.h"
#include "store/entries.h"
#include "store/etcd_server.h"
#include "test_env.h"

namespace dmx {
namespace {

using testing::EtcdServer;
using test::kEventually;

store::Secret secret(const std::string& k) { return store::Secret{false, std::vector<unsigned char>(k.begin(), k.end())}; }

store::DirectoryOptions options(const EtcdServer& s, const std::string& key, std::chrono::seconds ttl = std::chrono::seconds(10)) {
  store::DirectoryOptions o;
  o.url = s.url();
  o.job = "job1";
  o.lease_ttl = ttl;
  o.watch_interval = std::chrono::milliseconds(200);
  o.secret = secret(key);
  return o;
}

TEST(EtcdStore, PutGetListLeaseAndEpochs) {
  DMX_NEED_ETCD(etcd);
  auto s = store::open_store(etcd.url(), std::chrono::milliseconds(2000));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  auto& st = **s;
  ASSERT_TRUE(st.put("t/a", std::string("v\0a", 3), 0).ok());
  ASSERT_TRUE(st.put("t/b", "vb", 0).ok());
  auto a = st.get("t/a");
  ASSERT_TRUE(a.ok() && a->has_value());
  EXPECT_EQ((*a)->value, std::string("v\0a", 3));
  auto l = st.list("t/", 10);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->size(), 2u);
  auto e1 = st.next_epoch("t/epoch"), e2 = st.next_epoch("t/epoch");
  ASSERT_TRUE(e1.ok() && e2.ok());
  EXPECT_LT(*e1, *e2);
  // A lease nobody renews ends, and its key with it.
  auto lease = st.grant(std::chrono::seconds(2));
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  ASSERT_TRUE(st.put("t/leased", "x", *lease).ok());
  EXPECT_TRUE(st.keepalive(*lease).ok());
  auto until = std::chrono::steady_clock::now() + kEventually;
  bool gone = false;
  while (!gone && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto g = st.get("t/leased");
    gone = g.ok() && !g->has_value();
  }
  EXPECT_TRUE(gone);
  EXPECT_EQ(st.keepalive(*lease).code(), Code::kNotFound);
}

TEST(EtcdStore, UnreachableStoreSaysSoWithinTheDeadline) {
  if (!DMX_TEST_HAVE_HTTPLIB) DMX_SKIP(test::kNotBuilt) << "the etcd store (no cpp-httplib in this build)";
  auto s = store::open_store("etcd://127.0.0.1:" + std::to_string(testing::free_port()), std::chrono::milliseconds(500));
  ASSERT_TRUE(s.ok());
  auto g = (*s)->get("x");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), Code::kUnavailable);
  EXPECT_NE(g.status().message().find("etcd http://127.0.0.1"), std::string::npos) << g.status().message();
}

// A test process that dies without its destructors (a failed assertion's abort, a sanitizer's
// report) takes its etcd with it, and etcd never held the test's output: ctest, which reads that
// output until every holder has closed it, returns at once instead of at its timeout.
TEST(EtcdServer, DiesWithItsTestProcessAndLeavesItsOutputClosed) {
  if (!EtcdServer::available())
    DMX_SKIP(test::kNotInstalled) << EtcdServer::kBinary << " is absent (apt-get install etcd-server)";
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  // Forked with this test's one thread (ctest runs it alone); the child is the "test process".
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(out[0]);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(out[1], STDERR_FILENO);
    auto* etcd = new EtcdServer;  // never destroyed: the process dies as an aborted test does
    if (!etcd->start()) ::_exit(3);
    std::string url = etcd->url() + "\n";
    (void)!::write(out[1], url.data(), url.size());
    ::_exit(0);
  }
  ::close(out[1]);
  std::string said;
  bool closed = false;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(90);  // etcd's start, on a busy machine
  while (!closed && std::chrono::steady_clock::now() < until) {
    pollfd p{out[0], POLLIN, 0};
    if (::poll(&p, 1, 500) <= 0) continue;
    char buf[256];
    ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n > 0) said.append(buf, static_cast<size_t>(n));
    closed = n == 0;
  }
  ::close(out[0]);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "etcd did not start in the child: " << said;
  EXPECT_TRUE(closed) << "the test process's output is still held open after it died (by etcd)";
  ASSERT_EQ(said.rfind("etcd://127.0.0.1:", 0), 0u) << said;
  // And etcd itself is gone, not only its output.
  auto s = store::open_store(said.substr(0, said.find('\n')), std::chrono::milliseconds(500));
  ASSERT_TRUE(s.ok());
  Status answer;
  for (int i = 0; i < 40 && answer.ok(); ++i) {  // SIGKILL is prompt; the bound is for a busy machine
    answer = (*s)->get("dmx-test/ping").status();
    if (answer.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  EXPECT_EQ(answer.code(), Code::kUnavailable) << "etcd outlived the process that started it";
}

TEST(Directory, AnnounceLookupAndNewEpochOnRestart) {
  DMX_NEED_ETCD(etcd);
  uint64_t first = 0;
  {
    auto d = store::Directory::open(options(etcd, "key-1"));
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    auto e = (*d)->announce(store::PeerEntry{.name = "w1", .addresses = {"tcp://10.0.0.1:7000"}});
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    first = *e;
    auto p = (*d)->lookup_peer("w1");
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_EQ(p->epoch, first);
    EXPECT_EQ(p->addresses.front(), "tcp://10.0.0.1:7000");
    EXPECT_NE(p->lease, 0);
  }
  auto d = store::Directory::open(options(etcd, "key-1"));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->lookup_peer("w1").status().code(), Code::kNotFound);  // removed on the way out
  auto e = (*d)->announce(store::PeerEntry{.name = "w1", .addresses = {"tcp://10.0.0.1:7000"}});
  ASSERT_TRUE(e.ok());
  EXPECT_GT(*e, first);
}

TEST(Directory, ForgedAlteredCopiedAndStaleEntriesAreRefused) {
  DMX_NEED_ETCD(etcd);
  auto d = store::Directory::open(options(etcd, "the-job-key"));
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE((*d)->announce(store::PeerEntry{.name = "owner", .addresses = {"tcp://10.0.0.1:7000"}}).ok());
  ASSERT_TRUE((*d)->publish(store::RegionEntry{.name = "kv", .key = 0x1234, .size = 4096, .memory = "host"}).ok());
  ASSERT_TRUE((*d)->lookup_region("kv").ok());
  auto& st = (*d)->store();

  // Forged: signed with another key.
  store::PeerEntry evil{.job = "job1", .name = "evil", .epoch = 5, .addresses = {"tcp://6.6.6.6:1"}};
  ASSERT_TRUE(st.put(store::peer_key("job1", "evil"), store::encode(evil, secret("attacker")), 0).ok());
  auto f = (*d)->lookup_peer("evil");
  EXPECT_EQ(f.status().code(), Code::kAuth);
  EXPECT_NE(f.status().message().find("signature does not match"), std::string::npos) << f.status().message();

  // Altered: the owner's own entry with its address changed.
  auto raw = st.get(store::peer_key("job1", "owner"));
  ASSERT_TRUE(raw.ok() && raw->has_value());
  std::string altered = (*raw)->value;
  auto at = altered.find("10.0.0.1");
  ASSERT_NE(at, std::string::npos);
  altered.replace(at, 8, "10.6.6.6");
  ASSERT_TRUE(st.put(store::peer_key("job1", "mallory"), altered, 0).ok());
  EXPECT_EQ((*d)->lookup_peer("mallory").status().code(), Code::kAuth);

  // Copied: a genuine entry put under another name.
  ASSERT_TRUE(st.put(store::peer_key("job1", "copy"), (*raw)->value, 0).ok());
  auto c = (*d)->lookup_peer("copy");
  EXPECT_EQ(c.status().code(), Code::kAuth);
  EXPECT_NE(c.status().message().find("copied under another name"), std::string::npos) << c.status().message();

  // Stale: a validly signed region of an epoch its owner no longer has.
  store::RegionEntry old{.job = "job1", .name = "old", .owner = "owner", .owner_epoch = (*d)->epoch() - 1,
                         .key = 99, .size = 1, .memory = "host"};
  ASSERT_TRUE(st.put(store::region_key("job1", "old"), store::encode(old, secret("the-job-key")), 0).ok());
  auto s = (*d)->lookup_region("old");
  EXPECT_EQ(s.status().code(), Code::kPeerFailed);
  EXPECT_NE(s.status().message().find("stale"), std::string::npos) << s.status().message();

  // The listing shows the good ones and says why the others were refused.
  auto l = (*d)->list();
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->peers.size(), 1u);
  EXPECT_EQ(l->refused.size(), 3u);
}

TEST(Directory, ReRegistersWhenTheStoreComesBackWithoutItsData) {
  DMX_NEED_ETCD(etcd);
  auto d = store::Directory::open(options(etcd, "k", std::chrono::seconds(2)));
  ASSERT_TRUE(d.ok());
  auto e = (*d)->announce(store::PeerEntry{.name = "w", .addresses = {"tcp://10.0.0.1:7000"}});
  ASSERT_TRUE(e.ok());
  // The store loses its data (its leases and our entry with them): the keep-alive finds the lease
  // gone and registers again, same epoch.
  auto until = std::chrono::steady_clock::now() + kEventually;
  etcd.stop();
  etcd.wipe();
  ASSERT_TRUE(etcd.start());
  bool back = false;
  while (!back && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto p = (*d)->lookup_peer("w");
    back = p.ok() && p->epoch == *e;
  }
  EXPECT_TRUE(back);
}

}  // namespace
}  // namespace dmx
