// The public handles of an endpoint and of an operation (include/dmx/endpoint.h): thin wrappers
// of EndpointImpl and OpState; an empty handle fails every call with the reason.
#include <chrono>

#include "core/sys.h"
#include "core/trace.h"
#include "engine/endpoint/endpoint_impl.h"
#include "stream/workers.h"

namespace dmx {

// --- Endpoint handle ---

Endpoint::Endpoint(std::shared_ptr<EndpointImpl> impl) : impl_(std::move(impl)) {}
Endpoint::~Endpoint() {
  if (impl_) (void)impl_->close();  // a failure was logged where it was found
}
Endpoint& Endpoint::operator=(Endpoint&& o) noexcept {
  if (this != &o) {
    if (impl_) (void)impl_->close();
    impl_ = std::move(o.impl_);
  }
  return *this;
}

namespace {
Status no_endpoint() { return Status(Code::kInvalidArgument, "operation on an empty Endpoint handle"); }
Request failed_request(Status s, const OpOptions& o) {
  auto op = std::make_shared<OpState>();
  op->final_status = s;
  op->completed.store(true);
  if (o.on_complete) o.on_complete(s, 0);
  else if (o.on_complete_tag) o.on_complete_tag(s, 0, 0);
  return Request(op);
}
}  // namespace

Request Endpoint::send(const MemRegion& src, uint64_t tag, OpOptions o) {
  return impl_ ? impl_->post_send(src, tag, std::move(o)) : failed_request(no_endpoint(), o);
}
Request Endpoint::recv(const MemRegion& dst, uint64_t tag, OpOptions o) {
  return impl_ ? impl_->post_recv(dst, tag, std::move(o)) : failed_request(no_endpoint(), o);
}
Request Endpoint::write(const MemRegion& src, const RemoteRegion& dst, uint64_t offset, OpOptions o) {
  return impl_ ? impl_->post_write(src, dst, offset, std::move(o)) : failed_request(no_endpoint(), o);
}
Request Endpoint::read(const MemRegion& dst, const RemoteRegion& src, uint64_t offset, OpOptions o) {
  return impl_ ? impl_->post_read(dst, src, offset, std::move(o)) : failed_request(no_endpoint(), o);
}
Request Endpoint::write_vec(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                           std::span<const IoEntry> entries, OpOptions o) {
  return impl_ ? impl_->post_write_vec(local, remote, entries, std::move(o)) : failed_request(no_endpoint(), o);
}
Request Endpoint::read_vec(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                          std::span<const IoEntry> entries, OpOptions o) {
  return impl_ ? impl_->post_read_vec(local, remote, entries, std::move(o)) : failed_request(no_endpoint(), o);
}
Request Endpoint::send_vec(std::span<const MemRegion> regions, std::span<const IoPiece> pieces, uint64_t tag,
                          OpOptions o) {
  return impl_ ? impl_->post_send_vec(regions, pieces, tag, std::move(o)) : failed_request(no_endpoint(), o);
}
Request Endpoint::recv_vec(std::span<const MemRegion> regions, std::span<const IoPiece> pieces, uint64_t tag,
                          OpOptions o) {
  return impl_ ? impl_->post_recv_vec(regions, pieces, tag, std::move(o)) : failed_request(no_endpoint(), o);
}
Result<Notification> Endpoint::next_notification(Duration timeout) {
  if (!impl_) return no_endpoint();
  return impl_->next_notification(timeout);
}
void Endpoint::on_notification(std::function<void(const Notification&)> handler) {
  if (impl_) impl_->set_note_handler(std::move(handler));
}
EndpointStats Endpoint::stats() const { return impl_ ? impl_->stats() : EndpointStats{}; }
std::string Endpoint::peer() const { return impl_ ? impl_->peer() : std::string(); }
Status Endpoint::health() const { return impl_ ? impl_->health() : no_endpoint(); }
Status Endpoint::close() { return impl_ ? impl_->close() : Status(); }

// --- Request ---

bool Request::test() const { return op_ && op_->completed.load(std::memory_order_acquire); }

Status Request::wait(Duration timeout) const {
  if (!op_) return Status(Code::kInvalidArgument, "wait on an empty Request");
  if (!op_->completed.load(std::memory_order_acquire) && timeout.count() > 0 && stream::Workers::on_worker_thread())
    return Status(Code::kInvalidArgument,
                  "wait() on a dmx worker thread (in a completion callback or notification handler) would hold "
                  "up the streams that complete operations; use test() or a callback there");
  // Small operations complete within tens of microseconds: spinning that long saves a futex sleep
  // and wake-up per operation. Not on small machines, where the spinner would take the core that
  // the completing worker needs (measured on 2 cores), nor once the operation is known to be
  // large, as it outlasts the spin: a waiter spinning through a stream of 1 MiB messages cost a
  // core (docs/performance.md). A receive counts as small until its message is matched.
  static const auto kSpin = std::chrono::microseconds(usable_cpus() >= 8 ? 100 : 0);
  constexpr uint64_t kSpinMaxBytes = 64 << 10;
  auto spin_until = std::chrono::steady_clock::now() + kSpin;
  while (!op_->completed.load(std::memory_order_acquire) &&
         op_->known_size.load(std::memory_order_relaxed) <= kSpinMaxBytes &&
         std::chrono::steady_clock::now() < spin_until) {
  }
  DMX_TRACE_POINT("wait.spun");
  std::unique_lock<std::mutex> lock(op_->mu);
  auto done = [&] { return op_->completed.load(std::memory_order_acquire); };
  if (timeout == kForever) op_->cv.wait(lock, done);
  else if (!op_->cv.wait_for(lock, timeout, done))
    return Status(Code::kTimeout, "the operation has not completed yet");
  return op_->final_status;
}

Status Request::status() const {
  if (!test()) return Status(Code::kInternal, "the operation has not completed yet");
  std::lock_guard<std::mutex> lock(op_->mu);
  return op_->final_status;
}

uint32_t Request::crc32c() const {
  if (!test()) return 0;
  std::lock_guard<std::mutex> lock(op_->mu);
  return op_->final_crc;
}

int64_t Request::failed_entry() const { return op_ ? op_->failed_entry : -1; }

size_t Request::bytes() const {
  if (!test()) return 0;
  std::lock_guard<std::mutex> lock(op_->mu);
  return op_->final_bytes;
}

uint64_t Request::tag() const {
  if (!test()) return 0;
  std::lock_guard<std::mutex> lock(op_->mu);
  return op_->matched_tag;
}

void Request::cancel() const {
  if (!op_ || test()) return;
  if (auto ep = op_->ep.lock()) ep->cancel(op_, Status(Code::kCancelled, "cancelled by the application"));
}

}  // namespace dmx
