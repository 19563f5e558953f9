// SPDX-License-Identifier: Apache-2.0
// ondine/passes/layout.hpp - layout: decides each activation's memory layout (Value::layout) and
// places an ondine.Reorder node wherever a value's layout differs from what a reader needs, so the
// graph shows where bytes are rearranged.
//
// ondine.Reorder (X) -> Y, domain "ondine": the identity on logical values; it changes bytes, not
// meaning. Y's layout is the one it converts to (lower/detail/reorder.hpp does the conversion; the
// reference executor copies).
//
// Option "layout" (PassContext::options):
//   "auto" (default)  Blocked between the ops oneDNN runs in a layout of its choice (oneDNN picks);
//   "nhwc"            ChannelsLast (NWC/NHWC/NDHWC) for the image activations of the conv family;
//   "plain"           RowMajor everywhere (no Reorder at all).
// How each op is seen, as the lowering (lower/) treats it:
//   - the conv family (Conv, ConvTranspose, ondine.FusedConv) chooses: its output takes the mode's
//     layout, and its data input is reordered to it. Even when only row-major ops read the output: a
//     conv run in plain NCHW is several times slower than the reorders around a blocked one. In "auto",
//     a conv read only by DepthToSpace writes ChannelsLast instead (deconv-as-conv makes such pairs),
//     which DepthToSpace reads in place: one copy, not a Reorder and a copy;
//   - ops created on their input's layout (pooling, Resize, BatchNormalization, ondine.ChannelLayerNorm,
//     eltwise activations (Gelu too), Identity, Dropout, Softmax, binary ops on same-shape operands, Concat
//     on channels) inherit the layout of their data input; their other same-shape operands are reordered
//     to it;
//   - everything else (reference kernels, Reshape/Flatten/Squeeze/Unsqueeze views, Transpose,
//     MatMul/Gemm, non-f32 values) reads and writes RowMajor; DepthToSpace reads ChannelsLast too, and
//     RoiAlign its feature map in any layout (its kernel reads channels side by side, lower/detail/sampling.hpp).
// Graph inputs and outputs are RowMajor: a graph output in another layout becomes a Reorder that
// takes over the output's name (rewrite::replace_value). Constants keep Layout::Unset (the lowering
// reorders weights once, at compile time).
// Reorders are created once per (value, layout) and shared by the readers needing it; a Reorder of a
// Reorder converts the original value instead (Reorder(Reorder(x, L1), L2) -> Reorder(x, L2)), and a
// Reorder to the layout its input already has is removed (Reorder(x, L) -> x when layout(x) == L).
// Running the pass again with the same option changes nothing.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/passes/pass.hpp"
#include "ondine/passes/rewrite.hpp"

