// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/reorder.hpp - ondine.Reorder (placed by passes/layout.hpp): its input in the
// layout its output value asks for (Value::layout).
//
// RowMajor / ChannelsLast: one oneDNN reorder into the output's own slot (the caller's tensor for a
// row-major graph output), or an alias of the input when the bytes already match (e.g. NHWC of
// [N,C,1,1]). The layout pass makes one Reorder per value and layout, shared by its readers. Blocked ("whatever oneDNN prefers") can only be known once the reader's
// primitive exists: the output aliases the input here, and the reader, created with format_tag::any
// (activation_md), reorders into the layout it picks through slot_in.
// RowMajor over an unblocked layout (a channels-last convolution's output, which oneDNN picks on AVX-512)
// is a strided view rather than a copy: a Transpose reading it (ConvNeXt's permute to NHWC) then reads the
// bytes in place, and its permuted strides are row-major again; a reader that needs row-major bytes gets
// them copied once (Lowering::state), as the reorder would have.
#pragma once

#include <memory>
#include <string>

#include "ondine/lower/detail/context.hpp"

namespace ondine::lower::detail {

// Defines `y` as a new name for `slot`: an Alias slot, so an in-place writer (a sum post-op) never
// overwrites the bytes other readers of `slot` still need. No step: nothing runs for it.
inline void define_reorder_alias(Lowering& L, const Value* y, SlotId slot, const memory::desc& md) {
  runtime::Slot s = L.program.slots[slot];
  s.name = y->name();
  s.kind = SlotKind::Alias;
  s.index = L.root(slot);
  L.define(y, L.add_slot(std::move(s)), md);
}

inline bool lower_reorder(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!x || !y || n.num_inputs() != 1 || n.num_outputs() != 1) return false;
  if (x->dtype() != y->dtype() || !x->shape().is_static() || x->shape() != y->shape()) return false;
  memory::data_type own_dt;  // a float32 value held in bf16 is converted by a real reorder below
  if (y->layout() == Layout::RowMajor && !y->is_graph_output() && dnnl_dtype(x->dtype(), own_dt))
    if (auto src = L.strided_source(x); src && !is_row_major(src->second) && src->second.data_type() == own_dt) {
      L.define_strided_view(n, y, src->first, src->second, "row-major view of " + layout_name(src->second) + " '" + x->name() + "'");
      return true;
    }
  if (y->layout() == Layout::Blocked || y->layout() == Layout::Unset)
    if (auto src = L.strided_source(x); src && !is_row_major(src->second) && src->second.data.offset0 == 0) {
      // A strided view stays one, uncopied: the reader's primitive takes its strides as they are (a
      // channels-last view for a conv that runs channels-last) or reorders from them (slot_in). Not one
      // with an offset (a Slice): some oneDNN kernels ignore offset0 (context.hpp, without_offset).
      define_reorder_alias(L, y, src->first, src->second);
      return true;
    }
  const ValueState st = L.state(x);  // a copy: defining values may rehash the lowering's table
  if (!st.has_md) return false;      // a dtype oneDNN lacks: the reference kernel copies the bytes
  Layout target = y->layout();
  if (target == Layout::Blocked || target == Layout::Unset) {
    define_reorder_alias(L, y, st.slot, st.md);  // the reader's primitive reorders (slot_in)
    return true;
  }
  memory::desc want = activation_md(y, y->shape().sizes(), st.md.data_type());
  bool row_major_output = y->is_graph_output() && is_row_major(want);
  if (same_layout(st.md, want) && !row_major_output) {
    define_reorder_alias(L, y, st.slot, want);  // the bytes are already right (e.g. NHWC of [N,C,1,1])
    return true;
  }
  // Its own slot (a row-major graph output: the caller's tensor), not a copy shared through slot_in:
  // a reader may then overwrite it in place (a conv's sum post-op) without touching other readers' data.
  SlotId dst = L.new_value_slot(y, want);
  if (same_layout(st.md, want))
    L.add_step(std::make_unique<CopyStep>(runtime::StepInfo{n.name(), "Copy", "memcpy", "already row-major"}, st.slot,
                                          dst, L.program.slots[dst].bytes));
  else
    L.add_reorder(y->name(), st.slot, st.md, dst, want);
  L.define(y, dst, want);
  return true;
}

}  // namespace ondine::lower::detail
