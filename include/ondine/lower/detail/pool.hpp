// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/pool.hpp - MaxPool, AveragePool, GlobalAveragePool and GlobalMaxPool as oneDNN
// pooling_v2 (dilated pooling), created on the producer's layout; the output in the layout the layout pass
// chose for it (activation_md), else the one oneDNN picks (the source's).
//
// Pads: oneDNN requires (in - extent + pad_l + pad_r) / stride + 1 == out, so with ceil_mode the right
// pad grows to cover the last window. Max pooling and exclude-pad averaging ignore padding, so that
// is exact; an include-pad average whose last window would reach past the explicit pads counts
// differently in ONNX, and falls back to the reference kernel.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/infer/nn.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"

namespace ondine::lower::detail {

// A pool's window as oneDNN's pooling_v2 takes it (dilations as oneDNN counts them, from 0; the right
// pad grown to cover ceil_mode's last window). nullopt: no exact oneDNN form, or dims that do not agree.
// `op`: the ONNX pool op (QPool passes its pool_op attribute).
struct PoolWindow {
  Dims kernel, strides, dilates, pad_l, pad_r;
  dnnl::algorithm alg;
};

inline std::optional<PoolWindow> pool_window(const Node& n, const std::string& op, const Dims& xd, const Dims& yd) {
  namespace geo = ::ondine::infer::detail_nn;
  bool global = op == "GlobalAveragePool" || op == "GlobalMaxPool";
  bool is_max = op == "MaxPool" || op == "GlobalMaxPool";
  if (xd.size() < 3 || xd.size() > 5 || yd.size() != xd.size()) return std::nullopt;
  Dims spatial(xd.begin() + 2, xd.end());
  std::size_t s = spatial.size();
  PoolWindow w{{}, Dims(s, 1), Dims(s, 0), Dims(s, 0), Dims(s, 0),
               is_max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_exclude_padding};
  Dims out;
  if (global) {
    w.kernel = spatial;
    out.assign(s, 1);
  } else {
    w.kernel = geo::pool_kernel(n, s);
    geo::Window win = geo::read_window(n, w.kernel);
    geo::ResolvedWindow r = geo::resolve_window(n, win, spatial);
    out = r.out;
    w.strides = win.strides;
    for (std::size_t i = 0; i < s; ++i) w.dilates[i] = win.dilations[i] - 1;
    bool include_pad = !is_max && n.attr_int("count_include_pad", 0) != 0;
    if (include_pad) w.alg = dnnl::algorithm::pooling_avg_include_padding;
    for (std::size_t i = 0; i < s; ++i) {
      w.pad_l[i] = r.pad_begin[i];
      std::int64_t needed = (out[i] - 1) * w.strides[i] + win.effective_kernel(i) - spatial[i] - w.pad_l[i];
      w.pad_r[i] = std::max(r.pad_end[i], needed);
      if (include_pad && needed > r.pad_end[i]) return std::nullopt;
    }
  }
  if (Dims(yd.begin() + 2, yd.end()) != out || yd[0] != xd[0] || yd[1] != xd[1]) return std::nullopt;
  return w;
}

inline bool lower_pool(Lowering& L, const Node& n) {
  const std::string& op = n.op_type();
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!is_f32(x) || !is_f32(y)) return false;
  if (op == "MaxPool" && n.output(1) && (n.output(1)->has_uses() || n.output(1)->is_graph_output())) return false;
  Dims xd = x->shape().sizes(), yd = y->shape().sizes();
  if (xd.size() < 3 || xd.size() > 5 || yd.size() != xd.size()) return false;
  auto w = pool_window(n, op, xd, yd);
  if (!w) return false;
  const auto& [kernel, strides, dilates, pad_l, pad_r, alg] = *w;

