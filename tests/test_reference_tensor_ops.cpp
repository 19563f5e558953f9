// Data-movement and shape ops: shape/type inference and reference kernels, on small hand-computed cases.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "ondine/ir/shape_inference.hpp"
#include "ondine/reference/executor.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_reference_tensor_ops {

using namespace ondine;
using Ints = std::vector<std::int64_t>;

namespace {

// How a test passes one input to the node under test.
struct In {
  enum Kind { Runtime, Constant, Omitted } kind = Omitted;
  Tensor tensor;
};
In rt(Tensor t) { return {In::Runtime, std::move(t)}; }   // a graph input, known only at run time
In cst(Tensor t) { return {In::Constant, std::move(t)}; }  // an initializer, known to inference
In omitted() { return {}; }

Tensor f32(Ints dims, std::vector<float> v) { return Tensor::from_vector<float>(std::move(dims), v); }
Tensor i64(Ints dims, std::vector<std::int64_t> v) { return Tensor::from_vector<std::int64_t>(std::move(dims), v); }
Tensor i64s(std::vector<std::int64_t> v) {
  auto n = static_cast<std::int64_t>(v.size());
  return i64({n}, v);
}
Tensor iota_f32(Ints dims) {
  Tensor t(DType::Float32, dims);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i);
  return t;
}

std::vector<float> floats(const Tensor& t) { return t.to_floats(); }
std::vector<std::int64_t> ints(const Tensor& t) { return t.to_int64s(); }

// Builds a graph holding one `op` node (named "the_<op>"), runs shape inference and the reference
// executor, checks that the inferred dtype and shape agree with what the kernel produced, and returns
// the outputs.
std::vector<Tensor> run(const std::string& op, const std::vector<In>& ins, std::map<std::string, Attribute> attrs = {},
                        std::size_t num_outputs = 1, int opset = 17) {
  Graph g;
  g.opsets[""] = opset;
  std::vector<Value*> args;
  std::map<std::string, Tensor> feeds;
  for (std::size_t i = 0; i < ins.size(); ++i) {
    const In& in = ins[i];
    if (in.kind == In::Runtime) {
      args.push_back(g.add_input("in" + std::to_string(i), in.tensor.dtype(), in.tensor.shape()));
      feeds["in" + std::to_string(i)] = in.tensor;
    } else if (in.kind == In::Constant) {
      args.push_back(g.add_constant("c" + std::to_string(i), in.tensor));
    } else {
      args.push_back(nullptr);
    }
  }
  std::vector<std::string> names;
  for (std::size_t i = 0; i < num_outputs; ++i) names.push_back("out" + std::to_string(i));
  Node* n = g.add_node(op, args, names, std::move(attrs), "the_" + op);
  for (Value* o : n->outputs()) g.add_output(o);
  infer_shapes(g);
  auto result = ReferenceExecutor(g).run(feeds);
  std::vector<Tensor> outs;
  for (std::size_t i = 0; i < num_outputs; ++i) {
    Value* v = n->output(i);
    const Tensor& t = result.at(v->name());
    INFO(op << " output " << i << ": inferred " << Graph::value_type_str(v) << ", computed "
            << dtype_name(t.dtype()) << dims_str(t.dims()));
    CHECK(v->dtype() == t.dtype());
    if (v->shape().is_static()) {
      CHECK(v->shape().sizes() == t.dims());
    } else if (v->shape().rank_known()) {
      CHECK(v->shape().rank() == t.rank());
      for (std::size_t d = 0; d < t.rank(); ++d)
        if (v->shape()[d].is_static()) CHECK(v->shape()[d].value == t.dims()[d]);
    }
    outs.push_back(t);
  }
  return outs;
}
Tensor run1(const std::string& op, const std::vector<In>& ins, std::map<std::string, Attribute> attrs = {},
            int opset = 17) {
  return run(op, ins, std::move(attrs), 1, opset).at(0);
}

// Expects `f` to throw an ondine::Error naming the node "the_<op>" and its op, with `text` in the message.
template <typename F>
void expect_node_error(const std::string& op, const std::string& text, F&& f) {
  try {
    f();
    FAIL("expected an error mentioning '" << text << "'");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.node() == "the_" + op);
    CHECK(e.op() == op);
    CHECK(std::string(e.what()).find(text) != std::string::npos);
  }
}

// Inference only: a graph with inputs of the given (possibly symbolic) shapes feeding one node.
struct InferCase {
  Graph g;
  std::vector<Value*> args;
  Value* input(DType t, Shape s) {
    args.push_back(g.add_input("in" + std::to_string(args.size()), t, std::move(s)));
    return args.back();
  }
  Value* constant(Tensor t) {
    args.push_back(g.add_constant("c" + std::to_string(args.size()), std::move(t)));
    return args.back();
  }
  void none() { args.push_back(nullptr); }
  Node* node(const std::string& op, std::map<std::string, Attribute> attrs = {}, std::size_t outputs = 1) {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < outputs; ++i) names.push_back("out" + std::to_string(i));
    Node* n = g.add_node(op, args, names, std::move(attrs), "the_" + op);
    infer_shapes(g);
    return n;
  }
};
Dim sym(const std::string& s) { return Dim::named(s); }

}  // namespace

// ---- Concat / Split ------------------------------------------------------------------------------

TEST_CASE("Concat joins along an axis, negative axis included", "[tensor_ops]") {
  Tensor a = f32({2, 2}, {1, 2, 3, 4}), b = f32({2, 1}, {5, 6});
  Tensor y = run1("Concat", {rt(a), rt(b)}, {{"axis", std::int64_t(1)}});
  CHECK(y.dims() == Ints{2, 3});
  CHECK(floats(y) == std::vector<float>{1, 2, 5, 3, 4, 6});
  y = run1("Concat", {rt(a), rt(f32({1, 2}, {7, 8}))}, {{"axis", std::int64_t(-2)}});
  CHECK(floats(y) == std::vector<float>{1, 2, 3, 4, 7, 8});
  // bool and empty parts
  Tensor t = Tensor::from_vector<bool>({2}, {true, false}), e(DType::Bool, {0});
  y = run1("Concat", {rt(t), rt(e), rt(t)}, {{"axis", std::int64_t(0)}});
  CHECK(ints(y) == Ints{1, 0, 1, 0});
}

