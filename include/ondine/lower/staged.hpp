// SPDX-License-Identifier: Apache-2.0
// ondine/lower/staged.hpp - models whose shapes depend on data, compiled in stages.
//
// compile() needs every shape static once the graph inputs are bound. Some are not: NonZero's output,
// a Loop whose trip count comes from data, an If whose branches return different shapes, TopK with a
// run-time K, and whatever reads those. Such a graph is split and compiled in stages:
//   1. the static part: every node whose inputs and outputs have static shapes and that reads nothing
//      data-dependent, compiled as usual; its outputs are the graph outputs it computes and the values
//      the later stages read;
//   2. the frontier: the nodes that read only static values but write data-dependent shapes; they run
//      on their reference kernels once the static part has run;
//   3. the rest: a graph of its own whose inputs are the values it reads from stages 1 and 2 (a dim not
//      known at compile time gets a symbol of its own), run through a PlanCache: compiled once per shape
//      the data gives it, reused while the shapes repeat, and staged again if it has data-dependent
//      shapes of its own. An empty tensor is a shape like any other: the nodes without elements run on
//      their reference kernels in that specialisation.
// Sequences, optionals and string tensors are staged the same way, since the compiled plan holds numeric
// tensors only: a node
// that makes one or reads a sequence graph input is at the frontier, and a rest that passes them around
// runs on the reference kernels (no PlanCache); a sequence graph input goes straight to those stages.
// The compile log and CompiledModel::to_text() say where the model was split and which nodes run on
// reference kernels at the frontier.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ondine/lower/lowering.hpp"
#include "ondine/lower/options.hpp"
#include "ondine/lower/plan_cache.hpp"

namespace ondine::lower {
namespace detail {

// A graph made of `nodes` of `g` (in topological order): `inputs` become its graph inputs (a dim that
// is not static gets the symbol "<value>:<index>"), constants are shared, subgraphs copied.
inline Graph extract_graph(const Graph& g, const std::vector<Node*>& nodes, const std::vector<Value*>& inputs,
                           const std::vector<Value*>& outputs, const std::string& name) {
  Graph out;
  out.name = name;
  out.opsets = g.opsets;
  out.ir_version = g.ir_version;
  std::unordered_map<const Value*, Value*> map;
  for (Value* v : inputs) {
    std::vector<Dim> dims = v->shape().dims();
    for (std::size_t i = 0; i < dims.size(); ++i)
      if (!dims[i].is_static()) dims[i] = Dim::named(v->name() + ":" + std::to_string(i));
    map[v] = out.add_input(v->name(), v->dtype(), Shape(dims));
    map[v]->set_kind(v->kind());
  }
  auto mapped = [&](Value* v) -> Value* {
    if (!v) return nullptr;
    if (auto it = map.find(v); it != map.end()) return it->second;
    if (v->is_constant()) return map[v] = out.add_constant(v->name(), v->constant());
    throw Error("internal: staged compile: value '" + v->name() + "' is read but not passed in");
  };
  for (Node* n : nodes) {
    std::vector<Value*> ins;
    for (std::size_t i = 0; i < n->num_formal_inputs(); ++i) ins.push_back(mapped(n->input(i)));
    std::vector<std::string> outs;
    for (Value* o : n->outputs()) outs.push_back(o->name());
    std::map<std::string, Attribute> attrs = n->attrs();
    for (auto& [k, a] : attrs)
      if (auto* sub = std::get_if<GraphAttr>(&a); sub && *sub) *sub = std::make_shared<Graph>((*sub)->clone());
    Node* c = out.add_node(n->op_type(), ins, outs, std::move(attrs), n->name(), n->domain());
    c->set_opset(n->opset());
    for (std::size_t k = 0; k < n->captured_names().size(); ++k)
      c->add_implicit_input(mapped(n->input(n->num_formal_inputs() + k)), n->captured_names()[k]);
    for (std::size_t i = 0; i < n->num_outputs(); ++i) {
      c->output(i)->set_dtype(n->output(i)->dtype());
      c->output(i)->set_shape(n->output(i)->shape());
      c->output(i)->set_kind(n->output(i)->kind());
      map[n->output(i)] = c->output(i);
    }
  }
  for (Value* v : outputs) out.add_output(mapped(v));
  return out;
}

// Sequences, optionals and strings have no static type here: the compiled plan holds tensors of numbers
// only (in_plan, lower/compiler.hpp), so nodes that make them run at the frontier and nodes that read
// them in the rest (on reference kernels, below).
inline bool has_static_type(const Value* v) {
  return in_plan(v) && v->dtype() != DType::Undefined && v->shape().is_static();
}

inline bool has_non_tensor_values(const Graph& g) {
  for (Value* v : g.inputs())
    if (!in_plan(v)) return true;
  for (Node* n : g.nodes())
    for (Value* v : n->outputs())
      if (v && !in_plan(v)) return true;
  return false;
}

// Stages 2 and 3 of a staged model: the frontier on its reference kernels, then the rest through a
// PlanCache.
class StagedRest : public runtime::Continuation {
 public:
  // `outside_inputs`: the graph inputs the compiled part has no slot for (sequences, optionals, strings).
  StagedRest(Graph frontier, std::optional<Graph> rest, const CompileOptions& options, CompileFn compile,
             std::set<std::string> outside_inputs = {})
      : frontier_(std::make_shared<Graph>(std::move(frontier))), outside_inputs_(std::move(outside_inputs)) {
    frontier_names_ = node_names(*frontier_);
    // A Loop or If at the frontier (its output shapes depend on data) still runs its bodies compiled.
    for (Node* n : frontier_->nodes())
      if (is_control_flow(*n)) {
        CompiledBodies bodies = compile_bodies(*n, options, compile);
        if (!bodies.empty()) frontier_bodies_.emplace(n, std::move(bodies));
      }
    if (rest) {
      rest_names_ = node_names(*rest);
      rest_inputs_ = input_names(*rest);
      // A rest that passes sequences or optionals around runs on the reference kernels: the compiled
      // plan carries tensors only.
      if (has_non_tensor_values(*rest)) rest_graph_ = std::make_shared<Graph>(std::move(*rest));
      else rest_ = std::make_shared<PlanCache>(std::move(*rest), options, 8, compile);
    }
  }

