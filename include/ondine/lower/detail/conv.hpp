// ondine/lower/detail/conv.hpp - Conv (1-D to 3-D, groups/depthwise, strides, pads incl. auto_pad,
// dilations, bias) as a oneDNN convolution.
//
// Activations take the layout the layout pass chose for them (activation_md), else format_tag::any
// like the weights, so oneDNN picks its preferred layouts (NHWC activations and blocked weights for
// fp32 brgconv here); the weights are reordered into that layout once, now.
// A following residual Add (sum post-op) and activations (eltwise post-ops) fold into the primitive
// when their intermediate values have no other reader; if oneDNN rejects the fused form (or only its
// reference implementation takes it), the conv is created alone and the folded ops are lowered on
// their own. ondine.FusedConv carries its Sum and activations itself: those are always post-ops
// (further activations after it may fold as above); if oneDNN rejects them, the node runs its
// reference kernel.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/infer/nn.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"

namespace ondine::lower::detail {

// --- a 1x1 convolution with the depthwise 3x3 after it, as one primitive ------------------------------

// The depthwise convolution that may run as a post-op of 1x1 conv `n` (oneDNN's append_dw): the only reader
// of n's output, f32, no Sum, groups = channels, 3x3 kernel, stride 1 or 2 in both axes, pads 1, no dilation,
// constant weights and bias; its own activations become post-ops after it. nullptr when there is none.
inline const Node* depthwise_after(const Node& n) {
  const Value* y = n.output(0);
  if (!y || y->is_graph_output() || y->uses().size() != 1) return nullptr;
  const Node* dw = y->uses()[0].node;
  const std::string key = dw->op_key();
  if ((key != "Conv" && key != "ondine.FusedConv") || dw->input(0) != y || dw->num_outputs() != 1) return nullptr;
  if (key == "ondine.FusedConv" && dw->num_inputs() > 3 && dw->input(3)) return nullptr;  // a Sum
  const Value* w = dw->input(1);
  const Value* b = dw->num_inputs() > 2 ? dw->input(2) : nullptr;
  const Dims yd = y->shape().sizes();
  if (!is_f32(dw->output(0)) || !w || !w->is_constant() || !is_f32(w) || (b && (!b->is_constant() || !is_f32(b))))
    return nullptr;
  if (yd.size() != 4 || w->shape().sizes() != Dims{yd[1], 1, 3, 3} || dw->attr_int("group", 1) != yd[1]) return nullptr;
  if (dw->attr_string("auto_pad", "NOTSET") != "NOTSET" || dw->attr_ints("pads", {0, 0, 0, 0}) != Dims{1, 1, 1, 1} ||
      dw->attr_ints("dilations", {1, 1}) != Dims{1, 1})
    return nullptr;
  const Dims strides = dw->attr_ints("strides", {1, 1});
  if (strides.size() != 2 || strides[0] != strides[1] || (strides[0] != 1 && strides[0] != 2)) return nullptr;
  return dw;
}

// Conv `n` (1x1, stride 1, no pads, one group, f32, its own activations only) and the depthwise 3x3 that
// reads it (depthwise_after) as one oneDNN convolution with a depthwise post-op: the expanded activation
// between them (MobileNet's inverted residuals: 6x the block's channels) never goes to memory. Measured here
// at batch 8, 2 threads: 16->96 channels at 112x112 then the stride-2 depthwise, 5.08 ms as two primitives,
// 2.34 ms fused. Taken only when oneDNN has a jit kernel for it (not its generic ref_fused_convolution,
// which runs the two one after the other); false leaves both to the ordinary lowering.
inline bool lower_conv_with_depthwise(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* w = n.input(1);
  const Value* b = n.num_inputs() > 2 ? n.input(2) : nullptr;
  const Value* y = n.output(0);
  if (L.options.precision != Precision::Fp32 || !is_f32(x) || !is_f32(y) || !w || !w->is_constant() || !is_f32(w) ||
      x->is_constant() || (b && (!b->is_constant() || !is_f32(b))))
    return false;
  if (n.op_key() == "ondine.FusedConv" && n.num_inputs() > 3 && n.input(3)) return false;  // a Sum
  const Dims xd = x->shape().sizes(), wd = w->shape().sizes(), yd = y->shape().sizes();
  if (xd.size() != 4 || wd.size() != 4 || wd[2] != 1 || wd[3] != 1 || n.attr_int("group", 1) != 1 ||
      n.attr_ints("strides", {1, 1}) != Dims{1, 1} || n.attr_ints("pads", {0, 0, 0, 0}) != Dims{0, 0, 0, 0} ||
      n.attr_string("auto_pad", "NOTSET") != "NOTSET" || yd != Dims{xd[0], wd[0], xd[2], xd[3]})
    return false;
  const Node* dw = depthwise_after(n);
  if (!dw || L.options.reference_ops.count(dw->op_key())) return false;
  const Value* dw_w = dw->input(1);
  const Value* dw_b = dw->num_inputs() > 2 ? dw->input(2) : nullptr;
  const Value* out = dw->output(0);
  const Dims od = out->shape().sizes();
  const std::int64_t stride = dw->attr_ints("strides", {1, 1})[0];

  dnnl::post_ops ops;
  for (const fused::Activation& a : fused::read_activations(n))
    for (const EltwiseSpec::Op& op : eltwise_of(a).ops) ops.append_eltwise(1.0f, op.alg, op.alpha, op.beta);
  ops.append_dw(memory::data_type::f32, memory::data_type::f32, memory::data_type::f32, 3, stride, 1, 0, {});
  for (const fused::Activation& a : fused::read_activations(*dw))
    for (const EltwiseSpec::Op& op : eltwise_of(a).ops) ops.append_eltwise(1.0f, op.alg, op.alpha, op.beta);
  if (repeats_eltwise_alg(ops)) return false;
  dnnl::primitive_attr attr = Lowering::base_attr();
  attr.set_post_ops(ops);
  // The source as it is and the output in the same layout when that is channels-last, which the convolutions
  // around it use here (brgconv): oneDNN's own choice for the fused kernel (nChw16c) would put a reorder on
  // each side. The primitive's destination has the 1x1's dims; the depthwise writes `out` (DNNL_ARG_DST).
  const memory::desc src_md = L.state(x).has_md ? L.state(x).md : activation_md(x, xd);
  const bool nhwc = layout_name(src_md) == "acdb";
  const memory::desc mid_md = nhwc ? memory::desc(yd, memory::data_type::f32, memory::format_tag::nhwc)
                                   : activation_md(y, yd);
  dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src_md,
                                       any_md(wd), plain_md({wd[0]}), mid_md, {1, 1}, {0, 0}, {0, 0}, {0, 0});
  dnnl::convolution_forward::primitive_desc pd;
  try {
    pd = dnnl::convolution_forward::primitive_desc(desc, attr, L.engine(), true);
  } catch (const dnnl::error&) {
    return false;
  }
  if (!pd || std::string(pd.impl_info_str()).find("ref") != std::string::npos) return false;
  const memory::desc dw_w_md = pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS);
  const memory::desc dw_b_md = pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS);
  const memory::desc final_md = pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_DST);

  SlotId src = L.slot_in(x, pd.src_desc());
  std::vector<std::pair<int, memory>> consts;
  consts.emplace_back(DNNL_ARG_WEIGHTS, L.constant_memory(w->constant(), pd.weights_desc()));
  consts.emplace_back(DNNL_ARG_BIAS, b ? L.constant_memory(b->constant(), pd.bias_desc())
                                       : L.constant_memory(std::vector<float>(static_cast<std::size_t>(wd[0]), 0.0f),
                                                           pd.bias_desc()));
  consts.emplace_back(DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS, L.constant_memory(dw_w->constant(), dw_w_md));
  consts.emplace_back(DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS,
                      dw_b ? L.constant_memory(dw_b->constant(), dw_b_md)
                           : L.constant_memory(std::vector<float>(static_cast<std::size_t>(wd[0]), 0.0f), dw_b_md));
  SlotId dst = L.new_value_slot(out, final_md);
  L.fused.insert(dw);
  L.define(out, dst, final_md);
  std::string detail = "src " + layout_name(pd.src_desc()) + dims_str(xd) + " wei " + layout_name(pd.weights_desc()) +
                       dims_str(wd) + " + depthwise 3x3 s" + std::to_string(stride) + " '" + dw->name() + "' -> dst " +
                       layout_name(final_md) + dims_str(od);
  L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(), detail}, &n, dnnl::convolution_forward(pd),
                  pd.scratchpad_desc(), {{DNNL_ARG_SRC, src, pd.src_desc()}, {DNNL_ARG_DST, dst, final_md}},
                  std::move(consts));
  return true;
}