TEST_CASE("Concat rejects mismatched non-axis dims and a bad axis", "[tensor_ops]") {
  expect_node_error("Concat", "differ", [] {
    run1("Concat", {rt(f32({2, 2}, {1, 2, 3, 4})), rt(f32({3, 1}, {1, 2, 3}))}, {{"axis", std::int64_t(1)}});
  });
  expect_node_error("Concat", "out of range", [] {
    run1("Concat", {rt(f32({2}, {1, 2})), rt(f32({1}, {3}))}, {{"axis", std::int64_t(1)}});
  });
}

TEST_CASE("Split follows the opset: attribute, input, num_outputs", "[tensor_ops]") {
  Tensor x = iota_f32({6});
  // opset 11: split attribute
  auto o = run("Split", {rt(x)}, {{"split", Ints{2, 4}}}, 2, 11);
  CHECK(floats(o[0]) == std::vector<float>{0, 1});
  CHECK(floats(o[1]) == std::vector<float>{2, 3, 4, 5});
  // opset 13: split input
  o = run("Split", {rt(x), cst(i64s({1, 5}))}, {}, 2, 13);
  CHECK(floats(o[0]) == std::vector<float>{0});
  CHECK(floats(o[1]) == std::vector<float>{1, 2, 3, 4, 5});
  // equal parts, 2-D along axis 1
  o = run("Split", {rt(iota_f32({2, 4}))}, {{"axis", std::int64_t(1)}}, 2, 13);
  CHECK(floats(o[0]) == std::vector<float>{0, 1, 4, 5});
  CHECK(floats(o[1]) == std::vector<float>{2, 3, 6, 7});
  // opset 18: num_outputs, the last part smaller
  o = run("Split", {rt(iota_f32({7}))}, {{"num_outputs", std::int64_t(3)}}, 3, 18);
  CHECK(o[0].dims() == Ints{3});
  CHECK(o[1].dims() == Ints{3});
  CHECK(floats(o[2]) == std::vector<float>{6});
  // zero-size parts
  o = run("Split", {rt(x), cst(i64s({0, 6}))}, {}, 2, 13);
  CHECK(o[0].dims() == Ints{0});
  expect_node_error("Split", "equal parts", [] { run("Split", {rt(iota_f32({7}))}, {}, 2, 13); });
  expect_node_error("Split", "add up to", [&] { run("Split", {rt(x), cst(i64s({2, 2}))}, {}, 2, 13); });
}

// ---- Slice --------------------------------------------------------------------------------------

TEST_CASE("Slice with negative steps", "[tensor_ops]") {
  Tensor x = iota_f32({10});
  Tensor y = run1("Slice", {rt(x), cst(i64s({8})), cst(i64s({1})), cst(i64s({0})), cst(i64s({-3}))});
  CHECK(floats(y) == std::vector<float>{8, 5, 2});
  // reverse everything: start past the end clamps to dim-1, INT64_MIN end clamps to -1
  y = run1("Slice", {rt(x), cst(i64s({-1})), cst(i64s({std::numeric_limits<std::int64_t>::min()})), omitted(),
                     cst(i64s({-1}))});
  CHECK(floats(y) == std::vector<float>{9, 8, 7, 6, 5, 4, 3, 2, 1, 0});
  y = run1("Slice", {rt(x), cst(i64s({20})), cst(i64s({-20})), cst(i64s({0})), cst(i64s({-4}))});
  CHECK(floats(y) == std::vector<float>{9, 5, 1});
  // 2-D: reverse the rows, every other column
  y = run1("Slice", {rt(iota_f32({2, 4})), cst(i64s({-1, 0})), cst(i64s({-3, 4})), cst(i64s({0, 1})),
                     cst(i64s({-1, 2}))});
  CHECK(y.dims() == Ints{2, 2});
  CHECK(floats(y) == std::vector<float>{4, 6, 0, 2});
}

TEST_CASE("Slice clamps out-of-range starts and ends", "[tensor_ops]") {
  Tensor x = iota_f32({5});
  CHECK(floats(run1("Slice", {rt(x), cst(i64s({-100})), cst(i64s({100}))})) == std::vector<float>{0, 1, 2, 3, 4});
  CHECK(run1("Slice", {rt(x), cst(i64s({10})), cst(i64s({100}))}).dims() == Ints{0});
  CHECK(run1("Slice", {rt(x), cst(i64s({3})), cst(i64s({1}))}).dims() == Ints{0});
  CHECK(floats(run1("Slice", {rt(x), cst(i64s({1})), cst(i64s({std::numeric_limits<std::int64_t>::max()}))})) ==
        std::vector<float>{1, 2, 3, 4});
  // start on the last element with a huge positive step: one element
  CHECK(floats(run1("Slice", {rt(x), cst(i64s({4})), cst(i64s({5})), cst(i64s({0})),
                              cst(i64s({std::numeric_limits<std::int64_t>::max()}))})) == std::vector<float>{4});
  // negative axes, int32 parameters
  Tensor y = run1("Slice", {rt(iota_f32({2, 3})), cst(Tensor::from_vector<std::int32_t>({1}, {1})),
                            cst(Tensor::from_vector<std::int32_t>({1}, {3})),
                            cst(Tensor::from_vector<std::int32_t>({1}, {-1}))});
  CHECK(floats(y) == std::vector<float>{1, 2, 4, 5});
}

TEST_CASE("Slice before opset 10 takes attributes", "[tensor_ops]") {
  Tensor y = run1("Slice", {rt(iota_f32({2, 3}))},
                  {{"starts", Ints{1}}, {"ends", Ints{1000}}, {"axes", Ints{1}}}, 9);
  CHECK(y.dims() == Ints{2, 2});
  CHECK(floats(y) == std::vector<float>{1, 2, 4, 5});
  expect_node_error("Slice", "step cannot be 0",
                    [] { run1("Slice", {rt(iota_f32({3})), cst(i64s({0})), cst(i64s({3})), cst(i64s({0})), cst(i64s({0}))}); });
  expect_node_error("Slice", "twice", [] {
    run1("Slice", {rt(iota_f32({3})), cst(i64s({0, 0})), cst(i64s({3, 3})), cst(i64s({0, -1}))});
  });
}

