// Admission to the Lynx dispatcher and the host-centric baseline (docs/reliability.md, "Lynx
// servers"): connection threads reaped, idle connections closed so new clients get in, a cap per
// address, refusals that say why, log lines rate-limited, accepting paused when out of fds.
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>

#include "mqueue/admission.h"
#include "mqueue/request_header.h"
#include "mqueue_test_util.h"
#include "proc_threads.h"

namespace dmx::mqueue {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::Events;
using testing::frame;

// Counts event lines, thread-safe.
struct LineCounter {
  std::atomic<uint64_t> n{0};
  std::function<void(const std::string&)> sink() {
    return [this](const std::string&) { n.fetch_add(1); };
  }
};

int maps_lines() {
  std::ifstream f("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(f, line);) ++n;
  return n;
}

int port_of(const std::string& address) {
  return std::stoi(address.substr(address.rfind(':') + 1));
}

// A blocking TCP connection from `from` (an address of 127/8) to 127.0.0.1:port, with 10 s I/O timeouts.
Fd connect_from(const char* from, int port) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return fd;
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, from, &local.sin_addr);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) return Fd();
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) return Fd();
  (void)set_io_timeout(fd.get(), 10s);
  return fd;
}

// One request of random bytes on `fd`; true when the XOR answer came back.
bool one_request(int fd, std::mt19937& rng) {
  std::vector<uint8_t> req(1 + rng() % 200);
  for (auto& b : req) b = static_cast<uint8_t>(rng());
  auto f = frame(kRequestMagic, static_cast<uint32_t>(req.size()), rng(), req);
  if (!write_all(fd, f.data(), f.size(), "test").ok()) return false;
  WireHeader h{};
  if (!read_all(fd, &h, sizeof h, "test").ok() || h.magic != kResponseMagic || h.len != req.size()) return false;
  std::vector<uint8_t> resp(h.len);
  if (!read_all(fd, resp.data(), resp.size(), "test").ok()) return false;
  for (size_t i = 0; i < req.size(); ++i)
    if (resp[i] != (req[i] ^ kXorKey)) return false;
  return true;
}

// What a refused client reads: the error frame's text, or "" when the server just closed.
std::string refusal_text(int fd) {
  WireHeader h{};
  if (!read_all(fd, &h, sizeof h, "test").ok() || h.magic != kErrorMagic || h.len > 4096) return "";
  std::string text(h.len, '\0');
  if (!read_all(fd, text.data(), text.size(), "test").ok()) return "";
  return text;
}

// A new client from `from` that retries (a refusal is an answer) until served or 15 s passed;
// returns the milliseconds it took, -1 if never served.
long long served_within(const char* from, int port, std::mt19937& rng) {
  auto t0 = Clock::now();
  while (Clock::now() - t0 < 120s) {  // generous: a loaded machine stalls, a locked-out client never gets in
    Fd c = connect_from(from, port);
    if (c.valid() && one_request(c.get(), rng))
      return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    std::this_thread::sleep_for(50ms);
  }
  return -1;
}

BaselineConfig baseline_config(Events& ev) {
  BaselineConfig c;
  c.tcp = "127.0.0.1:0";
  c.memory = MemSpec{MemKind::kHost, 0};
  c.max_request = 1024;
  c.on_event = ev.sink();
  return c;
}

