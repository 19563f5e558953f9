// Symbolic dims and shape values: dim expressions, element propagation through shape arithmetic, and the
// PyTorch-exported corpus (tests/data/torch, written by scripts/make_models.py --torch-corpus) inferred
// symbolically and compiled at two shapes in one process, against PyTorch's own outputs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ondine/lower/lower.hpp"
#include "ondine/lower/shape_cache.hpp"
#include "ondine/ondine.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_shape_values {

using namespace ondine;
using test::rel_error;
namespace fs = std::filesystem;

namespace {

Tensor ints(std::vector<std::int64_t> v) {
  auto n = static_cast<std::int64_t>(v.size());
  return Tensor::from_vector<std::int64_t>({n}, v);
}

// x[batch, seq, 64] and the Shape -> Gather -> Unsqueeze -> Concat chain PyTorch writes for a reshape.
struct ShapeChain {
  Graph g;
  Value* x = nullptr;
  Value* seq = nullptr;   // Gather(Shape(x), 1): a scalar
  Value* seq1 = nullptr;  // Unsqueeze(seq): [1]
};
ShapeChain shape_chain() {
  ShapeChain c;
  Graph& g = c.g;
  c.x = g.add_input("x", DType::Float32, Shape{Dim::named("batch"), Dim::named("seq"), 64});
  Value* shape = g.add_op("Shape", {c.x}, {}, "shape");
  c.seq = g.add_op("Gather", {shape, g.add_constant("one", Tensor::scalar<std::int64_t>(1))},
                   {{"axis", std::int64_t{0}}}, "seq");
  c.seq1 = g.add_op("Unsqueeze", {c.seq, g.add_constant("axes0", ints({0}))}, {}, "seq1");
  return c;
}

std::string elems_str(const Value* v) {
  if (!v->element_dims()) return "none";
  std::string s;
  for (auto& e : *v->element_dims()) s += (s.empty() ? "" : ",") + e.str();
  return "[" + s + "]";
}

const char* const kCorpus[] = {"bert_encoder",   "gpt_decoder",     "vit_small",   "audio_encoder",
                               "seq2seq",        "paddle_reshape",  "pad_shape_arith", "lstm_tagger",
                               "gru_tagger",     "lstm_stream",     "scripted_loop",   "gated_encoder",
                               "text_detector",  "roi_box_head",    "unet",            "face_embedding",
                               "bird_classifier"};

fs::path corpus_dir(const std::string& model) { return fs::path(ONDINE_TEST_DATA_DIR) / "torch" / model; }

// case<K>.<input>.npy and case<K>.out.<output>.npy of one corpus model.
struct Case {
  std::map<std::string, Tensor> inputs, outputs;
};
Case load_case(const std::string& model, int k) {
  Case c;
  std::string prefix = "case" + std::to_string(k) + ".";
  for (auto& entry : fs::directory_iterator(corpus_dir(model))) {
    std::string f = entry.path().filename().string();
    if (f.rfind(prefix, 0) != 0 || entry.path().extension() != ".npy") continue;
    std::string name = f.substr(prefix.size(), f.size() - prefix.size() - 4);
    if (name.rfind("out.", 0) == 0) c.outputs[name.substr(4)] = load_npy(entry.path().string());
    else c.inputs[name] = load_npy(entry.path().string());
  }
  REQUIRE(!c.inputs.empty());
  REQUIRE(!c.outputs.empty());
  return c;
}

}  // namespace

TEST_CASE("dim expressions: one canonical form, so equal expressions compare equal", "[ir][symbolic]") {
  Dim seq = Dim::named("seq"), batch = Dim::named("batch"), h = Dim::named("H");
  CHECK(dim_mul(seq, 3).str() == "3*seq");
  CHECK(dim_add(seq, 1).str() == "seq + 1");
  CHECK(dim_mul(seq, batch) == dim_mul(batch, seq));
  CHECK(dim_mul(seq, batch).str() == "batch*seq");
  CHECK(dim_sub(dim_add(seq, 5), 5) == seq);
  CHECK(dim_floor_div(dim_mul(batch, seq), seq) == batch);
  CHECK(dim_floor_div(dim_mul(seq, 4), 2).str() == "2*seq");
  CHECK(dim_add(dim_mul(seq, 2), dim_mul(seq, 3)).str() == "5*seq");
  CHECK(dim_add(Dim(2), 3) == Dim(5));

  Dim conv = dim_add(dim_floor_div(dim_sub(h, 1), 2), 1);  // a 3x3 stride-2 pad-1 convolution
  CHECK(conv.str() == "(H - 1)/2 + 1");
  CHECK(dim_eval(conv, {{"H", 13}}) == 7);
  CHECK(dim_eval(conv, {{"H", 14}}) == 7);
  CHECK(dim_eval(conv, {{"W", 14}}) == std::nullopt);
  CHECK(dim_mod(dim_mul(h, 8), 8) == Dim(0));
  CHECK(dim_eval(dim_mod(h, 8), {{"H", 13}}) == 5);
  CHECK(dim_eval(dim_mul(dim_add(seq, 1), batch), {{"seq", 4}, {"batch", 3}}) == 15);
}