// ---- Gather ------------------------------------------------------------------------------------

TEST_CASE("Gather with negative indices on axis 1", "[tensor_ops]") {
  Tensor data = iota_f32({3, 3});
  Tensor y = run1("Gather", {rt(data), rt(i64({1, 2}, {0, -1}))}, {{"axis", std::int64_t(1)}});
  CHECK(y.dims() == Ints{3, 1, 2});
  CHECK(floats(y) == std::vector<float>{0, 2, 3, 5, 6, 8});
  // scalar index removes the axis; int32 indices; int64 data
  y = run1("Gather", {rt(i64({2, 2}, {1, 2, 3, 4})), rt(Tensor::scalar<std::int32_t>(-1))});
  CHECK(y.dims() == Ints{2});
  CHECK(ints(y) == Ints{3, 4});
}

TEST_CASE("Gather index out of range is an error at run time and at compile time", "[tensor_ops]") {
  expect_node_error("Gather", "out of range", [] { run1("Gather", {rt(iota_f32({3})), rt(i64s({3}))}); });
  expect_node_error("Gather", "out of range", [] { run1("Gather", {rt(iota_f32({3})), rt(i64s({-4}))}); });
  expect_node_error("Gather", "out of range", [] {
    InferCase c;
    c.input(DType::Float32, Shape{3});
    c.constant(i64s({5}));
    c.node("Gather");
  });
}

TEST_CASE("GatherElements", "[tensor_ops]") {
  Tensor data = f32({2, 2}, {1, 2, 3, 4});
  Tensor y = run1("GatherElements", {rt(data), rt(i64({2, 2}, {0, 0, 1, 0}))}, {{"axis", std::int64_t(1)}});
  CHECK(floats(y) == std::vector<float>{1, 1, 4, 3});
  y = run1("GatherElements", {rt(data), rt(i64({1, 2}, {-1, 0}))}, {{"axis", std::int64_t(0)}});
  CHECK(floats(y) == std::vector<float>{3, 2});
  expect_node_error("GatherElements", "out of range",
                    [&] { run1("GatherElements", {rt(data), rt(i64({1, 2}, {2, 0}))}); });
}

// ---- Reshape / Flatten / Transpose / Squeeze / Unsqueeze ----------------------------------------

TEST_CASE("Reshape: 0 copies, -1 infers, allowzero keeps zeros", "[tensor_ops]") {
  Tensor x = iota_f32({2, 3, 4});
  CHECK(run1("Reshape", {rt(x), cst(i64s({0, -1}))}).dims() == Ints{2, 12});
  CHECK(run1("Reshape", {rt(x), cst(i64s({-1, 0, 2}))}).dims() == Ints{4, 3, 2});
  CHECK(run1("Reshape", {rt(x), rt(i64s({4, 0, -1}))}).dims() == Ints{4, 3, 2});  // shape known at run time only
  Tensor y = run1("Reshape", {rt(x), cst(i64s({24}))});
  CHECK(floats(y) == floats(x));
  // allowzero: 0 is a real zero
  Tensor empty(DType::Float32, {0, 3});
  CHECK(run1("Reshape", {rt(empty), cst(i64s({3, 0}))}, {{"allowzero", std::int64_t(1)}}).dims() == Ints{3, 0});
  CHECK(run1("Reshape", {rt(empty), cst(i64s({0, 3}))}).dims() == Ints{0, 3});
  // opset < 5: shape attribute
  CHECK(run1("Reshape", {rt(x)}, {{"shape", Ints{6, 4}}}, 4).dims() == Ints{6, 4});
}

TEST_CASE("Reshape errors", "[tensor_ops]") {
  Tensor x = iota_f32({2, 3});
  expect_node_error("Reshape", "more than one -1", [&] { run1("Reshape", {rt(x), cst(i64s({-1, -1}))}); });
  expect_node_error("Reshape", "element counts", [&] { run1("Reshape", {rt(x), cst(i64s({4, 2}))}); });
  expect_node_error("Reshape", "element counts", [&] { run1("Reshape", {rt(x), cst(i64s({4, -1}))}); });
  expect_node_error("Reshape", "element counts", [&] { run1("Reshape", {rt(x), rt(i64s({5, -1}))}); });
  expect_node_error("Reshape", "allowzero",
                    [&] { run1("Reshape", {rt(x), cst(i64s({0, -1}))}, {{"allowzero", std::int64_t(1)}}); });
  expect_node_error("Reshape", "has rank", [&] { run1("Reshape", {rt(x), cst(i64s({1, 1, 0}))}); });
}

TEST_CASE("Flatten at positive, negative and end axes", "[tensor_ops]") {
  Tensor x = iota_f32({2, 3, 4});
  CHECK(run1("Flatten", {rt(x)}).dims() == Ints{2, 12});
  CHECK(run1("Flatten", {rt(x)}, {{"axis", std::int64_t(0)}}).dims() == Ints{1, 24});
  CHECK(run1("Flatten", {rt(x)}, {{"axis", std::int64_t(-1)}}).dims() == Ints{6, 4});
  CHECK(run1("Flatten", {rt(x)}, {{"axis", std::int64_t(3)}}).dims() == Ints{24, 1});
  expect_node_error("Flatten", "out of range", [&] { run1("Flatten", {rt(x)}, {{"axis", std::int64_t(4)}}); });
}

