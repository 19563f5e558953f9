// The error-bound fallback (quant/fallback.hpp): the output error measure, the per-layer ranking,
// the fallback picking the one badly quantizable layer, a bound already met, an unreachable bound,
// bad input, and QuantizeOptions::keep_fp32 which it is built on.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>

#include "ondine/quant/calibration.hpp"
#include "support.hpp"
#include "ondine/quant/fallback.hpp"
#include "ondine/quant/metrics.hpp"
#include "ondine/quant/qdq.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_quant_fallback {

using namespace ondine;
using namespace ondine::quant;

namespace {

using Ints = std::vector<std::int64_t>;

using test::random_tensor;

Value* conv(Graph& g, const std::string& name, Value* x, Tensor w, Tensor b) {
  Value* wv = g.add_constant(name + ".w", std::move(w));
  Value* bv = g.add_constant(name + ".b", std::move(b));
  return g.add_node("Conv", {x, wv, bv}, {name}, {{"pads", Ints{1, 1, 1, 1}}}, name)->output(0);
}

// x[1,4,8,8] -> conv1 -> relu1 -> conv2 -> relu2 -> conv3 -> y. conv2 is the badly quantizable layer:
// input channel 5 is dead (conv1's bias -100 there, cut by the Relu), and conv2 weighs it 1000 in
// every output channel. The fp32 output does not see it, but the per-channel int8 scale becomes
// 1000/127, so every real weight of conv2 (about 0.14) rounds to 0.
Graph outlier_net() {
  Graph g;
  std::mt19937 rng(3);
  Value* x = g.add_input("x", DType::Float32, Shape::from(Ints{1, 4, 8, 8}));
  Tensor b1 = random_tensor({6}, rng, 0.1f);
  b1.data<float>()[5] = -100.0f;
  Value* r1 = g.add_node("Relu", {conv(g, "conv1", x, random_tensor({6, 4, 3, 3}, rng, 0.17f), b1)}, {"relu1"},
                         {}, "relu1")->output(0);
  Tensor w2 = random_tensor({6, 6, 3, 3}, rng, 0.14f);
  for (std::int64_t c = 0; c < 6; ++c) w2.data<float>()[((c * 6 + 5) * 3 + 1) * 3 + 1] = 1000.0f;
  Value* r2 = g.add_node("Relu", {conv(g, "conv2", r1, w2, random_tensor({6}, rng, 0.1f))}, {"relu2"}, {},
                         "relu2")->output(0);
  g.add_output(conv(g, "conv3", r2, random_tensor({4, 6, 3, 3}, rng, 0.14f), random_tensor({4}, rng, 0.1f)));
  infer_shapes(g);
  g.verify();
  return g;
}

std::vector<Sample> samples(const Graph& g, std::size_t count, std::uint32_t seed) {
  return test::random_samples(g, count, seed);
}

Node* node_named(const Graph& g, const std::string& name) {
  for (Node* n : g.nodes())
    if (n->name() == name) return n;
  return nullptr;
}

// Whether node `name` of g reads a DequantizeLinear output (is quantized).
bool quantized(const Graph& g, const std::string& name) {
  Node* n = node_named(g, name);
  REQUIRE(n);
  for (Value* in : n->inputs())
    if (in && in->producer() && in->producer()->op_type() == "DequantizeLinear") return true;
  return false;
}

const QuantizeDecision& decision(const QuantizeReport& r, const std::string& node) {
  for (auto& d : r.nodes)
    if (d.node == node) return d;
  FAIL("no decision for " << node);
  return r.nodes.front();
}

std::map<std::string, Tensor> one(const std::string& name, std::vector<float> values) {
  return {{name, Tensor::from_vector<float>({static_cast<std::int64_t>(values.size())}, values)}};
}

}  // namespace

