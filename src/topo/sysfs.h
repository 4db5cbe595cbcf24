// A sysfs tree under a configurable root: "/sys" on a live machine, or a captured copy
// (`dmx topo --capture DIR`) anywhere else. Discovery reads everything through this class, so
// tests replay captured and hand-made trees and the capture copies exactly what was read.
//
// Paths given to the methods are relative to the root ("bus/pci/devices"). Symbolic links are
// resolved inside the root: a link that leads outside it is an error, never followed.
// Thread-safety: const methods may record what they read; use one SysfsTree per thread.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "dmx/status.h"

namespace dmx::topo {

class SysfsTree {
 public:
  explicit SysfsTree(std::string root);

  const std::string& root() const { return root_; }
  std::string full(std::string_view rel) const;  // root + "/" + rel

  // Whole file as text with trailing whitespace removed. kNotFound when absent; kIo otherwise
  // (the message names the file and errno).
  Result<std::string> read(std::string_view rel) const;
  // Up to `max` raw bytes (config space).
  Result<std::string> read_bytes(std::string_view rel, size_t max) const;
  // The text of a symbolic link (not resolved).
  Result<std::string> read_link(std::string_view rel) const;
  // The canonical path of `rel` relative to the root, links followed. Error when it leaves the root.
  Result<std::string> resolve(std::string_view rel) const;
  // Entry names of a directory, sorted; empty when absent or unreadable.
  std::vector<std::string> list(std::string_view rel) const;
  bool exists(std::string_view rel) const;
  bool is_real_dir(std::string_view rel) const;  // a directory and not a link to one

  // Recording: every path read, resolved link and listed directory is remembered (relative).
  void set_recording(bool on) { recording_ = on; }
  const std::set<std::string>& recorded() const { return recorded_; }

 private:
  void note(std::string_view rel) const;
  std::string root_;
  std::string canonical_root_;
  bool recording_ = false;
  mutable std::set<std::string> recorded_;
};

// Copies every recorded path of `tree` (files, links as links, listed directories) into `dest`,
// creating it. Links are recreated with their original relative text so the copy replays.
Status capture_tree(const SysfsTree& tree, const std::string& dest);

}  // namespace dmx::topo
