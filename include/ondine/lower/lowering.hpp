// SPDX-License-Identifier: Apache-2.0
// ondine/lower/lowering.hpp - the lowering of a graph with static shapes into the steps of a CompiledModel:
// oneDNN 2.6 primitives, Ondine's kernels, and reference kernels for the rest.
//
// Lowering walks the nodes in topological order. Each op with a oneDNN lowering (conv, conv transpose,
// matmul/gemm/einsum, pooling, batch norm, layer norm, resize, eltwise, binary, softmax, concat, transpose, views)
// creates its primitive descriptor and primitive once, here, with weights reordered into the primitive's
// layout once; GridSample, RoiAlign, DFT and STFT (on KissFFT, when the build has it) run Ondine's own
// kernels (detail/sampling.hpp, detail/signal.hpp); the rest run their reference kernel (ondine/reference)
// on row-major tensors. A lowering that finds its case unsupported (a dtype, a non-constant weight, a
// shape oneDNN rejects) returns false and the node falls back to the reference kernel, so every graph the
// reference executor runs also compiles.
//
// After lowering: steps whose results nothing needs are dropped (e.g. the Shape/Gather/Concat chain
// feeding a Reshape's shape input), and the intermediate slots are placed in one arena by liveness.
// The driver that runs the passes and resolves shapes first is lower/compiler.hpp.
#pragma once

#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ondine/ir/graph.hpp"
#include "ondine/ir/shape_inference.hpp"
#include "ondine/lower/detail/attention.hpp"
#include "ondine/lower/detail/broadcast_ops.hpp"
#include "ondine/lower/detail/channel_norm.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/control_flow.hpp"
#include "ondine/lower/detail/conv.hpp"
#include "ondine/lower/detail/deconv.hpp"
#include "ondine/lower/detail/dynamic_quant.hpp"
#include "ondine/lower/detail/einsum.hpp"
#include "ondine/lower/detail/eltwise.hpp"
#include "ondine/lower/detail/group_norm.hpp"
#include "ondine/lower/detail/kernel_step.hpp"
#include "ondine/lower/detail/matmul.hpp"
#include "ondine/lower/detail/norm.hpp"
#include "ondine/lower/detail/pool.hpp"
#include "ondine/lower/detail/quantized.hpp"
#include "ondine/lower/detail/reorder.hpp"
#include "ondine/lower/detail/resample.hpp"
#include "ondine/lower/detail/rnn.hpp"
#include "ondine/lower/detail/sampling.hpp"
#include "ondine/lower/detail/weight_only.hpp"
#include "ondine/lower/detail/shape_ops.hpp"
#include "ondine/lower/detail/signal.hpp"
#include "ondine/lower/int8_plan.hpp"
#include "ondine/lower/isa.hpp"
#include "ondine/lower/pass_pipeline.hpp"
#include "ondine/reference/executor.hpp"
#include "ondine/runtime/compiled_model.hpp"
#include "ondine/runtime/memory_plan.hpp"

