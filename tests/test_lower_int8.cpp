// Tests of int8 lowering: QDQ graphs (QuantizeLinear/DequantizeLinear around float ops, as ONNX
// Runtime's quantizer and quant/qdq.hpp write them) through fuse-qdq into ondine.QConv / QMatMul /
// QPool and oneDNN int8 primitives.
// Structure: op counts after fuse-qdq (no Q/DQ left between consecutive int8 layers).
// Numbers: the compiled model (default pipeline) against the reference executor on the ORIGINAL QDQ
// graph. Graph outputs are DequantizeLinear of the last quantized value, so each output element is
// a multiple of the output scale; the tolerance is one quantization step of the output (the rescale
// runs in float in oneDNN, in double in the reference, and a tie may round the other way; a skipped
// intermediate rounding can move a value by one step). For chains of layers, where a one-step
// difference inside can move the next layer's result, the stated tolerance is 2 steps everywhere and
// 1 step for at least 99% of the elements. Must-not-fire cases stay float32 and are compared with the
// float tolerance 1e-4 relative.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "ondine/lower/lower.hpp"
#include "ondine/passes/fuse_qdq.hpp"
#include "ondine/quant/calibration.hpp"
#include "ondine/quant/qdq.hpp"
#include "ondine/reference/executor.hpp"

#if __has_include("ondine/onnx/import.hpp")
#include "ondine/onnx/import.hpp"
#define ONDINE_TEST_HAVE_IMPORT 1
#endif

#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_lower_int8 {

using namespace ondine;
using Dims = std::vector<std::int64_t>;

namespace {

// A seeded builder of QDQ graphs.
struct QBuilder {
  Graph g;
  unsigned seed = 7;
  std::mt19937 rng{7};

