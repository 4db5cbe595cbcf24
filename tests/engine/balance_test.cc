// Striping over TCP streams: with no payload path, every stream pulls chunks while its pipeline
// has room, and none may hold more than one chunk beyond the least loaded
// (EndpointImpl::stream_load_), so the chunks of large messages spread over the streams rather
// than filling the pipeline of the one that happens to be turned first. Beside more than one
// data stream, stream 0 is the control stream and pulls none.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "engine/test_util.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;

// Three 16 MiB messages (16 chunks each) at once on 8 streams with pipelines 32 chunks deep: a
// stream that took all it had room for would carry one message or more alone (without the rule,
// one or two streams carried everything here). The bound holds whether stream 0 carries data or
// only control frames: no stream carries half of the bytes, and at least 4 carry a real share.
TEST(Balance, ChunksSpreadOverTheStreams) {
  constexpr int kStreams = 8, kMessages = 3;
  Pair p = connect_pair(test_options(kStreams).set("transport", "tcp").set("staging_slots", "32"));
  ASSERT_EQ(p.client.stats().transport, "tcp");
  std::vector<std::vector<unsigned char>> src, dst;
  std::vector<Request> recvs, sends;
  for (int i = 0; i < kMessages; ++i) {
    size_t n = (16u << 20) - 1 - static_cast<size_t>(i);  // odd sizes: the last chunk is short
    src.push_back(random_bytes(n));
    dst.emplace_back(n, 0xA5);
    recvs.push_back(p.server.recv(MemRegion{dst.back().data(), n, {}}, static_cast<uint64_t>(i)));
  }
  for (int i = 0; i < kMessages; ++i)
    sends.push_back(p.client.send(MemRegion{src[i].data(), src[i].size(), {}}, static_cast<uint64_t>(i)));
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(sends[i].wait(30s).ok()) << sends[i].status().to_string();
    ASSERT_TRUE(recvs[i].wait(30s).ok()) << recvs[i].status().to_string();
    ASSERT_EQ(src[i], dst[i]) << "message " << i;
  }

  std::vector<uint64_t> per = p.client.stats().stream_bytes_sent;
  ASSERT_GE(per.size(), static_cast<size_t>(kStreams));
  uint64_t total = std::accumulate(per.begin(), per.end(), uint64_t{0});
  uint64_t payload = 0;
  for (const auto& s : src) payload += s.size();
  ASSERT_GE(total, payload);
  uint64_t most = *std::max_element(per.begin(), per.end());
  // A real share: a quarter of what each of 8 streams would carry if all were equal.
  auto carrying = std::count_if(per.begin(), per.end(), [&](uint64_t b) { return b >= total / 32; });
  std::string shares;
  for (uint64_t b : per) shares += std::to_string(b * 100 / total) + "% ";
  std::printf("bytes per stream: %s\n", shares.c_str());
  EXPECT_LE(most, total / 2) << "one stream carried most of the bytes: " << shares;
  EXPECT_GE(carrying, 4) << "fewer than 4 streams carried a real share: " << shares;
}

// Beside more than one data stream, stream 0 carries control frames only: a rendezvous message's
// chunks all go on the data streams, and an eager one (no CTS to wait for) on stream 0. With one
// data stream, that stream is stream 0 and carries everything.
TEST(Balance, TheControlStreamCarriesNoChunks) {
  for (int streams : {1, 3}) {
    SCOPED_TRACE(streams);
    Pair p = connect_pair(test_options(streams).set("transport", "tcp"));
    EndpointStats st = p.client.stats();
    ASSERT_EQ(st.streams, streams == 1 ? 1u : static_cast<uint32_t>(streams) + 1) << "and a control stream";
    std::vector<unsigned char> big = random_bytes((4u << 20) + 3), small = random_bytes(100);
    std::vector<unsigned char> got_big(big.size(), 0xA5), got_small(small.size(), 0xA5);
    Request rb = p.server.recv(MemRegion{got_big.data(), got_big.size(), {}}, 1);
    Request rs = p.server.recv(MemRegion{got_small.data(), got_small.size(), {}}, 2);
    Request sb = p.client.send(MemRegion{big.data(), big.size(), {}}, 1);
    Request ss = p.client.send(MemRegion{small.data(), small.size(), {}}, 2);
    for (Request* r : {&sb, &ss, &rb, &rs}) ASSERT_TRUE(r->wait(30s).ok()) << r->status().to_string();
    ASSERT_EQ(big, got_big);
    ASSERT_EQ(small, got_small);
    std::vector<uint64_t> per = p.client.stats().stream_bytes_sent;
    ASSERT_EQ(per.size(), st.streams);
    uint64_t total = std::accumulate(per.begin(), per.end(), uint64_t{0});
    EXPECT_EQ(total, big.size() + small.size());
    if (streams == 1) EXPECT_EQ(per[0], total);
    else EXPECT_EQ(per[0], small.size()) << "stream 0 carried chunks of the rendezvous message";
  }
}

}  // namespace
}  // namespace dmx::test
