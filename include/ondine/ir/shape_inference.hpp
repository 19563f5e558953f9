// SPDX-License-Identifier: Apache-2.0
// ondine/ir/shape_inference.hpp - shape and type inference over a whole graph.
//
// The per-op functions live in ir/infer/, gathered into one table at the end of this file. That part is
// compiled once in ondine::runtime when the program is built over the prebuilt libraries (ondine/config.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ondine/config.hpp"
#include "ondine/ir/infer/common.hpp"
#include "ondine/ir/limits.hpp"

namespace ondine {

// The table of inference functions for every op Ondine supports, keyed by Node::op_key() (ONNX ops by
// name, Ondine's own fused ops as "ondine.<op>").
ONDINE_CORE_FUNC const InferTable& infer_table();

// Infers one node: its outputs' dtypes and shapes, then what is known of their elements (shape values,
// ir/infer/values.hpp). Returns false for an op without inference (its outputs are left as they are).
ONDINE_CORE_FUNC bool infer_node(Node& n);

// Runs inference node by node in topological order, setting every node output's dtype and shape.
// Inconsistent shapes, and shapes too large to allocate (ir/limits.hpp), throw an Error naming the
// node and op. Nodes of unsupported ops get unknown outputs (check_supported() reports those ops all
// at once).
ONDINE_CORE_FUNC void infer_shapes(Graph& g);

namespace detail {
// A value whose static dims (symbolic ones left out) overflow int64 or pass Limits::max_tensor_bytes
// is an Error here, at import or compile, long before anything of that size is allocated.
inline void check_static_size(const Value& v, const char* what) {
  const Shape& s = v.shape();
  if (!s.rank_known()) return;
  std::vector<std::int64_t> dims;
  for (const Dim& d : s.dims())
    if (d.is_static()) dims.push_back(d.value);
  std::size_t width = v.dtype() == DType::Undefined ? 1 : std::max<std::size_t>(dtype_size(v.dtype()), 1);
  checked_tensor_bytes(dims, width, std::string(what) + " '" + v.name() + "'");
}
}  // namespace detail

}  // namespace ondine

// The definitions: in every file of a header-only program, in ondine::runtime alone otherwise.
#if !ONDINE_CORE_DECLARATIONS_ONLY
#include "ondine/ir/infer/control_flow.hpp"
#include "ondine/ir/infer/einsum.hpp"
#include "ondine/ir/infer/fused.hpp"
#include "ondine/ir/infer/layout.hpp"
#include "ondine/ir/infer/loss.hpp"
#include "ondine/ir/infer/math.hpp"
#include "ondine/ir/infer/nn.hpp"
#include "ondine/ir/infer/nn_extra.hpp"
#include "ondine/ir/infer/quantized.hpp"
#include "ondine/ir/infer/qoperator.hpp"
#include "ondine/ir/infer/random.hpp"
#include "ondine/ir/infer/rnn.hpp"
#include "ondine/ir/infer/sampling.hpp"
#include "ondine/ir/infer/selection.hpp"
#include "ondine/ir/infer/sequence.hpp"
#include "ondine/ir/infer/signal.hpp"
#include "ondine/ir/infer/tensor_ops.hpp"
#include "ondine/ir/infer/text.hpp"
#include "ondine/ir/infer/values.hpp"

namespace ondine {

ONDINE_CORE_FUNC const InferTable& infer_table() {
  static const InferTable table = [] {
    InferTable t;
    infer::register_nn_infer(t);
    infer::register_nn_extra_infer(t);
    infer::register_math_infer(t);
    infer::register_tensor_ops_infer(t);
    infer::register_fused_infer(t);
    infer::register_quantized_infer(t);
    infer::register_layout_infer(t);
    infer::register_qoperator_infer(t);
    infer::register_rnn_infer(t);
    infer::register_control_flow_infer(t);
    infer::register_selection_infer(t);
    infer::register_loss_infer(t);
    infer::register_einsum_infer(t);
    infer::register_sampling_infer(t);
    infer::register_signal_infer(t);
    infer::register_random_infer(t);
    infer::register_sequence_infer(t);
    infer::register_text_infer(t);
    return t;
  }();
  return table;
}

ONDINE_CORE_FUNC bool infer_node(Node& n) {
  auto it = infer_table().find(n.op_key());
  if (it == infer_table().end()) return false;
  it->second(n);
  for (Value* out : n.outputs())
    if (out) detail::check_static_size(*out, "output");
  infer::propagate_values(n);
  return true;
}

ONDINE_CORE_FUNC void infer_shapes(Graph& g) {
  for (Value* in : g.inputs()) detail::check_static_size(*in, "graph input");
  for (Node* n : g.topo_order()) {
    try {
      if (!infer_node(*n))
        for (Value* out : n->outputs()) out->set_shape(Shape::unknown());
    } catch (Error& e) {
      if (e.node().empty() && e.op().empty()) e.at_node(n->name(), n->op_type());
      throw;
    }
  }
}

}  // namespace ondine
#endif  // !ONDINE_CORE_DECLARATIONS_ONLY

