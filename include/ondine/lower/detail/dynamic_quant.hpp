// ondine/lower/detail/dynamic_quant.hpp - dynamic quantization compiled: DynamicQuantizeLinear as
// Ondine's own two-pass kernel, and ondine.DynQMatMul (passes/fuse_dynamic_qmatmul.hpp) as one oneDNN
// int8 matmul whose output scales and source zero point are run-time arguments, filled on every call
// from the DynamicQuantizeLinear results.
//
// Both compute what the reference kernels compute, in the same float32 operations: x / scale (a
// division, as ONNX writes it, not a multiplication by 1 / scale), round half to even, the zero point
// added after rounding; the matmul's float(acc) * (a_scale * w_scale[c]) + B[c]. So compiled and
// reference runs agree to the bit on the quantized values and to float rounding on the products.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ondine/ir/infer/quantized.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"
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

inline bool lower_dynamic_quantize_linear(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  if (!x || x->dtype() != DType::Float32 || n.num_outputs() != 3) return false;
  for (const Value* out : n.outputs())
    if (!out) return false;
  SlotId xs = L.row_major_slot(x);
  std::vector<SlotId> outs;
  for (const Value* out : n.outputs()) {
    SlotId s = L.new_plain_slot(out);
    L.define_plain(out, s);
    outs.push_back(s);
  }
  bool avx512 = effective_isa().avx512;
  std::int64_t count = x->shape().numel().value_or(0);
  L.add_step(std::make_unique<DynamicQuantizeStep>(
      runtime::StepInfo{n.name(), n.op_type(), avx512 ? "ondine_dynamic_quantize:avx512" : "ondine_dynamic_quantize:c++",
                        Graph::value_type_str(x) + " -> u8, scale, zero point"},
      &n, xs, outs[0], outs[1], outs[2], count, avx512));
  return true;
}

// ondine.DynQMatMul: a oneDNN u8 x s8 matmul to f32 with a run-time source zero point, then two binary
// post-ops: times the column scales a_scale * w_scale[c] (a per-context vector filled on every call, in
// float32 as ONNX's Mul computes them), plus the bias. oneDNN 2.6 has run-time output scales too, but
// only its old gemm-based int8 matmul takes them (3.5 ms for the BERT-style model against 1 ms with the
// brgemm AMX one); and its bias argument would be added before the output scale.
class DynQMatMulStep : public PrimitiveStep {
 public:
  DynQMatMulStep(runtime::StepInfo info, const Node* node, dnnl::engine engine, dnnl::primitive prim,
                 std::vector<SlotArg> slot_args, std::vector<std::pair<int, memory>> const_args,
                 memory::desc scratchpad, SlotId a_scale, SlotId a_zero_point, std::vector<float> w_scale,
                 std::int64_t cols)
      : PrimitiveStep(std::move(info), node, std::move(engine), std::move(prim), std::move(slot_args),
                      std::move(const_args), std::move(scratchpad), {a_scale, a_zero_point}),
        a_scale_(a_scale),
        a_zero_point_(a_zero_point),
        w_scale_(std::move(w_scale)),
        cols_(cols) {}

  struct Runtime : runtime::StepState {
    std::unique_ptr<runtime::StepState> base;
    memory scales, zero_point;
  };

  std::unique_ptr<runtime::StepState> make_state(runtime::ExecContext& ctx) const override {
    auto st = std::make_unique<Runtime>();
    st->base = PrimitiveStep::make_state(ctx);
    st->scales = memory(plain_md({1, cols_}, memory::data_type::f32), engine());
    st->zero_point = memory(plain_md({1}, memory::data_type::s32), engine());
    auto& args = static_cast<PrimitiveStep::State&>(*st->base).args;
    args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, st->scales);
    args.emplace(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, st->zero_point);
    return st;
  }

  void execute(runtime::ExecContext& ctx) const override {
    auto& st = ctx.state<Runtime>(*this);
    ctx.backend()->wait();
    const float a_scale = *static_cast<const float*>(ctx.ptr(a_scale_));
    auto* scales = static_cast<float*>(st.scales.get_data_handle());
    for (std::int64_t c = 0; c < cols_; ++c) scales[c] = a_scale * w_scale_[w_scale_.size() == 1 ? 0 : static_cast<std::size_t>(c)];
    *static_cast<std::int32_t*>(st.zero_point.get_data_handle()) = *static_cast<const std::uint8_t*>(ctx.ptr(a_zero_point_));
    run(ctx, static_cast<PrimitiveStep::State&>(*st.base));
  }

 private:
  SlotId a_scale_, a_zero_point_;
  std::vector<float> w_scale_;
  std::int64_t cols_;
};

