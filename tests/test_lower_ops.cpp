// Tests of the oneDNN lowerings of ConvTranspose (deconvolution), LayerNormalization (layer
// normalization) and Resize (resampling). Every compiled graph is checked against the reference
// executor on seeded random inputs, with the tolerance stated per test as a fraction of the largest
// reference magnitude. Each supported case must run on oneDNN (its step is not "reference"); each
// case the lowering must decline runs the reference kernel and still gives the right answer.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "ondine/lower/lower.hpp"
#include "ondine/reference/executor.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_lower_ops {

using namespace ondine;
using Dims = std::vector<std::int64_t>;

namespace {

Tensor random_tensor(const Dims& dims, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  return test::uniform_tensor(dims, seed, lo, hi);
}

using Builder = test::GraphBuilder;



using test::max_abs;
using test::relative_error;
using test::require_nontrivial;

// The two ways compile() sees a graph: after the default passes (the layout pass decides the
// activation layouts: row-major around graph inputs and outputs), and without passes (format_tag::any:
// oneDNN picks, blocked for the conv family).
const std::vector<std::string> pipelines = {"default", "none"};

lower::CompileOptions with_passes(const std::string& passes) {
  lower::CompileOptions o;
  o.passes = passes;
  return o;
}

// Compiles, runs, compares each output with the reference executor within `tol`; returns the model.
CompiledModel check_graph(Graph& g, double tol, const lower::CompileOptions& options = {}) {
  g.verify();
  infer_shapes(g);
  std::map<std::string, Tensor> inputs;
  unsigned seed = 100;
  for (Value* v : g.inputs()) inputs[v->name()] = random_tensor(v->shape().sizes(), seed++);
  for (auto& [name, t] : inputs) require_nontrivial(t, "input " + name);
  auto want = ReferenceExecutor(g).run(inputs);
  CompiledModel model = lower::compile(g, options);
  test::check_outputs(model.run(inputs), want, tol, model.to_text());
  return model;
}

// The implementations of the steps running `op`.
std::vector<std::string> impls(const CompiledModel& m, const std::string& op) {
  std::vector<std::string> out;
  for (auto& s : m.steps())
    if (s.op == op) out.push_back(s.implementation);
  return out;
}
// Exactly one step runs `op`, on oneDNN.
void require_onednn(const CompiledModel& m, const std::string& op) {
  auto i = impls(m, op);
  INFO(m.to_text());
  REQUIRE(i.size() == 1);
  CHECK(i[0] != "reference");
  CHECK(m.implementation_histogram().count("reference") == 0);
}
// Exactly one step runs `op`, on its reference kernel.
void require_reference(const CompiledModel& m, const std::string& op) {
  auto i = impls(m, op);
  INFO(m.to_text());
  REQUIRE(i.size() == 1);
  CHECK(i[0] == "reference");
}

using Attrs = std::map<std::string, Attribute>;

// --- ConvTranspose ----------------------------------------------------------------------------------

struct DeconvCase {
  const char* name;
  Dims x, w;  // w: ONNX [C_in, C_out/group, k...]
  Attrs attrs;
  bool bias = true;
};

Graph deconv_graph(const DeconvCase& c, bool runtime_weights = false) {
  Builder b;
  Value* x = b.input("x", c.x);
  Value* w = runtime_weights ? b.input("w", c.w) : b.weight(c.w);
  std::vector<Value*> in{x, w};
  std::int64_t group = c.attrs.count("group") ? std::get<std::int64_t>(c.attrs.at("group")) : 1;
  if (c.bias) in.push_back(b.weight({c.w[1] * group}));
  b.g.add_output(b.op("ConvTranspose", in, c.attrs));
  return std::move(b.g);
}

}  // namespace

