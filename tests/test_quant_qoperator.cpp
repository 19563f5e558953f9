// Pre-quantized models in the QOperator form and dynamic quantization: the reference kernels of
// QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger and DynamicQuantizeLinear on hand-computed
// cases; qoperator-to-qdq (the QDQ graph agrees with the QOperator one within one quantization step on
// the reference executor); quantize-dynamic (structure, and numbers: cosine to fp32 >= 0.999 on a small
// graph, >= 0.99 on models/bert.onnx when generated); bad input named by node and op.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <random>
#include <set>

#include "ondine/passes/pipeline.hpp"
#include "ondine/passes/qoperator_to_qdq.hpp"
#include "ondine/quant/quantize_dynamic.hpp"
#include "ondine/reference/executor.hpp"

#if __has_include("ondine/onnx/import.hpp")
#include "ondine/onnx/import.hpp"
#define ONDINE_TEST_HAVE_IMPORT 1
#endif

#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_quant_qoperator {

using namespace ondine;
using Dims = std::vector<std::int64_t>;

namespace {

template <typename T>
Tensor tensor(const Dims& dims, const std::vector<T>& v) { return Tensor::from_vector<T>(dims, v); }

template <typename T>
Tensor random_int(const Dims& dims, unsigned seed, int lo, int hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  Tensor t(dtype_v<T>, dims);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = static_cast<T>(dist(rng));
  return t;
}

Tensor random_float(const Dims& dims, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Tensor t(DType::Float32, dims);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// Runs a one-node graph whose inputs are all constants but the first `runtime` ones, given as inputs.
std::vector<Tensor> run_node(const std::string& op, const std::vector<Tensor>& inputs, std::size_t outputs = 1,
                             std::map<std::string, Attribute> attrs = {}, std::size_t runtime = 1) {
  Graph g;
  std::vector<Value*> in;
  std::map<std::string, Tensor> feed;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    std::string name = "in" + std::to_string(i);
    if (inputs[i].empty()) {
      in.push_back(nullptr);
    } else if (i < runtime) {
      in.push_back(g.add_input(name, inputs[i].dtype(), inputs[i].shape()));
      feed[name] = inputs[i];
    } else {
      in.push_back(g.add_constant(name, inputs[i]));
    }
  }
  std::vector<std::string> names;
  for (std::size_t i = 0; i < outputs; ++i) names.push_back("out" + std::to_string(i));
  Node* n = g.add_node(op, in, names, std::move(attrs), "node");
  for (Value* v : n->outputs()) g.add_output(v);
  infer_shapes(g);
  auto result = ReferenceExecutor(g).run(feed);
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < outputs; ++i) {
    const Tensor& t = result.at(names[i]);
    // Inference and the kernel agree on every output's type and shape.
    CHECK(n->output(i)->dtype() == t.dtype());
    CHECK(n->output(i)->shape() == t.shape());
    out.push_back(t);
  }
  return out;
}

template <typename T>
std::vector<T> values(const Tensor& t) { return std::vector<T>(t.data<T>(), t.data<T>() + t.numel()); }

double cosine(const Tensor& a, const Tensor& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    double x = a.at_double(static_cast<std::size_t>(i)), y = b.at_double(static_cast<std::size_t>(i));
    ab += x * y;
    aa += x * x;
    bb += y * y;
  }
  return ab / std::sqrt(aa * bb);
}

// Expects an Error naming node "node" and `op` whose message contains `text`.
template <typename F>
void expect_error(F&& f, const std::string& op, const std::string& text) {
  try {
    f();
    FAIL("no error thrown; expected one containing '" << text << "'");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.node() == "node");
    CHECK(e.op() == op);
    CHECK(std::string(e.what()).find(text) != std::string::npos);
  }
}

}  // namespace

// --- reference kernels ------------------------------------------------------------------------------

// The quantization passes are registered by compiling (lower/pass_pipeline.hpp); these tests build their
// pipelines without compiling first.
static const bool qoperator_tests_register_quantize_dynamic = (register_quantize_dynamic_pass(), true);

TEST_CASE("MatMulInteger: zero points per tensor, per row of A, per column of B", "[qoperator][reference]") {
  Tensor a = tensor<std::uint8_t>({2, 2}, {1, 2, 3, 4});
  Tensor b = tensor<std::int8_t>({2, 2}, {1, -1, 2, 0});
  // (A - 1) x B = [[0, 1], [2, 3]] x [[1, -1], [2, 0]]
  auto y = run_node("MatMulInteger", {a, b, tensor<std::uint8_t>({}, {1})});
  CHECK(y[0].dtype() == DType::Int32);
  CHECK(values<std::int32_t>(y[0]) == std::vector<std::int32_t>{2, 0, 8, -2});
  // Per row of A ([1, 3]) and per column of B ([1, -1]): [[0, 1], [0, 1]] x [[0, 0], [1, 1]]
  y = run_node("MatMulInteger", {a, b, tensor<std::uint8_t>({2}, {1, 3}), tensor<std::int8_t>({2}, {1, -1})});
  CHECK(values<std::int32_t>(y[0]) == std::vector<std::int32_t>{1, 1, 1, 1});
  // No zero points; batched A against a 2-D B.
  y = run_node("MatMulInteger", {tensor<std::int8_t>({2, 1, 2}, {1, 2, -3, 4}), b});
  CHECK(y[0].dims() == Dims{2, 1, 2});
  CHECK(values<std::int32_t>(y[0]) == std::vector<std::int32_t>{5, -1, 5, 3});
}

