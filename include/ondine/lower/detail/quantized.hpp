// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/quantized.hpp - Ondine's quantized ops (ir/infer/quantized.hpp) as oneDNN int8
// primitives, and leftover QuantizeLinear / DequantizeLinear as reorders with scales.
//
// oneDNN 2.6 int8 semantics used here: dst = saturate(round(post_ops(oscale[c] * (acc + bias[c])))),
// acc the s32 sum of (src - src_zp) * wei, the bias added before the output scale. So, in units of
// the output scale y_scale: oscale[c] = x_scale * w_scale[c] / y_scale, bias'[c] = B[c] / (x_scale *
// w_scale[c]); post-ops: the Sum as sum(sum_scale / y_scale, sum_zero_point), the activations with
// their bounds divided by y_scale (they commute with a positive scale), then linear(1, y_zero_point)
// (round(v) + zp == round(v + zp) for an integer zp). A mid quantization (ONNX Runtime's Conv -> Q -> DQ
// before the residual Add) takes the output scale into mid units (x_scale * w_scale[c] / mid_scale),
// then round + clip to the mid range with eltwise scale mid_scale / y_scale (back into y units) before
// the sum. A chain never repeats an eltwise algorithm with other parameters (see
// repeats_eltwise_alg). The source zero point is a runtime zero-point argument. Activations stay in
// the layout oneDNN picks (NHWC for int8 convs here) whatever Value::layout says: the layout pass
// labels non-float values row-major, and readers that need row-major bytes get them through
// Lowering::slot_in.
// A case oneDNN rejects (or runs only on its reference implementation) returns false: the node runs
// its reference kernel, which computes the same numbers.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ondine/ir/infer/nn.hpp"
#include "ondine/ir/infer/quantized.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"
#include "ondine/lower/detail/pool.hpp"
#include "ondine/lower/detail/quantize_image.hpp"
#include "ondine/lower/isa.hpp"

