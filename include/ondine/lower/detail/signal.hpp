// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/signal.hpp - DFT and STFT compiled onto KissFFT (libkissfft-dev, BSD; float32 only).
//
// Contract: a float32 DFT (opsets 17 and 20: any length, dft_length padding or truncating, inverse,
// onesided, any axis, any batch) or STFT (frame_step, an optional window read at run time, frame_length,
// onesided) whose sizes and axis are known when the model compiles becomes an FftStep computing what the
// reference kernel (reference/signal.hpp: the O(n^2) DFT in double, the oracle) computes, in float32. The
// lowering declines (the node runs its reference kernel) for double or half inputs, sizes or axis computed
// at run time, lengths past 2^30, and in a build without KissFFT.
//
// KissFFT is optional: it is used only when the build defines ONDINE_HAVE_KISSFFT (the CMake targets do
// when they find the package kissfft, and link kissfft-float) and its header is there. A program that
// includes Ondine's headers without linking KissFFT gets the reference kernel, never a link error.
//
// The transforms. Each line (one DFT along the axis, or one STFT frame) is gathered into per-thread
// scratch, zero-padded to the transform length n, transformed out of place, and its bins scattered:
// - complex input, or a real one of odd length: kiss_fft on n complex points (a real signal gets
//   imaginary parts 0); inverse: KissFFT's unscaled inverse plan, then 1/n as ONNX asks;
// - real input of even length: the n reals read as n/2 complex points z[k] = x[2k] + i x[2k+1], one
//   kiss_fft of n/2, then X[k] = E[k] + W^k O[k] for k = 0..n/2 with E = (Z[k] + conj Z[n/2-k]) / 2,
//   O = (Z[k] - conj Z[n/2-k]) / 2i, W = e^(-2 pi i / n): the split kiss_fftr does. It is done here, not by
//   kiss_fftr, because kiss_fftr writes into a buffer inside its plan, so one plan could not serve several
//   contexts at once; the other half of a full (not onesided) spectrum is conj(X[n-k]), and the inverse of
//   a real signal is conj(forward) / n.
// Plans (kiss_fft_alloc) and the split's twiddles are made once, at compile time, per length, and only
// read while running: any number of contexts share them. Lines are split over OpenMP's team.
//
// Accuracy against the double-precision oracle: float32 rounding in O(log n) butterfly stages (a generic
// radix p stage sums p terms), so the largest error over the largest |X| stays within a few times
// 2^-24 * (log2 n + largest prime factor of n) for random inputs (tests/test_fast_kernels.cpp bounds it).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/infer/signal.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/fft_frames.hpp"

#if defined(ONDINE_HAVE_KISSFFT) && __has_include(<kissfft/kiss_fft.h>)
#include <kissfft/kiss_fft.h>
#define ONDINE_KISSFFT 1
#endif

namespace ondine::lower::detail {

#ifdef ONDINE_KISSFFT

namespace fft {

static_assert(sizeof(kiss_fft_scalar) == sizeof(float),
              "Ondine links kissfft-float: kiss_fft_scalar must be float (do not define kiss_fft_scalar otherwise)");

struct PlanFree {
  void operator()(kiss_fft_state* p) const { kiss_fft_free(p); }
};
using Plan = std::unique_ptr<kiss_fft_state, PlanFree>;

inline Plan make_plan(std::int64_t n, bool inverse) {
  Plan p(kiss_fft_alloc(static_cast<int>(n), inverse ? 1 : 0, nullptr, nullptr));
  if (!p) throw Error("KissFFT could not allocate a plan of " + std::to_string(n) + " points");
  return p;
}

// Transforms of one length n into `bins` outputs (n, or n / 2 + 1 onesided); immutable once made.
class LineTransform {
 public:
  LineTransform(std::int64_t n, bool real_input, bool inverse, std::int64_t bins)
      : n_(n), bins_(bins), real_(real_input && n % 2 == 0), inverse_(inverse) {
    if (real_) {
      // An inverse of real input is conj(forward) / n, so the split always runs forward.
      plan_ = make_plan(n / 2, false);
      twiddles_.resize(static_cast<std::size_t>(n));  // W^k for k = 0..n/2 as (re, im) pairs
      for (std::int64_t k = 0; k <= n / 2 && 2 * k < n; ++k) {
        const double a = -2.0 * 3.14159265358979323846 * static_cast<double>(k) / static_cast<double>(n);
        twiddles_[static_cast<std::size_t>(2 * k)] = static_cast<float>(std::cos(a));
        twiddles_[static_cast<std::size_t>(2 * k + 1)] = static_cast<float>(std::sin(a));
      }
    } else {
      plan_ = make_plan(n, inverse);
    }
  }

