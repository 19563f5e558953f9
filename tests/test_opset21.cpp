// Opsets 19-21 and the default-domain ops added with them: the opset 19-21 forms of ops whose semantics
// changed (AveragePool dilations, Pad wrap, ReduceMax/ReduceMin of bool, Gelu, GroupNormalization's
// per-channel scale, QuantizeLinear's output_dtype and block_size), the new ops' reference kernels against
// hand-computed values (Mish, Bitwise*, CenterCropPad, LpNormalization, LpPool, GlobalLpPool, MaxRoiPool,
// AffineGrid), the compiled engine against the reference on an opset-21 graph, and the importer's answers
// for opset 21 (accepted), opset 22 and float8 / int4 tensors (refused by name). Debian's torch exports
// only up to opset 17, so the graphs are built through the IR and through hand-written ModelProtos.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "onnx/onnx_pb.h"
#include "ondine/ir/shape_inference.hpp"
#include "ondine/lower/lower.hpp"
#include "ondine/onnx/import.hpp"
#include "ondine/reference/executor.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_opset21 {

using namespace ondine;
using test::error_of;
using test::node_error;
using Attrs = std::map<std::string, Attribute>;
using Ints = std::vector<std::int64_t>;
using Catch::Matchers::Contains;

namespace {

Tensor ft(Ints dims, std::vector<float> values) { return Tensor::from_vector<float>(std::move(dims), values); }
Tensor i64s(Ints dims, std::vector<std::int64_t> values) {
  return Tensor::from_vector<std::int64_t>(std::move(dims), values);
}

// One node at `opset` on the given inputs (those listed in `constants` become initializers). Inference
// must agree with the kernel on the type and on every dim it knows.
struct OpCase {
  std::string op;
  std::vector<Tensor> inputs;
  Attrs attrs = {};
  int opset = 21;
  std::vector<std::size_t> constants = {};
};

Graph build(const OpCase& c, std::map<std::string, Tensor>& feeds) {
  Graph g;
  g.opsets[""] = c.opset;
  std::vector<Value*> ins;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const std::string name = "in" + std::to_string(i);
    if (std::find(c.constants.begin(), c.constants.end(), i) != c.constants.end()) {
      ins.push_back(g.add_constant(name, c.inputs[i]));
    } else {
      ins.push_back(g.add_input(name, c.inputs[i].dtype(), c.inputs[i].shape()));
      feeds[name] = c.inputs[i];
    }
  }
  Node* n = g.add_node(c.op, ins, {"out"}, c.attrs, "node_under_test");
  g.add_output(n->output(0));
  infer_shapes(g);
  return g;
}

Tensor run(const OpCase& c) {
  std::map<std::string, Tensor> feeds;
  Graph g = build(c, feeds);
  const Tensor got = ReferenceExecutor(g).run(feeds).at("out");
  const Value* v = g.find_value("out");
  INFO("inferred " << v->shape().str() << ", got " << dims_str(got.dims()));
  REQUIRE(v->dtype() == got.dtype());
  REQUIRE(v->shape().rank() == got.rank());
  for (std::size_t d = 0; d < got.rank(); ++d)
    if (v->shape()[d].is_static()) REQUIRE(v->shape()[d].value == got.dims()[d]);
  return got;
}

void require_close(const Tensor& got, Ints dims, const std::vector<double>& want, double tol = 1e-5) {
  REQUIRE(got.dims() == dims);
  REQUIRE(static_cast<std::size_t>(got.numel()) == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    REQUIRE(got.at_double(i) == Approx(want[i]).margin(tol));
  }
}

double gelu(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}

}  // namespace

// --- ops whose opset 19-21 forms changed ----------------------------------------------------------

