#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/units.h"
#include "memory/backend.h"
#include "memory/copy_queues.h"

namespace dmx {

std::string_view mem_kind_name(MemKind kind) {
  switch (kind) {
    case MemKind::kHost: return "host";
    case MemKind::kPinned: return "pinned";
    case MemKind::kCuda: return "cuda";
    case MemKind::kSim: return "sim";
  }
  return "?";
}

Result<MemSpec> parse_mem_spec(std::string_view text) {
  std::string_view name = text;
  int device = 0;
  if (size_t colon = text.find(':'); colon != std::string_view::npos) {
    name = text.substr(0, colon);
    auto n = parse_int(text.substr(colon + 1));
    if (!n.ok() || *n < 0 || *n > 1023)
      return Status(Code::kInvalidArgument, fmt::format("'{}': device must be a number 0-1023", text));
    device = static_cast<int>(*n);
  }
  for (MemKind k : {MemKind::kHost, MemKind::kPinned, MemKind::kCuda, MemKind::kSim}) {
    if (name == mem_kind_name(k)) {
      if (!MemSpec{k}.is_device() && name != text)
        return Status(Code::kInvalidArgument, fmt::format("'{}': {} memory takes no device number", text, name));
      return MemSpec{k, device};
    }
  }
  return Status(Code::kInvalidArgument, fmt::format("'{}': unknown memory kind (host, pinned, cuda[:N], sim[:N])", text));
}

void MemRegion::sub_out_of_range(size_t offset, size_t length, size_t size) {
  std::fprintf(stderr, "dmx: bug: MemRegion::sub(%zu, %zu) outside a %zu-byte region\n", offset, length, size);
  std::abort();
}

std::string to_string(const MemSpec& spec) {
  if (spec.is_device()) return fmt::format("{}:{}", mem_kind_name(spec.kind), spec.device);
  return std::string(mem_kind_name(spec.kind));
}

Result<MemoryBackend*> backend_for(MemSpec where) {
  switch (where.kind) {
    case MemKind::kHost: return host_backend();
    case MemKind::kPinned: return pinned_backend();
    case MemKind::kCuda: return cuda_backend(where.device);
    case MemKind::kSim: return sim_backend(where.device);
  }
  return Status(Code::kInvalidArgument, "unknown memory kind");
}

Status mem_available(MemSpec where) { return backend_for(where).status(); }

Result<Buffer> Buffer::allocate(MemSpec where, size_t size) {
  DMX_ASSIGN_OR_RETURN(MemoryBackend * backend, backend_for(where));
  DMX_ASSIGN_OR_RETURN(void* ptr, backend->allocate(size));
  Buffer b;
  b.ptr_ = ptr;
  b.size_ = size;
  b.where_ = where;
  return b;
}

Result<Buffer> Buffer::allocate_cumem(int device, size_t size, size_t block) {
  DMX_RETURN_IF_ERROR(mem_available(MemSpec{MemKind::kCuda, device}));
  DMX_ASSIGN_OR_RETURN(void* ptr, cuda_cumem_alloc(device, size, block));
  Buffer b;
  b.ptr_ = ptr;
  b.size_ = size;
  b.where_ = MemSpec{MemKind::kCuda, device};
  b.cumem_ = true;
  return b;
}

Buffer::~Buffer() { reset(); }

Buffer::Buffer(Buffer&& o) noexcept : ptr_(o.ptr_), size_(o.size_), where_(o.where_), cumem_(o.cumem_) {
  o.ptr_ = nullptr;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = o.ptr_;
    size_ = o.size_;
    where_ = o.where_;
    cumem_ = o.cumem_;
    o.ptr_ = nullptr;
  }
  return *this;
}

void Buffer::reset() {
  if (ptr_ == nullptr) return;
  if (cumem_) {
    cuda_cumem_free(ptr_);
    ptr_ = nullptr;
    return;
  }
  auto backend = backend_for(where_);
  if (backend.ok()) (*backend)->free(ptr_, size_);
  ptr_ = nullptr;
}

namespace {

// One cached copy queue per device for the synchronous helper.
Status device_copy(MemSpec device, bool to_device, void* dst, const void* src, size_t n) {
  static std::mutex mu;
  static CopyQueues queues;
  static pid_t owner = ::getpid();
  std::lock_guard<std::mutex> lock(mu);
  if (pid_t me = ::getpid(); me != owner) {
    queues.abandon();  // a forked child makes its own
    owner = me;
  }
  DMX_ASSIGN_OR_RETURN(CopyQueue * q, queues.get(device));
  DMX_RETURN_IF_ERROR(to_device ? q->to_device(dst, src, n) : q->to_host(dst, src, n));
  DMX_ASSIGN_OR_RETURN(uint64_t fence, q->record());
  return q->wait(fence, Deadline::never());
}

}  // namespace

Status copy_memory(MemRegion dst, MemRegion src) {
  if (dst.size != src.size)
    return Status(Code::kInvalidArgument, fmt::format("copy_memory: sizes differ ({} vs {})", dst.size, src.size));
  if (dst.size == 0) return Status();
  DMX_ASSIGN_OR_RETURN(MemoryBackend * db, backend_for(dst.where));
  DMX_ASSIGN_OR_RETURN(MemoryBackend * sb, backend_for(src.where));
  if (db->host_accessible() && sb->host_accessible()) {
    std::memcpy(dst.ptr, src.ptr, dst.size);
    return Status();
  }
  if (sb->host_accessible()) return device_copy(dst.where, true, dst.ptr, src.ptr, dst.size);
  if (db->host_accessible()) return device_copy(src.where, false, dst.ptr, src.ptr, dst.size);
  // Device to device: bounce through host memory in pieces (a set-up helper, not a fast path).
  constexpr size_t kPiece = 64 << 20;
  std::vector<char> bounce(std::min(kPiece, dst.size));
  for (size_t off = 0; off < dst.size; off += kPiece) {
    size_t n = std::min(kPiece, dst.size - off);
    DMX_RETURN_IF_ERROR(device_copy(src.where, false, bounce.data(), static_cast<char*>(src.ptr) + off, n));
    DMX_RETURN_IF_ERROR(device_copy(dst.where, true, static_cast<char*>(dst.ptr) + off, bounce.data(), n));
  }
  return Status();
}

}  // namespace dmx
