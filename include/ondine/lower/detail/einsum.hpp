// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/einsum.hpp - Einsum of two operands that is a (batched) matrix product after
// transposes, as one oneDNN matmul reading and writing through strides: "bij,bjk->bik",
// "bhqd,bhkd->bhqk" (attention scores, B read transposed), "ij,jk->ki" (a transposed output), "i,i".
//
// The labels (ir/infer/einsum.hpp) split into batch labels (both operands and the output), M (the
// first operand and the output), N (the second operand and the output) and K (both operands, summed).
// With at most one label each of M, N and K, the product is matmul([batch..., M, K] x [batch..., K, N])
// -> [batch..., M, N], each operand a strided view of its row-major bytes, the output a strided view of
// the output's row-major bytes, so no transpose is ever copied. Batch dims of size 1 broadcast as
// oneDNN's matmul broadcasts them. Anything else (diagonals, a label summed within one operand, several
// M/N/K labels, three operands, a dtype other than float32) returns false: the reference kernel runs it.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "ondine/ir/infer/einsum.hpp"
#include "ondine/lower/detail/context.hpp"

namespace ondine::lower::detail {

inline bool lower_einsum(Lowering& L, const Node& n) {
  namespace spec = ::ondine::infer::detail_einsum;
  if (n.num_inputs() != 2) return false;
  const Value* a = n.input(0);
  const Value* b = n.input(1);
  const Value* y = n.output(0);
  if (!a || !b || !is_f32(a) || !is_f32(b) || !is_f32(y)) return false;
  if (!a->shape().is_static() || !b->shape().is_static() || !y->shape().is_static()) return false;
  const Dims ad = a->shape().sizes(), bd = b->shape().sizes(), yd = y->shape().sizes();
  for (const Dims* d : {&ad, &bd, &yd})
    if (std::find(d->begin(), d->end(), 0) != d->end()) return false;
  const spec::Labels l = spec::label(n, spec::parse(n), {ad.size(), bd.size()});
  const std::vector<int>& la = l.operands[0];
  const std::vector<int>& lb = l.operands[1];
  auto has = [](const std::vector<int>& v, int lab) { return std::find(v.begin(), v.end(), lab) != v.end(); };
  auto at = [](const std::vector<int>& v, int lab) { return static_cast<std::size_t>(std::find(v.begin(), v.end(), lab) - v.begin()); };
  for (const std::vector<int>* v : {&la, &lb})
    for (std::size_t i = 0; i < v->size(); ++i)
      if (std::count(v->begin(), v->end(), (*v)[i]) != 1) return false;  // a diagonal
  std::vector<int> batch, m, nn, k;
  for (int lab : l.output) {
    if (has(la, lab) && has(lb, lab)) batch.push_back(lab);
    else if (has(la, lab)) m.push_back(lab);
    else nn.push_back(lab);
  }
  for (int lab : la)
    if (!has(l.output, lab)) {
      if (!has(lb, lab)) return false;  // summed within A alone
      k.push_back(lab);
    }
  for (int lab : lb)
    if (!has(l.output, lab) && !has(la, lab)) return false;  // summed within B alone
  // Several labels of A alone (or of B alone): the last is the matrix's M (N), the others batch dims the
  // other operand broadcasts ("bythwc,hkc->bythwk", MViT's relative positions: batch b, y, t, h; M w).
  while (m.size() > 1) {
    batch.push_back(m.front());
    m.erase(m.begin());
  }
  while (nn.size() > 1) {
    batch.push_back(nn.front());
    nn.erase(nn.begin());
  }
  if (k.size() > 1 || batch.size() + 2 > DNNL_MAX_NDIMS) return false;

  // Dims and strides of one operand (or the output) in the matmul's order; an absent M/N/K is a dim of 1.
  const Dims as = row_major_strides(ad), bs = row_major_strides(bd), ys = row_major_strides(yd);
  auto view = [&](const std::vector<int>& labels, const Dims& dims, const Dims& strides, const std::vector<int>& rows,
                  const std::vector<int>& cols) {
    Dims d, s;
    for (int lab : batch) {
      const bool present = has(labels, lab);  // absent: a dim of 1, broadcast
      d.push_back(present ? dims[at(labels, lab)] : 1);
      s.push_back(present ? strides[at(labels, lab)] : 1);
    }
    for (const std::vector<int>* axis : {&rows, &cols}) {
      d.push_back(axis->empty() ? 1 : dims[at(labels, axis->front())]);
      s.push_back(axis->empty() ? 1 : strides[at(labels, axis->front())]);
    }
    return memory::desc(d, memory::data_type::f32, s);
  };
  // An output whose M axis is the contiguous one ("ij,jk->ki") is computed as its transpose,
  // B^T x A^T, so that it is written row by row: oneDNN's matmul kernels take strided operands but only
  // its reference implementation a transposed destination.
  const bool swap = !m.empty() && !nn.empty() && ys[at(l.output, m.front())] == 1;
  const memory::desc src_md = swap ? view(lb, bd, bs, nn, k) : view(la, ad, as, m, k);
  const memory::desc wei_md = swap ? view(la, ad, as, k, m) : view(lb, bd, bs, k, nn);
  const memory::desc dst_md = swap ? view(l.output, yd, ys, nn, m) : view(l.output, yd, ys, m, nn);
  const Value* src = swap ? b : a;
  const Value* wei = swap ? a : b;
  for (std::size_t i = 0; i < batch.size(); ++i) {  // batch dims: equal, or 1 broadcasting
    const auto sa = src_md.dims()[i], sb = wei_md.dims()[i], sy = dst_md.dims()[i];
    if (sy != std::max(sa, sb) || (sa != sb && sa != 1 && sb != 1)) return false;
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), Lowering::base_attr(), L.engine(), true);
  if (!pd) return false;

  std::vector<SlotArg> args{{DNNL_ARG_SRC, L.row_major_slot(src), pd.src_desc()},
                            {DNNL_ARG_WEIGHTS, L.row_major_slot(wei), pd.weights_desc()}};
  const memory::desc value_md = plain_md(yd);
  const SlotId dst = L.new_value_slot(y, value_md);
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc()});
  L.define(y, dst, value_md);
  L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(),
                   "'" + n.attr_string("equation") + "' as matmul " + dims_str(src_md.dims()) + " x " +
                       dims_str(wei_md.dims()) + " -> " + dims_str(dst_md.dims()) +
                       (swap ? " as (B^T A^T)" : "") + " (strided, no transposes)"},
                  &n, dnnl::matmul(pd), pd.scratchpad_desc(), std::move(args), {});
  return true;
}

}  // namespace ondine::lower::detail
