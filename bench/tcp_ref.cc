// Kernel TCP over loopback moving the bytes of a dmx bench run: N connections, each a sender and
// a receiver thread with blocking sockets, cycling through their share of WINDOW x SIZE bytes of
// source and destination memory (what `dmx bench` keeps in flight). iperf3 reads and writes one
// 128 KiB buffer that stays in cache; `hot` does the same here, so the two references differ only
// in the memory the copies touch. `hot-src` and `hot-dst` keep only one side in cache (which
// side's memory costs what); `bounce` receives into a 256 KiB buffer per connection and copies
// from there into the destination with non-temporal stores (no read for ownership of its lines);
// `bounce-src` copies the source, 256 KiB at a time, into a buffer that stays in cache and sends
// from there; `bounce-both` does both.
//
//   tcp_ref STREAMS SIZE WINDOW SECONDS [cold|hot|hot-src|hot-dst|bounce|bounce-src|bounce-both]
//
// Prints one line: streams, bytes per stream buffer, GB/s (decimal) received.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/stream_copy.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(2);
}

std::vector<char> random_bytes(size_t n, unsigned seed) {
  std::vector<char> v(n);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t x = rng();
    std::memcpy(&v[i], &x, 8);
  }
  return v;
}

// Sends the buffer, piece by piece, until `stop`.
void sender(int fd, std::vector<char>& buf, size_t piece, bool bounce, const std::atomic<bool>& stop) {
  std::vector<char> near(bounce ? size_t{256} << 10 : 0);
  for (size_t off = 0; !stop.load(std::memory_order_relaxed); off = (off + piece) % buf.size()) {
    for (size_t done = 0; done < piece;) {
      const char* from = buf.data() + off + done;
      size_t n = piece - done;
      if (bounce) {
        n = std::min(n, near.size());
        std::memcpy(near.data(), from, n);
        from = near.data();
      }
      for (size_t sent = 0; sent < n;) {
        ssize_t k = ::send(fd, from + sent, n - sent, MSG_NOSIGNAL);
        if (k <= 0) return;  // the receiver closed at the end
        sent += static_cast<size_t>(k);
      }
      done += n;
    }
  }
}

void receiver(int fd, std::vector<char>& buf, size_t piece, bool bounce, std::atomic<uint64_t>& got,
              const std::atomic<bool>& stop) {
  std::vector<char> near(bounce ? size_t{256} << 10 : 0);
  for (size_t off = 0; !stop.load(std::memory_order_relaxed); off = (off + piece) % buf.size()) {
    for (size_t done = 0; done < piece;) {
      size_t want = piece - done;
      if (bounce) want = std::min(want, near.size());
      ssize_t k = ::recv(fd, bounce ? near.data() : buf.data() + off + done, want, 0);
      if (k <= 0) return;
      if (bounce) dmx::stream_copy(buf.data() + off + done, near.data(), static_cast<size_t>(k));
      done += static_cast<size_t>(k);
      got.fetch_add(static_cast<uint64_t>(k), std::memory_order_relaxed);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr,
                 "usage: tcp_ref STREAMS SIZE WINDOW SECONDS [cold|hot|hot-src|hot-dst|bounce|bounce-src|bounce-both]\n");
    return 2;
  }
  int streams = std::atoi(argv[1]);
  size_t size = std::strtoull(argv[2], nullptr, 0), window = std::strtoull(argv[3], nullptr, 0);
  double seconds = std::atof(argv[4]);
  const std::string mode = argc > 5 ? argv[5] : "cold";
  const bool hot_src = mode == "hot" || mode == "hot-src", hot_dst = mode == "hot" || mode == "hot-dst";
  const bool bounce = mode == "bounce" || mode == "bounce-both";
  const bool bounce_src = mode == "bounce-src" || mode == "bounce-both";
  if (!hot_src && !hot_dst && !bounce && !bounce_src && mode != "cold") return 2;
  if (streams < 1 || size == 0 || window == 0 || seconds <= 0) return 2;
  // Each stream cycles through its share of the window; sends of at most 1 MiB (dmx's chunk).
  // `hot`: one 128 KiB buffer a side, in 128 KiB pieces (iperf3); `hot-src`/`hot-dst`: one side
  // cycles through one piece, which stays in its core's cache.
  size_t share = std::max<size_t>(window * size / static_cast<size_t>(streams), 4096);
  size_t piece = mode == "hot" ? size_t{128} << 10 : std::min<size_t>(share, size_t{1} << 20);
  if (mode == "hot") share = piece;
  share -= share % piece;
  const size_t hot_share = piece;

  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof a;
  if (lfd < 0 || ::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, streams) != 0 ||
      ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &alen) != 0)
    die("listen");
  std::vector<int> tx(streams), rx(streams);
  for (int i = 0; i < streams; ++i) {
    tx[i] = ::socket(AF_INET, SOCK_STREAM, 0);
    if (tx[i] < 0 || ::connect(tx[i], reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("connect");
    rx[i] = ::accept(lfd, nullptr, nullptr);
    if (rx[i] < 0) die("accept");
    int one = 1;
    ::setsockopt(tx[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  std::vector<std::vector<char>> src, dst;
  for (int i = 0; i < streams; ++i) {
    src.push_back(random_bytes(hot_src ? hot_share : share, 1 + i));
    dst.push_back(random_bytes(hot_dst ? hot_share : share, 100 + i));  // touched, as dmx bench's buffers are
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> got{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < streams; ++i) {
    threads.emplace_back(sender, tx[i], std::ref(src[i]), piece, bounce_src, std::cref(stop));
    threads.emplace_back(receiver, rx[i], std::ref(dst[i]), piece, bounce, std::ref(got), std::cref(stop));
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds * 0.2));  // warm-up, not counted
  uint64_t g0 = got.load();
  auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  uint64_t g1 = got.load();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  stop.store(true);
  for (int i = 0; i < streams; ++i) {
    ::shutdown(tx[i], SHUT_RDWR);
    ::shutdown(rx[i], SHUT_RDWR);
  }
  for (auto& t : threads) t.join();
  std::printf("tcp_ref streams %d buffer %zu %s GB/s %.2f\n", streams, share, mode.c_str(),
              static_cast<double>(g1 - g0) / secs / 1e9);
  return 0;
}
