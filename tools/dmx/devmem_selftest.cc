// dmx devmem selftest: the hardware self-test a user runs on a devmem-capable NIC.
//
//   one host, two ports:  dmx devmem selftest --ifname IF --queues A-B --listen tcp://IP_OF_IF:PORT
//                                             --peer-ifname IF2 --peer-queues C-D
//   two hosts:            (receiver) dmx devmem selftest --ifname IF --queues A-B --listen tcp://IP:PORT
//                         (sender)   dmx devmem selftest --ifname IF --queues A-B --connect tcp://IP:PORT
//
// Steps, each printed with its verdict and reason: probe (kernel, NIC, bind checks, zcrx, dma-buf
// export, gather), NIC setup (unless set up already: then the recorded setup is used and kept),
// a real bind-rx and bind-tx of GPU memory (released), a zcrx registration of the last queue over
// a GPU dma-buf (released), the transfer (random bytes from GPU memory both ways with
// transport=devmem, compared byte for byte, with the path each side used), teardown of what this
// run set up (flow rules recorded by the connections included). Exit status 0 only if every step
// passed. Every wait has a deadline (--timeout).
#include <fmt/format.h>
#include <net/if.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dmx/context.h"
#include "dmx/memory.h"
#include "dmx/options.h"
#include "tools/dmx/commands.h"
#include "tools/dmx/devmem_selftest.h"
#include "transport/devmem/devmem.h"
#include "transport/devmem/nic.h"
#include "transport/devmem/region.h"
#include "transport/devmem/rule_ledger.h"
#include "transport/devmem/zcrx.h"

