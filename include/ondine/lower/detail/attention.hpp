// ondine/lower/detail/attention.hpp - ondine.Attention (ir/fused_ops.hpp) as three oneDNN primitives
// on one scratch buffer of scores: matmul Q x K with the scale as output scale and the additive mask
// as a binary-add post-op, softmax in place over the last axis, matmul scores x V into the output.
//
// oneDNN 2.6 runs a binary post-op with its fast kernels only for some broadcasts of the mask: with
// the scores viewed as [P, R, Sq, Sk], a mask [P, 1, Sq, Sk] or [P, 1, 1, Sk] is fast, but a mask that
// broadcasts over the first dim ([1, 1, S, S] against batch 8) falls to `ref:any`, three orders of
// magnitude slower (bench: matmul 8x4x128x64 with that mask took 1.1 s against 0.8 ms). So the batch
// dims are grouped: P = the leading batch dims the mask has, R = the trailing ones it broadcasts over,
// which puts every mask of the form [b.., 1.., Sq|1, Sk] into a fast form without copying it (its bytes
// are the same). A constant mask of another form is expanded to the full scores once, at compile time;
// a run-time one leaves the node to its reference kernel (and the log says so).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"
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
  const std::int64_t sq = qd[r - 2], d = qd[r - 1], sk = kd[r - 1], dv = vd[r - 1];
  const Dims scores_dims = [&] {
    Dims s = batch;
    s.push_back(sq);
    s.push_back(sk);
    return s;
  }();

  // The batch grouping [P, R] and the mask's row count (Sq, or 1 for a mask broadcast over the rows).
  std::int64_t p = product_of(batch), rr = 1, rows = sq;
  std::optional<Tensor> expanded;  // a constant mask expanded to the scores
  if (mask) {
    Dims md = mask->shape().sizes();
    if (md.size() > r) return decline_fused(L, n, "its mask has a higher rank than the scores");
    md = left_pad(md, r);
    bool fits = true, broadcasting = false;
    p = 1;
    for (std::size_t i = 0; i + 2 < r; ++i) {
      if (batch[i] == 1) continue;
      if (md[i] == batch[i]) {
        fits = fits && !broadcasting;  // a full dim after a broadcast one: no [P, R] grouping
        p *= batch[i];
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
    }
  }

  const memory::desc q_md = plain_md({p, rr, sq, d}), k_md = plain_md({p, rr, d, sk}), v_md = plain_md({p, rr, sk, dv});
  const memory::desc s_md = plain_md({p, rr, sq, sk}), y_md = plain_md({p, rr, sq, dv});
  const memory::desc mask_md = plain_md({p, 1, rows, sk});
  const float scale = n.attr_float("scale", 1.0f);

  dnnl::primitive_attr attr = Lowering::base_attr();
  if (scale != 1.0f) attr.set_output_scales(0, {scale});
  if (mask) {
    dnnl::post_ops po;
    po.append_binary(dnnl::algorithm::binary_add, mask_md);
    attr.set_post_ops(po);
  }
  dnnl::matmul::primitive_desc scores_pd(dnnl::matmul::desc(q_md, k_md, s_md), attr, L.engine(), true);
  dnnl::softmax_v2_forward::primitive_desc softmax_pd(
      dnnl::softmax_v2_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::softmax_accurate, s_md, s_md, 3),
      Lowering::base_attr(), L.engine(), true);
  dnnl::matmul::primitive_desc context_pd(dnnl::matmul::desc(s_md, v_md, y_md), Lowering::base_attr(), L.engine(), true);
  if (!scores_pd || !softmax_pd || !context_pd) return decline_fused(L, n, "oneDNN has no primitive for a part of it");

  // The scores live only between the three steps: an arena slot of their own.
  runtime::Slot s = Lowering::slot_for(y, SlotKind::Arena, 0);
  s.name = n.name() + ".scores";
  s.dims = scores_dims;
  s.bytes = static_cast<std::size_t>(product_of(scores_dims)) * sizeof(float);
  s.layout = plain_layout_name(scores_dims.size());
  SlotId scores = L.add_slot(std::move(s));

  std::string view = "[" + std::to_string(p) + "," + std::to_string(rr) + "]";
  std::vector<SlotArg> args{{DNNL_ARG_SRC, L.row_major_slot(q), q_md},
                            {DNNL_ARG_WEIGHTS, L.row_major_slot(k), k_md},
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
                   "scores: batch " + view + " " + dims_str({sq, d}) + " x " + dims_str({d, sk}) + scale_detail + mask_detail},
                  &n, dnnl::matmul(scores_pd), scores_pd.scratchpad_desc(), std::move(args), std::move(consts));
  L.add_primitive({n.name(), n.op_type(), softmax_pd.impl_info_str(), "softmax in place, axis 3 of " + dims_str({p, rr, sq, sk})},
                  &n, dnnl::softmax_v2_forward(softmax_pd), softmax_pd.scratchpad_desc(),
                  {{DNNL_ARG_SRC, scores, s_md}, {DNNL_ARG_DST, scores, s_md}}, {});
  memory::desc value_md = plain_md(y->shape().sizes());
  SlotId out = L.new_value_slot(y, value_md);
  L.add_primitive({n.name(), n.op_type(), context_pd.impl_info_str(),
                   "context: batch " + view + " " + dims_str({sq, sk}) + " x " + dims_str({sk, dv}) + " -> " +
                       dims_str(y->shape().sizes())},
                  &n, dnnl::matmul(context_pd), context_pd.scratchpad_desc(),
                  {{DNNL_ARG_SRC, scores, s_md}, {DNNL_ARG_WEIGHTS, L.row_major_slot(v), v_md}, {DNNL_ARG_DST, out, y_md}},
                  {});
  L.define(y, out, value_md);
  return true;
}

}  // namespace ondine::lower::detail
