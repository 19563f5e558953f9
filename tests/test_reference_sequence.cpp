// The sequence and optional ops (reference/sequence.hpp, ir/infer/sequence.hpp): kinds and element types
// from inference, the kernels' positions and splits, errors naming the node, and a model whose sequences
// stay inside it compiled (the sequence nodes on reference kernels) equal to the reference executor.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "ondine/artifact/artifact.hpp"
#include "ondine/ir/shape_inference.hpp"
#include "ondine/lower/lower.hpp"
#include "ondine/reference/executor.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_reference_sequence {

using namespace ondine;
using Attrs = std::map<std::string, Attribute>;

namespace {

Tensor iota(std::vector<std::int64_t> dims) {
  Tensor t(DType::Float32, std::move(dims));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i + 1);
  return t;
}

std::vector<float> floats(const Tensor& t) { return t.to_floats(); }

// x:[4,3] -> SplitToSequence(split) -> {SequenceLength, SequenceAt(at), ConcatFromSequence(axis, new_axis)}
Graph split_model(const Tensor* split, Attrs split_attrs, std::int64_t at, Attrs concat_attrs) {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{4, 3});
  std::vector<Value*> ins{x};
  if (split) ins.push_back(g.add_constant("split", *split));
  Value* seq = g.add_node("SplitToSequence", ins, {"seq"}, std::move(split_attrs), "split")->output(0);
  Value* pos = g.add_constant("pos", Tensor::scalar<std::int64_t>(at));
  g.add_output(g.add_node("SequenceLength", {seq}, {"len"}, {}, "len")->output(0));
  g.add_output(g.add_node("SequenceAt", {seq, pos}, {"at"}, {}, "at")->output(0));
  g.add_output(g.add_node("ConcatFromSequence", {seq}, {"cat"}, std::move(concat_attrs), "cat")->output(0));
  infer_shapes(g);
  return g;
}

}  // namespace

TEST_CASE("SplitToSequence: inferred kinds and element shapes", "[sequence]") {
  Graph g = split_model(nullptr, {{"axis", std::int64_t{1}}, {"keepdims", std::int64_t{0}}}, 0,
                        {{"axis", std::int64_t{1}}, {"new_axis", std::int64_t{1}}});
  const Value* seq = g.find_value("seq");
  CHECK(seq->kind() == ValueKind::Sequence);
  CHECK(seq->dtype() == DType::Float32);
  CHECK(seq->shape() == Shape{4});  // keepdims 0: each element is a column without its axis
  CHECK(Graph::value_type_str(seq) == "seq(float32[4])");
  CHECK(g.find_value("len")->is_tensor());
  CHECK(g.find_value("len")->dtype() == DType::Int64);
  CHECK(g.find_value("at")->shape() == Shape{4});
  CHECK(g.find_value("cat")->shape().rank() == 2);  // the stacked axis is known only at run time
}

TEST_CASE("SplitToSequence then SequenceAt and ConcatFromSequence round-trip", "[sequence]") {
  const Tensor x = iota({4, 3});
  SECTION("pieces of one, keepdims 0, stacked back on axis 1") {
    Graph g = split_model(nullptr, {{"axis", std::int64_t{1}}, {"keepdims", std::int64_t{0}}}, -1,
                          {{"axis", std::int64_t{1}}, {"new_axis", std::int64_t{1}}});
    auto out = ReferenceExecutor(g).run({{"x", x}});
    CHECK(out.at("len").at_int(0) == 3);
    CHECK(floats(out.at("at")) == std::vector<float>{3, 6, 9, 12});  // the last column
    CHECK(out.at("cat").dims() == std::vector<std::int64_t>{4, 3});
    CHECK(floats(out.at("cat")) == floats(x));
  }
  SECTION("a scalar split: pieces of 3 and a last one of 1, concatenated on axis 0") {
    Tensor split = Tensor::scalar<std::int64_t>(3);
    Graph g = split_model(&split, {}, 1, {{"axis", std::int64_t{0}}});
    auto out = ReferenceExecutor(g).run({{"x", x}});
    CHECK(out.at("len").at_int(0) == 2);
    CHECK(out.at("at").dims() == std::vector<std::int64_t>{1, 3});
    CHECK(floats(out.at("cat")) == floats(x));
  }
  SECTION("split sizes that do not add up name the node") {
    Tensor split = Tensor::from_vector<std::int64_t>({2}, {1, 2});
    Graph g = split_model(&split, {}, 0, {{"axis", std::int64_t{0}}});
    CHECK_THROWS_WITH(ReferenceExecutor(g).run({{"x", x}}), Catch::Contains("split") && Catch::Contains("add up"));
  }
}