TEST_CASE("dim expressions: unknowns, negatives and a model's own names", "[ir][symbolic]") {
  Dim seq = Dim::named("seq");
  CHECK(dim_add(Dim(), seq) == Dim());         // anything with an unknown dim is unknown
  CHECK(dim_sub(Dim(3), Dim(5)) == Dim());     // a negative size is no size
  CHECK(dim_floor_div(seq, Dim(0)) == Dim());  // nor is a division by zero
  // Names a model brings stay whole, whatever characters they hold.
  CHECK(dim_mul(Dim::named("Addfeatures_dim_2"), 1).str() == "Addfeatures_dim_2");
  CHECK(dim_add(Dim::named("seq len"), 0).str() == "seq len");
  CHECK(dim_mul(Dim::named("(odd"), 2).str() == "2*(odd");
  // SymInts may be negative (Reshape's -1).
  CHECK(sym_sub(SymInt(0), SymInt(1)).number == std::optional<std::int64_t>(-1));
  CHECK(sym_floor_div(SymInt(-7), SymInt(2)).number == std::optional<std::int64_t>(-4));
  CHECK(sym_mod(SymInt(-7), SymInt(3)).number == std::optional<std::int64_t>(2));
}

TEST_CASE("shape values: Shape -> Gather -> Concat -> Reshape keeps the symbols", "[ir][symbolic]") {
  ShapeChain c = shape_chain();
  Graph& g = c.g;
  // [-1, seq, 4, 16]: the -1 is batch*seq*64 / (seq*64) = batch.
  Value* target = g.add_op("Concat", {g.add_constant("m1", ints({-1})), c.seq1, g.add_constant("hd", ints({4, 16}))},
                           {{"axis", std::int64_t{0}}}, "target");
  Value* heads = g.add_op("Reshape", {c.x, target}, {}, "heads");
  // A causal-mask-like [seq, seq] from ConstantOfShape(Concat(seq, seq)), and Range(0, seq, 1).
  Value* square = g.add_op("Concat", {c.seq1, c.seq1}, {{"axis", std::int64_t{0}}}, "square");
  Value* mask = g.add_op("ConstantOfShape", {square}, {}, "mask");
  Value* positions = g.add_op("Range", {g.add_constant("zero", Tensor::scalar<std::int64_t>(0)), c.seq,
                                        g.add_constant("step", Tensor::scalar<std::int64_t>(1))},
                              {}, "positions");
  // Arithmetic on the values: 4*seq and (seq)%8.
  Value* quad = g.add_op("Mul", {c.seq1, g.add_constant("four", ints({4}))}, {}, "quad");
  Value* flat = g.add_op("Reshape", {c.x, g.add_op("Concat", {g.add_constant("m1b", ints({-1})), quad},
                                                    {{"axis", std::int64_t{0}}}, "flat_shape")},
                         {}, "flat");
  Value* rem = g.add_op("Mod", {c.seq1, g.add_constant("eight", ints({8}))}, {}, "rem");
  // CastLike (PyTorch's exports write it from opset 15) carries the values as Cast does.
  Value* quad_f = g.add_op("CastLike", {quad, g.add_constant("like_f", Tensor::scalar<float>(0))}, {}, "quad_f");
  for (Value* v : {heads, mask, positions, flat, rem, quad_f}) g.add_output(v);
  infer_shapes(g);

  CHECK(elems_str(c.seq) == "[seq]");
  CHECK(elems_str(target) == "[-1,seq,4,16]");
  CHECK(heads->shape().str() == "[batch,seq,4,16]");
  CHECK(mask->shape().str() == "[seq,seq]");
  CHECK(positions->shape().str() == "[seq]");
  CHECK(elems_str(quad) == "[4*seq]");
  CHECK(flat->shape().str() == "[16*batch,4*seq]");  // the -1: 64*batch*seq / (4*seq)
  CHECK(elems_str(rem) == "[(seq)%8]");
  CHECK(elems_str(quad_f) == "[4*seq]");
  CHECK(quad_f->dtype() == DType::Float32);

  // Bound, every shape is a number, and the values are known data.
  bind_dims(g, {{"batch", 2}, {"seq", 5}});
  CHECK(heads->shape().str() == "[2,5,4,16]");
  CHECK(mask->shape().str() == "[5,5]");
  CHECK(flat->shape().str() == "[32,20]");
  REQUIRE(target->known_data());
  CHECK(target->known_data()->to_int64s() == std::vector<std::int64_t>{-1, 5, 4, 16});
  CHECK(rem->known_data()->to_int64s() == std::vector<std::int64_t>{5});
}

