// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/group_norm.hpp - GroupNormalization (opsets 18 and 21), ondine.GroupNorm and
// InstanceNormalization (one group per channel) in float32: Ondine's kernel (AVX-512 / AVX2 / C++).
//
// oneDNN 2.6 has no group normalization, and its layer normalization over the [N * G, C / G * H * W] view
// would leave the per-channel affine to a binary primitive (two more passes over the tensor). Here one
// task per (image, group) reads its C / G planes twice (the mean, then the centred squares: exact where
// sum - sum-of-squares cancels; the group's bytes are in L2 by the second read for the sizes detectors
// use, 256 channels in 32 groups at 100x100: 320 KB) and writes once:
//   y = act(x * a[c] + b[c]),  a[c] = scale[c] / sqrt(var + eps),  b[c] = bias[c] - mean * a[c]
// with act a Relu, LeakyRelu or Clip that follows the node in the graph (min(max(v, lo), hi) + slope *
// min(v, 0)), or a SiLU written as Mul(y, Sigmoid(y)), applied by silu.hpp's kernel to the group's output
// while it is in cache.
// Sums accumulate in float vectors per 4096 elements and in double across them.
// Row-major (NCHW) in and out; the producer's blocked layout costs one reorder each way.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/infer/nn_extra.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"
#include "ondine/lower/detail/silu.hpp"

namespace ondine::lower::detail {

namespace group_norm {

using silu::Kernel;

// What follows the affine step: y = min(max(v, lo), hi) + slope * min(v, 0), then SiLU when `swish`.
struct Activation {
  float lo = -std::numeric_limits<float>::infinity();
  float hi = std::numeric_limits<float>::infinity();
  float slope = 0;
  bool swish = false;
  float swish_alpha = 1;
};

constexpr std::size_t kChunk = 4096;  // elements summed in float before the partial joins the double total

inline double sum_scalar(const float* p, std::size_t n) {
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) total += p[i];
  return total;
}

inline double centered_squares_scalar(const float* p, std::size_t n, float mean) {
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(p[i]) - mean;
    total += d * d;
  }
  return total;
}

inline void affine_scalar(const float* x, float* y, std::size_t n, float a, float b, const Activation& act) {
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i] * a + b;
    y[i] = std::min(std::max(v, act.lo), act.hi) + act.slope * std::min(v, 0.0f);
  }
}

#ifdef ONDINE_SILU_X86

__attribute__((target("avx2,fma"))) inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// acc + v or acc + (v - m)^2 for the 8 floats at q (a lambda would not inherit the target attribute).
template <bool centred>
__attribute__((target("avx2,fma"))) inline __m256 accumulate8(__m256 acc, const float* q, __m256 m) {
  const __m256 v = _mm256_loadu_ps(q);
  if constexpr (centred) {
    const __m256 d = _mm256_sub_ps(v, m);
    return _mm256_fmadd_ps(d, d, acc);
  } else {
    (void)m;
    return _mm256_add_ps(acc, v);
  }
}

// `centred` false: sum of p; true: sum of (p - mean)^2.
template <bool centred>
__attribute__((target("avx2,fma"))) inline double sums_avx2(const float* p, std::size_t n, float mean) {
  double total = 0;
  const __m256 m = _mm256_set1_ps(mean);
  for (std::size_t i = 0; i < n;) {
    const std::size_t end = std::min(n, i + kChunk);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (; i + 32 <= end; i += 32) {
      a0 = accumulate8<centred>(a0, p + i, m);
      a1 = accumulate8<centred>(a1, p + i + 8, m);
      a2 = accumulate8<centred>(a2, p + i + 16, m);
      a3 = accumulate8<centred>(a3, p + i + 24, m);
    }
    for (; i + 8 <= end; i += 8) a0 = accumulate8<centred>(a0, p + i, m);
    float partial = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < end; ++i) partial += centred ? (p[i] - mean) * (p[i] - mean) : p[i];
    total += partial;
  }
  return total;
}

