// Tests of Ondine's fused ops and the passes that create them (fuse-gelu, fuse-layernorm, fuse-rmsnorm, fuse-rotary,
// fuse-groupnorm, fuse):
// - the ops: the activation chain attributes, activation recognition and semantics, shape inference;
// - structure: op counts after each pass;
// - numbers: the graph before and after a pass agree on the reference executor (seeded inputs,
//   tolerance stated per test as a fraction of max |reference|), and every fused op compiled with
//   oneDNN agrees with its reference kernel;
// - must-not-fire: the cases where a rewrite would be wrong leave the graph as it was.
// Inputs and outputs are checked to be non-trivial so no test passes vacuously.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <random>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/lower/detail/silu.hpp"
#include "ondine/lower/lower.hpp"
#include "ondine/passes/fuse_gelu.hpp"
#include "ondine/passes/fuse_groupnorm.hpp"
#include "ondine/passes/fuse_layernorm.hpp"
#include "ondine/passes/fuse_post_ops.hpp"
#include "ondine/passes/fuse_rmsnorm.hpp"
#include "ondine/passes/fuse_rotary.hpp"
#include "ondine/passes/pipeline.hpp"
#include "ondine/reference/executor.hpp"

#if __has_include("ondine/onnx/import.hpp")
#include "ondine/ir/stats.hpp"
#include "ondine/onnx/import.hpp"
#define ONDINE_TEST_HAVE_IMPORT 1
#endif

#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_passes_fusion {

using namespace ondine;
using test::error_of;
using Dims = std::vector<std::int64_t>;
using fused::Activation;

namespace {

Tensor random_tensor(const Dims& dims, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  return test::uniform_tensor(dims, seed, lo, hi);
}

// test::GraphBuilder with padded convolutions, GELU and LayerNorm as exporters write them.
struct Builder : test::GraphBuilder {
  Value* conv(Value* x, std::int64_t out_channels, std::int64_t in_channels, std::int64_t k, bool bias = true) {
    std::vector<Value*> in{x, weight({out_channels, in_channels, k, k})};
    if (bias) in.push_back(weight({out_channels}));
    std::int64_t p = k / 2;
    return op("Conv", in, {{"pads", Dims{p, p, p, p}}});
  }
  // x * 0.5 * (1 + erf(x / sqrt 2)) as scripts/make_models.py (and torch at opset < 20) writes it.
  Value* gelu_erf(Value* x) {
    Value* erf = op("Erf", {op("Div", {x, scalar(1.41421356f)})});
    Value* product = op("Mul", {x, op("Add", {erf, scalar(1.0f)})});
    return op("Mul", {product, scalar(0.5f)});
  }
  // LayerNorm over the last axis, decomposed as opset-13 exporters write it.
  Value* layer_norm(Value* x, std::int64_t hidden, bool affine = true) {
    Value* mean = op("ReduceMean", {x}, {{"axes", Dims{-1}}, {"keepdims", std::int64_t{1}}});
    Value* centered = op("Sub", {x, mean});
    Value* var = op("ReduceMean", {op("Pow", {centered, scalar(2.0f)})}, {{"axes", Dims{-1}}});
    Value* y = op("Div", {centered, op("Sqrt", {op("Add", {var, scalar(1e-5f)})})});
    if (!affine) return y;
    y = op("Mul", {y, weight({hidden})});
    return op("Add", {y, weight({hidden}, 0.1f)});
  }
};



using test::max_abs;
using test::relative_error;
using test::require_nontrivial;

std::map<std::string, Tensor> random_inputs(const Graph& g, unsigned seed = 100, float range = 2.0f) {
  std::map<std::string, Tensor> in;
  for (Value* v : g.inputs()) {
    if (v->dtype() == DType::Int64) {  // token ids
      Tensor t(DType::Int64, v->shape().sizes());
      std::mt19937 rng(seed++);
      for (std::int64_t i = 0; i < t.numel(); ++i) t.data<std::int64_t>()[i] = static_cast<std::int64_t>(rng() % 100);
      in[v->name()] = t;
      continue;
    }
    in[v->name()] = random_tensor(v->shape().sizes(), seed++, -range, range);
  }
  return in;
}

// Runs `pipeline` on a copy of g; checks the copy is valid, infers its shapes again, and checks its
// outputs agree with g's on the reference executor within `tol`. Returns the rewritten graph.
Graph run_passes(const Graph& g, const std::string& pipeline, double tol = 1e-5, std::size_t* rewrites = nullptr) {
  Graph before = g.clone();
  infer_shapes(before);
  Graph after = before.clone();
  PassManager pm = make_pass_manager(pipeline);
  pm.run(after);
  after.verify();
  if (rewrites) {
    *rewrites = 0;
    for (auto& r : pm.records()) *rewrites += r.rewrites;
  }
  // The passes set the types of what they create; inference must agree with them.
  std::map<const Value*, std::string> set_by_pass;
  for (Value* v : after.values()) set_by_pass[v] = Graph::value_type_str(v);
  infer_shapes(after);
  for (Node* n : after.nodes())
    for (Value* v : n->outputs()) CHECK(set_by_pass[v] == Graph::value_type_str(v));
  auto inputs = random_inputs(before);
  for (auto& [name, t] : inputs) require_nontrivial(t, "input " + name);
  auto want = ReferenceExecutor(before).run(inputs);
  test::check_outputs(ReferenceExecutor(after).run(inputs), want, tol, after.to_text());
  return after;
}

// The pass leaves the graph as it was: same text before and after.
void check_untouched(const Graph& g, const std::string& pipeline) {
  Graph copy = g.clone();
  infer_shapes(copy);
  std::string before = copy.to_text();
  PassManager pm = make_pass_manager(pipeline);
  CHECK_FALSE(pm.run(copy));
  CHECK(copy.to_text() == before);
}

// Compiles g (after `pipeline`; by default none, so the fused nodes are lowered as built) and compares
// with the reference executor; returns the model (and the compile log).
CompiledModel check_compiled(Graph& g, double tol, std::vector<std::string>* log = nullptr,
                             const std::string& pipeline = "") {
  g.verify();
  infer_shapes(g);
  auto inputs = random_inputs(g, 300);
  auto want = ReferenceExecutor(g).run(inputs);
  lower::CompileOptions opts;
  opts.passes = pipeline;
  if (log) opts.log = [log](const std::string& line) { log->push_back(line); };
  CompiledModel model = lower::compile(g, opts);
  test::check_outputs(model.run(inputs), want, tol, model.to_text());
  return model;
}

std::size_t count_steps(const CompiledModel& m, const std::string& op, const std::string& impl_part = "") {
  std::size_t k = 0;
  for (auto& s : m.steps())
    if (s.op == op && s.implementation.find(impl_part) != std::string::npos) ++k;
  return k;
}
bool any_reference_step(const CompiledModel& m) {
  for (auto& s : m.steps())
    if (s.implementation == "reference") return true;
  return false;
}

std::size_t count(const Graph& g, const std::string& op) { return g.count_ops(op); }

}  // namespace

// --- the ops ------------------------------------------------------------------------------------

TEST_CASE("fused ops: the chain attributes round-trip and are validated", "[fusion][ops]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{2, 3});
  Node* n = g.add_node("FusedGemm", {x, g.add_constant("w", random_tensor({3, 4}, 1))}, {"y"}, {}, "gemm",
                       fused::kDomain);
  CHECK(fused::read_activations(*n).empty());
  std::vector<Activation> chain{{"Clip", -1.0f, 6.0f}, {"LeakyRelu", 0.1f, 0.0f}, {"Gelu"}};
  fused::write_activations(*n, chain);
  CHECK(fused::read_activations(*n) == chain);
  CHECK(fused::activations_str(chain) == "Clip+LeakyRelu+Gelu");
  fused::write_activations(*n, {});
  CHECK_FALSE(n->has_attr("activations"));

  n->set_attr("activations", std::vector<std::string>{"Relu", "Mish"});
  CHECK(error_of([&] { fused::read_activations(*n); }).find("unknown activation 'Mish'") != std::string::npos);
  n->set_attr("activations", std::vector<std::string>{"Relu"});
  n->set_attr("activation_alpha", std::vector<float>{0, 0});
  CHECK(error_of([&] { fused::read_activations(*n); }).find("activation_alpha has 2") != std::string::npos);
  CHECK(error_of([&] { infer_shapes(g); }).find("activation_alpha has 2") != std::string::npos);
}

TEST_CASE("fused ops: activation nodes are recognised with their parameters", "[fusion][ops]") {
  Builder b;
  Value* x = b.input("x", {4});
  auto act = [&](Value* v) { return fused::as_activation(*v->producer()); };
  CHECK(act(b.op("Relu", {x})) == Activation{"Relu"});
  CHECK(act(b.op("LeakyRelu", {x})) == Activation{"LeakyRelu", 0.01f});
  CHECK(act(b.op("LeakyRelu", {x}, {{"alpha", 0.2f}})) == Activation{"LeakyRelu", 0.2f});
  CHECK(act(b.op("Sigmoid", {x})) == Activation{"Sigmoid"});
  CHECK(act(b.op("Tanh", {x})) == Activation{"Tanh"});
  CHECK(act(b.op("HardSwish", {x})) == Activation{"HardSwish"});
  CHECK(act(b.op("HardSigmoid", {x})) == Activation{"HardSigmoid", 0.2f, 0.5f});
  CHECK(act(b.op("Elu", {x}, {{"alpha", 0.5f}})) == Activation{"Elu", 0.5f});
  CHECK(act(b.op("Gelu", {x}, {}, fused::kDomain)) == Activation{"Gelu"});
  CHECK(act(b.op("Gelu", {x}, {{"approximate", std::string("tanh")}}, fused::kDomain)) == Activation{"GeluTanh"});
  // Clip: constant scalar inputs at opset >= 11 (an omitted one is unbounded), attributes before.
  CHECK(act(b.op("Clip", {x, b.scalar(0.0f), b.scalar(6.0f)})) == Activation{"Clip", 0.0f, 6.0f});
  Value* lower_only = b.op("Clip", {x, b.scalar(-1.0f)});
  CHECK(act(lower_only) == Activation{"Clip", -1.0f, std::numeric_limits<float>::infinity()});
  Node* old_clip = b.g.add_node("Clip", {x}, {""}, {{"min", -2.0f}, {"max", 2.0f}});
  old_clip->set_opset(6);
  CHECK(fused::as_activation(*old_clip) == Activation{"Clip", -2.0f, 2.0f});
  // Not activations: a runtime bound, a binary op, an unknown op, an integer input.
  CHECK_FALSE(act(b.op("Clip", {x, b.input("lo", {})})));
  CHECK_FALSE(act(b.op("Add", {x, x})));
  CHECK_FALSE(act(b.op("Softplus", {x})));
  Value* ix = b.g.add_input("ix", DType::Int32, Shape{4});
  CHECK_FALSE(act(b.op("Relu", {ix})));
}

