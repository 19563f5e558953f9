// Tests of the runtime's per-step profile (ExecContext::profile, CompiledModel::profile_text): the
// numbers the benchmark reports as "framework overhead" come from here.
#include <catch2/catch.hpp>

#include <numeric>
#include <random>

#include "ondine/lower/lower.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_runtime_profile {

using namespace ondine;

namespace {
Tensor random_tensor(const std::vector<std::int64_t>& dims, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Tensor t(DType::Float32, dims);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}
}  // namespace

TEST_CASE("a profiled run accounts each step's time and the time outside steps", "[runtime][profile]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape::from({1, 8, 16, 16}));
  Value* w = g.add_constant("w", random_tensor({8, 8, 3, 3}, 1));
  Value* c = g.add_node("Conv", {x, w}, {"c"}, {{"pads", std::vector<std::int64_t>{1, 1, 1, 1}}}, "conv")->output(0);
  Value* e = g.add_node("Erf", {c}, {"e"}, {}, "erf")->output(0);  // no oneDNN lowering: a reference step
  g.add_output(e);
  lower::CompileOptions options;
  options.threads = 1;
  CompiledModel model = lower::compile(g, options);
  ExecContext ctx = model.make_context();
  std::map<std::string, Tensor> in{{"x", random_tensor({1, 8, 16, 16}, 2)}};

  SECTION("off by default: nothing recorded") {
    model.run(ctx, in);
    CHECK(ctx.profiled_runs() == 0);
    CHECK(model.profile_text(ctx).find("no profiled runs") != std::string::npos);
  }
  SECTION("on: per-step times sum to at most the run time") {
    ctx.profile = true;
    for (int i = 0; i < 3; ++i) model.run(ctx, in);
    REQUIRE(ctx.profiled_runs() == 3);
    double steps = std::accumulate(ctx.step_seconds().begin(), ctx.step_seconds().end(), 0.0);
    CHECK(steps > 0);
    CHECK(steps <= ctx.run_seconds());
    std::string text = model.profile_text(ctx);
    CHECK(text.find("Conv") != std::string::npos);
    CHECK(text.find("Erf") != std::string::npos);
    CHECK(text.find("reference") != std::string::npos);
    CHECK(text.find("framework overhead") != std::string::npos);
    CHECK(text.find("slow paths ") != std::string::npos);  // the Erf, named with its time
    CHECK(text.find("Erf 'erf' reference") != std::string::npos);
    // the slowest nodes by name, each with its op and implementation
    const auto nodes = text.find("slowest nodes:");
    REQUIRE(nodes != std::string::npos);
    CHECK(text.find("Erf 'erf' reference", nodes) != std::string::npos);
    CHECK(text.find("Conv '", nodes) != std::string::npos);
    ctx.reset_profile();
    CHECK(ctx.profiled_runs() == 0);
  }
}

TEST_CASE("slow paths: Ondine's reference kernels and oneDNN's ref implementations, not its RNN kernels",
          "[runtime][profile]") {
  CHECK(StepInfo::is_slow_path("Erf", "reference"));
  CHECK(StepInfo::is_slow_path("Concat", "ref:any"));
  CHECK(StepInfo::is_slow_path("Add", "ref:any"));
  CHECK_FALSE(StepInfo::is_slow_path("GRU", "ref:any"));  // oneDNN's GEMM-based GRU: fast, named "ref"
  CHECK_FALSE(StepInfo::is_slow_path("LSTM", "ref:any"));
  CHECK_FALSE(StepInfo::is_slow_path("Conv", "brgconv:avx512_core"));
  CHECK_FALSE(StepInfo::is_slow_path("Concat", "simple:any"));
  CHECK_FALSE(StepInfo::is_slow_path("Reshape", "view"));

  // A model with none says so.
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape::from({1, 8, 8, 8}));
  Value* w = g.add_constant("w", random_tensor({8, 8, 1, 1}, 1));
  g.add_output(g.add_node("Conv", {x, w}, {"c"}, {}, "conv")->output(0));
  CompiledModel model = lower::compile(g, lower::CompileOptions{});
  ExecContext ctx = model.make_context();
  ctx.profile = true;
  model.run(ctx, {{"x", random_tensor({1, 8, 8, 8}, 2)}});
  CHECK(model.profile_text(ctx).find("slow paths: none") != std::string::npos);
}

}  // namespace test_runtime_profile
