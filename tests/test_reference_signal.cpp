// Reference kernels and shape inference of the signal ops (DFT, STFT, the windows, MelWeightMatrix):
// small cases checked against closed forms and hand-computed values, the opset-17 and opset-20 forms
// of DFT, inference with sizes known and unknown, and the errors bad input must raise.
#include <catch2/catch.hpp>

#include <cmath>
#include <complex>
#include <map>
#include <string>
#include <vector>

#include "ondine/ir/shape_inference.hpp"
#include "ondine/reference/executor.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_reference_signal {

using namespace ondine;
using test::node_error;
using Attrs = std::map<std::string, Attribute>;

namespace {

constexpr double kPi = 3.14159265358979323846;

Tensor ft(std::vector<std::int64_t> dims, std::vector<float> values) {
  return Tensor::from_vector<float>(std::move(dims), values);
}
Tensor i64(std::int64_t v) { return Tensor::from_vector<std::int64_t>({}, {v}); }
Tensor i32(std::int32_t v) { return Tensor::from_vector<std::int32_t>({}, {v}); }
Tensor f32(float v) { return Tensor::from_vector<float>({}, {v}); }

// One node on the given inputs (an empty() tensor is an omitted optional input; those listed in
// `constants` become initializers, so inference sees their values). Inference must agree with the
// kernel wherever it knows a dim; `static_dims` says it must know every dim.
struct OpCase {
  std::string op;
  std::vector<Tensor> inputs;
  Attrs attrs = {};
  int opset = 17;
  std::vector<std::size_t> constants = {};
  bool static_dims = false;
};

Tensor run(const OpCase& c) {
  Graph g;
  g.opsets[""] = c.opset;
  std::vector<Value*> ins;
  std::map<std::string, Tensor> feeds;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.inputs[i];
    const std::string name = "in" + std::to_string(i);
    if (t.empty()) {
      ins.push_back(nullptr);
    } else if (std::find(c.constants.begin(), c.constants.end(), i) != c.constants.end()) {
      ins.push_back(g.add_constant(name, t));
    } else {
      ins.push_back(g.add_input(name, t.dtype(), t.shape()));
      feeds[name] = t;
    }
  }
  Node* n = g.add_node(c.op, ins, {"out"}, c.attrs, "node_under_test");
  g.add_output(n->output(0));
  infer_shapes(g);
  const Tensor got = ReferenceExecutor(g).run(feeds).at("out");
  const Value* v = n->output(0);
  INFO("inferred " << v->shape().str() << ", got " << dims_str(got.dims()));
  REQUIRE(v->dtype() == got.dtype());
  REQUIRE(v->shape().rank() == got.rank());
  for (std::size_t d = 0; d < got.rank(); ++d) {
    if (c.static_dims) REQUIRE(v->shape()[d].is_static());
    if (v->shape()[d].is_static()) REQUIRE(v->shape()[d].value == got.dims()[d]);
  }
  return got;
}

void require_close(const Tensor& got, std::vector<std::int64_t> dims, const std::vector<double>& want, double tol = 1e-5) {
  REQUIRE(got.dims() == dims);
  REQUIRE(static_cast<std::size_t>(got.numel()) == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    REQUIRE(got.at_double(i) == Approx(want[i]).margin(tol));
  }
}

// The DFT of `x` by the textbook sum, as interleaved (re, im).
std::vector<double> naive_dft(const std::vector<std::complex<double>>& x, bool inverse = false) {
  const auto n = x.size();
  std::vector<double> out;
  for (std::size_t k = 0; k < n; ++k) {
    std::complex<double> s = 0;
    for (std::size_t j = 0; j < n; ++j)
      s += x[j] * std::polar(1.0, (inverse ? 2 : -2) * kPi * static_cast<double>(j * k) / static_cast<double>(n));
    if (inverse) s /= static_cast<double>(n);
    out.push_back(s.real());
    out.push_back(s.imag());
  }
  return out;
}

}  // namespace

TEST_CASE("DFT of a real signal along axis 1: full, onesided, padded and truncated", "[signal][dft]") {
  const std::vector<float> v{1, 2, 0, -1, 3};
  std::vector<std::complex<double>> c(v.begin(), v.end());
  const Tensor x = ft({1, 5, 1}, v);
  require_close(run({"DFT", {x}, {}, 17, {}, true}), {1, 5, 2}, naive_dft(c));
  std::vector<double> one = naive_dft(c);
  one.resize(6);  // bins 0..2 of 5
  require_close(run({"DFT", {x}, {{"onesided", std::int64_t{1}}}, 17, {}, true}), {1, 3, 2}, one);
  auto padded = c;
  padded.resize(8, 0.0);
  require_close(run({"DFT", {x, i64(8)}, {}, 17, {1}, true}), {1, 8, 2}, naive_dft(padded));
  auto cut = c;
  cut.resize(3);
  require_close(run({"DFT", {x, i64(3)}, {}, 17, {1}, true}), {1, 3, 2}, naive_dft(cut));
  // dft_length as a graph input: the length is known at run time only.
  require_close(run({"DFT", {x, i64(8)}}), {1, 8, 2}, naive_dft(padded));
}

