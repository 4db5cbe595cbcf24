#include "devmem/socket_double.h"

#include "devmem/kernel_double.h"
#include "devmem/sim_state.h"

#include <linux/errqueue.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <vector>

#include "memory/backend.h"
#include "transport/devmem/kernel_abi.h"

namespace dmx::devmem::testing {
namespace {

// What the "NIC's DMA" reads at [off, off+n) of bound memory: host memory directly, sim memory
// through its backend (its pointers are handles, not addresses).
bool read_bound(const MemRegion& m, size_t off, size_t n, std::vector<uint8_t>* out) {
  out->resize(n);
  if (m.where.kind != MemKind::kSim) {
    std::memcpy(out->data(), static_cast<const uint8_t*>(m.ptr) + off, n);
    return true;
  }
  auto b = backend_for(m.where);
  if (!b.ok()) return false;
  auto q = (*b)->create_queue();
  if (!q.ok()) return false;
  if (!(*q)->to_host(out->data(), static_cast<const uint8_t*>(m.ptr) + off, n).ok()) return false;
  auto f = (*q)->record();
  return f.ok() && (*q)->wait(*f, Deadline::after(std::chrono::seconds(10))).ok();
}

uint64_t fnv(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}
}  // namespace

namespace {

class SimBinding final : public Binding {
 public:
  SimBinding(std::shared_ptr<SimNic::State> st, uint32_t id, std::vector<uint32_t> queues)
      : st_(std::move(st)), id_(id), queues_(std::move(queues)) {}
  ~SimBinding() override {
    std::lock_guard<std::mutex> lock(st_->mu);
    for (uint32_t q : queues_) st_->nic.bound.erase(q);
    st_->bindings.erase(id_);
    if (st_->rx_id == id_) {
      st_->rx_id = 0;
      st_->free_pages.clear();
    }
  }
  uint32_t id() const override { return id_; }

 private:
  std::shared_ptr<SimNic::State> st_;
  uint32_t id_;
  std::vector<uint32_t> queues_;
};

class SimNetlink final : public NetlinkOps {
 public:
  explicit SimNetlink(std::shared_ptr<SimNic::State> st) : st_(std::move(st)) {}
  NetdevSupport detect() override { return {true, true, true, ""}; }
  const void* kernel_id() const override { return st_.get(); }
  Result<std::unique_ptr<Binding>> bind_rx(int ifindex, int fd, std::span<const uint32_t> queues) override {
    return bind(ifindex, fd, queues, true);
  }
  Result<std::unique_ptr<Binding>> bind_tx(int ifindex, int fd) override { return bind(ifindex, fd, {}, false); }

 private:
  Result<std::unique_ptr<Binding>> bind(int ifindex, int fd, std::span<const uint32_t> queues, bool rx) {
    std::lock_guard<std::mutex> lock(st_->mu);
    auto it = st_->exports.find(fd);
    int fd_state = ::fcntl(fd, F_GETFD) < 0 ? -EBADF : it == st_->exports.end() ? -EINVAL : 0;
    std::string extack;
    int e = rx ? st_->nic.check_rx(ifindex, fd_state, queues, &extack) : st_->nic.check_tx(ifindex, fd_state, &extack);
    if (e < 0) return kernel_bind_error(fmt::format("sim {}(ifindex {}, fd {})", rx ? "bind-rx" : "bind-tx", ifindex, fd), -e, extack);
    MemRegion m = it->second.memory;
    if (m.where.kind == MemKind::kCuda)  // host, pinned and sim memory are addressable here
      return Status(Code::kInvalidArgument, "sim bind: the SimNic binds host (and sim) memory only");
    uint32_t id = st_->next_id++;
    st_->bindings[id] = {m, rx};
    if (rx) {
      for (uint32_t q : queues) st_->nic.bound.insert(q);
      st_->rx_id = id;
      st_->free_pages.clear();
      for (uint32_t p = 0; p < m.size / kPage; ++p) st_->free_pages.push_back(p);
    }
    return std::unique_ptr<Binding>(new SimBinding(st_, id, {queues.begin(), queues.end()}));
  }
  std::shared_ptr<SimNic::State> st_;
};

class SimSocket final : public KernelSocket {
 public:
  // The data socket was connected to a peer behind the NIC: its route leaves through it.
  SimSocket(std::shared_ptr<SimNic::State> st, int fd) : st_(std::move(st)), fd_(fd), route_dev_(st_->opt.ifname) {}

