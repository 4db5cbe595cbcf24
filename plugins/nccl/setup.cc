// The process-wide part: init, devices, properties, contexts, listen / connect / accept.
#include <fmt/format.h>
#include <sys/random.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "plugins/nccl/handle.h"
#include "plugins/nccl/log.h"
#include "plugins/nccl/state.h"

namespace dmx::nccl {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMaxPendingAccepts = 8;             // connections waiting for their hello, per listen comm
constexpr auto kHelloTimeout = std::chrono::seconds(10);
constexpr auto kAbandonedJob = std::chrono::seconds(60);  // a finished connect nobody asked for again

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// A plugin-only number: all of `v` must parse and lie in [lo, hi]. A value that does not would
// otherwise be read as 0 (no time-out, zero latency) without a word.
Status read_number(const char* name, double lo, double hi, double* out) {
  const char* v = env(name);
  if (v == nullptr) return Status();
  char* end = nullptr;
  errno = 0;
  double d = std::strtod(v, &end);
  if (errno != 0 || end == v || *end != '\0' || !(d >= lo && d <= hi))
    return Status(Code::kInvalidArgument, fmt::format("{}={:.40}: not a number in [{}, {}]", name, v, lo, hi));
  *out = d;
  return Status();
}

// The plugin-only variables with a number (docs/nccl-plugin.md, Settings).
Status read_numbers(Plugin& p) {
  double timeout_s = 0, latency = p.latency_us, speed = 0;
  DMX_RETURN_IF_ERROR(read_number("DMX_NCCL_TIMEOUT", 0, 86400 * 365, &timeout_s));
  DMX_RETURN_IF_ERROR(read_number("DMX_NCCL_LATENCY_US", 0, 1e6, &latency));
  DMX_RETURN_IF_ERROR(read_number("DMX_NCCL_SPEED", 1, INT_MAX, &speed));
  p.op_timeout = std::chrono::milliseconds(std::llround(timeout_s * 1000));
  p.latency_us = static_cast<float>(latency);
  p.speed_mbps = static_cast<int>(speed);
  return Status();
}

// Plugin defaults for dmx settings the user did not set through DMX_<NAME>.
Options plugin_options(Plugin& p) {
  Options o;
  auto def = [&](const char* name, const char* var, std::string value) {
    if (env(var) == nullptr) o.set(name, std::move(value));
  };
  def("transport", "DMX_TRANSPORT", "tcp");  // NCCL's own P2P/SHM transports serve the same host
  if (const char* s = env("DMX_NCCL_STREAMS")) o.set("streams", s);
  else def("streams", "DMX_STREAMS", "2");
  // NCCL's messages are up to a few hundred KiB (one step of its buffer): stripe them.
  def("chunk_size", "DMX_CHUNK_SIZE", "128K");
  def("log_level", "DMX_LOG_LEVEL", "warn");  // dmx's own log goes to stderr, beside NCCL's
  def("max_endpoints", "DMX_MAX_ENDPOINTS", "4096");
  // One NCCL rank opens many comms to another (channels x communicators): 0 = max_endpoints.
  def("max_endpoints_per_peer", "DMX_MAX_ENDPOINTS_PER_PEER", "0");
  const char* streams = env("DMX_NCCL_STREAMS") ? env("DMX_NCCL_STREAMS") : env("DMX_STREAMS");
  p.streams = streams ? std::atoi(streams) : 2;
  const char* max_ep = env("DMX_MAX_ENDPOINTS");
  p.max_comms = max_ep ? std::atoi(max_ep) : 4096;
  return o;
}

// NCCL's settings under which the plugin moved most (docs/nccl-plugin.md): NCCL gives each peer 2
// channels unless told, and each channel is a comm with its own streams.
std::string unset_suggested_settings() {
  std::string out;
  for (const char* s : {"NCCL_MIN_NCHANNELS=8", "NCCL_NCHANNELS_PER_NET_PEER=8", "DMX_NCCL_STREAMS=1"}) {
    if (env(std::string(s, std::strchr(s, '=')).c_str()) != nullptr) continue;
    out += out.empty() ? "" : " ";
    out += s;
  }
  return out;
}

void decide_ptr_support(Plugin& p) {
#if defined(DMX_HAVE_CUDA) && DMX_HAVE_CUDA
  if (const char* c = env("DMX_NCCL_CUDA"); c != nullptr && std::strcmp(c, "0") == 0) {
    p.cuda_reason = "DMX_NCCL_CUDA=0";
    return;
  }
  Status s = mem_available(MemSpec{MemKind::kCuda, 0});
  if (s.ok()) p.ptr_support = kPtrHost | kPtrCuda | kPtrDmaBuf;
  else p.cuda_reason = s.message();
#else
  p.cuda_reason = "this dmx was built without CUDA";
#endif
}

std::string ptr_names(int s) {
  std::string out = "HOST";
  if (s & kPtrCuda) out += "|CUDA";
  if (s & kPtrDmaBuf) out += "|DMABUF";
  return out;
}

// Nonces and job tokens are capabilities: from the kernel's generator, not a predictable one.
uint64_t random_u64() {
  uint64_t v = 0;
  if (::getrandom(&v, sizeof v, 0) == static_cast<ssize_t>(sizeof v)) return v;
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  return gen();
}

// Finished jobs that NCCL never came back for (it gave up on the communicator): joined here.
void reap_jobs(Plugin& p) {
  auto now = Clock::now();
  for (auto it = p.jobs.begin(); it != p.jobs.end();) {
    auto& j = *it->second;
    if (j.done.load(std::memory_order_acquire) && now - j.finished > kAbandonedJob) {
      j.thread.join();
      it = p.jobs.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace

Plugin& plugin() {
  static Plugin* p = new Plugin;  // never destroyed: NCCL may call in until the process exits
  return *p;
}

NcclResult init_plugin(Logger log) {
  set_logger(log);
  Plugin& p = plugin();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.ready) return kSuccess;
  if (Status s = read_numbers(p); !s.ok()) {
    warn("init failed: {}", s.message());
    return kInvalidArgument;
  }
  Options o = plugin_options(p);
  auto ctx = Context::create(o);
  if (!ctx.ok()) {
    warn("init failed: {}", ctx.status().to_string());
    return kSystemError;
  }
  p.ctx = *std::move(ctx);
  std::string note;
  p.nics = discover_nics(&note);
  if (!note.empty()) warn("{}", note);
  for (Nic& n : p.nics)
    if (p.speed_mbps > 0) n.speed_mbps = p.speed_mbps;
  decide_ptr_support(p);
  p.ready = true;
  const auto& b = build_info();
  info(kSubsysInit | kSubsysNet, "dmx {} ({}): {} device(s); {} TCP stream(s) per comm ({} threads per comm on each side); "
       "ptrSupport {}{}{}",
       b.version, b.git_revision, p.nics.size(), p.streams, p.streams, ptr_names(p.ptr_support),
       p.cuda_reason.empty() ? "" : "; no CUDA pointers: ", p.cuda_reason);
  for (size_t i = 0; i < p.nics.size(); ++i) {
    const Nic& n = p.nics[i];
    const char* source = n.speed_known ? "" : " (not in sysfs: default)";
    if (p.speed_mbps > 0) source = " (DMX_NCCL_SPEED)";
    info(kSubsysInit | kSubsysNet, "device {}: {} {} speed {} Mbps{} pci {}", i, n.name, n.host, n.speed_mbps, source,
         n.pci_path.empty() ? "none (virtual)" : n.pci_path);
  }
  if (std::string unset = unset_suggested_settings(); !unset.empty())
    info(kSubsysInit | kSubsysNet, "suggested settings not set: {}; with NCCL's default of 2 channels per peer the "
         "plugin moved 2-3x NCCL socket, with 8 channels 3-6x (docs/nccl-plugin.md, Settings)", unset);
  return kSuccess;
}

NcclResult devices(int* ndev) {
  Plugin& p = plugin();
  std::lock_guard<std::mutex> lock(p.mu);
  if (!p.ready || ndev == nullptr) return kInternalError;
  *ndev = static_cast<int>(p.nics.size());
  return kSuccess;
}

NcclResult get_properties(int dev, PropertiesV11* props) {
  Plugin& p = plugin();
  std::lock_guard<std::mutex> lock(p.mu);
  if (!p.ready || props == nullptr || dev < 0 || dev >= static_cast<int>(p.nics.size())) return kInternalError;
  Nic& n = p.nics[static_cast<size_t>(dev)];
  std::memset(props, 0, sizeof *props);
  props->name = n.name.data();
  props->pci_path = n.pci_path.empty() ? nullptr : n.pci_path.data();
  props->guid = static_cast<uint64_t>(dev);
  props->ptr_support = p.ptr_support;
  props->reg_is_global = 0;
  props->force_flush = 0;  // a receive into GPU memory completes after its copy engine copy
  props->speed = n.speed_mbps;
  props->port = 0;
  props->latency = p.latency_us;
  props->max_comms = p.max_comms;
  props->max_recvs = kMaxRecvs;
  props->net_device_type = kDeviceHost;
  props->net_device_version = kDeviceInvalidVersion;
  props->v_props.ndevs = 1;
  props->v_props.devs[0] = dev;
  props->max_p2p_bytes = kMaxMessage;
  props->max_coll_bytes = kMaxMessage;
  props->max_multi_request_size = 1;
  return kSuccess;
}

NcclResult make_v_device(int* d, VDeviceProps* props) {
  if (d == nullptr || props == nullptr) return kInternalError;
  int n = 0;
  if (devices(&n) != kSuccess) return kInternalError;
  if (props->ndevs != 1 || props->devs[0] < 0 || props->devs[0] >= n) {
    warn("makeVDevice: dmx does not merge NICs into one virtual NIC ({} devices asked)", props->ndevs);
    return kInvalidUsage;
  }
  *d = props->devs[0];  // one NIC is its own virtual NIC
  return kSuccess;
}

NcclResult ctx_create(void** ctx, uint64_t comm_id, const CommConfig* config) {
  if (ctx == nullptr) return kInternalError;
  note_traffic_class(config);
  auto* c = new PluginCtx;
  c->comm_id = comm_id;
  *ctx = c;
  return kSuccess;
}

NcclResult ctx_check(void* ctx) {
  if (ctx != nullptr && static_cast<PluginCtx*>(ctx)->magic != kCtxMagic) return kInternalError;
  return kSuccess;
}

NcclResult ctx_finalize(void* ctx) {
  if (ctx == nullptr || ctx_check(ctx) != kSuccess) return kInternalError;
  auto* c = static_cast<PluginCtx*>(ctx);
  c->magic = 0;
  delete c;
  return kSuccess;
}

NcclResult ctx_set_net_attr(void* ctx, const NetAttr* attr) {
  if (ctx == nullptr || attr == nullptr || ctx_check(ctx) != kSuccess) return kInternalError;
  // Recorded for the logs; dmx's striping does not change with NCCL's hints.
  static_cast<PluginCtx*>(ctx)->attr = *attr;
  return kSuccess;
}

void note_traffic_class(const CommConfig* config) {
  if (config == nullptr || config->traffic_class == -1) return;
  if (!plugin().traffic_class_noted.exchange(true))
    warn("traffic class {} asked: dmx sets no traffic class on its sockets; ignored", config->traffic_class);
}

NcclResult listen(int dev, void* handle, void** listen_comm) {
  Plugin& p = plugin();
  if (handle == nullptr || listen_comm == nullptr) return kInternalError;
  std::string host;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (!p.ready || dev < 0 || dev >= static_cast<int>(p.nics.size())) return kInternalError;
    host = p.nics[static_cast<size_t>(dev)].host;
  }
  auto lis = p.ctx.listen("tcp://" + host + ":0");
  if (!lis.ok()) {
    warn("listen on device {} ({}): {}", dev, host, lis.status().to_string());
    return kSystemError;
  }
  std::string addr = lis->address();
  Handle h{};
  if (addr.size() >= sizeof h.address) {
    warn("listen: address {} does not fit the handle", addr);
    return kInternalError;
  }
  auto* lc = new ListenComm;
  lc->dev = dev;
  lc->nonce = random_u64();
  lc->listener = *std::move(lis);
  h.magic = kHandleMagic;
  h.version = kHandleVersion;
  h.nonce = lc->nonce;
  h.stage = 0;
  std::memcpy(h.address, addr.data(), addr.size());
  std::memcpy(handle, &h, sizeof h);
  *listen_comm = lc;
  return kSuccess;
}

NcclResult connect(int dev, void* handle, void** send_comm) {
  Plugin& p = plugin();
  if (handle == nullptr || send_comm == nullptr) return kInternalError;
  *send_comm = nullptr;
  Handle h;
  std::memcpy(&h, handle, sizeof h);
  std::string addr = handle_address(h);
  if (addr.empty()) {
    warn("connect: the handle is not one dmx made (magic {:#x}, version {})", h.magic, h.version);
    return kInternalError;
  }
  std::unique_lock<std::mutex> lock(p.mu);
  if (!p.ready || dev < 0 || dev >= static_cast<int>(p.nics.size())) return kInternalError;
  reap_jobs(p);
  if (h.stage == 0) {  // first call: start the connection
    uint64_t id = 0;
    while (id == 0 || p.jobs.count(id)) id = random_u64();
    auto job = std::make_unique<ConnectJob>();
    job->nonce = h.nonce;
    job->address = addr;
    ConnectJob* j = job.get();
    Context ctx = p.ctx;
    uint64_t nonce = h.nonce;
    j->thread = std::thread([j, ctx, addr, nonce]() mutable {
      auto ep = ctx.connect(addr);
      if (ep.ok()) {
        uint64_t hello[2] = {kHelloMagic, nonce};
        Status s = ep->send(MemRegion{hello, sizeof hello, {}}, kHelloTag).wait(std::chrono::seconds(10));
        if (!s.ok()) ep = s;
      }
      j->result = std::move(ep);
      j->finished = Clock::now();
      j->done.store(true, std::memory_order_release);
    });
    p.jobs.emplace(id, std::move(job));
    h.stage = id;
    std::memcpy(handle, &h, sizeof h);
    return kSuccess;
  }
  auto it = p.jobs.find(h.stage);
  if (it == p.jobs.end()) {
    warn(
        "connect: no connection in progress for this handle (to {}): its stage field names no connect job of "
        "this process",
        addr);
    return kInternalError;
  }
  if (it->second->nonce != h.nonce || it->second->address != addr) {
    // A copied or forged stage: the job is another handle's connection, which stays with it.
    warn("connect: this handle (to {}) names the connect job of another handle (to {}); refused", addr,
         it->second->address);
    return kInternalError;
  }
  if (!it->second->done.load(std::memory_order_acquire)) return kSuccess;  // not yet: NCCL asks again
  std::unique_ptr<ConnectJob> job = std::move(it->second);
  p.jobs.erase(it);
  lock.unlock();
  job->thread.join();
  h.stage = 0;
  std::memcpy(handle, &h, sizeof h);
  if (!job->result.ok()) {
    warn("connect to {}: {}", addr, job->result.status().to_string());
    return kSystemError;
  }
  *send_comm = make_comm(*std::move(job->result), true, dev);
  return kSuccess;
}

NcclResult accept(void* listen_comm, void** recv_comm) {
  auto* lc = static_cast<ListenComm*>(listen_comm);
  if (lc == nullptr || recv_comm == nullptr || lc->magic != kListenMagic) return kInternalError;
  *recv_comm = nullptr;
  // Take what the listener has; each must send the handle's nonce first.
  while (static_cast<int>(lc->pending.size()) < kMaxPendingAccepts) {
    auto ep = lc->listener.accept(Duration::zero());
    if (!ep.ok()) {
      if (ep.status().code() == Code::kTimeout) break;
      warn("accept on {}: {}", lc->listener.address(), ep.status().to_string());
      return kSystemError;
    }
    ListenComm::Pending pd;
    pd.hello = std::make_unique<uint64_t[]>(2);
    pd.ep = *std::move(ep);
    pd.recv = pd.ep.recv(MemRegion{pd.hello.get(), 2 * sizeof(uint64_t), {}}, kHelloTag);
    pd.deadline = Clock::now() + kHelloTimeout;
    lc->pending.push_back(std::move(pd));
  }
  auto now = Clock::now();
  for (size_t i = 0; i < lc->pending.size();) {
    auto& pd = lc->pending[i];
    bool drop = false;
    if (pd.recv.test()) {
      Status s = pd.recv.status();
      if (s.ok() && pd.recv.bytes() == 2 * sizeof(uint64_t) && pd.hello[0] == kHelloMagic && pd.hello[1] == lc->nonce) {
        Endpoint ep = std::move(pd.ep);
        lc->pending.erase(lc->pending.begin() + static_cast<long>(i));
        *recv_comm = make_comm(std::move(ep), false, lc->dev);
        return kSuccess;
      }
      warn("accept on {}: peer {} did not present this handle ({}); dropped", lc->listener.address(), pd.ep.peer(),
           s.ok() ? "wrong nonce" : s.to_string());
      drop = true;
    } else if (now > pd.deadline) {
      warn("accept on {}: peer {} sent no hello in {} s; dropped", lc->listener.address(), pd.ep.peer(),
           kHelloTimeout.count());
      drop = true;
    }
    if (drop) {
      pd.recv.cancel();
      (void)pd.ep.close();
      lc->pending.erase(lc->pending.begin() + static_cast<long>(i));
    } else {
      ++i;
    }
  }
  return kSuccess;
}

NcclResult close_listen(void* listen_comm) {
  auto* lc = static_cast<ListenComm*>(listen_comm);
  if (lc == nullptr || lc->magic != kListenMagic) return kInternalError;
  lc->magic = 0;
  lc->listener.close();  // closes what it accepted and nobody took
  for (auto& pd : lc->pending) {
    pd.recv.cancel();
    (void)pd.ep.close();
  }
  delete lc;
  return kSuccess;
}

}  // namespace dmx::nccl
