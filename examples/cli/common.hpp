// SPDX-License-Identifier: Apache-2.0
// What inspect, run, compile and bench share: reading a model file, the pipeline, the precision options
// main() sets, int8 quantization of a float model, the --check bound and the output comparison.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ondine/lower/artifact.hpp"
#include "ondine/lower/lower.hpp"
#include "ondine/ondine.hpp"
#include "inputs.hpp"
#include "quantize.hpp"

namespace ondine::cli {

namespace fs = std::filesystem;

// A model file as the commands take it: ONNX, or a compiled artifact (`ondine compile -o MODEL.ondine`),
// whose passes ran when it was compiled: for it the pipeline is off, and --passes other than none is a
// usage error.
struct ModelFile {
  Graph graph;
  std::optional<artifact::Info> artifact;        // the variant chosen for this CPU
  std::vector<artifact::Info> variants;          // all of them
  std::size_t variant = 0;
  std::shared_ptr<lower::PackedWeights> packed;  // an artifact's packed weights, preloaded
  std::size_t packings = 0;
  std::map<std::string, std::int64_t> packing_dims;
  double load_ms = 0;
  std::shared_ptr<artifact::PendingWeightCheck> weights_checked;  // WeightCheck::Background: pending
  // Waits for the pending checksum (a damaged file throws); the wait is added to `compile_ms`.
  void wait_checked(double& compile_ms) {
    if (!weights_checked) return;
    const auto t0 = std::chrono::steady_clock::now();
    std::shared_ptr<artifact::PendingWeightCheck> pending = std::move(weights_checked);
    pending->wait();
    compile_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
};
// `describe_only` (inspect): an artifact with no variant for this CPU, or from another oneDNN, is read
// anyway (its first variant), to be described, not run.
inline ModelFile load_model_file(const std::string& path, bool describe_only = false,
                                 artifact::WeightCheck check = artifact::WeightCheck::Now) {
  ModelFile m;
  auto t0 = std::chrono::steady_clock::now();
  if (artifact::is_artifact(path)) {
    artifact::Artifact a = describe_only ? artifact::read(path, [](const std::vector<artifact::Info>& variants) {
      try {
        return lower::choose_variant(variants);
      } catch (const Error&) {
        return std::size_t{0};
      }
    }) : lower::load_artifact(path, check);
    m.weights_checked = a.weights_checked;
    m.packed = lower::preload_packings(a);
    m.packings = a.packings.size();
    m.packing_dims = a.packing_dims;
    m.graph = std::move(a.graph);
    m.artifact = a.info;
    m.variants = a.variants;
    m.variant = a.variant;
  } else {
    m.graph = ondine::onnx::load_model(path);
  }
  m.load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return m;
}
// The pipeline to compile `m` with: an artifact's is "none".
inline std::string pipeline_of(const ModelFile& m, const std::string& passes, bool passes_given) {
  if (!m.artifact) return passes;
  if (passes_given && passes != "none")
    throw Error("--passes " + passes + ": an artifact's passes ran when it was compiled (" + m.artifact->passes +
                "); compile the ONNX model with other passes instead");
  return "none";
}
// What `inspect` and `run` say about an artifact: the variant chosen, and how many there are.
inline std::string artifact_summary(const artifact::Info& a, std::size_t variants = 1) {
  std::ostringstream os;
  os << "artifact format " << a.format_version << ", compiled from " << (a.source.empty() ? "?" : a.source)
     << " by Ondine " << a.ondine_version << " with oneDNN " << a.onednn_version << "; running its variant for "
     << a.isa << (variants > 1 ? " (of " + std::to_string(variants) + ")" : std::string()) << ", " << a.precision
     << (a.keep_fp32.empty() ? "" : " (" + std::to_string(a.keep_fp32.size()) + " kept fp32)")
     << (a.requires_vnni ? " (needs VNNI)" : "") << (a.tuned.empty() ? "" : ", tuned " + a.tuned) << ", threads "
     << (a.threads > 0 ? std::to_string(a.threads) : std::string("default")) << ", passes "
     << (a.passes.empty() ? "none" : a.passes) << "; " << a.file_bytes << " bytes, weights " << a.weight_bytes
     << " bytes mapped";
  return os.str();
}

// The weights an artifact's load packed again, which step asked and why (the first `max`).
inline void print_repacks(const lower::PackedWeights& packed, std::size_t max = 8) {
  const auto repacks = packed.repacks();
  for (std::size_t i = 0; i < std::min(repacks.size(), max); ++i)
    std::cout << "  repacked: " << (repacks[i].step.empty() ? std::string("?") : repacks[i].step) << ": "
              << repacks[i].reason << "\n";
  if (repacks.size() > max) std::cout << "  repacked: ... " << repacks.size() - max << " more\n";
}

// A mistake on the command line that CLI11 cannot see (an unknown pass name): exit code 2.
struct UsageError : Error {
  using Error::Error;
};

// The pass manager for --passes, checked before any model is read.
inline PassManager pipeline_for(const std::string& passes, PassManager::Options options = {}) {
  try {
    return make_pass_manager(passes, std::move(options));
  } catch (const Error& e) {
    throw UsageError("--passes '" + passes + "': " + e.message());
  }
}

inline std::map<std::string, std::int64_t> parse_dims(const std::vector<std::string>& specs) {
  std::map<std::string, std::int64_t> out;
  for (auto& s : specs) {
    auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) throw Error("--dim expects NAME=SIZE, got '" + s + "'");
    try {
      out[s.substr(0, eq)] = std::stoll(s.substr(eq + 1));
    } catch (const std::exception&) {
      throw Error("--dim expects NAME=SIZE with an integer size, got '" + s + "'");
    }
  }
  return out;
}

inline std::string human(double v, const char* unit) {
  const char* prefix[] = {"", "K", "M", "G", "T"};
  int i = 0;
  while (std::abs(v) >= 1000 && i < 4) {
    v /= 1000;
    ++i;
  }
  std::ostringstream os;
  os << std::fixed << std::setprecision(i ? 2 : 0) << v << " " << prefix[i] << unit;
  return os.str();
}

// Op counts keyed by Node::op_key(), so Ondine's own ops show as "ondine.FusedConv".
inline std::map<std::string, std::size_t> op_key_histogram(const Graph& g) {
  std::map<std::string, std::size_t> h;
  for (Node* n : g.nodes()) ++h[n->op_key()];
  return h;
}

// How a pipeline is named in output: "default", "none", or the passes it runs.
inline std::string passes_label(const std::string& passes) {
  std::string expanded = expand_pipeline(passes);
  if (expanded.empty()) return "none";
  return expanded == default_pipeline() ? "default" : expanded;
}

inline std::string summary(const Tensor& t) {
  std::ostringstream os;
  os << dtype_name(t.dtype()) << dims_str(t.dims());
  if (t.numel() == 0 || t.dtype() == DType::String) return os.str();
  double lo = INFINITY, hi = -INFINITY, sum = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    double v = t.at_double(static_cast<std::size_t>(i));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
  }
  os << std::setprecision(6) << "  min " << lo << "  max " << hi << "  mean " << sum / static_cast<double>(t.numel())
     << "  first [";
  for (std::int64_t i = 0; i < std::min<std::int64_t>(t.numel(), 5); ++i)
    os << (i ? ", " : "") << t.at_double(static_cast<std::size_t>(i));
  os << (t.numel() > 5 ? ", ...]" : "]");
  return os.str();
}

