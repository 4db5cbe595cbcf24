// A small generic-netlink client: just enough for the netdev and ethtool families.
//
// GenlSocket owns one NETLINK_GENERIC socket with extended acks on. Requests are built with
// GenlMessage (attributes, nests) and sent with request(); the kernel's errno and its extended-ack
// text come back verbatim in the Status ("bind-rx(ifindex 2) failed: Operation not supported
// (errno 95); kernel: Driver does not support netmem TX"). Not thread-safe: one owner.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/sys.h"
#include "dmx/status.h"

namespace dmx::devmem::nl {

// One attribute of a parsed message (payload points into the reply buffer).
struct Attr {
  uint16_t type = 0;
  std::span<const uint8_t> data;
  std::optional<uint32_t> u32() const;
  std::optional<uint8_t> u8() const;
  std::string str() const;
};
// Parses a run of attributes; malformed input yields what was parsed up to the first bad one.
std::vector<Attr> parse_attrs(std::span<const uint8_t> buf);
const Attr* find_attr(const std::vector<Attr>& attrs, uint16_t type);

class GenlMessage {
 public:
  GenlMessage(uint16_t family, uint8_t cmd, uint8_t version, uint16_t flags);
  void put_u32(uint16_t type, uint32_t v);
  void put_u8(uint16_t type, uint8_t v);
  void put_str(uint16_t type, std::string_view s);
  size_t begin_nest(uint16_t type);
  void end_nest(size_t at);
  std::vector<uint8_t>& bytes() { return buf_; }  // finished by GenlSocket (length, seq)

 private:
  void put(uint16_t type, const void* data, size_t len);
  std::vector<uint8_t> buf_;
};

struct Family {
  uint16_t id = 0;
  uint32_t version = 0;
  std::vector<uint32_t> ops;  // command ids the kernel offers
  bool has_op(uint32_t cmd) const;
};

class GenlSocket {
 public:
  static Result<GenlSocket> open();
  int fd() const { return fd_.get(); }

  // Resolves a family by name (CTRL_CMD_GETFAMILY), with its list of ops.
  Result<Family> resolve(std::string_view name);
  // Sends `msg` with NLM_F_REQUEST|NLM_F_ACK and collects the reply payloads (the attribute area
  // after the genl header of each data message) until the ack. `what` names the call in errors.
  Result<std::vector<std::vector<uint8_t>>> request(GenlMessage& msg, std::string_view what);

 private:
  explicit GenlSocket(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
  uint32_t seq_ = 1;
};

}  // namespace dmx::devmem::nl
