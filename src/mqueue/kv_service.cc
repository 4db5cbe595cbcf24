#include "mqueue/kv_service.h"

#include <netinet/tcp.h>
#include <poll.h>

#include <cstring>

#include "mqueue/layout.h"

namespace dmx::mqueue {

Result<std::unique_ptr<KvService>> KvService::start(const std::string& address) {
  std::unique_ptr<KvService> s(new KvService());
  DMX_ASSIGN_OR_RETURN(SockAddr a, resolve(address));
  DMX_ASSIGN_OR_RETURN(s->listen_, tcp_listen(a));
  DMX_ASSIGN_OR_RETURN(s->addr_, local_address(s->listen_.get()));
  std::lock_guard<std::mutex> lock(s->mu_);
  s->threads_.emplace_back(&KvService::accept_loop, s.get());
  return s;
}

KvService::~KvService() { stop(); }

void KvService::put(uint32_t key, std::vector<uint8_t> value) {
  std::lock_guard<std::mutex> lock(mu_);
  data_[key] = std::move(value);
}

void KvService::stop() {
  stop_.store(true);
  for (;;) {
    std::vector<std::thread> ts;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ts.swap(threads_);
    }
    if (ts.empty()) return;
    for (auto& t : ts) t.join();
  }
}

void KvService::accept_loop() {
  while (!stop_.load()) {
    pollfd p{listen_.get(), POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    int fd = ::accept(listen_.get(), nullptr, nullptr);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    threads_.emplace_back(&KvService::serve, this, Fd(fd));
  }
}

void KvService::serve(Fd fd) {
  const uint32_t gen = close_gen_.load();
  (void)set_io_timeout(fd.get(), std::chrono::seconds(2));
  int one = 1;
  (void)::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<uint8_t> value;
  while (!stop_.load() && close_gen_.load() == gen) {
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    WireHeader h{};
    if (!read_all(fd.get(), &h, sizeof h, "kv client").ok()) return;
    if (h.magic != kRequestMagic || h.len != 4) return;  // not our protocol: drop it
    uint32_t key = 0;
    if (!read_all(fd.get(), &key, 4, "kv client").ok()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = data_.find(key);
      value = it == data_.end() ? std::vector<uint8_t>{} : it->second;
    }
    gets_.fetch_add(1);
    WireHeader r{kResponseMagic, static_cast<uint32_t>(value.size()), h.tag};
    if (!write_all(fd.get(), &r, sizeof r, "kv client").ok()) return;
    if (!value.empty() && !write_all(fd.get(), value.data(), value.size(), "kv client").ok()) return;
  }
}

}  // namespace dmx::mqueue
