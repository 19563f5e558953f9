// SPDX-License-Identifier: Apache-2.0
// ondine/reference/tensor_ops.hpp - reference kernels for the data-movement and shape ops.
//
// Most of these ops only move elements, so the kernels copy bytes (dtype_size at a time) and work for
// every fixed-size dtype, bool and float16 included. The parameter rules (slice clamping, reshape
// targets, split sizes, ...) are the same functions shape inference uses (infer/tensor_ops.hpp).
// Ops that only change the shape (Reshape, Flatten, Squeeze, Unsqueeze, Identity) return views that
// share the input's storage; tensors are immutable once produced, so sharing is safe.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "ondine/ir/infer/tensor_ops.hpp"
#include "ondine/reference/common.hpp"

namespace ondine::reference {
namespace detail::tensor_ops {

using Ints = std::vector<std::int64_t>;
namespace shared = ::ondine::infer::detail_tensor_ops;

// ---- plumbing -----------------------------------------------------------------------------------

// The input tensor, or nullptr when the optional input is omitted.
inline const Tensor* optional_arg(const std::vector<Tensor>& in, std::size_t i) {
  return i < in.size() && !in[i].empty() ? &in[i] : nullptr;
}
inline const Tensor& required_arg(const Node& n, const std::vector<Tensor>& in, std::size_t i) {
  const Tensor* t = optional_arg(in, i);
  if (!t) throw n.error("missing required input #" + std::to_string(i));
  return *t;
}

// Size in bytes of one element; string (and undefined) tensors cannot be moved byte-wise.
inline std::size_t element_size(const Node& n, DType t) {
  std::size_t s = dtype_size(t);
  if (s == 0) throw n.error("tensors of " + std::string(dtype_name(t)) + " are not supported");
  return s;
}

// Product of dims [from, to).
inline std::int64_t product(const Ints& d, std::size_t from = 0, std::size_t to = SIZE_MAX) {
  to = std::min(to, d.size());
  if (from >= to) return 1;
  return std::accumulate(d.begin() + static_cast<std::ptrdiff_t>(from), d.begin() + static_cast<std::ptrdiff_t>(to),
                         std::int64_t(1), std::multiplies<>());
}

inline std::uint8_t* bytes(Tensor& t) { return static_cast<std::uint8_t*>(t.raw()); }
inline const std::uint8_t* bytes(const Tensor& t) { return static_cast<const std::uint8_t*>(t.raw()); }

// A scalar (or one-element) parameter tensor as double.
inline double scalar_double(const Node& n, const Tensor& t, const char* what) {
  if (t.numel() != 1) throw n.error(std::string(what) + " must be a scalar, got shape " + dims_str(t.dims()));
  return t.at_double(0);
}

// Converts a double to any element type (the 16-bit floats only construct from float).
template <typename T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) return T(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>) return v != 0;
  else return static_cast<T>(v);
}

// Copies a strided view of `in` into a new dense tensor of `out_dims`: output element (i0, i1, ...) reads
// input element `offset + sum(i_d * strides[d])` (strides in elements; 0 broadcasts, negative reverses).
// Transpose, Slice, Expand, Tile and DepthToSpace are all such views.
inline Tensor strided_copy(const Node& n, const Tensor& in, const Ints& out_dims, std::int64_t offset,
                           const Ints& strides) {
  std::size_t es = element_size(n, in.dtype());
  shared::checked_numel(n, out_dims);
  Tensor out(in.dtype(), out_dims);
  std::int64_t total = out.numel();
  if (total == 0) return out;
  const std::uint8_t* src = bytes(in);
  std::uint8_t* dst = bytes(out);
  // Dims of size 1 move nothing, and a dim whose stride is the next one's extent continues it: dropped
  // and merged, so that a [n, 1] <- [1, n] transpose is one run, not n runs of one element.
  Ints dims, steps;
  for (std::size_t d = 0; d < out_dims.size(); ++d) {
    if (out_dims[d] == 1) continue;
    if (!dims.empty() && steps.back() == strides[d] * out_dims[d]) {
      dims.back() *= out_dims[d];
      steps.back() = strides[d];
      continue;
    }
    dims.push_back(out_dims[d]);
    steps.push_back(strides[d]);
  }
  if (dims.empty()) {
    dims.push_back(1);
    steps.push_back(1);
  }
  const std::size_t r = dims.size();
  const std::int64_t inner = dims[r - 1], inner_stride = steps[r - 1];
  const std::size_t run_bytes = static_cast<std::size_t>(inner) * es;
  // One element at a time (a gather along the innermost dim), typed for the common sizes.
  auto copy_strided = [&](std::int64_t pos) {
    auto typed = [&](auto zero) {
      using T = decltype(zero);
      const T* s = reinterpret_cast<const T*>(src);
      T* o = reinterpret_cast<T*>(dst);
      for (std::int64_t j = 0; j < inner; ++j, pos += inner_stride) std::memcpy(o + j, s + pos, sizeof(T));
    };
    switch (es) {
      case 1: typed(std::uint8_t{}); break;
      case 2: typed(std::uint16_t{}); break;
      case 4: typed(std::uint32_t{}); break;
      case 8: typed(std::uint64_t{}); break;
      default:
        for (std::int64_t j = 0; j < inner; ++j, pos += inner_stride)
          std::memcpy(dst + static_cast<std::size_t>(j) * es, src + pos * static_cast<std::int64_t>(es), es);
    }
    dst += run_bytes;
  };
  Ints idx(r, 0);
  std::int64_t base = offset;
  for (std::int64_t k = 0; k < total; k += inner) {
    if (inner_stride == 1) {
      std::memcpy(dst, src + base * static_cast<std::int64_t>(es), run_bytes);
      dst += run_bytes;
    } else {
      copy_strided(base);
    }
    for (std::size_t d = r - 1; d-- > 0;) {  // odometer over all dims but the innermost
      ++idx[d];
      base += steps[d];
      if (idx[d] < dims[d]) break;
      base -= steps[d] * idx[d];
      idx[d] = 0;
    }
  }
  return out;
}

// `in` with its dims permuted: output dim d is input dim perm[d].
inline Tensor transpose(const Node& n, const Tensor& in, const Ints& perm) {
  Ints in_strides = strides_of(in.dims()), dims(perm.size()), strides(perm.size());
  for (std::size_t d = 0; d < perm.size(); ++d) {
    dims[d] = in.dims()[static_cast<std::size_t>(perm[d])];
    strides[d] = in_strides[static_cast<std::size_t>(perm[d])];
  }
  return strided_copy(n, in, dims, 0, strides);
}

