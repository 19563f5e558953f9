// SPDX-License-Identifier: Apache-2.0
// ondine/quant/weight_only.hpp - weight-only quantization: the constant weights of MatMul (a language
// model's linear layers) to 4 or 8 bits in blocks along K, activations untouched. No calibration: the
// scales come from the weights alone.
//
// Contract: every MatMul(A, W) with W a float32 constant [K, N] (K >= block_size), not excluded, becomes
// MatMul(A, DequantizeLinear(Q, S[, Z], axis 0, block_size)) with Q [K, N] and S [ceil(K / block), N]:
//   symmetric  : Q int4 / int8, no zero point, S = max|w| / 7 (int4) or / 127 (int8) per block;
//   asymmetric : Q uint4 / uint8, Z per block, S = (max - min) / 15 or / 255 over the block and 0;
// rounding half to even, as QuantizeLinear. The LM head (a MatMul whose output is a graph output) is
// included unless `lm_head` is false; embeddings (Gather of a float32 constant on axis 0) are quantized
// along their rows when `embeddings` is true. Then the graph is restated in opset 21 (blocked
// DequantizeLinear; passes/upgrade_opset.hpp), so the file is standard ONNX that ONNX Runtime runs too.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/graph.hpp"
#include "ondine/passes/upgrade_opset.hpp"

namespace ondine::quant {

struct WeightOnlyOptions {
  int bits = 4;                    // 4 or 8
  std::int64_t block_size = 32;    // elements of K per scale: 16, 32, 64, 128, ...
  bool symmetric = true;           // signed, no zero point; false: unsigned with a zero point per block
  bool lm_head = true;             // quantize a MatMul that writes a graph output
  bool embeddings = false;         // quantize Gather tables (token embeddings)
  std::vector<std::string> exclude;  // node names left in float32
};

struct WeightOnlyLayer {
  std::string node, op;
  std::int64_t rows = 0, cols = 0;  // K, N (a table: its rows and width)
  std::uint64_t bytes_before = 0, bytes_after = 0;
};

struct WeightOnlyReport {
  std::vector<WeightOnlyLayer> quantized;
  std::vector<std::pair<std::string, std::string>> skipped;  // node, reason
  std::uint64_t bytes_before() const {
    std::uint64_t b = 0;
    for (const auto& l : quantized) b += l.bytes_before;
    return b;
  }
  std::uint64_t bytes_after() const {
    std::uint64_t b = 0;
    for (const auto& l : quantized) b += l.bytes_after;
    return b;
  }
};

namespace detail::weight_only {

struct Quantized {
  Tensor q, scale, zero_point;  // zero_point empty when symmetric
};

// Quantizes w [K, N] in blocks of `block` along `axis` (0: along K for MatMul; 1: along a table's rows).
inline Quantized quantize_blocks(const Tensor& w, std::int64_t block, int axis, const WeightOnlyOptions& o) {
  const std::int64_t rows = w.dims()[0], cols = w.dims()[1];
  const std::int64_t along = axis == 0 ? rows : cols, across = axis == 0 ? cols : rows;
  const std::int64_t blocks = (along + block - 1) / block;
  const DType qt = o.bits == 4 ? (o.symmetric ? DType::Int4 : DType::UInt4) : (o.symmetric ? DType::Int8 : DType::UInt8);
  const double qmax = o.symmetric ? (o.bits == 4 ? 7.0 : 127.0) : (o.bits == 4 ? 15.0 : 255.0);
  const double qmin = o.symmetric ? -qmax - 1 : 0.0;
  std::vector<std::int64_t> sdims = axis == 0 ? std::vector<std::int64_t>{blocks, cols} : std::vector<std::int64_t>{rows, blocks};
  Quantized r{Tensor(qt, w.dims()), Tensor(DType::Float32, sdims), o.symmetric ? Tensor() : Tensor(qt, sdims)};
  const float* pw = w.data<float>();
  auto at = [&](std::int64_t a, std::int64_t c) { return axis == 0 ? a * cols + c : c * cols + a; };  // along, across
  auto sat = [&](std::int64_t b, std::int64_t c) { return axis == 0 ? b * cols + c : c * blocks + b; };
  for (std::int64_t c = 0; c < across; ++c)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t lo = b * block, hi = std::min(along, lo + block);
      double mn = 0.0, mx = 0.0;
      for (std::int64_t a = lo; a < hi; ++a) {
        mn = std::min(mn, static_cast<double>(pw[at(a, c)]));
        mx = std::max(mx, static_cast<double>(pw[at(a, c)]));
      }
      double scale, zp = 0.0;
      if (o.symmetric) {
        scale = std::max(-mn, mx) / qmax;
      } else {
        scale = (mx - mn) / qmax;
        zp = scale > 0 ? std::min(qmax, std::max(0.0, std::nearbyint(-mn / scale))) : 0.0;
      }
      const float s = static_cast<float>(scale > 0 ? scale : 1.0);
      r.scale.data<float>()[sat(b, c)] = s;
      if (!o.symmetric) r.zero_point.data<std::uint8_t>()[sat(b, c)] = static_cast<std::uint8_t>(zp);
      for (std::int64_t a = lo; a < hi; ++a) {  // QuantizeLinear's formula: float32 division, half to even
        const double q = std::nearbyint(static_cast<double>(pw[at(a, c)] / s)) + zp;
        const auto v = static_cast<std::int64_t>(std::min(qmax, std::max(qmin, q)));
        if (o.symmetric) r.q.data<std::int8_t>()[at(a, c)] = static_cast<std::int8_t>(v);
        else r.q.data<std::uint8_t>()[at(a, c)] = static_cast<std::uint8_t>(v);
      }
    }
  return r;
}

inline bool excluded(const Node& n, const WeightOnlyOptions& o) {
  return std::find(o.exclude.begin(), o.exclude.end(), n.name()) != o.exclude.end();
}

inline Value* dequantized(Graph& g, const std::string& base, Quantized q, std::int64_t block, int axis) {
  Value* qc = g.add_constant(g.unique_name(base + "_q"), std::move(q.q));
  Value* sc = g.add_constant(g.unique_name(base + "_scale"), std::move(q.scale));
  std::vector<Value*> inputs{qc, sc};
  if (!q.zero_point.empty()) inputs.push_back(g.add_constant(g.unique_name(base + "_zero_point"), std::move(q.zero_point)));
  Node* dq = g.add_node("DequantizeLinear", inputs, {g.unique_name(base + "_dequantized")},
                        {{"axis", Attribute(static_cast<std::int64_t>(axis))}, {"block_size", Attribute(block)}},
                        g.unique_name(base + "_DequantizeLinear"));
  dq->set_opset(21);
  return dq->output(0);
}

}  // namespace detail::weight_only

