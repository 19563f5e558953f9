// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/matmul.hpp - MatMul and Gemm as the oneDNN matmul primitive.
//
// Constant weights are reordered once into the layout oneDNN prefers (format_tag::any); a runtime
// right-hand side is read in place through strides. Activations stay row-major (what the matmul
// kernels want, and what lets a graph output be written in place). Rank-1 operands are promoted as
// ONNX says ([K] -> [1,K] on the left, [K,1] on the right) and batch dims are left-padded with 1s for
// oneDNN's broadcasting. Gemm's alpha is folded into constant weights and beta*C into the bias; a
// following Add of a constant (MatMul + bias) becomes the bias, and activations become post-ops.
// ondine.FusedMatMul / FusedGemm bring their own Bias, Sum (a binary-add post-op reading it
// row-major, so the operand is never copied) and activations; activations after them may still fold.
// If oneDNN rejects a fused node's own post-ops, the node runs its reference kernel.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"

namespace ondine::lower::detail {

// A bias that broadcasts to `dst` without changing it: each dim 1 or equal (left-padded).
inline bool bias_fits(const Dims& bias, const Dims& dst) {
  if (bias.size() > dst.size()) return false;
  Dims b = left_pad(bias, dst.size());
  for (std::size_t i = 0; i < b.size(); ++i)
    if (b[i] != 1 && b[i] != dst[i]) return false;
  return true;
}

struct MatmulPlan {
  memory::desc src_md, weights_md, dst_md;
  bool weights_constant = false;
  Tensor weights;           // constant weights as row-major data of weights_md's dims, or as weights_source
  std::optional<memory::desc> weights_source;  // how `weights` is laid out when not row-major (transposed B)
  std::optional<Tensor> bias;  // constant bias as row-major data of bias dims
  Dims bias_dims;
  PostOpChain chain;        // activations after the (possibly fused) bias
  const Node* bias_add = nullptr;
  // Gemm with runtime weights: alpha as a first eltwise post-op, then C (beta*C) as a binary add.
  float out_scale = 1.0f;
  const Value* c_runtime = nullptr;
  std::optional<Tensor> c_constant;
  Dims c_dims;
  // A fused node's own Sum (added after C) and activations: part of what it computes.
  const Value* sum = nullptr;
  std::vector<EltwiseSpec> own_eltwise;

