// SPDX-License-Identifier: Apache-2.0
// ondine/reference/rnn.hpp - reference kernels for RNN, GRU and LSTM (ONNX opsets 7-14 semantics, both
// layouts), in double.
//
// Per direction d and time step t (reverse: t runs backwards over each sequence's own length):
//   RNN   H = f(X W^T + H R^T + Wb + Rb)
//   GRU   z = f(X Wz^T + H Rz^T + Wbz + Rbz)   r = f(X Wr^T + H Rr^T + Wbr + Rbr)
//         h = g(X Wh^T + (r . H) Rh^T + Rbh + Wbh)         linear_before_reset = 0
//         h = g(X Wh^T + r . (H Rh^T + Rbh) + Wbh)         linear_before_reset = 1 (PyTorch's GRU)
//         H = (1 - z) . h + z . H
//   LSTM  i = f(X Wi^T + H Ri^T + Pi . C + Wbi + Rbi)       (input_forget: i = 1 - f)
//         f = f(X Wf^T + H Rf^T + Pf . C + Wbf + Rbf)
//         c = g(X Wc^T + H Rc^T + Wbc + Rbc)               C = f . C + i . c
//         o = f(X Wo^T + H Ro^T + Po . C + Wbo + Rbo)       H = o . h(C)
// Gate blocks in W, R, B as ONNX orders them: GRU z r h, LSTM i o f c. `clip` bounds every gate's
// pre-activation to [-clip, clip]. Activations (attribute "activations", per direction) are any of
// the ONNX list; each one that has an alpha (beta) takes the next value of activation_alpha
// (activation_beta), else its operator's default. sequence_lens: steps past a sequence's length are
// not computed, Y there is 0, and Y_h/Y_c hold the state after its last step (its initial state for a
// length of 0).
//
// ondine.QLSTM (definition: ir/infer/rnn.hpp) runs the LSTM recurrence here on its dequantized weights,
// with X and the state entering each step replaced by their uint8 round trip (Y and Y_h hold the round
// trip of each step's state, as oneDNN writes them).
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "ondine/ir/infer/rnn.hpp"
#include "ondine/reference/common.hpp"
#include "ondine/reference/nn.hpp"

namespace ondine::reference {
namespace detail::rnn {

namespace nn = ::ondine::reference::detail::nn;
using std::int64_t;

using Activation = std::function<double(double)>;

// The activation named `name`, taking its alpha/beta from the lists at *ai / *bi when it has them.
inline Activation make_activation(const Node& n, const std::string& name, const std::vector<float>& alphas,
                                  const std::vector<float>& betas, std::size_t& ai, std::size_t& bi) {
  auto alpha = [&](double fallback) { return ai < alphas.size() ? static_cast<double>(alphas[ai++]) : fallback; };
  auto beta = [&](double fallback) { return bi < betas.size() ? static_cast<double>(betas[bi++]) : fallback; };
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (s == "sigmoid") return [](double x) { return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x)); };
  if (s == "tanh") return [](double x) { return std::tanh(x); };
  if (s == "relu") return [](double x) { return x > 0 ? x : 0.0; };
  if (s == "softsign") return [](double x) { return x / (1 + std::fabs(x)); };
  if (s == "softplus") return [](double x) { return x > 30 ? x : std::log1p(std::exp(x)); };
  if (s == "leakyrelu") {
    double a = alpha(0.01);
    return [a](double x) { return x >= 0 ? x : a * x; };
  }
  if (s == "thresholdedrelu") {
    double a = alpha(1.0);
    return [a](double x) { return x > a ? x : 0.0; };
  }
  if (s == "elu") {
    double a = alpha(1.0);
    return [a](double x) { return x >= 0 ? x : a * std::expm1(x); };
  }
  if (s == "hardsigmoid") {
    double a = alpha(0.2), b = beta(0.5);
    return [a, b](double x) { return std::max(0.0, std::min(1.0, a * x + b)); };
  }
  if (s == "affine") {
    double a = alpha(1.0), b = beta(0.0);
    return [a, b](double x) { return a * x + b; };
  }
  if (s == "scaledtanh") {
    double a = alpha(1.0), b = beta(1.0);
    return [a, b](double x) { return a * std::tanh(b * x); };
  }
  throw n.error("unsupported activation '" + name + "'");
}

