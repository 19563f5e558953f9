// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/eltwise.hpp - unary activations (oneDNN eltwise) and broadcasting binary ops
// (oneDNN binary), plus the post-op fusion that attaches activations and residual adds to the
// conv/matmul primitive producing their input.
//
// Eltwise primitives are created on their producer's layout (they are layout-agnostic), so a
// Conv -> Relu chain never changes layout. Binary ops keep src0's layout; a broadcast operand is read
// row-major with its dims left-padded with 1s (oneDNN broadcasts src1 only, so src0 must have the
// output's dims: commutative ops swap their operands when needed, Sub/Div fall back otherwise).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/prelu.hpp"
#include "ondine/lower/detail/silu.hpp"
#include "ondine/lower/isa.hpp"

namespace ondine::lower::detail {

// One activation as up to two oneDNN eltwise algorithms applied in order, or (a post-op chain only, no ops)
// a PRelu with one slope per channel, the constant `prelu_slope` (Ondine's kernel: take_trailing_prelu).
struct EltwiseSpec {
  struct Op {
    dnnl::algorithm alg;
    float alpha = 0, beta = 0;
  };
  std::vector<Op> ops;
  const Value* prelu_slope = nullptr;
};

inline bool is_f32(const Value* v) { return v && v->dtype() == DType::Float32 && v->shape().is_static(); }

// A constant scalar input (Clip's min/max since opset 11), or `fallback` when the input is omitted.
// nullopt when it is present but not a constant f32 scalar.
inline std::optional<float> constant_scalar(const Node& n, std::size_t i, float fallback) {
  const Value* v = n.input(i);
  if (!v) return fallback;
  if (!v->is_constant() || v->dtype() != DType::Float32 || v->constant().numel() != 1) return std::nullopt;
  return v->constant().data<float>()[0];
}

// The oneDNN algorithms computing one activation of a fused op's chain (ondine/ir/fused_ops.hpp).
inline EltwiseSpec eltwise_of(const fused::Activation& a) {
  using A = dnnl::algorithm;
  EltwiseSpec s;
  auto one = [&](A alg, float alpha = 0, float beta = 0) {
    s.ops.push_back({alg, alpha, beta});
    return s;
  };
  const std::string& op = a.op;
  if (op == "Relu") return one(A::eltwise_relu);
  if (op == "LeakyRelu") return one(A::eltwise_relu, a.alpha);
  if (op == "Sigmoid") return one(A::eltwise_logistic);
  if (op == "Tanh") return one(A::eltwise_tanh);
  if (op == "Elu") return one(A::eltwise_elu, a.alpha);
  if (op == "HardSwish") return one(A::eltwise_hardswish);
  if (op == "Gelu") return one(A::eltwise_gelu_erf);
  if (op == "GeluTanh") return one(A::eltwise_gelu_tanh);
  if (op == "Swish") return one(A::eltwise_swish, a.alpha);  // x * logistic(alpha * x)
  if (op == "HardSigmoid") {  // max(0, min(1, alpha * x + beta))
    s.ops.push_back({A::eltwise_linear, a.alpha, a.beta});
    return one(A::eltwise_clip_v2, 0.0f, 1.0f);
  }
  if (op == "Clip") {  // min(max(x, lo), hi); unbounded sides as the float range, lo > hi gives hi
    const float big = std::numeric_limits<float>::max();
    float lo = std::max(a.alpha, -big), hi = std::min(a.beta, big);
    if (lo > hi) lo = hi;
    if (lo == 0 && hi == big) return one(A::eltwise_relu);
    return one(A::eltwise_clip_v2, lo, hi);
  }
  throw Error("internal: no oneDNN algorithm for activation '" + op + "'");
}

// The oneDNN algorithms computing node `n` (a unary op on f32), or nullopt.
// Whatever the shapes (the shape-free kernels, lower/detail/dynamic_kernels.hpp): float32 in and out.
inline std::optional<EltwiseSpec> eltwise_algorithms(const Node& n) {
  using A = dnnl::algorithm;
  const std::string& op = n.op_type();
  auto f32 = [](const Value* v) { return v && v->dtype() == DType::Float32; };
  if (n.num_outputs() != 1 || !f32(n.input(0)) || !f32(n.output(0))) return std::nullopt;
  if (!n.domain().empty() || op == "Gelu") {  // ondine.Gelu, or ONNX Gelu (opset 20)
    auto act = op == "Gelu" ? fused::as_activation(n) : std::nullopt;
    if (!act) return std::nullopt;
    return eltwise_of(*act);
  }
  EltwiseSpec s;
  auto one = [&](A alg, float alpha = 0, float beta = 0) {
    s.ops.push_back({alg, alpha, beta});
    return std::optional<EltwiseSpec>(s);
  };
  if (op == "Relu") return one(A::eltwise_relu);
  if (op == "LeakyRelu") return one(A::eltwise_relu, n.attr_float("alpha", 0.01f));
  if (op == "Sigmoid") return one(A::eltwise_logistic);
  if (op == "Tanh") return one(A::eltwise_tanh);
  if (op == "Elu") return one(A::eltwise_elu, n.attr_float("alpha", 1.0f));
  if (op == "Exp") return one(A::eltwise_exp);
  if (op == "Log") return one(A::eltwise_log);
  if (op == "Sqrt") return one(A::eltwise_sqrt);
  if (op == "Abs") return one(A::eltwise_abs);
  if (op == "Neg") return one(A::eltwise_linear, -1.0f, 0.0f);
  if (op == "Softplus") return one(A::eltwise_soft_relu);
  if (op == "HardSwish") return one(A::eltwise_hardswish);
  if (op == "Reciprocal") return one(A::eltwise_pow, 1.0f, -1.0f);
  if (op == "Pow") {  // x ^ e with a constant scalar exponent e
    const Value* e = n.input(1);
    if (!e || !e->is_constant() || e->constant().numel() != 1 || !is_floating(e->dtype())) return std::nullopt;
    float exponent = static_cast<float>(e->constant().at_double(0));
    if (exponent == 2.0f) return one(A::eltwise_square);
    if (exponent == 0.5f) return one(A::eltwise_sqrt);
    return one(A::eltwise_pow, 1.0f, exponent);
  }
  if (op == "HardSigmoid") {  // max(0, min(1, alpha * x + beta))
    s.ops.push_back({A::eltwise_linear, n.attr_float("alpha", 0.2f), n.attr_float("beta", 0.5f)});
    return one(A::eltwise_clip_v2, 0.0f, 1.0f);
  }
  if (op == "Clip") {
    float lo = -std::numeric_limits<float>::max(), hi = std::numeric_limits<float>::max();
    if (n.opset() < 11) {
      lo = n.attr_float("min", lo);
      hi = n.attr_float("max", hi);
    } else {
      auto a = constant_scalar(n, 1, lo), b = constant_scalar(n, 2, hi);
      if (!a || !b) return std::nullopt;
      lo = *a;
      hi = *b;
    }
    if (std::isnan(lo) || std::isnan(hi)) return std::nullopt;
    // ONNX: min(max(x, lo), hi), so lo > hi gives hi everywhere; clip_v2 needs lo <= hi.
    if (lo > hi) lo = hi;
    if (lo == 0 && hi == std::numeric_limits<float>::max()) return one(A::eltwise_relu);
    return one(A::eltwise_clip_v2, lo, hi);
  }
  return std::nullopt;
}

// The oneDNN algorithms computing node `n` (a unary op on f32 with static shapes), or nullopt.
inline std::optional<EltwiseSpec> eltwise_spec(const Node& n) {
  if (!is_f32(n.input(0)) || !is_f32(n.output(0))) return std::nullopt;
  return eltwise_algorithms(n);
}

inline const char* alg_name(dnnl::algorithm a) {
  return dnnl_alg_kind2str(static_cast<dnnl_alg_kind_t>(a));
}

inline std::string eltwise_detail(const EltwiseSpec& s) {
  if (s.prelu_slope) return "prelu('" + s.prelu_slope->name() + "')";
  std::string d;
  for (auto& op : s.ops) d += (d.empty() ? "" : "+") + std::string(alg_name(op.alg));
  return d;
}

// --- post-op fusion -------------------------------------------------------------------------------

// Dims of a broadcast operand aligned to `rank` (leading 1s).
inline Dims left_pad(const Dims& d, std::size_t rank) {
  Dims out(rank - std::min(rank, d.size()), 1);
  out.insert(out.end(), d.begin(), d.end());
  return out;
}

// oneDNN's reference implementations ("ref:any", "ref_int8:any", ...) are its slow fallbacks.
inline bool is_reference_impl(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str()).rfind("ref", 0) == 0;
}

