// A detector as users export it: torchvision's ssdlite320_mobilenet_v3_large (tests/data/torch/
// ssdlite_detector, written by scripts/make_models.py --torch-corpus), compiled with its TopK, NonZero,
// GatherND and its NonMaxSuppression inside an If, at two image sizes, against PyTorch's own run.
//
// NMS is a discontinuous function: two candidates whose scores differ by 1e-7, or whose IoU sits at the
// threshold, may come out either way in engines that round differently (ONNX Runtime and PyTorch disagree
// on this model too). So the candidates that enter NMS are compared at 1e-4, and the detections after it
// are judged by a rule: they must be what greedy NMS keeps from PyTorch's candidates, where every decision
// that a difference within the tolerances could flip may go either way.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ondine/lower/lower.hpp"
#include "ondine/lower/shape_cache.hpp"
#include "ondine/ondine.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_detector {

using namespace ondine;
namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::path(ONDINE_TEST_DATA_DIR) / "torch" / "ssdlite_detector";
constexpr float kNmsThreshold = 0.55f;  // ssdlite320's nms_thresh
constexpr float kScoreTolerance = 1e-4f;
constexpr float kIouTolerance = 1e-3f;

struct Detections {
  std::vector<std::array<float, 4>> boxes;
  std::vector<float> scores;
  std::vector<std::int64_t> labels;
  std::size_t size() const { return scores.size(); }
};

Detections detections(const Tensor& boxes, const Tensor& scores, const Tensor& labels) {
  Detections d;
  REQUIRE(boxes.rank() == 2);
  REQUIRE(boxes.dims()[1] == 4);
  REQUIRE(scores.numel() == boxes.dims()[0]);
  REQUIRE(labels.numel() == boxes.dims()[0]);
  std::vector<std::int64_t> l = labels.to_int64s();
  for (std::int64_t i = 0; i < scores.numel(); ++i) {
    const float* b = boxes.data<float>() + i * 4;
    d.boxes.push_back({b[0], b[1], b[2], b[3]});
    d.scores.push_back(scores.data<float>()[i]);
    d.labels.push_back(l[static_cast<std::size_t>(i)]);
  }
  return d;
}

Detections load(const std::string& prefix) {
  return detections(load_npy((kDir / (prefix + "boxes.npy")).string()), load_npy((kDir / (prefix + "scores.npy")).string()),
                    load_npy((kDir / (prefix + "labels.npy")).string()));
}

float iou(const std::array<float, 4>& a, const std::array<float, 4>& b) {
  const float iw = std::min(a[2], b[2]) - std::max(a[0], b[0]), ih = std::min(a[3], b[3]) - std::max(a[1], b[1]);
  if (iw <= 0 || ih <= 0) return 0;
  const float inter = iw * ih;
  return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter);
}

// For each element of `a`, the index of an unused element of `b` with the same label, a score within
// kScoreTolerance and corners within `box_tolerance`, or -1.
std::vector<std::int64_t> match(const Detections& a, const Detections& b, float box_tolerance) {
  std::vector<std::int64_t> to(a.size(), -1);
  std::vector<bool> used(b.size(), false);
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t j = 0; j < b.size(); ++j) {
      if (used[j] || a.labels[i] != b.labels[j] || std::abs(a.scores[i] - b.scores[j]) > kScoreTolerance) continue;
      bool same = true;
      for (int k = 0; k < 4; ++k) same = same && std::abs(a.boxes[i][k] - b.boxes[j][k]) <= box_tolerance;
      if (!same) continue;
      used[j] = true;
      to[i] = static_cast<std::int64_t>(j);
      break;
    }
  return to;
}

// The If of batched_nms and the candidates it reads from outside (boxes [N,4], scores [N], labels [N]).
std::vector<Value*> nms_candidates(Graph& g) {
  std::vector<Value*> found(3, nullptr);
  for (Node* n : g.nodes()) {
    if (n->op_type() != "If") continue;
    for (std::size_t i = n->num_formal_inputs(); i < n->num_inputs(); ++i) {
      Value* v = n->input(i);
      const std::size_t rank = v->shape().rank();
      if (v->dtype() == DType::Float32 && rank == 2) found[0] = v;
      if (v->dtype() == DType::Float32 && rank == 1) found[1] = v;
      if (v->dtype() == DType::Int64 && rank == 1) found[2] = v;
    }
  }
  for (Value* v : found) REQUIRE(v);
  return found;
}

}  // namespace

