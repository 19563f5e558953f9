// fuse-attention and ondine.Attention:
// - structure: every attention of the PyTorch-exported corpus (nn.MultiheadAttention's 3-D form, the
//   Hugging Face-style 4-D form with a run-time causal mask, torchvision's ViT) becomes one node;
// - numbers: the graph before and after the pass agree on the reference executor (1e-5), and the
//   compiled node agrees with its reference kernel (1e-4) for each mask form the lowering handles
//   (none, [P,1,S,S], [P,1,1,S], broadcast over the batch, a constant one it expands, a boolean one);
// - must-not-fire: a mask of a higher rank, a softmax on another axis, a shared intermediate, a
//   scale between the mask and the softmax, a finite fill that is not a mask;
// - bf16: the products in bf16 on the QKV projection's bf16 bytes through the head views, the context in
//   bf16 for the out-projection; none of it when the node is kept float32.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "ondine/lower/lower.hpp"
#include "ondine/lower/shape_cache.hpp"
#include "ondine/ondine.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_attention {

using namespace ondine;
using test::rel_error;
using test::uniform_tensor;
using Dims = std::vector<std::int64_t>;
namespace fs = std::filesystem;

namespace {

std::size_t count_ops(const Graph& g, const std::string& key) {
  std::size_t n = 0;
  for (const Node* node : g.topo_order()) n += node->op_key() == key;
  return n;
}

struct Builder {
  Graph g;
  Value* input(const std::string& name, const Dims& dims, DType t = DType::Float32) {
    return g.add_input(name, t, Shape::from(dims));
  }
  Value* scalar(float v) { return g.add_constant(g.unique_name("c"), Tensor::from_vector<float>({}, {v})); }
  Value* op(const std::string& type, const std::vector<Value*>& inputs, std::map<std::string, Attribute> attrs = {}) {
    return g.add_node(type, inputs, {""}, std::move(attrs), g.unique_name(type))->output(0);
  }
  Value* transpose(Value* x, Dims perm) { return op("Transpose", {x}, {{"perm", perm}}); }
  Value* softmax(Value* x, std::int64_t axis = -1) { return op("Softmax", {x}, {{"axis", axis}}); }
  void output(Value* v) {
    g.add_output(v);
    infer_shapes(g);
  }
};

// Hugging Face-style 4-D attention: q [B,H,S,D], k [B,H,S,D] (transposed here), v [B,H,S,D].
struct Attention4d {
  Builder b;
  Value *q, *k, *v;
  std::int64_t batch, heads, seq, dim;
  Attention4d(std::int64_t batch_, std::int64_t heads_, std::int64_t seq_, std::int64_t dim_)
      : batch(batch_), heads(heads_), seq(seq_), dim(dim_) {
    q = b.input("q", {batch, heads, seq, dim});
    k = b.input("k", {batch, heads, seq, dim});
    v = b.input("v", {batch, heads, seq, dim});
  }
  Value* scores() {
    return b.op("Div", {b.op("MatMul", {q, b.transpose(k, {0, 1, 3, 2})}), b.scalar(std::sqrt(float(dim)))});
  }
  std::map<std::string, Tensor> feeds(unsigned seed = 7) const {
    return {{"q", uniform_tensor({batch, heads, seq, dim}, seed)},
            {"k", uniform_tensor({batch, heads, seq, dim}, seed + 1)},
            {"v", uniform_tensor({batch, heads, seq, dim}, seed + 2)}};
  }
};

// Runs the default pipeline's fuse-attention alone and checks the reference executor agrees before
// and after (1e-5); returns the fused graph.
Graph fuse_and_check(const Graph& before, const std::map<std::string, Tensor>& feeds, std::size_t expect_fused) {
  Graph after = before.clone();
  PassManager pm = make_pass_manager("fuse-attention,dce");
  pm.run(after);
  CHECK(count_ops(after, "ondine.Attention") == expect_fused);
  auto want = ReferenceExecutor(before).run(feeds);
  auto got = ReferenceExecutor(after).run(feeds);
  for (auto& [name, t] : want) CHECK(rel_error(got.at(name), t) < 1e-5);
  return after;
}

// The fused graph compiled (no further passes) against the reference executor on the unfused one.
void check_compiled(const Graph& before, const Graph& fused, const std::map<std::string, Tensor>& feeds,
                    std::vector<std::string>* log = nullptr) {
  lower::CompileOptions options;
  options.passes = "none";
  options.threads = 2;
  if (log) options.log = [log](const std::string& line) { log->push_back(line); };
  auto model = lower::compile(fused, options);
  auto got = model.run(feeds);
  auto want = ReferenceExecutor(before).run(feeds);
  for (auto& [name, t] : want) CHECK(rel_error(got.at(name), t) < 1e-4);
}

fs::path corpus_model(const std::string& model) {
  return fs::path(ONDINE_TEST_DATA_DIR) / "torch" / model / "model.onnx";
}

}  // namespace