TEST_CASE("Transpose: default reverses, explicit perm, float16 data", "[tensor_ops]") {
  Tensor x = iota_f32({2, 3});
  Tensor y = run1("Transpose", {rt(x)});
  CHECK(y.dims() == Ints{3, 2});
  CHECK(floats(y) == std::vector<float>{0, 3, 1, 4, 2, 5});
  Tensor z = run1("Transpose", {rt(iota_f32({2, 3, 4}))}, {{"perm", Ints{1, 2, 0}}});
  CHECK(z.dims() == Ints{3, 4, 2});
  CHECK(z.to_floats()[1] == 12);  // z[0][0][1] = x[1][0][0]
  Tensor h(DType::Float16, {2, 2});
  for (int i = 0; i < 4; ++i) h.data<float16>()[i] = float16(static_cast<float>(i) + 0.5f);
  Tensor ht = run1("Transpose", {rt(h)});
  CHECK(ht.dtype() == DType::Float16);
  CHECK(floats(ht) == std::vector<float>{0.5f, 2.5f, 1.5f, 3.5f});
  expect_node_error("Transpose", "permutation", [&] { run1("Transpose", {rt(x)}, {{"perm", Ints{0, 0}}}); });
}

TEST_CASE("Squeeze and Unsqueeze follow the opset", "[tensor_ops]") {
  Tensor x = iota_f32({1, 3, 1});
  CHECK(run1("Squeeze", {rt(x)}, {{"axes", Ints{0}}}, 11).dims() == Ints{3, 1});
  CHECK(run1("Squeeze", {rt(x), cst(i64s({-1}))}, {}, 13).dims() == Ints{1, 3});
  CHECK(run1("Squeeze", {rt(x)}, {}, 13).dims() == Ints{3});
  expect_node_error("Squeeze", "not 1", [&] { run1("Squeeze", {rt(x), cst(i64s({1}))}, {}, 13); });

  Tensor v = iota_f32({3});
  CHECK(run1("Unsqueeze", {rt(v)}, {{"axes", Ints{0, 2}}}, 11).dims() == Ints{1, 3, 1});
  CHECK(run1("Unsqueeze", {rt(v), cst(i64s({-1}))}, {}, 13).dims() == Ints{3, 1});
  CHECK(run1("Unsqueeze", {rt(v), cst(i64s({2, 0}))}, {}, 13).dims() == Ints{1, 3, 1});
  CHECK(run1("Unsqueeze", {rt(Tensor::scalar<float>(1)), rt(i64s({0}))}, {}, 13).dims() == Ints{1});
  expect_node_error("Unsqueeze", "duplicate", [&] { run1("Unsqueeze", {rt(v), cst(i64s({0, 0}))}, {}, 13); });
  expect_node_error("Unsqueeze", "out of range", [&] { run1("Unsqueeze", {rt(v), cst(i64s({3}))}, {}, 13); });
}

// ---- Shape / Size / Identity / Dropout ----------------------------------------------------------

TEST_CASE("Shape with start and end, Size, Identity", "[tensor_ops]") {
  Tensor x = iota_f32({2, 3, 4});
  CHECK(ints(run1("Shape", {rt(x)})) == Ints{2, 3, 4});
  CHECK(ints(run1("Shape", {rt(x)}, {{"start", std::int64_t(1)}}, 15)) == Ints{3, 4});
  CHECK(ints(run1("Shape", {rt(x)}, {{"end", std::int64_t(-1)}}, 15)) == Ints{2, 3});
  CHECK(ints(run1("Shape", {rt(x)}, {{"start", std::int64_t(-10)}, {"end", std::int64_t(10)}}, 15)) == Ints{2, 3, 4});
  CHECK(run1("Shape", {rt(x)}, {{"start", std::int64_t(2)}, {"end", std::int64_t(1)}}, 15).dims() == Ints{0});
  Tensor s = run1("Size", {rt(x)});
  CHECK(s.dims() == Ints{});
  CHECK(ints(s) == Ints{24});
  Tensor b = Tensor::from_vector<bool>({2}, {true, false});
  CHECK(ints(run1("Identity", {rt(b)})) == Ints{1, 0});
}

TEST_CASE("Dropout in inference mode passes the input through", "[tensor_ops]") {
  Tensor x = f32({3}, {1, 2, 3});
  auto o = run("Dropout", {rt(x)}, {}, 2, 13);
  CHECK(floats(o[0]) == floats(x));
  CHECK(o[1].dtype() == DType::Bool);
  CHECK(ints(o[1]) == Ints{1, 1, 1});
  o = run("Dropout", {rt(x), rt(Tensor::scalar<float>(0.3f)), rt(Tensor::scalar<bool>(false))}, {}, 2, 13);
  CHECK(floats(o[0]) == floats(x));
  o = run("Dropout", {rt(x)}, {{"ratio", 0.2f}}, 2, 7);  // opset 7: the mask has the input's type
  CHECK(o[1].dtype() == DType::Float32);
  CHECK(floats(o[1]) == std::vector<float>{1, 1, 1});
  expect_node_error("Dropout", "training_mode", [&] {
    run("Dropout", {rt(x), cst(Tensor::scalar<float>(0.5f)), cst(Tensor::scalar<bool>(true))}, {}, 1, 13);
  });
}

TEST_CASE("Dropout with training_mode true at run time matches the ONNX reference", "[tensor_ops]") {
  // numpy: np.random.seed(0); np.random.uniform(0, 1, 6) = [.549 .715 .603 .545 .424 .646]
  Tensor x = f32({6}, {1, 2, 3, 4, 5, 6});
  auto o = run("Dropout", {rt(x), rt(Tensor::scalar<float>(0.5f)), rt(Tensor::scalar<bool>(true))},
               {{"seed", std::int64_t(0)}}, 2, 13);
  CHECK(ints(o[1]) == Ints{1, 1, 1, 1, 0, 1});
  CHECK(floats(o[0]) == std::vector<float>{2, 4, 6, 8, 0, 12});
}

// ---- Expand / ConstantOfShape / Constant / Range / Tile ------------------------------------------

TEST_CASE("Expand broadcasts both ways", "[tensor_ops]") {
  Tensor x = f32({3, 1}, {1, 2, 3});
  Tensor y = run1("Expand", {rt(x), cst(i64s({2, 1, 4}))});
  CHECK(y.dims() == Ints{2, 3, 4});
  std::vector<float> row{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}, expect = row;
  expect.insert(expect.end(), row.begin(), row.end());
  CHECK(floats(y) == expect);
  CHECK(run1("Expand", {rt(x), rt(i64s({1, 1}))}).dims() == Ints{3, 1});  // shape smaller than the input
  expect_node_error("Expand", "broadcast", [&] { run1("Expand", {rt(x), cst(i64s({2, 4}))}); });
}