TEST_CASE("output_error: max |q - f| / max |f| per output over all samples, the worst output", "[quant][fallback]") {
  Graph g;
  Value* a = g.add_input("a", DType::Float32, Shape::from(Ints{3}));
  Value* b = g.add_input("b", DType::Float32, Shape::from(Ints{3}));
  g.add_output(a);
  g.add_output(b);
  auto merge = [](std::map<std::string, Tensor> x, const std::map<std::string, Tensor>& y) {
    x.insert(y.begin(), y.end());
    return x;
  };
  SampleOutputs f{merge(one("a", {1, -4, 2}), one("b", {1, 1, 1}))};
  SampleOutputs q{merge(one("a", {1.1f, -4, 2}), one("b", {1, 1, 1}))};
  CHECK(output_error(g, f, q) == Approx(0.1 / 4).epsilon(1e-5));
  // Two samples: the largest difference anywhere over the largest magnitude anywhere, per output.
  f.push_back(merge(one("a", {8, 0, 0}), one("b", {2, 0, 0})));
  q.push_back(merge(one("a", {8, 0, 0.2f}), one("b", {2, 0, 0.02f})));
  CHECK(output_error(g, f, q) == Approx(0.2 / 8).epsilon(1e-5));
  q[1]["b"].data<float>()[2] = 0.5f;  // b: 0.5 / 2 is now the worse output
  CHECK(output_error(g, f, q) == Approx(0.25).epsilon(1e-6));
  CHECK(output_error(g, f, f) == 0.0);
  q[0]["a"].data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isinf(output_error(g, f, q)));

  // An all-zero fp32 output: 0 when matched exactly, else +inf.
  SampleOutputs z{merge(one("a", {0, 0, 0}), one("b", {0, 0, 0}))};
  CHECK(output_error(g, z, z) == 0.0);
  SampleOutputs z2{merge(one("a", {0, 0, 1e-6f}), one("b", {0, 0, 0}))};
  CHECK(std::isinf(output_error(g, z, z2)));

  // Integer outputs are left out; with no float output at all it is an error.
  Graph gi;
  gi.add_output(gi.add_input("i", DType::Int64, Shape::from(Ints{2})));
  SampleOutputs ints{{{"i", Tensor::from_vector<std::int64_t>({2}, {1, 2})}}};
  CHECK_THROWS_WITH(output_error(gi, ints, ints), Catch::Contains("no float output"));
  CHECK_THROWS_WITH(output_error(g, f, SampleOutputs{}), Catch::Contains("reference runs"));
  SampleOutputs missing{one("a", {1, 1, 1})};
  CHECK_THROWS_WITH(output_error(g, SampleOutputs{f[0]}, missing), Catch::Contains("test run 1 lacks output 'b'"));
}

TEST_CASE("keep_fp32 keeps exactly the nodes it names, after keep-fp32-ends", "[quant][fallback][qdq]") {
  Graph fp32 = outlier_net();
  auto calib = calibrate(fp32, samples(fp32, 4, 1));
  QuantizeOptions opts;
  opts.keep_fp32_ends = true;
  opts.keep_fp32 = [](const Node& n) -> std::optional<std::string> {
    if (n.name() == "conv2" || n.name() == "conv3") return std::string("test says so");
    return std::nullopt;
  };
  Graph q = fp32.clone();
  QuantizeQDQ pass(calib, opts);
  PassContext ctx;
  pass.run(q, ctx);
  // conv1 and conv3 are the ends (kept for that reason, not for keep_fp32), conv2 by keep_fp32.
  CHECK(decision(pass.report(), "conv1").reason == "first weight layer (keep fp32 ends)");
  CHECK(decision(pass.report(), "conv3").reason == "last weight layer (keep fp32 ends)");
  CHECK(decision(pass.report(), "conv2").reason == "test says so");
  CHECK(pass.report().quantized() == 0);
}