TEST_CASE("fused ops: activation semantics match the ONNX ops' reference kernels", "[fusion][ops]") {
  // Each activation applied by fused::apply agrees with the standalone op on the reference executor.
  struct Case {
    std::string op;
    std::map<std::string, Attribute> attrs;
    Activation act;
  };
  std::vector<Case> cases{{"Relu", {}, {"Relu"}},
                          {"LeakyRelu", {{"alpha", 0.3f}}, {"LeakyRelu", 0.3f}},
                          {"Sigmoid", {}, {"Sigmoid"}},
                          {"Tanh", {}, {"Tanh"}},
                          {"HardSwish", {}, {"HardSwish"}},
                          {"HardSigmoid", {{"alpha", 0.3f}, {"beta", 0.4f}}, {"HardSigmoid", 0.3f, 0.4f}},
                          {"Elu", {{"alpha", 0.7f}}, {"Elu", 0.7f}}};
  Tensor xs = random_tensor({64}, 5, -6.0f, 6.0f);
  for (auto& c : cases) {
    INFO(c.op);
    Graph g;
    Value* x = g.add_input("x", DType::Float32, Shape{64});
    g.add_output(g.add_op(c.op, {x}, c.attrs));
    infer_shapes(g);
    Tensor y = ReferenceExecutor(g).run({{"x", xs}}).begin()->second;
    for (std::int64_t i = 0; i < 64; ++i)
      CHECK(static_cast<float>(fused::apply(c.act, xs.data<float>()[i])) == Approx(y.data<float>()[i]).margin(1e-6));
  }
  // Gelu: x * Phi(x); the tanh form within 1e-3 of it; Clip clamps.
  CHECK(fused::apply(Activation{"Gelu"}, 1.0) == Approx(0.8413447460685429));
  CHECK(fused::apply(Activation{"Gelu"}, -2.0) == Approx(-0.04550026389635842));
  CHECK(fused::apply(Activation{"GeluTanh"}, 1.0) == Approx(0.8411919906082768));
  CHECK(fused::apply(Activation{"Swish", 1.0f}, 2.0) == Approx(2.0 / (1.0 + std::exp(-2.0))));  // SiLU
  CHECK(fused::apply(Activation{"Swish", 0.5f}, -3.0) == Approx(-3.0 / (1.0 + std::exp(1.5))));
  CHECK(fused::apply(Activation{"Clip", -1.0f, 6.0f}, 7.5) == 6.0);
  CHECK(fused::apply(Activation{"Clip", -1.0f, 6.0f}, -3.0) == -1.0);
  CHECK(fused::apply(std::vector<Activation>{{"Relu"}, {"Clip", 0.0f, 1.0f}}, 3.0) == 1.0);
}

TEST_CASE("fused ops: shape inference checks Bias, Sum and the attributes", "[fusion][ops][infer]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{Dim::named("batch"), 3, 8, 8});
  Value* w = g.add_constant("w", random_tensor({4, 3, 3, 3}, 1));
  Value* s = g.add_input("s", DType::Float32, Shape{Dim::named("batch"), 4, 6, 6});
  Node* conv = g.add_node("FusedConv", {x, w, nullptr, s}, {"y"}, {}, "conv", fused::kDomain);
  Value* a = g.add_input("a", DType::Float32, Shape{2, 5, 3});
  Value* bias = g.add_constant("bias", random_tensor({7}, 2));
  Value* sum = g.add_input("sum", DType::Float32, Shape{2, 5, 7});
  Node* mm = g.add_node("FusedMatMul", {a, g.add_constant("b", random_tensor({3, 7}, 3)), bias, sum}, {"z"}, {}, "mm",
                        fused::kDomain);
  Node* gelu = g.add_node("Gelu", {sum}, {"g"}, {{"approximate", std::string("tanh")}}, "gelu", fused::kDomain);
  Node* gemm = g.add_node("FusedGemm", {g.add_input("ga", DType::Float32, Shape{3, 2}), g.add_constant("gb", random_tensor({4, 3}, 4))},
                          {"gy"}, {{"transA", std::int64_t{1}}, {"transB", std::int64_t{1}}}, "gemm", fused::kDomain);
  infer_shapes(g);
  CHECK(conv->output(0)->shape().str() == "[batch,4,6,6]");
  CHECK(mm->output(0)->shape().str() == "[2,5,7]");
  CHECK(gelu->output(0)->shape().str() == "[2,5,7]");
  CHECK(gemm->output(0)->shape().str() == "[2,4]");
  CHECK(is_supported_op(fused::kDomain, "FusedConv"));
  CHECK(is_supported_op(fused::kDomain, "Gelu"));

  g.add_node("FusedMatMul", {a, g.add_constant("b2", random_tensor({3, 7}, 5)), g.add_constant("bad_bias", random_tensor({5}, 6))},
             {"z2"}, {}, "bad_bias_mm", fused::kDomain);
  CHECK(error_of([&] { infer_shapes(g); }).find("Bias 'bad_bias' has the wrong length") != std::string::npos);

  Graph h;
  Value* hx = h.add_input("x", DType::Float32, Shape{1, 3, 8, 8});
  Value* hs = h.add_input("s", DType::Float32, Shape{1, 4, 1, 1});  // broadcasts, but a Sum may not
  h.add_node("FusedConv", {hx, h.add_constant("w", random_tensor({4, 3, 3, 3}, 1)), nullptr, hs}, {"y"}, {}, "conv",
             fused::kDomain);
  CHECK(error_of([&] { infer_shapes(h); }).find("Sum 's' has shape [1,4,1,1]") != std::string::npos);

  Graph k;
  k.add_node("Gelu", {k.add_input("x", DType::Float32, Shape{2})}, {"y"}, {{"approximate", std::string("fast")}}, "gelu",
             fused::kDomain);
  CHECK(error_of([&] { infer_shapes(k); }).find("approximate must be") != std::string::npos);
}

// --- fuse-gelu ----------------------------------------------------------------------------------

TEST_CASE("fuse-gelu: the erf form in the orders exporters write (1e-5)", "[fusion][gelu]") {
  // Each variant builds P = 1 + erf(x / sqrt2) and 0.5 * x * P its own way.
  using Variant = std::function<Value*(Builder&, Value*)>;
  auto erf_plus_one = [](Builder& b, Value* x, bool by_mul) {
    Value* scaled = by_mul ? b.op("Mul", {b.scalar(0.70710678f), x}) : b.op("Div", {x, b.scalar(1.4142135f)});
    return b.op("Add", {b.scalar(1.0f), b.op("Erf", {scaled})});
  };
  std::vector<std::pair<std::string, Variant>> variants{
      {"(x * P) * 0.5", [&](Builder& b, Value* x) { return b.op("Mul", {b.op("Mul", {x, erf_plus_one(b, x, false)}), b.scalar(0.5f)}); }},
      {"(x * 0.5) * P (torch)", [&](Builder& b, Value* x) { return b.op("Mul", {b.op("Mul", {x, b.scalar(0.5f)}), erf_plus_one(b, x, false)}); }},
      {"x * (P * 0.5), Mul by 1/sqrt2", [&](Builder& b, Value* x) { return b.op("Mul", {x, b.op("Mul", {b.scalar(0.5f), erf_plus_one(b, x, true)})}); }},
      {"0.5 * (P * x)", [&](Builder& b, Value* x) { return b.op("Mul", {b.scalar(0.5f), b.op("Mul", {erf_plus_one(b, x, true), x})}); }},
      {"(x * P) / 2", [&](Builder& b, Value* x) { return b.op("Div", {b.op("Mul", {x, erf_plus_one(b, x, false)}), b.scalar(2.0f)}); }},
  };
  for (auto& [name, build] : variants) {
    INFO(name);
    Builder b;
    Value* x = b.op("Sigmoid", {b.input("x", {2, 16})});  // x produced by a node, read three times
    Value* y = build(b, x);
    b.g.rename_value(y, "y");
    b.g.add_output(y);
    std::size_t rewrites = 0;
    Graph f = run_passes(b.g, "fuse-gelu", 1e-5, &rewrites);
    CHECK(rewrites == 1);
    CHECK(count(f, "Gelu") == 1);
    CHECK(f.num_nodes() == 2);  // Sigmoid, Gelu
    REQUIRE(f.outputs().size() == 1);
    CHECK(f.outputs()[0]->name() == "y");  // the graph output keeps its name
    CHECK(f.outputs()[0]->producer()->op_key() == "ondine.Gelu");
    CHECK(f.outputs()[0]->producer()->attr_string("approximate") == "none");
    CHECK(f.opset(fused::kDomain) == fused::kDomainVersion);
  }
}

TEST_CASE("fuse-gelu: the tanh form, with Pow(x, 3) and with x * x * x (1e-5)", "[fusion][gelu]") {
  for (bool pow : {true, false}) {
    INFO((pow ? "Pow" : "x*x*x"));
    Builder b;
    Value* x = b.input("x", {3, 8});
    Value* cube = pow ? b.op("Pow", {x, b.scalar(3.0f)}) : b.op("Mul", {x, b.op("Mul", {x, x})});
    Value* inner = b.op("Add", {x, b.op("Mul", {b.scalar(0.044715f), cube})});
    Value* t = b.op("Tanh", {b.op("Mul", {inner, b.scalar(0.7978845608f)})});
    Value* y = b.op("Mul", {b.op("Mul", {b.scalar(0.5f), x}), b.op("Add", {t, b.scalar(1.0f)})});
    b.g.add_output(b.op("Relu", {y}));
    Graph f = run_passes(b.g, "fuse-gelu");
    CHECK(count(f, "Gelu") == 1);
    CHECK(f.num_nodes() == 2);
    for (Node* n : f.nodes())
      if (n->op_type() == "Gelu") CHECK(n->attr_string("approximate") == "tanh");
  }
}

TEST_CASE("fuse-gelu: must not fire", "[fusion][gelu][must-not-fire]") {
  SECTION("a wrong constant (x / 1.5)") {
    Builder b;
    Value* x = b.input("x", {8});
    Value* erf = b.op("Erf", {b.op("Div", {x, b.scalar(1.5f)})});
    b.g.add_output(b.op("Mul", {b.op("Mul", {x, b.op("Add", {erf, b.scalar(1.0f)})}), b.scalar(0.5f)}));
    check_untouched(b.g, "fuse-gelu");
  }
  SECTION("a wrong 0.5 (0.6)") {
    Builder b;
    Value* x = b.input("x", {8});
    Value* erf = b.op("Erf", {b.op("Div", {x, b.scalar(1.4142135f)})});
    b.g.add_output(b.op("Mul", {b.op("Mul", {x, b.op("Add", {erf, b.scalar(1.0f)})}), b.scalar(0.6f)}));
    check_untouched(b.g, "fuse-gelu");
  }
  SECTION("an intermediate with a second consumer") {
    Builder b;
    Value* x = b.input("x", {8});
    Value* erf = b.op("Erf", {b.op("Div", {x, b.scalar(1.4142135f)})});
    b.g.add_output(b.op("Mul", {b.op("Mul", {x, b.op("Add", {erf, b.scalar(1.0f)})}), b.scalar(0.5f)}));
    b.g.add_output(b.op("Neg", {erf}));
    check_untouched(b.g, "fuse-gelu");
  }
  SECTION("an intermediate that is a graph output") {
    Builder b;
    Value* x = b.input("x", {8});
    Value* erf = b.op("Erf", {b.op("Div", {x, b.scalar(1.4142135f)})});
    Value* product = b.op("Mul", {x, b.op("Add", {erf, b.scalar(1.0f)})});
    b.g.add_output(b.op("Mul", {product, b.scalar(0.5f)}));
    b.g.add_output(product);
    check_untouched(b.g, "fuse-gelu");
  }
  SECTION("two different x") {
    Builder b;
    Value* x = b.input("x", {8});
    Value* x2 = b.input("x2", {8});
    Value* erf = b.op("Erf", {b.op("Div", {x2, b.scalar(1.4142135f)})});
    b.g.add_output(b.op("Mul", {b.op("Mul", {x, b.op("Add", {erf, b.scalar(1.0f)})}), b.scalar(0.5f)}));
    check_untouched(b.g, "fuse-gelu");
  }
}

// --- fuse-layernorm -----------------------------------------------------------------------------