TEST_CASE("shape values: must not claim what the data decides", "[ir][symbolic]") {
  ShapeChain c = shape_chain();
  Graph& g = c.g;
  // Gather with an index that is itself an input: unknown element, unknown reshape dims.
  Value* idx = g.add_input("idx", DType::Int64, Shape{});
  Value* shape = g.add_op("Shape", {c.x}, {}, "shape2");
  Value* picked = g.add_op("Gather", {shape, idx}, {{"axis", std::int64_t{0}}}, "picked");
  // Float Div that is not exact stays unknown (a float shape value must be an integer to be known).
  Value* f = g.add_op("Cast", {c.seq}, {{"to", std::int64_t{1}}}, "seq_f");
  Value* half = g.add_op("Div", {f, g.add_constant("two", Tensor::scalar<float>(2.0f))}, {}, "half");
  // Equal on a size and a positive number: unknown (seq may be 4); on -1: known false.
  Value* eq4 = g.add_op("Equal", {c.seq1, g.add_constant("four", ints({4}))}, {}, "eq4");
  Value* eqm1 = g.add_op("Equal", {c.seq1, g.add_constant("minus1", ints({-1}))}, {}, "eqm1");
  for (Value* v : {picked, half, eq4, eqm1}) g.add_output(v);
  infer_shapes(g);
  CHECK(elems_str(picked) == "none");
  CHECK(elems_str(half) == "[?]");
  CHECK(elems_str(eq4) == "[?]");
  CHECK(elems_str(eqm1) == "[0]");
  CHECK(half->known_data() == nullptr);

  bind_dims(g, {{"seq", 7}, {"batch", 1}});
  CHECK(half->known_data() == nullptr);  // 3.5 is no shape value
  CHECK(eq4->known_data()->to_int64s() == std::vector<std::int64_t>{0});
}

TEST_CASE("symbolic conv, transposed conv and pool output dims are expressions of the input dims", "[ir][symbolic]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{Dim::named("N"), 3, Dim::named("H"), Dim::named("W")});
  Value* w = g.add_constant("w", Tensor(DType::Float32, {8, 3, 3, 3}));
  Value* y = g.add_op("Conv", {x, w},
                      {{"strides", std::vector<std::int64_t>{2, 2}}, {"pads", std::vector<std::int64_t>{1, 1, 1, 1}}}, "y");
  Value* p = g.add_op("MaxPool", {y},
                      {{"kernel_shape", std::vector<std::int64_t>{2, 2}}, {"strides", std::vector<std::int64_t>{2, 2}}},
                      "p");
  g.add_output(p);
  infer_shapes(g);
  CHECK(y->shape().str() == "[N,8,(H - 1)/2 + 1,(W - 1)/2 + 1]");
  CHECK(p->shape().str() == "[N,8,((H - 1)/2 - 1)/2 + 1,((W - 1)/2 - 1)/2 + 1]");
  for (std::int64_t h : {13, 16, 31}) CHECK(dim_eval(p->shape()[2], {{"H", h}}) == ((h - 1) / 2 + 1 - 2) / 2 + 1);
  // A U-Net's up path: ConvTranspose 2x2 stride 2 doubles it; 3x3 stride 2 with pads 1 and output_padding 1 too;
  // SAME_UPPER gives stride x input.
  Value* wt = g.add_constant("wt", Tensor(DType::Float32, {8, 4, 2, 2}));
  Value* up = g.add_op("ConvTranspose", {p, wt}, {{"strides", std::vector<std::int64_t>{2, 2}}}, "up");
  Value* wt3 = g.add_constant("wt3", Tensor(DType::Float32, {8, 4, 3, 3}));
  Value* up3 = g.add_op("ConvTranspose", {p, wt3},
                        {{"strides", std::vector<std::int64_t>{2, 2}}, {"pads", std::vector<std::int64_t>{1, 1, 1, 1}},
                         {"output_padding", std::vector<std::int64_t>{1, 1}}}, "up3");
  Value* same = g.add_op("ConvTranspose", {p, wt3},
                         {{"strides", std::vector<std::int64_t>{3, 3}}, {"auto_pad", std::string("SAME_UPPER")}}, "same");
  g.add_output(up);
  g.add_output(up3);
  g.add_output(same);
  infer_shapes(g);
  for (std::int64_t h : {13, 16, 31}) {
    const std::int64_t pooled = ((h - 1) / 2 + 1 - 2) / 2 + 1;
    CHECK(dim_eval(up->shape()[2], {{"H", h}}) == 2 * pooled);
    CHECK(dim_eval(up3->shape()[3], {{"W", h}}) == 2 * pooled);
    CHECK(dim_eval(same->shape()[2], {{"H", h}}) == 3 * pooled);
  }
  CHECK(up->shape()[1].value == 4);
  CHECK_FALSE(up->shape()[2].is_static());
}