  ssize_t recvmsg(msghdr* msg, int flags) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    if (flags & MSG_ERRQUEUE) return recv_errqueue(msg);
    return recv_devmem(msg, flags);
  }

  ssize_t sendmsg(const msghdr* msg, int flags) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    const cmsghdr* dm = nullptr;
    for (cmsghdr* c = CMSG_FIRSTHDR(const_cast<msghdr*>(msg)); c; c = CMSG_NXTHDR(const_cast<msghdr*>(msg), c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == abi::kScmDevmemDmabuf) dm = c;
    if (!dm) return -EFAULT;  // an offset is not a user pointer
    if (dm->cmsg_len != CMSG_LEN(sizeof(uint32_t))) return -EINVAL;
    if (!(flags & abi::kMsgZerocopy) || !zerocopy_) return -EINVAL;
    uint32_t id;
    std::memcpy(&id, CMSG_DATA(dm), sizeof id);
    auto b = st_->bindings.find(id);
    if (b == st_->bindings.end() || b->second.rx) return -EINVAL;
    if (route_dev_ != st_->opt.ifname) return -ENODEV;  // the ROUTE must leave through the NIC
    if (msg->msg_iovlen != 1) return -EINVAL;
    auto offset = reinterpret_cast<uintptr_t>(msg->msg_iov[0].iov_base);
    size_t len = msg->msg_iov[0].iov_len;
    const MemRegion& m = b->second.memory;
    if (offset < st_->opt.dmabuf_offset || offset - st_->opt.dmabuf_offset > m.size ||
        len > m.size - (offset - st_->opt.dmabuf_offset))
      return -EFAULT;
    len = std::min(len, st_->opt.max_send);
    if (!read_bound(m, offset - st_->opt.dmabuf_offset, len, &dma_)) return -EIO;
    const uint8_t* src = dma_.data();
    ssize_t n = ::send(fd_, src, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) return -errno;
    if (n == 0) return -EAGAIN;
    inflight_.push_back({zc_id_++, id, offset - st_->opt.dmabuf_offset, static_cast<size_t>(n),
                         fnv(src, static_cast<size_t>(n))});
    ++st_->sends;
    return n;
  }

  int setsockopt(int level, int name, const void* value, socklen_t len) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    if (level != SOL_SOCKET) return -ENOPROTOOPT;
    if (name == abi::kSoDevmemDontneed) return dontneed(value, len);
    if (name == abi::kSoZerocopy) {
      if (len < sizeof(int)) return -EINVAL;
      int v;
      std::memcpy(&v, value, sizeof v);
      zerocopy_ = v != 0;
      return 0;
    }
    if (name == SO_BINDTODEVICE) {  // after connect: sk_dst_reset(), the route is gone (pre-fix kernels)
      route_dev_.clear();
      return 0;
    }
    return -ENOPROTOOPT;
  }

  int poll(short events, int timeout_ms) override {
    {
      std::lock_guard<std::mutex> lock(st_->mu);
      if (!errqueue_.empty() || !inflight_.empty()) return POLLERR;
    }
    pollfd p{fd_, events, 0};
    int r = ::poll(&p, 1, timeout_ms);
    if (r < 0) return -errno;
    return r == 0 ? 0 : p.revents;
  }

 private:
  struct InFlight {
    uint32_t zc_id;
    uint32_t binding;
    uint64_t offset;  // into the bound memory
    size_t len;
    uint64_t hash;
  };