  std::int64_t length() const { return n_; }
  bool real_path() const { return real_; }
  // Floats of scratch one thread needs: the gathered line and the transform's output.
  std::size_t scratch_floats() const { return static_cast<std::size_t>(4 * n_ + 4); }

  // `line`: the gathered input, n reals (real path) or n complex pairs, zero-padded. Writes `bins_`
  // complex bins to out[k * out_stride * 2 ...]. `work` holds at least n + 2 complex pairs.
  void run(const float* line, float* work, float* out, std::int64_t out_stride) const {
    auto* z = reinterpret_cast<kiss_fft_cpx*>(work);
    kiss_fft(plan_.get(), reinterpret_cast<const kiss_fft_cpx*>(line), z);
    const float scale = inverse_ ? 1.0f / static_cast<float>(n_) : 1.0f;
    if (!real_) {
      for (std::int64_t k = 0; k < bins_; ++k) {
        out[k * out_stride * 2] = z[k].r * scale;
        out[k * out_stride * 2 + 1] = z[k].i * scale;
      }
      return;
    }
    const std::int64_t h = n_ / 2;
    const float sign = inverse_ ? -1.0f : 1.0f;  // the inverse of a real line: conj(X) / n
    for (std::int64_t k = 0; k <= h && k < bins_; ++k) {
      const kiss_fft_cpx a = z[k % h], b = z[(h - k) % h];  // Z[k] and Z[n/2 - k] (Z periodic in n/2)
      const float er = 0.5f * (a.r + b.r), ei = 0.5f * (a.i - b.i);  // E = (Z[k] + conj Z[h-k]) / 2
      const float orr = 0.5f * (a.i + b.i), oi = -0.5f * (a.r - b.r);  // O = (Z[k] - conj Z[h-k]) / 2i
      const float wr = k < h ? twiddles_[static_cast<std::size_t>(2 * k)] : -1.0f,
                  wi = k < h ? twiddles_[static_cast<std::size_t>(2 * k + 1)] : 0.0f;
      const float xr = er + wr * orr - wi * oi, xi = ei + wr * oi + wi * orr;
      out[k * out_stride * 2] = xr * scale;
      out[k * out_stride * 2 + 1] = sign * xi * scale;
    }
    // A full spectrum of a real line: X[n - k] = conj(X[k]).
    for (std::int64_t k = h + 1; k < bins_; ++k) {
      const float* mirror = out + (n_ - k) * out_stride * 2;
      out[k * out_stride * 2] = mirror[0];
      out[k * out_stride * 2 + 1] = -mirror[1];
    }
  }

