// The metrics port's request head parser (tools/dmx/metrics_request.h): what is served, what is
// refused and with which status, and that a verdict waits for nothing it does not need.
#include "tools/dmx/metrics_request.h"

#include <gtest/gtest.h>

#include <string>

namespace dmx::cli {
namespace {

using Verdict = RequestHead::Verdict;

TEST(MetricsRequest, ServesGetAndHeadOfMetrics) {
  std::string get = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nAccept: */*\r\n\r\n";
  RequestHead r = parse_request_head(get + "trailing bytes");
  EXPECT_EQ(r.verdict, Verdict::kServe);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.length, get.size());
  EXPECT_FALSE(r.head_only);
  r = parse_request_head("HEAD /metrics?name=x HTTP/1.0\n\n");
  EXPECT_EQ(r.verdict, Verdict::kServe);
  EXPECT_TRUE(r.head_only);
  EXPECT_EQ(parse_request_head("GET /metrics HTTP/1.1\r\nContent-Length: 000\r\n\r\n").verdict, Verdict::kServe);
}

TEST(MetricsRequest, WaitsForTheBlankLine) {
  std::string get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  for (size_t n = 0; n + 1 < get.size(); ++n)
    EXPECT_EQ(parse_request_head(get.substr(0, n)).verdict, Verdict::kNeedMore) << n;
}

TEST(MetricsRequest, RefusesWithTheRightStatus) {
  struct Case {
    const char* head;
    int status;
  } cases[] = {
      {"GET /metrics HTTP/1.1\r\nContent-Length: 104857600\r\n\r\n", 413},
      {"GET /metrics HTTP/1.1\r\ncontent-length: 1\r\n", 413},  // refused before the head ends
      {"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 413},
      {"GET /metrics HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
      {"GET /metrics HTTP/1.1\r\nContent-Length: 18446744073709551617\r\n\r\n", 413},
      {"POST /metrics HTTP/1.1\r\n", 405},
      {"GET / HTTP/1.1\r\n", 404},
      {"GET /metricsx HTTP/1.1\r\n", 404},
      {"GET /metrics HTTP/2.0\r\n", 505},
      {"GET /metrics HTTP/1.1 \r\n", 400},
      {"GET  /metrics HTTP/1.1\r\n", 400},
      {"GET /metrics\r\n", 400},
      {"\r\n", 400},
      {"GET /metrics HTTP/1.1\r\n folded\r\n", 400},
      {"GET /metrics HTTP/1.1\r\nName : value\r\n", 400},
      {"GET /metrics HTTP/1.1\r\nX: a\x01"
       "b\r\n",
       400},
      {"GET /metrics HTTP/1.1\rX: 1\r\n", 400},
  };
  for (const auto& c : cases) {
    RequestHead r = parse_request_head(c.head);
    EXPECT_EQ(r.verdict, Verdict::kRefuse) << c.head;
    EXPECT_EQ(r.status, c.status) << c.head;
    EXPECT_FALSE(r.reason.empty()) << c.head;
  }
}

TEST(MetricsRequest, IgnoresRange) {
  std::string ranges = "bytes=0-";
  for (int i = 0; i < 1000; ++i) ranges += ",0-";
  RequestHead r = parse_request_head("GET /metrics HTTP/1.1\r\nRange: " + ranges + "\r\n\r\n");
  EXPECT_EQ(r.verdict, Verdict::kServe);
}

TEST(MetricsRequest, BoundsTheHead) {
  std::string big = "GET /metrics HTTP/1.1\r\nX: " + std::string(kMaxRequestHead, 'a');
  RequestHead r = parse_request_head(big.substr(0, kMaxRequestHead - 1));
  EXPECT_EQ(r.verdict, Verdict::kNeedMore);
  r = parse_request_head(big.substr(0, kMaxRequestHead));
  EXPECT_EQ(r.verdict, Verdict::kRefuse);
  EXPECT_EQ(r.status, 431);
  // A head of exactly kMaxRequestHead bytes is served.
  std::string head = "GET /metrics HTTP/1.1\r\nX: ";
  head += std::string(kMaxRequestHead - head.size() - 4, 'a') + "\r\n\r\n";
  ASSERT_EQ(head.size(), kMaxRequestHead);
  EXPECT_EQ(parse_request_head(head + "more").verdict, Verdict::kServe);
  std::string many = "GET /metrics HTTP/1.1\r\n";
  for (size_t i = 0; i < kMaxRequestHeaders; ++i) many += "X: y\r\n";
  EXPECT_EQ(parse_request_head(many + "\r\n").verdict, Verdict::kServe);
  r = parse_request_head(many + "X: y\r\n");
  EXPECT_EQ(r.status, 431);
}

}  // namespace
}  // namespace dmx::cli
