// Tests of the layout passes: cancel-transposes and layout (AssignLayouts, ondine.Reorder).
// - structure: Transpose counts and perms after cancel-transposes; Reorder counts, positions and
//   value layouts after layout in each mode;
// - numbers: the graph before and after a pass gives the same outputs on the reference executor
//   (exactly: both passes only move data), and the compiled model of the rewritten graph agrees with
//   the reference within 1e-4 of max |reference|;
// - must-not-fire: Transposes that do not meet, a Transpose of a constant, an interface a rewrite
//   would rename, graphs where no layout differs.
// Inputs and outputs are checked to be non-trivial so no test passes vacuously.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "ondine/lower/lower.hpp"
#include "ondine/passes/cancel_transposes.hpp"
#include "ondine/passes/layout.hpp"
#include "ondine/passes/pipeline.hpp"
#include "ondine/reference/executor.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_passes_layout {

using namespace ondine;
using Dims = std::vector<std::int64_t>;

namespace {

Tensor random_tensor(const Dims& dims, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  return test::uniform_tensor(dims, seed, lo, hi);
}

// test::GraphBuilder whose ops may be named (the layout tests look nodes up by name).
struct Builder : test::GraphBuilder {
  Value* op(const std::string& type, const std::vector<Value*>& inputs, std::map<std::string, Attribute> attrs = {},
            const std::string& name = "") {
    std::string n = name.empty() ? g.unique_name(type) : name;
    return g.add_node(type, inputs, {n}, std::move(attrs), n)->output(0);
  }
  Value* transpose(Value* x, std::vector<std::int64_t> perm, const std::string& name = "") {
    return op("Transpose", {x}, {{"perm", perm}}, name);
  }
  // 3x3 conv, pad 1 (or 1x1), `out` channels.
  Value* conv(Value* x, std::int64_t in, std::int64_t out, std::int64_t k, const std::string& name) {
    std::int64_t pad = k / 2;
    return op("Conv", {x, weight({out, in, k, k}), weight({out}, 0.1f)},
              {{"kernel_shape", std::vector<std::int64_t>{k, k}}, {"pads", std::vector<std::int64_t>{pad, pad, pad, pad}}},
              name);
  }
};

std::map<std::string, Tensor> inputs_for(const Graph& g, unsigned seed = 42) {
  std::map<std::string, Tensor> in;
  for (Value* v : g.inputs()) in[v->name()] = random_tensor(v->shape().sizes(), seed++);
  return in;
}

// max |a - b| over all elements, relative to max |b|; requires equal dims and a non-trivial b.
double rel_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.dims() == b.dims());
  double err = 0, scale = 0;
  for (std::int64_t i = 0; i < b.numel(); ++i) {
    err = std::max(err, std::fabs(a.at_double(i) - b.at_double(i)));
    scale = std::max(scale, std::fabs(b.at_double(i)));
  }
  REQUIRE(scale > 1e-3);  // not vacuous
  return err / scale;
}

void check_same_outputs(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& want,
                        double tolerance) {
  REQUIRE(got.size() == want.size());
  for (auto& [name, t] : want) {
    INFO("output " << name);
    REQUIRE(got.count(name));
    CHECK(rel_diff(got.at(name), t) <= tolerance);
  }
}

bool run_pass(Graph& g, const std::string& pass, const std::string& layout = "") {
  PassManager pm = make_pass_manager(pass);
  pm.options().verify_each = true;
  if (!layout.empty()) pm.context().options["layout"] = layout;
  return pm.run(g);
}

std::vector<std::int64_t> perm_of(const Graph& g) {
  for (Node* n : g.nodes())
    if (n->op_type() == "Transpose") return n->attr_ints("perm");
  return {};
}

std::vector<Node*> reorders(const Graph& g) {
  std::vector<Node*> out;
  for (Node* n : g.nodes())
    if (n->op_key() == "ondine.Reorder") out.push_back(n);
  return out;
}

// The node reading `v` with op `op` (nullptr if none).
Node* reader(const Value* v, const std::string& op) {
  for (const Use& u : v->uses())
    if (u.node->op_type() == op) return u.node;
  return nullptr;
}

