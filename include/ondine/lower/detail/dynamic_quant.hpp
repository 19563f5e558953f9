// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/dynamic_quant.hpp - dynamic quantization compiled: DynamicQuantizeLinear as
// Ondine's own two-pass kernel, and ondine.DynQMatMul / ondine.DynQConv (passes/fuse_dynamic_qmatmul.hpp,
// fuse_dynamic_qconv.hpp) as one oneDNN matmul or convolution whose output scales and source zero point
// are run-time arguments, filled on every call from the DynamicQuantizeLinear results.
//
// The products run in int8 (u8 x s8, s32 sums) where that is exact: centred weights that fit int8,
// and either VNNI or weights within [-64, 64] (without VNNI oneDNN adds pairs of u8 x s8 products in
// saturating 16 bits). A convolution (1-D to 3-D) or a matmul whose centred weights do not fit int8 (uint8
// weights with an asymmetric zero point span up to 255 values around it) still runs in int8 with VNNI:
// each output channel's weights shifted by k[c] into int8, and k[c] times the window (matmul: row) sum
// of the centred source added back (Ondine's kernel writes it into the output, the primitive's sum
// post-op adds its products to it). Else on float32 kernels over the same integers: the u8 source
// centred on its zero point by a reorder, the centred weights as floats. Each product and sum of the
// integers is exact in float32 up to 2^24, so all forms compute the same numbers (to float rounding beyond that).
//
// All compute what the reference kernels compute, in the same float32 operations: x / scale (a
// division, as ONNX writes it, not a multiplication by 1 / scale), round half to even, the zero point
// added after rounding; the product's float(acc) * (a_scale * w_scale[c]) + B[c]. So compiled and
// reference runs agree to the bit on the quantized values and to float rounding on the products.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/infer/quantized.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"
#include "ondine/lower/detail/quantized.hpp"
#include "ondine/lower/isa.hpp"

namespace ondine::lower::detail {

namespace dynq {

struct Range {
  float lo = 0.0f, hi = 0.0f;  // widened to include 0, as DynamicQuantizeLinear's range is
  bool finite = true;
};

// x * 0 is 0 for every finite x and NaN for NaN and +-Inf: one multiply-add per vector finds them.
inline Range range_scalar(const float* x, std::int64_t begin, std::int64_t end) {
  Range r;
  float poison = 0.0f;
  for (std::int64_t i = begin; i < end; ++i) {
    r.lo = std::min(r.lo, x[i]);
    r.hi = std::max(r.hi, x[i]);
    poison += x[i] * 0.0f;
  }
  r.finite = poison == 0.0f;
  return r;
}

inline std::uint8_t quantize_scalar(float x, float scale, float zero_point) {
  float v = std::nearbyint(x / scale) + zero_point;  // ties to even (the default rounding mode)
  return static_cast<std::uint8_t>(std::min(255.0f, std::max(0.0f, v)));
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

__attribute__((target("avx512f"))) inline Range range_avx512(const float* x, std::int64_t begin, std::int64_t end) {
  __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps(), poison = _mm512_setzero_ps();
  const __m512 zero = _mm512_setzero_ps();
  std::int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    lo = _mm512_min_ps(lo, v);
    hi = _mm512_max_ps(hi, v);
    poison = _mm512_fmadd_ps(v, zero, poison);
  }
  Range r = range_scalar(x, i, end);
  alignas(64) float l[16], h[16], p[16];  // (GCC 12 warns inside _mm512_reduce_*_ps)
  _mm512_store_ps(l, lo);
  _mm512_store_ps(h, hi);
  _mm512_store_ps(p, poison);
  for (int j = 0; j < 16; ++j) {
    r.lo = std::min(r.lo, l[j]);
    r.hi = std::max(r.hi, h[j]);
    r.finite = r.finite && p[j] == 0.0f;
  }
  return r;
}

__attribute__((target("avx512f"))) inline void quantize_avx512(const float* x, std::uint8_t* y, std::int64_t begin,
                                                               std::int64_t end, float scale, float zero_point) {
  const __m512 s = _mm512_set1_ps(scale), zp = _mm512_set1_ps(zero_point), lo = _mm512_setzero_ps(),
               hi = _mm512_set1_ps(255.0f);
  std::int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __m512 v = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + i), s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(v, zp), lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(v)));
  }
  for (; i < end; ++i) y[i] = quantize_scalar(x[i], scale, zero_point);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace dynq

