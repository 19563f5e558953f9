// Reference kernels and shape inference of the math ops, on small hand-computed cases.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "ondine/reference/executor.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_reference_math {

using namespace ondine;

namespace {

// One op on the given inputs. An input listed in `constants` becomes an initializer (so inference
// sees its data); an empty Tensor is an omitted optional input.
struct OpCase {
  OpCase(std::string op_, std::vector<Tensor> inputs_, std::map<std::string, Attribute> attrs_ = {}, int opset_ = 17,
         std::vector<std::size_t> constants_ = {})
      : op(std::move(op_)), inputs(std::move(inputs_)), attrs(std::move(attrs_)), opset(opset_),
        constants(std::move(constants_)) {}
  std::string op;
  std::vector<Tensor> inputs;
  std::map<std::string, Attribute> attrs;
  int opset;
  std::vector<std::size_t> constants;
};

struct OpResult {
  Tensor output;
  DType inferred_type;
  Shape inferred_shape;
};

Graph build(const OpCase& c) {
  Graph g;
  g.opsets[""] = c.opset;
  std::vector<Value*> ins;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.inputs[i];
    std::string name = "in" + std::to_string(i);
    if (t.empty()) ins.push_back(nullptr);
    else if (std::find(c.constants.begin(), c.constants.end(), i) != c.constants.end()) ins.push_back(g.add_constant(name, t));
    else ins.push_back(g.add_input(name, t.dtype(), t.shape()));
  }
  g.add_output(g.add_node(c.op, ins, {"out"}, c.attrs, "node_" + c.op)->output(0));
  return g;
}

OpResult run(const OpCase& c) {
  Graph g = build(c);
  infer_shapes(g);
  std::map<std::string, Tensor> feeds;
  for (Value* in : g.inputs()) feeds[in->name()] = c.inputs[static_cast<std::size_t>(std::stoi(in->name().substr(2)))];
  ReferenceExecutor exec(g);
  Tensor out = exec.run(feeds).at("out");
  Value* v = g.find_value("out");
  return {out, v->dtype(), v->shape()};
}

template <typename T>
Tensor t(std::vector<std::int64_t> dims, std::vector<T> v) {
  return Tensor::from_vector<T>(std::move(dims), v);
}
Tensor f32(std::vector<std::int64_t> dims, std::vector<float> v) { return t<float>(std::move(dims), std::move(v)); }

template <typename T>
std::vector<T> values(const Tensor& x) {
  const T* p = x.data<T>();
  return std::vector<T>(p, p + x.numel());
}
std::vector<double> as_doubles(const Tensor& x) {
  std::vector<double> out;
  for (std::int64_t i = 0; i < x.numel(); ++i) out.push_back(x.at_double(static_cast<std::size_t>(i)));
  return out;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-6) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    if (std::isnan(want[i])) CHECK(std::isnan(got[i]));
    else CHECK(got[i] == Approx(want[i]).margin(tol));
  }
}

