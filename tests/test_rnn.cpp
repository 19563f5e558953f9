// RNN, GRU and LSTM: shape inference and its errors, the reference kernels' semantics that the ONNX
// backend suite does not reach (sequence_lens with unequal lengths, both layouts agreeing), and bad
// input. The ONNX suite's cases (tests/conformance.cpp) and the PyTorch-exported taggers and streaming
// model (tests/test_shape_values.cpp's corpus) check the numbers against ONNX's and PyTorch's.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ondine/lower/lower.hpp"
#include "ondine/ondine.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_rnn {

using namespace ondine;
using Dims = std::vector<std::int64_t>;

namespace {

// One recurrent node over X [T, N, I] (layout 0) with constant weights; inputs "x" and optionally "lens".
struct Recurrent {
  Graph g;
  std::string op;
  std::int64_t seq, batch, input, hidden, dirs;
  Recurrent(const std::string& op_, const std::string& direction, std::int64_t seq_, std::int64_t batch_,
            std::int64_t input_, std::int64_t hidden_, bool with_lens, std::int64_t layout = 0, bool with_states = false,
            bool peepholes = true)
      : op(op_), seq(seq_), batch(batch_), input(input_), hidden(hidden_), dirs(direction == "bidirectional" ? 2 : 1) {
    std::int64_t gates = op == "LSTM" ? 4 : op == "GRU" ? 3 : 1;
    Dims xd = layout ? Dims{batch, seq, input} : Dims{seq, batch, input};
    Value* x = g.add_input("x", DType::Float32, Shape::from(xd));
    Value* w = g.add_constant("W", test::uniform_tensor({dirs, gates * hidden, input}, 1, -0.5f, 0.5f));
    Value* r = g.add_constant("R", test::uniform_tensor({dirs, gates * hidden, hidden}, 2, -0.5f, 0.5f));
    Value* b = g.add_constant("B", test::uniform_tensor({dirs, 2 * gates * hidden}, 3, -0.5f, 0.5f));
    Value* lens = with_lens ? g.add_input("lens", DType::Int32, Shape{batch}) : nullptr;
    std::vector<Value*> ins{x, w, r, b, lens};
    if (with_states) {  // initial_h (and initial_c, peepholes) as graph inputs "h0", "c0" and a constant
      ins.push_back(g.add_input("h0", DType::Float32, Shape{dirs, batch, hidden}));
      if (op == "LSTM") {
        ins.push_back(g.add_input("c0", DType::Float32, Shape{dirs, batch, hidden}));
        if (peepholes) ins.push_back(g.add_constant("P", test::uniform_tensor({dirs, 3 * hidden}, 4, -0.5f, 0.5f)));
      }
    }
    std::vector<std::string> outs{"y", "y_h"};
    if (op == "LSTM") outs.push_back("y_c");
    std::map<std::string, Attribute> attrs{{"direction", direction}, {"hidden_size", hidden}, {"layout", layout}};
    if (op == "GRU") attrs["linear_before_reset"] = std::int64_t{1};
    Node* n = g.add_node(op, ins, outs, attrs, "rnn");
    for (Value* v : n->outputs()) g.add_output(v);
    infer_shapes(g);
  }
};

}  // namespace

TEST_CASE("recurrent ops: inferred shapes in both layouts", "[rnn][infer]") {
  Recurrent lstm("LSTM", "bidirectional", 5, 3, 4, 6, false);
  CHECK(lstm.g.find_value("y")->shape().str() == "[5,2,3,6]");
  CHECK(lstm.g.find_value("y_c")->shape().str() == "[2,3,6]");
  Recurrent gru("GRU", "forward", 5, 3, 4, 6, false, 1);
  CHECK(gru.g.find_value("y")->shape().str() == "[3,5,1,6]");
  CHECK(gru.g.find_value("y_h")->shape().str() == "[3,1,6]");
}

TEST_CASE("recurrent ops: FLOPs count the gate products of every step and direction", "[rnn][stats]") {
  Recurrent lstm("LSTM", "bidirectional", 5, 3, 4, 6, false);
  // per step, sample and direction: 4 gates x 6 hidden x (4 input + 6 hidden) multiply-adds
  CHECK(graph_stats(lstm.g).flops == Approx(2.0 * 4 * 6 * (4 + 6) * 5 * 3 * 2));
}