TEST_CASE("Gelu (opset 20): erf and tanh forms on the reference and the compiled engine", "[opset21][gelu]") {
  const Tensor x = ft({2, 3}, {-3, -1, -0.25f, 0, 0.5f, 2});
  for (const char* approximate : {"none", "tanh"}) {
    OpCase c{"Gelu", {x}, {{"approximate", std::string(approximate)}}, 20};
    const Tensor y = run(c);
    std::vector<double> want;
    for (float v : x.to_floats()) want.push_back(std::string(approximate) == "none" ? gelu(v) : gelu_tanh(v));
    require_close(y, {2, 3}, want, 1e-6);
    std::map<std::string, Tensor> feeds;
    Graph g = build(c, feeds);
    CompiledModel m = lower::compile(g);
    require_close(m.run(feeds).at("out"), {2, 3}, want, 1e-5);
    bool on_onednn = false;
    for (const auto& s : m.steps()) on_onednn |= s.op == "Gelu" && s.implementation != "reference";
    CHECK(on_onednn);  // oneDNN eltwise gelu_erf / gelu_tanh, not the reference kernel
  }
  CHECK_THAT(node_error([&] { run({"Gelu", {x}, {{"approximate", std::string("fast")}}, 20}); }, "Gelu"),
             Contains("approximate"));
}

TEST_CASE("AveragePool (opset 19) with dilations", "[opset21][pool]") {
  // 1x1x5: kernel 2, dilation 2 averages x[i] and x[i + 2].
  const Tensor y = run({"AveragePool", {ft({1, 1, 5}, {1, 2, 3, 4, 10})},
                        {{"kernel_shape", Ints{2}}, {"dilations", Ints{2}}}, 19});
  require_close(y, {1, 1, 3}, {2, 3, 6.5});
}

TEST_CASE("Pad (opset 19) mode wrap", "[opset21][pad]") {
  const Tensor y = run({"Pad", {ft({1, 3}, {1, 2, 3}), i64s({4}, {0, 2, 0, 1})}, {{"mode", std::string("wrap")}}, 19, {1}});
  require_close(y, {1, 6}, {2, 3, 1, 2, 3, 1});
}

TEST_CASE("ReduceMax and ReduceMin (opset 20) of bool are any and all", "[opset21][reduce]") {
  Tensor b(DType::Bool, {2, 3});
  const bool v[] = {true, false, false, true, true, true};
  for (int i = 0; i < 6; ++i) b.data<bool>()[i] = v[i];
  const Tensor mx = run({"ReduceMax", {b, i64s({1}, {1})}, {{"keepdims", std::int64_t{0}}}, 20, {1}});
  const Tensor mn = run({"ReduceMin", {b, i64s({1}, {1})}, {{"keepdims", std::int64_t{0}}}, 20, {1}});
  REQUIRE(mx.dtype() == DType::Bool);
  CHECK(mx.data<bool>()[0] == true);
  CHECK(mx.data<bool>()[1] == true);
  CHECK(mn.data<bool>()[0] == false);
  CHECK(mn.data<bool>()[1] == true);
  // Before opset 20 bool is not a ReduceMax type.
  CHECK_THAT(node_error([&] { run({"ReduceMax", {b}, {}, 18}); }, "ReduceMax"), Contains("bool"));
}

TEST_CASE("GroupNormalization: scale per group at opset 18 and per channel at opset 21", "[opset21][groupnorm]") {
  // N=1, C=4, 2 spatial; 2 groups of channels {0,1} and {2,3}.
  const Tensor x = ft({1, 4, 2}, {1, 2, 3, 4, 10, 20, 30, 40});
  auto normalized = [](std::vector<double> v) {
    double mean = 0, var = 0;
    for (double e : v) mean += e;
    mean /= static_cast<double>(v.size());
    for (double e : v) var += (e - mean) * (e - mean);
    var /= static_cast<double>(v.size());
    for (double& e : v) e = (e - mean) / std::sqrt(var + 1e-5);
    return v;
  };
  const std::vector<double> g0 = normalized({1, 2, 3, 4}), g1 = normalized({10, 20, 30, 40});
  const Attrs attrs{{"num_groups", std::int64_t{2}}};
  const Tensor y18 = run({"GroupNormalization", {x, ft({2}, {2, 3}), ft({2}, {0.5f, -1})}, attrs, 18});
  require_close(y18, {1, 4, 2},
                {g0[0] * 2 + 0.5, g0[1] * 2 + 0.5, g0[2] * 2 + 0.5, g0[3] * 2 + 0.5, g1[0] * 3 - 1, g1[1] * 3 - 1,
                 g1[2] * 3 - 1, g1[3] * 3 - 1});
  const Tensor y21 = run({"GroupNormalization", {x, ft({4}, {1, 2, 3, 4}), ft({4}, {0, 1, 2, 3})}, attrs, 21});
  require_close(y21, {1, 4, 2},
                {g0[0], g0[1], g0[2] * 2 + 1, g0[3] * 2 + 1, g1[0] * 3 + 2, g1[1] * 3 + 2, g1[2] * 4 + 3, g1[3] * 4 + 3});
  // Opset 21's per-channel scale given to an opset 18 node is a shape error naming the scale.
  CHECK_THAT(node_error([&] { run({"GroupNormalization", {x, ft({4}, {1, 2, 3, 4}), ft({4}, {0, 1, 2, 3})}, attrs, 18}); },
                        "GroupNormalization"),
             Contains("scale"));
  CHECK_THAT(node_error([&] { run({"GroupNormalization", {x, ft({4}, {1, 1, 1, 1}), ft({4}, {0, 0, 0, 0})},
                                   {{"num_groups", std::int64_t{3}}}, 21}); },
                        "GroupNormalization"),
             Contains("does not divide"));
}

