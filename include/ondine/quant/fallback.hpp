// SPDX-License-Identifier: Apache-2.0
// ondine/quant/fallback.hpp - quantization under an error bound: quantize, measure the output error
// against fp32 on a few samples, and while it exceeds the bound keep one more layer in fp32, worst first.
//
//   quant::FallbackOptions fo;
//   fo.max_error = 0.02;
//   auto r = quant::quantize_with_fallback(g, calib, qopts, samples, fo);   // g: the calibrated fp32 graph
//   r.graph, r.report       the QDQ graph and the quantize pass's report (fallback layers listed as kept)
//   r.steps                 the layers kept fp32, in order, with the error before and after each
//   r.initial_error, r.error, r.met
//
// The error (output_error): for each float output, max |q - f| over every element of every sample,
// divided by max |f| over the same; the largest over the outputs. max_error 0.02 thus means no output
// element is off by more than 2% of that output's largest magnitude (for logits: of the largest
// |logit|) on these samples. NaN anywhere counts as +inf; an output that is all zero in fp32 counts
// 0 when q matches it exactly, else +inf.
//
// Worst first (layer_sensitivity): for each quantized node, the fp32 graph is run with only that node
// int8 (its input Q/DQ, int8 weight and int32 bias; the node taken from the QDQ graph), and the SQNR
// of the outputs against fp32 is that layer's sensitivity: the error it alone adds where it counts.
// Only the nodes after it are recomputed, from the kept fp32 values. Lowest SQNR first (the worst
// output's; ties: graph order). The cheaper rankings fall short on MobileNetV2: `ondine compare
// --per-layer`'s SQNR of a value includes the error of every layer above it, so its worst are the
// deepest layers (features.15 to 18), and keeping those fp32 leaves the upstream error where it was;
// the node's own output SQNR ignores what the layers after it make of its error, and needed 6 layers
// fp32 to bring the error under 0.04 where this needs 4.
// Each step keeps its layer fp32 even when the error did not drop (a max over noisy differences can
// rise a little), so the steps are monotone and, without max_fallbacks, end at the latest with every
// layer fp32: the fp32 graph itself, error 0.
//
// Cost, on the reference executor: the ranking, on FallbackOptions::ranking_samples (2) samples, takes
// per sample one fp32 run and, per quantized layer, the part of the graph after it (about half a run
// each on a chain); then one fp32 run per sample and one QDQ run per sample per step.
// The calibration is reused as it is: the params of the layers still quantized do not change.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/error_bound.hpp"
#include "ondine/ir/graph.hpp"
#include "ondine/passes/pass.hpp"
#include "ondine/quant/calibration.hpp"
#include "ondine/quant/qdq.hpp"
#include "ondine/reference/executor.hpp"