  Value* input(const std::string& name, const Dims& dims) { return g.add_input(name, DType::Float32, Shape::from(dims)); }
  Value* op(const std::string& type, const std::vector<Value*>& inputs, std::map<std::string, Attribute> attrs = {}) {
    return g.add_node(type, inputs, {""}, std::move(attrs), g.unique_name(type))->output(0);
  }
  Value* scalar_f(float v) { return g.add_constant(g.unique_name("s"), Tensor::from_vector<float>({}, {v})); }
  Value* zp(DType t, int v) {
    if (t == DType::UInt8) return g.add_constant(g.unique_name("z"), Tensor::from_vector<std::uint8_t>({}, {static_cast<std::uint8_t>(v)}));
    return g.add_constant(g.unique_name("z"), Tensor::from_vector<std::int8_t>({}, {static_cast<std::int8_t>(v)}));
  }
  // Q then DQ of x: the value an int8 layer reads.
  Value* qdq(Value* x, float scale, int zero_point, DType t = DType::UInt8) {
    Value* s = scalar_f(scale);
    Value* z = zp(t, zero_point);
    Value* q = op("QuantizeLinear", {x, s, z});
    return op("DequantizeLinear", {q, s, z});
  }
  Value* q(Value* x, float scale, int zero_point, DType t = DType::UInt8) {
    return op("QuantizeLinear", {x, scalar_f(scale), zp(t, zero_point)});
  }
  Value* dq(Value* xq, float scale, int zero_point, DType t = DType::UInt8) {
    return op("DequantizeLinear", {xq, scalar_f(scale), zp(t, zero_point)});
  }
  // DQ of random int8 weights with per-channel (along `axis`) or per-tensor scales; `wzp` a weight zero point.
  Value* qweight(const Dims& dims, std::int64_t axis, bool per_channel, int wzp = 0) {
    Tensor w(DType::Int8, dims);
    std::uniform_int_distribution<int> d(-127, 127);
    for (std::int64_t i = 0; i < w.numel(); ++i) w.data<std::int8_t>()[i] = static_cast<std::int8_t>(d(rng));
    std::int64_t c = per_channel ? dims[static_cast<std::size_t>(axis)] : 1;
    std::uniform_real_distribution<float> sd(0.002f, 0.006f);
    std::vector<float> s(static_cast<std::size_t>(c));
    for (auto& e : s) e = sd(rng);
    Value* wv = g.add_constant(g.unique_name("wq"), w);
    Value* sv = g.add_constant(g.unique_name("ws"), per_channel ? Tensor::from_vector<float>({c}, s)
                                                                 : Tensor::from_vector<float>({}, s));
    std::vector<Value*> in{wv, sv};
    if (wzp != 0 || per_channel) {
      std::vector<std::int8_t> z(static_cast<std::size_t>(c), static_cast<std::int8_t>(wzp));
      in.push_back(g.add_constant(g.unique_name("wz"), per_channel ? Tensor::from_vector<std::int8_t>({c}, z)
                                                                  : Tensor::from_vector<std::int8_t>({}, z)));
    }
    return op("DequantizeLinear", in, {{"axis", axis}});
  }
  Value* fbias(std::int64_t c) {
    std::uniform_real_distribution<float> d(-0.2f, 0.2f);
    std::vector<float> b(static_cast<std::size_t>(c));
    for (auto& e : b) e = d(rng);
    return g.add_constant(g.unique_name("b"), Tensor::from_vector<float>({c}, b));
  }
  // DQ of an int32 bias with scale x_scale * w_scale (per tensor here).
  Value* ibias(std::int64_t c, float scale) {
    std::uniform_int_distribution<int> d(-2000, 2000);
    std::vector<std::int32_t> b(static_cast<std::size_t>(c));
    for (auto& e : b) e = d(rng);
    return op("DequantizeLinear", {g.add_constant(g.unique_name("bq"), Tensor::from_vector<std::int32_t>({c}, b)),
                                   scalar_f(scale)});
  }
  Value* conv(Value* x, std::int64_t oc, std::int64_t ic, std::int64_t k, std::map<std::string, Attribute> attrs = {},
              bool bias = true, std::int64_t group = 1) {
    if (group > 1) attrs["group"] = group;
    std::vector<Value*> in{x, qweight({oc, ic / group, k, k}, 0, true)};
    if (bias) in.push_back(fbias(oc));
    return op("Conv", in, attrs);
  }
};

Tensor random_input(const Dims& dims, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Tensor t(DType::Float32, dims);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

std::size_t count(const Graph& g, const std::string& op_key) {
  std::size_t c = 0;
  for (Node* n : g.nodes()) c += n->op_key() == op_key;
  return c;
}

// The file's own int8 weights on every CPU: these tests check the kernels against the reference, so a
// CPU without VNNI keeps 8-bit-weight layers float rather than requantizing them to 7 bits (the default,
// tested in "int8 by default without VNNI").
lower::CompileOptions exact_weights() {
  lower::CompileOptions o;
  o.int8_7bit_weights = false;
  return o;
}

// The graph after the passes compile runs first (fuse-qdq through the default pipeline).
Graph optimized(const Graph& g) {
  Graph c = g.clone();
  infer_shapes(c);
  PassManager pm = make_pass_manager();
  pm.run(c);
  return c;
}

// Compiles `g`, runs both, and checks every output within `steps` quantization steps of `step`
// (and at least `frac_one` of the elements within one step). Returns the compiled model.
CompiledModel check_int8(const Graph& g, double step, double steps = 1.0, double frac_one = 1.0) {
  infer_shapes(const_cast<Graph&>(g));
  std::map<std::string, Tensor> inputs;
  unsigned seed = 11;
  for (Value* in : g.inputs()) inputs[in->name()] = random_input(in->shape().sizes(), seed++);
  auto want = ReferenceExecutor(g).run(inputs);
  CompiledModel m = lower::compile(g, exact_weights());
  auto got = m.run(inputs);
  for (auto& [name, w] : want) {
    const Tensor& o = got.at(name);
    REQUIRE(o.dims() == w.dims());
    double lo = 1e30, hi = -1e30, worst = 0;
    std::size_t within_one = 0;
    for (std::int64_t i = 0; i < w.numel(); ++i) {
      double a = w.at_double(static_cast<std::size_t>(i)), b = o.at_double(static_cast<std::size_t>(i));
      lo = std::min(lo, a);
      hi = std::max(hi, a);
      double d = std::abs(a - b);
      worst = std::max(worst, d);
      within_one += d <= step * 1.0001 + 1e-6;
    }
    INFO(name << ": worst " << worst << " (step " << step << "), within one step " << within_one << "/" << w.numel());
    REQUIRE(hi - lo > 4 * step);  // non-trivial: many distinct levels
    CHECK(worst <= steps * step * 1.0001 + 1e-6);
    CHECK(static_cast<double>(within_one) >= frac_one * static_cast<double>(w.numel()));
  }
  return m;
}

std::size_t steps_with(const CompiledModel& m, const std::string& op, const std::string& impl_part) {
  std::size_t c = 0;
  for (auto& s : m.steps()) c += s.op == op && s.implementation.find(impl_part) != std::string::npos;
  return c;
}

}  // namespace

// The quantization passes are registered by compiling (lower/pass_pipeline.hpp); these tests build their
// pipelines without compiling first.
static const bool lower_int8_tests_register_quantization = (lower::register_quantization_passes(), true);

TEST_CASE("int8 conv + relu, u8 activations with a zero point, per-channel weights") {
  if (!lower::effective_isa().int8_vnni) {  // checks int8 kernels that CPUs without VNNI keep float
    WARN("skipped: needs VNNI (oneDNN ISA " << lower::effective_isa().name << ")");
    return;
  }
  for (bool relu : {false, true}) {
    QBuilder b;
    Value* x = b.qdq(b.input("x", {1, 16, 12, 12}), 0.01f, 128);
    Value* y = b.conv(x, 32, 16, 3, {{"pads", std::vector<std::int64_t>{1, 1, 1, 1}}});
    if (relu) y = b.op("Relu", {y});
    Value* out = b.qdq(y, 0.02f, relu ? 0 : 100);
    b.g.add_output(out);
    Graph o = optimized(b.g);
    CHECK(count(o, "ondine.QConv") == 1);
    CHECK(count(o, "Conv") == 0);
    CHECK(count(o, "Relu") == 0);
    CompiledModel m = check_int8(b.g, 0.02);
    CHECK(steps_with(m, "QConv", "int8") + steps_with(m, "QConv", "vnni") + steps_with(m, "QConv", "x8s8") >= 1);
  }
}

// On AMD cores with AVX-512 VNNI the 1x1 int8 convs take oneDNN's jit_int8_1x1 kernel (faster there than
// the brgemm one oneDNN lists first); the numbers are those of any kernel.
TEST_CASE("int8 1x1 conv: the kernel preferred on this CPU, equal to the reference") {
  QBuilder b;
  Value* x = b.qdq(b.input("x", {2, 24, 9, 9}), 0.01f, 120);
  Value* y = b.op("Relu", {b.conv(x, 40, 24, 1)});
  b.g.add_output(b.qdq(y, 0.02f, 0));
  CompiledModel m = check_int8(b.g, 0.02);
  bool prefer = lower::detail::prefer_jit_int8_1x1({1, 1}, {1, 1});
  INFO("vendor " << lower::cpu_vendor() << ", isa " << lower::effective_isa().name);
  CHECK(steps_with(m, "QConv", "jit_int8_1x1") == (prefer ? 1u : steps_with(m, "QConv", "jit_int8_1x1")));
  CHECK_FALSE(lower::detail::prefer_jit_int8_1x1({3, 3}, {1, 1}));
  CHECK_FALSE(lower::detail::prefer_jit_int8_1x1({1, 1}, {2, 2}));
}

// oneDNN's AMX brgemm convs take no source zero point, so where no padding reads it the compiler folds it
// into the bias (-zp * sum(w[c])); K = 640 passes the 2^24 bound where f32 stops being exact.
TEST_CASE("int8 conv source zero point: in the bias where no padding reads it, else a runtime zero point") {
  if (!lower::effective_isa().int8_vnni) {  // checks int8 kernels that CPUs without VNNI keep float
    WARN("skipped: needs VNNI (oneDNN ISA " << lower::effective_isa().name << ")");
    return;
  }
  struct Case {
    std::int64_t ic, k, pad, group;
    bool bias;
    bool folded;
  };
  for (Case c : {Case{24, 1, 0, 1, true, true}, Case{24, 1, 0, 1, false, true}, Case{640, 1, 0, 1, true, true},
                 Case{16, 3, 0, 1, true, true}, Case{16, 3, 1, 1, true, false}, Case{16, 3, 0, 16, true, true},
                 Case{16, 3, 1, 16, false, false}}) {
    INFO("ic " << c.ic << " k " << c.k << " pad " << c.pad << " group " << c.group << " bias " << c.bias);
    QBuilder b;
    Value* x = b.qdq(b.input("x", {2, c.ic, 9, 9}), 0.01f, 131);
    std::int64_t oc = c.group > 1 ? c.ic : 40;
    Value* y = b.conv(x, oc, c.ic, c.k, {{"pads", std::vector<std::int64_t>(4, c.pad)}}, c.bias, c.group);
    b.g.add_output(b.qdq(y, c.ic > 100 ? 0.08f : 0.02f, 120));
    CompiledModel m = check_int8(b.g, c.ic > 100 ? 0.08 : 0.02);
    std::size_t folded = 0;
    for (auto& s : m.steps()) folded += s.op == "QConv" && s.detail.find("x_zp in bias") != std::string::npos;
    CHECK(folded == (c.folded ? 1u : 0u));
  }
}

TEST_CASE("int8 conv chain: no Q/DQ between consecutive convs; u8 and s8 activations") {
  for (DType t : {DType::UInt8, DType::Int8}) {
    QBuilder b;
    int z = t == DType::UInt8 ? 128 : 0;
    Value* x = b.qdq(b.input("x", {2, 8, 10, 10}), 0.01f, z, t);
    Value* y = b.op("Relu", {b.conv(x, 16, 8, 3, {{"pads", std::vector<std::int64_t>{1, 1, 1, 1}}})});
    y = b.qdq(y, 0.01f, 0, t);
    y = b.op("Relu", {b.conv(y, 16, 16, 1)});
    y = b.qdq(y, 0.01f, 0, t);
    y = b.conv(y, 8, 16, 3, {{"strides", std::vector<std::int64_t>{2, 2}}});
    b.g.add_output(b.qdq(y, 0.02f, z, t));
    Graph o = optimized(b.g);
    CHECK(count(o, "ondine.QConv") == 3);
    CHECK(count(o, "QuantizeLinear") == 1);    // the input's
    CHECK(count(o, "DequantizeLinear") == 1);  // the output's
    check_int8(b.g, 0.02, 2.0, 0.99);
  }
}

TEST_CASE("int8 depthwise conv and a float32 output (no Q after the conv)") {
  QBuilder b;
  Value* x = b.qdq(b.input("x", {1, 16, 9, 9}), 0.01f, 120);
  Value* y = b.op("Relu", {b.conv(x, 16, 16, 3, {{"pads", std::vector<std::int64_t>{1, 1, 1, 1}}}, true, 16)});
  y = b.qdq(y, 0.01f, 0);
  Value* f = b.conv(y, 8, 16, 1);  // QConv with a float32 output
  b.g.add_output(f);
  Graph o = optimized(b.g);
  CHECK(count(o, "ondine.QConv") == 2);
  // Float output: compare with 1% of the output range (the int8 inputs are identical on both sides).
  infer_shapes(b.g);
  auto in = random_input({1, 16, 9, 9}, 3);
  auto want = ReferenceExecutor(b.g).run({{"x", in}}).at(f->name());
  auto got = lower::compile(b.g, exact_weights()).run({{"x", in}}).at(f->name());
  double worst = 0, mag = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    mag = std::max(mag, std::abs(want.at_double(static_cast<std::size_t>(i))));
    worst = std::max(worst, std::abs(want.at_double(static_cast<std::size_t>(i)) - got.at_double(static_cast<std::size_t>(i))));
  }
  REQUIRE(mag > 0.01);
  CHECK(worst <= 1e-4 * mag + 0.02 * 0.01 * 16);  // the depthwise result may differ by a step of 0.01
}

TEST_CASE("int8 residual: Conv -> Q -> DQ -> Add(DQ(skip)) -> Relu -> Q folds into one QConv with a sum") {
  for (DType t : {DType::UInt8, DType::Int8}) {
    QBuilder b;
    int z = t == DType::UInt8 ? 10 : 0;
    Value* x = b.qdq(b.input("x", {1, 16, 8, 8}), 0.02f, z, t);
    Value* a = b.qdq(b.op("Relu", {b.conv(x, 16, 16, 1)}), 0.01f, z, t);
    Value* c = b.qdq(b.conv(a, 16, 16, 3, {{"pads", std::vector<std::int64_t>{1, 1, 1, 1}}}), 0.015f, z, t);
    Value* y = b.op("Relu", {b.op("Add", {c, x})});
    b.g.add_output(b.qdq(y, 0.02f, 0, t));
    Graph o = optimized(b.g);
    CHECK(count(o, "ondine.QConv") == 2);
    CHECK(count(o, "Add") == 0);
    bool has_sum = false;
    for (Node* n : o.nodes()) has_sum = has_sum || (n->op_key() == "ondine.QConv" && n->input(3));
    CHECK(has_sum);
    check_int8(b.g, 0.02, 2.0, 0.99);
  }
}

