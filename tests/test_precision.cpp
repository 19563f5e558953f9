// Precision::Bf16: convolutions in bfloat16 where the CPU has native bf16, checked against the reference
// executor (fp32) within a stated bound; bf16 activations stay bf16 between convolutions (no reorder there)
// and become float32 wherever anything else reads them; refused, with the reason, where oneDNN would
// emulate bf16.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "ondine/lower/lower.hpp"
#include "ondine/reference/executor.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_precision {

using namespace ondine;
using Dims = std::vector<std::int64_t>;

namespace {

// U(-scale, scale) float32 values from their own seed.
Tensor random_tensor(const Dims& dims, unsigned seed, float scale = 1.0f) {
  return test::uniform_tensor(dims, seed, -scale, scale);
}

// A small residual CNN: conv -> relu -> conv (+ x) -> relu -> maxpool -> conv -> global pool -> output, and the
// first conv's output also a graph output (so it must be float32).
Graph residual_cnn() {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{2, 16, 12, 12});
  auto conv = [&](Value* in, std::int64_t channels, std::int64_t out, std::int64_t k, unsigned seed,
                  const std::string& name) {
    Value* w = g.add_constant(name + ".w", random_tensor({out, channels, k, k}, seed, 0.25f));
    Value* b = g.add_constant(name + ".b", random_tensor({out}, seed + 100, 0.1f));
    return g.add_node("Conv", {in, w, b}, {name}, {{"pads", Dims{k / 2, k / 2, k / 2, k / 2}}}, name)->output(0);
  };
  Value* c1 = conv(x, 16, 16, 3, 1, "c1");
  Value* r1 = g.add_node("Relu", {c1}, {"r1"}, {}, "r1")->output(0);
  Value* c2 = conv(r1, 16, 16, 3, 2, "c2");
  Value* sum = g.add_node("Add", {c2, x}, {"sum"}, {}, "sum")->output(0);
  Value* r2 = g.add_node("Relu", {sum}, {"r2"}, {}, "r2")->output(0);
  Value* p = g.add_node("MaxPool", {r2}, {"p"}, {{"kernel_shape", Dims{2, 2}}, {"strides", Dims{2, 2}}}, "p")->output(0);
  Value* c3 = conv(p, 16, 32, 1, 3, "c3");
  Value* gap = g.add_node("GlobalAveragePool", {c3}, {"gap"}, {}, "gap")->output(0);
  g.add_output(gap);
  g.add_output(r1);
  return g;
}

// `g` with its shapes inferred, compiled with Precision::Bf16.
CompiledModel compile_bf16(Graph& g) {
  infer_shapes(g);
  lower::CompileOptions options;
  options.precision = lower::Precision::Bf16;
  return lower::compile(g, options);
}

}  // namespace

TEST_CASE("precision bf16: convolutions in bfloat16 within 3% of fp32, bf16 kept between them", "[lower][bf16]") {
  Graph g = residual_cnn();
  infer_shapes(g);
  lower::CompileOptions options;
  options.precision = lower::Precision::Bf16;
  if (!lower::effective_isa().bf16_native) {
    // oneDNN would emulate bf16 here: refused, naming the ISA.
    CHECK_THROWS_WITH(lower::compile(g, options), Catch::Contains("needs a CPU with native bf16") &&
                                                      Catch::Contains(lower::effective_isa().name));
    return;
  }
  std::map<std::string, Tensor> in{{"x", random_tensor({2, 16, 12, 12}, 7)}};
  auto want = ReferenceExecutor(g).run(in);
  CompiledModel model = lower::compile(g, options);
  auto got = model.run(in);
  INFO(model.to_text());
  for (const char* out : {"gap", "r1"}) {
    INFO(out);
    double err = test::rel_error(got.at(out), want.at(out));
    CHECK(err < 3e-2);
    CHECK(err > 0);  // bf16 rounding shows: the convolutions did run in bf16
  }
  std::size_t bf16_convs = 0, reorders_to_bf16 = 0;
  for (const StepInfo& s : model.steps()) {
    if (s.op.find("Conv") != std::string::npos && s.implementation.find("bf16") != std::string::npos) ++bf16_convs;
    if (s.op == "Reorder" && s.detail.find("bf16") != std::string::npos) ++reorders_to_bf16;
  }
  CHECK(bf16_convs == 3);
  // c1's output is a graph output (f32) and c2's Sum operand x is the f32 input: those two are converted; c2
  // writes bf16 only if conv readers alone read it (here MaxPool does: f32). No conversion between c1 and c2's
  // source other than r1 (a graph output, f32) into bf16.
  CHECK(reorders_to_bf16 <= 4);

  // fp32 stays bit-for-bit what it was: the default.
  lower::CompileOptions fp32;
  auto plain = lower::compile(g, fp32).run(in);
  CHECK(test::rel_error(plain.at("gap"), want.at("gap")) < 1e-5);
}

