// dmx/status.h — runtime failures as values.
//
// Status carries a code, a human message, where it came from (origin, e.g. "tcp/stream 2") and
// the peer it concerns (e.g. "10.0.0.2:7000"). Result<T> holds either a T or a non-ok Status.
// Bugs are assertions, failures are Status; the library's own code never throws.
//
// Result: check ok() and use *r / r->, or call value() which throws dmx::Error. value() is the one
// place the C++ API throws, and only on the caller's thread: `*r` and `r->` on an error are
// unchecked in release builds (undefined behaviour) and assert in debug builds; value_or(v) gives
// v instead; status() is the error (an ok Status when ok()).
#pragma once

#include <cassert>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace dmx {

enum class Code : unsigned char {
  kOk = 0,
  kInvalidArgument,    // the caller passed something wrong
  kNotFound,           // unknown key, name or id
  kUnavailable,        // a capability this machine or build lacks (the message says why)
  kTimeout,            // a deadline passed
  kCancelled,          // the caller cancelled
  kClosed,             // the endpoint or context was closed
  kProtocol,           // the peer sent something that breaks the protocol
  kAuth,               // authentication failed
  kIo,                 // an operating-system call failed (message names it and errno)
  kOutOfRange,         // offset/length outside a region
  kTruncated,          // a message larger than the posted buffer
  kResourceExhausted,  // a bounded resource ran out
  kPeerFailed,         // the peer reported an error, died or went silent
  kDataLoss,           // bytes arrived corrupted: a chunk's checksum did not match (checksum=crc32c)
  kInternal,           // a bug in dmx; stays last (dmx/metrics.h sizes arrays by it)
};

std::string_view code_name(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(Code code, std::string message);

  static Status ok_status() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  Code code() const { return rep_ ? rep_->code : Code::kOk; }
  const std::string& message() const;
  const std::string& origin() const;
  const std::string& peer() const;

  // Builders: return a copy with the field set (only if not set already, so the innermost,
  // most precise origin wins).
  Status with_peer(std::string_view peer) const;
  Status with_origin(std::string_view origin) const;

  // "timeout: recv(tag=3, 4096 B) did not complete in 2000 ms [peer 10.0.0.2:7000, tcp/stream 1]"
  std::string to_string() const;

  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

 private:
  struct Rep {
    Code code;
    std::string message;
    std::string origin;
    std::string peer;
  };
  std::unique_ptr<Rep> rep_;
};

// What Result<T>::value() throws on an error: what() is status().to_string(). Copies share the
// Status, so copying never throws.
class Error : public std::runtime_error {
 public:
  explicit Error(Status status);
  ~Error() override;

  const Status& status() const noexcept { return *status_; }
  Code code() const noexcept { return status_->code(); }

 private:
  std::shared_ptr<const Status> status_;
};

// Throws Error(status); out of line so that value() stays small.
[[noreturn]] void throw_error(const Status& status);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() && "Result built from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : *std::get_if<Status>(&v_);
  }

  // Checked: throws Error carrying status() when not ok.
  T& value() & {
    check();
    return *std::get_if<T>(&v_);
  }
  const T& value() const& {
    check();
    return *std::get_if<T>(&v_);
  }
  T&& value() && {
    check();
    return std::move(*std::get_if<T>(&v_));
  }

  // The value, or `fallback` when not ok.
  template <typename U>
  T value_or(U&& fallback) const& {
    return ok() ? *std::get_if<T>(&v_) : static_cast<T>(std::forward<U>(fallback));
  }
  template <typename U>
  T value_or(U&& fallback) && {
    return ok() ? std::move(*std::get_if<T>(&v_)) : static_cast<T>(std::forward<U>(fallback));
  }

  // Unchecked in release builds: call only when ok() (asserts in debug builds).
  T* operator->() {
    assert(ok());
    return std::get_if<T>(&v_);
  }
  const T* operator->() const {
    assert(ok());
    return std::get_if<T>(&v_);
  }
  T& operator*() & {
    assert(ok());
    return *std::get_if<T>(&v_);
  }
  const T& operator*() const& {
    assert(ok());
    return *std::get_if<T>(&v_);
  }
  T&& operator*() && {
    assert(ok());
    return std::move(*std::get_if<T>(&v_));
  }

 private:
  void check() const {
    if (!ok()) [[unlikely]]
      throw_error(*std::get_if<Status>(&v_));
  }

  std::variant<T, Status> v_;
};

}  // namespace dmx

#define DMX_CONCAT_INNER(a, b) a##b
#define DMX_CONCAT(a, b) DMX_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` (a Status) is not ok.
#define DMX_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::dmx::Status dmx_status_ = (expr);        \
    if (!dmx_status_.ok()) return dmx_status_; \
  } while (0)

// `lhs = value of expr` (a Result<T>), or return its Status.
#define DMX_ASSIGN_OR_RETURN(lhs, expr) DMX_ASSIGN_OR_RETURN_IMPL(DMX_CONCAT(dmx_result_, __LINE__), lhs, expr)
#define DMX_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = *std::move(tmp)