TEST_CASE("ConstantOfShape and Constant", "[tensor_ops]") {
  Tensor y = run1("ConstantOfShape", {rt(i64s({2, 2}))});
  CHECK(y.dtype() == DType::Float32);
  CHECK(floats(y) == std::vector<float>{0, 0, 0, 0});
  y = run1("ConstantOfShape", {cst(i64s({3}))}, {{"value", Tensor::from_vector<std::int32_t>({1}, {7})}});
  CHECK(y.dtype() == DType::Int32);
  CHECK(ints(y) == Ints{7, 7, 7});
  CHECK(run1("ConstantOfShape", {rt(Tensor(DType::Int64, {0}))}).dims() == Ints{});
  CHECK(ints(run1("Constant", {}, {{"value_ints", Ints{4, 5}}})) == Ints{4, 5});
  CHECK(run1("Constant", {}, {{"value_float", 2.5f}}).dims() == Ints{});
  CHECK(floats(run1("Constant", {}, {{"value", f32({2}, {1, 2})}})) == std::vector<float>{1, 2});
  expect_node_error("Constant", "no value", [] { run1("Constant", {}); });
}

TEST_CASE("Range with positive and negative deltas", "[tensor_ops]") {
  Tensor y = run1("Range", {cst(Tensor::scalar<float>(1)), cst(Tensor::scalar<float>(5)), cst(Tensor::scalar<float>(1.5f))});
  CHECK(floats(y) == std::vector<float>{1, 2.5f, 4});
  y = run1("Range", {rt(Tensor::scalar<std::int32_t>(10)), rt(Tensor::scalar<std::int32_t>(4)),
                     rt(Tensor::scalar<std::int32_t>(-3))});
  CHECK(y.dtype() == DType::Int32);
  CHECK(ints(y) == Ints{10, 7});
  CHECK(run1("Range", {rt(Tensor::scalar<std::int64_t>(3)), rt(Tensor::scalar<std::int64_t>(1)),
                       rt(Tensor::scalar<std::int64_t>(1))}).dims() == Ints{0});
  expect_node_error("Range", "delta", [] {
    run1("Range", {rt(Tensor::scalar<std::int64_t>(0)), rt(Tensor::scalar<std::int64_t>(1)),
                   rt(Tensor::scalar<std::int64_t>(0))});
  });
}

TEST_CASE("Tile repeats every dim", "[tensor_ops]") {
  Tensor y = run1("Tile", {rt(f32({2, 2}, {1, 2, 3, 4})), cst(i64s({2, 1}))});
  CHECK(y.dims() == Ints{4, 2});
  CHECK(floats(y) == std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4});
  y = run1("Tile", {rt(f32({2}, {1, 2})), rt(i64s({3}))});
  CHECK(floats(y) == std::vector<float>{1, 2, 1, 2, 1, 2});
  expect_node_error("Tile", "one entry per dim", [] { run1("Tile", {rt(f32({2}, {1, 2})), cst(i64s({1, 1}))}); });
}

// ---- Trilu / DepthToSpace / OneHot / Scatter / NonZero / CumSum ---------------------------------

TEST_CASE("Trilu upper and lower with k", "[tensor_ops]") {
  Tensor x = f32({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(floats(run1("Trilu", {rt(x)})) == std::vector<float>{1, 2, 3, 0, 5, 6, 0, 0, 9});
  CHECK(floats(run1("Trilu", {rt(x), cst(Tensor::scalar<std::int64_t>(1))})) ==
        std::vector<float>{0, 2, 3, 0, 0, 6, 0, 0, 0});
  CHECK(floats(run1("Trilu", {rt(x), rt(Tensor::scalar<std::int64_t>(-1))}, {{"upper", std::int64_t(0)}})) ==
        std::vector<float>{0, 0, 0, 4, 0, 0, 7, 8, 0});
}

TEST_CASE("DepthToSpace (DCR, CRD) and SpaceToDepth", "[tensor_ops]") {
  Tensor x = iota_f32({1, 4, 1, 1});
  Tensor dcr = run1("DepthToSpace", {rt(x)}, {{"blocksize", std::int64_t(2)}});
  CHECK(dcr.dims() == Ints{1, 1, 2, 2});
  CHECK(floats(dcr) == std::vector<float>{0, 1, 2, 3});
  Tensor x2 = iota_f32({1, 8, 1, 1});
  Tensor a = run1("DepthToSpace", {rt(x2)}, {{"blocksize", std::int64_t(2)}});
  Tensor b = run1("DepthToSpace", {rt(x2)}, {{"blocksize", std::int64_t(2)}, {"mode", std::string("CRD")}});
  CHECK(floats(a) == std::vector<float>{0, 2, 4, 6, 1, 3, 5, 7});
  CHECK(floats(b) == std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7});
  Tensor img = iota_f32({1, 1, 2, 4});
  Tensor s2d = run1("SpaceToDepth", {rt(img)}, {{"blocksize", std::int64_t(2)}});
  CHECK(s2d.dims() == Ints{1, 4, 1, 2});
  CHECK(floats(s2d) == std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7});
  // SpaceToDepth then DCR DepthToSpace is the identity
  Tensor big = iota_f32({2, 3, 4, 6});
  Tensor back = run1("DepthToSpace",
                     {rt(run1("SpaceToDepth", {rt(big)}, {{"blocksize", std::int64_t(2)}}))},
                     {{"blocksize", std::int64_t(2)}});
  CHECK(floats(back) == floats(big));
}

TEST_CASE("OneHot with negative indices and an axis", "[tensor_ops]") {
  Tensor y = run1("OneHot", {rt(i64s({0, -1, 5})), cst(Tensor::scalar<float>(3)), rt(f32({2}, {0, 1}))});
  CHECK(y.dims() == Ints{3, 3});
  CHECK(floats(y) == std::vector<float>{1, 0, 0, 0, 0, 1, 0, 0, 0});
  y = run1("OneHot", {rt(i64s({1, 0})), rt(Tensor::scalar<std::int64_t>(2)), rt(i64s({-1, 9}))},
           {{"axis", std::int64_t(0)}});
  CHECK(y.dims() == Ints{2, 2});
  CHECK(ints(y) == Ints{-1, 9, 9, -1});
}

