// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/sampling.hpp - shape and type inference for the ops that sample an image at computed
// points: GridSample (opsets 16 and 20) and RoiAlign (opsets 10 and 16).
//
// GridSample: X [N, C, D1, ..., Dr] and a grid [N, O1, ..., Or, r] of normalised coordinates give
// [N, C, O1, ..., Or]. Opset 16 takes 4-D X only and names its modes bilinear / nearest / bicubic;
// opset 20 takes any r >= 1 and names them linear / nearest / cubic (cubic still 2-D only). RoiAlign:
// X [N, C, H, W], rois [R, 4] and batch_indices [R] give [R, C, output_height, output_width]. The
// attribute rules are read here once and shared with the reference kernels (reference/sampling.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ondine/ir/infer/common.hpp"
#include "ondine/ir/infer/nn.hpp"

namespace ondine::infer {
namespace detail_sampling {

using detail_nn::require_dtype;
using detail_nn::require_floating;

// --- GridSample -------------------------------------------------------------------------------------

enum class GridMode { Linear, Nearest, Cubic };
enum class GridPadding { Zeros, Border, Reflection };

struct GridSampleSpec {
  GridMode mode = GridMode::Linear;
  GridPadding padding = GridPadding::Zeros;
  bool align_corners = false;
};

inline GridSampleSpec grid_sample_spec(const Node& n) {
  GridSampleSpec s;
  const bool v20 = n.opset() >= 20;
  const std::string mode = n.attr_string("mode", v20 ? "linear" : "bilinear");
  if (mode == (v20 ? "linear" : "bilinear")) s.mode = GridMode::Linear;
  else if (mode == "nearest") s.mode = GridMode::Nearest;
  else if (mode == (v20 ? "cubic" : "bicubic")) s.mode = GridMode::Cubic;
  else
    throw n.error("invalid mode '" + mode + "' (opset " + std::to_string(n.opset()) + " takes " +
                  (v20 ? "linear, nearest or cubic" : "bilinear, nearest or bicubic") + ")");
  const std::string pad = n.attr_string("padding_mode", "zeros");
  if (pad == "zeros") s.padding = GridPadding::Zeros;
  else if (pad == "border") s.padding = GridPadding::Border;
  else if (pad == "reflection") s.padding = GridPadding::Reflection;
  else throw n.error("invalid padding_mode '" + pad + "' (expected zeros, border or reflection)");
  const std::int64_t ac = n.attr_int("align_corners", 0);
  if (ac != 0 && ac != 1) throw n.error("align_corners must be 0 or 1, got " + std::to_string(ac));
  s.align_corners = ac == 1;
  return s;
}

// The spatial rank X may have under the node's opset and mode; throws naming the node otherwise.
inline void check_grid_sample_rank(const Node& n, const GridSampleSpec& s, std::size_t x_rank) {
  if (x_rank < 3) throw n.error("X must be [N, C, D1, ...], got rank " + std::to_string(x_rank));
  if (n.opset() < 20 && x_rank != 4)
    throw n.error("GridSample before opset 20 takes a 4-D X, got rank " + std::to_string(x_rank));
  if (s.mode == GridMode::Cubic && x_rank != 4) throw n.error("cubic mode takes a 4-D X only");
}

inline void infer_grid_sample(Node& n) {
  const Value& x = required_input(n, 0);
  const Value& grid = required_input(n, 1);
  require_floating(n, grid);
  require_dtype(n, x, x.dtype() != DType::String && x.dtype() != DType::Bool, "expected a numeric type");
  const GridSampleSpec s = grid_sample_spec(n);
  const Shape& xs = x.shape();
  const Shape& gs = grid.shape();
  if (xs.rank_known()) check_grid_sample_rank(n, s, xs.rank());
  if (!xs.rank_known() && !gs.rank_known()) return set_output(n, 0, x.dtype(), Shape::unknown());
  const std::size_t rank = xs.rank_known() ? xs.rank() : gs.rank();
  // X [N, C, D1, ..., Dr] and grid [N, O1, ..., Or, r]: rank 3 at least (a lower grid rank with X's rank
  // unknown wrote past the output dims: found by fuzzing).
  if (rank < 3)
    throw n.error("X " + xs.str() + " and grid " + gs.str() + " must have rank 3 or more ([N, C, D1, ...], [N, O1, ..., r])");
  if (gs.rank_known()) {
    if (gs.rank() != rank)
      throw n.error("grid " + gs.str() + " must have the rank of X " + xs.str() + ": [N, O1, ..., Or, r]");
    const Dim& last = gs[rank - 1];
    if (last.is_static() && last.value != static_cast<std::int64_t>(rank - 2))
      throw n.error("grid " + gs.str() + " must end in " + std::to_string(rank - 2) + " coordinates for X " + xs.str());
  }
  std::vector<Dim> out(rank);
  out[0] = xs.rank_known() ? detail_nn::unify(n, xs[0], gs.rank_known() ? gs[0] : Dim(), "batch of X and grid") : gs[0];
  out[1] = xs.rank_known() ? xs[1] : Dim();
  for (std::size_t i = 2; i < rank; ++i) out[i] = gs.rank_known() ? gs[i - 1] : Dim();
  set_output(n, 0, x.dtype(), Shape(out));
}

// --- RoiAlign ---------------------------------------------------------------------------------------

struct RoiAlignSpec {
  bool max = false;         // mode "max" (else "avg")
  bool half_pixel = false;  // coordinate_transformation_mode "half_pixel" (opset 16's default)
  std::int64_t output_height = 1, output_width = 1, sampling_ratio = 0;
  float spatial_scale = 1.0f;
};

inline RoiAlignSpec roi_align_spec(const Node& n) {
  RoiAlignSpec s;
  const std::string mode = n.attr_string("mode", "avg");
  if (mode == "max") s.max = true;
  else if (mode != "avg") throw n.error("invalid mode '" + mode + "' (expected avg or max)");
  // Opset 10 had no attribute and behaved as output_half_pixel.
  const std::string ct = n.attr_string("coordinate_transformation_mode", n.opset() >= 16 ? "half_pixel" : "output_half_pixel");
  if (ct == "half_pixel") s.half_pixel = true;
  else if (ct != "output_half_pixel")
    throw n.error("invalid coordinate_transformation_mode '" + ct + "' (expected half_pixel or output_half_pixel)");
  s.output_height = n.attr_int("output_height", 1);
  s.output_width = n.attr_int("output_width", 1);
  s.sampling_ratio = n.attr_int("sampling_ratio", 0);
  s.spatial_scale = n.attr_float("spatial_scale", 1.0f);
  if (s.output_height <= 0 || s.output_width <= 0)
    throw n.error("output_height and output_width must be positive, got " + std::to_string(s.output_height) + " and " +
                  std::to_string(s.output_width));
  if (s.sampling_ratio < 0) throw n.error("sampling_ratio must not be negative, got " + std::to_string(s.sampling_ratio));
  return s;
}

inline void infer_roi_align(Node& n) {
  const Value& x = required_input(n, 0);
  const Value& rois = required_input(n, 1);
  const Value& idx = required_input(n, 2);
  require_floating(n, x);
  detail_nn::require_same_dtype(n, x, rois);
  require_dtype(n, idx, idx.dtype() == DType::Int64, "expected int64");
  detail_nn::require_rank(n, x, 4);
  detail_nn::require_rank(n, rois, 2);
  detail_nn::require_rank(n, idx, 1);
  const RoiAlignSpec s = roi_align_spec(n);
  Dim r = rois.shape().rank_known() ? rois.shape()[0] : Dim();
  if (rois.shape().rank_known() && rois.shape()[1].is_static() && rois.shape()[1].value != 4)
    throw n.error("rois " + rois.shape().str() + " must be [num_rois, 4]");
  if (idx.shape().rank_known()) r = detail_nn::unify(n, r, idx.shape()[0], "num_rois of rois and batch_indices");
  const Dim c = x.shape().rank_known() ? x.shape()[1] : Dim();
  set_output(n, 0, x.dtype(), Shape{r, c, s.output_height, s.output_width});
}

}  // namespace detail_sampling

inline void register_sampling_infer(InferTable& t) {
  t["GridSample"] = detail_sampling::infer_grid_sample;
  t["RoiAlign"] = detail_sampling::infer_roi_align;
}

}  // namespace ondine::infer
