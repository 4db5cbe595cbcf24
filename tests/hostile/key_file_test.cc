// The key file decides who may connect: a named file that is missing is not silently replaced by a
// new key (nor are its directories made), and a file other users can read, or that belongs to
// someone else, is refused with a message that says how to fix it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "hostile/hostile_util.h"
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

}  // namespace
}  // namespace dmx::test
