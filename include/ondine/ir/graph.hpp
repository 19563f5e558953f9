// SPDX-License-Identifier: Apache-2.0
// ondine/ir/graph.hpp - the graph IR: values (SSA edges), nodes and the graph that owns them.
//
// A Value has at most one producer (a node output, a graph input, or a constant initializer) and a
// list of uses (node, input index). Nodes reference values by pointer; omitted optional inputs are
// nullptr. The Graph owns everything, keeps the use lists in sync through its editing methods, and
// checks its own invariants in verify(). Nothing here knows protobuf or oneDNN.
//
// Subgraphs (If's branches, Loop's and Scan's bodies) are Graph attributes of their node. A subgraph
// reads values of the scopes around it through captures: values of the subgraph that stand for an
// outer value of the same name. The node lists the outer values it passes in as implicit inputs,
// after its formal (ONNX) inputs, with the captured name of each, so the outer graph's use lists,
// topological order and dead-code elimination see those reads like any other.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/attribute.hpp"
#include "ondine/ir/dim_expr.hpp"
#include "ondine/ir/shape.hpp"
#include "ondine/ir/tensor.hpp"

namespace ondine {

class Node;
class Graph;

struct Use {
  Node* node;
  std::size_t index;
  bool operator==(const Use& o) const { return node == o.node && index == o.index; }
};

// Where a tensor's bytes go, as decided by the layout pass (ondine/passes/layout.hpp).
enum class Layout {
  Unset,         // no decision: the lowering picks (oneDNN's preferred layout between its primitives)
  RowMajor,      // plain row-major (NCHW for images): what reference kernels and callers read
  ChannelsLast,  // NHWC / NDHWC / NWC
  Blocked,       // whatever oneDNN prefers for its producer (e.g. nChw16c)
};

// What a value holds. Almost every value is a tensor; ONNX also has sequences of tensors (SplitToSequence,
// SequenceConstruct, ...) and optionals of a tensor or a sequence. For a sequence (or an optional one)
// the value's dtype() and shape() describe its elements: the element type, and the shape all elements
// share when inference knows one (else unknown). At run time a Tensor carries these values
// (Tensor::sequence, Tensor::none: ir/tensor.hpp).
enum class ValueKind : std::uint8_t { Tensor, Sequence, OptionalTensor, OptionalSequence };

inline bool is_sequence_kind(ValueKind k) { return k == ValueKind::Sequence || k == ValueKind::OptionalSequence; }
inline bool is_optional_kind(ValueKind k) { return k == ValueKind::OptionalTensor || k == ValueKind::OptionalSequence; }

inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Unset: return "unset";
    case Layout::RowMajor: return "row-major";
    case Layout::ChannelsLast: return "channels-last";
    case Layout::Blocked: return "blocked";
  }
  return "?";
}