__attribute__((target("avx2,fma"))) inline void affine_avx2(const float* x, float* y, std::size_t n, float a, float b,
                                                             const Activation& act) {
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b), lo = _mm256_set1_ps(act.lo),
               hi = _mm256_set1_ps(act.hi), slope = _mm256_set1_ps(act.slope), zero = _mm256_setzero_ps();
  std::size_t i = 0;
  if (act.slope == 0) {
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), va, vb);
      _mm256_storeu_ps(y + i, _mm256_min_ps(_mm256_max_ps(v, lo), hi));
    }
  } else {
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), va, vb);
      const __m256 clamped = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
      _mm256_storeu_ps(y + i, _mm256_fmadd_ps(slope, _mm256_min_ps(v, zero), clamped));
    }
  }
  affine_scalar(x + i, y + i, n - i, a, b, act);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

template <bool centred>
__attribute__((target("avx512f"))) inline __m512 accumulate16(__m512 acc, const float* q, __m512 m) {
  const __m512 v = _mm512_loadu_ps(q);
  if constexpr (centred) {
    const __m512 d = _mm512_sub_ps(v, m);
    return _mm512_fmadd_ps(d, d, acc);
  } else {
    (void)m;
    return _mm512_add_ps(acc, v);
  }
}

template <bool centred>
__attribute__((target("avx512f"))) inline double sums_avx512(const float* p, std::size_t n, float mean) {
  double total = 0;
  const __m512 m = _mm512_set1_ps(mean);
  for (std::size_t i = 0; i < n;) {
    const std::size_t end = std::min(n, i + kChunk);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    for (; i + 64 <= end; i += 64) {
      a0 = accumulate16<centred>(a0, p + i, m);
      a1 = accumulate16<centred>(a1, p + i + 16, m);
      a2 = accumulate16<centred>(a2, p + i + 32, m);
      a3 = accumulate16<centred>(a3, p + i + 48, m);
    }
    for (; i + 16 <= end; i += 16) a0 = accumulate16<centred>(a0, p + i, m);
    float partial = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    for (; i < end; ++i) partial += centred ? (p[i] - mean) * (p[i] - mean) : p[i];
    total += partial;
  }
  return total;
}

__attribute__((target("avx512f"))) inline void affine_avx512(const float* x, float* y, std::size_t n, float a,
                                                              float b, const Activation& act) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b), lo = _mm512_set1_ps(act.lo),
               hi = _mm512_set1_ps(act.hi), slope = _mm512_set1_ps(act.slope), zero = _mm512_setzero_ps();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), va, vb);
    __m512 out = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    if (act.slope != 0) out = _mm512_fmadd_ps(slope, _mm512_min_ps(v, zero), out);
    _mm512_storeu_ps(y + i, out);
  }
  affine_scalar(x + i, y + i, n - i, a, b, act);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // ONDINE_SILU_X86

inline double sum(Kernel k, const float* p, std::size_t n) {
#ifdef ONDINE_SILU_X86
  if (k == Kernel::Avx512) return sums_avx512<false>(p, n, 0);
  if (k == Kernel::Avx2) return sums_avx2<false>(p, n, 0);
#endif
  (void)k;
  return sum_scalar(p, n);
}

inline double centered_squares(Kernel k, const float* p, std::size_t n, float mean) {
#ifdef ONDINE_SILU_X86
  if (k == Kernel::Avx512) return sums_avx512<true>(p, n, mean);
  if (k == Kernel::Avx2) return sums_avx2<true>(p, n, mean);
#endif
  (void)k;
  return centered_squares_scalar(p, n, mean);
}

inline void affine(Kernel k, const float* x, float* y, std::size_t n, float a, float b, const Activation& act) {
#ifdef ONDINE_SILU_X86
  if (k == Kernel::Avx512) return affine_avx512(x, y, n, a, b, act);
  if (k == Kernel::Avx2) return affine_avx2(x, y, n, a, b, act);
#endif
  (void)k;
  affine_scalar(x, y, n, a, b, act);
}

struct Geometry {
  std::int64_t N = 0, C = 0, G = 0, inner = 0;  // X [N, C, inner...]
  float epsilon = 1e-5f;
};