namespace ondine::quant {

// One quantized node and how much its quantization alone costs at the graph outputs.
struct LayerSensitivity {
  std::string node, op;
  std::string output;  // its first output: names the node exactly (node names may repeat)
  double sqnr_db = std::numeric_limits<double>::infinity();  // outputs with only this node int8 vs fp32
};

// One layer the fallback kept fp32.
struct FallbackStep {
  LayerSensitivity layer;
  double error_before = 0.0, error_after = 0.0;
};

struct FallbackOptions {
  // The bound on output_error(); finite and >= 0.
  double max_error = 0.01;
  // Keep at most this many layers fp32 (0: no limit); when reached first, the result is not met.
  std::size_t max_fallbacks = 0;
  // Rank the layers on the first this many samples (0: all). The ranking is an energy over every
  // output element and settles fast: on MobileNetV2 2 samples give the same first 8 layers as 8 do,
  // at a quarter of the time (the ranking is the costly part).
  std::size_t ranking_samples = 2;
  // Called after each step with its 1-based number.
  std::function<void(std::size_t step, const FallbackStep&)> progress;
  // Names sample i (0-based) in error messages, e.g. its file.
  std::function<std::string(std::size_t index)> sample_label;
};

struct FallbackResult {
  Graph graph;           // the QDQ graph of the last step (of the first quantization when no step)
  QuantizeReport report;
  std::vector<LayerSensitivity> ranking;  // every quantized node of the first quantization, worst first
  std::vector<FallbackStep> steps;
  double initial_error = 0.0, error = 0.0;
  bool met = false;
};

// output_error() and SampleOutputs live in ir/error_bound.hpp, shared with the bf16 bound (lower/).
using ::ondine::output_error;
using ::ondine::SampleOutputs;

namespace detail::fallback {

inline std::vector<Tensor> run_kernel(const Node& n, const std::vector<Tensor>& args) {
  std::vector<Tensor> outs;
  try {
    outs = reference::kernel_table().at(n.op_key())(n, args);
  } catch (Error& e) {
    if (e.node().empty() && e.op().empty()) e.at_node(n.name(), n.op_type());
    throw;
  } catch (const std::exception& e) {
    throw n.error(e.what());
  }
  if (outs.size() < n.num_outputs()) throw n.error("kernel returned too few outputs");
  return outs;
}

// The quantized nodes of `qdq`: those reading a DequantizeLinear output whose first output is a float
// value of the fp32 graph too.
inline std::vector<const Node*> quantized_nodes(const Graph& qdq, const Graph& fp32) {
  std::vector<const Node*> out;
  for (Node* n : qdq.topo_order()) {
    if (n->op_key() == "QuantizeLinear" || n->op_key() == "DequantizeLinear" || !n->num_outputs() || !n->output(0))
      continue;
    bool reads_dq = false;
    for (Value* in : n->inputs())
      reads_dq = reads_dq || (in && in->producer() && in->producer()->op_key() == "DequantizeLinear");
    Value* f = fp32.find_value(n->output(0)->name());
    if (reads_dq && f && f->producer()) out.push_back(n);
  }
  return out;
}

// One sample's fp32 values (every value by name, from a keep_all run), and what becomes of the graph
// outputs when one node's output is replaced.
class Sensitivity {
 public:
  Sensitivity(const Graph& fp32, std::map<std::string, Tensor> values)
      : fp32_(fp32), order_(fp32.topo_order()), values_(std::move(values)) {
    for (std::size_t i = 0; i < order_.size(); ++i) position_[order_[i]] = i;
  }

  // Node n of the QDQ graph run alone: its inputs computed from the fp32 values, so its own input
  // Q/DQ, int8 weight and int32 bias are all the quantization it sees. Q/DQ outputs are kept.
  Tensor quantized_output(const Node& n) {
    std::vector<Tensor> args;
    for (const Value* in : n.inputs()) args.push_back(value(in));
    return run_kernel(n, args).at(0);
  }

  // The fp32 graph's outputs with value `name` replaced by `t`: only what depends on it is recomputed.
  std::map<std::string, Tensor> outputs_with(const std::string& name, const Tensor& t) {
    std::unordered_map<const Value*, Tensor> changed;
    const Value* v = fp32_.find_value(name);
    changed[v] = t;
    for (std::size_t i = position_.at(v->producer()) + 1; i < order_.size(); ++i) {
      const Node* n = order_[i];
      bool reads = false;
      for (const Value* in : n->inputs()) reads = reads || (in && changed.count(in));
      if (!reads) continue;
      std::vector<Tensor> args;
      for (const Value* in : n->inputs())
        args.push_back(!in ? Tensor() : changed.count(in) ? changed.at(in) : fp32_value(in));
      auto outs = run_kernel(*n, args);
      for (std::size_t k = 0; k < n->num_outputs(); ++k)
        if (n->output(k)) changed[n->output(k)] = outs[k];
    }
    std::map<std::string, Tensor> out;
    for (const Value* o : fp32_.outputs()) out[o->name()] = changed.count(o) ? changed.at(o) : fp32_value(o);
    return out;
  }

