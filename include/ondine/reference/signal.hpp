// SPDX-License-Identifier: Apache-2.0
// ondine/reference/signal.hpp - reference kernels of the signal ops: DFT (opsets 17 and 20), STFT,
// HannWindow, HammingWindow, BlackmanWindow and MelWeightMatrix (shapes and attribute rules:
// ir/infer/signal.hpp).
//
// The transforms are the plain O(n^2) sum y[k] = sum_j x[j] e^(-+2 pi i jk / n) in double, with each
// twiddle's angle reduced exactly (jk mod n) before the cosine, so the oracle stays exact to double
// rounding at any length; the inverse divides by n. No FFT: the reference is for checking, not speed.
// The windows and the mel filter bank follow the ONNX reference implementation
// (onnx/reference/ops/op_*_window.py, op_mel_weight_matrix.py), whose quirks they keep: the mel points
// are num_mel_bins + 2 steps apart over (num_mel_bins + 2) intervals, and the bins are floored.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ondine/ir/infer/signal.hpp"
#include "ondine/reference/common.hpp"
#include "ondine/reference/nn.hpp"

namespace ondine::reference {
namespace detail::signal {

namespace spec = ::ondine::infer::detail_signal;
using std::int64_t;

inline constexpr double kPi = 3.14159265358979323846;

// The value of a scalar (or [1]) integer input.
inline int64_t scalar(const Node& n, const Tensor& t, const char* role) {
  if (t.numel() != 1 || !(t.dtype() == DType::Int32 || t.dtype() == DType::Int64))
    throw n.error(std::string(role) + " must be an int32 or int64 scalar, got " + std::string(dtype_name(t.dtype())) +
                  " " + dims_str(t.dims()));
  return t.to_int64s()[0];
}

// One DFT of `in` (n_in complex points at stride `in_stride` pairs, zero beyond) into `out` (n_out of
// the `len` bins, contiguous pairs).
inline void dft_line(const double* in, int64_t in_stride, int64_t n_in, int64_t len, bool inverse, double* out,
                     int64_t out_stride, int64_t n_out) {
  const double sign = inverse ? 1.0 : -1.0;
  for (int64_t k = 0; k < n_out; ++k) {
    double re = 0, im = 0;
    for (int64_t j = 0; j < std::min(n_in, len); ++j) {
      const double angle = sign * 2 * kPi * static_cast<double>((j * k) % len) / static_cast<double>(len);
      const double c = std::cos(angle), s = std::sin(angle);
      const double xr = in[j * in_stride * 2], xi = in[j * in_stride * 2 + 1];
      re += xr * c - xi * s;
      im += xr * s + xi * c;
    }
    if (inverse) {
      re /= static_cast<double>(len);
      im /= static_cast<double>(len);
    }
    out[k * out_stride * 2] = re;
    out[k * out_stride * 2 + 1] = im;
  }
}

// The signal as complex pairs in double (a trailing 1 gets imaginary parts 0).
inline std::vector<double> as_complex(const Tensor& x) {
  const std::vector<double> v = nn::to_doubles(x);
  if (x.dims().back() == 2) return v;
  std::vector<double> c(v.size() * 2, 0.0);
  for (std::size_t i = 0; i < v.size(); ++i) c[2 * i] = v[i];
  return c;
}

inline std::vector<Tensor> dft(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = nn::required(n, in, 0);
  nn::require_floating(n, x, "input");
  const spec::DftSpec s = spec::dft_spec(n);
  if (x.rank() < 2 || (x.dims().back() != 1 && x.dims().back() != 2))
    throw n.error("input must be [batch, ..., 1 or 2], got " + dims_str(x.dims()));
  if (s.onesided && x.dims().back() == 2) throw n.error("onesided output needs a real input");
  const auto rank = static_cast<int64_t>(x.rank());
  int64_t axis_value = n.opset() < 20 ? n.attr_int("axis", 1) : -2;
  if (n.opset() >= 20 && !nn::input_or_empty(in, 2).empty()) axis_value = scalar(n, in[2], "axis");
  const auto axis = static_cast<std::size_t>(spec::dft_axis(n, axis_value, rank));
  const int64_t n_in = x.dims()[axis];
  int64_t len = n_in;
  if (!nn::input_or_empty(in, 1).empty()) {
    len = scalar(n, in[1], "dft_length");
    if (len <= 0) throw n.error("dft_length must be positive, got " + std::to_string(len));
  }
  const int64_t n_out = s.onesided ? len / 2 + 1 : len;
  std::vector<int64_t> out_dims = x.dims();
  out_dims.back() = 2;
  out_dims[axis] = n_out;
  // Lines along `axis`: outer dims before it, inner (complex) points after it.
  const int64_t outer = nn::product(x.dims(), 0, axis), inner = nn::product(x.dims(), axis + 1, x.rank() - 1);
  const std::vector<double> c = as_complex(x);
  std::vector<double> out(static_cast<std::size_t>(outer * n_out * inner * 2));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i)
      dft_line(c.data() + (o * n_in * inner + i) * 2, inner, n_in, len, s.inverse,
               out.data() + (o * n_out * inner + i) * 2, inner, n_out);
  return {nn::from_doubles(x.dtype(), out_dims, out)};
}

inline std::vector<Tensor> stft(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = nn::required(n, in, 0);
  nn::require_floating(n, x, "signal");
  const int64_t step = scalar(n, nn::required(n, in, 1), "frame_step");
  const Tensor& window = nn::input_or_empty(in, 2);
  const bool onesided = n.attr_int("onesided", 1) != 0;
  if (x.rank() != 3 || (x.dims()[2] != 1 && x.dims()[2] != 2))
    throw n.error("signal must be [batch, length, 1 or 2], got " + dims_str(x.dims()));
  if (onesided && x.dims()[2] == 2) throw n.error("onesided output needs a real signal");
  if (step <= 0) throw n.error("frame_step must be positive, got " + std::to_string(step));
  int64_t frame = -1;
  if (!window.empty()) {
    nn::require_same_dtype(n, x, window, "window");
    if (window.rank() != 1) throw n.error("window must be 1-D, got " + dims_str(window.dims()));
    frame = window.dims()[0];
  }
  if (!nn::input_or_empty(in, 3).empty()) {
    const int64_t fl = scalar(n, in[3], "frame_length");
    if (frame >= 0 && fl != frame)
      throw n.error("frame_length " + std::to_string(fl) + " differs from the window's length " + std::to_string(frame));
    frame = fl;
  }
  if (frame < 0) throw n.error("STFT needs a window or a frame_length");
  if (frame <= 0) throw n.error("frame_length must be positive, got " + std::to_string(frame));
  const int64_t B = x.dims()[0], L = x.dims()[1];
  if (L < frame) throw n.error("signal " + dims_str(x.dims()) + " is shorter than one frame of " + std::to_string(frame));
  const int64_t frames = (L - frame) / step + 1, bins = onesided ? frame / 2 + 1 : frame;
  const std::vector<double> c = as_complex(x);
  const std::vector<double> w = window.empty() ? std::vector<double>(static_cast<std::size_t>(frame), 1.0) : nn::to_doubles(window);
  std::vector<double> buf(static_cast<std::size_t>(frame * 2));
  std::vector<double> out(static_cast<std::size_t>(B * frames * bins * 2));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t f = 0; f < frames; ++f) {
      const double* src = c.data() + (b * L + f * step) * 2;
      for (int64_t j = 0; j < frame; ++j) {
        buf[static_cast<std::size_t>(2 * j)] = src[2 * j] * w[static_cast<std::size_t>(j)];
        buf[static_cast<std::size_t>(2 * j + 1)] = src[2 * j + 1] * w[static_cast<std::size_t>(j)];
      }
      dft_line(buf.data(), 1, frame, frame, false, out.data() + (b * frames + f) * bins * 2, 1, bins);
    }
  return {nn::from_doubles(x.dtype(), {B, frames, bins, 2}, out)};
}

