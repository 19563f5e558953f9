// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/control_flow.hpp - shape and type inference for If, Loop and Scan (ONNX opsets 9-17):
// each infers its subgraphs with their inputs and captures typed from the node's inputs, then types its
// outputs from the subgraphs' outputs.
//
// - If: a condition known at compile time types the outputs from its branch alone; otherwise both
//   branches must agree on each output's dtype, and dims the branches disagree on become unknown
//   (their size is only known once the condition is).
// - Loop: the loop-carried values keep a dim only where the body preserves it (inferred again with
//   the merged shapes until they settle); scan outputs are stacked along a new leading dim, the trip
//   count, known only when the loop runs exactly M times (M constant, no condition that can stop it).
// - Scan: the trip count is the scanned axis of the scan inputs; states as Loop's carried values. Opset
//   8's Scan (a batch axis first, optional sequence_lens) is read as one opset-9 scan per batch item.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ondine/ir/infer/common.hpp"

namespace ondine {

inline void infer_shapes(Graph& g);  // ir/shape_inference.hpp

namespace infer {
namespace detail_control_flow {

// Dims two shapes agree on; unknown where they differ (unknown rank when the ranks differ).
inline Shape merge_shapes(const Shape& a, const Shape& b) {
  if (!a.rank_known() || !b.rank_known() || a.rank() != b.rank()) return Shape::unknown();
  std::vector<Dim> d(a.rank());
  for (std::size_t i = 0; i < a.rank(); ++i) d[i] = a[i] == b[i] ? a[i] : Dim();
  return Shape(std::move(d));
}

// Types the captures of `body` from the node's implicit inputs (matched by captured name).
inline void type_captures(const Node& n, Graph& body) {
  const auto& names = n.captured_names();
  for (Value* c : body.captures()) {
    for (std::size_t k = 0; k < names.size(); ++k) {
      if (names[k] != c->name()) continue;
      const Value* outer = n.input(n.num_formal_inputs() + k);
      if (!outer) break;
      c->set_dtype(outer->dtype());
      c->set_shape(outer->shape());
      c->set_kind(outer->kind());  // a body may read an outer sequence
      break;
    }
  }
}

inline void set_input_type(Value* v, DType t, const Shape& s) {
  v->set_dtype(t);
  v->set_shape(s);
}

// Infers `body` and rethrows its errors with the node named in front of the subgraph's node.
inline void infer_body(const Node& n, Graph& body, const std::string& attr) {
  type_captures(n, body);
  try {
    infer_shapes(body);
  } catch (Error& e) {
    throw n.error("in subgraph '" + attr + "': " + e.what());
  }
}

// The value of a scalar bool-like constant (or known) input, if any.
inline std::optional<bool> known_condition(const Value* v) {
  if (!v) return std::nullopt;
  const Tensor* t = v->is_constant() ? &v->constant() : v->known_data();
  if (!t || t->numel() != 1) return std::nullopt;
  return t->at_double(0) != 0;
}

inline void infer_if(Node& n) {
  Graph& then_g = n.attr_graph("then_branch");
  Graph& else_g = n.attr_graph("else_branch");
  infer_body(n, then_g, "then_branch");
  infer_body(n, else_g, "else_branch");
  if (then_g.outputs().size() != n.num_outputs() || else_g.outputs().size() != n.num_outputs())
    throw n.error("its branches return " + std::to_string(then_g.outputs().size()) + " and " +
                  std::to_string(else_g.outputs().size()) + " values for " + std::to_string(n.num_outputs()) +
                  " outputs");
  std::optional<bool> cond = known_condition(n.input(0));
  for (std::size_t i = 0; i < n.num_outputs(); ++i) {
    const Value* t = then_g.outputs()[i];
    const Value* e = else_g.outputs()[i];
    if (t->dtype() != DType::Undefined && e->dtype() != DType::Undefined && t->dtype() != e->dtype())
      throw n.error("output " + std::to_string(i) + " is " + std::string(dtype_name(t->dtype())) + " in then_branch but " +
                    std::string(dtype_name(e->dtype())) + " in else_branch");
    DType dt = t->dtype() != DType::Undefined ? t->dtype() : e->dtype();
    Shape s = cond ? (*cond ? t->shape() : e->shape()) : merge_shapes(t->shape(), e->shape());
    set_output(n, i, dt, s);
    // A branch may return a sequence or optional; one whose element type is unknown tells less.
    if (Value* y = n.output(i)) y->set_kind(t->is_tensor() || t->dtype() == DType::Undefined ? e->kind() : t->kind());
  }
}

// Loop: inputs M, cond, v_initial... (N); body (iter, cond, carried...) -> (cond, carried..., scans...).
inline void infer_loop(Node& n) {
  Graph& body = n.attr_graph("body");
  const std::size_t formal = n.num_formal_inputs();
  if (formal < 2) throw n.error("Loop needs the inputs M and cond (either may be empty)");
  const std::size_t carried = formal - 2;
  if (body.inputs().size() != carried + 2)
    throw n.error("its body takes " + std::to_string(body.inputs().size()) + " inputs; with " +
                  std::to_string(carried) + " loop-carried values it must take " + std::to_string(carried + 2));
  if (body.outputs().size() < carried + 1)
    throw n.error("its body returns " + std::to_string(body.outputs().size()) + " values; it must return at least " +
                  std::to_string(carried + 1) + " (the condition and the loop-carried values)");
  const std::size_t scans = body.outputs().size() - 1 - carried;
  if (n.num_outputs() > carried + scans)
    throw n.error("it has " + std::to_string(n.num_outputs()) + " outputs; its body gives " +
                  std::to_string(carried + scans));
  set_input_type(body.inputs()[0], DType::Int64, Shape());
  set_input_type(body.inputs()[1], DType::Bool, Shape());
  std::vector<Shape> state(carried);
  std::vector<DType> types(carried);
  std::vector<ValueKind> kinds(carried);  // a loop-carried value may be a sequence (or optional)
  for (std::size_t i = 0; i < carried; ++i) {
    const Value& v = required_input(n, 2 + i);
    types[i] = v.dtype();
    state[i] = v.shape();
    kinds[i] = v.kind();
    body.inputs()[2 + i]->set_kind(kinds[i]);
  }
  // The body may change a carried value's dims from one iteration to the next: infer with the merged
  // shapes until they no longer change (each round only forgets dims, so this ends).
  for (int round = 0; round < 8; ++round) {
    for (std::size_t i = 0; i < carried; ++i) set_input_type(body.inputs()[2 + i], types[i], state[i]);
    infer_body(n, body, "body");
    bool settled = true;
    for (std::size_t i = 0; i < carried; ++i) {
      const Value* out = body.outputs()[1 + i];
      if (out->dtype() != DType::Undefined && types[i] != DType::Undefined && out->dtype() != types[i])
        throw n.error("loop-carried value " + std::to_string(i) + " enters as " + std::string(dtype_name(types[i])) +
                      " but the body returns " + std::string(dtype_name(out->dtype())));
      Shape merged = merge_shapes(state[i], out->shape());
      if (merged != state[i]) {
        state[i] = merged;
        settled = false;
      }
    }
    if (settled) break;
  }
  // The trip count is static when the loop runs exactly M times: M constant, and either no condition
  // input (the body's condition is then ignored) or one that is true and that the body passes on as it
  // is (through Identity) or sets to a constant true.
  Dim trip;
  const Value* m = n.input(0);
  std::optional<bool> cond_in = known_condition(n.input(1));
  const Value* cond_out = body.outputs()[0];
  while (cond_out && cond_out->producer() && cond_out->producer()->op_type() == "Identity")
    cond_out = cond_out->producer()->input(0);
  bool body_keeps_going = cond_out == body.inputs()[1] || known_condition(cond_out) == true;
  bool exactly_m = !n.input(1) || (cond_in == true && body_keeps_going);
  if (m && m->is_constant() && m->constant().numel() == 1 && exactly_m)
    trip = Dim(std::max<std::int64_t>(0, m->constant().to_int64s()[0]));
  if (cond_in == false) trip = Dim(0);
  for (std::size_t i = 0; i < carried && i < n.num_outputs(); ++i) {
    set_output(n, i, types[i], state[i]);
    // What the body returns: an optional sequence may enter and a sequence come out (its value).
    const Value* out = body.outputs()[1 + i];
    if (Value* y = n.output(i)) y->set_kind(out->is_tensor() ? kinds[i] : out->kind());
  }
  for (std::size_t k = 0; k < scans && carried + k < n.num_outputs(); ++k) {
    const Value* s = body.outputs()[1 + carried + k];
    Shape out = Shape::unknown();
    if (s->shape().rank_known()) {
      std::vector<Dim> d{trip};
      for (const Dim& x : s->shape().dims()) d.push_back(x);
      out = Shape(std::move(d));
    }
    set_output(n, carried + k, s->dtype(), out);
  }
}

// Scan (opset 9+): inputs: N initial states, M scan inputs; body (states..., slices...) -> (states..., outs...).
// Scan at opset 8: inputs sequence_lens?, N states [B, ...], M scan inputs [B, T, ...]; every state and
// output has the batch dim first, scan outputs [B, T, ...].
inline void infer_scan8(Node& n) {
  Graph& body = n.attr_graph("body");
  const std::size_t formal = n.num_formal_inputs();
  const auto m = static_cast<std::size_t>(n.attr_int("num_scan_inputs"));
  if (formal < 1 + m || m == 0) throw n.error("num_scan_inputs " + std::to_string(m) + " does not fit its inputs");
  const std::size_t states = formal - 1 - m;
  if (body.inputs().size() != states + m || body.outputs().size() < states)
    throw n.error("its body's inputs or outputs do not match its states and scan inputs");
  auto tail = [](const Shape& s, std::size_t drop) {
    if (!s.rank_known() || s.rank() < drop) return Shape::unknown();
    return Shape(std::vector<Dim>(s.dims().begin() + static_cast<std::ptrdiff_t>(drop), s.dims().end()));
  };
  Dim batch, steps;
  for (std::size_t j = 0; j < m; ++j) {
    const Value& x = required_input(n, 1 + states + j);
    if (x.shape().rank_known() && x.shape().rank() >= 2) {
      batch = x.shape()[0];
      steps = x.shape()[1];
    }
    set_input_type(body.inputs()[states + j], x.dtype(), tail(x.shape(), 2));
  }
  for (std::size_t i = 0; i < states; ++i) {
    const Value& v = required_input(n, 1 + i);
    set_input_type(body.inputs()[i], v.dtype(), tail(v.shape(), 1));
  }
  infer_body(n, body, "body");
  for (std::size_t i = 0; i < states && i < n.num_outputs(); ++i) set_output(n, i, n.input(1 + i)->dtype(), n.input(1 + i)->shape());
  for (std::size_t k = states; k < body.outputs().size() && k < n.num_outputs(); ++k) {
    const Value* s = body.outputs()[k];
    Shape out = Shape::unknown();
    if (s->shape().rank_known()) {
      std::vector<Dim> d{batch, steps};
      for (const Dim& x : s->shape().dims()) d.push_back(x);
      out = Shape(std::move(d));
    }
    set_output(n, k, s->dtype(), out);
  }
}

inline void infer_scan(Node& n) {
  if (n.opset() < 9) return infer_scan8(n);
  Graph& body = n.attr_graph("body");
  const std::size_t formal = n.num_formal_inputs();
  const auto m = static_cast<std::size_t>(n.attr_int("num_scan_inputs"));
  if (m == 0 || m > formal) throw n.error("num_scan_inputs " + std::to_string(m) + " does not fit its inputs");
  const std::size_t states = formal - m;
  if (body.inputs().size() != formal)
    throw n.error("its body takes " + std::to_string(body.inputs().size()) + " inputs for the node's " +
                  std::to_string(formal));
  if (body.outputs().size() < states)
    throw n.error("its body returns fewer values than the " + std::to_string(states) + " states");
  const std::size_t outs = body.outputs().size() - states;
  std::vector<std::int64_t> in_axes = n.attr_ints("scan_input_axes", std::vector<std::int64_t>(m, 0));
  std::vector<std::int64_t> out_axes = n.attr_ints("scan_output_axes", std::vector<std::int64_t>(outs, 0));
  if (in_axes.size() != m || out_axes.size() != outs) throw n.error("scan_input_axes or scan_output_axes has the wrong length");
  Dim trip;
  for (std::size_t j = 0; j < m; ++j) {
    const Value& x = required_input(n, states + j);
    Shape slice = Shape::unknown();
    if (x.shape().rank_known()) {
      auto r = static_cast<std::int64_t>(x.shape().rank());
      auto axis = static_cast<std::size_t>(normalize_axis(n, in_axes[j], r));
      std::vector<Dim> d;
      for (std::size_t a = 0; a < x.shape().rank(); ++a) {
        if (a == axis) {
          const Dim& t = x.shape()[a];
          if (j == 0) trip = t;
          else if (t.is_static() && trip.is_static() && t.value != trip.value)
            throw n.error("its scan inputs have " + trip.str() + " and " + t.str() + " steps along their scan axes");
          continue;
        }
        d.push_back(x.shape()[a]);
      }
      slice = Shape(std::move(d));
    }
    set_input_type(body.inputs()[states + j], x.dtype(), slice);
  }
  std::vector<Shape> state(states);
  std::vector<DType> types(states);
  for (std::size_t i = 0; i < states; ++i) {
    const Value& v = required_input(n, i);
    types[i] = v.dtype();
    state[i] = v.shape();
  }
  for (int round = 0; round < 8; ++round) {
    for (std::size_t i = 0; i < states; ++i) set_input_type(body.inputs()[i], types[i], state[i]);
    infer_body(n, body, "body");
    bool settled = true;
    for (std::size_t i = 0; i < states; ++i) {
      Shape merged = merge_shapes(state[i], body.outputs()[i]->shape());
      if (merged != state[i]) {
        state[i] = merged;
        settled = false;
      }
    }
    if (settled) break;
  }
  for (std::size_t i = 0; i < states && i < n.num_outputs(); ++i) set_output(n, i, types[i], state[i]);
  for (std::size_t k = 0; k < outs && states + k < n.num_outputs(); ++k) {
    const Value* s = body.outputs()[states + k];
    Shape out = Shape::unknown();
    if (s->shape().rank_known()) {
      std::vector<Dim> d = s->shape().dims();
      auto r = static_cast<std::int64_t>(d.size()) + 1;
      auto axis = normalize_axis(n, out_axes[k], r);
      d.insert(d.begin() + axis, trip);
      out = Shape(std::move(d));
    }
    set_output(n, states + k, s->dtype(), out);
  }
}

// SequenceMap: the body sees element types (a sequence input's elements, a tensor input as it is); each
// output is a sequence of what the body returns.
inline void infer_sequence_map(Node& n) {
  Graph& body = n.attr_graph("body");
  const std::size_t formal = n.num_formal_inputs();
  if (body.inputs().size() != formal)
    throw n.error("its body takes " + std::to_string(body.inputs().size()) + " inputs for " + std::to_string(formal));
  if (!is_sequence_kind(required_input(n, 0).kind())) throw n.error("input #0 must be a sequence");
  for (std::size_t j = 0; j < formal; ++j) {
    const Value& v = required_input(n, j);
    set_input_type(body.inputs()[j], v.dtype(), v.shape());  // of a sequence: its elements'
    body.inputs()[j]->set_kind(ValueKind::Tensor);
  }
  infer_body(n, body, "body");
  if (body.outputs().size() != n.num_outputs())
    throw n.error("its body returns " + std::to_string(body.outputs().size()) + " values for " +
                  std::to_string(n.num_outputs()) + " outputs");
  for (std::size_t k = 0; k < n.num_outputs(); ++k) {
    set_output(n, k, body.outputs()[k]->dtype(), body.outputs()[k]->shape());
    if (Value* y = n.output(k)) y->set_kind(ValueKind::Sequence);
  }
}

}  // namespace detail_control_flow

inline void register_control_flow_infer(InferTable& t) {
  t["If"] = detail_control_flow::infer_if;
  t["Loop"] = detail_control_flow::infer_loop;
  t["Scan"] = detail_control_flow::infer_scan;
  t["SequenceMap"] = detail_control_flow::infer_sequence_map;
}

}  // namespace infer
}  // namespace ondine
