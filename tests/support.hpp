// tests/support.hpp - what several test files share: seeded random data, the relative error checks use, the
// comparison of outputs with the reference executor's, the error a call throws, and the example models
// scripts/make_models.py writes (models/, not in the repository).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/graph.hpp"
#include "ondine/quant/calibration.hpp"
#if __has_include("ondine/onnx/import.hpp")
#include "ondine/onnx/import.hpp"
#endif

namespace ondine::test {

// float32 tensor of N(0, scale) values.
inline Tensor random_tensor(std::vector<std::int64_t> dims, std::mt19937& rng, float scale = 1.0f) {
  Tensor t(DType::Float32, std::move(dims));
  std::normal_distribution<float> n(0.0f, scale);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
  return t;
}

// float32 tensor of U(lo, hi) values from its own seed.
inline Tensor uniform_tensor(const std::vector<std::int64_t>& dims, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  Tensor t(DType::Float32, dims);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// Largest |a - b| over max |b|; `b` must be a real output (max |b| > 0.05), so no check passes vacuously.
inline double rel_error(const Tensor& a, const Tensor& b) {
  REQUIRE(a.dims() == b.dims());
  auto x = a.to_floats(), y = b.to_floats();
  double err = 0, mag = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(x[i] - y[i])));
    mag = std::max(mag, static_cast<double>(std::fabs(y[i])));
  }
  REQUIRE(mag > 0.05);
  return err / mag;
}

// max |t|
inline double max_abs(const Tensor& t) {
  double m = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(t.at_double(static_cast<std::size_t>(i))));
  return m;
}

// Non-trivial: finite, not all equal (so not all zero).
inline void require_nontrivial(const Tensor& t, const std::string& what) {
  INFO(what << " " << dims_str(t.dims()));
  REQUIRE(t.numel() > 0);
  double lo = t.at_double(0), hi = lo;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    double v = t.at_double(static_cast<std::size_t>(i));
    REQUIRE(std::isfinite(v));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  REQUIRE(hi > lo);
}

// max |got - want| / max |want| (max |got - want| when `want` is all zero), same dims and dtype. For
// outputs checked to be non-trivial first; rel_error also requires a real magnitude.
inline double relative_error(const Tensor& got, const Tensor& want) {
  REQUIRE(got.dims() == want.dims());
  REQUIRE(got.dtype() == want.dtype());
  double scale = max_abs(want), err = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i)
    err = std::max(err, std::abs(got.at_double(static_cast<std::size_t>(i)) - want.at_double(static_cast<std::size_t>(i))));
  return scale > 0 ? err / scale : err;
}

// Every output of `want` (the reference executor's, each required non-trivial) is in `got`, which has no
// other, within relative_error `tol`; a failure prints `context` (the compiled model's or the graph's text).
inline void check_outputs(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& want,
                          double tol, const std::string& context) {
  REQUIRE(got.size() == want.size());
  for (auto& [name, w] : want) {
    require_nontrivial(w, "reference output " + name);
    INFO("output " << name << "\n" << context);
    REQUIRE(got.count(name));
    CHECK(relative_error(got.at(name), w) <= tol);
  }
}

// The what() of the ondine::Error that f throws; fails the test when it throws nothing.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("expected an ondine::Error");
  return "";
}

// The message (without node and op) of the ondine::Error that f throws, which must name the node `node` and
// the op `op`; fails the test when f throws nothing.
inline std::string node_error(const std::function<void()>& f, const std::string& op,
                              const std::string& node = "node_under_test") {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.node() == node);
    CHECK(e.op() == op);
    return e.message();
  }
  FAIL("expected an ondine::Error");
  return "";
}

// A seeded graph builder: constants get fresh names and reproducible U(-scale, scale) values. Test files
// derive their own from it (convolutions, LayerNorm as exporters write it, ...).
struct GraphBuilder {
  using Dims = std::vector<std::int64_t>;
  Graph g;
  unsigned seed = 1;
  Value* input(const std::string& name, const Dims& dims) { return g.add_input(name, DType::Float32, Shape::from(dims)); }
  Value* weight(const Dims& dims, float scale = 0.5f) {
    return g.add_constant(g.unique_name("w"), uniform_tensor(dims, seed++, -scale, scale));
  }
  Value* positive(const Dims& dims, float lo, float hi) {
    return g.add_constant(g.unique_name("p"), uniform_tensor(dims, seed++, lo, hi));
  }
  Value* scalar(float v) { return g.add_constant(g.unique_name("c"), Tensor::from_vector<float>({}, {v})); }
  Value* floats(const std::vector<float>& v) {
    return g.add_constant(g.unique_name("f"), Tensor::from_vector<float>({static_cast<std::int64_t>(v.size())}, v));
  }
  Value* ints(const Dims& v) {
    return g.add_constant(g.unique_name("i"), Tensor::from_vector<std::int64_t>({static_cast<std::int64_t>(v.size())}, v));
  }
  Node* node(const std::string& type, const std::vector<Value*>& inputs, std::map<std::string, Attribute> attrs = {},
             std::size_t outputs = 1, const std::string& domain = "") {
    return g.add_node(type, inputs, std::vector<std::string>(outputs, ""), std::move(attrs), g.unique_name(type), domain);
  }
  Value* op(const std::string& type, const std::vector<Value*>& inputs, std::map<std::string, Attribute> attrs = {},
            const std::string& domain = "") {
    return node(type, inputs, std::move(attrs), 1, domain)->output(0);
  }
};

