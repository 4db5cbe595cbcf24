// The Unix-socket side channel: fd passing with strict validation, credentials, deadlines, EOF.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cstring>

#include "transport/side_channel.h"
#include "transport/transport_test_util.h"
#include "test_env.h"

namespace dmx {
namespace {

using testing::secs;

size_t open_fds() {
  size_t n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

std::vector<std::byte> msg(std::string_view s) {
  std::vector<std::byte> v(s.size());
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}

TEST(UnixChannel, PassesFdsAndCredentials) {
  auto p = UnixChannel::pair();
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  auto& [a, b] = *p;
  EXPECT_EQ(a.peer_pid(), ::getpid());
  EXPECT_EQ(a.peer_uid(), ::geteuid());
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  UniqueFd r(pipefd[0]), w(pipefd[1]);
  int fds[1] = {w.get()};
  ASSERT_TRUE(a.send(msg("hello"), fds, secs(5)).ok());
  std::vector<std::byte> got;
  std::vector<UniqueFd> got_fds;
  Status s = b.recv(&got, 1, &got_fds, secs(5));
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_EQ(got.size(), 5u);
  ASSERT_EQ(got_fds.size(), 1u);
  ASSERT_EQ(::write(got_fds[0].get(), "x", 1), 1);  // the received fd is the pipe's write end
  char c = 0;
  ASSERT_EQ(::read(r.get(), &c, 1), 1);
  EXPECT_EQ(c, 'x');
  EXPECT_TRUE(fcntl(got_fds[0].get(), F_GETFD) & FD_CLOEXEC);
}

TEST(UnixChannel, UnexpectedFdsAreRejectedAndClosed) {
  auto p = UnixChannel::pair();
  ASSERT_TRUE(p.ok());
  auto& [a, b] = *p;
  size_t before = open_fds();
  int fds[3] = {0, 1, 2};
  ASSERT_TRUE(a.send(msg("three"), fds, secs(5)).ok());
  std::vector<std::byte> got;
  std::vector<UniqueFd> got_fds;
  Status s = b.recv(&got, 1, &got_fds, secs(5));
  EXPECT_EQ(s.code(), Code::kProtocol) << s.to_string();
  EXPECT_NE(s.message().find("sent 3 fds, expected 1"), std::string::npos) << s.to_string();
  EXPECT_EQ(open_fds(), before);  // the three duplicates were closed

  ASSERT_TRUE(a.send(msg("none"), {}, secs(5)).ok());
  s = b.recv(&got, 2, &got_fds, secs(5));
  EXPECT_EQ(s.code(), Code::kProtocol);
}

TEST(UnixChannel, TooManyFdsIsTruncationNotALeak) {
  auto p = UnixChannel::pair();
  ASSERT_TRUE(p.ok());
  auto& [a, b] = *p;
  size_t before = open_fds();
  // A raw sender passing more fds than the receiver makes room for: MSG_CTRUNC.
  constexpr int kMany = 64;
  std::vector<int> fds(kMany, 0);
  char control[CMSG_SPACE(sizeof(int) * kMany)] = {};
  char byte = 'x';
  iovec iov{&byte, 1};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * kMany);
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * kMany);
  ASSERT_EQ(::sendmsg(a.fd(), &m, 0), 1);
  std::vector<std::byte> got;
  std::vector<UniqueFd> got_fds;
  Status s = b.recv(&got, 1, &got_fds, secs(5));
  EXPECT_EQ(s.code(), Code::kProtocol) << s.to_string();
  EXPECT_EQ(open_fds(), before);
}

TEST(UnixChannel, DeadlineAndPeerDeath) {
  auto p = UnixChannel::pair();
  ASSERT_TRUE(p.ok());
  auto& [a, b] = *p;
  std::vector<std::byte> got;
  auto t0 = Clock::now();
  Status s = b.recv(&got, 0, nullptr, Deadline::after(std::chrono::milliseconds(50)));
  EXPECT_EQ(s.code(), Code::kTimeout);
  EXPECT_LT(Clock::now() - t0, test::kLoadSlack);
  EXPECT_TRUE(b.check_peer().ok());

  pid_t child = testing::fork_child([&] { return 0; });  // the child holds a copy of `a`, then exits
  ASSERT_EQ(testing::wait_child(child), 0);
  { UnixChannel gone = std::move(a); }
  s = b.recv(&got, 0, nullptr, secs(5));
  EXPECT_EQ(s.code(), Code::kPeerFailed) << s.to_string();
  EXPECT_NE(s.message().find("pid"), std::string::npos);
  EXPECT_EQ(b.check_peer().code(), Code::kPeerFailed);
}

TEST(UnixListener, AbstractAndFilesystemPathsAcrossProcesses) {
  for (std::string path : {std::string(), std::string("/tmp/dmx-test-") + std::to_string(::getpid()) + ".sock"}) {
    auto l = UnixListener::listen(path);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    std::string where = l->path();
    pid_t child = testing::fork_child([&] {
      auto c = UnixChannel::connect(where, secs(5));
      if (!c.ok()) return 1;
      std::vector<std::byte> got;
      std::vector<UniqueFd> fds;
      if (!c->recv(&got, 1, &fds, secs(5)).ok()) return 2;
      return got.size() == 4 ? 0 : 3;
    });
    auto ch = l->accept(secs(5));
    ASSERT_TRUE(ch.ok()) << ch.status().to_string();
    EXPECT_EQ(ch->peer_pid(), child);
    int fds[1] = {1};
    ASSERT_TRUE(ch->send(msg("ping"), fds, secs(5)).ok());
    EXPECT_EQ(testing::wait_child(child), 0) << where;
  }
  auto missing = UnixChannel::connect("@dmx-no-such-listener-xyz", secs(1));
  EXPECT_FALSE(missing.ok());
  auto l = UnixListener::listen();
  ASSERT_TRUE(l.ok());
  auto none = l->accept(Deadline::after(std::chrono::milliseconds(20)));
  EXPECT_EQ(none.status().code(), Code::kTimeout);
}

}  // namespace
}  // namespace dmx
