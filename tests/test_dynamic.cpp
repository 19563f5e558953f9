// The shape-free plan (lower/dynamic.hpp): compiled once, run at any shape. Structure (which plan a
// ShapeCache takes, what runs each node), numbers (every kernel against the reference executor at shapes
// that change from call to call; the exported transformers against PyTorch and against a compile per
// shape; a whole KV-cache decode) and must-not-fire cases (static models, CNNs and bf16 keep one plan per
// shape).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ondine/lower/dynamic.hpp"
#include "ondine/lower/lower.hpp"
#include "ondine/lower/shape_cache.hpp"
#include "ondine/ondine.hpp"
#include "support.hpp"

namespace test_dynamic {

using namespace ondine;
namespace fs = std::filesystem;

namespace {

fs::path corpus_dir(const std::string& model) { return fs::path(ONDINE_TEST_DATA_DIR) / "torch" / model; }

struct Case {
  std::map<std::string, Tensor> inputs, outputs;
};
Case load_case(const std::string& model, int k) {
  Case c;
  const std::string prefix = "case" + std::to_string(k) + ".";
  for (auto& entry : fs::directory_iterator(corpus_dir(model))) {
    const std::string f = entry.path().filename().string();
    if (f.rfind(prefix, 0) != 0 || entry.path().extension() != ".npy") continue;
    const std::string name = f.substr(prefix.size(), f.size() - prefix.size() - 4);
    if (name.rfind("out.", 0) == 0) c.outputs[name.substr(4)] = load_npy(entry.path().string());
    else c.inputs[name] = load_npy(entry.path().string());
  }
  REQUIRE(!c.inputs.empty());
  return c;
}

// Largest |a - b| over max(max |b|, 1e-3): exact zeros on both sides pass.
double rel_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.dims() == b.dims());
  REQUIRE(a.dtype() == b.dtype());
  double err = 0, mag = 1e-3;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.at_double(static_cast<std::size_t>(i)), y = b.at_double(static_cast<std::size_t>(i));
    if (std::isnan(y)) {
      CHECK(std::isnan(x));
      continue;
    }
    err = std::max(err, std::abs(x - y));
    mag = std::max(mag, std::abs(y));
  }
  return err / mag;
}

lower::CompileOptions options(int threads = 2) {
  lower::CompileOptions o;
  o.threads = threads;
  return o;
}

// Runs `g` shape-free and on the reference executor at each of `shapes` (one dims list per input, in the
// graph's input order; inputs random), and checks every output.
void check_against_reference(const Graph& g, const std::vector<std::vector<std::vector<std::int64_t>>>& shapes,
                             double tolerance = 1e-5) {
  lower::DynamicModel model(g.clone(), options());
  INFO(model.to_text());
  CHECK(model.reference_steps() == 0);
  ReferenceExecutor reference(g);
  std::mt19937 rng(7);
  for (const auto& dims : shapes) {
    std::map<std::string, Tensor> in;
    for (std::size_t i = 0; i < g.inputs().size(); ++i) in[g.inputs()[i]->name()] = test::random_tensor(dims[i], rng);
    auto got = model.run(in);
    auto want = reference.run(in);
    for (auto& [name, t] : want) {
      INFO(name << " at " << dims_str(dims[0]));
      CHECK(rel_diff(got.at(name), t) < tolerance);
    }
  }
}

Value* constant(Graph& g, const std::string& name, std::vector<std::int64_t> dims, unsigned seed) {
  return g.add_constant(name, test::uniform_tensor(dims, seed));
}

}  // namespace

TEST_CASE("shape-free kernels: broadcasting binary ops at changing shapes equal the reference", "[lower][shape-free]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{Dim::named("b"), Dim::named("s"), 24});
  Value* y = g.add_input("y", DType::Float32, Shape{Dim::named("b"), 1, 24});
  Value* z = g.add_input("z", DType::Float32, Shape{Dim::named("s"), 1});
  Value* a = g.add_op("Add", {x, y}, {}, "a");                     // [b, s, 24] + [b, 1, 24]
  Value* m = g.add_op("Mul", {a, z}, {}, "m");                     // + a column broadcast
  Value* d = g.add_op("Div", {constant(g, "k", {24}, 3), m}, {}, "d");  // constant first, broadcast rows
  Value* s = g.add_op("Sub", {d, x}, {}, "s");
  g.add_output(s);
  infer_shapes(g);
  check_against_reference(g, {{{1, 5, 24}, {1, 1, 24}, {5, 1}},
                              {{3, 17, 24}, {3, 1, 24}, {17, 1}},
                              {{2, 1, 24}, {2, 1, 24}, {1, 1}},
                              {{2, 300, 24}, {2, 1, 24}, {300, 1}}});
}