TEST_CASE("lower ops: ConvTranspose runs as a oneDNN deconvolution (1e-5)", "[lower][deconv]") {
  const std::vector<DeconvCase> cases = {
      {"2-D, 3x3, stride 1", {2, 4, 7, 7}, {4, 6, 3, 3}, {}},
      {"2-D, stride 2, pads 1, output_padding 1", {1, 8, 6, 5}, {8, 4, 3, 3},
       {{"strides", Dims{2, 2}}, {"pads", Dims{1, 1, 1, 1}}, {"output_padding", Dims{1, 1}}}},
      {"2-D, asymmetric pads and strides, no bias", {1, 3, 5, 6}, {3, 5, 3, 2},
       {{"strides", Dims{3, 2}}, {"pads", Dims{0, 1, 2, 0}}}, false},
      {"2-D, group 2, stride 2, dilation 2", {2, 6, 5, 5}, {6, 3, 3, 3},
       {{"group", std::int64_t{2}}, {"strides", Dims{2, 2}}, {"dilations", Dims{2, 2}}}},
      {"2-D, depthwise (group = channels)", {1, 8, 6, 6}, {8, 1, 4, 4},
       {{"group", std::int64_t{8}}, {"strides", Dims{2, 2}}, {"pads", Dims{1, 1, 1, 1}}}},
      {"1-D, stride 3, pads 1 / 2", {2, 5, 9}, {5, 4, 4}, {{"strides", Dims{3}}, {"pads", Dims{1, 2}}}},
      {"3-D, stride 2, kernel 2", {1, 4, 3, 4, 3}, {4, 3, 2, 2, 2}, {{"strides", Dims{2, 2, 2}}}},
      {"auto_pad SAME_UPPER, stride 2", {1, 4, 5, 5}, {4, 4, 3, 3},
       {{"auto_pad", std::string("SAME_UPPER")}, {"strides", Dims{2, 2}}}},
      {"auto_pad SAME_LOWER, stride 2", {1, 4, 5, 5}, {4, 4, 3, 3},
       {{"auto_pad", std::string("SAME_LOWER")}, {"strides", Dims{2, 2}}}},
      {"output_shape (pads derived)", {1, 4, 5, 5}, {4, 4, 3, 3},
       {{"strides", Dims{2, 2}}, {"output_shape", Dims{10, 9}}}},
      {"kernel_shape given", {1, 2, 4, 4}, {2, 3, 3, 3}, {{"kernel_shape", Dims{3, 3}}, {"pads", Dims{1, 1, 1, 1}}}},
  };
  for (const auto& c : cases) {
    for (const auto& passes : pipelines) {
      DYNAMIC_SECTION(c.name << ", passes " << passes) {
        Graph g = deconv_graph(c);
        CompiledModel m = check_graph(g, 1e-5, with_passes(passes));
        require_onednn(m, "ConvTranspose");
      }
    }
  }
}

TEST_CASE("lower ops: a 3-D depthwise Conv and MaxPool take oneDNN's channels-last jit kernels where they have them (1e-5)",
          "[lower][conv]") {
  // oneDNN 2.6 has its 3-D depthwise kernel in ndhwc only; the layout it picks itself runs the im2col GEMM
  // (MViT-V2's 3x3x3 pooling convs). Without AVX-512 there is no such kernel: the GEMM stays.
  for (const Dims& strides : {Dims{1, 1, 1}, Dims{1, 2, 2}}) {
    DYNAMIC_SECTION("strides " << strides[1]) {
      Builder b;
      Value* w = b.g.add_constant("w", random_tensor({16, 1, 3, 3, 3}, 3));
      b.g.add_output(b.op("Conv", {b.input("x", {2, 16, 4, 8, 8}), w},
                          {{"group", std::int64_t{16}}, {"pads", Dims{1, 1, 1, 1, 1, 1}}, {"strides", strides}}));
      CompiledModel m = check_graph(b.g, 1e-5, with_passes("none"));
      auto i = impls(m, "Conv");
      REQUIRE(i.size() == 1);
      CHECK(i[0].rfind("ref", 0) != 0);
      if (lower::effective_isa().avx512) CHECK(i[0].find("gemm") == std::string::npos);
    }
  }
  SECTION("a 3-D MaxPool of a row-major source") {  // MViT-V2's skip pool: plain simple_nchw, jit in ndhwc
    Builder b;
    b.g.add_output(b.op("MaxPool", {b.input("x", {1, 16, 4, 9, 9})},
                        {{"kernel_shape", Dims{1, 3, 3}}, {"strides", Dims{1, 2, 2}}, {"pads", Dims{0, 1, 1, 0, 1, 1}}}));
    CompiledModel m = check_graph(b.g, 0.0, with_passes("none"));
    auto i = impls(m, "MaxPool");
    REQUIRE(i.size() == 1);
    if (lower::effective_isa().avx512) CHECK(i[0].find("jit") != std::string::npos);
  }
}

TEST_CASE("lower ops: ConvTranspose with runtime weights reorders them per run (1e-5)", "[lower][deconv]") {
  for (std::int64_t group : {std::int64_t{1}, std::int64_t{2}}) {
    DYNAMIC_SECTION("group " << group) {
      DeconvCase c{"runtime weights", {1, 4, 5, 5}, {4, 3, 3, 3}, {{"group", group}, {"strides", Dims{2, 2}}}};
      Graph g = deconv_graph(c, /*runtime_weights*/ true);
      CompiledModel m = check_graph(g, 1e-5);
      require_onednn(m, "ConvTranspose");
      CHECK(impls(m, "Reorder").size() >= 1);  // the weights, from the ONNX order into oneDNN's
    }
  }
}

