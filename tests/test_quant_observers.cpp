// Quantization parameters, the quantize/dequantize oracle, and the observers.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <random>

#include "ondine/quant/observers.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_quant_observers {

using namespace ondine;
using namespace ondine::quant;
using test::error_of;

namespace {
const QuantScheme kU8Asym{DType::UInt8, false, false};
const QuantScheme kI8Asym{DType::Int8, false, false};
const QuantScheme kI8Sym{DType::Int8, true, false};
const QuantScheme kU8Sym{DType::UInt8, true, false};

// Mean squared error of fake-quantizing `data` with `p` (per tensor).
double quant_mse(const std::vector<float>& data, const QuantParams& p) {
  double err = 0.0;
  for (float x : data) {
    double d = x - fake_quantize_value(x, p.scale[0], p.zero_point[0], p.dtype);
    err += d * d;
  }
  return err / static_cast<double>(data.size());
}

Tensor f32(std::vector<std::int64_t> dims, std::vector<float> v) { return Tensor::from_vector<float>(std::move(dims), v); }

// 1e6 N(0, 1) values in 10 batches, with one outlier at +60 in batch 3 and one at -60 in batch 7.
std::vector<std::vector<float>> gaussian_with_outliers(bool relu = false) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> batches(10, std::vector<float>(100000));
  for (auto& b : batches)
    for (float& x : b) x = relu ? std::max(0.0f, normal(rng)) : normal(rng);
  batches[3][17] = 60.0f;
  batches[7][99] = relu ? 55.0f : -60.0f;
  return batches;
}
}  // namespace

TEST_CASE("params for known ranges: int8/uint8, symmetric/asymmetric", "[quant]") {
  // [-1, 3]: asymmetric spreads 4 over 255 steps; symmetric takes |max| = 3.
  auto p = compute_params(-1.0f, 3.0f, kU8Asym);
  CHECK(p.scale[0] == static_cast<float>(4.0 / 255.0));
  CHECK(p.zero_point[0] == 64);  // round(1 / (4/255)) = round(63.75)
  CHECK(!p.per_channel());
  p = compute_params(-1.0f, 3.0f, kI8Asym);
  CHECK(p.scale[0] == static_cast<float>(4.0 / 255.0));
  CHECK(p.zero_point[0] == -64);  // round(-128 + 63.75)
  p = compute_params(-1.0f, 3.0f, kI8Sym);
  CHECK(p.scale[0] == static_cast<float>(3.0 / 127.0));
  CHECK(p.zero_point[0] == 0);
  p = compute_params(-1.0f, 3.0f, kU8Sym);
  CHECK(p.scale[0] == static_cast<float>(6.0 / 255.0));
  CHECK(p.zero_point[0] == 128);

  // The range is widened to include 0.
  p = compute_params(0.5f, 2.0f, kU8Asym);
  CHECK(p.scale[0] == static_cast<float>(2.0 / 255.0));
  CHECK(p.zero_point[0] == 0);
  p = compute_params(0.5f, 2.0f, kI8Asym);
  CHECK(p.zero_point[0] == -128);
  p = compute_params(-4.0f, -2.0f, kU8Asym);
  CHECK(p.scale[0] == static_cast<float>(4.0 / 255.0));
  CHECK(p.zero_point[0] == 255);
  p = compute_params(-4.0f, -2.0f, kI8Asym);
  CHECK(p.zero_point[0] == 127);

  // reduce_range: 7 bits.
  p = compute_params(0.0f, 1.27f, QuantScheme{DType::UInt8, false, true});
  CHECK(p.scale[0] == static_cast<float>(static_cast<double>(1.27f) / 127.0));
  CHECK(p.zero_point[0] == 0);
  p = compute_params(-6.4f, 3.0f, QuantScheme{DType::Int8, true, true});
  CHECK(p.scale[0] == static_cast<float>(2.0 * 6.4f / 128.0));
  CHECK(p.zero_point[0] == 0);

  // Zero is always exact, and the ends of the range come back within half a step.
  for (auto scheme : {kU8Asym, kI8Asym, kI8Sym, kU8Sym})
    for (auto [lo, hi] : {std::pair{-1.0f, 3.0f}, std::pair{0.5f, 2.0f}, std::pair{-4.0f, -2.0f}, std::pair{-7.3f, 0.01f}}) {
      auto q = compute_params(lo, hi, scheme);
      CHECK_NOTHROW(check_params(q));
      CHECK(fake_quantize_value(0.0f, q.scale[0], q.zero_point[0], q.dtype) == 0.0f);
      CHECK(std::fabs(fake_quantize_value(lo, q.scale[0], q.zero_point[0], q.dtype) - lo) <= q.scale[0] * 0.5001f);
      CHECK(std::fabs(fake_quantize_value(hi, q.scale[0], q.zero_point[0], q.dtype) - hi) <= q.scale[0] * 0.5001f);
    }
}

