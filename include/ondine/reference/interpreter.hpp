// SPDX-License-Identifier: Apache-2.0
// ondine/reference/interpreter.hpp - the reference executor's interpreter: runs a graph node by node, each on
// its kernel from reference::kernel_table().
//
// The table is defined by reference/executor.hpp, the header to include: it lists every kernel, the control-flow
// ones (reference/control_flow.hpp) among them, and those run their subgraphs on this interpreter. Declaring
// the table here and defining it there keeps the includes one way.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ondine/config.hpp"
#include "ondine/ir/graph.hpp"
#include "ondine/ir/shape_inference.hpp"
#include "ondine/reference/common.hpp"

namespace ondine {

namespace reference {
// Every op's reference kernel, by op key (reference/executor.hpp).
ONDINE_CORE_FUNC const KernelTable& kernel_table();
}  // namespace reference

// An op is supported when it has both shape inference and a reference kernel.
inline bool is_supported_op(const std::string& domain, const std::string& op_type) {
  std::string key = domain.empty() || domain == "ai.onnx" ? op_type : domain + "." + op_type;
  return reference::kernel_table().count(key) && infer_table().count(key);
}

inline std::set<std::string> supported_ops() {
  std::set<std::string> ops;
  for (auto& [op, k] : reference::kernel_table())
    if (infer_table().count(op)) ops.insert(op);
  return ops;
}

// The nodes whose ops Ondine does not support, in graph order, those inside subgraphs (If branches, Loop
// and Scan bodies) after their node.
inline std::vector<const Node*> unsupported_nodes(const Graph& g) {
  std::vector<const Node*> out;
  for (Node* n : g.nodes()) {
    if (!is_supported_op(n->domain(), n->op_type())) out.push_back(n);
    for (auto& [attr, sub] : n->subgraphs())
      for (const Node* inner : unsupported_nodes(*sub)) out.push_back(inner);
  }
  return out;
}

// Throws one Error listing every unsupported op (with a node of each), so a user sees them all at once.
inline void check_supported(const Graph& g) {
  auto bad = unsupported_nodes(g);
  if (bad.empty()) return;
  std::map<std::string, std::vector<std::string>> by_op;
  for (const Node* n : bad) by_op[n->op_key()].push_back(n->name());
  std::string msg = "unsupported op" + std::string(by_op.size() > 1 ? "s" : "") + ": ";
  bool first = true;
  for (auto& [op, names] : by_op) {
    msg += (first ? "" : "; ") + op + " (" + std::to_string(names.size()) + " node" + (names.size() > 1 ? "s" : "") +
           ", e.g. '" + names.front() + "')";
    first = false;
  }
  throw Error(msg).at_node(bad.front()->name(), bad.front()->op_type());
}

// Checks a set of named inputs against the graph's declared inputs: every input present, no unknown
// name, dtype equal, rank equal, static dims equal, and each named symbolic dim bound to one size.
inline void check_inputs(const Graph& g, const std::map<std::string, Tensor>& inputs) {
  std::map<std::string, std::pair<std::int64_t, std::string>> bound;  // symbol -> size, the input that set it
  for (Value* in : g.inputs()) {
    auto it = inputs.find(in->name());
    if (it == inputs.end()) throw Error("missing input '" + in->name() + "' (" + Graph::value_type_str(in) + ")");
    const Tensor& t = it->second;
    if (!in->is_tensor()) {  // a sequence or optional: its kind and element type (the elements' shapes vary)
      const bool none_ok = is_optional_kind(in->kind()) && t.is_none();
      const bool kind_ok = none_ok || (is_sequence_kind(in->kind()) ? t.is_sequence() : t.kind() == Tensor::Kind::Dense);
      if (!kind_ok || (!none_ok && in->dtype() != DType::Undefined && t.dtype() != in->dtype()))
        throw Error("input '" + in->name() + "' is not a value of type " + Graph::value_type_str(in));
      continue;
    }
    if (t.kind() != Tensor::Kind::Dense)
      throw Error("input '" + in->name() + "' is a sequence or optional, the model expects a tensor (" +
                  Graph::value_type_str(in) + ")");
    if (t.dtype() != in->dtype())
      throw Error("input '" + in->name() + "' has dtype " + std::string(dtype_name(t.dtype())) + ", the model expects " +
                  std::string(dtype_name(in->dtype())));
    const Shape& s = in->shape();
    if (!s.rank_known()) continue;
    if (t.rank() != s.rank())
      throw Error("input '" + in->name() + "' has shape " + dims_str(t.dims()) + ", the model expects " + s.str());
    for (std::size_t i = 0; i < s.rank(); ++i) {
      const Dim& d = s[i];
      if (d.is_static() && d.value != t.dims()[i])
        throw Error("input '" + in->name() + "' has shape " + dims_str(t.dims()) + ", the model expects " + s.str() +
                    ": dim " + std::to_string(i) + " is " + std::to_string(t.dims()[i]) + ", expected " +
                    std::to_string(d.value));
      if (!d.is_static() && !d.symbol.empty()) {
        auto [b, fresh] = bound.emplace(d.symbol, std::make_pair(t.dims()[i], in->name()));
        if (!fresh && b->second.first != t.dims()[i])
          throw Error("input '" + in->name() + "' binds dim '" + d.symbol + "' to " + std::to_string(t.dims()[i]) +
                      " but input '" + b->second.second + "' bound it to " + std::to_string(b->second.first));
      }
    }
  }
  for (auto& [name, t] : inputs) {
    (void)t;
    Value* v = g.find_value(name);
    if (!v || !v->is_graph_input()) throw Error("'" + name + "' is not an input of the model");
  }
}

class ReferenceExecutor {
 public:
  // Checks that every op is supported (one error listing them all) before anything runs.
  explicit ReferenceExecutor(const Graph& g) : graph_(g), order_(g.topo_order()) { check_supported(g); }

