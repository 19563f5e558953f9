// SPDX-License-Identifier: Apache-2.0
// ondine/passes/fold_constants.hpp - fold-constants: computes at compile time what depends only on
// constants, with the reference kernels (the same code the reference executor runs).
//
// Rewrites, in one sweep in topological order (so whole chains fold in one run):
//   op(c0, c1, ...)  -> constant     every input a constant (or omitted), an ONNX-domain op with a
//                                    reference kernel
//   Shape(x)         -> constant     x has a static shape (x itself need not be constant)
//   Size(x)          -> constant     likewise
//   If(c) {then, else} -> the branch  c a constant (or known from shapes): the chosen branch's nodes
//                                    are spliced into the graph, its captures reading the node's
//                                    implicit inputs; they fold further in the next sweep
// The Shape rule is what folds the Shape -> Gather -> Concat -> Reshape chains exporters write for
// shapes they could have written as constants. After a fold, the readers of the new constant have
// their shapes inferred again, so a Reshape whose target just became constant gets a static shape
// and a Shape of it folds later in the same sweep. The pass runs infer_shapes() first when some node
// output has no inferred type.
// Not folded (the node stays, and runs as before):
//   - nondeterministic ops (RandomNormal, RandomNormalLike, RandomUniform, RandomUniformLike,
//     Multinomial, Bernoulli; Dropout in training mode);
//   - ops of another domain than ONNX's (Ondine's fused and layout ops are already compiled forms);
//   - a node whose folded output would exceed max_bytes (default 64 MiB per tensor, option
//     "fold-constants.max-bytes"): a big constant costs memory and load time that computing it at
//     run time does not. Ops that grow their output (Expand, Tile, ConstantOfShape, ...) fold only
//     when their output shape is known statically, so nothing huge is allocated to find out;
//   - a node whose kernel throws (unsupported attributes, bad input): the error surfaces at run time
//     with the node's context, never here;
//   - a result that disagrees with the inferred dtype or static dims.
// Names: a folded value keeps its name (the new constant takes it); a graph output stays a graph
// output under its name (rewrite::replace_value). Folded nodes are removed; producers that fed only
// a folded Shape are left for dce.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ondine/ir/dropout.hpp"
#include "ondine/ir/shape_inference.hpp"
#include "ondine/passes/pass.hpp"
#include "ondine/passes/rewrite.hpp"
#include "ondine/reference/executor.hpp"