TEST_CASE("a zero range gives a safe scale, never 0, NaN or Inf", "[quant][bad-input]") {
  for (auto scheme : {kU8Asym, kI8Asym, kI8Sym, kU8Sym}) {
    auto p = compute_params(0.0f, 0.0f, scheme);
    CHECK(p.scale[0] == 1.0f);
    CHECK(p.zero_point[0] == (scheme.dtype == DType::UInt8 && scheme.symmetric ? 128 : 0));
    CHECK_NOTHROW(check_params(p));
    CHECK(quantize_value(0.0f, p.scale[0], p.zero_point[0], p.dtype) == p.zero_point[0]);
    // A denormal range underflows the scale: treated as zero.
    p = compute_params(0.0f, 1e-40f, scheme);
    CHECK(p.scale[0] == 1.0f);
    // The widest finite range still gives a finite scale.
    p = compute_params(-FLT_MAX, FLT_MAX, scheme);
    CHECK(std::isfinite(p.scale[0]));
    CHECK(p.scale[0] > 0.0f);
  }
  // Constant and all-zero tensors through the observers.
  MinMaxObserver constant("c");
  constant.observe(f32({4}, {5, 5, 5, 5}));
  auto p = constant.params(kU8Asym);
  CHECK(p.scale[0] == static_cast<float>(5.0 / 255.0));
  CHECK(p.zero_point[0] == 0);
  MinMaxObserver zeros("z");
  zeros.observe(f32({3}, {0, 0, 0}));
  CHECK(zeros.params(kI8Sym).scale[0] == 1.0f);
  HistogramObserver hz("hz");
  hz.observe(f32({3}, {0, 0, 0}));
  CHECK(hz.params(kU8Asym).scale[0] == 1.0f);
  // No data at all: the same safe params.
  MinMaxObserver none("none");
  CHECK(none.params(kI8Sym).scale[0] == 1.0f);

  CHECK(error_of([] { compute_params(std::nanf(""), 1.0f, kI8Sym); }).find("not finite") != std::string::npos);
  CHECK(error_of([] { compute_params(2.0f, 1.0f, kI8Sym); }).find("is empty") != std::string::npos);
  CHECK(error_of([] { compute_params(0.0f, 1.0f, QuantScheme{DType::Int32, true, false}); })
            .find("must be int8 or uint8") != std::string::npos);
  QuantParams bad = compute_params(-1.0f, 1.0f, kI8Sym);
  bad.scale[0] = 0.0f;
  CHECK(error_of([&] { check_params(bad, "w"); }).find("scale of 'w' is 0") != std::string::npos);
  bad.scale[0] = std::numeric_limits<float>::infinity();
  CHECK(error_of([&] { check_params(bad, "w"); }).find("positive and finite") != std::string::npos);
  bad.scale[0] = 1.0f;
  bad.zero_point[0] = 200;
  CHECK(error_of([&] { check_params(bad, "w"); }).find("outside int8") != std::string::npos);
}

