// SPDX-License-Identifier: Apache-2.0
// ondine/quant/observers.hpp - quantization parameters, the quantize/dequantize oracle, and observers.
//
// Affine int8 quantization maps a real x to q = saturate(round_half_even(x / scale) + zero_point) and
// back to (q - zero_point) * scale, exactly as ONNX QuantizeLinear / DequantizeLinear do. This header
// holds the parameters (QuantParams), how they are computed from a real range (compute_params), the
// scalar and tensor quantize/dequantize helpers that every int8 kernel is checked against, and the
// observers that watch float32 tensors during calibration and choose the range:
//
//   MinMaxObserver               running min and max of everything seen
//   PerChannelMinMaxObserver     min and max per slice along an axis (weights: output channels)
//   MovingAverageMinMaxObserver  min and max averaged over batches (PyTorch's averaging_constant)
//   HistogramObserver            a fixed-size histogram whose range grows with the data; the range is
//                                chosen by percentile, by entropy (KL divergence, TensorRT's method)
//                                or by minimising the quantization MSE
//
// Conventions (those of ONNX Runtime's quantizer, so exported QDQ models agree with it):
//   - The range always includes 0, so that 0 (padding, ReLU's output) is exact.
//   - int8 symmetric uses [-127, 127] (zero point 0); uint8 symmetric uses [0, 255] with zero point 128.
//     Asymmetric int8 uses [-128, 127], uint8 [0, 255]. reduce_range (7 bits) halves these, for CPUs
//     whose u8*s8 instructions can saturate (no VNNI).
//   - A range whose scale would be below the smallest normal float (a zero range: min == max == 0, a
//     constant-zero tensor, denormal data) gets scale 1.0 and zero point 0 (128 for uint8 symmetric):
//     everything quantizes to the exact zero. Scales are never 0, NaN or Inf.
//   - NaN or Inf in observed data is an error naming the tensor: no range can be chosen for it.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/tensor.hpp"

namespace ondine::quant {

// How a range becomes parameters: the integer type, symmetric or not, and the 7-bit reduced range.
struct QuantScheme {
  DType dtype = DType::Int8;  // Int8 or UInt8
  bool symmetric = true;
  bool reduce_range = false;
};

// The parameters of one quantized tensor: one scale and zero point (per tensor), or one per slice
// along `axis` (per channel), as ONNX QuantizeLinear takes them.
struct QuantParams {
  DType dtype = DType::Int8;          // Int8 or UInt8
  bool symmetric = true;              // informational: how the params were computed
  std::optional<std::int64_t> axis;   // set for per-channel params
  std::vector<float> scale;           // > 0, finite
  std::vector<std::int32_t> zero_point;  // within the range of dtype