  std::map<std::string, Tensor> fp32_outputs() const {
    std::map<std::string, Tensor> out;
    for (const Value* o : fp32_.outputs()) out[o->name()] = fp32_value(o);
    return out;
  }

 private:
  Tensor fp32_value(const Value* v) const {
    if (v->is_constant()) return v->constant();
    auto it = values_.find(v->name());
    if (it == values_.end()) throw Error("layer sensitivity: no fp32 value '" + v->name() + "'");
    return it->second;
  }

  // A value of the QDQ graph: fp32 by name (the quantize pass keeps every original name), else
  // computed from its producer (a Q or DQ node) and kept.
  Tensor value(const Value* v) {
    if (!v) return Tensor();
    if (v->is_constant()) return v->constant();
    if (auto it = values_.find(v->name()); it != values_.end()) return it->second;
    if (auto it = made_.find(v); it != made_.end()) return it->second;
    const Node* p = v->producer();
    if (!p) throw Error("layer sensitivity: value '" + v->name() + "' is neither an fp32 value nor computed");
    std::vector<Tensor> args;
    for (const Value* in : p->inputs()) args.push_back(value(in));
    auto outs = run_kernel(*p, args);
    for (std::size_t i = 0; i < p->num_outputs(); ++i) made_[p->output(i)] = outs[i];
    return made_.at(v);
  }

  const Graph& fp32_;
  std::vector<Node*> order_;
  std::unordered_map<const Node*, std::size_t> position_;
  std::map<std::string, Tensor> values_;
  std::unordered_map<const Value*, Tensor> made_;
};

// The ranking (see layer_sensitivity()).
inline std::vector<LayerSensitivity> rank(const Graph& fp32, const Graph& qdq, const std::vector<Sample>& samples) {
  ReferenceExecutor exec(fp32);
  auto layers = quantized_nodes(qdq, fp32);
  // Per layer, per float output: sum of fp32^2 and of (changed - fp32)^2 over the samples.
  std::vector<std::map<std::string, std::pair<double, double>>> energy(layers.size());
  for (const Sample& s : samples) {
    Sensitivity sens(fp32, exec.run(s, /*keep_all=*/true));
    auto reference = sens.fp32_outputs();
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const std::string& name = layers[l]->output(0)->name();
      auto outs = sens.outputs_with(name, sens.quantized_output(*layers[l]));
      for (auto& [o, f] : reference) {
        const Tensor& q = outs.at(o);
        if (f.dtype() != DType::Float32 || q.dtype() != DType::Float32 || f.dims() != q.dims()) continue;
        auto& [signal, noise] = energy[l][o];
        const float* a = f.data<float>();
        const float* b = q.data<float>();
        for (std::int64_t i = 0; i < f.numel(); ++i) {
          double d = static_cast<double>(b[i]) - a[i];
          signal += static_cast<double>(a[i]) * a[i];
          noise += d * d;
        }
      }
    }
  }
  constexpr double inf = std::numeric_limits<double>::infinity();
  std::vector<LayerSensitivity> out;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    double worst = inf;  // the worst output's SQNR
    for (auto& [o, e] : energy[l]) {
      auto [signal, noise] = e;
      double db = std::isnan(noise) ? std::numeric_limits<double>::quiet_NaN()
                  : noise == 0      ? inf
                  : signal == 0     ? -inf
                                    : 10.0 * std::log10(signal / noise);
      if (std::isnan(db) || db < worst) worst = db;
      if (std::isnan(worst)) break;
    }
    out.push_back({layers[l]->name(), layers[l]->op_type(), layers[l]->output(0)->name(), worst});
  }
  // Worst first; NaN (a non-finite value) before everything; ties keep graph order.
  auto key = [](const LayerSensitivity& l) { return std::isnan(l.sqnr_db) ? -inf : l.sqnr_db; };
  std::stable_sort(out.begin(), out.end(), [&](auto& a, auto& b) { return key(a) < key(b); });
  return out;
}