// DynamicQuantizeLinear: x f32 (any shape, row-major) -> y u8, scale f32 [], zero point u8 []. One pass
// for the range, one to quantize; both split over OpenMP's team above 16K elements. NaN or Inf in x is
// an ondine::Error naming the node and the first such index, as on the reference executor.
class DynamicQuantizeStep : public runtime::Step {
 public:
  DynamicQuantizeStep(runtime::StepInfo info, const Node* node, SlotId x, SlotId y, SlotId scale, SlotId zero_point,
                      std::int64_t count, bool avx512)
      : Step(std::move(info), {x}, {y, scale, zero_point}),
        node_(node), x_(x), y_(y), scale_(scale), zero_point_(zero_point), count_(count), avx512_(avx512) {}

  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
    const auto* x = static_cast<const float*>(ctx.ptr(x_));
    auto* y = static_cast<std::uint8_t*>(ctx.ptr(y_));
    const std::int64_t chunk = 1 << 14, chunks = std::max<std::int64_t>(1, (count_ + chunk - 1) / chunk);
    std::vector<dynq::Range> parts(static_cast<std::size_t>(chunks));
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (std::int64_t c = 0; c < chunks; ++c) {
      std::int64_t b = c * chunk, e = std::min(count_, b + chunk);
      parts[static_cast<std::size_t>(c)] = avx512_ ? dynq::range_avx512(x, b, e) : dynq::range_scalar(x, b, e);
    }
    dynq::Range r;
    for (const dynq::Range& p : parts) {
      r.lo = std::min(r.lo, p.lo);
      r.hi = std::max(r.hi, p.hi);
      r.finite = r.finite && p.finite;
    }
    if (!r.finite) {
      std::int64_t i = 0;
      while (i < count_ && std::isfinite(x[i])) ++i;
      throw node_->error("x holds " + std::to_string(x[i]) + " at index " + std::to_string(i) +
                         ": no quantization range can include it");
    }
    // As the reference kernel: an all-zero x has no range, scale 1 and zero point 0.
    float scale = r.hi == r.lo ? 1.0f : (r.hi - r.lo) / 255.0f;
    float zero_point = std::nearbyint(std::clamp(0.0f - r.lo / scale, 0.0f, 255.0f));
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (std::int64_t c = 0; c < chunks; ++c) {
      std::int64_t b = c * chunk, e = std::min(count_, b + chunk);
      if (avx512_)
        dynq::quantize_avx512(x, y, b, e, scale, zero_point);
      else
        for (std::int64_t i = b; i < e; ++i) y[i] = dynq::quantize_scalar(x[i], scale, zero_point);
    }
    *static_cast<float*>(ctx.ptr(scale_)) = scale;
    *static_cast<std::uint8_t*>(ctx.ptr(zero_point_)) = static_cast<std::uint8_t>(zero_point);
  }

 private:
  const Node* node_;
  SlotId x_, y_, scale_, zero_point_;
  std::int64_t count_;
  bool avx512_;
};

// The kernel is elementwise, so y takes x's layout when x's bytes are exactly its elements (row-major,
// channels-last, a blocked layout without padding): a convolution's output is quantized where it lies,
// and the int8 convolution reading y gets the layout it wrote.
inline bool lower_dynamic_quantize_linear(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  if (!x || x->dtype() != DType::Float32 || n.num_outputs() != 3) return false;
  for (const Value* out : n.outputs())
    if (!out) return false;
  const std::int64_t count = x->shape().numel().value_or(0);
  memory::desc x_md = L.md_of(x);
  const bool dense = x_md.data_type() == memory::data_type::f32 &&
                     x_md.get_size() == static_cast<std::size_t>(count) * sizeof(float);
  if (!dense) x_md = plain_md(x->shape().sizes(), memory::data_type::f32);
  SlotId xs = L.slot_in(x, x_md);
  const memory::desc y_md = quant::retyped(x_md, memory::data_type::u8);
  std::vector<SlotId> outs;
  SlotId ys = L.new_value_slot(n.output(0), y_md);
  L.define(n.output(0), ys, y_md);
  outs.push_back(ys);
  for (std::size_t i = 1; i < 3; ++i) {
    SlotId s = L.new_plain_slot(n.output(i));
    L.define_plain(n.output(i), s);
    outs.push_back(s);
  }
  bool avx512 = effective_isa().avx512;
  L.add_step(std::make_unique<DynamicQuantizeStep>(
      runtime::StepInfo{n.name(), n.op_type(), avx512 ? "ondine_dynamic_quantize:avx512" : "ondine_dynamic_quantize:c++",
                        Graph::value_type_str(x) + " " + layout_name(x_md) + " -> u8, scale, zero point"},
      &n, xs, outs[0], outs[1], outs[2], count, avx512));
  return true;
}

