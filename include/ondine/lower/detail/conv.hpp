// SPDX-License-Identifier: Apache-2.0
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

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/infer/nn.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/shape_ops.hpp"
#include "ondine/lower/detail/winograd.hpp"
#include "ondine/lower/detail/eltwise.hpp"

namespace ondine::lower::detail {

// The channel-blocked descriptor (nChw16c, or nChw8c below AVX-512) a float32 image activation takes under
// ConvLayout::ChannelBlocked (and Auto, the default); nullopt where the layout pass fixed another layout
// (row-major, channels-last), for constants, bf16, 1-D and 3-D convolutions (PyTorch's Conv1d encoder in
// gated_pt ran 2% slower in nCw16c at batch 8), and fewer than 8 channels (the image itself: a conv reads
// its 3 channels better row-major than padded to a block).
inline std::optional<memory::desc> channel_blocked_md(const Lowering& L, const Value* v, const Dims& dims,
                                                      memory::data_type dt) {
  using tag = memory::format_tag;
  const ConvLayout mode = L.options.conv_layout;
  if (mode == ConvLayout::Any || dt != memory::data_type::f32 || !v || v->is_constant()) return std::nullopt;
  if (v->layout() != Layout::Blocked && v->layout() != Layout::Unset) return std::nullopt;
  if (dims.size() != 4 || dims[1] < 8) return std::nullopt;
  return memory::desc(dims, dt, effective_isa().avx512 ? tag::nChw16c : tag::nChw8c);
}

// --- 1x1 convolution + depthwise 3x3 as one primitive (oneDNN's depthwise post-op) -------------------
//
// A MobileNet block's 1x1 expansion writes C·t channels at full resolution that only the depthwise 3x3
// after it reads; oneDNN 2.6's jit 1x1 kernel can run that depthwise on rows of its own output as they are
// made (post_ops::append_dw), so the expanded activation never goes to memory. Taken for channel-blocked
// float32 convolutions only (ConvLayout::ChannelBlocked and Auto): in channels-last oneDNN 2.6's
// fused kernel computes wrong results (bench/onednn_dw_nhwc_repro.cpp), and at batch 1 the activation stays
// in cache anyway. The depthwise: 3x3, stride 1 or 2, padding 1 on every side, no dilation, constant
// weights, its own activations (no Sum, no SiLU: oneDNN's swish post-op is the slow one, silu.hpp); a
// fused form oneDNN runs on its reference composition (`ref_fused_convolution`) is not taken.
struct DepthwiseFusion {
  const Node* node = nullptr;
  std::int64_t stride = 1;
  PostOpChain chain;  // the depthwise's own activations and those after it
};

// The depthwise reading the float32 1x1 convolution's `chain`, when it can be that convolution's post-op.
inline std::optional<DepthwiseFusion> depthwise_after(Lowering& L, const PostOpChain& chain) {
  namespace geo = ::ondine::infer::detail_nn;
  const Node* dw = sole_consumer(chain.result);
  if (!dw || dw->input(0) != chain.result || (dw->op_key() != "Conv" && dw->op_key() != "ondine.FusedConv")) return std::nullopt;
  // A depthwise that would compute in bf16 stays its own step: fused, it would run in float32.
  if (L.options.reference_ops.count(dw->op_key()) || L.runs_bf16(*dw)) return std::nullopt;
  const Value *w = dw->input(1), *b = dw->input(2), *y = dw->output(0);
  const Dims xd = chain.result->shape().sizes();
  if (!is_f32(w) || !w->is_constant() || (b && (!is_f32(b) || !b->is_constant())) || !is_f32(y) || y->is_graph_output())
    return std::nullopt;
  if (dw->op_key() == "ondine.FusedConv" && dw->input(3)) return std::nullopt;  // its own Sum
  const std::int64_t channels = xd.size() == 4 ? xd[1] : 0;
  if (dw->attr_int("group", 1) != channels || w->shape().sizes() != Dims{channels, 1, 3, 3}) return std::nullopt;
  geo::Window win = geo::read_window(*dw, {3, 3});
  geo::ResolvedWindow r = geo::resolve_window(*dw, win, {xd[2], xd[3]});
  if (win.dilations != Dims{1, 1} || win.strides[0] != win.strides[1] || (win.strides[0] != 1 && win.strides[0] != 2))
    return std::nullopt;
  if (r.pad_begin != Dims{1, 1} || r.out != Dims{y->shape().sizes()[2], y->shape().sizes()[3]}) return std::nullopt;
  // oneDNN pads the end as far as the output needs (its output size is checked against y's when the
  // primitive exists); ONNX's end padding beyond that (stride 2 over an even size) is never read.
  std::optional<PostOpChain> own = dw->op_key() == "ondine.FusedConv" ? fused_post_ops(L, *dw, 3) : plan_post_ops(L, *dw, false);
  if (!own || own->sum_operand) return std::nullopt;
  for (const EltwiseSpec& e : own->eltwise)
    for (const EltwiseSpec::Op& op : e.ops)
      if (op.alg == dnnl::algorithm::eltwise_swish) return std::nullopt;
  return DepthwiseFusion{dw, win.strides[0], *own};
}

// Lowers 1x1 convolution `n` (its post-op chain `chain`, no Sum) and the depthwise `dwf` reading it as one
// primitive; false (nothing created) when oneDNN has no such jit kernel.
inline bool lower_conv_with_depthwise(Lowering& L, const Node& n, const PostOpChain& chain, const DepthwiseFusion& dwf,
                                      const memory::desc& src_md, const memory::desc& weights_md, Dims strides,
                                      Dims dilates, Dims pad_begin, Dims pad_end) {
  using dt = memory::data_type;
  const Value *x = n.input(0), *w = n.input(1), *b = n.input(2), *mid = chain.result;
  const Node& dw = *dwf.node;
  const Value *dw_w = dw.input(1), *dw_b = dw.input(2), *y = dwf.chain.result;
  std::optional<memory::desc> mid_md = channel_blocked_md(L, mid, mid->shape().sizes(), dt::f32);
  if (!mid_md || chain.sum_operand) return false;
  dnnl::post_ops po = chain.ops();
  po.append_dw(dt::f32, dt::f32, dt::f32, 3, dwf.stride, 1, 0, {});
  for (const EltwiseSpec& e : dwf.chain.eltwise)
    for (const EltwiseSpec::Op& op : e.ops) po.append_eltwise(1.0f, op.alg, op.alpha, op.beta);
  if (repeats_eltwise_alg(po)) return false;
  dnnl::primitive_attr attr = Lowering::base_attr();
  attr.set_post_ops(po);
  const std::int64_t out_channels = w->shape().sizes()[0];
  auto desc = b ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                                  src_md, weights_md, plain_md({out_channels}), *mid_md, strides, dilates,
                                                  pad_begin, pad_end)
                : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                                  src_md, weights_md, *mid_md, strides, dilates, pad_begin, pad_end);
  dnnl::convolution_forward::primitive_desc pd(desc, attr, L.engine(), true);
  if (!pd || is_reference_impl(pd) || pd.dst_desc().dims() != y->shape().sizes()) return false;
  const memory::desc dw_w_md = pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS);
  const memory::desc dw_b_md = pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS);
  if (dw_w_md.get_size() == 0) return false;

  std::vector<SlotArg> args{{DNNL_ARG_SRC, L.slot_in(x, pd.src_desc()), pd.src_desc()}};
  std::vector<std::pair<int, memory>> consts;
  consts.emplace_back(DNNL_ARG_WEIGHTS, L.constant_memory(w->constant(), pd.weights_desc()));
  if (b) consts.emplace_back(DNNL_ARG_BIAS, L.constant_memory(b->constant(), pd.bias_desc()));
  consts.emplace_back(DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS, L.constant_memory(dw_w->constant(), dw_w_md));
  if (dw_b_md.get_size() != 0) {
    const std::int64_t channels = dw_w->shape().sizes()[0];
    consts.emplace_back(DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS,
                        dw_b ? L.constant_memory(dw_b->constant(), dw_b_md)
                             : L.constant_memory(std::vector<float>(static_cast<std::size_t>(channels), 0.0f), dw_b_md));
  }
  SlotId dst = L.new_value_slot(y, pd.dst_desc());
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc()});
  for (const Node* f : chain.nodes) L.fused.insert(f);
  L.fused.insert(&dw);
  for (const Node* f : dwf.chain.nodes) L.fused.insert(f);
  L.define(y, dst, pd.dst_desc());
  std::string detail = "src " + layout_name(pd.src_desc()) + dims_str(x->shape().sizes()) + " wei " +
                       layout_name(pd.weights_desc()) + dims_str(w->shape().sizes()) + chain.detail() + " +depthwise('" +
                       dw.name() + "' 3x3 s" + std::to_string(dwf.stride) + ")" + dwf.chain.detail() + " -> dst " +
                       layout_name(pd.dst_desc()) + dims_str(y->shape().sizes());
  L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(), detail}, &n, dnnl::convolution_forward(pd),
                  pd.scratchpad_desc(), std::move(args), std::move(consts));
  return true;
}

