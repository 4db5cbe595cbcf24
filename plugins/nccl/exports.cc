// The two symbols NCCL looks up: ncclNetPlugin_v11 (NCCL 2.28-2.30) and ncclNetPlugin_v10
// (2.26-2.27, and later ones that fall back). Both are thin adapters over net.h; only these two
// symbols leave the library (exports.map).
#include <cstddef>
#include <cstring>

#include "plugins/nccl/net.h"

namespace dmx::nccl {
namespace {

// ---- v10: one process-wide init (NCCL reference-counts it), no context ----
NcclResult v10_init(Logger log, ProfilerCallback) { return init_plugin(log); }
NcclResult v10_get_properties(int dev, PropertiesV10* props) {
  if (props == nullptr) return kInternalError;
  PropertiesV11 p11;
  NcclResult r = get_properties(dev, &p11);
  if (r != kSuccess) return r;
  static_assert(offsetof(PropertiesV11, max_coll_bytes) == offsetof(PropertiesV10, max_coll_bytes));
  std::memcpy(props, &p11, sizeof *props);  // v10 is v11 without its last field
  return kSuccess;
}
NcclResult v10_listen(int dev, void* handle, void** listen_comm) { return listen(dev, handle, listen_comm); }
NcclResult v10_connect(int dev, CommConfig* config, void* handle, void** send_comm, DeviceHandle**) {
  note_traffic_class(config);
  return connect(dev, handle, send_comm);
}
NcclResult v10_make_v_device(int* d, VDeviceProps* props) { return make_v_device(d, props); }

// ---- v11: init per communicator, with a context ----
NcclResult v11_init(void** ctx, uint64_t comm_id, CommConfig* config, Logger log, ProfilerCallback) {
  NcclResult r = init_plugin(log);
  if (r != kSuccess) return r;
  return ctx_create(ctx, comm_id, config);
}
NcclResult v11_listen(void* ctx, int dev, void* handle, void** listen_comm) {
  if (ctx_check(ctx) != kSuccess) return kInternalError;
  return listen(dev, handle, listen_comm);
}
NcclResult v11_connect(void* ctx, int dev, void* handle, void** send_comm, DeviceHandle**) {
  if (ctx_check(ctx) != kSuccess) return kInternalError;
  return connect(dev, handle, send_comm);
}
NcclResult v11_set_net_attr(void* ctx, NetAttr* attr) { return ctx_set_net_attr(ctx, attr); }

// ---- shared by both ----
NcclResult accept_any(void* listen_comm, void** recv_comm, DeviceHandle**) { return accept(listen_comm, recv_comm); }
NcclResult isend_any(void* c, void* data, size_t size, int tag, void* mh, void*, void** request) {
  return isend(c, data, size, tag, mh, request);
}
NcclResult irecv_any(void* c, int n, void** data, size_t* sizes, int* tags, void** mhs, void**, void** request) {
  return irecv(c, n, data, sizes, tags, mhs, request);
}
NcclResult iflush_any(void* c, int n, void** data, int* sizes, void** mhs, void** request) {
  return iflush(c, n, data, sizes, mhs, request);
}

}  // namespace
}  // namespace dmx::nccl

using namespace dmx::nccl;

extern "C" {

// Not const: NCCL receives a plain pointer to these and never needs to write, but a read-only page
// would turn any such write into a crash inside NCCL.
__attribute__((visibility("default"))) NetV11 ncclNetPlugin_v11 = {
    .name = "dmx",
    .init = v11_init,
    .devices = devices,
    .get_properties = get_properties,
    .listen = v11_listen,
    .connect = v11_connect,
    .accept = accept_any,
    .reg_mr = reg_mr,
    .reg_mr_dma_buf = reg_mr_dma_buf,
    .dereg_mr = dereg_mr,
    .isend = isend_any,
    .irecv = irecv_any,
    .iflush = iflush_any,
    .test = test,
    .close_send = close_send,
    .close_recv = close_recv,
    .close_listen = close_listen,
    .get_device_mr = nullptr,  // no device offload: NCCL calls these when they are set
    .irecv_consumed = nullptr,
    .make_v_device = make_v_device,
    .finalize = ctx_finalize,
    .set_net_attr = v11_set_net_attr,
};

__attribute__((visibility("default"))) NetV10 ncclNetPlugin_v10 = {
    .name = "dmx",
    .init = v10_init,
    .devices = devices,
    .get_properties = v10_get_properties,
    .listen = v10_listen,
    .connect = v10_connect,
    .accept = accept_any,
    .reg_mr = reg_mr,
    .reg_mr_dma_buf = reg_mr_dma_buf,
    .dereg_mr = dereg_mr,
    .isend = isend_any,
    .irecv = irecv_any,
    .iflush = iflush_any,
    .test = test,
    .close_send = close_send,
    .close_recv = close_recv,
    .close_listen = close_listen,
    .get_device_mr = nullptr,  // no device offload: NCCL calls these when they are set
    .irecv_consumed = nullptr,
    .make_v_device = v10_make_v_device,
};

}  // extern "C"
