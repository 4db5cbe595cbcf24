#include "tools/dmx/cli_hints.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string_view>

#include "core/config.h"

namespace dmx::cli {

namespace {

// "dmx bench": the names of the commands from the top (named "dmx", not by its argv[0]) down to `app`.
std::string path_of(CLI::App* app) {
  std::string path;
  for (; app->get_parent() != nullptr; app = app->get_parent()) path = " " + app->get_name() + path;
  return "dmx" + path;
}

// An option of `app` named by `word` ("--sizes", "-b"), or nullptr.
CLI::Option* find_option(CLI::App* app, std::string_view word) {
  for (CLI::Option* o : app->get_options()) {
    if (word.starts_with("--")) {
      const auto& names = o->get_lnames();
      if (std::find(names.begin(), names.end(), word.substr(2)) != names.end()) return o;
    } else if (word.size() >= 2) {
      const auto& names = o->get_snames();
      if (std::find(names.begin(), names.end(), word.substr(1, 1)) != names.end()) return o;
    }
  }
  return nullptr;
}

}  // namespace

std::vector<std::string> parse_hints(CLI::App& app, int argc, const char* const* argv) {
  std::vector<CLI::App*> chain{&app};  // the command and the subcommands named so far
  std::vector<std::string> hints;
  for (int i = 1; i < argc; ++i) {
    std::string_view word = argv[i];
    if (word == "--") break;
    if (word.size() > 1 && word[0] == '-') {
      std::string_view name = word.substr(0, word.find('='));
      CLI::Option* found = nullptr;
      for (auto it = chain.rbegin(); it != chain.rend() && found == nullptr; ++it) found = find_option(*it, name);
      if (found != nullptr) {
        bool inline_value = name.size() != word.size() || (!name.starts_with("--") && word.size() > 2);
        if (!inline_value && found->get_items_expected_min() > 0) ++i;  // its value
        continue;
      }
      std::vector<std::string> names;
      for (CLI::App* a : chain)
        for (CLI::Option* o : a->get_options()) {
          for (const auto& l : o->get_lnames()) names.push_back("--" + l);
          for (const auto& s : o->get_snames()) names.push_back("-" + s);
        }
      if (std::string best = nearest(name, names); !best.empty())
        hints.push_back(fmt::format("{}: no option {} (did you mean {}?)", path_of(chain.back()), name, best));
      continue;
    }
    CLI::App* cur = chain.back();
    std::vector<std::string> commands;
    CLI::App* next = nullptr;
    for (CLI::App* sub : cur->get_subcommands([](CLI::App*) { return true; })) {
      if (sub->check_name(std::string(word))) next = sub;
      commands.push_back(sub->get_name());
    }
    if (next != nullptr) {
      chain.push_back(next);
    } else if (!commands.empty()) {
      std::string best = nearest(word, commands);
      hints.push_back(best.empty() ? fmt::format("{}: no command {} (commands: {})", path_of(cur), word,
                                                 fmt::join(commands, ", "))
                                   : fmt::format("{}: no command {} (did you mean {}?)", path_of(cur), word, best));
      break;  // the words after belong to a command that is not known
    }
  }
  return hints;
}

}  // namespace dmx::cli
