// SPDX-License-Identifier: Apache-2.0
// ondine/reference/selection.hpp - reference kernels of NonMaxSuppression, Unique and Compress, the ops
// whose output size is data.
//
// NonMaxSuppression follows ONNX Runtime, which the backend suite's expectations come from: per batch and
// class, the boxes scoring strictly above score_threshold, by descending score (ties: lower index first),
// each kept unless its IoU with a kept one exceeds iou_threshold, at most max_output_boxes_per_class (0 or
// omitted: none). Corners may come in either order; a box of no area suppresses nothing.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "ondine/ir/infer/selection.hpp"
#include "ondine/reference/common.hpp"

namespace ondine::reference {
namespace detail_selection {

struct Box {
  float y1, x1, y2, x2;
};

inline Box corners(const float* b, bool center) {
  if (center) {  // [x_center, y_center, width, height]
    return {b[1] - b[3] / 2, b[0] - b[2] / 2, b[1] + b[3] / 2, b[0] + b[2] / 2};
  }
  return {std::min(b[0], b[2]), std::min(b[1], b[3]), std::max(b[0], b[2]), std::max(b[1], b[3])};
}

inline bool suppresses(const Box& a, const Box& b, float iou_threshold) {
  const float ix1 = std::max(a.x1, b.x1), iy1 = std::max(a.y1, b.y1);
  const float ix2 = std::min(a.x2, b.x2), iy2 = std::min(a.y2, b.y2);
  if (ix2 <= ix1 || iy2 <= iy1) return false;
  const float inter = (ix2 - ix1) * (iy2 - iy1);
  const float area_a = (a.x2 - a.x1) * (a.y2 - a.y1), area_b = (b.x2 - b.x1) * (b.y2 - b.y1);
  const float uni = area_a + area_b - inter;
  if (area_a <= 0 || area_b <= 0 || uni <= 0) return false;
  return inter / uni > iou_threshold;
}

// The kept boxes of one NMS pass, bucketed by x1 so that a candidate is compared only with the kept
// boxes it can overlap (a box suppresses another only when their intersection is positive). Models
// exported from torchvision run every class through one NMS call, with each class's boxes shifted apart
// by an offset (batched_nms' coordinate trick): thousands of kept boxes, of which a candidate can meet
// a few. A bucket is at least as wide as the widest candidate, so the kept boxes that can overlap a
// candidate lie in its bucket or the two beside it; the result is that of comparing with every kept box.
// Non-finite coordinates fall back to one bucket.
class XBuckets {
 public:
  XBuckets(const std::vector<Box>& boxes, const std::vector<std::int64_t>& candidates) : boxes_(boxes) {
    float lo = 0, hi = 0, widest = 0;
    bool first = true, finite = true;
    for (std::int64_t i : candidates) {
      const Box& b = boxes[static_cast<std::size_t>(i)];
      finite = finite && std::isfinite(b.x1) && std::isfinite(b.x2);
      if (!finite) break;
      lo = first ? b.x1 : std::min(lo, b.x1);
      hi = first ? b.x1 : std::max(hi, b.x1);
      widest = std::max(widest, b.x2 - b.x1);
      first = false;
    }
    const double range = static_cast<double>(hi) - lo;
    if (!finite || candidates.size() < 64 || !(widest > 0) || range <= 2.0 * widest) {
      buckets_.resize(1);  // one bucket: every kept box is compared
      return;
    }
    lo_ = lo;
    width_ = std::max(static_cast<double>(widest), range / (2.0 * static_cast<double>(candidates.size()))) * (1 + 1e-6);
    buckets_.resize(static_cast<std::size_t>(range / width_) + 1);
  }

  void add(std::int64_t i) { buckets_[bucket(boxes_[static_cast<std::size_t>(i)].x1)].push_back(i); }

  // True when `hit` holds for a kept box that may overlap `b`.
  template <typename Hit>
  bool any_near(const Box& b, Hit hit) const {
    const std::size_t at = bucket(b.x1);
    const std::size_t first = at == 0 ? 0 : at - 1, last = std::min(at + 1, buckets_.size() - 1);
    for (std::size_t k = first; k <= last; ++k)
      for (std::int64_t i : buckets_[k])
        if (hit(i)) return true;
    return false;
  }

 private:
  std::size_t bucket(float x1) const {
    if (buckets_.size() == 1) return 0;
    const double q = std::floor((static_cast<double>(x1) - lo_) / width_);
    return static_cast<std::size_t>(std::clamp(q, 0.0, static_cast<double>(buckets_.size() - 1)));
  }

