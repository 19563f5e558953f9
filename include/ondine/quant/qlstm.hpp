// SPDX-License-Identifier: Apache-2.0
// ondine/quant/qlstm.hpp - static int8 for LSTM layers: the quantize pass (quant/qdq.hpp) replaces a
// calibrated LSTM by ondine.QLSTM (definition: ir/infer/rnn.hpp), which lowers onto oneDNN's int8 LSTM.
//
// Why not QDQ: oneDNN's int8 LSTM quantizes the hidden state it carries from step to step, with the one
// uint8 quantization it also applies to X. QuantizeLinear/DequantizeLinear around an LSTM cannot say
// that (the state never leaves the node), so a QDQ graph would promise numbers the kernel does not
// compute. ondine.QLSTM states it exactly, and its reference kernel computes it.
//
// What the rewrite chooses:
//   x_scale, x_zero_point  uint8 asymmetric over the union of the calibrated ranges of X, initial_h (its
//                          values when constant), Y and Y_h: every value the quantization meets. The
//                          state lives in (-1, 1), so a layer whose X spans a wider range pays in the
//                          state's resolution (the error bound of quant/fallback.hpp can keep it fp32).
//   w_scale[k]             per gate row k (of 4H), symmetric int8 over row k of W and of R in every
//                          direction: oneDNN takes one scale per gate row for both weights.
// Kept as LSTM (the reason goes into the report): layout 1, peepholes, clip, input_forget, activations
// other than the defaults, a sequence_lens input, W or R or B not a float32 constant, X not float32, a
// value without calibration.
// Names: the QLSTM keeps the LSTM's name and its outputs' names; W and R become "<W>_quantized".
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/ir/graph.hpp"
#include "ondine/passes/rewrite.hpp"
#include "ondine/quant/calibration.hpp"
#include "ondine/quant/observers.hpp"