TEST_CASE("precision bf16: a chain of convolutions passes bf16 from one to the next", "[lower][bf16]") {
  if (!lower::effective_isa().bf16_native) return;  // refusal: the test above
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{1, 32, 10, 10});
  Value* v = x;
  for (int i = 0; i < 4; ++i) {
    Value* w = g.add_constant("w" + std::to_string(i), random_tensor({32, 32, 1, 1}, 10 + i, 0.3f));
    v = g.add_node("Conv", {v, w}, {"c" + std::to_string(i)}, {}, "c" + std::to_string(i))->output(0);
    v = g.add_node("Relu", {v}, {"r" + std::to_string(i)}, {}, "r" + std::to_string(i))->output(0);
  }
  g.add_output(v);
  CompiledModel model = compile_bf16(g);
  INFO(model.to_text());
  std::size_t reorders = 0;
  for (const StepInfo& s : model.steps()) reorders += s.op == "Reorder";
  CHECK(reorders <= 2);  // the input into bf16 (and at most one out): none between the convolutions
  std::map<std::string, Tensor> in{{"x", random_tensor({1, 32, 10, 10}, 3)}};
  CHECK(test::rel_error(model.run(in).at(v->name()), ReferenceExecutor(g).run(in).at(v->name())) < 3e-2);
}

TEST_CASE("precision auto: bf16 where the CPU's bf16 is native and faster, fp32 elsewhere without refusal",
          "[lower][bf16]") {
  const bool native = lower::effective_isa().bf16_faster;
  CHECK(lower::resolved_precision(lower::Precision::Auto) == (native ? lower::Precision::Bf16 : lower::Precision::Fp32));
  CHECK(lower::resolved_precision(lower::Precision::Fp32) == lower::Precision::Fp32);
  Graph g = residual_cnn();
  infer_shapes(g);
  lower::CompileOptions options;
  options.precision = lower::Precision::Auto;
  CompiledModel model = lower::compile(g, options);
  CHECK(model.bf16_nodes().size() == (native ? 3u : 0u));
  std::map<std::string, Tensor> in{{"x", random_tensor({2, 16, 12, 12}, 4)}};
  CHECK(test::rel_error(model.run(in).at("gap"), ReferenceExecutor(g).run(in).at("gap")) < 3e-2);
}

TEST_CASE("precision bf16: glob patterns of keep_fp32", "[lower][bf16]") {
  using lower::glob_match;
  CHECK(glob_match("c2", "c2"));
  CHECK_FALSE(glob_match("c2", "c21"));
  CHECK(glob_match("c*", "c21"));
  CHECK(glob_match("*/head/*", "/model/head/Conv"));
  CHECK_FALSE(glob_match("*/head/*", "/model/heads"));
  CHECK(glob_match("c?", "c3"));
  CHECK_FALSE(glob_match("c?", "c"));
  CHECK(glob_match("*", ""));
  CHECK(glob_match("a*b*c", "axxbyyc"));
  CHECK_FALSE(glob_match("a*b*c", "axxbyy"));
}