CompiledModel compile_as_is(const Graph& g) {
  lower::CompileOptions options;
  options.threads = 1;
  options.passes = "none";
  return lower::compile(g, options);
}

}  // namespace

// ---- cancel-transposes ------------------------------------------------------------------------

TEST_CASE("perm composition: out[i] = in[p1[p2[i]]]", "[cancel-transposes]") {
  // Checked against the reference executor's Transpose: composing, then transposing once, equals
  // transposing twice element for element.
  std::vector<std::int64_t> p1{0, 2, 3, 1}, p2{3, 1, 0, 2};
  CHECK(detail::transposes::compose(p1, p2) == std::vector<std::int64_t>{1, 2, 0, 3});
  Builder b;
  Value* x = b.input("x", {2, 3, 4, 5});
  b.g.add_output(b.transpose(b.transpose(x, p1), p2, "y"));
  infer_shapes(b.g);
  Builder once;
  Value* x1 = once.input("x", {2, 3, 4, 5});
  once.g.add_output(once.transpose(x1, detail::transposes::compose(p1, p2), "y"));
  infer_shapes(once.g);
  CHECK(b.g.find_value("y")->shape() == once.g.find_value("y")->shape());
  CHECK(once.g.find_value("y")->shape().sizes() == Dims{3, 4, 2, 5});  // x dims [p1[p2[i]]]
  auto in = inputs_for(b.g);
  check_same_outputs(ReferenceExecutor(once.g).run(in), ReferenceExecutor(b.g).run(in), 0.0);
}

TEST_CASE("cancel-transposes merges a pair into one Transpose with the composed perm", "[cancel-transposes]") {
  Builder b;
  Value* x = b.input("x", {2, 3, 4, 5});
  Value* r = b.op("Relu", {x});
  b.g.add_output(b.op("Relu", {b.transpose(b.transpose(r, {0, 2, 3, 1}), {3, 1, 0, 2})}, {}, "y"));
  infer_shapes(b.g);
  Graph before = b.g.clone();
  REQUIRE(b.g.count_ops("Transpose") == 2);
  CHECK(run_pass(b.g, "cancel-transposes"));
  CHECK(b.g.count_ops("Transpose") == 1);
  CHECK(perm_of(b.g) == std::vector<std::int64_t>{1, 2, 0, 3});
  auto in = inputs_for(before);
  check_same_outputs(ReferenceExecutor(b.g).run(in), ReferenceExecutor(before).run(in), 0.0);
  CHECK_FALSE(run_pass(b.g, "cancel-transposes"));  // nothing left to do
}

TEST_CASE("cancel-transposes removes pairs and chains that compose to the identity", "[cancel-transposes]") {
  Builder b;
  Value* x = b.input("x", {1, 3, 4, 5});
  Value* r = b.op("Relu", {x});
  // NCHW -> NHWC -> NCHW, then reversed twice (no perm attribute: the axes reversed).
  Value* t = b.transpose(b.transpose(r, {0, 2, 3, 1}), {0, 3, 1, 2});
  Value* rev = b.op("Transpose", {b.op("Transpose", {t})});
  // A chain of three: [1,2,0] three times is the identity.
  Value* c = b.transpose(b.transpose(b.transpose(rev, {1, 2, 0, 3}), {1, 2, 0, 3}), {1, 2, 0, 3});
  b.g.add_output(b.op("Sigmoid", {c}, {}, "y"));
  infer_shapes(b.g);
  Graph before = b.g.clone();
  REQUIRE(b.g.count_ops("Transpose") == 7);
  CHECK(run_pass(b.g, "cancel-transposes"));
  CHECK(b.g.count_ops("Transpose") == 0);
  CHECK(reader(b.g.find_value(r->name()), "Sigmoid") != nullptr);  // Sigmoid reads Relu directly
  auto in = inputs_for(before);
  check_same_outputs(ReferenceExecutor(b.g).run(in), ReferenceExecutor(before).run(in), 0.0);
}

