// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/sequence.hpp - type and shape inference for the sequence and optional ops
// (reference/sequence.hpp has their kernels).
//
// A sequence value's dtype and shape describe its elements (ValueKind, ir/graph.hpp). Its element shape
// is what every element is known to share: dims that differ between the tensors put in become unknown,
// a rank that differs makes the shape unknown. SequenceEmpty's elements have no shape yet, so an empty
// sequence's shape is unknown and stays so after inserts (conservative, never wrong).
#pragma once

#include <cstdint>
#include <string>

#include "ondine/ir/infer/common.hpp"
#include "ondine/ir/infer/math.hpp"

namespace ondine::infer {
namespace detail_sequence {

// SequenceEmpty's element type: the `dtype` attribute, float32 without it.
inline DType empty_dtype(const Node& n) {
  return n.has_attr("dtype") ? detail_math::dtype_from_onnx_code(n, n.attr_int("dtype")) : DType::Float32;
}

// The shape that both `a` and `b` have (unknown dims where they differ).
inline Shape common_shape(const Shape& a, const Shape& b) {
  if (!a.rank_known() || !b.rank_known() || a.rank() != b.rank()) return Shape::unknown();
  std::vector<Dim> dims;
  for (std::size_t i = 0; i < a.rank(); ++i) dims.push_back(a[i] == b[i] ? a[i] : Dim());
  return Shape(std::move(dims));
}

inline void set_value(Node& n, std::size_t i, ValueKind kind, DType t, Shape s) {
  set_output(n, i, t, std::move(s));
  if (Value* v = n.output(i)) v->set_kind(kind);
}

inline const Value& sequence_input(const Node& n, std::size_t i) {
  const Value& v = required_input(n, i);
  if (!is_sequence_kind(v.kind())) throw n.error("input '" + v.name() + "' must be a sequence, got " + Graph::value_type_str(&v));
  return v;
}

inline void infer_sequence_empty(Node& n) { set_value(n, 0, ValueKind::Sequence, empty_dtype(n), Shape::unknown()); }

inline void infer_sequence_construct(Node& n) {
  const Value& first = required_input(n, 0);
  Shape s = first.shape();
  for (std::size_t i = 1; i < n.num_inputs(); ++i) {
    const Value& v = required_input(n, i);
    if (v.dtype() != first.dtype()) throw n.error("inputs of different element types");
    s = common_shape(s, v.shape());
  }
  set_value(n, 0, ValueKind::Sequence, first.dtype(), s);
}

inline void infer_sequence_insert(Node& n) {
  const Value& seq = sequence_input(n, 0);
  const Value& t = required_input(n, 1);
  if (seq.dtype() != DType::Undefined && t.dtype() != DType::Undefined && seq.dtype() != t.dtype())
    throw n.error("inserting a " + std::string(dtype_name(t.dtype())) + " tensor into a sequence of " +
                  std::string(dtype_name(seq.dtype())));
  set_value(n, 0, ValueKind::Sequence, seq.dtype(), common_shape(seq.shape(), t.shape()));
}

inline void infer_sequence_at(Node& n) {
  const Value& seq = sequence_input(n, 0);
  set_value(n, 0, ValueKind::Tensor, seq.dtype(), seq.shape());
}

inline void infer_sequence_erase(Node& n) {
  const Value& seq = sequence_input(n, 0);
  set_value(n, 0, ValueKind::Sequence, seq.dtype(), seq.shape());
}

inline void infer_sequence_length(Node& n) {
  sequence_input(n, 0);
  set_value(n, 0, ValueKind::Tensor, DType::Int64, Shape(std::vector<Dim>{}));
}

inline void infer_split_to_sequence(Node& n) {
  const Value& x = required_input(n, 0);
  Shape s = Shape::unknown();
  if (x.shape().rank_known()) {
    const auto rank = static_cast<std::int64_t>(x.shape().rank());
    if (rank == 0) throw n.error("cannot split a scalar");
    const auto axis = static_cast<std::size_t>(normalize_axis(n, n.attr_int("axis", 0), rank));
    std::vector<Dim> dims = x.shape().dims();
    const Tensor* split = n.input(1) ? constant_input(n, 1) : nullptr;
    if (!n.input(1)) {  // pieces of one
      if (n.attr_int("keepdims", 1) == 0) dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(axis));
      else dims[axis] = 1;
    } else if (split && split->rank() == 1 && split->numel() > 0) {  // sizes: known when all equal
      auto sizes = split->to_int64s();
      bool same = std::all_of(sizes.begin(), sizes.end(), [&](std::int64_t v) { return v == sizes[0]; });
      dims[axis] = same ? Dim(sizes[0]) : Dim();
    } else if (split && split->rank() == 0 && dims[axis].is_static() && split->at_int(0) > 0 &&
               dims[axis].value % split->at_int(0) == 0) {  // equal pieces
      dims[axis] = split->at_int(0);
    } else {
      dims[axis] = Dim();
    }
    s = Shape(std::move(dims));
  }
  set_value(n, 0, ValueKind::Sequence, x.dtype(), s);
}

inline void infer_concat_from_sequence(Node& n) {
  const Value& seq = sequence_input(n, 0);
  Shape s = Shape::unknown();
  if (seq.shape().rank_known()) {
    const bool new_axis = n.attr_int("new_axis", 0) != 0;
    const auto rank = static_cast<std::int64_t>(seq.shape().rank()) + (new_axis ? 1 : 0);
    const auto axis = static_cast<std::size_t>(normalize_axis(n, n.attr_int("axis"), rank));
    std::vector<Dim> dims = seq.shape().dims();
    if (new_axis) dims.insert(dims.begin() + static_cast<std::ptrdiff_t>(axis), Dim());
    else dims[axis] = Dim();  // the sum over a number of elements known only at run time
    s = Shape(std::move(dims));
  }
  set_value(n, 0, ValueKind::Tensor, seq.dtype(), s);
}

// Optional(x): an optional of x's kind; Optional() with no input: the type its `type` attribute gives
// (set on the output by onnx/import.hpp), else an optional tensor of unknown type.
inline void infer_optional(Node& n) {
  const Value* x = n.input(0);
  if (!x) {
    // The importer gives the output the type of the `type` attribute (a TypeProto): keep it.
    if (Value* out = n.output(0); out && !is_optional_kind(out->kind()))
      set_value(n, 0, ValueKind::OptionalTensor, DType::Undefined, Shape::unknown());
    return;
  }
  if (is_optional_kind(x->kind())) throw n.error("an optional of an optional");
  set_value(n, 0, x->kind() == ValueKind::Sequence ? ValueKind::OptionalSequence : ValueKind::OptionalTensor,
            x->dtype(), x->shape());
}

inline void infer_optional_has_element(Node& n) {
  set_value(n, 0, ValueKind::Tensor, DType::Bool, Shape(std::vector<Dim>{}));
}

// The value inside: opset 18 also takes a plain tensor or sequence (and returns it).
inline void infer_optional_get_element(Node& n) {
  const Value& x = required_input(n, 0);
  set_value(n, 0, is_sequence_kind(x.kind()) ? ValueKind::Sequence : ValueKind::Tensor, x.dtype(), x.shape());
}

}  // namespace detail_sequence

inline void register_sequence_infer(InferTable& t) {
  namespace d = detail_sequence;
  t["SequenceEmpty"] = d::infer_sequence_empty;
  t["SequenceConstruct"] = d::infer_sequence_construct;
  t["SequenceInsert"] = d::infer_sequence_insert;
  t["SequenceAt"] = d::infer_sequence_at;
  t["SequenceErase"] = d::infer_sequence_erase;
  t["SequenceLength"] = d::infer_sequence_length;
  t["SplitToSequence"] = d::infer_split_to_sequence;
  t["ConcatFromSequence"] = d::infer_concat_from_sequence;
  t["Optional"] = d::infer_optional;
  t["OptionalHasElement"] = d::infer_optional_has_element;
  t["OptionalGetElement"] = d::infer_optional_get_element;
}

}  // namespace ondine::infer
