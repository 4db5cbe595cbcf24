// A client of PyTorch's TCPStore (c10d), the store of a torch.distributed job (MASTER_ADDR/PORT).
//
// Its wire protocol, as torch's server speaks it: on connecting, the client sends VALIDATE (query
// byte 0) and the magic number 0x3C85F7CE (u32), with no answer; then each query is one type byte
// and its arguments: a string or byte vector as a u64 length and the bytes, a number as an i64,
// a key list as a u64 count and the strings; numbers in the host's order (little endian on every
// machine torch runs on). SET(1) key, value: no answer. GET(3) key: the value as a byte vector
// (the key must exist: we CHECK first). ADD(4) key, i64: the new value as an i64 (the value is
// kept as decimal text). CHECK(5) keys: one byte, 0 ready (all exist), 1 not. DELETE_KEY(8) key:
// an i64, how many went. Keys go with a "/" before them, as torch's own clients send them.
//
// TCPStore has no leases and no listing (docs/cluster.md says how dmx does without): a leased value
// is stored as "L<lease id>\n<value>" and lease <id> lives while the key "dmx/lease/<id>" holds a
// time (unix ms) in the future, which the holder's keep-alive pushes forward; a key put under
// "<dir>/" is also recorded in "<dir>/#<n>" (n from ADD on "<dir>/#count") so that list() can
// find it. Every call runs within call_timeout on one connection (mu_), remade after an error.
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>

#include "core/clock.h"
#include "store/store.h"

