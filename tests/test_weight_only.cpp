// Weight-only quantization: int4 / uint4 tensors (import, export, the reference's blocked
// DequantizeLinear), `quant::quantize_weights` and the opset-21 restatement it writes, ONNX Runtime's
// MatMulNBits as imported, fuse-weight-only and the weight-only kernel against the reference (every bit
// width, zero points or none, odd K and blocks, N off the tile width, 1 to 9 rows, each ISA the CPU has),
// the exported Llama-style decoder quantized end to end, and the errors for bad input.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "onnx/onnx_pb.h"
#include "ondine/lower/detail/weight_only.hpp"
#include "ondine/lower/dynamic.hpp"
#include "ondine/lower/lower.hpp"
#include "ondine/lower/shape_cache.hpp"
#include "ondine/onnx/export.hpp"
#include "ondine/onnx/import.hpp"
#include "ondine/passes/fuse_weight_only.hpp"
#include "ondine/passes/upgrade_opset.hpp"
#include "ondine/quant/weight_only.hpp"
#include "ondine/reference/executor.hpp"
#include "support.hpp"

namespace test_weight_only {

using namespace ondine;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Ints = std::vector<std::int64_t>;

namespace {

Tensor int4_tensor(DType t, Ints dims, unsigned seed) {
  Tensor out(t, dims);
  std::mt19937 rng(seed);
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    const int v = static_cast<int>(rng() % 16);
    if (t == DType::Int4) out.data<std::int8_t>()[i] = static_cast<std::int8_t>(v - 8);
    else out.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(v);
  }
  return out;
}

Tensor random_of(DType t, Ints dims, unsigned seed) {
  if (is_int4(t)) return int4_tensor(t, dims, seed);
  Tensor out(t, dims);
  std::mt19937 rng(seed);
  for (std::int64_t i = 0; i < out.numel(); ++i) static_cast<std::uint8_t*>(out.raw())[i] = static_cast<std::uint8_t>(rng());
  return out;
}

// MatMul(A [rows..., K], DequantizeLinear(Q [K, N], S, Z?, axis 0, block)) as quantize_weights writes it.
Graph dq_matmul(DType qt, std::int64_t K, std::int64_t N, std::int64_t block, bool zero_point, unsigned seed = 1) {
  Graph g;
  g.opsets[""] = 21;
  Value* a = g.add_input("a", DType::Float32, Shape({Dim::named("rows"), Dim(K)}));
  const std::int64_t blocks = (K + block - 1) / block;
  Value* q = g.add_constant("q", random_of(qt, {K, N}, seed));
  Value* s = g.add_constant("s", test::uniform_tensor({blocks, N}, seed + 1, 0.01f, 0.1f));
  std::vector<Value*> dq_in{q, s};
  if (zero_point) dq_in.push_back(g.add_constant("z", random_of(qt, {blocks, N}, seed + 2)));
  Value* w = g.add_node("DequantizeLinear", dq_in, {"w"}, {{"axis", Attribute(std::int64_t{0})}, {"block_size", Attribute(block)}},
                        "dq")->output(0);
  Value* y = g.add_node("MatMul", {a, w}, {"y"}, {}, "node_under_test")->output(0);
  g.add_output(y);
  infer_shapes(g);
  return g;
}

double rel_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.dims() == b.dims());
  double err = 0, mag = 1e-6;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    err = std::max(err, std::abs(a.at_double(static_cast<std::size_t>(i)) - b.at_double(static_cast<std::size_t>(i))));
    mag = std::max(mag, std::abs(b.at_double(static_cast<std::size_t>(i))));
  }
  return err / mag;
}

fs::path corpus_dir(const std::string& model) { return fs::path(ONDINE_TEST_DATA_DIR) / "torch" / model; }

std::string tmp(const std::string& name) {
  fs::create_directories(ONDINE_TEST_TMP_DIR);
  return (fs::path(ONDINE_TEST_TMP_DIR) / name).string();
}

}  // namespace

