// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/shape_ops.hpp - Concat (oneDNN concat on the producers' layouts); Transpose and
// Slice as strided views of their source (copied by one reorder only when a reader needs row-major
// bytes: Lowering::define_strided_view); the ops that only re-label bytes: Reshape, Flatten, Squeeze,
// Unsqueeze (zero-copy views of the producer, strided when its strides allow the new dims, else of its
// row-major bytes); and Identity / inference Dropout (aliases in whatever layout the producer chose);
// a one-output Split (an alias); Pad in constant mode (Ondine's row copy).
//
// The shape inputs of the view ops are not read at run time: the compiled shapes are static, so the
// output dims are already known, and the nodes computing those shape inputs drop out as dead steps.
#pragma once

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/dropout.hpp"
#include "ondine/ir/infer/tensor_ops.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"
#include "ondine/reference/nn.hpp"

namespace ondine::lower::detail {

// oneDNN's `ref:any` concat (sources in layouts it has no simple concat for: blocked pieces whose channel
// counts are not whole blocks, mixed layouts) copies each source by a reorder into its part of the
// destination. Done here as those reorders, one step each, so the profile names what runs them; in the
// destination layout oneDNN chose, else row-major or channels-last, the first where no reorder is `ref`.
// A destination with padding (a blocked layout whose channels are not whole blocks) is left to oneDNN: its
// padding must be zeros, which reorders into parts would not write.
inline bool lower_concat_as_reorders(Lowering& L, const Node& n, std::int64_t axis, const std::vector<const Value*>& inputs,
                                     const std::vector<memory::desc>& srcs, const memory::desc& chosen) {
  const Value* y = n.output(0);
  const Dims yd = y->shape().sizes();
  const memory::data_type dt = chosen.data_type();
  std::vector<memory::desc> candidates{chosen, plain_md(yd, dt)};
  if (yd.size() == 4) candidates.emplace_back(yd, dt, memory::format_tag::acdb);
  for (const memory::desc& dst_md : candidates) {
    bool padded = false;
    for (int d = 0; d < dst_md.data.ndims; ++d) padded = padded || dst_md.data.padded_dims[d] != dst_md.data.dims[d];
    if (padded) continue;
    std::vector<dnnl::reorder::primitive_desc> parts;
    std::vector<memory::desc> subs;
    Dims offsets(yd.size(), 0), starts;
    bool fast = true;
    for (std::size_t i = 0; i < inputs.size() && fast; ++i) {
      const Dims piece = inputs[i]->shape().sizes();
      memory::desc sub = dst_md.submemory_desc(piece, offsets);
      starts.push_back(offsets[static_cast<std::size_t>(axis)]);
      offsets[static_cast<std::size_t>(axis)] += piece[static_cast<std::size_t>(axis)];
      try {
        parts.emplace_back(L.engine(), srcs[i], L.engine(), sub, Lowering::base_attr());
      } catch (const dnnl::error&) {
        fast = false;
        break;
      }
      fast = std::string(parts.back().impl_info_str()).rfind("ref", 0) != 0;
      subs.push_back(sub);
    }
    if (!fast) continue;
    SlotId dst = L.new_value_slot(y, dst_md);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      std::vector<SlotArg> args;
      std::vector<std::pair<int, memory>> consts;
      if (inputs[i]->is_constant()) consts.emplace_back(DNNL_ARG_SRC, L.constant_memory(inputs[i]->constant(), srcs[i]));
      else args.push_back({DNNL_ARG_SRC, L.slot_in(inputs[i], srcs[i]), srcs[i]});
      args.push_back({DNNL_ARG_DST, dst, subs[i]});
      L.add_primitive({n.name(), "Concat", parts[i].impl_info_str(),
                       "part " + std::to_string(i + 1) + "/" + std::to_string(inputs.size()) + ": " + layout_name(srcs[i]) +
                           dims_str(inputs[i]->shape().sizes()) + " -> " + layout_name(dst_md) + dims_str(yd) +
                           " from " + std::to_string(starts[i]) + " on axis " + std::to_string(axis)},
                      &n, dnnl::reorder(parts[i]), parts[i].scratchpad_desc(), std::move(args), std::move(consts));
    }
    L.define(y, dst, dst_md);
    return true;
  }
  return false;
}

// --- Concat in place -----------------------------------------------------------------------------
// Where each piece of a concat is a contiguous chunk of its result (the dims before the axis are 1, as
// in a batch-1 image concatenated on channels, and in a blocked layout whole channel blocks), the pieces'
// producers write straight into the result: a piece's slot becomes an Alias of the result at the piece's
// offset and nothing is copied (SqueezeNet's Fire modules, Inception's branches). Concats that share
// pieces share one buffer, the largest one's, when every other one is a run of its pieces: DenseNet
// concatenates all earlier features before each layer, each a prefix of the block's last concat, so the
// block's features are written once and every concat is a view. A piece that cannot move (a graph input
// or output, a constant, a value in another layout, a slot already placed elsewhere) is copied into its
// chunk by one reorder.

struct ConcatHost {
  const Node* host = nullptr;                      // the group's largest concat: its result is the buffer
  std::vector<const Node*> members;                // the concats that are views of it (the host included)
  std::map<const Value*, std::int64_t> start;      // each piece's first index on the axis of the host
  std::set<const Value*> placed;                   // pieces whose bytes are in the buffer already
  bool created = false, failed = false;
  memory::format_tag tag = memory::format_tag::undef;
  memory::desc md;                                 // the host's result
  SlotId slot = 0;
};

// The concat's axis (normalised) and its non-empty pieces; axis -1 when it is not a static concat.
inline std::pair<std::int64_t, std::vector<const Value*>> concat_pieces(const Node& n) {
  const Value* y = n.output(0);
  if (!y || !y->shape().is_static() || !n.has_attr("axis")) return {-1, {}};
  const auto rank = static_cast<std::int64_t>(y->shape().rank());
  std::int64_t axis = n.attr_int("axis");
  if (rank == 0 || axis < -rank || axis >= rank) return {-1, {}};
  if (axis < 0) axis += rank;
  std::vector<const Value*> pieces;
  for (const Value* v : n.inputs()) {
    if (!v || !v->shape().is_static() || v->shape().rank() != y->shape().rank()) return {-1, {}};
    if (v->shape().sizes()[static_cast<std::size_t>(axis)] != 0) pieces.push_back(v);
  }
  return {axis, pieces};
}

