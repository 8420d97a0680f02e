// Runs a fuzz target once over every file under the given directories (or the
// given files), as a plain program: how builds without libFuzzer check the
// corpora, seeds and regression inputs alike. A directory with no file fails,
// so a corpus cannot go missing unnoticed. A crash or a failed check aborts.
//
//   fuzz_replay_route fuzz/corpus/route
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  size_t total = 0;
  for (int i = 1; i < argc; ++i) {
    std::vector<fs::path> files;
    std::error_code ec;
    if (fs::is_directory(argv[i], ec)) {
      for (const auto& e : fs::recursive_directory_iterator(argv[i], ec)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else if (fs::is_regular_file(argv[i], ec)) {
      files.push_back(argv[i]);
    }
    if (ec || files.empty()) {
      std::fprintf(stderr, "%s: no input files in %s\n", argv[0], argv[i]);
      return 1;
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (!in.good() && !in.eof()) {
        std::fprintf(stderr, "%s: cannot read %s\n", argv[0], f.c_str());
        return 1;
      }
      std::fprintf(stderr, "replay %s (%zu bytes)\n", f.c_str(), bytes.size());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++total;
    }
  }
  std::fprintf(stderr, "%s: %zu inputs ran\n", argv[0], total);
  return 0;
}