namespace ondine::lower::detail {

namespace quant {

inline bool int8_dtype(DType t) { return t == DType::UInt8 || t == DType::Int8; }

inline memory::data_type dt_of(DType t) {
  memory::data_type d = memory::data_type::undef;
  dnnl_dtype(t, d);
  return d;
}

// md's layout with another element type of the same size.
inline memory::desc retyped(const memory::desc& md, memory::data_type dt) {
  memory::desc out = md;
  out.data.data_type = static_cast<dnnl_data_type_t>(dt);
  return out;
}

// A one-element s32 memory holding a zero point (the runtime zero-point argument).
inline memory zero_point_memory(Lowering& L, std::int32_t zp) {
  Tensor t = Tensor::from_vector<std::int32_t>({1}, {zp});
  return L.constant_memory(t, plain_md({1}, memory::data_type::s32));
}

// The mid rescale rides on the clip's eltwise scale and the mid clip is eltwise_clip where a Clip
// activation is eltwise_clip_v2 (same forward), so the chain never repeats an eltwise algorithm with
// other parameters, which oneDNN 2.6 computes wrong (see repeats_eltwise_alg in eltwise.hpp; before,
// a mid rescale linear followed by the y zero point's linear lost the zero point: MobileNetV2's linear
// bottlenecks were 100%+ off).

// The post-ops after the output scale, in units of y_scale (see the header comment). False when an
// activation has no exact int8 form or oneDNN 2.6 would compute the chain wrong.
inline bool build_post_ops(const qops::QAttrs& a, memory::data_type sum_dt, dnnl::post_ops& p, std::string& detail) {
  using A = dnnl::algorithm;
  bool float_out = a.output_type == DType::Float32;
  float ys = float_out ? 1.0f : a.y.scale;
  if (a.has_mid) {  // quantize to the mid type (in mid units), then back into y units by the clip's scale
    float lo = a.mid.type == DType::UInt8 ? 0.0f : -128.0f, hi = a.mid.type == DType::UInt8 ? 255.0f : 127.0f;
    auto zp = static_cast<float>(a.mid.zero_point);
    p.append_eltwise(1.0f, A::eltwise_round, 0.0f, 0.0f);
    p.append_eltwise(a.mid.scale / ys, A::eltwise_clip, lo - zp, hi - zp);
    detail += "+mid(round,clip*scale)";
  }
  if (a.has_sum) {
    p.append_sum(a.sum.scale / ys, a.sum.zero_point, sum_dt);
    detail += "+sum";
  }
  for (const fused::Activation& act : a.activations) {
    if (act.op == "Relu") p.append_eltwise(1.0f, A::eltwise_relu, 0.0f, 0.0f);
    else if (act.op == "LeakyRelu") p.append_eltwise(1.0f, A::eltwise_relu, act.alpha, 0.0f);
    else if (act.op == "Clip") {
      const float big = std::numeric_limits<float>::max();
      float lo = std::max(act.alpha, -big) / ys, hi = std::min(act.beta, big) / ys;
      if (lo > hi) lo = hi;
      p.append_eltwise(1.0f, A::eltwise_clip_v2, lo, hi);
    } else {
      return false;
    }
    detail += "+" + act.op;
  }
  if (!float_out && a.y.zero_point != 0) {
    p.append_eltwise(1.0f, A::eltwise_linear, 1.0f, static_cast<float>(a.y.zero_point));
    detail += "+zp";
  }
  return !repeats_eltwise_alg(p);
}

// oscale[c] = x_scale * w_scale[c] / y_scale (/ mid_scale with a mid quantization) and
// bias'[c] = B[c] / (x_scale * w_scale[c]).
inline std::vector<float> output_scales(const qops::QAttrs& a, std::int64_t channels) {
  float ys = a.output_type == DType::Float32 ? 1.0f : a.y.scale;
  float mid = a.has_mid ? a.mid.scale : ys;
  std::vector<float> s;
  for (std::int64_t c = 0; c < (a.w_scale.size() == 1 ? 1 : channels); ++c) s.push_back(a.x.scale * a.w_scale_at(c) / mid);
  return s;
}
inline std::vector<float> scaled_bias(const qops::QAttrs& a, const Tensor& b) {
  std::vector<float> out(static_cast<std::size_t>(b.numel()));
  for (std::int64_t c = 0; c < b.numel(); ++c)
    out[static_cast<std::size_t>(c)] = static_cast<float>(b.at_double(static_cast<std::size_t>(c)) /
                                                          (static_cast<double>(a.x.scale) * a.w_scale_at(c)));
  return out;
}

// The source zero point folded into the bias where no padding reads it: sum((x - zp) * w[c]) =
// sum(x * w[c]) - zp * sum(w[c]), so bias'[c] = B[c] / (x_scale * w_scale[c]) - zp * sum(w[c]) (B = 0
// without a bias). oneDNN 2.6's AMX brgemm convolutions take no source zero point: with one, the
// expansion 1x1 convs of MobileNetV2's inverted residuals (their input is the linear bottleneck,
// asymmetric u8) fell to the older jit AMX kernel at half the speed. The s32 accumulator and the
// compensation are exact in f32 up to 2^24 (K * 255 * 127 for K <= 518 input values per output); past
// that both round at the 6e-8 relative level, far below an output quantization step.
inline std::vector<float> zero_point_folded_bias(const qops::QAttrs& a, const Value* b, const Tensor& w,
                                                 std::int64_t oc) {
  std::vector<float> out(static_cast<std::size_t>(oc));
  const auto* wv = w.data<std::int8_t>();
  std::int64_t per_oc = w.numel() / oc;
  for (std::int64_t c = 0; c < oc; ++c) {
    std::int64_t sum = 0;
    for (std::int64_t k = 0; k < per_oc; ++k) sum += wv[c * per_oc + k];
    double bias = b ? b->constant().at_double(static_cast<std::size_t>(c)) /
                          (static_cast<double>(a.x.scale) * a.w_scale_at(c))
                    : 0.0;
    out[static_cast<std::size_t>(c)] = static_cast<float>(bias - static_cast<double>(a.x.zero_point) * sum);
  }
  return out;
}

inline std::string qdetail(const qops::QAttrs& a) {
  char buf[160];
  std::snprintf(buf, sizeof buf, " x(%g,%d) y(%g,%d)%s", a.x.scale, a.x.zero_point, a.y.scale, a.y.zero_point,
                a.w_scale.size() > 1 ? " w per-channel" : "");
  return buf;
}

}  // namespace quant

// oneDNN 2.6 lists its brgemm 1x1 int8 kernel first, an order tuned on Intel cores. On AMD cores with
// AVX-512 VNNI (Zen 4 and 5) its older jit_int8_1x1 kernel is the faster one: 0.9-1.3x per layer at
// batch 1 and 1.0-1.8x at batch 8 on MobileNetV2's 1x1 layers (their sum 6.12 -> 5.67 ms at batch 8);
// ResNet-50 the same or up to 3% faster. Not with AMX, which only the brgemm kernels use.
inline bool prefer_jit_int8_1x1(const Dims& kernel, const Dims& strides) {
  static const bool amd_vnni = [] {
    IsaInfo isa = effective_isa();
    return cpu_vendor() == "AuthenticAMD" && isa.avx512 && isa.int8_vnni && !isa.amx;
  }();
  for (std::size_t i = 0; i < kernel.size(); ++i)
    if (kernel[i] != 1 || strides[i] != 1) return false;
  return amd_vnni;
}

// A convolution's geometry for oneDNN: the window resolved against the source, the dilations as oneDNN
// counts them (minus 1), the weights' dims with the group split out. Empty when the dims of x, w and y do
// not agree (rank 3 to 5, channels, output size).
struct ConvGeometry {
  std::int64_t group = 1, out_channels = 0;
  Dims kernel, dilates, weight_dims;
  ::ondine::infer::detail_nn::Window win;
  ::ondine::infer::detail_nn::ResolvedWindow r;
};
inline std::optional<ConvGeometry> conv_geometry(const Node& n, const Dims& xd, const Dims& wd, const Dims& yd) {
  namespace geo = ::ondine::infer::detail_nn;
  const std::size_t rank = xd.size();
  if (rank < 3 || rank > 5 || wd.size() != rank || yd.size() != rank) return std::nullopt;
  ConvGeometry c;
  c.group = n.attr_int("group", 1);
  c.out_channels = wd[0];
  if (c.group <= 0 || xd[1] != wd[1] * c.group || c.out_channels % c.group != 0 || yd[1] != c.out_channels)
    return std::nullopt;
  c.kernel.assign(wd.begin() + 2, wd.end());
  c.win = geo::read_window(n, c.kernel);
  c.r = geo::resolve_window(n, c.win, Dims(xd.begin() + 2, xd.end()));
  if (c.r.out != Dims(yd.begin() + 2, yd.end())) return std::nullopt;
  c.dilates = c.win.dilations;
  for (auto& d : c.dilates) d -= 1;
  c.weight_dims = wd;
  if (c.group > 1) {
    c.weight_dims = {c.group, c.out_channels / c.group, wd[1]};
    c.weight_dims.insert(c.weight_dims.end(), c.kernel.begin(), c.kernel.end());
  }
  return c;
}

inline bool lower_qconv(Lowering& L, const Node& n) {
  using namespace quant;
  const Value* x = n.input(0);
  const Value* w = n.input(1);
  const Value* b = n.input(2);
  const Value* s = n.input(3);
  const Value* y = n.output(0);
  qops::QAttrs a = qops::read_attrs(n);
  if (!x || !int8_dtype(x->dtype()) || x->is_constant() || !w || !w->is_constant() || w->dtype() != DType::Int8) return false;
  if (b && (!b->is_constant() || b->dtype() != DType::Float32)) return false;
  if (s && (!int8_dtype(s->dtype()) || a.output_type == DType::Float32 || !a.has_sum)) return false;
  Dims xd = x->shape().sizes(), wd = w->shape().sizes(), yd = y->shape().sizes();
  const std::optional<ConvGeometry> geometry = conv_geometry(n, xd, wd, yd);
  if (!geometry) return false;
  const auto& [group, oc, kernel, dilates, weight_dims, win, r] = *geometry;

  dnnl::post_ops ops;
  std::string post;
  memory::data_type sum_dt = s ? dt_of(s->dtype()) : memory::data_type::undef;
  if (!build_post_ops(a, sum_dt, ops, post)) return false;
  std::vector<float> scales = output_scales(a, oc);
  memory::data_type ydt = dt_of(a.output_type);
  memory::desc src_md = any_md(xd, dt_of(x->dtype())), wei_md = any_md(weight_dims, memory::data_type::s8),
               dst_md = any_md(yd, ydt);
  bool unpadded = std::all_of(r.pad_begin.begin(), r.pad_begin.end(), [](std::int64_t p) { return p <= 0; }) &&
                  std::all_of(r.pad_end.begin(), r.pad_end.end(), [](std::int64_t p) { return p <= 0; });
  bool fold_zero_point = a.x.zero_point != 0 && unpadded;
  bool runtime_zero_point = a.x.zero_point != 0 && !unpadded;
  dnnl::primitive_attr attr = Lowering::base_attr();
  attr.set_output_scales(scales.size() > 1 ? 1 << 1 : 0, scales);
  if (runtime_zero_point) attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  attr.set_post_ops(ops);
  bool with_bias = b || fold_zero_point;
  auto desc = with_bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                                  src_md, wei_md, plain_md({oc}), dst_md, win.strides, dilates,
                                                  r.pad_begin, r.pad_end)
                : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                                  src_md, wei_md, dst_md, win.strides, dilates, r.pad_begin, r.pad_end);
  dnnl::convolution_forward::primitive_desc pd(desc, attr, L.engine(), true);
  if (pd && prefer_jit_int8_1x1(kernel, win.strides)) {
    dnnl::convolution_forward::primitive_desc jit(desc, attr, L.engine(), true);
    auto is_jit = [&] { return std::strstr(jit.impl_info_str(), "jit_int8_1x1") != nullptr; };
    while (!is_jit() && jit.next_impl()) {
    }
    if (is_jit()) pd = jit;
  }
  if (!pd) {
    L.log("ondine.QConv '" + n.name() + "': oneDNN has no int8 convolution for it" + post + "; it runs on its reference kernel");
    return false;
  }

  SlotId src = L.slot_in(x, pd.src_desc());
  std::vector<SlotArg> args{{DNNL_ARG_SRC, src, pd.src_desc()}};
  std::vector<std::pair<int, memory>> consts;
  consts.emplace_back(DNNL_ARG_WEIGHTS, L.constant_memory(w->constant(), pd.weights_desc()));
  if (fold_zero_point)
    consts.emplace_back(DNNL_ARG_BIAS, L.constant_memory(zero_point_folded_bias(a, b, w->constant(), oc), pd.bias_desc()));
  else if (b)
    consts.emplace_back(DNNL_ARG_BIAS, L.constant_memory(scaled_bias(a, b->constant()), pd.bias_desc()));
  if (runtime_zero_point)
    consts.emplace_back(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, zero_point_memory(L, a.x.zero_point));
  SlotId dst;
  bool read_too = false;
  if (s) {  // the Sum is read through DST: in place when nothing reads it afterwards, else a copy
    read_too = true;
    SlotId from = L.slot_in(s, retyped(pd.dst_desc(), sum_dt));
    PostOpChain chain(y);
    chain.sum_operand = s;
    chain.sum_reader = &n;
    if (sum_dt == ydt && L.program.slots[from].kind == SlotKind::Arena && !s->is_graph_output() && is_last_read(L, chain, from)) {
      dst = from;
    } else {
      dst = L.new_value_slot(y, pd.dst_desc());
      L.add_step(std::make_unique<CopyStep>(runtime::StepInfo{"copy:" + s->name(), "Copy", "memcpy", "sum operand"}, from,
                                            dst, pd.dst_desc().get_size()));
    }
  } else {
    dst = L.new_value_slot(y, pd.dst_desc());
  }
  L.define(y, dst, pd.dst_desc());
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc(), read_too});
  std::string detail = "src " + layout_name(pd.src_desc()) + dims_str(xd) + " wei " + layout_name(pd.weights_desc()) +
                       (group > 1 ? " g" + std::to_string(group) : "") + qdetail(a) +
                       (fold_zero_point ? " x_zp in bias" : "") + post + " -> " +
                       qops::type_str(a.output_type) + " " + layout_name(pd.dst_desc());
  L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(), detail}, &n, dnnl::convolution_forward(pd),
                  pd.scratchpad_desc(), std::move(args), std::move(consts));
  return true;
}

