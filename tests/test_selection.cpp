// NonMaxSuppression, Unique and Compress, the ops whose output size is data: bad input names the node,
// and a compiled model with them runs staged (lower/staged.hpp) and agrees with the reference executor.
// Their semantics are checked against the ONNX backend suite (9 NonMaxSuppression, 5 Unique and 4
// Compress cases, tests/conformance.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "ondine/lower/lower.hpp"
#include "ondine/ondine.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_selection {

using namespace ondine;
using Catch::Contains;

namespace {

// boxes [1, N, 4] and scores [1, 1, N] as inputs; NMS(max 3, iou 0.5, score 0.1) -> gathered box rows.
Graph nms_graph(std::int64_t n) {
  Graph g;
  Value* boxes = g.add_input("boxes", DType::Float32, Shape{1, n, 4});
  Value* scores = g.add_input("scores", DType::Float32, Shape{1, 1, n});
  Value* selected = g.add_node("NonMaxSuppression",
                               {boxes, scores, g.add_constant("max", Tensor::from_vector<std::int64_t>({1}, {3})),
                                g.add_constant("iou", Tensor::from_vector<float>({1}, {0.5f})),
                                g.add_constant("score", Tensor::from_vector<float>({1}, {0.1f}))},
                               {"selected"}, {}, "nms")
                      ->output(0);
  // The box index column, then those boxes' rows: what a detector does after NMS.
  Value* column = g.add_op("Gather", {selected, g.add_constant("two", Tensor::scalar<std::int64_t>(2))},
                           {{"axis", std::int64_t{1}}}, "box_index");
  Value* rows = g.add_op("Gather", {g.add_op("Squeeze", {boxes, g.add_constant("zero", Tensor::from_vector<std::int64_t>({1}, {0}))}), column},
                         {{"axis", std::int64_t{0}}}, "kept_boxes");
  g.add_output(selected);
  g.add_output(rows);
  infer_shapes(g);
  return g;
}

}  // namespace

TEST_CASE("NonMaxSuppression: compiled staged, equal to the reference for any number of survivors",
          "[selection][staged]") {
  Graph g = nms_graph(6);
  CHECK_FALSE(g.find_value("selected")->shape()[0].is_static());
  CompiledModel m = lower::compile(g.clone(), {});
  REQUIRE(m.continuation());
  ReferenceExecutor reference(g);
  // Three clusters of overlapping boxes; the score threshold decides how many survive (0 to 3).
  std::vector<float> boxes{0, 0, 1, 1,  0, 0.05f, 1, 1.05f,  2, 2, 3, 3,  2.05f, 2, 3.05f, 3,  5, 5, 6, 6,  5, 5, 6.1f, 6};
  std::vector<std::size_t> survivors;
  for (std::vector<float> scores : {std::vector<float>{0.9f, 0.8f, 0.7f, 0.95f, 0.3f, 0.2f},   // 3 survive
                                    std::vector<float>{0.01f, 0.02f, 0.03f, 0.04f, 0.05f, 0.06f},  // none
                                    std::vector<float>{0.9f, 0.8f, 0.05f, 0.05f, 0.05f, 0.05f},    // 1
                                    std::vector<float>{0.2f, 0.9f, 0.15f, 0.05f, 0.6f, 0.7f}}) {   // 3 others
    std::map<std::string, Tensor> in{{"boxes", Tensor::from_vector<float>({1, 6, 4}, boxes)},
                                     {"scores", Tensor::from_vector<float>({1, 1, 6}, scores)}};
    auto want = reference.run(in);
    auto got = m.run(in);
    CHECK(got.at("selected").to_int64s() == want.at("selected").to_int64s());
    REQUIRE(got.at("kept_boxes").dims() == want.at("kept_boxes").dims());
    for (std::int64_t i = 0; i < want.at("kept_boxes").numel(); ++i)
      CHECK(got.at("kept_boxes").data<float>()[i] == want.at("kept_boxes").data<float>()[i]);
    survivors.push_back(static_cast<std::size_t>(want.at("selected").dims()[0]));
  }
  CHECK(survivors == std::vector<std::size_t>{3, 0, 1, 3});
  auto first = reference.run({{"boxes", Tensor::from_vector<float>({1, 6, 4}, boxes)},
                              {"scores", Tensor::from_vector<float>({1, 1, 6}, {0.9f, 0.8f, 0.7f, 0.95f, 0.3f, 0.2f})}});
  // Highest first: box 3 (0.95) suppresses 2, box 0 (0.9) suppresses 1, then box 4 (0.3) of the last cluster.
  CHECK(first.at("selected").to_int64s() == std::vector<std::int64_t>{0, 0, 3, 0, 0, 0, 0, 0, 4});
}