namespace ondine {

namespace detail::fold_constants {

inline constexpr std::size_t kDefaultMaxBytes = std::size_t{64} << 20;

inline bool is_nondeterministic(const Node& n) {
  static const std::set<std::string> random_ops{"RandomNormal", "RandomNormalLike", "RandomUniform",
                                                "RandomUniformLike", "Multinomial", "Bernoulli"};
  if (random_ops.count(n.op_type())) return true;
  // Dropout drops at random in training mode (opset 12+: a training_mode input that is true).
  if (n.op_type() == "Dropout") return !dropout_is_identity(n);
  return false;
}

// Ops whose output can be far larger than their inputs: folded only when the output shape is known.
inline bool grows_output(const std::string& op) {
  static const std::set<std::string> ops{"ConstantOfShape", "Expand", "Tile",     "Range",    "OneHot", "EyeLike",
                                         "Resize",          "Pad",    "Upsample", "MatMul",   "Gemm",   "Gather",
                                         "GatherElements",  "GatherND"};
  return ops.count(op) != 0;
}

inline bool read(const Value* v) { return v && (v->has_uses() || v->is_graph_output()); }

// The static size in bytes of a value, or nullopt when its shape or dtype is not known.
inline std::optional<std::size_t> static_bytes(const Value* v) {
  if (!v->shape().is_static() || v->dtype() == DType::Undefined) return std::nullopt;
  std::size_t n = dtype_size(v->dtype());
  for (auto d : v->shape().sizes()) {
    if (d != 0 && n > SIZE_MAX / static_cast<std::size_t>(d)) return SIZE_MAX;
    n *= static_cast<std::size_t>(d);
  }
  return n;
}

// A result agrees with what inference said about the value: same dtype, same rank, same static dims.
inline bool agrees(const Value* v, const Tensor& t) {
  if (v->dtype() != DType::Undefined && v->dtype() != t.dtype()) return false;
  const Shape& s = v->shape();
  if (!s.rank_known()) return true;
  if (s.rank() != t.rank()) return false;
  for (std::size_t i = 0; i < s.rank(); ++i)
    if (s[i].is_static() && s[i].value != t.dims()[i]) return false;
  return true;
}

// `now` says at least what `before` said about a value: nothing known is contradicted or lost.
inline bool refines(DType dtype_before, const Shape& before, DType dtype_now, const Shape& now) {
  if (dtype_before != DType::Undefined && dtype_now != dtype_before) return false;
  if (!before.rank_known()) return true;
  if (!now.rank_known() || now.rank() != before.rank()) return false;
  for (std::size_t i = 0; i < before.rank(); ++i)
    if (before[i].is_static() && now[i] != before[i]) return false;
  return true;
}

// Infers n's outputs again (an input became constant or better known). Keeps the new types only
// when they refine the old ones; returns whether an output changed.
inline bool reinfer(Node& n) {
  if (!infer_table().count(n.op_key())) return false;
  std::vector<std::pair<DType, Shape>> before;
  std::vector<std::optional<std::vector<SymInt>>> elements_before;
  for (Value* out : n.outputs()) {
    before.emplace_back(out->dtype(), out->shape());
    elements_before.push_back(out->element_dims());
  }
  auto restore = [&] {
    for (std::size_t i = 0; i < n.num_outputs(); ++i) {
      n.output(i)->set_dtype(before[i].first);
      n.output(i)->set_shape(before[i].second);
      n.output(i)->set_element_dims(elements_before[i]);
    }
  };
  try {
    infer_node(n);
  } catch (const std::exception&) {
    restore();
    return false;
  }
  bool changed = false;
  for (std::size_t i = 0; i < n.num_outputs(); ++i) {
    Value* out = n.output(i);
    if (!refines(before[i].first, before[i].second, out->dtype(), out->shape())) {
      restore();
      return false;
    }
    changed |= out->dtype() != before[i].first || out->shape() != before[i].second ||
               out->element_dims() != elements_before[i];
  }
  return changed;
}

// The kernel's arguments when every input is known at compile time: constants, and for Shape/Size
// a data-less stand-in carrying the static dims (those kernels read only the dims).
inline std::optional<std::vector<Tensor>> known_inputs(const Node& n) {
  std::vector<Tensor> args;
  args.reserve(n.num_inputs());
  bool reads_only_dims = n.op_type() == "Shape" || n.op_type() == "Size";
  for (std::size_t i = 0; i < n.num_inputs(); ++i) {
    const Value* v = n.input(i);
    if (!v) {
      args.emplace_back();
    } else if (v->is_constant()) {
      args.push_back(v->constant());
    } else if (v->known_data()) {  // elements known from shapes (ir/infer/values.hpp)
      args.push_back(*v->known_data());
    } else if (reads_only_dims && i == 0 && v->shape().is_static()) {
      DType t = v->dtype() == DType::Undefined ? DType::Float32 : v->dtype();
      args.emplace_back(t, v->shape().sizes(), nullptr, nullptr);
    } else {
      return std::nullopt;
    }
  }
  return args;
}

// n's outputs computed now, or nullopt when n must stay (see the header comment for why).
inline std::optional<std::vector<Tensor>> evaluate(const Node& n, std::size_t max_bytes) {
  if (!n.domain().empty() || is_nondeterministic(n)) return std::nullopt;
  const auto& kernels = reference::kernel_table();
  auto kernel = kernels.find(n.op_key());
  if (kernel == kernels.end()) return std::nullopt;
  bool any_read = false;
  for (const Value* out : n.outputs()) {
    if (!read(out)) continue;
    // A sequence or optional cannot be a constant; strings stay out of the compiled plan's constants.
    if (!out->is_tensor() || out->dtype() == DType::String) return std::nullopt;
    any_read = true;
    std::optional<std::size_t> bytes = static_bytes(out);
    if (bytes ? *bytes > max_bytes : grows_output(n.op_type())) return std::nullopt;
  }
  if (!any_read) return std::nullopt;  // dead: dce's business
  auto args = known_inputs(n);
  if (!args) return std::nullopt;
  std::vector<Tensor> outs;
  try {
    outs = kernel->second(n, *args);
  } catch (...) {  // kernel errors and allocation failures alike: leave the node to run time
    return std::nullopt;
  }
  if (outs.size() < n.num_outputs()) return std::nullopt;
  for (std::size_t i = 0; i < n.num_outputs(); ++i) {
    const Value* out = n.output(i);
    if (!read(out)) continue;
    const Tensor& t = outs[i];
    if (t.empty() || t.nbytes() > max_bytes || !agrees(out, t)) return std::nullopt;
  }
  return outs;
}

// A constant holding `t` takes y's place (and name); returns it.
inline Value* install_constant(Graph& g, Value* y, Tensor t) {
  if (y->is_graph_output()) {
    Value* c = g.add_constant(g.unique_name(y->name() + ".folded"), std::move(t));
    rewrite::replace_value(g, y, c);  // c takes the output's name
    return c;
  }
  std::string keep = y->name();
  g.rename_value(y, g.unique_name(keep + ".unfolded"));
  Value* c = g.add_constant(keep, std::move(t));
  g.replace_all_uses(y, c);
  return c;
}

inline std::size_t max_bytes_option(const PassContext& ctx) {
  std::string s = ctx.option("fold-constants.max-bytes");
  if (s.empty()) return kDefaultMaxBytes;
  try {
    return static_cast<std::size_t>(std::stoull(s));
  } catch (const std::exception&) {
    throw Error("fold-constants: option fold-constants.max-bytes='" + s + "' is not a byte count");
  }
}

// Splices `branch` into `g` in place of the If node `n` (whose condition chose it); n's readers then read
// the branch's outputs, and n is left without readers.
inline void inline_branch(Graph& g, Node& n, const Graph& branch) {
  std::unordered_map<const Value*, Value*> map = rewrite::splice_subgraph(g, n, branch, {});
  for (std::size_t i = 0; i < n.num_outputs(); ++i) {
    Value* y = n.output(i);
    if (!read(y)) continue;
    rewrite::replace_value(g, y, map.at(branch.outputs()[i]));
  }
}

// The If node's condition when it is known at compile time.
inline std::optional<bool> known_condition(const Node& n) {
  if (n.op_type() != "If" || !n.domain().empty()) return std::nullopt;
  const Value* c = n.input(0);
  const Tensor* t = c ? (c->is_constant() ? &c->constant() : c->known_data()) : nullptr;
  if (!t || t->numel() != 1) return std::nullopt;
  return t->at_double(0) != 0;
}

inline bool needs_inference(const Graph& g) {
  for (Node* n : g.nodes())
    for (Value* out : n->outputs())
      if (out->dtype() == DType::Undefined) return true;
  return false;
}

}  // namespace detail::fold_constants

struct FoldConstants {
  static constexpr const char* name = "fold-constants";

