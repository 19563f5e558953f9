// The quantize pass (QDQ insertion): structure, numbers against fp32 on the reference executor,
// must-not-fire cases, bad input, ONNX export, and the pass from a pipeline string.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "ondine/onnx/export.hpp"
#include "ondine/ir/stats.hpp"
#include "ondine/onnx/import.hpp"
#include "ondine/passes/pipeline.hpp"
#include "ondine/quant/calibration.hpp"
#include "support.hpp"
#include "ondine/quant/qdq.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_quant_qdq {

using namespace ondine;
using namespace ondine::quant;
namespace fs = std::filesystem;

namespace {

using test::error_of;
using test::random_tensor;

using Ints = std::vector<std::int64_t>;

// A seeded builder of small float nets.
struct Builder {
  Graph g;
  std::mt19937 rng{7};
  Value* input(const std::string& name, Ints dims) { return g.add_input(name, DType::Float32, Shape::from(dims)); }
  Value* conv(const std::string& name, Value* x, std::int64_t cin, std::int64_t cout, std::int64_t k = 3,
              bool bias = true) {
    float s = 1.0f / std::sqrt(static_cast<float>(cin * k * k));
    std::vector<Value*> in{x, g.add_constant(name + ".w", random_tensor({cout, cin, k, k}, rng, s))};
    if (bias) in.push_back(g.add_constant(name + ".b", random_tensor({cout}, rng, 0.1f)));
    std::int64_t p = k / 2;
    return g.add_node("Conv", in, {name}, {{"pads", Ints{p, p, p, p}}}, name)->output(0);
  }
  Value* op(const std::string& type, const std::vector<Value*>& in, const std::string& name,
            std::map<std::string, Attribute> attrs = {}) {
    return g.add_node(type, in, {name}, std::move(attrs), name)->output(0);
  }
  Graph finish(std::vector<Value*> outs) {
    for (Value* o : outs) g.add_output(o);
    infer_shapes(g);
    g.verify();
    return std::move(g);
  }
};

// x[1,3,8,8] -> conv1 -> relu1 -> conv2 -> relu2 -> pool(MaxPool 2x2) -> conv3 -> add(conv3, pool) -> relu3
//   -> gap -> flatten -> fc (Gemm 4->5) -> y
Graph small_resnet() {
  Builder b;
  Value* x = b.input("x", {1, 3, 8, 8});
  Value* r1 = b.op("Relu", {b.conv("conv1", x, 3, 4)}, "relu1");
  Value* r2 = b.op("Relu", {b.conv("conv2", r1, 4, 4)}, "relu2");
  Value* pool = b.op("MaxPool", {r2}, "pool", {{"kernel_shape", Ints{2, 2}}, {"strides", Ints{2, 2}}});
  Value* add = b.op("Add", {b.conv("conv3", pool, 4, 4), pool}, "add");
  Value* r3 = b.op("Relu", {add}, "relu3");
  Value* flat = b.op("Flatten", {b.op("GlobalAveragePool", {r3}, "gap")}, "flatten");
  Value* w = b.g.add_constant("fc.w", random_tensor({4, 5}, b.rng, 0.5f));
  Value* c = b.g.add_constant("fc.b", random_tensor({5}, b.rng, 0.1f));
  return b.finish({b.op("Gemm", {flat, w, c}, "fc")});
}

// x -> conv1 -> relu1 -> conv2 -> y
Graph conv_relu_conv() {
  Builder b;
  Value* x = b.input("x", {1, 3, 6, 6});
  Value* r = b.op("Relu", {b.conv("conv1", x, 3, 4)}, "relu1");
  return b.finish({b.conv("conv2", r, 4, 2)});
}

std::vector<Sample> samples(const Graph& g, std::size_t count, std::uint32_t seed) {
  return test::random_samples(g, count, seed);
}

Graph quantized(const Graph& fp32, const QuantizeOptions& opts = {}, QuantizeReport* report = nullptr,
                std::size_t calib_samples = 8) {
  CalibrationOptions copts;
  copts.activation_scheme.dtype = opts.activations;
  auto calib = calibrate(fp32, samples(fp32, calib_samples, 1), copts);
  Graph q = fp32.clone();
  QuantizeQDQ pass(calib, opts);
  PassContext ctx;
  pass.run(q, ctx);
  q.verify();
  if (report) *report = pass.report();
  return q;
}

Node* producer_of_input(const Graph& g, const std::string& node, std::size_t i) {
  for (Node* n : g.nodes())
    if (n->name() == node) return n->input(i) ? n->input(i)->producer() : nullptr;
  FAIL("no node " << node);
  return nullptr;
}

Node* node_named(const Graph& g, const std::string& name) {
  for (Node* n : g.nodes())
    if (n->name() == name) return n;
  return nullptr;
}

double cosine(const Tensor& a, const Tensor& b) {
  double dot = 0, na = 0, nb = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    double x = a.at_double(static_cast<std::size_t>(i)), y = b.at_double(static_cast<std::size_t>(i));
    dot += x * y;
    na += x * x;
    nb += y * y;
  }
  return dot / std::sqrt(na * nb);
}

