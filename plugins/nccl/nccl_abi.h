// nccl_abi.h — the NCCL net-plugin ABI (versions 10 and 11) as dmx declares it.
//
// Written from the layout of NCCL's public plugin headers (ext-net/example/nccl/net_v10.h and
// src/include/plugin/net/net_v11.h, NCCL 2.26-2.30; see docs/nccl-plugin.md). Only what the
// plugin and its tests use is here. The static_asserts pin the sizes and offsets on LP64, so a
// field moved by mistake fails the build instead of corrupting NCCL's memory.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dmx::nccl {

// ncclResult_t (nccl.h): the values a plugin may return.
enum NcclResult : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
};

// ncclDebugLogLevel and the NCCL_INIT / NCCL_NET subsystem flags.
enum LogLevel : int { kLogNone = 0, kLogVersion = 1, kLogWarn = 2, kLogInfo = 3, kLogAbort = 4, kLogTrace = 5 };
inline constexpr unsigned long kSubsysInit = 1;
inline constexpr unsigned long kSubsysNet = 16;

using Logger = void (*)(LogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...);
using ProfilerCallback = NcclResult (*)(void** event, int type, void* phandle, int64_t plugin_id, void* ext);

inline constexpr size_t kHandleMaxSize = 128;   // NCCL_NET_HANDLE_MAXSIZE
inline constexpr int kMaxRequests = 32;         // NCCL_NET_MAX_REQUESTS
inline constexpr int kPtrHost = 0x1;            // NCCL_PTR_HOST
inline constexpr int kPtrCuda = 0x2;            // NCCL_PTR_CUDA
inline constexpr int kPtrDmaBuf = 0x4;          // NCCL_PTR_DMABUF
inline constexpr int kMaxDevsPerNic = 4;        // NCCL_NET_MAX_DEVS_PER_NIC
inline constexpr uintptr_t kOptionalRecvCompletion = 0x1;  // NCCL_NET_OPTIONAL_RECV_COMPLETION in *request
inline constexpr int kDeviceHost = 0;           // ncclNetDeviceType NCCL_NET_DEVICE_HOST
inline constexpr int kDeviceInvalidVersion = 0;  // NCCL_NET_DEVICE_INVALID_VERSION

struct VDeviceProps {  // ncclNetVDeviceProps_v10_t / _v11_t
  int ndevs;
  int devs[kMaxDevsPerNic];
};

struct CommConfig {  // ncclNetCommConfig_v10_t / _v11_t
  int traffic_class;  // NCCL_NET_TRAFFIC_CLASS_UNDEF (-1) when unset
};

struct PropertiesV10 {  // ncclNetProperties_v10_t
  char* name;
  char* pci_path;
  uint64_t guid;
  int ptr_support;
  int reg_is_global;
  int force_flush;
  int speed;  // Mbps
  int port;
  float latency;  // µs
  int max_comms;
  int max_recvs;
  int net_device_type;
  int net_device_version;
  VDeviceProps v_props;
  size_t max_p2p_bytes;
  size_t max_coll_bytes;
};

struct PropertiesV11 {  // ncclNetProperties_v11_t: v10 plus maxMultiRequestSize
  char* name;
  char* pci_path;
  uint64_t guid;
  int ptr_support;
  int reg_is_global;
  int force_flush;
  int speed;
  int port;
  float latency;
  int max_comms;
  int max_recvs;
  int net_device_type;
  int net_device_version;
  VDeviceProps v_props;
  size_t max_p2p_bytes;
  size_t max_coll_bytes;
  int max_multi_request_size;
};

struct CommAttr {  // ncclNetCommAttr_v11_t
  int32_t max_concurrent_peers;
  int32_t min_concurrent_peers;
  int32_t max_flows_per_peer;
  int32_t min_flows_per_peer;
};

struct NetAttr {  // ncclNetAttr_v11_t
  CommAttr send_comm_attr;
  CommAttr recv_comm_attr;
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
};

struct DeviceHandle;  // ncclNetDeviceHandle_v10_t / _v11_t: only passed by pointer (device offload, unused)

