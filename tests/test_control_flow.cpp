// If, Loop and Scan: subgraphs in the IR (captures, implicit inputs, deep clones, export and import),
// their shape inference, reference kernels and compiled runs, fold-constants inlining a branch whose
// condition is known, and bad input (a loop that never ends, branches that disagree, a capture the node
// does not pass in). The PyTorch-scripted corpus model (tests/data/torch/scripted_loop: a while loop and
// If on tensor values, nested) is checked against PyTorch in tests/test_shape_values.cpp's corpus run.
#include <catch2/catch.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ondine/lower/lower.hpp"
#include "ondine/ondine.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_control_flow {

using namespace ondine;
using Catch::Contains;
using Dims = std::vector<std::int64_t>;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<Graph> body_graph(const std::string& name) {
  auto g = std::make_shared<Graph>();
  g->name = name;
  return g;
}

// y = If(c) { Relu(x) } else { Neg(x) }: both branches read the outer x (passed in unless `pass_x` is
// false; with `else_int64`, the else branch returns Cast(Neg(x), int64)).
Node* add_if(Graph& g, Value* c, Value* x, const std::string& name, bool pass_x = true, bool else_int64 = false) {
  auto then_g = body_graph(name + ".then");
  then_g->add_output(then_g->add_op("Relu", {then_g->add_capture(x->name(), x->dtype(), x->shape())}));
  auto else_g = body_graph(name + ".else");
  Value* neg = else_g->add_op("Neg", {else_g->add_capture(x->name(), x->dtype(), x->shape())});
  else_g->add_output(else_int64 ? else_g->add_op("Cast", {neg}, {{"to", std::int64_t{7}}}) : neg);
  Node* n = g.add_node("If", {c}, {name + ".y"}, {{"then_branch", GraphAttr(then_g)}, {"else_branch", GraphAttr(else_g)}},
                       name);
  if (pass_x) n->add_implicit_input(x, x->name());
  return n;
}

// Loop: h <- 0.5 * h + x for `trip` iterations (M a constant, or the input "m"), scanning h each step.
Graph loop_graph(std::int64_t trip, bool trip_is_input) {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{2, 3});
  Value* h0 = g.add_input("h0", DType::Float32, Shape{2, 3});
  Value* m = trip_is_input ? g.add_input("m", DType::Int64, Shape{})
                           : g.add_constant("m", Tensor::scalar<std::int64_t>(trip));
  auto body = body_graph("body");
  body->add_input("iter", DType::Int64, Shape{});
  Value* cond = body->add_input("cond", DType::Bool, Shape{});
  Value* h = body->add_input("h", DType::Float32, Shape{2, 3});
  Value* half = body->add_constant("half", Tensor::scalar<float>(0.5f));
  Value* next = body->add_op("Add", {body->add_op("Mul", {h, half}), body->add_capture("x", DType::Float32, Shape{2, 3})});
  body->add_output(body->add_op("Identity", {cond}));
  body->add_output(next);
  body->add_output(body->add_op("Identity", {next}));
  Node* n = g.add_node("Loop", {m, nullptr, h0}, {"h_final", "h_all"}, {{"body", GraphAttr(body)}}, "loop");
  n->add_implicit_input(x, "x");
  g.add_output(n->output(0));
  g.add_output(n->output(1));
  infer_shapes(g);
  return g;
}

std::size_t steps_of(const CompiledModel& m, const std::string& op) {
  std::size_t k = 0;
  for (auto& s : m.steps()) k += s.op == op;
  return k;
}

}  // namespace