TEST_CASE("int8 residual with no activation after the Add (a linear bottleneck), skip with a zero point") {
  if (!lower::effective_isa().int8_vnni) {  // checks int8 kernels that CPUs without VNNI keep float
    WARN("skipped: needs VNNI (oneDNN ISA " << lower::effective_isa().name << ")");
    return;
  }
  // MobileNetV2's form: Conv -> Q -> DQ -> Add(DQ(x)) -> Q with x's zero point != 0, and with a Relu or
  // a Clip after the Add. The mid rounding and saturation are kept exactly (these hand-picked scales make
  // ~1% of the conv outputs saturate the mid type). oneDNN 2.6 runs a repeated eltwise algorithm with
  // the first one's parameters, which once lost the output zero point here (100%+ error).
  for (DType t : {DType::UInt8, DType::Int8})
    for (const char* act : {"", "Relu", "Clip"}) {
      INFO(qops::type_str(t) << " " << act);
      QBuilder b;
      int z = t == DType::UInt8 ? 130 : 3;
      Value* x = b.qdq(b.input("x", {1, 16, 8, 8}), 0.02f, z, t);
      Value* c = b.qdq(b.conv(x, 16, 16, 1), 0.015f, t == DType::UInt8 ? 120 : -5, t);
      Value* y = b.op("Add", {c, x});
      if (std::string(act) == "Relu") y = b.op("Relu", {y});
      if (std::string(act) == "Clip") y = b.op("Clip", {y, b.scalar_f(-0.5f), b.scalar_f(1.5f)});
      Value* yq = b.qdq(y, 0.03f, t == DType::UInt8 ? 125 : 2, t);
      b.g.add_output(yq);
      Graph o = optimized(b.g);
      bool has_sum = false;
      for (Node* n : o.nodes()) has_sum = has_sum || (n->op_key() == "ondine.QConv" && n->input(3));
      CHECK(has_sum);
      CompiledModel m = check_int8(b.g, 0.03);
      std::size_t exact = 0;
      for (auto& s : m.steps())
        exact += s.op == "QConv" && s.implementation != "reference" && s.detail.find("mid(round,clip") != std::string::npos;
      CHECK(exact == 1);  // on oneDNN, with the mid rounding
    }
}

TEST_CASE("int8 post-ops never repeat an eltwise algorithm with other parameters") {
  // oneDNN 2.6's jit kernels run a repeated eltwise algorithm with its first occurrence's parameters
  // (bench/onednn_sum_clip_repro.cpp), so the chain avoids repeats and rejects what would still repeat.
  using lower::detail::quant::build_post_ops;
  using lower::detail::repeats_eltwise_alg;
  using A = dnnl::algorithm;
  dnnl::post_ops two;
  two.append_eltwise(1.0f, A::eltwise_linear, 0.5f, 0.0f);
  two.append_eltwise(1.0f, A::eltwise_linear, 1.0f, 3.0f);
  CHECK(repeats_eltwise_alg(two));
  dnnl::post_ops same, clips;
  same.append_eltwise(1.0f, A::eltwise_relu, 0.0f, 0.0f);
  same.append_sum(1.0f);
  same.append_eltwise(1.0f, A::eltwise_relu, 0.0f, 0.0f);
  CHECK_FALSE(repeats_eltwise_alg(same));  // equal parameters: the shared injector is right
  clips.append_eltwise(2.0f, A::eltwise_clip, -1.0f, 1.0f);
  clips.append_eltwise(1.0f, A::eltwise_clip_v2, 0.0f, 6.0f);
  CHECK_FALSE(repeats_eltwise_alg(clips));

  // Mid quantization, sum, a Clip and the output zero point: no repeat, all on oneDNN.
  qops::QAttrs a;
  a.y = {0.03f, 125, DType::UInt8};
  a.has_mid = true;
  a.mid = {0.015f, 120, DType::UInt8};
  a.has_sum = true;
  a.sum = {0.02f, 130, DType::UInt8};
  a.activations = {{"Clip", -0.5f, 1.5f}};
  dnnl::post_ops p;
  std::string detail;
  CHECK(build_post_ops(a, dnnl::memory::data_type::u8, p, detail));
  CHECK(p.len() == 5);  // round, clip (scaled), sum, clip_v2, linear
  CHECK(detail == "+mid(round,clip*scale)+sum+Clip+zp");
  // LeakyRelu then Relu: two eltwise_relu with other alphas; rejected (the node runs its reference kernel).
  a.activations = {{"LeakyRelu", 0.1f, 0.0f}, {"Relu", 0.0f, 0.0f}};
  dnnl::post_ops q;
  CHECK_FALSE(build_post_ops(a, dnnl::memory::data_type::u8, q, detail));
}

TEST_CASE("int8 pooling: MaxPool with the same parameters, GlobalAveragePool and AveragePool rescaling") {
  QBuilder b;
  Value* x = b.qdq(b.input("x", {2, 16, 9, 9}), 0.01f, 128);
  Value* mp = b.op("MaxPool", {x}, {{"kernel_shape", std::vector<std::int64_t>{3, 3}},
                                    {"strides", std::vector<std::int64_t>{2, 2}},
                                    {"pads", std::vector<std::int64_t>{1, 1, 1, 1}}});
  Value* mq = b.qdq(mp, 0.01f, 128);
  Value* gap = b.qdq(b.op("GlobalAveragePool", {x}), 0.002f, 128);
  Value* ap = b.qdq(b.op("AveragePool", {mq}, {{"kernel_shape", std::vector<std::int64_t>{2, 2}}}), 0.005f, 128);
  b.g.add_output(gap);
  b.g.add_output(ap);
  Graph o = optimized(b.g);
  CHECK(count(o, "ondine.QPool") == 3);
  CompiledModel m = check_int8(b.g, 0.005);
  CHECK(steps_with(m, "QPool", "jit") == 3);  // not oneDNN's reference ("ref:any") nor ours
}

TEST_CASE("int8 MatMul + bias and Gemm (transB, int32 bias), with Flatten on int8") {
  QBuilder b;
  Value* x = b.qdq(b.input("x", {4, 8, 1, 1}), 0.02f, 128);
  Value* f = b.qdq(b.op("Flatten", {x}), 0.02f, 128);
  Value* g1 = b.op("Gemm", {f, b.qweight({32, 8}, 0, true), b.ibias(32, 0.02f * 0.004f)}, {{"transB", std::int64_t{1}}});
  Value* h = b.qdq(b.op("Relu", {g1}), 0.01f, 0);
  Value* mm = b.op("MatMul", {h, b.qweight({32, 16}, 1, true)});
  Value* y = b.op("Add", {mm, b.fbias(16)});
  b.g.add_output(b.qdq(y, 0.01f, 128));
  Graph o = optimized(b.g);
  CHECK(count(o, "ondine.QMatMul") == 2);
  CHECK(count(o, "Gemm") == 0);
  CHECK(count(o, "MatMul") == 0);
  CHECK(count(o, "Flatten") == 1);
  check_int8(b.g, 0.01, 2.0, 0.99);
}

TEST_CASE("must not fire: weight zero point, per-tensor axis mismatch; the float path stays correct") {
  QBuilder b;
  Value* x = b.qdq(b.input("x", {1, 8, 6, 6}), 0.01f, 128);
  // A weight zero point: oneDNN int8 weights have none.
  Value* y = b.op("Conv", {x, b.qweight({8, 8, 3, 3}, 0, false, 3), b.fbias(8)});
  y = b.qdq(y, 0.02f, 128);
  // Per-channel scales along the wrong axis (1 for a Conv weight).
  Value* z = b.op("Conv", {y, b.qweight({8, 8, 1, 1}, 1, true)});
  b.g.add_output(b.qdq(z, 0.02f, 128));
  Graph o = optimized(b.g);
  CHECK(count(o, "ondine.QConv") == 0);
  check_int8(b.g, 0.02);
}

TEST_CASE("leftover Q/DQ lower to oneDNN reorders with scales") {
  QBuilder b;
  Value* x = b.input("x", {2, 8, 5, 5});
  Value* y = b.op("Sigmoid", {b.qdq(x, 0.01f, 128)});  // not an int8 op: Q and DQ stay
  b.g.add_output(b.qdq(y, 0.004f, 0));
  CompiledModel m = check_int8(b.g, 0.004);
  CHECK(steps_with(m, "QuantizeLinear", "reference") == 0);
  CHECK(steps_with(m, "DequantizeLinear", "reference") == 0);
}

