// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/post_ops.hpp - post-op fusion: the activations, residual adds and binary ops that follow a
// conv or matmul attach to the primitive that produces their input (one pass over the output instead of one
// per op), and a trailing Swish or per-channel PRelu runs on Ondine's kernel in place (silu.hpp, prelu.hpp
// say why). The lowerings of Conv, MatMul, Gemm and their quantized forms plan and commit a chain here.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "ondine/lower/detail/activation.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/prelu.hpp"
#include "ondine/lower/detail/silu.hpp"
#include "ondine/lower/isa.hpp"

namespace ondine::lower::detail {

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

}  // namespace ondine::lower::detail