TEST_CASE("ScatterElements and ScatterND", "[tensor_ops]") {
  Tensor data = f32({1, 5}, {1, 2, 3, 4, 5});
  Tensor y = run1("ScatterElements", {rt(data), rt(i64({1, 2}, {1, -2})), rt(f32({1, 2}, {10, 20}))},
                  {{"axis", std::int64_t(1)}});
  CHECK(floats(y) == std::vector<float>{1, 10, 3, 20, 5});
  y = run1("ScatterElements", {rt(data), rt(i64({1, 2}, {1, 1})), rt(f32({1, 2}, {10, 20}))},
           {{"axis", std::int64_t(1)}, {"reduction", std::string("add")}});
  CHECK(floats(y) == std::vector<float>{1, 32, 3, 4, 5});
  Tensor nd = run1("ScatterND", {rt(iota_f32({2, 2})), rt(i64({1, 1}, {1})), rt(f32({1, 2}, {7, 8}))});
  CHECK(floats(nd) == std::vector<float>{0, 1, 7, 8});
  nd = run1("ScatterND", {rt(i64({3}, {1, 2, 3})), rt(i64({2, 1}, {0, 0})), rt(i64s({5, 6}))},
            {{"reduction", std::string("mul")}});
  CHECK(ints(nd) == Ints{30, 2, 3});
  expect_node_error("ScatterND", "out of range",
                    [] { run1("ScatterND", {rt(iota_f32({2})), rt(i64({1, 1}, {2})), rt(f32({1}, {1}))}); });
}

TEST_CASE("NonZero and CumSum", "[tensor_ops]") {
  Tensor nz = run1("NonZero", {rt(Tensor::from_vector<bool>({2, 2}, {true, false, true, true}))});
  CHECK(nz.dims() == Ints{2, 3});
  CHECK(ints(nz) == Ints{0, 1, 1, 0, 0, 1});
  Tensor x = f32({4}, {1, 2, 3, 4});
  CHECK(floats(run1("CumSum", {rt(x), cst(Tensor::scalar<std::int32_t>(0))})) == std::vector<float>{1, 3, 6, 10});
  CHECK(floats(run1("CumSum", {rt(x), rt(Tensor::scalar<std::int64_t>(-1))},
                    {{"exclusive", std::int64_t(1)}, {"reverse", std::int64_t(1)}})) ==
        std::vector<float>{9, 7, 4, 0});
  Tensor m = run1("CumSum", {rt(i64({2, 2}, {1, 2, 3, 4})), rt(Tensor::scalar<std::int64_t>(1))});
  CHECK(ints(m) == Ints{1, 3, 3, 7});
}

TEST_CASE("TopK: the k first of a stable order (ties by index, NaN above numbers), any axis, both directions",
          "[tensor_ops][topk]") {
  // x [6, 40]: values on a coarse grid (many ties) with a few NaN; checked against a full stable sort.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v(240);
  std::uint32_t state = 12345;
  for (float& e : v) {
    state = state * 1664525u + 1013904223u;
    e = static_cast<float>((state >> 8) % 9) - 4.0f;
    if ((state >> 4) % 23 == 0) e = nan;
  }
  Tensor x = f32({6, 40}, v);
  for (std::int64_t axis : {0, 1})
    for (std::int64_t largest : {0, 1})
      for (std::int64_t k : {0, 1, 5, 6}) {
        INFO("axis " << axis << " largest " << largest << " k " << k);
        const std::int64_t len = axis == 0 ? 6 : 40, lines = axis == 0 ? 40 : 6;
        auto out = run("TopK", {rt(x), rt(i64s({k}))}, {{"axis", axis}, {"largest", largest}}, 2);
        for (std::int64_t line = 0; line < lines; ++line) {
          auto at = [&](std::int64_t j) { return axis == 0 ? j * 40 + line : line * 40 + j; };
          std::vector<std::int64_t> order(static_cast<std::size_t>(len));
          for (std::int64_t j = 0; j < len; ++j) order[static_cast<std::size_t>(j)] = j;
          auto rank = [&](std::int64_t j) {  // NaN highest
            const float e = v[static_cast<std::size_t>(at(j))];
            return std::isnan(e) ? 1e9 : static_cast<double>(e);
          };
          std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
            return largest ? rank(a) > rank(b) : rank(a) < rank(b);
          });
          for (std::int64_t j = 0; j < k; ++j) {
            const std::int64_t dst = axis == 0 ? j * 40 + line : line * k + j;
            const std::int64_t want = order[static_cast<std::size_t>(j)];
            CHECK(out[1].data<std::int64_t>()[dst] == want);
            const float got = out[0].data<float>()[dst], expected = v[static_cast<std::size_t>(at(want))];
            CHECK((std::isnan(got) ? std::isnan(expected) : got == expected));
          }
        }
      }
}

TEST_CASE("NonZero of rank 1 and 3, GatherND of single elements", "[tensor_ops]") {
  Tensor flat = run1("NonZero", {rt(f32({6}, {0, 2, 0, -1, 0, 3}))});
  CHECK(flat.dims() == Ints{1, 3});
  CHECK(ints(flat) == Ints{1, 3, 5});
  Tensor cube = run1("NonZero", {rt(i64({2, 2, 2}, {0, 1, 0, 0, 0, 0, 1, 1}))});
  CHECK(cube.dims() == Ints{3, 3});
  CHECK(ints(cube) == Ints{0, 1, 1, 0, 1, 1, 1, 0, 1});
  CHECK(run1("NonZero", {rt(f32({3}, {0, 0, 0}))}).dims() == Ints{1, 0});
  Tensor picked = run1("GatherND", {rt(f32({5}, {10, 11, 12, 13, 14})),
                                    rt(i64({3, 1}, {4, -5, 2}))});
  CHECK(floats(picked) == std::vector<float>{14, 10, 12});
}

