// SPDX-License-Identifier: Apache-2.0
// `ondine bench MODEL --decode STEPS`: the prompt, then one token per run with the KV cache fed back or kept
// in place, through one lower::ShapeCache.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ondine/lower/lower.hpp"
#include "ondine/lower/shape_cache.hpp"
#include "bench_batches.hpp"
#include "bench_stream.hpp"
#include "common.hpp"
#include "engine.hpp"
#include "inputs.hpp"
#include "progress.hpp"

namespace ondine::cli {

// A model with a KV cache as --decode reads it.
struct DecodeModel {
  const Value* tokens = nullptr;          // input_ids
  std::string batch_dim, seq_dim;         // the token input's axis 0 (empty: static) and axis 1 symbols
  std::int64_t static_batch = 0;          // its axis 0 when static
  std::vector<std::pair<const Value*, std::string>> kv;  // each past input and the output that feeds it next
  const Value* mask = nullptr;            // attention_mask
  const Value* positions = nullptr;       // position_ids
  std::vector<const Value*> others;       // any other input: random
  std::optional<std::int64_t> vocab;      // the token embedding's rows
  std::string logits;                     // the output the next token is the argmax of; empty: none
};

// past_key_0 <- present_key_0, past_key_values.0.key <- present.0.key.
inline DecodeModel decode_model(const Graph& g, const std::string& path) {
  DecodeModel m;
  auto rest_after = [](const std::string& name, std::initializer_list<const char*> prefixes) -> std::optional<std::string> {
    for (const char* p : prefixes)
      if (name.rfind(p, 0) == 0 && name.size() > std::strlen(p)) return name.substr(std::strlen(p));
    return std::nullopt;
  };
  std::map<std::string, std::string> presents;  // rest of the name -> output name
  for (const Value* out : g.outputs())
    if (auto rest = rest_after(out->name(), {"present.", "present_"})) presents.emplace(*rest, out->name());
  std::string names_in, names_out;
  for (const Value* in : g.inputs()) names_in += (names_in.empty() ? "" : ", ") + in->name();
  for (const Value* out : g.outputs()) names_out += (names_out.empty() ? "" : ", ") + out->name();
  for (const Value* in : g.inputs()) {
    auto rest = rest_after(in->name(), {"past_key_values.", "past_"});
    if (!rest) continue;
    auto it = presents.find(*rest);
    if (it == presents.end())
      throw Error("--decode: the past input '" + in->name() + "' has no present output to feed it (looked for 'present_" +
                  *rest + "' and 'present." + *rest + "'; outputs: " + names_out + ")").in_file(path);
    if (!in->shape().rank_known() || in->shape().rank() < 3 || in->shape()[2].is_static() || in->shape()[2].symbol.empty())
      throw Error("--decode: the past input '" + in->name() + "' has shape " + in->shape().str() +
                  "; its axis 2 should be the symbolic past length").in_file(path);
    m.kv.emplace_back(in, it->second);
  }
  if (m.kv.empty())
    throw Error("--decode needs a model with a KV cache: inputs named past_* or past_key_values.* fed by outputs "
                "named present_* or present.* (past_key_0 <- present_key_0); the model's inputs: " + names_in +
                "; outputs: " + names_out).in_file(path);
  for (const Value* in : g.inputs()) {
    if (std::any_of(m.kv.begin(), m.kv.end(), [&](auto& p) { return p.first == in; })) continue;
    if (in->name() == "attention_mask") m.mask = in;
    else if (in->name() == "position_ids") m.positions = in;
    else if (in->name() == "input_ids" || (!m.tokens && in->dtype() == DType::Int64)) {
      if (m.tokens) m.others.push_back(m.tokens);
      m.tokens = in;
    } else m.others.push_back(in);
  }
  if (!m.tokens)
    throw Error("--decode: no token input (input_ids, or an int64 input other than the pasts); the model's inputs: " +
                names_in).in_file(path);
  const Shape& s = m.tokens->shape();
  if (!s.rank_known() || s.rank() != 2 || s[1].is_static() || s[1].symbol.empty())
    throw Error("--decode: the token input '" + m.tokens->name() + "' has shape " + s.str() +
                "; expected [batch, seq] with a symbolic seq").in_file(path);
  m.seq_dim = s[1].symbol;
  if (s[0].is_static()) m.static_batch = s[0].value;
  else m.batch_dim = s[0].symbol;
  for (const Value* v : {m.mask, m.positions})
    if (v && (!v->shape().rank_known() || v->shape().rank() != 2))
      throw Error("--decode: the input '" + v->name() + "' has shape " + v->shape().str() + "; expected [batch, length]")
          .in_file(path);
  m.vocab = token_vocab(g, m.tokens);
  if (m.vocab)
    for (const Value* out : g.outputs()) {
      const Shape& o = out->shape();
      if (!rest_after(out->name(), {"present.", "present_"}) && o.rank_known() && o.rank() >= 1 &&
          o[o.rank() - 1].is_static() && o[o.rank() - 1].value == *m.vocab) {
        m.logits = out->name();
        break;
      }
    }
  return m;
}

// Decode: the prompt with empty pasts, then `steps` runs of one token each fed the previous presents.
inline int bench_decode(const std::string& path, const Graph& g, const std::map<std::string, std::int64_t>& fixed,
                        const std::vector<std::int64_t>& batches, const ShapeBenchArgs& args, int threads, int warmup,
                        int runs, std::uint64_t seed, const std::string& json_file, const std::string& pipeline,
                        std::shared_ptr<lower::PackedWeights> packed) {
  const DecodeModel m = decode_model(g, path);
  if (batches.size() > 1) throw UsageError("--decode measures one batch size, got --batch with " + std::to_string(batches.size()));
  std::int64_t batch = batches.empty() ? 1 : batches.front();
  if (!m.batch_dim.empty() && fixed.count(m.batch_dim)) {
    if (!batches.empty() && batches.front() != fixed.at(m.batch_dim))
      throw UsageError("--batch " + std::to_string(batch) + " and --dim " + m.batch_dim + "=" +
                       std::to_string(fixed.at(m.batch_dim)) + " disagree");
    batch = fixed.at(m.batch_dim);
  }
  if (m.batch_dim.empty()) {
    if (!batches.empty() && batch != m.static_batch)
      throw Error("--batch " + std::to_string(batch) + ": the token input '" + m.tokens->name() +
                  "' has a fixed batch of " + std::to_string(m.static_batch)).in_file(path);
    batch = m.static_batch;
  }
  const std::int64_t prompt = fixed.count(m.seq_dim) ? fixed.at(m.seq_dim) : 32;
  if (prompt < 1) throw UsageError("--dim " + m.seq_dim + "=" + std::to_string(prompt) + ": the prompt needs a token");
  const int steps = args.decode_steps;

  // The dims of an input at a step: static ones, the batch, the step's length, its past, --dim NAME=SIZE.
  auto dims_of = [&](const Value* in, std::int64_t seq, std::int64_t past) {
    std::vector<std::int64_t> dims;
    for (std::size_t d = 0; d < in->shape().rank(); ++d) {
      const Dim& dim = in->shape()[d];
      if (dim.is_static()) dims.push_back(dim.value);
      else if (!m.batch_dim.empty() && dim.symbol == m.batch_dim) dims.push_back(batch);
      else if (dim.symbol == m.seq_dim) dims.push_back(seq);
      else if (std::any_of(m.kv.begin(), m.kv.end(), [&](auto& p) { return p.first->shape()[2].symbol == dim.symbol; }))
        dims.push_back(past);
      else if (fixed.count(dim.symbol)) dims.push_back(fixed.at(dim.symbol));
      else
        throw Error("--decode: input '" + in->name() + "' axis " + std::to_string(d) + " is the symbolic dim '" +
                    (dim.symbol.empty() ? "?" : dim.symbol) + "': give its size with --dim NAME=SIZE").in_file(path);
    }
    return dims;
  };
  // The inputs besides the tokens and the pasts at a step (`seq` new tokens after `past`).
  std::mt19937_64 rng(seed);
  auto step_inputs = [&](std::map<std::string, Tensor>& in, std::int64_t seq, std::int64_t past) {
    if (m.mask) in[m.mask->name()] = tensor_of(m.mask->dtype(), {batch, past + seq}, [](std::int64_t) { return 1; });
    if (m.positions)
      in[m.positions->name()] =
          tensor_of(m.positions->dtype(), {batch, seq}, [&](std::int64_t i) { return past + i % seq; });
    for (const Value* v : m.others) in[v->name()] = ondine::cli::random_tensor(v->dtype(), dims_of(v, seq, past), rng);
  };
  const std::int64_t id_range = m.vocab ? std::min<std::int64_t>(*m.vocab, 100) : 100;
  const Tensor prompt_ids = tensor_of(m.tokens->dtype(), {batch, prompt}, [&](std::int64_t) {
    return std::uniform_int_distribution<std::int64_t>(0, std::max<std::int64_t>(id_range, 1) - 1)(rng);
  });
  // The next token per sequence: the argmax of the last row of the logits, else 1 + step % 100.
  auto next_tokens = [&](const std::map<std::string, Tensor>& out, int step) {
    std::vector<std::int64_t> ids(static_cast<std::size_t>(batch));
    if (m.logits.empty()) {
      std::int64_t id = 1 + step % 100;
      if (m.vocab && *m.vocab > 0) id %= *m.vocab;
      std::fill(ids.begin(), ids.end(), id);
    } else {
      const Tensor& l = out.at(m.logits);
      const std::vector<float> v = l.to_floats();
      const std::int64_t vocab = *m.vocab, rows = l.numel() / vocab / batch;
      for (std::int64_t b = 0; b < batch; ++b) {
        const float* row = v.data() + ((b + 1) * rows - 1) * vocab;
        ids[static_cast<std::size_t>(b)] = std::max_element(row, row + vocab) - row;
      }
    }
    return tensor_of(m.tokens->dtype(), {batch, 1}, [&](std::int64_t i) { return ids[static_cast<std::size_t>(i)]; });
  };

  auto precision_line = std::make_shared<std::string>();
  auto t0 = std::chrono::steady_clock::now();
  // The cache's default capacity, as a server would keep it: a per-shape plan compiles a new past length at
  // every step, and again in later decodes for the lengths it evicted.
  lower::ShapeCache cache(g.clone(), cache_options(threads, pipeline, args, std::move(packed), precision_line));
  const double ready_ms = elapsed_ms(t0);
  // In place: the pasts live in a runtime::KvCache of prompt + steps positions (the shape-free plan, every
  // past of the model one of its pairs); fed: each step's presents are the next step's pasts.
  std::optional<runtime::KvCache> kv_cache;
  {
    const lower::DynamicModel* plan = cache.shape_free();
    std::string why;
    if (!plan) why = "the model compiles one plan per shape";
    else {
      const auto pairs = plan->kv_pairs();
      for (auto& [past, present] : m.kv)
        if (std::none_of(pairs.begin(), pairs.end(), [&](const runtime::KvPair& p) { return p.past == past->name(); }))
          why = "the past '" + past->name() + "' is read by more than a Concat and attention";
    }
    if (args.kv_cache == "in-place" && !why.empty())
      throw Error("--kv-cache in-place: " + why + " (--kv-cache feed runs it)").in_file(path);
    if (args.kv_cache != "feed" && why.empty()) {
      std::map<std::string, std::int64_t> dims;
      if (!m.batch_dim.empty()) dims[m.batch_dim] = batch;
      kv_cache = cache.make_kv_cache(prompt + steps, dims);
    }
  }
  auto timed_run = [&](const std::map<std::string, Tensor>& in, std::map<std::string, Tensor>& out) {
    auto start = std::chrono::steady_clock::now();
    try {
      out = kv_cache ? cache.run(in, {}, *kv_cache) : cache.run(in);
    } catch (Error& e) {
      e.in_file(path);
      throw;
    }
    return elapsed_ms(start);
  };
  struct Decode {
    double prompt_ms = 0;
    std::vector<double> token_ms;
  };
  ondine::cli::ProgressLine progress("decode");
  const std::size_t total_runs = static_cast<std::size_t>(warmup + runs) * static_cast<std::size_t>(steps + 1);
  std::size_t done = 0;
  auto decode = [&]() {
    Decode d;
    std::map<std::string, Tensor> in, out;
    in[m.tokens->name()] = prompt_ids;
    if (kv_cache) kv_cache->reset();
    else
      for (auto& [past, present] : m.kv) {
        std::vector<std::int64_t> dims = dims_of(past, prompt, 0);
        in[past->name()] = Tensor(past->dtype(), dims);
      }
    step_inputs(in, prompt, 0);
    d.prompt_ms = timed_run(in, out);
    progress.update(++done, total_runs);
    std::int64_t past = prompt;
    for (int step = 0; step < steps; ++step) {
      in[m.tokens->name()] = next_tokens(out, step);
      for (auto& [p, present] : m.kv) {
        if (kv_cache) break;
        const Tensor& t = out.at(present);
        if (t.dims().size() < 3 || t.dims()[2] != past)
          throw Error("--decode: the output '" + present + "' has shape " + dims_str(t.dims()) + " after " +
                      std::to_string(past) + " tokens; expected " + std::to_string(past) +
                      " on axis 2 to feed '" + p->name() + "'").in_file(path);
        in[p->name()] = t;
      }
      step_inputs(in, 1, past);
      d.token_ms.push_back(timed_run(in, out));
      progress.update(++done, total_runs);
      ++past;
    }
    return d;
  };
  for (int w = 0; w < warmup; ++w) decode();
  const std::size_t warmup_compilations = cache.compilations();
  std::vector<Decode> decodes;
  for (int r = 0; r < runs; ++r) decodes.push_back(decode());
  progress.clear();
  const std::size_t compilations = cache.compilations(), timed_compilations = compilations - warmup_compilations;
  const double rss = peak_rss_mib();

  // Per decode: prompt, p50, p90, first, middle and last step; then the median of each over the decodes.
  const std::size_t mid = static_cast<std::size_t>(steps - 1) / 2;
  auto med = [&](const std::function<double(const Decode&)>& f) {
    std::vector<double> v;
    for (const Decode& d : decodes) v.push_back(f(d));
    return median(v);
  };
  const double prompt_ms = med([](const Decode& d) { return d.prompt_ms; });
  const double p50 = med([](const Decode& d) { return quantile(d.token_ms, 0.5); });
  const double p90 = med([](const Decode& d) { return quantile(d.token_ms, 0.9); });
  const double first = med([](const Decode& d) { return d.token_ms.front(); });
  const double middle = med([&](const Decode& d) { return d.token_ms[mid]; });
  const double last = med([](const Decode& d) { return d.token_ms.back(); });
  std::vector<double> per_step;
  for (std::size_t s = 0; s < static_cast<std::size_t>(steps); ++s)
    per_step.push_back(med([&](const Decode& d) { return d.token_ms[s]; }));

  std::string kv_text = std::to_string(m.kv.size()) + " past" + (m.kv.size() == 1 ? "" : "s") + " (" +
                        m.kv.front().first->name() + " <- " + m.kv.front().second + (m.kv.size() > 1 ? ", ..." : "") + "), " +
                        (kv_cache ? "in place (capacity " + std::to_string(kv_cache->capacity()) + ")" : std::string("fed back"));
  const std::string next = m.logits.empty() ? "1 + step % 100 (no output's last dim is the vocabulary)"
                                            : "argmax of '" + m.logits + "'";
  print_cache_header(path, cache, threads, "", pipeline, args, ready_ms, *precision_line);
  std::cout << "decode:  batch " << batch << ", prompt " << prompt << " tokens (" << m.seq_dim << "), " << steps
            << " steps of one token; KV cache: " << kv_text << "; next token: " << next << "; warmup " << warmup
            << ", runs " << runs << (runs > 1 ? " (medians)" : "") << "\n";
  std::cout << std::fixed << std::setprecision(3) << "prompt:  " << prompt_ms << " ms (" << prompt << " tokens)\n";
  std::cout << "tokens:  p50 " << p50 << " ms, p90 " << p90 << " ms (" << std::setprecision(1)
            << (p50 > 0 ? 1000.0 * static_cast<double>(batch) / p50 : 0.0) << " tokens/s at p50)\n";
  std::cout << std::setprecision(3) << "steps:   first " << first << " ms (past " << prompt << "), middle " << middle
            << " ms (past " << prompt + static_cast<std::int64_t>(mid) << "), last " << last << " ms (past "
            << prompt + steps - 1 << ")\n";
  std::cout << "compilations: " << compilations << " (" << timed_compilations << " in the timed decodes)\n";
  std::cout << "peak RSS: " << std::setprecision(1) << rss << " MiB\n";

  if (!json_file.empty()) {
    nlohmann::json j = cache_json(path, "decode", cache, threads, warmup, runs, seed, pipeline, args, ready_ms);
    j["batch"] = batch;
    j["prompt_tokens"] = prompt;
    j["steps"] = steps;
    nlohmann::json pairs = nlohmann::json::object();
    for (auto& [past, present] : m.kv) pairs[past->name()] = present;
    j["kv"] = pairs;
    j["kv_cache"] = kv_cache ? "in-place" : "feed";
    j["next_token"] = m.logits.empty() ? nlohmann::json(nullptr) : nlohmann::json(m.logits);
    j["prompt_ms"] = prompt_ms;
    j["token_p50_ms"] = p50;
    j["token_p90_ms"] = p90;
    j["token_first_ms"] = first;
    j["token_middle_ms"] = middle;
    j["token_last_ms"] = last;
    j["token_ms"] = per_step;
    j["compilations"] = compilations;
    j["timed_compilations"] = timed_compilations;
    j["peak_rss_mib"] = rss;
    write_json(json_file, j);
  }
  return 0;
}

}  // namespace ondine::cli
