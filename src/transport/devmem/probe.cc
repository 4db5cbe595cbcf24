// devmem::probe(): what this host can do for devmem TCP, with the kernel's exact reasons.
//
// Non-destructive: binds are attempted with a memfd, which is not a dmabuf. The kernel checks the
// device (queue API, netmem TX) before it looks at the fd, so the errno says whether the driver
// could do devmem, and no queue is ever restarted.
#include <fmt/format.h>
#include <net/if.h>
#include <sys/mman.h>
#include <sys/utsname.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "memory/backend.h"
#include "memory/dmabuf.h"
#include "transport/devmem/devmem.h"
#include "transport/devmem/gather.h"
#include "transport/devmem/kernel.h"
#include "transport/devmem/kernel_abi.h"
#include "transport/devmem/nic.h"

namespace dmx::devmem {
namespace {

bool contains(const std::string& s, std::string_view what) { return s.find(what) != std::string::npos; }

// What a bind attempt with a non-dmabuf fd says about the driver.
Capability classify(const std::string& name, const Status& s, bool tx) {
  const std::string& m = s.message();
  Capability c{name, false, m};
  if (contains(m, "errno 95)")) {
    c.detail = (tx ? "driver has no netmem TX: " : "driver has no queue API for memory providers: ") + m;
  } else if (contains(m, "errno 1)")) {
    c.detail = "unknown: binding needs CAP_NET_ADMIN (" + m + ")";
  } else if (contains(m, "errno 9)") || contains(m, "errno 22)") || contains(m, "errno 61)")) {
    // The device checks passed; the kernel only refused our placeholder fd (or HDS state).
    c.available = !contains(m, "errno 22)") || tx;
    c.detail = fmt::format("device checks passed (probe fd refused as expected: {})", m);
    if (contains(m, "tcp-data-split") || contains(m, "hds-thresh"))
      c.detail = "driver supports devmem but the NIC needs `dmx devmem setup`: " + m;
  }
  return c;
}

std::vector<std::string> interfaces() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/class/net", ec)) {
    std::string n = e.path().filename();
    if (n != "lo") out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<Capability> probe() {
  std::vector<Capability> caps;
  utsname u{};
  ::uname(&u);
  auto ops = make_kernel_netlink_ops();
  NetdevSupport s = ops->detect();
  caps.push_back({"devmem.kernel", s.family && s.bind_rx,
                  s.family ? fmt::format("Linux {}: netdev family; bind-rx {}, bind-tx {} (ABI matched: {})", u.release,
                                         s.bind_rx ? "yes" : "no (needs >= 6.12)", s.bind_tx ? "yes" : "no (needs >= 6.16)",
                                         abi::kKernelVersion)
                           : fmt::format("Linux {}: no netdev generic-netlink family: {}", u.release, s.detail)});
  UniqueFd probe_fd(::memfd_create("dmx-devmem-probe", MFD_CLOEXEC));
  for (const auto& ifname : interfaces()) {
    int ifindex = static_cast<int>(::if_nametoindex(ifname.c_str()));
    auto st = read_nic_state(ifname);
    Capability nic{fmt::format("devmem.nic[{}]", ifname), false, st.ok() ? describe(*st) : st.status().message()};
    if (st.ok()) {
      bool split = st->tcp_data_split == abi::kTcpDataSplitEnabled && st->hds_thresh.value_or(1) == 0;
      nic.available = split && st->ntuple.value_or(false);
      if (!nic.available) nic.detail += " (devmem RX needs tcp-data-split on, hds-thresh 0, ntuple on)";
    }
    caps.push_back(std::move(nic));
    if (s.bind_rx) {
      uint32_t q[] = {0};
      auto b = ops->bind_rx(ifindex, probe_fd.get(), q);
      caps.push_back(b.ok() ? Capability{fmt::format("devmem.bind_rx[{}]", ifname), true, "bound a memfd?!"}
                            : classify(fmt::format("devmem.bind_rx[{}]", ifname), b.status(), false));
    }
    if (s.bind_tx) {
      auto b = ops->bind_tx(ifindex, probe_fd.get());
      caps.push_back(b.ok() ? Capability{fmt::format("devmem.bind_tx[{}]", ifname), true, "bound a memfd?!"}
                            : classify(fmt::format("devmem.bind_tx[{}]", ifname), b.status(), true));
    }
  }
  // dmabuf export of CUDA memory, and the GPU gather.
  auto ndev = cuda_device_count();
  if (!ndev.ok() || *ndev == 0) {
    std::string why = ndev.ok() ? "no CUDA device" : ndev.status().message();
    caps.push_back({"devmem.dmabuf_export", false, why});
    caps.push_back({"devmem.gpu_gather", false, why});
  } else {
    auto buf = Buffer::allocate({MemKind::kCuda, 0}, 2 << 20);
    if (!buf.ok()) {
      caps.push_back({"devmem.dmabuf_export", false, buf.status().message()});
    } else {
      auto e = export_dmabuf(buf->region());
      caps.push_back(e.ok() ? Capability{"devmem.dmabuf_export", true,
                                         fmt::format("cuda:0: 2 MiB exported as dmabuf ({} mapping)",
                                                     e->pcie_mapping ? "PCIe BAR1" : "default")}
                            : Capability{"devmem.dmabuf_export", false, e.status().message()});
    }
    auto g = make_cuda_gatherer(0);
    caps.push_back({"devmem.gpu_gather", g.ok(), g.ok() ? "cuda:0: gather kernel ready" : g.status().message()});
  }
  return caps;
}

Status usable(const std::string& ifname) {
  auto off = [](std::string why) { return Status(Code::kUnavailable, "devmem: " + why); };
  if (ifname.empty()) return off("off (setting devmem_ifname is empty)");
  int ifindex = static_cast<int>(::if_nametoindex(ifname.c_str()));
  if (ifindex == 0) return off(fmt::format("no interface named {}", ifname));
  auto ops = make_kernel_netlink_ops();
  NetdevSupport s = ops->detect();
  if (!s.family) return off("kernel has no netdev genl family: " + s.detail);
  if (!s.bind_rx || !s.bind_tx) return off("kernel lacks bind-rx/bind-tx (needs Linux >= 6.16 for both)");
  auto st = read_nic_state(ifname);
  if (!st.ok()) return off(st.status().message());
  if (st->tcp_data_split != abi::kTcpDataSplitEnabled || st->hds_thresh.value_or(1) != 0 || !st->ntuple.value_or(false))
    return off(fmt::format("{} is not set up ({}); run dmx devmem setup", ifname, describe(*st)));
  UniqueFd probe_fd(::memfd_create("dmx-devmem-probe", MFD_CLOEXEC));
  uint32_t q[] = {0};
  if (auto b = ops->bind_rx(ifindex, probe_fd.get(), q); !b.ok()) {
    Capability c = classify("bind_rx", b.status(), false);
    if (!c.available) return off(c.detail);
  }
  if (auto b = ops->bind_tx(ifindex, probe_fd.get()); !b.ok()) {
    Capability c = classify("bind_tx", b.status(), true);
    if (!c.available) return off(c.detail);
  }
  auto ndev = cuda_device_count();
  if (!ndev.ok()) return off(ndev.status().message());
  if (*ndev == 0) return off("no CUDA device");
  return Status();
}

}  // namespace dmx::devmem