TEST_CASE("lower ops: ConvTranspose + residual Add + Relu fold into the deconvolution (1e-5)", "[lower][deconv]") {
  for (const auto& passes : pipelines) {
    DYNAMIC_SECTION("passes " << passes) {
      Builder b;
      Value* x = b.input("x", {1, 8, 5, 5});
      Value* r = b.input("r", {1, 4, 10, 10});
      // Kernel 3, stride 2 (overlapping: not deconv-as-conv's), pads to a 10x10 output.
      Value* y = b.op("ConvTranspose", {x, b.weight({8, 4, 3, 3}), b.weight({4})},
                      {{"strides", Dims{2, 2}}, {"pads", Dims{1, 1, 0, 0}}});
      y = b.op("Add", {y, r});
      y = b.op("Relu", {y});
      b.g.add_output(y);
      CompiledModel m = check_graph(b.g, 1e-5, with_passes(passes));
      require_onednn(m, "ConvTranspose");
      CHECK(impls(m, "Relu").empty());
      // Without passes the Add is a sum post-op. The layout pass puts the reorder of `r` after the
      // deconvolution, so `r` is not ready when it is lowered and the Add stays a (fused) binary.
      if (passes == "none") CHECK(impls(m, "Add").empty());
    }
  }
}

TEST_CASE("lower ops: ConvTranspose declines what oneDNN cannot express, and stays right (1e-9)", "[lower][deconv]") {
  const std::vector<DeconvCase> cases = {
      // output_padding past the end pad: an output column no input reaches (oneDNN padding_r -1).
      {"output_padding without an end pad", {1, 4, 5, 5}, {4, 3, 3, 3},
       {{"strides", Dims{2, 2}}, {"output_padding", Dims{1, 1}}}},
      // output_shape longer than the full result: negative pads.
      {"output_shape past the full result", {1, 4, 4, 4}, {4, 3, 3, 3},
       {{"strides", Dims{2, 2}}, {"output_shape", Dims{12, 11}}}},
  };
  for (const auto& c : cases) {
    for (const auto& passes : pipelines) {
      DYNAMIC_SECTION(c.name << ", passes " << passes) {
        Graph g = deconv_graph(c);
        // The compiled model runs the very same reference kernel: equal to rounding.
        CompiledModel m = check_graph(g, 1e-9, with_passes(passes));
        require_reference(m, "ConvTranspose");
      }
    }
  }
}

// --- LayerNormalization -----------------------------------------------------------------------------

namespace {

struct LayerNormCase {
  const char* name;
  Dims x;
  std::int64_t axis;
  Dims scale, bias;  // bias empty: no B
  float epsilon = 1e-5f;
};

Graph layernorm_graph(const LayerNormCase& c, bool runtime_scale = false) {
  Builder b;
  Value* x = b.input("x", c.x);
  Value* scale = runtime_scale ? b.input("scale", c.scale) : b.weight(c.scale, 1.5f);
  std::vector<Value*> in{x, scale};
  if (!c.bias.empty()) in.push_back(b.weight(c.bias));
  b.g.add_output(b.op("LayerNormalization", in, {{"axis", c.axis}, {"epsilon", c.epsilon}}));
  return std::move(b.g);
}

}  // namespace

TEST_CASE("lower ops: LayerNormalization runs as a oneDNN layer normalization (1e-5)", "[lower][layernorm]") {
  const std::vector<LayerNormCase> cases = {
      {"3-D, last axis (-1)", {2, 5, 64}, -1, {64}, {64}},
      {"3-D, axis 2 given positively, epsilon 1e-3", {2, 5, 16}, 2, {16}, {16}, 1e-3f},
      {"no bias", {3, 32}, -1, {32}, {}},
      {"axis 1 of 3: normalises two dims at once", {2, 5, 16}, 1, {5, 16}, {5, 16}},
      {"axis 0: everything", {3, 4, 5}, 0, {3, 4, 5}, {3, 4, 5}},
      {"4-D axis -2 with broadcast scale and bias", {2, 3, 4, 8}, -2, {8}, {1, 8}},
      {"1-D", {40}, 0, {40}, {40}},
  };
  for (const auto& c : cases) {
    for (const auto& passes : pipelines) {
      DYNAMIC_SECTION(c.name << ", passes " << passes) {
        Graph g = layernorm_graph(c);
        CompiledModel m = check_graph(g, 1e-5, with_passes(passes));
        require_onednn(m, "LayerNormalization");
      }
    }
  }
  SECTION("runtime scale of the normalised dims") {
    Graph g = layernorm_graph({"runtime", {4, 24}, -1, {24}, {24}}, /*runtime_scale*/ true);
    CompiledModel m = check_graph(g, 1e-5);
    require_onednn(m, "LayerNormalization");
  }
}