// Integer parameter tensor (shape, axes, repeats) as int64s; must be an integer 1-D (or scalar) tensor.
inline Ints int_values(const Node& n, const Tensor& t, const char* what) {
  shared::check_index_dtype(n, t.dtype(), what);
  if (t.rank() > 1) throw n.error(std::string(what) + " must be a 1-D tensor, got shape " + dims_str(t.dims()));
  return t.to_int64s();
}

// ---- kernels ------------------------------------------------------------------------------------

inline std::vector<Tensor> identity(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  element_size(n, x.dtype());
  return {x};
}

inline std::vector<Tensor> concat(const Node& n, const std::vector<Tensor>& in) {
  if (in.empty()) throw n.error("Concat needs at least one input");
  const Tensor& first = required_arg(n, in, 0);
  std::size_t es = element_size(n, first.dtype());
  auto rank = static_cast<std::int64_t>(first.rank());
  if (rank == 0) throw n.error("cannot concatenate scalars");
  std::int64_t axis = shared::opset_of(n) < 4 ? n.attr_int("axis", 1) : n.attr_int("axis");
  axis = infer::normalize_axis(n, axis, rank);
  auto ax = static_cast<std::size_t>(axis);
  Ints out_dims = first.dims();
  out_dims[ax] = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const Tensor& t = required_arg(n, in, i);
    if (t.dtype() != first.dtype())
      throw n.error("input " + std::to_string(i) + " has dtype " + std::string(dtype_name(t.dtype())) +
                    " but input 0 has " + std::string(dtype_name(first.dtype())));
    bool same = t.rank() == first.rank();
    for (std::size_t d = 0; same && d < t.rank(); ++d) same = d == ax || t.dims()[d] == first.dims()[d];
    if (!same)
      throw n.error("input shapes " + dims_str(first.dims()) + " and " + dims_str(t.dims()) +
                    " differ outside the concatenation axis " + std::to_string(axis));
    out_dims[ax] += t.dims()[ax];
  }
  Tensor out(first.dtype(), out_dims);
  if (out.numel() == 0) return {out};
  std::int64_t outer = product(out_dims, 0, ax);
  auto out_row = static_cast<std::size_t>(product(out_dims, ax)) * es;
  std::size_t col = 0;  // byte offset of the current input's block within an output row
  for (const Tensor& t : in) {
    auto row = static_cast<std::size_t>(product(t.dims(), ax)) * es;
    if (row == 0) continue;
    for (std::int64_t o = 0; o < outer; ++o)
      std::memcpy(bytes(out) + static_cast<std::size_t>(o) * out_row + col,
                  bytes(t) + static_cast<std::size_t>(o) * row, row);
    col += row;
  }
  return {out};
}

inline std::vector<Tensor> split(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  std::size_t es = element_size(n, x.dtype());
  auto rank = static_cast<std::int64_t>(x.rank());
  if (rank == 0) throw n.error("cannot split a scalar");
  auto ax = static_cast<std::size_t>(infer::normalize_axis(n, n.attr_int("axis", 0), rank));
  shared::IntParam given = shared::split_param(n, optional_arg(in, 1));
  Ints sizes = shared::split_sizes(n, x.dims()[ax], given.values, n.num_outputs());
  std::int64_t outer = product(x.dims(), 0, ax);
  auto in_row = static_cast<std::size_t>(product(x.dims(), ax)) * es;
  std::size_t col = 0;
  std::vector<Tensor> outs;
  for (auto s : sizes) {
    Ints dims = x.dims();
    dims[ax] = s;
    Tensor out(x.dtype(), dims);
    auto row = static_cast<std::size_t>(product(dims, ax)) * es;
    if (row != 0)
      for (std::int64_t o = 0; o < outer; ++o)
        std::memcpy(bytes(out) + static_cast<std::size_t>(o) * row,
                    bytes(x) + static_cast<std::size_t>(o) * in_row + col, row);
    col += row;
    outs.push_back(out);
  }
  return outs;
}

inline std::vector<Tensor> slice(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  auto rank = static_cast<std::int64_t>(x.rank());
  shared::SliceParams p = shared::slice_params(n, rank, optional_arg(in, 1), optional_arg(in, 2),
                                               optional_arg(in, 3), optional_arg(in, 4));
  Ints dims = x.dims(), in_strides = strides_of(x.dims()), strides = in_strides;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < p.axes->size(); ++i) {
    auto a = static_cast<std::size_t>((*p.axes)[i]);
    shared::SliceAxis s = shared::resolve_slice_axis(x.dims()[a], (*p.starts)[i], (*p.ends)[i], (*p.steps)[i]);
    dims[a] = s.count;
    offset += s.start * in_strides[a];
    strides[a] = s.count > 1 ? s.step * in_strides[a] : in_strides[a];
  }
  return {strided_copy(n, x, dims, offset, strides)};
}

inline std::vector<Tensor> gather(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& data = required_arg(n, in, 0);
  const Tensor& indices = required_arg(n, in, 1);
  std::size_t es = element_size(n, data.dtype());
  shared::check_index_dtype(n, indices.dtype(), "indices");
  auto rank = static_cast<std::int64_t>(data.rank());
  if (rank == 0) throw n.error("cannot gather from a scalar");
  auto ax = static_cast<std::size_t>(infer::normalize_axis(n, n.attr_int("axis", 0), rank));
  Ints out_dims(data.dims().begin(), data.dims().begin() + static_cast<std::ptrdiff_t>(ax));
  out_dims.insert(out_dims.end(), indices.dims().begin(), indices.dims().end());
  out_dims.insert(out_dims.end(), data.dims().begin() + static_cast<std::ptrdiff_t>(ax) + 1, data.dims().end());
  Ints idx = indices.to_int64s();
  std::int64_t axis_dim = data.dims()[ax];
  for (auto& i : idx) {
    if (i < -axis_dim || i >= axis_dim)
      throw n.error("index " + std::to_string(i) + " is out of range for axis " + std::to_string(ax) + " of size " +
                    std::to_string(axis_dim));
    if (i < 0) i += axis_dim;
  }
  shared::checked_numel(n, out_dims);
  Tensor out(data.dtype(), out_dims);
  if (out.numel() == 0) return {out};
  std::int64_t outer = product(data.dims(), 0, ax);
  auto block = static_cast<std::size_t>(product(data.dims(), ax + 1)) * es;
  std::uint8_t* dst = bytes(out);
  for (std::int64_t o = 0; o < outer; ++o)
    for (auto i : idx) {
      std::memcpy(dst, bytes(data) + (static_cast<std::size_t>(o * axis_dim + i)) * block, block);
      dst += block;
    }
  return {out};
}