TEST_CASE("DFT inverse undoes the forward transform on another axis", "[signal][dft]") {
  // [1, 2, 3, 2]: the transform runs along axis 2 (length 3) for each of the 2 rows.
  std::vector<float> v;
  for (int i = 0; i < 12; ++i) v.push_back(static_cast<float>(std::sin(i * 1.3) * 2));
  const Tensor x = ft({1, 2, 3, 2}, v);
  Tensor y = run({"DFT", {x}, {{"axis", std::int64_t{2}}}, 17, {}, true});
  for (int row = 0; row < 2; ++row) {
    std::vector<std::complex<double>> line;
    for (int k = 0; k < 3; ++k) line.emplace_back(v[(row * 3 + k) * 2], v[(row * 3 + k) * 2 + 1]);
    auto want = naive_dft(line);
    for (int k = 0; k < 6; ++k) CHECK(y.at_double(static_cast<std::size_t>(row * 6 + k)) == Approx(want[k]).margin(1e-5));
  }
  Tensor back = run({"DFT", {y}, {{"axis", std::int64_t{2}}, {"inverse", std::int64_t{1}}}, 17, {}, true});
  require_close(back, {1, 2, 3, 2}, std::vector<double>(v.begin(), v.end()));
}

TEST_CASE("DFT opset 20 takes the axis as an input, default -2", "[signal][dft]") {
  const Tensor x = ft({2, 4, 1}, {1, 0, 0, 0, 0, 1, 0, 0});
  // Default axis -2 (the length-4 axis): an impulse at 0 is flat, an impulse at 1 a rotating phasor.
  require_close(run({"DFT", {x}, {}, 20, {}, true}), {2, 4, 2}, {1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0, -1, -1, 0, 0, 1});
  // Axis 0 (the batch axis, length 2) given as a constant input.
  Tensor y = run({"DFT", {x, Tensor(), i64(0)}, {}, 20, {2}, true});
  require_close(y, {2, 4, 2}, {1, 0, 1, 0, 0, 0, 0, 0, 1, 0, -1, 0, 0, 0, 0, 0});
  // Axis as a graph input: inference knows the rank and the trailing 2 only when dims may change.
  require_close(run({"DFT", {x, Tensor(), i64(-2)}, {}, 20}), {2, 4, 2}, {1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0, -1, -1, 0, 0, 1});
}

TEST_CASE("DFT errors name the node", "[signal][dft][errors]") {
  const Tensor x = ft({1, 4, 2}, std::vector<float>(8, 1.0f));
  CHECK(node_error([&] { run({"DFT", {x}, {{"onesided", std::int64_t{1}}}}); }, "DFT").find("needs a real input") !=
        std::string::npos);
  CHECK(node_error([&] { run({"DFT", {x}, {{"axis", std::int64_t{2}}}}); }, "DFT").find("axis 2 is out of range") !=
        std::string::npos);
  CHECK(node_error([&] { run({"DFT", {ft({1, 4, 3}, std::vector<float>(12, 1.0f))}}); }, "DFT").find("end in 1 (real) or 2") !=
        std::string::npos);
  CHECK(node_error([&] { run({"DFT", {x, i64(0)}}); }, "DFT").find("dft_length must be positive") != std::string::npos);
}