  memory::desc src_md = L.md_of(x);
  PostOpChain chain = plan_post_ops(L, n, false);
  // The output in the layout asked for (activation_md); where oneDNN has only its reference kernel for that
  // pair (a channels-last source into a row-major output: ConvNeXt's head, 3 ms at batch 8), in the source's
  // own layout, which a [N,C,1,1] output shares with row-major anyway.
  std::vector<memory::desc> dst_choices{activation_md(y, yd)};
  if (memory::format_tag tag = channel_layout_tag(src_md); tag != memory::format_tag::undef)
    dst_choices.emplace_back(yd, memory::data_type::f32, tag);
  bool fused = false;
  dnnl::pooling_v2_forward::primitive_desc pd;
  for (const memory::desc& dst_md : dst_choices) {
    dnnl::pooling_v2_forward::desc desc(dnnl::prop_kind::forward_inference, alg, src_md, dst_md, strides, kernel,
                                        dilates, pad_l, pad_r);
    pd = choose_fusion<dnnl::pooling_v2_forward::primitive_desc>(
        [&](bool with_chain) {
          dnnl::primitive_attr attr = Lowering::base_attr();
          if (with_chain) attr.set_post_ops(chain.ops());
          return dnnl::pooling_v2_forward::primitive_desc(desc, attr, L.engine(), true);
        },
        !chain.nodes.empty(), fused);
    if (pd && !is_reference_impl(pd)) break;
  }
  if (!pd) return false;
  // A 3-D pool of a row-major source runs oneDNN's plain `simple_nchw` loop; its jit kernel takes ndhwc (MViT-V2's
  // skip pools, [1, 192, 8, 56, 56]): the source reordered into it is one memory pass.
  if (xd.size() == 5 && is_row_major(src_md) && std::string(pd.impl_info_str()).rfind("simple", 0) == 0) {
    const memory::desc src_cl(xd, memory::data_type::f32, memory::format_tag::ndhwc);
    const memory::desc dst_cl(yd, memory::data_type::f32, memory::format_tag::ndhwc);
    dnnl::pooling_v2_forward::desc desc(dnnl::prop_kind::forward_inference, alg, src_cl, dst_cl, strides, kernel,
                                        dilates, pad_l, pad_r);
    bool cl_fused = false;
    auto cl = choose_fusion<dnnl::pooling_v2_forward::primitive_desc>(
        [&](bool with_chain) {
          dnnl::primitive_attr attr = Lowering::base_attr();
          if (with_chain) attr.set_post_ops(chain.ops());
          return dnnl::pooling_v2_forward::primitive_desc(desc, attr, L.engine(), true);
        },
        !chain.nodes.empty(), cl_fused);
    if (cl && std::string(cl.impl_info_str()).find("jit") != std::string::npos) {
      pd = cl;
      fused = cl_fused;
    }
  }
  if (!fused) chain = PostOpChain{y};
  SlotId src = L.slot_in(x, pd.src_desc());
  SlotId dst = L.new_value_slot(chain.result, pd.dst_desc());
  commit_post_ops(L, chain, dst, pd.dst_desc());
  std::string detail = std::string(alg_name(alg)) + " k" + dims_str(kernel) + " s" + dims_str(strides) + " pad" +
                       dims_str(pad_l) + dims_str(pad_r) + chain.detail() + " " + layout_name(pd.src_desc()) +
                       dims_str(xd) + " -> " + layout_name(pd.dst_desc()) + dims_str(yd);
  L.add_primitive({n.name(), op, pd.impl_info_str(), detail}, &n, dnnl::pooling_v2_forward(pd), pd.scratchpad_desc(),
                  {{DNNL_ARG_SRC, src, pd.src_desc()}, {DNNL_ARG_DST, dst, pd.dst_desc()}}, {});
  return true;
}