// The input Q of a 3-channel image read by an int8 conv: Ondine's own AVX-512 kernel (quantize_image.hpp)
// where the CPU has it. A 1x1 conv with identity weights of scale 1 and scale 0.5 make the output
// the dequantized input exactly, so any wrong byte (rounding, saturation, interleaving, the tail of a
// row) shows as a whole step. Ties (x / scale = k + 0.5) round to even, as ONNX's QuantizeLinear.
TEST_CASE("a 3-channel image input is quantized channels-last in one step, equal to the reference", "[any-isa]") {
  for (DType t : {DType::UInt8, DType::Int8}) {
    QBuilder b;
    const int zp = t == DType::UInt8 ? 100 : -3;
    Value* x = b.input("x", {2, 3, 5, 37});  // 37 = two 16-pixel blocks and a tail of 5
    Tensor eye(DType::Int8, {3, 3, 1, 1});
    for (int c = 0; c < 3; ++c) eye.data<std::int8_t>()[c * 3 + c] = 1;
    Value* w = b.op("DequantizeLinear", {b.g.add_constant("eye", eye), b.g.add_constant("ones", Tensor::from_vector<float>({3}, {1, 1, 1})),
                                         b.g.add_constant("zeros", Tensor::from_vector<std::int8_t>({3}, {0, 0, 0}))},
                    {{"axis", std::int64_t{0}}});
    b.g.add_output(b.op("Conv", {b.qdq(x, 0.5f, zp, t), w}));
    infer_shapes(b.g);

    Tensor in = random_input({2, 3, 5, 37}, 5, -90.0f, 90.0f);
    float* p = in.data<float>();
    for (int i = 0; i < 40; ++i) p[i * 7] = 0.25f * static_cast<float>(2 * i - 41);  // ties: x / 0.5 = i - 20.5
    p[3] = 1e6f, p[5] = -1e6f, p[11] = 64.0f, p[12] = -64.25f;                           // saturation both ways
    auto want = ReferenceExecutor(b.g).run({{"x", in}});
    CompiledModel m = lower::compile(b.g, exact_weights());
    auto got = m.run({{"x", in}});
    const Tensor& r = want.begin()->second;
    const Tensor& o = got.at(want.begin()->first);
    REQUIRE(o.dims() == r.dims());
    std::int64_t wrong = 0, off_by_more = 0;
    for (std::int64_t i = 0; i < r.numel(); ++i) {
      wrong += r.data<float>()[i] != o.data<float>()[i];
      off_by_more += std::abs(r.data<float>()[i] - o.data<float>()[i]) > 0.5f;
    }
    CHECK(off_by_more == 0);
    if (lower::effective_isa().avx512 && lower::effective_isa().int8_vnni)
      CHECK(steps_with(m, "QuantizeLinear", "ondine_image") == 1);
    if (steps_with(m, "QuantizeLinear", "ondine_image") == 1)
      CHECK(wrong == 0);
    else  // oneDNN's reorder adds the zero point before rounding: a tie may land one step off
      CHECK(wrong <= (zp % 2 ? 40 : 0));
  }
}

TEST_CASE("int8 Concat of tensors with equal parameters stays int8") {
  QBuilder b;
  Value* x = b.qdq(b.input("x", {1, 8, 6, 6}), 0.01f, 128);
  Value* a = b.qdq(b.op("Relu", {b.conv(x, 8, 8, 1)}), 0.02f, 0);
  Value* c = b.qdq(b.op("Relu", {b.conv(x, 8, 8, 3, {{"pads", std::vector<std::int64_t>{1, 1, 1, 1}}})}), 0.02f, 0);
  Value* cat = b.op("Concat", {a, c}, {{"axis", std::int64_t{1}}});
  b.g.add_output(b.qdq(cat, 0.02f, 0));
  Graph o = optimized(b.g);
  CHECK(count(o, "ondine.QConv") == 2);
  CHECK(count(o, "QuantizeLinear") == 1);
  CompiledModel m = check_int8(b.g, 0.02);
  CHECK(steps_with(m, "Concat", "reference") == 0);
}