TEST_CASE("control flow: subgraphs capture outer values, clone deeply and survive export", "[control-flow][ir]") {
  Graph g;
  Value* c = g.add_input("c", DType::Bool, Shape{});
  Value* x = g.add_input("x", DType::Float32, Shape{2, 3});
  Node* n = add_if(g, c, x, "if");
  g.add_output(n->output(0));
  infer_shapes(g);
  g.verify();
  CHECK(n->num_formal_inputs() == 1);
  CHECK(x->uses().size() == 1);  // the implicit input is a use: dce and topological order see it
  CHECK(g.find_value("if.y")->shape() == Shape({2, 3}));
  CHECK_THAT(g.to_text(), Contains("capture %x"));

  Graph copy = g.clone();
  Graph& then_copy = copy.find_value("if.y")->producer()->attr_graph("then_branch");
  then_copy.add_output(then_copy.add_op("Abs", {then_copy.outputs()[0]}));
  CHECK(n->attr_graph("then_branch").num_nodes() == 1);  // the original's branch is untouched
  CHECK(then_copy.num_nodes() == 2);

  Graph back = ondine::onnx::load_model_from_memory(ondine::onnx::serialize_model(g).data(),
                                                    ondine::onnx::serialize_model(g).size(), ".", "if.onnx");
  Node* m = back.find_value("if.y")->producer();
  CHECK(m->captured_names() == std::vector<std::string>{"x"});
  CHECK(m->attr_graph("else_branch").num_nodes() == 1);
  for (bool cond : {true, false}) {
    std::map<std::string, Tensor> in{{"c", Tensor::scalar<bool>(cond)}, {"x", test::uniform_tensor({2, 3}, 4)}};
    CHECK(test::rel_error(ReferenceExecutor(back).run(in).at("if.y"), ReferenceExecutor(g).run(in).at("if.y")) == 0);
  }
}

TEST_CASE("control flow: If runs the chosen branch, compiled or not; a known condition inlines it",
          "[control-flow][lower]") {
  Graph g;
  Value* c = g.add_input("c", DType::Bool, Shape{});
  Value* x = g.add_input("x", DType::Float32, Shape{2, 3});
  Node* runtime_if = add_if(g, c, x, "if_runtime");
  Node* constant_if = add_if(g, g.add_constant("yes", Tensor::scalar<bool>(true)), x, "if_constant");
  g.add_output(runtime_if->output(0));
  g.add_output(constant_if->output(0));
  infer_shapes(g);
  Tensor xt = test::uniform_tensor({2, 3}, 5);
  lower::CompileOptions options;
  options.threads = 1;
  CompiledModel m = lower::compile(g, options);
  CHECK(steps_of(m, "If") == 1);  // the constant one became its then branch's Relu
  for (bool cond : {true, false}) {
    INFO("condition " << cond);
    std::map<std::string, Tensor> in{{"c", Tensor::scalar<bool>(cond)}, {"x", xt}};
    auto want = ReferenceExecutor(g).run(in);
    auto got = m.run(in);
    for (std::size_t i = 0; i < 6; ++i) {
      float v = xt.data<float>()[i];
      CHECK(want.at("if_runtime.y").data<float>()[i] == (cond ? std::max(v, 0.0f) : -v));
      CHECK(want.at("if_constant.y").data<float>()[i] == std::max(v, 0.0f));
    }
    for (auto& [name, t] : want) CHECK(test::rel_error(got.at(name), t) == 0);
  }
}

TEST_CASE("control flow: If branches and Loop bodies are compiled once, with the parent", "[control-flow][lower]") {
  // The If's branches and the Loop's body become compiled models of their own (lower/detail/
  // control_flow.hpp): the step says so, the log lists their steps, and one context runs them again.
  Graph g;
  Value* c = g.add_input("c", DType::Bool, Shape{});
  Value* x = g.add_input("x", DType::Float32, Shape{2, 3});
  g.add_output(add_if(g, c, x, "if")->output(0));
  infer_shapes(g);
  std::vector<std::string> log;
  lower::CompileOptions options;
  options.threads = 1;
  options.log = [&log](const std::string& line) { log.push_back(line); };
  CompiledModel m = lower::compile(g, options);
  std::string detail;
  for (auto& s : m.steps())
    if (s.op == "If") {
      CHECK(s.implementation == "compiled subgraphs");
      detail = s.detail;
    }
  CHECK_THAT(detail, Contains("then_branch (1 steps)") && Contains("else_branch (1 steps)"));
  lower::CompileOptions forced = options;
  forced.reference_ops = {"If"};  // forced onto the reference kernel: bodies on the reference executor
  for (auto& s : lower::compile(g, forced).steps())
    if (s.op == "If") CHECK(s.implementation == "reference");
  bool logged = false;
  for (auto& line : log) logged = logged || line.find("subgraph 'then_branch' of If 'if': compiled") != std::string::npos;
  CHECK(logged);
  auto ctx = m.make_context();
  Tensor xt = test::uniform_tensor({2, 3}, 15);
  for (bool cond : {true, false, true}) {
    std::map<std::string, Tensor> in{{"c", Tensor::scalar<bool>(cond)}, {"x", xt}};
    CHECK(test::rel_error(m.run(ctx, in).at("if.y"), ReferenceExecutor(g).run(in).at("if.y")) == 0);
  }

  Graph loop = loop_graph(5, false);
  lower::CompileOptions kept = options;
  kept.passes = "none";  // the default passes unroll a loop of 5 known iterations (unroll-loops)
  CompiledModel lm = lower::compile(loop, kept);
  CHECK(steps_of(lm, "Loop") == 1);
  for (auto& s : lm.steps())
    if (s.op == "Loop") CHECK(s.implementation == "compiled subgraphs");
  CHECK(steps_of(lower::compile(loop, options), "Loop") == 0);
  auto lctx = lm.make_context();
  Tensor h0 = test::uniform_tensor({2, 3}, 16);
  auto want = ReferenceExecutor(loop).run({{"x", xt}, {"h0", h0}});
  for (int k = 0; k < 2; ++k) {
    auto got = lm.run(lctx, {{"x", xt}, {"h0", h0}});
    CHECK(test::rel_error(got.at("h_all"), want.at("h_all")) < 1e-6);
    CHECK(test::rel_error(got.at("h_final"), want.at("h_final")) < 1e-6);
  }
}