inline bool lower_qmatmul(Lowering& L, const Node& n) {
  using namespace quant;
  const Value* x = n.input(0);
  const Value* w = n.input(1);
  const Value* b = n.input(2);
  const Value* y = n.output(0);
  qops::QAttrs a = qops::read_attrs(n);
  if (!x || !int8_dtype(x->dtype()) || x->is_constant() || !w || !w->is_constant() || w->dtype() != DType::Int8) return false;
  if (b && (!b->is_constant() || b->dtype() != DType::Float32)) return false;
  Dims xd = x->shape().sizes(), wd = w->shape().sizes();
  if (xd.size() < 2 || wd.size() != 2 || xd.back() != wd[0]) return false;
  std::int64_t k = wd[0], nn = wd[1], m = 1;
  for (std::size_t i = 0; i + 1 < xd.size(); ++i) m *= xd[i];
  dnnl::post_ops ops;
  std::string post;
  if (!build_post_ops(a, memory::data_type::undef, ops, post)) return false;
  std::vector<float> scales = output_scales(a, nn);
  memory::data_type ydt = dt_of(a.output_type);
  memory::desc src_md = plain_md({m, k}, dt_of(x->dtype())), wei_md = any_md({k, nn}, memory::data_type::s8),
               dst_md = plain_md({m, nn}, ydt);
  dnnl::primitive_attr attr = Lowering::base_attr();
  attr.set_output_scales(scales.size() > 1 ? 1 << 1 : 0, scales);
  if (a.x.zero_point != 0) attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  attr.set_post_ops(ops);
  auto desc = b ? dnnl::matmul::desc(src_md, wei_md, plain_md({1, nn}), dst_md) : dnnl::matmul::desc(src_md, wei_md, dst_md);
  dnnl::matmul::primitive_desc pd(desc, attr, L.engine(), true);
  if (!pd) {
    L.log("ondine.QMatMul '" + n.name() + "': oneDNN has no int8 matmul for it; it runs on its reference kernel");
    return false;
  }
  std::vector<SlotArg> args{{DNNL_ARG_SRC, L.row_major_slot(x), pd.src_desc()}};
  std::vector<std::pair<int, memory>> consts;
  consts.emplace_back(DNNL_ARG_WEIGHTS, L.constant_memory(w->constant(), pd.weights_desc()));
  if (b) consts.emplace_back(DNNL_ARG_BIAS, L.constant_memory(scaled_bias(a, b->constant()), pd.bias_desc()));
  if (a.x.zero_point != 0) consts.emplace_back(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, zero_point_memory(L, a.x.zero_point));
  memory::desc value_md = plain_md(y->shape().sizes(), ydt);
  SlotId dst = L.new_value_slot(y, value_md);
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc()});
  L.define(y, dst, value_md);
  L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(),
                   "src " + dims_str({m, k}) + " x wei " + layout_name(pd.weights_desc()) + dims_str(wd) + qdetail(a) +
                       (b ? " +bias" : "") + post + " -> " + qops::type_str(a.output_type)},
                  &n, dnnl::matmul(pd), pd.scratchpad_desc(), std::move(args), std::move(consts));
  return true;
}

