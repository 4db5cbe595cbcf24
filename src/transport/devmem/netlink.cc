#include "transport/devmem/netlink.h"

#include <fmt/format.h>
#include <linux/genetlink.h>
#include <linux/netlink.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <cstring>

namespace dmx::devmem::nl {
namespace {

constexpr size_t align4(size_t n) { return (n + 3) & ~size_t{3}; }

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

std::optional<uint32_t> Attr::u32() const {
  if (data.size() < 4) return std::nullopt;
  return load<uint32_t>(data.data());
}
std::optional<uint8_t> Attr::u8() const {
  if (data.empty()) return std::nullopt;
  return data[0];
}
std::string Attr::str() const {
  std::string s(reinterpret_cast<const char*>(data.data()), data.size());
  auto nul = s.find('\0');
  if (nul != std::string::npos) s.resize(nul);
  return s;
}

std::vector<Attr> parse_attrs(std::span<const uint8_t> buf) {
  std::vector<Attr> out;
  size_t off = 0;
  while (off + sizeof(nlattr) <= buf.size()) {
    auto a = load<nlattr>(buf.data() + off);
    if (a.nla_len < sizeof(nlattr) || off + a.nla_len > buf.size()) break;
    out.push_back(Attr{static_cast<uint16_t>(a.nla_type & NLA_TYPE_MASK),
                       buf.subspan(off + sizeof(nlattr), a.nla_len - sizeof(nlattr))});
    off += align4(a.nla_len);
  }
  return out;
}

const Attr* find_attr(const std::vector<Attr>& attrs, uint16_t type) {
  for (const auto& a : attrs)
    if (a.type == type) return &a;
  return nullptr;
}

bool Family::has_op(uint32_t cmd) const {
  for (uint32_t op : ops)
    if (op == cmd) return true;
  return false;
}

GenlMessage::GenlMessage(uint16_t family, uint8_t cmd, uint8_t version, uint16_t flags) {
  nlmsghdr h{};
  h.nlmsg_type = family;
  h.nlmsg_flags = flags;
  genlmsghdr g{};
  g.cmd = cmd;
  g.version = version;
  buf_.resize(NLMSG_HDRLEN + GENL_HDRLEN);
  std::memcpy(buf_.data(), &h, sizeof h);
  std::memcpy(buf_.data() + NLMSG_HDRLEN, &g, sizeof g);
}

void GenlMessage::put(uint16_t type, const void* data, size_t len) {
  nlattr a{};
  a.nla_len = static_cast<uint16_t>(sizeof(nlattr) + len);
  a.nla_type = type;
  size_t at = buf_.size();
  buf_.resize(at + align4(a.nla_len), 0);
  std::memcpy(buf_.data() + at, &a, sizeof a);
  if (len) std::memcpy(buf_.data() + at + sizeof a, data, len);
}
void GenlMessage::put_u32(uint16_t type, uint32_t v) { put(type, &v, sizeof v); }
void GenlMessage::put_u8(uint16_t type, uint8_t v) { put(type, &v, sizeof v); }
void GenlMessage::put_str(uint16_t type, std::string_view s) {
  std::string z(s);
  put(type, z.c_str(), z.size() + 1);
}
size_t GenlMessage::begin_nest(uint16_t type) {
  size_t at = buf_.size();
  put(static_cast<uint16_t>(type | NLA_F_NESTED), nullptr, 0);
  return at;
}
void GenlMessage::end_nest(size_t at) {
  auto len = static_cast<uint16_t>(buf_.size() - at);
  std::memcpy(buf_.data() + at, &len, sizeof len);
}

Result<GenlSocket> GenlSocket::open() {
  int fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_GENERIC);
  if (fd < 0) return errno_status("socket(AF_NETLINK, NETLINK_GENERIC)", errno, Code::kUnavailable);
  UniqueFd owned(fd);
  int one = 1;
  // Extended acks carry the kernel's error text; capped acks keep replies small. Both are
  // best effort (old kernels lack them), so failures are ignored.
  (void)::setsockopt(fd, SOL_NETLINK, NETLINK_EXT_ACK, &one, sizeof one);
  (void)::setsockopt(fd, SOL_NETLINK, NETLINK_CAP_ACK, &one, sizeof one);
  timeval tv{5, 0};  // the kernel answers at once; never hang on a lost reply
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_nl sa{};
  sa.nl_family = AF_NETLINK;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0) return errno_status("bind(netlink)", errno);
  return GenlSocket(std::move(owned));
}

