// Graph IR: building, use lists, topological order, verify, clone, dumps.
#include <catch2/catch.hpp>

#include <cmath>

#include "ondine/ir/graph.hpp"
#include "ondine/ir/typed_tensor.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_ir {

using namespace ondine;

namespace {
// x -> Relu -> Add(., w) -> y
Graph small_graph() {
  Graph g;
  g.name = "small";
  Value* x = g.add_input("x", DType::Float32, Shape{Dim::named("batch"), 4});
  Value* w = g.add_constant("w", Tensor::from_vector<float>({4}, {1, 2, 3, 4}));
  Value* r = g.add_op("Relu", {x}, {}, "r");
  Value* y = g.add_op("Add", {r, w}, {}, "y");
  g.add_output(y);
  return g;
}
}  // namespace

TEST_CASE("tensors: a released large block is reused for the next tensor of its size, uninitialized skips zeroing",
          "[ir][allocate]") {
  const std::vector<std::int64_t> dims{3, 1024, 1024};  // 12 MiB of floats: a huge-page block
  const void* first = nullptr;
  {
    Tensor t = Tensor::uninitialized(DType::Float32, dims);
    CHECK(t.dims() == dims);
    CHECK(t.nbytes() == 12u << 20);
    CHECK(reinterpret_cast<std::uintptr_t>(t.raw()) % (2u << 20) == 0);
    t.data<float>()[7] = 42.0f;
    first = t.raw();
  }
  // The same size again: the block released just now (a compiled model's outputs, run after run).
  Tensor again = Tensor::uninitialized(DType::Float32, dims);
  CHECK(again.raw() == first);
  // A zero-filled tensor of that size gets a block too, filled with zeros whatever it held.
  Tensor zeros(DType::Float32, dims);
  CHECK(zeros.data<float>()[7] == 0.0f);
  // Blocks over the cache's limit go back to the heap; small ones never enter it.
  CHECK_NOTHROW(Tensor::uninitialized(DType::UInt8, {static_cast<std::int64_t>(detail::BlockCache::kLimit) + 1}));
  CHECK(Tensor::uninitialized(DType::Float32, {0}).raw() == nullptr);
}

TEST_CASE("values track producers and uses", "[ir]") {
  Graph g = small_graph();
  Value* r = g.find_value("r");
  REQUIRE(r);
  REQUIRE(r->producer()->op_type() == "Relu");
  REQUIRE(r->uses().size() == 1);
  REQUIRE(r->uses()[0].node->op_type() == "Add");
  REQUIRE(g.find_value("w")->is_constant());
  REQUIRE(g.find_value("x")->is_graph_input());
  REQUIRE(g.find_value("y")->is_graph_output());
  REQUIRE_FALSE(g.check().has_value());
}

TEST_CASE("topological order puts producers first", "[ir]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{2});
  // Add the consumer first, its producer later: insertion order is not topological.
  Value* late = g.get_or_create_value("late");
  Value* y = g.add_op("Neg", {late}, {}, "y");
  g.add_node("Relu", {x}, {"late"});
  g.add_output(y);
  auto order = g.topo_order();
  REQUIRE(order.size() == 2);
  CHECK(order[0]->op_type() == "Relu");
  CHECK(order[1]->op_type() == "Neg");
}

TEST_CASE("verify reports a cycle naming a node", "[ir]") {
  Graph g;
  Value* a = g.get_or_create_value("a");
  Node* n1 = g.add_node("Relu", {a}, {"b"}, {}, "first");
  g.add_node("Neg", {n1->output(0)}, {"a"}, {}, "second");
  g.add_output(n1->output(0));
  auto problem = g.check();
  REQUIRE(problem.has_value());
  CHECK(problem->find("cycle") != std::string::npos);
  REQUIRE_THROWS_AS(g.verify(), Error);
}

TEST_CASE("verify reports an undefined input", "[ir]") {
  Graph g;
  Value* ghost = g.get_or_create_value("ghost");
  g.add_output(g.add_op("Relu", {ghost}));
  auto problem = g.check();
  REQUIRE(problem.has_value());
  CHECK(problem->find("ghost") != std::string::npos);
}

TEST_CASE("replace_all_uses and remove_node keep use lists consistent", "[ir]") {
  Graph g = small_graph();
  Value* x = g.find_value("x");
  Value* r = g.find_value("r");
  Node* relu = r->producer();
  g.replace_all_uses(r, x);
  g.remove_node(relu);
  REQUIRE(g.num_nodes() == 1);
  REQUIRE(x->uses().size() == 1);
  REQUIRE_FALSE(g.check().has_value());
  g.remove_dead_values();
  CHECK(g.find_value("r") == nullptr);
}