namespace dmx::store {
namespace {

constexpr uint32_t kValidationMagic = 0x3C85F7CE;
enum Query : uint8_t { kValidate = 0, kSet = 1, kGet = 3, kAdd = 4, kCheck = 5, kDeleteKey = 8 };
constexpr uint64_t kMaxValue = 1 << 20;  // a dmx entry is a few hundred bytes: more is not ours

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class TcpStore final : public Store {
 public:
  TcpStore(std::string host, int port, std::chrono::milliseconds timeout)
      : host_(std::move(host)), port_(port), timeout_(timeout) {}
  ~TcpStore() override { drop(); }

  std::string describe() const override { return fmt::format("tcpstore {}:{}", host_, port_); }

  Result<int64_t> grant(std::chrono::seconds ttl) override {
    std::lock_guard lock(mu_);
    DMX_ASSIGN_OR_RETURN(int64_t id, add_locked("dmx/lease/next", 1));
    ttls_[id] = ttl;
    DMX_RETURN_IF_ERROR(set_locked(lease_key(id), std::to_string(now_ms() + ttl.count() * 1000)));
    return id;
  }

  Status keepalive(int64_t lease) override {
    std::lock_guard lock(mu_);
    auto it = ttls_.find(lease);
    if (it == ttls_.end()) return Status(Code::kNotFound, fmt::format("{}: lease {} is not ours", describe(), lease));
    DMX_ASSIGN_OR_RETURN(auto expiry, lease_expiry_locked(lease));
    if (!expiry || *expiry < now_ms())
      return Status(Code::kNotFound, fmt::format("{}: lease {} has ended (its heartbeat is stale)", describe(), lease));
    return set_locked(lease_key(lease), std::to_string(now_ms() + it->second.count() * 1000));
  }

  Status put(const std::string& key, const std::string& value, int64_t lease) override {
    std::lock_guard lock(mu_);
    DMX_RETURN_IF_ERROR(set_locked(key, fmt::format("L{}\n", lease) + value));
    auto slash = key.rfind('/');
    if (slash == std::string::npos || indexed_.count(key)) return {};
    std::string dir = key.substr(0, slash + 1);
    DMX_ASSIGN_OR_RETURN(int64_t n, add_locked(dir + "#count", 1));
    DMX_RETURN_IF_ERROR(set_locked(fmt::format("{}#{}", dir, n), key));
    indexed_.insert(key);
    return {};
  }

  Result<std::optional<KeyValue>> get(const std::string& key) override {
    std::lock_guard lock(mu_);
    return get_live_locked(key);
  }

  Result<std::vector<KeyValue>> list(const std::string& prefix, size_t limit) override {
    std::lock_guard lock(mu_);
    std::vector<KeyValue> out;
    DMX_ASSIGN_OR_RETURN(int64_t count, add_locked(prefix + "#count", 0));
    std::set<std::string> seen;
    for (int64_t i = 1; i <= count && out.size() < limit && i <= int64_t(4 * limit); ++i) {
      DMX_ASSIGN_OR_RETURN(auto k, get_raw_locked(fmt::format("{}#{}", prefix, i)));
      if (!k || !seen.insert(*k).second || k->rfind(prefix, 0) != 0) continue;
      DMX_ASSIGN_OR_RETURN(auto kv, get_live_locked(*k));
      if (kv) out.push_back(std::move(*kv));
    }
    return out;
  }

  Result<uint64_t> next_epoch(const std::string& key) override {
    std::lock_guard lock(mu_);
    DMX_ASSIGN_OR_RETURN(int64_t n, add_locked(key, 1));
    if (n <= 0) return Status(Code::kProtocol, fmt::format("{}: ADD {} answered {}", describe(), key, n));
    return static_cast<uint64_t>(n);
  }

  Status remove(const std::string& key) override {
    std::lock_guard lock(mu_);
    DMX_RETURN_IF_ERROR(begin_locked(kDeleteKey));
    put_key(key);
    DMX_RETURN_IF_ERROR(flush_locked("DELETE_KEY"));
    int64_t n = 0;
    return read_i64_locked(&n, "DELETE_KEY");
  }

 private:
  static std::string lease_key(int64_t id) { return fmt::format("dmx/lease/{}", id); }

  Result<std::optional<int64_t>> lease_expiry_locked(int64_t lease) {
    DMX_ASSIGN_OR_RETURN(auto v, get_raw_locked(lease_key(lease)));
    if (!v) return std::optional<int64_t>();
    try {
      return std::optional<int64_t>(std::stoll(*v));
    } catch (...) {
      return std::optional<int64_t>();
    }
  }

  // The value without its lease prefix, or nullopt when absent or its lease ended.
  Result<std::optional<KeyValue>> get_live_locked(const std::string& key) {
    DMX_ASSIGN_OR_RETURN(auto raw, get_raw_locked(key));
    if (!raw) return std::optional<KeyValue>();
    auto nl = raw->find('\n');
    if (raw->empty() || (*raw)[0] != 'L' || nl == std::string::npos)
      return Status(Code::kProtocol, fmt::format("{}: key {} does not hold a dmx value", describe(), key));
    KeyValue kv{key, raw->substr(nl + 1), 0};
    try {
      kv.lease = std::stoll(raw->substr(1, nl - 1));
    } catch (...) {
      return Status(Code::kProtocol, fmt::format("{}: key {} has a malformed lease", describe(), key));
    }
    if (kv.lease != 0) {
      DMX_ASSIGN_OR_RETURN(auto expiry, lease_expiry_locked(kv.lease));
      if (!expiry || *expiry < now_ms()) return std::optional<KeyValue>();
    }
    return std::optional<KeyValue>(std::move(kv));
  }

  Result<std::optional<std::string>> get_raw_locked(const std::string& key) {
    DMX_RETURN_IF_ERROR(begin_locked(kCheck));
    put_u64(1);
    put_key(key);
    DMX_RETURN_IF_ERROR(flush_locked("CHECK"));
    uint8_t ready = 0;
    DMX_RETURN_IF_ERROR(read_locked(&ready, 1, "CHECK"));
    if (ready != 0) return std::optional<std::string>();
    DMX_RETURN_IF_ERROR(begin_locked(kGet));
    put_key(key);
    DMX_RETURN_IF_ERROR(flush_locked("GET"));
    uint64_t len = 0;
    DMX_RETURN_IF_ERROR(read_locked(&len, 8, "GET"));
    if (len > kMaxValue) {
      drop();
      return Status(Code::kProtocol, fmt::format("{}: GET {}: a {}-byte value (at most {} expected)", describe(), key,
                                                 len, kMaxValue));
    }
    std::string v(len, '\0');
    DMX_RETURN_IF_ERROR(read_locked(v.data(), len, "GET"));
    return std::optional<std::string>(std::move(v));
  }

  Status set_locked(const std::string& key, const std::string& value) {
    DMX_RETURN_IF_ERROR(begin_locked(kSet));
    put_key(key);
    put_str(value);
    return flush_locked("SET");
  }

  Result<int64_t> add_locked(const std::string& key, int64_t delta) {
    DMX_RETURN_IF_ERROR(begin_locked(kAdd));
    put_key(key);
    put_u64(static_cast<uint64_t>(delta));
    DMX_RETURN_IF_ERROR(flush_locked("ADD"));
    int64_t v = 0;
    DMX_RETURN_IF_ERROR(read_i64_locked(&v, "ADD"));
    return v;
  }

  Status read_i64_locked(int64_t* v, const char* what) { return read_locked(v, 8, what); }

  // Starts a query (connecting and validating first when needed).
  Status begin_locked(uint8_t query) {
    deadline_ = Deadline::after(timeout_);
    if (fd_ < 0) DMX_RETURN_IF_ERROR(connect_locked());
    out_.clear();
    out_.push_back(query);
    return {};
  }
  void put_u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
  }
  void put_str(const std::string& s) {
    put_u64(s.size());
    out_ += s;
  }
  // torch's clients send every key with a "/" before it (c10d's keyPrefix_): so do we, so that a
  // torch client's check("dmx/...") sees our keys and ours never meet its internal ones.
  void put_key(const std::string& key) { put_str("/" + key); }

