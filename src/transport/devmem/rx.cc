#include "transport/devmem/rx.h"

#include <fmt/format.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/config.h"
#include "core/log.h"
#include "core/sys.h"
#include "transport/devmem/kernel_abi.h"

namespace dmx::devmem {

Status parse_recv(const msghdr& msg, size_t ret, size_t requested, const RxPool& pool, uint64_t dst_offset,
                  ParsedRecv* out) {
  if (ret > requested)
    return Status(Code::kProtocol, fmt::format("recvmsg returned {} bytes, more than the {} asked for", ret, requested));
  if (msg.msg_flags & MSG_CTRUNC)
    return Status(Code::kProtocol, "recvmsg(MSG_SOCK_DEVMEM): control messages truncated (tokens would be lost)");
  uint64_t stream = 0;   // bytes of this call accounted so far
  uint64_t linear = 0;   // bytes the kernel wrote into the host iov so far (packed, in order)
  size_t ncmsg = 0;
  Status first;          // first validation error; parsing goes on so every token is recorded
  auto note = [&first](Status s) {
    if (first.ok()) first = std::move(s);
  };
  for (cmsghdr* c = CMSG_FIRSTHDR(const_cast<msghdr*>(&msg)); c; c = CMSG_NXTHDR(const_cast<msghdr*>(&msg), c)) {
    ++ncmsg;
    if (c->cmsg_level != SOL_SOCKET ||
        (c->cmsg_type != abi::kScmDevmemDmabuf && c->cmsg_type != abi::kScmDevmemLinear)) {
      note(Status(Code::kProtocol, fmt::format("recvmsg: unexpected control message level {} type {}", c->cmsg_level,
                                               c->cmsg_type)));
      continue;
    }
    if (c->cmsg_len < CMSG_LEN(sizeof(abi::DmabufCmsg))) {
      note(Status(Code::kProtocol, fmt::format("recvmsg: short devmem control message ({} bytes)", c->cmsg_len)));
      continue;
    }
    abi::DmabufCmsg d;
    std::memcpy(&d, CMSG_DATA(c), sizeof d);
    if (c->cmsg_type == abi::kScmDevmemLinear) {
      if (d.frag_size == 0 || linear + d.frag_size > requested) {
        note(Status(Code::kProtocol, fmt::format("recvmsg: linear chunk of {} bytes overruns the {}-byte iov",
                                                 d.frag_size, requested)));
        continue;
      }
      out->linear.push_back({linear, dst_offset + stream, d.frag_size});
      linear += d.frag_size;
      stream += d.frag_size;
      continue;
    }
    // Every real token goes back, even from a fragment we reject; one beyond 31 bits cannot be
    // real (the kernel's xarray never hands it out), so it is not sent back either.
    if (d.frag_token <= abi::kMaxToken) out->tokens.push_back(d.frag_token);
    if (d.dmabuf_id != pool.dmabuf_id) {
      note(Status(Code::kProtocol, fmt::format("recvmsg: fragment of unknown dmabuf id {} (this socket's binding is {})",
                                               d.dmabuf_id, pool.dmabuf_id)));
      continue;
    }
    if (d.frag_token > abi::kMaxToken) {
      note(Status(Code::kProtocol, fmt::format("recvmsg: token {} beyond the kernel's 31-bit range", d.frag_token)));
      continue;
    }
    if (d.frag_size == 0 || d.frag_size > abi::kMaxFragSize) {
      note(Status(Code::kProtocol, fmt::format("recvmsg: fragment size {} (must be 1..{})", d.frag_size,
                                               abi::kMaxFragSize)));
      continue;
    }
    if (d.frag_offset < pool.dmabuf_offset || d.frag_offset - pool.dmabuf_offset > pool.memory.size ||
        d.frag_size > pool.memory.size - (d.frag_offset - pool.dmabuf_offset)) {
      note(Status(Code::kOutOfRange,
                  fmt::format("recvmsg: fragment [{}, +{}) outside the bound buffer [{}, +{})", d.frag_offset,
                              d.frag_size, pool.dmabuf_offset, pool.memory.size)));
      continue;
    }
    out->frags.push_back({d.frag_offset - pool.dmabuf_offset, dst_offset + stream, d.frag_size});
    stream += d.frag_size;
  }
  if (!first.ok()) return first;
  if (ncmsg == 0 && ret > 0) {
    // Ordinary TCP data (the flow reached a queue without a binding): all of it is in the iov.
    out->plain = true;
    out->linear.push_back({0, dst_offset, static_cast<uint32_t>(ret)});
    stream = ret;
  }
  if (stream != ret)
    return Status(Code::kProtocol,
                  fmt::format("recvmsg returned {} bytes but its control messages account for {}", ret, stream));
  out->bytes = stream;
  return Status();
}

RxOptions rx_options(const Config& config) {
  RxOptions o;
  o.recv_chunk = config.get_size("devmem_recv_chunk");
  o.control_size = config.get_size("devmem_control_buffer");
  o.control_max = std::max<size_t>(o.control_size, 4 << 20);
  o.max_outstanding_frags = static_cast<size_t>(std::max<int64_t>(1, config.get_int("devmem_max_outstanding_frags")));
  o.efault_may_mean_small_control = running_kernel_before(6, 14);
  return o;
}

Result<std::unique_ptr<DevmemRx>> DevmemRx::create(KernelSocket* sock, RxPool pool, Gatherer* gatherer,
                                                   RxOptions options) {
  if (options.recv_chunk == 0 || options.recv_chunk > (1u << 31) || options.control_size < sizeof(cmsghdr) ||
      options.control_max < options.control_size)
    return Status(Code::kInvalidArgument, "devmem rx: bad options (recv_chunk, control_size, control_max)");
  std::unique_ptr<DevmemRx> rx(new DevmemRx(sock, pool, gatherer, std::move(options)));
  DMX_ASSIGN_OR_RETURN(void* lin, gatherer->allocate_linear(rx->opt_.recv_chunk));
  rx->linear_ = static_cast<uint8_t*>(lin);
  return rx;
}

DevmemRx::DevmemRx(KernelSocket* sock, RxPool pool, Gatherer* gatherer, RxOptions options)
    : sock_(sock), pool_(pool), gatherer_(gatherer), opt_(std::move(options)), control_(opt_.control_size) {}

DevmemRx::~DevmemRx() {
  (void)release_everything();
  if (linear_) gatherer_->free_linear(linear_, opt_.recv_chunk);
}

Status DevmemRx::reclaim(bool wait_all, Deadline deadline) {
  std::vector<uint32_t> tokens;
  Status st;
  while (!pending_.empty()) {
    auto& p = pending_.front();
    if (wait_all) {
      st = gatherer_->wait(p.fence, deadline);
      if (!st.ok()) break;
    } else {
      auto d = gatherer_->done(p.fence);
      if (!d.ok()) {
        st = d.status();
        break;
      }
      if (!*d) break;
    }
    tokens.insert(tokens.end(), p.tokens.begin(), p.tokens.end());
    outstanding_ -= p.tokens.size();
    pending_.pop_front();
  }
  if (!tokens.empty()) {
    Status r = return_tokens(*sock_, tokens, &stats_.tokens);
    if (st.ok()) st = r;
  }
  return st;
}

Status DevmemRx::release_everything() {
  if (pending_.empty()) return Status();
  // Bounded: a failed device must not hang the connection's teardown.
  Status st = reclaim(true, Deadline::after(std::chrono::seconds(5)));
  if (!pending_.empty()) {
    // The gather did not finish; give the tokens back anyway (the kernel would at close).
    std::vector<uint32_t> tokens;
    for (auto& p : pending_) tokens.insert(tokens.end(), p.tokens.begin(), p.tokens.end());
    pending_.clear();
    outstanding_ = 0;
    Status r = return_tokens(*sock_, tokens, &stats_.tokens);
    if (st.ok()) st = r;
  }
  return st;
}

Status DevmemRx::fail(Status s) {
  if (!opt_.peer.empty()) s = s.with_peer(opt_.peer);
  s = s.with_origin("devmem/rx");
  DMX_LOG_ERROR("devmem rx: {}", s.to_string());
  failed_ = s;
  (void)release_everything();
  return s;
}

Status DevmemRx::receive(MemRegion dst, Deadline deadline) {
  if (!failed_.ok()) return failed_;
  size_t got = 0;
  while (got < dst.size) {
    bool would_block = false;
    DMX_RETURN_IF_ERROR(step(dst, &got, deadline, &would_block));
    if (!would_block) continue;
    if (deadline.expired())
      return fail(Status(Code::kTimeout, fmt::format("devmem receive: {} of {} bytes by the deadline", got, dst.size)));
    int r = sock_->poll(POLLIN, std::min(deadline.poll_timeout_ms() < 0 ? 1000 : deadline.poll_timeout_ms(), 1000));
    if (r < 0) return fail(errno_status("poll(devmem socket)", -r));
  }
  return finish(deadline);
}

Status DevmemRx::receive_some(MemRegion dst, size_t* got, Deadline device_deadline) {
  if (!failed_.ok()) return failed_;
  if (*got >= dst.size) return Status();
  bool would_block = false;
  return step(dst, got, device_deadline, &would_block);
}

Status DevmemRx::finish(Deadline deadline) {
  if (!failed_.ok()) return failed_;
  // Completion contract: dst holds the bytes and the kernel has its buffers back.
  if (Status s = reclaim(true, deadline); !s.ok()) return fail(std::move(s));
  linear_fence_ = 0;
  return Status();
}

Status DevmemRx::step(MemRegion dst, size_t* got_io, Deadline deadline, bool* would_block) {
  size_t& got = *got_io;
  if (Status s = reclaim(false, deadline); !s.ok()) return fail(std::move(s));
  while (outstanding_ >= opt_.max_outstanding_frags && !pending_.empty()) {
    Status s = gatherer_->wait(pending_.front().fence, deadline);
    if (!s.ok()) return fail(std::move(s));
    if (Status r = reclaim(false, deadline); !r.ok()) return fail(std::move(r));
  }
  if (linear_fence_ != 0) {  // the kernel is about to overwrite the linear buffer
    if (Status s = gatherer_->wait(linear_fence_, deadline); !s.ok()) return fail(std::move(s));
    linear_fence_ = 0;
  }
  size_t want = std::min(dst.size - got, opt_.recv_chunk);
  iovec iov{linear_, want};
  msghdr msg{};
  ssize_t n = recv_devmem(&msg, &iov);
  ++stats_.recv_calls;
  if (n == -EAGAIN || n == -EWOULDBLOCK) {
    *would_block = true;
    return Status();
  }
  bool small_control = n == -abi::kEtoosmall || (n == -EFAULT && opt_.efault_may_mean_small_control &&
                                                  control_.size() < opt_.control_max);
  if (small_control) {
    if (control_.size() >= opt_.control_max)
      return fail(Status(Code::kResourceExhausted,
                         fmt::format("recvmsg(MSG_SOCK_DEVMEM): ETOOSMALL with a {}-byte control buffer", control_.size())));
    // On kernels before 6.14 this was EFAULT: grown like ETOOSMALL (fatal at control_max, below).
    control_.resize(std::min(control_.size() * 2, opt_.control_max));
    ++stats_.control_grows;
    return Status();
  }
  if (n == -EFAULT)
    return fail(Status(Code::kIo, fmt::format("recvmsg(MSG_SOCK_DEVMEM) failed: EFAULT: the kernel could not deliver "
                                              "devmem data (fragments of another binding on this socket, or a bad host "
                                              "iov{})",
                                              opt_.efault_may_mean_small_control
                                                  ? fmt::format(", or a control buffer too small even at {} bytes on "
                                                                "this pre-6.14 kernel", control_.size())
                                                  : "")));
  if (n < 0) return fail(errno_status("recvmsg(MSG_SOCK_DEVMEM)", static_cast<int>(-n)));
  if (n == 0)
    return fail(Status(Code::kClosed, fmt::format("peer closed the connection after {} of {} bytes", got, dst.size)));

  ParsedRecv p;
  Status ps = parse_recv(msg, static_cast<size_t>(n), want, pool_, got, &p);
  if (!ps.ok()) {
    pending_.push_back({0, std::move(p.tokens)});  // fence 0: nothing to wait for
    outstanding_ += pending_.back().tokens.size();
    return fail(std::move(ps));
  }
  auto fence = gatherer_->enqueue(pool_.memory, p.frags, linear_, p.linear, dst);
  if (!fence.ok()) {
    pending_.push_back({0, std::move(p.tokens)});
    outstanding_ += pending_.back().tokens.size();
    return fail(fence.status());
  }
  ++stats_.gathers;
  stats_.frags += p.frags.size();
  for (const auto& c : p.linear) stats_.linear_bytes += c.len;
  stats_.linear_chunks += p.linear.size();
  for (const auto& f : p.frags) stats_.devmem_bytes += f.len;
  if (p.plain) ++stats_.plain_calls;
  if (!p.linear.empty()) linear_fence_ = *fence;
  outstanding_ += p.tokens.size();
  pending_.push_back({*fence, std::move(p.tokens)});
  got += p.bytes;
  return Status();
}

// One non-blocking recvmsg(MSG_SOCK_DEVMEM) into `iov` (the linear buffer) with the full control
// buffer; returns what the seam returns (bytes, or -errno).
ssize_t DevmemRx::recv_devmem(msghdr* msg, iovec* iov) {
  msg->msg_iov = iov;
  msg->msg_iovlen = 1;
  msg->msg_control = control_.data();
  msg->msg_controllen = control_.size();
  return sock_->recvmsg(msg, abi::kMsgSockDevmem | MSG_DONTWAIT);
}

Status DevmemRx::reject_unexpected() {
  if (!failed_.ok()) return failed_;
  iovec iov{linear_, opt_.recv_chunk};
  msghdr msg{};
  ssize_t n = recv_devmem(&msg, &iov);
  if (n == -EAGAIN || n == -EWOULDBLOCK) return Status();
  if (n > 0) {
    ParsedRecv p;
    (void)parse_recv(msg, static_cast<size_t>(n), opt_.recv_chunk, pool_, 0, &p);
    outstanding_ += p.tokens.size();
    pending_.push_back({0, std::move(p.tokens)});
    return fail(Status(Code::kProtocol, fmt::format("peer sent {} bytes more than it announced", n)));
  }
  if (n == 0) return fail(Status(Code::kClosed, "peer closed the connection"));
  return fail(errno_status("recvmsg(MSG_SOCK_DEVMEM)", static_cast<int>(-n)));
}

}  // namespace dmx::devmem