// Largest |a-b| over the outputs, absolute and relative to max|b|.
struct Difference {
  double max_abs = 0, max_ref = 0;
  double relative() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
};
inline Difference difference(const Tensor& a, const Tensor& b) {
  Difference d;
  for (std::int64_t i = 0; i < b.numel(); ++i) {
    double x = a.at_double(static_cast<std::size_t>(i)), y = b.at_double(static_cast<std::size_t>(i));
    d.max_abs = std::max(d.max_abs, std::abs(x - y));
    d.max_ref = std::max(d.max_ref, std::abs(y));
  }
  return d;
}

// --check's bound per output: `relative` of max |reference|, or `steps` quantization steps of the output
// where a DequantizeLinear produces it, whichever is larger. --tolerance T sets `relative` to T and
// nothing else. By default a float model gets 1e-4 (float reassociation); a model with int8 parts 10%:
// oneDNN requantizes with its own rounding (float32 scales, its own ties), so an int8 value may differ
// from the reference's by a step, and later layers spread that. Measured, compiled against reference,
// 20 real inputs each: ResNet-50 QDQ 1.1 to 3.0% of max |logit|, MobileNetV2 QDQ up to 2.4% (4.4% while
// its linear bottlenecks skipped a rounding, lower/detail/quantized.hpp), the MNIST QDQ model 1e-7. 10%
// leaves a margin for deeper models; a lowering bug is off by far more (oneDNN 2.6's mishandled sum + clip
// in those linear bottlenecks: 100% and more).
struct CheckBound {
  double relative = 1e-4;
  double steps = 0;                           // 0: no step floor
  std::map<std::string, double> output_step;  // output -> the scale of the DequantizeLinear producing it
  std::string rule, why;                      // "10% of max |reference|", and why that bound
  // The bound on max |got - want| (relative to 1 where the reference is all zeros).
  double relative_part(double max_ref) const { return relative * (max_ref > 0 ? max_ref : 1.0); }
  double absolute(const std::string& output, double max_ref) const {
    auto it = output_step.find(output);
    return std::max(relative_part(max_ref), it == output_step.end() ? 0.0 : steps * it->second);
  }
};