TEST_CASE("ondine.Attention: shape inference and its checks", "[attention][ops]") {
  Builder b;
  Value* q = b.input("q", {2, 4, 8, 16});
  Value* k = b.input("k", {2, 4, 16, 10});
  Value* v = b.input("v", {2, 4, 10, 32});
  Value* y = b.g.add_node("Attention", {q, k, v}, {"y"}, {{"scale", 0.25f}}, "att", fused::kDomain)->output(0);
  b.output(y);
  CHECK(y->shape().str() == "[2,4,8,32]");

  Builder bad;
  Value* q2 = bad.input("q", {2, 4, 8, 16});
  Value* k2 = bad.input("k", {2, 4, 12, 10});  // D 16 vs 12
  Value* v2 = bad.input("v", {2, 4, 10, 32});
  bad.g.add_node("Attention", {q2, k2, v2}, {"y"}, {}, "att", fused::kDomain);
  bad.g.add_output(bad.g.find_value("y"));
  CHECK_THROWS_WITH(infer_shapes(bad.g), Catch::Contains("att") && Catch::Contains("Q's last dim"));

  Builder mask_bad;
  Value* q3 = mask_bad.input("q", {2, 4, 8, 16});
  Value* k3 = mask_bad.input("k", {2, 4, 16, 10});
  Value* v3 = mask_bad.input("v", {2, 4, 10, 32});
  Value* m3 = mask_bad.input("m", {2, 1, 8, 9});  // 9 keys for 10
  mask_bad.g.add_node("Attention", {q3, k3, v3, m3}, {"y"}, {}, "att", fused::kDomain);
  mask_bad.g.add_output(mask_bad.g.find_value("y"));
  CHECK_THROWS_WITH(infer_shapes(mask_bad.g), Catch::Contains("Mask"));
}

TEST_CASE("fuse-attention: 4-D, scale on the scores, no mask (1e-5; compiled 1e-4)", "[attention]") {
  Attention4d a(2, 3, 9, 8);
  Builder& b = a.b;
  b.output(b.op("MatMul", {b.softmax(a.scores()), a.v}));
  Graph fused = fuse_and_check(b.g, a.feeds(), 1);
  CHECK(count_ops(fused, "Softmax") == 0);
  CHECK(count_ops(fused, "Div") == 0);
  check_compiled(b.g, fused, a.feeds());
}

