// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/descriptors.hpp - oneDNN memory descriptors for graph values: dtypes, plain, `any` and
// activation layouts, row-major tests, and regrouped or reshaped views of a layout (what the lowering asks
// before it decides that a value can be read in place or needs a reorder).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "oneapi/dnnl/dnnl_debug.h"
#include "ondine/ir/graph.hpp"
#include "ondine/lower/detail/layout_name.hpp"
#include "ondine/runtime/compiled_model.hpp"

namespace ondine::lower {
namespace detail {

using dnnl::memory;
using runtime::SlotId;
using runtime::SlotKind;
using Dims = std::vector<std::int64_t>;

inline bool dnnl_dtype(DType t, memory::data_type& out) {
  switch (t) {
    case DType::Float32: out = memory::data_type::f32; return true;
    case DType::BFloat16: out = memory::data_type::bf16; return true;
    case DType::Float16: out = memory::data_type::f16; return true;
    case DType::Int8: out = memory::data_type::s8; return true;
    case DType::UInt8: out = memory::data_type::u8; return true;
    case DType::Int32: out = memory::data_type::s32; return true;
    default: return false;
  }
}

inline Dims at_least_1d(Dims d) { return d.empty() ? Dims{1} : d; }

inline Dims row_major_strides(const Dims& d) {
  Dims s(d.size(), 1);
  for (std::size_t i = d.size(); i-- > 1;) s[i - 1] = s[i] * std::max<std::int64_t>(d[i], 1);
  return s;
}

inline memory::desc plain_md(const Dims& dims, memory::data_type dt = memory::data_type::f32) {
  Dims d = at_least_1d(dims);
  return memory::desc(d, dt, row_major_strides(d));
}
inline memory::desc any_md(const Dims& dims, memory::data_type dt = memory::data_type::f32) {
  return memory::desc(at_least_1d(dims), dt, memory::format_tag::any);
}

// The descriptor a layout-choosing primitive (conv, pooling, ...) asks for activation `v`: the layout
// the layout pass chose (ondine/passes/layout.hpp), else format_tag::any so oneDNN picks.
inline memory::desc activation_md(const Value* v, const Dims& dims, memory::data_type dt = memory::data_type::f32) {
  using tag = memory::format_tag;
  switch (v ? v->layout() : Layout::Unset) {
    case Layout::RowMajor:
      return plain_md(dims, dt);
    case Layout::ChannelsLast:
      if (dims.size() == 3) return memory::desc(dims, dt, tag::nwc);
      if (dims.size() == 4) return memory::desc(dims, dt, tag::nhwc);
      if (dims.size() == 5) return memory::desc(dims, dt, tag::ndhwc);
      return plain_md(dims, dt);
    case Layout::Blocked:
    case Layout::Unset:
      break;
  }
  return any_md(dims, dt);
}

// True when the descriptor's bytes are exactly the row-major bytes of its dims (strides of size-1
// dims do not matter; no blocking, padding or offset).
inline bool is_row_major(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked || d.offset0 != 0 || d.extra.flags != 0) return false;
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  if (b.inner_nblks != 0) return false;
  std::int64_t expect = 1;
  for (int i = d.ndims; i-- > 0;) {
    if (d.padded_dims[i] != d.dims[i]) return false;
    if (d.dims[i] > 1 && b.strides[i] != expect) return false;
    expect *= d.dims[i];
  }
  return true;
}

inline std::int64_t md_numel(const memory::desc& md) {
  std::int64_t n = 1;
  for (int i = 0; i < md.data.ndims; ++i) n *= md.data.dims[i];
  return n;
}

// Two descriptors whose memory can be used interchangeably.
inline bool same_layout(const memory::desc& a, const memory::desc& b) {
  if (a == b) return true;
  return a.data.data_type == b.data.data_type && is_row_major(a) && is_row_major(b) && md_numel(a) == md_numel(b);
}

// An unblocked layout as "[dims] strides [strides] +offset" (compile logs and step details).
inline std::string strided_str(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  std::string dims = "[", strides = "[";
  for (int i = 0; i < d.ndims; ++i) {
    dims += (i ? "," : "") + std::to_string(d.dims[i]);
    strides += (i ? "," : "") + std::to_string(d.format_desc.blocking.strides[i]);
  }
  return dims + "] strides " + strides + "]" + (d.offset0 ? " +" + std::to_string(d.offset0) : "");
}

inline std::string plain_layout_name(std::size_t rank) {
  std::string s;
  for (std::size_t i = 0; i < rank; ++i) s += static_cast<char>('a' + i);
  return s.empty() ? "scalar" : s;
}

// An unblocked layout with its dims grouped: `ends` lists where each group ends (ascending, the last
// is the rank; an empty group is a dim of size 1). A group merges into one dim when its dims nest in
// memory (each dim's stride is the next one's times that one's size; dims of size 1 impose nothing).
// Empty when the strides do not allow it. The offset and data type are kept.
inline std::optional<memory::desc> regroup_md(const memory::desc& md, const std::vector<std::size_t>& ends) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked || d.format_desc.blocking.inner_nblks != 0 || d.extra.flags != 0) return std::nullopt;
  if (ends.empty() || ends.back() != static_cast<std::size_t>(d.ndims)) return std::nullopt;
  memory::dims dims, strides;
  std::size_t begin = 0;
  for (std::size_t end : ends) {
    if (end < begin) return std::nullopt;
    std::int64_t size = 1, stride = 0;  // stride 0: no dim above 1 seen yet
    for (std::size_t i = end; i-- > begin;) {
      const std::int64_t n = d.dims[i], st = d.format_desc.blocking.strides[i];
      if (n == 1) continue;
      if (stride == 0) stride = st;  // the group's stride is its innermost dim's
      else if (st != stride * size) return std::nullopt;
      size *= n;
    }
    dims.push_back(size);
    strides.push_back(stride);
    begin = end;
  }
  for (std::size_t i = dims.size(); i-- > 0;)  // a dim of size 1: the stride a row-major layout would give it
    if (dims[i] == 1) strides[i] = i + 1 < dims.size() ? strides[i + 1] * dims[i + 1] : 1;
  memory::desc out(dims, md.data_type(), strides);
  out.data.offset0 = d.offset0;
  return out;
}