TEST_CASE("SequenceEmpty SequenceInsert SequenceErase positions", "[sequence]") {
  Graph g;
  Value* a = g.add_input("a", DType::Int32, Shape{2});
  Value* b = g.add_input("b", DType::Int32, Shape{2});
  Value* p = g.add_input("p", DType::Int64, Shape(std::vector<Dim>{}));
  Value* s0 = g.add_node("SequenceEmpty", {}, {"s0"}, {{"dtype", std::int64_t{6}}}, "empty")->output(0);
  Value* s1 = g.add_node("SequenceInsert", {s0, a}, {"s1"}, {}, "ins_a")->output(0);
  Value* s2 = g.add_node("SequenceInsert", {s1, b, p}, {"s2"}, {}, "ins_b")->output(0);
  Value* s3 = g.add_node("SequenceErase", {s2}, {"s3"}, {}, "erase_last")->output(0);
  Value* zero = g.add_constant("zero", Tensor::scalar<std::int64_t>(0));
  g.add_output(g.add_node("SequenceAt", {s3, zero}, {"first"}, {}, "first")->output(0));
  g.add_output(s2);
  infer_shapes(g);
  CHECK(s0->dtype() == DType::Int32);
  CHECK(s2->kind() == ValueKind::Sequence);
  const Tensor ta = Tensor::from_vector<std::int32_t>({2}, {1, 2}), tb = Tensor::from_vector<std::int32_t>({2}, {3, 4});
  ReferenceExecutor exec(g);
  // b inserted at the front (position 0): erasing the last element leaves b first.
  auto out = exec.run({{"a", ta}, {"b", tb}, {"p", Tensor::scalar<std::int64_t>(0)}});
  REQUIRE(out.at("s2").is_sequence());
  REQUIRE(out.at("s2").items().size() == 2);
  CHECK(out.at("first").to_int64s() == std::vector<std::int64_t>{3, 4});
  // At the end (position 1 == size): erase drops b again.
  out = exec.run({{"a", ta}, {"b", tb}, {"p", Tensor::scalar<std::int64_t>(1)}});
  CHECK(out.at("first").to_int64s() == std::vector<std::int64_t>{1, 2});
  CHECK_THROWS_WITH(exec.run({{"a", ta}, {"b", tb}, {"p", Tensor::scalar<std::int64_t>(2)}}),
                    Catch::Contains("ins_b") && Catch::Contains("out of range"));
}

TEST_CASE("Optional OptionalHasElement OptionalGetElement with and without a value", "[sequence]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{2});
  x->set_kind(ValueKind::OptionalTensor);
  g.add_output(g.add_node("OptionalHasElement", {x}, {"has"}, {}, "has")->output(0));
  Value* wrapped = g.add_node("Optional", {g.add_constant("c", iota({2}))}, {"opt"}, {}, "wrap")->output(0);
  g.add_output(g.add_node("OptionalGetElement", {wrapped}, {"got"}, {}, "get")->output(0));
  infer_shapes(g);
  CHECK(wrapped->kind() == ValueKind::OptionalTensor);
  CHECK(g.find_value("got")->is_tensor());
  ReferenceExecutor exec(g);
  CHECK(exec.run({{"x", iota({2})}}).at("has").data<bool>()[0]);
  auto out = exec.run({{"x", Tensor::none()}});
  CHECK_FALSE(out.at("has").data<bool>()[0]);
  CHECK(floats(out.at("got")) == std::vector<float>{1, 2});
  // A sequence given for an optional tensor is refused before anything runs.
  CHECK_THROWS_WITH(exec.run({{"x", Tensor::sequence(DType::Float32, {})}}), Catch::Contains("'x'"));
}