TEST_CASE("fuse-attention: the scale on Q and on K, and baddbmm's Mul by 1s (1e-5; compiled 1e-4)", "[attention]") {
  // nn.MultiheadAttention's 3-D form: q [B*H, S, D] scaled first, an additive mask [B*H, 1, S] times 1.
  Builder b;
  Value* q = b.input("q", {6, 7, 8});
  Value* k = b.input("k", {6, 8, 7});
  Value* v = b.input("v", {6, 7, 5});
  Value* mask = b.input("mask", {6, 1, 7});
  Value* qs = b.op("Div", {q, b.scalar(2.0f)});
  Value* ks = b.op("Mul", {k, b.scalar(0.5f)});
  Value* scores = b.op("Mul", {b.op("MatMul", {qs, ks}), b.scalar(1.0f)});
  Value* added = b.op("Add", {scores, b.op("Mul", {mask, b.scalar(1.0f)})});
  b.output(b.op("MatMul", {b.softmax(added), v}));
  Tensor m = uniform_tensor({6, 1, 7}, 3, -2, 0);
  m.data<float>()[3] = -std::numeric_limits<float>::infinity();  // one key masked out
  std::map<std::string, Tensor> feeds{{"q", uniform_tensor({6, 7, 8}, 1)}, {"k", uniform_tensor({6, 8, 7}, 2)},
                                      {"v", uniform_tensor({6, 7, 5}, 4)}, {"mask", m}};
  Graph fused = fuse_and_check(b.g, feeds, 1);
  CHECK(count_ops(fused, "Mul") == 0);
  CHECK(count_ops(fused, "Div") == 0);
  const Node* att = nullptr;
  for (const Node* n : fused.topo_order())
    if (n->op_key() == "ondine.Attention") att = n;
  REQUIRE(att);
  CHECK(att->attr_float("scale") == Approx(0.25f));
  CHECK(att->input(3)->name() == "mask");  // the Mul by 1 dropped
  check_compiled(b.g, fused, feeds);
}

TEST_CASE("fuse-attention: a causal mask from Where, constant or computed (1e-5; compiled 1e-4)", "[attention]") {
  for (bool constant : {true, false}) {
    INFO((constant ? "constant" : "run-time") << " condition");
    Attention4d a(2, 2, 6, 4);
    Builder& b = a.b;
    std::vector<bool> upper;
    Tensor cond(DType::Bool, {6, 6});
    for (std::int64_t i = 0; i < 6; ++i)
      for (std::int64_t j = 0; j < 6; ++j) cond.data<bool>()[i * 6 + j] = j > i;
    Value* c = constant ? b.g.add_constant("causal", cond) : b.input("causal", {6, 6}, DType::Bool);
    Value* masked = b.op("Where", {c, b.scalar(-std::numeric_limits<float>::infinity()), a.scores()});
    b.output(b.op("MatMul", {b.softmax(masked), a.v}));
    auto feeds = a.feeds();
    if (!constant) feeds["causal"] = cond;
    Graph fused = fuse_and_check(b.g, feeds, 1);
    CHECK(count_ops(fused, "Where") == (constant ? 0u : 1u));  // a run-time condition: Where(c, -inf, 0)
    check_compiled(b.g, fused, feeds);
  }
}

TEST_CASE("fuse-attention: each mask broadcast compiles, fast or expanded (compiled 1e-4)", "[attention][lower]") {
  struct Form {
    Dims mask;
    bool constant;
    const char* log;  // expected in the compile log, "" for nothing special
  };
  // Scores [2,3,5,5]: [2,1,5,5] and [2,1,1,5] are fast as they are; [1,1,5,5] groups the batch as
  // [1, 6]; [1,3,5,5] (constant) is expanded at compile time; at run time it runs the reference kernel.
  for (const Form& f : {Form{{2, 1, 5, 5}, false, ""}, Form{{2, 1, 1, 5}, false, ""}, Form{{1, 1, 5, 5}, false, ""},
                        Form{{5, 5}, true, ""}, Form{{1, 3, 5, 5}, true, ""}, Form{{2, 3, 5, 1}, true, ""},
                        Form{{1, 3, 5, 5}, false, "reference kernel"}}) {
    INFO("mask " << dims_str(f.mask) << (f.constant ? " constant" : " run-time"));
    Attention4d a(2, 3, 5, 4);
    Builder& b = a.b;
    Tensor m = uniform_tensor(f.mask, 11, -3, 0);
    Value* mask = f.constant ? b.g.add_constant("mask", m) : b.input("mask", f.mask);
    b.output(b.op("MatMul", {b.softmax(b.op("Add", {a.scores(), mask})), a.v}));
    auto feeds = a.feeds();
    if (!f.constant) feeds["mask"] = m;
    Graph fused = fuse_and_check(b.g, feeds, 1);
    std::vector<std::string> log;
    check_compiled(b.g, fused, feeds, &log);
    bool said = std::any_of(log.begin(), log.end(),
                            [&](const std::string& l) { return *f.log && l.find(f.log) != std::string::npos; });
    CHECK(said == (*f.log != 0));
  }
}