TEST_CASE("quantize saturates, never wraps", "[quant]") {
  CHECK(quantize_value(100.0f, 0.1f, 0, DType::Int8) == 127);
  CHECK(quantize_value(-100.0f, 0.1f, 0, DType::Int8) == -128);
  CHECK(quantize_value(12.8f, 0.1f, 0, DType::Int8) == 127);
  CHECK(quantize_value(-5.0f, 0.1f, 10, DType::UInt8) == 0);
  CHECK(quantize_value(1e30f, 0.1f, 10, DType::UInt8) == 255);
  CHECK(quantize_value(1e30f, 1e-30f, 10, DType::UInt8) == 255);  // x / scale overflows to inf
  CHECK(quantize_value(std::numeric_limits<float>::infinity(), 1.0f, 0, DType::Int8) == 127);
  CHECK(quantize_value(-std::numeric_limits<float>::infinity(), 1.0f, 0, DType::Int8) == -128);
  CHECK(quantize_value(std::nanf(""), 1.0f, 7, DType::UInt8) == 7);
  CHECK(quantize_value(254.6f, 1.0f, 0, DType::UInt8) == 255);
  CHECK(quantize_value(255.6f, 1.0f, 0, DType::UInt8) == 255);

  // The tensor helper: out-of-range values clamp to the ends of the type.
  auto p = compute_params(-1.0f, 1.0f, kI8Sym);
  Tensor q = quantize(f32({5}, {-50, -1, 0, 1, 50}), p);
  REQUIRE(q.dtype() == DType::Int8);
  const std::int8_t* v = q.data<std::int8_t>();
  CHECK(std::vector<int>(v, v + 5) == std::vector<int>{-128, -127, 0, 127, 127});
  Tensor d = dequantize(q, p);
  CHECK(d.data<float>()[1] == Approx(-1.0f));
  CHECK(d.data<float>()[0] == Approx(-128.0f / 127.0f));
  auto pu = compute_params(-1.0f, 1.0f, kU8Asym);
  Tensor qu = quantize(f32({3}, {-9, 0, 9}), pu);
  REQUIRE(qu.dtype() == DType::UInt8);
  CHECK(static_cast<int>(qu.data<std::uint8_t>()[0]) == 0);
  CHECK(static_cast<int>(qu.data<std::uint8_t>()[1]) == pu.zero_point[0]);
  CHECK(static_cast<int>(qu.data<std::uint8_t>()[2]) == 255);
  CHECK(error_of([&] { dequantize(qu, p); }).find("tensor of uint8 with int8 params") != std::string::npos);
}

TEST_CASE("quantize rounds half to even, like ONNX QuantizeLinear", "[quant]") {
  CHECK(round_half_even(0.5f) == 0.0f);
  CHECK(round_half_even(1.5f) == 2.0f);
  CHECK(round_half_even(2.5f) == 2.0f);
  CHECK(round_half_even(3.5f) == 4.0f);
  CHECK(round_half_even(-0.5f) == 0.0f);
  CHECK(round_half_even(-2.5f) == -2.0f);
  CHECK(round_half_even(-3.5f) == -4.0f);
  CHECK(round_half_even(2.4999998f) == 2.0f);
  CHECK(round_half_even(2.5000002f) == 3.0f);
  CHECK(round_half_even(-7.0f) == -7.0f);
  CHECK(quantize_value(2.5f, 1.0f, 0, DType::Int8) == 2);
  CHECK(quantize_value(3.5f, 1.0f, 0, DType::Int8) == 4);
  CHECK(quantize_value(-2.5f, 1.0f, 0, DType::Int8) == -2);
  CHECK(quantize_value(1.25f, 0.5f, 3, DType::UInt8) == 5);  // 2.5 -> 2, + 3
  CHECK(quantize_value(1.75f, 0.5f, 3, DType::UInt8) == 7);  // 3.5 -> 4, + 3
  CHECK(quantize_value(-0.25f, 0.5f, -1, DType::Int8) == -1);  // -0.5 -> 0, - 1
}

TEST_CASE("quantize/dequantize round trip is within half a step inside the range", "[quant]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-2.0f, 5.0f);
  std::vector<float> v(1000);
  for (float& x : v) x = u(rng);
  for (auto scheme : {kU8Asym, kI8Asym, kI8Sym, kU8Sym}) {
    auto p = compute_params(-2.0f, 5.0f, scheme);
    Tensor back = fake_quantize(f32({1000}, v), p);
    for (std::size_t i = 0; i < v.size(); ++i) CHECK(std::fabs(back.data<float>()[i] - v[i]) <= p.scale[0] * 0.5001f);
  }
}

