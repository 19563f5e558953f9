// SPDX-License-Identifier: Apache-2.0
// ondine/reference/loss.hpp - reference kernels of the loss ops NegativeLogLikelihoodLoss and
// SoftmaxCrossEntropyLoss.
//
// Scores [N, C, d1, ..., dk] are read as [N, C, D] (D = d1 * ... * dk) and computed in double. The loss
// of sample (n, d) with class c = target[n, d] is -scores[n, c, d] * weight[c] (weight 1 without the
// input), and 0 with weight 0 when c is ignore_index. "mean" divides the summed loss by the summed
// weights of the samples (their count without weight input), as ONNX's function body does, so a batch
// whose samples are all ignored gives 0 / 0 = NaN. A class outside [0, C) that is not ignore_index is an
// error naming the node. SoftmaxCrossEntropyLoss is that loss on log_softmax(scores) along axis 1.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ondine/ir/infer/loss.hpp"
#include "ondine/reference/common.hpp"
#include "ondine/reference/nn.hpp"

namespace ondine::reference {
namespace detail::loss {

namespace spec = ::ondine::infer::detail_loss;
using std::int64_t;

// Checks the operands (the same rules as inference, on concrete dims); returns D, the product of the
// trailing dims d1..dk.
inline int64_t check_operands(const Node& n, const Tensor& x, const Tensor& target, const Tensor& weight) {
  if (!is_floating(x.dtype()))
    throw n.error("input has element type " + std::string(dtype_name(x.dtype())) + "; expected a floating-point type");
  if (x.rank() < 2) throw n.error("input must be [N, C, d1, ..., dk], got " + dims_str(x.dims()));
  if (target.dtype() != DType::Int32 && target.dtype() != DType::Int64)
    throw n.error("target has element type " + std::string(dtype_name(target.dtype())) + "; expected int32 or int64");
  std::vector<int64_t> want = x.dims();
  want.erase(want.begin() + 1);
  if (target.dims() != want)
    throw n.error("target " + dims_str(target.dims()) + " does not match input " + dims_str(x.dims()) +
                  ": expected " + dims_str(want));
  if (!weight.empty()) {
    if (weight.dtype() != x.dtype())
      throw n.error("weight has element type " + std::string(dtype_name(weight.dtype())) + ", expected " +
                    std::string(dtype_name(x.dtype())));
    if (weight.rank() != 1 || weight.dims()[0] != x.dims()[1])
      throw n.error("weight " + dims_str(weight.dims()) + " does not match the " + std::to_string(x.dims()[1]) +
                    " classes of input " + dims_str(x.dims()));
  }
  return detail::nn::product(x.dims(), 2);
}

// The loss of log-probabilities `lp` ([N, C, D] in double), reduced as the node says.
inline Tensor nll(const Node& n, const std::vector<double>& lp, const Tensor& x, const Tensor& target,
                  const Tensor& weight, int64_t D) {
  const spec::LossSpec s = spec::loss_spec(n);
  const int64_t N = x.dims()[0], C = x.dims()[1];
  const std::vector<int64_t> t = target.to_int64s();
  const std::vector<double> w = weight.empty() ? std::vector<double>() : detail::nn::to_doubles(weight);
  std::vector<double> loss(t.size());
  double loss_sum = 0, weight_sum = 0;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t d = 0; d < D; ++d) {
      const auto at = static_cast<std::size_t>(i * D + d);
      const int64_t c = t[at];
      if (s.has_ignore_index && c == s.ignore_index) continue;  // loss 0, weight 0
      if (c < 0 || c >= C)
        throw n.error("target value " + std::to_string(c) + " at flat index " + std::to_string(at) +
                      " is outside the classes [0, " + std::to_string(C) + ")" +
                      (s.has_ignore_index ? " and is not ignore_index " + std::to_string(s.ignore_index) : ""));
      const double wc = w.empty() ? 1.0 : w[static_cast<std::size_t>(c)];
      loss[at] = -lp[static_cast<std::size_t>((i * C + c) * D + d)] * wc;
      loss_sum += loss[at];
      weight_sum += wc;
    }
  switch (s.reduction) {
    case spec::Reduction::None: return detail::nn::from_doubles(x.dtype(), target.dims(), loss);
    case spec::Reduction::Sum: return detail::nn::from_doubles(x.dtype(), {}, {loss_sum});
    case spec::Reduction::Mean: break;
  }
  return detail::nn::from_doubles(x.dtype(), {}, {loss_sum / weight_sum});
}

inline std::vector<Tensor> negative_log_likelihood_loss(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = detail::nn::required(n, in, 0);
  const Tensor& target = detail::nn::required(n, in, 1);
  const Tensor& weight = detail::nn::input_or_empty(in, 2);
  const int64_t D = check_operands(n, x, target, weight);
  return {nll(n, detail::nn::to_doubles(x), x, target, weight, D)};
}

inline std::vector<Tensor> softmax_cross_entropy_loss(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = detail::nn::required(n, in, 0);
  const Tensor& target = detail::nn::required(n, in, 1);
  const Tensor& weight = detail::nn::input_or_empty(in, 2);
  const int64_t D = check_operands(n, x, target, weight);
  const int64_t N = x.dims()[0], C = x.dims()[1];
  std::vector<double> lp = detail::nn::to_doubles(x);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t d = 0; d < D; ++d) {
      double* p = lp.data() + i * C * D + d;  // class c at p[c * D]
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t c = 0; c < C; ++c) mx = std::max(mx, p[c * D]);
      if (std::isinf(mx)) mx = 0;  // all -inf (or a +inf): no shift keeps the IEEE result
      double sum = 0;
      for (int64_t c = 0; c < C; ++c) sum += std::exp(p[c * D] - mx);
      const double log_sum = std::log(sum);
      for (int64_t c = 0; c < C; ++c) p[c * D] = p[c * D] - mx - log_sum;
    }
  std::vector<Tensor> outs{nll(n, lp, x, target, weight, D)};
  if (n.num_outputs() > 1) outs.push_back(detail::nn::from_doubles(x.dtype(), x.dims(), lp));
  return outs;
}

}  // namespace detail::loss

inline void register_loss_kernels(KernelTable& t) {
  t["NegativeLogLikelihoodLoss"] = detail::loss::negative_log_likelihood_loss;
  t["SoftmaxCrossEntropyLoss"] = detail::loss::softmax_cross_entropy_loss;
}

}  // namespace ondine::reference