namespace {

// Hugging Face's repeat_kv on [B, kv_heads, T, D]: Reshape(Expand(Unsqueeze(x, axes [axis]))) to
// [B, kv_heads * rep, T, D]: with axis 2 each head repeated in place, with axis 1 the heads tiled.
Value* repeat_heads(Builder& b, Value* x, const Dims& d, std::int64_t rep, std::int64_t axis = 2) {
  Dims expanded = d, out = d;
  expanded.insert(expanded.begin() + axis, rep);
  out[1] *= rep;
  auto ints = [&](const Dims& v) {
    return b.g.add_constant(b.g.unique_name("shape"), Tensor::from_vector<std::int64_t>({static_cast<std::int64_t>(v.size())}, v));
  };
  Value* u = b.op("Unsqueeze", {x, ints({axis})});
  return b.op("Reshape", {b.op("Expand", {u, ints(expanded)}), ints(out)});
}

// Grouped-query attention as Llama exports it: q [B, H, S, D], the KV cache [B, kv, T, D] repeated by
// repeat_kv, K transposed after the repetition, an additive mask [B, 1, S, T].
struct GroupedAttention {
  Builder b;
  Dims qd, kvd;
  GroupedAttention(std::int64_t batch, std::int64_t heads, std::int64_t kv, std::int64_t s, std::int64_t t,
                   std::int64_t d, std::int64_t axis = 2)
      : qd{batch, heads, s, d}, kvd{batch, kv, t, d} {
    Value* q = b.input("q", qd);
    Value* k = repeat_heads(b, b.input("k", kvd), kvd, heads / kv, axis);
    Value* v = repeat_heads(b, b.input("v", kvd), kvd, heads / kv, axis);
    Value* scores = b.op("Div", {b.op("MatMul", {q, b.transpose(k, {0, 1, 3, 2})}), b.scalar(std::sqrt(float(d)))});
    Value* mask = b.input("mask", {batch, 1, s, t});
    b.output(b.op("MatMul", {b.softmax(b.op("Add", {scores, mask})), v}));
  }
  std::map<std::string, Tensor> feeds() const {
    return {{"q", uniform_tensor(qd, 1)}, {"k", uniform_tensor(kvd, 2)}, {"v", uniform_tensor(kvd, 3)},
            {"mask", uniform_tensor({qd[0], 1, qd[2], kvd[2]}, 4, -3, 0)}};
  }
};

}  // namespace

TEST_CASE("fuse-attention: grouped-query attention reads K and V without repeating them (1e-5; compiled 1e-4)",
          "[attention][gqa]") {
  GroupedAttention a(2, 6, 2, 3, 7, 8);
  Graph fused = fuse_and_check(a.b.g, a.feeds(), 1);
  CHECK(count_ops(fused, "Expand") == 0);
  CHECK(count_ops(fused, "Reshape") == 0);
  const Node* att = nullptr;
  for (const Node* n : fused.topo_order())
    if (n->op_key() == "ondine.Attention") att = n;
  REQUIRE(att);
  CHECK(att->input(1)->shape() == Shape::from({2, 2, 8, 7}));  // the keys transposed, 2 heads
  CHECK(att->input(2)->name() == "v");
  std::vector<std::string> log;
  check_compiled(a.b.g, fused, a.feeds(), &log);
  // The shape-free plan's kernel, at shapes it was not compiled for.
  lower::CompileOptions o;
  o.threads = 2;
  o.passes = "none";
  lower::DynamicModel free(fused.clone(), o);
  INFO(free.to_text());
  CHECK(free.covers());
  auto feeds = a.feeds();
  CHECK(rel_error(free.run(feeds).at(fused.outputs()[0]->name()),
                  ReferenceExecutor(a.b.g).run(feeds).begin()->second) < 1e-4);
}

