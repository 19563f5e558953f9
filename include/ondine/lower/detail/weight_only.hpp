// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/weight_only.hpp - Y = A W for weights kept in 4 or 8 bits (ondine.WeightOnlyMatMul):
// the weights are dequantised in registers, (q - z) * s, and never exist in float32.
//
// Why: a decoder's token multiplies one row by every weight matrix, so a step is bound by how many bytes of
// weights it reads; 4-bit weights are an eighth of float32. Two kernels: float32 activations (`tiles`: the
// float32 product of the dequantised weights up to the order of the sums, MatMulNBits' accuracy level 0) and
// int8 ones per block (`tiles_int8`, below: what ONNX Runtime runs a blocked DequantizeLinear + MatMul file
// with by default, level 4), several times fewer instructions per weight.
//
// Layout (packed once when the model is compiled): the columns in tiles of kVectors SIMD vectors; per tile
// and block of K, the scales s and s * z as float32 vectors, then the block's rows: for 4 bits two rows per
// byte (row k in the low nibble, k + 1 in the high one), unsigned (int4 is stored as q + 8, its zero point
// likewise); for 8 bits one byte per row as the model stores it. A thread takes whole tiles, so it reads
// one contiguous stream. Rows of A go through in groups of up to kRows, each group reading the tile once.
// One source over simd.hpp's traits: AVX-512 (tiles of 64 columns), AVX2 + FMA (16), scalar (1).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#include "ondine/ir/tensor.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/simd.hpp"
#include "ondine/lower/isa.hpp"