// QPool: oneDNN pooling on the integers, then linear(x_scale / y_scale, y_zp - x_zp * x_scale / y_scale)
// (exact for max and average: both commute with an affine map of positive slope).
inline bool lower_qpool(Lowering& L, const Node& n) {
  using namespace quant;
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  qops::QAttrs a = qops::read_attrs(n);
  if (!x || !int8_dtype(x->dtype()) || x->is_constant() || a.output_type == DType::Float32 || !a.activations.empty())
    return false;
  std::string op = n.attr_string("pool_op");
  Dims xd = x->shape().sizes(), yd = y->shape().sizes();
  auto w = pool_window(n, op, xd, yd);
  if (!w) return false;
  const auto& [kernel, strides, dilates, pad_l, pad_r, alg] = *w;
  float ratio = a.x.scale / a.y.scale;
  bool identity = ratio == 1.0f && a.x.zero_point == a.y.zero_point;
  dnnl::primitive_attr attr = Lowering::base_attr();
  if (!identity) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_linear, ratio,
                       static_cast<float>(a.y.zero_point) - static_cast<float>(a.x.zero_point) * ratio);
    attr.set_post_ops(ops);
  }
  // oneDNN's optimised int8 pooling is channels-last only.
  using tag = memory::format_tag;
  tag cl = xd.size() == 3 ? tag::nwc : xd.size() == 4 ? tag::nhwc : tag::ndhwc;
  memory::desc src_md(xd, dt_of(x->dtype()), cl);
  dnnl::pooling_v2_forward::desc desc(dnnl::prop_kind::forward_inference, alg, src_md, memory::desc(yd, dt_of(a.output_type), cl),
                                      strides, kernel, dilates, pad_l, pad_r);
  dnnl::pooling_v2_forward::primitive_desc pd(desc, attr, L.engine(), true);
  if (!pd || (is_reference_impl(pd) && !identity)) {
    L.log("ondine.QPool '" + n.name() + "': no optimised oneDNN int8 pooling for it; it runs on its reference kernel");
    return false;
  }
  SlotId src = L.slot_in(x, pd.src_desc());
  SlotId dst = L.new_value_slot(y, pd.dst_desc());
  L.define(y, dst, pd.dst_desc());
  L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(),
                   op + " " + std::string(alg_name(alg)) + " k" + dims_str(kernel) + qdetail(a) + " " + layout_name(pd.src_desc()) +
                       dims_str(xd) + " -> " + layout_name(pd.dst_desc())},
                  &n, dnnl::pooling_v2_forward(pd), pd.scratchpad_desc(),
                  {{DNNL_ARG_SRC, src, pd.src_desc()}, {DNNL_ARG_DST, dst, pd.dst_desc()}}, {});
  return true;
}

