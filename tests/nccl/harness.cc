#include "tests/nccl/harness.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace dmx::nccl::test {

namespace {

std::mutex g_log_mu;
std::vector<std::string>* g_lines = new std::vector<std::string>;  // reachable until exit

void logger(LogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(g_log_mu);
  g_lines->push_back(std::string(level == kLogWarn ? "WARN " : "INFO ") + buf);
  if (std::getenv("DMX_NCCL_TEST_LOG") != nullptr) std::fprintf(stderr, "%s\n", g_lines->back().c_str());
}

bool expired(std::chrono::steady_clock::time_point t0, double seconds) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds;
}

}  // namespace

std::vector<std::string> logged_lines() {
  std::lock_guard<std::mutex> lock(g_log_mu);
  return *g_lines;
}
Logger harness_logger() { return logger; }

std::string Api::load(const std::string& path, int v) {
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return std::string("dlopen: ") + ::dlerror();
  version = v;
  const char* sym = v == 11 ? "ncclNetPlugin_v11" : "ncclNetPlugin_v10";
  void* p = ::dlsym(lib, sym);
  if (p == nullptr) return std::string("dlsym(") + sym + "): " + ::dlerror();
  if (v == 11) v11 = static_cast<NetV11*>(p);
  else v10 = static_cast<NetV10*>(p);
  return {};
}

NcclResult Api::init() {
  if (v11) return v11->init(&ctx, 0x1234, nullptr, logger, nullptr);
  return v10->init(logger, nullptr);
}
NcclResult Api::finalize() {
  if (v11) return v11->finalize(ctx);
  return kSuccess;  // v10 has none
}
NcclResult Api::devices(int* n) { return v11 ? v11->devices(n) : v10->devices(n); }
NcclResult Api::properties(int dev, PropertiesV11* p) {
  std::memset(p, 0, sizeof *p);
  if (v11) return v11->get_properties(dev, p);
  return v10->get_properties(dev, reinterpret_cast<PropertiesV10*>(p));
}
NcclResult Api::listen(int dev, void* h, void** lc) { return v11 ? v11->listen(ctx, dev, h, lc) : v10->listen(dev, h, lc); }
NcclResult Api::connect(int dev, void* h, void** sc) {
  DeviceHandle* dh = nullptr;
  if (v11) return v11->connect(ctx, dev, h, sc, &dh);
  CommConfig cfg{-1};
  return v10->connect(dev, &cfg, h, sc, &dh);
}
NcclResult Api::accept(void* lc, void** rc) {
  DeviceHandle* dh = nullptr;
  return v11 ? v11->accept(lc, rc, &dh) : v10->accept(lc, rc, &dh);
}
NcclResult Api::reg_mr(void* c, void* d, size_t s, int t, void** mh) {
  return v11 ? v11->reg_mr(c, d, s, t, mh) : v10->reg_mr(c, d, s, t, mh);
}
NcclResult Api::reg_mr_dma_buf(void* c, void* d, size_t s, int t, uint64_t off, int fd, void** mh) {
  return v11 ? v11->reg_mr_dma_buf(c, d, s, t, off, fd, mh) : v10->reg_mr_dma_buf(c, d, s, t, off, fd, mh);
}
NcclResult Api::dereg_mr(void* c, void* mh) { return v11 ? v11->dereg_mr(c, mh) : v10->dereg_mr(c, mh); }
NcclResult Api::isend(void* sc, void* d, size_t s, int tag, void* mh, void** req) {
  return v11 ? v11->isend(sc, d, s, tag, mh, nullptr, req) : v10->isend(sc, d, s, tag, mh, nullptr, req);
}
NcclResult Api::irecv(void* rc, int n, void** d, size_t* s, int* t, void** mhs, void** req) {
  void* ph[8] = {};
  return v11 ? v11->irecv(rc, n, d, s, t, mhs, ph, req) : v10->irecv(rc, n, d, s, t, mhs, ph, req);
}
NcclResult Api::iflush(void* rc, int n, void** d, int* s, void** mhs, void** req) {
  return v11 ? v11->iflush(rc, n, d, s, mhs, req) : v10->iflush(rc, n, d, s, mhs, req);
}
NcclResult Api::test(void* req, int* done, int* sizes) { return v11 ? v11->test(req, done, sizes) : v10->test(req, done, sizes); }
NcclResult Api::close_send(void* c) { return v11 ? v11->close_send(c) : v10->close_send(c); }
NcclResult Api::close_recv(void* c) { return v11 ? v11->close_recv(c) : v10->close_recv(c); }
NcclResult Api::close_listen(void* c) { return v11 ? v11->close_listen(c) : v10->close_listen(c); }

