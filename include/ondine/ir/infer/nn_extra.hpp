// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/nn_extra.hpp - shape and type inference for default-domain ops added after the first
// opset-18 support: Mish, BitwiseAnd/Or/Xor/Not, CenterCropPad, GroupNormalization (opsets 18 and 21),
// LpNormalization, LpPool, GlobalLpPool, MaxRoiPool and AffineGrid (opset 20).
//
// The rules that the reference kernels (reference/nn_extra.hpp) share are read here once:
// GroupNormalization's scale/bias length (num_groups at opset 18, channels from opset 21: opset 21
// changed the meaning, not only the shape), LpPool's order p (a float attribute at opset 1, an int
// after), and the sizes CenterCropPad and AffineGrid take from input values (static only when those
// values are known).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/ir/infer/common.hpp"
#include "ondine/ir/infer/math.hpp"
#include "ondine/ir/infer/nn.hpp"

namespace ondine::infer {
namespace detail_nn_extra {

using detail_nn::require_dtype;
using detail_nn::require_floating;
using detail_nn::require_min_rank;

inline bool is_int_type(DType t) { return is_integer(t); }

// LpPool / GlobalLpPool / LpNormalization's p: an int attribute, or a float one at LpPool-1.
inline double lp_order(const Node& n) {
  auto it = n.attrs().find("p");
  double p = 2;
  if (it != n.attrs().end()) {
    if (auto* i = std::get_if<std::int64_t>(&it->second)) p = static_cast<double>(*i);
    else if (auto* f = std::get_if<float>(&it->second)) p = *f;
    else throw n.error("attribute 'p' must be a number");
  }
  if (!(p > 0)) throw n.error("p must be positive, got " + std::to_string(p));
  return p;
}

// GroupNormalization: num_groups must divide the channels; scale and bias have one value per group at
// opset 18 and one per channel from opset 21 (and in ondine.GroupNorm, ir/fused_ops.hpp).
struct GroupNormSpec {
  std::int64_t groups = 1;
  bool per_channel = true;
};
inline GroupNormSpec group_norm_spec(const Node& n) {
  GroupNormSpec s;
  if (!n.has_attr("num_groups")) throw n.error("missing required attribute 'num_groups'");
  s.groups = n.attr_int("num_groups");
  if (s.groups <= 0) throw n.error("num_groups must be positive, got " + std::to_string(s.groups));
  s.per_channel = n.domain() == fused::kDomain || n.opset() == 0 || n.opset() >= 21;
  if (std::int64_t st = n.attr_int("stash_type", 1); st != 1)
    throw n.error("stash_type " + std::to_string(st) + " is not supported (only 1, float32 statistics; Ondine computes "
                  "them in double)");
  return s;
}

inline void infer_mish(Node& n) {
  Value& x = required_input(n, 0);
  require_floating(n, x);
  set_output(n, 0, x.dtype(), x.shape());
}

inline void infer_bitwise(Node& n) {
  Value& a = required_input(n, 0);
  require_dtype(n, a, a.dtype() == DType::Undefined || is_int_type(a.dtype()), "expected an integer type");
  if (n.op_type() == "BitwiseNot") return set_output(n, 0, a.dtype(), a.shape());
  Value& b = required_input(n, 1);
  detail_nn::require_same_dtype(n, a, b);
  set_output(n, 0, a.dtype(), broadcast(n, a.shape(), b.shape()));
}

// CenterCropPad's axes (attribute, default all) for rank `rank`, normalised.
inline std::vector<std::int64_t> crop_pad_axes(const Node& n, std::int64_t rank) {
  std::vector<std::int64_t> axes;
  if (n.has_attr("axes")) {
    for (auto a : n.attr_ints("axes")) axes.push_back(normalize_axis(n, a, rank));
  } else {
    for (std::int64_t i = 0; i < rank; ++i) axes.push_back(i);
  }
  return axes;
}

inline void infer_center_crop_pad(Node& n) {
  Value& x = required_input(n, 0);
  Value& shape = required_input(n, 1);
  require_dtype(n, shape, shape.dtype() == DType::Int64 || shape.dtype() == DType::Int32, "expected int32 or int64");
  if (!x.shape().rank_known()) return set_output(n, 0, x.dtype(), Shape::unknown());
  const auto rank = static_cast<std::int64_t>(x.shape().rank());
  const std::vector<std::int64_t> axes = crop_pad_axes(n, rank);
  std::vector<Dim> out(x.shape().dims().begin(), x.shape().dims().end());
  auto values = input_values(n, 1);
  if (values && values->size() != axes.size())
    throw n.error("shape has " + std::to_string(values->size()) + " values for " + std::to_string(axes.size()) + " axes");
  for (std::size_t i = 0; i < axes.size(); ++i) {
    auto a = static_cast<std::size_t>(axes[i]);
    if (values && (*values)[i].is_number()) {
      if (*(*values)[i].number < 0) throw n.error("shape values must not be negative");
      out[a] = Dim(*(*values)[i].number);
    } else {
      out[a] = Dim();
    }
  }
  set_output(n, 0, x.dtype(), Shape(std::move(out)));
}

inline void infer_group_norm(Node& n) {
  Value& x = required_input(n, 0);
  require_floating(n, x);
  const GroupNormSpec s = group_norm_spec(n);
  if (!x.shape().rank_known()) return set_output(n, 0, x.dtype(), x.shape());
  require_min_rank(n, x, 2);
  const Dim& c = x.shape()[1];
  if (c.is_static() && c.value % s.groups != 0)
    throw n.error("num_groups " + std::to_string(s.groups) + " does not divide the " + std::to_string(c.value) +
                  " channels");
  const Dim count = s.per_channel ? c : Dim(s.groups);
  for (std::size_t i : {1, 2}) detail_nn::check_vector(n, n.input(i), count, i == 1 ? "scale" : "bias");
  set_output(n, 0, x.dtype(), x.shape());
}

// ondine.ChannelLayerNorm: X [N, C, ...] float, scale [C], bias [C] or absent; Y like X.
inline void infer_channel_layer_norm(Node& n) {
  Value& x = required_input(n, 0);
  require_floating(n, x);
  required_input(n, 1);
  if (!x.shape().rank_known()) return set_output(n, 0, x.dtype(), x.shape());
  require_min_rank(n, x, 2);
  for (std::size_t i : {1, 2}) detail_nn::check_vector(n, n.input(i), x.shape()[1], i == 1 ? "scale" : "bias");
  set_output(n, 0, x.dtype(), x.shape());
}

// ondine.RMSNorm: Y has X's type and shape; scale the normalised shape X.shape[axis:].
inline void infer_rms_norm(Node& n) {
  Value& x = required_input(n, 0);
  require_floating(n, x);
  Value& scale = required_input(n, 1);
  if (scale.dtype() != x.dtype()) throw n.error("scale must have X's element type");
  if (!x.shape().rank_known()) return set_output(n, 0, x.dtype(), x.shape());
  const auto rank = static_cast<std::int64_t>(x.shape().rank());
  const std::int64_t axis = normalize_axis(n, n.attr_int("axis", -1), rank);
  if (scale.shape().rank_known()) {
    if (static_cast<std::int64_t>(scale.shape().rank()) != rank - axis)
      throw n.error("scale " + scale.shape().str() + " is not the normalised shape of X " + x.shape().str());
    for (std::int64_t i = axis; i < rank; ++i)
      detail_nn::unify(n, scale.shape()[static_cast<std::size_t>(i - axis)], x.shape()[static_cast<std::size_t>(i)],
                       "scale " + scale.shape().str() + " is not the normalised shape of X " + x.shape().str());
  }
  set_output(n, 0, x.dtype(), x.shape());
}

// ondine.Rotary: Y has X's type and shape; cos and sin one shape, last dim X's, broadcasting to X.
inline void infer_rotary(Node& n) {
  Value& x = required_input(n, 0);
  require_floating(n, x);
  Value& c = required_input(n, 1);
  Value& s = required_input(n, 2);
  if (c.dtype() != x.dtype() || s.dtype() != x.dtype()) throw n.error("cos and sin must have X's element type");
  if (x.shape().rank_known() && c.shape().rank_known() && s.shape().rank_known()) {
    const Shape &xs = x.shape(), &cs = c.shape();
    if (xs.rank() == 0 || cs.rank() == 0 || cs.rank() > xs.rank() || cs.rank() != s.shape().rank())
      throw n.error("X " + xs.str() + ", cos " + cs.str() + " and sin " + s.shape().str() + " do not make a rotary embedding");
    const Dim& d = xs[xs.rank() - 1];
    if (d.is_static() && d.value % 2 != 0) throw n.error("X's last dim " + d.str() + " is odd");
    for (std::size_t i = 0; i < cs.rank(); ++i) {
      const std::string what = "cos " + cs.str() + " and sin " + s.shape().str() + " do not broadcast to X " + xs.str();
      detail_nn::unify(n, cs[i], s.shape()[i], what);
      if (!(cs[i].is_static() && cs[i].value == 1) || i + 1 == cs.rank())
        detail_nn::unify(n, cs[i], xs[xs.rank() - cs.rank() + i], what);
    }
  }
  set_output(n, 0, x.dtype(), x.shape());
}

inline void infer_lp_norm(Node& n) {
  Value& x = required_input(n, 0);
  require_floating(n, x);
  const double p = lp_order(n);
  if (p != 1 && p != 2) throw n.error("p must be 1 or 2, got " + std::to_string(p));
  if (x.shape().rank_known() && x.shape().rank() > 0)
    normalize_axis(n, n.attr_int("axis", -1), static_cast<std::int64_t>(x.shape().rank()));
  set_output(n, 0, x.dtype(), x.shape());
}

inline void infer_lp_pool(Node& n) {
  lp_order(n);
  detail_nn::infer_pool(n, false);  // AveragePool's geometry (opset 18 adds ceil_mode and dilations to LpPool)
}

inline void infer_global_lp_pool(Node& n) {
  lp_order(n);
  detail_nn::infer_global_pool(n, false);
}

// MaxRoiPool: X [N, C, H, W], rois [num_rois, 5] -> [num_rois, C, pooled_h, pooled_w].
inline std::vector<std::int64_t> pooled_shape(const Node& n) {
  if (!n.has_attr("pooled_shape")) throw n.error("missing required attribute 'pooled_shape'");
  auto p = n.attr_ints("pooled_shape");
  if (p.size() != 2 || p[0] <= 0 || p[1] <= 0)
    throw n.error("pooled_shape must hold two positive values, got " + detail_nn::ints_str(p));
  return p;
}

inline void infer_max_roi_pool(Node& n) {
  Value& x = required_input(n, 0);
  Value& rois = required_input(n, 1);
  require_floating(n, x);
  detail_nn::require_same_dtype(n, x, rois);
  const auto p = pooled_shape(n);
  if (x.shape().rank_known()) detail_nn::require_rank(n, x, 4);
  if (rois.shape().rank_known()) {
    detail_nn::require_rank(n, rois, 2);
    if (rois.shape()[1].is_static() && rois.shape()[1].value != 5)
      throw n.error("rois has shape " + rois.shape().str() + ", expected [num_rois, 5]");
  }
  const Dim rois_count = rois.shape().rank_known() ? rois.shape()[0] : Dim();
  const Dim channels = x.shape().rank_known() ? x.shape()[1] : Dim();
  set_output(n, 0, x.dtype(), Shape{rois_count, channels, Dim(p[0]), Dim(p[1])});
}

// AffineGrid (opset 20): theta [N, 2, 3] with size [N, C, H, W] gives [N, H, W, 2]; theta [N, 3, 4] with
// size [N, C, D, H, W] gives [N, D, H, W, 3].
inline void infer_affine_grid(Node& n) {
  Value& theta = required_input(n, 0);
  Value& size = required_input(n, 1);
  require_floating(n, theta);
  require_dtype(n, size, size.dtype() == DType::Int64, "expected int64");
  if (std::int64_t ac = n.attr_int("align_corners", 0); ac != 0 && ac != 1)
    throw n.error("align_corners must be 0 or 1");
  std::optional<std::size_t> len;
  if (size.shape().rank_known() && size.shape().rank() == 1 && size.shape()[0].is_static())
    len = static_cast<std::size_t>(size.shape()[0].value);
  if (len && *len != 4 && *len != 5)
    throw n.error("size has " + std::to_string(*len) + " values; expected 4 (2-D) or 5 (3-D)");
  if (!len) return set_output(n, 0, theta.dtype(), Shape::unknown());
  const std::size_t spatial = *len - 2;
  if (theta.shape().rank_known()) {
    detail_nn::require_rank(n, theta, 3);
    const Shape& t = theta.shape();
    if ((t[1].is_static() && t[1].value != static_cast<std::int64_t>(spatial)) ||
        (t[2].is_static() && t[2].value != static_cast<std::int64_t>(spatial + 1)))
      throw n.error("theta has shape " + t.str() + ", expected [N, " + std::to_string(spatial) + ", " +
                    std::to_string(spatial + 1) + "] for size of " + std::to_string(*len) + " values");
  }
  auto values = input_values(n, 1);
  std::vector<Dim> out;
  auto at = [&](std::size_t i) { return values && (*values)[i].is_number() ? Dim(*(*values)[i].number) : Dim(); };
  out.push_back(theta.shape().rank_known() ? theta.shape()[0] : at(0));
  for (std::size_t i = 2; i < *len; ++i) out.push_back(at(i));
  out.push_back(Dim(static_cast<std::int64_t>(spatial)));
  set_output(n, 0, theta.dtype(), Shape(std::move(out)));
}

}  // namespace detail_nn_extra

inline void register_nn_extra_infer(InferTable& t) {
  namespace d = detail_nn_extra;
  t["Mish"] = d::infer_mish;
  for (const char* op : {"BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"}) t[op] = d::infer_bitwise;
  t["CenterCropPad"] = d::infer_center_crop_pad;
  t["GroupNormalization"] = d::infer_group_norm;
  t[std::string(fused::kDomain) + ".GroupNorm"] = d::infer_group_norm;  // GroupNormalization-21's semantics
  t[std::string(fused::kDomain) + ".ChannelLayerNorm"] = d::infer_channel_layer_norm;
  t[std::string(fused::kDomain) + ".RMSNorm"] = d::infer_rms_norm;
  t[std::string(fused::kDomain) + ".Rotary"] = d::infer_rotary;
  t["LpNormalization"] = d::infer_lp_norm;
  t["LpPool"] = d::infer_lp_pool;
  t["GlobalLpPool"] = d::infer_global_lp_pool;
  t["MaxRoiPool"] = d::infer_max_roi_pool;
  t["AffineGrid"] = d::infer_affine_grid;
}

}  // namespace ondine::infer
