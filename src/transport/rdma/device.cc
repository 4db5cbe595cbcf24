#include "transport/rdma/device.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>

#include "core/log.h"
#include "core/sys.h"

namespace dmx::rdma {
namespace {

struct DeviceList {
  ibv_device** list = nullptr;
  int n = 0;
  DeviceList() { list = ibv_get_device_list(&n); }
  ~DeviceList() {
    if (list) ibv_free_device_list(list);
  }
};

// ENOSYS: the kernel has no RDMA subsystem (no /sys/class/infiniband, no uverbs).
std::string list_failed(int err) {
  if (err == ENOSYS)
    return fmt::format("this kernel has no RDMA support (ibv_get_device_list failed: {}; no /sys/class/infiniband)",
                       errno_text(err));
  return fmt::format("ibv_get_device_list failed: {}", errno_text(err));
}

const char* state_text(ibv_port_state s) { return ibv_port_state_str(s); }

bool v4_mapped(const Gid& g) {
  static const unsigned char prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.data(), prefix, 12) == 0;
}

std::string gid_kind(ibv_gid_type t, const Gid& g) {
  switch (t) {
    case IBV_GID_TYPE_IB: return "IB";
    case IBV_GID_TYPE_ROCE_V1: return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2: return v4_mapped(g) ? "RoCE v2 IPv4" : "RoCE v2 IPv6";
  }
  return "unknown";
}

// The GID to use on an active port: `want` when >= 0 (it must be valid), else a RoCE v2 IPv4 one,
// else RoCE v2 IPv6, else the first valid one. kUnavailable naming the port when none is.
Status choose_gid(ibv_context* ctx, const std::string& name, PortChoice* c, int want, int table_len) {
  int best = -1, best_rank = -1;
  ibv_gid_entry best_e{};
  for (int i = 0; i < table_len; ++i) {
    if (want >= 0 && i != want) continue;
    ibv_gid_entry e{};
    if (ibv_query_gid_ex(ctx, c->port, static_cast<uint32_t>(i), &e, 0) != 0) continue;  // empty slot
    Gid g;
    std::memcpy(g.data(), e.gid.raw, g.size());
    if (g == Gid{}) continue;
    int rank = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? (v4_mapped(g) ? 3 : 2) : 1;
    if (rank > best_rank) best = i, best_rank = rank, best_e = e;
  }
  if (best < 0)
    return Status(Code::kUnavailable,
                  want >= 0 ? fmt::format("rdma: {} port {} has no valid GID at index {} (rdma_gid_index)", name,
                                          c->port, want)
                            : fmt::format("rdma: {} port {} has no valid GID (no IP address on its netdev for RoCE?)",
                                          name, c->port));
  c->gid_index = best;
  std::memcpy(c->gid.data(), best_e.gid.raw, c->gid.size());
  c->gid_kind = gid_kind(static_cast<ibv_gid_type>(best_e.gid_type), c->gid);
  return Status();
}

// Whether port `p` of an open device is usable, filling `c`; else why not.
Status check_port(ibv_context* ctx, const std::string& name, uint8_t p, int gid_index, PortChoice* c) {
  ibv_port_attr pa{};
  if (int err = ibv_query_port(ctx, p, &pa); err != 0)
    return Status(Code::kUnavailable, fmt::format("rdma: ibv_query_port({} port {}) failed: {}", name, p, errno_text(err)));
  if (pa.state != IBV_PORT_ACTIVE)
    return Status(Code::kUnavailable, fmt::format("rdma: {} port {} is {} (not ACTIVE)", name, p, state_text(pa.state)));
  c->device = name;
  c->port = p;
  c->ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
  c->lid = pa.lid;
  c->mtu = static_cast<uint8_t>(pa.active_mtu);
  return choose_gid(ctx, name, c, gid_index, pa.gid_tbl_len);
}

}  // namespace

const char* mtu_text(uint8_t mtu) {
  switch (mtu) {
    case IBV_MTU_256: return "256";
    case IBV_MTU_512: return "512";
    case IBV_MTU_1024: return "1024";
    case IBV_MTU_2048: return "2048";
    case IBV_MTU_4096: return "4096";
  }
  return "?";
}

Device::~Device() {
  if (ctx_) ibv_close_device(ctx_);
}

std::string Device::describe() const {
  return fmt::format("{} port {} GID {} ({} {}) MTU {}", choice_.device, choice_.port, choice_.gid_index,
                     choice_.gid_kind, gid_text(choice_.gid), mtu_text(choice_.mtu));
}