TEST_CASE("QLinearMatMul: integer accumulation, rounding half to even, saturation", "[qoperator][reference]") {
  auto f = [](float v) { return tensor<float>({}, {v}); };
  auto u8 = [](std::uint8_t v) { return tensor<std::uint8_t>({}, {v}); };
  // real a = 0.5 * ([10, 20] - 10) = [0, 5], b = 0.25 * [2, 4] = [0.5, 1]: y = 5 -> 5 / 0.5 + 3 = 13
  auto y = run_node("QLinearMatMul", {tensor<std::uint8_t>({1, 2}, {10, 20}), f(0.5f), u8(10),
                                      tensor<std::int8_t>({2, 1}, {2, 4}), f(0.25f), tensor<std::int8_t>({}, {0}), f(0.5f),
                                      u8(3)});
  CHECK(values<std::uint8_t>(y[0]) == std::vector<std::uint8_t>{13});
  // acc = (a - 10) * 5 = 10, 15, 30, 250, -50; times 0.25 = 2.5 -> 2, 3.75 -> 4, 7.5 -> 8 (ties to even),
  // 62.5 -> 62 + 100 = 162, -12.5 -> -12 + 100 = 88.
  Tensor a = tensor<std::uint8_t>({5, 1}, {12, 13, 16, 60, 0});
  y = run_node("QLinearMatMul", {a, f(1.0f), u8(10), tensor<std::int8_t>({1, 1}, {5}), f(0.25f),
                                 tensor<std::int8_t>({}, {0}), f(1.0f), u8(100)});
  CHECK(values<std::uint8_t>(y[0]) == std::vector<std::uint8_t>{102, 104, 108, 162, 88});
  // Saturation to int8's range.
  y = run_node("QLinearMatMul", {a, f(1.0f), u8(10), tensor<std::int8_t>({1, 1}, {5}), f(1.0f),
                                 tensor<std::int8_t>({}, {0}), f(1.0f), tensor<std::int8_t>({}, {0})});
  CHECK(values<std::int8_t>(y[0]) == std::vector<std::int8_t>{10, 15, 30, 127, -50});
}