  void complete_inflight() {
    for (const auto& f : inflight_) {
      auto b = st_->bindings.find(f.binding);
      std::vector<uint8_t> now;
      if (b != st_->bindings.end() && read_bound(b->second.memory, f.offset, f.len, &now) &&
          fnv(now.data(), f.len) != f.hash)
        ++st_->reused;  // the sender wrote into a region the NIC had not finished with
      if (!errqueue_.empty() && errqueue_.back().second + 1 == f.zc_id)
        errqueue_.back().second = f.zc_id;  // the kernel coalesces unread notifications
      else
        errqueue_.push_back({f.zc_id, f.zc_id});
    }
    inflight_.clear();
  }

  ssize_t recv_errqueue(msghdr* msg) {
    if (!inflight_.empty() && std::uniform_int_distribution<int>(0, 1)(st_->rng) == 0) complete_inflight();
    return recv_zerocopy_notification(errqueue_, msg);
  }

  ssize_t recv_devmem(msghdr* msg, int flags) {
    msg->msg_flags = 0;
    size_t want = 0;
    for (size_t i = 0; i < msg->msg_iovlen; ++i) want += msg->msg_iov[i].iov_len;
    if (msg->msg_iovlen != 1) return -EINVAL;  // dmx passes one iov
    peek_.resize(std::max<size_t>(want, 1));
    ssize_t r = ::recv(fd_, peek_.data(), want, MSG_PEEK | MSG_DONTWAIT);
    if (r < 0) return -errno;
    if (r == 0) {
      msg->msg_controllen = 0;
      return 0;  // the peer closed
    }
    auto* iov = static_cast<uint8_t*>(msg->msg_iov[0].iov_base);
    auto avail = static_cast<size_t>(r);
    if (st_->plain_next) {  // an ordinary skb (the flow reached an unbound queue): plain copy
      st_->plain_next = false;
      std::memcpy(iov, peek_.data(), avail);
      msg->msg_controllen = 0;
      return consume(avail);
    }
    if (!(flags & abi::kMsgSockDevmem)) return -EFAULT;
    auto b = st_->bindings.find(st_->rx_id);
    if (b == st_->bindings.end()) return -EFAULT;  // no RX binding: "devmem data" nowhere
    auto* pool = static_cast<uint8_t*>(b->second.memory.ptr);

    auto* ctrl = static_cast<uint8_t*>(msg->msg_control);
    size_t ctrl_cap = msg->msg_control ? msg->msg_controllen : 0, ctrl_used = 0;
    auto room = [&] { return ctrl_cap >= sizeof(cmsghdr) && ctrl_used + CMSG_LEN(sizeof(abi::DmabufCmsg)) <= ctrl_cap; };
    auto put = [&](int type, const abi::DmabufCmsg& d) {
      cmsghdr h{};
      h.cmsg_len = CMSG_LEN(sizeof d);
      h.cmsg_level = SOL_SOCKET;
      h.cmsg_type = type;
      std::memcpy(ctrl + ctrl_used, &h, sizeof h);
      std::memcpy(ctrl + ctrl_used + CMSG_LEN(0), &d, sizeof d);
      ctrl_used += std::min(CMSG_SPACE(sizeof d), ctrl_cap - ctrl_used);
    };
    std::uniform_int_distribution<uint32_t> pkt_size(st_->opt.min_packet, st_->opt.max_packet);
    std::uniform_real_distribution<double> coin(0, 1);
    std::uniform_int_distribution<uint32_t> page_off(0, kPage - 1);
    size_t at = 0, iov_at = 0;
    bool no_room = false, no_pages = false;
    while (at < avail && !no_room && !no_pages) {
      size_t pkt = std::min<size_t>(pkt_size(st_->rng), avail - at);
      if (coin(st_->rng) < st_->opt.linear_fraction) {
        if (!room()) {
          no_room = true;
          break;
        }
        abi::DmabufCmsg d{};
        d.frag_size = static_cast<uint32_t>(pkt);
        std::memcpy(iov + iov_at, peek_.data() + at, pkt);
        put(abi::kScmDevmemLinear, d);
        iov_at += pkt, at += pkt;
        ++st_->linear;
        continue;
      }
      while (pkt > 0) {
        if (!room()) {
          no_room = true;
          break;
        }
        if (st_->free_pages.empty()) {
          no_pages = true;
          break;
        }
        std::uniform_int_distribution<size_t> pick(0, st_->free_pages.size() - 1);
        size_t i = pick(st_->rng);
        uint32_t page = st_->free_pages[i];
        st_->free_pages[i] = st_->free_pages.back();
        st_->free_pages.pop_back();
        uint32_t off = page_off(st_->rng);
        auto len = static_cast<uint32_t>(std::min<size_t>(pkt, kPage - off));
        std::memcpy(pool + size_t{page} * kPage + off, peek_.data() + at, len);
        uint32_t token = st_->alloc_token();
        st_->tokens[token] = page;
        abi::DmabufCmsg d{};
        d.frag_offset = st_->opt.dmabuf_offset + uint64_t{page} * kPage + off;
        d.frag_size = len;
        d.frag_token = token;
        d.dmabuf_id = st_->rx_id;
        if (st_->corrupt_id) d.dmabuf_id = std::exchange(st_->corrupt_id, 0);
        if (st_->corrupt_offset) d.frag_offset = st_->opt.dmabuf_offset + b->second.memory.size + kPage, st_->corrupt_offset = false;
        if (st_->corrupt_token) d.frag_token = 0x80000000u + token, st_->corrupt_token = false;
        put(abi::kScmDevmemDmabuf, d);
        ++st_->frags;
        at += len, pkt -= len;
      }
    }
    msg->msg_controllen = ctrl_used;
    if (at == 0) {
      if (no_room) {
        ++st_->etoosmall;
        return -abi::kEtoosmall;
      }
      return -EAGAIN;  // page pool empty
    }
    return consume(at);
  }