TEST_CASE("fuse-layernorm: the exporters' decomposition becomes LayerNormalization (1e-5)", "[fusion][layernorm]") {
  SECTION("with gamma and beta, opset 13") {
    Builder b;
    b.g.opsets[""] = 13;
    Value* x = b.op("Add", {b.input("x", {2, 5, 32}), b.weight({5, 32})});
    Value* y = b.layer_norm(x, 32);
    b.g.add_output(b.op("Relu", {y}));
    b.g.add_output(x);  // x itself may have other readers
    Graph f = run_passes(b.g, "fuse-layernorm");
    CHECK(count(f, "LayerNormalization") == 1);
    CHECK(f.num_nodes() == 3);  // Add, LayerNormalization, Relu
    CHECK(f.opset() == 17);
    for (Node* n : f.nodes())
      if (n->op_type() == "LayerNormalization") {
        CHECK(n->opset() == 17);
        CHECK(n->attr_int("axis") == -1);
        CHECK(n->attr_float("epsilon") == Approx(1e-5f));
        CHECK(n->num_inputs() == 3);
      }
  }
  SECTION("without gamma and beta, Mul(d, d) for the square, eps + var") {
    Builder b;
    Value* x = b.input("x", {4, 16});
    Value* mean = b.op("ReduceMean", {x}, {{"axes", Dims{1}}});
    Value* d = b.op("Sub", {x, mean});
    Value* var = b.op("ReduceMean", {b.op("Mul", {d, d})}, {{"axes", Dims{-1}}});
    b.g.add_output(b.op("Div", {d, b.op("Sqrt", {b.op("Add", {b.scalar(1e-3f), var})})}));
    Graph f = run_passes(b.g, "fuse-layernorm");
    CHECK(count(f, "LayerNormalization") == 1);
    CHECK(f.num_nodes() == 1);
    Node* ln = f.nodes()[0];
    REQUIRE(ln->num_inputs() == 2);  // Scale = ones, no B
    CHECK(ln->input(1)->constant().dims() == Dims{16});
    CHECK(ln->attr_float("epsilon") == Approx(1e-3f));
  }
  SECTION("opset 18: the axes as a constant input; gamma as [1, 1, hidden]") {
    Builder b;
    b.g.opsets[""] = 18;
    Value* x = b.input("x", {2, 3, 8});
    Value* axes = b.g.add_constant("axes", Tensor::from_vector<std::int64_t>({1}, {2}));
    Value* mean = b.op("ReduceMean", {x, axes});
    Value* d = b.op("Sub", {x, mean});
    Value* var = b.op("ReduceMean", {b.op("Pow", {d, b.scalar(2.0f)}), axes});
    Value* n = b.op("Div", {d, b.op("Sqrt", {b.op("Add", {var, b.scalar(1e-5f)})})});
    b.g.add_output(b.op("Add", {b.op("Mul", {b.weight({1, 1, 8}), n}), b.weight({8})}));
    Graph f = run_passes(b.g, "fuse-layernorm");
    CHECK(count(f, "LayerNormalization") == 1);
    CHECK(f.num_nodes() == 1);
  }
  SECTION("over the two trailing axes: axis -2") {
    Builder b;
    Value* x = b.input("x", {2, 4, 6});
    Value* mean = b.op("ReduceMean", {x}, {{"axes", Dims{-1, -2}}});
    Value* d = b.op("Sub", {x, mean});
    Value* var = b.op("ReduceMean", {b.op("Pow", {d, b.scalar(2.0f)})}, {{"axes", Dims{1, 2}}});
    Value* n = b.op("Div", {d, b.op("Sqrt", {b.op("Add", {var, b.scalar(1e-5f)})})});
    b.g.add_output(b.op("Mul", {n, b.weight({6})}));  // gamma broadcast along axis 1: expanded to [4, 6]
    Graph f = run_passes(b.g, "fuse-layernorm");
    REQUIRE(count(f, "LayerNormalization") == 1);
    CHECK(f.nodes()[0]->attr_int("axis") == -2);
    CHECK(f.nodes()[0]->input(1)->constant().dims() == Dims{4, 6});
  }
}

TEST_CASE("fuse-layernorm: must not fire", "[fusion][layernorm][must-not-fire]") {
  auto decomposed = [](Builder& b, Value* x, Dims axes) {
    Value* mean = b.op("ReduceMean", {x}, {{"axes", axes}});
    Value* d = b.op("Sub", {x, mean});
    Value* var = b.op("ReduceMean", {b.op("Pow", {d, b.scalar(2.0f)})}, {{"axes", axes}});
    return std::make_pair(mean, b.op("Div", {d, b.op("Sqrt", {b.op("Add", {var, b.scalar(1e-5f)})})}));
  };
  SECTION("over a non-last axis") {
    Builder b;
    b.g.add_output(decomposed(b, b.input("x", {2, 6, 8}), {1}).second);
    check_untouched(b.g, "fuse-layernorm");
  }
  SECTION("the mean has a second consumer") {
    Builder b;
    auto [mean, y] = decomposed(b, b.input("x", {2, 8}), {-1});
    b.g.add_output(y);
    b.g.add_output(b.op("Neg", {mean}));
    check_untouched(b.g, "fuse-layernorm");
  }
  SECTION("an intermediate is a graph output") {
    Builder b;
    auto [mean, y] = decomposed(b, b.input("x", {2, 8}), {-1});
    b.g.add_output(y);
    b.g.add_output(mean);
    check_untouched(b.g, "fuse-layernorm");
  }
  SECTION("the two means over different axes") {
    Builder b;
    Value* x = b.input("x", {2, 4, 6});
    Value* d = b.op("Sub", {x, b.op("ReduceMean", {x}, {{"axes", Dims{-1}}})});
    Value* var = b.op("ReduceMean", {b.op("Pow", {d, b.scalar(2.0f)})}, {{"axes", Dims{-2, -1}}});
    b.g.add_output(b.op("Div", {d, b.op("Sqrt", {b.op("Add", {var, b.scalar(1e-5f)})})}));
    check_untouched(b.g, "fuse-layernorm");
  }
  SECTION("a cube instead of a square") {
    Builder b;
    Value* x = b.input("x", {2, 8});
    Value* d = b.op("Sub", {x, b.op("ReduceMean", {x}, {{"axes", Dims{-1}}})});
    Value* var = b.op("ReduceMean", {b.op("Pow", {d, b.scalar(3.0f)})}, {{"axes", Dims{-1}}});
    b.g.add_output(b.op("Div", {d, b.op("Sqrt", {b.op("Add", {var, b.scalar(1e-5f)})})}));
    check_untouched(b.g, "fuse-layernorm");
  }
  SECTION("a runtime gamma: the LayerNorm fuses, the Mul by gamma stays") {
    Builder b;
    Value* y = decomposed(b, b.input("x", {2, 8}), {-1}).second;
    b.g.add_output(b.op("Mul", {y, b.input("gamma", {8})}));
    Graph f = run_passes(b.g, "fuse-layernorm");
    CHECK(count(f, "LayerNormalization") == 1);
    CHECK(count(f, "Mul") == 1);
  }
}

// --- fuse-rmsnorm ----------------------------------------------------------------------------------

namespace {
// LlamaRMSNorm as exported: weight * (x * (1 / sqrt(mean(x^2) + eps))) (rsqrt as Div of 1), or the
// forms other exporters write (x / sqrt, Reciprocal, Mul(x, x)).
enum class RmsForm { DivOfOne, Divide, Reciprocal, SquareByMul };
Value* rms_norm(Builder& b, Value* x, std::int64_t hidden, RmsForm form, bool gamma = true, Dims axes = {-1}) {
  Value* square = form == RmsForm::SquareByMul ? b.op("Mul", {x, x}) : b.op("Pow", {x, b.scalar(2.0f)});
  Value* mean = b.op("ReduceMean", {square}, {{"axes", axes}, {"keepdims", std::int64_t{1}}});
  Value* rms = b.op("Sqrt", {b.op("Add", {mean, b.scalar(1e-6f)})});
  Value* y = form == RmsForm::Divide       ? b.op("Div", {x, rms})
             : form == RmsForm::Reciprocal ? b.op("Mul", {b.op("Reciprocal", {rms}), x})
                                           : b.op("Mul", {x, b.op("Div", {b.scalar(1.0f), rms})});
  return gamma ? b.op("Mul", {b.weight({hidden}), y}) : y;
}
}  // namespace

TEST_CASE("fuse-rmsnorm: Llama's RMSNorm and the other exported forms become ondine.RMSNorm (1e-5; compiled 1e-4)",
          "[fusion][rmsnorm]") {
  for (RmsForm form : {RmsForm::DivOfOne, RmsForm::Divide, RmsForm::Reciprocal, RmsForm::SquareByMul}) {
    for (bool gamma : {true, false}) {
      INFO("form " << static_cast<int>(form) << (gamma ? " with gamma" : " bare"));
      Builder b;
      Value* x = b.op("Add", {b.input("x", {2, 5, 32}), b.weight({32})});
      b.g.add_output(b.op("Relu", {rms_norm(b, x, 32, form, gamma)}));
      b.g.add_output(x);  // x itself may have other readers
      Graph f = run_passes(b.g, "fuse-rmsnorm");
      REQUIRE(count(f, "RMSNorm") == 1);
      CHECK(f.num_nodes() == 3);  // Add, RMSNorm, Relu
      for (Node* n : f.nodes())
        if (n->op_key() == "ondine.RMSNorm") {
          CHECK(n->attr_int("axis") == -1);
          CHECK(n->attr_float("epsilon") == Approx(1e-6f));
          CHECK(n->input(1)->constant().dims() == Dims{32});
        }
      std::vector<std::string> log;
      CompiledModel m = check_compiled(f, 1e-4, &log);
      CHECK(count_steps(m, "RMSNorm", "RMS norm rows") == 1);
    }
  }
  SECTION("over the two trailing axes, gamma [1, 6] expanded to the normalised shape") {
    Builder b;
    Value* x = b.input("x", {2, 4, 6});
    b.g.add_output(b.op("Mul", {rms_norm(b, x, 0, RmsForm::Divide, false, {1, 2}), b.weight({1, 6})}));
    Graph f = run_passes(b.g, "fuse-rmsnorm");
    REQUIRE(count(f, "RMSNorm") == 1);
    CHECK(f.nodes()[0]->attr_int("axis") == -2);
    CHECK(f.nodes()[0]->input(1)->constant().dims() == Dims{4, 6});
    check_compiled(f, 1e-4);
  }
}

TEST_CASE("fuse-rmsnorm: must not fire", "[fusion][rmsnorm][must-not-fire]") {
  SECTION("over a non-last axis") {
    Builder b;
    b.g.add_output(rms_norm(b, b.input("x", {2, 6, 8}), 8, RmsForm::DivOfOne, false, {1}));
    check_untouched(b.g, "fuse-rmsnorm");
  }
  SECTION("the mean square has a second reader") {
    Builder b;
    Value* x = b.input("x", {2, 8});
    Value* mean = b.op("ReduceMean", {b.op("Pow", {x, b.scalar(2.0f)})}, {{"axes", Dims{-1}}});
    b.g.add_output(b.op("Div", {x, b.op("Sqrt", {b.op("Add", {mean, b.scalar(1e-6f)})})}));
    b.g.add_output(b.op("Neg", {mean}));
    check_untouched(b.g, "fuse-rmsnorm");
  }
  SECTION("a square of another value than the one normalised") {
    Builder b;
    Value* x = b.input("x", {2, 8});
    Value* z = b.input("z", {2, 8});
    Value* mean = b.op("ReduceMean", {b.op("Pow", {z, b.scalar(2.0f)})}, {{"axes", Dims{-1}}});
    b.g.add_output(b.op("Div", {x, b.op("Sqrt", {b.op("Add", {mean, b.scalar(1e-6f)})})}));
    check_untouched(b.g, "fuse-rmsnorm");
  }
  SECTION("a cube, not a square") {
    Builder b;
    Value* x = b.input("x", {2, 8});
    Value* mean = b.op("ReduceMean", {b.op("Pow", {x, b.scalar(3.0f)})}, {{"axes", Dims{-1}}});
    b.g.add_output(b.op("Div", {x, b.op("Sqrt", {b.op("Add", {mean, b.scalar(1e-6f)})})}));
    check_untouched(b.g, "fuse-rmsnorm");
  }
  SECTION("gamma along a non-normalised axis") {
    Builder b;
    Value* x = b.input("x", {3, 8});
    b.g.add_output(b.op("Mul", {rms_norm(b, x, 8, RmsForm::DivOfOne, false), b.weight({3, 1})}));
    Graph f = run_passes(b.g, "fuse-rmsnorm");  // the bare form fuses; the Mul stays
    CHECK(count(f, "RMSNorm") == 1);
    CHECK(count(f, "Mul") == 1);
  }
}

