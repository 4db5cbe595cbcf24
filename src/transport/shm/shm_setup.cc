// Setting up an shm link: the memfd region, the eventfds, and the exchange over the side channel.
//
//   creator (listening side)                      acceptor (connecting side)
//   memfd + seals, map, write RegionHeader
//   eventfd E0
//   send Hello{layout}, fds [memfd, E0]   ---->   recv exactly 2 fds; fstat + seals + header check
//                                                 map, eventfd E1
//                                         <----   send Hello{ack}, fds [E1]
//   recv exactly 1 fd
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "core/config.h"
#include "core/log.h"
#include "core/sys.h"
#include "transport/shm/link_impl.h"

namespace dmx::shm {
namespace {

struct Hello {
  uint64_t magic;
  uint32_t version;
  uint32_t slots;
  uint64_t slot_size;
  uint64_t total_size;
};

std::span<const std::byte> bytes_of(const Hello& h) { return {reinterpret_cast<const std::byte*>(&h), sizeof h}; }

Result<Hello> parse_hello(const std::vector<std::byte>& msg, const UnixChannel& ch) {
  Hello h{};
  if (msg.size() != sizeof h)
    return Status(Code::kProtocol, fmt::format("shm setup: peer {} sent {} B, expected {}", ch.peer_name(), msg.size(),
                                               sizeof h));
  std::memcpy(&h, msg.data(), sizeof h);
  if (h.magic != kRegionMagic || h.version != kRegionVersion)
    return Status(Code::kProtocol, fmt::format("shm setup: peer {} speaks another shm protocol (magic {:x}, version {})",
                                               ch.peer_name(), h.magic, h.version));
  return h;
}

Result<UniqueFd> make_eventfd() {
  UniqueFd fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!fd.valid()) return errno_status("eventfd", errno);
  return fd;
}

Result<char*> map_region(int fd, size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return errno_status(fmt::format("mmap(shm region, {} B)", size), errno, Code::kResourceExhausted);
  return static_cast<char*>(p);
}

}  // namespace

