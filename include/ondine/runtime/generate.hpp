// SPDX-License-Identifier: Apache-2.0
// ondine/runtime/generate.hpp - a text generation loop over a decoder with a KV cache: token ids in, token ids
// out (no tokenizer), greedy or sampled, with its timings.
//
//   ondine::Model m = ondine::Model::compile("decoder.onnx");
//   auto sig = ondine::decoder_signature(m.input_names(), m.input_shapes(), m.output_names());
//   ondine::GenerateResult r = ondine::generate([&](const auto& feeds) { return m.run(feeds); }, sig, prompt, {});
//
// The decoder is the form exporters write (Hugging Face Optimum, and this repository's corpus): input_ids
// [1, seq], optional attention_mask [1, past + seq] and position_ids [1, seq], pasts named past_key_values.i.key
// (or past_key_0) fed by the outputs present.i.key (present_key_0), and `logits` [1, seq, vocab]. The prompt
// runs with empty pasts; each step feeds the token chosen from the last logits row, the mask of ones, the
// positions past .. past + seq - 1 and the previous step's presents. Sampling: temperature 0 is greedy
// (argmax, the lowest id on ties); otherwise softmax(logits / temperature) restricted to the top_k ids
// (0: all) and to the smallest set whose probability reaches top_p, drawn with a seeded std::mt19937_64.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/tensor.hpp"

namespace ondine {

struct DecoderSignature {
  std::string ids = "input_ids", mask, positions, logits = "logits";
  std::vector<std::pair<std::string, std::string>> kv;  // past input <- present output
  std::map<std::string, std::vector<std::int64_t>> empty_past;  // [1, heads, 0, head_dim] per past
};

struct GenerateOptions {
  std::int64_t max_new_tokens = 32;
  float temperature = 0.0f;  // 0: greedy
  std::int64_t top_k = 0;    // 0: every id
  float top_p = 1.0f;
  std::uint64_t seed = 0;
  std::optional<std::int64_t> eos_token_id;  // stop after emitting it
  std::function<bool(std::int64_t token)> on_token;  // called per new token; false stops
};

struct GenerateResult {
  std::vector<std::int64_t> tokens;  // the new tokens only
  double prompt_s = 0;               // the prompt's run (its first token's latency)
  std::vector<double> step_s;        // each later run
  double tokens_per_s() const {
    double total = std::accumulate(step_s.begin(), step_s.end(), 0.0);
    return total > 0 ? static_cast<double>(step_s.size()) / total : 0.0;
  }
};

namespace detail::generate {

// "[batch, 2, past, 16]" -> {-1, 2, -1, 16}.
inline std::vector<std::int64_t> dims_from_text(const std::string& text) {
  std::vector<std::int64_t> dims;
  std::string item;
  auto flush = [&] {
    const auto b = item.find_first_not_of(' '), e = item.find_last_not_of(' ');
    const std::string t = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    if (!t.empty()) dims.push_back(std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; }) ? std::stoll(t) : -1);
    item.clear();
  };
  for (char c : text) {
    if (c == '[' || c == ']') continue;
    if (c == ',') flush();
    else item += c;
  }
  flush();
  return dims;
}

inline std::int64_t pick(const float* logits, std::int64_t vocab, const GenerateOptions& o, std::mt19937_64& rng) {
  if (o.temperature <= 0.0f) return std::max_element(logits, logits + vocab) - logits;
  std::vector<std::int64_t> ids(static_cast<std::size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const std::int64_t k = o.top_k > 0 ? std::min(o.top_k, vocab) : vocab;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](std::int64_t a, std::int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  ids.resize(static_cast<std::size_t>(k));
  std::vector<double> p(ids.size());
  const double top = logits[ids[0]];
  double sum = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) sum += p[i] = std::exp((logits[ids[i]] - top) / o.temperature);
  double mass = 0;
  std::size_t keep = ids.size();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    mass += p[i] / sum;
    if (mass >= o.top_p) {
      keep = i + 1;
      break;
    }
  }
  std::discrete_distribution<std::size_t> draw(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(keep));
  return ids[draw(rng)];
}

}  // namespace detail::generate

