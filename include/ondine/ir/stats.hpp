// SPDX-License-Identifier: Apache-2.0
// ondine/ir/stats.hpp - parameter and FLOP counts of a graph (for `ondine inspect` and benchmarks),
// and binding a graph's inputs: symbolic dims to sizes (bind_dims), inputs whose values decide shapes
// to those values (shape_inputs, bind_shape_inputs).
//
// FLOPs count a multiply-add as 2. Conv/ConvTranspose/MatMul/Gemm and their integer and fused forms
// (ConvInteger, QLinearConv, MatMulInteger, QLinearMatMul, ondine.QConv/QMatMul/DynQMatMul/DynQConv/Fused*), the
// recurrent ops (LSTM, GRU, RNN, ondine.QLSTM: their gate products per step) and ondine.Attention (its two
// products) are counted exactly from shapes; other ops as one FLOP per output element (they are
// bandwidth-bound and small next to the matmuls).
// Shapes must be static: bind symbolic dims first (bind_dims) and re-run shape inference.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ondine/ir/graph.hpp"
#include "ondine/ir/shape_inference.hpp"

namespace ondine {

struct GraphStats {
  std::int64_t parameters = 0;        // elements of all constants
  std::int64_t parameter_bytes = 0;
  std::optional<double> flops;        // nullopt when some shape is not static
  std::map<std::string, double> flops_by_op;  // keyed by Node::op_key()
};

// Replaces named symbolic dims of the graph inputs by sizes (e.g. {"batch", 8}) and re-infers shapes.
// A named dim without a binding stays symbolic; a binding naming no dim is an error.
inline void bind_dims(Graph& g, const std::map<std::string, std::int64_t>& sizes) {
  std::map<std::string, bool> used;
  for (auto& [k, v] : sizes) {
    // Zero is a size: no detection, no proposal at one level of a feature pyramid (ONNX Runtime runs it).
    if (v < 0) throw Error("dim '" + k + "' must be bound to a size >= 0, got " + std::to_string(v));
    used[k] = false;
  }
  for (Value* in : g.inputs()) {
    if (!in->shape().rank_known()) continue;
    Shape s = in->shape();
    for (auto& d : s.dims())
      if (!d.is_static())
        if (auto it = sizes.find(d.symbol); it != sizes.end()) {
          d = Dim(it->second);
          used[it->first] = true;
        }
    in->set_shape(s);
  }
  for (auto& [k, u] : used)
    if (!u) throw Error("--dim " + k + ": the model has no input dim named '" + k + "'");
  infer_shapes(g);
}

// True when input `index` of `n` is a shape parameter: its values decide the shape of the output
// (Reshape's shape, Expand's, Tile's repeats, ConstantOfShape's, Range's bounds, Slice's starts, ends,
// axes and steps, Pad's pads, Resize's scales and sizes, Split's split, (Un)Squeeze's and reductions'
// axes, TopK's k, OneHot's depth, MaxUnpool's output_shape, the signal ops' sizes: the windows' size,
// MelWeightMatrix's num_mel_bins and dft_length, STFT's frame_step and frame_length, DFT's dft_length and
// opset-20 axis).
inline bool is_shape_parameter(const Node& n, std::size_t index) {
  if (!n.domain().empty()) return false;
  const std::string& op = n.op_type();
  if (op == "Range") return index <= 2;
  if (op == "ConstantOfShape") return index == 0;
  if (op == "Slice") return index >= 1 && index <= 4;
  if (op == "Resize") return index == 2 || index == 3;
  if (op == "MaxUnpool") return index == 2;
  if (op == "HannWindow" || op == "HammingWindow" || op == "BlackmanWindow") return index == 0;
  if (op == "MelWeightMatrix") return index <= 1;
  if (op == "STFT") return index == 1 || index == 3;
  if (op == "DFT") return index == 1 || (index == 2 && n.opset() >= 20);
  if (index != 1) return false;
  return op == "Reshape" || op == "Expand" || op == "Tile" || op == "Pad" || op == "Split" || op == "Squeeze" ||
         op == "Unsqueeze" || op == "TopK" || op == "OneHot" || op == "Upsample" || op == "CenterCropPad" || op == "AffineGrid" ||
         op.rfind("Reduce", 0) == 0;
}

// The graph inputs whose values decide shapes: numeric tensors of a static shape with at most
// infer::kMaxShapeValueElements elements that reach a shape parameter, directly or through nodes whose
// outputs are such small tensors too (Concat, Cast, Add, ...). The ONNX test suite passes Reshape's
// shape this way; a compiled model needs it as a number, so a run binds it (bind_shape_inputs) and
// lower::ShapeCache compiles once per value, as it does per input shape.
inline std::vector<Value*> shape_inputs(const Graph& g) {
  auto small = [](const Value* v) {
    if (!v || !(is_integer(v->dtype()) || is_floating(v->dtype())) || !v->shape().is_static()) return false;
    auto n = v->shape().numel();
    return n && *n <= infer::kMaxShapeValueElements;
  };
  std::vector<Value*> out;
  for (Value* in : g.inputs()) {
    if (!small(in) || in->is_graph_output()) continue;
    std::vector<const Value*> work{in};
    std::set<const Value*> seen{in};
    bool decides = false;
    while (!work.empty() && !decides) {
      const Value* v = work.back();
      work.pop_back();
      for (const Use& u : v->uses()) {
        if (is_shape_parameter(*u.node, u.index)) {
          decides = true;
          break;
        }
        for (const Value* o : u.node->outputs())
          if (small(o) && seen.insert(o).second) work.push_back(o);
      }
    }
    if (decides) out.push_back(in);
  }
  return out;
}

// Every reader of a shape input (shape_inputs) reads a constant holding its value in `inputs` instead,
// and shapes are inferred again. The input stays in the interface (a caller still passes it); values
// missing from `inputs` leave their input as it is. The compiled result is only valid for these values.
inline void bind_shape_inputs(Graph& g, const std::map<std::string, Tensor>& inputs) {
  bool bound = false;
  for (Value* in : shape_inputs(g)) {
    auto it = inputs.find(in->name());
    if (it == inputs.end()) continue;
    const Tensor& t = it->second;
    if (t.dtype() != in->dtype() || t.dims() != in->shape().sizes())
      throw Error("input '" + in->name() + "' is " + std::string(dtype_name(t.dtype())) + dims_str(t.dims()) +
                  ", expected " + Graph::value_type_str(in));
    g.replace_all_uses(in, g.add_constant(g.unique_name(in->name() + ".value"), t.clone()));
    bound = true;
  }
  if (bound) infer_shapes(g);
}

// The named symbolic dims of the graph inputs, in order of first appearance.
inline std::vector<std::string> symbolic_dims(const Graph& g) {
  std::vector<std::string> out;
  for (Value* in : g.inputs())
    if (in->shape().rank_known())
      for (auto& d : in->shape().dims())
        if (!d.is_static() && !d.symbol.empty() && std::find(out.begin(), out.end(), d.symbol) == out.end())
          out.push_back(d.symbol);
  return out;
}

// Gives every unknown dim of the graph inputs (`?`: no size, no dim_param, as some exporters write
// `float32[?, ?]`) a name of its own, "<input>_dim<axis>", so that it binds from the inputs like a named dim;
// re-infers the shapes when it named any. Returns how many it named.
inline std::size_t name_unknown_input_dims(Graph& g) {
  std::size_t named = 0;
  for (Value* in : g.inputs()) {
    if (!in->shape().rank_known() || !in->is_tensor()) continue;
    std::vector<Dim> dims = in->shape().dims();
    bool changed = false;
    for (std::size_t i = 0; i < dims.size(); ++i)
      if (!dims[i].is_static() && dims[i].symbol.empty()) {
        dims[i] = Dim::named(in->name() + "_dim" + std::to_string(i));
        changed = true;
        ++named;
      }
    if (changed) in->set_shape(Shape(dims));
  }
  if (named) infer_shapes(g);
  return named;
}

namespace detail {
inline std::optional<double> node_flops(const Node& n) {
  auto numel = [](const Value* v) -> std::optional<double> {
    if (!v) return std::nullopt;
    auto k = v->shape().numel();
    return k ? std::optional<double>(static_cast<double>(*k)) : std::nullopt;
  };
  const Value* out = n.output(0);
  auto out_elems = numel(out);
  if (!out_elems) return std::nullopt;
  // Ondine's fused ops cost what the op they extend costs (their post-ops are noise next to it), and
  // the integer forms what the float op does (a multiply-add is 2 operations of either kind).
  const std::string key = n.op_key();
  const bool conv_like = key == "ondine.FusedConv" || key == "ondine.QConv" || key == "ConvInteger" ||
                         key == "QLinearConv" || key == "ondine.DynQConv";
  const bool matmul_like = key == "ondine.FusedMatMul" || key == "ondine.QMatMul" || key == "ondine.DynQMatMul" ||
                           key == "MatMulInteger" || key == "QLinearMatMul";
  const std::string op = conv_like ? "Conv" : matmul_like ? "MatMul" : key == "ondine.FusedGemm" ? "Gemm" : key;
  if (op == "Conv" || op == "ConvTranspose") {
    const Value* w = n.input(key == "QLinearConv" || key == "ondine.DynQConv" ? 3 : 1);
    if (!w || !w->shape().is_static() || w->shape().rank() < 3) return std::nullopt;
    auto ws = w->shape().sizes();
    double per_output = 1;  // multiply-adds per output element: (Cin/groups) * kernel volume
    for (std::size_t i = 1; i < ws.size(); ++i) per_output *= static_cast<double>(ws[i]);
    if (op == "ConvTranspose") {  // each input element scatters Cout/groups * kernel volume
      auto in_elems = numel(n.input(0));
      if (!in_elems) return std::nullopt;
      return 2.0 * *in_elems * per_output;
    }
    return 2.0 * *out_elems * per_output;
  }
  if (op == "MatMul" || op == "Gemm") {
    const Value* a = n.input(0);
    if (!a || !a->shape().is_static() || a->shape().rank() == 0) return std::nullopt;
    auto as = a->shape().sizes();
    bool trans_a = op == "Gemm" && n.attr_int("transA", 0);
    double k = static_cast<double>(trans_a ? as.front() : as.back());
    return 2.0 * *out_elems * k;
  }
  if (op == "LSTM" || op == "GRU" || op == "RNN" || key == "ondine.QLSTM") {  // per step and direction: G*H x (I + H) MACs
    const Value* x = n.input(0);
    const Value* r = n.input(2);
    if (!x || !r || !x->shape().is_static() || !r->shape().is_static() || x->shape().rank() != 3 || r->shape().rank() != 3)
      return std::nullopt;
    double gates_hidden = static_cast<double>(r->shape().sizes()[1]);  // G*H
    double inner = static_cast<double>(x->shape().sizes()[2] + r->shape().sizes()[2]);
    return 2.0 * *out_elems / static_cast<double>(r->shape().sizes()[2]) * gates_hidden * inner;  // Y is [T,D,N,H]
  }
  if (key == "ondine.Attention") {  // Q K^T and P V: [..., Sq, D] x [..., D, Sk], [..., Sq, Sk] x [..., Sk, Dv]
    const Value* k = n.input(1);
    const Value* q = n.input(0);
    if (!k || !q || !k->shape().is_static() || !q->shape().is_static() || k->shape().rank() < 2) return std::nullopt;
    double sk = static_cast<double>(k->shape().sizes().back());
    return 2.0 * *numel(q) * sk + 2.0 * *out_elems * sk;
  }
  return *out_elems;
}
}  // namespace detail

inline GraphStats graph_stats(const Graph& g) {
  GraphStats s;
  for (Value* c : g.constants()) {
    s.parameters += c->constant().numel();
    s.parameter_bytes += static_cast<std::int64_t>(c->constant().nbytes());
  }
  double total = 0;
  bool known = true;
  for (Node* n : g.nodes()) {
    auto f = detail::node_flops(*n);
    if (!f) {
      known = false;
      continue;
    }
    total += *f;
    s.flops_by_op[n->op_key()] += *f;
  }
  if (known) s.flops = total;
  return s;
}

}  // namespace ondine
