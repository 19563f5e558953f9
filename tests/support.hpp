// tests/support.hpp - what several test files share: seeded random data, the relative error checks use, and
// the example models scripts/make_models.py writes (models/, not in the repository).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ondine/ir/graph.hpp"
#include "ondine/quant/calibration.hpp"
#if __has_include("ondine/onnx/import.hpp")
#include "ondine/onnx/import.hpp"
#endif

namespace ondine::test {

// float32 tensor of N(0, scale) values.
inline Tensor random_tensor(std::vector<std::int64_t> dims, std::mt19937& rng, float scale = 1.0f) {
  Tensor t(DType::Float32, std::move(dims));
  std::normal_distribution<float> n(0.0f, scale);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
  return t;
}

// float32 tensor of U(lo, hi) values from its own seed.
inline Tensor uniform_tensor(const std::vector<std::int64_t>& dims, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  Tensor t(DType::Float32, dims);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// Largest |a - b| over max |b|; `b` must be a real output (max |b| > 0.05), so no check passes vacuously.
inline double rel_error(const Tensor& a, const Tensor& b) {
  REQUIRE(a.dims() == b.dims());
  auto x = a.to_floats(), y = b.to_floats();
  double err = 0, mag = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(x[i] - y[i])));
    mag = std::max(mag, static_cast<double>(std::fabs(y[i])));
  }
  REQUIRE(mag > 0.05);
  return err / mag;
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

#if __has_include("ondine/onnx/import.hpp")
// models/<file> imported, or nullopt with a warning when it has not been generated (the tests that use
// it then skip: scripts/make_models.py --out models writes it).
inline std::optional<Graph> example_model(const std::string& file) {
  std::string path = std::string(ONDINE_TEST_DATA_DIR) + "/../../models/" + file;
  if (!std::ifstream(path)) {
    WARN("skipped: models/" << file << " not found (scripts/make_models.py --out models writes it)");
    return std::nullopt;
  }
  return onnx::load_model(path);
}
#endif

}  // namespace ondine::test
