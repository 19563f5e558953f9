// Static int8 for LSTM layers: the quantize pass turns a calibrated LSTM into ondine.QLSTM (structure, and
// the layers it must leave alone), the QLSTM's reference kernel against the fp32 LSTM (accuracy), and the
// oneDNN int8 LSTM against that reference (one and two threads, initial states, both directions).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ondine/lower/lower.hpp"
#include "ondine/ondine.hpp"
#include "ondine/quant/calibration.hpp"
#include "ondine/quant/qdq.hpp"
#include "ondine/quant/quantize_dynamic.hpp"
#include "support.hpp"

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_quant_rnn {

using namespace ondine;
using Dims = std::vector<std::int64_t>;

namespace {

// LSTM over X [T, N, I] with constant weights (PyTorch's init range 1/sqrt(H)) and states h0, c0 as inputs.
struct Lstm {
  Graph g;
  std::int64_t seq, batch, input, hidden, dirs;
  Lstm(const std::string& direction, std::int64_t seq_, std::int64_t batch_, std::int64_t input_, std::int64_t hidden_)
      : seq(seq_), batch(batch_), input(input_), hidden(hidden_), dirs(direction == "bidirectional" ? 2 : 1) {
    const float k = 1.0f / std::sqrt(static_cast<float>(hidden));
    Value* x = g.add_input("x", DType::Float32, Shape{seq, batch, input});
    Value* w = g.add_constant("W", test::uniform_tensor({dirs, 4 * hidden, input}, 1, -k, k));
    Value* r = g.add_constant("R", test::uniform_tensor({dirs, 4 * hidden, hidden}, 2, -k, k));
    Value* b = g.add_constant("B", test::uniform_tensor({dirs, 8 * hidden}, 3, -k, k));
    Value* h0 = g.add_input("h0", DType::Float32, Shape{dirs, batch, hidden});
    Value* c0 = g.add_input("c0", DType::Float32, Shape{dirs, batch, hidden});
    std::map<std::string, Attribute> attrs{{"direction", direction}, {"hidden_size", hidden}};
    Node* n = g.add_node("LSTM", {x, w, r, b, nullptr, h0, c0}, {"y", "y_h", "y_c"}, attrs, "lstm");
    for (Value* v : n->outputs()) g.add_output(v);
    infer_shapes(g);
  }
  Node* node() {
    for (Node* n : g.nodes())
      if (n->name() == "lstm") return n;
    return nullptr;
  }
  std::map<std::string, Tensor> inputs(unsigned seed) const {
    return {{"x", test::uniform_tensor({seq, batch, input}, seed, -2.0f, 2.0f)},
            {"h0", test::uniform_tensor({dirs, batch, hidden}, seed + 1, -0.5f, 0.5f)},
            {"c0", test::uniform_tensor({dirs, batch, hidden}, seed + 2, -0.5f, 0.5f)}};
  }
  // The calibration of this graph on 4 seeded samples, and the quantize pass run on it.
  quant::QuantizeReport quantize() {
    std::vector<quant::Sample> samples;
    for (unsigned s = 0; s < 4; ++s) samples.push_back(inputs(100 + 10 * s));
    quant::CalibrationResult calib = quant::calibrate(g, samples);
    quant::QuantizeQDQ pass(calib);
    PassContext ctx;
    pass.run(g, ctx);
    g.verify();
    infer_shapes(g);
    return pass.report();
  }
};

std::size_t count_ops(const Graph& g, const std::string& key) {
  std::size_t n = 0;
  for (const Node* node : g.nodes()) n += node->op_key() == key;
  return n;
}

}  // namespace

TEST_CASE("quantize: a calibrated LSTM becomes ondine.QLSTM with int8 weights and one data quantization",
          "[quant][rnn][qlstm]") {
  Lstm m("bidirectional", 5, 2, 6, 8);
  quant::QuantizeReport report = m.quantize();
  CHECK(report.quantized() == 1);
  CHECK(count_ops(m.g, "LSTM") == 0);
  REQUIRE(count_ops(m.g, "ondine.QLSTM") == 1);
  Node* q = m.node();
  REQUIRE(q != nullptr);  // the name is kept
  CHECK(q->input(1)->dtype() == DType::Int8);
  CHECK(q->input(2)->dtype() == DType::Int8);
  CHECK(q->attr_floats("w_scale").size() == 32u);
  // The data range covers X (in [-2, 2]) and the state (in (-1, 1)): a scale near 4/255, zero point near 128.
  CHECK(q->attr_float("x_scale") == Approx(4.0 / 255).epsilon(0.1));
  CHECK(std::abs(q->attr_int("x_zero_point") - 128) <= 8);
  // Outputs keep their names and stay graph outputs.
  for (std::size_t i = 0; i < 3; ++i) CHECK(q->output(i)->name() == std::vector<std::string>{"y", "y_h", "y_c"}[i]);
  CHECK(m.g.outputs().size() == 3u);
}

TEST_CASE("quantize: LSTMs oneDNN's int8 LSTM cannot run stay fp32, with the reason", "[quant][rnn][qlstm][must-not-fire]") {
  auto check_kept = [](Lstm& m, const std::string& why) {
    quant::QuantizeReport report = m.quantize();
    CHECK(report.quantized() == 0);
    CHECK(count_ops(m.g, "LSTM") == 1);
    CHECK(count_ops(m.g, "ondine.QLSTM") == 0);
    REQUIRE(report.nodes.size() == 1);
    CHECK(report.nodes[0].reason.find(why) != std::string::npos);
  };
  {
    Lstm m("forward", 4, 1, 3, 4);
    m.node()->set_attr("clip", 3.0f);
    check_kept(m, "clip");
  }
  {
    Lstm m("forward", 4, 1, 3, 4);
    m.node()->set_input(7, m.g.add_constant("P", test::uniform_tensor({1, 12}, 9)));
    check_kept(m, "peepholes");
  }
  {
    Lstm m("forward", 4, 1, 3, 4);
    m.node()->set_attr("activations", std::vector<std::string>{"Sigmoid", "Tanh", "Relu"});
    check_kept(m, "activations");
  }
  {
    Lstm m("forward", 4, 2, 3, 4);
    m.node()->set_input(4, m.g.add_constant("lens", Tensor::from_vector<std::int32_t>({2}, {4, 2})));
    check_kept(m, "sequence_lens");
  }
}

TEST_CASE("QLSTM: bad quantization attributes are errors naming the node", "[quant][rnn][qlstm][bad-input]") {
  Lstm m("forward", 4, 1, 3, 4);
  m.quantize();
  Node* q = m.node();
  REQUIRE(q->op_key() == "ondine.QLSTM");
  auto fails_with = [&](const std::string& attr, Attribute value, const std::string& what) {
    Attribute saved = q->attrs().at(attr);
    q->set_attr(attr, std::move(value));
    try {
      infer_shapes(m.g);
      FAIL("no error for " << attr);
    } catch (const Error& e) {
      CHECK(e.node() == "lstm");
      CHECK_THAT(e.what(), Catch::Contains(what));
    }
    CHECK_THROWS_AS(ReferenceExecutor(m.g).run(m.inputs(1)), Error);
    q->set_attr(attr, std::move(saved));
  };
  fails_with("x_scale", -1.0f, "x_scale must be positive");
  fails_with("x_zero_point", std::int64_t{300}, "outside [0, 255]");
  fails_with("w_scale", std::vector<float>{1.0f, 2.0f}, "expected 4 * hidden_size = 16");
}

TEST_CASE("QLSTM: the int8 reference stays close to the fp32 LSTM", "[quant][rnn][qlstm][reference]") {
  Lstm fp32("bidirectional", 12, 3, 16, 32);
  Lstm int8("bidirectional", 12, 3, 16, 32);
  int8.quantize();
  auto in = fp32.inputs(7);
  auto want = ReferenceExecutor(fp32.g).run(in);
  auto got = ReferenceExecutor(int8.g).run(in);
  for (const char* out : {"y", "y_h", "y_c"}) {
    INFO(out);
    double err = test::rel_error(got.at(out), want.at(out));
    CHECK(err < 0.05);
    CHECK(err > 1e-6);  // it is quantized
  }
}

TEST_CASE("QLSTM: compiled onto oneDNN's int8 LSTM, equal to its reference", "[quant][rnn][qlstm][lower]") {
  for (const char* direction : {"forward", "reverse", "bidirectional"}) {
    INFO(direction);
    Lstm m(direction, 9, 3, 10, 16);
    m.quantize();
    auto in = m.inputs(11);
    auto want = ReferenceExecutor(m.g).run(in);
    for (int threads : {1, 2}) {
      INFO("threads " << threads);
      lower::CompileOptions options;
      options.threads = threads;
      std::vector<std::string> log;
      options.log = [&log](const std::string& line) { log.push_back(line); };
      auto model = lower::compile(m.g, options);
      std::size_t on_onednn = 0, int8 = 0;
      for (const auto& s : model.steps()) {
        on_onednn += s.op == "QLSTM" && s.implementation != "reference";
        int8 += s.detail.find("int8") != std::string::npos;
      }
      CHECK(on_onednn >= 1);
      // Without VNNI, weights past +-64 run as fp32 on the dequantized weights, and the log says so.
      bool fp32_fallback = false;
      for (const auto& line : log) fp32_fallback |= line.find("saturate without VNNI") != std::string::npos;
      CHECK((int8 >= 1) != fp32_fallback);
      auto got = model.run(in);
      for (const char* out : {"y", "y_h", "y_c"}) {
        INFO(out);
        // int8 rounds X and the state where the reference does (measured: 1e-7 apart; a rounding tie
        // decided otherwise would move one state by a step); the fp32 fallback skips those roundings.
        CHECK(test::rel_error(got.at(out), want.at(out)) < (fp32_fallback ? 0.05 : 1e-3));
      }
      for (int k = 0; k < 2; ++k) CHECK(test::rel_error(model.run(in).at("y"), got.at("y")) == 0.0);
    }
  }
}

TEST_CASE("QLSTM: the PyTorch LSTM tagger quantized, compiled at two sequence lengths", "[quant][rnn][qlstm][corpus]") {
  // tests/data/torch/lstm_tagger (scripts/make_models.py): Embedding, 2 bidirectional LSTM layers,
  // batch_first, dynamic batch and sequence; case0/case1 hold two input shapes and PyTorch's outputs.
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(ONDINE_TEST_DATA_DIR) / "torch" / "lstm_tagger";
  std::vector<std::map<std::string, Tensor>> inputs;
  std::vector<Tensor> torch_out;
  for (int k = 0; k < 2; ++k) {
    std::string prefix = "case" + std::to_string(k) + ".";
    inputs.push_back({{"input_ids", load_npy((dir / (prefix + "input_ids.npy")).string())}});
    torch_out.push_back(load_npy((dir / (prefix + "out.tags.npy")).string()));
  }
  Graph g = ondine::onnx::load_model((dir / "model.onnx").string());
  std::vector<quant::Sample> samples(inputs.begin(), inputs.end());
  quant::QuantizeQDQ pass(quant::calibrate(g, samples));
  PassContext ctx;
  pass.run(g, ctx);
  CHECK(count_ops(g, "ondine.QLSTM") == 2);
  CHECK(count_ops(g, "LSTM") == 0);
  lower::CompileOptions options;
  options.threads = 2;
  lower::ShapeCache model(g.clone(), options);
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    INFO("case " << k);
    Tensor got = model.run(inputs[k]).at("tags");
    Tensor want = ReferenceExecutor(g).run(inputs[k]).at("tags");
    // oneDNN's int8 LSTM computes QLSTM's definition; without VNNI these 8-bit weights run as fp32 on the
    // dequantized weights (lower/detail/rnn.hpp), which skips the rounding of X and of the state.
    CHECK(test::rel_error(got, want) < (lower::effective_isa().int8_vnni ? 1e-3 : 0.05));
    CHECK(test::rel_error(got, torch_out[k]) < 0.05);  // int8 vs PyTorch's fp32
  }
}

