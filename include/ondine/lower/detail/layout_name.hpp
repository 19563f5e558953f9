// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/layout_name.hpp - a oneDNN memory descriptor's layout in oneDNN's own notation: one
// letter per dim, outermost first, upper case where the dim is also blocked, then the inner blocks
// ("aBcd16b", "acdb"; "abcd" is row-major), and ":bf16" for bfloat16 data (float32 and the int8 types
// go unsaid: the op says them).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"

namespace ondine::lower::detail {

inline std::string layout_name(const dnnl::memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.ndims == 0) return "undef";
  if (d.format_kind == dnnl_format_kind_any) return "any";
  if (d.format_kind != dnnl_blocked) return "opaque";
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  std::vector<int> order(static_cast<std::size_t>(d.ndims));
  for (int i = 0; i < d.ndims; ++i) order[static_cast<std::size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return b.strides[x] > b.strides[y]; });
  std::vector<bool> blocked(static_cast<std::size_t>(d.ndims), false);
  for (int i = 0; i < b.inner_nblks; ++i) blocked[static_cast<std::size_t>(b.inner_idxs[i])] = true;
  std::string s;
  for (int i : order) s += static_cast<char>((blocked[static_cast<std::size_t>(i)] ? 'A' : 'a') + i);
  for (int i = 0; i < b.inner_nblks; ++i)
    s += std::to_string(b.inner_blks[i]) + static_cast<char>('a' + b.inner_idxs[i]);
  if (d.data_type == dnnl_bf16) s += ":bf16";
  return s;
}

}  // namespace ondine::lower::detail