// oneDNN 2.6's jit kernels (brgconv, jit_int8, brgemm matmul, binary; all ISAs) keep one eltwise
// injector per algorithm (jit_uni_postops_injector_t: a map keyed by alg kind, first entry wins), so a
// later eltwise post-op of the same algorithm runs with the first one's alpha, beta and scale: e.g.
// linear(2, 0) then linear(1, 5) computes 2x instead of 2x + 5 (bench/onednn_sum_clip_repro.cpp; fixed
// in later oneDNN by keying the injectors by post-op index). True when `p` repeats an algorithm with
// other parameters: such a chain is never handed to oneDNN.
inline bool repeats_eltwise_alg(const dnnl::post_ops& p) {
  for (int i = 0; i < p.len(); ++i) {
    if (p.kind(i) != dnnl::primitive::kind::eltwise) continue;
    float si, ai, bi;
    dnnl::algorithm alg_i;
    p.get_params_eltwise(i, si, alg_i, ai, bi);
    for (int j = 0; j < i; ++j) {
      if (p.kind(j) != dnnl::primitive::kind::eltwise) continue;
      float sj, aj, bj;
      dnnl::algorithm alg_j;
      p.get_params_eltwise(j, sj, alg_j, aj, bj);
      if (alg_i == alg_j && (si != sj || ai != aj || bi != bj)) return true;
    }
  }
  return false;
}

// Creates a primitive descriptor with the fused post-ops (make(true)) unless oneDNN rejects them or
// only its reference implementation takes them while the unfused primitive gets an optimised one:
// then the unfused one (make(false)), and `fused` says which was chosen.
// A chain that repeats an eltwise algorithm (repeats_eltwise_alg) counts as rejected.
template <typename PD, typename Make>
PD choose_fusion(Make make, bool has_fusion, bool& fused) {
  auto computable = [](PD pd) { return pd && repeats_eltwise_alg(pd.get_primitive_attr().get_post_ops()) ? PD() : pd; };
  PD pd = computable(make(true));
  fused = has_fusion;
  if (!has_fusion || (pd && !is_reference_impl(pd))) return pd;
  PD alone = computable(make(false));
  if (!pd || (alone && !is_reference_impl(alone))) {
    fused = false;
    return alone;
  }
  return pd;
}

// The nodes after a conv/matmul that fold into it: an optional residual Add (a sum post-op, conv
// only), then a chain of activations. Each folded value must have exactly one use and must not be a
// graph output (the intermediate is never materialised).
struct PostOpChain {
  PostOpChain() = default;
  explicit PostOpChain(const Value* produced) : result(produced) {}
  const Value* result = nullptr;       // the value the fused primitive writes
  std::vector<const Node*> nodes;      // folded nodes, in order
  const Value* sum_operand = nullptr;  // the other operand of a fused Add (read through DST)
  const Node* sum_reader = nullptr;    // the node reading it: the Add, or the fused node itself
  // Binary ops by a constant after the producer (binary lowering only: plan_binary_post_ops), as binary
  // post-ops between the sum and the activations; each operand one value or one per channel (dim 1).
  struct ConstantOperand {
    dnnl::algorithm alg;
    const Value* operand;
  };
  std::vector<ConstantOperand> binary;
  std::vector<EltwiseSpec> eltwise;    // activations after the sum
  // A fused node's own post-ops (its Sum input and the first `own_eltwise` activations, from its
  // attributes): part of what it computes, so applied with or without the rest of the chain.
  bool own_sum = false;
  std::size_t own_eltwise = 0;
  PostOpChain own_part(const Value* produced) const {
    PostOpChain c(produced);
    if (own_sum) {
      c.sum_operand = sum_operand;
      c.sum_reader = sum_reader;
    }
    c.own_sum = own_sum;
    c.eltwise.assign(eltwise.begin(), eltwise.begin() + static_cast<std::ptrdiff_t>(own_eltwise));
    c.own_eltwise = own_eltwise;
    return c;
  }
  dnnl::post_ops ops() const {
    dnnl::post_ops p;
    if (sum_operand) p.append_sum(1.0f);
    for (const ConstantOperand& k : binary)
      p.append_binary(k.alg, plain_md(left_pad(k.operand->shape().sizes(), result->shape().rank())));
    for (auto& e : eltwise) {
      // oneDNN 2.6 has no jit kernel with a prelu post-op: the caller takes it off first (take_trailing_prelu).
      if (e.prelu_slope) throw Error("internal: a PRelu left in a post-op chain");
      for (auto& op : e.ops) p.append_eltwise(1.0f, op.alg, op.alpha, op.beta);
    }
    return p;
  }
  std::string detail() const {
    std::string d;
    if (sum_operand) d += "+sum('" + sum_operand->name() + "')";
    for (const ConstantOperand& k : binary)
      d += std::string("+") + alg_name(k.alg) + "('" + k.operand->name() + "')";
    for (auto& e : eltwise) d += "+" + eltwise_detail(e);
    return d;
  }
};

