// SPDX-License-Identifier: Apache-2.0
// ondine/reference/random.hpp - seeded kernels of the random ops: RandomUniform, RandomNormal,
// RandomUniformLike, RandomNormalLike, Bernoulli and Multinomial.
//
// Seeding (the contract users can rely on): with a `seed` attribute the output is a pure function of
// the seed, the op's attributes and the output shape - the same values on every run, in the reference
// executor and in the compiled engine (which runs these kernels as reference steps), on every platform:
// the generator is std::mt19937_64, whose sequence the C++ standard fixes, seeded with the seed's
// float32 bits, and the distributions are computed here rather than by the standard library's (whose
// algorithms differ between implementations). Uniform values are the generator's top 53 bits scaled to
// [0, 1); normal values use Box-Muller on two of them. Without `seed` each run draws a fresh seed from
// std::random_device, as ONNX asks ("if not specified, we will auto generate one").
//
// No seed reproduces another runtime's numbers (ONNX Runtime, numpy): the backend suite's cases of these
// ops are listed in the conformance exceptions files for that reason. The fold-constants pass never
// folds these ops (passes/fold_constants.hpp), so a compiled model keeps drawing at run time.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ondine/ir/infer/random.hpp"
#include "ondine/reference/common.hpp"
#include "ondine/reference/nn.hpp"

namespace ondine::reference {
namespace detail::random {

namespace spec = ::ondine::infer::detail_random;
using std::int64_t;

class Generator {
 public:
  explicit Generator(const Node& n) : engine_(seed_of(n)) {}
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]: log(u1) is finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
  }

 private:
  static std::uint64_t seed_of(const Node& n) {
    if (!n.has_attr("seed")) return (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
    const float seed = n.attr_float("seed");
    std::uint32_t bits = 0;
    std::memcpy(&bits, &seed, sizeof bits);
    return bits;
  }
  std::mt19937_64 engine_;
};

// `count` values of a uniform or normal distribution as the node's attributes set it.
inline std::vector<double> draw(const Node& n, int64_t count, bool normal) {
  Generator g(n);
  std::vector<double> v(static_cast<std::size_t>(count));
  if (normal) {
    const double mean = n.attr_float("mean", 0.0f), scale = n.attr_float("scale", 1.0f);
    for (double& x : v) x = mean + scale * g.normal();
  } else {
    const double lo = n.attr_float("low", 0.0f), hi = n.attr_float("high", 1.0f);
    if (!(lo <= hi)) throw n.error("low " + std::to_string(lo) + " is above high " + std::to_string(hi));
    for (double& x : v) x = lo + (hi - lo) * g.uniform();
  }
  return v;
}

inline std::vector<Tensor> random(const Node& n, const std::vector<Tensor>&) {
  const std::vector<int64_t> dims = n.attr_ints("shape");
  for (int64_t d : dims)
    if (d < 0) throw n.error("shape " + dims_str(dims) + " has a negative dim");
  const DType t = spec::random_dtype(n, DType::Float32);
  return {nn::from_doubles(t, dims, draw(n, nn::product(dims), n.op_type() == "RandomNormal"))};
}

inline std::vector<Tensor> random_like(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = nn::required(n, in, 0);
  const DType t = spec::random_dtype(n, x.dtype());
  return {nn::from_doubles(t, x.dims(), draw(n, x.numel(), n.op_type() == "RandomNormalLike"))};
}

// 1 with probability p (the input's element), else 0.
inline std::vector<Tensor> bernoulli(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& p = nn::required(n, in, 0);
  nn::require_floating(n, p, "input");
  const DType t = spec::random_dtype(n, p.dtype());
  const std::vector<double> pv = nn::to_doubles(p);
  Generator g(n);
  std::vector<double> out(pv.size());
  for (std::size_t i = 0; i < pv.size(); ++i) {
    if (!(pv[i] >= 0 && pv[i] <= 1))
      throw n.error("probability " + std::to_string(pv[i]) + " at flat index " + std::to_string(i) + " is outside [0, 1]");
    out[i] = g.uniform() < pv[i] ? 1.0 : 0.0;
  }
  return {nn::from_doubles(t, p.dims(), out)};
}

// sample_size class indices per batch row, drawn with probabilities softmax(row) (the input holds
// unnormalised log-probabilities).
inline std::vector<Tensor> multinomial(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = nn::required(n, in, 0);
  nn::require_floating(n, x, "input");
  if (x.rank() != 2 || x.dims()[1] == 0)
    throw n.error("input must be [batch_size, class_size] with class_size >= 1, got " + dims_str(x.dims()));
  const int64_t samples = n.attr_int("sample_size", 1);
  if (samples <= 0) throw n.error("sample_size must be positive, got " + std::to_string(samples));
  const DType t = spec::random_dtype(n, DType::Int32);
  const int64_t B = x.dims()[0], C = x.dims()[1];
  const std::vector<double> v = nn::to_doubles(x);
  Generator g(n);
  std::vector<double> out(static_cast<std::size_t>(B * samples));
  std::vector<double> cdf(static_cast<std::size_t>(C));
  for (int64_t b = 0; b < B; ++b) {
    const double* row = v.data() + b * C;
    double mx = row[0];
    for (int64_t c = 1; c < C; ++c) mx = std::max(mx, row[c]);
    double sum = 0;
    for (int64_t c = 0; c < C; ++c) cdf[static_cast<std::size_t>(c)] = sum += std::exp(row[c] - mx);
    for (int64_t s = 0; s < samples; ++s) {
      const double u = g.uniform() * sum;
      int64_t c = 0;
      while (c + 1 < C && cdf[static_cast<std::size_t>(c)] <= u) ++c;
      out[static_cast<std::size_t>(b * samples + s)] = static_cast<double>(c);
    }
  }
  return {nn::from_doubles(t, {B, samples}, out)};
}

}  // namespace detail::random

inline void register_random_kernels(KernelTable& t) {
  t["RandomUniform"] = detail::random::random;
  t["RandomNormal"] = detail::random::random;
  t["RandomUniformLike"] = detail::random::random_like;
  t["RandomNormalLike"] = detail::random::random_like;
  t["Bernoulli"] = detail::random::bernoulli;
  t["Multinomial"] = detail::random::multinomial;
}

}  // namespace ondine::reference