TEST_CASE("exported corpus: every value's shape is inferred symbolically", "[ir][symbolic][corpus]") {
  for (const char* model : kCorpus) {
    INFO(model);
    // Its If's branches give different frame counts (strides 8 and 4): known once the branch is chosen.
    if (std::string(model) == "gated_encoder") continue;
    // Its FPN adds each level to the coarser one upsampled: (H-1)/8+1-like sizes and twice the next ones,
    // equal only for sizes divisible by 32, so the sums' spatial dims are known once the sizes are.
    if (std::string(model) == "text_detector") continue;
    // Likewise its up path (2 x the pooled size) and the skip it is concatenated with (the size before the
    // pool): equal for even sizes only. Its ConvTranspose outputs are expressions (the first test above).
    if (std::string(model) == "unet") continue;
    Graph g = ondine::onnx::load_model((corpus_dir(model) / "model.onnx").string());
    std::vector<std::string> unknown;
    for (Node* n : g.topo_order())
      for (Value* v : n->outputs()) {
        bool known = v->shape().rank_known();
        for (std::size_t i = 0; known && i < v->shape().rank(); ++i)
          known = v->shape()[i].is_static() || !v->shape()[i].symbol.empty();
        if (!known) unknown.push_back(n->name() + " " + v->shape().str());
      }
    INFO((unknown.empty() ? std::string() : unknown.front()));
    CHECK(unknown.empty());
  }
  Graph gpt = ondine::onnx::load_model((corpus_dir("gpt_decoder") / "model.onnx").string());
  CHECK(gpt.outputs()[0]->shape().str() == "[batch,seq,100]");
  Graph gated = ondine::onnx::load_model((corpus_dir("gated_encoder") / "model.onnx").string());
  CHECK(gated.outputs()[0]->shape().str() == "[batch,1,frames]");  // declared; its If yields [batch,1,?]
  Graph audio = ondine::onnx::load_model((corpus_dir("audio_encoder") / "model.onnx").string());
  CHECK(audio.outputs()[0]->shape()[1].str() == "(frames - 1)/2 + 1");  // conv1d k3, stride 2, pad 1
}

TEST_CASE("exported corpus: compiled at two shapes in one process, equal to PyTorch", "[lower][symbolic][corpus]") {
  for (const char* model : kCorpus) {
    INFO(model);
    Graph g = ondine::onnx::load_model((corpus_dir(model) / "model.onnx").string());
    lower::CompileOptions options;
    options.threads = 1;
    options.shape_plan = lower::ShapePlan::PerShape;  // the shape-free plan: tests/test_dynamic.cpp
    lower::ShapeCache cache(g.clone(), options);
    ReferenceExecutor reference(g);
    for (int k = 0; k < 2; ++k) {
      INFO("case " << k);
      Case c = load_case(model, k);
      auto compiled = cache.run(c.inputs);
      auto ref = reference.run(c.inputs);
      for (auto& [name, expected] : c.outputs) {
        INFO(name);
        REQUIRE(compiled.count(name));
        CHECK(rel_error(compiled.at(name), expected) < 1e-4);
        CHECK(rel_error(ref.at(name), expected) < 1e-4);
      }
    }
    CHECK(cache.compilations() == 2);
  }
}

TEST_CASE("shape cache: the shapes share their packed weights", "[lower][symbolic][corpus]") {
  // The GPT-style decoder at two sequence lengths: every MatMul weight is packed once. Only constants
  // that depend on the length (the causal mask folded for each length) add packings.
  Graph g = ondine::onnx::load_model((corpus_dir("gpt_decoder") / "model.onnx").string());
  lower::CompileOptions options;
  options.threads = 1;
  options.shape_plan = lower::ShapePlan::PerShape;
  lower::ShapeCache cache(std::move(g), options);
  cache.run(load_case("gpt_decoder", 0).inputs);
  const std::size_t bytes_one = cache.packed_weights().bytes(), packings_one = cache.packed_weights().size();
  CHECK(bytes_one > 100 * 1024);  // the decoder's ~120 KB of matrices, packed
  CHECK(cache.packed_weights().hits() > 0);  // the tied embedding / LM head and the like
  const std::size_t hits_one = cache.packed_weights().hits();
  cache.run(load_case("gpt_decoder", 1).inputs);
  CHECK(cache.compilations() == 2);
  const std::size_t added = cache.packed_weights().bytes() - bytes_one;
  INFO("first shape " << bytes_one << " B in " << packings_one << " packings; the second added " << added << " B");
  CHECK(added < bytes_one / 20);
  CHECK(cache.packed_weights().hits() - hits_one >= packings_one - 4);
}