namespace ondine::lower::detail::weight_only {

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// The traits' float operations plus the integer widening the dequantisation needs.
struct ScalarOps : simd::Scalar {
  using VI = std::int32_t;
  static constexpr int kVectors = 1;
  static constexpr int kRows = 4;
  static VI widen_u8(const std::uint8_t* p) { return *p; }
  static VI widen_s8(const std::uint8_t* p) { return static_cast<std::int8_t>(*p); }
  static VI low_nibble(VI v) { return v & 0xf; }
  static VI high_nibble(VI v) { return v >> 4; }
  static V to_float(VI v) { return static_cast<float>(v); }
  static V fmsub(V a, V b, V c) { return a * b - c; }
};

#ifdef ONDINE_SIMD_X86
struct Avx512Ops : simd::Avx512 {
  using VI = __m512i;
  static constexpr int kVectors = 4;
  static constexpr int kRows = 4;
  __attribute__((target("avx512f"))) static VI widen_u8(const std::uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  __attribute__((target("avx512f"))) static VI widen_s8(const std::uint8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  __attribute__((target("avx512f"))) static VI low_nibble(VI v) { return _mm512_and_si512(v, _mm512_set1_epi32(0xf)); }
  __attribute__((target("avx512f"))) static VI high_nibble(VI v) { return _mm512_srli_epi32(v, 4); }
  __attribute__((target("avx512f"))) static V to_float(VI v) { return _mm512_cvtepi32_ps(v); }
  __attribute__((target("avx512f"))) static V fmsub(V a, V b, V c) { return _mm512_fmsub_ps(a, b, c); }
};

struct Avx2Ops : simd::Avx2 {
  using VI = __m256i;
  static constexpr int kVectors = 2;
  static constexpr int kRows = 2;
  __attribute__((target("avx2,fma"))) static VI widen_u8(const std::uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  __attribute__((target("avx2,fma"))) static VI widen_s8(const std::uint8_t* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  __attribute__((target("avx2,fma"))) static VI low_nibble(VI v) { return _mm256_and_si256(v, _mm256_set1_epi32(0xf)); }
  __attribute__((target("avx2,fma"))) static VI high_nibble(VI v) { return _mm256_srli_epi32(v, 4); }
  __attribute__((target("avx2,fma"))) static V to_float(VI v) { return _mm256_cvtepi32_ps(v); }
  __attribute__((target("avx2,fma"))) static V fmsub(V a, V b, V c) { return _mm256_fmsub_ps(a, b, c); }
};
#endif

// The weights of one WeightOnlyMatMul in the layout above, for tiles of `tile` columns.
struct Packed {
  std::int64_t K = 0, N = 0, block = 0, blocks = 0, tile = 1, tiles = 0;
  int bits = 4;
  bool is_signed = false;                 // 8 bits: int8 (sign-extended) or uint8
  // The int8-activation layout (pack_int8): per tile and block, groups of 4 rows of K (8 for 4 bits) with each
  // column's 4 bytes in one 32-bit lane (k..k+3; 4 bits: k..k+3 in the low nibbles, k+4..k+7 in the high ones),
  // the weights unsigned (u = q + 8 for int4, + 128 for int8). `zero` holds the unsigned zero points as floats
  // per tile and block ([tiles][blocks][tile]), empty when they are all `zero_const`.
  bool int8_activations = false;
  std::vector<float> zero;
  float zero_const = 0;
  std::vector<std::uint8_t> q;            // [tiles][blocks][block rows or pairs][tile]
  std::vector<float> scale, scaled_zero;  // [tiles][blocks][tile]
  std::int64_t tile_bytes = 0;            // bytes of q per tile
  std::size_t bytes() const { return q.size() + (scale.size() + scaled_zero.size()) * sizeof(float); }
};

inline std::int64_t rows_in_block(const Packed& p, std::int64_t b) { return std::min(p.block, p.K - b * p.block); }
inline std::int64_t block_bytes(const Packed& p, std::int64_t b) {
  const std::int64_t r = rows_in_block(p, b);
  return (p.bits == 4 ? (r + 1) / 2 : r) * p.tile;
}

// Packs Q [K, N] (int4/uint4/int8/uint8), S [blocks, N] float32 and Z (S's shape, or empty) for tiles of
// `tile` columns (a multiple of the kernel's vector width).
inline Packed pack(const Tensor& q, const Tensor& s, const Tensor& z, std::int64_t block, std::int64_t tile) {
  Packed p;
  p.K = q.dims()[0];
  p.N = q.dims()[1];
  p.block = block;
  p.blocks = (p.K + block - 1) / block;
  p.tile = tile;
  p.tiles = (p.N + tile - 1) / tile;
  p.bits = is_int4(q.dtype()) ? 4 : 8;
  p.is_signed = q.dtype() == DType::Int8;
  const int offset = q.dtype() == DType::Int4 ? 8 : 0;  // int4 stored unsigned
  for (std::int64_t b = 0; b < p.blocks; ++b) p.tile_bytes += block_bytes(p, b);
  p.q.assign(static_cast<std::size_t>(p.tile_bytes * p.tiles), 0);
  p.scale.assign(static_cast<std::size_t>(p.tiles * p.blocks * tile), 0.0f);
  p.scaled_zero.assign(p.scale.size(), 0.0f);
  const auto* qv = static_cast<const std::uint8_t*>(q.raw());
  auto qat = [&](std::int64_t k, std::int64_t n) -> int {
    if (p.bits == 4) return (q.dtype() == DType::Int4 ? static_cast<std::int8_t>(qv[k * p.N + n]) : qv[k * p.N + n]) + offset;
    return qv[k * p.N + n];  // the byte as stored: the kernel sign-extends int8
  };
  auto zat = [&](std::int64_t b, std::int64_t n) -> float {
    if (z.empty()) return static_cast<float>(offset);
    return static_cast<float>(z.at_double(static_cast<std::size_t>(b * p.N + n))) + static_cast<float>(offset);
  };
  for (std::int64_t t = 0; t < p.tiles; ++t) {
    std::uint8_t* out = p.q.data() + t * p.tile_bytes;
    for (std::int64_t b = 0; b < p.blocks; ++b) {
      float* sc = p.scale.data() + (t * p.blocks + b) * tile;
      float* zs = p.scaled_zero.data() + (t * p.blocks + b) * tile;
      const std::int64_t k0 = b * block, rows = rows_in_block(p, b);
      for (std::int64_t j = 0; j < tile; ++j) {
        const std::int64_t n = t * tile + j;
        if (n >= p.N) continue;  // padding columns: scale 0, so they come out 0
        sc[j] = s.data<float>()[b * p.N + n];
        zs[j] = zat(b, n) * sc[j];
      }
      if (p.bits == 4) {
        for (std::int64_t r = 0; r < rows; r += 2, out += tile)
          for (std::int64_t j = 0; j < tile; ++j) {
            const std::int64_t n = t * tile + j;
            if (n >= p.N) continue;
            const int lo = qat(k0 + r, n), hi = r + 1 < rows ? qat(k0 + r + 1, n) : 0;
            out[j] = static_cast<std::uint8_t>(lo | (hi << 4));
          }
      } else {
        for (std::int64_t r = 0; r < rows; ++r, out += tile)
          for (std::int64_t j = 0; j < tile; ++j) {
            const std::int64_t n = t * tile + j;
            if (n < p.N) out[j] = static_cast<std::uint8_t>(qat(k0 + r, n));
          }
      }
    }
  }
  return p;
}

// Y[m, tile t] for rows m of [m0, m0 + R) of A: one pass over the tile's packed weights.
template <typename T, int R, int Bits, bool Signed>
__attribute__((always_inline)) inline void tile_rows(const Packed& p, std::int64_t t, const float* a, std::int64_t m0,
                                                     float* y) {
  using V = typename T::V;
  using VI = typename T::VI;
  constexpr int kV = T::kVectors, kL = static_cast<int>(T::width);
  const std::int64_t K = p.K, tile = p.tile;
  V acc[R][kV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) acc[r][v] = T::zero();
  const std::uint8_t* wq = p.q.data() + t * p.tile_bytes;
  const float* rows[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) rows[r] = a + (m0 + r) * K;
  for (std::int64_t b = 0; b < p.blocks; ++b) {
    V s[kV], zs[kV];
    const float* sc = p.scale.data() + (t * p.blocks + b) * tile;
    const float* zp = p.scaled_zero.data() + (t * p.blocks + b) * tile;
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) {
      s[v] = T::load(sc + v * kL);
      zs[v] = T::load(zp + v * kL);
    }
    const std::int64_t k0 = b * p.block, n_rows = rows_in_block(p, b);
    std::int64_t k = 0;
    if constexpr (Bits == 4) {
      for (; k + 2 <= n_rows; k += 2, wq += tile) {
        V a0[R], a1[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          a0[r] = T::set1(rows[r][k0 + k]);
          a1[r] = T::set1(rows[r][k0 + k + 1]);
        }
#pragma GCC unroll 8
        for (int v = 0; v < kV; ++v) {
          const VI raw = T::widen_u8(wq + v * kL);
          const V w0 = T::fmsub(T::to_float(T::low_nibble(raw)), s[v], zs[v]);
          const V w1 = T::fmsub(T::to_float(T::high_nibble(raw)), s[v], zs[v]);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][v] = T::fmadd(a1[r], w1, T::fmadd(a0[r], w0, acc[r][v]));
        }
      }
      if (k < n_rows) {  // an odd block's last row: the low nibbles alone
#pragma GCC unroll 8
        for (int v = 0; v < kV; ++v) {
          const V w0 = T::fmsub(T::to_float(T::low_nibble(T::widen_u8(wq + v * kL))), s[v], zs[v]);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][v] = T::fmadd(T::set1(rows[r][k0 + k]), w0, acc[r][v]);
        }
        wq += tile;
      }
    } else {
      for (; k < n_rows; ++k, wq += tile)
#pragma GCC unroll 8
        for (int v = 0; v < kV; ++v) {
          const VI raw = Signed ? T::widen_s8(wq + v * kL) : T::widen_u8(wq + v * kL);
          const V w = T::fmsub(T::to_float(raw), s[v], zs[v]);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][v] = T::fmadd(T::set1(rows[r][k0 + k]), w, acc[r][v]);
        }
    }
  }
  const std::int64_t n0 = t * tile, valid = std::min(tile, p.N - n0);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* out = y + (m0 + r) * p.N + n0;
    if (valid == tile) {
#pragma GCC unroll 8
      for (int v = 0; v < kV; ++v) T::store(out + v * kL, acc[r][v]);
    } else {
      alignas(64) float buffer[kV * kL];
#pragma GCC unroll 8
      for (int v = 0; v < kV; ++v) T::store(buffer + v * kL, acc[r][v]);
      std::memcpy(out, buffer, static_cast<std::size_t>(valid) * sizeof(float));
    }
  }
}

