// Floods of the listener before authentication: thousands of idle connections, and the process
// out of file descriptors. A good client must still get in quickly, and the listener must neither
// spin nor flood the log.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "engine/auth.h"
#include "engine/context_impl.h"
#include "engine/handshake.h"
#include "engine/transport_setup.h"
#include "hostile/hostile_util.h"
#include "stream/socket.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;

long long ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

void raise_fd_limit(rlim_t want) {
  rlimit r{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &r), 0);
  if (r.rlim_cur >= want) return;
  r.rlim_cur = std::min<rlim_t>(want, r.rlim_max == RLIM_INFINITY ? want : std::max(r.rlim_max, want));
  if (r.rlim_max != RLIM_INFINITY && r.rlim_max < r.rlim_cur) r.rlim_max = r.rlim_cur;  // root may raise it
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &r), 0) << "cannot raise RLIMIT_NOFILE to " << want;
}

// An idle connection from `from` (an address of 127/8) to the listener at 127.0.0.1:`port`.
UniqueFd idle_connection(const char* from, int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return fd;
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, from, &local.sin_addr);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) return UniqueFd();
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to);
  if (rc != 0 && errno != EINPROGRESS) return UniqueFd();
  return fd;
}

int port_of(const std::string& address) { return std::stoi(address.substr(address.rfind(':') + 1)); }

// 2,000 connections that never speak, from 40 addresses (50 each, under the per-address cap):
// more than max_pending_handshakes, so the listener must evict rather than refuse newcomers.
TEST(ListenerFlood, IdleFloodDoesNotLockOutAGoodClient) {
  raise_fd_limit(8192);
  Server s = make_server();
  int port = port_of(s.listener.address());
  uint64_t rss0 = rss_kib();
  std::vector<UniqueFd> flood;
  for (int i = 0; i < 2000; ++i) {
    std::string from = fmt::format("127.0.0.{}", 2 + i / 50);
    UniqueFd fd = idle_connection(from.c_str(), port);
    ASSERT_TRUE(fd.valid()) << "connection " << i << " from " << from << ": " << std::strerror(errno);
    flood.push_back(std::move(fd));
  }
  // Every connection established (a full accept queue drops SYNs; they come back 1-3 s later),
  // then time for the listener to take them all in.
  for (auto until = Clock::now() + 20s; Clock::now() < until;) {
    size_t open = 0;
    for (auto& fd : flood) {
      pollfd p{fd.get(), POLLOUT, 0};
      if (::poll(&p, 1, 0) == 1 && (p.revents & POLLOUT)) ++open;
    }
    if (open == flood.size()) break;
    std::this_thread::sleep_for(100ms);
  }
  std::this_thread::sleep_for(500ms);
  uint64_t rss_flood = rss_kib();

  auto t0 = Clock::now();
  expect_serves_a_good_client(s);
  long long took = ms_since(t0);
  EXPECT_LT(took, 2000) << "a good client waited behind the idle flood";
  std::printf("good client served in %lld ms during 2000 idle connections; RSS %llu -> %llu KiB\n", took,
              static_cast<unsigned long long>(rss0), static_cast<unsigned long long>(rss_flood));
  if (!kSanitized) {
    EXPECT_LT(rss_flood - std::min(rss_flood, rss0), 64u << 10);
  }
}

// Reads exactly n bytes from a pipe, within 20 s.
bool read_pipe(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  auto end = Clock::now() + 20s;
  while (n > 0 && Clock::now() < end) {
    ssize_t k = ::read(fd, b, n);
    if (k <= 0) return false;
    b += k;
    n -= static_cast<size_t>(k);
  }
  return n == 0;
}

