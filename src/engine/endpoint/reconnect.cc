// Endpoint: reconnect (reconnect_timeout, with several links agreed; docs/reliability.md,
// "Reconnect"). When the last data stream stops while the endpoint is alive, it does not fail: an
// outage begins. The side that connected dials the peer's addresses again with backoff (50 ms
// doubling to 1 s), each new stream a REJOIN bound to the session, both epochs and the round, with
// a proof from the key; the listener routes it to this endpoint (ContextImpl::find_rejoinable).
// A rejoined stream is a new link: the streams below its round are replaced (stopped), the control
// stream moves to it, and the LINK_DOWNs of the dead streams go by it, so the chunks and control
// frames that had not landed go again exactly as when one link of several dies (endpoint/links.cc,
// control.cc): none lands twice, none is lost, and completion order is unchanged. The outage ends
// in failure, every pending operation with the reason, when reconnect_timeout passes (naming the
// last dial's error and the time waited), when the peer refuses the rejoin (it restarted: a new
// epoch or no such session), or when every address refuses the connection (nobody listens).
//
// The reconnect thread starts at the first outage and runs until the endpoint ends; it holds one
// of running_ (so the endpoint does not finish while it waits) and one of holders_. While the
// streams are gone it calls on_tick itself: deadlines and cancels still complete. Between outages
// it sleeps until the next one or the endpoint's end; the end also cuts a dial short (dial_cancel_).
#include <fmt/format.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/log.h"
#include "engine/endpoint/endpoint_impl.h"
#include "engine/endpoint/internal.h"
#include "engine/handshake.h"
#include "stream/cancel.h"
#include "stream/conduit.h"

namespace dmx {

using namespace endpoint;

namespace {
long long ms_of(Clock::duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }
}  // namespace

bool EndpointImpl::reconnect_on() const {
  return session_.multilink && session_.session_id != 0 && params_.reconnect_timeout.count() > 0;
}

bool EndpointImpl::begin_outage(const Status& why) {
  if (!status_.ok()) return false;
  size_t data = static_cast<size_t>(session_.streams) - 1;
  if (reconnects_ >= kMaxReconnects || streams_.size() + data > streams_.capacity()) {
    DMX_LOG_WARN("endpoint to {}: every stream is down and no reconnect is left ({} made, the most per endpoint)",
                 session_.peer, reconnects_);
    return false;
  }
  reconnecting_ = true;
  outage_since_ = Clock::now();
  outage_why_ = why;
  last_dial_ = Status();
  dial_attempts_ = 0;
  {
    // Counted control frames wait in the log until the peer's LINK_DOWN for the stream they went
    // by says how many landed (it comes by the rejoined stream).
    std::lock_guard<std::mutex> g(ctl_mu_);
    if (links_[static_cast<size_t>(ctl_used_)].stopped) ctl_hold_ = true;
  }
  DMX_LOG_WARN("endpoint to {}: every stream is down ({}); {} for up to {} ms (reconnect_timeout)", session_.peer,
               why.message(), session_.is_client ? "dialing the peer again" : "waiting for the peer to rejoin",
               ms_of(params_.reconnect_timeout));
  if (!reconnect_thread_started_) {
    reconnect_thread_started_ = true;
    dial_cancel_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));  // none: a dial runs to its deadline
    ++running_;
    holders_->add();
    reconnect_thread_ = std::thread([self = shared_from_this()] { self->reconnect_loop(); });
    pthread_setname_np(reconnect_thread_.native_handle(), "dmx-reconnect");  // seen from here on
  }
  reconnect_cv_.notify_all();
  return true;
}

void EndpointImpl::cancel_dial_locked() {
  if (!dial_cancel_.valid()) return;
  uint64_t one = 1;
  (void)!::write(dial_cancel_.get(), &one, sizeof one);  // stays readable: later dials end at once too
}