TEST_CASE("ondine.RMSNorm: a scale of the wrong shape is an error naming the node", "[fusion][rmsnorm]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape::from({2, 8}));
  Value* s = g.add_constant("s", Tensor::from_vector<float>({4}, {1, 1, 1, 1}));
  Node* n = g.add_node("RMSNorm", {x, s}, {"y"}, {}, "norm", fused::kDomain);
  g.add_output(n->output(0));
  CHECK_THROWS_WITH(infer_shapes(g), Catch::Contains("norm") && Catch::Contains("normalised shape"));
}

#if ONDINE_TEST_HAVE_IMPORT
TEST_CASE("fuse-rmsnorm: every RMSNorm of the exported Llama-style decoder is one node", "[fusion][rmsnorm][corpus]") {
  Graph g = ondine::onnx::load_model(std::string(ONDINE_TEST_DATA_DIR) + "/torch/llama_kv/model.onnx");
  infer_shapes(g);
  PassManager pm = make_pass_manager();
  pm.run(g);
  CHECK(count(g, "RMSNorm") == 5);  // two per layer and the final norm
  CHECK(count(g, "Sqrt") == 0);
  CHECK(count(g, "ReduceMean") == 0);
}
#endif

// --- fuse-rotary -----------------------------------------------------------------------------------

namespace {
// apply_rotary_pos_emb as exported: x * cos + Concat(-x[..., h:], x[..., :h]) * sin, the Slices with
// constant starts/ends/axes (end INT64_MAX for `x[..., h:]`); `lo_end` and `swap` make the forms that are
// not it.
Value* rotary(Builder& b, Value* x, Value* cos, Value* sin, std::int64_t d, std::int64_t lo_end = -1, bool swap = false) {
  const std::int64_t h = d / 2, cut = lo_end < 0 ? h : lo_end;
  auto ints = [&](std::int64_t v) { return b.g.add_constant(b.g.unique_name("i"), Tensor::from_vector<std::int64_t>({1}, {v})); };
  Value* lo = b.op("Slice", {x, ints(0), ints(cut), ints(-1), ints(1)});
  Value* hi = b.op("Slice", {x, ints(cut), ints(std::numeric_limits<std::int64_t>::max()), ints(-1)});
  Value* rotated = swap ? b.op("Concat", {lo, b.op("Neg", {hi})}, {{"axis", std::int64_t{-1}}})
                        : b.op("Concat", {b.op("Neg", {hi}), lo}, {{"axis", std::int64_t{-1}}});
  return b.op("Add", {b.op("Mul", {x, cos}), b.op("Mul", {rotated, sin})});
}
}  // namespace

TEST_CASE("fuse-rotary: apply_rotary_pos_emb becomes ondine.Rotary (1e-5; compiled 1e-4)", "[fusion][rotary]") {
  Builder b;
  Value* q = b.input("q", {2, 4, 3, 16});
  Value* k = b.input("k", {2, 2, 3, 16});
  Value* cos = b.input("cos", {2, 1, 3, 16});  // per position, shared by the heads
  Value* sin = b.input("sin", {2, 1, 3, 16});
  b.g.add_output(rotary(b, q, cos, sin, 16));
  b.g.add_output(rotary(b, k, cos, sin, 16));
  Graph f = run_passes(b.g, "fuse-rotary");
  CHECK(count(f, "Rotary") == 2);
  CHECK(f.num_nodes() == 2);
  std::vector<std::string> log;
  CompiledModel m = check_compiled(f, 1e-4, &log);
  CHECK(count_steps(m, "Rotary", "rotary rows") == 2);
}

TEST_CASE("fuse-rotary: must not fire", "[fusion][rotary][must-not-fire]") {
  SECTION("the halves rotated the other way") {
    Builder b;
    b.g.add_output(rotary(b, b.input("x", {1, 2, 3, 8}), b.input("c", {1, 1, 3, 8}), b.input("s", {1, 1, 3, 8}), 8, -1, true));
    check_untouched(b.g, "fuse-rotary");
  }
  SECTION("cut away from the half") {
    Builder b;
    b.g.add_output(rotary(b, b.input("x", {1, 2, 3, 8}), b.input("c", {1, 1, 3, 8}), b.input("s", {1, 1, 3, 8}), 8, 3));
    check_untouched(b.g, "fuse-rotary");
  }
  SECTION("cos broadcasting x up") {
    Builder b;
    b.g.add_output(rotary(b, b.input("x", {1, 1, 3, 8}), b.input("c", {1, 2, 3, 8}), b.input("s", {1, 2, 3, 8}), 8));
    check_untouched(b.g, "fuse-rotary");
  }
  SECTION("cos and sin of different shapes") {
    Builder b;
    b.g.add_output(rotary(b, b.input("x", {1, 2, 3, 8}), b.input("c", {1, 1, 3, 8}), b.input("s", {3, 8}), 8));
    check_untouched(b.g, "fuse-rotary");
  }
  SECTION("the rotated half read elsewhere too") {
    Builder b;
    Value* x = b.input("x", {1, 2, 3, 8});
    Value* y = rotary(b, x, b.input("c", {1, 1, 3, 8}), b.input("s", {1, 1, 3, 8}), 8);
    b.g.add_output(y);
    b.g.add_output(y->producer()->input(1)->producer()->input(0));  // the Concat
    check_untouched(b.g, "fuse-rotary");
  }
}

TEST_CASE("ondine.Rotary: an odd last dim or a cos that does not fit X is an error naming the node", "[fusion][rotary]") {
  auto graph = [](Dims x, Dims c) {
    auto g = std::make_unique<Graph>();
    Value* xv = g->add_input("x", DType::Float32, Shape::from(x));
    Value* cv = g->add_input("cos", DType::Float32, Shape::from(c));
    Value* sv = g->add_input("sin", DType::Float32, Shape::from(c));
    Node* n = g->add_node("Rotary", {xv, cv, sv}, {"y"}, {}, "rope", fused::kDomain);
    g->add_output(n->output(0));
    return g;
  };
  CHECK_THROWS_WITH(infer_shapes(*graph({1, 2, 3, 7}, {1, 1, 3, 7})), Catch::Contains("rope") && Catch::Contains("odd"));
  CHECK_THROWS_WITH(infer_shapes(*graph({1, 2, 3, 8}, {1, 1, 3, 4})), Catch::Contains("rope") && Catch::Contains("broadcast"));
  // The reference kernel refuses what shape inference could not see (run-time shapes).
  auto g = graph({1, 2, 3, 8}, {1, 1, 3, 8});
  std::map<std::string, Tensor> feeds{{"x", random_tensor({1, 2, 3, 8}, 1)}, {"cos", random_tensor({1, 1, 3, 4}, 2)},
                                      {"sin", random_tensor({1, 1, 3, 4}, 3)}};
  const Node* rope = g->nodes()[0];
  CHECK_THROWS_WITH(reference::kernel_table().at(rope->op_key())(*rope, {feeds["x"], feeds["cos"], feeds["sin"]}),
                    Catch::Contains("rope") && Catch::Contains("rotary embedding"));
}

#if ONDINE_TEST_HAVE_IMPORT
TEST_CASE("fuse-rotary: the Llama-style decoder's Q and K rotations are one node each", "[fusion][rotary][corpus]") {
  Graph g = ondine::onnx::load_model(std::string(ONDINE_TEST_DATA_DIR) + "/torch/llama_kv/model.onnx");
  infer_shapes(g);
  PassManager pm = make_pass_manager();
  pm.run(g);
  CHECK(count(g, "Rotary") == 4);  // Q and K of two layers
  CHECK(count(g, "Neg") == 0);
}
#endif

// --- fuse-groupnorm ---------------------------------------------------------------------------------

namespace {
// torch.nn.GroupNorm(groups, C) as torch.onnx.export writes it (opsets 9-17): Reshape to [N, G, -1],
// InstanceNormalization with ones and zeros, Reshape back to Shape(x), Mul by gamma, Add beta.
struct GroupNormSpec {
  std::int64_t groups = 4;
  Dims target{0, 4, -1};       // the first Reshape's shape
  bool restore_by_shape = true;  // Reshape(.., Shape(x)); else a constant of x's dims
  bool affine = true;
  bool swap_operands = false;  // Mul(gamma, y), Add(beta, y)
  Dims gamma_dims;             // {} : [C, 1, ..., 1]
  bool per_group_params = false;  // InstanceNormalization's scale/bias not ones/zeros
};
// xd: x's dims (x may be a node's output whose shape is not inferred yet).
Value* exported_group_norm(Builder& b, Value* x, const Dims& xd, const GroupNormSpec& s) {
  const std::int64_t c = xd[1];
  Value* grouped = b.op("Reshape", {x, b.ints(s.target)});
  Value* scale = s.per_group_params ? b.positive({s.groups}, 0.5f, 1.5f) : b.floats(std::vector<float>(static_cast<std::size_t>(s.groups), 1.0f));
  Value* bias = s.per_group_params ? b.weight({s.groups}) : b.floats(std::vector<float>(static_cast<std::size_t>(s.groups), 0.0f));
  Value* normed = b.op("InstanceNormalization", {grouped, scale, bias}, {{"epsilon", 1e-5f}});
  Value* shape = s.restore_by_shape ? b.op("Shape", {x}) : b.ints(xd);
  Value* y = b.op("Reshape", {normed, shape});
  if (!s.affine) return y;
  Dims pd = s.gamma_dims;
  if (pd.empty()) {
    pd.assign(xd.size() - 1, 1);
    pd[0] = c;
  }
  Value* gamma = b.positive(pd, 0.5f, 1.5f);
  Value* beta = b.weight(pd, 0.3f);
  y = s.swap_operands ? b.op("Mul", {gamma, y}) : b.op("Mul", {y, gamma});
  return s.swap_operands ? b.op("Add", {beta, y}) : b.op("Add", {y, beta});
}
}  // namespace

TEST_CASE("fuse-groupnorm: PyTorch's InstanceNormalization form becomes ondine.GroupNorm (1e-5)",
          "[fusion][groupnorm]") {
  SECTION("conv -> GroupNorm(4, 8) -> Relu, restored by Shape(x), 4-D") {
    Builder b;
    b.g.opsets[""] = 11;
    Value* x = b.conv(b.input("x", {2, 3, 6, 5}), 8, 3, 3);
    b.g.add_output(b.op("Relu", {exported_group_norm(b, x, {2, 8, 6, 5}, {})}));
    std::size_t rewrites = 0;
    Graph f = run_passes(b.g, "fuse-groupnorm", 1e-5, &rewrites);
    CHECK(rewrites == 1);
    CHECK(f.op_histogram() == std::map<std::string, std::size_t>{{"Conv", 1}, {"GroupNorm", 1}, {"Relu", 1}});
    for (Node* n : f.nodes())
      if (n->op_type() == "GroupNorm") {
        CHECK(n->attr_int("num_groups") == 4);
        CHECK(n->input(1)->constant().dims() == Dims{8});
      }
    CHECK(f.opset() == 11);  // an op of Ondine's domain: the model's ONNX opset stays
  }
  SECTION("1-D (x [N, C, L]), the batch spelled out, a constant restore shape, operands swapped, per-group s and b") {
    Builder b;
    GroupNormSpec s;
    s.groups = 2;
    s.target = {3, 2, -1};
    s.restore_by_shape = false;
    s.swap_operands = true;
    s.per_group_params = true;
    s.gamma_dims = {1, 6, 1};
    b.g.add_output(exported_group_norm(b, b.input("x", {3, 6, 7}), {3, 6, 7}, s));
    Graph f = run_passes(b.g, "fuse-groupnorm");
    CHECK(f.op_histogram() == std::map<std::string, std::size_t>{{"GroupNorm", 1}});
  }
  SECTION("no affine (GroupNorm(affine=False)), the last dim spelled out, 5-D") {
    Builder b;
    GroupNormSpec s;
    s.groups = 3;
    s.target = {0, 3, 2 * 3 * 2 * 2};
    s.affine = false;
    b.g.add_output(exported_group_norm(b, b.input("x", {2, 6, 3, 2, 2}), {2, 6, 3, 2, 2}, s));
    Graph f = run_passes(b.g, "fuse-groupnorm");
    CHECK(f.op_histogram() == std::map<std::string, std::size_t>{{"GroupNorm", 1}});
  }
}