TEST_CASE("STFT frames a signal, windows each frame and keeps the onesided bins", "[signal][stft]") {
  std::vector<float> v(20);
  for (int i = 0; i < 20; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(std::cos(i * 0.7) + 0.1 * i);
  const Tensor x = ft({1, 20, 1}, v);
  const Tensor window = ft({6}, {0.1f, 0.5f, 1, 1, 0.5f, 0.1f});
  // frames (20 - 6) / 4 + 1 = 4, bins 6 / 2 + 1 = 4.
  Tensor y = run({"STFT", {x, i64(4), window}, {}, 17, {1}, true});
  REQUIRE(y.dims() == std::vector<std::int64_t>{1, 4, 4, 2});
  for (int f = 0; f < 4; ++f) {
    std::vector<std::complex<double>> frame;
    for (int j = 0; j < 6; ++j) frame.emplace_back(v[static_cast<std::size_t>(f * 4 + j)] * window.at_double(static_cast<std::size_t>(j)));
    auto want = naive_dft(frame);
    for (int k = 0; k < 8; ++k) CHECK(y.at_double(static_cast<std::size_t>(f * 8 + k)) == Approx(want[k]).margin(1e-5));
  }
  // frame_length without a window is a rectangular window; onesided 0 keeps every bin.
  Tensor full = run({"STFT", {x, i64(7), Tensor(), i64(6)}, {{"onesided", std::int64_t{0}}}, 17, {1, 3}, true});
  REQUIRE(full.dims() == std::vector<std::int64_t>{1, 3, 6, 2});
  std::vector<std::complex<double>> frame(v.begin() + 7, v.begin() + 13);
  auto want = naive_dft(frame);
  for (int k = 0; k < 12; ++k) CHECK(full.at_double(static_cast<std::size_t>(12 + k)) == Approx(want[k]).margin(1e-5));
  // frame_step as a graph input: frames known at run time only.
  CHECK(run({"STFT", {x, i64(4), window}}).dims() == std::vector<std::int64_t>{1, 4, 4, 2});
  CHECK(node_error([&] { run({"STFT", {x, i64(4), window, i64(5)}, {}, 17, {1, 3}}); }, "STFT")
            .find("frame_length and the window's length: 6 vs 5") != std::string::npos);
  CHECK(node_error([&] { run({"STFT", {x, i64(0), window}}); }, "STFT").find("frame_step must be positive") != std::string::npos);
}

TEST_CASE("Hann, Hamming and Blackman windows: periodic and symmetric, output_datatype", "[signal][window]") {
  auto closed = [](double (*f)(double), int size, bool periodic) {
    std::vector<double> w;
    for (int i = 0; i < size; ++i) w.push_back(f(2 * kPi * i / (periodic ? size : size - 1)));
    return w;
  };
  auto hann = [](double a) { return 0.5 - 0.5 * std::cos(a); };
  auto hamming = [](double a) { return 25.0 / 46 - 21.0 / 46 * std::cos(a); };
  auto blackman = [](double a) { return 0.42 - 0.5 * std::cos(a) + 0.08 * std::cos(2 * a); };
  require_close(run({"HannWindow", {i32(8)}, {}, 17, {0}, true}), {8}, closed(hann, 8, true));
  require_close(run({"HannWindow", {i32(8)}, {{"periodic", std::int64_t{0}}}, 17, {0}, true}), {8}, closed(hann, 8, false));
  require_close(run({"HammingWindow", {i64(5)}, {}, 17, {0}, true}), {5}, closed(hamming, 5, true));
  require_close(run({"BlackmanWindow", {i64(6)}, {{"periodic", std::int64_t{0}}}, 17, {0}, true}), {6},
                closed(blackman, 6, false));
  Tensor d = run({"HannWindow", {i64(4)}, {{"output_datatype", std::int64_t{11}}}, 17, {0}, true});
  CHECK(d.dtype() == DType::Float64);
  require_close(d, {4}, {0, 0.5, 1, 0.5}, 1e-12);
  CHECK(run({"HannWindow", {i64(4)}}).dims() == std::vector<std::int64_t>{4});  // size as a graph input
  CHECK(node_error([&] { run({"HannWindow", {f32(4)}}); }, "HannWindow").find("expected int32 or int64") != std::string::npos);
}

TEST_CASE("MelWeightMatrix: triangular filters on floored bins, ONNX's reference rule", "[signal][mel]") {
  // 8 bins of a 16-point DFT at 8 kHz between 0 and 4 kHz: the ONNX reference's expected values.
  Tensor m = run({"MelWeightMatrix", {i32(8), i32(16), i32(8192), f32(0), f32(8192 / 2)}, {}, 17, {0, 1}, true});
  REQUIRE(m.dims() == std::vector<std::int64_t>{9, 8});
  // Each filter peaks at 1 and every value lies in [0, 1].
  for (int i = 0; i < 8; ++i) {
    double peak = 0;
    for (int j = 0; j < 9; ++j) {
      const double w = m.at_double(static_cast<std::size_t>(j * 8 + i));
      CHECK(w >= 0);
      CHECK(w <= 1);
      peak = std::max(peak, w);
    }
    CHECK(peak == 1);
  }
  // One filter, 16-point DFT at 100 Hz, 0-50 Hz: the mel points fall on bins 0, 2 and 5 (floor(17 * hz /
  // 100) of 0, 16.3 and 32.9 Hz), so the filter rises over 0..2 and falls over 2..5.
  require_close(run({"MelWeightMatrix", {i64(1), i64(16), i64(100), f32(0), f32(50)}, {}, 17, {0, 1}, true}), {9, 1},
                {0, 0.5, 1, 2.0 / 3, 1.0 / 3, 0, 0, 0, 0});
  CHECK(node_error([&] { run({"MelWeightMatrix", {i64(0), i64(16), i64(100), f32(0), f32(50)}}); }, "MelWeightMatrix")
            .find("must be positive") != std::string::npos);
}

}  // namespace test_reference_signal