  bool per_channel() const { return axis.has_value(); }
  std::size_t channels() const { return scale.size(); }
};

// A range chosen by an observer: one [min, max] per tensor, or one per channel along `axis`.
struct Range {
  std::vector<float> min, max;
  std::optional<std::int64_t> axis;
};

// The integer range the scheme quantizes to (ONNX Runtime's get_qmin_qmax_for_qType).
inline std::pair<std::int32_t, std::int32_t> quant_bounds(const QuantScheme& s) {
  if (s.dtype == DType::UInt8) return s.reduce_range ? std::make_pair(0, 127) : std::make_pair(0, 255);
  if (s.dtype == DType::Int8) {
    if (s.reduce_range) return {-64, 64};
    return s.symmetric ? std::make_pair(-127, 127) : std::make_pair(-128, 127);
  }
  throw Error("quantization type must be int8 or uint8, not " + std::string(dtype_name(s.dtype)));
}

// The full range of the storage type, which quantize() saturates to.
inline std::pair<std::int32_t, std::int32_t> type_bounds(DType t) {
  if (t == DType::Int8) return {-128, 127};
  if (t == DType::UInt8) return {0, 255};
  throw Error("quantization type must be int8 or uint8, not " + std::string(dtype_name(t)));
}

// Round to nearest, ties to even (ONNX QuantizeLinear's rounding), whatever the FPU rounding mode.
inline float round_half_even(float x) {
  float r = std::round(x);  // ties away from zero
  if (std::fabs(x - std::trunc(x)) == 0.5f) r = 2.0f * std::round(x * 0.5f);
  return r;
}
inline double round_half_even(double x) {
  double r = std::round(x);
  if (std::fabs(x - std::trunc(x)) == 0.5) r = 2.0 * std::round(x * 0.5);
  return r;
}

namespace detail {
inline std::string fmt_float(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}
}  // namespace detail

// Scale and zero point for the real range [min, max] (widened to include 0). See the conventions above.
inline void compute_scale_zero_point(float min, float max, const QuantScheme& s, float& scale,
                                     std::int32_t& zero_point) {
  if (!std::isfinite(min) || !std::isfinite(max))
    throw Error("quantization range [" + detail::fmt_float(min) + ", " + detail::fmt_float(max) + "] is not finite");
  if (min > max)
    throw Error("quantization range [" + detail::fmt_float(min) + ", " + detail::fmt_float(max) + "] is empty");
  auto [qmin, qmax] = quant_bounds(s);
  double rmin = std::min(0.0, static_cast<double>(min)), rmax = std::max(0.0, static_cast<double>(max));
  if (s.symmetric) {
    double absmax = std::max(-rmin, rmax);
    rmin = -absmax;
    rmax = absmax;
  }
  // In double: (FLT_MAX - -FLT_MAX) / 127 is finite, so every finite range gives a finite scale.
  scale = static_cast<float>((rmax - rmin) / (qmax - qmin));
  std::int32_t mid = static_cast<std::int32_t>(round_half_even((qmin + qmax) / 2.0));
  if (!(scale >= FLT_MIN)) {  // zero (or denormal) range: quantize everything to an exact zero
    scale = 1.0f;
    zero_point = s.symmetric ? mid : std::clamp(0, qmin, qmax);
    return;
  }
  double zp = s.symmetric ? mid : round_half_even(qmin - rmin / static_cast<double>(scale));
  zero_point = static_cast<std::int32_t>(std::clamp(zp, static_cast<double>(qmin), static_cast<double>(qmax)));
}

// Per-tensor parameters for [min, max].
inline QuantParams compute_params(float min, float max, const QuantScheme& s) {
  QuantParams p;
  p.dtype = s.dtype;
  p.symmetric = s.symmetric;
  p.scale.resize(1);
  p.zero_point.resize(1);
  compute_scale_zero_point(min, max, s, p.scale[0], p.zero_point[0]);
  return p;
}

// Parameters for a range chosen by an observer (per channel when r.axis is set).
inline QuantParams compute_params(const Range& r, const QuantScheme& s) {
  if (r.min.size() != r.max.size() || r.min.empty())
    throw Error("quantization range has " + std::to_string(r.min.size()) + " minima and " +
                std::to_string(r.max.size()) + " maxima");
  if (!r.axis && r.min.size() != 1)
    throw Error("per-tensor quantization range has " + std::to_string(r.min.size()) + " entries");
  QuantParams p;
  p.dtype = s.dtype;
  p.symmetric = s.symmetric;
  p.axis = r.axis;
  p.scale.resize(r.min.size());
  p.zero_point.resize(r.min.size());
  for (std::size_t c = 0; c < r.min.size(); ++c) compute_scale_zero_point(r.min[c], r.max[c], s, p.scale[c], p.zero_point[c]);
  return p;
}

// Throws an Error when the params cannot be used: a scale that is zero, negative, NaN or Inf, a zero
// point outside the type, mismatched sizes. `what` names the tensor in the message.
inline void check_params(const QuantParams& p, const std::string& what = "tensor") {
  auto [tmin, tmax] = type_bounds(p.dtype);
  if (p.scale.empty() || p.scale.size() != p.zero_point.size())
    throw Error("quantization params of '" + what + "' have " + std::to_string(p.scale.size()) + " scales and " +
                std::to_string(p.zero_point.size()) + " zero points");
  if (!p.axis && p.scale.size() != 1)
    throw Error("per-tensor quantization params of '" + what + "' have " + std::to_string(p.scale.size()) + " scales");
  for (std::size_t c = 0; c < p.scale.size(); ++c) {
    if (!(p.scale[c] > 0.0f) || !std::isfinite(p.scale[c]))
      throw Error("quantization scale of '" + what + "' is " + detail::fmt_float(p.scale[c]) +
                  (p.axis ? " (channel " + std::to_string(c) + ")" : std::string()) + ": it must be positive and finite");
    if (p.zero_point[c] < tmin || p.zero_point[c] > tmax)
      throw Error("zero point " + std::to_string(p.zero_point[c]) + " of '" + what + "' is outside " +
                  std::string(dtype_name(p.dtype)));
  }
}

// --- the numerical oracle ------------------------------------------------------------------------

// ONNX QuantizeLinear for one value: saturate(round_half_even(x / scale) + zero_point) into the type's
// full range. Values beyond the range clamp (never wrap); NaN quantizes to the zero point.
inline std::int32_t quantize_value(float x, float scale, std::int32_t zero_point, DType dtype) {
  auto [tmin, tmax] = type_bounds(dtype);
  float v = x / scale;
  if (std::isnan(v)) return std::clamp(zero_point, tmin, tmax);
  double q = static_cast<double>(round_half_even(v)) + zero_point;  // double: exact, and no int overflow
  return static_cast<std::int32_t>(std::clamp(q, static_cast<double>(tmin), static_cast<double>(tmax)));
}

// ONNX DequantizeLinear for one value.
inline float dequantize_value(std::int32_t q, float scale, std::int32_t zero_point) {
  return static_cast<float>(q - zero_point) * scale;
}

// Quantize then dequantize: the value an int8 pipeline sees in place of x.
inline float fake_quantize_value(float x, float scale, std::int32_t zero_point, DType dtype) {
  return dequantize_value(quantize_value(x, scale, zero_point, dtype), scale, zero_point);
}

namespace detail {
// Splits dims around the quantization axis: outer * channels * inner elements.
struct AxisSplit {
  std::int64_t outer = 1, channels = 1, inner = 1;
};
// `channels` is the number of scales the axis must match (per-channel only).
inline AxisSplit split_axis(const std::vector<std::int64_t>& dims, std::optional<std::int64_t> axis_opt,
                            std::size_t channels, const std::string& what) {
  AxisSplit s;
  if (!axis_opt) {
    for (auto d : dims) s.inner *= d;
    return s;
  }
  auto rank = static_cast<std::int64_t>(dims.size());
  std::int64_t axis = *axis_opt < 0 ? *axis_opt + rank : *axis_opt;
  if (axis < 0 || axis >= rank)
    throw Error("quantization axis " + std::to_string(*axis_opt) + " is out of range for " + what + " of shape " +
                dims_str(dims));
  if (dims[axis] != static_cast<std::int64_t>(channels))
    throw Error(what + " has " + std::to_string(dims[axis]) + " channels along axis " + std::to_string(axis) + " but " +
                std::to_string(channels) + " scales");
  for (std::int64_t i = 0; i < axis; ++i) s.outer *= dims[i];
  s.channels = dims[axis];
  for (std::int64_t i = axis + 1; i < rank; ++i) s.inner *= dims[i];
  return s;
}
}  // namespace detail

// Quantizes a float32 tensor to p.dtype (per tensor or per channel).
inline Tensor quantize(const Tensor& x, const QuantParams& p) {
  check_params(p);
  if (x.dtype() != DType::Float32)
    throw Error("quantize expects a float32 tensor, got " + std::string(dtype_name(x.dtype())));
  auto s = detail::split_axis(x.dims(), p.axis, p.scale.size(), "tensor");
  Tensor out(p.dtype, x.dims());
  const float* src = x.data<float>();
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::uint8_t>) {
      T* dst = out.data<T>();
      std::size_t i = 0;
      for (std::int64_t o = 0; o < s.outer; ++o)
        for (std::int64_t c = 0; c < s.channels; ++c)
          for (std::int64_t k = 0; k < s.inner; ++k, ++i)
            dst[i] = static_cast<T>(quantize_value(src[i], p.scale[c], p.zero_point[c], p.dtype));
    }
  });
  return out;
}

