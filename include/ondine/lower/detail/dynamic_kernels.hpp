// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/dynamic_kernels.hpp - kernels that take their sizes at run time, for the shape-free
// plan (lower/dynamic.hpp): made once per node when the model is compiled, they read the shapes of the
// tensors they are given at each call.
//
// What each does with a shape it has not seen:
//   matrix products by constant weights  oneDNN matmul with the rows (M) as DNNL_RUNTIME_DIM_VAL: one
//                                        primitive for every M, created at compile time; fewer than 8 rows
//                                        (a decoder's token) Ondine's loop streaming the weights once
//   products by 4- or 8-bit weights      Ondine's weight-only loop (weight_only.hpp), any number of rows
//   products of two activations          oneDNN's sgemm per matrix of the batch (dnnl_sgemm: sizes are
//                                        arguments, nothing is created)
//   ondine.Attention                     sgemm, the mask, a softmax row by row (vector exp), sgemm: per
//                                        matrix of the batch, across threads
//   LayerNormalization, Softmax          Ondine's loops over rows of any length
//   Add/Sub/Mul/Div                      Ondine's broadcasting loops
//   unary activations                    one oneDNN eltwise primitive over fixed-size chunks (a short last
//                                        chunk through a padded buffer), whatever the element count
//   Transpose                            Ondine's copy, whole rows where the last axis stays last
//   Concat, Gather on axis 0             row copies (the KV cache's Concat, embedding lookups)
//   Expand                               a broadcast copy by rows (grouped-query attention's repeated keys)
//   Pow by a constant 2                  x * x (RMSNorm's mean of squares)
// Everything else runs its reference kernel, which computes from the shapes it is given too. A kernel
// given a case it does not take at run time (a dtype, a broadcast) runs the reference kernel for that call.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <omp.h>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/ir/infer/tensor_ops.hpp"
#include "ondine/lower/detail/broadcast_ops.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"
#include "ondine/lower/detail/gemv.hpp"
#include "ondine/lower/detail/vector_exp.hpp"
#include "ondine/lower/detail/weight_only.hpp"
#include "ondine/lower/isa.hpp"
#include "ondine/reference/executor.hpp"
#include "ondine/runtime/buffer_pool.hpp"
#include "ondine/runtime/output_binding.hpp"

namespace ondine::lower::detail::dyn {

using Dims = std::vector<std::int64_t>;

// The vector exp for oneDNN's effective ISA.
inline vexp::ExpFn host_exp() {
  const IsaInfo isa = effective_isa();
  return vexp::exp_kernel(silu::choose(isa.avx512, isa_runs_on(CpuIsa::Avx2, isa.isa)));
}

// What a kernel needs of the run: where outputs come from, the oneDNN stream.
struct RunContext {
  runtime::BufferPool& pool;
  dnnl::stream& stream;
  // The caller's buffers for the current step's outputs (a run with bound outputs), by output index: the
  // buffer and the output's name, null where none is bound.
  std::vector<std::pair<const Tensor*, const std::string*>> bound;
  // The element strides of the current step's inputs that are views into a KV cache (runtime/kv_cache.hpp:
  // their dims are the value's, their layout the cache buffer's), by input index; null for the others. Only
  // kernels that read strides are given such inputs (DynamicModel::kv_pairs).
  std::vector<const Dims*> strides;
  const Dims* strides_of(std::size_t i) const { return i < strides.size() ? strides[i] : nullptr; }
  Tensor alloc(DType t, Dims d) { return pool.tensor(t, std::move(d)); }
  // Storage for the step's output `i`: the caller's buffer where one is bound to it (checked: an Error
  // naming the output when it is too small), else the pool's.
  Tensor alloc_output(std::size_t i, DType t, Dims d) {
    if (i < bound.size() && bound[i].first) return runtime::output_view(*bound[i].first, t, d, *bound[i].second);
    return alloc(t, std::move(d));
  }
};

class Kernel {
 public:
  explicit Kernel(const Node& n) : node_(n), reference_(reference::kernel_table().at(n.op_key())) {}
  virtual ~Kernel() = default;
  // The node's outputs for inputs of any shape (omitted optional inputs are empty tensors).
  virtual std::vector<Tensor> run(RunContext& ctx, const std::vector<Tensor>& in) const = 0;
  virtual std::string implementation() const = 0;
  // Runs once when the plan is built, so that the first call does not pay for what oneDNN prepares on a
  // primitive's first execution (its gemm kernels are generated then: tens of milliseconds once per process).
  virtual void warm_up(dnnl::stream&) const {}
  // Calls that took the reference kernel because the kernel does not take their case.
  std::size_t reference_calls() const { return reference_calls_.load(); }

 protected:
  std::vector<Tensor> reference(const std::vector<Tensor>& in) const {
    ++reference_calls_;
    return reference_(node_, in);
  }
  const Node& node_;

 private:
  reference::Kernel reference_;
  mutable std::atomic<std::size_t> reference_calls_{0};
};

inline std::int64_t numel_of(const Dims& d) {
  std::int64_t n = 1;
  for (auto x : d) n *= x;
  return n;
}

inline bool all_f32(const std::vector<Tensor>& in, std::initializer_list<std::size_t> which) {
  for (std::size_t i : which)
    if (i >= in.size() || in[i].empty() || in[i].kind() != Tensor::Kind::Dense || in[i].dtype() != DType::Float32)
      return false;
  return true;
}

// Runs `body(begin, end)` over [0, n) split across the OpenMP team when the work is worth it.
template <typename F>
inline void parallel_rows(std::int64_t n, std::int64_t work_per_row, F&& body) {
  const int threads = omp_get_max_threads();
  if (threads <= 1 || n < 2 || n * work_per_row < 32768 || omp_in_parallel()) return body(std::int64_t{0}, n);
#pragma omp parallel num_threads(threads)
  {
    const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const std::int64_t begin = n * t / nt, end = n * (t + 1) / nt;
    if (begin < end) body(begin, end);
  }
}

// --- broadcasting ---------------------------------------------------------------------------------

// Strides of `dims` read as `out` (left-padded; 0 where a dim of 1 is broadcast).
inline Dims broadcast_strides(const Dims& dims, const Dims& out) {
  Dims s(out.size(), 0);
  std::int64_t stride = 1;
  const std::size_t off = out.size() - dims.size();
  for (std::size_t i = dims.size(); i-- > 0;) {
    s[off + i] = dims[i] == 1 ? 0 : stride;
    stride *= dims[i];
  }
  return s;
}

// `out` and the operands' strides with adjacent dims merged wherever every operand walks them as one.
struct StridedLoop {
  Dims dims;
  std::vector<Dims> strides;  // per operand
};
inline StridedLoop merge_dims(const Dims& out, std::vector<Dims> strides) {
  StridedLoop l;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 1) continue;
    bool merge = !l.dims.empty();
    for (std::size_t k = 0; merge && k < strides.size(); ++k)
      merge = l.strides[k].back() == strides[k][i] * out[i];
    if (merge) {
      l.dims.back() *= out[i];
      for (std::size_t k = 0; k < strides.size(); ++k) l.strides[k].back() = strides[k][i];
    } else {
      l.dims.push_back(out[i]);
      if (l.strides.empty()) l.strides.resize(strides.size());
      for (std::size_t k = 0; k < strides.size(); ++k) l.strides[k].push_back(strides[k][i]);
    }
  }
  if (l.dims.empty()) {
    l.dims.push_back(1);
    l.strides.assign(strides.size(), Dims{0});
  }
  return l;
}