// The dense layout tags an in-place concat keeps: row-major and channel blocks of 8 and 16.
inline std::optional<memory::format_tag> dense_tag_of(const memory::desc& md) {
  using tag = memory::format_tag;
  for (tag t : {tag::a, tag::ab, tag::abc, tag::abcd, tag::abcde, tag::aBc8b, tag::aBcd8b, tag::aBcde8b, tag::aBc16b,
                tag::aBcd16b, tag::aBcde16b}) {
    try {
      if (memory::desc(md.dims(), md.data_type(), t) == md) return t;
    } catch (const dnnl::error&) {
    }
  }
  return std::nullopt;
}

// The byte offset of the chunk [offsets, offsets + dims) of `whole` when that chunk is itself the dense
// `tag` layout of `dims` (contiguous, unpadded); empty otherwise.
inline std::optional<std::size_t> chunk_offset(const memory::desc& whole, memory::format_tag tag, const Dims& dims,
                                               const Dims& offsets) {
  memory::desc dense, sub;
  try {
    dense = memory::desc(dims, whole.data_type(), tag);
    sub = whole.submemory_desc(dims, offsets);
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
  const dnnl_memory_desc_t &d = dense.data, &s = sub.data;
  const dnnl_blocking_desc_t &db = d.format_desc.blocking, &sb = s.format_desc.blocking;
  if (db.inner_nblks != sb.inner_nblks) return std::nullopt;
  for (int i = 0; i < db.inner_nblks; ++i)
    if (db.inner_blks[i] != sb.inner_blks[i] || db.inner_idxs[i] != sb.inner_idxs[i]) return std::nullopt;
  for (int i = 0; i < d.ndims; ++i)
    if (d.padded_dims[i] != d.dims[i] || (d.dims[i] > 1 && db.strides[i] != sb.strides[i])) return std::nullopt;
  return static_cast<std::size_t>(s.offset0) * dnnl_data_type_size(s.data_type);
}

// The group of concats `n` belongs to (found once, shared by its members): the concats on the same axis
// reachable through shared pieces, hosted by the one with the most pieces when every other one is a run
// of its pieces and no piece repeats; else `n` alone. Null when `n` repeats a piece.
inline std::shared_ptr<ConcatHost> concat_host(Lowering& L, const Node& n, std::int64_t axis) {
  if (auto it = L.concat_hosts.find(&n); it != L.concat_hosts.end()) return it->second;
  std::vector<const Node*> group{&n};
  std::set<const Node*> seen{&n};
  for (std::size_t i = 0; i < group.size() && group.size() <= 256; ++i)
    for (const Value* p : concat_pieces(*group[i]).second)
      for (const Use& u : p->uses())
        if (u.node->op_type() == "Concat" && u.node->domain().empty() && !seen.count(u.node) &&
            concat_pieces(*u.node).first == axis && u.node->output(0)->shape().rank() == n.output(0)->shape().rank()) {
          seen.insert(u.node);
          group.push_back(u.node);
        }
  auto runs_of = [&](const Node* host) -> std::shared_ptr<ConcatHost> {
    const std::vector<const Value*> pieces = concat_pieces(*host).second;
    auto h = std::make_shared<ConcatHost>();
    h->host = host;
    std::map<const Value*, std::size_t> index;
    std::int64_t at = 0;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      if (!index.emplace(pieces[i], i).second) return nullptr;
      h->start[pieces[i]] = at;
      at += pieces[i]->shape().sizes()[static_cast<std::size_t>(axis)];
    }
    for (const Node* m : group) {
      const std::vector<const Value*> own = concat_pieces(*m).second;
      if (own.empty() || !index.count(own[0]) || m->output(0)->is_graph_output()) return nullptr;
      const std::size_t first = index[own[0]];
      for (std::size_t i = 0; i < own.size(); ++i)
        if (first + i >= pieces.size() || pieces[first + i] != own[i]) return nullptr;
    }
    h->members = group;
    return h;
  };
  const Node* largest = *std::max_element(group.begin(), group.end(), [](const Node* a, const Node* b) {
    return concat_pieces(*a).second.size() < concat_pieces(*b).second.size();
  });
  std::shared_ptr<ConcatHost> host = group.size() > 256 ? nullptr : runs_of(largest);
  if (!host) {
    group = {&n};
    host = runs_of(&n);
  }
  if (host)
    for (const Node* m : host->members) L.concat_hosts[m] = host;
  return host;
}

// Moves slot `s` (an arena slot) to `offset` bytes into `into`'s bytes, with every alias of it.
inline void move_slot_into(Lowering& L, SlotId s, SlotId into, std::size_t offset) {
  const SlotId root = L.root(into);
  if (L.program.slots[into].kind == SlotKind::Alias) offset += L.program.slots[into].offset;
  for (runtime::Slot& a : L.program.slots)
    if (a.kind == SlotKind::Alias && static_cast<SlotId>(a.index) == s) {
      a.index = root;
      a.offset += offset;
    }
  runtime::Slot& t = L.program.slots[s];
  t.kind = SlotKind::Alias;
  t.index = root;
  t.offset = offset;
}

// Creates the group's buffer in the layout oneDNN chose for `chosen` (the first member lowered), after
// checking that every piece and every member is a contiguous chunk of it.
inline bool create_concat_host(Lowering& L, ConcatHost& h, std::int64_t axis, const memory::desc& chosen) {
  const std::optional<memory::format_tag> tag = dense_tag_of(chosen);
  if (!tag) return false;
  const Value* y = h.host->output(0);
  const Dims yd = y->shape().sizes();
  try {
    h.md = memory::desc(yd, chosen.data_type(), *tag);
  } catch (const dnnl::error&) {
    return false;
  }
  h.tag = *tag;
  auto fits = [&](const Dims& dims, std::int64_t start) {
    Dims offsets(dims.size(), 0);
    offsets[static_cast<std::size_t>(axis)] = start;
    return chunk_offset(h.md, h.tag, dims, offsets).has_value();
  };
  for (const auto& [piece, start] : h.start)
    if (!fits(piece->shape().sizes(), start)) return false;
  for (const Node* m : h.members)
    if (!fits(m->output(0)->shape().sizes(), h.start.at(concat_pieces(*m).second.front()))) return false;
  runtime::Slot s = Lowering::slot_for(y, SlotKind::Arena, 0);
  s.bytes = h.md.get_size();
  s.layout = layout_name(h.md);
  h.slot = L.add_slot(std::move(s));
  h.created = true;
  return true;
}