TEST_CASE("fuse-groupnorm: must not fire", "[fusion][groupnorm][must-not-fire]") {
  SECTION("reshaped back to another shape") {
    Builder b;
    Value* x = b.input("x", {2, 8, 4, 4});
    Value* grouped = b.op("Reshape", {x, b.ints({0, 4, -1})});
    Value* normed = b.op("InstanceNormalization", {grouped, b.floats({1, 1, 1, 1}), b.floats({0, 0, 0, 0})});
    b.g.add_output(b.op("Reshape", {normed, b.ints({2, 8, 16})}));
    check_untouched(b.g, "fuse-groupnorm");
  }
  SECTION("the grouping is not [N, G, rest]") {
    Builder b;
    Value* x = b.input("x", {2, 8, 4, 4});
    Value* grouped = b.op("Reshape", {x, b.ints({0, 4, 2, -1})});
    Value* normed = b.op("InstanceNormalization", {grouped, b.floats({1, 1, 1, 1}), b.floats({0, 0, 0, 0})});
    b.g.add_output(b.op("Reshape", {normed, b.op("Shape", {x})}));
    check_untouched(b.g, "fuse-groupnorm");
  }
  SECTION("the normalised groups are read elsewhere too") {
    Builder b;
    Value* x = b.input("x", {2, 8, 4, 4});
    Value* grouped = b.op("Reshape", {x, b.ints({0, 4, -1})});
    Value* normed = b.op("InstanceNormalization", {grouped, b.floats({1, 1, 1, 1}), b.floats({0, 0, 0, 0})});
    b.g.add_output(b.op("Reshape", {normed, b.op("Shape", {x})}));
    b.g.add_output(normed);
    check_untouched(b.g, "fuse-groupnorm");
  }
  SECTION("InstanceNormalization's scale computed at run time") {
    Builder b;
    Value* x = b.input("x", {2, 8, 4, 4});
    Value* grouped = b.op("Reshape", {x, b.ints({0, 4, -1})});
    Value* normed = b.op("InstanceNormalization", {grouped, b.input("s", {4}), b.floats({0, 0, 0, 0})});
    b.g.add_output(b.op("Reshape", {normed, b.op("Shape", {x})}));
    check_untouched(b.g, "fuse-groupnorm");
  }
  SECTION("a gamma varying along a spatial axis: the GroupNorm fuses, the Mul stays") {
    Builder b;
    GroupNormSpec s;
    s.gamma_dims = {1, 1, 4};
    b.g.add_output(exported_group_norm(b, b.input("x", {2, 8, 3, 4}), {2, 8, 3, 4}, s));
    Graph f = run_passes(b.g, "fuse-groupnorm");
    CHECK(f.op_histogram() == std::map<std::string, std::size_t>{{"Add", 1}, {"Mul", 1}, {"GroupNorm", 1}});
  }
  SECTION("a plain InstanceNormalization of x") {
    Builder b;
    b.g.add_output(b.op("InstanceNormalization", {b.input("x", {2, 8, 4, 4}), b.weight({8}), b.weight({8})}));
    check_untouched(b.g, "fuse-groupnorm");
  }
}

// --- fuse (post-ops) ----------------------------------------------------------------------------

TEST_CASE("fuse: Conv + residual Add + Relu -> FusedConv with bias, Sum and the chain (1e-5)", "[fusion][post-ops]") {
  Builder b;
  Value* x = b.input("x", {1, 8, 10, 10});
  Value* shortcut = b.op("Relu", {b.conv(x, 8, 8, 1)});
  Value* y = b.conv(shortcut, 8, 8, 3);
  y = b.op("Add", {shortcut, y});  // the residual on either side
  y = b.op("Relu", {y});
  b.g.add_output(b.op("Clip", {y, b.scalar(0.0f), b.scalar(6.0f)}));
  std::size_t rewrites = 0;
  Graph f = run_passes(b.g, "fuse", 1e-5, &rewrites);
  CHECK(rewrites == 2);
  CHECK(count(f, "FusedConv") == 2);
  CHECK(f.num_nodes() == 2);
  for (Node* n : f.nodes()) {
    CHECK(n->op_key() == "ondine.FusedConv");
    CHECK(n->input(2) != nullptr);  // the conv bias stays B
    if (n->num_inputs() == 4) {
      CHECK(n->input(3)->producer()->op_type() == "FusedConv");  // Sum: the shortcut
      CHECK(fused::activations_str(fused::read_activations(*n)) == "Relu+Clip");
      CHECK(n->attr_ints("pads") == Dims{1, 1, 1, 1});  // the conv's attributes are kept
    } else {
      CHECK(fused::activations_str(fused::read_activations(*n)) == "Relu");
    }
  }
}

TEST_CASE("fuse: MatMul + bias + residual + Gelu, Gemm + activations (1e-5)", "[fusion][post-ops]") {
  Builder b;
  Value* x = b.input("x", {2, 5, 16});
  Value* h = b.op("MatMul", {x, b.weight({16, 16})});
  h = b.op("Add", {b.weight({16}), h});  // bias on the left
  h = b.op("Add", {h, x});               // residual
  h = b.op("Gelu", {h}, {}, fused::kDomain);
  Value* g2 = b.op("MatMul", {h, b.weight({16, 8})});
  g2 = b.op("Add", {g2, b.weight({1, 1, 8})});  // a bias written [1, 1, N]
  b.g.add_output(b.op("Tanh", {g2}));
  Value* flat = b.input("flat", {3, 16});
  Value* gemm = b.op("Gemm", {flat, b.weight({8, 16}), b.weight({8})}, {{"transB", std::int64_t{1}}, {"alpha", 0.5f}});
  gemm = b.op("HardSigmoid", {gemm}, {{"alpha", 0.3f}});
  b.g.add_output(b.op("LeakyRelu", {gemm}, {{"alpha", 0.2f}}));
  Graph f = run_passes(b.g, "fuse");
  CHECK(count(f, "FusedMatMul") == 2);
  CHECK(count(f, "FusedGemm") == 1);
  CHECK(f.num_nodes() == 3);
  for (Node* n : f.nodes()) {
    auto chain = fused::activations_str(fused::read_activations(*n));
    if (n->op_type() == "FusedGemm") {
      CHECK(chain == "HardSigmoid+LeakyRelu");
      CHECK(n->attr_float("alpha") == 0.5f);
    } else if (n->input(0)->is_graph_input()) {
      REQUIRE(n->num_inputs() == 4);
      CHECK(n->input(3)->name() == "x");
      CHECK(chain == "Gelu");
    } else {
      REQUIRE(n->num_inputs() == 3);
      CHECK(n->input(2)->constant().dims() == Dims{8});
      CHECK(chain == "Tanh");
    }
  }
}

TEST_CASE("fuse: a fused node takes further activations, so the pass can run again", "[fusion][post-ops]") {
  Builder b;
  Value* x = b.input("x", {1, 4, 6, 6});
  Value* w = b.weight({4, 4, 3, 3});
  Node* conv = b.g.add_node("FusedConv", {x, w}, {"c"}, {{"pads", Dims{1, 1, 1, 1}}}, "conv", fused::kDomain);
  fused::write_activations(*conv, {{"Relu"}});
  Value* y = b.op("Sigmoid", {conv->output(0)});
  b.g.add_output(b.op("Elu", {y}, {{"alpha", 0.5f}}));
  Graph f = run_passes(b.g, "fuse");
  REQUIRE(f.num_nodes() == 1);
  CHECK(fused::activations_str(fused::read_activations(*f.nodes()[0])) == "Relu+Sigmoid+Elu");
  CHECK(f.nodes()[0]->name() == "conv");
  check_untouched(f, "fuse");  // nothing more to take
  // ... but not a Sum after activations: act(conv) + s is not act(conv + s).
  Builder c;
  Value* cx = c.input("x", {1, 4, 6, 6});
  Node* cconv = c.g.add_node("FusedConv", {cx, c.weight({4, 4, 3, 3})}, {"c"}, {{"pads", Dims{1, 1, 1, 1}}}, "conv",
                             fused::kDomain);
  fused::write_activations(*cconv, {{"Relu"}});
  c.g.add_output(c.op("Add", {cconv->output(0), cx}));
  check_untouched(c.g, "fuse");
}

TEST_CASE("fuse: SiLU written as Mul(y, Sigmoid(y)) joins the chain as Swish (1e-5)", "[fusion][post-ops]") {
  // EfficientNet's blocks, as torchvision exports them: conv -> Sigmoid and Mul(conv, sigmoid), in either
  // operand order, then more (a second SiLU after a residual-free conv, a Relu).
  Builder b;
  Value* x = b.input("x", {1, 8, 10, 10});
  Value* c = b.conv(x, 8, 8, 3);
  Value* y = b.op("Mul", {c, b.op("Sigmoid", {c})});
  Value* c2 = b.conv(y, 8, 8, 1);
  y = b.op("Mul", {b.op("Sigmoid", {c2}), c2});
  b.g.add_output(b.op("Relu", {y}));
  Graph f = run_passes(b.g, "fuse", 1e-5);
  REQUIRE(count(f, "FusedConv") == 2);
  CHECK(f.num_nodes() == 2);
  std::vector<std::string> chains;
  for (Node* n : f.nodes()) chains.push_back(fused::activations_str(fused::read_activations(*n)));
  std::sort(chains.begin(), chains.end());
  CHECK(chains == std::vector<std::string>{"Swish", "Swish+Relu"});
}

TEST_CASE("fuse: SiLU must not fire", "[fusion][post-ops][must-not-fire]") {
  SECTION("the conv output has a third reader") {
    Builder b;
    Value* c = b.conv(b.input("x", {1, 4, 6, 6}), 4, 4, 3);
    b.g.add_output(b.op("Mul", {c, b.op("Sigmoid", {c})}));
    b.g.add_output(b.op("Relu", {c}));
    check_untouched(b.g, "fuse");
  }
  SECTION("the sigmoid is read elsewhere too") {
    Builder b;
    Value* c = b.conv(b.input("x", {1, 4, 6, 6}), 4, 4, 3);
    Value* s = b.op("Sigmoid", {c});
    b.g.add_output(b.op("Mul", {c, s}));
    b.g.add_output(s);
    check_untouched(b.g, "fuse");
  }
  SECTION("a gate from another value (squeeze-and-excitation, not SiLU)") {
    Builder b;
    Value* c = b.conv(b.input("x", {1, 4, 6, 6}), 4, 4, 3);
    Value* gate = b.op("Sigmoid", {b.input("g", {1, 4, 6, 6})});
    b.g.add_output(b.op("Mul", {c, gate}));
    b.g.add_output(b.op("Sigmoid", {c}));
    check_untouched(b.g, "fuse");
  }
  SECTION("Mul(y, y) beside a Sigmoid of y") {
    Builder b;
    Value* c = b.conv(b.input("x", {1, 4, 6, 6}), 4, 4, 3);
    b.g.add_output(b.op("Mul", {c, c}));
    b.g.add_output(b.op("Sigmoid", {c}));
    check_untouched(b.g, "fuse");
  }
}