// The offsets of row `r` (all dims but the last) of a merged loop, per operand.
inline void row_offsets(const StridedLoop& l, std::int64_t r, std::int64_t* offsets) {
  for (std::size_t k = 0; k < l.strides.size(); ++k) offsets[k] = 0;
  for (std::size_t i = l.dims.size() - 1; i-- > 0;) {
    const std::int64_t idx = r % l.dims[i];
    r /= l.dims[i];
    for (std::size_t k = 0; k < l.strides.size(); ++k) offsets[k] += idx * l.strides[k][i];
  }
}

inline bool broadcast_shape(const Dims& a, const Dims& b, Dims& out) {
  const std::size_t r = std::max(a.size(), b.size());
  out.assign(r, 1);
  for (std::size_t i = 0; i < r; ++i) {
    const std::int64_t x = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const std::int64_t y = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (x != y && x != 1 && y != 1) return false;
    out[i] = x == 1 ? y : x;
  }
  return true;
}

// --- Add / Sub / Mul / Div ------------------------------------------------------------------------

enum class BinaryOp { Add, Sub, Mul, Div };

template <BinaryOp Op>
inline float apply_binary(float a, float b) {
  if constexpr (Op == BinaryOp::Add) return a + b;
  if constexpr (Op == BinaryOp::Sub) return a - b;
  if constexpr (Op == BinaryOp::Mul) return a * b;
  return a / b;
}

template <BinaryOp Op>
inline void binary_row(const float* a, std::int64_t sa, const float* b, std::int64_t sb, float* y, std::int64_t n) {
  if (sa == 1 && sb == 1) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = apply_binary<Op>(a[i], b[i]);
  } else if (sa == 0 && sb == 1) {
    const float x = a[0];
    for (std::int64_t i = 0; i < n; ++i) y[i] = apply_binary<Op>(x, b[i]);
  } else if (sa == 1 && sb == 0) {
    const float x = b[0];
    for (std::int64_t i = 0; i < n; ++i) y[i] = apply_binary<Op>(a[i], x);
  } else {
    for (std::int64_t i = 0; i < n; ++i) y[i] = apply_binary<Op>(a[i * sa], b[i * sb]);
  }
}

class BinaryKernel : public Kernel {
 public:
  BinaryKernel(const Node& n, BinaryOp op) : Kernel(n), op_(op) {}
  std::string implementation() const override { return "ondine:broadcast loop"; }
  std::vector<Tensor> run(RunContext& ctx, const std::vector<Tensor>& in) const override {
    Dims out;
    if (!all_f32(in, {0, 1}) || !broadcast_shape(in[0].dims(), in[1].dims(), out)) return reference(in);
    Tensor y = ctx.alloc_output(0, DType::Float32, out);
    if (y.numel() == 0) return {y};
    const StridedLoop l =
        merge_dims(out, {broadcast_strides(in[0].dims(), out), broadcast_strides(in[1].dims(), out), row_major_strides(out)});
    switch (op_) {
      case BinaryOp::Add: loop<BinaryOp::Add>(l, in[0], in[1], y); break;
      case BinaryOp::Sub: loop<BinaryOp::Sub>(l, in[0], in[1], y); break;
      case BinaryOp::Mul: loop<BinaryOp::Mul>(l, in[0], in[1], y); break;
      case BinaryOp::Div: loop<BinaryOp::Div>(l, in[0], in[1], y); break;
    }
    return {y};
  }

 private:
  template <BinaryOp Op>
  static void loop(const StridedLoop& l, const Tensor& a, const Tensor& b, Tensor& y) {
    const std::int64_t n = l.dims.back(), rows = numel_of(l.dims) / n;
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    float* py = y.data<float>();
    const std::int64_t sa = l.strides[0].back(), sb = l.strides[1].back();
    parallel_rows(rows, n, [&](std::int64_t begin, std::int64_t end) {
      std::int64_t off[3];
      for (std::int64_t r = begin; r < end; ++r) {
        row_offsets(l, r, off);
        binary_row<Op>(pa + off[0], sa, pb + off[1], sb, py + off[2], n);
      }
    });
  }
  BinaryOp op_;
};

// --- unary activations: one oneDNN eltwise primitive over fixed-size chunks --------------------------

class EltwiseKernel : public Kernel {
 public:
  static constexpr std::int64_t kChunk = 16384;
  EltwiseKernel(const Node& n, const EltwiseSpec& spec, const dnnl::engine& engine) : Kernel(n) {
    const memory::desc md = plain_md({kChunk});
    for (const auto& op : spec.ops) {
      dnnl::eltwise_forward::primitive_desc pd(
          {dnnl::prop_kind::forward_inference, op.alg, md, op.alpha, op.beta}, engine);
      prims_.emplace_back(pd);
      impl_ = pd.impl_info_str();
    }
    md_ = md;
    engine_ = engine;
  }
  std::string implementation() const override { return "oneDNN eltwise in chunks (" + impl_ + ")"; }
  std::vector<Tensor> run(RunContext& ctx, const std::vector<Tensor>& in) const override {
    if (!all_f32(in, {0})) return reference(in);
    Tensor y = ctx.alloc_output(0, DType::Float32, in[0].dims());
    const std::int64_t n = y.numel();
    const float* x = in[0].data<float>();
    float* py = y.data<float>();
    std::int64_t done = 0;
    for (; done + kChunk <= n; done += kChunk) apply(ctx, x + done, py + done);
    if (done < n) {
      float tail[kChunk];
      const std::int64_t rest = n - done;
      std::memcpy(tail, x + done, static_cast<std::size_t>(rest) * sizeof(float));
      std::fill(tail + rest, tail + kChunk, 0.0f);
      apply(ctx, tail, tail);
      std::memcpy(py + done, tail, static_cast<std::size_t>(rest) * sizeof(float));
    }
    return {y};
  }

 private:
  void apply(RunContext& ctx, const float* src, float* dst) const {
    memory s(md_, engine_, const_cast<float*>(src)), d(md_, engine_, dst);
    for (std::size_t i = 0; i < prims_.size(); ++i) {
      prims_[i].execute(ctx.stream, {{DNNL_ARG_SRC, i == 0 ? s : d}, {DNNL_ARG_DST, d}});
    }
    ctx.stream.wait();
  }
  std::vector<dnnl::eltwise_forward> prims_;
  memory::desc md_;
  dnnl::engine engine_;
  std::string impl_;
};

// --- LayerNormalization, Softmax ----------------------------------------------------------------

// LayerNormalization, or with `rms` ondine.RMSNorm (no mean taken out, no bias), over the rows of the
// normalised shape.
class LayerNormKernel : public Kernel {
 public:
  explicit LayerNormKernel(const Node& n, bool rms = false)
      : Kernel(n), axis_(n.attr_int("axis", -1)), eps_(n.attr_float("epsilon", 1e-5f)), rms_(rms) {}
  std::string implementation() const override { return rms_ ? "ondine:RMS norm rows" : "ondine:layer norm rows"; }
  std::vector<Tensor> run(RunContext& ctx, const std::vector<Tensor>& in) const override {
    if (!all_f32(in, {0, 1}) || (in.size() > 2 && !in[2].empty() && in[2].dtype() != DType::Float32))
      return reference(in);
    const Tensor& x = in[0];
    const auto rank = static_cast<std::int64_t>(x.rank());
    const std::int64_t axis = axis_ < 0 ? axis_ + rank : axis_;
    if (axis < 0 || axis >= rank) return reference(in);
    std::int64_t d = 1;
    for (std::int64_t i = axis; i < rank; ++i) d *= x.dims()[static_cast<std::size_t>(i)];
    const bool has_bias = in.size() > 2 && !in[2].empty();
    if (d == 0 || in[1].numel() != d || (has_bias && in[2].numel() != d)) return reference(in);
    Tensor y = ctx.alloc_output(0, DType::Float32, x.dims());
    const float* px = x.data<float>();
    const float* scale = in[1].data<float>();
    const float* bias = has_bias ? in[2].data<float>() : nullptr;
    float* py = y.data<float>();
    const float eps = eps_;
    parallel_rows(x.numel() / d, d, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t r = begin; r < end; ++r) {
        const float* row = px + r * d;
        float* out = py + r * d;
        // omp simd: the sums in vector lanes (the order of float additions is the compiler's to choose).
        float sum = 0;
        if (!rms_) {
#pragma omp simd reduction(+ : sum)
          for (std::int64_t i = 0; i < d; ++i) sum += row[i];
        }
        const float mean = sum / static_cast<float>(d);
        float var = 0;
#pragma omp simd reduction(+ : var)
        for (std::int64_t i = 0; i < d; ++i) var += (row[i] - mean) * (row[i] - mean);
        const float inv = 1.0f / std::sqrt(var / static_cast<float>(d) + eps);
        if (bias)
          for (std::int64_t i = 0; i < d; ++i) out[i] = (row[i] - mean) * inv * scale[i] + bias[i];
        else
          for (std::int64_t i = 0; i < d; ++i) out[i] = (row[i] - mean) * inv * scale[i];
      }
    });
    return {y};
  }

 private:
  std::int64_t axis_;
  float eps_;
  bool rms_;
};