TEST_CASE("ConvInteger: zero-point-shifted sums, padding reads the zero point", "[qoperator][reference]") {
  Tensor x = tensor<std::uint8_t>({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor w = tensor<std::uint8_t>({1, 1, 2, 2}, {1, 1, 1, 1});
  // x - 1 = [[0, 1, 2], [3, 4, 5], [6, 7, 8]], summed over 2x2 windows.
  auto y = run_node("ConvInteger", {x, w, tensor<std::uint8_t>({}, {1})});
  CHECK(y[0].dtype() == DType::Int32);
  CHECK(values<std::int32_t>(y[0]) == std::vector<std::int32_t>{8, 12, 20, 24});
  // With pads 1 the padded taps are x_zero_point, which contributes 0: the corners hold one tap.
  y = run_node("ConvInteger", {x, w, tensor<std::uint8_t>({}, {1})}, 1, {{"pads", Dims{1, 1, 1, 1}}});
  CHECK(y[0].dims() == Dims{1, 1, 4, 4});
  CHECK(values<std::int32_t>(y[0])[0] == 0);
  CHECK(values<std::int32_t>(y[0])[15] == 8);
}

TEST_CASE("QLinearConv: per-channel weight scales, int32 bias", "[qoperator][reference]") {
  auto f = [](float v) { return tensor<float>({}, {v}); };
  // x - 10 = [0, 4]; channel 0: 2 * [0, 4] + 1 = [1, 9] at scale 0.5 / 0.5 = 1 -> [101, 109];
  // channel 1: -3 * [0, 4] - 2 = [-2, -14] at scale 0.25 / 0.5 -> [-1, -7] -> [99, 93].
  auto y = run_node("QLinearConv",
                    {tensor<std::uint8_t>({1, 1, 1, 2}, {10, 14}), f(1.0f), tensor<std::uint8_t>({}, {10}),
                     tensor<std::int8_t>({2, 1, 1, 1}, {2, -3}), tensor<float>({2}, {0.5f, 0.25f}),
                     tensor<std::int8_t>({2}, {0, 0}), f(0.5f), tensor<std::uint8_t>({}, {100}),
                     tensor<std::int32_t>({2}, {1, -2})});
  CHECK(y[0].dims() == Dims{1, 2, 1, 2});
  CHECK(values<std::uint8_t>(y[0]) == std::vector<std::uint8_t>{101, 109, 99, 93});
}

TEST_CASE("DynamicQuantizeLinear: range widened to 0, all-zero input", "[qoperator][reference]") {
  // [-1, 1.55]: scale 2.55 / 255 = 0.01, zero point round(1 / 0.01) = 100.
  auto y = run_node("DynamicQuantizeLinear", {tensor<float>({3}, {-1.0f, 0.0f, 1.55f})}, 3);
  CHECK(y[1].at_double(0) == Approx(0.01).epsilon(1e-6));
  CHECK(values<std::uint8_t>(y[2]) == std::vector<std::uint8_t>{100});
  CHECK(values<std::uint8_t>(y[0]) == std::vector<std::uint8_t>{0, 100, 255});
  // All positive: min widens to 0, zero point 0.
  y = run_node("DynamicQuantizeLinear", {tensor<float>({2}, {0.51f, 2.55f})}, 3);
  CHECK(values<std::uint8_t>(y[2]) == std::vector<std::uint8_t>{0});
  CHECK(values<std::uint8_t>(y[0]) == std::vector<std::uint8_t>{51, 255});
  // All zero: no range; scale 1 and zero point 0 instead of 0 / 0.
  y = run_node("DynamicQuantizeLinear", {tensor<float>({2, 2}, {0, 0, 0, 0})}, 3);
  CHECK(y[1].at_double(0) == 1.0);
  CHECK(values<std::uint8_t>(y[0]) == std::vector<std::uint8_t>{0, 0, 0, 0});
}

// --- bad input --------------------------------------------------------------------------------------

TEST_CASE("QOperator ops: bad input is an Error naming the node and op", "[qoperator][errors]") {
  auto f = [](float v) { return tensor<float>({}, {v}); };
  Tensor a = tensor<std::uint8_t>({1, 2}, {1, 2});
  Tensor b = tensor<std::int8_t>({2, 1}, {1, 2});
  auto qmm = [&](Tensor az, Tensor as, std::size_t runtime = 1) {
    return [=] {
      run_node("QLinearMatMul", {a, as, az, b, f(1.0f), tensor<std::int8_t>({}, {0}), f(1.0f),
                                 tensor<std::uint8_t>({}, {0})}, 1, {}, runtime);
    };
  };
  SECTION("zero point of another type than its tensor") {
    expect_error(qmm(tensor<std::int8_t>({}, {0}), f(1.0f)), "QLinearMatMul", "must match");
  }
  SECTION("zero point of an unsupported type") {
    expect_error(qmm(tensor<std::int32_t>({}, {0}), f(1.0f)), "QLinearMatMul", "takes uint8 or int8");
  }
  SECTION("zero, negative and NaN scales, constant (shape inference) or fed at run time (kernel)") {
    for (float s : {0.0f, -0.5f, std::nanf("")}) {
      expect_error(qmm(tensor<std::uint8_t>({}, {0}), f(s)), "QLinearMatMul", "positive and finite");
      expect_error(qmm(tensor<std::uint8_t>({}, {0}), f(s), 2), "QLinearMatMul", "positive and finite");
    }
  }
  SECTION("float data") {
    expect_error([&] { run_node("MatMulInteger", {tensor<float>({1, 1}, {1.0f}), b}); }, "MatMulInteger",
                 "takes uint8 or int8");
  }
  SECTION("per-channel w_scale of the wrong length") {
    expect_error(
        [&] {
          run_node("QLinearConv", {tensor<std::uint8_t>({1, 1, 1, 1}, {1}), f(1.0f), tensor<std::uint8_t>({}, {0}),
                                   tensor<std::int8_t>({2, 1, 1, 1}, {1, 1}), tensor<float>({3}, {1, 1, 1}),
                                   tensor<std::int8_t>({}, {0}), f(1.0f), tensor<std::uint8_t>({}, {0})});
        },
        "QLinearConv", "per output channel");
  }
  SECTION("bias that is not int32") {
    expect_error(
        [&] {
          run_node("QLinearConv", {tensor<std::uint8_t>({1, 1, 1, 1}, {1}), f(1.0f), tensor<std::uint8_t>({}, {0}),
                                   tensor<std::int8_t>({1, 1, 1, 1}, {1}), f(1.0f), tensor<std::int8_t>({}, {0}),
                                   f(1.0f), tensor<std::uint8_t>({}, {0}), tensor<float>({1}, {1.0f})});
        },
        "QLinearConv", "int32 expected");
  }
  SECTION("DynamicQuantizeLinear of a non-finite value") {
    expect_error([&] { run_node("DynamicQuantizeLinear", {tensor<float>({2}, {1.0f, INFINITY})}, 3); },
                 "DynamicQuantizeLinear", "no quantization range");
  }
}

// --- qoperator-to-qdq -------------------------------------------------------------------------------

namespace {

// Runs `g` and its rewritten clone on the same inputs; returns {original, rewritten} outputs.
std::pair<std::map<std::string, Tensor>, std::map<std::string, Tensor>> run_both(
    const Graph& g, const std::string& pipeline, const std::map<std::string, Tensor>& feed, Graph* out = nullptr) {
  Graph r = g.clone();
  make_pass_manager(pipeline).run(r);
  auto a = ReferenceExecutor(g).run(feed), b = ReferenceExecutor(r).run(feed);
  if (out) *out = std::move(r);
  return {a, b};
}

// Largest difference in quantization steps, and how many elements differ at all.
template <typename T>
std::pair<int, std::int64_t> step_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.dims() == b.dims());
  int worst = 0;
  std::int64_t differ = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    int d = std::abs(int(a.data<T>()[i]) - int(b.data<T>()[i]));
    worst = std::max(worst, d);
    differ += d != 0;
  }
  return {worst, differ};
}

