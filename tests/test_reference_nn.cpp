// Reference kernels and shape inference of the nn ops: small cases checked against hand-computed
// (or PyTorch-computed) values, the opset-dependent semantics, and the errors bad input must raise.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "ondine/ir/shape_inference.hpp"
#include "ondine/reference/executor.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_reference_nn {

using namespace ondine;
using test::node_error;

namespace {

std::vector<float> iota(std::size_t n, float start = 0, float step = 1) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

Tensor ft(std::vector<std::int64_t> dims, std::vector<float> values) {
  return Tensor::from_vector<float>(std::move(dims), values);
}
Tensor it(std::vector<std::int64_t> dims, std::vector<std::int64_t> values) {
  return Tensor::from_vector<std::int64_t>(std::move(dims), values);
}

struct OpCase {
  OpCase(std::string op_, std::vector<Tensor> inputs_, std::map<std::string, Attribute> attrs_ = {}, int opset_ = 17,
         std::size_t outputs_ = 1, std::vector<std::size_t> constant_inputs_ = {})
      : op(std::move(op_)), inputs(std::move(inputs_)), attrs(std::move(attrs_)), opset(opset_), outputs(outputs_),
        constant_inputs(std::move(constant_inputs_)) {}
  std::string op;
  std::vector<Tensor> inputs;  // an empty() tensor is an omitted optional input
  std::map<std::string, Attribute> attrs;
  int opset = 17;
  std::size_t outputs = 1;
  std::vector<std::size_t> constant_inputs;  // inputs that become initializers instead of graph inputs
};

// Builds a one-node graph, infers shapes, runs the reference executor and checks that inference agrees
// with the kernel's output shapes and types.
std::vector<Tensor> run(const OpCase& c) {
  Graph g;
  g.opsets[""] = c.opset;
  std::vector<Value*> ins;
  std::map<std::string, Tensor> feeds;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.inputs[i];
    std::string name = "in" + std::to_string(i);
    if (t.empty()) {
      ins.push_back(nullptr);
    } else if (std::find(c.constant_inputs.begin(), c.constant_inputs.end(), i) != c.constant_inputs.end()) {
      ins.push_back(g.add_constant(name, t));
    } else {
      ins.push_back(g.add_input(name, t.dtype(), t.shape()));
      feeds[name] = t;
    }
  }
  std::vector<std::string> outs;
  for (std::size_t i = 0; i < c.outputs; ++i) outs.push_back("out" + std::to_string(i));
  Node* n = g.add_node(c.op, ins, outs, c.attrs, "node_under_test");
  for (Value* v : n->outputs()) g.add_output(v);
  infer_shapes(g);
  auto result = ReferenceExecutor(g).run(feeds);
  std::vector<Tensor> got;
  for (std::size_t i = 0; i < c.outputs; ++i) {
    const Tensor& t = result.at(outs[i]);
    const Value* v = n->output(i);
    INFO("output " << i << " inferred " << v->shape().str() << " got " << dims_str(t.dims()));
    REQUIRE(v->dtype() == t.dtype());
    REQUIRE(v->shape().rank_known());
    REQUIRE(v->shape().rank() == t.rank());
    for (std::size_t d = 0; d < t.rank(); ++d)
      if (v->shape()[d].is_static()) REQUIRE(v->shape()[d].value == t.dims()[d]);
    got.push_back(t);
  }
  return got;
}

Tensor run1(const OpCase& c) { return run(c)[0]; }

void require_close(const Tensor& got, std::vector<std::int64_t> dims, const std::vector<double>& want,
                   double tol = 1e-5) {
  REQUIRE(got.dims() == dims);
  REQUIRE(static_cast<std::size_t>(got.numel()) == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    REQUIRE(got.at_double(i) == Approx(want[i]).margin(tol).epsilon(tol));
  }
}

// Runs inference only on a one-node graph whose inputs have the given types and shapes.
Node* infer_one(Graph& g, const std::string& op, const std::vector<std::pair<DType, Shape>>& inputs,
                std::map<std::string, Attribute> attrs = {}, std::size_t outputs = 1) {
  std::vector<Value*> ins;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    ins.push_back(g.add_input("in" + std::to_string(i), inputs[i].first, inputs[i].second));
  std::vector<std::string> outs;
  for (std::size_t i = 0; i < outputs; ++i) outs.push_back("out" + std::to_string(i));
  Node* n = g.add_node(op, ins, outs, std::move(attrs), "node_under_test");
  infer_shapes(g);
  return n;
}

const Dim batch = Dim::named("batch");

}  // namespace

// --- Conv -----------------------------------------------------------------------------------------

TEST_CASE("Conv with pads: ONNX's basic example", "[nn][conv]") {
  auto y = run1({"Conv", {ft({1, 1, 5, 5}, iota(25)), ft({1, 1, 3, 3}, std::vector<float>(9, 1.f))},
                 {{"kernel_shape", std::vector<std::int64_t>{3, 3}}, {"pads", std::vector<std::int64_t>{1, 1, 1, 1}}}});
  require_close(y, {1, 1, 5, 5}, {12, 21, 27, 33, 24, 33, 54, 63, 72, 51, 63, 99, 108, 117, 81,
                                  93, 144, 153, 162, 111, 72, 111, 117, 123, 84});
}

TEST_CASE("Conv with strides and asymmetric pads", "[nn][conv]") {
  auto y = run1({"Conv", {ft({1, 1, 7, 5}, iota(35)), ft({1, 1, 3, 3}, std::vector<float>(9, 1.f))},
                 {{"strides", std::vector<std::int64_t>{2, 2}}, {"pads", std::vector<std::int64_t>{1, 0, 1, 0}}}});
  require_close(y, {1, 1, 4, 2}, {21, 33, 99, 117, 189, 207, 171, 183});
}

TEST_CASE("Conv with groups, strides, pads and bias", "[nn][conv]") {
  std::vector<float> w = iota(36, -1.8f, 0.1f);
  auto y = run1({"Conv", {ft({1, 2, 4, 4}, iota(32)), ft({4, 1, 3, 3}, w), ft({4}, {1, -1, 0.5f, 2})},
                 {{"group", std::int64_t(2)},
                  {"strides", std::vector<std::int64_t>{2, 2}},
                  {"pads", std::vector<std::int64_t>{1, 1, 1, 1}}}});
  require_close(y, {1, 4, 2, 2}, {-9.7, -26.8, -62.9, -117.2, -2.7, -7.2, -19.0, -38.2, 46.2, 68.7, 71.6, 101.9,
                                  114.3, 178.2, 205.4, 314.0}, 1e-4);
}

TEST_CASE("Conv depthwise with dilation", "[nn][conv]") {
  std::vector<float> w;
  for (int c = 0; c < 3; ++c) w.insert(w.end(), {1, -1, 2, 0.5f});
  auto y = run1({"Conv", {ft({1, 3, 5, 5}, iota(75, 0, 0.5f)), ft({3, 1, 2, 2}, w)},
                 {{"group", std::int64_t(3)}, {"dilations", std::vector<std::int64_t>{2, 2}}}});
  require_close(y, {1, 3, 3, 3}, {12.0, 13.25, 14.5, 18.25, 19.5, 20.75, 24.5, 25.75, 27.0, 43.25, 44.5, 45.75, 49.5, 50.75,
                                  52.0, 55.75, 57.0, 58.25, 74.5, 75.75, 77.0, 80.75, 82.0, 83.25, 87.0, 88.25, 89.5});
}

TEST_CASE("Conv 1-D with asymmetric pads and stride", "[nn][conv]") {
  auto y = run1({"Conv", {ft({1, 2, 5}, iota(10)), ft({2, 2, 3}, iota(12, 0, 0.25f))},
                 {{"strides", std::vector<std::int64_t>{2}}, {"pads", std::vector<std::int64_t>{1, 2}}}});
  require_close(y, {1, 2, 3}, {13.0, 23.5, 16.0, 31.0, 64.0, 52.0});
}