namespace dynq {

// Whether centred weights `w` multiply exactly in int8 on this CPU (see the header comment).
inline bool exact_in_int8(const Tensor& w, std::string& why) {
  if (w.dtype() != DType::Int8) {
    why = "centred weights beyond int8";
    return false;
  }
  if (effective_isa().int8_vnni) return true;
  const auto* v = w.data<std::int8_t>();
  int max_abs = 0;
  for (std::int64_t i = 0; i < w.numel(); ++i) max_abs = std::max(max_abs, std::abs(int{v[i]}));
  if (max_abs <= 64) return true;
  why = "weights up to " + std::to_string(max_abs) + " without VNNI";
  return false;
}

// The centred weights as float32 (exact: integers below 2^15).
inline Tensor as_float(const Tensor& w) {
  Tensor f(DType::Float32, w.dims());
  for (std::int64_t i = 0; i < w.numel(); ++i) f.data<float>()[i] = static_cast<float>(w.at_double(static_cast<std::size_t>(i)));
  return f;
}

// The post-ops both forms share: times the per-channel scales (filled on every call), plus the bias,
// then the activations. `channel_md`: a [1, C] (matmul) or [1, C, 1, ...] (conv) float32 vector.
inline bool post_ops(const Node& n, const memory::desc& channel_md, bool bias, dnnl::post_ops& ops,
                     std::vector<fused::Activation>& activations, bool sum = false) {
  if (sum) ops.append_sum(1.0f);  // the compensation, written into the output first
  ops.append_binary(dnnl::algorithm::binary_mul, channel_md);
  if (bias) ops.append_binary(dnnl::algorithm::binary_add, channel_md);
  activations = fused::read_activations(n);
  for (const fused::Activation& act : activations)
    for (const EltwiseSpec::Op& op : eltwise_of(act).ops) ops.append_eltwise(1.0f, op.alg, op.alpha, op.beta);
  return !repeats_eltwise_alg(ops);
}

}  // namespace dynq

// The u8 source centred on its run-time zero point, as float32 in the layout the float32 primitive
// reads: one oneDNN reorder with a run-time source zero point.
class CentreStep : public PrimitiveStep {
 public:
  CentreStep(runtime::StepInfo info, const Node* node, dnnl::engine engine, dnnl::primitive prim,
             std::vector<SlotArg> slot_args, memory::desc scratchpad, SlotId zero_point)
      : PrimitiveStep(std::move(info), node, std::move(engine), std::move(prim), std::move(slot_args), {},
                      std::move(scratchpad), {zero_point}),
        zero_point_(zero_point) {}

  struct Runtime : runtime::StepState {
    std::unique_ptr<runtime::StepState> base;
    memory zero_point;
  };

  std::unique_ptr<runtime::StepState> make_state(runtime::ExecContext& ctx) const override {
    auto st = std::make_unique<Runtime>();
    st->base = PrimitiveStep::make_state(ctx);
    st->zero_point = memory(plain_md({1}, memory::data_type::s32), engine());
    static_cast<PrimitiveStep::State&>(*st->base).args.emplace(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, st->zero_point);
    return st;
  }

  void execute(runtime::ExecContext& ctx) const override {
    auto& st = ctx.state<Runtime>(*this);
    ctx.backend()->wait();
    *static_cast<std::int32_t*>(st.zero_point.get_data_handle()) = *static_cast<const std::uint8_t*>(ctx.ptr(zero_point_));
    run(ctx, static_cast<PrimitiveStep::State&>(*st.base));
  }

 private:
  SlotId zero_point_;
};

// Adds a CentreStep writing `a` (u8 in slot `src`, layout `from`; its zero point in slot `zero_point`)
// as float32 in layout `want` into a slot of its own; returns that slot.
inline SlotId centred_source(Lowering& L, const Node& n, const Value* a, SlotId src, const memory::desc& from,
                             SlotId zero_point, const memory::desc& want) {
  dnnl::primitive_attr attr = Lowering::base_attr();
  attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  dnnl::reorder::primitive_desc pd(L.engine(), from, L.engine(), want, attr);
  runtime::Slot s = Lowering::slot_for(a, SlotKind::Arena, 0);
  s.name = a->name() + ".centred";
  s.dtype = DType::Float32;
  s.bytes = want.get_size();
  s.layout = layout_name(want);
  SlotId dst = L.add_slot(std::move(s));
  L.scratchpad_bytes = std::max(L.scratchpad_bytes, pd.scratchpad_desc().get_size());
  L.add_step(std::make_unique<CentreStep>(
      runtime::StepInfo{n.name() + ".centre", "Reorder", pd.impl_info_str(),
                        "u8 " + layout_name(from) + " - zero point -> f32 " + layout_name(want)},
      &n, L.engine(), dnnl::reorder(pd), std::vector<SlotArg>{{DNNL_ARG_SRC, src, from}, {DNNL_ARG_DST, dst, want}},
      pd.scratchpad_desc(), zero_point));
  return dst;
}