// Dequantizes an int8/uint8 tensor (its dtype must be p.dtype) to float32.
inline Tensor dequantize(const Tensor& q, const QuantParams& p) {
  check_params(p);
  if (q.dtype() != p.dtype)
    throw Error("dequantize: tensor of " + std::string(dtype_name(q.dtype())) + " with " +
                std::string(dtype_name(p.dtype)) + " params");
  auto s = detail::split_axis(q.dims(), p.axis, p.scale.size(), "tensor");
  Tensor out(DType::Float32, q.dims());
  float* dst = out.data<float>();
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::uint8_t>) {
      const T* src = q.data<T>();
      std::size_t i = 0;
      for (std::int64_t o = 0; o < s.outer; ++o)
        for (std::int64_t c = 0; c < s.channels; ++c)
          for (std::int64_t k = 0; k < s.inner; ++k, ++i)
            dst[i] = dequantize_value(static_cast<std::int32_t>(src[i]), p.scale[c], p.zero_point[c]);
    }
  });
  return out;
}

// dequantize(quantize(x, p), p).
inline Tensor fake_quantize(const Tensor& x, const QuantParams& p) { return dequantize(quantize(x, p), p); }

// --- observers -----------------------------------------------------------------------------------

namespace detail {
// Min and max of a float32 tensor, throwing an Error naming it on NaN or Inf (one pass).
inline std::pair<float, float> finite_min_max(const float* p, std::size_t n, const std::string& name,
                                              const std::vector<std::int64_t>& dims) {
  float mn = std::numeric_limits<float>::infinity(), mx = -mn;
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) {
    float v = p[i];
    mn = std::min(mn, v);
    mx = std::max(mx, v);
    bad |= !std::isfinite(v);  // cheap to accumulate; the slow path below finds the element
  }
  if (bad)
    for (std::size_t i = 0; i < n; ++i)
      if (!std::isfinite(p[i]))
        throw Error("tensor '" + name + "' contains " + (std::isnan(p[i]) ? "NaN" : p[i] > 0 ? "+Inf" : "-Inf") +
                    " (element " + std::to_string(i) + " of float32" + dims_str(dims) +
                    "): no quantization range can be chosen for it");
  return {mn, mx};
}
}  // namespace detail

// The base of all observers: feeds float32 tensors, checks them, keeps the overall min and max, and
// turns the range the observer chooses into QuantParams.
class Observer {
 public:
  explicit Observer(std::string name) : name_(std::move(name)) {}
  virtual ~Observer() = default;
  Observer(const Observer&) = delete;
  Observer& operator=(const Observer&) = delete;

  // The tensor's name, used in every error message.
  const std::string& name() const { return name_; }