TEST_CASE("layer_sensitivity ranks the layer with the outlier weight first", "[quant][fallback]") {
  Graph fp32 = outlier_net();
  auto calib = calibrate(fp32, samples(fp32, 8, 1));
  Graph q = fp32.clone();
  QuantizeQDQ pass(calib);
  PassContext ctx;
  pass.run(q, ctx);
  REQUIRE(pass.report().quantized() == 3);
  auto ranking = layer_sensitivity(fp32, q, samples(fp32, 4, 2));
  REQUIRE(ranking.size() == 3);
  for (auto& l : ranking) INFO(l.node << " " << l.sqnr_db);
  CHECK(ranking[0].node == "conv2");
  CHECK(ranking[0].op == "Conv");
  CHECK(ranking[0].output == "conv2");
  // conv2 alone loses nearly all its signal (its real weights round to 0); the others are ordinary int8.
  CHECK(ranking[0].sqnr_db < 3.0);
  for (std::size_t i = 1; i < ranking.size(); ++i) {
    CHECK(ranking[i].sqnr_db > 25.0);
    CHECK(ranking[i].sqnr_db >= ranking[i - 1].sqnr_db);
  }
  // The definition: the output SQNR of the graph with only that node int8.
  QuantizeOptions only;
  only.include = {"conv3"};
  Graph q3 = fp32.clone();
  QuantizeQDQ pass3(calib, only);
  pass3.run(q3, ctx);
  auto one_sample = samples(fp32, 1, 2);
  auto f = ReferenceExecutor(fp32).run(one_sample[0]), o = ReferenceExecutor(q3).run(one_sample[0]);
  double want = compare(f.at("conv3"), o.at("conv3")).sqnr_db;
  bool found = false;
  for (auto& l : layer_sensitivity(fp32, q, one_sample))
    if (l.node == "conv3") {
      found = true;
      CHECK(l.sqnr_db == Approx(want).epsilon(1e-9));
    }
  CHECK(found);
  // An fp32 graph against itself has no quantized layer.
  CHECK(layer_sensitivity(fp32, fp32, samples(fp32, 1, 2)).empty());
}

TEST_CASE("the fallback keeps exactly the badly quantizable layer fp32, and the bound then holds",
          "[quant][fallback][numbers]") {
  Graph fp32 = outlier_net();
  auto calib = calibrate(fp32, samples(fp32, 8, 1));
  auto eval = samples(fp32, 4, 2);
  FallbackOptions fo;
  fo.max_error = 0.05;
  std::vector<std::string> progress;
  fo.progress = [&](std::size_t i, const FallbackStep& s) {
    progress.push_back(std::to_string(i) + " " + s.layer.node);
  };
  FallbackResult r = quantize_with_fallback(fp32, calib, {}, eval, fo);
  INFO("initial " << r.initial_error << ", final " << r.error);
  CHECK(r.initial_error > 0.5);  // int8 everywhere: conv2's output is mostly its bias
  REQUIRE(r.steps.size() == 1);
  CHECK(r.steps[0].layer.node == "conv2");
  CHECK(r.steps[0].error_before == r.initial_error);
  CHECK(r.steps[0].error_after == r.error);
  CHECK(progress == std::vector<std::string>{"1 conv2"});
  CHECK(r.met);
  CHECK(r.error <= 0.05);
  CHECK(r.error > 0.0);  // conv1 and conv3 still int8
  CHECK(r.ranking.size() == 3);

  // The graph: conv2 fp32 with the reason, conv1 and conv3 int8.
  CHECK_FALSE(quantized(r.graph, "conv2"));
  CHECK(quantized(r.graph, "conv1"));
  CHECK(quantized(r.graph, "conv3"));
  CHECK(decision(r.report, "conv2").reason == "kept fp32 for the error bound (fallback 1)");
  CHECK(r.report.quantized() == 2);
  r.graph.verify();

  // The error it states is the one the graph has on those samples.
  ReferenceExecutor ef(fp32), eq(r.graph);
  SampleOutputs a, b;
  for (auto& s : eval) {
    a.push_back(ef.run(s));
    b.push_back(eq.run(s));
  }
  CHECK(output_error(fp32, a, b) == r.error);
  // And it holds on fresh inputs too, not only on the ones measured.
  SampleOutputs fa, fb;
  for (auto& s : samples(fp32, 4, 77)) {
    fa.push_back(ef.run(s));
    fb.push_back(eq.run(s));
  }
  CHECK(output_error(fp32, fa, fb) < 0.1);
}

