#include "engine/auth.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/sys.h"
#include "wire/le.h"

namespace dmx {
namespace {

std::string default_key_path() {
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg && *xdg) return std::string(xdg) + "/dmx/auth.key";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.config/dmx/auth.key";
}

Status make_dirs(const std::string& path) {
  for (size_t pos = 1; (pos = path.find('/', pos)) != std::string::npos; ++pos) {
    std::string dir = path.substr(0, pos);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return errno_status(fmt::format("mkdir({})", dir), errno);
  }
  return Status();
}

Result<std::vector<unsigned char>> read_key_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return errno_status(fmt::format("open({})", path), errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_status(fmt::format("stat({})", path), errno);
  if (!S_ISREG(st.st_mode)) return Status(Code::kAuth, fmt::format("key file {} is not a regular file", path));
  if (st.st_uid != ::geteuid())
    return Status(Code::kAuth, fmt::format("key file {} belongs to user {}, not to this user ({})", path, st.st_uid,
                                           ::geteuid()));
  if ((st.st_mode & 077) != 0)
    return Status(Code::kAuth, fmt::format("key file {} is accessible by other users (mode {:o}); run chmod 600 on it",
                                           path, st.st_mode & 0777));
  if (st.st_size < 16 || st.st_size > 4096)
    return Status(Code::kAuth, fmt::format("key file {} holds {} bytes; expected 16-4096", path, st.st_size));
  std::vector<unsigned char> key(static_cast<size_t>(st.st_size));
  if (::read(fd.get(), key.data(), key.size()) != static_cast<ssize_t>(key.size()))
    return errno_status(fmt::format("read({})", path), errno);
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
  return key;
}

// Creates the key file atomically (O_EXCL): if another process wins the race, use its key.
Result<std::vector<unsigned char>> create_key_file(const std::string& path) {
  DMX_RETURN_IF_ERROR(make_dirs(path));
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    if (errno == EEXIST) return read_key_file(path);
    return errno_status(fmt::format("create({})", path), errno);
  }
  unsigned char raw[32];
  DMX_RETURN_IF_ERROR(random_bytes(raw, sizeof raw));
  std::string hex;
  for (unsigned char b : raw) hex += fmt::format("{:02x}", b);
  hex += '\n';
  if (::write(fd.get(), hex.data(), hex.size()) != static_cast<ssize_t>(hex.size()))
    return errno_status(fmt::format("write({})", path), errno);
  hex.pop_back();
  return std::vector<unsigned char>(hex.begin(), hex.end());
}

}  // namespace

Result<AuthKey> load_auth_key(const Config& config) {
  AuthKey key;
  if (config.get_bool("insecure")) {
    key.insecure = true;
    key.source = "insecure (authentication off)";
    return key;
  }
  const std::string& inline_key = config.get_string("auth_key");
  if (!inline_key.empty()) {
    if (inline_key.size() < 16) return Status(Code::kAuth, "the auth_key setting must be at least 16 characters");
    key.secret.assign(inline_key.begin(), inline_key.end());
    key.source = "setting auth_key";
    return key;
  }
  std::string path = config.get_string("auth_key_file");
  // Only the default file is made on first use: a named file that is missing is more likely a
  // typo or an unmounted volume than a wish for a new key that no peer shares.
  bool may_create = path.empty() || config.get_bool("auth_key_create");
  if (path.empty()) path = default_key_path();
  bool exists = ::access(path.c_str(), F_OK) == 0;
  if (!exists && !may_create)
    return Status(Code::kAuth, fmt::format("key file {} (setting auth_key_file) does not exist; copy the peers' key "
                                           "there, or set auth_key_create=true to make a new one",
                                           path));
  auto secret = exists ? read_key_file(path) : create_key_file(path);
  if (!secret.ok()) return secret.status();
  key.secret = std::move(*secret);
  key.source = "file " + path;
  return key;
}

wire::Proof make_proof(const AuthKey& key, std::string_view label, const wire::Nonce& client,
                       const wire::Nonce& server, uint64_t session, uint16_t index) {
  std::vector<unsigned char> msg(label.begin(), label.end());
  msg.insert(msg.end(), client.begin(), client.end());
  msg.insert(msg.end(), server.begin(), server.end());
  unsigned char tail[10];
  wire::put_u64(tail, session);
  wire::put_u16(tail + 8, index);
  msg.insert(msg.end(), tail, tail + sizeof tail);
  wire::Proof out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.secret.data(), static_cast<int>(key.secret.size()), msg.data(), msg.size(), out.data(), &len);
  return out;
}

bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool proofs_equal(const wire::Proof& a, const wire::Proof& b) {
  return same_bytes(std::as_bytes(std::span(a)), std::as_bytes(std::span(b)));
}

}  // namespace dmx
