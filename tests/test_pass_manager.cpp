// The pass infrastructure: PassManager (user types, lambdas, pipeline strings, repeats, verify, dumps,
// stop-after, records), PassRegistry, the pattern matcher and the rewrite helpers. The built-in passes
// have their own tests; here they only need to be nameable and to keep the numbers (reference
// executor before and after, 1e-5 relative).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ondine/ir/graph.hpp"
#include "ondine/ir/shape_inference.hpp"
#include "ondine/passes/pattern.hpp"
#include "ondine/passes/pipeline.hpp"
#include "ondine/passes/rewrite.hpp"
#include "ondine/reference/executor.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_pass_manager {

using namespace ondine;

namespace {

Tensor random_tensor(const std::vector<std::int64_t>& dims, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Tensor t(DType::Float32, dims);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// y = Relu(Mul(x, 1)) + w, with an Identity and a dead Neg on the side.
Graph small_graph() {
  Graph g;
  g.name = "small";
  Value* x = g.add_input("x", DType::Float32, Shape{2, 4});
  Value* one = g.add_constant("one", Tensor::scalar<float>(1.0f));
  Value* w = g.add_constant("w", random_tensor({4}, 7));
  Value* m = g.add_node("Mul", {x, one}, {"m"}, {}, "mul")->output(0);
  Value* id = g.add_node("Identity", {m}, {"id"}, {}, "identity")->output(0);
  Value* r = g.add_node("Relu", {id}, {"r"}, {}, "relu")->output(0);
  g.add_node("Neg", {r}, {"unused"}, {}, "dead_neg");
  Value* y = g.add_node("Add", {r, w}, {"y"}, {}, "add")->output(0);
  g.add_output(y);
  infer_shapes(g);
  return g;
}

double max_rel_diff(const Tensor& got, const Tensor& want) {
  REQUIRE(got.dims() == want.dims());
  double scale = 0, err = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    auto k = static_cast<std::size_t>(i);
    scale = std::max(scale, std::abs(want.at_double(k)));
    err = std::max(err, std::abs(got.at_double(k) - want.at_double(k)));
  }
  REQUIRE(scale > 0);  // non-trivial outputs
  return err / scale;
}

// A user's pass: Mul(x, 1) -> x, when the Mul does not broadcast x to a larger shape.
struct FoldMulByOne {
  static constexpr const char* name = "test-fold-mul-by-one";
  bool run(Graph& g, PassContext& ctx) {
    using namespace pattern;
    static const Pattern rule = op("Mul", any("x"), scalar(1.0)).commutative();
    bool changed = false;
    for (Node* n : g.topo_order()) {
      auto m = match(n, rule);
      if (!m) continue;
      Value* x = m->value("x");
      if (x->shape() != n->output(0)->shape() || x->dtype() != n->output(0)->dtype()) continue;
      ctx.rewrite("removed '" + n->name() + "'");  // before erase_if_dead frees n
      rewrite::replace_value(g, n->output(0), x);
      rewrite::erase_if_dead(g, m->matched_nodes());
      changed = true;
    }
    return changed;
  }
};

// Counts its runs and reports a change the first `changes` times: tests repeat semantics.
struct Countdown {
  static constexpr const char* name = "test-countdown";
  int* runs;
  int changes;
  Countdown(int* r, int c) : runs(r), changes(c) {}
  bool run(Graph&, PassContext&) { return ++*runs <= changes; }
};

}  // namespace

// --- PassManager ------------------------------------------------------------------------------------

TEST_CASE("pass manager: user types and lambdas run in order; records and summary", "[passes]") {
  Graph g = small_graph();
  std::vector<std::string> order;
  PassManager pm;
  pm.add<FoldMulByOne>();
  pm.add("note", [&](Graph&, PassContext& ctx) {
    order.push_back(ctx.current_pass());
    return false;
  });
  REQUIRE(pm.size() == 2);
  CHECK(pm.pipeline() == "test-fold-mul-by-one,note");
  std::vector<std::string> log;
  pm.context().log = [&](const std::string& line) { log.push_back(line); };
  CHECK(pm.run(g));
  CHECK(g.count_ops("Mul") == 0);
  CHECK(order == std::vector<std::string>{"note"});
  REQUIRE(log.size() == 1);
  CHECK(log[0] == "test-fold-mul-by-one: removed 'mul'");

  const auto& rec = pm.records();
  REQUIRE(rec.size() == 2);
  CHECK(rec[0].name == "test-fold-mul-by-one");
  CHECK(rec[0].nodes_before == 5);
  CHECK(rec[0].nodes_after == 4);
  CHECK(rec[0].rewrites == 1);
  CHECK(rec[0].changed);
  CHECK(rec[1].name == "note");
  CHECK_FALSE(rec[1].changed);
  CHECK(rec[1].rewrites == 0);

  std::string summary = pm.summary_text();
  CHECK(summary.find("test-fold-mul-by-one") != std::string::npos);
  CHECK(summary.find("5 -> 4") != std::string::npos);
  CHECK(summary.find("total") != std::string::npos);
  // Nothing left to do: a second run changes nothing, and the records are those of the second run.
  CHECK_FALSE(pm.run(g));
  CHECK(pm.records().size() == 2);
}