TEST_CASE("a model quantized by quant::QuantizeQDQ (8-bit and 7-bit weights) compiles to int8 and matches its reference", "[any-isa]") {
  for (bool reduce : {false, true}) {
    QBuilder b;
    Value* x = b.input("x", {1, 8, 12, 12});
    auto wconv = [&](Value* in, std::int64_t oc, std::int64_t ic, std::int64_t k) {
      std::uniform_real_distribution<float> d(-0.3f, 0.3f);
      Tensor w(DType::Float32, {oc, ic, k, k});
      for (std::int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = d(b.rng);
      std::map<std::string, Attribute> at;
      if (k == 3) at["pads"] = std::vector<std::int64_t>{1, 1, 1, 1};
      return b.op("Conv", {in, b.g.add_constant(b.g.unique_name("w"), w), b.fbias(oc)}, at);
    };
    Value* h = b.op("Relu", {wconv(x, 16, 8, 3)});
    Value* r = b.op("Relu", {b.op("Add", {wconv(b.op("Relu", {wconv(h, 16, 16, 1)}), 16, 16, 3), h})});
    Value* p = b.op("MaxPool", {r}, {{"kernel_shape", std::vector<std::int64_t>{2, 2}}, {"strides", std::vector<std::int64_t>{2, 2}}});
    Value* gap = b.op("Flatten", {b.op("GlobalAveragePool", {p})});
    std::uniform_real_distribution<float> d(-0.3f, 0.3f);
    Tensor fw(DType::Float32, {10, 16});
    for (std::int64_t i = 0; i < fw.numel(); ++i) fw.data<float>()[i] = d(b.rng);
    Value* y = b.op("Gemm", {gap, b.g.add_constant("fc.w", fw), b.fbias(10)}, {{"transB", std::int64_t{1}}});
    b.g.add_output(y);
    infer_shapes(b.g);
    std::vector<quant::Sample> samples;
    for (unsigned s = 0; s < 4; ++s) samples.push_back({{"x", random_input({1, 8, 12, 12}, 100 + s)}});
    quant::CalibrationResult calib = quant::calibrate(b.g, samples.begin(), samples.end());
    quant::QuantizeOptions qopts;
    qopts.reduce_range_weights = reduce;
    quant::QuantizeQDQ pass(calib, qopts);
    PassContext ctx;
    pass.run(b.g, ctx);
    infer_shapes(b.g);
    INFO((reduce ? "7-bit" : "8-bit") << " weights");
    int widest = 0;
    for (Node* n : b.g.nodes())
      for (Value* v : n->inputs())
        if (v && v->is_constant() && v->dtype() == DType::Int8)
          for (std::int64_t i = 0; i < v->constant().numel(); ++i)
            widest = std::max(widest, std::abs(int{v->constant().data<std::int8_t>()[i]}));
    CHECK(widest == (reduce ? 64 : 127));  // symmetric per channel: each channel's largest weight hits the bound
    Graph o = optimized(b.g);
    CHECK(count(o, "ondine.QConv") == 3);
    CHECK(count(o, "ondine.QPool") == 2);  // MaxPool, and GlobalAveragePool -> Flatten -> Q
    CHECK(count(o, "ondine.QMatMul") == 1);
    CHECK(count(o, "Add") == 0);
    // The output is the float32 result of the int8 Gemm: within 2% of its range (a one-step
    // difference in any of the pooled features moves every logit a little).
    auto in = random_input({1, 8, 12, 12}, 5);
    auto want = ReferenceExecutor(b.g).run({{"x", in}}).at(y->name());
    CompiledModel m = lower::compile(b.g, exact_weights());
    auto got = m.run({{"x", in}}).at(y->name());
    double worst = 0, mag = 0;
    for (std::int64_t i = 0; i < want.numel(); ++i) {
      mag = std::max(mag, std::abs(want.at_double(static_cast<std::size_t>(i))));
      worst = std::max(worst, std::abs(want.at_double(static_cast<std::size_t>(i)) - got.at_double(static_cast<std::size_t>(i))));
    }
    INFO("worst " << worst << " of " << mag);
    REQUIRE(mag > 0.01);
    CHECK(worst <= 0.02 * mag);
    std::string report = lower::detail::int8_report(m.steps());
    INFO(report);
    // 7-bit weights run int8 on every ISA (without VNNI, 8-bit ones stay float: fuse_qdq.hpp).
    if (reduce || lower::effective_isa().int8_vnni) CHECK(report.find("int8: 6 int8 steps; 1 Q/DQ left unfused: Q ") == 0);
  }
}

// Without VNNI, oneDNN's int8 kernels add u8 x s8 products in pairs into int16 and saturate past
// 255 * 64 * 2; the compiler then keeps layers with larger weights, or with s8 activations, in float.
TEST_CASE("fuse-qdq limits for CPUs without VNNI: 8-bit weights requantized to 7 bits by default (or kept float), s8 sources stay float",
          "[any-isa]") {
  for (int max_w : {127, 64}) {
    for (DType t : {DType::UInt8, DType::Int8}) {
      QBuilder b;
      Value* x = b.qdq(b.input("x", {1, 16, 9, 9}), 0.01f, t == DType::UInt8 ? 128 : 0, t);
      Tensor w(DType::Int8, {24, 16, 3, 3});
      std::uniform_int_distribution<int> d(-max_w, max_w);
      for (std::int64_t i = 0; i < w.numel(); ++i) w.data<std::int8_t>()[i] = static_cast<std::int8_t>(d(b.rng));
      w.data<std::int8_t>()[5] = static_cast<std::int8_t>(max_w);  // the bound itself occurs
      std::vector<float> ws(24, 0.004f);
      Value* wv = b.op("DequantizeLinear",
                       {b.g.add_constant("w", w), b.g.add_constant("ws", Tensor::from_vector<float>({24}, ws)),
                        b.g.add_constant("wz", Tensor::from_vector<std::int8_t>({24}, std::vector<std::int8_t>(24, 0)))},
                       {{"axis", std::int64_t{0}}});
      Value* y = b.op("Relu", {b.op("Conv", {x, wv, b.fbias(24)}, {{"pads", std::vector<std::int64_t>{1, 1, 1, 1}}})});
      b.g.add_output(b.qdq(y, 0.02f, 0, t));
      infer_shapes(b.g);
      INFO("weights up to " << max_w << ", " << (t == DType::UInt8 ? "u8" : "s8") << " activations");

      Graph g = b.g.clone();
      PassManager pm = make_pass_manager();
      pm.context().options["fuse-qdq.max-abs-weight"] = "64";
      pm.context().options["fuse-qdq.u8-only"] = "1";
      pm.run(g);
      bool int8_here = max_w <= 64 && t == DType::UInt8;
      CHECK(count(g, "ondine.QConv") == (int8_here ? 1u : 0u));
      // fuse-qdq.halve-weights (what the compiler sets without VNNI): 8-bit weights requantized to 7 bits
      // (new constants, |w| <= 64) and fused; s8 sources still stay float.
      Graph h = b.g.clone();
      PassManager halving = make_pass_manager();
      halving.context().options["fuse-qdq.max-abs-weight"] = "64";
      halving.context().options["fuse-qdq.u8-only"] = "1";
      halving.context().options["fuse-qdq.halve-weights"] = "1";
      halving.run(h);
      CHECK(count(h, "ondine.QConv") == (t == DType::UInt8 ? 1u : 0u));
      for (Node* n : h.nodes())
        if (n->op_type() == "QConv" && n->input(1) && n->input(1)->is_constant()) {
          const Tensor& hw = n->input(1)->constant();
          int worst = 0;
          for (std::int64_t i = 0; i < hw.numel(); ++i) worst = std::max(worst, std::abs(int{hw.data<std::int8_t>()[i]}));
          CHECK(worst == (max_w > 64 ? (max_w + 1) / 2 : max_w));  // 127 -> 63.5 -> 64 (half to even)
        }
      CHECK(b.g.find_value("w")->constant().data<std::int8_t>()[5] == max_w);  // the file's weights unchanged
      if (!lower::effective_isa().int8_vnni && t == DType::UInt8) {
        // int8 without VNNI: CompileOptions::int8_7bit_weights requantizes the layer's weights, within 10% of
        // the file's numbers; exact_weights() keeps it float. Unset: 7-bit where this CPU's
        // int8 rate is well above its fp32 rate.
        lower::CompileOptions seven;
        seven.int8_7bit_weights = true;
        CompiledModel m = lower::compile(b.g, seven);
        CHECK((lower::int8_plan(lower::compile(b.g)).int8_steps >= 1) ==
              (max_w <= 64 || lower::int8_7bit_weights_by_default()));
        auto in = random_input({1, 16, 9, 9}, 9);
        Tensor want = ReferenceExecutor(b.g).run({{"x", in}}).begin()->second;
        Tensor got = m.run({{"x", in}}).begin()->second;
        CHECK(lower::int8_plan(m).islands.empty());
        CHECK(lower::int8_plan(m).int8_steps >= 1);
        CHECK(test::relative_error(got, want) <= 0.1);
        CompiledModel exact = lower::compile(b.g, exact_weights());
        CHECK((lower::int8_plan(exact).int8_steps == 0) == (max_w > 64));  // 8-bit weights: float (fake-quant)
      }
      CHECK(count(optimized(b.g), "ondine.QConv") == 1);  // without the limits: always
      PassManager bad = make_pass_manager();
      bad.context().options["fuse-qdq.max-abs-weight"] = "64x";
      Graph g2 = b.g.clone();
      CHECK_THROWS_WITH(bad.run(g2), Catch::Contains("fuse-qdq.max-abs-weight='64x' is not a weight magnitude"));

      // Compiled (with this CPU's limits, if any) against the reference: within a step.
      check_int8(b.g, 0.02);
    }
  }
}

namespace {

// Fixed rates, so the estimates below do not depend on the machine's ISA.
lower::PeakRates test_rates() {
  lower::PeakRates r;
  r.fp32 = 100e9, r.int8 = 400e9, r.reference = 1e9, r.bandwidth = 10e9, r.source = "test";
  return r;
}

std::string steps_text(const CompiledModel& m) {
  std::string s;
  for (auto& st : m.steps()) s += st.op + " '" + st.name + "': " + st.implementation + "\n";
  return s;
}

}  // namespace

TEST_CASE("int8 plan: an unquantizable op between int8 convs is one fp32 island with its cost") {
  if (!lower::effective_isa().int8_vnni) {  // checks int8 kernels that CPUs without VNNI keep float
    WARN("skipped: needs VNNI (oneDNN ISA " << lower::effective_isa().name << ")");
    return;
  }
  QBuilder b;
  Value* x = b.qdq(b.input("x", {1, 16, 12, 12}), 0.01f, 128);
  std::map<std::string, Attribute> same{{"pads", std::vector<std::int64_t>{1, 1, 1, 1}}};
  Value* a = b.qdq(b.op("Relu", {b.conv(x, 16, 16, 3, same)}), 0.02f, 0);
  Value* s = b.qdq(b.op("Sigmoid", {a}), 0.004f, 0);  // Sigmoid has no int8 form: DQ -> Sigmoid -> Q stay
  b.g.add_output(b.qdq(b.conv(s, 16, 16, 3, same), 0.02f, 128));
  CompiledModel m = check_int8(b.g, 0.02, 2.0, 0.99);
  lower::Int8Plan plan = lower::int8_plan(m, test_rates());
  INFO(steps_text(m) << plan.text());
  CHECK(plan.int8_steps == 2);
  REQUIRE(plan.islands.size() == 1);
  const lower::Fp32Island& island = plan.islands[0];
  REQUIRE(island.float_steps.size() == 1);
  CHECK(island.float_steps[0].find("Sigmoid '") == 0);
  CHECK(island.conversions.size() == 2);  // DQ before the Sigmoid, Q after it
  // FLOPs: one per element for DQ, Sigmoid and Q. Bytes: u8 in, float out (DQ); float in and out
  // (Sigmoid); float in, u8 out (Q); plus the Q/DQ scales and zero points.
  const double n = 16 * 12 * 12;
  CHECK(island.flops == Approx(3 * n));
  CHECK(island.bytes == Approx(n + 4 * n + 8 * n + 4 * n + n + 2 * (4 + 1)));
  // Bandwidth-bound at these rates, or bound by the reference kernel's rate if Sigmoid ran on it.
  CHECK(island.seconds >= island.bytes / 10e9 * 0.999);
  CHECK(island.seconds <= island.bytes / 10e9 + 3 * n / 1e9);
  CHECK(plan.island_seconds == Approx(island.seconds));
  CHECK_FALSE(plan.slower());  // two 3x3 convs outweigh the island
  std::string text = plan.text();
  CHECK(text.find("fp32 island 1: 1 float step (Sigmoid '") != std::string::npos);
  CHECK(text.find(", 2 Q/DQ (DQ '") != std::string::npos);
  CHECK(text.find("warning") == std::string::npos);
}

TEST_CASE("int8 plan: a fully int8 chain has no fp32 island and is predicted faster than fp32") {
  if (!lower::effective_isa().int8_vnni) {  // checks int8 kernels that CPUs without VNNI keep float
    WARN("skipped: needs VNNI (oneDNN ISA " << lower::effective_isa().name << ")");
    return;
  }
  QBuilder b;
  Value* x = b.qdq(b.input("x", {1, 16, 12, 12}), 0.01f, 128);
  std::map<std::string, Attribute> same{{"pads", std::vector<std::int64_t>{1, 1, 1, 1}}};
  Value* y = b.qdq(b.op("Relu", {b.conv(x, 32, 16, 3, same)}), 0.02f, 0);
  y = b.qdq(b.op("Relu", {b.conv(y, 32, 32, 3, same)}), 0.02f, 0);
  b.g.add_output(b.qdq(b.conv(y, 16, 32, 1), 0.02f, 128));
  CompiledModel m = check_int8(b.g, 0.02, 2.0, 0.99);
  lower::Int8Plan plan = lower::int8_plan(m, test_rates());
  INFO(steps_text(m) << plan.text());
  CHECK(plan.int8_steps == 3);
  CHECK(plan.islands.empty());  // the input's Q and the output's DQ are the model's float interface
  CHECK(plan.island_seconds == 0);
  CHECK_FALSE(plan.slower());
  // Compute-bound convs: about the int8/fp32 peak ratio faster.
  CHECK(plan.fp32_seconds > 2.5 * plan.int8_seconds);
  CHECK(plan.text().find("no fp32 island; the model in fp32 ") != std::string::npos);
  CHECK(plan.text().find("warning") == std::string::npos);
}

TEST_CASE("int8 plan: tiny int8 convs between float ops are predicted slower than fp32 and warn") {
  if (!lower::effective_isa().int8_vnni) {  // checks int8 kernels that CPUs without VNNI keep float
    WARN("skipped: needs VNNI (oneDNN ISA " << lower::effective_isa().name << ")");
    return;
  }
  QBuilder b;
  Value* y = b.input("x", {1, 8, 8, 8});
  for (int i = 0; i < 4; ++i) {  // Q -> QConv 1x1 -> DQ -> Sigmoid, four times
    Value* c = b.conv(b.qdq(y, 0.01f, 128), 8, 8, 1);
    y = b.op("Sigmoid", {b.qdq(c, 0.02f, 128)});
  }
  b.g.add_output(y);
  infer_shapes(b.g);
  CompiledModel m = lower::compile(b.g, exact_weights());
  lower::Int8Plan plan = lower::int8_plan(m, test_rates());
  INFO(steps_text(m) << plan.text());
  CHECK(plan.int8_steps == 4);
  CHECK(plan.islands.size() == 4);  // three between the convs, the last Sigmoid after them
  for (auto& island : plan.islands) CHECK(island.float_steps.size() == 1);
  CHECK(plan.slower());
  CHECK(plan.int8_seconds > plan.fp32_seconds);
  CHECK(plan.text().find("warning: int8 plan predicted slower than fp32: ") != std::string::npos);
  CHECK(plan.text().find("; 4 fp32 islands cost ") != std::string::npos);
}

TEST_CASE("int8 plan: a float model has none") {
  QBuilder b;
  b.g.add_output(b.op("Relu", {b.input("x", {1, 4})}));
  infer_shapes(b.g);
  lower::Int8Plan plan = lower::int8_plan(lower::compile(b.g, exact_weights()), test_rates());
  CHECK(plan.empty());
  CHECK(plan.text().empty());
  CHECK_FALSE(plan.slower());
}

}  // namespace test_lower_int8