// Every row of A [M, K] times the tiles [t0, t1).
template <typename T, int Bits, bool Signed>
__attribute__((always_inline)) inline void tiles(const Packed& p, const float* a, std::int64_t M, float* y,
                                                 std::int64_t t0, std::int64_t t1) {
  for (std::int64_t t = t0; t < t1; ++t) {
    std::int64_t m = 0;
    for (; m + T::kRows <= M; m += T::kRows) tile_rows<T, T::kRows, Bits, Signed>(p, t, a, m, y);
    for (; m < M; ++m) tile_rows<T, 1, Bits, Signed>(p, t, a, m, y);
  }
}

using TilesFn = void (*)(const Packed&, const float*, std::int64_t, float*, std::int64_t, std::int64_t);

template <typename T>
__attribute__((always_inline)) inline void tiles_any(const Packed& p, const float* a, std::int64_t M, float* y,
                                                     std::int64_t t0, std::int64_t t1) {
  if (p.bits == 4) tiles<T, 4, false>(p, a, M, y, t0, t1);
  else if (p.is_signed) tiles<T, 8, true>(p, a, M, y, t0, t1);
  else tiles<T, 8, false>(p, a, M, y, t0, t1);
}

inline void tiles_scalar(const Packed& p, const float* a, std::int64_t M, float* y, std::int64_t t0, std::int64_t t1) {
  tiles_any<ScalarOps>(p, a, M, y, t0, t1);
}
#ifdef ONDINE_SIMD_X86
__attribute__((target("avx512f"))) inline void tiles_avx512(const Packed& p, const float* a, std::int64_t M, float* y,
                                                             std::int64_t t0, std::int64_t t1) {
  tiles_any<Avx512Ops>(p, a, M, y, t0, t1);
}
__attribute__((target("avx2,fma"))) inline void tiles_avx2(const Packed& p, const float* a, std::int64_t M, float* y,
                                                            std::int64_t t0, std::int64_t t1) {
  tiles_any<Avx2Ops>(p, a, M, y, t0, t1);
}
#endif

// --- int8 activations -----------------------------------------------------------------------------
// The activations quantized per row and block of K, symmetric int8 (scale = max |a| / 127, rounded half to
// even), then integer dot products against the unsigned weights (VNNI's vpdpbusd, or AVX2's vpmaddubsw +
// vpmaddwd), per block: y += (dot - z * sum(qa)) * s * s_a. The same scheme as ONNX Runtime's MatMulNBits at
// accuracy level 4 and llama.cpp's Q4 x Q8: the weights are read as bytes, never converted to float.