// ReduceMean / ReduceMax over every spatial axis of [N, C, spatial...] (torch's x.mean([2, 3]): ShuffleNet's
// and many classifiers' heads) as the global pooling it is, on the producer's layout: the jit kernel on a
// blocked source, where the reference kernel read row-major data after a reorder. keepdims 0: the pooled
// [N, C, 1, ...] in a layout whose bytes are row-major [N, C] (row-major or channels-last), which y then is.
inline bool lower_reduce_as_pool(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!is_f32(x) || !is_f32(y) || !x->shape().is_static() || !y->shape().is_static()) return false;
  const Dims xd = x->shape().sizes(), yd = y->shape().sizes();
  const auto rank = static_cast<std::int64_t>(xd.size());
  if (rank < 3 || rank > 5) return false;
  Dims axes;
  if (n.has_attr("axes")) {
    axes = n.attr_ints("axes");
  } else if (const Value* a = n.input(1); a && a->is_constant() && a->constant().dtype() == DType::Int64) {
    axes.assign(a->constant().data<std::int64_t>(), a->constant().data<std::int64_t>() + a->constant().numel());
  } else {
    return false;  // no axes: a reduction over everything (or nothing, noop_with_empty_axes)
  }
  for (std::int64_t& a : axes) a = a < 0 ? a + rank : a;
  std::sort(axes.begin(), axes.end());
  Dims spatial_axes;
  for (std::int64_t a = 2; a < rank; ++a) spatial_axes.push_back(a);
  if (axes != spatial_axes) return false;
  const bool keep = n.attr_int("keepdims", 1) != 0;
  Dims pooled(xd.begin(), xd.begin() + 2);
  pooled.resize(xd.size(), 1);
  if (yd != (keep ? pooled : Dims(xd.begin(), xd.begin() + 2))) return false;
  const Dims kernel(xd.begin() + 2, xd.end()), ones(kernel.size(), 1), zeros(kernel.size(), 0);
  const auto alg = n.op_type() == "ReduceMax" ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_exclude_padding;

  const memory::desc src_md = L.md_of(x);
  std::vector<memory::desc> dst_choices{keep ? activation_md(y, pooled) : plain_md(pooled)};
  if (memory::format_tag tag = channel_layout_tag(src_md); tag != memory::format_tag::undef)
    dst_choices.emplace_back(pooled, memory::data_type::f32, tag);
  // keepdims 0: [N, C, 1, ...] whose bytes are row-major [N, C] (no blocks; C the innermost of N and C).
  auto flat = [&](const memory::desc& md) {
    const dnnl_memory_desc_t& d = md.data;
    if (d.format_kind != dnnl_blocked || d.offset0 != 0 || d.format_desc.blocking.inner_nblks != 0) return false;
    const dnnl_dims_t& st = d.format_desc.blocking.strides;
    return (xd[1] == 1 || st[1] == 1) && (xd[0] == 1 || st[0] == xd[1]);
  };
  dnnl::pooling_v2_forward::primitive_desc pd;
  for (const memory::desc& dst_md : dst_choices) {
    dnnl::pooling_v2_forward::desc desc(dnnl::prop_kind::forward_inference, alg, src_md, dst_md, ones, kernel, zeros,
                                        zeros, zeros);
    dnnl::pooling_v2_forward::primitive_desc candidate(desc, Lowering::base_attr(), L.engine(), true);
    if (!candidate || (!keep && !flat(candidate.dst_desc()))) continue;
    if (!pd || is_reference_impl(pd)) pd = candidate;
  }
  if (!pd) return false;
  SlotId src = L.slot_in(x, pd.src_desc());
  SlotId dst;
  if (keep) {
    dst = L.new_value_slot(y, pd.dst_desc());
    L.define(y, dst, pd.dst_desc());
  } else {
    dst = L.new_plain_slot(y);
    L.define_plain(y, dst);
  }
  std::string detail = std::string(alg_name(alg)) + " over the spatial axes " + layout_name(pd.src_desc()) + dims_str(xd) +
                       " -> " + layout_name(pd.dst_desc()) + dims_str(pooled) + (keep ? "" : " = " + dims_str(yd));
  L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(), detail}, &n, dnnl::pooling_v2_forward(pd),
                  pd.scratchpad_desc(), {{DNNL_ARG_SRC, src, pd.src_desc()}, {DNNL_ARG_DST, dst, pd.dst_desc()}}, {});
  return true;
}

}  // namespace ondine::lower::detail