  Status connect_locked() {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &res);
    if (rc != 0)
      return Status(Code::kUnavailable, fmt::format("{}: cannot resolve {}: {}", describe(), host_, gai_strerror(rc)));
    Status last(Code::kUnavailable, fmt::format("{}: no address", describe()));
    for (addrinfo* a = res; a && fd_ < 0; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 || errno == EINPROGRESS) {
        if (wait_locked(fd, POLLOUT)) {
          int err = 0;
          socklen_t len = sizeof err;
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          if (err == 0) {
            fd_ = fd;
            break;
          }
          last = Status(Code::kUnavailable, fmt::format("{}: connect: {}", describe(), std::strerror(err)));
        } else {
          last = Status(Code::kUnavailable, fmt::format("{}: connect: no answer within {} ms", describe(),
                                                        timeout_.count()));
        }
      } else {
        last = Status(Code::kUnavailable, fmt::format("{}: connect: {}", describe(), std::strerror(errno)));
      }
      ::close(fd);
    }
    ::freeaddrinfo(res);
    if (fd_ < 0) return last;
    out_.clear();
    out_.push_back(static_cast<char>(kValidate));
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(kValidationMagic >> (8 * i)));
    return flush_locked("VALIDATE");
  }

  bool wait_locked(int fd, short events) {
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_.time() - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd, events, 0};
      int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      if (rc > 0) return true;
      if (rc < 0 && errno != EINTR) return false;
    }
  }

  Status flush_locked(const char* what) {
    size_t off = 0;
    while (off < out_.size()) {
      ssize_t n = ::send(fd_, out_.data() + off, out_.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR) && wait_locked(fd_, POLLOUT)) continue;
      return fail_locked(what, n < 0 ? std::strerror(errno) : "no progress");
    }
    out_.clear();
    return {};
  }

  Status read_locked(void* buf, size_t len, const char* what) {
    auto* p = static_cast<char*>(buf);
    size_t off = 0;
    while (off < len) {
      ssize_t n = ::recv(fd_, p + off, len - off, 0);
      if (n > 0) {
        off += static_cast<size_t>(n);
        continue;
      }
      if (n == 0) return fail_locked(what, "the store closed the connection");
      if ((errno == EAGAIN || errno == EINTR) && wait_locked(fd_, POLLIN)) continue;
      return fail_locked(what, errno == EAGAIN ? fmt::format("no answer within {} ms", timeout_.count())
                                               : std::string(std::strerror(errno)));
    }
    return {};
  }

  Status fail_locked(const char* what, const std::string& why) {
    drop();
    return Status(Code::kUnavailable, fmt::format("{}: {}: {}", describe(), what, why));
  }

  void drop() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  const std::string host_;
  const int port_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;  // guards everything below: one query at a time on one connection
  int fd_ = -1;
  Deadline deadline_ = Deadline::after(std::chrono::milliseconds(0));
  std::string out_;
  std::unordered_map<int64_t, std::chrono::seconds> ttls_;  // the leases this client granted
  std::set<std::string> indexed_;                            // keys this client recorded for list()
};

}  // namespace

std::unique_ptr<Store> make_tcp_store(const std::string& host, int port, std::chrono::milliseconds call_timeout) {
  return std::make_unique<TcpStore>(host, port, call_timeout);
}

}  // namespace dmx::store
