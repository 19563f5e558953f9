// The text ops (reference/text.hpp). TfIdfVectorizer on integer tokens: n-grams with skips, unigrams
// counted once, the three modes, batched rows, and the compiled engine (a reference step) equal to the
// reference. StringNormalizer on string tensors: stopwords (case-sensitive or not), case changes, the
// one empty string left when all are removed, and compiled (its output size depends on data: staged).
#include <catch2/catch.hpp>

#include <limits>
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

namespace {

Graph normalizer(const std::vector<std::int64_t>& dims, std::map<std::string, Attribute> attrs) {
  Graph g;
  Value* x = g.add_input("x", DType::String, Shape::from(dims));
  g.add_output(g.add_node("StringNormalizer", {x}, {"y"}, std::move(attrs), "norm")->output(0));
  infer_shapes(g);
  return g;
}

}  // namespace

TEST_CASE("StringNormalizer removes stopwords and changes case", "[text]") {
  const Tensor x = Tensor::from_strings({1, 4}, {"Monday", "tuesday", "monday", "Wed"});
  SECTION("case-insensitive stopwords, upper case") {
    Graph g = normalizer({1, 4}, {{"stopwords", std::vector<std::string>{"MONDAY"}}, {"case_change_action", std::string("UPPER")}});
    CHECK(g.find_value("y")->shape().str() == Shape{1, Dim()}.str());  // how many remain depends on data
    const Tensor y = ReferenceExecutor(g).run({{"x", x}}).at("y");
    CHECK(y.dims() == std::vector<std::int64_t>{1, 2});
    CHECK(y.strings() == std::vector<std::string>{"TUESDAY", "WED"});
    const Tensor c = lower::compile(g).run({{"x", x}}).at("y");
    CHECK(c.strings() == y.strings());
  }
  SECTION("case-sensitive stopwords keep the other case, lower case after") {
    Graph g = normalizer({1, 4}, {{"stopwords", std::vector<std::string>{"monday"}},
                                  {"is_case_sensitive", std::int64_t{1}},
                                  {"case_change_action", std::string("LOWER")}});
    CHECK(ReferenceExecutor(g).run({{"x", x}}).at("y").strings() == std::vector<std::string>{"monday", "tuesday", "wed"});
  }
  SECTION("every string removed leaves one empty string") {
    Graph g = normalizer({2}, {{"stopwords", std::vector<std::string>{"a"}}});
    const Tensor y = ReferenceExecutor(g).run({{"x", Tensor::from_strings({2}, {"a", "A"})}}).at("y");
    CHECK(y.dims() == std::vector<std::int64_t>{1});
    CHECK(y.strings() == std::vector<std::string>{""});
  }
  SECTION("without stopwords the shape is known") {
    Graph g = normalizer({3}, {});
    CHECK(g.find_value("y")->shape() == Shape{3});
  }
}

TEST_CASE("Cast to and from strings", "[text]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{4});
  Value* s = g.add_node("Cast", {x}, {"s"}, {{"to", std::int64_t{8}}}, "to_string")->output(0);
  g.add_output(s);
  g.add_output(g.add_node("Cast", {s}, {"back"}, {{"to", std::int64_t{1}}}, "to_float")->output(0));
  infer_shapes(g);
  CHECK(s->dtype() == DType::String);
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor in = Tensor::from_vector<float>({4}, {0.9767611f, -inf, 1e-8f, 3.0f});
  auto out = ReferenceExecutor(g).run({{"x", in}});
  // The shortest text that reads back to the same float32, ONNX's spelling of infinity.
  CHECK(out.at("s").strings() == std::vector<std::string>{"0.9767611", "-INF", "1e-08", "3"});
  CHECK(out.at("back").to_floats() == in.to_floats());
  // Compiled: string values stay out of the plan, the casts run on reference kernels.
  CHECK(lower::compile(g).run({{"x", in}}).at("s").strings() == out.at("s").strings());

  Graph parse;
  Value* t = parse.add_input("t", DType::String, Shape{3});
  parse.add_output(parse.add_node("Cast", {t}, {"v"}, {{"to", std::int64_t{7}}}, "parse")->output(0));
  infer_shapes(parse);
  CHECK(ReferenceExecutor(parse).run({{"t", Tensor::from_strings({3}, {"12", "-3", "4e2"})}}).at("v").to_int64s() ==
        std::vector<std::int64_t>{12, -3, 400});
  CHECK_THROWS_WITH(ReferenceExecutor(parse).run({{"t", Tensor::from_strings({3}, {"1", "two", "3"})}}),
                    Catch::Contains("parse") && Catch::Contains("'two'"));

  // A string constant read by Cast, compiled without passes (nothing folds it): the Cast runs staged,
  // outside the plan, since the plan has no slot for strings.
  Graph constant;
  Value* words = constant.add_constant("words", Tensor::from_strings({2}, {"1.5", "-2"}));
  Value* y = constant.add_input("y", DType::Float32, Shape{2});
  Value* nums = constant.add_node("Cast", {words}, {"nums"}, {{"to", std::int64_t{1}}}, "parse_const")->output(0);
  constant.add_output(constant.add_node("Add", {nums, y}, {"z"}, {}, "add")->output(0));
  infer_shapes(constant);
  lower::CompileOptions no_passes;
  no_passes.passes = "none";
  const Tensor ones = Tensor::from_vector<float>({2}, {1, 1});
  CHECK(lower::compile(constant, no_passes).run({{"y", ones}}).at("z").to_floats() == std::vector<float>{2.5f, -1});
}

}  // namespace test_reference_text
