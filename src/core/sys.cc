#include "core/sys.h"

#include <fmt/format.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>

namespace dmx {

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer.
  const char* msg = strerror_r(err, buf, sizeof buf);
  return fmt::format("{} (errno {})", msg, err);
}

Status errno_status(std::string_view call, int err, Code code) {
  return Status(code, fmt::format("{} failed: {}", call, errno_text(err)));
}

Status random_bytes(void* out, size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  while (n > 0) {
    ssize_t got = ::getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno_status("getrandom", errno);
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return Status();
}

uint64_t random_u64() {
  uint64_t v = 0;
  Status s = random_bytes(&v, sizeof v);
  assert(s.ok());
  (void)s;
  return v;
}

}  // namespace dmx
