#include "dmx/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "core/units.h"

namespace dmx {
namespace {

TEST(Status, OkAndError) {
  Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.to_string(), "ok");
  Status s = Status(Code::kTimeout, "recv did not complete").with_peer("10.0.0.2:7000").with_origin("tcp/stream 1");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kTimeout);
  EXPECT_EQ(s.to_string(), "timeout: recv did not complete [peer 10.0.0.2:7000, tcp/stream 1]");
  // The innermost origin wins.
  EXPECT_EQ(s.with_origin("engine").origin(), "tcp/stream 1");
  Status copy = s;
  EXPECT_EQ(copy.to_string(), s.to_string());
}

Result<int> half(int x) {
  if (x % 2) return Status(Code::kInvalidArgument, "odd");
  return x / 2;
}

Result<int> quarter(int x) {
  DMX_ASSIGN_OR_RETURN(int h, half(x));
  DMX_ASSIGN_OR_RETURN(int q, half(h));
  return q;
}

TEST(Result, PropagatesErrors) {
  EXPECT_EQ(*quarter(8), 2);
  EXPECT_FALSE(quarter(6).ok());
  EXPECT_EQ(quarter(6).status().message(), "odd");
}

TEST(Result, OkAccessors) {
  Result<std::string> r(std::string("abc"));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.status().ok());
  EXPECT_EQ(r.value(), "abc");
  EXPECT_EQ(*r, "abc");
  EXPECT_EQ(r->size(), 3u);
  EXPECT_EQ(r.value_or("fallback"), "abc");
  const Result<std::string>& cr = r;
  EXPECT_EQ(cr.value(), "abc");
  EXPECT_EQ(cr->size(), 3u);
  r->append("d");  // non-const -> reaches the held value
  EXPECT_EQ(*r, "abcd");
  std::string moved = std::move(r).value();
  EXPECT_EQ(moved, "abcd");
}

TEST(Result, ValueOnErrorThrowsErrorWithTheStatus) {
  Result<int> r = Status(Code::kTimeout, "recv did not complete").with_peer("10.0.0.2:7000");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kTimeout);
  try {
    (void)r.value();
    FAIL() << "value() on an error did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kTimeout);
    EXPECT_EQ(e.status().message(), "recv did not complete");
    EXPECT_EQ(e.status().peer(), "10.0.0.2:7000");
    EXPECT_STREQ(e.what(), "timeout: recv did not complete [peer 10.0.0.2:7000]");
    Error copy = e;  // copies share the Status
    EXPECT_EQ(&copy.status(), &e.status());
  }
  // Every overload checks, and Error is a std::runtime_error for generic handlers.
  const Result<int>& cr = r;
  EXPECT_THROW((void)cr.value(), Error);
  EXPECT_THROW((void)std::move(r).value(), std::runtime_error);
}

TEST(Result, ValueOrOnError) {
  Result<int> r = Status(Code::kNotFound, "no such key");
  EXPECT_EQ(r.value_or(-1), -1);
  EXPECT_EQ(half(3).value_or(7), 7);
  EXPECT_EQ(half(4).value_or(7), 2);
  Result<std::unique_ptr<int>> p = Status(Code::kUnavailable, "none");
  EXPECT_EQ(std::move(p).value_or(nullptr), nullptr);
  Result<std::unique_ptr<int>> q = std::make_unique<int>(5);
  EXPECT_EQ(*std::move(q).value_or(nullptr), 5);  // move-only values move out
}

TEST(Units, Sizes) {
  EXPECT_EQ(*parse_size("8"), 8u);
  EXPECT_EQ(*parse_size("4K"), 4096u);
  EXPECT_EQ(*parse_size("1M"), 1u << 20);
  EXPECT_EQ(*parse_size("256MiB"), 256u << 20);
  EXPECT_EQ(*parse_size("16G"), 16ull << 30);
  EXPECT_EQ(*parse_size("1.5K"), 1536u);
  EXPECT_FALSE(parse_size("").ok());
  EXPECT_FALSE(parse_size("K").ok());
  EXPECT_FALSE(parse_size("12Q").ok());
  EXPECT_FALSE(parse_size("0.3").ok());
  EXPECT_FALSE(parse_size("99999999999T").ok());
  EXPECT_EQ(format_size(17), "17 B");
  EXPECT_EQ(format_size(4096), "4 KiB");
  EXPECT_EQ(format_size(1536), "1.5 KiB");
}

TEST(Units, Durations) {
  EXPECT_EQ(parse_duration("250")->count(), 250000);
  EXPECT_EQ(parse_duration("2s")->count(), 2000000);
  EXPECT_EQ(parse_duration("10us")->count(), 10);
  EXPECT_FALSE(parse_duration("2 fortnights").ok());
}

}  // namespace
}  // namespace dmx
