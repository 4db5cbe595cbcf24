#include "engine/auth.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/sys.h"
#include "wire/le.h"

namespace dmx {
namespace {

std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

// The folder the default key's folder goes in: $XDG_CONFIG_HOME, else <home>/.config, <home> from
// $HOME or, when unset (a service, `env -i`), the passwd entry. Never a shared place such as /tmp.
Result<std::string> default_config_dir() {
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg != nullptr && xdg[0] == '/') return std::string(xdg);
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] == '/') return std::string(home) + "/.config";
  struct passwd pw {};
  struct passwd* found = nullptr;
  std::vector<char> buf(16384);
  int rc = 0;
  while ((rc = ::getpwuid_r(::geteuid(), &pw, buf.data(), buf.size(), &found)) == ERANGE && buf.size() < (1u << 20))
    buf.resize(buf.size() * 2);
  if (rc == 0 && found != nullptr && found->pw_dir != nullptr && found->pw_dir[0] == '/')
    return std::string(found->pw_dir) + "/.config";
  std::string why = rc != 0            ? errno_status("getpwuid_r", rc).message()
                    : found == nullptr ? "it has no passwd entry"
                                       : "its passwd entry names no home";
  return Status(Code::kAuth, fmt::format("no home for the default dmx key file: HOME and XDG_CONFIG_HOME are unset "
                                         "and user {} has no home ({}); set DMX_AUTH_KEY, or DMX_AUTH_KEY_FILE to a "
                                         "key file",
                                         ::geteuid(), why));
}

// A folder the key is made in: ours (root's will do for one that holds the key's folder), and
// nobody else may write in it — else they could swap the key for theirs or plant a link.
Status check_dir(int fd, const std::string& path, bool holds_key) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_status(fmt::format("stat({})", path), errno);
  if (!S_ISDIR(st.st_mode))
    return Status(Code::kAuth, fmt::format("{} (for the dmx key) is {}, not a directory", path, kind_of(st.st_mode)));
  if (st.st_uid != ::geteuid() && (holds_key || st.st_uid != 0))
    return Status(Code::kAuth, fmt::format("directory {} (for the dmx key) belongs to user {}, not to this user ({}); "
                                           "refused",
                                           path, st.st_uid, ::geteuid()));
  mode_t writers = holds_key ? (S_IWGRP | S_IWOTH) : S_IWOTH;
  if ((st.st_mode & writers) != 0)
    return Status(Code::kAuth,
                  fmt::format("directory {} (for the dmx key) is writable by other users (mode {:o}); "
                              "refused: {}",
                              path, st.st_mode & 07777,
                              holds_key ? "run chmod 700 on it" : "set DMX_AUTH_KEY or DMX_AUTH_KEY_FILE"));
  return Status();
}

// Opens (making it, mode 0700, if missing) `name` in `parent` as a directory, refusing a link.
Result<UniqueFd> open_key_dir(int parent, const std::string& name, const std::string& path) {
  if (::mkdirat(parent, name.c_str(), 0700) != 0 && errno != EEXIST)
    return errno_status(fmt::format("mkdir({})", path), errno, Code::kAuth);
  UniqueFd fd(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    int err = errno;
    struct stat st {};
    if (::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode))
      return Status(Code::kAuth,
                    fmt::format("{} (for the dmx key) is {}, not a directory; refused", path, kind_of(st.st_mode)));
    return errno_status(fmt::format("open({})", path), err, Code::kAuth);
  }
  DMX_RETURN_IF_ERROR(check_dir(fd.get(), path, /*holds_key=*/true));
  return fd;
}

Status make_dirs(const std::string& path) {
  for (size_t pos = 1; (pos = path.find('/', pos)) != std::string::npos; ++pos) {
    std::string dir = path.substr(0, pos);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return errno_status(fmt::format("mkdir({})", dir), errno);
  }
  return Status();
}