TEST_CASE("NonMaxSuppression: many classes shifted apart (torchvision's batched NMS) keep what plain greedy keeps",
          "[selection]") {
  // torchvision exports every class through one NMS call with each class's boxes shifted by an offset,
  // so the kernel compares a candidate only with the kept boxes near it (reference/selection.hpp,
  // XBuckets). The result must be plain greedy NMS's: checked against the O(n^2) loop written here,
  // on clustered boxes of 40 classes, with tied scores, zero-area boxes and corners given in either order.
  const std::int64_t classes = 40, per_class = 60, n = classes * per_class;
  std::vector<float> boxes(static_cast<std::size_t>(n * 4)), scores(static_cast<std::size_t>(n));
  std::uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1u << 24);
  };
  for (std::int64_t i = 0; i < n; ++i) {
    const float offset = static_cast<float>(i / per_class) * 321.0f;  // (max coordinate + 1) per class
    const float cx = offset + 40 + 240 * next(), cy = offset + 40 + 240 * next();
    const float w = 5 + 75 * next(), h = i % 17 == 0 ? 0.0f : 5 + 75 * next();
    float* b = &boxes[static_cast<std::size_t>(i * 4)];
    b[0] = cx - w / 2, b[1] = cy - h / 2, b[2] = cx + w / 2, b[3] = cy + h / 2;
    if (i % 5 == 0) std::swap(b[0], b[2]);
    scores[static_cast<std::size_t>(i)] = std::round(next() * 200) / 200;  // many ties
  }
  Graph g;
  Value* bv = g.add_input("boxes", DType::Float32, Shape{1, n, 4});
  Value* sv = g.add_input("scores", DType::Float32, Shape{1, 1, n});
  g.add_output(g.add_node("NonMaxSuppression",
                          {bv, sv, g.add_constant("max", Tensor::from_vector<std::int64_t>({1}, {1000000})),
                           g.add_constant("iou", Tensor::from_vector<float>({1}, {0.45f}))},
                          {"selected"}, {}, "nms")
                   ->output(0));
  infer_shapes(g);
  auto got = ReferenceExecutor(g).run({{"boxes", Tensor::from_vector<float>({1, n, 4}, boxes)},
                                       {"scores", Tensor::from_vector<float>({1, 1, n}, scores)}});

  std::vector<std::int64_t> order(static_cast<std::size_t>(n)), want;
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return scores[static_cast<std::size_t>(a)] > scores[static_cast<std::size_t>(b)];
  });
  auto corner = [&](std::int64_t i, int k) { return boxes[static_cast<std::size_t>(i * 4 + k)]; };
  auto iou = [&](std::int64_t a, std::int64_t b) {
    float ax1 = std::min(corner(a, 0), corner(a, 2)), ax2 = std::max(corner(a, 0), corner(a, 2));
    float ay1 = std::min(corner(a, 1), corner(a, 3)), ay2 = std::max(corner(a, 1), corner(a, 3));
    float bx1 = std::min(corner(b, 0), corner(b, 2)), bx2 = std::max(corner(b, 0), corner(b, 2));
    float by1 = std::min(corner(b, 1), corner(b, 3)), by2 = std::max(corner(b, 1), corner(b, 3));
    float iw = std::min(ax2, bx2) - std::max(ax1, bx1), ih = std::min(ay2, by2) - std::max(ay1, by1);
    if (iw <= 0 || ih <= 0) return 0.0f;
    float inter = iw * ih, area_a = (ax2 - ax1) * (ay2 - ay1), area_b = (bx2 - bx1) * (by2 - by1);
    return area_a <= 0 || area_b <= 0 ? 0.0f : inter / (area_a + area_b - inter);
  };
  for (std::int64_t i : order) {
    bool keep = true;
    for (std::int64_t k : want) keep = keep && !(iou(k, i) > 0.45f);
    if (keep) want.push_back(i);
  }
  std::vector<std::int64_t> selected = got.at("selected").to_int64s(), kept;
  for (std::size_t r = 0; r < selected.size(); r += 3) kept.push_back(selected[r + 2]);
  CHECK(kept.size() > static_cast<std::size_t>(classes) * 10);  // many kept boxes: the case the buckets serve
  CHECK(kept == want);
}