// ondine.Rotary (ir/fused_ops.hpp): Y = X * cos + rotate_half(X) * sin along the last axis, cos and sin read
// through their broadcast (one row of them per position, shared by the heads).
class RotaryKernel : public Kernel {
 public:
  explicit RotaryKernel(const Node& n) : Kernel(n) {}
  std::string implementation() const override { return "ondine:rotary rows"; }
  std::vector<Tensor> run(RunContext& ctx, const std::vector<Tensor>& in) const override {
    if (in.size() < 3 || !all_f32(in, {0, 1, 2})) return reference(in);
    const Tensor &x = in[0], &c = in[1], &s = in[2];
    if (x.rank() == 0 || c.rank() == 0 || c.dims() != s.dims()) return reference(in);
    const std::int64_t d = x.dims().back();
    Dims out;
    if (d == 0 || d % 2 != 0 || c.dims().back() != d || !broadcast_shape(x.dims(), c.dims(), out) || out != x.dims())
      return reference(in);
    Tensor y = ctx.alloc_output(0, DType::Float32, x.dims());
    const Dims cs = broadcast_strides(c.dims(), x.dims());
    const Dims& xd = x.dims();
    const std::int64_t rows = x.numel() / d, h = d / 2;
    const float *px = x.data<float>(), *pc = c.data<float>(), *ps = s.data<float>();
    float* py = y.data<float>();
    parallel_rows(rows, d, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t r = begin; r < end; ++r) {
        std::int64_t rest = r, oc = 0;
        for (std::size_t i = xd.size() - 1; i-- > 0;) {
          oc += rest % xd[i] * cs[i];
          rest /= xd[i];
        }
        const float *xr = px + r * d, *cr = pc + oc, *sr = ps + oc;
        float* yr = py + r * d;
#pragma omp simd
        for (std::int64_t j = 0; j < h; ++j) yr[j] = xr[j] * cr[j] - xr[j + h] * sr[j];
#pragma omp simd
        for (std::int64_t j = h; j < d; ++j) yr[j] = xr[j] * cr[j] + xr[j - h] * sr[j];
      }
    });
    return {y};
  }
};

// Softmax (or log-softmax) of each row of `len` floats in place; a row whose maximum is -inf gives NaN, as
// the reference does.
inline void softmax_row(float* x, std::int64_t len, vexp::ExpFn exp_fn, bool log) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (std::int64_t j = 0; j < len; ++j) mx = mx > x[j] ? mx : x[j];
  if (std::isinf(mx) && mx < 0) mx = 0;
  if (log) {
    std::vector<float> e(x, x + len);
    for (float& v : e) v -= mx;
    exp_fn(e.data(), static_cast<std::size_t>(len));
    float sum = 0;
    for (float v : e) sum += v;
    const float lse = mx + std::log(sum);
    for (std::int64_t j = 0; j < len; ++j) x[j] -= lse;
    return;
  }
  for (std::int64_t j = 0; j < len; ++j) x[j] -= mx;
  exp_fn(x, static_cast<std::size_t>(len));
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t j = 0; j < len; ++j) sum += x[j];
  const float inv = 1.0f / sum;
  for (std::int64_t j = 0; j < len; ++j) x[j] *= inv;
}

class SoftmaxKernel : public Kernel {
 public:
  SoftmaxKernel(const Node& n, vexp::ExpFn exp_fn)
      : Kernel(n), axis_(n.attr_int("axis", n.opset() >= 13 ? -1 : 1)), flatten_(n.opset() < 13),
        log_(n.op_type() == "LogSoftmax"), exp_(exp_fn) {}
  std::string implementation() const override { return "ondine:softmax rows"; }
  std::vector<Tensor> run(RunContext& ctx, const std::vector<Tensor>& in) const override {
    if (!all_f32(in, {0})) return reference(in);
    const Tensor& x = in[0];
    const auto rank = static_cast<std::int64_t>(x.rank());
    const std::int64_t axis = axis_ < 0 ? axis_ + rank : axis_;
    if (rank == 0 || axis < 0 || axis >= rank || (!flatten_ && axis != rank - 1)) return reference(in);
    std::int64_t len = 1;
    for (std::int64_t i = axis; i < rank; ++i) len *= x.dims()[static_cast<std::size_t>(i)];
    Tensor y = ctx.alloc_output(0, DType::Float32, x.dims());
    if (y.numel() == 0) return {y};
    std::memcpy(y.raw(), x.raw(), y.nbytes());
    float* p = y.data<float>();
    parallel_rows(y.numel() / len, len * 8, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t r = begin; r < end; ++r) softmax_row(p + r * len, len, exp_, log_);
    });
    return {y};
  }

 private:
  std::int64_t axis_;
  bool flatten_, log_;
  vexp::ExpFn exp_;
};

// --- Transpose --------------------------------------------------------------------------------------

class TransposeKernel : public Kernel {
 public:
  explicit TransposeKernel(const Node& n) : Kernel(n) {
    if (n.has_attr("perm")) perm_ = n.attr_ints("perm");
  }
  std::string implementation() const override { return "ondine:strided copy"; }
  std::vector<Tensor> run(RunContext& ctx, const std::vector<Tensor>& in) const override {
    const Tensor& x = in[0];
    if (x.empty() || x.kind() != Tensor::Kind::Dense || x.dtype() == DType::String) return reference(in);
    const std::size_t rank = x.rank();
    std::vector<std::int64_t> perm = perm_;
    if (perm.empty())
      for (std::size_t i = 0; i < rank; ++i) perm.push_back(static_cast<std::int64_t>(rank - 1 - i));
    if (perm.size() != rank) return reference(in);
    std::vector<bool> seen(rank, false);
    for (auto p : perm) {
      if (p < 0 || p >= static_cast<std::int64_t>(rank) || seen[static_cast<std::size_t>(p)]) return reference(in);
      seen[static_cast<std::size_t>(p)] = true;
    }
    Dims out(rank);
    const Dims src_strides = row_major_strides(x.dims());
    Dims strides(rank);
    for (std::size_t i = 0; i < rank; ++i) {
      out[i] = x.dims()[static_cast<std::size_t>(perm[i])];
      strides[i] = src_strides[static_cast<std::size_t>(perm[i])];
    }
    Tensor y = ctx.alloc_output(0, x.dtype(), out);
    if (y.numel() == 0) return {y};
    const std::size_t width = dtype_size(x.dtype());
    const StridedLoop l = merge_dims(out, {strides, row_major_strides(out)});
    const std::int64_t n = l.dims.back(), rows = numel_of(l.dims) / n, s = l.strides[0].back();
    const char* src = static_cast<const char*>(x.raw());
    char* dst = static_cast<char*>(y.raw());
    parallel_rows(rows, n, [&](std::int64_t begin, std::int64_t end) {
      std::int64_t off[2];
      for (std::int64_t r = begin; r < end; ++r) {
        row_offsets(l, r, off);
        const char* a = src + off[0] * static_cast<std::int64_t>(width);
        char* b = dst + off[1] * static_cast<std::int64_t>(width);
        if (s == 1) {
          std::memcpy(b, a, static_cast<std::size_t>(n) * width);
        } else if (width == 4) {
          const auto* a4 = reinterpret_cast<const std::uint32_t*>(a);
          auto* b4 = reinterpret_cast<std::uint32_t*>(b);
          for (std::int64_t i = 0; i < n; ++i) b4[i] = a4[i * s];
        } else {
          for (std::int64_t i = 0; i < n; ++i)
            std::memcpy(b + i * static_cast<std::int64_t>(width), a + i * s * static_cast<std::int64_t>(width), width);
        }
      }
    });
    return {y};
  }