double stddev(const Tensor& t) {
  double s = 0, s2 = 0;
  auto n = static_cast<double>(t.numel());
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    double v = t.at_double(static_cast<std::size_t>(i));
    s += v;
    s2 += v * v;
  }
  return std::sqrt(std::max(0.0, s2 / n - (s / n) * (s / n)));
}

// The worst output cosine of `q` against `fp32` over fresh seeded inputs (not the calibration set).
double worst_cosine(const Graph& fp32, const Graph& q, std::size_t count = 4) {
  ReferenceExecutor ef(fp32), eq(q);
  double worst = 1.0;
  for (auto& s : samples(fp32, count, 99)) {
    auto a = ef.run(s), b = eq.run(s);
    for (Value* o : fp32.outputs()) {
      REQUIRE(stddev(a.at(o->name())) > 1e-3);  // not vacuous
      worst = std::min(worst, cosine(a.at(o->name()), b.at(o->name())));
    }
  }
  return worst;
}

}  // namespace

// The quantization passes are registered by compiling (lower/pass_pipeline.hpp); these tests build their
// pipelines without compiling first.
static const bool qdq_tests_register_quantize = (quant::register_quantize_pass(), true);

TEST_CASE("Conv -> Relu -> Conv carries int8 between the convs; Q goes after the Relu", "[quant][qdq]") {
  Graph fp32 = conv_relu_conv();
  QuantizeReport report;
  Graph q = quantized(fp32, {}, &report);
  // Activations: x and relu1 (not conv1's output: only the Relu reads it). Weights and biases: 2 each.
  CHECK(q.count_ops("QuantizeLinear") == 2);
  CHECK(q.count_ops("DequantizeLinear") == 2 + 2 + 2);
  CHECK(report.quantized() == 2);
  CHECK(report.kept() == 0);
  CHECK(report.activations == 2);
  CHECK(report.weights == 2);
  CHECK(report.int32_biases == 2);

  Node* dq = producer_of_input(q, "conv2", 0);
  REQUIRE(dq);
  CHECK(dq->op_type() == "DequantizeLinear");
  Node* qn = dq->input(0)->producer();
  REQUIRE(qn->op_type() == "QuantizeLinear");
  CHECK(qn->input(0)->name() == "relu1");
  CHECK(qn->output(0)->dtype() == DType::UInt8);
  // conv1's output still feeds the Relu directly, in float.
  CHECK(producer_of_input(q, "relu1", 0)->name() == "conv1");
  // Relu output: range [0, max] in u8 has zero point 0.
  CHECK(qn->input(2)->constant().dtype() == DType::UInt8);
  CHECK(qn->input(2)->constant().at_int(0) == 0);
  // The graph output keeps its name and stays float.
  REQUIRE(q.outputs().size() == 1);
  CHECK(q.outputs()[0]->name() == "conv2");
  CHECK(q.outputs()[0]->producer()->op_type() == "Conv");
  // Every new node comes before its reader in the node order (scheduled, not appended).
  auto nodes = q.nodes();
  auto pos = [&](const Node* n) { return std::find(nodes.begin(), nodes.end(), n) - nodes.begin(); };
  CHECK(pos(dq) < pos(node_named(q, "conv2")));
  CHECK(pos(qn) < pos(dq));
}