TEST_CASE("shape-free kernels: layer norm, softmax, transpose and activations at changing shapes", "[lower][shape-free]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{Dim::named("b"), Dim::named("s"), 40});
  Value* ln = g.add_op("LayerNormalization", {x, constant(g, "scale", {40}, 1), constant(g, "bias", {40}, 2)},
                       {{"axis", std::int64_t{-1}}, {"epsilon", 1e-5f}}, "ln");
  Value* t = g.add_op("Transpose", {ln}, {{"perm", std::vector<std::int64_t>{1, 0, 2}}}, "t");
  Value* t2 = g.add_op("Transpose", {t}, {{"perm", std::vector<std::int64_t>{2, 1, 0}}}, "t2");
  Value* sm = g.add_op("Softmax", {t2}, {{"axis", std::int64_t{-1}}}, "sm");
  Value* th = g.add_op("Tanh", {sm}, {}, "th");
  Value* lsm = g.add_op("LogSoftmax", {ln}, {{"axis", std::int64_t{-1}}}, "lsm");
  Value* r = g.add_op("Sigmoid", {lsm}, {}, "r");
  g.add_output(th);
  g.add_output(r);
  infer_shapes(g);
  // 2 x 20000 x 40 = 1.6M elements: the eltwise chunks and the parallel row loops both see several blocks.
  check_against_reference(g, {{{1, 3, 40}}, {{2, 9, 40}}, {{1, 1, 40}}, {{2, 20000, 40}}});
}

TEST_CASE("shape-free kernels: Split by sizes and into equal parts at changing shapes", "[lower][shape-free]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{Dim::named("b"), Dim::named("s"), 48});
  Value* sizes = g.add_constant("sizes", Tensor::from_vector<std::int64_t>({2}, {16, 32}));
  Node* by_sizes = g.add_node("Split", {x, sizes}, {"a0", "a1"}, {{"axis", std::int64_t{2}}}, "by_sizes");
  Node* equal = g.add_node("Split", {by_sizes->output(1)}, {"b0", "b1"}, {{"axis", std::int64_t{-1}}}, "equal");
  g.add_output(by_sizes->output(0));
  g.add_output(equal->output(0));
  g.add_output(equal->output(1));
  infer_shapes(g);
  check_against_reference(g, {{{1, 2, 48}}, {{3, 7, 48}}, {{2, 0, 48}}, {{1, 5000, 48}}});
}

TEST_CASE("shape-free kernels: matrix products by constant weights and of two activations", "[lower][shape-free]") {
  // The fused forms (bias, residual Sum, GELU) come from the default passes; fewer than 8 rows take the
  // weight-streaming loop, more the run-time-rows matmul, and shapes repeat.
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{Dim::named("b"), Dim::named("s"), 32});
  Value* h = g.add_op("MatMul", {x, constant(g, "w1", {32, 64}, 4)}, {}, "h");
  Value* hb = g.add_op("Add", {h, constant(g, "b1", {64}, 5)}, {}, "hb");
  Value* act = g.add_op("Relu", {hb}, {}, "act");
  Value* o = g.add_op("MatMul", {act, constant(g, "w2", {64, 32}, 6)}, {}, "o");
  Value* res = g.add_op("Add", {o, x}, {}, "res");
  Value* gm = g.add_op("Gemm", {g.add_op("Flatten", {res}, {{"axis", std::int64_t{2}}}, "flat"),
                                constant(g, "w3", {16, 32}, 7), constant(g, "c3", {16}, 8)},
                       {{"transB", std::int64_t{1}}, {"alpha", 0.5f}, {"beta", 2.0f}}, "gemm");
  Value* kt = g.add_op("Transpose", {res}, {{"perm", std::vector<std::int64_t>{0, 2, 1}}}, "kt");
  Value* scores = g.add_op("MatMul", {res, kt}, {}, "scores");  // [b, s, s]: two activations
  g.add_output(gm);
  g.add_output(scores);
  infer_shapes(g);
  lower::DynamicModel model(g.clone(), options());
  INFO(model.to_text());
  CHECK(model.reference_steps() <= 1);  // Flatten: a reshape, on its reference kernel (no copy)
  ReferenceExecutor reference(g);
  std::mt19937 rng(11);
  for (auto dims : std::vector<std::vector<std::int64_t>>{{1, 7, 32}, {2, 5, 32}, {1, 7, 32}, {3, 33, 32}, {1, 7, 32}}) {
    std::map<std::string, Tensor> in{{"x", test::random_tensor(dims, rng)}};
    auto got = model.run(in);
    auto want = reference.run(in);
    for (auto& [name, t] : want) {
      INFO(name << " at " << dims_str(dims));
      CHECK(rel_diff(got.at(name), t) < 1e-5);
    }
  }
}