 private:
  std::vector<std::int64_t> perm_;
};

// --- Concat, Gather: row copies into pooled memory --------------------------------------------------

// Concat along any axis: per outer index, each input's block copied whole (the KV cache's
// Concat(past, new) moves its rows once, into memory the pool already has).
class ConcatKernel : public Kernel {
 public:
  explicit ConcatKernel(const Node& n) : Kernel(n), axis_(n.attr_int("axis", 1)) {}
  std::string implementation() const override { return "ondine:row copy"; }
  std::vector<Tensor> run(RunContext& ctx, const std::vector<Tensor>& in) const override {
    if (in.empty() || in[0].empty() || in[0].kind() != Tensor::Kind::Dense || in[0].dtype() == DType::String ||
        in[0].rank() == 0)
      return reference(in);
    const Tensor& first = in[0];
    const auto rank = static_cast<std::int64_t>(first.rank());
    const std::int64_t axis = axis_ < 0 ? axis_ + rank : axis_;
    if (axis < 0 || axis >= rank) return reference(in);
    const auto ax = static_cast<std::size_t>(axis);
    Dims out = first.dims();
    out[ax] = 0;
    for (const Tensor& t : in) {
      if (t.empty() || t.kind() != Tensor::Kind::Dense || t.dtype() != first.dtype() || t.rank() != first.rank())
        return reference(in);
      for (std::size_t d = 0; d < t.rank(); ++d)
        if (d != ax && t.dims()[d] != first.dims()[d]) return reference(in);
      out[ax] += t.dims()[ax];
    }
    Tensor y = ctx.alloc_output(0, first.dtype(), out);
    if (y.numel() == 0) return {y};
    const std::size_t width = dtype_size(first.dtype());
    const std::int64_t outer = numel_of(Dims(out.begin(), out.begin() + axis));
    const std::size_t out_row = static_cast<std::size_t>(numel_of(Dims(out.begin() + axis, out.end()))) * width;
    char* dst = static_cast<char*>(y.raw());
    parallel_rows(outer, static_cast<std::int64_t>(out_row / 4), [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t o = begin; o < end; ++o) {
        std::size_t col = 0;
        for (const Tensor& t : in) {
          const std::size_t row = static_cast<std::size_t>(numel_of(Dims(t.dims().begin() + axis, t.dims().end()))) * width;
          if (row)
            std::memcpy(dst + static_cast<std::size_t>(o) * out_row + col,
                        static_cast<const char*>(t.raw()) + static_cast<std::size_t>(o) * row, row);
          col += row;
        }
      }
    });
    return {y};
  }

 private:
  std::int64_t axis_;
};

// Split(x[, sizes]) along an axis: each output's rows copied into a tensor of the pool (a fused QKV
// projection split into Q, K and V). The sizes as the reference kernel reads them (ir/infer/tensor_ops.hpp:
// the second input, the `split` attribute, equal or opset 18's num_outputs parts), with its errors.
class SplitKernel : public Kernel {
 public:
  explicit SplitKernel(const Node& n) : Kernel(n), axis_(n.attr_int("axis", 0)) {}
  std::string implementation() const override { return "ondine:row copy"; }
  std::vector<Tensor> run(RunContext& ctx, const std::vector<Tensor>& in) const override {
    namespace ops = ::ondine::infer::detail_tensor_ops;
    if (in.empty() || in[0].kind() != Tensor::Kind::Dense || in[0].dtype() == DType::String || in[0].rank() == 0)
      return reference(in);
    const Tensor& x = in[0];
    const auto rank = static_cast<std::int64_t>(x.rank());
    const auto ax = static_cast<std::size_t>(infer::normalize_axis(node_, axis_, rank));
    const std::int64_t extent = x.dims()[ax];
    const ops::IntParam given = ops::split_param(node_, in.size() > 1 && !in[1].empty() ? &in[1] : nullptr);
    const std::vector<std::int64_t> sizes = ops::split_sizes(node_, extent, given.values, node_.num_outputs());
    const std::size_t width = dtype_size(x.dtype());
    const std::int64_t outer = numel_of(Dims(x.dims().begin(), x.dims().begin() + static_cast<std::ptrdiff_t>(ax)));
    const std::size_t inner =
        static_cast<std::size_t>(numel_of(Dims(x.dims().begin() + static_cast<std::ptrdiff_t>(ax) + 1, x.dims().end()))) * width;
    const std::size_t in_row = static_cast<std::size_t>(extent) * inner;
    std::vector<Tensor> out;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      Dims d = x.dims();
      d[ax] = sizes[k];
      out.push_back(ctx.alloc_output(k, x.dtype(), d));
    }
    const char* src = static_cast<const char*>(x.raw());
    parallel_rows(outer, static_cast<std::int64_t>(in_row / 4), [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t o = begin; o < end; ++o) {
        std::size_t col = 0;
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          const std::size_t row = static_cast<std::size_t>(sizes[k]) * inner;
          if (row)
            std::memcpy(static_cast<char*>(out[k].raw()) + static_cast<std::size_t>(o) * row,
                        src + static_cast<std::size_t>(o) * in_row + col, row);
          col += row;
        }
      }
    });
    return out;
  }

 private:
  std::int64_t axis_;
};

// Gather on axis 0 by int64 / int32 indices (an embedding lookup): one row copy per index. An index out of
// range goes to the reference kernel, whose error names the node and the index.
class GatherRowsKernel : public Kernel {
 public:
  explicit GatherRowsKernel(const Node& n) : Kernel(n), axis_(n.attr_int("axis", 0)) {}
  std::string implementation() const override { return "ondine:row copy per index"; }
  std::vector<Tensor> run(RunContext& ctx, const std::vector<Tensor>& in) const override {
    if (in.size() < 2 || in[0].empty() || in[1].empty() || in[0].kind() != Tensor::Kind::Dense ||
        in[0].dtype() == DType::String || in[0].rank() < 1 || axis_ != 0 ||
        (in[1].dtype() != DType::Int64 && in[1].dtype() != DType::Int32))
      return reference(in);
    const Tensor &x = in[0], &idx = in[1];
    const std::int64_t rows = x.dims()[0], count = idx.numel();
    std::vector<std::int64_t> at(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) {
      std::int64_t k = idx.dtype() == DType::Int64 ? idx.data<std::int64_t>()[i] : idx.data<std::int32_t>()[i];
      if (k < 0) k += rows;
      if (k < 0 || k >= rows) return reference(in);  // its error names the index and the range
      at[static_cast<std::size_t>(i)] = k;
    }
    Dims out = idx.dims();
    out.insert(out.end(), x.dims().begin() + 1, x.dims().end());
    Tensor y = ctx.alloc_output(0, x.dtype(), out);
    const std::size_t row = static_cast<std::size_t>(numel_of(Dims(x.dims().begin() + 1, x.dims().end()))) * dtype_size(x.dtype());
    if (row == 0 || count == 0) return {y};
    const char* src = static_cast<const char*>(x.raw());
    char* dst = static_cast<char*>(y.raw());
    parallel_rows(count, static_cast<std::int64_t>(row / 4), [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i)
        std::memcpy(dst + static_cast<std::size_t>(i) * row, src + static_cast<std::size_t>(at[static_cast<std::size_t>(i)]) * row, row);
    });
    return {y};
  }

 private:
  std::int64_t axis_;
};