// Calls f(flat index into `dims`, multi-index) for every element, in row-major order.
template <typename F>
void for_each_index(const Ints& dims, F&& f) {
  std::int64_t total = product(dims);
  Ints idx(dims.size(), 0);
  for (std::int64_t k = 0; k < total; ++k) {
    f(k, idx);
    for (std::size_t d = dims.size(); d-- > 0;) {
      if (++idx[d] < dims[d]) break;
      idx[d] = 0;
    }
  }
}

// For GatherElements / ScatterElements: the flat offset into `data` addressed by element `idx` of
// `indices` whose value is `v` along `axis`. Checks the range (negative values count from the end).
inline std::int64_t element_offset(const Node& n, const Ints& data_dims, const Ints& data_strides, std::size_t axis,
                                   const Ints& idx, std::int64_t v) {
  std::int64_t dim = data_dims[axis];
  if (v < -dim || v >= dim)
    throw n.error("index " + std::to_string(v) + " is out of range for axis " + std::to_string(axis) + " of size " +
                  std::to_string(dim));
  if (v < 0) v += dim;
  std::int64_t off = 0;
  for (std::size_t d = 0; d < idx.size(); ++d) off += (d == axis ? v : idx[d]) * data_strides[d];
  return off;
}

// Checks that indices fit inside data in every dim but `axis` (GatherElements / ScatterElements).
inline void check_element_indices(const Node& n, const Tensor& data, const Tensor& indices, std::size_t axis) {
  if (indices.rank() != data.rank())
    throw n.error("indices " + dims_str(indices.dims()) + " must have the rank of data " + dims_str(data.dims()));
  for (std::size_t d = 0; d < data.rank(); ++d)
    if (d != axis && indices.dims()[d] > data.dims()[d])
      throw n.error("indices " + dims_str(indices.dims()) + " exceed data " + dims_str(data.dims()) + " in dim " +
                    std::to_string(d));
}

inline std::vector<Tensor> gather_elements(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& data = required_arg(n, in, 0);
  const Tensor& indices = required_arg(n, in, 1);
  std::size_t es = element_size(n, data.dtype());
  shared::check_index_dtype(n, indices.dtype(), "indices");
  auto rank = static_cast<std::int64_t>(data.rank());
  if (rank == 0) throw n.error("cannot gather from a scalar");
  auto ax = static_cast<std::size_t>(infer::normalize_axis(n, n.attr_int("axis", 0), rank));
  check_element_indices(n, data, indices, ax);
  Ints idx_values = indices.to_int64s(), strides = strides_of(data.dims());
  Tensor out(data.dtype(), indices.dims());
  for_each_index(indices.dims(), [&](std::int64_t k, const Ints& idx) {
    std::int64_t off = element_offset(n, data.dims(), strides, ax, idx, idx_values[static_cast<std::size_t>(k)]);
    std::memcpy(bytes(out) + static_cast<std::size_t>(k) * es, bytes(data) + static_cast<std::size_t>(off) * es, es);
  });
  return {out};
}

inline std::vector<Tensor> reshape(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  element_size(n, x.dtype());
  Ints target;
  if (const Tensor* s = optional_arg(in, 1)) target = int_values(n, *s, "shape");
  else if (n.has_attr("shape")) target = n.attr_ints("shape");
  else throw n.error("missing the target shape");
  Shape out = shared::reshape_output(n, x.shape(), target, n.attr_int("allowzero", 0) != 0);
  if (!out.is_static()) throw n.error("cannot infer the -1 in " + dims_str(target) + " for " + dims_str(x.dims()));
  if (*out.numel() != x.numel())
    throw n.error("cannot reshape " + dims_str(x.dims()) + " to " + out.str() + ": the element counts differ");
  return {x.reshaped(out.sizes())};
}

