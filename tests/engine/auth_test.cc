// The proofs both sides compare (engine/auth.h): what makes two differ, and the comparisons.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "engine/auth.h"
#include "engine/test_util.h"

namespace dmx {
namespace {

using test::random_bytes;

std::span<const std::byte> bytes(const std::vector<unsigned char>& v) { return std::as_bytes(std::span(v)); }

TEST(Auth, SameBytesComparesContentsAndSizes) {
  auto a = random_bytes(45);
  auto b = a;
  EXPECT_TRUE(same_bytes(bytes(a), bytes(b)));
  for (size_t i : {size_t{0}, size_t{20}, size_t{44}}) {
    auto c = a;
    c[i] ^= 1;
    EXPECT_FALSE(same_bytes(bytes(a), bytes(c))) << "byte " << i;
  }
  auto shorter = std::vector<unsigned char>(a.begin(), a.end() - 1);
  EXPECT_FALSE(same_bytes(bytes(a), bytes(shorter)));
  EXPECT_FALSE(same_bytes(bytes(shorter), bytes(a)));
  EXPECT_TRUE(same_bytes({}, {}));
}

TEST(Auth, ProofsDifferByEveryInput) {
  AuthKey key;
  auto secret = random_bytes(32);
  key.secret.assign(secret.begin(), secret.end());
  wire::Nonce client{}, server{};
  auto nonces = random_bytes(client.size() + server.size());
  std::copy_n(nonces.begin(), client.size(), client.begin());
  std::copy_n(nonces.begin() + client.size(), server.size(), server.begin());
  const wire::Proof base = make_proof(key, "dmx1 client proof", client, server, 7, 0);
  EXPECT_TRUE(proofs_equal(base, make_proof(key, "dmx1 client proof", client, server, 7, 0)));
  EXPECT_FALSE(proofs_equal(base, make_proof(key, "dmx1 server proof", client, server, 7, 0)));
  EXPECT_FALSE(proofs_equal(base, make_proof(key, "dmx1 client proof", server, client, 7, 0)));
  EXPECT_FALSE(proofs_equal(base, make_proof(key, "dmx1 client proof", client, server, 8, 0)));
  EXPECT_FALSE(proofs_equal(base, make_proof(key, "dmx1 client proof", client, server, 7, 1)));
  AuthKey other = key;
  other.secret[0] ^= 1;
  EXPECT_FALSE(proofs_equal(base, make_proof(other, "dmx1 client proof", client, server, 7, 0)));
}

}  // namespace
}  // namespace dmx