// Nodes of the int8 kind: Q/DQ, the QOperator and integer ops, Ondine's fused int8 ops.
inline std::size_t quantized_nodes(const Graph& g) {
  static const std::set<std::string> ops{"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ConvInteger",
                                         "MatMulInteger"};
  std::size_t n = 0;
  for (Node* node : g.nodes()) {
    const std::string key = node->op_key();
    n += ops.count(key) || key.rfind("QLinear", 0) == 0 || key.rfind("ondine.Q", 0) == 0;
  }
  return n;
}

// The compile log's precision summary ("precision: bf16 in ..."), kept for the report: the last summary, and
// the note after it ("precision: note: bf16 is slower than fp32 on this CPU ...") on a line of its own.
inline void keep_precision_line(std::string& kept, const std::string& line) {
  if (line.rfind("precision: note: ", 0) == 0)
    kept += (kept.empty() ? "" : "\n") + line;
  else if (line.rfind("precision: ", 0) == 0)
    kept = line;
}

// --precision and --keep-fp32 of run, bench, inspect and compile (lower::CompileOptions::precision, keep_fp32).
inline lower::Precision g_precision = lower::Precision::Fp32;
inline bool g_precision_given = false;  // --precision on the command line (else an artifact's own applies)
inline bool g_int8 = false;             // --precision int8 (g_precision is then Fp32: the float layers' precision)
// --exact-int8-weights: without VNNI, QDQ layers with 8-bit weights stay float (CompileOptions::int8_7bit_weights).
inline bool g_exact_int8_weights = false;
// --exact-weight-only: weight-only layers (4/8-bit weights) take float32 activations, the file's own arithmetic,
// instead of int8 per block (CompileOptions::weight_only_int8_activations).
inline bool g_exact_weight_only = false;
inline bool g_tune = false;  // --tune: time the compiler's alternatives here (lower/tune.hpp) and keep the fastest
inline std::vector<std::string> g_keep_fp32;

// The precision as the command line names it (int8 is fp32 for the float layers).
inline std::string precision_label() { return g_int8 ? "int8" : lower::precision_name(g_precision); }