TEST_CASE("weights become int8 constants with a per-channel DequantizeLinear; biases int32", "[quant][qdq]") {
  Graph fp32 = conv_relu_conv();
  Graph q = quantized(fp32);
  Node* conv1 = node_named(q, "conv1");
  Node* wdq = conv1->input(1)->producer();
  REQUIRE(wdq);
  REQUIRE(wdq->op_type() == "DequantizeLinear");
  CHECK(wdq->attr_int("axis") == 0);
  const Tensor& wq = wdq->input(0)->constant();
  const Tensor& w = fp32.find_value("conv1.w")->constant();
  CHECK(wq.dtype() == DType::Int8);
  CHECK(wq.dims() == w.dims());
  const Tensor& ws = wdq->input(1)->constant();
  CHECK(ws.dims() == Ints{4});
  const Tensor& wz = wdq->input(2)->constant();
  CHECK(wz.dtype() == DType::Int8);
  for (std::int64_t c = 0; c < 4; ++c) CHECK(wz.at_int(static_cast<std::size_t>(c)) == 0);
  // Symmetric per channel: each channel's largest |w| maps to +-127, and DQ(W_q) is within half a step.
  std::int64_t per = w.numel() / 4;
  for (std::int64_t c = 0; c < 4; ++c) {
    float scale = ws.data<float>()[c], absmax = 0;
    int qmax = 0;
    for (std::int64_t i = c * per; i < (c + 1) * per; ++i) {
      absmax = std::max(absmax, std::fabs(w.data<float>()[i]));
      qmax = std::max(qmax, std::abs(static_cast<int>(wq.data<std::int8_t>()[i])));
      CHECK(std::fabs(wq.data<std::int8_t>()[i] * scale - w.data<float>()[i]) <= scale * 0.5f + 1e-7f);
    }
    CHECK(scale == Approx(absmax / 127.0f));
    CHECK(qmax == 127);
  }
  // Bias: int32, scale x_scale * w_scale per channel, zero point 0.
  Node* bdq = conv1->input(2)->producer();
  REQUIRE(bdq->op_type() == "DequantizeLinear");
  CHECK(bdq->input(0)->constant().dtype() == DType::Int32);
  float x_scale = static_cast<float>(conv1->input(0)->producer()->input(1)->constant().at_double(0));
  for (std::size_t c = 0; c < 4; ++c) {
    CHECK(bdq->input(1)->constant().data<float>()[c] == x_scale * ws.data<float>()[c]);
    CHECK(bdq->input(2)->constant().data<std::int32_t>()[c] == 0);
  }
}

TEST_CASE("a small ResNet block: Q/DQ on residual Add, MaxPool, GAP; shared values get one pair", "[quant][qdq]") {
  Graph fp32 = small_resnet();
  QuantizeReport report;
  Graph q = quantized(fp32, {}, &report);
  // Quantized: conv1-3, pool, add, gap, fc = 7 nodes.
  CHECK(report.quantized() == 7);
  CHECK(report.kept() == 0);
  auto by_op = report.quantized_by_op();
  CHECK(by_op["Conv"] == 3);
  CHECK(by_op["Add"] == 1);
  CHECK(by_op["MaxPool"] == 1);
  CHECK(by_op["GlobalAveragePool"] == 1);
  CHECK(by_op["Gemm"] == 1);
  // Activations: x, relu1, relu2, pool (read by conv3 and add: one pair), conv3, relu3, flatten.
  CHECK(report.activations == 7);
  CHECK(q.count_ops("QuantizeLinear") == 7);
  CHECK(producer_of_input(q, "conv3", 0) == producer_of_input(q, "add", 1));
  // MaxPool's output reuses its input's params (no second rounding).
  Node* pool_q = producer_of_input(q, "conv3", 0)->input(0)->producer();
  Node* relu2_q = producer_of_input(q, "pool", 0)->input(0)->producer();
  CHECK(pool_q->input(1)->constant().at_double(0) == relu2_q->input(1)->constant().at_double(0));
  CHECK(pool_q->input(2)->constant().at_int(0) == relu2_q->input(2)->constant().at_int(0));
  // Gemm weight [K, N] without transB: per column (axis 1); the bias is int32.
  Node* fc_w = producer_of_input(q, "fc", 1);
  CHECK(fc_w->attr_int("axis") == 1);
  CHECK(fc_w->input(1)->constant().dims() == Ints{5});
  CHECK(producer_of_input(q, "fc", 2)->input(0)->constant().dtype() == DType::Int32);
}