namespace {

// GRU over X [T, N, I] with constant weights (PyTorch's init range) and h0 as an input.
Graph gru_graph(const std::string& direction, std::int64_t seq, std::int64_t batch, std::int64_t input,
                std::int64_t hidden, std::int64_t linear_before_reset) {
  Graph g;
  const std::int64_t dirs = direction == "bidirectional" ? 2 : 1;
  const float k = 1.0f / std::sqrt(static_cast<float>(hidden));
  Value* x = g.add_input("x", DType::Float32, Shape{seq, batch, input});
  Value* w = g.add_constant("W", test::uniform_tensor({dirs, 3 * hidden, input}, 11, -k, k));
  Value* r = g.add_constant("R", test::uniform_tensor({dirs, 3 * hidden, hidden}, 12, -k, k));
  Value* b = g.add_constant("B", test::uniform_tensor({dirs, 6 * hidden}, 13, -k, k));
  Value* h0 = g.add_input("h0", DType::Float32, Shape{dirs, batch, hidden});
  std::map<std::string, Attribute> attrs{
      {"direction", direction}, {"hidden_size", hidden}, {"linear_before_reset", linear_before_reset}};
  Node* n = g.add_node("GRU", {x, w, r, b, nullptr, h0}, {"y", "y_h"}, attrs, "gru");
  for (Value* v : n->outputs()) g.add_output(v);
  infer_shapes(g);
  return g;
}

std::map<std::string, Tensor> gru_inputs(const Graph& g, unsigned seed) {
  std::map<std::string, Tensor> in;
  for (const Value* v : g.inputs()) in[v->name()] = test::uniform_tensor(v->shape().sizes(), seed++, -2.0f, 2.0f);
  return in;
}

Graph quantized_dynamic(Graph g) {
  QuantizeDynamic pass;
  PassContext ctx;
  pass.run(g, ctx);
  g.verify();
  infer_shapes(g);
  return g;
}

}  // namespace