TEST_CASE("QuantizeLinear (opset 21): output_dtype and block quantization", "[opset21][quantize]") {
  const Tensor x = ft({4}, {-1, 0.4f, 1, 300});
  const Tensor y = run({"QuantizeLinear", {x, ft({}, {0.5f})}, {{"output_dtype", std::int64_t{3}}}, 21, {1}});
  REQUIRE(y.dtype() == DType::Int8);
  CHECK(y.to_int64s() == Ints{-2, 1, 2, 127});
  // Blocked: elements 0-1 take scale 0.5, 2-3 scale 1 (uint8, zero point 0); a scale of the wrong blocked shape
  // is refused.
  CHECK(run({"QuantizeLinear", {x, ft({2}, {0.5f, 1})}, {{"block_size", std::int64_t{2}}, {"axis", std::int64_t{0}}}, 21, {1}})
            .to_int64s() == Ints{0, 1, 1, 255});
  CHECK_THAT(node_error([&] { run({"QuantizeLinear", {x, ft({3}, {0.5f, 1, 1})}, {{"block_size", std::int64_t{2}}, {"axis", std::int64_t{0}}}, 21, {1}}); },
                        "QuantizeLinear"),
             Contains("block_size 2"));
  CHECK_THAT(node_error([&] { run({"QuantizeLinear", {x, ft({}, {0.5f})}, {{"output_dtype", std::int64_t{17}}}, 21, {1}}); },
                        "QuantizeLinear"),
             Contains("FLOAT8E4M3FN"));
  CHECK_THAT(node_error([&] { run({"QuantizeLinear", {x, ft({}, {0.5f}), Tensor::from_vector<std::uint8_t>({}, {0})},
                                   {{"output_dtype", std::int64_t{3}}}, 21, {1, 2}}); },
                        "QuantizeLinear"),
             Contains("disagrees"));
}

TEST_CASE("Cast to a float8 or int4 type is refused by the type's name", "[opset21][cast]") {
  CHECK_THAT(node_error([&] { run({"Cast", {ft({2}, {1, 2})}, {{"to", std::int64_t{19}}}, 19}); }, "Cast"),
             Contains("FLOAT8E5M2"));
  CHECK_THAT(node_error([&] { run({"Cast", {ft({2}, {1, 2})}, {{"to", std::int64_t{22}}}, 21}); }, "Cast"),
             Contains("INT4"));
}

// --- new default-domain ops ----------------------------------------------------------------------

TEST_CASE("Mish is x * tanh(softplus(x))", "[opset21][mish]") {
  const Tensor y = run({"Mish", {ft({4}, {-20, -1, 0, 3})}, {}, 18});
  std::vector<double> want;
  for (double v : {-20.0, -1.0, 0.0, 3.0}) want.push_back(v * std::tanh(std::log1p(std::exp(v))));
  require_close(y, {4}, want, 1e-6);
}

