// Generates token ids with a decoder that has a KV cache (a Llama- or GPT-2-style export, or its weight-only
// quantized copy from `ondine quantize --weights int4`), greedy or sampled, and prints the ids and tokens/s.
// Ids in, ids out: turn text into ids with a tokenizer package where one is installed (see docs/python.md).
//
//   ondine_generate MODEL.onnx [--prompt ID,ID,...|FILE.npy] [--tokens N] [--temperature T] [--top-k K]
//                   [--top-p P] [--seed S] [--threads N] [--expect FILE.npy]
//
// --expect: the tokens must equal that int64 array's (its first N), else exit 1.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "ondine/model.hpp"
#include "ondine/runtime/generate.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.onnx [--prompt ID,ID,...|FILE.npy] [--tokens N] [--temperature T] [--top-k K] "
                         "[--top-p P] [--seed S] [--threads N] [--expect FILE.npy]\n", argv[0]);
    return 2;
  }
  try {
    std::vector<std::int64_t> prompt{1, 8, 15, 22};
    ondine::GenerateOptions options;
    ondine::lower::CompileOptions compile;
    compile.threads = 2;
    std::string expect;
    for (int i = 2; i + 1 < argc; i += 2) {
      const std::string flag = argv[i], value = argv[i + 1];
      if (flag == "--prompt") {
        prompt.clear();
        if (value.size() > 4 && value.compare(value.size() - 4, 4, ".npy") == 0) {
          ondine::Tensor t = ondine::load_npy(value);
          for (std::int64_t k = 0; k < t.numel(); ++k) prompt.push_back(static_cast<std::int64_t>(t.at_double(static_cast<std::size_t>(k))));
        } else {
          std::stringstream ids(value);
          for (std::string id; std::getline(ids, id, ',');) prompt.push_back(std::stoll(id));
        }
      } else if (flag == "--tokens") options.max_new_tokens = std::stoll(value);
      else if (flag == "--temperature") options.temperature = std::stof(value);
      else if (flag == "--top-k") options.top_k = std::stoll(value);
      else if (flag == "--top-p") options.top_p = std::stof(value);
      else if (flag == "--seed") options.seed = std::stoull(value);
      else if (flag == "--threads") compile.threads = std::stoi(value);
      else if (flag == "--expect") expect = value;
      else throw ondine::Error("unknown option '" + flag + "'");
    }
    ondine::Model model = ondine::Model::compile(argv[1], compile);
    const ondine::DecoderSignature sig =
        ondine::decoder_signature(model.input_names(), model.input_shapes(), model.output_names());
    const ondine::GenerateResult r = ondine::generate(
        [&](const std::map<std::string, ondine::Tensor>& feeds) { return model.run(feeds); }, sig, prompt, options);
    std::printf("tokens:");
    for (std::int64_t t : r.tokens) std::printf(" %lld", static_cast<long long>(t));
    std::printf("\nprompt: %zu tokens in %.1f ms; then %.1f tokens/s over %zu steps\n", prompt.size(), r.prompt_s * 1e3,
                r.tokens_per_s(), r.step_s.size());
    if (expect.empty()) return 0;
    ondine::Tensor want = ondine::load_npy(expect);
    for (std::size_t i = 0; i < r.tokens.size(); ++i)
      if (static_cast<std::int64_t>(i) >= want.numel() || static_cast<std::int64_t>(want.at_double(i)) != r.tokens[i]) {
        std::fprintf(stderr, "token %zu differs from %s\n", i, expect.c_str());
        return 1;
      }
    std::printf("tokens equal %s\n", expect.c_str());
    return 0;
  } catch (const ondine::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
