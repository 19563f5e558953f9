// The compiled kernels of DFT and STFT (KissFFT, lower/detail/signal.hpp), GridSample and RoiAlign
// (lower/detail/sampling.hpp), each checked against its reference kernel (reference/signal.hpp and
// sampling.hpp, in double: the oracle) on seeded inputs, with the tolerance stated per test as a fraction of
// the largest reference magnitude; must-not-fire cases (double inputs, sizes only known at run time) run the
// reference kernel; bad ROIs are errors naming the node. A build without KissFFT (no ONDINE_HAVE_KISSFFT)
// checks that DFT and STFT fall back to their reference kernel instead.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ondine/lower/lower.hpp"
#include "ondine/ondine.hpp"
#include "onnx_builders.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_fast_kernels {

using namespace ondine;
using Dims = std::vector<std::int64_t>;
using Attrs = std::map<std::string, Attribute>;

namespace {

Tensor i64(std::int64_t v) { return Tensor::from_vector<std::int64_t>({}, {v}); }

// One node under test: inputs are graph inputs (fed) or constants; one output.
struct OneNode {
  Graph g;
  std::map<std::string, Tensor> feeds;
  std::vector<Value*> ins;
  OneNode(int opset) { g.opsets[""] = opset; }
  OneNode& input(const Tensor& t) {
    const std::string name = "in" + std::to_string(ins.size());
    ins.push_back(g.add_input(name, t.dtype(), t.shape()));
    feeds[name] = t;
    return *this;
  }
  OneNode& constant(const Tensor& t) {
    ins.push_back(g.add_constant("c" + std::to_string(ins.size()), t));
    return *this;
  }
  OneNode& none() {
    ins.push_back(nullptr);
    return *this;
  }
  Graph& node(const std::string& op, Attrs attrs = {}) {
    Node* n = g.add_node(op, ins, {"out"}, std::move(attrs), "under_test");
    g.add_output(n->output(0));
    infer_shapes(g);
    return g;
  }
};

struct Compared {
  double error = 0;  // max |compiled - reference| / max |reference|
  std::string implementation;
  Tensor got, want;
};

// Runs the graph compiled and on the reference executor; the step of op `op` names its implementation.
Compared compare(Graph& g, const std::map<std::string, Tensor>& feeds, const std::string& op,
                 const lower::CompileOptions& options = {}) {
  Compared c;
  c.want = ReferenceExecutor(g).run(feeds).at("out");
  CompiledModel m = lower::compile(g, options);
  c.got = m.run(feeds).at("out");
  for (auto& s : m.steps())
    if (s.op == op) c.implementation = s.implementation;
  INFO(m.to_text());
  REQUIRE(!c.implementation.empty());
  c.error = test::rel_error(c.got, c.want);
  return c;
}

// The largest prime factor of n (a KissFFT stage of radix p sums p terms).
std::int64_t largest_prime_factor(std::int64_t n) {
  std::int64_t p = 1;
  for (std::int64_t f = 2; f * f <= n; ++f)
    while (n % f == 0) n /= f, p = f;
  return std::max(p, n);
}

// The DFT bound: float32's 2^-24 per rounding, times the stages (log2 n) and the largest radix (a generic
// radix-p butterfly sums p products in float), times 2 for the input, twiddle and output roundings. The
// largest error measured over the lengths below is a fifth of it (the test prints the fraction).
double fft_bound(std::int64_t n) {
  return 2 * 0x1p-24 * (std::log2(static_cast<double>(std::max<std::int64_t>(n, 2))) +
                        static_cast<double>(largest_prime_factor(n)));
}

#ifdef ONDINE_KISSFFT
const char* const kFft = "kissfft";
#else
const char* const kFft = "reference";
#endif

// KissFFT, or (an STFT of real frames of a power of two, AVX2 or AVX-512) Ondine's frame-per-lane transform.
bool is_fft(const std::string& impl) {
  return impl.rfind(kFft, 0) == 0 || (impl.rfind("ondine:", 0) == 0 && impl.size() > 4 && impl.substr(impl.size() - 4) == ":fft");
}

}  // namespace

// --- DFT, STFT --------------------------------------------------------------------------------------------