TEST_CASE("int4: packed two per byte in files, one per byte in memory, both ways", "[weight-only][onnx]") {
  for (DType t : {DType::Int4, DType::UInt4}) {
    for (std::int64_t count : {1, 6, 7}) {
      INFO(dtype_name(t) << " x" << count);
      Graph g;
      g.opsets[""] = 21;
      Tensor original = int4_tensor(t, {count}, 3);
      Value* c = g.add_constant("c", original);
      Value* x = g.add_input("x", DType::Float32, Shape({Dim(count)}));
      Value* y = g.add_node("DequantizeLinear", {c, g.add_constant("s", Tensor::from_vector<float>({}, {0.5f}))}, {"d"})->output(0);
      g.add_output(g.add_op("Add", {x, y}, {}, "y"));
      const std::string bytes = ondine::onnx::serialize_model(g);
      ::onnx::ModelProto proto;
      REQUIRE(proto.ParseFromString(bytes));
      const auto& init = proto.graph().initializer(0);
      CHECK(init.data_type() == (t == DType::Int4 ? 22 : 21));
      CHECK(init.raw_data().size() == static_cast<std::size_t>((count + 1) / 2));
      Graph back = ondine::onnx::load_model_from_memory(bytes.data(), bytes.size(), "", "int4.onnx");
      const Tensor& read = back.find_value("c")->constant();
      CHECK(read.dtype() == t);
      CHECK(std::memcmp(read.raw(), original.raw(), static_cast<std::size_t>(count)) == 0);
      // int32_data: one packed byte per entry.
      auto* tp = proto.mutable_graph()->mutable_initializer(0);
      std::string raw = tp->raw_data();
      tp->clear_raw_data();
      for (char b : raw) tp->add_int32_data(static_cast<std::uint8_t>(b));
      const std::string typed = proto.SerializeAsString();
      Graph from_typed = ondine::onnx::load_model_from_memory(typed.data(), typed.size(), "", "int4.onnx");
      CHECK(std::memcmp(from_typed.find_value("c")->constant().raw(), original.raw(), static_cast<std::size_t>(count)) == 0);
    }
  }
  // A raw_data of the unpacked size is refused, naming the tensor.
  ::onnx::ModelProto proto;
  Graph g;
  g.opsets[""] = 21;
  Value* c = g.add_constant("c", int4_tensor(DType::Int4, {4}, 1));
  g.add_output(g.add_node("DequantizeLinear", {c, g.add_constant("s", Tensor::from_vector<float>({}, {1.0f}))}, {"d"})->output(0));
  REQUIRE(proto.ParseFromString(ondine::onnx::serialize_model(g)));
  proto.mutable_graph()->mutable_initializer(0)->set_raw_data(std::string(4, '\0'));
  const std::string bad = proto.SerializeAsString();
  CHECK_THAT(test::error_of([&] { ondine::onnx::load_model_from_memory(bad.data(), bad.size(), "", "bad.onnx"); }),
             Contains("tensor 'c'") && Contains("needs 2"));
}