// --precision int8 names what a quantized model runs anyway (its int8 layers in int8, the rest fp32) and
// refuses a model without int8 layers instead of running it in fp32 unnoticed.
inline void check_int8_model(const Graph& g, const std::string& path) {
  if (!g_int8 || quantized_nodes(g) > 0 || lower::has_int8_layers(g)) return;
  throw Error("--precision int8: the model has no quantized layers (no Q/DQ pairs, QLinear or integer ops): give "
              "--calib DIR (samples to calibrate on: it is quantized here, as `ondine quantize MODEL --calib DIR -o "
              "MODEL.int8.onnx` does; docs/quantization.md) "
              "or `ondine compile MODEL --passes default,quantize-dynamic -o MODEL.dyn.onnx` (dynamic int8 matrix "
              "products); --precision auto runs a quantized model's float layers in bf16 where the CPU has it")
      .in_file(path);
}

// The kernel choices an artifact compiled with --tune stores (Info::tuned): tool_compile_options applies them
// where no option set the same choice.
inline std::string g_artifact_tuned;
// An artifact runs in the precision it was compiled in (its variant's label and float32 nodes) unless
// --precision says otherwise; then its bf16 or fp32 weights are packed again at load. Its tuned choices too.
inline void adopt_artifact_precision(const ModelFile& file) {
  if (file.artifact) g_artifact_tuned = file.artifact->tuned;
  if (!file.artifact || g_precision_given) return;
  g_precision = lower::artifact_precision(*file.artifact);
  g_keep_fp32.insert(g_keep_fp32.end(), file.artifact->keep_fp32.begin(), file.artifact->keep_fp32.end());
}
// --conv-layout of run and bench (lower::CompileOptions::conv_layout).
inline lower::ConvLayout g_conv_layout = lower::ConvLayout::Auto;
// --conv-algorithm of run and bench (lower::CompileOptions::conv_algorithm).
inline lower::ConvAlgorithm g_conv_algorithm = lower::ConvAlgorithm::Auto;
// --matmul-kernel of run and bench (lower::CompileOptions::matmul_kernel).
inline lower::MatMulKernel g_matmul_kernel = lower::MatMulKernel::Auto;
// --max-error with --precision bf16: the bound on the outputs against fp32 (lower/error_bound.hpp).
inline std::optional<double> g_max_error;

// --calib DIR of run, bench and compile: with --precision int8, a float model is quantized on DIR's samples
// before it compiles (quantize_for_int8).
inline std::string g_calib_dir;

// --precision int8 --calib DIR on a float model: static int8 as `ondine quantize MODEL --calib DIR` makes it
// (fp32 pre-passes, calibration, Q/DQ; with --max-error the fallback keeps layers fp32, worst first, until
// the outputs are within the bound of fp32's on the samples), here in memory; the QDQ graph then compiles as
// a quantized model does. Weights are 8-bit for a target with VNNI, 7-bit without (`--reduce-range`: oneDNN
// multiplies 8-bit weights exactly only with VNNI, so Ondine would run those layers fp32; said so). A model
// that is quantized already ignores --calib (said on stderr). Then as check_int8_model.
inline ondine::cli::QuantizeArgs int8_quantize_args(const std::string& path) {
  ondine::cli::QuantizeArgs q;
  q.model = path;
  q.calib_dir = g_calib_dir;
  q.max_error = g_max_error;
  return q;
}

inline bool needs_quantizing(const Graph& g, const std::string& path) {
  if (!g_int8 || g_calib_dir.empty()) return false;
  if (quantized_nodes(g) == 0 && !lower::has_int8_layers(g)) return true;
  std::cerr << "note: " << path << " is quantized already: --calib " << g_calib_dir << " not used\n";
  return false;
}

inline void say_weight_width(const lower::IsaInfo& target) {
  if (!target.int8_vnni)
    std::cout << "int8:        7-bit weights for " << target.name << " (no VNNI: oneDNN multiplies 8-bit weights "
              << "exactly only with VNNI, and Ondine would run those layers fp32)\n";
}

