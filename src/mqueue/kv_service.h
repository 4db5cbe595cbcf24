// mqueue/kv_service.h — a small external key-value service for the client queues: the
// face-verification example's database of reference images, and the tests' service.
//
// Protocol: per TCP connection, WireHeader frames; a request's payload is a 4-byte key, the
// reply (kResponseMagic, same tag) carries the value, empty when the key is unknown. Answers in
// order. A client that breaks the protocol is dropped.
//
// Thread-safety: put() before clients connect; the rest from any thread. stop() joins.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mqueue/net.h"

namespace dmx::mqueue {

class KvService {
 public:
  static Result<std::unique_ptr<KvService>> start(const std::string& address = "127.0.0.1:0");
  ~KvService();
  void put(uint32_t key, std::vector<uint8_t> value);
  std::string address() const { return addr_.to_string(); }
  uint64_t gets() const { return gets_.load(); }
  // Closes every client connection (tests: the service fails under the dispatcher).
  void close_clients() { close_gen_.fetch_add(1); }
  void stop();

 private:
  KvService() = default;
  void accept_loop();
  void serve(Fd fd);

  Fd listen_;
  SockAddr addr_;
  std::atomic<bool> stop_{false};
  std::atomic<uint32_t> close_gen_{0};
  std::atomic<uint64_t> gets_{0};
  std::mutex mu_;  // guards data_ and threads_
  std::map<uint32_t, std::vector<uint8_t>> data_;
  std::vector<std::thread> threads_;
};

}  // namespace dmx::mqueue