TEST_CASE("reference: blocked DequantizeLinear and QuantizeLinear to 4 bits", "[weight-only][reference]") {
  Graph g;
  g.opsets[""] = 21;
  // x [2, 5] int4, blocks of 2 along axis 1: scales [2, 3].
  Tensor x(DType::Int4, {2, 5});
  const std::int8_t xv[] = {-8, -1, 0, 3, 7, 1, 2, -3, -4, 5};
  std::memcpy(x.raw(), xv, sizeof(xv));
  Tensor s = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 0.5f, 0.25f, 4});
  Tensor z(DType::Int4, {2, 3});
  const std::int8_t zv[] = {0, 1, -1, 2, 0, 0};
  std::memcpy(z.raw(), zv, sizeof(zv));
  Value* y = g.add_node("DequantizeLinear", {g.add_constant("x", x), g.add_constant("s", s), g.add_constant("z", z)}, {"y"},
                        {{"axis", Attribute(std::int64_t{1})}, {"block_size", Attribute(std::int64_t{2})}})->output(0);
  g.add_output(y);
  infer_shapes(g);
  auto out = ReferenceExecutor(g).run({}).at("y");
  const float want[] = {-8, -1, -2, 4, 24, -0.5f, 0, -0.75f, -1, 20};
  for (int i = 0; i < 10; ++i) CHECK(out.data<float>()[i] == Approx(want[i]));
  // QuantizeLinear to int4 saturates at [-8, 7].
  Graph q;
  q.opsets[""] = 21;
  Value* in = q.add_input("in", DType::Float32, Shape({Dim(4)}));
  Tensor zero(DType::Int4, {});
  q.add_output(q.add_node("QuantizeLinear", {in, q.add_constant("s", Tensor::from_vector<float>({}, {0.5f})), q.add_constant("z", zero)},
                          {"o"})->output(0));
  infer_shapes(q);
  Tensor got = ReferenceExecutor(q).run({{"in", Tensor::from_vector<float>({4}, {-10, -1.25f, 1.25f, 10})}}).at("o");
  CHECK(got.dtype() == DType::Int4);
  const std::int8_t qv[] = {-8, -2, 2, 7};
  CHECK(std::memcmp(got.raw(), qv, 4) == 0);
  // A scale of the wrong blocked shape is an error naming the node.
  Graph bad;
  bad.opsets[""] = 21;
  bad.add_node("DequantizeLinear", {bad.add_constant("x", x), bad.add_constant("s", Tensor::from_vector<float>({2, 2}, {1, 1, 1, 1}))},
               {"y"}, {{"axis", Attribute(std::int64_t{1})}, {"block_size", Attribute(std::int64_t{2})}}, "node_under_test");
  CHECK_THAT(test::node_error([&] { infer_shapes(bad); }, "DequantizeLinear"), Contains("should be 3"));
}

TEST_CASE("quantize_weights: blocked DequantizeLinear in opset 21, within the quantization error of float32",
          "[weight-only][quant]") {
  test::GraphBuilder b;
  b.g.opsets[""] = 14;
  Value* x = b.input("x", {3, 96});
  Value* h = b.op("MatMul", {x, b.weight({96, 80})});
  Value* r = b.op("ReduceMean", {h}, {{"axes", Attribute(Ints{-1})}, {"keepdims", Attribute(std::int64_t{1})}});
  Value* y = b.op("MatMul", {b.op("Sub", {h, r}), b.weight({80, 40})});
  b.g.add_output(y);
  infer_shapes(b.g);
  std::map<std::string, Tensor> feed{{"x", test::uniform_tensor({3, 96}, 7)}};
  const Tensor want = ReferenceExecutor(b.g).run(feed).at(y->name());
  for (int bits : {4, 8})
    for (bool symmetric : {true, false}) {
      INFO(bits << " bits, symmetric " << symmetric);
      Graph g = b.g.clone();
      quant::WeightOnlyOptions o;
      o.bits = bits;
      o.symmetric = symmetric;
      quant::WeightOnlyReport report = quant::quantize_weights(g, o);
      CHECK(report.quantized.size() == 2);
      CHECK(g.opset() == 21);
      CHECK(g.count_ops("DequantizeLinear") == 2);
      // The ReduceMean's axes became an input (opset 18).
      for (Node* n : g.nodes())
        if (n->op_type() == "ReduceMean") CHECK((!n->has_attr("axes") && n->num_inputs() == 2));
      const std::string bytes = ondine::onnx::serialize_model(g);
      Graph back = ondine::onnx::load_model_from_memory(bytes.data(), bytes.size(), "", "q.onnx");
      const Tensor got = ReferenceExecutor(back).run(feed).at(y->name());
      CHECK(rel_diff(got, want) < (bits == 4 ? 0.15 : 0.01));
      CHECK(rel_diff(got, want) > 0);
      // Compiled: ondine.WeightOnlyMatMul, equal to the reference of the quantized file.
      lower::CompileOptions co;
      co.threads = 2;
      co.weight_only_int8_activations = false;
      lower::ShapeCache exact(back.clone(), co);
      CHECK(rel_diff(exact.run(feed).at(y->name()), got) < 1e-5);
      co.weight_only_int8_activations = true;  // the default: activations int8 per block, within their rounding
      lower::ShapeCache compiled(back.clone(), co);
      const double int8_error = rel_diff(compiled.run(feed).at(y->name()), got);
      CHECK(int8_error < 0.02);
      CHECK(int8_error > 0);
    }
  // The LM head (a MatMul writing a graph output) kept when asked.
  Graph g = b.g.clone();
  quant::WeightOnlyOptions o;
  o.lm_head = false;
  quant::WeightOnlyReport report = quant::quantize_weights(g, o);
  CHECK(report.quantized.size() == 1);
  REQUIRE(report.skipped.size() == 1);
  CHECK_THAT(report.skipped[0].second, Contains("LM head"));
}

