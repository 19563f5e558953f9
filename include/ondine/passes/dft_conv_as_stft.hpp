// SPDX-License-Identifier: Apache-2.0
// ondine/passes/dft_conv_as_stft.hpp - dft-conv-as-stft: a Conv1d whose constant kernels are the rows of a
// windowed DFT (the STFT of audio models exported from PyTorch, which has no ONNX export of torch.stft
// before opset 17 and none at all in some versions: torchlibrosa, nnAudio and hand-written front ends write it
// as a convolution) as an STFT, a fast Fourier transform per frame.
//
// Rewrites (x [N, 1, L] float32; W [C, 1, K] constant; stride s; F <= K/2 + 1 bins):
//   Conv(x, W) with W = [w(n) cos(2 pi k n / K); sigma w(n) sin(2 pi k n / K)], k = 0..F-1, C = 2F
//       -> Reshape(Transpose(Slice(STFT(Reshape(x, [N, L, 1]), s, w, K)), [0, 3, 2, 1]) (* [1, -1]), [N, 2F, T])
//   the same with only the cosine rows (C = F: the real part) or only the sine rows (C = F: the imaginary part,
//   torchlibrosa's conv_imag): a Gather of that part, its sign, a Transpose to [N, F, T].
// The window w is read from the kernels (the k = 0 cosine row, or the sine rows where they determine it), and
// every row is checked against it within 1e-4 of the largest weight; sigma is +1 or -1 (ONNX's STFT gives
// -sum x w sin as the imaginary part).
// Why: a direct convolution by the DFT costs 2 K FLOPs per bin and frame, an FFT about 5 log2(K) per point: the
// bird classifier's front end (K 1024, 513 bins, 501 frames per 5-second window) took 5.7 of its 8 ms on
// one thread as a Conv at 82% of the CPU's peak.
// Preconditions: group 1, dilations 1, pads zero (a centring pad is a Pad node before the Conv), no bias or a
// zero one; anything else, or kernels that are not such rows, is left alone. Option "dft-conv-as-stft.off":
// the compiler sets it where STFT would run the reference kernel (a build without KissFFT).
// Names: the last new node's output takes the Conv output's name; new values and nodes are named after the Conv.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ondine/passes/pass.hpp"
#include "ondine/passes/rewrite.hpp"

