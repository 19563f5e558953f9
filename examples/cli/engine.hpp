// SPDX-License-Identifier: Apache-2.0
// What runs a model for run and bench (the compiled model or the reference executor), the compile options
// the command line gives it, and the timing and memory figures they report.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "ondine/lower/lower.hpp"
#include "ondine/lower/tune.hpp"
#include "common.hpp"
#include "progress.hpp"

namespace ondine::cli {

// What runs a model: the oneDNN-compiled model, or the reference executor (the oracle). It keeps the
// compiled model and one execution context alive, so runs after the first reuse them.
struct Engine {
  std::string name;       // "compiled" or "reference"
  std::string isa;        // the compiled model's ISA; empty for the reference executor
  double compile_ms = 0;  // time lower::compile took
  std::string precision;  // the compile log's "precision: ..." line (--precision bf16), else empty
  std::function<std::map<std::string, Tensor>(const std::map<std::string, Tensor>&)> run;
  std::shared_ptr<CompiledModel> model;  // compiled engine only: for contexts of other threads (bench --streams)
  // Compiled engine only: `runs` profiled runs, then CompiledModel::profile_text.
  std::function<std::string(const std::map<std::string, Tensor>&, int runs)> profile;
};

// Whether a QDQ weight (an int8 constant read by a DequantizeLinear) exceeds 64 in magnitude.
inline bool has_8bit_weights(const Graph& g) {
  for (const Node* n : g.nodes()) {
    if (n->op_type() != "DequantizeLinear" || !n->input(0) || !n->input(0)->is_constant() ||
        n->input(0)->dtype() != DType::Int8)
      continue;
    const Tensor& t = n->input(0)->constant();
    for (std::int64_t i = 0; i < t.numel(); ++i)
      if (std::abs(int{t.data<std::int8_t>()[i]}) > 64) return true;
  }
  return false;
}

// What --precision int8 ran: the int8 steps oneDNN got, and where the model's quantized layers stay float
// (an fp32 island: 8-bit weights without VNNI, an op without an int8 kernel), so int8 is never claimed where
// it did not happen.
inline std::string int8_precision_line(const Graph& g, const CompiledModel& model) {
  const lower::Int8Plan plan = lower::int8_plan(model);
  std::string line = "precision: int8 in " + std::to_string(plan.int8_steps) + " step" +
                     (plan.int8_steps == 1 ? "" : "s") + " (the model's " + std::to_string(quantized_nodes(g)) +
                     " quantized nodes), fp32 elsewhere";
  if (!plan.islands.empty())
    line += "; " + std::to_string(plan.islands.size()) + " fp32 island" + (plan.islands.size() == 1 ? "" : "s") +
            " where the model is quantized (`ondine inspect MODEL --compiled` says why)";
  const lower::IsaInfo here = lower::effective_isa();
  if (!here.int8_vnni && has_8bit_weights(g))
    line += "; 8-bit weights requantized to 7 bits for " + here.name + " (no VNNI: its int8 kernels saturate past 64)";
  return line;
}

// The bf16 error bound's progress (lower::Bf16BoundOptions::progress): ranking the candidates and timing
// them are the long parts, shown on one progress line; each node kept fp32 is a result, a log line.
inline std::function<void(const std::string&)> bf16_bound_progress() {
  auto line = std::make_shared<ondine::cli::ProgressLine>("bf16 bound");
  return [line](const std::string& what) {
    if (what.rfind("ranking", 0) == 0 || what.rfind("timing", 0) == 0) return line->update(0, std::nullopt, what);
    line->clear();
    std::cerr << "bf16 bound: " << what << "\n";
  };
}

// The compile options run and bench compile with: --threads, the pipeline, --precision, --keep-fp32, the
// kernel choices; a progress line while compiling (shared: a staged model, or a ShapeCache, compiles later
// with a copy of these options).
inline lower::CompileOptions tool_compile_options(int threads, const std::string& passes) {
  lower::CompileOptions opts;
  opts.threads = threads;
  opts.passes = passes;
  opts.precision = g_precision;
  opts.keep_fp32 = g_keep_fp32;
  opts.conv_layout = g_conv_layout;
  opts.conv_algorithm = g_conv_algorithm;
  opts.matmul_kernel = g_matmul_kernel;
  // Without VNNI: --exact-int8-weights keeps 8-bit-weight layers float; --precision int8 asks for int8 (7-bit
  // weights); else this CPU's int8 and fp32 rates decide (lower::int8_7bit_weights_by_default).
  if (g_exact_int8_weights) opts.int8_7bit_weights = false;
  else if (g_int8) opts.int8_7bit_weights = true;
  opts.weight_only_int8_activations = !g_exact_weight_only;
  lower::apply_tuned(g_artifact_tuned, opts);  // an artifact's tuned choices, where no option set them
  auto compiling = std::make_shared<ondine::cli::ProgressLine>("compiling");
  opts.progress = [compiling](std::size_t done, std::size_t total, const Node* n) {
    if (!n) return compiling->clear();
    compiling->update(done, total, n->op_type() + " '" + n->name() + "'");
  };
  return opts;
}

// `passes`: the pipeline lower::compile runs; the reference executor runs the graph as given unless
// `reference_passes` (then it runs the optimised graph, which checks the passes without the lowering).
// `packed`: weight packings shared with other engines of the same model (bench's batch sizes), as a
// lower::ShapeCache shares them between shapes.
// `sample`: the inputs --max-error measures the bf16 error on.
inline Engine make_engine(const Graph& g, bool use_reference, int threads, const std::string& passes,
                          bool reference_passes = false, std::shared_ptr<lower::PackedWeights> packed = nullptr,
                          const std::map<std::string, Tensor>* sample = nullptr) {
  Engine engine;
  if (use_reference) {
    std::shared_ptr<ReferenceExecutor> exec;
    if (reference_passes) {
      auto optimised = std::make_shared<Graph>(g.clone());
      pipeline_for(passes).run(*optimised);
      exec = std::make_shared<ReferenceExecutor>(*optimised);
      engine.run = [exec, optimised](const std::map<std::string, Tensor>& in) { return exec->run(in); };
    } else {
      exec = std::make_shared<ReferenceExecutor>(g);
      engine.run = [exec](const std::map<std::string, Tensor>& in) { return exec->run(in); };
    }
    engine.name = "reference";
    return engine;
  }
  auto t0 = std::chrono::steady_clock::now();
  lower::CompileOptions opts = tool_compile_options(threads, passes);
  opts.packed_weights = std::move(packed);
  auto precision_line = std::make_shared<std::string>();  // outlives this call: staged models compile later
  if (g_precision != lower::Precision::Fp32)
    opts.log = [precision_line](const std::string& line) {
      keep_precision_line(*precision_line, line);
    };
  std::shared_ptr<CompiledModel> model;
  if (g_tune) {
    lower::TuneOptions t;
    t.tune_int8_weights = !g_exact_int8_weights;
    if (sample) t.inputs = *sample;
    auto line = std::make_shared<ondine::cli::ProgressLine>("tuning");
    t.progress = [line](const std::string& what) { line->update(0, std::nullopt, what); };
    if (!g_precision_given) opts.precision = lower::Precision::Auto;  // the precision is tuned unless given
    lower::TuneResult r = lower::tune(g, opts, t);
    line->clear();
    model = std::make_shared<CompiledModel>(lower::compile(g, r.options));
    char took[64];
    std::snprintf(took, sizeof took, " in %.1f s", r.seconds);
    std::string text = r.text();
    text.insert(text.find(':'), r.from_cache ? "" : took);
    engine.precision = text.substr(0, text.size() - 1) + (precision_line->empty() ? "" : "\n" + *precision_line);
  } else if (lower::resolved_precision(g_precision) == lower::Precision::Fp32 && g_precision == lower::Precision::Auto) {
    model = std::make_shared<CompiledModel>(lower::compile(g, opts));
    engine.precision = "precision: auto is fp32 here (" + lower::bf16_not_faster_reason(lower::effective_isa()) + ")";
  } else if (g_max_error && sample && !g_int8) {  // int8: --max-error bounded the quantization
    lower::Bf16BoundOptions bo;
    bo.max_error = *g_max_error;
    bo.progress = bf16_bound_progress();
    lower::Bf16BoundResult r = lower::compile_bf16_within(g, opts, {*sample}, bo);
    model = std::make_shared<CompiledModel>(std::move(r.model));
    std::ostringstream line;
    line << "bf16 error bound " << std::defaultfloat << *g_max_error << ": error " << r.error << " (all bf16: "
         << r.initial_error << ")" << (r.met ? "" : " NOT MET") << ", " << r.kept.size() << " node(s) kept fp32 for it";
    for (const std::string& name : r.kept) line << " '" << name << "'";
    if (r.bf16_ms > 0)  // auto: timed against fp32, the faster kept
      line << "\nprecision: auto chose " << (r.chose_fp32 ? "fp32" : "bf16") << " (median of 7 runs: bf16 "
           << std::fixed << std::setprecision(2) << r.bf16_ms << " ms, fp32 " << r.fp32_ms << " ms"
           << (r.met ? "" : "; bf16 missed the bound") << ")";
    engine.precision = line.str() + "\n" + (r.chose_fp32 ? "precision: fp32 in every node" : *precision_line);
  } else {
    model = std::make_shared<CompiledModel>(lower::compile(g, opts));
    engine.precision = g_int8 ? int8_precision_line(g, *model) : *precision_line;
  }
  engine.compile_ms = elapsed_ms(t0);
  auto context = std::make_shared<ExecContext>(model->make_context());
  engine.name = "compiled";
  engine.model = model;
  engine.isa = model->isa();
  engine.run = [model, context](const std::map<std::string, Tensor>& in) { return model->run(*context, in); };
  engine.profile = [model, context](const std::map<std::string, Tensor>& in, int runs) {
    context->reset_profile();
    context->profile = true;
    for (int i = 0; i < runs; ++i) model->run(*context, in);
    context->profile = false;
    return model->profile_text(*context);
  };
  return engine;
}

// Times `runs` calls of the engine (ms each); the last call's outputs go to *last when given.
// Long loops show a progress line ("LABEL: run 20/50") on a terminal (cli/progress.hpp).
inline std::vector<double> time_runs(const Engine& engine, const std::map<std::string, Tensor>& inputs, int runs,
                                     const std::string& path, const std::string& progress_label = "",
                                     std::map<std::string, Tensor>* last = nullptr) {
  std::vector<double> ms;
  std::optional<ondine::cli::ProgressLine> progress;
  if (!progress_label.empty()) progress.emplace(progress_label + " runs");
  for (int r = 0; r < runs; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    try {
      auto outputs = engine.run(inputs);
      ms.push_back(elapsed_ms(t0));
      if (last) *last = std::move(outputs);
    } catch (Error& e) {
      e.in_file(path);
      throw;
    }
    if (progress) progress->update(static_cast<std::size_t>(r + 1), static_cast<std::size_t>(runs));
  }
  return ms;
}

// The q-quantile (0..1) of samples, nearest rank.
inline double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  auto i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, i ? i - 1 : 0)];
}

// The process's peak resident set so far (Linux reports ru_maxrss in KiB).
inline double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

}  // namespace ondine::cli
