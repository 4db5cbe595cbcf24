// A double of the kernel's p2pmem allocate file (drivers/pci/p2pdma.c, p2pmem_alloc_mmap, Linux
// 6.2+): per device a pool of `size` bytes handed out in whole pages, first fit, and the answers
// the kernel gives: open() fails with ENOENT for a path it does not know (kernel < 6.2) and EACCES
// for one marked root-only; mmap fails with EINVAL for a private mapping or a non-zero offset,
// ENODEV for a device being removed, ENOMEM when no contiguous range is free. Memory behind a
// mapping is anonymous, so tests can write and read it. Thread-safe.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "core/sys.h"
#include "topo/p2pmem.h"

namespace dmx::topo::testing {

class P2pmemDouble final : public P2pmemKernel {
 public:
  void add_device(const std::string& allocate_path, uint64_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    devices_[allocate_path].free[0] = size;
  }
  void deny(const std::string& path) { set(path, [](Device& d) { d.denied = true; }); }
  void remove(const std::string& path) { set(path, [](Device& d) { d.removed = true; }); }
  // Another process takes `bytes` from the device's pool.
  void take(const std::string& path, uint64_t bytes) {
    set(path, [bytes](Device& d) {
      auto it = d.free.begin();
      if (it != d.free.end() && it->second >= bytes) {
        uint64_t off = it->first + bytes, rest = it->second - bytes;
        d.free.erase(it);
        if (rest) d.free[off] = rest;
      }
    });
  }
  uint64_t available(const std::string& path) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = devices_.find(path);
    uint64_t n = 0;
    if (it != devices_.end())
      for (auto& [o, l] : it->second.free) n += l;
    return n;
  }
  size_t live_mappings() const {
    std::lock_guard<std::mutex> lock(mu_);
    return maps_.size();
  }

  Result<void*> map(const std::string& path, size_t len, bool shared, uint64_t offset) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = devices_.find(path);
    if (it == devices_.end()) return fail(ENOENT, "open", path, len);
    Device& d = it->second;
    if (d.denied) return fail(EACCES, "open", path, len);
    if (!shared || offset != 0) return fail(EINVAL, "mmap", path, len);
    if (d.removed) return fail(ENODEV, "mmap", path, len);
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    if (len == 0 || len % page != 0) return fail(EINVAL, "mmap", path, len);  // mmap's own rule, as rounded
    for (auto f = d.free.begin(); f != d.free.end(); ++f) {
      if (f->second < len) continue;
      void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return fail(errno, "mmap", path, len);
      uint64_t off = f->first, rest = f->second - len;
      d.free.erase(f);
      if (rest) d.free[off + len] = rest;
      maps_[p] = Mapping{path, off, len};
      return p;
    }
    return fail(ENOMEM, "mmap", path, len);
  }

  void unmap(void* p, size_t len) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = maps_.find(p);
    if (it == maps_.end() || it->second.len != len) {
      ++bad_unmaps_;
      return;
    }
    Device& d = devices_[it->second.path];
    d.free[it->second.off] = len;  // no coalescing needed for these tests' first fit
    ::munmap(p, len);
    maps_.erase(it);
  }
  int bad_unmaps() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bad_unmaps_;
  }

 private:
  struct Device {
    std::map<uint64_t, uint64_t> free;
    bool denied = false, removed = false;
  };
  struct Mapping {
    std::string path;
    uint64_t off = 0, len = 0;
  };
  template <typename F>
  void set(const std::string& path, F f) {
    std::lock_guard<std::mutex> lock(mu_);
    f(devices_[path]);
  }
  static Status fail(int err, const char* call, const std::string& path, size_t len) {
    return Status(p2pmem_errno_code(err), fmt::format("{}({}, {} bytes) failed: {}", call, path, len, errno_text(err)));
  }
  mutable std::mutex mu_;
  std::map<std::string, Device> devices_;
  std::map<void*, Mapping> maps_;
  int bad_unmaps_ = 0;
};

}  // namespace dmx::topo::testing