  void run(std::map<std::string, Tensor>& values, runtime::StageTimes* times) const override {
    std::map<std::string, Tensor> in;
    for (Value* v : frontier_->inputs()) in[v->name()] = value(values, v->name());
    ReferenceExecutor frontier(*frontier_);
    // This run's body contexts, taken from the pool (runs on several threads never share one) and given
    // back after a run that succeeded, so that a body's arena and step states are made once, not per run
    // (gated_pt: a 1 MB branch output's arena allocated and faulted in at every run).
    std::unique_ptr<FrontierContexts> contexts = take_contexts();
    for (auto& [node, bodies] : frontier_bodies_)
      frontier.override_kernel(node, [c = contexts.get(), &bodies = bodies](const Node& n, const std::vector<Tensor>& args) {
        return run_control_flow(n, args, bodies, (*c)[&n]);
      });
    if (times) time_frontier(frontier, *times);
    for (auto& [name, t] : frontier.run(in)) values[name] = t;
    give_back(std::move(contexts));
    if (!rest_ && !rest_graph_) return;
    std::map<std::string, Tensor> rest_in;
    for (const std::string& name : rest_inputs_) rest_in[name] = value(values, name);
    // An empty input (no detection, no proposal at one pyramid level) compiles like any other shape: the
    // nodes it leaves without elements run on their reference kernels (touches_empty, compiler.hpp),
    // the rest as usual. (Running the whole stage on the reference executor then cost Faster R-CNN its
    // box head on the reference GEMM: 2 s an image.)
    std::map<std::string, Tensor> out;
    if (rest_) {
      out = rest_->run(rest_in, times);
    } else {
      ReferenceExecutor rest(*rest_graph_);
      if (times) time_frontier(rest, *times);
      out = rest.run(rest_in);
    }
    for (auto& [name, t] : out) values[name] = t;
  }

