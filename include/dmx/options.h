// dmx/options.h — configuration given through the API.
//
// Every setting is a row of one table (see `dmx probe --config` for names, defaults and help).
// A value given here wins over the DMX_<NAME> environment variable, which wins over the default.
#pragma once

#include <map>
#include <string>

namespace dmx {

class Options {
 public:
  // `name` as in the table, e.g. "streams" (environment: DMX_STREAMS). Values are strings in the
  // same syntax as the environment ("8", "1M", "250ms", "true"); they are checked when a Context
  // is created.
  Options& set(const std::string& name, const std::string& value) {
    values_[name] = value;
    return *this;
  }
  const std::map<std::string, std::string>& values() const { return values_; }

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace dmx
