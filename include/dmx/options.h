// dmx/options.h — configuration given through the API.
//
// Every setting is a row of one table (see `dmx probe --config` for names, defaults and help).
// Precedence, highest first: a value given here with set(), the DMX_<NAME> environment variable,
// a value given here with set_default() (a program's own default), the table's default.
#pragma once

#include <map>
#include <string>
#include <utility>

namespace dmx {

class Options {
 public:
  // `name` as in the table, e.g. "streams" (environment: DMX_STREAMS). Values are strings in the
  // same syntax as the environment ("8", "1M", "250ms", "true"); they are checked when a Context
  // is created. `source` names where the value came from in `dmx probe --config` and in errors
  // (the dmx tool says "flag --streams" for its flags).
  Options& set(const std::string& name, const std::string& value, const std::string& source = "option") {
    values_[name] = value;
    sources_[name] = source;
    return *this;
  }
  // A default of this program's own: used only where neither set() nor DMX_<NAME> gives a value
  // (the dmx tool logs warnings only unless told otherwise).
  Options& set_default(const std::string& name, const std::string& value, const std::string& source) {
    defaults_[name] = {value, source};
    return *this;
  }
  const std::map<std::string, std::string>& values() const { return values_; }
  std::string source(const std::string& name) const {
    auto it = sources_.find(name);
    return it == sources_.end() ? "option" : it->second;
  }
  // name -> {value, source}, as given to set_default.
  const std::map<std::string, std::pair<std::string, std::string>>& defaults() const { return defaults_; }

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::string> sources_;
  std::map<std::string, std::pair<std::string, std::string>> defaults_;
};

}  // namespace dmx