TEST_CASE("an identity Transpose that is a graph output hands over the output name", "[cancel-transposes]") {
  Builder b;
  Value* x = b.input("x", {2, 3});
  b.g.add_output(b.transpose(b.op("Relu", {x}), {0, 1}, "y"));
  infer_shapes(b.g);
  Graph before = b.g.clone();
  CHECK(run_pass(b.g, "cancel-transposes"));
  CHECK(b.g.count_ops("Transpose") == 0);
  REQUIRE(b.g.outputs().size() == 1);
  CHECK(b.g.outputs()[0]->name() == "y");
  CHECK(b.g.outputs()[0]->producer()->op_type() == "Relu");
  auto in = inputs_for(before);
  check_same_outputs(ReferenceExecutor(b.g).run(in), ReferenceExecutor(before).run(in), 0.0);
}

TEST_CASE("cancel-transposes keeps a first Transpose that has other readers", "[cancel-transposes][must-not-fire]") {
  Builder b;
  Value* x = b.input("x", {1, 3, 4, 5});
  Value* t1 = b.transpose(b.op("Relu", {x}), {0, 2, 3, 1}, "t1");
  b.g.add_output(b.op("Sigmoid", {b.transpose(t1, {0, 3, 1, 2}, "t2")}, {}, "y"));
  b.g.add_output(b.op("Tanh", {t1}, {}, "z"));  // a second reader of t1
  infer_shapes(b.g);
  Graph before = b.g.clone();
  CHECK(run_pass(b.g, "cancel-transposes"));
  REQUIRE(b.g.count_ops("Transpose") == 1);  // t2 cancelled against t1; t1 stays for Tanh
  Value* kept = b.g.find_value("t1");
  REQUIRE(kept);
  REQUIRE(kept->producer());
  CHECK(kept->producer()->op_type() == "Transpose");
  CHECK(kept->uses().size() == 1);
  CHECK(kept->uses()[0].node->op_type() == "Tanh");
  auto in = inputs_for(before);
  check_same_outputs(ReferenceExecutor(b.g).run(in), ReferenceExecutor(before).run(in), 0.0);
}

TEST_CASE("cancel-transposes leaves Transposes that do not meet, constants and the interface alone",
          "[cancel-transposes][must-not-fire]") {
  SECTION("an op between two Transposes") {
    Builder b;
    Value* x = b.input("x", {1, 3, 4, 5});
    b.g.add_output(b.transpose(b.op("Relu", {b.transpose(x, {0, 2, 3, 1})}), {0, 3, 1, 2}, "y"));
    infer_shapes(b.g);
    CHECK_FALSE(run_pass(b.g, "cancel-transposes"));
    CHECK(b.g.count_ops("Transpose") == 2);
  }
  SECTION("a Transpose of a constant (fold-constants' job)") {
    Builder b;
    Value* x = b.input("x", {3, 2});
    Value* w = b.weight({3, 2});
    b.g.add_output(b.op("Add", {x, b.transpose(b.transpose(w, {1, 0}), {1, 0})}, {}, "y"));
    infer_shapes(b.g);
    CHECK_FALSE(run_pass(b.g, "cancel-transposes"));
    CHECK(b.g.count_ops("Transpose") == 2);
  }
  SECTION("an identity Transpose from a graph input to a graph output (both names are the interface)") {
    Builder b;
    Value* x = b.input("x", {2, 3});
    b.g.add_output(b.transpose(x, {0, 1}, "y"));
    infer_shapes(b.g);
    CHECK_FALSE(run_pass(b.g, "cancel-transposes"));
    CHECK(b.g.count_ops("Transpose") == 1);
    CHECK(b.g.inputs()[0]->name() == "x");
    CHECK(b.g.outputs()[0]->name() == "y");
  }
}

// ---- layout -----------------------------------------------------------------------------------

namespace {

// x -> conv1 -> Relu(r1) -> conv2 (c2) -> conv3 (c3) ---------------------> Add -> y
//                                         `-> Erf (e, reference only) -> conv4 -'
// Erf has no oneDNN lowering; e is also a graph output.
Graph conv_net() {
  Builder b;
  Value* x = b.input("x", {1, 3, 8, 8});
  Value* r1 = b.op("Relu", {b.conv(x, 3, 8, 3, "conv1")}, {}, "r1");
  Value* c2 = b.conv(r1, 8, 8, 1, "c2");
  Value* c3 = b.conv(c2, 8, 8, 3, "c3");
  Value* e = b.op("Erf", {c2}, {}, "e");
  Value* c4 = b.conv(e, 8, 8, 3, "c4");
  b.g.add_output(b.op("Add", {c3, c4}, {}, "y"));
  b.g.add_output(e);
  infer_shapes(b.g);
  return std::move(b.g);
}

}  // namespace

