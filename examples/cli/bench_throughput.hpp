// SPDX-License-Identifier: Apache-2.0
// `ondine bench MODEL --streams N [--requests M] [--hint latency|throughput]`: throughput of N streams
// (runtime/streams.hpp: threads of their own, each with its share of --threads and a plan compiled for it,
// pinned to cores of their own) taking M requests of one batch size, and the requests' latency percentiles, as
// OpenVINO's benchmark_app reports them.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ondine/lower/lower.hpp"
#include "ondine/runtime/streams.hpp"
#include "bench_batches.hpp"
#include "common.hpp"
#include "engine.hpp"

namespace ondine::cli {

struct ThroughputArgs {
  int streams = 0;       // --streams (0: from the hint)
  int requests = 0;      // --requests (0: --runs per stream)
  std::string hint;      // --hint latency|throughput ("": throughput where --streams is not given)
};

// The streams' cores as text: "0 | 1" (one group per stream), or "not pinned".
inline std::string stream_cpus_text(const runtime::StreamPlan& plan) {
  if (plan.cpus.empty()) return "not pinned";
  std::string text;
  for (std::size_t s = 0; s < plan.cpus.size(); ++s) {
    if (s) text += " | ";
    for (std::size_t c = 0; c < plan.cpus[s].size(); ++c) text += (c ? "," : "") + std::to_string(plan.cpus[s][c]);
  }
  return text;
}

inline int bench_throughput(const std::string& path, const Graph& g, const BatchDims& dims, std::int64_t batch,
                            int threads, int warmup, int runs, std::uint64_t seed, const std::string& json_file,
                            const std::string& pipeline, bool passes_given,
                            const std::shared_ptr<lower::PackedWeights>& packed, const ThroughputArgs& args) {
  const std::optional<double> flops = flops_per_sample(g, dims);
  runtime::StreamOptions so;
  if (args.streams > 0) {
    so.streams = args.streams;
    so.threads = threads;
  } else {
    const runtime::Hint hint = args.hint == "latency" ? runtime::Hint::Latency : runtime::Hint::Throughput;
    so = runtime::options_for_hint(hint, flops ? *flops * static_cast<double>(batch) : 0.0, threads);
  }
  const int requests = args.requests > 0 ? args.requests : runs * std::max(1, so.streams > 0 ? so.streams : 1);
  const runtime::StreamPlan plan = runtime::plan_streams(so, static_cast<std::size_t>(requests));

  Graph bound = bind_batch(g, dims, batch);
  std::map<std::string, Tensor> inputs;
  fill_random_inputs(bound, inputs, seed);
  // One plan, compiled for a stream's share of the threads; each stream runs it with a context of its own.
  Engine engine = make_engine(bound, false, plan.threads_per_stream, pipeline, passes_given, packed, &inputs);
  std::vector<ExecContext> contexts;
  for (int s = 0; s < plan.streams; ++s) contexts.push_back(engine.model->make_context());
  auto run_on = [&](ExecContext& context) {
    try {
      return engine.model->run(context, inputs);
    } catch (Error& e) {
      e.in_file(path);
      throw;
    }
  };

  // Warm-up: request s warms context s (whichever stream takes it), `warmup` runs each.
  runtime::run_streams<int>(static_cast<std::size_t>(plan.streams), plan, [&](std::size_t i, int) {
    for (int w = 0; w < warmup; ++w) run_on(contexts[i]);
    return 0;
  });
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<double> latency = runtime::run_streams<double>(static_cast<std::size_t>(requests), plan,
                                                             [&](std::size_t, int s) {
                                                               const auto start = std::chrono::steady_clock::now();
                                                               run_on(contexts[static_cast<std::size_t>(s)]);
                                                               return elapsed_ms(start);
                                                             });
  const double wall_ms = elapsed_ms(t0);
  const double samples_per_s = wall_ms > 0 ? static_cast<double>(requests) * static_cast<double>(batch) * 1000.0 / wall_ms : 0;
  const double p50 = quantile(latency, 0.5), p90 = quantile(latency, 0.9), p99 = quantile(latency, 0.99);
  const double rss = peak_rss_mib();

  const std::string hint = args.streams > 0 ? std::string("none (--streams)") : (args.hint.empty() ? "throughput" : args.hint);
  std::cout << "model:   " << path << "\nengine:  compiled, isa " << engine.isa << ", precision " << precision_label()
            << ", passes " << passes_label(pipeline) << "\n";
  if (!engine.precision.empty()) std::cout << engine.precision << "\n";
  std::cout << "streams: " << plan.streams << " x " << plan.threads_per_stream << " thread"
            << (plan.threads_per_stream == 1 ? "" : "s") << " (cores " << stream_cpus_text(plan) << "), hint " << hint
            << ", batch " << batch << ", " << requests << " requests after " << warmup << " warm-up runs per stream\n";
  std::cout << "FLOPs:   " << (flops ? human(*flops, "FLOP") : std::string("unknown")) << " per sample\n";
  std::cout << std::fixed << std::setprecision(1) << "throughput: " << samples_per_s << " samples/s ("
            << static_cast<double>(requests) * 1000.0 / wall_ms << " requests/s) in " << wall_ms / 1000.0 << " s\n"
            << std::setprecision(3) << "latency:    p50 " << p50 << " ms, p90 " << p90 << " ms, p99 " << p99 << " ms\n"
            << std::setprecision(1) << "compile:    " << engine.compile_ms << " ms\npeak RSS:   " << rss << " MiB\n";

  if (!json_file.empty()) {
    nlohmann::json j;
    j["model"] = path;
    j["engine"] = "compiled";
    j["isa"] = engine.isa;
    j["precision"] = precision_label();
    j["passes"] = passes_label(pipeline);
    j["hint"] = hint;
    j["streams"] = plan.streams;
    j["threads_per_stream"] = plan.threads_per_stream;
    j["pinned"] = !plan.cpus.empty();
    j["batch"] = batch;
    j["requests"] = requests;
    j["warmup"] = warmup;
    j["flops_per_sample"] = flops ? nlohmann::json(*flops) : nlohmann::json(nullptr);
    j["samples_per_s"] = samples_per_s;
    j["requests_per_s"] = static_cast<double>(requests) * 1000.0 / wall_ms;
    j["latency_ms"] = {{"p50", p50}, {"p90", p90}, {"p99", p99}};
    j["compile_ms"] = engine.compile_ms;
    j["peak_rss_mib"] = rss;
    std::ofstream out(json_file);
    if (!out) throw Error("--json " + json_file + ": cannot open for writing");
    out << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace ondine::cli
