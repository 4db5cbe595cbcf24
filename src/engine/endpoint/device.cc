// Endpoint::device_handle: the memory of a DeviceHandle and the channel (device/channel.h) whose
// thread posts the kernels' descriptors on this endpoint (docs/gpu-push.md).
//
// The ring and control block are pinned host memory (cudaHostAlloc through Buffer): under unified
// addressing, which every 64-bit CUDA process has, a kernel reaches it at the host's address. The
// ticket counter is device memory of the handle's GPU (device-scope atomics; PCIe offers no
// atomics on host memory here).
#include <fmt/format.h>

#include <cstring>
#include <vector>

#include "device/channel.h"
#include "engine/endpoint/endpoint_impl.h"
#include "transport/cuda_ipc/cuda_ipc.h"

namespace dmx {

namespace {
constexpr size_t kMaxWindows = 64;  // imported per endpoint
}  // namespace

struct DeviceLink {
  DeviceHandleOptions options;
  Buffer host;     // ring, then control
  Buffer tickets;  // device memory
  DeviceHandle handle;
  // Direct puts: the IPC handles of the regions this side exported (made once per allocation),
  // and the peer's regions mapped here. Under device_mu_.
  std::unique_ptr<cuda_ipc::Exporter> exporter;
  std::vector<std::unique_ptr<cuda_ipc::MappedWindow>> windows;
  std::unique_ptr<device::Channel> channel;  // after the buffers: destroyed before them
  ~DeviceLink() { channel.reset(); }
};

namespace {

// Posts on the endpoint it names weakly: the endpoint owns the channel.
class EndpointPoster final : public device::Poster {
 public:
  EndpointPoster(std::weak_ptr<EndpointImpl> ep, int device) : ep_(std::move(ep)), device_(device) {}

  void post(const DeviceDescriptor& d, std::function<void(const Status&)> done) override {
    std::shared_ptr<EndpointImpl> ep = ep_.lock();
    if (!ep) {
      done(Status(Code::kClosed, "the endpoint is gone"));
      return;
    }
    MemRegion src{reinterpret_cast<void*>(d.addr), d.length, MemSpec{MemKind::kCuda, device_}};
    OpOptions o;
    o.on_complete = [done = std::move(done)](const Status& s, size_t) { done(s); };
    if (d.op == static_cast<uint32_t>(DeviceOpKind::kSend)) {
      (void)ep->post_send(src, d.tag, std::move(o));
    } else {
      RemoteRegion dst;
      dst.key = d.tag;
      dst.size = d.remote_size;
      o.notify = (d.flags & kDeviceNotify) != 0;
      o.notify_value = d.notify_value;
      (void)ep->post_write(src, dst, d.offset, std::move(o));
    }
    // If that was the last reference, the endpoint is destroyed here, on the channel's thread;
    // the channel's stop() then hands its thread to the reaper (device/channel.h).
  }

  Status health() override {
    std::shared_ptr<EndpointImpl> ep = ep_.lock();
    if (!ep) return Status(Code::kClosed, "the endpoint is gone");
    return ep->health();
  }

 private:
  std::weak_ptr<EndpointImpl> ep_;
  const int device_;
};

}  // namespace

Result<DeviceHandle> EndpointImpl::device_handle(const DeviceHandleOptions& o) {
  std::lock_guard<std::mutex> lock(device_mu_);
  if (device_link_) {
    const DeviceHandleOptions& had = device_link_->options;
    if (had.device != o.device || had.slots != o.slots || had.timeout != o.timeout ||
        had.notifications != o.notifications)
      return Status(Code::kInvalidArgument,
                    fmt::format("this endpoint already has a device handle (cuda:{}, {} slots) made with other options",
                                had.device, had.slots))
          .with_peer(session_.peer);
    return device_link_->handle;
  }
  if (o.slots < 2 || o.slots > 4096 || (o.slots & (o.slots - 1)) != 0)
    return Status(Code::kInvalidArgument, fmt::format("device handle: slots must be a power of two in 2..4096, not {}",
                                                      o.slots));
  if (o.timeout <= Duration::zero())
    return Status(Code::kInvalidArgument, "device handle: the timeout must be positive");
  DMX_RETURN_IF_ERROR(health());
  MemSpec gpu{MemKind::kCuda, o.device};
  DMX_RETURN_IF_ERROR(mem_available(gpu));
  auto link = std::make_shared<DeviceLink>();
  link->options = o;
  size_t ring_bytes = sizeof(DeviceDescriptor) * o.slots;
  DMX_ASSIGN_OR_RETURN(link->host, Buffer::allocate(MemSpec{MemKind::kPinned, 0}, ring_bytes + sizeof(DeviceControl)));
  DMX_ASSIGN_OR_RETURN(link->tickets, Buffer::allocate(gpu, 64));
  std::vector<unsigned char> zeros(64, 0);
  DMX_RETURN_IF_ERROR(copy_memory(link->tickets.region(), MemRegion{zeros.data(), zeros.size()}));
  auto* ring = static_cast<DeviceDescriptor*>(link->host.data());
  auto* control = reinterpret_cast<DeviceControl*>(static_cast<char*>(link->host.data()) + ring_bytes);
  device::Channel::Options co;
  co.peer = session_.peer;
  link->channel = std::make_unique<device::Channel>(ring, o.slots, control,
                                                    std::make_shared<EndpointPoster>(weak_from_this(), o.device), co);
  uint64_t timeout_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(o.timeout).count());
  link->handle = DeviceHandle{ring, control, static_cast<unsigned long long*>(link->tickets.data()), o.slots, o.device,
                              timeout_ns};
  if (o.notifications) {
    std::weak_ptr<DeviceLink> weak = link;
    set_note_handler([weak](const Notification& n) {
      if (auto l = weak.lock()) l->channel->notify(n.value);
    });
  }
  link->channel->start();
  device_link_ = link;
  return link->handle;
}

