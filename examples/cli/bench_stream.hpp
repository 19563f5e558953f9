// SPDX-License-Identifier: Apache-2.0
// `ondine bench MODEL --dim NAME=LO:HI`: a stream of shapes through one lower::ShapeCache, and what it shares
// with --decode (bench_decode.hpp): token inputs, the cache's options, its header lines and JSON.
#pragma once

#include <omp.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "ondine/lower/lower.hpp"
#include "ondine/lower/shape_cache.hpp"
#include "common.hpp"
#include "bench_throughput.hpp"
#include "engine.hpp"
#include "progress.hpp"

namespace ondine::cli {

// ---- ondine bench: a stream of shapes, and a decode with a KV cache ----
//
// Both run the model as a server would: through one lower::ShapeCache built once, which takes the
// shape-free plan (lower/dynamic.hpp) or compiles once per new shape (CompileOptions::shape_plan,
// --shape-plan).

// --dim NAME=LO:HI: each run of the stream draws NAME uniformly in [LO, HI].
struct DimRange {
  std::int64_t lo = 0, hi = 0;
};

// What bench does besides one compile per batch size: the stream's ranges, --decode, --shape-plan; and
// --streams, --requests, --hint (bench_throughput.hpp).
struct ShapeBenchArgs {
  ThroughputArgs throughput;
  std::map<std::string, DimRange> ranges;  // --dim NAME=LO:HI
  int decode_steps = 0;                    // --decode STEPS (0: none)
  std::string kv_cache = "auto";           // --kv-cache auto|in-place|feed
  lower::ShapePlan shape_plan = lower::ShapePlan::Auto;
  bool shape_plan_given = false, warmup_given = false, runs_given = false, max_error_given = false;
};

inline bool parse_size(const std::string& s, std::int64_t& out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && out >= 0;
}

// Takes the ranges (NAME=LO:HI) out of bench's --dim specs; the others stay.
inline std::map<std::string, DimRange> take_dim_ranges(std::vector<std::string>& specs) {
  std::map<std::string, DimRange> ranges;
  std::vector<std::string> rest;
  for (const std::string& s : specs) {
    const auto eq = s.find('=');
    const auto colon = eq == std::string::npos ? std::string::npos : s.find(':', eq);
    if (colon == std::string::npos) {
      rest.push_back(s);
      continue;
    }
    const std::string name = s.substr(0, eq);
    DimRange r;
    if (name.empty() || !parse_size(s.substr(eq + 1, colon - eq - 1), r.lo) || !parse_size(s.substr(colon + 1), r.hi) ||
        r.lo > r.hi)
      throw UsageError("--dim expects NAME=LO:HI with integers 0 <= LO <= HI for a range, got '" + s + "'");
    if (ranges.count(name)) throw UsageError("--dim " + name + " given as a range twice");
    ranges[name] = r;
  }
  specs = std::move(rest);
  return ranges;
}

// The rows of the embedding tables an integer input indexes (Gather of a constant table by it): its ids
// must stay below that. nullopt where no such Gather reads it.
inline std::optional<std::int64_t> token_vocab(const Graph& g, const Value* in) {
  std::optional<std::int64_t> vocab;
  for (const Node* n : g.nodes()) {
    if (n->op_type() != "Gather" || n->num_inputs() < 2 || n->input(1) != in || !n->input(0) ||
        !n->input(0)->is_constant())
      continue;
    const auto& dims = n->input(0)->constant().dims();
    std::int64_t axis = n->attr_int("axis", 0);
    if (axis < 0) axis += static_cast<std::int64_t>(dims.size());
    if (axis < 0 || axis >= static_cast<std::int64_t>(dims.size())) continue;
    const std::int64_t rows = dims[static_cast<std::size_t>(axis)];
    vocab = vocab ? std::min(*vocab, rows) : rows;
  }
  return vocab;
}

inline bool is_integer_dtype(DType t) {
  return t == DType::Int8 || t == DType::UInt8 || t == DType::Int16 || t == DType::UInt16 || t == DType::Int32 ||
         t == DType::UInt32 || t == DType::Int64 || t == DType::UInt64;
}

// A tensor of `dtype` whose element i is value(i).
inline Tensor tensor_of(DType dtype, std::vector<std::int64_t> dims,
                        const std::function<std::int64_t(std::int64_t)>& value) {
  Tensor t(dtype, std::move(dims));
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = t.data<T>();
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      if constexpr (std::is_same_v<T, bool>) p[i] = value(i) != 0;
      else if constexpr (std::is_integral_v<T>) p[i] = static_cast<T>(value(i));
      else p[i] = T(static_cast<float>(value(i)));
    }
  });
  return t;
}

