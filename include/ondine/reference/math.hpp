// SPDX-License-Identifier: Apache-2.0
// ondine/reference/math.hpp - reference kernels for the math ops: elementwise arithmetic, activations,
// comparisons and logic, Cast and CastLike, reductions, ArgMax/ArgMin, Det and (de)quantization.
//
// Floating types (float16 and bfloat16 included) are computed in double and rounded once into the
// output type; integer types are computed exactly in their own type, wrapping on overflow like
// two's complement hardware (done in unsigned arithmetic, so never undefined behaviour). Element-type
// checks share the sets of ir/infer/math.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "ondine/ir/infer/math.hpp"
#include "ondine/reference/common.hpp"

namespace ondine::reference {
namespace detail::math {

namespace types = ::ondine::infer::detail_math;

// --- element types ----------------------------------------------------------------------------------

template <typename T>
inline constexpr bool is_real_v = std::is_floating_point_v<T> || std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

// The type-set bit (see infer/math.hpp) of a C++ element type.
template <typename T>
constexpr unsigned type_bit() {
  if constexpr (is_real_v<T>) return types::kFloatTypes;
  else if constexpr (std::is_same_v<T, bool>) return types::kBoolType;
  else if constexpr (std::is_signed_v<T>) return types::kSignedIntTypes;
  else return types::kUnsignedIntTypes;
}
template <typename T, unsigned Set>
inline constexpr bool in_set_v = (type_bit<T>() & Set) != 0;

// The type a kernel computes in: double for every floating type, the type itself otherwise.
template <typename T>
using compute_t = std::conditional_t<is_real_v<T>, double, T>;

template <typename T>
inline compute_t<T> load(T v) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) return static_cast<double>(static_cast<float>(v));
  else if constexpr (is_real_v<T>) return static_cast<double>(v);
  else return v;
}

// double -> float rounded to odd: then rounding that float to float16/bfloat16 (nearest even) is the
// correctly rounded double -> 16-bit result, since float keeps more than two extra bits.
inline float to_float_round_to_odd(double d) {
  float f = static_cast<float>(d);
  if (std::isfinite(f) && static_cast<double>(f) != d) {
    if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits |= 1u;
    std::memcpy(&f, &bits, 4);
  }
  return f;
}

// double -> integer: truncation toward zero, saturating at the type's range, NaN -> 0 (a plain C++
// cast of an out-of-range value would be undefined).
template <typename T>
inline T saturate_from_double(double d) {
  if (std::isnan(d)) return T(0);
  if (d <= static_cast<double>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
  if (d >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(d);
}

// Stores a computed value (double, an integer or bool) into element type T.
template <typename T, typename C>
inline T store(C v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v != C(0);
  } else if constexpr (is_real_v<T>) {
    double d = static_cast<double>(v);
    if constexpr (std::is_same_v<T, double>) return d;
    else if constexpr (std::is_same_v<T, float>) return static_cast<float>(d);
    else return T(to_float_round_to_odd(d));
  } else if constexpr (std::is_floating_point_v<C>) {
    return saturate_from_double<T>(static_cast<double>(v));
  } else {
    return static_cast<T>(v);  // integer -> integer: modulo 2^bits
  }
}

// Wrapping integer arithmetic (modulo 2^64, then truncated to the type: two's complement wrap).
template <typename C>
inline C wrap_add(C a, C b) {
  if constexpr (std::is_integral_v<C>) return static_cast<C>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
  else return a + b;
}
template <typename C>
inline C wrap_sub(C a, C b) {
  if constexpr (std::is_integral_v<C>) return static_cast<C>(static_cast<std::uint64_t>(a) - static_cast<std::uint64_t>(b));
  else return a - b;
}
template <typename C>
inline C wrap_mul(C a, C b) {
  if constexpr (std::is_integral_v<C>) return static_cast<C>(static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b));
  else return a * b;
}
template <typename C>
inline C wrap_neg(C a) {
  return wrap_sub(C(0), a);
}
// v < 0 without a "comparison is always false" warning for unsigned types.
template <typename C>
inline bool is_negative(C v) {
  if constexpr (std::is_unsigned_v<C> || std::is_same_v<C, bool>) return (void)v, false;
  else return v < C(0);
}

// The tensor of input i, or an error naming the node when a required input is missing.
inline const Tensor& required(const Node& n, const std::vector<Tensor>& in, std::size_t i) {
  if (i >= in.size() || in[i].empty()) throw n.error("missing required input #" + std::to_string(i));
  return in[i];
}
inline const Tensor* optional_input(const std::vector<Tensor>& in, std::size_t i) {
  return i < in.size() && !in[i].empty() ? &in[i] : nullptr;
}

// --- broadcasting loop ------------------------------------------------------------------------------

// Calls f(out_index, {offset into each input}) for every element of `out_dims`, each input broadcast
// (numpy rules, already checked) to it. The innermost dim runs as a strided loop.
template <std::size_t N, typename F>
void for_each_broadcast(const std::vector<std::int64_t>& out_dims,
                        const std::array<const std::vector<std::int64_t>*, N>& in_dims, F&& f) {
  std::size_t r = out_dims.size();
  std::int64_t total = 1;
  for (auto d : out_dims) total *= d;
  if (total == 0) return;
  std::array<std::int64_t, N> off{};
  if (r == 0) {
    f(std::int64_t{0}, off);
    return;
  }
  std::array<std::vector<std::int64_t>, N> bstride;
  for (std::size_t k = 0; k < N; ++k) {
    const auto& d = *in_dims[k];
    bstride[k].assign(r, 0);
    auto s = ::ondine::reference::detail::strides_of(d);
    std::size_t shift = r - d.size();
    for (std::size_t i = 0; i < d.size(); ++i)
      if (d[i] != 1) bstride[k][i + shift] = s[i];
  }
  std::int64_t inner = out_dims[r - 1], outer = total / inner;
  std::array<std::int64_t, N> istride;
  for (std::size_t k = 0; k < N; ++k) istride[k] = bstride[k][r - 1];
  std::vector<std::int64_t> idx(r, 0);
  std::int64_t o = 0;
  for (std::int64_t b = 0; b < outer; ++b) {
    std::array<std::int64_t, N> p = off;
    for (std::int64_t j = 0; j < inner; ++j) {
      f(o++, p);
      for (std::size_t k = 0; k < N; ++k) p[k] += istride[k];
    }
    for (std::size_t d = r - 1; d-- > 0;) {  // odometer over the outer dims
      ++idx[d];
      for (std::size_t k = 0; k < N; ++k) off[k] += bstride[k][d];
      if (idx[d] < out_dims[d]) break;
      for (std::size_t k = 0; k < N; ++k) off[k] -= bstride[k][d] * idx[d];
      idx[d] = 0;
    }
  }
}