inline std::vector<Tensor> flatten(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  element_size(n, x.dtype());
  auto rank = static_cast<std::int64_t>(x.rank());
  std::int64_t axis = n.attr_int("axis", 1);
  if (axis < -rank || axis > rank)
    throw n.error("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  if (axis < 0) axis += rank;
  auto a = static_cast<std::size_t>(axis);
  return {x.reshaped({product(x.dims(), 0, a), product(x.dims(), a)})};
}

inline std::vector<Tensor> transpose_kernel(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  return {transpose(n, x, shared::transpose_perm(n, static_cast<std::int64_t>(x.rank())))};
}

inline std::vector<Tensor> squeeze(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  element_size(n, x.dtype());
  auto rank = static_cast<std::int64_t>(x.rank());
  Ints dims;
  if (const Tensor* a = optional_arg(in, 1); a || n.has_attr("axes")) {
    Ints axes = shared::squeeze_axes(n, a ? int_values(n, *a, "axes") : n.attr_ints("axes"), rank);
    for (std::int64_t d = 0; d < rank; ++d) {
      std::int64_t size = x.dims()[static_cast<std::size_t>(d)];
      if (!std::binary_search(axes.begin(), axes.end(), d)) dims.push_back(size);
      else if (size != 1)
        throw n.error("cannot squeeze axis " + std::to_string(d) + " of " + dims_str(x.dims()) +
                      ": its size is not 1");
    }
  } else {
    for (auto d : x.dims())
      if (d != 1) dims.push_back(d);
  }
  return {x.reshaped(dims)};
}

inline std::vector<Tensor> unsqueeze(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  element_size(n, x.dtype());
  Ints axes;
  if (const Tensor* a = optional_arg(in, 1)) axes = int_values(n, *a, "axes");
  else if (n.has_attr("axes")) axes = n.attr_ints("axes");
  else throw n.error("missing axes");
  auto out_rank = static_cast<std::int64_t>(x.rank() + axes.size());
  axes = shared::unsqueeze_axes(n, axes, out_rank);
  Ints dims;
  std::size_t next = 0;
  for (std::int64_t d = 0; d < out_rank; ++d)
    dims.push_back(std::binary_search(axes.begin(), axes.end(), d) ? 1 : x.dims()[next++]);
  return {x.reshaped(dims)};
}

inline std::vector<Tensor> shape(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  auto [start, end] = shared::shape_range(n, static_cast<std::int64_t>(x.rank()));
  Ints dims(x.dims().begin() + start, x.dims().begin() + end);
  return {Tensor::from_vector<std::int64_t>({end - start}, dims)};
}

inline std::vector<Tensor> size(const Node& n, const std::vector<Tensor>& in) {
  return {Tensor::scalar<std::int64_t>(required_arg(n, in, 0).numel())};
}

// Dropout. Inference mode (the default): output = input, mask all true. Training mode (opset 12+,
// training_mode input true at run time) drops elements like the ONNX reference: numpy's legacy
// RandomState seeded with the `seed` attribute (MT19937, uniform doubles), keep where u >= ratio,
// scale kept values by 1 / (1 - ratio). Shape inference rejects a constant training_mode = true.
inline std::vector<Tensor> dropout(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  element_size(n, x.dtype());
  bool training = false;
  double ratio = 0.5;
  if (shared::opset_of(n) >= 12) {
    if (const Tensor* r = optional_arg(in, 1)) ratio = scalar_double(n, *r, "ratio");
    if (const Tensor* t = optional_arg(in, 2)) training = scalar_double(n, *t, "training_mode") != 0;
  } else {
    ratio = n.attr_float("ratio", 0.5f);
  }
  bool want_mask = n.num_outputs() > 1;
  DType mask_type = shared::opset_of(n) >= 10 ? DType::Bool : x.dtype();
  if (!training || ratio == 0) {
    std::vector<Tensor> outs{x};
    if (want_mask) {
      Tensor mask(mask_type, x.dims());
      dispatch_dtype(mask_type, [&](auto tag) {
        using T = typename decltype(tag)::type;
        std::fill_n(mask.data<T>(), mask.numel(), from_double<T>(1.0));
      });
      outs.push_back(mask);
    }
    return outs;
  }
  if (!is_floating(x.dtype())) throw n.error("training-mode Dropout needs a floating-point input");
  if (!(ratio >= 0 && ratio < 1)) throw n.error("ratio must be in [0, 1), got " + std::to_string(ratio));
  std::mt19937 rng;
  if (n.has_attr("seed")) rng.seed(static_cast<std::uint32_t>(n.attr_int("seed")));
  else rng.seed(std::random_device{}());
  auto uniform = [&] {  // numpy's random_sample: 53 random bits from two 32-bit draws
    auto a = static_cast<std::uint32_t>(rng() >> 5), b = static_cast<std::uint32_t>(rng() >> 6);
    return (a * 67108864.0 + b) / 9007199254740992.0;
  };
  double scale = 1.0 / (1.0 - ratio);
  Tensor y(x.dtype(), x.dims()), mask(DType::Bool, x.dims());
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* src = x.data<T>();
    T* dst = y.data<T>();
    bool* keep = mask.data<bool>();
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      keep[i] = uniform() >= ratio;
      if constexpr (std::is_same_v<T, double>) dst[i] = keep[i] ? src[i] * scale : 0.0;
      else dst[i] = from_double<T>(keep[i] ? static_cast<float>(src[i]) * static_cast<float>(scale) : 0.0f);
    }
  });
  std::vector<Tensor> outs{y};
  if (want_mask) outs.push_back(mask);
  return outs;
}

inline std::vector<Tensor> expand(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  Ints target = int_values(n, required_arg(n, in, 1), "shape");
  shared::checked_numel(n, target);
  Ints dims = broadcast_dims(n, x.dims(), target);
  shared::checked_numel(n, dims);
  Ints in_strides = strides_of(x.dims()), strides(dims.size(), 0);
  std::size_t off = dims.size() - x.rank();
  for (std::size_t i = 0; i < x.rank(); ++i) strides[i + off] = x.dims()[i] == 1 ? 0 : in_strides[i];
  return {strided_copy(n, x, dims, 0, strides)};
}

// A tensor of `dims` with every element equal to the one-element tensor `value`.
inline Tensor filled(const Node& n, const Tensor& value, const Ints& dims) {
  std::size_t es = element_size(n, value.dtype());
  Tensor out(value.dtype(), dims);
  for (std::int64_t i = 0; i < out.numel(); ++i) std::memcpy(bytes(out) + static_cast<std::size_t>(i) * es, bytes(value), es);
  return out;
}

inline std::vector<Tensor> constant_of_shape(const Node& n, const std::vector<Tensor>& in) {
  Ints dims = int_values(n, required_arg(n, in, 0), "shape");
  shared::checked_numel(n, dims);
  return {filled(n, shared::constant_of_shape_value(n), dims)};
}

inline std::vector<Tensor> constant(const Node& n, const std::vector<Tensor>&) {
  Tensor t = shared::constant_value(n);
  element_size(n, t.dtype());
  return {t};
}

inline std::vector<Tensor> range(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& start = required_arg(n, in, 0);
  const Tensor& limit = required_arg(n, in, 1);
  const Tensor& delta = required_arg(n, in, 2);
  DType t = start.dtype();
  if (limit.dtype() != t || delta.dtype() != t) throw n.error("start, limit and delta must have the same dtype");
  if (!shared::is_range_dtype(t)) throw n.error("Range does not support dtype " + std::string(dtype_name(t)));
  Tensor out;
  dispatch_dtype(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (start.numel() != 1 || limit.numel() != 1 || delta.numel() != 1)
      throw n.error("start, limit and delta must be scalars");
    T s = start.data<T>()[0], l = limit.data<T>()[0], d = delta.data<T>()[0];
    std::int64_t count = shared::range_count(n, static_cast<long double>(s), static_cast<long double>(l),
                                             static_cast<long double>(d));
    out = Tensor(t, {count});
    T* dst = out.data<T>();
    for (std::int64_t i = 0; i < count; ++i) {
      // Integers: computed modulo 2^64, exact because every value lies between start and limit.
      if constexpr (std::is_integral_v<T>)
        dst[i] = static_cast<T>(static_cast<std::uint64_t>(s) + static_cast<std::uint64_t>(i) * static_cast<std::uint64_t>(d));
      else dst[i] = from_double<T>(static_cast<double>(s) + static_cast<double>(i) * static_cast<double>(d));
    }
  });
  return {out};
}