  // Removes `n` peeked bytes from the real socket (they are there: this is its only reader).
  ssize_t consume(size_t n) {
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::recv(fd_, peek_.data(), n - done, MSG_DONTWAIT);
      if (r <= 0) return r < 0 ? -errno : -EPIPE;
      done += static_cast<size_t>(r);
    }
    return static_cast<ssize_t>(n);
  }

  int dontneed(const void* value, socklen_t len) {
    if (len % sizeof(abi::DmabufToken) || len > abi::kMaxDontneedTokens * sizeof(abi::DmabufToken)) return -EINVAL;
    size_t n = len / sizeof(abi::DmabufToken);
    std::vector<abi::DmabufToken> ranges(n);
    std::memcpy(ranges.data(), value, len);
    int freed = 0;
    size_t frags = 0;
    for (const auto& r : ranges) {
      for (uint32_t j = 0; j < r.token_count; ++j) {
        if (++frags > abi::kMaxDontneedFrags) return freed;
        auto it = st_->tokens.find(r.token_start + j);
        if (it == st_->tokens.end()) {
          ++st_->unknown_returns;
          continue;
        }
        st_->free_page(it->second);
        st_->free_tokens.insert(it->first);
        st_->tokens.erase(it);
        ++freed;
      }
    }
    return freed;
  }

  std::shared_ptr<SimNic::State> st_;
  int fd_;
  bool zerocopy_ = false;
  std::string route_dev_;
  uint32_t zc_id_ = 0;
  std::deque<InFlight> inflight_;
  ZerocopyQueue errqueue_;
  std::vector<uint8_t> peek_;
  std::vector<uint8_t> dma_;  // what one sendmsg reads from the bound memory
};

}  // namespace

SimNic::SimNic(SimNicOptions options) : state_(std::make_shared<State>(std::move(options))) {
  state_->nic.ifindex = 1000;
}
SimNic::~SimNic() = default;