TEST_CASE("fuse: must not fire", "[fusion][post-ops][must-not-fire]") {
  SECTION("the conv output has a second consumer") {
    Builder b;
    Value* c = b.conv(b.input("x", {1, 4, 6, 6}), 4, 4, 3);
    b.g.add_output(b.op("Relu", {c}));
    b.g.add_output(b.op("Sigmoid", {c}));
    check_untouched(b.g, "fuse");
  }
  SECTION("the conv output is a graph output") {
    Builder b;
    Value* c = b.conv(b.input("x", {1, 4, 6, 6}), 4, 4, 3);
    b.g.add_output(b.op("Relu", {c}));
    b.g.add_output(c);
    check_untouched(b.g, "fuse");
  }
  SECTION("a runtime bias after a MatMul (it broadcasts, so it is no Sum either)") {
    Builder b;
    Value* m = b.op("MatMul", {b.input("x", {4, 8}), b.weight({8, 6})});
    b.g.add_output(b.op("Add", {m, b.input("bias", {6})}));
    check_untouched(b.g, "fuse");
  }
  SECTION("a residual Add whose operand broadcasts") {
    Builder b;
    Value* c = b.conv(b.input("x", {1, 4, 6, 6}), 4, 4, 3);
    b.g.add_output(b.op("Add", {c, b.input("s", {1, 4, 1, 1})}));
    check_untouched(b.g, "fuse");
  }
  SECTION("a constant 'residual' on a conv (not a runtime Sum)") {
    Builder b;
    Value* c = b.conv(b.input("x", {1, 4, 6, 6}), 4, 4, 3);
    b.g.add_output(b.op("Add", {c, b.weight({1, 4, 6, 6})}));
    check_untouched(b.g, "fuse");
  }
  SECTION("a Clip with a runtime bound") {
    Builder b;
    Value* c = b.conv(b.input("x", {1, 4, 6, 6}), 4, 4, 3);
    b.g.add_output(b.op("Clip", {c, b.input("lo", {}), b.scalar(6.0f)}));
    check_untouched(b.g, "fuse");
  }
  SECTION("a float64 conv") {
    Builder b;
    Value* x = b.g.add_input("x", DType::Float64, Shape{1, 2, 4, 4});
    Tensor w(DType::Float64, {2, 2, 1, 1});
    for (int i = 0; i < 4; ++i) w.data<double>()[i] = 0.25 * (i + 1);
    b.g.add_output(b.op("Relu", {b.op("Conv", {x, b.g.add_constant("w64", w)})}));
    check_untouched(b.g, "fuse");
  }
}

// --- compiled fused ops vs their reference kernels ------------------------------------------------

TEST_CASE("compiled: FusedConv with Sum and every activation matches the reference (1e-4)", "[fusion][lower]") {
  if (lower::effective_isa().name.find("avx512") == std::string::npos) {  // checks brgconv kernel names
    WARN("skipped: needs AVX-512 (oneDNN ISA " << lower::effective_isa().name << ")");
    return;
  }
  std::vector<std::vector<Activation>> chains{
      {{"Relu"}},
      {{"LeakyRelu", 0.1f}, {"Clip", -0.5f, 0.5f}},
      {{"Sigmoid"}, {"Tanh"}},
      {{"HardSwish"}, {"HardSigmoid", 0.2f, 0.5f}},
      {{"Elu", 0.7f}, {"Gelu"}},
      {{"GeluTanh"}, {"Clip", 0.0f, std::numeric_limits<float>::infinity()}},
      {{"Swish", 0.5f}, {"Tanh"}},  // Swish twice with two alphas: declined (repeats_eltwise_alg)
  };
  for (auto& chain : chains) {
    INFO(fused::activations_str(chain));
    Builder b;
    Value* x = b.input("x", {1, 8, 9, 9});
    Value* s = b.op("Relu", {b.conv(x, 16, 8, 1)});
    Node* n = b.g.add_node("FusedConv", {x, b.weight({16, 8, 3, 3}), b.weight({16}), s}, {"y"},
                           {{"pads", Dims{1, 1, 1, 1}}}, "fused", fused::kDomain);
    fused::write_activations(*n, chain);
    b.g.add_output(n->output(0));
    std::vector<std::string> log;
    CompiledModel m = check_compiled(b.g, 1e-4, &log);
    for (const std::string& line : log) UNSCOPED_INFO(line);
    INFO(m.to_text());
    CHECK(count_steps(m, "FusedConv", "brgconv") == 1);
    CHECK(count_steps(m, "Conv") == 1);  // the shortcut, with its Relu as a post-op
    CHECK_FALSE(any_reference_step(m));
  }
}

TEST_CASE("silu kernels: each kernel this CPU runs matches x * sigmoid(alpha x) within 4e-6 with tails",
          "[fusion][lower][silu]") {
  namespace silu = lower::detail::silu;
  using Run = std::function<void(float*, std::size_t, float)>;
  const lower::IsaInfo isa = lower::effective_isa();
  std::vector<std::pair<std::string, Run>> kernels{
      {"scalar", [](float* p, std::size_t n, float a) { silu::run(silu::Kernel::Scalar, p, n, a); }}};
#ifdef ONDINE_SILU_X86
  if (lower::isa_runs_on(lower::CpuIsa::Avx2, isa.isa)) {  // both forms of the AVX2 kernel too
    kernels.emplace_back("avx2 division", [](float* p, std::size_t n, float a) { silu::run_avx2_as<true>(p, n, a); });
    kernels.emplace_back("avx2 reciprocal", [](float* p, std::size_t n, float a) { silu::run_avx2_as<false>(p, n, a); });
  }
  if (isa.avx512) {  // both forms of the AVX-512 kernel, whichever this CPU's vendor takes
    kernels.emplace_back("avx512 division", [](float* p, std::size_t n, float a) { silu::run_avx512_as<true>(p, n, a); });
    kernels.emplace_back("avx512 reciprocal",
                         [](float* p, std::size_t n, float a) { silu::run_avx512_as<false>(p, n, a); });
  }
#endif
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-40.0f, 40.0f);
  for (const auto& [name, run] : kernels) {
    INFO(name);
    for (float alpha : {1.0f, 0.5f, 1.702f}) {
      for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{16}, std::size_t{37}, std::size_t{4099}}) {
        std::vector<float> x(n);
        for (float& v : x) v = u(rng);
        x[0] = n > 1 ? -1000.0f : 0.0f;  // saturates to -0, not NaN
        if (n > 2) x[1] = 1000.0f;
        std::vector<float> y = x;
        run(y.data(), n, alpha);
        for (std::size_t i = 0; i < n; ++i) {
          const double want = x[i] / (1.0 + std::exp(-static_cast<double>(alpha) * x[i]));
          INFO("x = " << x[i] << " alpha " << alpha);
          REQUIRE(std::isfinite(y[i]));
          // Relative 4e-6 where it matters; far in the negative tail (|y| < 1e-9) the float32 product
          // alpha x log2(e) alone carries a few 1e-6 of relative error into exp.
          CHECK(std::fabs(y[i] - want) <= 4e-6 * std::fabs(want) + 1e-12);
        }
      }
    }
  }
}

TEST_CASE("compiled: a conv's trailing Swish runs as Ondine's kernel after the primitive (1e-4)", "[fusion][lower][silu]") {
  // Conv -> Sigmoid/Mul (SiLU) through the default passes: one FusedConv [Swish], lowered as the conv and an
  // in-place Swish step; a Swish followed by more activations stays a oneDNN post-op.
  Builder b;
  Value* x = b.input("x", {1, 8, 12, 12});
  Value* c = b.conv(x, 16, 8, 3);
  Value* y = b.op("Mul", {c, b.op("Sigmoid", {c})});
  Value* c2 = b.conv(y, 16, 16, 1);
  y = b.op("Mul", {b.op("Sigmoid", {c2}), c2});
  b.g.add_output(b.op("Tanh", {y}));
  CompiledModel m = check_compiled(b.g, 1e-4, nullptr, "default");
  INFO(m.to_text());
  std::size_t swish_steps = 0;
  for (const auto& s : m.steps()) {
    if (s.op != "Swish") continue;
    ++swish_steps;
    CHECK(s.implementation.rfind("ondine:", 0) == 0);
    CHECK(s.detail.rfind("in place", 0) == 0);
  }
  CHECK(swish_steps == 1);  // the second conv's Swish is followed by Tanh: a post-op
  CHECK_FALSE(any_reference_step(m));
}

TEST_CASE("compiled: a Sum whose other readers ran before is overwritten in place, else copied (1e-4)", "[fusion][lower]") {
  if (lower::effective_isa().name.find("avx512") == std::string::npos) {  // checks brgconv kernel names
    WARN("skipped: needs AVX-512 (oneDNN ISA " << lower::effective_isa().name << ")");
    return;
  }
  for (bool read_later : {false, true}) {
    INFO((read_later ? "the shortcut is read again later" : "the fused conv reads the shortcut last"));
    Builder b;
    Value* x = b.input("x", {1, 8, 8, 8});
    Value* shortcut = b.op("Relu", {b.conv(x, 8, 8, 1)});
    Value* a = b.op("Relu", {b.conv(shortcut, 8, 8, 3)});  // reads the shortcut before the fused conv
    Node* n = b.g.add_node("FusedConv", {a, b.weight({8, 8, 3, 3}), b.weight({8}), shortcut}, {"y"},
                           {{"pads", Dims{1, 1, 1, 1}}}, "fused", fused::kDomain);
    fused::write_activations(*n, {{"Relu"}});
    Value* y = n->output(0);
    if (read_later) y = b.op("Mul", {y, shortcut});
    b.g.add_output(y);
    CompiledModel m = check_compiled(b.g, 1e-4);
    INFO(m.to_text());
    CHECK(count_steps(m, "Copy") == (read_later ? 1u : 0u));
    CHECK(count_steps(m, "FusedConv", "brgconv") == 1);
  }
}

TEST_CASE("compiled: FusedMatMul (bias, sum, gelu), FusedGemm and Gelu match the reference (1e-4)", "[fusion][lower]") {
  Builder b;
  Value* x = b.input("x", {2, 6, 16});
  Node* mm = b.g.add_node("FusedMatMul", {x, b.weight({16, 16}), b.weight({16}), x}, {"h"}, {}, "mm", fused::kDomain);
  fused::write_activations(*mm, {{"Gelu"}});
  Node* mm2 = b.g.add_node("FusedMatMul", {mm->output(0), b.input("rhs", {2, 16, 4})}, {"h2"}, {}, "mm2", fused::kDomain);
  fused::write_activations(*mm2, {{"Tanh"}});
  b.g.add_output(b.op("Gelu", {mm2->output(0)}, {{"approximate", std::string("tanh")}}, fused::kDomain));
  b.g.add_output(mm2->output(0));  // read twice: the Gelu stays a primitive of its own
  b.g.add_output(b.op("Gelu", {mm->output(0)}, {}, fused::kDomain));
  Node* gemm = b.g.add_node("FusedGemm", {b.input("a", {5, 16}), b.weight({16, 8}), b.weight({8})}, {"g"},
                            {{"beta", 0.5f}}, "gemm", fused::kDomain);
  fused::write_activations(*gemm, {{"HardSigmoid", 0.3f, 0.4f}});
  b.g.add_output(gemm->output(0));
  CompiledModel m = check_compiled(b.g, 1e-4);
  CHECK(count_steps(m, "FusedMatMul") == 2);
  CHECK(count_steps(m, "FusedGemm") == 1);
  CHECK(count_steps(m, "Gelu") == 2);
  CHECK_FALSE(any_reference_step(m));
}