// A dilated 2-D convolution whose taps often read only padding (DeepLabV3's ASPP: 3x3 at dilation 12, 24
// and 36 on a 32x32 map, where the outer taps of the last see nothing but zeros), where oneDNN has only
// its im2col GEMM or reference kernel for it (AVX2 in 2.6: every tap of every output, zeros included).
// Lowered instead as one matrix product per tap over the outputs where that tap reads the image:
// channels-last, out[n, y, x, :] += in[n, y + dy, x + dx, :] x W[:, :, ky, kx]^T on strided views,
// first the tap that covers every output (with the bias), then the others accumulating (sum post-op),
// then the node's activations in place. The work is the taps' valid area (ASPP at 512x512: 56%, 25% and
// 11% of the dense conv's) and the sums run in another order than a dense conv's (float32 reassociation).
// Stride 1, one group, constant weights, float32, an activation chain only (no fused sum); `dil` the
// ONNX dilations (1: adjacent taps); else false, with nothing created.
inline bool lower_conv_as_tap_products(Lowering& L, const Node& n, const PostOpChain& own, const Dims& pad_begin,
                                       const Dims& dil) {
  using tag = memory::format_tag;
  using dt = memory::data_type;
  const Value* x = n.input(0);
  const Value* w = n.input(1);
  const Value* b = n.input(2);
  const Value* y = n.output(0);
  if (own.sum_operand || y->is_graph_output()) return false;
  const Dims xd = x->shape().sizes(), wd = w->shape().sizes(), yd = y->shape().sizes();
  const std::int64_t N = xd[0], C = xd[1], H = xd[2], W = xd[3], OC = wd[0], KH = wd[2], KW = wd[3];
  const std::int64_t OH = yd[2], OW = yd[3];
  // The outputs [lo, hi) along one axis whose tap k reads inside the image.
  auto valid = [](std::int64_t k, std::int64_t d, std::int64_t pad, std::int64_t in, std::int64_t out) {
    const std::int64_t off = k * d - pad;
    return std::make_pair(std::max<std::int64_t>(0, -off), std::min(out, in - off));
  };
  struct Tap {
    std::int64_t ky, kx, y0, y1, x0, x1;
  };
  std::vector<Tap> taps;
  double work = 0;
  for (std::int64_t ky = 0; ky < KH; ++ky)
    for (std::int64_t kx = 0; kx < KW; ++kx) {
      auto [y0, y1] = valid(ky, dil[0], pad_begin[0], H, OH);
      auto [x0, x1] = valid(kx, dil[1], pad_begin[1], W, OW);
      if (y0 >= y1 || x0 >= x1) continue;  // reads only padding: no work
      const Tap t{ky, kx, y0, y1, x0, x1};
      if (y0 == 0 && y1 == OH && x0 == 0 && x1 == OW && (taps.empty() || taps[0].y1 - taps[0].y0 < OH ||
                                                          taps[0].x1 - taps[0].x0 < OW))
        taps.insert(taps.begin(), t);  // the first product covers every output: it initialises them
      else
        taps.push_back(t);
      work += static_cast<double>((y1 - y0) * (x1 - x0));
    }
  if (taps.empty() || taps[0].y1 - taps[0].y0 < OH || taps[0].x1 - taps[0].x0 < OW) return false;
  if (work > 0.75 * static_cast<double>(OH * OW * KH * KW)) return false;  // mostly dense: oneDNN's conv

  // Row-major 4-D views of the channels-last bytes: [N, H, W, C] and [N, OH, OW, OC].
  const memory::desc x_md({N, C, H, W}, dt::f32, tag::acdb), y_md({N, OC, OH, OW}, dt::f32, tag::acdb);
  const memory::desc x_rows({N, H, W, C}, dt::f32, tag::abcd), y_rows({N, OH, OW, OC}, dt::f32, tag::abcd);
  const float* wp = w->constant().data<float>();
  struct Part {
    dnnl::matmul::primitive_desc pd;
    memory::desc src, dst;
    Tensor weights;
    Tap tap;
  };
  std::vector<Part> parts;
  for (std::size_t i = 0; i < taps.size(); ++i) {
    const Tap& t = taps[i];
    const std::int64_t dy = t.ky * dil[0] - pad_begin[0], dx = t.kx * dil[1] - pad_begin[1];
    const Dims region{N, t.y1 - t.y0, t.x1 - t.x0};
    memory::desc src = x_rows.submemory_desc({N, region[1], region[2], C}, {0, t.y0 + dy, t.x0 + dx, 0});
    memory::desc dst = y_rows.submemory_desc({N, region[1], region[2], OC}, {0, t.y0, t.x0, 0});
    dnnl::primitive_attr attr = Lowering::base_attr();
    if (i > 0) {
      dnnl::post_ops sum;
      sum.append_sum(1.0f);
      attr.set_post_ops(sum);
    }
    memory::desc wei({1, 1, C, OC}, dt::f32, tag::any);
    dnnl::matmul::primitive_desc pd;
    try {
      pd = (i == 0 && b) ? dnnl::matmul::primitive_desc(
                               dnnl::matmul::desc(src, wei, memory::desc({1, 1, 1, OC}, dt::f32, tag::abcd), dst),
                               attr, L.engine())
                         : dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), attr, L.engine());
    } catch (const dnnl::error&) {
      return false;
    }
    if (is_reference_impl(pd)) return false;
    std::vector<float> tap_w(static_cast<std::size_t>(C * OC));  // [C, OC]: W[oc, c, ky, kx]
    for (std::int64_t oc = 0; oc < OC; ++oc)
      for (std::int64_t c = 0; c < C; ++c)
        tap_w[static_cast<std::size_t>(c * OC + oc)] = wp[((oc * C + c) * KH + t.ky) * KW + t.kx];
    parts.push_back({pd, src, dst, Tensor::from_vector<float>({1, 1, C, OC}, tap_w), t});
  }
  std::vector<dnnl::eltwise_forward::primitive_desc> activations;
  for (const EltwiseSpec& e : own.eltwise)
    for (const EltwiseSpec::Op& op : e.ops) {
      try {
        activations.emplace_back(dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference, op.alg, y_md,
                                                             op.alpha, op.beta),
                                 Lowering::base_attr(), L.engine());
      } catch (const dnnl::error&) {
        return false;
      }
    }

  SlotId src = L.slot_in(x, x_md);
  SlotId dst = L.new_value_slot(y, y_md);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Part& p = parts[i];
    std::vector<std::pair<int, memory>> consts;
    consts.emplace_back(DNNL_ARG_WEIGHTS, L.constant_memory(p.weights, p.pd.weights_desc()));
    if (i == 0 && b)
      consts.emplace_back(DNNL_ARG_BIAS, L.constant_memory(b->constant().reshaped({1, 1, 1, OC}), p.pd.bias_desc()));
    const std::string where = "tap (" + std::to_string(p.tap.ky) + "," + std::to_string(p.tap.kx) + ") of " +
                              std::to_string(KH) + "x" + std::to_string(KW) + " dilation " + std::to_string(dil[0]) +
                              ": outputs [" + std::to_string(p.tap.y0) + "," + std::to_string(p.tap.y1) + ")x[" +
                              std::to_string(p.tap.x0) + "," + std::to_string(p.tap.x1) + ")" +
                              (i == 0 ? (b ? " +bias" : "") : " +sum") + ", nhwc" + dims_str(xd) + " -> nhwc" +
                              dims_str(yd);
    L.add_primitive({n.name(), n.op_type(), p.pd.impl_info_str(), where}, &n, dnnl::matmul(p.pd),
                    p.pd.scratchpad_desc(), {{DNNL_ARG_SRC, src, p.src}, {DNNL_ARG_DST, dst, p.dst}}, std::move(consts));
  }
  for (const auto& pd : activations)
    L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(), "activation in place, nhwc" + dims_str(yd)}, &n,
                    dnnl::eltwise_forward(pd), pd.scratchpad_desc(), {{DNNL_ARG_SRC, dst, y_md}, {DNNL_ARG_DST, dst, y_md}},
                    {});
  L.define(y, dst, y_md);
  L.log(n.op_type() + " '" + n.name() + "': dilated conv as " + std::to_string(parts.size()) + " tap products over " +
        std::to_string(static_cast<int>(100.0 * work / static_cast<double>(OH * OW * KH * KW))) +
        "% of the dense conv's work (the other taps read only padding)");
  return true;
}