// The single node reading `v`, when `v` may be folded away (one use, not a graph output).
inline const Node* sole_consumer(const Value* v) {
  if (!v || v->is_graph_output() || v->uses().size() != 1) return nullptr;
  return v->uses()[0].node;
}

// PRelu `n` as one activation: eltwise relu with the slope as alpha where there is one slope, else (with
// `per_channel`) a prelu post-op where there is one per channel of its result (dim 1; PyTorch's nn.PReLU(C),
// MobileFaceNet's and ArcFace's activations); nullopt otherwise.
inline std::optional<EltwiseSpec> prelu_spec(const Node& n, bool per_channel) {
  const Value *x = n.input(0), *slope = n.input(1), *y = n.output(0);
  if (n.op_type() != "PRelu" || !n.domain().empty() || !is_f32(x) || !is_f32(y) || !slope || !slope->is_constant() ||
      slope->dtype() != DType::Float32 || slope->shape().rank() > x->shape().rank())
    return std::nullopt;
  EltwiseSpec s;
  if (slope->constant().numel() == 1) {
    s.ops.push_back({dnnl::algorithm::eltwise_relu, slope->constant().data<float>()[0], 0.0f});
    return s;
  }
  const Dims xd = x->shape().sizes(), sd = left_pad(slope->shape().sizes(), xd.size());
  if (!per_channel || xd.size() < 2) return std::nullopt;
  for (std::size_t i = 0; i < xd.size(); ++i)
    if (sd[i] != (i == 1 ? xd[1] : 1)) return std::nullopt;
  s.prelu_slope = slope;
  return s;
}

// Appends the activations reading chain.result (each its only reader) to the chain; with `allow_prelu`, a
// PRelu with a slope per channel too, which ends the chain (the caller takes it off: take_trailing_prelu).
inline void extend_with_activations(Lowering& L, PostOpChain& chain, bool allow_prelu = false) {
  const Value* cur = chain.result;
  while (const Node* next = sole_consumer(cur)) {
    if (L.options.reference_ops.count(next->op_key())) break;
    auto spec = next->op_type() == "PRelu" ? prelu_spec(*next, allow_prelu) : eltwise_spec(*next);
    if (!spec || next->input(0) != cur) break;
    chain.eltwise.push_back(*spec);
    chain.nodes.push_back(next);
    cur = next->output(0);
    chain.result = cur;
    if (spec->prelu_slope) break;
  }
}

inline PostOpChain plan_post_ops(Lowering& L, const Node& producer, bool allow_sum, bool allow_prelu = false) {
  PostOpChain chain;
  const Value* cur = producer.output(0);
  chain.result = cur;
  if (allow_sum) {
    const Node* add = sole_consumer(cur);
    if (add && add->op_type() == "Add" && add->num_inputs() == 2 && !L.options.reference_ops.count("Add") &&
        add->input(0) != add->input(1) && is_f32(add->output(0))) {
      const Value* other = add->input(0) == cur ? add->input(1) : add->input(0);
      // The other operand must exist already (it is read before this primitive writes) and have
      // the output's dims (a sum post-op does not broadcast).
      if (other && is_f32(other) && !other->is_constant() && L.known(other) &&
          other->shape().sizes() == cur->shape().sizes() && add->output(0)->shape().sizes() == cur->shape().sizes()) {
        chain.sum_operand = other;
        chain.sum_reader = add;
        chain.nodes.push_back(add);
        cur = add->output(0);
        chain.result = cur;
      }
    }
  }
  extend_with_activations(L, chain, allow_prelu);
  return chain;
}

// The algorithm of a binary node, or nullopt for other ops.
inline std::optional<dnnl::algorithm> binary_alg(const std::string& op) {
  using A = dnnl::algorithm;
  if (op == "Add") return A::binary_add;
  if (op == "Mul") return A::binary_mul;
  if (op == "Sub") return A::binary_sub;
  if (op == "Div") return A::binary_div;
  if (op == "Max") return A::binary_max;
  if (op == "Min") return A::binary_min;
  return std::nullopt;
}