TEST_CASE("Conv auto_pad SAME_UPPER / SAME_LOWER / VALID", "[nn][conv]") {
  // 1-D: x = 0..4, kernel [1, 1] (sums of neighbours), stride 1: total padding 1.
  Tensor x = ft({1, 1, 5}, iota(5)), w = ft({1, 1, 2}, {1, 1});
  require_close(run1({"Conv", {x, w}, {{"auto_pad", std::string("SAME_UPPER")}}}), {1, 1, 5}, {1, 3, 5, 7, 4});
  require_close(run1({"Conv", {x, w}, {{"auto_pad", std::string("SAME_LOWER")}}}), {1, 1, 5}, {0, 1, 3, 5, 7});
  require_close(run1({"Conv", {x, w}, {{"auto_pad", std::string("VALID")}}}), {1, 1, 4}, {1, 3, 5, 7});
}

TEST_CASE("Conv 3-D and float64, float16", "[nn][conv]") {
  // A 2x2x2 box sum over a 3x3x3 cube of ones: every output is 8.
  auto y = run1({"Conv", {ft({1, 1, 3, 3, 3}, std::vector<float>(27, 1)), ft({1, 1, 2, 2, 2}, std::vector<float>(8, 1))}});
  require_close(y, {1, 1, 2, 2, 2}, std::vector<double>(8, 8.0));
  auto yd = run1({"Conv", {Tensor::from_vector<double>({1, 1, 3}, {1, 2, 3}), Tensor::from_vector<double>({1, 1, 2}, {1, 10})}});
  REQUIRE(yd.dtype() == DType::Float64);
  require_close(yd, {1, 1, 2}, {21, 32});
  std::vector<float16> xh{float16(1.f), float16(2.f), float16(3.f)}, wh{float16(0.5f), float16(0.25f)};
  auto yh = run1({"Conv", {Tensor::from_vector<float16>({1, 1, 3}, xh), Tensor::from_vector<float16>({1, 1, 2}, wh)}});
  REQUIRE(yh.dtype() == DType::Float16);
  require_close(yh, {1, 1, 2}, {1.0, 1.75});
}

TEST_CASE("Conv errors name the node and op", "[nn][conv][errors]") {
  auto msg = node_error([] { run({"Conv", {ft({1, 3, 5, 5}, iota(75)), ft({2, 2, 3, 3}, iota(36))}}); }, "Conv");
  CHECK(msg.find("channels") != std::string::npos);
  msg = node_error([] { run({"Conv", {ft({1, 4, 5, 5}, iota(100)), ft({3, 2, 3, 3}, iota(54))}, {{"group", std::int64_t(2)}}}); },
                   "Conv");
  CHECK(msg.find("multiple of group") != std::string::npos);
  node_error([] { run({"Conv", {ft({1, 1, 2, 2}, iota(4)), ft({1, 1, 3, 3}, iota(9))}}); }, "Conv");  // kernel too big
  node_error([] { run({"Conv", {ft({1, 1, 5}, iota(5)), ft({1, 1, 2}, {1, 1})}, {{"auto_pad", std::string("SAME")}}}); }, "Conv");
  node_error([] { run({"Conv", {ft({1, 1, 5}, iota(5)), ft({1, 1, 2}, {1, 1})}, {{"strides", std::vector<std::int64_t>{0}}}}); },
             "Conv");
  node_error([] { run({"Conv", {ft({1, 1, 5}, iota(5)), ft({1, 1, 2}, {1, 1}), ft({2}, {1, 1})}}); }, "Conv");  // bias length
  node_error([] { run({"Conv", {ft({5, 5}, iota(25)), ft({1, 1, 2}, {1, 1})}}); }, "Conv");                    // rank
  node_error([] { run({"Conv", {it({1, 1, 3}, {1, 2, 3}), it({1, 1, 2}, {1, 1})}}); }, "Conv");                // dtype
}

TEST_CASE("Conv shape inference keeps the symbolic batch", "[nn][conv][infer]") {
  Graph g;
  Node* n = infer_one(g, "Conv", {{DType::Float32, Shape{batch, 3, 224, 224}}, {DType::Float32, Shape{64, 3, 7, 7}}},
                      {{"strides", std::vector<std::int64_t>{2, 2}}, {"pads", std::vector<std::int64_t>{3, 3, 3, 3}}});
  CHECK(n->output(0)->shape() == Shape{batch, 64, 112, 112});
  CHECK(n->output(0)->dtype() == DType::Float32);

  Graph g2;  // symbolic spatial dims survive a 1x1 stride-1 conv and SAME padding; else become expressions
  Node* n2 = infer_one(g2, "Conv", {{DType::Float32, Shape{batch, 8, Dim::named("h"), Dim::named("w")}},
                                    {DType::Float32, Shape{4, 8, 1, 1}}});
  CHECK(n2->output(0)->shape() == Shape{batch, 4, Dim::named("h"), Dim::named("w")});
  Graph g3;
  Node* n3 = infer_one(g3, "Conv", {{DType::Float32, Shape{batch, 8, Dim::named("h"), 10}}, {DType::Float32, Shape{4, 8, 3, 3}}});
  CHECK(n3->output(0)->shape() == Shape{batch, 4, Dim::named("h - 2"), 8});  // a 3x3 valid conv: h - 2

  Graph g4;
  auto msg = node_error([&] {
    infer_one(g4, "Conv", {{DType::Float32, Shape{batch, 3, 8, 8}}, {DType::Float32, Shape{4, 4, 3, 3}}});
  }, "Conv");
  CHECK(msg.find("channels") != std::string::npos);
}

// --- ConvTranspose --------------------------------------------------------------------------------

TEST_CASE("ConvTranspose: ONNX's example with two output channels", "[nn][convtranspose]") {
  auto y = run1({"ConvTranspose", {ft({1, 1, 3, 3}, iota(9)), ft({1, 2, 3, 3}, std::vector<float>(18, 1))}});
  std::vector<double> plane{0, 1, 3, 3, 2, 3, 8, 15, 12, 7, 9, 21, 36, 27, 15, 9, 20, 33, 24, 13, 6, 13, 21, 15, 8};
  std::vector<double> want = plane;
  want.insert(want.end(), plane.begin(), plane.end());
  require_close(y, {1, 2, 5, 5}, want);
}

TEST_CASE("ConvTranspose with groups, strides, pads, output_padding and bias", "[nn][convtranspose]") {
  auto y = run1({"ConvTranspose", {ft({1, 2, 3, 3}, iota(18)), ft({2, 1, 3, 3}, iota(18, 0, 0.1f)), ft({2}, {1, 2})},
                 {{"group", std::int64_t(2)},
                  {"strides", std::vector<std::int64_t>{2, 2}},
                  {"pads", std::vector<std::int64_t>{1, 1, 1, 1}},
                  {"output_padding", std::vector<std::int64_t>{1, 1}}}});
  require_close(y, {1, 2, 6, 6},
                {1.0,  1.3,  1.4,  2.1,  1.8,  2.0,  1.3,  2.2,  2.1,  3.8,  2.9,  3.6,  2.2,  3.7,  2.6,  4.5,  3.0,  3.5,
                 3.7,  7.0,  4.5,  8.6,  5.3,  6.6,  3.4,  6.1,  3.8,  6.9,  4.2,  5.0,  5.2,  10.0, 5.9,  11.4, 6.6,  7.4,
                 13.7, 26.6, 15.0, 29.2, 16.3, 17.4, 28.4, 57.2, 31.0, 62.4, 33.6, 36.1, 17.6, 34.4, 18.9, 37.0, 20.2, 21.6,
                 36.2, 72.8, 38.8, 78.0, 41.4, 44.5, 21.5, 42.2, 22.8, 44.8, 24.1, 25.8, 26.0, 51.5, 27.6, 54.7, 29.2, 30.9},
                1e-4);
}