// --- products of two activations, attention -------------------------------------------------------

// C = alpha * A B for row-major A [M, K], B [K, N], C [M, N] (sgemm runs single-threaded inside a parallel
// region, on the team otherwise).
inline void sgemm(std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A, const float* B, float* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    std::fill(C, C + M * N, 0.0f);
    return;
  }
  dnnl_sgemm('N', 'N', M, N, K, alpha, A, K, B, N, 0.0f, C, N);
}

// The batch of a product: out's batch dims and each operand's matrix strides over them.
struct BatchPlan {
  Dims batch;
  Dims sa, sb;  // per batch dim, in matrices (0 where broadcast)
  std::int64_t count = 1;
  void offsets(std::int64_t b, std::int64_t& oa, std::int64_t& ob) const {
    oa = ob = 0;
    for (std::size_t i = batch.size(); i-- > 0;) {
      const std::int64_t idx = b % batch[i];
      b /= batch[i];
      oa += idx * sa[i];
      ob += idx * sb[i];
    }
  }
};
inline bool plan_batch(const Dims& a, const Dims& b, BatchPlan& p) {
  const Dims ab(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  if (!broadcast_shape(ab, bb, p.batch)) return false;
  p.sa = broadcast_strides(ab, p.batch);
  p.sb = broadcast_strides(bb, p.batch);
  p.count = numel_of(p.batch);
  return true;
}

class BatchedMatMulKernel : public Kernel {
 public:
  explicit BatchedMatMulKernel(const Node& n) : Kernel(n) {}
  std::string implementation() const override { return "oneDNN sgemm per matrix"; }
  std::vector<Tensor> run(RunContext& ctx, const std::vector<Tensor>& in) const override {
    if (!all_f32(in, {0, 1}) || in[0].rank() < 2 || in[1].rank() < 2) return reference(in);
    const Dims& ad = in[0].dims();
    const Dims& bd = in[1].dims();
    const std::int64_t M = ad[ad.size() - 2], K = ad.back(), N = bd.back();
    BatchPlan p;
    if (bd[bd.size() - 2] != K || !plan_batch(ad, bd, p)) return reference(in);
    Dims out = p.batch;
    out.push_back(M);
    out.push_back(N);
    Tensor y = ctx.alloc_output(0, DType::Float32, out);
    const float* a = in[0].data<float>();
    const float* b = in[1].data<float>();
    float* c = y.data<float>();
    auto one = [&](std::int64_t i) {
      std::int64_t oa, ob;
      p.offsets(i, oa, ob);
      sgemm(M, N, K, 1.0f, a + oa * M * K, b + ob * K * N, c + i * M * N);
    };
    if (p.count == 1) {
      one(0);
    } else {
      parallel_rows(p.count, M * N * K, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i) one(i);
      });
    }
    return {y};
  }
};

// A matrix per batch index read from a tensor with strides: the operand of an sgemm, which takes a row-major
// matrix with a leading dimension, or its transpose.
// A contiguous copy of `view` (its dims) whose elements lie at `strides` (in elements) from its data: a
// view into a KV cache, for a kernel that reads only contiguous tensors.
inline Tensor gather_strided(const Tensor& view, const Dims& strides) {
  Tensor out = Tensor::uninitialized(view.dtype(), view.dims());
  const std::size_t rank = view.rank(), width = dtype_size(view.dtype());
  if (!out.numel() || rank == 0 || strides.size() != rank) return out.numel() ? view.clone() : out;
  const std::int64_t inner = view.dims().back();
  const std::int64_t rows = out.numel() / inner;
  const char* src = static_cast<const char*>(view.raw());
  char* dst = static_cast<char*>(out.raw());
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t rest = r, offset = 0;
    for (std::size_t d = rank - 1; d-- > 0;) {
      offset += (rest % view.dims()[d]) * strides[d];
      rest /= view.dims()[d];
    }
    if (strides.back() == 1)
      std::memcpy(dst + static_cast<std::size_t>(r * inner) * width, src + static_cast<std::size_t>(offset) * width,
                  static_cast<std::size_t>(inner) * width);
    else
      for (std::int64_t j = 0; j < inner; ++j)
        std::memcpy(dst + static_cast<std::size_t>(r * inner + j) * width,
                    src + static_cast<std::size_t>(offset + j * strides.back()) * width, width);
  }
  return out;
}

struct MatrixView {
  Dims batch_strides;  // per batch dim, in elements
  std::int64_t rows = 0, cols = 0, row_stride = 0, col_stride = 1;
  // sgemm's trans flag and leading dimension for this matrix (one of its strides is 1: absorb() checks).
  char trans() const { return col_stride == 1 ? 'N' : 'T'; }
  std::int64_t ld() const {
    if (col_stride == 1) return std::max(row_stride, std::max<std::int64_t>(cols, 1));
    return std::max(col_stride, std::max<std::int64_t>(rows, 1));
  }
};

// The logical operand [batch..., rows, cols] a Transpose with `perm` makes of a contiguous tensor of `src`
// dims, read in place (no perm: the tensor itself).
// `src_strides`: the tensor's element strides where it is not contiguous (a view into a KV cache).
inline MatrixView matrix_view(const Dims& src, const std::vector<std::int64_t>& perm, const Dims* src_strides = nullptr) {
  const std::size_t rank = src.size();
  const Dims st = src_strides ? *src_strides : row_major_strides(src);
  Dims dims(rank), strides(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const std::size_t from = perm.empty() ? i : static_cast<std::size_t>(perm[i]);
    dims[i] = src[from];
    strides[i] = st[from];
  }
  MatrixView v;
  v.rows = dims[rank - 2];
  v.cols = dims[rank - 1];
  v.row_stride = strides[rank - 2];
  v.col_stride = strides[rank - 1];
  v.batch_strides.assign(strides.begin(), strides.end() - 2);
  return v;
}

inline Dims permuted(const Dims& src, const std::vector<std::int64_t>& perm) {
  if (perm.empty()) return src;
  Dims out(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) out[i] = src[static_cast<std::size_t>(perm[i])];
  return out;
}