// --- dynamic quantization (quantize-dynamic, ONNX Runtime's quantize_dynamic) ---------------------------
// Compiled against the reference executor on the same quantized graph: DynamicQuantizeLinear is
// Ondine's own kernel, bit for bit the reference's; DynQMatMul and DynQConv are oneDNN primitives whose
// float32 rescale is the reference's operations, so the bound is float rounding (1e-6 of max
// |reference|). They run in int8 where that is exact (VNNI, or 7-bit weights from reduce-range), else
// in float32 on the centred integers.
namespace test_lower_int8 {
namespace {

Graph dynamic_graph(bool per_channel, bool reduce_range) {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{2, 5, 16});
  Value* x2 = g.add_input("x2", DType::Float32, Shape{3, 40});
  Value* x3 = g.add_input("x3", DType::Float32, Shape{64, 300});  // 19200 values: the range in two chunks
  std::mt19937 rng(3);
  auto weight = [&](const Dims& d) {
    std::normal_distribution<float> dist(0.0f, 0.3f);
    Tensor t(DType::Float32, d);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
    return g.add_constant(g.unique_name("w"), t);
  };
  Value* m1 = g.add_node("MatMul", {x, weight({16, 24})}, {"m1"}, {}, "mm1")->output(0);
  g.opsets.emplace(fused::kDomain, fused::kDomainVersion);
  g.add_output(g.add_node("Gelu", {m1}, {"y1"}, {}, "gelu", fused::kDomain)->output(0));  // a post-op
  g.add_output(g.add_node("MatMul", {x, weight({16, 8})}, {"y2"}, {}, "mm2")->output(0));
  g.add_output(g.add_node("Gemm", {x2, weight({12, 40}), weight({12})}, {"y3"},
                          {{"transB", std::int64_t{1}}, {"beta", 0.5f}}, "gemm")->output(0));
  g.add_output(g.add_node("MatMul", {x3, weight({300, 20})}, {"y4"}, {}, "mm4")->output(0));
  infer_shapes(g);
  PassManager pm = make_pass_manager("quantize-dynamic");
  pm.context().options["quantize-dynamic.per-channel"] = per_channel ? "1" : "0";
  pm.context().options["quantize-dynamic.reduce-range"] = reduce_range ? "1" : "0";
  pm.run(g);
  return g;
}

}  // namespace

TEST_CASE("dynamic quantization compiled: DynamicQuantizeLinear and DynQMatMul equal the reference", "[any-isa]") {
  bool vnni = lower::effective_isa().int8_vnni;
  for (bool per_channel : {true, false})
    for (bool reduce_range : {false, true}) {
      INFO("per channel " << per_channel << ", reduce range " << reduce_range << ", isa " << lower::effective_isa().name);
      Graph g = dynamic_graph(per_channel, reduce_range);
      std::map<std::string, Tensor> inputs;
      unsigned seed = 21;
      for (Value* in : g.inputs()) inputs[in->name()] = random_input(in->shape().sizes(), seed++, -2.0f, 3.0f);
      auto want = ReferenceExecutor(g).run(inputs);
      CompiledModel m = lower::compile(g);
      auto got = m.run(inputs);
      for (auto& [name, w] : want) {
        INFO(name);
        const Tensor& o = got.at(name);
        REQUIRE(o.dims() == w.dims());
        double worst = 0, top = 0;
        for (std::int64_t i = 0; i < w.numel(); ++i) {
          top = std::max(top, std::abs(w.at_double(static_cast<std::size_t>(i))));
          worst = std::max(worst, std::abs(w.at_double(static_cast<std::size_t>(i)) - o.at_double(static_cast<std::size_t>(i))));
        }
        CHECK(top > 0.1);
        CHECK(worst <= 1e-6 * top);
      }
      CHECK(steps_with(m, "DynamicQuantizeLinear", "ondine_dynamic_quantize") == 3);
      std::size_t compiled = 0, int8 = 0;
      for (auto& s : m.steps()) {
        compiled += s.op == "DynQMatMul" && s.implementation != "reference";
        int8 += s.op == "DynQMatMul" && s.detail.rfind("src u8", 0) == 0;
      }
      CHECK(compiled == 4u);
      CHECK(int8 == (vnni || reduce_range ? 4u : 0u));
      // inspect --compiled's report: the products int8, each DynamicQuantizeLinear a conversion.
      lower::Int8Plan plan = lower::int8_plan(m);
      CHECK(plan.int8_steps == 4);
      CHECK(plan.summary.find("3 Q/DQ left unfused: DynQ 'x/dynamic_quantize'") != std::string::npos);
    }
}