NcclResult connect_until(Api& api, int dev, void* handle, void** sc, double seconds) {
  auto t0 = std::chrono::steady_clock::now();
  *sc = nullptr;
  while (*sc == nullptr) {
    NcclResult r = api.connect(dev, handle, sc);
    if (r != kSuccess) return r;
    if (*sc == nullptr && expired(t0, seconds)) return kSystemError;
    if (*sc == nullptr) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return kSuccess;
}

NcclResult accept_until(Api& api, void* lc, void** rc, double seconds) {
  auto t0 = std::chrono::steady_clock::now();
  *rc = nullptr;
  while (*rc == nullptr) {
    NcclResult r = api.accept(lc, rc);
    if (r != kSuccess) return r;
    if (*rc == nullptr && expired(t0, seconds)) return kSystemError;
    if (*rc == nullptr) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return kSuccess;
}

Plan make_plan(uint64_t seed, int groups, int max_recvs) {
  static constexpr size_t kSizes[] = {0, 1, 7, 255, 4093, 16383, 16385, 65537, 131071, 524289, (1 << 20) + 3};
  std::mt19937_64 gen(seed);
  Plan plan;
  for (int g = 0; g < groups; ++g) {
    // Every fifth group is a multi-receive of 2..max_recvs buffers with distinct tags.
    int n = (g % 5 == 4) ? 2 + static_cast<int>(gen() % static_cast<uint64_t>(max_recvs - 1)) : 1;
    std::vector<Msg> group;
    int tag0 = static_cast<int>(gen() % 1000) - 500;  // negative tags too
    for (int i = 0; i < n; ++i) {
      Msg m;
      m.size = kSizes[gen() % std::size(kSizes)];
      m.recv_size = m.size + ((gen() & 1) ? 0 : gen() % 97);
      m.tag = tag0 + i * 7;
      m.offset = plan.region_bytes;
      plan.region_bytes += (m.recv_size + 63) / 64 * 64 + 64;
      group.push_back(m);
    }
    std::vector<Msg> shuffled = group;
    std::shuffle(shuffled.begin(), shuffled.end(), gen);
    plan.send_order.insert(plan.send_order.end(), shuffled.begin(), shuffled.end());
    plan.groups.push_back(std::move(group));
  }
  return plan;
}

void fill(uint64_t seed, const Msg& m, unsigned char* out) {
  std::mt19937_64 gen(seed ^ (m.offset * 0x9e3779b97f4a7c15ull));
  size_t i = 0;
  for (; i + 8 <= m.size; i += 8) {
    uint64_t v = gen();
    std::memcpy(out + i, &v, 8);
  }
  uint64_t v = gen();
  std::memcpy(out + i, &v, m.size - i);
}

void set_test_env() {
  ::setenv("DMX_NCCL_IFNAME", "=lo", 1);
  ::setenv("DMX_AUTH_KEY", "dmx-nccl-test-key-0123456789", 1);
  ::setenv("DMX_KEEPALIVE_INTERVAL", "200ms", 1);
  ::setenv("DMX_PEER_TIMEOUT", "60s", 1);  // a killed peer is noticed by its death
  ::setenv("DMX_CONNECT_TIMEOUT", "3s", 1);  // a connect to a closed listen comm gives up sooner
  ::setenv("DMX_LOG_LEVEL", "off", 0);
}

}  // namespace dmx::nccl::test