  // Post-ops that must stay (Gemm semantics, a fused node's own), then the optional fused activations.
  dnnl::post_ops post_ops(bool with_chain) const {
    dnnl::post_ops p;
    if (out_scale != 1.0f) p.append_eltwise(1.0f, dnnl::algorithm::eltwise_linear, out_scale, 0.0f);
    if (c_runtime || c_constant) p.append_binary(dnnl::algorithm::binary_add, plain_md(c_dims));
    if (sum) p.append_binary(dnnl::algorithm::binary_add, dst_md);
    for (auto& e : own_eltwise)
      for (auto& op : e.ops) p.append_eltwise(1.0f, op.alg, op.alpha, op.beta);
    if (with_chain)
      for (auto& e : chain.eltwise)
        for (auto& op : e.ops) p.append_eltwise(1.0f, op.alg, op.alpha, op.beta);
    return p;
  }
  int c_post_op_index() const { return out_scale != 1.0f ? 1 : 0; }
  int sum_post_op_index() const { return c_post_op_index() + (c_runtime || c_constant ? 1 : 0); }
  std::string own_detail() const {
    std::string d = sum ? "+sum('" + sum->name() + "')" : "";
    for (auto& e : own_eltwise) d += "+" + eltwise_detail(e);
    return d;
  }
};

// `md` with data type `dt`: the same dims and strides, or format_tag::any.
inline memory::desc with_data_type(const memory::desc& md, memory::data_type dt) {
  if (md.data.format_kind == dnnl_format_kind_any) return memory::desc(md.dims(), dt, memory::format_tag::any);
  const dnnl_blocking_desc_t& blk = md.data.format_desc.blocking;
  return memory::desc(md.dims(), dt, Dims(blk.strides, blk.strides + md.data.ndims));
}

// A float32 product by constant 2-D weights, [M, K] x [K, N] with A row-major, as oneDNN's 1x1 convolution
// over the M rows as positions: row-major [M, K] is the channels-last (nwc) [1, K, M] oneDNN's jit_1x1 kernel
// reads, and its output [1, N, M] nwc is the row-major [M, N], so neither side moves. On AVX2 it is
// 1.1-1.3x gemm:jit with its best weight layout on the products of transformers and ConvNeXt
// (docs/performance.md, "Linear layers as 1x1 convolutions"). Bias per column, a Sum (binary add of the
// row-major operand) and eltwise post-ops; nothing else (Gemm's alpha and C, bf16) takes this path. Returns
// false, with nothing created, where it does not apply or oneDNN has no jit_1x1 kernel for it.
inline bool linear_as_conv_applies(const MatmulPlan& plan) {
  return plan.weights_constant && plan.out_scale == 1.0f && !plan.c_runtime && !plan.c_constant &&
         plan.src_md.data.ndims == 2 && plan.weights_md.data.ndims == 2 &&
         plan.src_md.data_type() == memory::data_type::f32 && plan.weights.dtype() == DType::Float32 &&
         is_row_major(plan.src_md);
}

// "conv1x1 (tuned)" / "gemm (heuristic)": the kernel a Linear layer got, for StepInfo::choice.
inline std::string matmul_kernel_choice(const Lowering& L, const char* kernel) {
  return std::string(kernel) + " (" + L.choice_origin("matmul_kernel", L.options.matmul_kernel != MatMulKernel::Auto) + ")";
}

inline bool emit_matmul_as_conv(Lowering& L, const Node& n, const Value* a, const MatmulPlan& plan,
                                const std::string& detail_prefix) {
  if (L.options.matmul_kernel == MatMulKernel::Gemm || !linear_as_conv_applies(plan)) return false;
  const memory::dim M = plan.src_md.data.dims[0], K = plan.src_md.data.dims[1], N = plan.weights_md.data.dims[1];
  if (plan.bias && plan.bias->numel() != N) return false;
  if (L.options.matmul_kernel == MatMulKernel::Auto) {
    const IsaInfo isa = effective_isa();
    // One row: gemm:jit's vector product is faster (384x1536: 0.043 against 0.063 ms).
    if (isa.avx512 || (isa.isa != CpuIsa::Avx2 && isa.isa != CpuIsa::Avx2Vnni) || M < 2) return false;
  }
  using tag = memory::format_tag;
  const memory::desc src_md({1, K, M}, memory::data_type::f32, tag::nwc), dst_md({1, N, M}, memory::data_type::f32, tag::nwc);
  const memory::desc weights_md({N, K, 1}, memory::data_type::f32, tag::any), bias_md({N}, memory::data_type::f32, tag::a);
  dnnl::post_ops po;
  if (plan.sum) po.append_binary(dnnl::algorithm::binary_add, dst_md);
  for (const auto* list : {&plan.own_eltwise, &plan.chain.eltwise})
    for (const EltwiseSpec& e : *list)
      for (const auto& op : e.ops) po.append_eltwise(1.0f, op.alg, op.alpha, op.beta);
  dnnl::primitive_attr attr = Lowering::base_attr();
  attr.set_post_ops(po);
  const bool with_bias = plan.bias.has_value();
  auto desc = with_bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                          dnnl::algorithm::convolution_direct, src_md, weights_md,
                                                          bias_md, dst_md, {1}, {0}, {0})
                        : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                          dnnl::algorithm::convolution_direct, src_md, weights_md,
                                                          dst_md, {1}, {0}, {0});
  dnnl::convolution_forward::primitive_desc pd(desc, attr, L.engine(), true);
  if (!pd || std::string(pd.impl_info_str()).rfind("jit_1x1", 0) != 0) return false;

  const Value* result = plan.chain.result ? plan.chain.result : n.output(0);
  if (plan.bias_add && plan.chain.nodes.empty()) result = plan.bias_add->output(0);
  // The weights as given: element (k, j) of B at k * sk + j * sn, so the conv's [N, K, 1] reads it through
  // strides {sn, sk, 1}.
  memory::dim sk = N, sn = 1;
  if (plan.weights_source) {
    sk = plan.weights_source->data.format_desc.blocking.strides[0];
    sn = plan.weights_source->data.format_desc.blocking.strides[1];
  }
  const memory::desc given({N, K, 1}, memory::data_type::f32, Dims{sn, sk, 1});
  std::vector<std::pair<int, memory>> consts;
  consts.emplace_back(DNNL_ARG_WEIGHTS, L.constant_memory(plan.weights, pd.weights_desc(), given));
  if (with_bias) consts.emplace_back(DNNL_ARG_BIAS, L.constant_memory(*plan.bias, pd.bias_desc()));
  std::vector<SlotArg> args{{DNNL_ARG_SRC, L.row_major_slot(a), pd.src_desc()}};
  if (plan.sum)
    args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, L.row_major_slot(plan.sum), dst_md});
  const memory::desc value_md = plain_md(result->shape().sizes());
  SlotId dst = L.new_value_slot(result, value_md);
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc()});
  if (plan.bias_add) L.fused.insert(plan.bias_add);
  for (const Node* f : plan.chain.nodes) L.fused.insert(f);
  L.define(result, dst, value_md);
  std::string detail = detail_prefix + " as a 1x1 conv over " + std::to_string(M) + " rows, wei " +
                       layout_name(pd.weights_desc()) + (with_bias ? " +bias[" + std::to_string(N) + "]" : "") +
                       plan.own_detail() + plan.chain.detail() + " -> " + dims_str(result->shape().sizes());
  L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(), detail, matmul_kernel_choice(L, "conv1x1")}, &n,
                  dnnl::convolution_forward(pd),
                  pd.scratchpad_desc(), std::move(args), std::move(consts));
  return true;
}

