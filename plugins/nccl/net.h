// net.h — the NCCL net plugin over the public dmx API, independent of the ABI version.
//
// One dmx Context per process (made at the first init, never destroyed: NCCL may call into the
// plugin until the process exits). Each send or receive comm is one dmx Endpoint over TCP; each
// listen comm is one dmx Listener. Sends and receives match in posting order per comm: a message
// travels under the dmx tag (NCCL tag, how many messages with that tag came before), so the k-th
// send with tag t meets the k-th receive buffer with tag t — NCCL's rule for multi-receives.
//
// Threads (docs/nccl-plugin.md): `streams` stream workers per comm on each side (default 2), one
// listener thread per open listen comm, one short-lived thread per connect() in progress.
// NCCL drives a comm from one thread at a time; the functions here are nonetheless safe to call
// from several (each comm has a lock around its request pool).
//
// Errors: a broken connection fails the comm's requests (test() returns ncclRemoteError or
// ncclSystemError, logged once per comm); a receive smaller than its message fails both sides'
// requests (ncclInvalidUsage); misuse (more requests than NCCL may post, a bad handle or pointer)
// is ncclInternalError.
#pragma once

#include <cstddef>
#include <cstdint>

#include "plugins/nccl/nccl_abi.h"

namespace dmx::nccl {

inline constexpr int kMaxRecvs = 8;                       // grouped receives per irecv (maxRecvs)
inline constexpr int kMaxSendRequests = kMaxRequests * kMaxRecvs;  // per send comm (NCCL's README)
inline constexpr int kMaxRecvRequests = kMaxRequests;     // irecv per receive comm; iflush as many again
inline constexpr size_t kMaxMessage = size_t(1) << 30;    // maxP2pBytes / maxCollBytes: test() sizes are int

// Process-wide: the dmx Context, the devices. Idempotent; later calls only update the logger.
NcclResult init_plugin(Logger log);
NcclResult devices(int* ndev);
NcclResult get_properties(int dev, PropertiesV11* props);
NcclResult make_v_device(int* d, VDeviceProps* props);

// v11's per-communicator context (v10 has none: nullptr).
NcclResult ctx_create(void** ctx, uint64_t comm_id, const CommConfig* config);
NcclResult ctx_check(void* ctx);
NcclResult ctx_finalize(void* ctx);
NcclResult ctx_set_net_attr(void* ctx, const NetAttr* attr);
void note_traffic_class(const CommConfig* config);

NcclResult listen(int dev, void* handle, void** listen_comm);
NcclResult connect(int dev, void* handle, void** send_comm);
NcclResult accept(void* listen_comm, void** recv_comm);
NcclResult reg_mr(void* comm, void* data, size_t size, int type, void** mhandle);
NcclResult reg_mr_dma_buf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
NcclResult dereg_mr(void* comm, void* mhandle);
NcclResult isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void** request);
NcclResult irecv(void* recv_comm, int n, void** data, const size_t* sizes, const int* tags, void** mhandles,
             void** request);
NcclResult iflush(void* recv_comm, int n, void** data, const int* sizes, void** mhandles, void** request);
NcclResult test(void* request, int* done, int* sizes);
NcclResult close_send(void* send_comm);
NcclResult close_recv(void* recv_comm);
NcclResult close_listen(void* listen_comm);

}  // namespace dmx::nccl
