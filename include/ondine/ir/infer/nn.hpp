// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/nn.hpp - shape and type inference for the nn ops.
//
// Conv, ConvTranspose, the pools, MaxUnpool, BatchNormalization, InstanceNormalization,
// LayerNormalization, LRN, MeanVarianceNormalization, MatMul, Gemm, Softmax, LogSoftmax, Hardmax,
// Resize, Upsample and Pad. The window geometry (auto_pad, ceil_mode, output sizes) lives here once
// and the reference kernels reuse it, so that inference and execution can never disagree on an output
// size.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/infer/common.hpp"

namespace ondine::infer {
namespace detail_nn {

inline std::string ints_str(const std::vector<std::int64_t>& v) { return dims_str(v); }

inline std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return -floor_div(-a, b); }

inline void require_dtype(const Node& n, const Value& v, bool ok, const char* what) {
  if (v.dtype() != DType::Undefined && !ok)
    throw n.error("input '" + v.name() + "' has element type " + std::string(dtype_name(v.dtype())) + "; " + what);
}
inline void require_floating(const Node& n, const Value& v) {
  require_dtype(n, v, is_floating(v.dtype()), "expected a floating-point type");
}
inline void require_same_dtype(const Node& n, const Value& a, const Value& b) {
  if (a.dtype() != DType::Undefined && b.dtype() != DType::Undefined && a.dtype() != b.dtype())
    throw n.error("inputs '" + a.name() + "' (" + std::string(dtype_name(a.dtype())) + ") and '" + b.name() + "' (" +
                  std::string(dtype_name(b.dtype())) + ") must have the same element type");
}

// An ints attribute of exactly `count` values, or `count` copies of `fill` when absent.
inline std::vector<std::int64_t> ints_attr(const Node& n, const std::string& name, std::size_t count,
                                           std::int64_t fill) {
  if (!n.has_attr(name)) return std::vector<std::int64_t>(count, fill);
  auto v = n.attr_ints(name);
  if (v.size() != count)
    throw n.error("attribute '" + name + "' has " + std::to_string(v.size()) + " values, expected " +
                  std::to_string(count));
  return v;
}

// --- sliding windows (Conv, the pools) ------------------------------------------------------------

// The geometry attributes of a windowed op, validated. `pads` holds all begins then all ends.
struct Window {
  std::vector<std::int64_t> kernel, strides, dilations, pads;
  std::string auto_pad = "NOTSET";
  bool ceil_mode = false;
  std::size_t spatial() const { return kernel.size(); }
  std::int64_t effective_kernel(std::size_t i) const { return (kernel[i] - 1) * dilations[i] + 1; }
};

inline std::string read_auto_pad(const Node& n) {
  std::string a = n.attr_string("auto_pad", "NOTSET");
  if (a.empty()) a = "NOTSET";
  if (a != "NOTSET" && a != "SAME_UPPER" && a != "SAME_LOWER" && a != "VALID")
    throw n.error("invalid auto_pad '" + a + "' (expected NOTSET, SAME_UPPER, SAME_LOWER or VALID)");
  return a;
}

inline Window read_window(const Node& n, std::vector<std::int64_t> kernel) {
  Window w;
  std::size_t s = kernel.size();
  for (auto k : kernel)
    if (k <= 0) throw n.error("kernel_shape " + ints_str(kernel) + " must be positive");
  w.kernel = std::move(kernel);
  w.strides = ints_attr(n, "strides", s, 1);
  w.dilations = ints_attr(n, "dilations", s, 1);
  w.pads = ints_attr(n, "pads", 2 * s, 0);
  // Sizes beyond 2^31 are certainly wrong and would overflow the index arithmetic.
  constexpr std::int64_t limit = std::int64_t(1) << 31;
  for (const auto* v : {&w.kernel, &w.strides, &w.dilations, &w.pads})
    for (auto x : *v)
      if (x > limit) throw n.error("window attribute value " + std::to_string(x) + " is out of range");
  for (auto v : w.strides)
    if (v <= 0) throw n.error("strides " + ints_str(w.strides) + " must be positive");
  for (auto v : w.dilations)
    if (v <= 0) throw n.error("dilations " + ints_str(w.dilations) + " must be positive");
  for (auto v : w.pads)
    if (v < 0) throw n.error("pads " + ints_str(w.pads) + " must not be negative");
  w.auto_pad = read_auto_pad(n);
  // Explicit pads are meaningless with an auto_pad other than NOTSET.
  if (w.auto_pad != "NOTSET") std::fill(w.pads.begin(), w.pads.end(), 0);
  std::int64_t ceil = n.attr_int("ceil_mode", 0);
  if (ceil != 0 && ceil != 1) throw n.error("ceil_mode must be 0 or 1");
  w.ceil_mode = ceil == 1;
  return w;
}

// The kernel shape of a pool: the required kernel_shape attribute, with one value per spatial axis.
inline std::vector<std::int64_t> pool_kernel(const Node& n, std::size_t spatial) {
  auto k = n.attr_ints("kernel_shape");
  if (k.size() != spatial)
    throw n.error("kernel_shape " + ints_str(k) + " has " + std::to_string(k.size()) + " values for " +
                  std::to_string(spatial) + " spatial axes");
  return k;
}

// Output size along spatial axis i for an input of `in` elements; also resolves the pads actually used.
inline std::int64_t window_output_size(const Node& n, const Window& w, std::size_t i, std::int64_t in,
                                       std::int64_t& pad_begin, std::int64_t& pad_end) {
  std::int64_t s = w.strides[i], eff = w.effective_kernel(i);
  if (w.auto_pad == "SAME_UPPER" || w.auto_pad == "SAME_LOWER") {
    std::int64_t out = ceil_div(in, s);
    std::int64_t total = std::max<std::int64_t>(0, (out - 1) * s + eff - in);
    pad_begin = w.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
    pad_end = total - pad_begin;
    return out;
  }
  pad_begin = w.pads[i];
  pad_end = w.pads[i + w.spatial()];
  std::int64_t span = in + pad_begin + pad_end - eff;
  if (span < 0)
    throw n.error("the kernel (extent " + std::to_string(eff) + ") is larger than the padded input (" +
                  std::to_string(in + pad_begin + pad_end) + ") along spatial axis " + std::to_string(i));
  if (!w.ceil_mode || w.auto_pad == "VALID") return span / s + 1;
  std::int64_t out = ceil_div(span, s) + 1;
  // A last window that would start in the end padding is dropped (as PyTorch and later ONNX specs do).
  if ((out - 1) * s >= in + pad_begin) --out;
  return out;
}

// The same on a possibly symbolic dim: a symbol survives where the op maps it onto itself.
inline Dim window_output_dim(const Node& n, const Window& w, std::size_t i, const Dim& in) {
  if (in.is_static()) {
    std::int64_t pb, pe;
    return window_output_size(n, w, i, in.value, pb, pe);
  }
  std::int64_t s = w.strides[i];
  if (w.auto_pad == "SAME_UPPER" || w.auto_pad == "SAME_LOWER")  // ceil(in / s)
    return dim_floor_div(dim_add(in, Dim(s - 1)), Dim(s));
  // floor((in + pads - extent) / s) + 1, ceil_mode: ceil(...) + 1 (less a last window starting in the
  // end padding, which needs the number: left unknown then).
  Dim span = dim_sub(dim_add(in, Dim(w.pads[i] + w.pads[i + w.spatial()])), Dim(w.effective_kernel(i)));
  if (w.ceil_mode && w.auto_pad != "VALID") {
    if (s == 1) return dim_add(span, Dim(1));
    if (w.pads[i + w.spatial()] != 0) return Dim();
    return dim_add(dim_floor_div(dim_add(span, Dim(s - 1)), Dim(s)), Dim(1));
  }
  return dim_add(dim_floor_div(span, Dim(s)), Dim(1));
}

// Output sizes and pads for static input spatial sizes (the kernels' view of the above).
struct ResolvedWindow {
  std::vector<std::int64_t> out, pad_begin, pad_end;
};
inline ResolvedWindow resolve_window(const Node& n, const Window& w, const std::vector<std::int64_t>& in) {
  ResolvedWindow r;
  r.out.resize(in.size());
  r.pad_begin.resize(in.size());
  r.pad_end.resize(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) r.out[i] = window_output_size(n, w, i, in[i], r.pad_begin[i], r.pad_end[i]);
  return r;
}

// --- ConvTranspose geometry -----------------------------------------------------------------------

struct TransposeWindow {
  Window window;
  std::vector<std::int64_t> output_padding, output_shape;  // output_shape empty when not given
};

inline TransposeWindow read_transpose_window(const Node& n, std::vector<std::int64_t> kernel) {
  TransposeWindow t;
  std::size_t s = kernel.size();
  t.window = read_window(n, std::move(kernel));
  if (t.window.ceil_mode) throw n.error("ConvTranspose has no ceil_mode");
  t.output_padding = ints_attr(n, "output_padding", s, 0);
  for (std::size_t i = 0; i < s; ++i)
    if (t.output_padding[i] < 0 || (t.output_padding[i] >= t.window.strides[i] &&
                                    t.output_padding[i] >= t.window.dilations[i]))
      throw n.error("output_padding " + ints_str(t.output_padding) + " must be non-negative and smaller than the stride or dilation");
  if (n.has_attr("output_shape")) {
    auto os = n.attr_ints("output_shape");
    // Some exporters write the full N, C, spatial... shape; the spatial tail is what counts.
    if (os.size() == s + 2) os.erase(os.begin(), os.begin() + 2);
    if (os.size() != s)
      throw n.error("output_shape " + ints_str(os) + " has " + std::to_string(os.size()) + " values for " +
                    std::to_string(s) + " spatial axes");
    for (auto v : os)
      if (v < 0 || v > (std::int64_t(1) << 31)) throw n.error("output_shape " + ints_str(os) + " is out of range");
    t.output_shape = os;
  }
  return t;
}

// Output size along spatial axis i; pads may come out negative (the output extends past the full result).
inline std::int64_t transpose_output_size(const TransposeWindow& t, std::size_t i, std::int64_t in,
                                          std::int64_t& pad_begin, std::int64_t& pad_end) {
  const Window& w = t.window;
  std::int64_t full = w.strides[i] * (in - 1) + t.output_padding[i] + w.effective_kernel(i);
  bool same = w.auto_pad == "SAME_UPPER" || w.auto_pad == "SAME_LOWER";
  if (!t.output_shape.empty() || same) {
    std::int64_t out = !t.output_shape.empty() ? t.output_shape[i] : in * w.strides[i];
    std::int64_t total = full - out;
    if (w.auto_pad == "SAME_UPPER") {
      pad_begin = floor_div(total, 2);
      pad_end = total - pad_begin;
    } else {
      pad_end = floor_div(total, 2);
      pad_begin = total - pad_end;
    }
    return out;
  }
  pad_begin = w.pads[i];
  pad_end = w.pads[i + w.spatial()];
  return full - pad_begin - pad_end;
}

// --- shapes ---------------------------------------------------------------------------------------

// The rank of a value's shape, or -1 when unknown.
inline std::int64_t rank_of(const Value* v) {
  return v && v->shape().rank_known() ? static_cast<std::int64_t>(v->shape().rank()) : -1;
}

inline void require_rank(const Node& n, const Value& v, std::size_t rank) {
  if (v.shape().rank_known() && v.shape().rank() != rank)
    throw n.error("input '" + v.name() + "' has shape " + v.shape().str() + ", expected rank " + std::to_string(rank));
}
inline void require_min_rank(const Node& n, const Value& v, std::size_t rank) {
  if (v.shape().rank_known() && v.shape().rank() < rank)
    throw n.error("input '" + v.name() + "' has shape " + v.shape().str() + ", expected rank >= " +
                  std::to_string(rank));
}

// Two dims that must agree: an error when both are static and differ; else the more informative one.
inline Dim unify(const Node& n, const Dim& a, const Dim& b, const std::string& what) {
  if (a.is_static() && b.is_static() && a.value != b.value)
    throw n.error(what + ": " + std::to_string(a.value) + " vs " + std::to_string(b.value));
  if (a.is_static()) return a;
  if (b.is_static()) return b;
  return a.symbol.empty() ? b : a;
}

// A rank-1 parameter (BatchNormalization's scale, Conv's bias, ...) of `count` elements.
inline void check_vector(const Node& n, const Value* v, const Dim& count, const std::string& role) {
  if (!v || !v->shape().rank_known()) return;
  if (v->shape().rank() != 1)
    throw n.error(role + " '" + v->name() + "' has shape " + v->shape().str() + ", expected rank 1");
  unify(n, v->shape()[0], count, role + " '" + v->name() + "' has the wrong length");
}

// --- the ops --------------------------------------------------------------------------------------

// What Conv and ConvTranspose check alike: X and W of one floating type and one rank >= 3, a positive
// group. Returns nullopt (output set to unknown) when neither rank is known.
struct ConvOperands {
  Value& x;
  Value& w;
  std::size_t spatial;
  std::int64_t group;
  Shape xs, ws;  // the shapes, with unknown dims when only the rank is known
};
inline std::optional<ConvOperands> conv_operands(Node& n) {
  Value& x = required_input(n, 0);
  Value& w = required_input(n, 1);
  require_floating(n, x);
  require_same_dtype(n, x, w);
  std::int64_t rank = rank_of(&x) >= 0 ? rank_of(&x) : rank_of(&w);
  if (rank < 0) {
    set_output(n, 0, x.dtype(), Shape::unknown());
    return std::nullopt;
  }
  if (rank < 3) throw n.error("input '" + x.name() + "' has rank " + std::to_string(rank) + ", expected >= 3 (N, C, spatial...)");
  require_rank(n, x, static_cast<std::size_t>(rank));
  require_rank(n, w, static_cast<std::size_t>(rank));
  std::int64_t group = n.attr_int("group", 1);
  if (group <= 0) throw n.error("group " + std::to_string(group) + " must be positive");
  auto shape_or_unknown_dims = [&](const Value& v) {
    return v.shape().rank_known() ? v.shape() : Shape(std::vector<Dim>(static_cast<std::size_t>(rank)));
  };
  return ConvOperands{x, w, static_cast<std::size_t>(rank) - 2, group, shape_or_unknown_dims(x), shape_or_unknown_dims(w)};
}

inline void infer_conv(Node& n) {
  auto ops = conv_operands(n);
  if (!ops) return;
  Value &x = ops->x, &w = ops->w;
  std::size_t spatial = ops->spatial;
  std::int64_t group = ops->group;
  Shape &xs = ops->xs, &ws = ops->ws;
  const Dim &c = xs[1], &m = ws[0], &wc = ws[1];
  if (c.is_static() && wc.is_static() && c.value != wc.value * group)
    throw n.error("input '" + x.name() + "' has " + std::to_string(c.value) + " channels but weight '" + w.name() +
                  "' expects " + std::to_string(wc.value) + " x group " + std::to_string(group) + " = " +
                  std::to_string(wc.value * group));
  if (m.is_static() && m.value % group != 0)
    throw n.error("weight '" + w.name() + "' has " + std::to_string(m.value) + " output channels, not a multiple of group " +
                  std::to_string(group));
  check_vector(n, n.input(2), m, "bias");
  // The kernel size: kernel_shape or the weight's spatial dims (they must agree when both known).
  std::vector<std::int64_t> kernel(spatial, -1);
  if (n.has_attr("kernel_shape")) kernel = pool_kernel(n, spatial);
  for (std::size_t i = 0; i < spatial; ++i) {
    const Dim& d = ws[i + 2];
    if (d.is_static() && kernel[i] >= 0 && d.value != kernel[i])
      throw n.error("kernel_shape " + ints_str(kernel) + " does not match weight shape " + ws.str());
    if (d.is_static()) kernel[i] = d.value;
  }
  std::vector<Dim> out{xs[0], m};
  bool kernel_known = std::all_of(kernel.begin(), kernel.end(), [](std::int64_t k) { return k >= 0; });
  if (kernel_known) {
    Window win = read_window(n, kernel);
    for (std::size_t i = 0; i < spatial; ++i) out.push_back(window_output_dim(n, win, i, xs[i + 2]));
  } else {
    out.resize(spatial + 2);
  }
  set_output(n, 0, x.dtype(), Shape(out));
}

inline void infer_conv_transpose(Node& n) {
  auto ops = conv_operands(n);
  if (!ops) return;
  Value &x = ops->x, &w = ops->w;
  std::size_t spatial = ops->spatial;
  std::int64_t group = ops->group;
  Shape &xs = ops->xs, &ws = ops->ws;
  unify(n, xs[1], ws[0], "input channels of '" + x.name() + "' and weight '" + w.name() + "' differ");
  if (ws[0].is_static() && ws[0].value % group != 0)
    throw n.error("weight '" + w.name() + "' has " + std::to_string(ws[0].value) + " input channels, not a multiple of group " +
                  std::to_string(group));
  Dim m = ws[1].is_static() ? Dim(ws[1].value * group) : Dim();
  check_vector(n, n.input(2), m, "bias");
  std::vector<std::int64_t> kernel(spatial, -1);
  if (n.has_attr("kernel_shape")) kernel = pool_kernel(n, spatial);
  for (std::size_t i = 0; i < spatial; ++i) {
    const Dim& d = ws[i + 2];
    if (d.is_static() && kernel[i] >= 0 && d.value != kernel[i])
      throw n.error("kernel_shape " + ints_str(kernel) + " does not match weight shape " + ws.str());
    if (d.is_static()) kernel[i] = d.value;
  }
  std::vector<Dim> out{xs[0], m};
  bool kernel_known = std::all_of(kernel.begin(), kernel.end(), [](std::int64_t k) { return k >= 0; });
  if (kernel_known) {
    TransposeWindow t = read_transpose_window(n, kernel);
    for (std::size_t i = 0; i < spatial; ++i) {
      const Dim& in = xs[i + 2];
      if (!t.output_shape.empty()) {
        out.push_back(t.output_shape[i]);
      } else if (in.is_static()) {
        std::int64_t pb, pe, o = transpose_output_size(t, i, in.value, pb, pe);
        if (o <= 0) throw n.error("the output would be empty along spatial axis " + std::to_string(i));
        out.push_back(o);
      } else {
        // transpose_output_size as an expression: a U-Net's up path, 2 x its input, concatenated with the skip.
        const Window& win = t.window;
        const Dim stride(win.strides[i]);
        if (win.auto_pad == "SAME_UPPER" || win.auto_pad == "SAME_LOWER")
          out.push_back(dim_mul(in, stride));
        else
          out.push_back(dim_add(dim_mul(dim_sub(in, Dim(1)), stride),
                                Dim(t.output_padding[i] + win.effective_kernel(i) - win.pads[i] - win.pads[i + spatial])));
      }
    }
  } else {
    out.resize(spatial + 2);
  }
  set_output(n, 0, x.dtype(), Shape(out));
}

inline void infer_pool(Node& n, bool is_max) {
  Value& x = required_input(n, 0);
  if (is_max)
    require_dtype(n, x, is_floating(x.dtype()) || x.dtype() == DType::Int8 || x.dtype() == DType::UInt8,
                  "expected a floating-point type, int8 or uint8");
  else
    require_floating(n, x);
  if (is_max && n.attr_int("storage_order", 0) != 0 && n.attr_int("storage_order", 0) != 1)
    throw n.error("storage_order must be 0 or 1");
  if (!x.shape().rank_known()) {
    set_output(n, 0, x.dtype(), Shape::unknown());
    set_output(n, 1, DType::Int64, Shape::unknown());
    return;
  }
  require_min_rank(n, x, 3);
  const Shape& xs = x.shape();
  std::size_t spatial = xs.rank() - 2;
  Window win = read_window(n, pool_kernel(n, spatial));
  std::vector<Dim> out{xs[0], xs[1]};
  for (std::size_t i = 0; i < spatial; ++i) out.push_back(window_output_dim(n, win, i, xs[i + 2]));
  set_output(n, 0, x.dtype(), Shape(out));
  set_output(n, 1, DType::Int64, Shape(out));
}

inline void infer_global_pool(Node& n, bool is_max) {
  Value& x = required_input(n, 0);
  if (is_max)
    require_dtype(n, x, is_floating(x.dtype()) || x.dtype() == DType::Int8 || x.dtype() == DType::UInt8,
                  "expected a floating-point type, int8 or uint8");
  else
    require_floating(n, x);
  if (!x.shape().rank_known()) return set_output(n, 0, x.dtype(), Shape::unknown());
  require_min_rank(n, x, 3);
  std::vector<Dim> out(x.shape().rank(), Dim(1));
  out[0] = x.shape()[0];
  out[1] = x.shape()[1];
  set_output(n, 0, x.dtype(), Shape(out));
}

// MaxUnpool's geometry: kernel_shape (required), strides and pads; the default output size of spatial
// axis i is (in - 1) * stride + kernel - pad_begin - pad_end, MaxPool's input size before rounding.
struct UnpoolWindow {
  std::vector<std::int64_t> kernel, strides, pads;
};

inline UnpoolWindow read_unpool_window(const Node& n, std::size_t spatial) {
  UnpoolWindow w;
  w.kernel = pool_kernel(n, spatial);
  w.strides = ints_attr(n, "strides", spatial, 1);
  w.pads = ints_attr(n, "pads", 2 * spatial, 0);
  for (auto k : w.kernel)
    if (k <= 0) throw n.error("kernel_shape " + ints_str(w.kernel) + " must be positive");
  for (auto v : w.strides)
    if (v <= 0) throw n.error("strides " + ints_str(w.strides) + " must be positive");
  for (auto v : w.pads)
    if (v < 0) throw n.error("pads " + ints_str(w.pads) + " must not be negative");
  return w;
}

inline Dim unpool_output_dim(const UnpoolWindow& w, std::size_t i, const Dim& in) {
  const std::size_t s = w.kernel.size();
  return dim_add(dim_mul(dim_sub(in, Dim(1)), Dim(w.strides[i])), Dim(w.kernel[i] - w.pads[i] - w.pads[i + s]));
}

inline void infer_max_unpool(Node& n) {
  Value& x = required_input(n, 0);
  Value& indices = required_input(n, 1);
  require_floating(n, x);
  require_dtype(n, indices, indices.dtype() == DType::Int64, "expected int64");
  if (!x.shape().rank_known()) return set_output(n, 0, x.dtype(), Shape::unknown());
  require_min_rank(n, x, 3);
  const Shape& xs = x.shape();
  const std::size_t rank = xs.rank(), spatial = rank - 2;
  UnpoolWindow w = read_unpool_window(n, spatial);
  if (indices.shape().rank_known() && indices.shape().rank() != rank)
    throw n.error("I has shape " + indices.shape().str() + ", expected the shape of X " + xs.str());
  std::vector<Dim> out{xs[0], xs[1]};
  if (n.input(2)) {
    // output_shape: the full output shape, when known at compile time; else the rank only.
    Value& shape = *n.input(2);
    require_dtype(n, shape, shape.dtype() == DType::Int64, "expected int64");
    auto elems = input_values(n, 2);
    if (elems && elems->size() != rank)
      throw n.error("output_shape has " + std::to_string(elems->size()) + " values for an input of rank " +
                    std::to_string(rank));
    out.clear();
    for (std::size_t i = 0; i < rank; ++i) out.push_back(elems ? (*elems)[i].as_dim() : Dim());
  } else {
    for (std::size_t i = 0; i < spatial; ++i) out.push_back(unpool_output_dim(w, i, xs[i + 2]));
  }
  set_output(n, 0, x.dtype(), Shape(out));
}

inline void infer_batch_norm(Node& n) {
  Value& x = required_input(n, 0);
  require_floating(n, x);
  for (std::size_t i = 1; i < 5; ++i) require_floating(n, required_input(n, i));
  require_min_rank(n, x, 2);
  std::int64_t training = n.opset() >= 14 ? n.attr_int("training_mode", 0) : 0;
  if (training != 0 && training != 1) throw n.error("training_mode must be 0 or 1");
  if (n.opset() < 14 && n.num_outputs() > 1)
    for (std::size_t i = 1; i < n.num_outputs(); ++i)
      if (n.output(i) && (n.output(i)->has_uses() || n.output(i)->is_graph_output()))
        throw n.error("the training outputs of BatchNormalization before opset 14 are unsupported");
  if (n.opset() >= 14 && n.num_outputs() > 3) throw n.error("BatchNormalization has at most 3 outputs");
  bool spatial = n.opset() >= 9 || n.attr_int("spatial", 1) != 0;
  Dim c = x.shape().rank_known() ? x.shape()[1] : Dim();
  if (spatial) {
    check_vector(n, n.input(1), c, "scale");
    check_vector(n, n.input(2), c, "bias");
    check_vector(n, n.input(3), c, "mean");
    check_vector(n, n.input(4), c, "variance");
  }
  set_output(n, 0, x.dtype(), x.shape());
  for (std::size_t i = 1; i < n.num_outputs() && i < 5; ++i) {
    Value& stat = required_input(n, i <= 2 ? i + 2 : i);
    set_output(n, i, stat.dtype(), stat.shape());
  }
}

inline void infer_instance_norm(Node& n) {
  Value& x = required_input(n, 0);
  require_floating(n, x);
  require_min_rank(n, x, 3);
  Dim c = x.shape().rank_known() ? x.shape()[1] : Dim();
  check_vector(n, &required_input(n, 1), c, "scale");
  check_vector(n, &required_input(n, 2), c, "bias");
  set_output(n, 0, x.dtype(), x.shape());
}

inline void infer_lrn(Node& n) {
  Value& x = required_input(n, 0);
  require_floating(n, x);
  require_min_rank(n, x, 2);
  if (n.attr_int("size") <= 0) throw n.error("size must be positive");
  set_output(n, 0, x.dtype(), x.shape());
}

// MeanVarianceNormalization's axes (default [0, 2, 3]), normalised against the rank; no repeats.
inline std::vector<std::int64_t> mvn_axes(const Node& n, std::int64_t rank) {
  const std::vector<std::int64_t> given = n.attr_ints("axes", {0, 2, 3});
  std::vector<std::int64_t> axes;
  std::vector<bool> seen(static_cast<std::size_t>(rank), false);
  for (auto a : given) {
    auto ax = static_cast<std::size_t>(normalize_axis(n, a, rank));
    if (seen[ax]) throw n.error("axes " + ints_str(given) + " repeat an axis");
    seen[ax] = true;
    axes.push_back(static_cast<std::int64_t>(ax));
  }
  return axes;
}

inline void infer_mvn(Node& n) {
  Value& x = required_input(n, 0);
  require_floating(n, x);
  if (x.shape().rank_known()) mvn_axes(n, static_cast<std::int64_t>(x.shape().rank()));
  set_output(n, 0, x.dtype(), x.shape());
}

inline DType stash_dtype(const Node& n) {
  switch (n.attr_int("stash_type", 1)) {
    case 1: return DType::Float32;
    case 10: return DType::Float16;
    case 11: return DType::Float64;
    case 16: return DType::BFloat16;
    default: throw n.error("invalid stash_type " + std::to_string(n.attr_int("stash_type", 1)));
  }
}

inline void infer_layer_norm(Node& n) {
  Value& x = required_input(n, 0);
  require_floating(n, x);
  Value& scale = required_input(n, 1);
  require_floating(n, scale);
  DType stash = stash_dtype(n);
  if (!x.shape().rank_known()) {
    set_output(n, 0, x.dtype(), Shape::unknown());
    set_output(n, 1, stash, Shape::unknown());
    set_output(n, 2, stash, Shape::unknown());
    return;
  }
  const Shape& xs = x.shape();
  auto rank = static_cast<std::int64_t>(xs.rank());
  if (rank == 0) throw n.error("input '" + x.name() + "' must have rank >= 1");
  auto axis = static_cast<std::size_t>(normalize_axis(n, n.attr_int("axis", -1), rank));
  // Scale and bias broadcast (unidirectionally) to the normalised dims X[axis:].
  Shape norm(std::vector<Dim>(xs.dims().begin() + static_cast<std::ptrdiff_t>(axis), xs.dims().end()));
  for (std::size_t i = 1; i < 3; ++i) {
    Value* p = n.input(i);
    if (!p || !p->shape().rank_known()) continue;
    const Shape& ps = p->shape();
    bool ok = ps.rank() <= norm.rank();
    for (std::size_t k = 0; ok && k < ps.rank(); ++k) {
      const Dim& d = ps[ps.rank() - 1 - k];
      const Dim& want = norm[norm.rank() - 1 - k];
      ok = !d.is_static() || d.value == 1 || !want.is_static() || d.value == want.value;
    }
    if (!ok)
      throw n.error("'" + p->name() + "' of shape " + ps.str() + " does not broadcast to the normalised shape " +
                    norm.str());
  }
  std::vector<Dim> stat(xs.dims().begin(), xs.dims().begin() + static_cast<std::ptrdiff_t>(axis));
  stat.resize(xs.rank(), Dim(1));
  set_output(n, 0, x.dtype(), xs);
  set_output(n, 1, stash, Shape(stat));
  set_output(n, 2, stash, Shape(stat));
}

inline void infer_softmax(Node& n) {
  Value& x = required_input(n, 0);
  require_floating(n, x);
  if (x.shape().rank_known()) {
    auto rank = static_cast<std::int64_t>(x.shape().rank());
    std::int64_t axis = n.attr_int("axis", n.opset() >= 13 ? -1 : 1);
    if (rank == 0) {
      if (axis != 0 && axis != -1) throw n.error("axis " + std::to_string(axis) + " is out of range for a scalar");
    } else {
      normalize_axis(n, axis, rank);
    }
  }
  set_output(n, 0, x.dtype(), x.shape());
}

inline bool is_matmul_dtype(DType t) {
  return is_floating(t) || t == DType::Int32 || t == DType::Int64 || t == DType::UInt32 || t == DType::UInt64;
}

inline void infer_matmul(Node& n) {
  Value& a = required_input(n, 0);
  Value& b = required_input(n, 1);
  require_dtype(n, a, is_matmul_dtype(a.dtype()), "expected a floating-point type or (u)int32/(u)int64");
  require_same_dtype(n, a, b);
  if (!a.shape().rank_known() || !b.shape().rank_known()) return set_output(n, 0, a.dtype(), Shape::unknown());
  Shape as = a.shape(), bs = b.shape();
  if (as.rank() == 0 || bs.rank() == 0) throw n.error("MatMul operands must have rank >= 1, got " + as.str() + " and " + bs.str());
  bool a_vec = as.rank() == 1, b_vec = bs.rank() == 1;
  if (a_vec) as.dims().insert(as.dims().begin(), Dim(1));
  if (b_vec) bs.dims().push_back(Dim(1));
  const Dim& ka = as[as.rank() - 1];
  const Dim& kb = bs[bs.rank() - 2];
  if (ka.is_static() && kb.is_static() && ka.value != kb.value)
    throw n.error("inner dimensions differ: " + a.shape().str() + " x " + b.shape().str());
  Shape batch_a(std::vector<Dim>(as.dims().begin(), as.dims().end() - 2));
  Shape batch_b(std::vector<Dim>(bs.dims().begin(), bs.dims().end() - 2));
  Shape out = broadcast(n, batch_a, batch_b);
  if (!a_vec) out.dims().push_back(as[as.rank() - 2]);
  if (!b_vec) out.dims().push_back(bs[bs.rank() - 1]);
  set_output(n, 0, a.dtype(), out);
}

inline void infer_gemm(Node& n) {
  Value& a = required_input(n, 0);
  Value& b = required_input(n, 1);
  require_dtype(n, a, is_matmul_dtype(a.dtype()), "expected a floating-point type or (u)int32/(u)int64");
  require_same_dtype(n, a, b);
  require_rank(n, a, 2);
  require_rank(n, b, 2);
  bool ta = n.attr_int("transA", 0) != 0, tb = n.attr_int("transB", 0) != 0;
  Shape as = a.shape().rank_known() ? a.shape() : Shape{Dim(), Dim()};
  Shape bs = b.shape().rank_known() ? b.shape() : Shape{Dim(), Dim()};
  Dim m = as[ta ? 1 : 0], ka = as[ta ? 0 : 1], kb = bs[tb ? 1 : 0], nn = bs[tb ? 0 : 1];
  if (ka.is_static() && kb.is_static() && ka.value != kb.value)
    throw n.error("inner dimensions differ: A " + as.str() + (ta ? " (transposed)" : "") + " x B " + bs.str() +
                  (tb ? " (transposed)" : ""));
  if (Value* c = n.input(2)) {
    require_same_dtype(n, a, *c);
    if (c->shape().rank_known()) {
      const Shape& cs = c->shape();
      if (cs.rank() > 2) throw n.error("C has shape " + cs.str() + ", expected rank <= 2");
      Dim out[2] = {m, nn};
      for (std::size_t i = 0; i < cs.rank(); ++i) {
        const Dim& d = cs[i];
        const Dim& o = out[2 - cs.rank() + i];
        if (d.is_static() && d.value != 1 && o.is_static() && d.value != o.value)
          throw n.error("C of shape " + cs.str() + " does not broadcast to the output [" + m.str() + "," + nn.str() + "]");
      }
    }
  }
  set_output(n, 0, a.dtype(), Shape{m, nn});
}

// --- Resize ---------------------------------------------------------------------------------------

// Resize before opset 11, and Upsample (opsets 7 to 9, deprecated since 10, which Resize-10 replaced
// with the same meaning): scales only, asymmetric coordinates, nearest rounding down.
inline bool resize_is_legacy(const Node& n) { return n.opset() < 11 || n.op_type() == "Upsample"; }

// The attributes and constant inputs of a Resize, normalised across opsets.
struct ResizeSpec {
  std::string mode, coordinate_mode, nearest_mode;
  double cubic_a = -0.75, extrapolation = 0.0;
  bool exclude_outside = false;
  std::vector<std::int64_t> axes;  // the resized axes (all axes unless opset 18's `axes`)
};

inline ResizeSpec read_resize_spec(const Node& n, std::int64_t rank) {
  ResizeSpec s;
  s.mode = n.attr_string("mode", "nearest");
  if (s.mode != "nearest" && s.mode != "linear" && s.mode != "cubic")
    throw n.error("invalid mode '" + s.mode + "' (expected nearest, linear or cubic)");
  if (resize_is_legacy(n)) {
    if (s.mode == "cubic") throw n.error("mode 'cubic' needs opset >= 11");
    // Resize-10 behaves as Upsample: asymmetric coordinates, nearest rounds down.
    s.coordinate_mode = "asymmetric";
    s.nearest_mode = "floor";
  } else {
    s.coordinate_mode = n.attr_string("coordinate_transformation_mode", "half_pixel");
    s.nearest_mode = n.attr_string("nearest_mode", "round_prefer_floor");
  }
  static const char* modes[] = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                                "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"};
  if (std::find(std::begin(modes), std::end(modes), s.coordinate_mode) == std::end(modes))
    throw n.error("invalid coordinate_transformation_mode '" + s.coordinate_mode + "'");
  if (s.nearest_mode != "round_prefer_floor" && s.nearest_mode != "round_prefer_ceil" && s.nearest_mode != "floor" &&
      s.nearest_mode != "ceil")
    throw n.error("invalid nearest_mode '" + s.nearest_mode + "'");
  s.cubic_a = n.attr_float("cubic_coeff_a", -0.75f);
  s.exclude_outside = n.attr_int("exclude_outside", 0) != 0;
  s.extrapolation = n.attr_float("extrapolation_value", 0.0f);
  if (n.attr_int("antialias", 0) != 0) throw n.error("antialias is unsupported");
  if (n.has_attr("axes")) {
    std::vector<bool> seen(static_cast<std::size_t>(rank), false);
    for (auto a : n.attr_ints("axes")) {
      auto ax = normalize_axis(n, a, rank);
      if (seen[static_cast<std::size_t>(ax)]) throw n.error("axes repeat axis " + std::to_string(a));
      seen[static_cast<std::size_t>(ax)] = true;
      s.axes.push_back(ax);
    }
  } else {
    for (std::int64_t i = 0; i < rank; ++i) s.axes.push_back(i);
  }
  return s;
}

