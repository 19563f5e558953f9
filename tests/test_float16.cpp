// Float16 models on the compiled engine (passes/widen_float16.hpp): structure (what the pass rewrites and
// what it leaves alone), numbers (the compiled model against PyTorch's float32 outputs and the float16
// reference executor), and must-not-fire cases (float32 models, float16 inside a subgraph).
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ondine/lower/lower.hpp"
#include "ondine/lower/shape_cache.hpp"
#include "ondine/ondine.hpp"
#include "support.hpp"

namespace test_float16 {

using namespace ondine;
namespace fs = std::filesystem;

namespace {

fs::path corpus_dir(const std::string& model) { return fs::path(ONDINE_TEST_DATA_DIR) / "torch" / model; }

std::size_t float16_values(const Graph& g) {
  std::size_t n = 0;
  for (const Node* node : g.topo_order())
    for (const Value* v : node->outputs()) n += v && v->dtype() == DType::Float16;
  for (const Value* c : g.constants()) n += c->dtype() == DType::Float16;
  return n;
}

Tensor to_float16(const Tensor& t) {
  Tensor out(DType::Float16, t.dims());
  const std::vector<float> v = t.to_floats();
  for (std::size_t i = 0; i < v.size(); ++i) out.data<float16>()[i] = float16(v[i]);
  return out;
}

}  // namespace

TEST_CASE("widen-float16: a float16 export runs its convolutions compiled, within float16 of PyTorch",
          "[passes][float16]") {
  Graph g = ondine::onnx::load_model((corpus_dir("unet_fp16") / "model.onnx").string());
  REQUIRE(float16_values(g) > 20);  // weights and activations
  // Structure: after the pipeline nothing is float16 any more, and no Cast is left (the model's I/O is float32).
  Graph optimised = g.clone();
  make_pass_manager().run(optimised);
  CHECK(float16_values(optimised) == 0);
  for (const Node* n : optimised.topo_order()) CHECK(n->op_type() != "Cast");
  // Numbers: each case against PyTorch's float32 outputs and against the float16 reference executor.
  lower::CompileOptions o;
  o.threads = 2;
  lower::ShapeCache model(g.clone(), o);
  ReferenceExecutor reference(g);
  for (int k = 0; k < 2; ++k) {
    INFO("case " << k);
    const std::string prefix = "case" + std::to_string(k) + ".";
    const Tensor image = load_npy((corpus_dir("unet_fp16") / (prefix + "image.npy")).string());
    const Tensor torch_mask = load_npy((corpus_dir("unet_fp16") / (prefix + "out.mask.npy")).string());
    auto got = model.run({{"image", image}});
    auto want = reference.run({{"image", image}});
    CHECK(got.at("mask").dtype() == DType::Float32);
    CHECK(test::rel_error(got.at("mask"), torch_mask) < 2e-2);
    CHECK(test::rel_error(got.at("mask"), want.at("mask")) < 2e-2);
    const auto& steps = model.get({{"batch", image.dims()[0]}, {"height", image.dims()[2]}, {"width", image.dims()[3]}})->steps();
    for (const auto& s : steps) {
      INFO(s.op << " '" << s.name << "': " << s.implementation);
      CHECK(!s.slow_path());
    }
  }
}

TEST_CASE("widen-float16: float16 inputs and outputs keep their names and dtypes; elementwise results are exact",
          "[passes][float16]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float16, Shape{Dim::named("n"), 8});
  Value* scale = g.add_constant("scale", to_float16(test::uniform_tensor({8}, 3)));
  Value* r = g.add_op("Relu", {x}, {}, "relu");
  Value* y = g.add_op("Mul", {r, scale}, {}, "mul");
  Value* z = g.add_op("Cast", {y}, {{"to", std::int64_t{10}}}, "cast");  // to float16: its own dtype
  g.add_output(y);
  g.add_output(z);
  infer_shapes(g);
  Graph widened = g.clone();
  PassContext ctx;
  CHECK(WidenFloat16{}.run(widened, ctx));
  infer_shapes(widened);
  widened.verify();
  REQUIRE(widened.inputs().size() == 1);
  CHECK(widened.inputs()[0]->name() == "x");
  CHECK(widened.inputs()[0]->dtype() == DType::Float16);
  for (const Value* out : widened.outputs()) CHECK(out->dtype() == DType::Float16);
  CHECK(widened.outputs()[0]->name() == g.outputs()[0]->name());
  CHECK(widened.outputs()[1]->name() == g.outputs()[1]->name());
  CHECK(widened.find_value("scale")->dtype() == DType::Float32);
  // Relu and a product of two float16 numbers are exact in float32: rounded once at the output, the bits
  // equal the float16 reference's.
  std::mt19937 rng(5);
  const Tensor in = to_float16(test::random_tensor({5, 8}, rng));
  auto want = ReferenceExecutor(g).run({{"x", in}});
  lower::CompileOptions o;
  o.threads = 1;
  lower::ShapeCache model(g.clone(), o);
  auto got = model.run({{"x", in}});
  for (const Value* out : g.outputs()) {
    INFO(out->name());
    REQUIRE(got.at(out->name()).dtype() == DType::Float16);
    CHECK(std::memcmp(got.at(out->name()).raw(), want.at(out->name()).raw(), want.at(out->name()).nbytes()) == 0);
  }
}

TEST_CASE("widen-float16: must not fire on float32 models or where a subgraph holds float16", "[passes][float16]") {
  Graph fp32 = ondine::onnx::load_model((corpus_dir("unet") / "model.onnx").string());
  PassContext ctx;
  CHECK_FALSE(WidenFloat16{}.run(fp32, ctx));

  // An If whose branches compute in float16: the graph is left as it is.
  Graph g;
  Value* c = g.add_input("c", DType::Bool, Shape{});
  Value* x = g.add_input("x", DType::Float16, Shape{4});
  auto branch = [&](const char* op) {
    auto sub = std::make_shared<Graph>();
    sub->add_output(sub->add_op(op, {sub->add_capture("x", DType::Float16, Shape{4})}));
    return sub;
  };
  Node* n = g.add_node("If", {c}, {"y"}, {{"then_branch", GraphAttr(branch("Relu"))}, {"else_branch", GraphAttr(branch("Neg"))}},
                       "if");
  n->add_implicit_input(x, "x");
  infer_shapes(g);
  g.add_output(n->output(0));
  Graph before = g.clone();
  CHECK_FALSE(WidenFloat16{}.run(g, ctx));
  CHECK(g.inputs()[1]->dtype() == DType::Float16);
  CHECK(g.topo_order().size() == before.topo_order().size());
}

}  // namespace test_float16
