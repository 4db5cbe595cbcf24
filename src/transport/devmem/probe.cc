// devmem::probe(): what this host can do for devmem TCP, with the kernel's exact reasons.
//
// Non-destructive: bind-rx is attempted with a memfd, which is not a dma-buf (the kernel checks
// the device before the fd, so the errno classifies the driver) and never restarts a queue;
// bind-tx with a real udmabuf where /dev/udmabuf allows it (probe_bind.h).
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
#include "transport/devmem/probe_bind.h"
#include "transport/devmem/zcrx.h"

namespace dmx::devmem {
namespace {

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
  std::vector<std::pair<std::string, int>> tx_capable;  // passed the bind-tx device checks
  for (const auto& ifname : interfaces()) {
    int ifindex = static_cast<int>(::if_nametoindex(ifname.c_str()));
    auto st = read_nic_state(ifname);
    Capability nic{fmt::format("devmem.nic[{}]", ifname), false, st.ok() ? describe(*st) : st.status().message()};
    if (st.ok()) {
      nic.available = header_split_ready(*st) && st->ntuple.value_or(false);
      if (!nic.available) nic.detail += " (devmem RX needs tcp-data-split on, hds-thresh 0 where it exists, ntuple on)";
    }
    caps.push_back(std::move(nic));
    Capability rx = s.bind_rx ? probe_bind_rx(*ops, ifname, ifindex, 0)
                              : Capability{fmt::format("devmem.bind_rx[{}]", ifname), false, "no bind-rx op"};
    if (s.bind_rx) caps.push_back(rx);
    caps.push_back(probe_zcrx(ifname, ifindex, 0, rx));
    if (s.bind_tx) {
      caps.push_back(probe_bind_tx(*ops, ifname, ifindex));
      if (caps.back().available) tx_capable.emplace_back(ifname, ifindex);
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
      // The NIC's import of GPU memory (bind-tx touches no queue; released at once).
      for (const auto& [ifname, ifindex] : e.ok() ? tx_capable : decltype(tx_capable){}) {
        auto b = ops->bind_tx(ifindex, e->fd.get());
        caps.push_back(classify_bind(fmt::format("devmem.bind_tx_gpu[{}]", ifname), b.ok() ? Status() : b.status(),
                                     true, ProbeFd::kGpuDmabuf));
      }
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
  if (!header_split_ready(*st) || !st->ntuple.value_or(false))
    return off(fmt::format("{} is not set up ({}); run dmx devmem setup", ifname, describe(*st)));
  if (Capability c = probe_bind_rx(*ops, ifname, ifindex, 0); !c.available) return off(c.detail);
  if (Capability c = probe_bind_tx(*ops, ifname, ifindex); !c.available) return off(c.detail);
  auto ndev = cuda_device_count();
  if (!ndev.ok()) return off(ndev.status().message());
  if (*ndev == 0) return off("no CUDA device");
  return Status();
}

}  // namespace dmx::devmem
