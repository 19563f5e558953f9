// ondine::Model (ondine/model.hpp) as a host uses it: this file includes the light header only and links the
// prebuilt ondine::compiled, as examples/model does. Its own executable (not in the unity build), so that it
// compiles against the declarations alone.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "ondine/model.hpp"

namespace {

const std::string kGpt = std::string(ONDINE_TEST_DATA_DIR) + "/torch/gpt_decoder";
const std::string kMnist = std::string(ONDINE_TEST_DATA_DIR) + "/mnist/mnist_cnn.onnx";

double max_difference(const ondine::Tensor& a, const ondine::Tensor& b) {
  REQUIRE(a.dims() == b.dims());
  double d = 0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(a.numel()); ++i)
    d = std::max(d, std::fabs(a.at_double(i) - b.at_double(i)));
  return d;
}

}  // namespace

TEST_CASE("Model::compile runs a PyTorch export as PyTorch does, at two sequence lengths", "[model]") {
  ondine::lower::CompileOptions options;
  options.threads = 1;
  ondine::Model m = ondine::Model::compile(kGpt + "/model.onnx", options);
  CHECK(m.input_names() == std::vector<std::string>{"input_ids"});
  CHECK(m.output_names() == std::vector<std::string>{"logits"});
  for (const char* c : {"case0", "case1"}) {
    auto out = m.run({{"input_ids", ondine::load_npy(kGpt + "/" + c + ".input_ids.npy")}});
    ondine::Tensor want = ondine::load_npy(kGpt + "/" + c + ".out.logits.npy");
    INFO(c);
    CHECK(max_difference(out.at("logits"), want) < 1e-4);
  }
}

TEST_CASE("Model::run_many: feeds from two streams, outputs in order, equal to run", "[model][streams]") {
  ondine::lower::CompileOptions options;
  options.threads = 1;  // a stream's share
  const ondine::Model m = ondine::Model::compile(kMnist, options);
  std::vector<std::map<std::string, ondine::Tensor>> feeds;
  for (int i = 0; i < 10; ++i) {
    ondine::Tensor x(ondine::DType::Float32, {i % 2 ? 2 : 1, 1, 28, 28});
    float* p = x.data<float>();
    for (std::int64_t k = 0; k < x.numel(); ++k) p[k] = static_cast<float>((k * 7 + i * 13) % 17) / 17.0f;
    feeds.push_back({{"input", x}});
  }
  ondine::runtime::StreamOptions so;
  so.streams = 2;
  so.threads = 2;
  auto many = m.run_many(feeds, so);
  REQUIRE(many.size() == feeds.size());
  for (std::size_t i = 0; i < feeds.size(); ++i) {
    INFO("feed " << i);
    CHECK(max_difference(many[i].at("logits"), m.run(feeds[i]).at("logits")) == 0.0);
  }
}

TEST_CASE("Model::run_many: streams of another thread count run plans of their own, a bad request names itself",
          "[model][streams]") {
  ondine::lower::CompileOptions options;
  options.threads = 2;  // the model's own plans: two threads
  const ondine::Model m = ondine::Model::compile(kMnist, options);
  std::vector<std::map<std::string, ondine::Tensor>> feeds;
  for (int i = 0; i < 6; ++i) {
    ondine::Tensor x(ondine::DType::Float32, {1, 1, 28, 28});
    float* p = x.data<float>();
    for (std::int64_t k = 0; k < x.numel(); ++k) p[k] = static_cast<float>((k * 5 + i * 11) % 19) / 19.0f;
    feeds.push_back({{"input", x}});
  }
  ondine::runtime::StreamOptions so;
  so.streams = 2;
  so.threads = 2;  // streams of one thread: a second set of plans, compiled for one
  auto many = m.run_many(feeds, so);
  for (std::size_t i = 0; i < feeds.size(); ++i) {
    INFO("feed " << i);
    CHECK(max_difference(many[i].at("logits"), m.run(feeds[i]).at("logits")) < 1e-5);
  }
  auto bad = feeds;
  bad[3] = {{"input", ondine::Tensor(ondine::DType::Float32, {1, 1, 27, 28})}};
  CHECK_THROWS_WITH(m.run_many(bad, so), Catch::Contains("request 3 of 6") && Catch::Contains("input"));
}

TEST_CASE("Streams: each request answered by its future, a failing one fails alone", "[model][streams]") {
  ondine::lower::CompileOptions options;
  options.threads = 1;
  const ondine::Model m = ondine::Model::compile(kMnist, options);
  ondine::runtime::StreamOptions so;
  so.streams = 2;
  so.threads = 2;
  std::vector<std::future<std::map<std::string, ondine::Tensor>>> answers;
  std::vector<ondine::Tensor> inputs;
  {
    ondine::Streams streams(m, so);
    CHECK(streams.streams() == 2);
    CHECK(streams.threads_per_stream() == 1);
    for (int i = 0; i < 8; ++i) {
      ondine::Tensor x(ondine::DType::Float32, {1, 1, i == 5 ? 30 : 28, 28});
      float* p = x.data<float>();
      for (std::int64_t k = 0; k < x.numel(); ++k) p[k] = static_cast<float>((k * 3 + i) % 23) / 23.0f;
      inputs.push_back(x);
      answers.push_back(streams.submit({{"input", x}}));
    }
  }  // the destructor answers what was submitted
  for (std::size_t i = 0; i < answers.size(); ++i) {
    INFO("request " << i);
    if (i == 5) {
      CHECK_THROWS_AS(answers[i].get(), ondine::Error);
    } else {
      CHECK(max_difference(answers[i].get().at("logits"), m.run({{"input", inputs[i]}}).at("logits")) == 0.0);
    }
  }
}

TEST_CASE("Stream hints: latency is one stream of every thread, throughput streams of one thread for small models",
          "[model][streams]") {
  using ondine::runtime::Hint;
  auto latency = ondine::runtime::options_for_hint(Hint::Latency, 1e9, 8);
  CHECK(latency.streams == 1);
  CHECK(latency.threads == 8);
  auto small = ondine::runtime::options_for_hint(Hint::Throughput, 0.3e9, 8);
  CHECK(small.streams == 8);
  auto large = ondine::runtime::options_for_hint(Hint::Throughput, 1e12, 8);
  CHECK(large.streams == 2);
  CHECK(ondine::runtime::plan_streams(large, 100).threads_per_stream == 4);
  CHECK(ondine::runtime::options_for_hint(Hint::Throughput, 1e12, 4).streams == 4);  // few cores: one thread each
}

TEST_CASE("Model: a missing or damaged file is an Error naming it", "[model]") {
  CHECK_THROWS_WITH(ondine::Model::compile("no-such-model.onnx"), Catch::Contains("no-such-model.onnx"));
  CHECK_THROWS_WITH(ondine::Model::load("no-such-model.ondine"), Catch::Contains("no-such-model.ondine"));
  const std::string cut = std::string(ONDINE_TEST_TMP_DIR) + "/model_test_cut.ondine";
  std::ofstream(cut) << "ONDINE-not-really";
  CHECK_THROWS_AS(ondine::Model::load(cut), ondine::Error);
  std::remove(cut.c_str());
}
