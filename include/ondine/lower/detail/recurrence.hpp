// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/recurrence.hpp - Ondine's own recurrence kernels on AVX-512 and AVX2, for the two
// cases oneDNN 2.6 runs slowly or not at all:
//
// 1. An fp32 LSTM at small batch (at most max_small_batch): there oneDNN 2.6 runs each step's [N, H] x [H, 4H]
//    product far below the fp32 peak (on AVX-512 its brgemm kernel; on AVX2 its GEMM-based `ref`, one direction
//    per thread and the input projection on that thread alone). Split the way ONNX Runtime and PyTorch do:
//    X W^T + Wb + Rb for all T at once is a real GEMM (a oneDNN matmul, both directions in one, on every
//    thread), and what is left per step, G[t] + h[t-1] R^T and the gates, is a matrix-vector product whose
//    weights stream from cache (docs/performance.md, "Recurrent networks", has the measurements).
// 2. A GRU (linear_before_reset, PyTorch's) whose input projection the graph already computed:
//    quantize-dynamic (quant/quantize_dynamic.hpp) turns GRU(X, W, ...) into G = X W^T as a dynamic int8
//    matrix product and GRU(G, S, ...) where S selects G's columns of each direction (S[d][k][j] = 1 when
//    j = d*3H + k): standard ONNX that any runtime computes, at the cost of a product by S. Here that
//    product is skipped: the recurrence reads G as it is.
//
// The kernels keep up to 16 accumulators in registers (AVX-512: the gates of 16 hidden units x up to 4
// blocks or batch rows; AVX2: of 8 units x up to 3) and apply the gates there, so nothing but h (and LSTM's c)
// is written per step.
// Layouts, with L = 16 (AVX-512) or 8 (AVX2) hidden units per block (RnnShape::lanes). LSTM's G:
// [T*N, D*4*Hp] with Hp = H rounded up to L and the columns of direction d grouped by blocks of L hidden
// units, gates inside a block (ONNX's order i o f c): column ((d*blocks + j)*4 + g)*L + u. GRU's G: the
// graph's [T, N, D*3H]. Recurrent weights per direction: [blocks][H][gates][L] (row k of block j holds
// R[g*H + Lj + u][k]), zero past H. Y is the oneDNN path's dst_layer [T, N, D*H]; the
// previous step's h is read from there.
// With two threads or more, the threads split each direction's hidden units (a barrier per step, each
// core's share of the weights stays in its L2) or take a direction each (split_blocks says which).
// The cells are one source, templates over simd.hpp's traits with each ISA's sigmoid and tanh, instantiated
// for AVX-512 and AVX2, so both compute the same sums in the same order.
//
// Taken only when oneDNN's effective ISA has AVX-512 or AVX2 (DNNL_MAX_CPU_ISA caps it) and the node has none
// of what the oneDNN path declines (rnn_unsupported), nor peepholes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/silu.hpp"
#include "ondine/lower/detail/simd.hpp"

