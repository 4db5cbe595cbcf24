// Fuzzes the payload paths' chunk descriptors and side-channel messages, all of which a peer
// writes: the cuda_ipc descriptor (IpcDescriptor::decode) and chunk descriptor with its retired
// ids (IpcChunkDescriptor::decode), the shm and devmem length descriptor
// (decode_length_descriptor), the remote region a peer hands for one-sided operations
// (RemoteRegion::parse), and the cuMem fd channel's messages (IpcFdChannel, fed through a real
// Unix socket pair). Decoded values must re-encode to the input and respect the bounds.
//
// Input: the first byte picks the decoder; the rest is its input.
#include <sys/eventfd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "core/sys.h"
#include "dmx/endpoint.h"
#include "transport/devmem/devmem_path.h"
#include "transport/cuda_ipc/ipc_fds.h"
#include "transport/cuda_ipc/ipc_path.h"
#include "transport/shm/shm_path.h"

using namespace dmx;

namespace {

void expect_protocol(const Status& s) {
  if (s.code() != Code::kProtocol) std::abort();
}

void fuzz_ipc(std::span<const unsigned char> in) {
  auto d = cuda_ipc::IpcDescriptor::decode(std::as_bytes(in));
  if (!d.ok()) return expect_protocol(d.status());
  if (d->alloc_size == 0 || d->offset > d->alloc_size || d->length > d->alloc_size - d->offset) std::abort();
  std::vector<std::byte> again = d->encode();
  if (again.size() != in.size() || std::memcmp(again.data(), in.data(), in.size()) != 0) std::abort();
}

void fuzz_ipc_chunk(std::span<const unsigned char> in) {
  auto d = IpcChunkDescriptor::decode(in);
  if (!d.ok()) return expect_protocol(d.status());
  if (d->retired.size() > kCudaIpcMaxRetired) std::abort();
  for (uint64_t id : d->retired)
    if (id == 0) std::abort();
  std::vector<unsigned char> again = d->encode();
  if (again.size() != in.size() || std::memcmp(again.data(), in.data(), in.size()) != 0) std::abort();
}

void fuzz_ipc_list(std::span<const unsigned char> in) {
  auto d = IpcListDescriptor::decode(in);
  if (!d.ok()) return expect_protocol(d.status());
  if (d->offsets.empty() || d->offsets.size() > kCudaIpcMaxList || d->retired.size() > kCudaIpcMaxRetired ||
      in.size() > kMaxListDescriptor)
    std::abort();
  for (uint64_t id : d->retired)
    if (id == 0) std::abort();
  std::vector<unsigned char> again = d->encode();
  if (again.size() != in.size() || std::memcmp(again.data(), in.data(), in.size()) != 0) std::abort();
}

void fuzz_length(std::span<const unsigned char> in) {
  for (uint64_t max : {kShmMaxChunk, kDevmemMaxChunk}) {
    auto n = decode_length_descriptor(in, max, "fuzz", "fuzz peer");
    if (!n.ok()) {
      expect_protocol(n.status());
      continue;
    }
    if (in.size() != kLengthDescriptorSize || *n > max) std::abort();
  }
}

void fuzz_remote_region(std::span<const unsigned char> in) {
  auto r = RemoteRegion::parse(in.data(), in.size());
  if (!r.ok()) return;
  std::vector<unsigned char> again = r->serialize();
  if (again.size() != in.size() || std::memcmp(again.data(), in.data(), in.size()) != 0) std::abort();
}

// Records: u8 length, u8 fd count (mod 3), then the message. The peer's end closes after them
// when the first byte is odd. forget() drains what is queued without waiting.
void fuzz_fd_channel(std::span<const unsigned char> in) {
  static UniqueFd fd(::eventfd(0, EFD_CLOEXEC));
  if (in.empty()) return;
  bool hang_up = in[0] & 1;
  in = in.subspan(1);
  auto pair = UnixChannel::pair();
  if (!pair.ok()) std::abort();
  UnixChannel peer = std::move(pair->first);
  IpcFdChannel channel(std::move(pair->second), "fuzz peer");
  uint64_t forget_id = 0;
  for (int n = 0; n < 16 && in.size() >= 2; ++n) {
    size_t len = std::min<size_t>(in[0], in.size() - 2);
    int fds[2] = {fd.get(), fd.get()};
    auto msg = std::as_bytes(in.subspan(2, len));
    if (len >= 16) std::memcpy(&forget_id, msg.data() + 8, 8);
    (void)peer.send(msg, std::span<const int>(fds, in[1] % 3), Deadline::after(std::chrono::seconds(1)));
    in = in.subspan(2 + len);
  }
  if (hang_up) peer = UnixChannel();
  channel.forget(forget_id);
  if (channel.held() > IpcFdChannel::kMaxHeld) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::span<const unsigned char> in(data + 1, size - 1);
  switch (data[0] % 6) {
    case 0: fuzz_ipc(in); break;
    case 1: fuzz_ipc_chunk(in); break;
    case 2: fuzz_length(in); break;
    case 3: fuzz_remote_region(in); break;
    case 4: fuzz_fd_channel(in); break;
    case 5: fuzz_ipc_list(in); break;
  }
  return 0;
}