// Expects an Error naming the node and op whose message contains `needle`.
template <typename F>
void expect_node_error(F&& f, const std::string& op, const std::string& needle) {
  try {
    f();
    FAIL("no error thrown");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.node() == "node_" + op);
    CHECK(e.op() == op);
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("Add broadcasts [2,1,3] + [4,1] to [2,4,3]", "[math][broadcast]") {
  Tensor a = f32({2, 1, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = f32({4, 1}, {10, 20, 30, 40});
  OpResult r = run({"Add", {a, b}});
  REQUIRE(r.output.dims() == std::vector<std::int64_t>{2, 4, 3});
  CHECK(r.inferred_shape == Shape{2, 4, 3});
  CHECK(r.inferred_type == DType::Float32);
  std::vector<double> want;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 3; ++k) want.push_back((i * 3 + k + 1) + 10.0 * (j + 1));
  check_close(as_doubles(r.output), want);
}

TEST_CASE("Sub, Mul and Div of scalars and vectors", "[math][broadcast]") {
  Tensor a = f32({3}, {1, 2, 3});
  Tensor s = f32({}, {2});
  check_close(as_doubles(run({"Sub", {a, s}}).output), {-1, 0, 1});
  check_close(as_doubles(run({"Mul", {s, a}}).output), {2, 4, 6});
  check_close(as_doubles(run({"Div", {a, s}}).output), {0.5, 1, 1.5});
  // uint8 wraps like the hardware.
  OpResult u = run({"Add", {t<std::uint8_t>({2}, {250, 3}), t<std::uint8_t>({2}, {10, 4})}});
  CHECK(values<std::uint8_t>(u.output) == std::vector<std::uint8_t>{4, 7});
}

TEST_CASE("integer Div truncates toward zero; division by zero is an error", "[math][int]") {
  Tensor a = t<std::int32_t>({4}, {7, -7, 7, -7});
  Tensor b = t<std::int32_t>({4}, {2, 2, -2, -2});
  CHECK(values<std::int32_t>(run({"Div", {a, b}}).output) == std::vector<std::int32_t>{3, -3, -3, 3});
  Tensor m = t<std::int32_t>({2}, {std::numeric_limits<std::int32_t>::min(), 5});
  Tensor d = t<std::int32_t>({2}, {-1, 0});
  expect_node_error([&] { run({"Div", {m, d}}); }, "Div", "division by zero");
  Tensor d1 = t<std::int32_t>({2}, {-1, 1});
  CHECK(values<std::int32_t>(run({"Div", {m, d1}}).output) ==
        std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::min(), 5});
}

TEST_CASE("Mod follows the divisor's sign, or the dividend's with fmod", "[math][int]") {
  Tensor a = t<std::int64_t>({4}, {-4, 7, 5, -5});
  Tensor b = t<std::int64_t>({4}, {3, -3, 2, -2});
  CHECK(values<std::int64_t>(run({"Mod", {a, b}}).output) == std::vector<std::int64_t>{2, -2, 1, -1});
  CHECK(values<std::int64_t>(run({"Mod", {a, b}, {{"fmod", std::int64_t{1}}}}).output) ==
        std::vector<std::int64_t>{-1, 1, 1, -1});
  check_close(as_doubles(run({"Mod", {f32({2}, {-4.5f, 7.5f}), f32({2}, {2, -2})}, {{"fmod", std::int64_t{1}}}}).output),
              {-0.5, 1.5});
  Graph g = build({"Mod", {f32({1}, {1}), f32({1}, {1})}});
  expect_node_error([&] { infer_shapes(g); }, "Mod", "fmod");
}

TEST_CASE("Pow with mixed base and exponent types", "[math]") {
  OpResult r = run({"Pow", {t<std::int32_t>({3}, {1, 2, 3}), f32({3}, {1, 2, 3})}});
  CHECK(r.output.dtype() == DType::Int32);
  CHECK(r.inferred_type == DType::Int32);
  CHECK(values<std::int32_t>(r.output) == std::vector<std::int32_t>{1, 4, 27});
  CHECK(values<std::int64_t>(run({"Pow", {t<std::int64_t>({3}, {3, -2, 2}), t<std::int64_t>({3}, {39, 3, -1})}}).output) ==
        std::vector<std::int64_t>{4052555153018976267LL, -8, 0});
  check_close(as_doubles(run({"Pow", {f32({2}, {4, 2}), t<std::int64_t>({}, {-1})}}).output), {0.25, 0.5});
}

TEST_CASE("Clip reads attributes before opset 11 and inputs after", "[math][clip]") {
  Tensor x = f32({5}, {-2, -0.5f, 0, 0.7f, 3});
  check_close(as_doubles(run({"Clip", {x}, {{"min", -1.0f}, {"max", 0.5f}}, 6}).output), {-1, -0.5, 0, 0.5, 0.5});
  check_close(as_doubles(run({"Clip", {x}, {{"max", 0.5f}}, 6}).output), {-2, -0.5, 0, 0.5, 0.5});
  check_close(as_doubles(run({"Clip", {x, f32({}, {-1}), f32({}, {0.5f})}, {}, 11}).output), {-1, -0.5, 0, 0.5, 0.5});
  check_close(as_doubles(run({"Clip", {x, Tensor(), f32({}, {0})}, {}, 13}).output), {-2, -0.5, 0, 0, 0});
  check_close(as_doubles(run({"Clip", {x}, {}, 13}).output), {-2, -0.5, 0, 0.7f, 3});
  // min > max: everything becomes max.
  check_close(as_doubles(run({"Clip", {x, f32({}, {2}), f32({}, {1})}, {}, 13}).output), {1, 1, 1, 1, 1});
  Tensor i8 = t<std::int8_t>({4}, {-128, -3, 4, 127});
  CHECK(values<std::int8_t>(run({"Clip", {i8, t<std::int8_t>({}, {-5}), t<std::int8_t>({}, {5})}, {}, 13}).output) ==
        std::vector<std::int8_t>{-5, -3, 4, 5});
  CHECK(values<std::int8_t>(run({"Clip", {i8, Tensor(), t<std::int8_t>({}, {0})}, {}, 13}).output) ==
        std::vector<std::int8_t>{-128, -3, 0, 0});
  expect_node_error([&] { run({"Clip", {x, f32({2}, {0, 1})}, {}, 13}); }, "Clip", "scalar");
}

TEST_CASE("activations", "[math][unary]") {
  Tensor x = f32({4}, {-2, -0.5f, 0, 1.5f});
  check_close(as_doubles(run({"Relu", {x}}).output), {0, 0, 0, 1.5});
  check_close(as_doubles(run({"LeakyRelu", {x}, {{"alpha", 0.1f}}}).output), {-0.2, -0.05, 0, 1.5}, 1e-6);
  check_close(as_doubles(run({"Sigmoid", {x}}).output),
              {1 / (1 + std::exp(2.0)), 1 / (1 + std::exp(0.5)), 0.5, 1 / (1 + std::exp(-1.5))});
  check_close(as_doubles(run({"HardSigmoid", {x}}).output), {0.1, 0.4, 0.5, 0.8});
  check_close(as_doubles(run({"HardSwish", {f32({3}, {-4, 1, 4})}}).output), {0, 1 * (1 / 6.0 + 0.5), 4});
  check_close(as_doubles(run({"Elu", {x}}).output), {std::expm1(-2.0), std::expm1(-0.5), 0, 1.5});
  check_close(as_doubles(run({"Softplus", {x}}).output),
              {std::log1p(std::exp(-2.0)), std::log1p(std::exp(-0.5)), std::log(2.0), std::log1p(std::exp(1.5))});
  check_close(as_doubles(run({"Softsign", {x}}).output), {-2 / 3.0, -0.5 / 1.5, 0, 1.5 / 2.5});
  check_close(as_doubles(run({"ThresholdedRelu", {x}}).output), {0, 0, 0, 1.5});
  check_close(as_doubles(run({"PRelu", {f32({2, 2}, {-1, 2, -3, 4}), f32({2}, {0.5f, 0.25f})}}).output),
              {-0.5, 2, -1.5, 4});
  CHECK(values<std::int32_t>(run({"Relu", {t<std::int32_t>({3}, {-4, 0, 9})}}).output) == std::vector<std::int32_t>{0, 0, 9});
  Graph g = build({"Sqrt", {t<std::int32_t>({1}, {4})}});
  expect_node_error([&] { infer_shapes(g); }, "Sqrt", "int32");
}

TEST_CASE("PRelu before opset 7 applies a slope per channel", "[math][unary]") {
  Tensor x = f32({1, 2, 2}, {-1, -2, -3, 4});
  check_close(as_doubles(run({"PRelu", {x, f32({2}, {0.5f, 0.25f})}, {}, 6}).output), {-0.5, -1, -0.75, 4});
}

TEST_CASE("Round is half to even; Sign, Abs, Neg on integers", "[math][unary]") {
  check_close(as_doubles(run({"Round", {f32({7}, {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 2.4f, -2.6f})}}).output),
              {0, 2, 2, -0, -2, 2, -3});
  CHECK(values<std::int16_t>(run({"Sign", {t<std::int16_t>({3}, {-7, 0, 3})}}).output) == std::vector<std::int16_t>{-1, 0, 1});
  CHECK(values<std::int8_t>(run({"Abs", {t<std::int8_t>({3}, {-128, -3, 4})}}).output) == std::vector<std::int8_t>{-128, 3, 4});
  CHECK(values<std::int64_t>(run({"Neg", {t<std::int64_t>({2}, {-3, 5})}}).output) == std::vector<std::int64_t>{3, -5});
}

TEST_CASE("comparisons and logic produce bool", "[math][compare]") {
  Tensor a = f32({3}, {1, 2, 3});
  Tensor b = f32({}, {2});
  OpResult r = run({"Less", {a, b}});
  CHECK(r.inferred_type == DType::Bool);
  CHECK(values<bool>(r.output) == std::vector<bool>{true, false, false});
  CHECK(values<bool>(run({"GreaterOrEqual", {a, b}}).output) == std::vector<bool>{false, true, true});
  CHECK(values<bool>(run({"Equal", {t<std::int32_t>({2}, {2, 3}), t<std::int32_t>({1}, {3})}}).output) ==
        std::vector<bool>{false, true});
  Tensor p = t<bool>({4}, {true, true, false, false});
  Tensor q = t<bool>({4}, {true, false, true, false});
  CHECK(values<bool>(run({"And", {p, q}}).output) == std::vector<bool>{true, false, false, false});
  CHECK(values<bool>(run({"Or", {p, q}}).output) == std::vector<bool>{true, true, true, false});
  CHECK(values<bool>(run({"Xor", {p, q}}).output) == std::vector<bool>{false, true, true, false});
  CHECK(values<bool>(run({"Not", {p}}).output) == std::vector<bool>{false, false, true, true});
  float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  Tensor s = f32({4}, {1, inf, -inf, nan});
  CHECK(values<bool>(run({"IsNaN", {s}}).output) == std::vector<bool>{false, false, false, true});
  CHECK(values<bool>(run({"IsInf", {s}, {{"detect_negative", std::int64_t{0}}}}).output) ==
        std::vector<bool>{false, true, false, false});
}

TEST_CASE("Where broadcasts condition, X and Y", "[math][where]") {
  Tensor c = t<bool>({2, 1}, {true, false});
  Tensor x = f32({1, 3}, {1, 2, 3});
  Tensor y = f32({}, {-1});
  OpResult r = run({"Where", {c, x, y}});
  REQUIRE(r.output.dims() == std::vector<std::int64_t>{2, 3});
  CHECK(r.inferred_shape == Shape{2, 3});
  check_close(as_doubles(r.output), {1, 2, 3, -1, -1, -1});
}

TEST_CASE("variadic Min, Max, Sum, Mean broadcast", "[math][variadic]") {
  Tensor a = f32({3}, {1, 5, 3});
  Tensor b = f32({2, 1}, {2, 4});
  Tensor c = f32({}, {3});
  check_close(as_doubles(run({"Max", {a, b, c}}).output), {3, 5, 3, 4, 5, 4});
  check_close(as_doubles(run({"Min", {a, b, c}}).output), {1, 2, 2, 1, 3, 3});
  check_close(as_doubles(run({"Sum", {a, b, c}}).output), {6, 10, 8, 8, 12, 10});
  check_close(as_doubles(run({"Mean", {a, b}}).output), {1.5, 3.5, 2.5, 2.5, 4.5, 3.5});
  check_close(as_doubles(run({"Max", {a}}).output), {1, 5, 3});
  CHECK(values<std::uint8_t>(run({"Max", {t<std::uint8_t>({2}, {1, 200}), t<std::uint8_t>({2}, {100, 2})}}).output) ==
        std::vector<std::uint8_t>{100, 200});
}

TEST_CASE("Cast truncates float to int and rounds to float16", "[math][cast]") {
  Tensor x = f32({5}, {1.9f, -1.9f, 300.0f, -0.0f, 0.5f});
  std::int64_t int8_code = 3, f16_code = 10, bool_code = 9;
  OpResult r = run({"Cast", {x}, {{"to", int8_code}}});
  CHECK(r.inferred_type == DType::Int8);
  CHECK(values<std::int8_t>(r.output) == std::vector<std::int8_t>{1, -1, 127, 0, 0});
  Tensor h = run({"Cast", {f32({3}, {1.0f, 65504.0f, 1.0f + 1.0f / 4096})}, {{"to", f16_code}}}).output;
  REQUIRE(h.dtype() == DType::Float16);
  CHECK(h.data<float16>()[0].bits == 0x3c00);
  CHECK(h.data<float16>()[1].bits == 0x7bff);
  CHECK(h.data<float16>()[2].bits == 0x3c00);  // halfway below the next half: rounds to even
  CHECK(values<bool>(run({"Cast", {x}, {{"to", bool_code}}}).output) == std::vector<bool>{true, true, true, false, true});
  CHECK(values<float>(run({"Cast", {t<bool>({2}, {true, false})}, {{"to", std::int64_t{1}}}}).output) ==
        std::vector<float>{1, 0});
  CHECK(values<std::uint8_t>(run({"Cast", {t<std::int32_t>({2}, {257, -1})}, {{"to", std::int64_t{2}}}}).output) ==
        std::vector<std::uint8_t>{1, 255});
  // A double just above a float16 halfway point rounds up (no double rounding through float).
  double just_above = 1.0 + 1.0 / 2048 + 1e-12;
  Tensor d = run({"Cast", {t<double>({1}, {just_above})}, {{"to", f16_code}}}).output;
  CHECK(d.data<float16>()[0].bits == 0x3c01);
  CHECK(run({"Cast", {x}, {{"to", std::string("FLOAT16")}}, 1}).output.dtype() == DType::Float16);
  // To STRING (8) is a cast like the others since string tensors keep their elements (tests/test_reference_text.cpp).
  Graph g = build({"Cast", {x}, {{"to", std::int64_t{8}}}});
  infer_shapes(g);
  CHECK(g.outputs()[0]->dtype() == DType::String);
}

TEST_CASE("CastLike takes its target type from the second input", "[math][cast]") {
  Tensor x = f32({3}, {1.9f, -2.5f, 300.0f});
  OpResult r = run({"CastLike", {x, t<std::int8_t>({1}, {0})}, {}, 15});
  CHECK(r.inferred_type == DType::Int8);
  CHECK(r.inferred_shape == Shape{3});
  CHECK(values<std::int8_t>(r.output) == std::vector<std::int8_t>{1, -2, 127});  // as Cast: truncate, saturate
  OpResult h = run({"CastLike", {t<double>({1}, {1.0 + 1.0 / 2048 + 1e-12}), t<float16>({2}, {float16(0.f), float16(0.f)})}, {}, 15});
  CHECK(h.inferred_type == DType::Float16);
  CHECK(h.output.data<float16>()[0].bits == 0x3c01);
  // Before opset 19 a cast to bfloat16 truncates, as Cast does: 0x3f80ff00 keeps its high half (nearest
  // would give 0x3f81).
  OpResult b = run({"CastLike", {f32({1}, {1.0f + 255.0f / 32768}), t<bfloat16>({1}, {bfloat16(0.f)})}, {}, 15});
  CHECK(b.output.data<bfloat16>()[0].bits == 0x3f80);
}

TEST_CASE("Shrink: hard and soft shrinkage", "[math][unary]") {
  Tensor x = f32({5}, {-2, -0.5f, 0.2f, 0.7f, 2});
  // Defaults lambd 0.5, bias 0: values within [-0.5, 0.5] become 0.
  check_close(as_doubles(run({"Shrink", {x}, {}, 9}).output), {-2, 0, 0, 0.7, 2});
  OpResult soft = run({"Shrink", {x}, {{"lambd", 1.0f}, {"bias", 1.0f}}, 9});
  CHECK(soft.inferred_type == DType::Float32);
  check_close(as_doubles(soft.output), {-1, 0, 0, 0, 1});
  CHECK(values<std::int8_t>(run({"Shrink", {t<std::int8_t>({3}, {-3, 1, 3})}, {{"lambd", 1.5f}, {"bias", 1.0f}}, 9}).output) ==
        std::vector<std::int8_t>{-2, 0, 2});
  expect_node_error([&] { run({"Shrink", {t<bool>({1}, {true})}, {}, 9}); }, "Shrink", "bool");
}

TEST_CASE("Det of a batch of matrices", "[math][det]") {
  // [[1, 2], [3, 4]] -> -2; [[2, 0], [0, 3]] -> 6.
  OpResult r = run({"Det", {f32({2, 2, 2}, {1, 2, 3, 4, 2, 0, 0, 3})}, {}, 11});
  CHECK(r.inferred_shape == Shape{2});
  check_close(as_doubles(r.output), {-2, 6});
  // A zero first pivot needs a row swap; a singular matrix gives 0.
  check_close(as_doubles(run({"Det", {t<double>({3, 3}, {0, 1, 2, 1, 0, 3, 4, -3, 8})}, {}, 11}).output), {-2});
  check_close(as_doubles(run({"Det", {f32({3, 3}, {1, 2, 3, 2, 4, 6, 1, 1, 1})}, {}, 11}).output), {0});
  OpResult h = run({"Det", {t<float16>({1, 1}, {float16(-3.f)})}, {}, 11});
  CHECK(h.inferred_shape == Shape{});
  check_close(as_doubles(h.output), {-3});
  Graph g = build({"Det", {f32({2, 3}, {1, 2, 3, 4, 5, 6})}, {}, 11});
  expect_node_error([&] { infer_shapes(g); }, "Det", "[*, M, M]");
  expect_node_error([&] { run({"Det", {t<std::int32_t>({2, 2}, {1, 2, 3, 4})}, {}, 11}); }, "Det", "int32");
}

TEST_CASE("QuantizeLinear rounds half to even and saturates", "[math][quant]") {
  Tensor x = f32({7}, {0.5f, 1.5f, 2.5f, -0.5f, 300.0f, -300.0f, 5.0f});
  OpResult u = run({"QuantizeLinear", {x, f32({}, {1.0f})}, {}, 10});
  CHECK(u.inferred_type == DType::UInt8);
  CHECK(values<std::uint8_t>(u.output) == std::vector<std::uint8_t>{0, 2, 2, 0, 255, 0, 5});
  OpResult s = run({"QuantizeLinear", {x, f32({}, {2.0f}), t<std::int8_t>({}, {-1})}, {}, 13});
  CHECK(s.inferred_type == DType::Int8);
  // x / 2 = .25 .75 1.25 -.25 150 -150 2.5 -> 0 1 1 0 150 -150 2, then -1 and saturate.
  CHECK(values<std::int8_t>(s.output) == std::vector<std::int8_t>{-1, 0, 0, -1, 127, -128, 1});
  // Per axis: one scale and zero point per channel of axis 1.
  Tensor xa = f32({1, 2, 2}, {1, 2, 3, 4});
  OpResult a = run({"QuantizeLinear", {xa, f32({2}, {1, 2}), t<std::uint8_t>({2}, {10, 20})}, {}, 13});
  CHECK(values<std::uint8_t>(a.output) == std::vector<std::uint8_t>{11, 12, 22, 22});
  expect_node_error([&] { run({"QuantizeLinear", {xa, f32({2}, {1, 2})}, {}, 10}); }, "QuantizeLinear", "scalar");
  expect_node_error([&] { run({"QuantizeLinear", {xa, f32({3}, {1, 2, 3})}, {}, 13}); }, "QuantizeLinear", "axis");
}

TEST_CASE("DequantizeLinear per tensor and per axis", "[math][quant]") {
  OpResult r = run({"DequantizeLinear", {t<std::uint8_t>({3}, {0, 3, 255}), f32({}, {2}), t<std::uint8_t>({}, {128})}, {}, 10});
  CHECK(r.inferred_type == DType::Float32);
  check_close(as_doubles(r.output), {-256, -250, 254});
  OpResult a = run({"DequantizeLinear",
                    {t<std::int8_t>({2, 2}, {-1, 1, 2, 3}), f32({2}, {1, 0.5f}), t<std::int8_t>({2}, {0, 1})},
                    {{"axis", std::int64_t{0}}},
                    13});
  check_close(as_doubles(a.output), {-1, 1, 0.5, 1});
}

TEST_CASE("reductions with and without keepdims, axes as attribute and as input", "[math][reduce]") {
  Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  auto axes = [](std::vector<std::int64_t> v) { return t<std::int64_t>({static_cast<std::int64_t>(v.size())}, v); };
  // ReduceSum-13: axes input.
  OpResult s = run({"ReduceSum", {x, axes({1})}, {{"keepdims", std::int64_t{0}}}, 13, {1}});
  CHECK(s.output.dims() == std::vector<std::int64_t>{2});
  CHECK(s.inferred_shape == Shape{2});
  check_close(as_doubles(s.output), {6, 15});
  OpResult all = run({"ReduceSum", {x}, {}, 13});
  CHECK(all.output.dims() == std::vector<std::int64_t>{1, 1});
  check_close(as_doubles(all.output), {21});
  OpResult noop = run({"ReduceSum", {x}, {{"noop_with_empty_axes", std::int64_t{1}}}, 13});
  CHECK(noop.output.dims() == std::vector<std::int64_t>{2, 3});
  // ReduceSum-11: axes attribute.
  check_close(as_doubles(run({"ReduceSum", {x}, {{"axes", std::vector<std::int64_t>{0}}}, 11}).output), {5, 7, 9});
  // Others take the attribute up to opset 17.
  OpResult m = run({"ReduceMean", {x}, {{"axes", std::vector<std::int64_t>{-1}}}, 13});
  CHECK(m.output.dims() == std::vector<std::int64_t>{2, 1});
  CHECK(m.inferred_shape == Shape{2, 1});
  check_close(as_doubles(m.output), {2, 5});
  check_close(as_doubles(run({"ReduceMax", {x}, {{"axes", std::vector<std::int64_t>{0}}}}).output), {4, 5, 6});
  check_close(as_doubles(run({"ReduceMin", {x}, {{"keepdims", std::int64_t{0}}}}).output), {1});
  check_close(as_doubles(run({"ReduceProd", {x}, {{"axes", std::vector<std::int64_t>{1}}}}).output), {6, 120});
  check_close(as_doubles(run({"ReduceSumSquare", {x}, {{"axes", std::vector<std::int64_t>{1}}}}).output), {14, 77});
  check_close(as_doubles(run({"ReduceL1", {f32({2}, {-1, 2})}}).output), {3});
  check_close(as_doubles(run({"ReduceL2", {f32({2}, {3, -4})}}).output), {5});
  check_close(as_doubles(run({"ReduceLogSum", {x}, {{"axes", std::vector<std::int64_t>{1}}}}).output),
              {std::log(6.0), std::log(15.0)});
  check_close(as_doubles(run({"ReduceLogSumExp", {f32({2}, {1000, 1000})}}).output), {1000 + std::log(2.0)}, 1e-3);
  // Integers are exact in their own type; the integer mean truncates.
  CHECK(values<std::int32_t>(run({"ReduceMean", {t<std::int32_t>({3}, {1, 2, 2})}}).output) == std::vector<std::int32_t>{1});
  CHECK(values<std::int64_t>(run({"ReduceSum", {t<std::int64_t>({2}, {(1LL << 62), (1LL << 62) - 1})}}).output) ==
        std::vector<std::int64_t>{(1LL << 62) + ((1LL << 62) - 1)});
  expect_node_error([&] { run({"ReduceMax", {x}, {{"axes", std::vector<std::int64_t>{2}}}}); }, "ReduceMax", "out of range");
}

TEST_CASE("ArgMax and ArgMin with keepdims and select_last_index", "[math][reduce]") {
  Tensor x = f32({2, 3}, {1, 3, 3, 2, 0, 2});
  OpResult r = run({"ArgMax", {x}, {{"axis", std::int64_t{1}}}});
  CHECK(r.inferred_type == DType::Int64);
  CHECK(r.output.dims() == std::vector<std::int64_t>{2, 1});
  CHECK(values<std::int64_t>(r.output) == std::vector<std::int64_t>{1, 0});
  CHECK(values<std::int64_t>(run({"ArgMax", {x}, {{"axis", std::int64_t{1}}, {"select_last_index", std::int64_t{1}}}}).output) ==
        std::vector<std::int64_t>{2, 2});
  OpResult m = run({"ArgMin", {x}, {{"keepdims", std::int64_t{0}}}});
  CHECK(m.output.dims() == std::vector<std::int64_t>{3});
  CHECK(values<std::int64_t>(m.output) == std::vector<std::int64_t>{0, 1, 1});
}

TEST_CASE("BitShift, trigonometry and Erf", "[math][unary]") {
  Tensor a = t<std::uint8_t>({3}, {1, 16, 255});
  Tensor b = t<std::uint8_t>({3}, {1, 2, 9});
  CHECK(values<std::uint8_t>(run({"BitShift", {a, b}, {{"direction", std::string("LEFT")}}}).output) ==
        std::vector<std::uint8_t>{2, 64, 0});
  CHECK(values<std::uint8_t>(run({"BitShift", {a, b}, {{"direction", std::string("RIGHT")}}}).output) ==
        std::vector<std::uint8_t>{0, 4, 0});
  Tensor x = f32({2}, {0.25f, -0.5f});
  check_close(as_doubles(run({"Sin", {x}}).output), {std::sin(0.25), std::sin(-0.5)});
  check_close(as_doubles(run({"Atanh", {x}}).output), {std::atanh(0.25), std::atanh(-0.5)});
  check_close(as_doubles(run({"Erf", {x}}).output), {std::erf(0.25), std::erf(-0.5)});
}

TEST_CASE("float16 inputs are computed in double and rounded once", "[math][float16]") {
  Tensor h(DType::Float16, {2});
  h.data<float16>()[0] = float16(1.0f);
  h.data<float16>()[1] = float16(-2.0f);
  OpResult r = run({"Add", {h, h}});
  CHECK(r.output.dtype() == DType::Float16);
  check_close(as_doubles(r.output), {2, -4});
}

TEST_CASE("shape inference broadcasts symbolic dims", "[math][infer]") {
  Graph g;
  Value* a = g.add_input("a", DType::Float32, Shape{Dim::named("N"), 1, 3});
  Value* b = g.add_input("b", DType::Float32, Shape{4, 1});
  Value* c = g.add_input("c", DType::Float32, Shape{Dim::named("N"), Dim::named("M")});
  Value* s1 = g.add_op("Add", {a, b});
  Value* s2 = g.add_op("Mul", {c, g.add_input("d", DType::Float32, Shape{1, Dim::named("M")})});
  Value* cmp = g.add_op("Less", {a, b});
  Value* red = g.add_op("ReduceMean", {a}, {{"axes", std::vector<std::int64_t>{-1}}, {"keepdims", std::int64_t{0}}});
  Value* am = g.add_op("ArgMax", {c}, {{"axis", std::int64_t{0}}});
  Value* q = g.add_op("QuantizeLinear", {c, g.add_constant("s", f32({}, {1})), g.add_constant("z", t<std::int8_t>({}, {0}))});
  Value* dq = g.add_op("DequantizeLinear", {q, g.add_constant("s2", f32({}, {1}))});
  Value* axes_in = g.add_input("axes", DType::Int64, Shape{1});
  Value* dyn_keep = g.add_op("ReduceSum", {a, axes_in});
  Value* dyn_drop = g.add_op("ReduceSum", {a, axes_in}, {{"keepdims", std::int64_t{0}}});
  Value* cast = g.add_op("Cast", {c}, {{"to", std::int64_t{7}}});
  infer_shapes(g);
  CHECK(s1->shape() == Shape{Dim::named("N"), 4, 3});
  CHECK(s1->dtype() == DType::Float32);
  CHECK(s2->shape() == Shape{Dim::named("N"), Dim::named("M")});
  CHECK(cmp->dtype() == DType::Bool);
  CHECK(red->shape() == Shape{Dim::named("N"), 1});
  CHECK(am->dtype() == DType::Int64);
  CHECK(am->shape() == Shape{1, Dim::named("M")});
  CHECK(q->dtype() == DType::Int8);
  CHECK(dq->dtype() == DType::Float32);
  CHECK(dq->shape() == c->shape());
  CHECK(dyn_keep->shape().rank_known());
  CHECK(dyn_keep->shape().rank() == 3);
  CHECK_FALSE(dyn_keep->shape()[0].is_static());
  CHECK_FALSE(dyn_drop->shape().rank_known());
  CHECK(cast->dtype() == DType::Int64);
  CHECK(cast->shape() == c->shape());
}

TEST_CASE("legacy broadcast with axis before opset 7", "[math][broadcast]") {
  Tensor a = f32({2, 3, 2}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  Tensor b = f32({3}, {1, 2, 3});
  OpResult r = run({"Add", {a, b}, {{"broadcast", std::int64_t{1}}, {"axis", std::int64_t{1}}}, 6});
  CHECK(r.inferred_shape == Shape{2, 3, 2});
  check_close(as_doubles(r.output), {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
}

TEST_CASE("errors name the node and the op", "[math][errors]") {
  // Non-broadcastable shapes, at inference and at run time.
  Graph g = build({"Add", {f32({2, 3}, {1, 2, 3, 4, 5, 6}), f32({4}, {1, 2, 3, 4})}});
  expect_node_error([&] { infer_shapes(g); }, "Add", "[2,3] and [4]");
  Graph g2 = build({"Add", {f32({2, 3}, {1, 2, 3, 4, 5, 6}), f32({4}, {1, 2, 3, 4})}});
  expect_node_error([&] { ReferenceExecutor(g2).run({{"in0", f32({2, 3}, {1, 2, 3, 4, 5, 6})}, {"in1", f32({4}, {1, 2, 3, 4})}}); },
                    "Add", "[2,3] and [4]");
  // Different element types.
  Graph g3 = build({"Add", {f32({1}, {1}), t<std::int32_t>({1}, {1})}});
  expect_node_error([&] { infer_shapes(g3); }, "Add", "float32 and int32");
  Graph g4 = build({"Where", {f32({1}, {1}), f32({1}, {1}), f32({1}, {1})}});
  expect_node_error([&] { infer_shapes(g4); }, "Where", "bool");
  Graph g5 = build({"BitShift", {t<std::uint8_t>({1}, {1}), t<std::uint8_t>({1}, {1})}, {{"direction", std::string("UP")}}});
  expect_node_error([&] { infer_shapes(g5); }, "BitShift", "direction");
  Graph g6 = build({"ArgMax", {f32({2}, {1, 2})}, {{"axis", std::int64_t{3}}}});
  expect_node_error([&] { infer_shapes(g6); }, "ArgMax", "out of range");
}

TEST_CASE("bad attributes and input types are errors, not crashes", "[math][errors]") {
  Tensor x = f32({2}, {1, 2});
  expect_node_error([&] { run({"Cast", {x}}); }, "Cast", "'to'");
  expect_node_error([&] { run({"Cast", {x}, {{"to", std::int64_t{99}}}}); }, "Cast", "99");
  expect_node_error([&] { run({"ReduceSum", {x, f32({1}, {0})}, {}, 13, {1}}); }, "ReduceSum", "float32");
  expect_node_error([&] { run({"QuantizeLinear", {x, f32({}, {1}), f32({}, {0})}, {}, 13}); }, "QuantizeLinear", "uint8, int8, uint4 or int4");
  expect_node_error([&] { run({"DequantizeLinear", {x, f32({}, {1})}, {}, 13}); }, "DequantizeLinear", "float32");
  expect_node_error([&] { run({"Mean", {t<std::int32_t>({1}, {1})}}); }, "Mean", "int32");
  expect_node_error([&] { run({"Add", {f32({3}, {1, 2, 3}), f32({3}, {1, 2, 3})}, {{"broadcast", std::int64_t{1}}, {"axis", std::int64_t{2}}}, 6}); },
                    "Add", "axis");
  expect_node_error([&] { run({"Pow", {x, t<bool>({1}, {true})}}); }, "Pow", "bool");
  expect_node_error([&] { run({"PRelu", {x, f32({3}, {1, 2, 3})}}); }, "PRelu", "[2] and [3]");
  expect_node_error([&] { run({"Mod", {t<std::int32_t>({1}, {1}), t<std::int32_t>({1}, {0})}}); }, "Mod", "modulo by zero");
  expect_node_error([&] { run({"Pow", {t<std::int32_t>({1}, {0}), t<std::int32_t>({1}, {-1})}}); }, "Pow", "negative power");
}

TEST_CASE("integer arithmetic wraps instead of overflowing", "[math][int]") {
  std::int32_t big = std::numeric_limits<std::int32_t>::max();
  CHECK(values<std::int32_t>(run({"Mul", {t<std::int32_t>({1}, {big}), t<std::int32_t>({1}, {2})}}).output) ==
        std::vector<std::int32_t>{-2});
  CHECK(values<std::int32_t>(run({"Add", {t<std::int32_t>({1}, {big}), t<std::int32_t>({1}, {1})}}).output) ==
        std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::min()});
  CHECK(values<std::int64_t>(run({"Neg", {t<std::int64_t>({1}, {std::numeric_limits<std::int64_t>::min()})}}).output) ==
        std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min()});
  // Float -> int Cast of NaN / out-of-range values saturates (a plain C++ cast would be undefined).
  float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(values<std::int32_t>(run({"Cast", {f32({3}, {nan, 1e20f, -1e20f})}, {{"to", std::int64_t{6}}}}).output) ==
        std::vector<std::int32_t>{0, big, std::numeric_limits<std::int32_t>::min()});
}

// --- Einsum ---------------------------------------------------------------------------------------

TEST_CASE("Einsum: matmul, transposes, sums, diagonals, ellipsis and the implicit output", "[math][einsum]") {
  auto eq = [](const char* e) { return std::map<std::string, Attribute>{{"equation", std::string(e)}}; };
  const Tensor a = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor b = f32({3, 2}, {1, -1, 2, 0, 0, 3});
  // [[1,2,3],[4,5,6]] x [[1,-1],[2,0],[0,3]] = [[5,8],[14,14]]
  OpResult r = run({"Einsum", {a, b}, eq("ij,jk->ik"), 12});
  CHECK(r.output.dims() == std::vector<std::int64_t>{2, 2});
  check_close(as_doubles(r.output), {5, 8, 14, 14});
  check_close(as_doubles(run({"Einsum", {a, b}, eq("ij, jk -> ki"), 12}).output), {5, 14, 8, 14});
  check_close(as_doubles(run({"Einsum", {a, b}, eq("ij,jk"), 12}).output), {5, 8, 14, 14});  // implicit: ik
  check_close(as_doubles(run({"Einsum", {a}, eq("ij->ji"), 12}).output), {1, 4, 2, 5, 3, 6});
  check_close(as_doubles(run({"Einsum", {a}, eq("ij->i"), 12}).output), {6, 15});
  check_close(as_doubles(run({"Einsum", {a}, eq("ij->"), 12}).output), {21});
  check_close(as_doubles(run({"Einsum", {a}, eq("ji"), 12}).output), {1, 4, 2, 5, 3, 6});  // implicit: ij of "ji"
  check_close(as_doubles(run({"Einsum", {f32({3}, {1, 2, 3}), f32({3}, {4, 5, 6})}, eq("i,i"), 12}).output), {32});
  check_close(as_doubles(run({"Einsum", {f32({2}, {1, 2}), f32({3}, {1, 10, 100})}, eq("i,j->ij"), 12}).output),
              {1, 10, 100, 2, 20, 200});
  const Tensor sq = f32({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  check_close(as_doubles(run({"Einsum", {sq}, eq("...ii->...i"), 12}).output), {1, 4, 5, 8});  // batch diagonal
  check_close(as_doubles(run({"Einsum", {sq}, eq("bii->b"), 12}).output), {5, 13});            // batch trace
  // Ellipsis broadcasting: [2,1,2] x [3,2] over "...j,...j->..." gives [2,3].
  check_close(as_doubles(run({"Einsum", {f32({2, 1, 2}, {1, 2, 3, 4}), f32({3, 2}, {1, 1, 2, 2, 3, 3})},
                              eq("...j,...j->..."), 12})
                             .output),
              {3, 6, 9, 7, 14, 21});
  // Three operands; int64 exact.
  OpResult i3 = run({"Einsum", {t<std::int64_t>({2}, {1, 2}), t<std::int64_t>({2, 2}, {1, 2, 3, 4}),
                                t<std::int64_t>({2}, {3, 1})},
                     eq("i,ij,j->"), 12});
  CHECK(i3.output.dtype() == DType::Int64);
  CHECK(values<std::int64_t>(i3.output) == std::vector<std::int64_t>{1 * 1 * 3 + 1 * 2 * 1 + 2 * 3 * 3 + 2 * 4 * 1});
}

TEST_CASE("Einsum inference keeps symbols and rejects what does not fit", "[math][einsum][infer]") {
  Graph g;
  g.opsets[""] = 12;
  Value* q = g.add_input("q", DType::Float32, Shape{Dim::named("B"), 4, Dim::named("S"), 8});
  Value* k = g.add_input("k", DType::Float32, Shape{Dim::named("B"), 4, Dim::named("T"), 8});
  Node* n = g.add_node("Einsum", {q, k}, {"s"}, {{"equation", std::string("bhqd,bhkd->bhqk")}}, "node_Einsum");
  g.add_output(n->output(0));
  infer_shapes(g);
  CHECK(n->output(0)->shape() == Shape{Dim::named("B"), 4, Dim::named("S"), Dim::named("T")});
  auto eq = [](const char* e) { return std::map<std::string, Attribute>{{"equation", std::string(e)}}; };
  expect_node_error([&] { run({"Einsum", {f32({2, 3}, {1, 2, 3, 4, 5, 6}), f32({2, 3}, {1, 2, 3, 4, 5, 6})}, eq("ij,jk->ik"), 12}); },
                    "Einsum", "label 'j' has sizes 3 and 2");
  expect_node_error([&] { run({"Einsum", {f32({2, 3}, {1, 2, 3, 4, 5, 6})}, eq("ijk->i"), 12}); }, "Einsum",
                    "has rank 2 but its term");
  expect_node_error([&] { run({"Einsum", {f32({2, 3}, {1, 2, 3, 4, 5, 6})}, eq("ij->k"), 12}); }, "Einsum",
                    "output label 'k' in no input term");
  expect_node_error([&] { run({"Einsum", {f32({2, 3}, {1, 2, 3, 4, 5, 6})}, eq("i1->i"), 12}); }, "Einsum",
                    "where a letter");
}

}  // namespace test_reference_math
