// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/deconv.hpp - ConvTranspose (1-D to 3-D, groups, strides, pads incl. auto_pad,
// dilations, output_padding / output_shape, bias) as a oneDNN deconvolution.
//
// Geometry: the pads come from the shared ConvTranspose geometry (ir/infer/nn.hpp), which places input
// position i at output position i * stride - pad_begin + k * dilation, like oneDNN. ONNX's output is
// stride * (in - 1) + output_padding + extent - pad_begin - pad_end long and oneDNN's is
// stride * (in - 1) + extent - padding_l - padding_r, so padding_r = pad_end - output_padding. A
// negative pad on either side (output_shape or output_padding asking for an output longer than the
// full result) is left to the reference kernel: oneDNN does not document negative padding (2.6 did
// compute a padding_r of -1 right in a trial, with both its gemm and jit deconvolutions).
//
// Weights: ONNX stores [C_in, C_out/group, k...]; oneDNN wants [C_out, C_in, k...] or, grouped,
// [G, C_out/G, C_in/G, k...]. Constant weights are permuted once and reordered into the layout the
// primitive prefers (format_tag::any); runtime weights are described with strides over their ONNX
// bytes and reordered per run. Activations and a residual Add fold in as post-ops, as for Conv.
#pragma once

#include <string>
#include <vector>

#include "ondine/ir/infer/nn.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"