TEST_CASE("Gemm with transB, MatMul and activation x activation MatMul", "[quant][qdq]") {
  Builder b;
  Value* x = b.input("x", {2, 6});
  Value* g1 = b.op("Gemm", {x, b.g.add_constant("g.w", random_tensor({5, 6}, b.rng, 0.4f)),
                            b.g.add_constant("g.b", random_tensor({5}, b.rng, 0.1f))},
                   "gemm", {{"transB", std::int64_t{1}}});
  Value* m1 = b.op("MatMul", {b.op("Relu", {g1}, "relu"), b.g.add_constant("m.w", random_tensor({5, 3}, b.rng, 0.4f))}, "mm");
  Value* y = b.input("y", {3, 4});
  Graph fp32 = b.finish({b.op("MatMul", {m1, y}, "mm2")});
  QuantizeReport report;
  Graph q = quantized(fp32, {}, &report);
  CHECK(report.quantized() == 3);
  Node* gw = producer_of_input(q, "gemm", 1);
  CHECK(gw->attr_int("axis") == 0);  // transB: B is [N, K], output channels on axis 0
  CHECK(gw->input(1)->constant().dims() == Ints{5});
  CHECK(producer_of_input(q, "gemm", 2)->input(0)->constant().dtype() == DType::Int32);
  Node* mw = producer_of_input(q, "mm", 1);
  CHECK(mw->attr_int("axis") == 1);  // MatMul: the last axis
  CHECK(mw->input(1)->constant().dims() == Ints{3});
  // Both inputs of mm2 are activations: per tensor, no weight.
  CHECK(producer_of_input(q, "mm2", 0)->op_type() == "DequantizeLinear");
  CHECK(producer_of_input(q, "mm2", 1)->op_type() == "DequantizeLinear");
  CHECK(producer_of_input(q, "mm2", 1)->input(1)->constant().rank() == 0);
  CHECK(report.weights == 2);
  CHECK(worst_cosine(fp32, q) >= 0.99);
}

TEST_CASE("QDQ graphs match fp32 on the reference executor", "[quant][qdq][numbers]") {
  // Tolerance: output cosine >= 0.99 on 4 seeded inputs that were not in the calibration set.
  SECTION("conv-relu-conv, u8") {
    Graph fp32 = conv_relu_conv();
    CHECK(worst_cosine(fp32, quantized(fp32)) >= 0.99);
  }
  SECTION("small resnet, u8") {
    Graph fp32 = small_resnet();
    CHECK(worst_cosine(fp32, quantized(fp32)) >= 0.99);
  }
  SECTION("small resnet, s8 activations") {
    Graph fp32 = small_resnet();
    QuantizeOptions o;
    o.activations = DType::Int8;
    Graph q = quantized(fp32, o);
    for (Node* n : q.nodes())
      if (n->op_type() == "QuantizeLinear") CHECK(n->output(0)->dtype() == DType::Int8);
    CHECK(worst_cosine(fp32, q) >= 0.99);
  }
  SECTION("float biases") {
    Graph fp32 = small_resnet();
    QuantizeOptions o;
    o.int32_bias = false;
    QuantizeReport report;
    Graph q = quantized(fp32, o, &report);
    CHECK(report.int32_biases == 0);
    CHECK(report.float_biases == 4);
    CHECK(worst_cosine(fp32, q) >= 0.99);
  }
  SECTION("the int8 error is really there: not bit-identical to fp32") {
    Graph fp32 = conv_relu_conv();
    Graph q = quantized(fp32);
    auto s = samples(fp32, 1, 5)[0];
    auto a = ReferenceExecutor(fp32).run(s), b = ReferenceExecutor(q).run(s);
    CHECK(cosine(a.at("conv2"), b.at("conv2")) < 1.0 - 1e-9);
  }
}

