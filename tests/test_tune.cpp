// The tuner (lower/tune.hpp): which knobs it tries for a model, that a caller's setting is kept, the cache
// (a second tune times nothing; another CPU's entry or a corrupt file is not trusted), and that the tuned
// plan computes what the reference does. Which alternative wins depends on the CPU: not checked here
// (bench/ measures it).
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "ondine/lower/lower.hpp"
#include "ondine/lower/tune.hpp"
#include "ondine/reference/executor.hpp"
#include "support.hpp"

namespace test_tune {

using namespace ondine;

// Two 3x3 convolutions (Winograd candidates) and a Linear layer: every float knob applies.
Graph conv_and_linear() {
  test::GraphBuilder b;
  Value* x = b.input("x", {1, 16, 12, 12});
  std::map<std::string, Attribute> same{{"pads", std::vector<std::int64_t>{1, 1, 1, 1}}};
  Value* y = b.op("Relu", {b.op("Conv", {x, b.weight({16, 16, 3, 3}), b.weight({16})}, same)});
  y = b.op("Conv", {y, b.weight({16, 16, 3, 3}), b.weight({16})}, same);
  y = b.op("GlobalAveragePool", {y});
  y = b.op("Flatten", {y});
  y = b.op("MatMul", {y, b.weight({16, 10})});
  b.g.add_output(y);
  infer_shapes(b.g);
  return std::move(b.g);
}

std::string temp_path(const std::string& name) {
  std::string p = std::string(ONDINE_TEST_TMP_DIR) + "/" + name;
  std::remove(p.c_str());
  return p;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_CASE("tune: the knobs that apply, the plan it keeps equal to the reference, decisions in the cache", "[tune]") {
  Graph g = conv_and_linear();
  lower::TuneOptions t;
  t.cache_path = temp_path("tune_cache_basic.txt");
  t.runs = 1;
  std::vector<std::string> progress;
  t.progress = [&](const std::string& s) { progress.push_back(s); };
  lower::TuneResult r = lower::tune(g, {}, t);
  INFO(r.text());
  CHECK_FALSE(r.from_cache);
  std::map<std::string, std::string> knobs;
  for (const auto& d : r.decisions) knobs[d.knob] = d.value;
  CHECK(knobs.count("conv_layout") == 1);
  CHECK(knobs.count("conv_algorithm") == 1);
  CHECK(knobs.count("matmul_kernel") == 1);
  CHECK(knobs.count("precision") == 1);  // fp32 given (the default): the caller's
  CHECK(r.options.precision == lower::Precision::Fp32);
  CHECK_FALSE(progress.empty());
  CHECK(r.text().find("conv_algorithm = ") != std::string::npos);

  // The kept plan computes what the reference does (Winograd within its rounding).
  auto in = test::uniform_tensor({1, 16, 12, 12}, 3);
  auto want = ReferenceExecutor(g).run({{"x", in}});
  auto got = lower::compile(g, r.options).run({{"x", in}});
  CHECK(test::relative_error(got.begin()->second, want.begin()->second) <= 1e-4);

  // The second tune of the same model on this machine is a cache hit: the same decisions, nothing timed.
  const std::string file = read_all(t.cache_path);
  CHECK(file.rfind("ondine-tune 1\n", 0) == 0);
  CHECK(file.find(r.key) != std::string::npos);
  progress.clear();
  lower::TuneResult again = lower::tune(g, {}, t);
  CHECK(again.from_cache);
  CHECK(again.decisions_str() == r.decisions_str());
  CHECK(again.options.conv_algorithm == r.options.conv_algorithm);
  CHECK(again.options.conv_layout == r.options.conv_layout);
  REQUIRE(progress.size() == 1);
  CHECK(progress[0].find("from the cache") != std::string::npos);
}

TEST_CASE("tune: a knob the caller set is not tuned; precision auto makes bf16 a candidate where it is native",
          "[tune]") {
  Graph g = conv_and_linear();
  lower::CompileOptions forced;
  forced.conv_algorithm = lower::ConvAlgorithm::Direct;
  forced.precision = lower::Precision::Auto;
  lower::TuneOptions t;
  t.cache_path = "none";
  t.runs = 1;
  lower::TuneResult r = lower::tune(g, forced, t);
  INFO(r.text());
  CHECK(r.options.conv_algorithm == lower::ConvAlgorithm::Direct);
  bool saw_precision = false;
  for (const auto& d : r.decisions) {
    if (d.knob == "conv_algorithm") {
      CHECK(d.value == "direct");
      CHECK(d.why == "set by the caller");
    }
    if (d.knob == "precision") {
      saw_precision = true;
      CHECK((d.value == "fp32" || d.value == "bf16"));
    }
  }
  CHECK(saw_precision == lower::effective_isa().bf16_native);
  CHECK(r.options.precision != lower::Precision::Auto);  // resolved
}

TEST_CASE("tune: no budget keeps the heuristics, saying so", "[tune]") {
  Graph g = conv_and_linear();
  lower::TuneOptions t;
  t.cache_path = "none";
  t.budget_seconds = 0;
  lower::TuneResult r = lower::tune(g, {}, t);
  INFO(r.text());
  for (const auto& d : r.decisions)
    if (d.knob == "conv_layout") CHECK(d.why.find("budget ran out") != std::string::npos);
  CHECK(r.options.conv_layout == lower::ConvLayout::Auto);
}

TEST_CASE("tune cache: another CPU's entry is not applied, a corrupt file is ignored with a warning naming it",
          "[tune]") {
  Graph g = conv_and_linear();
  lower::TuneOptions t;
  t.cache_path = temp_path("tune_cache_foreign.txt");
  t.runs = 1;
  t.budget_seconds = 0;  // structure only
  std::vector<std::string> warnings;
  t.warn = [&](const std::string& s) { warnings.push_back(s); };
  lower::TuneResult first = lower::tune(g, {}, t);
  CHECK_FALSE(first.from_cache);

  // The same model, tuned on "another CPU": the entry's cpu= differs, so it never matches here.
  std::string file = read_all(t.cache_path);
  const std::size_t cpu = file.find(";cpu=");
  REQUIRE(cpu != std::string::npos);
  file.replace(cpu, 5, ";cpu=Other CPU ");
  std::ofstream(t.cache_path, std::ios::trunc) << file;
  CHECK_FALSE(lower::tune(g, {}, t).from_cache);
  CHECK(warnings.empty());

  // A corrupt file: a warning naming it, nothing trusted, rewritten at the end.
  std::ofstream(t.cache_path, std::ios::trunc) << "not a cache\nmodel=x\n";
  lower::TuneResult r = lower::tune(g, {}, t);
  CHECK_FALSE(r.from_cache);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find(t.cache_path) != std::string::npos);
  CHECK(read_all(t.cache_path).rfind("ondine-tune 1\n", 0) == 0);
  std::ofstream(t.cache_path, std::ios::trunc) << "ondine-tune 1\ngarbage line\n";
  warnings.clear();
  CHECK_FALSE(lower::tune(g, {}, t).from_cache);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("line 2") != std::string::npos);
}

TEST_CASE("tune: an input with symbolic dims is an error naming it", "[tune]") {
  Graph g;
  Value* x = g.add_input("tokens", DType::Float32, Shape{Dim::named("batch"), Dim(4)});
  g.add_output(g.add_node("Relu", {x}, {"y"}, {}, "relu")->output(0));
  lower::TuneOptions t;
  t.cache_path = "none";
  CHECK_THROWS_WITH(lower::tune(g, {}, t), Catch::Contains("'tokens'") && Catch::Contains("bind its symbolic dims"));
}

}  // namespace test_tune