Result<std::shared_ptr<Device>> open_device(const Config& config) {
  const std::string& want = config.get_string("rdma_device");
  const int64_t want_port = config.get_int("rdma_port");
  const int64_t gid_index = config.get_int("rdma_gid_index");
  if (want_port < 0 || want_port > 255)
    return Status(Code::kUnavailable, fmt::format("rdma: rdma_port {} is not a port number (0-255)", want_port));
  if (gid_index < -1 || gid_index > INT_MAX)
    return Status(Code::kUnavailable, fmt::format("rdma: rdma_gid_index {} is out of range", gid_index));
  DeviceList l;
  if (!l.list) return Status(Code::kUnavailable, "rdma: " + list_failed(errno));
  if (l.n == 0)
    return Status(Code::kUnavailable,
                  "rdma: no RDMA device (ibv_get_device_list found none: no NIC, its driver not loaded, or no "
                  "rdma_rxe/siw link)");
  std::string reasons;
  for (int i = 0; i < l.n; ++i) {
    std::string name = ibv_get_device_name(l.list[i]);
    if (!want.empty() && name != want) continue;
    ibv_context* ctx = ibv_open_device(l.list[i]);
    if (!ctx) {
      reasons += fmt::format("; ibv_open_device({}) failed: {}", name, errno_text(errno));
      continue;
    }
    ibv_device_attr da{};
    if (int err = ibv_query_device(ctx, &da); err != 0) {
      reasons += fmt::format("; ibv_query_device({}) failed: {}", name, errno_text(err));
      ibv_close_device(ctx);
      continue;
    }
    for (int p = 1; p <= da.phys_port_cnt; ++p) {
      if (want_port != 0 && p != want_port) continue;
      PortChoice c;
      Status s = check_port(ctx, name, static_cast<uint8_t>(p), static_cast<int>(gid_index), &c);
      if (!s.ok()) {
        reasons += "; " + s.message().substr(std::strlen("rdma: "));
        continue;
      }
      auto d = std::shared_ptr<Device>(new Device());
      d->ctx_ = ctx;
      d->choice_ = c;
      return d;
    }
    if (want_port != 0 && want_port > da.phys_port_cnt)
      reasons += fmt::format("; {} has {} port(s), not port {} (rdma_port)", name, da.phys_port_cnt, want_port);
    ibv_close_device(ctx);
  }
  if (reasons.empty() && !want.empty())
    return Status(Code::kUnavailable, fmt::format("rdma: no RDMA device named {} (rdma_device)", want));
  return Status(Code::kUnavailable, "rdma: no usable port: " + reasons.substr(2));
}

std::vector<PortReport> survey_ports(std::string* why) {
  std::vector<PortReport> out;
  DeviceList l;
  if (!l.list) {
    *why = list_failed(errno);
    return out;
  }
  if (l.n == 0) {
    *why = "ibv_get_device_list found no RDMA device (no NIC, its driver not loaded, or no rdma_rxe/siw link)";
    return out;
  }
  for (int i = 0; i < l.n; ++i) {
    std::string name = ibv_get_device_name(l.list[i]);
    ibv_context* ctx = ibv_open_device(l.list[i]);
    if (!ctx) {
      out.push_back({name, false, fmt::format("ibv_open_device failed: {}", errno_text(errno))});
      continue;
    }
    ibv_device_attr da{};
    if (int err = ibv_query_device(ctx, &da); err != 0) {
      out.push_back({name, false, fmt::format("ibv_query_device failed: {}", errno_text(err))});
      ibv_close_device(ctx);
      continue;
    }
    for (int p = 1; p <= da.phys_port_cnt; ++p) {
      PortChoice c;
      Status s = check_port(ctx, name, static_cast<uint8_t>(p), -1, &c);
      std::string id = fmt::format("{}:{}", name, p);
      if (!s.ok()) {
        out.push_back({id, false, s.message().substr(std::strlen("rdma: "))});
        continue;
      }
      out.push_back({id, true,
                     fmt::format("ACTIVE, {}, MTU {}, GID {} ({} {}), max {} QPs, max MR {} B",
                                 c.ethernet ? "Ethernet (RoCE)" : "InfiniBand", mtu_text(c.mtu), c.gid_index,
                                 c.gid_kind, gid_text(c.gid), da.max_qp, da.max_mr_size)});
    }
    ibv_close_device(ctx);
  }
  return out;
}

std::string device_pci_address(const std::string& sysfs_root, const std::string& device) {
  std::error_code ec;
  auto target = std::filesystem::canonical(fmt::format("{}/class/infiniband/{}/device", sysfs_root, device), ec);
  if (ec) return "";
  std::string leaf = target.filename().string();
  // A PCI function's name: dddd:bb:dd.f
  if (leaf.size() == 12 && leaf[4] == ':' && leaf[7] == ':' && leaf[10] == '.') return leaf;
  return "";
}

}  // namespace dmx::rdma