// Tile as a strided view: output axis i of size r_i * d_i is split into (r_i, d_i) with stride 0 on r_i.
inline std::vector<Tensor> tile(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  Ints repeats = int_values(n, required_arg(n, in, 1), "repeats");
  if (repeats.size() != x.rank())
    throw n.error("repeats " + dims_str(repeats) + " must have one entry per dim of " + dims_str(x.dims()));
  Ints in_strides = strides_of(x.dims()), view_dims, view_strides, out_dims;
  for (std::size_t i = 0; i < x.rank(); ++i) {
    if (repeats[i] < 0) throw n.error("repeats " + dims_str(repeats) + " has a negative entry");
    view_dims.insert(view_dims.end(), {repeats[i], x.dims()[i]});
    view_strides.insert(view_strides.end(), {0, in_strides[i]});
    out_dims.push_back(shared::checked_mul(n, repeats[i], x.dims()[i]));
  }
  shared::checked_numel(n, out_dims);
  return {strided_copy(n, x, view_dims, 0, view_strides).reshaped(out_dims)};
}

inline std::vector<Tensor> trilu(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  std::size_t es = element_size(n, x.dtype());
  if (x.rank() < 2) throw n.error("Trilu needs a tensor of rank >= 2, got " + dims_str(x.dims()));
  std::int64_t k = 0;
  if (const Tensor* kt = optional_arg(in, 1)) k = shared::scalar_int_value(n, *kt, "k");
  bool upper = n.attr_int("upper", 1) != 0;
  Tensor out = x.clone();
  std::int64_t rows = x.dims()[x.rank() - 2], cols = x.dims()[x.rank() - 1];
  std::int64_t mats = rows * cols == 0 ? 0 : x.numel() / (rows * cols);
  std::uint8_t* p = bytes(out);
  for (std::int64_t m = 0; m < mats; ++m)
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) {
        // Keep j - i >= k (upper) or j - i <= k (lower); zero bytes are 0 / false in every dtype.
        bool keep = upper ? j - i >= k : j - i <= k;
        if (!keep) std::memset(p + static_cast<std::size_t>((m * rows + i) * cols + j) * es, 0, es);
      }
  return {out};
}

// DepthToSpace / SpaceToDepth as a 6-D reshape + transpose + reshape (ONNX's own definition).
inline std::vector<Tensor> space_depth(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  std::int64_t b = shared::block_size(n);
  std::string mode = shared::depth_to_space_mode(n);
  Ints out_dims = shared::space_depth_dims(n, x.dims(), b);
  std::int64_t N = x.dims()[0], C = x.dims()[1], H = x.dims()[2], W = x.dims()[3];
  Ints view, perm;
  if (n.op_type() == "SpaceToDepth") {
    view = {N, C, H / b, b, W / b, b};
    perm = {0, 3, 5, 1, 2, 4};
  } else if (mode == "DCR") {
    view = {N, b, b, C / (b * b), H, W};
    perm = {0, 3, 4, 1, 5, 2};
  } else {
    view = {N, C / (b * b), b, b, H, W};
    perm = {0, 1, 4, 2, 5, 3};
  }
  return {transpose(n, x.reshaped(view), perm).reshaped(out_dims)};
}

inline std::vector<Tensor> one_hot(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& indices = required_arg(n, in, 0);
  const Tensor& depth_t = required_arg(n, in, 1);
  const Tensor& values = required_arg(n, in, 2);
  std::size_t es = element_size(n, values.dtype());
  if (indices.dtype() == DType::String || indices.dtype() == DType::Bool) throw n.error("indices must be numeric");
  if (values.numel() != 2) throw n.error("values must hold [off_value, on_value], got shape " + dims_str(values.dims()));
  std::int64_t depth = shared::scalar_count_value(n, depth_t, "depth");
  auto out_rank = static_cast<std::int64_t>(indices.rank()) + 1;
  auto ax = static_cast<std::size_t>(infer::normalize_axis(n, n.attr_int("axis", -1), out_rank));
  Ints out_dims = indices.dims();
  out_dims.insert(out_dims.begin() + static_cast<std::ptrdiff_t>(ax), depth);
  shared::checked_numel(n, out_dims);
  Tensor out(values.dtype(), out_dims);
  const std::uint8_t* off_value = bytes(values);
  const std::uint8_t* on_value = bytes(values) + es;
  for (std::int64_t i = 0; i < out.numel(); ++i) std::memcpy(bytes(out) + static_cast<std::size_t>(i) * es, off_value, es);
  // Output index = (outer, class, inner) where outer/inner split the indices' dims at the axis.
  std::int64_t outer = product(indices.dims(), 0, ax), inner = product(indices.dims(), ax);
  Ints idx;
  if (is_integer(indices.dtype())) {
    idx = indices.to_int64s();
  } else {  // float indices truncate; non-finite or huge ones are simply out of range
    for (std::int64_t i = 0; i < indices.numel(); ++i) {
      double v = indices.at_double(static_cast<std::size_t>(i));
      idx.push_back(std::abs(v) < 9.0e15 ? static_cast<std::int64_t>(v) : std::numeric_limits<std::int64_t>::max());
    }
  }
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t j = 0; j < inner; ++j) {
      std::int64_t c = idx[static_cast<std::size_t>(o * inner + j)];
      if (c < 0) c += depth;
      if (c < 0 || c >= depth) continue;  // out of range: the row stays all off_value
      std::memcpy(bytes(out) + static_cast<std::size_t>((o * depth + c) * inner + j) * es, on_value, es);
    }
  return {out};
}

// ---- scatter ------------------------------------------------------------------------------------

enum class Reduction { None, Add, Mul, Max, Min };

inline Reduction reduction_of(const Node& n) {
  std::string r = n.attr_string("reduction", "none");
  if (r == "none") return Reduction::None;
  if (r == "add") return Reduction::Add;
  if (r == "mul") return Reduction::Mul;
  if (r == "max") return Reduction::Max;
  if (r == "min") return Reduction::Min;
  throw n.error("unknown reduction '" + r + "'");
}

