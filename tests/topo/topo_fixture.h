// Loading the sysfs fixtures of tests/fixtures/topo.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "topo/topology.h"

namespace dmx::topo::testing {

inline std::string fixture_root(const std::string& name) {
  const char* base = std::getenv("DMX_TEST_FIXTURES");
  return std::string(base ? base : "tests/fixtures") + "/topo/" + name;
}

inline Topology load(const std::string& name) {
  auto t = discover(fixture_root(name));
  EXPECT_TRUE(t.ok()) << name << ": " << t.status().to_string();
  return t.ok() ? std::move(t).value() : Topology{};
}

// Device index by BDF; fails the test when absent.
inline int dev(const Topology& t, const char* bdf) {
  int i = t.find(bdf);
  EXPECT_GE(i, 0) << bdf << " not in " << t.root;
  return i;
}

}  // namespace dmx::topo::testing