TEST_CASE("Compress: compiled staged, equal to the reference for any number of kept rows", "[selection][staged]") {
  // x [4, 3] -> Relu -> Compress(axis 0) by a run-time condition -> Mul by 2: the rows kept are data.
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{4, 3});
  Value* keep = g.add_input("keep", DType::Bool, Shape{4});
  Value* rows = g.add_node("Compress", {g.add_op("Relu", {x}), keep}, {"rows"}, {{"axis", std::int64_t{0}}}, "compress")
                    ->output(0);
  g.add_output(g.add_op("Mul", {rows, g.add_constant("two", Tensor::scalar<float>(2))}, {}, "twice"));
  infer_shapes(g);
  CHECK(g.find_value("rows")->shape().rank() == 2);
  CHECK_FALSE(g.find_value("rows")->shape()[0].is_static());
  CHECK(g.find_value("rows")->shape()[1] == Dim(3));
  CompiledModel m = lower::compile(g.clone(), {});
  REQUIRE(m.continuation());
  ReferenceExecutor reference(g);
  Tensor xv = test::uniform_tensor({4, 3}, 7);
  const std::string out = g.outputs()[0]->name();
  for (std::vector<bool> c : {std::vector<bool>{true, false, true, true}, std::vector<bool>{false, false, false, false},
                              std::vector<bool>{false, true, false, false}, std::vector<bool>{true, true, true, true}}) {
    std::map<std::string, Tensor> in{{"x", xv}, {"keep", Tensor::from_vector<bool>({4}, c)}};
    auto want = reference.run(in);
    auto got = m.run(in);
    const auto kept = static_cast<std::int64_t>(std::count(c.begin(), c.end(), true));
    REQUIRE(want.at(out).dims() == std::vector<std::int64_t>{kept, 3});
    REQUIRE(got.at(out).dims() == want.at(out).dims());
    for (std::int64_t i = 0; i < want.at(out).numel(); ++i)
      CHECK(got.at(out).data<float>()[i] == want.at(out).data<float>()[i]);
  }
}

TEST_CASE("Compress: numbers and inference without an axis and with a constant condition", "[selection]") {
  // No axis: the flattened input's elements; a condition shorter than the input drops the rest.
  Graph g;
  Value* x = g.add_input("x", DType::Int32, Shape{2, 3});
  Value* cond = g.add_constant("cond", Tensor::from_vector<bool>({4}, {false, true, false, true}));
  g.add_output(g.add_node("Compress", {x, cond}, {"y"}, {}, "compress")->output(0));
  infer_shapes(g);
  CHECK(g.find_value("y")->shape() == Shape{2});  // the count of a constant condition is known
  auto y = ReferenceExecutor(g).run({{"x", Tensor::from_vector<std::int32_t>({2, 3}, {1, 2, 3, 4, 5, 6})}}).at("y");
  CHECK(y.to_int64s() == std::vector<std::int64_t>{2, 4});
  // axis -1 of [2, 3] by {true, false, true}: columns 0 and 2.
  Graph h;
  Value* hx = h.add_input("x", DType::Float32, Shape{Dim::named("n"), 3});
  Value* hc = h.add_constant("cond", Tensor::from_vector<bool>({3}, {true, false, true}));
  h.add_output(h.add_node("Compress", {hx, hc}, {"y"}, {{"axis", std::int64_t{-1}}}, "compress")->output(0));
  infer_shapes(h);
  CHECK(h.find_value("y")->shape() == Shape{Dim::named("n"), 2});
  auto hy = ReferenceExecutor(h).run({{"x", Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6})}}).at("y");
  CHECK(hy.to_floats() == std::vector<float>{1, 3, 4, 6});
}