TEST_CASE("shape-free kernels: a few rows stream the weights (bands of K across threads, bias, sum, activation)",
          "[lower][shape-free]") {
  // K = 130 (bands of four rows and a remainder), N = 200: large enough that threads split K. From 8 rows
  // the run-time-rows matmul; below, the weight-streaming loop, which must give the same numbers.
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{Dim::named("b"), Dim::named("s"), 130});
  Value* r = g.add_input("r", DType::Float32, Shape{Dim::named("b"), Dim::named("s"), 200});
  Value* h = g.add_op("MatMul", {x, constant(g, "w", {130, 200}, 21)}, {}, "h");
  Value* hb = g.add_op("Add", {h, constant(g, "bias", {200}, 22)}, {}, "hb");
  Value* hr = g.add_op("Add", {hb, r}, {}, "residual");
  g.add_output(g.add_op("Tanh", {hr}, {}, "act"));
  infer_shapes(g);
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    lower::DynamicModel model(g.clone(), options(threads));
    INFO(model.to_text());
    CHECK(model.to_text().find("weight-streaming") != std::string::npos);
    ReferenceExecutor reference(g);
    std::mt19937 rng(13);
    for (auto [b, sq] : std::vector<std::pair<int, int>>{{1, 1}, {1, 3}, {1, 7}, {1, 8}, {2, 3}, {3, 9}, {1, 1}}) {
      std::map<std::string, Tensor> in{{"x", test::random_tensor({b, sq, 130}, rng)},
                                       {"r", test::random_tensor({b, sq, 200}, rng)}};
      auto got = model.run(in);
      auto want = reference.run(in);
      INFO("rows " << b * sq);
      for (auto& [name, t] : want) CHECK(rel_diff(got.at(name), t) < 1e-5);
      // The same rows again give the same bits: no kernel changes with what ran before.
      auto again = model.run(in);
      for (auto& [name, t] : got) CHECK(std::memcmp(again.at(name).raw(), t.raw(), t.nbytes()) == 0);
    }
  }
}

TEST_CASE("shape-free kernels: attention with a broadcast mask, fully masked rows NaN as the reference",
          "[lower][shape-free]") {
  Graph g;
  const Dim b = Dim::named("b"), s = Dim::named("s");
  Value* q = g.add_input("q", DType::Float32, Shape{b, 4, s, 8});
  Value* k = g.add_input("k", DType::Float32, Shape{b, 4, 8, Dim::named("t")});
  Value* v = g.add_input("v", DType::Float32, Shape{b, 4, Dim::named("t"), 8});
  Value* mask = g.add_input("mask", DType::Float32, Shape{b, 1, 1, Dim::named("t")});
  Value* y = g.add_node("Attention", {q, k, v, mask}, {"y"}, {{"scale", 0.35f}}, "attn", fused::kDomain)->output(0);
  g.add_output(y);
  infer_shapes(g);
  lower::CompileOptions o = options();
  o.passes = "none";
  lower::DynamicModel model(g.clone(), o);
  CHECK(model.reference_steps() == 0);
  ReferenceExecutor reference(g);
  std::mt19937 rng(3);
  for (auto [batch, sq, sk] : std::vector<std::tuple<int, int, int>>{{1, 1, 9}, {2, 5, 5}, {1, 1, 0 + 1}, {3, 16, 40}}) {
    std::map<std::string, Tensor> in{{"q", test::random_tensor({batch, 4, sq, 8}, rng)},
                                     {"k", test::random_tensor({batch, 4, 8, sk}, rng)},
                                     {"v", test::random_tensor({batch, 4, sk, 8}, rng)},
                                     {"mask", test::random_tensor({batch, 1, 1, sk}, rng)}};
    // The last sample's keys all masked: its rows are NaN in both engines.
    float* m = in["mask"].data<float>();
    for (int j = 0; j < sk; ++j) m[(batch - 1) * sk + j] = batch > 1 ? -std::numeric_limits<float>::infinity() : m[j];
    auto got = model.run(in);
    auto want = reference.run(in);
    INFO("batch " << batch << " sq " << sq << " sk " << sk);
    CHECK(rel_diff(got.at(y->name()), want.at(y->name())) < 1e-5);
  }
}

TEST_CASE("shape-free kernels: attention reads the Transposes around it in place (heads split and merged, a "
          "KV cache's K^T)", "[lower][shape-free]") {
  // Q, K, V as a linear layer gives them, [b, s, heads, dim], split into heads by Transposes; K^T from a
  // cache laid out [b, heads, t, dim] (a decoder's present); the output merged back to [b, s, heads, dim].
  Graph g;
  const Dim b = Dim::named("b"), s = Dim::named("s"), t = Dim::named("t");
  Value* q = g.add_input("q", DType::Float32, Shape{b, s, 4, 8});
  Value* cache = g.add_input("cache", DType::Float32, Shape{b, 4, t, 8});
  Value* v = g.add_input("v", DType::Float32, Shape{b, t, 4, 8});
  auto transpose = [&](Value* x, std::vector<std::int64_t> perm, const std::string& name) {
    return g.add_op("Transpose", {x}, {{"perm", perm}}, name);
  };
  Value* qh = transpose(q, {0, 2, 1, 3}, "q_heads");
  Value* kt = transpose(cache, {0, 1, 3, 2}, "k_t");
  Value* vh = transpose(v, {0, 2, 1, 3}, "v_heads");
  Value* a = g.add_node("Attention", {qh, kt, vh}, {"a"}, {{"scale", 0.35f}}, "attn", fused::kDomain)->output(0);
  Value* y = transpose(a, {0, 2, 1, 3}, "merge");
  Value* kept = transpose(cache, {0, 1, 3, 2}, "kept");  // read by the caller too: stays a step
  g.add_output(y);
  g.add_output(kept);
  infer_shapes(g);
  lower::CompileOptions o = options();
  o.passes = "none";
  lower::DynamicModel model(g.clone(), o);
  const std::string text = model.to_text();
  INFO(text);
  CHECK(text.find("transposes read in place") != std::string::npos);
  CHECK(model.steps().size() == 2);  // the attention and the Transpose whose output is a graph output
  ReferenceExecutor reference(g);
  std::mt19937 rng(5);
  for (auto [batch, sq, sk] : std::vector<std::tuple<int, int, int>>{{1, 1, 9}, {2, 7, 7}, {1, 3, 1}, {3, 16, 40}}) {
    std::map<std::string, Tensor> in{{"q", test::random_tensor({batch, sq, 4, 8}, rng)},
                                     {"cache", test::random_tensor({batch, 4, sk, 8}, rng)},
                                     {"v", test::random_tensor({batch, sk, 4, 8}, rng)}};
    auto got = model.run(in);
    auto want = reference.run(in);
    INFO("batch " << batch << " sq " << sq << " sk " << sk);
    CHECK(rel_diff(got.at(y->name()), want.at(y->name())) < 1e-5);
    CHECK(rel_diff(got.at(kept->name()), want.at(kept->name())) == 0);
  }
  // Values and keys of different lengths: refused (one size per symbol), never read past the cache.
  std::map<std::string, Tensor> bad{{"q", test::random_tensor({1, 2, 4, 8}, rng)},
                                    {"cache", test::random_tensor({1, 4, 3, 8}, rng)},
                                    {"v", test::random_tensor({1, 2, 4, 8}, rng)}};  // 2 values for 3 keys
  CHECK_THROWS_AS(model.run(bad), Error);
}