// own_swish: a trailing Swish of the node's own chain may run as Ondine's kernel after the primitive
// (take_trailing_swish); false when the first attempt found the output not dense.
inline bool lower_conv_with(Lowering& L, const Node& n, bool own_swish) {
  namespace geo = ::ondine::infer::detail_nn;
  const Value* x = n.input(0);
  const Value* w = n.input(1);
  const Value* b = n.input(2);
  const Value* y = n.output(0);
  if (!is_f32(x) || !is_f32(w) || !is_f32(y) || x->is_constant()) return false;
  if (b && !is_f32(b)) return false;
  // Constant weights take the layout oneDNN prefers; runtime weights (rare: the backend tests feed
  // them as inputs) are read row-major in place.
  bool const_w = w->is_constant(), const_b = !b || b->is_constant();
  Dims xd = x->shape().sizes(), wd = w->shape().sizes(), yd = y->shape().sizes();
  std::size_t rank = xd.size();
  if (rank < 3 || rank > 5 || wd.size() != rank || yd.size() != rank) return false;
  std::int64_t group = n.attr_int("group", 1);
  std::int64_t channels = xd[1], out_channels = wd[0];
  // Inconsistent shapes: let the reference kernel report them.
  if (group <= 0 || channels != wd[1] * group || out_channels % group != 0 || yd[1] != out_channels) return false;
  if (b && b->shape().sizes() != Dims{out_channels}) return false;

  Dims kernel(wd.begin() + 2, wd.end()), spatial(xd.begin() + 2, xd.end());
  geo::Window win = geo::read_window(n, kernel);
  geo::ResolvedWindow r = geo::resolve_window(n, win, spatial);
  if (r.out != Dims(yd.begin() + 2, yd.end())) return false;
  Dims strides = win.strides, dilates = win.dilations;
  for (auto& d : dilates) d -= 1;  // oneDNN counts the holes between taps
  Dims weight_dims = wd;
  if (group > 1) {  // [G, OC/G, IC/G, k...]
    weight_dims = {group, out_channels / group, wd[1]};
    weight_dims.insert(weight_dims.end(), kernel.begin(), kernel.end());
  }

  // Precision::Bf16: bfloat16 source and constant weights (f32 bias, f32 accumulation); the output in
  // bfloat16 when only convolutions read it (Lowering::bf16_activation).
  using dt = memory::data_type;
  const bool bf16 = L.choose_bf16(n, const_w);
  memory::desc weights_md = const_w ? any_md(weight_dims, bf16 ? dt::bf16 : dt::f32) : plain_md(weight_dims);
  memory::desc src_md = activation_md(x, xd, bf16 ? dt::bf16 : dt::f32);
  bool is_fused_op = !n.domain().empty();
  std::optional<PostOpChain> planned = is_fused_op ? fused_post_ops(L, n, 3) : plan_post_ops(L, n, true);
  if (!planned) return decline_fused(L, n, "its Sum is not a float32 tensor of the output's shape");
  PostOpChain chain = *planned;
  std::optional<float> swish;
  if (own_swish && !(bf16 && L.bf16_activation(chain.result))) swish = take_trailing_swish(chain);
  PostOpChain own = chain.own_part(y);
  bool fused = false;
  auto pd = choose_fusion<dnnl::convolution_forward::primitive_desc>(
      [&](bool with_chain) {
        const Value* result = (with_chain ? chain : own).result;
        memory::desc dst_md = activation_md(y, yd, bf16 && L.bf16_activation(result) ? dt::bf16 : dt::f32);
        dnnl::primitive_attr attr = Lowering::base_attr();
        attr.set_post_ops((with_chain ? chain : own).ops());
        auto desc = b ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                        dnnl::algorithm::convolution_direct, src_md, weights_md,
                                                        plain_md({out_channels}), dst_md, strides, dilates,
                                                        r.pad_begin, r.pad_end)
                      : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                        dnnl::algorithm::convolution_direct, src_md, weights_md,
                                                        dst_md, strides, dilates, r.pad_begin, r.pad_end);
        return dnnl::convolution_forward::primitive_desc(desc, attr, L.engine(), true);
      },
      !chain.nodes.empty(), fused);
  if (!pd) return is_fused_op && decline_fused(L, n, "oneDNN has no convolution with its post-ops" + own.detail());
  if (!fused) chain = own;
  if (swish && !is_dense(pd.dst_desc())) return lower_conv_with(L, n, false);  // nothing created yet

  SlotId src = L.slot_in(x, pd.src_desc());
  std::vector<SlotArg> args{{DNNL_ARG_SRC, src, pd.src_desc()}};
  std::vector<std::pair<int, memory>> consts;
  if (const_w)
    consts.emplace_back(DNNL_ARG_WEIGHTS, L.constant_memory(w->constant(), pd.weights_desc()));
  else
    args.push_back({DNNL_ARG_WEIGHTS, L.row_major_slot(w), pd.weights_desc()});
  if (b && const_b)
    consts.emplace_back(DNNL_ARG_BIAS, L.constant_memory(b->constant(), pd.bias_desc()));
  else if (b)
    args.push_back({DNNL_ARG_BIAS, L.row_major_slot(b), pd.bias_desc()});
  bool read_too = false;
  SlotId dst = post_op_dst(L, chain, pd.dst_desc(), read_too);
  commit_post_ops(L, chain, dst, pd.dst_desc());
  std::string detail = "src " + layout_name(pd.src_desc()) + dims_str(xd) + " wei " + layout_name(pd.weights_desc()) +
                       dims_str(wd) + (const_w ? "" : " (runtime)") + (group > 1 ? " g" + std::to_string(group) : "") + chain.detail() + " -> dst " +
                       layout_name(pd.dst_desc()) + dims_str(yd);
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc(), read_too});
  L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(), detail}, &n, dnnl::convolution_forward(pd),
                  pd.scratchpad_desc(), std::move(args), std::move(consts));
  if (swish) add_silu_step(L, n, dst, pd.dst_desc(), *swish);
  return true;
}

inline bool lower_conv(Lowering& L, const Node& n) {
  return lower_conv_with_depthwise(L, n) || lower_conv_with(L, n, true);
}

}  // namespace ondine::lower::detail