HostSeams SimNic::seams() {
  HostSeams s;
  auto st = state_;
  s.netlink = std::make_shared<SimNetlink>(st);
  s.exporter = [st](MemRegion m) -> Result<DmabufExport> {
    DmabufExport e;
    e.fd.reset(::memfd_create("dmx-sim-dmabuf", MFD_CLOEXEC));
    if (!e.fd.valid()) return errno_status("memfd_create(sim dmabuf)", errno);
    e.offset = st->opt.dmabuf_offset;
    e.size = st->opt.dmabuf_offset + m.size;
    std::lock_guard<std::mutex> lock(st->mu);
    st->exports[e.fd.get()] = {m};
    return e;
  };
  s.socket = [st](int fd) { return std::unique_ptr<KernelSocket>(new SimSocket(st, fd)); };
  s.gatherer = [] { return Result<std::unique_ptr<Gatherer>>(make_host_gatherer()); };
  s.memory = MemSpec{MemKind::kHost, 0};
  if (state_->opt.gather_host_only)
    s.gathers_into = [](const MemSpec& m) { return m.kind == MemKind::kHost || m.kind == MemKind::kPinned; };
  s.ifname = state_->opt.ifname;
  s.ifindex = 1000;
  s.queues = {12, 13};
  if (state_->opt.zcrx)
    s.zcrx = [st](int ifindex, uint32_t queue, int sock, int dmabuf_fd, uint64_t size, uint32_t rq_entries) {
      return open_sim_zcrx(st, ifindex, queue, sock, dmabuf_fd, size, rq_entries);
    };
  return s;
}

std::shared_ptr<void> SimNic::occupy_queues(std::vector<uint32_t> queues) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    for (uint32_t q : queues) state_->nic.bound.insert(q);
  }
  auto st = state_;
  return std::shared_ptr<void>(nullptr, [st, queues](void*) {
    std::lock_guard<std::mutex> lock(st->mu);
    for (uint32_t q : queues) st->nic.bound.erase(q);
  });
}

#define DMX_SIM_LOCKED(expr)                   \
  std::lock_guard<std::mutex> lock(state_->mu); \
  expr

void SimNic::corrupt_next_id(uint32_t id) { DMX_SIM_LOCKED(state_->corrupt_id = id;) }
void SimNic::corrupt_next_offset() { DMX_SIM_LOCKED(state_->corrupt_offset = true;) }
void SimNic::corrupt_next_token() { DMX_SIM_LOCKED(state_->corrupt_token = true;) }
void SimNic::plain_next_call() { DMX_SIM_LOCKED(state_->plain_next = true;) }
void SimNic::zcrx_fault_next(ZcrxFault f) { DMX_SIM_LOCKED(state_->zcrx_fault = f;) }
void SimNic::set_queue_api(bool on) { DMX_SIM_LOCKED(state_->nic.queue_api = on;) }
ZcrxCounts SimNic::zcrx_counts() const {
  DMX_SIM_LOCKED(auto& s = *state_;)
  return {s.zcrx_ifqs, s.zcrx_cqes, s.zcrx_held, s.zcrx_refilled, s.zcrx_bad_refills, s.zcrx_ends};
}
size_t SimNic::outstanding_tokens() const { DMX_SIM_LOCKED(return state_->tokens.size();) }
size_t SimNic::unknown_returns() const { DMX_SIM_LOCKED(return state_->unknown_returns;) }
size_t SimNic::reused_before_completion() const { DMX_SIM_LOCKED(return state_->reused;) }
size_t SimNic::fragments() const { DMX_SIM_LOCKED(return state_->frags;) }
size_t SimNic::linear_chunks() const { DMX_SIM_LOCKED(return state_->linear;) }
size_t SimNic::sendmsg_calls() const { DMX_SIM_LOCKED(return state_->sends;) }
size_t SimNic::open_bindings() const { DMX_SIM_LOCKED(return state_->bindings.size();) }
size_t SimNic::etoosmall() const { DMX_SIM_LOCKED(return state_->etoosmall;) }

#undef DMX_SIM_LOCKED

}  // namespace dmx::devmem::testing