// a (op) b in T; integers wrap (computed unsigned, so no undefined overflow), floats compute in double.
template <typename T>
T reduce(T a, T b, Reduction r) {
  switch (r) {
    case Reduction::None: return b;
    case Reduction::Max: return static_cast<double>(a) >= static_cast<double>(b) ? a : b;
    case Reduction::Min: return static_cast<double>(a) <= static_cast<double>(b) ? a : b;
    default: break;
  }
  bool add = r == Reduction::Add;
  if constexpr (std::is_same_v<T, bool>) {
    return add ? (a || b) : (a && b);
  } else if constexpr (std::is_integral_v<T>) {
    auto ua = static_cast<std::uint64_t>(a), ub = static_cast<std::uint64_t>(b);
    return static_cast<T>(add ? ua + ub : ua * ub);
  } else {
    double x = static_cast<double>(a), y = static_cast<double>(b);
    return from_double<T>(add ? x + y : x * y);
  }
}

// Writes element `src_index` of `updates` into element `dst_index` of `out`, combined by `r`.
inline void scatter_one(Tensor& out, std::int64_t dst_index, const Tensor& updates, std::int64_t src_index,
                        Reduction r, std::size_t es) {
  if (r == Reduction::None) {
    std::memcpy(bytes(out) + static_cast<std::size_t>(dst_index) * es,
                bytes(updates) + static_cast<std::size_t>(src_index) * es, es);
    return;
  }
  dispatch_dtype(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T& d = out.data<T>()[dst_index];
    d = reduce<T>(d, updates.data<T>()[src_index], r);
  });
}

inline std::vector<Tensor> scatter_elements(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& data = required_arg(n, in, 0);
  const Tensor& indices = required_arg(n, in, 1);
  const Tensor& updates = required_arg(n, in, 2);
  std::size_t es = element_size(n, data.dtype());
  shared::check_index_dtype(n, indices.dtype(), "indices");
  if (updates.dtype() != data.dtype()) throw n.error("updates must have the dtype of data");
  if (updates.dims() != indices.dims())
    throw n.error("updates " + dims_str(updates.dims()) + " must have the shape of indices " + dims_str(indices.dims()));
  auto rank = static_cast<std::int64_t>(data.rank());
  if (rank == 0) throw n.error("cannot scatter into a scalar");
  auto ax = static_cast<std::size_t>(infer::normalize_axis(n, n.attr_int("axis", 0), rank));
  check_element_indices(n, data, indices, ax);
  Reduction r = n.op_type() == "Scatter" ? Reduction::None : reduction_of(n);
  Tensor out = data.clone();
  Ints idx_values = indices.to_int64s(), strides = strides_of(data.dims());
  for_each_index(indices.dims(), [&](std::int64_t k, const Ints& idx) {
    std::int64_t off = element_offset(n, data.dims(), strides, ax, idx, idx_values[static_cast<std::size_t>(k)]);
    scatter_one(out, off, updates, k, r, es);
  });
  return {out};
}

inline std::vector<Tensor> scatter_nd(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& data = required_arg(n, in, 0);
  const Tensor& indices = required_arg(n, in, 1);
  const Tensor& updates = required_arg(n, in, 2);
  std::size_t es = element_size(n, data.dtype());
  shared::check_index_dtype(n, indices.dtype(), "indices");
  if (updates.dtype() != data.dtype()) throw n.error("updates must have the dtype of data");
  if (indices.rank() == 0) throw n.error("indices must have rank >= 1");
  auto k = static_cast<std::size_t>(indices.dims().back());
  if (k > data.rank())
    throw n.error("indices address " + std::to_string(k) + " dims but data " + dims_str(data.dims()) + " has rank " +
                  std::to_string(data.rank()));
  // updates must be indices.shape[:-1] + data.shape[k:]
  Ints expect(indices.dims().begin(), indices.dims().end() - 1);
  expect.insert(expect.end(), data.dims().begin() + static_cast<std::ptrdiff_t>(k), data.dims().end());
  if (updates.dims() != expect)
    throw n.error("updates have shape " + dims_str(updates.dims()) + ", expected " + dims_str(expect));
  Reduction r = reduction_of(n);
  Tensor out = data.clone();
  Ints idx = indices.to_int64s(), strides = strides_of(data.dims());
  std::int64_t block = product(data.dims(), k), tuples = product(indices.dims(), 0, indices.rank() - 1);
  for (std::int64_t t = 0; t < tuples; ++t) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < k; ++d) {
      std::int64_t v = idx[static_cast<std::size_t>(t) * k + d], dim = data.dims()[d];
      if (v < -dim || v >= dim)
        throw n.error("index " + std::to_string(v) + " is out of range for dim " + std::to_string(d) + " of size " +
                      std::to_string(dim));
      off += (v < 0 ? v + dim : v) * strides[d];
    }
    if (r == Reduction::None) {  // a whole slice: one copy
      if (block > 0)
        std::memcpy(bytes(out) + static_cast<std::size_t>(off) * es,
                    bytes(updates) + static_cast<std::size_t>(t * block) * es, static_cast<std::size_t>(block) * es);
      continue;
    }
    for (std::int64_t j = 0; j < block; ++j) scatter_one(out, off + j, updates, t * block + j, r, es);
  }
  return {out};
}

// x != 0 in x's own type where it has one (bool, float: -0 is zero, NaN is not), else through double.
template <typename T>
inline bool nonzero(T x) {
  if constexpr (std::is_arithmetic_v<T>) return x != T(0);
  else return static_cast<double>(x) != 0.0;
}

inline std::vector<Tensor> non_zero(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  element_size(n, x.dtype());
  // Two passes, counting then writing into the output: a detector's NonZero over 8M scores writes 64 MB of
  // positions, which a growing vector copied twice more.
  std::int64_t count = 0;
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = x.data<T>();
    for (std::int64_t i = 0; i < x.numel(); ++i) count += nonzero(p[i]);
  });
  const auto rank = static_cast<std::int64_t>(x.rank());
  Tensor out(DType::Int64, {rank, count});
  std::int64_t* dst = out.data<std::int64_t>();
  const Ints strides = strides_of(x.dims());
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = x.data<T>();
    std::int64_t j = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      if (!nonzero(p[i])) continue;
      if (rank == 1) {  // the flat position itself (no division per element)
        dst[j++] = i;
        continue;
      }
      std::int64_t rest = i;
      for (std::int64_t d = 0; d < rank; ++d) {
        dst[d * count + j] = rest / strides[static_cast<std::size_t>(d)];
        rest %= strides[static_cast<std::size_t>(d)];
      }
      ++j;
    }
  });
  return {out};
}

