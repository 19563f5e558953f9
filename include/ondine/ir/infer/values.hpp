// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/values.hpp - shape-value propagation: the elements of the small integer tensors that
// models compute from shapes, known at compile time as numbers or expressions over dim names.
//
// PyTorch and Paddle exports build shapes at run time: Shape(x) -> Gather -> Unsqueeze -> Concat ->
// Reshape, a causal mask from Range(0, Gather(Shape(x), 1)), pads from Mod/Sub on the image size. These
// functions run after a node's shape inference (infer_node in shape_inference.hpp) and set
// Value::element_dims on its output when the elements follow from what is known of the inputs:
//
//   Shape(x: [batch, seq, 64])          -> [batch, seq, 64]
//   Gather(that, 1)                     -> seq          (a scalar)
//   Concat(Unsqueeze(batch), [-1], [4]) -> [batch, -1, 4]
//   Mul(seq, 3), Div(H, 2), Mod(W, 8)   -> 3*seq, (H)/2, (W)%8
//
// The readers of shape-like inputs (Reshape, Expand, ConstantOfShape, Range, Tile, Slice, Split, Pad,
// Resize) then give static dims once the graph inputs are bound, and symbolic dims ("seq", "3*seq")
// while they are not. Only values with at most kMaxShapeValueElements elements carry element dims; a value
// whose elements are all numbers also offers them as Value::known_data().
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/infer/common.hpp"
#include "ondine/ir/infer/tensor_ops.hpp"