// B reshaped for the legacy (opset < 7) broadcast=1 + axis rule; unchanged otherwise.
inline Tensor legacy_broadcast_b(const Node& n, const Tensor& a, const Tensor& b) {
  if (!types::has_legacy_axis(n)) return b;
  std::vector<std::int64_t> dims = b.dims();
  dims.resize(dims.size() + types::legacy_trailing_ones(n, a.rank(), b.rank()), 1);
  return b.reshaped(dims);
}

inline void check_type(const Node& n, std::size_t i, const Tensor& t, unsigned set) {
  if (t.dtype() == DType::String || t.dtype() == DType::Undefined)
    throw n.error("input #" + std::to_string(i) + " has unsupported element type " + std::string(dtype_name(t.dtype())));
  types::check_input_type(n, i, t.dtype(), set);
}

// --- kernel builders --------------------------------------------------------------------------------

// Elementwise unary op. make(node) returns a generic functor called with the compute value (double
// for floating types, the integer/bool itself otherwise).
template <unsigned Set, typename Make>
Kernel unary_kernel(Make make, bool bool_output = false) {
  return [make, bool_output](const Node& n, const std::vector<Tensor>& in) -> std::vector<Tensor> {
    const Tensor& x = required(n, in, 0);
    check_type(n, 0, x, Set);
    Tensor y(bool_output ? DType::Bool : x.dtype(), x.dims());
    auto f = make(n);
    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (in_set_v<T, Set>) {
        const T* px = x.data<T>();
        std::int64_t count = x.numel();
        if (bool_output) {
          bool* py = y.data<bool>();
          for (std::int64_t i = 0; i < count; ++i) py[i] = static_cast<bool>(f(load(px[i])));
        } else {
          T* py = y.data<T>();
          for (std::int64_t i = 0; i < count; ++i) py[i] = store<T>(f(load(px[i])));
        }
      }
    });
    return {y};
  };
}

// Elementwise binary op on two inputs of one type, numpy broadcast.
template <unsigned Set, typename Make>
Kernel binary_kernel(Make make, bool bool_output = false) {
  return [make, bool_output](const Node& n, const std::vector<Tensor>& in) -> std::vector<Tensor> {
    const Tensor& a = required(n, in, 0);
    Tensor b = required(n, in, 1);
    check_type(n, 0, a, Set);
    check_type(n, 1, b, Set);
    types::check_same_type(n, 0, a.dtype(), 1, b.dtype());
    b = legacy_broadcast_b(n, a, b);
    std::vector<std::int64_t> out_dims = ::ondine::reference::detail::broadcast_dims(n, a.dims(), b.dims());
    Tensor y(bool_output ? DType::Bool : a.dtype(), out_dims);
    auto f = make(n);
    dispatch_dtype(a.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (in_set_v<T, Set>) {
        const T* pa = a.data<T>();
        const T* pb = b.data<T>();
        if (bool_output) {
          bool* py = y.data<bool>();
          for_each_broadcast<2>(out_dims, {&a.dims(), &b.dims()}, [&](std::int64_t o, const auto& p) {
            py[o] = static_cast<bool>(f(load(pa[p[0]]), load(pb[p[1]])));
          });
        } else {
          T* py = y.data<T>();
          for_each_broadcast<2>(out_dims, {&a.dims(), &b.dims()}, [&](std::int64_t o, const auto& p) {
            py[o] = store<T>(f(load(pa[p[0]]), load(pb[p[1]])));
          });
        }
      }
    });
    return {y};
  };
}

// Min, Max, Sum, Mean: a fold of `combine` over any number of inputs, broadcast together; `finish`
// gets (accumulated value, input count).
template <unsigned Set, typename Combine, typename Finish>
Kernel variadic_kernel(Combine combine, Finish finish) {
  return [combine, finish](const Node& n, const std::vector<Tensor>& in) -> std::vector<Tensor> {
    if (in.empty()) throw n.error("needs at least one input");
    const Tensor& first = required(n, in, 0);
    std::vector<std::int64_t> out_dims = first.dims();
    for (std::size_t i = 0; i < in.size(); ++i) {
      const Tensor& t = required(n, in, i);
      check_type(n, i, t, Set);
      types::check_same_type(n, 0, first.dtype(), i, t.dtype());
      out_dims = ::ondine::reference::detail::broadcast_dims(n, out_dims, t.dims());
    }
    Tensor y(first.dtype(), out_dims);
    dispatch_dtype(first.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (in_set_v<T, Set>) {
        using C = compute_t<T>;
        std::vector<C> acc(static_cast<std::size_t>(y.numel()));
        const T* p0 = first.data<T>();
        for_each_broadcast<1>(out_dims, {&first.dims()},
                              [&](std::int64_t o, const auto& p) { acc[static_cast<std::size_t>(o)] = load(p0[p[0]]); });
        for (std::size_t i = 1; i < in.size(); ++i) {
          const T* pi = in[i].data<T>();
          for_each_broadcast<1>(out_dims, {&in[i].dims()}, [&](std::int64_t o, const auto& p) {
            C& a = acc[static_cast<std::size_t>(o)];
            a = static_cast<C>(combine(a, load(pi[p[0]])));
          });
        }
        T* py = y.data<T>();
        for (std::size_t o = 0; o < acc.size(); ++o) py[o] = store<T>(finish(acc[o], static_cast<C>(in.size())));
      }
    });
    return {y};
  };
}

// --- integer helpers ----------------------------------------------------------------------------------

// C-style truncating division; x / 0 is an error, MIN / -1 wraps to MIN.
template <typename C>
inline C int_div(const Node& n, C a, C b) {
  if (b == C(0)) throw n.error("integer division by zero");
  if constexpr (std::is_signed_v<C>) {
    if (b == C(-1)) return wrap_neg(a);
  }
  return static_cast<C>(a / b);
}

// Remainder: with fmod the sign of the dividend (C %), otherwise of the divisor (Python %).
template <typename C>
inline C int_mod(const Node& n, C a, C b, bool fmod) {
  if (b == C(0)) throw n.error("integer modulo by zero");
  if constexpr (std::is_signed_v<C>) {
    if (b == C(-1)) return C(0);
    C r = static_cast<C>(a % b);
    if (!fmod && r != 0 && ((r < 0) != (b < 0))) r = static_cast<C>(r + b);
    return r;
  } else {
    (void)fmod;
    return static_cast<C>(a % b);
  }
}