// The decoder's inputs and outputs by the naming rules above; an Error naming what is missing otherwise.
inline DecoderSignature decoder_signature(const std::vector<std::string>& inputs, const std::vector<std::string>& input_shapes,
                                          const std::vector<std::string>& outputs) {
  DecoderSignature s;
  auto has_output = [&](const std::string& n) { return std::find(outputs.begin(), outputs.end(), n) != outputs.end(); };
  bool ids = false;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string& n = inputs[i];
    if (n == "input_ids") ids = true;
    else if (n == "attention_mask") s.mask = n;
    else if (n == "position_ids") s.positions = n;
    else {
      std::string present;
      if (n.rfind("past_key_values.", 0) == 0) present = "present." + n.substr(16);
      else if (n.rfind("past_", 0) == 0) present = "present_" + n.substr(5);
      else throw Error("generate: the decoder's input '" + n + "' is none of input_ids, attention_mask, position_ids, past_*");
      if (!has_output(present)) throw Error("generate: the past input '" + n + "' has no output '" + present + "' to feed it");
      std::vector<std::int64_t> dims = detail::generate::dims_from_text(i < input_shapes.size() ? input_shapes[i] : "");
      if (dims.size() != 4 || dims[1] < 0 || dims[3] < 0)
        throw Error("generate: the past input '" + n + "' should be [batch, heads, past, head_dim] with static heads and "
                    "head_dim, not " + (i < input_shapes.size() ? input_shapes[i] : std::string("unknown")));
      dims[0] = 1;
      dims[2] = 0;
      s.kv.emplace_back(n, present);
      s.empty_past[n] = dims;
    }
  }
  if (!ids) throw Error("generate: the decoder has no input 'input_ids'");
  if (!has_output("logits")) throw Error("generate: the decoder has no output 'logits'");
  return s;
}

// Runs the loop above; `run` maps a feed to the decoder's outputs (Model::run, or any callable).
template <typename Run>
GenerateResult generate(Run&& run, const DecoderSignature& sig, const std::vector<std::int64_t>& prompt,
                        const GenerateOptions& o) {
  using clock = std::chrono::steady_clock;
  if (prompt.empty()) throw Error("generate: the prompt is empty");
  if (o.max_new_tokens < 0) throw Error("generate: max_new_tokens must be >= 0");
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f)) throw Error("generate: top_p must be in (0, 1]");
  GenerateResult r;
  std::mt19937_64 rng(o.seed);
  std::map<std::string, Tensor> feeds;
  auto set_step = [&](const std::vector<std::int64_t>& ids, std::int64_t past) {
    const auto seq = static_cast<std::int64_t>(ids.size());
    feeds[sig.ids] = Tensor::from_vector<std::int64_t>({1, seq}, ids);
    if (!sig.mask.empty()) feeds[sig.mask] = Tensor::from_vector<std::int64_t>({1, past + seq}, std::vector<std::int64_t>(static_cast<std::size_t>(past + seq), 1));
    if (!sig.positions.empty()) {
      std::vector<std::int64_t> pos(static_cast<std::size_t>(seq));
      std::iota(pos.begin(), pos.end(), past);
      feeds[sig.positions] = Tensor::from_vector<std::int64_t>({1, seq}, pos);
    }
  };
  for (const auto& [past, present] : sig.kv) feeds[past] = Tensor(DType::Float32, sig.empty_past.at(past));
  set_step(prompt, 0);
  std::int64_t past = 0;
  for (std::int64_t step = 0; step < o.max_new_tokens; ++step) {
    const auto t0 = clock::now();
    std::map<std::string, Tensor> out = run(feeds);
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    if (step == 0) r.prompt_s = s;
    else r.step_s.push_back(s);
    const Tensor& logits = out.at(sig.logits);
    if (logits.dtype() != DType::Float32 || logits.rank() != 3 || logits.dims()[0] != 1)
      throw Error("generate: logits must be float32 [1, seq, vocab], got " + dims_str(logits.dims()));
    const std::int64_t vocab = logits.dims()[2];
    const std::int64_t token =
        detail::generate::pick(logits.data<float>() + (logits.dims()[1] - 1) * vocab, vocab, o, rng);
    r.tokens.push_back(token);
    if ((o.on_token && !o.on_token(token)) || (o.eos_token_id && token == *o.eos_token_id)) break;
    past += static_cast<std::int64_t>(feeds.at(sig.ids).dims()[1]);
    for (const auto& [p, present] : sig.kv) feeds[p] = out.at(present);
    set_step({token}, past);
  }
  return r;
}

}  // namespace ondine