TEST_CASE("ConvTranspose output_shape and auto_pad", "[nn][convtranspose]") {
  // 1-D: x = [0, 1, 2], kernel [1, 1, 1], stride 2: the full result is [0, 0, 1, 1, 3, 2, 2].
  Tensor x = ft({1, 1, 3}, iota(3)), w = ft({1, 1, 3}, {1, 1, 1});
  require_close(run1({"ConvTranspose", {x, w}, {{"strides", std::vector<std::int64_t>{2}}}}), {1, 1, 7}, {0, 0, 1, 1, 3, 2, 2});
  // SAME_UPPER: output 6, the extra element is cut at the end.
  require_close(run1({"ConvTranspose", {x, w}, {{"strides", std::vector<std::int64_t>{2}}, {"auto_pad", std::string("SAME_UPPER")}}}),
                {1, 1, 6}, {0, 0, 1, 1, 3, 2});
  // output_shape larger than the full result: zeros appended at the end.
  require_close(run1({"ConvTranspose", {x, w}, {{"strides", std::vector<std::int64_t>{2}}, {"output_shape", std::vector<std::int64_t>{8}}}}),
                {1, 1, 8}, {0, 0, 1, 1, 3, 2, 2, 0});
}

TEST_CASE("ConvTranspose inference and errors", "[nn][convtranspose][infer]") {
  Graph g;
  Node* n = infer_one(g, "ConvTranspose", {{DType::Float32, Shape{batch, 4, 5, 5}}, {DType::Float32, Shape{4, 3, 3, 3}}},
                      {{"group", std::int64_t(2)}, {"strides", std::vector<std::int64_t>{2, 2}}});
  CHECK(n->output(0)->shape() == Shape{batch, 6, 11, 11});
  Graph g2;
  node_error([&] { infer_one(g2, "ConvTranspose", {{DType::Float32, Shape{1, 4, 5, 5}}, {DType::Float32, Shape{3, 3, 3, 3}}}); },
             "ConvTranspose");
  node_error([] { run({"ConvTranspose", {ft({1, 2, 3}, iota(6)), ft({3, 1, 2}, iota(6))}}); }, "ConvTranspose");
}

// --- pools ----------------------------------------------------------------------------------------

TEST_CASE("MaxPool with ceil_mode, pads, dilations and Indices", "[nn][pool]") {
  auto y = run1({"MaxPool", {ft({1, 1, 4, 4}, iota(16))},
                 {{"kernel_shape", std::vector<std::int64_t>{3, 3}}, {"strides", std::vector<std::int64_t>{2, 2}},
                  {"ceil_mode", std::int64_t(1)}}});
  require_close(y, {1, 1, 2, 2}, {10, 11, 14, 15});
  // Without ceil_mode only one window fits.
  y = run1({"MaxPool", {ft({1, 1, 4, 4}, iota(16))},
            {{"kernel_shape", std::vector<std::int64_t>{3, 3}}, {"strides", std::vector<std::int64_t>{2, 2}}}});
  require_close(y, {1, 1, 1, 1}, {10});
  // Dilation 2 on 4x4: windows pick positions {0, 2} and {1, 3}.
  y = run1({"MaxPool", {ft({1, 1, 4, 4}, iota(16))},
            {{"kernel_shape", std::vector<std::int64_t>{2, 2}}, {"dilations", std::vector<std::int64_t>{2, 2}}}});
  require_close(y, {1, 1, 2, 2}, {10, 11, 14, 15});
  // Indices in row-major (storage_order 0) and column-major order; the second plane is offset.
  std::vector<float> xv{1, 5, 2, 0, 3, 4, 7, 6, -1, -2, -3, -4, -5, -6, -7, -8};
  auto outs = run({"MaxPool", {ft({1, 2, 2, 4}, xv)},
                   {{"kernel_shape", std::vector<std::int64_t>{2, 2}}, {"strides", std::vector<std::int64_t>{2, 2}}}, 12, 2});
  require_close(outs[0], {1, 2, 1, 2}, {5, 7, -1, -3});
  require_close(outs[1], {1, 2, 1, 2}, {1, 6, 8, 10}, 0);
  outs = run({"MaxPool", {ft({1, 2, 2, 4}, xv)},
              {{"kernel_shape", std::vector<std::int64_t>{2, 2}}, {"strides", std::vector<std::int64_t>{2, 2}},
               {"storage_order", std::int64_t(1)}}, 12, 2});
  require_close(outs[1], {1, 2, 1, 2}, {2, 5, 8, 12}, 0);
}

TEST_CASE("MaxPool on uint8 pads with the lowest value", "[nn][pool]") {
  auto y = run1({"MaxPool", {Tensor::from_vector<std::uint8_t>({1, 1, 2, 2}, {1, 2, 3, 4})},
                 {{"kernel_shape", std::vector<std::int64_t>{3, 3}}, {"pads", std::vector<std::int64_t>{1, 1, 1, 1}}}});
  REQUIRE(y.dtype() == DType::UInt8);
  require_close(y, {1, 1, 2, 2}, {4, 4, 4, 4}, 0);
}

TEST_CASE("AveragePool count_include_pad and ceil_mode", "[nn][pool]") {
  Tensor x = ft({1, 1, 5, 5}, iota(25));
  std::map<std::string, Attribute> attrs{{"kernel_shape", std::vector<std::int64_t>{3, 3}},
                                         {"strides", std::vector<std::int64_t>{2, 2}},
                                         {"pads", std::vector<std::int64_t>{1, 1, 1, 1}}};
  require_close(run1({"AveragePool", {x}, attrs}), {1, 1, 3, 3}, {3.0, 4.5, 6.0, 10.5, 12.0, 13.5, 18.0, 19.5, 21.0});
  attrs["count_include_pad"] = std::int64_t(1);
  require_close(run1({"AveragePool", {x}, attrs}), {1, 1, 3, 3},
                {4.0 / 3, 3.0, 8.0 / 3, 7.0, 12.0, 9.0, 8.0, 13.0, 28.0 / 3});
  // ceil_mode: the last window covers one column and row, averaged over what it covers.
  require_close(run1({"AveragePool", {x},
                      {{"kernel_shape", std::vector<std::int64_t>{2, 2}}, {"strides", std::vector<std::int64_t>{2, 2}},
                       {"ceil_mode", std::int64_t(1)}}}),
                {1, 1, 3, 3}, {3.0, 5.0, 6.5, 13.0, 15.0, 16.5, 20.5, 22.5, 24.0});
  // SAME_UPPER on 1-D: [0..4], kernel 2 -> pad one at the end, which does not count.
  require_close(run1({"AveragePool", {ft({1, 1, 5}, iota(5))},
                      {{"kernel_shape", std::vector<std::int64_t>{2}}, {"auto_pad", std::string("SAME_UPPER")}}}),
                {1, 1, 5}, {0.5, 1.5, 2.5, 3.5, 4});
}

TEST_CASE("Global pools", "[nn][pool]") {
  Tensor x = ft({2, 2, 2, 2}, iota(16));
  require_close(run1({"GlobalAveragePool", {x}}), {2, 2, 1, 1}, {1.5, 5.5, 9.5, 13.5});
  require_close(run1({"GlobalMaxPool", {x}}), {2, 2, 1, 1}, {3, 7, 11, 15});
  Graph g;
  Node* n = infer_one(g, "GlobalAveragePool", {{DType::Float32, Shape{batch, 16, Dim::named("h"), 7}}});
  CHECK(n->output(0)->shape() == Shape{batch, 16, 1, 1});
}

TEST_CASE("Pool inference and errors", "[nn][pool][infer]") {
  Graph g;
  Node* n = infer_one(g, "MaxPool", {{DType::Float32, Shape{batch, 64, 112, 112}}},
                      {{"kernel_shape", std::vector<std::int64_t>{3, 3}}, {"strides", std::vector<std::int64_t>{2, 2}},
                       {"pads", std::vector<std::int64_t>{1, 1, 1, 1}}});
  CHECK(n->output(0)->shape() == Shape{batch, 64, 56, 56});
  node_error([] { run({"MaxPool", {ft({1, 1, 4, 4}, iota(16))}, {{"kernel_shape", std::vector<std::int64_t>{3}}}}); }, "MaxPool");
  node_error([] { run({"AveragePool", {ft({1, 1, 4, 4}, iota(16))}, {}}); }, "AveragePool");  // no kernel_shape
  node_error([] { run({"AveragePool", {ft({4, 4}, iota(16))}, {{"kernel_shape", std::vector<std::int64_t>{2}}}}); },
             "AveragePool");
}

