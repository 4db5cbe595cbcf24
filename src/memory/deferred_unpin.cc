// unpin_and_unmap_later: one process-wide thread that unpins and unmaps host mappings, so that
// whoever lets go of one (a shm link being destroyed on a stream worker) never waits for a device
// that a persistent kernel keeps busy.
#include <sys/mman.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "memory/backend.h"

namespace dmx {
namespace {

class Unpinner {
 public:
  void add(MemoryBackend* backend, void* ptr, size_t len) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back({backend, ptr, len});
    ++pending_;
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    cv_.notify_all();
  }
  size_t pending() {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_;
  }
 private:
  struct Job {
    MemoryBackend* backend;
    void* ptr;
    size_t len;
  };
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !jobs_.empty(); });
      Job j = jobs_.front();
      jobs_.pop_front();
      lock.unlock();
      j.backend->unpin_host(j.ptr);
      ::munmap(j.ptr, j.len);
      lock.lock();
      --pending_;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  size_t pending_ = 0;
  std::thread thread_;
};

// Never destroyed (a link may go during static destruction): at exit, the thread is left waiting
// or in a device's unpin; the process's mappings go with it.
Unpinner& unpinner() {
  static Unpinner* u = new Unpinner;
  return *u;
}

}  // namespace

void unpin_and_unmap_later(MemoryBackend* backend, void* ptr, size_t len) { unpinner().add(backend, ptr, len); }

size_t unpins_pending() { return unpinner().pending(); }

}  // namespace dmx
