// SPDX-License-Identifier: Apache-2.0
// ondine/reference/sequence.hpp - kernels of the sequence and optional ops: SequenceEmpty,
// SequenceConstruct, SequenceInsert, SequenceAt, SequenceErase, SequenceLength, SplitToSequence,
// ConcatFromSequence, Optional, OptionalHasElement and OptionalGetElement.
//
// Sequences and optionals travel as Tensors (Tensor::sequence, Tensor::none: ir/tensor.hpp), so these
// kernels have the ordinary Kernel signature. A sequence is immutable and its elements are shared, not
// copied: SequenceInsert builds a new list of the same element tensors (they are never written in place,
// since every kernel writes fresh outputs).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ondine/ir/infer/sequence.hpp"
#include "ondine/reference/common.hpp"

namespace ondine::reference {
namespace detail::sequence {

inline const Tensor& sequence_arg(const Node& n, const std::vector<Tensor>& in, std::size_t i) {
  if (i >= in.size() || !in[i].is_sequence()) throw n.error("input #" + std::to_string(i) + " must be a sequence");
  return in[i];
}

inline const Tensor& dense_arg(const Node& n, const std::vector<Tensor>& in, std::size_t i) {
  if (i >= in.size() || in[i].empty()) throw n.error("missing required input #" + std::to_string(i));
  if (in[i].kind() != Tensor::Kind::Dense) throw n.error("input #" + std::to_string(i) + " must be a tensor");
  return in[i];
}

// A position input (a scalar of int32 or int64) checked against [-size, size - 1], or [-size, size] when
// `may_be_end` (SequenceInsert can insert after the last element); returned non-negative.
inline std::int64_t position(const Node& n, const Tensor& p, std::int64_t size, bool may_be_end) {
  if (p.dtype() != DType::Int32 && p.dtype() != DType::Int64) throw n.error("position must be int32 or int64");
  if (p.numel() != 1) throw n.error("position must be a scalar, got shape " + dims_str(p.dims()));
  const std::int64_t pos = p.at_int(0), hi = may_be_end ? size : size - 1;
  if (pos < -size || pos > hi)
    throw n.error("position " + std::to_string(pos) + " is out of range for a sequence of " + std::to_string(size) +
                  " elements");
  return pos < 0 ? pos + size : pos;
}

inline std::vector<Tensor> sequence_empty(const Node& n, const std::vector<Tensor>&) {
  return {Tensor::sequence(infer::detail_sequence::empty_dtype(n), {})};
}

inline std::vector<Tensor> sequence_construct(const Node& n, const std::vector<Tensor>& in) {
  if (in.empty()) throw n.error("SequenceConstruct needs at least one input");
  std::vector<Tensor> items;
  for (std::size_t i = 0; i < in.size(); ++i) items.push_back(dense_arg(n, in, i));
  const DType elem = items[0].dtype();  // read before `items` is moved from
  for (const Tensor& t : items)
    if (t.dtype() != elem) throw n.error("inputs of different element types");
  return {Tensor::sequence(elem, std::move(items))};
}

inline std::vector<Tensor> sequence_insert(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& s = sequence_arg(n, in, 0);
  const Tensor& t = dense_arg(n, in, 1);
  if (t.dtype() != s.dtype())
    throw n.error("inserting a " + std::string(dtype_name(t.dtype())) + " tensor into a sequence of " +
                  std::string(dtype_name(s.dtype())));
  std::vector<Tensor> items = s.items();
  const auto size = static_cast<std::int64_t>(items.size());
  const std::int64_t at = in.size() > 2 && !in[2].empty() ? position(n, in[2], size, true) : size;
  items.insert(items.begin() + at, t);
  return {Tensor::sequence(s.dtype(), std::move(items))};
}

inline std::vector<Tensor> sequence_at(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& s = sequence_arg(n, in, 0);
  return {s.items()[static_cast<std::size_t>(
      position(n, dense_arg(n, in, 1), static_cast<std::int64_t>(s.items().size()), false))]};
}

inline std::vector<Tensor> sequence_erase(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& s = sequence_arg(n, in, 0);
  std::vector<Tensor> items = s.items();
  const auto size = static_cast<std::int64_t>(items.size());
  if (size == 0) throw n.error("erasing from an empty sequence");
  const std::int64_t at = in.size() > 1 && !in[1].empty() ? position(n, in[1], size, false) : size - 1;
  items.erase(items.begin() + at);
  return {Tensor::sequence(s.dtype(), std::move(items))};
}

inline std::vector<Tensor> sequence_length(const Node& n, const std::vector<Tensor>& in) {
  return {Tensor::scalar<std::int64_t>(static_cast<std::int64_t>(sequence_arg(n, in, 0).items().size()))};
}

// Bytes of x along `axis`: [outer, x.dims[axis], inner] with inner in bytes.
struct AxisView {
  std::int64_t outer = 1, len = 1, inner_bytes = 1;
};
inline AxisView axis_view(const std::vector<std::int64_t>& dims, std::size_t axis, DType t) {
  AxisView v;
  for (std::size_t i = 0; i < axis; ++i) v.outer *= dims[i];
  v.len = axis < dims.size() ? dims[axis] : 1;
  v.inner_bytes = static_cast<std::int64_t>(dtype_size(t));
  for (std::size_t i = axis + 1; i < dims.size(); ++i) v.inner_bytes *= dims[i];
  return v;
}

inline std::vector<Tensor> split_to_sequence(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = dense_arg(n, in, 0);
  if (x.rank() == 0) throw n.error("cannot split a scalar");
  const auto axis = static_cast<std::size_t>(normalize_axis(n, n.attr_int("axis", 0), static_cast<std::int64_t>(x.rank())));
  const std::int64_t len = x.dims()[axis];
  std::vector<std::int64_t> sizes;
  bool squeeze = false;
  if (in.size() < 2 || in[1].empty()) {  // pieces of one, the axis kept or dropped by keepdims
    sizes.assign(static_cast<std::size_t>(len), 1);
    squeeze = n.attr_int("keepdims", 1) == 0;
  } else if (in[1].rank() == 0) {  // pieces of `split`, the last one shorter when it does not divide
    const std::int64_t k = in[1].at_int(0);
    if (k <= 0) throw n.error("split must be positive, got " + std::to_string(k));
    for (std::int64_t at = 0; at < len; at += k) sizes.push_back(std::min(k, len - at));
  } else {
    sizes = in[1].to_int64s();
    std::int64_t total = 0;
    for (auto s : sizes) {
      if (s < 0) throw n.error("negative split size " + std::to_string(s));
      total += s;
    }
    if (total != len)
      throw n.error("split sizes " + dims_str(sizes) + " add up to " + std::to_string(total) + ", the axis has " +
                    std::to_string(len));
  }
  const AxisView v = axis_view(x.dims(), axis, x.dtype());
  const auto* src = static_cast<const unsigned char*>(x.raw());
  std::vector<Tensor> items;
  std::int64_t start = 0;
  for (std::int64_t size : sizes) {
    std::vector<std::int64_t> dims = x.dims();
    dims[axis] = size;
    Tensor piece(x.dtype(), dims);
    auto* dst = static_cast<unsigned char*>(piece.raw());
    const std::int64_t block = size * v.inner_bytes;
    for (std::int64_t o = 0; o < v.outer && block; ++o)
      std::memcpy(dst + o * block, src + (o * v.len + start) * v.inner_bytes, static_cast<std::size_t>(block));
    if (squeeze) dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(axis));
    items.push_back(piece.reshaped(dims));
    start += size;
  }
  return {Tensor::sequence(x.dtype(), std::move(items))};
}

inline std::vector<Tensor> concat_from_sequence(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& s = sequence_arg(n, in, 0);
  const std::vector<Tensor>& items = s.items();
  if (items.empty()) throw n.error("concatenating an empty sequence");
  const bool new_axis = n.attr_int("new_axis", 0) != 0;
  const auto rank = static_cast<std::int64_t>(items[0].rank());
  const auto axis = static_cast<std::size_t>(normalize_axis(n, n.attr_int("axis"), rank + (new_axis ? 1 : 0)));
  // With new_axis the elements are stacked: each gets a dim of 1 at `axis`, then they are concatenated.
  std::vector<std::vector<std::int64_t>> dims;
  for (const Tensor& t : items) {
    dims.push_back(t.dims());
    if (new_axis) dims.back().insert(dims.back().begin() + static_cast<std::ptrdiff_t>(axis), 1);
  }
  std::vector<std::int64_t> out_dims = dims[0];
  out_dims[axis] = 0;
  for (const auto& d : dims) {
    for (std::size_t i = 0; i < d.size(); ++i)
      if (i != axis && (d.size() != out_dims.size() || d[i] != out_dims[i]))
        throw n.error("elements of shapes " + dims_str(dims[0]) + " and " + dims_str(d) + " do not concatenate on axis " +
                      std::to_string(axis));
    out_dims[axis] += d[axis];
  }
  Tensor out(s.dtype(), out_dims);
  const AxisView ov = axis_view(out_dims, axis, s.dtype());
  auto* dst = static_cast<unsigned char*>(out.raw());
  std::int64_t start = 0;
  for (std::size_t k = 0; k < items.size(); ++k) {
    const std::int64_t len = dims[k][axis], block = len * ov.inner_bytes;
    const auto* src = static_cast<const unsigned char*>(items[k].raw());
    for (std::int64_t o = 0; o < ov.outer && block; ++o)
      std::memcpy(dst + (o * ov.len + start) * ov.inner_bytes, src + o * block, static_cast<std::size_t>(block));
    start += len;
  }
  return {out};
}

// Optional(x) is x itself (an optional holding a value is carried as the value); Optional() is none.
inline std::vector<Tensor> optional(const Node&, const std::vector<Tensor>& in) {
  return {in.empty() || in[0].empty() ? Tensor::none() : in[0]};
}

inline std::vector<Tensor> optional_has_element(const Node&, const std::vector<Tensor>& in) {
  return {Tensor::scalar<bool>(!in.empty() && !in[0].empty() && !in[0].is_none())};
}

inline std::vector<Tensor> optional_get_element(const Node& n, const std::vector<Tensor>& in) {
  if (in.empty() || in[0].empty() || in[0].is_none()) throw n.error("the optional input has no value");
  return {in[0]};
}

}  // namespace detail::sequence

inline void register_sequence_kernels(KernelTable& t) {
  namespace k = detail::sequence;
  t["SequenceEmpty"] = k::sequence_empty;
  t["SequenceConstruct"] = k::sequence_construct;
  t["SequenceInsert"] = k::sequence_insert;
  t["SequenceAt"] = k::sequence_at;
  t["SequenceErase"] = k::sequence_erase;
  t["SequenceLength"] = k::sequence_length;
  t["SplitToSequence"] = k::split_to_sequence;
  t["ConcatFromSequence"] = k::concat_from_sequence;
  t["Optional"] = k::optional;
  t["OptionalHasElement"] = k::optional_has_element;
  t["OptionalGetElement"] = k::optional_get_element;
}

}  // namespace ondine::reference