TEST_CASE("lower ops: LayerNormalization declines Mean/InvStdDev outputs and other stash types (1e-9)",
          "[lower][layernorm]") {
  SECTION("Mean and InvStdDev read") {
    Builder b;
    Value* x = b.input("x", {2, 3, 16});
    Node* ln = b.node("LayerNormalization", {x, b.weight({16}), b.weight({16})}, {{"axis", std::int64_t{-1}}}, 3);
    for (std::size_t i = 0; i < 3; ++i) b.g.add_output(ln->output(i));
    CompiledModel m = check_graph(b.g, 1e-9);
    require_reference(m, "LayerNormalization");
  }
  SECTION("stash_type double") {
    Builder b;
    Value* x = b.input("x", {2, 16});
    b.g.add_output(b.op("LayerNormalization", {x, b.weight({16}), b.weight({16})}, {{"stash_type", std::int64_t{11}}}));
    CompiledModel m = check_graph(b.g, 1e-9);
    require_reference(m, "LayerNormalization");
  }
  SECTION("runtime scale that broadcasts") {
    Graph g = layernorm_graph({"runtime broadcast", {2, 4, 8}, 1, {8}, {4, 8}}, /*runtime_scale*/ true);
    CompiledModel m = check_graph(g, 1e-9);
    require_reference(m, "LayerNormalization");
  }
}

// --- Resize -----------------------------------------------------------------------------------------

namespace {

struct ResizeCase {
  const char* name;
  Dims x;
  std::vector<float> scales;  // empty: use sizes
  Dims sizes;
  Attrs attrs;
};

Graph resize_graph(const ResizeCase& c, bool after_conv = false) {
  Builder b;
  Value* x = b.input("x", c.x);
  if (after_conv) {  // a producer in a blocked layout
    std::int64_t ch = c.x[1];
    x = b.op("Conv", {x, b.weight({ch, ch, 3, 3}), b.weight({ch})}, {{"pads", Dims{1, 1, 1, 1}}});
  }
  Value* scales = c.scales.empty() ? nullptr : b.floats(c.scales);
  Value* sizes = c.sizes.empty() ? nullptr : b.ints(c.sizes);
  std::vector<Value*> in{x, nullptr, scales};
  if (sizes) in.push_back(sizes);
  b.g.add_output(b.op("Resize", in, c.attrs));
  return std::move(b.g);
}

Attrs resize_attrs(const std::string& mode, const std::string& coords, const std::string& nearest = "") {
  Attrs a{{"mode", mode}, {"coordinate_transformation_mode", coords}};
  if (!nearest.empty()) a["nearest_mode"] = nearest;
  return a;
}

}  // namespace

TEST_CASE("lower ops: Resize runs as oneDNN resampling where the taps agree (1e-5)", "[lower][resize]") {
  const std::vector<ResizeCase> cases = {
      {"nearest half_pixel x2, round_prefer_floor (no ties)", {1, 3, 5, 6}, {1, 1, 2, 2}, {},
       resize_attrs("nearest", "half_pixel", "round_prefer_floor")},
      {"nearest half_pixel x0.5, round_prefer_ceil (ties go up, as roundf)", {1, 3, 8, 6}, {1, 1, 0.5f, 0.5f}, {},
       resize_attrs("nearest", "half_pixel", "round_prefer_ceil")},
      // (2o + 1) * in = 2 * out * (k + 1) has no solution for odd `in`: no ties.
      {"nearest half_pixel sizes 3 -> 7, 5 -> 9 (odd inputs: no ties)", {2, 2, 3, 5}, {}, {2, 2, 7, 9},
       resize_attrs("nearest", "half_pixel", "round_prefer_floor")},
      {"nearest asymmetric floor x2 (Upsample)", {1, 4, 4, 5}, {1, 1, 2, 2}, {},
       resize_attrs("nearest", "asymmetric", "floor")},
      {"nearest 1-D x3", {2, 3, 7}, {1, 1, 3}, {}, resize_attrs("nearest", "half_pixel")},
      {"linear half_pixel x2", {1, 3, 5, 6}, {1, 1, 2, 2}, {}, resize_attrs("linear", "half_pixel")},
      {"linear half_pixel x1.5, 1-D", {2, 3, 8}, {1, 1, 1.5f}, {}, resize_attrs("linear", "half_pixel")},
      {"linear half_pixel sizes 8 -> 3 (down)", {1, 2, 8, 8}, {}, {1, 2, 3, 5}, resize_attrs("linear", "half_pixel")},
      {"linear pytorch_half_pixel x2 (half_pixel when out > 1)", {1, 2, 4, 4}, {1, 1, 2, 2}, {},
       resize_attrs("linear", "pytorch_half_pixel")},
      {"linear 3-D x2", {1, 2, 3, 4, 3}, {1, 1, 2, 2, 2}, {}, resize_attrs("linear", "half_pixel")},
      {"nearest 3-D, one axis unchanged", {1, 2, 3, 4, 3}, {1, 1, 1, 2, 3}, {}, resize_attrs("nearest", "half_pixel")},
  };
  for (const auto& c : cases) {
    for (const auto& passes : pipelines) {
      DYNAMIC_SECTION(c.name << ", passes " << passes) {
        Graph g = resize_graph(c);
        CompiledModel m = check_graph(g, 1e-5, with_passes(passes));
        require_onednn(m, "Resize");
      }
    }
  }
  SECTION("after a conv, linear x2, on the conv's layout (no passes: oneDNN picks)") {
    Graph g = resize_graph({"after conv", {1, 16, 6, 6}, {1, 1, 2, 2}, {}, resize_attrs("linear", "half_pixel")}, true);
    CompiledModel m = check_graph(g, 1e-5, with_passes("none"));
    require_onednn(m, "Resize");
    // The resampling reads the conv's output as it is (NHWC or blocked, not row-major).
    INFO(m.to_text());
    std::string detail;
    for (auto& st : m.steps())
      if (st.op == "Resize") detail = st.detail;
    CHECK(detail.find(" abcd[") == std::string::npos);
  }
  SECTION("Resize + Relu fold into the resampling") {
    Builder b;
    Value* x = b.input("x", {1, 3, 4, 4});
    Value* y = b.op("Resize", {x, nullptr, b.floats({1, 1, 2, 2})}, resize_attrs("nearest", "half_pixel"));
    b.g.add_output(b.op("Relu", {y}));
    CompiledModel m = check_graph(b.g, 1e-5);
    require_onednn(m, "Resize");
    CHECK(impls(m, "Relu").empty());
  }
}