TEST_CASE("compiled: products by constant weights as 1x1 convolutions over the rows, and where they stay matmuls (1e-4)",
          "[fusion][lower][matmul-conv]") {
  // Forced (MatMulKernel::Conv1x1), so any AVX2+ CPU runs it: 3-D A (rows of several batch dims), bias,
  // residual Sum and GELU post-ops, 13 rows (no vector width divides them), one row, a Gemm with transB and
  // no C, a MatMul + Add + Relu left unfused by the passes; then the must-not-fire cases.
  auto compile = [](Graph& g, lower::MatMulKernel kernel) {
    g.verify();
    infer_shapes(g);
    auto inputs = random_inputs(g, 300);
    auto want = ReferenceExecutor(g).run(inputs);
    lower::CompileOptions opts;
    opts.passes = "none";
    opts.matmul_kernel = kernel;
    CompiledModel m = lower::compile(g, opts);
    test::check_outputs(m.run(inputs), want, 1e-4, m.to_text());
    return m;
  };
  auto convs = [](const CompiledModel& m) {
    std::size_t k = 0;
    for (auto& s : m.steps()) k += s.implementation.rfind("jit_1x1", 0) == 0;
    return k;
  };
  {
    Builder b;
    Value* x = b.input("x", {2, 13, 24});
    Node* mm = b.g.add_node("FusedMatMul", {x, b.weight({24, 40}), b.weight({40})}, {"h"}, {}, "mm", fused::kDomain);
    fused::write_activations(*mm, {{"Gelu"}});
    Value* r = b.input("r", {2, 13, 24});
    Node* mm2 = b.g.add_node("FusedMatMul", {mm->output(0), b.weight({40, 24}, 0.25f), b.weight({24}), r}, {"h2"}, {},
                             "mm2", fused::kDomain);
    b.g.add_output(mm2->output(0));
    Value* one = b.op("MatMul", {b.input("v", {1, 24}), b.weight({24, 8})});
    b.g.add_output(b.op("Relu", {b.op("Add", {one, b.weight({8})})}));
    b.g.add_output(b.op("Gemm", {b.input("a", {9, 16}), b.weight({8, 16})}, {{"transB", std::int64_t{1}}}));
    CompiledModel m = compile(b.g, lower::MatMulKernel::Conv1x1);
    // The path takes oneDNN's jit_1x1 kernel only (what was measured); with AVX-512 oneDNN gives most of these
    // shapes to its brgconv instead, and they stay matmuls.
    if (lower::effective_isa().avx512) CHECK(convs(m) >= 1);
    else CHECK(convs(m) == 4);
    CHECK(count_steps(m, "Add") == 0);  // bias and Relu folded into the one-row product
    CHECK_FALSE(any_reference_step(m));
    Graph same = b.g.clone();
    CHECK(convs(compile(same, lower::MatMulKernel::Gemm)) == 0);
  }
  {
    INFO("must not fire: run-time weights, Gemm's C and alpha, batched weights");
    Builder b;
    b.g.add_output(b.op("MatMul", {b.input("x", {12, 16}), b.input("w", {16, 8})}));
    b.g.add_output(b.op("Gemm", {b.input("a", {12, 16}), b.weight({16, 8}), b.weight({12, 8})}, {{"alpha", 0.5f}}));
    b.g.add_output(b.op("MatMul", {b.input("y", {3, 12, 16}), b.weight({3, 16, 8})}));
    CHECK(convs(compile(b.g, lower::MatMulKernel::Conv1x1)) == 0);
  }
}

TEST_CASE("compiled: a fused node oneDNN cannot take runs its reference kernel, and says so", "[fusion][lower]") {
  Builder b;
  // A runtime Bias: the matmul lowering wants a constant one.
  Node* mm = b.g.add_node("FusedMatMul", {b.input("x", {3, 8}), b.weight({8, 4}), b.input("bias", {4})}, {"y"}, {},
                          "mm", fused::kDomain);
  fused::write_activations(*mm, {{"Relu"}});
  b.g.add_output(mm->output(0));
  std::vector<std::string> log;
  CompiledModel m = check_compiled(b.g, 1e-5, &log);
  CHECK(count_steps(m, "FusedMatMul", "reference") == 1);
  bool said = false;
  for (auto& line : log) said |= line.find("ondine.FusedMatMul 'mm'") != std::string::npos &&
                                 line.find("reference kernel") != std::string::npos;
  CHECK(said);
}

TEST_CASE("compiled: GroupNorm, GroupNormalization (opsets 18, 21) and InstanceNormalization run Ondine's kernel "
          "with the activation that follows (1e-4)",
          "[fusion][lower][groupnorm]") {
  struct Case {
    const char* name;
    std::function<Value*(Builder&, Value*)> norm;
    const char* activation;  // "" none, "Relu", "LeakyRelu", "Clip", "SiLU", "Sigmoid" (not taken)
  };
  std::vector<Case> cases{
      {"ondine.GroupNorm", [](Builder& b, Value* x) {
         return b.op("GroupNorm", {x, b.positive({12}, 0.5f, 1.5f), b.weight({12})}, {{"num_groups", std::int64_t{3}}},
                     fused::kDomain);
       }, "Relu"},
      {"GroupNormalization-18 (per-group scale)", [](Builder& b, Value* x) {
         Node* n = b.node("GroupNormalization", {x, b.positive({4}, 0.5f, 1.5f), b.weight({4})},
                          {{"num_groups", std::int64_t{4}}, {"epsilon", 1e-3f}});
         n->set_opset(18);
         return n->output(0);
       }, "LeakyRelu"},
      {"GroupNormalization-21", [](Builder& b, Value* x) {
         Node* n = b.node("GroupNormalization", {x, b.positive({12}, 0.5f, 1.5f), b.weight({12})},
                          {{"num_groups", std::int64_t{6}}});
         n->set_opset(21);
         return n->output(0);
       }, "Clip"},
      {"InstanceNormalization", [](Builder& b, Value* x) {
         return b.op("InstanceNormalization", {x, b.positive({12}, 0.5f, 1.5f), b.weight({12})});
       }, "SiLU"},
      {"InstanceNormalization, a Sigmoid after it", [](Builder& b, Value* x) {
         return b.op("InstanceNormalization", {x, b.positive({12}, 0.5f, 1.5f), b.weight({12})});
       }, "Sigmoid"},
      {"GroupNorm, nothing after it", [](Builder& b, Value* x) {
         return b.op("GroupNorm", {x, b.positive({12}, 0.5f, 1.5f), b.weight({12})}, {{"num_groups", std::int64_t{2}}},
                     fused::kDomain);
       }, ""},
  };
  // 13 x 11 planes: no vector width divides them (the kernels' tails). A mean far from zero: the
  // variance is the centred one.
  for (const Case& c : cases) {
    INFO(c.name << " + " << c.activation);
    Builder b;
    Value* x = b.op("Add", {b.input("x", {2, 12, 13, 11}), b.scalar(40.0f)});
    Value* y = c.norm(b, x);
    const std::string act = c.activation;
    if (act == "Relu" || act == "Sigmoid") y = b.op(act, {y});
    if (act == "LeakyRelu") y = b.op("LeakyRelu", {y}, {{"alpha", 0.2f}});
    if (act == "Clip") y = b.op("Clip", {y, b.scalar(-0.5f), b.scalar(0.75f)});
    if (act == "SiLU") y = b.op("Mul", {b.op("Sigmoid", {y}), y});
    b.g.add_output(y);
    CompiledModel m = check_compiled(b.g, 1e-4);
    INFO(m.to_text());
    CHECK_FALSE(any_reference_step(m));
    std::size_t kernels = 0, others = 0;
    for (auto& s : m.steps()) {
      if (s.implementation.rfind("ondine:", 0) == 0) ++kernels;
      else if (s.op != "Add" && s.op != "Reorder") ++others;
    }
    CHECK(kernels == 1);
    CHECK(others == (act == "Sigmoid" ? 1u : 0u));  // the activation folded in, but a Sigmoid
  }
}

TEST_CASE("compiled: the group-norm kernels agree with each other and with double sums", "[fusion][lower][groupnorm]") {
  namespace gn = lower::detail::group_norm;
  namespace silu = lower::detail::silu;
  std::vector<silu::Kernel> kernels{silu::Kernel::Scalar};
#ifdef ONDINE_SILU_X86
  const lower::IsaInfo isa = lower::effective_isa();
  if (lower::isa_runs_on(lower::CpuIsa::Avx2, isa.isa)) kernels.push_back(silu::Kernel::Avx2);
  if (isa.avx512) kernels.push_back(silu::Kernel::Avx512);
#endif
  // 9001 values: more than two float chunks, and a tail. Values around 1000 with unit spread.
  Tensor t = random_tensor({9001}, 7, 999.0f, 1001.0f);
  const float* p = t.data<float>();
  double sum = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) sum += p[i];
  const double mean = sum / static_cast<double>(t.numel());
  double squares = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) squares += (p[i] - mean) * (p[i] - mean);
  gn::Activation act;
  act.lo = 0;
  act.slope = 0.1f;
  for (silu::Kernel k : kernels) {
    INFO(silu::kernel_name(k));
    CHECK(gn::sum(k, p, 9001) == Approx(sum).epsilon(1e-7));
    CHECK(gn::centered_squares(k, p, 9001, static_cast<float>(mean)) == Approx(squares).epsilon(1e-4));
    std::vector<float> y(37);
    gn::affine(k, p, y.data(), y.size(), 0.5f, -500.0f, act);
    for (std::size_t i = 0; i < y.size(); ++i) {
      const float v = p[i] * 0.5f - 500.0f;
      CHECK(y[i] == Approx(v > 0 ? v : 0.1f * v).margin(1e-4));
    }
  }
}

// --- end to end -----------------------------------------------------------------------------------

namespace {
// One BERT-style encoder layer as scripts/make_models.py writes it (opset 13): LayerNorm and Gelu
// decomposed, Linear as MatMul + Add, residual Adds.
Graph bert_layer(std::int64_t seq, std::int64_t hidden, std::int64_t heads) {
  Builder b;
  b.g.opsets[""] = 13;
  std::int64_t ffn = 4 * hidden, head_dim = hidden / heads;
  Value* x = b.layer_norm(b.op("Add", {b.input("x", {1, seq, hidden}), b.weight({seq, hidden})}), hidden);
  auto linear = [&](Value* v, std::int64_t in, std::int64_t out) {
    return b.op("Add", {b.op("MatMul", {v, b.weight({in, out}, 1.0f / std::sqrt(static_cast<float>(in)))}), b.weight({out}, 0.05f)});
  };
  auto split = b.g.add_constant("split", Tensor::from_vector<std::int64_t>({4}, {0, 0, heads, head_dim}));
  auto heads_of = [&](Value* v, Dims perm) { return b.op("Transpose", {b.op("Reshape", {v, split})}, {{"perm", perm}}); };
  Value* q = heads_of(linear(x, hidden, hidden), {0, 2, 1, 3});
  Value* k = heads_of(linear(x, hidden, hidden), {0, 2, 3, 1});
  Value* v = heads_of(linear(x, hidden, hidden), {0, 2, 1, 3});
  Value* scores = b.op("Div", {b.op("MatMul", {q, k}), b.scalar(std::sqrt(static_cast<float>(head_dim)))});
  Value* ctx = b.op("MatMul", {b.op("Softmax", {scores}, {{"axis", std::int64_t{-1}}}), v});
  ctx = b.op("Reshape", {b.op("Transpose", {ctx}, {{"perm", Dims{0, 2, 1, 3}}}),
                         b.g.add_constant("merge", Tensor::from_vector<std::int64_t>({3}, {0, 0, hidden}))});
  x = b.layer_norm(b.op("Add", {linear(ctx, hidden, hidden), x}), hidden);
  Value* h = b.gelu_erf(linear(x, hidden, ffn));
  x = b.layer_norm(b.op("Add", {linear(h, ffn, hidden), x}), hidden);
  b.g.rename_value(x, "last_hidden_state");
  b.g.add_output(x);
  return std::move(b.g);
}
}  // namespace

// --- pointwise-as-conv -------------------------------------------------------------------------

namespace {

// x [N, C, d...] (rank `rank`) -> Transpose to channels-last -> body -> Transpose back, as PyTorch writes ConvNeXt blocks.
Value* channels_last_detour(Builder& b, Value* x, const std::function<Value*(Value*)>& body, std::int64_t rank = 4) {
  Dims last{0}, back{0, rank - 1};
  for (std::int64_t i = 2; i < rank; ++i) last.push_back(i);
  last.push_back(1);
  for (std::int64_t i = 1; i + 1 < rank; ++i) back.push_back(i);
  Value* v = b.op("Transpose", {x}, {{"perm", last}});
  return b.op("Transpose", {body(v)}, {{"perm", back}});
}

// A ConvNeXt block on x [N, C, H, W]: depthwise 7x7 (3x3 here), LayerNorm, Linear(C, 4C), GELU,
// Linear(4C, C) through the permutes, then the layer scale and the residual.
Value* convnext_block(Builder& b, Value* x, std::int64_t c) {
  Value* dw = b.op("Conv", {x, b.weight({c, 1, 3, 3}), b.weight({c})},
                   {{"group", c}, {"pads", Dims{1, 1, 1, 1}}});
  Value* y = channels_last_detour(b, dw, [&](Value* v) {
    v = b.layer_norm(v, c);
    v = b.op("Add", {b.weight({4 * c}), b.op("MatMul", {v, b.weight({c, 4 * c})})});  // torch's order
    v = b.gelu_erf(v);
    return b.op("Add", {b.weight({c}), b.op("MatMul", {v, b.weight({4 * c, c}, 0.25f)})});
  });
  y = b.op("Mul", {b.positive({c, 1, 1}, 0.5f, 1.5f), y});
  return b.op("Add", {y, x});
}

}  // namespace