inline void quantize_for_int8(Graph& g, const std::string& path, const lower::IsaInfo& target) {
  if (needs_quantizing(g, path)) {
    ondine::cli::QuantizeArgs q = int8_quantize_args(path);
    q.reduce_range = !target.int8_vnni;
    say_weight_width(target);
    try {
      ondine::cli::quantize_graph(g, q);
    } catch (const ondine::cli::QuantizeUsageError& e) {
      throw UsageError(e.message());
    }
    return;
  }
  check_int8_model(g, path);
}

inline CheckBound check_bound(const Graph& g, std::optional<double> given) {
  CheckBound b;
  std::ostringstream rule;
  if (given) {
    b.relative = *given;
    rule << std::scientific << std::setprecision(2) << *given << " of max |reference|";
    b.why = "(--tolerance)";
  } else if (std::size_t q = quantized_nodes(g)) {
    b.relative = 0.1;
    b.steps = 2;
    for (Value* o : g.outputs()) {
      Node* p = o->producer();
      if (p && p->op_type() == "DequantizeLinear" && p->input(1) && p->input(1)->is_constant()) {
        const Tensor& scale = p->input(1)->constant();
        double most = 0;
        for (std::int64_t i = 0; i < scale.numel(); ++i) most = std::max(most, scale.at_double(static_cast<std::size_t>(i)));
        b.output_step[o->name()] = most;
      }
    }
    rule << "10% of max |reference|" << (b.output_step.empty() ? "" : " or 2 output quantization steps");
    b.why = "(int8 model, " + std::to_string(q) + " quantized node" + (q == 1 ? "" : "s") +
            ": oneDNN requantizes with its own rounding, so values may differ by a step; --tolerance T overrides)";
  } else if (lower::resolved_precision(g_precision) == lower::Precision::Bf16) {
    b.relative = 3e-2;
    rule << "3% of max |reference|";
    b.why = "(--precision bf16: 8-bit mantissas in the convolutions, matrix products and recurrent layers; "
            "--tolerance T overrides)";
  } else {
    rule << "1e-4 of max |reference|";
    b.why = "(float model; --tolerance T overrides)";
  }
  b.rule = rule.str();
  return b;
}

// Prints the bound and one line per output; throws naming the file when an output is past its bound.
inline void check_outputs(const Graph& g, const std::map<std::string, Tensor>& got,
                          const std::map<std::string, Tensor>& want, const CheckBound& bound, const std::string& path,
                          const std::string& what) {
  std::cout << "check: tolerance " << bound.rule << " " << bound.why << "\n";
  bool ok = true;
  for (Value* o : g.outputs()) {
    if (!got.count(o->name()))
      throw Error("the optimised graph has no output '" + o->name() + "' (the passes lost it)").in_file(path);
    Difference d = difference(got.at(o->name()), want.at(o->name()));
    double limit = bound.absolute(o->name(), d.max_ref);
    bool fine = d.max_abs <= limit;
    ok = ok && fine;
    std::cout << std::scientific << std::setprecision(2) << "check: " << o->name() << " max_abs_err " << d.max_abs
              << " rel_to_max " << d.relative();
    if (limit > bound.relative_part(d.max_ref))
      std::cout << " (bound: " << std::defaultfloat << bound.steps << " output steps, " << std::scientific << limit << ")";
    std::cout << (fine ? " ok" : " FAILED") << "\n";
  }
  if (!ok) throw Error(what + " by more than " + bound.rule).in_file(path);
}

inline double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

// Random inputs (seeded) for every graph input not given.
inline void fill_random_inputs(const Graph& g, std::map<std::string, Tensor>& inputs, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (Value* in : g.inputs())
    if (!inputs.count(in->name())) inputs[in->name()] = cli::random_input(*in, rng);
}

}  // namespace ondine::cli
