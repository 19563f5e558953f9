// ondine/lower/detail/lstm_small_batch.hpp - an fp32 LSTM at small batch on AVX-512: the input projection
// of every time step as one oneDNN matmul, then the recurrence as Ondine's own kernel.
//
// Why: oneDNN 2.6's only fp32 LSTM kernel for AVX-512 is brgemm-based; at batch 1 each time step is a
// [1, H] x [H, 4H] product that it runs at ~30% of the fp32 peak (PyTorch's bidirectional 2-layer tagger,
// H 256, T 128, 2 cores of a Zen 4: 107 sequences/s against ONNX Runtime's 152). Split the way ONNX Runtime
// and PyTorch do: X W^T + Wb + Rb for all T at once is a real GEMM (oneDNN matmul, both directions in one),
// and what is left per step, G[t] + h[t-1] R^T and the gates, is a matrix-vector product whose weights
// (4H x H) stream from cache; this kernel keeps 16 accumulators in registers (4 gates x 16 hidden units x
// up to 4 blocks or batch rows) and applies the gates there, so nothing but h and c is written per step.
//
// Layouts. G: [T*N, D*4*Hp] with Hp = H rounded up to 16 and the columns of direction d grouped by blocks of
// 16 hidden units, gates inside a block (ONNX's order i o f c): column ((d*blocks + j)*4 + g)*16 + u.
// Recurrent weights per direction: [blocks][H][4][16] (row k of block j holds R[g*H + 16j + u][k]), zero
// past H. Y is the oneDNN path's dst_layer [T, N, D*H]; the previous step's h is read from there.
// With two threads or more, the threads split each direction's hidden units (a barrier per step, each
// core's share of the weights stays in its L2) or take a direction each (split_blocks says which).
// Measured (bench command in docs/performance.md, "Recurrent networks"): that tagger at batch 1 went from
// 9.4 ms (oneDNN) to 4.5 ms, at batch 2 from 11.6 to 6.6 ms, at batch 4 from 14.8 to 12.6 ms; at 8 they tie.
//
// Taken only when oneDNN's effective ISA has AVX-512 (DNNL_MAX_CPU_ISA caps it), the batch is at most
// kMaxBatch, and the node has none of what the oneDNN path declines either, nor peepholes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/silu.hpp"

namespace ondine::lower::detail::lstm_small_batch {

constexpr std::int64_t kLanes = 16;
// Above this batch oneDNN's kernel wins (measured, docs/performance.md "Recurrent networks").
constexpr std::int64_t kMaxBatch = 4;

struct Dims3 {
  std::int64_t seq = 0, batch = 0, dirs = 0, input = 0, hidden = 0;
  std::int64_t blocks() const { return (hidden + kLanes - 1) / kLanes; }
  std::int64_t gate_cols() const { return blocks() * 4 * kLanes; }  // G's columns per direction
};

#ifdef ONDINE_SILU_X86

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// One time step for `Blocks` consecutive blocks of 16 hidden units starting at `block`, for `Rows` batch
// rows: acc = G + h_prev R^T, then c = f c + i tanh(acc_c), h = o tanh(c). `g`, `h_prev`, `c`, `h_out` point
// at row 0; the strides step to the next row.
template <int Blocks, int Rows>
__attribute__((target("avx512f"))) inline void cell(const float* g, std::int64_t g_stride, const float* r_packed,
                                                    std::int64_t hidden, std::int64_t block, const float* h_prev,
                                                    std::int64_t h_prev_stride, float* c, std::int64_t c_stride,
                                                    float* h_out, std::int64_t h_out_stride) {
  __m512 acc[Rows][Blocks][4];
  const std::int64_t block_floats = hidden * 4 * kLanes;
#pragma GCC unroll 4
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
    for (int b = 0; b < Blocks; ++b)
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) acc[r][b][q] = _mm512_loadu_ps(g + r * g_stride + ((block + b) * 4 + q) * kLanes);
  const float* w = r_packed + block * block_floats;
  for (std::int64_t k = 0; k < hidden; ++k) {
    __m512 hk[Rows];
#pragma GCC unroll 4
    for (int r = 0; r < Rows; ++r) hk[r] = _mm512_set1_ps(h_prev[r * h_prev_stride + k]);
#pragma GCC unroll 4
    for (int b = 0; b < Blocks; ++b)
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) {
        const __m512 wq = _mm512_loadu_ps(w + b * block_floats + (k * 4 + q) * kLanes);
#pragma GCC unroll 4
        for (int r = 0; r < Rows; ++r) acc[r][b][q] = _mm512_fmadd_ps(hk[r], wq, acc[r][b][q]);
      }
  }
