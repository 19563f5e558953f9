// SPDX-License-Identifier: Apache-2.0
// ondine/passes/detail/dynamic_quant.hpp - what fuse-dynamic-qmatmul and fuse-dynamic-qconv share: the
// match of one dynamically quantized product as ONNX Runtime's quantize_dynamic writes it,
//
//   (a, a_scale, a_zp) = DynamicQuantizeLinear(x)
//   act*(Add?(Mul(Cast<float>(Op(a, W, a_zp, W_zp?)), Mul(a_scale, w_scale)), B))   Op: MatMulInteger or ConvInteger
//
// and the centred weights W - W_zp the fused op carries (int8 when every difference fits, else int16,
// which the lowering computes on float32 kernels: a uint8 weight with zero point 113 spans [-113, 142]).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/ir/graph.hpp"

namespace ondine::detail::dynq {

inline Node* only_reader(const Value* v, const char* op) {
  if (!v || v->is_graph_output() || v->uses().size() != 1) return nullptr;
  Node* n = v->uses()[0].node;
  return n->domain().empty() && n->op_type() == op ? n : nullptr;
}

// The operand of a two-input node other than `v`.
inline Value* other_input(const Node* n, const Value* v) {
  if (n->num_inputs() != 2) return nullptr;
  return n->input(0) == v ? n->input(1) : n->input(1) == v ? n->input(0) : nullptr;
}

inline bool f32_constant(const Value* v) { return v && v->is_constant() && v->dtype() == DType::Float32; }

// The values of constant `t` along axis `axis` of a result of rank `rank` it broadcasts against
// (numpy rules: `t` right-aligned): one value when `t` holds one, else `count` values when its only
// dim other than 1 is that axis with `count` entries. Empty for any other shape: a constant that
// would broadcast along another axis, or grow the result's rank.
inline std::optional<std::vector<float>> along_axis(const Tensor& t, std::size_t rank, std::size_t axis,
                                                   std::int64_t count) {
  if (t.dtype() != DType::Float32 || t.rank() > rank) return std::nullopt;
  const float* p = t.data<float>();
  if (t.numel() == 1) return std::vector<float>{p[0]};
  const std::size_t skip = rank - t.rank();
  for (std::size_t i = 0; i < t.rank(); ++i)
    if (t.dims()[i] != (i + skip == axis ? count : 1)) return std::nullopt;
  return std::vector<float>(p, p + t.numel());
}

// W - W_zp for 8-bit weights `w` with zero points `zp` (none, one, or one per index of w's axis
// `axis`): int8 when every difference fits, else int16. Empty when the zero points are not 8-bit
// constants of one of those shapes.
inline std::optional<Tensor> centred_weights(const Tensor& w, const Value* zp, std::size_t axis) {
  if ((w.dtype() != DType::UInt8 && w.dtype() != DType::Int8) || axis >= w.rank()) return std::nullopt;
  std::vector<int> zero(1, 0);
  if (zp) {
    if (!zp->is_constant() || zp->dtype() != w.dtype()) return std::nullopt;
    const Tensor& z = zp->constant();
    if (z.numel() != 1 && !(z.rank() == 1 && z.numel() == w.dims()[axis])) return std::nullopt;
    zero.assign(static_cast<std::size_t>(z.numel()), 0);
    for (std::int64_t i = 0; i < z.numel(); ++i) zero[static_cast<std::size_t>(i)] = static_cast<int>(z.at_double(static_cast<std::size_t>(i)));
  }
  std::int64_t inner = 1;  // elements per index of `axis`, and how many indices there are
  for (std::size_t i = axis + 1; i < w.rank(); ++i) inner *= w.dims()[i];
  const std::int64_t along = w.dims()[axis];
  std::vector<int> centred(static_cast<std::size_t>(w.numel()));
  bool fits = true;
  for (std::int64_t i = 0; i < w.numel(); ++i) {
    std::size_t c = zero.size() == 1 ? 0 : static_cast<std::size_t>((i / inner) % along);
    int v = static_cast<int>(w.at_double(static_cast<std::size_t>(i))) - zero[c];
    fits = fits && v >= -128 && v <= 127;
    centred[static_cast<std::size_t>(i)] = v;
  }
  if (fits) {
    Tensor t(DType::Int8, w.dims());
    for (std::size_t i = 0; i < centred.size(); ++i) t.data<std::int8_t>()[i] = static_cast<std::int8_t>(centred[i]);
    return t;
  }
  Tensor t(DType::Int16, w.dims());
  for (std::size_t i = 0; i < centred.size(); ++i) t.data<std::int16_t>()[i] = static_cast<std::int16_t>(centred[i]);
  return t;
}

struct Match {
  Node *dql = nullptr, *op = nullptr, *cast = nullptr, *mul = nullptr, *scale = nullptr, *add = nullptr;
  Tensor weights;              // W - W_zp (centred_weights)
  std::vector<float> w_scale;  // 1 or one per output channel
  std::vector<float> bias;     // empty, or one per output channel
  std::vector<Node*> activation_nodes;
  std::vector<fused::Activation> activations;
  Value* result = nullptr;  // the value the fused node replaces
};

// Matches the chain above from `op` (its output channels: axis `channel_axis` of its result, axis
// `weight_axis` of W). Preconditions (else false): W an 8-bit constant, its zero point none or an
// 8-bit constant per tensor or per output channel; a_zp the DynamicQuantizeLinear's; w_scale a
// float32 constant positive everywhere, per tensor or per output channel; B a float32 constant per
// tensor or per channel; the Mul and Add operands either way round; every intermediate result read
// only by the next op of the chain and not a graph output. The DynamicQuantizeLinear stays: the
// readers of one x share it.
inline bool match(Node* op, std::size_t weight_axis, std::size_t channel_axis, Match& m) {
  m.op = op;
  Value *a = op->input(0), *w = op->input(1), *a_zp = op->num_inputs() > 2 ? op->input(2) : nullptr,
        *w_zp = op->num_inputs() > 3 ? op->input(3) : nullptr;
  const Value* y = op->output(0);
  if (!a || !a->producer() || !w || !a_zp || !w->is_constant() || !y->shape().rank_known()) return false;
  m.dql = a->producer();
  if (!m.dql->domain().empty() || m.dql->op_type() != "DynamicQuantizeLinear" || m.dql->output(0) != a ||
      m.dql->output(2) != a_zp)
    return false;
  const std::size_t rank = y->shape().rank();
  if (channel_axis >= rank || weight_axis >= w->constant().rank()) return false;
  auto centred = centred_weights(w->constant(), w_zp, weight_axis);
  if (!centred) return false;
  m.weights = std::move(*centred);
  const std::int64_t channels = w->constant().dims()[weight_axis];

  m.cast = only_reader(y, "Cast");
  if (!m.cast || m.cast->attr_int("to", 0) != 1) return false;  // 1: FLOAT
  m.mul = only_reader(m.cast->output(0), "Mul");
  if (!m.mul) return false;
  Value* s = other_input(m.mul, m.cast->output(0));
  if (!s || !s->producer()) return false;
  m.scale = s->producer();
  if (!m.scale->domain().empty() || m.scale->op_type() != "Mul") return false;
  Value* ws = other_input(m.scale, m.dql->output(1));
  if (!f32_constant(ws)) return false;
  auto w_scale = along_axis(ws->constant(), rank, channel_axis, channels);
  if (!w_scale) return false;
  for (float v : *w_scale)
    if (!(v > 0)) return false;
  m.w_scale = std::move(*w_scale);
  if (Node* add = only_reader(m.mul->output(0), "Add")) {
    Value* b = other_input(add, m.mul->output(0));
    if (f32_constant(b))
      if (auto bias = along_axis(b->constant(), rank, channel_axis, channels)) {
        m.add = add;
        m.bias = bias->size() == 1 ? std::vector<float>(static_cast<std::size_t>(channels), (*bias)[0]) : *bias;
      }
  }
  m.result = (m.add ? m.add : m.mul)->output(0);
  while (!m.result->is_graph_output() && m.result->uses().size() == 1) {
    Node* next = m.result->uses()[0].node;
    auto act = fused::as_activation(*next);
    if (!act || next->input(0) != m.result || next->output(0)->dtype() != DType::Float32 ||
        !(next->output(0)->shape() == m.result->shape()))
      break;
    m.activations.push_back(*act);
    m.activation_nodes.push_back(next);
    m.result = next->output(0);
  }
  return true;
}

}  // namespace ondine::detail::dynq
