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
constexpr std::string_view kNotSettings[] = {"DMX_BIN", "DMX_REAL_BIN", "DMX_TRACE_FILE",
                                              "DMX_RXE_GUEST"};  // set by scripts/rxe-vm.sh
constexpr std::string_view kNotSettingPrefixes[] = {"DMX_TEST_", "DMX_NETNS_"};

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

std::string nearest(std::string_view word, std::span<const std::string> candidates, size_t max_distance) {
  std::string best;
  size_t best_distance = max_distance + 1;
  for (const std::string& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_distance) best_distance = d, best = c;
  }
  return best;
}

std::string did_you_mean(std::string_view word, std::span<const std::string> candidates) {
  std::string best = nearest(word, candidates);
  return best.empty() ? std::string() : fmt::format(" (did you mean {}?)", best);
}

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
  std::vector<std::string> envs;
  for (const ConfigEntry& entry : config_table()) envs.push_back(env_name(entry.name));
  std::vector<UnknownEnv> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view var(*e);
    std::string_view name = var.substr(0, var.find('='));
    if (!name.starts_with("DMX_")) continue;
    if (std::find(std::begin(kNotSettings), std::end(kNotSettings), name) != std::end(kNotSettings)) continue;
    if (std::any_of(std::begin(kNotSettingPrefixes), std::end(kNotSettingPrefixes),
                    [&](std::string_view p) { return name.starts_with(p); }))
      continue;
    if (std::find(envs.begin(), envs.end(), name) != envs.end()) continue;
    out.push_back({printable(name, 64), nearest(name, envs)});  // the environment is not ours: no control bytes in logs
  }
  std::sort(out.begin(), out.end(), [](const UnknownEnv& a, const UnknownEnv& b) { return a.name < b.name; });
  return out;
}

namespace {

// The names a value of `e` may take, from its choices column ("a|b|c"); empty: any.
std::vector<std::string> choices_of(const ConfigEntry& e) {
  std::vector<std::string> out;
  std::string_view rest = e.choices;
  while (!rest.empty()) {
    size_t bar = rest.find('|');
    out.emplace_back(rest.substr(0, bar));
    rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
  }
  return out;
}

// An option name that is not a setting: the error names the nearest setting.
Status check_known(std::span<const ConfigEntry> table, const std::string& name, const std::string& source) {
  std::vector<std::string> names;
  for (const ConfigEntry& e : table) names.emplace_back(e.name);
  if (std::find(names.begin(), names.end(), name) != names.end()) return Status();
  return Status(Code::kInvalidArgument, fmt::format("unknown setting '{}' ({}){}; dmx probe --config lists them",
                                                    printable(name, 64), source, did_you_mean(name, names)));
}

}  // namespace

Result<Config> Config::resolve(const Options& options) {
  warn_unknown_env();
  auto table = config_table();
  for (const auto& [name, value] : options.values())
    DMX_RETURN_IF_ERROR(check_known(table, name, options.source(name)));
  for (const auto& [name, given] : options.defaults()) DMX_RETURN_IF_ERROR(check_known(table, name, given.second));
  Config config;
  for (const ConfigEntry& e : table) {
    // Lowest first: the table's default, a program's default, the environment, Options::set.
    Item item{&e, std::string(e.default_value), "default"};
    if (auto it = options.defaults().find(std::string(e.name)); it != options.defaults().end())
      item.value = it->second.first, item.source = it->second.second;
    std::string env = env_name(e.name);
    if (const char* v = std::getenv(env.c_str()); v != nullptr) {
      item.value = v;
      item.source = "env " + env;
    }
    if (auto it = options.values().find(std::string(e.name)); it != options.values().end()) {
      item.value = it->second;
      item.source = options.source(it->first);
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
        if (std::vector<std::string> choices = choices_of(e);
            !choices.empty() && std::find(choices.begin(), choices.end(), item.value) == choices.end())
          bad = Status(Code::kInvalidArgument, fmt::format("'{}' is not one of {}{}", printable(item.value, 64),
                                                           e.choices, did_you_mean(item.value, choices)));
        break;
    }
    if (!bad.ok())
      return Status(Code::kInvalidArgument, fmt::format("setting {} ({}): {}", e.name, item.source, bad.message()));
    config.items_.push_back(std::move(item));
    config.values_.push_back(value);
  }
  return config;
}

const std::string& Config::source(std::string_view name) const {
  size_t i = 0;
  while (i < items_.size() && items_[i].entry->name != name) ++i;
  assert(i < items_.size() && "config name not in the table");
  static const std::string kNone = "unknown";
  return i < items_.size() ? items_[i].source : kNone;
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
