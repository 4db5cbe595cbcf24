// What one hand-off between two threads costs on this machine: two threads pass a token back and
// forth ROUNDS times, and half a round trip is one hand-off. A message through dmx's rendezvous
// crosses about six of them (docs/performance.md), so this is the price of each.
//
//   wake_probe [ROUNDS]
//
// Prints one line per way of waiting for the token, in µs per hand-off (p50, p99, mean):
//   futex  std::atomic::wait/notify — a waiter that sleeps at once (dmx's waiter for large ops)
//   epoll  epoll_wait on an eventfd, written by the other thread (how dmx wakes a parked worker)
//   spin   both threads poll the token (the floor: no sleep, two busy cores)
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

enum class How { kFutex, kEpoll, kSpin };
const char* name(How h) { return h == How::kFutex ? "futex" : h == How::kEpoll ? "epoll" : "spin"; }

// One direction of the hand-off: the token, and the eventfd and epoll set of the `epoll` way.
struct Side {
  std::atomic<uint64_t> token{0};
  int efd = -1, ep = -1;
};

// Waits until `token` holds `want`, the way `how` says.
void wait_for(Side& s, uint64_t want, How how) {
  if (how == How::kSpin) {
    while (s.token.load(std::memory_order_acquire) != want) {
    }
  } else if (how == How::kFutex) {
    for (uint64_t v; (v = s.token.load(std::memory_order_acquire)) != want;) s.token.wait(v);
  } else {
    while (s.token.load(std::memory_order_acquire) != want) {
      epoll_event e;
      if (::epoll_wait(s.ep, &e, 1, 1000) == 1) {
        uint64_t n;
        (void)!::read(s.efd, &n, sizeof n);
      }
    }
  }
}

void give(Side& s, uint64_t value, How how) {
  s.token.store(value, std::memory_order_release);
  if (how == How::kFutex) {
    s.token.notify_one();
  } else if (how == How::kEpoll) {
    uint64_t one = 1;
    (void)!::write(s.efd, &one, sizeof one);
  }
}

void run(How how, int rounds) {
  Side a, b;  // a: the main thread waits on it; b: the partner does
  for (Side* s : {&a, &b}) {
    s->efd = ::eventfd(0, EFD_NONBLOCK);
    s->ep = ::epoll_create1(0);
    epoll_event e{};
    e.events = EPOLLIN;
    if (s->efd < 0 || s->ep < 0 || ::epoll_ctl(s->ep, EPOLL_CTL_ADD, s->efd, &e) != 0) {
      std::perror("wake_probe: eventfd/epoll");
      std::exit(2);
    }
  }
  std::thread partner([&] {
    for (int i = 1; i <= rounds; ++i) {
      wait_for(b, static_cast<uint64_t>(i), how);
      give(a, static_cast<uint64_t>(i), how);
    }
  });
  std::vector<double> half(static_cast<size_t>(rounds));
  for (int i = 1; i <= rounds; ++i) {
    // A pause between rounds, so that a sleeping waiter is really asleep (as between messages).
    auto t = Clock::now() + std::chrono::microseconds(50);
    while (Clock::now() < t) {
    }
    auto t0 = Clock::now();
    give(b, static_cast<uint64_t>(i), how);
    wait_for(a, static_cast<uint64_t>(i), how);
    half[static_cast<size_t>(i - 1)] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2;
  }
  partner.join();
  double mean = 0;
  for (double h : half) mean += h / rounds;
  std::sort(half.begin(), half.end());
  std::printf("wake_probe %-5s rounds %d us per hand-off p50 %.1f p99 %.1f mean %.1f\n", name(how), rounds,
              half[half.size() / 2], half[half.size() * 99 / 100], mean);
  for (Side* s : {&a, &b}) {
    ::close(s->ep);
    ::close(s->efd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = argc > 1 ? std::atoi(argv[1]) : 20000;
  if (rounds < 1) return 2;
  for (How how : {How::kFutex, How::kEpoll, How::kSpin}) run(how, rounds);
  return 0;
}