TEST_CASE("recurrent ops: unequal sequence_lens equal running each sequence alone", "[rnn][reference]") {
  for (const char* op : {"RNN", "GRU", "LSTM"}) {
    for (const char* direction : {"forward", "reverse", "bidirectional"}) {
      INFO(op << " " << direction);
      Recurrent full(op, direction, 6, 2, 3, 4, true);
      Tensor x = test::uniform_tensor({6, 2, 3}, 9, -1.0f, 1.0f);
      Tensor lens = Tensor::from_vector<std::int32_t>({2}, {6, 3});
      auto out = ReferenceExecutor(full.g).run({{"x", x}, {"lens", lens}});
      // Sample 1 alone, cut to its 3 steps.
      Recurrent one(op, direction, 3, 1, 3, 4, false);
      Tensor x1(DType::Float32, {3, 1, 3});
      for (std::int64_t t = 0; t < 3; ++t)
        for (std::int64_t i = 0; i < 3; ++i) x1.data<float>()[t * 3 + i] = x.data<float>()[(t * 2 + 1) * 3 + i];
      auto alone = ReferenceExecutor(one.g).run({{"x", x1}});
      const Tensor &y = out.at("y"), &y1 = alone.at("y");
      const std::int64_t dirs = full.dirs, h = 4;
      double err = 0, mag = 0;
      for (std::int64_t t = 0; t < 6; ++t)
        for (std::int64_t d = 0; d < dirs; ++d)
          for (std::int64_t j = 0; j < h; ++j) {
            float got = y.data<float>()[((t * dirs + d) * 2 + 1) * h + j];
            float want = t < 3 ? y1.data<float>()[((t * dirs + d) * 1) * h + j] : 0.0f;  // zero past the length
            err = std::max(err, static_cast<double>(std::fabs(got - want)));
            mag = std::max(mag, static_cast<double>(std::fabs(want)));
          }
      for (std::int64_t d = 0; d < dirs; ++d)
        for (std::int64_t j = 0; j < h; ++j)
          err = std::max(err, static_cast<double>(std::fabs(out.at("y_h").data<float>()[(d * 2 + 1) * h + j] -
                                                            alone.at("y_h").data<float>()[d * h + j])));
      CHECK(mag > 0.05);
      CHECK(err < 1e-6);
    }
  }
}

TEST_CASE("recurrent ops: layout 1 is layout 0 transposed", "[rnn][reference]") {
  Recurrent a("LSTM", "bidirectional", 4, 3, 2, 5, false, 0);
  Recurrent b("LSTM", "bidirectional", 4, 3, 2, 5, false, 1);
  Tensor x0 = test::uniform_tensor({4, 3, 2}, 4, -1.0f, 1.0f), x1(DType::Float32, {3, 4, 2});
  for (std::int64_t t = 0; t < 4; ++t)
    for (std::int64_t n = 0; n < 3; ++n)
      for (std::int64_t i = 0; i < 2; ++i) x1.data<float>()[(n * 4 + t) * 2 + i] = x0.data<float>()[(t * 3 + n) * 2 + i];
  auto ya = ReferenceExecutor(a.g).run({{"x", x0}}).at("y");
  auto yb = ReferenceExecutor(b.g).run({{"x", x1}}).at("y");
  double err = 0;
  for (std::int64_t t = 0; t < 4; ++t)
    for (std::int64_t d = 0; d < 2; ++d)
      for (std::int64_t n = 0; n < 3; ++n)
        for (std::int64_t j = 0; j < 5; ++j)
          err = std::max(err, static_cast<double>(std::fabs(ya.data<float>()[((t * 2 + d) * 3 + n) * 5 + j] -
                                                            yb.data<float>()[((n * 4 + t) * 2 + d) * 5 + j])));
  CHECK(err == 0);
}

