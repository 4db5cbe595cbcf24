// Context::metrics() and to_prometheus(): counters match what a loopback transfer did.
#include "engine/metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <numeric>
#include <regex>
#include <sstream>
#include <thread>

#include "engine/test_util.h"

namespace dmx::test {
namespace {

constexpr size_t kSend = 0, kRecv = 1, kWrite = 2, kRead = 3;  // kMetricOps

const TransportMetrics& of(const Metrics& m, const char* transport) {
  const TransportMetrics* t = m.find(transport);
  EXPECT_NE(t, nullptr) << transport;
  static const TransportMetrics none;
  return t ? *t : none;
}

// Sends one message of each size client -> server (both endpoints in p.ctx); returns the bytes.
uint64_t send_all(Pair& p, const std::vector<size_t>& sizes) {
  std::vector<Filled> out;
  std::vector<Buffer> in;
  std::vector<Request> reqs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.push_back(filled(MemSpec{}, sizes[i]));
    in.push_back(poisoned(MemSpec{}, sizes[i]));
    reqs.push_back(p.server.recv(in.back().region(), i));
  }
  for (size_t i = 0; i < sizes.size(); ++i) reqs.push_back(p.client.send(out[i].buf.region(), i));
  for (auto& r : reqs) EXPECT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
  return std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
}

TEST(Metrics, TcpCountsBytesOperationsAndLatencyExactly) {
  Options o = test_options(2);
  o.set("transport", "tcp");
  Pair p = connect_pair(o);
  // Eager and rendezvous messages, and a rendezvous larger than a chunk.
  std::vector<size_t> sizes = {1, 100, 5000, 20000, 300000, 1 << 20, (1 << 20) + 3};
  uint64_t bytes = send_all(p, sizes);
  // One-sided too: a write and a read of known sizes.
  Buffer target = poisoned(MemSpec{}, 70000);
  auto reg = p.ctx.register_memory(target.region());
  ASSERT_TRUE(reg.ok()) << reg.status().to_string();
  Filled src = filled(MemSpec{}, 70000);
  Buffer dst = poisoned(MemSpec{}, 30000);
  ASSERT_TRUE(p.client.write(src.buf.region(), reg->remote(), 0).wait(kEventually).ok());
  ASSERT_TRUE(p.client.read(dst.region(), reg->remote(), 100).wait(kEventually).ok());
  bytes += 70000 + 30000;

  // Both endpoints belong to this context: every byte is sent once and received once. The side
  // serving the read counts its bytes once they are written, which may be just after the reader
  // completed.
  Metrics m = p.ctx.metrics();
  for (int i = 0; i < 500 && of(m, "tcp").bytes_sent < bytes; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    m = p.ctx.metrics();
  }
  const TransportMetrics& tcp = of(m, "tcp");
  EXPECT_EQ(tcp.bytes_sent, bytes);
  EXPECT_EQ(tcp.bytes_received, bytes);
  EXPECT_EQ(tcp.completed[kSend], sizes.size());
  EXPECT_EQ(tcp.completed[kRecv], sizes.size());
  EXPECT_EQ(tcp.completed[kWrite], 1u);
  EXPECT_EQ(tcp.completed[kRead], 1u);
  for (size_t op = 0; op < kMetricOpKinds; ++op) {
    EXPECT_EQ(tcp.latency[op].count(), tcp.completed[op]) << kMetricOps[op];
    EXPECT_GT(tcp.latency[op].sum_us, 0) << kMetricOps[op];
    for (size_t c = 0; c < kCodeCount; ++c) EXPECT_EQ(tcp.failed[op][c], 0u) << kMetricOps[op] << " " << c;
  }
  for (const char* other : {"shm", "cuda_ipc", "devmem"}) {
    EXPECT_EQ(of(m, other).bytes_sent, 0u) << other;
    EXPECT_EQ(of(m, other).completed[kSend], 0u) << other;
  }

  // Counters are the context's: they outlive the endpoints (closing adds the CLOSE frames' text).
  EXPECT_TRUE(p.client.close().ok());
  EXPECT_TRUE(p.server.close().ok());
  Metrics after = p.ctx.metrics();
  EXPECT_GE(of(after, "tcp").bytes_sent, bytes);
  EXPECT_LE(of(after, "tcp").bytes_sent, bytes + 256);
  EXPECT_EQ(of(after, "tcp").completed, tcp.completed);
}

TEST(Metrics, ShmCountsWhatTheShmPathCarried) {
  Options o = test_options(2);
  o.set("transport", "shm").set("control_pipe", "false");  // stream 0 on TCP: shm carries payload only
  Pair p = connect_pair(o);
  EndpointStats st = p.client.stats();
  if (st.transport != "shm") DMX_SKIP(kNotAgreed) << "shm: " << st.reason;
  // Above the eager limit: every byte goes by the shm path.
  std::vector<size_t> sizes = {20000, 100000, 1 << 20, 3 << 20};
  uint64_t bytes = send_all(p, sizes);
  Metrics m = p.ctx.metrics();
  const TransportMetrics& shm = of(m, "shm");
  EXPECT_EQ(shm.bytes_sent, bytes);
  EXPECT_EQ(shm.bytes_received, bytes);
  EXPECT_EQ(shm.completed[kSend], sizes.size());
  EXPECT_EQ(shm.completed[kRecv], sizes.size());
  EXPECT_EQ(shm.latency[kSend].count(), sizes.size());
  EXPECT_EQ(of(m, "tcp").completed[kSend], 0u);
  EXPECT_EQ(of(m, "tcp").completed[kRecv], 0u);
}

TEST(Metrics, CudaIpcCountsDeviceSendsAndReceives) {
  DMX_SKIP_WITHOUT_GPU();
  Pair p = connect_pair(test_options(2));
  EndpointStats st = p.client.stats();
  if (st.transport.find("cuda_ipc") == std::string::npos) DMX_SKIP(kNotAgreed) << "cuda_ipc: " << st.reason;
  MemSpec gpu{MemKind::kCuda, 0};
  std::vector<size_t> sizes = {8, 100000, 3 << 20};  // eager (the receiver copies it), rendezvous
  std::vector<Filled> out;
  std::vector<Buffer> in;
  std::vector<Request> recvs, sends;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.push_back(filled(gpu, sizes[i]));
    in.push_back(poisoned(gpu, sizes[i]));
    recvs.push_back(p.server.recv(in.back().region(), i));
  }
  for (size_t i = 0; i < sizes.size(); ++i) sends.push_back(p.client.send(out[i].buf.region(), i));
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(sends[i].wait(kEventually).ok()) << sends[i].status().to_string();
    ASSERT_TRUE(recvs[i].wait(kEventually).ok()) << recvs[i].status().to_string();
  }
  uint64_t bytes = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  Metrics m = p.ctx.metrics();
  const TransportMetrics& ipc = of(m, "cuda_ipc");
  EXPECT_EQ(ipc.completed[kSend], sizes.size());
  EXPECT_EQ(ipc.completed[kRecv], sizes.size());
  EXPECT_EQ(ipc.bytes_sent, bytes);
  EXPECT_EQ(ipc.bytes_received, bytes);
}