// Neither all-saturated nor constant: the comparison cannot pass vacuously.
template <typename T>
void check_spread(const Tensor& t) {
  std::set<int> seen(t.data<T>(), t.data<T>() + t.numel());
  CHECK(seen.size() > 20);
}

Graph qlinear_conv_graph(bool bias, bool per_channel, bool constant_scales) {
  Graph g;
  Value* x = g.add_input("x", DType::UInt8, Shape{1, 3, 8, 8});
  auto f = [&](const std::string& name, float v) {
    return constant_scales ? g.add_constant(name, tensor<float>({}, {v})) : g.add_input(name, DType::Float32, Shape{});
  };
  Value* xs = f("x_scale", 0.02f);
  Value* xz = g.add_constant("x_zp", tensor<std::uint8_t>({}, {120}));
  Value* w = g.add_constant("w", random_int<std::int8_t>({4, 3, 3, 3}, 7, -127, 127));
  Value* ws = per_channel ? g.add_constant("w_scale", tensor<float>({4}, {0.004f, 0.007f, 0.003f, 0.005f}))
                          : g.add_constant("w_scale", tensor<float>({1}, {0.005f}));
  Value* wz = g.add_constant("w_zp", tensor<std::int8_t>({}, {0}));  // scalar: broadcast by the pass
  Value* ys = f("y_scale", 0.04f);
  Value* yz = g.add_constant("y_zp", tensor<std::uint8_t>({}, {128}));
  std::vector<Value*> in{x, xs, xz, w, ws, wz, ys, yz};
  if (bias) in.push_back(g.add_constant("b", random_int<std::int32_t>({4}, 9, -2000, 2000)));
  Node* n = g.add_node("QLinearConv", in, {"y"}, {{"pads", Dims{1, 1, 1, 1}}, {"strides", Dims{1, 1}}}, "qconv");
  g.add_output(n->output(0));
  infer_shapes(g);
  return g;
}

}  // namespace

TEST_CASE("qoperator-to-qdq: QLinearConv -> DQ, Conv, Q within one step of the QOperator result",
          "[qoperator][qdq]") {
  for (bool per_channel : {true, false})
    for (bool bias : {true, false})
      for (bool constant_scales : {true, false}) {
        INFO("per_channel " << per_channel << ", bias " << bias << ", constant scales " << constant_scales);
        Graph g = qlinear_conv_graph(bias, per_channel, constant_scales);
        std::map<std::string, Tensor> feed{{"x", random_int<std::uint8_t>({1, 3, 8, 8}, 3, 0, 255)}};
        if (!constant_scales) {
          feed["x_scale"] = tensor<float>({}, {0.02f});
          feed["y_scale"] = tensor<float>({}, {0.04f});
        }
        Graph r;
        auto [a, b] = run_both(g, "qoperator-to-qdq", feed, &r);
        CHECK(r.count_ops("QLinearConv") == 0);
        CHECK(r.count_ops("Conv") == 1);
        CHECK(r.count_ops("DequantizeLinear") == (bias ? 3u : 2u));
        CHECK(r.count_ops("QuantizeLinear") == 1);
        CHECK(r.count_ops("Mul") == (bias && !constant_scales ? 1u : 0u));  // bias scale x_scale * w_scale
        REQUIRE(r.outputs().size() == 1);
        CHECK(r.outputs()[0]->name() == "y");
        check_spread<std::uint8_t>(a.at("y"));
        auto [worst, differ] = step_diff<std::uint8_t>(a.at("y"), b.at("y"));
        CHECK(worst <= 1);
        CHECK(differ * 20 <= a.at("y").numel());  // float rounding moves at most 5% of the values, by one step
      }
}