namespace ondine {

namespace detail::layout {

enum class Mode { Auto, Nhwc, Plain };

inline Mode parse_mode(const std::string& s) {
  if (s.empty() || s == "auto") return Mode::Auto;
  if (s == "nhwc") return Mode::Nhwc;
  if (s == "plain") return Mode::Plain;
  throw Error("layout: unknown option layout=" + s + " (expected auto, nhwc or plain)");
}

// How the lowering treats an op's layouts.
enum class Role {
  RowMajor,  // reads and writes row-major bytes
  Chooses,   // a primitive created with the layout it is given, or format_tag::any (conv family)
  Inherits,  // a primitive created on its data input's layout
  Reorder,   // ondine.Reorder: converts to its output's layout
};

inline bool is_reorder(const Node* n) { return n && n->domain() == fused::kDomain && n->op_type() == "Reorder"; }

inline bool is_f32(const Value* v) { return v && v->dtype() == DType::Float32; }

inline bool is_unread(const Value* v) { return !v || (!v->has_uses() && !v->is_graph_output()); }

// True when every output past the first is unread (training outputs, MaxPool's Indices, Dropout's mask).
inline bool only_first_output_read(const Node& n) {
  for (std::size_t i = 1; i < n.num_outputs(); ++i)
    if (!is_unread(n.output(i))) return false;
  return true;
}

inline bool image_rank(const Value* v) {
  return v && v->shape().rank_known() && v->shape().rank() >= 3 && v->shape().rank() <= 5;
}

inline bool is_binary(const std::string& op) {
  static const std::set<std::string> ops{"Add", "Sub", "Mul", "Div", "Max", "Min"};
  return ops.count(op) != 0;
}

// The f32 unary ops the lowering creates on their input's layout (oneDNN eltwise, softmax, aliases; PRelu's
// slopes per channel: lower/detail/prelu.hpp).
inline bool is_inheriting_unary(const std::string& op) {
  static const std::set<std::string> ops{"Relu",     "LeakyRelu", "Sigmoid",    "Tanh",       "Elu",
                                         "Exp",      "Log",       "Sqrt",       "Abs",        "Neg",
                                         "Softplus", "HardSwish", "HardSigmoid", "Clip",      "Reciprocal",
                                         "Pow",      "Identity",  "Dropout",    "Softmax",    "LogSoftmax",
                                         "Gelu",     "ondine.Gelu", "PRelu",      "ondine.FakeQuant"};
  return ops.count(op) != 0;
}

inline bool is_pool(const std::string& op) {
  return op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" || op == "GlobalMaxPool";
}

inline Role role_of(const Node& n) {
  if (is_reorder(&n)) return Role::Reorder;
  const Value* y = n.output(0);
  if (!is_f32(y) || !only_first_output_read(n)) return Role::RowMajor;
  const std::string op = n.op_key();
  if ((op == "Conv" || op == "ConvTranspose" || op == "ondine.FusedConv") && image_rank(y)) return Role::Chooses;
  if (is_pool(op)) return image_rank(y) ? Role::Inherits : Role::RowMajor;
  // oneDNN resampling takes its source in any layout (lower/detail/resample.hpp); a Resize it declines runs
  // its reference kernel, which reads through a row-major copy as any reference step does.
  if (op == "Resize") return image_rank(y) && image_rank(n.input(0)) ? Role::Inherits : Role::RowMajor;
  if (op == "BatchNormalization") return n.attr_int("training_mode", 0) == 0 ? Role::Inherits : Role::RowMajor;
  // Ondine's kernel normalises each position's channels in the plain, channels-last or blocked layout
  // it gets (lower/detail/channel_norm.hpp).
  if (op == "ondine.ChannelLayerNorm") return image_rank(y) ? Role::Inherits : Role::RowMajor;
  if (is_inheriting_unary(op)) {
    // Pow's exponent, Clip's bounds, Dropout's ratio, PRelu's slopes: the kernels need them constant.
    for (std::size_t i = 1; i < n.num_inputs(); ++i)
      if (n.input(i) && !n.input(i)->is_constant()) return Role::RowMajor;
    return Role::Inherits;
  }
  if (is_binary(op)) return n.num_inputs() == 2 ? Role::Inherits : Role::RowMajor;
  if (op == "Concat" && y->shape().rank_known() && y->shape().rank() >= 2) {
    auto rank = static_cast<std::int64_t>(y->shape().rank());
    std::int64_t axis = n.attr_int("axis", 0);
    return axis == 1 || axis == 1 - rank ? Role::Inherits : Role::RowMajor;  // channels only
  }
  return Role::RowMajor;
}

// The input whose layout an inheriting op's output takes: the one its primitive is created on (a
// binary op's full-size, non-constant operand, input 0 first). nullptr: none (all constants).
inline Value* data_input(const Node& n) {
  const std::string& op = n.op_type();
  if (is_binary(op)) {
    const Value* y = n.output(0);
    for (std::size_t i = 0; i < 2; ++i) {
      Value* v = n.input(i);
      if (v && !v->is_constant() && v->shape() == y->shape()) return v;
    }
    return nullptr;
  }
  if (op == "Concat") {
    for (Value* v : n.inputs())
      if (v && !v->is_constant()) return v;
    return nullptr;
  }
  Value* x = n.input(0);
  return x && !x->is_constant() ? x : nullptr;
}

// The layout a reader needs for its input `i`, given its role and its output's layout; nullopt: any
// (the reader takes what it gets).
inline std::optional<Layout> need_of(const Node& n, Role role, std::size_t i, const Value* data, Layout out) {
  const Value* v = n.input(i);
  switch (role) {
    case Role::Reorder:
      return std::nullopt;
    case Role::RowMajor:
      // DepthToSpace reads any unblocked layout through strides (lower/detail/shape_ops.hpp).
      if (n.op_type() == "DepthToSpace" && i == 0 && v && v->layout() == Layout::ChannelsLast) return std::nullopt;
      // RoiAlign reads a float32 feature map in any layout (lower/detail/sampling.hpp): its kernel wants the
      // channels side by side, as blocked and channels-last hold them.
      if (n.op_key() == "RoiAlign" && i == 0 && is_f32(v)) return std::nullopt;
      return Layout::RowMajor;
    case Role::Chooses:
      if (i == 0) return out;
      // FusedConv's Sum is read through the primitive's destination, in the output's layout.
      if (i == 3 && n.op_key() == "ondine.FusedConv") return out;
      return Layout::RowMajor;  // runtime weights and bias are read row-major
    case Role::Inherits:
      if (v == data) return std::nullopt;
      // Concat's other pieces and a binary op's other same-shape operand are read in the data
      // input's layout; a broadcast operand and BN's runtime statistics row-major.
      if (n.op_type() == "Concat") return out;
      if (is_binary(n.op_type()) && v->shape() == n.output(0)->shape()) return out;
      return Layout::RowMajor;
  }
  return Layout::RowMajor;
}

class Assigner {
 public:
  Assigner(Graph& g, PassContext& ctx, Mode mode) : g_(g), ctx_(ctx), mode_(mode) {}