inline std::vector<std::vector<double>> split_by_direction(const std::vector<double>& v, int64_t dirs) {
  std::vector<std::vector<double>> out(static_cast<std::size_t>(dirs));
  std::size_t per = v.size() / static_cast<std::size_t>(dirs);
  for (int64_t d = 0; d < dirs; ++d)
    out[static_cast<std::size_t>(d)].assign(v.begin() + static_cast<std::ptrdiff_t>(per * d),
                                            v.begin() + static_cast<std::ptrdiff_t>(per * (d + 1)));
  return out;
}

// The uint8 round trip of ondine.QLSTM: v -> dq(q(v)).
struct DataQuantization {
  double scale = 1, zero_point = 0;
  double operator()(double v) const {
    double q = std::nearbyint(v / scale) + zero_point;  // ties to even (the default rounding mode)
    q = std::isnan(q) ? zero_point : std::min(255.0, std::max(0.0, q));
    return (q - zero_point) * scale;
  }
};

// `op` is RNN, GRU or LSTM; `quantize` (LSTM only) is QLSTM's round trip of X and of the state.
inline std::vector<Tensor> recurrent_impl(const Node& n, const std::string& op, const std::vector<Tensor>& inputs,
                                          const DataQuantization* quantize) {
  const Tensor& x_t = nn::required(n, inputs, 0);
  const Tensor& w_t = nn::required(n, inputs, 1);
  const Tensor& r_t = nn::required(n, inputs, 2);
  nn::require_floating(n, x_t, "X");
  if (x_t.rank() != 3 || w_t.rank() != 3 || r_t.rank() != 3)
    throw n.error("X, W and R must have rank 3, got " + dims_str(x_t.dims()) + ", " + dims_str(w_t.dims()) + " and " +
                  dims_str(r_t.dims()));
  const int64_t layout = n.attr_int("layout", 0);
  const int64_t dirs = infer::detail_rnn::direction_count(n), gates = infer::detail_rnn::gate_count(op);
  const bool reverse_only = n.attr_string("direction", "forward") == "reverse";
  const int64_t seq = x_t.dims()[layout ? 1 : 0], batch = x_t.dims()[layout ? 0 : 1], in_size = x_t.dims()[2];
  const int64_t hidden = n.has_attr("hidden_size") ? n.attr_int("hidden_size") : r_t.dims()[2];
  if (w_t.dims() != std::vector<int64_t>{dirs, gates * hidden, in_size} ||
      r_t.dims() != std::vector<int64_t>{dirs, gates * hidden, hidden})
    throw n.error("W " + dims_str(w_t.dims()) + " or R " + dims_str(r_t.dims()) + " does not fit X " +
                  dims_str(x_t.dims()) + " with hidden size " + std::to_string(hidden));
  const bool lbr = op == "GRU" && n.attr_int("linear_before_reset", 0) != 0;
  const bool input_forget = op == "LSTM" && n.attr_int("input_forget", 0) != 0;
  const double clip = n.has_attr("clip") ? n.attr_float("clip") : 0.0;
  if (n.has_attr("clip") && !(clip > 0)) throw n.error("clip must be positive");

  // Activations per direction.
  std::vector<std::string> names = n.has_attr("activations") ? n.attr_strings("activations") : std::vector<std::string>{};
  const std::size_t per_dir = op == "LSTM" ? 3 : op == "GRU" ? 2 : 1;
  if (names.empty()) {
    std::vector<std::string> one = op == "LSTM" ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
                                   : op == "GRU" ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                 : std::vector<std::string>{"Tanh"};
    for (int64_t d = 0; d < dirs; ++d) names.insert(names.end(), one.begin(), one.end());
  }
  if (names.size() != per_dir * static_cast<std::size_t>(dirs))
    throw n.error("'activations' has " + std::to_string(names.size()) + " entries, expected " +
                  std::to_string(per_dir * static_cast<std::size_t>(dirs)));
  std::vector<float> alphas = n.attr_floats("activation_alpha", {}), betas = n.attr_floats("activation_beta", {});
  std::size_t ai = 0, bi = 0;
  std::vector<Activation> acts;
  for (const std::string& name : names) acts.push_back(make_activation(n, name, alphas, betas, ai, bi));

  auto opt = [&](std::size_t i) { return nn::input_or_empty(inputs, i); };
  std::vector<double> x = nn::to_doubles(x_t), w = nn::to_doubles(w_t), r = nn::to_doubles(r_t);
  if (quantize)
    for (double& v : x) v = (*quantize)(v);
  std::vector<double> b(static_cast<std::size_t>(dirs * 2 * gates * hidden), 0.0);
  if (Tensor t = opt(3); !t.empty()) {
    if (t.dims() != std::vector<int64_t>{dirs, 2 * gates * hidden})
      throw n.error("B has shape " + dims_str(t.dims()) + ", expected " + dims_str({dirs, 2 * gates * hidden}));
    b = nn::to_doubles(t);
  }
  std::vector<int64_t> lens(static_cast<std::size_t>(batch), seq);
  if (Tensor t = opt(4); !t.empty()) {
    if (t.dims() != std::vector<int64_t>{batch}) throw n.error("sequence_lens has shape " + dims_str(t.dims()));
    lens = t.to_int64s();
    for (int64_t l : lens)
      if (l < 0 || l > seq)
        throw n.error("sequence_lens value " + std::to_string(l) + " is outside [0, " + std::to_string(seq) + "]");
  }
  // States as [D][N][H] whatever the layout.
  auto read_state = [&](std::size_t i) {
    std::vector<double> s(static_cast<std::size_t>(dirs * batch * hidden), 0.0);
    Tensor t = opt(i);
    if (t.empty()) return s;
    std::vector<int64_t> want = layout ? std::vector<int64_t>{batch, dirs, hidden} : std::vector<int64_t>{dirs, batch, hidden};
    if (t.dims() != want) throw n.error("initial state has shape " + dims_str(t.dims()) + ", expected " + dims_str(want));
    std::vector<double> v = nn::to_doubles(t);
    for (int64_t d = 0; d < dirs; ++d)
      for (int64_t bb = 0; bb < batch; ++bb)
        for (int64_t h = 0; h < hidden; ++h)
          s[static_cast<std::size_t>((d * batch + bb) * hidden + h)] =
              v[static_cast<std::size_t>(layout ? (bb * dirs + d) * hidden + h : (d * batch + bb) * hidden + h)];
    return s;
  };
  std::vector<double> h_state = read_state(5), c_state = op == "LSTM" ? read_state(6) : std::vector<double>{};
  std::vector<double> p(static_cast<std::size_t>(dirs * 3 * hidden), 0.0);
  if (op == "LSTM")
    if (Tensor t = opt(7); !t.empty()) {
      if (t.dims() != std::vector<int64_t>{dirs, 3 * hidden}) throw n.error("P has shape " + dims_str(t.dims()));
      p = nn::to_doubles(t);
    }

  std::vector<double> y(static_cast<std::size_t>(seq * dirs * batch * hidden), 0.0);  // as [T][D][N][H]
  auto x_at = [&](int64_t t, int64_t bb) {
    return x.data() + (layout ? (bb * seq + t) * in_size : (t * batch + bb) * in_size);
  };
  auto clipped = [&](double v) { return clip > 0 ? std::max(-clip, std::min(clip, v)) : v; };
  std::vector<double> pre(static_cast<std::size_t>(gates * hidden)), pre_h(static_cast<std::size_t>(hidden));
  std::vector<double> h_in(static_cast<std::size_t>(hidden));  // the state the recurrent product reads
  for (int64_t d = 0; d < dirs; ++d) {
    const bool backward = reverse_only || d == 1;
    const double* wd = w.data() + d * gates * hidden * in_size;
    const double* rd = r.data() + d * gates * hidden * hidden;
    const double* wb = b.data() + d * 2 * gates * hidden;
    const double* rb = wb + gates * hidden;
    const double* pd = p.data() + d * 3 * hidden;
    const Activation& f = acts[static_cast<std::size_t>(d) * per_dir];
    const Activation& g = acts[std::min<std::size_t>(static_cast<std::size_t>(d) * per_dir + 1, acts.size() - 1)];
    const Activation& hact = acts[std::min<std::size_t>(static_cast<std::size_t>(d) * per_dir + 2, acts.size() - 1)];
    for (int64_t bb = 0; bb < batch; ++bb) {
      double* hs = h_state.data() + (d * batch + bb) * hidden;
      double* cs = op == "LSTM" ? c_state.data() + (d * batch + bb) * hidden : nullptr;
      const int64_t len = lens[static_cast<std::size_t>(bb)];
      for (int64_t step = 0; step < len; ++step) {
        const int64_t t = backward ? len - 1 - step : step;
        const double* xt = x_at(t, bb);
        // pre[k] = X W_k^T + Wb_k (+ H R_k^T + Rb_k, except GRU's h gate which handles R itself)
        for (int64_t k = 0; k < gates * hidden; ++k) {
          double acc = wb[k];
          const double* wr = wd + k * in_size;
          for (int64_t i = 0; i < in_size; ++i) acc += xt[i] * wr[i];
          pre[static_cast<std::size_t>(k)] = acc;
        }
        if (op == "GRU") {
          std::vector<double> z(static_cast<std::size_t>(hidden)), rg(static_cast<std::size_t>(hidden));
          for (int64_t gate = 0; gate < 2; ++gate)
            for (int64_t j = 0; j < hidden; ++j) {
              int64_t k = gate * hidden + j;
              double acc = pre[static_cast<std::size_t>(k)] + rb[k];
              for (int64_t i = 0; i < hidden; ++i) acc += hs[i] * rd[k * hidden + i];
              (gate == 0 ? z : rg)[static_cast<std::size_t>(j)] = f(clipped(acc));
            }
          for (int64_t j = 0; j < hidden; ++j) {
            int64_t k = 2 * hidden + j;
            double rec = 0;
            if (lbr) {
              for (int64_t i = 0; i < hidden; ++i) rec += hs[i] * rd[k * hidden + i];
              rec = rg[static_cast<std::size_t>(j)] * (rec + rb[k]);
            } else {
              for (int64_t i = 0; i < hidden; ++i) rec += rg[static_cast<std::size_t>(i)] * hs[i] * rd[k * hidden + i];
              rec += rb[k];
            }
            pre_h[static_cast<std::size_t>(j)] = g(clipped(pre[static_cast<std::size_t>(k)] + rec));
          }
          for (int64_t j = 0; j < hidden; ++j) {
            double zj = z[static_cast<std::size_t>(j)];
            hs[j] = (1 - zj) * pre_h[static_cast<std::size_t>(j)] + zj * hs[j];
          }
        } else {
          for (int64_t i = 0; i < hidden; ++i) h_in[static_cast<std::size_t>(i)] = quantize ? (*quantize)(hs[i]) : hs[i];
          for (int64_t k = 0; k < gates * hidden; ++k) {
            double acc = pre[static_cast<std::size_t>(k)] + rb[k];
            for (int64_t i = 0; i < hidden; ++i) acc += h_in[static_cast<std::size_t>(i)] * rd[k * hidden + i];
            pre[static_cast<std::size_t>(k)] = acc;
          }
          if (op == "RNN") {
            for (int64_t j = 0; j < hidden; ++j) hs[j] = f(clipped(pre[static_cast<std::size_t>(j)]));
          } else {  // LSTM, gate blocks i o f c
            for (int64_t j = 0; j < hidden; ++j) {
              double c_prev = cs[j];
              double fg = f(clipped(pre[static_cast<std::size_t>(2 * hidden + j)] + pd[2 * hidden + j] * c_prev));
              double ig = input_forget ? 1 - fg : f(clipped(pre[static_cast<std::size_t>(j)] + pd[j] * c_prev));
              double cg = g(clipped(pre[static_cast<std::size_t>(3 * hidden + j)]));
              double c = fg * c_prev + ig * cg;
              double og = f(clipped(pre[static_cast<std::size_t>(hidden + j)] + pd[hidden + j] * c));
              cs[j] = c;
              hs[j] = og * hact(c);
            }
          }
        }
        double* yt = y.data() + ((t * dirs + d) * batch + bb) * hidden;
        for (int64_t j = 0; j < hidden; ++j) yt[j] = quantize ? (*quantize)(hs[j]) : hs[j];
      }
    }
  }

  std::vector<Tensor> out;
  const DType dt = x_t.dtype();
  // Y in its layout
  std::vector<double> y_out(y.size());
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t d = 0; d < dirs; ++d)
      for (int64_t bb = 0; bb < batch; ++bb)
        for (int64_t h = 0; h < hidden; ++h)
          y_out[static_cast<std::size_t>(layout ? ((bb * seq + t) * dirs + d) * hidden + h
                                                : ((t * dirs + d) * batch + bb) * hidden + h)] =
              y[static_cast<std::size_t>(((t * dirs + d) * batch + bb) * hidden + h)];
  out.push_back(nn::from_doubles(dt, layout ? std::vector<int64_t>{batch, seq, dirs, hidden}
                                             : std::vector<int64_t>{seq, dirs, batch, hidden}, y_out));
  auto state_out = [&](const std::vector<double>& s) {
    std::vector<double> v(s.size());
    for (int64_t d = 0; d < dirs; ++d)
      for (int64_t bb = 0; bb < batch; ++bb)
        for (int64_t h = 0; h < hidden; ++h)
          v[static_cast<std::size_t>(layout ? (bb * dirs + d) * hidden + h : (d * batch + bb) * hidden + h)] =
              s[static_cast<std::size_t>((d * batch + bb) * hidden + h)];
    return nn::from_doubles(dt, layout ? std::vector<int64_t>{batch, dirs, hidden} : std::vector<int64_t>{dirs, batch, hidden}, v);
  };
  if (quantize)
    for (double& v : h_state) v = (*quantize)(v);
  out.push_back(state_out(h_state));
  if (op == "LSTM") out.push_back(state_out(c_state));
  return out;
}