  // Feeds one tensor. Throws an Error naming the tensor when it is not float32 or holds NaN/Inf (and
  // then records nothing). Empty tensors are ignored.
  void observe(const Tensor& t) {
    if (t.dtype() != DType::Float32)
      throw Error("observer for '" + name_ + "' expects float32 data, got " + std::string(dtype_name(t.dtype())));
    auto n = static_cast<std::size_t>(t.numel());
    if (n == 0) return;
    auto [mn, mx] = detail::finite_min_max(t.data<float>(), n, name_, t.dims());
    update(t, mn, mx);
    min_ = count_ ? std::min(min_, mn) : mn;
    max_ = count_ ? std::max(max_, mx) : mx;
    count_ += n;
    ++batches_;
  }

  // Elements and tensors seen so far.
  std::uint64_t count() const { return count_; }
  std::uint64_t batches() const { return batches_; }
  bool has_data() const { return count_ != 0; }
  // The extremes of everything seen (0 before any data).
  float observed_min() const { return min_; }
  float observed_max() const { return max_; }

  // The range this observer selects for the scheme (histogram methods depend on the number of levels
  // and on symmetry). Before any data: [0, 0], which compute_params turns into safe params.
  virtual Range range(const QuantScheme& scheme) const = 0;
  QuantParams params(const QuantScheme& scheme) const { return compute_params(range(scheme), scheme); }

 protected:
  // Called with a checked, non-empty float32 tensor and its min and max.
  virtual void update(const Tensor& t, float batch_min, float batch_max) = 0;
  static Range per_tensor(float mn, float mx) { return Range{{mn}, {mx}, std::nullopt}; }

 private:
  std::string name_;
  std::uint64_t count_ = 0, batches_ = 0;
  float min_ = 0.0f, max_ = 0.0f;
};

// Running min and max (PyTorch's MinMaxObserver, ONNX Runtime's MinMax calibrator).
class MinMaxObserver : public Observer {
 public:
  using Observer::Observer;
  Range range(const QuantScheme&) const override { return per_tensor(observed_min(), observed_max()); }

 protected:
  void update(const Tensor&, float, float) override {}
};

// Min and max averaged over batches: m = m + momentum * (batch_m - m), the first batch taken as is
// (PyTorch's MovingAverageMinMaxObserver with averaging_constant = momentum). Less sensitive to a rare
// extreme batch than MinMaxObserver.
class MovingAverageMinMaxObserver : public Observer {
 public:
  explicit MovingAverageMinMaxObserver(std::string name, float momentum = 0.01f)
      : Observer(std::move(name)), momentum_(momentum) {
    if (!(momentum > 0.0f && momentum <= 1.0f))
      throw Error("moving-average momentum must be in (0, 1], got " + detail::fmt_float(momentum));
  }
  float momentum() const { return momentum_; }
  Range range(const QuantScheme&) const override { return per_tensor(avg_min_, avg_max_); }

 protected:
  void update(const Tensor&, float mn, float mx) override {
    if (batches() == 0) {
      avg_min_ = mn;
      avg_max_ = mx;
    } else {
      avg_min_ += momentum_ * (mn - avg_min_);
      avg_max_ += momentum_ * (mx - avg_max_);
    }
  }

 private:
  float momentum_;
  float avg_min_ = 0.0f, avg_max_ = 0.0f;
};

// Min and max of each slice along `axis` (negative counts from the back), for per-channel weights:
// axis 0 for Conv's [M, C/g, kh, kw], 1 for MatMul's [K, N]. Every tensor fed must have the same
// rank and the same number of channels.
class PerChannelMinMaxObserver : public Observer {
 public:
  PerChannelMinMaxObserver(std::string name, std::int64_t axis) : Observer(std::move(name)), axis_(axis) {}
  // The normalised axis once data was seen, else the axis as given.
  std::int64_t axis() const { return axis_; }
  const std::vector<float>& channel_min() const { return min_; }
  const std::vector<float>& channel_max() const { return max_; }

  Range range(const QuantScheme&) const override {
    if (min_.empty()) return Range{{0.0f}, {0.0f}, axis_};
    return Range{min_, max_, axis_};
  }

 protected:
  void update(const Tensor& t, float, float) override {
    auto rank = static_cast<std::int64_t>(t.rank());
    std::int64_t axis = axis_ < 0 ? axis_ + rank : axis_;
    if (axis < 0 || axis >= rank)
      throw Error("per-channel axis " + std::to_string(axis_) + " is out of range for tensor '" + name() +
                  "' of shape " + dims_str(t.dims()));
    if (rank_ >= 0 && (rank != rank_ || t.dims()[axis] != static_cast<std::int64_t>(min_.size())))
      throw Error("tensor '" + name() + "' of shape " + dims_str(t.dims()) + " does not match the " +
                  std::to_string(min_.size()) + " channels (rank " + std::to_string(rank_) + ") seen before");
    auto s = detail::split_axis(t.dims(), axis, static_cast<std::size_t>(t.dims()[axis]), "tensor '" + name() + "'");
    if (rank_ < 0) {
      rank_ = rank;
      axis_ = axis;
      min_.assign(static_cast<std::size_t>(s.channels), std::numeric_limits<float>::infinity());
      max_.assign(static_cast<std::size_t>(s.channels), -std::numeric_limits<float>::infinity());
    }
    const float* p = t.data<float>();
    std::size_t i = 0;
    for (std::int64_t o = 0; o < s.outer; ++o)
      for (std::int64_t c = 0; c < s.channels; ++c) {
        float mn = min_[c], mx = max_[c];
        for (std::int64_t k = 0; k < s.inner; ++k, ++i) {
          mn = std::min(mn, p[i]);
          mx = std::max(mx, p[i]);
        }
        min_[c] = mn;
        max_[c] = mx;
      }
  }