TEST_CASE("qoperator-to-qdq: QLinearMatMul per tensor and per column", "[qoperator][qdq]") {
  for (bool per_column : {true, false}) {
    Graph g;
    Value* a = g.add_input("a", DType::UInt8, Shape{2, 4, 16});
    Value* as = g.add_constant("a_scale", tensor<float>({}, {0.03f}));
    Value* az = g.add_constant("a_zp", tensor<std::uint8_t>({}, {100}));
    Value* b = g.add_constant("b", random_int<std::int8_t>({16, 8}, 5, -127, 127));
    std::vector<float> scales{0.004f, 0.006f, 0.002f, 0.005f, 0.003f, 0.004f, 0.007f, 0.005f};
    Value* bs = g.add_constant("b_scale", per_column ? tensor<float>({8}, scales) : tensor<float>({}, {0.004f}));
    Value* bz = g.add_constant("b_zp", per_column ? Tensor(DType::Int8, {8}) : tensor<std::int8_t>({}, {0}));
    Value* ys = g.add_constant("y_scale", tensor<float>({}, {0.05f}));
    Value* yz = g.add_constant("y_zp", tensor<std::int8_t>({}, {-3}));
    g.add_output(g.add_node("QLinearMatMul", {a, as, az, b, bs, bz, ys, yz}, {"y"}, {}, "qmm")->output(0));
    infer_shapes(g);
    Graph r;
    auto [x, y] = run_both(g, "qoperator-to-qdq", {{"a", random_int<std::uint8_t>({2, 4, 16}, 11, 0, 255)}}, &r);
    CHECK(r.count_ops("QLinearMatMul") == 0);
    CHECK(r.count_ops("MatMul") == 1);
    CHECK(r.count_ops("DequantizeLinear") == 2);
    check_spread<std::int8_t>(x.at("y"));
    CHECK(step_diff<std::int8_t>(x.at("y"), y.at("y")).first <= 1);
  }
}

TEST_CASE("qoperator-to-qdq: must not fire on per-row parameters of an N-D operand", "[qoperator][qdq]") {
  Graph g;
  Value* a = g.add_input("a", DType::UInt8, Shape{2, 3, 4});
  auto f = [&](const std::string& n, float v) { return g.add_constant(n, tensor<float>({}, {v})); };
  Value* as = g.add_constant("a_scale", tensor<float>({2, 3, 1}, {1, 1, 1, 1, 1, 1}));
  Value* az = g.add_constant("a_zp", Tensor(DType::UInt8, {2, 3, 1}));
  Value* b = g.add_constant("b", random_int<std::int8_t>({4, 2}, 5, -10, 10));
  g.add_output(g.add_node("QLinearMatMul", {a, as, az, b, f("bs", 1.0f), g.add_constant("bz", tensor<std::int8_t>({}, {0})),
                                            f("ys", 1.0f), g.add_constant("yz", tensor<std::uint8_t>({}, {0}))},
                          {"y"}, {}, "qmm")
                   ->output(0));
  infer_shapes(g);
  Graph r = g.clone();
  PassContext ctx;
  std::vector<std::string> remarks;
  ctx.log = [&](const std::string& s) { remarks.push_back(s); };
  CHECK_FALSE(QOperatorToQdq().run(r, ctx));
  CHECK(r.count_ops("QLinearMatMul") == 1);
  CHECK(r.num_nodes() == 1);
  REQUIRE(remarks.size() == 1);
  CHECK(remarks[0].find("not 2-D") != std::string::npos);
}

TEST_CASE("qoperator-to-qdq runs first in the default pipeline, after widen-float16", "[qoperator][qdq]") {
  // widen-float16 changes no quantized op (it widens float16 values only): qoperator-to-qdq still sees the
  // model as imported.
  CHECK(std::string(default_pipeline()).rfind("widen-float16,qoperator-to-qdq,", 0) == 0);
  CHECK(pass_registry().contains("qoperator-to-qdq"));
  CHECK(pass_registry().contains("quantize-dynamic"));
  CHECK(std::string(default_pipeline()).find("quantize-dynamic") == std::string::npos);
}

// --- quantize-dynamic -------------------------------------------------------------------------------

TEST_CASE("quantize-dynamic: MatMul and Gemm become DynamicQuantizeLinear + MatMulInteger", "[qoperator][dynamic]") {
  for (bool per_channel : {true, false}) {
    INFO("per channel " << per_channel);
    Graph g;
    Value* x = g.add_input("x", DType::Float32, Shape{2, 5, 16});
    Value* x2 = g.add_input("x2", DType::Float32, Shape{3, 16});
    // Two readers of x share one DynamicQuantizeLinear.
    Value* y1 = g.add_node("MatMul", {x, g.add_constant("w1", random_float({16, 8}, 1))}, {"y1"}, {}, "mm1")->output(0);
    Value* y2 = g.add_node("MatMul", {x, g.add_constant("w2", random_float({16, 4}, 2))}, {"y2"}, {}, "mm2")->output(0);
    Value* y3 = g.add_node("Gemm", {x2, g.add_constant("w3", random_float({8, 16}, 3)), g.add_constant("c", random_float({8}, 4))},
                           {"y3"}, {{"transB", std::int64_t{1}}, {"alpha", 0.5f}, {"beta", 2.0f}}, "gemm")
                    ->output(0);
    // Must not fire: a MatMul of two activations.
    Value* y4 = g.add_node("MatMul", {x2, g.add_input("x3", DType::Float32, Shape{16, 2})}, {"y4"}, {}, "mm4")->output(0);
    for (Value* v : {y1, y2, y3, y4}) g.add_output(v);
    infer_shapes(g);

    Graph r = g.clone();
    PassManager pm = make_pass_manager("quantize-dynamic");
    pm.context().options["quantize-dynamic.per-channel"] = per_channel ? "1" : "0";
    pm.run(r);
    CHECK(r.count_ops("DynamicQuantizeLinear") == 2);
    CHECK(r.count_ops("MatMulInteger") == 3);
    CHECK(r.count_ops("Cast") == 3);
    CHECK(r.count_ops("MatMul") == 1);
    CHECK(r.count_ops("Gemm") == 0);
    CHECK(r.count_ops("Add") == 1);
    for (Value* v : r.outputs()) CHECK((v->name() == "y1" || v->name() == "y2" || v->name() == "y3" || v->name() == "y4"));

    std::map<std::string, Tensor> feed{{"x", random_float({2, 5, 16}, 5)}, {"x2", random_float({3, 16}, 6)},
                                       {"x3", random_float({16, 2}, 7)}};
    auto a = ReferenceExecutor(g).run(feed), b = ReferenceExecutor(r).run(feed);
    for (const char* name : {"y1", "y2", "y3"}) {
      INFO(name);
      CHECK(b.at(name).dims() == a.at(name).dims());
      CHECK(cosine(a.at(name), b.at(name)) >= 0.999);
    }
  }
}