namespace dynq {

// The shift that brings centred weights w[c] into int8, per output channel (0 where they fit); empty
// when some channel spans more than 256 values.
inline std::optional<std::vector<int>> int8_shifts(const Tensor& w) {
  const std::int64_t channels = w.dims()[0], per = w.numel() / channels;
  std::vector<int> shift(static_cast<std::size_t>(channels), 0);
  for (std::int64_t c = 0; c < channels; ++c) {
    int lo = 0, hi = 0;
    for (std::int64_t i = c * per; i < (c + 1) * per; ++i) {
      int v = static_cast<int>(w.at_double(static_cast<std::size_t>(i)));
      lo = i == c * per ? v : std::min(lo, v);
      hi = i == c * per ? v : std::max(hi, v);
    }
    if (hi - lo > 255) return std::nullopt;
    int& k = shift[static_cast<std::size_t>(c)];  // the shift in [hi - 127, lo + 128] closest to 0
    k = std::clamp(0, hi - 127, lo + 128);
  }
  return shift;
}

// A [K, N] matrix as [N, K]: a matmul's weights with its output channels (columns) first, as int8_shifts and
// shifted read them.
inline Tensor columns_first(const Tensor& w) {
  const std::int64_t rows = w.dims()[0], cols = w.dims()[1];
  const std::size_t width = dtype_size(w.dtype());
  Tensor t(w.dtype(), {cols, rows});
  const auto* src = static_cast<const char*>(w.raw());
  auto* dst = static_cast<char*>(t.raw());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      std::memcpy(dst + static_cast<std::size_t>(c * rows + r) * width, src + static_cast<std::size_t>(r * cols + c) * width,
                  width);
  return t;
}

inline Tensor shifted(const Tensor& w, const std::vector<int>& shift) {
  Tensor t(DType::Int8, w.dims());
  const std::int64_t per = w.numel() / w.dims()[0];
  for (std::int64_t i = 0; i < w.numel(); ++i)
    t.data<std::int8_t>()[i] =
        static_cast<std::int8_t>(static_cast<int>(w.at_double(static_cast<std::size_t>(i))) - shift[static_cast<std::size_t>(i / per)]);
  return t;
}

// y[n, od, oh, ow, c] = shift[c] * S[n, od, oh, ow, g(c)], S the sum over group g's channels and the window of
// (a - a_zp), padding adding nothing: the part of sum((a - a_zp) * w) the shifted weights leave out. a u8 and
// y f32 channels-last. A 1-D or 2-D convolution has extent 1 in the spatial dims it lacks (a matmul: M rows of
// height 1 and width 1).
struct Compensation {
  SlotId src = 0, dst = 0;
  std::int64_t batch = 0, channels = 0, groups = 1, out_channels = 0;
  std::int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};  // depth, height, width
  std::int64_t kernel[3] = {1, 1, 1}, stride[3] = {1, 1, 1}, dilation[3] = {1, 1, 1}, pad[3] = {0, 0, 0};
  std::vector<float> shift;