// True when every reader of `v` (rank 3 to 5) is an int8 convolution or pool, which run channels-last.
inline bool int8_consumers_want_channels_last(const Value* v) {
  const auto rank = v->shape().rank();
  if (rank < 3 || rank > 5 || v->is_graph_output() || !v->has_uses()) return false;
  for (const Use& u : v->uses())
    if (u.index != 0 || (u.node->op_key() != "ondine.QConv" && u.node->op_key() != "ondine.QPool")) return false;
  return true;
}

// Leftover QuantizeLinear / DequantizeLinear with per-tensor constant parameters: one reorder with an
// output scale and a zero point, in the source's layout. (Q multiplies by 1/scale where ONNX divides:
// within one step.)
inline bool lower_qdq_reorder(Lowering& L, const Node& n) {
  using namespace quant;
  bool quantize = n.op_type() == "QuantizeLinear";
  const Value* x = n.input(0);
  const Value* s = n.input(1);
  const Value* z = n.input(2);
  const Value* y = n.output(0);
  if (!x || x->is_constant() || !s || !s->is_constant() || s->constant().numel() != 1 || s->dtype() != DType::Float32)
    return false;
  if (z && (!z->is_constant() || z->constant().numel() != 1)) return false;
  if (quantize ? (x->dtype() != DType::Float32 || !int8_dtype(y->dtype())) : (!int8_dtype(x->dtype()) || y->dtype() != DType::Float32))
    return false;
  float scale = static_cast<float>(s->constant().at_double(0));
  auto zp = static_cast<std::int32_t>(z ? z->constant().at_double(0) : 0.0);
  if (!(scale > 0)) return false;
  memory::desc src_md = L.md_of(x);
  memory::desc dst_md = retyped(src_md, dt_of(y->dtype()));
  // A model's input quantized for int8 convolutions or pools: write it channels-last at once, the
  // layout their int8 kernels read, instead of quantizing and then reordering the int8 copy (two
  // passes over the input; 7% of MobileNetV2's int8 time at batch 8).
  if (quantize && int8_consumers_want_channels_last(y)) {
    using tag = memory::format_tag;
    const auto rank = y->shape().rank();
    dst_md = memory::desc(src_md.dims(), dt_of(y->dtype()), rank == 3 ? tag::nwc : rank == 4 ? tag::nhwc : tag::ndhwc);
    // A 3-channel image: Ondine's own kernel (quantize_image.hpp), 4x the reorder's speed.
    const memory::dims& d = src_md.dims();
    if (rank == 4 && d[1] == 3 && is_row_major(src_md) && effective_isa().avx512) {
      ImageQuantization q;
      q.inv_scale = 1.0f / scale;
      q.zero_point = zp;
      if (y->dtype() == DType::Int8) q.lo = -128, q.hi = 127;
      SlotId src = L.slot_in(x, src_md);
      SlotId dst = L.new_value_slot(y, dst_md);
      L.define(y, dst, dst_md);
      char buf[96];
      std::snprintf(buf, sizeof buf, "scale %g zp %d ", scale, zp);
      L.add_step(std::make_unique<QuantizeImageStep>(
          runtime::StepInfo{n.name(), n.op_type(), "ondine_image:avx512", buf + layout_name(src_md) + " -> " +
                                                                              qops::type_str(y->dtype()) + " " + layout_name(dst_md)},
          src, dst, d[0], d[2], d[3], q));
      return true;
    }
  }
  dnnl::primitive_attr attr = Lowering::base_attr();
  attr.set_output_scales(0, {quantize ? 1.0f / scale : scale});
  int zp_arg = quantize ? DNNL_ARG_DST : DNNL_ARG_SRC;
  if (zp != 0) attr.set_zero_points(zp_arg, 0, {DNNL_RUNTIME_S32_VAL});
  dnnl::reorder::primitive_desc pd(L.engine(), src_md, L.engine(), dst_md, attr, true);
  if (!pd) return false;
  SlotId src = L.slot_in(x, src_md);
  SlotId dst = L.new_value_slot(y, dst_md);
  L.define(y, dst, dst_md);
  std::vector<std::pair<int, memory>> consts;
  if (zp != 0) consts.emplace_back(DNNL_ARG_ATTR_ZERO_POINTS | zp_arg, zero_point_memory(L, zp));
  char buf[96];
  std::snprintf(buf, sizeof buf, "scale %g zp %d ", scale, zp);
  L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(), buf + layout_name(src_md) + " -> " + qops::type_str(y->dtype()) +
                      (same_layout(src_md, dst_md) ? "" : " " + layout_name(dst_md))},
                  &n, dnnl::reorder(pd), pd.scratchpad_desc(),
                  {{DNNL_ARG_SRC, src, src_md}, {DNNL_ARG_DST, dst, dst_md}}, std::move(consts));
  return true;
}

