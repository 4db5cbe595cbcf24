// IpcDescriptor wire format and the import cache: CUDA-free, built and tested everywhere.
//
// Wire format (little endian, fixed size kWireSize):
//   u64 magic "dmx-ipc1" | u32 version (2) | u32 kind (1 IPC handle, 2 cuMem fd) | 64 B handle
//   (zero for kind 2) | 16 B device uuid | u64 alloc_id | u64 alloc_size | u64 offset |
//   u64 length | i32 device | i32 owner_pid
// Version 1 had a reserved zero where the kind is; a version-1 peer is refused with both numbers.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "transport/cuda_ipc/cuda_ipc.h"

namespace dmx::cuda_ipc {
namespace {

constexpr uint64_t kMagic = 0x316370692d786d64ull;  // "dmx-ipc1" read little endian
constexpr uint32_t kVersion = 2;

template <typename T>
void put(std::vector<std::byte>& out, const T& v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}
template <typename T>
T get(std::span<const std::byte> in, size_t* at) {
  T v;
  std::memcpy(&v, in.data() + *at, sizeof v);
  *at += sizeof v;
  return v;
}

}  // namespace

std::vector<std::byte> IpcDescriptor::encode() const {
  std::vector<std::byte> out;
  out.reserve(kWireSize);
  put(out, kMagic);
  put(out, kVersion);
  put(out, static_cast<uint32_t>(kind));
  put(out, handle);
  put(out, device_uuid);
  put(out, alloc_id);
  put(out, alloc_size);
  put(out, offset);
  put(out, length);
  put(out, device);
  put(out, owner_pid);
  assert(out.size() == kWireSize);
  return out;
}

Result<IpcDescriptor> IpcDescriptor::decode(std::span<const std::byte> in) {
  if (in.size() != kWireSize)
    return Status(Code::kProtocol, fmt::format("cuda_ipc descriptor of {} B, expected {}", in.size(), kWireSize));
  size_t at = 0;
  if (get<uint64_t>(in, &at) != kMagic) return Status(Code::kProtocol, "cuda_ipc descriptor: bad magic");
  uint32_t version = get<uint32_t>(in, &at);
  if (version != kVersion)
    return Status(Code::kProtocol, fmt::format("cuda_ipc descriptor version {} (we speak {})", version, kVersion));
  uint32_t kind = get<uint32_t>(in, &at);
  if (kind != static_cast<uint32_t>(Kind::kIpcHandle) && kind != static_cast<uint32_t>(Kind::kCuMemFd))
    return Status(Code::kProtocol, fmt::format("cuda_ipc descriptor of unknown kind {}", kind));
  IpcDescriptor d;
  d.kind = static_cast<Kind>(kind);
  d.handle = get<decltype(d.handle)>(in, &at);
  d.device_uuid = get<decltype(d.device_uuid)>(in, &at);
  d.alloc_id = get<uint64_t>(in, &at);
  d.alloc_size = get<uint64_t>(in, &at);
  d.offset = get<uint64_t>(in, &at);
  d.length = get<uint64_t>(in, &at);
  d.device = get<int32_t>(in, &at);
  d.owner_pid = get<int32_t>(in, &at);
  if (d.kind == Kind::kCuMemFd && d.handle != decltype(d.handle){})
    return Status(Code::kProtocol, "cuda_ipc descriptor: a cuMem allocation with IPC handle bytes");
  if (d.alloc_size == 0 || d.offset > d.alloc_size || d.length > d.alloc_size - d.offset)
    return Status(Code::kProtocol, fmt::format("cuda_ipc descriptor: region [{}, +{}) outside an allocation of {} B",
                                               d.offset, d.length, d.alloc_size));
  return d;
}

// ---- exporter (CUDA-free part) ----

std::vector<uint64_t> Exporter::take_retired(size_t max) {
  size_t n = std::min(max, retired_.size());
  std::vector<uint64_t> out(retired_.begin(), retired_.begin() + static_cast<ptrdiff_t>(n));
  retired_.erase(retired_.begin(), retired_.begin() + static_cast<ptrdiff_t>(n));
  return out;
}

// ---- import cache ----

ImportCache::~ImportCache() {
  for (auto& [key, e] : entries_) opener_->close(e.base);
}

void ImportCache::close_entry(std::map<Key, Entry>::iterator it) {
  opener_->close(it->second.base);
  ++stats_.closes;
  entries_.erase(it);
}

Result<void*> ImportCache::acquire(const std::string& peer, const IpcDescriptor& desc) {
  Key key{peer, desc.alloc_id};
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    Entry& e = it->second;
    if (!e.stale && e.kind == desc.kind && e.handle == desc.handle && e.alloc_size == desc.alloc_size) {
      ++e.in_use;
      ++stats_.hits;
      return e.base;
    }
    // The id now names another allocation (the owner freed and re-exported without telling us,
    // or the message was lost): the old mapping must not be used for it.
    if (e.in_use != 0)
      return Status(Code::kProtocol, fmt::format("cuda_ipc: peer {} reused allocation id {} while copies into the "
                                                 "old allocation are in flight", peer, desc.alloc_id));
    close_entry(it);
  }
  ++stats_.misses;
  DMX_ASSIGN_OR_RETURN(void* base, opener_->open(desc));
  Entry e;
  e.base = base;
  e.kind = desc.kind;
  e.handle = desc.handle;
  e.alloc_size = desc.alloc_size;
  e.in_use = 1;
  entries_.emplace(std::move(key), e);
  return base;
}

void ImportCache::release(const std::string& peer, uint64_t alloc_id) {
  auto it = entries_.find({peer, alloc_id});
  if (it == entries_.end() || it->second.in_use == 0) {
    assert(false && "ImportCache::release without acquire");
    return;
  }
  if (--it->second.in_use == 0 && it->second.stale) close_entry(it);
}

void ImportCache::invalidate(const std::string& peer, uint64_t alloc_id) {
  auto it = entries_.find({peer, alloc_id});
  if (it == entries_.end()) return;
  ++stats_.invalidations;
  if (it->second.in_use == 0) {
    close_entry(it);
  } else {
    it->second.stale = true;
  }
}

void ImportCache::drop_peer(const std::string& peer) {
  for (auto it = entries_.lower_bound({peer, 0}); it != entries_.end() && it->first.first == peer;) {
    auto next = std::next(it);
    invalidate(peer, it->first.second);
    it = next;
  }
}

}  // namespace dmx::cuda_ipc