// Integer power by squaring, wrapping; a negative exponent truncates 1/base^-e toward zero.
template <typename B, typename E>
inline B int_pow(const Node& n, B base, E exp) {
  if constexpr (std::is_signed_v<E>) {
    if (exp < 0) {
      if (base == B(0)) throw n.error("integer zero raised to a negative power");
      if (base == B(1)) return B(1);
      if constexpr (std::is_signed_v<B>) {
        if (base == B(-1)) return (exp % 2 == 0) ? B(1) : B(-1);
      }
      return B(0);
    }
  }
  B result = 1;
  auto e = static_cast<std::uint64_t>(exp);
  while (e) {
    if (e & 1u) result = wrap_mul(result, base);
    base = wrap_mul(base, base);
    e >>= 1;
  }
  return result;
}

// --- Cast ---------------------------------------------------------------------------------------------

// Cast to bfloat16 before opset 19 truncates the float's low half, as the ONNX reference of those
// opsets does (the spec leaves the rounding open, onnx/onnx#3876); NaN stays NaN.
inline bfloat16 truncate_to_bfloat16(double d) {
  float f = to_float_round_to_odd(d);  // keeps the bits that truncation looks at
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bfloat16 out;
  out.bits = static_cast<std::uint16_t>(bits >> 16);
  if (std::isnan(f)) out.bits |= 0x40u;
  return out;
}

template <typename To, typename From>
inline To cast_element(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    return load(v) != decltype(load(v))(0);
  } else if constexpr (std::is_same_v<From, bool>) {
    return store<To>(v ? 1 : 0);
  } else if constexpr (std::is_same_v<To, float> && std::is_integral_v<From>) {
    return static_cast<float>(v);  // one rounding, not int -> double -> float
  } else {
    return store<To>(load(v));  // real -> integer saturates and truncates; integer -> integer wraps
  }
}

// --- reductions -----------------------------------------------------------------------------------------

enum class ReduceKind { Sum, Mean, Max, Min, Prod, SumSquare, L1, L2, LogSum, LogSumExp };

inline Kernel reduce_kernel(ReduceKind kind) {
  return [kind](const Node& n, const std::vector<Tensor>& in) -> std::vector<Tensor> {
    const Tensor& x = required(n, in, 0);
    if (types::reduce_takes_bool(n) && x.dtype() == DType::Bool) {
      // Opset 20 ReduceMax / ReduceMin of bool (any / all): the same reduction over 0/1 bytes.
      std::vector<Tensor> args = in;
      args[0] = Tensor(DType::UInt8, x.dims());
      for (std::int64_t i = 0; i < x.numel(); ++i) args[0].data<std::uint8_t>()[i] = x.data<bool>()[i] ? 1 : 0;
      Tensor r = reduce_kernel(kind)(n, args).at(0), y(DType::Bool, r.dims());
      for (std::int64_t i = 0; i < r.numel(); ++i) y.data<bool>()[i] = r.data<std::uint8_t>()[i] != 0;
      return {y};
    }
    check_type(n, 0, x, types::kNumericTypes);
    bool keepdims = n.attr_int("keepdims", 1) != 0;
    bool noop = n.attr_int("noop_with_empty_axes", 0) != 0;
    std::vector<std::int64_t> axes;
    if (types::reduce_axes_are_input(n)) {
      if (const Tensor* t = optional_input(in, 1)) {
        check_type(n, 1, *t, types::kSignedIntTypes);
        axes = t->to_int64s();
      }
    } else {
      axes = n.attr_ints("axes", {});
    }
    if (axes.empty() && noop) return {x.clone()};
    std::vector<bool> mask = types::reduced_dims_mask(n, axes, x.rank());
    std::vector<std::int64_t> keep_dims, out_dims;
    std::int64_t count = 1;
    for (std::size_t i = 0; i < x.rank(); ++i) {
      keep_dims.push_back(mask[i] ? 1 : x.dims()[i]);
      if (mask[i]) count *= x.dims()[i];
      if (!mask[i] || keepdims) out_dims.push_back(keep_dims.back());
    }
    Tensor y(x.dtype(), out_dims);
    auto out_size = static_cast<std::size_t>(y.numel());
    // Visits every input element with the index of the output it reduces into.
    auto visit = [&](auto&& f) { for_each_broadcast<1>(x.dims(), {&keep_dims}, [&](std::int64_t i, const auto& p) { f(i, p[0]); }); };
    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (in_set_v<T, types::kNumericTypes>) {
        const T* px = x.data<T>();
        T* py = y.data<T>();
        constexpr bool integral = std::is_integral_v<T>;
        if constexpr (integral) {
          if (kind == ReduceKind::Max || kind == ReduceKind::Min) {
            bool is_max = kind == ReduceKind::Max;
            std::vector<T> acc(out_size, is_max ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max());
            visit([&](std::int64_t i, std::int64_t o) {
              T v = px[i];
              T& a = acc[static_cast<std::size_t>(o)];
              if (is_max ? v > a : v < a) a = v;
            });
            for (std::size_t o = 0; o < out_size; ++o) py[o] = acc[o];
            return;
          }
          if (kind != ReduceKind::L2 && kind != ReduceKind::LogSum && kind != ReduceKind::LogSumExp) {
            // Exact, wrapping: sums and products in 64 bits, then truncated to T.
            std::vector<std::uint64_t> acc(out_size, kind == ReduceKind::Prod ? 1u : 0u);
            visit([&](std::int64_t i, std::int64_t o) {
              auto v = static_cast<std::uint64_t>(px[i]);
              std::uint64_t& a = acc[static_cast<std::size_t>(o)];
              switch (kind) {
                case ReduceKind::Prod: a *= v; break;
                case ReduceKind::SumSquare: a += v * v; break;
                case ReduceKind::L1: a += is_negative(px[i]) ? 0 - v : v; break;
                default: a += v; break;
              }
            });
            for (std::size_t o = 0; o < out_size; ++o) {
              if (kind == ReduceKind::Mean) {
                if (count == 0) py[o] = T(0);
                else if constexpr (std::is_signed_v<T>) py[o] = static_cast<T>(static_cast<std::int64_t>(acc[o]) / count);
                else py[o] = static_cast<T>(acc[o] / static_cast<std::uint64_t>(count));
              } else {
                py[o] = static_cast<T>(acc[o]);
              }
            }
            return;
          }
        }
        // Floating types (and the integer L2/LogSum/LogSumExp): in double.
        const double neg_inf = -std::numeric_limits<double>::infinity();
        std::vector<double> acc(out_size, 0.0), peak;
        if (kind == ReduceKind::Prod) std::fill(acc.begin(), acc.end(), 1.0);
        if (kind == ReduceKind::Max) std::fill(acc.begin(), acc.end(), neg_inf);
        if (kind == ReduceKind::Min) std::fill(acc.begin(), acc.end(), -neg_inf);
        if (kind == ReduceKind::LogSumExp) {  // shift by the max so exp cannot overflow
          peak.assign(out_size, neg_inf);
          visit([&](std::int64_t i, std::int64_t o) {
            double v = static_cast<double>(load(px[i]));
            double& m = peak[static_cast<std::size_t>(o)];
            if (!std::isnan(m) && (std::isnan(v) || v > m)) m = v;
          });
        }
        visit([&](std::int64_t i, std::int64_t o) {
          double v = static_cast<double>(load(px[i]));
          double& a = acc[static_cast<std::size_t>(o)];
          switch (kind) {
            case ReduceKind::Max:
              if (!std::isnan(a) && (std::isnan(v) || v > a)) a = v;
              break;
            case ReduceKind::Min:
              if (!std::isnan(a) && (std::isnan(v) || v < a)) a = v;
              break;
            case ReduceKind::Prod: a *= v; break;
            case ReduceKind::SumSquare: case ReduceKind::L2: a += v * v; break;
            case ReduceKind::L1: a += std::fabs(v); break;
            case ReduceKind::LogSumExp: {
              double m = peak[static_cast<std::size_t>(o)];
              if (std::isfinite(m)) a += std::exp(v - m);
              break;
            }
            default: a += v; break;
          }
        });
        for (std::size_t o = 0; o < out_size; ++o) {
          double r = acc[o];
          switch (kind) {
            case ReduceKind::Mean: r = r / static_cast<double>(count); break;
            case ReduceKind::L2: r = std::sqrt(r); break;
            case ReduceKind::LogSum: r = std::log(r); break;
            case ReduceKind::LogSumExp: r = std::isfinite(peak[o]) ? peak[o] + std::log(r) : peak[o]; break;
            default: break;
          }
          py[o] = store<T>(r);
        }
      }
    });
    return {y};
  };
}

