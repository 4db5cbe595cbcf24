// Path advisor: for each GPU-NIC pair and direction, whether the NIC should touch GPU memory
// directly (devmem TCP, GPUDirect RDMA) or data should be staged through pinned host memory, on
// which NUMA node, and why - with the PCIe arithmetic behind it.
//
// The rule (seed 002, and NCCL's default GPUDirect level): NIC-direct access pays only when the
// GPU and the NIC meet below the root complex (path class PIX or PXB) and the kernel would map the
// peer by bus address (no ACS redirect). Through the root complex, NIC-initiated reads of GPU
// memory come back in root-complex completions split at its read completion boundary (64 B on
// most Intel parts: ~76 % wire efficiency against ~91 % for 256 B posted writes), and
// NOT_SUPPORTED paths cannot be mapped at all; then the GPU should push (posted writes by its copy
// engine) into pinned host memory near it and the NIC should work from there.
//
// This is the topology half of the decision; whether the NIC and kernel can do devmem TCP at all
// is `dmx probe`'s business. Pure functions of a Topology; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "topo/distance.h"
#include "topo/topology.h"

namespace dmx::topo {

// PCIe transaction-layer overheads in bytes on the wire (framing 8 + generic header 4 + rest):
inline constexpr int kMemWriteOverhead = 24;    // MWr, 64-bit address
inline constexpr int kMemReadOverhead = 24;     // MRd, 64-bit address (flows the other way)
inline constexpr int kCompletionOverhead = 20;  // CplD

// Fraction of wire bytes that are payload when moving `bytes` as posted writes of at most `mps`.
double write_efficiency(uint64_t bytes, uint32_t mps);
// ... as read completions of at most `completion` bytes (RCB 64/128, or MPS when not split).
double read_efficiency(uint64_t bytes, uint32_t completion);

enum class Direction : uint8_t { kSend, kReceive };  // send: GPU memory -> network; receive: network -> GPU
std::string_view direction_name(Direction d);

enum class Verdict : uint8_t { kNicDirect, kStageHost };
std::string_view verdict_name(Verdict v);

struct Advice {
  int gpu = -1;  // device index
  int nic = -1;  // index into Topology::nics
  Direction direction = Direction::kSend;
  Verdict verdict = Verdict::kStageHost;
  int staging_numa = -1;  // where staging buffers belong (always filled in when known)
  PathInfo path;
  P2pdmaResult p2pdma;           // provider GPU, client NIC
  uint32_t mps = 256;            // max payload size on the path (smallest seen; 256 when unknown)
  uint32_t rcb = 64;             // completion size NIC reads of GPU memory would see
  double direct_efficiency = 0;  // PCIe wire efficiency of the NIC-direct transfer
  double staged_efficiency = 0;  // of the GPU's posted writes into host memory
  std::string why;
};

// The NUMA node nearest a device: its own, else its host bridge's, else the only node; -1 unknown.
int closest_numa_node(const Topology& topo, int dev);

Advice advise(const Topology& topo, int gpu_dev, int nic_index, Direction dir);
// Every PCI-backed NIC against every GPU, both directions.
std::vector<Advice> advise_all(const Topology& topo);

// The topology's device index of CUDA device `ordinal`: the CUDA overlay's match when it has one,
// else the ordinal-th GPU in PCI order (as CUDA_DEVICE_ORDER=PCI_BUS_ID numbers them); -1 when
// there is none. `how` (optional) says which.
int gpu_of_ordinal(const Topology& topo, int ordinal, std::string* how = nullptr);

// The NIC (index into Topology::nics) that carries an RDMA device on a PCI function and sits
// nearest the GPU: by path class (PIX, PXB, PHB, SYS), then P2PDMA distance, then discovery order,
// as NCCL pairs each GPU with its closest NIC. -1 when no RDMA device is on a PCI function
// (soft-RoCE and other software devices are not).
int nearest_rdma_nic(const Topology& topo, int gpu_dev);

// The NIC for a GPU's TCP streams (docs/topology.md, "NIC per GPU"): the one `gpu_nics` names for
// CUDA device `ordinal` ("ORDINAL=IFNAME,..."; the user knows better), else the PCI NIC nearest the
// GPU by the same rule as nearest_rdma_nic. nic: index into Topology::nics, -1 when none; why: how
// it was chosen, or why there is none.
struct NicChoice {
  int nic = -1;
  std::string why;
};
NicChoice nic_for_gpu(const Topology& topo, int gpu_dev, int ordinal, const std::string& gpu_nics);

// GPUDirect RDMA (the NIC reads and writes the GPU's memory) or staging through pinned host memory,
// for one GPU and NIC: GPUDirect when advise() favours NIC-direct access both ways (seed 002).
struct RdmaChoice {
  bool gpudirect = false;
  int staging_numa = -1;  // where staging buffers belong
  std::string why;        // the verdict, then the advisor's reason per direction
};
RdmaChoice rdma_choice(const Topology& topo, int gpu_dev, int nic_index);

}  // namespace dmx::topo
