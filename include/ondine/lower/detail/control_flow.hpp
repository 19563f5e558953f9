// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/control_flow.hpp - If, Loop and Scan in a compiled model: their subgraphs are
// compiled once, with the parent, into models of their own.
//
// A subgraph becomes a graph whose inputs are its formal inputs and then its captures (by the outer
// names it reads them under), compiled with the parent's options when all those inputs have static
// shapes (an If branch reading static values, a Loop body whose carried values keep their shapes, a
// Scan body). The node itself is a step that runs the reference semantics of the op (which branch,
// how many iterations, carried values, scan outputs stacked: reference/control_flow.hpp) with each
// body run on its compiled model, one execution context per body per parent context. A body whose
// inputs are not static, or that fails to compile, runs on the reference executor, and the compile
// log says why.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ondine/lower/detail/context.hpp"
#include "ondine/reference/control_flow.hpp"

namespace ondine::lower {

namespace detail {

using CompiledBodies = std::map<const Graph*, std::shared_ptr<const CompiledModel>>;

// Per-call state of a control-flow node's bodies: an execution context per compiled body, a reference
// executor per other body, made at first use and kept for the iterations that follow.
struct BodyContexts {
  std::map<const Graph*, runtime::ExecContext> compiled;
  std::map<const Graph*, std::unique_ptr<ReferenceExecutor>> reference;
};

// Runs control-flow node `n` (If, Loop, Scan) on `args`, each body on its compiled model when it has one.
inline std::vector<Tensor> run_control_flow(const Node& n, const std::vector<Tensor>& args, const CompiledBodies& bodies,
                                            BodyContexts& contexts) {
  reference::detail_control_flow::BodyRunner runner =
      [&](const Graph& body, const std::vector<Tensor>& inputs,
          const std::function<Tensor(const std::string&)>& capture) -> std::vector<Tensor> {
    auto compiled = bodies.find(&body);
    if (compiled == bodies.end()) {
      auto& exec = contexts.reference[&body];
      if (!exec) exec = std::make_unique<ReferenceExecutor>(body);
      return exec->run_body(inputs, capture);
    }
    auto ctx = contexts.compiled.find(&body);
    if (ctx == contexts.compiled.end()) ctx = contexts.compiled.emplace(&body, compiled->second->make_context()).first;
    std::map<std::string, Tensor> feeds;
    for (std::size_t i = 0; i < inputs.size() && i < body.inputs().size(); ++i) feeds[body.inputs()[i]->name()] = inputs[i];
    for (const Value* c : body.captures()) feeds[c->name()] = capture(c->name());
    std::map<std::string, Tensor> out = compiled->second->run(ctx->second, feeds);
    std::vector<Tensor> results;
    for (const Value* o : body.outputs()) results.push_back(out.at(o->name()));
    return results;
  };
  using namespace reference::detail_control_flow;
  if (n.op_type() == "If") return if_kernel(n, args, &runner);
  if (n.op_type() == "Loop") return loop_kernel(n, args, &runner);
  return scan_kernel(n, args, &runner);
}

// Subgraphs read weights as captures of the enclosing graph's initializers (torch.jit.script exports
// every module parameter of a branch that way). In the graph being compiled, such a capture becomes a
// constant of the subgraph, nested subgraphs included, so that passes fold into it and the lowering
// packs it like any weight instead of reading it as a run-time input.
inline void inline_constant_captures(Graph& g) {
  for (Node* n : g.nodes()) {
    const auto& names = n->captured_names();
    for (const auto& [attr, sub] : n->subgraphs()) {
      for (Value* c : std::vector<Value*>(sub->captures().begin(), sub->captures().end()))
        for (std::size_t k = 0; k < names.size(); ++k) {
          const Value* outer = n->input(n->num_formal_inputs() + k);
          if (names[k] == c->name() && outer && outer->is_constant()) {
            sub->capture_to_constant(c, outer->constant());
            break;
          }
        }
      inline_constant_captures(*sub);
    }
  }
}

inline bool is_control_flow(const Node& n) {
  return !n.subgraphs().empty() && (n.op_type() == "If" || n.op_type() == "Loop" || n.op_type() == "Scan");
}

// A control-flow node in a compiled plan: reads its inputs from slots, runs, writes its outputs.
class ControlFlowStep : public ReferenceStep {
 public:
  ControlFlowStep(runtime::StepInfo info, const Node* node, std::vector<Operand> inputs, std::vector<Operand> outputs,
                  CompiledBodies bodies)
      : ReferenceStep(std::move(info), node, nullptr, std::move(inputs), std::move(outputs)), bodies_(std::move(bodies)) {}

  struct State : runtime::StepState {
    BodyContexts contexts;
  };
  std::unique_ptr<runtime::StepState> make_state(runtime::ExecContext& ctx) const override {
    (void)ctx;
    return std::make_unique<State>();
  }

 protected:
  std::vector<Tensor> compute(runtime::ExecContext& ctx, const std::vector<Tensor>& args) const override {
    return run_control_flow(*node(), args, bodies_, ctx.state<State>(*this).contexts);
  }

 private:
  CompiledBodies bodies_;
};

// The subgraphs of `n` that compile, compiled by `compile` (the driver) with `options`; `log` says which did
// not and why.
inline CompiledBodies compile_bodies(const Node& n, const CompileOptions& options, CompileFn compile) {
  CompiledBodies bodies;
  for (const auto& [attr, sub] : n.subgraphs()) {
    const std::string what = "subgraph '" + attr + "' of " + n.op_type() + " '" + n.name() + "'";
    Graph body = sub->clone();
    body.captures_to_inputs();
    std::string why;
    for (const Value* in : body.inputs())
      if (why.empty() && (in->dtype() == DType::Undefined || !in->shape().is_static()))
        why = "its input '" + in->name() + "' has no static shape (" + in->shape().str() + ")";
    if (why.empty()) {
      CompileOptions body_options = options;
      body_options.progress = nullptr;  // the enclosing compile reports progress, not each body
      if (options.log) {
        auto log = options.log;
        body_options.log = [log, what](const std::string& line) { log("  " + what + ": " + line); };
      }
      try {
        bodies.emplace(sub, std::make_shared<const CompiledModel>(compile(std::move(body), body_options)));
        continue;
      } catch (const Error& e) {
        why = std::string("compiling it failed: ") + e.what();
      }
    }
    if (options.log) options.log(what + " runs on the reference executor: " + why);
  }
  return bodies;
}

}  // namespace detail
}  // namespace ondine::lower