TEST_CASE("exclude, include and keep-fp32-ends", "[quant][qdq]") {
  Graph fp32 = small_resnet();
  SECTION("exclude by node name") {
    QuantizeOptions o;
    o.exclude = {"conv2"};
    QuantizeReport report;
    Graph q = quantized(fp32, o, &report);
    CHECK(report.quantized() == 6);
    CHECK(producer_of_input(q, "conv2", 1) == nullptr);  // float weight constant
    CHECK(producer_of_input(q, "conv2", 0)->op_type() == "Relu");
    bool found = false;
    for (auto& d : report.nodes)
      if (d.node == "conv2") found = !d.quantized && d.reason == "in the exclude list";
    CHECK(found);
    CHECK(report.to_text().find("conv2 (Conv): in the exclude list") != std::string::npos);
  }
  SECTION("exclude by op type") {
    QuantizeOptions o;
    o.exclude = {"Add", "MaxPool", "GlobalAveragePool"};
    QuantizeReport report;
    Graph q = quantized(fp32, o, &report);
    CHECK(report.quantized() == 4);
    CHECK(producer_of_input(q, "add", 1)->op_type() == "MaxPool");
  }
  SECTION("include only convs") {
    QuantizeOptions o;
    o.include = {"Conv"};
    QuantizeReport report;
    quantized(fp32, o, &report);
    CHECK(report.quantized() == 3);
    CHECK(report.quantized_by_op() == std::map<std::string, std::size_t>{{"Conv", 3}});
  }
  SECTION("keep fp32 ends: the first conv and the last Gemm") {
    QuantizeOptions o;
    o.keep_fp32_ends = true;
    QuantizeReport report;
    Graph q = quantized(fp32, o, &report);
    CHECK(report.quantized() == 5);
    CHECK(producer_of_input(q, "conv1", 0) == nullptr);  // the graph input, unquantized
    CHECK(producer_of_input(q, "fc", 0)->op_type() == "Flatten");
    CHECK(producer_of_input(q, "conv2", 0)->op_type() == "DequantizeLinear");
    CHECK(worst_cosine(fp32, q) >= 0.99);
  }
}

TEST_CASE("must not fire", "[quant][qdq]") {
  SECTION("Add with a constant, Conv with a computed weight, MatMul of a constant, int inputs") {
    Builder b;
    Value* x = b.input("x", {1, 2, 4, 4});
    Value* biased = b.op("Add", {x, b.g.add_constant("k", random_tensor({1, 2, 1, 1}, b.rng))}, "add_const");
    Value* w = b.op("Relu", {b.input("w", {2, 2, 1, 1})}, "wrelu");
    Value* c = b.g.add_node("Conv", {biased, w}, {"conv"}, {}, "conv")->output(0);
    Value* flat = b.op("Flatten", {c}, "flat", {{"axis", std::int64_t{1}}});
    Value* m = b.op("MatMul", {b.g.add_constant("a", random_tensor({3, 1}, b.rng)), flat}, "mm");
    Graph fp32 = b.finish({m});
    QuantizeReport report;
    Graph q = quantized(fp32, {}, &report);
    CHECK(report.quantized() == 0);
    CHECK(report.nodes.size() == 3);
    CHECK(q.count_ops("QuantizeLinear") == 0);
    CHECK(q.count_ops("DequantizeLinear") == 0);
    CHECK(report.to_text().find("not a residual add") != std::string::npos);
    CHECK(report.to_text().find("weight is not a constant") != std::string::npos);
    CHECK(report.to_text().find("first input is a constant") != std::string::npos);
  }
  SECTION("a value without calibration keeps its readers fp32") {
    Graph fp32 = conv_relu_conv();
    auto calib = calibrate(fp32, samples(fp32, 2, 1));
    calib.tensors.erase("relu1");
    Graph q = fp32.clone();
    QuantizeQDQ pass(calib);
    PassContext ctx;
    pass.run(q, ctx);
    CHECK(pass.report().quantized() == 1);
    CHECK(pass.report().to_text().find("no calibration for input 'relu1'") != std::string::npos);
    CHECK(producer_of_input(q, "conv2", 0)->op_type() == "Relu");
  }
  SECTION("running the pass twice changes nothing the second time") {
    Graph fp32 = small_resnet();
    auto calib = calibrate(fp32, samples(fp32, 2, 1));
    Graph q = fp32.clone();
    PassContext ctx;
    CHECK(QuantizeQDQ(calib).run(q, ctx));
    std::size_t nodes = q.num_nodes();
    QuantizeQDQ again(calib);
    CHECK_FALSE(again.run(q, ctx));
    CHECK(q.num_nodes() == nodes);
    CHECK(again.report().quantized() == 0);
  }
  SECTION("a graph output read by a quantized node stays float under its name") {
    Builder b;
    Value* x = b.input("x", {1, 2, 4, 4});
    Value* r = b.op("Relu", {b.conv("c1", x, 2, 2)}, "r");
    Graph fp32 = b.finish({r, b.conv("c2", r, 2, 2)});
    Graph q = quantized(fp32);
    CHECK(q.outputs()[0]->name() == "r");
    CHECK(q.outputs()[0]->producer()->op_type() == "Relu");
    CHECK(worst_cosine(fp32, q) >= 0.99);
  }
}