// Connect-and-close in a loop, no request: every connection thread is joined, not left for stop().
// Before, each finished thread kept its stack mapped until stop (the server aborted after 36,350).
TEST(LynxAdmission, BaselineJoinsFinishedConnectionThreads) {
  Events ev;
  BaselineConfig cfg = baseline_config(ev);
  cfg.max_per_address = cfg.max_connections;  // all from 127.0.0.1; none refused
  auto s = HostCentricServer::start(cfg);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  auto addr = resolve((*s)->tcp_address());
  ASSERT_TRUE(addr.ok());
  const int threads0 = process_threads(), maps0 = maps_lines();
  constexpr int kConnections = 1500;
  for (int i = 0; i < kConnections; ++i) {
    auto c = tcp_connect(*addr, 10s);
    ASSERT_TRUE(c.ok()) << i << ": " << c.status().to_string();
    if (i % 16 == 15) {  // now and then wait for the server to catch up: at most 16 at once
      ASSERT_TRUE(testing::eventually(
          [&] {
            BaselineStats st = (*s)->stats();
            return st.accepted == static_cast<uint64_t>(i + 1) && st.connections <= 16;
          },
          20s));
    }
  }
  // Every connection ended; the accept thread joins within a poll step of each ending. A few
  // mappings may stay (malloc arenas of the threads, at most 8 per core); an unjoined thread
  // keeps two (its stack and guard page): 3,000 here.
  // A thread counts in /proc until it has exited, a little after its connection is counted closed:
  // wait for both (a loaded machine was seen at 10 threads just after the count reached 0).
  bool settled = testing::eventually(
      [&] {
        return (*s)->stats().connections == 0 && maps_lines() < maps0 + 300 && process_threads() <= threads0 + 2;
      },
      20s);
  const int threads1 = process_threads(), maps1 = maps_lines();
  std::printf("after %d connect-and-close: threads %d -> %d, mappings %d -> %d\n", kConnections, threads0, threads1,
              maps0, maps1);
  EXPECT_TRUE(settled) << "mappings grew from " << maps0 << " to " << maps1 << " (unjoined thread stacks)";
  EXPECT_LE(threads1, threads0 + 2);
  EXPECT_EQ((*s)->stats().refused_clients, 0u) << ev.all();
}

// Idle connections at max_connections: a new client is served once idle_timeout closes them.
TEST(LynxAdmission, DispatcherIdleConnectionsDoNotLockOut) {
  Events ev;
  ServerConfig cfg = testing::host_config(ev, 1, 8, 1024);
  cfg.dispatch.max_connections = 6;
  cfg.dispatch.idle_timeout = 1000ms;
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  Dispatcher& d = (*server)->dispatcher();
  const int port = port_of(d.tcp_address());
  std::mt19937 rng(std::random_device{}());
  std::vector<Fd> idle;
  for (int i = 0; i < 6; ++i) idle.push_back(connect_from("127.0.0.3", port));
  long long took = served_within("127.0.0.4", port, rng);
  std::printf("a new client was served %lld ms after idle connections filled the cap (idle_timeout 1000 ms)\n", took);
  EXPECT_GE(took, 0) << "never served: idle connections locked it out\n" << ev.all();
  for (Fd& c : idle) {  // each closed by the server
    char b;
    EXPECT_EQ(::recv(c.get(), &b, 1, 0), 0);
  }
  EXPECT_GE(d.stats().idle_closed, 6u);
  EXPECT_TRUE(ev.any_contains("sent nothing for 1000 ms (idle_timeout)")) << ev.all();
}

// A client whose request is in flight is not idle, however long the worker takes.
TEST(LynxAdmission, DispatcherKeepsAClientWaitingForItsAnswer) {
  Events ev;
  ServerConfig cfg = testing::host_config(ev, 1, 8, 1024);
  cfg.dispatch.idle_timeout = 300ms;
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  Dispatcher& d = (*server)->dispatcher();
  std::mt19937 rng(std::random_device{}());
  (*server)->cpu_workers()->set_paused(true);
  Fd busy = connect_from("127.0.0.2", port_of(d.tcp_address()));
  ASSERT_TRUE(busy.valid());
  std::vector<uint8_t> req(64);
  for (auto& b : req) b = static_cast<uint8_t>(rng());
  auto f = frame(kRequestMagic, 64, 7, req);
  ASSERT_TRUE(write_all(busy.get(), f.data(), f.size(), "test").ok());
  ASSERT_TRUE(testing::eventually([&] { return d.stats().requests == 1; }));
  std::this_thread::sleep_for(1200ms);  // four idle_timeouts with the answer pending
  (*server)->cpu_workers()->set_paused(false);
  WireHeader h{};
  ASSERT_TRUE(read_all(busy.get(), &h, sizeof h, "busy").ok()) << "closed while its request was in flight\n"
                                                               << ev.all();
  EXPECT_EQ(h.magic, kResponseMagic);
  EXPECT_EQ(h.tag, 7u);
  EXPECT_EQ(d.stats().idle_closed, 0u);
}

