// cuda_mps_daemon(): found by its control socket in $CUDA_MPS_PIPE_DIRECTORY, else a reason that
// says where it looked. CUDA-free: runs everywhere.
#include "memory/mps.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace dmx {
namespace {

class MpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dmx-mps-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const char* old = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv("CUDA_MPS_PIPE_DIRECTORY", dir_.c_str(), 1);
  }
  void TearDown() override {
    if (had_)
      ::setenv("CUDA_MPS_PIPE_DIRECTORY", old_.c_str(), 1);
    else
      ::unsetenv("CUDA_MPS_PIPE_DIRECTORY");
    std::filesystem::remove_all(dir_);
  }
  std::string dir_, old_;
  bool had_ = false;
};

TEST_F(MpsTest, NoControlSocketSaysWhereItLooked) {
  auto r = cuda_mps_daemon();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_NE(r.status().message().find(dir_ + "/control"), std::string::npos) << r.status().message();
}

TEST_F(MpsTest, PlainFileIsNotTheDaemon) {
  std::ofstream(dir_ + "/control") << "x";
  EXPECT_FALSE(cuda_mps_daemon().ok());
}

TEST_F(MpsTest, ControlSocketIsFound) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string path = dir_ + "/control";
  ASSERT_LT(path.size(), sizeof addr.sun_path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  auto r = cuda_mps_daemon();
  ::close(fd);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, path);
}

}  // namespace
}  // namespace dmx