TEST_CASE("pass manager: a user pass keeps the numbers and the output name", "[passes]") {
  Graph g = small_graph();
  std::map<std::string, Tensor> in{{"x", random_tensor({2, 4}, 1)}};
  auto before = ReferenceExecutor(g).run(in);
  PassManager pm;
  pm.add<FoldMulByOne>();
  pm.run(g);
  REQUIRE(g.count_ops("Mul") == 0);
  REQUIRE(g.outputs()[0]->name() == "y");
  auto after = ReferenceExecutor(g).run(in);
  CHECK(max_rel_diff(after.at("y"), before.at("y")) <= 1e-6);
}

TEST_CASE("pass manager: '*' repeats until no change, bounded by max_iterations", "[passes]") {
  Graph g = small_graph();
  int runs = 0;
  SECTION("stops when the pass reports no change") {
    PassManager pm;
    pm.add_repeated<Countdown>(&runs, 2);
    CHECK(pm.run(g));
    CHECK(runs == 3);  // changed, changed, unchanged
    REQUIRE(pm.records().size() == 3);
    CHECK(pm.records()[2].iteration == 3);
    CHECK(pm.summary_text().find("test-countdown #3") != std::string::npos);
    CHECK(pm.pipeline() == "test-countdown*");
  }
  SECTION("stops at the step limit, with a remark") {
    PassManager::Options opts;
    opts.max_iterations = 4;
    PassManager pm(opts);
    pm.add_repeated<Countdown>(&runs, 1000);
    std::vector<std::string> log;
    pm.context().log = [&](const std::string& line) { log.push_back(line); };
    pm.run(g);
    CHECK(runs == 4);
    REQUIRE(log.size() == 1);
    CHECK(log[0].find("max_iterations") != std::string::npos);
  }
  SECTION("a registered factory repeated from the pipeline syntax") {
    PassRegistry registry;
    registry.add("count", [&runs] {
      return std::unique_ptr<detail::AnyPass>(new detail::PassModel<Countdown>(&runs, 1));
    });
    PassManager pm;
    pm.add_pipeline("count*", registry);
    pm.run(g);
    CHECK(runs == 2);
  }
}

TEST_CASE("pass manager: pipeline strings", "[passes]") {
  using Parsed = std::vector<std::pair<std::string, bool>>;
  CHECK(PassManager::parse_pipeline("a,b*, c ,\td *") == Parsed{{"a", false}, {"b", true}, {"c", false}, {"d", true}});
  CHECK(PassManager::parse_pipeline("").empty());
  CHECK(PassManager::parse_pipeline("  ").empty());
  CHECK(PassManager::parse_pipeline("none").empty());
  CHECK_THROWS_WITH(PassManager::parse_pipeline("a,,b"), Catch::Contains("empty entry"));
  CHECK_THROWS_WITH(PassManager::parse_pipeline("a,"), Catch::Contains("empty entry"));
  CHECK_THROWS_WITH(PassManager::parse_pipeline(",a"), Catch::Contains("empty entry"));
  CHECK_THROWS_WITH(PassManager::parse_pipeline("a,*"), Catch::Contains("'*' without a pass name"));

  SECTION("unknown names list the known ones, and nothing is added") {
    PassManager pm;
    try {
      pm.add_pipeline("dce,fold-bm", pass_registry());
      FAIL("no error for an unknown pass");
    } catch (const Error& e) {
      std::string what = e.what();
      CHECK(what.find("unknown pass 'fold-bm'") != std::string::npos);
      for (const char* known : {"dce", "fold-bn", "fuse", "layout", "remove-identity"})
        CHECK(what.find(known) != std::string::npos);
    }
    CHECK(pm.size() == 0);
  }
  SECTION("a name with a blank inside is not silently joined") {
    PassManager pm;
    CHECK_THROWS_WITH(pm.add_pipeline("fold-bn fuse", pass_registry()), Catch::Contains("unknown pass 'fold-bn fuse'"));
  }
  SECTION("'default' and 'none'") {
    CHECK(expand_pipeline("default") == default_pipeline());
    CHECK(expand_pipeline("none").empty());
    CHECK(expand_pipeline("dce, default") == std::string("dce,") + default_pipeline());
    CHECK_THROWS_WITH(expand_pipeline("default*"), Catch::Contains("cannot be repeated"));
    CHECK(make_pass_manager("none").size() == 0);
    CHECK(make_pass_manager().pipeline() == default_pipeline());
  }
}