class Value {
 public:
  const std::string& name() const { return name_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  ValueKind kind() const { return kind_; }
  bool is_tensor() const { return kind_ == ValueKind::Tensor; }
  void set_kind(ValueKind k) { kind_ = k; }
  void set_dtype(DType t) {
    dtype_ = t;
    clear_element_dims();
  }
  void set_shape(Shape s) {
    shape_ = std::move(s);
    clear_element_dims();
  }

  Node* producer() const { return producer_; }
  std::size_t producer_output() const { return producer_output_; }
  const std::vector<Use>& uses() const { return uses_; }
  bool has_uses() const { return !uses_.empty(); }

  // Constants are initializers (or folded values): their data is known at compile time. Treat the
  // tensor as immutable unless constant_for_update says no one else can see it.
  bool is_constant() const { return constant_.has_value(); }
  const Tensor& constant() const {
    if (!constant_) throw Error("value '" + name_ + "' is not a constant");
    return *constant_;
  }
  // The constant's tensor for an in-place update, or nullptr when that could be seen by anyone but
  // `reader`: the value has other readers, is a graph output, or its storage is shared (a cloned
  // graph shares constants) or not the tensor's own. Saves a pass that rewrites every weight a fresh
  // copy of the model (page faults on fresh memory dominate such passes).
  Tensor* constant_for_update(const Node* reader) {
    if (!constant_ || is_output_ || uses_.size() != 1 || uses_[0].node != reader) return nullptr;
    return constant_->is_sole_owner() ? &*constant_ : nullptr;
  }
  void set_constant(Tensor t) {
    kind_ = ValueKind::Tensor;
    dtype_ = t.dtype();
    shape_ = t.shape();
    constant_ = std::move(t);
  }
  bool is_graph_input() const { return is_input_; }
  // A capture: this (sub)graph's stand-in for a value of an enclosing graph (see the file comment).
  bool is_capture() const { return is_capture_; }
  bool is_graph_output() const { return is_output_; }

  // What shape inference knows of the elements of a small tensor computed from shapes that is not a
  // constant: Shape(x) of x:[batch,seq,64] is [batch, seq, 64], and Gather, Concat, Add, ... of such
  // values carry theirs (ir/infer/values.hpp). One SymInt per element, row-major: a number, an
  // expression over dim names, or unknown. Readers of shape-like inputs (Reshape's shape, Expand,
  // Range, Slice, Pad, ...) use them where no constant is there. nullopt: nothing known. Cleared by
  // set_dtype/set_shape, so set it after them.
  const std::optional<std::vector<SymInt>>& element_dims() const { return element_dims_; }
  // The elements as a tensor when every one is a number (else nullptr): what the value will hold at
  // run time, known at compile time although no constant holds it.
  const Tensor* known_data() const { return known_data_ ? &*known_data_ : nullptr; }
  void set_element_dims(std::optional<std::vector<SymInt>> dims) {
    known_data_.reset();
    element_dims_ = std::move(dims);
    bool numeric = is_integer(dtype_) || dtype_ == DType::Bool || dtype_ == DType::Float32 || dtype_ == DType::Float64;
    if (!element_dims_ || !shape_.is_static() || !numeric) return;
    auto numel = shape_.numel();
    if (!numel || static_cast<std::size_t>(*numel) != element_dims_->size()) {
      element_dims_.reset();  // inconsistent with the shape: know nothing rather than something wrong
      return;
    }
    for (auto& d : *element_dims_)
      if (!d.is_number()) return;
    Tensor t(dtype_, shape_.sizes());
    dispatch_dtype(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* p = t.data<T>();
      for (std::size_t i = 0; i < element_dims_->size(); ++i) {
        if constexpr (std::is_integral_v<T>) p[i] = static_cast<T>(*(*element_dims_)[i].number);
        else p[i] = static_cast<T>(static_cast<float>(*(*element_dims_)[i].number));
      }
    });
    known_data_ = std::move(t);
  }

  // The memory layout the layout pass chose for this value (Layout::Unset: the lowering decides).
  // The IR's semantics never depend on it: every tensor is indexed by its logical dims.
  Layout layout() const { return layout_; }
  void set_layout(Layout l) { layout_ = l; }

 private:
  friend class Graph;
  friend class Node;
  std::string name_;
  Layout layout_ = Layout::Unset;
  DType dtype_ = DType::Undefined;
  Shape shape_ = Shape::unknown();
  ValueKind kind_ = ValueKind::Tensor;
  Node* producer_ = nullptr;
  std::size_t producer_output_ = 0;
  std::vector<Use> uses_;
  void clear_element_dims() {
    element_dims_.reset();
    known_data_.reset();
  }
  std::optional<Tensor> constant_;
  std::optional<std::vector<SymInt>> element_dims_;
  std::optional<Tensor> known_data_;
  bool is_input_ = false, is_output_ = false, is_capture_ = false;
};

class Node {
 public:
  const std::string& op_type() const { return op_type_; }
  const std::string& domain() const { return domain_; }
  // The key of this op in Ondine's op tables: "Conv" for the ONNX domain, "ondine.FusedConv" for others.
  std::string op_key() const { return domain_.empty() ? op_type_ : domain_ + "." + op_type_; }
  const std::string& name() const { return name_; }
  void set_name(std::string n) { name_ = std::move(n); }
  // Opset version of this node's domain in the model it came from; kernels use it for
  // version-dependent semantics (e.g. Softmax's axis before and after opset 13).
  int opset() const { return opset_; }
  void set_opset(int v) { opset_ = v; }

