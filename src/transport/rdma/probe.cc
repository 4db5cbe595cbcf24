// `dmx probe`'s rdma lines (rdma_transport.h). Each says available, or exactly why not.
#include <fmt/format.h>

#include "dmx/memory.h"
#include "topo/topology.h"
#include "transport/rdma/advice.h"
#include "transport/rdma/device.h"
#include "transport/rdma/p2pmem.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/registration.h"

namespace dmx {
namespace {

Capability yes(std::string name, std::string detail) { return {std::move(name), true, std::move(detail)}; }
Capability no(std::string name, std::string detail) { return {std::move(name), false, std::move(detail)}; }

// Registers a little CUDA memory by its dma-buf on the first usable device: the only way to know
// whether the NIC's driver takes dma-bufs.
Capability try_dmabuf(bool cuda, const std::string& no_device) {
  const char* name = "rdma.gpu_dmabuf";
  if (!no_device.empty()) return no(name, "no RDMA device to try ibv_reg_dmabuf_mr on: " + no_device);
  if (!cuda) return no(name, "not probed (--no-cuda)");
  auto config = Config::resolve();
  if (!config.ok()) return no(name, config.status().message());
  auto dev = rdma::open_device(*config);
  if (!dev.ok()) return no(name, "no device to register on: " + dev.status().message());
  auto buf = Buffer::allocate(MemSpec{MemKind::kCuda, 0}, 2 << 20);
  if (!buf.ok()) return no(name, "no CUDA memory to register: " + buf.status().message());
  ibv_pd* raw = ibv_alloc_pd((*dev)->context());
  if (!raw) return no(name, fmt::format("ibv_alloc_pd failed: {}", errno_text(errno)));
  auto pd = std::make_shared<rdma::Pd>(raw, *dev);
  rdma::GpuRegistration only_dmabuf;
  only_dmabuf.dmabuf = true;
  auto mr = rdma::register_region(pd, buf->region(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, only_dmabuf);
  if (!mr.ok()) return no(name, mr.status().message());
  return yes(name, fmt::format("2 MiB of cuda:0 registered on {} by ibv_reg_dmabuf_mr", (*dev)->choice().device));
}

// Seed 004: maps and registers 2 MiB of the first published p2pmem BAR, or says why not.
Capability try_p2pmem(const std::string& sysfs_root, const topo::Topology& t) {
  const char* name = "rdma.p2pmem";
  const topo::PciDevice* dev = nullptr;
  for (const topo::PciDevice& d : t.devices)
    if (d.p2pmem.present && d.p2pmem.published && !dev) dev = &d;
  if (!dev)
    return no(name, fmt::format("no PCI device publishes p2pmem under {}/bus/pci/devices (a BAR set up for P2PDMA: "
                                "an NVMe CMB, or a driver that calls pci_p2pmem_publish)",
                                sysfs_root));
  auto config = Config::resolve();
  if (!config.ok()) return no(name, config.status().message());
  auto nic = rdma::open_device(*config);
  if (!nic.ok()) return no(name, fmt::format("{} publishes p2pmem, but {}", dev->addr.to_string(), nic.status().message()));
  auto m = rdma::map_p2pmem(sysfs_root, dev->addr.to_string(), 2 << 20);
  if (!m.ok()) return no(name, m.status().message());
  ibv_pd* raw = ibv_alloc_pd((*nic)->context());
  if (!raw) return no(name, fmt::format("ibv_alloc_pd failed: {}", errno_text(errno)));
  auto pd = std::make_shared<rdma::Pd>(raw, *nic);
  auto mr = rdma::register_p2pmem(pd, **m);
  if (!mr.ok()) return no(name, mr.status().message());
  return yes(name, fmt::format("2 MiB of {}'s p2pmem registered on {}: a peer's RDMA lands in that device",
                               dev->addr.to_string(), (*nic)->choice().device));
}

}  // namespace

std::vector<Capability> probe_rdma(const std::string& sysfs_root, bool cuda) {
  std::vector<Capability> out;
  std::string why;
  std::vector<rdma::PortReport> ports = rdma::survey_ports(&why);
  if (ports.empty()) {
    out.push_back(no("rdma.verbs", why));
  } else {
    size_t usable = 0;
    for (const auto& p : ports) usable += p.usable;
    out.push_back(Capability{"rdma.verbs", usable > 0,
                             fmt::format("{} device port(s), {} usable{}", ports.size(), usable,
                                         usable ? "" : " (each line below says why not)")});
    for (const auto& p : ports) out.push_back({fmt::format("rdma.port[{}]", p.name), p.usable, p.detail});
  }
  bool usable = false;
  for (const auto& p : ports) usable = usable || p.usable;
  out.push_back(try_dmabuf(cuda, usable ? "" : ports.empty() ? why : "no usable port"));
  std::string pm;
  bool have_pm = rdma::peermem_loaded(&pm);
  out.push_back({"rdma.gpu_peermem", have_pm, pm});
  auto t = topo::discover(sysfs_root);
  if (!t.ok()) {
    out.push_back(no("rdma.pcie", "topology unknown: " + t.status().message()));
    return out;
  }
  out.push_back(try_p2pmem(sysfs_root, *t));
  if (t->rdma.empty()) {
    out.push_back(no("rdma.pcie", sysfs_root + "/class/infiniband has no device: no GPU-NIC distance to weigh"));
    return out;
  }
  for (const topo::RdmaDevice& d : t->rdma) {
    auto a = rdma::advise_gpus(*t, d.name);
    std::string name = fmt::format("rdma.pcie[{}]", d.name);
    if (!a.ok()) {
      out.push_back(no(name, a.status().message()));
      continue;
    }
    Capability c{name, false, ""};
    for (const rdma::GpuAdvice& g : *a) {
      c.available = c.available || g.direct;
      c.detail += fmt::format("{}cuda:{} {}: {}", c.detail.empty() ? "" : "; ", g.ordinal,
                              g.direct ? "GPUDirect RDMA" : "stage through host memory", g.why);
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace dmx