// One address cannot take every slot: beyond max_per_address it is refused (and told so); another
// address still gets in; beyond max_connections everyone is refused, and told so.
TEST(LynxAdmission, DispatcherCapsConnectionsPerAddress) {
  Events ev;
  ServerConfig cfg = testing::host_config(ev, 1, 8, 1024);
  cfg.dispatch.max_connections = 6;
  cfg.dispatch.max_per_address = 4;
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  Dispatcher& d = (*server)->dispatcher();
  const int port = port_of(d.tcp_address());
  std::vector<Fd> held;
  for (int i = 0; i < 4; ++i) held.push_back(connect_from("127.0.0.5", port));
  Fd fifth = connect_from("127.0.0.5", port);
  ASSERT_TRUE(fifth.valid());
  std::string why = refusal_text(fifth.get());
  EXPECT_NE(why.find("4 connections from 127.0.0.5 already (max_per_address)"), std::string::npos)
      << "got '" << why << "'";
  std::mt19937 rng(std::random_device{}());
  for (const char* from : {"127.0.0.6", "127.0.0.7"}) {
    held.push_back(connect_from(from, port));
    EXPECT_TRUE(held.back().valid() && one_request(held.back().get(), rng)) << from << "\n" << ev.all();
  }
  Fd seventh = connect_from("127.0.0.8", port);
  ASSERT_TRUE(seventh.valid());
  why = refusal_text(seventh.get());
  EXPECT_NE(why.find("6 connections already (max_connections)"), std::string::npos) << "got '" << why << "'";
  for (Fd& c : held) EXPECT_TRUE(one_request(c.get(), rng));  // the first six are served
  EXPECT_EQ(d.stats().refused_clients, 2u);
  EXPECT_TRUE(ev.any_contains("refused tcp client 127.0.0.8", "max_connections")) << ev.all();
}

// Many bad clients in a burst: each is dropped and counted, but the log gets a bounded number of lines.
TEST(LynxAdmission, DispatcherDropLinesAreRateLimited) {
  LineCounter lines;
  Events unused;
  ServerConfig cfg = testing::host_config(unused, 1, 8, 1024);
  cfg.dispatch.on_event = lines.sink();
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok());
  Dispatcher& d = (*server)->dispatcher();
  auto addr = resolve(d.tcp_address());
  constexpr int kBad = 300;
  std::mt19937 rng(std::random_device{}());
  auto t0 = Clock::now();
  for (int i = 0; i < kBad; ++i) {
    auto c = tcp_connect(*addr, 10s);
    ASSERT_TRUE(c.ok());
    auto f = frame(static_cast<uint32_t>(rng()) | 1u, 4, 1, {1, 2, 3, 4});  // never "LYNX" (even)
    ASSERT_TRUE(write_all(c->get(), f.data(), f.size(), "bad").ok());
    char b;
    (void)::recv(c->get(), &b, 1, 0);  // until the server closes it
  }
  ASSERT_TRUE(testing::eventually([&] { return d.stats().dropped_clients == kBad; }));
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("%d bad clients in %.2f s: %llu log lines\n", kBad, seconds,
              static_cast<unsigned long long>(lines.n.load()));
  EXPECT_LE(lines.n.load(), static_cast<uint64_t>(EventLimiter::kLinesPerKind * (seconds + 2)));
}

// The baseline: idle connections at its cap are closed at idle_timeout, so a new client gets in;
// a client that drips a request is dropped at request_timeout, not kept alive byte by byte.
TEST(LynxAdmission, BaselineIdleAndDrippingClientsAreClosed) {
  Events ev;
  BaselineConfig cfg = baseline_config(ev);
  cfg.max_connections = 4;
  // Long enough that the cap is still full when the refused client arrives on a loaded machine.
  // idle_timeout before request_timeout: the idle ones make room first, then the dripper is dropped.
  cfg.idle_timeout = 6000ms;
  cfg.request_timeout = 8000ms;
  auto s = HostCentricServer::start(cfg);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const int port = port_of((*s)->tcp_address());
  std::vector<Fd> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(connect_from("127.0.0.7", port));
  Fd drip = connect_from("127.0.0.8", port);
  std::atomic<bool> stop_drip{false};
  std::thread dripper([&] {  // a byte of the header every 600 ms: never idle, never whole in time
    auto f = frame(kRequestMagic, 8, 1, {});
    for (size_t i = 0; i < f.size() && !stop_drip.load(); ++i) {
      if (::send(drip.get(), &f[i], 1, MSG_NOSIGNAL) != 1) return;
      for (int k = 0; k < 6 && !stop_drip.load(); ++k) std::this_thread::sleep_for(100ms);
    }
  });
  ASSERT_TRUE(testing::eventually([&] { return (*s)->stats().connections == 4; }));
  Fd refused = connect_from("127.0.0.9", port);
  ASSERT_TRUE(refused.valid());
  std::string why = refusal_text(refused.get());
  EXPECT_NE(why.find("4 connections already (max_connections)"), std::string::npos) << "got '" << why << "'";
  std::mt19937 rng(std::random_device{}());
  long long took = served_within("127.0.0.9", port, rng);
  EXPECT_GE(took, 0) << "never served: idle connections locked it out\n" << ev.all();
  EXPECT_TRUE(testing::eventually([&] { return ev.any_contains("request not whole in time"); })) << ev.all();
  stop_drip.store(true);
  dripper.join();
  EXPECT_GE((*s)->stats().idle_closed, 3u);
  Fd a = connect_from("127.0.0.10", port);  // per address: 4 of 4 allowed by default 16
  EXPECT_TRUE(a.valid() && one_request(a.get(), rng));
}