TEST_CASE("zero ranges and bad params", "[quant][qdq]") {
  SECTION("a constant-zero activation quantizes to an exact zero (scale 1)") {
    Builder b;
    Value* x = b.input("x", {1, 2, 4, 4});
    Value* zero = b.op("Mul", {x, b.g.add_constant("zero", Tensor::scalar<float>(0.0f))}, "zero_out");
    Graph fp32 = b.finish({b.conv("conv", zero, 2, 2)});
    Graph q = quantized(fp32);
    Node* qn = producer_of_input(q, "conv", 0)->input(0)->producer();
    CHECK(qn->input(1)->constant().at_double(0) == 1.0);
    auto s = samples(fp32, 1, 3)[0];
    auto a = ReferenceExecutor(fp32).run(s), c = ReferenceExecutor(q).run(s);
    // Only the bias remains; int32 bias with x_scale 1 rounds it to the weight's grid.
    CHECK(cosine(a.at("conv"), c.at("conv")) > 0.99);
  }
  SECTION("a hand-made scale of zero is an Error naming the value") {
    Graph fp32 = conv_relu_conv();
    auto calib = calibrate(fp32, samples(fp32, 2, 1));
    calib.tensors.at("relu1").params.scale = {0.0f};
    Graph q = fp32.clone();
    PassContext ctx;
    std::string msg = error_of([&] { QuantizeQDQ(calib).run(q, ctx); });
    CHECK(msg.find("relu1") != std::string::npos);
    CHECK(msg.find("positive and finite") != std::string::npos);
  }
  SECTION("activation type must be u8 or s8") {
    Graph g = conv_relu_conv();
    QuantizeOptions o;
    o.activations = DType::Int32;
    PassContext ctx;
    CHECK(error_of([&] { QuantizeQDQ(calibrate(g, samples(g, 1, 1)), o).run(g, ctx); }).find("uint8 or int8") !=
          std::string::npos);
  }
}

TEST_CASE("opset: raised to 13 for per-axis DequantizeLinear, refused when an op changed meaning", "[quant][qdq]") {
  SECTION("opset 11 without such ops") {
    Graph fp32 = conv_relu_conv();
    fp32.opsets[""] = 11;
    QuantizeReport report;
    Graph q = quantized(fp32, {}, &report);
    CHECK(q.opset() == 13);
    CHECK(report.opset_raised_from == 11);
    for (Node* n : q.nodes())
      if (n->op_type() == "DequantizeLinear") CHECK(n->opset() == 13);
  }
  SECTION("opset 11 with Softmax") {
    Builder b;
    Value* x = b.input("x", {1, 2, 4, 4});
    Graph fp32 = b.finish({b.op("Softmax", {b.conv("conv", x, 2, 2)}, "sm")});
    fp32.opsets[""] = 11;
    auto calib = calibrate(fp32, samples(fp32, 1, 1));
    PassContext ctx;
    std::string msg = error_of([&] { QuantizeQDQ(calib).run(fp32, ctx); });
    CHECK(msg.find("opset 13") != std::string::npos);
    CHECK(msg.find("Softmax") != std::string::npos);
  }
}

