// `dmx bench --listen` serves whoever holds the key: a plan is a peer's input like any frame. A plan
// whose window x size wraps 2^64 made the server write past its buffer; now it is refused with a
// reason and the server goes on serving.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

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

// Starts `dmx bench --listen` on a fixed-by-the-kernel port, with `extra` arguments, and reads the
// address it prints.
void start(BenchServer& s, std::vector<std::string> extra = {}) {
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  s.pid = ::fork();
  if (s.pid == 0) {
    ::dup2(out[1], 2);
    ::close(out[0]);
    ::setenv("DMX_AUTH_KEY", kHostileKey, 1);
    ::setenv("DMX_LOG_LEVEL", "off", 1);
    std::vector<std::string> args{"dmx", "bench", "--listen", "tcp://127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(DMX_BIN_PATH, argv.data());
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

// The server's plan buffers come out of its peer_memory_budget: a plan over it is refused naming
// the budget (it used to allocate whatever a plan asked, up to 64 GiB). A plan whose client then
// moves no data, and a client that sends no plan, lose their session after --idle-timeout (they
// held the buffer for 300 s), and the budget is given back.
TEST(BenchPlan, PlansAreChargedToTheMemoryBudgetAndIdleOnesDropped) {
  BenchServer server;
  start(server, {"--option", "peer_memory_budget=64M", "--idle-timeout", "1s"});
  ASSERT_FALSE(server.address.empty());
  auto ctx = Context::create(test_options(2));
  ASSERT_TRUE(ctx.ok());
  auto ep = ctx->connect(server.address);
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  std::string over = ask(*ep, plan("write", 40 << 20, 2));  // 80 MiB
  EXPECT_NE(over.find("\"ok\":false"), std::string::npos) << over;
  EXPECT_NE(over.find("peer_memory_budget"), std::string::npos) << over;
  EXPECT_NE(over.find("127.0.0.1"), std::string::npos) << over;
  // 28 MiB fits (one peer may hold half the budget); the client then sends nothing: dropped after
  // about 1 s, not 300.
  std::string held = ask(*ep, plan("write", 28 << 20, 1));
  EXPECT_NE(held.find("\"ok\":true"), std::string::npos) << held;
  auto t0 = Clock::now();
  Status gone = wait_for_failure(*ep, 10s);
  EXPECT_FALSE(gone.ok()) << "the server still holds the idle plan after 10 s";
  std::printf("idle plan dropped after %lld ms: %s\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count()),
              gone.to_string().c_str());
  // Its 28 MiB were given back: another client's 28 MiB plan fits (once the server's close of the
  // idle session, which frees them, has returned; beside them it would be over its share).
  auto again = ctx->connect(server.address);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  std::string next;
  for (auto until = Clock::now() + 10s; Clock::now() < until;) {
    next = ask(*again, plan("read", 28 << 20, 1));
    if (next.find("\"ok\":true") != std::string::npos) break;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_NE(next.find("\"ok\":true"), std::string::npos) << next;
  // A client that sends no plan at all loses its session too.
  auto silent = ctx->connect(server.address);
  ASSERT_TRUE(silent.ok()) << silent.status().to_string();
  EXPECT_FALSE(wait_for_failure(*silent, 10s).ok()) << "a client that sent no plan kept its session";
  EXPECT_EQ(::waitpid(server.pid, nullptr, WNOHANG), 0) << "the bench server died";
}

}  // namespace
}  // namespace dmx::test
