#include "core/config.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <set>

#include "core/log.h"
#include "core/units.h"

namespace dmx {

namespace {

// Variables of the DMX_ namespace that are not settings: tools' and scripts' own.
constexpr std::string_view kNotSettings[] = {"DMX_BIN", "DMX_REAL_BIN", "DMX_TRACE_FILE"};
constexpr std::string_view kNotSettingPrefixes[] = {"DMX_TEST_", "DMX_NETNS_"};

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Warns once per process for each unknown name: Context::create resolves the table every time.
void warn_unknown_env() {
  static std::mutex mu;
  static std::set<std::string> warned;
  for (const UnknownEnv& u : unknown_env_settings()) {
    std::lock_guard<std::mutex> lock(mu);
    if (warned.size() < 64 && warned.insert(u.name).second)
      DMX_LOG_WARN("environment variable {}; it is ignored", u.to_string());
  }
}

}  // namespace

std::string env_name(std::string_view name) {
  std::string out = "DMX_";
  for (char c : name) out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string shown_value(const ConfigEntry& entry, const std::string& value) {
  if (!entry.secret || value.empty()) return value;
  return "<set, redacted>";
}

std::string UnknownEnv::to_string() const {
  return suggestion.empty() ? fmt::format("{} is not a dmx setting", name)
                            : fmt::format("{} is not a dmx setting (did you mean {}?)", name, suggestion);
}

std::vector<UnknownEnv> unknown_env_settings() {
  auto table = config_table();
  std::vector<UnknownEnv> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view var(*e);
    std::string_view name = var.substr(0, var.find('='));
    if (!name.starts_with("DMX_")) continue;
    if (std::find(std::begin(kNotSettings), std::end(kNotSettings), name) != std::end(kNotSettings)) continue;
    if (std::any_of(std::begin(kNotSettingPrefixes), std::end(kNotSettingPrefixes),
                    [&](std::string_view p) { return name.starts_with(p); }))
      continue;
    std::string best;
    size_t best_distance = 3;  // suggest only a near name: a typo, not another word
    bool known = false;
    for (const ConfigEntry& entry : table) {
      std::string env = env_name(entry.name);
      if (env == name) known = true;
      size_t d = edit_distance(name, env);
      if (d < best_distance) best_distance = d, best = env;
    }
    if (known) continue;
    out.push_back({printable(name, 64), best});  // the environment is not ours: no control bytes in logs
  }
  std::sort(out.begin(), out.end(), [](const UnknownEnv& a, const UnknownEnv& b) { return a.name < b.name; });
  return out;
}

Result<Config> Config::resolve(const Options& options) {
  warn_unknown_env();
  auto table = config_table();
  for (const auto& [name, value] : options.values()) {
    // An init-capture: clang before 16 cannot capture a structured binding (the fuzz build).
    bool known = std::any_of(table.begin(), table.end(), [&n = name](const ConfigEntry& e) { return e.name == n; });
    if (!known) return Status(Code::kInvalidArgument, fmt::format("unknown option '{}' (see dmx probe --config)", name));
  }
  Config config;
  for (const ConfigEntry& e : table) {
    Item item{&e, std::string(e.default_value), "default"};
    std::string env = env_name(e.name);
    if (const char* v = std::getenv(env.c_str()); v != nullptr) {
      item.value = v;
      item.source = "env " + env;
    }
    if (auto it = options.values().find(std::string(e.name)); it != options.values().end()) {
      item.value = it->second;
      item.source = "option";
    }
    Value value;
    Status bad;
    switch (e.type) {
      case ConfigType::kBool: {
        auto r = parse_bool(item.value);
        if (r.ok()) value.b = *r; else bad = r.status();
        break;
      }
      case ConfigType::kInt: {
        auto r = parse_int(item.value);
        if (r.ok()) value.i = *r; else bad = r.status();
        break;
      }
      case ConfigType::kSize: {
        auto r = parse_size(item.value);
        if (r.ok()) value.size = *r; else bad = r.status();
        break;
      }
      case ConfigType::kDuration: {
        auto r = parse_duration(item.value);
        if (r.ok()) value.duration = *r; else bad = r.status();
        break;
      }
      case ConfigType::kString:
        if (!e.choices.empty()) {
          std::string_view rest = e.choices;
          bool found = false;
          while (!rest.empty()) {
            size_t bar = rest.find('|');
            if (rest.substr(0, bar) == item.value) found = true;
            rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
          }
          if (!found) bad = Status(Code::kInvalidArgument, fmt::format("must be one of {}", e.choices));
        }
        break;
    }
    if (!bad.ok())
      return Status(Code::kInvalidArgument, fmt::format("setting {} ({}): {}", e.name, item.source, bad.message()));
    config.items_.push_back(std::move(item));
    config.values_.push_back(value);
  }
  return config;
}

const Config::Item& Config::item(std::string_view name, ConfigType type, size_t* index) const {
  for (size_t i = 0; i < items_.size(); ++i) {
    if (items_[i].entry->name == name) {
      assert(items_[i].entry->type == type && "config getter of the wrong type");
      *index = i;
      return items_[i];
    }
  }
  assert(false && "config name not in the table");
  std::abort();
}

bool Config::get_bool(std::string_view name) const {
  size_t i;
  item(name, ConfigType::kBool, &i);
  return values_[i].b;
}
int64_t Config::get_int(std::string_view name) const {
  size_t i;
  item(name, ConfigType::kInt, &i);
  return values_[i].i;
}
uint64_t Config::get_size(std::string_view name) const {
  size_t i;
  item(name, ConfigType::kSize, &i);
  return values_[i].size;
}
std::chrono::microseconds Config::get_duration(std::string_view name) const {
  size_t i;
  item(name, ConfigType::kDuration, &i);
  return values_[i].duration;
}
const std::string& Config::get_string(std::string_view name) const {
  size_t i;
  return item(name, ConfigType::kString, &i).value;
}

}  // namespace dmx