TEST_CASE("dynamic quantization compiled: DynQConv (1-D to 3-D) equals the reference, int8 where exact (shifted weights "
          "compensated), else float32",
          "[any-isa]") {
  const bool vnni = lower::effective_isa().int8_vnni;
  for (std::int64_t spatial : {1, 2, 3})
  for (bool uint8_weights : {false, true})
    for (bool per_channel : {false, true})
      for (std::int64_t group : {1, 2})
        for (std::int64_t pad : {0, 1}) {
          test::DynamicConvSpec spec;
          spec.spatial = spatial;
          spec.uint8_weights = uint8_weights;
          spec.per_channel = per_channel;
          spec.group = group;
          spec.stride = group;
          spec.pad = pad;
          INFO(spatial << "-D, uint8 " << uint8_weights << ", per channel " << per_channel << ", group " << group
                       << ", pad " << pad << ", isa " << lower::effective_isa().name);
          Graph g = test::dynamic_conv_graph(spec);
          infer_shapes(g);
          // Inputs centred off zero: a zero point far from 0, whose padding must add nothing.
          std::map<std::string, Tensor> inputs{{"x", random_input(spec.input_dims(), 31, -0.5f, 3.0f)}};
          const Tensor want = ReferenceExecutor(g).run(inputs).at("y");
          CompiledModel m = lower::compile(g);
          const Tensor got = m.run(inputs).at("y");
          REQUIRE(got.dims() == want.dims());
          double worst = 0, top = 0;
          for (std::int64_t i = 0; i < want.numel(); ++i) {
            top = std::max(top, std::abs(want.at_double(static_cast<std::size_t>(i))));
            worst = std::max(worst, std::abs(want.at_double(static_cast<std::size_t>(i)) - got.at_double(static_cast<std::size_t>(i))));
          }
          CHECK(top > 0.1);
          CHECK(worst <= 1e-6 * top);
          std::size_t conv = 0, int8 = 0, shifted = 0;
          for (auto& s : m.steps()) {
            conv += s.op == "DynQConv" && s.implementation != "reference";
            int8 += s.op == "DynQConv" && s.detail.rfind("src u8", 0) == 0;
            shifted += s.op == "DynQConv" && s.detail.find("shifted into s8") != std::string::npos;
          }
          CHECK(conv == 1);
          // Weights up to 127 need VNNI; uint8 weights around zero points 113..131 centre beyond int8 and
          // are shifted back into it, compensated.
          CHECK(int8 == (vnni ? 1u : 0u));
          CHECK(shifted == (vnni && uint8_weights ? 1u : 0u));
        }
}

namespace {

// MatMulInteger with uint8 weights around zero points 113..131, as quantize_dynamic's QUInt8 writes transformer
// layers: DynamicQuantizeLinear(x [2, 5, 64]) -> MatMulInteger(W [64, 24], W_zp) -> Cast -> Mul(xs * ws) -> Add(b).
Graph uint8_weight_matmul_graph(bool per_column) {
  Graph g;
  const std::int64_t k = 64, n = 24;
  Value* x = g.add_input("x", DType::Float32, Shape{2, 5, k});
  Node* dql = g.add_node("DynamicQuantizeLinear", {x}, {"xq", "xs", "xz"}, {}, "x_quantize");
  dql->set_opset(11);
  std::mt19937 rng(23);
  Tensor w(DType::UInt8, {k, n});
  for (std::int64_t i = 0; i < w.numel(); ++i) w.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(rng() % 256);
  Tensor wz(DType::UInt8, per_column ? std::vector<std::int64_t>{n} : std::vector<std::int64_t>{});
  for (std::int64_t i = 0; i < wz.numel(); ++i) wz.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(113 + (i * 7) % 19);
  Value* acc = g.add_node("MatMulInteger", {dql->output(0), g.add_constant("w", w), dql->output(2), g.add_constant("wz", wz)},
                          {"acc"}, {}, "mmi")->output(0);
  Value* accf = g.add_node("Cast", {acc}, {"accf"}, {{"to", std::int64_t{1}}}, "cast")->output(0);
  Tensor ws(DType::Float32, per_column ? std::vector<std::int64_t>{n} : std::vector<std::int64_t>{});
  for (std::int64_t i = 0; i < ws.numel(); ++i) ws.data<float>()[i] = 0.002f * static_cast<float>(1 + i % 5);
  Value* scale = g.add_node("Mul", {dql->output(1), g.add_constant("ws", ws)}, {"s"}, {}, "scales")->output(0);
  Value* y = g.add_node("Mul", {accf, scale}, {"scaled"}, {}, "rescale")->output(0);
  Tensor b(DType::Float32, {n});
  for (std::int64_t i = 0; i < n; ++i) b.data<float>()[i] = 0.05f * static_cast<float>(i) - 0.3f;
  g.add_output(g.add_node("Add", {y, g.add_constant("b", b)}, {"y"}, {}, "bias")->output(0));
  return g;
}

}  // namespace

TEST_CASE("dynamic quantization compiled: DynQMatMul with uint8 weights shifted into int8 (row sums compensated) "
          "with VNNI, else float32; equal to the reference",
          "[any-isa]") {
  const bool vnni = lower::effective_isa().int8_vnni;
  for (bool per_column : {false, true}) {
    INFO("per column " << per_column << ", isa " << lower::effective_isa().name);
    Graph g = uint8_weight_matmul_graph(per_column);
    infer_shapes(g);
    // Inputs off zero: the source zero point is far from 0.
    std::map<std::string, Tensor> inputs{{"x", random_input({2, 5, 64}, 41, -0.5f, 3.0f)}};
    const Tensor want = ReferenceExecutor(g).run(inputs).at("y");
    CompiledModel m = lower::compile(g);
    CHECK(test::max_abs(want) > 0.1);
    CHECK(test::relative_error(m.run(inputs).at("y"), want) <= 1e-6);
    std::size_t compiled = 0, shifted = 0, centred = 0;
    for (auto& s : m.steps()) {
      compiled += s.op == "DynQMatMul" && s.implementation != "reference";
      shifted += s.op == "DynQMatMul" && s.detail.rfind("src u8", 0) == 0 &&
                 s.detail.find("shifted into s8 +row-sum compensation") != std::string::npos;
      centred += s.op == "DynQMatMul" && s.detail.rfind("src centred f32", 0) == 0;
    }
    CHECK(compiled == 1);
    CHECK(shifted == (vnni ? 1u : 0u));
    CHECK(centred == (vnni ? 0u : 1u));
  }
}

TEST_CASE("DynamicQuantizeLinear compiled: bit for bit the reference, an all-zero input, NaN and Inf named", "[any-isa]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{4, 1000});
  Node* dql = g.add_node("DynamicQuantizeLinear", {x}, {"y", "y_scale", "y_zero_point"}, {}, "dql");
  dql->set_opset(11);
  for (Value* v : dql->outputs()) g.add_output(v);
  infer_shapes(g);
  CompiledModel m = lower::compile(g);
  REQUIRE(steps_with(m, "DynamicQuantizeLinear", "ondine_dynamic_quantize") == 1);
  for (float lo : {-3.0f, 0.5f}) {  // an x with negative values, and one with none (zero point 0)
    INFO("lo " << lo);
    std::map<std::string, Tensor> in{{"x", random_input({4, 1000}, 5, lo, 2.0f)}};
    auto want = ReferenceExecutor(g).run(in), got = m.run(in);
    for (const char* name : {"y", "y_scale", "y_zero_point"}) {
      INFO(name);
      REQUIRE(got.at(name).nbytes() == want.at(name).nbytes());
      CHECK(std::memcmp(got.at(name).raw(), want.at(name).raw(), want.at(name).nbytes()) == 0);
    }
  }
  auto zeros = m.run({{"x", Tensor(DType::Float32, {4, 1000})}});
  CHECK(zeros.at("y_scale").data<float>()[0] == 1.0f);
  CHECK(zeros.at("y_zero_point").data<std::uint8_t>()[0] == 0);
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    Tensor t = random_input({4, 1000}, 6);
    t.data<float>()[1234] = bad;
    try {
      m.run({{"x", t}});
      FAIL("no error for " << bad);
    } catch (const Error& e) {
      std::string what = e.what();
      INFO(what);
      CHECK(what.find("dql") != std::string::npos);
      CHECK(what.find("index 1234") != std::string::npos);
    }
  }
}