// ondine.Attention(Q, K^T, V[, mask]) = softmax(scale * Q K^T + mask) V per matrix of the batch.
//
// The Transposes that exported attention puts around it (heads split out of [batch, seq, heads, dim] for
// Q, K^T and V, and merged back after) can be absorbed when the plan is built (DynamicModel): the kernel then
// reads its operands where they are, through the strides those Transposes describe (sgemm's leading
// dimensions and trans flags), and writes its output in the layout the Transpose after it would make. A
// KV cache's K^T is then read from the present itself; no copy is made.
class AttentionKernel : public Kernel {
 public:
  AttentionKernel(const Node& n, vexp::ExpFn exp_fn) : Kernel(n), scale_(n.attr_float("scale", 1.0f)), exp_(exp_fn) {}
  std::string implementation() const override {
    return absorbed_ ? "oneDNN sgemm + Ondine softmax per matrix, transposes read in place"
                     : "oneDNN sgemm + Ondine softmax per matrix";
  }
  // Reads input `i` (Q 0, K^T 1, V 2) through `transpose` (a Transpose node with `perm` whose output only
  // this node reads): the input given at run time is then the Transpose's input. False where the strides
  // would not make an sgemm operand (the last axis of the source must stay one of the matrix's axes).
  bool absorb_input(std::size_t i, const Node& transpose, const std::vector<std::int64_t>& perm) {
    if (i > 2 || perm.size() < 2) return false;
    const auto last = static_cast<std::int64_t>(perm.size()) - 1;
    if (perm[perm.size() - 1] != last && perm[perm.size() - 2] != last) return false;
    in_perm_[i] = perm;
    in_transpose_[i] = &transpose;
    absorbed_ = true;
    return true;
  }
  // Writes the output as `transpose` (with `perm`, the only reader of the output) would lay it out; the
  // output's last axis must stay last.
  bool absorb_output(const Node& transpose, const std::vector<std::int64_t>& perm) {
    if (perm.size() < 2 || perm.back() != static_cast<std::int64_t>(perm.size()) - 1) return false;
    out_perm_ = perm;
    out_transpose_ = &transpose;
    absorbed_ = true;
    return true;
  }

  std::vector<Tensor> run(RunContext& ctx, const std::vector<Tensor>& in) const override {
    const bool has_mask = in.size() > 3 && !in[3].empty();
    if (!all_f32(in, {0, 1, 2}) || (has_mask && !all_f32(in, {3}))) return fallback(ctx, in);
    const std::size_t rank = in[0].rank();
    for (std::size_t i = 0; i < 3; ++i)
      if (in[i].rank() != rank || (!in_perm_[i].empty() && in_perm_[i].size() != rank) ||
          (ctx.strides_of(i) && ctx.strides_of(i)->size() != rank))
        return fallback(ctx, in);
    if (rank < 2 || (!out_perm_.empty() && out_perm_.size() != rank)) return fallback(ctx, in);
    const Dims qd = permuted(in[0].dims(), in_perm_[0]);
    const Dims kd = permuted(in[1].dims(), in_perm_[1]);
    const Dims vd = permuted(in[2].dims(), in_perm_[2]);
    // Grouped-query attention: K and V may have fewer heads (query index i reads i / group).
    const Dims qb(qd.begin(), qd.end() - 2);
    const auto kg = fused::attention_groups(qb, Dims(kd.begin(), kd.end() - 2));
    const auto vg = fused::attention_groups(qb, Dims(vd.begin(), vd.end() - 2));
    if (!kg || !vg) return fallback(ctx, in);
    const std::int64_t Sq = qd[rank - 2], D = qd[rank - 1], Sk = kd[rank - 1], Dv = vd[rank - 1];
    if (kd[rank - 2] != D || vd[rank - 2] != Sk) return fallback(ctx, in);
    Dims scores = qd;
    scores.back() = Sk;
    Dims mask_strides;
    if (has_mask) {
      if (in[3].rank() > rank) return fallback(ctx, in);
      Dims b;
      if (!broadcast_shape(in[3].dims(), scores, b) || b != scores) return fallback(ctx, in);
      mask_strides = broadcast_strides(in[3].dims(), scores);
    }
    Dims out = qd;  // logical [batch..., Sq, Dv]
    out.back() = Dv;
    // Where the output goes: the layout the absorbed Transpose makes (dest axis i holds logical axis perm[i]).
    Dims dest = out;
    Dims out_strides = row_major_strides(out);
    if (!out_perm_.empty()) {
      dest = permuted(out, out_perm_);
      const Dims ds = row_major_strides(dest);
      for (std::size_t i = 0; i < rank; ++i) out_strides[static_cast<std::size_t>(out_perm_[i])] = ds[i];
    }
    Tensor y = ctx.alloc_output(0, DType::Float32, dest);
    if (y.numel() == 0) return {y};
    const MatrixView q = matrix_view(in[0].dims(), in_perm_[0], ctx.strides_of(0));
    const MatrixView k = matrix_view(in[1].dims(), in_perm_[1], ctx.strides_of(1));
    const MatrixView v = matrix_view(in[2].dims(), in_perm_[2], ctx.strides_of(2));
    for (const MatrixView* m : {&q, &k, &v})
      if (m->col_stride != 1 && m->row_stride != 1) return fallback(ctx, in);  // not an sgemm operand
    const std::int64_t ldc = std::max(out_strides[rank - 2], std::max<std::int64_t>(Dv, 1));
    const Dims batch_dims(qd.begin(), qd.end() - 2);
    const std::int64_t batch = numel_of(batch_dims);
    const float* pq = in[0].data<float>();
    const float* pk = in[1].data<float>();
    const float* pv = in[2].data<float>();
    const float* pm = has_mask ? in[3].data<float>() : nullptr;
    float* py = y.data<float>();
    auto one = [&](std::int64_t b, float* s) {
      std::int64_t oq = 0, ok = 0, ov = 0, oy = 0, om = 0, rest = b;
      for (std::size_t i = batch_dims.size(); i-- > 0;) {
        const std::int64_t idx = rest % batch_dims[i];
        rest /= batch_dims[i];
        oq += idx * q.batch_strides[i];
        ok += idx / (*kg)[i] * k.batch_strides[i];
        ov += idx / (*vg)[i] * v.batch_strides[i];
        oy += idx * out_strides[i];
        if (pm) om += idx * mask_strides[i];
      }
      if (Sk == 0) {  // nothing to attend to: a product over an empty axis, zeros (as the reference)
        for (std::int64_t i = 0; i < Sq; ++i) std::fill(py + oy + i * ldc, py + oy + i * ldc + Dv, 0.0f);
        return;
      }
      if (D == 0) std::fill(s, s + Sq * Sk, 0.0f);
      else
        dnnl_sgemm(q.trans(), k.trans(), Sq, Sk, D, scale_, pq + oq, q.ld(), pk + ok, k.ld(), 0.0f, s, Sk);
      if (pm) {
        const std::int64_t row_stride = mask_strides[rank - 2], col_stride = mask_strides[rank - 1];
        for (std::int64_t i = 0; i < Sq; ++i) {
          const float* m = pm + om + i * row_stride;
          float* row = s + i * Sk;
          if (col_stride == 1)
            for (std::int64_t j = 0; j < Sk; ++j) row[j] += m[j];
          else
            for (std::int64_t j = 0; j < Sk; ++j) row[j] += m[0];
        }
      }
      for (std::int64_t i = 0; i < Sq; ++i) softmax_row(s + i * Sk, Sk, exp_, false);
      if (Dv > 0) dnnl_sgemm('N', v.trans(), Sq, Dv, Sk, 1.0f, s, Sk, pv + ov, v.ld(), 0.0f, py + oy, ldc);
    };
    Tensor scratch = ctx.alloc(DType::Float32, {omp_get_max_threads(), std::max<std::int64_t>(Sq * Sk, 1)});
    float* base = scratch.data<float>();
    parallel_rows(batch, Sq * Sk * (D + Dv), [&](std::int64_t begin, std::int64_t end) {
      float* s = base + static_cast<std::int64_t>(omp_in_parallel() ? omp_get_thread_num() : 0) * std::max<std::int64_t>(Sq * Sk, 1);
      for (std::int64_t b = begin; b < end; ++b) one(b, s);
    });
    return {y};
  }