TEST_CASE("fuse-qdq must not requantize a weight-only layer's 8-bit weights (what it does without VNNI)",
          "[weight-only][passes]") {
  // The default pipeline with this CPU-independent setting of a CPU without VNNI: int8 layers' 8-bit weights
  // halved to 7 bits. A MatMul whose activations are float (weight-only, per column or in blocks) is no int8
  // layer: its weights stay the file's, and fuse-weight-only takes it.
  for (bool blocked : {false, true}) {
    INFO((blocked ? "blocks of 16" : "per column"));
    Graph g = dq_matmul(DType::Int8, 64, 24, blocked ? 16 : 64, false);
    if (!blocked) {
      Node* dq = g.find_value("w")->producer();
      dq->set_attr("axis", Attribute(std::int64_t{1}));
      dq->remove_attr("block_size");
      g.find_value("s")->set_constant(test::uniform_tensor({24}, 2, 0.01f, 0.1f));
    }
    infer_shapes(g);
    Graph before = g.clone();
    PassManager pm = make_pass_manager();
    pm.context().options["fuse-qdq.max-abs-weight"] = "64";
    pm.context().options["fuse-qdq.u8-only"] = "1";
    pm.context().options["fuse-qdq.halve-weights"] = "1";
    pm.context().options["fuse-weight-only.activations"] = "float32";
    pm.run(g);
    CHECK(g.count_ops("WeightOnlyMatMul") == 1);
    std::map<std::string, Tensor> feed{{"a", test::uniform_tensor({3, 64}, 3)}};
    CHECK(rel_diff(ReferenceExecutor(g).run(feed).at("y"), ReferenceExecutor(before).run(feed).at("y")) < 1e-6);
  }
}

