// Guards against a peer's numbers and text: checked arithmetic, checked sub-ranges, escaped and
// rate-limited log lines.
#include <gtest/gtest.h>

#include <thread>

#include "core/checked.h"
#include "core/log.h"
#include "dmx/memory.h"

namespace dmx {
namespace {

TEST(Checked, ArithmeticRefusesToWrap) {
  EXPECT_EQ(checked_add(1, 2), 3u);
  EXPECT_FALSE(checked_add(UINT64_MAX, 1).has_value());
  EXPECT_EQ(checked_mul(1 << 20, 1 << 20), uint64_t{1} << 40);
  EXPECT_FALSE(checked_mul(uint64_t{1} << 32, uint64_t{1} << 32).has_value());
  EXPECT_TRUE(range_fits(0, 0, 0));
  EXPECT_TRUE(range_fits(10, 0, 10));
  EXPECT_TRUE(range_fits(4, 6, 10));
  EXPECT_FALSE(range_fits(4, 7, 10));
  EXPECT_FALSE(range_fits(11, 0, 10));
  EXPECT_FALSE(range_fits(8, UINT64_MAX - 4, 10));  // offset + length wraps to 3
}

TEST(Checked, SubRangeOutsideTheRegionIsABugNotAnOverflow) {
  char bytes[16];
  MemRegion r{bytes, sizeof bytes, {}};
  EXPECT_TRUE(r.contains(16, 0));
  EXPECT_FALSE(r.contains(1, SIZE_MAX));
  EXPECT_EQ(r.sub(4, 12).size, 12u);
  EXPECT_DEATH((void)r.sub(8, SIZE_MAX - 4), "outside a 16-byte region");
  EXPECT_DEATH((void)r.sub(17, 0), "outside a 16-byte region");
}

TEST(PeerText, ControlCharactersAreEscapedAndLengthCapped) {
  EXPECT_EQ(printable("plain text"), "plain text");
  EXPECT_EQ(printable(std::string_view("a\nb\x1b[31m\0\\", 10)), "a\\x0ab\\x1b[31m\\x00\\\\");
  EXPECT_EQ(printable("\xff\x80"), "\\xff\\x80");
  std::string longer(1000, 'x');
  EXPECT_EQ(printable(longer, 10), "xxxxxxxxxx... (990 more bytes)");
}

TEST(PeerText, LimiterLetsOneLinePerKindAndIntervalThroughAndCountsTheRest) {
  // An interval far longer than a loaded machine stalls the loop below, so none of it passes.
  LogLimiter lim(std::chrono::seconds(1));
  EXPECT_EQ(lim.admit("a"), 0);
  EXPECT_EQ(lim.admit("b"), 0);  // kinds are independent
  for (int i = 0; i < 100; ++i) EXPECT_EQ(lim.admit("a"), -1);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ(lim.admit("a"), 100);
  EXPECT_EQ(lim.admit("a"), -1);
  // Kinds beyond the cap share one slot: still bounded.
  for (size_t i = 0; i < 10 * LogLimiter::kMaxKinds; ++i) (void)lim.admit(std::to_string(i));
  EXPECT_LT(lim.admit("another"), 1);
}

}  // namespace
}  // namespace dmx