// Packs for the int8-activation kernels: tiles of `tile` columns (vectors of 16 or 8 lanes), the block a
// multiple of 4 (8 for 4 bits).
inline Packed pack_int8(const Tensor& q, const Tensor& s, const Tensor& z, std::int64_t block, std::int64_t tile) {
  Packed p;
  p.int8_activations = true;
  p.K = q.dims()[0];
  p.N = q.dims()[1];
  p.block = block;
  p.blocks = (p.K + block - 1) / block;
  p.tile = tile;
  p.tiles = (p.N + tile - 1) / tile;
  p.bits = is_int4(q.dtype()) ? 4 : 8;
  const int offset = q.dtype() == DType::Int4 ? 8 : q.dtype() == DType::Int8 ? 128 : 0;
  const std::int64_t rows_per_group = p.bits == 4 ? 8 : 4, groups = block / rows_per_group;
  p.tile_bytes = p.blocks * groups * tile * 4;
  p.q.assign(static_cast<std::size_t>(p.tile_bytes * p.tiles), 0);
  p.scale.assign(static_cast<std::size_t>(p.tiles * p.blocks * tile), 0.0f);
  p.zero_const = static_cast<float>(offset);
  if (!z.empty()) p.zero.assign(p.scale.size(), 0.0f);
  const auto* qv = static_cast<const std::uint8_t*>(q.raw());
  auto u = [&](std::int64_t k, std::int64_t n) -> int {  // unsigned weight, 0 past K
    if (k >= p.K) return 0;
    const std::uint8_t b = qv[k * p.N + n];
    return (q.dtype() == DType::Int4 || q.dtype() == DType::Int8 ? static_cast<std::int8_t>(b) : b) + offset;
  };
  for (std::int64_t t = 0; t < p.tiles; ++t)
    for (std::int64_t b = 0; b < p.blocks; ++b) {
      for (std::int64_t j = 0; j < tile; ++j) {
        const std::int64_t n = t * tile + j;
        if (n >= p.N) continue;
        p.scale[static_cast<std::size_t>((t * p.blocks + b) * tile + j)] = s.data<float>()[b * p.N + n];
        if (!z.empty())
          p.zero[static_cast<std::size_t>((t * p.blocks + b) * tile + j)] =
              static_cast<float>(z.at_double(static_cast<std::size_t>(b * p.N + n))) + static_cast<float>(offset);
      }
      for (std::int64_t g = 0; g < groups; ++g) {
        std::uint8_t* out = p.q.data() + t * p.tile_bytes + (b * groups + g) * tile * 4;
        const std::int64_t k0 = b * block + g * rows_per_group;
        for (std::int64_t j = 0; j < tile; ++j) {
          const std::int64_t n = t * tile + j;
          if (n >= p.N) continue;
          for (int r = 0; r < 4; ++r)
            out[j * 4 + r] = static_cast<std::uint8_t>(p.bits == 4 ? (u(k0 + r, n) | (u(k0 + 4 + r, n) << 4)) : u(k0 + r, n));
        }
      }
    }
  return p;
}

// A's rows quantized per block: qa [M][blocks * block] (zeros past K), and per row and block the scale and the
// sum of qa.
struct QuantizedRows {
  std::vector<std::int8_t> q;
  std::vector<float> scale, sum;
  void resize(const Packed& p, std::int64_t M) {
    q.resize(static_cast<std::size_t>(M * p.blocks * p.block));
    scale.resize(static_cast<std::size_t>(M * p.blocks));
    sum.resize(scale.size());
  }
};

// One block of a row, n values, quantized into q (zeros up to `block`); returns the scale, and the sum of q in
// `sum`. Vectors of T where the block is whole multiples of them: the product x * (127 / max) rounded by the
// conversion (to nearest, ties to even, as std::nearbyint in the default mode) and saturated into bytes.
template <typename T>
__attribute__((always_inline)) inline float quantize_block(const float* x, std::int64_t n, std::int64_t block,
                                                           std::int8_t* q, std::int32_t& sum) {
  constexpr std::int64_t kL = static_cast<std::int64_t>(T::width);
  const bool vectors = n == block && n % kL == 0;
  float amax = 0;
  if (vectors) {
    typename T::V m = T::zero();
    for (std::int64_t k = 0; k < n; k += kL) m = T::max(m, T::abs(T::load(x + k)));
    amax = T::hmax(m);
  } else {
    for (std::int64_t k = 0; k < n; ++k) amax = std::max(amax, std::abs(x[k]));
  }
  const float inv = amax > 0 ? 127.0f / amax : 0.0f;
  if (vectors) {
    typename T::VI total = T::zero_i();
    const typename T::V vinv = T::set1(inv);
    for (std::int64_t k = 0; k < n; k += kL) total = T::round_to_int8(T::mul(T::load(x + k), vinv), q + k, total);
    sum = T::hsum_i(total);
  } else {
    sum = 0;
    for (std::int64_t k = 0; k < n; ++k) {
      const auto v = static_cast<std::int32_t>(std::nearbyint(x[k] * inv));
      q[k] = static_cast<std::int8_t>(std::max(-127, std::min(127, v)));
      sum += q[k];
    }
    for (std::int64_t k = n; k < block; ++k) q[k] = 0;
  }
  return amax / 127.0f;
}