TEST_CASE("ondine.Attention with grouped K/V: shape inference and its checks", "[attention][gqa][ops]") {
  Graph g;
  Value* q = g.add_input("q", DType::Float32, Shape::from({1, 8, 3, 16}));
  Value* k = g.add_input("k", DType::Float32, Shape::from({1, 2, 16, 5}));
  Value* v = g.add_input("v", DType::Float32, Shape::from({1, 2, 5, 4}));
  Node* n = g.add_node("Attention", {q, k, v}, {"y"}, {}, "att", fused::kDomain);
  g.add_output(n->output(0));
  infer_shapes(g);
  CHECK(n->output(0)->shape() == Shape::from({1, 8, 3, 4}));
  Value* k3 = g.add_input("k3", DType::Float32, Shape::from({1, 3, 16, 5}));  // 3 does not divide 8
  Node* bad = g.add_node("Attention", {q, k3, v}, {"y3"}, {}, "bad", fused::kDomain);
  g.add_output(bad->output(0));
  CHECK_THROWS_WITH(infer_shapes(g), Catch::Contains("bad") && Catch::Contains("batch dims differ"));
}

TEST_CASE("fuse-attention: must not fire", "[attention][must-not-fire]") {
  SECTION("a mask of a higher rank than the scores") {
    Attention4d a(1, 2, 4, 4);
    Builder& b = a.b;
    Value* mask = b.input("mask", {3, 1, 2, 4, 4});  // broadcasts the scores up to rank 5
    b.output(b.op("MatMul", {b.softmax(b.op("Add", {a.scores(), mask})), a.v}));
    auto feeds = a.feeds();
    feeds["mask"] = uniform_tensor({3, 1, 2, 4, 4}, 5);
    fuse_and_check(b.g, feeds, 0);
  }
  SECTION("a softmax on another axis") {
    Attention4d a(1, 2, 4, 4);
    Builder& b = a.b;
    b.output(b.op("MatMul", {b.softmax(a.scores(), 2), a.v}));
    fuse_and_check(b.g, a.feeds(), 0);
  }
  SECTION("a shared intermediate: the scores are also an output") {
    Attention4d a(1, 2, 4, 4);
    Builder& b = a.b;
    Value* scores = a.scores();
    Value* y = b.op("MatMul", {b.softmax(scores), a.v});
    b.g.add_output(y);
    b.g.add_output(scores);
    infer_shapes(b.g);
    fuse_and_check(b.g, a.feeds(), 0);
  }
  SECTION("the probabilities read twice") {
    Attention4d a(1, 2, 4, 4);
    Builder& b = a.b;
    Value* p = b.softmax(a.scores());
    b.output(b.op("Add", {b.op("MatMul", {p, a.v}), b.op("MatMul", {p, a.q})}));
    fuse_and_check(b.g, a.feeds(), 0);
  }
  SECTION("a scale between the mask and the softmax") {
    Attention4d a(1, 2, 4, 4);
    Builder& b = a.b;
    Value* mask = b.g.add_constant("mask", uniform_tensor({4, 4}, 9, -1, 0));
    Value* x = b.op("Mul", {b.op("Add", {a.scores(), mask}), b.scalar(0.5f)});
    b.output(b.op("MatMul", {b.softmax(x), a.v}));
    fuse_and_check(b.g, a.feeds(), 0);
  }
  SECTION("K and V tiled (heads repeated as a block, not in place): the attention fuses, the repetition stays") {
    GroupedAttention a(1, 4, 2, 3, 5, 8, 1);
    Graph fused = fuse_and_check(a.b.g, a.feeds(), 1);
    CHECK(count_ops(fused, "Expand") == 2);
  }
  SECTION("a repetition read by something else too") {
    Attention4d a(1, 4, 3, 8);
    Builder& b = a.b;
    Value* kv = b.input("kv", {1, 2, 3, 8});
    Value* rep = repeat_heads(b, kv, {1, 2, 3, 8}, 2);
    Value* scores = b.op("MatMul", {a.q, b.transpose(rep, {0, 1, 3, 2})});
    b.output(b.op("Add", {b.op("MatMul", {b.softmax(scores), a.v}), rep}));
    auto feeds = a.feeds();
    feeds["kv"] = uniform_tensor({1, 2, 3, 8}, 12);
    fuse_and_check(b.g, feeds, 1);
    Graph fused = b.g.clone();
    make_pass_manager("fuse-attention,dce").run(fused);
    CHECK(count_ops(fused, "Expand") == 1);
  }
  SECTION("a finite fill that is not a mask value") {
    Attention4d a(1, 2, 4, 4);
    Builder& b = a.b;
    Tensor cond(DType::Bool, {4, 4});
    for (std::int64_t i = 0; i < 16; ++i) cond.data<bool>()[i] = i % 3 == 0;
    Value* x = b.op("Where", {b.g.add_constant("c", cond), b.scalar(-5.0f), a.scores()});
    b.output(b.op("MatMul", {b.softmax(x), a.v}));
    fuse_and_check(b.g, a.feeds(), 0);
  }
}

