// SPDX-License-Identifier: Apache-2.0
// ondine/quant/quantize_dynamic.hpp - quantize-dynamic: dynamic int8 quantization of MatMul and Gemm
// with constant float32 weights, and of GRU's input projection (Rewriter::rewrite_gru), in the standard ONNX form (the one ONNX Runtime's quantize_dynamic
// writes): the activation's range is measured on every call, the weight's once, here.
//
//   MatMul(x, W)  ->  Mul(Cast<float>(MatMulInteger(xq, Wq, x_zp, W_zp)), x_scale * W_scale)
//                     with (xq, x_scale, x_zp) = DynamicQuantizeLinear(x)
//   Gemm(x, W, C; alpha, beta, transB)  ->  the same with Wq from W (transposed when transB) and the
//                     scale alpha * W_scale, then Add(.., beta * C) when C is given
//
// x is quantized to uint8 over its range widened to include 0 (DynamicQuantizeLinear); W to int8,
// symmetric ([-127, 127], zero point 0), one scale per output column (MatMulInteger's per-column
// b_zero_point; the default) or one for the whole tensor (option "quantize-dynamic.per-channel" = "0").
// Option "quantize-dynamic.reduce-range" = "1": 7-bit weights ([-64, 64]), which int8 kernels without
// VNNI compute exactly (their 16-bit pair sums saturate past that); the compiled form then runs there.
// Readers of one x share one DynamicQuantizeLinear. Not in the default pipeline: it trades accuracy
// (about 1e-2 relative on a BERT-style encoder) for int8 matrix products, and is asked for by name.
// Preconditions (else the node is left as it is): ONNX domain; x float32; W a float32 2-D constant;
// Gemm without transA, with C absent or constant. The output keeps its name (a graph output stays one).
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "ondine/ir/shape_inference.hpp"
#include "ondine/passes/detail/fusion.hpp"
#include "ondine/passes/pass.hpp"
#include "ondine/passes/pipeline.hpp"
#include "ondine/quant/observers.hpp"

namespace ondine {

namespace detail::qdyn {

inline Node* add_inferred(Graph& g, const std::string& op, const std::vector<Value*>& in, std::size_t outputs,
                          const std::string& base, std::map<std::string, Attribute> attrs, const std::string& name) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < outputs; ++i) names.push_back(g.unique_name(base + (outputs > 1 ? "." + std::to_string(i) : "")));
  Node* n = g.add_node(op, in, names, std::move(attrs), name);
  auto it = infer_table().find(n->op_key());
  if (it != infer_table().end()) it->second(*n);
  return n;
}

// W [K, N] float32 -> int8 symmetric, per column or per tensor.
struct QuantWeight {
  Tensor q;       // int8 [K, N]
  Tensor scale;   // float32 [N] or []
  Tensor zero;    // int8 zeros, like scale
};
inline QuantWeight quantize_weight(const Tensor& w, bool per_column, bool reduce_range) {
  std::int64_t k = w.dims()[0], n = w.dims()[1];
  const float* p = w.data<float>();
  quant::Range r;
  std::size_t cols = per_column ? static_cast<std::size_t>(n) : 1;
  r.min.assign(cols, 0.0f);
  r.max.assign(cols, 0.0f);
  if (per_column) r.axis = 1;
  for (std::int64_t i = 0; i < k; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      std::size_t c = per_column ? static_cast<std::size_t>(j) : 0;
      r.min[c] = std::min(r.min[c], p[i * n + j]);
      r.max[c] = std::max(r.max[c], p[i * n + j]);
    }
  quant::QuantParams qp = quant::compute_params(r, quant::QuantScheme{DType::Int8, true, reduce_range});
  QuantWeight out;
  out.q = quant::quantize(w, qp);
  std::vector<std::int64_t> dims = per_column ? std::vector<std::int64_t>{n} : std::vector<std::int64_t>{};
  out.scale = Tensor::from_vector<float>(dims, qp.scale);
  out.zero = Tensor(DType::Int8, dims);
  return out;
}

inline Tensor transposed(const Tensor& w) {
  std::int64_t r = w.dims()[0], c = w.dims()[1];
  Tensor t(DType::Float32, {c, r});
  const float* s = w.data<float>();
  float* d = t.data<float>();
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t j = 0; j < c; ++j) d[j * r + i] = s[i * c + j];
  return t;
}

inline bool is_f32_matrix_constant(const Value* v) {
  return v && v->is_constant() && v->dtype() == DType::Float32 && v->constant().rank() == 2;
}

class Rewriter {
 public:
  Rewriter(Graph& g, bool per_column, bool reduce_range) : g_(g), per_column_(per_column), reduce_range_(reduce_range) {}

