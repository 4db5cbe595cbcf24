// A kernel that sends: a CUDA kernel writes a message into a peer's registered GPU memory with
// dmx/device.cuh, waits until it has landed, and the peer is notified (docs/gpu-push.md). Both
// endpoints live in this process here; across processes or hosts the code is the same. Without a
// usable GPU it prints "skipped: <reason>" and exits 0.
#include <dmx/device.cuh>
#include <dmx/dmx.h>

#include <chrono>
#include <cstdio>
#include <cstring>

// One block fills the message, posts the write (with a notification) and waits for it to land.
__global__ void put_message(dmx::DeviceHandle h, char* msg, unsigned len, dmx::DeviceRemote dst, int* result) {
  const char text[] = "hello from a kernel";
  for (unsigned i = threadIdx.x; i < len; i += blockDim.x) msg[i] = i < sizeof text ? text[i] : 0;
  int64_t ticket = dmx::device::block_write(h, msg, len, dst, /*offset=*/0, /*notify=*/true, /*value=*/42);
  int rc = dmx::device::block_wait(h, ticket);  // 0: landed; < 0: -dmx::Code (e.g. the peer died)
  if (threadIdx.x == 0) *result = rc;
}

static int fail(const dmx::Status& status) {
  std::fprintf(stderr, "device_put failed: %s\n", status.to_string().c_str());
  return 1;
}

int main() {
  using std::chrono::seconds;
  const dmx::MemSpec gpu{dmx::MemKind::kCuda, 0};
  if (dmx::Status s = dmx::mem_available(gpu); !s.ok()) {
    std::printf("device_put: skipped: %s\n", s.to_string().c_str());
    return 0;
  }
  constexpr unsigned kLen = 64;
  dmx::Result<dmx::Buffer> target = dmx::Buffer::allocate(gpu, kLen);
  dmx::Result<dmx::Buffer> source = dmx::Buffer::allocate(gpu, kLen);
  if (!target.ok()) return fail(target.status());
  if (!source.ok()) return fail(source.status());

  dmx::Result<dmx::Context> ctx = dmx::Context::create();
  if (!ctx.ok()) return fail(ctx.status());
  dmx::Result<dmx::Listener> listener = ctx->listen("tcp://127.0.0.1:0");
  if (!listener.ok()) return fail(listener.status());
  dmx::Result<dmx::Endpoint> tx = ctx->connect(listener->address());
  if (!tx.ok()) return fail(tx.status());
  dmx::Result<dmx::Endpoint> rx = listener->accept(seconds(10));
  if (!rx.ok()) return fail(rx.status());
  dmx::Result<dmx::Registration> reg = ctx->register_memory(target->region());
  if (!reg.ok()) return fail(reg.status());
  dmx::RemoteRegion remote = reg->remote();  // across processes: send remote.serialize() to the writer

  // One write from the host first: a path's first use sets things up (IPC handles, copy engines)
  // better done before a kernel spins on the device.
  if (dmx::Status s = tx->write(source->region().sub(0, 8), remote, 0).wait(seconds(10)); !s.ok()) return fail(s);
  dmx::Result<dmx::DeviceHandle> handle = tx->device_handle();
  if (!handle.ok()) return fail(handle.status());
  int* result = nullptr;
  if (cudaMalloc(&result, sizeof(int)) != cudaSuccess) return fail(dmx::Status(dmx::Code::kInternal, "cudaMalloc"));
  put_message<<<1, 64>>>(*handle, static_cast<char*>(source->data()), kLen, dmx::DeviceRemote{remote.key, remote.size},
                         result);
  cudaError_t err = cudaDeviceSynchronize();
  int rc = -1;
  if (err == cudaSuccess) err = cudaMemcpy(&rc, result, sizeof rc, cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) return fail(dmx::Status(dmx::Code::kInternal, cudaGetErrorString(err)));
  if (rc != 0) return fail(dmx::Status(static_cast<dmx::Code>(-rc), "the kernel's write failed"));

  dmx::Result<dmx::Notification> note = rx->next_notification(seconds(10));
  if (!note.ok()) return fail(note.status());
  char got[kLen] = {};
  if (dmx::Status s = dmx::copy_memory({got, kLen, {}}, target->region()); !s.ok()) return fail(s);
  if (std::strcmp(got, "hello from a kernel") != 0 || note->value != 42)
    return fail(dmx::Status(dmx::Code::kInternal, "the message or its notification differs"));
  std::printf("device_put: a kernel wrote \"%s\" over %s, notification %llu\n", got, tx->stats().transport.c_str(),
              static_cast<unsigned long long>(note->value));
  (void)cudaFree(result);
  return 0;
}