 private:
  // The reference kernel on the operands as the graph gives them: the absorbed Transposes applied first
  // (and after, to the output) by their own reference kernels.
  std::vector<Tensor> fallback(RunContext& ctx, const std::vector<Tensor>& in) const {
    std::vector<Tensor> args = in;
    for (std::size_t i = 0; i < args.size(); ++i)  // views into a KV cache, made contiguous first
      if (const Dims* st = ctx.strides_of(i)) args[i] = gather_strided(in[i], *st);
    if (!absorbed_) return reference(args);
    const auto& transpose = reference::kernel_table().at("Transpose");
    for (std::size_t i = 0; i < 3 && i < args.size(); ++i)
      if (in_transpose_[i]) args[i] = transpose(*in_transpose_[i], {args[i]}).at(0);
    std::vector<Tensor> out = reference(args);
    if (out_transpose_) out[0] = transpose(*out_transpose_, {out[0]}).at(0);
    return out;
  }

  float scale_;
  vexp::ExpFn exp_;
  bool absorbed_ = false;
  std::vector<std::int64_t> in_perm_[3], out_perm_;
  const Node* in_transpose_[3] = {nullptr, nullptr, nullptr};
  const Node* out_transpose_ = nullptr;
};

// --- products by constant weights ----------------------------------------------------------------

// Y = act(A W + bias + Sum) with W [K, N] constant, A [..., K] of any leading dims: the rows M of A
// (all leading dims together) are a run-time dim.
//
// From kFewRows rows: one oneDNN matmul made at compile time with M = DNNL_RUNTIME_DIM_VAL (its gemm-based
// kernel on the plain weights), nothing created at run time whatever M. The Sum is copied into the output,
// which the product then adds to through a sum post-op (the only way oneDNN 2.6 takes a run-time-sized
// operand). Below kFewRows (a decoder's token, a short prompt's rows) the product is bound by reading W:
// Ondine's loop streams the plain weights once for all the rows (lower/detail/gemv.hpp), then the bias,
// the Sum and the activations (eltwise primitives made for one row of N at compile time) follow. The same
// M always takes the same kernel: a call's result does not depend on the calls before it.
class DenseMatMulKernel : public Kernel {
 public:
  struct Spec {
    Tensor weights;           // [K, N] row-major, float32
    std::optional<Tensor> bias;  // [N]
    int sum_input = -1;
    std::vector<EltwiseSpec::Op> eltwise;
  };
  static constexpr std::int64_t kFewRows = 8;  // below this, the rows run Ondine's weight-streaming loop

  DenseMatMulKernel(const Node& n, Spec spec, const dnnl::engine& engine) : Kernel(n), spec_(std::move(spec)), engine_(engine) {
    K_ = spec_.weights.dims()[0];
    N_ = spec_.weights.dims()[1];
    plain_weights_ = memory(plain_md({K_, N_}), engine_, spec_.weights.raw());
    if (spec_.bias) bias_ = memory(plain_md({1, N_}), engine_, spec_.bias->raw());
    runtime_ = make_runtime();
    rows_ = gemv::rows_kernel();
    for (const auto& op : spec_.eltwise) {  // the activations of a few rows, one row of N at a time
      dnnl::eltwise_forward::primitive_desc pd(
          dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference, op.alg, plain_md({1, N_}), op.alpha, op.beta),
          engine_);
      row_eltwise_.emplace_back(pd);
    }
  }
  std::string implementation() const override {
    return "oneDNN matmul, rows at run time (" + (runtime_ ? runtime_impl_ : std::string("none")) +
           "); fewer than " + std::to_string(kFewRows) + " rows: ondine:weight-streaming loop";
  }
  // The run-time-rows matmul on kFewRows rows of zeros (the least it runs on).
  void warm_up(dnnl::stream& stream) const override {
    if (!runtime_ || K_ == 0 || N_ == 0) return;
    std::vector<float> src(static_cast<std::size_t>(kFewRows * K_), 0.0f), dst(static_cast<std::size_t>(kFewRows * N_));
    memory a(plain_md({kFewRows, K_}), engine_, src.data()), y(plain_md({kFewRows, N_}), engine_, dst.data());
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, plain_weights_}, {DNNL_ARG_DST, y}};
    if (spec_.bias) args.emplace(DNNL_ARG_BIAS, bias_);
    runtime_->execute(stream, args);
    stream.wait();
  }
  std::vector<Tensor> run(RunContext& ctx, const std::vector<Tensor>& in) const override {
    if (!all_f32(in, {0}) || in[0].rank() < 1 || in[0].dims().back() != K_) return reference(in);
    Dims out = in[0].dims();
    out.back() = N_;
    const std::int64_t M = in[0].numel() / std::max<std::int64_t>(K_, 1);
    const Tensor* sum = nullptr;
    if (spec_.sum_input >= 0) {
      const auto i = static_cast<std::size_t>(spec_.sum_input);
      if (i >= in.size() || in[i].empty() || !all_f32(in, {i}) || in[i].dims() != out) return reference(in);
      sum = &in[i];
    }
    Tensor y = ctx.alloc_output(0, DType::Float32, out);
    if (y.numel() == 0) return {y};
    if (K_ == 0) return reference(in);
    if (M < kFewRows || !runtime_) {
      few_rows(ctx, in[0].data<float>(), M, sum ? sum->data<float>() : nullptr, y.data<float>());
      return {y};
    }
    if (sum) std::memcpy(y.raw(), sum->raw(), y.nbytes());
    const memory::desc src_md = plain_md({M, K_}), dst_md = plain_md({M, N_});
    memory src(src_md, engine_, const_cast<void*>(in[0].raw())), dst(dst_md, engine_, y.raw());
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, plain_weights_}, {DNNL_ARG_DST, dst}};
    if (spec_.bias) args.emplace(DNNL_ARG_BIAS, bias_);
    runtime_->execute(ctx.stream, args);
    ctx.stream.wait();
    return {y};
  }

 private:
  std::optional<dnnl::matmul> make_runtime() {
    const memory::desc src = plain_md({DNNL_RUNTIME_DIM_VAL, K_}), dst = plain_md({DNNL_RUNTIME_DIM_VAL, N_});
    const memory::desc w = plain_md({K_, N_});
    dnnl::post_ops po;
    if (spec_.sum_input >= 0) po.append_sum(1.0f);
    for (const auto& op : spec_.eltwise) po.append_eltwise(1.0f, op.alg, op.alpha, op.beta);
    dnnl::primitive_attr attr;
    attr.set_post_ops(po);
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::library);
    auto desc = spec_.bias ? dnnl::matmul::desc(src, w, plain_md({1, N_}), dst) : dnnl::matmul::desc(src, w, dst);
    dnnl::matmul::primitive_desc pd(desc, attr, engine_, true);
    if (!pd) return std::nullopt;
    runtime_impl_ = pd.impl_info_str();
    return dnnl::matmul(pd);
  }

  // Y = act(A W + bias + Sum) for M rows, each row of Y started from bias + Sum and the weights read once
  // for all of them (per row the loop keeps its own accumulators, in the threads' partial rows).
  void few_rows(RunContext& ctx, const float* a, std::int64_t M, const float* sum, float* y) const {
    const float* w = spec_.weights.data<float>();
    const float* bias = spec_.bias ? spec_.bias->data<float>() : nullptr;
    const int threads = omp_get_max_threads();
    Tensor partials = ctx.alloc(DType::Float32, {std::max(threads - 1, 1) * M, N_});
    for (std::int64_t m = 0; m < M; ++m) {
      float* row = y + m * N_;
      if (sum) std::memcpy(row, sum + m * N_, static_cast<std::size_t>(N_) * sizeof(float));
      else std::fill(row, row + N_, 0.0f);
      if (bias)
        for (std::int64_t n = 0; n < N_; ++n) row[n] += bias[n];
    }
    gemv::multiply_add(rows_, a, w, M, K_, N_, y, partials.data<float>(), threads);
    for (std::size_t i = 0; i < row_eltwise_.size(); ++i)
      for (std::int64_t m = 0; m < M; ++m) {
        memory row(plain_md({1, N_}), engine_, y + m * N_);
        row_eltwise_[i].execute(ctx.stream, {{DNNL_ARG_SRC, row}, {DNNL_ARG_DST, row}});
      }
    if (!row_eltwise_.empty()) ctx.stream.wait();
  }

  Spec spec_;
  dnnl::engine engine_;
  std::int64_t K_ = 0, N_ = 0;
  memory plain_weights_, bias_;
  std::optional<dnnl::matmul> runtime_;
  std::string runtime_impl_;
  gemv::RowsFn rows_ = nullptr;
  std::vector<dnnl::eltwise_forward> row_eltwise_;
};