#pragma GCC unroll 4
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
    for (int b = 0; b < Blocks; ++b) {
      const std::int64_t unit = (block + b) * kLanes;  // first hidden unit of the block
      const __m512 i = silu::sigmoid16(acc[r][b][0]), o = silu::sigmoid16(acc[r][b][1]);
      const __m512 f = silu::sigmoid16(acc[r][b][2]), cand = silu::tanh16(acc[r][b][3]);
      float* cp = c + r * c_stride + unit;  // padded to whole blocks: no mask
      const __m512 c_new = _mm512_fmadd_ps(f, _mm512_loadu_ps(cp), _mm512_mul_ps(i, cand));
      _mm512_storeu_ps(cp, c_new);
      const __m512 h = _mm512_mul_ps(o, silu::tanh16(c_new));
      const std::int64_t valid = std::min<std::int64_t>(kLanes, hidden - unit);
      _mm512_mask_storeu_ps(h_out + r * h_out_stride + unit, static_cast<__mmask16>((1u << valid) - 1u), h);
    }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// One time step of `rows` batch rows (any count): blocks of 4 per call for one row, rows in groups of up
// to 4 otherwise (16 accumulators either way).
inline void time_step(const float* g, std::int64_t g_stride, const float* r_packed, std::int64_t hidden,
                      std::int64_t block_begin, std::int64_t blocks, std::int64_t rows, const float* h_prev, std::int64_t h_prev_stride, float* c,
                      std::int64_t c_stride, float* h_out, std::int64_t h_out_stride) {
  for (std::int64_t r0 = 0; r0 < rows;) {
    const std::int64_t take = std::min<std::int64_t>(4, rows - r0);
    const float* gr = g + r0 * g_stride;
    const float* hp = h_prev + r0 * h_prev_stride;
    float* cr = c + r0 * c_stride;
    float* hr = h_out + r0 * h_out_stride;
    for (std::int64_t j = block_begin; j < blocks;) {
      const std::int64_t left = blocks - j;
      const auto args = [&](auto fn, std::int64_t step) {
        fn(gr, g_stride, r_packed, hidden, j, hp, h_prev_stride, cr, c_stride, hr, h_out_stride);
        j += step;
      };
      if (take == 1 && left >= 4) args(cell<4, 1>, 4);
      else if (take == 1 && left >= 2) args(cell<2, 1>, 2);
      else if (take == 1) args(cell<1, 1>, 1);
      else if (take == 2 && left >= 2) args(cell<2, 2>, 2);
      else if (take == 2) args(cell<1, 2>, 1);
      else if (take == 3) args(cell<1, 3>, 1);
      else args(cell<1, 4>, 1);
    }
    r0 += take;
  }
}

#endif  // ONDINE_SILU_X86

// Whether this kernel can run on oneDNN's effective ISA (`avx512`) in this build.
inline bool available(bool avx512) {
#ifdef ONDINE_SILU_X86
  return avx512;
#else
  (void)avx512;
  return false;
#endif
}

// The recurrent weights R [D, 4H, H] (ONNX) of direction d, packed [blocks][H][4][16].
inline std::vector<float> pack_recurrent(const Tensor& r, const Dims3& s, std::int64_t d) {
  const std::int64_t h = s.hidden, blocks = s.blocks();
  std::vector<float> out(static_cast<std::size_t>(blocks * h * 4 * kLanes), 0.0f);
  const float* src = r.data<float>() + d * 4 * h * h;
  for (std::int64_t j = 0; j < blocks; ++j)
    for (std::int64_t k = 0; k < h; ++k)
      for (std::int64_t q = 0; q < 4; ++q)
        for (std::int64_t u = 0; u < kLanes && j * kLanes + u < h; ++u)
          out[static_cast<std::size_t>(((j * h + k) * 4 + q) * kLanes + u)] = src[(q * h + j * kLanes + u) * h + k];
  return out;
}