// --- normalisations -------------------------------------------------------------------------------

TEST_CASE("BatchNormalization in inference mode", "[nn][norm]") {
  // y = (x - mean) / sqrt(var + eps) * scale + bias, per channel; eps = 0 keeps the numbers round.
  auto y = run1({"BatchNormalization",
                 {ft({1, 2, 1, 2}, {1, 3, 10, 20}), ft({2}, {2, 1}), ft({2}, {1, 0}), ft({2}, {2, 10}), ft({2}, {4, 25})},
                 {{"epsilon", 0.0f}}, 15});
  require_close(y, {1, 2, 1, 2}, {0, 2, 0, 2});
}

TEST_CASE("BatchNormalization training mode updates the running statistics", "[nn][norm]") {
  auto outs = run({"BatchNormalization",
                   {ft({2, 1, 2}, {1, 2, 3, 6}), ft({1}, {1}), ft({1}, {0}), ft({1}, {0}), ft({1}, {1})},
                   {{"epsilon", 0.0f}, {"training_mode", std::int64_t(1)}, {"momentum", 0.5f}}, 15, 3});
  // Batch mean 3, biased variance (4 + 1 + 0 + 9) / 4 = 3.5.
  double s = std::sqrt(3.5);
  require_close(outs[0], {2, 1, 2}, {-2 / s, -1 / s, 0, 3 / s});
  require_close(outs[1], {1}, {1.5});
  require_close(outs[2], {1}, {2.25});
  // Before opset 14 only Y is supported.
  node_error([] {
    run({"BatchNormalization", {ft({1, 1, 2}, {1, 2}), ft({1}, {1}), ft({1}, {0}), ft({1}, {0}), ft({1}, {1})}, {}, 9, 3});
  }, "BatchNormalization");
  auto msg = node_error([] {
    run({"BatchNormalization", {ft({1, 2, 2}, iota(4)), ft({3}, {1, 1, 1}), ft({2}, {0, 0}), ft({2}, {0, 0}), ft({2}, {1, 1})}});
  }, "BatchNormalization");
  CHECK(msg.find("scale") != std::string::npos);
}

TEST_CASE("InstanceNormalization and LRN", "[nn][norm]") {
  auto y = run1({"InstanceNormalization", {ft({1, 2, 2}, {1, 3, 5, 7}), ft({2}, {2, 1}), ft({2}, {1, 7})}, {{"epsilon", 0.0f}}});
  require_close(y, {1, 2, 2}, {-1, 3, 6, 8});
  // LRN size 3 over 2 channels: every channel sees both; y = x / (1 + 1/3 * (1 + 4))^1.
  auto l = run1({"LRN", {ft({1, 2, 1, 1}, {1, 2})}, {{"size", std::int64_t(3)}, {"alpha", 1.0f}, {"beta", 1.0f}, {"bias", 1.0f}}});
  require_close(l, {1, 2, 1, 1}, {1 / (1 + 5.0 / 3), 2 / (1 + 5.0 / 3)});
}

TEST_CASE("LayerNormalization with Mean and InvStdDev", "[nn][norm]") {
  auto outs = run({"LayerNormalization",
                   {ft({2, 4}, {1, 2, 3, 4, 2, 4, 6, 10}), ft({4}, {1, 2, 0.5f, 1}), ft({4}, {0, 1, 0, -1})},
                   {}, 17, 3});
  require_close(outs[0], {2, 4}, {-1.341635, 0.105576, 0.223606, 0.341635, -1.183215, -0.014185, 0.084515, 0.521277});
  require_close(outs[1], {2, 1}, {2.5, 5.5});
  require_close(outs[2], {2, 1}, {1 / std::sqrt(1.25 + 1e-5), 1 / std::sqrt(8.75 + 1e-5)});
  // axis 0 normalises everything; the statistics have shape [1, 1].
  auto all = run({"LayerNormalization", {ft({2, 2}, {1, 2, 3, 4}), ft({2, 2}, {1, 1, 1, 1})}, {{"axis", std::int64_t(0)}, {"epsilon", 0.0f}}, 17, 2});
  double s = std::sqrt(1.25);
  require_close(all[0], {2, 2}, {-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s});
  require_close(all[1], {1, 1}, {2.5});

  Graph g;
  Node* n = infer_one(g, "LayerNormalization", {{DType::Float32, Shape{batch, Dim::named("seq"), 768}}, {DType::Float32, Shape{768}}},
                      {}, 3);
  CHECK(n->output(0)->shape() == Shape{batch, Dim::named("seq"), 768});
  CHECK(n->output(1)->shape() == Shape{batch, Dim::named("seq"), 1});
  Graph g2;
  node_error([&] { infer_one(g2, "LayerNormalization", {{DType::Float32, Shape{2, 8}}, {DType::Float32, Shape{4}}}); },
             "LayerNormalization");
  Graph g3;  // a symbolic hidden size accepts a static scale
  Node* n3 = infer_one(g3, "LayerNormalization", {{DType::Float32, Shape{batch, Dim::named("hidden")}}, {DType::Float32, Shape{768}}});
  CHECK(n3->output(0)->shape() == Shape{batch, Dim::named("hidden")});
}

TEST_CASE("MeanVarianceNormalization over the default axes 0, 2, 3", "[nn][norm]") {
  // Channel 0 holds {1, 3} (mean 2, standard deviation 1), channel 1 {2, 6} (mean 4, deviation 2).
  require_close(run1({"MeanVarianceNormalization", {ft({1, 2, 1, 2}, {1, 3, 2, 6})}, {}, 13}), {1, 2, 1, 2},
                {-1, 1, -1, 1});
  // axes [1]: across the channels of each position: {1, 2} and {3, 6}.
  require_close(run1({"MeanVarianceNormalization", {ft({1, 2, 1, 2}, {1, 3, 2, 6})},
                      {{"axes", std::vector<std::int64_t>{1}}}, 9}),
                {1, 2, 1, 2}, {-1, -1, 1, 1});
  Graph g;
  Node* n = infer_one(g, "MeanVarianceNormalization", {{DType::Float32, Shape{batch, 3, 8, 8}}});
  CHECK(n->output(0)->shape() == Shape{batch, 3, 8, 8});
  node_error([] { run({"MeanVarianceNormalization", {ft({1, 2, 1, 2}, iota(4))}, {{"axes", std::vector<std::int64_t>{0, 4}}}, 13}); },
             "MeanVarianceNormalization");
  node_error([] { run({"MeanVarianceNormalization", {ft({1, 2, 1, 2}, iota(4))}, {{"axes", std::vector<std::int64_t>{1, -3}}}, 13}); },
             "MeanVarianceNormalization");  // the same axis twice
}

// --- Softmax --------------------------------------------------------------------------------------

TEST_CASE("Softmax axis semantics across opsets", "[nn][softmax]") {
  Tensor x = ft({1, 2, 3}, {1, 2, 3, 4, 5, 7});
  // Opset 13: along axis 1 only.
  require_close(run1({"Softmax", {x}, {{"axis", std::int64_t(1)}}, 13}), {1, 2, 3},
                {0.047426, 0.047426, 0.017986, 0.952574, 0.952574, 0.982014});
  // Opset 11: the input flattened to [1, 6] at axis 1.
  require_close(run1({"Softmax", {x}, {{"axis", std::int64_t(1)}}, 11}), {1, 2, 3},
                {0.002044, 0.005556, 0.015104, 0.041056, 0.111602, 0.824637});
  // Default axis: 1 before opset 13 (same flattening), -1 from opset 13.
  require_close(run1({"Softmax", {x}, {}, 11}), {1, 2, 3}, {0.002044, 0.005556, 0.015104, 0.041056, 0.111602, 0.824637});
  require_close(run1({"LogSoftmax", {x}, {}, 13}), {1, 2, 3},
                {-2.407606, -1.407606, -0.407606, -3.169846, -2.169846, -0.169846});
  // Large inputs stay finite.
  require_close(run1({"Softmax", {ft({1, 2}, {10000, 10000})}, {}, 13}), {1, 2}, {0.5, 0.5});
  node_error([&] { run({"Softmax", {x}, {{"axis", std::int64_t(3)}}, 13}); }, "Softmax");
}

