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

inline bool lower_conv(Lowering& L, const Node& n) { return lower_conv_with(L, n, true); }

}  // namespace ondine::lower::detail