inline Kernel arg_reduce_kernel(bool is_max) {
  return [is_max](const Node& n, const std::vector<Tensor>& in) -> std::vector<Tensor> {
    const Tensor& x = required(n, in, 0);
    check_type(n, 0, x, types::kNumericTypes);
    auto rank = static_cast<std::int64_t>(x.rank());
    auto axis = static_cast<std::size_t>(::ondine::reference::detail::normalize_axis(n, n.attr_int("axis", 0), rank));
    bool keepdims = n.attr_int("keepdims", 1) != 0;
    bool last = n.attr_int("select_last_index", 0) != 0;
    std::int64_t len = x.dims()[axis], outer = 1, inner = 1;
    for (std::size_t i = 0; i < axis; ++i) outer *= x.dims()[i];
    for (std::size_t i = axis + 1; i < x.rank(); ++i) inner *= x.dims()[i];
    std::vector<std::int64_t> out_dims;
    for (std::size_t i = 0; i < x.rank(); ++i) {
      if (i != axis) out_dims.push_back(x.dims()[i]);
      else if (keepdims) out_dims.push_back(1);
    }
    Tensor y(DType::Int64, out_dims);
    if (len == 0 && y.numel() > 0) throw n.error("cannot take " + n.op_type() + " along an empty axis");
    std::int64_t* py = y.data<std::int64_t>();
    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (in_set_v<T, types::kNumericTypes>) {
        const T* px = x.data<T>();
        for (std::int64_t o = 0; o < outer; ++o)
          for (std::int64_t k = 0; k < inner; ++k) {
            const T* base = px + o * len * inner + k;
            auto best = load(base[0]);
            std::int64_t best_i = 0;
            for (std::int64_t j = 1; j < len; ++j) {
              auto v = load(base[j * inner]);
              bool better = is_max ? (last ? v >= best : v > best) : (last ? v <= best : v < best);
              if (better) {
                best = v;
                best_i = j;
              }
            }
            py[o * inner + k] = best_i;
          }
      }
    });
    return {y};
  };
}

// --- other kernels ----------------------------------------------------------------------------------------

// A number as Cast writes it into a string: floating values in the shortest form that reads back to the
// same value of their type (std::to_chars; what numpy's str gives), NaN / INF / -INF as ONNX spells them;
// integers in decimal, bools as 1 and 0.
template <typename T>
std::string number_to_string(T v) {
  if constexpr (std::is_integral_v<T>) {
    return std::to_string(static_cast<std::conditional_t<std::is_signed_v<T>, long long, unsigned long long>>(v));
  } else {
    using F = std::conditional_t<std::is_same_v<T, double>, double, float>;  // float16/bfloat16 via float
    const F f = static_cast<F>(static_cast<float>(v));
    if (std::isnan(f)) return "NaN";
    if (std::isinf(f)) return f > 0 ? "INF" : "-INF";
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, f);
    return std::string(buf, r.ptr);
  }
}

// A string parsed as Cast reads it: a decimal or scientific number, or NaN / INF / +INF / -INF (any case).
inline double string_to_number(const Node& n, const std::string& s) {
  const char* begin = s.c_str();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin || *end != '\0') throw n.error("cannot read '" + s + "' as a number");
  return v;
}

// x converted to `to` (Cast, and CastLike with the type of its second input).
inline Tensor cast_to(const Node& n, const Tensor& x, DType to) {
  if (x.dtype() == DType::String && to == DType::String) return x;
  if (x.dtype() == DType::String) {
    if (!x.has_strings()) throw n.error("the string input holds no strings");
    Tensor y(to, x.dims());
    dispatch_dtype(to, [&](auto to_tag) {
      using To = typename decltype(to_tag)::type;
      To* py = y.data<To>();
      for (std::size_t i = 0; i < x.strings().size(); ++i) py[i] = cast_element<To>(string_to_number(n, x.strings()[i]));
    });
    return y;
  }
  if (to == DType::String) {
    std::vector<std::string> out(static_cast<std::size_t>(x.numel()));
    dispatch_dtype(x.dtype(), [&](auto from_tag) {
      using From = typename decltype(from_tag)::type;
      const From* px = x.data<From>();
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = number_to_string(px[i]);
    });
    return Tensor::from_strings(x.dims(), std::move(out));
  }
  Tensor y(to, x.dims());
  std::int64_t count = x.numel();
  dispatch_dtype(x.dtype(), [&](auto from_tag) {
    using From = typename decltype(from_tag)::type;
    const From* px = x.data<From>();
    dispatch_dtype(to, [&](auto to_tag) {
      using To = typename decltype(to_tag)::type;
      To* py = y.data<To>();
      if constexpr (std::is_same_v<To, bfloat16> && !std::is_same_v<From, bool>) {
        if (n.opset() > 0 && n.opset() < 19) {
          for (std::int64_t i = 0; i < count; ++i) py[i] = truncate_to_bfloat16(static_cast<double>(load(px[i])));
          return;
        }
      }
      for (std::int64_t i = 0; i < count; ++i) py[i] = cast_element<To>(px[i]);
    });
  });
  return y;
}