// The constant-weight product a MatMul / Gemm / fused node computes, or nullopt where it is not one
// (run-time weights, transposed A, a C that is not one value per column, rank-1 weights).
inline std::optional<DenseMatMulKernel::Spec> dense_spec(const Node& n) {
  const std::string op = n.op_key();
  const bool gemm = op == "Gemm" || op == "ondine.FusedGemm";
  const Value* a = n.input(0);
  const Value* b = n.num_inputs() > 1 ? n.input(1) : nullptr;
  if (!a || !b || a->dtype() != DType::Float32 || !b->is_constant() || b->dtype() != DType::Float32) return std::nullopt;
  const Tensor& w = b->constant();
  if (w.rank() != 2) return std::nullopt;
  DenseMatMulKernel::Spec s;
  const std::int64_t r = w.dims()[0], c = w.dims()[1];
  if (gemm) {
    if (n.attr_int("transA", 0) != 0) return std::nullopt;
    const bool tb = n.attr_int("transB", 0) != 0;
    const float alpha = n.attr_float("alpha", 1.0f), beta = n.attr_float("beta", 1.0f);
    const std::int64_t K = tb ? c : r, N = tb ? r : c;
    Tensor kn(DType::Float32, {K, N});
    const float* src = w.data<float>();
    float* dst = kn.data<float>();
    for (std::int64_t k = 0; k < K; ++k)
      for (std::int64_t j = 0; j < N; ++j) dst[k * N + j] = alpha * (tb ? src[j * c + k] : src[k * c + j]);
    s.weights = kn;
    const Value* cv = n.num_inputs() > 2 ? n.input(2) : nullptr;
    if (cv) {
      if (!cv->is_constant() || cv->dtype() != DType::Float32) return std::nullopt;
      const Tensor& ct = cv->constant();
      if (!(ct.numel() == 1 || (ct.numel() == N && (ct.rank() == 1 || (ct.rank() == 2 && ct.dims()[0] == 1)))))
        return std::nullopt;
      Tensor bias(DType::Float32, {N});
      for (std::int64_t j = 0; j < N; ++j) bias.data<float>()[j] = beta * ct.data<float>()[ct.numel() == 1 ? 0 : j];
      s.bias = bias;
    }
  } else {
    s.weights = w;
    if (op == "ondine.FusedMatMul") {
      const Value* bias = n.num_inputs() > 2 ? n.input(2) : nullptr;
      if (bias) {
        if (!bias->is_constant() || bias->dtype() != DType::Float32 || bias->constant().numel() != c) return std::nullopt;
        s.bias = bias->constant().reshaped({c});
      }
      if (n.num_inputs() > 3 && n.input(3)) s.sum_input = 3;
    }
  }
  if (op == "ondine.FusedMatMul" || op == "ondine.FusedGemm")
    for (const fused::Activation& act : fused::read_activations(n))
      for (const auto& e : eltwise_of(act).ops) s.eltwise.push_back(e);
  return s;
}

// Expand(x, shape): numpy broadcasting of x against `shape`, copied a row (the last dim's run) at a time.
class ExpandKernel : public Kernel {
 public:
  using Kernel::Kernel;
  std::string implementation() const override { return "ondine:broadcast copy"; }
  std::vector<Tensor> run(RunContext& ctx, const std::vector<Tensor>& in) const override {
    if (in.size() < 2 || in[1].dtype() != DType::Int64 || in[1].rank() != 1 || in[0].dtype() == DType::String)
      return reference(in);
    const Dims& x = in[0].dims();
    const std::int64_t* shape = in[1].data<std::int64_t>();
    const std::size_t rank = std::max(x.size(), static_cast<std::size_t>(in[1].numel()));
    Dims out(rank);
    for (std::size_t k = 0; k < rank; ++k) {  // aligned from the right
      const std::int64_t a = k < x.size() ? x[x.size() - 1 - k] : 1;
      const std::int64_t b = k < static_cast<std::size_t>(in[1].numel()) ? shape[in[1].numel() - 1 - static_cast<std::int64_t>(k)] : 1;
      if (a != b && a != 1 && b != 1) return reference(in);  // the reference kernel names the mismatch
      out[rank - 1 - k] = a == 1 ? b : a;
    }
    broadcast::Plan plan;
    if (!broadcast::make_plan(out, {x}, plan)) return reference(in);
    Tensor y = ctx.alloc_output(0, in[0].dtype(), out);
    if (y.numel() == 0) return {y};
    const bool copied = broadcast::dispatch_size(dtype_size(in[0].dtype()), [&](auto word) {
      using W = typename decltype(word)::type;
      const W* src = static_cast<const W*>(in[0].raw());
      W* dst = static_cast<W*>(y.raw());
      broadcast::for_each_row(plan, [&](std::int64_t o, const auto& off, const auto& s, std::int64_t len) {
        if (s[0] == 1) std::memcpy(dst + o, src + off[0], static_cast<std::size_t>(len) * sizeof(W));
        else std::fill(dst + o, dst + o + len, src[off[0]]);
      });
    });
    if (!copied) return reference(in);
    return {y};
  }
};

// Pow(x, 2) with the exponent a constant: x * x; any other exponent or dtype runs the reference kernel.
class SquareKernel : public Kernel {
 public:
  using Kernel::Kernel;
  std::string implementation() const override { return "ondine:square"; }
  std::vector<Tensor> run(RunContext& ctx, const std::vector<Tensor>& in) const override {
    if (!all_f32(in, {0})) return reference(in);
    Tensor y = ctx.alloc_output(0, DType::Float32, in[0].dims());
    const float* x = in[0].data<float>();
    float* out = y.data<float>();
    const std::int64_t n = in[0].numel();
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) out[i] = x[i] * x[i];
    return {y};
  }
};

// ondine.WeightOnlyMatMul: A [..., K] of any leading dims times the packed weights.
class WeightOnlyMatMulKernel : public Kernel {
 public:
  WeightOnlyMatMulKernel(const Node& n, weight_only::Packed packed, weight_only::Kernel kernel)
      : Kernel(n), packed_(std::move(packed)), kernel_(kernel) {}
  std::string implementation() const override { return weight_only::describe(packed_, kernel_); }
  std::vector<Tensor> run(RunContext& ctx, const std::vector<Tensor>& in) const override {
    if (!all_f32(in, {0}) || in[0].rank() < 1 || in[0].dims().back() != packed_.K) return reference(in);
    Dims out = in[0].dims();
    out.back() = packed_.N;
    Tensor y = ctx.alloc_output(0, DType::Float32, out);
    if (y.numel() == 0) return {y};
    const std::int64_t M = in[0].numel() / std::max<std::int64_t>(packed_.K, 1);
    if (packed_.K == 0) return reference(in);
    weight_only::multiply(kernel_, packed_, in[0].data<float>(), M, y.data<float>(), omp_get_max_threads());
    return {y};
  }

 private:
  weight_only::Packed packed_;
  weight_only::Kernel kernel_;
};

}  // namespace ondine::lower::detail::dyn