namespace ondine::infer {

namespace values {

using Elems = std::vector<SymInt>;
using detail_tensor_ops::resolve_slice_axis;
using detail_tensor_ops::shape_range;

// The output has a static shape of at most kMaxShapeValueElements elements (any rank: PyTorch's pads
// travel as [rank, 2]).
inline bool small_output(const Node& n, std::size_t i = 0) {
  const Value* v = n.output(i);
  if (!v) return false;
  auto k = v->shape().numel();
  return k && *k <= kMaxShapeValueElements;
}
inline bool rank_at_most_1(const Value* v) { return v && v->shape().rank_known() && v->shape().rank() <= 1; }

inline void set(Node& n, Elems e, std::size_t i = 0) {
  if (Value* v = n.output(i)) v->set_element_dims(std::move(e));
}

// Ops that only move elements (row-major order unchanged): the output holds the input's elements.
inline void same_elements(Node& n) {
  if (!small_output(n)) return;
  if (auto e = input_values(n, 0)) set(n, *e);
}

inline void shape(Node& n) {
  const Value* x = n.input(0);
  if (!x || !x->shape().rank_known() || !small_output(n)) return;
  auto [start, end] = shape_range(n, static_cast<std::int64_t>(x->shape().rank()));
  Elems e;
  for (std::int64_t d = start; d < end; ++d) e.push_back(SymInt::of(x->shape()[static_cast<std::size_t>(d)]));
  set(n, e);
}

inline void size(Node& n) {
  const Value* x = n.input(0);
  if (!x || !x->shape().rank_known()) return;
  SymInt p(1);
  for (auto& d : x->shape().dims()) p = sym_mul(p, SymInt::of(d));
  set(n, {p});
}

inline void cast(Node& n) {
  if (!small_output(n)) return;
  auto e = input_values(n, 0);
  const Value* out = n.output(0);
  if (!e || !out) return;
  if (out->dtype() == DType::Bool) {
    for (auto& x : *e) x = x.is_number() ? SymInt(*x.number != 0) : SymInt();
  } else if (!is_integer(out->dtype()) && out->dtype() != DType::Float32 && out->dtype() != DType::Float64) {
    return;
  }
  set(n, *e);
}

// Gather on a 1-D value with known indices (the "take dim k of Shape(x)" idiom).
inline void gather(Node& n) {
  auto data = input_values(n, 0);
  auto idx = input_values(n, 1);
  const Value* d = n.input(0);
  if (!data || !idx || !d || d->shape().rank() != 1 || !small_output(n)) return;
  auto len = static_cast<std::int64_t>(data->size());
  Elems e;
  for (auto& i : *idx) {
    if (!i.is_number()) return;
    std::int64_t k = *i.number < 0 ? *i.number + len : *i.number;
    if (k < 0 || k >= len) return;  // the kernel reports it
    e.push_back((*data)[static_cast<std::size_t>(k)]);
  }
  set(n, e);
}

inline void concat(Node& n) {
  if (!small_output(n) || !rank_at_most_1(n.output(0))) return;
  Elems e;
  for (std::size_t i = 0; i < n.num_inputs(); ++i) {
    auto part = input_values(n, i);
    if (!part) return;
    e.insert(e.end(), part->begin(), part->end());
  }
  set(n, e);
}

// Row-major strides of static dims.
inline std::vector<std::int64_t> strides_of(const std::vector<std::int64_t>& dims) {
  std::vector<std::int64_t> st(dims.size(), 1);
  for (std::size_t i = dims.size(); i-- > 1;) st[i - 1] = st[i] * dims[i];
  return st;
}

// Calls f(flat input index) for each output element of a gather along static per-axis index lists.
template <typename F>
inline void for_each_index(const std::vector<std::vector<std::int64_t>>& picks, const std::vector<std::int64_t>& strides,
                           F f) {
  std::vector<std::size_t> pos(picks.size(), 0);
  for (auto& p : picks)
    if (p.empty()) return;
  while (true) {
    std::int64_t flat = 0;
    for (std::size_t a = 0; a < picks.size(); ++a) flat += picks[a][pos[a]] * strides[a];
    f(flat);
    std::size_t a = picks.size();
    while (a-- > 0) {
      if (++pos[a] < picks[a].size()) break;
      pos[a] = 0;
    }
    if (a == static_cast<std::size_t>(-1)) return;
  }
}

// Slice of a small value with numeric parameters (PyTorch's pads: a [rank, 2] value reversed on axis 0).
inline void slice(Node& n) {
  auto data = input_values(n, 0);
  const Value* d = n.input(0);
  if (!data || !d || !d->shape().is_static() || !small_output(n)) return;
  const auto dims = d->shape().sizes();
  auto rank = static_cast<std::int64_t>(dims.size());
  if (rank == 0) return;
  auto numbers = [&](std::size_t i) -> std::optional<std::vector<std::int64_t>> {
    auto e = input_values(n, i);
    if (!e) return std::nullopt;
    std::vector<std::int64_t> out;
    for (auto& x : *e) {
      if (!x.is_number()) return std::nullopt;
      out.push_back(*x.number);
    }
    return out;
  };
  std::optional<std::vector<std::int64_t>> starts, ends, axes, steps;
  if (n.opset() > 0 && n.opset() < 10) {
    starts = n.attr_ints("starts");
    ends = n.attr_ints("ends");
    if (n.has_attr("axes")) axes = n.attr_ints("axes");
  } else {
    starts = numbers(1);
    ends = numbers(2);
    if (n.input(3) && !(axes = numbers(3))) return;
    if (n.input(4) && !(steps = numbers(4))) return;
  }
  if (!starts || !ends || starts->size() != ends->size()) return;
  if (!axes) {
    axes.emplace();
    for (std::size_t i = 0; i < starts->size(); ++i) axes->push_back(static_cast<std::int64_t>(i));
  }
  if (!steps) steps = std::vector<std::int64_t>(starts->size(), 1);
  if (axes->size() != starts->size() || steps->size() != starts->size()) return;
  std::vector<std::vector<std::int64_t>> picks(dims.size());
  for (std::size_t a = 0; a < dims.size(); ++a)
    for (std::int64_t k = 0; k < dims[a]; ++k) picks[a].push_back(k);
  for (std::size_t i = 0; i < axes->size(); ++i) {
    std::int64_t ax = (*axes)[i] < 0 ? (*axes)[i] + rank : (*axes)[i];
    if (ax < 0 || ax >= rank || (*steps)[i] == 0) return;
    auto axis = resolve_slice_axis(dims[static_cast<std::size_t>(ax)], (*starts)[i], (*ends)[i], (*steps)[i]);
    std::vector<std::int64_t> p;
    for (std::int64_t k = 0; k < axis.count; ++k) p.push_back(axis.start + k * axis.step);
    picks[static_cast<std::size_t>(ax)] = std::move(p);
  }
  Elems e;
  for_each_index(picks, strides_of(dims), [&](std::int64_t flat) { e.push_back((*data)[static_cast<std::size_t>(flat)]); });
  set(n, e);
}

// Transpose of a small value.
inline void transpose(Node& n) {
  auto data = input_values(n, 0);
  const Value* d = n.input(0);
  if (!data || !d || !d->shape().is_static() || !small_output(n)) return;
  const auto dims = d->shape().sizes();
  std::vector<std::int64_t> perm = n.attr_ints("perm", {});
  if (perm.empty())
    for (std::size_t i = dims.size(); i-- > 0;) perm.push_back(static_cast<std::int64_t>(i));
  if (perm.size() != dims.size()) return;
  auto in_strides = strides_of(dims);
  std::vector<std::vector<std::int64_t>> picks;
  std::vector<std::int64_t> strides;
  for (auto p : perm) {
    if (p < 0 || p >= static_cast<std::int64_t>(dims.size())) return;
    picks.emplace_back();
    for (std::int64_t k = 0; k < dims[static_cast<std::size_t>(p)]; ++k) picks.back().push_back(k);
    strides.push_back(in_strides[static_cast<std::size_t>(p)]);
  }
  Elems e;
  for_each_index(picks, strides, [&](std::int64_t flat) { e.push_back((*data)[static_cast<std::size_t>(flat)]); });
  set(n, e);
}

// Element-wise ops on small values: inputs of the output's shape, or of one element.
template <typename F>
inline void elementwise(Node& n, std::size_t arity, F f) {
  if (!small_output(n)) return;
  // Each input has all of the output's elements in the same order, or one that broadcasts.
  const auto len = static_cast<std::size_t>(*n.output(0)->shape().numel());
  std::vector<Elems> ins;
  for (std::size_t i = 0; i < arity; ++i) {
    auto e = input_values(n, i);
    if (!e || e->empty()) return;
    if (e->size() != 1 && (e->size() != len || n.input(i)->shape() != n.output(0)->shape())) return;
    ins.push_back(std::move(*e));
  }
  Elems out;
  for (std::size_t k = 0; k < len; ++k) {
    std::vector<const SymInt*> args;
    for (auto& e : ins) args.push_back(&e[e.size() == 1 ? 0 : k]);
    out.push_back(f(args));
  }
  set(n, out);
}

// An expression with only positive coefficients (a product and sum of sizes) is >= 0.
inline bool non_negative(const SymInt& s) {
  if (s.number) return *s.number >= 0;
  auto p = detail::dim_expr::of(s);
  if (!p) return false;
  for (auto& [m, c] : *p)
    if (c < 0) return false;
  return true;
}

inline void binary(Node& n) {
  const std::string& op = n.op_type();
  const Value* out = n.output(0);
  if (!out) return;
  const bool integral = is_integer(out->dtype());
  elementwise(n, 2, [&](const std::vector<const SymInt*>& a) -> SymInt {
    const SymInt &x = *a[0], &y = *a[1];
    if (op == "Add") return sym_add(x, y);
    if (op == "Sub") return sym_sub(x, y);
    if (op == "Mul") return sym_mul(x, y);
    if (op == "Div") {
      if (x.number && y.number) {
        if (*y.number == 0) return SymInt();
        if (integral) return *x.number / *y.number;  // C division truncates, as ONNX's integer Div
        return *x.number % *y.number == 0 ? SymInt(*x.number / *y.number) : SymInt();
      }
      // Symbolic: sizes divided by a positive number; floats only where the division is exact.
      SymInt q = sym_floor_div(x, y);
      if (!integral && !q.is_number() && q.expr.find('/') != std::string::npos) return SymInt();
      return q;
    }
    if (op == "Mod") {
      if (n.attr_int("fmod", 0) != 0) {
        if (x.number && y.number && *y.number != 0) return *x.number % *y.number;
        return non_negative(x) && y.number && *y.number > 0 ? sym_mod(x, y) : SymInt();
      }
      return sym_mod(x, y);
    }
    return SymInt();
  });
}

inline void min_max(Node& n) {
  const bool is_max = n.op_type() == "Max";
  elementwise(n, n.num_inputs(), [&](const std::vector<const SymInt*>& a) -> SymInt {
    SymInt r = *a[0];
    for (std::size_t i = 1; i < a.size(); ++i) {
      const SymInt& y = *a[i];
      if (r.number && y.number) r = is_max ? std::max(*r.number, *y.number) : std::min(*r.number, *y.number);
      else if (r == y && r.known()) continue;
      // A size against a number no larger than 0 (max(seq, 0), min(seq, -1))
      else if (y.number && *y.number <= 0 && non_negative(r)) r = is_max ? r : y;
      else if (r.number && *r.number <= 0 && non_negative(y)) r = is_max ? y : r;
      else return SymInt();
    }
    return r;
  });
}

inline void neg(Node& n) {
  elementwise(n, 1, [](const std::vector<const SymInt*>& a) { return sym_sub(SymInt(0), *a[0]); });
}

inline void equal(Node& n) {
  elementwise(n, 2, [](const std::vector<const SymInt*>& a) -> SymInt {
    const SymInt &x = *a[0], &y = *a[1];
    if (x.number && y.number) return SymInt(*x.number == *y.number);
    if (x.known() && x == y) return SymInt(1);
    // A size never equals a negative number (PyTorch's Where(Equal(shape, -1), ...) for Expand).
    if ((y.number && *y.number < 0 && non_negative(x)) || (x.number && *x.number < 0 && non_negative(y)))
      return SymInt(0);
    return SymInt();
  });
}

inline void where(Node& n) {
  elementwise(n, 3, [](const std::vector<const SymInt*>& a) -> SymInt {
    if (!a[0]->is_number()) return a[1]->known() && *a[1] == *a[2] ? *a[1] : SymInt();
    return *a[0]->number ? *a[1] : *a[2];
  });
}

// ConstantOfShape of a small static shape with an integral fill value.
inline void constant_of_shape(Node& n) {
  if (!small_output(n) || !n.output(0)->shape().is_static()) return;
  SymInt fill(0);
  if (n.has_attr("value")) {
    const Tensor& t = n.attr_tensor("value");
    if (t.numel() != 1) return;
    double d = t.at_double(0);
    if (d != std::floor(d) || std::abs(d) > 9.0e15) return;
    fill = static_cast<std::int64_t>(d);
  }
  set(n, Elems(static_cast<std::size_t>(*n.output(0)->shape().numel()), fill));
}

inline void range(Node& n) {
  if (!small_output(n) || !n.output(0)->shape().is_static()) return;
  auto s = input_values(n, 0), l = input_values(n, 1), d = input_values(n, 2);
  if (!s || !l || !d || s->size() != 1 || !(*s)[0].is_number() || !(*d)[0].is_number()) return;
  Elems e;
  std::int64_t v = *(*s)[0].number, step = *(*d)[0].number;
  for (std::int64_t k = 0; k < *n.output(0)->shape().numel(); ++k, v += step) e.emplace_back(v);
  set(n, e);
}

// ReduceProd / ReduceSum over all of a 1-D value (the element count of a shape).
inline void reduce(Node& n) {
  if (!small_output(n)) return;
  auto e = input_values(n, 0);
  const Value* x = n.input(0);
  if (!e || !x || x->shape().rank() != 1 || n.output(0)->shape().numel() != std::optional<std::int64_t>(1)) return;
  const bool prod = n.op_type() == "ReduceProd";
  SymInt r = prod ? SymInt(1) : SymInt(0);
  for (auto& v : *e) r = prod ? sym_mul(r, v) : sym_add(r, v);
  set(n, {r});
}

}  // namespace values

using ValueFn = void (*)(Node&);

// Element propagation per op, run after the op's shape inference.
inline const std::map<std::string, ValueFn>& value_table() {
  static const std::map<std::string, ValueFn> table = [] {
    std::map<std::string, ValueFn> t;
    t["Shape"] = values::shape;
    t["Size"] = values::size;
    t["Cast"] = values::cast;
    t["CastLike"] = values::cast;  // the output's dtype is all cast() reads of the node
    for (const char* op : {"Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Floor", "Ceil", "Round"})
      t[op] = values::same_elements;
    t["Gather"] = values::gather;
    t["Concat"] = values::concat;
    t["Slice"] = values::slice;
    t["Transpose"] = values::transpose;
    for (const char* op : {"Add", "Sub", "Mul", "Div", "Mod"}) t[op] = values::binary;
    t["Max"] = values::min_max;
    t["Min"] = values::min_max;
    t["Neg"] = values::neg;
    t["Equal"] = values::equal;
    t["Where"] = values::where;
    t["ConstantOfShape"] = values::constant_of_shape;
    t["Range"] = values::range;
    t["ReduceProd"] = values::reduce;
    t["ReduceSum"] = values::reduce;
    return t;
  }();
  return table;
}

// Sets the element dims of n's outputs where they follow from its inputs.
inline void propagate_values(Node& n) {
  if (!n.domain().empty()) return;
  auto it = value_table().find(n.op_type());
  if (it != value_table().end()) it->second(n);
}

}  // namespace ondine::infer
