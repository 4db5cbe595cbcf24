// dmx/endpoint.h — a connection to one peer, and the operations on it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dmx/device_handle.h"
#include "dmx/memory.h"
#include "dmx/request.h"

namespace dmx {

class EndpointImpl;

// A region the peer registered and advertised (see Context::register_memory).
struct RemoteRegion {
  uint64_t key = 0;
  uint64_t size = 0;
  // The owner's epoch when it came from Context::lookup (0: unknown, not checked): an operation on
  // an endpoint whose peer has another epoch fails at once (kPeerFailed), nothing is sent. Not in
  // serialize(): a region carried by hand is checked by its random key only (a restarted owner has
  // none of its old keys).
  uint64_t epoch = 0;
  // 16 bytes to carry to the peer any way the application likes (e.g. in a send).
  std::vector<unsigned char> serialize() const;
  static Result<RemoteRegion> parse(const unsigned char* data, size_t len);
};

// One entry of a vectored write or read: `length` bytes between local[local] at `local_offset` and
// remote[remote] at `remote_offset` (indices into the spans given with the list). Plain integers,
// 32 bytes, no padding: an array of them can come straight from a NumPy structured array.
struct IoEntry {
  uint32_t local = 0, remote = 0;
  uint64_t local_offset = 0, remote_offset = 0, length = 0;
};
static_assert(sizeof(IoEntry) == 32);

// One piece of a vectored message: `length` bytes of regions[region] at `offset`. A vectored send
// gathers its pieces into one message, in order; a vectored recv scatters one message over them.
struct IoPiece {
  uint32_t region = 0, reserved = 0;  // reserved: must be 0
  uint64_t offset = 0, length = 0;
};
static_assert(sizeof(IoPiece) == 24);

// The most entries (or pieces) one vectored operation takes.
inline constexpr size_t kMaxIoEntries = size_t{1} << 24;

// Delivered to the target of a write made with OpOptions::notify, after the data has landed.
struct Notification {
  uint64_t value = 0;
  uint64_t key = 0;
  uint64_t length = 0;
};

struct EndpointStats {
  // A payload path beside the TCP streams (same host: shm, cuda_ipc), with its own counters.
  struct PathUse {
    std::string name;    // "shm", "cuda_ipc"
    std::string detail;  // e.g. "cuda_ipc: cuda:0 -> cuda:1 peer access enabled"
    uint64_t chunks_sent = 0, chunks_received = 0, bytes_sent = 0, bytes_received = 0;
    uint64_t host_copies = 0, device_copies = 0;
    uint64_t chunks_inline = 0;  // of chunks_received: moved by the receiving stream's own thread (cuda_ipc)
  };
  std::string transport;  // the data paths in use: "tcp", "shm", "cuda_ipc", "shm+cuda_ipc"
  std::string reason;     // why that path was chosen
  std::string control_stream;  // what stream 0 (control frames) runs on: "tcp" or "shm pipe"
  bool checksum = false;        // every chunk carries its CRC32C (either side set checksum=crc32c)
  uint64_t checksum_errors = 0;  // chunks whose landed bytes did not match (each failed its operation)
  std::string peer;
  uint32_t streams = 0;  // TCP streams, the control stream included (beside more than one data stream)
  // reconnect_timeout: outages (every stream lost) ended by a rejoin; the streams above count the
  // replaced ones too
  uint64_t reconnects = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;  // payload bytes on the wire
  uint64_t messages_sent = 0, messages_received = 0;
  uint64_t eager_sends = 0, rendezvous_sends = 0;
  uint64_t writes = 0, reads = 0;
  uint64_t d2h_copies = 0, d2h_bytes = 0;  // device -> pinned staging copies
  uint64_t h2d_copies = 0, h2d_bytes = 0;  // pinned staging -> device copies
  uint64_t gpu_pushes = 0;  // of those staging copies, made by the GPU's SMs (GPU push, docs/gpu-push.md)
  uint64_t staging_lists = 0;  // inline tables' device pieces staged as one list (a kernel, one copy)
  std::string gpu_push;     // which staging copies are pushed, and why (a cuda_ipc path says its own in PathUse::detail)
  uint64_t device_direct_puts = 0, device_direct_bytes = 0;  // kernels' direct puts into imported windows
  uint64_t host_copies = 0, host_copy_bytes = 0;  // CPU copies: eager messages buffered before
                                                   // their recv (eager sends go from the buffer)
  double send_seconds = 0, recv_seconds = 0, copy_wait_seconds = 0;  // time in each stage
  std::vector<uint64_t> stream_bytes_sent;      // per stream: shows the balance
  std::vector<uint64_t> stream_bytes_received;  // per stream
  std::vector<PathUse> paths;               // empty for "tcp"
};

// How Endpoint::device_handle sets up a handle for kernels (docs/gpu-push.md).
struct DeviceHandleOptions {
  int device = 0;       // the CUDA device whose kernels post (their sources live there)
  uint32_t slots = 64;  // descriptors in the ring: at most this many operations in flight (2-4096, a power of two)
  Duration timeout = std::chrono::seconds(1);  // how long one device call may spin before -kDeviceTimeout
  // Deliver this endpoint's notifications to the handle (wait_notifications) instead of
  // next_notification/on_notification.
  bool notifications = false;
};

// Thread-safe. Move-only; destroying the last handle closes the endpoint.
//
// Recovery contract: after any connection error the endpoint is failed for good: every pending
// and later operation completes with that error (it names the peer). Make a new endpoint. One
// exception: after the peer's orderly close, a recv still gets the messages that had fully arrived
// before the close (their senders saw those sends complete), in order; then kClosed. A recv
// already matched to a send that completed before the close completes too, even when its bytes
// were still in a payload path (shm's ring) at the close: the endpoint stops its paths only once
// they have landed, within stop_timeout.
class Endpoint {
 public:
  Endpoint() = default;
  explicit Endpoint(std::shared_ptr<EndpointImpl> impl);
  ~Endpoint();
  Endpoint(Endpoint&&) noexcept = default;
  Endpoint& operator=(Endpoint&&) noexcept;
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  bool valid() const { return impl_ != nullptr; }