// Seeded random inputs for a graph whose input shapes are bound (fill_random_inputs), as a tokenizer would
// give them: token ids (an integer input indexing an embedding table) below the table's rows, an
// attention_mask of ones.
inline std::map<std::string, Tensor> token_inputs(const Graph& bound, std::uint64_t seed) {
  std::map<std::string, Tensor> inputs;
  fill_random_inputs(bound, inputs, seed);
  for (const Value* in : bound.inputs()) {
    Tensor& t = inputs.at(in->name());
    if (in->name() == "attention_mask") {
      t = tensor_of(in->dtype(), t.dims(), [](std::int64_t) { return 1; });
    } else if (is_integer_dtype(in->dtype())) {
      const auto vocab = token_vocab(bound, in);
      if (vocab && *vocab > 0 && *vocab < 100) {  // fill_random_inputs draws in [0, 100)
        const std::vector<std::int64_t> ids = t.to_int64s();
        t = tensor_of(in->dtype(), t.dims(), [&](std::int64_t i) { return ids[static_cast<std::size_t>(i)] % *vocab; });
      }
    }
  }
  return inputs;
}

// The ShapeCache's compile options: as run and bench compile (tool_compile_options), --shape-plan, and the
// precision summary of a per-shape compile kept in *precision_line.
inline lower::CompileOptions cache_options(int threads, const std::string& passes, const ShapeBenchArgs& args,
                                           std::shared_ptr<lower::PackedWeights> packed,
                                           std::shared_ptr<std::string> precision_line) {
  lower::CompileOptions opts = tool_compile_options(threads, passes);
  opts.packed_weights = std::move(packed);
  opts.shape_plan = args.shape_plan;
  if (g_precision != lower::Precision::Fp32)
    opts.log = [precision_line](const std::string& line) { keep_precision_line(*precision_line, line); };
  return opts;
}

inline std::string bindings_str(const std::map<std::string, std::int64_t>& b) {
  std::string s;
  for (auto& [name, size] : b) s += (s.empty() ? "" : ", ") + name + "=" + std::to_string(size);
  return s;
}

inline double median(std::vector<double> v) { return quantile(std::move(v), 0.5); }

// The header lines of both modes: model, engine, the plan the cache took.
inline void print_cache_header(const std::string& path, const lower::ShapeCache& cache, int threads,
                               const std::string& extra, const std::string& pipeline, const ShapeBenchArgs& args,
                               double ready_ms, const std::string& precision_line) {
  std::cout << "model:   " << path << "\nengine:  shape cache, isa " << lower::effective_isa().name << ", precision "
            << precision_label() << ", threads " << (threads > 0 ? threads : omp_get_max_threads()) << extra << ", passes " << passes_label(pipeline)
            << ", shape plan " << lower::shape_plan_name(args.shape_plan) << "\n";
  if (!precision_line.empty()) std::cout << precision_line << "\n";
  std::cout << "plan:    " << cache.shape_plan_reason() << " (ready in " << std::fixed << std::setprecision(1)
            << ready_ms << " ms)\n";
}

// The JSON fields both modes start with: the model, the engine, the plan the cache took.
inline nlohmann::json cache_json(const std::string& path, const char* mode, const lower::ShapeCache& cache, int threads,
                                 int warmup, int runs, std::uint64_t seed, const std::string& pipeline,
                                 const ShapeBenchArgs& args, double ready_ms) {
  nlohmann::json j;
  j["model"] = path;
  j["mode"] = mode;
  j["engine"] = "shape cache";
  j["isa"] = lower::effective_isa().name;
  j["precision"] = precision_label();
  j["passes"] = passes_label(pipeline);
  j["threads"] = threads > 0 ? threads : omp_get_max_threads();
  j["warmup"] = warmup;
  j["runs"] = runs;
  j["seed"] = seed;
  j["shape_plan"] = lower::shape_plan_name(args.shape_plan);
  j["plan"] = cache.shape_plan_reason();
  j["shape_free"] = cache.shape_free() != nullptr;
  j["ready_ms"] = ready_ms;
  return j;
}

inline void write_json(const std::string& json_file, const nlohmann::json& j) {
  std::ofstream out(json_file);
  if (!out) throw Error("--json " + json_file + ": cannot open for writing");
  out << j.dump(2) << "\n";
}

