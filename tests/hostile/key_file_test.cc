// The key file decides who may connect: a named file that is missing is not silently replaced by a
// new key (nor are its directories made), and a file other users can read, or that belongs to
// someone else, is refused with a message that says how to fix it. A key file that is not a
// regular file is refused at once (a FIFO once blocked start-up), and the default key is never put
// in a shared place (/tmp) nor made through another user's link or folder.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pwd.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>

#include "hostile/hostile_util.h"
#include "hostile/key_helper_path.h"
#include "test_env.h"

namespace dmx::test {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/dmx-keyfile-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
};

Result<Context> with_key_file(const fs::path& file, bool create = false) {
  Options o;
  o.set("auth_key_file", file.string()).set("log_level", "off");
  if (create) o.set("auth_key_create", "true");
  return Context::create(o);
}

void write_key(const fs::path& file, mode_t mode) {
  std::ofstream(file) << "0123456789abcdef0123456789abcdef\n";
  ASSERT_EQ(::chmod(file.c_str(), mode), 0);
}

TEST(KeyFile, NamedFileThatIsMissingIsRefusedAndNothingIsCreated) {
  TempDir t;
  fs::path file = t.path / "no" / "such" / "auth.key";
  auto c = with_key_file(file);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kAuth);
  EXPECT_NE(c.status().message().find("does not exist"), std::string::npos) << c.status().to_string();
  EXPECT_NE(c.status().message().find("auth_key_create"), std::string::npos) << c.status().to_string();
  EXPECT_FALSE(fs::exists(t.path / "no")) << "directories were made for a key nobody asked for";
}

TEST(KeyFile, MissingFileIsCreatedPrivateOnlyWhenAsked) {
  TempDir t;
  fs::path file = t.path / "keys" / "auth.key";
  auto c = with_key_file(file, /*create=*/true);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto again = with_key_file(file);  // now it exists: used as it is
  EXPECT_TRUE(again.ok()) << again.status().to_string();
}

TEST(KeyFile, FileOthersCanReadIsRefused) {
  TempDir t;
  for (mode_t mode : {0644, 0640, 0604, 0660}) {
    fs::path file = t.path / ("k" + std::to_string(mode));
    write_key(file, mode);
    auto c = with_key_file(file);
    ASSERT_FALSE(c.ok()) << std::oct << mode;
    EXPECT_EQ(c.status().code(), Code::kAuth);
    EXPECT_NE(c.status().message().find("chmod 600"), std::string::npos) << c.status().to_string();
  }
  fs::path ok = t.path / "private";
  write_key(ok, 0600);
  EXPECT_TRUE(with_key_file(ok).ok());
}

TEST(KeyFile, FileOfAnotherUserIsRefused) {
  if (::geteuid() != 0) DMX_SKIP(::dmx::test::kNoCapability) << "not root, so cannot give a file to another user";
  TempDir t;
  fs::path file = t.path / "theirs";
  write_key(file, 0600);
  ASSERT_EQ(::chown(file.c_str(), 65534, 65534), 0);  // nobody
  auto c = with_key_file(file);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("belongs to user 65534"), std::string::npos) << c.status().to_string();
}

// Context::create on another thread, bounded: a key file that blocks the open must not hang the test.
Result<Context> create_within(const fs::path& file, std::chrono::seconds bound, const std::function<void()>& unblock) {
  auto job = std::async(std::launch::async, [&] { return with_key_file(file); });
  if (job.wait_for(bound) == std::future_status::ready) return job.get();
  unblock();  // let the stuck open return, so that the thread can be joined
  (void)job.get();
  return Status(Code::kTimeout, fmt::format("Context::create did not return within {} s", bound.count()));
}

TEST(KeyFile, FifoIsRefusedAtOnceNamingWhatItIs) {
  TempDir t;
  fs::path fifo = t.path / "auth.key";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto c = create_within(fifo, std::chrono::seconds(10), [&] {
    int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);  // the reader is there: succeeds
    if (w >= 0) ::close(w);
  });
  ASSERT_FALSE(c.ok());
  ASSERT_NE(c.status().code(), Code::kTimeout) << "a FIFO as the key file blocked start-up";
  EXPECT_EQ(c.status().code(), Code::kAuth) << c.status().to_string();
  EXPECT_NE(c.status().message().find(fifo.string()), std::string::npos) << c.status().to_string();
  EXPECT_NE(c.status().message().find("FIFO"), std::string::npos) << c.status().to_string();
}

