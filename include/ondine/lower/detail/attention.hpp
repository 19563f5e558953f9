// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/attention.hpp - ondine.Attention (ir/fused_ops.hpp) as three oneDNN primitives
// on one scratch buffer of scores: matmul Q x K with the scale as output scale and the additive mask
// as a binary-add post-op, softmax in place over the last axis, matmul scores x V into the output
// (in bf16: bf16 operands, float32 scores, the softmax writing bf16 probabilities; see below).
//
// oneDNN 2.6 runs a binary post-op with its fast kernels only for some broadcasts of the mask: with
// the scores viewed as [P, R, Sq, Sk], a mask [P, 1, Sq, Sk] or [P, 1, 1, Sk] is fast, but a mask that
// broadcasts over the first dim ([1, 1, S, S] against batch 8) falls to `ref:any`, three orders of
// magnitude slower (bench: matmul 8x4x128x64 with that mask took 1.1 s against 0.8 ms). So the batch
// dims are grouped: P = the leading batch dims the mask has, R = the trailing ones it broadcasts over,
// which puts every mask of the form [b.., 1.., Sq|1, Sk] into a fast form without copying it (its bytes
// are the same). A constant mask of another form is expanded to the full scores once, at compile time;
// a run-time one leaves the node to its reference kernel (and the log says so). Grouped K/V heads
// (grouped-query attention) run the shape-free plan's kernel (dynamic_kernels.hpp), which reads each
// K/V head for its group of query heads where it is.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"
#include "ondine/lower/detail/kernel_step.hpp"
#include "ondine/reference/common.hpp"