struct NetV10 {  // ncclNet_v10_t
  const char* name;
  NcclResult (*init)(Logger log, ProfilerCallback prof);
  NcclResult (*devices)(int* ndev);
  NcclResult (*get_properties)(int dev, PropertiesV10* props);
  NcclResult (*listen)(int dev, void* handle, void** listen_comm);
  NcclResult (*connect)(int dev, CommConfig* config, void* handle, void** send_comm, DeviceHandle** send_dev_comm);
  NcclResult (*accept)(void* listen_comm, void** recv_comm, DeviceHandle** recv_dev_comm);
  NcclResult (*reg_mr)(void* comm, void* data, size_t size, int type, void** mhandle);
  NcclResult (*reg_mr_dma_buf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  NcclResult (*dereg_mr)(void* comm, void* mhandle);
  NcclResult (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);
  NcclResult (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles,
                  void** request);
  NcclResult (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles, void** request);
  NcclResult (*test)(void* request, int* done, int* sizes);
  NcclResult (*close_send)(void* send_comm);
  NcclResult (*close_recv)(void* recv_comm);
  NcclResult (*close_listen)(void* listen_comm);
  NcclResult (*get_device_mr)(void* comm, void* mhandle, void** dptr_mhandle);
  NcclResult (*irecv_consumed)(void* recv_comm, int n, void* request);
  NcclResult (*make_v_device)(int* d, VDeviceProps* props);
};

struct NetV11 {  // ncclNet_v11_t: init per communicator with a context; finalize; setNetAttr
  const char* name;
  NcclResult (*init)(void** ctx, uint64_t comm_id, CommConfig* config, Logger log, ProfilerCallback prof);
  NcclResult (*devices)(int* ndev);
  NcclResult (*get_properties)(int dev, PropertiesV11* props);
  NcclResult (*listen)(void* ctx, int dev, void* handle, void** listen_comm);
  NcclResult (*connect)(void* ctx, int dev, void* handle, void** send_comm, DeviceHandle** send_dev_comm);
  NcclResult (*accept)(void* listen_comm, void** recv_comm, DeviceHandle** recv_dev_comm);
  NcclResult (*reg_mr)(void* comm, void* data, size_t size, int type, void** mhandle);
  NcclResult (*reg_mr_dma_buf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  NcclResult (*dereg_mr)(void* comm, void* mhandle);
  NcclResult (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);
  NcclResult (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles,
                  void** request);
  NcclResult (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles, void** request);
  NcclResult (*test)(void* request, int* done, int* sizes);
  NcclResult (*close_send)(void* send_comm);
  NcclResult (*close_recv)(void* recv_comm);
  NcclResult (*close_listen)(void* listen_comm);
  NcclResult (*get_device_mr)(void* comm, void* mhandle, void** dptr_mhandle);
  NcclResult (*irecv_consumed)(void* recv_comm, int n, void* request);
  NcclResult (*make_v_device)(int* d, VDeviceProps* props);
  NcclResult (*finalize)(void* ctx);
  NcclResult (*set_net_attr)(void* ctx, NetAttr* attr);
};

// The layout NCCL compiles against (x86-64 and aarch64 Linux: LP64).
static_assert(sizeof(void*) == 8 && sizeof(size_t) == 8, "the NCCL plugin ABI is declared for LP64");
static_assert(sizeof(VDeviceProps) == 20);
static_assert(offsetof(PropertiesV10, guid) == 16);
static_assert(offsetof(PropertiesV10, ptr_support) == 24);
static_assert(offsetof(PropertiesV10, speed) == 36);
static_assert(offsetof(PropertiesV10, latency) == 44);
static_assert(offsetof(PropertiesV10, max_recvs) == 52);
static_assert(offsetof(PropertiesV10, net_device_version) == 60);
static_assert(offsetof(PropertiesV10, v_props) == 64);
static_assert(offsetof(PropertiesV10, max_p2p_bytes) == 88);
static_assert(offsetof(PropertiesV10, max_coll_bytes) == 96);
static_assert(sizeof(PropertiesV10) == 104);
static_assert(offsetof(PropertiesV11, max_coll_bytes) == 96);
static_assert(offsetof(PropertiesV11, max_multi_request_size) == 104);
static_assert(sizeof(PropertiesV11) == 112);
static_assert(sizeof(CommAttr) == 16 && sizeof(NetAttr) == 44 && offsetof(NetAttr, proto) == 40);
static_assert(sizeof(NetV10) == 20 * sizeof(void*));
static_assert(offsetof(NetV10, isend) == 10 * sizeof(void*));
static_assert(offsetof(NetV10, make_v_device) == 19 * sizeof(void*));
static_assert(sizeof(NetV11) == 22 * sizeof(void*));
static_assert(offsetof(NetV11, isend) == 10 * sizeof(void*));
static_assert(offsetof(NetV11, finalize) == 20 * sizeof(void*));
static_assert(offsetof(NetV11, set_net_attr) == 21 * sizeof(void*));

}  // namespace dmx::nccl