TEST_CASE("pass manager: every built-in pass is registered; the default pipeline keeps the numbers", "[passes]") {
  for (const char* name : {"dce", "fold-constants", "remove-identity", "fold-bn", "fuse-gelu", "fuse-layernorm", "fuse",
                           "cancel-transposes", "layout"})
    CHECK(pass_registry().contains(name));
  for (auto& [name, repeat] : PassManager::parse_pipeline(default_pipeline())) CHECK(pass_registry().contains(name));

  Graph g = small_graph();
  std::map<std::string, Tensor> in{{"x", random_tensor({2, 4}, 3)}};
  auto before = ReferenceExecutor(g).run(in);
  PassManager pm = make_pass_manager();
  pm.run(g);
  CHECK(pm.records().size() >= pm.size());
  REQUIRE(g.outputs().size() == 1);
  CHECK(g.outputs()[0]->name() == "y");
  auto after = ReferenceExecutor(g).run(in);
  CHECK(max_rel_diff(after.at("y"), before.at("y")) <= 1e-5);
}

TEST_CASE("pass manager: verify_each names the pass that broke the graph", "[passes]") {
  auto breaker = [](Graph& g, PassContext&) {
    // Makes Relu read a value nothing defines.
    Node* relu = g.find_value("r")->producer();
    relu->set_input(0, g.get_or_create_value("nowhere"));
    return true;
  };
  SECTION("caught after the pass") {
    Graph g = small_graph();
    PassManager pm;
    pm.add("breaker", breaker);
    pm.add<FoldMulByOne>();
    CHECK_THROWS_WITH(pm.run(g), Catch::Contains("pass 'breaker' left an invalid graph") && Catch::Contains("nowhere"));
  }
  SECTION("also when the pass claims it changed nothing") {
    Graph g = small_graph();
    PassManager pm;
    pm.add("quiet-breaker", [&](Graph& gr, PassContext& ctx) {
      breaker(gr, ctx);
      return false;
    });
    CHECK_THROWS_WITH(pm.run(g), Catch::Contains("pass 'quiet-breaker'"));
  }
  SECTION("off: the manager does not look") {
    Graph g = small_graph();
    PassManager::Options opts;
    opts.verify_each = false;
    PassManager pm(opts);
    pm.add("breaker", breaker);
    CHECK_NOTHROW(pm.run(g));
    CHECK(g.check().has_value());
  }
  SECTION("a pass that throws is named, with the node") {
    Graph g = small_graph();
    PassManager pm;
    pm.add("thrower", [](Graph& gr, PassContext&) -> bool { throw gr.find_value("r")->producer()->error("boom"); });
    try {
      pm.run(g);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.message() == "pass 'thrower' failed: boom");
      CHECK(e.node() == "relu");
      CHECK(e.op() == "Relu");
    }
  }
}

TEST_CASE("pass manager: stop_after bisects by pass executions", "[passes]") {
  Graph g = small_graph();
  int runs = 0;
  PassManager::Options opts;
  opts.stop_after = 3;
  PassManager pm(opts);
  pm.add("first", [](Graph&, PassContext&) { return false; });
  pm.add_repeated<Countdown>(&runs, 5);
  pm.add("never", [](Graph&, PassContext&) -> bool { FAIL("ran past stop_after"); return false; });
  pm.run(g);
  CHECK(runs == 2);
  CHECK(pm.records().size() == 3);
}