  void run(const std::uint8_t* a, int zero_point, float* y) const {
    const std::int64_t cg = channels / groups, mg = out_channels / groups, pixels = batch * in[0] * in[1] * in[2];
    // t: each pixel's sum over a group's channels, centred.
    std::vector<std::int32_t> t(static_cast<std::size_t>(pixels * groups));
    static const bool avx2 = __builtin_cpu_supports("avx2");
#pragma omp parallel for schedule(static)
    for (std::int64_t p = 0; p < pixels; ++p)
      for (std::int64_t g = 0; g < groups; ++g) {
        const std::uint8_t* px = a + p * channels + g * cg;
        t[static_cast<std::size_t>(p * groups + g)] =
            static_cast<std::int32_t>(avx2 ? byte_sum_avx2(px, cg) : byte_sum(px, 0, cg)) -
            static_cast<std::int32_t>(cg) * zero_point;
      }
    // window: t summed over each output position's window (padding adds nothing), times the shifts.
#pragma omp parallel for schedule(static)
    for (std::int64_t row = 0; row < batch * out[0] * out[1]; ++row) {
      const std::int64_t n = row / (out[0] * out[1]), od = row / out[1] % out[0], oh = row % out[1];
      std::vector<float> window(static_cast<std::size_t>(groups));
      for (std::int64_t ow = 0; ow < out[2]; ++ow) {
        for (std::int64_t g = 0; g < groups; ++g) {
          std::int64_t sum = 0;
          for (std::int64_t kd = 0; kd < kernel[0]; ++kd) {
            const std::int64_t id = od * stride[0] - pad[0] + kd * dilation[0];
            if (id < 0 || id >= in[0]) continue;
            for (std::int64_t kh = 0; kh < kernel[1]; ++kh) {
              const std::int64_t ih = oh * stride[1] - pad[1] + kh * dilation[1];
              if (ih < 0 || ih >= in[1]) continue;
              const std::int32_t* tr = t.data() + ((n * in[0] + id) * in[1] + ih) * in[2] * groups + g;
              for (std::int64_t kw = 0; kw < kernel[2]; ++kw) {
                const std::int64_t iw = ow * stride[2] - pad[2] + kw * dilation[2];
                if (iw >= 0 && iw < in[2]) sum += tr[iw * groups];
              }
            }
          }
          window[static_cast<std::size_t>(g)] = static_cast<float>(sum);
        }
        float* __restrict dst_row = y + (row * out[2] + ow) * out_channels;
        const float* __restrict k = shift.data();
        if (groups == 1) {
          const float w = window[0];
#pragma omp simd
          for (std::int64_t c = 0; c < out_channels; ++c) dst_row[c] = k[c] * w;
        } else {
          for (std::int64_t g = 0; g < groups; ++g)
            for (std::int64_t c = g * mg; c < (g + 1) * mg; ++c) dst_row[c] = k[c] * window[static_cast<std::size_t>(g)];
        }
      }
    }
  }

  static std::uint32_t byte_sum(const std::uint8_t* p, std::int64_t begin, std::int64_t end) {
    std::uint32_t sum = 0;
    for (std::int64_t i = begin; i < end; ++i) sum += p[i];
    return sum;
  }
  // Sums of 32 bytes at a time (vpsadbw against zero).
  __attribute__((target("avx2"))) static std::uint32_t byte_sum_avx2(const std::uint8_t* p, std::int64_t count) {
    __m256i acc = _mm256_setzero_si256();
    std::int64_t i = 0;
    for (; i + 32 <= count; i += 32)
      acc = _mm256_add_epi64(acc, _mm256_sad_epu8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)),
                                                  _mm256_setzero_si256()));
    alignas(32) std::uint64_t lanes[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
    return static_cast<std::uint32_t>(lanes[0] + lanes[1] + lanes[2] + lanes[3]) + byte_sum(p, i, count);
  }
};

}  // namespace dynq

// ondine.DynQMatMul / DynQConv: a oneDNN primitive (u8 x s8 with a run-time source zero point, or
// float32 on a centred source) to f32, then binary post-ops: times the channel scales a_scale *
// w_scale[c] (a per-context vector filled on every call, in float32 as ONNX's Mul computes them),
// plus the bias. oneDNN 2.6 has run-time output scales too, but only its old gemm-based int8 matmul
// takes them (3.5 ms for the BERT-style model against 1 ms with the brgemm AMX one); and its bias
// argument would be added before the output scale.
class DynQStep : public PrimitiveStep {
 public:
  DynQStep(runtime::StepInfo info, const Node* node, dnnl::engine engine, dnnl::primitive prim,
           std::vector<SlotArg> slot_args, std::vector<std::pair<int, memory>> const_args, memory::desc scratchpad,
           SlotId a_scale, SlotId a_zero_point, bool int8, std::vector<float> w_scale, memory::desc channel_md,
           std::optional<dynq::Compensation> compensation = std::nullopt)
      : PrimitiveStep(std::move(info), node, std::move(engine), std::move(prim), std::move(slot_args),
                      std::move(const_args), std::move(scratchpad), {a_scale, a_zero_point}),
        a_scale_(a_scale),
        a_zero_point_(a_zero_point),
        int8_(int8),
        w_scale_(std::move(w_scale)),
        channel_md_(std::move(channel_md)),
        compensation_(std::move(compensation)) {}

  struct Runtime : runtime::StepState {
    std::unique_ptr<runtime::StepState> base;
    memory scales, zero_point;
  };