TEST_CASE("remove_node refuses a node whose output is used", "[ir]") {
  Graph g = small_graph();
  REQUIRE_THROWS_AS(g.remove_node(g.find_value("r")->producer()), Error);
}

TEST_CASE("clone is deep and independent", "[ir]") {
  Graph g = small_graph();
  Graph c = g.clone();
  REQUIRE(c.to_text() == g.to_text());
  c.replace_all_uses(c.find_value("r"), c.find_value("x"));
  c.remove_node(c.find_value("r")->producer());
  CHECK(c.num_nodes() == 1);
  CHECK(g.num_nodes() == 2);
  CHECK_FALSE(g.check().has_value());
  CHECK_FALSE(c.check().has_value());
}

TEST_CASE("text and DOT dumps name ops, values and shapes", "[ir]") {
  Graph g = small_graph();
  std::string text = g.to_text();
  CHECK(text.find("input  %x: float32[batch,4]") != std::string::npos);
  CHECK(text.find("%y = Add(%r, %w)") != std::string::npos);
  std::string dot = g.to_dot();
  CHECK(dot.rfind("digraph", 0) == 0);
  CHECK(dot.find("Relu") != std::string::npos);
}

TEST_CASE("attributes: typed getters, defaults and errors name the node", "[ir]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{1});
  Node* n = g.add_node("LeakyRelu", {x}, {"y"}, {{"alpha", 0.2f}, {"axes", std::vector<std::int64_t>{1, 2}}}, "lr");
  CHECK(n->attr_float("alpha") == Approx(0.2f));
  CHECK(n->attr_int("missing", 7) == 7);
  CHECK(n->attr_ints("axes") == std::vector<std::int64_t>{1, 2});
  try {
    n->attr_int("alpha");
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.node() == "lr");
    CHECK(e.op() == "LeakyRelu");
  }
  REQUIRE_THROWS_AS(n->attr_string("mode"), Error);
}

TEST_CASE("16-bit float conversions round to nearest even", "[ir]") {
  CHECK(static_cast<float>(float16(1.0f)) == 1.0f);
  CHECK(static_cast<float>(float16(65504.0f)) == 65504.0f);
  CHECK(std::isinf(static_cast<float>(float16(1e6f))));
  CHECK(static_cast<float>(float16(5.9604645e-08f)) == 5.9604645e-08f);  // smallest subnormal
  CHECK(static_cast<float>(bfloat16(1.0f)) == 1.0f);
  CHECK(static_cast<float>(bfloat16(3.140625f)) == 3.140625f);
  CHECK(std::isnan(static_cast<float>(float16(std::nanf("")))));
}

TEST_CASE("tensors: shallow copies, deep clone, typed access checks dtype", "[ir]") {
  Tensor t = Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4});
  Tensor view = t;
  Tensor deep = t.clone();
  t.data<float>()[0] = 9;
  CHECK(view.data<float>()[0] == 9);
  CHECK(deep.data<float>()[0] == 1);
  REQUIRE_THROWS_AS(t.data<std::int64_t>(), Error);
  CHECK(t.reshaped({4}).dims() == std::vector<std::int64_t>{4});
  REQUIRE_THROWS_AS(t.reshaped({3}), Error);
}

TEST_CASE("typed tensors: element type and rank checked once and row-major access with a checked at()", "[ir]") {
  TypedTensor<float, 3> t({2, 3, 4});
  CHECK(t.size() == 24);
  CHECK(t.dim(1) == 3);
  t(1, 2, 3) = 5.0f;
  CHECK(t.data()[1 * 12 + 2 * 4 + 3] == 5.0f);
  CHECK(t.at(1, 2, 3) == 5.0f);
  REQUIRE_THROWS_WITH(t.at(0, 3, 0), Catch::Contains("index (0, 3, 0)") && Catch::Contains("[2,3,4]"));
  REQUIRE_THROWS_AS(t.at(-1, 0, 0), Error);
  float sum = 0;
  for (float x : t) sum += x;
  CHECK(sum == 5.0f);
  // A view shares storage with the Tensor it wraps; the wrong dtype or rank is refused.
  Tensor raw = t.tensor();
  CHECK(raw.data<float>()[23] == 5.0f);
  TypedTensor<float, 3> view(raw);
  view(0, 0, 0) = 1.0f;
  CHECK(t(0, 0, 0) == 1.0f);
  REQUIRE_THROWS_WITH((TypedTensor<std::int64_t, 3>(raw)), Catch::Contains("expected a tensor of int64 and rank 3, got float32[2,3,4]"));
  REQUIRE_THROWS_AS((TypedTensor<float, 2>(raw)), Error);
  TypedTensor<std::int64_t, 0> scalar(Tensor::scalar<std::int64_t>(7));
  CHECK(scalar() == 7);
}

}  // namespace test_ir
