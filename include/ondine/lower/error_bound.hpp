// SPDX-License-Identifier: Apache-2.0
// ondine/lower/error_bound.hpp - bfloat16 under an error bound: compile in bf16, measure the outputs against
// the float32 compile on a few samples, and while the error exceeds the bound keep one more node float32,
// worst first (the loop and the error measure are the int8 fallback's: ir/error_bound.hpp).
//
//   lower::CompileOptions options;                       // Bf16 here; Auto: Bf16 where faster, else Fp32
//   auto r = lower::compile_bf16_within(graph, options, samples, 0.01);
//   r.model            the compiled model of the last step, ready to run
//   r.kept             the nodes kept float32 for the bound, in order (CompileOptions::keep_fp32 gets them)
//   r.initial_error, r.error, r.met
//
// Precision::Auto also times the result against the float32 compile and keeps the faster (Bf16BoundResult::
// chose_fp32): the policy is "the fastest precision within the bound", per model.
// The ranking (only when the first bf16 compile misses the bound): each node that computes in bf16 is
// compiled alone in bf16, every other one float32, and the output error it then causes is its
// sensitivity; largest first. That costs one compile and one run per sample per node (ResNet-50: 54 such
// compiles), which `progress` reports. Nodes the caller keeps float32 (options.keep_fp32) stay so.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/error_bound.hpp"
#include "ondine/ir/graph.hpp"
#include "ondine/lower/compiler.hpp"
#include "ondine/lower/packed_weights.hpp"

