// SPDX-License-Identifier: Apache-2.0
// ondine/onnx/contrib_ops.hpp - ONNX Runtime's com.microsoft ops that standard ONNX can state, rewritten
// at import into that standard form, so the rest of Ondine (inference, reference, passes) sees one
// spelling of each computation.
//
//   com.microsoft.MatMulNBits(A, B, scales[, zero_points][, g_idx][, bias])  (ONNX Runtime's weight-only
//   quantized Linear, written by its quantizer and GenAI model builder)
//     -> MatMul(A, DequantizeLinear(Q, S[, Z], axis 0, block_size)) [+ bias]
//   Q is B unpacked and transposed to [K, N] (uint4 for bits 4, uint8 for bits 8), S the scales as
//   [ceil(K / block), N], Z the zero points likewise (default 2^(bits-1), ONNX Runtime's). The
//   DequantizeLinear is stamped opset 21 (blocked quantization). B, scales and zero points must be
//   constants; float zero points and act-order (g_idx other than k / block) are refused naming the node.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ondine/ir/graph.hpp"

namespace ondine::onnx {
namespace detail::contrib {

inline const Tensor& constant_input(const Node& n, std::size_t i, const char* what) {
  const Value* v = n.input(i);
  if (!v) throw n.error(std::string(what) + " (input " + std::to_string(i) + ") is missing");
  if (!v->is_constant())
    throw n.error(std::string(what) + " must be a constant (an initializer) for Ondine to import MatMulNBits");
  return v->constant();
}

inline void rewrite_matmul_nbits(Graph& g, Node* n) {
  const std::int64_t K = n->attr_int("K", -1), N = n->attr_int("N", -1), bits = n->attr_int("bits", 4);
  const std::int64_t block = n->attr_int("block_size", -1);
  if (K <= 0 || N <= 0) throw n->error("attributes K and N must be positive");
  if (bits != 4 && bits != 8) throw n->error("bits " + std::to_string(bits) + " is not supported (4 or 8)");
  if (block < 16 || (block & (block - 1)) != 0)
    throw n->error("block_size " + std::to_string(block) + " must be a power of two, at least 16");
  if (!n->input(0)) throw n->error("A (input 0) is missing");
  const std::int64_t blocks = (K + block - 1) / block, blob = block * bits / 8;
  const Tensor& b = constant_input(*n, 1, "B");
  const Tensor& scales = constant_input(*n, 2, "scales");
  if (b.dtype() != DType::UInt8 || b.numel() != N * blocks * blob)
    throw n->error("B must be uint8 of shape [N, ceil(K / block_size), block_size * bits / 8] = [" + std::to_string(N) + ", " +
                   std::to_string(blocks) + ", " + std::to_string(blob) + "], got " +
                   std::string(dtype_name(b.dtype())) + " " + dims_str(b.dims()));
  if (!is_floating(scales.dtype()) || scales.numel() != N * blocks)
    throw n->error("scales must be floating point with N * ceil(K / block_size) = " + std::to_string(N * blocks) +
                   " elements, got " + dims_str(scales.dims()));
  const Value* zp_value = n->num_inputs() > 3 ? n->input(3) : nullptr;
  const Tensor* zp = zp_value ? &constant_input(*n, 3, "zero_points") : nullptr;
  if (zp && zp->dtype() != DType::UInt8)
    throw n->error("zero_points of element type " + std::string(dtype_name(zp->dtype())) +
                   " are not supported (uint8, packed as B is, expected)");
  const std::int64_t zp_row = (blocks * bits + 7) / 8;  // packed zero points per row of B
  if (zp && zp->numel() != N * zp_row)
    throw n->error("zero_points must have N * ceil(ceil(K / block_size) * bits / 8) = " + std::to_string(N * zp_row) +
                   " elements, got " + dims_str(zp->dims()));
  if (n->num_inputs() > 4 && n->input(4)) {  // act-order: accepted only as the trivial order
    const Tensor& gidx = constant_input(*n, 4, "g_idx");
    bool trivial = gidx.numel() == K && (gidx.dtype() == DType::Int32 || gidx.dtype() == DType::Int64);
    for (std::int64_t k = 0; trivial && k < K; ++k)
      trivial = static_cast<std::int64_t>(gidx.at_double(static_cast<std::size_t>(k))) == k / block;
    if (!trivial) throw n->error("g_idx (act-order quantization) other than k / block_size is not supported");
  }
  for (std::size_t i = 6; i < n->num_inputs(); ++i)
    if (n->input(i)) throw n->error("input " + std::to_string(i) + " is not supported");

  const DType q_type = bits == 4 ? DType::UInt4 : DType::UInt8;
  Tensor q(q_type, {K, N}), s(scales.dtype(), {blocks, N}), z(q_type, {blocks, N});
  const auto* packed = b.data<std::uint8_t>();
  auto* qv = q.data<std::uint8_t>();
  for (std::int64_t col = 0; col < N; ++col)
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int64_t bi = k / block, j = k % block;
      const std::uint8_t byte = packed[(col * blocks + bi) * blob + (bits == 4 ? j / 2 : j)];
      qv[k * N + col] = bits == 4 ? static_cast<std::uint8_t>((byte >> (4 * (j & 1))) & 0xf) : byte;
    }
  auto* zv = z.data<std::uint8_t>();
  for (std::int64_t col = 0; col < N; ++col)
    for (std::int64_t bi = 0; bi < blocks; ++bi) {
      std::uint8_t v = static_cast<std::uint8_t>(1u << (bits - 1));
      if (zp) {
        const std::uint8_t byte = zp->data<std::uint8_t>()[col * zp_row + (bits == 4 ? bi / 2 : bi)];
        v = bits == 4 ? static_cast<std::uint8_t>((byte >> (4 * (bi & 1))) & 0xf) : byte;
      }
      zv[bi * N + col] = v;
    }
  const std::size_t esize = dtype_size(scales.dtype());
  for (std::int64_t col = 0; col < N; ++col)
    for (std::int64_t bi = 0; bi < blocks; ++bi)
      std::memcpy(static_cast<char*>(s.raw()) + static_cast<std::size_t>(bi * N + col) * esize,
                  static_cast<const char*>(scales.raw()) + static_cast<std::size_t>(col * blocks + bi) * esize, esize);