TEST_CASE("layout=auto: Blocked between convs, Reorders only at the row-major boundaries", "[layout]") {
  Graph g = conv_net();
  Graph before = g.clone();
  CHECK(run_pass(g, "layout", "auto"));
  // x -> conv1, c2 -> Erf, e -> c4, and the graph output y.
  auto rs = reorders(g);
  CHECK(rs.size() == 4);
  Node* conv1 = reader(g.inputs()[0], "Reorder")->output(0)->uses()[0].node;
  CHECK(conv1->name() == "conv1");
  CHECK(conv1->input(0)->layout() == Layout::Blocked);
  Value* c2 = g.find_value("c2");
  CHECK(c2->layout() == Layout::Blocked);
  CHECK(g.find_value("r1")->layout() == Layout::Blocked);  // Relu inherits conv1's layout
  CHECK(reader(c2, "Conv") != nullptr);                    // c3 reads c2 with no Reorder between
  Node* to_erf = reader(c2, "Reorder");
  REQUIRE(to_erf);
  CHECK(to_erf->output(0)->layout() == Layout::RowMajor);
  CHECK(to_erf->output(0)->uses()[0].node->op_type() == "Erf");
  Value* e = g.find_value("e");
  CHECK(e->layout() == Layout::RowMajor);
  CHECK(e->is_graph_output());
  Node* to_c4 = reader(e, "Reorder");
  REQUIRE(to_c4);
  CHECK(to_c4->output(0)->layout() == Layout::Blocked);
  // y keeps its name: a row-major Reorder of the Add's blocked result.
  Value* y = g.find_value("y");
  REQUIRE(y->is_graph_output());
  CHECK(y->layout() == Layout::RowMajor);
  CHECK(y->producer()->op_key() == "ondine.Reorder");
  CHECK(y->producer()->input(0)->producer()->op_type() == "Add");
  CHECK(y->producer()->input(0)->layout() == Layout::Blocked);
  CHECK(g.to_text().find("@blocked") != std::string::npos);

  auto in = inputs_for(before);
  auto want = ReferenceExecutor(before).run(in);
  check_same_outputs(ReferenceExecutor(g).run(in), want, 0.0);
  check_same_outputs(compile_as_is(g).run(in), want, 1e-4);
  CHECK_FALSE(run_pass(g, "layout", "auto"));  // a second run changes nothing
  CHECK(reorders(g).size() == 4);
}

TEST_CASE("layout=auto: a Resize between convs keeps their layout and Concat gets one layout (FPN)", "[layout]") {
  // An FPN level as torchvision-style detectors export it: conv -> Resize(x2, nearest) -> Add with a finer
  // conv, and both levels concatenated on channels. No Reorder inside: only at the input and the output.
  Builder b;
  Value* x = b.input("x", {1, 4, 16, 16});
  Value* fine = b.conv(x, 4, 8, 3, "fine");
  Value* coarse = b.conv(b.op("MaxPool", {fine}, {{"kernel_shape", Dims{2, 2}}, {"strides", Dims{2, 2}}}), 8, 8, 3, "coarse");
  Value* scales = b.g.add_constant("scales", Tensor::from_vector<float>({4}, {1, 1, 2, 2}));
  Value* up = b.op("Resize", {coarse, nullptr, scales}, {{"mode", std::string("nearest")}}, "up");
  Value* sum = b.op("Add", {fine, up}, {}, "sum");
  Value* cat = b.op("Concat", {sum, up}, {{"axis", std::int64_t{1}}}, "cat");
  b.g.add_output(b.conv(cat, 16, 4, 1, "out"));
  infer_shapes(b.g);
  Graph before = b.g.clone();
  CHECK(run_pass(b.g, "layout", "auto"));
  CHECK(reorders(b.g).size() == 2);  // x in, the output out
  CHECK(b.g.find_value("up")->layout() == Layout::Blocked);
  CHECK(b.g.find_value("cat")->layout() == Layout::Blocked);
  auto in = inputs_for(before);
  auto want = ReferenceExecutor(before).run(in);
  check_same_outputs(ReferenceExecutor(b.g).run(in), want, 0.0);
  CompiledModel m = compile_as_is(b.g);
  INFO(m.to_text());
  check_same_outputs(m.run(in), want, 1e-4);
  for (const StepInfo& s : m.steps()) CHECK_FALSE(s.slow_path());
}