// Builds the primitive from a plan: with the fused bias-Add and activations first, then alone.
// Precision::Bf16 with constant weights: bf16 source (`a` as it is when held in bf16, else a converted copy)
// and weights (packed to bf16 once), f32 accumulation, bias and post-op operands; the output in bf16 when only
// bf16 readers take it (Lowering::bf16_activation), else f32.
inline bool emit_matmul(Lowering& L, const Node& n, const Value* a, const Value* b, MatmulPlan& plan,
                        const std::string& detail_prefix) {
  const bool bf16 = L.choose_bf16(n, plan.weights_constant && a && a->dtype() == DType::Float32 &&
                                         plan.src_md.data_type() == memory::data_type::f32 &&
                                         plan.weights.dtype() == DType::Float32);
  const bool kernel_choice = !bf16 && linear_as_conv_applies(plan);  // gemm or conv1x1
  if (bf16) {
    plan.src_md = with_data_type(plan.src_md, memory::data_type::bf16);
    plan.weights_md = with_data_type(plan.weights_md, memory::data_type::bf16);
  } else if (emit_matmul_as_conv(L, n, a, plan, detail_prefix)) {
    return true;
  }
  auto make_pd = [&](bool with_chain) {
    dnnl::primitive_attr attr = Lowering::base_attr();
    attr.set_post_ops(plan.post_ops(with_chain));
    bool with_bias = plan.bias.has_value() && (with_chain || !plan.bias_add);
    auto desc = with_bias ? dnnl::matmul::desc(plan.src_md, plan.weights_md, plain_md(plan.bias_dims), plan.dst_md)
                          : dnnl::matmul::desc(plan.src_md, plan.weights_md, plan.dst_md);
    return dnnl::matmul::primitive_desc(desc, attr, L.engine(), true);
  };
  // Constant 2-D weights that oneDNN leaves row-major ([K, N], "ab": gemm:jit does not pack them) are
  // stored transposed ("ba", PyTorch's [N, K]) instead: the same kernel then runs up to 3.5x faster for
  // the row counts of transformer layers (bench: 128x256x1024 fp32, AVX2, 2 threads: 1.69 ms as ab,
  // 0.47 ms as ba; within 6% either way from 1024 rows up).
  if (plan.weights_constant && plan.weights_md.data.ndims == 2 && plan.weights_md.data.format_kind == dnnl_format_kind_any) {
    auto probe = make_pd(false);
    if (probe && is_row_major(probe.weights_desc())) {
      const memory::dim k = plan.weights_md.data.dims[0], nn = plan.weights_md.data.dims[1];
      plan.weights_md = memory::desc({k, nn}, plan.weights_md.data_type(), Dims{1, k});
    }
  }
  bool fused = false;
  auto pd = choose_fusion<dnnl::matmul::primitive_desc>(make_pd, !plan.chain.nodes.empty() || plan.bias_add, fused);
  if (!pd)
    return !n.domain().empty() && decline_fused(L, n, "oneDNN has no matmul with its post-ops" + plan.own_detail());
  if (!fused) {  // the bias-Add and the activations are lowered on their own
    if (plan.bias_add) plan.bias.reset();
    plan.chain = PostOpChain{};
    plan.bias_add = nullptr;
  }
  const Value* result = plan.chain.result ? plan.chain.result : n.output(0);
  if (plan.bias_add && plan.chain.nodes.empty()) result = plan.bias_add->output(0);

  // A result only bf16 matrix products read (a transformer's first FFN layer, GELU and all) is written in
  // bf16: the reader takes it as it is, with no conversion pass over the layer's widest activation.
  bool bf16_out = bf16 && !plan.sum && !plan.c_runtime && !plan.c_constant && L.bf16_activation(result);
  if (bf16_out) {
    const memory::desc f32_dst = plan.dst_md;
    plan.dst_md = with_data_type(plan.dst_md, memory::data_type::bf16);
    if (auto pd16 = make_pd(fused)) {
      pd = pd16;
    } else {
      plan.dst_md = f32_dst;
      bf16_out = false;
    }
  }

  SlotId src = bf16 ? L.slot_in(a, plain_md(a->shape().sizes(), memory::data_type::bf16)) : L.row_major_slot(a);
  std::vector<SlotArg> args{{DNNL_ARG_SRC, src, pd.src_desc()}};
  std::vector<std::pair<int, memory>> consts;
  if (plan.weights_constant)
    consts.emplace_back(DNNL_ARG_WEIGHTS, L.constant_memory(plan.weights, pd.weights_desc(), plan.weights_source));
  else
    args.push_back({DNNL_ARG_WEIGHTS, L.row_major_slot(b), pd.weights_desc()});
  if (plan.bias) consts.emplace_back(DNNL_ARG_BIAS, L.constant_memory(*plan.bias, pd.bias_desc()));
  int c_arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(plan.c_post_op_index()) | DNNL_ARG_SRC_1;
  if (plan.c_runtime) args.push_back({c_arg, L.row_major_slot(plan.c_runtime), plain_md(plan.c_dims)});
  if (plan.c_constant) consts.emplace_back(c_arg, L.constant_memory(*plan.c_constant, plain_md(plan.c_dims)));
  if (plan.sum)
    args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(plan.sum_post_op_index()) | DNNL_ARG_SRC_1,
                    L.row_major_slot(plan.sum), plan.dst_md});
  memory::desc value_md = plain_md(result->shape().sizes(), bf16_out ? memory::data_type::bf16 : memory::data_type::f32);
  SlotId dst = L.new_value_slot(result, value_md);
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc()});
  if (plan.bias_add) L.fused.insert(plan.bias_add);
  for (const Node* f : plan.chain.nodes) L.fused.insert(f);
  L.define(result, dst, value_md);
  std::string detail = detail_prefix + " wei " + layout_name(pd.weights_desc()) + (plan.weights_constant ? "" : " (runtime)") +
                       (plan.bias ? " +bias" + dims_str(plan.bias_dims) : "") +
                       (plan.out_scale != 1.0f ? " *alpha" : "") + (plan.c_runtime || plan.c_constant ? " +C" + dims_str(plan.c_dims) : "") +
                       plan.own_detail() + plan.chain.detail() + " -> " +
                       dims_str(result->shape().sizes()) + (bf16_out ? " bf16" : "");
  std::string choice = kernel_choice ? matmul_kernel_choice(L, "gemm") : "";
  if (plan.weights_constant)
    if (const std::string p = L.precision_choice(n); !p.empty()) choice += (choice.empty() ? "" : ", ") + p;
  L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(), detail, choice}, &n, dnnl::matmul(pd),
                  pd.scratchpad_desc(), std::move(args), std::move(consts));
  return true;
}