TEST_CASE("DFT compiled: lengths, real and complex, onesided, inverse, against the double DFT", "[fast-kernels][dft]") {
  double worst = 0;  // the largest error as a fraction of its bound
  for (std::int64_t n : {1, 2, 3, 4, 7, 8, 12, 15, 64, 97, 100, 256, 1000}) {
    for (std::int64_t channels : {1, 2}) {
      for (int variant = 0; variant < 3; ++variant) {  // forward, onesided, inverse
        const bool onesided = variant == 1, inverse = variant == 2;
        if (onesided && channels == 2) continue;
        // The inverse divides by n: a wider input keeps its output well above rel_error's floor.
        const float range = inverse ? 2.0f * std::sqrt(static_cast<float>(n)) : 1.0f;
        Tensor x = test::uniform_tensor({3, n, channels}, static_cast<unsigned>(n * 10 + channels), -range, range);
        OneNode b(17);
        Graph& g = b.input(x).node("DFT", {{"onesided", Attribute(std::int64_t{onesided})},
                                           {"inverse", Attribute(std::int64_t{inverse})}});
        INFO("n " << n << " channels " << channels << (onesided ? " onesided" : "") << (inverse ? " inverse" : ""));
        if (n == 1 && channels == 1) continue;  // a single real point: the output is x itself (nothing to check)
        Compared c = compare(g, b.feeds, "DFT");
        CHECK(is_fft(c.implementation));
        CHECK(c.error <= fft_bound(n));
        worst = std::max(worst, c.error / fft_bound(n));
      }
    }
  }
  WARN("DFT: largest error " << worst << " of its bound");
}

TEST_CASE("DFT compiled: axis, dft_length (pad, truncate) and opset 20's inputs", "[fast-kernels][dft]") {
  Tensor x = test::uniform_tensor({2, 6, 9, 1}, 7);
  Tensor xc = test::uniform_tensor({2, 6, 9, 2}, 8);
  struct Case {
    int opset;
    std::int64_t axis, length;  // length 0: none
    bool complex, onesided;
  };
  for (const Case& k : std::vector<Case>{{17, 1, 0, false, false},
                                         {17, 2, 0, false, true},
                                         {17, 2, 16, false, true},  // zero-padded to 16
                                         {17, 1, 4, true, false},   // truncated to 4
                                         {17, -2, 11, true, false},
                                         {20, 1, 0, true, false},
                                         {20, -2, 5, false, true},
                                         {20, 0, 3, false, false}}) {
    INFO("opset " << k.opset << " axis " << k.axis << " length " << k.length << (k.complex ? " complex" : "")
                  << (k.onesided ? " onesided" : ""));
    OneNode b(k.opset);
    b.input(k.complex ? xc : x);
    Attrs attrs{{"onesided", Attribute(std::int64_t{k.onesided})}};
    if (k.length) b.constant(i64(k.length));
    else if (k.opset >= 20) b.none();
    if (k.opset >= 20) b.constant(i64(k.axis));
    else attrs["axis"] = Attribute(k.axis);
    Graph& g = b.node("DFT", attrs);
    Compared c = compare(g, b.feeds, "DFT");
    CHECK(is_fft(c.implementation));
    CHECK(c.error <= fft_bound(16));
  }
}

TEST_CASE("STFT compiled: windows, hops, odd frames, complex signals", "[fast-kernels][stft]") {
  struct Case {
    std::int64_t length, frame, step, channels;
    bool window, onesided;
  };
  for (const Case& k : std::vector<Case>{{1000, 64, 16, 1, true, true},
                                         {20000, 1024, 320, 1, true, true},  // an audio front end's frames
                                         {300, 8, 3, 1, false, true},
                                         {1000, 64, 16, 1, false, true},
                                         {999, 63, 20, 1, true, true},   // odd frame: the complex path
                                         {500, 50, 7, 1, true, false},  // full spectrum of a real signal
                                         {400, 32, 32, 2, true, false},
                                         {256, 256, 1, 1, false, true}}) {
    INFO("length " << k.length << " frame " << k.frame << " step " << k.step << " channels " << k.channels
                   << (k.window ? " window" : "") << (k.onesided ? " onesided" : ""));
    Tensor signal = test::uniform_tensor({2, k.length, k.channels}, static_cast<unsigned>(k.frame));
    OneNode b(17);
    b.input(signal).constant(i64(k.step));
    if (k.window) {
      Tensor w(DType::Float32, {k.frame});  // a Hann window, fed at run time
      for (std::int64_t i = 0; i < k.frame; ++i)
        w.data<float>()[i] = static_cast<float>(0.5 - 0.5 * std::cos(2 * M_PI * static_cast<double>(i) / static_cast<double>(k.frame)));
      b.input(w).none();
    } else {
      b.none().constant(i64(k.frame));
    }
    Graph& g = b.node("STFT", {{"onesided", Attribute(std::int64_t{k.onesided})}});
    Compared c = compare(g, b.feeds, "STFT");
    CHECK(is_fft(c.implementation));
    CHECK(c.error <= fft_bound(k.frame));
#ifdef ONDINE_KISSFFT
    // Real frames of a power of two into onesided bins: a frame per SIMD lane where the CPU has AVX2.
    const bool frames = k.channels == 1 && k.onesided && (k.frame & (k.frame - 1)) == 0;
    const lower::IsaInfo isa = lower::effective_isa();
    const bool simd = isa.avx512 || lower::isa_runs_on(lower::CpuIsa::Avx2, isa.isa);
    CHECK((c.implementation.size() > 4 && c.implementation.substr(c.implementation.size() - 4) == ":fft") ==
          (frames && simd));
#endif
  }
}

