#include "topo/sysfs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include "core/sys.h"

namespace dmx::topo {

namespace fs = std::filesystem;

SysfsTree::SysfsTree(std::string root) : root_(std::move(root)) {
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  std::error_code ec;
  fs::path c = fs::canonical(root_, ec);
  canonical_root_ = ec ? root_ : c.string();
}

std::string SysfsTree::full(std::string_view rel) const {
  if (rel.empty()) return root_;
  return root_ + "/" + std::string(rel);
}

void SysfsTree::note(std::string_view rel) const {
  if (recording_ && !rel.empty()) recorded_.insert(std::string(rel));
}

Result<std::string> SysfsTree::read_bytes(std::string_view rel, size_t max) const {
  std::string path = full(rel);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) return Status(Code::kNotFound, path + " does not exist");
    return errno_status("open(" + path + ")", err);
  }
  std::string out;
  char buf[4096];
  while (out.size() < max) {
    ssize_t n = ::read(fd.get(), buf, std::min(sizeof(buf), max - out.size()));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status("read(" + path + ")", errno);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  note(rel);
  return out;
}

Result<std::string> SysfsTree::read(std::string_view rel) const {
  DMX_ASSIGN_OR_RETURN(std::string text, read_bytes(rel, 1 << 20));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\t' || text.back() == '\0'))
    text.pop_back();
  return text;
}

Result<std::string> SysfsTree::read_link(std::string_view rel) const {
  std::string path = full(rel);
  char buf[4096];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof(buf) - 1);
  if (n < 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) return Status(Code::kNotFound, path + " does not exist");
    return errno_status("readlink(" + path + ")", err);
  }
  note(rel);
  return std::string(buf, static_cast<size_t>(n));
}

Result<std::string> SysfsTree::resolve(std::string_view rel) const {
  std::error_code ec;
  fs::path c = fs::canonical(full(rel), ec);
  if (ec)
    return Status(ec == std::errc::no_such_file_or_directory ? Code::kNotFound : Code::kIo,
                  "cannot resolve " + full(rel) + ": " + ec.message());
  std::string s = c.string();
  if (s == canonical_root_) return std::string();
  if (s.size() <= canonical_root_.size() || s.compare(0, canonical_root_.size(), canonical_root_) != 0 ||
      s[canonical_root_.size()] != '/')
    return Status(Code::kInvalidArgument, full(rel) + " leads outside the sysfs root " + root_ + " (to " + s + ")");
  // Record every link on the way so that a capture recreates it.
  std::string prefix;
  for (std::string_view rest = rel; !rest.empty();) {
    size_t slash = rest.find('/');
    std::string part(rest.substr(0, slash));
    prefix = prefix.empty() ? part : prefix + "/" + part;
    if (fs::is_symlink(full(prefix), ec)) note(prefix);
    rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  }
  return s.substr(canonical_root_.size() + 1);
}

std::vector<std::string> SysfsTree::list(std::string_view rel) const {
  std::vector<std::string> out;
  std::error_code ec;
  fs::directory_iterator it(full(rel), ec), end;
  if (ec) return out;
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    out.push_back(it->path().filename().string());
  }
  std::sort(out.begin(), out.end());
  if (recording_) recorded_.insert(std::string(rel) + "/");
  return out;
}

bool SysfsTree::exists(std::string_view rel) const {
  struct stat st;
  return ::lstat(full(rel).c_str(), &st) == 0;
}

bool SysfsTree::is_real_dir(std::string_view rel) const {
  struct stat st;
  return ::lstat(full(rel).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Status capture_tree(const SysfsTree& tree, const std::string& dest) {
  std::error_code ec;
  fs::create_directories(dest, ec);
  if (ec) return Status(Code::kIo, "cannot create " + dest + ": " + ec.message());
  const std::set<std::string> entries = tree.recorded();  // reading below records again
  for (const std::string& entry : entries) {
    bool is_dir = !entry.empty() && entry.back() == '/';
    std::string rel = is_dir ? entry.substr(0, entry.size() - 1) : entry;
    fs::path src = tree.full(rel);
    fs::path dst = fs::path(dest) / rel;
    fs::create_directories(dst.parent_path(), ec);
    if (ec) return Status(Code::kIo, "cannot create " + dst.parent_path().string() + ": " + ec.message());
    if (fs::is_symlink(src, ec)) {
      fs::path target = fs::read_symlink(src, ec);
      if (ec) return Status(Code::kIo, "readlink(" + src.string() + "): " + ec.message());
      if (fs::is_symlink(dst) || fs::exists(dst)) continue;
      fs::create_symlink(target, dst, ec);
      if (ec) return Status(Code::kIo, "symlink(" + dst.string() + "): " + ec.message());
      continue;
    }
    if (is_dir) {
      fs::create_directories(dst, ec);
      if (ec) return Status(Code::kIo, "cannot create " + dst.string() + ": " + ec.message());
      continue;
    }
    // sysfs files report a fixed size; read them the way discovery did.
    auto bytes = tree.read_bytes(rel, 1 << 20);
    if (!bytes.ok()) return bytes.status();
    UniqueFd fd(::open(dst.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) return errno_status("open(" + dst.string() + ")", errno);
    size_t done = 0;
    while (done < bytes->size()) {
      ssize_t n = ::write(fd.get(), bytes->data() + done, bytes->size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno_status("write(" + dst.string() + ")", errno);
      }
      done += static_cast<size_t>(n);
    }
  }
  return Status();
}

}  // namespace dmx::topo