// EyeLike: zeros of the input's shape with ones on diagonal k (k > 0 above the main one, k < 0 below).
inline std::vector<Tensor> eye_like(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  element_size(n, x.dtype());
  if (x.rank() != 2) throw n.error("EyeLike needs a 2-D input, got " + dims_str(x.dims()));
  Tensor out(shared::eye_like_dtype(n, x.dtype()), x.dims());
  const std::int64_t rows = x.dims()[0], cols = x.dims()[1], k = n.attr_int("k", 0);
  dispatch_dtype(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = out.data<T>();
    for (std::int64_t i = std::max<std::int64_t>(0, -k); i < rows && i + k < cols; ++i)
      p[i * cols + i + k] = from_double<T>(1.0);
  });
  return {out};
}

// ReverseSequence: for batch entry b, the first sequence_lens[b] steps along the time axis reversed, the
// rest copied.
inline std::vector<Tensor> reverse_sequence(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  const Tensor& lens_t = required_arg(n, in, 1);
  const std::size_t es = element_size(n, x.dtype());
  if (x.rank() < 2) throw n.error("ReverseSequence needs a tensor of rank >= 2, got " + dims_str(x.dims()));
  if (lens_t.dtype() != DType::Int64) throw n.error("sequence_lens must be an int64 tensor");
  const std::size_t batch_axis = shared::reverse_sequence_axes(n).first, time_axis = 1 - batch_axis;
  const std::int64_t batch = x.dims()[batch_axis], steps = x.dims()[time_axis];
  if (lens_t.rank() != 1 || lens_t.dims()[0] != batch)
    throw n.error("sequence_lens " + dims_str(lens_t.dims()) + " does not match the batch size of input " +
                  dims_str(x.dims()));
  const Ints lens = lens_t.to_int64s();
  const auto row = static_cast<std::size_t>(product(x.dims(), 2)) * es;  // one (time, batch) slice
  Tensor out = x.clone();
  auto at = [&](std::int64_t t, std::int64_t b) {
    return static_cast<std::size_t>(time_axis == 0 ? t * batch + b : b * steps + t) * row;
  };
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t len = lens[static_cast<std::size_t>(b)];
    if (len < 0 || len > steps)
      throw n.error("sequence_lens[" + std::to_string(b) + "] = " + std::to_string(len) + " is outside [0, " +
                    std::to_string(steps) + "]");
    if (row != 0)  // an empty tensor has no data pointer
      for (std::int64_t t = 0; t < len; ++t) std::memcpy(bytes(out) + at(t, b), bytes(x) + at(len - 1 - t, b), row);
  }
  return {out};
}

inline std::vector<Tensor> cum_sum(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  const Tensor& axis_t = required_arg(n, in, 1);
  element_size(n, x.dtype());
  if (x.dtype() == DType::Bool) throw n.error("CumSum does not support bool");
  auto rank = static_cast<std::int64_t>(x.rank());
  if (rank == 0) throw n.error("CumSum needs a tensor of rank >= 1");
  auto ax = static_cast<std::size_t>(infer::normalize_axis(n, shared::scalar_int_value(n, axis_t, "axis"), rank));
  bool exclusive = n.attr_int("exclusive", 0) != 0, reverse = n.attr_int("reverse", 0) != 0;
  Tensor out(x.dtype(), x.dims());
  std::int64_t outer = product(x.dims(), 0, ax), len = x.dims()[ax], inner = product(x.dims(), ax + 1);
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* src = x.data<T>();
    T* dst = out.data<T>();
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t j = 0; j < inner; ++j) {
        // Floats accumulate in double; integers in uint64 (wrap-around, no undefined overflow).
        using Acc = std::conditional_t<std::is_integral_v<T>, std::uint64_t, double>;
        auto store = [](Acc a) {
          if constexpr (std::is_integral_v<T>) return static_cast<T>(a);
          else return from_double<T>(a);
        };
        Acc acc = 0;
        for (std::int64_t s = 0; s < len; ++s) {
          std::int64_t i = reverse ? len - 1 - s : s;
          auto at = static_cast<std::size_t>((o * len + i) * inner + j);
          auto v = static_cast<Acc>(src[at]);
          if (exclusive) dst[at] = store(acc);
          acc += v;
          if (!exclusive) dst[at] = store(acc);
        }
      }
  });
  return {out};
}



// GatherND: for every index tuple of `indices` (its last dim m), the slice data[batch.., tuple..].
inline std::vector<Tensor> gather_nd(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& data = required_arg(n, in, 0);
  const Tensor& indices = required_arg(n, in, 1);
  const std::size_t es = element_size(n, data.dtype());
  const auto b = static_cast<std::size_t>(n.attr_int("batch_dims", 0));
  const std::size_t r = data.rank(), q = indices.rank();
  if (r < 1 || q < 1 || b >= std::min(r, q)) throw n.error("bad ranks for GatherND: " + dims_str(data.dims()) + ", " + dims_str(indices.dims()));
  const auto m = static_cast<std::size_t>(indices.dims().back());
  if (m < 1 || m > r - b) throw n.error("indices' last dim " + std::to_string(m) + " does not fit data " + dims_str(data.dims()));
  for (std::size_t i = 0; i < b; ++i)
    if (data.dims()[i] != indices.dims()[i])
      throw n.error("batch dim " + std::to_string(i) + " differs: data " + dims_str(data.dims()) + ", indices " + dims_str(indices.dims()));
  Ints out_dims(indices.dims().begin(), indices.dims().end() - 1);
  out_dims.insert(out_dims.end(), data.dims().begin() + static_cast<std::ptrdiff_t>(b + m), data.dims().end());
  shared::checked_numel(n, out_dims);
  Tensor out(data.dtype(), out_dims);
  // int64 indices read in place (a detector's scores[mask] gathers 8M single elements).
  Ints converted;
  if (indices.dtype() != DType::Int64) converted = indices.to_int64s();
  const std::int64_t* idx = indices.dtype() == DType::Int64 ? indices.data<std::int64_t>() : converted.data();
  const std::int64_t batch = product(data.dims(), 0, b);
  const std::int64_t tuples_per_batch = product(indices.dims(), b, q - 1);
  const auto slice = static_cast<std::size_t>(product(data.dims(), b + m)) * es;
  const std::int64_t data_batch = product(data.dims(), b);
  Ints strides(m);
  for (std::size_t j = 0; j < m; ++j) strides[j] = product(data.dims(), b + j + 1);
  std::uint8_t* dst = bytes(out);
  for (std::int64_t bb = 0; bb < batch; ++bb)
    for (std::int64_t t = 0; t < tuples_per_batch; ++t) {
      const std::int64_t* tuple = idx + (bb * tuples_per_batch + t) * static_cast<std::int64_t>(m);
      std::int64_t offset = bb * data_batch;
      for (std::size_t j = 0; j < m; ++j) {
        std::int64_t dim = data.dims()[b + j], i = tuple[j];
        if (i < -dim || i >= dim)
          throw n.error("index " + std::to_string(i) + " is out of range for axis " + std::to_string(b + j) + " of size " + std::to_string(dim));
        offset += (i < 0 ? i + dim : i) * strides[j];
      }
      const std::uint8_t* src = bytes(data) + static_cast<std::size_t>(offset) * es;
      if (slice == 4) std::memcpy(dst, src, 4);  // one float or int32: a move, not a call
      else if (slice == 8) std::memcpy(dst, src, 8);
      else if (slice != 0) std::memcpy(dst, src, slice);  // empty: null dst
      dst += slice;
    }
  return {out};
}