TEST_CASE("precision bf16: keep_fp32 keeps the matching convolutions float32 and says so", "[lower][bf16]") {
  if (!lower::effective_isa().bf16_native) return;  // refusal: the first test
  // The chain of four 1x1 convolutions with c1 and c2 kept fp32: those two read and write float32; the
  // activations between c0 and c1, and c2 and c3, are converted; the plan's log names them.
  Graph g;
  Value* v = g.add_input("x", DType::Float32, Shape{1, 32, 10, 10});
  for (int i = 0; i < 4; ++i) {
    Value* w = g.add_constant("w" + std::to_string(i), random_tensor({32, 32, 1, 1}, 10 + i, 0.3f));
    v = g.add_node("Conv", {v, w}, {"c" + std::to_string(i)}, {}, "c" + std::to_string(i))->output(0);
    v = g.add_node("Relu", {v}, {"r" + std::to_string(i)}, {}, "r" + std::to_string(i))->output(0);
  }
  g.add_output(v);
  infer_shapes(g);
  lower::CompileOptions options;
  options.precision = lower::Precision::Bf16;
  options.keep_fp32 = {"c1", "c?x", "c2"};  // one pattern matches nothing
  std::vector<std::string> log;
  options.log = [&](const std::string& line) { log.push_back(line); };
  CompiledModel model = lower::compile(g, options);
  INFO(model.to_text());
  std::map<std::string, std::string> conv_detail;
  for (const StepInfo& s : model.steps())
    if (s.op.find("Conv") != std::string::npos) conv_detail[s.name] = s.detail;
  REQUIRE(conv_detail.size() == 4);
  CHECK(conv_detail["c0"].find("bf16") != std::string::npos);
  CHECK(conv_detail["c1"].find("bf16") == std::string::npos);
  CHECK(conv_detail["c2"].find("bf16") == std::string::npos);
  CHECK(conv_detail["c3"].find("bf16") != std::string::npos);
  bool said = false;
  for (const std::string& line : log)
    said |= line == "precision: bf16 in 2 of 4 convolutions, matrix products with constant weights, attention and recurrent layers; "
                     "kept fp32: 'c1' 'c2'";
  CHECK(said);
  std::map<std::string, Tensor> in{{"x", random_tensor({1, 32, 10, 10}, 3)}};
  CHECK(test::rel_error(model.run(in).at(v->name()), ReferenceExecutor(g).run(in).at(v->name())) < 3e-2);
}

