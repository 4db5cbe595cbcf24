// Bind attempts of the devmem probe, and what their errno says (net/core/netdev-genl.c 6.18).
//
// The kernel checks, in order: the device (ENODEV), its queue API (EOPNOTSUPP) or netmem TX
// (EOPNOTSUPP, "Driver does not support netmem TX"), the queue ids (EINVAL, a bad attribute),
// then dma_buf_get() on the fd (EBADF, or EINVAL with no message for a file that is not a
// dma-buf), then per queue header split (EINVAL with a message) and whether a memory provider
// holds it already (EEXIST). So:
//  - RX is probed with a memfd: a real bind-rx would restart the queue, and a probe must not
//    disturb traffic. EINVAL with no kernel message means every device check passed; the dma-buf
//    import and the per-queue checks are left to the first real bind, and the reason says so.
//  - TX is probed with a real dma-buf where /dev/udmabuf lets us make one (bind-tx restarts
//    nothing): then a success is a success; else with a memfd and classified like RX.
//  - Where a CUDA device exists and a NIC passed the TX device checks, bind-tx is tried once more
//    with a dma-buf of GPU memory: the NIC's import of GPU memory, and the GPU driver's PCIe
//    topology check (ENOTSUPP 524), without touching a queue.
#pragma once

#include <functional>
#include <string>

#include "core/capability.h"
#include "core/sys.h"
#include "transport/devmem/kernel.h"

namespace dmx::devmem {

enum class ProbeFd { kMemfd, kUdmabuf, kGpuDmabuf };

// A dma-buf of `size` bytes of host memory: a sealed memfd handed to /dev/udmabuf (UDMABUF_CREATE).
// kUnavailable with the reason where the device is absent or not ours to open.
Result<UniqueFd> make_udmabuf(size_t size);

// The reason text of one bind attempt with a fd of kind `kind` (the Status of a failed bind, or
// ok for a bind that succeeded and was released).
Capability classify_bind(const std::string& name, const Status& s, bool tx, ProbeFd kind);

// Probes bind-rx of `queue` with a memfd (never a real bind: see above).
Capability probe_bind_rx(NetlinkOps& ops, const std::string& ifname, int ifindex, uint32_t queue);
// Probes bind-tx with `udmabuf()` when it gives a dma-buf, else a memfd.
Capability probe_bind_tx(NetlinkOps& ops, const std::string& ifname, int ifindex,
                         const std::function<Result<UniqueFd>()>& udmabuf = [] { return make_udmabuf(1 << 20); });

}  // namespace dmx::devmem
