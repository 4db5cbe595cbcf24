// Connect under a lossy or late network: one handshake bound (handshake_timeout) on both sides, and
// transient failures retried with backoff within connect_timeout; the peer's refusal is not retried,
// nor a refused connection (nobody listens) unless connect_retry_refused asks, and then not silently.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <thread>

#include "hostile/hostile_util.h"
#include "hostile/log_lines.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;

long long ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

// A free loopback port: bound, then released (nobody listens on it until the test says so).
int free_port() {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  EXPECT_EQ(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  return ntohs(a.sin_port);
}

// Nobody listens: the kernel says so at once, and so does connect(), naming the address.
TEST(ConnectRetry, RefusedConnectionFailsAtOnceNamingTheAddress) {
  int port = free_port();
  std::string address = fmt::format("tcp://127.0.0.1:{}", port);
  Context client = *Context::create(test_options());  // connect_timeout: the default, 10 s
  auto t0 = Clock::now();
  auto c = client.connect(address);
  long long took = ms_since(t0);
  ASSERT_FALSE(c.ok());
  EXPECT_LT(took, 2000) << "a refused connection was waited on: " << c.status().to_string();
  EXPECT_NE(c.status().message().find("connection refused by " + address + ": nobody listens there"), std::string::npos)
      << c.status().to_string();
  EXPECT_NE(c.status().message().find("connect_retry_refused"), std::string::npos)
      << "the message says how to wait for a listener instead: " << c.status().to_string();
  std::printf("refused in %lld ms: %s\n", took, c.status().to_string().c_str());
}

// Asked to wait for a listener that is starting, connect() retries a refusal, and says so once.
TEST(ConnectRetry, ListenerThatAppearsLateIsReached) {
  LogLines log;
  int port = free_port();
  std::string address = fmt::format("tcp://127.0.0.1:{}", port);
  Context server = *Context::create(test_options());
  Listener listener;
  std::thread late([&] {
    std::this_thread::sleep_for(1s);
    auto l = server.listen(address);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    listener = std::move(*l);
  });
  Options o = test_options();
  o.set("connect_timeout", "5s").set("connect_retry_refused", "true");
  Context client = *Context::create(o);
  auto t0 = Clock::now();
  auto c = client.connect(address);  // refused until the listener is up
  long long took = ms_since(t0);
  late.join();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_GE(took, 900);
  EXPECT_LT(took, 3000) << "the backoff is at most 1 s";
  auto e = listener.accept(5s);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  auto said = log.with(fmt::format("retrying connect to 127.0.0.1:{} (refused", port));
  EXPECT_EQ(said.size(), 1u) << "one warning says that connect() waits, not one per attempt";
  std::printf("connected %lld ms after a listener that appeared after 1 s\n", took);
}

TEST(ConnectRetry, WrongKeyFailsAtOnce) {
  Server s = make_server();
  Options o = test_options();
  o.set("auth_key", "another-key-entirely-0123").set("connect_timeout", "10s");
  Context client = *Context::create(o);
  auto t0 = Clock::now();
  auto c = client.connect(s.listener.address());
  long long took = ms_since(t0);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kAuth) << c.status().to_string();
  EXPECT_LT(took, 1000) << "an authentication failure must not be retried: " << c.status().to_string();
}

// A server that accepts and never answers: each attempt ends at handshake_timeout, and attempts
// repeat until connect_timeout — the client applies the same handshake bound as a listener.
TEST(ConnectRetry, SilentServerCostsOneHandshakeTimeoutPerAttempt) {
  UniqueFd lfd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(lfd.get(), 64), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(lfd.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  std::atomic<bool> stop{false};
  std::atomic<int> accepted{0};
  std::thread silent([&] {
    std::vector<UniqueFd> held;
    while (!stop.load()) {
      pollfd p{lfd.get(), POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      int fd = ::accept4(lfd.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      held.emplace_back(fd);
      ++accepted;
    }
  });
  Options o = test_options();
  o.set("handshake_timeout", "400ms").set("connect_timeout", "2s");
  Context client = *Context::create(o);
  auto t0 = Clock::now();
  auto c = client.connect(fmt::format("tcp://127.0.0.1:{}", ntohs(a.sin_port)));
  long long took = ms_since(t0);
  stop = true;
  silent.join();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kTimeout) << c.status().to_string();
  EXPECT_GE(took, 1800) << c.status().to_string();
  EXPECT_LT(took, 3000) << c.status().to_string();
  EXPECT_GE(accepted.load(), 3) << "each attempt ends at handshake_timeout and is retried";
  std::printf("silent server: %d attempts in %lld ms: %s\n", accepted.load(), took, c.status().to_string().c_str());
}

}  // namespace
}  // namespace dmx::test