// Quantizes g's weights in place (see the contract above) and restates g in opset 21.
inline WeightOnlyReport quantize_weights(Graph& g, const WeightOnlyOptions& o) {
  namespace d = detail::weight_only;
  if (o.bits != 4 && o.bits != 8) throw Error("weight-only quantization: bits must be 4 or 8, not " + std::to_string(o.bits));
  if (o.block_size < 2 || o.block_size % 2 != 0)
    throw Error("weight-only quantization: block size must be even and at least 2, not " + std::to_string(o.block_size));
  WeightOnlyReport report;
  const std::uint64_t qbytes_num = static_cast<std::uint64_t>(o.bits);
  for (Node* n : g.nodes()) {
    if (!n->domain().empty()) continue;
    const bool matmul = n->op_type() == "MatMul", gather = n->op_type() == "Gather";
    if (!matmul && !gather) continue;
    Value* w = n->input(matmul ? 1 : 0);
    if (!w || !w->is_constant() || w->constant().dtype() != DType::Float32 || w->constant().rank() != 2) continue;
    if (gather && (!o.embeddings || n->attr_int("axis", 0) != 0)) continue;
    const std::string label = n->name().empty() ? n->op_type() : n->name();
    if (d::excluded(*n, o)) {
      report.skipped.emplace_back(label, "excluded");
      continue;
    }
    if (matmul && !o.lm_head && n->output(0)->is_graph_output()) {
      report.skipped.emplace_back(label, "LM head (a graph output)");
      continue;
    }
    const Tensor& t = w->constant();
    const int axis = matmul ? 0 : 1;
    if (t.dims()[axis] < o.block_size) {
      report.skipped.emplace_back(label, "fewer than block_size elements along the quantized axis");
      continue;
    }
    d::Quantized q = d::quantize_blocks(t, o.block_size, axis, o);
    const std::uint64_t elements = static_cast<std::uint64_t>(t.numel());
    const std::uint64_t after = (elements * qbytes_num + 7) / 8 + static_cast<std::uint64_t>(q.scale.numel()) * 4 +
                                (q.zero_point.empty() ? 0 : (static_cast<std::uint64_t>(q.zero_point.numel()) * qbytes_num + 7) / 8);
    report.quantized.push_back({label, n->op_type(), t.dims()[0], t.dims()[1], elements * 4, after});
    Value* dq = d::dequantized(g, w->name(), std::move(q), o.block_size, axis);
    n->set_input(matmul ? 1 : 0, dq);
  }
  g.remove_dead_values();
  upgrade_opset(g, 21);
  return report;
}

}  // namespace ondine::quant
