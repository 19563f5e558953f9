// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/rnn.hpp - LSTM, GRU and RNN (layout 0) on oneDNN's recurrent primitives:
// lstm_forward (with peepholes), gru_forward, lbr_gru_forward (linear_before_reset = 1, which is how
// PyTorch exports every GRU) and vanilla_rnn_forward, one layer each, forward, reverse or bidirectional.
//
// Weights are reordered once, at compile time, from ONNX's [D, G*H, I] with its gate order (LSTM i o f c,
// GRU z r h) into oneDNN's ldigo with its own (LSTM i f c o, GRU u r o: the same as ONNX's), and packed
// into the layout oneDNN picks; biases become Wb + Rb per gate (lbr GRU: Wb + Rb for u and r, Wbh, Rbh).
// Y [T, D, N, H] is oneDNN's dst_layer [T, N, D*H] read through strides (the same bytes when D = 1); the
// Transpose(0, 2, 1, 3) PyTorch puts after a bidirectional layer then reads it as it is (shape_ops.hpp).
// With two threads or more, a bidirectional layer is two one-direction primitives run side by side
// (ConcurrentStep, context.hpp), each writing its half of the same Y, Y_h and Y_c.
// oneDNN 2.6 has no clip, no input_forget, no sequence_lens, no activations other than the defaults
// (vanilla RNN: one of Tanh, Relu, Sigmoid for all directions) and no layout 1: such a node runs its
// reference kernel, and the compile log says why. A sequence_lens that is a constant of full lengths is
// no sequence_lens at all.
//
// Precision::Bf16 from batch 5 (below, on AVX-512, only the input projection before Ondine's fp32 recurrence
// kernel runs in bf16): oneDNN's bf16 primitive, X / states / Y / W / R in bfloat16, bias and cell state in
// float32; X and initial_h are converted by reorders before it, Y and Y_h after it (PyTorch's 2-layer
// bidirectional LSTM tagger, batch 16, seq 128, one thread, loaded machine: 100 ms fp32 -> 57 ms bf16).
//
// ondine.QLSTM (ir/infer/rnn.hpp) is oneDNN's int8 LSTM: X (and initial_h) quantized to u8 by a reorder
// before it, weights s8 packed once with their per-gate-row scales (the reorder computes oneDNN's
// zero-point compensation, which is why the packing starts from float), Y and Y_c written as f32, the
// last state as u8 and dequantized into Y_h. Without VNNI oneDNN adds u8 x s8 products in pairs in int16,
// which saturates past 7-bit weights: there a QLSTM whose weights exceed +-64 runs as an fp32 LSTM on its
// dequantized weights (without the state's rounding; the log says so).
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/infer/rnn.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"
#include "ondine/lower/detail/recurrence.hpp"
#include "ondine/lower/detail/quantized.hpp"
#include "ondine/lower/isa.hpp"