TEST_CASE("NonMaxSuppression and Unique: bad input names the node", "[selection][errors]") {
  Graph g = nms_graph(2);
  ReferenceExecutor reference(g);
  SECTION("boxes with 5 coordinates") {
    Graph bad;
    Value* boxes = bad.add_input("boxes", DType::Float32, Shape{1, 2, 5});
    Value* scores = bad.add_input("scores", DType::Float32, Shape{1, 1, 2});
    bad.add_output(bad.add_node("NonMaxSuppression", {boxes, scores}, {"s"}, {}, "nms5")->output(0));
    try {
      infer_shapes(bad);
      FAIL("inferred");
    } catch (const Error& e) {
      CHECK(e.node() == "nms5");
      CHECK_THAT(std::string(e.what()), Contains("[batches, boxes, 4]"));
    }
  }
  SECTION("an IoU threshold past 1") {
    Graph bad = nms_graph(2);
    Node* nms = bad.find_value("selected")->producer();
    nms->set_input(3, bad.add_constant("iou2", Tensor::from_vector<float>({1}, {1.5f})));
    try {
      ReferenceExecutor(bad).run({{"boxes", test::uniform_tensor({1, 2, 4}, 1)}, {"scores", test::uniform_tensor({1, 1, 2}, 2)}});
      FAIL("ran");
    } catch (const Error& e) {
      CHECK(e.node() == "nms");
      CHECK_THAT(std::string(e.what()), Contains("iou_threshold"));
    }
  }
  SECTION("Unique on an axis past the rank") {
    Graph bad;
    Value* x = bad.add_input("x", DType::Float32, Shape{2, 3});
    Node* u = bad.add_node("Unique", {x}, {"y", "i", "inv", "c"}, {{"axis", std::int64_t{2}}}, "uniq");
    bad.add_output(u->output(0));
    try {
      infer_shapes(bad);
      FAIL("inferred");
    } catch (const Error& e) {
      CHECK(e.node() == "uniq");
    }
  }
  SECTION("Compress with a condition longer than the axis, or not bool") {
    Graph bad;
    Value* x = bad.add_input("x", DType::Float32, Shape{2, 3});
    Value* c = bad.add_input("c", DType::Bool, Shape{Dim::named("k")});
    bad.add_output(bad.add_node("Compress", {x, c}, {"y"}, {{"axis", std::int64_t{0}}}, "comp")->output(0));
    infer_shapes(bad);
    try {
      ReferenceExecutor(bad).run({{"x", test::uniform_tensor({2, 3}, 3)},
                                  {"c", Tensor::from_vector<bool>({3}, {true, true, true})}});
      FAIL("ran");
    } catch (const Error& e) {
      CHECK(e.node() == "comp");
      CHECK(e.op() == "Compress");
      CHECK_THAT(std::string(e.what()), Contains("more than the 2"));
    }
    Graph bad2;
    Value* x2 = bad2.add_input("x", DType::Float32, Shape{2, 3});
    Value* c2 = bad2.add_input("c", DType::Int64, Shape{2});
    bad2.add_output(bad2.add_node("Compress", {x2, c2}, {"y"}, {}, "comp2")->output(0));
    try {
      infer_shapes(bad2);
      FAIL("inferred");
    } catch (const Error& e) {
      CHECK(e.node() == "comp2");
      CHECK_THAT(std::string(e.what()), Contains("bool"));
    }
  }
}

}  // namespace test_selection
