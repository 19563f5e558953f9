// Tests of ondine/quant/metrics.hpp: max abs error, cosine similarity, SQNR against hand-computed values
// and at the edges (identical, all-zero, opposite, NaN, shape and dtype mismatches).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "ondine/quant/metrics.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_quant_metrics {

using namespace ondine;

namespace {
Tensor f32(std::vector<float> v) { return Tensor::from_vector<float>({static_cast<std::int64_t>(v.size())}, v); }
}  // namespace

TEST_CASE("metrics of a perturbed tensor match hand-computed values", "[quant][metrics]") {
  auto ref = f32({1, 2, 3, 4});
  auto test = f32({1.1f, 1.9f, 3.1f, 3.9f});
  auto m = quant::compare(ref, test);
  CHECK(m.elements == 4);
  CHECK(m.max_abs == Approx(0.1).epsilon(1e-5));
  // sum ref^2 = 30, sum noise^2 = 4 * 0.01 -> 10 log10(750)
  CHECK(m.sqnr_db == Approx(10 * std::log10(750.0)).epsilon(1e-4));
  double dot = 1.1 + 3.8 + 9.3 + 15.6, nt = std::sqrt(1.21 + 3.61 + 9.61 + 15.21);
  CHECK(m.cosine == Approx(dot / (std::sqrt(30.0) * nt)).epsilon(1e-6));
  CHECK(quant::max_abs(ref, test) == m.max_abs);
  CHECK(quant::cosine(ref, test) == m.cosine);
  CHECK(quant::sqnr_db(ref, test) == m.sqnr_db);
  // the raw-span overloads agree with the tensor ones
  CHECK(quant::sqnr_db(ref.data<float>(), test.data<float>(), 4) == m.sqnr_db);
  CHECK(quant::cosine(ref.data<float>(), test.data<float>(), 4) == m.cosine);
  CHECK(quant::max_abs(ref.data<float>(), test.data<float>(), 4) == m.max_abs);
}

TEST_CASE("metrics: scale, sign and the all-zero edges", "[quant][metrics]") {
  auto ref = f32({1, -2, 3, 0.5f});
  SECTION("identical: no error, cosine 1, SQNR +inf") {
    auto m = quant::compare(ref, ref);
    CHECK(m.max_abs == 0);
    CHECK(m.cosine == Approx(1.0));
    CHECK(std::isinf(m.sqnr_db));
    CHECK(m.sqnr_db > 0);
  }
  SECTION("twice the reference: cosine 1 but the noise equals the signal, 0 dB") {
    auto m = quant::compare(ref, f32({2, -4, 6, 1}));
    CHECK(m.cosine == Approx(1.0));
    CHECK(m.sqnr_db == Approx(0.0).margin(1e-9));
    CHECK(m.max_abs == Approx(3.0));
  }
  SECTION("negated: cosine -1") {
    CHECK(quant::cosine(ref, f32({-1, 2, -3, -0.5f})) == Approx(-1.0));
  }
  SECTION("both zero: cosine 1, SQNR +inf; zero reference only: cosine 0, SQNR -inf") {
    auto zero = f32({0, 0, 0, 0});
    CHECK(quant::cosine(zero, zero) == 1.0);
    CHECK(quant::sqnr_db(zero, zero) == std::numeric_limits<double>::infinity());
    CHECK(quant::cosine(zero, ref) == 0.0);
    CHECK(quant::sqnr_db(zero, ref) == -std::numeric_limits<double>::infinity());
    CHECK(quant::cosine(ref, zero) == 0.0);
    CHECK(quant::sqnr_db(ref, zero) == Approx(0.0).margin(1e-9));  // all noise, as strong as the signal
  }
  SECTION("a NaN makes every metric NaN rather than a plausible number") {
    auto m = quant::compare(ref, f32({1, std::nanf(""), 3, 0.5f}));
    CHECK(std::isnan(m.max_abs));
    CHECK(std::isnan(m.cosine));
    CHECK(std::isnan(m.sqnr_db));
  }
  SECTION("empty tensors compare as identical") {
    auto m = quant::compare(Tensor(DType::Float32, {0}), Tensor(DType::Float32, {0}));
    CHECK(m.elements == 0);
    CHECK(m.cosine == 1.0);
    CHECK(std::isinf(m.sqnr_db));
  }
}

TEST_CASE("metrics: mixed floating dtypes compare, mismatches throw", "[quant][metrics][bad-input]") {
  auto ref = f32({1, 2, 3, 4});
  auto d = Tensor::from_vector<double>({4}, {1.0, 2.0, 3.0, 4.5});
  auto m = quant::compare(ref, d);
  CHECK(m.max_abs == Approx(0.5));
  CHECK(m.sqnr_db == Approx(10 * std::log10(30.0 / 0.25)).epsilon(1e-6));
  CHECK_THROWS_WITH(quant::compare(ref, f32({1, 2, 3})), Catch::Contains("shapes differ"));
  CHECK_THROWS_WITH(quant::compare(ref, Tensor::from_vector<std::int32_t>({4}, {1, 2, 3, 4})),
                    Catch::Contains("floating tensors expected"));
}

TEST_CASE("SQNR tracks the bit width of a uniform quantizer", "[quant][metrics]") {
  // Rounding a full-range uniform signal to a grid of step s adds noise of variance s^2/12: each bit
  // adds ~6.02 dB. A check that the formula measures what quantization does.
  std::vector<float> x(4096);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = -1.0f + 2.0f * (static_cast<float>(i) + 0.5f) / 4096.0f;
  auto ref = f32(x);
  double prev = 0;
  for (int bits : {4, 6, 8}) {
    float step = 2.0f / static_cast<float>((1 << bits) - 1);
    std::vector<float> q(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) q[i] = std::round(x[i] / step) * step;
    double db = quant::sqnr_db(ref, f32(q));
    CHECK(db == Approx(6.02 * bits).margin(1.0));
    if (prev != 0) {
      CHECK(db - prev == Approx(12.04).margin(0.8));
    }
    prev = db;
  }
}

}  // namespace test_quant_metrics