// A server process out of fds, flooded with connections: accepting rests instead of spinning, the
// log gets a line or two, not one per attempt. The server runs in a child with a low RLIMIT_NOFILE.
// Returns {log lines, CPU seconds, accept pauses} of the child during 2 s of flood.
struct FloodResult {
  uint64_t lines = 0;
  double cpu = 0;
  uint64_t pauses = 0;
  int status = -1;
};

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

bool read_pipe(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    pollfd q{fd, POLLIN, 0};
    if (::poll(&q, 1, 20000) != 1) return false;
    ssize_t k = ::read(fd, b, n);
    if (k <= 0) return false;
    b += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

template <typename StartServer>
FloodResult flood_out_of_fds(StartServer start) {
  FloodResult r;
  int to_child[2], to_parent[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(to_parent, O_CLOEXEC) != 0) return r;
  pid_t pid = ::fork();
  if (pid < 0) return r;
  if (pid == 0) {
    ::close(to_child[1]);
    ::close(to_parent[0]);
    LineCounter lines;
    std::function<uint64_t()> pauses;
    std::string address;
    auto keep = start(lines.sink(), &address, &pauses);  // the server, kept alive to the end
    if (address.empty()) ::_exit(2);
    int port = port_of(address);
    rlim_t open_now = static_cast<rlim_t>(
        std::distance(std::filesystem::directory_iterator("/proc/self/fd"), std::filesystem::directory_iterator{}));
    rlimit lim{open_now + 8, open_now + 8};
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) ::_exit(3);
    double cpu0 = cpu_seconds();
    if (::write(to_parent[1], &port, sizeof port) != sizeof port) ::_exit(4);
    char go;
    if (!read_pipe(to_child[0], &go, 1)) ::_exit(5);  // the parent flooded us for 2 s
    double cpu = cpu_seconds() - cpu0;
    uint64_t n = lines.n.load(), p = pauses();
    if (::write(to_parent[1], &n, sizeof n) != sizeof n || ::write(to_parent[1], &cpu, sizeof cpu) != sizeof cpu ||
        ::write(to_parent[1], &p, sizeof p) != sizeof p)
      ::_exit(6);
    if (!read_pipe(to_child[0], &go, 1)) ::_exit(7);
    keep.reset();
    ::_exit(0);
  }
  ::close(to_child[0]);
  ::close(to_parent[1]);
  Fd tc(to_child[1]), tp(to_parent[0]);
  int port = 0;
  if (read_pipe(tp.get(), &port, sizeof port)) {
    std::vector<Fd> flood;
    for (int i = 0; i < 100; ++i) {
      Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_port = htons(static_cast<uint16_t>(port));
      to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      (void)::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to);
      flood.push_back(std::move(fd));
    }
    std::this_thread::sleep_for(2s);
    char go = 1;
    if (::write(tc.get(), &go, 1) == 1) {
      (void)read_pipe(tp.get(), &r.lines, sizeof r.lines);
      (void)read_pipe(tp.get(), &r.cpu, sizeof r.cpu);
      (void)read_pipe(tp.get(), &r.pauses, sizeof r.pauses);
    }
    if (::write(tc.get(), &go, 1) != 1) {
    }  // the child may be gone already
  }
  tc.reset();
  ::waitpid(pid, &r.status, 0);
  return r;
}