namespace dmx::cli {

namespace {

struct Report {
  int failed = 0;
  void step(const char* name, const Status& s, const std::string& ok_text = "") {
    if (!s.ok()) ++failed;
    std::printf("%-10s %-4s %s\n", name, s.ok() ? "ok" : "FAIL", s.ok() ? ok_text.c_str() : s.to_string().c_str());
    std::fflush(stdout);
  }
  void skip(const char* name, const std::string& why) { std::printf("%-10s %-4s %s\n", name, "skip", why.c_str()); }
};

Result<std::pair<uint32_t, uint32_t>> queue_range(const std::string& text) {
  DMX_ASSIGN_OR_RETURN(auto q, devmem::parse_queue_range(text));
  return std::make_pair(q.front(), q.back());
}

// A real bind-rx of 4 MiB of GPU memory to the queues and a bind-tx, both released at once.
Status bind_check(const std::string& ifname, const std::vector<uint32_t>& queues, int gpu, std::string* what) {
  DMX_ASSIGN_OR_RETURN(Buffer buf, Buffer::allocate({MemKind::kCuda, gpu}, 4 << 20));
  auto ops = devmem::make_kernel_netlink_ops();
  int ifindex = static_cast<int>(::if_nametoindex(ifname.c_str()));
  DMX_ASSIGN_OR_RETURN(auto rx, devmem::BoundRegion::bind_rx(*ops, ifindex, queues, buf.region()));
  DMX_ASSIGN_OR_RETURN(auto tx, devmem::BoundRegion::bind_tx(*ops, ifindex, buf.region()));
  *what = fmt::format("bind-rx of cuda:{} to {} queues {}-{} (binding {}), bind-tx (binding {}); released", gpu,
                      ifname, queues.front(), queues.back(), rx->id(), tx->id());
  return Status();
}

// A zcrx registration of `queue` over a GPU dma-buf area, released at once (no data moves).
Status zcrx_check(const std::string& ifname, uint32_t queue, int gpu, std::string* what) {
  DMX_ASSIGN_OR_RETURN(Buffer buf, Buffer::allocate({MemKind::kCuda, gpu}, 4 << 20));
  DMX_ASSIGN_OR_RETURN(DmabufExport e, export_dmabuf(buf.region()));
  int ifindex = static_cast<int>(::if_nametoindex(ifname.c_str()));
  DMX_ASSIGN_OR_RETURN(auto k, devmem::open_kernel_zcrx(ifindex, queue, -1, e.fd.get(), e.size, 256));
  *what = fmt::format("registered {} queue {} with a {}-byte GPU dma-buf area (token {:#x}); released "
                      "(transfer receives by zcrx where the path picks it: see its path line)",
                      ifname, queue, e.size, k->area_token());
  return Status();
}

Options side_options(const std::string& ifname, const std::string& queues, const SelftestArgs& a) {
  Options o;
  o.set("transport", "devmem");
  o.set("devmem_ifname", ifname);
  o.set("devmem_queues", queues);
  o.set("devmem_gpu", std::to_string(a.gpu));
  o.set("devmem_state_dir", a.state_dir);
  o.set("connect_timeout", fmt::format("{}s", a.timeout_s));
  add_log_level(o);
  return o;
}

// Sends `size` random bytes from GPU memory and receives them back into GPU memory (the peer
// echoes), comparing byte for byte. The side that listens echoes.
Status exchange(Endpoint& ep, bool echo, const SelftestArgs& a, std::string* what) {
  size_t size = a.size_mib << 20 | 4093;  // odd on purpose
  auto timeout = std::chrono::seconds(a.timeout_s);
  DMX_ASSIGN_OR_RETURN(Buffer gpu, Buffer::allocate({MemKind::kCuda, a.gpu}, size));
  DMX_ASSIGN_OR_RETURN(Buffer host, Buffer::allocate({MemKind::kHost, 0}, size));
  auto t0 = std::chrono::steady_clock::now();
  if (echo) {
    DMX_RETURN_IF_ERROR(ep.recv(gpu.region(), 1).wait(timeout));
    DMX_RETURN_IF_ERROR(ep.send(gpu.region(), 2).wait(timeout));
  } else {
    std::mt19937_64 rng(std::random_device{}());
    auto* h = static_cast<uint8_t*>(host.region().ptr);
    for (size_t i = 0; i < size; ++i) h[i] = static_cast<uint8_t>(rng());
    std::vector<uint8_t> want(h, h + size);
    DMX_RETURN_IF_ERROR(copy_memory(gpu.region(), host.region()));
    DMX_RETURN_IF_ERROR(ep.send(gpu.region(), 1).wait(timeout));
    DMX_ASSIGN_OR_RETURN(Buffer back, Buffer::allocate({MemKind::kCuda, a.gpu}, size));
    DMX_RETURN_IF_ERROR(ep.recv(back.region(), 2).wait(timeout));
    DMX_RETURN_IF_ERROR(copy_memory(host.region(), back.region()));
    for (size_t i = 0; i < size; ++i)
      if (h[i] != want[i]) return Status(Code::kInternal, fmt::format("byte {} of {} differs after the round trip", i, size));
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto st = ep.stats();
  std::string path;  // the devmem path's detail names the receiver (zcrx or devmem RX) and why
  for (const auto& p : st.paths)
    if (p.name == "devmem") path = "; path: " + p.detail;
  *what = fmt::format("{} bytes {} in {:.3f} s; transport {} ({}){}", size, echo ? "echoed" : "both ways, equal", s,
                      st.transport, st.reason, path);
  if (st.transport.find("devmem") == std::string::npos)
    return Status(Code::kUnavailable, fmt::format("the endpoint did not use devmem: {} ({})", st.transport, st.reason));
  return Status();
}

}  // namespace

int run_devmem_selftest(const SelftestArgs& a) {
  Report r;
  auto own = queue_range(a.queues);
  if (!own.ok()) return std::fprintf(stderr, "dmx devmem selftest: %s\n", own.status().to_string().c_str()), 2;
  if (a.listen.empty() == a.connect.empty())
    return std::fprintf(stderr, "dmx devmem selftest: give exactly one of --listen and --connect\n"), 2;
  std::vector<std::pair<std::string, std::string>> nics = {{a.ifname, a.queues}};
  if (!a.peer_ifname.empty()) nics.push_back({a.peer_ifname, a.peer_queues});

  // 1. probe
  for (const auto& c : devmem::probe()) {
    bool ours = c.name.find('[') == std::string::npos;
    for (const auto& [n, q] : nics) ours = ours || c.name.find("[" + n + "]") != std::string::npos;
    if (ours) std::printf("probe      %-4s %s: %s\n", c.available ? "yes" : "no", c.name.c_str(), c.detail.c_str());
  }
  // 2. setup (this run's, undone at the end) — or the recorded one, kept
  auto nic_ops = devmem::make_kernel_nic_ops();
  std::vector<std::pair<std::string, devmem::SetupRecord>> ours;
  for (const auto& [n, q] : nics) {
    auto range = queue_range(q);
    if (!range.ok()) {
      r.step("setup", range.status());
      continue;
    }
    std::string recorded = a.state_dir + "/devmem-" + n + ".json";
    if (std::FILE* f = std::fopen(recorded.c_str(), "r")) {
      std::fclose(f);
      r.skip("setup", n + " is set up already (" + recorded + "): used as it is, kept");
      continue;
    }
    auto rec = devmem::setup_nic(*nic_ops, n, range->first, range->second);
    r.step("setup", rec.ok() ? Status() : rec.status(), n + " queues " + q + " ready (undone at the end)");
    if (rec.ok()) ours.push_back({n, std::move(*rec)});
  }
  // 3. bind, 4. zcrx
  for (const auto& [n, q] : nics) {
    auto qs = devmem::parse_queue_range(q);
    std::string what;
    r.step("bind", qs.ok() ? bind_check(n, *qs, a.gpu, &what) : qs.status(), what);
    what.clear();
    r.step("zcrx", qs.ok() ? zcrx_check(n, qs->back(), a.gpu, &what) : qs.status(), what);
  }
  // 5. transfer
  {
    std::string what;
    Status s;
    if (!a.peer_ifname.empty()) {  // both sides here: the listener on IF, the client through IF2
      auto server = Context::create(side_options(a.ifname, a.queues, a));
      auto client = Context::create(side_options(a.peer_ifname, a.peer_queues, a));
      s = !server.ok() ? server.status() : client.status();
      if (server.ok() && client.ok()) {
        auto l = server->listen(a.listen);
        if (!l.ok()) {
          s = l.status();
        } else {
          Status echo_status;
          std::string echo_what;
          std::thread echo([&] {
            auto ep = l->accept(std::chrono::seconds(a.timeout_s));
            echo_status = ep.ok() ? exchange(*ep, true, a, &echo_what) : ep.status();
          });
          auto ep = client->connect(l->address());
          s = ep.ok() ? exchange(*ep, false, a, &what) : ep.status();
          echo.join();
          if (s.ok() && !echo_status.ok()) s = echo_status;
        }
      }
    } else {
      auto ctx = Context::create(side_options(a.ifname, a.queues, a));
      s = ctx.status();
      if (ctx.ok() && !a.listen.empty()) {
        auto l = ctx->listen(a.listen);
        auto ep = l.ok() ? l->accept(std::chrono::seconds(a.timeout_s)) : Result<Endpoint>(l.status());
        s = ep.ok() ? exchange(*ep, true, a, &what) : ep.status();
      } else if (ctx.ok()) {
        auto ep = ctx->connect(a.connect);
        s = ep.ok() ? exchange(*ep, false, a, &what) : ep.status();
      }
    }
    r.step("transfer", s, what);
  }
  // 6. teardown of what this run set up, with the flow rules the connections recorded
  for (auto& [n, rec] : ours) {
    devmem::RuleLedger ledger(devmem::RuleLedger::path_for(a.state_dir, n));
    auto rules = ledger.list();
    Status s = rules.ok() ? devmem::teardown_nic(*nic_ops, rec, *rules) : rules.status();
    if (s.ok() && rules.ok()) (void)ledger.forget(*rules);
    r.step("teardown", s, n + " restored");
  }
  std::printf("selftest   %s (%d step%s failed)\n", r.failed ? "FAIL" : "ok", r.failed, r.failed == 1 ? "" : "s");
  return r.failed ? 1 : 0;
}

}  // namespace dmx::cli