TEST_CASE("DFT and STFT on KissFFT must not fire: double inputs, forced reference", "[fast-kernels][dft]") {
  Tensor x(DType::Float64, {2, 16, 1});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = std::sin(0.3 * static_cast<double>(i)) + 0.1;
  OneNode b(17);
  Graph& g = b.input(x).node("DFT");
  CompiledModel m = lower::compile(g);
  for (auto& s : m.steps())
    if (s.op == "DFT") CHECK(s.implementation == "reference");
  Tensor want = ReferenceExecutor(g).run(b.feeds).at("out"), got = m.run(b.feeds).at("out");
  for (std::int64_t i = 0; i < want.numel(); ++i) CHECK(got.data<double>()[i] == want.data<double>()[i]);

  // CompileOptions::reference_ops keeps a float DFT on the oracle (the timing note's baseline).
  OneNode f(17);
  Graph& gf = f.input(test::uniform_tensor({1, 32, 1}, 3)).node("DFT");
  lower::CompileOptions o;
  o.reference_ops.insert("DFT");
  CHECK(compare(gf, f.feeds, "DFT", o).implementation == "reference");
}

// --- GridSample -------------------------------------------------------------------------------------------

namespace {

// A grid of N(0, 0.7) values, so some lie outside [-1, 1], with the exact edges -1, 0, 1 planted.
Tensor grid_values(const Dims& dims, unsigned seed) {
  std::mt19937 rng(seed);
  Tensor t = test::random_tensor(dims, rng, 0.7f);
  float* p = t.data<float>();
  const float edges[] = {-1.0f, 1.0f, 0.0f, -1.0f, 1.0f, 1.0f, -1.0f, -1.0f, 1.0f, 0.5f};
  for (std::size_t i = 0; i < std::size(edges) && static_cast<std::int64_t>(i) < t.numel(); ++i) p[i] = edges[i];
  return t;
}

}  // namespace

TEST_CASE("GridSample compiled: modes, paddings, align_corners, out-of-range grids", "[fast-kernels][gridsample]") {
  Tensor x = test::uniform_tensor({2, 3, 5, 7}, 11);
  Tensor grid = grid_values({2, 4, 37, 2}, 12);  // 37 points a row: the vector loop and its scalar tail
  for (int opset : {16, 20})
    for (int mode = 0; mode < 3; ++mode)
      for (const char* padding : {"zeros", "border", "reflection"})
        for (std::int64_t align : {0, 1}) {
          const char* names16[] = {"bilinear", "nearest", "bicubic"};
          const char* names20[] = {"linear", "nearest", "cubic"};
          const std::string m = opset == 16 ? names16[mode] : names20[mode];
          INFO("opset " << opset << " mode " << m << " padding " << padding << " align_corners " << align);
          OneNode b(opset);
          Graph& g = b.input(x).input(grid).node(
              "GridSample", {{"mode", Attribute(m)}, {"padding_mode", Attribute(std::string(padding))},
                             {"align_corners", Attribute(align)}});
          Compared c = compare(g, b.feeds, "GridSample");
          CHECK(c.implementation.rfind("ondine:", 0) == 0);
          // Nearest reads one pixel from the same double coordinate: exact. Linear and cubic sum 4 or 16
          // float products (weights rounded to float): within a few float roundings of the largest value.
          CHECK(c.error <= (mode == 1 ? 0.0 : 1e-6));
          for (std::int64_t i = 0; i < c.got.numel(); ++i) REQUIRE(std::isfinite(c.got.data<float>()[i]));
        }
}