// --- fuse-dynamic-qmatmul ---------------------------------------------------------------------------

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double d = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    d = std::max(d, std::abs(a.at_double(static_cast<std::size_t>(i)) - b.at_double(static_cast<std::size_t>(i))));
  return d;
}

TEST_CASE("fuse-dynamic-qmatmul: MatMulInteger -> Cast -> Mul -> Add? -> act* becomes one ondine.DynQMatMul, same numbers",
          "[qoperator][dynamic]") {
  CHECK(std::string(default_pipeline()).find("fuse-gelu,fuse-layernorm,fuse-rmsnorm,fuse-rotary,fuse-groupnorm,pointwise-as-conv,fuse-attention,fuse-dynamic-qmatmul,fuse-dynamic-qconv,fuse,") != std::string::npos);
  for (bool per_channel : {true, false}) {
    INFO("per channel " << per_channel);
    Graph g;
    Value* x = g.add_input("x", DType::Float32, Shape{2, 5, 16});
    Value* x2 = g.add_input("x2", DType::Float32, Shape{3, 16});
    Value* m1 = g.add_node("MatMul", {x, g.add_constant("w1", random_float({16, 8}, 1))}, {"m1"}, {}, "mm1")->output(0);
    Value* y1 = g.add_node("Relu", {m1}, {"y1"}, {}, "relu")->output(0);
    Value* y2 = g.add_node("MatMul", {x, g.add_constant("w2", random_float({16, 4}, 2))}, {"y2"}, {}, "mm2")->output(0);
    Value* y3 = g.add_node("Gemm", {x2, g.add_constant("w3", random_float({8, 16}, 3)), g.add_constant("c", random_float({8}, 4))},
                           {"y3"}, {{"transB", std::int64_t{1}}, {"beta", 2.0f}}, "gemm")
                    ->output(0);
    for (Value* v : {y1, y2, y3}) g.add_output(v);
    infer_shapes(g);
    PassManager quantize = make_pass_manager("quantize-dynamic");
    quantize.context().options["quantize-dynamic.per-channel"] = per_channel ? "1" : "0";
    quantize.run(g);
    Graph f = g.clone();
    make_pass_manager("fuse-dynamic-qmatmul").run(f);
    CHECK(f.count_ops("DynQMatMul") == 3);
    CHECK(f.count_ops("DynamicQuantizeLinear") == 2);  // still shared by mm1 and mm2
    for (const char* op : {"MatMulInteger", "Cast", "Mul", "Add", "Relu"}) CHECK(f.count_ops(op) == 0);
    std::size_t with_relu = 0;
    for (Node* n : f.nodes()) with_relu += n->op_type() == "DynQMatMul" && fused::read_activations(*n).size() == 1;
    CHECK(with_relu == 1);
    for (Value* v : f.outputs()) CHECK((v->name() == "y1" || v->name() == "y2" || v->name() == "y3"));

    std::map<std::string, Tensor> feed{{"x", random_float({2, 5, 16}, 5)}, {"x2", random_float({3, 16}, 6)}};
    auto a = ReferenceExecutor(g).run(feed), b = ReferenceExecutor(f).run(feed);
    for (const char* name : {"y1", "y2", "y3"}) {
      INFO(name);
      REQUIRE(b.at(name).dims() == a.at(name).dims());
      CHECK(max_abs_diff(a.at(name), b.at(name)) == 0.0);  // the same float32 operations
    }
  }
}

// The graph of the must-not-fire and centring cases: DynamicQuantizeLinear -> MatMulInteger(W, W_zp) ->
// Cast -> Mul(xs * ws), W [8, 3].
Graph dynamic_matmul_graph(const Tensor& w, const Tensor& wz, const Tensor& ws) {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{4, 8});
  Node* dql = g.add_node("DynamicQuantizeLinear", {x}, {"xq", "xs", "xz"}, {}, "dql");
  dql->set_opset(11);
  Value* acc = g.add_node("MatMulInteger", {dql->output(0), g.add_constant("w", w), dql->output(2), g.add_constant("wz", wz)},
                          {"acc"}, {}, "mmi")->output(0);
  Value* accf = g.add_node("Cast", {acc}, {"accf"}, {{"to", std::int64_t{1}}}, "cast")->output(0);
  Value* s = g.add_node("Mul", {dql->output(1), g.add_constant("ws", ws)}, {"s"}, {}, "scale")->output(0);
  g.add_output(g.add_node("Mul", {accf, s}, {"y"}, {}, "rescale")->output(0));
  return g;
}