  // Two-sided: the peer's recv with a matching tag receives the bytes of `src`.
  Request send(const MemRegion& src, uint64_t tag, OpOptions options = {});
  // Receives the next message with `tag` (or any tag: kAnyTag) into `dst`. A message larger
  // than dst fails both sides' operations with Code::kTruncated.
  Request recv(const MemRegion& dst, uint64_t tag, OpOptions options = {});
  // One-sided: writes `src` into the peer's registered region at `offset`. Completes once the
  // data has landed at the target.
  Request write(const MemRegion& src, const RemoteRegion& dst, uint64_t offset, OpOptions options = {});
  // One-sided: reads from the peer's registered region at `offset` into `dst`.
  Request read(const MemRegion& dst, const RemoteRegion& src, uint64_t offset, OpOptions options = {});

  // Vectored one-sided operations (docs/architecture.md, "Vectored operations"): one request, one
  // completion, one notification (options.notify; its key is the first entry's remote key, its
  // length the list's total) once every byte has landed. The whole list is checked before a byte
  // moves: every entry against its regions' bounds (indices, offsets, lengths, overflow-safe), and,
  // for a write, no two entries' remote ranges overlap (read: no two local ranges). A bad list
  // fails the request at once (kInvalidArgument or kOutOfRange) with a message that begins
  // "entry <index>:" naming the first bad entry, and Request::failed_entry() gives that index. An
  // empty list and zero-length entries are fine (an empty list completes, and notifies, as an empty
  // write does). Adjacent entries (local and remote both contiguous) move as one. The spans are
  // read during the call only; the memory they name is dmx's until the request completes.
  // Timeout and cancel apply to the whole list.
  Request write_vec(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                    std::span<const IoEntry> entries, OpOptions options = {});
  Request read_vec(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                   std::span<const IoEntry> entries, OpOptions options = {});
  // Vectored two-sided: one message of the pieces' bytes, in order. A recv's pieces must not
  // overlap; either side's list is checked as for write_vec. A vectored send matches a plain recv
  // and the other way round.
  Request send_vec(std::span<const MemRegion> regions, std::span<const IoPiece> pieces, uint64_t tag,
                   OpOptions options = {});
  Request recv_vec(std::span<const MemRegion> regions, std::span<const IoPiece> pieces, uint64_t tag,
                   OpOptions options = {});

  // The next notification of a write the peer made into our memory, waiting up to `timeout`.
  Result<Notification> next_notification(Duration timeout = kForever);
  // From now on notifications go to `handler` instead of next_notification: it runs on a dmx
  // thread right after the write landed, one call at a time, in arrival order (those already
  // waiting go to it at once). It holds up the stream that received the write, so keep it short;
  // it may post operations. Not called once the endpoint has failed or closed.
  void on_notification(std::function<void(const Notification&)> handler);

  // A handle that CUDA kernels take by value to post sends and writes of their GPU's memory on
  // this endpoint, wait for them, and wait for notifications (dmx/device.cuh). Made on the first
  // call, kept for the endpoint's life; later calls return the same handle (other options:
  // kInvalidArgument). A dmx thread takes the kernels' descriptors and posts them as send() and
  // write() would. kUnavailable without CUDA or with no such device. After the endpoint fails or
  // closes, the handle's error word says so within about a millisecond.
  Result<DeviceHandle> device_handle(const DeviceHandleOptions& options = {});

  // Direct puts (dmx/device.cuh block_put_signal; docs/gpu-push.md): a kernel stores into the
  // peer's GPU memory itself, with no copy engine and no host, over cuda_ipc (two processes of one
  // host). The owner describes `region` (cudaMalloc memory, e.g. a Buffer of a GPU) for the peer;
  // the region must stay allocated while the peer may store into it. The peer's
  // import_device_window maps it for its handle's GPU; the window lives until that endpoint is
  // destroyed (at most 64 per endpoint: kResourceExhausted). Both need device_handle() first
  // (kInvalidArgument). kUnavailable, with the reason, for memory CUDA IPC cannot share, for a
  // window of this same process, or without CUDA. The bytes are untrusted: a malformed or lying
  // description is kProtocol.
  Result<std::vector<unsigned char>> export_device_window(const MemRegion& region);
  Result<DeviceWindow> import_device_window(std::span<const unsigned char> bytes);

  EndpointStats stats() const;
  std::string peer() const;
  // Ok while the endpoint is healthy; otherwise the error that ended it.
  Status health() const;
  // Orderly close: tells the peer, fails pending operations with Code::kClosed, and returns once
  // dmx no longer touches any of their buffers. Returns an error naming what did not stop when a
  // payload path or worker is still running at its deadline (stop_timeout); dmx may then still
  // touch those buffers, until the thing named stops. Called from a completion callback of this
  // endpoint it only starts the close (returns ok).
  Status close();

 private:
  std::shared_ptr<EndpointImpl> impl_;
};

}  // namespace dmx