  bool run() {
    for (Value* in : g_.inputs()) set_layout(in, Layout::RowMajor);
    for (Node* n : g_.topo_order()) assign(*n);
    for (Value* out : std::vector<Value*>(g_.outputs())) export_row_major(out);
    collapse_reorders();
    if (changed_) schedule_reorders();
    if (labels_changed_) ctx_.rewrite("assigned layouts: " + summary());
    return changed_ || labels_changed_;
  }

 private:
  // The layout the conv family gives its outputs in this mode.
  Layout chosen_layout(const Value* v) const {
    switch (mode_) {
      case Mode::Plain: return Layout::RowMajor;
      case Mode::Nhwc: return image_rank(v) ? Layout::ChannelsLast : Layout::Blocked;
      case Mode::Auto: break;
    }
    bool only_depth_to_space = v->has_uses() && !v->is_graph_output() && image_rank(v);
    for (const Use& u : v->uses()) only_depth_to_space = only_depth_to_space && u.node->op_type() == "DepthToSpace" && u.index == 0;
    return only_depth_to_space ? Layout::ChannelsLast : Layout::Blocked;
  }

  void assign(Node& n) {
    Role role = role_of(n);
    Value* data = role == Role::Inherits ? data_input(n) : nullptr;
    if (role == Role::Inherits && !data) role = Role::RowMajor;
    Value* y = n.output(0);
    Layout out = Layout::RowMajor;
    switch (role) {
      case Role::RowMajor: break;
      case Role::Chooses: out = chosen_layout(y); break;
      case Role::Inherits: out = data->layout() == Layout::Unset ? Layout::RowMajor : data->layout(); break;
      case Role::Reorder:
        out = y->layout() != Layout::Unset ? y->layout() : n.input(0) ? n.input(0)->layout() : Layout::RowMajor;
        break;
    }
    for (std::size_t i = 0; i < n.num_outputs(); ++i)
      if (n.output(i)) set_layout(n.output(i), i == 0 ? out : Layout::RowMajor);
    for (std::size_t i = 0; i < n.num_inputs(); ++i) {
      Value* v = n.input(i);
      if (!v || v->is_constant()) continue;
      std::optional<Layout> need = need_of(n, role, i, data, out);
      if (!need || *need == v->layout()) continue;
      Value* r = reorder_to(v, *need);
      if (r == v) continue;
      n.set_input(i, r);
      changed_ = true;
    }
  }

  // `v` in layout `want`, through a Reorder of the value it was reordered from:
  // Reorder(Reorder(x, L1), L2) -> Reorder(x, L2), and x itself when layout(x) == L2.
  Value* reorder_to(Value* v, Layout want) {
    while (is_reorder(v->producer()) && v->producer()->input(0)) v = v->producer()->input(0);
    if (v->layout() == want) return v;
    return reorder_of(v, want);
  }

  // The Reorder of exactly `v` to `want`: an existing one (from this run or an earlier one) or a new one.
  Value* reorder_of(Value* v, Layout want) {
    auto key = std::make_pair(v, want);
    if (auto it = made_.find(key); it != made_.end()) return it->second;
    for (const Use& u : v->uses())
      if (is_reorder(u.node) && u.index == 0 && u.node->output(0)->layout() == want) return made_[key] = u.node->output(0);
    std::string name = g_.unique_name(v->name() + "." + tag(want));
    Node* r = g_.add_node("Reorder", {v}, {name}, {}, name, fused::kDomain);
    g_.opsets.emplace(fused::kDomain, fused::kDomainVersion);
    r->set_opset(fused::kDomainVersion);
    Value* out = r->output(0);
    out->set_dtype(v->dtype());
    out->set_shape(v->shape());
    out->set_layout(want);
    ctx_.rewrite("reorder '" + v->name() + "' from " + layout_name(v->layout()) + " to " + layout_name(want));
    changed_ = true;
    return made_[key] = out;
  }