TEST_CASE("a bound already met keeps nothing fp32", "[quant][fallback]") {
  Graph fp32 = outlier_net();
  auto calib = calibrate(fp32, samples(fp32, 8, 1));
  FallbackOptions fo;
  fo.max_error = 10.0;
  FallbackResult r = quantize_with_fallback(fp32, calib, {}, samples(fp32, 2, 2), fo);
  CHECK(r.steps.empty());
  CHECK(r.met);
  CHECK(r.error == r.initial_error);
  CHECK(r.report.quantized() == 3);
  // The same graph as the quantize pass alone makes.
  Graph q = fp32.clone();
  QuantizeQDQ pass(calib);
  PassContext ctx;
  pass.run(q, ctx);
  CHECK(q.num_nodes() == r.graph.num_nodes());
  // The user's own options still apply: an excluded layer is not a candidate.
  QuantizeOptions opts;
  opts.exclude = {"conv2"};
  fo.max_error = 0.05;
  r = quantize_with_fallback(fp32, calib, opts, samples(fp32, 2, 2), fo);
  CHECK(r.steps.empty());
  CHECK(r.ranking.size() == 2);
  CHECK(decision(r.report, "conv2").reason == "in the exclude list");
}

TEST_CASE("an unreachable bound: max_fallbacks reached, or every layer fp32", "[quant][fallback]") {
  Graph fp32 = outlier_net();
  auto calib = calibrate(fp32, samples(fp32, 8, 1));
  auto eval = samples(fp32, 2, 2);
  FallbackOptions fo;
  fo.max_error = 0.0;
  fo.max_fallbacks = 2;
  FallbackResult r = quantize_with_fallback(fp32, calib, {}, eval, fo);
  CHECK_FALSE(r.met);
  REQUIRE(r.steps.size() == 2);
  CHECK(r.steps[0].layer.node == "conv2");
  CHECK(r.error > 0.0);
  CHECK(r.error < r.initial_error);
  CHECK(r.report.quantized() == 1);

  // Without a limit the steps end with every layer fp32: the fp32 graph, error 0.
  fo.max_fallbacks = 0;
  r = quantize_with_fallback(fp32, calib, {}, eval, fo);
  CHECK(r.met);
  CHECK(r.steps.size() == 3);
  CHECK(r.error == 0.0);
  CHECK(r.report.quantized() == 0);
  CHECK(r.graph.num_nodes() == fp32.num_nodes());
}

TEST_CASE("fallback: bad bound, no samples", "[quant][fallback]") {
  Graph fp32 = outlier_net();
  auto calib = calibrate(fp32, samples(fp32, 2, 1));
  FallbackOptions fo;
  fo.max_error = -0.1;
  CHECK_THROWS_WITH(quantize_with_fallback(fp32, calib, {}, samples(fp32, 1, 2), fo),
                    Catch::Contains("finite number >= 0"));
  fo.max_error = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(quantize_with_fallback(fp32, calib, {}, samples(fp32, 1, 2), fo),
                    Catch::Contains("finite number >= 0"));
  fo.max_error = 0.1;
  CHECK_THROWS_WITH(quantize_with_fallback(fp32, calib, {}, {}, fo), Catch::Contains("at least one sample"));
  // Bad samples are named (number and label) before any work.
  auto bad = samples(fp32, 2, 2);
  bad[1]["x"] = Tensor(DType::Float32, {1, 4, 4, 4});
  CHECK_THROWS_WITH(quantize_with_fallback(fp32, calib, {}, bad, fo),
                    Catch::Contains("error-bound sample 2: input 'x' has shape [1,4,4,4]"));
  bad[1]["x"] = samples(fp32, 1, 5)[0]["x"].clone();
  bad[1]["x"].data<float>()[7] = std::numeric_limits<float>::infinity();
  fo.sample_label = [](std::size_t i) { return "s" + std::to_string(i) + ".npy"; };
  CHECK_THROWS_WITH(quantize_with_fallback(fp32, calib, {}, bad, fo),
                    Catch::Contains("error-bound sample 2 ('s1.npy'): input 'x' contains +Inf"));
}

}  // namespace test_quant_fallback
