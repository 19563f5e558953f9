// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/rnn.hpp - shape and type inference for the recurrent ops RNN, GRU and LSTM.
//
// Inputs X [T, N, I] (layout 0) or [N, T, I] (layout 1), W [D, G*H, I], R [D, G*H, H], B [D, 2*G*H],
// sequence_lens [N], initial_h (and initial_c) [D, N, H] or [N, D, H], LSTM's P [D, 3H]; D = 2 for
// "bidirectional" else 1, G the gate count (RNN 1, GRU 3, LSTM 4). Outputs Y [T, D, N, H] or
// [N, T, D, H], Y_h (and Y_c) [D, N, H] or [N, D, H]. hidden_size is the attribute, else R's last dim.
// Every operand's dims are checked against these (the error names the operand and both sizes).
//
// ondine.QLSTM (X, W, R, B?, sequence_lens?, initial_h?, initial_c?): Ondine's int8 LSTM, written by the
// quantize pass (quant/qdq.hpp) for oneDNN's int8 LSTM. LSTM's inputs without P, W and R int8, and LSTM's
// attributes (default activations, no clip or input_forget), plus
//   x_scale, x_zero_point   one uint8 quantization q(v) = saturate(round_half_even(v / x_scale) + x_zero_point)
//                           shared by X and the hidden state (oneDNN's int8 LSTM has one for both)
//   w_scale                 [4H] floats in ONNX's gate order (i o f c): row k of W and of R, in every
//                           direction, is W[d, k, :] * w_scale[k] (weight zero points are 0)
// Meaning: LSTM's recurrence with W, R dequantized as above, every X[t] replaced by dq(q(X[t])) and the
// state H entering each step (initial_h too) by dq(q(H)), where dq(u) = (u - x_zero_point) * x_scale; C
// stays float. Outputs: Y holds dq(q(H)) of each step (the state as the next step reads it; oneDNN writes
// that), Y_h the same of the last step, Y_c the float C. All outputs float32.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "ondine/ir/infer/common.hpp"
#include "ondine/ir/infer/nn.hpp"

