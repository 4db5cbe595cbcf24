// Registering memory that a live registration already holds (the same region again, or a sub-range)
// is a lookup: the transports are not asked to attach (pin, export, bind) anything new.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/context_impl.h"
#include "engine/test_util.h"

namespace dmx {
namespace {

using test::test_options;

// A transport that is never offered and counts what registrations ask of it; each attachment is a
// token the test can watch.
class CountingTransport final : public Transport {
 public:
  std::string_view name() const override { return "counting"; }
  Gives gives() const override { return Gives::kPath; }
  Result<std::vector<unsigned char>> offer(const Config&) override {
    return Status(Code::kUnavailable, "counting: left out by the test");
  }
  Status compatible(std::span<const unsigned char>, std::span<const unsigned char>, const PeerPair&) const override {
    return Status();
  }
  std::string role(const PeerPair&) const override { return "counting"; }
  std::string when() const override { return "tests only"; }
  Result<TransportLink> connect(Bootstrap&) override { return TransportLink{}; }
  std::shared_ptr<void> attach_registration(const MemRegion& region) override {
    auto token = std::make_shared<MemRegion>(region);
    tokens.push_back(token);
    return token;
  }
  std::vector<std::weak_ptr<MemRegion>> tokens;  // one per attach
};

struct Fixture {
  Context ctx;
  std::shared_ptr<CountingTransport> counting = std::make_shared<CountingTransport>();
  Fixture() {
    auto c = Context::create(test_options(1));
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    ctx = *c;
    ctx.impl()->register_transport(counting);
  }
};

TEST(RegistrationLookup, SameRegionAndSubRangesAttachOnce) {
  Fixture f;
  auto buf = Buffer::allocate(MemSpec{}, 3 << 20);  // spans 2 MiB pages: a GTLB page and a cell
  ASSERT_TRUE(buf.ok());
  auto whole = f.ctx.register_memory(buf->region());
  ASSERT_TRUE(whole.ok());
  ASSERT_EQ(f.counting->tokens.size(), 1u);
  auto again = f.ctx.register_memory(buf->region());
  auto sub = f.ctx.register_memory(buf->region().sub(4097, 12345));  // odd offset and length
  auto tail = f.ctx.register_memory(buf->region().sub((3 << 20) - 1, 1));
  auto empty = f.ctx.register_memory(buf->region().sub(100, 0));
  ASSERT_TRUE(again.ok() && sub.ok() && tail.ok() && empty.ok());
  EXPECT_EQ(f.counting->tokens.size(), 1u) << "a registration held by a live one attached again";
  auto counts = f.ctx.impl()->registration_counts();
  EXPECT_EQ(counts.shared, 3u);  // an empty region attaches nothing and counts in neither
  // Each registration is still its own key, bounded to its own range.
  EXPECT_NE(sub->remote().key, whole->remote().key);
  EXPECT_NE(again->remote().key, whole->remote().key);
  EXPECT_EQ(sub->remote().size, 12345u);

  // Not held whole by any: other memory, and a range running past the registered one's end.
  auto other = Buffer::allocate(MemSpec{}, 1 << 20);
  ASSERT_TRUE(other.ok());
  auto o1 = f.ctx.register_memory(other->region());
  ASSERT_TRUE(o1.ok());
  EXPECT_EQ(f.counting->tokens.size(), 2u);
  auto sub_of_sub = f.ctx.register_memory(buf->region().sub(5000, 100));
  ASSERT_TRUE(sub_of_sub.ok());
  EXPECT_EQ(f.counting->tokens.size(), 2u);

  // The attachment lives while any registration that shares it does.
  ASSERT_TRUE(whole->deregister().ok());
  ASSERT_TRUE(again->deregister().ok());
  EXPECT_FALSE(f.counting->tokens[0].expired());
  ASSERT_TRUE(sub->deregister().ok());
  ASSERT_TRUE(tail->deregister().ok());
  ASSERT_TRUE(sub_of_sub->deregister().ok());
  ASSERT_TRUE(empty->deregister().ok());
  EXPECT_TRUE(f.counting->tokens[0].expired());

  // Gone: the same memory registered again is attached again (no stale translation serves it).
  auto fresh = f.ctx.register_memory(buf->region().sub(4097, 12345));
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(f.counting->tokens.size(), 3u);
}

TEST(RegistrationLookup, KindsAreNotShared) {
  Fixture f;
  auto buf = Buffer::allocate(MemSpec{}, 1 << 20);
  ASSERT_TRUE(buf.ok());
  auto host = f.ctx.register_memory(buf->region());
  ASSERT_TRUE(host.ok());
  MemRegion pinned_view{buf->data(), 4096, MemSpec{MemKind::kSim, 0}};  // the same addresses, another kind
  auto pinned = f.ctx.register_memory(pinned_view);
  if (!pinned.ok()) GTEST_SKIP() << "sim memory unavailable: " << pinned.status().to_string();
  EXPECT_EQ(f.counting->tokens.size(), 2u);
}

// A sub-range registration is a capability for its range only: a write lands inside it, byte-exact,
// and one past its end is refused.
TEST(RegistrationLookup, SubRangeRegistrationMovesBytesAndBoundsThem) {
  Options o = test_options(2);
  o.set("transport", "tcp");
  auto c = Context::create(o);
  ASSERT_TRUE(c.ok());
  Context ctx = *c;
  auto l = ctx.listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok());
  auto client = ctx.connect(l->address());
  ASSERT_TRUE(client.ok());
  auto server = l->accept(test::kEventually);
  ASSERT_TRUE(server.ok());
  Buffer target = test::poisoned(MemSpec{}, 1 << 20);
  auto whole = ctx.register_memory(target.region());
  auto sub = ctx.register_memory(target.region().sub(1001, 70001));
  ASSERT_TRUE(whole.ok() && sub.ok());
  EXPECT_EQ(ctx.impl()->registration_counts().shared, 1u);
  test::Filled src = test::filled(MemSpec{}, 70001);
  ASSERT_TRUE(client->write(src.buf.region().sub(0, 69000), sub->remote(), 1001).wait(test::kEventually).ok());
  auto got = test::read_back(target.region());
  EXPECT_EQ(0, std::memcmp(got.data() + 1001 + 1001, src.data.data(), 69000));
  EXPECT_EQ(got[1001 + 1000], 0xA5);
  EXPECT_EQ(got[1001 + 1001 + 69000], 0xA5);
  Status past = client->write(src.buf.region().sub(0, 2), sub->remote(), 70000).wait(test::kEventually);
  EXPECT_FALSE(past.ok());
}

}  // namespace
}  // namespace dmx