TEST_CASE("per-channel min/max and params", "[quant]") {
  // [3, 2, 2], channels along axis 0; the middle one is all zeros. No value sits on a rounding tie.
  Tensor w = f32({3, 2, 2}, {-0.9f, 2, 0.5f, 1.1f, /**/ 0, 0, 0, 0, /**/ -8, 4.2f, 1, 2});
  PerChannelMinMaxObserver obs("w", 0);
  obs.observe(w);
  CHECK(obs.channel_min() == std::vector<float>{-0.9f, 0, -8});
  CHECK(obs.channel_max() == std::vector<float>{2, 0, 4.2f});
  CHECK(obs.observed_min() == -8.0f);
  CHECK(obs.observed_max() == 4.2f);
  auto p = obs.params(kI8Sym);
  REQUIRE(p.per_channel());
  CHECK(*p.axis == 0);
  CHECK(p.scale == std::vector<float>{static_cast<float>(2.0 / 127), 1.0f, static_cast<float>(8.0 / 127)});
  CHECK(p.zero_point == std::vector<std::int32_t>{0, 0, 0});

  // The same tensor per channel along the last axis (negative axis), fed twice.
  PerChannelMinMaxObserver last("w", -1);
  last.observe(w);
  last.observe(f32({3, 2, 2}, {0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  CHECK(last.axis() == 2);
  CHECK(last.channel_min() == std::vector<float>{-8, 0});
  CHECK(last.channel_max() == std::vector<float>{1, 9});

  // Quantize per channel: each channel uses its own scale.
  Tensor q = quantize(w, p);
  const std::int8_t* v = q.data<std::int8_t>();
  CHECK(std::vector<int>(v, v + 12) == std::vector<int>{-57, 127, 32, 70, 0, 0, 0, 0, -127, 67, 16, 32});
  Tensor back = dequantize(q, p);
  for (std::size_t i = 0; i < 12; ++i) CHECK(std::fabs(back.data<float>()[i] - w.data<float>()[i]) <= 8.0f / 127 * 0.5f);

  CHECK(error_of([&] { obs.observe(f32({2, 2}, {1, 2, 3, 4})); }).find("does not match the 3 channels") != std::string::npos);
  PerChannelMinMaxObserver bad_axis("w", 3);
  CHECK(error_of([&] { bad_axis.observe(w); }).find("axis 3 is out of range for tensor 'w'") != std::string::npos);
  QuantParams two = p;
  two.scale.pop_back();
  two.zero_point.pop_back();
  CHECK(error_of([&] { quantize(w, two); }).find("3 channels along axis 0 but 2 scales") != std::string::npos);
  CHECK(error_of([] { make_observer("x", ObserverConfig{RangeMethod::Entropy, 0}); }).find("minmax method only") !=
        std::string::npos);
}

TEST_CASE("moving-average min/max", "[quant]") {
  MovingAverageMinMaxObserver obs("a", 0.5f);
  obs.observe(f32({2}, {-1, 1}));
  auto r = obs.range(kU8Asym);
  CHECK(r.min[0] == -1.0f);
  CHECK(r.max[0] == 1.0f);
  obs.observe(f32({3}, {-3, 0, 5}));
  r = obs.range(kU8Asym);
  CHECK(r.min[0] == -2.0f);  // -1 + 0.5 * (-3 - -1)
  CHECK(r.max[0] == 3.0f);   // 1 + 0.5 * (5 - 1)
  obs.observe(f32({2}, {-2, 3}));
  r = obs.range(kU8Asym);
  CHECK(r.min[0] == -2.0f);
  CHECK(r.max[0] == 3.0f);
  CHECK(obs.observed_min() == -3.0f);  // the true extremes are kept too
  CHECK(obs.observed_max() == 5.0f);
  CHECK(obs.batches() == 3);
  CHECK(obs.count() == 7);
  auto p = obs.params(kU8Asym);
  CHECK(p.scale[0] == static_cast<float>(5.0 / 255));
  CHECK(error_of([] { MovingAverageMinMaxObserver("a", 0.0f); }).find("momentum") != std::string::npos);
  CHECK(error_of([] { MovingAverageMinMaxObserver("a", 1.5f); }).find("momentum") != std::string::npos);
}

TEST_CASE("NaN or Inf in observed data is an error naming the tensor", "[quant][bad-input]") {
  MinMaxObserver obs("conv1_out");
  obs.observe(f32({2}, {-1, 1}));
  std::string msg = error_of([&] { obs.observe(f32({3}, {0, std::nanf(""), 100})); });
  CHECK(msg.find("tensor 'conv1_out' contains NaN (element 1 of float32[3])") != std::string::npos);
  msg = error_of([&] { obs.observe(f32({2}, {0, -std::numeric_limits<float>::infinity()})); });
  CHECK(msg.find("'conv1_out' contains -Inf") != std::string::npos);
  // Nothing of the rejected tensors was recorded.
  CHECK(obs.observed_max() == 1.0f);
  CHECK(obs.batches() == 1);
  HistogramObserver h("h");
  CHECK(error_of([&] { h.observe(f32({1}, {std::numeric_limits<float>::infinity()})); }).find("'h' contains +Inf") !=
        std::string::npos);
  PerChannelMinMaxObserver pc("w", 0);
  CHECK(error_of([&] { pc.observe(f32({2, 1}, {1, std::nanf("")})); }).find("'w' contains NaN") != std::string::npos);
  CHECK(error_of([&] { obs.observe(Tensor::from_vector<double>({1}, {1.0})); })
            .find("observer for 'conv1_out' expects float32 data, got float64") != std::string::npos);
  obs.observe(Tensor(DType::Float32, {0, 3}));  // empty: ignored
  CHECK(obs.batches() == 1);
}

TEST_CASE("histogram re-binning keeps every count", "[quant][histogram]") {
  std::mt19937 rng(42);
  Histogram h(64);
  std::vector<float> all;
  auto feed = [&](std::vector<float> v) {
    float mn = *std::min_element(v.begin(), v.end()), mx = *std::max_element(v.begin(), v.end());
    h.add(v.data(), v.size(), mn, mx);
    all.insert(all.end(), v.begin(), v.end());
    std::uint64_t sum = 0;
    for (auto c : h.counts()) sum += c;
    CHECK(sum == all.size());
    CHECK(h.total() == all.size());
    CHECK(h.lower() <= std::min(0.0, static_cast<double>(*std::min_element(all.begin(), all.end()))));
    CHECK(h.upper() >= static_cast<double>(*std::max_element(all.begin(), all.end())));
  };
  h.add(nullptr, 0, 0, 0);
  std::vector<float> zeros(5, 0.0f);
  h.add(zeros.data(), zeros.size(), 0.0f, 0.0f);  // zeros before the width is known
  CHECK(h.empty_range());
  CHECK(h.total() == 5);
  all = zeros;
  std::uniform_real_distribution<float> u01(0.0f, 1.0f), wide(-5.0f, 3.0f), huge(-1000.0f, 40.0f);
  std::vector<float> v(500);
  for (float& x : v) x = u01(rng);
  feed(v);
  CHECK(h.first() == 0);  // non-negative data: no bin wasted below 0
  double w0 = h.width();
  for (float& x : v) x = wide(rng);
  feed(v);
  CHECK(h.width() > w0);
  for (float& x : v) x = huge(rng);
  feed(v);
  for (float& x : v) x = u01(rng) * 0.001f;  // inside the range: no growth
  double w1 = h.width();
  feed(v);
  CHECK(h.width() == w1);

  // Growth by powers of two keeps old bins nested in new ones: the result equals binning everything
  // once with the final edges.
  std::vector<std::uint64_t> direct(h.bins(), 0);
  for (float x : all) {
    auto b = static_cast<std::int64_t>(std::floor(static_cast<double>(x) / h.width())) - h.first();
    ++direct[static_cast<std::size_t>(std::clamp<std::int64_t>(b, 0, static_cast<std::int64_t>(h.bins()) - 1))];
  }
  CHECK(h.counts() == direct);
  // The |x| histogram folds exactly.
  auto a = h.abs_counts();
  std::uint64_t sum = 0;
  for (auto c : a) sum += c;
  CHECK(sum == all.size());
  CHECK(error_of([] { Histogram(1); }).find("at least 2 bins") != std::string::npos);
}

TEST_CASE("histogram methods clip outliers that MinMax keeps", "[quant][histogram]") {
  auto batches = gaussian_with_outliers();
  std::vector<float> all;
  for (auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  MinMaxObserver minmax("x");
  HistogramObserver pct("x", {HistogramMethod::Percentile, 2048, 99.99});
  HistogramObserver ent("x", {HistogramMethod::Entropy});
  HistogramObserver mse("x", {HistogramMethod::Mse});
  for (auto& b : batches) {
    Tensor t = f32({static_cast<std::int64_t>(b.size())}, b);
    for (Observer* o : std::initializer_list<Observer*>{&minmax, &pct, &ent, &mse}) o->observe(t);
  }
  CHECK(pct.histogram().total() == all.size());
  CHECK(pct.observed_max() == 60.0f);
  CHECK(pct.observed_min() == -60.0f);

  for (auto scheme : {kI8Sym, kU8Asym}) {
    INFO("scheme " << dtype_name(scheme.dtype) << (scheme.symmetric ? " symmetric" : " asymmetric"));
    auto mm = minmax.range(scheme);
    CHECK(mm.max[0] == 60.0f);
    auto rp = pct.range(scheme), re = ent.range(scheme), rm = mse.range(scheme);
    // 99.99% of N(0,1) lies within about 3.9; the histogram's bin edges add a little.
    CHECK(rp.max[0] > 3.0f);
    CHECK(rp.max[0] < 5.0f);
    CHECK(rp.min[0] < -3.0f);
    CHECK(rp.min[0] > -5.0f);
    // Entropy and MSE clip both outliers and at least halve the range. (MSE may keep part of the way
    // to one outlier: clipping 60 to 30 costs less squared error than the coarser steps of [-60, 60].)
    for (auto* r : {&re, &rm}) {
      CHECK(r->max[0] > 2.5f);
      CHECK(r->max[0] < 59.0f);
      CHECK(r->min[0] < -2.5f);
      CHECK(r->min[0] > -59.0f);
      CHECK(r->max[0] - r->min[0] < 60.0f);
    }
    CHECK(re.max[0] < 20.0f);
    // Minimising the MSE on the histogram lowers the real quantization MSE on the data.
    double e_minmax = quant_mse(all, minmax.params(scheme)), e_mse = quant_mse(all, mse.params(scheme));
    CHECK(e_mse < 0.6 * e_minmax);
    CHECK(quant_mse(all, pct.params(scheme)) < e_minmax);
    CHECK(quant_mse(all, ent.params(scheme)) < e_minmax);
  }
}

TEST_CASE("histogram methods on non-negative data give [0, t]", "[quant][histogram]") {
  auto batches = gaussian_with_outliers(/*relu=*/true);
  std::vector<float> all;
  MinMaxObserver minmax("r");
  HistogramObserver ent("r", {HistogramMethod::Entropy}), mse("r", {HistogramMethod::Mse}),
      pct("r", {HistogramMethod::Percentile, 2048, 99.99});
  for (auto& b : batches) {
    all.insert(all.end(), b.begin(), b.end());
    Tensor t = f32({static_cast<std::int64_t>(b.size())}, b);
    for (Observer* o : std::initializer_list<Observer*>{&minmax, &ent, &mse, &pct}) o->observe(t);
  }
  CHECK(ent.histogram().first() == 0);
  for (Observer* o : std::initializer_list<Observer*>{&ent, &mse, &pct}) {
    auto r = o->range(kU8Asym);
    CHECK(r.min[0] == 0.0f);
    CHECK(r.max[0] > 2.5f);
    CHECK(o->params(kU8Asym).zero_point[0] == 0);
  }
  CHECK(ent.range(kU8Asym).max[0] < 20.0f);
  CHECK(pct.range(kU8Asym).max[0] < 20.0f);
  // Here half the values are 0 and uint8 has 256 steps over [0, t]: the rounding noise MinMax pays
  // is smaller than the cost of clipping the outliers, and the MSE search agrees.
  CHECK(quant_mse(all, mse.params(kU8Asym)) <= quant_mse(all, minmax.params(kU8Asym)) * 1.01);
}

TEST_CASE("histogram percentile 100 and small data fall back to min/max", "[quant][histogram]") {
  HistogramObserver all_kept("x", {HistogramMethod::Percentile, 2048, 100.0});
  all_kept.observe(f32({5}, {-2, -1, 0, 1, 3}));
  auto r = all_kept.range(kU8Asym);
  CHECK(r.min[0] == -2.0f);
  CHECK(r.max[0] == 3.0f);
  r = all_kept.range(kI8Sym);
  CHECK(r.max[0] == 3.0f);
  // Entropy with fewer |x| bins than levels cannot gain by clipping.
  HistogramObserver ent("x", {HistogramMethod::Entropy, 64});
  ent.observe(f32({4}, {-2, 0.5f, 1, 3}));
  r = ent.range(kI8Sym);
  CHECK(r.min[0] == -2.0f);
  CHECK(r.max[0] == 3.0f);
  CHECK(error_of([] { HistogramObserver("x", {HistogramMethod::Percentile, 2048, 0.0}); }).find("percentile") !=
        std::string::npos);
}

TEST_CASE("observers by name", "[quant]") {
  CHECK(parse_range_method("entropy") == RangeMethod::Entropy);
  CHECK(parse_range_method("moving-average") == RangeMethod::MovingAverage);
  CHECK(error_of([] { parse_range_method("kl"); }).find("unknown range method 'kl'") != std::string::npos);
  ObserverConfig c;
  c.method = RangeMethod::Mse;
  c.bins = 128;
  auto o = make_observer("v", c);
  auto* h = dynamic_cast<HistogramObserver*>(o.get());
  REQUIRE(h);
  CHECK(h->options().method == HistogramMethod::Mse);
  CHECK(h->histogram().bins() == 128);
  c = ObserverConfig{};
  c.axis = 1;
  CHECK(dynamic_cast<PerChannelMinMaxObserver*>(make_observer("w", c).get()));
}

}  // namespace test_quant_observers
