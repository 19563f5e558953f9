// A host program on the light header: it includes ondine/model.hpp only (the compiler is the library
// ondine::compiled, compiled once when Ondine was built), compiles an ONNX file or loads an artifact, runs it on
// .npy inputs and, with --expect, checks an output against a reference.
//
//   model_host MODEL.onnx|MODEL.ondine NAME=INPUT.npy [...] [--expect OUTPUT=EXPECTED.npy]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "ondine/model.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.onnx|MODEL.ondine NAME=INPUT.npy [...] [--expect OUTPUT=EXPECTED.npy]\n",
                 argv[0]);
    return 2;
  }
  try {
    const std::string path = argv[1];
    ondine::lower::CompileOptions options;
    options.threads = 2;
    const bool artifact = path.size() > 7 && path.compare(path.size() - 7, 7, ".ondine") == 0;
    ondine::Model model = artifact ? ondine::Model::load(path, options) : ondine::Model::compile(path, options);
    std::map<std::string, ondine::Tensor> inputs;
    std::string expect;
    for (int i = 2; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--expect" && i + 1 < argc) {
        expect = argv[++i];
        continue;
      }
      auto eq = arg.find('=');
      if (eq == std::string::npos) throw ondine::Error("expected NAME=FILE.npy, got '" + arg + "'");
      inputs[arg.substr(0, eq)] = ondine::load_npy(arg.substr(eq + 1));
    }
    auto outputs = model.run(inputs);
    for (auto& [name, t] : outputs) std::printf("%s: %s\n", name.c_str(), ondine::dims_str(t.dims()).c_str());
    if (expect.empty()) return 0;
    auto eq = expect.find('=');
    const ondine::Tensor& got = outputs.at(expect.substr(0, eq));
    ondine::Tensor want = ondine::load_npy(expect.substr(eq + 1));
    if (got.dims() != want.dims()) throw ondine::Error("--expect: dims differ");
    double err = 0, mag = 0;
    for (std::size_t k = 0; k < static_cast<std::size_t>(got.numel()); ++k) {
      err = std::max(err, std::fabs(got.at_double(k) - want.at_double(k)));
      mag = std::max(mag, std::fabs(want.at_double(k)));
    }
    std::printf("max |difference| %.3g of max |value| %.3g\n", err, mag);
    return err <= 1e-4 * std::max(mag, 1.0) ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_host: error: %s\n", e.what());
    return 1;
  }
}