namespace ondine::lower {

struct Bf16BoundResult {
  CompiledModel model;                                  // compiled with the nodes of `kept` float32
  std::vector<std::pair<std::string, double>> ranking;  // bf16 nodes, worst first, with their alone-error
  std::vector<std::string> kept;                        // nodes kept float32 for the bound, in order
  double initial_error = 0.0, error = 0.0;
  bool met = false;
  // Precision::Auto only: the bf16 model (within the bound) and the float32 one were timed on the first
  // sample, and `model` is the faster (float32 unless bf16 is at least kAutoMinGain faster). 0: not timed.
  double bf16_ms = 0.0, fp32_ms = 0.0;
  bool chose_fp32 = false;  // `model` is the float32 compile (slower in bf16, or the bound was not met)
  // Bf16BoundOptions::keep_packings: the weights `model`'s compile packed (an artifact stores them:
  // lower::save_artifact), so that writing one needs no further compile.
  std::shared_ptr<PackedWeights> packed;
};

// bf16 must beat float32 by this fraction for Precision::Auto to keep it: timing noise must not trade
// exactness for nothing.
inline constexpr double kAutoMinGain = 0.03;

struct Bf16BoundOptions {
  double max_error = 0.01;
  std::size_t max_fallbacks = 0;  // keep at most this many nodes float32 (0: no limit)
  // Long work shows progress: called with what is being done ("ranking 3/54 'conv3'", "fallback 2: ...").
  std::function<void(const std::string&)> progress;
  // Keep the packed weights of the compile that becomes the result (Bf16BoundResult::packed).
  bool keep_packings = false;
};

namespace detail::bf16_bound {

inline SampleOutputs run_all(const CompiledModel& model, const std::vector<std::map<std::string, Tensor>>& samples) {
  SampleOutputs out;
  for (const auto& s : samples) out.push_back(model.run(s));
  return out;
}

// Median milliseconds per run of `a` and of `b` on `inputs`, runs interleaved (a, b, a, b, ...) so that a
// change of load hits both, after one warm-up run each.
inline std::pair<double, double> time_both(const CompiledModel& a, const CompiledModel& b,
                                           const std::map<std::string, Tensor>& inputs, int runs = 7) {
  ExecContext ca = a.make_context(), cb = b.make_context();
  a.run(ca, inputs);
  b.run(cb, inputs);
  std::vector<double> ta, tb;
  auto timed = [&](const CompiledModel& m, ExecContext& c) {
    const auto t0 = std::chrono::steady_clock::now();
    m.run(c, inputs);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int i = 0; i < runs; ++i) {
    ta.push_back(timed(a, ca));
    tb.push_back(timed(b, cb));
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

}  // namespace detail::bf16_bound

// Compiles `graph` with Precision::Bf16, keeping nodes float32 until the outputs on `samples` are within
// bo.max_error of the float32 compile's (see the header comment).
inline Bf16BoundResult compile_bf16_within(const Graph& graph, CompileOptions options,
                                           const std::vector<std::map<std::string, Tensor>>& samples,
                                           const Bf16BoundOptions& bo = {}) {
  using detail::bf16_bound::run_all;
  if (samples.empty()) throw Error("the bf16 error bound needs at least one sample to measure the error on");
  if (!(bo.max_error >= 0.0) || !std::isfinite(bo.max_error))
    throw Error("the error bound must be a finite number >= 0, got " + std::to_string(bo.max_error));
  // A compile that may become the result: with packings of its own when the caller keeps them.
  auto compile_candidate = [&](CompileOptions o, std::shared_ptr<PackedWeights>& packed) {
    if (bo.keep_packings && !o.packed_weights) o.packed_weights = std::make_shared<PackedWeights>();
    packed = o.packed_weights;
    return compile(graph, o);
  };
  CompileOptions fp32 = options;
  fp32.precision = Precision::Fp32;
  std::shared_ptr<PackedWeights> fp32_packed;
  if (options.precision == Precision::Auto && resolved_precision(options.precision) == Precision::Fp32) {
    Bf16BoundResult r{compile_candidate(fp32, fp32_packed), {}, {}, 0.0, 0.0, true, 0.0, 0.0, false, nullptr};
    r.packed = fp32_packed;
    return r;
  }
  const bool automatic = options.precision == Precision::Auto;
  CompiledModel fp32_model = compile_candidate(fp32, fp32_packed);
  const SampleOutputs reference = run_all(fp32_model, samples);
  options.precision = Precision::Bf16;
  const std::vector<std::string> user_kept = options.keep_fp32;

  std::shared_ptr<PackedWeights> packed;
  Bf16BoundResult r{compile_candidate(options, packed), {}, {}, 0.0, 0.0, false, 0.0, 0.0, false, nullptr};
  r.packed = packed;
  r.error = r.initial_error = output_error(graph, reference, run_all(r.model, samples));
  if (r.error > bo.max_error) {
    const std::vector<std::string> candidates = r.model.bf16_nodes();
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      if (bo.progress)
        bo.progress("ranking " + std::to_string(i + 1) + "/" + std::to_string(candidates.size()) + " '" +
                    candidates[i] + "'");
      CompileOptions alone = options;
      for (std::size_t j = 0; j < candidates.size(); ++j)
        if (j != i) alone.keep_fp32.push_back(candidates[j]);
      r.ranking.emplace_back(candidates[i], output_error(graph, reference, run_all(compile(graph, alone), samples)));
    }
    std::stable_sort(r.ranking.begin(), r.ranking.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
  }
  keep_worst_first(
      r.ranking.size(), bo.max_error, bo.max_fallbacks, r.error,
      [&](std::size_t i) {
        r.kept.push_back(r.ranking[i].first);
        options.keep_fp32 = user_kept;
        options.keep_fp32.insert(options.keep_fp32.end(), r.kept.begin(), r.kept.end());
        r.model = compile_candidate(options, r.packed);
        return output_error(graph, reference, run_all(r.model, samples));
      },
      [&](std::size_t i, double before, double after) {
        if (bo.progress)
          bo.progress("fallback " + std::to_string(r.kept.size()) + ": '" + r.ranking[i].first + "' fp32, error " +
                      std::to_string(before) + " -> " + std::to_string(after));
      });
  r.met = r.error <= bo.max_error;
  // Auto picks the faster precision that keeps the bound (bf16 is not faster everywhere: depthwise
  // convolutions, squeeze-and-excitation and element-wise work gain nothing from it and pay conversions).
  if (automatic) {
    if (bo.progress) bo.progress("timing bf16 against fp32");
    std::tie(r.bf16_ms, r.fp32_ms) = detail::bf16_bound::time_both(r.model, fp32_model, samples.front());
    if (!r.met || r.bf16_ms > r.fp32_ms * (1.0 - kAutoMinGain)) {
      r.model = std::move(fp32_model);
      r.packed = fp32_packed;
      r.chose_fp32 = true;
    }
  }
  return r;
}

}  // namespace ondine::lower