inline bool lower_concat_in_place(Lowering& L, const Node& n, std::int64_t axis, const std::vector<const Value*>& inputs,
                                  const std::vector<memory::desc>& srcs, const memory::desc& chosen) {
  const Value* y = n.output(0);
  if (y->is_graph_output()) return false;
  const std::shared_ptr<ConcatHost> hp = concat_host(L, n, axis);
  if (!hp || hp->failed) return false;
  ConcatHost& h = *hp;
  if (!h.created && !create_concat_host(L, h, axis, chosen)) {
    h.failed = true;
    return false;
  }
  const std::size_t ax = static_cast<std::size_t>(axis);
  auto offsets_of = [&](const Value* v) {
    Dims offsets(v->shape().rank(), 0);
    offsets[ax] = h.start.at(v);
    return offsets;
  };
  // Pieces that cannot move are copied by a reorder into their chunk: made first, so that a reorder
  // oneDNN declines leaves everything as it was.
  std::vector<dnnl::reorder::primitive_desc> copies(inputs.size());
  std::vector<memory::desc> chunks(inputs.size());
  std::vector<bool> moves(inputs.size(), false);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Value* p = inputs[i];
    if (h.placed.count(p)) continue;
    const Dims pd = p->shape().sizes();
    const memory::desc dense(pd, h.md.data_type(), h.tag);
    if (!p->is_constant() && !p->is_graph_output() && same_layout(srcs[i], dense)) {
      const SlotId s = L.slot_in(p, srcs[i]);
      moves[i] = L.program.slots[s].kind == SlotKind::Arena && L.program.slots[s].bytes == dense.get_size();
    }
    if (moves[i]) continue;
    chunks[i] = h.md.submemory_desc(pd, offsets_of(p));
    try {
      copies[i] = dnnl::reorder::primitive_desc(L.engine(), srcs[i], L.engine(), chunks[i], Lowering::base_attr());
    } catch (const dnnl::error&) {
      return false;
    }
  }
  std::vector<SlotId> reads;
  std::string detail;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Value* p = inputs[i];
    detail += (i ? ", " : "") + layout_name(srcs[i]) + dims_str(p->shape().sizes());
    if (h.placed.count(p)) {
      reads.push_back(L.slot_in(p, srcs[i]));
      detail += " (in place)";
      continue;
    }
    const std::size_t at = *chunk_offset(h.md, h.tag, p->shape().sizes(), offsets_of(p));
    if (moves[i]) {
      const SlotId s = L.slot_in(p, srcs[i]);
      move_slot_into(L, s, h.slot, at);
      reads.push_back(s);
      detail += " (in place)";
    } else {
      std::vector<SlotArg> args;
      std::vector<std::pair<int, memory>> consts;
      if (p->is_constant()) consts.emplace_back(DNNL_ARG_SRC, L.constant_memory(p->constant(), srcs[i]));
      else args.push_back({DNNL_ARG_SRC, L.slot_in(p, srcs[i]), srcs[i]});
      args.push_back({DNNL_ARG_DST, h.slot, chunks[i]});
      L.add_primitive({n.name(), "Concat", copies[i].impl_info_str(),
                       "copy of " + layout_name(srcs[i]) + dims_str(p->shape().sizes()) + " into its chunk of " +
                           layout_name(h.md) + dims_str(h.host->output(0)->shape().sizes()) + " from " +
                           std::to_string(h.start.at(p)) + " on axis " + std::to_string(axis)},
                      &n, dnnl::reorder(copies[i]), copies[i].scratchpad_desc(), std::move(args), std::move(consts));
      detail += " (copied)";
    }
    h.placed.insert(p);
  }
  SlotId dst = h.slot;
  memory::desc dst_md = h.md;
  if (h.host != &n) {
    const Dims yd = y->shape().sizes();
    const std::size_t at = *chunk_offset(h.md, h.tag, yd, offsets_of(inputs.front()));
    runtime::Slot s = L.alias_slot(y, h.slot);
    s.offset += at;
    dst_md = memory::desc(yd, h.md.data_type(), h.tag);
    s.bytes = dst_md.get_size();
    s.layout = layout_name(dst_md);
    dst = L.add_slot(std::move(s));
  }
  L.define(y, dst, dst_md);
  const std::string where = h.host == &n ? "" : ", a view of '" + h.host->name() + "'";
  L.add_step(std::make_unique<ViewStep>(
      runtime::StepInfo{n.name(), "Concat", "in place",
                        "axis " + std::to_string(axis) + ": " + detail + " -> " + layout_name(dst_md) +
                            dims_str(y->shape().sizes()) + where},
      std::move(reads), dst));
  return true;
}

inline bool lower_concat(Lowering& L, const Node& n) {
  const Value* y = n.output(0);
  // float32, or int8 pieces of one type and one scale (fuse-qdq's Concat on int8): runtime values only
  bool int8 = y && (y->dtype() == DType::UInt8 || y->dtype() == DType::Int8) && y->shape().is_static();
  auto piece_ok = [&](const Value* v) {
    return int8 ? v && v->dtype() == y->dtype() && !v->is_constant() && v->shape().is_static() : is_f32(v);
  };
  if (!(is_f32(y) || int8) || n.num_inputs() == 0) return false;
  Dims yd = y->shape().sizes();
  auto rank = static_cast<std::int64_t>(yd.size());
  if (rank == 0 || !n.has_attr("axis")) return false;
  std::int64_t axis = n.attr_int("axis");
  if (axis < -rank || axis >= rank) return false;
  if (axis < 0) axis += rank;
  std::vector<memory::desc> srcs;
  std::vector<const Value*> inputs;
  for (const Value* v : n.inputs()) {
    if (!piece_ok(v) || v->shape().rank() != yd.size()) return false;
    if (v->shape().sizes()[static_cast<std::size_t>(axis)] == 0) continue;  // empty pieces add nothing
    inputs.push_back(v);
    srcs.push_back(v->is_constant() ? plain_md(v->shape().sizes()) : L.md_of(v));
  }
  if (inputs.empty()) return false;
  // Row-major pieces make a row-major result: left to choose, oneDNN 2.6 picks another order for some
  // shapes (acbd for [1, 2, 6273, 1569] on axis 2: MViT's attention scores), which only its `ref` kernels
  // then read (the Softmax after it: 1 s).
  bool all_row_major = true;
  for (const memory::desc& md : srcs) all_row_major = all_row_major && is_row_major(md);
  dnnl::concat::primitive_desc pd;
  try {
    pd = all_row_major ? dnnl::concat::primitive_desc(plain_md(yd, srcs[0].data_type()), static_cast<int>(axis), srcs,
                                                      L.engine(), Lowering::base_attr())
                       : dnnl::concat::primitive_desc(static_cast<int>(axis), srcs, L.engine(), Lowering::base_attr());
  } catch (const dnnl::error&) {
    return false;
  }
  if (lower_concat_in_place(L, n, axis, inputs, srcs, pd.dst_desc())) return true;
  if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0 && lower_concat_as_reorders(L, n, axis, inputs, srcs, pd.dst_desc()))
    return true;
  std::vector<SlotArg> args;
  std::vector<std::pair<int, memory>> consts;
  std::string detail;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    int arg = DNNL_ARG_MULTIPLE_SRC + static_cast<int>(i);
    if (inputs[i]->is_constant()) {
      consts.emplace_back(arg, L.constant_memory(inputs[i]->constant(), pd.src_desc(static_cast<int>(i))));
    } else {
      args.push_back({arg, L.slot_in(inputs[i], pd.src_desc(static_cast<int>(i))), pd.src_desc(static_cast<int>(i))});
    }
    detail += (i ? ", " : "") + layout_name(srcs[i]) + dims_str(inputs[i]->shape().sizes());
  }
  SlotId dst = L.new_value_slot(y, pd.dst_desc());
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc()});
  L.define(y, dst, pd.dst_desc());
  L.add_primitive({n.name(), "Concat", pd.impl_info_str(),
                   "axis " + std::to_string(axis) + ": " + detail + " -> " + layout_name(pd.dst_desc()) + dims_str(yd)},
                  &n, dnnl::concat(pd), pd.scratchpad_desc(), std::move(args), std::move(consts));
  return true;
}