TEST_CASE("SequenceMap: the body per element; a tensor input is passed whole", "[sequence]") {
  auto body = std::make_shared<Graph>();
  body->name = "body";
  Value* e = body->add_input("e", DType::Float32, Shape::unknown());
  Value* k = body->add_input("k", DType::Float32, Shape::unknown());
  body->add_output(body->add_node("Add", {e, k}, {"sum"}, {}, "add")->output(0));
  Graph g;
  Value* a = g.add_input("a", DType::Float32, Shape{2});
  Value* b = g.add_input("b", DType::Float32, Shape{3});
  Value* ten = g.add_constant("ten", Tensor::scalar<float>(10));
  Value* seq = g.add_node("SequenceConstruct", {a, b}, {"seq"}, {}, "make")->output(0);
  Value* mapped = g.add_node("SequenceMap", {seq, ten}, {"mapped"}, {{"body", GraphAttr(body)}}, "map")->output(0);
  g.add_output(g.add_node("ConcatFromSequence", {mapped}, {"cat"}, {{"axis", std::int64_t{0}}}, "cat")->output(0));
  infer_shapes(g);
  CHECK(Graph::value_type_str(mapped) == "seq(float32[?])");
  const Tensor ta = Tensor::from_vector<float>({2}, {1, 2}), tb = Tensor::from_vector<float>({3}, {3, 4, 5});
  auto out = ReferenceExecutor(g).run({{"a", ta}, {"b", tb}});
  CHECK(floats(out.at("cat")) == std::vector<float>{11, 12, 13, 14, 15});
  // Compiled: the sequence part runs on reference kernels after the compiled part.
  auto compiled = lower::compile(g.clone()).run({{"a", ta}, {"b", tb}});
  CHECK(floats(compiled.at("cat")) == std::vector<float>{11, 12, 13, 14, 15});
}

TEST_CASE("A model with sequences inside compiles and equals the reference executor", "[sequence]") {
  Graph g = split_model(nullptr, {{"axis", std::int64_t{0}}}, 2, {{"axis", std::int64_t{1}}, {"new_axis", std::int64_t{1}}});
  const Tensor x = iota({4, 3});
  auto want = ReferenceExecutor(g).run({{"x", x}});
  CompiledModel m = lower::compile(g.clone());
  auto got = m.run({{"x", x}});
  for (const char* name : {"len", "at", "cat"}) {
    INFO(name);
    CHECK(got.at(name).dims() == want.at(name).dims());
    CHECK(floats(got.at(name)) == floats(want.at(name)));
  }
}

TEST_CASE("An artifact keeps the kinds of sequence and optional values", "[sequence]") {
  Graph g = split_model(nullptr, {{"axis", std::int64_t{0}}}, 0, {{"axis", std::int64_t{0}}});
  g.add_output(g.add_node("Optional", {g.find_value("seq")}, {"opt"}, {}, "wrap")->output(0));
  infer_shapes(g);
  const std::string path = std::string(ONDINE_TEST_TMP_DIR) + "/sequence_kinds.ondine";
  artifact::write(g, {}, path);
  Graph back = artifact::read(path).graph;
  CHECK(back.find_value("seq")->kind() == ValueKind::Sequence);
  CHECK(back.find_value("opt")->kind() == ValueKind::OptionalSequence);
  CHECK(back.to_text() == g.to_text());
}

}  // namespace test_reference_sequence