  std::unique_ptr<runtime::StepState> make_state(runtime::ExecContext& ctx) const override {
    auto st = std::make_unique<Runtime>();
    st->base = PrimitiveStep::make_state(ctx);
    st->scales = memory(channel_md_, engine());
    auto& args = static_cast<PrimitiveStep::State&>(*st->base).args;
    args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(compensation_ ? 1 : 0) | DNNL_ARG_SRC_1, st->scales);
    if (int8_) {
      st->zero_point = memory(plain_md({1}, memory::data_type::s32), engine());
      args.emplace(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, st->zero_point);
    }
    return st;
  }

  void execute(runtime::ExecContext& ctx) const override {
    auto& st = ctx.state<Runtime>(*this);
    ctx.backend()->wait();
    const float a_scale = *static_cast<const float*>(ctx.ptr(a_scale_));
    auto* scales = static_cast<float*>(st.scales.get_data_handle());
    const std::size_t channels = channel_md_.get_size() / sizeof(float);
    for (std::size_t c = 0; c < channels; ++c) scales[c] = a_scale * w_scale_[w_scale_.size() == 1 ? 0 : c];
    const std::uint8_t zero_point = *static_cast<const std::uint8_t*>(ctx.ptr(a_zero_point_));
    if (int8_) *static_cast<std::int32_t*>(st.zero_point.get_data_handle()) = zero_point;
    if (compensation_)
      compensation_->run(static_cast<const std::uint8_t*>(ctx.ptr(compensation_->src)), zero_point,
                         static_cast<float*>(ctx.ptr(compensation_->dst)));
    run(ctx, static_cast<PrimitiveStep::State&>(*st.base));
  }

 private:
  SlotId a_scale_, a_zero_point_;
  bool int8_;
  std::vector<float> w_scale_;
  memory::desc channel_md_;
  std::optional<dynq::Compensation> compensation_;
};

inline bool dyn_operands_ok(const Node& n) {
  const Value *x = n.input(0), *x_scale = n.input(1), *x_zero = n.input(2), *w = n.input(3),
              *b = n.num_inputs() > 4 ? n.input(4) : nullptr;
  if (!x || x->dtype() != DType::UInt8 || !x_scale || !x_zero || !w || !w->is_constant() ||
      (w->dtype() != DType::Int8 && w->dtype() != DType::Int16))
    return false;
  return !b || (b->is_constant() && b->dtype() == DType::Float32);
}