TEST_CASE("precision bf16: under an error bound the most sensitive nodes are kept fp32 until it holds", "[lower][bf16]") {
  if (!lower::effective_isa().bf16_native) return;  // refusal: the first test
  Graph g = residual_cnn();
  infer_shapes(g);
  std::vector<std::map<std::string, Tensor>> samples{{{"x", random_tensor({2, 16, 12, 12}, 5)}}};
  lower::CompileOptions options;
  SECTION("a loose bound: all bf16, nothing ranked") {
    lower::Bf16BoundOptions bo;
    bo.max_error = 0.5;
    lower::Bf16BoundResult r = lower::compile_bf16_within(g, options, samples, bo);
    CHECK(r.met);
    CHECK(r.kept.empty());
    CHECK(r.ranking.empty());
    CHECK(r.initial_error > 0);  // bf16 shows
    CHECK(r.model.bf16_nodes().size() == 3);
  }
  SECTION("a bound bf16 cannot meet: nodes kept one at a time, worst first, until it holds") {
    lower::Bf16BoundOptions bo;
    bo.max_error = 1e-7;
    std::vector<std::string> progress;
    bo.progress = [&](const std::string& line) { progress.push_back(line); };
    lower::Bf16BoundResult r = lower::compile_bf16_within(g, options, samples, bo);
    CHECK(r.ranking.size() == 3);
    for (std::size_t i = 1; i < r.ranking.size(); ++i) CHECK(r.ranking[i - 1].second >= r.ranking[i].second);
    CHECK(r.met);
    CHECK(r.kept.size() == 3);  // every conv: the fp32 compile itself, error 0
    CHECK(r.error == 0.0);
    CHECK(r.model.bf16_nodes().empty());
    REQUIRE(progress.size() == 6);  // ranking 1/3 .. 3/3, fallback 1 .. 3
    CHECK_THAT(progress.front(), Catch::StartsWith("ranking 1/3 '"));
  }
  SECTION("max_fallbacks stops early and says the bound is not met") {
    lower::Bf16BoundOptions bo;
    bo.max_error = 1e-7;
    bo.max_fallbacks = 1;
    lower::Bf16BoundResult r = lower::compile_bf16_within(g, options, samples, bo);
    CHECK(r.kept.size() == 1);
    CHECK(r.kept.front() == r.ranking.front().first);
    CHECK_FALSE(r.met);
    CHECK(r.error <= r.initial_error * 1.5);
  }
  SECTION("auto: timed against fp32, the faster kept; a bound bf16 misses gives fp32") {
    if (!lower::effective_isa().bf16_faster) return;  // auto is fp32 here without timing: the test above
    options.precision = lower::Precision::Auto;
    lower::Bf16BoundOptions bo;
    bo.max_error = 0.5;
    lower::Bf16BoundResult r = lower::compile_bf16_within(g, options, samples, bo);
    CHECK(r.met);
    CHECK(r.bf16_ms > 0);
    CHECK(r.fp32_ms > 0);
    // Which one wins depends on the CPU; the choice must follow the timings and show in the model.
    CHECK(r.chose_fp32 == (r.bf16_ms > r.fp32_ms * (1.0 - lower::kAutoMinGain)));
    CHECK(r.model.bf16_nodes().empty() == r.chose_fp32);
    bo.max_error = 1e-7;
    bo.max_fallbacks = 1;  // cannot meet it
    lower::Bf16BoundResult missed = lower::compile_bf16_within(g, options, samples, bo);
    CHECK_FALSE(missed.met);
    CHECK(missed.chose_fp32);
    CHECK(missed.model.bf16_nodes().empty());
  }
  SECTION("bad bounds and no samples are errors") {
    lower::Bf16BoundOptions bo;
    bo.max_error = -1;
    CHECK_THROWS_WITH(lower::compile_bf16_within(g, options, samples, bo), Catch::Contains("finite number >= 0"));
    CHECK_THROWS_WITH(lower::compile_bf16_within(g, options, {}), Catch::Contains("at least one sample"));
  }
}

TEST_CASE("precision bf16: matrix products with constant weights in bfloat16, outputs float32", "[lower][bf16]") {
  if (!lower::effective_isa().bf16_native) return;  // refusal: the first test
  // An MLP block as transformers have it: MatMul + bias + Relu, then Gemm (transB) + residual Add, and a
  // MatMul of two runtime values (no constant weights: stays float32).
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{2, 8, 64});
  Value* w1 = g.add_constant("w1", random_tensor({64, 128}, 1, 0.2f));
  Value* b1 = g.add_constant("b1", random_tensor({128}, 2, 0.1f));
  Value* h = g.add_node("MatMul", {x, w1}, {"h"}, {}, "fc1")->output(0);
  h = g.add_node("Add", {h, b1}, {"hb"}, {}, "bias1")->output(0);
  h = g.add_node("Relu", {h}, {"hr"}, {}, "act")->output(0);
  Value* flat = g.add_node("Reshape", {h, g.add_constant("shape", Tensor::from_vector<std::int64_t>({2}, {16, 128}))},
                           {"flat"}, {}, "flat")->output(0);
  Value* w2 = g.add_constant("w2", random_tensor({64, 128}, 3, 0.2f));
  Value* y = g.add_node("Gemm", {flat, w2}, {"y"}, {{"transB", std::int64_t{1}}}, "fc2")->output(0);
  Value* xr = g.add_node("Reshape", {x, g.add_constant("shape2", Tensor::from_vector<std::int64_t>({2}, {16, 64}))},
                         {"xr"}, {}, "xr")->output(0);
  Value* out = g.add_node("Add", {y, xr}, {"out"}, {}, "residual")->output(0);
  Value* scores = g.add_node("MatMul", {xr, g.add_node("Transpose", {xr}, {"xt"}, {}, "t")->output(0)}, {"scores"}, {},
                             "scores")->output(0);
  g.add_output(out);
  g.add_output(scores);
  CompiledModel model = compile_bf16(g);
  INFO(model.to_text());
  std::map<std::string, Tensor> in{{"x", random_tensor({2, 8, 64}, 9)}};
  auto got = model.run(in);
  auto want = ReferenceExecutor(g).run(in);
  CHECK(test::rel_error(got.at("out"), want.at("out")) < 3e-2);
  CHECK(test::rel_error(got.at("out"), want.at("out")) > 0);
  CHECK(test::rel_error(got.at("scores"), want.at("scores")) < 1e-5);  // runtime operands: float32
  std::size_t bf16_products = 0;
  for (const StepInfo& s : model.steps())
    if ((s.op.find("MatMul") != std::string::npos || s.op.find("Gemm") != std::string::npos) &&
        s.detail.find(":bf16") != std::string::npos)
      ++bf16_products;
  CHECK(bf16_products == 2);
}