TEST_CASE("quantize-dynamic: a GRU's input projection becomes a dynamic int8 product the GRU reads through a column selection",
          "[quant][rnn][gru][dynamic]") {
  // Structure: DynamicQuantizeLinear + MatMulInteger for X W^T, the GRU unchanged but for its X (the product)
  // and W (EyeLike selections); numbers: the int8 projection stays close to the fp32 GRU; compiled (Ondine's
  // GRU recurrence on AVX-512 and AVX2, which skips the product by the selection; oneDNN's GRU elsewhere) equals the
  // reference of the quantized graph.
  const char* kernel = lower::detail::recurrence::kernel_name();
  struct Case {
    const char* direction;
    std::int64_t batch, hidden, lbr;
  };
  for (const Case& c : {Case{"bidirectional", 3, 20, 1}, Case{"forward", 1, 64, 1}, Case{"reverse", 5, 16, 1},
                        Case{"bidirectional", 1, 48, 0}}) {
    INFO(c.direction << " batch " << c.batch << " hidden " << c.hidden << " linear_before_reset " << c.lbr);
    Graph fp32 = gru_graph(c.direction, 7, c.batch, 10, c.hidden, c.lbr);
    Graph q = quantized_dynamic(fp32.clone());
    CHECK(count_ops(q, "DynamicQuantizeLinear") == 1);
    CHECK(count_ops(q, "MatMulInteger") == 1);
    CHECK(count_ops(q, "GRU") == 1);
    CHECK(count_ops(q, "EyeLike") == (std::string(c.direction) == "bidirectional" ? 2u : 1u));
    auto in = gru_inputs(fp32, 20);
    auto want_fp32 = ReferenceExecutor(fp32).run(in);
    auto want = ReferenceExecutor(q).run(in);
    for (const char* out : {"y", "y_h"}) CHECK(test::rel_error(want.at(out), want_fp32.at(out)) < 0.03);
    for (int threads : {1, 2}) {
      INFO("threads " << threads);
      lower::CompileOptions options;
      options.threads = threads;
      auto model = lower::compile(q, options);
      std::size_t ours = 0;
      for (const auto& s : model.steps()) ours += s.op == "GRU" && kernel && s.implementation == kernel;
      CHECK(ours == (kernel && c.lbr ? 1u : 0u));  // without linear_before_reset: oneDNN's GRU, by S
      for (int k = 0; k < 2; ++k) {
        auto got = model.run(in);
        for (const char* out : {"y", "y_h"}) CHECK(test::rel_error(got.at(out), want.at(out)) < 1e-4);
      }
    }
  }
  // Must not fire: an fp32 GRU (its W is no selection) stays on oneDNN's GRU, and so does one whose W is a
  // selection but for one entry. A batch above max_small_batch: below it an fp32 GRU runs the same recurrence
  // kernel after its own input projection (test_rnn.cpp), which is not what is checked here.
  const std::int64_t b = lower::detail::recurrence::max_small_batch(lower::effective_isa().avx512) + 1;
  Graph fp32 = gru_graph("forward", 4, b, 48, 16, 1);
  Graph near = gru_graph("forward", 4, b, 48, 16, 1);
  for (Node* n : near.nodes())
    if (n->name() == "gru") {
      Tensor sel(DType::Float32, {1, 48, 48});
      for (std::int64_t k = 0; k < 48; ++k) sel.data<float>()[k * 48 + k] = 1.0f;
      sel.data<float>()[5] = 0.5f;
      n->set_input(1, near.add_constant("S", sel));
    }
  for (Graph* g : {&fp32, &near}) {
    lower::CompileOptions options;
    options.threads = 1;
    auto model = lower::compile(*g, options);
    for (const auto& s : model.steps()) CHECK(!(kernel && s.implementation == kernel));
    auto in = gru_inputs(*g, 40);
    CHECK(test::rel_error(model.run(in).at("y"), ReferenceExecutor(*g).run(in).at("y")) < 1e-5);
  }
}