TEST_CASE("Softmax, Hardmax, LpNormalization: an empty axis gives an empty result", "[nn][softmax]") {
  // Rows of length 0 beside other dims (found by fuzzing: offsets into an empty tensor's null data).
  Tensor x(DType::Float32, {2, 0, 3});
  for (const char* op : {"Softmax", "LogSoftmax", "Hardmax", "LpNormalization"})
    for (int opset : {11, 13}) {
      INFO(op << " opset " << opset);
      Tensor y = run1({op, {x}, {{"axis", std::int64_t(1)}}, opset});
      CHECK(y.dims() == std::vector<std::int64_t>{2, 0, 3});
    }
}

TEST_CASE("Hardmax marks the first largest element along the axis", "[nn][softmax]") {
  // Opset 13: along the last axis by default; a tie goes to the first.
  require_close(run1({"Hardmax", {ft({2, 3}, {1, 3, 3, -1, -2, -3})}, {}, 13}), {2, 3}, {0, 1, 0, 1, 0, 0});
  Tensor x = ft({1, 2, 3}, {1, 2, 3, 4, 5, 7});
  require_close(run1({"Hardmax", {x}, {{"axis", std::int64_t(1)}}, 13}), {1, 2, 3}, {0, 0, 0, 1, 1, 1});
  // Opset 11: over the input flattened to [1, 6] at axis 1.
  require_close(run1({"Hardmax", {x}, {{"axis", std::int64_t(1)}}, 11}), {1, 2, 3}, {0, 0, 0, 0, 0, 1});
  auto yd = run1({"Hardmax", {Tensor::from_vector<double>({3}, {2, 5, 5})}, {}, 13});
  REQUIRE(yd.dtype() == DType::Float64);
  require_close(yd, {3}, {0, 1, 0});
  node_error([&] { run({"Hardmax", {x}, {{"axis", std::int64_t(3)}}, 13}); }, "Hardmax");
  node_error([] { run({"Hardmax", {it({2}, {1, 2})}, {}, 13}); }, "Hardmax");  // integers are not allowed
}

// --- MatMul, Gemm ---------------------------------------------------------------------------------

TEST_CASE("MatMul batched broadcasting and 1-D operands", "[nn][matmul]") {
  auto y = run1({"MatMul", {ft({2, 1, 3, 4}, iota(24)), ft({5, 4, 2}, iota(40, -3, 0.5f))}});
  require_close(y, {2, 5, 3, 2},
                {-4.0,  -1.0,  -28.0, -17.0, -52.0, -33.0, 20.0,  23.0,  60.0,  71.0,  100.0, 119.0, 44.0,  47.0,  148.0,
                 159.0, 252.0, 271.0, 68.0,  71.0,  236.0, 247.0, 404.0, 423.0, 92.0,  95.0,  324.0, 335.0, 556.0, 575.0,
                 -76.0, -49.0, -100.0, -65.0, -124.0, -81.0, 140.0, 167.0, 180.0, 215.0, 220.0, 263.0, 356.0, 383.0, 460.0,
                 495.0, 564.0, 607.0, 572.0, 599.0, 740.0, 775.0, 908.0, 951.0, 788.0, 815.0, 1020.0, 1055.0, 1252.0, 1295.0});
  // vector x matrix, matrix x vector, vector x vector.
  require_close(run1({"MatMul", {ft({2}, {1, 2}), ft({2, 3}, iota(6))}}), {3}, {6, 9, 12});
  require_close(run1({"MatMul", {ft({2, 3}, iota(6)), ft({3}, {1, 0, -1})}}), {2}, {-2, -2});
  require_close(run1({"MatMul", {ft({3}, {1, 2, 3}), ft({3}, {4, 5, 6})}}), {}, {32});
  require_close(run1({"MatMul", {ft({2, 2}, {1, 2, 3, 4}), ft({3, 2, 1}, {1, 1, 0, 1, 1, 0})}}), {3, 2, 1}, {3, 7, 2, 4, 1, 3});
  // Integers wrap around like the type.
  auto yi = run1({"MatMul", {Tensor::from_vector<std::int32_t>({1, 2}, {2147483647, 1}), Tensor::from_vector<std::int32_t>({2, 1}, {1, 1})}});
  REQUIRE(yi.dtype() == DType::Int32);
  CHECK(yi.data<std::int32_t>()[0] == -2147483647 - 1);
  auto yl = run1({"MatMul", {it({2, 2}, {1, 2, 3, 4}), it({2}, {5, 6})}});
  CHECK(yl.to_int64s() == std::vector<std::int64_t>{17, 39});
}

TEST_CASE("MatMul inference and errors", "[nn][matmul][infer]") {
  Graph g;
  Node* n = infer_one(g, "MatMul", {{DType::Float32, Shape{batch, Dim::named("seq"), 64}}, {DType::Float32, Shape{64, 128}}});
  CHECK(n->output(0)->shape() == Shape{batch, Dim::named("seq"), 128});
  Graph g2;
  Node* n2 = infer_one(g2, "MatMul", {{DType::Float32, Shape{batch, 1, 4, 8}}, {DType::Float32, Shape{8, 3}}});
  CHECK(n2->output(0)->shape() == Shape{batch, 1, 4, 3});
  Graph g3;
  auto msg = node_error([&] { infer_one(g3, "MatMul", {{DType::Float32, Shape{batch, 4, 8}}, {DType::Float32, Shape{7, 3}}}); }, "MatMul");
  CHECK(msg.find("inner") != std::string::npos);
  node_error([] { run({"MatMul", {ft({2, 3}, iota(6)), ft({2, 3}, iota(6))}}); }, "MatMul");
  node_error([] { run({"MatMul", {ft({2, 2, 3}, iota(12)), ft({3, 3, 1}, iota(9))}}); }, "MatMul");  // batch 2 vs 3
}

TEST_CASE("Gemm transposes, alpha, beta and broadcast C", "[nn][gemm]") {
  Tensor a = ft({3, 2}, {1, 2, 3, 4, 5, 6});  // transposed: [[1, 3, 5], [2, 4, 6]]
  Tensor b = ft({4, 3}, {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1});
  auto y = run1({"Gemm", {a, b, ft({4}, {1, 2, 3, 4})},
                 {{"transA", std::int64_t(1)}, {"transB", std::int64_t(1)}, {"alpha", 2.0f}, {"beta", 0.5f}}});
  require_close(y, {2, 4}, {2.5, 7, 11.5, 20, 4.5, 9, 13.5, 26});
  // No C; C scalar; C as a column [M, 1].
  require_close(run1({"Gemm", {ft({1, 2}, {1, 2}), ft({2, 2}, {1, 2, 3, 4})}}), {1, 2}, {7, 10});
  require_close(run1({"Gemm", {ft({1, 2}, {1, 2}), ft({2, 2}, {1, 2, 3, 4}), ft({}, {1})}}), {1, 2}, {8, 11});
  require_close(run1({"Gemm", {ft({2, 1}, {1, 2}), ft({1, 2}, {1, 1}), ft({2, 1}, {10, 20})}}), {2, 2}, {11, 11, 22, 22});
  auto msg = node_error([] { run({"Gemm", {ft({2, 3}, iota(6)), ft({2, 3}, iota(6))}}); }, "Gemm");
  CHECK(msg.find("inner") != std::string::npos);
  node_error([] { run({"Gemm", {ft({2, 3}, iota(6)), ft({3, 2}, iota(6)), ft({3}, {1, 2, 3})}}); }, "Gemm");
  Graph g;
  Node* n = infer_one(g, "Gemm", {{DType::Float32, Shape{batch, 512}}, {DType::Float32, Shape{10, 512}}, {DType::Float32, Shape{10}}},
                      {{"transB", std::int64_t(1)}});
  CHECK(n->output(0)->shape() == Shape{batch, 10});
}