// Indices of Resize's optional inputs by opset.
inline std::size_t resize_scales_index(const Node& n) { return resize_is_legacy(n) ? 1 : 2; }
inline std::size_t resize_sizes_index(const Node& n) { return resize_is_legacy(n) ? 99 : 3; }

// The output size of every axis and the scale each axis uses, from constant scales or sizes.
// Throws when neither (or both) is given; `in` are the input dims (static).
struct ResizeTarget {
  std::vector<std::int64_t> out;
  std::vector<double> scales;
};

inline ResizeTarget resize_target(const Node& n, const ResizeSpec& spec, const std::vector<std::int64_t>& in,
                                  const Tensor* scales, const Tensor* sizes) {
  std::size_t rank = in.size();
  if (scales && scales->numel() == 0) scales = nullptr;
  if (sizes && sizes->numel() == 0) sizes = nullptr;
  if (!scales && !sizes) throw n.error("Resize needs one of scales and sizes");
  if (scales && sizes) throw n.error("Resize takes scales or sizes, not both");
  ResizeTarget t;
  t.out = in;
  t.scales.assign(rank, 1.0);
  std::size_t k = spec.axes.size();
  if (scales) {
    if (!is_floating(scales->dtype())) throw n.error("scales must be a floating-point tensor");
    if (static_cast<std::size_t>(scales->numel()) != k)
      throw n.error("scales has " + std::to_string(scales->numel()) + " values for " + std::to_string(k) + " axes");
    for (std::size_t i = 0; i < k; ++i) {
      auto ax = static_cast<std::size_t>(spec.axes[i]);
      double s = static_cast<double>(static_cast<float>(scales->at_double(i)));
      if (!(s > 0) || !std::isfinite(s) || s * static_cast<double>(in[ax]) > 9e15)
        throw n.error("scale " + std::to_string(s) + " is out of range");
      t.scales[ax] = s;
      t.out[ax] = static_cast<std::int64_t>(std::floor(s * static_cast<double>(in[ax])));
    }
    return t;
  }
  if (sizes->dtype() != DType::Int64) throw n.error("sizes must be an int64 tensor");
  if (static_cast<std::size_t>(sizes->numel()) != k)
    throw n.error("sizes has " + std::to_string(sizes->numel()) + " values for " + std::to_string(k) + " axes");
  auto sz = sizes->to_int64s();
  for (auto v : sz)
    if (v < 0 || v > (std::int64_t(1) << 40)) throw n.error("sizes " + ints_str(sz) + " are out of range");
  std::string policy = n.attr_string("keep_aspect_ratio_policy", "stretch");
  if (policy != "stretch" && policy != "not_larger" && policy != "not_smaller")
    throw n.error("invalid keep_aspect_ratio_policy '" + policy + "'");
  if (policy == "stretch") {
    for (std::size_t i = 0; i < k; ++i) {
      auto ax = static_cast<std::size_t>(spec.axes[i]);
      t.out[ax] = sz[i];
      if (in[ax] == 0) throw n.error("cannot resize an empty axis");
      t.scales[ax] = static_cast<double>(sz[i]) / static_cast<double>(in[ax]);
    }
    return t;
  }
  // One scale for every resized axis, the largest that fits (not_larger) or the smallest that covers.
  double scale = policy == "not_larger" ? 1e300 : 0;
  for (std::size_t i = 0; i < k; ++i) {
    auto ax = static_cast<std::size_t>(spec.axes[i]);
    if (in[ax] == 0) throw n.error("cannot resize an empty axis");
    double s = static_cast<double>(sz[i]) / static_cast<double>(in[ax]);
    scale = policy == "not_larger" ? std::min(scale, s) : std::max(scale, s);
  }
  for (std::size_t i = 0; i < k; ++i) {
    auto ax = static_cast<std::size_t>(spec.axes[i]);
    t.scales[ax] = scale;
    t.out[ax] = static_cast<std::int64_t>(std::floor(scale * static_cast<double>(in[ax]) + 0.5));
  }
  return t;
}