// How a step of a quantized model counts: int8 compute, a float<->int8 conversion, a data move
// (any type), or float compute. Dynamic quantization's DynQMatMul (int8 products, float result) is int8
// compute and its DynamicQuantizeLinear a conversion.
enum class StepKind { Int8, Conversion, Move, Float };

inline StepKind step_kind(const std::string& op) {
  static const std::set<std::string> moves{"Reorder", "Copy", "View", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
                                           "Identity", "Transpose", "Concat", "Dropout"};
  if (op == "QConv" || op == "QMatMul" || op == "QPool" || op == "DynQMatMul" || op == "DynQConv" || op == "QLSTM")
    return StepKind::Int8;
  if (op == "QuantizeLinear" || op == "DequantizeLinear" || op == "DynamicQuantizeLinear") return StepKind::Conversion;
  return moves.count(op) ? StepKind::Move : StepKind::Float;
}

// A conversion step as the reports name it: "Q 'name'", "DQ 'name'" or "DynQ 'name'".
inline std::string conversion_name(const std::string& op, const std::string& name) {
  const char* tag = op == "DequantizeLinear" ? "DQ" : op == "DynamicQuantizeLinear" ? "DynQ" : "Q";
  return std::string(tag) + " '" + name + "'";
}

// A summary of how much of a quantized model runs in int8: the int8 steps, the QuantizeLinear /
// DequantizeLinear left (each is a float<->int8 conversion at an fp32 island's edge), and the float
// compute steps. "" when the model has no quantized step.
inline std::string int8_report(const std::vector<runtime::StepInfo>& steps) {
  std::size_t int8 = 0;
  std::vector<std::string> qdq, fp32;
  for (const auto& s : steps) {
    StepKind kind = step_kind(s.op);
    if (kind == StepKind::Int8) ++int8;
    else if (kind == StepKind::Conversion) qdq.push_back(conversion_name(s.op, s.name));
    else if (kind == StepKind::Float) fp32.push_back(s.op + " '" + s.name + "'");
  }
  if (int8 == 0 && qdq.empty()) return "";
  auto list = [](const std::vector<std::string>& v) {
    std::string out;
    for (std::size_t i = 0; i < v.size() && i < 12; ++i) out += (i ? ", " : "") + v[i];
    if (v.size() > 12) out += ", ... (" + std::to_string(v.size() - 12) + " more)";
    return out;
  };
  std::string r = "int8: " + std::to_string(int8) + " int8 steps; " + std::to_string(qdq.size()) +
                  " Q/DQ left unfused" + (qdq.empty() ? "" : ": " + list(qdq)) + "; " + std::to_string(fp32.size()) +
                  " float steps" + (fp32.empty() ? "" : ": " + list(fp32));
  return r;
}

}  // namespace ondine::lower::detail