// The source of a view op: `x`'s bytes through its strides and offset when they are unblocked (a
// strided view not copied yet, or a row-major or strided producer), else its row-major bytes. The view
// keeps the dtype the bytes are held in: a float32 value held in bf16 (Lowering::bf16_activation) stays
// bf16 through the views its bf16 readers see it through.
inline std::pair<SlotId, memory::desc> view_source(Lowering& L, const Value* x, memory::data_type dt) {
  if (auto s = L.strided_source(x)) return *s;
  return {L.row_major_slot(x), plain_md(x->shape().sizes(), dt)};
}

inline Dims md_strides(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  return Dims(d.format_desc.blocking.strides, d.format_desc.blocking.strides + d.ndims);
}

// Defines `y` as `src_md` over `src`: a view (define_strided_view) or, for a graph output (the
// caller's tensor), one reorder into it.
inline void define_view_or_copy(Lowering& L, const Node& n, const Value* y, SlotId src, const memory::desc& src_md,
                                const std::string& detail) {
  if (!y->is_graph_output()) {
    L.define_strided_view(n, y, src, src_md, detail);
    return;
  }
  memory::data_type dt = src_md.data_type();
  dnnl_dtype(y->dtype(), dt);  // the caller's tensor: the value's own dtype (bf16 bytes converted back)
  memory::desc dst_md = plain_md(y->shape().sizes(), dt);
  dnnl::reorder::primitive_desc pd(L.engine(), src_md, L.engine(), dst_md, Lowering::base_attr());
  SlotId dst = L.new_value_slot(y, dst_md);
  L.define(y, dst, dst_md);
  L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(), detail}, &n, dnnl::reorder(pd), pd.scratchpad_desc(),
                  {{DNNL_ARG_SRC, src, src_md}, {DNNL_ARG_DST, dst, dst_md}}, {});
}

// Transpose as permuted strides of its source: no copy until a reader needs row-major bytes (then one
// reorder, however many views were stacked), none at all when the permuted strides are row-major or
// the reader takes strides (attention).
// True for a Transpose (static shapes, a valid perm) that keeps the order of every dim of size > 1: it
// moves size-1 dims only, so y's row-major bytes are x's (torchvision's [1, n] -> [n, 1] int64 index lists).
inline bool moves_unit_dims_only(const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  const Dims xd = x->shape().sizes(), yd = y->shape().sizes();
  const std::size_t rank = xd.size();
  if (yd.size() != rank || x->dtype() != y->dtype()) return false;
  Dims perm(rank);
  for (std::size_t i = 0; i < rank; ++i) perm[i] = static_cast<std::int64_t>(rank - 1 - i);
  if (n.has_attr("perm")) perm = n.attr_ints("perm");
  if (perm.size() != rank) return false;
  std::vector<bool> seen(rank, false);
  std::int64_t last = -1;
  for (std::size_t j = 0; j < rank; ++j) {
    const std::int64_t p = perm[j];
    if (p < 0 || p >= static_cast<std::int64_t>(rank) || seen[static_cast<std::size_t>(p)]) return false;
    seen[static_cast<std::size_t>(p)] = true;
    if (yd[j] != xd[static_cast<std::size_t>(p)]) return false;
    if (xd[static_cast<std::size_t>(p)] == 1) continue;
    if (p < last) return false;
    last = p;
  }
  return true;
}

inline bool lower_view(Lowering& L, const Node& n);

inline bool lower_transpose(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!x || !y || !x->shape().is_static() || !y->shape().is_static()) return false;
  if (moves_unit_dims_only(n)) return lower_view(L, n);  // any dtype: the same row-major bytes
  memory::data_type dt;
  if (!dnnl_dtype(x->dtype(), dt)) return false;
  Dims xd = x->shape().sizes(), yd = y->shape().sizes();
  std::size_t rank = xd.size();
  if (rank == 0 || rank > 6 || yd.size() != rank) return false;
  Dims perm(rank);
  for (std::size_t i = 0; i < rank; ++i) perm[i] = static_cast<std::int64_t>(rank - 1 - i);
  if (n.has_attr("perm")) perm = n.attr_ints("perm");
  if (perm.size() != rank) return false;
  std::vector<bool> seen(rank, false);
  for (auto p : perm) {
    if (p < 0 || p >= static_cast<std::int64_t>(rank) || seen[static_cast<std::size_t>(p)]) return false;
    seen[static_cast<std::size_t>(p)] = true;
  }
  for (std::size_t j = 0; j < rank; ++j)
    if (yd[j] != xd[static_cast<std::size_t>(perm[j])]) return false;
  auto [src, x_md] = view_source(L, x, dt);
  Dims x_strides = md_strides(x_md), strides(rank);
  for (std::size_t j = 0; j < rank; ++j) strides[j] = x_strides[static_cast<std::size_t>(perm[j])];
  memory::desc src_md(yd, x_md.data_type(), strides);
  src_md.data.offset0 = x_md.data.offset0;
  define_view_or_copy(L, n, y, src, src_md, "perm " + dims_str(perm) + " of '" + x->name() + "': " + strided_str(src_md));
  return true;
}