TEST_CASE("shape cache: an input that decides a shape compiles once per value", "[lower][symbolic]") {
  // Reshape(x, shape) with the shape a graph input, as the ONNX test suite writes it; and token ids
  // (also a small int64 input) that only index an embedding, which must not be specialised.
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{2, 3, 4});
  Value* shape = g.add_input("shape", DType::Int64, Shape{2});
  Value* ids = g.add_input("ids", DType::Int64, Shape{1, 5});
  Value* table = g.add_constant("table", Tensor::from_vector<float>({10, 2}, std::vector<float>(20, 0.5f)));
  g.add_output(g.add_op("Reshape", {x, shape}, {}, "reshape"));
  g.add_output(g.add_op("Gather", {table, ids}, {}, "embed"));
  infer_shapes(g);
  auto found = shape_inputs(g);
  REQUIRE(found.size() == 1);
  CHECK(found[0]->name() == "shape");

  lower::ShapeCache cache(g.clone());
  Tensor xs(DType::Float32, {2, 3, 4});
  for (std::int64_t i = 0; i < 24; ++i) xs.data<float>()[i] = static_cast<float>(i);
  Tensor token_ids = Tensor::from_vector<std::int64_t>({1, 5}, {1, 2, 3, 4, 5});
  auto a = cache.run({{"x", xs}, {"shape", ints({6, 4})}, {"ids", token_ids}});
  CHECK(a.at("reshape").dims() == std::vector<std::int64_t>{6, 4});
  auto b = cache.run({{"x", xs}, {"shape", ints({-1, 6})}, {"ids", token_ids}});
  CHECK(b.at("reshape").dims() == std::vector<std::int64_t>{4, 6});
  CHECK(b.at("reshape").data<float>()[23] == 23.0f);
  token_ids.data<std::int64_t>()[0] = 7;  // another id: the same compiled model
  cache.run({{"x", xs}, {"shape", ints({6, 4})}, {"ids", token_ids}});
  CHECK(cache.compilations() == 2);
}

TEST_CASE("a shape that depends on data compiles in stages, the rest once per shape it takes", "[lower][staged]") {
  // NonZero's count is data: the nodes after it are compiled when a run gives them a shape.
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{2, 3});
  Value* relu = g.add_op("Relu", {x}, {}, "relu");  // static: compiled with the model
  Value* nz = g.add_node("NonZero", {relu}, {"nz"}, {}, "nz")->output(0);
  Value* rows = g.add_op("Transpose", {nz}, {{"perm", std::vector<std::int64_t>{1, 0}}}, "rows");
  Value* y = g.add_op("Mul", {g.add_op("Cast", {rows}, {{"to", std::int64_t{1}}}, "as_float"),
                             g.add_constant("two", Tensor::scalar<float>(2.0f))}, {}, "y");
  g.add_output(y);
  g.add_output(relu);
  infer_shapes(g);
  std::vector<std::string> log;
  lower::CompileOptions options;
  options.log = [&log](const std::string& line) { log.push_back(line); };
  options.shape_plan = lower::ShapePlan::PerShape;  // the later stages compiled per shape (else shape-free)
  CompiledModel m = lower::compile(g.clone(), options);
  REQUIRE(m.continuation());
  std::string all;
  for (auto& line : log) all += line + "\n";
  INFO(all);
  CHECK(all.find("staged") != std::string::npos);
  CHECK(all.find("NonZero 'nz'") != std::string::npos);
  CHECK(m.to_text().find("NonZero 'nz'") != std::string::npos);
  ReferenceExecutor reference(g);
  for (auto values : {std::vector<float>{1, -1, 2, 0, 3, 4}, std::vector<float>{-1, -1, 5, 0, 0, -2},
                      std::vector<float>{1, 2, 3, 4, 5, 6}, std::vector<float>{-1, -1, -1, -1, -1, -1}}) {
    std::map<std::string, Tensor> in{{"x", Tensor::from_vector<float>({2, 3}, values)}};
    auto got = m.run(in);
    auto want = reference.run(in);
    REQUIRE(got.size() == 2);
    for (auto& [name, t] : want) {  // exact (copies, a relu and a doubling), zeros and empties included
      INFO(name);
      REQUIRE(got.at(name).dims() == t.dims());
      REQUIRE(got.at(name).dtype() == t.dtype());
      CHECK((t.nbytes() == 0 || std::memcmp(got.at(name).raw(), t.raw(), t.nbytes()) == 0));  // empty: no data pointer
    }
  }
  // Counts of 4, 1, 6 and 0 nonzeros compiled a shape each (the empty one: its nodes without elements on
  // their reference kernels).
  CHECK(m.to_text().find("4 compiled so far") != std::string::npos);

  // A profile covers the later stages: NonZero on its reference kernel (a slow path, named), the rest's
  // steps compiled per shape; what is left outside every step is the binding and the copies.
  ExecContext ctx = m.make_context();
  ctx.profile = true;
  std::map<std::string, Tensor> in{{"x", Tensor::from_vector<float>({2, 3}, {1, -1, 2, 0, 3, 4})}}, out;
  for (int i = 0; i < 3; ++i) m.run(ctx, in, out);
  const std::string profile = m.profile_text(ctx);
  INFO(profile);
  CHECK(profile.find("NonZero") != std::string::npos);
  CHECK(profile.find("NonZero 'nz' reference (a later stage)") != std::string::npos);
  CHECK(profile.find("Mul ") != std::string::npos);  // the rest's last step, compiled at run time
  CHECK(ctx.later_stage_times().entries().size() >= 3);
  ctx.reset_profile();
  CHECK(ctx.later_stage_times().entries().empty());
}

