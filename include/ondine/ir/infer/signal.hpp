// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/signal.hpp - shape and type inference for the signal ops of opset 17: DFT (opsets 17
// and 20), STFT, HannWindow, HammingWindow, BlackmanWindow and MelWeightMatrix.
//
// Complex tensors are real tensors with a trailing dim of 2 (real, imaginary); a real signal may end
// in a dim of 1. DFT keeps its input's shape except the last dim (2) and the transformed axis
// (dft_length, or dft_length / 2 + 1 when onesided); opset 17 takes the axis as an attribute (default 1),
// opset 20 as an optional scalar input (default -2). STFT: signal [batch, length, 1|2] gives
// [batch, frames, bins, 2], frames = (length - frame_length) / frame_step + 1, bins = frame_length / 2 + 1
// when onesided (the default), frame_length when not. The windows are [size]; MelWeightMatrix is
// [dft_length / 2 + 1, num_mel_bins]. Sizes come from input values, so their dims are static only when
// those values are known (constants, or inputs bound as ir/stats.hpp's shape parameters); the rules
// are read here once and shared with the reference kernels (reference/signal.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/infer/common.hpp"
#include "ondine/ir/infer/math.hpp"
#include "ondine/ir/infer/nn.hpp"

namespace ondine::infer {
namespace detail_signal {

using detail_nn::require_dtype;

// The value of scalar input i when known at compile time.
inline std::optional<std::int64_t> scalar_value(const Node& n, std::size_t i) {
  auto v = input_values(n, i);
  if (!v || v->size() != 1 || !(*v)[0].is_number()) return std::nullopt;
  return *(*v)[0].number;
}

inline void require_scalar_int(const Node& n, std::size_t i, const char* role) {
  const Value* v = n.input(i);
  if (!v) return;
  require_dtype(n, *v, v->dtype() == DType::Int32 || v->dtype() == DType::Int64, "expected int32 or int64");
  if (v->shape().rank_known() && !(v->shape().rank() == 0 || (v->shape().rank() == 1 && v->shape()[0] == Dim(1))))
    throw n.error(std::string(role) + " must be a scalar, got " + v->shape().str());
}

// --- DFT --------------------------------------------------------------------------------------------

struct DftSpec {
  bool inverse = false, onesided = false;
};

inline DftSpec dft_spec(const Node& n) {
  DftSpec s;
  s.inverse = n.attr_int("inverse", 0) != 0;
  s.onesided = n.attr_int("onesided", 0) != 0;
  if (s.inverse && s.onesided) throw n.error("onesided output with inverse is not supported");
  return s;
}

// The transformed axis of a signal of rank `rank` (the trailing 1|2 dim included): [0, rank - 2], or
// negative from the back in [-rank, -2].
inline std::int64_t dft_axis(const Node& n, std::int64_t axis, std::int64_t rank) {
  if (axis < -rank || axis > rank - 2 || axis == -1)
    throw n.error("axis " + std::to_string(axis) + " is out of range for a signal of rank " + std::to_string(rank) +
                  " (expected [-" + std::to_string(rank) + ", -2] or [0, " + std::to_string(rank - 2) + "])");
  return axis < 0 ? axis + rank : axis;
}

// The axis when known: the attribute (opset < 20) or the value of input 2 (opset 20, default -2).
inline std::optional<std::int64_t> dft_axis_value(const Node& n) {
  if (n.opset() < 20) return n.attr_int("axis", 1);
  if (!n.input(2)) return -2;
  return scalar_value(n, 2);
}

inline void infer_dft(Node& n) {
  const Value& x = required_input(n, 0);
  detail_math::check_input_type(n, 0, x.dtype(), detail_math::kFloatTypes);
  require_scalar_int(n, 1, "dft_length");
  if (n.opset() >= 20) require_scalar_int(n, 2, "axis");
  const DftSpec s = dft_spec(n);
  const Shape& xs = x.shape();
  if (!xs.rank_known()) return set_output(n, 0, x.dtype(), Shape::unknown());
  if (xs.rank() < 2) throw n.error("input must be [batch, ..., 1 or 2], got " + xs.str());
  const Dim& last = xs[xs.rank() - 1];
  if (last.is_static() && last.value != 1 && last.value != 2)
    throw n.error("input " + xs.str() + " must end in 1 (real) or 2 (complex)");
  if (s.onesided && last.is_static() && last.value == 2) throw n.error("onesided output needs a real input");
  std::vector<Dim> out = xs.dims();
  out.back() = Dim(2);
  const auto rank = static_cast<std::int64_t>(xs.rank());
  const std::optional<std::int64_t> axis = dft_axis_value(n);
  if (!axis) {
    // The axis is decided at run time: every dim it could change is unknown.
    if (n.input(1) || s.onesided)
      for (std::size_t i = 0; i + 1 < out.size(); ++i) out[i] = Dim();
    return set_output(n, 0, x.dtype(), Shape(out));
  }
  const auto a = static_cast<std::size_t>(dft_axis(n, *axis, rank));
  Dim length = xs[a];
  if (n.input(1)) {
    const std::optional<std::int64_t> len = scalar_value(n, 1);
    if (len && *len <= 0) throw n.error("dft_length must be positive, got " + std::to_string(*len));
    length = len ? Dim(*len) : Dim();
  }
  out[a] = s.onesided ? (length.is_static() ? Dim(length.value / 2 + 1) : Dim()) : length;
  set_output(n, 0, x.dtype(), Shape(out));
}

// --- STFT -------------------------------------------------------------------------------------------

inline void infer_stft(Node& n) {
  const Value& x = required_input(n, 0);
  required_input(n, 1);
  detail_math::check_input_type(n, 0, x.dtype(), detail_math::kFloatTypes);
  require_scalar_int(n, 1, "frame_step");
  require_scalar_int(n, 3, "frame_length");
  const Value* window = n.input(2);
  if (window) {
    detail_math::check_same_type(n, 0, x.dtype(), 2, window->dtype());
    detail_nn::require_rank(n, *window, 1);
  }
  if (!window && !n.input(3)) throw n.error("STFT needs a window or a frame_length");
  const bool onesided = n.attr_int("onesided", 1) != 0;
  const Shape& xs = x.shape();
  detail_nn::require_rank(n, x, 3);
  if (xs.rank_known() && xs[2].is_static() && xs[2].value != 1 && xs[2].value != 2)
    throw n.error("signal " + xs.str() + " must be [batch, length, 1 or 2]");
  if (onesided && xs.rank_known() && xs[2] == Dim(2)) throw n.error("onesided output needs a real signal");
  Dim frame = window && window->shape().rank_known() ? window->shape()[0] : Dim();
  if (n.input(3)) {
    const std::optional<std::int64_t> fl = scalar_value(n, 3);
    if (fl && *fl <= 0) throw n.error("frame_length must be positive, got " + std::to_string(*fl));
    if (fl) frame = detail_nn::unify(n, frame, Dim(*fl), "frame_length and the window's length");
  }
  const std::optional<std::int64_t> step = scalar_value(n, 1);
  if (step && *step <= 0) throw n.error("frame_step must be positive, got " + std::to_string(*step));
  Dim batch = xs.rank_known() ? xs[0] : Dim(), frames, bins;
  if (xs.rank_known() && xs[1].is_static() && frame.is_static() && step) {
    if (xs[1].value < frame.value)
      throw n.error("signal " + xs.str() + " is shorter than one frame of " + std::to_string(frame.value));
    frames = Dim((xs[1].value - frame.value) / *step + 1);
  }
  if (frame.is_static()) bins = Dim(onesided ? frame.value / 2 + 1 : frame.value);
  set_output(n, 0, x.dtype(), Shape{batch, frames, bins, 2});
}

// --- HannWindow, HammingWindow, BlackmanWindow, MelWeightMatrix -------------------------------------

inline DType output_datatype(const Node& n) {
  const DType t = detail_math::dtype_from_onnx_code(n, n.attr_int("output_datatype", 1));
  if (!is_floating(t) && !is_integer(t))
    throw n.error("output_datatype " + std::string(dtype_name(t)) + " is not a numeric type");
  return t;
}

inline void infer_window(Node& n) {
  required_input(n, 0);
  require_scalar_int(n, 0, "size");
  const std::optional<std::int64_t> size = scalar_value(n, 0);
  if (size && *size < 0) throw n.error("size must not be negative, got " + std::to_string(*size));
  set_output(n, 0, output_datatype(n), Shape{size ? Dim(*size) : Dim()});
}

inline void infer_mel_weight_matrix(Node& n) {
  for (std::size_t i = 0; i < 5; ++i) required_input(n, i);
  require_scalar_int(n, 0, "num_mel_bins");
  require_scalar_int(n, 1, "dft_length");
  require_scalar_int(n, 2, "sample_rate");
  for (std::size_t i : {3, 4}) detail_math::check_input_type(n, i, n.input(i)->dtype(), detail_math::kFloatTypes);
  const std::optional<std::int64_t> bins = scalar_value(n, 0), dft = scalar_value(n, 1);
  if (bins && *bins <= 0) throw n.error("num_mel_bins must be positive, got " + std::to_string(*bins));
  if (dft && *dft <= 0) throw n.error("dft_length must be positive, got " + std::to_string(*dft));
  set_output(n, 0, output_datatype(n), Shape{dft ? Dim(*dft / 2 + 1) : Dim(), bins ? Dim(*bins) : Dim()});
}

}  // namespace detail_signal

inline void register_signal_infer(InferTable& t) {
  t["DFT"] = detail_signal::infer_dft;
  t["STFT"] = detail_signal::infer_stft;
  for (const char* op : {"HannWindow", "HammingWindow", "BlackmanWindow"}) t[op] = detail_signal::infer_window;
  t["MelWeightMatrix"] = detail_signal::infer_mel_weight_matrix;
}

}  // namespace ondine::infer