TEST_CASE("EyeLike and ReverseSequence", "[tensor_ops]") {
  // EyeLike reads only the input's shape; diagonal k = 1 sits above the main one.
  Tensor e = run1("EyeLike", {rt(iota_f32({3, 4}))}, {{"k", std::int64_t(1)}}, 9);
  CHECK(floats(e) == std::vector<float>{0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1});
  Tensor ei = run1("EyeLike", {rt(iota_f32({3, 2}))}, {{"k", std::int64_t(-1)}, {"dtype", std::int64_t(7)}}, 9);
  REQUIRE(ei.dtype() == DType::Int64);
  CHECK(ints(ei) == Ints{0, 0, 1, 0, 0, 1});
  CHECK(ints(run1("EyeLike", {rt(i64({2, 2}, {7, 7, 7, 7}))}, {{"k", std::int64_t(5)}}, 9)) == Ints{0, 0, 0, 0});
  InferCase ic;
  ic.input(DType::Int32, Shape{sym("n"), 4});
  Node* n = ic.node("EyeLike", {{"dtype", std::int64_t(9)}});
  CHECK(n->output(0)->dtype() == DType::Bool);
  CHECK(n->output(0)->shape() == Shape{sym("n"), 4});
  expect_node_error("EyeLike", "2-D", [] { run1("EyeLike", {rt(iota_f32({4}))}, {}, 9); });

  // ReverseSequence: x [time 3, batch 2]; batch 0 reverses its first 3 steps, batch 1 its first 2.
  Tensor x = f32({3, 2}, {0, 10, 1, 11, 2, 12});
  CHECK(floats(run1("ReverseSequence", {rt(x), rt(i64s({3, 2}))}, {}, 10)) == std::vector<float>{2, 11, 1, 10, 0, 12});
  // batch_axis 0, time_axis 1: x [batch 2, time 3] with inner slices of 2.
  Tensor xb = iota_f32({2, 3, 2});
  CHECK(floats(run1("ReverseSequence", {rt(xb), rt(i64s({1, 3}))},
                    {{"batch_axis", std::int64_t(0)}, {"time_axis", std::int64_t(1)}}, 10)) ==
        std::vector<float>{0, 1, 2, 3, 4, 5, 10, 11, 8, 9, 6, 7});
  expect_node_error("ReverseSequence", "outside [0, 3]", [&] { run1("ReverseSequence", {rt(x), rt(i64s({4, 1}))}, {}, 10); });
  expect_node_error("ReverseSequence", "batch size", [&] { run1("ReverseSequence", {rt(x), rt(i64s({1, 1, 1}))}, {}, 10); });
  expect_node_error("ReverseSequence", "0 and 1", [&] {
    run1("ReverseSequence", {rt(x), rt(i64s({1, 1}))}, {{"batch_axis", std::int64_t(1)}, {"time_axis", std::int64_t(1)}}, 10);
  });
}

TEST_CASE("data-dependent ops: indices and counts from data out of range are errors naming the node",
          "[tensor_ops][errors]") {
  // What a detector or a tagger computes at run time and then indexes with: never a crash, never a
  // read outside the tensor.
  expect_node_error("GatherND", "out of range",
                    [] { run1("GatherND", {rt(iota_f32({2, 3})), rt(i64({1, 2}, {1, 3}))}); });
  expect_node_error("GatherND", "out of range",
                    [] { run1("GatherND", {rt(iota_f32({2, 3})), rt(i64({1, 2}, {-3, 0}))}); });
  expect_node_error("TopK", "k", [] { run("TopK", {rt(iota_f32({4})), rt(i64s({5}))}, {}, 2); });
  expect_node_error("TopK", "k", [] { run("TopK", {rt(iota_f32({4})), rt(i64s({-1}))}, {}, 2); });
  expect_node_error("ScatterElements", "out of range", [] {
    run1("ScatterElements", {rt(iota_f32({2, 2})), rt(i64({1, 1}, {2})), rt(f32({1, 1}, {9}))});
  });
  expect_node_error("Range", "", [] {
    run1("Range", {rt(Tensor::scalar<float>(0)), rt(Tensor::scalar<float>(1e30f)), rt(Tensor::scalar<float>(1e-30f))});
  });
}

TEST_CASE("hostile parameters give errors, not overflows", "[tensor_ops]") {
  constexpr std::int64_t big = std::int64_t(1) << 40;
  // negative step on an empty axis
  CHECK(run1("Slice", {rt(Tensor(DType::Float32, {0})), cst(i64s({-1})), cst(i64s({-100})), cst(i64s({0})),
                       cst(i64s({-1}))}).dims() == Ints{0});
  expect_node_error("Tile", "too large", [&] { run1("Tile", {rt(f32({2}, {1, 2})), rt(i64s({std::numeric_limits<std::int64_t>::max() / 2}))}); });
  expect_node_error("ConstantOfShape", "too large", [&] { run1("ConstantOfShape", {rt(i64s({big, big}))}); });
  expect_node_error("ConstantOfShape", "negative", [&] { run1("ConstantOfShape", {rt(i64s({2, -1}))}); });
  expect_node_error("Reshape", "too large", [&] { run1("Reshape", {rt(iota_f32({4})), cst(i64s({big, big, -1}))}); });
  expect_node_error("OneHot", "depth", [] {
    run1("OneHot", {rt(i64s({0})), rt(Tensor::scalar<float>(std::numeric_limits<float>::quiet_NaN())),
                    rt(f32({2}, {0, 1}))});
  });
  // int64 Range across the whole type: values computed without signed overflow
  constexpr auto lo = std::numeric_limits<std::int64_t>::min(), hi = std::numeric_limits<std::int64_t>::max();
  Tensor r = run1("Range", {rt(Tensor::scalar<std::int64_t>(lo)), rt(Tensor::scalar<std::int64_t>(hi)),
                            rt(Tensor::scalar<std::int64_t>(std::int64_t(1) << 62))});
  CHECK(ints(r) == Ints{lo, lo + (std::int64_t(1) << 62), 0, std::int64_t(1) << 62});
  expect_node_error("Trilu", "integer", [] { run1("Trilu", {rt(iota_f32({2, 2})), rt(Tensor::scalar<float>(1))}); });
}