// DepthToSpace (DCR or CRD) as one reorder: y's bytes, seen as [N, C, H, b, W, b], read from x through
// strides (x's channel dim split into its (block row, block column, channel) parts), so any unblocked source
// (row-major, channels-last, a strided view) is read in place.
inline bool lower_depth_to_space(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  memory::data_type dt;
  if (!x || !y || !x->shape().is_static() || !y->shape().is_static() || !dnnl_dtype(x->dtype(), dt)) return false;
  const Dims xd = x->shape().sizes(), yd = y->shape().sizes();
  const std::int64_t b = n.attr_int("blocksize", 0);
  if (xd.size() != 4 || yd.size() != 4 || b < 1 || xd[1] % (b * b) != 0 || *y->shape().numel() == 0) return false;
  const std::int64_t c = xd[1] / (b * b);
  if (yd != Dims{xd[0], c, xd[2] * b, xd[3] * b}) return false;
  const bool crd = n.attr_string("mode", "DCR") == "CRD";
  auto [src, x_md] = view_source(L, x, dt);
  const Dims s = md_strides(x_md);
  // Channel of x for (channel c, block row i, block column j): CRD c*b*b + i*b + j, DCR i*b*C + j*C + c.
  const Dims strides = crd ? Dims{s[0], b * b * s[1], s[2], b * s[1], s[3], s[1]}
                           : Dims{s[0], s[1], s[2], b * c * s[1], s[3], c * s[1]};
  const Dims six{xd[0], c, xd[2], b, xd[3], b};
  memory::desc src_md(six, x_md.data_type(), strides);
  src_md.data.offset0 = x_md.data.offset0;
  // y channels-last when x is (a detector head's ConvTranspose as conv + DepthToSpace: the next conv reads it
  // as it is, where a row-major y took one more pass to reorder), else row-major, as a graph output is.
  const bool channels_last = !y->is_graph_output() && channel_layout_tag(x_md) == memory::format_tag::acdb;
  const std::int64_t hb = xd[2] * b, wb = xd[3] * b;
  const memory::desc dst_md = channels_last ? memory::desc(six, dt, Dims{hb * wb * c, 1, b * wb * c, wb * c, b * c, c})
                                            : plain_md(six, dt);
  dnnl::reorder::primitive_desc pd(L.engine(), src_md, L.engine(), dst_md, Lowering::base_attr());
  const memory::desc y_md = channels_last ? memory::desc(yd, dt, memory::format_tag::acdb) : plain_md(yd, dt);
  SlotId dst = L.new_value_slot(y, y_md);
  L.define(y, dst, y_md);
  L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(),
                   std::string(crd ? "CRD" : "DCR") + " block " + std::to_string(b) + " of '" + x->name() + "': " +
                       strided_str(src_md) + (channels_last ? " -> acdb" : "")},
                  &n, dnnl::reorder(pd), pd.scratchpad_desc(), {{DNNL_ARG_SRC, src, src_md}, {DNNL_ARG_DST, dst, dst_md}}, {});
  return true;
}

// Slice with constant parameters and positive steps as a strided view of its source starting at the
// first element taken (the view's offset); copied like a Transpose's.
inline bool lower_slice(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  memory::data_type dt;
  if (!x || !y || x->is_constant() || !x->shape().is_static() || !y->shape().is_static() || !dnnl_dtype(x->dtype(), dt))
    return false;
  const Dims xd = x->shape().sizes(), yd = y->shape().sizes();
  const auto rank = static_cast<std::int64_t>(xd.size());
  if (rank == 0 || rank > 6 || yd.size() != xd.size() || *y->shape().numel() == 0) return false;
  for (std::size_t i = 1; i < n.num_inputs(); ++i)
    if (n.input(i) && !n.input(i)->is_constant()) return false;
  auto constant = [&](std::size_t i) -> const Tensor* {
    return i < n.num_inputs() && n.input(i) ? &n.input(i)->constant() : nullptr;
  };
  namespace t = infer::detail_tensor_ops;
  t::SliceParams p = t::slice_params(n, rank, constant(1), constant(2), constant(3), constant(4));
  if (!p.starts || !p.ends || !p.axes) return false;
  struct Cut {
    std::size_t axis;
    std::int64_t start, step;
  };
  std::vector<Cut> cuts;
  for (std::size_t i = 0; i < p.axes->size(); ++i) {
    auto a = static_cast<std::size_t>((*p.axes)[i]);
    std::int64_t step = p.steps ? (*p.steps)[i] : 1;
    if (step <= 0) return false;
    t::SliceAxis s = t::resolve_slice_axis(xd[a], (*p.starts)[i], (*p.ends)[i], step);
    if (s.count != yd[a]) return false;
    cuts.push_back({a, s.start, step});
  }
  auto [src, x_md] = view_source(L, x, dt);
  Dims strides = md_strides(x_md);
  memory::dim offset = x_md.data.offset0;
  for (const Cut& c : cuts) {
    offset += c.start * strides[c.axis];
    strides[c.axis] *= c.step;
  }
  memory::desc src_md(yd, x_md.data_type(), strides);
  src_md.data.offset0 = offset;
  define_view_or_copy(L, n, y, src, src_md, dims_str(xd) + " of '" + x->name() + "' -> " + strided_str(src_md));
  return true;
}

// Gather of one constant index (a scalar: the axis disappears) as a strided view of x, as Slice is: PyTorch's
// qkv[0], qkv[1], qkv[2] after an attention's fused projection (torchvision's Swin: 36 reference copies).
inline bool lower_gather_index(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* index = n.input(1);
  const Value* y = n.output(0);
  memory::data_type dt;
  if (!x || !index || !y || x->is_constant() || !index->is_constant() || !x->shape().is_static() ||
      !y->shape().is_static() || !dnnl_dtype(x->dtype(), dt) || *y->shape().numel() == 0)
    return false;
  const Tensor& it = index->constant();
  if (it.rank() != 0 || (it.dtype() != DType::Int64 && it.dtype() != DType::Int32)) return false;
  const Dims xd = x->shape().sizes(), yd = y->shape().sizes();
  const auto rank = static_cast<std::int64_t>(xd.size());
  std::int64_t axis = n.attr_int("axis", 0);
  if (rank < 2 || rank > 6 || axis < -rank || axis >= rank) return false;
  if (axis < 0) axis += rank;
  const auto a = static_cast<std::size_t>(axis);
  std::int64_t i = it.dtype() == DType::Int64 ? it.data<std::int64_t>()[0] : it.data<std::int32_t>()[0];
  if (i < 0) i += xd[a];
  if (i < 0 || i >= xd[a]) return false;  // the reference kernel names the bad index
  Dims want = xd;
  want.erase(want.begin() + axis);
  if (yd != want) return false;
  auto [src, x_md] = view_source(L, x, dt);
  Dims strides = md_strides(x_md);
  const memory::dim offset = x_md.data.offset0 + i * strides[a];
  strides.erase(strides.begin() + axis);
  memory::desc src_md(yd, x_md.data_type(), strides);
  src_md.data.offset0 = offset;
  define_view_or_copy(L, n, y, src, src_md,
                      "index " + std::to_string(i) + " on axis " + std::to_string(axis) + " of " + dims_str(xd) + " '" +
                          x->name() + "' -> " + strided_str(src_md));
  return true;
}