namespace ondine::quant::detail::qlstm {

// Why the LSTM `n` cannot become a QLSTM (calibration aside), or nullopt.
inline std::optional<std::string> blocker(const Node& n) {
  auto constant_f32 = [&](std::size_t i) {
    const Value* v = n.input(i);
    return v && v->is_constant() && v->constant().dtype() == DType::Float32;
  };
  if (n.attr_int("layout", 0) != 0) return std::string("layout 1");
  if (n.num_inputs() > 7 && n.input(7)) return std::string("peepholes (oneDNN's int8 LSTM has none)");
  if (n.has_attr("clip")) return std::string("a clip");
  if (n.attr_int("input_forget", 0) != 0) return std::string("input_forget");
  if (n.has_attr("activation_alpha") || n.has_attr("activation_beta")) return std::string("activation parameters");
  if (n.has_attr("activations")) {
    const std::vector<std::string> acts = n.attr_strings("activations");
    static const char* defaults[3] = {"Sigmoid", "Tanh", "Tanh"};
    for (std::size_t i = 0; i < acts.size(); ++i)
      if (acts[i] != defaults[i % 3]) return std::string("activations other than the defaults");
  }
  if (n.num_inputs() > 4 && n.input(4)) return std::string("a sequence_lens input");
  if (!n.input(0) || n.input(0)->dtype() != DType::Float32) return std::string("X is not float32");
  if (!constant_f32(1) || !constant_f32(2)) return std::string("W or R is not a float32 constant");
  if (n.input(3) && !constant_f32(3)) return std::string("B is not a float32 constant");
  if (n.num_inputs() > 5 && n.input(5) && n.input(5)->dtype() != DType::Float32)
    return std::string("initial_h is not float32");
  return std::nullopt;
}

// The values whose ranges the data quantization must cover: X, initial_h, Y, Y_h.
inline std::vector<const Value*> data_values(const Node& n) {
  std::vector<const Value*> out{n.input(0)};
  if (n.num_inputs() > 5 && n.input(5)) out.push_back(n.input(5));
  for (std::size_t i = 0; i < 2 && i < n.num_outputs(); ++i)
    if (n.output(i)) out.push_back(n.output(i));
  return out;
}

// Why the calibration cannot give the data quantization of `n`, or "".
inline std::string missing_calibration(const Node& n, const CalibrationResult& calib) {
  bool any_output = false;
  for (const Value* v : data_values(n)) {
    const bool is_output = v->producer() == &n;
    if (v->is_constant() && !is_output) continue;
    if (!calib.contains(v->name())) {
      if (is_output) continue;
      return "no calibration for '" + v->name() + "'";
    }
    any_output |= is_output;
  }
  return any_output ? "" : "no calibration for its outputs Y or Y_h";
}

// uint8 asymmetric params over every data value's range (a constant initial_h: its values).
inline QuantParams data_params(const Node& n, const CalibrationResult& calib) {
  float lo = 0.0f, hi = 0.0f;
  for (const Value* v : data_values(n)) {
    if (v->is_constant() && v->producer() != &n) {
      const Tensor& t = v->constant();
      for (std::int64_t e = 0; e < t.numel(); ++e) {
        lo = std::min(lo, static_cast<float>(t.at_double(static_cast<std::size_t>(e))));
        hi = std::max(hi, static_cast<float>(t.at_double(static_cast<std::size_t>(e))));
      }
    } else if (calib.contains(v->name())) {
      const Range& r = calib.at(v->name()).range;
      lo = std::min(lo, *std::min_element(r.min.begin(), r.min.end()));
      hi = std::max(hi, *std::max_element(r.max.begin(), r.max.end()));
    }
  }
  return compute_params(lo, hi, QuantScheme{DType::UInt8, /*symmetric=*/false, /*reduce_range=*/false});
}

// Per gate row scales over W and R (all directions), and the int8 tensors.
struct Weights {
  std::vector<float> scale;  // [4H]
  Tensor w, r;               // int8, W's and R's shapes
};
inline Weights quantize_weights(const Tensor& w, const Tensor& r, bool reduce_range) {
  const std::int64_t rows = w.dims()[1];
  const float qmax = reduce_range ? 64.0f : 127.0f;
  std::vector<float> absmax(static_cast<std::size_t>(rows), 0.0f);
  for (const Tensor* t : {&w, &r}) {
    const std::int64_t cols = t->dims()[2];
    const float* p = t->data<float>();
    for (std::int64_t e = 0; e < t->numel(); ++e) {
      auto k = static_cast<std::size_t>((e / cols) % rows);
      absmax[k] = std::max(absmax[k], std::fabs(p[e]));
    }
  }
  Weights out;
  out.scale.resize(absmax.size());
  for (std::size_t k = 0; k < absmax.size(); ++k)
    out.scale[k] = absmax[k] > 0.0f && std::isfinite(absmax[k]) ? absmax[k] / qmax : 1.0f;
  auto quantize_one = [&](const Tensor& t) {
    Tensor q(DType::Int8, t.dims());
    const std::int64_t cols = t.dims()[2];
    const float* p = t.data<float>();
    for (std::int64_t e = 0; e < t.numel(); ++e) {
      float s = out.scale[static_cast<std::size_t>((e / cols) % rows)];
      float v = std::clamp(round_half_even(p[e] / s), -qmax, qmax);
      q.data<std::int8_t>()[e] = static_cast<std::int8_t>(v);
    }
    return q;
  };
  out.w = quantize_one(w);
  out.r = quantize_one(r);
  return out;
}

// Replaces the LSTM `n` by an ondine.QLSTM with the same name, inputs (W, R int8) and output names;
// returns it. `n` is removed.
inline Node* replace(Graph& g, Node* n, const CalibrationResult& calib, bool reduce_range) {
  const QuantParams data = data_params(*n, calib);
  Weights q = quantize_weights(n->input(1)->constant(), n->input(2)->constant(), reduce_range);
  Value* w = g.add_constant(g.unique_name(n->input(1)->name() + "_quantized"), std::move(q.w));
  Value* r = g.add_constant(g.unique_name(n->input(2)->name() + "_quantized"), std::move(q.r));
  std::vector<Value*> inputs{n->input(0), w, r};
  for (std::size_t i = 3; i < 7; ++i) inputs.push_back(i < n->num_inputs() ? n->input(i) : nullptr);
  while (!inputs.empty() && !inputs.back()) inputs.pop_back();
  std::map<std::string, Attribute> attrs;
  for (const char* a : {"direction", "hidden_size"})
    if (n->has_attr(a)) attrs[a] = n->attrs().at(a);
  attrs["x_scale"] = data.scale[0];
  attrs["x_zero_point"] = static_cast<std::int64_t>(data.zero_point[0]);
  attrs["w_scale"] = q.scale;
  // The new node takes over the output names; the LSTM's outputs are renamed out of the way first.
  std::vector<Value*> old_outputs(n->outputs().begin(), n->outputs().end());
  std::vector<std::string> names;
  for (Value* v : old_outputs) {
    if (!v) {
      names.emplace_back();
      continue;
    }
    std::string name = v->name();
    if (v->is_graph_output()) {
      names.push_back(g.unique_name(name + ".int8"));
    } else {
      g.rename_value(v, g.unique_name(name + ".fp32"));
      names.push_back(name);
    }
  }
  const std::string name = n->name();
  Node* qn = g.add_node("QLSTM", inputs, names, std::move(attrs), name, fused::kDomain);
  qn->set_opset(fused::kDomainVersion);
  for (std::size_t i = 0; i < old_outputs.size(); ++i) {
    if (!old_outputs[i]) continue;
    Value* out = qn->output(i);
    out->set_dtype(DType::Float32);
    out->set_shape(old_outputs[i]->shape());
    rewrite::replace_value(g, old_outputs[i], out);
  }
  g.remove_node(n);
  return qn;
}

}  // namespace ondine::quant::detail::qlstm