inline std::vector<Tensor> cast_kernel(const Node& n, const std::vector<Tensor>& in) {
  return {cast_to(n, required(n, in, 0), types::cast_target(n))};
}

inline std::vector<Tensor> cast_like_kernel(const Node& n, const std::vector<Tensor>& in) {
  return {cast_to(n, required(n, in, 0), required(n, in, 1).dtype())};
}

// Det: the determinant of each [M, M] matrix of [*, M, M], by LU decomposition with partial pivoting
// in double (a zero pivot column gives 0).
inline std::vector<Tensor> det_kernel(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required(n, in, 0);
  check_type(n, 0, x, types::kFloatTypes);
  if (x.rank() < 2 || x.dims()[x.rank() - 1] != x.dims()[x.rank() - 2])
    throw n.error("input must be [*, M, M], got " + dims_str(x.dims()));
  const std::int64_t m = x.dims().back();
  std::vector<std::int64_t> out_dims(x.dims().begin(), x.dims().end() - 2);
  Tensor y(x.dtype(), out_dims);
  const std::int64_t count = y.numel();
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (is_real_v<T>) {
      const T* px = x.data<T>();
      T* py = y.data<T>();
      std::vector<double> a(static_cast<std::size_t>(m * m));
      auto at = [&](std::int64_t r, std::int64_t j) -> double& { return a[static_cast<std::size_t>(r * m + j)]; };
      for (std::int64_t k = 0; k < count; ++k) {
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = load(px[static_cast<std::size_t>(k * m * m) + i]);
        double det = 1;
        for (std::int64_t c = 0; c < m && det != 0; ++c) {
          std::int64_t pivot = c;
          for (std::int64_t r = c + 1; r < m; ++r)
            if (std::fabs(at(r, c)) > std::fabs(at(pivot, c))) pivot = r;
          const double p = at(pivot, c);
          if (p == 0) {
            det = 0;
            break;
          }
          if (pivot != c) {
            for (std::int64_t j = 0; j < m; ++j) std::swap(at(pivot, j), at(c, j));
            det = -det;
          }
          det *= p;
          for (std::int64_t r = c + 1; r < m; ++r) {
            const double f = at(r, c) / p;
            for (std::int64_t j = c + 1; j < m; ++j) at(r, j) -= f * at(c, j);
          }
        }
        py[k] = store<T>(det);
      }
    }
  });
  return {y};
}

inline std::vector<Tensor> clip_kernel(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required(n, in, 0);
  check_type(n, 0, x, types::kNumericTypes);
  Tensor y(x.dtype(), x.dims());
  bool bounds_are_inputs = n.opset() == 0 || n.opset() >= 11;
  const Tensor* lo_t = bounds_are_inputs ? optional_input(in, 1) : nullptr;
  const Tensor* hi_t = bounds_are_inputs ? optional_input(in, 2) : nullptr;
  for (std::size_t i = 1; i <= 2; ++i)
    if (const Tensor* t = i == 1 ? lo_t : hi_t) {
      types::check_same_type(n, 0, x.dtype(), i, t->dtype());
      if (t->numel() != 1)
        throw n.error(std::string(i == 1 ? "min" : "max") + " must be a scalar, got shape " + dims_str(t->dims()));
    }
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (in_set_v<T, types::kNumericTypes>) {
      using C = compute_t<T>;
      C lo, hi;
      if constexpr (is_real_v<T>) {
        lo = -std::numeric_limits<double>::infinity();
        hi = std::numeric_limits<double>::infinity();
      } else {
        lo = std::numeric_limits<T>::lowest();
        hi = std::numeric_limits<T>::max();
      }
      if (bounds_are_inputs) {
        if (lo_t) lo = load(lo_t->data<T>()[0]);
        if (hi_t) hi = load(hi_t->data<T>()[0]);
      } else {  // opset < 11: float attributes, defaulting to the float range
        lo = static_cast<C>(store<T>(n.attr_float("min", std::numeric_limits<float>::lowest())));
        hi = static_cast<C>(store<T>(n.attr_float("max", std::numeric_limits<float>::max())));
      }
      const T* px = x.data<T>();
      T* py = y.data<T>();
      // min(hi, max(x, lo)): when lo > hi everything becomes hi; NaN stays NaN.
      for (std::int64_t i = 0; i < x.numel(); ++i) {
        C v = load(px[i]);
        if (v < lo) v = lo;
        if (v > hi) v = hi;
        py[i] = store<T>(v);
      }
    }
  });
  return {y};
}

inline std::vector<Tensor> where_kernel(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& c = required(n, in, 0);
  const Tensor& a = required(n, in, 1);
  const Tensor& b = required(n, in, 2);
  check_type(n, 0, c, types::kBoolType);
  check_type(n, 1, a, types::kAllTypes);
  types::check_same_type(n, 1, a.dtype(), 2, b.dtype());
  using ::ondine::reference::detail::broadcast_dims;
  std::vector<std::int64_t> out_dims = broadcast_dims(n, broadcast_dims(n, c.dims(), a.dims()), b.dims());
  Tensor y(a.dtype(), out_dims);
  const bool* pc = c.data<bool>();
  dispatch_dtype(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* py = y.data<T>();
    for_each_broadcast<3>(out_dims, {&c.dims(), &a.dims(), &b.dims()},
                          [&](std::int64_t o, const auto& p) { py[o] = pc[p[0]] ? pa[p[1]] : pb[p[2]]; });
  });
  return {y};
}