// A binary node's chain: the binary ops by a constant that read its result one after the other (fold-bn
// rewrites a BatchNormalization it cannot fold as x * s + t: DenseNet's pre-activation BN before each
// layer's ReLU and 1x1 conv), then the activations. Each constant is float32 with one value or one per
// channel (dim 1 of the result), a broadcast every jit binary kernel takes as a post-op; the result keeps
// its dims. Two passes over the tensor become one (DenseNet-121 at batch 1: 62 Mul and 62 Add steps).
inline PostOpChain plan_binary_post_ops(Lowering& L, const Node& n) {
  constexpr std::size_t kMaxBinaryPostOps = 4;
  PostOpChain chain(n.output(0));
  const Dims yd = n.output(0)->shape().sizes();
  const Value* cur = n.output(0);
  while (const Node* next = sole_consumer(cur)) {
    std::optional<dnnl::algorithm> alg = binary_alg(next->op_type());
    if (!alg || chain.binary.size() == kMaxBinaryPostOps || yd.size() < 2 || next->num_inputs() != 2 ||
        L.options.reference_ops.count(next->op_key()) || next->input(0) == next->input(1))
      break;
    const bool commutative = next->op_type() != "Sub" && next->op_type() != "Div";
    if (next->input(0) != cur && !commutative) break;  // k - x, k / x: no such post-op
    const Value* k = next->input(0) == cur ? next->input(1) : next->input(0);
    if (!k || !k->is_constant() || !is_f32(k) || !is_f32(next->output(0)) || k->shape().rank() > yd.size() ||
        next->output(0)->shape().sizes() != yd)
      break;
    const Dims kd = left_pad(k->shape().sizes(), yd.size());
    bool per_channel = true;
    for (std::size_t i = 0; i < yd.size(); ++i) per_channel = per_channel && (kd[i] == 1 || (i == 1 && kd[i] == yd[1]));
    if (!per_channel) break;
    chain.binary.push_back({*alg, k});
    chain.nodes.push_back(next);
    cur = next->output(0);
    chain.result = cur;
  }
  extend_with_activations(L, chain);
  return chain;
}

// A fused node's own chain (ondine.FusedConv: Sum = input 3 and its activations), extended by the
// activations that follow it in the graph. nullopt when its Sum cannot be a sum post-op.
inline std::optional<PostOpChain> fused_post_ops(Lowering& L, const Node& n, std::size_t sum_input,
                                                 bool allow_prelu = false) {
  PostOpChain chain(n.output(0));
  if (const Value* sum = n.input(sum_input)) {
    if (!is_f32(sum) || sum->shape().sizes() != n.output(0)->shape().sizes()) return std::nullopt;
    chain.sum_operand = sum;
    chain.sum_reader = &n;
    chain.own_sum = true;
  }
  for (const fused::Activation& a : fused::read_activations(n)) chain.eltwise.push_back(eltwise_of(a));
  chain.own_eltwise = chain.eltwise.size();
  extend_with_activations(L, chain, allow_prelu);
  return chain;
}

// --- Swish after a primitive, by Ondine's kernel (silu.hpp says why) ---------------------------------

// Takes a Swish off the end of `chain` when it is the fused node's own last activation and the only
// oneDNN algorithm of that entry; returns its alpha. The caller then runs SiluStep on the primitive's
// output instead (its float32 output: a bf16 one keeps the post-op).
inline std::optional<float> take_trailing_swish(PostOpChain& chain) {
  if (chain.eltwise.empty() || chain.eltwise.size() != chain.own_eltwise) return std::nullopt;
  const EltwiseSpec& last = chain.eltwise.back();
  if (last.ops.size() != 1 || last.ops[0].alg != dnnl::algorithm::eltwise_swish) return std::nullopt;
  float alpha = last.ops[0].alpha;
  chain.eltwise.pop_back();
  --chain.own_eltwise;
  return alpha;
}

// True when `md` covers its bytes densely from offset 0 (an in-place pass over get_size() bytes touches
// this tensor only, padding included: not a strided view into a larger buffer).
inline bool is_dense(const memory::desc& md) {
  std::size_t padded = 1;
  for (int i = 0; i < md.data.ndims; ++i) padded *= static_cast<std::size_t>(md.data.padded_dims[i]);
  return md.data.offset0 == 0 && md.get_size() == padded * dnnl_data_type_size(md.data.data_type);
}

// y = x * sigmoid(alpha x) in place over a dense float32 slot (any layout: the op is elementwise and
// maps a blocked layout's zero padding to zero), split over the run's OpenMP threads.
class SiluStep : public runtime::Step {
 public:
  SiluStep(runtime::StepInfo info, SlotId slot, std::size_t count, float alpha, silu::Kernel kernel)
      : Step(std::move(info), {slot}, {slot}), slot_(slot), count_(count), alpha_(alpha), kernel_(kernel) {}

  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
    float* p = static_cast<float*>(ctx.ptr(slot_));
    constexpr std::size_t kPerThread = std::size_t{1} << 14;  // below this a second thread costs more than it saves
    const int threads = static_cast<int>(
        std::min<std::size_t>(static_cast<std::size_t>(omp_get_max_threads()), (count_ + kPerThread - 1) / kPerThread));
    if (threads <= 1) return silu::run(kernel_, p, count_, alpha_);
#pragma omp parallel num_threads(threads)
    {
      // Chunks of whole 64-byte lines, so no two threads write one cache line.
      const std::size_t t = static_cast<std::size_t>(omp_get_thread_num()), k = static_cast<std::size_t>(threads);
      const std::size_t lines = (count_ + 15) / 16;
      const std::size_t begin = std::min(count_, lines * t / k * 16), end = std::min(count_, lines * (t + 1) / k * 16);
      if (end > begin) silu::run(kernel_, p + begin, end - begin, alpha_);
    }
  }

 private:
  SlotId slot_;
  std::size_t count_;
  float alpha_;
  silu::Kernel kernel_;
};

// Appends a SiluStep over `dst` (laid out as `md`) for the Swish take_trailing_swish took off `n`'s chain.
inline void add_silu_step(Lowering& L, const Node& n, SlotId dst, const memory::desc& md, float alpha) {
  const IsaInfo isa = effective_isa();
  const silu::Kernel kernel = silu::choose(isa.avx512, isa_runs_on(CpuIsa::Avx2, isa.isa));
  std::string detail = "in place on " + layout_name(md) + (alpha == 1.0f ? "" : " alpha " + std::to_string(alpha));
  L.add_step(std::make_unique<SiluStep>(runtime::StepInfo{n.name() + ":swish", "Swish", silu::kernel_name(kernel), detail},
                                        dst, md.get_size() / sizeof(float), alpha, kernel));
}

