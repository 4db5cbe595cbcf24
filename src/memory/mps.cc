#include "memory/mps.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string>

namespace dmx {

Result<std::string> cuda_mps_daemon() {
  const char* dir = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  std::string control = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp/nvidia-mps") + "/control";
  struct stat st;
  if (::stat(control.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return control;
  return Status(Code::kUnavailable, fmt::format("no CUDA MPS control daemon ({} is not a socket)", control));
}

}  // namespace dmx