namespace ondine::lower::detail::recurrence {

constexpr std::int64_t kLanes = 16;
constexpr std::int64_t kLanes8 = 8;  // the AVX2 kernels' block of hidden units
// Above this batch oneDNN's LSTM kernel wins (measured, docs/performance.md "Recurrent networks"): on
// AVX-512 its brgemm LSTM from batch 5; on AVX2 its GEMM-based `ref` LSTM from batch 9 (the LSTM tagger at
// batch 8: these kernels 1.4x faster; at 16 oneDNN's 5-10%).
constexpr std::int64_t kMaxLstmBatch = 4;
constexpr std::int64_t kMaxLstmBatchAvx2 = 8;
inline std::int64_t max_small_batch(bool avx512) { return avx512 ? kMaxLstmBatch : kMaxLstmBatchAvx2; }

enum class Cell { Lstm, Gru };

struct RnnShape {
  std::int64_t seq = 0, batch = 0, dirs = 0, input = 0, hidden = 0;
  Cell cell = Cell::Lstm;
  std::int64_t lanes = kLanes;  // hidden units per block: 16 (AVX-512 kernels) or 8 (AVX2)
  std::int64_t gates() const { return cell == Cell::Lstm ? 4 : 3; }
  std::int64_t blocks() const { return (hidden + lanes - 1) / lanes; }
  std::int64_t padded() const { return blocks() * lanes; }
  // G's columns per direction: LSTM's padded blocks, or the graph's 3H.
  std::int64_t g_cols() const { return cell == Cell::Lstm ? 4 * padded() : 3 * hidden; }
};

// The operands of one cell call, at batch row 0 (the strides step to the next row). `bias`: GRU's packed
// biases of the direction (LSTM's are in G); `c`: LSTM's cell state (padded to whole blocks).
struct CellArgs {
  const float* g;
  std::int64_t g_stride;
  const float* r_packed;
  const float* bias;
  std::int64_t hidden;
  const float* h_prev;
  std::int64_t h_prev_stride;
  float* c;
  std::int64_t c_stride;
  float* h_out;
  std::int64_t h_out_stride;
};
using CellFn = void (*)(const CellArgs&, std::int64_t block);
// One cell per shape of the work: `Blocks` blocks of hidden units x `Rows` batch rows (AVX-512's shapes).
struct CellTable {
  CellFn b4r1, b2r1, b1r1, b2r2, b1r2, b1r3, b1r4;
};

#ifdef ONDINE_SIMD_X86

// The cells are written once over simd.hpp's traits; GCC's notes on their by-value vectors, and its false
// positive on the intrinsics' own _mm512_undefined_ps() (GCC bug 105593; see silu.hpp), are moot here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// simd.hpp's traits with the gates' sigmoid and tanh, and whether the sum over k is unrolled (see
// recurrent_product).
struct Avx512Cells : simd::Avx512 {
  static constexpr bool unroll_k = false;
  __attribute__((target("avx512f"))) static V sigmoid(V z) { return silu::sigmoid16(z); }
  __attribute__((target("avx512f"))) static V tanh(V z) { return silu::tanh16(z); }
};

struct Avx2Cells : simd::Avx2 {
  static constexpr bool unroll_k = true;
  // sigmoid by one_plus_exp2_8 and a division (exact to rounding; saturates to 0 and 1 for finite z).
  __attribute__((target("avx2,fma"))) static V sigmoid(V z) {
    return _mm256_div_ps(_mm256_set1_ps(1.0f),
                         silu::one_plus_exp2_8(_mm256_mul_ps(z, _mm256_set1_ps(silu::kMinusLog2e))));
  }
  __attribute__((target("avx2,fma"))) static V tanh(V z) {
    return _mm256_fmsub_ps(_mm256_set1_ps(2.0f), sigmoid(_mm256_add_ps(z, z)), _mm256_set1_ps(1.0f));
  }
};
static_assert(Avx512Cells::width == kLanes && Avx2Cells::width == kLanes8, "RnnShape::lanes is the traits' width");

// One k of the product: the Rows h values broadcast, each gate's weight vector loaded once for all rows.
template <typename T, int Blocks, int Rows, int Gates>
inline __attribute__((always_inline)) void product_step(const float* const (&h_rows)[Rows], const float* w,
                                                        std::int64_t block_floats, std::int64_t k,
                                                        typename T::V (&acc)[Rows][Blocks][Gates]) {
  constexpr auto lanes = static_cast<std::int64_t>(T::width);
  typename T::V hk[Rows];
#pragma GCC unroll 4
  for (int r = 0; r < Rows; ++r) hk[r] = T::set1(h_rows[r][k]);
#pragma GCC unroll 4
  for (int b = 0; b < Blocks; ++b)
#pragma GCC unroll 4
    for (int q = 0; q < Gates; ++q) {
      const typename T::V wq = T::load(w + b * block_floats + (k * Gates + q) * lanes);
#pragma GCC unroll 4
      for (int r = 0; r < Rows; ++r) acc[r][b][q] = T::fmadd(hk[r], wq, acc[r][b][q]);
    }
}

// acc[r][b][q] += h_prev[r] R_q^T over the `Gates` gates of blocks [block, block + Blocks): the weights of
// block j are [H][Gates][lanes] at r_packed + j * H * Gates * lanes, read once for all rows.
template <typename T, int Blocks, int Rows, int Gates>
inline __attribute__((always_inline)) void recurrent_product(const CellArgs& a, std::int64_t block,
                                                             typename T::V (&acc)[Rows][Blocks][Gates]) {
  // The trip count and the rows' addresses in locals: read through `a` the loop reloaded the count and
  // recomputed each row's address at every k (one Zen 3 core, H 256, 128 steps, -O3: batch 8 7.77-7.81 ->
  // 7.62-7.70 ms, batch 4 4.36-4.42 -> 4.28-4.30, batch 1 unchanged; at -O2 3-7%).
  // Unrolled on AVX2: 4 steps of k per iteration ran a 3-row cell at 62 instead of 47 GFLOP/s on one Zen 3
  // core (weights in L1). Tried and slower on the LSTM tagger's recurrence: software prefetch of the next
  // block's weights; the sum over k in two halves so the row groups share 16 KB of weights at a time (one core,
  // batch 8, H 256, 128 steps: 10.7-11.8 ms against 8.7-9.2 whole); gates in pairs (4 or 6 rows x 2 gates, 2
  // weight loads per k, the block's weights in two 16 KB passes): 9.6-10.4 against 8.7 ms; the 4 steps of k
  // written out by hand (GCC then spills accumulators): 10.0 against 7.9 ms.
  const std::int64_t hidden = a.hidden, block_floats = hidden * Gates * static_cast<std::int64_t>(T::width);
  const float* w = a.r_packed + block * block_floats;
  const float* h_rows[Rows];
  for (int r = 0; r < Rows; ++r) h_rows[r] = a.h_prev + r * a.h_prev_stride;
  if constexpr (T::unroll_k) {
#pragma GCC unroll 4
    for (std::int64_t k = 0; k < hidden; ++k) product_step<T, Blocks, Rows, Gates>(h_rows, w, block_floats, k, acc);
  } else {
    for (std::int64_t k = 0; k < hidden; ++k) product_step<T, Blocks, Rows, Gates>(h_rows, w, block_floats, k, acc);
  }
}

// How many hidden units the block of `lanes` that starts at `unit` holds (the last block may be partial).
inline int units_in_block(std::int64_t unit, std::int64_t hidden, std::int64_t lanes) {
  return static_cast<int>(std::min(lanes, hidden - unit));
}

// LSTM (gates i o f c, ONNX's order; G holds X W^T + Wb + Rb in this header's padded layout):
// acc = G + h_prev R^T, then c = f c + i tanh(acc_c), h = o tanh(c).
template <typename T, int Blocks, int Rows>
inline __attribute__((always_inline)) void lstm_cell(const CellArgs& a, std::int64_t block) {
  using V = typename T::V;
  constexpr auto lanes = static_cast<std::int64_t>(T::width);
  V acc[Rows][Blocks][4];
#pragma GCC unroll 4
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
    for (int b = 0; b < Blocks; ++b)
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) acc[r][b][q] = T::load(a.g + r * a.g_stride + ((block + b) * 4 + q) * lanes);
  recurrent_product<T, Blocks, Rows, 4>(a, block, acc);
#pragma GCC unroll 4
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
    for (int b = 0; b < Blocks; ++b) {
      const std::int64_t unit = (block + b) * lanes;  // first hidden unit of the block
      const V i = T::sigmoid(acc[r][b][0]), o = T::sigmoid(acc[r][b][1]);
      const V f = T::sigmoid(acc[r][b][2]), cand = T::tanh(acc[r][b][3]);
      float* cp = a.c + r * a.c_stride + unit;  // padded to whole blocks: no mask
      const V c_new = T::fmadd(f, T::load(cp), T::mul(i, cand));
      T::store(cp, c_new);
      const V h = T::mul(o, T::tanh(c_new));
      T::mask_store(a.h_out + r * a.h_out_stride + unit, T::tail(units_in_block(unit, a.hidden, lanes)), h);
    }
}

