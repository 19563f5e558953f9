// ondine - the command-line tool.
//
//   ondine inspect MODEL [--dim batch=1] [--json] [--graph] [--dot FILE] [--compiled] [--passes P]
//   ondine compile MODEL [--passes P] [--print-passes] [--dump-after NAME] [--dot] [-o OUT.onnx] [--check]
//                  [--dim batch=1] [--seed N] [--tolerance T] [--target native,avx2 (with -o OUT.ondine)]
//   ondine run MODEL [--input NAME=FILE.npy]... [--dim batch=8] [--output-dir DIR] [--seed N] [--runs N]
//              [--threads N] [--reference] [--check] [--tolerance T] [--passes P]
//              [--precision fp32|bf16 [--keep-fp32 GLOB]... [--max-error E]] [--profile]
//   ondine bench MODEL [--batch 1,8] [--dim NAME] [--threads N] [--warmup N] [--runs N] [--json FILE] [--reference]
//                [--passes P] [--precision fp32|bf16 [--keep-fp32 GLOB]... [--max-error E]] [--profile]
//   ondine bench MODEL --dim NAME=LO:HI [--dim NAME=SIZE]... [--shape-plan auto|per-shape|shape-free] ...
//   ondine bench MODEL --decode STEPS [--dim SEQ=N] [--batch B] [--shape-plan ...] ...
//   ondine compare A.onnx B.onnx [--input FILE.npy]... [--seed N] [--per-layer] [--json] [--compiled]
//   ondine quantize MODEL --calib DIR -o OUT.onnx [--method M] [--max-samples N] [--exclude ..] [--include ..]
//                   [--keep-fp32-ends] [--activations u8|s8] [--save-calibration FILE] [--passes P]
//
// P is a pipeline string: "default" (the default pipeline), "none", or pass names ("fold-bn,fuse*").
// Errors go to stderr with exit code 1 (2 for bad command lines, a bad pipeline included), as one line
// of printable text first ("ondine: error: ...", names from the file escaped as \xNN); an exception
// that escapes everything else (one thrown on a worker thread) exits with 70, never through abort.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <omp.h>

extern char** environ;

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ondine/lower/artifact.hpp"
#include "ondine/lower/lower.hpp"
#include "ondine/lower/shape_cache.hpp"
#include "ondine/lower/tune.hpp"
#include "ondine/ondine.hpp"
#include "cli/compare.hpp"
#include "cli/header.hpp"
#include "cli/inputs.hpp"
#include "cli/ops.hpp"
#include "cli/progress.hpp"
#include "cli/quantize.hpp"

namespace fs = std::filesystem;
using namespace ondine;

