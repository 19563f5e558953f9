// TfIdfVectorizer on integer tokens (reference/text.hpp): n-grams with skips, unigrams counted once,
// the three modes, batched rows, and the compiled engine (a reference step) equal to the reference.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "ondine/ir/shape_inference.hpp"
#include "ondine/lower/lower.hpp"
#include "ondine/reference/executor.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_reference_text {

using namespace ondine;

namespace {

// Pool: unigrams 2 and 3, the bigram (2, 3); outputs 0, 1, 2 in that order.
Graph tfidf(const std::vector<std::int64_t>& x_dims, const std::string& mode, std::vector<float> weights = {}) {
  Graph g;
  Value* x = g.add_input("x", DType::Int32, Shape::from(x_dims));
  std::map<std::string, Attribute> attrs{{"min_gram_length", std::int64_t{1}},
                                         {"max_gram_length", std::int64_t{2}},
                                         {"max_skip_count", std::int64_t{1}},
                                         {"mode", mode},
                                         {"ngram_counts", std::vector<std::int64_t>{0, 2}},
                                         {"ngram_indexes", std::vector<std::int64_t>{0, 1, 2}},
                                         {"pool_int64s", std::vector<std::int64_t>{2, 3, 2, 3}}};
  if (!weights.empty()) attrs["weights"] = weights;
  g.add_output(g.add_node("TfIdfVectorizer", {x}, {"y"}, std::move(attrs), "tfidf")->output(0));
  infer_shapes(g);
  return g;
}

}  // namespace

TEST_CASE("TfIdfVectorizer counts n-grams with skips and unigrams once", "[text]") {
  // Row 0 [2 3 9 3]: 2 once, 3 twice, (2,3) adjacent once. Row 1 [2 9 3 9]: (2,3) one token apart.
  Graph g = tfidf({2, 4}, "TF");
  CHECK(g.find_value("y")->shape() == Shape{2, 3});
  CHECK(g.find_value("y")->dtype() == DType::Float32);
  const Tensor x = Tensor::from_vector<std::int32_t>({2, 4}, {2, 3, 9, 3, 2, 9, 3, 9});
  const Tensor y = ReferenceExecutor(g).run({{"x", x}}).at("y");
  CHECK(y.to_floats() == std::vector<float>{1, 2, 1, 1, 1, 1});
  // The compiled engine runs it as a reference step: the same numbers.
  CHECK(lower::compile(g).run({{"x", x}}).at("y").to_floats() == y.to_floats());
}

TEST_CASE("TfIdfVectorizer modes IDF and TFIDF apply the weights", "[text]") {
  const Tensor x = Tensor::from_vector<std::int32_t>({4}, {2, 3, 9, 3});
  Graph idf = tfidf({4}, "IDF", {0.5f, 2.0f, 4.0f});
  CHECK(ReferenceExecutor(idf).run({{"x", x}}).at("y").to_floats() == std::vector<float>{0.5f, 2, 4});
  Graph both = tfidf({4}, "TFIDF", {0.5f, 2.0f, 4.0f});
  CHECK(ReferenceExecutor(both).run({{"x", x}}).at("y").to_floats() == std::vector<float>{0.5f, 4, 4});
  Graph bad = tfidf({4}, "COUNT");
  CHECK_THROWS_WITH(ReferenceExecutor(bad).run({{"x", x}}), Catch::Contains("tfidf") && Catch::Contains("mode"));
}

}  // namespace test_reference_text
