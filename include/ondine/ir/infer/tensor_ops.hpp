// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/tensor_ops.hpp - shape and type inference for the data-movement and shape ops.
//
// Concat, Split, Slice, Gather, GatherElements, Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Shape,
// Size, Identity, Dropout, Expand, ConstantOfShape, Constant, Range, Tile, Trilu, DepthToSpace,
// SpaceToDepth, OneHot, ScatterElements (and the deprecated Scatter), ScatterND, NonZero, CumSum,
// EyeLike, ReverseSequence.
//
// Inputs that carry parameters (Reshape's shape, Slice's starts/ends, Squeeze's axes, ...) are read when
// they are constants; otherwise the result is as precise as the rest allows (a known rank with unknown
// dims, or an unknown shape). Symbolic dims pass through wherever the op only moves them.
//
// The helpers in detail_tensor_ops that resolve parameters on concrete numbers (slice bounds, reshape
// targets, split sizes, ...) are shared with the reference kernels, so compile time and run time apply
// exactly the same rules and report the same errors.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ondine/ir/dropout.hpp"
#include "ondine/ir/infer/common.hpp"
#include "ondine/ir/infer/math.hpp"

namespace ondine::infer {
namespace detail_tensor_ops {

using Ints = std::vector<std::int64_t>;

// The opset a node follows; nodes built without a model (opset 0) follow the newest rules.
inline int opset_of(const Node& n) { return n.opset() > 0 ? n.opset() : 18; }

inline std::string ints_str(const Ints& v) { return dims_str(v); }

// These ops move elements without looking at them, so they take any dtype with a fixed element size.
inline void check_data_dtype(const Node& n, DType t) {
  if (t == DType::String) throw n.error("string tensors are not supported");
}

// Parameter inputs (shapes, axes, indices, repeats) must hold integers.
inline void check_index_dtype(const Node& n, DType t, const char* what) {
  if (t != DType::Undefined && !is_integer(t))
    throw n.error(std::string(what) + " must be an integer tensor, got " + std::string(dtype_name(t)));
}

// a * b for sizes (>= 0); an error instead of a signed overflow when the product does not fit.
inline std::int64_t checked_mul(const Node& n, std::int64_t a, std::int64_t b) {
  if (a != 0 && b > std::numeric_limits<std::int64_t>::max() / a)
    throw n.error("tensor size " + std::to_string(a) + " * " + std::to_string(b) + " is too large");
  return a * b;
}
// The element count of `dims`, checked: no negative dims, and small enough that the byte size of
// any dtype (up to 8 bytes) still fits in 64 bits.
inline std::int64_t checked_numel(const Node& n, const Ints& dims) {
  std::int64_t p = 1;
  for (auto d : dims) {
    if (d < 0) throw n.error("negative dim in shape " + dims_str(dims));
    p = checked_mul(n, p, d);
  }
  if (p > (std::int64_t(1) << 59)) throw n.error("a tensor of shape " + dims_str(dims) + " is too large");
  return p;
}
// A scalar integer parameter (k, axis): read exactly, never through a double.
inline std::int64_t scalar_int_value(const Node& n, const Tensor& t, const char* what) {
  check_index_dtype(n, t.dtype(), what);
  if (t.numel() != 1) throw n.error(std::string(what) + " must be a scalar, got shape " + dims_str(t.dims()));
  return t.to_int64s()[0];
}
// A count given as a number of any type (OneHot's depth): finite and >= 0; floats truncate.
inline std::int64_t scalar_count_value(const Node& n, const Tensor& t, const char* what) {
  if (t.numel() != 1) throw n.error(std::string(what) + " must be a scalar, got shape " + dims_str(t.dims()));
  if (is_integer(t.dtype())) {
    std::int64_t v = t.to_int64s()[0];
    if (v < 0) throw n.error(std::string(what) + " must not be negative, got " + std::to_string(v));
    return v;
  }
  double v = t.at_double(0);
  if (!(v >= 0 && v < 9.0e15)) throw n.error(std::string(what) + " must be a non-negative count, got " + std::to_string(v));
  return static_cast<std::int64_t>(v);
}

// The values of a parameter given either by input `input` (newer opsets) or by attribute `attr`
// (older opsets, or nodes created by passes). `given` says whether it is there at all; `values` is
// empty when it comes from an input whose data is unknown. `input_value` is the input's data when
// known (a constant at compile time, the run-time tensor in a kernel).
struct IntParam {
  bool given = false;
  std::optional<Ints> values;
};
inline IntParam int_param(const Node& n, std::size_t input, const Tensor* input_value, const std::string& attr,
                          const char* what) {
  IntParam p;
  if (Value* v = n.input(input)) {
    p.given = true;
    check_index_dtype(n, v->dtype(), what);
    if (input_value) {
      check_index_dtype(n, input_value->dtype(), what);
      if (input_value->rank() > 1)
        throw n.error(std::string(what) + " must be a 1-D tensor, got shape " + dims_str(input_value->dims()));
      p.values = input_value->to_int64s();
    }
  } else if (!attr.empty() && n.has_attr(attr)) {
    p.given = true;
    p.values = n.attr_ints(attr);
  }
  return p;
}

// The length of a 1-D parameter input when its shape is known statically (e.g. a shape tensor computed
// at run time whose length is fixed).
inline std::optional<std::int64_t> static_length(const Node& n, std::size_t input) {
  Value* v = n.input(input);
  if (!v || !v->shape().rank_known()) return std::nullopt;
  if (v->shape().rank() == 0) return 1;
  if (v->shape().rank() == 1 && v->shape()[0].is_static()) return v->shape()[0].value;
  return std::nullopt;
}

// The product of dims: static when all are static (or one is 0), the symbol itself when it is the only
// non-static factor and the rest multiply to 1, unknown otherwise.
inline Dim dim_product(const Node& n, const std::vector<Dim>& dims) {
  std::int64_t p = 1;
  const Dim* symbolic = nullptr;
  int non_static = 0;
  for (auto& d : dims) {
    if (d.is_static()) {
      if (d.value == 0) return Dim(0);
      p = checked_mul(n, p, d.value);
    } else {
      ++non_static;
      symbolic = &d;
    }
  }
  if (non_static == 0) return Dim(p);
  if (non_static == 1 && p == 1 && !symbolic->symbol.empty()) return *symbolic;
  return Dim();
}

// Two dims that must be equal: keeps the more precise one; differing static sizes are an error.
inline Dim merge_equal_dims(const Node& n, const Dim& a, const Dim& b, const std::string& what) {
  if (a.is_static() && b.is_static()) {
    if (a.value != b.value) throw n.error(what);
    return a;
  }
  if (a.is_static()) return a;
  if (b.is_static()) return b;
  if (a == b) return a;
  return a.symbol.empty() ? b : (b.symbol.empty() ? a : Dim());
}

// ---- Slice ------------------------------------------------------------------------------------

// One axis of a slice after clamping: the first element read, the step and the number of elements.
struct SliceAxis {
  std::int64_t start = 0, step = 1, count = 0;
};

// Clamps start/end of one axis of size `dim` exactly as the ONNX spec (Slice-13) says: negatives get
// `dim` added; then start is clamped to [0, dim] for positive steps and [0, dim-1] for negative steps,
// end to [0, dim] for positive steps and [-1, dim-1] for negative steps.
inline SliceAxis resolve_slice_axis(std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step) {
  SliceAxis a;
  a.step = step;
  if (dim == 0) return a;  // nothing to take (and the clamp ranges below would be empty)
  if (start < 0) start += dim;  // no overflow: dim >= 0 and start < 0
  if (end < 0) end += dim;
  if (step > 0) {
    start = std::clamp<std::int64_t>(start, 0, dim);
    end = std::clamp<std::int64_t>(end, 0, dim);
    a.count = end > start ? 1 + (end - start - 1) / step : 0;
  } else {
    start = std::clamp<std::int64_t>(start, 0, dim - 1);
    end = std::clamp<std::int64_t>(end, -1, dim - 1);
    // -INT64_MIN overflows; such a step takes exactly one element of any non-empty range.
    if (start > end) a.count = step == std::numeric_limits<std::int64_t>::min() ? 1 : 1 + (start - end - 1) / -step;
  }
  a.start = a.count > 0 ? start : 0;
  return a;
}

// The parameters of a Slice node: starts, ends, axes (normalised, unique, defaulted) and steps
// (defaulted), each nullopt when given by an input whose value is unknown. Old opsets (< 10) take them
// from attributes. The caller handles axes given by an input of unknown value (see infer_slice).
struct SliceParams {
  std::optional<Ints> starts, ends, axes, steps;
};
inline bool slice_uses_attributes(const Node& n) { return opset_of(n) < 10 || (!n.input(1) && n.has_attr("starts")); }
inline SliceParams slice_params(const Node& n, std::int64_t rank, const Tensor* starts_v, const Tensor* ends_v,
                                const Tensor* axes_v, const Tensor* steps_v) {
  SliceParams p;
  bool steps_unknown = false;
  if (slice_uses_attributes(n)) {
    p.starts = n.attr_ints("starts");
    p.ends = n.attr_ints("ends");
    if (n.has_attr("axes")) p.axes = n.attr_ints("axes");
  } else {
    IntParam s = int_param(n, 1, starts_v, "", "starts");
    IntParam e = int_param(n, 2, ends_v, "", "ends");
    if (!s.given) throw n.error("missing required input 'starts'");
    if (!e.given) throw n.error("missing required input 'ends'");
    p.starts = s.values;
    p.ends = e.values;
    IntParam a = int_param(n, 3, axes_v, "", "axes");
    if (a.given && !a.values) throw n.error("internal: slice axes of unknown value");
    p.axes = a.values;
    IntParam st = int_param(n, 4, steps_v, "", "steps");
    if (st.given) {
      // Steps of unknown value: the axes are still checked and normalised below (they index dims).
      if (!st.values) steps_unknown = true;
      p.steps = st.values;
    }
  }
  if (p.starts && p.ends && p.starts->size() != p.ends->size())
    throw n.error("starts has " + std::to_string(p.starts->size()) + " values but ends has " +
                  std::to_string(p.ends->size()));
  const Ints* known = p.starts ? &*p.starts : (p.ends ? &*p.ends : nullptr);
  if (!p.axes && known) {
    p.axes = Ints(known->size());
    for (std::size_t i = 0; i < p.axes->size(); ++i) (*p.axes)[i] = static_cast<std::int64_t>(i);
  }
  if (p.axes) {
    if (known && p.axes->size() != known->size())
      throw n.error("axes has " + std::to_string(p.axes->size()) + " values but starts has " +
                    std::to_string(known->size()));
    std::vector<bool> seen(static_cast<std::size_t>(rank), false);
    for (auto& a : *p.axes) {
      a = normalize_axis(n, a, rank);
      if (seen[static_cast<std::size_t>(a)]) throw n.error("axis " + std::to_string(a) + " appears twice in axes");
      seen[static_cast<std::size_t>(a)] = true;
    }
    if (!p.steps && !steps_unknown) p.steps = Ints(p.axes->size(), 1);
  }
  if (p.steps) {
    if (p.axes && p.steps->size() != p.axes->size())
      throw n.error("steps has " + std::to_string(p.steps->size()) + " values, expected " +
                    std::to_string(p.axes->size()));
    for (auto s : *p.steps)
      if (s == 0) throw n.error("slice step cannot be 0");
  }
  return p;
}

// ---- Reshape ----------------------------------------------------------------------------------

// The output shape of Reshape(input, shape): 0 copies the input dim (unless allowzero), -1 is inferred
// from the element count. Works on symbolic input shapes: symbols that appear on both sides cancel, so
// [batch,197,768] -> [0,-1,64] gives [batch,2364,64]. Throws on two -1s, a 0 past the input rank,
// allowzero with both 0 and -1, and element counts that cannot match.
inline Shape reshape_output(const Node& n, const Shape& in, const Ints& shape, bool allowzero) {
  std::vector<Dim> out;
  out.reserve(shape.size());
  std::int64_t infer_at = -1;
  bool has_zero = false;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    std::int64_t v = shape[i];
    if (v == -1) {
      if (infer_at >= 0) throw n.error("the target shape " + ints_str(shape) + " has more than one -1");
      infer_at = static_cast<std::int64_t>(i);
      out.emplace_back();
    } else if (v == 0 && !allowzero) {
      if (!in.rank_known()) {
        out.emplace_back();
      } else {
        if (i >= in.rank())
          throw n.error("the target shape " + ints_str(shape) + " copies dim " + std::to_string(i) +
                        " (0) but the input " + in.str() + " has rank " + std::to_string(in.rank()));
        out.push_back(in[i]);
      }
    } else if (v < -1) {
      throw n.error("the target shape " + ints_str(shape) + " has an invalid dim " + std::to_string(v));
    } else {
      has_zero |= v == 0;
      out.emplace_back(v);
    }
  }
  if (allowzero && has_zero && infer_at >= 0)
    throw n.error("the target shape " + ints_str(shape) + " has both 0 and -1 with allowzero=1");
  if (!in.rank_known()) return Shape(out);