TEST_CASE("lower ops: Resize declines what oneDNN computes differently, and stays right (1e-9)", "[lower][resize]") {
  const std::vector<ResizeCase> cases = {
      {"nearest x0.5, round_prefer_floor (ties go down)", {1, 3, 8, 6}, {1, 1, 0.5f, 0.5f}, {},
       resize_attrs("nearest", "half_pixel", "round_prefer_floor")},
      {"nearest sizes 4 -> 9, round_prefer_floor (a tie at o = 4)", {1, 2, 3, 4}, {}, {1, 2, 3, 9},
       resize_attrs("nearest", "half_pixel", "round_prefer_floor")},
      {"linear scale 2.5 on 3 (out 7: the scale is not out / in)", {1, 2, 3, 3}, {1, 1, 2.5f, 2.5f}, {},
       resize_attrs("linear", "half_pixel")},
      {"linear align_corners", {1, 2, 4, 4}, {1, 1, 2, 2}, {}, resize_attrs("linear", "align_corners")},
      {"linear asymmetric", {1, 2, 4, 4}, {1, 1, 2, 2}, {}, resize_attrs("linear", "asymmetric")},
      {"cubic", {1, 2, 4, 4}, {1, 1, 2, 2}, {}, resize_attrs("cubic", "half_pixel")},
      {"channels resized", {1, 2, 4, 4}, {1, 2, 1, 1}, {}, resize_attrs("nearest", "half_pixel")},
      {"rank 2", {4, 6}, {2, 2}, {}, resize_attrs("linear", "half_pixel")},
  };
  for (const auto& c : cases) {
    for (const auto& passes : pipelines) {
      DYNAMIC_SECTION(c.name << ", passes " << passes) {
        Graph g = resize_graph(c);
        CompiledModel m = check_graph(g, 1e-9, with_passes(passes));
        require_reference(m, "Resize");
      }
    }
  }
}

TEST_CASE("lower ops: DepthToSpace in DCR and CRD modes is one oneDNN reorder from row-major and channels-last sources",
          "[lower][ops]") {
  for (const char* mode : {"DCR", "CRD"})
    for (std::int64_t block : {2, 3}) {
      INFO(mode << " block " << block);
      // From a graph input (row-major), then from a 1x1 Conv the layout pass writes channels-last for it.
      Builder b;
      Value* x = b.input("x", {2, 3 * block * block, 4, 5});
      b.g.add_output(b.op("DepthToSpace", {x}, {{"blocksize", block}, {"mode", std::string(mode)}}));
      Value* conv = b.op("Conv", {x, b.weight({4 * block * block, 3 * block * block, 1, 1})});
      b.g.add_output(b.op("DepthToSpace", {conv}, {{"blocksize", block}, {"mode", std::string(mode)}}));
      for (const auto& passes : pipelines) {
        INFO("passes " << passes);
        Graph g = b.g.clone();
        CompiledModel m = check_graph(g, 1e-6, with_passes(passes));
        auto d2s = impls(m, "DepthToSpace");
        REQUIRE(d2s.size() == 2);
        for (const auto& impl : d2s) CHECK(impl != "reference");
        // The conv writes channels-last, which DepthToSpace reads: the one Reorder is x's, into the conv.
        if (passes == "default") CHECK(impls(m, "Reorder").size() == 1);
      }
    }
}

