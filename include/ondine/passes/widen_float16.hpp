// SPDX-License-Identifier: Apache-2.0
// ondine/passes/widen_float16.hpp - widen-float16: a float16 model computed in float32.
//
// Why: models are shipped in float16 to halve their download (web and edge packages, exports made for
// GPUs), and CPUs without native float16 arithmetic run them fastest in float32: every compiled kernel
// (convolutions, matrix products, attention) takes float32, and float16 values would leave each node on
// its reference kernel. ONNX Runtime's CPU provider does the same (it inserts Casts around its float32
// kernels); here the whole graph moves at once, so no Cast pair is left between two nodes.
//
// Rewrites, on the main graph:
//   every float16 value inside the graph        -> float32 (a float16 constant converted once, exactly)
//   Cast(x, to = float16)                        -> Cast(x, to = float32)  (then an identity for a float32 x:
//                                                  remove-identity drops it, so a model with float32 inputs
//                                                  and outputs keeps no Cast at all)
//   ConstantOfShape / EyeLike / Random* / Bernoulli producing float16 -> the same producing float32
//   a float16 graph input                         -> Cast(input, to = float32) for its readers
//   a float16 graph output                        -> Cast(value, to = float16) under the output's name
// The model's interface is unchanged (its inputs and outputs keep their names and float16 dtypes).
// What changes: values are no longer rounded to float16 between nodes, so results are closer to the exact
// ones than the float16 reference executor's, and a value beyond float16's range (65504) stays finite
// inside the graph instead of becoming infinite (the outputs still round to float16). Preconditions: no
// subgraph (If, Loop, Scan) holds a float16 value and no node is of an op whose meaning depends on a
// float16 dtype otherwise (a Cast to float16 followed by a bit-level op: none in ONNX); else the graph is
// left as it is and the log says why.
#pragma once

#include <string>
#include <vector>

#include "ondine/ir/graph.hpp"
#include "ondine/passes/pass.hpp"

namespace ondine {

namespace detail::widen_float16 {

constexpr std::int64_t kOnnxFloat = 1;     // TensorProto.FLOAT
constexpr std::int64_t kOnnxFloat16 = 10;  // TensorProto.FLOAT16

// The same values as float32 (float16 -> float32 is exact).
inline Tensor widened(const Tensor& t) { return Tensor::from_vector<float>(t.dims(), t.to_floats()); }

// A graph (or subgraph) holds a float16 value anywhere: an input, a constant or a node output.
inline bool holds_float16(const Graph& g) {
  for (const Value* v : g.inputs())
    if (v->dtype() == DType::Float16) return true;
  for (const Value* v : g.constants())
    if (v->dtype() == DType::Float16) return true;
  for (const Node* n : g.topo_order()) {
    for (const Value* v : n->outputs())
      if (v && v->dtype() == DType::Float16) return true;
    for (auto& [attr, sub] : n->subgraphs())
      if (holds_float16(*sub)) return true;
  }
  return false;
}

// The node's attribute naming its output dtype as float16 becomes float32; true when there was one.
inline bool widen_dtype_attribute(Node& n) {
  const std::string& op = n.op_type();
  if (!n.domain().empty()) return false;
  const char* attr = op == "Cast" ? "to"
                     : (op == "EyeLike" || op == "RandomNormal" || op == "RandomUniform" || op == "RandomNormalLike" ||
                        op == "RandomUniformLike" || op == "Bernoulli")
                         ? "dtype"
                         : nullptr;
  if (attr && n.has_attr(attr) && n.attr_int(attr, 0) == kOnnxFloat16) {
    n.set_attr(attr, Attribute{kOnnxFloat});
    return true;
  }
  if (op == "ConstantOfShape" && n.has_attr("value")) {
    const Tensor& value = std::get<Tensor>(n.attrs().at("value"));
    if (value.dtype() == DType::Float16) {
      n.set_attr("value", Attribute{widened(value)});
      return true;
    }
  }
  return false;
}

}  // namespace detail::widen_float16

struct WidenFloat16 {
  static constexpr const char* name = "widen-float16";

  bool run(Graph& g, PassContext& ctx) {
    namespace d = detail::widen_float16;
    if (!d::holds_float16(g)) return false;
    for (const Node* n : g.topo_order())
      for (auto& [attr, sub] : n->subgraphs())
        if (d::holds_float16(*sub)) {
          ctx.rewrite("left float16: node '" + n->name() + "' (" + n->op_type() + ") has a float16 value in its '" +
                      attr + "' subgraph");
          return false;
        }
    std::size_t changed = 0;
    // Inputs: their readers read a float32 copy.
    for (Value* in : std::vector<Value*>(g.inputs())) {
      if (in->dtype() != DType::Float16 || !in->has_uses()) continue;
      const std::string wide_name = g.unique_name(in->name() + ".float32");
      Node* cast = g.add_node("Cast", {in}, {wide_name}, {{"to", Attribute{d::kOnnxFloat}}}, wide_name);
      Value* wide = cast->output(0);
      wide->set_dtype(DType::Float32);
      wide->set_shape(in->shape());
      for (const Use& u : std::vector<Use>(in->uses()))
        if (u.node != cast) u.node->set_input(u.index, wide);
      ++changed;
    }
    // Outputs: computed in float32, rounded to float16 under their own names.
    std::vector<std::pair<Value*, Value*>> outputs;  // (value as computed, the graph output Cast)
    for (Value* out : std::vector<Value*>(g.outputs())) {
      if (out->dtype() != DType::Float16 || out->is_graph_input() || out->is_constant() || !out->producer()) continue;
      const std::string name = out->name();
      Node* cast = g.add_node("Cast", {out}, {g.unique_name(name + ".float16")}, {{"to", Attribute{d::kOnnxFloat16}}},
                              g.unique_name(name + ".float16"));
      Value* narrow = cast->output(0);
      narrow->set_dtype(DType::Float16);
      narrow->set_shape(out->shape());
      const std::vector<Use> readers = out->uses();  // they keep reading the float32 value
      g.replace_all_uses(out, narrow);                // the output slot (and the readers, put back below)
      for (const Use& u : readers) u.node->set_input(u.index, out);
      g.rename_value(out, g.unique_name(name + ".float32"));
      g.rename_value(narrow, name);
      outputs.emplace_back(out, narrow);
      ++changed;
    }
    // Everything in between: constants converted, dtypes and dtype attributes widened.
    for (Value* c : g.constants())
      if (c->dtype() == DType::Float16 && !c->is_graph_output()) {
        c->set_constant(d::widened(c->constant()));
        c->set_dtype(DType::Float32);
        ++changed;
      }
    for (Node* n : g.topo_order()) {
      bool own_cast = false;
      for (auto& [value, cast] : outputs) own_cast |= n == cast->producer();
      if (own_cast) continue;
      if (d::widen_dtype_attribute(*n)) ++changed;
      for (Value* v : n->outputs())
        if (v && v->dtype() == DType::Float16) {
          v->set_dtype(DType::Float32);
          ++changed;
        }
    }
    ctx.rewrite("float16 computed in float32: " + std::to_string(changed) + " values, casts and attributes widened");
    return changed > 0;
  }
};

}  // namespace ondine