  // Sequence, optional and string graph inputs bypass the compiled part: the later stages read them (or
  // nothing does).
  bool reads_input(const std::string& name) const override { return outside_inputs_.count(name) != 0; }

  std::string to_text() const override {
    std::string s = "  then, on reference kernels (their output shapes depend on data): " + frontier_names_ + "\n";
    for (auto& [node, bodies] : frontier_bodies_)
      s += "    " + node->op_type() + " '" + node->name() + "' runs " + std::to_string(bodies.size()) +
           " of its subgraphs compiled\n";
    if (rest_)
      s += "  then, compiled per shape at run time (" + std::to_string(rest_->compilations()) +
           " compiled so far): " + rest_names_ + "\n";
    else if (rest_graph_)
      s += "  then, on reference kernels (they read sequences or optionals): " + rest_names_ + "\n";
    return s;
  }

 private:
  using FrontierContexts = std::map<const Node*, BodyContexts>;

  // A profiled run: every node of `executor` timed (its kernel, or the override already installed: a
  // Loop or If running its compiled bodies), as a step on reference kernels.
  static void time_frontier(ReferenceExecutor& executor, runtime::StageTimes& times) {
    const auto& kernels = reference::kernel_table();
    for (Node* n : executor.graph().nodes()) {
      reference::Kernel kernel = executor.overridden_kernel(n);
      const std::string implementation = kernel ? "compiled subgraphs" : "reference";
      if (!kernel) kernel = kernels.at(n->op_key());
      executor.override_kernel(n, [kernel, implementation, &times](const Node& node, const std::vector<Tensor>& args) {
        auto t0 = std::chrono::steady_clock::now();
        std::vector<Tensor> out = kernel(node, args);
        times.add(node.op_type(), implementation, node.name(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        return out;
      });
    }
  }
  std::unique_ptr<FrontierContexts> take_contexts() const {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (pool_.empty()) return std::make_unique<FrontierContexts>();
    std::unique_ptr<FrontierContexts> c = std::move(pool_.back());
    pool_.pop_back();
    return c;
  }
  void give_back(std::unique_ptr<FrontierContexts> c) const {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    pool_.push_back(std::move(c));
  }

  // A value the stage reads: computed before it, or a graph input the compiled part did not bind (a
  // sequence, optional or string the caller may have left out).
  static const Tensor& value(const std::map<std::string, Tensor>& values, const std::string& name) {
    auto it = values.find(name);
    if (it == values.end()) throw Error("missing input '" + name + "'");
    return it->second;
  }
  static std::string node_names(const Graph& g) {
    std::string s;
    std::size_t k = 0;
    for (Node* n : g.nodes()) {
      if (k++ == 6) return s + ", ... (" + std::to_string(g.num_nodes()) + " nodes)";
      s += (s.empty() ? "" : ", ") + n->op_type() + " '" + n->name() + "'";
    }
    return s;
  }
  static std::vector<std::string> input_names(const Graph& g) {
    std::vector<std::string> names;
    for (Value* v : g.inputs()) names.push_back(v->name());
    return names;
  }

  std::shared_ptr<Graph> frontier_;
  std::set<std::string> outside_inputs_;
  std::map<const Node*, CompiledBodies> frontier_bodies_;
  mutable std::mutex pool_mutex_;
  mutable std::vector<std::unique_ptr<FrontierContexts>> pool_;  // at most one per concurrent run
  std::shared_ptr<PlanCache> rest_;
  std::shared_ptr<Graph> rest_graph_;  // a rest that reads sequences or optionals: the reference executor
  std::vector<std::string> rest_inputs_;
  std::string frontier_names_, rest_names_;
};

// Splits `g` (inputs bound, shapes inferred and folded) into the three stages and compiles the first; `compile`
// (the driver) compiles the stages.
inline CompiledModel compile_staged(const Graph& g, const CompileOptions& options, CompileFn compile) {
  std::set<const Value*> available;  // values the static part has (or that are graph inputs / constants)
  for (Value* v : g.inputs()) available.insert(v);
  auto is_available = [&](const Value* v) { return !v || v->is_constant() || available.count(v); };
  std::vector<Node*> order = g.topo_order(), prefix, frontier, rest;
  for (Node* n : order) {
    bool inputs_ready = true, inputs_tensors = true;
    for (Value* v : n->inputs()) {
      inputs_ready = inputs_ready && is_available(v);
      inputs_tensors = inputs_tensors && (!v || in_plan(v));
    }
    bool outputs_static = inputs_tensors;  // a node reading a sequence input runs at the frontier
    for (Value* v : n->outputs()) outputs_static = outputs_static && (!v || has_static_type(v));
    if (inputs_ready && outputs_static) {
      prefix.push_back(n);
      for (Value* v : n->outputs()) available.insert(v);
    } else if (inputs_ready) {
      frontier.push_back(n);
    } else {
      rest.push_back(n);
    }
  }
  std::set<const Node*> in_frontier(frontier.begin(), frontier.end()), in_rest(rest.begin(), rest.end());
  // What each later stage reads from before it (inputs in first-read order), and what it must give back.
  auto reads_from_outside = [&](const std::vector<Node*>& nodes, const std::set<const Node*>& own) {
    std::vector<Value*> reads;
    std::set<const Value*> seen;
    for (Node* n : nodes)
      for (Value* v : n->inputs())
        if (v && !v->is_constant() && !(v->producer() && own.count(v->producer())) && seen.insert(v).second)
          reads.push_back(v);
    return reads;
  };
  std::vector<Value*> frontier_in = reads_from_outside(frontier, in_frontier);
  std::vector<Value*> rest_in = reads_from_outside(rest, in_rest);
  auto produced_by = [&](const Value* v, const std::set<const Node*>& nodes) {
    return v->producer() && nodes.count(v->producer()) != 0;
  };
  std::vector<Value*> frontier_out, prefix_out, rest_out;
  std::set<const Value*> seen;
  auto add_unique = [&](std::vector<Value*>& list, Value* v) {
    // A sequence graph input is not in the compiled part: later stages read it from the run's inputs.
    if (v->is_graph_input() && !in_plan(v)) return;
    if (std::find(list.begin(), list.end(), v) == list.end()) list.push_back(v);
  };
  for (Value* v : g.outputs()) {
    if (produced_by(v, in_rest)) add_unique(rest_out, v);
    else if (produced_by(v, in_frontier)) add_unique(frontier_out, v);
    else add_unique(prefix_out, v);
  }
  for (Value* v : rest_in) {
    if (produced_by(v, in_frontier)) add_unique(frontier_out, v);
    else add_unique(prefix_out, v);
  }
  for (Value* v : frontier_in) add_unique(prefix_out, v);

  std::vector<Value*> prefix_inputs;
  std::set<std::string> outside_inputs;
  for (Value* v : g.inputs()) {
    if (in_plan(v)) prefix_inputs.push_back(v);
    else outside_inputs.insert(v->name());
  }
  Graph first = extract_graph(g, prefix, prefix_inputs, prefix_out, g.name);
  Graph second = extract_graph(g, frontier, frontier_in, frontier_out, g.name + ".frontier");
  std::optional<Graph> third;
  if (!rest.empty()) third = extract_graph(g, rest, rest_in, rest_out, g.name + ".rest");
  if (options.log) {
    options.log("staged: " + std::to_string(prefix.size()) + " nodes compiled now; " + std::to_string(frontier.size()) +
                " with data-dependent output shapes on reference kernels (first: " + frontier.front()->op_type() +
                " '" + frontier.front()->name() + "'); " + std::to_string(rest.size()) +
                " after them compiled per shape at run time");
  }
  CompileOptions first_options = options;
  CompiledModel model = compile(std::move(first), first_options);
  std::vector<std::string> outputs;
  for (Value* v : g.outputs()) outputs.push_back(v->name());
  model.set_continuation(
      std::make_shared<StagedRest>(std::move(second), std::move(third), options, compile, std::move(outside_inputs)),
      outputs);
  return model;
}

}  // namespace detail
}  // namespace ondine::lower
