// Calibration: running a float model on samples and choosing quantization parameters.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <list>
#include <random>

#include "ondine/quant/calibration.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_quant_calibration {

using namespace ondine;
using namespace ondine::quant;
namespace fs = std::filesystem;

namespace {

using test::error_of;
using test::random_tensor;

// x: float32[batch, 2, 5, 5] -> Conv(3x3, pad 1, 3 channels) "c" -> Relu "r" -> GlobalAveragePool "g".
struct ConvModel {
  Graph g;
  Tensor w, b;
  ConvModel() {
    std::mt19937 rng(11);
    w = random_tensor({3, 2, 3, 3}, rng, 0.5f);
    b = Tensor::from_vector<float>({3}, {0.1f, -0.2f, 0.3f});
    Value* x = g.add_input("x", DType::Float32, Shape{Dim::named("batch"), 2, 5, 5});
    Value* c = g.add_node("Conv", {x, g.add_constant("W", w), g.add_constant("B", b)}, {"c"},
                          {{"pads", std::vector<std::int64_t>{1, 1, 1, 1}}, {"kernel_shape", std::vector<std::int64_t>{3, 3}}},
                          "conv")->output(0);
    Value* r = g.add_node("Relu", {c}, {"r"}, {}, "relu")->output(0);
    g.add_output(g.add_node("GlobalAveragePool", {r}, {"g"}, {}, "gap")->output(0));
    infer_shapes(g);
  }

  // The values of x, c, r and g for one input, computed here with plain loops.
  std::map<std::string, std::vector<float>> compute(const Tensor& x) const {
    std::int64_t n = x.dims()[0];
    std::vector<float> c(static_cast<std::size_t>(n * 3 * 25)), r(c.size()), gap(static_cast<std::size_t>(n * 3));
    const float* xp = x.data<float>();
    const float* wp = w.data<float>();
    for (std::int64_t s = 0; s < n; ++s)
      for (int m = 0; m < 3; ++m)
        for (int i = 0; i < 5; ++i)
          for (int j = 0; j < 5; ++j) {
            double acc = b.data<float>()[m];
            for (int ci = 0; ci < 2; ++ci)
              for (int ki = 0; ki < 3; ++ki)
                for (int kj = 0; kj < 3; ++kj) {
                  int yi = i + ki - 1, yj = j + kj - 1;
                  if (yi < 0 || yi >= 5 || yj < 0 || yj >= 5) continue;
                  acc += static_cast<double>(xp[((s * 2 + ci) * 5 + yi) * 5 + yj]) * wp[((m * 2 + ci) * 3 + ki) * 3 + kj];
                }
            std::size_t o = static_cast<std::size_t>(((s * 3 + m) * 5 + i) * 5 + j);
            c[o] = static_cast<float>(acc);
            r[o] = std::max(0.0f, c[o]);
            gap[static_cast<std::size_t>(s * 3 + m)] += r[o] / 25.0f;
          }
    return {{"x", std::vector<float>(xp, xp + x.numel())}, {"c", c}, {"r", r}, {"g", gap}};
  }
};

std::vector<Sample> samples(std::size_t count, std::uint32_t seed = 5) {
  std::mt19937 rng(seed);
  std::vector<Sample> out;
  for (std::size_t i = 0; i < count; ++i) out.push_back({{"x", random_tensor({1 + static_cast<std::int64_t>(i % 2), 2, 5, 5}, rng)}});
  return out;
}

void check_same(const CalibrationResult& a, const CalibrationResult& b) {
  CHECK(a.samples == b.samples);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (auto& [name, t] : a.tensors) {
    INFO(name);
    REQUIRE(b.contains(name));
    const auto& u = b.at(name);
    CHECK(t.is_weight == u.is_weight);
    CHECK(t.observed_min == u.observed_min);
    CHECK(t.observed_max == u.observed_max);
    CHECK(t.range.min == u.range.min);
    CHECK(t.range.max == u.range.max);
    CHECK(t.params.scale == u.params.scale);
    CHECK(t.params.zero_point == u.params.zero_point);
    CHECK(t.params.axis == u.params.axis);
    CHECK(t.params.dtype == u.params.dtype);
    CHECK(t.params.symmetric == u.params.symmetric);
  }
}
}  // namespace