// The format tag among oneDNN's plain, channels-last and channel-blocked ones that gives `md` for its
// dims (a broadcast operand can then be laid out the same way), or `undef`.
inline memory::format_tag channel_layout_tag(const memory::desc& md) {
  using tag = memory::format_tag;
  static const std::vector<std::vector<tag>> by_rank = {
      {}, {}, {tag::ab}, {tag::abc, tag::acb, tag::aBc8b, tag::aBc16b, tag::aBc4b},
      {tag::abcd, tag::acdb, tag::aBcd8b, tag::aBcd16b, tag::aBcd4b},
      {tag::abcde, tag::acdeb, tag::aBcde8b, tag::aBcde16b, tag::aBcde4b}};
  const auto rank = static_cast<std::size_t>(md.data.ndims);
  if (rank >= by_rank.size() || md.data.format_kind != dnnl_blocked) return tag::undef;
  for (tag t : by_rank[rank])
    if (memory::desc(md.dims(), md.data_type(), t) == md) return t;
  return tag::undef;
}

// How prelu::run sees a dense float32 tensor of logical dims `dims` laid out as `md`: row-major, channels-last
// or channel-blocked (channel_layout_tag); nullopt for other layouts.
inline std::optional<prelu::Shape> prelu_shape(const memory::desc& md) {
  const Dims dims = md.dims();
  if (dims.size() < 2 || md.data_type() != memory::data_type::f32 || !is_dense(md)) return std::nullopt;
  const memory::format_tag tag = channel_layout_tag(md);
  if (tag == memory::format_tag::undef) return std::nullopt;
  auto u = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  std::size_t spatial = 1;
  for (std::size_t i = 2; i < dims.size(); ++i) spatial *= u(dims[i]);
  const std::size_t n = u(dims[0]), c = u(dims[1]);
  prelu::Shape s;
  if (md.data.format_desc.blocking.inner_nblks == 1) {  // aBcd16b: channels in blocks
    const std::size_t b = u(md.data.format_desc.blocking.inner_blks[0]);
    s.outer = n, s.groups = (c + b - 1) / b, s.repeats = spatial, s.block = b;
  } else if (dims.size() == 2 || md.data.format_desc.blocking.strides[1] == 1) {  // [N, C], channels-last
    s.outer = n * spatial, s.groups = 1, s.repeats = 1, s.block = c;
  } else {  // row-major
    s.outer = n, s.groups = c, s.repeats = spatial, s.block = 1;
  }
  if (s.count() * sizeof(float) != md.get_size()) return std::nullopt;
  return s;
}

// y = x > 0 ? x : slope[c] x from one float32 slot to another (or in place) in the layout prelu_shape read,
// rows split over the run's OpenMP threads.
class PReluStep : public runtime::Step {
 public:
  PReluStep(runtime::StepInfo info, SlotId src, SlotId dst, prelu::Shape shape, std::vector<float> slopes,
            prelu::Kernel kernel)
      : Step(std::move(info), {src}, {dst}), src_(src), dst_(dst), shape_(shape), slopes_(std::move(slopes)),
        kernel_(kernel) {}

  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
    const float* x = static_cast<const float*>(ctx.ptr(src_));
    float* y = static_cast<float*>(ctx.ptr(dst_));
    const std::size_t rows = shape_.outer * shape_.groups, row = shape_.repeats * shape_.block;
    constexpr std::size_t kPerThread = std::size_t{1} << 14;  // elements below which a second thread costs more
    const int threads = static_cast<int>(std::min<std::size_t>(
        {static_cast<std::size_t>(omp_get_max_threads()), (rows * row + kPerThread - 1) / kPerThread, rows}));
    if (threads <= 1) return prelu::run(kernel_, x, y, slopes_.data(), shape_, 0, rows);
#pragma omp parallel num_threads(threads)
    {
      const std::size_t t = static_cast<std::size_t>(omp_get_thread_num()), k = static_cast<std::size_t>(threads);
      prelu::run(kernel_, x, y, slopes_.data(), shape_, rows * t / k, rows * (t + 1) / k);
    }
  }

 private:
  SlotId src_, dst_;
  prelu::Shape shape_;
  std::vector<float> slopes_;  // one per channel, zeros past the channels to groups * block
  prelu::Kernel kernel_;
};

// Takes the PRelu that ends `chain` (extend_with_activations with allow_prelu) off its post-ops; returns its
// slopes, or null. chain.result and chain.nodes keep it: the caller applies it in place (add_prelu_step) to
// what the primitive writes, and must not hand the chain's result to a reader that skips that step.
inline const Value* take_trailing_prelu(PostOpChain& chain) {
  if (chain.eltwise.empty() || !chain.eltwise.back().prelu_slope) return nullptr;
  const Value* slope = chain.eltwise.back().prelu_slope;
  chain.eltwise.pop_back();
  return slope;
}

// Appends a PReluStep from `src` to `dst` (the same slot: in place), both laid out as `md`; false (nothing
// added) for a layout prelu_shape does not read.
inline bool add_prelu_step(Lowering& L, const Node& n, SlotId src, SlotId dst, const memory::desc& md,
                           const Value* slope, const std::string& name_suffix) {
  std::optional<prelu::Shape> shape = prelu_shape(md);
  if (!shape) return false;
  std::vector<float> slopes(shape->groups * shape->block, 0.0f);
  const Tensor& k = slope->constant();
  std::copy(k.data<float>(), k.data<float>() + k.numel(), slopes.begin());
  const IsaInfo isa = effective_isa();
  const prelu::Kernel kernel = prelu::choose(isa.avx512, isa_runs_on(CpuIsa::Avx2, isa.isa));
  L.add_step(std::make_unique<PReluStep>(
      runtime::StepInfo{n.name() + name_suffix, "PRelu", prelu::kernel_name(kernel),
                        std::string(src == dst ? "in place on " : "") + layout_name(md) + dims_str(Dims(md.dims())) +
                            ", slopes '" + slope->name() + "'"},
      src, dst, *shape, std::move(slopes), kernel));
  return true;
}

// A fused node that oneDNN cannot take runs its reference kernel (correct, slow): say so.
inline bool decline_fused(Lowering& L, const Node& n, const std::string& why) {
  L.log(n.op_key() + " '" + n.name() + "': " + why + "; it runs on its reference kernel");
  return false;
}