TEST_CASE("string tensors are rejected", "[tensor_ops]") {
  expect_node_error("Identity", "string", [] {
    InferCase c;
    c.input(DType::String, Shape{2});
    c.node("Identity");
  });
}

// ---- inference with symbolic dims ------------------------------------------------------------

TEST_CASE("Reshape keeps symbolic dims", "[tensor_ops][infer]") {
  {
    InferCase c;
    c.input(DType::Float32, Shape{sym("batch"), 197, 768});
    c.constant(i64s({0, 0, 12, 64}));
    CHECK(c.node("Reshape")->output(0)->shape() == (Shape{sym("batch"), 197, 12, 64}));
  }
  {
    InferCase c;
    c.input(DType::Float32, Shape{sym("batch"), 197, 768});
    c.constant(i64s({0, -1, 64}));
    CHECK(c.node("Reshape")->output(0)->shape() == (Shape{sym("batch"), 2364, 64}));
  }
  {
    InferCase c;  // -1 absorbs the symbol
    c.input(DType::Float32, Shape{sym("batch"), 3, 4});
    c.constant(i64s({-1, 12}));
    CHECK(c.node("Reshape")->output(0)->shape() == (Shape{sym("batch"), 12}));
  }
  {
    InferCase c;  // shape computed at run time with a known length
    c.input(DType::Float32, Shape{sym("batch"), 3, 4});
    c.input(DType::Int64, Shape{3});
    Node* n = c.node("Reshape");
    CHECK(n->output(0)->shape().rank_known());
    CHECK(n->output(0)->shape().rank() == 3);
  }
}

TEST_CASE("Flatten, Transpose, Concat, Gather, Unsqueeze on symbolic shapes", "[tensor_ops][infer]") {
  {
    InferCase c;
    c.input(DType::Float32, Shape{sym("batch"), 2048, 1, 1});
    CHECK(c.node("Flatten")->output(0)->shape() == (Shape{sym("batch"), 2048}));
  }
  {
    InferCase c;
    c.input(DType::Float32, Shape{sym("batch"), sym("seq"), 768});
    CHECK(c.node("Transpose", {{"perm", Ints{1, 0, 2}}})->output(0)->shape() == (Shape{sym("seq"), sym("batch"), 768}));
  }
  {
    InferCase c;
    c.input(DType::Float32, Shape{sym("batch"), 3});
    c.input(DType::Float32, Shape{sym("batch"), 5});
    CHECK(c.node("Concat", {{"axis", std::int64_t(1)}})->output(0)->shape() == (Shape{sym("batch"), 8}));
  }
  {
    InferCase c;
    c.input(DType::Float32, Shape{sym("batch"), 3});
    c.input(DType::Float32, Shape{4, 5});
    expect_node_error("Concat", "differ", [&] { c.node("Concat", {{"axis", std::int64_t(0)}}); });
  }
  {
    InferCase c;
    c.input(DType::Float32, Shape{30000, 768});
    c.input(DType::Int64, Shape{sym("batch"), sym("seq")});
    CHECK(c.node("Gather")->output(0)->shape() == (Shape{sym("batch"), sym("seq"), 768}));
  }
  {
    InferCase c;
    c.input(DType::Float32, Shape{sym("batch"), 5});
    c.constant(i64s({1}));
    CHECK(c.node("Unsqueeze")->output(0)->shape() == (Shape{sym("batch"), 1, 5}));
  }
}

TEST_CASE("partial answers when parameter inputs are not constant", "[tensor_ops][infer]") {
  {
    InferCase c;  // Slice starts unknown, axes known: only axis 1 is unknown
    c.input(DType::Float32, Shape{sym("batch"), 10, 4});
    c.input(DType::Int64, Shape{1});
    c.input(DType::Int64, Shape{1});
    c.constant(i64s({1}));
    CHECK(c.node("Slice")->output(0)->shape() == (Shape{sym("batch"), Dim(), 4}));
  }
  {
    InferCase c;  // Slice of a whole symbolic axis keeps the symbol
    c.input(DType::Float32, Shape{sym("batch"), 10});
    c.constant(i64s({0, 2}));
    c.constant(i64s({std::numeric_limits<std::int64_t>::max(), 4}));
    CHECK(c.node("Slice")->output(0)->shape() == (Shape{sym("batch"), 2}));
  }
  {
    InferCase c;  // Expand with an unknown shape of length 3
    c.input(DType::Float32, Shape{4, 1});
    c.input(DType::Int64, Shape{3});
    Shape s = c.node("Expand")->output(0)->shape();
    REQUIRE(s.rank() == 3);
    CHECK(s[1] == Dim(4));
    CHECK_FALSE(s[2].is_static());
  }
  {
    InferCase c;
    c.input(DType::Int64, Shape{2});
    Node* n = c.node("ConstantOfShape", {{"value", Tensor::from_vector<std::int64_t>({1}, {1})}});
    CHECK(n->output(0)->dtype() == DType::Int64);
    CHECK(n->output(0)->shape().rank() == 2);
  }
  {
    InferCase c;
    c.input(DType::Float32, Shape{sym("batch"), 3});
    Node* n = c.node("Shape");
    CHECK(n->output(0)->dtype() == DType::Int64);
    CHECK(n->output(0)->shape() == (Shape{2}));
  }
  {
    InferCase c;
    c.input(DType::Float32, Shape{sym("batch"), 6});
    c.constant(i64s({2, 4}));
    Node* n = c.node("Split", {{"axis", std::int64_t(1)}}, 2);
    CHECK(n->output(0)->shape() == (Shape{sym("batch"), 2}));
    CHECK(n->output(1)->shape() == (Shape{sym("batch"), 4}));
  }
  {
    InferCase c;
    c.input(DType::Float32, Shape::unknown());
    c.constant(i64s({-1}));
    CHECK(c.node("Reshape")->output(0)->shape() == (Shape{Dim()}));
  }
}

}  // namespace test_reference_tensor_ops
