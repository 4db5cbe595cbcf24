// The transports the conformance suite runs over. Each is forced with the transport setting, so a
// transport that cannot be had fails the connection instead of falling back.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>

#include "devmem/socket_double.h"
#include "engine/context_impl.h"
#include "engine/transports.h"
#include "transport/devmem/devmem_path.h"
#include "transport/devmem/devmem_transport.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/conformance.h"
#include "transport/loop_transport.h"
#include "test_env.h"

namespace dmx::test {
namespace {

Result<Context> forced(Options o, const char* transport) {
  o.set("transport", transport);
  return Context::create(o);
}

std::string unless_available(MemSpec mem) {
  Status s = mem_available(mem);
  return s.ok() ? "" : fmt::format("{}: {}", kNoGpu, s.message());
}

// rdma needs a verbs device with an active port (rxe in scripts/rxe-vm.sh's guest, or a NIC).
std::string rdma_unavailable() {
  auto config = Config::resolve();
  if (!config.ok()) return fmt::format("{}: {}", kNoRdma, config.status().message());
  Status s = rdma_available(*config);
  if (s.ok()) return "";
  // In scripts/rxe-vm.sh's guest a missing device is a failure, not a skip.
  if (std::getenv("DMX_RXE_GUEST")) ADD_FAILURE() << "DMX_RXE_GUEST is set, but " << s.message();
  return fmt::format("{}: {}", kNoRdma, s.message());
}

// devmem's kernel and NIC are the socket-pair double (tests/devmem/socket_double.h): each "host"
// has its own SimNic, and its "device" memory is the sim kind (mapped with no access rights, so
// engine code that touches it directly crashes). The transport's path factory holds the NIC; the
// transport lives in the context's registry.
Result<Context> devmem_context_with(int host, Options o, bool zcrx) {
  devmem::testing::SimNicOptions no;
  no.seed = 1000 + static_cast<uint64_t>(host);
  if (zcrx) {  // the receiver is zcrx's double, forced (a refusal fails instead of falling back)
    no.zcrx = true;
    no.dmabuf_offset = 0;
    o.set("devmem_rx", "zcrx");
  }
  auto nic = std::make_shared<devmem::testing::SimNic>(no);
  o.set("devmem_rx_pool", "32M");
  DMX_ASSIGN_OR_RETURN(Context ctx, forced(o, "devmem"));
  ContextImpl* impl = ctx.impl().get();
  impl->register_transport(make_devmem_transport([nic](UniqueFd fd, const Config& config, const std::string& peer) {
    return make_devmem_path(std::move(fd), config, peer, nic->seams());
  }));
  return ctx;
}

Result<Context> devmem_context(int host, Options o) { return devmem_context_with(host, std::move(o), false); }
Result<Context> devmem_zcrx_context(int host, Options o) { return devmem_context_with(host, std::move(o), true); }

// The test-only transport, added the way any transport is: nothing else in the engine knows it.
Result<Context> loop_context(int, Options o) {
  static const bool added = [] {
    add_transport([] { return make_loop_transport(); });
    return true;
  }();
  (void)added;
  return forced(o, "loop");
}

}  // namespace

const std::vector<Harness>& harnesses() {
  static const std::vector<Harness> all = {
      {"tcp", MemSpec{}, [] { return std::string(); }, [](int, Options o) { return forced(o, "tcp"); }, "", ""},
      {"shm", MemSpec{}, [] { return std::string(); }, [](int, Options o) { return forced(o, "shm"); }, "shm", ""},
      // shm with large copies shared by a crew of threads on each side (the default on 4 CPUs or more).
      {"shmCrew", MemSpec{}, [] { return std::string(); },
       [](int, Options o) { return forced(o.set("shm_copy_threads", "3"), "shm"); }, "shm", ""},
      {"devmem", MemSpec{MemKind::kSim, 0}, [] { return std::string(); }, devmem_context, "devmem", ""},
      // devmem receiving by io_uring zcrx (SimNic's zcrx double): the same suite through ZcrxRx.
      {"devmemZcrx", MemSpec{MemKind::kSim, 0}, [] { return std::string(); }, devmem_zcrx_context, "devmem", ""},
      {"cuda_ipc", MemSpec{MemKind::kCuda, 0}, [] { return unless_available(MemSpec{MemKind::kCuda, 0}); },
       [](int, Options o) { return forced(o, "cuda_ipc"); }, "cuda_ipc",
       "CUDA cannot be used in a child forked after the parent initialised it (the killed-owner case is "
       "CudaIpcGpu.OwnerKilledWithCopiesInFlightNeverHangs and CudaIpcPathGpu.PeerKilledMidTransferNeverHangs)"},
      // GPU push forced on (docs/gpu-push.md): small copies made by the SMs, cuda_ipc's and the
      // staged TCP path's (device -> pinned slot and back).
      {"cudaIpcPush", MemSpec{MemKind::kCuda, 0}, [] { return unless_available(MemSpec{MemKind::kCuda, 0}); },
       [](int, Options o) { return forced(o.set("gpu_push", "on"), "cuda_ipc"); }, "cuda_ipc",
       "CUDA cannot be used in a child forked after the parent initialised it"},
      {"tcpGpuPush", MemSpec{MemKind::kCuda, 0}, [] { return unless_available(MemSpec{MemKind::kCuda, 0}); },
       [](int, Options o) { return forced(o.set("gpu_push", "on"), "tcp"); }, "",
       "CUDA cannot be used in a child forked after the parent initialised it"},
      // Forced on both sides: on one host rdma is otherwise never chosen. Its device is rxe in an
      // emulated guest, where the handshake and the queue-pair set-up of one endpoint took over
      // the default 5 s handshake_timeout at host load 14: generous deadlines, as for any wait.
      {"rdma", MemSpec{}, rdma_unavailable,
       [](int, Options o) {
         return forced(o.set("handshake_timeout", "60s").set("connect_timeout", "120s"), "rdma");
       },
       "rdma", ""},
      {"loop", MemSpec{}, [] { return std::string(); }, loop_context, "loop",
       "the loop transport shares pointers within one process"},
  };
  return all;
}

}  // namespace dmx::test
