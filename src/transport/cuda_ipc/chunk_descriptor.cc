// The cuda_ipc path's chunk descriptors (ipc_path.h): what a chunk header or a table chunk carries
// after the endpoint's fields. Untrusted on decode; pure code, fuzzed (tests/fuzz/fuzz_descriptors).
#include <fmt/format.h>

#include <cassert>
#include <cstring>
#include <utility>

#include "transport/cuda_ipc/ipc_path.h"

namespace dmx {

using cuda_ipc::IpcDescriptor;

std::vector<unsigned char> IpcChunkDescriptor::encode() const {
  assert(retired.size() <= kCudaIpcMaxRetired);
  std::vector<std::byte> ipc = source.encode();
  std::vector<unsigned char> out(ipc.size() + 8 * retired.size());
  std::memcpy(out.data(), ipc.data(), ipc.size());
  for (size_t i = 0; i < retired.size(); ++i) std::memcpy(out.data() + ipc.size() + 8 * i, &retired[i], 8);
  return out;
}

Result<IpcChunkDescriptor> IpcChunkDescriptor::decode(std::span<const unsigned char> in) {
  constexpr size_t kBase = IpcDescriptor::kWireSize;
  if (in.size() < kBase || (in.size() - kBase) % 8 != 0 || (in.size() - kBase) / 8 > kCudaIpcMaxRetired)
    return Status(Code::kProtocol, fmt::format("cuda_ipc chunk descriptor of {} B (expected {} + 8 x [0, {}])",
                                               in.size(), kBase, kCudaIpcMaxRetired));
  IpcChunkDescriptor d;
  DMX_ASSIGN_OR_RETURN(d.source, IpcDescriptor::decode(std::as_bytes(in.first(kBase))));
  for (size_t at = kBase; at < in.size(); at += 8) {
    uint64_t id = 0;
    std::memcpy(&id, in.data() + at, 8);
    if (id == 0) return Status(Code::kProtocol, "cuda_ipc chunk descriptor: retired allocation id 0");
    d.retired.push_back(id);
  }
  return d;
}

static_assert(IpcDescriptor::kWireSize + 8 + 8 * (kCudaIpcMaxList + kCudaIpcMaxRetired) <= kMaxListDescriptor);

std::vector<unsigned char> IpcListDescriptor::encode() const {
  assert(!offsets.empty() && offsets.size() <= kCudaIpcMaxList && retired.size() <= kCudaIpcMaxRetired);
  std::vector<std::byte> ipc = source.encode();
  std::vector<unsigned char> out(ipc.size() + 8 + 8 * (offsets.size() + retired.size()));
  std::memcpy(out.data(), ipc.data(), ipc.size());
  unsigned char* p = out.data() + ipc.size();
  auto n = static_cast<uint32_t>(offsets.size()), r = static_cast<uint32_t>(retired.size());
  std::memcpy(p, &n, 4);
  std::memcpy(p + 4, &r, 4);
  p += 8;
  for (uint64_t o : offsets) std::memcpy(std::exchange(p, p + 8), &o, 8);
  for (uint64_t id : retired) std::memcpy(std::exchange(p, p + 8), &id, 8);
  return out;
}

Result<IpcListDescriptor> IpcListDescriptor::decode(std::span<const unsigned char> in) {
  constexpr size_t kBase = IpcDescriptor::kWireSize + 8;
  if (in.size() < kBase)
    return Status(Code::kProtocol, fmt::format("cuda_ipc list descriptor of {} B (at least {})", in.size(), kBase));
  uint32_t n = 0, r = 0;
  std::memcpy(&n, in.data() + IpcDescriptor::kWireSize, 4);
  std::memcpy(&r, in.data() + IpcDescriptor::kWireSize + 4, 4);
  if (n == 0 || n > kCudaIpcMaxList || r > kCudaIpcMaxRetired || in.size() != kBase + 8 * (size_t{n} + r))
    return Status(Code::kProtocol, fmt::format("cuda_ipc list descriptor of {} B for {} pieces and {} retired ids "
                                               "(1 to {} pieces, at most {} ids)",
                                               in.size(), n, r, kCudaIpcMaxList, kCudaIpcMaxRetired));
  IpcListDescriptor d;
  DMX_ASSIGN_OR_RETURN(d.source, IpcDescriptor::decode(std::as_bytes(in.first(IpcDescriptor::kWireSize))));
  const unsigned char* p = in.data() + kBase;
  d.offsets.resize(n);
  for (uint32_t k = 0; k < n; ++k, p += 8) std::memcpy(&d.offsets[k], p, 8);
  for (uint32_t k = 0; k < r; ++k, p += 8) {
    uint64_t id = 0;
    std::memcpy(&id, p, 8);
    if (id == 0) return Status(Code::kProtocol, "cuda_ipc list descriptor: retired allocation id 0");
    d.retired.push_back(id);
  }
  return d;
}

}  // namespace dmx
