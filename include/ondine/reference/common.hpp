// SPDX-License-Identifier: Apache-2.0
// ondine/reference/common.hpp - shared plumbing for the naive reference kernels.
//
// The reference kernels are the oracle for every optimisation: plain loops over row-major data, written
// for clarity, computing in double for floating types where that makes the oracle more exact.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ondine/ir/graph.hpp"

namespace ondine::reference {

// A kernel computes a node's outputs from its inputs. `inputs[i]` is empty() for an omitted optional
// input. It returns exactly node.num_outputs() tensors (an unused optional output may be empty()).
// Errors are thrown as node.error(...).
using Kernel = std::function<std::vector<Tensor>(const Node&, const std::vector<Tensor>& inputs)>;
using KernelTable = std::map<std::string, Kernel>;

namespace detail {

inline std::vector<std::int64_t> strides_of(const std::vector<std::int64_t>& dims) {
  std::vector<std::int64_t> s(dims.size(), 1);
  for (std::size_t i = dims.size(); i-- > 1;) s[i - 1] = s[i] * dims[i];
  return s;
}

inline std::int64_t normalize_axis(const Node& n, std::int64_t axis, std::int64_t rank) {
  if (axis < -rank || axis >= rank)
    throw n.error("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

// Numpy broadcast of concrete dims; throws naming the node when incompatible.
inline std::vector<std::int64_t> broadcast_dims(const Node& n, const std::vector<std::int64_t>& a,
                                                const std::vector<std::int64_t>& b) {
  std::size_t r = std::max(a.size(), b.size());
  std::vector<std::int64_t> out(r);
  for (std::size_t i = 0; i < r; ++i) {
    std::int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    std::int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      throw n.error("shapes " + dims_str(a) + " and " + dims_str(b) + " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// For each flat index of `out_dims`, the flat index into a tensor of `in_dims` broadcast to it.
inline std::vector<std::int64_t> broadcast_index_map(const std::vector<std::int64_t>& in_dims,
                                                     const std::vector<std::int64_t>& out_dims) {
  std::int64_t total = 1;
  for (auto d : out_dims) total *= d;
  std::vector<std::int64_t> map(static_cast<std::size_t>(total));
  std::size_t r = out_dims.size(), off = r - in_dims.size();
  std::vector<std::int64_t> in_strides = strides_of(in_dims), bstride(r, 0);
  for (std::size_t i = 0; i < in_dims.size(); ++i) bstride[i + off] = in_dims[i] == 1 ? 0 : in_strides[i];
  std::vector<std::int64_t> idx(r, 0);
  std::int64_t src = 0;
  for (std::int64_t k = 0; k < total; ++k) {
    map[static_cast<std::size_t>(k)] = src;
    for (std::size_t d = r; d-- > 0;) {  // odometer increment
      ++idx[d];
      src += bstride[d];
      if (idx[d] < out_dims[d]) break;
      src -= bstride[d] * idx[d];
      idx[d] = 0;
    }
  }
  return map;
}

}  // namespace detail
}  // namespace ondine::reference