inline bool lower_dyn_qmatmul(Lowering& L, const Node& n) {
  const Value *x = n.input(0), *x_scale = n.input(1), *x_zero = n.input(2), *w = n.input(3),
              *b = n.num_inputs() > 4 ? n.input(4) : nullptr;
  const Value* y = n.output(0);
  if (!x || x->dtype() != DType::UInt8 || !x_scale || !x_zero || !w || !w->is_constant() || w->dtype() != DType::Int8)
    return false;
  if (b && (!b->is_constant() || b->dtype() != DType::Float32)) return false;
  Dims xd = x->shape().sizes(), wd = w->shape().sizes();
  if (xd.size() < 2 || wd.size() != 2 || xd.back() != wd[0]) return false;
  std::int64_t k = wd[0], cols = wd[1], m = 1;
  for (std::size_t i = 0; i + 1 < xd.size(); ++i) m *= xd[i];
  std::vector<float> w_scale = n.attr_floats("w_scale", {1.0f});
  // Without VNNI, oneDNN's u8 x s8 kernels add pairs of products in saturating 16 bits: exact only for
  // weights within [-64, 64] (see fuse_qdq.hpp's max-abs-weight).
  if (!effective_isa().int8_vnni) {
    const auto* wv = w->constant().data<std::int8_t>();
    int max_abs = 0;
    for (std::int64_t i = 0; i < w->constant().numel(); ++i) max_abs = std::max(max_abs, std::abs(int{wv[i]}));
    if (max_abs > 64) {
      L.log("ondine.DynQMatMul '" + n.name() + "': weights up to " + std::to_string(max_abs) +
            " need VNNI for exact int8 products; it runs on its reference kernel (quantize-dynamic.reduce-range "
            "writes 7-bit weights)");
      return false;
    }
  }

  memory::desc src_md = plain_md({m, k}, memory::data_type::u8), wei_md = any_md({k, cols}, memory::data_type::s8),
               dst_md = plain_md({m, cols}, memory::data_type::f32), bias_md = plain_md({1, cols}, memory::data_type::f32);
  dnnl::primitive_attr attr = Lowering::base_attr();
  attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  dnnl::post_ops ops;
  ops.append_binary(dnnl::algorithm::binary_mul, bias_md);
  if (b) ops.append_binary(dnnl::algorithm::binary_add, bias_md);
  std::vector<fused::Activation> activations = fused::read_activations(n);
  for (const fused::Activation& act : activations)
    for (const EltwiseSpec::Op& op : eltwise_of(act).ops) ops.append_eltwise(1.0f, op.alg, op.alpha, op.beta);
  if (repeats_eltwise_alg(ops)) return false;
  attr.set_post_ops(ops);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), attr, L.engine(), true);
  if (!pd) {
    L.log("ondine.DynQMatMul '" + n.name() + "': oneDNN has no int8 matmul for it; it runs on its reference kernel");
    return false;
  }
  std::vector<SlotArg> args{{DNNL_ARG_SRC, L.row_major_slot(x), pd.src_desc()}};
  std::vector<std::pair<int, memory>> consts;
  consts.emplace_back(DNNL_ARG_WEIGHTS, L.constant_memory(w->constant(), pd.weights_desc()));
  if (b) consts.emplace_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(1) | DNNL_ARG_SRC_1, L.constant_memory(b->constant(), bias_md));
  memory::desc value_md = plain_md(y->shape().sizes(), memory::data_type::f32);
  SlotId dst = L.new_value_slot(y, value_md);
  args.push_back({DNNL_ARG_DST, dst, pd.dst_desc()});
  L.define(y, dst, value_md);
  SlotId scale_slot = L.row_major_slot(x_scale), zero_slot = L.row_major_slot(x_zero);
  std::string detail = "src u8 " + dims_str({m, k}) + " x wei " + layout_name(pd.weights_desc()) + dims_str(wd) +
                       " scale, zero point at run time" + (w_scale.size() > 1 ? " w per-column" : "") +
                       (b ? " +bias" : "") +
                       (activations.empty() ? "" : " +" + fused::activations_str(activations)) + " -> f32";
  L.add_step(std::make_unique<DynQMatMulStep>(runtime::StepInfo{n.name(), n.op_type(), pd.impl_info_str(), detail}, &n,
                                              L.engine(), dnnl::matmul(pd), std::move(args), std::move(consts),
                                              pd.scratchpad_desc(), scale_slot, zero_slot, std::move(w_scale), cols));
  L.scratchpad_bytes = std::max(L.scratchpad_bytes, pd.scratchpad_desc().get_size());
  return true;
}

}  // namespace ondine::lower::detail