// True when the primitive being lowered is the last to read chain.sum_operand in `slot`: its reader
// reads it once (as the sum, not also as a source), every other reader has been lowered already
// (their steps run before), and no view shares the slot's bytes.
inline bool is_last_read(const Lowering& L, const PostOpChain& chain, SlotId slot) {
  const Value* v = chain.sum_operand;
  std::size_t own_reads = 0;
  for (const Use& u : v->uses()) {
    if (u.node == chain.sum_reader) {
      ++own_reads;
      continue;
    }
    // Lowered: folded into an earlier primitive, or its outputs are computed (or folded onward).
    bool lowered = L.fused.count(u.node) != 0;
    for (const Value* out : u.node->outputs()) {
      if (lowered) break;
      lowered = out && (L.known(out) || (out->uses().size() == 1 && L.fused.count(out->uses()[0].node)));
    }
    if (!lowered) return false;
  }
  if (own_reads != 1) return false;
  for (const runtime::Slot& s : L.program.slots)
    if (s.kind == SlotKind::Alias && static_cast<SlotId>(s.index) == slot) return false;
  return true;
}

// The DST slot of a primitive with a fused chain. With a sum post-op the destination must already
// hold the other operand: reuse its slot when nothing reads it afterwards, else copy it into a fresh one.
inline SlotId post_op_dst(Lowering& L, const PostOpChain& chain, const memory::desc& dst_md, bool& read_too) {
  read_too = false;
  if (!chain.sum_operand) return L.new_value_slot(chain.result, dst_md);
  read_too = true;
  const Value* other = chain.sum_operand;
  SlotId src = L.slot_in(other, dst_md);
  // In place when the slot is ours to overwrite (an arena slot: not a caller's tensor, a constant or
  // a view of another value) and nothing reads the operand after this primitive.
  if (L.program.slots[src].kind == SlotKind::Arena && !other->is_graph_output() && is_last_read(L, chain, src))
    return src;
  SlotId dst = L.new_value_slot(chain.result, dst_md);
  L.add_step(std::make_unique<CopyStep>(runtime::StepInfo{"copy:" + other->name(), "Copy", "memcpy", "sum operand"},
                                        src, dst, dst_md.get_size()));
  return dst;
}

// Marks the chain's nodes as lowered and defines its result.
inline void commit_post_ops(Lowering& L, const PostOpChain& chain, SlotId dst, const memory::desc& dst_md) {
  for (const Node* n : chain.nodes) L.fused.insert(n);
  L.define(chain.result, dst, dst_md);
}

// --- standalone ops -------------------------------------------------------------------------------

// A unary op as one eltwise primitive per algorithm (HardSigmoid: linear, then clip), each on its
// producer's layout. Eltwise primitives take no post-ops here: oneDNN 2.6 only has a reference
// implementation for eltwise with post-ops.
inline bool lower_eltwise(Lowering& L, const Node& n) {
  auto spec = eltwise_spec(n);
  if (!spec) return false;
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  std::vector<dnnl::eltwise_forward::primitive_desc> pds;
  memory::desc md = L.md_of(x);
  for (auto& op : spec->ops) {
    dnnl::eltwise_forward::desc desc(dnnl::prop_kind::forward_inference, op.alg, md, op.alpha, op.beta);
    dnnl::eltwise_forward::primitive_desc pd(desc, Lowering::base_attr(), L.engine(), true);
    if (!pd) return false;
    pds.push_back(pd);
    md = pd.dst_desc();
  }
  SlotId src = L.slot_in(x, pds.front().src_desc());
  for (std::size_t i = 0; i < pds.size(); ++i) {
    auto& pd = pds[i];
    bool last = i + 1 == pds.size();
    SlotId dst;
    if (last) {
      dst = L.new_value_slot(y, pd.dst_desc());
      L.define(y, dst, pd.dst_desc());
    } else {
      dst = L.add_slot(runtime::Slot{y->name() + ".step" + std::to_string(i), DType::Float32, y->shape().sizes(),
                                     pd.dst_desc().get_size(), layout_name(pd.dst_desc()), SlotKind::Arena, 0});
    }
    auto& op = spec->ops[i];
    L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(),
                     std::string(alg_name(op.alg)) + " " + layout_name(pd.src_desc()) + dims_str(x->shape().sizes())},
                    &n, dnnl::eltwise_forward(pd), pd.scratchpad_desc(),
                    {{DNNL_ARG_SRC, src, pd.src_desc()}, {DNNL_ARG_DST, dst, pd.dst_desc()}}, {});
    src = dst;
  }
  return true;
}

// PRelu where no conv took it: one slope, oneDNN's eltwise relu with it as alpha; a constant slope per channel
// (dim 1), Ondine's kernel (prelu.hpp) on the producer's layout.
inline bool lower_prelu(Lowering& L, const Node& n) {
  std::optional<EltwiseSpec> spec = prelu_spec(n, true);
  if (!spec) return false;
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!spec->prelu_slope) {
    const EltwiseSpec::Op& op = spec->ops[0];
    dnnl::eltwise_forward::primitive_desc pd(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference, op.alg, L.md_of(x), op.alpha, op.beta),
        Lowering::base_attr(), L.engine(), true);
    if (!pd) return false;
    const SlotId src = L.slot_in(x, pd.src_desc());
    const SlotId dst = L.new_value_slot(y, pd.dst_desc());
    L.define(y, dst, pd.dst_desc());
    L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(), "relu alpha " + std::to_string(op.alpha) + " " +
                                                                     layout_name(pd.src_desc()) + dims_str(x->shape().sizes())},
                    &n, dnnl::eltwise_forward(pd), pd.scratchpad_desc(),
                    {{DNNL_ARG_SRC, src, pd.src_desc()}, {DNNL_ARG_DST, dst, pd.dst_desc()}}, {});
    return true;
  }
  // Per channel: Ondine's kernel on the producer's layout, or on a row-major copy of another.
  memory::desc md = L.md_of(x);
  if (!prelu_shape(md)) md = plain_md(x->shape().sizes());
  const SlotId src = L.slot_in(x, md);
  const SlotId dst = L.new_value_slot(y, md);
  L.define(y, dst, md);
  if (!add_prelu_step(L, n, src, dst, md, spec->prelu_slope, "")) throw Error("internal: PRelu on a row-major layout");
  return true;
}


