// The threading contract (docs/library.md, "Threads"): a compiled model and a ShapeCache are shared by any
// number of threads, each run giving bit-for-bit what it gives alone; a thread compiling a new shape does
// not hold up runs of the shapes already compiled. scripts/sanitize.sh runs these under ThreadSanitizer.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include <unistd.h>

#include <catch2/catch.hpp>

#include "ondine/lower/lower.hpp"
#include "ondine/lower/shape_cache.hpp"
#include "ondine/ondine.hpp"
#include "ondine/runtime/streams.hpp"
#include "support.hpp"

namespace test_threads {

using namespace ondine;
using test::uniform_tensor;

const std::string kMnist = std::string(ONDINE_TEST_DATA_DIR) + "/mnist";

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.dims() == b.dims() &&
         std::memcmp(a.raw(), b.raw(), static_cast<std::size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

// The MNIST CNN quantized as `ondine quantize` does (QDQ, calibrated on 16 of its calibration images).
Graph int8_mnist() {
  Graph g = ondine::onnx::load_model(kMnist + "/mnist_cnn.onnx");
  make_pass_manager("fold-constants,fold-bn,dce").run(g);
  auto folder = quant::scan_calibration_folder(kMnist + "/calib", quant::input_names(g));
  quant::CalibrationOptions copts;
  copts.max_samples = 16;
  auto calib = quant::calibrate(g, folder.source(), copts);
  quant::QuantizeQDQ pass(calib);
  PassContext ctx;
  REQUIRE(pass.run(g, ctx));
  return g;
}

TEST_CASE("8 threads share a compiled CNN and an int8 model at two shapes: outputs bit-identical to one thread",
          "[threads]") {
  lower::CompileOptions options;
  options.threads = 1;  // each thread its own one-thread OpenMP team: 8 on 2 cores is oversubscribed anyway
  lower::ShapeCache fp32(ondine::onnx::load_model(kMnist + "/mnist_cnn.onnx"), options);
  lower::ShapeCache int8(int8_mnist(), options);
  lower::ShapeCache* models[2] = {&fp32, &int8};

  // 12 inputs, batch 1 and 3; the expected outputs from one thread.
  std::vector<Tensor> inputs;
  std::vector<Tensor> expected[2];
  for (unsigned i = 0; i < 12; ++i) inputs.push_back(uniform_tensor({i % 2 ? 3 : 1, 1, 28, 28}, 100 + i, 0.0f, 1.0f));
  for (int m = 0; m < 2; ++m)
    for (const Tensor& x : inputs) expected[m].push_back(models[m]->run({{"input", x}}).at("logits"));
  CHECK(fp32.compilations() == 2);
  CHECK(int8.compilations() == 2);
  CHECK(fp32.idle_contexts() == 2);  // one per shape, reused by the next run of that shape

  constexpr int kThreads = 8, kRuns = 50;
  std::atomic<int> mismatches{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRuns; ++r) {
        const int m = (t + r) % 2;
        const std::size_t i = static_cast<std::size_t>(t * 7 + r * 5) % inputs.size();
        try {
          Tensor y = models[m]->run({{"input", inputs[i]}}).at("logits");
          if (!same_bits(y, expected[m][i])) ++mismatches;
        } catch (const std::exception&) {
          ++errors;
        }
      }
    });
  for (std::thread& th : threads) th.join();
  CHECK(errors == 0);
  CHECK(mismatches == 0);
  CHECK(fp32.compilations() == 2);  // nothing compiled again
  CHECK(int8.compilations() == 2);
  CHECK(fp32.idle_contexts() >= 2);
  CHECK(fp32.idle_contexts() <= 2 * kThreads);  // one per concurrent run of a shape, kept, not one per run
}

