// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/norm.hpp - BatchNormalization (inference), LayerNormalization and Softmax /
// LogSoftmax.
//
// BatchNormalization with constant statistics and parameters is oneDNN's batch_normalization in
// inference mode (use_global_stats | use_scale | use_shift), on the producer's layout. Softmax uses
// softmax_v2 on one axis: ONNX opset >= 13 normalises one axis; before 13 it flattens to 2-D at
// `axis`, which is the same only when axis is the last one (other cases run the reference kernel).
// LayerNormalization normalises X[axis:] jointly; oneDNN's layer_normalization normalises the last
// dim, so the row-major X is viewed as [prod(X[:axis]), prod(X[axis:])] (any axis), with Scale and B
// broadcast to the normalised dims and flattened.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"
#include "ondine/lower/detail/kernel_step.hpp"
#include "ondine/reference/nn.hpp"

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
                                      activation_md(y, xd), static_cast<int>(axis));
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

// LayerNormalization (opset 17) in f32 with the f32 stash type. Declines when the Mean / InvStdDev
// outputs are read: oneDNN's inference mode does not return them.
// ondine.RMSNorm: the shape-free plan's row kernel (oneDNN 2.6's layer normalization always takes the
// mean out).
inline bool lower_rms_norm(Lowering& L, const Node& n) {
  const Value *x = n.input(0), *scale = n.input(1);
  if (!is_f32(x) || !is_f32(scale) || !is_f32(n.output(0))) return decline_fused(L, n, "it is not float32");
  add_kernel_step(L, n, std::make_unique<dyn::LayerNormKernel>(n, true),
                  Graph::value_type_str(x) + ", axis " + std::to_string(n.attr_int("axis", -1)));
  return true;
}

// ondine.Rotary: the shape-free plan's row kernel.
inline bool lower_rotary(Lowering& L, const Node& n) {
  for (const Value* v : {n.input(0), n.input(1), n.input(2), n.output(0)})
    if (!is_f32(v)) return decline_fused(L, n, "it is not float32");
  add_kernel_step(L, n, std::make_unique<dyn::RotaryKernel>(n),
                  Graph::value_type_str(n.input(0)) + " by " + Graph::value_type_str(n.input(1)));
  return true;
}

inline bool lower_layernorm(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!is_f32(x) || !is_f32(y) || x->is_constant() || y->shape().sizes() != x->shape().sizes()) return false;
  if (!n.input(1)) return false;  // Scale is required: the reference kernel reports it
  for (std::size_t i = 1; i < n.num_outputs(); ++i)
    if (n.output(i) && (n.output(i)->has_uses() || n.output(i)->is_graph_output())) return false;
  if (n.attr_int("stash_type", 1) != 1) return false;
  Dims xd = x->shape().sizes();
  auto rank = static_cast<std::int64_t>(xd.size());
  std::int64_t axis = n.attr_int("axis", -1);
  if (rank == 0 || axis < -rank || axis >= rank) return false;  // the reference kernel reports it
  if (axis < 0) axis += rank;
  Dims norm_dims(xd.begin() + axis, xd.end());
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t i = 0; i < rank; ++i) (i < axis ? outer : inner) *= xd[static_cast<std::size_t>(i)];
  if (outer == 0 || inner == 0) return false;

  // Scale and B: constants are broadcast to the normalised dims now; a runtime one must already have
  // them (leading 1s aside) to be read in place as the [inner] vector oneDNN wants.
  for (std::size_t i = 1; i <= 2; ++i) {
    const Value* p = n.input(i);
    if (p && (!is_f32(p) || (!p->is_constant() && p->shape().numel().value_or(-1) != inner))) return false;
  }
  bool has_bias = n.input(2) != nullptr;
  float epsilon = n.attr_float("epsilon", 1e-5f);
  auto flags = dnnl::normalization_flags::use_scale;
  if (has_bias) flags = flags | dnnl::normalization_flags::use_shift;
  memory::desc data_md = plain_md({outer, inner});
  dnnl::layer_normalization_forward::desc desc(dnnl::prop_kind::forward_inference, data_md, epsilon, flags);
  dnnl::layer_normalization_forward::primitive_desc pd(desc, Lowering::base_attr(), L.engine(), true);
  if (!pd) return false;

  std::vector<std::pair<int, memory>> consts;
  std::vector<SlotArg> args;
  memory::desc vec = plain_md({inner});
  const int param_args[2] = {DNNL_ARG_SCALE, DNNL_ARG_SHIFT};
  for (std::size_t i = 1; i <= 2; ++i) {
    const Value* p = n.input(i);
    if (!p) continue;
    if (p->is_constant()) {
      std::vector<double> full = reference::detail::nn::broadcast_param(n, p->constant(), norm_dims, i == 1 ? "Scale" : "B");
      consts.emplace_back(param_args[i - 1], L.constant_memory(std::vector<float>(full.begin(), full.end()), vec));
    } else {
      args.push_back({param_args[i - 1], L.row_major_slot(p), vec});
    }
  }
  char epsilon_text[32];
  std::snprintf(epsilon_text, sizeof epsilon_text, "%g", static_cast<double>(epsilon));  // 1e-12, not 0.000000
  // The 2-D view is the row-major bytes of X and Y; Y is defined with its own dims for its readers.
  SlotId src = L.row_major_slot(x);
  SlotId dst = L.new_plain_slot(y);
  L.define_plain(y, dst);
  args.push_back({DNNL_ARG_SRC, src, pd.src_desc()});
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc()});
  L.add_primitive({n.name(), "LayerNormalization", pd.impl_info_str(),
                   "axis " + std::to_string(axis) + " eps " + epsilon_text + (has_bias ? "" : " no-bias") +
                       " " + dims_str(xd) + " as " + dims_str({outer, inner})},
                  &n, dnnl::layer_normalization_forward(pd), pd.scratchpad_desc(), std::move(args), std::move(consts));
  return true;
}

}  // namespace ondine::lower::detail