TEST_CASE("lower ops: a ConvTranspose with kernel == stride runs as a 1x1 Conv and DepthToSpace, within 1e-5",
          "[lower][ops]") {
  // The DBNet head's shape: 2x2 stride 2 with BN and ReLU (folded, then fused), and a last one to 1 channel
  // with a Sigmoid; also 3x3 stride 3 without bias.
  Builder b;
  Value* x = b.input("x", {2, 8, 6, 7});
  Value* y = b.op("ConvTranspose", {x, b.weight({8, 6, 2, 2}), b.weight({6})}, {{"strides", Dims{2, 2}}});
  y = b.op("BatchNormalization", {y, b.floats({1.2f, 0.8f, 1.1f, 0.9f, 1.0f, 1.3f}),
                                  b.floats({0.1f, -0.1f, 0.0f, 0.2f, -0.2f, 0.05f}),
                                  b.floats({0.0f, 0.1f, -0.1f, 0.0f, 0.2f, 0.0f}), b.floats({1, 0.5f, 2, 1, 1.5f, 1})});
  y = b.op("Relu", {y});
  Value* p = b.op("Sigmoid", {b.op("ConvTranspose", {y, b.weight({6, 1, 2, 2}), b.weight({1})}, {{"strides", Dims{2, 2}}})});
  b.g.add_output(p);
  b.g.add_output(b.op("ConvTranspose", {x, b.weight({8, 4, 3, 3})}, {{"strides", Dims{3, 3}}, {"kernel_shape", Dims{3, 3}}}));
  Graph g = b.g.clone();
  CompiledModel m = check_graph(g, 1e-5, with_passes("default"));
  INFO(m.to_text());
  CHECK(impls(m, "ConvTranspose").empty());
  CHECK(impls(m, "DepthToSpace").size() == 3);
  CHECK(impls(m, "Relu").empty());  // a post-op of the first 1x1 Conv
  CHECK(impls(m, "Sigmoid").empty());
  // The first DepthToSpace, read channels-last, writes channels-last for the next 1x1 conv (no reorder between
  // them). Must not fire: the two that write graph outputs write row-major.
  std::size_t to_channels_last = 0;
  for (const runtime::StepInfo& s : m.steps()) {
    if (s.op == "Reorder" && s.name.rfind("reorder:x", 0) != 0)  // (x, the graph input, into the first conv)
      CHECK(s.detail.find("abcd -> acdb") == std::string::npos);
    to_channels_last += s.op == "DepthToSpace" && s.detail.find(" -> acdb") != std::string::npos;
  }
  CHECK(to_channels_last <= 1);  // only the first: the other two write graph outputs
}

TEST_CASE("lower ops: DepthToSpace of a channels-last source writes channels-last for a conv reader (1e-5)",
          "[lower][ops]") {
  // The DBNet head at batch 1 (convolutions channels-last): ConvTranspose 2x2/2 as 1x1 conv + DepthToSpace,
  // ReLU, then the next one; the DepthToSpace between them writes channels-last, the last one row-major.
  Builder b;
  Value* x = b.input("x", {1, 8, 6, 7});
  Value* y = b.op("Relu", {b.op("ConvTranspose", {x, b.weight({8, 6, 2, 2}), b.weight({6})}, {{"strides", Dims{2, 2}}})});
  b.g.add_output(b.op("ConvTranspose", {y, b.weight({6, 2, 2, 2}), b.weight({2})}, {{"strides", Dims{2, 2}}}));
  lower::CompileOptions options = with_passes("default");
  options.conv_layout = lower::ConvLayout::Any;
  CompiledModel m = check_graph(b.g, 1e-5, options);
  INFO(m.to_text());
  std::size_t to_channels_last = 0, reorders_to_channels_last = 0;
  for (const runtime::StepInfo& s : m.steps()) {
    to_channels_last += s.op == "DepthToSpace" && s.detail.find(" -> acdb") != std::string::npos;
    reorders_to_channels_last += s.op == "Reorder" && s.name.rfind("reorder:x", 0) != 0 &&
                                 s.detail.find("abcd -> acdb") != std::string::npos;
  }
  CHECK(impls(m, "DepthToSpace").size() == 2);
  CHECK(reorders_to_channels_last == 0);
  // oneDNN's choice on AVX-512 is channels-last (its brgconv); where it blocks the channels instead (AVX2), the
  // DepthToSpace reads a copy and writes row-major.
  if (lower::effective_isa().avx512) CHECK(to_channels_last == 1);
}

// --- Einsum -----------------------------------------------------------------------------------------