TEST(Metrics, FailedOperationsCountByCode) {
  Options o = test_options(1);
  o.set("transport", "tcp");
  Pair p = connect_pair(o);
  Buffer b = poisoned(MemSpec{}, 64);
  Request cancelled = p.server.recv(b.region(), 7);
  cancelled.cancel();
  EXPECT_EQ(cancelled.wait(kEventually).code(), Code::kCancelled);
  OpOptions soon;
  soon.timeout = std::chrono::milliseconds(1);
  EXPECT_EQ(p.server.recv(b.region(), 8, soon).wait(kEventually).code(), Code::kTimeout);
  Metrics m = p.ctx.metrics();
  const TransportMetrics& tcp = of(m, "tcp");
  EXPECT_EQ(tcp.failed[kRecv][static_cast<size_t>(Code::kCancelled)], 1u);
  EXPECT_EQ(tcp.failed[kRecv][static_cast<size_t>(Code::kTimeout)], 1u);
  EXPECT_EQ(tcp.completed[kRecv], 0u);
  EXPECT_EQ(tcp.latency[kRecv].count(), 0u);
  EXPECT_NE(to_prometheus(m).find("dmx_operations_failed_total{transport=\"tcp\",op=\"recv\",code=\"cancelled\"} 1\n"),
            std::string::npos);
}

// Snapshots taken while operations complete and endpoints stop never go backwards (an endpoint's
// bytes move from the live sum to the kept totals exactly once). Run under TSan in CI.
TEST(Metrics, SnapshotsDuringTrafficAndCloseOnlyGrow) {
  Options o = test_options(2);
  o.set("transport", "tcp");
  Pair p = connect_pair(o);
  std::atomic<bool> done{false};
  std::thread reader([&] {
    uint64_t last_bytes = 0, last_ops = 0;
    while (!done.load()) {
      Metrics m = p.ctx.metrics();
      const TransportMetrics& tcp = of(m, "tcp");
      EXPECT_GE(tcp.bytes_received, last_bytes);
      EXPECT_GE(tcp.completed[kRecv], last_ops);
      last_bytes = tcp.bytes_received;
      last_ops = tcp.completed[kRecv];
      EXPECT_FALSE(to_prometheus(m).empty());
    }
  });
  std::vector<size_t> sizes(50, 3000);
  sizes.push_back(200000);
  send_all(p, sizes);
  EXPECT_TRUE(p.client.close().ok());
  EXPECT_TRUE(p.server.close().ok());
  p.client = Endpoint();
  p.server = Endpoint();
  done.store(true);
  reader.join();
  EXPECT_EQ(of(p.ctx.metrics(), "tcp").completed[kRecv], sizes.size());
}

