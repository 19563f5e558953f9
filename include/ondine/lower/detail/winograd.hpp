// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/winograd.hpp - a 3x3, stride-1 float32 convolution as Winograd F(4x4, 3x3) (Lavin and Gray,
// "Fast Algorithms for Convolutional Neural Networks", 2016): 4x4 outputs from a 6x6 input tile with 36
// multiplications per (input, output) channel pair instead of 144.
//
//   Y = A^T [ (G g G^T) (.) (B^T d B) ] A   per tile and channel pair, summed over input channels, so:
//   V[p][t][c] = (B^T d_{t,c} B)[p]            Ondine's input transform (p: the 36 tile positions)
//   M[p][t][k] = sum_c V[p][t][c] U[p][c][k]   36 matrix products, one oneDNN batched matmul
//   y[t, k]    = act(A^T M[.][t][k] A + bias)  Ondine's output transform, 4x4 outputs per tile
// with U = G g G^T transformed once, when the model compiles (in double). The interpolation points 0, +-1,
// +-2 (and infinity) keep float32's error near 1e-5 of the output's scale (measured against the direct
// convolution: 3e-6 to 1.3e-5 over 16 to 512 channels); CompileOptions::conv_algorithm (ConvAlgorithm)
// chooses: where it pays (default), never, or wherever it applies.
//
// Why: on a CPU without bf16 the direct kernels run at the fp32 peak already (oneDNN's and ONNX Runtime's
// alike); the matrix products here do 4x fewer multiplications, and the transforms, which only add, run at
// memory speed. Measured on 2 cores of an AVX2 EPYC (Zen 3), direct jit:avx2 against this: 256 channels at
// 100x100 75.7 -> 29.1 ms, 50x50 21.3 -> 7.6, 14x14 1.25 -> 0.72; 128 channels at 28x28 1.81 -> 0.57; 64 at
// 56x56 1.25 -> 0.63; it loses on a handful of tiles (512 channels at 7x7, batch 1: 1.86 -> 2.66 ms). With
// AVX-512 (Zen 4), where the direct kernels are twice as wide, it pays from 64 channels (winograd::pays).
//
// Activations are channel-blocked (nChw8c, or nChw16c read as two 8-channel halves); the tiles are split
// into chunks whose transformed tiles (V and M) stay within a few MB, each chunk a transform step, the matmul
// and an output step (the last chunk's missing tiles transform to zeros). A residual Add after the conv
// (ResNet's basic block, as oneDNN's sum post-op) and then the activation (Relu, LeakyRelu, Clip) are applied
// as the outputs are written: PyTorch's ResNet-18 at 800x800, batch 8, 12 of its 3x3 convs (6 with the
// residual), 1766 -> 1284 ms once the residual ones ran as Winograd too (the direct kernel: 141-160 ms
// per conv, Winograd 59-81 ms).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"
#include "ondine/lower/detail/group_norm.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ONDINE_WINOGRAD_X86 1
#endif

