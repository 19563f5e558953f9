// ondine/lower/detail/norm.hpp - BatchNormalization (inference) and Softmax / LogSoftmax.
//
// BatchNormalization with constant statistics and parameters is oneDNN's batch_normalization in
// inference mode (use_global_stats | use_scale | use_shift), on the producer's layout. Softmax uses
// softmax_v2 on one axis: ONNX opset >= 13 normalises one axis; before 13 it flattens to 2-D at
// `axis`, which is the same only when axis is the last one (other cases run the reference kernel).
#pragma once

#include <string>
#include <vector>

#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"

namespace ondine::lower::detail {

inline bool lower_batchnorm(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!is_f32(x) || !is_f32(y) || y->shape().sizes() != x->shape().sizes()) return false;
  if (n.attr_int("training_mode", 0) != 0 || n.attr_int("spatial", 1) != 1) return false;
  for (std::size_t i = 1; i < n.num_outputs(); ++i)
    if (n.output(i) && (n.output(i)->has_uses() || n.output(i)->is_graph_output())) return false;
  Dims xd = x->shape().sizes();
  if (xd.size() < 2 || xd.size() > 5) return false;
  std::int64_t channels = xd[1];
  for (std::size_t i = 1; i <= 4; ++i) {
    const Value* p = n.input(i);
    if (!p || !is_f32(p) || p->shape().sizes() != Dims{channels}) return false;
  }
  float epsilon = n.attr_float("epsilon", 1e-5f);
  auto flags = dnnl::normalization_flags::use_global_stats | dnnl::normalization_flags::use_scale |
               dnnl::normalization_flags::use_shift;
  memory::desc src_md = L.md_of(x);
  dnnl::batch_normalization_forward::desc desc(dnnl::prop_kind::forward_inference, src_md, epsilon, flags);
  PostOpChain chain = plan_post_ops(L, n, false);
  bool fused = false;
  auto pd = choose_fusion<dnnl::batch_normalization_forward::primitive_desc>(
      [&](bool with_chain) {
        dnnl::primitive_attr attr = Lowering::base_attr();
        if (with_chain) attr.set_post_ops(chain.ops());
        return dnnl::batch_normalization_forward::primitive_desc(desc, attr, L.engine(), true);
      },
      !chain.nodes.empty(), fused);
  if (!pd) return false;
  if (!fused) chain = PostOpChain{y};
  // Scale, bias, mean, variance: constants copied once; runtime values read in place.
  std::vector<std::pair<int, memory>> consts;
  std::vector<SlotArg> args;
  const int param_args[4] = {DNNL_ARG_SCALE, DNNL_ARG_SHIFT, DNNL_ARG_MEAN, DNNL_ARG_VARIANCE};
  memory::desc vec = plain_md({channels});
  for (std::size_t i = 1; i <= 4; ++i) {
    const Value* p = n.input(i);
    if (p->is_constant())
      consts.emplace_back(param_args[i - 1], L.constant_memory(p->constant(), vec));
    else
      args.push_back({param_args[i - 1], L.row_major_slot(p), vec});
  }
  SlotId src = L.slot_in(x, pd.src_desc());
  SlotId dst = L.new_value_slot(chain.result, pd.dst_desc());
  commit_post_ops(L, chain, dst, pd.dst_desc());
  args.push_back({DNNL_ARG_SRC, src, pd.src_desc()});
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc()});
  L.add_primitive({n.name(), "BatchNormalization", pd.impl_info_str(),
                   "eps " + std::to_string(epsilon) + chain.detail() + " " + layout_name(pd.src_desc()) + dims_str(xd)},
                  &n, dnnl::batch_normalization_forward(pd), pd.scratchpad_desc(), std::move(args), std::move(consts));
  return true;
}

inline bool lower_softmax(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!is_f32(x) || !is_f32(y) || y->shape().sizes() != x->shape().sizes()) return false;
  Dims xd = x->shape().sizes();
  if (xd.empty()) return false;
  auto rank = static_cast<std::int64_t>(xd.size());
  std::int64_t axis = n.attr_int("axis", n.opset() >= 13 ? -1 : 1);
  if (axis < -rank || axis >= rank) return false;  // the reference kernel reports it
  if (axis < 0) axis += rank;
  if (n.opset() < 13 && axis != rank - 1) return false;
  bool log = n.op_type() == "LogSoftmax";
  memory::desc src_md = L.md_of(x);
  dnnl::softmax_v2_forward::desc desc(dnnl::prop_kind::forward_inference,
                                      log ? dnnl::algorithm::softmax_log : dnnl::algorithm::softmax_accurate, src_md,
                                      any_md(xd), static_cast<int>(axis));
  dnnl::softmax_v2_forward::primitive_desc pd(desc, Lowering::base_attr(), L.engine(), true);
  if (!pd) return false;
  SlotId src = L.slot_in(x, pd.src_desc());
  SlotId dst = L.new_value_slot(y, pd.dst_desc());
  L.define(y, dst, pd.dst_desc());
  L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(),
                   "axis " + std::to_string(axis) + " " + layout_name(pd.src_desc()) + dims_str(xd)},
                  &n, dnnl::softmax_v2_forward(pd), pd.scratchpad_desc(),
                  {{DNNL_ARG_SRC, src, pd.src_desc()}, {DNNL_ARG_DST, dst, pd.dst_desc()}}, {});
  return true;
}

}  // namespace ondine::lower::detail