// One (image, group): statistics, then the per-channel affine and the activation.
inline void normalize_group(Kernel k, const Geometry& g, const float* scale, const float* bias, const Activation& act,
                            const float* x, float* y, std::int64_t image, std::int64_t group) {
  const std::int64_t per_group = g.C / g.G;
  const auto count = static_cast<std::size_t>(per_group * g.inner);
  const std::int64_t offset = (image * g.C + group * per_group) * g.inner;
  const float* xp = x + offset;
  float* yp = y + offset;
  const double mean = sum(k, xp, count) / static_cast<double>(count);
  const double var = centered_squares(k, xp, count, static_cast<float>(mean)) / static_cast<double>(count);
  const double inv_std = 1.0 / std::sqrt(var + static_cast<double>(g.epsilon));
  for (std::int64_t c = 0; c < per_group; ++c) {
    const std::int64_t channel = group * per_group + c;
    const double a = scale[channel] * inv_std;
    const double b = bias[channel] - mean * a;
    affine(k, xp + c * g.inner, yp + c * g.inner, static_cast<std::size_t>(g.inner), static_cast<float>(a),
           static_cast<float>(b), act);
  }
  if (act.swish) silu::run(k, yp, count, act.swish_alpha);
}

}  // namespace group_norm

class GroupNormStep : public runtime::Step {
 public:
  GroupNormStep(runtime::StepInfo info, SlotId x, SlotId y, group_norm::Geometry g, std::vector<float> scale,
                std::vector<float> bias, group_norm::Activation act, silu::Kernel kernel)
      : Step(std::move(info), {x}, {y}), x_(x), y_(y), g_(g), scale_(std::move(scale)), bias_(std::move(bias)),
        act_(act), kernel_(kernel) {}

  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
    const auto* x = static_cast<const float*>(ctx.ptr(x_));
    auto* y = static_cast<float*>(ctx.ptr(y_));
    const std::int64_t tasks = g_.N * g_.G;
#pragma omp parallel for schedule(static) if (tasks > 1 && g_.N * g_.C * g_.inner > (1 << 14))
    for (std::int64_t t = 0; t < tasks; ++t)
      group_norm::normalize_group(kernel_, g_, scale_.data(), bias_.data(), act_, x, y, t / g_.G, t % g_.G);
  }

 private:
  SlotId x_, y_;
  group_norm::Geometry g_;
  std::vector<float> scale_, bias_;
  group_norm::Activation act_;
  silu::Kernel kernel_;
};

// The activation that `chain` (one op after the normalisation) asks for, when the kernel has it.
inline std::optional<group_norm::Activation> group_norm_activation(const PostOpChain& chain) {
  group_norm::Activation act;
  if (chain.eltwise.empty()) return act;
  if (chain.eltwise.size() != 1 || chain.eltwise[0].ops.size() != 1) return std::nullopt;
  const EltwiseSpec::Op& op = chain.eltwise[0].ops[0];
  switch (op.alg) {
    case dnnl::algorithm::eltwise_relu:  // max(v, 0) + alpha * min(v, 0)
      act.lo = 0;
      act.slope = op.alpha;
      return act;
    case dnnl::algorithm::eltwise_clip:
    case dnnl::algorithm::eltwise_clip_v2:
      act.lo = op.alpha;
      act.hi = op.beta;
      return act;
    default:
      return std::nullopt;
  }
}