TEST_CASE("shape-free plan: the exported transformers at every shape equal PyTorch and a compile per shape",
          "[lower][shape-free][corpus]") {
  for (const char* name : {"hf_bert", "gpt2_kv", "llama_kv", "bert_encoder", "gpt_decoder"}) {
    INFO(name);
    Graph g = ondine::onnx::load_model((corpus_dir(name) / "model.onnx").string());
    lower::ShapeCache cache(g.clone(), options());
    REQUIRE(cache.shape_free() != nullptr);
    INFO(cache.shape_free()->to_text());
    CHECK(cache.shape_free()->covers());
    lower::CompileOptions per_shape = options();
    per_shape.shape_plan = lower::ShapePlan::PerShape;
    lower::ShapeCache compiled(g.clone(), per_shape);
    CHECK(compiled.shape_free() == nullptr);
    for (int k = 0; k < 3; ++k) {
      if (!fs::exists(corpus_dir(name) / ("case" + std::to_string(k) + ".input_ids.npy"))) continue;
      INFO("case " << k);
      Case c = load_case(name, k);
      auto got = cache.run(c.inputs);
      auto exact = compiled.run(c.inputs);
      for (auto& [out, expected] : c.outputs) {
        INFO(out);
        CHECK(test::rel_error(got.at(out), expected) < 1e-4);
        CHECK(rel_diff(got.at(out), exact.at(out)) < 1e-5);
      }
    }
    CHECK(cache.compilations() == 0);
  }
}

TEST_CASE("shape-free plan: a greedy decode with a KV cache, 33 steps in one process, equals PyTorch",
          "[lower][shape-free][corpus]") {
  // decode.prompt.npy [1, 8]; then each step feeds the token chosen last with the previous presents as the
  // pasts: decode.logits.npy [33, vocab] holds the last-position logits of the prompt and of the 32 steps,
  // decode.tokens.npy [33] the tokens PyTorch chose.
  const fs::path dir = corpus_dir("gpt2_kv");
  Graph g = ondine::onnx::load_model((dir / "model.onnx").string());
  lower::ShapeCache model(g.clone(), options());
  REQUIRE(model.shape_free() != nullptr);
  const Tensor prompt = load_npy((dir / "decode.prompt.npy").string());
  const Tensor tokens = load_npy((dir / "decode.tokens.npy").string());
  const Tensor logits = load_npy((dir / "decode.logits.npy").string());
  const std::int64_t vocab = logits.dims()[1], steps = logits.dims()[0];
  std::map<std::string, Tensor> in{{"input_ids", prompt}};
  for (const Value* v : g.inputs())
    if (v->name() != "input_ids") in[v->name()] = Tensor(DType::Float32, {1, 4, 0, 16});
  double worst = 0, peak = 0;
  for (std::int64_t step = 0; step < steps; ++step) {
    auto out = model.run(in);
    const Tensor& l = out.at("logits");
    const std::int64_t seq = l.dims()[1];
    const float* last = l.data<float>() + (seq - 1) * vocab;
    std::int64_t best = 0;
    for (std::int64_t j = 0; j < vocab; ++j) {
      worst = std::max(worst, static_cast<double>(std::abs(last[j] - logits.data<float>()[step * vocab + j])));
      peak = std::max(peak, static_cast<double>(std::abs(logits.data<float>()[step * vocab + j])));
      if (last[j] > last[best]) best = j;
    }
    INFO("step " << step);
    REQUIRE(best == tokens.data<std::int64_t>()[step]);
    in["input_ids"] = Tensor::from_vector<std::int64_t>({1, 1}, {best});
    for (auto& [name, t] : out)
      if (name.rfind("present_", 0) == 0) in["past_" + name.substr(8)] = t;
    CHECK(in["past_key_0"].dims()[2] == 8 + step);
  }
  INFO("max |logit - PyTorch| " << worst << " of max " << peak);
  CHECK(worst < 1e-4 * peak);
  CHECK(model.compilations() == 0);
}