// GRU with linear_before_reset (gates z r h; G holds X W^T as the graph computed it, [D*3H] per row;
// bias per block [bz = Wbz + Rbz, br = Wbr + Rbr, Wbh, Rbh] x lanes):
// z = s(Gz + bz + h Rz^T), r = s(Gr + br + h Rr^T), n = tanh(Gh + Wbh + r (h Rh^T + Rbh)), h' = n + z (h - n).
template <typename T, int Blocks, int Rows>
inline __attribute__((always_inline)) void gru_cell(const CellArgs& a, std::int64_t block) {
  using V = typename T::V;
  constexpr auto lanes = static_cast<std::int64_t>(T::width);
  V acc[Rows][Blocks][3];
  const std::int64_t h = a.hidden;
#pragma GCC unroll 4
  for (int b = 0; b < Blocks; ++b) {
    const std::int64_t unit = (block + b) * lanes;
    const typename T::Mask m = T::tail(units_in_block(unit, h, lanes));
    const float* bias = a.bias + (block + b) * 4 * lanes;
#pragma GCC unroll 4
    for (int r = 0; r < Rows; ++r) {
      const float* g = a.g + r * a.g_stride + unit;
      acc[r][b][0] = T::add(T::maskz_load(m, g), T::load(bias));
      acc[r][b][1] = T::add(T::maskz_load(m, g + h), T::load(bias + lanes));
      acc[r][b][2] = T::load(bias + 3 * lanes);
    }
  }
  recurrent_product<T, Blocks, Rows, 3>(a, block, acc);
#pragma GCC unroll 4
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
    for (int b = 0; b < Blocks; ++b) {
      const std::int64_t unit = (block + b) * lanes;
      const typename T::Mask m = T::tail(units_in_block(unit, h, lanes));
      const float* bias = a.bias + (block + b) * 4 * lanes;
      const V z = T::sigmoid(acc[r][b][0]), reset = T::sigmoid(acc[r][b][1]);
      const V gh = T::add(T::maskz_load(m, a.g + r * a.g_stride + 2 * h + unit), T::load(bias + 2 * lanes));
      const V n = T::tanh(T::fmadd(reset, acc[r][b][2], gh));
      const V prev = T::maskz_load(m, a.h_prev + r * a.h_prev_stride + unit);
      T::mask_store(a.h_out + r * a.h_out_stride + unit, m, T::fmadd(z, T::sub(prev, n), n));
    }
}