namespace ondine::lower::detail {

// Why oneDNN cannot run node `n` as it is, or "" when it can.
inline std::string rnn_unsupported(const Node& n, std::int64_t seq) {
  const std::string op = n.op_type() == "QLSTM" ? "LSTM" : n.op_type();
  if (n.attr_int("layout", 0) != 0) return "layout 1";
  if (n.has_attr("clip")) return "a clip";
  if (op == "LSTM" && n.attr_int("input_forget", 0) != 0) return "input_forget";
  if (n.has_attr("activation_alpha") || n.has_attr("activation_beta")) return "activation parameters";
  if (const Value* lens = n.input(4)) {
    if (!lens->is_constant()) return "a run-time sequence_lens";
    for (auto l : lens->constant().to_int64s())
      if (l != seq) return "sequence_lens shorter than the sequence";
  }
  if (n.has_attr("activations")) {
    std::vector<std::string> acts = n.attr_strings("activations");
    std::vector<std::string> want = op == "LSTM" ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
                                    : op == "GRU" ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                  : std::vector<std::string>{acts.empty() ? "Tanh" : acts[0]};
    for (std::size_t i = 0; i < acts.size(); ++i)
      if (acts[i] != want[i % want.size()]) return "activations other than oneDNN's";
    if (op == "RNN" && !acts.empty() && acts[0] != "Tanh" && acts[0] != "Relu" && acts[0] != "Sigmoid")
      return "activation " + acts[0];
  }
  return "";
}

inline bool lower_recurrent(Lowering& L, const Node& n) {
  const bool quantized = n.op_type() == "QLSTM";
  const std::string op = quantized ? "LSTM" : n.op_type();
  const Value *x = n.input(0), *w = n.input(1), *r = n.input(2), *b = n.input(3);
  const Value* h0 = n.num_inputs() > 5 ? n.input(5) : nullptr;
  const Value* c0 = op == "LSTM" && n.num_inputs() > 6 ? n.input(6) : nullptr;
  const Value* peep = op == "LSTM" && n.num_inputs() > 7 ? n.input(7) : nullptr;
  const Value *y = n.output(0), *y_h = n.num_outputs() > 1 ? n.output(1) : nullptr;
  const Value* y_c = op == "LSTM" && n.num_outputs() > 2 ? n.output(2) : nullptr;
  auto wanted = [](const Value* v) { return v && (v->has_uses() || v->is_graph_output()); };
  auto is_weight = [&](const Value* v) {
    return v && v->is_constant() && v->shape().is_static() && v->dtype() == (quantized ? DType::Int8 : DType::Float32);
  };
  if (!is_f32(x) || !is_weight(w) || !is_weight(r) || (b && (!b->is_constant() || !is_f32(b))) ||
      (peep && (!peep->is_constant() || !is_f32(peep))) || (h0 && !is_f32(h0)) || (c0 && !is_f32(c0)))
    return false;
  if (!x->shape().is_static() || x->shape().rank() != 3 || !w->shape().is_static() || w->shape().rank() != 3 ||
      !r->shape().is_static() || r->shape().rank() != 3)
    return false;
  const Dims xd = x->shape().sizes();
  const std::int64_t seq = xd[0], batch = xd[1], in_size = xd[2];
  const std::int64_t dirs = w->shape().sizes()[0], gates = infer::detail_rnn::gate_count(op);
  const std::int64_t hidden = r->shape().sizes()[2];
  if (std::string why = rnn_unsupported(n, seq); !why.empty()) {
    L.log(n.op_type() + " '" + n.name() + "': oneDNN has no " + why + "; it runs on its reference kernel");
    return false;
  }
  // The float weights (QLSTM: dequantized) and, for QLSTM, whether oneDNN's int8 LSTM computes it exactly.
  infer::detail_rnn::QLstmParams qp;
  bool int8 = false;
  Tensor w_f = w->constant(), r_f = r->constant();
  if (quantized) {
    qp = infer::detail_rnn::read_qlstm(n, hidden);
    w_f = infer::detail_rnn::dequantize_rows(w->constant(), qp.w_scale);
    r_f = infer::detail_rnn::dequantize_rows(r->constant(), qp.w_scale);
    int max_abs = 0;
    for (const Value* v : {w, r})
      for (std::int64_t e = 0; e < v->constant().numel(); ++e)
        max_abs = std::max(max_abs, std::abs(static_cast<int>(v->constant().data<std::int8_t>()[e])));
    int8 = effective_isa().int8_vnni || max_abs <= 64;
    if (!int8)
      L.log("QLSTM '" + n.name() + "': int8 weights up to " + std::to_string(max_abs) + " saturate without VNNI (" +
            effective_isa().name + "); it runs as an fp32 LSTM on its dequantized weights");
  }
  const bool lbr = op == "GRU" && n.attr_int("linear_before_reset", 0) != 0;
  using dir_t = dnnl::rnn_direction;
  const std::string direction = n.attr_string("direction", "forward");
  const dir_t dir = direction == "reverse"         ? dir_t::unidirectional_right2left
                    : direction == "bidirectional" ? dir_t::bidirectional_concat
                                                   : dir_t::unidirectional_left2right;

  // ONNX gate g of oneDNN gate k: LSTM oneDNN i f c o <- ONNX i o f c; GRU and RNN keep their order.
  auto onnx_gate = [&](std::int64_t k) -> std::int64_t {
    if (op != "LSTM") return k;
    static const std::int64_t lstm[4] = {0, 2, 3, 1};
    return lstm[k];
  };
  // ldigo [1, count, in, G, H] of directions [first, first + count) from ONNX [D, G*H, in].
  auto ldigo = [&](const Tensor& t, std::int64_t inner, std::int64_t first, std::int64_t count) {
    const float* src = t.data<float>();
    std::vector<float> out(static_cast<std::size_t>(count * inner * gates * hidden));
    for (std::int64_t d = 0; d < count; ++d)
      for (std::int64_t i = 0; i < inner; ++i)
        for (std::int64_t k = 0; k < gates; ++k)
          for (std::int64_t h = 0; h < hidden; ++h)
            out[static_cast<std::size_t>(((d * inner + i) * gates + k) * hidden + h)] =
                src[((first + d) * gates * hidden + onnx_gate(k) * hidden + h) * inner + i];
    return Tensor::from_vector<float>({1, count, inner, gates, hidden}, out);
  };
  const std::int64_t bias_gates = lbr ? gates + 1 : gates;
  auto bias_of = [&](std::int64_t first, std::int64_t count) {
    std::vector<float> bias(static_cast<std::size_t>(count * bias_gates * hidden), 0.0f);
    if (b) {
      for (std::int64_t d = 0; d < count; ++d)
        for (std::int64_t k = 0; k < bias_gates; ++k)
          for (std::int64_t h = 0; h < hidden; ++h) {
            const float* wb = b->constant().data<float>() + (first + d) * 2 * gates * hidden;
            const float* rb = wb + gates * hidden;
            float v;
            if (lbr && k == 2) v = wb[2 * hidden + h];        // o: Wbh (Rbh goes inside the reset)
            else if (lbr && k == 3) v = rb[2 * hidden + h];   // u': Rbh
            else v = wb[onnx_gate(k) * hidden + h] + rb[onnx_gate(k) * hidden + h];
            bias[static_cast<std::size_t>((d * bias_gates + k) * hidden + h)] = v;
          }
    }
    return Tensor::from_vector<float>({1, count, bias_gates, hidden}, bias);
  };
  // oneDNN's peepholes i f o from ONNX's P = [Pi, Po, Pf].
  auto peepholes_of = [&](std::int64_t first, std::int64_t count) {
    const float* src = peep->constant().data<float>();
    std::vector<float> p(static_cast<std::size_t>(count * 3 * hidden));
    static const std::int64_t from[3] = {0, 2, 1};
    for (std::int64_t d = 0; d < count; ++d)
      for (std::int64_t k = 0; k < 3; ++k)
        for (std::int64_t h = 0; h < hidden; ++h)
          p[static_cast<std::size_t>((d * 3 + k) * hidden + h)] = src[((first + d) * 3 + from[k]) * hidden + h];
    return Tensor::from_vector<float>({1, count, 3, hidden}, p);
  };

  // A bidirectional layer runs as two one-direction primitives side by side (ConcurrentStep), one thread
  // each, when the compile may use two threads; otherwise as oneDNN's one bidirectional primitive.
  const int threads = plan_thread_count(L.options) > 0 ? plan_thread_count(L.options) : omp_get_max_threads();
  // Ondine's recurrence kernels on AVX-512 and AVX2 (recurrence.hpp): an fp32 LSTM at small batch, and a GRU whose
  // input projection the graph computed (quantize-dynamic's form), which oneDNN would multiply by W again.
  const IsaInfo isa = effective_isa();
  const bool avx512 = isa.avx512, avx2 = isa_runs_on(CpuIsa::Avx2, isa.isa);
  const bool own_kernels = !quantized && !peep && seq >= 1 && batch >= 1 && recurrence::available(avx512, avx2);
  const std::int64_t max_small = recurrence::max_small_batch(avx512);
  const bool small_lstm = own_kernels && op == "LSTM" && batch <= max_small;
  const bool projected_gru = own_kernels && op == "GRU" && lbr &&
                             recurrence::is_column_selection(w->constant(), dirs, gates * hidden);
  // An fp32 GRU at small batch: its input projection on a oneDNN matmul, then the same GRU recurrence
  // (PyTorch's GRU tagger, 2 threads, loaded machine: batch 1 3.87 -> 3.75 ms, batch 4 10.2 -> 9.4 ms
  // against oneDNN's GRU; it compiles in half the time).
  const bool small_gru = own_kernels && op == "GRU" && lbr && !projected_gru && batch <= max_small;
  const bool small_batch = small_lstm || projected_gru || small_gru;
  using tag = memory::format_tag;
  const auto f32 = memory::data_type::f32;
  // Precision::Bf16 (not at small batch, where Ondine's fp32 recurrence reads R from cache): X, the hidden
  // states, Y and the weights in bfloat16; the bias and the cell state stay float32, and X, initial_h, Y and
  // Y_h are converted at the node's edges. Without a bf16 primitive it stays fp32 (the log says so).
  bool bf16 = !quantized && !small_batch && L.choose_bf16(n, true);
  // At small batch, Precision::Bf16 runs the input projection (a matmul over all steps) in bf16; the
  // recurrence, bounded by reading R, stays float32.
  const bool projection_bf16 = small_batch && !projected_gru && !quantized && L.choose_bf16(n, true);
  memory::data_type data_dt = f32, weight_dt = f32;  // X and the hidden state; W and R
  memory::desc src_layer, h_state_md, dst_layer;
  auto set_types = [&](bool half) {
    const auto bf = memory::data_type::bf16;
    data_dt = int8 ? memory::data_type::u8 : half ? bf : f32;
    weight_dt = int8 ? memory::data_type::s8 : half ? bf : f32;
    src_layer = plain_md({seq, batch, in_size}, data_dt);
    h_state_md = plain_md({1, dirs, batch, hidden}, data_dt);
    dst_layer = plain_md({seq, batch, dirs * hidden}, half ? bf : f32);
  };
  set_types(bf16);
  const auto prop = dnnl::prop_kind::forward_inference;
  dnnl::primitive_attr attr = Lowering::base_attr();
  // int8: u8 = round(v * data_scale + data_shift); s8 weight = round(w * weight_scale[g, o]), one scale per
  // gate row (mask over ldigo's g and o) for every direction and for both weights.
  const int weight_mask = (1 << 3) | (1 << 4);
  std::vector<float> weight_scales;
  if (int8) {
    for (std::int64_t k = 0; k < gates; ++k)
      for (std::int64_t h = 0; h < hidden; ++h)
        weight_scales.push_back(1.0f / qp.w_scale[static_cast<std::size_t>(onnx_gate(k) * hidden + h)]);
    attr.set_rnn_data_qparams(1.0f / qp.x_scale, static_cast<float>(qp.x_zero_point));
    attr.set_rnn_weights_qparams(weight_mask, weight_scales);
  }
  // int8 weights packed from the float ldigo by a reorder with the same scales (it also writes oneDNN's
  // compensation for the data zero point).
  auto weight_memory = [&](const Tensor& ldigo_f32, const memory::desc& want) {
    if (!int8) return L.constant_memory(ldigo_f32, want);
    memory src(plain_md(want.dims(), f32), L.engine(), const_cast<void*>(ldigo_f32.raw()));
    memory dst(want, L.engine());
    dnnl::primitive_attr reorder_attr;
    reorder_attr.set_rnn_weights_qparams(weight_mask, weight_scales);
    dnnl::stream stream(L.engine());
    dnnl::reorder(dnnl::reorder::primitive_desc(L.engine(), src.get_desc(), L.engine(), want, reorder_attr))
        .execute(stream, src, dst);
    stream.wait();
    L.constant_bytes += want.get_size();
    return dst;
  };
  const memory::desc state_md = plain_md({1, dirs, batch, hidden});

  // One primitive over directions [first, first + count): all of them (count = dirs), or one direction of
  // a bidirectional layer, whose states and output are that direction's part of the node's.
  struct Part {
    dnnl::primitive prim;
    std::string impl;
    memory::desc scratch, w_layer, w_iter, w_peephole, bias, src_iter, src_iter_c, dst_layer, dst_iter, dst_iter_c;
    std::int64_t first = 0, count = 0;
  };
  auto make_part = [&](dir_t pdir, std::int64_t first, std::int64_t count) -> std::optional<Part> {
    Part part;
    part.first = first;
    part.count = count;
    auto states = [&](bool present, const memory::desc& md) {
      if (!present) return memory::desc();
      return count == dirs ? md : md.submemory_desc({1, 1, batch, hidden}, {0, first, 0, 0});
    };
    part.src_iter = states(h0 != nullptr, h_state_md);
    part.src_iter_c = states(c0 != nullptr, state_md);
    part.dst_iter = states(wanted(y_h), h_state_md);
    part.dst_iter_c = states(wanted(y_c), state_md);
    part.dst_layer = count == dirs ? dst_layer : dst_layer.submemory_desc({seq, batch, hidden}, {0, 0, first * hidden});
    part.bias = plain_md({1, count, bias_gates, hidden});
    const memory::desc w_layer({1, count, in_size, gates, hidden}, weight_dt, tag::any);
    const memory::desc w_iter({1, count, hidden, gates, hidden}, weight_dt, tag::any);
    auto take = [&](const auto& pd, auto make) {
      if (!pd) return false;
      part.w_layer = pd.weights_layer_desc();
      part.w_iter = pd.weights_iter_desc();
      part.scratch = pd.scratchpad_desc();
      part.impl = pd.impl_info_str();
      part.prim = make(pd);
      return true;
    };
    bool made = false;
    if (op == "LSTM") {
      const memory::desc peep_md = peep ? plain_md({1, count, 3, hidden}) : memory::desc();
      dnnl::lstm_forward::primitive_desc pd(
          dnnl::lstm_forward::desc(prop, pdir, src_layer, part.src_iter, part.src_iter_c, w_layer, w_iter, peep_md,
                                   part.bias, part.dst_layer, part.dst_iter, part.dst_iter_c),
          attr, L.engine(), true);
      made = take(pd, [](const auto& p) -> dnnl::primitive { return dnnl::lstm_forward(p); });
      if (made && peep) part.w_peephole = pd.weights_peephole_desc();
    } else if (op == "GRU" && lbr) {
      dnnl::lbr_gru_forward::primitive_desc pd(
          dnnl::lbr_gru_forward::desc(prop, pdir, src_layer, part.src_iter, w_layer, w_iter, part.bias, part.dst_layer,
                                      part.dst_iter),
          attr, L.engine(), true);
      made = take(pd, [](const auto& p) -> dnnl::primitive { return dnnl::lbr_gru_forward(p); });
    } else if (op == "GRU") {
      dnnl::gru_forward::primitive_desc pd(
          dnnl::gru_forward::desc(prop, pdir, src_layer, part.src_iter, w_layer, w_iter, part.bias, part.dst_layer,
                                  part.dst_iter),
          attr, L.engine(), true);
      made = take(pd, [](const auto& p) -> dnnl::primitive { return dnnl::gru_forward(p); });
    } else {
      std::string act = n.has_attr("activations") ? n.attr_strings("activations")[0] : "Tanh";
      auto alg = act == "Relu" ? dnnl::algorithm::eltwise_relu
                 : act == "Sigmoid" ? dnnl::algorithm::eltwise_logistic : dnnl::algorithm::eltwise_tanh;
      dnnl::vanilla_rnn_forward::primitive_desc pd(
          dnnl::vanilla_rnn_forward::desc(prop, alg, pdir, src_layer, part.src_iter, w_layer, w_iter, part.bias,
                                          part.dst_layer, part.dst_iter),
          attr, L.engine(), true);
      made = take(pd, [](const auto& p) -> dnnl::primitive { return dnnl::vanilla_rnn_forward(p); });
    }
    if (!made) return std::nullopt;
    return part;
  };

  std::vector<Part> parts;
  auto make_parts = [&] {
    std::vector<Part> made;
    // Not in bf16: oneDNN 2.6's bf16 one-direction primitives write their strided half of Y wrongly (a
    // bidirectional GRU of H 64 at batch 16: errors over 100%; PyTorch's GRU tagger: a corrupted heap). Its
    // one bidirectional primitive is right and uses both threads itself.
    if (!small_batch && dirs == 2 && threads >= 2 && !bf16) {
      auto forward = make_part(dir_t::unidirectional_left2right, 0, 1);
      auto backward = make_part(dir_t::unidirectional_right2left, 1, 1);
      if (forward && backward) made = {*forward, *backward};
    }
    if (made.empty() && !small_batch)
      if (auto whole = make_part(dir, 0, dirs)) made = {*whole};
    return made;
  };
  parts = make_parts();
  if (parts.empty() && bf16) {
    L.log(op + " '" + n.name() + "': oneDNN has no bf16 primitive for it; it runs in fp32");
    L.record_fp32_fallback(n);
    bf16 = false;
    set_types(false);
    parts = make_parts();
  }
  if (parts.empty() && !small_batch) {
    L.log(op + " '" + n.name() + "': oneDNN has no primitive for it; it runs on its reference kernel");
    return false;
  }

  // Slots: the inputs' row-major bytes; Y (oneDNN's [T, N, D*H] is Y [T, D, N, H] read through strides),
  // Y_h and Y_c written by every part.
  const auto bf16_dt = memory::data_type::bf16;
  SlotId x_slot = bf16 || projection_bf16 ? L.slot_in(x, plain_md(xd, bf16_dt)) : L.row_major_slot(x);
  SlotId h0_slot = !h0 ? SlotId{} : bf16 ? L.slot_in(h0, plain_md(h0->shape().sizes(), bf16_dt)) : L.row_major_slot(h0);
  const SlotId c0_slot = c0 ? L.row_major_slot(c0) : SlotId{};
  // An arena slot of `dtype` for `what` ([dims]): int8's u8 X, initial_h and Y_h (quantized by a reorder),
  // bf16's Y and Y_h (converted to float32 after the primitive).
  auto edge_slot = [&](const Value* like, const std::string& what, const Dims& dims, DType dtype) {
    runtime::Slot slot = Lowering::slot_for(like, SlotKind::Arena, 0);
    slot.name = n.name() + "." + what;
    slot.dims = dims;
    slot.bytes = static_cast<std::size_t>(md_numel(plain_md(dims))) * dtype_size(dtype);
    slot.layout = plain_layout_name(dims.size());
    slot.dtype = dtype;
    return L.add_slot(std::move(slot));
  };
  auto u8_slot = [&](const Value* like, const std::string& what, const Dims& dims) {
    return edge_slot(like, what, dims, DType::UInt8);
  };
  char qtext[64];
  std::snprintf(qtext, sizeof qtext, "scale %g zp %d", qp.x_scale, qp.x_zero_point);
  // f32 <-> u8 with x_scale and x_zero_point: one reorder.
  auto convert = [&](bool quantize, SlotId from, SlotId to, const Dims& dims, const std::string& what) {
    const memory::desc f_md = plain_md(dims), q_md = plain_md(dims, memory::data_type::u8);
    dnnl::primitive_attr a = Lowering::base_attr();
    a.set_output_scales(0, {quantize ? 1.0f / qp.x_scale : qp.x_scale});
    const int zp_arg = quantize ? DNNL_ARG_DST : DNNL_ARG_SRC;
    a.set_zero_points(zp_arg, 0, {DNNL_RUNTIME_S32_VAL});
    const memory::desc& src_md = quantize ? f_md : q_md;
    const memory::desc& dst_md = quantize ? q_md : f_md;
    dnnl::reorder::primitive_desc pd(L.engine(), src_md, L.engine(), dst_md, a);
    L.add_primitive({n.name(), n.op_type(), pd.impl_info_str(), what + " " + qtext}, &n, dnnl::reorder(pd),
                    pd.scratchpad_desc(), {{DNNL_ARG_SRC, from, src_md}, {DNNL_ARG_DST, to, dst_md}},
                    {{DNNL_ARG_ATTR_ZERO_POINTS | zp_arg, quant::zero_point_memory(L, qp.x_zero_point)}});
  };
  if (int8) {
    const SlotId xq = u8_slot(x, "x_u8", {seq, batch, in_size});
    convert(true, x_slot, xq, {seq, batch, in_size}, "X to u8");
    x_slot = xq;
    if (h0) {
      const SlotId hq = u8_slot(h0, "h0_u8", {1, dirs, batch, hidden});
      convert(true, h0_slot, hq, {1, dirs, batch, hidden}, "initial_h to u8");
      h0_slot = hq;
    }
  }
  SlotId layer_slot;
  if (dirs == 1 && wanted(y)) {
    layer_slot = L.new_value_slot(y, plain_md(y->shape().sizes()));
    L.define(y, layer_slot, plain_md(y->shape().sizes()));
  } else {
    runtime::Slot slot = Lowering::slot_for(y ? y : x, SlotKind::Arena, 0);
    slot.name = n.name() + ".dst_layer";
    slot.dims = {seq, batch, dirs * hidden};
    slot.bytes = static_cast<std::size_t>(seq * batch * dirs * hidden) * sizeof(float);
    slot.layout = "abc";
    slot.dtype = DType::Float32;
    layer_slot = L.add_slot(std::move(slot));
    if (wanted(y))
      L.define(y, layer_slot,
               memory::desc({seq, dirs, batch, hidden}, f32, Dims{batch * dirs * hidden, hidden, dirs * hidden, 1}));
  }
  SlotId y_h_slot{}, y_c_slot{}, y_h_float_slot{};
  if (wanted(y_h)) {
    y_h_float_slot = L.new_value_slot(y_h, state_md);
    L.define(y_h, y_h_float_slot, plain_md(y_h->shape().sizes()));
    y_h_slot = int8   ? u8_slot(y_h, "y_h_u8", {1, dirs, batch, hidden})
               : bf16 ? edge_slot(y_h, "y_h_bf16", {1, dirs, batch, hidden}, DType::BFloat16)
                      : y_h_float_slot;
  }
  if (wanted(y_c)) {
    y_c_slot = L.new_value_slot(y_c, state_md);
    L.define(y_c, y_c_slot, plain_md(y_c->shape().sizes()));
  }

  // bf16: the primitive writes Y into a bf16 slot, converted into Y's float32 one after it.
  const SlotId layer_f32_slot = layer_slot;
  if (bf16) layer_slot = edge_slot(y ? y : x, "dst_layer_bf16", {seq, batch, dirs * hidden}, DType::BFloat16);

  if (small_batch) {
    recurrence::RecurrenceStep::Slots slots{};
    slots.y = layer_slot;
    if (h0) slots.h0 = h0_slot, slots.has_h0 = true;
    if (c0) slots.c0 = c0_slot, slots.has_c0 = true;
    if (wanted(y_h)) slots.y_h = y_h_float_slot, slots.has_y_h = true;
    if (wanted(y_c)) slots.y_c = y_c_slot, slots.has_y_c = true;
    recurrence::RnnShape shape{seq, batch, dirs, in_size, hidden,
                               op == "GRU" ? recurrence::Cell::Gru : recurrence::Cell::Lstm,
                               avx512 ? recurrence::kLanes : recurrence::kLanes8};
    const bool reverse = direction == "reverse";
    if (projected_gru) recurrence::lower_projected_gru(L, n, shape, reverse, x_slot, slots);
    else if (small_gru) recurrence::lower_small_gru(L, n, shape, reverse, x_slot, slots, projection_bf16);
    else recurrence::lower_lstm(L, n, shape, reverse, x_slot, slots, projection_bf16);
    return true;
  }
  const std::string detail = std::string(int8        ? " int8 (u8 data, s8 weights)"
                                         : quantized ? " fp32 (dequantized weights)"
                                         : bf16      ? " bf16 (bf16 data and weights, f32 cell state)"
                                                     : "") +
                             " T" + std::to_string(seq) + " N" + std::to_string(batch) + " I" + std::to_string(in_size) +
                             " H" + std::to_string(hidden) + (lbr ? " lbr" : "") + (peep ? " +peepholes" : "");
  std::vector<std::unique_ptr<PrimitiveStep>> steps;
  std::size_t scratch_offset = 0;
  for (const Part& part : parts) {
    std::vector<SlotArg> args{{DNNL_ARG_SRC_LAYER, x_slot, src_layer}};
    std::vector<std::pair<int, memory>> consts{
        {DNNL_ARG_WEIGHTS_LAYER, weight_memory(ldigo(w_f, in_size, part.first, part.count), part.w_layer)},
        {DNNL_ARG_WEIGHTS_ITER, weight_memory(ldigo(r_f, hidden, part.first, part.count), part.w_iter)},
        {DNNL_ARG_BIAS, L.constant_memory(bias_of(part.first, part.count), part.bias)}};
    if (peep)
      consts.emplace_back(DNNL_ARG_WEIGHTS_PEEPHOLE, L.constant_memory(peepholes_of(part.first, part.count), part.w_peephole));
    if (h0) args.push_back({DNNL_ARG_SRC_ITER, h0_slot, part.src_iter});
    if (c0) args.push_back({DNNL_ARG_SRC_ITER_C, c0_slot, part.src_iter_c});
    args.push_back({DNNL_ARG_DST_LAYER, layer_slot, part.dst_layer});
    if (wanted(y_h)) args.push_back({DNNL_ARG_DST_ITER, y_h_slot, part.dst_iter});
    if (wanted(y_c)) args.push_back({DNNL_ARG_DST_ITER_C, y_c_slot, part.dst_iter_c});
    const std::string which = parts.size() == 1 ? direction : part.first == 0 ? "forward half" : "reverse half";
    steps.push_back(std::make_unique<PrimitiveStep>(
        runtime::StepInfo{n.name(), n.op_type(), part.impl, which + detail + " wei " + layout_name(part.w_layer)}, &n, L.engine(),
        part.prim, std::move(args), std::move(consts), part.scratch, std::vector<SlotId>{}, scratch_offset));
    scratch_offset += (part.scratch.get_size() + 63) / 64 * 64;
  }
  L.scratchpad_bytes = std::max(L.scratchpad_bytes, scratch_offset);
  if (steps.size() == 1) {
    L.add_step(std::move(steps.front()));
  } else {
    L.add_step(std::make_unique<ConcurrentStep>(
        runtime::StepInfo{n.name(), n.op_type(), parts.front().impl,
                          direction + ", its two directions side by side" + detail + " wei " +
                              layout_name(parts.front().w_layer)},
        std::move(steps)));
  }
  if (int8 && wanted(y_h)) convert(false, y_h_slot, y_h_float_slot, {1, dirs, batch, hidden}, "Y_h from u8");
  if (bf16 && wanted(y))
    L.add_reorder(n.name() + ".Y", layer_slot, dst_layer, layer_f32_slot, plain_md({seq, batch, dirs * hidden}));
  if (bf16 && wanted(y_h))
    L.add_reorder(n.name() + ".Y_h", y_h_slot, h_state_md, y_h_float_slot, state_md);
  return true;
}

}  // namespace ondine::lower::detail
