// The simulated device: host memory that only the copy interface may touch.
//
// Each allocation is a memfd mapped twice: the "device address" handed to users is mapped
// PROT_NONE, so any direct load or store by the engine faults at once; a second, private
// read-write mapping is what the copy worker uses. Copies run asynchronously on one worker thread
// per queue, in order, like a DMA engine; fences number the copies.
//
// sim_hold_device_busy models a persistent kernel: calls that wait for an idle device
// (free, free_staging: as cudaFree, cudaFreeHost) then wait, holding the driver's process-wide lock,
// and every other call of the backend or its queues waits for that lock, as libcuda's do.
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/sys.h"
#include "core/crc32c.h"
#include "memory/backend.h"
#include "memory/sim_device.h"

namespace dmx {
namespace {

size_t page_round(size_t n) {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (std::max<size_t>(n, 1) + page - 1) / page * page;
}

// Device address -> shadow mapping. Guarded by mu_.
class SimMemoryMap {
 public:
  void add(char* dev, char* shadow, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    allocs_[dev] = {shadow, size};
  }
  void remove(char* dev) {
    std::lock_guard<std::mutex> lock(mu_);
    allocs_.erase(dev);
  }
  // The shadow address of [dev, dev+n), or an error when the range is not inside one allocation.
  Result<char*> translate(const void* dev, size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    auto p = static_cast<char*>(const_cast<void*>(dev));
    auto it = allocs_.upper_bound(p);
    if (it == allocs_.begin()) return out_of_range(dev, n);
    --it;
    size_t off = static_cast<size_t>(p - it->first);
    if (off > it->second.size || n > it->second.size - off) return out_of_range(dev, n);
    return it->second.shadow + off;
  }

 private:
  static Status out_of_range(const void* dev, size_t n) {
    return Status(Code::kOutOfRange, fmt::format("sim: [{}, +{}) is not inside one sim allocation", dev, n));
  }
  struct Alloc {
    char* shadow;
    size_t size;
  };
  std::mutex mu_;
  std::map<char*, Alloc> allocs_;
};

SimMemoryMap& sim_map() {
  static SimMemoryMap map;
  return map;
}

// The simulated driver's lock and the "persistent kernel" (sim_hold_device_busy). Never destroyed.
class SimDriver {
 public:
  // Every call of the backend and its queues: waits while a call waits for an idle device.
  void enter() {
    if (!idle_wait_.load(std::memory_order_acquire)) return;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, kMaxWait, [&] { return !idle_wait_.load(std::memory_order_relaxed); });
  }
  // A call that waits for the device to be idle: while a kernel runs, it waits (at most kMaxWait)
  // and holds the lock meanwhile.
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, kMaxWait, [&] { return !idle_wait_.load(std::memory_order_relaxed); });
    if (!busy_) return;
    idle_wait_.store(true, std::memory_order_release);
    ++idle_waits_;
    cv_.wait_for(lock, kMaxWait, [&] { return !busy_; });
    idle_wait_.store(false, std::memory_order_release);
    cv_.notify_all();
  }
  void set_busy(bool busy) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = busy;
    }
    cv_.notify_all();
  }
  uint64_t idle_waits() {
    std::lock_guard<std::mutex> lock(mu_);
    return idle_waits_;
  }

 private:
  static constexpr std::chrono::minutes kMaxWait{2};
  std::mutex mu_;  // guards busy_, idle_waits_; idle_wait_ changes under it
  std::condition_variable cv_;
  bool busy_ = false;
  std::atomic<bool> idle_wait_{false};
  uint64_t idle_waits_ = 0;
};

std::atomic<bool> refuse_lists{false};  // sim_refuse_lists

SimDriver& sim_driver() {
  static SimDriver* d = new SimDriver;
  return *d;
}