// Rows [m0, m1) of A into `out` (sized by resize).
template <typename T>
__attribute__((always_inline)) inline void quantize_rows(const Packed& p, const float* a, std::int64_t m0,
                                                         std::int64_t m1, QuantizedRows& out) {
  const std::int64_t width = p.blocks * p.block;
  for (std::int64_t m = m0; m < m1; ++m)
    for (std::int64_t b = 0; b < p.blocks; ++b) {
      const std::int64_t k0 = b * p.block;
      std::int32_t sum = 0;
      out.scale[static_cast<std::size_t>(m * p.blocks + b)] =
          quantize_block<T>(a + m * p.K + k0, std::min(p.K, k0 + p.block) - k0, p.block, out.q.data() + m * width + k0, sum);
      out.sum[static_cast<std::size_t>(m * p.blocks + b)] = static_cast<float>(sum);
    }
}

struct ScalarDot : simd::Scalar {
  static constexpr int kVectors = 1, kRows = 2;
  using VI = std::int32_t;  // one column: 4 weight bytes
  static VI load_i(const std::uint8_t* p) {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  static VI low_nibbles(VI v) { return v & 0x0f0f0f0f; }
  static VI high_nibbles(VI v) { return (v >> 4) & 0x0f0f0f0f; }
  static VI zero_i() { return 0; }
  static VI bcast_i(std::int32_t v) { return v; }
  static VI dot(VI acc, VI w, VI a) {  // 4 x (u8 weight * s8 activation)
    for (int i = 0; i < 4; ++i)
      acc += static_cast<std::int32_t>((static_cast<std::uint32_t>(w) >> (8 * i)) & 0xffu) *
             static_cast<std::int8_t>((static_cast<std::uint32_t>(a) >> (8 * i)) & 0xffu);
    return acc;
  }
  static VI dot8(VI acc, VI w, VI a) { return dot(acc, w, a); }
  static V to_float(VI v) { return static_cast<float>(v); }
  static V fnmadd(V a, V b, V c) { return c - a * b; }
  static V mul(V a, V b) { return a * b; }
  static V max(V a, V b) { return std::max(a, b); }
  static V abs(V a) { return std::abs(a); }
  static float hmax(V a) { return a; }
  static VI round_to_int8(V v, std::int8_t* q, VI sum) {
    *q = static_cast<std::int8_t>(std::max(-127.0f, std::min(127.0f, std::nearbyint(v))));
    return sum + *q;
  }
  static std::int32_t hsum_i(VI v) { return v; }
};

#ifdef ONDINE_SIMD_X86
struct Avx512VnniDot : simd::Avx512 {
  static constexpr int kVectors = 4, kRows = 4;
  using VI = __m512i;
  __attribute__((target("avx512f,avx512bw,avx512vnni"))) static VI load_i(const std::uint8_t* p) { return _mm512_loadu_si512(p); }
  __attribute__((target("avx512f,avx512bw,avx512vnni"))) static VI low_nibbles(VI v) {
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
  }
  __attribute__((target("avx512f,avx512bw,avx512vnni"))) static VI high_nibbles(VI v) {
    return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0f));
  }
  __attribute__((target("avx512f,avx512bw,avx512vnni"))) static VI zero_i() { return _mm512_setzero_si512(); }
  __attribute__((target("avx512f,avx512bw,avx512vnni"))) static VI bcast_i(std::int32_t v) { return _mm512_set1_epi32(v); }
  __attribute__((target("avx512f,avx512bw,avx512vnni"))) static VI dot(VI acc, VI w, VI a) { return _mm512_dpbusd_epi32(acc, w, a); }
  __attribute__((target("avx512f,avx512bw,avx512vnni"))) static VI dot8(VI acc, VI w, VI a) { return _mm512_dpbusd_epi32(acc, w, a); }
  __attribute__((target("avx512f,avx512bw,avx512vnni"))) static V to_float(VI v) { return _mm512_cvtepi32_ps(v); }
  __attribute__((target("avx512f,avx512bw,avx512vnni"))) static V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
  __attribute__((target("avx512f,avx512bw,avx512vnni"))) static V abs(V a) { return _mm512_abs_ps(a); }
  __attribute__((target("avx512f,avx512bw,avx512vnni"))) static float hmax(V a) { return _mm512_reduce_max_ps(a); }
  // 16 values rounded by the conversion (MXCSR: to nearest, ties to even), saturated into 16 bytes at q.
  __attribute__((target("avx512f,avx512bw,avx512vnni"))) static VI round_to_int8(V v, std::int8_t* q, VI sum) {
    const VI i = _mm512_cvtps_epi32(v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(i));
    return _mm512_add_epi32(sum, i);
  }
  __attribute__((target("avx512f,avx512bw,avx512vnni"))) static std::int32_t hsum_i(VI v) { return _mm512_reduce_add_epi32(v); }
};