TEST_CASE("BitwiseAnd Or Xor broadcast and BitwiseNot flips every bit", "[opset21][bitwise]") {
  const Tensor a = Tensor::from_vector<std::int32_t>({2, 2}, {12, 10, -1, 0});
  const Tensor b = Tensor::from_vector<std::int32_t>({2}, {10, 6});
  CHECK(run({"BitwiseAnd", {a, b}, {}, 18}).to_int64s() == Ints{8, 2, 10, 0});
  CHECK(run({"BitwiseOr", {a, b}, {}, 18}).to_int64s() == Ints{14, 14, -1, 6});
  CHECK(run({"BitwiseXor", {a, b}, {}, 18}).to_int64s() == Ints{6, 12, -11, 6});
  const Tensor u = Tensor::from_vector<std::uint8_t>({2}, {0, 5});
  CHECK(run({"BitwiseNot", {u}, {}, 18}).to_int64s() == Ints{255, 250});
  CHECK_THAT(node_error([&] { run({"BitwiseAnd", {ft({1}, {1}), ft({1}, {1})}, {}, 18}); }, "BitwiseAnd"),
             Contains("integer"));
}

TEST_CASE("CenterCropPad crops and pads centred", "[opset21][centercroppad]") {
  // [3, 4] -> [2, 6]: axis 0 cropped from offset 0 (floor(1 / 2)), axis 1 padded 1 before and 1 after.
  const Tensor x = ft({3, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  const Tensor y = run({"CenterCropPad", {x, i64s({2}, {2, 6})}, {}, 18, {1}});
  require_close(y, {2, 6}, {0, 1, 2, 3, 4, 0, 0, 5, 6, 7, 8, 0});
  // axes: only axis 1, cropped to 2 from offset 1.
  const Tensor z = run({"CenterCropPad", {x, i64s({1}, {2})}, {{"axes", Ints{-1}}}, 18, {1}});
  require_close(z, {3, 2}, {2, 3, 6, 7, 10, 11});
}

TEST_CASE("LpNormalization divides by the 1- or 2-norm along an axis", "[opset21][lpnorm]") {
  const Tensor x = ft({2, 2}, {3, 4, 0, 0});
  require_close(run({"LpNormalization", {x}, {}, 1}), {2, 2}, {0.6, 0.8, 0, 0});
  require_close(run({"LpNormalization", {x}, {{"p", std::int64_t{1}}, {"axis", std::int64_t{0}}}, 1}), {2, 2}, {1, 1, 0, 0});
  CHECK_THAT(node_error([&] { run({"LpNormalization", {x}, {{"p", std::int64_t{3}}}, 1}); }, "LpNormalization"),
             Contains("p must be 1 or 2"));
}

TEST_CASE("LpPool and GlobalLpPool take the p-norm of each window", "[opset21][lppool]") {
  const Tensor x = ft({1, 1, 2, 2}, {3, -4, 0, 12});
  // kernel 2x2 over a 2x2 input, pads 1 at the end of W: the padded taps add nothing.
  const Tensor y = run({"LpPool", {x}, {{"kernel_shape", Ints{1, 2}}, {"pads", Ints{0, 0, 0, 1}}}, 18});
  require_close(y, {1, 1, 2, 2}, {5, 4, 12, 12});
  const Tensor p1 = run({"LpPool", {x}, {{"kernel_shape", Ints{2, 2}}, {"p", std::int64_t{1}}}, 11});
  require_close(p1, {1, 1, 1, 1}, {19});
  require_close(run({"GlobalLpPool", {x}, {}, 2}), {1, 1, 1, 1}, {13});
  // LpPool-1's p is a float attribute.
  require_close(run({"LpPool", {x}, {{"kernel_shape", Ints{2, 2}}, {"p", 1.0f}}, 1}), {1, 1, 1, 1}, {19});
}

TEST_CASE("MaxRoiPool takes the max of each bin of each roi", "[opset21][maxroipool]") {
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(i);
  const Tensor x = ft({1, 1, 4, 4}, v);
  // The whole image in 2x2 bins, and the roi (1,1)-(2,2) at spatial_scale 1 in 1x1 bins of one pixel.
  const Tensor rois = ft({2, 5}, {0, 0, 0, 3, 3, 0, 1, 1, 2, 2});
  const Tensor y = run({"MaxRoiPool", {x, rois}, {{"pooled_shape", Ints{2, 2}}}, 1});
  require_close(y, {2, 1, 2, 2}, {5, 7, 13, 15, 5, 6, 9, 10});
  // spatial_scale halves the coordinates: (0,0)-(6,6) covers the image.
  const Tensor s = run({"MaxRoiPool", {x, ft({1, 5}, {0, 0, 0, 6, 6})}, {{"pooled_shape", Ints{1, 1}}, {"spatial_scale", 0.5f}}, 1});
  require_close(s, {1, 1, 1, 1}, {15});
}

TEST_CASE("AffineGrid (opset 20) maps the base grid by theta", "[opset21][affinegrid]") {
  // Identity theta, 2x3 (H x W): x along W, y along H.
  const Tensor theta = ft({1, 2, 3}, {1, 0, 0, 0, 1, 0});
  const Tensor y = run({"AffineGrid", {theta, i64s({4}, {1, 1, 2, 3})}, {{"align_corners", std::int64_t{1}}}, 20, {1}});
  require_close(y, {1, 2, 3, 2}, {-1, -1, 0, -1, 1, -1, -1, 1, 0, 1, 1, 1});
  const Tensor z = run({"AffineGrid", {theta, i64s({4}, {1, 1, 2, 3})}, {}, 20, {1}});
  const double a = 1.0 / 3, b = 0.5;
  require_close(z, {1, 2, 3, 2}, {-2 * a, -b, 0, -b, 2 * a, -b, -2 * a, b, 0, b, 2 * a, b});
  // A translation and scale in 3-D: out = 2 * base + (0, 0, 1) on a 1x1x2 grid with align_corners.
  const Tensor t3 = ft({1, 3, 4}, {2, 0, 0, 0, 0, 2, 0, 0, 0, 0, 2, 1});
  const Tensor w = run({"AffineGrid", {t3, i64s({5}, {1, 1, 1, 1, 2})}, {{"align_corners", std::int64_t{1}}}, 20, {1}});
  require_close(w, {1, 1, 1, 2, 3}, {-2, -2, -1, 2, -2, -1});
}

// --- compiled engine and importer ----------------------------------------------------------------

TEST_CASE("An opset 21 graph runs alike on the compiled engine and the reference", "[opset21][lower]") {
  Graph g;
  g.opsets[""] = 21;
  Value* x = g.add_input("x", DType::Float32, Shape{2, 4, 6, 6});
  Value* scale = g.add_constant("scale", ft({4}, {1, 0.5f, 2, -1}));
  Value* bias = g.add_constant("bias", ft({4}, {0, 0.1f, -0.2f, 0.3f}));
  Value* gn = g.add_node("GroupNormalization", {x, scale, bias}, {"gn"}, {{"num_groups", std::int64_t{2}}}, "gn")->output(0);
  Value* ge = g.add_node("Gelu", {gn}, {"ge"}, {{"approximate", std::string("tanh")}}, "gelu")->output(0);
  Value* pads = g.add_constant("pads", i64s({8}, {0, 0, 1, 1, 0, 0, 1, 1}));
  Value* pd = g.add_node("Pad", {ge, pads}, {"pd"}, {{"mode", std::string("wrap")}}, "pad")->output(0);
  Value* ap = g.add_node("AveragePool", {pd}, {"ap"}, {{"kernel_shape", Ints{2, 2}}, {"dilations", Ints{2, 2}}}, "pool")->output(0);
  Value* mi = g.add_node("Mish", {ap}, {"y"}, {}, "mish")->output(0);
  g.add_output(mi);
  infer_shapes(g);
  REQUIRE(mi->shape() == Shape{2, 4, 6, 6});
  Tensor in(DType::Float32, {2, 4, 6, 6});
  for (std::int64_t i = 0; i < in.numel(); ++i) in.data<float>()[i] = std::sin(0.37f * static_cast<float>(i)) * 2;
  const std::map<std::string, Tensor> feeds{{"x", in}};
  const Tensor want = ReferenceExecutor(g).run(feeds).at("y");
  CompiledModel m = lower::compile(g);
  const Tensor got = m.run(feeds).at("y");
  REQUIRE(got.dims() == want.dims());
  double err = 0, mag = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    err = std::max(err, std::fabs(got.at_double(static_cast<std::size_t>(i)) - want.at_double(static_cast<std::size_t>(i))));
    mag = std::max(mag, std::fabs(want.at_double(static_cast<std::size_t>(i))));
  }
  CHECK(mag > 0.1);
  CHECK(err / mag < 1e-5);
}

TEST_CASE("Gelu (opset 20) after a Conv joins its post-op chain and matches the reference", "[opset21][gelu][lower]") {
  Graph g;
  g.opsets[""] = 20;
  Value* x = g.add_input("x", DType::Float32, Shape{1, 3, 5, 5});
  Tensor w(DType::Float32, {4, 3, 3, 3});
  for (std::int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = std::cos(0.7f * static_cast<float>(i)) * 0.5f;
  Value* c = g.add_node("Conv", {x, g.add_constant("w", w)}, {"c"}, {{"pads", Ints{1, 1, 1, 1}}}, "conv")->output(0);
  Value* y = g.add_node("Gelu", {c}, {"y"}, {{"approximate", std::string("tanh")}}, "gelu")->output(0);
  g.add_output(y);
  infer_shapes(g);
  Tensor in(DType::Float32, {1, 3, 5, 5});
  for (std::int64_t i = 0; i < in.numel(); ++i) in.data<float>()[i] = std::sin(0.3f * static_cast<float>(i));
  const std::map<std::string, Tensor> feeds{{"x", in}};
  const Tensor want = ReferenceExecutor(g).run(feeds).at("y");
  CompiledModel m = lower::compile(g);
  const Tensor got = m.run(feeds).at("y");
  double err = 0, mag = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    err = std::max(err, std::fabs(got.at_double(static_cast<std::size_t>(i)) - want.at_double(static_cast<std::size_t>(i))));
    mag = std::max(mag, std::fabs(want.at_double(static_cast<std::size_t>(i))));
  }
  CHECK(mag > 0.1);
  CHECK(err / mag < 1e-5);
  for (const auto& s : m.steps()) CHECK(s.op != "Gelu");  // fused into the convolution, no step of its own
}

namespace {

// x[2,3] -> op -> y at the given default-domain opset, x and y of `elem_type`.
::onnx::ModelProto one_op_model(int opset, const std::string& op = "Relu", int elem_type = ::onnx::TensorProto::FLOAT) {
  ::onnx::ModelProto m;
  m.set_ir_version(10);
  auto* o = m.add_opset_import();
  o->set_domain("");
  o->set_version(opset);
  auto* g = m.mutable_graph();
  g->set_name("g");
  for (auto [vi, name] : {std::pair{g->add_input(), "x"}, std::pair{g->add_output(), "y"}}) {
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem_type);
    tt->mutable_shape()->add_dim()->set_dim_value(2);
    tt->mutable_shape()->add_dim()->set_dim_value(3);
  }
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name("n0");
  n->add_input("x");
  n->add_output("y");
  return m;
}

Graph load(const ::onnx::ModelProto& m) {
  const std::string bytes = m.SerializeAsString();
  return ondine::onnx::load_model_from_memory(bytes.data(), bytes.size(), ".", "model");
}

}  // namespace