TEST_CASE("bound outputs: a decode writes its presents and logits into the caller's buffers, as run() computes them",
          "[lower][shape-free][binding]") {
  const fs::path dir = corpus_dir("gpt2_kv");
  Graph g = ondine::onnx::load_model((dir / "model.onnx").string());
  const Tensor prompt = load_npy((dir / "decode.prompt.npy").string());
  constexpr std::int64_t kMaxLength = 24;  // the caches' capacity: the prompt (8) and 16 steps
  for (auto plan : {lower::ShapePlan::ShapeFree, lower::ShapePlan::PerShape}) {
    INFO(lower::shape_plan_name(plan));
    auto o = options();
    o.shape_plan = plan;
    lower::ShapeCache model(g.clone(), o);
    // Two sets of buffers, swapped per step: a step reads its pasts from one set and writes its presents
    // into the other (a buffer may not be read and written by the same call).
    std::map<std::string, Tensor> buffers[2];
    for (auto& set : buffers) {
      for (const Value* v : g.outputs())
        if (v->name().rfind("present_", 0) == 0) set[v->name()] = Tensor(DType::Float32, {1, 4, kMaxLength, 16});
      set["logits"] = Tensor(DType::Float32, {1, 8, 100});  // room for the prompt's rows
    }
    std::map<std::string, Tensor> in{{"input_ids", prompt}}, plain_in = in;
    for (const Value* v : g.inputs())
      if (v->name() != "input_ids") in[v->name()] = plain_in[v->name()] = Tensor(DType::Float32, {1, 4, 0, 16});
    for (int step = 0; step < 16; ++step) {
      INFO("step " << step);
      const auto& set = buffers[step % 2];
      auto out = model.run(in, set);
      auto want = model.run(plain_in);
      for (auto& [name, t] : want) {
        INFO(name);
        REQUIRE(out.at(name).dims() == t.dims());
        CHECK(std::memcmp(out.at(name).raw(), t.raw(), t.nbytes()) == 0);  // the same kernels, the same bits
        if (set.count(name)) CHECK(out.at(name).raw() == set.at(name).raw());  // in the caller's buffer
      }
      const Tensor& l = out.at("logits");
      const float* last = l.data<float>() + (l.dims()[1] - 1) * 100;
      const std::int64_t best = std::max_element(last, last + 100) - last;
      in["input_ids"] = plain_in["input_ids"] = Tensor::from_vector<std::int64_t>({1, 1}, {best});
      for (auto& [name, t] : out)
        if (name.rfind("present_", 0) == 0) in["past_" + name.substr(8)] = t;
      for (auto& [name, t] : want)
        if (name.rfind("present_", 0) == 0) plain_in["past_" + name.substr(8)] = t;
    }
    CHECK(model.compilations() == (plan == lower::ShapePlan::ShapeFree ? 0u : 16u));
  }
}

TEST_CASE("bound outputs: a short buffer, a wrong dtype or a buffer an input reads is an error naming the output",
          "[lower][shape-free][binding]") {
  Graph g = ondine::onnx::load_model((corpus_dir("gpt2_kv") / "model.onnx").string());
  Case c = load_case("gpt2_kv", 2);  // batch 1, one token, past 7: presents [1, 4, 8, 16]
  for (auto plan : {lower::ShapePlan::ShapeFree, lower::ShapePlan::PerShape}) {
    INFO(lower::shape_plan_name(plan));
    auto o = options();
    o.shape_plan = plan;
    lower::ShapeCache model(g.clone(), o);
    auto expect_error = [&](const std::map<std::string, Tensor>& bound, std::vector<std::string> words) {
      try {
        model.run(c.inputs, bound);
        FAIL("ran");
      } catch (const Error& e) {
        const std::string msg = e.what();
        INFO(msg);
        for (const auto& w : words) CHECK(msg.find(w) != std::string::npos);
      }
    };
    Tensor guard(DType::Float32, {1, 4, 8, 16});
    // One row short: refused before a byte is written past it.
    expect_error({{"present_key_1", Tensor(DType::Float32, {1, 4, 7, 16})}}, {"'present_key_1'", "[1,4,8,16]", "[1,4,7,16]"});
    expect_error({{"present_value_0", Tensor(DType::Int64, {1, 4, 8, 16})}}, {"'present_value_0'", "int64", "float32"});
    expect_error({{"past_key_0", guard}}, {"'past_key_0'", "not an output"});
    expect_error({{"present_key_0", c.inputs.at("past_key_0")}}, {"'present_key_0'", "'past_key_0'", "shares memory"});
    expect_error({{"present_key_0", guard}, {"present_value_0", guard}}, {"'present_key_0'", "'present_value_0'"});
    // The next run is right.
    auto out = model.run(c.inputs, {{"present_key_0", guard}});
    CHECK(out.at("present_key_0").raw() == guard.raw());
    CHECK(test::rel_error(out.at("logits"), c.outputs.at("logits")) < 1e-4);
    CHECK(test::rel_error(guard, c.outputs.at("present_key_0")) < 1e-6);
  }
}

