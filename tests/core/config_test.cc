#include <gtest/gtest.h>
#include <stdlib.h>

#include "core/config.h"

namespace dmx {
namespace {

TEST(Config, DefaultsEnvAndOptions) {
  unsetenv("DMX_STREAMS");
  auto c = Config::resolve();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->get_int("streams"), 8);
  EXPECT_EQ(c->get_size("chunk_size"), 1u << 20);

  setenv("DMX_STREAMS", "7", 1);
  c = Config::resolve();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->get_int("streams"), 7);

  c = Config::resolve(Options().set("streams", "3"));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->get_int("streams"), 3);  // options win over the environment
  bool found = false;
  for (const auto& item : c->items())
    if (item.entry->name == "streams") {
      EXPECT_EQ(item.source, "option");
      found = true;
    }
  EXPECT_TRUE(found);
  unsetenv("DMX_STREAMS");
}

TEST(Config, BadValuesNameTheSetting) {
  setenv("DMX_CHUNK_SIZE", "lots", 1);
  auto c = Config::resolve();
  unsetenv("DMX_CHUNK_SIZE");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("chunk_size"), std::string::npos);
  EXPECT_NE(c.status().message().find("env DMX_CHUNK_SIZE"), std::string::npos);

  c = Config::resolve(Options().set("no_such_thing", "1"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("no_such_thing"), std::string::npos);

  c = Config::resolve(Options().set("transport", "carrier-pigeon"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("auto|tcp"), std::string::npos);
}

TEST(Config, EveryDefaultParses) {
  // A row whose default does not parse would make every Context fail; catch it here.
  for (const auto& e : config_table()) EXPECT_FALSE(e.help.empty()) << e.name;
  EXPECT_TRUE(Config::resolve().ok());
}

}  // namespace
}  // namespace dmx