inline SampleOutputs run_all(const Graph& g, const std::vector<Sample>& samples) {
  ReferenceExecutor exec(g);
  SampleOutputs out;
  for (const Sample& s : samples) out.push_back(exec.run(s));
  return out;
}

}  // namespace detail::fallback

// The quantized nodes of `qdq` (nodes reading a DequantizeLinear output whose first output `fp32`
// also computes), worst first by the output SQNR with only that node int8 (see the header comment),
// over `samples`. `qdq` is `fp32` after the quantize pass.
inline std::vector<LayerSensitivity> layer_sensitivity(const Graph& fp32, const Graph& qdq,
                                                       const std::vector<Sample>& samples) {
  return detail::fallback::rank(fp32, qdq, samples);
}

// Quantizes a copy of `fp32` with `calib` and `options`, then keeps layers fp32 one at a time, worst
// first, until output_error() on `samples` is at most fo.max_error (see the header comment).
inline FallbackResult quantize_with_fallback(const Graph& fp32, const CalibrationResult& calib,
                                             const QuantizeOptions& options, const std::vector<Sample>& samples,
                                             const FallbackOptions& fo = {}) {
  if (!(fo.max_error >= 0.0) || !std::isfinite(fo.max_error))
    throw Error("the error bound must be a finite number >= 0, got " + std::to_string(fo.max_error));
  if (samples.empty()) throw Error("the error bound needs at least one sample to measure the error on");
  // Checked up front, like calibration samples, so a bad one is named before any work.
  for (std::size_t i = 0; i < samples.size(); ++i) {
    try {
      check_inputs(fp32, samples[i]);
      for (auto& [name, t] : samples[i]) detail::check_finite_input(name, t);
    } catch (const Error& e) {
      std::string label = fo.sample_label ? " ('" + fo.sample_label(i) + "')" : "";
      detail::rethrow_with_prefix(e, "error-bound sample " + std::to_string(i + 1) + label + ": ");
    }
  }
  std::map<std::string, std::size_t> fallback;  // first output -> step number
  QuantizeOptions opts = options;
  opts.keep_fp32 = [&, user = options.keep_fp32](const Node& n) -> std::optional<std::string> {
    if (user)
      if (auto why = user(n)) return why;
    if (n.num_outputs() && n.output(0))
      if (auto it = fallback.find(n.output(0)->name()); it != fallback.end())
        return "kept fp32 for the error bound (fallback " + std::to_string(it->second) + ")";
    return std::nullopt;
  };
  auto quantize = [&](FallbackResult& r) {
    r.graph = fp32.clone();
    r.report = quantize_qdq(r.graph, calib, opts);
  };

  FallbackResult r;
  quantize(r);
  SampleOutputs reference = detail::fallback::run_all(fp32, samples);
  auto ranked = static_cast<std::ptrdiff_t>(fo.ranking_samples ? std::min(fo.ranking_samples, samples.size())
                                                                : samples.size());
  r.ranking = layer_sensitivity(fp32, r.graph, std::vector<Sample>(samples.begin(), samples.begin() + ranked));
  r.error = r.initial_error = output_error(fp32, reference, detail::fallback::run_all(r.graph, samples));
  keep_worst_first(
      r.ranking.size(), fo.max_error, fo.max_fallbacks, r.error,
      [&](std::size_t i) {
        fallback[r.ranking[i].output] = fallback.size() + 1;
        quantize(r);
        return output_error(fp32, reference, detail::fallback::run_all(r.graph, samples));
      },
      [&](std::size_t i, double before, double after) {
        r.steps.push_back(FallbackStep{r.ranking[i], before, after});
        if (fo.progress) fo.progress(r.steps.size(), r.steps.back());
      });
  r.met = r.error <= fo.max_error;
  return r;
}

}  // namespace ondine::quant