TEST_CASE("calibration ranges equal the true min/max of every value", "[quant][calibration]") {
  ConvModel m;
  auto set = samples(4);
  auto result = calibrate(m.g, set);
  CHECK(result.samples == 4);

  // The truth, from plain loops over the same samples.
  std::map<std::string, std::pair<float, float>> truth;
  for (auto& s : set)
    for (auto& [name, v] : m.compute(s.at("x"))) {
      auto [mn, mx] = std::minmax_element(v.begin(), v.end());
      auto it = truth.find(name);
      if (it == truth.end()) truth[name] = {*mn, *mx};
      else it->second = {std::min(it->second.first, *mn), std::max(it->second.second, *mx)};
    }
  for (auto& [name, mm] : truth) {
    INFO(name);
    REQUIRE(result.contains(name));
    const auto& t = result.at(name);
    CHECK(!t.is_weight);
    CHECK(t.observed_min == Approx(mm.first).margin(1e-5));
    CHECK(t.observed_max == Approx(mm.second).margin(1e-5));
    CHECK(t.range.min == std::vector<float>{t.observed_min});
    CHECK(t.range.max == std::vector<float>{t.observed_max});
    // Default activations: uint8 asymmetric, per tensor.
    auto expect = compute_params(t.observed_min, t.observed_max, QuantScheme{DType::UInt8, false, false});
    CHECK(t.params.dtype == DType::UInt8);
    CHECK(!t.params.per_channel());
    CHECK(t.params.scale == expect.scale);
    CHECK(t.params.zero_point == expect.zero_point);
  }
  CHECK(result.at("r").observed_min == 0.0f);  // after Relu
  CHECK(result.at("r").params.zero_point[0] == 0);

  // The conv weight: int8 symmetric per output channel; the bias is not a weight to quantize.
  REQUIRE(result.contains("W"));
  CHECK(!result.contains("B"));
  const auto& w = result.at("W");
  CHECK(w.is_weight);
  REQUIRE(w.params.axis == std::optional<std::int64_t>(0));
  REQUIRE(w.params.scale.size() == 3);
  for (int c = 0; c < 3; ++c) {
    float amax = 0.0f;
    for (int i = 0; i < 18; ++i) amax = std::max(amax, std::fabs(m.w.data<float>()[c * 18 + i]));
    CHECK(w.params.scale[c] == static_cast<float>(static_cast<double>(amax) / 127.0));
    CHECK(w.params.zero_point[c] == 0);
    CHECK(w.params.dtype == DType::Int8);
  }
  CHECK(result.tensors.size() == 5);  // x, c, r, g, W
}

TEST_CASE("calibration accepts a callback, an iterator range and a container alike", "[quant][calibration]") {
  ConvModel m;
  auto set = samples(3);
  auto from_vector = calibrate(m.g, set);
  std::size_t i = 0;
  auto from_callback = calibrate(m.g, [&]() -> std::optional<Sample> {
    if (i == set.size()) return std::nullopt;
    return set[i++];
  });
  std::list<Sample> as_list(set.begin(), set.end());
  auto from_range = calibrate(m.g, as_list.begin(), as_list.end());
  check_same(from_vector, from_callback);
  check_same(from_vector, from_range);
  // One sample at a time.
  Calibrator cal(m.g);
  for (auto& s : set) cal.add_sample(s);
  check_same(from_vector, cal.result());
  CHECK(cal.observed_activations() == std::vector<std::string>{"x", "c", "r", "g"});
}

TEST_CASE("calibration text round-trips exactly", "[quant][calibration]") {
  ConvModel m;
  auto result = calibrate(m.g, samples(2));
  std::string text = result.to_text();
  CHECK(text.rfind("ondine-calibration 1\nsamples\t2\n", 0) == 0);
  CHECK(text.find("value\tW\tkind=weight\tdtype=int8\tsymmetric=1\taxis=0\t") != std::string::npos);
  CHECK(text.find("value\tr\tkind=activation\tdtype=uint8\tsymmetric=0\taxis=-\tmin=0\t") != std::string::npos);
  check_same(result, CalibrationResult::from_text(text));
  // Names with tabs and backslashes survive.
  CalibrationResult odd;
  odd.samples = 1;
  odd.tensors["a\tb\\c\nd"] = result.at("c");
  CHECK(CalibrationResult::from_text(odd.to_text()).contains("a\tb\\c\nd"));
  CHECK(error_of([] { CalibrationResult::from_text("hello"); }).find("not an ondine calibration text") != std::string::npos);
  std::string broken = text;
  broken.replace(broken.find("scale="), 6, "scale=0,");
  CHECK(!error_of([&] { CalibrationResult::from_text(broken); }).empty());
  CHECK(error_of([&] { result.at("nope"); }).find("no calibration for value 'nope'") != std::string::npos);
}