// The input weights W [D, 4H, I] as the matmul's [I, D*4*Hp] (G's column order), and the bias Wb + Rb.
inline Tensor pack_input(const Tensor& w, const Dims3& s) {
  const std::int64_t h = s.hidden, in = s.input, cols = s.dirs * s.gate_cols();
  std::vector<float> out(static_cast<std::size_t>(in * cols), 0.0f);
  const float* src = w.data<float>();
  for (std::int64_t d = 0; d < s.dirs; ++d)
    for (std::int64_t q = 0; q < 4; ++q)
      for (std::int64_t unit = 0; unit < h; ++unit) {
        const std::int64_t col = d * s.gate_cols() + ((unit / kLanes) * 4 + q) * kLanes + unit % kLanes;
        for (std::int64_t i = 0; i < in; ++i)
          out[static_cast<std::size_t>(i * cols + col)] = src[(d * 4 * h + q * h + unit) * in + i];
      }
  return Tensor::from_vector<float>({in, cols}, out);
}
inline Tensor pack_bias(const Value* b, const Dims3& s) {
  const std::int64_t h = s.hidden, cols = s.dirs * s.gate_cols();
  std::vector<float> out(static_cast<std::size_t>(cols), 0.0f);
  if (b) {
    const float* src = b->constant().data<float>();
    for (std::int64_t d = 0; d < s.dirs; ++d)
      for (std::int64_t q = 0; q < 4; ++q)
        for (std::int64_t unit = 0; unit < h; ++unit)
          out[static_cast<std::size_t>(d * s.gate_cols() + ((unit / kLanes) * 4 + q) * kLanes + unit % kLanes)] =
              src[d * 8 * h + q * h + unit] + src[d * 8 * h + 4 * h + q * h + unit];
  }
  return Tensor::from_vector<float>({1, cols}, out);
}

// The recurrence over G, writing Y [T, N, D*H], Y_h and Y_c ([1, D, N, H] each, when wanted).
class RecurrenceStep : public runtime::Step {
 public:
  struct Slots {
    SlotId gates, h0, c0, y, y_h, y_c;
    bool has_h0 = false, has_c0 = false, has_y_h = false, has_y_c = false;
  };

  RecurrenceStep(runtime::StepInfo info, Dims3 shape, bool reverse, Slots slots, std::vector<memory> r_packed)
      : Step(std::move(info), reads_of(slots), writes_of(slots)),
        s_(shape),
        reverse_(reverse),
        slots_(slots),
        r_packed_(std::move(r_packed)) {}