TEST_CASE("GridSample compiled: NaN and huge grid values, one row, declines", "[fast-kernels][gridsample]") {
  Tensor x = test::uniform_tensor({1, 2, 4, 4}, 21);
  Tensor grid = grid_values({1, 1, 20, 2}, 22);
  float* p = grid.data<float>();
  p[12] = std::numeric_limits<float>::quiet_NaN();  // point 6's x
  p[20] = 1e30f;                                     // point 10's x: far outside
  p[23] = -1e30f;                                    // point 11's y
  for (const char* padding : {"zeros", "border", "reflection"}) {
    INFO("padding " << padding);
    OneNode b(16);
    Graph& g = b.input(x).input(grid).node("GridSample", {{"padding_mode", Attribute(std::string(padding))}});
    CompiledModel m = lower::compile(g);
    Tensor got = m.run(b.feeds).at("out");
    for (std::int64_t c = 0; c < 2; ++c) {
      CHECK(std::isnan(got.data<float>()[c * 20 + 6]));  // a NaN coordinate gives NaN, as on the reference
      CHECK(std::isfinite(got.data<float>()[c * 20 + 10]));
      CHECK(std::isfinite(got.data<float>()[c * 20 + 11]));
    }
    if (std::string(padding) == "zeros") CHECK(got.data<float>()[10] == 0.0f);
  }
  // Must not fire: a double image, and opset 20's 3-D (1 spatial axis) form, run the reference kernel.
  Tensor xd(DType::Float64, {1, 1, 3, 3});
  for (std::int64_t i = 0; i < 9; ++i) xd.data<double>()[i] = static_cast<double>(i);
  OneNode bd(16);
  Graph& gd = bd.input(xd).input(test::uniform_tensor({1, 2, 2, 2}, 3)).node("GridSample");
  CHECK(compare(gd, bd.feeds, "GridSample").implementation == "reference");
  OneNode b3(20);
  Graph& g3 = b3.input(test::uniform_tensor({1, 2, 6}, 4)).input(test::uniform_tensor({1, 5, 1}, 5)).node("GridSample");
  CHECK(compare(g3, b3.feeds, "GridSample").implementation == "reference");
}

// --- RoiAlign ---------------------------------------------------------------------------------------------

namespace {

// R boxes (x1, y1, x2, y2) over a W x H image at scale 1 / spatial_scale, some partly outside it.
Tensor boxes(std::int64_t R, double W, double H, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-0.2, 1.1);
  Tensor t(DType::Float32, {R, 4});
  for (std::int64_t r = 0; r < R; ++r) {
    double x1 = u(rng) * W, y1 = u(rng) * H, x2 = u(rng) * W, y2 = u(rng) * H;
    float* b = t.data<float>() + r * 4;
    b[0] = static_cast<float>(std::min(x1, x2));
    b[1] = static_cast<float>(std::min(y1, y2));
    b[2] = static_cast<float>(std::max(x1, x2));
    b[3] = static_cast<float>(std::max(y1, y2));
  }
  return t;
}

}  // namespace

TEST_CASE("RoiAlign compiled: avg and max, both coordinate modes, adaptive and fixed sampling",
          "[fast-kernels][roialign]") {
  Tensor x = test::uniform_tensor({2, 5, 12, 15}, 31);
  const float scale = 0.5f;  // boxes in a 30 x 24 frame
  Tensor rois = boxes(7, 30, 24, 32);
  Tensor batch = Tensor::from_vector<std::int64_t>({7}, {0, 1, 1, 0, 1, 0, 0});
  for (const char* mode : {"avg", "max"})
    for (const char* ct : {"half_pixel", "output_half_pixel"})
      for (std::int64_t ratio : {0, 2, 3}) {
        INFO("mode " << mode << " " << ct << " sampling_ratio " << ratio);
        OneNode b(16);
        Graph& g = b.input(x).input(rois).input(batch).node(
            "RoiAlign", {{"mode", Attribute(std::string(mode))},
                         {"coordinate_transformation_mode", Attribute(std::string(ct))},
                         {"sampling_ratio", Attribute(ratio)},
                         {"output_height", Attribute(std::int64_t{3})},
                         {"output_width", Attribute(std::int64_t{4})},
                         {"spatial_scale", Attribute(scale)}});
        Compared c = compare(g, b.feeds, "RoiAlign");
        CHECK(c.implementation == "ondine:c++");  // few ROIs on a row-major input: the plane kernels
        // Float sums of float products: each within a few roundings of the bin's largest input.
        CHECK(c.error <= 1e-6);
      }
}