TEST_CASE("an empty tensor is a shape: zero proposals compile, the work that has elements stays on oneDNN",
          "[lower][symbolic][corpus]") {
  // Faster R-CNN's box head over [K, 5] proposals: K = 0 happens (a pyramid level that no proposal maps
  // to, an image without candidates). The backbone still has its whole image to compute; only the nodes
  // without elements may leave oneDNN. (Before, any empty input of a later stage sent that whole stage
  // to the reference executor: 2 s an image for torchvision's Faster R-CNN, whose box head ran on the
  // reference GEMM whenever one level had no proposal.)
  Graph g = ondine::onnx::load_model((corpus_dir("roi_box_head") / "model.onnx").string());
  Case c = load_case("roi_box_head", 0);
  c.inputs["proposals"] = Tensor(DType::Float32, {0, 5});
  lower::CompileOptions options;
  options.threads = 1;
  lower::ShapeCache cache(g.clone(), options);
  auto got = cache.run(c.inputs);
  auto want = ReferenceExecutor(g).run(c.inputs);
  for (auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.at(name).dims() == t.dims());
    CHECK(t.numel() == 0);
  }
  Graph bound = g.clone();
  bind_dims(bound, {{"batch", 1}, {"height", 64}, {"width", 64}, {"rois", 0}});
  CompiledModel m = lower::compile(std::move(bound), options);
  std::size_t convs = 0, reference_convs = 0, reference_steps = 0;
  for (const runtime::StepInfo& s : m.steps()) {
    const bool reference = s.implementation == "reference" || s.implementation.rfind("no elements", 0) == 0;
    if (s.implementation == "no elements (reference kernel)") {
      ++reference_steps;
      CHECK(!s.slow_path());  // they cost nothing: no slow path in the reports
    }
    if (s.op.find("Conv") != std::string::npos) {
      ++convs;
      reference_convs += reference;
    }
  }
  CHECK(convs >= 1);
  CHECK(reference_convs == 0);  // must not fire: the image is not empty
  CHECK(reference_steps >= 1);  // RoiAlign and the box head: no elements
  auto run = m.run(c.inputs);
  CHECK(run.at("scores").dims() == std::vector<std::int64_t>{0, 5});
  CHECK(run.at("deltas").dims() == std::vector<std::int64_t>{0, 20});
}

TEST_CASE("FPN box head: pyramid levels merged by scatter-rows, an empty level compiled, equal to PyTorch",
          "[lower][staged][corpus]") {
  // torchvision's MultiScaleRoIAlign as exported: NonZero per level (the rest of the model is a later
  // stage), RoiAlign there, the levels merged by ScatterElements over an expanded index, which
  // scatter-rows makes a ScatterND of whole rows. Case 1 sends no proposal to the stride-8 level.
  Graph g = ondine::onnx::load_model((corpus_dir("fpn_box_head") / "model.onnx").string());
  std::vector<std::string> log;
  lower::CompileOptions options;
  options.threads = 1;
  options.log = [&log](const std::string& line) { log.push_back(line); };
  lower::ShapeCache cache(g.clone(), options);
  ReferenceExecutor reference(g);
  for (int k = 0; k < 2; ++k) {
    INFO("case " << k);
    Case c = load_case("fpn_box_head", k);
    auto got = cache.run(c.inputs);
    auto ref = reference.run(c.inputs);
    for (auto& [name, expected] : c.outputs) {
      INFO(name);
      CHECK(rel_error(got.at(name), expected) < 1e-4);
      CHECK(rel_error(ref.at(name), expected) < 1e-4);
    }
  }
  // The pass summary of each compile: "scatter-rows <ms> <nodes> -> <nodes> <rewrites>".
  std::size_t rewrites = 0;
  for (const std::string& line : log)
    if (line.rfind("scatter-rows ", 0) == 0) rewrites += std::stoul(line.substr(line.find_last_of(' ') + 1));
  CHECK(rewrites >= 3);  // both levels' merges for case 0, the non-empty level's for case 1

  // A profile of the compiled model names the merge as ScatterND and has no Expand of the indices left.
  Graph bound = g.clone();
  Case c = load_case("fpn_box_head", 0);
  bind_dims(bound, {{"height", 160}, {"width", 192}, {"rois", 24}});
  CompiledModel m = lower::compile(std::move(bound), lower::CompileOptions{});
  ExecContext ctx = m.make_context();
  ctx.profile = true;
  std::map<std::string, Tensor> out;
  m.run(ctx, c.inputs, out);
  const std::string profile = m.profile_text(ctx);
  INFO(profile);
  CHECK(profile.find("\n  ScatterND ") != std::string::npos);  // a row of the table: op, implementation
  CHECK(profile.find("\n  ScatterElements ") == std::string::npos);
  CHECK(profile.find("\n  Expand ") == std::string::npos);
  CHECK(rel_error(out.at("scores"), c.outputs.at("scores")) < 1e-4);
}