TEST_CASE("fuse-attention: the Llama-style decoder's grouped attention reads the KV cache's presents",
          "[attention][gqa][corpus]") {
  Graph g = ondine::onnx::load_model(corpus_model("llama_kv").string());
  PassManager pm = make_pass_manager();
  pm.run(g);
  CHECK(count_ops(g, "ondine.Attention") == 2);
  for (const Node* n : g.topo_order()) {
    if (n->op_type() == "Expand") CHECK(n->output(0)->shape().rank() != 5);  // no repeat_kv left
    if (n->op_key() != "ondine.Attention") continue;
    INFO(n->name());
    CHECK(n->input(2)->is_graph_output());  // V: present.i.value itself
    REQUIRE(n->input(1)->producer());
    CHECK(n->input(1)->producer()->op_type() == "Transpose");
    CHECK(n->input(1)->producer()->input(0)->is_graph_output());  // K: present.i.key, transposed
  }
}

TEST_CASE("fuse-attention: every attention of the exported corpus is one node", "[attention][corpus]") {
  // (model, attentions): nn.TransformerEncoder's 3-D form with a padding mask, the hand-written 4-D
  // form with a Trilu causal mask, torchvision's ViT, nn.Transformer's self, causal and cross attention.
  const std::pair<const char*, std::size_t> corpus[] = {
      {"bert_encoder", 2}, {"gpt_decoder", 2}, {"vit_small", 2}, {"audio_encoder", 2}, {"seq2seq", 3}};
  for (auto [model, expected] : corpus) {
    INFO(model);
    Graph g = ondine::onnx::load_model(corpus_model(model).string());
    // Bound as compile() binds them: the masks built from the sequence length fold to constants.
    std::map<std::string, std::int64_t> dims{{"batch", 2}, {"seq", 12}, {"frames", 20}, {"src_seq", 12}, {"tgt_seq", 9}};
    for (Value* in : g.inputs()) {
      std::vector<Dim> d = in->shape().dims();
      for (Dim& x : d)
        if (!x.is_static()) x = Dim(dims.at(x.symbol));
      in->set_shape(Shape(d));
    }
    infer_shapes(g);
    PassManager pm = make_pass_manager();
    pm.run(g);
    CHECK(count_ops(g, "ondine.Attention") == expected);
    CHECK(count_ops(g, "Softmax") == 0);
  }
}

TEST_CASE("compiled attention at sequence length 1 reads K and V at their offsets in the QKV projection",
          "[attention][lower]") {
  // nn.MultiheadAttention's export slices Q, K and V out of one projection: V is a view starting 512 floats
  // in. At sequence length 1 oneDNN 2.6 picks its brg matmul for probabilities x V, which ignores a
  // descriptor's offset0 (bench/onednn_matmul_offset_repro.cpp): the context was Q. Checked against the
  // reference executor at batch 1 and 2, sequence length 1 and 3, float32 and (where native) bf16.
  for (auto [batch, seq] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {2, 1}, {1, 3}}) {
    for (bool bf16 : {false, true}) {
      if (bf16 && !lower::effective_isa().bf16_native) continue;
      INFO("batch " << batch << " seq " << seq << (bf16 ? " bf16" : " fp32"));
      Graph g = ondine::onnx::load_model(corpus_model("bert_encoder").string());
      bind_dims(g, {{"batch", batch}, {"seq", seq}});
      Tensor ids = Tensor::from_vector<std::int64_t>({batch, seq}, std::vector<std::int64_t>(static_cast<std::size_t>(batch * seq), 0));
      for (std::int64_t i = 0; i < batch * seq; ++i) ids.data<std::int64_t>()[i] = 3 + 7 * i;
      std::map<std::string, Tensor> feeds{{g.inputs()[0]->name(), ids}};
      auto want = ReferenceExecutor(g).run(feeds);
      lower::CompileOptions options;
      options.threads = 2;
      if (bf16) options.precision = lower::Precision::Bf16;
      auto got = lower::compile(g.clone(), options).run(feeds);
      for (auto& [name, t] : want) CHECK(rel_error(got.at(name), t) < (bf16 ? 3e-2 : 1e-4));
    }
  }
}