  // A graph output in a non-row-major layout: a row-major Reorder takes over its name, and the
  // value's other readers keep reading it.
  void export_row_major(Value* v) {
    if (!v->is_graph_output() || v->is_constant() || v->is_graph_input() || v->is_capture()) return;
    if (v->layout() == Layout::RowMajor || v->layout() == Layout::Unset) return;
    std::vector<Use> readers = v->uses();
    Value* r = reorder_of(v, Layout::RowMajor);
    std::string name = v->name();
    rewrite::replace_value(g_, v, r);
    r->producer()->set_input(0, v);
    for (const Use& u : readers)
      if (u.node != r->producer()) u.node->set_input(u.index, v);
    g_.rename_value(v, g_.unique_name(name + "." + tag(v->layout())));
    changed_ = true;
  }

  // Reorder(Reorder(x, L1), L2) -> Reorder(x, L2); Reorder(x, L) -> x when layout(x) == L.
  // (Reorders present before this run, or left by a run with another option.)
  void collapse_reorders() {
    std::vector<Node*> reorders;
    for (Node* n : g_.topo_order())
      if (is_reorder(n)) reorders.push_back(n);
    for (Node* n : reorders) {
      Value* x = n->input(0);
      Value* y = n->output(0);
      if (!x || n->num_outputs() != 1) continue;
      while (is_reorder(x->producer()) && x->producer()->input(0)) {
        x = x->producer()->input(0);
        n->set_input(0, x);
        changed_ = true;
      }
      if (y->layout() != x->layout() && y->layout() != Layout::Unset) continue;
      if (is_unread(y)) continue;
      // A graph output handed to a graph input or another output would rename the interface.
      if (y->is_graph_output() && (x->is_graph_input() || x->is_graph_output() || x->is_capture())) continue;
      rewrite::replace_value(g_, y, x);
      ctx_.rewrite("removed Reorder '" + n->name() + "': '" + x->name() + "' is " + layout_name(x->layout()) + " already");
      changed_ = true;
    }
    if (rewrite::erase_if_dead(g_, reorders)) changed_ = true;
  }

  // Each Reorder right after its input's producer (first of all for a graph input) in the node
  // order, so the lowering meets it as soon as its input exists: a conv whose residual Add reads a
  // Reorder still finds that operand ready and folds the Add into a sum post-op.
  void schedule_reorders() {
    std::unordered_map<const Node*, std::vector<Node*>> after;
    std::vector<Node*> first;
    for (Node* n : g_.nodes()) {
      if (!is_reorder(n)) continue;
      Node* p = n->input(0) ? n->input(0)->producer() : nullptr;
      (p ? after[p] : first).push_back(n);
    }
    std::vector<Node*> order;
    order.reserve(g_.num_nodes());
    std::function<void(Node*)> emit = [&](Node* n) {
      order.push_back(n);
      if (auto it = after.find(n); it != after.end())
        for (Node* r : it->second) emit(r);
    };
    for (Node* r : first) emit(r);
    for (Node* n : g_.nodes())
      if (!is_reorder(n)) emit(n);
    g_.set_node_order(order);
  }

  void set_layout(Value* v, Layout l) {
    if (v->layout() == l) return;
    v->set_layout(l);
    labels_changed_ = true;
  }

  static const char* tag(Layout l) {
    switch (l) {
      case Layout::RowMajor: return "rowmajor";
      case Layout::ChannelsLast: return "nhwc";
      case Layout::Blocked: return "blocked";
      case Layout::Unset: break;
    }
    return "unset";
  }

  std::string summary() const {
    std::map<Layout, std::size_t> count;
    for (Node* n : g_.nodes())
      for (Value* v : n->outputs())
        if (v) ++count[v->layout()];
    std::string s;
    for (auto& [l, c] : count) s += (s.empty() ? "" : ", ") + std::to_string(c) + " " + layout_name(l);
    return s;
  }

  Graph& g_;
  PassContext& ctx_;
  Mode mode_;
  std::map<std::pair<Value*, Layout>, Value*> made_;
  bool changed_ = false, labels_changed_ = false;
};

}  // namespace detail::layout

struct AssignLayouts {
  static constexpr const char* name = "layout";
  // Reads the option "layout": "auto" (default), "nhwc" or "plain".
  bool run(Graph& g, PassContext& ctx) {
    return detail::layout::Assigner(g, ctx, detail::layout::parse_mode(ctx.option("layout", "auto"))).run();
  }
};

}  // namespace ondine
