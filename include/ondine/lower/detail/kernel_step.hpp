// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/kernel_step.hpp - a shape-free kernel (dynamic_kernels.hpp) as a step of a
// per-shape plan, so that an op written once as Ondine's own kernel (grouped-query attention,
// RMSNorm, rotary embeddings) runs the same code in both plans.
//
// The step reads its inputs where their row-major slots hold them and copies the kernel's results
// into its output slots (ReferenceStep's contract); a context keeps its own buffer pool for the
// kernel's scratch and results, so the contexts of one plan run it concurrently.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/dynamic_kernels.hpp"

namespace ondine::lower::detail {

class KernelStep : public ReferenceStep {
 public:
  KernelStep(runtime::StepInfo info, const Node* node, std::unique_ptr<dyn::Kernel> kernel, dnnl::engine engine,
             std::vector<Operand> inputs, std::vector<Operand> outputs)
      : ReferenceStep(std::move(info), node, reference::kernel_table().at(node->op_key()), std::move(inputs),
                      std::move(outputs)),
        kernel_(std::move(kernel)),
        engine_(std::move(engine)) {}

  struct State : runtime::StepState {
    explicit State(const dnnl::engine& e) : stream(e) {}
    std::shared_ptr<runtime::BufferPool> pool = runtime::BufferPool::make();
    dnnl::stream stream;
  };
  std::unique_ptr<runtime::StepState> make_state(runtime::ExecContext&) const override {
    return std::make_unique<State>(engine_);
  }

 protected:
  std::vector<Tensor> compute(runtime::ExecContext& ctx, const std::vector<Tensor>& args) const override {
    State& st = ctx.state<State>(*this);
    dyn::RunContext run{*st.pool, st.stream, {}, {}};
    return kernel_->run(run, args);
  }

 private:
  std::unique_ptr<dyn::Kernel> kernel_;
  dnnl::engine engine_;
};

// The operands of a step that reads `n`'s inputs in their row-major slots and writes its outputs into plain
// slots of their own (an output nobody reads gets none: optional outputs may not even be computed), and
// their types as "in, in -> out " for the step's detail.
struct RowMajorOperands {
  std::vector<ReferenceStep::Operand> inputs, outputs;
  std::string types;
};
inline RowMajorOperands row_major_operands(Lowering& L, const Node& n) {
  RowMajorOperands r;
  for (const Value* v : n.inputs()) {
    if (!v) {
      r.inputs.emplace_back();
      continue;
    }
    r.inputs.push_back({true, L.row_major_slot(v), v->dtype(), v->shape().sizes()});
    r.types += (r.types.empty() ? "" : ", ") + Graph::value_type_str(v);
  }
  r.types += " -> ";
  for (const Value* v : n.outputs()) {
    if (!v || (!v->has_uses() && !v->is_graph_output())) {
      r.outputs.emplace_back();
      continue;
    }
    SlotId slot = L.new_plain_slot(v);
    L.define_plain(v, slot);
    r.outputs.push_back({true, slot, v->dtype(), v->shape().sizes()});
    r.types += Graph::value_type_str(v) + " ";
  }
  return r;
}

// Lowers `n` to `kernel` on row-major slots of its inputs and outputs.
inline void add_kernel_step(Lowering& L, const Node& n, std::unique_ptr<dyn::Kernel> kernel,
                            const std::string& detail) {
  RowMajorOperands ops = row_major_operands(L, n);
  std::string implementation = kernel->implementation();
  L.add_step(std::make_unique<KernelStep>(runtime::StepInfo{n.name(), n.op_type(), implementation, detail}, &n,
                                          std::move(kernel), L.engine(), std::move(ops.inputs),
                                          std::move(ops.outputs)));
}

}  // namespace ondine::lower::detail