TEST_CASE("fuse-weight-only: structure and must-not-fire", "[weight-only][passes]") {
  PassManager pm;
  pm.add<FuseWeightOnly>();
  Graph g = dq_matmul(DType::Int4, 64, 48, 32, false);
  pm.run(g);
  CHECK(g.count_ops("WeightOnlyMatMul") == 1);
  CHECK(g.count_ops("DequantizeLinear") == 0);
  // Per-column int8 (block = K) fuses too.
  {
    Graph c;
    c.opsets[""] = 13;
    Value* a = c.add_input("a", DType::Float32, Shape({Dim(2), Dim(16)}));
    Value* w = c.add_node("DequantizeLinear", {c.add_constant("q", random_of(DType::Int8, {16, 8}, 1)),
                                               c.add_constant("s", test::uniform_tensor({8}, 2, 0.01f, 0.1f))},
                          {"w"}, {{"axis", Attribute(std::int64_t{1})}})->output(0);
    c.add_output(c.add_op("MatMul", {a, w}, {}, "y"));
    infer_shapes(c);
    Graph before = c.clone();
    PassManager exact;  // float32 activations: the fused op computes what it replaces
    exact.add<FuseWeightOnly>();
    exact.context().options.emplace("fuse-weight-only.activations", "float32");
    exact.run(c);
    CHECK(c.count_ops("WeightOnlyMatMul") == 1);
    std::map<std::string, Tensor> feed{{"a", test::uniform_tensor({2, 16}, 3)}};
    CHECK(rel_diff(ReferenceExecutor(c).run(feed).at("y"), ReferenceExecutor(before).run(feed).at("y")) < 1e-6);
  }
  // Must not fire: weights computed at run time, a DequantizeLinear along N in blocks, a Gather's table.
  {
    Graph c = dq_matmul(DType::Int4, 64, 48, 32, false);
    Node* dq = c.find_value("w")->producer();
    dq->set_attr("axis", Attribute(std::int64_t{1}));
    dq->set_attr("block_size", Attribute(std::int64_t{16}));
    c.find_value("s")->set_constant(test::uniform_tensor({64, 3}, 1, 0.01f, 0.1f));
    pm.run(c);
    CHECK(c.count_ops("WeightOnlyMatMul") == 0);
  }
  {
    Graph c;
    c.opsets[""] = 21;
    Value* a = c.add_input("a", DType::Float32, Shape({Dim(2), Dim(16)}));
    Value* q = c.add_input("q", DType::Int8, Shape({Dim(16), Dim(8)}));
    Value* w = c.add_node("DequantizeLinear", {q, c.add_constant("s", Tensor::from_vector<float>({}, {0.1f}))}, {"w"})->output(0);
    c.add_output(c.add_op("MatMul", {a, w}, {}, "y"));
    infer_shapes(c);
    pm.run(c);
    CHECK(c.count_ops("WeightOnlyMatMul") == 0);
  }
}

TEST_CASE("weight-only kernel: every bit width against the reference, odd sizes, 1 to 9 rows, each ISA",
          "[weight-only][lower]") {
  struct Shape3 {
    std::int64_t K, N, block;
  };
  using namespace lower::detail::weight_only;
  // Every kernel this CPU runs: float32 activations, then int8 ones.
  std::vector<std::pair<Kernel, bool>> kernels{{Kernel{}, false}, {Kernel{tiles_scalar, 1, "scalar", tiles_int8_scalar}, true}};
#ifdef ONDINE_SIMD_X86
  const lower::IsaInfo isa = lower::effective_isa();
  if (isa.avx512) kernels.push_back({Kernel{tiles_avx512, 64, "avx512"}, false});
  if (isa.avx512 && isa.int8_vnni) kernels.push_back({Kernel{tiles_avx512, 64, "avx512_vnni", tiles_int8_vnni}, true});
  if (lower::isa_runs_on(lower::CpuIsa::Avx2, isa.isa)) {
    kernels.push_back({Kernel{tiles_avx2, 16, "avx2"}, false});
    kernels.push_back({Kernel{tiles_avx2, 16, "avx2", tiles_int8_avx2}, true});
  }
#endif
  for (DType qt : {DType::Int4, DType::UInt4, DType::Int8, DType::UInt8})
    for (bool zp : {false, true})
      for (Shape3 s : {Shape3{64, 64, 32}, Shape3{33, 70, 16}, Shape3{45, 17, 9}, Shape3{128, 130, 128}, Shape3{40, 24, 8}}) {
        Graph g = dq_matmul(qt, s.K, s.N, s.block, zp, static_cast<unsigned>(s.K + s.N));
        for (bool int8 : {false, true}) {
          Graph f = g.clone();
          PassManager pm;
          pm.add<FuseWeightOnly>();
          if (!int8) pm.context().options.emplace("fuse-weight-only.activations", "float32");
          pm.run(f);
          REQUIRE(f.count_ops("WeightOnlyMatMul") == 1);
          const Node* n = f.find_value("y")->producer();
          // A block the int8 kernels cannot take (not a multiple of 4 rows, or of 8 for 4 bits) stays float32.
          const bool int8_layout = s.block % (is_int4(qt) ? 8 : 4) == 0;
          CHECK(n->attr_int("int8_activations", 0) == (int8 && int8_layout ? 1 : 0));
          for (std::int64_t rows : {1, 2, 3, 4, 5, 9}) {
            Tensor a = test::uniform_tensor({rows, s.K}, static_cast<unsigned>(rows));
            const Tensor want = ReferenceExecutor(f).run({{"a", a}}).at("y");
            if (int8 && int8_layout)  // the definition's int8 activations: close to the float product, not equal
              CHECK(rel_diff(want, ReferenceExecutor(g).run({{"a", a}}).at("y")) < 0.05);
            for (const auto& [k, k_int8] : kernels) {
              if (k_int8 != int8) continue;
              INFO(dtype_name(qt) << " zp " << zp << " K " << s.K << " N " << s.N << " block " << s.block << " rows "
                                  << rows << " kernel " << k.name << (int8 ? " int8" : " float32"));
              auto packed = pack_node(*n, k);
              REQUIRE(packed);
              CHECK(packed->int8_activations == (int8 && int8_layout));
              Tensor got(DType::Float32, {rows, s.N});
              multiply(k, *packed, a.data<float>(), rows, got.data<float>(), 2);
              CHECK(rel_diff(got, want) < 1e-5);
            }
          }
        }
      }
}