TEST_CASE("precision bf16: a matrix product read only by bf16 matrix products writes bf16", "[lower][bf16]") {
  if (!lower::effective_isa().bf16_native) return;  // refusal: the first test
  // A transformer's FFN: MatMul + bias + Gelu (as erf) -> MatMul. The first writes its result in bf16 and the
  // second reads it as it is (no Reorder between them). Must not fire: a result that anything else also reads
  // (here a graph output), or whose reader is kept fp32.
  auto ffn = [](bool tap) {
    Graph g;
    Value* x = g.add_input("x", DType::Float32, Shape{2, 12, 32});
    Value* h = g.add_node("MatMul", {x, g.add_constant("w1", random_tensor({32, 96}, 1, 0.3f))}, {"h"}, {}, "fc1")->output(0);
    h = g.add_node("Add", {h, g.add_constant("b1", random_tensor({96}, 2, 0.1f))}, {"hb"}, {}, "bias1")->output(0);
    h = g.add_node("Relu", {h}, {"hr"}, {}, "act")->output(0);
    Value* y = g.add_node("MatMul", {h, g.add_constant("w2", random_tensor({96, 32}, 3, 0.3f))}, {"y"}, {}, "fc2")->output(0);
    g.add_output(y);
    if (tap) g.add_output(h);
    return g;
  };
  auto count_reorders = [](const CompiledModel& m) {
    std::size_t k = 0;
    for (const StepInfo& s : m.steps()) k += s.op == "Reorder";
    return k;
  };
  auto writes_bf16 = [](const CompiledModel& m, const std::string& name) {
    for (const StepInfo& s : m.steps())
      if (s.name == name) return s.detail.size() >= 5 && s.detail.compare(s.detail.size() - 5, 5, " bf16") == 0;
    return false;
  };
  std::map<std::string, Tensor> in{{"x", random_tensor({2, 12, 32}, 9)}};
  for (int variant = 0; variant < 3; ++variant) {
    INFO("variant " << variant);
    Graph g = ffn(variant == 1);
    infer_shapes(g);
    lower::CompileOptions options;
    options.precision = lower::Precision::Bf16;
    if (variant == 2) options.keep_fp32 = {"fc2"};
    CompiledModel model = lower::compile(g, options);
    INFO(model.to_text());
    auto got = model.run(in);
    auto want = ReferenceExecutor(g).run(in);
    for (auto& [name, w] : want) CHECK(test::rel_error(got.at(name), w) < 3e-2);
    CHECK(writes_bf16(model, "fc1") == (variant == 0));
    // x into bf16; with the tap, fc1's float32 result into bf16 too; fc2 kept fp32 reads it as it is.
    CHECK(count_reorders(model) == (variant == 1 ? 2u : 1u));
  }
}

}  // namespace test_precision