TEST(KeyFile, DirectoryAndSocketAreRefusedNamingWhatTheyAre) {
  TempDir t;
  fs::path dir = t.path / "dir.key";
  ASSERT_TRUE(fs::create_directory(dir));
  auto c = with_key_file(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(dir.string() + " is a directory"), std::string::npos) << c.status().to_string();
  fs::path sock = t.path / "sock.key";
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", sock.c_str());
  ASSERT_EQ(::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  c = with_key_file(sock);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(sock.string()), std::string::npos) << c.status().to_string();
  EXPECT_NE(c.status().message().find("socket"), std::string::npos) << c.status().to_string();
}

// What the helper printed, and its exit status; bounded (it only makes a Context).
struct HelperRun {
  int rc = -1;
  std::vector<std::string> lines;
};

HelperRun run_helper(std::vector<std::string> args, const std::vector<std::string>& env) {
  HelperRun r;
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return r;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  args.insert(args.begin(), DMX_KEY_HOME_HELPER_PATH);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_copy = env;
  for (auto& e : env_copy) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  int spawned = ::posix_spawn(&pid, DMX_KEY_HOME_HELPER_PATH, &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  if (spawned != 0) {
    ::close(out[0]);
    return r;
  }
  std::string text;
  char buf[4096];
  for (auto until = Clock::now() + std::chrono::seconds(60); Clock::now() < until;) {
    pollfd p{out[0], POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  ::kill(pid, SIGKILL);  // no-op when it has exited
  int st = 0;
  ::waitpid(pid, &st, 0);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    r.lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return r;
}

std::string joined(const HelperRun& r) {
  std::string s = fmt::format("rc {}:", r.rc);
  for (const auto& l : r.lines) s += "\n  " + l;
  return s;
}

// With HOME and XDG_CONFIG_HOME unset (a service, `env -i`), the key goes to the passwd entry's
// home, never to /tmp, where another user could have planted the folder first.
TEST(KeyFile, WithoutHomeTheKeyGoesToThePasswdHomeNotTmp) {
  if (::geteuid() != 0) DMX_SKIP(::dmx::test::kNoCapability) << "needs root to give the helper a private /tmp and home";
  const passwd* pw = ::getpwuid(::geteuid());
  ASSERT_NE(pw, nullptr);
  std::string home_key = std::string(pw->pw_dir) + "/.config/dmx/auth.key";
  HelperRun r = run_helper({"--private-tmp-and-home", "--", home_key, "/tmp/.config/dmx/auth.key", "/tmp/.config"},
                           {"PATH=/usr/bin:/bin"});
  if (r.rc == 77) DMX_SKIP(::dmx::test::kNoCapability) << joined(r);
  ASSERT_EQ(r.rc, 0) << joined(r);
  ASSERT_EQ(r.lines.size(), 4u) << joined(r);
  EXPECT_EQ(r.lines[0], "ok") << joined(r);
  EXPECT_EQ(r.lines[1], "exists 600") << "the key is in the passwd home: " << joined(r);
  EXPECT_EQ(r.lines[2], "absent") << "the key was put in /tmp: " << joined(r);
  EXPECT_EQ(r.lines[3], "absent") << joined(r);
}

// A user with no passwd entry and no HOME: refused, saying how to give a key.
TEST(KeyFile, WithoutAnyHomeTheKeyIsRefusedWithWhatToSet) {
  if (::geteuid() != 0) DMX_SKIP(::dmx::test::kNoCapability) << "needs root to run the helper as a user without a passwd entry";
  uid_t stranger = 54321;
  while (::getpwuid(stranger) != nullptr) ++stranger;
  HelperRun r =
      run_helper({"--private-tmp-and-home", "--uid", std::to_string(stranger), "--", "/tmp/.config/dmx/auth.key"},
                 {"PATH=/usr/bin:/bin"});
  if (r.rc == 77) DMX_SKIP(::dmx::test::kNoCapability) << joined(r);
  ASSERT_EQ(r.rc, 0) << joined(r);
  ASSERT_EQ(r.lines.size(), 2u) << joined(r);
  EXPECT_EQ(r.lines[0].rfind("error authentication failed: ", 0), 0u) << joined(r);
  EXPECT_NE(r.lines[0].find("DMX_AUTH_KEY"), std::string::npos) << joined(r);
  EXPECT_NE(r.lines[0].find("DMX_AUTH_KEY_FILE"), std::string::npos) << joined(r);
  EXPECT_EQ(r.lines[1], "absent") << "the key was put in /tmp: " << joined(r);
}

// The default key's folder, <config>/dmx, planted by another user — as a link to their folder, or
// as their folder — or a config folder everybody may write: each refused, naming the path.
TEST(KeyFile, PlantedOrSharedFoldersForTheDefaultKeyAreRefused) {
  if (::geteuid() != 0) DMX_SKIP(::dmx::test::kNoCapability) << "needs root to give files to another user";
  TempDir t;
  const uid_t nobody = 65534;
  struct Case {
    std::string name;
    fs::path config;
    std::string expect;
  };
  std::vector<Case> cases;
  {  // a link planted by another user, to a folder of theirs
    fs::path config = t.path / "link", theirs = t.path / "theirs";
    fs::create_directories(config);
    fs::create_directories(theirs);
    ASSERT_EQ(::chown(theirs.c_str(), nobody, nobody), 0);
    ASSERT_EQ(::chmod(theirs.c_str(), 0777), 0);
    fs::create_directory_symlink(theirs, config / "dmx");
    ASSERT_EQ(::lchown((config / "dmx").c_str(), nobody, nobody), 0);
    cases.push_back({"link", config, (config / "dmx").string() + " (for the dmx key) is a symbolic link"});
  }
  {  // another user's folder
    fs::path config = t.path / "foreign";
    fs::create_directories(config / "dmx");
    ASSERT_EQ(::chown((config / "dmx").c_str(), nobody, nobody), 0);
    cases.push_back({"foreign", config, "belongs to user 65534"});
  }
  {  // ours, but others may write in it
    fs::path config = t.path / "open";
    fs::create_directories(config / "dmx");
    ASSERT_EQ(::chmod((config / "dmx").c_str(), 0777), 0);
    cases.push_back({"writable", config, "is writable by other users"});
  }
  {  // a config folder everybody may write in, as /tmp
    fs::path config = t.path / "shared";
    fs::create_directories(config);
    ASSERT_EQ(::chmod(config.c_str(), 01777), 0);
    cases.push_back({"shared", config, config.string() + " (for the dmx key) is writable by other users"});
  }
  for (const Case& c : cases) {
    fs::path key = c.config / "dmx" / "auth.key";
    HelperRun r = run_helper({"--", key.string()},
                             {"PATH=/usr/bin:/bin", "XDG_CONFIG_HOME=" + c.config.string(), "HOME=/nonexistent-home"});
    ASSERT_EQ(r.rc, 0) << c.name << ": " << joined(r);
    ASSERT_EQ(r.lines.size(), 2u) << c.name << ": " << joined(r);
    EXPECT_EQ(r.lines[0].rfind("error authentication failed: ", 0), 0u) << c.name << ": " << joined(r);
    EXPECT_NE(r.lines[0].find(c.expect), std::string::npos) << c.name << ": " << joined(r);
    EXPECT_EQ(r.lines[1], "absent") << c.name << ": a key was made there: " << joined(r);
  }
  // Beside them, a folder of our own is used (and made private).
  fs::path mine = t.path / "mine";
  HelperRun r = run_helper({"--", (mine / "dmx" / "auth.key").string(), (mine / "dmx").string()},
                           {"PATH=/usr/bin:/bin", "XDG_CONFIG_HOME=" + mine.string()});
  ASSERT_EQ(r.lines.size(), 3u) << joined(r);
  EXPECT_EQ(r.lines[0], "ok") << joined(r);
  EXPECT_EQ(r.lines[1], "exists 600") << joined(r);
  EXPECT_EQ(r.lines[2], "exists 700") << joined(r);
}

}  // namespace
}  // namespace dmx::test