// The window of `size` points, periodic (period size) or symmetric (period size - 1).
template <typename F>
std::vector<Tensor> window(const Node& n, const std::vector<Tensor>& in, F&& f) {
  const int64_t size = scalar(n, nn::required(n, in, 0), "size");
  if (size < 0) throw n.error("size must not be negative, got " + std::to_string(size));
  const bool periodic = n.attr_int("periodic", 1) != 0;
  const double period = static_cast<double>(periodic ? size : size - 1);
  std::vector<double> v(static_cast<std::size_t>(size));
  for (int64_t i = 0; i < size; ++i) v[static_cast<std::size_t>(i)] = f(2 * kPi * static_cast<double>(i) / period);
  return {nn::from_doubles(spec::output_datatype(n), {size}, v)};
}

inline std::vector<Tensor> hann_window(const Node& n, const std::vector<Tensor>& in) {
  return window(n, in, [](double a) { return 0.5 - 0.5 * std::cos(a); });
}
inline std::vector<Tensor> hamming_window(const Node& n, const std::vector<Tensor>& in) {
  constexpr double alpha = 25.0 / 46.0;  // ONNX's coefficients (not the rounded 0.54 / 0.46)
  return window(n, in, [](double a) { return alpha - (1 - alpha) * std::cos(a); });
}
inline std::vector<Tensor> blackman_window(const Node& n, const std::vector<Tensor>& in) {
  return window(n, in, [](double a) { return 0.42 - 0.5 * std::cos(a) + 0.08 * std::cos(2 * a); });
}

