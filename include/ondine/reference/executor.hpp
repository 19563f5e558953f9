// SPDX-License-Identifier: Apache-2.0
// ondine/reference/executor.hpp - the reference executor: runs a graph node by node on naive kernels
// (the interpreter, class ReferenceExecutor: reference/interpreter.hpp), each op on its kernel from the table
// defined here.
//
// It is the oracle that every optimisation and every compiled model is checked against, so it is kept
// independent of the passes and of oneDNN, and it checks its inputs strictly. The table is compiled once in
// ondine::runtime when the program is built over the prebuilt libraries (ondine/config.hpp); the kernels'
// own headers then stay out of the files that include this one.
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
#include "ondine/reference/interpreter.hpp"

// The definitions: in every file of a header-only program, in ondine::runtime alone otherwise.
#if !ONDINE_CORE_DECLARATIONS_ONLY
#include "ondine/reference/control_flow.hpp"
#include "ondine/reference/einsum.hpp"
#include "ondine/reference/fused.hpp"
#include "ondine/reference/layout.hpp"
#include "ondine/reference/loss.hpp"
#include "ondine/reference/math.hpp"
#include "ondine/reference/nn.hpp"
#include "ondine/reference/nn_extra.hpp"
#include "ondine/reference/quantized.hpp"
#include "ondine/reference/qoperator.hpp"
#include "ondine/reference/random.hpp"
#include "ondine/reference/rnn.hpp"
#include "ondine/reference/sampling.hpp"
#include "ondine/reference/selection.hpp"
#include "ondine/reference/sequence.hpp"
#include "ondine/reference/signal.hpp"
#include "ondine/reference/tensor_ops.hpp"
#include "ondine/reference/text.hpp"

namespace ondine {

namespace reference {
ONDINE_CORE_FUNC const KernelTable& kernel_table() {
  static const KernelTable table = [] {
    KernelTable t;
    register_nn_kernels(t);
    register_math_kernels(t);
    register_tensor_ops_kernels(t);
    register_fused_kernels(t);
    register_quantized_kernels(t);
    register_layout_kernels(t);
    register_qoperator_kernels(t);
    register_rnn_kernels(t);
    register_control_flow_kernels(t);
    register_selection_kernels(t);
    register_loss_kernels(t);
    register_einsum_kernels(t);
    register_sampling_kernels(t);
    register_signal_kernels(t);
    register_random_kernels(t);
    register_nn_extra_kernels(t);
    register_sequence_kernels(t);
    register_text_kernels(t);
    return t;
  }();
  return table;
}
}  // namespace reference

}  // namespace ondine
#endif  // !ONDINE_CORE_DECLARATIONS_ONLY