TEST(LynxAdmission, DispatcherOutOfFdsNeitherSpinsNorFloodsTheLog) {
  FloodResult r = flood_out_of_fds(
      [](std::function<void(const std::string&)> sink, std::string* address, std::function<uint64_t()>* pauses) {
        Events unused;
        ServerConfig cfg = testing::host_config(unused, 1, 8, 1024);
        cfg.dispatch.udp = "";
        cfg.dispatch.on_event = std::move(sink);
        auto s = Server::start(cfg);
        std::shared_ptr<Server> server = s.ok() ? std::shared_ptr<Server>(std::move(*s)) : nullptr;
        if (server) {
          *address = server->dispatcher().tcp_address();
          *pauses = [server] { return server->dispatcher().stats().accept_pauses; };
        }
        return server;
      });
  std::printf("dispatcher out of fds for 2 s: %llu log lines, %.3f CPU s, %llu accept pauses\n",
              static_cast<unsigned long long>(r.lines), r.cpu, static_cast<unsigned long long>(r.pauses));
  ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << "child status " << r.status;
  EXPECT_GE(r.pauses, 1u);
  EXPECT_LE(r.lines, 3u) << "the dispatcher logged every failed accept";
  EXPECT_LT(r.cpu, 1.0) << "the dispatcher spun on accept";
}

TEST(LynxAdmission, BaselineOutOfFdsNeitherSpinsNorFloodsTheLog) {
  FloodResult r = flood_out_of_fds([](std::function<void(const std::string&)> sink, std::string* address,
                                      std::function<uint64_t()>* pauses) {
    BaselineConfig cfg;
    cfg.tcp = "127.0.0.1:0";
    cfg.memory = MemSpec{MemKind::kHost, 0};
    cfg.on_event = std::move(sink);
    auto s = HostCentricServer::start(cfg);
    std::shared_ptr<HostCentricServer> server = s.ok() ? std::shared_ptr<HostCentricServer>(std::move(*s)) : nullptr;
    if (server) {
      *address = server->tcp_address();
      *pauses = [server] { return server->stats().accept_pauses; };
    }
    return server;
  });
  std::printf("baseline out of fds for 2 s: %llu log lines, %.3f CPU s, %llu accept pauses\n",
              static_cast<unsigned long long>(r.lines), r.cpu, static_cast<unsigned long long>(r.pauses));
  ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << "child status " << r.status;
  EXPECT_GE(r.pauses, 1u);
  EXPECT_LE(r.lines, 3u) << "the baseline logged every failed accept";
  EXPECT_LT(r.cpu, 1.0) << "the baseline spun on accept";
}

// The header check: lying lengths are refused, with no wrap at the 32-bit edge.
TEST(LynxAdmission, RequestHeaderCheck) {
  auto bytes = [](uint32_t magic, uint32_t len) {
    std::vector<uint8_t> b(sizeof(WireHeader));
    WireHeader h{magic, len, 0x1122334455667788ull};
    std::memcpy(b.data(), &h, sizeof h);
    return b;
  };
  auto ok = bytes(kRequestMagic, 100);
  EXPECT_TRUE(check_request_header(ok.data(), ok.size(), 100).ok());
  EXPECT_EQ(check_request_header(ok.data(), ok.size(), 99).verdict, HeaderVerdict::kOverLimit);
  EXPECT_EQ(check_request_header(ok.data(), 15, 4096).verdict, HeaderVerdict::kShort);
  auto bad = bytes(0x4c594e58, 1);
  EXPECT_EQ(check_request_header(bad.data(), bad.size(), 4096).verdict, HeaderVerdict::kBadMagic);
  auto wrap = bytes(kRequestMagic, 0xffffffffu);
  EXPECT_EQ(check_request_header(wrap.data(), wrap.size(), 0xffffffffu, Framing{true, 15, false}).verdict,
            HeaderVerdict::kShort);
  EXPECT_EQ(check_request_header(wrap.data(), wrap.size(), 0xffffffffu, Framing{true, 16, false}).verdict,
            HeaderVerdict::kLengthMismatch);
  EXPECT_TRUE(
      check_request_header(wrap.data(), wrap.size(), 0xffffffffu, Framing{true, 16ull + 0xffffffffu, false}).ok());
  EXPECT_EQ(check_request_header(ok.data(), ok.size(), 4096, Framing{true, 116, true}).verdict,
            HeaderVerdict::kOverLimit);
  EXPECT_TRUE(check_request_header(ok.data(), ok.size(), 4096, Framing{true, 116, false}).ok());
  auto c = check_request_header(ok.data(), ok.size(), 4096);
  EXPECT_EQ(c.header.tag, 0x1122334455667788ull);
}

}  // namespace
}  // namespace dmx::mqueue
