// The seeded random ops (RandomUniform, RandomNormal, their *Like forms, Bernoulli, Multinomial): a seed
// gives the same values on every run and in both engines, different seeds differ, no seed draws anew,
// and the values follow their distributions (moments within bounds that fail by chance far less often
// than once in a billion runs, for these seeds: deterministic anyway).
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "ondine/ir/shape_inference.hpp"
#include "ondine/lower/lower.hpp"
#include "ondine/reference/executor.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_reference_random {

using namespace ondine;
using Attrs = std::map<std::string, Attribute>;

namespace {

// A one-node graph on `input` (none when empty), inferred.
Graph one_node(const std::string& op, const Tensor& input, Attrs attrs) {
  Graph g;
  std::vector<Value*> ins;
  if (!input.empty()) ins.push_back(g.add_input("x", input.dtype(), input.shape()));
  g.add_output(g.add_node(op, ins, {"y"}, std::move(attrs), "node_under_test")->output(0));
  infer_shapes(g);
  return g;
}

Tensor run(const std::string& op, const Tensor& input, Attrs attrs) {
  Graph g = one_node(op, input, std::move(attrs));
  std::map<std::string, Tensor> feeds;
  if (!input.empty()) feeds["x"] = input;
  Tensor y = ReferenceExecutor(g).run(feeds).at("y");
  const Value* v = g.find_value("y");
  REQUIRE(v->dtype() == y.dtype());
  REQUIRE(v->shape().is_static());
  REQUIRE(v->shape().sizes() == y.dims());
  return y;
}

std::vector<double> doubles(const Tensor& t) {
  std::vector<double> v;
  for (std::int64_t i = 0; i < t.numel(); ++i) v.push_back(t.at_double(static_cast<std::size_t>(i)));
  return v;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}
double stddev(const std::vector<double>& v) {
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

const std::vector<std::int64_t> kShape{100, 100};

}  // namespace

TEST_CASE("RandomUniform and RandomNormal: seeded, in range, with the asked moments", "[random]") {
  const Attrs uniform{{"shape", kShape}, {"low", -2.0f}, {"high", 3.0f}, {"seed", 7.0f}};
  const std::vector<double> u = doubles(run("RandomUniform", Tensor(), uniform));
  CHECK(u == doubles(run("RandomUniform", Tensor(), uniform)));  // the same seed, the same values
  for (double x : u) REQUIRE((x >= -2 && x < 3));
  CHECK(mean(u) == Approx(0.5).margin(0.05));             // sd of the mean: 5 / sqrt(12) / 100 = 0.014
  CHECK(stddev(u) == Approx(5 / std::sqrt(12.0)).margin(0.03));
  Attrs other = uniform;
  other["seed"] = 8.0f;
  CHECK(u != doubles(run("RandomUniform", Tensor(), other)));
  Attrs unseeded = uniform;
  unseeded.erase("seed");
  CHECK(doubles(run("RandomUniform", Tensor(), unseeded)) != doubles(run("RandomUniform", Tensor(), unseeded)));

  const Attrs normal{{"shape", kShape}, {"mean", 1.5f}, {"scale", 0.5f}, {"seed", 3.0f}, {"dtype", std::int64_t{11}}};
  const Tensor n = run("RandomNormal", Tensor(), normal);
  CHECK(n.dtype() == DType::Float64);
  CHECK(mean(doubles(n)) == Approx(1.5).margin(0.02));  // sd of the mean: 0.005
  CHECK(stddev(doubles(n)) == Approx(0.5).margin(0.02));
}

TEST_CASE("RandomUniformLike and RandomNormalLike take the input's shape and type unless dtype says", "[random]") {
  const Tensor x(DType::Float16, {3, 5, 7});
  const Tensor u = run("RandomUniformLike", x, {{"seed", 1.0f}});
  CHECK(u.dtype() == DType::Float16);
  CHECK(u.dims() == x.dims());
  const Tensor n = run("RandomNormalLike", x, {{"seed", 1.0f}, {"dtype", std::int64_t{1}}});
  CHECK(n.dtype() == DType::Float32);
  CHECK(n.dims() == x.dims());
  try {
    run("RandomUniformLike", x, {{"dtype", std::int64_t{7}}});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.node() == "node_under_test");
    CHECK(std::string(e.what()).find("not one RandomUniformLike can produce") != std::string::npos);
  }
}

TEST_CASE("Bernoulli: 0 and 1 with probability p; p 0 and 1 are certain", "[random]") {
  std::vector<float> p(10000, 0.3f);
  p[0] = 0.0f;
  p[1] = 1.0f;
  const Tensor probs = Tensor::from_vector<float>({10000}, p);
  const Tensor y = run("Bernoulli", probs, {{"seed", 5.0f}});
  const std::vector<double> v = doubles(y);
  CHECK(v[0] == 0);
  CHECK(v[1] == 1);
  for (double x : v) REQUIRE((x == 0 || x == 1));
  CHECK(mean(v) == Approx(0.3).margin(0.02));  // sd of the mean: 0.0046
  CHECK(v == doubles(run("Bernoulli", probs, {{"seed", 5.0f}})));
  CHECK(run("Bernoulli", probs, {{"seed", 5.0f}, {"dtype", std::int64_t{9}}}).dtype() == DType::Bool);
  try {
    run("Bernoulli", Tensor::from_vector<float>({1}, {1.5f}), {});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.node() == "node_under_test");
    CHECK(std::string(e.what()).find("outside [0, 1]") != std::string::npos);
  }
}

TEST_CASE("Multinomial draws classes with softmax probabilities", "[random]") {
  // Row 0: log-probabilities of 0.25 / 0.75; row 1: class 2 certain (others -inf-like).
  const Tensor logits = Tensor::from_vector<float>({2, 3}, {std::log(0.25f), std::log(0.75f), -1e30f, -1e30f, -1e30f, 0.0f});
  const Tensor y = run("Multinomial", logits, {{"sample_size", std::int64_t{4000}}, {"seed", 2.0f}});
  CHECK(y.dtype() == DType::Int32);
  REQUIRE(y.dims() == std::vector<std::int64_t>{2, 4000});
  const std::vector<double> v = doubles(y);
  const std::vector<double> row0(v.begin(), v.begin() + 4000), row1(v.begin() + 4000, v.end());
  for (double c : row0) REQUIRE((c == 0 || c == 1));
  CHECK(mean(row0) == Approx(0.75).margin(0.03));  // sd of the mean: 0.007
  for (double c : row1) REQUIRE(c == 2);
  CHECK(run("Multinomial", logits, {{"dtype", std::int64_t{7}}}).dtype() == DType::Int64);
}

TEST_CASE("A seeded random op gives the reference's values in the compiled engine, every run", "[random][lower]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{4, 6});
  Node* r = g.add_node("RandomNormalLike", {x}, {"r"}, {{"seed", 11.0f}}, "noise");
  Node* add = g.add_node("Add", {x, r->output(0)}, {"y"}, {}, "add");
  g.add_output(add->output(0));
  infer_shapes(g);
  std::map<std::string, Tensor> feeds{{"x", Tensor::from_vector<float>({4, 6}, std::vector<float>(24, 1.0f))}};
  const std::vector<double> want = doubles(ReferenceExecutor(g).run(feeds).at("y"));
  CompiledModel m = lower::compile(g);
  CHECK(doubles(m.run(feeds).at("y")) == want);
  CHECK(doubles(m.run(feeds).at("y")) == want);
  CHECK(stddev(want) > 0.1);
}

}  // namespace test_reference_random