TEST_CASE("pass manager: dumps before and after a named pass, as text and DOT", "[passes]") {
  Graph g = small_graph();
  std::vector<std::pair<std::string, std::string>> dumps;
  PassManager::Options opts;
  opts.dump_before = {"test-fold-mul-by-one"};
  opts.dump_after = {"test-fold-mul-by-one", "not-in-the-pipeline"};
  opts.dump = [&](const std::string& title, const std::string& graph) { dumps.emplace_back(title, graph); };
  SECTION("text") {
    PassManager pm(opts);
    pm.add("other", [](Graph&, PassContext&) { return false; });
    pm.add<FoldMulByOne>();
    pm.run(g);
    REQUIRE(dumps.size() == 2);
    CHECK(dumps[0].first.find("before pass 'test-fold-mul-by-one'") != std::string::npos);
    CHECK(dumps[1].first.find("after pass 'test-fold-mul-by-one'") != std::string::npos);
    CHECK(dumps[0].second.find("Mul") != std::string::npos);
    CHECK(dumps[1].second.find("Mul") == std::string::npos);
    CHECK(dumps[1].second.find("graph small") != std::string::npos);
  }
  SECTION("dot") {
    opts.dump_dot = true;
    PassManager pm(opts);
    pm.add<FoldMulByOne>();
    pm.run(g);
    REQUIRE(dumps.size() == 2);
    CHECK(dumps[0].second.find("digraph") != std::string::npos);
    CHECK(dumps[0].second.find("Mul") != std::string::npos);
    CHECK(dumps[1].second.find("Mul") == std::string::npos);
  }
}

TEST_CASE("pass registry: a user pass becomes nameable in pipelines", "[passes]") {
  PassRegistry registry;
  registry.add<FoldMulByOne>();
  CHECK(registry.contains("test-fold-mul-by-one"));
  CHECK_THROWS_WITH(registry.add("bad name", nullptr), Catch::Contains("not valid"));
  CHECK_THROWS_WITH(registry.add("a*", nullptr), Catch::Contains("not valid"));
  CHECK_THROWS_WITH(registry.add("none", nullptr), Catch::Contains("reserved"));

  // In the process-wide registry, next to the built-ins.
  if (!pass_registry().contains(FoldMulByOne::name)) pass_registry().add<FoldMulByOne>();
  Graph g = small_graph();
  PassManager pm = make_pass_manager("remove-identity, test-fold-mul-by-one, dce");
  CHECK(pm.pipeline() == "remove-identity,test-fold-mul-by-one,dce");
  pm.run(g);
  CHECK(g.count_ops("Mul") == 0);
  REQUIRE(pm.records().size() == 3);
  CHECK(pm.records()[1].rewrites == 1);
}

TEST_CASE("pass context: options with a fallback", "[passes]") {
  PassContext ctx;
  ctx.options["layout"] = "nhwc";
  CHECK(ctx.option("layout") == "nhwc");
  CHECK(ctx.option("missing", "x") == "x");
}

// --- pattern matcher ----------------------------------------------------------------------------------

TEST_CASE("pattern: op, any, constant, bind, matched_nodes", "[passes][pattern]") {
  using namespace pattern;
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{1, 2, 5, 5});
  Value* w = g.add_constant("w", random_tensor({3, 2, 3, 3}, 1));
  Node* conv = g.add_node("Conv", {x, w}, {"c"}, {}, "conv");
  Node* relu = g.add_node("Relu", {conv->output(0)}, {"r"}, {}, "relu");
  g.add_output(relu->output(0));
  infer_shapes(g);

  Pattern rule = op("Relu", op("Conv", any("x"), constant("w")).one_use().bind("conv"));
  auto m = match(relu, rule);
  REQUIRE(m);
  CHECK(m->value("x") == x);
  CHECK(m->node("conv") == conv);
  CHECK(&m->constant("w") == &w->constant());
  CHECK(m->has("conv"));
  CHECK_FALSE(m->has("y"));
  CHECK_THROWS_WITH(m->node("y"), Catch::Contains("no node bound to 'y'"));
  REQUIRE(m->matched_nodes().size() == 2);
  CHECK(m->matched_nodes()[0] == relu);  // outermost first
  CHECK(m->matched_nodes()[1] == conv);

  SECTION("no match: wrong op, non-constant weight, too few inputs, not output 0") {
    CHECK_FALSE(match(relu, op("Sigmoid", any())));
    CHECK_FALSE(match(relu, op("Relu", op("Conv", constant(), any()))));
    CHECK_FALSE(match(relu, op("Relu", op("Conv", any(), any(), any()))));  // Conv has 2 inputs, not 3
    CHECK_FALSE(match(conv, rule));
    CHECK_FALSE(match(nullptr, rule));
    Node* split = g.add_node("Split", {x}, {"s0", "s1"}, {{"axis", std::int64_t{1}}});
    Node* neg = g.add_node("Neg", {split->output(1)}, {"n"});
    CHECK_FALSE(match(neg, op("Neg", op("Split", any()))));  // output 1 of Split
    CHECK(match(neg, op("Neg", any())));
  }
  SECTION("one_use: a second reader or a graph output refuses") {
    g.add_node("Sigmoid", {conv->output(0)}, {"second"});
    CHECK_FALSE(match(relu, rule));
    CHECK(match(relu, op("Relu", op("Conv", any(), constant()))));
  }
  SECTION("one_use: the value is a graph output") {
    g.add_output(conv->output(0));
    CHECK_FALSE(match(relu, rule));
  }
  SECTION("where") {
    auto four_d = [](const Value* v) { return v->shape().rank_known() && v->shape().rank() == 4; };
    CHECK(match(relu, op("Relu", any().where(four_d))));
    CHECK_FALSE(match(relu, op("Relu", any().where([](const Value* v) { return v->is_constant(); }))));
  }
}