namespace ondine::lower::detail {

namespace winograd {

// One convolution's shapes: batch, channels in/out, input and output size, the top/left padding, the
// channel block of the layout (8 or 16) and the tile grid (4x4 outputs per tile).
struct Geometry {
  std::int64_t batch = 0, channels = 0, out_channels = 0, height = 0, width = 0, out_height = 0, out_width = 0;
  std::int64_t pad_top = 0, pad_left = 0, block = 8;
  std::int64_t tiles_high() const { return (out_height + 3) / 4; }
  std::int64_t tiles_wide() const { return (out_width + 3) / 4; }
  std::int64_t tiles() const { return batch * tiles_high() * tiles_wide(); }
};

// U[p][c][k] = (G g_{k,c} G^T)[p] for weights [K, C, 3, 3], as [36, C, K].
inline Tensor transform_weights(const Tensor& w) {
  static const double G[6][3] = {{1.0 / 4, 0, 0},
                                 {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                 {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                 {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                 {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                 {0, 0, 1}};
  const std::int64_t K = w.dims()[0], C = w.dims()[1];
  Tensor u(DType::Float32, {36, C, K});
  const float* g = w.data<float>();
  float* out = u.data<float>();
  for (std::int64_t k = 0; k < K; ++k)
    for (std::int64_t c = 0; c < C; ++c) {
      const float* f = g + (k * C + c) * 9;
      double half[6][3];  // G g
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 3; ++j) half[i][j] = G[i][0] * f[j] + G[i][1] * f[3 + j] + G[i][2] * f[6 + j];
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 6; ++j)
          out[((i * 6 + j) * C + c) * K + k] =
              static_cast<float>(half[i][0] * G[j][0] + half[i][1] * G[j][1] + half[i][2] * G[j][2]);
    }
  return u;
}

#ifdef ONDINE_WINOGRAD_X86

// o[k * so] = (B^T d)[k] over 6 vectors d[j * si].
__attribute__((target("avx2,fma"))) inline void input_rows(const __m256* d, __m256* o, int si, int so) {
  const __m256 d0 = d[0], d1 = d[si], d2 = d[2 * si], d3 = d[3 * si], d4 = d[4 * si], d5 = d[5 * si];
  const __m256 four = _mm256_set1_ps(4.0f), five = _mm256_set1_ps(5.0f), two = _mm256_set1_ps(2.0f);
  o[0] = _mm256_fmadd_ps(four, d0, _mm256_fnmadd_ps(five, d2, d4));                       // 4d0 - 5d2 + d4
  o[so] = _mm256_fnmadd_ps(four, _mm256_add_ps(d1, d2), _mm256_add_ps(d3, d4));          // -4(d1 + d2) + d3 + d4
  o[2 * so] = _mm256_fmadd_ps(four, _mm256_sub_ps(d1, d2), _mm256_sub_ps(d4, d3));       // 4(d1 - d2) - d3 + d4
  const __m256 d42 = _mm256_sub_ps(d4, d2), d31 = _mm256_sub_ps(d3, d1);
  o[3 * so] = _mm256_fmadd_ps(two, d31, d42);                                            // -2d1 - d2 + 2d3 + d4
  o[4 * so] = _mm256_fnmadd_ps(two, d31, d42);                                           // 2d1 - d2 - 2d3 + d4
  o[5 * so] = _mm256_fmadd_ps(four, d1, _mm256_fnmadd_ps(five, d3, d5));                 // 4d1 - 5d3 + d5
}

// o[k * so] = (A^T m)[k], k < 4, over 6 vectors m[j * si].
__attribute__((target("avx2,fma"))) inline void output_rows(const __m256* m, __m256* o, int si, int so) {
  const __m256 m1 = m[si], m2 = m[2 * si], m3 = m[3 * si], m4 = m[4 * si];
  const __m256 s12 = _mm256_add_ps(m1, m2), d12 = _mm256_sub_ps(m1, m2);
  const __m256 s34 = _mm256_add_ps(m3, m4), d34 = _mm256_sub_ps(m3, m4);
  o[0] = _mm256_add_ps(_mm256_add_ps(m[0], s12), s34);
  o[so] = _mm256_fmadd_ps(_mm256_set1_ps(2.0f), d34, d12);
  o[2 * so] = _mm256_fmadd_ps(_mm256_set1_ps(4.0f), s34, s12);
  o[3 * so] = _mm256_add_ps(_mm256_fmadd_ps(_mm256_set1_ps(8.0f), d34, d12), m[5 * si]);
}

// Where channel c0 (a multiple of 8) of image 0 starts in a channel-blocked tensor of `plane` = H * W * B
// floats per block of B channels: c0 / B planes in, c0 % B lanes along. Computed once per call, where it was
// two divisions by the run-time B per tile and channel group (with interior tiles loading unchecked: one
// thread, 64 channels, 112x112 / 200x200: the input transform 1.42 -> 1.23 / 7.9 -> 5.9 ms).
inline std::vector<std::int64_t> channel_offsets(std::int64_t channels, std::int64_t block, std::int64_t plane) {
  std::vector<std::int64_t> out;
  for (std::int64_t c0 = 0; c0 < channels; c0 += 8) out.push_back(c0 / block * plane + c0 % block);
  return out;
}

// B^T d B of one 6x6 tile of 8 channels whose first row and column are h0, w0 in `channels` (8 channels of
// one image, channel-blocked: pixel (h, w) at (h * W + w) * B): loads checked against the image's edges only
// when the tile crosses one.
template <bool Inside>
__attribute__((target("avx2,fma"))) inline void input_tile(const float* channels, std::int64_t h0, std::int64_t w0,
                                                           const Geometry& g, float* v, std::int64_t p_stride) {
  __m256 d[36], half[36];
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 6; ++j) {
      const std::int64_t h = h0 + i, w = w0 + j;
      d[i * 6 + j] = Inside || (h >= 0 && h < g.height && w >= 0 && w < g.width)
                         ? _mm256_loadu_ps(channels + (h * g.width + w) * g.block)
                         : _mm256_setzero_ps();
    }
  for (int j = 0; j < 6; ++j) input_rows(d + j, half + j, 6, 6);  // B^T d
  for (int k = 0; k < 6; ++k) {                                    // (B^T d) B, stored as it is made
    __m256 o[6];
    input_rows(half + k * 6, o, 1, 1);
    for (int j = 0; j < 6; ++j) _mm256_storeu_ps(v + (k * 6 + j) * p_stride, o[j]);
  }
}

// Two 8-channel groups whose rows of V are adjacent (channels c..c+15 of a tile: one 64-byte line per tile
// position) through a stack buffer, so that each of the 36 lines a tile writes is written whole, at once.
// Written group by group, the 36 lines, a position stride apart (a multiple of 1 or 4 KB: 196 tiles of 64
// channels, 16 of 256), fell into a few sets of the 8-way L1 and were evicted between their halves.
template <bool Inside>
__attribute__((target("avx2,fma"))) inline void input_tile_pair(const float* first, const float* second,
                                                                std::int64_t h0, std::int64_t w0, const Geometry& g,
                                                                float* v, std::int64_t p_stride) {
  alignas(64) float lines[36 * 16];
  input_tile<Inside>(first, h0, w0, g, lines, 16);
  input_tile<Inside>(second, h0, w0, g, lines + 8, 16);
  for (int p = 0; p < 36; ++p) {
    _mm256_storeu_ps(v + p * p_stride, _mm256_load_ps(lines + p * 16));
    _mm256_storeu_ps(v + p * p_stride + 8, _mm256_load_ps(lines + p * 16 + 8));
  }
}

// V rows [0, rows) for tiles [first, first + rows) of x (channel-blocked); rows past the last tile are zeros.
__attribute__((target("avx2,fma"))) inline void input_transform(const float* x, const Geometry& g, std::int64_t first,
                                                                std::int64_t rows, float* v) {
  const std::int64_t C = g.channels, B = g.block, tw = g.tiles_wide(), per_image = g.tiles_high() * tw;
  const std::int64_t valid = std::min(rows, g.tiles() - first), plane = g.height * g.width * B;
  const std::vector<std::int64_t> offsets = channel_offsets(C, B, plane);
  const std::int64_t groups = static_cast<std::int64_t>(offsets.size()), p_stride = rows * C;
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    if (r >= valid) {
      for (int p = 0; p < 36; ++p) std::memset(v + (p * rows + r) * C, 0, static_cast<std::size_t>(C) * sizeof(float));
      continue;
    }
    const std::int64_t t = first + r, image = t / per_image, ty = t % per_image / tw, tx = t % per_image % tw;
    const std::int64_t h0 = ty * 4 - g.pad_top, w0 = tx * 4 - g.pad_left;
    const bool inside = h0 >= 0 && w0 >= 0 && h0 + 6 <= g.height && w0 + 6 <= g.width;
    const float* image_x = x + image * C * g.height * g.width;
    float* out = v + r * C;
    std::int64_t c = 0;
    for (; c + 1 < groups; c += 2) {
      if (inside) input_tile_pair<true>(image_x + offsets[c], image_x + offsets[c + 1], h0, w0, g, out + c * 8, p_stride);
      else input_tile_pair<false>(image_x + offsets[c], image_x + offsets[c + 1], h0, w0, g, out + c * 8, p_stride);
    }
    if (c < groups) {
      if (inside) input_tile<true>(image_x + offsets[c], h0, w0, g, out + c * 8, p_stride);
      else input_tile<false>(image_x + offsets[c], h0, w0, g, out + c * 8, p_stride);
    }
  }
}

// y (channel-blocked) for tiles [first, first + rows): act(A^T M A + bias [+ y]), outputs past the edges dropped.
// With `sum` y holds the residual operand already (oneDNN's sum post-op, scale 1): each output is read, then
// written, by the one thread that owns its tile.
__attribute__((target("avx2,fma"))) inline void output_transform(const float* m, const Geometry& g, std::int64_t first,
                                                                 std::int64_t rows, const float* bias,
                                                                 const group_norm::Activation& act,
                                                                 const std::optional<FakeQuantParams>& fq, bool sum,
                                                                 float* y) {
  const std::int64_t K = g.out_channels, B = g.block, tw = g.tiles_wide(), per_image = g.tiles_high() * tw;
  const std::int64_t valid = std::min(rows, g.tiles() - first), plane = g.out_height * g.out_width * B;
  const std::vector<std::int64_t> offsets = channel_offsets(K, B, plane);
  const std::int64_t groups = static_cast<std::int64_t>(offsets.size()), p_stride = rows * K;
  const __m256 lo = _mm256_set1_ps(act.lo), hi = _mm256_set1_ps(act.hi), slope = _mm256_set1_ps(act.slope),
               zero = _mm256_setzero_ps();
  const FakeQuantParams q = fq.value_or(FakeQuantParams{});
  const __m256 q_inv = _mm256_set1_ps(q.inv_scale), q_lo = _mm256_set1_ps(q.lo), q_hi = _mm256_set1_ps(q.hi),
               q_scale = _mm256_set1_ps(q.scale);
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < valid; ++r) {
    const std::int64_t t = first + r, image = t / per_image, ty = t % per_image / tw, tx = t % per_image % tw;
    const std::int64_t h0 = ty * 4, w0 = tx * 4;
    const int high = static_cast<int>(std::min<std::int64_t>(4, g.out_height - h0));
    const int wide = static_cast<int>(std::min<std::int64_t>(4, g.out_width - w0));
    float* origin = y + image * K * g.out_height * g.out_width + (h0 * g.out_width + w0) * B;
    const float* in_row = m + r * K;
    alignas(64) float lines[36 * 16];  // two groups' 36 lines of M, read whole (input_tile_pair says why)
    for (std::int64_t c = 0; c < groups; ++c) {
      const bool paired = c % 2 == 1 || c + 1 < groups;
      if (c % 2 == 0 && paired)
        for (int p = 0; p < 36; ++p) {
          _mm256_store_ps(lines + p * 16, _mm256_loadu_ps(in_row + p * p_stride + c * 8));
          _mm256_store_ps(lines + p * 16 + 8, _mm256_loadu_ps(in_row + p * p_stride + c * 8 + 8));
        }
      __m256 in[36], half[24], o[16];
      for (int p = 0; p < 36; ++p)
        in[p] = paired ? _mm256_load_ps(lines + p * 16 + c % 2 * 8) : _mm256_loadu_ps(in_row + p * p_stride + c * 8);
      for (int j = 0; j < 6; ++j) output_rows(in + j, half + j, 6, 6);  // A^T M: 4 rows of 6
      for (int i = 0; i < 4; ++i) output_rows(half + i * 6, o + i * 4, 1, 1);  // (A^T M) A
      const __m256 b = bias ? _mm256_loadu_ps(bias + c * 8) : zero;
      float* base = origin + offsets[c];
      for (int i = 0; i < high; ++i)
        for (int j = 0; j < wide; ++j) {
          float* at = base + (i * g.out_width + j) * B;
          __m256 s = _mm256_add_ps(o[i * 4 + j], b);
          if (sum) s = _mm256_add_ps(s, _mm256_loadu_ps(at));
          __m256 out = _mm256_min_ps(_mm256_max_ps(s, lo), hi);
          if (act.slope != 0) out = _mm256_fmadd_ps(slope, _mm256_min_ps(s, zero), out);
          if (fq) {  // as oneDNN's linear, round (ties to even), clip and pow(scale, 1) post-ops compute it
            const __m256 r = _mm256_round_ps(_mm256_mul_ps(out, q_inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            out = _mm256_mul_ps(_mm256_min_ps(_mm256_max_ps(r, q_lo), q_hi), q_scale);
          }
          _mm256_storeu_ps(at, out);
        }
    }
  }
}

#endif  // ONDINE_WINOGRAD_X86

// One chunk's input transform (x -> V) or output transform (M -> y, with the bias, the residual sum already in
// y when `sum`, and the activation).
class TransformStep : public runtime::Step {
 public:
  enum class Kind { Input, Output };
  TransformStep(runtime::StepInfo info, Kind kind, SlotId from, SlotId to, Geometry g, std::int64_t first,
                std::int64_t rows, std::vector<float> bias = {}, group_norm::Activation act = {},
                std::optional<FakeQuantParams> fq = std::nullopt, bool sum = false)
      : Step(std::move(info), sum ? std::vector<SlotId>{from, to} : std::vector<SlotId>{from}, {to}), kind_(kind),
        from_(from), to_(to), g_(g), first_(first), rows_(rows), bias_(std::move(bias)), act_(act), fq_(fq),
        sum_(sum) {}
  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
#ifdef ONDINE_WINOGRAD_X86
    const auto* from = static_cast<const float*>(ctx.ptr(from_));
    auto* to = static_cast<float*>(ctx.ptr(to_));
    if (kind_ == Kind::Input)
      input_transform(from, g_, first_, rows_, to);
    else
      output_transform(from, g_, first_, rows_, bias_.empty() ? nullptr : bias_.data(), act_, fq_, sum_, to);
#else
    throw Error("internal: Winograd convolution compiled without x86 kernels");
#endif
  }

 private:
  Kind kind_;
  SlotId from_, to_;
  Geometry g_;
  std::int64_t first_, rows_;
  std::vector<float> bias_;
  group_norm::Activation act_;
  std::optional<FakeQuantParams> fq_;
  bool sum_;
};

// Transformed tiles per chunk: V and M of one chunk within about this many bytes each.
constexpr std::int64_t kChunkBytes = std::int64_t{8} << 20;

// Whether F(4x4, 3x3) beats the direct kernel, as measured (see the top of this file): enough tiles for the
// matrix products to run at speed, and enough channels for them to outweigh the transforms.
// On an AVX2 CPU without AVX-512: 32 in, 16 out (an FPN's 96 -> 24 smoothing convs at 160x160, 2 threads:
// 6.0-6.6 -> 4.5-5.2 ms; the DBNet-like text detector at batch 1 32.7-34.3 -> 27.1-30.3 ms).
// With AVX-512 (2 cores of a Zen 4, against jit:avx512_core's direct kernel, ms per conv): 64 channels in and
// out. 64 at 56x56 0.66 -> 0.50, 128 at 28x28 0.64 -> 0.40, 256 at 14x14 (16 tiles) 0.67 -> 0.52, a U-Net's
// 128 -> 64 at 128x128 7.1 -> 5.0 and 64 -> 128 at 64x64 1.5 -> 1.2; with fewer channels the transforms
// cost more than the products save (32 at 256x256 3.4 -> 4.8, 32 -> 64 at 128x128 1.8 -> 2.1, 64 -> 32 at
// 256x256 6.3 -> 8.4), and on 4 tiles (512 at 7x7, batch 1) 0.9 -> 2.1; at batch 8 (32 tiles) 6.9 -> 4.8.
inline bool pays(const Geometry& g, const IsaInfo& isa) {
  if (isa.avx512) return g.tiles() >= 16 && g.channels >= 64 && g.out_channels >= 64;
  return (isa.isa == CpuIsa::Avx2 || isa.isa == CpuIsa::Avx2Vnni) && g.tiles() >= 16 && g.channels >= 32 &&
         g.out_channels >= 16;
}

inline bool has_avx2(const IsaInfo& isa) {
  return isa.isa == CpuIsa::Avx2 || isa.isa == CpuIsa::Avx2Vnni || isa.avx512;
}

}  // namespace winograd

// Lowers conv `n` (3x3, stride 1, dilation 1, one group, constant weights and bias, checked by the caller) with
// `chain` folded as Winograd F(4x4, 3x3); false (nothing created) where it does not apply or would not pay:
// no AVX2, a layout that is not channel-blocked, channels not a multiple of the block, or an activation the
// output transform does not have. A Sum (ResNet's residual add) is added as the outputs are written, before the
// activation, as oneDNN's sum post-op is: its operand in the destination first (post_op_dst).
inline bool lower_conv_as_winograd(Lowering& L, const Node& n, const PostOpChain& chain, const Dims& pad_begin,
                                   const std::optional<memory::desc>& x_blocked,
                                   const std::optional<memory::desc>& y_blocked) {
#ifndef ONDINE_WINOGRAD_X86
  return false;
#else
  const ConvAlgorithm algorithm = L.conv_algorithm_for(n);
  const IsaInfo isa = effective_isa();
  if (algorithm == ConvAlgorithm::Direct || !winograd::has_avx2(isa) || !x_blocked || !y_blocked) return false;
  // A trailing FakeQuant (a QDQ model's layer kept in float) is computed as the outputs are written; the rest
  // of the chain is at most one clip or (leaky) relu.
  std::optional<FakeQuantParams> fq = chain.eltwise.empty() ? std::nullopt : fake_quant_params(chain.eltwise.back());
  PostOpChain head = chain;
  if (fq) head.eltwise.pop_back();
  std::optional<group_norm::Activation> act = group_norm_activation(head);
  if (!act) return false;
  const Value* x = n.input(0);
  const Value* w = n.input(1);
  const Value* b = n.input(2);
  const Dims xd = x->shape().sizes(), yd = chain.result->shape().sizes();
  winograd::Geometry g;
  g.batch = xd[0];
  g.channels = xd[1];
  g.height = xd[2];
  g.width = xd[3];
  g.out_channels = yd[1];
  g.out_height = yd[2];
  g.out_width = yd[3];
  g.pad_top = pad_begin[0];
  g.pad_left = pad_begin[1];
  g.block = isa.avx512 ? 16 : 8;
  if (g.channels % g.block != 0 || g.out_channels % g.block != 0) return false;
  if (algorithm == ConvAlgorithm::Auto && !winograd::pays(g, isa)) return false;

  using dt = memory::data_type;
  const std::int64_t tiles = g.tiles();
  const std::int64_t widest = std::max(g.channels, g.out_channels);
  const std::int64_t max_rows = std::max<std::int64_t>(16, winograd::kChunkBytes / (36 * 4 * widest));
  const std::int64_t chunks = (tiles + max_rows - 1) / max_rows, rows = (tiles + chunks - 1) / chunks;
  const memory::desc v_md({36, rows, g.channels}, dt::f32, memory::format_tag::abc);
  const memory::desc m_md({36, rows, g.out_channels}, dt::f32, memory::format_tag::abc);
  dnnl::matmul::primitive_desc pd(
      dnnl::matmul::desc(v_md, memory::desc({36, g.channels, g.out_channels}, dt::f32, memory::format_tag::any), m_md),
      Lowering::base_attr(), L.engine(), true);
  if (!pd || is_reference_impl(pd)) return false;

  std::vector<float> bias;
  if (b) bias.assign(b->constant().data<float>(), b->constant().data<float>() + g.out_channels);
  // Keyed by the plain weights: a stored packing (an artifact's) is found without transforming them again.
  constexpr std::uint64_t kWinogradF43 = 0x57494e4f47524144ull;  // "WINOGRAD": not a stride hash
  const Tensor& plain = w->constant();
  const memory weights = L.derived_constant_memory(
      plain, kWinogradF43, [&plain] { return winograd::transform_weights(plain); }, pd.weights_desc());
  const SlotId src = L.slot_in(x, *x_blocked);
  bool sum = false;
  const SlotId dst = post_op_dst(L, chain, *y_blocked, sum);
  // The choices this conv had (StepInfo::choice), on its first step.
  const std::string choice = "layout blocked (" + L.choice_origin("conv_layout", L.options.conv_layout != ConvLayout::Auto) +
                             "), winograd (" + L.conv_algorithm_origin(n) + ")";
  const std::string shape = dims_str(xd) + " -> " + dims_str(yd) + ", " + std::to_string(tiles) + " tiles in " +
                            std::to_string(chunks) + " chunk" + (chunks > 1 ? "s" : "");
  for (std::int64_t i = 0; i < chunks; ++i) {
    const std::int64_t first = i * rows;
    const std::string part = chunks > 1 ? " (chunk " + std::to_string(i + 1) + "/" + std::to_string(chunks) + ")" : "";
    const SlotId v = L.add_slot(runtime::Slot{x->name() + ".winograd_v", DType::Float32, {36, rows, g.channels},
                                              v_md.get_size(), "abc", SlotKind::Arena, 0});
    const SlotId m = L.add_slot(runtime::Slot{chain.result->name() + ".winograd_m", DType::Float32,
                                              {36, rows, g.out_channels}, m_md.get_size(), "abc", SlotKind::Arena, 0});
    L.add_step(std::make_unique<winograd::TransformStep>(
        runtime::StepInfo{n.name(), n.op_type(), "ondine:winograd", "F(4x4,3x3) input transform " + layout_name(*x_blocked) + shape + part,
                          choice},
        winograd::TransformStep::Kind::Input, src, v, g, first, rows));
    L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(), "F(4x4,3x3) 36 products [" + std::to_string(rows) + "," +
                     std::to_string(g.channels) + "]x[" + std::to_string(g.channels) + "," + std::to_string(g.out_channels) + "]" + part},
                    &n, dnnl::matmul(pd), pd.scratchpad_desc(),
                    {{DNNL_ARG_SRC, v, v_md}, {DNNL_ARG_DST, m, m_md}}, {{DNNL_ARG_WEIGHTS, weights}});
    L.add_step(std::make_unique<winograd::TransformStep>(
        runtime::StepInfo{n.name(), n.op_type(), "ondine:winograd",
                          "F(4x4,3x3) output transform" + std::string(b ? " +bias" : "") + chain.detail() + " -> dst " +
                              layout_name(*y_blocked) + dims_str(yd) + part},
        winograd::TransformStep::Kind::Output, m, dst, g, first, rows, bias, *act, fq, sum));
  }
  commit_post_ops(L, chain, dst, *y_blocked);
  return true;
#endif
}

}  // namespace ondine::lower::detail
