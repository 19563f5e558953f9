// A user-written pass: Div by a constant becomes Mul by its reciprocal, written with Ondine's pattern
// matcher, registered by name, and run in a pipeline string together with the built-in passes. The
// reference executor checks the numbers before and after.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>

#include "ondine/ondine.hpp"

using namespace ondine;

// div-to-mul: x / c -> x * (1 / c), for float32 x and a float32 constant c with no zero: a multiply
// is several times cheaper than a divide. 1/c is rounded once, so results differ from x / c by about
// one float32 ulp. A Div by anything else (an input, an integer) is left alone.
struct DivToMul {
  static constexpr const char* name = "div-to-mul";

  bool run(Graph& g, PassContext& ctx) {
    using namespace pattern;
    auto float32 = [](const Value* v) { return v->dtype() == DType::Float32; };
    auto no_zero = [](const Value* v) {
      const Tensor& c = v->constant();
      for (std::int64_t i = 0; i < c.numel(); ++i)
        if (c.data<float>()[i] == 0.0f) return false;
      return true;
    };
    static const Pattern rule = op("Div", any("x").where(float32), constant("c").where(float32).where(no_zero));

    bool changed = false;
    for (Node* div : g.topo_order()) {
      auto m = match(div, rule);
      if (!m) continue;
      const Tensor& c = m->constant("c");
      Tensor reciprocal(DType::Float32, c.dims());
      for (std::int64_t i = 0; i < c.numel(); ++i) reciprocal.data<float>()[i] = 1.0f / c.data<float>()[i];

      Value* out = div->output(0);
      Value* inverse = g.add_constant(g.unique_name(m->value("c")->name() + "_reciprocal"), reciprocal);
      Value* product = g.add_node("Mul", {m->value("x"), inverse}, {""}, {}, div->name() + "_as_mul")->output(0);
      product->set_dtype(out->dtype());
      product->set_shape(out->shape());
      const std::string what = "'" + div->name() + "': x / c -> x * (1/c)";
      rewrite::replace_value(g, out, product);  // a graph output keeps its name
      rewrite::erase_if_dead(g, m->matched_nodes());
      ctx.rewrite(what);
      changed = true;
    }
    return changed;
  }
};

namespace {

Tensor random_tensor(std::vector<std::int64_t> dims, unsigned seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Tensor t(DType::Float32, std::move(dims));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// y = Relu(Conv(x) / 2) / scale[c] + x / x_scale, where x_scale is an input: that Div must stay.
Graph make_graph() {
  Graph g;
  g.name = "custom_pass_example";
  Value* x = g.add_input("x", DType::Float32, Shape{1, 4, 8, 8});
  Value* x_scale = g.add_input("x_scale", DType::Float32, Shape{1});
  Value* w = g.add_constant("w", random_tensor({4, 4, 3, 3}, 1, -0.5f, 0.5f));
  Value* b = g.add_constant("b", random_tensor({4}, 2, -0.5f, 0.5f));
  Value* two = g.add_constant("two", Tensor::scalar<float>(2.0f));
  Value* scale = g.add_constant("scale", random_tensor({1, 4, 1, 1}, 3, 0.5f, 2.0f));
  Value* conv = g.add_node("Conv", {x, w, b}, {"conv"}, {{"pads", std::vector<std::int64_t>{1, 1, 1, 1}}}, "conv")->output(0);
  Value* half = g.add_node("Div", {conv, two}, {"half"}, {}, "halve")->output(0);
  Value* relu = g.add_node("Relu", {half}, {"relu"}, {}, "relu")->output(0);
  Value* scaled = g.add_node("Div", {relu, scale}, {"scaled"}, {}, "per_channel")->output(0);
  Value* skip = g.add_node("Div", {x, x_scale}, {"skip"}, {}, "by_input")->output(0);
  g.add_output(g.add_node("Add", {scaled, skip}, {"y"}, {}, "add")->output(0));
  infer_shapes(g);
  return g;
}

void print_ops(const char* title, const Graph& g) {
  std::map<std::string, int> ops;  // by op_key(): Ondine's own ops show as "ondine.<op>"
  for (const Node* n : g.nodes()) ++ops[n->op_key()];
  std::printf("%s:", title);
  for (auto& [op, n] : ops) std::printf(" %s=%d", op.c_str(), n);
  std::printf("\n");
}

}  // namespace

int main() {
  // The pass becomes nameable in pipelines, next to the built-ins ("default" is the default pipeline).
  pass_registry().add<DivToMul>();
  PassManager pm = make_pass_manager("div-to-mul,default");

  Graph g = make_graph();
  Graph original = g.clone();
  pm.run(g);
  print_ops("before", original);
  print_ops("after ", g);
  std::printf("%s", pm.summary_text().c_str());

  // The oracle: both graphs on the reference executor, same seeded inputs.
  std::map<std::string, Tensor> inputs{{"x", random_tensor({1, 4, 8, 8}, 10, -1.0f, 1.0f)},
                                       {"x_scale", Tensor::from_vector<float>({1}, {3.0f})}};
  Tensor want = ReferenceExecutor(original).run(inputs).at("y");
  Tensor got = ReferenceExecutor(g).run(inputs).at("y");
  double err = 0, scale = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    err = std::max(err, std::abs(double(got.data<float>()[i]) - want.data<float>()[i]));
    scale = std::max(scale, std::abs(double(want.data<float>()[i])));
  }
  double rel = err / scale;
  std::size_t rewrites = pm.records().front().rewrites;  // div-to-mul ran first
  bool ok = rewrites == 2 && g.count_ops("Div") == 1 && scale > 0 && rel <= 1e-5;
  std::printf("div-to-mul: %zu rewrites, Div left: %zu (the one by an input); max relative error %.2e: %s\n", rewrites,
              g.count_ops("Div"), rel, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