inline std::vector<Tensor> pow_kernel(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& a = required(n, in, 0);
  Tensor b = required(n, in, 1);
  check_type(n, 0, a, types::kNumericTypes);
  check_type(n, 1, b, types::kNumericTypes);
  b = legacy_broadcast_b(n, a, b);
  std::vector<std::int64_t> out_dims = ::ondine::reference::detail::broadcast_dims(n, a.dims(), b.dims());
  Tensor y(a.dtype(), out_dims);
  dispatch_dtype(a.dtype(), [&](auto base_tag) {
    using B = typename decltype(base_tag)::type;
    if constexpr (in_set_v<B, types::kNumericTypes>) {
      dispatch_dtype(b.dtype(), [&](auto exp_tag) {
        using E = typename decltype(exp_tag)::type;
        if constexpr (in_set_v<E, types::kNumericTypes>) {
          const B* pa = a.data<B>();
          const E* pb = b.data<E>();
          B* py = y.data<B>();
          for_each_broadcast<2>(out_dims, {&a.dims(), &b.dims()}, [&](std::int64_t o, const auto& p) {
            if constexpr (std::is_integral_v<B> && std::is_integral_v<E>) {
              py[o] = int_pow(n, pa[p[0]], pb[p[1]]);
            } else {
              py[o] = store<B>(std::pow(static_cast<double>(load(pa[p[0]])), static_cast<double>(load(pb[p[1]]))));
            }
          });
        }
      });
    }
  });
  return {y};
}

inline std::vector<Tensor> prelu_kernel(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required(n, in, 0);
  Tensor slope = required(n, in, 1);
  check_type(n, 0, x, types::kNumericTypes);
  types::check_same_type(n, 0, x.dtype(), 1, slope.dtype());
  if (types::prelu_legacy_channels(n, x.rank(), slope.rank())) {
    std::vector<std::int64_t> dims = slope.dims();
    dims.resize(x.rank() - 1, 1);
    slope = slope.reshaped(dims);
  }
  if (::ondine::reference::detail::broadcast_dims(n, x.dims(), slope.dims()) != x.dims())
    throw n.error("slope of shape " + dims_str(slope.dims()) + " does not broadcast to X of shape " + dims_str(x.dims()));
  Tensor y(x.dtype(), x.dims());
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (in_set_v<T, types::kNumericTypes>) {
      const T* px = x.data<T>();
      const T* ps = slope.data<T>();
      T* py = y.data<T>();
      for_each_broadcast<2>(x.dims(), {&x.dims(), &slope.dims()}, [&](std::int64_t o, const auto& p) {
        auto v = load(px[p[0]]);
        py[o] = is_negative(v) ? store<T>(wrap_mul(v, load(ps[p[1]]))) : px[p[0]];
      });
    }
  });
  return {y};
}

// Per-tensor, per-axis or blocked quantization parameters: for element i of X, its index in the scale.
struct QuantLayout {
  bool per_axis = false;
  std::int64_t inner = 1, channels = 1;
  std::int64_t block = 0, blocks = 1;  // blocked: `block` elements of the axis share a scale; `blocks` per axis
  std::size_t channel(std::int64_t i) const {
    if (block > 0) {
      const std::int64_t outer = i / (inner * channels), c = (i / inner) % channels, r = i % inner;
      return static_cast<std::size_t>((outer * blocks + c / block) * inner + r);
    }
    return per_axis ? static_cast<std::size_t>((i / inner) % channels) : 0;
  }
};
inline QuantLayout quant_layout(const Node& n, const Tensor& x, const Tensor& scale, const Tensor* zero_point) {
  Shape zp_shape = zero_point ? zero_point->shape() : Shape();
  types::check_quant_params(n, x.shape(), scale.shape(), zero_point ? &zp_shape : nullptr);
  QuantLayout q;
  if (zero_point && zero_point->numel() != scale.numel())
    throw n.error("zero point of shape " + dims_str(zero_point->dims()) + " does not match scale of shape " +
                  dims_str(scale.dims()));
  const std::int64_t block = n.attr_int("block_size", 0);
  if (block == 0 && scale.numel() == 1) return q;
  if (scale.numel() == 0 && x.numel() > 0) throw n.error("scale is empty");
  auto axis = static_cast<std::size_t>(
      ::ondine::reference::detail::normalize_axis(n, n.attr_int("axis", 1), static_cast<std::int64_t>(x.rank())));
  if (block == 0 && x.dims()[axis] != scale.numel())
    throw n.error("per-axis scale of shape " + dims_str(scale.dims()) + " does not match X of shape " + dims_str(x.dims()));
  q.per_axis = true;
  q.channels = x.dims()[axis];
  for (std::size_t i = axis + 1; i < x.rank(); ++i) q.inner *= x.dims()[i];
  if (block > 0) {  // check_quant_params checked the scale's shape
    q.block = block;
    q.blocks = scale.dims()[axis];
  }
  return q;
}

inline std::vector<Tensor> quantize_kernel(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required(n, in, 0);
  const Tensor& scale = required(n, in, 1);
  const Tensor* zp = optional_input(in, 2);
  if (x.dtype() != DType::Int32) check_type(n, 0, x, types::kFloatTypes);
  check_type(n, 1, scale, types::kFloatTypes);
  const DType out = types::quantize_output_type(n, zp ? zp->dtype() : DType::Undefined);
  QuantLayout q = quant_layout(n, x, scale, zp);
  std::vector<double> scales(static_cast<std::size_t>(scale.numel())), zps(scales.size(), 0.0);
  for (std::size_t i = 0; i < scales.size(); ++i) {
    scales[i] = scale.at_double(i);
    if (zp) zps[i] = zp->at_double(i);
  }
  Tensor y(out, x.dims());
  const double lo = out == DType::Int4 ? -8.0 : 0.0, hi = out == DType::Int4 ? 7.0 : 15.0;  // 4-bit ranges
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, std::int32_t> || is_real_v<T>) {
      const T* px = x.data<T>();
      dispatch_dtype(out, [&](auto out_tag) {
        using Q = typename decltype(out_tag)::type;
        if constexpr (std::is_same_v<Q, std::uint8_t> || std::is_same_v<Q, std::int8_t>) {
          Q* py = y.data<Q>();
          for (std::int64_t i = 0; i < x.numel(); ++i) {
            std::size_t c = q.channel(i);
            double rounded;
            if constexpr (std::is_same_v<T, float>) {  // float32 division, as the ONNX definition computes it
              rounded = static_cast<double>(std::nearbyint(px[i] / static_cast<float>(scales[c])));
            } else {
              rounded = std::nearbyint(static_cast<double>(load(px[i])) / scales[c]);
            }
            if (is_int4(out)) py[i] = static_cast<Q>(std::min(hi, std::max(lo, rounded + zps[c])));
            else py[i] = saturate_from_double<Q>(rounded + zps[c]);  // nearbyint: half to even
          }
        }
      });
    }
  });
  return {y};
}

