// fuzz/replay_main.hpp - the plain main() of a fuzz target, for builds without libFuzzer (g++).
//
// Each argument is a file or a folder of files; every file is passed once to LLVMFuzzerTestOneInput, as
// libFuzzer does when given files instead of a corpus to grow. CTest runs it over fuzz/corpus/<target>/
// and fuzz/regressions/<target>/: a crash, a sanitizer report or an exception that is not an
// ondine::Error fails the test. With -fsanitize=fuzzer, libFuzzer supplies main and this is left out.
#pragma once

#ifndef ONDINE_LIBFUZZER

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    fs::path p(argv[i]);
    if (fs::is_directory(p)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "replay: no such file or folder: %s\n", argv[i]);
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replay: %s (%zu bytes)\n", f.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  }
  std::fprintf(stderr, "replay: %zu inputs, no crash\n", files.size());
  return files.empty() ? 1 : 0;
}

#endif  // ONDINE_LIBFUZZER
