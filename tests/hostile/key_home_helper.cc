// Run by key_file_test: makes a Context where the test's own process cannot be — a private /tmp
// and home (its own mount namespace), another user, no HOME — and says what happened to the key.
//
//   dmx_key_home_helper [--private-tmp-and-home] [--uid N] [-- PATH...]
//
// Prints "ok" or "error <status>", then per PATH "exists <mode, octal>" or "absent".
// Exits 77 (printing "skip <why>") when the namespace or the user cannot be made.
#include <grp.h>
#include <pwd.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dmx/dmx.h"

namespace {

int skip(const std::string& why) {
  std::printf("skip %s: %s\n", why.c_str(), std::strerror(errno));
  return 77;
}

}  // namespace

int main(int argc, char** argv) {
  bool private_dirs = false;
  long uid = -1;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--private-tmp-and-home")
      private_dirs = true;
    else if (a == "--uid" && i + 1 < argc)
      uid = std::strtol(argv[++i], nullptr, 10);
    else if (a == "--")
      paths.assign(argv + i + 1, argv + argc), i = argc;
  }
  if (private_dirs) {
    const passwd* pw = ::getpwuid(::geteuid());
    if (pw == nullptr || pw->pw_dir == nullptr) return skip("no passwd entry for this user");
    if (::unshare(CLONE_NEWNS) != 0) return skip("unshare(CLONE_NEWNS)");
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return skip("mount --make-rprivate /");
    if (::mount("tmpfs", "/tmp", "tmpfs", 0, "mode=1777") != 0) return skip("mount tmpfs on /tmp");
    if (::mount("tmpfs", pw->pw_dir, "tmpfs", 0, "mode=0700") != 0)
      return skip(std::string("mount tmpfs on ") + pw->pw_dir);
  }
  if (uid >= 0) {
    auto id = static_cast<uid_t>(uid);
    if (::setgroups(0, nullptr) != 0 || ::setresgid(id, id, id) != 0 || ::setresuid(id, id, id) != 0)
      return skip("setresuid");
  }
  dmx::Options o;
  o.set("log_level", "off");
  auto ctx = dmx::Context::create(o);
  if (ctx.ok())
    std::printf("ok\n");
  else
    std::printf("error %s\n", ctx.status().to_string().c_str());
  for (const std::string& p : paths) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0)
      std::printf("exists %o\n", st.st_mode & 07777);
    else
      std::printf("absent\n");
  }
  return 0;
}
