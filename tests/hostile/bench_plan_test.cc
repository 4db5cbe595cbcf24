// `dmx bench --listen` serves whoever holds the key: a plan is a peer's input like any frame. A plan
// whose window x size wraps 2^64 made the server write past its buffer; now it is refused with a
// reason and the server goes on serving.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "dmx_test_paths.h"
#include "hostile/hostile_util.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kPlanTag = 0xB0000001, kReplyTag = 0xB0000002;  // tools/dmx/bench.h

struct BenchServer {
  pid_t pid = -1;
  int out = -1;  // its stderr, kept open: a closed pipe would end it with SIGPIPE
  std::string address;
  ~BenchServer() {
    if (out >= 0) ::close(out);
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

// Starts `dmx bench --listen` on a fixed-by-the-kernel port and reads the address it prints.
void start(BenchServer& s) {
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  s.pid = ::fork();
  if (s.pid == 0) {
    ::dup2(out[1], 2);
    ::close(out[0]);
    ::setenv("DMX_AUTH_KEY", kHostileKey, 1);
    ::setenv("DMX_LOG_LEVEL", "off", 1);
    ::execl(DMX_BIN_PATH, "dmx", "bench", "--listen", "tcp://127.0.0.1:0", nullptr);
    ::_exit(127);
  }
  ::close(out[1]);
  std::string text;
  char c;
  while (text.find('\n') == std::string::npos && ::read(out[0], &c, 1) == 1) text += c;
  s.out = out[0];
  auto at = text.find("tcp://");
  ASSERT_NE(at, std::string::npos) << text;
  s.address = text.substr(at, text.find_first_of(" \n", at) - at);
}

// Sends one plan and returns the server's reply text.
std::string ask(Endpoint& ep, const std::string& plan) {
  std::string reply(4096, '\0');
  Request r = ep.recv(MemRegion{reply.data(), reply.size(), {}}, kReplyTag);
  EXPECT_TRUE(ep.send(MemRegion{const_cast<char*>(plan.data()), plan.size(), {}}, kPlanTag).wait(10s).ok());
  Status st = r.wait(10s);
  EXPECT_TRUE(st.ok()) << st.to_string();
  reply.resize(r.bytes());
  return reply;
}

std::string plan(const std::string& op, uint64_t size, uint32_t window) {
  return "{\"op\":\"" + op + "\",\"size\":" + std::to_string(size) + ",\"iters\":4,\"window\":" +
         std::to_string(window) + ",\"lat_iters\":0,\"warmup\":0,\"peer_mem\":\"host\",\"verify\":false," +
         "\"checksum\":0,\"quit\":false}";
}

TEST(BenchPlan, WindowTimesSizeThatWrapsIsRefusedAndTheServerGoesOn) {
  BenchServer server;
  start(server);
  ASSERT_FALSE(server.address.empty());
  auto ctx = Context::create(test_options(2));
  ASSERT_TRUE(ctx.ok());
  auto ep = ctx->connect(server.address);
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  // 64 x 2^58 = 2^64: wraps to 0, and a 1-byte buffer would have been written at 2^58 x i.
  for (const char* op : {"send", "write", "read"}) {
    std::string reply = ask(*ep, plan(op, uint64_t{1} << 58, 64));
    EXPECT_NE(reply.find("\"ok\":false"), std::string::npos) << op << ": " << reply;
    EXPECT_NE(reply.find("buffer limit"), std::string::npos) << op << ": " << reply;
  }
  std::string big = ask(*ep, plan("write", UINT64_MAX, 1));
  EXPECT_NE(big.find("buffer limit"), std::string::npos) << big;
  // The server is alive and serves a sane plan on the same endpoint.
  EXPECT_EQ(::waitpid(server.pid, nullptr, WNOHANG), 0) << "the bench server died";
  std::string good = ask(*ep, plan("read", 4096, 1));
  EXPECT_NE(good.find("\"ok\":true"), std::string::npos) << good;
}

}  // namespace
}  // namespace dmx::test
