#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <string>
#include <vector>

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

TEST(Config, UnknownEnvironmentVariablesAreFoundWithTheNearestSetting) {
  size_t already = unknown_env_settings().size();  // whatever the caller's environment holds
  setenv("DMX_STREEMS", "4", 1);              // a typo of DMX_STREAMS
  setenv("DMX_COMPLETELY_DIFFERENT", "1", 1);  // nothing near
  setenv("DMX_\x1b[31mRED", "1", 1);          // escapes must not reach a terminal
  setenv("DMX_TEST_SOMETHING", "1", 1);        // the tests' own
  setenv("DMX_BIN", "/bin/true", 1);           // the scripts' own
  setenv("DMX_RXE_GUEST", "1", 1);             // scripts/rxe-vm.sh's guest
  setenv("DMX_CHUNK_SIZE", "1M", 1);           // a setting
  auto unknown = unknown_env_settings();
  std::map<std::string, std::string> found;
  for (const auto& u : unknown) found[u.name] = u.suggestion;
  EXPECT_EQ(found.size(), already + 3);
  EXPECT_EQ(found["DMX_STREEMS"], "DMX_STREAMS");
  EXPECT_EQ(found["DMX_COMPLETELY_DIFFERENT"], "");
  EXPECT_EQ(found.count("DMX_\\x1b[31mRED"), 1u) << "the name is escaped";
  for (const auto& u : unknown) {
    if (u.name == "DMX_STREEMS") {
      EXPECT_EQ(u.to_string(), "DMX_STREEMS is not a dmx setting (did you mean DMX_STREAMS?)");
    }
  }
  EXPECT_TRUE(Config::resolve().ok()) << "unknown variables are reported, not fatal";
  for (const char* v : {"DMX_STREEMS", "DMX_COMPLETELY_DIFFERENT", "DMX_\x1b[31mRED", "DMX_TEST_SOMETHING", "DMX_BIN",
                        "DMX_RXE_GUEST", "DMX_CHUNK_SIZE"})
    unsetenv(v);
  EXPECT_EQ(unknown_env_settings().size(), already);
}

// set() > DMX_<NAME> > set_default() > the table: a program's own default never hides the
// environment, and each value says where it came from.
TEST(Config, ProgramDefaultsSitBelowTheEnvironment) {
  unsetenv("DMX_STREAMS");
  Options o;
  o.set_default("streams", "3", "test default");
  auto c = Config::resolve(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->get_int("streams"), 3);
  EXPECT_EQ(c->source("streams"), "test default");
  EXPECT_EQ(c->source("chunk_size"), "default");
  setenv("DMX_STREAMS", "5", 1);
  c = Config::resolve(o);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->get_int("streams"), 5);
  EXPECT_EQ(c->source("streams"), "env DMX_STREAMS");
  o.set("streams", "6", "flag --streams");
  c = Config::resolve(o);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->get_int("streams"), 6);
  EXPECT_EQ(c->source("streams"), "flag --streams");
  unsetenv("DMX_STREAMS");
}

TEST(Config, ChoicesErrorsNameTheValueAndTheNearest) {
  setenv("DMX_CHECKSUM", "crc32", 1);
  auto c = Config::resolve();
  unsetenv("DMX_CHECKSUM");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "setting checksum (env DMX_CHECKSUM): 'crc32' is not one of none|crc32c (did you mean crc32c?)");
  c = Config::resolve(Options().set("chunk_sise", "1M"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("(did you mean chunk_size?)"), std::string::npos) << c.status().message();
  std::vector<std::string> words{"bench", "probe", "topo"};
  EXPECT_EQ(nearest("bnech", words), "bench");
  EXPECT_EQ(nearest("xyzzy", words), "");
  EXPECT_EQ(edit_distance("tpc", "tcp"), 2u);
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
}

TEST(Config, EveryDefaultParses) {
  // A row whose default does not parse would make every Context fail; catch it here.
  for (const auto& e : config_table()) EXPECT_FALSE(e.help.empty()) << e.name;
  EXPECT_TRUE(Config::resolve().ok());
}

}  // namespace
}  // namespace dmx