// --- Resize ---------------------------------------------------------------------------------------

TEST_CASE("Resize nearest with scales and sizes", "[nn][resize]") {
  Tensor x = ft({1, 1, 2, 2}, {1, 2, 3, 4});
  // Upsample x2 (asymmetric + floor, as Upsample): every pixel becomes a 2x2 block.
  auto y = run1({"Resize", {x, Tensor(), ft({4}, {1, 1, 2, 2})},
                 {{"mode", std::string("nearest")}, {"coordinate_transformation_mode", std::string("asymmetric")},
                  {"nearest_mode", std::string("floor")}}, 13, 1, {2}});
  require_close(y, {1, 1, 4, 4}, {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4});
  // Opset 10: (X, scales), Upsample semantics.
  y = run1({"Resize", {x, ft({4}, {1, 1, 1, 3})}, {{"mode", std::string("nearest")}}, 10, 1, {1}});
  require_close(y, {1, 1, 2, 6}, {1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4});
  // Sizes, half_pixel, round_prefer_floor downsampling 1x4 -> 1x2 picks positions 0.5 -> 0 and 2.5 -> 2.
  y = run1({"Resize", {ft({1, 4}, {1, 2, 3, 4}), Tensor(), Tensor(), it({2}, {1, 2})}, {}, 13, 1, {3}});
  require_close(y, {1, 2}, {1, 3});
}

TEST_CASE("Resize linear: half_pixel and align_corners", "[nn][resize]") {
  Tensor x = ft({1, 1, 2, 2}, {1, 2, 3, 4});
  auto y = run1({"Resize", {x, Tensor(), ft({4}, {1, 1, 2, 2})}, {{"mode", std::string("linear")}}, 13, 1, {2}});
  require_close(y, {1, 1, 4, 4}, {1.0, 1.25, 1.75, 2.0, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3.0, 3.25, 3.75, 4.0});
  y = run1({"Resize", {x, Tensor(), Tensor(), it({4}, {1, 1, 3, 3})},
            {{"mode", std::string("linear")}, {"coordinate_transformation_mode", std::string("align_corners")}}, 13, 1, {3}});
  require_close(y, {1, 1, 3, 3}, {1.0, 1.5, 2.0, 2.0, 2.5, 3.0, 3.0, 3.5, 4.0});
}

TEST_CASE("Resize cubic reproduces a linear ramp", "[nn][resize]") {
  // A cubic kernel with a = -0.5 interpolates linear data exactly away from the edges.
  auto y = run1({"Resize", {ft({1, 6}, iota(6)), Tensor(), Tensor(), it({2}, {1, 11})},
                 {{"mode", std::string("cubic")}, {"cubic_coeff_a", -0.5f},
                  {"coordinate_transformation_mode", std::string("align_corners")}}, 13, 1, {3}});
  REQUIRE(y.dims() == std::vector<std::int64_t>{1, 11});
  for (std::size_t i = 2; i < 9; ++i) CHECK(y.at_double(i) == Approx(0.5 * static_cast<double>(i)).margin(1e-6));
}

TEST_CASE("Resize inference and errors", "[nn][resize][infer]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{batch, 3, 10, 20});
  Value* scales = g.add_constant("scales", ft({4}, {1, 1, 2, 0.5f}));
  Node* n = g.add_node("Resize", {x, nullptr, scales}, {"y"}, {}, "node_under_test");
  infer_shapes(g);
  CHECK(n->output(0)->shape() == Shape{batch, 3, 20, 10});
  node_error([] { run({"Resize", {ft({1, 4}, iota(4)), Tensor(), ft({1}, {2})}, {}, 13, 1, {2}}); }, "Resize");
  node_error([] {
    run({"Resize", {ft({1, 4}, iota(4)), Tensor(), ft({2}, {1, 2})}, {{"mode", std::string("bicubic")}}, 13, 1, {2}});
  }, "Resize");
  node_error([] { run({"Resize", {ft({1, 4}, iota(4)), Tensor()}, {}, 13}); }, "Resize");  // neither scales nor sizes
}

TEST_CASE("Upsample is Resize-10: scales as an attribute (opset 7) or an input (opset 9)", "[nn][resize]") {
  Tensor x = ft({1, 1, 2, 2}, {1, 2, 3, 4});
  auto y = run1({"Upsample", {x}, {{"scales", std::vector<float>{1, 1, 2, 2}}}, 7});
  require_close(y, {1, 1, 4, 4}, {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4});
  // Linear with asymmetric coordinates: output 3 sits at 1.5 and clamps to the last input.
  y = run1({"Upsample", {ft({1, 1, 1, 2}, {1, 3}), ft({4}, {1, 1, 1, 2})}, {{"mode", std::string("linear")}}, 9, 1, {1}});
  require_close(y, {1, 1, 1, 4}, {1, 2, 3, 3});
  // Scales known only at run time: the rank is inferred, the resized dims are not.
  Graph g;
  Node* n = infer_one(g, "Upsample", {{DType::Float32, Shape{1, 3, 8, 8}}, {DType::Float32, Shape{4}}});
  REQUIRE(n->output(0)->shape().rank() == 4);
  CHECK_FALSE(n->output(0)->shape()[2].is_static());
  node_error([&] { run({"Upsample", {x}, {{"scales", std::vector<float>{1, 1, 2}}}, 7}); }, "Upsample");
  node_error([&] { run({"Upsample", {x}, {{"scales", std::vector<float>{1, 1, 2, 2}}, {"mode", std::string("cubic")}}, 7}); },
             "Upsample");  // cubic came with Resize-11
}

// --- MaxUnpool ------------------------------------------------------------------------------------

TEST_CASE("MaxUnpool scatters MaxPool's values back to their indices", "[nn][pool]") {
  // MaxPool 2x2 stride 2 of a 4x4 plane kept 5, 6, 7, 8 at flat positions 5, 7, 13, 15.
  Tensor x = ft({1, 1, 2, 2}, {5, 6, 7, 8});
  Tensor idx = it({1, 1, 2, 2}, {5, 7, 13, 15});
  std::map<std::string, Attribute> attrs{{"kernel_shape", std::vector<std::int64_t>{2, 2}},
                                         {"strides", std::vector<std::int64_t>{2, 2}}};
  require_close(run1({"MaxUnpool", {x, idx}, attrs, 11}), {1, 1, 4, 4},
                {0, 0, 0, 0, 0, 5, 0, 6, 0, 0, 0, 0, 0, 7, 0, 8});
  // A larger output_shape pads the 4x4 result at the end (the indices stay those of the 4x4 plane).
  require_close(run1({"MaxUnpool", {x, idx, it({4}, {1, 1, 5, 5})}, attrs, 11, 1, {2}}), {1, 1, 5, 5},
                {0, 0, 0, 0, 0, 0, 5, 0, 6, 0, 0, 0, 0, 0, 0, 0, 7, 0, 8, 0, 0, 0, 0, 0, 0});
  // Inference: (in - 1) * stride + kernel - pads, symbolic dims too.
  Graph g;
  Node* n = infer_one(g, "MaxUnpool", {{DType::Float32, Shape{batch, 3, Dim::named("h"), 4}}, {DType::Int64, Shape{batch, 3, Dim::named("h"), 4}}},
                      {{"kernel_shape", std::vector<std::int64_t>{3, 3}}, {"strides", std::vector<std::int64_t>{2, 2}},
                       {"pads", std::vector<std::int64_t>{1, 1, 1, 1}}});
  CHECK(n->output(0)->shape()[3] == Dim(7));
  CHECK(n->output(0)->shape()[2] == dim_add(dim_mul(dim_sub(Dim::named("h"), Dim(1)), Dim(2)), Dim(1)));
  auto msg = node_error([&] { run({"MaxUnpool", {x, it({1, 1, 2, 2}, {5, 7, 13, 16})}, attrs, 11}); }, "MaxUnpool");
  CHECK(msg.find("16") != std::string::npos);
  node_error([&] { run({"MaxUnpool", {x, idx, it({4}, {1, 1, 3, 3})}, attrs, 11, 1, {2}}); }, "MaxUnpool");  // too small
}