 private:
  std::int64_t n_, bins_;
  bool real_, inverse_;
  Plan plan_;
  std::vector<float> twiddles_;
};

// Where each line's points come from and its bins go, and how many lines there are.
struct LineLayout {
  std::int64_t lines = 0;      // DFT: outer * inner; STFT: batch * frames
  std::int64_t inner = 1;      // DFT: complex points after the axis (the stride of a line, in points)
  std::int64_t n_in = 0;       // points read per line (the rest of the transform length is zero)
  std::int64_t n_out = 0;      // bins written per line
  std::int64_t channels = 1;   // 1 (real) or 2 (complex) floats per input point
  // STFT: frames per batch item, frame_step, signal length; 0 frames for a DFT.
  std::int64_t frames = 0, step = 0, signal = 0;
};

}  // namespace fft

// A DFT or STFT node on KissFFT: x (and the STFT's window, read each run) -> y, float32, row-major. An STFT of
// a real signal into its onesided bins, with frames of a power of two, runs fft_frames.hpp's transform instead,
// a frame per SIMD lane (`frames`).
class FftStep : public runtime::Step {
 public:
  FftStep(runtime::StepInfo info, SlotId x, std::optional<SlotId> window, SlotId y, fft::LineLayout layout,
          std::shared_ptr<const fft::LineTransform> transform,
          std::shared_ptr<const fft_frames::Plan> frames = nullptr, fft_frames::Kernel kernel = fft_frames::Kernel::Scalar)
      : Step(std::move(info), window ? std::vector<SlotId>{x, *window} : std::vector<SlotId>{x}, {y}),
        x_(x), window_(window), y_(y), layout_(layout), transform_(std::move(transform)), frames_(std::move(frames)),
        kernel_(kernel) {}

  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
    const auto* x = static_cast<const float*>(ctx.ptr(x_));
    const float* w = window_ ? static_cast<const float*>(ctx.ptr(*window_)) : nullptr;
    auto* y = static_cast<float*>(ctx.ptr(y_));
    if (frames_) return execute_frames(x, w, y);
    const fft::LineLayout& l = layout_;
    const std::int64_t n = transform_->length();
    const bool real_path = transform_->real_path();
    const std::int64_t work = l.lines * n * 8;  // ~flops: parallel only when a line team pays off
#pragma omp parallel if (l.lines > 1 && work > (1 << 15))
    {
      std::vector<float> scratch(transform_->scratch_floats());  // per thread: gathered line, then its transform
      float* line = scratch.data();
      float* out = scratch.data() + 2 * n + 2;
#pragma omp for schedule(static)
      for (std::int64_t i = 0; i < l.lines; ++i) {
        const float* src;
        std::int64_t stride;  // in input points
        float* dst;
        if (l.frames) {  // STFT: frame f of batch item b, contiguous points
          const std::int64_t b = i / l.frames, f = i % l.frames;
          src = x + (b * l.signal + f * l.step) * l.channels;
          stride = 1;
          dst = y + i * l.n_out * 2;
        } else {  // DFT: line (outer o, inner p) along the axis
          const std::int64_t o = i / l.inner, p = i % l.inner;
          src = x + (o * l.n_in * l.inner + p) * l.channels;
          stride = l.inner;
          dst = y + (o * l.n_out * l.inner + p) * 2;
        }
        gather(src, stride, w, line, n, real_path);
        transform_->run(line, out, dst, l.frames ? 1 : l.inner);
      }
    }
  }

 private:
  // STFT frames in groups of one per lane: frame i of the batch's frames reads x from (b * signal + f * step).
  void execute_frames(const float* x, const float* w, float* y) const {
    const fft::LineLayout& l = layout_;
    const auto lanes = static_cast<std::int64_t>(fft_frames::lanes(kernel_));
    const std::int64_t groups = (l.lines + lanes - 1) / lanes;
    const std::int64_t work = l.lines * transform_->length() * 8;
#pragma omp parallel if (groups > 1 && work > (1 << 15))
    {
      std::vector<float> scratch(fft_frames::scratch_floats(*frames_, kernel_));
      std::vector<const float*> src(static_cast<std::size_t>(lanes));
      std::vector<float*> dst(static_cast<std::size_t>(lanes));
#pragma omp for schedule(static)
      for (std::int64_t g = 0; g < groups; ++g) {
        const std::int64_t first = g * lanes, count = std::min(lanes, l.lines - first);
        for (std::int64_t i = 0; i < count; ++i) {
          const std::int64_t line = first + i, b = line / l.frames, f = line % l.frames;
          src[static_cast<std::size_t>(i)] = x + b * l.signal + f * l.step;
          dst[static_cast<std::size_t>(i)] = y + line * l.n_out * 2;
        }
        fft_frames::run(kernel_, *frames_, src.data(), static_cast<std::size_t>(count), w, scratch.data(), dst.data(),
                        static_cast<std::size_t>(l.n_out));
      }
    }
  }