TEST_CASE("RoiAlign compiled: bad ROIs are errors naming the node; double stays reference", "[fast-kernels][roialign]") {
  Tensor x = test::uniform_tensor({1, 2, 8, 8}, 41);
  auto run = [&](Tensor rois, Tensor batch) {
    OneNode b(16);
    Graph& g = b.input(x).input(rois).input(batch).node("RoiAlign");
    return lower::compile(g).run(b.feeds);
  };
  Tensor ok = Tensor::from_vector<float>({1, 4}, {0, 0, 4, 4});
  auto bad_batch = test::error_of([&] { run(ok, Tensor::from_vector<std::int64_t>({1}, {3})); });
  CHECK(bad_batch.find("under_test") != std::string::npos);
  CHECK(bad_batch.find("outside [0, 1)") != std::string::npos);
  Tensor huge = Tensor::from_vector<float>({1, 4}, {0, 0, 1e30f, 4});
  auto huge_roi = test::error_of([&] { run(huge, Tensor::from_vector<std::int64_t>({1}, {0})); });
  CHECK(huge_roi.find("under_test") != std::string::npos);
  CHECK(huge_roi.find("65536") != std::string::npos);

  // A NaN box with a fixed sampling grid: its samples are NaN in both engines (mode avg and max).
  for (const char* mode : {"avg", "max"}) {
    OneNode e(16);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    Graph& g = e.input(x).input(Tensor::from_vector<float>({2, 4}, {0, 0, 4, 4, nan, 1, 3, 3}))
                   .input(Tensor::from_vector<std::int64_t>({2}, {0, 0}))
                   .node("RoiAlign", {{"mode", Attribute(std::string(mode))}, {"sampling_ratio", Attribute(std::int64_t{2})},
                                      {"output_height", Attribute(std::int64_t{2})},
                                      {"output_width", Attribute(std::int64_t{2})}});
    for (const Tensor& got : {ReferenceExecutor(g).run(e.feeds).at("out"), lower::compile(g).run(e.feeds).at("out")}) {
      REQUIRE(got.shape() == Shape{2, 2, 2, 2});
      for (std::int64_t i = 0; i < 8; ++i) CHECK(std::isfinite(got.data<float>()[i]));
      for (std::int64_t i = 8; i < 16; ++i) CHECK(std::isnan(got.data<float>()[i]));
    }
  }

  // An empty image: every sample is outside it, so zeros (the reference kernel, in both engines).
  for (const char* mode : {"avg", "max"}) {
    OneNode e(16);
    Graph& g = e.input(Tensor(DType::Float32, {1, 2, 0, 8})).input(ok).input(Tensor::from_vector<std::int64_t>({1}, {0}))
                   .node("RoiAlign", {{"mode", Attribute(std::string(mode))}});
    for (const Tensor& got : {ReferenceExecutor(g).run(e.feeds).at("out"), lower::compile(g).run(e.feeds).at("out")}) {
      REQUIRE(got.shape() == Shape{1, 2, 1, 1});
      for (std::int64_t i = 0; i < got.numel(); ++i) CHECK(got.data<float>()[i] == 0.0f);
    }
  }

  Tensor xd(DType::Float64, {1, 1, 4, 4}), rd(DType::Float64, {1, 4});
  for (std::int64_t i = 0; i < 16; ++i) xd.data<double>()[i] = static_cast<double>(i);
  for (std::int64_t i = 0; i < 4; ++i) rd.data<double>()[i] = static_cast<double>(i);
  OneNode b(16);
  Graph& g = b.input(xd).input(rd).input(Tensor::from_vector<std::int64_t>({1}, {0})).node("RoiAlign");
  CHECK(compare(g, b.feeds, "RoiAlign").implementation == "reference");
}