namespace {

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
};
// `describe_only` (inspect): an artifact with no variant for this CPU, or from another oneDNN, is read
// anyway (its first variant), to be described, not run.
ModelFile load_model_file(const std::string& path, bool describe_only = false) {
  ModelFile m;
  auto t0 = std::chrono::steady_clock::now();
  if (artifact::is_artifact(path)) {
    artifact::Artifact a = describe_only ? artifact::read(path, [](const std::vector<artifact::Info>& variants) {
      try {
        return lower::choose_variant(variants);
      } catch (const Error&) {
        return std::size_t{0};
      }
    }) : lower::load_artifact(path);
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
std::string pipeline_of(const ModelFile& m, const std::string& passes, bool passes_given) {
  if (!m.artifact) return passes;
  if (passes_given && passes != "none")
    throw Error("--passes " + passes + ": an artifact's passes ran when it was compiled (" + m.artifact->passes +
                "); compile the ONNX model with other passes instead");
  return "none";
}
// What `inspect` and `run` say about an artifact: the variant chosen, and how many there are.
std::string artifact_summary(const artifact::Info& a, std::size_t variants = 1) {
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
void print_repacks(const lower::PackedWeights& packed, std::size_t max = 8) {
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
PassManager pipeline_for(const std::string& passes, PassManager::Options options = {}) {
  try {
    return make_pass_manager(passes, std::move(options));
  } catch (const Error& e) {
    throw UsageError("--passes '" + passes + "': " + e.message());
  }
}

std::map<std::string, std::int64_t> parse_dims(const std::vector<std::string>& specs) {
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

std::string human(double v, const char* unit) {
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
std::map<std::string, std::size_t> op_key_histogram(const Graph& g) {
  std::map<std::string, std::size_t> h;
  for (Node* n : g.nodes()) ++h[n->op_key()];
  return h;
}

// How a pipeline is named in output: "default", "none", or the passes it runs.
std::string passes_label(const std::string& passes) {
  std::string expanded = expand_pipeline(passes);
  if (expanded.empty()) return "none";
  return expanded == default_pipeline() ? "default" : expanded;
}

std::string summary(const Tensor& t) {
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
Difference difference(const Tensor& a, const Tensor& b) {
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
std::size_t quantized_nodes(const Graph& g) {
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
lower::Precision g_precision = lower::Precision::Fp32;
bool g_precision_given = false;  // --precision on the command line (else an artifact's own applies)
bool g_int8 = false;             // --precision int8 (g_precision is then Fp32: the float layers' precision)
// --exact-int8-weights: without VNNI, QDQ layers with 8-bit weights stay float (CompileOptions::int8_7bit_weights).
bool g_exact_int8_weights = false;
bool g_tune = false;  // --tune: time the compiler's alternatives here (lower/tune.hpp) and keep the fastest
std::vector<std::string> g_keep_fp32;

// The precision as the command line names it (int8 is fp32 for the float layers).
std::string precision_label() { return g_int8 ? "int8" : lower::precision_name(g_precision); }

// --precision int8 names what a quantized model runs anyway (its int8 layers in int8, the rest fp32) and
// refuses a model without int8 layers instead of running it in fp32 unnoticed.
void check_int8_model(const Graph& g, const std::string& path) {
  if (!g_int8 || quantized_nodes(g) > 0 || lower::has_int8_layers(g)) return;
  throw Error("--precision int8: the model has no quantized layers (no Q/DQ pairs, QLinear or integer ops): give "
              "--calib DIR (samples to calibrate on: it is quantized here, as `ondine quantize MODEL --calib DIR -o "
              "MODEL.int8.onnx` does; docs/quantization.md) "
              "or `ondine compile MODEL --passes default,quantize-dynamic -o MODEL.dyn.onnx` (dynamic int8 matrix "
              "products); --precision auto runs a quantized model's float layers in bf16 where the CPU has it")
      .in_file(path);
}

// An artifact runs in the precision it was compiled in (its variant's label and float32 nodes) unless
// --precision says otherwise; then its bf16 or fp32 weights are packed again at load.
void adopt_artifact_precision(const ModelFile& file) {
  if (!file.artifact || g_precision_given) return;
  g_precision = lower::artifact_precision(*file.artifact);
  g_keep_fp32.insert(g_keep_fp32.end(), file.artifact->keep_fp32.begin(), file.artifact->keep_fp32.end());
}
// --conv-layout of run and bench (lower::CompileOptions::conv_layout).
lower::ConvLayout g_conv_layout = lower::ConvLayout::Auto;
// --conv-algorithm of run and bench (lower::CompileOptions::conv_algorithm).
lower::ConvAlgorithm g_conv_algorithm = lower::ConvAlgorithm::Auto;
// --matmul-kernel of run and bench (lower::CompileOptions::matmul_kernel).
lower::MatMulKernel g_matmul_kernel = lower::MatMulKernel::Auto;
// --max-error with --precision bf16: the bound on the outputs against fp32 (lower/error_bound.hpp).
std::optional<double> g_max_error;

// --calib DIR of run, bench and compile: with --precision int8, a float model is quantized on DIR's samples
// before it compiles (quantize_for_int8).
std::string g_calib_dir;

// --precision int8 --calib DIR on a float model: static int8 as `ondine quantize MODEL --calib DIR` makes it
// (fp32 pre-passes, calibration, Q/DQ; with --max-error the fallback keeps layers fp32, worst first, until
// the outputs are within the bound of fp32's on the samples), here in memory; the QDQ graph then compiles as
// a quantized model does. Weights are 8-bit for a target with VNNI, 7-bit without (`--reduce-range`: oneDNN
// multiplies 8-bit weights exactly only with VNNI, so Ondine would run those layers fp32; said so). A model
// that is quantized already ignores --calib (said on stderr). Then as check_int8_model.
ondine::cli::QuantizeArgs int8_quantize_args(const std::string& path) {
  ondine::cli::QuantizeArgs q;
  q.model = path;
  q.calib_dir = g_calib_dir;
  q.max_error = g_max_error;
  return q;
}

bool needs_quantizing(const Graph& g, const std::string& path) {
  if (!g_int8 || g_calib_dir.empty()) return false;
  if (quantized_nodes(g) == 0 && !lower::has_int8_layers(g)) return true;
  std::cerr << "note: " << path << " is quantized already: --calib " << g_calib_dir << " not used\n";
  return false;
}

void say_weight_width(const lower::IsaInfo& target) {
  if (!target.int8_vnni)
    std::cout << "int8:        7-bit weights for " << target.name << " (no VNNI: oneDNN multiplies 8-bit weights "
              << "exactly only with VNNI, and Ondine would run those layers fp32)\n";
}

void quantize_for_int8(Graph& g, const std::string& path, const lower::IsaInfo& target) {
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

CheckBound check_bound(const Graph& g, std::optional<double> given) {
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
void check_outputs(const Graph& g, const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& want,
                   const CheckBound& bound, const std::string& path, const std::string& what) {
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

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

// Random inputs (seeded) for every graph input not given.
void fill_random_inputs(const Graph& g, std::map<std::string, Tensor>& inputs, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (Value* in : g.inputs())
    if (!inputs.count(in->name())) inputs[in->name()] = cli::random_input(*in, rng);
}

// What runs a model: the oneDNN-compiled model, or the reference executor (the oracle). It keeps the
// compiled model and one execution context alive, so runs after the first reuse them.
struct Engine {
  std::string name;       // "compiled" or "reference"
  std::string isa;        // the compiled model's ISA; empty for the reference executor
  double compile_ms = 0;  // time lower::compile took
  std::string precision;  // the compile log's "precision: ..." line (--precision bf16), else empty
  std::function<std::map<std::string, Tensor>(const std::map<std::string, Tensor>&)> run;
  // Compiled engine only: `runs` profiled runs, then CompiledModel::profile_text.
  std::function<std::string(const std::map<std::string, Tensor>&, int runs)> profile;
};

// Whether a QDQ weight (an int8 constant read by a DequantizeLinear) exceeds 64 in magnitude.
bool has_8bit_weights(const Graph& g) {
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
std::string int8_precision_line(const Graph& g, const CompiledModel& model) {
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
std::function<void(const std::string&)> bf16_bound_progress() {
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
lower::CompileOptions tool_compile_options(int threads, const std::string& passes) {
  lower::CompileOptions opts;
  opts.threads = threads;
  opts.passes = passes;
  opts.precision = g_precision;
  opts.keep_fp32 = g_keep_fp32;
  opts.conv_layout = g_conv_layout;
  opts.conv_algorithm = g_conv_algorithm;
  opts.matmul_kernel = g_matmul_kernel;
  opts.int8_7bit_weights = !g_exact_int8_weights;  // int8 wherever this CPU can (7-bit weights without VNNI)
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
Engine make_engine(const Graph& g, bool use_reference, int threads, const std::string& passes,
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
std::vector<double> time_runs(const Engine& engine, const std::map<std::string, Tensor>& inputs, int runs,
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
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  auto i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, i ? i - 1 : 0)];
}

// The process's peak resident set so far (Linux reports ru_maxrss in KiB).
double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

// What compile() made of the model: ISA, every step with oneDNN's implementation, the memory plan.
void print_compiled(const Graph& bound, int threads, const std::string& passes) {
  auto t0 = std::chrono::steady_clock::now();
  lower::CompileOptions opts = tool_compile_options(threads, passes);
  std::string precision_line;
  opts.log = [&precision_line](const std::string& line) {
    keep_precision_line(precision_line, line);
  };
  CompiledModel model = lower::compile(bound, opts);
  double ms = elapsed_ms(t0);
  std::cout << "\ncompiled: isa " << model.isa() << ", " << model.steps().size() << " steps, compile "
            << std::fixed << std::setprecision(1) << ms << " ms, passes " << (passes.empty() ? "none" : passes) << "\n";
  const auto& mem = model.memory();
  std::cout << "memory:   arena " << human(static_cast<double>(mem.arena_bytes), "B") << " (peak live "
            << human(static_cast<double>(mem.peak_bytes), "B") << ", all activations "
            << human(static_cast<double>(mem.total_bytes), "B") << ")\n";
  std::cout << "implementations:\n";
  for (auto& [impl, n] : model.implementation_histogram())
    std::cout << "  " << std::left << std::setw(40) << impl << std::right << std::setw(6) << n << "\n";
  if (!precision_line.empty()) std::cout << precision_line << "\n";
  std::cout << "steps:\n" << model.to_text();
  // Slow paths: oneDNN's ref implementations and Ondine's reference kernels (bench --profile times them).
  std::vector<StepInfo> slow;
  for (const StepInfo& s : model.steps())
    if (s.slow_path()) slow.push_back(s);
  std::cout << "slow paths: " << (slow.empty() ? std::string("none") : std::to_string(slow.size()) + " step(s) on reference kernels:");
  for (std::size_t i = 0; i < std::min<std::size_t>(slow.size(), 8); ++i)
    std::cout << (i ? ";" : "") << " " << slow[i].op << " '" << slow[i].name << "' (" << slow[i].implementation << ")";
  std::cout << (slow.size() > 8 ? "; ..." : "") << "\n";
  std::cout << lower::int8_plan(model).text();  // Q/DQ left, fp32 islands, predicted int8 vs fp32
}

// `passes` ("none" unless given) runs on the graph shown; --compiled compiles the imported graph with
// `compile_passes`, the pipeline `ondine run` would use.
// The nodes whose output shapes do not follow from the input dims although their inputs' shapes do:
// their shapes depend on data (NonZero, a Reshape fed by one) or the op has no shape inference.
std::vector<const Node*> data_dependent_nodes(const Graph& g) {
  auto known = [](const Value* v) {
    if (!v || !v->shape().rank_known()) return v == nullptr;
    for (auto& d : v->shape().dims())
      if (!d.is_static() && d.symbol.empty()) return false;
    return true;
  };
  std::vector<const Node*> out;
  for (Node* n : g.topo_order()) {
    bool inputs_known = std::all_of(n->inputs().begin(), n->inputs().end(), known);
    bool outputs_known = std::all_of(n->outputs().begin(), n->outputs().end(), known);
    if (inputs_known && !outputs_known) out.push_back(n);
  }
  return out;
}

int cmd_inspect(const std::string& path, const std::vector<std::string>& dim_specs, bool json, bool print_graph,
                const std::string& dot_file, bool compiled, int threads, const std::string& passes,
                const std::string& compile_passes) {
  ModelFile file = load_model_file(path, /*describe_only=*/!compiled);
  if (compiled) adopt_artifact_precision(file);
  if (compiled) check_int8_model(file.graph, path);
  // An artifact's graph is already optimised: no pass runs on it, here or when compiled.
  PassManager pm = pipeline_for(file.artifact ? std::string("none") : passes);
  const std::string compile_pipeline = file.artifact ? std::string("none") : compile_passes;
  pipeline_for(compile_pipeline);
  Graph g = std::move(file.graph);
  Graph imported = g.clone();
  if (pm.size()) {
    check_supported(g);
    pm.run(g);
  }
  auto bindings = parse_dims(dim_specs);
  // FLOPs need numbers: symbolic dims not given with --dim count as 1 (one sample), and the report says so.
  std::vector<std::string> defaulted;
  for (auto& sym : symbolic_dims(g))
    if (bindings.emplace(sym, 1).second) defaulted.push_back(sym);
  // Some models reject 1 for a dim (an image of 1x1 pixels through a pooling stack): then the FLOPs need
  // those dims given, and the rest of the description stays symbolic.
  GraphStats stats;
  std::string flops_need;  // why FLOPs are not counted: the dims to give
  try {
    Graph bound = g.clone();
    bind_dims(bound, bindings);
    stats = graph_stats(bound);
  } catch (const Error& e) {
    if (defaulted.empty()) throw;  // the dims given with --dim are refused: the user's to change
    std::string names, flags;
    for (auto& d : defaulted) {
      names += (names.empty() ? "" : ", ") + d;
      flags += (flags.empty() ? "" : " ") + std::string("--dim ") + d + "=N";
    }
    flops_need = "give " + flags + " (with " + names + " counted as 1 the shapes are refused: " + e.what() + ")";
    for (auto& d : defaulted) bindings.erase(d);
    defaulted.clear();
    stats = graph_stats(g);
    stats.flops.reset();
  }
  std::vector<const Node*> data_dependent = data_dependent_nodes(g);
  auto unsupported = unsupported_nodes(g);
  std::map<std::string, std::vector<std::string>> bad;
  for (auto* n : unsupported) bad[n->op_key()].push_back(n->name());
  // Ops inside subgraphs (If branches, Loop and Scan bodies, nested ones too), counted apart.
  std::map<std::string, std::size_t> inner;
  std::function<void(const Graph&)> count_inner = [&](const Graph& sub) {
    for (Node* n : sub.nodes()) {
      ++inner[n->op_key()];
      for (auto& [attr, body] : n->subgraphs()) count_inner(*body);
    }
  };
  for (Node* n : g.nodes())
    for (auto& [attr, body] : n->subgraphs()) count_inner(*body);

  if (!dot_file.empty()) {
    std::ofstream(dot_file) << g.to_dot();
  }
  if (json) {
    nlohmann::json j;
    j["model"] = path;
    j["opset"] = g.opset();
    j["nodes"] = g.num_nodes();
    j["parameters"] = stats.parameters;
    j["parameter_bytes"] = stats.parameter_bytes;
    j["flops"] = stats.flops ? nlohmann::json(*stats.flops) : nlohmann::json(nullptr);
    if (!flops_need.empty()) j["flops_need"] = flops_need;
    j["dims"] = bindings;
    j["defaulted_dims"] = defaulted;
    j["symbolic_dims"] = symbolic_dims(g);
    for (const Node* n : data_dependent)
      j["data_dependent"].push_back({{"node", n->name()}, {"op", n->op_key()}});
    if (data_dependent.empty()) j["data_dependent"] = nlohmann::json::array();
    for (Value* v : g.inputs()) j["inputs"].push_back({{"name", v->name()}, {"type", Graph::value_type_str(v)}});
    for (Value* v : g.outputs()) j["outputs"].push_back({{"name", v->name()}, {"type", Graph::value_type_str(v)}});
    j["ops"] = op_key_histogram(g);
    j["subgraph_ops"] = inner;
    j["passes"] = passes_label(file.artifact ? std::string("none") : passes);
    j["unsupported_ops"] = bad;
    if (file.artifact) {
      const artifact::Info& a = *file.artifact;
      j["artifact"] = {{"format_version", a.format_version}, {"source", a.source}, {"ondine_version", a.ondine_version},
                       {"onednn_version", a.onednn_version}, {"isa", a.isa}, {"precision", a.precision},
                       {"keep_fp32", a.keep_fp32},
                       {"requires_vnni", a.requires_vnni}, {"threads", a.threads}, {"passes", a.passes},
                       {"file_bytes", a.file_bytes}, {"weight_bytes", a.weight_bytes},
                       {"packed_weights", file.packings}, {"packing_dims", file.packing_dims},
                       {"variant", file.variant}};
      for (const artifact::Info& v : file.variants)
        j["artifact"]["variants"].push_back({{"isa", v.isa}, {"precision", v.precision}, {"keep_fp32", v.keep_fp32},
                                             {"requires_vnni", v.requires_vnni},
                                             {"threads", v.threads}, {"packed_weights", v.packings},
                                             {"unpacked", v.unpacked},
                                             {"runs_here", lower::isa_runs_on(lower::isa_from_name(v.isa), lower::effective_isa().isa)}});
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "model:   " << path << " (opset " << g.opset() << ", " << g.num_nodes() << " nodes, producer '"
            << g.producer_name << "')\n";
  if (file.artifact) {
    std::cout << "compiled: " << artifact_summary(*file.artifact, file.variants.size()) << "\n";
    const lower::IsaInfo here = lower::effective_isa();
    for (std::size_t i = 0; i < file.variants.size(); ++i) {
      const artifact::Info& v = file.variants[i];
      std::cout << "variant: " << std::left << std::setw(17) << v.isa << std::right << v.precision
                << (v.keep_fp32.empty() ? "" : " (" + std::to_string(v.keep_fp32.size()) + " kept fp32)")
                << (v.requires_vnni ? " (needs VNNI)" : "") << ", ";
      if (v.unpacked.empty()) std::cout << v.packings << " weights packed";
      else std::cout << "weights packed at first load (" << v.unpacked << ")";
      const bool runs = lower::isa_runs_on(lower::isa_from_name(v.isa), here.isa);
      std::cout << (!runs ? "   (not on this CPU)" : i == file.variant ? "   <- runs here (" + here.name + ")" : "")
                << "\n";
    }
    std::string at;
    for (auto& [k, v] : file.packing_dims) at += (at.empty() ? " at " : ", ") + k + "=" + std::to_string(v);
    if (file.artifact->unpacked.empty())
      std::cout << "packed:  " << file.packings << " weights packed by oneDNN for " << file.artifact->isa << at
              << ", threads " << (file.artifact->threads > 0 ? std::to_string(file.artifact->threads) : "default")
              << " (used where oneDNN picks the same layout at load)\n";
    // What loading here would pack again: the variant compiled at its packing dims and thread count.
    if (!file.artifact->unpacked.empty())
      std::cout << "packed:  none stored (" << file.artifact->unpacked << "): packed at first load\n";
    if (lower::isa_runs_on(lower::isa_from_name(file.artifact->isa), here.isa)) {
      Graph at_dims = g.clone();
      std::map<std::string, std::int64_t> dims = file.packing_dims;
      for (const std::string& sym : symbolic_dims(at_dims)) dims.emplace(sym, 1);
      bind_dims(at_dims, dims);
      lower::CompileOptions options;
      options.threads = file.artifact->threads;
      options.passes = "none";
      options.packed_weights = file.packed;
      options.precision = lower::artifact_precision(*file.artifact);
      options.keep_fp32 = file.artifact->keep_fp32;
      try {
        lower::compile(std::move(at_dims), options);
        std::cout << "load:    " << file.packed->preloaded_hits() << " weight requests answered by the stored packings, "
                  << file.packed->packed_here() << " weights packed again here (" << here.name << ")\n";
        print_repacks(*file.packed);
      } catch (const Error& e) {
        std::cout << "load:    not compiled here: " << e.what() << "\n";
      }
    }
  }
  if (pm.size()) std::cout << "passes:  " << pm.pipeline() << " (" << imported.num_nodes() << " -> " << g.num_nodes() << " nodes)\n";
  for (Value* v : g.inputs()) std::cout << "input:   " << v->name() << "  " << Graph::value_type_str(v) << "\n";
  for (Value* v : g.outputs()) std::cout << "output:  " << v->name() << "  " << Graph::value_type_str(v) << "\n";
  std::cout << "params:  " << stats.parameters << " (" << human(static_cast<double>(stats.parameter_bytes), "B") << ")\n";
  std::string at;
  for (auto& [k, v] : bindings) at += (at.empty() ? "" : ", ") + k + "=" + std::to_string(v);
  std::cout << "FLOPs:   "
            << (stats.flops ? human(*stats.flops, "FLOP")
                            : flops_need.empty() ? std::string("unknown (dynamic shapes)") : "not counted: " + flops_need)
            << (at.empty() ? "" : " at " + at);
  if (!defaulted.empty()) {
    std::string names;
    for (auto& d : defaulted) names += (names.empty() ? "" : ", ") + d;
    std::cout << " (" << names << " not given with --dim: counted as 1)";
  }
  std::cout << "\n";
  if (data_dependent.empty()) {
    std::cout << "shapes:  " << (symbolic_dims(g).empty() ? "static" : "every shape follows from the input dims") << "\n";
  } else {
    std::cout << "shapes:  data-dependent at " << data_dependent.size() << " node(s):";
    for (std::size_t i = 0; i < std::min<std::size_t>(data_dependent.size(), 5); ++i)
      std::cout << " '" << data_dependent[i]->name() << "' (" << data_dependent[i]->op_key() << ")";
    std::cout << (data_dependent.size() > 5 ? " ..." : "") << "\n";
  }
  std::cout << "ops:\n";
  auto op_counts = op_key_histogram(g);
  std::vector<std::pair<std::string, std::size_t>> hist(op_counts.begin(), op_counts.end());
  std::stable_sort(hist.begin(), hist.end(), [](auto& a, auto& b) { return a.second > b.second; });
  for (auto& [op, n] : hist) {
    double f = stats.flops_by_op.count(op) ? stats.flops_by_op[op] : 0.0;
    std::cout << "  " << std::left << std::setw(24) << op << std::right << std::setw(6) << n;
    if (stats.flops && *stats.flops > 0) std::cout << std::setw(8) << std::fixed << std::setprecision(1) << 100.0 * f / *stats.flops << "% FLOPs";
    std::cout << (bad.count(op) ? "   UNSUPPORTED" : "") << "\n";
  }
  if (!inner.empty()) {
    std::cout << "ops in subgraphs:\n";
    std::vector<std::pair<std::string, std::size_t>> in_hist(inner.begin(), inner.end());
    std::stable_sort(in_hist.begin(), in_hist.end(), [](auto& a, auto& b) { return a.second > b.second; });
    for (auto& [op, n] : in_hist)
      std::cout << "  " << std::left << std::setw(24) << op << std::right << std::setw(6) << n << "   (in a subgraph)"
                << (bad.count(op) ? "   UNSUPPORTED" : "") << "\n";
  }
  if (bad.empty()) {
    std::cout << "unsupported ops: none\n";
  } else {
    std::cout << "unsupported ops (" << bad.size() << "):\n";
    for (auto& [op, names] : bad) {
      std::cout << "  " << op << ": " << names.size() << " node(s):";
      for (std::size_t i = 0; i < std::min<std::size_t>(names.size(), 5); ++i) std::cout << " " << names[i];
      std::cout << (names.size() > 5 ? " ..." : "") << "\n";
    }
  }
  if (print_graph) std::cout << "\n" << g.to_text();
  if (compiled) {
    if (!bad.empty()) throw Error("cannot compile: the model has unsupported ops (listed above)").in_file(path);
    Graph imported_bound = imported.clone();
    bind_dims(imported_bound, bindings);
    print_compiled(imported_bound, threads, compile_pipeline);
  }
  return 0;
}

int cmd_run(const std::string& path, const std::vector<std::string>& input_specs,
            const std::vector<std::string>& dim_specs, const std::string& output_dir, std::uint64_t seed, int runs,
            bool use_reference, int threads, bool check, std::optional<double> check_tolerance, const std::string& passes,
            bool passes_given, bool profile) {
  pipeline_for(passes);
  ModelFile file = load_model_file(path);
  adopt_artifact_precision(file);
  const std::string pipeline = pipeline_of(file, passes, passes_given);
  if (file.artifact) std::cout << artifact_summary(*file.artifact, file.variants.size()) << "\n";
  Graph g = std::move(file.graph);
  check_supported(g);  // every unsupported op at once, before anything runs
  name_unknown_input_dims(g);  // `?` dims (no dim_param) bind from the input files like named ones
  if (file.artifact && !g_calib_dir.empty()) throw UsageError("--calib quantizes an ONNX model; " + path + " is compiled already");
  quantize_for_int8(g, path, lower::effective_isa());
  std::map<std::string, Tensor> inputs;
  for (auto& spec : input_specs) {
    auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) throw Error("--input expects NAME=FILE.npy, got '" + spec + "'");
    std::string name = spec.substr(0, eq);
    Value* v = g.find_value(name);
    if (!v || !v->is_graph_input()) {
      std::string names;
      for (Value* in : g.inputs()) names += (names.empty() ? "" : ", ") + in->name();
      throw Error("--input " + name + ": the model has no input of that name (inputs: " + names + ")").in_file(path);
    }
    inputs[name] = load_npy(spec.substr(eq + 1));
  }
  // Symbolic dims: bound by --dim, or by the shapes of the given input files.
  auto bindings = parse_dims(dim_specs);
  for (Value* in : g.inputs())
    if (auto it = inputs.find(in->name()); it != inputs.end() && in->shape().rank_known() &&
                                           in->shape().rank() == it->second.rank())
      for (std::size_t d = 0; d < in->shape().rank(); ++d)
        if (!in->shape()[d].is_static() && !in->shape()[d].symbol.empty())
          bindings.emplace(in->shape()[d].symbol, it->second.dims()[d]);
  for (auto& sym : symbolic_dims(g)) bindings.emplace(sym, 1);
  bind_dims(g, bindings);
  fill_random_inputs(g, inputs, seed);

  check_inputs(g, inputs);  // one message for a wrong name, dtype or shape, whichever engine runs

  // The engine: the oneDNN-compiled model by default, or the reference executor (the oracle).
  Engine engine = make_engine(g, use_reference, threads, pipeline, passes_given || file.artifact.has_value(), file.packed,
                              &inputs);
  if (file.packed && !use_reference) {
    std::cout << "packed weights: " << file.packings << " stored, " << file.packed->preloaded_hits()
              << " used as stored, " << file.packed->packed_here() << " packed at load\n";
    print_repacks(*file.packed);
  }
  std::map<std::string, Tensor> outputs;
  std::vector<double> ms = time_runs(engine, inputs, std::max(runs, 1), path, "", &outputs);
  for (Value* o : g.outputs()) std::cout << o->name() << ": " << summary(outputs.at(o->name())) << "\n";
  if (!output_dir.empty()) {
    fs::create_directories(output_dir);
    for (auto& [name, t] : outputs) {
      std::string safe = name;
      std::replace_if(safe.begin(), safe.end(), [](char c) { return c == '/' || c == '\\' || c == ':'; }, '_');
      save_npy(t, (fs::path(output_dir) / (safe + ".npy")).string());
    }
    std::cout << "wrote " << outputs.size() << " output(s) to " << output_dir << "\n";
  }
  std::sort(ms.begin(), ms.end());
  std::string at;
  for (auto& [k, v] : bindings) at += (at.empty() ? "" : ",") + k + "=" + std::to_string(v);
  std::cout << std::fixed << std::setprecision(1) << "benchmark: engine=" << (use_reference ? "reference" : "compiled")
            << (use_reference ? "" : " isa=" + engine.isa + " precision=" + precision_label()) << " "
            << (at.empty() ? "" : at + " ")
            << "threads=" << (threads > 0 ? std::to_string(threads) : std::string("default"))
            << ((use_reference && !passes_given) ? "" : " passes=" + passes_label(pipeline)) << " runs=" << ms.size()
            << " median=" << ms[ms.size() / 2] << " ms min=" << ms.front() << " ms load=" << file.load_ms << " ms";
  if (!use_reference) std::cout << " compile=" << engine.compile_ms << " ms";
  std::cout << "\n";
  if (!engine.precision.empty()) std::cout << engine.precision << "\n";
  if (profile && engine.profile)  // after the timed runs, so profiling cannot slow them
    std::cout << engine.profile(inputs, std::max(runs, 1));
  if (check && !use_reference) {
    // Every optimisation (passes and lowering) is checked against the oracle: the imported graph on
    // the reference executor, same inputs.
    auto expected = ReferenceExecutor(g).run(inputs);
    check_outputs(g, outputs, expected, check_bound(g, check_tolerance), path,
                  "compiled outputs differ from the reference executor's");
  }
  return 0;
}

// ---- ondine compile ----

struct CompileArgs {
  std::string passes = "default";
  bool print_passes = false;
  std::vector<std::string> dump_before, dump_after;
  bool dot = false;
  std::string out_file;
  bool check = false;
  std::vector<std::string> dims;
  std::uint64_t seed = 0;
  std::optional<double> tolerance;         // --check's relative bound; unset: by model kind (check_bound)
  std::size_t stop_after = 0;              // > 0: stop after that many pass runs (bisecting)
  std::vector<std::string> pass_options;   // KEY=VALUE for PassContext::options
  int threads = 0;                         // recorded in an artifact (0: OpenMP's default)
  std::vector<std::string> targets;        // an artifact's variants (default: native, avx2)
  bool as_variant = false;                 // a child compiling one variant of a parent's --target list
  std::string source;                      // the artifact's source (a child compiling the parent's quantized copy)
};

// The ISAs --target names, in order, "native" as this CPU's (oneDNN's effective ISA), each once.
std::vector<lower::IsaInfo> resolve_targets(const std::vector<std::string>& names) {
  static const std::set<std::string> known = {"native", "avx2", "avx512_core", "avx512_core_vnni", "avx512_core_bf16",
                                              "avx512_core_amx"};
  std::vector<lower::IsaInfo> out;
  for (const std::string& name : names.empty() ? std::vector<std::string>{"native", "avx2"} : names) {
    if (!known.count(name))
      throw UsageError("--target " + name + ": expected native, avx2, avx512_core, avx512_core_vnni, avx512_core_bf16 "
                       "or avx512_core_amx");
    lower::IsaInfo isa = name == "native" ? lower::effective_isa() : lower::isa_info(lower::isa_from_name(name));
    bool seen = false;
    for (const lower::IsaInfo& o : out) seen = seen || o.isa == isa.isa;
    if (!seen) out.push_back(isa);
  }
  return out;
}

// Runs this program again as `args` with oneDNN capped at `isa` (DNNL_MAX_CPU_ISA) and its standard output
// going to ours; an Error when it fails.
void run_capped(const std::vector<std::string>& args, const lower::IsaInfo& isa) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "DNNL_MAX_CPU_ISA=", 17) != 0 && std::strncmp(*e, "ONEDNN_MAX_CPU_ISA=", 19) != 0)
      env_strings.emplace_back(*e);
  env_strings.push_back("DNNL_MAX_CPU_ISA=" + lower::max_cpu_isa_env(isa.isa));
  std::vector<char*> env, argv;
  for (std::string& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  std::vector<std::string> arg_strings = args;
  for (std::string& a : arg_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  pid_t pid = 0;
  if (int rc = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), env.data()); rc != 0)
    throw Error("cannot start a process to compile the " + isa.name + " variant: " + std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error("compiling the " + isa.name + " variant failed (its process said why above)");
}

int cmd_compile(const std::string& path, const CompileArgs& args);

// `ondine compile MODEL -o OUT.ondine --target A,B,..`: each target compiled by this program in a process of
// its own, capped at that ISA (a target above this CPU's is not capped: it runs with the target's pass
// options and stores no packed weights), into OUT.ondine.A.tmp ...; then one artifact with every variant.
int compile_variants(const std::string& path, const CompileArgs& args, const std::vector<lower::IsaInfo>& targets) {
  std::vector<std::string> parts;
  struct Remove {
    std::vector<std::string>* files;
    ~Remove() {
      for (const std::string& f : *files) std::remove(f.c_str());
    }
  } remove_parts{&parts};
  if (g_precision == lower::Precision::Bf16 &&
      std::none_of(targets.begin(), targets.end(), [](const lower::IsaInfo& t) { return t.bf16_native; }))
    throw UsageError("--precision bf16: none of the targets has native bf16 (avx512_core_bf16, avx512_core_amx); "
                     "use --precision auto for bf16 where a target has it");
  // --precision int8 --calib DIR: calibrated once, here; Q/DQ with 8-bit weights for the targets with VNNI,
  // 7-bit for the others (quantize_for_int8); each child compiles its QDQ copy.
  std::map<bool, std::string> quantized_copy;  // 7-bit? -> the QDQ file
  std::vector<std::string> copies;
  Remove remove_copies{&copies};
  Graph g;
  if (g_int8 && !g_calib_dir.empty()) {
    g = ondine::onnx::load_model(path);
    check_supported(g);
  }
  if (needs_quantizing(g, path)) {
    ondine::cli::QuantizeArgs q = int8_quantize_args(path);
    std::unique_ptr<ondine::cli::CalibratedGraph> calibrated;
    try {
      calibrated = ondine::cli::calibrate_graph(std::move(g), q);
      for (const lower::IsaInfo& isa : targets) {
        q.reduce_range = !isa.int8_vnni;
        if (quantized_copy.count(q.reduce_range)) continue;
        say_weight_width(isa);
        const std::string copy = args.out_file + (q.reduce_range ? ".int8r.onnx" : ".int8.onnx");
        copies.push_back(copy);
        ondine::onnx::save_model(ondine::cli::insert_qdq(*calibrated, q), copy);
        quantized_copy[q.reduce_range] = copy;
      }
    } catch (const ondine::cli::QuantizeUsageError& e) {
      throw UsageError(e.message());
    }
  }
  for (const lower::IsaInfo& isa : targets) {
    const std::string model = quantized_copy.count(!isa.int8_vnni) ? quantized_copy[!isa.int8_vnni] : path;
    std::vector<std::string> argv = {"ondine", "compile", model, "-o", args.out_file + "." + isa.name + ".ondine",
                                     "--target", isa.name, "--as-variant", "--passes", args.passes,
                                     "--threads", std::to_string(args.threads), "--source",
                                     args.source.empty() ? path : args.source};
    for (const std::string& d : args.dims) argv.insert(argv.end(), {"--dim", d});
    for (const std::string& o : args.pass_options) argv.insert(argv.end(), {"--pass-option", o});
    if (args.print_passes) argv.push_back("--print-passes");
    for (const std::string& d : args.dump_before) argv.insert(argv.end(), {"--dump-before", d});
    for (const std::string& d : args.dump_after) argv.insert(argv.end(), {"--dump-after", d});
    if (args.dot) argv.push_back("--dot");
    if (args.stop_after) argv.insert(argv.end(), {"--stop-after", std::to_string(args.stop_after)});
    if (args.check) argv.insert(argv.end(), {"--check", "--seed", std::to_string(args.seed)});
    if (args.check && args.tolerance) argv.insert(argv.end(), {"--tolerance", std::to_string(*args.tolerance)});
    // bf16 where the target has it natively: a bf16 list gives the others fp32 (auto resolves per target itself).
    const lower::Precision precision =
        g_precision == lower::Precision::Bf16 && !isa.bf16_native ? lower::Precision::Fp32 : g_precision;
    if (g_precision_given)
      argv.insert(argv.end(), {"--precision", g_int8 ? std::string("int8") : std::string(lower::precision_name(precision))});
    if (g_exact_int8_weights) argv.push_back("--exact-int8-weights");
    if (g_tune) argv.push_back("--tune");  // each variant timed here, under its ISA
    if (precision != lower::Precision::Fp32) {
      for (const std::string& k : g_keep_fp32) argv.insert(argv.end(), {"--keep-fp32", k});
      if (g_max_error) {
        std::ostringstream e;
        e << std::setprecision(17) << *g_max_error;
        argv.insert(argv.end(), {"--max-error", e.str()});
      }
    }
    parts.push_back(argv[4]);
    std::cout << "[" << isa.name << "]" << (precision != g_precision ? " fp32: no native bf16 for --precision bf16" : "")
              << "\n";
    run_capped(argv, isa);
  }
  artifact::combine(parts, args.out_file);
  std::cout << "wrote:   " << args.out_file << " (artifact, " << targets.size() << " variants:";
  for (const lower::IsaInfo& isa : targets) std::cout << " " << isa.name;
  std::cout << "; " << std::filesystem::file_size(args.out_file) << " bytes)\n";
  return 0;
}

// A bf16 artifact, checked where it can be: on a CPU with native bf16, the optimised graph compiled in bf16
// and in fp32 on seeded inputs (symbolic dims at --dim, else 1), the error max |bf16 - fp32| / max |fp32|
// printed; with --max-error, nodes are kept fp32, worst first, until it holds (an Error when it cannot:
// nothing is written); `requested` auto also times both and keeps the faster. Returns the precision to store;
// `keep_fp32` gets the nodes kept.
lower::Precision check_bf16_artifact(const Graph& optimised, const std::string& path, const CompileArgs& args,
                                     lower::Precision requested, std::vector<std::string>& keep_fp32) {
  const lower::IsaInfo here = lower::effective_isa();
  if (!here.bf16_native) {
    std::cout << "bf16:    not checked (this CPU runs " << here.name << ", no native bf16): check the artifact where "
              << "it runs, `ondine run MODEL.ondine --check`\n";
    return lower::Precision::Bf16;
  }
  Graph bound = optimised.clone();
  std::map<std::string, std::int64_t> dims = parse_dims(args.dims);
  for (const std::string& sym : symbolic_dims(bound)) dims.emplace(sym, 1);
  bind_dims(bound, dims);
  std::map<std::string, Tensor> inputs;
  fill_random_inputs(bound, inputs, args.seed);
  lower::CompileOptions options;
  options.threads = args.threads;
  options.passes = "none";
  options.precision = requested;
  options.keep_fp32 = keep_fp32;
  lower::Bf16BoundOptions bo;
  bo.max_error = g_max_error ? *g_max_error : std::numeric_limits<double>::max();  // no bound: measure only
  bo.progress = bf16_bound_progress();
  lower::Bf16BoundResult r;
  try {
    r = lower::compile_bf16_within(bound, options, {inputs}, bo);
  } catch (Error& e) {
    throw e.in_file(path);
  }
  bo.progress = nullptr;  // its progress line is cleared before the result prints
  std::string at;
  for (auto& [k, v] : dims) at += (at.empty() ? " at " : ", ") + k + "=" + std::to_string(v);
  std::cout << std::scientific << std::setprecision(2) << "bf16:    error " << r.error << " of max |fp32| on seeded inputs"
            << at << " (seed " << args.seed << ")";
  if (g_max_error) {
    std::cout << ", bound " << *g_max_error << ", all bf16 " << r.initial_error << ", " << r.kept.size()
              << " node(s) kept fp32 for it";
    for (const std::string& name : r.kept) std::cout << " '" << name << "'";
  }
  std::cout << std::defaultfloat << "\n";
  if (g_max_error && !r.met)
    throw Error("bf16 misses --max-error " + std::to_string(*g_max_error) + ": error " + std::to_string(r.error) +
                " with " + std::to_string(r.kept.size()) + " node(s) kept fp32; nothing written (compile it in fp32)")
        .in_file(path);
  keep_fp32.insert(keep_fp32.end(), r.kept.begin(), r.kept.end());
  if (requested == lower::Precision::Auto) {
    std::cout << std::fixed << std::setprecision(2) << "precision: auto chose " << (r.chose_fp32 ? "fp32" : "bf16")
              << " (median of 7 runs: bf16 " << r.bf16_ms << " ms, fp32 " << r.fp32_ms << " ms)" << std::defaultfloat << "\n";
    if (r.chose_fp32) return lower::Precision::Fp32;
  }
  return lower::Precision::Bf16;
}

// Runs the pipeline on the model (symbolic dims stay symbolic unless bound with --dim), reports what
// each pass did, optionally writes the optimised model and checks it against the imported one on the
// reference executor (symbolic dims bound to 1 for the check).
int cmd_compile(const std::string& path, const CompileArgs& args) {
  PassManager::Options options;
  options.dump_before.insert(args.dump_before.begin(), args.dump_before.end());
  options.dump_after.insert(args.dump_after.begin(), args.dump_after.end());
  options.dump_dot = args.dot;
  options.stop_after = args.stop_after;
  options.dump = [](const std::string& title, const std::string& graph) { std::cout << title << "\n" << graph << "\n"; };
  PassManager pm = pipeline_for(args.passes, options);
  for (auto& kv : args.pass_options) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) throw UsageError("--pass-option " + kv + ": expected KEY=VALUE (e.g. layout=nhwc)");
    pm.context().options[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  std::set<std::string> in_pipeline;
  for (auto& [name, repeat] : PassManager::parse_pipeline(pm.pipeline())) in_pipeline.insert(name);
  for (auto* list : {&args.dump_before, &args.dump_after})
    for (auto& name : *list)
      if (!in_pipeline.count(name))
        throw UsageError(std::string(list == &args.dump_before ? "--dump-before " : "--dump-after ") + name +
                         ": the pipeline has no pass of that name (pipeline: " +
                         (pm.size() ? pm.pipeline() : std::string("none")) + ")");

  // -o MODEL.ondine: a compiled artifact (lower/artifact.hpp): the graph prepared as compile() prepares it,
  // with the pass options of its target ISA, then the pipeline; one variant per --target.
  const bool to_artifact = fs::path(args.out_file).extension() == ".ondine";
  if (!to_artifact && !args.targets.empty()) throw UsageError("--target is for artifacts: -o MODEL.ondine");
  if (!to_artifact && g_precision_given)
    throw UsageError("--precision is for artifacts (-o MODEL.ondine); run and bench take it for ONNX models");
  const lower::IsaInfo here = lower::effective_isa();
  std::vector<lower::IsaInfo> targets;
  if (to_artifact) targets = resolve_targets(args.targets);
  // One target this process can compile for (its own ISA, or one above it, whose weights it cannot pack):
  // here. Else each target in a process of its own with oneDNN capped at it (oneDNN's ISA is fixed once
  // per process), its variant combined into one file.
  if (targets.size() > 1 || (targets.size() == 1 && targets[0].isa != here.isa && lower::isa_runs_on(targets[0].isa, here.isa))) {
    if (args.as_variant)
      throw Error("oneDNN runs " + here.name + " here although DNNL_MAX_CPU_ISA caps it at " + targets[0].name);
    return compile_variants(path, args, targets);
  }
  const lower::IsaInfo target = targets.empty() ? here : targets[0];
  if (to_artifact) lower::set_isa_pass_options(pm, target, !g_exact_int8_weights);
  Graph g = ondine::onnx::load_model(path);
  check_supported(g);
  quantize_for_int8(g, path, target);
  bind_dims(g, parse_dims(args.dims));
  if (to_artifact) lower::prepare_for_passes(g);
  // Only --check needs the original graph: a clone shares the weights, so fold-bn would then have to
  // copy them instead of scaling them in place (that copy is most of the pass time).
  std::optional<Graph> original;
  if (args.check) original = g.clone();
  auto before = op_key_histogram(g);
  const std::size_t nodes_before = g.num_nodes();
  const int opset = g.opset();
  auto t0 = std::chrono::steady_clock::now();
  try {
    pm.run(g);
  } catch (Error& e) {
    e.in_file(path);
    throw;
  }
  double ms = elapsed_ms(t0);

  std::size_t rewrites = 0;
  for (auto& r : pm.records()) rewrites += r.rewrites;
  std::cout << "model:   " << path << " (opset " << opset << ", " << nodes_before << " nodes)\n";
  std::cout << "passes:  " << passes_label(args.passes) << ": " << pm.records().size() << " pass runs, "
            << nodes_before << " -> " << g.num_nodes() << " nodes, " << rewrites << " rewrites, " << std::fixed
            << std::setprecision(1) << ms << " ms\n";
  if (args.print_passes) {
    std::cout << "pipeline: " << (pm.size() ? pm.pipeline() : std::string("none")) << "\n" << pm.summary_text();
    auto after = op_key_histogram(g);
    std::map<std::string, std::pair<std::size_t, std::size_t>> ops;
    for (auto& [op, n] : before) ops[op].first = n;
    for (auto& [op, n] : after) ops[op].second = n;
    std::cout << std::left << std::setw(28) << "ops" << std::right << std::setw(8) << "before" << std::setw(8)
              << "after" << "\n";
    for (auto& [op, counts] : ops)
      std::cout << "  " << std::left << std::setw(26) << op << std::right << std::setw(8) << counts.first
                << std::setw(8) << counts.second << "\n";
  }
  if (to_artifact) {
    lower::Precision precision = g_precision;
    if (precision == lower::Precision::Auto) precision = target.bf16_faster ? lower::Precision::Bf16 : lower::Precision::Fp32;
    std::vector<std::string> keep_fp32 = g_keep_fp32;
    if (precision == lower::Precision::Bf16) {
      if (!target.bf16_native)
        throw UsageError("--precision bf16: the target " + target.name + " has no native bf16 (avx512_core_bf16, "
                         "avx512_core_amx); compile it in fp32 or with --precision auto");
      precision = check_bf16_artifact(g, path, args, g_precision, keep_fp32);
    } else {
      keep_fp32.clear();
    }
    artifact::Info info = lower::artifact_info(g, args.source.empty() ? path : args.source,
                                               pm.size() ? pm.pipeline() : std::string("none"), args.threads, target,
                                               precision);
    info.keep_fp32 = keep_fp32;
    info.ondine_version = ondine::version;
    // oneDNN packs for the ISA it runs: a target above this CPU's gets its weights packed at first load.
    const bool can_pack = lower::isa_runs_on(target.isa, here.isa);
    if (g_tune && target.isa == here.isa) {  // --tune: this CPU's kernel choices, stored and applied at load
      Graph bound = g.clone();
      std::map<std::string, std::int64_t> dims = parse_dims(args.dims);
      for (const std::string& symbol : symbolic_dims(bound)) dims.emplace(symbol, 1);
      bind_dims(bound, dims);
      lower::CompileOptions opts;
      opts.threads = args.threads;
      opts.passes = "none";
      opts.precision = precision;
      opts.keep_fp32 = keep_fp32;
      opts.conv_layout = g_conv_layout;
      opts.conv_algorithm = g_conv_algorithm;
      opts.matmul_kernel = g_matmul_kernel;
      lower::TuneOptions t;
      t.tune_int8_weights = false;  // the graph's int8 layers are fused already
      auto line = std::make_shared<ondine::cli::ProgressLine>("tuning");
      t.progress = [line](const std::string& what) { line->update(0, std::nullopt, what); };
      lower::TuneResult r = lower::tune(bound, opts, t);
      line->clear();
      for (const lower::TuneDecision& d : r.decisions)
        if (d.knob != "precision" && d.why != "set by the caller")
          info.tuned += (info.tuned.empty() ? "" : ",") + d.knob + "=" + d.value;
      std::cout << r.text();
    } else if (g_tune) {
      std::cout << "tune:    not for " << target.name << " (it runs here as " << here.name << "): its built-in choices\n";
    }
    if (!can_pack)
      info.unpacked = "compiled on a CPU without " + target.name + " (it had " + here.name + ")";
    const std::string not_packed = lower::save_artifact(g, args.out_file, info, parse_dims(args.dims), can_pack);
    if (!not_packed.empty()) std::cout << "note:    weights not packed: " << not_packed << "\n";
    std::cout << (args.as_variant ? "variant: " : "wrote:   ") << (args.as_variant ? target.name : args.out_file)
              << " (artifact: " << g.num_nodes() << " nodes, " << info.precision
              << (info.keep_fp32.empty() ? "" : " (" + std::to_string(info.keep_fp32.size()) + " kept fp32)") << ", " << info.isa
              << (info.requires_vnni ? ", needs VNNI" : "");
    if (!args.as_variant) std::cout << ", " << std::filesystem::file_size(args.out_file) << " bytes";
    std::cout << ")\n";
  } else if (!args.out_file.empty()) {
    ondine::onnx::save_model(g, args.out_file);
    std::cout << "wrote:   " << args.out_file << " (" << g.num_nodes() << " nodes)\n";
  }
  if (args.check) {
    // The oracle: the imported model and the optimised one on the reference executor, same inputs.
    std::map<std::string, std::int64_t> ones;
    for (auto& sym : symbolic_dims(*original)) ones[sym] = 1;
    Graph want_graph = original->clone(), got_graph = g.clone();
    bind_dims(want_graph, ones);
    bind_dims(got_graph, ones);
    std::map<std::string, Tensor> inputs;
    fill_random_inputs(want_graph, inputs, args.seed);
    auto want = ReferenceExecutor(want_graph).run(inputs);
    auto got = ReferenceExecutor(got_graph).run(inputs);
    check_outputs(*original, got, want, check_bound(*original, args.tolerance), path,
                  "the optimised graph's outputs differ from the imported graph's (reference executor)");
  }
  return 0;
}

// ---- ondine bench ----

// Which symbolic dim --batch sets, and the other dims' bindings, from --dim NAME (the batch dim) and
// --dim NAME=SIZE (fixed). Without a bare NAME, the model's only symbolic dim is the batch dim; a model
// with no symbolic dim has none (its batch is fixed).
struct BatchDims {
  std::string batch;  // empty: the model's shapes are static
  std::map<std::string, std::int64_t> fixed;
};

BatchDims batch_dims(const Graph& g, const std::vector<std::string>& dim_specs, const std::string& path) {
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
std::int64_t static_batch(const Graph& g) {
  if (g.inputs().empty()) return 1;
  const Shape& s = g.inputs().front()->shape();
  return s.rank_known() && s.rank() > 0 && s[0].is_static() ? s[0].value : 1;
}

// The graph with the batch dim bound (other symbolic dims: --dim NAME=SIZE, else 1).
Graph bind_batch(const Graph& g, const BatchDims& dims, std::int64_t batch) {
  auto bindings = dims.fixed;
  if (!dims.batch.empty()) bindings[dims.batch] = batch;
  for (auto& sym : symbolic_dims(g)) bindings.emplace(sym, 1);
  Graph bound = g.clone();
  bind_dims(bound, bindings);
  return bound;
}

// The batch sizes to measure: --batch, which for a model with static shapes can only be its own batch.
std::vector<std::int64_t> bench_batches(const Graph& g, const BatchDims& dims, std::vector<std::int64_t> batches,
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

BenchResult bench_batch(const Graph& g, const BatchDims& dims, std::int64_t batch, bool use_reference, int threads,
                        int warmup, int runs, std::uint64_t seed, const std::string& path, std::string& isa,
                        const std::string& passes, bool passes_given, bool profile,
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
std::optional<double> flops_per_sample(const Graph& g, const BatchDims& dims) {
  GraphStats stats = graph_stats(bind_batch(g, dims, 1));
  if (!stats.flops) return std::nullopt;
  return dims.batch.empty() ? *stats.flops / static_cast<double>(static_batch(g)) : *stats.flops;
}

// ---- ondine bench: a stream of shapes, and a decode with a KV cache ----
//
// Both run the model as a server would: through one lower::ShapeCache built once, which takes the
// shape-free plan (lower/dynamic.hpp) or compiles once per new shape (CompileOptions::shape_plan,
// --shape-plan).

// --dim NAME=LO:HI: each run of the stream draws NAME uniformly in [LO, HI].
struct DimRange {
  std::int64_t lo = 0, hi = 0;
};

// What bench does besides one compile per batch size: the stream's ranges, --decode, --shape-plan.
struct ShapeBenchArgs {
  std::map<std::string, DimRange> ranges;  // --dim NAME=LO:HI
  int decode_steps = 0;                    // --decode STEPS (0: none)
  std::string kv_cache = "auto";           // --kv-cache auto|in-place|feed
  lower::ShapePlan shape_plan = lower::ShapePlan::Auto;
  bool shape_plan_given = false, warmup_given = false, runs_given = false, max_error_given = false;
};

bool parse_size(const std::string& s, std::int64_t& out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && out >= 0;
}

// Takes the ranges (NAME=LO:HI) out of bench's --dim specs; the others stay.
std::map<std::string, DimRange> take_dim_ranges(std::vector<std::string>& specs) {
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
std::optional<std::int64_t> token_vocab(const Graph& g, const Value* in) {
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

bool is_integer_dtype(DType t) {
  return t == DType::Int8 || t == DType::UInt8 || t == DType::Int16 || t == DType::UInt16 || t == DType::Int32 ||
         t == DType::UInt32 || t == DType::Int64 || t == DType::UInt64;
}

// A tensor of `dtype` whose element i is value(i).
Tensor tensor_of(DType dtype, std::vector<std::int64_t> dims, const std::function<std::int64_t(std::int64_t)>& value) {
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
std::map<std::string, Tensor> token_inputs(const Graph& bound, std::uint64_t seed) {
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
lower::CompileOptions cache_options(int threads, const std::string& passes, const ShapeBenchArgs& args,
                                    std::shared_ptr<lower::PackedWeights> packed,
                                    std::shared_ptr<std::string> precision_line) {
  lower::CompileOptions opts = tool_compile_options(threads, passes);
  opts.packed_weights = std::move(packed);
  opts.shape_plan = args.shape_plan;
  if (g_precision != lower::Precision::Fp32)
    opts.log = [precision_line](const std::string& line) { keep_precision_line(*precision_line, line); };
  return opts;
}

std::string bindings_str(const std::map<std::string, std::int64_t>& b) {
  std::string s;
  for (auto& [name, size] : b) s += (s.empty() ? "" : ", ") + name + "=" + std::to_string(size);
  return s;
}

double median(std::vector<double> v) { return quantile(std::move(v), 0.5); }

// The header lines of both modes: model, engine, the plan the cache took.
void print_cache_header(const std::string& path, const lower::ShapeCache& cache, int threads, const std::string& extra,
                        const std::string& pipeline, const ShapeBenchArgs& args, double ready_ms,
                        const std::string& precision_line) {
  std::cout << "model:   " << path << "\nengine:  shape cache, isa " << lower::effective_isa().name << ", precision "
            << precision_label() << ", threads " << (threads > 0 ? threads : omp_get_max_threads()) << extra << ", passes " << passes_label(pipeline)
            << ", shape plan " << lower::shape_plan_name(args.shape_plan) << "\n";
  if (!precision_line.empty()) std::cout << precision_line << "\n";
  std::cout << "plan:    " << cache.shape_plan_reason() << " (ready in " << std::fixed << std::setprecision(1)
            << ready_ms << " ms)\n";
}

// The JSON fields both modes start with: the model, the engine, the plan the cache took.
nlohmann::json cache_json(const std::string& path, const char* mode, const lower::ShapeCache& cache, int threads,
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

void write_json(const std::string& json_file, const nlohmann::json& j) {
  std::ofstream out(json_file);
  if (!out) throw Error("--json " + json_file + ": cannot open for writing");
  out << j.dump(2) << "\n";
}

// A stream of shapes: each timed run draws the ranged dims (other symbolic dims: --dim NAME=SIZE, else 1).
int bench_stream(const std::string& path, const Graph& g, const std::map<std::string, std::int64_t>& fixed,
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
DecodeModel decode_model(const Graph& g, const std::string& path) {
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
int bench_decode(const std::string& path, const Graph& g, const std::map<std::string, std::int64_t>& fixed,
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

int cmd_bench(const std::string& path, const std::vector<std::int64_t>& batch_list,
              const std::vector<std::string>& dim_specs, int threads, int warmup, int runs, std::uint64_t seed,
              bool use_reference, const std::string& json_file, const std::string& passes, bool passes_given,
              bool profile, ShapeBenchArgs shape_args) {
  std::vector<std::string> specs = dim_specs;
  shape_args.ranges = take_dim_ranges(specs);
  const bool through_cache = shape_args.decode_steps > 0 || !shape_args.ranges.empty();
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

}  // namespace

// The last resort: an exception std::terminate sees (thrown where no handler can catch it, e.g. in an
// OpenMP region) still gives one line and an exit code below 128, not SIGABRT (134).
[[noreturn]] void terminate_handler() {
  std::string what = "unknown exception";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = x.what();
    } catch (...) {
    }
  } else {
    what = "std::terminate called";
  }
  std::fprintf(stderr, "ondine: error: internal error: %s\n", ondine::detail::escape_text(what).c_str());
  std::fflush(stdout);
  std::_Exit(70);  // EX_SOFTWARE
}

int main(int argc, char** argv) {
  std::set_terminate(terminate_handler);
  CLI::App app{"ondine: a graph compiler for CPU inference (ONNX in, fast CPU code out)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(ondine::version));
  app.fallthrough();  // --quiet also after the subcommand
  app.add_flag("-q,--quiet", ondine::cli::progress_quiet(),
               "no progress lines (they are shown only when stderr is a terminal anyway)");

  std::string model, output_dir, dot_file;
  std::vector<std::string> dims, input_specs;
  bool json = false, print_graph = false, reference = false, compiled = false, check = false;
  std::uint64_t seed = 0;
  int runs = 1, threads = 0;
  std::optional<double> tolerance;  // unset: check_bound picks by model kind

  std::string passes = "default", inspect_passes = "none";
  auto* inspect = app.add_subcommand("inspect", "ops histogram, parameters, FLOPs, inputs/outputs, unsupported ops");
  inspect->add_option("model", model, "ONNX model file or compiled artifact (.ondine)")->required();
  inspect->add_option("--dim", dims, "bind a symbolic dim for the FLOP count, NAME=SIZE (default: 1)");
  inspect->add_flag("--json", json, "print as JSON");
  inspect->add_flag("--graph", print_graph, "also print the graph as text");
  inspect->add_option("--dot", dot_file, "write the graph as Graphviz DOT to this file");
  inspect->add_flag("--compiled", compiled, "compile it and show the ISA, each step's oneDNN implementation, the memory plan");
  std::string precision = "fp32";  // --precision of inspect, compile, run, bench
  std::vector<CLI::Option*> precision_opts;
  const std::string exact_weights_help =
      "on a CPU without VNNI, keep a quantized model's layers with 8-bit weights in float, exactly as the file says "
      "(default: their weights requantized to 7 bits, which these CPUs' int8 kernels compute exactly, and run int8)";

  precision_opts.push_back(inspect->add_option("--precision", precision,
                                               "with --compiled: fp32 (default), bf16 or auto, as run and bench take "
                                               "it (an artifact: its own unless given)")
                               ->check(CLI::IsMember({"fp32", "bf16", "int8", "auto"})));
  inspect->add_option("--keep-fp32", g_keep_fp32, "with --compiled --precision bf16: nodes whose name matches this "
                                                  "glob stay fp32 (repeatable)");
  inspect->add_option("--threads", threads, "threads for --compiled (default: OpenMP's)");
  auto* inspect_passes_opt = inspect->add_option(
      "--passes", inspect_passes,
      "passes to run before showing the model: 'none' (default, the model as imported), 'default', or names "
      "('fold-bn,fuse'); --compiled compiles with these, else with the default pipeline");

  CompileArgs compile_args;
  auto* compile = app.add_subcommand("compile", "run the optimisation passes: per-pass summary, dumps, export, check");
  compile->add_option("model", model, "ONNX model file")->required();
  compile->add_option("--passes", compile_args.passes,
                      "pipeline: 'default' (default), 'none', or pass names, '*' repeats until no change "
                      "('fold-constants*,dce')");
  compile->add_flag("--print-passes", compile_args.print_passes,
                    "print the pipeline, each pass's time, nodes before/after and rewrites, and the op counts before and after");
  compile->add_option("--dump-before", compile_args.dump_before, "print the graph before this pass (repeatable)");
  compile->add_option("--dump-after", compile_args.dump_after, "print the graph after this pass (repeatable)");
  compile->add_flag("--dot", compile_args.dot, "dumps as Graphviz DOT instead of text");
  compile->add_option("-o,--output", compile_args.out_file,
                      "write the optimised model: as ONNX, or with the extension .ondine as a compiled artifact "
                      "that run/bench/inspect load without ONNX import or passes (docs/artifacts.md)");
  compile->add_option("--threads", compile_args.threads, "the thread count recorded in an artifact (default: OpenMP's)");
  compile->add_option("--target", compile_args.targets,
                      "an artifact's variants, one per ISA: native (this CPU's), avx2, avx512_core, avx512_core_vnni, "
                      "avx512_core_bf16, avx512_core_amx; the loader runs the best the CPU has (default: native,avx2)")
      ->delimiter(',');
  compile->add_flag("--as-variant", compile_args.as_variant, "(internal: one variant of a --target list)")
      ->group("");
  compile->add_option("--source", compile_args.source, "(internal: the source file an artifact names)")->group("");
  compile->add_flag("--check", compile_args.check,
                    "run the imported and the optimised model on the reference executor with seeded random inputs "
                    "and compare (fails past --tolerance)");
  compile->add_option("--dim", compile_args.dims, "bind a symbolic dim, NAME=SIZE (repeatable; --check binds the rest to 1)");
  compile->add_option("--seed", compile_args.seed, "seed of --check's random inputs");
  compile->add_option("--stop-after", compile_args.stop_after, "stop after this many pass runs (to bisect a pipeline)");
  compile->add_option("--pass-option", compile_args.pass_options,
                      "KEY=VALUE option for the passes, e.g. layout=nhwc (repeatable)");
  compile->add_option("--tolerance", compile_args.tolerance,
                      "--check's bound on max|optimised-imported| / max|imported| (default 1e-4; a model with "
                      "int8 parts: 10%, or 2 steps of an output's quantization)")
      ->check(CLI::NonNegativeNumber);
  precision_opts.push_back(
      compile->add_option("--precision", precision,
                          "an artifact's float layers: fp32 (default), bf16 (each target with native bf16: "
                          "avx512_core_bf16, AMX; the others fp32), or auto (bf16 where the target has it and it "
                          "is faster here, within --max-error, default 0.01); checked against fp32 on seeded inputs "
                          "where this CPU has native bf16; the loader runs it so; int8: a quantized model's int8 "
                          "layers, fp32 elsewhere (a float model: quantized first with --calib DIR, else refused)")
          ->check(CLI::IsMember({"fp32", "bf16", "int8", "auto"})));
  const std::string calib_help =
      "with --precision int8: calibrate a float model on this folder's .npy samples (DIR/<sample>.npy for a "
      "one-input model, DIR/<sample>/<input>.npy otherwise) and quantize it (static int8, as ondine quantize) before "
      "it compiles";
  compile->add_option("--calib", g_calib_dir, calib_help);
  compile->add_option("--keep-fp32", g_keep_fp32, "with --precision bf16: nodes whose name matches this glob ('*', "
                                                  "'?') stay fp32 (repeatable; stored in the artifact)");
  compile->add_option("--max-error", g_max_error,
                      "with --precision bf16: keep the most sensitive nodes fp32, one at a time, until the outputs "
                      "on seeded inputs are within E (max |bf16 - fp32| / max |fp32| per output) of fp32's; the "
                      "nodes kept are stored; with --precision int8 --calib DIR: layers stay fp32, worst first, "
                      "until the quantized model is within E of fp32 on the samples")
      ->check(CLI::NonNegativeNumber);

  auto* run = app.add_subcommand("run", "run a model on .npy or seeded random inputs");
  run->add_option("model", model, "ONNX model file or compiled artifact (.ondine)")->required();
  run->add_option("--input", input_specs, "NAME=FILE.npy (repeatable); inputs not given are random");
  run->add_option("--dim", dims, "bind a symbolic dim, NAME=SIZE (repeatable; default 1)");
  run->add_option("--output-dir", output_dir, "write each output as DIR/NAME.npy");
  run->add_option("--seed", seed, "seed of the random inputs");
  run->add_option("--runs", runs, "timed runs for the benchmark line")->check(CLI::PositiveNumber);
  run->add_option("--threads", threads, "oneDNN threads (default: OpenMP's, i.e. OMP_NUM_THREADS or all cores)");
  run->add_flag("--reference", reference, "run on the reference executor instead of the compiled model");
  bool run_profile = false;
  run->add_flag("--profile", run_profile,
                "then as many profiled runs on the same inputs: time per op and implementation (as bench --profile)");
  const std::string precision_help =
      "fp32 (default), bf16: convolutions, matrix products with constant weights, attention and recurrent layers (batch 5 and up) "
      "in bfloat16 with float32 "
      "accumulation, bf16 activations between convolutions and between matrix products (needs native bf16: avx512_core_bf16 or AMX), or auto: "
      "bf16 where the CPU has it, checked against fp32 (--max-error, default 0.01), else fp32; int8: a quantized "
      "model's int8 layers, fp32 elsewhere (a float model: quantized first with --calib DIR, else refused)";
  precision_opts.push_back(
      run->add_option("--precision", precision, precision_help + "; an artifact: its own unless given")
          ->check(CLI::IsMember({"fp32", "bf16", "int8", "auto"})));
  const std::string keep_fp32_help =
      "with --precision bf16: nodes whose name matches this glob ('*', '?') stay fp32 (repeatable)";
  run->add_option("--keep-fp32", g_keep_fp32, keep_fp32_help);
  const std::string max_error_help =
      "with --precision bf16: keep the most sensitive nodes fp32, one at a time, until the outputs are within E "
      "(max |bf16 - fp32| / max |fp32| per output) of the fp32 compile's on the run's inputs; with --precision int8 "
      "--calib DIR: layers stay fp32, worst first, until the quantized model is within E of fp32 on the samples";
  run->add_option("--max-error", g_max_error, max_error_help)->check(CLI::NonNegativeNumber);
  run->add_option("--calib", g_calib_dir, calib_help);
  std::string conv_layout = "auto";
  const std::string conv_layout_help =
      "float32 convolutions' activations: auto (default: blocked), any (oneDNN picks: "
      "channels-last on AVX-512), or blocked (channels in blocks of the vector width: nChw16c on AVX-512, nChw8c on AVX2)";
  run->add_option("--conv-layout", conv_layout, conv_layout_help)->check(CLI::IsMember({"auto", "any", "blocked"}));
  std::string conv_algorithm = "auto";
  const std::string conv_algorithm_help =
      "3x3 stride-1 float32 convolutions: auto (default: Winograd F(4x4,3x3) where measured faster: 16 tiles or "
      "more, 32/16 channels in/out on AVX2, 64/64 with AVX-512), direct (oneDNN's direct kernels), or winograd "
      "(wherever it applies)";
  run->add_option("--conv-algorithm", conv_algorithm, conv_algorithm_help)
      ->check(CLI::IsMember({"auto", "direct", "winograd"}));
  std::string matmul_kernel = "auto";
  const std::string matmul_kernel_help =
      "float32 matrix products by constant 2-D weights (Linear layers): auto (default: oneDNN's 1x1 convolution "
      "over the rows where measured faster: AVX2 CPUs without AVX-512, 2 rows or more), gemm (oneDNN's matmul), or "
      "conv1x1 (the convolution wherever oneDNN has its jit kernel)";
  run->add_option("--matmul-kernel", matmul_kernel, matmul_kernel_help)->check(CLI::IsMember({"auto", "gemm", "conv1x1"}));
  run->add_flag("--check", check, "also run the reference executor and compare (fails past --tolerance)");
  run->add_option("--tolerance", tolerance,
                  "--check's bound on max|compiled-reference| / max|reference| (default 1e-4; a model with int8 "
                  "parts: 10%, or 2 steps of an output's quantization)")
      ->check(CLI::NonNegativeNumber);
  std::int64_t max_loop_iterations = ondine::reference::max_loop_iterations();
  run->add_option("--max-loop-iterations", max_loop_iterations,
                  "a Loop that runs more iterations than this fails (default 10000000)")
      ->check(CLI::PositiveNumber);
  auto* run_passes_opt = run->add_option(
      "--passes", passes,
      "passes compile runs: 'default' (default), 'none', or pass names; with --reference, given explicitly, "
      "the reference executor runs the optimised graph");

  std::vector<std::int64_t> batches;
  std::string json_file;
  int warmup = 5, bench_runs = 50;
  auto* bench = app.add_subcommand("bench", "latency and throughput of the compiled model per batch size");
  bench->add_option("model", model, "ONNX model file or compiled artifact (.ondine)")->required();
  bench->add_option("--batch", batches, "batch sizes, e.g. 1,8 (default 1; a model with static shapes: its own)")
      ->delimiter(',')->check(CLI::PositiveNumber);
  bench->add_option("--dim", dims, "NAME: the symbolic dim --batch sets (needed when there are several); "
                                   "NAME=SIZE: fix another symbolic dim (repeatable); NAME=LO:HI: a stream of shapes, "
                                   "each timed run drawing NAME uniformly in [LO, HI] (seeded), through one shape cache");
  bench->add_option("--threads", threads, "oneDNN threads (default: OpenMP's)");
  auto* bench_warmup_opt = bench->add_option("--warmup", warmup,
                                             "untimed runs per batch size first (a stream: at the ranges' midpoints; "
                                             "--decode: whole decodes, default 1)")
                               ->check(CLI::NonNegativeNumber);
  auto* bench_runs_opt = bench->add_option("--runs", bench_runs,
                                           "timed runs per batch size (a stream: its length; --decode: whole decodes, "
                                           "default 1, medians reported)")
                             ->check(CLI::PositiveNumber);
  ShapeBenchArgs shape_bench_args;
  auto* bench_decode_opt = bench->add_option(
      "--decode", shape_bench_args.decode_steps,
      "decode with the model's KV cache (past_* inputs fed by present_* outputs): the prompt (--dim SEQ=N, default "
      "32) with empty pasts, then STEPS runs of one token each; prompt and per-token times");
  bench_decode_opt->check(CLI::PositiveNumber);
  bench->add_option("--kv-cache", shape_bench_args.kv_cache,
                    "with --decode: in-place (the pasts in buffers of prompt + STEPS positions that each step appends "
                    "to: runtime::KvCache), feed (each step's presents fed back as the next pasts), or auto (default: "
                    "in place where the shape-free plan holds every past)")
      ->check(CLI::IsMember({"auto", "in-place", "feed"}));
  std::string shape_plan = "auto";
  auto* bench_shape_plan_opt =
      bench->add_option("--shape-plan", shape_plan,
                        "with a --dim range or --decode: auto (default: the shape-free plan where it covers the model "
                        "at fp32, else one compile per shape), per-shape, or shape-free")
          ->check(CLI::IsMember({"auto", "per-shape", "shape-free"}));
  bench->add_option("--seed", seed, "seed of the random inputs");
  bench->add_option("--json", json_file, "also write the results as JSON to this file");
  bench->add_flag("--reference", reference, "measure the reference executor instead of the compiled model");
  precision_opts.push_back(
      bench->add_option("--precision", precision, precision_help + "; an artifact: its own unless given")
          ->check(CLI::IsMember({"fp32", "bf16", "int8", "auto"})));
  bench->add_option("--keep-fp32", g_keep_fp32, keep_fp32_help);
  auto* bench_max_error_opt =
      bench->add_option("--max-error", g_max_error, max_error_help)->check(CLI::NonNegativeNumber);
  bench->add_option("--calib", g_calib_dir, calib_help);
  bench->add_option("--conv-layout", conv_layout, conv_layout_help)->check(CLI::IsMember({"auto", "any", "blocked"}));
  bench->add_option("--conv-algorithm", conv_algorithm, conv_algorithm_help)
      ->check(CLI::IsMember({"auto", "direct", "winograd"}));
  bench->add_option("--matmul-kernel", matmul_kernel, matmul_kernel_help)
      ->check(CLI::IsMember({"auto", "gemm", "conv1x1"}));
  bool bench_profile = false;
  bench->add_flag("--profile", bench_profile,
                  "then as many profiled runs: time per op and implementation, share outside oneDNN (overhead)");
  auto* bench_passes_opt = bench->add_option(
      "--passes", passes, "passes compile runs: 'default' (default), 'none' (to compare), or pass names");

  ondine::cli::CompareArgs compare_args;
  auto* compare = ondine::cli::add_compare_command(app, compare_args);
  ondine::cli::QuantizeArgs quantize_args;
  auto* quantize = ondine::cli::add_quantize_command(app, quantize_args);
  ondine::cli::HeaderArgs header_args;
  auto* header = ondine::cli::add_header_command(app, header_args);
  ondine::cli::OpsArgs ops_args;
  auto* ops = ondine::cli::add_ops_command(app, ops_args);

  try {
    for (CLI::App* sub : {inspect, compile, run, bench})
      sub->add_flag("--exact-int8-weights", g_exact_int8_weights, exact_weights_help);
    compile->add_flag("--tune", g_tune,
                      "with -o MODEL.ondine: time the kernel alternatives (conv layout and algorithm, Linear kernel) "
                      "for this CPU's variant at the packing dims and store the fastest in the artifact, which its "
                      "loader applies (a --conv-layout, --conv-algorithm or --matmul-kernel given at load wins)");
    for (CLI::App* sub : {run, bench})
      sub->add_flag("--tune", g_tune,
                    "time the compiler's alternatives for this model on this CPU (conv layout and algorithm, Linear "
                    "kernel, the precision unless --precision is given, 7-bit or exact int8 weights without VNNI) and "
                    "keep the fastest; decisions are cached per model and machine (ONDINE_TUNE_CACHE, else "
                    "~/.cache/ondine/tune.txt), so the next --tune compiles once. A --conv-layout, --conv-algorithm or "
                    "--matmul-kernel given is kept");
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) ? 2 : 0;
  }
  for (CLI::Option* o : precision_opts) g_precision_given = g_precision_given || o->count() > 0;
  g_int8 = precision == "int8";
  g_precision = precision == "bf16" ? lower::Precision::Bf16
                : precision == "auto" ? lower::Precision::Auto
                                      : lower::Precision::Fp32;
  g_conv_layout = conv_layout == "blocked" ? lower::ConvLayout::ChannelBlocked
                  : conv_layout == "any"   ? lower::ConvLayout::Any
                                           : lower::ConvLayout::Auto;
  g_conv_algorithm = conv_algorithm == "direct"     ? lower::ConvAlgorithm::Direct
                     : conv_algorithm == "winograd" ? lower::ConvAlgorithm::Winograd
                                                    : lower::ConvAlgorithm::Auto;
  g_matmul_kernel = matmul_kernel == "gemm"      ? lower::MatMulKernel::Gemm
                    : matmul_kernel == "conv1x1" ? lower::MatMulKernel::Conv1x1
                                                 : lower::MatMulKernel::Auto;
  if (g_precision == lower::Precision::Auto && !g_max_error) g_max_error = 0.01;  // auto is verified
  if (!g_calib_dir.empty() && !g_int8) {
    std::cerr << "ondine: error: --calib quantizes a float model for --precision int8 (give it, or leave --calib out)\n";
    return 2;
  }
  if (g_int8 && !g_keep_fp32.empty()) {
    std::cerr << "ondine: error: --keep-fp32 names bf16's fp32 nodes; with --precision int8, `ondine quantize MODEL "
                 "--calib DIR --exclude NAME_OR_OP` keeps layers fp32\n";
    return 2;
  }
  if (g_int8 && g_max_error && g_calib_dir.empty()) {
    std::cerr << "ondine: error: --max-error with --precision int8 bounds the quantization of a float model: give "
                 "--calib DIR too\n";
    return 2;
  }
  if ((!g_keep_fp32.empty() || g_max_error) && g_precision == lower::Precision::Fp32 && !g_int8) {
    std::cerr << "ondine: error: " << (g_max_error ? "--max-error" : "--keep-fp32")
              << " needs --precision bf16 or auto (everything is fp32 already)\n";
    return 2;
  }
  try {
    if (*inspect)
      return cmd_inspect(model, dims, json, print_graph, dot_file, compiled, threads, inspect_passes,
                         inspect_passes_opt->count() ? inspect_passes : std::string("default"));
    if (*compile) return cmd_compile(model, compile_args);
    if (*compare) return ondine::cli::cmd_compare(compare_args);
    if (*quantize) return ondine::cli::cmd_quantize(quantize_args);
    if (*header) return ondine::cli::cmd_header(header_args);
    if (*ops) return ondine::cli::cmd_ops(ops_args);
    if (*bench) {
      shape_bench_args.shape_plan = shape_plan == "per-shape"    ? lower::ShapePlan::PerShape
                                    : shape_plan == "shape-free" ? lower::ShapePlan::ShapeFree
                                                                 : lower::ShapePlan::Auto;
      shape_bench_args.shape_plan_given = bench_shape_plan_opt->count() > 0;
      shape_bench_args.warmup_given = bench_warmup_opt->count() > 0;
      shape_bench_args.runs_given = bench_runs_opt->count() > 0;
      shape_bench_args.max_error_given = bench_max_error_opt->count() > 0;
      return cmd_bench(model, batches, dims, threads, warmup, bench_runs, seed, reference, json_file, passes,
                       bench_passes_opt->count() > 0, bench_profile, shape_bench_args);
    }
    ondine::reference::set_max_loop_iterations(max_loop_iterations);
    if (*run)
      return cmd_run(model, input_specs, dims, output_dir, seed, runs, reference, threads, check, tolerance, passes,
                     run_passes_opt->count() > 0, run_profile);
  } catch (const UsageError& e) {
    std::cerr << "ondine: error: " << e.what() << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "ondine: error: out of memory\n";
    return 1;
  } catch (const std::exception& e) {  // an ondine::Error's what() is escaped already; others may not be
    std::cerr << "ondine: error: " << ondine::detail::escape_text(e.what()) << "\n";
    return 1;
  } catch (...) {
    std::cerr << "ondine: error: internal error: unknown exception\n";
    return 1;
  }
  return 0;
}