  // Runs node `n` of the graph with `kernel` instead of its reference kernel (a compiled engine runs a
  // control-flow node's bodies on their compiled plans this way).
  void override_kernel(const Node* n, reference::Kernel kernel) { overrides_[n] = std::move(kernel); }
  // The kernel override_kernel installed for `n`, or an empty one.
  reference::Kernel overridden_kernel(const Node* n) const {
    auto it = overrides_.find(n);
    return it == overrides_.end() ? reference::Kernel() : it->second;
  }
  const Graph& graph() const { return graph_; }

  // Runs the graph; returns the graph outputs by name. With `keep_all`, every intermediate value too.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs, bool keep_all = false) const {
    check_inputs(graph_, inputs);
    std::unordered_map<const Value*, Tensor> env;
    for (Value* in : graph_.inputs()) env[in] = inputs.at(in->name());
    execute(env, keep_all);
    std::map<std::string, Tensor> result;
    if (keep_all)
      for (auto& [v, t] : env) result[v->name()] = t;
    for (Value* o : graph_.outputs()) result[o->name()] = output(env, o);
    return result;
  }

  // Runs a subgraph (a branch or loop body): its inputs by position, its captures from `capture` by
  // name; returns its outputs in order.
  std::vector<Tensor> run_body(const std::vector<Tensor>& inputs,
                               const std::function<Tensor(const std::string&)>& capture) const {
    if (inputs.size() != graph_.inputs().size())
      throw Error("subgraph '" + graph_.name + "' takes " + std::to_string(graph_.inputs().size()) + " inputs, given " +
                  std::to_string(inputs.size()));
    std::unordered_map<const Value*, Tensor> env;
    for (std::size_t i = 0; i < inputs.size(); ++i) env[graph_.inputs()[i]] = inputs[i];
    for (Value* c : graph_.captures()) env[c] = capture(c->name());
    execute(env, false);
    std::vector<Tensor> out;
    for (Value* o : graph_.outputs()) out.push_back(output(env, o));
    return out;
  }

 private:
  static Tensor output(const std::unordered_map<const Value*, Tensor>& env, const Value* o) {
    if (auto it = env.find(o); it != env.end() && !it->second.empty()) return it->second;
    if (o->is_constant()) return o->constant();
    throw Error("graph output '" + o->name() + "' was not computed");
  }

  void execute(std::unordered_map<const Value*, Tensor>& env, bool keep_all) const {
    const auto& kernels = reference::kernel_table();
    std::unordered_map<const Value*, std::size_t> remaining;  // uses left, so memory is freed early
    for (Value* v : graph_.values()) remaining[v] = v->uses().size();
    auto lookup = [&](const Value* v) -> Tensor {
      if (!v) return Tensor();
      if (auto it = env.find(v); it != env.end()) return it->second;
      if (v->is_constant()) return v->constant();
      return Tensor();
    };
    for (Node* n : order_) {
      std::vector<Tensor> args;
      args.reserve(n->num_inputs());
      for (std::size_t i = 0; i < n->num_inputs(); ++i) {
        Value* v = n->input(i);
        Tensor t = lookup(v);
        if (v && t.empty())
          throw n->error("input '" + v->name() + "' has no value (not produced, not an input, not a constant)");
        args.push_back(std::move(t));
      }
      std::vector<Tensor> outs;
      try {
        auto overridden = overrides_.find(n);
        outs = overridden != overrides_.end() ? overridden->second(*n, args) : kernels.at(n->op_key())(*n, args);
      } catch (Error& e) {
        if (e.node().empty() && e.op().empty()) e.at_node(n->name(), n->op_type());
        throw;
      } catch (const std::exception& e) {
        throw n->error(e.what());
      }
      if (outs.size() < n->num_outputs())
        throw n->error("kernel returned " + std::to_string(outs.size()) + " outputs, expected " +
                       std::to_string(n->num_outputs()));
      for (std::size_t i = 0; i < n->num_outputs(); ++i) env[n->output(i)] = std::move(outs[i]);
      if (!keep_all)
        for (Value* v : n->inputs())
          if (v && remaining[v] > 0 && --remaining[v] == 0 && !v->is_graph_output() && !v->is_graph_input() &&
              !v->is_capture())
            env.erase(v);
    }
  }

  const Graph& graph_;
  std::vector<Node*> order_;
  std::unordered_map<const Node*, reference::Kernel> overrides_;
};

}  // namespace ondine