Status available() {
  UniqueFd m(::memfd_create("dmx-shm-probe", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!m.valid()) return errno_status("memfd_create", errno, Code::kUnavailable);
  UniqueFd e(::eventfd(0, EFD_CLOEXEC));
  if (!e.valid()) return errno_status("eventfd", errno, Code::kUnavailable);
  auto p = UnixChannel::pair();
  if (!p.ok()) return Status(Code::kUnavailable, p.status().message());
  return Status();
}

Result<Layout> compute_layout(uint32_t slots, size_t slot_size) {
  if (slots < kMinSlots || slots > kMaxSlots)
    return Status(Code::kInvalidArgument, fmt::format("shm: {} slots (allowed {}-{})", slots, kMinSlots, kMaxSlots));
  if (slot_size < kMinSlotSize || slot_size > kMaxSlotSize || slot_size % 64 != 0)
    return Status(Code::kInvalidArgument, fmt::format("shm: slot size {} B (allowed {}-{} B, multiple of 64)",
                                                      slot_size, kMinSlotSize, kMaxSlotSize));
  constexpr size_t kPage = 4096;
  Layout l;
  l.slots = slots;
  l.slot_size = slot_size;
  l.doorbells = kPage;
  l.control = l.doorbells + sizeof(Doorbells);
  l.headers = l.control + 2 * sizeof(RingControl);
  size_t end_headers = l.headers + 2 * size_t(slots) * sizeof(SlotHeader);
  l.data = (end_headers + kPage - 1) / kPage * kPage;
  // slots <= 1024 and slot_size <= 64 MiB: no overflow in 64 bits; the total is bounded below.
  l.total = l.data + 2 * size_t(slots) * slot_size;
  if (l.total > kMaxRegion)
    return Status(Code::kInvalidArgument, fmt::format("shm: region of {} B over the {} B limit", l.total, kMaxRegion));
  return l;
}

Result<LinkOptions> link_options(const Config& config) {
  LinkOptions o;
  int64_t slots = config.get_int("shm_slots");
  if (slots < kMinSlots || slots > kMaxSlots)
    return Status(Code::kInvalidArgument, fmt::format("shm_slots = {}: allowed {}-{}", slots, kMinSlots, kMaxSlots));
  o.slots = static_cast<uint32_t>(slots);
  o.slot_size = config.get_size("shm_slot_size");
  o.spin = config.get_duration("shm_spin");
  o.bounce_pool = config.get_size("shm_bounce_pool");
  const uint64_t nt = config.get_size("nt_receive_min");
  o.nt_receive_min = nt == 0 ? UINT64_MAX : nt;
  int64_t threads = config.get_int("shm_copy_threads");
  if (threads < 0 || threads > kMaxCopyThreads)
    return Status(Code::kInvalidArgument,
                  fmt::format("shm_copy_threads = {}: allowed 0 (automatic) or 1-{}", threads, kMaxCopyThreads));
  o.copy_threads = threads != 0 ? static_cast<int>(threads) : CopyCrew::automatic_threads(usable_cpus());
  DMX_RETURN_IF_ERROR(compute_layout(o.slots, o.slot_size).status());
  return o;
}

Result<std::unique_ptr<ShmLink>> ShmLink::create(UnixChannel channel, const LinkOptions& options, Deadline deadline) {
  DMX_ASSIGN_OR_RETURN(Layout layout, compute_layout(options.slots, options.slot_size));
  UniqueFd mem(::memfd_create("dmx-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!mem.valid()) return errno_status("memfd_create(dmx-shm)", errno, Code::kUnavailable);
  if (::ftruncate(mem.get(), static_cast<off_t>(layout.total)) != 0)
    return errno_status(fmt::format("ftruncate(shm, {} B)", layout.total), errno, Code::kResourceExhausted);
  // Neither side may resize the region later: a shrink would make the other side's accesses SIGBUS.
  if (::fcntl(mem.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return errno_status("fcntl(F_ADD_SEALS)", errno);
  DMX_ASSIGN_OR_RETURN(char* base, map_region(mem.get(), layout.total));
  auto* hdr = reinterpret_cast<RegionHeader*>(base);
  *hdr = RegionHeader{kRegionMagic, kRegionVersion, layout.slots, layout.slot_size, layout.total, ::getpid()};
  auto link = std::make_unique<LinkImpl>(std::move(channel), options, layout, base, /*side=*/0);
  DMX_ASSIGN_OR_RETURN(UniqueFd my_bell, make_eventfd());

  Hello hello{kRegionMagic, kRegionVersion, layout.slots, layout.slot_size, layout.total};
  int fds[2] = {mem.get(), my_bell.get()};
  DMX_RETURN_IF_ERROR(link->channel().send(bytes_of(hello), fds, deadline));
  std::vector<std::byte> msg;
  std::vector<UniqueFd> got;
  DMX_RETURN_IF_ERROR(link->channel().recv(&msg, 1, &got, deadline));
  DMX_ASSIGN_OR_RETURN(Hello ack, parse_hello(msg, link->channel()));
  if (ack.slots != layout.slots || ack.slot_size != layout.slot_size || ack.total_size != layout.total)
    return Status(Code::kProtocol, fmt::format("shm setup: peer {} acknowledged another layout", link->peer_name()));
  DMX_RETURN_IF_ERROR(link->set_doorbells(std::move(my_bell), std::move(got[0])));
  DMX_LOG_DEBUG("shm link to peer {}: {} slots x {} B per direction", link->peer_name(), layout.slots,
                layout.slot_size);
  return std::unique_ptr<ShmLink>(std::move(link));
}

Result<std::unique_ptr<ShmLink>> ShmLink::accept(UnixChannel channel, Deadline deadline,
                                                 std::shared_ptr<CopyCrew> crew, uint64_t nt_receive_min) {
  std::vector<std::byte> msg;
  std::vector<UniqueFd> got;
  DMX_RETURN_IF_ERROR(channel.recv(&msg, 2, &got, deadline));
  DMX_ASSIGN_OR_RETURN(Hello hello, parse_hello(msg, channel));
  DMX_ASSIGN_OR_RETURN(Layout layout, compute_layout(hello.slots, hello.slot_size));
  std::string peer = channel.peer_name();
  if (layout.total != hello.total_size)
    return Status(Code::kProtocol, fmt::format("shm setup: peer {} announced {} B for a layout of {} B", peer,
                                               hello.total_size, layout.total));
  // The fd must be what was announced: a sealed memfd of exactly that size.
  struct stat st {};
  if (::fstat(got[0].get(), &st) != 0) return errno_status("fstat(shm region)", errno);
  if (!S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) != layout.total)
    return Status(Code::kProtocol, fmt::format("shm setup: region fd from peer {} is {} B, expected {}", peer,
                                               static_cast<long long>(st.st_size), layout.total));
  int seals = ::fcntl(got[0].get(), F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
    return Status(Code::kProtocol, fmt::format("shm setup: region fd from peer {} is not sealed against resizing", peer));
  DMX_ASSIGN_OR_RETURN(char* base, map_region(got[0].get(), layout.total));
  RegionHeader hdr;
  std::memcpy(&hdr, base, sizeof hdr);
  if (hdr.magic != kRegionMagic || hdr.slots != layout.slots || hdr.slot_size != layout.slot_size ||
      hdr.total_size != layout.total) {
    ::munmap(base, layout.total);
    return Status(Code::kProtocol, fmt::format("shm setup: region header from peer {} disagrees with its hello", peer));
  }
  LinkOptions options;
  options.slots = layout.slots;
  options.slot_size = layout.slot_size;
  options.crew = std::move(crew);
  options.nt_receive_min = nt_receive_min;
  auto link = std::make_unique<LinkImpl>(std::move(channel), options, layout, base, /*side=*/1);
  DMX_ASSIGN_OR_RETURN(UniqueFd my_bell, make_eventfd());
  DMX_RETURN_IF_ERROR(link->set_doorbells(std::move(my_bell), std::move(got[1])));
  int fds[1] = {link->wake_fd()};
  DMX_RETURN_IF_ERROR(link->channel().send(bytes_of(hello), fds, deadline));
  return std::unique_ptr<ShmLink>(std::move(link));
}

}  // namespace dmx::shm
