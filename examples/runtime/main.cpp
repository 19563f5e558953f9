// A host program built against ondine/runtime.hpp only: it loads a compiled artifact and runs it on .npy
// inputs, with oneDNN and no ONNX or protobuf (ondine::runtime; tests/runtime_test.sh builds and runs it).
//
//   runtime_host MODEL.ondine NAME=INPUT.npy [...] OUT_DIR
#include <cstdio>
#include <string>

#include "ondine/runtime.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL.ondine NAME=INPUT.npy [...] OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    std::map<std::string, ondine::Tensor> inputs;
    for (int i = 2; i + 1 < argc; ++i) {
      std::string spec = argv[i];
      auto eq = spec.find('=');
      if (eq == std::string::npos) throw ondine::Error("expected NAME=FILE.npy, got '" + spec + "'");
      inputs[spec.substr(0, eq)] = ondine::load_npy(spec.substr(eq + 1));
    }
    ondine::lower::CompileOptions options;
    options.threads = 1;
    ondine::Model model = ondine::Model::load(argv[1], options);  // checked for this CPU, mapped
    for (auto& [name, t] : model.run(inputs)) {
      std::string safe = name;
      for (char& c : safe)
        if (c == '/' || c == '\\' || c == ':') c = '_';
      ondine::save_npy(t, std::string(argv[argc - 1]) + "/" + safe + ".npy");
      std::printf("%s: %s\n", name.c_str(), ondine::dims_str(t.dims()).c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "runtime_host: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
