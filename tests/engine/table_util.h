// Helpers of the table-chunk tests (docs/wire.md "Tables"): two contexts of this process that agree
// on the memcpy test path (memcpy_path.h, which takes lists), and vectored writes over it with every
// destination byte checked.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "engine/context_impl.h"
#include "engine/memcpy_path.h"
#include "engine/test_util.h"
#include "wire/frame.h"

namespace dmx::test {

using namespace std::chrono_literals;

// The memcpy path plays "rdma" in these contexts (it replaces that transport by name): the
// `transport` setting, which makes both sides agree on it, takes only the names dmx knows.
inline constexpr const char* kTableTransport = "rdma";

inline Options table_options() {
  Options o = test_options(1);
  o.set("transport", kTableTransport);
  return o;
}

struct TablePair {
  std::shared_ptr<MemcpyHooks> hooks = std::make_shared<MemcpyHooks>();
  Context a, b;  // a listens (the writes' target), b connects
  Listener listener;
  Endpoint client, server;
};

inline Context table_context(const Options& o, const std::shared_ptr<MemcpyHooks>& hooks) {
  auto c = Context::create(o);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  c->impl()->register_transport(make_memcpy_transport(hooks, kTableTransport));
  return *c;
}

inline void table_pair(TablePair& p, const Options& o = table_options()) {
  p.a = table_context(o, p.hooks);
  p.b = table_context(o, p.hooks);
  auto l = p.a.listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  p.listener = std::move(*l);
  auto c = p.b.connect(p.listener.address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  p.client = std::move(*c);
  auto s = p.listener.accept(kEventually);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  p.server = std::move(*s);
  ASSERT_NE(p.client.stats().transport.find(kTableTransport), std::string::npos) << p.client.stats().transport;
}

// n sizes drawn from [lo, hi], fresh each run.
inline std::vector<uint64_t> random_sizes(size_t n, uint64_t lo, uint64_t hi) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<uint64_t> s(n);
  for (uint64_t& x : s) x = lo + rng() % (hi - lo + 1);
  return s;
}

// A vectored write's layout: entries over `regions` target regions (alternating entry by entry),
// each destination after a gap of 1-7 bytes, each source at its own odd offset of one local buffer.
struct Layout {
  std::vector<IoEntry> entries;
  std::vector<uint64_t> region_size;  // per target region
  uint64_t local_size = 0, total = 0;
};

inline Layout make_layout(const std::vector<uint64_t>& sizes, uint32_t regions, std::mt19937_64& rng) {
  Layout l;
  l.region_size.assign(regions, 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto r = static_cast<uint32_t>(i % regions);
    IoEntry e;
    e.local = 0;
    e.remote = r;
    e.local_offset = l.local_size + 1 + rng() % 7;
    e.remote_offset = l.region_size[r] + 1 + rng() % 7;
    e.length = sizes[i];
    l.local_size = e.local_offset + e.length;
    l.region_size[r] = e.remote_offset + e.length;
    l.total += e.length;
    l.entries.push_back(e);
  }
  l.local_size += 8;
  for (uint64_t& s : l.region_size) s += 8;
  return l;
}

// Every byte of the target regions: the entries' bytes where they land, the poison elsewhere.
inline void expect_landed(const Layout& l, const std::vector<unsigned char>& src,
                          const std::vector<std::vector<unsigned char>>& got) {
  std::vector<std::vector<unsigned char>> want(got.size());
  for (size_t r = 0; r < got.size(); ++r) want[r].assign(got[r].size(), 0xA5);
  for (const IoEntry& e : l.entries)
    std::copy_n(src.begin() + static_cast<ptrdiff_t>(e.local_offset), e.length,
                want[e.remote].begin() + static_cast<ptrdiff_t>(e.remote_offset));
  for (size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].size(), want[r].size());
    auto [w, g] = std::mismatch(want[r].begin(), want[r].end(), got[r].begin());
    ASSERT_TRUE(w == want[r].end()) << "region " << r << " differs first at byte " << (w - want[r].begin());
  }
}

// One vectored write of `sizes` from memory of kind `src_where` into `regions` fresh regions of
// host memory at the target, with a notification; checks it lands byte-exact, once, and that the
// notification came after the last byte. Returns the write's status.
struct WriteRun {
  Layout layout;
  Filled src;
  std::vector<Buffer> targets;
  std::vector<Registration> regs;
  std::vector<RemoteRegion> remote;
  uint64_t value = 0;
};

inline void prepare(TablePair& p, WriteRun& w, const std::vector<uint64_t>& sizes, uint32_t regions,
                    MemSpec src_where = MemSpec{}) {
  std::mt19937_64 rng(std::random_device{}());
  w.layout = make_layout(sizes, regions, rng);
  w.src = filled(src_where, w.layout.local_size);
  for (uint32_t r = 0; r < regions; ++r) {
    w.targets.push_back(poisoned(MemSpec{}, w.layout.region_size[r]));
    auto reg = p.a.register_memory(w.targets.back().region());
    ASSERT_TRUE(reg.ok()) << reg.status().to_string();
    w.remote.push_back(reg->remote());
    w.regs.push_back(std::move(*reg));
  }
  w.value = rng() | 1;
}

inline Request start_write(TablePair& p, WriteRun& w, OpOptions o = {}) {
  o.notify = true;
  o.notify_value = w.value;
  MemRegion local[] = {w.src.buf.region()};
  return p.client.write_vec(local, w.remote, w.layout.entries, o);
}

inline std::vector<std::vector<unsigned char>> read_targets(const WriteRun& w) {
  std::vector<std::vector<unsigned char>> got;
  for (const Buffer& b : w.targets) got.push_back(read_back(b.region()));
  return got;
}

// The write completes; its one notification came, and by then every byte had landed.
inline void expect_write_lands(TablePair& p, WriteRun& w, Request& req) {
  auto note = p.server.next_notification(kEventually);
  ASSERT_TRUE(note.ok()) << note.status().to_string() << " / write: " << req.status().to_string();
  EXPECT_EQ(note->value, w.value);
  EXPECT_EQ(note->length, w.layout.total);
  expect_landed(w.layout, w.src.data, read_targets(w));  // read at the notification: all there
  Status st = req.wait(kEventually);
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto again = p.server.next_notification(50ms);
  EXPECT_FALSE(again.ok()) << "a second notification, value " << again->value;
}

// Every byte of a vectored read's buffer: the entries' bytes from `sources` (one per remote
// region) where they land, the poison elsewhere.
inline void expect_read_landed(const Layout& l, const std::vector<Filled>& sources,
                               const std::vector<unsigned char>& got) {
  std::vector<unsigned char> want(got.size(), 0xA5);
  for (const IoEntry& e : l.entries)
    std::copy_n(sources[e.remote].data.begin() + static_cast<ptrdiff_t>(e.remote_offset), e.length,
                want.begin() + static_cast<ptrdiff_t>(e.local_offset));
  auto [w, g] = std::mismatch(want.begin(), want.end(), got.begin());
  ASSERT_TRUE(w == want.end()) << "the read differs first at byte " << (w - want.begin());
}

// A table's entries as a peer writes them (docs/wire.md "Tables").
using Piece = wire::TableEntry;

inline std::vector<unsigned char> table_entries(const std::vector<Piece>& pieces) {
  std::vector<unsigned char> t(pieces.size() * wire::kTableEntrySize);
  for (size_t k = 0; k < pieces.size(); ++k) wire::put_table_entry(t.data() + k * wire::kTableEntrySize, pieces[k]);
  return t;
}

}  // namespace dmx::test