TEST_CASE("a compiled model shared by threads each with its own ExecContext gives one thread's bits", "[threads]") {
  Graph g = ondine::onnx::load_model(kMnist + "/mnist_cnn.onnx");
  bind_dims(g, {{"batch", 2}});
  lower::CompileOptions options;
  options.threads = 1;
  const CompiledModel model = lower::compile(g, options);
  std::vector<Tensor> inputs, expected;
  for (unsigned i = 0; i < 6; ++i) {
    inputs.push_back(uniform_tensor({2, 1, 28, 28}, 200 + i, 0.0f, 1.0f));
    expected.push_back(model.run({{"input", inputs.back()}}).at("logits"));
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      ExecContext ctx = model.make_context();
      for (int r = 0; r < 50; ++r) {
        const std::size_t i = static_cast<std::size_t>(t + r) % inputs.size();
        if (!same_bits(model.run(ctx, {{"input", inputs[i]}}).at("logits"), expected[i])) ++mismatches;
      }
    });
  for (std::thread& th : threads) th.join();
  CHECK(mismatches == 0);
}

TEST_CASE("a staged model (an If at the frontier, its branches compiled) shared by threads gives one thread's bits",
          "[threads][staged]") {
  // tests/data/torch/gated_encoder: the If on sample_rate chooses a Conv1d encoder, so its output shape
  // depends on data. The frontier's branch contexts are pooled between runs (lower/staged.hpp): threads
  // that run it at once must each get their own, and branches switching between runs must not mix.
  const std::string dir = std::string(ONDINE_TEST_DATA_DIR) + "/torch/gated_encoder/";
  Graph g = ondine::onnx::load_model(dir + "model.onnx");
  lower::CompileOptions options;
  options.threads = 1;
  lower::ShapeCache model(std::move(g), options);
  std::vector<std::map<std::string, Tensor>> inputs;
  std::vector<Tensor> expected;
  for (int k = 0; k < 2; ++k) {
    const std::string prefix = dir + "case" + std::to_string(k) + ".";
    inputs.push_back({{"audio", load_npy(prefix + "audio.npy")}, {"sample_rate", load_npy(prefix + "sample_rate.npy")}});
    expected.push_back(model.run(inputs.back()).at("speech"));
    CHECK(test::rel_error(expected.back(), load_npy(prefix + "out.speech.npy")) < 1e-4);
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < 20; ++r) {
        const std::size_t i = static_cast<std::size_t>(t + r) % inputs.size();
        if (!same_bits(model.run(inputs[i]).at("speech"), expected[i])) ++mismatches;
      }
    });
  for (std::thread& th : threads) th.join();
  CHECK(mismatches == 0);
}

TEST_CASE("a thread compiling a new shape does not hold up runs of a compiled one", "[threads]") {
  // The compile of batch 3 stops in its progress callback until the runs of batch 1 are done: were the
  // runs waiting on the cache's lock, they would never finish (the wait below would time out).
  std::mutex m;
  std::condition_variable cv;
  bool hold = false, held = false, release = false;
  lower::CompileOptions options;
  options.threads = 1;
  options.progress = [&](std::size_t, std::size_t, const Node*) {
    std::unique_lock<std::mutex> lock(m);
    if (!hold) return;
    held = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  };
  lower::ShapeCache cache(ondine::onnx::load_model(kMnist + "/mnist_cnn.onnx"), options);
  const Tensor one = uniform_tensor({1, 1, 28, 28}, 1, 0.0f, 1.0f);
  const Tensor expected = cache.run({{"input", one}}).at("logits");  // batch 1 compiled, not held
  {
    std::lock_guard<std::mutex> lock(m);
    hold = true;
  }
  auto compiling = std::async(std::launch::async, [&] {
    return cache.run({{"input", uniform_tensor({3, 1, 28, 28}, 3, 0.0f, 1.0f)}}).at("logits");
  });
  {
    std::unique_lock<std::mutex> lock(m);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return held; }));
  }
  auto runs = std::async(std::launch::async, [&] {
    bool same = true;
    for (int r = 0; r < 5; ++r) same = same && same_bits(cache.run({{"input", one}}).at("logits"), expected);
    return same;
  });
  const bool finished = runs.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  {
    std::lock_guard<std::mutex> lock(m);
    release = true;
  }
  cv.notify_all();
  CHECK(finished);
  CHECK(runs.get());
  CHECK(compiling.get().dims() == std::vector<std::int64_t>{3, 10});
  CHECK(cache.compilations() == 2);
}