  // Returns false (graph untouched) when the node does not qualify.
  bool rewrite(Node& n) {
    bool gemm = n.op_type() == "Gemm";
    Value *x = n.input(0), *w = n.input(1), *c = gemm ? n.input(2) : nullptr;
    if (!x || x->dtype() != DType::Float32 || !is_f32_matrix_constant(w)) return false;  // x float32, W a constant matrix
    float alpha = 1.0f, beta = 1.0f;
    Tensor wt = w->constant();
    if (gemm) {
      if (n.attr_int("transA", 0) != 0) return false;                                    // x must be [M, K] as given
      if (c && (!c->is_constant() || c->dtype() != DType::Float32)) return false;        // the bias folds with beta
      alpha = n.attr_float("alpha", 1.0f);
      beta = n.attr_float("beta", 1.0f);
      if (n.attr_int("transB", 0) != 0) wt = transposed(wt);
    }
    QuantWeight qw = quantize_weight(wt, per_column_, reduce_range_);
    if (alpha != 1.0f)
      for (std::int64_t i = 0; i < qw.scale.numel(); ++i) qw.scale.data<float>()[i] *= alpha;
    Node* dql = dynamic_quantize(x);
    std::string base = n.output(0)->name();
    Value* wq = g_.add_constant(g_.unique_name(w->name() + ".quantized"), qw.q);
    Value* wz = g_.add_constant(g_.unique_name(w->name() + ".zero_point"), qw.zero);
    Value* ws = g_.add_constant(g_.unique_name(w->name() + ".scale"), qw.scale);
    Node* mmi = add_inferred(g_, "MatMulInteger", {dql->output(0), wq, dql->output(2), wz}, 1, base + ".int32", {},
                             n.name() + "/matmul_integer");
    Node* cast = add_inferred(g_, "Cast", {mmi->output(0)}, 1, base + ".float",
                              {{"to", static_cast<std::int64_t>(1)}}, n.name() + "/cast");  // 1: FLOAT
    Node* scale = add_inferred(g_, "Mul", {dql->output(1), ws}, 1, base + ".scale", {}, n.name() + "/scale");
    Value* y = n.output(0);
    bool has_bias = c && beta != 0.0f;
    if (!has_bias) {
      detail::fusion::add_replacement(g_, y, "Mul", {cast->output(0), scale->output(0)}, {}, n.name(), "", g_.opset(""));
    } else {
      Tensor bias = c->constant().clone();
      if (beta != 1.0f)
        for (std::int64_t i = 0; i < bias.numel(); ++i) bias.data<float>()[i] *= beta;
      Value* b = g_.add_constant(g_.unique_name(c->name() + ".scaled"), bias);
      Node* mul = add_inferred(g_, "Mul", {cast->output(0), scale->output(0)}, 1, base + ".product", {},
                               n.name() + "/rescale");
      detail::fusion::add_replacement(g_, y, "Add", {mul->output(0), b}, {}, n.name() + "/bias", "", g_.opset(""));
    }
    g_.remove_node(&n);
    return true;
  }