TEST_CASE("recurrent ops: compiled onto oneDNN, or the reference kernel with the reason logged", "[rnn][lower]") {
  // A bidirectional GRU with linear_before_reset (PyTorch's) compiles (oneDNN's lbr GRU; on AVX-512 at this
  // batch Ondine's recurrence kernel) and matches the reference.
  Recurrent gru("GRU", "bidirectional", 6, 2, 3, 4, false);
  Tensor x = test::uniform_tensor({6, 2, 3}, 21, -1.0f, 1.0f);
  lower::CompileOptions options;
  options.threads = 1;
  auto model = lower::compile(gru.g, options);
  bool on_onednn = false;
  for (const auto& s : model.steps()) on_onednn = on_onednn || (s.op == "GRU" && s.implementation != "reference");
  CHECK(on_onednn);
  auto got = model.run({{"x", x}});
  auto want = ReferenceExecutor(gru.g).run({{"x", x}});
  for (const char* out : {"y", "y_h"}) CHECK(test::rel_error(got.at(out), want.at(out)) < 1e-5);

  // A clip oneDNN does not have: the reference kernel, and the log says why.
  Recurrent clipped("LSTM", "forward", 6, 2, 3, 4, false);
  for (Node* node : clipped.g.nodes())
    if (node->name() == "rnn") node->set_attr("clip", 0.5f);
  std::vector<std::string> log;
  options.log = [&log](const std::string& line) { log.push_back(line); };
  auto fallback = lower::compile(clipped.g, options);
  bool said = false;
  for (const auto& line : log) said = said || (line.find("'rnn'") != std::string::npos && line.find("clip") != std::string::npos);
  CHECK(said);
  CHECK(test::rel_error(fallback.run({{"x", x}}).at("y"), ReferenceExecutor(clipped.g).run({{"x", x}}).at("y")) < 1e-6);
}

TEST_CASE("recurrent ops: a bidirectional layer runs its two directions side by side, equal to one primitive",
          "[rnn][lower][threads]") {
  // With two threads the directions are two primitives on one thread each (ConcurrentStep), writing their
  // halves of Y, Y_h and Y_c; with one thread, oneDNN's bidirectional primitive. Initial states, peepholes.
  // A batch above the largest an fp32 LSTM or GRU runs Ondine's recurrence kernel at (the next test).
  const std::int64_t b = lower::detail::recurrence::max_small_batch(lower::effective_isa().avx512) + 1;
  for (const char* op : {"LSTM", "GRU", "RNN"}) {
    INFO(op);
    Recurrent rnn(op, "bidirectional", 7, b, 5, 6, false, 0, true);
    std::map<std::string, Tensor> in{{"x", test::uniform_tensor({7, b, 5}, 31, -1.0f, 1.0f)},
                                     {"h0", test::uniform_tensor({2, b, 6}, 32, -1.0f, 1.0f)}};
    if (std::string(op) == "LSTM") in["c0"] = test::uniform_tensor({2, b, 6}, 33, -1.0f, 1.0f);
    auto want = ReferenceExecutor(rnn.g).run(in);
    for (int threads : {1, 2}) {
      INFO("threads " << threads);
      lower::CompileOptions options;
      options.threads = threads;
      auto model = lower::compile(rnn.g, options);
      std::size_t side_by_side = 0, on_onednn = 0;
      for (const auto& s : model.steps()) {
        on_onednn += s.op == op && s.implementation != "reference";
        side_by_side += s.detail.find("side by side") != std::string::npos;
      }
      CHECK(on_onednn == 1);
      CHECK(side_by_side == (threads == 2 ? 1u : 0u));
      auto got = model.run(in);
      for (auto& [name, t] : want) {
        INFO(name);
        CHECK(test::rel_error(got.at(name), t) < 1e-5);
      }
      // Twice more: the parts' states and streams are reused.
      for (int k = 0; k < 2; ++k) CHECK(test::rel_error(model.run(in).at("y"), want.at("y")) < 1e-5);
    }
  }
}