TEST_CASE("MatMulNBits (ONNX Runtime's 4-bit Linear) imports as MatMul(A, DequantizeLinear(...))", "[weight-only][onnx]") {
  // A hand-written ModelProto: the import of a file format ONNX Runtime's quantizer writes (none of the
  // Debian packages writes it).
  const std::int64_t K = 40, N = 6, block = 16, blocks = 3, blob = 8;
  std::mt19937 rng(5);
  std::vector<std::uint8_t> packed(static_cast<std::size_t>(N * blocks * blob));
  for (auto& b : packed) b = static_cast<std::uint8_t>(rng());
  std::vector<float> scales(static_cast<std::size_t>(N * blocks));
  for (auto& s : scales) s = 0.01f + static_cast<float>(rng() % 100) / 1000.0f;
  std::vector<std::uint8_t> zps(static_cast<std::size_t>(N * 2));
  for (auto& z : zps) z = static_cast<std::uint8_t>(rng());
  auto model = [&](bool with_zp, bool float_zp) {
    ::onnx::ModelProto m;
    m.set_ir_version(8);
    auto* op = m.add_opset_import();
    op->set_version(17);
    auto* ms = m.add_opset_import();
    ms->set_domain("com.microsoft");
    ms->set_version(1);
    auto* gp = m.mutable_graph();
    gp->set_name("nbits");
    auto* in = gp->add_input();
    in->set_name("a");
    in->mutable_type()->mutable_tensor_type()->set_elem_type(1);
    auto* sh = in->mutable_type()->mutable_tensor_type()->mutable_shape();
    sh->add_dim()->set_dim_value(3);
    sh->add_dim()->set_dim_value(K);
    auto* out = gp->add_output();
    out->set_name("y");
    out->mutable_type()->mutable_tensor_type()->set_elem_type(1);
    auto* b = gp->add_initializer();
    b->set_name("B");
    b->set_data_type(2);
    for (auto d : {N, blocks, blob}) b->add_dims(d);
    b->set_raw_data(std::string(packed.begin(), packed.end()));
    auto* s = gp->add_initializer();
    s->set_name("scales");
    s->set_data_type(1);
    s->add_dims(N * blocks);
    s->set_raw_data(std::string(reinterpret_cast<const char*>(scales.data()), scales.size() * 4));
    auto* z = gp->add_initializer();
    z->set_name("zp");
    z->set_data_type(float_zp ? 1 : 2);
    z->add_dims(N * 2);
    if (float_zp) z->set_raw_data(std::string(static_cast<std::size_t>(N * 2 * 4), '\0'));
    else z->set_raw_data(std::string(zps.begin(), zps.end()));
    auto* n = gp->add_node();
    n->set_op_type("MatMulNBits");
    n->set_domain("com.microsoft");
    n->set_name("node_under_test");
    for (const char* i : {"a", "B", "scales"}) n->add_input(i);
    if (with_zp) n->add_input("zp");
    n->add_output("y");
    for (auto [name, v] : {std::pair<const char*, std::int64_t>{"K", K}, {"N", N}, {"bits", 4}, {"block_size", block}}) {
      auto* a = n->add_attribute();
      a->set_name(name);
      a->set_type(::onnx::AttributeProto::INT);
      a->set_i(v);
    }
    return m.SerializeAsString();
  };
  for (bool with_zp : {false, true}) {
    INFO("zero points " << with_zp);
    const std::string bytes = model(with_zp, false);
    Graph g = ondine::onnx::load_model_from_memory(bytes.data(), bytes.size(), "", "nbits.onnx");
    CHECK(g.count_ops("MatMulNBits") == 0);
    CHECK(g.count_ops("DequantizeLinear") == 1);
    CHECK(g.count_ops("MatMul") == 1);
    Tensor a = test::uniform_tensor({3, K}, 9);
    const Tensor got = ReferenceExecutor(g).run({{"a", a}}).at("y");
    // ONNX Runtime's definition, written out: W[n, k] = (nibble - zp) * scale, Y = A W^T.
    Tensor want(DType::Float32, {3, N});
    for (std::int64_t m = 0; m < 3; ++m)
      for (std::int64_t c = 0; c < N; ++c) {
        double acc = 0;
        for (std::int64_t k = 0; k < K; ++k) {
          const std::int64_t bi = k / block, j = k % block;
          const int q = (packed[static_cast<std::size_t>((c * blocks + bi) * blob + j / 2)] >> (4 * (j & 1))) & 0xf;
          const int zp = with_zp ? (zps[static_cast<std::size_t>(c * 2 + bi / 2)] >> (4 * (bi & 1))) & 0xf : 8;
          acc += a.data<float>()[m * K + k] * (q - zp) * scales[static_cast<std::size_t>(c * blocks + bi)];
        }
        want.data<float>()[m * N + c] = static_cast<float>(acc);
      }
    CHECK(rel_diff(got, want) < 1e-5);
    lower::CompileOptions co;
    co.threads = 1;
    co.weight_only_int8_activations = false;
    lower::ShapeCache compiled(g.clone(), co);
    CHECK(rel_diff(compiled.run({{"a", a}}).at("y"), want) < 1e-5);
  }
  const std::string bad = model(true, true);
  CHECK_THAT(test::node_error([&] { ondine::onnx::load_model_from_memory(bad.data(), bad.size(), "", "nbits.onnx"); }, "MatMulNBits"),
             Contains("zero_points of element type float32"));
}