namespace ondine::infer {
namespace detail_rnn {

// ondine.QLSTM's quantization attributes, checked.
struct QLstmParams {
  float x_scale = 1.0f;
  std::int32_t x_zero_point = 0;
  std::vector<float> w_scale;  // 4H, ONNX gate order
};
inline QLstmParams read_qlstm(const Node& n, std::int64_t hidden) {
  QLstmParams p;
  p.x_scale = n.attr_float("x_scale", 0.0f);
  if (!(p.x_scale > 0.0f) || !std::isfinite(p.x_scale)) throw n.error("x_scale must be positive and finite");
  std::int64_t zp = n.attr_int("x_zero_point", 0);
  if (zp < 0 || zp > 255) throw n.error("x_zero_point " + std::to_string(zp) + " is outside [0, 255]");
  p.x_zero_point = static_cast<std::int32_t>(zp);
  p.w_scale = n.attr_floats("w_scale", {});
  if (hidden > 0 && static_cast<std::int64_t>(p.w_scale.size()) != 4 * hidden)
    throw n.error("w_scale has " + std::to_string(p.w_scale.size()) + " entries, expected 4 * hidden_size = " +
                  std::to_string(4 * hidden));
  for (float s : p.w_scale)
    if (!(s > 0.0f) || !std::isfinite(s)) throw n.error("w_scale entries must be positive and finite");
  return p;
}

// The float [D, G*H, K] of ondine.QLSTM's int8 W or R: row k times w_scale[k].
inline Tensor dequantize_rows(const Tensor& q, const std::vector<float>& w_scale) {
  Tensor f(DType::Float32, q.dims());
  const std::int64_t cols = q.dims()[2], rows = static_cast<std::int64_t>(w_scale.size());
  for (std::int64_t e = 0; e < q.numel(); ++e)
    f.data<float>()[e] = static_cast<float>(q.data<std::int8_t>()[e]) * w_scale[static_cast<std::size_t>((e / cols) % rows)];
  return f;
}

inline std::int64_t gate_count(const std::string& op) { return op == "LSTM" || op == "QLSTM" ? 4 : op == "GRU" ? 3 : 1; }

inline std::int64_t direction_count(const Node& n) {
  std::string d = n.attr_string("direction", "forward");
  if (d == "forward" || d == "reverse") return 1;
  if (d == "bidirectional") return 2;
  throw n.error("direction must be \"forward\", \"reverse\" or \"bidirectional\", not \"" + d + "\"");
}

inline void infer_rnn(Node& n) {
  const bool quantized = n.op_type() == "QLSTM";
  const std::string op = quantized ? "LSTM" : n.op_type();
  Value& x = required_input(n, 0);
  Value& w = required_input(n, 1);
  Value& r = required_input(n, 2);
  detail_nn::require_floating(n, x);
  if (quantized) {
    for (const Value* v : {&w, &r})
      if (v->dtype() != DType::Int8 && v->dtype() != DType::Undefined)
        throw n.error("'" + v->name() + "' is " + std::string(dtype_name(v->dtype())) + ", expected int8");
    if (n.num_inputs() > 7 && n.input(7)) throw n.error("QLSTM has no peepholes (input P)");
  } else {
    detail_nn::require_same_dtype(n, x, w);
    detail_nn::require_same_dtype(n, x, r);
  }
  const std::int64_t dirs = direction_count(n), gates = gate_count(op);
  const std::int64_t layout = n.attr_int("layout", 0);
  if (layout != 0 && layout != 1) throw n.error("layout must be 0 or 1, got " + std::to_string(layout));
  if (n.has_attr("activations")) {
    auto acts = n.attr_strings("activations");
    std::size_t per_dir = op == "LSTM" ? 3 : op == "GRU" ? 2 : 1;
    if (acts.size() != per_dir * static_cast<std::size_t>(dirs))
      throw n.error("'activations' has " + std::to_string(acts.size()) + " entries, expected " +
                    std::to_string(per_dir * static_cast<std::size_t>(dirs)) + " (" + std::to_string(per_dir) +
                    " per direction)");
  }
  for (Value* v : {&x, &w, &r})
    if (v->shape().rank_known() && v->shape().rank() != 3)
      throw n.error("'" + v->name() + "' has shape " + v->shape().str() + ", expected rank 3");
  Dim seq, batch, hidden;
  if (x.shape().rank_known()) {
    seq = x.shape()[layout == 0 ? 0 : 1];
    batch = x.shape()[layout == 0 ? 1 : 0];
  }
  if (n.has_attr("hidden_size")) hidden = Dim(n.attr_int("hidden_size"));
  else if (r.shape().rank_known()) hidden = r.shape()[2];
  auto expect = [&](const Value* v, const std::vector<Dim>& dims, const char* role) {
    if (!v || !v->shape().rank_known()) return;
    const Shape& s = v->shape();
    std::string what = std::string(role) + " '" + v->name() + "' has shape " + s.str() + ", expected " + Shape(dims).str();
    if (s.rank() != dims.size()) throw n.error(what);
    for (std::size_t i = 0; i < dims.size(); ++i) detail_nn::unify(n, s[i], dims[i], what);
  };
  auto times = [](std::int64_t k, const Dim& d) { return d.is_static() ? Dim(k * d.value) : Dim(); };
  Dim input_size = x.shape().rank_known() ? x.shape()[2] : Dim();
  expect(&w, {Dim(dirs), times(gates, hidden), input_size}, "W");
  expect(&r, {Dim(dirs), times(gates, hidden), hidden}, "R");
  if (const Value* b = n.input(3)) {
    detail_nn::require_same_dtype(n, x, *b);
    expect(b, {Dim(dirs), times(2 * gates, hidden)}, "B");
  }
  if (const Value* lens = n.input(4)) {
    if (lens->dtype() != DType::Int32 && lens->dtype() != DType::Int64)
      throw n.error("sequence_lens '" + lens->name() + "' is " + std::string(dtype_name(lens->dtype())) +
                    ", expected int32");
    expect(lens, {batch}, "sequence_lens");
  }
  std::vector<Dim> state = layout == 0 ? std::vector<Dim>{Dim(dirs), batch, hidden} : std::vector<Dim>{batch, Dim(dirs), hidden};
  if (const Value* h0 = n.input(5)) {
    detail_nn::require_same_dtype(n, x, *h0);
    expect(h0, state, "initial_h");
  }
  if (op == "LSTM") {
    if (const Value* c0 = n.input(6)) {
      detail_nn::require_same_dtype(n, x, *c0);
      expect(c0, state, "initial_c");
    }
    if (const Value* p = n.input(7)) {
      detail_nn::require_same_dtype(n, x, *p);
      expect(p, {Dim(dirs), times(3, hidden)}, "P");
    }
  }
  if (quantized) read_qlstm(n, hidden.is_static() ? hidden.value : 0);
  std::vector<Dim> y = layout == 0 ? std::vector<Dim>{seq, Dim(dirs), batch, hidden}
                                   : std::vector<Dim>{batch, seq, Dim(dirs), hidden};
  if (n.num_outputs() > 0 && n.output(0)) set_output(n, 0, x.dtype(), Shape(y));
  if (n.num_outputs() > 1 && n.output(1)) set_output(n, 1, x.dtype(), Shape(state));
  if (op == "LSTM" && n.num_outputs() > 2 && n.output(2)) set_output(n, 2, x.dtype(), Shape(state));
}

}  // namespace detail_rnn

inline void register_rnn_infer(InferTable& table) {
  for (const char* op : {"RNN", "GRU", "LSTM"}) table[op] = detail_rnn::infer_rnn;
  table["ondine.QLSTM"] = detail_rnn::infer_rnn;
}

}  // namespace ondine::infer