  bool run(Graph& g, PassContext& ctx) {
    namespace d = detail::fold_constants;
    const std::size_t max_bytes = d::max_bytes_option(ctx);
    if (d::needs_inference(g)) {
      try {
        infer_shapes(g);
      } catch (const Error& e) {  // folding all-constant nodes needs no shapes; the rest waits for run time
        ctx.remark(std::string("shape inference failed, folding without it: ") + e.what());
      }
    }
    std::unordered_set<const Value*> improved;  // folded or better known during this sweep
    std::vector<Node*> folded;
    for (Node* n : g.topo_order()) {
      bool input_improved = false;
      for (Value* v : n->inputs()) input_improved |= v && improved.count(v);
      if (input_improved && d::reinfer(*n))
        for (Value* out : n->outputs()) improved.insert(out);
      if (auto cond = d::known_condition(*n)) {
        const Graph& branch = n->attr_graph(*cond ? "then_branch" : "else_branch");
        ctx.rewrite("inlined the " + std::string(*cond ? "then" : "else") + " branch of '" + n->name() + "' (If)");
        d::inline_branch(g, *n, branch);
        folded.push_back(n);
        continue;
      }
      auto outs = d::evaluate(*n, max_bytes);
      if (!outs) continue;
      ctx.rewrite("folded '" + (n->name().empty() ? n->output(0)->name() : n->name()) + "' (" + n->op_type() + ")");
      for (std::size_t i = 0; i < n->num_outputs(); ++i) {
        Value* out = n->output(i);
        if (d::read(out)) improved.insert(d::install_constant(g, out, std::move((*outs)[i])));
      }
      folded.push_back(n);
    }
    if (folded.empty()) return false;
    g.remove_nodes(folded);
    g.remove_dead_values();
    return true;
  }
};

}  // namespace ondine