  const std::vector<Box>& boxes_;
  double lo_ = 0, width_ = 1;
  std::vector<std::vector<std::int64_t>> buckets_;
};

// An optional int64 scalar input (0 when omitted).
inline std::int64_t i64_at(const std::vector<Tensor>& in, std::size_t i) {
  return i < in.size() && !in[i].empty() && in[i].numel() > 0 ? in[i].to_int64s()[0] : 0;
}

inline std::vector<Tensor> non_max_suppression(const Node& n, const std::vector<Tensor>& in) {
  if (in.size() < 2 || in[0].empty() || in[1].empty()) throw n.error("boxes and scores are required");
  const Tensor& boxes = in[0];
  const Tensor& scores = in[1];
  if (boxes.dtype() != DType::Float32 || scores.dtype() != DType::Float32)
    throw n.error("boxes and scores must be float32");
  if (boxes.rank() != 3 || boxes.dims()[2] != 4) throw n.error("boxes must be [batches, boxes, 4], got " + dims_str(boxes.dims()));
  if (scores.rank() != 3 || scores.dims()[0] != boxes.dims()[0] || scores.dims()[2] != boxes.dims()[1])
    throw n.error("scores " + dims_str(scores.dims()) + " do not match boxes " + dims_str(boxes.dims()));
  auto scalar = [&](std::size_t i, double def) { return i < in.size() && !in[i].empty() ? in[i].at_double(0) : def; };
  const std::int64_t max_out = i64_at(in, 2);
  const auto iou_threshold = static_cast<float>(scalar(3, 0.0));
  const bool has_score_threshold = in.size() > 4 && !in[4].empty();
  const auto score_threshold = static_cast<float>(scalar(4, 0.0));
  if (iou_threshold < 0 || iou_threshold > 1) throw n.error("iou_threshold must be in [0, 1]");
  const bool center = n.attr_int("center_point_box", 0) == 1;
  const std::int64_t batches = boxes.dims()[0], count = boxes.dims()[1], classes = scores.dims()[1];
  std::vector<std::int64_t> selected;  // (batch, class, box) triples
  for (std::int64_t b = 0; b < batches && max_out > 0; ++b) {
    std::vector<Box> box(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) box[static_cast<std::size_t>(i)] = corners(boxes.data<float>() + (b * count + i) * 4, center);
    for (std::int64_t c = 0; c < classes; ++c) {
      const float* s = scores.data<float>() + (b * classes + c) * count;
      std::vector<std::int64_t> order;
      for (std::int64_t i = 0; i < count; ++i)
        if (!has_score_threshold || s[i] > score_threshold) order.push_back(i);
      std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t z) { return s[a] > s[z]; });
      std::int64_t kept = 0;
      XBuckets buckets(box, order);
      for (std::int64_t i : order) {
        if (kept >= max_out) break;
        const Box& candidate = box[static_cast<std::size_t>(i)];
        if (buckets.any_near(candidate, [&](std::int64_t k) {
              return suppresses(box[static_cast<std::size_t>(k)], candidate, iou_threshold);
            }))
          continue;
        buckets.add(i);
        ++kept;
        selected.insert(selected.end(), {b, c, i});
      }
    }
  }
  return {Tensor::from_vector<std::int64_t>({static_cast<std::int64_t>(selected.size() / 3), 3}, selected)};
}