TEST_CASE("the QDQ model exports to valid ONNX and reads back the same", "[quant][qdq][onnx]") {
  Graph fp32 = small_resnet();
  Graph q = quantized(fp32);
  fs::create_directories(ONDINE_TEST_TMP_DIR);
  std::string path = std::string(ONDINE_TEST_TMP_DIR) + "/qdq_small_resnet.onnx";
  ondine::onnx::save_model(q, path);
  Graph back = ondine::onnx::load_model(path);
  CHECK(back.opset() >= 13);
  CHECK(back.count_ops("QuantizeLinear") == q.count_ops("QuantizeLinear"));
  CHECK(back.count_ops("DequantizeLinear") == q.count_ops("DequantizeLinear"));
  Node* wdq = producer_of_input(back, "conv1", 1);
  REQUIRE(wdq->op_type() == "DequantizeLinear");
  CHECK(wdq->attr_int("axis") == 0);
  CHECK(wdq->input(0)->constant().dtype() == DType::Int8);
  CHECK(producer_of_input(back, "conv1", 2)->input(0)->constant().dtype() == DType::Int32);
  // Same numbers, bit for bit.
  auto s = samples(fp32, 1, 42)[0];
  auto a = ReferenceExecutor(q).run(s), b = ReferenceExecutor(back).run(s);
  const Tensor &ta = a.at("fc"), &tb = b.at("fc");
  REQUIRE(ta.numel() == tb.numel());
  for (std::int64_t i = 0; i < ta.numel(); ++i) CHECK(ta.data<float>()[i] == tb.data<float>()[i]);
}

TEST_CASE("the quantize pass from a pipeline string", "[quant][qdq][pipeline]") {
  Graph fp32 = small_resnet();
  auto calib = calibrate(fp32, samples(fp32, 4, 1));
  fs::create_directories(ONDINE_TEST_TMP_DIR);
  std::string file = std::string(ONDINE_TEST_TMP_DIR) + "/qdq_calibration.txt";
  std::ofstream(file) << calib.to_text();

  SECTION("quantize.calibration names the file") {
    PassManager pm = make_pass_manager("quantize");
    pm.context().options["quantize.calibration"] = file;
    pm.context().options["quantize.exclude"] = "conv2, Add";
    Graph q = fp32.clone();
    CHECK(pm.run(q));
    CHECK(q.count_ops("QuantizeLinear") > 0);
    CHECK(producer_of_input(q, "conv2", 1) == nullptr);
    CHECK(producer_of_input(q, "add", 1)->op_type() == "MaxPool");
    // Same graph as the pass built from the CalibrationResult directly (from_text reads back exactly).
    QuantizeOptions o;
    o.exclude = {"conv2", "Add"};
    Graph direct = fp32.clone();
    PassContext ctx;
    QuantizeQDQ(calib, o).run(direct, ctx);
    CHECK(direct.to_text() == q.to_text());
  }
  SECTION("missing option: a clear Error") {
    PassManager pm = make_pass_manager("quantize");
    Graph q = fp32.clone();
    std::string msg = error_of([&] { pm.run(q); });
    CHECK(msg.find("quantize.calibration") != std::string::npos);
  }
  SECTION("missing file: an Error naming it") {
    PassManager pm = make_pass_manager("quantize");
    pm.context().options["quantize.calibration"] = file + ".nope";
    Graph q = fp32.clone();
    CHECK(error_of([&] { pm.run(q); }).find("qdq_calibration.txt.nope") != std::string::npos);
    std::ofstream(file + ".bad") << "garbage\n";
    pm.context().options["quantize.calibration"] = file + ".bad";
    std::string msg = error_of([&] { pm.run(q); });
    CHECK(msg.find("qdq_calibration.txt.bad") != std::string::npos);
    CHECK(msg.find("not an ondine calibration text") != std::string::npos);
  }
  SECTION("bad activation type") {
    PassManager pm = make_pass_manager("quantize");
    pm.context().options["quantize.calibration"] = file;
    pm.context().options["quantize.activations"] = "u4";
    Graph q = fp32.clone();
    CHECK(error_of([&] { pm.run(q); }).find("u8 or s8") != std::string::npos);
  }
}

TEST_CASE("ResNet-50: QDQ output cosine >= 0.99 against fp32", "[quant][qdq][.slow]") {
  auto loaded = test::example_model("resnet50.onnx");
  if (!loaded) return;
  Graph fp32 = std::move(*loaded);
  std::map<std::string, std::int64_t> batch_1;
  for (auto& sym : symbolic_dims(fp32)) batch_1[sym] = 1;
  bind_dims(fp32, batch_1);
  make_pass_manager("remove-identity,fold-constants,dce,fold-bn").run(fp32);
  QuantizeReport report;
  Graph q = quantized(fp32, {}, &report, 4);
  INFO(report.to_text());
  CHECK(report.quantized_by_op()["Conv"] == 53);
  CHECK(worst_cosine(fp32, q, 2) >= 0.99);
}

}  // namespace test_quant_qdq