TEST_CASE("calibration options: sample limit, progress, filter, histogram methods", "[quant][calibration]") {
  ConvModel m;
  auto set = samples(5);

  SECTION("the sample limit stops drawing from the source") {
    std::size_t calls = 0;
    CalibrationOptions opts;
    opts.max_samples = 2;
    auto r = calibrate(m.g, [&]() -> std::optional<Sample> { return set[calls++]; }, opts);
    CHECK(r.samples == 2);
    CHECK(calls == 2);
    check_same(r, calibrate(m.g, std::vector<Sample>(set.begin(), set.begin() + 2)));
  }
  SECTION("progress reports each sample, with the total when known") {
    std::vector<std::pair<std::size_t, std::optional<std::size_t>>> calls;
    CalibrationOptions opts;
    opts.progress = [&](std::size_t done, std::optional<std::size_t> total) { calls.emplace_back(done, total); };
    calibrate(m.g, set, opts);
    REQUIRE(calls.size() == 5);
    for (std::size_t i = 0; i < 5; ++i) {
      CHECK(calls[i].first == i + 1);
      CHECK(calls[i].second == std::optional<std::size_t>(5));
    }
    calls.clear();
    opts.max_samples = 3;
    calibrate(m.g, set, opts);
    REQUIRE(calls.size() == 3);
    CHECK(calls.back() == std::make_pair(std::size_t{3}, std::optional<std::size_t>(3)));
    calls.clear();
    std::size_t i = 0;
    opts.max_samples = 0;
    calibrate(m.g, [&]() -> std::optional<Sample> { return i < 2 ? std::optional<Sample>(set[i++]) : std::nullopt; }, opts);
    REQUIRE(calls.size() == 2);
    CHECK(!calls[1].second);  // a callback's length is unknown
  }
  SECTION("the filter selects values") {
    CalibrationOptions opts;
    opts.filter = [](const Value& v) { return v.name() == "c" || v.name() == "W"; };
    auto r = calibrate(m.g, set, opts);
    CHECK(r.tensors.size() == 2);
    CHECK(r.contains("c"));
    CHECK(r.contains("W"));
    opts.filter = nullptr;
    opts.weights = false;
    CHECK(!calibrate(m.g, set, opts).contains("W"));
    opts.weights = true;
    opts.per_channel_weights = false;
    auto pt = calibrate(m.g, set, opts).at("W");
    CHECK(!pt.params.per_channel());
    CHECK(pt.params.scale.size() == 1);
  }
  SECTION("histogram observers and other schemes") {
    CalibrationOptions opts;
    opts.activations.method = RangeMethod::Entropy;
    opts.activation_scheme = QuantScheme{DType::Int8, true, false};
    auto r = calibrate(m.g, set, opts);
    auto minmax = calibrate(m.g, set);
    for (const char* name : {"x", "c", "r", "g"}) {
      INFO(name);
      const auto& t = r.at(name);
      CHECK(t.params.dtype == DType::Int8);
      CHECK(t.params.zero_point[0] == 0);
      CHECK(t.observed_min == minmax.at(name).observed_min);
      CHECK(t.range.max[0] <= t.observed_max);
      CHECK_NOTHROW(check_params(t.params, name));
    }
    opts.activations.method = RangeMethod::MovingAverage;
    CHECK_NOTHROW(calibrate(m.g, set, opts));
    opts.activations.axis = 1;
    CHECK(error_of([&] { calibrate(m.g, set, opts); }).find("per tensor") != std::string::npos);
  }
}