namespace ondine::lower::detail {

inline std::int64_t product_of(const Dims& d) {
  std::int64_t p = 1;
  for (auto x : d) p *= x;
  return p;
}

inline bool lower_attention(Lowering& L, const Node& n) {
  const Value *q = n.input(0), *k = n.input(1), *v = n.input(2), *mask = n.input(3), *y = n.output(0);
  if (!is_f32(q) || !is_f32(k) || !is_f32(v) || !is_f32(y) || (mask && !is_f32(mask)))
    return decline_fused(L, n, "it is not float32");
  const Dims qd = q->shape().sizes(), kd = k->shape().sizes(), vd = v->shape().sizes();
  const std::size_t r = qd.size();
  if (r < 2 || kd.size() != r || vd.size() != r) return decline_fused(L, n, "Q, K and V differ in rank");
  const Dims batch(qd.begin(), qd.end() - 2);
  // Grouped-query attention (K and V with fewer heads than Q): Ondine's kernel, which reads each K/V head
  // for its group of query heads in place, rather than oneDNN matmuls over K and V repeated.
  if (const Dims kb(kd.begin(), kd.end() - 2), vb(vd.begin(), vd.end() - 2); kb != batch || vb != batch) {
    if (!fused::attention_groups(batch, kb) || !fused::attention_groups(batch, vb))
      return decline_fused(L, n, "K and V have batch dims that neither equal nor divide Q's");
    add_kernel_step(L, n, std::make_unique<dyn::AttentionKernel>(n, dyn::host_exp()),
                    "grouped: Q " + dims_str(qd) + ", K " + dims_str(kd) + ", V " + dims_str(vd));
    return true;
  }
  const std::int64_t sq = qd[r - 2], d = qd[r - 1], sk = kd[r - 1], dv = vd[r - 1];
  const Dims scores_dims = [&] {
    Dims s = batch;
    s.push_back(sq);
    s.push_back(sk);
    return s;
  }();

  // The batch grouping [P, R] and the mask's row count (Sq, or 1 for a mask broadcast over the rows).
  const std::size_t nb = batch.size();
  std::size_t split = nb;  // batch dims [0, split) form P, [split, nb) form R
  std::int64_t p = product_of(batch), rr = 1, rows = sq;
  std::optional<Tensor> expanded;  // a constant mask expanded to the scores
  if (mask) {
    Dims md = mask->shape().sizes();
    if (md.size() > r) return decline_fused(L, n, "its mask has a higher rank than the scores");
    md = left_pad(md, r);
    bool fits = true, broadcasting = false;
    p = 1;
    split = 0;
    for (std::size_t i = 0; i + 2 < r; ++i) {
      if (batch[i] == 1) continue;
      if (md[i] == batch[i]) {
        fits = fits && !broadcasting;  // a full dim after a broadcast one: no [P, R] grouping
        p *= batch[i];
        split = i + 1;
      } else if (md[i] == 1) {
        broadcasting = true;
        rr *= batch[i];
      } else {
        return decline_fused(L, n, "its mask " + dims_str(md) + " does not broadcast to the scores");
      }
    }
    if (md[r - 2] == 1) rows = 1;
    else if (md[r - 2] != sq) return decline_fused(L, n, "its mask does not broadcast to the scores");
    if (md[r - 1] != sk) {
      if (md[r - 1] != 1) return decline_fused(L, n, "its mask does not broadcast to the scores");
      fits = false;  // a mask broadcast along the keys: expand
    }
    if (fits && !broadcasting) split = nb;
    if (!fits) {
      if (!mask->is_constant())
        return decline_fused(L, n, "its run-time mask " + dims_str(md) + " has no fast broadcast form");
      const Tensor& m = mask->constant();
      const float* src = m.data<float>();
      std::vector<std::int64_t> at = reference::detail::broadcast_index_map(m.dims(), scores_dims);
      std::vector<float> full(at.size());
      for (std::size_t i = 0; i < at.size(); ++i) full[i] = src[at[i]];
      expanded = Tensor::from_vector<float>(scores_dims, full);
      p = product_of(batch);
      rr = 1;
      rows = sq;
      split = nb;
    }
  }

  // Q, K and V are read through their strides (the multi-head Slice/Reshape/Transpose before the node
  // stay views: gemm takes any strides of its operands) when those group as [P, R, rows, cols] and
  // oneDNN still picks a gemm for them; else they are copied row-major (a 5-D strided matmul, which a
  // batch that does not merge would need, runs on `ref:any`: measured 1.7 s against 3 ms).
  // In bf16 (Precision::Bf16, the node not kept float32) both products take bf16 operands: Q, K and V as
  // their producer holds them when that is bf16 (Lowering::reads_bf16 lets the QKV projection write bf16
  // through the views), else converted by one reorder; the scores, their scale, mask and softmax stay
  // float32, the softmax writes the probabilities in bf16, and the context is written in bf16 when only
  // bf16 readers take it. oneDNN without a fast bf16 kernel for a part: the float32 form.
  const std::vector<std::size_t> groups{split, nb, nb + 1, nb + 2};
  const bool bf16 = L.choose_bf16(n, true);
  const memory::desc s_md = plain_md({p, rr, sq, sk});
  const memory::desc mask_md = plain_md({p, 1, rows, sk});
  const float scale = n.attr_float("scale", 1.0f);
  dnnl::primitive_attr attr = Lowering::base_attr();
  if (scale != 1.0f) attr.set_output_scales(0, {scale});
  if (mask) {
    dnnl::post_ops po;
    po.append_binary(dnnl::algorithm::binary_add, mask_md);
    attr.set_post_ops(po);
  }
  auto is_ref = [](const auto& pd) { return pd && std::string(pd.impl_info_str()).rfind("ref", 0) == 0; };
  SlotId q_slot = 0, k_slot = 0, v_slot = 0;
  memory::desc q_md, k_md, v_md, y_md, value_md, p_md;
  std::size_t q_off = 0, k_off = 0, v_off = 0;
  dnnl::matmul::primitive_desc scores_pd, context_pd;
  dnnl::softmax_v2_forward::primitive_desc softmax_pd;
  bool in_bf16 = false;
  for (bool half : {true, false}) {
    if (half && !bf16) continue;
    const memory::data_type op_dt = half ? memory::data_type::bf16 : memory::data_type::f32;
    const memory::data_type out_dt = half && L.bf16_activation(y) ? memory::data_type::bf16 : memory::data_type::f32;
    auto strided_operand = [&](const Value* x) -> std::optional<std::pair<SlotId, memory::desc>> {
      if (auto src = L.strided_source(x); src && src->second.data_type() == op_dt)
        if (auto md = regroup_md(src->second, groups)) return std::make_pair(src->first, *md);
      return std::nullopt;
    };
    auto plain_operand = [&](const Value* x) {
      const memory::desc plain = plain_md(x->shape().sizes(), op_dt);
      return std::make_pair(half ? L.slot_in(x, plain) : L.row_major_slot(x), *regroup_md(plain, groups));
    };
    // The output in the layout that makes the Transpose reading it (the heads merged back) a view.
    const memory::desc plain_value_md = plain_md(y->shape().sizes(), out_dt);
    memory::desc strided_value_md = plain_value_md;
    if (y->uses().size() == 1 && !y->is_graph_output()) {
      const Node& t = *y->uses()[0].node;
      const Value* ty = t.output(0);
      if (t.op_type() == "Transpose" && t.domain().empty() && t.has_attr("perm") && ty && ty->shape().is_static()) {
        const Dims perm = t.attr_ints("perm"), yd = y->shape().sizes();
        Dims sorted = perm;
        std::sort(sorted.begin(), sorted.end());
        bool permutation = perm.size() == r;
        for (std::size_t j = 0; permutation && j < r; ++j) permutation = sorted[j] == static_cast<std::int64_t>(j);
        if (permutation) {
          const Dims rs = row_major_strides(ty->shape().sizes());
          Dims strides(r, 0);
          for (std::size_t j = 0; j < r; ++j) strides[static_cast<std::size_t>(perm[j])] = rs[j];
          memory::desc want(yd, out_dt, strides);
          if (want.get_size() == plain_value_md.get_size() && regroup_md(want, groups)) strided_value_md = want;
        }
      }
    }
    const memory::desc probs_md = plain_md({p, rr, sq, sk}, op_dt);
    for (bool strided : {true, false}) {
      auto sq_op = strided ? strided_operand(q) : std::nullopt, sk_op = strided ? strided_operand(k) : std::nullopt,
           sv_op = strided ? strided_operand(v) : std::nullopt;
      if (strided && !sq_op && !sk_op && !sv_op && strided_value_md == plain_value_md) continue;  // nothing strided
      auto [qs, q_view] = sq_op ? *sq_op : plain_operand(q);
      auto [ks, k_view] = sk_op ? *sk_op : plain_operand(k);
      auto [vs, v_view] = sv_op ? *sv_op : plain_operand(v);
      // A view's offset (K and V slices of a fused QKV projection) goes into the address, not the descriptor.
      memory::desc qm, km, vm;
      std::tie(qm, q_off) = without_offset(q_view);
      std::tie(km, k_off) = without_offset(k_view);
      std::tie(vm, v_off) = without_offset(v_view);
      value_md = strided ? strided_value_md : plain_value_md;
      y_md = *regroup_md(value_md, groups);
      scores_pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(qm, km, s_md), attr, L.engine(), true);
      context_pd =
          dnnl::matmul::primitive_desc(dnnl::matmul::desc(probs_md, vm, y_md), Lowering::base_attr(), L.engine(), true);
      if (strided && (is_ref(scores_pd) || is_ref(context_pd))) continue;
      std::tie(q_slot, q_md, k_slot, k_md, v_slot, v_md) = std::tie(qs, qm, ks, km, vs, vm);
      break;
    }
    softmax_pd = dnnl::softmax_v2_forward::primitive_desc(
        dnnl::softmax_v2_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::softmax_accurate, s_md,
                                       probs_md, 3),
        Lowering::base_attr(), L.engine(), true);
    p_md = probs_md;
    in_bf16 = half;
    if (!half || (scores_pd && softmax_pd && context_pd && !is_ref(scores_pd) && !is_ref(softmax_pd) && !is_ref(context_pd)))
      break;
  }
  if (!scores_pd || !softmax_pd || !context_pd) return decline_fused(L, n, "oneDNN has no primitive for a part of it");
  if (bf16 && !in_bf16) {
    L.log("Attention '" + n.name() + "': oneDNN has no fast bf16 form of a part of it; it runs in fp32");
    L.record_fp32_fallback(n);
  }

  // The scores live only between the three steps: an arena slot of their own.
  runtime::Slot s = Lowering::slot_for(y, SlotKind::Arena, 0);
  s.name = n.name() + ".scores";
  s.dims = scores_dims;
  s.bytes = static_cast<std::size_t>(product_of(scores_dims)) * sizeof(float);
  s.layout = plain_layout_name(scores_dims.size());
  SlotId scores = L.add_slot(std::move(s));
  // bf16 probabilities: a slot of their own beside the float32 scores (the softmax reads one, writes the other).
  SlotId probs = scores;
  if (in_bf16) {
    runtime::Slot ps = Lowering::slot_for(y, SlotKind::Arena, 0);
    ps.name = n.name() + ".probabilities";
    ps.dims = scores_dims;
    ps.bytes = p_md.get_size();
    ps.layout = plain_layout_name(scores_dims.size()) + ":bf16";
    probs = L.add_slot(std::move(ps));
  }

  std::string view = "[" + std::to_string(p) + "," + std::to_string(rr) + "]";
  std::vector<SlotArg> args{{DNNL_ARG_SRC, q_slot, q_md, false, q_off},
                            {DNNL_ARG_WEIGHTS, k_slot, k_md, false, k_off},
                            {DNNL_ARG_DST, scores, s_md}};
  std::vector<std::pair<int, memory>> consts;
  const int mask_arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1;
  std::string mask_detail;
  if (mask) {
    mask_detail = " +mask" + dims_str({p, 1, rows, sk}) + (expanded ? " (expanded)" : mask->is_constant() ? " (constant)" : "");
    if (expanded) consts.emplace_back(mask_arg, L.constant_memory(*expanded, mask_md));
    else if (mask->is_constant()) consts.emplace_back(mask_arg, L.constant_memory(mask->constant(), mask_md));
    else args.push_back({mask_arg, L.row_major_slot(mask), mask_md});
  }
  std::string scale_detail = scale != 1.0f ? " *" + std::to_string(scale) : "";
  L.add_primitive({n.name(), n.op_type(), scores_pd.impl_info_str(),
                   "scores: batch " + view + " " + dims_str({sq, d}) + " x " + dims_str({d, sk}) + (in_bf16 ? " bf16" : "") +
                       scale_detail + mask_detail},
                  &n, dnnl::matmul(scores_pd), scores_pd.scratchpad_desc(), std::move(args), std::move(consts));
  L.add_primitive({n.name(), n.op_type(), softmax_pd.impl_info_str(),
                   (in_bf16 ? "softmax to bf16, axis 3 of " : "softmax in place, axis 3 of ") + dims_str({p, rr, sq, sk})},
                  &n, dnnl::softmax_v2_forward(softmax_pd), softmax_pd.scratchpad_desc(),
                  {{DNNL_ARG_SRC, scores, s_md}, {DNNL_ARG_DST, probs, p_md}}, {});
  SlotId out = L.new_value_slot(y, value_md);
  L.add_primitive({n.name(), n.op_type(), context_pd.impl_info_str(),
                   "context: batch " + view + " " + dims_str({sq, sk}) + " x " + dims_str({sk, dv}) + " -> " +
                       (is_row_major(value_md) ? dims_str(y->shape().sizes()) : strided_str(value_md)) +
                       (value_md.data_type() == memory::data_type::bf16 ? " bf16" : "")},
                  &n, dnnl::matmul(context_pd), context_pd.scratchpad_desc(),
                  {{DNNL_ARG_SRC, probs, p_md}, {DNNL_ARG_WEIGHTS, v_slot, v_md, false, v_off}, {DNNL_ARG_DST, out, y_md}},
                  {});
  L.define(y, out, value_md);
  return true;
}

}  // namespace ondine::lower::detail