struct Avx2Dot : simd::Avx2 {
  static constexpr int kVectors = 2, kRows = 4;
  using VI = __m256i;
  __attribute__((target("avx2,fma"))) static VI load_i(const std::uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  __attribute__((target("avx2,fma"))) static VI low_nibbles(VI v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0f)); }
  __attribute__((target("avx2,fma"))) static VI high_nibbles(VI v) {
    return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f));
  }
  __attribute__((target("avx2,fma"))) static VI zero_i() { return _mm256_setzero_si256(); }
  __attribute__((target("avx2,fma"))) static VI bcast_i(std::int32_t v) { return _mm256_set1_epi32(v); }
  // u8 x s8 pairs summed into int16 (15 * 127 * 2 cannot saturate), then pairs of those into int32.
  __attribute__((target("avx2,fma"))) static VI dot(VI acc, VI w, VI a) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)));
  }
  // Full bytes would saturate vpmaddubsw's int16 pairs (255 * 127 * 2): u = 16 h + l, two nibble dots.
  __attribute__((target("avx2,fma"))) static VI dot8(VI acc, VI w, VI a) {
    const VI low = dot(_mm256_setzero_si256(), low_nibbles(w), a), high = dot(_mm256_setzero_si256(), high_nibbles(w), a);
    return _mm256_add_epi32(acc, _mm256_add_epi32(low, _mm256_slli_epi32(high, 4)));
  }
  __attribute__((target("avx2,fma"))) static V to_float(VI v) { return _mm256_cvtepi32_ps(v); }
  __attribute__((target("avx2,fma"))) static V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
  __attribute__((target("avx2,fma"))) static V abs(V a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  __attribute__((target("avx2,fma"))) static float hmax(V a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
  }
  // 8 values rounded by the conversion (MXCSR: to nearest, ties to even), saturated into 8 bytes at q.
  __attribute__((target("avx2,fma"))) static VI round_to_int8(V v, std::int8_t* q, VI sum) {
    const VI i = _mm256_cvtps_epi32(v);
    const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm_packs_epi16(words, words));
    return _mm256_add_epi32(sum, i);
  }
  __attribute__((target("avx2,fma"))) static std::int32_t hsum_i(VI v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
  }
};
#endif

// Y[m, tile t] for rows m of [m0, m0 + R): integer accumulators per block in registers, the float results
// added into Y (zeroed here) block after block, so R rows fit beside them.
template <typename T, int R, int Bits>
__attribute__((always_inline)) inline void tile_rows_int8(const Packed& p, std::int64_t t, const QuantizedRows& a,
                                                          std::int64_t m0, float* y) {
  using V = typename T::V;
  using VI = typename T::VI;
  constexpr int kV = T::kVectors, kL = static_cast<int>(T::width);
  constexpr int kGroupRows = Bits == 4 ? 8 : 4;
  const std::int64_t tile = p.tile, width = p.blocks * p.block, groups = p.block / kGroupRows;
  alignas(64) float out[R][kV * kL];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) T::store(out[r] + v * kL, T::zero());
  const std::uint8_t* wq = p.q.data() + t * p.tile_bytes;
  const V zero_const = T::set1(p.zero_const);
  for (std::int64_t b = 0; b < p.blocks; ++b) {
    VI acc[R][kV];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < kV; ++v) acc[r][v] = T::zero_i();
    for (std::int64_t g = 0; g < groups; ++g, wq += tile * 4) {
      const std::int64_t k = b * p.block + g * kGroupRows;
      std::int32_t quad0[R], quad1[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        std::memcpy(&quad0[r], a.q.data() + (m0 + r) * width + k, 4);
        if (Bits == 4) std::memcpy(&quad1[r], a.q.data() + (m0 + r) * width + k + 4, 4);
      }
#pragma GCC unroll 8
      for (int v = 0; v < kV; ++v) {
        const VI raw = T::load_i(wq + v * kL * 4);
        if constexpr (Bits == 4) {
          const VI lo = T::low_nibbles(raw), hi = T::high_nibbles(raw);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][v] = T::dot(T::dot(acc[r][v], lo, T::bcast_i(quad0[r])), hi, T::bcast_i(quad1[r]));
        } else {
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][v] = T::dot8(acc[r][v], raw, T::bcast_i(quad0[r]));
        }
      }
    }
    const float* sc = p.scale.data() + (t * p.blocks + b) * tile;
    const float* zp = p.zero.empty() ? nullptr : p.zero.data() + (t * p.blocks + b) * tile;
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) {
      const V s = T::load(sc + v * kL), z = zp ? T::load(zp + v * kL) : zero_const;
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const float sa = a.scale[static_cast<std::size_t>((m0 + r) * p.blocks + b)];
        const float sum = a.sum[static_cast<std::size_t>((m0 + r) * p.blocks + b)];
        const V centred = T::fnmadd(z, T::set1(sum), T::to_float(acc[r][v]));  // exact: integers below 2^24
        T::store(out[r] + v * kL, T::fmadd(centred, T::mul(s, T::set1(sa)), T::load(out[r] + v * kL)));
      }
    }
  }
  const std::int64_t n0 = t * tile, valid = std::min(tile, p.N - n0);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) std::memcpy(y + (m0 + r) * p.N + n0, out[r], static_cast<std::size_t>(valid) * sizeof(float));
}

template <typename T>
__attribute__((always_inline)) inline void tiles_int8(const Packed& p, const QuantizedRows& a, std::int64_t M, float* y,
                                                      std::int64_t t0, std::int64_t t1) {
  for (std::int64_t t = t0; t < t1; ++t) {
    std::int64_t m = 0;
    if (p.bits == 4) {
      for (; m + T::kRows <= M; m += T::kRows) tile_rows_int8<T, T::kRows, 4>(p, t, a, m, y);
      for (; m < M; ++m) tile_rows_int8<T, 1, 4>(p, t, a, m, y);
    } else {
      for (; m + T::kRows <= M; m += T::kRows) tile_rows_int8<T, T::kRows, 8>(p, t, a, m, y);
      for (; m < M; ++m) tile_rows_int8<T, 1, 8>(p, t, a, m, y);
    }
  }
}

