// state.h — the plugin's objects behind NCCL's opaque pointers (internal to plugins/nccl).
//
// Each object NCCL holds starts with a magic word, checked on every call, so that a stale or
// foreign pointer is refused with ncclInternalError rather than followed.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dmx/dmx.h"
#include "plugins/nccl/devices.h"
#include "plugins/nccl/net.h"

namespace dmx::nccl {

inline constexpr uint32_t kCommMagic = 0x434d4d43;     // "CMMC"
inline constexpr uint32_t kListenMagic = 0x4e54534c;   // "LSTN"
inline constexpr uint32_t kMemMagic = 0x4d454d52;      // "RMEM"
inline constexpr uint32_t kRequestMagic = 0x51455251;  // "QREQ"
inline constexpr uint32_t kCtxMagic = 0x58544358;      // "XCTX"
// The connector's first message, beside every data tag (those have bit 31 clear).
inline constexpr uint64_t kHelloTag = 0x80000000ull;
inline constexpr uint64_t kHelloMagic = 0x316c63636e786d64ull;  // "dmxnccl1"

// A connect() in progress: dmx's connect blocks, NCCL's must not, so it runs here. It belongs to
// the handle it was started for: the handle's nonce and address are checked with its token.
struct ConnectJob {
  uint64_t nonce = 0;
  std::string address;
  std::thread thread;
  std::atomic<bool> done{false};
  Result<Endpoint> result{Status(Code::kInternal, "connect job not finished")};  // written before `done`
  std::chrono::steady_clock::time_point finished;
};

struct Plugin {
  std::mutex mu;  // guards everything below but the atomics
  bool ready = false;
  Context ctx;
  std::vector<Nic> nics;
  int ptr_support = kPtrHost;
  std::string cuda_reason;  // why NCCL_PTR_CUDA is not offered
  int streams = 2;          // TCP streams (threads) per comm
  int max_comms = 4096;
  float latency_us = 20;
  int speed_mbps = 0;                       // DMX_NCCL_SPEED: reported for every device; 0: each NIC's own
  std::chrono::milliseconds op_timeout{0};  // 0: none
  std::map<uint64_t, std::unique_ptr<ConnectJob>> jobs;  // by token: random, never 0
  std::atomic<bool> dmabuf_noted{false}, traffic_class_noted{false};
};
Plugin& plugin();

struct MemHandle {
  uint32_t magic = kMemMagic;
  MemSpec where;
  uintptr_t base = 0;
  size_t size = 0;
  bool dmabuf = false;  // came through regMrDmaBuf
};

enum class ReqKind : uint8_t { kSend, kRecv, kFlush };

struct Comm;
struct NetRequest {
  uint32_t magic = 0;  // kRequestMagic while NCCL holds it
  ReqKind kind = ReqKind::kSend;
  int n = 0;
  Comm* comm = nullptr;
  std::array<Request, kMaxRecvs> ops;
};

struct Comm {
  uint32_t magic = kCommMagic;
  bool is_send = false;
  int dev = 0;
  std::string peer;
  Endpoint ep;
  std::mutex mu;  // guards the pool, free list, counts and tag sequences
  std::vector<NetRequest> pool;  // fixed size: NCCL holds pointers into it
  std::vector<int> free;
  std::array<int, 3> outstanding{};  // per ReqKind
  std::unordered_map<uint32_t, uint32_t> seq;  // NCCL tag -> messages so far
  std::atomic<bool> error_logged{false};
};

struct ListenComm {
  uint32_t magic = kListenMagic;
  int dev = 0;
  uint64_t nonce = 0;
  Listener listener;
  struct Pending {
    Endpoint ep;
    std::unique_ptr<uint64_t[]> hello;  // 2 words: magic, nonce
    Request recv;
    std::chrono::steady_clock::time_point deadline;
  };
  std::vector<Pending> pending;
};

struct PluginCtx {
  uint32_t magic = kCtxMagic;
  uint64_t comm_id = 0;
  NetAttr attr{};
};

// Makes a comm around a connected endpoint (both directions use it).
Comm* make_comm(Endpoint ep, bool is_send, int dev);
NcclResult close_comm(void* comm, bool is_send);

}  // namespace dmx::nccl
