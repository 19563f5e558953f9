// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/eltwise.hpp - unary activations (oneDNN eltwise) and broadcasting binary ops
// (oneDNN binary) as steps of their own; the post-op fusion that attaches them to the conv/matmul primitive
// producing their input instead is detail/post_ops.hpp.
//
// Eltwise primitives are created on their producer's layout (they are layout-agnostic), so a
// Conv -> Relu chain never changes layout. Binary ops keep src0's layout; a broadcast operand is read
// row-major with its dims left-padded with 1s (oneDNN broadcasts src1 only, so src0 must have the
// output's dims: commutative ops swap their operands when needed, Sub/Div fall back otherwise).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "ondine/lower/detail/activation.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/post_ops.hpp"
#include "ondine/lower/detail/prelu.hpp"
#include "ondine/lower/detail/silu.hpp"
#include "ondine/lower/isa.hpp"

namespace ondine::lower::detail {

// --- standalone ops -------------------------------------------------------------------------------

// A unary op as one eltwise primitive per algorithm (HardSigmoid: linear, then clip), each on its
// producer's layout. Eltwise primitives take no post-ops here: oneDNN 2.6 only has a reference
// implementation for eltwise with post-ops.
inline bool lower_eltwise(Lowering& L, const Node& n) {
  auto spec = eltwise_spec(n);
  if (!spec) return false;
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  std::vector<dnnl::eltwise_forward::primitive_desc> pds;
  memory::desc md = L.md_of(x);
  for (auto& op : spec->ops) {
    dnnl::eltwise_forward::desc desc(dnnl::prop_kind::forward_inference, op.alg, md, op.alpha, op.beta);
    dnnl::eltwise_forward::primitive_desc pd(desc, Lowering::base_attr(), L.engine(), true);
    if (!pd) return false;
    pds.push_back(pd);
    md = pd.dst_desc();
  }
  SlotId src = L.slot_in(x, pds.front().src_desc());
  for (std::size_t i = 0; i < pds.size(); ++i) {
    auto& pd = pds[i];
    bool last = i + 1 == pds.size();
    SlotId dst;
    if (last) {
      dst = L.new_value_slot(y, pd.dst_desc());
      L.define(y, dst, pd.dst_desc());
    } else {
      dst = L.add_slot(runtime::Slot{y->name() + ".step" + std::to_string(i), DType::Float32, y->shape().sizes(),
                                     pd.dst_desc().get_size(), layout_name(pd.dst_desc()), SlotKind::Arena, 0});
    }
    auto& op = spec->ops[i];
    L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(),
                     std::string(alg_name(op.alg)) + " " + layout_name(pd.src_desc()) + dims_str(x->shape().sizes())},
                    &n, dnnl::eltwise_forward(pd), pd.scratchpad_desc(),
                    {{DNNL_ARG_SRC, src, pd.src_desc()}, {DNNL_ARG_DST, dst, pd.dst_desc()}}, {});
    src = dst;
  }
  return true;
}

// PRelu where no conv took it: one slope, oneDNN's eltwise relu with it as alpha; a constant slope per channel
// (dim 1), Ondine's kernel (prelu.hpp) on the producer's layout.
inline bool lower_prelu(Lowering& L, const Node& n) {
  std::optional<EltwiseSpec> spec = prelu_spec(n, true);
  if (!spec) return false;
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!spec->prelu_slope) {
    const EltwiseSpec::Op& op = spec->ops[0];
    dnnl::eltwise_forward::primitive_desc pd(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference, op.alg, L.md_of(x), op.alpha, op.beta),
        Lowering::base_attr(), L.engine(), true);
    if (!pd) return false;
    const SlotId src = L.slot_in(x, pd.src_desc());
    const SlotId dst = L.new_value_slot(y, pd.dst_desc());
    L.define(y, dst, pd.dst_desc());
    L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(), "relu alpha " + std::to_string(op.alpha) + " " +
                                                                     layout_name(pd.src_desc()) + dims_str(x->shape().sizes())},
                    &n, dnnl::eltwise_forward(pd), pd.scratchpad_desc(),
                    {{DNNL_ARG_SRC, src, pd.src_desc()}, {DNNL_ARG_DST, dst, pd.dst_desc()}}, {});
    return true;
  }
  // Per channel: Ondine's kernel on the producer's layout, or on a row-major copy of another.
  memory::desc md = L.md_of(x);
  if (!prelu_shape(md)) md = plain_md(x->shape().sizes());
  const SlotId src = L.slot_in(x, md);
  const SlotId dst = L.new_value_slot(y, md);
  L.define(y, dst, md);
  if (!add_prelu_step(L, n, src, dst, md, spec->prelu_slope, "")) throw Error("internal: PRelu on a row-major layout");
  return true;
}