#ifdef ONDINE_TEST_HAVE_IMPORT
// The whole encoder: one DynamicQuantizeLinear step per quantized activation, every weight matmul int8.
// With the float ops on the reference kernels too, compiled and reference agree to the bit. With them
// on oneDNN they differ by float rounding, and where that moves a value across a rounding boundary of
// the next DynamicQuantizeLinear, the quantized value moves by one step: measured here 1.7e-2 of max
// |reference| (cosine 0.99991), bound 5e-2 and 0.9995.
TEST_CASE("dynamic quantization of models/bert.onnx (when generated) compiles to int8 matmuls", "[e2e]") {
  auto loaded = test::example_model("bert.onnx");
  if (!loaded) return;
  Graph g = std::move(*loaded);
  bind_dims(g, {{"batch", 1}});
  make_pass_manager("quantize-dynamic").run(g);
  Tensor ids(DType::Int64, {1, 128});
  std::mt19937 rng(42);
  for (std::int64_t i = 0; i < ids.numel(); ++i) ids.data<std::int64_t>()[i] = static_cast<std::int64_t>(rng() % 1000);
  auto want = ReferenceExecutor(g).run({{"input_ids", ids}}).at("last_hidden_state");
  bool vnni = lower::effective_isa().int8_vnni;

  lower::CompileOptions only_int8;  // everything but the dynamic quantization on the reference kernels
  only_int8.passes = "fuse-dynamic-qmatmul";
  for (Node* n : g.nodes())
    if (n->op_type() != "DynamicQuantizeLinear") only_int8.reference_ops.insert(n->op_key());
  CompiledModel exact = lower::compile(g, only_int8);
  const Tensor same = exact.run({{"input_ids", ids}}).at("last_hidden_state");
  REQUIRE(same.nbytes() == want.nbytes());
  CHECK(std::memcmp(same.raw(), want.raw(), want.nbytes()) == 0);

  CompiledModel m = lower::compile(g, exact_weights());
  auto got = m.run({{"input_ids", ids}}).at("last_hidden_state");
  double dot = 0, na = 0, nb = 0, worst = 0, top = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    double a = want.at_double(static_cast<std::size_t>(i)), b = got.at_double(static_cast<std::size_t>(i));
    dot += a * b, na += a * a, nb += b * b;
    worst = std::max(worst, std::abs(a - b));
    top = std::max(top, std::abs(a));
  }
  double cosine = dot / std::sqrt(na * nb);
  INFO("cosine " << cosine << ", max abs error " << worst << " of max |reference| " << top);
  CHECK(cosine >= 0.9995);
  CHECK(worst <= 5e-2 * top);
  std::size_t int8 = 0, compiled = 0;
  for (auto& s : m.steps()) {
    compiled += s.op == "DynQMatMul" && s.implementation != "reference";
    int8 += s.op == "DynQMatMul" && s.detail.rfind("src u8", 0) == 0;
  }
  CHECK(compiled == 24u);
  CHECK(int8 == (vnni ? 24u : 0u));
}
#endif

// fake-quant: the Q/DQ pairs that stay float (here every layer: fuse-qdq told to fuse nothing, as on a CPU
// without VNNI for 8-bit weights with --exact-int8-weights) become ondine.FakeQuant, fused after the conv.
TEST_CASE("fake-quant: Q/DQ pairs kept float run as post-ops, as the pair computes") {
  QBuilder b;
  std::map<std::string, Attribute> same{{"pads", std::vector<std::int64_t>{1, 1, 1, 1}}};
  Value* x = b.qdq(b.input("x", {1, 64, 16, 16}), 0.01f, 128);
  Value* a = b.qdq(b.op("Relu", {b.conv(x, 64, 64, 3, same)}), 0.02f, 0);  // 3x3: Winograd where it pays
  Value* c = b.qdq(b.conv(a, 64, 64, 1), 0.03f, 120);                          // 1x1, an asymmetric zero point
  Value* r = b.qdq(b.op("Relu", {b.op("Add", {c, x})}), 0.02f, 0);            // a residual add, then Relu
  b.g.add_output(b.qdq(b.conv(r, 32, 64, 3, same), 0.05f, -3, DType::Int8));   // int8 output, s8 activations
  infer_shapes(b.g);

  auto float_pipeline = [](Graph& g, const std::string& pipeline) {
    PassManager pm = make_pass_manager(pipeline);
    pm.context().options["fuse-qdq.max-abs-weight"] = "0";  // no layer in int8
    pm.run(g);
  };
  SECTION("structure: one FakeQuant per pair, the reference bit for bit unchanged") {
    Graph g = b.g.clone();
    float_pipeline(g, "fuse-qdq,fake-quant,fold-constants,dce");
    CHECK(count(g, "QuantizeLinear") == 0);
    CHECK(count(g, "DequantizeLinear") == 0);  // the weights' DQs are folded constants
    CHECK(count(g, "ondine.FakeQuant") == 5);
    std::map<std::string, Tensor> in{{"x", random_input({1, 64, 16, 16}, 3)}};
    Tensor want = ReferenceExecutor(b.g).run(in).begin()->second;
    Tensor got = ReferenceExecutor(g).run(in).begin()->second;
    REQUIRE(want.dims() == got.dims());
    CHECK(std::memcmp(want.data<float>(), got.data<float>(), static_cast<std::size_t>(want.numel()) * 4) == 0);
    // After fuse, the pairs after a conv are its activations; the one after the Add stays a node.
    Graph h = b.g.clone();
    float_pipeline(h, "default");
    std::size_t in_chains = 0;
    for (Node* n : h.nodes())
      if (n->op_type() == "FusedConv")
        for (const fused::Activation& act : fused::read_activations(*n))
          in_chains += act.op == "FakeQuantU8" || act.op == "FakeQuantS8";
    CHECK(in_chains == 3);
    CHECK(count(h, "ondine.FakeQuant") == 2);  // the input's and the Add's
  }
  SECTION("numbers: compiled against the reference on the QDQ graph") {
    Graph g = b.g.clone();
    float_pipeline(g, "default");
    lower::CompileOptions o;
    o.passes = "none";
    CompiledModel m = lower::compile(g, o);
    CHECK(lower::int8_plan(m).int8_steps == 0);
    for (auto& st : m.steps()) {
      INFO(st.op << " '" << st.name << "': " << st.implementation);
      CHECK(st.op != "QuantizeLinear");
      CHECK(st.op != "DequantizeLinear");
      CHECK(st.implementation.rfind("ref", 0) != 0);
    }
    std::map<std::string, Tensor> in{{"x", random_input({1, 64, 16, 16}, 5)}};
    Tensor want = ReferenceExecutor(b.g).run(in).begin()->second;
    Tensor got = m.run(in).begin()->second;
    // Each output a multiple of its step (0.05). The float kernels (Winograd's transforms most) round
    // differently from the reference's double sums, which moves a value near a rounding boundary by one
    // step, and such a step moves later layers' sums: within two steps, and most outputs exact (a wrong
    // rounding mode or zero point would leave half or fewer exact).
    double worst = 0;
    std::size_t exact = 0, within_one = 0;
    for (std::int64_t i = 0; i < want.numel(); ++i) {
      double d = std::abs(want.at_double(static_cast<std::size_t>(i)) - got.at_double(static_cast<std::size_t>(i)));
      worst = std::max(worst, d);
      exact += d < 1e-6;
      within_one += d <= 0.05 * 1.0001;
    }
    INFO("worst " << worst << ", exact " << exact << ", within one step " << within_one << " of " << want.numel());
    CHECK(worst <= 2 * 0.05 * 1.0001);
    CHECK(static_cast<double>(within_one) >= 0.99 * static_cast<double>(want.numel()));
    CHECK(static_cast<double>(exact) >= 0.75 * static_cast<double>(want.numel()));
  }
  SECTION("bad input: a FakeQuant with a bad scale, type or zero point is refused naming the node") {
    for (const auto& attrs : std::vector<std::map<std::string, Attribute>>{
             {{"scale", -1.0f}, {"zero_point", std::int64_t{0}}, {"to", std::string("uint8")}},
             {{"scale", 0.1f}, {"zero_point", std::int64_t{300}}, {"to", std::string("uint8")}},
             {{"scale", 0.1f}, {"zero_point", std::int64_t{0}}, {"to", std::string("int4")}}}) {
      Graph g;
      Value* in = g.add_input("x", DType::Float32, Shape::from({2, 3}));
      g.add_output(g.add_node("FakeQuant", {in}, {"y"}, attrs, "fq_bad", fused::kDomain)->output(0));
      CHECK_THROWS_WITH(infer_shapes(g), Catch::Contains("fq_bad") && Catch::Contains("scale"));
      CHECK_THROWS_WITH(ReferenceExecutor(g).run({{"x", random_input({2, 3}, 1)}}), Catch::Contains("fq_bad"));
    }
  }
  SECTION("must not fire: a requantization (other parameters) or per-channel activations") {
    QBuilder n;
    Value* in = n.input("x", {1, 4, 3, 3});
    Value* requant = n.dq(n.q(in, 0.01f, 128), 0.02f, 128);  // Q and DQ disagree: not a fake quantization
    Value* s = n.g.add_constant("pcs", Tensor::from_vector<float>({4}, {0.1f, 0.2f, 0.3f, 0.4f}));
    Value* z = n.g.add_constant("pcz", Tensor::from_vector<std::uint8_t>({4}, {1, 2, 3, 4}));
    Value* pc = n.op("DequantizeLinear", {n.op("QuantizeLinear", {requant, s, z}, {{"axis", std::int64_t{1}}}), s, z},
                     {{"axis", std::int64_t{1}}});
    n.g.add_output(pc);
    infer_shapes(n.g);
    Graph g = n.g.clone();
    PassManager pm = make_pass_manager("fake-quant");
    CHECK_FALSE(pm.run(g));
    CHECK(count(g, "ondine.FakeQuant") == 0);
    CHECK(count(g, "QuantizeLinear") == 2);
  }
}

}  // namespace test_lower_int8
