// tests/support.hpp - seeded random data shared by the quantization tests.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "ondine/ir/graph.hpp"
#include "ondine/quant/calibration.hpp"

namespace ondine::test {

// float32 tensor of N(0, scale) values.
inline Tensor random_tensor(std::vector<std::int64_t> dims, std::mt19937& rng, float scale = 1.0f) {
  Tensor t(DType::Float32, std::move(dims));
  std::normal_distribution<float> n(0.0f, scale);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
  return t;
}

// `count` input maps for `g`, every graph input N(0, 1) at its static shape.
inline std::vector<quant::Sample> random_samples(const Graph& g, std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<quant::Sample> out;
  for (std::size_t i = 0; i < count; ++i) {
    quant::Sample s;
    for (Value* in : g.inputs()) s[in->name()] = random_tensor(in->shape().sizes(), rng);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace ondine::test