inline void infer_resize(Node& n) {
  Value& x = required_input(n, 0);
  require_dtype(n, x, x.dtype() != DType::String && x.dtype() != DType::Bool, "expected a numeric type");
  if (resize_is_legacy(n)) required_input(n, 1);
  if (!x.shape().rank_known()) return set_output(n, 0, x.dtype(), Shape::unknown());
  const Shape& xs = x.shape();
  auto rank = static_cast<std::int64_t>(xs.rank());
  ResizeSpec spec = read_resize_spec(n, rank);
  const Tensor* scales = constant_input(n, resize_scales_index(n));
  const Tensor* sizes = constant_input(n, resize_sizes_index(n));
  Value* scales_v = n.input(resize_scales_index(n));
  Value* sizes_v = n.input(resize_sizes_index(n));
  bool scales_known = !scales_v || scales;
  bool sizes_known = !sizes_v || sizes;
  if (!sizes_known && n.attr_string("keep_aspect_ratio_policy", "stretch") == "stretch") {
    // Sizes computed from shapes (ir/infer/values.hpp): each resized axis takes its size as a dim.
    auto elems = input_values(n, resize_sizes_index(n));
    if (elems && elems->size() == spec.axes.size()) {
      std::vector<Dim> out = xs.dims();
      for (std::size_t i = 0; i < spec.axes.size(); ++i) out[static_cast<std::size_t>(spec.axes[i])] = (*elems)[i].as_dim();
      return set_output(n, 0, x.dtype(), Shape(out));
    }
  }
  if (!scales_known || !sizes_known) {
    // Data-dependent target: the rank is all we know (axes not resized keep their dims).
    std::vector<Dim> out = xs.dims();
    for (auto ax : spec.axes) out[static_cast<std::size_t>(ax)] = Dim();
    return set_output(n, 0, x.dtype(), Shape(out));
  }
  // With static input dims, the target is exact; else symbols survive on axes of scale 1.
  std::vector<std::int64_t> in(xs.rank());
  for (std::size_t i = 0; i < xs.rank(); ++i) in[i] = xs[i].is_static() ? xs[i].value : 1;
  ResizeTarget t = resize_target(n, spec, in, scales, sizes);
  std::vector<Dim> out(xs.rank());
  bool has_sizes = sizes && sizes->numel() > 0;
  bool keep_ratio = n.attr_string("keep_aspect_ratio_policy", "stretch") != "stretch";
  std::vector<bool> resized(xs.rank(), false);
  for (auto ax : spec.axes) resized[static_cast<std::size_t>(ax)] = true;
  bool all_static = xs.is_static();
  for (std::size_t i = 0; i < xs.rank(); ++i) {
    if (!resized[i]) out[i] = xs[i];
    else if (all_static || (xs[i].is_static() && !keep_ratio)) out[i] = t.out[i];
    else if (has_sizes && !keep_ratio) out[i] = t.out[i];
    else if (!has_sizes && t.scales[i] == 1.0) out[i] = xs[i];
    else if (!has_sizes && !keep_ratio && t.scales[i] >= 1 && t.scales[i] == std::floor(t.scales[i]) && t.scales[i] < 1e6)
      out[i] = dim_mul(xs[i], Dim(static_cast<std::int64_t>(t.scales[i])));  // floor(in * k) = k*in
    else if (!has_sizes && !keep_ratio && t.scales[i] > 0 && t.scales[i] < 1 && 1.0 / t.scales[i] < 1e6 &&
             1.0 / t.scales[i] == std::floor(1.0 / t.scales[i]))  // bounded: a tiny scale overflowed int64 (fuzzing)
      out[i] = dim_floor_div(xs[i], Dim(static_cast<std::int64_t>(1.0 / t.scales[i])));  // floor(in / k)
    else out[i] = Dim();
  }
  set_output(n, 0, x.dtype(), Shape(out));
}