// oneDNN's im2col GEMM convolution or its reference one: the kernels Ondine routes around (padded stems,
// dilated convs as tap products).
inline bool is_gemm_or_reference(const dnnl::convolution_forward::primitive_desc& pd) {
  return is_reference_impl(pd) || std::string(pd.impl_info_str()).find("gemm") != std::string::npos;
}

// own_swish: a trailing Swish of the node's own chain may run as Ondine's kernel after the primitive
// (take_trailing_swish); take_prelu: likewise a PRelu per channel ending the chain (take_trailing_prelu). Each
// false when the first attempt found the output in a layout its kernel does not read.
inline bool lower_conv_with(Lowering& L, const Node& n, bool own_swish, bool take_prelu = true) {
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
  // bfloat16 when only bf16 convolutions and matrix products read it (Lowering::bf16_activation).
  using dt = memory::data_type;
  const bool bf16 = L.choose_bf16(n, const_w);
  memory::desc weights_md = const_w ? any_md(weight_dims, bf16 ? dt::bf16 : dt::f32) : plain_md(weight_dims);
  // ConvLayout::ChannelBlocked: source and destination channel-blocked, unless oneDNN then has only its
  // reference kernel for the conv (a dilated one): then the layout oneDNN picks.
  // A stem (an image of 3 channels, read as oneDNN picks) still writes its output blocked.
  bool blocked = !bf16 && (channel_blocked_md(L, x, xd, dt::f32) || channel_blocked_md(L, y, yd, dt::f32));
  auto activation = [&](const Value* v, const Dims& d, dt type) {
    std::optional<memory::desc> md = blocked ? channel_blocked_md(L, v, d, type) : std::nullopt;
    return md ? *md : activation_md(v, d, type);
  };
  memory::desc src_md = activation(x, xd, bf16 ? dt::bf16 : dt::f32);
  bool is_fused_op = !n.domain().empty();
  std::optional<PostOpChain> planned =
      is_fused_op ? fused_post_ops(L, n, 3, take_prelu) : plan_post_ops(L, n, true, take_prelu);
  if (!planned) return decline_fused(L, n, "its Sum is not a float32 tensor of the output's shape");
  PostOpChain chain = *planned;
  std::optional<float> swish;
  if (own_swish && !(bf16 && L.bf16_activation(chain.result))) swish = take_trailing_swish(chain);
  // A PRelu per channel ending the chain: Ondine's kernel in place on what the conv writes (prelu.hpp says
  // why), so no fused depthwise reads that output first. Not on a bf16 output (its kernel reads float32).
  const Value* prelu_slope = nullptr;
  if (!(bf16 && L.bf16_activation(chain.result))) prelu_slope = take_trailing_prelu(chain);
  if (!prelu_slope && chain.eltwise.size() > chain.own_eltwise && chain.eltwise.back().prelu_slope) {
    chain.eltwise.pop_back();  // its bf16 output: the PRelu is its own step
    chain.nodes.pop_back();
    chain.result = chain.nodes.empty() ? y : chain.nodes.back()->output(0);
  }
  PostOpChain own = chain.own_part(y);
  if (blocked && !swish && const_w && const_b && group == 1 && kernel == Dims{1, 1} && strides == Dims{1, 1} &&
      dilates == Dims{0, 0} && r.pad_begin == Dims{0, 0} && r.pad_end == Dims{0, 0} && !prelu_slope)
    if (std::optional<DepthwiseFusion> dwf = depthwise_after(L, chain))
      if (lower_conv_with_depthwise(L, n, chain, *dwf, src_md, weights_md, strides, dilates, r.pad_begin, r.pad_end))
        return true;
  bool fused = false;
  Dims pad_begin = r.pad_begin, pad_end = r.pad_end;
  std::optional<memory::desc> stem_dst;  // a stem's channel-blocked output, a 3-D conv's channels-last (below)
  auto choose = [&] {
    return choose_fusion<dnnl::convolution_forward::primitive_desc>(
      [&](bool with_chain) {
        const Value* result = (with_chain ? chain : own).result;
        memory::desc dst_md =
          stem_dst ? *stem_dst : activation(y, yd, bf16 && L.bf16_activation(result) ? dt::bf16 : dt::f32);
        dnnl::primitive_attr attr = Lowering::base_attr();
        attr.set_post_ops((with_chain ? chain : own).ops());
        auto desc = b ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                        dnnl::algorithm::convolution_direct, src_md, weights_md,
                                                        plain_md({out_channels}), dst_md, strides, dilates,
                                                        pad_begin, pad_end)
                      : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                        dnnl::algorithm::convolution_direct, src_md, weights_md,
                                                        dst_md, strides, dilates, pad_begin, pad_end);
        return dnnl::convolution_forward::primitive_desc(desc, attr, L.engine(), true);
      },
      !chain.nodes.empty(), fused);
  };
  auto pd = choose();
  if (blocked && (!pd || is_reference_impl(pd))) {
    blocked = false;
    src_md = activation_md(x, xd, dt::f32);
    pd = choose();
  }
  // Where the layout oneDNN picks runs its im2col GEMM, channels-last when that has a jit kernel: oneDNN 2.6
  // has its 3-D depthwise kernel in ndhwc only (MViT-V2's 3x3x3 pooling convs, [2, 96, 8, 56, 56]: gemm 75
  // ms, ndhwc jit 36 ms on one Zen 4 core; nCdhw16c only `ref`). A row-major source is reordered into it
  // (MViT's is a strided view, copied either way).
  // Measured for 3-D convolutions only; stems and dilated convs have their own paths below.
  if (pd && !blocked && !bf16 && rank == 5 && channels >= 8 && dilates == Dims(3, 0) && !x->is_constant() &&
      is_gemm_or_reference(pd) && L.options.conv_layout != ConvLayout::Any) {
    using tag = memory::format_tag;
    const memory::desc before = src_md;
    const bool fused_before = fused;
    src_md = memory::desc(xd, dt::f32, tag::ndhwc);
    stem_dst = memory::desc(yd, dt::f32, tag::ndhwc);
    auto channels_last = choose();
    if (channels_last && !is_gemm_or_reference(channels_last)) {
      pd = channels_last;
    } else {
      src_md = before;
      stem_dst.reset();
      fused = fused_before;
    }
  }
  // A stem (fewer than 8 input channels) whose direct kernel oneDNN 2.6 refuses for its padding (the AVX2
  // kernel's left border takes fewer columns than a Conv1d(1, 128, 9, padding=4) of an audio front end
  // needs) runs on the im2col GEMM, which writes row-major for the next conv to reorder (gated_pt on AVX2:
  // 1.6 ms for 9 MFLOP). Instead: the source zero-padded by Ondine's copy (a few channels, so cheap), then
  // the direct kernel without padding, writing the channel-blocked layout the next conv reads (0.2 ms).
  std::optional<Dims> padded_dims;
  const bool padded = std::any_of(pad_begin.begin(), pad_begin.end(), [](std::int64_t p) { return p > 0; }) ||
                      std::any_of(pad_end.begin(), pad_end.end(), [](std::int64_t p) { return p > 0; });
  if (pd && padded && !bf16 && group == 1 && channels < 8 && out_channels >= 8 && const_w &&
      x->layout() != Layout::ChannelsLast && L.options.conv_layout != ConvLayout::Any &&
      is_gemm_or_reference(pd)) {
    using tag = memory::format_tag;
    const bool wide = effective_isa().avx512;
    const tag blocked_tag = rank == 3 ? (wide ? tag::nCw16c : tag::nCw8c)
                            : rank == 4 ? (wide ? tag::nChw16c : tag::nChw8c)
                                        : (wide ? tag::nCdhw16c : tag::nCdhw8c);
    Dims xp = xd;
    for (std::size_t i = 0; i < spatial.size(); ++i) xp[2 + i] += pad_begin[i] + pad_end[i];
    const memory::desc unpadded_src = src_md;
    const bool fused_before = fused;
    src_md = plain_md(xp);
    stem_dst = memory::desc(yd, dt::f32, blocked_tag);
    pad_begin.assign(pad_begin.size(), 0);
    pad_end.assign(pad_end.size(), 0);
    auto direct = choose();
    if (direct && !is_gemm_or_reference(direct)) {
      pd = direct;
      padded_dims = xp;
    } else {
      src_md = unpadded_src;
      stem_dst.reset();
      pad_begin = r.pad_begin;
      pad_end = r.pad_end;
      fused = fused_before;
    }
  }
  // A 3x3 stride-1 conv between channel-blocked activations: Winograd F(4x4, 3x3) where it pays (winograd.hpp),
  // with the whole chain folded into its output transform, else with the node's own part.
  const bool winograd_candidate = blocked && !bf16 && !swish && !padded_dims && rank == 4 && group == 1 && const_w &&
                                  const_b && kernel == Dims{3, 3} && strides == Dims{1, 1} && dilates == Dims{0, 0};
  if (winograd_candidate) {
    std::optional<memory::desc> x_blocked = channel_blocked_md(L, x, xd, dt::f32);
    for (const PostOpChain* c : {&chain, &own}) {
      if (c == &own && chain.nodes.empty()) break;
      const std::optional<memory::desc> y_md = channel_blocked_md(L, c->result, yd, dt::f32);
      if (prelu_slope && c == &chain && y_md && !prelu_shape(*y_md)) continue;
      if (lower_conv_as_winograd(L, n, *c, r.pad_begin, x_blocked, y_md)) {
        if (prelu_slope && c == &chain) {
          const memory::desc md = L.md_of(chain.result);
          const SlotId out = L.slot_in(chain.result, md);
          if (!add_prelu_step(L, n, out, out, md, prelu_slope, ":prelu"))
            throw Error("internal: Winograd's output layout " + layout_name(md) + " for a PRelu");
        }
        return true;
      }
    }
  }
  if (!pd) return is_fused_op && decline_fused(L, n, "oneDNN has no convolution with its post-ops" + own.detail());
  if (!bf16 && rank == 4 && group == 1 && const_w && const_b && !swish && strides == Dims{1, 1} &&
      dilates != Dims{0, 0} && is_gemm_or_reference(pd) &&
      lower_conv_as_tap_products(L, n, own, r.pad_begin, win.dilations))
    return true;
  if (!fused) chain = own;
  if (swish && !is_dense(pd.dst_desc())) return lower_conv_with(L, n, false, take_prelu);  // nothing created yet
  if (prelu_slope && fused && !prelu_shape(pd.dst_desc())) return lower_conv_with(L, n, own_swish, false);

  SlotId src;
  if (padded_dims) {
    SlotId unpadded = L.row_major_slot(x);
    src = L.add_slot(runtime::Slot{x->name() + ".padded", DType::Float32, *padded_dims, pd.src_desc().get_size(),
                                   plain_layout_name(rank), SlotKind::Arena, 0});
    Dims begin(rank, 0);
    for (std::size_t i = 0; i < spatial.size(); ++i) begin[2 + i] = r.pad_begin[i];
    L.add_step(std::make_unique<PadStep>(
        runtime::StepInfo{n.name(), "Pad", "ondine:copy",
                          "zero border of " + dims_str(xd) + " -> " + dims_str(*padded_dims) + " for the direct kernel"},
        unpadded, src, xd, *padded_dims, std::move(begin), std::vector<unsigned char>(sizeof(float), 0)));
  } else {
    src = L.slot_in(x, pd.src_desc());
  }
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
  std::string detail = "src " + layout_name(pd.src_desc()) + (padded_dims ? dims_str(*padded_dims) + " (zero-padded)" : dims_str(xd)) + " wei " + layout_name(pd.weights_desc()) +
                       dims_str(wd) + (const_w ? "" : " (runtime)") + (group > 1 ? " g" + std::to_string(group) : "") + chain.detail() + " -> dst " +
                       layout_name(pd.dst_desc()) + dims_str(yd);
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc(), read_too});
  // The alternatives it had (StepInfo::choice): the activation layout, Winograd, the precision.
  std::string choice;
  auto chose = [&choice](const std::string& part) { choice += (choice.empty() ? "" : ", ") + part; };
  if (!bf16 && rank == 4 && (blocked || L.options.conv_layout == ConvLayout::Any))
    chose(std::string("layout ") + (blocked ? "blocked" : "any") + " (" +
          L.choice_origin("conv_layout", L.options.conv_layout != ConvLayout::Auto) + ")");
  if (winograd_candidate)
    chose("direct (" + L.conv_algorithm_origin(n) + ")");
  if (const std::string p = L.precision_choice(n); !p.empty()) chose(p);
  L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(), detail, choice}, &n, dnnl::convolution_forward(pd),
                  pd.scratchpad_desc(), std::move(args), std::move(consts));
  if (swish) add_silu_step(L, n, dst, pd.dst_desc(), *swish);
  if (prelu_slope && fused && !add_prelu_step(L, n, dst, dst, pd.dst_desc(), prelu_slope, ":prelu"))
    throw Error("internal: a convolution output layout " + layout_name(pd.dst_desc()) + " for a PRelu");
  return true;
}

inline bool lower_conv(Lowering& L, const Node& n) { return lower_conv_with(L, n, true); }

}  // namespace ondine::lower::detail