void EndpointImpl::reconnect_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  auto backoff = std::chrono::milliseconds(50);
  Clock::time_point next_dial{};
  while (status_.ok()) {
    if (!reconnecting_) {
      backoff = std::chrono::milliseconds(50);
      next_dial = Clock::time_point{};
      // Idle until an outage begins or the endpoint ends: no wake-up in between. Every change of
      // either is made under mu_ and notifies (begin_outage; end, close, evict_if_idle).
      reconnect_cv_.wait(lock, [&] { return reconnecting_ || !status_.ok(); });
      continue;
    }
    auto now = Clock::now();
    auto until = outage_since_ + params_.reconnect_timeout;
    if (now >= until) {
      std::string last = last_dial_.ok() ? "" : fmt::format("; the last dial: {}", last_dial_.message());
      Status s(Code::kPeerFailed,
               session_.is_client
                   ? fmt::format("every stream was lost ({}) and reconnecting gave up after {} ms and {} dial(s) "
                                 "(reconnect_timeout {} ms){}",
                                 outage_why_.message(), ms_of(now - outage_since_), dial_attempts_,
                                 ms_of(params_.reconnect_timeout), last)
                   : fmt::format("every stream was lost ({}) and the peer did not rejoin within {} ms "
                                 "(reconnect_timeout)",
                                 outage_why_.message(), ms_of(now - outage_since_)));
      lock.unlock();
      fail(s);
      lock.lock();
      break;
    }
    if (session_.is_client && now >= next_dial) {
      bool final = false;
      Status s = dial_round(lock, until, &final);
      if (!status_.ok() || !reconnecting_) continue;
      if (final) {
        lock.unlock();
        fail(s);
        lock.lock();
        break;
      }
      last_dial_ = s;
      next_dial = Clock::now() + backoff;
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
    // No stream ticks now: deadlines and cancels are looked at from here.
    auto wake = std::min(until, Clock::now() + std::chrono::milliseconds(20));
    if (session_.is_client) wake = std::min(wake, std::max(next_dial, Clock::now()));
    reconnect_cv_.wait_until(lock, wake);
    lock.unlock();
    (void)on_tick();
    lock.lock();
  }
  bool last = --running_ == 0;
  lock.unlock();
  if (last) all_stopped();
  std::shared_ptr<Holders> h = holders_;  // the endpoint may go with the last holder
  h->release();
}

// Caller holds `lock` (mu_); released while dialing.
Status EndpointImpl::dial_round(std::unique_lock<std::mutex>& lock, Clock::time_point until, bool* final) {
  const size_t data = static_cast<size_t>(session_.streams) - 1;
  const auto first = static_cast<uint16_t>(streams_.size());
  const int attempt = dial_attempts_++;
  const std::vector<std::string>& to = session_.redial;
  Status last;
  size_t refused = 0;
  stream::CancelWaits cancel(dial_cancel_.get());  // the endpoint's end ends the dial's waits
  lock.unlock();
  for (size_t k = 0; k < to.size(); ++k) {
    // The first stream: each address in turn until one answers; then the rest of the round.
    const std::string& address = to[(static_cast<size_t>(attempt) + k) % to.size()];
    Deadline deadline = Deadline::at(until).earlier(Deadline::after(params_.handshake_timeout));
    const auto dialed = Clock::now();
    RejoinOutcome out;
    auto fd = rejoin_stream(*ctx_, session_, address, first, first, deadline, &out);
    if (!fd.ok()) {
      last = fd.status();
      refused += out.refused ? 1 : 0;
      if (out.rejected) {
        *final = true;
        last = Status(Code::kPeerFailed, fmt::format("every stream was lost ({}), and the peer refused to resume "
                                                     "the session: {}",
                                                     outage_why_.message(), last.message()));
        break;
      }
      if (out.sent) {  // it may hold the stream or not: the two sides could disagree on the streams
        *final = true;
        auto now = Clock::now();
        last = Status(Code::kPeerFailed,
                      fmt::format("every stream was lost ({}), and the rejoin of stream {} got no answer in {} ms, "
                                  "{} ms into the outage (reconnect_timeout {} ms, handshake_timeout {} ms; {}): the "
                                  "endpoint cannot tell whether the peer took it",
                                  outage_why_.message(), first, ms_of(now - dialed), ms_of(now - outage_since_),
                                  ms_of(params_.reconnect_timeout), ms_of(params_.handshake_timeout), last.message()));
        break;
      }
      continue;
    }
    Status added = add_stream(first, first, std::move(*fd));
    if (!added.ok()) {
      lock.lock();
      return added;
    }
    // The round's other streams, by the address that answered; a failure leaves fewer links.
    for (size_t i = 1; i < data; ++i) {
      auto index = static_cast<uint16_t>(first + i);
      RejoinOutcome more;
      auto extra = rejoin_stream(*ctx_, session_, address, first, index,
                                 Deadline::after(params_.handshake_timeout), &more);
      if (extra.ok()) {
        if (!add_stream(first, index, std::move(*extra)).ok()) break;
        continue;
      }
      DMX_LOG_WARN("endpoint to {}: rejoined stream {} failed ({}); going on with {}", session_.peer, index,
                   extra.status().message(), i);
      if (more.sent) {
        fail(Status(Code::kPeerFailed,
                    fmt::format("the rejoin of stream {} got no answer ({}): the endpoint cannot tell whether the "
                                "peer took it",
                                index, extra.status().message())));
      }
      break;
    }
    lock.lock();
    return Status();
  }
  lock.lock();
  if (refused == to.size() && !*final) {
    *final = true;
    last = Status(Code::kPeerFailed,
                  fmt::format("every stream was lost ({}), and the peer refuses connections ({}): its process is "
                              "gone or it closed its listener",
                              outage_why_.message(), last.message()));
  }
  return last;
}