TEST_CASE("control flow: Loop carries values and stacks scan outputs", "[control-flow][reference]") {
  Graph g = loop_graph(4, false);
  CHECK(g.find_value("h_all")->shape() == Shape({4, 2, 3}));  // M constant, no condition: 4 steps
  Tensor x = test::uniform_tensor({2, 3}, 6), h0 = test::uniform_tensor({2, 3}, 7);
  auto out = ReferenceExecutor(g).run({{"x", x}, {"h0", h0}});
  std::vector<float> h(h0.data<float>(), h0.data<float>() + 6);
  for (int step = 0; step < 4; ++step)
    for (std::size_t i = 0; i < 6; ++i) {
      h[i] = 0.5f * h[i] + x.data<float>()[i];
      CHECK(out.at("h_all").data<float>()[step * 6 + i] == Approx(h[i]));
    }
  for (std::size_t i = 0; i < 6; ++i) CHECK(out.at("h_final").data<float>()[i] == Approx(h[i]));
  lower::CompileOptions options;
  options.threads = 1;
  auto compiled = lower::compile(g, options).run({{"x", x}, {"h0", h0}});
  CHECK(test::rel_error(compiled.at("h_all"), out.at("h_all")) == 0);

  // A trip count known only at run time: the scan output's leading dim is unknown until then.
  Graph dynamic = loop_graph(0, true);
  CHECK_FALSE(dynamic.find_value("h_all")->shape()[0].is_static());
  auto three = ReferenceExecutor(dynamic).run({{"x", x}, {"h0", h0}, {"m", Tensor::scalar<std::int64_t>(3)}});
  CHECK(three.at("h_all").dims() == Dims{3, 2, 3});
  auto none = ReferenceExecutor(dynamic).run({{"x", x}, {"h0", h0}, {"m", Tensor::scalar<std::int64_t>(0)}});
  CHECK(none.at("h_all").dims() == Dims{0, 2, 3});
  CHECK(test::rel_error(none.at("h_final"), h0) == 0);
  // Compiled, it is a staged model's frontier (its scan output's size is data), its body still compiled.
  CompiledModel staged = lower::compile(dynamic, options);
  REQUIRE(staged.continuation());
  CHECK_THAT(staged.continuation()->to_text(), Contains("Loop 'loop' runs 1 of its subgraphs compiled"));
  auto got = staged.run({{"x", x}, {"h0", h0}, {"m", Tensor::scalar<std::int64_t>(3)}});
  CHECK(test::rel_error(got.at("h_all"), three.at("h_all")) < 1e-6);
  CHECK(test::rel_error(got.at("h_final"), three.at("h_final")) < 1e-6);
}