// A server process out of fds: connections beyond its limit queue in the kernel. The listener must
// rest rather than spin on accept (EMFILE) and log a line per second, not per attempt; and serve
// again once fds free up.
TEST(ListenerFlood, OutOfFdsNeitherSpinsNorFloodsTheLog) {
  raise_fd_limit(4096);
  int to_child[2], to_parent[2];
  ASSERT_EQ(::pipe2(to_child, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(to_parent, O_CLOEXEC), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: a server with few fds to spare and a long handshake_timeout, so held connections stay.
    ::close(to_child[1]);
    ::close(to_parent[0]);
    LogCounter logs;  // before the server: its threads must not log while the sink list changes
    Options o = test_options();
    o.set("handshake_timeout", "30s").set("log_level", "info");
    Server s = make_server(o);
    int port = port_of(s.listener.address());
    // Room for a few dozen more: the flood fills it, a good client's endpoint fits once it is gone.
    rlim_t open_now = static_cast<rlim_t>(std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                                                        std::filesystem::directory_iterator{}));
    rlimit r{open_now + 48, 4096};
    ::setrlimit(RLIMIT_NOFILE, &r);
    std::thread server([&] {  // accepts endpoints, so a good client completes
      for (int i = 0; i < 2; ++i) (void)s.listener.accept(20s);
    });
    rusage u0{};
    ::getrusage(RUSAGE_SELF, &u0);
    (void)!::write(to_parent[1], &port, sizeof port);
    char go;
    if (!read_pipe(to_child[0], &go, 1)) ::_exit(2);  // the parent flooded us for 3 s
    rusage u1{};
    ::getrusage(RUSAGE_SELF, &u1);
    double cpu = (u1.ru_utime.tv_sec - u0.ru_utime.tv_sec) + (u1.ru_stime.tv_sec - u0.ru_stime.tv_sec) +
                 1e-6 * ((u1.ru_utime.tv_usec - u0.ru_utime.tv_usec) + (u1.ru_stime.tv_usec - u0.ru_stime.tv_usec));
    uint64_t lines = logs.lines();
    (void)!::write(to_parent[1], &cpu, sizeof cpu);
    (void)!::write(to_parent[1], &lines, sizeof lines);
    if (!read_pipe(to_child[0], &go, 1)) ::_exit(3);  // the parent is done
    s.listener.close();
    server.join();
    ::_exit(0);
  }
  ::close(to_child[0]);
  ::close(to_parent[1]);
  UniqueFd tc(to_child[1]), tp(to_parent[0]);
  int port = 0;
  ASSERT_TRUE(read_pipe(tp.get(), &port, sizeof port));
  std::vector<UniqueFd> flood;
  for (int i = 0; i < 200; ++i) flood.push_back(idle_connection("127.0.0.5", port));
  std::this_thread::sleep_for(3s);
  char go = 1;
  ASSERT_EQ(::write(tc.get(), &go, 1), 1);
  double cpu = 0;
  uint64_t lines = 0;
  ASSERT_TRUE(read_pipe(tp.get(), &cpu, sizeof cpu));
  ASSERT_TRUE(read_pipe(tp.get(), &lines, sizeof lines));
  flood.clear();  // fds free up in the child as it sees these close

  Options o = test_options();
  o.set("connect_timeout", "10s");
  Context client = *Context::create(o);
  auto t0 = Clock::now();
  auto c = client.connect(fmt::format("tcp://127.0.0.1:{}", port));
  long long took = ms_since(t0);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  std::printf("out of fds for 3 s: %llu log lines, %.3f CPU s; a client connected %lld ms after fds freed\n",
              static_cast<unsigned long long>(lines), cpu, took);
  EXPECT_LT(lines, 30u) << "the listener logged every failed accept";
  EXPECT_LT(cpu, 0.5) << "the listener spun on accept";
  EXPECT_LT(took, 5000);
  ASSERT_EQ(::write(tc.get(), &go, 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}


// An authenticated peer on this host that offers same-host paths (shm, control pipe) and never sets
// up its side: the server waits for it up to handshake_timeout, but not on the listener's thread.
TEST(ListenerFlood, PeerThatNeverSetsUpShmDelaysNobody) {
  Options so = test_options(1);
  so.set("handshake_timeout", "4s");
  Server s = make_server(so);
  Context mine_ctx = *Context::create(test_options(1));
  const ContextImpl& me = *mine_ctx.impl();
  wire::Hello mine = make_hello(me, wire::Role::kClient);
  std::optional<UnixListener> side;  // listens; nobody ever accepts on it
  std::string why_not;
  offer_transports(me, &mine, &side, &why_not);
  ASSERT_TRUE(mine.offer("shm") || mine.offer("shm_pipe")) << why_not;
  auto addr = stream::parse_address(s.listener.address());
  Deadline d = Deadline::after(5s);
  auto fd = stream::connect_to(*addr, d);
  ASSERT_TRUE(fd.ok()) << fd.status().to_string();
  ASSERT_TRUE(send_frame(fd->get(), wire::FrameType::kHello, wire::encode_hello(mine), d, "s").ok());
  auto hello = recv_frame(fd->get(), d, "s");
  ASSERT_TRUE(hello.ok() && hello->header.type == wire::FrameType::kHello) << hello.status().to_string();
  auto theirs = wire::decode_hello(hello->payload.data(), hello->payload.size());
  ASSERT_TRUE(theirs.ok());
  ASSERT_TRUE(theirs->offer("shm") || theirs->offer("shm_pipe")) << "the server agreed no same-host path";
  wire::Proof proof = make_proof(me.auth(), kClientLabel, mine.nonce, theirs->nonce, theirs->session);
  ASSERT_TRUE(send_frame(fd->get(), wire::FrameType::kAuth, {proof.begin(), proof.end()}, d, "s").ok());
  auto welcome = recv_frame(fd->get(), d, "s");
  ASSERT_TRUE(welcome.ok() && welcome->header.type == wire::FrameType::kWelcome) << welcome.status().to_string();
  // The server now waits for our side channels, which never come.
  std::this_thread::sleep_for(100ms);
  auto t0 = Clock::now();
  expect_serves_a_good_client(s);
  long long took = ms_since(t0);
  std::printf("good client served in %lld ms while a peer's shm set-up hangs\n", took);
  EXPECT_LT(took, 2000) << "the listener waited for the stalled shm set-up";
}

}  // namespace
}  // namespace dmx::test