Result<std::vector<unsigned char>> EndpointImpl::export_device_window(const MemRegion& region) {
  std::lock_guard<std::mutex> lock(device_mu_);
  if (!device_link_)
    return Status(Code::kInvalidArgument, "export_device_window: make this endpoint's device_handle first")
        .with_peer(session_.peer);
  DMX_RETURN_IF_ERROR(health());
  if (region.where.kind != MemKind::kCuda || region.ptr == nullptr || region.size == 0)
    return Status(Code::kInvalidArgument, "export_device_window: the region must be CUDA device memory, not empty");
  if (!device_link_->exporter) device_link_->exporter = std::make_unique<cuda_ipc::Exporter>();
  DMX_ASSIGN_OR_RETURN(cuda_ipc::IpcDescriptor d, device_link_->exporter->export_region(region));
  if (d.kind != cuda_ipc::IpcDescriptor::Kind::kIpcHandle)
    return Status(Code::kUnavailable, "export_device_window: the region is a cuMem allocation; device windows take "
                                      "cudaMalloc memory (a legacy IPC handle)");
  if (d.length != region.size)
    return Status(Code::kOutOfRange, fmt::format("export_device_window: {} B at {} runs past its allocation",
                                                 region.size, region.ptr));
  std::vector<std::byte> wire = d.encode();
  std::vector<unsigned char> out(wire.size());
  std::memcpy(out.data(), wire.data(), wire.size());
  return out;
}

Result<DeviceWindow> EndpointImpl::import_device_window(std::span<const unsigned char> bytes) {
  std::lock_guard<std::mutex> lock(device_mu_);
  if (!device_link_)
    return Status(Code::kInvalidArgument, "import_device_window: make this endpoint's device_handle first")
        .with_peer(session_.peer);
  DMX_RETURN_IF_ERROR(health());
  if (device_link_->windows.size() >= kMaxWindows)
    return Status(Code::kResourceExhausted,
                  fmt::format("import_device_window: this endpoint already maps {} windows", kMaxWindows))
        .with_peer(session_.peer);
  auto d = cuda_ipc::IpcDescriptor::decode(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
  if (!d.ok())
    return Status(Code::kProtocol, "import_device_window: not a device window: " + d.status().message())
        .with_peer(session_.peer);
  auto w = cuda_ipc::MappedWindow::open(*d, device_link_->options.device);
  if (!w.ok()) return w.status().with_peer(session_.peer);
  DeviceWindow out{reinterpret_cast<uint64_t>((*w)->data()), (*w)->size()};
  device_link_->windows.push_back(std::move(*w));
  return out;
}

void EndpointImpl::device_stats(EndpointStats* s) const {
  std::lock_guard<std::mutex> lock(device_mu_);
  if (!device_link_ || !device_link_->channel) return;
  device::Channel::Stats c = device_link_->channel->stats();
  s->device_direct_puts = c.direct;
  s->device_direct_bytes = c.direct_bytes;
}

Result<std::vector<unsigned char>> Endpoint::export_device_window(const MemRegion& region) {
  if (!impl_) return Status(Code::kInvalidArgument, "export_device_window on an empty Endpoint");
  return impl_->export_device_window(region);
}

Result<DeviceWindow> Endpoint::import_device_window(std::span<const unsigned char> bytes) {
  if (!impl_) return Status(Code::kInvalidArgument, "import_device_window on an empty Endpoint");
  return impl_->import_device_window(bytes);
}

Result<DeviceHandle> Endpoint::device_handle(const DeviceHandleOptions& options) {
  if (!impl_) return Status(Code::kInvalidArgument, "device_handle on an empty Endpoint");
  return impl_->device_handle(options);
}

}  // namespace dmx