TEST_CASE("recurrent ops: Precision::Bf16 runs oneDNN's bf16 primitive, within bf16's error of the reference",
          "[rnn][lower][bf16]") {
  // Where the CPU has native bf16 (elsewhere Precision::Bf16 is refused): X, the hidden states, Y and the
  // weights in bf16, the cell state and bias in f32, X / initial_h / Y / Y_h converted at the edges. Batch 5
  // (below that an fp32 LSTM or GRU keeps Ondine's fp32 recurrence kernel on AVX-512), both thread counts.
  if (!lower::effective_isa().bf16_native) return;
  for (const char* op : {"LSTM", "GRU", "RNN"}) {
    INFO(op);
    Recurrent rnn(op, "bidirectional", 7, 5, 5, 6, false, 0, true, false);
    std::map<std::string, Tensor> in{{"x", test::uniform_tensor({7, 5, 5}, 41, -1.0f, 1.0f)},
                                     {"h0", test::uniform_tensor({2, 5, 6}, 42, -1.0f, 1.0f)}};
    if (std::string(op) == "LSTM") in["c0"] = test::uniform_tensor({2, 5, 6}, 43, -1.0f, 1.0f);
    auto want = ReferenceExecutor(rnn.g).run(in);
    for (int threads : {1, 2}) {
      INFO("threads " << threads);
      lower::CompileOptions options;
      options.threads = threads;
      options.precision = lower::Precision::Bf16;
      auto model = lower::compile(rnn.g, options);
      INFO(model.to_text());
      std::size_t bf16_steps = 0;
      for (const auto& s : model.steps()) bf16_steps += s.op == op && s.detail.find(" bf16 (") != std::string::npos;
      CHECK(bf16_steps == 1);
      auto got = model.run(in);
      for (auto& [name, t] : want) {
        INFO(name);
        // bf16 keeps 8 significant bits (2^-9 relative per rounding): 7 steps of products and gates.
        CHECK(test::rel_error(got.at(name), t) < 3e-2);
        CHECK(test::rel_error(got.at(name), t) > 0);  // it did compute in bf16
      }
    }
  }
  // A GRU tagger's size at batch 16, two threads: in bf16 one bidirectional primitive (oneDNN 2.6's bf16
  // one-direction primitives write a strided half of Y wrongly: errors of 100%+ and, larger, a corrupted
  // heap); in fp32 the two directions side by side.
  for (const bool half : {true, false}) {
    INFO((half ? "bf16" : "fp32"));
    Recurrent big("GRU", "bidirectional", 32, 16, 64, 64, false);
    Tensor x = test::uniform_tensor({32, 16, 64}, 45, -1.0f, 1.0f);
    lower::CompileOptions options;
    options.threads = 2;
    if (half) options.precision = lower::Precision::Bf16;
    auto model = lower::compile(big.g, options);
    std::size_t side_by_side = 0;
    for (const auto& s : model.steps()) side_by_side += s.detail.find("side by side") != std::string::npos;
    CHECK(side_by_side == (half ? 0u : 1u));
    auto want = ReferenceExecutor(big.g).run({{"x", x}});
    for (int k = 0; k < 3; ++k) {
      auto got = model.run({{"x", x}});
      for (auto& [name, t] : want) CHECK(test::rel_error(got.at(name), t) < (half ? 3e-2 : 1e-5));
    }
  }
  // Small batch keeps Ondine's fp32 recurrence, its input projection in bf16 (on AVX-512); keep_fp32 keeps
  // the node fp32.
  for (const char* op : {"LSTM", "GRU"}) {
    INFO(op);
    Recurrent small(op, "bidirectional", 7, 2, 5, 6, false);
    lower::CompileOptions options;
    options.precision = lower::Precision::Bf16;
    auto model = lower::compile(small.g, options);
    INFO(model.to_text());
    std::size_t bf16_projections = 0;
    for (const auto& s : model.steps()) {
      CHECK(s.detail.find(" bf16 (") == std::string::npos);
      bf16_projections += s.name == "rnn:input_projection" && s.detail.find(", bf16") != std::string::npos;
    }
    if (lower::effective_isa().avx512) CHECK(bf16_projections == 1);
    Tensor x = test::uniform_tensor({7, 2, 5}, 44, -1.0f, 1.0f);
    auto want = ReferenceExecutor(small.g).run({{"x", x}});
    auto got = model.run({{"x", x}});
    for (auto& [name, t] : want) CHECK(test::rel_error(got.at(name), t) < 3e-2);
  }
  lower::CompileOptions options;
  options.precision = lower::Precision::Bf16;
  Recurrent kept("GRU", "forward", 7, 5, 5, 6, false);
  options.keep_fp32 = {"rnn"};
  for (const auto& s : lower::compile(kept.g, options).steps()) CHECK(s.detail.find(" bf16 (") == std::string::npos);
}