namespace ondine {

namespace detail::dft_conv_as_stft {

// What the kernel rows of a matching Conv are.
struct DftRows {
  std::int64_t kernel = 0, stride = 1, bins = 0;  // K, s, F
  bool cosine = false, sine = false;              // which parts the rows hold (both: cosine rows first)
  float sine_sign = -1.0f;                         // sigma
  std::vector<float> window;                       // w, K values
};

// The rows of `n` when it is a Conv the rewrite applies to.
inline std::optional<DftRows> dft_rows(const Node& n) {
  if (n.op_type() != "Conv" || !n.domain().empty() || n.num_outputs() != 1) return std::nullopt;
  const Value* x = n.input(0);
  const Value* w = n.input(1);
  const Value* b = n.num_inputs() > 2 ? n.input(2) : nullptr;
  if (!x || x->dtype() != DType::Float32 || !x->shape().rank_known() || x->shape().rank() != 3) return std::nullopt;
  if (!x->shape()[1].is_static() || x->shape()[1].value != 1) return std::nullopt;
  if (!w || !w->is_constant() || w->constant().dtype() != DType::Float32 || w->constant().rank() != 3) return std::nullopt;
  if (b) {
    if (!b->is_constant() || b->constant().dtype() != DType::Float32) return std::nullopt;
    const float* bv = b->constant().data<float>();
    for (std::int64_t i = 0; i < b->constant().numel(); ++i)
      if (bv[i] != 0.0f) return std::nullopt;
  }
  const auto& wd = w->constant().dims();
  const std::int64_t c = wd[0], k = wd[2];
  if (wd[1] != 1 || k < 4) return std::nullopt;
  if (n.attr_int("group", 1) != 1) return std::nullopt;
  if (n.has_attr("auto_pad") && n.attr_string("auto_pad", "NOTSET") != "NOTSET") return std::nullopt;
  if (n.has_attr("kernel_shape") && n.attr_ints("kernel_shape") != std::vector<std::int64_t>{k}) return std::nullopt;
  if (!rewrite::ints_attr_all(n, "pads", 0, 2) || !rewrite::ints_attr_all(n, "dilations", 1, 1)) return std::nullopt;
  const std::vector<std::int64_t> strides = n.has_attr("strides") ? n.attr_ints("strides") : std::vector<std::int64_t>{1};
  if (strides.size() != 1 || strides[0] < 1) return std::nullopt;

  DftRows r;
  r.kernel = k;
  r.stride = strides[0];
  const std::int64_t half = k / 2 + 1;
  const float* wv = w->constant().data<float>();
  auto row = [&](std::int64_t i) { return wv + i * k; };
  float scale = 0.0f;
  for (std::int64_t i = 0; i < c * k; ++i) scale = std::max(scale, std::fabs(wv[i]));
  if (scale == 0.0f) return std::nullopt;
  // cos and sin of 2 pi j / K, j < K: bin * t is read modulo K (exact, as the exporter's own tables are).
  std::vector<double> cos_table(static_cast<std::size_t>(k)), sin_table(static_cast<std::size_t>(k));
  for (std::int64_t j = 0; j < k; ++j) {
    const double angle = 2.0 * 3.14159265358979323846 * static_cast<double>(j) / static_cast<double>(k);
    cos_table[static_cast<std::size_t>(j)] = std::cos(angle);
    sin_table[static_cast<std::size_t>(j)] = std::sin(angle);
  }
  auto cos_of = [&](std::int64_t bin, std::int64_t t) { return cos_table[static_cast<std::size_t>((bin * t) % k)]; };
  auto sin_of = [&](std::int64_t bin, std::int64_t t) { return sin_table[static_cast<std::size_t>((bin * t) % k)]; };

  // Which parts: cosine first when row 0 is a window (not all zero), else sine only (sin 0 = 0).
  bool row0_zero = true;
  for (std::int64_t t = 0; t < k; ++t) row0_zero = row0_zero && std::fabs(row(0)[t]) <= 1e-6f * scale;
  if (!row0_zero) {
    r.cosine = true;
    r.sine = c % 2 == 0 && c / 2 <= half && c > 2;
    r.bins = r.sine ? c / 2 : c;
    if (r.bins > half) return std::nullopt;
    r.window.assign(row(0), row(0) + k);
    if (r.sine) {  // ambiguous when every row could be either: a sine row 0 of its group must be zero
      for (std::int64_t t = 0; t < k; ++t)
        if (std::fabs(row(r.bins)[t]) > 1e-4f * scale) {
          r.sine = false;
          r.bins = c;
          break;
        }
      if (r.bins > half) return std::nullopt;
    }
  } else {
    r.sine = true;
    r.bins = c;
    if (r.bins > half || r.bins < 2) return std::nullopt;
    // sigma from the quarter-period point of row 1 (a window is non-negative there), then w from the row whose
    // sine is largest at each point (zero where every sine is: t = 0 and t = K/2, which no row reads).
    const double at_quarter = row(1)[k / 4] * sin_of(1, k / 4);
    if (at_quarter == 0.0) return std::nullopt;
    r.sine_sign = at_quarter > 0 ? 1.0f : -1.0f;
    r.window.assign(static_cast<std::size_t>(k), 0.0f);
    for (std::int64_t t = 0; t < k; ++t) {
      std::int64_t best = 1;
      for (std::int64_t bin = 2; bin < r.bins; ++bin)
        if (std::fabs(sin_of(bin, t)) > std::fabs(sin_of(best, t))) best = bin;
      const double s = sin_of(best, t);
      if (std::fabs(s) > 1e-3) r.window[static_cast<std::size_t>(t)] = static_cast<float>(row(best)[t] / (r.sine_sign * s));
    }
  }
  // The sine rows' sign, from the first sine row with a non-zero product.
  if (r.cosine && r.sine) {
    double dot = 0;
    for (std::int64_t t = 0; t < k; ++t) dot += row(r.bins + 1)[t] * r.window[static_cast<std::size_t>(t)] * sin_of(1, t);
    if (dot == 0) return std::nullopt;
    r.sine_sign = dot > 0 ? 1.0f : -1.0f;
  }
  // Every row checked against the window.
  const float tolerance = 1e-4f * scale;
  for (std::int64_t i = 0; i < c; ++i) {
    const bool sine_row = r.cosine ? i >= r.bins : true;
    const std::int64_t bin = r.cosine && sine_row ? i - r.bins : i;
    for (std::int64_t t = 0; t < k; ++t) {
      const double want = r.window[static_cast<std::size_t>(t)] *
                          (sine_row ? r.sine_sign * sin_of(bin, t) : cos_of(bin, t));
      if (std::fabs(row(i)[t] - want) > tolerance) return std::nullopt;
    }
  }
  return r;
}

inline Value* int64_constant(Graph& g, const std::string& name, std::vector<std::int64_t> values, bool scalar = false) {
  Tensor t(DType::Int64, scalar ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{static_cast<std::int64_t>(values.size())});
  for (std::size_t i = 0; i < values.size(); ++i) t.data<std::int64_t>()[i] = values[i];
  return g.add_constant(g.unique_name(name), std::move(t));
}

// Rewrites `conv`; returns it (left dead).
inline Node* rewrite(Graph& g, Node& conv, const DftRows& r) {
  Value* x = conv.input(0);
  Value* y = conv.output(0);
  const std::string base = conv.name().empty() ? g.unique_name("dft_conv") : conv.name();
  const int opset = std::max(conv.opset(), 17);
  const Shape& xs = x->shape();
  const Dim batch = xs[0], length = xs[2];
  const Dim frames = y->shape().rank_known() && y->shape().rank() == 3 ? y->shape()[2] : Dim();
  const std::int64_t half = r.kernel / 2 + 1;
  auto add = [&](const std::string& op, std::vector<Value*> inputs, std::map<std::string, Attribute> attrs,
                 const std::string& suffix, Shape shape) {
    Node* m = g.add_node(op, std::move(inputs), {g.unique_name(base + "." + suffix)}, std::move(attrs),
                         g.unique_name(base + "." + suffix));
    m->set_opset(opset);
    m->output(0)->set_dtype(DType::Float32);
    m->output(0)->set_shape(std::move(shape));
    return m->output(0);
  };

  Value* signal = add("Reshape", {x, int64_constant(g, base + ".signal_shape", {0, -1, 1})}, {}, "signal",
                      Shape{batch, length, Dim(1)});
  Tensor window(DType::Float32, {r.kernel});
  std::copy(r.window.begin(), r.window.end(), window.data<float>());
  Value* spectrum = add("STFT",
                        {signal, int64_constant(g, base + ".frame_step", {r.stride}, true),
                         g.add_constant(g.unique_name(base + ".window"), std::move(window)),
                         int64_constant(g, base + ".frame_length", {r.kernel}, true)},
                        {{"onesided", std::int64_t{1}}}, "stft", Shape{batch, frames, Dim(half), Dim(2)});
  if (r.bins < half)
    spectrum = add("Slice", {spectrum, int64_constant(g, base + ".starts", {0}), int64_constant(g, base + ".ends", {r.bins}),
                             int64_constant(g, base + ".axes", {2})},
                   {}, "bins", Shape{batch, frames, Dim(r.bins), Dim(2)});
  Value* out = nullptr;
  if (r.cosine && r.sine) {
    Value* t = add("Transpose", {spectrum}, {{"perm", std::vector<std::int64_t>{0, 3, 2, 1}}}, "parts",
                   Shape{batch, Dim(2), Dim(r.bins), frames});
    if (r.sine_sign > 0) {  // the rows hold +sin: the negated imaginary part
      Tensor signs(DType::Float32, {1, 2, 1, 1});
      signs.data<float>()[0] = 1.0f;
      signs.data<float>()[1] = -1.0f;
      t = add("Mul", {t, g.add_constant(g.unique_name(base + ".signs"), std::move(signs))}, {}, "signed", t->shape());
    }
    out = add("Reshape", {t, int64_constant(g, base + ".out_shape", {0, 2 * r.bins, -1})}, {}, "out",
              Shape{batch, Dim(2 * r.bins), frames});
  } else {
    Value* part = add("Gather", {spectrum, int64_constant(g, base + ".part", {r.cosine ? 0 : 1}, true)},
                      {{"axis", std::int64_t{3}}}, "part", Shape{batch, frames, Dim(r.bins)});
    if (!r.cosine && r.sine_sign > 0) {
      Tensor minus(DType::Float32, {});
      minus.data<float>()[0] = -1.0f;
      part = add("Mul", {part, g.add_constant(g.unique_name(base + ".minus"), std::move(minus))}, {}, "signed",
                 part->shape());
    }
    out = add("Transpose", {part}, {{"perm", std::vector<std::int64_t>{0, 2, 1}}}, "out",
              Shape{batch, Dim(r.bins), frames});
  }
  rewrite::take_over(g, y, out);
  return &conv;
}

}  // namespace detail::dft_conv_as_stft

struct DftConvAsStft {
  static constexpr const char* name = "dft-conv-as-stft";

  bool run(Graph& g, PassContext& ctx) {
    namespace d = detail::dft_conv_as_stft;
    if (ctx.option("dft-conv-as-stft.off") == "1") return false;
    std::vector<Node*> dead;
    for (Node* n : g.topo_order()) {
      const std::optional<d::DftRows> rows = d::dft_rows(*n);
      if (!rows) continue;
      const std::string label = n->name();
      dead.push_back(d::rewrite(g, *n, *rows));
      ctx.rewrite("'" + label + "' (" + std::to_string(rows->bins) + " bins of a " + std::to_string(rows->kernel) +
                  "-point DFT, " + (rows->cosine && rows->sine ? "cosine and sine" : rows->cosine ? "cosine" : "sine") +
                  " rows, hop " + std::to_string(rows->stride) + ") as an STFT");
    }
    if (dead.empty()) return false;
    rewrite::erase_if_dead(g, dead);
    return true;
  }
};

}  // namespace ondine