TEST_CASE("quantize-dynamic: the PyTorch GRU tagger, compiled at two sequence lengths", "[quant][rnn][gru][corpus]") {
  // tests/data/torch/gru_tagger (scripts/make_models.py): Embedding, 2 bidirectional GRU layers, batch_first.
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(ONDINE_TEST_DATA_DIR) / "torch" / "gru_tagger";
  Graph g = quantized_dynamic(ondine::onnx::load_model((dir / "model.onnx").string()));
  CHECK(count_ops(g, "MatMulInteger") == 3);  // two GRU projections and the head
  lower::CompileOptions options;
  options.threads = 2;
  lower::ShapeCache model(g.clone(), options);
  for (int k = 0; k < 2; ++k) {
    INFO("case " << k);
    const std::string prefix = "case" + std::to_string(k) + ".";
    std::map<std::string, Tensor> in{{"input_ids", load_npy((dir / (prefix + "input_ids.npy")).string())}};
    Tensor got = model.run(in).at("tags");
    // The second layer quantizes the first one's output at run time: a last-bit difference there (fp32 here,
    // double in the reference) can move a value across a rounding boundary, one quantization step.
    CHECK(test::rel_error(got, ReferenceExecutor(g).run(in).at("tags")) < 1e-2);
    CHECK(test::rel_error(got, load_npy((dir / (prefix + "out.tags.npy")).string())) < 0.05);  // int8 vs PyTorch's fp32
  }
}

}  // namespace test_quant_rnn
