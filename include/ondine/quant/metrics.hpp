// SPDX-License-Identifier: Apache-2.0
// ondine/quant/metrics.hpp - how far a tensor is from a reference: the numbers used to judge a
// quantized (or otherwise approximated) model against its float original.
//
//   auto m = ondine::quant::compare(reference, test);   // same shape; any floating dtype
//   m.max_abs   max |test - reference|
//   m.cosine    <ref, test> / (|ref| |test|), in [-1, 1]; 1 when both are all zero, 0 when only one is
//   m.sqnr_db   10 log10(sum ref^2 / sum (ref - test)^2): signal-to-quantization-noise ratio in dB;
//               +inf when the two are identical, -inf when ref is all zero and test is not
//
// Sums are in double so a large tensor does not lose the small differences. The free functions take
// raw float spans too (max_abs(a, b, n), ...), for callers holding plain buffers.
// Rules of thumb for 8-bit quantization: SQNR above ~30 dB is harmless, below ~15 dB hurts accuracy.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <utility>

#include "ondine/error.hpp"
#include "ondine/ir/tensor.hpp"

namespace ondine::quant {

struct TensorMetrics {
  double max_abs = 0.0;
  double cosine = 1.0;
  double sqnr_db = std::numeric_limits<double>::infinity();
  std::size_t elements = 0;
};

namespace detail::metrics {

// One pass over both inputs; `at(i)` yields (reference, test) as doubles.
template <typename At>
TensorMetrics accumulate(std::size_t n, At&& at) {
  double max_abs = 0, dot = 0, ref2 = 0, test2 = 0, noise2 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    auto [r, t] = at(i);
    double d = t - r;
    if (std::isnan(d)) max_abs = std::numeric_limits<double>::quiet_NaN();
    else if (!std::isnan(max_abs)) max_abs = std::max(max_abs, std::abs(d));
    dot += r * t;
    ref2 += r * r;
    test2 += t * t;
    noise2 += d * d;
  }
  TensorMetrics m;
  m.elements = n;
  m.max_abs = max_abs;
  if (ref2 == 0 && test2 == 0) m.cosine = 1.0;
  else if (ref2 == 0 || test2 == 0) m.cosine = 0.0;
  else m.cosine = std::max(-1.0, std::min(1.0, dot / (std::sqrt(ref2) * std::sqrt(test2))));
  if (noise2 == 0) m.sqnr_db = std::numeric_limits<double>::infinity();
  else if (ref2 == 0) m.sqnr_db = -std::numeric_limits<double>::infinity();
  else m.sqnr_db = 10.0 * std::log10(ref2 / noise2);
  if (std::isnan(noise2)) m.cosine = m.sqnr_db = std::numeric_limits<double>::quiet_NaN();
  return m;
}

}  // namespace detail::metrics

// All three metrics of `test` against `reference` (raw float32 buffers of n elements).
inline TensorMetrics compare(const float* reference, const float* test, std::size_t n) {
  return detail::metrics::accumulate(n, [&](std::size_t i) {
    return std::pair<double, double>(reference[i], test[i]);
  });
}

// Tensors: same dims, floating dtypes (they may differ, e.g. float16 against float32).
inline TensorMetrics compare(const Tensor& reference, const Tensor& test) {
  if (reference.dims() != test.dims())
    throw Error("metrics: shapes differ, reference " + dims_str(reference.dims()) + " vs " + dims_str(test.dims()));
  if (!is_floating(reference.dtype()) || !is_floating(test.dtype()))
    throw Error("metrics: floating tensors expected, got " + std::string(dtype_name(reference.dtype())) + " and " +
                std::string(dtype_name(test.dtype())));
  auto n = static_cast<std::size_t>(reference.numel());
  if (reference.dtype() == DType::Float32 && test.dtype() == DType::Float32)
    return compare(reference.data<float>(), test.data<float>(), n);
  return detail::metrics::accumulate(n, [&](std::size_t i) {
    return std::pair<double, double>(reference.at_double(i), test.at_double(i));
  });
}

inline double max_abs(const float* reference, const float* test, std::size_t n) {
  return compare(reference, test, n).max_abs;
}
inline double cosine(const float* reference, const float* test, std::size_t n) {
  return compare(reference, test, n).cosine;
}
inline double sqnr_db(const float* reference, const float* test, std::size_t n) {
  return compare(reference, test, n).sqnr_db;
}
inline double max_abs(const Tensor& reference, const Tensor& test) { return compare(reference, test).max_abs; }
inline double cosine(const Tensor& reference, const Tensor& test) { return compare(reference, test).cosine; }
inline double sqnr_db(const Tensor& reference, const Tensor& test) { return compare(reference, test).sqnr_db; }

}  // namespace ondine::quant
