// SPDX-License-Identifier: Apache-2.0
// ondine/lower/options.hpp - what a caller chooses when a model is compiled (lower::CompileOptions: threads,
// passes, precision, the kernel choices the tuner also makes) and the enums it names. Public API, apart from
// the lowering machinery (lower/detail/) that reads it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include "ondine/fwd.hpp"

namespace ondine::runtime {
class CompiledModel;  // runtime/compiled_model.hpp
}  // namespace ondine::runtime

namespace ondine::lower {

class PackedWeights;  // lower/packed_weights.hpp

// The arithmetic the compute layers run in. Fp32: everything float32. Bf16: convolutions (Conv,
// ondine.FusedConv) and matrix products with constant weights (MatMul, Gemm and their fused forms) take
// bfloat16 sources and weights (packed once) and accumulate in float32; a convolution read only by other
// convolutions writes bfloat16 (no conversion between them), any other writes float32, so every other op
// (attention's own products, normalisations, ...) and the graph's outputs see float32. Only where the CPU has native
// bf16 (avx512_core_bf16, AMX): compile() refuses it elsewhere, since oneDNN would emulate it, slower
// than fp32. LSTM, GRU and RNN from batch 5 run oneDNN's bf16 primitive (bf16 data, states and weights,
// float32 bias and cell state; rnn.hpp). Auto: Bf16 where the CPU has native bf16, else Fp32 (compile() resolves it; an error bound
// verifies it: lower/error_bound.hpp, `--precision auto` in the tool).
enum class Precision { Fp32, Bf16, Auto };

inline const char* precision_name(Precision p) {
  return p == Precision::Bf16 ? "bf16" : p == Precision::Auto ? "auto" : "fp32";
}

// The layout float32 convolutions exchange their activations in, where the layout pass left it to the
// lowering (Layout::Blocked). Any: oneDNN picks (channels-last for its brgconv kernels on AVX-512 in this
// oneDNN). ChannelBlocked: channels in blocks of the vector width (nChw16c on AVX-512, nChw8c below; ONNX
// Runtime's NCHWc), which oneDNN's jit kernels take; a conv whose only blocked kernel is oneDNN's
// reference (a dilated one) keeps Any. Auto (default): ChannelBlocked, at every batch size, where it was
// measured faster or equal on every CNN of the corpus (depthwise and 1x1 layers stream large activations
// better; docs/performance.md, "Channel-blocked convolutions").
enum class ConvLayout { Auto, Any, ChannelBlocked };

// How a 3x3, stride-1 float32 convolution is computed (lower/detail/winograd.hpp). Auto (default): Winograd
// F(4x4, 3x3) where it was measured faster than oneDNN's direct kernels (enough tiles and channels: 1.8-3x
// per conv on AVX2, 1.2-1.7x with AVX-512; winograd::pays), direct elsewhere; Direct: oneDNN's direct kernels always;
// Winograd: wherever it applies on a CPU with AVX2 (to try it on another CPU; the tests). Winograd's
// results differ from the direct conv's by about 1e-5 of the output's scale.
enum class ConvAlgorithm { Auto, Direct, Winograd };

inline const char* conv_algorithm_name(ConvAlgorithm a) {
  return a == ConvAlgorithm::Direct ? "direct" : a == ConvAlgorithm::Winograd ? "winograd" : "auto";
}

// How a float32 matrix product by constant 2-D weights ([M, K] x [K, N], a Linear layer; its A row-major) is
// computed (lower/detail/matmul.hpp). Auto (default): as oneDNN's 1x1 convolution over the M rows as
// positions where that was measured faster (AVX2 CPUs without AVX-512, M >= 2: row-major [M, K] is the
// channels-last [1, K, M] its jit_1x1 kernel reads; 1.1-1.3x gemm:jit on transformer and ConvNeXt shapes),
// oneDNN's matmul elsewhere; Gemm: the matmul always; Conv1x1: the convolution wherever oneDNN has its jit
// kernel for it (to try it on another CPU; the tests).
enum class MatMulKernel { Auto, Gemm, Conv1x1 };

inline const char* matmul_kernel_name(MatMulKernel k) {
  return k == MatMulKernel::Gemm ? "gemm" : k == MatMulKernel::Conv1x1 ? "conv1x1" : "auto";
}

// How a model whose inputs have symbolic dims runs through lower::ShapeCache (lower/shape_cache.hpp). Auto
// (default): the shape-free plan (lower/dynamic.hpp: compiled once, any shape without compiling again) when
// it covers the model's work (matrix products, attention, normalisations, elementwise ops: transformers) and
// the precision is fp32, else one plan compiled per input shape; PerShape: one plan per shape always (a
// convolutional or recurrent model's primitives are made for its shape); ShapeFree: the shape-free plan
// always (fp32).
enum class ShapePlan { Auto, PerShape, ShapeFree };

inline const char* shape_plan_name(ShapePlan p) {
  return p == ShapePlan::PerShape ? "per-shape" : p == ShapePlan::ShapeFree ? "shape-free" : "auto";
}

inline const char* conv_layout_name(ConvLayout l) {
  return l == ConvLayout::ChannelBlocked ? "blocked" : l == ConvLayout::Any ? "any" : "auto";
}

struct CompileOptions {
  // OpenMP threads oneDNN uses, both when primitives are created (their blocking depends on it) and
  // in every run (applied to the calling thread for the run's duration and restored afterwards).
  // 0: OpenMP's default (OMP_NUM_THREADS, else all cores). ExecContext::threads overrides it per context.
  int threads = 0;
  // How many of `threads` a plan runs on: 0, all of them; fewer where the tuner measured fewer faster (its
  // `threads` knob, lower/tune.hpp: a small model spends more waking threads for each step than they save).
  // A plan for another thread count (a stream's: PlanCache::for_threads) runs on all of its own.
  int plan_threads = 0;
  // Verbose log: one line per step with the implementation oneDNN chose, and a summary.
  std::function<void(const std::string&)> log;
  // Long compiles show progress: called as the lowering goes through the graph's nodes (`done` of
  // `total`, about every 1% of them and at the end) with the node being lowered (null at the end).
  std::function<void(std::size_t done, std::size_t total, const Node* node)> progress;
  // Ops to run on the reference kernels even where a oneDNN lowering exists (debugging, bisecting).
  std::set<std::string> reference_ops;
  // The passes run on compile's own copy of the graph before lowering, as a pipeline string
  // (ondine/passes/pipeline.hpp: "fold-bn,fuse", "default" for the default pipeline); "" or "none": none.
  // An artifact's graph compiles with "none" (lower/artifact.hpp, artifact_options): its passes already ran.
  std::string passes = "default";
  // Packed constants shared with other compiles (lower/packed_weights.hpp); null: this compile's own.
  // ShapeCache sets one for all the shapes it compiles.
  std::shared_ptr<PackedWeights> packed_weights;
  Precision precision = Precision::Fp32;
  // Under Precision::Bf16: nodes whose name matches one of these patterns ('*' any run of characters,
  // '?' one) stay float32, with float32 activations around them (a sensitive head, a first layer).
  std::vector<std::string> keep_fp32;
  // The float32 convolutions' activation layout (ConvLayout above).
  ConvLayout conv_layout = ConvLayout::Auto;
  // 3x3 stride-1 float32 convolutions: Winograd where it pays (ConvAlgorithm above).
  ConvAlgorithm conv_algorithm = ConvAlgorithm::Auto;
  // Float32 matrix products by constant 2-D weights: oneDNN's matmul or a 1x1 convolution (MatMulKernel above).
  MatMulKernel matmul_kernel = MatMulKernel::Auto;
  // On a CPU without VNNI, whose int8 kernels saturate past 7-bit weights: true requantizes a QDQ layer's
  // 8-bit weights to 7 bits (w/2 rounded half to even, scales doubled: up to half an 8-bit step more error
  // per weight) so that it runs int8; false keeps such layers in float, exactly as the file says, their
  // QuantizeLinear/DequantizeLinear pairs as post-ops (passes/fake_quant.hpp). Unset (default): true where
  // this CPU's measured int8 rate is well above its fp32 rate (int8_7bit_weights_by_default, int8_plan.hpp),
  // false where int8 gains nothing (AMD Zen 2: both about 37 G(FL)OP/s per core). No effect with VNNI.
  std::optional<bool> int8_7bit_weights;
  // Weight-only quantized matrix products (4- or 8-bit weights, float activations: ondine.WeightOnlyMatMul):
  // true (default) quantizes their activations to int8 per row and block of K (symmetric, max |a| / 127) and
  // multiplies integers (VNNI, or AVX2's vpmaddubsw), as ONNX Runtime's MatMulNBits at accuracy level 4 and
  // llama.cpp do: what a weight-only model is for, several times fewer instructions per weight. false: float32
  // activations, the model's own arithmetic within float32 rounding (docs/language_models.md).
  bool weight_only_int8_activations = true;
  // Models with symbolic input dims run through a ShapeCache: the shape-free plan or one plan per shape
  // (ShapePlan above).
  ShapePlan shape_plan = ShapePlan::Auto;
  // Knobs above ("conv_layout", "conv_algorithm", "matmul_kernel", "precision", "int8_weights") whose setting
  // was chosen rather than given by the caller, and how: "tuned" (lower::tune, or an artifact's stored
  // choices) or "heuristic" (compile() resolving Precision::Auto). Only the per-step report reads it
  // (StepInfo::choice: a knob not listed is "option" where set, else "heuristic").
  std::map<std::string, std::string> choice_origins;
  // Per node (by name), what lower::tune measured faster for that node than the model-wide setting: a 3x3
  // convolution's algorithm; in a bf16 compile, the layers kept float32 (as keep_fp32 names them, by exact name).
  std::map<std::string, ConvAlgorithm> conv_algorithm_per_node;
  std::set<std::string> fp32_nodes;
};

// The threads a plan compiled with `o` runs on (0: OpenMP's default): CompileOptions::plan_threads where it
// asks for fewer than `threads`, else `threads`.
inline int plan_thread_count(const CompileOptions& o) {
  return o.plan_threads > 0 && (o.threads <= 0 || o.plan_threads < o.threads) ? o.plan_threads : o.threads;
}

// `text` matches the glob `pattern`: '*' any run of characters (also none), '?' exactly one.
inline bool glob_match(const std::string& pattern, const std::string& text) {
  std::size_t p = 0, t = 0, star = std::string::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

// A function that compiles a graph with static input shapes: lower::compile. The parts of the compiler that
// compile graphs of their own (subgraphs, the later stages of a staged model, each shape of a PlanCache) are
// handed it by the driver (lower/compiler.hpp) rather than including it.
using CompileFn = runtime::CompiledModel (*)(Graph&& graph, const CompileOptions& options);

}  // namespace ondine::lower