// --- NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss -------------------------------------------

TEST_CASE("NegativeLogLikelihoodLoss: reductions, weight and ignore_index", "[nn][loss]") {
  Tensor x = ft({2, 3}, {-1.0f, -2.0f, -3.0f, -0.5f, -1.5f, -2.5f});
  Tensor target = it({2}, {2, 0});
  Tensor w = ft({3}, {1, 2, 3});
  auto nll = [&](std::vector<Tensor> in, std::map<std::string, Attribute> attrs) {
    return run1({"NegativeLogLikelihoodLoss", std::move(in), std::move(attrs), 13});
  };
  const std::string r = "reduction";
  // Sample 0: -(-3) * weight 3 = 9; sample 1: -(-0.5) * weight 1 = 0.5.
  require_close(nll({x, target, w}, {{r, std::string("none")}}), {2}, {9, 0.5});
  require_close(nll({x, target, w}, {{r, std::string("sum")}}), {}, {9.5});
  require_close(nll({x, target, w}, {}), {}, {9.5 / 4});  // mean: divided by the weights taken, 3 + 1
  require_close(nll({x, target}, {}), {}, {(3 + 0.5) / 2});
  // An ignored sample adds neither loss nor weight.
  require_close(nll({x, target, w}, {{"ignore_index", std::int64_t(0)}}), {}, {3});
  require_close(nll({x, target, w}, {{r, std::string("none")}, {"ignore_index", std::int64_t(0)}}), {2}, {9, 0});
  // Must not fire: an ignored target outside [0, C) is no error.
  require_close(nll({x, it({2}, {-100, 1}), w}, {{"ignore_index", std::int64_t(-100)}}), {}, {1.5});
  // K-dimensional: input [N=1, C=2, d=2], target [1, 2] = {1, 0}: losses 3 and 2.
  require_close(nll({ft({1, 2, 2}, {-1, -2, -3, -4}), it({1, 2}, {1, 0})}, {{r, std::string("none")}}), {1, 2}, {3, 2});
  auto y32 = nll({ft({1, 2, 2}, {-1, -2, -3, -4}), Tensor::from_vector<std::int32_t>({1, 2}, {1, 0})}, {});
  require_close(y32, {}, {2.5});
}

TEST_CASE("SoftmaxCrossEntropyLoss gives the loss and the log-probabilities", "[nn][loss]") {
  // Row 0 is uniform: log_prob -log 3 each; row 1 is LogSoftmax(1, 2, 3) (see the Softmax test above).
  auto y = run({"SoftmaxCrossEntropyLoss", {ft({2, 3}, {0, 0, 0, 1, 2, 3}), it({2}, {1, 2})}, {}, 13, 2});
  const double log3 = std::log(3.0);
  require_close(y[0], {}, {(log3 + 0.407606) / 2});
  require_close(y[1], {2, 3}, {-log3, -log3, -log3, -2.407606, -1.407606, -0.407606});
  // Weighted sum with an ignored sample.
  y = run({"SoftmaxCrossEntropyLoss", {ft({2, 3}, {0, 0, 0, 1, 2, 3}), it({2}, {1, 2}), ft({3}, {1, 2, 3})},
           {{"reduction", std::string("sum")}, {"ignore_index", std::int64_t(1)}}, 12, 1});
  require_close(y[0], {}, {3 * 0.407606});
}

TEST_CASE("loss inference and errors", "[nn][loss][infer]") {
  Graph g;
  Node* n = infer_one(g, "NegativeLogLikelihoodLoss", {{DType::Float32, Shape{batch, 5, 7}}, {DType::Int64, Shape{batch, 7}}},
                      {{"reduction", std::string("none")}});
  CHECK(n->output(0)->shape() == Shape{batch, 7});
  Graph g2;
  n = infer_one(g2, "SoftmaxCrossEntropyLoss", {{DType::Float16, Shape{batch, 5}}, {DType::Int32, Shape{batch}}}, {}, 2);
  CHECK(n->output(0)->shape() == Shape{});
  CHECK(n->output(0)->dtype() == DType::Float16);
  CHECK(n->output(1)->shape() == Shape{batch, 5});
  Graph g3;
  auto msg = node_error([&] { infer_one(g3, "NegativeLogLikelihoodLoss", {{DType::Float32, Shape{4, 5, 7}}, {DType::Int64, Shape{4, 6}}}); },
                        "NegativeLogLikelihoodLoss");
  CHECK(msg.find("does not match") != std::string::npos);
  Graph g4;
  node_error([&] { infer_one(g4, "NegativeLogLikelihoodLoss", {{DType::Float32, Shape{4, 5}}, {DType::Int64, Shape{4}}},
                             {{"reduction", std::string("average")}}); },
             "NegativeLogLikelihoodLoss");
  // A target outside the classes (and not ignore_index) is an error naming the node.
  msg = node_error([] { run({"NegativeLogLikelihoodLoss", {ft({2, 3}, iota(6)), it({2}, {0, 3})}, {}, 13}); },
                   "NegativeLogLikelihoodLoss");
  CHECK(msg.find("outside the classes [0, 3)") != std::string::npos);
  node_error([] { run({"SoftmaxCrossEntropyLoss", {ft({2, 3}, iota(6)), it({2}, {-1, 0})}, {}, 13}); },
             "SoftmaxCrossEntropyLoss");
  node_error([] { run({"NegativeLogLikelihoodLoss", {ft({2, 3}, iota(6)), it({2}, {0, 1}), ft({2}, {1, 1})}, {}, 13}); },
             "NegativeLogLikelihoodLoss");  // weight of the wrong length
}

// --- Pad ------------------------------------------------------------------------------------------

TEST_CASE("Pad modes", "[nn][pad]") {
  Tensor x = ft({1, 1, 3, 4}, iota(12));
  Tensor pads = it({8}, {0, 0, 1, 1, 0, 0, 0, 2});
  require_close(run1({"Pad", {x, pads}, {{"mode", std::string("reflect")}}, 13}), {1, 1, 4, 7},
                {5, 4, 5, 6, 7, 6, 5, 1, 0, 1, 2, 3, 2, 1, 5, 4, 5, 6, 7, 6, 5, 9, 8, 9, 10, 11, 10, 9});
  require_close(run1({"Pad", {x, pads}, {{"mode", std::string("edge")}}, 13}), {1, 1, 4, 7},
                {0, 0, 1, 2, 3, 3, 3, 0, 0, 1, 2, 3, 3, 3, 4, 4, 5, 6, 7, 7, 7, 8, 8, 9, 10, 11, 11, 11});
  // Constant: opset 2 attributes, opset 11 inputs, and negative pads crop.
  require_close(run1({"Pad", {ft({2}, {1, 2})}, {{"pads", std::vector<std::int64_t>{1, 2}}, {"value", 9.0f}}, 2}), {5},
                {9, 1, 2, 9, 9});
  require_close(run1({"Pad", {ft({2}, {1, 2}), it({2}, {1, 2}), ft({}, {7})}, {}, 13}), {5}, {7, 1, 2, 7, 7});
  require_close(run1({"Pad", {ft({4}, {1, 2, 3, 4}), it({2}, {-1, 1})}, {}, 13}), {4}, {2, 3, 4, 0});
  // Opset 18 axes: pad only the last axis.
  require_close(run1({"Pad", {ft({2, 2}, {1, 2, 3, 4}), it({2}, {1, 0}), Tensor(), it({1}, {-1})}, {{"mode", std::string("wrap")}}, 18}),
                {2, 3}, {2, 1, 2, 4, 3, 4});
  // Integer types are copied exactly.
  auto yi = run1({"Pad", {it({2}, {(std::int64_t(1) << 60) + 1, 2}), it({2}, {1, 0})}, {{"mode", std::string("edge")}}, 13});
  CHECK(yi.to_int64s() == std::vector<std::int64_t>{(std::int64_t(1) << 60) + 1, (std::int64_t(1) << 60) + 1, 2});
}

