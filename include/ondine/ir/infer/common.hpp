// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/common.hpp - helpers shared by the per-op shape and type inference functions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/graph.hpp"

namespace ondine {

// Shape and type inference for one op: reads the node's input values (dtype, shape, and constant data
// where known) and sets dtype and shape of its outputs. Throws node.error(...) on inconsistent input.
// A dim it cannot know becomes Dim() (unknown); a rank it cannot know becomes Shape::unknown().
using InferFn = std::function<void(Node&)>;
using InferTable = std::map<std::string, InferFn>;

namespace infer {

inline void set_output(Node& n, std::size_t i, DType t, Shape s) {
  if (Value* v = n.output(i)) {
    v->set_kind(ValueKind::Tensor);  // an op's outputs are tensors unless its rule says otherwise
    v->set_dtype(t);
    v->set_shape(std::move(s));
  }
}

// The input's value, or an error naming the node when a required input is missing.
inline Value& required_input(const Node& n, std::size_t i) {
  Value* v = n.input(i);
  if (!v) throw n.error("missing required input #" + std::to_string(i));
  return *v;
}

// Normalises a possibly negative axis against `rank`; throws naming the node when out of range.
inline std::int64_t normalize_axis(const Node& n, std::int64_t axis, std::int64_t rank) {
  if (axis < -rank || axis >= rank)
    throw n.error("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

// Numpy-style broadcast of two shapes. Symbolic dims broadcast with 1 and with an equal symbol;
// two different static sizes (neither 1) are an error.
inline Shape broadcast(const Node& n, const Shape& a, const Shape& b) {
  if (!a.rank_known() || !b.rank_known()) return Shape::unknown();
  std::size_t r = std::max(a.rank(), b.rank());
  std::vector<Dim> out(r);
  for (std::size_t i = 0; i < r; ++i) {
    const Dim* da = i < r - a.rank() ? nullptr : &a[i - (r - a.rank())];
    const Dim* db = i < r - b.rank() ? nullptr : &b[i - (r - b.rank())];
    if (!da) { out[i] = *db; continue; }
    if (!db) { out[i] = *da; continue; }
    if (da->is_static() && da->value == 1) out[i] = *db;
    else if (db->is_static() && db->value == 1) out[i] = *da;
    else if (da->is_static() && db->is_static()) {
      if (da->value != db->value)
        throw n.error("shapes " + a.str() + " and " + b.str() + " cannot be broadcast together");
      out[i] = *da;
    } else if (*da == *db) out[i] = *da;
    else if (da->is_static()) out[i] = *da;  // a symbol meeting a size: the size (or 1, checked at run time)
    else if (db->is_static()) out[i] = *db;
    else out[i] = Dim();
  }
  return Shape(out);
}

// The data of input i when it is known at compile time, else nullptr: a constant's, or the elements
// shape-value propagation found to be numbers (Value::known_data, ir/infer/values.hpp).
inline const Tensor* constant_input(const Node& n, std::size_t i) {
  Value* v = n.input(i);
  if (!v) return nullptr;
  return v->is_constant() ? &v->constant() : v->known_data();
}

// Shape values (ir/infer/values.hpp) are kept for tensors of at most this many elements.
inline constexpr std::int64_t kMaxShapeValueElements = 64;

// What is known of the elements of input i: a small constant's data (a non-integral float element is
// unknown), else the element dims shape-value propagation set on the value; nullopt when nothing is.
inline std::optional<std::vector<SymInt>> input_values(const Node& n, std::size_t i) {
  const Value* v = n.input(i);
  if (!v) return std::nullopt;
  if (!v->is_constant()) return v->element_dims();
  const Tensor& t = v->constant();
  if (t.numel() > kMaxShapeValueElements || t.dtype() == DType::String || t.empty()) return std::nullopt;
  std::vector<SymInt> out;
  if (is_integer(t.dtype()) || t.dtype() == DType::Bool) {
    for (auto x : t.to_int64s()) out.emplace_back(x);
    return out;
  }
  for (std::int64_t k = 0; k < t.numel(); ++k) {
    double d = t.at_double(static_cast<std::size_t>(k));
    if (d == std::floor(d) && std::abs(d) < 9.0e15) out.emplace_back(static_cast<std::int64_t>(d));
    else out.emplace_back();
  }
  return out;
}

}  // namespace infer
}  // namespace ondine