TEST_CASE("The importer reads opsets 19 to 21 and refuses 22 by number", "[opset21][onnx]") {
  for (int opset : {19, 20, 21}) {
    Graph g = load(one_op_model(opset, opset == 20 ? "Gelu" : "Relu"));
    CHECK(g.opset() == opset);
  }
  const std::string msg = error_of([] { load(one_op_model(22)); });
  CHECK_THAT(msg, Contains("unsupported opset 22; Ondine supports opsets 1 to 21"));
}

TEST_CASE("float8 and 4-bit float tensors are refused naming the type; int4 ones load", "[opset21][onnx]") {
  // A graph input of FLOAT8E4M3FN (17).
  CHECK_THAT(error_of([] { load(one_op_model(21, "Identity", 17)); }),
             Contains("graph input 'x' has element type FLOAT8E4M3FN"));
  // An initializer of FLOAT4E2M1 (23).
  ::onnx::ModelProto m = one_op_model(21, "Identity");
  auto* init = m.mutable_graph()->add_initializer();
  init->set_name("w");
  init->set_data_type(23);
  init->add_dims(2);
  init->add_int32_data(0x21);
  CHECK_THAT(error_of([&] { load(m); }), Contains("unsupported element type FLOAT4E2M1"));
  // INT4 (22): two values per int32_data entry, the first in the low nibble (tests/test_weight_only.cpp has more).
  init->set_data_type(22);
  Graph g = load(m);
  CHECK(g.find_value("w")->constant().dtype() == DType::Int4);
  CHECK(g.find_value("w")->constant().to_int64s() == Ints{1, 2});
}

}  // namespace test_opset21