TEST_CASE("weight-only Llama-style decoder: int4 and int8 against the reference, the decode's tokens",
          "[weight-only][corpus]") {
  const fs::path dir = corpus_dir("llama_kv");
  REQUIRE(fs::exists(dir / "model.onnx"));
  Graph fp32 = ondine::onnx::load_model((dir / "model.onnx").string());
  for (int bits : {4, 8}) {
    INFO(bits << " bits");
    Graph g = fp32.clone();
    quant::WeightOnlyOptions o;
    o.bits = bits;
    o.block_size = 16;
    quant::WeightOnlyReport report = quant::quantize_weights(g, o);
    CHECK(report.quantized.size() >= 8);
    const std::string path = tmp("llama_kv_w" + std::to_string(bits) + ".onnx");
    ondine::onnx::save_model(g, path);
    Graph loaded = ondine::onnx::load_model(path);
    lower::CompileOptions co;
    co.threads = 2;
    lower::ShapeCache cache(loaded.clone(), co);  // int8 activations (the default)
    INFO(cache.shape_plan_reason());
    REQUIRE(cache.shape_free() != nullptr);
    INFO(cache.shape_free()->to_text());
    CHECK(cache.shape_free()->to_text().find("int8 activations") != std::string::npos);
    co.weight_only_int8_activations = false;
    lower::ShapeCache exact(loaded.clone(), co);
    REQUIRE(exact.shape_free() != nullptr);
    CHECK(exact.shape_free()->to_text().find("float32 activations") != std::string::npos);
    ReferenceExecutor reference(loaded);
    for (int k = 0; k < 3; ++k) {
      std::map<std::string, Tensor> inputs, outputs;
      const std::string prefix = "case" + std::to_string(k) + ".";
      for (auto& e : fs::directory_iterator(dir)) {
        const std::string f = e.path().filename().string();
        if (f.rfind(prefix, 0) != 0) continue;
        const std::string name = f.substr(prefix.size(), f.size() - prefix.size() - 4);
        if (name.rfind("out.", 0) == 0) outputs[name.substr(4)] = load_npy(e.path().string());
        else inputs[name] = load_npy(e.path().string());
      }
      if (inputs.empty()) continue;
      INFO("case " << k);
      auto got = cache.run(inputs);
      auto got_exact = exact.run(inputs);
      auto want = reference.run(inputs);
      for (auto& [name, torch_out] : outputs) {
        INFO(name);
        CHECK(rel_diff(got_exact.at(name), want.at(name)) < 1e-4);
        CHECK(rel_diff(got.at(name), want.at(name)) < 0.05);  // int8 activations' rounding on top
        CHECK(rel_diff(got.at(name), torch_out) < (bits == 4 ? 0.3 : 0.08));  // the quantization's own error
      }
    }
    CHECK(cache.compilations() == 0);
    CHECK(exact.compilations() == 0);
  }
}

