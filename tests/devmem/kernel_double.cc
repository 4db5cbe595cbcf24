#include "devmem/kernel_double.h"

#include <fmt/format.h>
#include <linux/errqueue.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <netinet/in.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "transport/devmem/kernel_abi.h"

namespace dmx::devmem::testing {
namespace {
constexpr uint32_t kPage = 4096;
}

KernelDouble::KernelDouble(size_t pool_bytes, uint32_t rx_binding_id, uint64_t seed)
    : pool_(pool_bytes / kPage * kPage, 0xCC), rx_id_(rx_binding_id), rng_(seed) {
  page_refs_.assign(pool_.size() / kPage, 0);
  for (uint32_t p = 0; p < page_refs_.size(); ++p) free_pages_.push_back(p);
}

uint32_t KernelDouble::alloc_page() {
  std::uniform_int_distribution<size_t> pick(0, free_pages_.size() - 1);
  size_t i = pick(rng_);
  uint32_t page = free_pages_[i];
  free_pages_[i] = free_pages_.back();
  free_pages_.pop_back();
  page_refs_[page] = 1;  // the receive queue's reference
  return page;
}

void KernelDouble::put_page(uint32_t page) {
  if (--page_refs_[page] == 0) {
    // Back in the page pool: the NIC may refill it at once. Scribble, so a consumer that read it
    // after giving its token back sees garbage, as it would on hardware.
    std::memset(pool_.data() + size_t{page} * kPage, 0xEE, kPage);
    free_pages_.push_back(page);
  }
}

uint32_t KernelDouble::alloc_token() {
  if (!free_tokens_.empty()) {
    uint32_t t = *free_tokens_.begin();
    free_tokens_.erase(free_tokens_.begin());
    return t;
  }
  return next_token_++;
}

bool KernelDouble::inject(const std::vector<uint8_t>& data, const RxLayout& layout) {
  std::uniform_real_distribution<double> coin(0, 1);
  std::uniform_int_distribution<uint32_t> offset(0, kPage - 1);
  size_t at = 0;
  while (at < data.size()) {
    size_t pkt = std::min<size_t>(layout.mss, data.size() - at);
    if (coin(rng_) < layout.linear_fraction) {
      queue_.push_back(Piece{true, std::vector<uint8_t>(data.begin() + at, data.begin() + at + pkt)});
      at += pkt;
      continue;
    }
    while (pkt > 0) {
      if (free_pages_.empty()) return false;
      uint32_t page = alloc_page();
      uint32_t off = layout.page_aligned ? 0 : offset(rng_);
      auto len = static_cast<uint32_t>(std::min<size_t>({pkt, kPage - off, layout.max_frag}));
      std::memcpy(pool_.data() + size_t{page} * kPage + off, data.data() + at, len);
      Piece p{false, {}, page, off, len};
      queue_.push_back(std::move(p));
      at += len;
      pkt -= len;
    }
  }
  return true;
}

void KernelDouble::inject_plain(const std::vector<uint8_t>& data) {
  Piece p{true, data};
  p.len = static_cast<uint32_t>(data.size());
  p.plain = true;
  queue_.push_back(std::move(p));
}

size_t KernelDouble::queued_bytes() const {
  size_t n = 0;
  for (const auto& p : queue_) n += p.linear ? p.bytes.size() : p.len;
  return n;
}

ssize_t KernelDouble::recvmsg(msghdr* msg, int flags) {
  if (flags & MSG_ERRQUEUE) return recv_errqueue(msg);
  if (fail_next_recv) return -std::exchange(fail_next_recv, 0);
  msg->msg_flags = 0;
  if (queue_.empty()) {
    msg->msg_controllen = 0;
    return peer_closed ? 0 : -EAGAIN;
  }
  size_t remaining = 0;
  for (size_t i = 0; i < msg->msg_iovlen; ++i) remaining += msg->msg_iov[i].iov_len;
  // Linear bytes go to the iov packed (copy_to_iter); fragments do not advance it.
  auto* iov = static_cast<uint8_t*>(msg->msg_iov[0].iov_base);
  size_t iov_at = 0;
  if (queue_.front().plain) {  // an ordinary skb: a normal copy, no cmsgs, not mixed with devmem
    size_t sent = 0;
    while (!queue_.empty() && queue_.front().plain && remaining > 0) {
      auto& p = queue_.front();
      size_t n = std::min(remaining, p.bytes.size());
      std::memcpy(iov + iov_at, p.bytes.data(), n);
      iov_at += n, sent += n, remaining -= n;
      p.bytes.erase(p.bytes.begin(), p.bytes.begin() + static_cast<long>(n));
      if (p.bytes.empty()) queue_.pop_front();
    }
    msg->msg_controllen = 0;
    return static_cast<ssize_t>(sent);
  }
  if (!(flags & abi::kMsgSockDevmem)) return -EFAULT;

  auto* ctrl = static_cast<uint8_t*>(msg->msg_control);
  size_t ctrl_cap = msg->msg_control ? msg->msg_controllen : 0, ctrl_used = 0;
  auto put_cmsg = [&](int type, const abi::DmabufCmsg& d) {
    size_t need = CMSG_LEN(sizeof d);
    if (ctrl_cap < sizeof(cmsghdr) || ctrl_used + need > ctrl_cap) return false;  // put_cmsg_notrunc
    cmsghdr h{};
    h.cmsg_len = need;
    h.cmsg_level = SOL_SOCKET;
    h.cmsg_type = type;
    std::memcpy(ctrl + ctrl_used, &h, sizeof h);
    std::memcpy(ctrl + ctrl_used + CMSG_LEN(0), &d, sizeof d);
    ctrl_used += std::min(CMSG_SPACE(sizeof d), ctrl_cap - ctrl_used);
    return true;
  };
  size_t sent = 0;
  bool no_room = false;
  while (!queue_.empty() && !queue_.front().plain && remaining > 0) {
    auto& p = queue_.front();
    abi::DmabufCmsg d{};
    if (p.linear) {
      size_t n = std::min(remaining, p.bytes.size());
      std::memcpy(iov + iov_at, p.bytes.data(), n);
      d.frag_size = static_cast<uint32_t>(n);
      if (!put_cmsg(abi::kScmDevmemLinear, d)) {
        no_room = true;
        break;
      }
      iov_at += n, sent += n, remaining -= n;
      p.bytes.erase(p.bytes.begin(), p.bytes.begin() + static_cast<long>(n));
      if (p.bytes.empty()) queue_.pop_front();
      continue;
    }
    auto n = static_cast<uint32_t>(std::min<size_t>(remaining, p.len));
    d.frag_offset = uint64_t{p.page} * kPage + p.off;
    d.frag_size = n;
    d.dmabuf_id = rx_id_;
    if (ctrl_cap < sizeof(cmsghdr) || ctrl_used + CMSG_LEN(sizeof d) > ctrl_cap) {
      no_room = true;
      break;
    }
    uint32_t token = alloc_token();
    d.frag_token = token;
    if (corrupt_id) d.dmabuf_id = std::exchange(corrupt_id, 0);
    if (corrupt_offset) d.frag_offset = pool_.size() - 100, corrupt_offset = false;
    if (corrupt_token) d.frag_token = 0x80000000u + token, corrupt_token = false;
    put_cmsg(abi::kScmDevmemDmabuf, d);
    tokens_[token] = p.page;
    ++page_refs_[p.page];
    sent += n, remaining -= n;
    p.off += n, p.len -= n;
    if (p.len == 0) {
      put_page(p.page);
      queue_.pop_front();
    }
  }
  msg->msg_controllen = ctrl_used;
  if (sent == 0 && no_room) {
    ++etoosmall;
    return legacy_cmsg ? -EFAULT : -abi::kEtoosmall;
  }
  return static_cast<ssize_t>(sent);
}

int KernelDouble::dontneed(const void* value, socklen_t len) {
  if (len % sizeof(abi::DmabufToken) || len > abi::kMaxDontneedTokens * sizeof(abi::DmabufToken)) return -EINVAL;
  size_t n = len / sizeof(abi::DmabufToken);
  std::vector<abi::DmabufToken> ranges(n);
  std::memcpy(ranges.data(), value, len);
  ++dontneed_calls;
  max_ranges_per_call = std::max(max_ranges_per_call, n);
  size_t asked = 0;
  for (const auto& r : ranges) asked += r.token_count;
  max_frags_per_call = std::max(max_frags_per_call, asked);
  int freed = 0;
  size_t frags = 0;
  for (const auto& r : ranges) {
    for (uint32_t j = 0; j < r.token_count; ++j) {
      if (++frags > abi::kMaxDontneedFrags) return freed;
      auto it = tokens_.find(r.token_start + j);
      if (it == tokens_.end()) continue;  // unknown: skipped silently
      put_page(it->second);
      free_tokens_.insert(it->first);
      tokens_.erase(it);
      ++freed;
    }
  }
  return freed;
}

void KernelDouble::close_socket() {
  for (auto& [t, page] : tokens_) put_page(page);
  tokens_.clear();
}

void KernelDouble::set_tx_binding(uint32_t id, size_t size, std::string dev) {
  tx_id_ = id;
  tx_mem_.assign(size, 0);
  tx_dev_ = std::move(dev);
}

ssize_t KernelDouble::sendmsg(const msghdr* msg, int flags) {
  const cmsghdr* dm = nullptr;
  for (cmsghdr* c = CMSG_FIRSTHDR(const_cast<msghdr*>(msg)); c; c = CMSG_NXTHDR(const_cast<msghdr*>(msg), c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == abi::kScmDevmemDmabuf) dm = c;
  if (!dm) return -EFAULT;  // an offset is not a user pointer
  if (dm->cmsg_len != CMSG_LEN(sizeof(uint32_t))) return -EINVAL;
  if (!(flags & abi::kMsgZerocopy) || !zerocopy_) return -EINVAL;
  uint32_t id;
  std::memcpy(&id, CMSG_DATA(dm), sizeof id);
  if (id != tx_id_ || tx_mem_.empty()) return -EINVAL;
  if (route_dev != tx_dev_) return -ENODEV;  // keyed on the route, not on the socket option
  if (msg->msg_iovlen != 1) return -EINVAL;  // dmx sends one iov; keep the double simple
  auto offset = reinterpret_cast<uintptr_t>(msg->msg_iov[0].iov_base);
  size_t len = msg->msg_iov[0].iov_len;
  if (offset >= tx_mem_.size() || len > tx_mem_.size() - offset) return -EFAULT;
  if (inflight_bytes_ >= tx_window) return -EAGAIN;
  size_t n = std::min(len, tx_window - inflight_bytes_);
  inflight_.push_back({zc_id_++, offset, n});
  inflight_bytes_ += n;
  return static_cast<ssize_t>(n);
}

void KernelDouble::complete(size_t n) {
  while (n-- > 0 && !inflight_.empty()) {
    auto f = inflight_.front();
    inflight_.pop_front();
    inflight_bytes_ -= f.len;
    wire.insert(wire.end(), tx_mem_.begin() + static_cast<long>(f.offset),
                tx_mem_.begin() + static_cast<long>(f.offset + f.len));  // the NIC reads now
    if (!errqueue_.empty() && errqueue_.back().second + 1 == f.id)
      errqueue_.back().second = f.id;  // the kernel coalesces unread notifications
    else
      errqueue_.push_back({f.id, f.id});
  }
}

ssize_t recv_zerocopy_notification(ZerocopyQueue& queue, msghdr* msg) {
  msg->msg_flags = 0;
  if (queue.empty()) return -EAGAIN;
  if (msg->msg_controllen < CMSG_SPACE(sizeof(sock_extended_err))) {
    msg->msg_flags |= MSG_CTRUNC;
    return -EAGAIN;
  }
  auto [lo, hi] = queue.front();
  queue.pop_front();
  sock_extended_err ee{};
  ee.ee_origin = SO_EE_ORIGIN_ZEROCOPY;
  ee.ee_info = lo;
  ee.ee_data = hi;
  auto* c = static_cast<cmsghdr*>(msg->msg_control);
  c->cmsg_level = SOL_IP;
  c->cmsg_type = IP_RECVERR;
  c->cmsg_len = CMSG_LEN(sizeof ee);
  std::memcpy(CMSG_DATA(c), &ee, sizeof ee);
  msg->msg_controllen = CMSG_SPACE(sizeof ee);
  return 0;
}

ssize_t KernelDouble::recv_errqueue(msghdr* msg) { return recv_zerocopy_notification(errqueue_, msg); }

int KernelDouble::setsockopt(int level, int name, const void* value, socklen_t len) {
  if (level != SOL_SOCKET) return -ENOPROTOOPT;
  if (name == abi::kSoDevmemDontneed) return dontneed(value, len);
  if (name == abi::kSoZerocopy) {
    if (len < sizeof(int)) return -EINVAL;
    int v;
    std::memcpy(&v, value, sizeof v);
    zerocopy_ = v != 0;
    return 0;
  }
  if (name == SO_BINDTODEVICE) {  // on a connected socket: sk_dst_reset(); the route is gone
    (void)value, (void)len;
    route_dev.clear();
    ++route_resets;
    return 0;
  }
  return -ENOPROTOOPT;
}

int KernelDouble::poll(short events, int timeout_ms) {
  for (int round = 0; round < 2; ++round) {
    if (auto_complete && !inflight_.empty()) complete(inflight_.size());
    int rev = 0;
    if ((events & POLLIN) && !queue_.empty()) rev |= POLLIN;
    if (!errqueue_.empty()) rev |= POLLERR;  // always reported, like the kernel
    if ((events & POLLOUT) && inflight_bytes_ < tx_window) rev |= POLLOUT;
    if (rev || round == 1 || !on_idle) return rev;
    on_idle();
  }
  return 0;
}

Status kernel_bind_error(std::string_view what, int err, std::string_view extack) {
  std::string text = fmt::format("{} failed: {}", what, errno_text(err));
  if (!extack.empty()) text += fmt::format("; kernel: {}", extack);
  Code code = (err == EOPNOTSUPP || err == ENOENT || err == EPERM || err == EACCES) ? Code::kUnavailable : Code::kIo;
  return Status(code, std::move(text));
}

namespace {
std::optional<std::pair<uint64_t, uint64_t>> file_key(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::nullopt;
  return std::make_pair(uint64_t{st.st_dev}, uint64_t{st.st_ino});
}
}  // namespace

UniqueFd DmabufFiles::make(size_t size) {
  UniqueFd fd(::memfd_create("dmx-double-dmabuf", MFD_CLOEXEC));
  if (fd.valid() && ::ftruncate(fd.get(), static_cast<off_t>(size)) == 0) adopt(fd.get());
  return fd;
}

void DmabufFiles::adopt(int fd) {
  if (auto k = file_key(fd)) files_.insert(*k);
}

int DmabufFiles::get(int fd) const {
  auto k = file_key(fd);
  if (!k) return -EBADF;
  return files_.count(*k) ? 0 : -EINVAL;  // dma_buf_get: !is_dma_buf_file(file)
}

int BindModel::check_rx(int idx, int fd_state, std::span<const uint32_t> queues, std::string* extack) const {
  if (idx != ifindex) return -ENODEV;
  if (!queue_api) return -EOPNOTSUPP;
  if (queues.empty()) {
    *extack = "missing attribute: queues";
    return -EINVAL;
  }
  for (uint32_t q : queues)
    if (q >= rx_queues) {
      *extack = "points at the attribute at offset 28 of the request";  // NL_SET_BAD_ATTR: an offset, no text
      return -EINVAL;
    }
  if (fd_state != 0) return fd_state;  // dma_buf_get(), no extack
  for (uint32_t q : queues) {
    if (!hds_on) {
      *extack = "tcp-data-split is disabled";
      return -EINVAL;
    }
    if (hds_thresh != 0) {
      *extack = "hds-thresh is not zero";
      return -EINVAL;
    }
    if (bound.count(q)) {
      *extack = "designated queue already memory provider bound";
      return -EEXIST;
    }
  }
  return 0;
}

int BindModel::check_tx(int idx, int fd_state, std::string* extack) const {
  if (idx != ifindex) return -ENODEV;
  if (!netmem_tx) {
    *extack = "Driver does not support netmem TX";
    return -EOPNOTSUPP;
  }
  return fd_state;
}

namespace {
class DoubleBinding final : public Binding {
 public:
  DoubleBinding(NetlinkDouble* nl, uint32_t id, std::vector<uint32_t> queues)
      : nl_(nl), id_(id), queues_(std::move(queues)) {
    nl_->open_bindings.insert(id);
    for (uint32_t q : queues_) nl_->nic.bound.insert(q);
  }
  ~DoubleBinding() override {
    nl_->open_bindings.erase(id_);
    for (uint32_t q : queues_) nl_->nic.bound.erase(q);
  }
  uint32_t id() const override { return id_; }

 private:
  NetlinkDouble* nl_;
  uint32_t id_;
  std::vector<uint32_t> queues_;
};
}  // namespace

Result<std::unique_ptr<Binding>> NetlinkDouble::bind_rx(int ifindex, int fd, std::span<const uint32_t> queues) {
  if (!rx_error.ok()) return rx_error;
  rx_queues_seen.emplace_back(queues.begin(), queues.end());
  std::string extack;
  if (int e = nic.check_rx(ifindex, dmabufs.get(fd), queues, &extack); e < 0)
    return kernel_bind_error(fmt::format("netdev bind-rx(ifindex {}, dmabuf fd {}, {} queues)", ifindex, fd, queues.size()),
                             -e, extack);
  return std::unique_ptr<Binding>(new DoubleBinding(this, next_id++, {queues.begin(), queues.end()}));
}

Result<std::unique_ptr<Binding>> NetlinkDouble::bind_tx(int ifindex, int fd) {
  if (!tx_error.ok()) return tx_error;
  std::string extack;
  if (int e = nic.check_tx(ifindex, dmabufs.get(fd), &extack); e < 0)
    return kernel_bind_error(fmt::format("netdev bind-tx(ifindex {}, dmabuf fd {})", ifindex, fd), -e, extack);
  return std::unique_ptr<Binding>(new DoubleBinding(this, next_id++, {}));
}

}  // namespace dmx::devmem::testing