// The post-ops after a matmul producing `y`: an Add of a constant that fits as a bias (when the
// matmul has none), then activations.
inline void plan_matmul_tail(Lowering& L, const Node& n, const Dims& dst_dims, MatmulPlan& plan) {
  const Value* y = n.output(0);
  // A bias is added before the post-ops, so not when alpha is still to be applied by one, nor after
  // a fused node (whose own Sum and activations come before anything that follows).
  bool fused_node = !n.domain().empty();
  const Node* add = plan.bias || plan.out_scale != 1.0f || fused_node ? nullptr : sole_consumer(y);
  if (add && add->op_type() == "Add" && add->num_inputs() == 2 && !L.options.reference_ops.count("Add")) {
    const Value* c = add->input(0) == y ? add->input(1) : add->input(0);
    if (c && c != y && c->is_constant() && is_f32(c) && is_f32(add->output(0)) &&
        add->output(0)->shape().sizes() == y->shape().sizes() && bias_fits(c->shape().sizes(), y->shape().sizes())) {
      plan.bias_add = add;
      Dims cd = c->shape().sizes();
      while (cd.size() > dst_dims.size() && cd.front() == 1) cd.erase(cd.begin());  // dst collapsed to 2-D
      plan.bias_dims = left_pad(cd, dst_dims.size());
      if (cd.size() > dst_dims.size() || !bias_fits(plan.bias_dims, dst_dims)) {
        plan.bias_add = nullptr;
      } else {
        plan.bias = c->constant();
      }
    }
  }
  plan.chain = plan_post_ops(L, plan.bias_add ? *plan.bias_add : n, false);
  if (plan.chain.nodes.empty()) plan.chain.result = nullptr;
}