TEST_CASE("control flow: Scan walks its inputs in either direction", "[control-flow][reference]") {
  // A running sum over the rows of x [4, 3], scanned backwards, outputs stacked forwards.
  Graph g;
  Value* s0 = g.add_input("s0", DType::Float32, Shape{3});
  Value* x = g.add_input("x", DType::Float32, Shape{4, 3});
  auto body = body_graph("body");
  Value* s = body->add_input("s", DType::Float32, Shape{3});
  Value* row = body->add_input("row", DType::Float32, Shape{3});
  Value* sum = body->add_op("Add", {s, row});
  body->add_output(sum);
  body->add_output(body->add_op("Identity", {sum}));
  Node* n = g.add_node("Scan", {s0, x}, {"s", "sums"},
                       {{"body", GraphAttr(body)}, {"num_scan_inputs", std::int64_t{1}},
                        {"scan_input_directions", Dims{1}}},
                       "scan");
  g.add_output(n->output(0));
  g.add_output(n->output(1));
  infer_shapes(g);
  CHECK(g.find_value("sums")->shape() == Shape({4, 3}));
  Tensor xt = test::uniform_tensor({4, 3}, 8), s0t = test::uniform_tensor({3}, 9);
  auto out = ReferenceExecutor(g).run({{"s0", s0t}, {"x", xt}});
  std::vector<double> acc(s0t.data<float>(), s0t.data<float>() + 3);
  for (int step = 0; step < 4; ++step)
    for (int j = 0; j < 3; ++j) {
      acc[j] += xt.data<float>()[(3 - step) * 3 + j];  // backwards through the rows
      CHECK(out.at("sums").data<float>()[step * 3 + j] == Approx(acc[j]));
    }
}

TEST_CASE("control flow: bad input names the node", "[control-flow][errors]") {
  SECTION("a loop whose condition never turns false stops at the iteration limit") {
    Graph g = loop_graph(0, false);
    Node* loop = g.find_value("h_final")->producer();
    loop->set_input(0, nullptr);  // no trip count
    loop->set_input(1, g.add_constant("forever", Tensor::scalar<bool>(true)));
    infer_shapes(g);
    std::int64_t before = reference::max_loop_iterations();
    reference::set_max_loop_iterations(50);
    try {
      ReferenceExecutor(g).run({{"x", test::uniform_tensor({2, 3}, 1)}, {"h0", test::uniform_tensor({2, 3}, 2)}});
      FAIL("the loop ended");
    } catch (const Error& e) {
      CHECK(e.node() == "loop");
      CHECK_THAT(std::string(e.what()), Contains("50 iterations"));
    }
    reference::set_max_loop_iterations(before);
  }
  SECTION("branches that return different types") {
    Graph g;
    Node* n = add_if(g, g.add_input("c", DType::Bool, Shape{}), g.add_input("x", DType::Float32, Shape{2}), "mixed",
                     true, /*else_int64=*/true);
    g.add_output(n->output(0));
    try {
      infer_shapes(g);
      FAIL("inferred");
    } catch (const Error& e) {
      CHECK(e.node() == "mixed");
      CHECK_THAT(std::string(e.what()), Contains("int64 in else_branch"));
    }
  }
  SECTION("a capture the node does not pass in") {
    Graph g;
    add_if(g, g.add_input("c", DType::Bool, Shape{}), g.add_input("x", DType::Float32, Shape{2}), "unbound",
           /*pass_x=*/false);
    auto problem = g.check();
    REQUIRE(problem);
    CHECK_THAT(*problem, Contains("'unbound'"));
    CHECK_THAT(*problem, Contains("does not pass in"));
  }
}