namespace ondine::lower {

// Precision::Bf16 where oneDNN would emulate bf16 (no native bf16 in its effective ISA): an Error saying so.
inline void check_precision(const CompileOptions& options) {
  if (options.precision != Precision::Bf16 || effective_isa().bf16_native) return;
  throw Error(std::string("precision bf16 needs a CPU with native bf16 (avx512_core_bf16 or avx512_core_amx); oneDNN "
                          "runs ") +
              effective_isa().name +
              " here and would emulate bf16, slower than fp32: use precision fp32" +
              (std::getenv("DNNL_MAX_CPU_ISA") ? " (DNNL_MAX_CPU_ISA caps the ISA)" : ""));
}

// Precision::Auto as what it means on this CPU: Bf16 where bf16 is native and faster than fp32
// (IsaInfo::bf16_faster), else Fp32.
inline Precision resolved_precision(Precision p) {
  if (p != Precision::Auto) return p;
  return effective_isa().bf16_faster ? Precision::Bf16 : Precision::Fp32;
}


namespace detail {

using LowerFn = bool (*)(Lowering&, const Node&);

// How an op is lowered: `fn` creates its primitive (or Ondine kernel) and returns false to decline a node,
// which then runs its reference kernel inside the plan. `kernel` and `declines` say what runs and when the
// lowering declines, in words (`ondine ops` prints them, docs/operators.md is their output); `bf16`: the
// op computes in bfloat16 under Precision::Bf16 (others keep float32 between bf16 layers).
struct Lowerer {
  LowerFn fn = nullptr;
  const char* kernel = "";
  const char* declines = "";
  bool bf16 = false;
};

// The ops with a oneDNN lowering or an Ondine kernel (each may still decline a particular node).
inline const std::map<std::string, Lowerer>& lowering_table() {
  static const std::map<std::string, Lowerer> table = [] {
    std::map<std::string, Lowerer> t;
    const char* conv_declines = "not float32, or not 1-3 spatial axes";
    t["Conv"] = {lower_conv, "oneDNN convolution (post-ops fused; a trailing SiLU runs Ondine's AVX-512/AVX2 kernel; 3x3 stride 1 as Winograd F(4x4,3x3) where it pays)",
                 conv_declines, true};
    t["ondine.FusedConv"] = t["Conv"];
    t["ConvTranspose"] = {lower_deconv, "oneDNN deconvolution", "not float32, not 1-3 spatial axes, or negative pads"};
    const char* matmul_declines = "not float32, or batch dims that do not broadcast";
    t["MatMul"] = {lower_matmul, "oneDNN matmul (bias, binary and eltwise post-ops fused)", matmul_declines, true};
    t["ondine.FusedMatMul"] = t["MatMul"];
    t["Gemm"] = {lower_gemm, "oneDNN matmul", "not float32, C that does not broadcast to [M, N], or beta != 1 with a run-time C",
                 true};
    t["ondine.FusedGemm"] = t["Gemm"];
    t["Einsum"] = {lower_einsum, "oneDNN matmul on strided views (no transposed copies)",
                   "not float32, or an equation that is not a batched matrix product after transposes"};
    t["ondine.Gelu"] = {lower_eltwise, "oneDNN eltwise gelu_erf / gelu_tanh (or a post-op of the producer)",
                        "not float32"};
    t["Gelu"] = t["ondine.Gelu"];  // opset 20: the same op as ondine.Gelu
    t["ondine.FakeQuant"] = {lower_eltwise, "oneDNN eltwise linear + round + clip + pow (or post-ops of the producer)",
                             "not float32"};
    t["ondine.Attention"] = {lower_attention, "oneDNN matmul + softmax + matmul, scores in a per-thread buffer",
                             "not float32, or a mask that does not broadcast to the scores"};
    t["MaxPool"] = {lower_pool, "oneDNN pooling", "not float32, not 1-3 spatial axes, or its Indices output read"};
    t["AveragePool"] = {lower_pool, "oneDNN pooling",
                        "not float32, not 1-3 spatial axes, or count_include_pad with a ceil_mode window past the pads"};
    for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"})
      t[op] = {lower_pool, "oneDNN pooling", "not float32, or not 1-3 spatial axes"};
    for (const char* op : {"ReduceMean", "ReduceMax"})
      t[op] = {lower_reduce_as_pool, "oneDNN global pooling (a reduction over every spatial axis)",
               "not float32, or axes other than all the spatial ones of [N, C, spatial...] (1-3 of them)"};
    t["BatchNormalization"] = {lower_batchnorm, "oneDNN batch normalization (inference)",
                               "not float32, training_mode, or mean/var outputs read"};
    t["LayerNormalization"] = {lower_layernorm, "oneDNN layer normalization",
                               "not float32, no Scale, stash_type != 1, or Mean/InvStdDev outputs read"};
    t["ondine.RMSNorm"] = {lower_rms_norm, "Ondine's row kernel (the shape-free plan's): sum of squares, then scale",
                           "not float32"};
    t["ondine.Rotary"] = {lower_rotary, "Ondine's row kernel (the shape-free plan's): both halves in one pass",
                          "not float32"};
    t["GroupNormalization"] = {lower_group_norm,
                               "Ondine's kernel (AVX-512 / AVX2 / C++): statistics per group, the per-channel affine "
                               "and a following Relu / LeakyRelu / Clip / SiLU in one write",
                               "not float32, or scale / bias computed at run time"};
    t["ondine.GroupNorm"] = t["GroupNormalization"];
    t["InstanceNormalization"] = t["GroupNormalization"];  // a group per channel
    t["ondine.ChannelLayerNorm"] = {lower_channel_layer_norm,
                                    "Ondine's kernel (AVX2 / C++) on the producer's layout: plain, channels-last or "
                                    "channel-blocked",
                                    "not float32, or scale / bias computed at run time"};
    t["Resize"] = {lower_resize, "oneDNN resampling",
                   "mode cubic, tf_crop_and_resize, sizes/scales computed at run time, resizing N or C, or sample "
                   "positions oneDNN's coordinate rule does not give"};
    t["Softmax"] = {lower_softmax, "oneDNN softmax", "not float32, or opset < 13 with an axis other than the last"};
    t["LogSoftmax"] = {lower_softmax, "oneDNN logsoftmax", "not float32, or opset < 13 with an axis other than the last"};
    for (const char* op : {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Exp", "Log", "Sqrt", "Abs", "Neg",
                           "Softplus", "HardSwish", "HardSigmoid", "Reciprocal"})
      t[op] = {lower_eltwise, "oneDNN eltwise (or a post-op of the producer)", "not float32"};
    t["PRelu"] = {lower_prelu, "a prelu post-op of the producing conv, else oneDNN prelu (one slope: eltwise relu)",
                  "not float32, or slopes computed at run time or not one per channel"};
    t["Clip"] = {lower_eltwise, "oneDNN eltwise clip (or a post-op of the producer)",
                 "not float32, or min/max computed at run time"};
    t["Pow"] = {lower_eltwise, "oneDNN eltwise pow (or a post-op of the producer)",
                "not float32, or an exponent that is not a constant scalar"};
    for (const char* op : {"Add", "Sub", "Mul", "Div", "Max", "Min"})
      t[op] = {lower_binary, "oneDNN binary (or a post-op of the producer)",
               "not float32, two inputs that both broadcast, a scalar output, or Sub/Div whose first input broadcasts"};
    t["Concat"] = {lower_concat,
                   "in place where each piece is a contiguous chunk of the result (batch 1 on channels: the producers "
                   "write into it, concats sharing pieces one buffer), else oneDNN concat",
                   "not float32 or int8 of one type, or no axis"};
    for (const char* op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
      t[op] = {lower_view, "a view: no copy for row-major data, else one reorder", "dims not static"};
    t["Transpose"] = {lower_transpose, "oneDNN reorder; a view when it moves only size-1 dims (any dtype)",
                      "rank above 6, or a dtype oneDNN lacks (unless a view)"};
    t["DepthToSpace"] = {lower_depth_to_space, "oneDNN reorder", "not 4-D, or a dtype oneDNN lacks"};
    t["Gather"] = {lower_gather, "a view (one constant scalar index), as Slice; else Ondine's copy of one row per index "
                   "(an embedding lookup), the indices checked at run time",
                   "shapes not static, indices neither int64 nor int32, or a string tensor"};
    t["Cast"] = {lower_cast, "Ondine's conversion loop (float32/64, int8/32/64, uint8, bool)",
                 "another dtype (float16, bfloat16, string, ...), or shapes not static"};
    t["Expand"] = {lower_expand, "Ondine's broadcast copy (any dtype up to 8 bytes)", "shapes not static, or an empty tensor"};
    t["Where"] = {lower_where, "Ondine's broadcast select (any dtype up to 8 bytes)",
                  "shapes not static, or an empty tensor"};
    for (const char* op : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"})
      t[op] = {lower_compare, "Ondine's broadcast comparison",
               "a dtype other than float32/64, int8/32/64, uint8 (and bool for Equal), shapes not static, or "
               "opset below 7"};
    t["Slice"] = {lower_slice, "a view or oneDNN reorder",
                  "starts/ends/axes/steps computed at run time, a negative step, rank above 6, or an empty output"};
    for (const char* op : {"LSTM", "GRU", "RNN"})
      t[op] = {lower_recurrent,
               "oneDNN lstm_forward / gru_forward / lbr_gru_forward / vanilla_rnn_forward (an fp32 LSTM or lbr GRU at "
               "batch 1-4 on AVX-512, 1-8 on AVX2: Ondine's recurrence kernel)",
               "weights computed at run time, clip, input_forget, sequence_lens shorter than the sequence, "
               "non-default activations, or layout 1",
               true};
    t["Pad"] = {lower_pad, "Ondine's copy, any dtype: constant, the fill then each row's kept part in one block; "
                "reflect, edge, wrap: each row from the input row it maps to",
                "pads, axes or the value computed at run time; reflect pads past the axis"};
    t["Split"] = {lower_split, "strided views of the input, one per output (an alias when there is one output)",
                  "a constant input, an empty part, more than 6 dims"};
    t["Identity"] = {lower_identity, "an alias (no copy)", "dims not static"};
    t["Dropout"] = {lower_identity, "an alias (no copy)", "training_mode, a ratio that is not a constant 0, or the mask read"};
    t["ondine.Reorder"] = {lower_reorder, "oneDNN reorder", "a dtype oneDNN lacks"};
    t["ondine.QConv"] = {lower_qconv, "oneDNN int8 convolution (u8/s8 x s8, per-channel scales)",
                         "post-ops oneDNN cannot express exactly"};
    t["ondine.QMatMul"] = {lower_qmatmul, "oneDNN int8 matmul", "post-ops oneDNN cannot express exactly"};
    t["ondine.QPool"] = {lower_qpool, "oneDNN int8 pooling", "a window oneDNN cannot express"};
    t["ondine.QLSTM"] = {lower_recurrent, "oneDNN int8 lstm_forward", "as LSTM, or peepholes"};
    t["DynamicQuantizeLinear"] = {lower_dynamic_quantize_linear, "Ondine's min/max and quantize kernel (AVX-512 or plain)",
                                  "not float32"};
    t["ondine.DynQMatMul"] = {lower_dyn_qmatmul,
                              "oneDNN matmul with run-time scales (int8 where exact, else float32 on the centred integers)",
                              "weights computed at run time, or post-ops oneDNN cannot express exactly"};
    t["ondine.DynQConv"] = {lower_dyn_qconv,
                            "oneDNN convolution with run-time scales (int8 where exact, else float32 on the centred integers)",
                            "weights computed at run time, or post-ops oneDNN cannot express exactly"};
    t["ondine.WeightOnlyMatMul"] = {lower_weight_only_matmul,
                                    "Ondine's weight-only loop: 4- or 8-bit weights packed in column tiles, dequantised in "
                                    "registers (AVX-512 / AVX2 / C++), float32 activations, threads over the tiles",
                                    "shapes not static, or operands that are not the constants its definition asks for"};
    t["QuantizeLinear"] = {lower_qdq_reorder, "oneDNN reorder with scales",
                           "scale or zero point computed at run time or per axis, not float32 <-> 8-bit, or scale <= 0"};
    t["DequantizeLinear"] = t["QuantizeLinear"];
    const char* fft_declines =
        "not float32, sizes or axis computed at run time, or a build without KissFFT (ONDINE_HAVE_KISSFFT)";
    t["DFT"] = {lower_dft, "KissFFT (kissfft-float), plans made at compile time; real input on a half-length plan",
                fft_declines};
    t["STFT"] = {lower_stft, "real frames of a power of two into onesided bins: Ondine's FFT, a frame per SIMD lane "
                 "(AVX-512 / AVX2); else KissFFT (kissfft-float) per frame, plans made at compile time",
                 "not float32, frame_step or frame_length computed at run time, or a build without KissFFT "
                 "(ONDINE_HAVE_KISSFFT)"};
    t["GridSample"] = {lower_grid_sample, "Ondine's gather kernel (AVX-512 / AVX2 / C++), taps computed once per point",
                       "not float32, or not 4-D"};
    t["RoiAlign"] = {lower_roi_align,
                     "Ondine's kernel, 16 / 8 channels a vector (AVX-512 / AVX2) on a blocked or channels-last "
                     "map, sample taps computed once per ROI",
                     "not float32, or an empty image"};
    return t;
  }();
  return table;
}

// True for a node that reads or writes a tensor with no elements (a zero-sized dim: no detection, no
// proposal at some pyramid level): it runs on its reference kernel, which takes empty tensors, rather
// than a oneDNN primitive made for a zero-sized shape. Costs nothing: there is no work.
// An empty constant is a parameter, not data (Resize's unused roi as PyTorch exports it): it does not
// count.
inline bool touches_empty(const Node& n) {
  auto empty = [](const Value* v) {
    if (!v || !v->is_tensor() || !v->shape().is_static()) return false;
    std::optional<std::int64_t> count = v->shape().numel();
    return count && *count == 0;
  };
  for (const Value* v : n.inputs())
    if (empty(v) && !v->is_constant()) return true;
  for (const Value* v : n.outputs())
    if (empty(v)) return true;
  return false;
}

inline void lower_reference(Lowering& L, const Node& n) {
  const auto& kernels = reference::kernel_table();
  auto it = kernels.find(n.op_key());
  if (it == kernels.end()) throw n.error("unsupported op: no oneDNN lowering and no reference kernel");
  RowMajorOperands ops = row_major_operands(L, n);
  std::vector<ReferenceStep::Operand>& ins = ops.inputs;
  std::vector<ReferenceStep::Operand>& outs = ops.outputs;
  const std::string& detail = ops.types;
  if (is_control_flow(n) && !L.options.reference_ops.count(n.op_key())) {
    // Control flow: its subgraphs compiled (detail/control_flow.hpp), unless the op is forced onto its
    // reference kernel (CompileOptions::reference_ops), which runs them on the reference executor.
    CompiledBodies bodies = compile_bodies(n, L.options, L.compile_body);
    std::string compiled;
    for (const auto& [attr, sub] : n.subgraphs())
      if (auto b = bodies.find(sub); b != bodies.end())
        compiled += (compiled.empty() ? "" : ", ") + attr + " (" + std::to_string(b->second->steps().size()) + " steps)";
    const bool all = bodies.size() == n.subgraphs().size();
    L.add_step(std::make_unique<ControlFlowStep>(
        runtime::StepInfo{n.name(), n.op_type(), all ? "compiled subgraphs" : "reference",
                          detail + (compiled.empty() ? "" : "; compiled: " + compiled)},
        &n, std::move(ins), std::move(outs), std::move(bodies)));
    return;
  }
  // A node without elements is no slow path: named so that reports do not count it.
  const char* implementation = touches_empty(n) ? "no elements (reference kernel)" : "reference";
  L.add_step(std::make_unique<ReferenceStep>(runtime::StepInfo{n.name(), n.op_type(), implementation, detail}, &n,
                                             it->second, std::move(ins), std::move(outs)));
}

// True for a value the compiled plan holds in a slot: a tensor of fixed-size elements. Sequences,
// optionals and string tensors are not bytes of a known size; they live outside the plan, where the
// staged compile (lower/staged.hpp) runs the nodes that make or read them on reference kernels.
inline bool in_plan(const Value* v) { return v->is_tensor() && v->dtype() != DType::String; }

// Every graph input must have static dims, and shape inference must give every value a static shape.
inline void check_static_shapes(const Graph& g) {
  for (Value* in : g.inputs())
    if (in_plan(in) && !in->shape().is_static())  // a sequence or string input goes to reference kernels
      throw Error("input '" + in->name() + "' has shape " + in->shape().str() +
                  ": compiling needs static shapes; bind its symbolic dims first (ondine::bind_dims)");
}
inline bool all_shapes_static(const Graph& g) {
  for (const Value* in : g.inputs())
    if (!in_plan(in)) return false;  // a sequence, optional or string input: compiled in stages (lower/staged.hpp)
  for (Node* n : g.nodes()) {
    for (const Value* v : n->inputs())
      if (v && !in_plan(v)) return false;  // a string constant: its reader runs staged, outside the plan
    for (const Value* v : n->outputs())
      if (v && (!in_plan(v) || v->dtype() == DType::Undefined || !v->shape().is_static())) return false;
  }
  return true;
}

// The first node (in topological order) whose outputs are not static although its inputs are: the one
// that blocks static shapes. Its output shape depends on data (NonZero, a Reshape fed by one) or on
// an op without shape inference.
inline void check_node_shapes(const Graph& g) {
  for (Node* n : g.topo_order()) {
    for (const Value* v : n->outputs()) {
      if (!v) continue;
      if (v->dtype() == DType::Undefined || !v->shape().is_static()) {
        std::string why = infer_table().count(n->op_key())
                              ? "its shape depends on the data of an input, not only on the input shapes"
                              : "the op has no shape inference";
        throw n->error("output '" + v->name() + "' has no static type and shape (" + Graph::value_type_str(v) +
                       ") after the graph inputs were bound: " + why +
                       "; the compiled runtime needs static shapes (data-dependent shapes are unsupported)");
      }
    }
  }
}

// Shapes that follow from the inputs only through computed values (a causal mask's Range, pads from
// Mod/Sub on the image size, a Reshape target through Cast/Div/Floor) are static once those values are
// computed: fold them now, whatever options.passes says, since the runtime needs static shapes. The
// shape values of inference (ir/infer/values.hpp) resolve most chains without this; float chains and
// ops without value rules need the folding, and a Loop with a known trip count its unrolling.
inline bool no_pipeline(const std::string& pipeline) { return pipeline.empty() || pipeline == "none"; }

// Returns whether it folded anything (shapes are inferred again then).
inline bool resolve_static_shapes(Graph& g, const CompileOptions& options) {
  if (all_shapes_static(g)) return false;
  if (!run_pipeline(g, "fold-constants*,unroll-loops,fold-constants*,dce", options, false, /*quiet*/ true)) return false;
  infer_shapes(g);
  if (options.log) options.log("shapes: folded the values that shapes depend on (fold-constants*, unroll-loops, fold-constants*, dce)");
  return true;
}

inline void check_ops(const Graph& g) {
  std::map<std::string, std::vector<const Node*>> bad;
  for (Node* n : g.nodes()) {
    bool ok = lowering_table().count(n->op_key()) || reference::kernel_table().count(n->op_key());
    if (!ok) bad[n->op_key()].push_back(n);
  }
  if (bad.empty()) return;
  std::string msg = "unsupported op" + std::string(bad.size() > 1 ? "s" : "") + ": ";
  bool first = true;
  for (auto& [op, nodes] : bad) {
    msg += (first ? "" : "; ") + op + " (e.g. '" + nodes.front()->name() + "')";
    first = false;
  }
  const Node* n = bad.begin()->second.front();
  throw Error(msg).at_node(n->name(), n->op_type());
}

// Drops the steps whose writes nothing needs; graph outputs are needed.
inline std::vector<std::unique_ptr<runtime::Step>> live_steps(Lowering& L) {
  std::set<SlotId> needed;
  for (auto& out : L.program.outputs) needed.insert(L.root(out.slot));
  std::vector<bool> live(L.steps.size(), false);
  for (std::size_t i = L.steps.size(); i-- > 0;) {
    for (SlotId w : L.steps[i]->writes())
      if (needed.count(L.root(w))) live[i] = true;
    if (live[i])
      for (SlotId r : L.steps[i]->reads()) needed.insert(L.root(r));
  }
  std::vector<std::unique_ptr<runtime::Step>> out;
  for (std::size_t i = 0; i < L.steps.size(); ++i)
    if (live[i]) out.push_back(std::move(L.steps[i]));
  return out;
}

// Places the arena slots by liveness over the final step order.
inline void plan_arena(runtime::Program& p, const Lowering& L) {
  std::map<SlotId, std::pair<std::size_t, std::size_t>> span;  // root arena slot -> [first, last]
  for (std::size_t i = 0; i < p.steps.size(); ++i) {
    auto touch = [&](SlotId s) {
      SlotId r = L.root(s);
      if (p.slots[r].kind != SlotKind::Arena) return;
      auto [it, fresh] = span.emplace(r, std::make_pair(i, i));
      if (!fresh) it->second.second = i;
    };
    for (SlotId s : p.steps[i]->writes()) touch(s);
    for (SlotId s : p.steps[i]->reads()) touch(s);
  }
  std::vector<runtime::BufferLifetime> buffers;
  std::vector<SlotId> ids;
  for (auto& [slot, range] : span) {
    buffers.push_back({p.slots[slot].bytes, range.first, range.second});
    ids.push_back(slot);
  }
  p.plan = runtime::plan_memory(buffers, 64);
  for (std::size_t i = 0; i < ids.size(); ++i) p.slots[ids[i]].index = p.plan.offsets[i];
  p.memory.arena_bytes = p.plan.arena_bytes;
  p.memory.peak_bytes = p.plan.peak_bytes;
  p.memory.total_bytes = p.plan.total_bytes;
}

// Runs options.passes on compile's copy of the graph (shapes already inferred), which logs the per-pass
// summary; infers again when a pass changed the graph, so values the passes created have static shapes.
inline void run_passes(Graph& g, const CompileOptions& options) {
  if (no_pipeline(options.passes)) return;
  if (!run_pipeline(g, options.passes, options, true)) return;
  infer_shapes(g);
  check_ops(g);  // a user pass may have created an op nothing runs
  check_node_shapes(g);
}

// Lowers `g` (shapes static, passes done) into a CompiledModel; `compile_body` compiles the subgraphs of its
// control flow. Reports progress and logs the steps, the arena and the precision per options.
inline CompiledModel lower_static(std::shared_ptr<Graph> g, const CompileOptions& options, CompileFn compile_body) {
  ThreadCountScope threads(plan_thread_count(options));
  auto program = std::make_shared<runtime::Program>();
  auto library = std::make_shared<Library>();
  if (options.packed_weights) library->engine = options.packed_weights->engine();
  program->graph = g;
  program->isa = effective_isa().name;
  program->threads = plan_thread_count(options);
  program->library = library;
  program->make_backend = [library]() -> std::unique_ptr<runtime::ContextBackend> {
    return std::make_unique<DnnlBackend>(library->engine);
  };

  Lowering L(*g, options, library, *program);
  L.compile_body = compile_body;
  const auto& table = lowering_table();
  const std::vector<Node*> order = g->topo_order();
  const std::size_t report_every = std::max<std::size_t>(1, order.size() / 100);
  for (std::size_t i = 0; i < order.size(); ++i) {
    Node* n = order[i];
    if (options.progress && i % report_every == 0) options.progress(i, order.size(), n);
    if (L.fused.count(n)) continue;
    L.current = n;
    try {
      auto it = table.find(n->op_key());
      bool lowered = it != table.end() && !options.reference_ops.count(n->op_key()) && !touches_empty(*n) &&
                     it->second.fn(L, *n);
      if (!lowered) lower_reference(L, *n);
    } catch (const dnnl::error& e) {
      throw n->error(std::string("oneDNN: ") + e.what());
    } catch (Error& e) {
      if (e.node().empty() && e.op().empty()) e.at_node(n->name(), n->op_type());
      throw;
    }
  }
  L.finish_outputs();
  if (options.progress) options.progress(order.size(), order.size(), nullptr);

  program->steps = live_steps(L);
  for (std::size_t i = 0; i < program->steps.size(); ++i) program->steps[i]->set_index(i);
  plan_arena(*program, L);
  program->memory.scratchpad_bytes = L.scratchpad_bytes;
  program->memory.constant_bytes = L.constant_bytes;
  for (const Node* n : L.bf16_nodes) program->bf16_nodes.push_back(n->name());

  CompiledModel model(program);
  if (options.log) {
    for (auto& s : program->steps) {
      std::ostringstream line;
      line << "[" << s->index() << "] " << s->op() << " '" << s->name() << "': " << s->implementation();
      if (!s->info().detail.empty()) line << "  (" << s->info().detail << ")";
      options.log(line.str());
    }
    std::ostringstream sum;
    sum << "compiled " << program->steps.size() << " steps for " << program->isa << "; arena "
        << program->memory.arena_bytes << " B (peak " << program->memory.peak_bytes << " B, sum "
        << program->memory.total_bytes << " B), scratchpad " << program->memory.scratchpad_bytes << " B";
    options.log(sum.str());
    if (options.precision == Precision::Bf16) {
      // Which convolutions, matrix products and recurrent layers compute in bfloat16, and which stay float32.
      std::ostringstream bf16;
      bf16 << "precision: bf16 in " << L.bf16_nodes.size() << " of " << L.bf16_nodes.size() + L.kept_fp32_nodes.size()
           << " convolutions, matrix products with constant weights, attention and recurrent layers";
      if (!L.kept_fp32_nodes.empty()) {
        bf16 << "; kept fp32:";
        for (const Node* n : L.kept_fp32_nodes) bf16 << " '" << n->name() << "'";
      }
      options.log(bf16.str());
      if (!effective_isa().bf16_faster)
        options.log("precision: note: bf16 is slower than fp32 on this CPU (" + bf16_not_faster_reason(effective_isa()) +
                    "); precision auto compiles fp32 here");
    }
    std::istringstream int8(int8_plan(model).text());  // Q/DQ left, fp32 islands, predicted int8 vs fp32
    for (std::string line; std::getline(int8, line);) options.log(line);
  }
  return model;
}

}  // namespace detail
}  // namespace ondine::lower