TEST_CASE("lower ops: Einsum in batched-matmul forms is one strided oneDNN matmul (1e-5)", "[lower][einsum]") {
  struct EinsumCase {
    const char* equation;
    Dims a, b;
  };
  const std::vector<EinsumCase> cases = {
      {"bij,bjk->bik", {5, 2, 3}, {5, 3, 4}},
      {"bhqd,bhkd->bhqk", {2, 3, 5, 8}, {2, 3, 7, 8}},   // attention scores: B read transposed
      {"bhqk,bhkd->bqhd", {2, 3, 5, 7}, {2, 3, 7, 8}},   // attention output written transposed
      {"ij,jk->ki", {4, 6}, {6, 3}},
      {"ji,jk", {6, 4}, {6, 3}},                          // implicit output "ik", A read transposed
      {"bi,bi->b", {4, 7}, {4, 7}},                      // batched dot products: no M, no N
      {"i,j->ij", {3}, {5}},
      {"...ij,...jk->...ik", {2, 1, 3, 4}, {1, 3, 4, 2}},  // ellipsis, batch dims broadcast both ways
      {"abc,cd->abd", {2, 3, 4}, {4, 5}},                 // two M labels: a batch B broadcasts
      {"ik,kab->iab", {3, 4}, {4, 2, 5}},                 // two N labels: a batch A broadcasts
      {"bythwc,hkc->bythwk", {1, 2, 3, 4, 5, 6}, {4, 3, 6}},  // MViT-V2's relative positions
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.equation) {
      Builder b;
      b.g.add_output(b.op("Einsum", {b.input("a", c.a), b.input("b", c.b)}, {{"equation", std::string(c.equation)}}));
      CompiledModel m = check_graph(b.g, 1e-5, with_passes("none"));
      require_onednn(m, "Einsum");
    }
  }
}

TEST_CASE("lower ops: Einsum forms that are no matmul run the reference kernel, and stay right (1e-6)", "[lower][einsum]") {
  struct EinsumCase {
    const char* equation;
    std::vector<Dims> inputs;
  };
  const std::vector<EinsumCase> cases = {
      {"bii->bi", {{2, 3, 3}}},                 // a diagonal
      {"ij->i", {{3, 4}}},                      // one operand
      {"ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 2}}},  // three operands
      {"ijk,jl->il", {{2, 3, 4}, {3, 5}}},      // k summed within A alone
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.equation) {
      Builder b;
      std::vector<Value*> in;
      for (std::size_t i = 0; i < c.inputs.size(); ++i) in.push_back(b.input("x" + std::to_string(i), c.inputs[i]));
      b.g.add_output(b.op("Einsum", in, {{"equation", std::string(c.equation)}}));
      CompiledModel m = check_graph(b.g, 1e-6, with_passes("none"));
      require_reference(m, "Einsum");
    }
  }
}

TEST_CASE("lower ops: Split is one strided view per output (exact)", "[lower][views]") {
  // MViT-V2 splits its QKV [1, 2, 3, tokens, 96] on axis 2; parts read by oneDNN steps, graph outputs copied.
  struct SplitCase {
    std::int64_t axis;
    Dims parts;
  };
  for (const SplitCase& c : {SplitCase{2, {1, 2, 3}}, SplitCase{-1, {3, 1}}, SplitCase{0, {1, 1}}}) {
    DYNAMIC_SECTION("axis " << c.axis) {
      Builder b;
      Value* r = b.op("Relu", {b.input("x", {2, 3, 6, 4})});
      Node* split = b.node("Split", {r, b.ints(c.parts)}, {{"axis", c.axis}}, c.parts.size());
      b.g.add_output(split->output(0));  // a graph output: copied out of the view
      for (std::size_t i = 1; i < c.parts.size(); ++i) b.g.add_output(b.op("Sigmoid", {split->output(i)}));
      CompiledModel m = check_graph(b.g, 1e-6, with_passes("none"));  // oneDNN's Sigmoid: the last bits differ
      CHECK(m.implementation_histogram().count("reference") == 0);
      std::size_t views = 0;
      for (const auto& st : m.steps()) views += st.op == "Split" && st.implementation == "view";
      CHECK(views == c.parts.size() - 1);  // part 0, a graph output, is copied out
    }
  }
}

TEST_CASE("lower ops: an int64 Transpose that moves size-1 dims only is a view, a one-output Split an alias",
          "[lower][views]") {
  // torchvision's boolean indexing: NonZero -> Transpose [1, n] -> [n, 1] -> Split(axis 1, [1]) of int64
  // positions; the float [2, 1, 3] -> [1, 2, 3] keeps the order of its non-unit dims too.
  Builder b;
  Value* positions = b.g.add_input("positions", DType::Int64, Shape{1, 6});
  Value* column = b.op("Transpose", {positions}, {{"perm", Dims{1, 0}}});
  Node* split_node = b.node("Split", {column}, {{"axis", std::int64_t{1}}, {"split", Dims{1}}});
  split_node->set_opset(11);  // the sizes as an attribute
  Value* split = split_node->output(0);
  b.g.add_output(split);
  Value* x = b.input("x", {2, 1, 3});
  b.g.add_output(b.op("Transpose", {x}, {{"perm", Dims{1, 0, 2}}}));
  Value* swapped = b.op("Transpose", {b.input("z", {2, 1, 3})}, {{"perm", Dims{2, 1, 0}}});  // a real transpose
  b.g.add_output(swapped);
  infer_shapes(b.g);
  Tensor ids = Tensor::from_vector<std::int64_t>({1, 6}, {9, 4, 7, 0, 3, 8});
  std::map<std::string, Tensor> inputs{{"positions", ids}, {"x", random_tensor({2, 1, 3}, 1)}, {"z", random_tensor({2, 1, 3}, 2)}};
  auto want = ReferenceExecutor(b.g).run(inputs);
  for (const char* pipeline : {"default", "none"}) {
    INFO(pipeline);
    CompiledModel m = lower::compile(b.g, with_passes(pipeline));
    INFO(m.to_text());
    CHECK(m.implementation_histogram().count("reference") == 0);
    auto got = m.run(inputs);
    CHECK(got.at(split->name()).dims() == Dims{6, 1});
    CHECK(got.at(split->name()).to_int64s() == ids.to_int64s());
    for (auto& [name, w] : want) CHECK(relative_error(got.at(name), w) == 0.0);
  }
}

