// SPDX-License-Identifier: Apache-2.0
// `ondine bench` over batch sizes: which symbolic dim --batch sets, the graph bound to each batch size, and
// one compile and timed loop per size.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ondine/lower/lower.hpp"
#include "common.hpp"
#include "engine.hpp"

namespace ondine::cli {

// Which symbolic dim --batch sets, and the other dims' bindings, from --dim NAME (the batch dim) and
// --dim NAME=SIZE (fixed). Without a bare NAME, the model's only symbolic dim is the batch dim; a model
// with no symbolic dim has none (its batch is fixed).
struct BatchDims {
  std::string batch;  // empty: the model's shapes are static
  std::map<std::string, std::int64_t> fixed;
};

inline BatchDims batch_dims(const Graph& g, const std::vector<std::string>& dim_specs, const std::string& path) {
  BatchDims out;
  std::vector<std::string> bindings;
  for (auto& spec : dim_specs) {
    if (spec.find('=') != std::string::npos) bindings.push_back(spec);
    else if (!out.batch.empty()) throw Error("--dim NAME (the batch dim) given twice: " + out.batch + ", " + spec);
    else out.batch = spec;
  }
  out.fixed = parse_dims(bindings);
  auto symbols = symbolic_dims(g);
  std::string names;
  for (auto& sym : symbols) names += (names.empty() ? "" : ", ") + sym;
  if (!out.batch.empty()) {
    if (std::find(symbols.begin(), symbols.end(), out.batch) == symbols.end())
      throw Error("--dim " + out.batch + ": the model has no symbolic dim of that name (symbolic dims: " +
                  (names.empty() ? "none" : names) + ")").in_file(path);
    return out;
  }
  std::vector<std::string> unbound;
  for (auto& sym : symbols)
    if (!out.fixed.count(sym)) unbound.push_back(sym);
  if (unbound.size() == 1) out.batch = unbound[0];
  else if (unbound.size() > 1)
    throw Error("the model has several symbolic dims (" + names +
                "): name the one --batch sets with --dim NAME (and fix others with --dim NAME=SIZE)").in_file(path);
  return out;
}

// The batch of a model with static shapes: the leading dim of its first input (1 for a scalar).
inline std::int64_t static_batch(const Graph& g) {
  if (g.inputs().empty()) return 1;
  const Shape& s = g.inputs().front()->shape();
  return s.rank_known() && s.rank() > 0 && s[0].is_static() ? s[0].value : 1;
}

// The graph with the batch dim bound (other symbolic dims: --dim NAME=SIZE, else 1).
inline Graph bind_batch(const Graph& g, const BatchDims& dims, std::int64_t batch) {
  auto bindings = dims.fixed;
  if (!dims.batch.empty()) bindings[dims.batch] = batch;
  for (auto& sym : symbolic_dims(g)) bindings.emplace(sym, 1);
  Graph bound = g.clone();
  bind_dims(bound, bindings);
  return bound;
}

// The batch sizes to measure: --batch, which for a model with static shapes can only be its own batch.
inline std::vector<std::int64_t> bench_batches(const Graph& g, const BatchDims& dims, std::vector<std::int64_t> batches,
                                               const std::string& path) {
  if (!dims.batch.empty()) return batches.empty() ? std::vector<std::int64_t>{1} : batches;
  std::int64_t own = static_batch(g);
  for (auto b : batches)
    if (b != own)
      throw Error("--batch " + std::to_string(b) + ": the model has no symbolic dim, its batch is fixed at " +
                  std::to_string(own) + " (leave out --batch, or give --batch " + std::to_string(own) + ")")
          .in_file(path);
  return {own};
}

struct BenchResult {
  std::int64_t batch = 0;
  double compile_ms = 0, median_ms = 0, p90_ms = 0, samples_per_s = 0, peak_rss_mib = 0;
  std::string precision;  // Engine::precision
};

inline BenchResult bench_batch(const Graph& g, const BatchDims& dims, std::int64_t batch, bool use_reference,
                               int threads, int warmup, int runs, std::uint64_t seed, const std::string& path,
                               std::string& isa, const std::string& passes, bool passes_given, bool profile,
                               const std::shared_ptr<lower::PackedWeights>& packed) {
  Graph bound = bind_batch(g, dims, batch);
  std::map<std::string, Tensor> inputs;
  fill_random_inputs(bound, inputs, seed);
  Engine engine = make_engine(bound, use_reference, threads, passes, passes_given, packed, &inputs);
  isa = engine.isa;
  std::string label = "batch " + std::to_string(batch);
  time_runs(engine, inputs, warmup, path, label + " warmup");
  auto ms = time_runs(engine, inputs, runs, path, label);
  if (profile && engine.profile)  // after the timed runs, so profiling cannot slow them
    std::cout << "batch " << batch << " " << engine.profile(inputs, runs);
  BenchResult r;
  r.batch = batch;
  r.compile_ms = engine.compile_ms;
  r.precision = engine.precision;
  r.median_ms = quantile(ms, 0.5);
  r.p90_ms = quantile(ms, 0.9);
  r.samples_per_s = r.median_ms > 0 ? static_cast<double>(batch) * 1000.0 / r.median_ms : 0;
  r.peak_rss_mib = peak_rss_mib();
  return r;
}

// FLOPs of one sample: the graph's FLOPs at batch 1 (a model with static shapes: divided by its batch).
inline std::optional<double> flops_per_sample(const Graph& g, const BatchDims& dims) {
  GraphStats stats = graph_stats(bind_batch(g, dims, 1));
  if (!stats.flops) return std::nullopt;
  return dims.batch.empty() ? *stats.flops / static_cast<double>(static_batch(g)) : *stats.flops;
}

}  // namespace ondine::cli