// `yd` and the broadcast operand's `bd` (same rank) with neighbouring dims of the same kind (both full,
// or broadcast in `bd`) merged and a leading 1 when the first group is full: [3,320,320] * [3,1,1]
// becomes [1,3,102400] * [1,3,1], a per-channel broadcast that oneDNN's jit binary kernels take (they
// have none for a broadcast along the first dim). Row-major bytes are the same either way.
inline std::pair<Dims, Dims> merge_broadcast_dims(const Dims& yd, const Dims& bd) {
  Dims y, b;
  int last = -1;  // 0: broadcast group, 1: full group
  for (std::size_t i = 0; i < yd.size(); ++i) {
    if (yd[i] == 1) continue;
    int kind = bd[i] == yd[i] ? 1 : 0;
    if (kind == last) {
      y.back() *= yd[i];
      b.back() *= bd[i];
    } else {
      y.push_back(yd[i]);
      b.push_back(bd[i]);
      last = kind;
    }
  }
  if (y.empty() || b.front() != 1) {
    y.insert(y.begin(), 1);
    b.insert(b.begin(), 1);
  }
  return {y, b};
}

// A float32 constant broadcast (ONNX rules, its dims left-padded with 1s) to `yd`, row-major.
inline Tensor broadcast_to(const Tensor& t, const Dims& yd) {
  const Dims td = left_pad(t.dims(), yd.size());
  Dims stride(yd.size(), 0);  // t's stride per output dim, 0 where t broadcasts
  for (std::int64_t i = static_cast<std::int64_t>(yd.size()) - 1, step = 1; i >= 0; --i) {
    const auto u = static_cast<std::size_t>(i);
    stride[u] = td[u] == 1 ? 0 : step;
    step *= td[u];
  }
  Tensor out(DType::Float32, yd);
  const float* src = t.data<float>();
  float* dst = out.data<float>();
  Dims index(yd.size(), 0);
  std::int64_t at = 0;  // t's offset for `index`
  for (std::int64_t k = 0, n = out.numel(); k < n; ++k) {
    dst[k] = src[at];
    for (std::size_t d = yd.size(); d-- > 0;) {  // the next index, row-major
      if (++index[d] < yd[d]) {
        at += stride[d];
        break;
      }
      at -= stride[d] * (yd[d] - 1);
      index[d] = 0;
    }
  }
  return out;
}