TEST_CASE("recurrent ops: an fp32 LSTM or GRU at small batch runs Ondine's recurrence kernel, equal to the reference",
          "[rnn][lower][lstm-small-batch]") {
  // lower/detail/recurrence.hpp: the input projection on a oneDNN matmul, then the
  // recurrence, on AVX-512 (16-lane blocks; batch 1 to 4) or AVX2 (8-lane blocks; batch 1 to 16). Hidden sizes
  // on and off the blocks (1 to 4 blocks per call), batches 1 to 8 (rows grouped by up to 4 or 3), every
  // direction, with and without initial states, on 1 and 2 threads. Its tanh and sigmoid are polynomial
  // (absolute error ~3e-7): the bound is the oneDNN path's.
  const char* kernel = lower::detail::recurrence::kernel_name();
  const std::int64_t max_batch = lower::detail::recurrence::max_small_batch(lower::effective_isa().avx512);
  struct Case {
    const char* direction;
    std::int64_t batch, hidden;
    bool states;
  };
  for (const char* op : {"LSTM", "GRU"})  // GRU: linear_before_reset (the helper sets it), PyTorch's
  for (const Case& c : {Case{"forward", 1, 64, false}, Case{"reverse", 1, 37, true}, Case{"bidirectional", 1, 48, true},
                        Case{"bidirectional", 2, 20, false}, Case{"forward", 3, 16, true}, Case{"bidirectional", 4, 33, true},
                        Case{"forward", 1, 5, false}, Case{"bidirectional", 8, 20, true}, Case{"reverse", 7, 64, true}}) {
    INFO(op << " " << c.direction << " batch " << c.batch << " hidden " << c.hidden << (c.states ? " with states" : ""));
    Recurrent lstm(op, c.direction, 9, c.batch, 7, c.hidden, false, 0, c.states, false);
    std::map<std::string, Tensor> in{{"x", test::uniform_tensor({9, c.batch, 7}, 41, -1.0f, 1.0f)}};
    if (c.states) {
      in["h0"] = test::uniform_tensor({lstm.dirs, c.batch, c.hidden}, 42, -1.0f, 1.0f);
      if (std::string(op) == "LSTM") in["c0"] = test::uniform_tensor({lstm.dirs, c.batch, c.hidden}, 43, -1.0f, 1.0f);
    }
    auto want = ReferenceExecutor(lstm.g).run(in);
    for (int threads : {1, 2}) {
      INFO("threads " << threads);
      lower::CompileOptions options;
      options.threads = threads;
      auto model = lower::compile(lstm.g, options);
      std::size_t ours = 0;
      for (const auto& s : model.steps()) ours += s.op == op && kernel && s.implementation == kernel;
      CHECK(ours == (kernel && c.batch <= max_batch ? 1u : 0u));
      for (int k = 0; k < 2; ++k) {  // twice: the per-context state is reset by every run
        auto got = model.run(in);
        for (auto& [name, t] : want) {
          INFO(name);
          CHECK(test::rel_error(got.at(name), t) < 1e-5);
        }
      }
    }
  }
  // Must not fire: a batch above max_batch (oneDNN is faster there) and peepholes stay on oneDNN's LSTM; a
  // GRU without linear_before_reset on oneDNN's GRU.
  auto ours_in = [&](const Graph& g) {
    lower::CompileOptions options;
    options.threads = 1;
    std::size_t count = 0;
    for (const auto& s : lower::compile(g, options).steps()) count += kernel && s.implementation == kernel;
    return count;
  };
  Recurrent plain_gru("GRU", "forward", 4, 1, 3, 16, false);
  for (Node* node : plain_gru.g.nodes())
    if (node->name() == "rnn") node->set_attr("linear_before_reset", std::int64_t{0});
  CHECK(ours_in(plain_gru.g) == 0);
  for (bool peep : {false, true}) {
    Recurrent lstm("LSTM", "forward", 4, peep ? 1 : max_batch + 1, 3, 16, false, 0, peep, peep);
    CHECK(ours_in(lstm.g) == 0);
  }
}

TEST_CASE("recurrent ops: bad input is an error naming the node", "[rnn][bad-input]") {
  Recurrent lstm("LSTM", "forward", 4, 2, 3, 5, true);
  Tensor x = test::uniform_tensor({4, 2, 3}, 5, -0.5f, 0.5f);
  ReferenceExecutor exec(lstm.g);
  CHECK_THROWS_WITH(exec.run({{"x", x}, {"lens", Tensor::from_vector<std::int32_t>({2}, {4, -1})}}),
                    Catch::Contains("rnn") && Catch::Contains("sequence_lens value -1"));
  CHECK_THROWS_WITH(exec.run({{"x", x}, {"lens", Tensor::from_vector<std::int32_t>({2}, {9, 1})}}),
                    Catch::Contains("outside [0, 4]"));

  Graph g;
  Value* xin = g.add_input("x", DType::Float32, Shape{4, 2, 3});
  Value* w = g.add_constant("W", test::uniform_tensor({1, 20, 7}, 1, -0.5f, 0.5f));  // input size 7 for X's 3
  Value* r = g.add_constant("R", test::uniform_tensor({1, 20, 5}, 2, -0.5f, 0.5f));
  g.add_output(g.add_node("LSTM", {xin, w, r}, {"y"}, {{"hidden_size", std::int64_t{5}}}, "lstm")->output(0));
  CHECK_THROWS_WITH(infer_shapes(g), Catch::Contains("lstm") && Catch::Contains("W 'W'"));
}

}  // namespace test_rnn