  // GRU(X, W, R, B, ...) -> GRU(G, S, R, B, ...) with G = X Wcat (Wcat [I, D*3H], every direction's W
  // transposed side by side) rewritten as a dynamic int8 matrix product above, and S [D, 3H, D*3H] the
  // selection of direction d's columns of G (S[d][k][j] = 1 when j = d*3H + k): what GRU computes from X W^T
  // it now computes from G S^T = the same product, so every attribute keeps its meaning. S is written as
  // nodes (ConstantOfShape, EyeLike with k = d*3H, Reshape, Concat: opsets 9 and up), not as a stored
  // tensor of (D*3H)^2 D floats; constant folding builds it. A runtime that knows the pattern skips the
  // product by S (Ondine: lower/detail/recurrence.hpp); any other computes it.
  bool rewrite_gru(Node& n) {
    Value *x = n.input(0), *w = n.num_inputs() > 1 ? n.input(1) : nullptr;
    if (!x || x->dtype() != DType::Float32 || x->shape().rank() != 3 || n.attr_int("layout", 0) != 0) return false;
    if (!w || !w->is_constant() || w->dtype() != DType::Float32 || w->constant().rank() != 3) return false;
    const std::int64_t dirs = w->constant().dims()[0], rows = w->constant().dims()[1], in = w->constant().dims()[2];
    // W [D, 3H, I] -> Wcat [I, D*3H].
    Tensor wcat(DType::Float32, {in, dirs * rows});
    const float* src = w->constant().data<float>();
    for (std::int64_t d = 0; d < dirs; ++d)
      for (std::int64_t k = 0; k < rows; ++k)
        for (std::int64_t i = 0; i < in; ++i) wcat.data<float>()[i * dirs * rows + d * rows + k] = src[(d * rows + k) * in + i];
    const std::string base = n.name() + "/input_projection";
    Value* wc = g_.add_constant(g_.unique_name(w->name() + ".concatenated"), wcat);
    Node* mm = add_inferred(g_, "MatMul", {x, wc}, 1, base, {}, base);
    const std::string product_name = mm->output(0)->name();  // the rewrite's result takes this name
    if (!rewrite(*mm)) {  // cannot happen for a float32 constant matrix; leave the GRU as it was
      g_.remove_node(mm);
      return false;
    }
    auto int64s = [&](const std::string& name, std::vector<std::int64_t> v) {
      return g_.add_constant(g_.unique_name(name), Tensor::from_vector<std::int64_t>({static_cast<std::int64_t>(v.size())}, v));
    };
    Node* zeros = add_inferred(g_, "ConstantOfShape", {int64s(base + ".selection_shape", {rows, dirs * rows})}, 1,
                               base + ".zeros", {}, base + "/zeros");
    zeros->set_opset(std::max(9, zeros->opset()));
    std::vector<Value*> parts;
    for (std::int64_t d = 0; d < dirs; ++d) {
      Node* eye = add_inferred(g_, "EyeLike", {zeros->output(0)}, 1, base + ".selection" + std::to_string(d),
                               {{"k", d * rows}}, base + "/select" + std::to_string(d));
      eye->set_opset(std::max(9, eye->opset()));
      Node* reshaped = add_inferred(g_, "Reshape", {eye->output(0), int64s(base + ".selection_dims", {1, rows, dirs * rows})},
                                    1, base + ".selection" + std::to_string(d) + ".3d", {},
                                    base + "/select" + std::to_string(d) + "_3d");
      parts.push_back(reshaped->output(0));
    }
    Value* selection = parts[0];
    if (dirs > 1)
      selection = add_inferred(g_, "Concat", parts, 1, base + ".selection", {{"axis", std::int64_t{0}}}, base + "/selection")
                      ->output(0);
    Value* product = g_.find_value(product_name);  // the int8 product, rescaled to float
    if (!product) throw Error("internal: quantize-dynamic lost the projection of GRU '" + n.name() + "'");
    n.set_input(0, product);
    n.set_input(1, selection);
    return true;
  }

 private:
  // One DynamicQuantizeLinear per activation, shared by all its quantized readers.
  Node* dynamic_quantize(Value* x) {
    auto it = dql_.find(x);
    if (it != dql_.end()) return it->second;
    Node* d = add_inferred(g_, "DynamicQuantizeLinear", {x}, 3, x->name() + ".quantized", {},
                           x->name() + "/dynamic_quantize");
    d->set_opset(std::max(11, d->opset()));
    return dql_[x] = d;
  }

  Graph& g_;
  bool per_column_, reduce_range_;
  std::unordered_map<const Value*, Node*> dql_;
};

}  // namespace detail::qdyn

struct QuantizeDynamic {
  static constexpr const char* name = "quantize-dynamic";

  bool run(Graph& g, PassContext& ctx) {
    bool per_column = ctx.option("quantize-dynamic.per-channel", "1") != "0";
    bool reduce_range = ctx.option("quantize-dynamic.reduce-range", "0") != "0";
    detail::qdyn::Rewriter rw(g, per_column, reduce_range);
    bool changed = false;
    for (Node* n : g.topo_order()) {
      if (n->domain().empty() && n->op_type() == "GRU") {
        std::string what = "'" + n->name() + "' (GRU)";
        if (!rw.rewrite_gru(*n)) continue;
        ctx.rewrite(what + " -> its input projection as DynamicQuantizeLinear, MatMulInteger (int8 weights, " +
                    (per_column ? "per column" : "per tensor") + "), then the GRU on it through a column selection");
        changed = true;
        continue;
      }
      if (!n->domain().empty() || (n->op_type() != "MatMul" && n->op_type() != "Gemm")) continue;
      std::string what = "'" + n->name() + "' (" + n->op_type() + ")";
      if (!rw.rewrite(*n)) continue;
      ctx.rewrite(what + " -> DynamicQuantizeLinear, MatMulInteger (int8 weights, " +
                  (per_column ? "per column" : "per tensor") + ")");
      changed = true;
    }
    if (changed) g.remove_dead_values();
    return changed;
  }
};

// Makes "quantize-dynamic" nameable in pipelines ("quantize-dynamic,default"). Registered from quant/, so
// passes/ never includes quant/; lower/lower.hpp calls this at start-up.
inline void register_quantize_dynamic_pass() {
  if (!pass_registry().contains(QuantizeDynamic::name)) pass_registry().add<QuantizeDynamic>();
}

}  // namespace ondine