TEST_CASE("pattern: scalar, commutative, a name bound twice", "[passes][pattern]") {
  using namespace pattern;
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{4});
  Value* y = g.add_input("y", DType::Float32, Shape{4});
  Value* half = g.add_constant("half", Tensor::scalar<float>(0.5f));
  Value* vec = g.add_constant("vec", Tensor::from_vector<float>({2}, {0.5f, 0.5f}));
  Tensor true_scalar(DType::Bool, {});
  true_scalar.data<bool>()[0] = true;
  Value* flag = g.add_constant("flag", true_scalar);
  Node* mul = g.add_node("Mul", {half, x}, {"m"});
  Node* mul_vec = g.add_node("Mul", {x, vec}, {"mv"});
  Node* and_flag = g.add_node("Mul", {x, flag}, {"mf"});

  CHECK_FALSE(match(mul, op("Mul", any("x"), scalar(0.5))));  // operands the other way round
  auto m = match(mul, op("Mul", any("x"), scalar(0.5)).commutative());
  REQUIRE(m);
  CHECK(m->value("x") == x);
  CHECK(match(mul, op("Mul", scalar(0.5), any())));
  CHECK(match(mul, op("Mul", scalar(0.5001, 1e-3), any())));
  CHECK_FALSE(match(mul, op("Mul", scalar(0.6), any())));
  CHECK_FALSE(match(mul_vec, op("Mul", any(), scalar(0.5))));  // two elements is not a scalar
  CHECK_FALSE(match(and_flag, op("Mul", any(), scalar(1.0))));  // bool is not a number

  // Sub(x, ReduceMean(x)): the same x on both sides.
  Node* mean = g.add_node("ReduceMean", {x}, {"mean"});
  Node* sub = g.add_node("Sub", {x, mean->output(0)}, {"d"});
  Node* mean_y = g.add_node("ReduceMean", {y}, {"mean_y"});
  Node* sub_y = g.add_node("Sub", {x, mean_y->output(0)}, {"d_y"});
  Pattern centered = op("Sub", any("x"), op("ReduceMean", any("x")));
  CHECK(match(sub, centered));
  CHECK_FALSE(match(sub_y, centered));

  // Commutative choice backtracks: (y + x) * x binds x to the Add's second operand.
  Node* add = g.add_node("Add", {y, x}, {"s"});
  Node* outer = g.add_node("Mul", {add->output(0), x}, {"o"});
  Pattern shared = op("Mul", op("Add", any("a"), any("b")).commutative(), any("a"));
  auto sm = match(outer, shared);
  REQUIRE(sm);
  CHECK(sm->value("a") == x);
  CHECK(sm->value("b") == y);
  CHECK(sm->matched_nodes() == std::vector<Node*>{outer, add});
  // ... and fails cleanly when no order works.
  Node* outer_y2 = g.add_node("Mul", {add->output(0), half}, {"o2"});
  CHECK_FALSE(match(outer_y2, shared));

  // op_of: one of several op types.
  CHECK(match(sub, op_of({"Add", "Sub"}, {any(), any()})));
  CHECK_FALSE(match(mean, op_of({"Add", "Sub"}, {})));
}