  const std::string base = n->name().empty() ? g.unique_name("MatMulNBits") : n->name();
  Value* qc = g.add_constant(g.unique_name(base + ".weight_q"), std::move(q));
  Value* sc = g.add_constant(g.unique_name(base + ".weight_scale"), std::move(s));
  Value* zc = g.add_constant(g.unique_name(base + ".weight_zero_point"), std::move(z));
  Node* dq = g.add_node("DequantizeLinear", {qc, sc, zc}, {g.unique_name(base + ".weight")},
                        {{"axis", Attribute(std::int64_t{0})}, {"block_size", Attribute(block)}},
                        g.unique_name(base + ".dequantize"));
  dq->set_opset(21);
  Value* y = g.add_node("MatMul", {n->input(0), dq->output(0)}, {g.unique_name(base + ".matmul_out")}, {},
                        g.unique_name(base + ".matmul"))->output(0);
  if (n->num_inputs() > 5 && n->input(5)) y = g.add_node("Add", {y, n->input(5)}, {g.unique_name(base + ".bias_out")}, {},
                                                          g.unique_name(base + ".bias"))->output(0);
  Value* old = n->output(0);
  const std::string name = old->name();
  g.replace_all_uses(old, y);
  g.remove_node(n);
  g.rename_value(old, g.unique_name(name + ".replaced"));  // frees the name for y, which the graph's readers know
  g.rename_value(y, name);
}

}  // namespace detail::contrib

// Rewrites the com.microsoft ops listed above in g (not in subgraphs); others are left for inference to
// refuse by name.
inline void rewrite_contrib_ops(Graph& g) {
  for (Node* n : g.nodes())
    if (n->domain() == "com.microsoft" && n->op_type() == "MatMulNBits") {
      try {
        detail::contrib::rewrite_matmul_nbits(g, n);
      } catch (Error& e) {
        if (e.node().empty()) e.at_node(n->name(), n->op_type());
        throw;
      }
    }
}

}  // namespace ondine::onnx