// The Mul of Mul(y, Sigmoid(y)) (SiLU as exporters write it) when it and the Sigmoid are y's only readers,
// neither output is a graph output and both stay float32 of y's dims; else nullptr.
inline const Node* silu_of(const Lowering& L, const Value* y) {
  if (y->is_graph_output() || y->uses().size() != 2) return nullptr;
  const Node *sigmoid = nullptr, *mul = nullptr;
  for (const Use& u : y->uses()) {
    const Node* r = u.node;
    if (!r->domain().empty() || L.options.reference_ops.count(r->op_key())) return nullptr;
    if (r->op_type() == "Sigmoid" && r->num_inputs() == 1) sigmoid = r;
    else if (r->op_type() == "Mul" && r->num_inputs() == 2) mul = r;
  }
  if (!sigmoid || !mul) return nullptr;
  const Value* s = sigmoid->output(0);
  const bool operands = (mul->input(0) == y && mul->input(1) == s) || (mul->input(1) == y && mul->input(0) == s);
  if (!operands || s->is_graph_output() || s->uses().size() != 1 || !is_f32(mul->output(0)) ||
      mul->output(0)->shape().sizes() != y->shape().sizes())
    return nullptr;
  return mul;
}

// GroupNormalization (opset 18: scale/bias per group; 21: per channel), ondine.GroupNorm (per channel)
// and InstanceNormalization (a group per channel), float32 with constant scale and bias.
inline bool lower_group_norm(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!is_f32(x) || !is_f32(y) || x->is_constant() || y->shape().sizes() != x->shape().sizes()) return false;
  const Dims xd = x->shape().sizes();
  if (xd.size() < 2) return false;  // the reference kernel reports it
  group_norm::Geometry g;
  g.N = xd[0];
  g.C = xd[1];
  g.inner = 1;
  for (std::size_t i = 2; i < xd.size(); ++i) g.inner *= xd[i];
  const bool instance = n.op_type() == "InstanceNormalization";
  bool per_channel = true;
  if (instance) {
    g.G = g.C;
  } else {
    const infer::detail_nn_extra::GroupNormSpec spec = infer::detail_nn_extra::group_norm_spec(n);
    g.G = spec.groups;
    per_channel = spec.per_channel;
  }
  if (g.G <= 0 || g.C % g.G != 0 || g.N * g.C * g.inner == 0) return false;
  g.epsilon = n.attr_float("epsilon", 1e-5f);

  // Scale and bias: float32 constants of C (or G) values, made per channel now.
  const std::int64_t count = per_channel ? g.C : g.G;
  std::vector<float> params[2];
  for (std::size_t i = 0; i < 2; ++i) {
    const Value* p = n.input(i + 1);
    if (!p || !p->is_constant() || p->dtype() != DType::Float32 || p->constant().numel() != count) return false;
    const float* v = p->constant().data<float>();
    for (std::int64_t c = 0; c < g.C; ++c) params[i].push_back(v[per_channel ? c : c / (g.C / g.G)]);
  }

  PostOpChain chain = plan_post_ops(L, n, false);
  std::optional<group_norm::Activation> act = group_norm_activation(chain);
  if (!act) {
    chain = PostOpChain(y);
    act = group_norm::Activation{};
  }
  if (chain.nodes.empty()) {
    if (const Node* mul = silu_of(L, y)) {  // GroupNorm -> SiLU, as diffusion U-Nets have it
      chain.nodes = {mul->input(0) == y ? mul->input(1)->producer() : mul->input(0)->producer(), mul};
      chain.result = mul->output(0);
      act->swish = true;
    }
  }
  const IsaInfo isa = effective_isa();
  const silu::Kernel kernel = silu::choose(isa.avx512, isa_runs_on(CpuIsa::Avx2, isa.isa));
  SlotId xs = L.row_major_slot(x);
  SlotId ys = L.new_plain_slot(chain.result);
  for (const Node* folded : chain.nodes) L.fused.insert(folded);
  L.define_plain(chain.result, ys);
  char eps_text[32];
  std::snprintf(eps_text, sizeof eps_text, "%g", static_cast<double>(g.epsilon));
  std::string detail = std::to_string(g.G) + " groups of " + std::to_string(g.C / g.G) + " channels, eps " + eps_text +
                       chain.detail() + " plain" + dims_str(xd);
  L.add_step(std::make_unique<GroupNormStep>(runtime::StepInfo{n.name(), n.op_type(), silu::kernel_name(kernel), detail},
                                             xs, ys, g, std::move(params[0]), std::move(params[1]), *act, kernel));
  return true;
}

}  // namespace ondine::lower::detail