TEST_CASE("lower ops: Pad is Ondine's row copy in every mode (any dtype, crops, axes, the value), exactly",
          "[lower][pad]") {
  struct PadCase {
    const char* name;
    Dims x;
    Dims pads;
    DType dtype = DType::Float32;
    float value = 0.0f;  // constant_value (float32 only)
    Dims axes;           // opset 18
    int opset = 13;
    std::string mode = "constant";
  };
  const DType f32 = DType::Float32;
  const std::vector<PadCase> cases = {
      {"H and W, zeros", {1, 3, 5, 6}, {0, 0, 1, 2, 0, 0, 3, 1}, f32, 0.0f, {}, 13, "constant"},
      {"a value, every axis", {2, 3, 4}, {1, 0, 2, 0, 2, 1}, f32, 1.5f, {}, 13, "constant"},
      {"crop and pad", {2, 4, 7}, {0, -1, 2, 0, -2, -3}, f32, 0.0f, {}, 13, "constant"},
      {"nothing padded (a copy)", {3, 800, 8}, {0, 0, 0, 0, 0, 0}, f32, 0.0f, {}, 13, "constant"},
      {"int64", {4, 5}, {1, 2, 0, 1}, DType::Int64, 0.0f, {}, 13, "constant"},
      {"opset 18 axes", {2, 3, 4, 5}, {1, 2, 0, 3}, f32, 0.0f, {1, -1}, 18, "constant"},
      {"opset 2 attributes", {2, 3, 4}, {0, 1, 1, 0, 2, 0}, f32, 0.25f, {}, 2, "constant"},
      {"reflect (an STFT's centring pad)", {2, 5, 6}, {0, 1, 2, 0, 1, 5}, f32, 0.0f, {}, 13, "reflect"},
      {"reflect, int64, a crop beside it", {3, 4, 7}, {1, -1, 3, 2, 0, 6}, DType::Int64, 0.0f, {}, 13, "reflect"},
      {"edge", {2, 3, 4}, {0, 2, 3, 1, 0, 5}, f32, 0.0f, {}, 13, "edge"},
      {"wrap (opset 19)", {2, 3, 4}, {1, 0, 2, 0, 2, 3}, f32, 0.0f, {}, 19, "wrap"},
      {"edge, one element", {1, 1}, {0, 3, 2, 4}, f32, 0.0f, {}, 13, "edge"},
  };

  for (const PadCase& c : cases) {
    DYNAMIC_SECTION(c.name) {
      Builder b;
      Value* x = b.g.add_input("x", c.dtype, Shape::from(c.x));
      std::vector<Value*> in{x};
      Attrs attrs{{"mode", c.mode}};
      if (c.opset < 11) {
        attrs["pads"] = c.pads;
        attrs["value"] = c.value;
      } else {
        in.push_back(b.ints(c.pads));
        if (c.value != 0.0f) in.push_back(b.scalar(c.value));
        if (!c.axes.empty()) {
          if (in.size() == 2) in.push_back(nullptr);
          in.push_back(b.ints(c.axes));
        }
      }
      Node* pad = b.node("Pad", in, attrs);
      pad->set_opset(c.opset);
      b.g.add_output(pad->output(0));
      infer_shapes(b.g);
      Tensor xv = c.dtype == DType::Int64 ? Tensor(DType::Int64, c.x) : random_tensor(c.x, 3);
      if (c.dtype == DType::Int64)
        for (std::int64_t i = 0; i < xv.numel(); ++i) xv.data<std::int64_t>()[i] = 1000 + i;
      auto want = ReferenceExecutor(b.g).run({{"x", xv}});
      for (const char* pipeline : {"default", "none"}) {
        INFO(pipeline);
        CompiledModel m = lower::compile(b.g, with_passes(pipeline));
        INFO(m.to_text());
        auto got = m.run({{"x", xv}});
        const Tensor& w = want.at(pad->output(0)->name());
        const Tensor& g = got.at(pad->output(0)->name());
        REQUIRE(g.dims() == w.dims());
        REQUIRE(g.nbytes() == w.nbytes());
        CHECK(std::memcmp(g.raw(), w.raw(), w.nbytes()) == 0);
        CHECK(impls(m, "Pad") == std::vector<std::string>{"ondine:copy"});
      }
    }
  }
}

}  // namespace test_lower_ops