TEST_CASE("pointwise-as-conv: a ConvNeXt block runs channels-first: 1x1 Convs, ChannelLayerNorm, scales folded (1e-5)",
          "[fusion][pointwise]") {
  Builder b;
  Value* x = b.input("x", {2, 12, 5, 7});  // 12 channels: padded in 8- and 16-channel blocks
  b.g.add_output(convnext_block(b, x, 12));
  Graph after = run_passes(b.g, "fuse-gelu,fuse-layernorm,pointwise-as-conv", 1e-5);
  INFO(after.to_text());
  CHECK(count(after, "Transpose") == 0);
  CHECK(count(after, "MatMul") == 0);
  CHECK(count(after, "ChannelLayerNorm") == 1);
  CHECK(count(after, "Conv") == 3);
  CHECK(count(after, "Mul") == 0);  // the layer scale is in the second 1x1 conv's weights
  CHECK(count(after, "Add") == 1);  // the residual; both biases are in the convs
  // fuse then gives the 1x1 convs the Gelu and the residual sum.
  Graph fused = run_passes(b.g, "fuse-gelu,fuse-layernorm,pointwise-as-conv,fuse", 1e-5);
  CHECK(count(fused, "FusedConv") == 2);
  CHECK(count(fused, "Add") == 0);
  CHECK(count(fused, "Gelu") == 0);

  // Compiled with the default pipeline: no transposes, the normalisation on Ondine's kernel.
  CompiledModel m = check_compiled(b.g, 1e-4, nullptr, "default");
  INFO(m.to_text());
  CHECK(count_steps(m, "ChannelLayerNorm", "ondine:") == 1);
  CHECK(count_steps(m, "Transpose") == 0);
  CHECK(count_steps(m, "MatMul") == 0);
  CHECK_FALSE(any_reference_step(m));
}

TEST_CASE("pointwise-as-conv: LayerNorm2d alone, a 1-D detour, a scalar scale and a Relu (1e-5)", "[fusion][pointwise]") {
  {
    INFO("LayerNorm2d: permute, LayerNorm, permute (ConvNeXt's stem and downsampling)");
    Builder b;
    Value* x = b.op("Add", {b.input("x", {1, 20, 6, 6}), b.scalar(3.0f)});  // a mean far from 0
    Value* y = channels_last_detour(b, x, [&](Value* v) {
      return b.op("LayerNormalization", {v, b.positive({20}, 0.5f, 1.5f), b.weight({20})},
                  {{"axis", std::int64_t{-1}}, {"epsilon", 1e-6f}});
    });
    b.g.add_output(b.op("Conv", {y, b.weight({8, 20, 2, 2})}, {{"strides", Dims{2, 2}}}));
    Graph after = run_passes(b.g, "pointwise-as-conv", 1e-5);
    CHECK(after.op_histogram() == std::map<std::string, std::size_t>{{"Add", 1}, {"ChannelLayerNorm", 1}, {"Conv", 1}});
    CompiledModel m = check_compiled(b.g, 1e-4, nullptr, "default");
    CHECK(count_steps(m, "ChannelLayerNorm", "ondine:") == 1);
  }
  {
    INFO("1-D: [N, C, L] -> [N, L, C] -> Linear, scalar Mul, Relu, Linear -> back");
    Builder b;
    Value* x = b.input("x", {2, 10, 9});
    b.g.add_output(channels_last_detour(b, x, [&](Value* v) {
      v = b.op("Mul", {b.op("MatMul", {v, b.weight({10, 16})}), b.scalar(0.5f)});
      return b.op("MatMul", {b.op("Relu", {v}), b.weight({16, 6})});
    }, 3));
    Graph after = run_passes(b.g, "pointwise-as-conv", 1e-5);
    CHECK(after.op_histogram() == std::map<std::string, std::size_t>{{"Conv", 2}, {"Relu", 1}});
    check_compiled(b.g, 1e-4, nullptr, "default");
  }
}

TEST_CASE("pointwise-as-conv: must not fire", "[fusion][pointwise][must-not-fire]") {
  struct Case {
    const char* name;
    std::function<Value*(Builder&, Value*)> body;  // on the channels-last [2, 5, 7, 12]
    Dims back;                                      // the closing perm
  };
  const Dims inverse{0, 3, 1, 2};
  std::vector<Case> cases{
      {"a MatMul by a run-time weight", [](Builder& b, Value* v) {
         return b.op("MatMul", {v, b.input("w", {12, 12})});
       }, inverse},
      {"a constant along the height, not the channels", [](Builder& b, Value* v) {
         return b.op("Mul", {v, b.positive({5, 1, 1}, 0.5f, 1.5f)});
       }, inverse},
      {"LayerNorm over the last two axes", [](Builder& b, Value* v) {
         return b.op("LayerNormalization", {v, b.positive({7, 12}, 0.5f, 1.5f)}, {{"axis", std::int64_t{-2}}});
       }, inverse},
      {"a Softmax over the channels", [](Builder& b, Value* v) {
         return b.op("Softmax", {v}, {{"axis", std::int64_t{-1}}});
       }, inverse},
      {"a value of the detour read twice", [](Builder& b, Value* v) {
         Value* m = b.op("MatMul", {v, b.weight({12, 12})});
         b.g.add_output(m);
         return b.op("Relu", {m});
       }, inverse},
      {"a binary op of two run-time values", [](Builder& b, Value* v) {
         return b.op("Add", {b.op("MatMul", {v, b.weight({12, 12})}), b.input("r", {2, 5, 7, 12})});
       }, inverse},
      {"the Transpose back is another permutation", [](Builder& b, Value* v) {
         return b.op("Relu", {v});
       }, Dims{0, 3, 2, 1}},
      {"a Transpose pair with nothing between (cancel-transposes')", [](Builder&, Value* v) { return v; }, inverse},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    Builder b;
    Value* x = b.input("x", {2, 12, 5, 7});
    Value* v = b.op("Transpose", {x}, {{"perm", Dims{0, 2, 3, 1}}});
    b.g.add_output(b.op("Transpose", {c.body(b, v)}, {{"perm", c.back}}));
    check_untouched(b.g, "pointwise-as-conv");
  }
  INFO("no Transpose back: a Reshape to tokens, as ViT and Swin have");
  Builder b;
  Value* v = b.op("Transpose", {b.input("x", {2, 12, 5, 7})}, {{"perm", Dims{0, 2, 3, 1}}});
  v = b.op("MatMul", {v, b.weight({12, 16})});
  b.g.add_output(b.op("Reshape", {v, b.ints({2, 35, 16})}));
  check_untouched(b.g, "pointwise-as-conv");
}

TEST_CASE("ondine.ChannelLayerNorm: a scale or bias of the wrong length is an error naming the node", "[fusion][pointwise]") {
  for (bool bad_bias : {false, true}) {
    Builder b;
    Value* x = b.input("x", {1, 6, 4, 4});
    b.g.add_output(b.op("ChannelLayerNorm", {x, b.weight({bad_bias ? 6 : 5}), b.weight({bad_bias ? 7 : 6})}, {},
                        fused::kDomain));
    const std::string e = error_of([&] { infer_shapes(b.g); });
    INFO(e);
    CHECK(e.find("ChannelLayerNorm") != std::string::npos);
    CHECK(e.find(bad_bias ? "bias" : "scale") != std::string::npos);
  }
}

TEST_CASE("compiled: the channel-norm kernel on plain, channels-last and blocked layouts with padding (1e-4)",
          "[fusion][lower][pointwise]") {
  // Channel counts: 20 (blocks of 8 and 16 padded; channels-last not a multiple of 8: scalar), 40 (of 8, not
  // of 16), 3; 13 x 11 positions: no vector width divides them. Reached by each layout mode of the layout pass.
  for (std::int64_t c : {20, 40, 3}) {
    for (const char* layout : {"auto", "nhwc", "plain"}) {
      INFO(c << " channels, layout=" << layout);
      Builder b;
      Value* x = b.op("Conv", {b.input("x", {2, 4, 13, 11}), b.weight({c, 4, 1, 1})});
      x = b.op("Add", {x, b.scalar(5.0f)});
      Value* y = b.op("ChannelLayerNorm", {x, b.positive({c}, 0.5f, 1.5f), b.weight({c})}, {{"epsilon", 1e-5f}},
                      fused::kDomain);
      b.g.add_output(b.op("Conv", {y, b.weight({5, c, 1, 1})}));
      infer_shapes(b.g);
      PassManager pm = make_pass_manager("layout");
      pm.context().options["layout"] = layout;
      pm.run(b.g);
      CompiledModel m = check_compiled(b.g, 1e-4);
      INFO(m.to_text());
      CHECK(count_steps(m, "ChannelLayerNorm", "ondine:") == 1);
    }
  }
}

TEST_CASE("end to end: a BERT-style layer through fuse-gelu,fuse-layernorm,fuse (1e-5; compiled 1e-4)", "[fusion][e2e]") {
  Graph g = bert_layer(16, 32, 4);
  Graph f = run_passes(g, "fuse-gelu,fuse-layernorm,fuse");
  auto h = f.op_histogram();
  CHECK(h["LayerNormalization"] == 3);
  CHECK(h["FusedMatMul"] == 6);  // q, k, v, attention output (+ residual), intermediate (+ Gelu), output (+ residual)
  CHECK(h["MatMul"] == 2);       // scores and context stay plain
  CHECK(h["Add"] == 1);          // the position embedding
  CHECK(h.count("Erf") == 0);
  CHECK(h.count("ReduceMean") == 0);
  CHECK(h.count("Gelu") == 0);   // folded into its FusedMatMul
  CHECK(f.outputs()[0]->name() == "last_hidden_state");
  std::size_t gelu_chains = 0;
  for (Node* n : f.nodes())
    if (n->op_type() == "FusedMatMul") gelu_chains += fused::activations_str(fused::read_activations(*n)) == "Gelu";
  CHECK(gelu_chains == 1);
  CompiledModel m = check_compiled(f, 1e-4);
  CHECK(count_steps(m, "FusedMatMul", "reference") == 0);
  CHECK(count_steps(m, "FusedMatMul") == 6);
  // The default pipeline inside compile does the same to the unfused layer.
  CompiledModel d = check_compiled(g, 1e-4, nullptr, default_pipeline());
  CHECK(count_steps(d, "FusedMatMul") == 6);
}

#ifdef ONDINE_TEST_HAVE_IMPORT
TEST_CASE("end to end: models/bert.onnx (when generated) fuses every Gelu and LayerNorm", "[.slow][fusion][e2e]") {
  auto loaded = test::example_model("bert.onnx");
  if (!loaded) return;
  Graph g = std::move(*loaded);
  bind_dims(g, {{"batch", 1}});
  infer_shapes(g);
  std::size_t layer_norms = g.count_ops("Sqrt"), gelus = g.count_ops("Erf");
  Graph f = run_passes(g, "fuse-gelu,fuse-layernorm,fuse", 1e-5);
  CHECK(f.count_ops("LayerNormalization") == layer_norms);
  CHECK(f.count_ops("Erf") == 0);
  CHECK(f.count_ops("FusedMatMul") == 6 * gelus);  // six per layer, one Gelu per layer
  check_compiled(f, 1e-4);
}
#endif

}  // namespace test_passes_fusion