// Unique: the distinct elements (no axis) or slices along `axis`, sorted ascending or in order of first
// appearance; with the first index of each, each input's index into them, and their counts.
inline std::vector<Tensor> unique(const Node& n, const std::vector<Tensor>& in) {
  if (in.empty() || in[0].empty()) throw n.error("input X is required");
  const Tensor& x = in[0];
  const bool sorted = n.attr_int("sorted", 1) != 0;
  std::vector<std::int64_t> dims = x.dims();
  std::size_t axis = 0;
  std::int64_t outer = 1, steps = x.numel(), inner = 1;
  const bool by_axis = n.has_attr("axis");
  if (by_axis) {
    axis = static_cast<std::size_t>(detail::normalize_axis(n, n.attr_int("axis"), static_cast<std::int64_t>(x.rank())));
    steps = dims[axis];
    for (std::size_t a = 0; a < axis; ++a) outer *= dims[a];
    for (std::size_t a = axis + 1; a < dims.size(); ++a) inner *= dims[a];
  }
  std::vector<Tensor> result;
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = x.data<T>();
    auto element = [&](std::int64_t k, std::int64_t j) {  // j-th element of slice k, in (outer, inner) order
      return p[(j / inner * steps + k) * inner + j % inner];
    };
    const std::int64_t width = outer * inner;
    auto less = [&](std::int64_t a, std::int64_t b) {
      for (std::int64_t j = 0; j < width; ++j) {
        T u = element(a, j), v = element(b, j);
        if (u < v) return true;
        if (v < u) return false;
      }
      return false;
    };
    auto equal = [&](std::int64_t a, std::int64_t b) { return !less(a, b) && !less(b, a); };
    // The first occurrence of each distinct slice, in order of appearance.
    std::vector<std::int64_t> order(static_cast<std::size_t>(steps));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), less);  // equal slices keep their order: first comes first
    std::vector<std::int64_t> firsts, inverse(static_cast<std::size_t>(steps)), counts;
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (i == 0 || !equal(order[i - 1], order[i])) {
        firsts.push_back(order[i]);
        counts.push_back(0);
      }
      inverse[static_cast<std::size_t>(order[i])] = static_cast<std::int64_t>(firsts.size()) - 1;
      ++counts.back();
    }
    std::vector<std::int64_t> rank(firsts.size());  // position of each distinct slice in the output
    std::iota(rank.begin(), rank.end(), 0);
    if (!sorted) {  // order of first appearance
      std::vector<std::int64_t> by_first(firsts.size());
      std::iota(by_first.begin(), by_first.end(), 0);
      std::sort(by_first.begin(), by_first.end(), [&](std::int64_t a, std::int64_t b) { return firsts[a] < firsts[b]; });
      for (std::size_t r = 0; r < by_first.size(); ++r) rank[static_cast<std::size_t>(by_first[r])] = static_cast<std::int64_t>(r);
    }
    const auto u = static_cast<std::int64_t>(firsts.size());
    std::vector<std::int64_t> out_first(firsts.size()), out_counts(firsts.size());
    for (std::size_t g = 0; g < firsts.size(); ++g) {
      out_first[static_cast<std::size_t>(rank[g])] = firsts[g];
      out_counts[static_cast<std::size_t>(rank[g])] = counts[g];
    }
    for (auto& v : inverse) v = rank[static_cast<std::size_t>(v)];
    std::vector<std::int64_t> y_dims = by_axis ? dims : std::vector<std::int64_t>{u};
    if (by_axis) y_dims[axis] = u;
    Tensor y(x.dtype(), y_dims);
    T* q = y.data<T>();
    for (std::int64_t k = 0; k < u; ++k)
      for (std::int64_t j = 0; j < width; ++j) q[(j / inner * u + k) * inner + j % inner] = element(out_first[static_cast<std::size_t>(k)], j);
    result.push_back(y);
    result.push_back(Tensor::from_vector<std::int64_t>({u}, out_first));
    result.push_back(Tensor::from_vector<std::int64_t>({steps}, inverse));
    result.push_back(Tensor::from_vector<std::int64_t>({u}, out_counts));
  });
  result.resize(n.num_outputs());
  return result;
}

// Compress: the slices along `axis` (the elements of the flattened input without it) whose condition
// entry is true; entries past the condition's end are dropped.
inline std::vector<Tensor> compress(const Node& n, const std::vector<Tensor>& in) {
  if (in.size() < 2 || in[0].empty() || in[1].empty()) throw n.error("input and condition are required");
  const Tensor& x = in[0];
  const Tensor& condition = in[1];
  const std::size_t es = dtype_size(x.dtype());
  if (es == 0) throw n.error("tensors of " + std::string(dtype_name(x.dtype())) + " are not supported");
  if (condition.dtype() != DType::Bool || condition.rank() != 1)
    throw n.error("condition must be a 1-D bool tensor, got " + std::string(dtype_name(condition.dtype())) +
                  dims_str(condition.dims()));
  const auto axis = ::ondine::infer::detail_selection::compress_axis(n, static_cast<std::int64_t>(x.rank()));
  std::int64_t outer = 1, len = x.numel(), inner = 1;
  if (axis) {
    len = x.dims()[*axis];
    for (std::size_t a = 0; a < *axis; ++a) outer *= x.dims()[a];
    for (std::size_t a = *axis + 1; a < x.rank(); ++a) inner *= x.dims()[a];
  }
  ::ondine::infer::detail_selection::check_condition_length(n, condition.numel(), len);
  std::vector<std::int64_t> kept;
  const bool* c = condition.data<bool>();
  for (std::int64_t j = 0; j < condition.numel(); ++j)
    if (c[j]) kept.push_back(j);
  const auto count = static_cast<std::int64_t>(kept.size());
  std::vector<std::int64_t> dims{count};
  if (axis) {
    dims = x.dims();
    dims[*axis] = count;
  }
  Tensor y(x.dtype(), dims);
  const auto* src = static_cast<const unsigned char*>(x.raw());
  auto* dst = static_cast<unsigned char*>(y.raw());
  const std::size_t slice = static_cast<std::size_t>(inner) * es;
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t k = 0; k < count; ++k)
      std::memcpy(dst + static_cast<std::size_t>(o * count + k) * slice,
                  src + static_cast<std::size_t>(o * len + kept[static_cast<std::size_t>(k)]) * slice, slice);
  return {y};
}

}  // namespace detail_selection

inline void register_selection_kernels(KernelTable& t) {
  t["NonMaxSuppression"] = detail_selection::non_max_suppression;
  t["Unique"] = detail_selection::unique;
  t["Compress"] = detail_selection::compress;
}

}  // namespace ondine::reference