Status EndpointImpl::fits_locked(uint16_t first, uint16_t index) const {
  if (!status_.ok()) return Status(Code::kClosed, "the endpoint has ended");
  if (!reconnect_on()) return Status(Code::kProtocol, "this endpoint does not reconnect (reconnect_timeout is 0)");
  if (index != streams_.size() || first > index || (first != index && first + session_.streams - 1 <= index))
    return Status(Code::kProtocol, fmt::format("REJOIN for stream {} (round from {}), but the next is {}", index,
                                               first, streams_.size()));
  // At most kMaxReconnects rounds, each of at most streams - 1 streams: the table has room for them.
  if (first == index && reconnects_ >= kMaxReconnects)
    return Status(Code::kResourceExhausted,
                  fmt::format("REJOIN: the endpoint has reconnected {} times, the most it does", reconnects_));
  if (index >= streams_.capacity())
    return Status(Code::kResourceExhausted,
                  fmt::format("REJOIN for stream {}: the endpoint has room for {} streams, the most it takes", index,
                              streams_.capacity()));
  return Status();
}

Status EndpointImpl::rejoin_fits(uint16_t first, uint16_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  return fits_locked(first, index);
}

Status EndpointImpl::add_stream(uint16_t first, uint16_t index, UniqueFd fd) {
  std::shared_ptr<EndpointImpl> self = shared_from_this();
  stream::Workers* workers = own_workers_ ? own_workers_.get() : &ctx_->workers();
  stream::Stream* added = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    DMX_RETURN_IF_ERROR(fits_locked(first, index));
    streams_.push_back(make_stream(index, std::make_unique<stream::SocketConduit>(std::move(fd))));
    added = streams_[index].get();
    links_.emplace_back();
    ++links_alive_;
    ++running_;
    holders_->add();
    if (striping_) striping_->up(index);
    if (index == first) {
      // The older streams are dead to the peer: they go (their LINK_DOWNs follow), and the
      // control frames, with the LINK_DOWNs and counts they carried, move here.
      for (size_t k = 0; k < first; ++k) {
        if (links_[k].stopped) continue;
        if (links_[k].why.ok()) links_[k].why = Status(Code::kPeerFailed, "replaced by a rejoined stream");
        streams_[k]->stop();
      }
      {
        // Counted frames that went by an older stream may not have landed: they go again here
        // once the peer's LINK_DOWN for it gives the count, and new ones wait behind them.
        std::lock_guard<std::mutex> g(ctl_mu_);
        if (ctl_acked_ < ctl_sent_) ctl_hold_ = true;
        ctl_stream_.store(index);
      }
      ctl_repeat_links();
      ctl_resend_if_ready(ctl_used_);
      ++reconnects_;
      if (reconnecting_) {
        reconnecting_ = false;
        DMX_LOG_WARN("endpoint to {}: reconnected after {} ms (stream {}); reconnect {} of at most {}", session_.peer,
                     ms_of(Clock::now() - outage_since_), index, reconnects_, kMaxReconnects);
      } else {
        DMX_LOG_WARN("endpoint to {}: the peer rejoined (stream {}); the older streams are replaced", session_.peer,
                     index);
      }
      reconnect_cv_.notify_all();
    }
  }
  workers->add(added, /*bulk=*/true, self, [h = holders_] { h->release(); });
  wake_streams();
  return Status();
}

}  // namespace dmx