// TopK: along `axis`, the k largest (or smallest) values and their indices; equal values keep the
// lower index first (a stable order, as ONNX Runtime gives).
inline std::vector<Tensor> top_k(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required_arg(n, in, 0);
  std::int64_t k = n.opset() != 0 && n.opset() < 10 ? n.attr_int("k") : [&] {
    const Tensor& kt = required_arg(n, in, 1);
    if (kt.numel() != 1) throw n.error("K must hold one value, got " + dims_str(kt.dims()));
    return kt.to_int64s()[0];
  }();
  if (x.rank() == 0) throw n.error("TopK needs a tensor of rank >= 1");
  const auto axis = static_cast<std::size_t>(infer::normalize_axis(n, n.attr_int("axis", -1), static_cast<std::int64_t>(x.rank())));
  const std::int64_t len = x.dims()[axis];
  if (k < 0 || k > len) throw n.error("k " + std::to_string(k) + " is outside [0, " + std::to_string(len) + "] for axis " + std::to_string(axis));
  const bool largest = n.attr_int("largest", 1) != 0;
  const std::int64_t outer = product(x.dims(), 0, axis), inner = product(x.dims(), axis + 1);
  Ints out_dims = x.dims();
  out_dims[axis] = k;
  Tensor values(x.dtype(), out_dims), indices(DType::Int64, out_dims);
  const std::size_t es = element_size(n, x.dtype());
  // The k first of a stable order: ties broken by the lower index, NaN above every number (as PyTorch's
  // topk), so that the order is strict and weak. A heap of the k best seen so far, its worst on top:
  // most candidates lose one comparison with it (a detector's TopK(1000) over 8M scores: 0.2 s as a
  // partial sort of an index array, 0.8 s as a full stable sort before that).
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<T, bool>) {
      const T* p = static_cast<const T*>(x.raw());
      std::vector<std::int64_t> heap;
      heap.reserve(static_cast<std::size_t>(k));
      for (std::int64_t o = 0; o < outer; ++o)
        for (std::int64_t i = 0; i < inner; ++i) {
          auto at = [&](std::int64_t j) { return (o * len + j) * inner + i; };
          auto above = [](double a, double c) { return std::isnan(a) ? !std::isnan(c) : !std::isnan(c) && a > c; };
          auto better = [&](std::int64_t a, std::int64_t c) {
            const double va = static_cast<double>(p[at(a)]), vc = static_cast<double>(p[at(c)]);
            if (above(va, vc)) return largest;
            if (above(vc, va)) return !largest;
            return a < c;
          };
          heap.clear();
          for (std::int64_t j = 0; j < len && k > 0; ++j) {
            if (static_cast<std::int64_t>(heap.size()) < k) {
              heap.push_back(j);
              std::push_heap(heap.begin(), heap.end(), better);
            } else if (better(j, heap.front())) {
              std::pop_heap(heap.begin(), heap.end(), better);
              heap.back() = j;
              std::push_heap(heap.begin(), heap.end(), better);
            }
          }
          std::sort_heap(heap.begin(), heap.end(), better);  // best first
          for (std::int64_t j = 0; j < k; ++j) {
            const std::int64_t dst = (o * k + j) * inner + i, src = at(heap[static_cast<std::size_t>(j)]);
            std::memcpy(bytes(values) + static_cast<std::size_t>(dst) * es, bytes(x) + static_cast<std::size_t>(src) * es, es);
            indices.data<std::int64_t>()[dst] = heap[static_cast<std::size_t>(j)];
          }
        }
    } else {
      throw n.error("TopK of bool is not defined");
    }
  });
  return {values, indices};
}

}  // namespace detail::tensor_ops

inline void register_tensor_ops_kernels(KernelTable& table) {
  namespace k = detail::tensor_ops;
  table["Concat"] = k::concat;
  table["Split"] = k::split;
  table["Slice"] = k::slice;
  table["Gather"] = k::gather;
  table["GatherND"] = k::gather_nd;
  table["TopK"] = k::top_k;
  table["GatherElements"] = k::gather_elements;
  table["Reshape"] = k::reshape;
  table["Flatten"] = k::flatten;
  table["Transpose"] = k::transpose_kernel;
  table["Squeeze"] = k::squeeze;
  table["Unsqueeze"] = k::unsqueeze;
  table["Shape"] = k::shape;
  table["Size"] = k::size;
  table["Identity"] = k::identity;
  table["Dropout"] = k::dropout;
  table["Expand"] = k::expand;
  table["ConstantOfShape"] = k::constant_of_shape;
  table["Constant"] = k::constant;
  table["Range"] = k::range;
  table["Tile"] = k::tile;
  table["Trilu"] = k::trilu;
  table["DepthToSpace"] = k::space_depth;
  table["SpaceToDepth"] = k::space_depth;
  table["OneHot"] = k::one_hot;
  table["ScatterElements"] = k::scatter_elements;
  table["Scatter"] = k::scatter_elements;
  table["ScatterND"] = k::scatter_nd;
  table["NonZero"] = k::non_zero;
  table["CumSum"] = k::cum_sum;
  table["EyeLike"] = k::eye_like;
  table["ReverseSequence"] = k::reverse_sequence;
}

}  // namespace ondine::reference
