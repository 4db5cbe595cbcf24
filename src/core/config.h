// The configuration table: every tunable of dmx is one row (name, type, default, help).
//
// Values resolve as: Options::set (the dmx tool's flags, then its --option) > environment
// DMX_<NAME upper-cased> > Options::set_default (a program's own default) > the table's default.
// All values are parsed and checked once, in Config::resolve; getters then cannot fail (asking for a name that is
// not in the table is a bug and asserts). Config is immutable after resolve and safe to share.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dmx/options.h"
#include "dmx/status.h"

namespace dmx {

enum class ConfigType { kBool, kInt, kSize, kDuration, kString };

struct ConfigEntry {
  std::string_view name;           // "streams"; environment DMX_STREAMS
  ConfigType type;
  std::string_view default_value;  // in the same syntax as the environment
  std::string_view help;
  std::string_view choices = {};   // for strings: "a|b|c" when only those are allowed
  bool secret = false;             // never printed: `dmx probe --config` shows whether it is set
};

// The value to show for an item: a secret's is "<set, redacted>" (or "" when unset).
std::string shown_value(const ConfigEntry& entry, const std::string& value);

std::span<const ConfigEntry> config_table();
std::string env_name(std::string_view name);  // "streams" -> "DMX_STREAMS"

// "Did you mean" hints, for settings and for the dmx tool's options and commands: the Levenshtein
// distance, and the candidate nearest to `word` when it is at most `max_distance` edits away (a
// typo, not another word), else empty.
size_t edit_distance(std::string_view a, std::string_view b);
std::string nearest(std::string_view word, std::span<const std::string> candidates, size_t max_distance = 2);
// " (did you mean X?)" for the nearest candidate, or "".
std::string did_you_mean(std::string_view word, std::span<const std::string> candidates);

// A DMX_* variable in this process's environment that names no setting: a typo such as DMX_STREEMS
// would otherwise be ignored without a word. Names the project's own scripts and tests use
// (DMX_BIN, DMX_TRACE_FILE, DMX_TEST_*, DMX_NETNS_*) are not settings and are not reported.
struct UnknownEnv {
  std::string name;        // escaped for printing
  std::string suggestion;  // the setting's variable a typo most likely meant, or empty
  std::string to_string() const;  // "DMX_STREEMS is not a dmx setting (did you mean DMX_STREAMS?)"
};
std::vector<UnknownEnv> unknown_env_settings();

class Config {
 public:
  struct Item {
    const ConfigEntry* entry;
    std::string value;   // as given
    std::string source;  // "default", "env DMX_STREAMS", "option", or as given to Options
  };

  // Resolves every row; the first bad value or unknown option name is an error naming the setting,
  // where its value came from, the value, and what is allowed (or the nearest name). Unknown DMX_*
  // variables are logged as a warning, once per name per process.
  static Result<Config> resolve(const Options& options = {});

  bool get_bool(std::string_view name) const;
  int64_t get_int(std::string_view name) const;
  uint64_t get_size(std::string_view name) const;
  std::chrono::microseconds get_duration(std::string_view name) const;
  const std::string& get_string(std::string_view name) const;

  const std::vector<Item>& items() const { return items_; }
  // Where a setting's value came from ("default", "env DMX_TRANSPORT", "flag --transport", ...).
  const std::string& source(std::string_view name) const;

 private:
  struct Value {
    bool b = false;
    int64_t i = 0;
    uint64_t size = 0;
    std::chrono::microseconds duration{0};
  };
  const Item& item(std::string_view name, ConfigType type, size_t* index) const;

  std::vector<Item> items_;
  std::vector<Value> values_;
};

}  // namespace dmx