// A stream of shapes: each timed run draws the ranged dims (other symbolic dims: --dim NAME=SIZE, else 1).
inline int bench_stream(const std::string& path, const Graph& g, const std::map<std::string, std::int64_t>& fixed,
                        const ShapeBenchArgs& args, int threads, int warmup, int runs, std::uint64_t seed,
                        const std::string& json_file, const std::string& pipeline,
                        std::shared_ptr<lower::PackedWeights> packed) {
  using Binding = std::map<std::string, std::int64_t>;
  const auto symbols = symbolic_dims(g);
  std::string names;
  for (auto& sym : symbols) names += (names.empty() ? "" : ", ") + sym;
  for (auto& [name, r] : args.ranges)
    if (std::find(symbols.begin(), symbols.end(), name) == symbols.end())
      throw Error("--dim " + name + "=" + std::to_string(r.lo) + ":" + std::to_string(r.hi) +
                  ": the model has no symbolic dim of that name (symbolic dims: " + (names.empty() ? "none" : names) +
                  ")").in_file(path);
  Binding others;  // the dims no range draws
  for (auto& sym : symbols)
    if (!args.ranges.count(sym)) others[sym] = fixed.count(sym) ? fixed.at(sym) : 1;
  for (auto& [name, size] : fixed)
    if (!others.count(name)) others[name] = size;  // bind_dims names a size for no dim

  // The stream's shapes, drawn before anything runs; random inputs per distinct shape, made before timing.
  std::mt19937_64 rng(seed);
  std::vector<Binding> stream;
  for (int r = 0; r < runs; ++r) {
    Binding b = others;
    for (auto& [name, range] : args.ranges) b[name] = std::uniform_int_distribution<std::int64_t>(range.lo, range.hi)(rng);
    stream.push_back(std::move(b));
  }
  Binding middle = others;
  for (auto& [name, range] : args.ranges) middle[name] = range.lo + (range.hi - range.lo) / 2;
  std::map<Binding, std::map<std::string, Tensor>> inputs;
  auto inputs_for = [&](const Binding& b) -> const std::map<std::string, Tensor>& {
    auto it = inputs.find(b);
    if (it != inputs.end()) return it->second;
    Graph bound = g.clone();
    try {
      bind_dims(bound, b);
      return inputs.emplace(b, token_inputs(bound, seed)).first->second;
    } catch (Error& e) {
      e.in_file(path);
      throw;
    }
  };
  if (warmup > 0) inputs_for(middle);
  for (const Binding& b : stream) inputs_for(b);
  std::set<Binding> distinct(stream.begin(), stream.end());

  // One cache for the whole stream, holding every shape it sees (a per-shape plan evicts none).
  auto precision_line = std::make_shared<std::string>();
  auto t0 = std::chrono::steady_clock::now();
  lower::ShapeCache cache(g.clone(), cache_options(threads, pipeline, args, std::move(packed), precision_line),
                          distinct.size() + 1);
  const double ready_ms = elapsed_ms(t0);
  auto run = [&](const Binding& b) {
    const auto& in = inputs.at(b);
    auto start = std::chrono::steady_clock::now();
    try {
      cache.run(in);
    } catch (Error& e) {
      e.in_file(path);
      throw;
    }
    return elapsed_ms(start);
  };
  {
    ondine::cli::ProgressLine progress("warmup runs");
    for (int r = 0; r < warmup; ++r) {
      run(middle);
      progress.update(static_cast<std::size_t>(r + 1), static_cast<std::size_t>(warmup));
    }
  }
  std::vector<double> ms;
  std::map<Binding, double> first_ms;
  std::vector<Binding> first_seen;
  const auto stream_start = std::chrono::steady_clock::now();
  {
    ondine::cli::ProgressLine progress("stream runs");
    for (int r = 0; r < runs; ++r) {
      const Binding& b = stream[static_cast<std::size_t>(r)];
      ms.push_back(run(b));
      if (first_ms.emplace(b, ms.back()).second) first_seen.push_back(b);
      progress.update(static_cast<std::size_t>(r + 1), static_cast<std::size_t>(runs));
    }
  }
  const double total_s = elapsed_ms(stream_start) / 1000.0;
  const std::size_t compilations = cache.compilations();
  // The cost of a new shape: each shape of the stream runs three more times; its steady time is the faster
  // of the last two. The first-run overhead is the first run in the stream against that (the warmup's shape
  // was not new to the stream: left out). A plan could also pay at a shape's second run: for a shape run
  // once in the stream the first repeat is its second run, measured against the steady time too.
  std::vector<double> overhead, firsts, steadies, second_overhead;
  nlohmann::json shapes_json = nlohmann::json::array();
  for (const Binding& b : first_seen) {
    const double again = run(b);
    const double steady = std::min(run(b), run(b));
    const bool is_new = warmup == 0 || b != middle;
    const auto count = std::count(stream.begin(), stream.end(), b);
    if (is_new) {
      overhead.push_back(first_ms.at(b) - steady);
      firsts.push_back(first_ms.at(b));
      steadies.push_back(steady);
      if (count == 1) second_overhead.push_back(again - steady);
    }
    shapes_json.push_back({{"dims", b}, {"runs", count}, {"first_ms", first_ms.at(b)}, {"repeat_ms", again},
                           {"steady_ms", steady}, {"new", is_new}});
  }
  const double rss = peak_rss_mib();

  std::string ranges_text;
  for (auto& [name, r] : args.ranges)
    ranges_text += (ranges_text.empty() ? "" : ", ") + name + " uniform in [" + std::to_string(r.lo) + ", " +
                   std::to_string(r.hi) + "]";
  Binding shown_others;
  for (auto& [name, size] : others)
    if (std::find(symbols.begin(), symbols.end(), name) != symbols.end()) shown_others[name] = size;
  print_cache_header(path, cache, threads, ", warmup " + std::to_string(warmup) +
                                              (warmup > 0 ? " (at " + bindings_str(middle) + ")" : std::string()) +
                                              ", runs " + std::to_string(runs),
                     pipeline, args, ready_ms, *precision_line);
  std::cout << "stream:  " << ranges_text << (shown_others.empty() ? "" : "; " + bindings_str(shown_others))
            << " (seed " << seed << ")\n";
  std::cout << std::fixed << std::setprecision(3) << "runs:    " << runs << " runs, " << distinct.size()
            << " distinct shapes, " << total_s << " s in all; p50 " << quantile(ms, 0.5) << " ms, p99 "
            << quantile(ms, 0.99) << " ms\n";
  std::cout << "new shape: ";
  if (overhead.empty())
    std::cout << "no shape new to the stream (all at the warmup's)";
  else
    std::cout << "first run " << std::showpos << median(overhead) << std::noshowpos << " ms over steady (median over "
              << overhead.size() << " shape" << (overhead.size() == 1 ? "" : "s") << " new to the stream; first "
              << median(firsts) << " ms, steady " << median(steadies) << " ms)";
  if (!second_overhead.empty())
    std::cout << ", second run " << std::showpos << median(second_overhead) << std::noshowpos << " ms (median over "
              << second_overhead.size() << " shape" << (second_overhead.size() == 1 ? "" : "s")
              << " run once in the stream)";
  std::cout << "; compilations " << compilations << "\n";
  std::cout << "peak RSS: " << std::setprecision(1) << rss << " MiB\n";

  if (!json_file.empty()) {
    nlohmann::json j = cache_json(path, "stream", cache, threads, warmup, runs, seed, pipeline, args, ready_ms);
    nlohmann::json ranges = nlohmann::json::object();
    for (auto& [name, r] : args.ranges) ranges[name] = {r.lo, r.hi};
    j["ranges"] = ranges;
    j["dims"] = shown_others;
    j["distinct_shapes"] = distinct.size();
    j["total_s"] = total_s;
    j["p50_ms"] = quantile(ms, 0.5);
    j["p99_ms"] = quantile(ms, 0.99);
    j["new_shape_overhead_ms"] = overhead.empty() ? nlohmann::json(nullptr) : nlohmann::json(median(overhead));
    j["new_shapes_measured"] = overhead.size();
    j["second_run_overhead_ms"] =
        second_overhead.empty() ? nlohmann::json(nullptr) : nlohmann::json(median(second_overhead));
    j["compilations"] = compilations;
    j["peak_rss_mib"] = rss;
    j["shapes"] = shapes_json;
    nlohmann::json run_json = nlohmann::json::array();  // the stream in order
    for (std::size_t r = 0; r < ms.size(); ++r) run_json.push_back({{"dims", stream[r]}, {"ms", ms[r]}});
    j["stream"] = run_json;
    write_json(json_file, j);
  }
  return 0;
}

}  // namespace ondine::cli
