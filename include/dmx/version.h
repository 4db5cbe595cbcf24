// The library's version and how this copy of it was built: quote them in bug reports
// (`dmx --version` prints them).
#pragma once

namespace dmx {

struct BuildInfo {
  const char* version;       // "0.1.0"
  const char* git_revision;  // "7e3e339a1b2c", maybe " with uncommitted changes"; "unknown (...)" outside git
  const char* options;       // build type, compiler, CUDA (version, architectures) or why not, sanitizer
};

const BuildInfo& build_info();

}  // namespace dmx