TEST_CASE("layout=nhwc: ChannelsLast image activations, Reorders at the same places", "[layout]") {
  Graph g = conv_net();
  Graph before = g.clone();
  CHECK(run_pass(g, "layout", "nhwc"));
  CHECK(reorders(g).size() == 4);
  for (const char* v : {"r1", "c2"}) CHECK(g.find_value(v)->layout() == Layout::ChannelsLast);
  CHECK(g.find_value("e")->layout() == Layout::RowMajor);
  CHECK(g.find_value("y")->layout() == Layout::RowMajor);
  auto in = inputs_for(before);
  auto want = ReferenceExecutor(before).run(in);
  check_same_outputs(ReferenceExecutor(g).run(in), want, 0.0);
  CompiledModel model = compile_as_is(g);
  check_same_outputs(model.run(in), want, 1e-4);
  // The channels-last values are NHWC in the compiled program ("acdb").
  bool nhwc_conv = false;
  for (auto& s : model.program().steps)
    if (s->name() == "c3") nhwc_conv = s->info().detail.find("src acdb") != std::string::npos;
  CHECK(nhwc_conv);
}

TEST_CASE("layout=plain: RowMajor everywhere, no Reorder", "[layout]") {
  Graph g = conv_net();
  Graph before = g.clone();
  run_pass(g, "layout", "plain");
  CHECK(reorders(g).empty());
  for (Node* n : g.nodes())
    for (Value* v : n->outputs()) CHECK(v->layout() == Layout::RowMajor);
  auto in = inputs_for(before);
  check_same_outputs(compile_as_is(g).run(in), ReferenceExecutor(before).run(in), 1e-4);
}

TEST_CASE("layout: switching modes replaces Reorders instead of stacking them", "[layout]") {
  Graph g = conv_net();
  Graph before = g.clone();
  run_pass(g, "layout", "auto");
  CHECK(run_pass(g, "layout", "nhwc"));
  CHECK(reorders(g).size() == 4);
  for (Node* r : reorders(g)) {
    bool reads_reorder = r->input(0)->producer() && r->input(0)->producer()->op_key() == "ondine.Reorder";
    CHECK_FALSE(reads_reorder);
    CHECK(r->output(0)->layout() != r->input(0)->layout());
  }
  run_pass(g, "layout", "plain");
  CHECK(reorders(g).empty());
  auto in = inputs_for(before);
  check_same_outputs(compile_as_is(g).run(in), ReferenceExecutor(before).run(in), 1e-4);
}

TEST_CASE("layout: Reorder(Reorder(x)) -> x when the layouts match", "[layout]") {
  Builder b;
  Value* x = b.input("x", {1, 4, 3, 3});
  Value* r = b.op("Relu", {x}, {}, "r");
  Node* there = b.g.add_node("Reorder", {r}, {"r.blocked"}, {}, "there", "ondine");
  there->output(0)->set_layout(Layout::Blocked);
  Node* back = b.g.add_node("Reorder", {there->output(0)}, {"r.back"}, {}, "back", "ondine");
  back->output(0)->set_layout(Layout::RowMajor);
  b.g.add_output(b.op("Erf", {back->output(0)}, {}, "y"));
  infer_shapes(b.g);
  Graph before = b.g.clone();
  auto in = inputs_for(before);
  auto want = ReferenceExecutor(before).run(in);  // the Reorder reference kernel: an identity copy
  check_same_outputs(compile_as_is(before).run(in), want, 1e-4);  // and its lowering
  CHECK(run_pass(b.g, "layout"));
  CHECK(reorders(b.g).empty());
  CHECK(b.g.find_value("y")->producer()->input(0) == b.g.find_value("r"));
  check_same_outputs(ReferenceExecutor(b.g).run(in), want, 0.0);
}