// The cells of each ISA, `Blocks` blocks of hidden units x `Rows` batch rows.
template <Cell C, int Blocks, int Rows>
__attribute__((target("avx512f"))) inline void cell_avx512(const CellArgs& a, std::int64_t block) {
  if constexpr (C == Cell::Lstm) lstm_cell<Avx512Cells, Blocks, Rows>(a, block);
  else gru_cell<Avx512Cells, Blocks, Rows>(a, block);
}
template <Cell C, int Blocks, int Rows>
__attribute__((target("avx2,fma"))) inline void cell_avx2(const CellArgs& a, std::int64_t block) {
  if constexpr (C == Cell::Lstm) lstm_cell<Avx2Cells, Blocks, Rows>(a, block);
  else gru_cell<Avx2Cells, Blocks, Rows>(a, block);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// AVX-512 (32 zmm registers): up to 16 accumulators, 4 blocks of one row or up to 4 rows.
template <Cell C>
inline const CellTable& cells_avx512() {
  static const CellTable t{cell_avx512<C, 4, 1>, cell_avx512<C, 2, 1>, cell_avx512<C, 1, 1>, cell_avx512<C, 2, 2>,
                           cell_avx512<C, 1, 2>, cell_avx512<C, 1, 3>, cell_avx512<C, 1, 4>};
  return t;
}
inline const CellTable& lstm_cells() { return cells_avx512<Cell::Lstm>(); }
inline const CellTable& gru_cells() { return cells_avx512<Cell::Gru>(); }

// The operands `a` from batch row r0 on.
inline CellArgs from_row(CellArgs a, std::int64_t r0) {
  a.g += r0 * a.g_stride;
  a.h_prev += r0 * a.h_prev_stride;
  if (a.c) a.c += r0 * a.c_stride;
  a.h_out += r0 * a.h_out_stride;
  return a;
}

// One time step of `rows` batch rows (any count) over hidden blocks [block_begin, block_end): blocks of 4
// per call for one row, rows in groups of up to 4 otherwise (at most 16 accumulators either way).
inline void time_step(const CellTable& cells, CellArgs a, std::int64_t block_begin, std::int64_t block_end,
                      std::int64_t rows) {
  for (std::int64_t r0 = 0; r0 < rows;) {
    const std::int64_t take = std::min<std::int64_t>(4, rows - r0);
    const CellArgs at = from_row(a, r0);
    for (std::int64_t j = block_begin; j < block_end;) {
      const std::int64_t left = block_end - j;
      auto call = [&](CellFn fn, std::int64_t step) {
        fn(at, j);
        j += step;
      };
      if (take == 1 && left >= 4) call(cells.b4r1, 4);
      else if (take == 1 && left >= 2) call(cells.b2r1, 2);
      else if (take == 1) call(cells.b1r1, 1);
      else if (take == 2 && left >= 2) call(cells.b2r2, 2);
      else if (take == 2) call(cells.b1r2, 1);
      else if (take == 3) call(cells.b1r3, 1);
      else call(cells.b1r4, 1);
    }
    r0 += take;
  }
}

// AVX2 (16 ymm registers): blocks of 8 hidden units, at most 12 accumulators (3 blocks of one row, or one
// block of up to 3 rows), so the broadcast h values stay in registers and the weights are memory operands;
// the row groups of a step reuse a block's weights ([H][Gates][8]: 32 KB for an LSTM of H 256) from L1.
struct CellTable8 {
  CellFn b3r1, b2r1, b1r1, b1r2, b1r3;
};
template <Cell C>
inline const CellTable8& cells_avx2() {
  static const CellTable8 t{cell_avx2<C, 3, 1>, cell_avx2<C, 2, 1>, cell_avx2<C, 1, 1>, cell_avx2<C, 1, 2>,
                            cell_avx2<C, 1, 3>};
  return t;
}
inline const CellTable8& lstm_cells8() { return cells_avx2<Cell::Lstm>(); }
inline const CellTable8& gru_cells8() { return cells_avx2<Cell::Gru>(); }

// One time step on AVX2, as time_step: each block of hidden units for every row group before the next block,
// so the row groups share the block's weights in L1.
inline void time_step8(const CellTable8& cells, CellArgs a, std::int64_t block_begin, std::int64_t block_end,
                       std::int64_t rows) {
  if (rows == 1) {
    for (std::int64_t j = block_begin; j < block_end;) {
      const std::int64_t left = block_end - j;
      const std::int64_t step = left >= 3 ? 3 : left;
      (step == 3 ? cells.b3r1 : step == 2 ? cells.b2r1 : cells.b1r1)(a, j);
      j += step;
    }
    return;
  }
  for (std::int64_t j = block_begin; j < block_end; ++j)
    for (std::int64_t r0 = 0; r0 < rows;) {
      const std::int64_t take = std::min<std::int64_t>(3, rows - r0);
      (take == 3 ? cells.b1r3 : take == 2 ? cells.b1r2 : cells.b1r1)(from_row(a, r0), j);
      r0 += take;
    }
}

#endif  // ONDINE_SIMD_X86

// Whether these kernels can run on oneDNN's effective ISA (AVX-512, or AVX2 with FMA) in this build.
inline bool available(bool avx512, bool avx2) {
#ifdef ONDINE_SIMD_X86
  return avx512 || avx2;
#else
  (void)avx512, (void)avx2;
  return false;
#endif
}

// The implementation name of these kernels on oneDNN's effective ISA ("ondine:avx512", "ondine:avx2"), or
// nullptr where they do not run.
inline const char* kernel_name(const IsaInfo& isa = effective_isa()) {
  if (!available(isa.avx512, isa_runs_on(CpuIsa::Avx2, isa.isa))) return nullptr;
  return isa.avx512 ? "ondine:avx512" : "ondine:avx2";
}

// Whether W [D, 3H, D*3H] selects G's columns of each direction: W[d][k][j] = 1 when j = d*3H + k, else 0
// (what quantize-dynamic writes for a GRU whose projection it quantized).
inline bool is_column_selection(const Tensor& w, std::int64_t dirs, std::int64_t rows) {
  if (w.dtype() != DType::Float32 || w.dims() != std::vector<std::int64_t>{dirs, rows, dirs * rows}) return false;
  const float* p = w.data<float>();
  for (std::int64_t d = 0; d < dirs; ++d)
    for (std::int64_t k = 0; k < rows; ++k)
      for (std::int64_t j = 0; j < dirs * rows; ++j)
        if (p[(d * rows + k) * dirs * rows + j] != (j == d * rows + k ? 1.0f : 0.0f)) return false;
  return true;
}

// The recurrent weights R [D, G*H, H] (ONNX) of direction d, packed [blocks][H][G][lanes].
inline std::vector<float> pack_recurrent(const Tensor& r, const RnnShape& s, std::int64_t d) {
  const std::int64_t h = s.hidden, blocks = s.blocks(), gates = s.gates();
  std::vector<float> out(static_cast<std::size_t>(blocks * h * gates * s.lanes), 0.0f);
  const float* src = r.data<float>() + d * gates * h * h;
  for (std::int64_t j = 0; j < blocks; ++j)
    for (std::int64_t k = 0; k < h; ++k)
      for (std::int64_t q = 0; q < gates; ++q)
        for (std::int64_t u = 0; u < s.lanes && j * s.lanes + u < h; ++u)
          out[static_cast<std::size_t>(((j * h + k) * gates + q) * s.lanes + u)] = src[(q * h + j * s.lanes + u) * h + k];
  return out;
}

// LSTM: the input weights W [D, 4H, I] as the matmul's [I, D*4*Hp] (G's column order), and the bias Wb + Rb.
inline Tensor pack_lstm_input(const Tensor& w, const RnnShape& s) {
  const std::int64_t h = s.hidden, in = s.input, cols = s.dirs * s.g_cols();
  std::vector<float> out(static_cast<std::size_t>(in * cols), 0.0f);
  const float* src = w.data<float>();
  for (std::int64_t d = 0; d < s.dirs; ++d)
    for (std::int64_t q = 0; q < 4; ++q)
      for (std::int64_t unit = 0; unit < h; ++unit) {
        const std::int64_t col = d * s.g_cols() + ((unit / s.lanes) * 4 + q) * s.lanes + unit % s.lanes;
        for (std::int64_t i = 0; i < in; ++i)
          out[static_cast<std::size_t>(i * cols + col)] = src[(d * 4 * h + q * h + unit) * in + i];
      }
  return Tensor::from_vector<float>({in, cols}, out);
}
inline Tensor pack_lstm_bias(const Value* b, const RnnShape& s) {
  const std::int64_t h = s.hidden, cols = s.dirs * s.g_cols();
  std::vector<float> out(static_cast<std::size_t>(cols), 0.0f);
  if (b) {
    const float* src = b->constant().data<float>();
    for (std::int64_t d = 0; d < s.dirs; ++d)
      for (std::int64_t q = 0; q < 4; ++q)
        for (std::int64_t unit = 0; unit < h; ++unit)
          out[static_cast<std::size_t>(d * s.g_cols() + ((unit / s.lanes) * 4 + q) * s.lanes + unit % s.lanes)] =
              src[d * 8 * h + q * h + unit] + src[d * 8 * h + 4 * h + q * h + unit];
  }
  return Tensor::from_vector<float>({1, cols}, out);
}

// GRU: the biases of direction d per block of hidden units, [blocks][bz, br, Wbh, Rbh][lanes], from ONNX's
// B [D, 6H] = [Wbz Wbr Wbh Rbz Rbr Rbh] (zeros without B).
inline std::vector<float> pack_gru_bias(const Value* b, const RnnShape& s, std::int64_t d) {
  const std::int64_t h = s.hidden;
  std::vector<float> out(static_cast<std::size_t>(s.blocks() * 4 * s.lanes), 0.0f);
  if (!b) return out;
  const float* wb = b->constant().data<float>() + d * 6 * h;
  const float* rb = wb + 3 * h;
  for (std::int64_t unit = 0; unit < h; ++unit) {
    float* blk = out.data() + (unit / s.lanes) * 4 * s.lanes + unit % s.lanes;
    blk[0] = wb[unit] + rb[unit];
    blk[s.lanes] = wb[h + unit] + rb[h + unit];
    blk[2 * s.lanes] = wb[2 * h + unit];
    blk[3 * s.lanes] = rb[2 * h + unit];
  }
  return out;
}

// The recurrence over G, writing Y [T, N, D*H], Y_h and Y_c ([1, D, N, H] each, when wanted).
class RecurrenceStep : public runtime::Step {
 public:
  struct Slots {
    SlotId gates, h0, c0, y, y_h, y_c;
    bool has_h0 = false, has_c0 = false, has_y_h = false, has_y_c = false;
  };

  // `r_packed` (and for GRU `bias_packed`): per direction, shared by all contexts, never written.
  RecurrenceStep(runtime::StepInfo info, RnnShape shape, bool reverse, Slots slots, std::vector<memory> r_packed,
                 std::vector<memory> bias_packed)
      : Step(std::move(info), reads_of(slots), writes_of(slots)),
        s_(shape),
        reverse_(reverse),
        slots_(slots),
        r_packed_(std::move(r_packed)),
        bias_packed_(std::move(bias_packed)) {}

  struct State : runtime::StepState {
    std::vector<float> c;      // LSTM: [D, N, Hp]
    std::vector<float> zeros;  // h before the first step without initial_h: [N, H]
  };
  std::unique_ptr<runtime::StepState> make_state(runtime::ExecContext&) const override {
    auto st = std::make_unique<State>();
    if (s_.cell == Cell::Lstm) st->c.resize(static_cast<std::size_t>(s_.dirs * s_.batch * s_.padded()));
    st->zeros.assign(static_cast<std::size_t>(s_.batch * s_.hidden), 0.0f);
    return st;
  }

  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();  // G comes from the library step before
    State& st = ctx.state<State>(*this);
    const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    const std::int64_t blocks = s_.blocks();
    if (threads >= 2 && split_blocks(threads)) {
      // Each direction in turn, its hidden blocks split between the threads, a barrier after each step.
      const int nt = static_cast<int>(std::min<std::int64_t>(threads, blocks));
      for (std::int64_t d = 0; d < s_.dirs; ++d) {
        begin(ctx, st, d);
#pragma omp parallel num_threads(nt)
        {
          const std::int64_t t = omp_get_thread_num(), k = omp_get_num_threads();
          steps(ctx, st, d, blocks * t / k, blocks * (t + 1) / k, true);
        }
        end(ctx, st, d);
      }
    } else if (s_.dirs == 2 && threads >= 2) {
#pragma omp parallel num_threads(2)
      {
        const std::int64_t d = omp_get_thread_num();
        begin(ctx, st, d);
        steps(ctx, st, d, 0, blocks, false);
        end(ctx, st, d);
      }
    } else {
      for (std::int64_t d = 0; d < s_.dirs; ++d) {
        begin(ctx, st, d);
        steps(ctx, st, d, 0, blocks, false);
        end(ctx, st, d);
      }
    }
  }

  // Whether `threads` threads split each direction's hidden units (every step then ends at a barrier)
  // rather than each taking a direction. One direction: always (else a thread idles). Two: at batch 1 when a
  // direction's recurrent weights (G*H x H floats) pass half of one core's L2 and half of them fit in 3/4 of
  // it. Zen 4 (1 MiB L2): PyTorch's LSTM tagger (H 256, T 128, 2 cores) runs its recurrences in 2.97 ms split
  // against 3.6 ms side by side; at batch 2 and 4 side by side wins (6.6 / 13.6 ms against 7.3 / 14.5 ms in
  // all). Zen 3 (512 KB L2, AVX2), where the halves fit no better: the whole tagger at batch 1 7.9 / 6.9 ms
  // split against 7.1 / 6.3 side by side. Each thread needs at least 2 blocks of hidden units.
  bool split_blocks(int threads) const {
    if (s_.blocks() < 2 * threads) return false;
    const std::int64_t weight_bytes = s_.gates() * s_.hidden * s_.hidden * static_cast<std::int64_t>(sizeof(float));
    const std::int64_t l2 = l2_bytes();
    return s_.dirs == 1 || (s_.batch == 1 && 2 * weight_bytes > l2 && 2 * weight_bytes <= 3 * l2);
  }
  // One core's L2 in bytes as the C library reports it (1 MiB where it does not).
  static std::int64_t l2_bytes() {
    static const std::int64_t bytes = [] {
#ifdef _SC_LEVEL2_CACHE_SIZE
      const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#else
      const long l2 = 0;
#endif
      return l2 > 0 ? static_cast<std::int64_t>(l2) : std::int64_t{1} << 20;
    }();
    return bytes;
  }

 private:
  static std::vector<SlotId> reads_of(const Slots& s) {
    std::vector<SlotId> out{s.gates};
    if (s.has_h0) out.push_back(s.h0);
    if (s.has_c0) out.push_back(s.c0);
    return out;
  }
  static std::vector<SlotId> writes_of(const Slots& s) {
    std::vector<SlotId> out{s.y};
    if (s.has_y_h) out.push_back(s.y_h);
    if (s.has_y_c) out.push_back(s.y_c);
    return out;
  }

  bool backward(std::int64_t d) const { return reverse_ || d == 1; }

  // LSTM: the cell state of direction d from initial_c (or zeros).
  void begin(runtime::ExecContext& ctx, State& st, std::int64_t d) const {
    if (s_.cell != Cell::Lstm) return;
    const std::int64_t n = s_.batch, h = s_.hidden, hp = s_.padded();
    float* c = st.c.data() + d * n * hp;
    std::fill(c, c + n * hp, 0.0f);
    if (slots_.has_c0) {
      const float* c0 = static_cast<const float*>(ctx.ptr(slots_.c0)) + d * n * h;
      for (std::int64_t r = 0; r < n; ++r) std::memcpy(c + r * hp, c0 + r * h, static_cast<std::size_t>(h) * sizeof(float));
    }
  }

  // Every time step of direction d for hidden blocks [j0, j1); `sync`: a barrier after each step (the
  // threads that share the direction read all of h).
  void steps(runtime::ExecContext& ctx, State& st, std::int64_t d, std::int64_t j0, std::int64_t j1, bool sync) const {
#ifdef ONDINE_SIMD_X86
    const std::int64_t n = s_.batch, h = s_.hidden, dh = s_.dirs * h;
    CellArgs a{};
    a.g = static_cast<const float*>(ctx.ptr(slots_.gates)) + d * s_.g_cols();
    a.g_stride = s_.dirs * s_.g_cols();  // between rows of G
    a.r_packed = static_cast<const float*>(r_packed_[static_cast<std::size_t>(d)].get_data_handle());
    a.bias = bias_packed_.empty() ? nullptr
                                  : static_cast<const float*>(bias_packed_[static_cast<std::size_t>(d)].get_data_handle());
    a.hidden = h;
    a.h_prev = slots_.has_h0 ? static_cast<const float*>(ctx.ptr(slots_.h0)) + d * n * h : st.zeros.data();
    a.h_prev_stride = h;
    a.c = st.c.empty() ? nullptr : st.c.data() + d * n * s_.padded();
    a.c_stride = s_.padded();
    a.h_out_stride = dh;
    float* y = static_cast<float*>(ctx.ptr(slots_.y)) + d * h;
    const bool avx2 = s_.lanes == kLanes8;
    const CellTable& cells = s_.cell == Cell::Lstm ? lstm_cells() : gru_cells();
    const CellTable8& cells8 = s_.cell == Cell::Lstm ? lstm_cells8() : gru_cells8();
    const float* g0 = a.g;
    for (std::int64_t i = 0; i < s_.seq; ++i) {
      const std::int64_t t = backward(d) ? s_.seq - 1 - i : i;
      a.g = g0 + t * n * a.g_stride;
      a.h_out = y + t * n * dh;
      if (avx2) time_step8(cells8, a, j0, j1, n);
      else time_step(cells, a, j0, j1, n);
      a.h_prev = a.h_out;
      a.h_prev_stride = dh;
      if (sync) {
#pragma omp barrier
      }
    }
#else
    (void)ctx, (void)st, (void)d, (void)j0, (void)j1, (void)sync;
    throw Error("internal: Ondine's recurrence kernels are not built for this CPU");
#endif
  }

  // Y_h and Y_c of direction d: the last step's h (in Y) and c.
  void end(runtime::ExecContext& ctx, State& st, std::int64_t d) const {
    const std::int64_t n = s_.batch, h = s_.hidden, dh = s_.dirs * h;
    const float* last = static_cast<const float*>(ctx.ptr(slots_.y)) + d * h + (backward(d) ? 0 : (s_.seq - 1) * n * dh);
    if (slots_.has_y_h) {
      float* y_h = static_cast<float*>(ctx.ptr(slots_.y_h)) + d * n * h;
      for (std::int64_t row = 0; row < n; ++row)
        std::memcpy(y_h + row * h, last + row * dh, static_cast<std::size_t>(h) * sizeof(float));
    }
    if (slots_.has_y_c && !st.c.empty()) {
      const float* c = st.c.data() + d * n * s_.padded();
      float* y_c = static_cast<float*>(ctx.ptr(slots_.y_c)) + d * n * h;
      for (std::int64_t row = 0; row < n; ++row)
        std::memcpy(y_c + row * h, c + row * s_.padded(), static_cast<std::size_t>(h) * sizeof(float));
    }
  }

  RnnShape s_;
  bool reverse_;
  Slots slots_;
  std::vector<memory> r_packed_, bias_packed_;
};