  // Factor both sides into a static product and a multiset of symbols.
  auto factor = [&n](const std::vector<Dim>& dims, std::int64_t skip, std::int64_t& prod,
                   std::multiset<std::string>& syms) {
    bool unknown = false;
    for (std::size_t i = 0; i < dims.size(); ++i) {
      if (static_cast<std::int64_t>(i) == skip) continue;
      const Dim& d = dims[i];
      if (d.is_static()) prod = checked_mul(n, prod, d.value);
      else if (!d.symbol.empty()) syms.insert(d.symbol);
      else unknown = true;
    }
    return unknown;
  };
  std::int64_t in_prod = 1, out_prod = 1;
  std::multiset<std::string> in_syms, out_syms;
  bool in_unknown = factor(in.dims(), -1, in_prod, in_syms);
  bool out_unknown = factor(out, infer_at, out_prod, out_syms);
  auto mismatch = [&] {
    return n.error("cannot reshape " + in.str() + " to " + ints_str(shape) + " (" + Shape(out).str() +
                   "): the element counts differ");
  };
  if (in_unknown || out_unknown) return Shape(out);
  bool syms_equal = in_syms == out_syms;
  if (infer_at < 0) {
    if (syms_equal && in_prod != out_prod) throw mismatch();
    return Shape(out);
  }
  // out_syms must be a sub-multiset of in_syms for the remaining factor to be expressible.
  std::multiset<std::string> rest = in_syms;
  for (auto& s : out_syms) {
    auto it = rest.find(s);
    if (it == rest.end()) return Shape(out);
    rest.erase(it);
  }
  auto& inferred = out[static_cast<std::size_t>(infer_at)];
  if (out_prod == 0) {
    if (in_prod == 0 && rest.empty())
      throw n.error("cannot infer the -1 in " + ints_str(shape) + ": the other dims multiply to 0");
    return Shape(out);  // depends on symbol values
  }
  if (rest.empty()) {
    if (in_prod % out_prod != 0) throw mismatch();
    inferred = Dim(in_prod / out_prod);
  } else if (rest.size() == 1 && in_prod == out_prod) {
    inferred = Dim::named(*rest.begin());
  }
  return Shape(out);
}

// The same with a target known symbolically (ir/infer/values.hpp): [batch, -1, 64], [0, 3*seq]. A -1 is
// the input's element count divided by the others' where that division is exact, else unknown.
inline Shape reshape_output_symbolic(const Node& n, const Shape& in, const std::vector<SymInt>& target,
                                     bool allowzero) {
  std::vector<Dim> out;
  std::int64_t infer_at = -1;
  for (std::size_t i = 0; i < target.size(); ++i) {
    const SymInt& t = target[i];
    if (t.is_number() && *t.number == -1) {
      if (infer_at >= 0) throw n.error("the target shape has more than one -1");
      infer_at = static_cast<std::int64_t>(i);
      out.emplace_back();
    } else if (t.is_number() && *t.number == 0 && !allowzero) {
      out.push_back(in.rank_known() && i < in.rank() ? in[i] : Dim());
    } else {
      out.push_back(t.as_dim());
    }
  }
  if (infer_at < 0 || !in.rank_known()) return Shape(out);
  SymInt total(1), rest(1);
  for (auto& d : in.dims()) total = sym_mul(total, SymInt::of(d));
  for (std::size_t i = 0; i < out.size(); ++i)
    if (static_cast<std::int64_t>(i) != infer_at) rest = sym_mul(rest, SymInt::of(out[i]));
  auto pt = detail::dim_expr::of(total), pr = detail::dim_expr::of(rest);
  if (pt && pr && !pr->empty())
    if (auto q = detail::dim_expr::divide_exact(*pt, *pr)) out[static_cast<std::size_t>(infer_at)] = detail::dim_expr::to_sym(*q).as_dim();
  return Shape(out);
}

// Dims from known elements (a shape given as a computed value): negative or unknown ones are unknown.
inline std::vector<Dim> dims_of(const std::vector<SymInt>& elems) {
  std::vector<Dim> out;
  for (auto& e : elems) out.push_back(e.as_dim());
  return out;
}

// ---- Split ------------------------------------------------------------------------------------

// The sizes of the parts of a Split along a dim of size `dim` (static), given explicit sizes (nullopt
// for an equal split). Opset 18's num_outputs allows a smaller last part; earlier opsets require the
// dim to divide evenly.
inline Ints split_sizes(const Node& n, std::int64_t dim, const std::optional<Ints>& sizes, std::size_t parts) {
  if (sizes) {
    if (sizes->size() != parts)
      throw n.error("split gives " + std::to_string(sizes->size()) + " sizes for " + std::to_string(parts) +
                    " outputs");
    std::int64_t sum = 0;
    for (auto s : *sizes) {
      if (s < 0 || s > dim)
        throw n.error("split sizes " + ints_str(*sizes) + " do not fit an axis of " + std::to_string(dim));
      sum += s;  // <= 2 * dim: no overflow
      if (sum > dim) break;
    }
    if (sum != dim)
      throw n.error("split sizes " + ints_str(*sizes) + " add up to " + std::to_string(sum) + ", the axis has " +
                    std::to_string(dim));
    return *sizes;
  }
  if (parts == 0) throw n.error("split has no outputs");
  auto p = static_cast<std::int64_t>(parts);
  if (n.has_attr("num_outputs")) {
    std::int64_t chunk = (dim + p - 1) / p;
    Ints out(parts, chunk);
    out.back() = dim - chunk * (p - 1);
    if (out.back() < 0)
      throw n.error("cannot split an axis of " + std::to_string(dim) + " into " + std::to_string(p) + " parts");
    return out;
  }
  if (dim % p != 0)
    throw n.error("cannot split an axis of " + std::to_string(dim) + " into " + std::to_string(p) + " equal parts");
  return Ints(parts, dim / p);
}

// The explicit split sizes of a Split node: input 1 (opset 13+, and opset 1), else the `split`
// attribute. Also checks num_outputs (opset 18) against the node's outputs.
inline IntParam split_param(const Node& n, const Tensor* split_value) {
  if (n.has_attr("num_outputs")) {
    std::int64_t k = n.attr_int("num_outputs");
    if (k < 1 || static_cast<std::size_t>(k) != n.num_outputs())
      throw n.error("num_outputs is " + std::to_string(k) + " but the node has " + std::to_string(n.num_outputs()) +
                    " outputs");
    if (n.input(1)) throw n.error("num_outputs and the split input cannot both be given");
  }
  return int_param(n, 1, split_value, "split", "split");
}

// ---- Squeeze / Unsqueeze / Transpose / Shape --------------------------------------------------

// Normalised axes for Unsqueeze against the output rank; duplicates are an error. Sorted.
inline Ints unsqueeze_axes(const Node& n, Ints axes, std::int64_t out_rank) {
  for (auto& a : axes) a = normalize_axis(n, a, out_rank);
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
    throw n.error("unsqueeze axes contain a duplicate");
  return axes;
}

// Normalised, sorted, unique axes for Squeeze against the input rank.
inline Ints squeeze_axes(const Node& n, Ints axes, std::int64_t rank) {
  for (auto& a : axes) a = normalize_axis(n, a, rank);
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) throw n.error("squeeze axes contain a duplicate");
  return axes;
}