TEST_CASE("pattern: Ondine's own ops by domain-qualified name", "[passes][pattern]") {
  using namespace pattern;
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{4});
  Node* gelu = g.add_node("Gelu", {x}, {"y"}, {}, "gelu", "ondine");
  Node* onnx_gelu = g.add_node("Gelu", {x}, {"z"}, {}, "onnx_gelu");
  CHECK(match(gelu, op("ondine.Gelu", any())));
  CHECK_FALSE(match(gelu, op("Gelu", any())));
  CHECK(match(onnx_gelu, op("Gelu", any())));
  CHECK_FALSE(match(onnx_gelu, op("ondine.Gelu", any())));
}

// --- rewrite helpers -----------------------------------------------------------------------------------

TEST_CASE("rewrite: replace_value keeps graph output names; erase_if_dead in any order", "[passes][rewrite]") {
  SECTION("the replacement takes the output's name") {
    Graph g = small_graph();
    Value* y = g.find_value("y");
    Value* r = g.find_value("r");
    Node* add = y->producer();
    rewrite::replace_value(g, y, r);
    CHECK(rewrite::erase_if_dead(g, {add}) == 1);
    REQUIRE(g.outputs().size() == 1);
    CHECK(g.outputs()[0] == r);
    CHECK(r->name() == "y");
    CHECK_FALSE(g.check());
  }
  SECTION("a graph input as the replacement stays an input under its name") {
    Graph g;
    Value* x = g.add_input("x", DType::Float32, Shape{3});
    Value* y = g.add_node("Identity", {x}, {"y"})->output(0);
    Value* z = g.add_node("Neg", {y}, {"z"})->output(0);
    g.add_output(y);
    g.add_output(z);
    Node* id = y->producer();
    rewrite::replace_value(g, y, x);
    CHECK(rewrite::erase_if_dead(g, {id}) == 1);
    CHECK(x->name() == "x");
    CHECK(g.inputs()[0] == x);
    REQUIRE(g.outputs().size() == 2);
    CHECK(g.outputs()[0]->name() == "y");
    CHECK(g.outputs()[1]->name() == "z");
    CHECK(z->producer()->input(0) == x);  // readers go straight to x
    CHECK_FALSE(g.check());
    auto out = ReferenceExecutor(g).run({{"x", Tensor::from_vector<float>({3}, {1, -2, 3})}});
    CHECK(out.at("y").data<float>()[1] == -2.0f);
    CHECK(out.at("z").data<float>()[1] == 2.0f);
  }
  SECTION("another graph output as the replacement keeps both names") {
    Graph g;
    Value* x = g.add_input("x", DType::Float32, Shape{3});
    Value* a = g.add_node("Relu", {x}, {"a"})->output(0);
    Value* b = g.add_node("Identity", {a}, {"b"})->output(0);
    g.add_output(a);
    g.add_output(b);
    Node* id = b->producer();
    rewrite::replace_value(g, b, a);
    rewrite::erase_if_dead(g, {id});
    REQUIRE(g.outputs().size() == 2);
    CHECK(g.outputs()[0]->name() == "a");
    CHECK(g.outputs()[1]->name() == "b");
    CHECK_FALSE(g.check());
  }
  SECTION("erase_if_dead takes matched_nodes() order (consumers first) and leaves live nodes") {
    Graph g;
    Value* x = g.add_input("x", DType::Float32, Shape{3});
    Value* a = g.add_node("Relu", {x}, {"a"})->output(0);
    Value* b = g.add_node("Neg", {a}, {"b"})->output(0);
    Value* c = g.add_node("Abs", {b}, {"c"})->output(0);
    Value* keep = g.add_node("Exp", {x}, {"keep"})->output(0);
    g.add_output(keep);
    std::vector<Node*> chain{c->producer(), b->producer(), a->producer(), keep->producer()};
    CHECK(rewrite::erase_if_dead(g, chain) == 3);
    CHECK(g.num_nodes() == 1);
    CHECK_FALSE(g.check());
  }
  SECTION("single_use") {
    Graph g = small_graph();
    CHECK(rewrite::single_use(g.find_value("m")));
    CHECK_FALSE(rewrite::single_use(g.find_value("r")));  // Neg and Add read it
    CHECK_FALSE(rewrite::single_use(g.find_value("y")));  // graph output
    CHECK_FALSE(rewrite::single_use(nullptr));
  }
}

}  // namespace test_pass_manager