  std::size_t num_inputs() const { return inputs_.size(); }
  std::size_t num_outputs() const { return outputs_.size(); }
  // nullptr for an omitted optional input or an index past the end.
  Value* input(std::size_t i) const { return i < inputs_.size() ? inputs_[i] : nullptr; }
  Value* output(std::size_t i) const { return i < outputs_.size() ? outputs_[i] : nullptr; }
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }

  void set_input(std::size_t i, Value* v) {
    if (i >= inputs_.size()) inputs_.resize(i + 1, nullptr);
    if (inputs_[i]) {
      auto& u = inputs_[i]->uses_;
      u.erase(std::find(u.begin(), u.end(), Use{this, i}));
    }
    inputs_[i] = v;
    if (v) v->uses_.push_back(Use{this, i});
  }
  void add_input(Value* v) {
    if (!captured_.empty()) throw error("internal: a formal input added after the implicit ones");
    set_input(inputs_.size(), v);
  }

  // Implicit inputs: the outer values this node's subgraphs read, after the formal inputs, each with
  // the name its subgraphs' captures have (the outer value may be renamed later; the capture keeps it).
  std::size_t num_formal_inputs() const { return inputs_.size() - captured_.size(); }
  const std::vector<std::string>& captured_names() const { return captured_; }
  void add_implicit_input(Value* v, const std::string& captured_name) {
    set_input(inputs_.size(), v);
    captured_.push_back(captured_name);
  }
  // The subgraph attributes, by attribute name.
  std::vector<std::pair<std::string, Graph*>> subgraphs() const {
    std::vector<std::pair<std::string, Graph*>> out;
    for (auto& [name, a] : attrs_)
      if (auto* g = std::get_if<GraphAttr>(&a); g && *g) out.emplace_back(name, g->get());
    return out;
  }
  Graph& attr_graph(const std::string& n) const {
    const GraphAttr& g = get_ref<GraphAttr>(n);
    if (!g) throw error("attribute '" + n + "' holds no graph");
    return *g;
  }

  // Attributes. The typed getters throw an Error naming this node when an attribute has the wrong kind,
  // and when a required one (no default given) is missing.
  const std::map<std::string, Attribute>& attrs() const { return attrs_; }
  bool has_attr(const std::string& n) const { return attrs_.count(n) != 0; }
  void set_attr(const std::string& n, Attribute a) { attrs_[n] = std::move(a); }
  void remove_attr(const std::string& n) { attrs_.erase(n); }

  std::int64_t attr_int(const std::string& n) const { return get<std::int64_t>(n); }
  std::int64_t attr_int(const std::string& n, std::int64_t def) const { return get_or<std::int64_t>(n, def); }
  float attr_float(const std::string& n) const { return get<float>(n); }
  float attr_float(const std::string& n, float def) const { return get_or<float>(n, def); }
  std::string attr_string(const std::string& n) const { return get<std::string>(n); }
  std::string attr_string(const std::string& n, const std::string& def) const { return get_or<std::string>(n, def); }
  std::vector<std::int64_t> attr_ints(const std::string& n) const { return get<std::vector<std::int64_t>>(n); }
  std::vector<std::int64_t> attr_ints(const std::string& n, std::vector<std::int64_t> def) const {
    return get_or<std::vector<std::int64_t>>(n, std::move(def));
  }
  std::vector<float> attr_floats(const std::string& n) const { return get<std::vector<float>>(n); }
  std::vector<float> attr_floats(const std::string& n, std::vector<float> def) const {
    return get_or<std::vector<float>>(n, std::move(def));
  }
  std::vector<std::string> attr_strings(const std::string& n) const { return get<std::vector<std::string>>(n); }
  std::vector<std::string> attr_strings(const std::string& n, std::vector<std::string> def) const {
    return get_or<std::vector<std::string>>(n, std::move(def));
  }
  const Tensor& attr_tensor(const std::string& n) const { return get_ref<Tensor>(n); }

  // An Error that names this node; use as `throw node.error("...")`.
  Error error(const std::string& message) const { return std::move(Error(message).at_node(name_, op_type_)); }

 private:
  friend class Graph;
  template <typename T> const T& get_ref(const std::string& n) const {
    auto it = attrs_.find(n);
    if (it == attrs_.end()) throw error("missing required attribute '" + n + "'");
    if (auto* p = std::get_if<T>(&it->second)) return *p;
    throw wrong_kind<T>(n, it->second);
  }
  template <typename T> T get(const std::string& n) const {
    auto it = attrs_.find(n);
    if (it == attrs_.end()) throw error("missing required attribute '" + n + "'");
    return convert<T>(n, it->second);
  }
  template <typename T> T get_or(const std::string& n, T def) const {
    auto it = attrs_.find(n);
    return it == attrs_.end() ? def : convert<T>(n, it->second);
  }
  template <typename T> T convert(const std::string& n, const Attribute& a) const {
    if (auto* p = std::get_if<T>(&a)) return *p;
    // Exporters sometimes write an int where a float is expected and vice versa; accept the number.
    if constexpr (std::is_same_v<T, float>) {
      if (auto* i = std::get_if<std::int64_t>(&a)) return static_cast<float>(*i);
    }
    if constexpr (std::is_same_v<T, std::vector<float>>) {
      if (auto* v = std::get_if<std::vector<std::int64_t>>(&a)) return T(v->begin(), v->end());
    }
    throw wrong_kind<T>(n, a);
  }
  template <typename T> Error wrong_kind(const std::string& n, const Attribute& a) const {
    return error("attribute '" + n + "' has the wrong kind: " + attribute_kind_name(a) + ", expected " +
                 attribute_kind_name<T>());
  }

  std::string op_type_, domain_, name_;
  int opset_ = 0;
  std::vector<Value*> inputs_, outputs_;
  std::vector<std::string> captured_;  // names of the implicit inputs (the last captured_.size() inputs)
  std::map<std::string, Attribute> attrs_;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Graph(Graph&&) = default;
  Graph& operator=(Graph&&) = default;

  std::string name = "graph";
  std::map<std::string, int> opsets{{"", 17}};  // domain -> opset version ("" is ai.onnx)
  std::int64_t ir_version = 8;
  std::string producer_name = "ondine", producer_version, doc_string;

  int opset(const std::string& domain = "") const {
    auto it = opsets.find(domain == "ai.onnx" ? "" : domain);
    return it == opsets.end() ? 0 : it->second;
  }

  // --- building ---------------------------------------------------------------------------------
  Value* add_input(const std::string& name, DType dtype, Shape shape) {
    Value* v = new_typed_value(name, dtype, std::move(shape));
    v->is_input_ = true;
    inputs_.push_back(v);
    return v;
  }
  // A capture: this subgraph's stand-in for the enclosing scopes' value `name`.
  Value* add_capture(const std::string& name, DType dtype, Shape shape) {
    Value* v = new_typed_value(name, dtype, std::move(shape));
    v->is_capture_ = true;
    captures_.push_back(v);
    return v;
  }
  // Makes capture `c` of this subgraph a constant holding `t` (the enclosing value's constant data,
  // shared): what passes and the lowering then treat as weights rather than run-time values.
  void capture_to_constant(Value* c, const Tensor& t) {
    auto it = std::find(captures_.begin(), captures_.end(), c);
    if (it == captures_.end()) throw Error("internal: '" + c->name() + "' is not a capture of this subgraph");
    captures_.erase(it);
    c->is_capture_ = false;
    c->set_constant(t);
  }
  // Makes this subgraph's captures graph inputs after its own, by the same names: the subgraph as a
  // graph of its own (a compiled body is fed its captures' values like any input).
  void captures_to_inputs() {
    for (Value* c : captures_) {
      c->is_capture_ = false;
      c->is_input_ = true;
      inputs_.push_back(c);
    }
    captures_.clear();
  }
  Value* add_constant(const std::string& name, Tensor t) {
    Value* v = new_value(name.empty() ? unique_name("const") : name);
    v->set_constant(std::move(t));
    return v;
  }
  // Adds a node with `output_names.size()` outputs; empty names get fresh unique ones.
  Node* add_node(const std::string& op_type, const std::vector<Value*>& inputs,
                 const std::vector<std::string>& output_names, std::map<std::string, Attribute> attrs = {},
                 const std::string& name = "", const std::string& domain = "") {
    auto node = std::make_unique<Node>();
    Node* n = node.get();
    n->op_type_ = op_type;
    n->domain_ = domain == "ai.onnx" ? "" : domain;
    n->name_ = name;
    n->opset_ = opset(n->domain_);
    n->attrs_ = std::move(attrs);
    for (Value* v : inputs) n->add_input(v);
    for (const auto& out : output_names) {
      Value* v = new_value(out.empty() ? unique_name(op_type + "_out") : out);
      if (v->producer_ || v->is_input_ || v->constant_)
        throw Error("value '" + out + "' is defined twice").at_node(name, op_type);
      v->producer_ = n;
      v->producer_output_ = n->outputs_.size();
      n->outputs_.push_back(v);
    }
    nodes_.push_back(std::move(node));
    return n;
  }
  // Convenience for one-output nodes: returns the output value.
  Value* add_op(const std::string& op_type, const std::vector<Value*>& inputs,
                std::map<std::string, Attribute> attrs = {}, const std::string& output_name = "") {
    return add_node(op_type, inputs, {output_name}, std::move(attrs))->output(0);
  }
  void add_output(Value* v) {
    if (!v) throw Error("graph output is null");
    v->is_output_ = true;
    outputs_.push_back(v);
  }
  // A reference to a value by name that may not exist yet (importers meet uses before producers
  // only in malformed models, which verify() then reports).
  Value* get_or_create_value(const std::string& name) {
    if (Value* v = find_value(name)) return v;
    return new_value(name);
  }

  // --- queries ----------------------------------------------------------------------------------
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  const std::vector<Value*>& captures() const { return captures_; }
  Value* find_value(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second;
  }
  std::vector<Node*> nodes() const {
    std::vector<Node*> out;
    out.reserve(nodes_.size());
    for (auto& n : nodes_) out.push_back(n.get());
    return out;
  }
  std::size_t num_nodes() const { return nodes_.size(); }
  std::vector<Value*> values() const {
    std::vector<Value*> out;
    for (auto& v : values_) out.push_back(v.get());
    return out;
  }
  std::vector<Value*> constants() const {
    std::vector<Value*> out;
    for (auto& v : values_)
      if (v->constant_ && (v->has_uses() || v->is_output_)) out.push_back(v.get());
    return out;
  }
  std::size_t count_ops(const std::string& op_type) const {
    return static_cast<std::size_t>(
        std::count_if(nodes_.begin(), nodes_.end(), [&](auto& n) { return n->op_type_ == op_type; }));
  }
  std::map<std::string, std::size_t> op_histogram() const {
    std::map<std::string, std::size_t> h;
    for (auto& n : nodes_) ++h[n->op_type_];
    return h;
  }
  std::string unique_name(const std::string& base) {
    std::string n = base;
    while (by_name_.count(n)) n = base + "_" + std::to_string(++counter_);
    return n;
  }

  // Nodes ordered so that every producer comes before its users; ties keep insertion order.
  // Throws an Error naming a node on a cycle.
  std::vector<Node*> topo_order() const {
    std::unordered_map<const Node*, std::size_t> pending, index;
    for (std::size_t i = 0; i < nodes_.size(); ++i) index[nodes_[i].get()] = i;
    auto cmp = [&](Node* a, Node* b) { return index[a] > index[b]; };
    std::priority_queue<Node*, std::vector<Node*>, decltype(cmp)> ready(cmp);
    for (auto& n : nodes_) {
      std::set<const Node*> deps;
      for (Value* v : n->inputs_)
        if (v && v->producer_ && index.count(v->producer_)) deps.insert(v->producer_);
      pending[n.get()] = deps.size();
      if (deps.empty()) ready.push(n.get());
    }
    std::vector<Node*> order;
    while (!ready.empty()) {
      Node* n = ready.top();
      ready.pop();
      order.push_back(n);
      std::set<Node*> seen;
      for (Value* out : n->outputs_)
        for (auto& u : out->uses_)
          if (seen.insert(u.node).second && --pending[u.node] == 0) ready.push(u.node);
    }
    if (order.size() != nodes_.size()) {
      for (auto& n : nodes_)
        if (pending[n.get()] != 0)
          throw Error("the graph has a cycle through this node").at_node(n->name_, n->op_type_);
    }
    return order;
  }

  // --- editing ----------------------------------------------------------------------------------
  // Every use of `from` (node inputs and graph outputs) now reads `to`.
  void replace_all_uses(Value* from, Value* to) {
    auto uses = from->uses_;
    for (auto& u : uses) u.node->set_input(u.index, to);
    for (auto& o : outputs_)
      if (o == from) {
        o = to;
        to->is_output_ = true;
        from->is_output_ = false;
      }
  }
  // Removes a node whose outputs are unused (throws otherwise); its inputs lose the uses.
  void remove_node(Node* n) {
    for (Value* out : n->outputs_)
      if (out->has_uses() || out->is_output_)
        throw Error("cannot remove a node whose output '" + out->name_ + "' is still used")
            .at_node(n->name_, n->op_type_);
    for (std::size_t i = 0; i < n->inputs_.size(); ++i) n->set_input(i, nullptr);
    for (Value* out : n->outputs_) out->producer_ = nullptr;
    auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](auto& p) { return p.get() == n; });
    if (it != nodes_.end()) nodes_.erase(it);
  }
  // Removes a set of nodes in one pass over the graph (remove_node per node would be quadratic).
  // Their outputs may be read only by nodes of the set and must not be graph outputs (throws
  // otherwise, before anything changes).
  void remove_nodes(const std::vector<Node*>& dead) {
    if (dead.empty()) return;
    std::unordered_set<const Node*> in_set(dead.begin(), dead.end());
    for (Node* n : dead)
      for (Value* out : n->outputs_) {
        bool read_outside = out->is_output_;
        for (auto& u : out->uses_) read_outside |= !in_set.count(u.node);
        if (read_outside)
          throw Error("cannot remove a node whose output '" + out->name_ + "' is still used")
              .at_node(n->name_, n->op_type_);
      }
    for (Node* n : dead) {
      for (std::size_t i = 0; i < n->inputs_.size(); ++i) n->set_input(i, nullptr);
      for (Value* out : n->outputs_) out->producer_ = nullptr;
    }
    nodes_.erase(std::remove_if(nodes_.begin(), nodes_.end(), [&](auto& p) { return in_set.count(p.get()) != 0; }),
                 nodes_.end());
  }
  // Puts the nodes in `order`, a permutation of nodes(). The node order is topo_order's tie-break (and
  // so the order the lowering visits them): a pass that adds nodes can schedule them where they belong.
  void set_node_order(const std::vector<Node*>& order) {
    std::unordered_map<const Node*, std::size_t> at;
    for (std::size_t i = 0; i < order.size(); ++i) at.emplace(order[i], i);
    bool permutation = at.size() == order.size() && order.size() == nodes_.size() &&
                       std::all_of(nodes_.begin(), nodes_.end(), [&](auto& n) { return at.count(n.get()) != 0; });
    if (!permutation) throw Error("set_node_order: the order is not a permutation of the graph's nodes");
    std::vector<std::unique_ptr<Node>> sorted(nodes_.size());
    for (auto& n : nodes_) sorted[at.at(n.get())] = std::move(n);
    nodes_ = std::move(sorted);
  }
  // Drops values that nothing produces, uses or exports (e.g. constants left behind by a fold).
  void remove_dead_values() {
    std::vector<std::unique_ptr<Value>> keep;
    for (auto& v : values_) {
      if (v->producer_ || v->has_uses() || v->is_input_ || v->is_output_ || v->is_capture_) {
        keep.push_back(std::move(v));
      } else {
        by_name_.erase(v->name_);
      }
    }
    values_ = std::move(keep);
  }
  void rename_value(Value* v, const std::string& name) {
    if (v->name_ == name) return;
    if (by_name_.count(name)) throw Error("rename: value name '" + name + "' already exists");
    by_name_.erase(v->name_);
    v->name_ = name;
    by_name_[name] = v;
  }

  // --- checking ---------------------------------------------------------------------------------
  // The first broken invariant, or nullopt when the graph is well formed.
  std::optional<std::string> check() const {
    std::set<const Node*> owned;
    for (auto& n : nodes_) owned.insert(n.get());
    for (auto& n : nodes_) {
      std::string where = "node '" + n->name_ + "' (" + n->op_type_ + "): ";
      for (std::size_t i = 0; i < n->inputs_.size(); ++i) {
        Value* v = n->inputs_[i];
        if (!v) continue;
        if (!v->producer_ && !v->is_input_ && !v->constant_ && !v->is_capture_)
          return where + "input '" + v->name_ + "' is not produced by any node, graph input or initializer";
        if (v->producer_ && !owned.count(v->producer_))
          return where + "input '" + v->name_ + "' is produced by a node not in the graph";
        if (std::find(v->uses_.begin(), v->uses_.end(), Use{n.get(), i}) == v->uses_.end())
          return where + "input '" + v->name_ + "' does not list this node as a use";
      }
      for (std::size_t i = 0; i < n->outputs_.size(); ++i)
        if (n->outputs_[i]->producer_ != n.get() || n->outputs_[i]->producer_output_ != i)
          return where + "output '" + n->outputs_[i]->name_ + "' has another producer";
      for (auto& [attr, sub] : n->subgraphs()) {
        for (Value* c : sub->captures_)
          if (std::find(n->captured_.begin(), n->captured_.end(), c->name_) == n->captured_.end())
            return where + "subgraph '" + attr + "' reads '" + c->name_ + "', which the node does not pass in";
        if (auto problem = sub->check()) return where + "subgraph '" + attr + "': " + *problem;
      }
    }
    for (auto& v : values_)
      for (auto& u : v->uses_)
        if (!owned.count(u.node) || u.node->input(u.index) != v.get())
          return "value '" + v->name_ + "' lists a use that does not read it";
    for (Value* o : outputs_)
      if (!o->producer_ && !o->is_input_ && !o->constant_ && !o->is_capture_)
        return "graph output '" + o->name_ + "' is not produced by anything";
    try {
      topo_order();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::nullopt;
  }
  void verify() const {
    if (auto problem = check()) throw Error("invalid graph '" + name + "': " + *problem);
  }

  // --- copying and printing ---------------------------------------------------------------------
  // Deep copy of the structure, subgraphs included; constant tensors are shared (they are immutable by
  // convention).
  Graph clone() const {
    Graph g;
    g.name = name;
    g.opsets = opsets;
    g.ir_version = ir_version;
    g.producer_name = producer_name;
    g.producer_version = producer_version;
    g.doc_string = doc_string;
    g.counter_ = counter_;
    std::unordered_map<const Value*, Value*> map;
    for (auto& v : values_) {
      Value* c = g.new_value(v->name_);
      c->dtype_ = v->dtype_;
      c->shape_ = v->shape_;
      c->kind_ = v->kind_;
      c->constant_ = v->constant_;
      c->element_dims_ = v->element_dims_;
      c->known_data_ = v->known_data_;
      c->layout_ = v->layout_;
      map[v.get()] = c;
    }
    for (Value* v : inputs_) {
      map[v]->is_input_ = true;
      g.inputs_.push_back(map[v]);
    }
    for (Value* v : captures_) {
      map[v]->is_capture_ = true;
      g.captures_.push_back(map[v]);
    }
    for (auto& n : nodes_) {
      auto node = std::make_unique<Node>();
      Node* c = node.get();
      c->op_type_ = n->op_type_;
      c->domain_ = n->domain_;
      c->name_ = n->name_;
      c->opset_ = n->opset_;
      c->attrs_ = n->attrs_;
      for (auto& [k, a] : c->attrs_)
        if (auto* sub = std::get_if<GraphAttr>(&a); sub && *sub) *sub = std::make_shared<Graph>((*sub)->clone());
      for (Value* v : n->inputs_) c->set_input(c->inputs_.size(), v ? map[v] : nullptr);
      c->captured_ = n->captured_;
      for (Value* v : n->outputs_) {
        Value* o = map[v];
        o->producer_ = c;
        o->producer_output_ = c->outputs_.size();
        c->outputs_.push_back(o);
      }
      g.nodes_.push_back(std::move(node));
    }
    for (Value* v : outputs_) g.add_output(map[v]);
    return g;
  }

  static std::string value_type_str(const Value* v) {
    std::string t = std::string(dtype_name(v->dtype())) + v->shape().str();
    switch (v->kind()) {
      case ValueKind::Tensor: return t;
      case ValueKind::Sequence: return "seq(" + t + ")";
      case ValueKind::OptionalTensor: return "optional(" + t + ")";
      case ValueKind::OptionalSequence: return "optional(seq(" + t + "))";
    }
    return t;
  }

  // One line per input, constant, node and output, in topological order when there is one.
  std::string to_text() const {
    std::ostringstream os;
    os << "graph " << name << " (opset " << opset() << ")\n";
    auto typed = [](const Value* v) {  // type and shape, then the layout once the layout pass chose one
      return value_type_str(v) + (v->layout() == Layout::Unset ? "" : std::string(" @") + layout_name(v->layout()));
    };
    for (Value* v : inputs_) os << "  input  %" << v->name_ << ": " << typed(v) << "\n";
    for (Value* v : captures_) os << "  capture %" << v->name_ << ": " << typed(v) << "\n";
    for (Value* v : constants()) os << "  const  %" << v->name_ << ": " << value_type_str(v) << "\n";
    std::vector<Node*> order;
    try {
      order = topo_order();
    } catch (const Error&) {
      order = nodes();
    }
    for (Node* n : order) {
      os << "  ";
      for (std::size_t i = 0; i < n->outputs_.size(); ++i) os << (i ? ", %" : "%") << n->outputs_[i]->name_;
      os << " = " << (n->domain_.empty() ? "" : n->domain_ + ".") << n->op_type_ << "(";
      for (std::size_t i = 0; i < n->inputs_.size(); ++i)
        os << (i ? ", " : "") << (n->inputs_[i] ? "%" + n->inputs_[i]->name_ : std::string("none"));
      os << ")";
      if (!n->attrs_.empty()) {
        os << " {";
        bool first = true;
        for (auto& [k, a] : n->attrs_) {
          os << (first ? "" : ", ") << k << "=" << attribute_str(a);
          first = false;
        }
        os << "}";
      }
      os << " : ";
      for (std::size_t i = 0; i < n->outputs_.size(); ++i) os << (i ? ", " : "") << typed(n->outputs_[i]);
      if (!n->name_.empty()) os << "  # " << n->name_;
      os << "\n";
      for (auto& [attr, sub] : n->subgraphs()) {  // each subgraph indented under its node
        std::istringstream lines(sub->to_text());
        os << "    " << attr << ":\n";
        for (std::string line; std::getline(lines, line);) os << "    " << line << "\n";
      }
    }
    for (Value* v : outputs_) os << "  output %" << v->name_ << ": " << typed(v) << "\n";
    return os.str();
  }

  // Graphviz: ops as boxes, graph inputs/outputs as ellipses, edges labelled with type and shape.
  std::string to_dot() const {
    auto q = [](const std::string& s) {
      std::string o = "\"";
      for (char c : s) o += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
      return o + "\"";
    };
    std::ostringstream os;
    os << "digraph " << q(name) << " {\n  rankdir=TB;\n  node [fontname=\"Helvetica\"];\n";
    std::unordered_map<const Node*, std::string> id;
    std::size_t k = 0;
    for (auto& n : nodes_) id[n.get()] = "n" + std::to_string(k++);
    for (Value* v : inputs_) os << "  " << q("in:" + v->name_) << " [shape=ellipse,label=" << q(v->name_) << "];\n";
    for (Value* v : outputs_) os << "  " << q("out:" + v->name_) << " [shape=ellipse,label=" << q(v->name_) << "];\n";
    for (auto& n : nodes_)
      os << "  " << id[n.get()] << " [shape=box,label=" << q(n->op_type_ + (n->name_.empty() ? "" : "\n" + n->name_))
         << "];\n";
    for (auto& n : nodes_)
      for (Value* v : n->inputs_) {
        if (!v || v->constant_) continue;
        std::string src = v->producer_ ? id[v->producer_] : q("in:" + v->name_);
        os << "  " << src << " -> " << id[n.get()] << " [label=" << q(value_type_str(v)) << "];\n";
      }
    for (Value* v : outputs_)
      if (v->producer_) os << "  " << id[v->producer_] << " -> " << q("out:" + v->name_) << ";\n";
    os << "}\n";
    return os.str();
  }

 private:
  Value* new_typed_value(const std::string& name, DType dtype, Shape shape) {
    Value* v = new_value(name);
    v->dtype_ = dtype;
    v->shape_ = std::move(shape);
    return v;
  }
  Value* new_value(const std::string& name) {
    if (auto it = by_name_.find(name); it != by_name_.end()) {
      // Names are unique; a second definition of the same name reuses the entry so that callers
      // (importers) can detect the double definition and report it.
      return it->second;
    }
    auto v = std::make_unique<Value>();
    v->name_ = name;
    Value* p = v.get();
    by_name_[name] = p;
    values_.push_back(std::move(v));
    return p;
  }

  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<std::unique_ptr<Value>> values_;
  std::unordered_map<std::string, Value*> by_name_;
  std::vector<Value*> inputs_, outputs_, captures_;
  std::size_t counter_ = 0;
};

inline std::string subgraph_summary(const Graph& g) {
  return "graph " + g.name + " (" + std::to_string(g.num_nodes()) + " nodes)";
}

}  // namespace ondine