inline std::vector<Tensor> dequantize_kernel(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required(n, in, 0);
  const Tensor& scale = required(n, in, 1);
  const Tensor* zp = optional_input(in, 2);
  check_type(n, 0, x, types::kIntTypes | types::kInt4Types);
  check_type(n, 1, scale, types::kFloatTypes);
  if (zp) types::check_same_type(n, 0, x.dtype(), 2, zp->dtype());
  QuantLayout q = quant_layout(n, x, scale, zp);
  std::vector<double> scales(static_cast<std::size_t>(scale.numel())), zps(scales.size(), 0.0);
  for (std::size_t i = 0; i < scales.size(); ++i) {
    scales[i] = scale.at_double(i);
    if (zp) zps[i] = zp->at_double(i);
  }
  Tensor y(scale.dtype(), x.dims());
  dispatch_dtype(scale.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    if constexpr (is_real_v<S>) {
      S* py = y.data<S>();
      for (std::int64_t i = 0; i < x.numel(); ++i) {
        std::size_t c = q.channel(i);
        double v = x.at_double(static_cast<std::size_t>(i));
        if constexpr (std::is_same_v<S, float>) {  // float32 arithmetic, as the ONNX definition computes it
          py[i] = (static_cast<float>(v) - static_cast<float>(zps[c])) * static_cast<float>(scales[c]);
        } else {
          py[i] = store<S>((v - zps[c]) * scales[c]);
        }
      }
    }
  });
  return {y};
}

// --- unary functors -----------------------------------------------------------------------------------

// Wraps a double -> double function as a unary kernel for floating types.
template <typename Fn>
Kernel float_unary(Fn fn) {
  return unary_kernel<types::kFloatTypes>([fn](const Node& n) {
    return [fn, &n](double v) { return fn(n, v); };
  });
}

inline double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  double e = std::exp(x);
  return e / (1.0 + e);
}

}  // namespace detail::math