// ondine.FusedMatMul's own operands: Bias (a constant [N]) as the matmul's bias, Sum (the output's
// shape) and the activations as post-ops.
inline bool plan_fused_matmul(Lowering& L, const Node& n, const Dims& dst_dims, MatmulPlan& plan) {
  const Value* y = n.output(0);
  if (const Value* bias = n.input(2)) {
    if (!bias->is_constant() || !is_f32(bias) || bias->shape().sizes() != Dims{dst_dims.back()})
      return decline_fused(L, n, "its Bias is not a constant float32 [N]");
    plan.bias_dims = left_pad(bias->shape().sizes(), dst_dims.size());
    plan.bias = bias->constant();
  }
  if (const Value* sum = n.input(3)) {
    if (!is_f32(sum) || sum->shape().sizes() != y->shape().sizes())
      return decline_fused(L, n, "its Sum is not a float32 tensor of the output's shape");
    plan.sum = sum;
  }
  for (const fused::Activation& act : fused::read_activations(n)) plan.own_eltwise.push_back(eltwise_of(act));
  return true;
}

inline bool lower_matmul(Lowering& L, const Node& n) {
  const Value* a = n.input(0);
  const Value* b = n.input(1);
  const Value* y = n.output(0);
  if (!is_f32(a) || !is_f32(b) || !is_f32(y) || a->is_constant()) return false;
  Dims ad = a->shape().sizes(), bd = b->shape().sizes();
  if (ad.empty() || bd.empty()) return false;
  if (ad.size() == 1) ad.insert(ad.begin(), 1);
  if (bd.size() == 1) bd.push_back(1);
  std::size_t r = std::max(ad.size(), bd.size());
  ad = left_pad(ad, r);
  bd = left_pad(bd, r);
  if (ad[r - 1] != bd[r - 2]) return false;
  Dims dd(r);
  for (std::size_t i = 0; i + 2 < r; ++i) {
    if (ad[i] != bd[i] && ad[i] != 1 && bd[i] != 1) return false;
    dd[i] = std::max(ad[i], bd[i]);
  }
  dd[r - 2] = ad[r - 2];
  dd[r - 1] = bd[r - 1];
  std::int64_t numel = 1;
  for (auto d : dd) numel *= d;
  if (numel != *y->shape().numel()) return false;
  // B without batch dims (a Linear's weight): A's batch dims are more rows of one 2-D matmul. oneDNN
  // would otherwise run a batch of small matmuls, M = 1 each for a [seq, 1, hidden] activation.
  bool b_unbatched = std::all_of(bd.begin(), bd.end() - 2, [](std::int64_t d) { return d == 1; });
  if (r > 2 && b_unbatched) {
    std::int64_t rows = 1;
    for (std::size_t i = 0; i + 1 < r; ++i) rows *= ad[i];
    ad = {rows, ad[r - 1]};
    bd = {bd[r - 2], bd[r - 1]};
    dd = {rows, dd[r - 1]};
  }

  MatmulPlan plan;
  plan.src_md = plain_md(ad);
  plan.dst_md = plain_md(dd);
  plan.weights_constant = b->is_constant();
  plan.weights_md = plan.weights_constant ? any_md(bd) : plain_md(bd);
  if (plan.weights_constant) plan.weights = b->constant();
  if (!n.domain().empty() && !plan_fused_matmul(L, n, dd, plan)) return false;
  plan_matmul_tail(L, n, dd, plan);
  return emit_matmul(L, n, a, b, plan, "src " + dims_str(ad) + " x " + dims_str(bd));
}