inline std::vector<Tensor> mel_weight_matrix(const Node& n, const std::vector<Tensor>& in) {
  const int64_t bins = scalar(n, nn::required(n, in, 0), "num_mel_bins");
  const int64_t dft_length = scalar(n, nn::required(n, in, 1), "dft_length");
  const int64_t rate = scalar(n, nn::required(n, in, 2), "sample_rate");
  const Tensor& lo = nn::required(n, in, 3);
  const Tensor& hi = nn::required(n, in, 4);
  if (bins <= 0 || dft_length <= 0 || rate <= 0)
    throw n.error("num_mel_bins, dft_length and sample_rate must be positive, got " + std::to_string(bins) + ", " +
                  std::to_string(dft_length) + ", " + std::to_string(rate));
  if (lo.numel() != 1 || hi.numel() != 1) throw n.error("lower_edge_hertz and upper_edge_hertz must be scalars");
  const int64_t spectrogram_bins = dft_length / 2 + 1;
  auto mel = [](double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); };
  const double lo_mel = mel(lo.at_double(0)), hi_mel = mel(hi.at_double(0));
  const double step = (hi_mel - lo_mel) / static_cast<double>(bins + 2);
  std::vector<int64_t> points(static_cast<std::size_t>(bins + 2));
  for (int64_t i = 0; i < bins + 2; ++i) {
    const double hz = 700.0 * (std::pow(10.0, (static_cast<double>(i) * step + lo_mel) / 2595.0) - 1.0);
    const auto p = static_cast<int64_t>(std::floor(static_cast<double>(dft_length + 1) * hz / static_cast<double>(rate)));
    if (p < 0 || p >= spectrogram_bins)
      throw n.error("mel point " + std::to_string(i) + " falls on bin " + std::to_string(p) + ", outside the " +
                    std::to_string(spectrogram_bins) + " spectrogram bins (check the edge frequencies)");
    points[static_cast<std::size_t>(i)] = p;
  }
  std::vector<double> out(static_cast<std::size_t>(spectrogram_bins * bins), 0.0);
  auto at = [&](int64_t j, int64_t i) -> double& { return out[static_cast<std::size_t>(j * bins + i)]; };
  for (int64_t i = 0; i < bins; ++i) {
    const int64_t left = points[static_cast<std::size_t>(i)], centre = points[static_cast<std::size_t>(i + 1)],
                  right = points[static_cast<std::size_t>(i + 2)];
    if (centre == left) at(centre, i) = 1;
    else
      for (int64_t j = left; j <= centre; ++j) at(j, i) = static_cast<double>(j - left) / static_cast<double>(centre - left);
    if (right > centre)
      for (int64_t j = centre; j < right; ++j) at(j, i) = static_cast<double>(right - j) / static_cast<double>(right - centre);
  }
  return {nn::from_doubles(spec::output_datatype(n), {spectrogram_bins, bins}, out)};
}

}  // namespace detail::signal

inline void register_signal_kernels(KernelTable& t) {
  t["DFT"] = detail::signal::dft;
  t["STFT"] = detail::signal::stft;
  t["HannWindow"] = detail::signal::hann_window;
  t["HammingWindow"] = detail::signal::hamming_window;
  t["BlackmanWindow"] = detail::signal::blackman_window;
  t["MelWeightMatrix"] = detail::signal::mel_weight_matrix;
}

}  // namespace ondine::reference