namespace {

// The channel-vector kernel of this machine's ISA (as lower_roi_align picks it), or "ondine:c++".
std::string roi_vector_kernel() {
  const lower::IsaInfo isa = lower::effective_isa();
  if (isa.avx512) return "ondine:avx512";
  if (lower::isa_runs_on(lower::CpuIsa::Avx2, isa.isa)) return "ondine:avx2";
  return "ondine:c++";
}

}  // namespace

TEST_CASE("RoiAlign compiled: the channel-vector kernel on a reordered input, partial channel blocks",
          "[fast-kernels][roialign]") {
  // Many ROIs over a small map: the samples outnumber the pixels, so X is reordered to the blocked layout
  // and read 16 (8 on AVX2) channels a vector. C = 21: the last block is partly padding.
  for (std::int64_t C : {21, 32}) {
    Tensor x = test::uniform_tensor({2, C, 9, 11}, 51);
    Tensor rois = boxes(40, 44, 36, 52);
    std::vector<std::int64_t> which(40);
    for (std::size_t i = 0; i < which.size(); ++i) which[i] = static_cast<std::int64_t>(i % 2);
    Tensor batch = Tensor::from_vector<std::int64_t>({40}, which);
    for (const char* mode : {"avg", "max"})
      for (std::int64_t ratio : {0, 2}) {
        INFO("C " << C << " mode " << mode << " sampling_ratio " << ratio);
        OneNode b(16);
        Graph& g = b.input(x).input(rois).input(batch).node(
            "RoiAlign", {{"mode", Attribute(std::string(mode))},
                         {"sampling_ratio", Attribute(ratio)},
                         {"output_height", Attribute(std::int64_t{5})},
                         {"output_width", Attribute(std::int64_t{3})},
                         {"spatial_scale", Attribute(0.25f)}});
        Compared c = compare(g, b.feeds, "RoiAlign");
        CHECK(c.implementation == roi_vector_kernel());
        CHECK(c.error <= 1e-6);
      }
  }
}

TEST_CASE("RoiAlign compiled: reads a convolution's output in its own layout", "[fast-kernels][roialign]") {
  // A detector's shape: a convolution's feature map straight into RoiAlign, no reorder of the map. oneDNN
  // writes 24 channels channels-last here (the last vector masked), 32 blocked.
  for (std::int64_t C : {24, 32}) {
    for (const char* mode : {"avg", "max"}) {
      INFO("C " << C << " mode " << mode);
      Graph g;
      g.opsets[""] = 16;
      Value* image = g.add_input("image", DType::Float32, Shape{1, 3, 24, 24});
      Value* w = g.add_constant("w", test::uniform_tensor({C, 3, 3, 3}, 61, -0.3f, 0.3f));
      Value* rois = g.add_input("rois", DType::Float32, Shape{12, 4});
      Value* batch = g.add_constant("batch", Tensor::from_vector<std::int64_t>({12}, std::vector<std::int64_t>(12, 0)));
      Node* conv = g.add_node("Conv", {image, w}, {"features"},
                              {{"pads", Attribute(std::vector<std::int64_t>{1, 1, 1, 1})}}, "conv");
      Node* roi = g.add_node("RoiAlign", {conv->output(0), rois, batch}, {"out"},
                             {{"mode", Attribute(std::string(mode))},
                              {"output_height", Attribute(std::int64_t{4})},
                              {"output_width", Attribute(std::int64_t{4})},
                              {"spatial_scale", Attribute(0.5f)}},
                             "under_test");
      g.add_output(roi->output(0));
      infer_shapes(g);
      std::map<std::string, Tensor> feeds{{"image", test::uniform_tensor({1, 3, 24, 24}, 62)},
                                          {"rois", boxes(12, 48, 48, 63)}};
      Compared c = compare(g, feeds, "RoiAlign");
      CHECK(c.error <= 1e-6);
      if (roi_vector_kernel() != "ondine:c++") {
        CHECK(c.implementation == roi_vector_kernel());
        CompiledModel m = lower::compile(g);
        INFO(m.to_text());
        for (auto& s : m.steps()) CHECK(s.name.find("features") == std::string::npos);  // no reorder of it
      }
    }
  }
}