TEST_CASE("fuse-dynamic-qmatmul centres uint8 weights and weight zero points: int8 when they fit, else int16; same numbers",
          "[qoperator][dynamic]") {
  struct Case {
    Tensor w, wz;
    DType centred;
  };
  Tensor ws = Tensor::from_vector<float>({3}, {0.1f, 0.2f, 0.3f});
  for (Case& c : std::vector<Case>{
           {random_int<std::int8_t>({8, 3}, 1, -100, 100), Tensor::from_vector<std::int8_t>({3}, {0, 1, -2}), DType::Int8},
           {random_int<std::uint8_t>({8, 3}, 1, 0, 255), Tensor::from_vector<std::uint8_t>({}, {128}), DType::Int8},
           {random_int<std::uint8_t>({8, 3}, 1, 0, 255), Tensor::from_vector<std::uint8_t>({3}, {113, 131, 128}), DType::Int16},
           {random_int<std::int8_t>({8, 3}, 1, -127, 127), Tensor::from_vector<std::int8_t>({}, {5}), DType::Int16}}) {
    INFO(dtype_name(c.w.dtype()) << " weights, zero points " << c.wz.numel());
    Graph g = dynamic_matmul_graph(c.w, c.wz, ws);
    infer_shapes(g);
    Graph f = g.clone();
    REQUIRE(make_pass_manager("fuse-dynamic-qmatmul").run(f));
    REQUIRE(f.count_ops("DynQMatMul") == 1);
    CHECK(f.count_ops("MatMulInteger") == 0);
    for (Node* n : f.nodes())
      if (n->op_type() == "DynQMatMul") CHECK(n->input(3)->dtype() == c.centred);
    std::map<std::string, Tensor> feed{{"x", random_float({4, 8}, 5)}};
    auto a = ReferenceExecutor(g).run(feed), b = ReferenceExecutor(f).run(feed);
    CHECK(max_abs_diff(a.at("y"), b.at("y")) == 0.0);
  }
}

TEST_CASE("fuse-dynamic-qmatmul must not fire: a scale along rows, a shared or read-out product", "[qoperator][dynamic]") {
  for (int variant = 0; variant < 3; ++variant) {
    INFO("variant " << variant);
    Tensor w = random_int<std::int8_t>({8, 3}, 1, -127, 127);
    // [4, 1]: one scale per row of the product, not per column: not a weight scale.
    Tensor ws = variant == 0 ? Tensor::from_vector<float>({4, 1}, {0.1f, 0.2f, 0.3f, 0.4f})
                             : Tensor::from_vector<float>({3}, {0.1f, 0.2f, 0.3f});
    Graph g = dynamic_matmul_graph(w, Tensor(DType::Int8, {3}), ws);
    if (variant == 1) g.add_output(g.find_value("accf"));                                                 // read out
    if (variant == 2) g.add_output(g.add_node("Neg", {g.find_value("acc")}, {"n"}, {}, "neg")->output(0));  // shared
    infer_shapes(g);
    Graph f = g.clone();
    CHECK_FALSE(make_pass_manager("fuse-dynamic-qmatmul").run(f));
    CHECK(f.count_ops("MatMulInteger") == 1);
  }
}

// --- fuse-dynamic-qconv -----------------------------------------------------------------------------

TEST_CASE("fuse-dynamic-qconv: ConvInteger -> Cast -> Mul -> Add -> Relu becomes one ondine.DynQConv, same numbers",
          "[qoperator][dynamic]") {
  for (bool uint8_weights : {false, true})
    for (bool per_channel : {false, true})
      for (std::int64_t group : {1, 2}) {
        INFO("uint8 " << uint8_weights << ", per channel " << per_channel << ", group " << group);
        test::DynamicConvSpec spec;
        spec.uint8_weights = uint8_weights;
        spec.per_channel = per_channel;
        spec.group = group;
        spec.stride = group;
        Graph g = test::dynamic_conv_graph(spec);
        infer_shapes(g);
        Graph f = g.clone();
        PassManager pm = make_pass_manager("fuse-dynamic-qconv");
        pm.run(f);
        REQUIRE(f.count_ops("DynQConv") == 1);
        for (const char* op : {"ConvInteger", "Cast", "Mul", "Add", "Relu"}) CHECK(f.count_ops(op) == 0);
        CHECK(f.count_ops("DynamicQuantizeLinear") == 1);
        for (Node* n : f.nodes())
          if (n->op_type() == "DynQConv") {
            CHECK(n->input(3)->dtype() == (uint8_weights ? DType::Int16 : DType::Int8));
            CHECK(n->attr_int("group", 1) == group);
            CHECK(n->attr_floats("w_scale").size() == (per_channel ? 12u : 1u));
            CHECK(fused::read_activations(*n).size() == 1);
          }
        REQUIRE(f.outputs().size() == 1);
        CHECK(f.outputs()[0]->name() == "y");
        std::map<std::string, Tensor> feed{{"x", random_float({2, 32, 9, 9}, 5, -2.0f, 3.0f)}};
        auto a = ReferenceExecutor(g).run(feed), b = ReferenceExecutor(f).run(feed);
        REQUIRE(a.at("y").dims() == b.at("y").dims());
        CHECK(max_abs_diff(a.at("y"), b.at("y")) == 0.0);  // the same float32 operations
      }
}