// The packed recurrent weights (and GRU's biases) of each direction as constants, and the step.
inline void add_recurrence_step(Lowering& L, const Node& n, const RnnShape& s, bool reverse,
                                RecurrenceStep::Slots slots, const std::string& what) {
  const Tensor& r = n.input(2)->constant();
  const Value* b = n.num_inputs() > 3 ? n.input(3) : nullptr;
  auto as_constant = [&](std::vector<float> values) {
    const std::int64_t count = static_cast<std::int64_t>(values.size());
    return L.constant_memory(Tensor::from_vector<float>({count}, values), plain_md({count}));
  };
  std::vector<memory> packed, biases;
  for (std::int64_t d = 0; d < s.dirs; ++d) {
    packed.push_back(as_constant(pack_recurrent(r, s, d)));
    if (s.cell == Cell::Gru) biases.push_back(as_constant(pack_gru_bias(b, s, d)));
  }
  const std::string detail = std::string(s.dirs == 2 ? "bidirectional" : reverse ? "reverse" : "forward") + " T" +
                             std::to_string(s.seq) + " N" + std::to_string(s.batch) + " I" + std::to_string(s.input) +
                             " H" + std::to_string(s.hidden) + ": h R^T and the gates per step, " + what;
  const char* kernel = s.lanes == kLanes8 ? "ondine:avx2" : "ondine:avx512";
  L.add_step(std::make_unique<RecurrenceStep>(runtime::StepInfo{n.name(), n.op_type(), kernel, detail}, s, reverse,
                                              slots, std::move(packed), std::move(biases)));
}

