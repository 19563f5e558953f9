// SPDX-License-Identifier: Apache-2.0
// ondine/passes/fuse_weight_only.hpp - fuse-weight-only: a matrix product by weights stored in 4 or 8 bits
// (weight-only quantization: quant/weight_only.hpp, ONNX Runtime's MatMulNBits as onnx/contrib_ops.hpp
// imports it) as one ondine.WeightOnlyMatMul (definition: ir/infer/quantized.hpp), so the weights stay
// packed and are dequantised in registers by the kernel (lower/detail/weight_only.hpp) instead of being
// folded into a float32 copy four or eight times their size.
//
//   MatMul(A, DequantizeLinear(Q, S, Z?))  ->  ondine.WeightOnlyMatMul(A, Q, S', Z'?)   block_size,
//                                                                                        int8_activations
// int8_activations = 1 (default; option "fuse-weight-only.activations" = "float32" gives 0, as
// CompileOptions::weight_only_int8_activations = false does): A is quantized to int8 per row and block of K
// by the fused op's definition, what ONNX Runtime and llama.cpp compute for such layers, where the block is a
// multiple of 4 rows (8 for 4 bits: the int8 kernels' groups); 0 keeps float32.
//
// Preconditions (else nothing changes): A float32; Q an int4/uint4/int8/uint8 constant [K, N]; S a float32
// constant and Z a constant (or absent), quantized along K in blocks (block_size > 0, axis 0), per column
// (axis 1, S of N values: one block of K) or per tensor (one value). S' and Z' are S and Z as
// [ceil(K / block_size), N]. It runs before fold-constants, which would fold the DequantizeLinear into
// float32 weights; a DequantizeLinear feeding anything else (an embedding's Gather) is left to it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/passes/detail/fusion.hpp"
#include "ondine/passes/pass.hpp"

namespace ondine {
namespace detail::weight_only_fusion {

inline bool quantized_type(DType t) { return t == DType::Int4 || t == DType::UInt4 || t == DType::Int8 || t == DType::UInt8; }

// The scale (or zero point) `t` of a DequantizeLinear of Q [K, N] as [blocks, N] for `block`, or an empty
// tensor when its layout is none of the three above.
inline Tensor as_blocks(const Tensor& t, std::int64_t K, std::int64_t N, std::int64_t block, bool per_column,
                        bool per_tensor) {
  const std::int64_t blocks = (K + block - 1) / block;
  if (per_tensor) {
    Tensor out(t.dtype(), {1, N});
    const std::size_t size = dtype_size(t.dtype());
    for (std::int64_t c = 0; c < N; ++c)
      std::memcpy(static_cast<char*>(out.raw()) + static_cast<std::size_t>(c) * size, t.raw(), size);
    return out;
  }
  if (per_column) return t.numel() == N ? t.reshaped({1, N}) : Tensor();
  return t.dims() == std::vector<std::int64_t>{blocks, N} ? t : Tensor();
}

}  // namespace detail::weight_only_fusion

struct FuseWeightOnly {
  static constexpr const char* name = "fuse-weight-only";

  bool run(Graph& g, PassContext& ctx) {
    namespace d = detail::weight_only_fusion;
    bool changed = false;
    const std::int64_t int8_activations = ctx.option("fuse-weight-only.activations") == "float32" ? 0 : 1;
    std::vector<Node*> candidates;
    for (Node* n : g.topo_order())
      if (n->domain().empty() && n->op_type() == "MatMul") candidates.push_back(n);
    for (Node* mm : candidates) {
      Value* a = mm->input(0);
      Value* w = mm->num_inputs() > 1 ? mm->input(1) : nullptr;
      Node* dq = w ? w->producer() : nullptr;
      if (!a || a->dtype() != DType::Float32 || !dq || dq->op_type() != "DequantizeLinear" || !dq->domain().empty())
        continue;
      const Value* qv = dq->input(0);
      const Value* sv = dq->num_inputs() > 1 ? dq->input(1) : nullptr;
      const Value* zv = dq->num_inputs() > 2 ? dq->input(2) : nullptr;
      if (!qv || !qv->is_constant() || !sv || !sv->is_constant() || (zv && !zv->is_constant())) continue;
      const Tensor& q = qv->constant();
      const Tensor& s = sv->constant();
      if (!d::quantized_type(q.dtype()) || q.rank() != 2 || s.dtype() != DType::Float32 || q.numel() == 0) continue;
      if (dq->has_attr("output_dtype") && dq->attr_int("output_dtype", 1) != 1) continue;
      const std::int64_t K = q.dims()[0], N = q.dims()[1];
      std::int64_t axis = dq->attr_int("axis", 1);
      if (axis < 0) axis += 2;
      const std::int64_t block_attr = dq->attr_int("block_size", 0);
      const bool per_tensor = s.numel() == 1 && block_attr == 0;
      const bool per_column = !per_tensor && block_attr == 0 && axis == 1;
      if (!per_tensor && !per_column && !(block_attr > 0 && axis == 0)) continue;
      const std::int64_t block = block_attr > 0 ? block_attr : K;
      Tensor scales = d::as_blocks(s, K, N, block, per_column, per_tensor);
      if (scales.empty()) continue;
      Tensor zeros;
      if (zv) {
        zeros = d::as_blocks(zv->constant(), K, N, block, per_column, per_tensor);
        if (zeros.empty() || zeros.dtype() != q.dtype()) continue;
      }
      // The int8 kernels take blocks of whole groups of rows (4, or 8 for 4 bits); another block keeps float32.
      const bool is4 = q.dtype() == DType::Int4 || q.dtype() == DType::UInt4;
      const std::int64_t int8 = int8_activations && block % (is4 ? 8 : 4) == 0 ? 1 : 0;
      const std::string name = mm->name().empty() ? g.unique_name("MatMul") : mm->name();
      std::vector<Value*> inputs{a, const_cast<Value*>(qv),
                                 g.add_constant(g.unique_name(name + ".weight_scale"), std::move(scales))};
      if (zv) inputs.push_back(g.add_constant(g.unique_name(name + ".weight_zero_point"), std::move(zeros)));
      g.opsets.emplace(fused::kDomain, fused::kDomainVersion);
      detail::fusion::add_replacement(g, mm->output(0), "WeightOnlyMatMul", inputs,
                                      {{"block_size", Attribute(block)}, {"int8_activations", Attribute(int8)}},
                                      name, fused::kDomain, fused::kDomainVersion);
      detail::fusion::erase_unused(g, {mm, dq});
      ctx.rewrite("'" + name + "' MatMul(A, DequantizeLinear(" + std::string(dtype_name(q.dtype())) + " [" +
                  std::to_string(K) + "," + std::to_string(N) + "], block " + std::to_string(block) +
                  ")) -> ondine.WeightOnlyMatMul" + (int8 ? " (int8 activations)" : ""));
      changed = true;
    }
    if (changed) g.remove_dead_values();
    return changed;
  }
};

}  // namespace ondine