// Add, Sub, Mul, Div, Max, Min as one binary primitive, with the activations after it as post-ops.
// oneDNN 2.6 picks its reference kernel (~50x slower) for some operand layouts, so the layouts are
// tried in order until a jit kernel takes them: (1) the first operand's layout, with a broadcast
// operand laid out the same way (a [1,C,1,1] gate in aBcd8b for an aBcd8b activation); (2) the
// broadcast operand row-major; (3) both row-major, reordering the first once; (4) row-major with the
// broadcast dims merged (merge_broadcast_dims), without post-ops; (5) a constant operand expanded; (6) with
// both operands broadcasting, the first expanded by a reorder first. The last one tried is kept when none
// gets a jit kernel.
inline bool lower_binary(Lowering& L, const Node& n) {
  const std::string& op = n.op_type();
  const std::optional<dnnl::algorithm> found = binary_alg(op);
  if (!found) return false;
  const dnnl::algorithm alg = *found;
  bool commutative = op != "Sub" && op != "Div";
  if (n.num_inputs() != 2 || n.num_outputs() != 1) return false;
  const Value* a = n.input(0);
  const Value* b = n.input(1);
  const Value* y = n.output(0);
  if (!is_f32(a) || !is_f32(b) || !is_f32(y)) return false;
  Dims yd = y->shape().sizes();
  if (yd.empty() || !y->shape().is_static()) return false;  // scalars: not worth a primitive
  // (6) Both operands broadcast (MViT-V2's relative positions, [..., 14, 1] + [..., 1, 14]; oneDNN's src0
  // cannot): the first is expanded into the output's dims by one reorder reading it with stride 0 where it
  // broadcasts, then read as a full row-major operand.
  bool expand_a = false;
  if (a->shape().sizes() != yd || a->is_constant()) {
    if (commutative && b->shape().sizes() == yd && !b->is_constant()) {
      std::swap(a, b);
    } else {
      // The operand that broadcasts only after its full dims ([..., 14, 1]) is the better src1: jit kernels
      // take that broadcast, not one between full dims ([..., 1, 14]); the other is expanded.
      auto trailing = [&](const Value* v) {
        const Dims d = left_pad(v->shape().sizes(), yd.size());
        bool broadcast_seen = false;
        for (std::size_t i = 0; i < yd.size(); ++i) {
          if (yd[i] == 1) continue;
          if (d[i] == 1) broadcast_seen = true;
          else if (broadcast_seen) return false;
        }
        return true;
      };
      if (commutative && !b->is_constant() && trailing(a) && !trailing(b)) std::swap(a, b);
      const Dims ad = left_pad(a->shape().sizes(), yd.size());
      if (a->is_constant() || a->shape().rank() > yd.size() || ad == yd) return false;
      for (std::size_t i = 0; i < yd.size(); ++i)
        if (ad[i] != yd[i] && ad[i] != 1) return false;
      expand_a = true;
    }
  }
  Dims bd = left_pad(b->shape().sizes(), yd.size());
  const bool full = bd == yd;
  // A channels-last view not copied yet (ConvNeXt's permute back to NCHW of a matmul's NHWC result) is read in
  // place, in the layout its strides make, rather than first copied row-major.
  std::optional<std::pair<SlotId, memory::desc>> a_view = expand_a ? std::nullopt : L.strided_source(a);
  if (a_view && (is_row_major(a_view->second) || channel_layout_tag(a_view->second) == memory::format_tag::undef))
    a_view.reset();
  const memory::desc a_md = expand_a ? plain_md(yd) : a_view ? a_view->second : L.md_of(a);
  PostOpChain chain = plan_binary_post_ops(L, n);

  struct Choice {
    memory::desc src0, src1;
    bool merged = false;    // (4): dims merged, no post-ops
    bool expanded = false;  // (5): the constant operand broadcast to the output's dims
  };
  std::vector<Choice> choices;
  memory::format_tag a_tag = channel_layout_tag(a_md);
  if (full) {
    choices.push_back({a_md, a_md});
  } else {
    if (!is_row_major(a_md) && a_tag != memory::format_tag::undef)
      choices.push_back({a_md, memory::desc(bd, memory::data_type::f32, a_tag)});
    choices.push_back({a_md, plain_md(bd)});
  }
  if (!is_row_major(a_md)) choices.push_back({plain_md(yd), full ? plain_md(yd) : plain_md(bd)});
  if (!full) {
    auto [my, mb] = merge_broadcast_dims(yd, bd);
    if (my.size() != yd.size() || my != yd) choices.push_back({plain_md(my), plain_md(mb), true});
  }
  // (5) A constant operand broadcast along a dim between full ones (Swin's attention mask [1, nW, 1, N, N] over
  // the heads: [64, 3, 2401] after merging), which no jit kernel takes: expanded once, here, to the output's
  // dims (up to 64 MB), then read as a full operand in src0's layout.
  std::optional<Tensor> expanded;
  if (!full && b->is_constant() && md_numel(plain_md(yd)) <= (std::int64_t{16} << 20)) {
    choices.push_back({a_md, a_md, false, true});
    if (!is_row_major(a_md)) choices.push_back({plain_md(yd), plain_md(yd), false, true});
  }

  dnnl::binary::primitive_desc pd;
  bool fused = false;
  const Choice* chosen = nullptr;
  for (const Choice& c : choices) {
    const bool with_chain = !chain.nodes.empty() && !c.merged;
    dnnl::binary::desc desc(alg, c.src0, c.src1, any_md(Dims(c.src0.dims())));
    bool c_fused = false;
    auto c_pd = choose_fusion<dnnl::binary::primitive_desc>(
        [&](bool use_chain) {
          dnnl::primitive_attr attr = Lowering::base_attr();
          if (use_chain) attr.set_post_ops(chain.ops());
          return dnnl::binary::primitive_desc(desc, attr, L.engine(), true);
        },
        with_chain, c_fused);
    if (!c_pd) continue;
    if (c.expanded) {  // only where the expansion is what gets a jit kernel
      if (is_reference_impl(c_pd)) continue;
      if (!expanded) expanded = broadcast_to(b->constant(), yd);
    }
    pd = c_pd;
    fused = c_fused;
    chosen = &c;
    if (!is_reference_impl(pd)) break;
  }
  if (!pd || !chosen) return false;
  if (!fused) chain = PostOpChain{y};

  // src0: its own slot when the layouts agree (a merged row-major view reads the same bytes).
  std::optional<SlotId> a_expanded;
  if (expand_a) {
    if (!chosen->merged && !is_row_major(pd.src_desc(0))) return false;  // (6) offers row-major choices only
    const Dims ad = left_pad(a->shape().sizes(), yd.size());
    Dims strides(yd.size(), 0);  // row-major over ad, 0 where a broadcasts
    for (std::size_t i = yd.size(), step = 1; i-- > 0;) {
      strides[i] = ad[i] == yd[i] ? static_cast<std::int64_t>(step) : 0;
      step *= static_cast<std::size_t>(ad[i]);
    }
    const memory::desc wide = plain_md(yd);
    a_expanded = L.add_slot(runtime::Slot{a->name() + ".expanded", DType::Float32, yd, wide.get_size(),
                                          layout_name(wide), SlotKind::Arena, 0});
    L.add_reorder(a->name() + " expanded to " + dims_str(yd), L.row_major_slot(a),
                  memory::desc(yd, memory::data_type::f32, strides), *a_expanded, wide);
  }
  SlotId s0 = a_expanded                                     ? *a_expanded
              : chosen->merged                               ? L.row_major_slot(a)
              : a_view && pd.src_desc(0) == a_view->second ? a_view->first
                                                           : L.slot_in(a, pd.src_desc(0));
  std::vector<SlotArg> args{{DNNL_ARG_SRC_0, s0, pd.src_desc(0)}};
  std::vector<std::pair<int, memory>> consts;
  const memory::desc src1_md = pd.src_desc(1);
  for (std::size_t i = 0; i < chain.binary.size(); ++i) {
    const Value* k = chain.binary[i].operand;
    consts.emplace_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(static_cast<int>(i) + (chain.sum_operand ? 1 : 0)) | DNNL_ARG_SRC_1,
                        L.constant_memory(k->constant(), plain_md(left_pad(k->shape().sizes(), yd.size()))));
  }
  if (b->is_constant()) {
    consts.emplace_back(DNNL_ARG_SRC_1, L.constant_memory(chosen->expanded ? *expanded : b->constant(), src1_md));
  } else if (full && !chosen->merged) {
    args.push_back({DNNL_ARG_SRC_1, L.slot_in(b, src1_md), src1_md});
  } else if (is_row_major(src1_md)) {
    args.push_back({DNNL_ARG_SRC_1, L.row_major_slot(b), src1_md});
  } else {
    // A broadcast operand in a blocked layout: its row-major bytes (dims `bd`) reordered once per run.
    SlotId raw = L.row_major_slot(b);
    SlotId packed = L.add_slot(runtime::Slot{b->name() + "." + layout_name(src1_md), DType::Float32, bd,
                                             src1_md.get_size(), layout_name(src1_md), SlotKind::Arena, 0});
    L.add_reorder(b->name(), raw, plain_md(bd), packed, src1_md);
    args.push_back({DNNL_ARG_SRC_1, packed, src1_md});
  }
  const memory::desc dst_md = chosen->merged ? plain_md(yd) : pd.dst_desc();
  SlotId dst = L.new_value_slot(chain.result, dst_md);
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc()});
  commit_post_ops(L, chain, dst, dst_md);
  L.add_primitive({n.name(), op, pd.impl_info_str(),
                   std::string(alg_name(alg)) + chain.detail() + " " + layout_name(pd.src_desc(0)) +
                       dims_str(chosen->merged ? Dims(pd.src_desc(0).dims()) : yd) + " , " + layout_name(src1_md) +
                       dims_str(chosen->merged ? Dims(src1_md.dims()) : bd) +
                       (chosen->expanded ? " (the constant expanded from " + dims_str(bd) + ")" : "")},
                  &n, dnnl::binary(pd), pd.scratchpad_desc(), std::move(args), std::move(consts));
  return true;
}

}  // namespace ondine::lower::detail