inline std::vector<Tensor> recurrent(const Node& n, const std::vector<Tensor>& inputs) {
  return recurrent_impl(n, n.op_type(), inputs, nullptr);
}

// ondine.QLSTM: W and R dequantized with w_scale (per gate row), then the LSTM with the round trips.
inline std::vector<Tensor> qlstm(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& r_q = nn::required(n, inputs, 2);
  if (r_q.rank() != 3) throw n.error("R must have rank 3, got " + dims_str(r_q.dims()));
  const int64_t hidden = n.has_attr("hidden_size") ? n.attr_int("hidden_size") : r_q.dims()[2];
  const infer::detail_rnn::QLstmParams p = infer::detail_rnn::read_qlstm(n, hidden);
  std::vector<Tensor> ins = inputs;
  for (std::size_t i : {std::size_t{1}, std::size_t{2}}) {
    const Tensor& q = nn::required(n, inputs, i);
    if (q.dtype() != DType::Int8) throw n.error(std::string(i == 1 ? "W" : "R") + " must be int8");
    if (q.rank() != 3 || q.dims()[1] != 4 * hidden) throw n.error("W or R has shape " + dims_str(q.dims()));
    ins[i] = infer::detail_rnn::dequantize_rows(q, p.w_scale);
  }
  if (ins.size() > 7) ins.resize(7);
  DataQuantization quantize{p.x_scale, static_cast<double>(p.x_zero_point)};
  return recurrent_impl(n, "LSTM", ins, &quantize);
}

}  // namespace detail::rnn

inline void register_rnn_kernels(KernelTable& table) {
  for (const char* op : {"RNN", "GRU", "LSTM"}) table[op] = detail::rnn::recurrent;
  table["ondine.QLSTM"] = detail::rnn::qlstm;
}

}  // namespace ondine::reference