TEST_CASE("layout: one Reorder per value and layout, shared by its readers", "[layout]") {
  // A conv read only by row-major ops still runs blocked (a plain NCHW conv is far slower than the
  // reorders around a blocked one): x -> conv, then one row-major copy for both readers.
  Builder b;
  Value* x = b.input("x", {1, 3, 6, 6});
  Value* c = b.conv(x, 3, 4, 3, "c");
  b.g.add_output(b.op("Erf", {c}, {}, "y"));
  b.g.add_output(b.op("Flatten", {c}, {{"axis", std::int64_t{1}}}, "f"));
  infer_shapes(b.g);
  Graph before = b.g.clone();
  run_pass(b.g, "layout");
  CHECK(b.g.find_value("c")->layout() == Layout::Blocked);
  auto rs = reorders(b.g);
  REQUIRE(rs.size() == 2);
  Node* out = reader(b.g.find_value("c"), "Reorder");
  REQUIRE(out);
  CHECK(out->output(0)->uses().size() == 2);  // Erf and Flatten
  auto in = inputs_for(before);
  check_same_outputs(compile_as_is(b.g).run(in), ReferenceExecutor(before).run(in), 1e-4);
}

TEST_CASE("layout: a Reorder is scheduled as soon as its input exists", "[layout]") {
  // conv(x) + r with r a graph input: r's Reorder comes first in the node order, so the lowering knows
  // it when it meets the conv, and the residual Add still folds into the conv as a sum post-op.
  Builder b;
  Value* x = b.input("x", {1, 8, 6, 6});
  Value* r = b.input("r", {1, 8, 6, 6});
  b.g.add_output(b.op("Add", {b.conv(x, 8, 8, 3, "c"), r}, {}, "y"));
  infer_shapes(b.g);
  Graph before = b.g.clone();
  run_pass(b.g, "layout");
  REQUIRE(reorders(b.g).size() == 3);  // x, r, and the output y
  std::vector<Node*> order = b.g.topo_order();
  REQUIRE(order[0]->op_key() == "ondine.Reorder");
  REQUIRE(order[1]->op_key() == "ondine.Reorder");
  auto in = inputs_for(before);
  CompiledModel model = compile_as_is(b.g);
  check_same_outputs(model.run(in), ReferenceExecutor(before).run(in), 1e-4);
  std::size_t adds = 0;
  bool sum = false;
  for (auto& s : model.program().steps) {
    adds += s->op() == "Add";
    if (s->name() == "c") sum = s->info().detail.find("+sum") != std::string::npos;
  }
  CHECK(adds == 0);
  CHECK(sum);
}

TEST_CASE("layout: no Reorder where nothing chooses a layout", "[layout][must-not-fire]") {
  Builder b;
  Value* x = b.input("x", {2, 8});
  Value* h = b.op("Relu", {b.op("MatMul", {x, b.weight({8, 8})})});
  b.g.add_output(b.op("Add", {b.op("Erf", {h}), h}, {}, "y"));
  infer_shapes(b.g);
  run_pass(b.g, "layout", "auto");
  CHECK(reorders(b.g).empty());
  for (Node* n : b.g.nodes()) CHECK(n->output(0)->layout() == Layout::RowMajor);
}

TEST_CASE("layout: an unknown option is an error naming the pass", "[layout][bad-input]") {
  Graph g = conv_net();
  CHECK_THROWS_WITH(run_pass(g, "layout", "nchw16c"),
                    Catch::Contains("layout") && Catch::Contains("nchw16c") && Catch::Contains("auto, nhwc or plain"));
}

TEST_CASE("ondine.Reorder: shape inference and reference kernel are the identity", "[layout]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{Dim::named("n"), 3});
  Node* r = g.add_node("Reorder", {x}, {"y"}, {}, "r", "ondine");
  g.add_output(r->output(0));
  infer_shapes(g);
  CHECK(g.find_value("y")->shape().str() == "[n,3]");
  CHECK(g.find_value("y")->dtype() == DType::Float32);
  Tensor t = random_tensor({2, 3}, 3);
  auto out = ReferenceExecutor(g).run({{"x", t}});
  CHECK(rel_diff(out.at("y"), t) == 0.0);
}

}  // namespace test_passes_layout