inline bool lower_dyn_qmatmul(Lowering& L, const Node& n) {
  if (!dyn_operands_ok(n)) return false;
  const Value *x = n.input(0), *x_scale = n.input(1), *x_zero = n.input(2), *w = n.input(3),
              *b = n.num_inputs() > 4 ? n.input(4) : nullptr;
  const Value* y = n.output(0);
  Dims xd = x->shape().sizes(), wd = w->shape().sizes();
  if (xd.size() < 2 || wd.size() != 2 || xd.back() != wd[0]) return false;
  std::int64_t k = wd[0], cols = wd[1], m = 1;
  for (std::size_t i = 0; i + 1 < xd.size(); ++i) m *= xd[i];
  std::string why;
  bool int8 = dynq::exact_in_int8(w->constant(), why);
  // Weights beyond int8 (uint8 weights with a zero point, quantize_dynamic's QUInt8), with VNNI: each column
  // shifted into int8, and the shift times the row sum of the centred source added back, as lower_dyn_qconv
  // does (the compensation is its kernel on a 1x1 convolution over the M rows).
  std::optional<std::vector<int>> shift;
  if (!int8 && w->dtype() == DType::Int16 && effective_isa().int8_vnni && k >= 16)
    shift = dynq::int8_shifts(dynq::columns_first(w->constant()));
  int8 = int8 || shift.has_value();
  const memory::data_type src_dt = int8 ? memory::data_type::u8 : memory::data_type::f32,
                          wei_dt = int8 ? memory::data_type::s8 : memory::data_type::f32;
  memory::desc src_md = plain_md({m, k}, src_dt), wei_md = any_md({k, cols}, wei_dt),
               dst_md = plain_md({m, cols}, memory::data_type::f32), channel_md = plain_md({1, cols}, memory::data_type::f32);
  dnnl::primitive_attr attr = Lowering::base_attr();
  if (int8) attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  dnnl::post_ops ops;
  std::vector<fused::Activation> activations;
  if (!dynq::post_ops(n, channel_md, b != nullptr, ops, activations, shift.has_value())) return false;
  attr.set_post_ops(ops);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), attr, L.engine(), true);
  if (!pd) {
    L.log("ondine.DynQMatMul '" + n.name() + "': oneDNN has no matmul for it; it runs on its reference kernel");
    return false;
  }
  std::vector<float> w_scale = n.attr_floats("w_scale", {1.0f});
  SlotId scale_slot = L.row_major_slot(x_scale), zero_slot = L.row_major_slot(x_zero);
  SlotId src = int8 ? L.row_major_slot(x)
                    : centred_source(L, n, x, L.row_major_slot(x), plain_md({m, k}, memory::data_type::u8), zero_slot,
                                     pd.src_desc());
  std::vector<SlotArg> args{{DNNL_ARG_SRC, src, pd.src_desc()}};
  std::vector<std::pair<int, memory>> consts;
  const Tensor weights = shift ? dynq::columns_first(dynq::shifted(dynq::columns_first(w->constant()), *shift))
                         : int8 ? w->constant()
                                : dynq::as_float(w->constant());
  consts.emplace_back(DNNL_ARG_WEIGHTS, L.constant_memory(weights, pd.weights_desc()));
  if (b)
    consts.emplace_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(shift ? 2 : 1) | DNNL_ARG_SRC_1,
                        L.constant_memory(b->constant(), channel_md));
  memory::desc value_md = plain_md(y->shape().sizes(), memory::data_type::f32);
  SlotId dst = L.new_value_slot(y, value_md);
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc(), shift.has_value()});
  L.define(y, dst, value_md);
  std::optional<dynq::Compensation> comp;
  if (shift) {  // the rows as an M x 1 image of K channels, the columns as N output channels
    dynq::Compensation& c = comp.emplace();
    c.src = src;
    c.dst = dst;
    c.batch = 1, c.channels = k, c.in[1] = m, c.out_channels = cols, c.out[1] = m;
    c.shift.assign(shift->begin(), shift->end());
  }
  std::string detail = std::string(int8 ? "src u8 " : "src centred f32 ") + dims_str({m, k}) + " x wei " +
                       layout_name(pd.weights_desc()) + dims_str(wd) +
                       (shift ? " shifted into s8 +row-sum compensation" : "") + " scale, zero point at run time" +
                       (w_scale.size() > 1 ? " w per-column" : "") + (b ? " +bias" : "") +
                       (activations.empty() ? "" : " +" + fused::activations_str(activations)) + " -> f32" +
                       (int8 ? "" : " (float32: " + why + ")");
  L.add_step(std::make_unique<DynQStep>(runtime::StepInfo{n.name(), n.op_type(), pd.impl_info_str(), detail}, &n,
                                        L.engine(), dnnl::matmul(pd), std::move(args), std::move(consts),
                                        pd.scratchpad_desc(), scale_slot, zero_slot, int8, std::move(w_scale), channel_md,
                                        std::move(comp)));
  L.scratchpad_bytes = std::max(L.scratchpad_bytes, pd.scratchpad_desc().get_size());
  return true;
}