inline void register_math_kernels(KernelTable& table) {
  using namespace detail::math;
  namespace ts = ::ondine::infer::detail_math;
  auto attr = [](const Node& n, const char* name, double def) {
    return static_cast<double>(n.attr_float(name, static_cast<float>(def)));
  };

  // Floating-point activations and functions.
  table["Sigmoid"] = float_unary([](const Node&, double x) { return sigmoid(x); });
  table["HardSigmoid"] = float_unary([attr](const Node& n, double x) {
    return std::max(0.0, std::min(1.0, attr(n, "alpha", 0.2) * x + attr(n, "beta", 0.5)));
  });
  table["HardSwish"] = float_unary([](const Node&, double x) { return x * std::max(0.0, std::min(1.0, x / 6.0 + 0.5)); });
  table["Tanh"] = float_unary([](const Node&, double x) { return std::tanh(x); });
  table["Erf"] = float_unary([](const Node&, double x) { return std::erf(x); });
  table["Sqrt"] = float_unary([](const Node&, double x) { return std::sqrt(x); });
  table["Exp"] = float_unary([](const Node&, double x) { return std::exp(x); });
  table["Log"] = float_unary([](const Node&, double x) { return std::log(x); });
  table["Reciprocal"] = float_unary([](const Node&, double x) { return 1.0 / x; });
  table["Floor"] = float_unary([](const Node&, double x) { return std::floor(x); });
  table["Ceil"] = float_unary([](const Node&, double x) { return std::ceil(x); });
  table["Round"] = float_unary([](const Node&, double x) { return std::nearbyint(x); });  // half to even
  table["LeakyRelu"] = float_unary([attr](const Node& n, double x) { return x < 0 ? attr(n, "alpha", 0.01) * x : x; });
  table["Elu"] = float_unary([attr](const Node& n, double x) { return x < 0 ? attr(n, "alpha", 1.0) * std::expm1(x) : x; });
  table["Selu"] = float_unary([attr](const Node& n, double x) {
    double alpha = attr(n, "alpha", 1.67326319217681884765625), gamma = attr(n, "gamma", 1.05070102214813232421875);
    return gamma * (x <= 0 ? alpha * std::expm1(x) : x);
  });
  table["Celu"] = float_unary([attr](const Node& n, double x) {
    double alpha = attr(n, "alpha", 1.0);
    return std::max(0.0, x) + std::min(0.0, alpha * std::expm1(x / alpha));
  });
  table["Softplus"] = float_unary([](const Node&, double x) {
    return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
  });
  table["Softsign"] = float_unary([](const Node&, double x) { return x / (1.0 + std::fabs(x)); });
  table["ThresholdedRelu"] = float_unary([attr](const Node& n, double x) { return x > attr(n, "alpha", 1.0) ? x : 0.0; });
  table["Sin"] = float_unary([](const Node&, double x) { return std::sin(x); });
  table["Cos"] = float_unary([](const Node&, double x) { return std::cos(x); });
  table["Tan"] = float_unary([](const Node&, double x) { return std::tan(x); });
  table["Asin"] = float_unary([](const Node&, double x) { return std::asin(x); });
  table["Acos"] = float_unary([](const Node&, double x) { return std::acos(x); });
  table["Atan"] = float_unary([](const Node&, double x) { return std::atan(x); });
  table["Sinh"] = float_unary([](const Node&, double x) { return std::sinh(x); });
  table["Cosh"] = float_unary([](const Node&, double x) { return std::cosh(x); });
  table["Asinh"] = float_unary([](const Node&, double x) { return std::asinh(x); });
  table["Acosh"] = float_unary([](const Node&, double x) { return std::acosh(x); });
  table["Atanh"] = float_unary([](const Node&, double x) { return std::atanh(x); });
  table["IsNaN"] = unary_kernel<ts::kFloatTypes>(
      [](const Node&) { return [](double x) { return std::isnan(x); }; }, true);
  table["IsInf"] = unary_kernel<ts::kFloatTypes>(
      [](const Node& n) {
        bool neg = n.attr_int("detect_negative", 1) != 0, pos = n.attr_int("detect_positive", 1) != 0;
        return [neg, pos](double x) { return std::isinf(x) && (x < 0 ? neg : pos); };
      },
      true);

  // Unary ops on integers too.
  table["Relu"] = unary_kernel<ts::kSignedNumericTypes>([](const Node&) {
    return [](auto x) { return x < decltype(x)(0) ? decltype(x)(0) : x; };
  });
  table["Neg"] = unary_kernel<ts::kSignedNumericTypes>([](const Node&) { return [](auto x) { return wrap_neg(x); }; });
  table["Abs"] = unary_kernel<ts::kNumericTypes>([](const Node&) {
    return [](auto x) {
      using C = decltype(x);
      if constexpr (std::is_unsigned_v<C>) return x;
      else return x < C(0) ? wrap_neg(x) : x;
    };
  });
  table["Sign"] = unary_kernel<ts::kNumericTypes>([](const Node&) {
    return [](auto x) {
      using C = decltype(x);
      if constexpr (std::is_floating_point_v<C>) {
        if (std::isnan(x)) return x;
      }
      return static_cast<C>(x > C(0) ? 1 : (is_negative(x) ? -1 : 0));
    };
  });
  table["Shrink"] = unary_kernel<ts::kNumericTypes>([attr](const Node& n) {
    const double lambd = attr(n, "lambd", 0.5), bias = attr(n, "bias", 0.0);
    return [lambd, bias](auto x) {  // in double for integers too: lambd and bias are floats
      const auto v = static_cast<double>(x);
      return v < -lambd ? v + bias : v > lambd ? v - bias : 0.0;
    };
  });
  table["Not"] = unary_kernel<ts::kBoolType>([](const Node&) { return [](bool x) { return !x; }; });

  // Binary arithmetic.
  table["Add"] = binary_kernel<ts::kNumericTypes>([](const Node&) { return [](auto a, auto b) { return wrap_add(a, b); }; });
  table["Sub"] = binary_kernel<ts::kNumericTypes>([](const Node&) { return [](auto a, auto b) { return wrap_sub(a, b); }; });
  table["Mul"] = binary_kernel<ts::kNumericTypes>([](const Node&) { return [](auto a, auto b) { return wrap_mul(a, b); }; });
  table["Div"] = binary_kernel<ts::kNumericTypes>([](const Node& n) {
    return [&n](auto a, auto b) {
      if constexpr (std::is_integral_v<decltype(a)>) return int_div(n, a, b);
      else return a / b;
    };
  });
  table["Mod"] = binary_kernel<ts::kNumericTypes>([](const Node& n) {
    bool fmod = n.attr_int("fmod", 0) != 0;
    return [&n, fmod](auto a, auto b) {
      if constexpr (std::is_integral_v<decltype(a)>) {
        return int_mod(n, a, b, fmod);
      } else {
        if (!fmod) throw n.error("fmod must be 1 for floating-point inputs");
        return std::fmod(a, b);
      }
    };
  });
  table["BitShift"] = binary_kernel<ts::kUnsignedIntTypes>([](const Node& n) {
    std::string dir = n.attr_string("direction");
    if (dir != "LEFT" && dir != "RIGHT") throw n.error("direction must be \"LEFT\" or \"RIGHT\", not \"" + dir + "\"");
    bool left = dir == "LEFT";
    return [left](auto a, auto b) {
      using C = decltype(a);
      if (b >= C(sizeof(C) * 8)) return C(0);  // shifting out every bit (a C++ shift would be undefined)
      return static_cast<C>(left ? static_cast<std::uint64_t>(a) << b : static_cast<std::uint64_t>(a) >> b);
    };
  });
  table["Pow"] = pow_kernel;
  table["PRelu"] = prelu_kernel;

  // Comparisons and logic (bool results).
  table["Equal"] = binary_kernel<ts::kAllTypes>([](const Node&) { return [](auto a, auto b) { return a == b; }; }, true);
  table["Less"] = binary_kernel<ts::kNumericTypes>([](const Node&) { return [](auto a, auto b) { return a < b; }; }, true);
  table["Greater"] = binary_kernel<ts::kNumericTypes>([](const Node&) { return [](auto a, auto b) { return a > b; }; }, true);
  table["LessOrEqual"] =
      binary_kernel<ts::kNumericTypes>([](const Node&) { return [](auto a, auto b) { return a <= b; }; }, true);
  table["GreaterOrEqual"] =
      binary_kernel<ts::kNumericTypes>([](const Node&) { return [](auto a, auto b) { return a >= b; }; }, true);
  table["And"] = binary_kernel<ts::kBoolType>([](const Node&) { return [](bool a, bool b) { return a && b; }; }, true);
  table["Or"] = binary_kernel<ts::kBoolType>([](const Node&) { return [](bool a, bool b) { return a || b; }; }, true);
  table["Xor"] = binary_kernel<ts::kBoolType>([](const Node&) { return [](bool a, bool b) { return a != b; }; }, true);

  // Variadic.
  auto same = [](auto a, auto) { return a; };
  table["Max"] = variadic_kernel<ts::kNumericTypes>(
      [](auto a, auto b) {
        if constexpr (std::is_floating_point_v<decltype(a)>) {
          if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
        }
        return a < b ? b : a;
      },
      same);
  table["Min"] = variadic_kernel<ts::kNumericTypes>(
      [](auto a, auto b) {
        if constexpr (std::is_floating_point_v<decltype(a)>) {
          if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
        }
        return b < a ? b : a;
      },
      same);
  table["Sum"] = variadic_kernel<ts::kNumericTypes>([](auto a, auto b) { return wrap_add(a, b); }, same);
  table["Mean"] = variadic_kernel<ts::kFloatTypes>([](auto a, auto b) { return wrap_add(a, b); },
                                                     [](auto a, auto count) { return a / count; });

  table["Where"] = where_kernel;
  table["Clip"] = clip_kernel;
  table["Cast"] = cast_kernel;
  table["CastLike"] = cast_like_kernel;
  table["Det"] = det_kernel;
  table["ReduceSum"] = reduce_kernel(ReduceKind::Sum);
  table["ReduceMean"] = reduce_kernel(ReduceKind::Mean);
  table["ReduceMax"] = reduce_kernel(ReduceKind::Max);
  table["ReduceMin"] = reduce_kernel(ReduceKind::Min);
  table["ReduceProd"] = reduce_kernel(ReduceKind::Prod);
  table["ReduceSumSquare"] = reduce_kernel(ReduceKind::SumSquare);
  table["ReduceL1"] = reduce_kernel(ReduceKind::L1);
  table["ReduceL2"] = reduce_kernel(ReduceKind::L2);
  table["ReduceLogSum"] = reduce_kernel(ReduceKind::LogSum);
  table["ReduceLogSumExp"] = reduce_kernel(ReduceKind::LogSumExp);
  table["ArgMax"] = arg_reduce_kernel(true);
  table["ArgMin"] = arg_reduce_kernel(false);
  table["QuantizeLinear"] = quantize_kernel;
  table["DequantizeLinear"] = dequantize_kernel;
}

}  // namespace ondine::reference