TEST_CASE("KV cache: a decode appends each step's positions in place and equals a run that feeds the presents back",
          "[lower][shape-free][kv-cache]") {
  const fs::path dir = corpus_dir("gpt2_kv");
  Graph g = ondine::onnx::load_model((dir / "model.onnx").string());
  const Tensor prompt = load_npy((dir / "decode.prompt.npy").string());  // [1, 8]
  lower::ShapeCache model(g.clone(), options());
  REQUIRE(model.shape_free() != nullptr);
  // Structure: every past/present pair is found, on the sequence axis.
  const auto pairs = model.shape_free()->kv_pairs();
  REQUIRE(pairs.size() == g.inputs().size() - 1);
  for (const auto& p : pairs) {
    CHECK(p.past.rfind("past_", 0) == 0);
    CHECK(p.present == "present_" + p.past.substr(5));
    CHECK(p.axis == 2);
  }
  runtime::KvCache cache = model.make_kv_cache(24);
  CHECK(cache.buffer(0).dims() == std::vector<std::int64_t>{1, 4, 24, 16});
  CHECK(cache.length() == 0);
  std::map<std::string, Tensor> plain{{"input_ids", prompt}};
  for (const Value* v : g.inputs())
    if (v->name() != "input_ids") plain[v->name()] = Tensor(DType::Float32, {1, 4, 0, 16});
  std::map<std::string, Tensor> in{{"input_ids", prompt}};
  std::vector<const void*> buffers;
  for (std::size_t i = 0; i < pairs.size(); ++i) buffers.push_back(cache.buffer(i).raw());
  for (int step = 0; step < 16; ++step) {
    INFO("step " << step);
    auto out = model.run(in, {}, cache);
    auto want = model.run(plain);
    CHECK(out.size() == 1);  // the logits; the presents stay in the cache
    CHECK(rel_diff(out.at("logits"), want.at("logits")) < 1e-5);
    CHECK(cache.length() == want.at("present_key_0").dims()[2]);
    for (const auto& p : pairs) {
      INFO(p.present);
      CHECK(rel_diff(cache.present(p.present), want.at(p.present)) < 1e-6);
    }
    for (std::size_t i = 0; i < pairs.size(); ++i) CHECK(cache.buffer(i).raw() == buffers[i]);  // never moved
    const Tensor& l = want.at("logits");
    const float* last = l.data<float>() + (l.dims()[1] - 1) * 100;
    const std::int64_t best = std::max_element(last, last + 100) - last;
    in["input_ids"] = plain["input_ids"] = Tensor::from_vector<std::int64_t>({1, 1}, {best});
    for (auto& [name, t] : want)
      if (name.rfind("present_", 0) == 0) plain["past_" + name.substr(8)] = t;
  }
  CHECK(model.compilations() == 0);

  {  // a batch of two sequences
    runtime::KvCache two = model.make_kv_cache(12, {{"batch", 2}});
    CHECK(two.buffer(0).dims() == std::vector<std::int64_t>{2, 4, 12, 16});
    std::vector<std::int64_t> ids(16);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i * 7 % 100);
    std::map<std::string, Tensor> feed{{"input_ids", Tensor::from_vector<std::int64_t>({2, 8}, ids)}}, full = feed;
    for (const Value* v : g.inputs())
      if (v->name() != "input_ids") full[v->name()] = Tensor(DType::Float32, {2, 4, 0, 16});
    auto out = model.run(feed, {}, two);
    auto want = model.run(full);
    CHECK(rel_diff(out.at("logits"), want.at("logits")) < 1e-5);
    CHECK(rel_diff(two.present("present_value_1"), want.at("present_value_1")) < 1e-6);
  }
}

