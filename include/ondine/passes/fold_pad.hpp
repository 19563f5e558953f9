// SPDX-License-Identifier: Apache-2.0
// ondine/passes/fold_pad.hpp - fold-pad: a zero Pad of the spatial dims folds into the Conv or AveragePool
// that alone reads it, as that op's own padding.
//
// Rewrites (x [N, C, spatial...]; p the Pad's begin and end amounts of the spatial dims):
//   Conv(Pad(x, p, constant 0), W, B)    -> Conv(x, W, B) with pads + p
//   AveragePool(Pad(x, p, constant 0))   -> AveragePool(x) with pads + p and count_include_pad = 1
//                                           (the zeros the Pad wrote count in every window's mean)
// Why: PyTorch exports avg_pool2d(padding=1) with count_include_pad as Pad + AveragePool (Inception v3's
// branches); the Pad then ran as a row-major copy and the pool on oneDNN's plain-layout kernel
// (simple_nchw: 36 ms of Inception v3's 122 ms at batch 1 on 2 AVX2 cores), where the pool's own padding
// runs in the producer's blocked layout on the jit kernel. A Conv's padding costs nothing either.
// Preconditions: the Pad (ai.onnx, any opset: pads as attribute before 11, as a constant input after; no
// `axes` input) is in constant mode with value 0 (absent, or a constant scalar 0), pads nothing on the
// batch and channel dims and nothing negative, and its output has no other reader and is not a graph
// output; the reader has auto_pad NOTSET (or absent); an AveragePool has ceil_mode 0 and counts its own
// padding when it has any (count_include_pad = 1, or all pads 0). Anything else is left alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ondine/passes/pass.hpp"
#include "ondine/passes/rewrite.hpp"

namespace ondine {

namespace detail::fold_pad {

// The Pad's amounts ([begin..., end...] over all dims) when it is a zero constant pad, else empty.
inline std::optional<std::vector<std::int64_t>> zero_pads(const Node& pad) {
  if (pad.op_type() != "Pad" || !pad.domain().empty() || pad.num_outputs() != 1) return std::nullopt;
  if (pad.attr_string("mode", "constant") != "constant") return std::nullopt;
  const Value* x = pad.input(0);
  if (!x || !x->shape().rank_known()) return std::nullopt;
  std::vector<std::int64_t> pads;
  if (pad.opset() < 11) {
    if (!pad.has_attr("pads") || pad.attr_float("value", 0.0f) != 0.0f) return std::nullopt;
    pads = pad.attr_ints("pads");
  } else {
    const Value* p = pad.input(1);
    if (!p || !p->is_constant() || pad.input(3)) return std::nullopt;  // no `axes` (opset 18)
    const Tensor& t = p->constant();
    if (t.dtype() != DType::Int64) return std::nullopt;
    pads.assign(t.data<std::int64_t>(), t.data<std::int64_t>() + t.numel());
    if (const Value* c = pad.input(2)) {
      if (!c->is_constant() || c->constant().numel() != 1) return std::nullopt;
      const Tensor& v = c->constant();
      const bool zero = v.dtype() == DType::Float32   ? v.data<float>()[0] == 0.0f
                        : v.dtype() == DType::Float64 ? v.data<double>()[0] == 0.0
                        : v.dtype() == DType::Int64   ? v.data<std::int64_t>()[0] == 0
                        : v.dtype() == DType::Int32   ? v.data<std::int32_t>()[0] == 0
                                                      : false;
      if (!zero) return std::nullopt;
    }
  }
  const std::size_t rank = x->shape().rank();
  if (rank < 3 || pads.size() != 2 * rank) return std::nullopt;
  for (std::size_t d = 0; d < 2; ++d)
    if (pads[d] != 0 || pads[rank + d] != 0) return std::nullopt;
  for (std::int64_t p : pads)
    if (p < 0) return std::nullopt;
  return pads;
}

// The reader's new pads ([begin..., end...] over the spatial dims) with the Pad's folded in, or empty
// when the reader cannot take them.
inline std::optional<std::vector<std::int64_t>> folded_pads(const Node& reader, const std::vector<std::int64_t>& pads) {
  const bool conv = reader.op_type() == "Conv", pool = reader.op_type() == "AveragePool";
  if (!(conv || pool) || !reader.domain().empty() || !reader.input(0)) return std::nullopt;
  if (reader.attr_string("auto_pad", "NOTSET") != "NOTSET") return std::nullopt;
  const std::size_t rank = pads.size() / 2, spatial = rank - 2;
  std::vector<std::int64_t> own = reader.attr_ints("pads", std::vector<std::int64_t>(2 * spatial, 0));
  if (own.size() != 2 * spatial) return std::nullopt;
  bool own_any = false;
  for (std::int64_t p : own) own_any = own_any || p != 0;
  if (pool && (reader.attr_int("ceil_mode", 0) != 0 || (own_any && reader.attr_int("count_include_pad", 0) != 1)))
    return std::nullopt;
  for (std::size_t i = 0; i < spatial; ++i) {
    own[i] += pads[2 + i];
    own[spatial + i] += pads[rank + 2 + i];
  }
  return own;
}

}  // namespace detail::fold_pad

struct FoldPad {
  static constexpr const char* name = "fold-pad";

  bool run(Graph& g, PassContext& ctx) {
    namespace d = detail::fold_pad;
    std::vector<Node*> pads_folded;
    for (Node* pad : g.topo_order()) {
      const std::optional<std::vector<std::int64_t>> pads = d::zero_pads(*pad);
      Value* y = pad->output(0);
      if (!pads || !rewrite::single_use(y)) continue;
      Node* reader = y->uses()[0].node;
      if (y->uses()[0].index != 0) continue;
      const std::optional<std::vector<std::int64_t>> own = d::folded_pads(*reader, *pads);
      if (!own) continue;
      ctx.rewrite("folded '" + pad->name() + "' (Pad) into '" + reader->name() + "' (" + reader->op_type() + ")");
      reader->set_input(0, pad->input(0));
      reader->set_attr("pads", *own);
      if (reader->op_type() == "AveragePool") reader->set_attr("count_include_pad", std::int64_t{1});
      pads_folded.push_back(pad);
    }
    if (pads_folded.empty()) return false;
    rewrite::erase_if_dead(g, pads_folded);
    return true;
  }
};

}  // namespace ondine