// Resident set size in KiB (Linux: /proc/self/statm counts pages).
long resident_kib() {
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

TEST_CASE("10000 runs of a small model in one process: resident memory flat after warm-up", "[memory]") {
#if defined(__SANITIZE_ADDRESS__)
  WARN("skipped under AddressSanitizer: its quarantine keeps freed memory resident on purpose");
  return;
#endif
  lower::CompileOptions options;
  options.threads = 1;
  lower::ShapeCache cache(ondine::onnx::load_model(kMnist + "/mnist_cnn.onnx"), options);
  const Tensor x = uniform_tensor({1, 1, 28, 28}, 5, 0.0f, 1.0f);
  for (int r = 0; r < 1000; ++r) cache.run({{"input", x}});  // warm-up: compile, allocator pools, OpenMP
  const long after_warmup = resident_kib();
  for (int r = 0; r < 9000; ++r) cache.run({{"input", x}});
  const long after = resident_kib();
  INFO("resident after 1000 runs " << after_warmup << " KiB, after 10000 " << after << " KiB");
  // A leak of one output tensor (40 bytes) or one context's arena (~100 KiB) per run would add 350 KiB to
  // 900 MiB; the allocator's own drift stays far below 1 MiB.
  CHECK(after - after_warmup < 1024);
}

TEST_CASE("run_streams: requests from N streams of their own threads, outputs in request order, as one stream's",
          "[threads][streams]") {
  lower::CompileOptions options;
  options.threads = 1;  // each stream runs it with its own one-thread team
  lower::ShapeCache model(ondine::onnx::load_model(kMnist + "/mnist_cnn.onnx"), options);
  std::vector<Tensor> inputs, expected;
  for (unsigned i = 0; i < 24; ++i) {
    inputs.push_back(uniform_tensor({i % 3 ? 1 : 2, 1, 28, 28}, 300 + i, 0.0f, 1.0f));
    expected.push_back(model.run({{"input", inputs.back()}}).at("logits"));
  }
  for (int streams : {1, 2, 3}) {
    runtime::StreamOptions so;
    so.streams = streams;
    so.threads = streams;  // streams of one thread; pinned where the CPU set has that many cores
    const runtime::StreamPlan plan = runtime::plan_streams(so, inputs.size());
    CHECK(plan.streams == streams);
    CHECK(plan.threads_per_stream == 1);
    auto outputs = runtime::run_streams<Tensor>(inputs.size(), plan, [&](std::size_t i, int) {
      return model.run({{"input", inputs[i]}}).at("logits");
    });
    REQUIRE(outputs.size() == inputs.size());
    int mismatches = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) mismatches += same_bits(outputs[i], expected[i]) ? 0 : 1;
    INFO(streams << " streams");
    CHECK(mismatches == 0);
  }
  // Never more streams than requests; threads split between them, at least one each.
  runtime::StreamOptions many;
  many.streams = 8;
  many.threads = 4;
  CHECK(runtime::plan_streams(many, 3).streams == 3);
  CHECK(runtime::plan_streams(many, 100).threads_per_stream == 1);
  many.streams = 2;
  CHECK(runtime::plan_streams(many, 100).threads_per_stream == 2);
  // A request that fails: its error comes back, after the streams stop.
  runtime::StreamOptions two;
  two.streams = 2;
  two.threads = 2;
  CHECK_THROWS_WITH(runtime::run_streams<Tensor>(inputs.size(), runtime::plan_streams(two, inputs.size()),
                                                 [&](std::size_t i, int) {
                                                   if (i == 5) throw Error("request 5 failed");
                                                   return model.run({{"input", inputs[i]}}).at("logits");
                                                 }),
                    Catch::Contains("request 5 failed"));
}

}  // namespace test_threads