class SimQueue final : public CopyQueue {
 public:
  SimQueue() : worker_([this] { run(); }) {}
  ~SimQueue() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  Status to_host(void* host_dst, const void* dev_src, size_t n) override {
    sim_driver().enter();
    DMX_ASSIGN_OR_RETURN(char* src, sim_map().translate(dev_src, n));
    return push(Task{host_dst, src, n, 0});
  }
  Status to_device(void* dev_dst, const void* host_src, size_t n) override {
    sim_driver().enter();
    DMX_ASSIGN_OR_RETURN(char* dst, sim_map().translate(dev_dst, n));
    return push(Task{dst, host_src, n, 0});
  }
  // As the CUDA queue's (one submission for the list): every device side translated first, so a
  // refused list enqueues nothing.
  Status copy_list(const Span* spans, size_t n, bool to_host) override {
    sim_driver().enter();
    if (refuse_lists.load(std::memory_order_relaxed))
      return Status(Code::kUnavailable, "copy_list: sim lists refused (sim_refuse_lists)");
    std::vector<Task> tasks;
    tasks.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const Span& s = spans[i];
      if (s.n == 0) continue;
      Result<char*> dev = sim_map().translate(to_host ? s.src : s.dst, s.n);
      if (!dev.ok()) return Status(Code::kUnavailable, "copy_list: " + dev.status().message());
      tasks.push_back(to_host ? Task{s.dst, *dev, s.n, 0} : Task{*dev, s.src, s.n, 0});
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.insert(tasks_.end(), tasks.begin(), tasks.end());
    }
    cv_.notify_one();
    return Status();
  }
  Result<uint64_t> record() override {
    sim_driver().enter();
    uint64_t fence = ++recorded_;
    DMX_RETURN_IF_ERROR(push(Task{nullptr, nullptr, 0, fence}));
    return fence;
  }
  Result<uint64_t> checksum(const void* dev, size_t n) override {
    sim_driver().enter();
    DMX_ASSIGN_OR_RETURN(char* src, sim_map().translate(dev, n));
    uint64_t ticket = ++tickets_;
    DMX_RETURN_IF_ERROR(push(Task{nullptr, src, n, 0, ticket}));
    return ticket;
  }
  uint32_t checksum_result(uint64_t ticket) const override { return results_[ticket % kChecksumsKept]; }
  Result<bool> done(uint64_t fence) override {
    sim_driver().enter();
    return completed_.load(std::memory_order_acquire) >= fence;
  }
  Status wait(uint64_t fence, Deadline deadline) override {
    sim_driver().enter();
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [&] { return completed_.load(std::memory_order_acquire) >= fence; };
    if (deadline.is_never()) {
      done_cv_.wait(lock, ready);
    } else if (!done_cv_.wait_until(lock, deadline.time(), ready)) {
      return Status(Code::kTimeout, fmt::format("sim copy fence {} not reached by the deadline", fence));
    }
    return Status();
  }

 private:
  struct Task {
    void* dst;
    const void* src;
    size_t n;
    uint64_t fence;       // nonzero: a fence marker
    uint64_t ticket = 0;  // nonzero: a checksum of src into results_
  };
  Status push(Task t) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(t);
    }
    cv_.notify_one();
    return Status();
  }
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stop_ and drained
      Task t = tasks_.front();
      tasks_.pop_front();
      lock.unlock();
      if (t.ticket != 0) {
        results_[t.ticket % kChecksumsKept] = crc32c::of(t.src, t.n);
      } else if (t.fence == 0) {
        std::memcpy(t.dst, t.src, t.n);
      }
      lock.lock();
      if (t.fence != 0) {
        completed_.store(t.fence, std::memory_order_release);
        done_cv_.notify_all();
      }
    }
  }

  std::mutex mu_;  // guards tasks_, stop_
  std::condition_variable cv_, done_cv_;
  std::deque<Task> tasks_;
  bool stop_ = false;
  uint64_t recorded_ = 0;  // owner thread only
  uint64_t tickets_ = 0;   // owner thread only
  // Written by the worker before it completes the next fence (release), read after (acquire).
  std::array<uint32_t, kChecksumsKept> results_{};
  std::atomic<uint64_t> completed_{0};
  std::thread worker_;  // last: starts after the members above exist
};

class SimBackend final : public MemoryBackend {
 public:
  explicit SimBackend(int device) : device_(device) {}
  MemSpec spec() const override { return MemSpec{MemKind::kSim, device_}; }
  bool host_accessible() const override { return false; }

  Result<void*> allocate(size_t size) override {
    sim_driver().enter();
    size_t len = page_round(size);
    UniqueFd fd(::memfd_create("dmx-sim", MFD_CLOEXEC));
    if (!fd.valid()) return errno_status("memfd_create(dmx-sim)", errno);
    if (::ftruncate(fd.get(), static_cast<off_t>(len)) != 0) return errno_status("ftruncate(sim)", errno);
    void* dev = ::mmap(nullptr, len, PROT_NONE, MAP_SHARED, fd.get(), 0);
    if (dev == MAP_FAILED) return errno_status("mmap(sim device view)", errno, Code::kResourceExhausted);
    void* shadow = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (shadow == MAP_FAILED) {
      int err = errno;
      ::munmap(dev, len);
      return errno_status("mmap(sim shadow view)", err, Code::kResourceExhausted);
    }
    sim_map().add(static_cast<char*>(dev), static_cast<char*>(shadow), size);
    return dev;
  }
  void free(void* ptr, size_t size) override {
    sim_driver().wait_idle();  // as cudaFree
    auto shadow = sim_map().translate(ptr, 0);
    sim_map().remove(static_cast<char*>(ptr));
    ::munmap(ptr, page_round(size));
    if (shadow.ok()) ::munmap(*shadow, page_round(size));
  }
  Result<std::unique_ptr<CopyQueue>> create_queue() override {
    sim_driver().enter();
    return std::unique_ptr<CopyQueue>(std::make_unique<SimQueue>());
  }
  Result<void*> allocate_staging(size_t size) override {
    sim_driver().enter();
    return host_backend()->allocate_staging(size);
  }
  void free_staging(void* ptr, size_t size) override {
    sim_driver().wait_idle();  // as cudaFreeHost
    host_backend()->free_staging(ptr, size);
  }

 private:
  int device_;
};

}  // namespace

void sim_hold_device_busy(bool busy) { sim_driver().set_busy(busy); }

uint64_t sim_idle_waits() { return sim_driver().idle_waits(); }

void sim_refuse_lists(bool refuse) { refuse_lists.store(refuse, std::memory_order_relaxed); }

MemoryBackend* sim_backend(int device) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<SimBackend>> backends;
  std::lock_guard<std::mutex> lock(mu);
  auto& b = backends[device];
  if (!b) b = std::make_unique<SimBackend>(device);
  return b.get();
}

}  // namespace dmx