 private:
  std::int64_t axis_;
  std::int64_t rank_ = -1;
  std::vector<float> min_, max_;
};

// A histogram of a fixed number of bins whose range grows as data arrives, and always has 0 on a bin
// edge (so it folds exactly into a histogram of |x|).
//
// The range is [first * width, (first + bins) * width] with `first` an integer <= 0. When new data
// falls outside, the width is multiplied by the smallest power of two 2^k that makes the range cover
// old and new data; every old bin then lies inside exactly one new bin (edges stay multiples of the old
// width), so re-binning moves whole counts and loses none. Values at the outer edge go to the last bin.
// Until a non-zero value arrives the width is unknown and zeros are only counted.
class Histogram {
 public:
  explicit Histogram(std::size_t bins = 2048) : bins_(bins) {
    if (bins < 2) throw Error("a histogram needs at least 2 bins, got " + std::to_string(bins));
  }

  std::size_t bins() const { return bins_; }
  // True until the first non-zero value (counts() is empty then).
  bool empty_range() const { return counts_.empty(); }
  double width() const { return width_; }
  std::int64_t first() const { return first_; }
  double lower() const { return static_cast<double>(first_) * width_; }
  double upper() const { return static_cast<double>(first_ + static_cast<std::int64_t>(bins_)) * width_; }
  double edge(std::size_t i) const { return static_cast<double>(first_ + static_cast<std::int64_t>(i)) * width_; }
  const std::vector<std::uint64_t>& counts() const { return counts_; }
  std::uint64_t total() const { return total_; }

  // Adds n values whose min and max are known (the caller has checked that they are finite).
  void add(const float* data, std::size_t n, float mn, float mx) {
    if (n == 0) return;
    if (counts_.empty()) {
      if (mn == 0.0f && mx == 0.0f) {
        pending_zeros_ += n;
        total_ += n;
        return;
      }
      init(mn, mx);
    } else {
      grow(mn, mx);
    }
    const double inv = 1.0 / width_;
    const auto last = static_cast<std::int64_t>(bins_) - 1;
    for (std::size_t i = 0; i < n; ++i) {
      auto b = static_cast<std::int64_t>(std::floor(static_cast<double>(data[i]) * inv)) - first_;
      ++counts_[static_cast<std::size_t>(std::clamp<std::int64_t>(b, 0, last))];
    }
    total_ += n;
  }

  // The histogram of |x|: bin i covers [i * width, (i + 1) * width]. Exact because 0 is an edge.
  std::vector<std::uint64_t> abs_counts() const {
    if (counts_.empty()) return {};
    std::int64_t pos = first_ + static_cast<std::int64_t>(bins_);
    std::vector<std::uint64_t> out(static_cast<std::size_t>(std::max(-first_, pos)), 0);
    for (std::size_t i = 0; i < bins_; ++i) {
      std::int64_t e = first_ + static_cast<std::int64_t>(i);  // bin [e, e + 1) in units of width
      out[static_cast<std::size_t>(e >= 0 ? e : -e - 1)] += counts_[i];
    }
    return out;
  }

 private:
  void init(float mn, float mx) {
    double lo = std::min(0.0, static_cast<double>(mn)), hi = std::max(0.0, static_cast<double>(mx));
    // bins - 1 bins span the data, so flooring `first` to an integer still leaves the top covered.
    width_ = (hi - lo) / static_cast<double>(bins_ - 1);
    first_ = static_cast<std::int64_t>(std::floor(lo / width_));
    counts_.assign(bins_, 0);
    // Zeros seen before lie on the edge 0: the bin starting there (the last bin if 0 is the top).
    std::int64_t zero_bin = std::min<std::int64_t>(-first_, static_cast<std::int64_t>(bins_) - 1);
    counts_[static_cast<std::size_t>(zero_bin)] += pending_zeros_;
    pending_zeros_ = 0;
  }