TEST_CASE("norm head: PyTorch's GroupNorm and InstanceNorm exports run Ondine's kernel, equal to PyTorch",
          "[lower][groupnorm][corpus]") {
  // nn.GroupNorm exported as Reshape -> InstanceNormalization -> Reshape -> Mul -> Add (fuse-groupnorm
  // makes it one ondine.GroupNorm), followed by ReLU and by SiLU; nn.InstanceNorm2d(affine) + ReLU.
  Graph g = ondine::onnx::load_model((corpus_dir("norm_head") / "model.onnx").string());
  lower::ShapeCache cache(g.clone());
  for (int k = 0; k < 2; ++k) {
    INFO("case " << k);
    Case c = load_case("norm_head", k);
    auto got = cache.run(c.inputs);
    CHECK(rel_error(got.at("maps"), c.outputs.at("maps")) < 1e-4);
  }
  Graph bound = g.clone();
  Case c = load_case("norm_head", 0);
  bind_dims(bound, {{"batch", 1}, {"height", 64}, {"width", 80}});
  CompiledModel m = lower::compile(std::move(bound), lower::CompileOptions{});
  std::size_t kernels = 0;
  for (const auto& s : m.steps()) {
    INFO(s.op << " " << s.implementation);
    CHECK(s.implementation != "reference");
    CHECK(s.op != "Relu");     // folded into the normalisations
    CHECK(s.op != "Sigmoid");  // the SiLU too
    if (s.op == "GroupNorm" || s.op == "InstanceNormalization") {
      CHECK(s.implementation.rfind("ondine:", 0) == 0);
      ++kernels;
    }
  }
  CHECK(kernels == 4);
  CHECK(rel_error(m.run(c.inputs).at("maps"), c.outputs.at("maps")) < 1e-4);
}

TEST_CASE("convnext blocks: torchvision's ConvNeXt runs its MLPs as 1x1 convs and its LayerNorms in place, equal "
          "to PyTorch", "[lower][pointwise][corpus]") {
  // torch.onnx.export at opset 13 writes each LayerNorm as ReduceMean / Sub / Pow / Sqrt / Div between
  // permutes; fuse-layernorm and pointwise-as-conv leave no Transpose and no MatMul.
  Graph g = ondine::onnx::load_model((corpus_dir("convnext_blocks") / "model.onnx").string());
  lower::ShapeCache cache(g.clone());
  for (int k = 0; k < 2; ++k) {
    INFO("case " << k);
    Case c = load_case("convnext_blocks", k);
    CHECK(rel_error(cache.run(c.inputs).at("logits"), c.outputs.at("logits")) < 1e-4);
  }
  Graph bound = g.clone();
  Case c = load_case("convnext_blocks", 0);
  bind_dims(bound, {{"batch", 1}, {"height", 64}, {"width", 64}});
  CompiledModel m = lower::compile(std::move(bound), lower::CompileOptions{});
  std::size_t norms = 0, convs = 0;
  for (const auto& s : m.steps()) {
    INFO(s.op << " " << s.name << ": " << s.implementation);
    CHECK(s.implementation != "reference");
    CHECK(s.op != "Transpose");
    CHECK(s.op != "MatMul");
    CHECK(s.op != "Mul");  // layer scales folded into the second 1x1 convs
    if (s.op == "ChannelLayerNorm") {
      CHECK(s.implementation.rfind("ondine:", 0) == 0);
      ++norms;
    }
    convs += s.op == "FusedConv" || s.op == "Conv";
  }
  CHECK(norms == 6);   // stem, 3 blocks, downsampling, head
  CHECK(convs == 11);  // stem, 3 x (depthwise + two 1x1), downsampling
  CHECK(rel_error(m.run(c.inputs).at("logits"), c.outputs.at("logits")) < 1e-4);
}

