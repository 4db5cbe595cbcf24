// A main for a fuzz target built without libFuzzer: runs the target once on every file named on
// the command line (a directory: every file in it), so that the ordinary test suite replays the
// committed corpus through each harness. A harness that disagrees with the code it checks (a new
// frame type it does not know) aborts here, with any compiler, before the fuzz lane runs.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int replay(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.eof() && in.fail()) {
    std::fprintf(stderr, "replay: cannot read %s\n", file.c_str());
    return 1;
  }
  std::fprintf(stderr, "replay: %s (%zu bytes)\n", file.c_str(), bytes.size());
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int files = 0;
  for (int i = 1; i < argc; ++i) {
    std::filesystem::path p(argv[i]);
    std::vector<std::filesystem::path> list;
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::directory_iterator(p)) list.push_back(e.path());
    } else {
      list.push_back(p);
    }
    for (const auto& f : list) {
      if (replay(f) != 0) return 1;
      ++files;
    }
  }
  if (files == 0) {
    std::fprintf(stderr, "replay: no input files\n");
    return 1;
  }
  std::printf("replay: %d inputs, none failed\n", files);
  return 0;
}