  void grow(float mn, float mx) {
    auto n = static_cast<double>(bins_);
    double a = static_cast<double>(first_), b = a + n;  // current range in units of the width
    double need_lo = std::min(a, std::floor(static_cast<double>(mn) / width_));
    double need_hi = std::max(b, std::ceil(static_cast<double>(mx) / width_));
    if (need_lo >= a && need_hi <= b) return;
    double f = 2.0, lo_f = 0, hi_f = 0;
    for (;; f *= 2.0) {  // at most ~2100 doublings between the smallest and largest floats
      lo_f = std::floor(need_lo / f);
      hi_f = std::ceil(need_hi / f);
      if (hi_f - lo_f <= n) break;
    }
    // Spare bins go to the side(s) the data grew towards: it is likely to grow there again.
    auto spare = static_cast<std::int64_t>(n - (hi_f - lo_f));
    bool grew_lo = need_lo < a, grew_hi = need_hi > b;
    auto first = static_cast<std::int64_t>(lo_f);
    if (grew_lo && !grew_hi) first -= spare;
    else if (grew_lo && grew_hi) first -= spare / 2;
    std::vector<std::uint64_t> merged(bins_, 0);
    for (std::size_t i = 0; i < bins_; ++i) {
      if (!counts_[i]) continue;
      double e = a + static_cast<double>(i);
      auto j = static_cast<std::int64_t>(std::floor(e / f)) - first;
      merged[static_cast<std::size_t>(j)] += counts_[i];
    }
    counts_ = std::move(merged);
    first_ = first;
    width_ *= f;
  }

  std::size_t bins_;
  std::vector<std::uint64_t> counts_;
  double width_ = 0.0;
  std::int64_t first_ = 0;
  std::uint64_t total_ = 0, pending_zeros_ = 0;
};

// How a HistogramObserver picks its range from the histogram.
enum class HistogramMethod {
  Percentile,  // clip the given percentile of the mass (of |x| when symmetric, both tails otherwise)
  Entropy,     // the |x| threshold whose quantized distribution is closest in KL divergence (TensorRT)
  Mse,         // the range minimising the expected squared quantization error, clipping included
};

struct HistogramOptions {
  HistogramMethod method = HistogramMethod::Percentile;
  std::size_t bins = 2048;
  double percentile = 99.999;  // for Percentile: the share of values kept, in percent (0, 100]
  // Entropy and Mse try at most this many candidate ranges (evenly spaced), bounding their cost to
  // about candidates * bins operations per tensor.
  std::size_t max_candidates = 512;
};

// Collects a Histogram and selects the range by percentile, entropy or MSE. The chosen range never
// exceeds the observed [min, max].
//
// Entropy works on |x| and gives [-t, t] (or [0, t] when nothing negative was seen) for the threshold t
// minimising KL(P || Q), where P is the histogram up to t with the mass beyond folded into its last
// bin, and Q is the same bins merged into as many groups as the scheme has levels over [0, t] and
// spread back evenly over their non-empty bins (Migacz, "8-bit Inference with TensorRT", 2017).
// Mse evaluates the squared error of fake-quantizing each bin's centre, weighted by its count, for
// candidates t = k * width (symmetric schemes) or for ranges trimmed bin by bin from the sparser end
// (asymmetric schemes; PyTorch's HistogramObserver searches the same way).
class HistogramObserver : public Observer {
 public:
  explicit HistogramObserver(std::string name, HistogramOptions options = {})
      : Observer(std::move(name)), options_(options), hist_(options.bins) {
    if (!(options.percentile > 0.0 && options.percentile <= 100.0))
      throw Error("percentile must be in (0, 100], got " + detail::fmt_float(options.percentile));
    if (options.max_candidates < 2) throw Error("max_candidates must be at least 2");
  }
  const HistogramOptions& options() const { return options_; }
  const Histogram& histogram() const { return hist_; }

  Range range(const QuantScheme& scheme) const override {
    float mn = observed_min(), mx = observed_max();
    if (hist_.empty_range()) return per_tensor(mn, mx);  // no data, or only zeros
    std::pair<double, double> r;
    switch (options_.method) {
      case HistogramMethod::Percentile: r = percentile_range(scheme); break;
      case HistogramMethod::Entropy: r = entropy_range(scheme); break;
      case HistogramMethod::Mse: r = mse_range(scheme); break;
    }
    // Never wider than the data (bin edges overshoot it), never inverted.
    auto lo = static_cast<float>(std::clamp(r.first, static_cast<double>(mn), static_cast<double>(mx)));
    auto hi = static_cast<float>(std::clamp(r.second, static_cast<double>(mn), static_cast<double>(mx)));
    return per_tensor(std::min(lo, hi), std::max(lo, hi));
  }

 protected:
  void update(const Tensor& t, float mn, float mx) override {
    hist_.add(t.data<float>(), static_cast<std::size_t>(t.numel()), mn, mx);
  }

 private:
  double abs_max() const { return std::max(std::fabs(static_cast<double>(observed_min())), std::fabs(static_cast<double>(observed_max()))); }
  // [-t, t], or [0, t] when the data has no negative value.
  std::pair<double, double> magnitude_range(double t) const { return {observed_min() < 0.0f ? -t : 0.0, t}; }

