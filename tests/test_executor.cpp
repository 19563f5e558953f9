// Reference executor: input checking, unsupported ops, symbolic dims, stats.
#include <catch2/catch.hpp>

#include "ondine/ir/stats.hpp"
#include "ondine/reference/executor.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_executor {

using namespace ondine;
using test::error_of;

namespace {
// y = Relu(x + b), x: float32[batch, 3]
Graph add_relu() {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{Dim::named("batch"), 3});
  Value* b = g.add_constant("b", Tensor::from_vector<float>({3}, {1, -1, 0.5f}));
  g.add_output(g.add_node("Relu", {g.add_node("Add", {x, b}, {"sum"}, {}, "add")->output(0)}, {"y"}, {}, "relu")->output(0));
  infer_shapes(g);
  return g;
}

}  // namespace

TEST_CASE("executor runs and binds a symbolic batch from the input", "[executor]") {
  Graph g = add_relu();
  CHECK(g.find_value("y")->shape().str() == "[batch,3]");
  ReferenceExecutor exec(g);
  auto out = exec.run({{"x", Tensor::from_vector<float>({2, 3}, {0, 0, 0, -2, 2, 1})}});
  const float* y = out.at("y").data<float>();
  CHECK(std::vector<float>(y, y + 6) == std::vector<float>{1, 0, 0.5f, 0, 1, 1.5f});
}

TEST_CASE("executor rejects bad inputs with a clear error", "[executor][bad-input]") {
  Graph g = add_relu();
  ReferenceExecutor exec(g);
  CHECK(error_of([&] { exec.run({}); }).find("missing input 'x'") != std::string::npos);
  CHECK(error_of([&] { exec.run({{"x", Tensor::from_vector<double>({1, 3}, {1, 2, 3})}}); })
            .find("dtype float64, the model expects float32") != std::string::npos);
  CHECK(error_of([&] { exec.run({{"x", Tensor::from_vector<float>({1, 4}, {1, 2, 3, 4})}}); })
            .find("has shape [1,4], the model expects [batch,3]") != std::string::npos);
  CHECK(error_of([&] { exec.run({{"x", Tensor::from_vector<float>({3}, {1, 2, 3})}}); }).find("expects [batch,3]") !=
        std::string::npos);
  CHECK(error_of([&] {
          exec.run({{"x", Tensor::from_vector<float>({1, 3}, {1, 2, 3})}, {"z", Tensor::scalar<float>(1)}});
        }).find("'z' is not an input") != std::string::npos);
}

TEST_CASE("a symbolic dim shared by two inputs must bind to one size", "[executor][bad-input]") {
  Graph g;
  Value* a = g.add_input("a", DType::Float32, Shape{Dim::named("n")});
  Value* b = g.add_input("b", DType::Float32, Shape{Dim::named("n")});
  g.add_output(g.add_op("Add", {a, b}));
  ReferenceExecutor exec(g);
  CHECK(error_of([&] {
          exec.run({{"a", Tensor::from_vector<float>({2}, {1, 2})}, {"b", Tensor::from_vector<float>({3}, {1, 2, 3})}});
        }).find("binds dim 'n' to 3") != std::string::npos);
}

TEST_CASE("unsupported ops are reported all at once, naming a node", "[executor][bad-input]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{2});
  Value* y = g.add_node("FancyOp", {x}, {"y"}, {}, "fancy1")->output(0);
  Value* z = g.add_node("OtherOp", {y}, {"z"}, {}, "other1")->output(0);
  g.add_output(z);
  std::string msg = error_of([&] { ReferenceExecutor exec(g); });
  CHECK(msg.find("FancyOp") != std::string::npos);
  CHECK(msg.find("OtherOp") != std::string::npos);
  CHECK(msg.find("fancy1") != std::string::npos);
}

TEST_CASE("a kernel error names the node and op", "[executor][bad-input]") {
  Graph g;
  Value* a = g.add_input("a", DType::Float32, Shape{Dim::named("n")});
  Value* b = g.add_input("b", DType::Float32, Shape{Dim::named("m")});
  g.add_output(g.add_node("Add", {a, b}, {"c"}, {}, "the_add")->output(0));
  ReferenceExecutor exec(g);
  try {
    exec.run({{"a", Tensor::from_vector<float>({2}, {1, 2})}, {"b", Tensor::from_vector<float>({3}, {1, 2, 3})}});
    FAIL("expected a broadcast error");
  } catch (const Error& e) {
    CHECK(e.node() == "the_add");
    CHECK(e.op() == "Add");
  }
}

TEST_CASE("bind_dims and graph_stats count parameters and FLOPs", "[stats]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{Dim::named("batch"), 4});
  Value* w = g.add_constant("w", Tensor(DType::Float32, {4, 8}));
  g.add_output(g.add_op("MatMul", {x, w}));
  infer_shapes(g);
  CHECK_FALSE(graph_stats(g).flops.has_value());
  bind_dims(g, {{"batch", 2}});
  GraphStats s = graph_stats(g);
  CHECK(s.parameters == 32);
  REQUIRE(s.flops.has_value());
  CHECK(*s.flops == Approx(2.0 * 2 * 8 * 4));
  REQUIRE_THROWS_AS(bind_dims(g, {{"seq", 2}}), Error);
}

TEST_CASE("graph_stats counts the integer forms as the float ops: MatMulInteger, ConvInteger, QLinearConv", "[stats]") {
  Graph g;
  Value* a = g.add_input("a", DType::UInt8, Shape{2, 4});
  g.add_output(g.add_op("MatMulInteger", {a, g.add_constant("w", Tensor(DType::Int8, {4, 8}))}));
  Value* x = g.add_input("x", DType::UInt8, Shape{1, 3, 5, 5});
  Value* wc = g.add_constant("wc", Tensor(DType::Int8, {6, 3, 3, 3}));
  g.add_output(g.add_op("ConvInteger", {x, wc}));
  Value* f32 = g.add_constant("s", Tensor::scalar<float>(0.5f));
  Value* zu = g.add_constant("zu", Tensor::scalar<std::uint8_t>(0));
  Value* zs = g.add_constant("zs", Tensor::scalar<std::int8_t>(0));
  g.add_output(g.add_op("QLinearConv", {x, f32, zu, wc, f32, zs, f32, zu}));
  infer_shapes(g);
  GraphStats s = graph_stats(g);
  REQUIRE(s.flops.has_value());
  CHECK(*s.flops == Approx(2.0 * 2 * 8 * 4 + 2 * (2.0 * 6 * 3 * 3 * 3 * 3 * 3)));
}

}  // namespace test_executor