// Gather by an index tensor (an embedding lookup: token ids into a constant table; any axis, any dtype):
// for each of the `outer` leading positions, one block of the trailing dims per index, copied. The indices
// are read at run time and checked as the reference kernel checks them (negative ones count from the end;
// one out of range is an Error naming the node, the index and the axis).
class GatherStep : public runtime::Step {
 public:
  GatherStep(runtime::StepInfo info, SlotId x, SlotId indices, SlotId y, DType index_dtype, std::int64_t outer,
             std::int64_t axis, std::int64_t axis_dim, std::int64_t count, std::size_t block_bytes)
      : Step(std::move(info), {x, indices}, {y}), x_(x), indices_(indices), y_(y), index_dtype_(index_dtype),
        outer_(outer), axis_(axis), axis_dim_(axis_dim), count_(count), block_(block_bytes) {}

  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
    const auto* x = static_cast<const unsigned char*>(ctx.ptr(x_));
    auto* y = static_cast<unsigned char*>(ctx.ptr(y_));
    const void* raw = ctx.ptr(indices_);
    auto index_at = [&](std::int64_t k) {
      return index_dtype_ == DType::Int64 ? static_cast<const std::int64_t*>(raw)[k]
                                          : static_cast<std::int64_t>(static_cast<const std::int32_t*>(raw)[k]);
    };
    for (std::int64_t k = 0; k < count_; ++k) {  // all checked before any is copied
      const std::int64_t i = index_at(k);
      if (i < -axis_dim_ || i >= axis_dim_)
        throw Error("index " + std::to_string(i) + " is out of range for axis " + std::to_string(axis_) + " of size " +
                    std::to_string(axis_dim_))
            .at_node(name(), op());
    }
    const std::int64_t rows = outer_ * count_;
#pragma omp parallel for schedule(static) if (rows > 64 && rows * static_cast<std::int64_t>(block_) > (1 << 18))
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t o = r / count_;
      std::int64_t i = index_at(r % count_);
      if (i < 0) i += axis_dim_;
      std::memcpy(y + static_cast<std::size_t>(r) * block_, x + static_cast<std::size_t>(o * axis_dim_ + i) * block_,
                  block_);
    }
  }

 private:
  SlotId x_, indices_, y_;
  DType index_dtype_;
  std::int64_t outer_, axis_, axis_dim_, count_;
  std::size_t block_;
};

// Gather: a view for one constant scalar index (lower_gather_index), else GatherStep's copy.
inline bool lower_gather(Lowering& L, const Node& n) {
  if (lower_gather_index(L, n)) return true;
  const Value* x = n.input(0);
  const Value* index = n.input(1);
  const Value* y = n.output(0);
  if (!x || !index || !y || n.num_outputs() != 1 || x->dtype() == DType::String || dtype_size(x->dtype()) == 0)
    return false;
  if (index->dtype() != DType::Int64 && index->dtype() != DType::Int32) return false;
  if (!x->shape().is_static() || !index->shape().is_static() || !y->shape().is_static() || y->dtype() != x->dtype())
    return false;
  const Dims xd = x->shape().sizes(), id = index->shape().sizes(), yd = y->shape().sizes();
  const auto rank = static_cast<std::int64_t>(xd.size());
  std::int64_t axis = n.attr_int("axis", 0);
  if (rank == 0 || axis < -rank || axis >= rank) return false;
  if (axis < 0) axis += rank;
  const auto a = static_cast<std::size_t>(axis);
  Dims want(xd.begin(), xd.begin() + axis);
  want.insert(want.end(), id.begin(), id.end());
  want.insert(want.end(), xd.begin() + axis + 1, xd.end());
  if (yd != want || *y->shape().numel() == 0) return false;
  std::int64_t outer = 1, inner = 1, count = 1;
  for (std::size_t d = 0; d < a; ++d) outer *= xd[d];
  for (std::size_t d = a + 1; d < xd.size(); ++d) inner *= xd[d];
  for (std::int64_t d : id) count *= d;
  if (xd[a] == 0) return false;  // every index is out of range: the reference kernel says so
  SlotId xs = L.row_major_slot(x), is = L.row_major_slot(index), ys = L.new_plain_slot(y);
  L.define_plain(y, ys);
  const std::size_t block = static_cast<std::size_t>(inner) * dtype_size(x->dtype());
  L.add_step(std::make_unique<GatherStep>(
      runtime::StepInfo{n.name(), n.op_type(), "ondine:copy",
                        std::to_string(count) + " indices on axis " + std::to_string(axis) + " of " +
                            Graph::value_type_str(x) + ", rows of " + std::to_string(block) + " B -> " +
                            Graph::value_type_str(y)},
      xs, is, ys, index->dtype(), outer, axis, xd[a], count, block));
  return true;
}

// Reshape, Flatten, Squeeze, Unsqueeze: the same bytes under new dims. A strided source stays a
// strided view when its strides allow the new dims (reshape_md), else it is copied row-major first.
inline bool lower_view(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!x || !y || n.num_outputs() != 1 || !x->shape().is_static() || !y->shape().is_static()) return false;
  if (x->dtype() != y->dtype() || *x->shape().numel() != *y->shape().numel()) return false;
  if (!y->is_graph_output() && !x->is_constant() && *y->shape().numel() > 0) {
    if (auto s = L.strided_source(x); s && !is_row_major(s->second)) {
      if (auto md = reshape_md(s->second, y->shape().sizes())) {
        L.define_strided_view(n, y, s->first, *md, "of '" + x->name() + "': " + strided_str(*md));
        return true;
      }
    }
    // A float32 value held in bf16 stays bf16: its row-major bf16 bytes (a strided view copied in bf16)
    // under the new dims (define_view would convert them back to float32).
    if (L.bf16_activation(y)) {
      const ValueState& st = L.state(x);
      if (st.has_md && st.md.data_type() == memory::data_type::bf16 && is_row_major(st.md)) {
        L.define_strided_view(n, y, st.slot, plain_md(y->shape().sizes(), memory::data_type::bf16),
                              "zero-copy alias of '" + x->name() + "' (bf16)");
        return true;
      }
    }
  }
  L.define_view(n, x, y, n.op_type().c_str());
  return true;
}

