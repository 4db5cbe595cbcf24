// Small operating-system helpers: owned file descriptors, errno text, random bytes.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "dmx/status.h"

namespace dmx {

// One step of a spin-wait: tells the core this is a busy loop (x86 pause, arm yield).
inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// "connect(10.0.0.2:7000) failed: Connection refused (errno 111)"
Status errno_status(std::string_view call, int err, Code code = Code::kIo);
std::string errno_text(int err);

// Cryptographically strong random bytes (getrandom).
Status random_bytes(void* out, size_t n);
uint64_t random_u64();

}  // namespace dmx