inline bool lower_dyn_qconv(Lowering& L, const Node& n) {
  if (!dyn_operands_ok(n)) return false;
  const Value *x = n.input(0), *x_scale = n.input(1), *x_zero = n.input(2), *w = n.input(3),
              *b = n.num_inputs() > 4 ? n.input(4) : nullptr;
  const Value* y = n.output(0);
  Dims xd = x->shape().sizes(), wd = w->shape().sizes(), yd = y->shape().sizes();
  const std::optional<ConvGeometry> geometry = conv_geometry(n, xd, wd, yd);
  if (!geometry) return false;
  const auto& [group, oc, kernel, dilates, weight_dims, win, r] = *geometry;
  const std::size_t rank = xd.size();
  std::string why;
  bool int8 = dynq::exact_in_int8(w->constant(), why);
  // Weights beyond int8, with VNNI: shifted into int8 and compensated (a 1-D or 2-D convolution as a 3-D one of
  // extent 1 in its missing dims). Not with few input channels per group (an RGB image): oneDNN's int8
  // kernels gain nothing there, and the float32 one is 4x faster (U-Net's first layer, 256x256: 0.8
  // against 3.4 ms).
  std::optional<std::vector<int>> shift;
  if (!int8 && w->dtype() == DType::Int16 && effective_isa().int8_vnni && wd[1] >= 16)
    shift = dynq::int8_shifts(w->constant());
  int8 = int8 || shift.has_value();
  const memory::data_type src_dt = int8 ? memory::data_type::u8 : memory::data_type::f32,
                          wei_dt = int8 ? memory::data_type::s8 : memory::data_type::f32;
  Dims channel_dims(rank, 1);
  channel_dims[1] = oc;
  const memory::desc channel_md = plain_md(channel_dims, memory::data_type::f32);
  dnnl::primitive_attr attr = Lowering::base_attr();
  if (int8) attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  dnnl::post_ops ops;
  std::vector<fused::Activation> activations;
  if (!dynq::post_ops(n, channel_md, b != nullptr, ops, activations, shift.has_value())) return false;
  attr.set_post_ops(ops);
  // The compensation kernel reads the source and writes the output channels-last.
  const memory::format_tag channels_last =
      rank == 3 ? memory::format_tag::nwc : rank == 4 ? memory::format_tag::nhwc : memory::format_tag::ndhwc;
  const memory::desc src_md = shift ? memory::desc(xd, src_dt, channels_last) : any_md(xd, src_dt),
                     dst_md = shift ? memory::desc(yd, memory::data_type::f32, channels_last)
                                    : any_md(yd, memory::data_type::f32);
  dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src_md,
                                       any_md(weight_dims, wei_dt), dst_md, win.strides, dilates, r.pad_begin, r.pad_end);
  dnnl::convolution_forward::primitive_desc pd(desc, attr, L.engine(), true);
  if (!pd) {
    L.log("ondine.DynQConv '" + n.name() + "': oneDNN has no convolution for it; it runs on its reference kernel");
    return false;
  }
  std::vector<float> w_scale = n.attr_floats("w_scale", {1.0f});
  SlotId scale_slot = L.row_major_slot(x_scale), zero_slot = L.row_major_slot(x_zero);
  SlotId src = int8 ? L.slot_in(x, pd.src_desc())
                    : centred_source(L, n, x, L.slot_in(x, L.md_of(x)), L.md_of(x), zero_slot, pd.src_desc());
  std::vector<SlotArg> args{{DNNL_ARG_SRC, src, pd.src_desc()}};
  std::vector<std::pair<int, memory>> consts;
  const Tensor weights = shift ? dynq::shifted(w->constant(), *shift) : int8 ? w->constant() : dynq::as_float(w->constant());
  consts.emplace_back(DNNL_ARG_WEIGHTS, L.constant_memory(weights, pd.weights_desc()));
  if (b)
    consts.emplace_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(shift ? 2 : 1) | DNNL_ARG_SRC_1,
                        L.constant_memory(b->constant(), channel_md));
  SlotId dst = L.new_value_slot(y, pd.dst_desc());
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc(), shift.has_value()});
  L.define(y, dst, pd.dst_desc());
  std::optional<dynq::Compensation> comp;
  if (shift) {
    dynq::Compensation& c = comp.emplace();
    c.src = src;
    c.dst = dst;
    const std::size_t spatial = rank - 2, first = 3 - spatial;  // the missing leading spatial dims: extent 1
    c.batch = xd[0], c.channels = xd[1], c.groups = group, c.out_channels = oc;
    for (std::size_t i = 0; i < spatial; ++i) {
      c.in[first + i] = xd[2 + i];
      c.out[first + i] = yd[2 + i];
      c.kernel[first + i] = kernel[i];
      c.stride[first + i] = win.strides[i];
      c.dilation[first + i] = win.dilations[i];
      c.pad[first + i] = r.pad_begin[i];
    }
    c.shift.assign(shift->begin(), shift->end());
  }
  std::string detail = std::string(int8 ? "src u8 " : "src centred f32 ") + layout_name(pd.src_desc()) + dims_str(xd) +
                       " wei " + layout_name(pd.weights_desc()) + (group > 1 ? " g" + std::to_string(group) : "") +
                       (shift ? " shifted into s8 +window-sum compensation" : "") +
                       " scale, zero point at run time" + (w_scale.size() > 1 ? " w per-channel" : "") +
                       (b ? " +bias" : "") + (activations.empty() ? "" : " +" + fused::activations_str(activations)) +
                       " -> f32 " + layout_name(pd.dst_desc()) + (int8 ? "" : " (float32: " + why + ")");
  L.add_step(std::make_unique<DynQStep>(runtime::StepInfo{n.name(), n.op_type(), pd.impl_info_str(), detail}, &n,
                                        L.engine(), dnnl::convolution_forward(pd), std::move(args), std::move(consts),
                                        pd.scratchpad_desc(), scale_slot, zero_slot, int8, std::move(w_scale), channel_md,
                                        std::move(comp)));
  L.scratchpad_bytes = std::max(L.scratchpad_bytes, pd.scratchpad_desc().get_size());
  return true;
}

}  // namespace ondine::lower::detail