// Upsample-7 gives its scales as an attribute; Upsample-9 as input 1, as Resize-10 does.
inline bool upsample_scales_attribute(const Node& n) { return n.has_attr("scales") && !n.input(1); }

inline void infer_upsample(Node& n) {
  if (!upsample_scales_attribute(n)) return infer_resize(n);
  Value& x = required_input(n, 0);
  require_dtype(n, x, x.dtype() != DType::String && x.dtype() != DType::Bool, "expected a numeric type");
  if (!x.shape().rank_known()) return set_output(n, 0, x.dtype(), Shape::unknown());
  const Shape& xs = x.shape();
  ResizeSpec spec = read_resize_spec(n, static_cast<std::int64_t>(xs.rank()));
  std::vector<float> s = n.attr_floats("scales");
  Tensor scales = Tensor::from_vector<float>({static_cast<std::int64_t>(s.size())}, s);
  std::vector<std::int64_t> in(xs.rank());
  for (std::size_t i = 0; i < xs.rank(); ++i) in[i] = xs[i].is_static() ? xs[i].value : 1;
  ResizeTarget t = resize_target(n, spec, in, &scales, nullptr);
  std::vector<Dim> out(xs.rank());
  for (std::size_t i = 0; i < xs.rank(); ++i)
    out[i] = xs[i].is_static() ? Dim(t.out[i]) : t.scales[i] == 1.0 ? xs[i] : Dim();
  set_output(n, 0, x.dtype(), Shape(out));
}