// G = X W^T (+ bias) for every step and all directions, on one oneDNN matmul into an arena slot of
// [T*N, D*g_cols]; `weights` [I, D*g_cols] in G's column order. `bf16`: X (x_slot) and W in bfloat16, G in
// float32.
inline SlotId add_input_projection(Lowering& L, const Node& n, const RnnShape& s, SlotId x_slot, const Tensor& weights,
                                   const std::optional<Tensor>& bias, bool bf16) {
  const std::int64_t rows = s.seq * s.batch, cols = s.dirs * s.g_cols();
  runtime::Slot gslot = Lowering::slot_for(n.input(0), SlotKind::Arena, 0);
  gslot.name = n.name() + ".gates";
  gslot.dims = {rows, cols};
  gslot.bytes = static_cast<std::size_t>(rows * cols) * sizeof(float);
  gslot.layout = "ab";
  gslot.dtype = DType::Float32;
  const SlotId gates = L.add_slot(std::move(gslot));
  const std::string what = "X [" + std::to_string(rows) + "," + std::to_string(s.input) + "] x W^T -> G [" +
                           std::to_string(rows) + "," + std::to_string(cols) + "], all directions";
  const auto dt = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::desc src_md = plain_md({rows, s.input}, dt), dst_md = plain_md({rows, cols});
  const memory::desc w_any({s.input, cols}, dt, memory::format_tag::any);
  const memory::desc bias_md = bias ? plain_md({1, cols}) : memory::desc();
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, w_any, bias_md, dst_md), Lowering::base_attr(), L.engine());
  // Where oneDNN keeps the weights row-major (gemm:jit, AVX2) they are stored transposed instead: the
  // taggers' projections on 2 threads of a Zen 3, 1024x512x2048 15.8 -> 14.8 ms, 128x512x2048 6.2 -> 1.7 ms
  // (a 1x1 convolution over the rows, as matmul.hpp runs other products on AVX2: 17.3-18.8 and 2.4 ms).
  if (is_row_major(pd.weights_desc()))
    pd = dnnl::matmul::primitive_desc(
        dnnl::matmul::desc(src_md, memory::desc({s.input, cols}, dt, memory::format_tag::ba), bias_md, dst_md),
        Lowering::base_attr(), L.engine());
  std::vector<std::pair<int, memory>> consts{{DNNL_ARG_WEIGHTS, L.constant_memory(weights, pd.weights_desc())}};
  if (bias) consts.emplace_back(DNNL_ARG_BIAS, L.constant_memory(*bias, bias_md));
  L.add_primitive({n.name() + ":input_projection", n.op_type(), pd.impl_info_str(), what + (bf16 ? ", bf16" : "")},
                  &n, dnnl::matmul(pd), pd.scratchpad_desc(),
                  {{DNNL_ARG_SRC, x_slot, src_md}, {DNNL_ARG_DST, gates, dst_md}}, std::move(consts));
  return gates;
}