TEST_CASE("calibration errors name the sample and the input", "[quant][calibration][bad-input]") {
  ConvModel m;
  auto set = samples(3);
  CHECK(error_of([&] { calibrate(m.g, std::vector<Sample>{}); }).find("calibration set is empty") != std::string::npos);
  CHECK(error_of([&] { calibrate(m.g, [] { return std::optional<Sample>(); }); }).find("calibration set is empty") !=
        std::string::npos);

  auto bad = set;
  bad[1]["x"] = Tensor(DType::Float32, {1, 2, 5, 4});
  std::string msg = error_of([&] { calibrate(m.g, bad); });
  CHECK(msg.find("calibration sample 2: input 'x' has shape [1,2,5,4], the model expects [batch,2,5,5]") !=
        std::string::npos);

  bad = set;
  bad[2]["x"] = Tensor(DType::Float64, {1, 2, 5, 5});
  CHECK(error_of([&] { calibrate(m.g, bad); }).find("calibration sample 3: input 'x' has dtype float64") !=
        std::string::npos);

  bad = set;
  bad[0]["y"] = Tensor(DType::Float32, {1});
  CHECK(error_of([&] { calibrate(m.g, bad); }).find("calibration sample 1: 'y' is not an input") != std::string::npos);
  bad = set;
  bad[0].clear();
  CHECK(error_of([&] { calibrate(m.g, bad); }).find("calibration sample 1: missing input 'x'") != std::string::npos);

  bad = set;
  bad[2]["x"] = bad[2]["x"].clone();
  bad[2]["x"].data<float>()[7] = std::nanf("");
  CHECK(error_of([&] { calibrate(m.g, bad); }).find("calibration sample 3: input 'x' contains NaN (element 7") !=
        std::string::npos);
  bad[2]["x"].data<float>()[7] = -std::numeric_limits<float>::infinity();
  CalibrationOptions opts;
  opts.sample_label = [](std::size_t i) { return "img_" + std::to_string(i) + ".npy"; };
  CHECK(error_of([&] { calibrate(m.g, bad, opts); }).find("calibration sample 3 ('img_2.npy'): input 'x' contains -Inf") !=
        std::string::npos);
}

TEST_CASE("NaN computed inside the model names the value and the sample", "[quant][calibration][bad-input]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{3});
  g.add_output(g.add_node("Sqrt", {x}, {"root"}, {}, "sqrt")->output(0));
  infer_shapes(g);
  std::vector<Sample> set{{{"x", Tensor::from_vector<float>({3}, {1, 4, 9})}},
                          {{"x", Tensor::from_vector<float>({3}, {1, -4, 9})}}};
  std::string msg = error_of([&] { calibrate(g, set); });
  CHECK(msg.find("calibration sample 2: tensor 'root' contains NaN (element 1") != std::string::npos);
}

TEST_CASE("weights of MatMul and Gemm are per output channel", "[quant][calibration]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{2, 3});
  Tensor b = Tensor::from_vector<float>({3, 2}, {1, -8, 2, 4, -3, 0.5f});  // [K, N]: channels along N
  Tensor bt = Tensor::from_vector<float>({2, 3}, {1, 2, -3, -8, 4, 0.5f});  // transposed: channels along dim 0
  Value* y = g.add_node("MatMul", {x, g.add_constant("B", b)}, {"y"}, {}, "mm")->output(0);
  Value* z = g.add_node("Gemm", {x, g.add_constant("Bt", bt)}, {"z"}, {{"transB", std::int64_t{1}}}, "gemm")->output(0);
  g.add_output(y);
  g.add_output(z);
  infer_shapes(g);
  std::mt19937 rng(3);
  auto r = calibrate(g, std::vector<Sample>{{{"x", random_tensor({2, 3}, rng)}}});
  for (const char* name : {"B", "Bt"}) {
    INFO(name);
    const auto& w = r.at(name);
    CHECK(w.params.axis == std::optional<std::int64_t>(std::string(name) == "B" ? 1 : 0));
    CHECK(w.params.scale == std::vector<float>{static_cast<float>(3.0 / 127), static_cast<float>(8.0 / 127)});
  }
}