TEST_CASE("KV cache: grouped-query attention (Llama-style) reads its KV heads in the cache, unrepeated",
          "[lower][shape-free][kv-cache][gqa]") {
  const fs::path dir = corpus_dir("llama_kv");
  Graph g = ondine::onnx::load_model((dir / "model.onnx").string());
  lower::ShapeCache model(g.clone(), options());
  REQUIRE(model.shape_free() != nullptr);
  const std::string text = model.shape_free()->to_text();
  INFO(text);
  CHECK(text.find("self_attn/Expand") == std::string::npos);  // repeat_kv is gone: 2 KV heads read for 4
  const auto pairs = model.shape_free()->kv_pairs();
  REQUIRE(pairs.size() == 4);
  for (const auto& p : pairs) {
    CHECK(p.past.rfind("past_key_values.", 0) == 0);
    CHECK(p.axis == 2);
  }
  runtime::KvCache cache = model.make_kv_cache(16);
  CHECK(cache.buffer(0).dims() == std::vector<std::int64_t>{1, 2, 16, 16});
  const Tensor prompt = load_npy((dir / "decode.prompt.npy").string());
  const std::int64_t vocab = load_npy((dir / "decode.logits.npy").string()).dims()[1];
  auto feed = [](const Tensor& ids, std::int64_t past) {
    const std::int64_t seq = ids.dims()[1];
    std::vector<std::int64_t> positions(static_cast<std::size_t>(seq));
    for (std::int64_t i = 0; i < seq; ++i) positions[static_cast<std::size_t>(i)] = past + i;
    return std::map<std::string, Tensor>{
        {"input_ids", ids},
        {"attention_mask", Tensor::from_vector<std::int64_t>({1, past + seq}, std::vector<std::int64_t>(past + seq, 1))},
        {"position_ids", Tensor::from_vector<std::int64_t>({1, seq}, positions)}};
  };
  std::map<std::string, Tensor> pasts;
  for (const Value* v : g.inputs())
    if (v->name().rfind("past_key_values.", 0) == 0) pasts[v->name()] = Tensor(DType::Float32, {1, 2, 0, 16});
  Tensor ids = prompt;
  std::int64_t past = 0;
  for (int step = 0; step < 6; ++step) {
    INFO("step " << step);
    auto in = feed(ids, past);
    auto out = model.run(in, {}, cache);
    auto plain_in = in;
    plain_in.insert(pasts.begin(), pasts.end());
    auto want = model.run(plain_in);
    CHECK(rel_diff(out.at("logits"), want.at("logits")) < 1e-5);
    for (const auto& p : pairs) CHECK(rel_diff(cache.present(p.present), want.at(p.present)) < 1e-6);
    const Tensor& l = want.at("logits");
    const float* last = l.data<float>() + (l.dims()[1] - 1) * vocab;
    const std::int64_t best = std::max_element(last, last + vocab) - last;
    past += ids.dims()[1];
    ids = Tensor::from_vector<std::int64_t>({1, 1}, {best});
    for (const auto& p : pairs) pasts[p.past] = want.at(p.present);
  }
  CHECK(model.compilations() == 0);
}

TEST_CASE("KV cache: a full cache, a past given twice, a bound present or a cache of another model is an error",
          "[lower][shape-free][kv-cache]") {
  const fs::path dir = corpus_dir("gpt2_kv");
  Graph g = ondine::onnx::load_model((dir / "model.onnx").string());
  const Tensor prompt = load_npy((dir / "decode.prompt.npy").string());  // [1, 8]
  lower::ShapeCache model(g.clone(), options());
  auto expect_error = [&](auto&& call, std::vector<std::string> words) {
    try {
      call();
      FAIL("ran");
    } catch (const Error& e) {
      const std::string msg = e.what();
      INFO(msg);
      for (const auto& w : words) CHECK(msg.find(w) != std::string::npos);
    }
  };
  runtime::KvCache cache = model.make_kv_cache(9);
  const Tensor token = Tensor::from_vector<std::int64_t>({1, 1}, {5});
  model.run({{"input_ids", prompt}}, {}, cache);
  model.run({{"input_ids", token}}, {}, cache);
  CHECK(cache.length() == 9);
  expect_error([&] { model.run({{"input_ids", token}}, {}, cache); }, {"holds 9 positions", "9 cached", "1 new", "present_"});
  CHECK(cache.length() == 9);  // as before the failed step
  expect_error([&] { model.run({{"input_ids", token}, {"past_key_0", Tensor(DType::Float32, {1, 4, 9, 16})}}, {}, cache); },
               {"'past_key_0'", "KV cache"});
  expect_error([&] { model.run({{"input_ids", token}}, {{"present_key_1", Tensor(DType::Float32, {1, 4, 16, 16})}}, cache); },
               {"'present_key_1'", "KV cache"});
  runtime::KvCache other;
  expect_error([&] { model.run({{"input_ids", token}}, {}, other); }, {"another model"});
  expect_error([&] { model.run({{"input_ids", Tensor::from_vector<std::int64_t>({2, 1}, {1, 2})}}, {}, cache); },
               {"'batch'", "'input_ids'"});
  expect_error([&] { model.make_kv_cache(0); }, {"capacity"});
  // After reset() the cache holds a new sequence.
  cache.reset();
  auto out = model.run({{"input_ids", prompt}}, {}, cache);
  CHECK(cache.length() == 8);
  CHECK(out.at("logits").dims() == std::vector<std::int64_t>{1, 8, 100});
}

TEST_CASE("KV cache: must not fire without past/present pairs or without the shape-free plan",
          "[lower][shape-free][kv-cache]") {
  lower::ShapeCache encoder(ondine::onnx::load_model((corpus_dir("hf_bert") / "model.onnx").string()), options());
  REQUIRE(encoder.shape_free() != nullptr);
  CHECK(encoder.shape_free()->kv_pairs().empty());
  CHECK_THROWS_WITH(encoder.make_kv_cache(16), Catch::Contains("no KV cache pairs"));
  auto o = options();
  o.shape_plan = lower::ShapePlan::PerShape;
  lower::ShapeCache per_shape(ondine::onnx::load_model((corpus_dir("gpt2_kv") / "model.onnx").string()), o);
  CHECK_THROWS_WITH(per_shape.make_kv_cache(16), Catch::Contains("shape-free plan"));
}