  // The line's points (times the window) into `line`: n reals or n complex pairs, zero past n_in.
  void gather(const float* src, std::int64_t stride, const float* w, float* line, std::int64_t n, bool real_path) const {
    const fft::LineLayout& l = layout_;
    const std::int64_t m = std::min(l.n_in, n), step = stride * l.channels;
    const std::int64_t per = real_path ? 1 : 2;  // floats per point in `line`
    for (std::int64_t j = 0; j < m; ++j) {
      const float s = w ? w[j] : 1.0f;
      line[j * per] = src[j * step] * s;
      if (!real_path) line[j * per + 1] = l.channels == 2 ? src[j * step + 1] * s : 0.0f;
    }
    std::fill(line + m * per, line + n * per, 0.0f);
  }

  SlotId x_;
  std::optional<SlotId> window_;
  SlotId y_;
  fft::LineLayout layout_;
  std::shared_ptr<const fft::LineTransform> transform_;
  std::shared_ptr<const fft_frames::Plan> frames_;
  fft_frames::Kernel kernel_;
};

#endif  // ONDINE_KISSFFT

namespace fft {

// The value of a scalar int input that is a constant (else nothing: its value comes at run time).
inline std::optional<std::int64_t> constant_scalar(const Node& n, std::size_t i) {
  const Value* v = i < n.num_inputs() ? n.input(i) : nullptr;
  if (!v || !v->is_constant() || v->constant().numel() != 1) return std::nullopt;
  if (v->constant().dtype() != DType::Int32 && v->constant().dtype() != DType::Int64) return std::nullopt;
  return v->constant().to_int64s()[0];
}

inline constexpr std::int64_t kMaxLength = std::int64_t{1} << 30;  // KissFFT takes int lengths

}  // namespace fft

inline bool lower_dft(Lowering& L, const Node& n) {
#ifndef ONDINE_KISSFFT
  (void)L;
  (void)n;
  return false;  // a build without KissFFT: the reference DFT
#else
  namespace spec = ::ondine::infer::detail_signal;
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!x || !y || x->dtype() != DType::Float32 || !x->shape().is_static() || !y->shape().is_static()) return false;
  const Dims dims = x->shape().sizes();
  if (dims.size() < 2 || (dims.back() != 1 && dims.back() != 2)) return false;  // the reference kernel says why
  const spec::DftSpec s = spec::dft_spec(n);
  if (s.onesided && dims.back() == 2) return false;
  std::optional<std::int64_t> axis = n.opset() < 20 ? n.attr_int("axis", 1) : std::int64_t{-2};
  if (n.opset() >= 20 && n.num_inputs() > 2 && n.input(2)) axis = fft::constant_scalar(n, 2);
  if (!axis) return false;  // decided at run time
  const auto rank = static_cast<std::int64_t>(dims.size());
  const auto a = static_cast<std::size_t>(spec::dft_axis(n, *axis, rank));
  const std::int64_t n_in = dims[a];
  std::int64_t len = n_in;
  if (n.num_inputs() > 1 && n.input(1)) {
    const std::optional<std::int64_t> given = fft::constant_scalar(n, 1);
    if (!given) return false;
    len = *given;
  }
  if (len <= 0 || len > fft::kMaxLength) return false;
  fft::LineLayout l;
  l.n_in = n_in;
  l.n_out = s.onesided ? len / 2 + 1 : len;
  l.channels = dims.back();
  l.inner = 1;
  for (std::size_t i = a + 1; i + 1 < dims.size(); ++i) l.inner *= dims[i];
  std::int64_t outer = 1;
  for (std::size_t i = 0; i < a; ++i) outer *= dims[i];
  l.lines = outer * l.inner;
  auto transform = std::make_shared<const fft::LineTransform>(len, l.channels == 1, s.inverse, l.n_out);
  SlotId xs = L.row_major_slot(x);
  SlotId ys = L.new_plain_slot(y);
  L.define_plain(y, ys);
  std::string detail = Graph::value_type_str(x) + " -> " + Graph::value_type_str(y) + ": " + std::to_string(l.lines) +
                       " lines of " + std::to_string(len) + (s.inverse ? " (inverse)" : "") +
                       (transform->real_path() ? ", real split over a half-length plan" : "");
  L.add_step(std::make_unique<FftStep>(
      runtime::StepInfo{n.name(), n.op_type(), transform->real_path() ? "kissfft:real" : "kissfft:complex", detail},
      xs, std::nullopt, ys, l, std::move(transform)));
  return true;