TEST_CASE("RoiAlign channel layouts: which layouts the vector kernel reads", "[fast-kernels][roialign]") {
  using lower::detail::channel_layout;
  using tag = dnnl::memory::format_tag;
  const dnnl::memory::dims d{2, 32, 5, 7};
  auto md = [&](tag t) { return dnnl::memory::desc(d, dnnl::memory::data_type::f32, t); };
  auto blocked16 = channel_layout(md(tag::aBcd16b), 32, 16);
  CHECK(blocked16.B == 16);
  CHECK(blocked16.sCB == 5 * 7 * 16);
  CHECK(blocked16.sH == 7 * 16);
  CHECK(blocked16.sW == 16);
  CHECK(blocked16.sN == 32 * 5 * 7);
  auto last = channel_layout(md(tag::acdb), 32, 16);
  CHECK(last.B == 16);
  CHECK(last.sCB == 16);
  CHECK(last.sW == 32);
  // Channels-last with a partial last vector is read masked. Must not fire: row-major, a block that is not
  // the vector's, int8.
  CHECK(channel_layout(md(tag::abcd), 32, 16).B == 0);
  CHECK(channel_layout(md(tag::aBcd8b), 32, 16).B == 0);
  CHECK(channel_layout(dnnl::memory::desc({2, 20, 5, 7}, dnnl::memory::data_type::f32, tag::acdb), 20, 16).B == 16);
  CHECK(channel_layout(dnnl::memory::desc(d, dnnl::memory::data_type::s8, tag::aBcd16b), 32, 16).B == 0);
}

// --- Timing (hidden: ./tests "[.timing]") -------------------------------------------------------------------

namespace {

// Median ms of `runs` runs of m on feeds.
double time_ms(CompiledModel& m, const std::map<std::string, Tensor>& feeds, int runs = 7) {
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    auto start = std::chrono::steady_clock::now();
    m.run(feeds);
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void time_both(Graph& g, const std::map<std::string, Tensor>& feeds, const std::string& op, const std::string& what) {
  lower::CompileOptions fast, ref;
  fast.threads = ref.threads = 1;
  ref.reference_ops.insert(op);
  CompiledModel a = lower::compile(g, fast), b = lower::compile(g, ref);
  const double ta = time_ms(a, feeds), tb = time_ms(b, feeds);
  std::string implementation;
  for (auto& s : a.steps())
    if (s.op == op) implementation = s.implementation;
  WARN(what << ": reference " << tb << " ms, compiled " << ta << " ms (" << tb / ta << "x), 1 thread, "
            << implementation);
}

}  // namespace

TEST_CASE("fast kernels: timing against the reference kernels", "[.timing]") {
  {  // STFT of 1 s of 16 kHz audio, n_fft 512, hop 160, Hann window
    OneNode b(17);
    Tensor w(DType::Float32, {512});
    for (int i = 0; i < 512; ++i) w.data<float>()[i] = static_cast<float>(0.5 - 0.5 * std::cos(2 * M_PI * i / 512.0));
    Graph& g = b.input(test::uniform_tensor({1, 16000, 1}, 1)).constant(i64(160)).input(w).node("STFT");
    time_both(g, b.feeds, "STFT", "STFT 1x16000 n_fft 512 hop 160");
  }
  {  // GridSample bilinear, a 64-channel 64x64 feature map to a 64x64 grid (a flow warp)
    OneNode b(16);
    Graph& g = b.input(test::uniform_tensor({1, 64, 64, 64}, 2)).input(grid_values({1, 64, 64, 2}, 3)).node(
        "GridSample", {{"align_corners", Attribute(std::int64_t{1})}});
    time_both(g, b.feeds, "GridSample", "GridSample bilinear 1x64x64x64, grid 64x64");
  }
  {  // RoiAlign as a detector's box head: 256 channels of 50x50, 100 rois, 7x7 bins, sampling_ratio 2
    OneNode b(16);
    std::vector<std::int64_t> zeros(100, 0);
    Graph& g = b.input(test::uniform_tensor({1, 256, 50, 50}, 4))
                   .input(boxes(100, 800, 800, 5))
                   .input(Tensor::from_vector<std::int64_t>({100}, zeros))
                   .node("RoiAlign", {{"output_height", Attribute(std::int64_t{7})},
                                      {"output_width", Attribute(std::int64_t{7})},
                                      {"sampling_ratio", Attribute(std::int64_t{2})},
                                      {"spatial_scale", Attribute(1.0f / 16)}});
    time_both(g, b.feeds, "RoiAlign", "RoiAlign 1x256x50x50, 100 rois, 7x7, ratio 2");
  }
}

}  // namespace test_fast_kernels