inline bool lower_gemm(Lowering& L, const Node& n) {
  const Value* a = n.input(0);
  const Value* b = n.input(1);
  const Value* c = n.input(2);
  const Value* y = n.output(0);
  if (!is_f32(a) || !is_f32(b) || !is_f32(y) || a->is_constant()) return false;
  Dims ad = a->shape().sizes(), bd = b->shape().sizes();
  if (ad.size() != 2 || bd.size() != 2) return false;
  bool trans_a = n.attr_int("transA", 0) != 0, trans_b = n.attr_int("transB", 0) != 0;
  float alpha = n.attr_float("alpha", 1.0f), beta = n.attr_float("beta", 1.0f);
  std::int64_t m = trans_a ? ad[1] : ad[0], k = trans_a ? ad[0] : ad[1];
  std::int64_t kb = trans_b ? bd[1] : bd[0], nn = trans_b ? bd[0] : bd[1];
  if (k != kb || y->shape().sizes() != Dims{m, nn}) return false;

  MatmulPlan plan;
  // A transposed A is read in place through strides.
  plan.src_md = trans_a ? memory::desc({m, k}, memory::data_type::f32, Dims{1, m}) : plain_md({m, k});
  plan.dst_md = plain_md({m, nn});
  plan.weights_constant = b->is_constant();
  if (plan.weights_constant && alpha == 1.0f) {  // op(B) as [K, N]: the constant itself, transposed through strides
    plan.weights = b->constant();
    if (trans_b) plan.weights_source = memory::desc({k, nn}, memory::data_type::f32, Dims{1, k});
    plan.weights_md = any_md({k, nn});
  } else if (plan.weights_constant) {  // alpha * op(B) as [K, N], reordered once
    const float* src = b->constant().data<float>();
    std::vector<float> w(static_cast<std::size_t>(k * nn));
    for (std::int64_t i = 0; i < k; ++i)
      for (std::int64_t j = 0; j < nn; ++j)
        w[static_cast<std::size_t>(i * nn + j)] = alpha * (trans_b ? src[j * k + i] : src[i * nn + j]);
    plan.weights = Tensor::from_vector<float>({k, nn}, w);
    plan.weights_md = any_md({k, nn});
  } else {
    plan.weights_md = trans_b ? memory::desc({k, nn}, memory::data_type::f32, Dims{1, k}) : plain_md({k, nn});
    plan.out_scale = alpha;
  }
  if (c && beta != 0.0f) {
    if (!is_f32(c) || !bias_fits(c->shape().sizes(), {m, nn})) return false;
    Dims cd = left_pad(c->shape().sizes(), 2);
    if (c->is_constant()) {
      Tensor scaled = c->constant().clone().reshaped(cd);
      float* p = scaled.data<float>();
      for (std::int64_t i = 0; i < scaled.numel(); ++i) p[i] *= beta;
      // A bias is added before the post-ops; with alpha still to apply (runtime B) C must come after.
      if (plan.out_scale == 1.0f) {
        plan.bias_dims = cd;
        plan.bias = scaled;
      } else {
        plan.c_dims = cd;
        plan.c_constant = scaled;
      }
    } else {
      if (beta != 1.0f) return false;
      plan.c_dims = cd;
      plan.c_runtime = c;
    }
  }
  for (const fused::Activation& act : fused::read_activations(n)) plan.own_eltwise.push_back(eltwise_of(act));
  plan_matmul_tail(L, n, {m, nn}, plan);
  return emit_matmul(L, n, a, b, plan,
                     std::string("src ") + (trans_a ? "ba" : "ab") + dims_str(ad) + (trans_b ? " x B^T" : " x B") +
                         dims_str(bd) + (alpha != 1.0f ? " alpha " + std::to_string(alpha) : ""));
}

}  // namespace ondine::lower::detail