// Case 1: an fp32 LSTM `n` (checked by the caller: weights constant, no peepholes, nothing oneDNN
// declines) onto the matmul + recurrence, given the slots the caller made for X, the states and outputs.
inline void lower_lstm(Lowering& L, const Node& n, const RnnShape& s, bool reverse, SlotId x_slot,
                       RecurrenceStep::Slots slots, bool projection_bf16 = false) {
  const Value* b = n.num_inputs() > 3 ? n.input(3) : nullptr;
  slots.gates = add_input_projection(L, n, s, x_slot, pack_lstm_input(n.input(1)->constant(), s), pack_lstm_bias(b, s),
                                     projection_bf16);
  add_recurrence_step(L, n, s, reverse, slots, "after the input projection");
}

// An fp32 GRU (linear_before_reset) at small batch: G = X W^T in the graph's column order ([d][gate][unit],
// what case 2 reads), the biases in the recurrence.
inline void lower_small_gru(Lowering& L, const Node& n, const RnnShape& s, bool reverse, SlotId x_slot,
                            RecurrenceStep::Slots slots, bool projection_bf16 = false) {
  const Tensor& w = n.input(1)->constant();  // [D, 3H, I]
  const std::int64_t rows = 3 * s.hidden, in = s.input, cols = s.dirs * rows;
  Tensor wt(DType::Float32, {in, cols});
  const float* src = w.data<float>();
  for (std::int64_t c = 0; c < cols; ++c)
    for (std::int64_t i = 0; i < in; ++i) wt.data<float>()[i * cols + c] = src[c * in + i];
  slots.gates = add_input_projection(L, n, s, x_slot, wt, std::nullopt, projection_bf16);
  add_recurrence_step(L, n, s, reverse, slots, "after the input projection");
}

// Case 2: a GRU (linear_before_reset) whose W selects its input's columns (is_column_selection): the
// recurrence reads X as the input projection it is.
inline void lower_projected_gru(Lowering& L, const Node& n, const RnnShape& s, bool reverse, SlotId x_slot,
                                RecurrenceStep::Slots slots) {
  slots.gates = x_slot;
  add_recurrence_step(L, n, s, reverse, slots, "reading X as the input projection (W selects its columns)");
}

}  // namespace ondine::lower::detail::recurrence
