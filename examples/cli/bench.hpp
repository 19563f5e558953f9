// SPDX-License-Identifier: Apache-2.0
// `ondine bench MODEL`: latency and throughput per batch size, or a stream of shapes, or a decode (the
// modes in bench_batches.hpp, bench_stream.hpp and bench_decode.hpp); picks the mode and reports.
#pragma once

#include <omp.h>

#include <cstdint>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ondine/lower/lower.hpp"
#include "bench_batches.hpp"
#include "bench_decode.hpp"
#include "bench_stream.hpp"
#include "bench_throughput.hpp"
#include "common.hpp"
#include "engine.hpp"

namespace ondine::cli {

inline int cmd_bench(const std::string& path, const std::vector<std::int64_t>& batch_list,
                     const std::vector<std::string>& dim_specs, int threads, int warmup, int runs, std::uint64_t seed,
                     bool use_reference, const std::string& json_file, const std::string& passes, bool passes_given,
                     bool profile, ShapeBenchArgs shape_args) {
  std::vector<std::string> specs = dim_specs;
  shape_args.ranges = take_dim_ranges(specs);
  const bool through_cache = shape_args.decode_steps > 0 || !shape_args.ranges.empty();
  const ThroughputArgs& tp = shape_args.throughput;
  const bool streams_mode = tp.streams > 0 || !tp.hint.empty();
  if (tp.requests > 0 && !streams_mode) throw UsageError("--requests applies to --streams or --hint");
  if (streams_mode) {
    const std::string mode = tp.streams > 0 ? "--streams" : "--hint";
    if (through_cache) throw UsageError(mode + " runs one batch size: it is not combined with --decode or a --dim range");
    if (batch_list.size() > 1) throw UsageError(mode + " runs one batch size: give one --batch");
    if (use_reference) throw UsageError(mode + " measures the compiled model: not combined with --reference");
    if (profile) throw UsageError("--profile is not combined with " + mode);
  }
  if (shape_args.kv_cache != "auto" && shape_args.decode_steps == 0) throw UsageError("--kv-cache applies to --decode");
  if (through_cache) {
    const std::string mode = shape_args.decode_steps > 0 ? "--decode" : "a --dim NAME=LO:HI range";
    if (shape_args.decode_steps > 0 && !shape_args.ranges.empty())
      throw UsageError("--decode draws no shapes: give its prompt length as --dim NAME=SIZE, not a range");
    if (shape_args.decode_steps == 0 && !batch_list.empty())
      throw UsageError("--batch is not combined with a --dim range: the stream runs batch 1, or --dim BATCH=SIZE, "
                       "or a range for the batch dim too");
    if (use_reference) throw UsageError("--reference is not combined with " + mode + " (it runs the compiled model)");
    if (profile) throw UsageError("--profile is not combined with " + mode);
    if (shape_args.max_error_given) throw UsageError("--max-error is not combined with " + mode);
    for (const std::string& spec : specs) {
      const auto eq = spec.find('=');
      if (eq == std::string::npos)
        throw UsageError("--dim " + spec + " names the dim --batch sets; with " + mode + " give sizes as NAME=SIZE");
      if (shape_args.ranges.count(spec.substr(0, eq)))
        throw UsageError("--dim " + spec.substr(0, eq) + " given as a range and as a size");
    }
    if (shape_args.decode_steps > 0) {  // whole decodes: one warmup and one timed unless given
      if (!shape_args.warmup_given) warmup = 1;
      if (!shape_args.runs_given) runs = 1;
    }
  } else if (shape_args.shape_plan_given) {
    throw UsageError("--shape-plan applies to a stream of shapes (--dim NAME=LO:HI) or --decode, which run through a "
                     "shape cache; bench compiles each --batch size on its own");
  }
  pipeline_for(passes);
  ModelFile file = load_model_file(path);
  adopt_artifact_precision(file);
  const std::string pipeline = pipeline_of(file, passes, passes_given);
  if (file.artifact) passes_given = true;
  std::shared_ptr<lower::PackedWeights> file_packed = file.packed;
  Graph g = std::move(file.graph);
  check_supported(g);
  if (file.artifact && !g_calib_dir.empty()) throw UsageError("--calib quantizes an ONNX model; " + path + " is compiled already");
  quantize_for_int8(g, path, lower::effective_isa());
  if (through_cache) {
    const auto fixed = parse_dims(specs);
    auto packed = file_packed ? file_packed : std::make_shared<lower::PackedWeights>();
    if (shape_args.decode_steps > 0)
      return bench_decode(path, g, fixed, batch_list, shape_args, threads, warmup, runs, seed, json_file, pipeline,
                          std::move(packed));
    return bench_stream(path, g, fixed, shape_args, threads, warmup, runs, seed, json_file, pipeline, std::move(packed));
  }
  BatchDims dims = batch_dims(g, dim_specs, path);
  auto batches = bench_batches(g, dims, batch_list, path);
  if (streams_mode)
    return bench_throughput(path, g, dims, batches.front(), threads, warmup, runs, seed, json_file, pipeline,
                            passes_given, file_packed ? file_packed : std::make_shared<lower::PackedWeights>(), tp);
  auto flops = flops_per_sample(g, dims);
  int used_threads = threads > 0 ? threads : omp_get_max_threads();

  std::string isa;
  std::vector<BenchResult> results;
  // The batch sizes share weight packings, as the shapes of a ShapeCache do: the compile time of the
  // second and later batches is that of a new shape of a model already loaded.
  auto packed = file_packed ? file_packed : std::make_shared<lower::PackedWeights>();
  for (auto batch : batches)
    results.push_back(bench_batch(g, dims, batch, use_reference, threads, warmup, runs, seed, path, isa, pipeline,
                                  passes_given, profile, packed));
  double rss = peak_rss_mib();

  bool passes_apply = !use_reference || passes_given;
  std::cout << "model:   " << path << "\nengine:  " << (use_reference ? "reference" : "compiled, isa " + isa + ", precision " + precision_label())
            << ", threads " << used_threads << ", warmup " << warmup << ", runs " << runs
            << (passes_apply ? ", passes " + passes_label(pipeline) : "") << "\n";
  if (!results.empty() && !results.front().precision.empty()) std::cout << results.front().precision << "\n";
  std::cout << "FLOPs:   " << (flops ? human(*flops, "FLOP") : std::string("unknown")) << " per sample\n";
  std::cout << std::right << std::setw(7) << "batch" << std::setw(13) << "median ms" << std::setw(11) << "p90 ms"
            << std::setw(13) << "samples/s" << std::setw(13) << "compile ms" << "\n";
  for (auto& r : results)
    std::cout << std::fixed << std::setprecision(3) << std::setw(7) << r.batch << std::setw(13) << r.median_ms
              << std::setw(11) << r.p90_ms << std::setw(13) << std::setprecision(1) << r.samples_per_s
              << std::setw(13) << r.compile_ms << "\n";
  std::cout << "peak RSS: " << std::fixed << std::setprecision(1) << rss << " MiB\n";

  if (!json_file.empty()) {
    nlohmann::json j;
    j["model"] = path;
    j["engine"] = use_reference ? "reference" : "compiled";
    j["isa"] = isa;
    j["precision"] = precision_label();
    j["passes"] = passes_apply ? passes_label(pipeline) : std::string("none");
    j["threads"] = used_threads;
    j["warmup"] = warmup;
    j["runs"] = runs;
    j["batch_dim"] = dims.batch;
    j["flops_per_sample"] = flops ? nlohmann::json(*flops) : nlohmann::json(nullptr);
    j["peak_rss_mib"] = rss;
    j["results"] = nlohmann::json::array();
    for (auto& r : results)
      j["results"].push_back({{"batch", r.batch}, {"median_ms", r.median_ms}, {"p90_ms", r.p90_ms},
                              {"samples_per_s", r.samples_per_s}, {"compile_ms", r.compile_ms},
                              {"peak_rss_mib", r.peak_rss_mib}});
    std::ofstream out(json_file);
    if (!out) throw Error("--json " + json_file + ": cannot open for writing");
    out << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace ondine::cli