  struct State : runtime::StepState {
    std::vector<float> c;      // [D, N, Hp]
    std::vector<float> zeros;  // h before the first step without initial_h: [N, H]
  };
  std::unique_ptr<runtime::StepState> make_state(runtime::ExecContext&) const override {
    auto st = std::make_unique<State>();
    st->c.resize(static_cast<std::size_t>(s_.dirs * s_.batch * s_.blocks() * kLanes));
    st->zeros.assign(static_cast<std::size_t>(s_.batch * s_.hidden), 0.0f);
    return st;
  }

  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();  // G comes from the matmul before
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
  // rather than each taking a direction. One direction: always (else a thread idles). Two: at batch 1 when
  // a direction's recurrent weights (4H x H floats) pass half of one core's L2 (Zen 4: 1 MiB) and their
  // halves do not: PyTorch's tagger (H 256, T 128, 2 cores) runs its recurrences in 2.97 ms split against
  // 3.6 ms side by side; at batch 2 and 4 side by side wins (6.6 / 13.6 ms against 7.3 / 14.5 ms in all).
  // Each thread needs at least 2 blocks of 16 hidden units.
  bool split_blocks(int threads) const {
    if (s_.blocks() < 2 * threads) return false;
    const std::int64_t weight_bytes = 4 * s_.hidden * s_.hidden * static_cast<std::int64_t>(sizeof(float));
    return s_.dirs == 1 || (s_.batch == 1 && weight_bytes > (std::int64_t{1} << 19));
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

  std::int64_t padded() const { return s_.blocks() * kLanes; }
  bool backward(std::int64_t d) const { return reverse_ || d == 1; }

  // The cell state of direction d from initial_c (or zeros).
  void begin(runtime::ExecContext& ctx, State& st, std::int64_t d) const {
    const std::int64_t n = s_.batch, h = s_.hidden, hp = padded();
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
#ifdef ONDINE_SILU_X86
    const std::int64_t n = s_.batch, h = s_.hidden, dh = s_.dirs * h;
    const float* g = static_cast<const float*>(ctx.ptr(slots_.gates)) + d * s_.gate_cols();
    const std::int64_t g_stride = s_.dirs * s_.gate_cols();  // between rows of G
    float* y = static_cast<float*>(ctx.ptr(slots_.y)) + d * h;
    float* c = st.c.data() + d * n * padded();
    const float* h_prev = slots_.has_h0 ? static_cast<const float*>(ctx.ptr(slots_.h0)) + d * n * h : st.zeros.data();
    std::int64_t h_prev_stride = h;
    const float* r = static_cast<const float*>(r_packed_[static_cast<std::size_t>(d)].get_data_handle());
    for (std::int64_t i = 0; i < s_.seq; ++i) {
      const std::int64_t t = backward(d) ? s_.seq - 1 - i : i;
      float* h_out = y + t * n * dh;
      time_step(g + t * n * g_stride, g_stride, r, h, j0, j1, n, h_prev, h_prev_stride, c, padded(), h_out, dh);
      h_prev = h_out;
      h_prev_stride = dh;
      if (sync) {
#pragma omp barrier
      }
    }
#else
    (void)ctx, (void)st, (void)d, (void)j0, (void)j1, (void)sync;
    throw Error("internal: the small-batch LSTM kernel is not built for this CPU");
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
    if (slots_.has_y_c) {
      const float* c = st.c.data() + d * n * padded();
      float* y_c = static_cast<float*>(ctx.ptr(slots_.y_c)) + d * n * h;
      for (std::int64_t row = 0; row < n; ++row)
        std::memcpy(y_c + row * h, c + row * padded(), static_cast<std::size_t>(h) * sizeof(float));
    }
  }

  Dims3 s_;
  bool reverse_;
  Slots slots_;
  std::vector<memory> r_packed_;  // per direction, shared by contexts (never written)
};

// Lowers an fp32 LSTM `n` (checked by the caller: weights constant, no peepholes, nothing oneDNN declines)
// onto the matmul + recurrence above, given the slots the caller made for X, the states and the outputs.
inline void lower(Lowering& L, const Node& n, const Dims3& s, bool reverse, SlotId x_slot,
                  RecurrenceStep::Slots slots) {
  const Tensor& w = n.input(1)->constant();
  const Tensor& r = n.input(2)->constant();
  const Value* b = n.num_inputs() > 3 ? n.input(3) : nullptr;
  const std::int64_t rows = s.seq * s.batch, cols = s.dirs * s.gate_cols();

  // G = X W^T + Wb + Rb for every step and both directions, into an arena slot.
  runtime::Slot gslot = Lowering::slot_for(n.input(0), SlotKind::Arena, 0);
  gslot.name = n.name() + ".gates";
  gslot.dims = {rows, cols};
  gslot.bytes = static_cast<std::size_t>(rows * cols) * sizeof(float);
  gslot.layout = "ab";
  gslot.dtype = DType::Float32;
  slots.gates = L.add_slot(std::move(gslot));
  const memory::desc src_md = plain_md({rows, s.input}), dst_md = plain_md({rows, cols});
  const memory::desc w_any({s.input, cols}, memory::data_type::f32, memory::format_tag::any);
  const memory::desc bias_md = plain_md({1, cols});
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, w_any, bias_md, dst_md), Lowering::base_attr(), L.engine());
  L.add_primitive({n.name() + ":input_projection", n.op_type(), pd.impl_info_str(),
                   "X [" + std::to_string(rows) + "," + std::to_string(s.input) + "] x W^T -> G [" +
                       std::to_string(rows) + "," + std::to_string(cols) + "], both directions"},
                  &n, dnnl::matmul(pd), pd.scratchpad_desc(),
                  {{DNNL_ARG_SRC, x_slot, src_md}, {DNNL_ARG_DST, slots.gates, dst_md}},
                  {{DNNL_ARG_WEIGHTS, L.constant_memory(pack_input(w, s), pd.weights_desc())},
                   {DNNL_ARG_BIAS, L.constant_memory(pack_bias(b, s), bias_md)}});

  std::vector<memory> packed;
  for (std::int64_t d = 0; d < s.dirs; ++d) {
    std::vector<float> p = pack_recurrent(r, s, d);
    const std::int64_t count = static_cast<std::int64_t>(p.size());
    packed.push_back(L.constant_memory(Tensor::from_vector<float>({count}, p), plain_md({count})));
  }
  const std::string detail = std::string(s.dirs == 2 ? "bidirectional, its two directions side by side"
                                         : reverse   ? "reverse"
                                                     : "forward") +
                             " T" + std::to_string(s.seq) + " N" + std::to_string(s.batch) + " I" +
                             std::to_string(s.input) + " H" + std::to_string(s.hidden) +
                             ": h R^T and the gates per step, after the input projection";
  L.add_step(std::make_unique<RecurrenceStep>(runtime::StepInfo{n.name(), n.op_type(), "ondine:avx512", detail}, s,
                                              reverse, slots, std::move(packed)));
}

}  // namespace ondine::lower::detail::lstm_small_batch