TEST_CASE("calibration folders: both layouts, sorted, with clear errors", "[quant][calibration][bad-input]") {
  ConvModel m;
  fs::path root = fs::path(ONDINE_TEST_TMP_DIR) / "quant_calib";
  fs::remove_all(root);
  auto set = samples(3);

  SECTION("flat: one file per sample of a one-input model") {
    fs::create_directories(root / "flat");
    for (std::size_t i = 0; i < set.size(); ++i)
      save_npy(set[i].at("x"), (root / "flat" / ("img_00" + std::to_string(i) + ".npy")).string());
    std::ofstream(root / "flat" / "README.txt") << "not a sample";
    auto folder = scan_calibration_folder((root / "flat").string(), input_names(m.g));
    REQUIRE(folder.size() == 3);
    CHECK(folder.labels == std::vector<std::string>{"img_000.npy", "img_001.npy", "img_002.npy"});
    check_same(calibrate(m.g, folder.source()), calibrate(m.g, set));
  }
  SECTION("subfolders: DIR/<sample>/<input>.npy") {
    for (std::size_t i = 0; i < set.size(); ++i) {
      fs::path d = root / "nested" / ("s" + std::to_string(2 - i));  // reverse order on purpose
      fs::create_directories(d);
      save_npy(set[i].at("x"), (d / "x.npy").string());
    }
    auto folder = scan_calibration_folder((root / "nested").string(), input_names(m.g));
    REQUIRE(folder.size() == 3);
    CHECK(folder.labels == std::vector<std::string>{"s0", "s1", "s2"});
    CHECK(folder.load(0).at("x").dims() == set[2].at("x").dims());
    CalibrationOptions opts;
    opts.expected_samples = folder.size();
    opts.sample_label = [&](std::size_t i) { return folder.labels[i]; };
    check_same(calibrate(m.g, folder.source(), opts), calibrate(m.g, set));
    // A wrong file name reaches the input check, with the sample's label.
    fs::rename(root / "nested" / "s1" / "x.npy", root / "nested" / "s1" / "input.npy");
    folder = scan_calibration_folder((root / "nested").string(), input_names(m.g));
    CHECK(error_of([&] { calibrate(m.g, folder.source(), opts); }).find("calibration sample 2 ('s1'): missing input 'x'") !=
          std::string::npos);
  }
  SECTION("a flat folder of a multi-input model is one sample named by input") {
    fs::create_directories(root / "multi");
    save_npy(Tensor::from_vector<float>({2}, {1, 2}), (root / "multi" / "a.npy").string());
    save_npy(Tensor::from_vector<float>({2}, {3, 4}), (root / "multi" / "b.npy").string());
    auto folder = scan_calibration_folder((root / "multi").string(), {"a", "b"});
    REQUIRE(folder.size() == 1);
    CHECK(folder.load(0).size() == 2);
    CHECK(error_of([&] { scan_calibration_folder((root / "multi").string(), {"a", "c"}); })
              .find("put each sample in its own subfolder") != std::string::npos);
  }
  SECTION("errors") {
    fs::create_directories(root / "empty");
    std::string msg = error_of([&] { scan_calibration_folder((root / "empty").string(), {"x"}); });
    CHECK(msg.find("no .npy files found") != std::string::npos);
    CHECK(msg.find("empty") != std::string::npos);  // the folder is named
    CHECK(error_of([&] { scan_calibration_folder((root / "missing").string(), {"x"}); }).find("not a directory") !=
          std::string::npos);
    fs::create_directories(root / "mixed" / "s0");
    save_npy(set[0].at("x"), (root / "mixed" / "s0" / "x.npy").string());
    save_npy(set[0].at("x"), (root / "mixed" / "x.npy").string());
    CHECK(error_of([&] { scan_calibration_folder((root / "mixed").string(), {"x"}); }).find("use one layout") !=
          std::string::npos);
    fs::create_directories(root / "hollow" / "s0");
    CHECK(error_of([&] { scan_calibration_folder((root / "hollow").string(), {"x"}); })
              .find("sample folder 's0' has no .npy file") != std::string::npos);
    fs::create_directories(root / "garbage");
    std::ofstream(root / "garbage" / "a.npy") << "this is not numpy";
    auto folder = scan_calibration_folder((root / "garbage").string(), {"x"});
    msg = error_of([&] { calibrate(m.g, folder.source()); });
    CHECK(msg.find("a.npy") != std::string::npos);
    CHECK(msg.find("not a .npy file") != std::string::npos);
  }
  fs::remove_all(root);
}

}  // namespace test_quant_calibration