// --- Pad ------------------------------------------------------------------------------------------

inline std::string pad_mode(const Node& n) {
  std::string mode = n.attr_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
    throw n.error("invalid mode '" + mode + "' (expected constant, reflect, edge or wrap)");
  return mode;
}

// Full begin/end pads (2 x rank values, begins first) from the pads and axes given, or nullopt when
// they are not known at compile time.
inline std::optional<std::vector<std::int64_t>> pad_amounts(const Node& n, std::size_t rank, const Tensor* pads_t,
                                                            const Tensor* axes_t, bool have_axes_input) {
  std::vector<std::int64_t> pads;
  if (n.opset() < 11) {
    if (!n.has_attr("pads") && !n.has_attr("paddings")) throw n.error("missing required attribute 'pads'");
    pads = n.has_attr("pads") ? n.attr_ints("pads") : n.attr_ints("paddings");
  } else {
    if (!pads_t) return std::nullopt;
    if (pads_t->dtype() != DType::Int64) throw n.error("pads must be an int64 tensor");
    if (pads_t->rank() > 1) throw n.error("pads must be a 1-D tensor");
    pads = pads_t->to_int64s();
  }
  std::vector<std::int64_t> axes;
  if (have_axes_input) {
    if (!axes_t) return std::nullopt;
    if (axes_t->dtype() != DType::Int64 && axes_t->dtype() != DType::Int32) throw n.error("axes must be an integer tensor");
    for (auto a : axes_t->to_int64s()) axes.push_back(normalize_axis(n, a, static_cast<std::int64_t>(rank)));
  } else {
    for (std::size_t i = 0; i < rank; ++i) axes.push_back(static_cast<std::int64_t>(i));
  }
  if (pads.size() != 2 * axes.size())
    throw n.error("pads has " + std::to_string(pads.size()) + " values, expected " + std::to_string(2 * axes.size()) +
                  " (begin and end for each of " + std::to_string(axes.size()) + " axes)");
  for (auto p : pads)
    if (p > (std::int64_t(1) << 40) || p < -(std::int64_t(1) << 40)) throw n.error("pads " + ints_str(pads) + " are out of range");
  std::vector<std::int64_t> full(2 * rank, 0);
  for (std::size_t i = 0; i < axes.size(); ++i) {
    auto ax = static_cast<std::size_t>(axes[i]);
    full[ax] = pads[i];
    full[ax + rank] = pads[i + axes.size()];
  }
  return full;
}