using TilesInt8Fn = void (*)(const Packed&, const QuantizedRows&, std::int64_t, float*, std::int64_t, std::int64_t);
using QuantizeRowsFn = void (*)(const Packed&, const float*, std::int64_t, std::int64_t, QuantizedRows&);
inline void tiles_int8_scalar(const Packed& p, const QuantizedRows& a, std::int64_t M, float* y, std::int64_t t0,
                              std::int64_t t1) {
  tiles_int8<ScalarDot>(p, a, M, y, t0, t1);
}
inline void quantize_rows_scalar(const Packed& p, const float* a, std::int64_t m0, std::int64_t m1, QuantizedRows& out) {
  quantize_rows<ScalarDot>(p, a, m0, m1, out);
}
#ifdef ONDINE_SIMD_X86
__attribute__((target("avx512f,avx512bw,avx512vnni"))) inline void tiles_int8_vnni(const Packed& p, const QuantizedRows& a,
                                                                                    std::int64_t M, float* y,
                                                                                    std::int64_t t0, std::int64_t t1) {
  tiles_int8<Avx512VnniDot>(p, a, M, y, t0, t1);
}
__attribute__((target("avx512f,avx512bw,avx512vnni"))) inline void quantize_rows_vnni(const Packed& p, const float* a,
                                                                                      std::int64_t m0, std::int64_t m1,
                                                                                      QuantizedRows& out) {
  quantize_rows<Avx512VnniDot>(p, a, m0, m1, out);
}
__attribute__((target("avx2,fma"))) inline void tiles_int8_avx2(const Packed& p, const QuantizedRows& a, std::int64_t M,
                                                                 float* y, std::int64_t t0, std::int64_t t1) {
  tiles_int8<Avx2Dot>(p, a, M, y, t0, t1);
}
__attribute__((target("avx2,fma"))) inline void quantize_rows_avx2(const Packed& p, const float* a, std::int64_t m0,
                                                                    std::int64_t m1, QuantizedRows& out) {
  quantize_rows<Avx2Dot>(p, a, m0, m1, out);
}
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// The loop for oneDNN's effective ISA (DNNL_MAX_CPU_ISA caps it too), its tile width and its name: float32
// activations (`tiles`), or int8 ones (`tiles_int8`: VNNI on AVX-512, vpmaddubsw on AVX2).
struct Kernel {
  TilesFn tiles = tiles_scalar;
  std::int64_t tile = ScalarOps::kVectors;
  const char* name = "scalar";
  TilesInt8Fn tiles_int8 = nullptr;  // set: the int8-activation kernel, its packing pack_int8
  QuantizeRowsFn quantize_rows = quantize_rows_scalar;  // A's rows for tiles_int8
};
inline Kernel choose_kernel(bool int8_activations = false) {
  Kernel k;
#ifdef ONDINE_SIMD_X86
  const IsaInfo isa = effective_isa();
  const bool avx2 = isa_runs_on(CpuIsa::Avx2, isa.isa);
  if (isa.avx512) k = {tiles_avx512, Avx512Ops::kVectors * static_cast<std::int64_t>(Avx512Ops::width), "avx512"};
  else if (avx2) k = {tiles_avx2, Avx2Ops::kVectors * static_cast<std::int64_t>(Avx2Ops::width), "avx2"};
  if (!int8_activations) return k;
  // The int8 kernels' tiles are as wide as the float ones: a block that does not suit them keeps its float packing.
  static_assert(Avx512VnniDot::kVectors * Avx512VnniDot::width == Avx512Ops::kVectors * Avx512Ops::width, "tile widths");
  static_assert(Avx2Dot::kVectors * Avx2Dot::width == Avx2Ops::kVectors * Avx2Ops::width, "tile widths");
  if (isa.avx512 && isa.int8_vnni) {
    k.tiles_int8 = tiles_int8_vnni;
    k.quantize_rows = quantize_rows_vnni;
    k.name = "avx512_vnni";
    return k;
  }
  if (avx2) {  // AVX-512 without VNNI too: the AVX2 kernels, both (their tiles are narrower)
    k = {tiles_avx2, Avx2Ops::kVectors * static_cast<std::int64_t>(Avx2Ops::width), "avx2", tiles_int8_avx2,
         quantize_rows_avx2};
    return k;
  }
#endif
  if (int8_activations) k.tiles_int8 = tiles_int8_scalar;
  return k;
}

