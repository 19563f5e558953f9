// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/resample.hpp - Resize (nearest and linear, spatial axes only) as oneDNN
// resampling, created on the producer's layout.
//
// oneDNN's resampling maps output position o of an axis resized from `in` to `out` to the source
// coordinate s = (o + 0.5) * in / out - 0.5 (in float; ONNX's half_pixel with scale out / in), then
// takes roundf(s) (nearest: ties away from zero) or the two neighbours floor(s), ceil(s) clamped to
// the axis (linear). ONNX has many coordinate modes and nearest roundings, and its scale need not
// be out / in. Rather than enumerate the combinations that coincide, the lowering computes, per axis,
// the taps oneDNN will use and the taps the reference kernel uses (reference::detail::nn::resize_taps)
// and lowers only when they agree: same indices for nearest, same indices and weights (to 1e-6) for
// linear. So half_pixel with scales out / in is taken, and so is e.g. asymmetric / floor nearest
// upsampling by whole factors; a nearest tie ONNX breaks downward, a scale other than out / in, a roi
// crop, cubic mode or extrapolation fall back. The N and C axes must be left unchanged.
#pragma once

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "ondine/ir/infer/nn.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"
#include "ondine/reference/nn.hpp"

namespace ondine::lower::detail {

// oneDNN's source coordinate (cpu/resampling_utils.hpp), with its float arithmetic.
inline float dnnl_resampling_coord(std::int64_t o, std::int64_t out, std::int64_t in) {
  return (static_cast<float>(o) + 0.5f) * static_cast<float>(in) / static_cast<float>(out) - 0.5f;
}

// index -> weight per output position: what oneDNN reads along one axis.
using AxisTaps = std::vector<std::map<std::int64_t, double>>;

inline AxisTaps dnnl_resampling_taps(bool nearest, std::int64_t in, std::int64_t out) {
  AxisTaps taps(static_cast<std::size_t>(out));
  for (std::int64_t o = 0; o < out; ++o) {
    auto& t = taps[static_cast<std::size_t>(o)];
    float s = dnnl_resampling_coord(o, out, in);
    if (nearest) {
      t[static_cast<std::int64_t>(std::roundf(s))] = 1.0;
      continue;
    }
    std::int64_t left = std::max<std::int64_t>(static_cast<std::int64_t>(s), 0);
    std::int64_t ceil = s < 0 ? 0 : (static_cast<float>(static_cast<std::int64_t>(s)) == s ? static_cast<std::int64_t>(s)
                                                                                          : static_cast<std::int64_t>(s) + 1);
    std::int64_t right = std::min(ceil, in - 1);
    float w1 = std::fabs(s - static_cast<float>(left));
    t[left] += 1.0 - w1;
    t[right] += w1;
  }
  return taps;
}

inline AxisTaps reference_resize_taps(const std::vector<std::vector<reference::detail::nn::Tap>>& taps) {
  AxisTaps out(taps.size());
  for (std::size_t o = 0; o < taps.size(); ++o)
    for (auto& tap : taps[o]) out[o][tap.index] += tap.weight;
  return out;
}

inline bool same_taps(const AxisTaps& a, const AxisTaps& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t o = 0; o < a.size(); ++o) {
    auto nonzero = [](const std::map<std::int64_t, double>& m) {
      std::map<std::int64_t, double> out;
      for (auto& [i, w] : m)
        if (std::abs(w) > 1e-6) out[i] = w;
      return out;
    };
    auto x = nonzero(a[o]), y = nonzero(b[o]);
    if (x.empty() || x.size() != y.size()) return false;  // empty: an extrapolated position
    for (auto ix = x.begin(), iy = y.begin(); ix != x.end(); ++ix, ++iy)
      if (ix->first != iy->first || std::abs(ix->second - iy->second) > 1e-6) return false;
  }
  return true;
}

inline bool lower_resize(Lowering& L, const Node& n) {
  namespace geo = ::ondine::infer::detail_nn;
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!is_f32(x) || !is_f32(y) || x->is_constant()) return false;
  Dims xd = x->shape().sizes(), yd = y->shape().sizes();
  std::size_t rank = xd.size();
  if (rank < 3 || rank > 5 || yd.size() != rank) return false;
  for (auto d : xd)
    if (d <= 0) return false;
  geo::ResizeSpec spec = geo::read_resize_spec(n, static_cast<std::int64_t>(rank));
  if (spec.mode != "nearest" && spec.mode != "linear") return false;
  if (spec.coordinate_mode == "tf_crop_and_resize") return false;
  // The target from constant scales or sizes (shape inference needed them constant too).
  auto constant_or_null = [&](std::size_t i, bool& ok) -> const Tensor* {
    const Value* v = i < n.num_inputs() ? n.input(i) : nullptr;
    if (!v) return nullptr;
    if (!v->is_constant()) ok = false;
    return v->is_constant() ? &v->constant() : nullptr;
  };
  bool constant_target = true;
  const Tensor* scales = constant_or_null(geo::resize_scales_index(n), constant_target);
  const Tensor* sizes = constant_or_null(geo::resize_sizes_index(n), constant_target);
  if (!constant_target) return false;
  geo::ResizeTarget target = geo::resize_target(n, spec, xd, scales, sizes);
  if (target.out != yd || yd[0] != xd[0] || yd[1] != xd[1]) return false;
  bool nearest = spec.mode == "nearest";
  for (std::size_t a = 0; a < rank; ++a) {
    auto ref = reference_resize_taps(reference::detail::nn::resize_taps(spec, xd[a], yd[a], target.scales[a], 0.0, 1.0));
    // N and C: oneDNN leaves them alone, so ONNX must too (every position reads itself).
    AxisTaps want = a < 2 ? dnnl_resampling_taps(true, xd[a], xd[a]) : dnnl_resampling_taps(nearest, xd[a], yd[a]);
    if (!same_taps(ref, want)) return false;
  }

  dnnl::algorithm alg = nearest ? dnnl::algorithm::resampling_nearest : dnnl::algorithm::resampling_linear;
  memory::desc src_md = L.md_of(x);
  dnnl::resampling_forward::desc desc(dnnl::prop_kind::forward_inference, alg, src_md, any_md(yd));
  PostOpChain chain = plan_post_ops(L, n, false);
  bool fused = false;
  auto pd = choose_fusion<dnnl::resampling_forward::primitive_desc>(
      [&](bool with_chain) {
        dnnl::primitive_attr attr = Lowering::base_attr();
        if (with_chain) attr.set_post_ops(chain.ops());
        return dnnl::resampling_forward::primitive_desc(desc, attr, L.engine(), true);
      },
      !chain.nodes.empty(), fused);
  if (!pd) return false;
  if (!fused) chain = PostOpChain{y};
  SlotId src = L.slot_in(x, pd.src_desc());
  SlotId dst = L.new_value_slot(chain.result, pd.dst_desc());
  commit_post_ops(L, chain, dst, pd.dst_desc());
  std::string detail = std::string(alg_name(alg)) + chain.detail() + " " + layout_name(pd.src_desc()) + dims_str(xd) +
                       " -> " + layout_name(pd.dst_desc()) + dims_str(yd);
  L.add_primitive({n.name(), "Resize", pd.impl_info_str(), detail}, &n, dnnl::resampling_forward(pd),
                  pd.scratchpad_desc(), {{DNNL_ARG_SRC, src, pd.src_desc()}, {DNNL_ARG_DST, dst, pd.dst_desc()}}, {});
  return true;
}

}  // namespace ondine::lower::detail