TEST_CASE("bf16 attention: bf16 products on the QKV projection's bf16 bytes, float32 softmax, bf16 context",
          "[attention][lower][bf16]") {
  if (!lower::effective_isa().bf16_native) return;  // (bf16 needs native bf16)
  Graph g = ondine::onnx::load_model(corpus_model("bert_encoder").string());
  bind_dims(g, {{"batch", 2}, {"seq", 16}});
  Tensor ids = Tensor::from_vector<std::int64_t>({2, 16}, std::vector<std::int64_t>(32, 0));
  for (std::int64_t i = 0; i < 32; ++i) ids.data<std::int64_t>()[i] = (5 + 11 * i) % 97;
  std::map<std::string, Tensor> feeds{{g.inputs()[0]->name(), ids}};
  auto want = ReferenceExecutor(g).run(feeds);
  struct Count {
    std::size_t scores_bf16 = 0, softmax_bf16 = 0, context_bf16 = 0, attention = 0, matmul_bf16_out = 0;
  };
  auto count = [](const CompiledModel& m) {
    Count c;
    for (const runtime::StepInfo& s : m.steps()) {
      auto ends_bf16 = s.detail.size() > 5 && s.detail.compare(s.detail.size() - 5, 5, " bf16") == 0;
      if (s.op == "Attention" && s.detail.rfind("scores:", 0) == 0) {
        ++c.attention;
        c.scores_bf16 += s.detail.find(" bf16 ") != std::string::npos;
      }
      if (s.op == "Attention") c.softmax_bf16 += s.detail.rfind("softmax to bf16", 0) == 0;
      if (s.op == "Attention" && s.detail.rfind("context:", 0) == 0) c.context_bf16 += ends_bf16;
      if ((s.op == "MatMul" || s.op == "FusedMatMul" || s.op == "Gemm") && ends_bf16) ++c.matmul_bf16_out;
    }
    return c;
  };
  lower::CompileOptions options;
  options.threads = 2;
  options.precision = lower::Precision::Bf16;
  {
    CompiledModel m = lower::compile(g.clone(), options);
    const Count c = count(m);
    REQUIRE(c.attention == 2);
    CHECK(c.scores_bf16 == 2);
    CHECK(c.softmax_bf16 == 2);
    CHECK(c.context_bf16 == 2);  // the out-projection reads the context as bf16
    CHECK(c.matmul_bf16_out == 4);  // per layer: the QKV projection (read through Slice views) and FFN1
    for (auto& [name, t] : want) CHECK(rel_error(m.run(feeds).at(name), t) < 3e-2);
  }
  // Must not fire: attention kept float32 reads float32, so the QKV projection writes float32 too.
  options.keep_fp32 = {"*self_attn/MatMul_1"};
  CompiledModel m = lower::compile(g.clone(), options);
  const Count c = count(m);
  REQUIRE(c.attention == 2);
  CHECK(c.scores_bf16 == 0);
  CHECK(c.softmax_bf16 == 0);
  CHECK(c.context_bf16 == 0);
  CHECK(c.matmul_bf16_out == 2);  // FFN1 only
  for (auto& [name, t] : want) CHECK(rel_error(m.run(feeds).at(name), t) < 3e-2);
}

}  // namespace test_attention