// `md` with the same elements in the dims `to`, without a copy (NumPy's no-copy reshape: each group of
// dims that multiplies to the same count on both sides must nest in memory). Empty when it cannot.
inline std::optional<memory::desc> reshape_md(const memory::desc& md, const Dims& to) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked || d.format_desc.blocking.inner_nblks != 0 || d.extra.flags != 0) return std::nullopt;
  Dims old_dims, old_strides;
  for (int i = 0; i < d.ndims; ++i) {
    if (d.dims[i] == 0) return std::nullopt;
    if (d.dims[i] == 1) continue;
    old_dims.push_back(d.dims[i]);
    old_strides.push_back(d.format_desc.blocking.strides[i]);
  }
  std::int64_t count = 1;
  for (auto x : to) count *= x;
  std::int64_t old_count = 1;
  for (auto x : old_dims) old_count *= x;
  if (count != old_count || count == 0) return std::nullopt;
  Dims strides(to.size(), 1);
  std::size_t oi = 0, ni = 0;
  while (oi < old_dims.size() && ni < to.size()) {
    std::size_t oj = oi + 1, nj = ni + 1;
    std::int64_t op = old_dims[oi], np = to[ni];
    while (np != op) {
      if (np < op) np *= to[nj++];
      else op *= old_dims[oj++];
    }
    for (std::size_t k = oi; k + 1 < oj; ++k)
      if (old_strides[k] != old_dims[k + 1] * old_strides[k + 1]) return std::nullopt;
    strides[nj - 1] = old_strides[oj - 1];
    for (std::size_t k = nj - 1; k > ni; --k) strides[k - 1] = strides[k] * to[k];
    ni = nj;
    oi = oj;
  }
  for (std::size_t k = to.size(); k-- > 0;)  // trailing dims of size 1 left by the loop
    if (k >= ni) strides[k] = k + 1 < to.size() ? strides[k + 1] * to[k + 1] : 1;
  memory::desc out(to, md.data_type(), strides);
  out.data.offset0 = d.offset0;
  return out;
}

}  // namespace detail
}  // namespace ondine::lower
