// harness.h — drives libnccl-net-dmx.so the way NCCL's proxy thread does: dlopen, the versioned
// symbol, init, listen / connect / accept polling, regMr, isend / irecv / test loops. Used by the
// test binary and by its peer process (nccl_peer.cc), so both ends run the same code.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "plugins/nccl/nccl_abi.h"

namespace dmx::nccl::test {

// One loaded plugin seen through one ABI version (10 or 11).
struct Api {
  int version = 0;
  NetV10* v10 = nullptr;
  NetV11* v11 = nullptr;
  void* ctx = nullptr;  // v11's context from init

  // dlopen(path) and the symbol of `version`; empty string when fine, else why not.
  std::string load(const std::string& path, int version);
  NcclResult init();
  NcclResult finalize();
  NcclResult devices(int* n);
  NcclResult properties(int dev, PropertiesV11* p);  // v10: the v10 fields, the rest zero
  NcclResult listen(int dev, void* handle, void** lc);
  NcclResult connect(int dev, void* handle, void** sc);
  NcclResult accept(void* lc, void** rc);
  NcclResult reg_mr(void* comm, void* data, size_t size, int type, void** mh);
  NcclResult reg_mr_dma_buf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mh);
  NcclResult dereg_mr(void* comm, void* mh);
  NcclResult isend(void* sc, void* data, size_t size, int tag, void* mh, void** req);
  NcclResult irecv(void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs, void** req);
  NcclResult iflush(void* rc, int n, void** data, int* sizes, void** mhs, void** req);
  NcclResult test(void* req, int* done, int* sizes);
  NcclResult close_send(void* c);
  NcclResult close_recv(void* c);
  NcclResult close_listen(void* c);
};

// The log lines the plugin wrote through NCCL's logger (the harness's logger keeps them).
std::vector<std::string> logged_lines();
Logger harness_logger();

// Polls connect / accept until a comm comes (or an error, or `seconds` pass).
NcclResult connect_until(Api& api, int dev, void* handle, void** sc, double seconds = 20);
NcclResult accept_until(Api& api, void* lc, void** rc, double seconds = 20);

// The messages one run moves: groups, each one irecv of n buffers; the sender sends a group's
// messages in a shuffled order. Sizes odd, zero, below and above the eager limit; receive buffers
// as large as or larger than their message.
struct Msg {
  size_t size = 0;
  size_t recv_size = 0;
  int tag = 0;
  size_t offset = 0;  // of its buffer in the side's one registered region
};
struct Plan {
  std::vector<std::vector<Msg>> groups;  // in receive (posting) order
  std::vector<Msg> send_order;           // in send (posting) order
  size_t region_bytes = 0;
};
Plan make_plan(uint64_t seed, int groups, int max_recvs);
// The bytes message `m` carries in run `seed`: fresh random data per run.
void fill(uint64_t seed, const Msg& m, unsigned char* out);

// The env both processes set before init: loopback device, a shared key, fast death detection.
void set_test_env();

}  // namespace dmx::nccl::test

namespace dmx::nccl::test {

// One side of a run: its comm and its one registered region (host, or CUDA device memory).
struct Side {
  Api* api = nullptr;
  void* comm = nullptr;
  unsigned char* base = nullptr;
  void* mh = nullptr;
  bool cuda = false;
};

// Posts the plan's sends (at most `window` in flight) or receives (at most `window` irecvs in
// flight) and tests until all are done; the receiver checks every size and byte, and that nothing
// was written past a message. "" when all went well, else what failed first.
std::string run_sends(Side& s, const Plan& plan, uint64_t seed, int window, double seconds = 30);
std::string run_recvs(Side& s, const Plan& plan, uint64_t seed, int window, double seconds = 30);

// Region helpers: host or CUDA memory of `bytes`, and copying to and from it.
enum class RegionKind {
  kHost,
  kCuda,       // cudaMalloc
  kNcclCuMem,  // as NCCL allocates its buffers: one cuMem allocation that only its device may
               // access, registered by dma-buf (regMrDmaBuf) where the driver exports one
};
struct Region {
  std::vector<unsigned char> host;
  void* device = nullptr;  // a dmx::Buffer's memory when CUDA
  int gpu = 0;
  RegionKind kind = RegionKind::kHost;
  std::shared_ptr<void> owner;
  unsigned char* data() { return device ? static_cast<unsigned char*>(device) : host.data(); }
};
std::string make_region(bool cuda, size_t bytes, Region* out);  // host, or cudaMalloc on cuda:0
std::string make_region(RegionKind kind, int gpu, size_t bytes, Region* out);
// Registers the region with `comm` as NCCL would: regMr (host: NCCL_PTR_HOST; CUDA:
// NCCL_PTR_CUDA), or for kNcclCuMem regMrDmaBuf with a dma-buf of it, closed right after (NCCL
// closes its fd after the call). *how says which ("regMr", "regMrDmaBuf", or regMr and why no
// dma-buf).
std::string register_region(Api& api, void* comm, Region& r, size_t bytes, void** mh, std::string* how = nullptr);
// Makes `gpu` the calling thread's current device, as NCCL's proxy thread does for its rank's GPU
// (cudaSetDevice); "" when done, else why not.
std::string use_gpu(int gpu);
// The number of CUDA devices, or 0 (with *why) when none can be used.
int gpu_count(std::string* why);
std::string write_region(Region& r, const std::vector<unsigned char>& bytes);
std::string read_region(Region& r, std::vector<unsigned char>* bytes);

// The sender's region for a plan: every message's bytes at its offset, poison elsewhere.
std::vector<unsigned char> sender_bytes(const Plan& plan, uint64_t seed);
// Checks the receiver's region: each message byte-exact, the rest of each buffer still poison.
std::string verify(const std::vector<unsigned char>& got, const Plan& plan, uint64_t seed);

}  // namespace dmx::nccl::test