TEST_CASE("Pad inference and errors", "[nn][pad][infer]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{batch, 3, 8, 8});
  Value* pads = g.add_constant("pads", it({8}, {0, 0, 1, 1, 0, 0, 1, 1}));
  Node* n = g.add_node("Pad", {x, pads}, {"y"}, {}, "node_under_test");
  infer_shapes(g);
  CHECK(n->output(0)->shape() == Shape{batch, 3, 10, 10});
  node_error([] { run({"Pad", {ft({2}, {1, 2}), it({3}, {1, 2, 3})}, {}, 13}); }, "Pad");
  node_error([] { run({"Pad", {ft({2}, {1, 2}), it({2}, {-2, -1})}, {}, 13}); }, "Pad");
  node_error([] { run({"Pad", {ft({2}, {1, 2}), it({2}, {1, 1})}, {{"mode", std::string("mirror")}}, 13}); }, "Pad");
}

// --- GridSample, RoiAlign ---------------------------------------------------------------------------

TEST_CASE("GridSample: modes, paddings and align_corners on a 2x2 image", "[nn][gridsample]") {
  using Attrs = std::map<std::string, Attribute>;
  const Tensor x = ft({1, 1, 2, 2}, {1, 2, 3, 4});
  auto at = [&](std::vector<float> xy, Attrs attrs, int opset = 16) {
    const auto points = static_cast<std::int64_t>(xy.size() / 2);
    return run1({"GridSample", {x, ft({1, 1, points, 2}, xy)}, std::move(attrs), opset});
  };
  auto with = [](const char* mode, const char* pad, std::int64_t ac) {
    return Attrs{{"mode", std::string(mode)}, {"padding_mode", std::string(pad)}, {"align_corners", ac}};
  };
  // The centre is the mean; (-1, -1) is the top-left pixel's outer corner without align_corners (a
  // quarter of it with zero padding, all of it with border or reflection) and its centre with them.
  require_close(at({0, 0, -1, -1}, with("bilinear", "zeros", 0)), {1, 1, 1, 2}, {2.5, 0.25});
  require_close(at({0, 0, -1, -1}, with("bilinear", "border", 0)), {1, 1, 1, 2}, {2.5, 1});
  require_close(at({0, 0, -1, -1}, with("bilinear", "reflection", 0)), {1, 1, 1, 2}, {2.5, 1});
  require_close(at({-1, -1, 1, 1, 1, -1}, with("bilinear", "zeros", 1)), {1, 1, 1, 3}, {1, 4, 2});
  // Far outside: border clamps to the edge; reflection folds back in; zeros reads nothing.
  require_close(at({3, 0}, with("bilinear", "border", 1)), {1, 1, 1, 1}, {3});
  require_close(at({3, -1}, with("bilinear", "reflection", 1)), {1, 1, 1, 1}, {1});  // x = 4 px -> 0
  require_close(at({3, 0}, with("bilinear", "zeros", 1)), {1, 1, 1, 1}, {0});
  // Nearest rounds half to even: x = 0.7 -> 1, y = -0.1 -> 0.
  require_close(at({0.2f, -0.6f}, with("nearest", "zeros", 0)), {1, 1, 1, 1}, {2});
  // Bicubic at the centre: the four pixels weigh 0.59375^2 each with zero padding; with border the
  // outer taps fold onto the edge and the result is the mean.
  require_close(at({0, 0}, with("bicubic", "zeros", 0)), {1, 1, 1, 1}, {0.59375 * 0.59375 * 10});
  require_close(at({0, 0}, with("bicubic", "border", 0)), {1, 1, 1, 1}, {2.5});
  // Opset 20 names: linear / cubic, and a 3-D volume.
  require_close(at({0, 0}, with("linear", "zeros", 0), 20), {1, 1, 1, 1}, {2.5});
  require_close(at({0, 0}, with("cubic", "border", 0), 20), {1, 1, 1, 1}, {2.5});
  const Tensor vol = ft({1, 1, 2, 2, 2}, iota(8));
  require_close(run1({"GridSample", {vol, ft({1, 1, 1, 2, 3}, {0, 0, 0, 1, 1, 1})}, with("linear", "zeros", 1), 20}),
                {1, 1, 1, 1, 2}, {3.5, 7});
}

TEST_CASE("GridSample inference and errors", "[nn][gridsample][infer]") {
  Graph g;
  g.opsets[""] = 16;
  Node* n = infer_one(g, "GridSample", {{DType::Float32, Shape{batch, 3, 32, 32}}, {DType::Float32, Shape{batch, 7, 9, 2}}});
  CHECK(n->output(0)->shape() == Shape{batch, 3, 7, 9});
  Graph g2;
  g2.opsets[""] = 16;
  CHECK(node_error([&] { infer_one(g2, "GridSample", {{DType::Float32, Shape{1, 3, 4, 4}}, {DType::Float32, Shape{1, 7, 9, 3}}}); },
                   "GridSample")
            .find("must end in 2 coordinates") != std::string::npos);
  Graph g3;
  g3.opsets[""] = 16;
  CHECK(node_error([&] { infer_one(g3, "GridSample", {{DType::Float32, Shape{1, 3, 4, 4}}, {DType::Float32, Shape{1, 7, 9, 2}}},
                                 {{"mode", std::string("linear")}}); },
                 "GridSample")
            .find("bilinear, nearest or bicubic") != std::string::npos);
  Graph g4;
  g4.opsets[""] = 16;
  CHECK(node_error([&] { infer_one(g4, "GridSample", {{DType::Float32, Shape{1, 3, 4, 4, 4}}, {DType::Float32, Shape{1, 2, 2, 2, 3}}}); },
                   "GridSample")
            .find("before opset 20 takes a 4-D X") != std::string::npos);
}

TEST_CASE("RoiAlign: avg and max, half_pixel and output_half_pixel", "[nn][roialign]") {
  using Attrs = std::map<std::string, Attribute>;
  const Tensor x = ft({1, 1, 4, 4}, iota(16));
  const Tensor rois = ft({1, 4}, {0, 0, 3, 3});
  const Tensor idx = it({1}, {0});
  auto roi = [&](const char* mode, const char* ct, std::int64_t size = 1) {
    return run1({"RoiAlign", {x, rois, idx},
                 Attrs{{"mode", std::string(mode)}, {"coordinate_transformation_mode", std::string(ct)},
                       {"sampling_ratio", std::int64_t{1}}, {"output_height", size}, {"output_width", size}},
                 16});
  };
  // One sample at the roi's centre: (1.5, 1.5) between pixels 5, 6, 9, 10; shifted by half a pixel it
  // is pixel (1, 1) = 5.
  require_close(roi("avg", "output_half_pixel"), {1, 1, 1, 1}, {7.5});
  require_close(roi("avg", "half_pixel"), {1, 1, 1, 1}, {5});
  // Max takes the largest weighted corner: 0.25 * 10.
  require_close(roi("max", "output_half_pixel"), {1, 1, 1, 1}, {2.5});
  // 3x3 bins of 1 pixel, sampled at their centres (k + 0.5).
  require_close(roi("avg", "output_half_pixel", 3), {1, 1, 3, 3}, {2.5, 3.5, 4.5, 6.5, 7.5, 8.5, 10.5, 11.5, 12.5});
  Graph g;
  g.opsets[""] = 16;
  Node* n = infer_one(g, "RoiAlign", {{DType::Float32, Shape{batch, 8, 32, 32}}, {DType::Float32, Shape{Dim::named("R"), 4}},
                                      {DType::Int64, Shape{Dim::named("R")}}},
                      {{"output_height", std::int64_t{7}}, {"output_width", std::int64_t{5}}});
  CHECK(n->output(0)->shape() == Shape{Dim::named("R"), 8, 7, 5});
  CHECK(node_error([&] { run1({"RoiAlign", {x, rois, it({1}, {2})}, {}, 16}); }, "RoiAlign")
            .find("batch_indices[0] = 2 is outside [0, 1)") != std::string::npos);
}

}  // namespace test_reference_nn
