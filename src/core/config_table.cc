// The one table of dmx settings. Add a row here to add a setting; `dmx probe --config` prints it.
#include "core/config.h"

namespace dmx {

namespace {
constexpr ConfigEntry kTable[] = {
    // core
    {"log_level", ConfigType::kString, "warn", "log verbosity", "trace|debug|info|warn|error|off"},
    // engine
    {"transport", ConfigType::kString, "auto",
     "data path to use: auto (the best both peers support), tcp, or a registered transport (cuda_ipc, devmem, rdma, "
     "shm; checked when the context is created)"},
    {"checksum", ConfigType::kString, "none",
     "end-to-end CRC32C of every data chunk: none, or crc32c (computed as chunks leave and land, by the GPU for "
     "device memory; a mismatch fails the operation with data_loss; on when either peer asks)",
     "none|crc32c"},
    {"connect_timeout", ConfigType::kDuration, "10s",
     "deadline for connect() as a whole: every attempt, the backoff between them (50 ms doubling to 1 s) "
     "and the same-host paths; reset or timed-out attempts are retried, a REJECT or a key mismatch is "
     "not, nor a refused connection unless connect_retry_refused"},
    {"connect_retry_refused", ConfigType::kBool, "false",
     "retry a refused connection (nobody listens yet: a listener that is starting) until "
     "connect_timeout, with one warning; off: connect() fails at once, naming the address"},
    {"handshake_timeout", ConfigType::kDuration, "5s",
     "one handshake, on both sides: a listener drops an accepted connection that has not completed it by "
     "then, and connect() gives up that attempt (and retries within connect_timeout)"},
    {"stop_timeout", ConfigType::kDuration, "30s",
     "how long closing an endpoint waits for its payload paths to stop (a wedged device copy) before "
     "it gives up with an error naming them"},
    {"max_pending_handshakes", ConfigType::kInt, "1024",
     "connections a listener holds before they authenticate; when full, a new one evicts the oldest"},
    {"max_pending_per_address", ConfigType::kInt, "64",
     "connections one IP address may hold before they authenticate; beyond, its new ones are closed"},
    {"keepalive_interval", ConfigType::kDuration, "1s", "idle time after which a stream sends a keepalive"},
    {"peer_timeout", ConfigType::kDuration, "10s",
     "a peer silent for this long on any stream is declared dead and its operations fail"},
    {"busy_peer_timeout", ConfigType::kDuration, "0",
     "0: off. Else, while operations are pending, a peer silent this long on a stream is declared dead "
     "(off by default: a peer copying a multi-GiB message on its stream thread is silent for seconds; every pending "
     "operation fails naming it; on a data stream of several links, that link is dropped); the stream "
     "probes a silent peer at a quarter of it, so idle endpoints pay nothing (docs/reliability.md)"},
    {"eager_limit", ConfigType::kSize, "16K", "sends up to this size go without a rendezvous round trip"},
    {"unexpected_budget", ConfigType::kSize, "64M",
     "bytes of eager messages a receiver buffers before a matching recv is posted (per endpoint)"},
    {"max_inflight_ops", ConfigType::kInt, "4096", "incoming operations a peer may have in flight at once"},
    {"max_reply_backlog", ConfigType::kSize, "4M",
     "replies to a peer's requests (ACKs) queued unsent before this side stops reading from that peer"},
    {"peer_error_budget", ConfigType::kInt, "1000",
     "refused operations (unknown key, full notification queue) a peer may cause in 10 s before it is closed"},
    {"deregister_timeout", ConfigType::kDuration, "10s",
     "how long deregistration waits for peers' operations on the memory to end before closing those peers"},
    {"max_notifications", ConfigType::kInt, "65536",
     "write notifications held for the application per endpoint; a notifying write beyond is refused"},
    // authentication
    {"auth_key", ConfigType::kString, "", "shared secret for peer authentication (overrides auth_key_file)", {},
     /*secret=*/true},
    {"auth_key_file", ConfigType::kString, "",
     "file holding the shared secret (a regular file, mode 0600, owned by this user); default "
     "$XDG_CONFIG_HOME/dmx/auth.key, else ~/.config/dmx/auth.key (the passwd home without HOME; never /tmp), created "
     "on first use; a named file must exist (see auth_key_create)"},
    {"auth_key_create", ConfigType::kBool, "false",
     "create a missing auth_key_file with a new key (the default file is always created on first use)"},
    {"insecure", ConfigType::kBool, "false", "turn peer authentication off (both peers must agree)"},
    // the store (docs/cluster.md)
    {"store", ConfigType::kString, "",
     "a store for names, published regions and epochs: etcd://host:port (etcd's JSON gateway) or "
     "tcpstore://host:port (a torch.distributed job's TCPStore, MASTER_ADDR:MASTER_PORT); empty: none, "
     "peers meet by address"},
    {"store_job", ConfigType::kString, "dmx", "the job whose names this context sees (dmx://<job>/<name>)"},
    {"store_name", ConfigType::kString, "",
     "this process's name in the store: its first listener registers it with the listen address and a new "
     "epoch (1-128 of [A-Za-z0-9._-]); empty: not registered"},
    {"store_lease_ttl", ConfigType::kDuration, "10s",
     "lease of this process's store entries, renewed every third of it: a dead process's entries go this much "
     "after it died (at least 2s)"},
    {"store_timeout", ConfigType::kDuration, "2s", "deadline of each call to the store"},
    {"store_watch_interval", ConfigType::kDuration, "1s",
     "how often the store is read for the epochs of the peers this context's endpoints talk to (a restarted or "
     "expired peer fails its endpoints then)"},
    // staged TCP
    {"max_streams", ConfigType::kInt, "16",
     "the most TCP data streams a peer may ask for per endpoint (1-64)"},
    {"max_endpoints", ConfigType::kInt, "256",
     "endpoints one context holds at once (accepted and connected); beyond, connect fails and the "
     "listener refuses new peers"},
    {"max_endpoints_per_peer", ConfigType::kInt, "64",
     "endpoints one peer (one client process at one address) may hold open or in set-up at a listener; "
     "beyond, its new ones are refused naming this setting; 0: max_endpoints"},
    {"peer_memory_budget", ConfigType::kSize, "0",
     "memory all peers together may make this context hold (unexpected eager data of every endpoint, "
     "dmx bench plans); past half of it a peer holds at most its share of the other half, so one peer "
     "holds at most half; a peer over its share is refused or closed, naming the peer and the budget; "
     "0: half of this host's memory, at least 1G"},
    {"streams", ConfigType::kInt, "8", "TCP data streams per endpoint (1-64), plus a control stream beside more than one; 8 measured best on 2xH200 loopback (docs/performance.md)"},
    {"chunk_size", ConfigType::kSize, "1M", "unit of striping and staging for large messages (64K-64M)"},
    {"nt_receive_min", ConfigType::kSize, "4M",
     "host memory receives of at least this size are stored with non-temporal stores, skipping the read "
     "of each destination line: shm, each chunk copied out of the ring; tcp, a transfer while another "
     "receive is in flight (and always from 4M), read through a 256 KiB buffer that stays in cache; "
     "0: never; 1M measured slower than 4M on 2xH200 (docs/performance.md, \"Host speed\")"},
    {"host_chunk_size", ConfigType::kSize, "256K",
     "chunk of a host-memory message too small to give each of several TCP data streams a chunk_size "
     "chunk, so that it still spreads over them (64K-64M; larger is cut to chunk_size; docs/performance.md)"},
    {"staging_slots", ConfigType::kInt, "4", "pinned staging slots per stream for device memory (2-64)"},
    {"busy_poll", ConfigType::kDuration, "50us",
     "after activity, stream workers poll this long before sleeping (latency vs. idle CPU), except after "
     "32 KiB or more of bulk data; the default applies with 8 or more usable CPUs (the affinity mask, "
     "capped by a cgroup CPU quota: dmx probe's cpus), below that it is 0 (spinning starves the other threads)"},
    {"stream_workers", ConfigType::kInt, "0",
     "threads that run the streams of this context's endpoints, each an event loop over many streams "
     "(docs/threading.md); 0: one per usable CPU, at most 16"},
    {"stream_worker_scope", ConfigType::kString, "context",
     "context: one set of stream_workers for all endpoints (threads do not grow with endpoints); endpoint: "
     "each endpoint runs its streams on one thread of its own",
     "context|endpoint"},
    {"socket_buffer", ConfigType::kSize, "0", "SO_SNDBUF/SO_RCVBUF per stream; 0 keeps the kernel's autotuning"},
    // devmem TCP
    {"nics", ConfigType::kString, "",
     "network interfaces (comma-separated names) an endpoint's TCP streams may use; empty: every interface "
     "that is up and not loopback (docs/architecture.md, \"Several NICs\")"},
    {"nic_gpu", ConfigType::kInt, "-1",
     "CUDA device whose data this context's endpoints mostly move: with nics empty, their TCP streams use "
     "that GPU's NIC (gpu_nics, else the nearest by PCIe; dmx topo says which and why); -1: no GPU"},
    {"gpu_nics", ConfigType::kString, "",
     "the NIC per GPU where the user knows better than PCIe distance: ORDINAL=IFNAME,... (e.g. 0=eth2,1=eth3)"},
    {"multilink", ConfigType::kString, "auto",
     "acknowledge each data stream's chunks so that a dead link's chunks move to the other streams: auto "
     "(when the server lists other addresses), on, off; both sides must allow it"},
    {"reconnect_timeout", ConfigType::kDuration, "0",
     "with several links agreed: how long an endpoint that lost every stream (not its peer) waits for them "
     "back; the side that connected dials the peer again with backoff, rejoins the session and every message "
     "still lands exactly once; past it, or when the peer restarted, pending operations fail with the "
     "reason. Set it on both sides; 0: off, the endpoint fails at once (docs/reliability.md, \"Reconnect\")"},
    {"devmem_ifname", ConfigType::kString, "", "NIC whose queues receive into GPU memory (devmem TCP); empty: devmem off"},
    {"devmem_queues", ConfigType::kString, "", "RX queues bound to the devmem pool, A-B (as given to dmx devmem setup)"},
    {"devmem_rx_pool", ConfigType::kSize, "256M", "GPU memory bound to the devmem RX queues (the NIC's landing pool)"},
    {"devmem_recv_chunk", ConfigType::kSize, "1M", "bytes asked per recvmsg(MSG_SOCK_DEVMEM); also the host linear buffer"},
    {"devmem_control_buffer", ConfigType::kSize, "64K", "initial recvmsg control buffer; doubles on ETOOSMALL up to 4M"},
    {"devmem_max_outstanding_frags", ConfigType::kInt, "16384",
     "received fragments held before waiting for their gather and returning the tokens"},
    {"devmem_rx", ConfigType::kString, "auto",
     "devmem receiver: auto = io_uring zcrx where the kernel (6.16+) and NIC allow it, else devmem RX; zcrx or "
     "devmem = only that one (docs/devmem.md)",
     "auto|zcrx|devmem"},
    {"devmem_gpu", ConfigType::kInt, "0", "CUDA device whose memory holds the devmem RX pool and TX ring"},
    {"devmem_state_dir", ConfigType::kString, "/run/dmx",
     "where dmx devmem setup keeps the NIC's saved state and connections record their flow rules (for teardown)"},
    // rdma (verbs)
    {"rdma_device", ConfigType::kString, "", "RDMA device (ibv_devices); empty: the first with an active port"},
    {"rdma_port", ConfigType::kInt, "0", "port of rdma_device; 0: its first active port"},
    {"rdma_gid_index", ConfigType::kInt, "-1", "GID index; -1: a RoCE v2 IPv4 GID where there is one, else the first"},
    {"rdma_qps", ConfigType::kInt, "4", "RC queue pairs per endpoint; large chunks are striped over them (1-16)"},
    {"rdma_chunk", ConfigType::kSize, "8M", "largest chunk of one rdma post (one RDMA READ per queue pair stripe)"},
    {"rdma_gpu", ConfigType::kString, "auto",
     "GPU memory by rdma: auto = dma-buf, else a peer-memory module, else staged by other paths; dmabuf, peermem "
     "or off = only that",
     "auto|dmabuf|peermem|off"},
    // topology
    {"sysfs_root", ConfigType::kString, "/sys", "root of the sysfs tree that topology discovery reads"},
    // same-host paths (shm, cuda_ipc)
    {"control_pipe", ConfigType::kBool, "true",
     "run the control stream (stream 0) over a shared-memory pipe (same host) or by RDMA SENDs (where rdma is "
     "agreed) instead of TCP (latency)"},
    {"shm_slot_size", ConfigType::kSize, "4M", "shm link: bytes per ring slot (4K-64M, multiple of 64)"},
    {"shm_slots", ConfigType::kInt, "8", "shm link: slots per direction (2-1024); the ring of a direction is shm_slots x shm_slot_size"},
    {"shm_bounce_pool", ConfigType::kSize, "64M",
     "shm link: pinned bounce buffers that device memory goes through to and from the slots, in use at once "
     "(process-wide, shared by all links; allocated as needed, never freed; the largest value among the "
     "process's contexts applies; at least one 2 MiB piece, and one chunk's worth is always granted)"},
    {"shm_spin", ConfigType::kDuration, "50us", "shm link: how long a waiter spins before sleeping on its eventfd"},
    {"shm_copy_threads", ConfigType::kInt, "0",
     "shm link: threads that share each copy of 512 KiB or more into or out of a slot (1-8; 1: the path's "
     "own thread alone; 0: 4 with 8 usable CPUs or more, 2 with 4 or more, else 1); the helpers "
     "are one set per context, shared by its shm links"},
    {"list_threads", ConfigType::kInt, "0",
     "threads that check and lay out a vectored write or read list of 16,384 entries or more, and fill a "
     "read's request tables (1-8; 1: the posting thread alone; 0: 4 with 8 usable CPUs or more, 2 with 4 or "
     "more, else 1); one set per context"},
    {"cuda_ipc_streams", ConfigType::kInt, "2", "cuda_ipc: copy streams per local GPU (1-16), used round-robin"},
    {"cuda_ipc_chunk", ConfigType::kSize, "256M",
     "cuda_ipc: largest chunk one copy moves (1M-1G); larger transfers are cut and copied pipelined"},
    {"cuda_ipc_copy_by", ConfigType::kString, "source",
     "cuda_ipc: which GPU of the receiving process issues a GPU-to-GPU copy: the source's (it writes "
     "over the peer link) or the destination's (it reads)",
     "source|destination"},
    {"cuda_ipc_inline_rx", ConfigType::kSize, "16K",
     "cuda_ipc: a chunk up to this size that arrives while the path is idle is copied and polled by the "
     "receiving control stream's own thread, without the hand-off to the path's thread (small-message "
     "latency); 0: off"},
    {"cuda_ipc_inline_wait", ConfigType::kDuration, "30us",
     "cuda_ipc: how long that thread polls such a copy before handing it on to the path's thread"},
    {"gpu_push", ConfigType::kString, "off",
     "GPU push (docs/gpu-push.md): a small device copy made by the GPU's SMs (one small kernel: posted "
     "writes over NVLink or PCIe) instead of a copy engine, for cuda_ipc chunks and staged TCP eager "
     "payloads; auto: the advisor decides by size and path (topo/push.h), on: every copy up to 1 MiB "
     "that the SMs can reach, off (default): never. A push kernel needs a free SM: not where the "
     "process's persistent kernels hold them all",
     "auto|on|off"},
    {"gpu_push_max", ConfigType::kSize, "16K",
     "GPU push: the largest copy that auto pushes (SM stores); a copy that the SMs would read across "
     "PCIe (staged receive) is pushed up to a quarter of it"},
};
}  // namespace

std::span<const ConfigEntry> config_table() { return kTable; }

}  // namespace dmx