// Pad, row-major, any dtype. Constant mode: the output filled with the value where some pad is positive, then
// each input row's kept part copied in one block (negative pads crop). Reflect, edge and wrap: each output row
// from the input row its indices map to, its middle copied in one block and its pads element by element (an
// STFT's centring pad, reflect, in front of every torch.stft-style audio front end). Rows split over threads.
enum class PadMode { Constant, Reflect, Edge, Wrap };

// The input index output index `i` (less the begin pad) reads along an axis of `n` elements.
inline std::int64_t pad_source_index(PadMode mode, std::int64_t i, std::int64_t n) {
  if (i >= 0 && i < n) return i;
  if (mode == PadMode::Edge) return i < 0 ? 0 : n - 1;
  if (mode == PadMode::Wrap) return ((i % n) + n) % n;
  if (n == 1) return 0;  // reflect: the sequence 0 1 .. n-1 n-2 .. 1 repeated
  const std::int64_t period = 2 * (n - 1), k = ((i % period) + period) % period;
  return k < n ? k : period - k;
}

class PadStep : public runtime::Step {
 public:
  PadStep(runtime::StepInfo info, SlotId x, SlotId y, Dims xd, Dims yd, Dims begin, std::vector<unsigned char> fill,
          PadMode mode = PadMode::Constant, std::size_t element_size = 0)
      : Step(std::move(info), {x}, {y}), x_(x), y_(y), xd_(std::move(xd)), yd_(std::move(yd)), begin_(std::move(begin)),
        fill_(std::move(fill)), mode_(mode), es_(element_size ? element_size : fill_.size()) {}

  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
    const auto* x = static_cast<const unsigned char*>(ctx.ptr(x_));
    auto* y = static_cast<unsigned char*>(ctx.ptr(y_));
    if (mode_ != PadMode::Constant) return execute_mapped(x, y);
    const std::size_t es = es_, rank = xd_.size();
    std::int64_t out_count = 1;
    for (std::int64_t d : yd_) out_count *= d;
    bool grows = false;  // some output position has no source
    for (std::size_t a = 0; a < rank; ++a) grows |= begin_[a] > 0 || xd_[a] + begin_[a] < yd_[a];
    if (grows) {
      if (std::all_of(fill_.begin(), fill_.end(), [](unsigned char c) { return c == 0; })) {
        std::memset(y, 0, static_cast<std::size_t>(out_count) * es);
      } else {
        for (std::int64_t i = 0; i < out_count; ++i) std::memcpy(y + static_cast<std::size_t>(i) * es, fill_.data(), es);
      }
    }
    // The kept input range per axis: [lo, hi) maps to output position + begin.
    Dims lo(rank), hi(rank), x_stride(rank, 1), y_stride(rank, 1);
    for (std::size_t a = rank; a-- > 0;) {
      lo[a] = std::max<std::int64_t>(0, -begin_[a]);
      hi[a] = std::min<std::int64_t>(xd_[a], yd_[a] - begin_[a]);
      if (hi[a] <= lo[a]) return;  // nothing of the input is kept
      if (a + 1 < rank) {
        x_stride[a] = x_stride[a + 1] * xd_[a + 1];
        y_stride[a] = y_stride[a + 1] * yd_[a + 1];
      }
    }
    const std::size_t last = rank - 1;
    const std::size_t row_bytes = static_cast<std::size_t>(hi[last] - lo[last]) * es;
    std::int64_t rows = 1;
    for (std::size_t a = 0; a < last; ++a) rows *= hi[a] - lo[a];
#pragma omp parallel for schedule(static) if (rows > 64 && rows * static_cast<std::int64_t>(row_bytes) > (1 << 18))
    for (std::int64_t r = 0; r < rows; ++r) {
      std::int64_t rest = r, x_off = lo[last], y_off = lo[last] + begin_[last];
      for (std::size_t a = last; a-- > 0;) {
        const std::int64_t extent = hi[a] - lo[a], i = lo[a] + rest % extent;
        rest /= extent;
        x_off += i * x_stride[a];
        y_off += (i + begin_[a]) * y_stride[a];
      }
      std::memcpy(y + static_cast<std::size_t>(y_off) * es, x + static_cast<std::size_t>(x_off) * es, row_bytes);
    }
  }

 private:
  // Reflect, edge, wrap: every output row reads the input row its indices map to.
  void execute_mapped(const unsigned char* x, unsigned char* y) const {
    const std::size_t es = es_, rank = xd_.size(), last = rank - 1;
    for (std::size_t a = 0; a < rank; ++a)
      if (xd_[a] == 0 && yd_[a] > 0) return;  // nothing to read (compile refuses it; the reference says why)
    Dims x_stride(rank, 1);
    for (std::size_t a = last; a-- > 0;) x_stride[a] = x_stride[a + 1] * xd_[a + 1];
    std::int64_t rows = 1;
    for (std::size_t a = 0; a < last; ++a) rows *= yd_[a];
    const std::int64_t n = xd_[last], width = yd_[last], b = begin_[last];
    const std::int64_t mid_lo = std::max<std::int64_t>(0, b), mid_hi = std::min<std::int64_t>(width, b + n);
#pragma omp parallel for schedule(static) if (rows > 64 && rows * width * static_cast<std::int64_t>(es) > (1 << 18))
    for (std::int64_t r = 0; r < rows; ++r) {
      std::int64_t rest = r, x_off = 0;
      for (std::size_t a = last; a-- > 0;) {
        const std::int64_t o = rest % yd_[a];
        rest /= yd_[a];
        x_off += pad_source_index(mode_, o - begin_[a], xd_[a]) * x_stride[a];
      }
      const unsigned char* src = x + static_cast<std::size_t>(x_off) * es;
      unsigned char* dst = y + static_cast<std::size_t>(r * width) * es;
      auto one = [&](std::int64_t j) {
        std::memcpy(dst + static_cast<std::size_t>(j) * es,
                    src + static_cast<std::size_t>(pad_source_index(mode_, j - b, n)) * es, es);
      };
      for (std::int64_t j = 0; j < std::min(mid_lo, width); ++j) one(j);
      if (mid_hi > mid_lo)
        std::memcpy(dst + static_cast<std::size_t>(mid_lo) * es, src + static_cast<std::size_t>(mid_lo - b) * es,
                    static_cast<std::size_t>(mid_hi - mid_lo) * es);
      for (std::int64_t j = std::max(mid_hi, mid_lo); j < width; ++j) one(j);
    }
  }

  SlotId x_, y_;
  Dims xd_, yd_, begin_;
  std::vector<unsigned char> fill_;
  PadMode mode_;
  std::size_t es_;
};