Result<std::vector<std::vector<uint8_t>>> GenlSocket::request(GenlMessage& msg, std::string_view what) {
  auto& b = msg.bytes();
  uint32_t seq = seq_++;
  auto len = static_cast<uint32_t>(b.size());
  std::memcpy(b.data() + offsetof(nlmsghdr, nlmsg_len), &len, sizeof len);
  std::memcpy(b.data() + offsetof(nlmsghdr, nlmsg_seq), &seq, sizeof seq);
  uint16_t flags = load<uint16_t>(b.data() + offsetof(nlmsghdr, nlmsg_flags)) | NLM_F_REQUEST | NLM_F_ACK;
  std::memcpy(b.data() + offsetof(nlmsghdr, nlmsg_flags), &flags, sizeof flags);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(fd_.get(), b.data(), b.size(), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0)
    return errno_status(fmt::format("{}: sendto(netlink)", what), errno);

  std::vector<std::vector<uint8_t>> replies;
  std::vector<uint8_t> buf(64 * 1024);
  for (;;) {
    ssize_t n = ::recv(fd_.get(), buf.data(), buf.size(), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(fmt::format("{}: recv(netlink)", what), errno);
    }
    size_t off = 0;
    while (off + NLMSG_HDRLEN <= static_cast<size_t>(n)) {
      auto h = load<nlmsghdr>(buf.data() + off);
      if (h.nlmsg_len < NLMSG_HDRLEN || off + h.nlmsg_len > static_cast<size_t>(n))
        return Status(Code::kProtocol, fmt::format("{}: malformed netlink reply", what));
      const uint8_t* body = buf.data() + off + NLMSG_HDRLEN;
      size_t body_len = h.nlmsg_len - NLMSG_HDRLEN;
      if (h.nlmsg_seq == seq && h.nlmsg_type == NLMSG_ERROR) {
        if (body_len < sizeof(nlmsgerr)) return Status(Code::kProtocol, fmt::format("{}: short netlink ack", what));
        auto e = load<nlmsgerr>(body);
        if (e.error == 0) return replies;
        std::string text = fmt::format("{} failed: {}", what, errno_text(-e.error));
        if (h.nlmsg_flags & NLM_F_ACK_TLVS) {
          // TLVs follow the echoed request header (and its payload unless the ack was capped).
          size_t skip = sizeof(nlmsgerr);
          if (!(h.nlmsg_flags & NLM_F_CAPPED)) skip = sizeof(int) + e.msg.nlmsg_len;
          if (skip <= body_len) {
            auto tlvs = parse_attrs({body + align4(skip), body_len - std::min(body_len, align4(skip))});
            if (const Attr* m = find_attr(tlvs, NLMSGERR_ATTR_MSG)) {
              text += "; kernel: " + m->str();
            } else if (const Attr* o = find_attr(tlvs, NLMSGERR_ATTR_OFFS); o && o->u32()) {
              // NL_SET_BAD_ATTR: no text, only where in our request (a queue id out of range, ...).
              text += fmt::format("; kernel: points at the attribute at offset {} of the request", *o->u32());
            }
          }
        }
        Code code = (-e.error == EOPNOTSUPP || -e.error == ENOENT) ? Code::kUnavailable : Code::kIo;
        if (-e.error == EPERM || -e.error == EACCES) code = Code::kUnavailable;
        return Status(code, std::move(text));
      }
      if (h.nlmsg_seq == seq && h.nlmsg_type != NLMSG_NOOP && h.nlmsg_type != NLMSG_DONE && body_len >= GENL_HDRLEN)
        replies.emplace_back(body + GENL_HDRLEN, body + body_len);
      off += NLMSG_ALIGN(h.nlmsg_len);
    }
  }
}

Result<Family> GenlSocket::resolve(std::string_view name) {
  GenlMessage m(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1, 0);
  m.put_str(CTRL_ATTR_FAMILY_NAME, name);
  auto replies = request(m, fmt::format("genl getfamily({})", name));
  if (!replies.ok()) return replies.status();
  if (replies->empty()) return Status(Code::kProtocol, fmt::format("genl getfamily({}): no reply", name));
  Family f;
  auto attrs = parse_attrs(replies->front());
  if (auto* a = find_attr(attrs, CTRL_ATTR_FAMILY_ID); a && a->data.size() >= 2) f.id = load<uint16_t>(a->data.data());
  if (auto* a = find_attr(attrs, CTRL_ATTR_VERSION)) f.version = a->u32().value_or(0);
  if (auto* ops = find_attr(attrs, CTRL_ATTR_OPS)) {
    for (const auto& op : parse_attrs(ops->data)) {
      auto inner = parse_attrs(op.data);
      if (auto* id = find_attr(inner, CTRL_ATTR_OP_ID); id && id->u32()) f.ops.push_back(*id->u32());
    }
  }
  if (f.id == 0) return Status(Code::kProtocol, fmt::format("genl getfamily({}): reply without a family id", name));
  return f;
}

}  // namespace dmx::devmem::nl
