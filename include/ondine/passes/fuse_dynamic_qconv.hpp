// SPDX-License-Identifier: Apache-2.0
// ondine/passes/fuse_dynamic_qconv.hpp - fuse-dynamic-qconv: the dynamically quantized convolution
// (what ONNX Runtime's quantize_dynamic writes for CNNs) as one ondine.DynQConv (definition:
// ir/infer/quantized.hpp), which lowers to one oneDNN convolution with the activation's scale and
// zero point read at run time.
//
//   (a, a_scale, a_zp) = DynamicQuantizeLinear(x)
//   act*(Add?(Mul(Cast<float>(ConvInteger(a, W, a_zp, W_zp?)), Mul(a_scale, w_scale)), B))
//     -> ondine.DynQConv(a, a_scale, a_zp, W - W_zp, B?)   Conv's attributes, w_scale and the activations
//
// Preconditions (else nothing changes): W an int8 or uint8 constant with no zero point, one, or one per
// output channel; w_scale and B float32 constants per tensor or per output channel ([M], [M, 1, 1] or
// [1, M, 1, 1] for 2-D: broadcast along the result's channel axis, never another); every intermediate
// read only by the next op (passes/detail/dynamic_quant.hpp). W - W_zp is int8 when it fits, else int16:
// asymmetric uint8 weights (quantize_dynamic's QUInt8) centre on their zero point and span up to
// [-255, 255], which the lowering computes exactly on float32 kernels.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ondine/passes/fuse_dynamic_qmatmul.hpp"

namespace ondine {

struct FuseDynamicQConv {
  static constexpr const char* name = "fuse-dynamic-qconv";

  bool run(Graph& g, PassContext& ctx) {
    bool changed = false;
    std::vector<Node*> candidates;  // first: a fusion erases Cast/Mul/Add nodes a later visit would see
    for (Node* n : g.topo_order())
      if (n->domain().empty() && n->op_type() == "ConvInteger") candidates.push_back(n);
    for (Node* n : candidates) {
      const Value* w = n->num_inputs() > 1 ? n->input(1) : nullptr;
      const Value* y = n->output(0);
      if (!w || !w->is_constant() || w->constant().rank() < 3 || !y->shape().rank_known() ||
          y->shape().rank() != w->constant().rank())
        continue;
      detail::dynq::Match m;
      if (!detail::dynq::match(n, 0, 1, m)) continue;
      std::map<std::string, Attribute> attrs;
      for (const char* a : {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})
        if (n->has_attr(a)) attrs[a] = n->attrs().at(a);
      ctx.rewrite(detail::dynq::fuse(g, m, "DynQConv", std::move(attrs)));
      changed = true;
    }
    if (changed) g.remove_dead_values();
    return changed;
  }
};

}  // namespace ondine