TEST_CASE("detector: torchvision SSDLite compiled, candidates equal to PyTorch's, NMS decisions consistent",
          "[corpus][staged][selection]") {
  Graph g = ondine::onnx::load_model((kDir / "model.onnx").string());
  std::vector<std::string> candidate_names;
  for (Value* v : nms_candidates(g)) {
    candidate_names.push_back(v->name());
    g.add_output(v);
  }
  std::size_t ops_in_subgraphs = 0;
  for (Node* n : g.nodes())
    for (const auto& [attr, sub] : n->subgraphs()) ops_in_subgraphs += sub->num_nodes();
  CHECK(ops_in_subgraphs > 0);  // NonMaxSuppression runs inside the If

  lower::CompileOptions options;
  options.threads = 1;
  lower::ShapeCache cache(g.clone(), options);
  for (int k = 0; k < 2; ++k) {
    INFO("case " << k);
    const std::string prefix = "case" + std::to_string(k) + ".";
    Tensor image = load_npy((kDir / (prefix + "image.npy")).string());
    auto got = cache.run({{"image", image}});

    // The candidates NMS chooses from: the same set as PyTorch's (order may differ among tied scores).
    Detections want_candidates = load(prefix + "nms.");
    Detections candidates = detections(got.at(candidate_names[0]), got.at(candidate_names[1]), got.at(candidate_names[2]));
    REQUIRE(candidates.size() == want_candidates.size());
    CHECK(candidates.size() > 1000);
    float box_scale = 0;
    for (auto& b : want_candidates.boxes)
      for (float c : b) box_scale = std::max(box_scale, std::abs(c));
    std::vector<std::int64_t> to_want = match(candidates, want_candidates, 1e-4f * box_scale);
    CHECK(std::count(to_want.begin(), to_want.end(), -1) == 0);

    // The detections: each one a candidate, and every keep/suppress decision one that greedy NMS over
    // PyTorch's candidates (by descending score; IoU > threshold suppresses, within a class) makes, or
    // could make were scores or IoUs off by the tolerances.
    Detections want = load(prefix + "out.");
    Detections found = detections(got.at("boxes"), got.at("scores"), got.at("labels"));
    REQUIRE(found.size() > 10);
    CHECK(found.size() <= 50);  // detections_per_img
    // Boxes after NMS are scaled back from the 320x320 the model resizes to: undo that to find them
    // among the candidates.
    Detections found_320 = found;
    const float rh = static_cast<float>(image.dims()[1]) / 320, rw = static_cast<float>(image.dims()[2]) / 320;
    for (auto& b : found_320.boxes) b = {b[0] / rw, b[1] / rh, b[2] / rw, b[3] / rh};
    std::vector<std::int64_t> found_in = match(found_320, want_candidates, 1e-3f * 320);
    std::vector<bool> kept(want_candidates.size(), false);
    for (std::int64_t j : found_in) {
      CHECK(j >= 0);
      if (j >= 0) kept[static_cast<std::size_t>(j)] = true;
    }
    std::vector<std::size_t> order(want_candidates.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return want_candidates.scores[a] > want_candidates.scores[b]; });
    const float lowest_found = *std::min_element(found.scores.begin(), found.scores.end());
    const bool truncated = found.size() == 50;
    std::vector<std::size_t> decided_kept;
    std::size_t wrong_keeps = 0, wrong_drops = 0;
    for (std::size_t c : order) {
      const auto& box = want_candidates.boxes[c];
      const float score = want_candidates.scores[c];
      const std::int64_t label = want_candidates.labels[c];
      bool must_suppress = false, may_suppress = false;
      for (std::size_t k : decided_kept)
        if (want_candidates.labels[k] == label && want_candidates.scores[k] > score + kScoreTolerance &&
            iou(want_candidates.boxes[k], box) > kNmsThreshold + kIouTolerance)
          must_suppress = true;
      for (std::size_t k = 0; k < kept.size() && !may_suppress; ++k)
        may_suppress = kept[k] && k != c && want_candidates.labels[k] == label &&
                       want_candidates.scores[k] >= score - kScoreTolerance &&
                       iou(want_candidates.boxes[k], box) > kNmsThreshold - kIouTolerance;
      if (kept[c]) {
        wrong_keeps += must_suppress;
        decided_kept.push_back(c);
      } else if (!may_suppress && (!truncated || score > lowest_found + kScoreTolerance)) {
        ++wrong_drops;
      }
    }
    CHECK(wrong_keeps == 0);
    CHECK(wrong_drops == 0);
    // And most of PyTorch's own detections are there (near ties may swap a few).
    std::vector<std::int64_t> want_found = match(want, found, 1e-3f * 320 * std::max(rh, rw));
    CHECK(std::count(want_found.begin(), want_found.end(), -1) <= static_cast<long>(want.size() / 10));
    CHECK(want_found.front() >= 0);  // the best detection
  }
  CHECK(cache.compilations() == 2);
}

}  // namespace test_detector