// Y [M, N] = A [M, K] W on up to `threads` threads, each a contiguous range of tiles. The int8 kernel
// quantizes A's rows first, the threads a share of rows each, into buffers kept per calling thread.
inline void multiply(const Kernel& kernel, const Packed& p, const float* a, std::int64_t M, float* y, int threads) {
  const std::int64_t work = p.K * p.N * std::max<std::int64_t>(M, 1);
  thread_local QuantizedRows buffers;
  QuantizedRows& rows = buffers;  // the calling thread's: its OpenMP team writes and reads these
  if (p.int8_activations) rows.resize(p, M);
  auto run = [&](std::int64_t t0, std::int64_t t1) {
    if (p.int8_activations) kernel.tiles_int8(p, rows, M, y, t0, t1);
    else kernel.tiles(p, a, M, y, t0, t1);
  };
  if (threads <= 1 || p.tiles < 2 || work < (1 << 16)) {
    if (p.int8_activations) kernel.quantize_rows(p, a, 0, M, rows);
    run(0, p.tiles);
    return;
  }
  const int nt = static_cast<int>(std::min<std::int64_t>(threads, p.tiles));
#pragma omp parallel num_threads(nt)
  {
    const std::int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    if (p.int8_activations) {
      kernel.quantize_rows(p, a, M * t / n, M * (t + 1) / n, rows);
#pragma omp barrier
    }
    run(p.tiles * t / n, p.tiles * (t + 1) / n);
  }
}

// The packed weights of a WeightOnlyMatMul node, or nothing when its operands are not the constants the
// definition asks for (the reference kernel then runs, and says what is wrong).
inline std::optional<Packed> pack_node(const Node& n, const Kernel& kernel) {
  const std::int64_t tile = kernel.tile;
  const Value *q = n.input(1), *s = n.input(2), *z = n.num_inputs() > 3 ? n.input(3) : nullptr;
  const std::int64_t block = n.attr_int("block_size", 0);
  if (!q || !s || !q->is_constant() || !s->is_constant() || (z && !z->is_constant()) || block <= 0) return std::nullopt;
  const Tensor& qt = q->constant();
  const Tensor& st = s->constant();
  if (qt.rank() != 2 || st.dtype() != DType::Float32) return std::nullopt;
  const std::int64_t K = qt.dims()[0], N = qt.dims()[1];
  if (st.dims() != std::vector<std::int64_t>{(K + block - 1) / block, N}) return std::nullopt;
  if (z && (z->constant().dims() != st.dims() || z->constant().dtype() != qt.dtype())) return std::nullopt;
  if (qt.dtype() != DType::Int4 && qt.dtype() != DType::UInt4 && qt.dtype() != DType::Int8 && qt.dtype() != DType::UInt8)
    return std::nullopt;
  const bool is4 = qt.dtype() == DType::Int4 || qt.dtype() == DType::UInt4;
  if (kernel.tiles_int8 && block % (is4 ? 8 : 4) == 0) return pack_int8(qt, st, z ? z->constant() : Tensor(), block, tile);
  return pack(qt, st, z ? z->constant() : Tensor(), block, tile);
}

inline std::string describe(const Packed& p, const Kernel& k) {
  return std::string("ondine:") + k.name + ":weight-only " + (p.bits == 4 ? "4" : "8") + "-bit, block " +
         std::to_string(p.block) + ", " + (p.int8_activations ? "int8" : "float32") + " activations, tiles of " +
         std::to_string(p.tile) + " columns";
}

// The fixed-shape plan's step: A [..., K] -> Y [..., N], row-major.
class WeightOnlyMatMulStep : public runtime::Step {
 public:
  WeightOnlyMatMulStep(runtime::StepInfo info, SlotId a, SlotId y, std::int64_t rows, Packed packed, Kernel kernel)
      : Step(std::move(info), {a}, {y}), a_(a), y_(y), rows_(rows), packed_(std::move(packed)), kernel_(kernel) {}
  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
    multiply(kernel_, packed_, static_cast<const float*>(ctx.ptr(a_)), rows_, static_cast<float*>(ctx.ptr(y_)),
             omp_get_max_threads());
  }

 private:
  SlotId a_, y_;
  std::int64_t rows_;
  Packed packed_;
  Kernel kernel_;
};

}  // namespace ondine::lower::detail::weight_only

namespace ondine::lower::detail {

inline bool lower_weight_only_matmul(Lowering& L, const Node& n) {
  const Value *a = n.input(0), *y = n.output(0);
  if (!a || !y || a->dtype() != DType::Float32 || !a->shape().is_static() || !y->shape().is_static()) return false;
  const weight_only::Kernel kernel = weight_only::choose_kernel(n.attr_int("int8_activations", 0) != 0);
  std::optional<weight_only::Packed> packed = weight_only::pack_node(n, kernel);
  if (!packed || a->shape().sizes().back() != packed->K) return false;
  const std::int64_t rows = *a->shape().numel() / std::max<std::int64_t>(packed->K, 1);
  SlotId as = L.row_major_slot(a), ys = L.new_plain_slot(y);
  L.define_plain(y, ys);
  std::string detail = Graph::value_type_str(a) + " -> " + Graph::value_type_str(y) + ": " + weight_only::describe(*packed, kernel);
  L.add_step(std::make_unique<weight_only::WeightOnlyMatMulStep>(
      runtime::StepInfo{n.name(), n.op_type(), std::string("ondine:") + kernel.name + ":weight-only", detail}, as, ys, rows,
      std::move(*packed), kernel));
  return true;
}

}  // namespace ondine::lower::detail