TEST_CASE("shape-free plan: bad inputs name the inputs and the dim, never crash", "[lower][shape-free]") {
  const fs::path dir = corpus_dir("gpt2_kv");
  lower::ShapeCache model(ondine::onnx::load_model((dir / "model.onnx").string()), options());
  REQUIRE(model.shape_free() != nullptr);
  Case c = load_case("gpt2_kv", 2);  // batch 1, one token, past 7
  auto expect_error = [&](std::map<std::string, Tensor> in, std::vector<std::string> words) {
    try {
      model.run(in);
      FAIL("ran");
    } catch (const Error& e) {
      const std::string msg = e.what();
      INFO(msg);
      for (const auto& w : words) CHECK(msg.find(w) != std::string::npos);
    }
  };
  auto in = c.inputs;
  in["past_key_1"] = Tensor(DType::Float32, {2, 4, 7, 16});  // batch 2 against input_ids' batch 1
  expect_error(in, {"'batch'", "'past_key_1'", "'input_ids'"});
  in = c.inputs;
  in["past_value_0"] = Tensor(DType::Float32, {1, 3, 7, 16});  // 3 heads: the model has 4
  expect_error(in, {"'past_value_0'", "4", "3"});
  in = c.inputs;
  in["input_ids"] = Tensor::from_vector<std::int64_t>({1, 1}, {100000});  // past the vocabulary
  expect_error(in, {"Gather"});
  // The next run is right.
  auto out = model.run(c.inputs);
  CHECK(test::rel_error(out.at("logits"), c.outputs.at("logits")) < 1e-4);
}

TEST_CASE("shape-free plan: must not fire where one plan per shape is right", "[lower][shape-free]") {
  SECTION("static input shapes keep their compiled plan") {
    Graph g = ondine::onnx::load_model((corpus_dir("hf_bert") / "model.onnx").string());
    bind_dims(g, {{"batch", 1}, {"seq", 7}});
    lower::ShapeCache cache(std::move(g), options());
    CHECK(cache.shape_free() == nullptr);
    CHECK(cache.shape_plan_reason().find("static") != std::string::npos);
    cache.run(load_case("hf_bert", 0).inputs);
    CHECK(cache.compilations() == 1);
  }
  SECTION("a convolutional network with symbolic dims compiles per shape") {
    lower::ShapeCache cache(ondine::onnx::load_model((corpus_dir("unet") / "model.onnx").string()), options());
    CHECK(cache.shape_free() == nullptr);
    INFO(cache.shape_plan_reason());
    CHECK(cache.shape_plan_reason().find("Conv") != std::string::npos);
  }
  SECTION("per-shape asked for") {
    lower::CompileOptions o = options();
    o.shape_plan = lower::ShapePlan::PerShape;
    lower::ShapeCache cache(ondine::onnx::load_model((corpus_dir("hf_bert") / "model.onnx").string()), o);
    CHECK(cache.shape_free() == nullptr);
  }
  SECTION("bf16 compiles per shape (the shape-free plan is fp32)") {
    if (!lower::effective_isa().bf16_native) return;
    lower::CompileOptions o = options();
    o.precision = lower::Precision::Bf16;
    lower::ShapeCache cache(ondine::onnx::load_model((corpus_dir("hf_bert") / "model.onnx").string()), o);
    CHECK(cache.shape_free() == nullptr);
    CHECK(cache.shape_plan_reason().find("bf16") != std::string::npos);
  }
}

TEST_CASE("unnamed dims ('?') bind from the inputs like named ones, in both plans", "[lower][shape-free][symbolic]") {
  // A voice-activity-style input float32[?, ?]: no dim_param to bind by name.
  Graph g;
  Value* x = g.add_input("input", DType::Float32, Shape{Dim(), Dim()});
  Value* y = g.add_op("Add", {g.add_op("Softmax", {x}, {{"axis", std::int64_t{-1}}}, "sm"), x}, {}, "y");
  g.add_output(g.add_op("MatMul", {y, constant(g, "w", {6, 3}, 9)}, {}, "out"));
  infer_shapes(g);
  for (auto plan : {lower::ShapePlan::Auto, lower::ShapePlan::PerShape}) {
    lower::CompileOptions o = options();
    o.shape_plan = plan;
    lower::ShapeCache cache(g.clone(), o);
    CHECK((cache.shape_free() != nullptr) == (plan == lower::ShapePlan::Auto));
    std::mt19937 rng(5);
    for (std::int64_t rows : {2, 9}) {
      std::map<std::string, Tensor> in{{"input", test::random_tensor({rows, 6}, rng)}};
      CHECK(rel_diff(cache.run(in).at("out"), ReferenceExecutor(g).run(in).at("out")) < 1e-5);
    }
  }
}

TEST_CASE("shape-free plan: memory comes back to the pool; repeated shapes allocate nothing new", "[lower][shape-free]") {
  lower::DynamicModel model(ondine::onnx::load_model((corpus_dir("hf_bert") / "model.onnx").string()), options());
  Case big = load_case("hf_bert", 2), small = load_case("hf_bert", 0);
  model.run(big.inputs);
  model.run(small.inputs);
  const std::size_t after_warmup = model.pool().bytes();
  for (int i = 0; i < 3; ++i) {
    model.run(small.inputs);
    model.run(big.inputs);
  }
  CHECK(model.pool().bytes() == after_warmup);
  CHECK(model.pool().idle_bytes() == model.pool().bytes());  // nothing held after the runs (outputs dropped)
}

}  // namespace test_dynamic