#endif
}

inline bool lower_stft(Lowering& L, const Node& n) {
#ifndef ONDINE_KISSFFT
  (void)L;
  (void)n;
  return false;
#else
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  const Value* window = n.num_inputs() > 2 ? n.input(2) : nullptr;
  if (!x || !y || x->dtype() != DType::Float32 || !x->shape().is_static() || !y->shape().is_static()) return false;
  if (window && (window->dtype() != DType::Float32 || !window->shape().is_static() || window->shape().rank() != 1))
    return false;
  const Dims dims = x->shape().sizes(), out = y->shape().sizes();
  if (dims.size() != 3 || (dims[2] != 1 && dims[2] != 2) || out.size() != 4) return false;
  const std::int64_t step = fft::constant_scalar(n, 1).value_or(0);  // 0: computed at run time
  std::int64_t frame = window ? window->shape().sizes()[0] : -1;      // -1: not known yet
  if (n.num_inputs() > 3 && n.input(3)) {
    const std::int64_t fl = fft::constant_scalar(n, 3).value_or(0);
    if (fl <= 0 || (frame >= 0 && fl != frame)) return false;  // the reference kernel names a mismatch
    frame = fl;
  }
  if (step <= 0 || frame <= 0 || frame > fft::kMaxLength || dims[1] < frame) return false;
  const bool onesided = n.attr_int("onesided", 1) != 0;
  if (onesided && dims[2] == 2) return false;
  fft::LineLayout l;
  l.frames = (dims[1] - frame) / step + 1;
  l.step = step;
  l.signal = dims[1];
  l.lines = dims[0] * l.frames;
  l.n_in = frame;
  l.n_out = onesided ? frame / 2 + 1 : frame;
  l.channels = dims[2];
  if (out != Dims{dims[0], l.frames, l.n_out, 2}) return false;
  auto transform = std::make_shared<const fft::LineTransform>(frame, l.channels == 1, false, l.n_out);
  // A real signal into onesided bins, frames of a power of two, a CPU with AVX2 or AVX-512: a frame per lane.
  std::shared_ptr<const fft_frames::Plan> frames;
  const IsaInfo isa = effective_isa();
  const fft_frames::Kernel kernel = silu::choose(isa.avx512, isa_runs_on(CpuIsa::Avx2, isa.isa));
  if (l.channels == 1 && onesided && fft_frames::applies(frame) && kernel != fft_frames::Kernel::Scalar)
    frames = std::make_shared<const fft_frames::Plan>(fft_frames::make_plan(frame));
  SlotId xs = L.row_major_slot(x);
  std::optional<SlotId> ws;
  if (window) ws = L.row_major_slot(window);
  SlotId ys = L.new_plain_slot(y);
  L.define_plain(y, ys);
  std::string detail = Graph::value_type_str(x) + " -> " + Graph::value_type_str(y) + ": " + std::to_string(l.lines) +
                       " frames of " + std::to_string(frame) + ", step " + std::to_string(step) +
                       (window ? ", windowed" : "") +
                       (frames ? ", " + std::to_string(fft_frames::lanes(kernel)) + " frames at a time (radix 2, a frame per lane)"
                        : transform->real_path() ? ", real split over a half-length plan" : "");
  const std::string impl = frames ? std::string(silu::kernel_name(kernel)) + ":fft"
                                  : transform->real_path() ? "kissfft:real" : "kissfft:complex";
  L.add_step(std::make_unique<FftStep>(runtime::StepInfo{n.name(), n.op_type(), impl, detail}, xs, ws, ys, l,
                                       std::move(transform), std::move(frames), kernel));
  return true;
#endif
}

}  // namespace ondine::lower::detail
