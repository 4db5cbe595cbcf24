#include "dmx/status.h"

#include <fmt/format.h>

namespace dmx {

std::string_view code_name(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kNotFound: return "not found";
    case Code::kUnavailable: return "unavailable";
    case Code::kTimeout: return "timeout";
    case Code::kCancelled: return "cancelled";
    case Code::kClosed: return "closed";
    case Code::kProtocol: return "protocol error";
    case Code::kAuth: return "authentication failed";
    case Code::kIo: return "i/o error";
    case Code::kOutOfRange: return "out of range";
    case Code::kTruncated: return "truncated";
    case Code::kResourceExhausted: return "resource exhausted";
    case Code::kPeerFailed: return "peer failed";
    case Code::kDataLoss: return "data loss";
    case Code::kInternal: return "internal error";
  }
  return "unknown";
}

Status::Status(Code code, std::string message) {
  assert(code != Code::kOk && "use Status() for ok");
  rep_ = std::make_unique<Rep>(Rep{code, std::move(message), {}, {}});
}

Status::Status(const Status& other) : rep_(other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) rep_ = other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr;
  return *this;
}

static const std::string kEmpty;

const std::string& Status::message() const { return rep_ ? rep_->message : kEmpty; }
const std::string& Status::origin() const { return rep_ ? rep_->origin : kEmpty; }
const std::string& Status::peer() const { return rep_ ? rep_->peer : kEmpty; }

Status Status::with_peer(std::string_view peer) const {
  Status s(*this);
  if (s.rep_ && s.rep_->peer.empty()) s.rep_->peer = std::string(peer);
  return s;
}

Status Status::with_origin(std::string_view origin) const {
  Status s(*this);
  if (s.rep_ && s.rep_->origin.empty()) s.rep_->origin = std::string(origin);
  return s;
}

std::string Status::to_string() const {
  if (!rep_) return "ok";
  std::string out = fmt::format("{}: {}", code_name(rep_->code), rep_->message);
  if (!rep_->peer.empty() || !rep_->origin.empty()) {
    out += " [";
    if (!rep_->peer.empty()) out += "peer " + rep_->peer;
    if (!rep_->peer.empty() && !rep_->origin.empty()) out += ", ";
    out += rep_->origin;
    out += "]";
  }
  return out;
}

Error::Error(Status status)
    : std::runtime_error(status.to_string()), status_(std::make_shared<const Status>(std::move(status))) {}

Error::~Error() = default;

void throw_error(const Status& status) { throw Error(status); }

}  // namespace dmx