// `yd` and the broadcast operand's `bd` (same rank) with neighbouring dims of the same kind (both full,
// or broadcast in `bd`) merged and a leading 1 when the first group is full: [3,320,320] * [3,1,1]
// becomes [1,3,102400] * [1,3,1], a per-channel broadcast that oneDNN's jit binary kernels take (they
// have none for a broadcast along the first dim). Row-major bytes are the same either way.
inline std::pair<Dims, Dims> merge_broadcast_dims(const Dims& yd, const Dims& bd) {
  Dims y, b;
  int last = -1;  // 0: broadcast group, 1: full group
  for (std::size_t i = 0; i < yd.size(); ++i) {
    if (yd[i] == 1) continue;
    int kind = bd[i] == yd[i] ? 1 : 0;
    if (kind == last) {
      y.back() *= yd[i];
      b.back() *= bd[i];
    } else {
      y.push_back(yd[i]);
      b.push_back(bd[i]);
      last = kind;
    }
  }
  if (y.empty() || b.front() != 1) {
    y.insert(y.begin(), 1);
    b.insert(b.begin(), 1);
  }
  return {y, b};
}

// A float32 constant broadcast (ONNX rules, its dims left-padded with 1s) to `yd`, row-major.
inline Tensor broadcast_to(const Tensor& t, const Dims& yd) {
  const Dims td = left_pad(t.dims(), yd.size());
  Dims stride(yd.size(), 0);  // t's stride per output dim, 0 where t broadcasts
  for (std::int64_t i = static_cast<std::int64_t>(yd.size()) - 1, step = 1; i >= 0; --i) {
    const auto u = static_cast<std::size_t>(i);
    stride[u] = td[u] == 1 ? 0 : step;
    step *= td[u];
  }
  Tensor out(DType::Float32, yd);
  const float* src = t.data<float>();
  float* dst = out.data<float>();
  Dims index(yd.size(), 0);
  std::int64_t at = 0;  // t's offset for `index`
  for (std::int64_t k = 0, n = out.numel(); k < n; ++k) {
    dst[k] = src[at];
    for (std::size_t d = yd.size(); d-- > 0;) {  // the next index, row-major
      if (++index[d] < yd[d]) {
        at += stride[d];
        break;
      }
      at -= stride[d] * (yd[d] - 1);
      index[d] = 0;
    }
  }
  return out;
}