TEST_CASE("fuse-dynamic-qconv must not fire: a scale along width, a float product read out, a computed weight",
          "[qoperator][dynamic]") {
  for (int variant = 0; variant < 3; ++variant) {
    INFO("variant " << variant);
    test::DynamicConvSpec spec;
    spec.relu = false;
    Graph g = test::dynamic_conv_graph(spec);
    if (variant == 0) {  // ws [12] broadcasts along the last axis (width), not the channels
      Tensor t(DType::Float32, {9});
      for (std::int64_t i = 0; i < 9; ++i) t.data<float>()[i] = 0.01f;
      g.find_value("s")->producer()->set_input(1, g.add_constant("ws_w", t));
    }
    if (variant == 1) g.add_output(g.find_value("accf"));
    if (variant == 2) g.find_value("acc")->producer()->set_input(1, g.add_input("w_in", DType::Int8, Shape{12, 32, 3, 3}));
    g.remove_dead_values();
    infer_shapes(g);
    Graph f = g.clone();
    CHECK_FALSE(make_pass_manager("fuse-dynamic-qconv").run(f));
    CHECK(f.count_ops("ConvInteger") == 1);
  }
}

TEST_CASE("ondine.DynQMatMul: bad operands are errors naming the node", "[qoperator][dynamic]") {
  struct Case {
    DType a, scale;
    Dims w;
    std::vector<float> w_scale;
    const char* message;
  };
  for (const Case& c : {Case{DType::Int8, DType::Float32, {8, 3}, {0.1f}, "A must be uint8"},
                        Case{DType::UInt8, DType::UInt8, {8, 3}, {0.1f}, "A_scale must be float32"},
                        Case{DType::UInt8, DType::Float32, {5, 3}, {0.1f}, "inner dimensions"},
                        Case{DType::UInt8, DType::Float32, {8, 3}, {0.1f, 0.2f}, "w_scale has 2 entries for 3"},
                        Case{DType::UInt8, DType::Float32, {8, 3}, {-1.0f}, "w_scale must be positive"}}) {
    INFO(c.message);
    Graph g;
    g.opsets.emplace(fused::kDomain, fused::kDomainVersion);
    Value* a = g.add_input("a", c.a, Shape{4, 8});
    Value* s = g.add_input("s", c.scale, Shape{});
    Value* z = g.add_input("z", DType::UInt8, Shape{});
    Value* w = g.add_constant("w", Tensor(DType::Int8, c.w));
    g.add_output(g.add_node("DynQMatMul", {a, s, z, w}, {"y"}, {{"w_scale", c.w_scale}}, "dq_mm", fused::kDomain)->output(0));
    try {
      infer_shapes(g);
      FAIL("no error");
    } catch (const Error& e) {
      std::string what = e.what();
      INFO(what);
      CHECK(what.find("dq_mm") != std::string::npos);
      CHECK(what.find(c.message) != std::string::npos);
    }
  }
}

#ifdef ONDINE_TEST_HAVE_IMPORT
TEST_CASE("quantize-dynamic on models/bert.onnx (when generated): cosine to fp32 >= 0.99", "[qoperator][dynamic][e2e]") {
  auto loaded = test::example_model("bert.onnx");
  if (!loaded) return;
  Graph g = std::move(*loaded);
  std::size_t weights = 0;
  for (Node* n : g.nodes())
    if (n->op_type() == "MatMul" && n->input(1)->is_constant()) ++weights;
  Graph q = g.clone();
  make_pass_manager("quantize-dynamic").run(q);
  CHECK(q.count_ops("MatMulInteger") == weights);
  CHECK(q.count_ops("MatMul") == g.count_ops("MatMul") - weights);
  Tensor ids(DType::Int64, {1, 128});
  std::mt19937 rng(42);
  for (std::int64_t i = 0; i < ids.numel(); ++i) ids.data<std::int64_t>()[i] = static_cast<std::int64_t>(rng() % 1000);
  auto a = ReferenceExecutor(g).run({{"input_ids", ids}}), b = ReferenceExecutor(q).run({{"input_ids", ids}});
  double c = cosine(a.at("last_hidden_state"), b.at("last_hidden_state"));
  INFO("cosine " << c);
  CHECK(c >= 0.99);
}
#endif

}  // namespace test_quant_qoperator