// `count` input maps for `g`, every graph input N(0, 1) at its static shape.
inline std::vector<quant::Sample> random_samples(const Graph& g, std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<quant::Sample> out;
  for (std::size_t i = 0; i < count; ++i) {
    quant::Sample s;
    for (Value* in : g.inputs()) s[in->name()] = random_tensor(in->shape().sizes(), rng);
    out.push_back(std::move(s));
  }
  return out;
}

// A dynamically quantized convolution as ONNX Runtime's quantize_dynamic writes it for CNNs:
// DynamicQuantizeLinear(x) -> ConvInteger(xq, W, xz, W_zp) -> Cast -> Mul(xs * w_scale) -> Add(bias
// [1, M, 1, 1]) -> Relu, x [2, 32, 9, 9], W [M=12, 32/group, 3, 3] (`spatial` 1: x [2, 32, 17]; 3: x [2, 32, 5, 6,
// 7]; W 3 wide in each). `uint8_weights`: W uint8 around zero points 113..131 (their centred values beyond int8),
// else int8 with zero point 0.
struct DynamicConvSpec {
  bool uint8_weights = false, per_channel = false, relu = true;
  std::int64_t group = 1, stride = 1, pad = 1, spatial = 2;
  std::vector<std::int64_t> input_dims() const {
    return spatial == 1 ? std::vector<std::int64_t>{2, 32, 17}
                        : spatial == 3 ? std::vector<std::int64_t>{2, 32, 5, 6, 7} : std::vector<std::int64_t>{2, 32, 9, 9};
  }
};
inline Graph dynamic_conv_graph(const DynamicConvSpec& spec) {
  Graph g;
  const std::int64_t m = 12, c = 32;
  const std::vector<std::int64_t> xd = spec.input_dims();
  Value* x = g.add_input("x", DType::Float32, Shape::from(xd));
  Node* dql = g.add_node("DynamicQuantizeLinear", {x}, {"xq", "xs", "xz"}, {}, "x_quantize");
  dql->set_opset(11);
  std::mt19937 rng(17);
  const std::size_t spatial = xd.size() - 2;
  std::vector<std::int64_t> wd{m, c / spec.group};
  wd.resize(xd.size(), 3);
  std::vector<std::int64_t> per_channel_dims(xd.size(), 1);  // [1, M, 1(, 1)]
  per_channel_dims[1] = m;
  Tensor w(spec.uint8_weights ? DType::UInt8 : DType::Int8, wd);
  std::vector<int> zero(spec.per_channel ? m : 1);
  for (std::size_t i = 0; i < zero.size(); ++i) zero[i] = spec.uint8_weights ? 113 + static_cast<int>((i * 7) % 19) : 0;
  for (std::int64_t i = 0; i < w.numel(); ++i) {
    int v = spec.uint8_weights ? static_cast<int>(rng() % 256) : static_cast<int>(rng() % 255) - 127;
    if (spec.uint8_weights) w.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(v);
    else w.data<std::int8_t>()[i] = static_cast<std::int8_t>(v);
  }
  Tensor wz(w.dtype(), spec.per_channel ? std::vector<std::int64_t>{m} : std::vector<std::int64_t>{});
  for (std::size_t i = 0; i < zero.size(); ++i)
    if (spec.uint8_weights) wz.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(zero[i]);
    else wz.data<std::int8_t>()[i] = 0;
  std::map<std::string, Attribute> attrs{{"kernel_shape", std::vector<std::int64_t>(spatial, 3)},
                                         {"pads", std::vector<std::int64_t>(2 * spatial, spec.pad)},
                                         {"strides", std::vector<std::int64_t>(spatial, spec.stride)},
                                         {"group", spec.group}};
  Value* acc = g.add_node("ConvInteger", {dql->output(0), g.add_constant("w", w), dql->output(2), g.add_constant("wz", wz)},
                          {"acc"}, attrs, "conv")->output(0);
  Value* accf = g.add_node("Cast", {acc}, {"accf"}, {{"to", std::int64_t{1}}}, "cast")->output(0);
  Tensor ws(DType::Float32, spec.per_channel ? per_channel_dims : std::vector<std::int64_t>{});
  for (std::int64_t i = 0; i < ws.numel(); ++i) ws.data<float>()[i] = 0.002f * static_cast<float>(1 + i % 5);
  Value* s = g.add_node("Mul", {dql->output(1), g.add_constant("ws", ws)}, {"s"}, {}, "scales")->output(0);
  Value* y = g.add_node("Mul", {accf, s}, {"scaled"}, {}, "rescale")->output(0);
  Tensor b(DType::Float32, per_channel_dims);
  for (std::int64_t i = 0; i < m; ++i) b.data<float>()[i] = 0.05f * static_cast<float>(i) - 0.3f;
  y = g.add_node("Add", {g.add_constant("b", b), y}, {"biased"}, {}, "bias")->output(0);
  if (spec.relu) y = g.add_node("Relu", {y}, {"y"}, {}, "relu")->output(0);
  g.add_output(y);
  return g;
}

#if __has_include("ondine/onnx/import.hpp")
// models/<file> imported, or nullopt with a warning when it has not been generated (the tests that use
// it then skip: scripts/make_models.py --out models writes it).
inline std::optional<Graph> example_model(const std::string& file) {
  std::string path = std::string(ONDINE_TEST_DATA_DIR) + "/../../models/" + file;
  if (!std::ifstream(path)) {
    WARN("skipped: models/" << file << " not found (scripts/make_models.py --out models writes it)");
    return std::nullopt;
  }
  return onnx::load_model(path);
}
#endif

}  // namespace ondine::test