  std::pair<double, double> percentile_range(const QuantScheme& scheme) const {
    const double keep = options_.percentile / 100.0;
    auto total = static_cast<double>(hist_.total());
    if (scheme.symmetric) {
      auto h = hist_.abs_counts();
      double cum = 0.0;
      for (std::size_t i = 0; i < h.size(); ++i) {
        cum += static_cast<double>(h[i]);
        if (cum >= keep * total) return magnitude_range(static_cast<double>(i + 1) * hist_.width());
      }
      return magnitude_range(abs_max());
    }
    // Both tails: cut (1 - keep) / 2 of the mass on each side, at the outer edges of the bins holding
    // those quantiles.
    const auto& c = hist_.counts();
    const double cut = (1.0 - keep) / 2.0 * total;
    double lo = observed_min(), hi = observed_max(), cum = 0.0;
    for (std::size_t i = 0; i < c.size(); ++i) {
      cum += static_cast<double>(c[i]);
      if (cum > cut) {
        lo = hist_.edge(i);
        break;
      }
    }
    cum = 0.0;
    for (std::size_t i = c.size(); i-- > 0;) {
      cum += static_cast<double>(c[i]);
      if (cum > cut) {
        hi = hist_.edge(i + 1);
        break;
      }
    }
    return {lo, hi};
  }

  // Levels available over [0, t]: all of them for non-negative data in an asymmetric scheme, else half.
  std::size_t magnitude_levels(const QuantScheme& scheme) const {
    auto [qmin, qmax] = quant_bounds(scheme);
    auto levels = static_cast<std::size_t>(qmax - qmin + 1);
    return (!scheme.symmetric && observed_min() >= 0.0f) ? levels : levels / 2;
  }

  std::pair<double, double> entropy_range(const QuantScheme& scheme) const {
    auto h = hist_.abs_counts();
    const std::size_t nq = magnitude_levels(scheme), m = h.size();
    if (m <= nq) return magnitude_range(abs_max());  // fewer bins than levels: nothing to gain by clipping
    std::vector<double> suffix(m + 1, 0.0);  // suffix[i] = mass in bins i..m-1
    for (std::size_t i = m; i-- > 0;) suffix[i] = suffix[i + 1] + static_cast<double>(h[i]);
    const std::size_t step = std::max<std::size_t>(1, (m - nq + options_.max_candidates - 1) / options_.max_candidates);
    std::vector<double> p, q;
    double best_kl = std::numeric_limits<double>::infinity();
    std::size_t best_i = m;
    for (std::size_t i = m;; i = i > nq + step ? i - step : nq) {  // from the full range down to nq bins
      double kl = kl_divergence(h, suffix[i], i, nq, p, q);
      if (kl < best_kl) {  // strict: among equals keep the widest (found first)
        best_kl = kl;
        best_i = i;
      }
      if (i == nq) break;
    }
    return magnitude_range(static_cast<double>(best_i) * hist_.width());
  }

  // KL(P || Q) for the threshold of i bins (see the class comment), with MXNet's/ONNX Runtime's
  // smoothing so that an empty Q bin under a non-empty P bin gives a large finite divergence.
  static double kl_divergence(const std::vector<std::uint64_t>& h, double outliers, std::size_t i, std::size_t nq,
                          std::vector<double>& p, std::vector<double>& q) {
    p.assign(i, 0.0);
    q.assign(i, 0.0);
    for (std::size_t j = 0; j < i; ++j) p[j] = static_cast<double>(h[j]);
    p[i - 1] += outliers;
    for (std::size_t g = 0; g < nq; ++g) {  // group g: bins [g*i/nq, (g+1)*i/nq), never empty as i >= nq
      std::size_t b0 = g * i / nq, b1 = (g + 1) * i / nq;
      double sum = 0.0;
      std::size_t nonzero = 0;
      for (std::size_t j = b0; j < b1; ++j) {
        sum += static_cast<double>(h[j]);
        nonzero += p[j] != 0.0;
      }
      if (nonzero)
        for (std::size_t j = b0; j < b1; ++j) q[j] = p[j] != 0.0 ? sum / static_cast<double>(nonzero) : 0.0;
    }
    if (!smooth(p) || !smooth(q)) return std::numeric_limits<double>::infinity();
    double sp = 0.0, sq = 0.0, kl = 0.0;
    for (std::size_t j = 0; j < i; ++j) {
      sp += p[j];
      sq += q[j];
    }
    for (std::size_t j = 0; j < i; ++j) {
      double pj = p[j] / sp, qj = q[j] / sq;
      if (pj > 0.0) kl += pj * std::log(pj / qj);
    }
    return kl;
  }
  // Moves eps of mass onto every empty bin, taken evenly from the others. False when all are empty.
  static bool smooth(std::vector<double>& d) {
    constexpr double eps = 1e-4;
    std::size_t zeros = 0;
    for (double v : d) zeros += v == 0.0;
    if (zeros == d.size()) return false;
    double eps1 = eps * static_cast<double>(zeros) / static_cast<double>(d.size() - zeros);
    for (double& v : d) v = v == 0.0 ? eps : std::max(v - eps1, eps * 1e-3);
    return true;
  }

  // Expected squared error of fake-quantizing the histogram (bin centres) with the range [lo, hi].
  double quant_error(const std::vector<std::pair<double, double>>& centres, double lo, double hi,
                     const QuantScheme& scheme) const {
    float scale;
    std::int32_t zp;
    compute_scale_zero_point(static_cast<float>(lo), static_cast<float>(hi), scheme, scale, zp);
    double err = 0.0;
    for (auto& [x, n] : centres) {
      double d = x - static_cast<double>(fake_quantize_value(static_cast<float>(x), scale, zp, scheme.dtype));
      err += n * d * d;
    }
    return err;
  }