TEST_CASE("upgrade_opset: restated ops, and the forms it refuses", "[weight-only][passes]") {
  test::GraphBuilder b;
  b.g.opsets[""] = 11;
  Value* x = b.input("x", {2, 6});
  Value* s = b.op("Squeeze", {b.op("Unsqueeze", {x}, {{"axes", Attribute(Ints{0})}})}, {{"axes", Attribute(Ints{0})}});
  Node* split = b.node("Split", {s}, {{"axis", Attribute(std::int64_t{1})}, {"split", Attribute(Ints{2, 4})}}, 2);
  b.g.add_output(b.op("ReduceSum", {split->output(1)}, {{"axes", Attribute(Ints{1})}}));
  b.g.add_output(split->output(0));
  infer_shapes(b.g);
  std::map<std::string, Tensor> feed{{"x", test::uniform_tensor({2, 6}, 1)}};
  auto want = ReferenceExecutor(b.g).run(feed);
  Graph g = b.g.clone();
  upgrade_opset(g, 21);
  CHECK(g.opset() == 21);
  for (Node* n : g.nodes()) {
    CHECK(n->opset() == 21);
    CHECK(!n->has_attr("axes"));
    CHECK(!n->has_attr("split"));
  }
  infer_shapes(g);
  auto got = ReferenceExecutor(g).run(feed);
  for (auto& [name, t] : want) CHECK(rel_diff(got.at(name), t) == 0);
  Graph old;
  old.opsets[""] = 11;
  Value* in = old.add_input("x", DType::Float32, Shape({Dim(2), Dim(3)}));
  old.add_output(old.add_node("Softmax", {in}, {"y"}, {}, "node_under_test")->output(0));
  CHECK_THAT(test::node_error([&] { upgrade_opset(old, 21); }, "Softmax"), Contains("cannot be restated"));
}

}  // namespace test_weight_only
