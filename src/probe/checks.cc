// The host checks of dmx_probe: kernel, CUDA, topology, io_uring zero-copy receive, namespaces.
#include <fcntl.h>
#include <fmt/format.h>
#include <net/if.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/sys.h"
#include "memory/backend.h"
#include "memory/mps.h"
#include "transport/devmem/zcrx_abi.h"
#include "probe/probe.h"
#include "topo/advisor.h"
#include "topo/distance.h"
#include "topo/topology.h"

namespace dmx::probe {

namespace za = devmem::zcrx_abi;  // the one copy of the zcrx uapi layouts

namespace {

Capability yes(std::string name, std::string detail) {
  return Capability{std::move(name), true, std::move(detail)};
}
Capability no(std::string name, std::string detail) {
  return Capability{std::move(name), false, std::move(detail)};
}

// "6.18.44-fc-v769" -> {6, 18}
std::pair<int, int> kernel_version(const std::string& release) {
  int major = 0, minor = 0;
  if (std::sscanf(release.c_str(), "%d.%d", &major, &minor) != 2) return {0, 0};
  return {major, minor};
}

bool at_least(std::pair<int, int> v, int major, int minor) {
  return v.first > major || (v.first == major && v.second >= minor);
}

}  // namespace

std::vector<Capability> probe_kernel() {
  struct utsname u {};
  if (::uname(&u) != 0) return {no("kernel.version", errno_status("uname", errno).message())};
  auto v = kernel_version(u.release);
  Capability c = yes("kernel.version", fmt::format("{} {}", u.sysname, u.release));
  auto need = [&](int major, int minor) {
    return at_least(v, major, minor) ? std::string("yes") : fmt::format("no (needs {}.{})", major, minor);
  };
  c.facts = {{"release", u.release},
             {"machine", u.machine},
             {"devmem_rx_kernel", need(6, 12)},
             {"devmem_tx_kernel", need(6, 16)},
             {"io_uring_zcrx_kernel", need(6, 15)}};
  return {c};
}

std::vector<Capability> probe_cuda() {
  std::vector<Capability> out;
  auto count = cuda_device_count();
  topo::CudaOverlay overlay = topo::query_cuda_overlay();
  if (!count.ok()) {
    out.push_back(no("cuda.driver", count.status().message()));
    out.push_back(no("cuda.p2p", "no CUDA devices: " + count.status().message()));
    return out;
  }
  Capability drv = overlay.driver_version > 0
                       ? yes("cuda.driver", fmt::format("driver API {}.{}", overlay.driver_version / 1000,
                                                        overlay.driver_version % 1000 / 10))
                       : yes("cuda.driver", "driver present");
  out.push_back(drv);
  if (*count == 0) {
    out.push_back(no("cuda.devices", "the CUDA driver reports no devices"));
    out.push_back(no("cuda.p2p", "no CUDA devices"));
    return out;
  }
  Capability devs = yes("cuda.devices", fmt::format("{} device(s)", *count));
  for (const topo::CudaDevice& d : overlay.devices)
    devs.facts.emplace_back(
        fmt::format("cuda:{}", d.ordinal),
        fmt::format("{} {} sm_{}{} {} MiB", d.name, d.bus_id, d.cc_major, d.cc_minor, d.total_memory >> 20));
  out.push_back(devs);
  Status cumem;
  for (int d = 0; d < *count && cumem.ok(); ++d) cumem = cuda_cumem_ipc_supported(d);
  out.push_back(cumem.ok() ? yes("cuda.cumem_ipc",
                                 "cuMem allocations (PyTorch's expandable segments) can be shared "
                                 "as POSIX fds: cuda_ipc carries them")
                           : no("cuda.cumem_ipc", fmt::format("{}: cuMem memory goes staged through shm, not by "
                                                              "cuda_ipc",
                                                              cumem.message())));
  auto mps = cuda_mps_daemon();
  out.push_back(mps.ok() ? yes("cuda.mps", fmt::format("MPS control daemon at {}: processes sharing a GPU share one "
                                                      "context",
                                                      *mps))
                         : no("cuda.mps", fmt::format("{}: two processes on one GPU each have a context, and the GPU "
                                                      "switches between them (8-byte messages measured 167 us "
                                                      "instead of 18 us on an H200); nvidia-cuda-mps-control -d "
                                                      "starts it",
                                                      mps.status().message())));
  if (!overlay.available) {
    out.push_back(no("cuda.p2p", overlay.reason));
    return out;
  }
  if (overlay.devices.size() < 2) {
    out.push_back(no("cuda.p2p", "only one CUDA device: no peers"));
    return out;
  }
  for (const topo::CudaPeerLink& l : overlay.links) {
    std::string name = fmt::format("cuda.p2p[{}->{}]", l.a, l.b);
    if (!l.access) {
      out.push_back(no(name, "cudaDeviceGetP2PAttribute: peer access not supported"));
      continue;
    }
    Capability c =
        yes(name, fmt::format("peer access{}, performance rank {}",
                              l.native_atomics ? ", native atomics (NVLink/C2C)" : " (PCIe, no native atomics)",
                              l.perf_rank));
    c.facts = {
        {"access", "1"}, {"native_atomics", l.native_atomics ? "1" : "0"}, {"perf_rank", std::to_string(l.perf_rank)}};
    out.push_back(c);
  }
  return out;
}

std::vector<Capability> probe_topology(const std::string& sysfs_root) {
  std::vector<Capability> out;
  auto t = topo::discover(sysfs_root);
  if (!t.ok()) return {no("topo.sysfs", t.status().message())};
  size_t pci_nics = 0;
  for (const topo::Nic& n : t->nics) pci_nics += n.pci >= 0;
  Capability s = yes("topo.sysfs", fmt::format("{}: {} PCI devices under {} host bridge(s), {} GPU(s), {} PCI NIC(s), "
                                               "{} NVMe, {} NUMA node(s)",
                                               sysfs_root, t->devices.size(), t->host_bridges.size(), t->gpus.size(),
                                               pci_nics, t->nvme.size(), t->numa.size()));
  if (!t->warnings.empty())
    s.facts.emplace_back("unknown", fmt::format("{} attribute(s) unreadable; see dmx topo", t->warnings.size()));
  out.push_back(s);
  std::string cpu = fmt::format("{} {} family {:#x}", t->cpu.arch, t->cpu.vendor, t->cpu.family);
  if (topo::cpu_supports_p2pdma(t->cpu))
    out.push_back(
        yes("topo.p2pdma_host_bridge", cpu + ": the kernel allows P2PDMA through host bridges (AMD Zen or later)"));
  else
    out.push_back(no("topo.p2pdma_host_bridge",
                     cpu + ": P2PDMA through a host bridge only where its first device is in the kernel's whitelist"));
  if (t->rdma.empty()) {
    out.push_back(
        no("rdma.devices", sysfs_root + "/class/infiniband has no devices (no RDMA NIC, or its driver is not loaded)"));
  } else {
    Capability r = yes("rdma.devices", fmt::format("{} RDMA device(s)", t->rdma.size()));
    for (const topo::RdmaDevice& d : t->rdma)
      r.facts.emplace_back(d.name, d.pci >= 0 ? t->devices[d.pci].addr.to_string() : "not PCI");
    out.push_back(r);
  }
  if (t->gpus.empty() || pci_nics == 0) {
    out.push_back(no("topo.gpu_nic_direct", t->gpus.empty() ? "no GPU in the PCI tree" : "no PCI NIC in the PCI tree"));
    return out;
  }
  int direct = 0, total = 0;
  std::string example;
  for (const topo::Advice& a : topo::advise_all(*t)) {
    ++total;
    if (a.verdict == topo::Verdict::kNicDirect)
      ++direct;
    else if (example.empty())
      example = a.why;
  }
  if (direct > 0)
    out.push_back(yes("topo.gpu_nic_direct", fmt::format("{} of {} GPU-NIC pair directions favour NIC-direct access "
                                                         "(dmx topo shows each)",
                                                         direct, total)));
  else
    out.push_back(no("topo.gpu_nic_direct", fmt::format("no GPU-NIC pair shares a PCIe switch: {}", example)));
  return out;
}

namespace {

// The highest RX queue of a live interface (the least disruptive one to borrow), -1 unknown.
int last_rx_queue(const std::string& ifname) {
  int last = -1;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/class/net/" + ifname + "/queues", ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind("rx-", 0) == 0) last = std::max(last, std::atoi(n.c_str() + 3));
  }
  return last;
}

// An actual IORING_REGISTER_ZCRX_IFQ on one queue of `ifname`, released at once: the kernel's errno
// is the answer. Like devmem's bind attempts this briefly restarts the queue when it succeeds.
Capability try_zcrx(const std::string& ifname, unsigned ifindex) {
  std::string name = fmt::format("io_uring.zcrx[{}]", ifname);
  int queue = last_rx_queue(ifname);
  if (queue < 0) return no(name, "/sys/class/net/" + ifname + "/queues has no rx queue");
  io_uring_params p{};
  p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_CQE32;
  long fd = ::syscall(__NR_io_uring_setup, 8, &p);
  if (fd < 0) return no(name, errno_status("io_uring_setup(SINGLE_ISSUER|DEFER_TASKRUN|CQE32)", errno).message());
  UniqueFd ring(static_cast<int>(fd));
  constexpr size_t kAreaBytes = 16 * 4096;
  void* mem = ::mmap(nullptr, kAreaBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return no(name, errno_status("mmap", errno).message());
  za::AreaReg area{};
  area.addr = reinterpret_cast<uint64_t>(mem);
  area.len = kAreaBytes;
  za::RegionDesc region{};
  region.size = 4096;  // refill ring of 64 entries, allocated by the kernel
  za::IfqReg reg{};
  reg.if_idx = ifindex;
  reg.if_rxq = static_cast<uint32_t>(queue);
  reg.rq_entries = 64;
  reg.area_ptr = reinterpret_cast<uint64_t>(&area);
  reg.region_ptr = reinterpret_cast<uint64_t>(&region);
  long r = ::syscall(__NR_io_uring_register, ring.get(), za::kRegisterZcrxIfq, &reg, 1);
  int err = r < 0 ? errno : 0;
  ring.reset();  // unregisters the queue
  ::munmap(mem, kAreaBytes);
  std::string call = fmt::format("io_uring_register(ZCRX_IFQ, {} rx queue {})", ifname, queue);
  if (err == 0) return yes(name, call + " succeeded (released again)");
  std::string hint;
  if (err == EOPNOTSUPP)
    hint = " (the driver has no queue API for memory providers, or the interface has no parent device)";
  else if (err == EPERM)
    hint = " (needs CAP_NET_ADMIN)";
  else if (err == EINVAL)
    hint = " (the kernel refused the queue: header split off or hds-thresh non-zero are the usual causes)";
  else if (err == ENODEV)
    hint = " (no such device, or the queue has no DMA device)";
  return no(name, errno_status(call, err).message() + hint);
}

}  // namespace

std::vector<Capability> probe_io_uring_zcrx() {
  io_uring_params p{};
  long fd = ::syscall(__NR_io_uring_setup, 1, &p);
  if (fd < 0) {
    int err = errno;
    std::string extra;
    if (err == EPERM) extra = " (kernel.io_uring_disabled forbids it for this process)";
    return {no("io_uring.zcrx", errno_status("io_uring_setup", err).message() + extra)};
  }
  UniqueFd ring(static_cast<int>(fd));
  constexpr unsigned kOps = 256;
  std::vector<unsigned char> buf(sizeof(io_uring_probe) + kOps * sizeof(io_uring_probe_op), 0);
  auto* probe = reinterpret_cast<io_uring_probe*>(buf.data());
  long r = ::syscall(__NR_io_uring_register, ring.get(), IORING_REGISTER_PROBE, probe, kOps);
  if (r < 0) return {no("io_uring.zcrx", errno_status("io_uring_register(IORING_REGISTER_PROBE)", errno).message())};
  unsigned op = za::kOpRecvZc;
  bool supported = op <= probe->last_op && op < kOps && (probe->ops[op].flags & IO_URING_OP_SUPPORTED) != 0;
  if (!supported)
    return {
        no("io_uring.zcrx", fmt::format("the kernel's io_uring does not support IORING_OP_RECV_ZC (op {}; last op {})",
                                        op, probe->last_op))};
  Capability c = yes("io_uring.zcrx", "IORING_OP_RECV_ZC supported by the kernel");
  c.facts = {{"last_op", std::to_string(probe->last_op)}};
  std::vector<Capability> out{c};
  if (struct if_nameindex* names = ::if_nameindex(); names != nullptr) {
    for (struct if_nameindex* n = names; n->if_index != 0 && n->if_name != nullptr; ++n)
      if (std::string(n->if_name) != "lo") out.push_back(try_zcrx(n->if_name, n->if_index));
    ::if_freenameindex(names);
  }
  return out;
}

std::vector<Capability> probe_network_namespaces() {
  struct stat st;
  if (::stat("/proc/self/ns/net", &st) != 0)
    return {no("netns", errno_status("stat(/proc/self/ns/net)", errno).message() + " (kernel without CONFIG_NET_NS?)")};
  // Try for real, in a child, so this process keeps its namespace.
  pid_t pid = ::fork();
  if (pid < 0) return {no("netns", errno_status("fork", errno).message())};
  if (pid == 0) {
    int rc = ::unshare(CLONE_NEWNET) == 0 ? 0 : errno;
    ::_exit(rc & 0xff);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  int err = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  bool have_ip =
      ::access("/usr/sbin/ip", X_OK) == 0 || ::access("/sbin/ip", X_OK) == 0 || ::access("/usr/bin/ip", X_OK) == 0;
  if (err != 0)
    return {no("netns", err > 0 ? errno_status("unshare(CLONE_NEWNET)", err).message() +
                                      (err == EPERM ? " (needs CAP_SYS_ADMIN)" : "")
                                : "unshare(CLONE_NEWNET) child died")};
  Capability c = yes("netns", std::string("unshare(CLONE_NEWNET) works") +
                                  (have_ip ? "; ip(8) present for veth test beds" : "; ip(8) not found"));
  return {c};
}

}  // namespace dmx::probe