TEST(Metrics, LatencyBucketsAreLog2Microseconds) {
  EXPECT_EQ(MetricsRegistry::bucket_of(0), 0u);
  EXPECT_EQ(MetricsRegistry::bucket_of(1000), 0u);  // <= 1 us
  EXPECT_EQ(MetricsRegistry::bucket_of(1001), 1u);  // <= 2 us
  EXPECT_EQ(MetricsRegistry::bucket_of(2000), 1u);
  EXPECT_EQ(MetricsRegistry::bucket_of(2001), 2u);
  EXPECT_EQ(MetricsRegistry::bucket_of(1'000'000), 10u);  // 1 ms <= 1024 us
  EXPECT_EQ(MetricsRegistry::bucket_of(uint64_t{1} << 40), LatencyHistogram::kBounds);
}

// Checks the text exposition format: samples `name{labels} value` of families declared by a TYPE
// line; each histogram's buckets cumulative, ending in +Inf equal to _count. Returns the samples.
std::map<std::string, double> parse_prometheus(const std::string& text) {
  static const std::regex sample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*)\})? ([^ ]+)$)");
  static const std::regex le_label(R"(,?le="([^"]*)\")");
  std::map<std::string, std::string> types;
  std::map<std::string, double> samples;
  struct Hist {
    double last = -1, inf = -1, count = -2;
  };
  std::map<std::string, Hist> hists;  // by family and labels without le
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("# HELP ")) continue;
    if (line.starts_with("# TYPE ")) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      EXPECT_TRUE(type == "counter" || type == "histogram") << line;
      EXPECT_EQ(types.count(name), 0u) << "declared twice: " << line;
      types[name] = type;
      continue;
    }
    std::smatch mt;
    EXPECT_TRUE(std::regex_match(line, mt, sample)) << "not a sample line: '" << line << "'";
    if (mt.empty()) continue;
    std::string name = mt[1], labels = mt[3];
    size_t used = 0;
    double value = std::stod(mt[4], &used);
    EXPECT_EQ(used, mt[4].length()) << line;
    EXPECT_EQ(samples.count(name + "{" + labels + "}"), 0u) << "twice: " << line;
    samples[name + "{" + labels + "}"] = value;
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (name.ends_with(suffix) && types.count(name.substr(0, name.size() - std::strlen(suffix))))
        family = name.substr(0, name.size() - std::strlen(suffix));
    EXPECT_EQ(types.count(family), 1u) << "no TYPE line before: " << line;
    if (types[family] != "histogram") continue;
    std::smatch le;
    std::string key = family + "{" + std::regex_replace(labels, le_label, "") + "}";
    Hist& h = hists[key];
    if (name.ends_with("_bucket")) {
      EXPECT_TRUE(std::regex_search(labels, le, le_label)) << line;
      EXPECT_LT(h.inf, 0) << "bucket after +Inf: " << line;
      EXPECT_GE(value, h.last) << "buckets not cumulative: " << line;
      h.last = value;
      if (le[1] == "+Inf") h.inf = value;
    } else if (name.ends_with("_count")) {
      h.count = value;
    }
  }
  for (const auto& [key, h] : hists) {
    EXPECT_GE(h.inf, 0) << key << ": no +Inf bucket";
    EXPECT_EQ(h.inf, h.count) << key << ": +Inf bucket differs from _count";
  }
  return samples;
}

TEST(Metrics, PrometheusTextParses) {
  Options o = test_options(2);
  o.set("transport", "tcp");
  Pair p = connect_pair(o);
  uint64_t bytes = send_all(p, {8, 4096, 100000});
  Metrics m = p.ctx.metrics();
  auto samples = parse_prometheus(to_prometheus(m));
  EXPECT_EQ(samples["dmx_bytes_total{transport=\"tcp\",direction=\"sent\"}"], static_cast<double>(bytes));
  EXPECT_EQ(samples["dmx_operations_total{transport=\"tcp\",op=\"send\"}"], 3);
  EXPECT_EQ(samples["dmx_operation_latency_microseconds_count{transport=\"tcp\",op=\"recv\"}"], 3);
  EXPECT_EQ(samples["dmx_operation_latency_microseconds_bucket{transport=\"tcp\",op=\"recv\",le=\"+Inf\"}"], 3);
  EXPECT_EQ(samples.count("dmx_bytes_total{transport=\"devmem\",direction=\"received\"}"), 1u);
}

}  // namespace
}  // namespace dmx::test