// Add, Sub, Mul, Div, Max, Min as one binary primitive, with the activations after it as post-ops.
// oneDNN 2.6 picks its reference kernel (~50x slower) for some operand layouts, so the layouts are
// tried in order until a jit kernel takes them: (1) the first operand's layout, with a broadcast
// operand laid out the same way (a [1,C,1,1] gate in aBcd8b for an aBcd8b activation); (2) the
// broadcast operand row-major; (3) both row-major, reordering the first once; (4) row-major with the
// broadcast dims merged (merge_broadcast_dims), without post-ops; (5) a constant operand expanded; (6) with
// both operands broadcasting, the first expanded by a reorder first. The last one tried is kept when none
// gets a jit kernel.
inline bool lower_binary(Lowering& L, const Node& n) {
  const std::string& op = n.op_type();
  const std::optional<dnnl::algorithm> found = binary_alg(op);
  if (!found) return false;
  const dnnl::algorithm alg = *found;
  bool commutative = op != "Sub" && op != "Div";
  if (n.num_inputs() != 2 || n.num_outputs() != 1) return false;
  const Value* a = n.input(0);
  const Value* b = n.input(1);
  const Value* y = n.output(0);
  if (!is_f32(a) || !is_f32(b) || !is_f32(y)) return false;
  Dims yd = y->shape().sizes();
  if (yd.empty() || !y->shape().is_static()) return false;  // scalars: not worth a primitive
  // (6) Both operands broadcast (MViT-V2's relative positions, [..., 14, 1] + [..., 1, 14]; oneDNN's src0
  // cannot): the first is expanded into the output's dims by one reorder reading it with stride 0 where it
  // broadcasts, then read as a full row-major operand.
  bool expand_a = false;
  if (a->shape().sizes() != yd || a->is_constant()) {
    if (commutative && b->shape().sizes() == yd && !b->is_constant()) {
      std::swap(a, b);
    } else {
      // The operand that broadcasts only after its full dims ([..., 14, 1]) is the better src1: jit kernels
      // take that broadcast, not one between full dims ([..., 1, 14]); the other is expanded.
      auto trailing = [&](const Value* v) {
        const Dims d = left_pad(v->shape().sizes(), yd.size());
        bool broadcast_seen = false;
        for (std::size_t i = 0; i < yd.size(); ++i) {
          if (yd[i] == 1) continue;
          if (d[i] == 1) broadcast_seen = true;
          else if (broadcast_seen) return false;
        }
        return true;
      };
      if (commutative && !b->is_constant() && trailing(a) && !trailing(b)) std::swap(a, b);
      const Dims ad = left_pad(a->shape().sizes(), yd.size());
      if (a->is_constant() || a->shape().rank() > yd.size() || ad == yd) return false;
      for (std::size_t i = 0; i < yd.size(); ++i)
        if (ad[i] != yd[i] && ad[i] != 1) return false;
      expand_a = true;
    }
  }
  Dims bd = left_pad(b->shape().sizes(), yd.size());
  const bool full = bd == yd;
  // A channels-last view not copied yet (ConvNeXt's permute back to NCHW of a matmul's NHWC result) is read in
  // place, in the layout its strides make, rather than first copied row-major.
  std::optional<std::pair<SlotId, memory::desc>> a_view = expand_a ? std::nullopt : L.strided_source(a);
  if (a_view && (is_row_major(a_view->second) || channel_layout_tag(a_view->second) == memory::format_tag::undef))
    a_view.reset();
  const memory::desc a_md = expand_a ? plain_md(yd) : a_view ? a_view->second : L.md_of(a);
  PostOpChain chain = plan_binary_post_ops(L, n);

  struct Choice {
    memory::desc src0, src1;
    bool merged = false;    // (4): dims merged, no post-ops
    bool expanded = false;  // (5): the constant operand broadcast to the output's dims
  };
  std::vector<Choice> choices;
  memory::format_tag a_tag = channel_layout_tag(a_md);
  if (full) {
    choices.push_back({a_md, a_md});
  } else {
    if (!is_row_major(a_md) && a_tag != memory::format_tag::undef)
      choices.push_back({a_md, memory::desc(bd, memory::data_type::f32, a_tag)});
    choices.push_back({a_md, plain_md(bd)});
  }
  if (!is_row_major(a_md)) choices.push_back({plain_md(yd), full ? plain_md(yd) : plain_md(bd)});
  if (!full) {
    auto [my, mb] = merge_broadcast_dims(yd, bd);
    if (my.size() != yd.size() || my != yd) choices.push_back({plain_md(my), plain_md(mb), true});
  }
  // (5) A constant operand broadcast along a dim between full ones (Swin's attention mask [1, nW, 1, N, N] over
  // the heads: [64, 3, 2401] after merging), which no jit kernel takes: expanded once, here, to the output's
  // dims (up to 64 MB), then read as a full operand in src0's layout.
  std::optional<Tensor> expanded;
  if (!full && b->is_constant() && md_numel(plain_md(yd)) <= (std::int64_t{16} << 20)) {
    choices.push_back({a_md, a_md, false, true});
    if (!is_row_major(a_md)) choices.push_back({plain_md(yd), plain_md(yd), false, true});
  }

  dnnl::binary::primitive_desc pd;
  bool fused = false;
  const Choice* chosen = nullptr;
  for (const Choice& c : choices) {
    const bool with_chain = !chain.nodes.empty() && !c.merged;
    dnnl::binary::desc desc(alg, c.src0, c.src1, any_md(Dims(c.src0.dims())));
    bool c_fused = false;
    auto c_pd = choose_fusion<dnnl::binary::primitive_desc>(
        [&](bool use_chain) {
          dnnl::primitive_attr attr = Lowering::base_attr();
          if (use_chain) attr.set_post_ops(chain.ops());
          return dnnl::binary::primitive_desc(desc, attr, L.engine(), true);
        },
        with_chain, c_fused);
    if (!c_pd) continue;
    if (c.expanded) {  // only where the expansion is what gets a jit kernel
      if (is_reference_impl(c_pd)) continue;
      if (!expanded) expanded = broadcast_to(b->constant(), yd);
    }
    pd = c_pd;
    fused = c_fused;
    chosen = &c;
    if (!is_reference_impl(pd)) break;
  }
  if (!pd || !chosen) return false;
  if (!fused) chain = PostOpChain{y};

  // src0: its own slot when the layouts agree (a merged row-major view reads the same bytes).
  std::optional<SlotId> a_expanded;
  if (expand_a) {
    if (!chosen->merged && !is_row_major(pd.src_desc(0))) return false;  // (6) offers row-major choices only
    const Dims ad = left_pad(a->shape().sizes(), yd.size());
    Dims strides(yd.size(), 0);  // row-major over ad, 0 where a broadcasts
    for (std::size_t i = yd.size(), step = 1; i-- > 0;) {
      strides[i] = ad[i] == yd[i] ? static_cast<std::int64_t>(step) : 0;
      step *= static_cast<std::size_t>(ad[i]);
    }
    const memory::desc wide = plain_md(yd);
    a_expanded = L.add_slot(runtime::Slot{a->name() + ".expanded", DType::Float32, yd, wide.get_size(),
                                          layout_name(wide), SlotKind::Arena, 0});
    L.add_reorder(a->name() + " expanded to " + dims_str(yd), L.row_major_slot(a),
                  memory::desc(yd, memory::data_type::f32, strides), *a_expanded, wide);
  }
  SlotId s0 = a_expanded                                     ? *a_expanded
              : chosen->merged                               ? L.row_major_slot(a)
              : a_view && pd.src_desc(0) == a_view->second ? a_view->first
                                                           : L.slot_in(a, pd.src_desc(0));
  std::vector<SlotArg> args{{DNNL_ARG_SRC_0, s0, pd.src_desc(0)}};
  std::vector<std::pair<int, memory>> consts;
  const memory::desc src1_md = pd.src_desc(1);
  for (std::size_t i = 0; i < chain.binary.size(); ++i) {
    const Value* k = chain.binary[i].operand;
    consts.emplace_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(static_cast<int>(i) + (chain.sum_operand ? 1 : 0)) | DNNL_ARG_SRC_1,
                        L.constant_memory(k->constant(), plain_md(left_pad(k->shape().sizes(), yd.size()))));
  }
  if (b->is_constant()) {
    consts.emplace_back(DNNL_ARG_SRC_1, L.constant_memory(chosen->expanded ? *expanded : b->constant(), src1_md));
  } else if (full && !chosen->merged) {
    args.push_back({DNNL_ARG_SRC_1, L.slot_in(b, src1_md), src1_md});
  } else if (is_row_major(src1_md)) {
    args.push_back({DNNL_ARG_SRC_1, L.row_major_slot(b), src1_md});
  } else {
    // A broadcast operand in a blocked layout: its row-major bytes (dims `bd`) reordered once per run.
    SlotId raw = L.row_major_slot(b);
    SlotId packed = L.add_slot(runtime::Slot{b->name() + "." + layout_name(src1_md), DType::Float32, bd,
                                             src1_md.get_size(), layout_name(src1_md), SlotKind::Arena, 0});
    L.add_reorder(b->name(), raw, plain_md(bd), packed, src1_md);
    args.push_back({DNNL_ARG_SRC_1, packed, src1_md});
  }
  const memory::desc dst_md = chosen->merged ? plain_md(yd) : pd.dst_desc();
  SlotId dst = L.new_value_slot(chain.result, dst_md);
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc()});
  commit_post_ops(L, chain, dst, dst_md);
  L.add_primitive({n.name(), op, pd.impl_info_str(),
                   std::string(alg_name(alg)) + chain.detail() + " " + layout_name(pd.src_desc(0)) +
                       dims_str(chosen->merged ? Dims(pd.src_desc(0).dims()) : yd) + " , " + layout_name(src1_md) +
                       dims_str(chosen->merged ? Dims(src1_md.dims()) : bd) +
                       (chosen->expanded ? " (the constant expanded from " + dims_str(bd) + ")" : "")},
                  &n, dnnl::binary(pd), pd.scratchpad_desc(), std::move(args), std::move(consts));
  return true;
}

}  // namespace ondine::lower::detail
