// SPDX-License-Identifier: Apache-2.0
// ondine/passes/fake_quant.hpp - fake-quant: the QuantizeLinear/DequantizeLinear pairs a QDQ model keeps in
// float (those fuse-qdq did not turn into int8 kernels: layers with 8-bit weights on a CPU without VNNI
// under --exact-int8-weights, layers kept fp32, pairs around ops with no int8 kernel) become one
// ondine.FakeQuant each, an activation that joins the post-op chain of the op before it (fuse, then the
// lowering), so the pair costs no pass over memory and no layout change of its own.
//
// Rewrites (x a float32 value; scale, zero point and type per tensor, constants, the same in both ops):
//   DequantizeLinear(QuantizeLinear(x, s, zp), s, zp) -> ondine.FakeQuant(x, scale = s, zero_point = zp, to)
// Semantics (ir/fused_ops.hpp): bit for bit the pair's float32 result. The FakeQuant takes the
// DequantizeLinear's name and its output's name; the QuantizeLinear goes when nothing else reads it (an
// int8 kernel may still: then both stay, each computing from x).
// Must not fire: parameters per channel or not constant, a pair whose scales, zero points or types differ,
// a DequantizeLinear of a constant (a weight: fold-constants dequantizes it), a QuantizeLinear of
// something other than float32. Runs after fuse-qdq, which takes the pairs that can run in int8 first.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/passes/detail/fusion.hpp"
#include "ondine/passes/fuse_qdq.hpp"
#include "ondine/passes/pass.hpp"

namespace ondine {

struct FakeQuantPairs {
  static constexpr const char* name = "fake-quant";

  bool run(Graph& g, PassContext& ctx) {
    namespace qdq = detail::qdq;
    bool changed = false;
    for (Node* dq : g.topo_order()) {
      if (!qdq::is_op(dq, "DequantizeLinear") || dq->num_outputs() != 1) continue;
      std::optional<qdq::Act> act = qdq::dq_act(dq->output(0));
      if (!act) continue;
      Node* q = act->q->producer();
      std::optional<qdq::QParam> qp = q ? qdq::q_params(q) : std::nullopt;
      if (!qp || !qdq::same(*qp, act->p) || q->output(0) != act->q) continue;
      Value* x = q->input(0);
      g.opsets.emplace(fused::kDomain, fused::kDomainVersion);
      const std::string root = dq->name();
      detail::fusion::add_replacement(
          g, dq->output(0), "FakeQuant", {x},
          {{"scale", act->p.scale},
           {"zero_point", static_cast<std::int64_t>(act->p.zero_point)},
           {"to", std::string(act->p.type == DType::UInt8 ? "uint8" : "int8")}},
          root, fused::kDomain, fused::kDomainVersion);
      detail::fusion::erase_unused(g, {dq, q});
      ctx.rewrite("'" + root + "': QuantizeLinear + DequantizeLinear of '" + x->name() + "' -> ondine.FakeQuant");
      changed = true;
    }
    if (changed) g.remove_dead_values();
    return changed;
  }
};

}  // namespace ondine