namespace ondine::lower::detail {

// The oneDNN weight dims of a ConvTranspose with ONNX weight dims `wd` ([C_in, C_out/G, k...]).
inline Dims deconv_weight_dims(const Dims& wd, std::int64_t group) {
  std::int64_t in_per_group = wd[0] / group, out_per_group = wd[1];
  Dims d = group > 1 ? Dims{group, out_per_group, in_per_group} : Dims{out_per_group, in_per_group};
  d.insert(d.end(), wd.begin() + 2, wd.end());
  return d;
}

// The ONNX weight bytes seen with the oneDNN dims order (a strided, non-dense-order descriptor).
inline memory::desc onnx_deconv_weight_md(const Dims& wd, std::int64_t group) {
  std::int64_t in_per_group = wd[0] / group, out_per_group = wd[1], taps = 1;
  for (std::size_t i = 2; i < wd.size(); ++i) taps *= wd[i];
  Dims kernel_strides = row_major_strides(Dims(wd.begin() + 2, wd.end()));
  // ONNX element (g * C_in/G + c, m, k) sits at ((g * C_in/G + c) * C_out/G + m) * taps + k.
  Dims strides = group > 1 ? Dims{in_per_group * out_per_group * taps, taps, out_per_group * taps}
                           : Dims{taps, out_per_group * taps};
  strides.insert(strides.end(), kernel_strides.begin(), kernel_strides.end());
  return memory::desc(deconv_weight_dims(wd, group), memory::data_type::f32, strides);
}

// The constant ONNX weights permuted into the row-major form of deconv_weight_dims.
inline Tensor permute_deconv_weights(const Tensor& w, std::int64_t group) {
  const Dims& wd = w.dims();
  std::int64_t in_per_group = wd[0] / group, out_per_group = wd[1], taps = 1;
  for (std::size_t i = 2; i < wd.size(); ++i) taps *= wd[i];
  Tensor out(DType::Float32, deconv_weight_dims(wd, group));
  const float* src = w.data<float>();
  float* dst = out.data<float>();
  for (std::int64_t g = 0; g < group; ++g)
    for (std::int64_t m = 0; m < out_per_group; ++m)
      for (std::int64_t c = 0; c < in_per_group; ++c) {
        const float* from = src + ((g * in_per_group + c) * out_per_group + m) * taps;
        float* to = dst + ((g * out_per_group + m) * in_per_group + c) * taps;
        std::copy(from, from + taps, to);
      }
  return out;
}

inline bool lower_deconv(Lowering& L, const Node& n) {
  namespace geo = ::ondine::infer::detail_nn;
  const Value* x = n.input(0);
  const Value* w = n.input(1);
  const Value* b = n.input(2);
  const Value* y = n.output(0);
  if (!is_f32(x) || !is_f32(w) || !is_f32(y) || x->is_constant()) return false;
  if (b && !is_f32(b)) return false;
  bool const_w = w->is_constant(), const_b = !b || b->is_constant();
  Dims xd = x->shape().sizes(), wd = w->shape().sizes(), yd = y->shape().sizes();
  std::size_t rank = xd.size();
  if (rank < 3 || rank > 5 || wd.size() != rank || yd.size() != rank) return false;
  std::int64_t group = n.attr_int("group", 1);
  std::int64_t channels = xd[1], out_channels = wd[1] * group;
  // Inconsistent shapes: let the reference kernel report them.
  if (group <= 0 || wd[0] != channels || channels % group != 0 || yd[0] != xd[0] || yd[1] != out_channels) return false;
  if (b && b->shape().sizes() != Dims{out_channels}) return false;

  Dims kernel(wd.begin() + 2, wd.end()), spatial(xd.begin() + 2, xd.end());
  if (n.has_attr("kernel_shape") && n.attr_ints("kernel_shape") != kernel) return false;
  geo::TransposeWindow t = geo::read_transpose_window(n, kernel);
  std::size_t s = spatial.size();
  Dims out(s), pad_l(s), pad_r(s);
  for (std::size_t i = 0; i < s; ++i) {
    std::int64_t pad_end = 0;
    out[i] = geo::transpose_output_size(t, i, spatial[i], pad_l[i], pad_end);
    pad_r[i] = pad_end - t.output_padding[i];
    if (pad_l[i] < 0 || pad_r[i] < 0) return false;
  }
  if (out != Dims(yd.begin() + 2, yd.end())) return false;
  Dims strides = t.window.strides, dilates = t.window.dilations;
  for (auto& d : dilates) d -= 1;  // oneDNN counts the holes between taps
  Dims weight_dims = deconv_weight_dims(wd, group);

  memory::desc src_md = activation_md(x, xd), dst_md = activation_md(y, yd), weights_md = any_md(weight_dims);
  PostOpChain chain = plan_post_ops(L, n, true);
  bool fused = false;
  auto pd = choose_fusion<dnnl::deconvolution_forward::primitive_desc>(
      [&](bool with_chain) {
        dnnl::primitive_attr attr = Lowering::base_attr();
        if (with_chain) attr.set_post_ops(chain.ops());
        auto desc = b ? dnnl::deconvolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                          dnnl::algorithm::deconvolution_direct, src_md, weights_md,
                                                          plain_md({out_channels}), dst_md, strides, dilates, pad_l,
                                                          pad_r)
                      : dnnl::deconvolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                          dnnl::algorithm::deconvolution_direct, src_md, weights_md,
                                                          dst_md, strides, dilates, pad_l, pad_r);
        return dnnl::deconvolution_forward::primitive_desc(desc, attr, L.engine(), true);
      },
      !chain.nodes.empty(), fused);
  if (!pd) return false;
  if (!fused) chain = PostOpChain{y};

  SlotId src = L.slot_in(x, pd.src_desc());
  std::vector<SlotArg> args{{DNNL_ARG_SRC, src, pd.src_desc()}};
  std::vector<std::pair<int, memory>> consts;
  if (const_w) {
    consts.emplace_back(DNNL_ARG_WEIGHTS, L.constant_memory(permute_deconv_weights(w->constant(), group), pd.weights_desc()));
  } else {
    // Runtime weights: reordered from their ONNX bytes into the primitive's layout on every run.
    memory::desc want = pd.weights_desc();
    SlotId reordered = L.add_slot(runtime::Slot{w->name() + ".deconv", DType::Float32, weight_dims, want.get_size(),
                                                layout_name(want), SlotKind::Arena, 0});
    L.add_reorder(w->name(), L.row_major_slot(w), onnx_deconv_weight_md(wd, group), reordered, want);
    args.push_back({DNNL_ARG_WEIGHTS, reordered, want});
  }
  if (b && const_b)
    consts.emplace_back(DNNL_ARG_BIAS, L.constant_memory(b->constant(), pd.bias_desc()));
  else if (b)
    args.push_back({DNNL_ARG_BIAS, L.row_major_slot(b), pd.bias_desc()});
  bool read_too = false;
  SlotId dst = post_op_dst(L, chain, pd.dst_desc(), read_too);
  commit_post_ops(L, chain, dst, pd.dst_desc());
  std::string detail = "src " + layout_name(pd.src_desc()) + dims_str(xd) + " wei " + layout_name(pd.weights_desc()) +
                       dims_str(weight_dims) + (const_w ? "" : " (runtime)") +
                       (group > 1 ? " g" + std::to_string(group) : "") + " s" + dims_str(strides) + " pad" +
                       dims_str(pad_l) + dims_str(pad_r) + chain.detail() + " -> dst " + layout_name(pd.dst_desc()) +
                       dims_str(yd);
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc(), read_too});
  L.add_primitive({n.name(), "ConvTranspose", pd.impl_info_str(), detail}, &n, dnnl::deconvolution_forward(pd),
                  pd.scratchpad_desc(), std::move(args), std::move(consts));
  return true;
}

}  // namespace ondine::lower::detail
