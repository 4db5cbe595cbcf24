// "Did you mean" hints after a command line that did not parse: the nearest option or command to
// each word that names none, by the edit distance the DMX_* typo check uses (core/config.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace dmx::cli {

// One line per unknown option or command of argv that has a near name, e.g.
// "dmx bench: no option --size (did you mean --sizes?)". Changes nothing in `app`.
std::vector<std::string> parse_hints(CLI::App& app, int argc, const char* const* argv);

}  // namespace dmx::cli