TEST_CASE("token pool: the Loop PyTorch writes for tensor_split is unrolled; one plan, equal to PyTorch",
          "[lower][unroll-loops][corpus]") {
  // MViT's class-token split: SequenceEmpty + Loop { Slice; SequenceInsert } + SequenceAt. Without unroll-loops
  // the pooled K and V had no static shape and the model ran staged on the reference executor.
  Graph g = ondine::onnx::load_model((corpus_dir("token_pool") / "model.onnx").string());
  CHECK(g.count_ops("Loop") == 2);
  lower::ShapeCache cache(g.clone());
  for (int k = 0; k < 2; ++k) {
    INFO("case " << k);
    Case c = load_case("token_pool", k);
    CHECK(rel_error(cache.run(c.inputs).at("tokens"), c.outputs.at("tokens")) < 1e-4);
  }
  for (const char* passes : {"default", "none"}) {  // the shapes need the unrolling whatever the passes
    INFO("passes " << passes);
    Graph bound = g.clone();
    Case c = load_case("token_pool", 1);
    bind_dims(bound, {{"batch", 2}, {"height", 24}, {"width", 40}});
    lower::CompileOptions options;
    options.passes = passes;
    CompiledModel m = lower::compile(std::move(bound), options);
    CHECK_FALSE(m.continuation());
    for (const auto& s : m.steps()) {
      INFO(s.op << " " << s.name << ": " << s.implementation);
      CHECK(s.op != "Loop");
      CHECK(s.op.find("Sequence") == std::string::npos);
    }
    CHECK(rel_error(m.run(c.inputs).at("tokens"), c.outputs.at("tokens")) < 1e-4);
  }
}

TEST_CASE("a batch of zero compiles and runs: empty outputs, no crash", "[lower][symbolic][corpus]") {
  Graph g = ondine::onnx::load_model((corpus_dir("text_detector") / "model.onnx").string());
  Case c = load_case("text_detector", 0);
  std::vector<std::int64_t> dims = c.inputs.at("image").dims();
  dims[0] = 0;
  lower::ShapeCache cache(g.clone());
  auto got = cache.run({{"image", Tensor(DType::Float32, dims)}});
  auto want = ReferenceExecutor(g).run({{"image", Tensor(DType::Float32, dims)}});
  REQUIRE(got.at("probability").dims() == want.at("probability").dims());
  CHECK(got.at("probability").dims()[0] == 0);
  CHECK_THROWS_WITH([&] {
    Graph bad = g.clone();
    bind_dims(bad, {{"batch", -1}});
  }(), Catch::Contains("size >= 0"));
  // Must not fire at batch 1: PyTorch exports Resize with an empty constant roi, a parameter, not data.
  Graph one = g.clone();
  bind_dims(one, {{"batch", 1}, {"height", 64}, {"width", 64}});
  CompiledModel m = lower::compile(std::move(one));
  std::size_t resizes = 0;
  for (const runtime::StepInfo& s : m.steps()) {
    INFO(s.op << " '" << s.name << "': " << s.implementation);
    CHECK(s.implementation.rfind("no elements", 0) != 0);
    resizes += s.op == "Resize";
  }
  CHECK(resizes >= 1);
}

TEST_CASE("two inputs disagreeing on a dim: the error names both inputs and the dim", "[lower][symbolic]") {
  ShapeChain c = shape_chain();
  Graph& g = c.g;
  Value* mask = g.add_input("mask", DType::Float32, Shape{Dim::named("batch"), Dim::named("seq")});
  g.add_output(g.add_op("Relu", {c.x}, {}, "r"));
  g.add_output(g.add_op("Relu", {mask}, {}, "m"));
  infer_shapes(g);
  lower::ShapeCache cache(g.clone(), {});
  try {
    cache.run({{"x", Tensor(DType::Float32, {1, 5, 64})}, {"mask", Tensor(DType::Float32, {1, 6})}});
    FAIL("ran with seq bound twice");
  } catch (const Error& e) {
    std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("'seq'") != std::string::npos);
    CHECK(msg.find("'mask'") != std::string::npos);
    CHECK(msg.find("'x'") != std::string::npos);
  }
}

TEST_CASE("bad shapes: a wrong static dim names the dim and both sizes; two -1s in a computed target", "[lower][symbolic]") {
  ShapeChain c = shape_chain();
  Graph& g = c.g;
  g.add_output(g.add_op("Relu", {c.x}, {}, "r"));
  infer_shapes(g);
  lower::ShapeCache cache(g.clone(), {});
  try {
    cache.run({{"x", Tensor(DType::Float32, {1, 5, 63})}});
    FAIL("ran with dim 2 = 63");
  } catch (const Error& e) {
    std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("input 'x'") != std::string::npos);
    CHECK(msg.find("dim 2 is 63, expected 64") != std::string::npos);
  }

  // Reshape(x, Concat([-1], [-1], seq)): the target is known symbolically and has two -1s.
  ShapeChain d = shape_chain();
  Value* target = d.g.add_op("Concat", {d.g.add_constant("m1", ints({-1, -1})), d.seq1}, {{"axis", std::int64_t{0}}}, "t");
  d.g.add_output(d.g.add_op("Reshape", {d.x, target}, {}, "bad"));
  try {
    infer_shapes(d.g);
    FAIL("inferred a target with two -1s");
  } catch (const Error& e) {
    std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("Reshape") != std::string::npos);
    CHECK(msg.find("more than one -1") != std::string::npos);
  }
}

}  // namespace test_shape_values