  std::pair<double, double> mse_range(const QuantScheme& scheme) const {
    const auto& c = hist_.counts();
    const double w = hist_.width();
    const double mn = observed_min(), mx = observed_max();
    std::vector<std::pair<double, double>> centres;  // (centre, count) of the non-empty bins
    for (std::size_t i = 0; i < c.size(); ++i)
      if (c[i]) centres.emplace_back(std::clamp(hist_.edge(i) + w / 2, mn, mx), static_cast<double>(c[i]));
    std::pair<double, double> best{mn, mx};
    double best_err = quant_error(centres, mn, mx, scheme);  // MinMax is always a candidate
    auto consider = [&](double lo, double hi) {
      double e = quant_error(centres, lo, hi, scheme);
      if (e < best_err) {
        best_err = e;
        best = {lo, hi};
      }
    };
    if (scheme.symmetric) {
      double amax = abs_max();
      auto k_max = static_cast<std::size_t>(std::ceil(amax / w));
      std::size_t step = std::max<std::size_t>(1, k_max / options_.max_candidates);
      for (std::size_t k = k_max; k >= 1; k = k > step ? k - step : 0) {
        double t = std::min(static_cast<double>(k) * w, amax);
        consider(mn < 0.0 ? -t : 0.0, t);
        if (k <= step) break;
      }
      return best;
    }
    // Trim one bin at a time from the end whose outermost bin holds less mass, never past 0.
    std::size_t l = 0, r = c.size() - 1;
    while (l < r && !c[l]) ++l;
    while (r > l && !c[r]) --r;
    const auto zero_bin = static_cast<std::size_t>(-hist_.first());  // edge(zero_bin) == 0
    std::size_t steps = r - l, step = std::max<std::size_t>(1, steps / options_.max_candidates), done = 0;
    while (true) {
      bool can_left = l + 1 <= zero_bin && l + 1 <= r, can_right = r >= zero_bin && r > l;
      if (!can_left && !can_right) break;
      bool left = can_left && (!can_right || c[l] < c[r] || (c[l] == c[r] && -hist_.edge(l) >= hist_.edge(r + 1)));
      if (left) ++l;
      else --r;
      if (++done % step == 0) consider(std::max(hist_.edge(l), mn), std::min(hist_.edge(r + 1), mx));
    }
    return best;
  }

  HistogramOptions options_;
  Histogram hist_;
};

// --- choosing an observer by name (for options and the command line) -----------------------------

enum class RangeMethod { MinMax, MovingAverage, Percentile, Entropy, Mse };

inline const char* range_method_name(RangeMethod m) {
  switch (m) {
    case RangeMethod::MinMax: return "minmax";
    case RangeMethod::MovingAverage: return "moving-average";
    case RangeMethod::Percentile: return "percentile";
    case RangeMethod::Entropy: return "entropy";
    case RangeMethod::Mse: return "mse";
  }
  return "?";
}

inline RangeMethod parse_range_method(const std::string& s) {
  for (RangeMethod m : {RangeMethod::MinMax, RangeMethod::MovingAverage, RangeMethod::Percentile,
                        RangeMethod::Entropy, RangeMethod::Mse})
    if (s == range_method_name(m)) return m;
  throw Error("unknown range method '" + s + "' (expected minmax, moving-average, percentile, entropy or mse)");
}

// Which observer to make, and its settings.
struct ObserverConfig {
  RangeMethod method = RangeMethod::MinMax;
  std::optional<std::int64_t> axis;  // per-channel (MinMax only)
  float momentum = 0.01f;            // MovingAverage
  std::size_t bins = 2048;           // histogram methods
  double percentile = 99.999;        // Percentile
  std::size_t max_candidates = 512;  // Entropy, Mse
};

inline std::unique_ptr<Observer> make_observer(std::string name, const ObserverConfig& c) {
  if (c.axis && c.method != RangeMethod::MinMax)
    throw Error("per-channel observation supports the minmax method only, not " +
                std::string(range_method_name(c.method)));
  switch (c.method) {
    case RangeMethod::MinMax:
      if (c.axis) return std::make_unique<PerChannelMinMaxObserver>(std::move(name), *c.axis);
      return std::make_unique<MinMaxObserver>(std::move(name));
    case RangeMethod::MovingAverage: return std::make_unique<MovingAverageMinMaxObserver>(std::move(name), c.momentum);
    case RangeMethod::Percentile:
    case RangeMethod::Entropy:
    case RangeMethod::Mse: {
      HistogramOptions o;
      o.method = c.method == RangeMethod::Percentile ? HistogramMethod::Percentile
                 : c.method == RangeMethod::Entropy  ? HistogramMethod::Entropy
                                                     : HistogramMethod::Mse;
      o.bins = c.bins;
      o.percentile = c.percentile;
      o.max_candidates = c.max_candidates;
      return std::make_unique<HistogramObserver>(std::move(name), o);
    }
  }
  throw Error("unknown range method");
}

}  // namespace ondine::quant
