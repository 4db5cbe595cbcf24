// The proofs both sides compare (engine/auth.h): what makes two differ, and the comparisons.
#include <gtest/gtest.h>

#include <cstddef>
#include <random>
#include <vector>

#include "engine/auth.h"

namespace dmx {
namespace {

std::vector<std::byte> random_bytes(size_t n, std::mt19937_64& rng) {
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

TEST(Auth, SameBytesComparesContentsAndSizes) {
  std::mt19937_64 rng(std::random_device{}());
  auto a = random_bytes(45, rng);
  auto b = a;
  EXPECT_TRUE(same_bytes(a, b));
  for (size_t i : {size_t{0}, size_t{20}, size_t{44}}) {
    auto c = a;
    c[i] ^= std::byte{1};
    EXPECT_FALSE(same_bytes(a, c)) << "byte " << i;
  }
  auto shorter = std::vector<std::byte>(a.begin(), a.end() - 1);
  EXPECT_FALSE(same_bytes(a, shorter));
  EXPECT_FALSE(same_bytes(shorter, a));
  EXPECT_TRUE(same_bytes({}, {}));
}

TEST(Auth, ProofsDifferByEveryInput) {
  std::mt19937_64 rng(std::random_device{}());
  AuthKey key;
  key.secret.resize(32);
  for (auto& c : key.secret) c = static_cast<unsigned char>(rng());
  wire::Nonce client{}, server{};
  for (auto& b : client) b = static_cast<unsigned char>(rng());
  for (auto& b : server) b = static_cast<unsigned char>(rng());
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
