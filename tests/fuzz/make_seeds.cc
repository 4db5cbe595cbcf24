// Writes the seed corpus of every fuzz target (tests/fuzz/corpus/<target>/): valid inputs made
// with the real encoders, so that each fuzzer starts past the magic numbers and length checks,
// plus near-valid ones (one field off) that sit on the edges of the checks.
// Usage: dmx_fuzz_make_seeds DIR (scripts/fuzz.sh --write-seeds runs it on tests/fuzz/corpus).
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "dmx/endpoint.h"
#include "mqueue/request_header.h"
#include "transport/cuda_ipc/ipc_path.h"
#include "tools/dmx/bench.h"
#include "wire/frame.h"
#include "wire/handshake.h"

using namespace dmx;
using Bytes = std::vector<unsigned char>;

namespace {

std::string g_root;
int g_count = 0;

void put(const std::string& target, const std::string& name, const Bytes& b) {
  std::string dir = g_root + "/" + target;
  ::mkdir(dir.c_str(), 0755);
  std::ofstream f(dir + "/" + name, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!f) {
    std::fprintf(stderr, "make_seeds: cannot write %s/%s\n", dir.c_str(), name.c_str());
    std::exit(1);
  }
  ++g_count;
}

Bytes cat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
Bytes le64(uint64_t v) {
  Bytes b(8);
  std::memcpy(b.data(), &v, 8);
  return b;
}

void frame_seeds() {
  using namespace wire;
  Bytes limits = cat(Bytes{0, 0, 0x10, 0}, Bytes{0, 0, 1, 0});  // max_chunk 1 MiB, max_eager 64 KiB
  struct {
    FrameType t;
    uint8_t flags;
    uint32_t len;
    uint8_t path;
  } cases[] = {{FrameType::kHello, 0, 120, 0},    {FrameType::kAuth, 0, 32, 0},      {FrameType::kJoin, 0, 44, 0},
               {FrameType::kWelcome, 0, 0, 0},    {FrameType::kReject, 0, 10, 0},    {FrameType::kEager, 0, 4096, 0},
               {FrameType::kEager, 0, 136, 1},    {FrameType::kRts, 0, 0, 0},        {FrameType::kCts, 0, 0, 0},
               {FrameType::kSendData, 0, 65536, 0}, {FrameType::kSendData, 0, 8, 3},
               {FrameType::kCancel, 0, 0, 0},     {FrameType::kAck, 0, 5, 0},        {FrameType::kCredit, 0, 0, 0},
               {FrameType::kWriteData, kFlagNotify, 100, 0}, {FrameType::kWriteData, 0, 8, 2},
               {FrameType::kReadReq, 0, 0, 0},    {FrameType::kReadData, 0, 144, 1},
               {FrameType::kPathDone, 0, 0, 0},   {FrameType::kKeepalive, 0, 0, 0},  {FrameType::kClose, 0, 6, 0},
               {FrameType::kRejoin, 0, 60, 0},    {FrameType::kLinkAck, 0, 0, 0},    {FrameType::kLinkDown, 0, 0, 0}};
  int i = 0;
  for (const auto& c : cases) {
    FrameHeader h{c.t, c.flags, c.len, 7, 1, 2, 3, 4, c.path};
    HeaderBytes b = encode_header(h);
    put("frame", "valid-" + std::string(frame_type_name(c.t)) + "-" + std::to_string(i++),
        cat(limits, Bytes(b.begin(), b.end())));
  }
  // Every type the wire knows, at the largest control payload: a type added later gets a seed
  // here without anyone remembering to, and the harness meets it on its first run.
  for (int t = 0; t < 256; ++t) {
    auto type = static_cast<FrameType>(t);
    if (frame_type_name(type) == "?") continue;
    HeaderBytes b = encode_header(FrameHeader{type, 0, kMaxControlPayload});
    put("frame", "max-control-" + std::string(frame_type_name(type)), cat(limits, Bytes(b.begin(), b.end())));
  }
  FrameHeader far{FrameType::kSendData, 0, 8};
  far.path = kMaxPathId + 1;
  HeaderBytes b = encode_header(far);
  put("frame", "bad-path-id", cat(limits, Bytes(b.begin(), b.end())));
  b = encode_header(FrameHeader{FrameType::kEager, 0, 65537});
  put("frame", "bad-eager-over-limit", cat(limits, Bytes(b.begin(), b.end())));
  b[7] = 1;
  put("frame", "bad-reserved", cat(limits, Bytes(b.begin(), b.end())));
  b = encode_header(FrameHeader{});
  b[4] = 99;
  put("frame", "bad-type", cat(limits, Bytes(b.begin(), b.end())));
  // TABLE chunks (docs/wire.md "Tables"): 3 pieces and a descriptor, the most pieces with the
  // largest descriptor, and a1 not 0.
  FrameHeader table{FrameType::kWriteData, static_cast<uint8_t>(kFlagNotify | kFlagVector | kFlagTable),
                    3 * kTableEntrySize + 100, 7, 3, 0, 4096, 4, 1};
  b = encode_header(table);
  put("frame", "valid-WRITE_DATA-table", cat(limits, Bytes(b.begin(), b.end())));
  table.a0 = kMaxTableEntries;
  table.payload_len = kMaxTablePayload;
  b = encode_header(table);
  put("frame", "max-table", cat(limits, Bytes(b.begin(), b.end())));
  table.a1 = 1;
  b = encode_header(table);
  put("frame", "bad-table-a1", cat(limits, Bytes(b.begin(), b.end())));
  FrameHeader inline_table{FrameType::kWriteData, static_cast<uint8_t>(kFlagVector | kFlagTable),
                           3 * (kTableEntrySize + 1000), 7, 3, 0, 4096, 4, 0};  // version 11: path 0
  b = encode_header(inline_table);
  put("frame", "valid-WRITE_DATA-inline-table", cat(limits, Bytes(b.begin(), b.end())));
  FrameHeader read_table{FrameType::kReadData, kFlagTable, 5 * kTableEntrySize + 100, 7, 4096, 1 << 20, 5, 0, 4};
  b = encode_header(read_table);
  put("frame", "valid-READ_DATA-table", cat(limits, Bytes(b.begin(), b.end())));
  read_table.path = 0;  // version 12: inline, the pieces' bytes follow the table
  read_table.payload_len = 5 * (kTableEntrySize + 300);
  b = encode_header(read_table);
  put("frame", "valid-READ_DATA-inline-table", cat(limits, Bytes(b.begin(), b.end())));
  FrameHeader req_table{FrameType::kReadReq, static_cast<uint8_t>(kFlagVector | kFlagTable | kFlagMore),
                        3 * kTableEntrySize, 8, 3, 0, 0, 2, 0};
  b = encode_header(req_table);
  put("frame", "valid-READ_REQ-table", cat(limits, Bytes(b.begin(), b.end())));
}

void hello_join_seeds() {
  using namespace wire;
  Hello c;
  c.version = kProtocolVersion;
  c.streams = 4;
  c.chunk_size = 1 << 20;
  c.eager_limit = 64 << 10;
  c.unexpected_budget = 64 << 20;
  c.offers = {Offer{"cuda_ipc", {1}}, Offer{"shm", {1}}, Offer{"shm_pipe", {1}}, Offer{"tcp", {1}}};
  c.nonce.fill(0x11);
  c.boot_id = "0b6c6a5e-8f1e-4c39-9d0a-6e2f6d4b8a11";
  c.hostname = "gpu-node-01";
  c.pid = 4242;
  c.peer_timeout_ms = 10000;
  c.local_channel = "@dmx-local-1234";
  put("hello_join", "hello-client", encode_hello(c));
  Hello s = c;
  s.role = Role::kServer;
  s.session = 0x1234567890abcdefull;
  s.proof.fill(0x22);
  s.local_channel.clear();
  s.offers = {Offer{"devmem", {1, 1}}, Offer{"tcp", {1}}};
  put("hello_join", "hello-server", encode_hello(s));
  Hello i = c;
  i.auth = AuthMode::kInsecure;
  i.streams = kMaxStreams;
  i.boot_id.clear();
  i.hostname.clear();
  i.local_channel.clear();
  put("hello_join", "hello-insecure-min", encode_hello(i));
  Bytes bad = encode_hello(c);
  bad.pop_back();
  put("hello_join", "hello-truncated", bad);
  bad = encode_hello(c);
  bad[0] = 2;
  put("hello_join", "hello-version-2", bad);
  Join j{0x1234567890abcdefull, 1, 4, {}};
  j.proof.fill(0x33);
  put("hello_join", "join-stream-1", encode_join(j));
  j.index = 4;
  put("hello_join", "join-data-socket", encode_join(j));
  j.index = 5;
  put("hello_join", "join-index-over", encode_join(j));
  Rejoin r{0x1234567890abcdefull, 7, 9, 5, 6, {}};
  r.proof.fill(0x44);
  put("hello_join", "rejoin-second-stream", encode_rejoin(r));
  r.index = 4;  // before the round's first
  put("hello_join", "rejoin-index-under", encode_rejoin(r));
}

void descriptor_seeds() {
  cuda_ipc::IpcDescriptor d;
  d.handle.fill(0x44);
  d.device_uuid.fill(0x55);
  d.device = 0;
  d.owner_pid = 4242;
  d.alloc_id = 9;
  d.alloc_size = 2 << 20;
  d.offset = 4096;
  d.length = 1 << 20;
  auto as_bytes = [](const std::vector<std::byte>& v) {
    return Bytes(reinterpret_cast<const unsigned char*>(v.data()), reinterpret_cast<const unsigned char*>(v.data()) + v.size());
  };
  put("descriptors", "ipc-handle", cat({0}, as_bytes(d.encode())));
  cuda_ipc::IpcDescriptor m = d;
  m.kind = cuda_ipc::IpcDescriptor::Kind::kCuMemFd;
  m.handle.fill(0);
  put("descriptors", "ipc-cumem", cat({0}, as_bytes(m.encode())));
  cuda_ipc::IpcDescriptor o = d;
  o.length = d.alloc_size;  // offset + length one page past the allocation
  put("descriptors", "ipc-outside", cat({0}, as_bytes(o.encode())));
  IpcChunkDescriptor c{d, {}};
  put("descriptors", "ipc-chunk", cat({1}, c.encode()));
  c.retired = {3, 5, 8};
  put("descriptors", "ipc-chunk-retired", cat({1}, c.encode()));
  c.source = m;
  c.retired.assign(kCudaIpcMaxRetired, 7);
  put("descriptors", "ipc-chunk-retired-max", cat({1}, c.encode()));
  IpcListDescriptor list{d, {0, 4096, 65536}, {}};
  put("descriptors", "ipc-list", cat({5}, list.encode()));
  list.source = m;
  list.offsets.assign(kCudaIpcMaxList, 512);
  list.retired.assign(kCudaIpcMaxRetired, 7);
  put("descriptors", "ipc-list-max", cat({5}, list.encode()));
  put("descriptors", "length-1mib", cat({2}, le64(1 << 20)));
  put("descriptors", "length-4mib", cat({2}, le64(4 << 20)));
  put("descriptors", "length-over", cat({2}, le64((16 << 20) + 1)));
  put("descriptors", "remote-region", cat({3}, RemoteRegion{77, 1 << 20}.serialize()));
  // fd channel: [hang-up flag] then records [len][fd count][message].
  Bytes msg = cat(cat(Bytes{'d', 'm', 'x', 'F', 1, 0, 0, 0}, le64(9)), {});
  Bytes rec = cat(Bytes{16, 1}, msg);
  put("descriptors", "fd-one", cat(Bytes{4, 0}, rec));
  put("descriptors", "fd-two-hangup", cat(cat(Bytes{4, 1}, rec), cat(Bytes{16, 1}, cat(Bytes(msg.begin(), msg.end() - 8), le64(10)))));
  put("descriptors", "fd-twice", cat(cat(Bytes{4, 0}, rec), rec));
  put("descriptors", "fd-no-fd", cat(Bytes{4, 0, 16, 0}, msg));
}

// Scripts for fuzz_shm_ring.cc's op codes.
void shm_ring_seeds() {
  // Link (byte 0 even), 4 slots of 4 KiB: post a recv of 100 B, publish a slot header for it,
  // move head to 1, progress; then a send and the peer's tail.
  Bytes link = {0, 2, 0, /*recv*/ 3, 1, 100, /*header*/ 2, 0, 1, 0, 100, 100,
                /*head*/ 0, 1, /*progress*/ 6, /*send*/ 5, 2, 0x80, 0, 0x40, 0, 0, 0, 0, 0, 0, 6, /*tail*/ 1, 1, 6};
  put("shm_ring", "link-recv-send", link);
  Bytes discard = {0, 0, 1, 4, 3, 50, 2, 1, 3, 0, 50, 50, 0, 1, 6, 7};
  put("shm_ring", "link-discard", discard);
  Bytes bad = {0, 5, 0, 3, 1, 100, 2, 0, 1, 0, 100, 0x80, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 6};
  put("shm_ring", "link-bad-len", bad);
  put("shm_ring", "link-head-jump", Bytes{0, 1, 1, 3, 1, 10, 0, 0x80, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 6});
  put("shm_ring", "link-peer-dies", Bytes{0, 1, 0, 3, 1, 10, 8, 7, 6});
  // Pipe (byte 0 odd), 4 KiB ring: head of ring 0 to 10, read 10; write 100, tail of ring 1.
  put("shm_ring", "pipe-read-write", Bytes{1, 0, 0, 0, 10, 1, 10, 2, 100, 0, 3, 100, 1, 10});
  put("shm_ring", "pipe-head-wild", Bytes{1, 0, 0, 0, 0x80, 0, 0x20, 0, 0, 0, 0, 0, 0, 1, 100});
  put("shm_ring", "pipe-closed", Bytes{1, 1, 0, 0, 20, 0, 8, 1, 1, 30, 1, 30});
  put("shm_ring", "pipe-arm-shutdown", Bytes{1, 2, 3, 1, 4, 5, 1, 5, 2, 5, 6, 1, 5});
}

void bench_plan_seeds() {
  bench::Plan p;
  p.size = 1 << 20;
  p.iters = 100;
  p.window = 4;
  p.lat_iters = 1000;
  std::string s = bench::to_json(p);
  put("bench_plan", "plan-send", Bytes(s.begin(), s.end()));
  p.op = "write";
  p.peer_mem = "cuda:1";
  p.verify = true;
  p.checksum = 0xfeedface;
  s = bench::to_json(p);
  put("bench_plan", "plan-write-verify", Bytes(s.begin(), s.end()));
  p.op = "read";
  p.quit = true;
  p.window = 64;
  p.warmup = 16;
  s = bench::to_json(p);
  put("bench_plan", "plan-read-quit", Bytes(s.begin(), s.end()));
  s = R"({"op":"send","size":-1,"iters":4294967296,"window":1,"lat_iters":0,"warmup":1,"peer_mem":"host","verify":false,"checksum":0,"quit":false})";
  put("bench_plan", "plan-out-of-range", Bytes(s.begin(), s.end()));
  s = R"({"op":"send","size":1.5e300,"iters":1,"window":1,"lat_iters":0,"warmup":1,"peer_mem":"host","verify":false,"checksum":0,"quit":false})";
  put("bench_plan", "plan-float", Bytes(s.begin(), s.end()));
  bench::Reply r;
  r.region = RemoteRegion{5, 4 << 20};
  r.checksum = 99;
  r.transport = "shm";
  r.reason = "same host";
  r.path_chunks_received = 10;
  s = bench::to_json(r);
  put("bench_plan", "reply-ok", Bytes(s.begin(), s.end()));
  r.ok = false;
  r.error = "out of memory";
  s = bench::to_json(r);
  put("bench_plan", "reply-error", Bytes(s.begin(), s.end()));
}

// fuzz_mqueue_header: [max_request u32][flags u8: 1 datagram, 2 truncated, 4 longer][extra u32] + header
// (+ payload for datagrams).
void mqueue_header_seeds() {
  using namespace mqueue;
  auto seed = [](uint32_t max, uint8_t flags, uint32_t extra, uint32_t magic, uint32_t len, uint32_t payload) {
    Bytes b(9);
    std::memcpy(b.data(), &max, 4);
    b[4] = flags;
    std::memcpy(b.data() + 5, &extra, 4);
    WireHeader h{magic, len, 0x0123456789abcdefull};
    Bytes hb(sizeof h);
    std::memcpy(hb.data(), &h, sizeof h);
    Bytes p(payload);
    for (uint32_t i = 0; i < payload; ++i) p[i] = static_cast<unsigned char>(i * 131 + 7);
    return cat(cat(b, hb), p);
  };
  put("mqueue_header", "tcp-ok", seed(4096, 0, 0, kRequestMagic, 100, 0));
  put("mqueue_header", "tcp-at-limit", seed(4096, 0, 0, kRequestMagic, 4096, 0));
  put("mqueue_header", "tcp-over-limit", seed(4096, 0, 0, kRequestMagic, 4097, 0));
  put("mqueue_header", "tcp-len-max", seed(0xffffffffu, 0, 0, kRequestMagic, 0xffffffffu, 0));
  put("mqueue_header", "tcp-bad-magic", seed(4096, 0, 0, kResponseMagic, 1, 0));
  put("mqueue_header", "udp-ok", seed(1024, 1, 0, kRequestMagic, 33, 33));
  put("mqueue_header", "udp-empty", seed(1024, 1, 0, kRequestMagic, 0, 0));
  put("mqueue_header", "udp-short-by-one", seed(1024, 1, 0, kRequestMagic, 33, 32));
  put("mqueue_header", "udp-truncated", seed(1024, 3, 0, kRequestMagic, 1500, 1024));
  put("mqueue_header", "udp-longer", seed(0xffffffffu, 5, 0xffffffffu, kRequestMagic, 0xffffffffu, 0));
  Bytes shrt = seed(1024, 1, 0, kRequestMagic, 0, 0);
  shrt.resize(9 + 15);
  put("mqueue_header", "udp-15-bytes", shrt);
}

// Requests to the metrics port: plain text, one for each verdict and edge of the head parser.
void metrics_request_seeds() {
  const std::pair<const char*, std::string> seeds[] = {
      {"get", "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nAccept: text/plain\r\n\r\n"},
      {"get-prometheus",
       "GET /metrics HTTP/1.1\r\nHost: localhost:9464\r\nUser-Agent: Prometheus/2.45.0\r\nAccept: "
       "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\nAccept-Encoding: "
       "gzip\r\nX-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n"},
      {"get-lf-http10", "GET /metrics?x=1 HTTP/1.0\n\n"},
      {"head", "HEAD /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n"},
      {"post-body", "POST /metrics HTTP/1.1\r\nContent-Length: 104857600\r\n\r\nxxxx"},
      {"get-body", "GET /metrics HTTP/1.1\r\nContent-Length: 18446744073709551616\r\n\r\n"},
      {"get-chunked", "GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
      {"get-ranges", "GET /metrics HTTP/1.1\r\nRange: bytes=0-,0-,0-,0-,0-,0-,0-,0-,0-,0-\r\n\r\n"},
      {"not-found", "GET /metric HTTP/1.1\r\n\r\n"},
      {"version-2", "GET /metrics HTTP/2.0\r\n\r\n"},
      {"folded", "GET /metrics HTTP/1.1\r\nX-A: 1\r\n  continued\r\n\r\n"},
      {"bare-cr", "GET /metrics HTTP/1.1\rX: 1\r\n\r\n"},
      {"slow-partial", "GET /metrics HTTP/1.1\r\nX-a: b\r\nX-a: b\r\n"},
  };
  for (const auto& [name, text] : seeds) put("metrics_request", name, Bytes(text.begin(), text.end()));
  std::string many = "GET /metrics HTTP/1.1\r\n";
  for (int i = 0; i < 65; ++i) many += "X: y\r\n";
  put("metrics_request", "too-many-headers", Bytes(many.begin(), many.end()));
  std::string big = "GET /metrics HTTP/1.1\r\nX: " + std::string(8200, 'a');
  put("metrics_request", "head-over-8k", Bytes(big.begin(), big.end()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  ::mkdir(g_root.c_str(), 0755);
  frame_seeds();
  hello_join_seeds();
  descriptor_seeds();
  shm_ring_seeds();
  bench_plan_seeds();
  mqueue_header_seeds();
  metrics_request_seeds();
  std::printf("make_seeds: %d files under %s\n", g_count, g_root.c_str());
  return 0;
}