// Pad with pads, axes (and the constant value) known when the model compiles, any mode.
inline bool lower_pad(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!x || !y || x->dtype() == DType::String || dtype_size(x->dtype()) == 0) return false;
  if (!x->shape().is_static() || !y->shape().is_static() || x->shape().rank() == 0) return false;
  const std::string mode_name = infer::detail_nn::pad_mode(n);
  const PadMode mode = mode_name == "reflect" ? PadMode::Reflect
                       : mode_name == "edge"  ? PadMode::Edge
                       : mode_name == "wrap"  ? PadMode::Wrap
                                              : PadMode::Constant;
  if (mode == PadMode::Constant && mode_name != "constant") return false;
  const std::size_t rank = x->shape().rank();
  auto constant_or_null = [&](std::size_t i) -> const Tensor* {
    const Value* v = n.input(i);
    return v && v->is_constant() ? &v->constant() : nullptr;
  };
  if (n.opset() >= 11 && !constant_or_null(1)) return false;
  const bool have_axes = n.opset() >= 18 && n.input(3);
  if (have_axes && !constant_or_null(3)) return false;
  std::optional<Dims> pads = infer::detail_nn::pad_amounts(n, rank, constant_or_null(1), constant_or_null(3), have_axes);
  if (!pads) return false;
  std::vector<unsigned char> fill;
  if (n.opset() < 11) {
    fill = reference::detail::nn::fill_bytes(x->dtype(), n.attr_float("value", 0.0f));
  } else if (const Value* v = n.input(2)) {
    if (!v->is_constant() || v->dtype() != x->dtype() || v->constant().numel() != 1) return false;
    fill.resize(dtype_size(x->dtype()));
    std::memcpy(fill.data(), v->constant().raw(), fill.size());
  } else {
    fill = reference::detail::nn::fill_bytes(x->dtype(), 0.0);
  }
  const Dims xd = x->shape().sizes(), yd = y->shape().sizes();
  Dims begin(pads->begin(), pads->begin() + static_cast<std::ptrdiff_t>(rank));
  for (std::size_t a = 0; a < rank; ++a) {
    if (yd[a] != xd[a] + (*pads)[a] + (*pads)[a + rank]) return false;  // the reference kernel says why
    if (mode != PadMode::Constant && xd[a] == 0 && yd[a] > 0) return false;  // nothing to reflect: the same
    // Reflect past a whole period of the axis: the reference kernel's answer (and error) stand.
    if (mode == PadMode::Reflect && ((*pads)[a] >= xd[a] || (*pads)[a + rank] >= xd[a]) && yd[a] != xd[a]) return false;
  }
  SlotId xs = L.row_major_slot(x), ys = L.new_plain_slot(y);
  L.define_plain(y, ys);
  const std::size_t es = dtype_size(x->dtype());
  L.add_step(std::make_unique<PadStep>(
      runtime::StepInfo{n.name(), n.op_type(), "ondine:copy",
                        mode_name + ", pads " + dims_str(*pads) + ", " + Graph::value_type_str(x) + " -> " + Graph::value_type_str(y)},
      xs, ys, xd, yd, std::move(begin), std::move(fill), mode, es));
  return true;
}

// Split into one output (the whole input: torch exports unbind of a [n, 1] index list so): an alias.
// Split: each output a strided view of x from its first element on the axis, as Slice is (a one-output
// Split is an alias of the whole input). MViT-V2 splits its [1, 2, 3, 25089, 96] QKV into three this way:
// 16 reference copies.
inline bool lower_split(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* y0 = n.output(0);
  if (!x || !y0 || !x->shape().is_static()) return false;
  if (n.num_outputs() == 1) {  // any dtype (torchvision's int64 positions)
    if (x->shape() != y0->shape() || x->dtype() != y0->dtype()) return false;
    L.define_alias(n, x, y0);
    return true;
  }
  memory::data_type dt;
  if (x->is_constant() || !dnnl_dtype(x->dtype(), dt)) return false;
  const Dims xd = x->shape().sizes();
  const auto rank = static_cast<std::int64_t>(xd.size());
  if (rank == 0 || rank > 6) return false;
  std::int64_t axis = n.attr_int("axis", 0);
  if (axis < -rank || axis >= rank) return false;
  if (axis < 0) axis += rank;
  const auto a = static_cast<std::size_t>(axis);
  std::vector<std::int64_t> starts;
  std::int64_t at = 0;
  for (const Value* y : n.outputs()) {
    if (!y || y->dtype() != x->dtype() || !y->shape().is_static() || y->shape().rank() != xd.size()) return false;
    const Dims yd = y->shape().sizes();
    for (std::size_t d = 0; d < xd.size(); ++d)
      if (d != a && yd[d] != xd[d]) return false;
    if (yd[a] == 0) return false;
    starts.push_back(at);
    at += yd[a];
  }
  if (at != xd[a]) return false;
  auto [src, x_md] = view_source(L, x, dt);
  const Dims strides = md_strides(x_md);
  for (std::size_t i = 0; i < n.num_outputs(); ++i) {
    const Value* y = n.output(i);
    memory::desc y_md(y->shape().sizes(), x_md.data_type(), strides);
    y_md.data.offset0 = x_md.data.offset0 + starts[i] * strides[a];
    define_view_or_copy(L, n, y, src, y_md,
                        "part " + std::to_string(i + 1) + "/" + std::to_string(n.num_outputs()) + " of '" + x->name() +
                            "' " + dims_str(xd) + " from " + std::to_string(starts[i]) + " on axis " +
                            std::to_string(axis) + " -> " + strided_str(y_md));
  }
  return true;
}

inline bool lower_identity(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!x || !y || !x->shape().is_static() || x->shape() != y->shape() || x->dtype() != y->dtype()) return false;
  if (n.op_type() == "Dropout") {  // inference: identity, unless the mask is wanted or training is on
    if (n.output(1) && (n.output(1)->has_uses() || n.output(1)->is_graph_output())) return false;
    if (!dropout_is_identity(n)) return false;
  } else if (n.num_outputs() != 1) {
    return false;
  }
  L.define_alias(n, x, y);
  return true;
}

}  // namespace ondine::lower::detail