inline void infer_pad(Node& n) {
  Value& x = required_input(n, 0);
  require_dtype(n, x, x.dtype() != DType::String, "strings are unsupported");
  pad_mode(n);
  if (n.opset() >= 11) required_input(n, 1);
  if (Value* cv = n.input(2); cv && n.opset() >= 11) require_same_dtype(n, x, *cv);
  if (!x.shape().rank_known()) return set_output(n, 0, x.dtype(), Shape::unknown());
  const Shape& xs = x.shape();
  bool have_axes = n.opset() >= 18 && n.input(3);
  auto pads = pad_amounts(n, xs.rank(), constant_input(n, 1), constant_input(n, 3), have_axes);
  std::vector<Dim> out(xs.rank());
  if (!pads && n.opset() >= 11 && (!have_axes || constant_input(n, 3))) {
    // Pads computed from shapes (ir/infer/values.hpp): each axis grows by its begin and end pads.
    auto elems = input_values(n, 1);
    std::vector<std::int64_t> axes;
    if (have_axes) {
      for (auto a : constant_input(n, 3)->to_int64s())
        axes.push_back(normalize_axis(n, a, static_cast<std::int64_t>(xs.rank())));
    } else {
      for (std::size_t i = 0; i < xs.rank(); ++i) axes.push_back(static_cast<std::int64_t>(i));
    }
    if (elems && elems->size() == 2 * axes.size()) {
      out = xs.dims();
      for (std::size_t i = 0; i < axes.size(); ++i) {
        auto ax = static_cast<std::size_t>(axes[i]);
        out[ax] = sym_add(sym_add(SymInt::of(xs[ax]), (*elems)[i]), (*elems)[i + axes.size()]).as_dim();
      }
    }
    return set_output(n, 0, x.dtype(), Shape(out));
  }
  for (std::size_t i = 0; i < xs.rank(); ++i) {
    if (!pads) continue;
    std::int64_t total = (*pads)[i] + (*pads)[i + xs.rank()];
    if (xs[i].is_static()) {
      if (xs[i].value + total < 0)
        throw n.error("pads " + ints_str(*pads) + " remove more than the " + std::to_string(xs[i].value) +
                      " elements of axis " + std::to_string(i));
      out[i] = xs[i].value + total;
    } else if (total == 0) {
      out[i] = xs[i];
    } else {  // a symbolic axis grows by its pads: "samples + 1024" (an STFT's centring pad)
      out[i] = sym_add(SymInt::of(xs[i]), SymInt(total)).as_dim();
    }
  }
  set_output(n, 0, x.dtype(), Shape(out));
}

}  // namespace detail_nn

inline void register_nn_infer(InferTable& table) {
  using namespace detail_nn;
  table["Conv"] = infer_conv;
  table["ConvTranspose"] = infer_conv_transpose;
  table["MaxPool"] = [](Node& n) { infer_pool(n, true); };
  table["AveragePool"] = [](Node& n) { infer_pool(n, false); };
  table["GlobalMaxPool"] = [](Node& n) { infer_global_pool(n, true); };
  table["GlobalAveragePool"] = [](Node& n) { infer_global_pool(n, false); };
  table["MaxUnpool"] = infer_max_unpool;
  table["BatchNormalization"] = infer_batch_norm;
  table["InstanceNormalization"] = infer_instance_norm;
  table["LayerNormalization"] = infer_layer_norm;
  table["LRN"] = infer_lrn;
  table["MeanVarianceNormalization"] = infer_mvn;
  table["Softmax"] = infer_softmax;
  table["LogSoftmax"] = infer_softmax;
  table["Hardmax"] = infer_softmax;
  table["MatMul"] = infer_matmul;
  table["Gemm"] = infer_gemm;
  table["Resize"] = infer_resize;
  table["Upsample"] = infer_upsample;
  table["Pad"] = infer_pad;
}

}  // namespace ondine::infer