TEST_CASE("control flow: passes see into subgraphs (BatchNormalization folds inside a branch)", "[control-flow][passes]") {
  Graph g;
  Value* c = g.add_input("c", DType::Bool, Shape{});
  Value* x = g.add_input("x", DType::Float32, Shape{1, 2, 5, 5});
  auto then_g = body_graph("then");
  Value* cx = then_g->add_capture("x", DType::Float32, Shape{1, 2, 5, 5});
  Value* conv = then_g->add_op("Conv", {cx, then_g->add_constant("w", test::uniform_tensor({3, 2, 3, 3}, 1)),
                                        then_g->add_constant("b", test::uniform_tensor({3}, 2))},
                               {{"pads", Dims{1, 1, 1, 1}}});
  Value* bn = then_g->add_op("BatchNormalization",
                             {conv, then_g->add_constant("scale", test::uniform_tensor({3}, 3, 0.5f, 1.5f)),
                              then_g->add_constant("shift", test::uniform_tensor({3}, 4)),
                              then_g->add_constant("mean", test::uniform_tensor({3}, 5)),
                              then_g->add_constant("var", test::uniform_tensor({3}, 6, 0.5f, 2.0f))});
  then_g->add_output(then_g->add_op("Relu", {bn}));
  auto else_g = body_graph("else");
  Value* ex = else_g->add_capture("x", DType::Float32, Shape{1, 2, 5, 5});
  else_g->add_output(else_g->add_op("Conv", {ex, else_g->add_constant("w2", test::uniform_tensor({3, 2, 1, 1}, 7))}));
  Node* n = g.add_node("If", {c}, {"y"}, {{"then_branch", GraphAttr(then_g)}, {"else_branch", GraphAttr(else_g)}},
                       "branchy");
  n->add_implicit_input(x, "x");
  g.add_output(n->output(0));
  infer_shapes(g);
  Graph optimised = g.clone();
  PassManager pm = make_pass_manager();
  pm.run(optimised);
  Graph& branch = optimised.find_value("y")->producer()->attr_graph("then_branch");
  CHECK(branch.count_ops("BatchNormalization") == 0);
  CHECK(then_g->count_ops("BatchNormalization") == 1);  // the original keeps its own
  // --print-passes' table counts the subgraphs' nodes beside the graph's (4 -> fewer: BN, and Relu fused).
  CHECK_THAT(pm.summary_text(), Contains("subgraphs: 4 -> "));
  // Compiled: the branch's Conv (BN folded, Relu fused) runs on oneDNN inside the If's compiled branch.
  lower::CompileOptions options;
  options.threads = 1;
  CompiledModel m = lower::compile(g, options);
  for (bool cond : {true, false}) {
    std::map<std::string, Tensor> in{{"c", Tensor::scalar<bool>(cond)}, {"x", test::uniform_tensor({1, 2, 5, 5}, 8)}};
    CHECK(test::rel_error(ReferenceExecutor(optimised).run(in).at("y"), ReferenceExecutor(g).run(in).at("y")) < 1e-5);
    CHECK(test::rel_error(m.run(in).at("y"), ReferenceExecutor(g).run(in).at("y")) < 1e-5);
  }
}

TEST_CASE("control flow: the scripted PyTorch model keeps its Loop and nested Ifs", "[control-flow][corpus]") {
  Graph g = ondine::onnx::load_model(
      (fs::path(ONDINE_TEST_DATA_DIR) / "torch" / "scripted_loop" / "model.onnx").string());
  CHECK(g.count_ops("Loop") == 1);
  CHECK(g.count_ops("If") == 2);
  Node* loop = nullptr;
  for (Node* n : g.nodes())
    if (n->op_type() == "Loop") loop = n;
  REQUIRE(loop);
  Graph& body = loop->attr_graph("body");
  CHECK(body.count_ops("If") == 1);  // the early-exit test, nested, reading the body's values
  CHECK(loop->captured_names().size() >= 3);  // the step's weight and bias, the `steps` input
  CHECK(g.find_value("y")->shape().str() == "[batch,4]");

  // Compiled at batch 2: the trip count comes from the `steps` input, but the carried value keeps its
  // shape, so the Loop is one step of the plan, its body (with the nested If) compiled.
  Graph bound = g.clone();
  bind_dims(bound, {{"batch", 2}});
  lower::CompileOptions options;
  options.threads = 1;
  CompiledModel m = lower::compile(std::move(bound), options);
  CHECK_FALSE(m.continuation());
  std::size_t compiled_loops = 0;
  for (auto& s : m.steps()) compiled_loops += s.op == "Loop" && s.implementation == "compiled subgraphs";
  CHECK(compiled_loops == 1);
  fs::path dir = fs::path(ONDINE_TEST_DATA_DIR) / "torch" / "scripted_loop";
  std::map<std::string, Tensor> in{{"x", load_npy((dir / "case0.x.npy").string())},
                                   {"steps", load_npy((dir / "case0.steps.npy").string())}};
  CHECK(test::rel_error(m.run(in).at("y"), load_npy((dir / "case0.out.y.npy").string())) < 1e-5);
}

}  // namespace test_control_flow