// Reads the key from an opened file: a regular file of ours that nobody else can read.
Result<std::vector<unsigned char>> read_key_fd(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_status(fmt::format("stat({})", path), errno);
  if (!S_ISREG(st.st_mode))
    return Status(Code::kAuth,
                  fmt::format("key file {} is {}, not a regular file; refused", path, kind_of(st.st_mode)));
  if (st.st_uid != ::geteuid())
    return Status(Code::kAuth, fmt::format("key file {} belongs to user {}, not to this user ({})", path, st.st_uid,
                                           ::geteuid()));
  if ((st.st_mode & 077) != 0)
    return Status(Code::kAuth, fmt::format("key file {} is accessible by other users (mode {:o}); run chmod 600 on it",
                                           path, st.st_mode & 0777));
  if (st.st_size < 16 || st.st_size > 4096)
    return Status(Code::kAuth, fmt::format("key file {} holds {} bytes; expected 16-4096", path, st.st_size));
  std::vector<unsigned char> key(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < key.size()) {
    ssize_t n = ::read(fd, key.data() + got, key.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status(fmt::format("read({})", path), errno);
    if (n == 0) return Status(Code::kAuth, fmt::format("key file {} shrank while it was read", path));
    got += static_cast<size_t>(n);
  }
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
  return key;
}

// Opens `name` in `dir` (AT_FDCWD: a path) for reading. O_NONBLOCK: a FIFO would block the open
// until someone writes to it; the type is checked after. `follow` false: a link is refused.
Result<UniqueFd> open_key(int dir, const std::string& name, const std::string& path, bool follow) {
  UniqueFd fd(::openat(dir, name.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW)));
  if (fd.valid()) return fd;
  int err = errno;
  struct stat st {};
  if (!follow && err == ELOOP && ::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
    return Status(Code::kAuth, fmt::format("key file {} is a symbolic link; refused (the default key file is one "
                                           "dmx made; name another file with DMX_AUTH_KEY_FILE)",
                                           path));
  // What cannot be opened at all (a socket: ENXIO) is named too.
  if (err != ENOENT && ::fstatat(dir, name.c_str(), &st, follow ? 0 : AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode))
    return Status(Code::kAuth,
                  fmt::format("key file {} is {}, not a regular file; refused", path, kind_of(st.st_mode)));
  return errno_status(fmt::format("open({})", path), err, err == ENOENT ? Code::kNotFound : Code::kIo);
}

// Creates the key file in `dir` atomically (O_EXCL, never through a link): if another process wins
// the race, use its key.
Result<std::vector<unsigned char>> create_key_file(int dir, const std::string& name, const std::string& path) {
  UniqueFd fd(::openat(dir, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    if (errno == EEXIST) {
      DMX_ASSIGN_OR_RETURN(UniqueFd theirs, open_key(dir, name, path, /*follow=*/false));
      return read_key_fd(theirs.get(), path);
    }
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

// The key file named by auth_key_file: links are followed (a secret volume's file is one); the
// file itself must be ours and private. Missing, it is made only when auth_key_create says so.
Result<std::vector<unsigned char>> named_key(const std::string& path, bool may_create) {
  auto fd = open_key(AT_FDCWD, path, path, /*follow=*/true);
  if (fd.ok()) return read_key_fd(fd->get(), path);
  if (fd.status().code() != Code::kNotFound) return fd.status();
  // A named file that is missing is more likely a typo or an unmounted volume than a wish for a
  // new key that no peer shares.
  if (!may_create)
    return Status(Code::kAuth, fmt::format("key file {} (setting auth_key_file) does not exist; copy the peers' key "
                                           "there, or set auth_key_create=true to make a new one",
                                           path));
  DMX_RETURN_IF_ERROR(make_dirs(path));
  size_t slash = path.rfind('/');
  std::string dir_path = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  UniqueFd dir(::open(dir_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return errno_status(fmt::format("open({})", dir_path), errno);
  DMX_RETURN_IF_ERROR(check_dir(dir.get(), dir_path, /*holds_key=*/false));
  return create_key_file(dir.get(), name, path);
}

// The default key file, <config>/dmx/auth.key, made on first use. Every step through a descriptor:
// nothing can be swapped between the checks and the use.
Result<std::vector<unsigned char>> default_key(std::string* path) {
  DMX_ASSIGN_OR_RETURN(std::string config_dir, default_config_dir());
  *path = config_dir + "/dmx/auth.key";
  if (::mkdir(config_dir.c_str(), 0700) != 0 && errno != EEXIST)
    return errno_status(fmt::format("mkdir({}) for the dmx key file (set DMX_AUTH_KEY or DMX_AUTH_KEY_FILE to use "
                                    "another)",
                                    config_dir),
                        errno, Code::kAuth);
  UniqueFd config(::open(config_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!config.valid()) return errno_status(fmt::format("open({})", config_dir), errno, Code::kAuth);
  DMX_RETURN_IF_ERROR(check_dir(config.get(), config_dir, /*holds_key=*/false));
  DMX_ASSIGN_OR_RETURN(UniqueFd dir, open_key_dir(config.get(), "dmx", config_dir + "/dmx"));
  auto fd = open_key(dir.get(), "auth.key", *path, /*follow=*/false);
  if (fd.ok()) return read_key_fd(fd->get(), *path);
  if (fd.status().code() != Code::kNotFound) return fd.status();
  return create_key_file(dir.get(), "auth.key", *path);
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
  auto secret = path.empty() ? default_key(&path) : named_key(path, config.get_bool("auth_key_create"));
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