// Transpose's permutation (default: reverse the dims); must be a permutation of [0, rank).
inline Ints transpose_perm(const Node& n, std::int64_t rank) {
  Ints perm;
  if (n.has_attr("perm")) {
    perm = n.attr_ints("perm");
  } else {
    for (std::int64_t i = rank - 1; i >= 0; --i) perm.push_back(i);
  }
  if (static_cast<std::int64_t>(perm.size()) != rank)
    throw n.error("perm " + ints_str(perm) + " has " + std::to_string(perm.size()) + " entries for rank " +
                  std::to_string(rank));
  std::vector<bool> seen(static_cast<std::size_t>(rank), false);
  for (auto p : perm) {
    if (p < 0 || p >= rank || seen[static_cast<std::size_t>(p)])
      throw n.error("perm " + ints_str(perm) + " is not a permutation of the " + std::to_string(rank) + " dims");
    seen[static_cast<std::size_t>(p)] = true;
  }
  return perm;
}

// The [start, end) range of dims that Shape returns (opset 15 attributes), clamped to [0, rank].
inline std::pair<std::int64_t, std::int64_t> shape_range(const Node& n, std::int64_t rank) {
  std::int64_t start = n.attr_int("start", 0), end = n.attr_int("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<std::int64_t>(start, 0, rank);
  end = std::clamp<std::int64_t>(end, 0, rank);
  return {start, std::max(start, end)};
}

// ---- Range ------------------------------------------------------------------------------------

// Number of elements of Range(start, limit, delta): max(ceil((limit - start) / delta), 0).
inline std::int64_t range_count(const Node& n, long double start, long double limit, long double delta) {
  if (delta == 0) throw n.error("Range delta cannot be 0");
  if (!std::isfinite(static_cast<double>(start)) || !std::isfinite(static_cast<double>(limit)) ||
      !std::isfinite(static_cast<double>(delta)))
    throw n.error("Range start, limit and delta must be finite");
  long double c = std::ceil((limit - start) / delta);
  if (c <= 0) return 0;
  if (c > static_cast<long double>(std::numeric_limits<std::int32_t>::max()))
    throw n.error("Range would produce " + std::to_string(static_cast<double>(c)) + " elements");
  return static_cast<std::int64_t>(c);
}

inline bool is_range_dtype(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Int16 || t == DType::Int32 ||
         t == DType::Int64;
}

// ---- Constant -------------------------------------------------------------------------------

// The tensor a Constant node produces, from whichever value attribute it has.
inline Tensor constant_value(const Node& n) {
  if (n.has_attr("value")) return n.attr_tensor("value");
  if (n.has_attr("value_float")) return Tensor::scalar<float>(n.attr_float("value_float"));
  if (n.has_attr("value_int")) return Tensor::scalar<std::int64_t>(n.attr_int("value_int"));
  if (n.has_attr("value_floats")) {
    auto v = n.attr_floats("value_floats");
    return Tensor::from_vector<float>({static_cast<std::int64_t>(v.size())}, v);
  }
  if (n.has_attr("value_ints")) {
    auto v = n.attr_ints("value_ints");
    return Tensor::from_vector<std::int64_t>({static_cast<std::int64_t>(v.size())}, v);
  }
  if (n.has_attr("value_string") || n.has_attr("value_strings")) throw n.error("string constants are not supported");
  if (n.has_attr("sparse_value")) throw n.error("sparse constants are not supported");
  throw n.error("Constant has no value attribute");
}

// ConstantOfShape's fill value: the one-element `value` tensor, default float32 0.
inline Tensor constant_of_shape_value(const Node& n) {
  if (!n.has_attr("value")) return Tensor::scalar<float>(0.0f);
  const Tensor& v = n.attr_tensor("value");
  if (v.numel() != 1) throw n.error("value must hold exactly one element, it has " + std::to_string(v.numel()));
  check_data_dtype(n, v.dtype());
  return v;
}

// ---- inference functions ----------------------------------------------------------------------

inline void infer_identity(Node& n) {
  Value& x = required_input(n, 0);
  check_data_dtype(n, x.dtype());
  set_output(n, 0, x.dtype(), x.shape());
  if (Value* y = n.output(0)) y->set_kind(x.kind());  // Identity also passes sequences and optionals through
}

inline void infer_concat(Node& n) {
  if (n.num_inputs() == 0) throw n.error("Concat needs at least one input");
  std::int64_t axis = opset_of(n) < 4 ? n.attr_int("axis", 1) : n.attr_int("axis");
  DType dtype = DType::Undefined;
  const Shape* first = nullptr;
  for (std::size_t i = 0; i < n.num_inputs(); ++i) {
    Value& v = required_input(n, i);
    check_data_dtype(n, v.dtype());
    if (v.dtype() != DType::Undefined) {
      if (dtype != DType::Undefined && v.dtype() != dtype)
        throw n.error("inputs have different dtypes: " + std::string(dtype_name(dtype)) + " and " +
                      std::string(dtype_name(v.dtype())));
      dtype = v.dtype();
    }
    if (!first && v.shape().rank_known()) first = &v.shape();
  }
  if (!first) {
    set_output(n, 0, dtype, Shape::unknown());
    return;
  }
  auto rank = static_cast<std::int64_t>(first->rank());
  if (rank == 0) throw n.error("cannot concatenate scalars");
  axis = normalize_axis(n, axis, rank);
  std::vector<Dim> out = first->dims();
  std::int64_t axis_sum = 0;
  bool axis_static = true;
  for (std::size_t i = 0; i < n.num_inputs(); ++i) {
    const Shape& s = n.input(i)->shape();
    if (!s.rank_known()) {
      axis_static = false;
      continue;
    }
    if (static_cast<std::int64_t>(s.rank()) != rank)
      throw n.error("input " + std::to_string(i) + " has shape " + s.str() + " but the inputs before it have rank " +
                    std::to_string(rank));
    for (std::int64_t d = 0; d < rank; ++d) {
      auto du = static_cast<std::size_t>(d);
      if (d == axis) {
        if (!s[du].is_static()) axis_static = false;
        else if (s[du].value > std::numeric_limits<std::int64_t>::max() - axis_sum) throw n.error("output is too large");
        else axis_sum += s[du].value;
        continue;
      }
      out[du] = merge_equal_dims(n, out[du], s[du],
                                 "input shapes " + first->str() + " and " + s.str() + " differ in dim " +
                                     std::to_string(d) + ", not only in the concatenation axis " +
                                     std::to_string(axis));
    }
  }
  out[static_cast<std::size_t>(axis)] = axis_static ? Dim(axis_sum) : Dim();
  // Symbolic parts add up as expressions ("past + seq": a KV cache's present), so the readers of the
  // result see one dim they can compare with others.
  if (!axis_static) {
    Dim sum(0);
    for (Value* v : n.inputs()) {
      if (!v->shape().rank_known()) {
        sum = Dim();
        break;
      }
      sum = dim_add(sum, v->shape()[static_cast<std::size_t>(axis)]);
    }
    out[static_cast<std::size_t>(axis)] = sum;
  }
  set_output(n, 0, dtype, Shape(out));
}

inline void infer_split(Node& n) {
  Value& x = required_input(n, 0);
  check_data_dtype(n, x.dtype());
  IntParam sizes = split_param(n, constant_input(n, 1));
  const Shape& s = x.shape();
  if (!s.rank_known()) {
    for (std::size_t i = 0; i < n.num_outputs(); ++i) set_output(n, i, x.dtype(), Shape::unknown());
    return;
  }
  std::int64_t axis = normalize_axis(n, n.attr_int("axis", 0), static_cast<std::int64_t>(s.rank()));
  const Dim& dim = s[static_cast<std::size_t>(axis)];
  std::vector<Dim> parts(n.num_outputs());
  if (sizes.given && !sizes.values) {
    // sizes computed from shapes: each part takes its size as a dim; else each is unknown
    auto elems = input_values(n, 1);
    if (elems && elems->size() == parts.size())
      for (std::size_t i = 0; i < parts.size(); ++i) parts[i] = (*elems)[i].as_dim();
  } else if (dim.is_static()) {
    Ints p = split_sizes(n, dim.value, sizes.values, n.num_outputs());
    for (std::size_t i = 0; i < parts.size(); ++i) parts[i] = p[i];
  } else if (sizes.values) {
    if (sizes.values->size() != n.num_outputs())
      throw n.error("split gives " + std::to_string(sizes.values->size()) + " sizes for " +
                    std::to_string(n.num_outputs()) + " outputs");
    for (std::size_t i = 0; i < parts.size(); ++i) parts[i] = (*sizes.values)[i];
  } else if (parts.size() == 1) {
    parts[0] = dim;
  }
  for (std::size_t i = 0; i < n.num_outputs(); ++i) {
    Shape o = s;
    o[static_cast<std::size_t>(axis)] = parts[i];
    set_output(n, i, x.dtype(), o);
  }
}

// An end at least this large means "to the end of the axis" (exporters write INT64_MAX or INT32_MAX).
inline constexpr std::int64_t kLargeSliceEnd = std::numeric_limits<std::int32_t>::max();

inline void infer_slice(Node& n) {
  Value& x = required_input(n, 0);
  check_data_dtype(n, x.dtype());
  const Shape& s = x.shape();
  if (!s.rank_known()) {
    set_output(n, 0, x.dtype(), Shape::unknown());
    return;
  }
  auto rank = static_cast<std::int64_t>(s.rank());
  Shape out = s;
  if (!slice_uses_attributes(n) && n.input(3) && !constant_input(n, 3)) {
    for (auto& d : out.dims()) d = Dim();  // axes unknown: any dim may change
    set_output(n, 0, x.dtype(), out);
    return;
  }
  SliceParams p = slice_params(n, rank, constant_input(n, 1), constant_input(n, 2), constant_input(n, 3),
                               constant_input(n, 4));
  if (p.axes && p.steps && (!p.starts || !p.ends)) {
    // Bounds computed from shapes (ir/infer/values.hpp), e.g. pos_table[:seq]: with step 1 and a start
    // >= 0, the count is end - start, a symbolic end taken to lie within the axis (x[:, :seq] as
    // exporters write it); a number end past the axis or negative counts from the axis' size.
    auto sv = input_values(n, 1), ev = input_values(n, 2);
    bool usable = sv && ev && sv->size() == p.axes->size() && ev->size() == p.axes->size();
    for (std::size_t i = 0; i < p.axes->size(); ++i) {
      auto a = static_cast<std::size_t>((*p.axes)[i]);
      out[a] = Dim();
      if (!usable || (*p.steps)[i] != 1) continue;
      SymInt start = (*sv)[i], end = (*ev)[i], dim = SymInt::of(s[a]);
      if (!start.is_number() || *start.number < 0) continue;
      if (end.is_number() && *end.number >= kLargeSliceEnd) end = dim;
      else if (end.is_number() && *end.number < 0) end = sym_add(dim, end);
      if (end.is_number() && dim.is_number()) end = std::min(*end.number, *dim.number);
      out[a] = sym_sub(end, start).as_dim();
    }
    set_output(n, 0, x.dtype(), out);
    return;
  }
  if (!p.axes) {
    // starts and ends unknown, axes defaulted: the first len(starts) dims may change.
    std::optional<std::int64_t> len = static_length(n, 1);
    for (std::int64_t d = 0; d < rank; ++d)
      if (!len || d < *len) out[static_cast<std::size_t>(d)] = Dim();
    set_output(n, 0, x.dtype(), out);
    return;
  }
  constexpr std::int64_t kLarge = kLargeSliceEnd;
  for (std::size_t i = 0; i < p.axes->size(); ++i) {
    auto a = static_cast<std::size_t>((*p.axes)[i]);
    const Dim& d = s[a];
    if (!p.starts || !p.ends || !p.steps) {
      out[a] = Dim();
      continue;
    }
    std::int64_t start = (*p.starts)[i], end = (*p.ends)[i], step = (*p.steps)[i];
    if (d.is_static()) out[a] = resolve_slice_axis(d.value, start, end, step).count;
    else if (step == 1 && start == 0 && end >= kLarge) out[a] = d;     // the whole axis
    else if (step == -1 && start == -1 && end <= -kLarge) out[a] = d;  // the whole axis, reversed
    else out[a] = Dim();
  }
  set_output(n, 0, x.dtype(), out);
}

inline void infer_gather(Node& n) {
  Value& data = required_input(n, 0);
  Value& indices = required_input(n, 1);
  check_data_dtype(n, data.dtype());
  check_index_dtype(n, indices.dtype(), "indices");
  if (!data.shape().rank_known() || !indices.shape().rank_known()) {
    set_output(n, 0, data.dtype(), Shape::unknown());
    return;
  }
  auto rank = static_cast<std::int64_t>(data.shape().rank());
  if (rank == 0) throw n.error("cannot gather from a scalar");
  std::int64_t axis = normalize_axis(n, n.attr_int("axis", 0), rank);
  const Dim& axis_dim = data.shape()[static_cast<std::size_t>(axis)];
  if (const Tensor* idx = constant_input(n, 1); idx && axis_dim.is_static()) {
    for (auto i : idx->to_int64s())
      if (i < -axis_dim.value || i >= axis_dim.value)
        throw n.error("index " + std::to_string(i) + " is out of range for axis " + std::to_string(axis) +
                      " of size " + std::to_string(axis_dim.value));
  }
  std::vector<Dim> out(data.shape().dims().begin(), data.shape().dims().begin() + axis);
  out.insert(out.end(), indices.shape().dims().begin(), indices.shape().dims().end());
  out.insert(out.end(), data.shape().dims().begin() + axis + 1, data.shape().dims().end());
  set_output(n, 0, data.dtype(), Shape(out));
}

inline void infer_gather_elements(Node& n) {
  Value& data = required_input(n, 0);
  Value& indices = required_input(n, 1);
  check_data_dtype(n, data.dtype());
  check_index_dtype(n, indices.dtype(), "indices");
  if (data.shape().rank_known()) {
    auto rank = static_cast<std::int64_t>(data.shape().rank());
    if (rank == 0) throw n.error("cannot gather from a scalar");
    normalize_axis(n, n.attr_int("axis", 0), rank);
    if (indices.shape().rank_known() && indices.shape().rank() != data.shape().rank())
      throw n.error("indices " + indices.shape().str() + " must have the rank of data " + data.shape().str());
  }
  set_output(n, 0, data.dtype(), indices.shape());
}

inline void infer_reshape(Node& n) {
  Value& x = required_input(n, 0);
  check_data_dtype(n, x.dtype());
  bool allowzero = n.attr_int("allowzero", 0) != 0;
  IntParam shape = int_param(n, 1, constant_input(n, 1), opset_of(n) < 5 ? "shape" : "", "shape");
  if (!shape.given) throw n.error("missing the target shape");
  if (!shape.values) {
    if (auto elems = input_values(n, 1)) {
      set_output(n, 0, x.dtype(), reshape_output_symbolic(n, x.shape(), *elems, allowzero));
      return;
    }
    std::optional<std::int64_t> len = static_length(n, 1);
    set_output(n, 0, x.dtype(), len ? Shape(std::vector<Dim>(static_cast<std::size_t>(*len))) : Shape::unknown());
    return;
  }
  set_output(n, 0, x.dtype(), reshape_output(n, x.shape(), *shape.values, allowzero));
}

inline void infer_flatten(Node& n) {
  Value& x = required_input(n, 0);
  check_data_dtype(n, x.dtype());
  const Shape& s = x.shape();
  std::int64_t axis = n.attr_int("axis", 1);
  if (!s.rank_known()) {
    set_output(n, 0, x.dtype(), Shape{Dim(), Dim()});
    return;
  }
  auto rank = static_cast<std::int64_t>(s.rank());
  if (axis < -rank || axis > rank)
    throw n.error("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  if (axis < 0) axis += rank;
  std::vector<Dim> outer(s.dims().begin(), s.dims().begin() + axis), inner(s.dims().begin() + axis, s.dims().end());
  set_output(n, 0, x.dtype(), Shape{dim_product(n, outer), dim_product(n, inner)});
}

inline void infer_transpose(Node& n) {
  Value& x = required_input(n, 0);
  check_data_dtype(n, x.dtype());
  const Shape& s = x.shape();
  if (!s.rank_known()) {
    if (n.has_attr("perm")) {
      set_output(n, 0, x.dtype(), Shape(std::vector<Dim>(n.attr_ints("perm").size())));
    } else {
      set_output(n, 0, x.dtype(), Shape::unknown());
    }
    return;
  }
  Ints perm = transpose_perm(n, static_cast<std::int64_t>(s.rank()));
  std::vector<Dim> out;
  for (auto p : perm) out.push_back(s[static_cast<std::size_t>(p)]);
  set_output(n, 0, x.dtype(), Shape(out));
}

inline void infer_squeeze(Node& n) {
  Value& x = required_input(n, 0);
  check_data_dtype(n, x.dtype());
  IntParam axes = int_param(n, 1, constant_input(n, 1), "axes", "axes");
  const Shape& s = x.shape();
  if (!s.rank_known()) {
    set_output(n, 0, x.dtype(), Shape::unknown());
    return;
  }
  auto rank = static_cast<std::int64_t>(s.rank());
  if (axes.given && !axes.values) {
    std::optional<std::int64_t> len = static_length(n, 1);
    set_output(n, 0, x.dtype(),
               len && *len <= rank ? Shape(std::vector<Dim>(static_cast<std::size_t>(rank - *len))) : Shape::unknown());
    return;
  }
  std::vector<Dim> out;
  if (axes.given) {
    Ints a = squeeze_axes(n, *axes.values, rank);
    for (std::int64_t d = 0; d < rank; ++d) {
      const Dim& dim = s[static_cast<std::size_t>(d)];
      if (std::binary_search(a.begin(), a.end(), d)) {
        if (dim.is_static() && dim.value != 1)
          throw n.error("cannot squeeze axis " + std::to_string(d) + " of " + s.str() + ": its size is not 1");
      } else {
        out.push_back(dim);
      }
    }
  } else {
    // Without axes every dim of size 1 goes; a non-static dim might be 1, so the rank is unknown.
    for (auto& d : s.dims()) {
      if (!d.is_static()) {
        set_output(n, 0, x.dtype(), Shape::unknown());
        return;
      }
      if (d.value != 1) out.push_back(d);
    }
  }
  set_output(n, 0, x.dtype(), Shape(out));
}

inline void infer_unsqueeze(Node& n) {
  Value& x = required_input(n, 0);
  check_data_dtype(n, x.dtype());
  IntParam axes = int_param(n, 1, constant_input(n, 1), "axes", "axes");
  if (!axes.given) throw n.error("missing axes");
  const Shape& s = x.shape();
  if (!s.rank_known()) {
    set_output(n, 0, x.dtype(), Shape::unknown());
    return;
  }
  auto rank = static_cast<std::int64_t>(s.rank());
  if (!axes.values) {
    std::optional<std::int64_t> len = static_length(n, 1);
    set_output(n, 0, x.dtype(), len ? Shape(std::vector<Dim>(static_cast<std::size_t>(rank + *len))) : Shape::unknown());
    return;
  }
  auto out_rank = rank + static_cast<std::int64_t>(axes.values->size());
  Ints a = unsqueeze_axes(n, *axes.values, out_rank);
  std::vector<Dim> out;
  std::size_t next = 0;
  for (std::int64_t d = 0; d < out_rank; ++d) {
    if (std::binary_search(a.begin(), a.end(), d)) out.emplace_back(1);
    else out.push_back(s[next++]);
  }
  set_output(n, 0, x.dtype(), Shape(out));
}

inline void infer_shape(Node& n) {
  Value& x = required_input(n, 0);
  if (!x.shape().rank_known()) {
    set_output(n, 0, DType::Int64, Shape{Dim()});
    return;
  }
  auto [start, end] = shape_range(n, static_cast<std::int64_t>(x.shape().rank()));
  set_output(n, 0, DType::Int64, Shape{end - start});
}

inline void infer_size(Node& n) {
  required_input(n, 0);
  set_output(n, 0, DType::Int64, Shape{});
}

inline void infer_dropout(Node& n) {
  Value& x = required_input(n, 0);
  check_data_dtype(n, x.dtype());
  if (opset_of(n) >= 12) {
    if (const Tensor* t = constant_input(n, 2)) {
      if (t->numel() != 1) throw n.error("training_mode must be a scalar");
      if (t->at_double(0) != 0 && !dropout_is_identity(n))
        throw n.error("training_mode is true with a ratio that is not a constant 0: Ondine runs inference only "
                      "(export the model in eval mode)");
    }
    if (const Tensor* r = constant_input(n, 1); r && r->numel() != 1) throw n.error("ratio must be a scalar");
  }
  set_output(n, 0, x.dtype(), x.shape());
  // The mask is bool from opset 10, the input's type before.
  if (n.num_outputs() > 1) set_output(n, 1, opset_of(n) >= 10 ? DType::Bool : x.dtype(), x.shape());
}

inline void infer_expand(Node& n) {
  Value& x = required_input(n, 0);
  check_data_dtype(n, x.dtype());
  IntParam shape = int_param(n, 1, constant_input(n, 1), "", "shape");
  if (!shape.given) throw n.error("missing required input 'shape'");
  if (shape.values) {
    checked_numel(n, *shape.values);
    set_output(n, 0, x.dtype(), broadcast(n, x.shape(), Shape::from(*shape.values)));
    return;
  }
  if (auto elems = input_values(n, 1)) {
    set_output(n, 0, x.dtype(), broadcast(n, x.shape(), Shape(dims_of(*elems))));
    return;
  }
  std::optional<std::int64_t> len = static_length(n, 1);
  if (!len || !x.shape().rank_known()) {
    set_output(n, 0, x.dtype(), Shape::unknown());
    return;
  }
  // Unknown target: a static input dim other than 1 survives the broadcast; everything else is unknown.
  std::size_t r = std::max(x.shape().rank(), static_cast<std::size_t>(*len));
  std::vector<Dim> out(r);
  std::size_t off = r - x.shape().rank();
  for (std::size_t i = 0; i < x.shape().rank(); ++i)
    if (x.shape()[i].is_static() && x.shape()[i].value != 1) out[i + off] = x.shape()[i];
  set_output(n, 0, x.dtype(), Shape(out));
}

inline void infer_constant_of_shape(Node& n) {
  Tensor value = constant_of_shape_value(n);
  IntParam shape = int_param(n, 0, constant_input(n, 0), "", "shape");
  if (!shape.given) throw n.error("missing required input 'shape'");
  if (shape.values) {
    checked_numel(n, *shape.values);
    set_output(n, 0, value.dtype(), Shape::from(*shape.values));
    return;
  }
  if (auto elems = input_values(n, 0)) {
    set_output(n, 0, value.dtype(), Shape(dims_of(*elems)));
    return;
  }
  std::optional<std::int64_t> len = static_length(n, 0);
  set_output(n, 0, value.dtype(), len ? Shape(std::vector<Dim>(static_cast<std::size_t>(*len))) : Shape::unknown());
}

inline void infer_constant(Node& n) {
  Tensor t = constant_value(n);
  check_data_dtype(n, t.dtype());
  set_output(n, 0, t.dtype(), t.shape());
}

inline void infer_range(Node& n) {
  Value& start = required_input(n, 0);
  Value& limit = required_input(n, 1);
  Value& delta = required_input(n, 2);
  DType t = start.dtype();
  for (Value* v : {&limit, &delta})
    if (t != DType::Undefined && v->dtype() != DType::Undefined && v->dtype() != t)
      throw n.error("start, limit and delta must have the same dtype");
  if (t != DType::Undefined && !is_range_dtype(t))
    throw n.error("Range does not support dtype " + std::string(dtype_name(t)));
  const Tensor *s = constant_input(n, 0), *l = constant_input(n, 1), *d = constant_input(n, 2);
  if (s && l && d) {
    for (const Tensor* v : {s, l, d})
      if (v->numel() != 1) throw n.error("start, limit and delta must be scalars");
    set_output(n, 0, t, Shape{range_count(n, s->at_double(0), l->at_double(0), d->at_double(0))});
    return;
  }
  // Bounds known symbolically (Range(0, seq, 1)): ceil((limit - start) / delta) for a positive delta.
  auto sv = input_values(n, 0), lv = input_values(n, 1), dv = input_values(n, 2);
  if (sv && lv && dv && sv->size() == 1 && lv->size() == 1 && dv->size() == 1 && (*dv)[0].is_number() &&
      *(*dv)[0].number > 0) {
    SymInt step = (*dv)[0];
    SymInt count = sym_floor_div(sym_add(sym_sub((*lv)[0], (*sv)[0]), sym_sub(step, SymInt(1))), step);
    set_output(n, 0, t, Shape{count.as_dim()});
    return;
  }
  set_output(n, 0, t, Shape{Dim()});
}

inline void infer_tile(Node& n) {
  Value& x = required_input(n, 0);
  check_data_dtype(n, x.dtype());
  IntParam repeats = int_param(n, 1, constant_input(n, 1), "", "repeats");
  if (!repeats.given) throw n.error("missing required input 'repeats'");
  const Shape& s = x.shape();
  if (!s.rank_known()) {
    set_output(n, 0, x.dtype(), Shape::unknown());
    return;
  }
  Shape out = s;
  auto rep_elems = repeats.values ? std::nullopt : input_values(n, 1);
  if (rep_elems && rep_elems->size() == s.rank()) {
    for (std::size_t i = 0; i < s.rank(); ++i) out[i] = sym_mul(SymInt::of(s[i]), (*rep_elems)[i]).as_dim();
  } else if (!repeats.values) {
    for (auto& d : out.dims()) d = Dim();
  } else {
    if (repeats.values->size() != s.rank())
      throw n.error("repeats " + ints_str(*repeats.values) + " must have one entry per dim of " + s.str());
    for (std::size_t i = 0; i < s.rank(); ++i) {
      std::int64_t r = (*repeats.values)[i];
      if (r < 0) throw n.error("repeats " + ints_str(*repeats.values) + " has a negative entry");
      if (s[i].is_static()) out[i] = checked_mul(n, s[i].value, r);
      else if (r == 0) out[i] = 0;
      else if (r != 1) out[i] = Dim();
    }
  }
  set_output(n, 0, x.dtype(), out);
}

inline void infer_trilu(Node& n) {
  Value& x = required_input(n, 0);
  check_data_dtype(n, x.dtype());
  if (x.shape().rank_known() && x.shape().rank() < 2)
    throw n.error("Trilu needs a tensor of rank >= 2, got " + x.shape().str());
  if (Value* k = n.input(1)) check_index_dtype(n, k->dtype(), "k");
  set_output(n, 0, x.dtype(), x.shape());
}

inline std::int64_t block_size(const Node& n) {
  std::int64_t b = n.attr_int("blocksize");
  if (b < 1) throw n.error("blocksize must be positive, got " + std::to_string(b));
  return b;
}

inline std::string depth_to_space_mode(const Node& n) {
  std::string mode = n.op_type() == "DepthToSpace" ? n.attr_string("mode", "DCR") : "DCR";
  if (mode != "DCR" && mode != "CRD") throw n.error("unknown mode '" + mode + "' (expected DCR or CRD)");
  return mode;
}

// Output dims of DepthToSpace / SpaceToDepth on static NCHW dims; checks divisibility.
inline Ints space_depth_dims(const Node& n, const Ints& d, std::int64_t b) {
  if (d.size() != 4) throw n.error("expected a 4-D NCHW input, got " + dims_str(d));
  std::int64_t bb = checked_mul(n, b, b);
  if (n.op_type() == "DepthToSpace") {
    if (d[1] % bb != 0)
      throw n.error("channels " + std::to_string(d[1]) + " are not divisible by blocksize^2 = " + std::to_string(bb));
    return {d[0], d[1] / bb, checked_mul(n, d[2], b), checked_mul(n, d[3], b)};
  }
  if (d[2] % b != 0 || d[3] % b != 0)
    throw n.error("height and width of " + dims_str(d) + " must be divisible by the blocksize " + std::to_string(b));
  return {d[0], checked_mul(n, d[1], bb), d[2] / b, d[3] / b};
}

inline void infer_space_depth(Node& n) {
  Value& x = required_input(n, 0);
  check_data_dtype(n, x.dtype());
  std::int64_t b = block_size(n);
  depth_to_space_mode(n);
  const Shape& s = x.shape();
  if (!s.rank_known()) {
    set_output(n, 0, x.dtype(), Shape{Dim(), Dim(), Dim(), Dim()});
    return;
  }
  if (s.rank() != 4) throw n.error("expected a 4-D NCHW input, got " + s.str());
  bool d2s = n.op_type() == "DepthToSpace";
  std::vector<Dim> out = s.dims();
  auto scale = [&](std::size_t i, bool up, std::int64_t f) {
    if (!s[i].is_static()) {
      out[i] = Dim();
      return;
    }
    if (!up && s[i].value % f != 0)
      throw n.error("dim " + std::to_string(i) + " of " + s.str() + " is not divisible by " + std::to_string(f));
    out[i] = up ? checked_mul(n, s[i].value, f) : s[i].value / f;
  };
  scale(1, !d2s, checked_mul(n, b, b));
  scale(2, d2s, b);
  scale(3, d2s, b);
  set_output(n, 0, x.dtype(), Shape(out));
}

inline void infer_one_hot(Node& n) {
  Value& indices = required_input(n, 0);
  required_input(n, 1);
  Value& values = required_input(n, 2);
  check_data_dtype(n, values.dtype());
  if (indices.dtype() == DType::String || indices.dtype() == DType::Bool)
    throw n.error("indices must be numeric");
  if (!indices.shape().rank_known()) {
    set_output(n, 0, values.dtype(), Shape::unknown());
    return;
  }
  auto out_rank = static_cast<std::int64_t>(indices.shape().rank()) + 1;
  std::int64_t axis = normalize_axis(n, n.attr_int("axis", -1), out_rank);
  Dim depth;
  if (const Tensor* d = constant_input(n, 1)) {
    depth = scalar_count_value(n, *d, "depth");
  }
  std::vector<Dim> out = indices.shape().dims();
  out.insert(out.begin() + axis, depth);
  set_output(n, 0, values.dtype(), Shape(out));
}

inline void infer_scatter_elements(Node& n) {
  Value& data = required_input(n, 0);
  Value& indices = required_input(n, 1);
  Value& updates = required_input(n, 2);
  check_data_dtype(n, data.dtype());
  check_index_dtype(n, indices.dtype(), "indices");
  if (data.shape().rank_known()) {
    auto rank = static_cast<std::int64_t>(data.shape().rank());
    if (rank == 0) throw n.error("cannot scatter into a scalar");
    normalize_axis(n, n.attr_int("axis", 0), rank);
    if (indices.shape().rank_known() && indices.shape().rank() != data.shape().rank())
      throw n.error("indices " + indices.shape().str() + " must have the rank of data " + data.shape().str());
  }
  if (indices.shape().rank_known() && updates.shape().rank_known() && indices.shape().rank() != updates.shape().rank())
    throw n.error("updates " + updates.shape().str() + " must have the shape of indices " + indices.shape().str());
  set_output(n, 0, data.dtype(), data.shape());
}

inline void infer_scatter_nd(Node& n) {
  Value& data = required_input(n, 0);
  Value& indices = required_input(n, 1);
  required_input(n, 2);
  check_data_dtype(n, data.dtype());
  check_index_dtype(n, indices.dtype(), "indices");
  set_output(n, 0, data.dtype(), data.shape());
}

inline void infer_non_zero(Node& n) {
  Value& x = required_input(n, 0);
  check_data_dtype(n, x.dtype());
  if (!x.shape().rank_known()) {
    set_output(n, 0, DType::Int64, Shape{Dim(), Dim()});
    return;
  }
  set_output(n, 0, DType::Int64, Shape{static_cast<std::int64_t>(x.shape().rank()), Dim()});
}

// EyeLike's element type: the `dtype` attribute (an ONNX type code, as Cast's `to`), else the input's.
inline DType eye_like_dtype(const Node& n, DType input) {
  return n.has_attr("dtype") ? detail_math::dtype_from_onnx_code(n, n.attr_int("dtype")) : input;
}

inline void infer_eye_like(Node& n) {
  Value& x = required_input(n, 0);
  check_data_dtype(n, x.dtype());
  if (x.shape().rank_known() && x.shape().rank() != 2)
    throw n.error("EyeLike needs a 2-D input, got " + x.shape().str());
  set_output(n, 0, eye_like_dtype(n, x.dtype()), x.shape());
}

// ReverseSequence's (batch_axis, time_axis): 1 and 0 by default, the other order allowed.
inline std::pair<std::size_t, std::size_t> reverse_sequence_axes(const Node& n) {
  const std::int64_t b = n.attr_int("batch_axis", 1), t = n.attr_int("time_axis", 0);
  if (!((b == 0 && t == 1) || (b == 1 && t == 0)))
    throw n.error("batch_axis " + std::to_string(b) + " and time_axis " + std::to_string(t) +
                  " must be 0 and 1, in either order");
  return {static_cast<std::size_t>(b), static_cast<std::size_t>(t)};
}

inline void infer_reverse_sequence(Node& n) {
  Value& x = required_input(n, 0);
  Value& lens = required_input(n, 1);
  check_data_dtype(n, x.dtype());
  if (lens.dtype() != DType::Undefined && lens.dtype() != DType::Int64)
    throw n.error("sequence_lens must be an int64 tensor, got " + std::string(dtype_name(lens.dtype())));
  const std::size_t batch_axis = reverse_sequence_axes(n).first;
  const Shape& xs = x.shape();
  if (xs.rank_known() && xs.rank() < 2) throw n.error("ReverseSequence needs a tensor of rank >= 2, got " + xs.str());
  const Shape& ls = lens.shape();
  if (ls.rank_known() && ls.rank() != 1) throw n.error("sequence_lens must be 1-D, got " + ls.str());
  if (xs.rank_known() && ls.rank_known() && xs[batch_axis].is_static() && ls[0].is_static() &&
      xs[batch_axis].value != ls[0].value)
    throw n.error("sequence_lens " + ls.str() + " does not match the batch size of input " + xs.str());
  set_output(n, 0, x.dtype(), xs);
}

inline void infer_cum_sum(Node& n) {
  Value& x = required_input(n, 0);
  Value& axis = required_input(n, 1);
  check_data_dtype(n, x.dtype());
  if (x.dtype() == DType::Bool) throw n.error("CumSum does not support bool");
  check_index_dtype(n, axis.dtype(), "axis");
  if (const Tensor* a = constant_input(n, 1); a && x.shape().rank_known()) {
    normalize_axis(n, scalar_int_value(n, *a, "axis"), static_cast<std::int64_t>(x.shape().rank()));
  }
  set_output(n, 0, x.dtype(), x.shape());
}

// GatherND: out = indices.shape[:-1] + data.shape[batch_dims + m:], m = indices.shape[-1].
inline void infer_gather_nd(Node& n) {
  Value& data = required_input(n, 0);
  Value& indices = required_input(n, 1);
  check_data_dtype(n, data.dtype());
  if (indices.dtype() != DType::Int64) throw n.error("indices must be int64, got " + std::string(dtype_name(indices.dtype())));
  const std::int64_t b = n.attr_int("batch_dims", 0);
  if (!data.shape().rank_known() || !indices.shape().rank_known()) return set_output(n, 0, data.dtype(), Shape::unknown());
  const Shape &ds = data.shape(), &is = indices.shape();
  auto r = static_cast<std::int64_t>(ds.rank()), q = static_cast<std::int64_t>(is.rank());
  if (r < 1 || q < 1) throw n.error("data and indices must have rank >= 1, got " + ds.str() + " and " + is.str());
  if (b < 0 || b >= std::min(r, q)) throw n.error("batch_dims " + std::to_string(b) + " must be less than both ranks");
  const Dim& last = is[static_cast<std::size_t>(q - 1)];
  if (!last.is_static()) return set_output(n, 0, data.dtype(), Shape::unknown());
  const std::int64_t m = last.value;
  if (m < 1 || m > r - b)
    throw n.error("indices' last dim " + std::to_string(m) + " must be in [1, " + std::to_string(r - b) + "] for data " + ds.str());
  std::vector<Dim> out(is.dims().begin(), is.dims().end() - 1);
  out.insert(out.end(), ds.dims().begin() + static_cast<std::ptrdiff_t>(b + m), ds.dims().end());
  set_output(n, 0, data.dtype(), Shape(out));
}

// TopK: Values and Indices (int64) of X's shape with axis dim k (attribute before opset 10, input after).
inline void infer_top_k(Node& n) {
  Value& x = required_input(n, 0);
  check_data_dtype(n, x.dtype());
  if (x.dtype() == DType::Bool || x.dtype() == DType::String) throw n.error("TopK does not support " + std::string(dtype_name(x.dtype())));
  Dim k;
  if (opset_of(n) < 10) {
    k = Dim(n.attr_int("k"));
  } else {
    Value& kv = required_input(n, 1);
    check_index_dtype(n, kv.dtype(), "K");
    if (auto vals = input_values(n, 1); vals && vals->size() == 1) k = (*vals)[0].as_dim();
  }
  if (k.is_static() && k.value < 0) throw n.error("k must be >= 0, got " + std::to_string(k.value));
  if (!x.shape().rank_known()) {
    set_output(n, 0, x.dtype(), Shape::unknown());
    if (n.num_outputs() > 1) set_output(n, 1, DType::Int64, Shape::unknown());
    return;
  }
  auto rank = static_cast<std::int64_t>(x.shape().rank());
  auto axis = static_cast<std::size_t>(normalize_axis(n, n.attr_int("axis", -1), rank));
  const Dim& len = x.shape()[axis];
  if (k.is_static() && len.is_static() && k.value > len.value)
    throw n.error("k " + std::to_string(k.value) + " is larger than axis " + std::to_string(axis) + " of size " +
                  std::to_string(len.value));
  Shape out = x.shape();
  out.dims()[axis] = k;
  set_output(n, 0, x.dtype(), out);
  if (n.num_outputs() > 1) set_output(n, 1, DType::Int64, out);
}

}  // namespace detail_tensor_ops

inline void register_tensor_ops_infer(InferTable& table) {
  namespace d = detail_tensor_ops;
  table["Concat"] = d::infer_concat;
  table["Split"] = d::infer_split;
  table["Slice"] = d::infer_slice;
  table["Gather"] = d::infer_gather;
  table["GatherElements"] = d::infer_gather_elements;
  table["Reshape"] = d::infer_reshape;
  table["Flatten"] = d::infer_flatten;
  table["Transpose"] = d::infer_transpose;
  table["Squeeze"] = d::infer_squeeze;
  table["Unsqueeze"] = d::infer_unsqueeze;
  table["Shape"] = d::infer_shape;
  table["Size"] = d::infer_size;
  table["Identity"] = d::infer_identity;
  table["Dropout"] = d::infer_dropout;
  table["Expand"] = d::infer_expand;
  table["ConstantOfShape"] = d::infer_constant_of_shape;
  table["Constant"] = d::infer_constant;
  table["Range"] = d::infer_range;
  table["Tile"] = d::infer_tile;
  table["Trilu"] = d::infer_trilu;
  table["DepthToSpace"] = d::infer_space_depth;
  table["SpaceToDepth"] = d::infer_space_depth;
  table["OneHot"] = d::infer_one_hot;
  table["ScatterElements"] = d::infer_scatter_elements;
  table["Scatter"] = d::infer_scatter_elements;
  table["ScatterND"] = d::infer_scatter_nd;
  table["NonZero"] = d::infer_non_zero;
  table["CumSum"] = d::infer_cum_sum;
  table["EyeLike"] = d::infer_eye_like;
  table["ReverseSequence"] = d::infer_reverse_sequence;
  table["GatherND"] = d::infer_gather_nd;
  table["TopK"] = d::infer_top_k;
}

}  // namespace ondine::infer
