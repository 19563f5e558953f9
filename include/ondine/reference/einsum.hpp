// SPDX-License-Identifier: Apache-2.0
// ondine/reference/einsum.hpp - the reference kernel of Einsum: any equation (ir/infer/einsum.hpp reads
// it), with ellipses, diagonals (a letter repeated in a term), sums and the implicit output.
//
// One loop nest over every label: the output's labels outside, the summed ones inside. Each operand
// steps by the sum of its strides over the axes carrying a label (a diagonal steps along both axes at
// once) and by 0 over a broadcast ellipsis dim of size 1. Floating types accumulate in double, integer
// types in int64 (exact where double would round above 2^53), and the result is rounded once.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "ondine/ir/infer/einsum.hpp"
#include "ondine/reference/common.hpp"
#include "ondine/reference/nn.hpp"

namespace ondine::reference {
namespace detail::einsum {

namespace spec = ::ondine::infer::detail_einsum;
using std::int64_t;

template <typename Acc>
std::vector<Acc> values_as(const Tensor& t) {
  std::vector<Acc> out(static_cast<std::size_t>(t.numel()));
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = static_cast<const T*>(t.raw());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<Acc>(p[i]);
  });
  return out;
}

template <typename Acc>
Tensor contract(const Node& n, const std::vector<Tensor>& in, const spec::Labels& l) {
  // Every label's size: letters must agree, ellipsis dims broadcast from 1.
  std::map<int, int64_t> size;
  for (std::size_t i = 0; i < in.size(); ++i)
    for (std::size_t a = 0; a < l.operands[i].size(); ++a) {
      const int lab = l.operands[i][a];
      const int64_t d = in[i].dims()[a];
      auto [it, fresh] = size.emplace(lab, d);
      if (fresh || it->second == d) continue;
      if (lab >= spec::kEllipsisLabel && (d == 1 || it->second == 1)) {
        it->second = std::max(it->second, d);
        continue;
      }
      throw n.error("label " + (lab < spec::kEllipsisLabel ? "'" + std::string(1, static_cast<char>(lab)) + "'"
                                                            : "'...' dim " + std::to_string(lab - spec::kEllipsisLabel)) +
                    " has sizes " + std::to_string(it->second) + " and " + std::to_string(d) + " in equation '" +
                    n.attr_string("equation") + "'");
    }
  // The loop order: output labels, then the summed ones.
  std::vector<int> loop = l.output;
  for (auto& [lab, s] : size)
    if (std::find(loop.begin(), loop.end(), lab) == loop.end()) loop.push_back(lab);
  const std::size_t L = loop.size();
  std::vector<int64_t> extent(L);
  for (std::size_t k = 0; k < L; ++k) extent[k] = size.at(loop[k]);
  // Per operand, its step along each loop label.
  std::vector<std::vector<int64_t>> step(in.size(), std::vector<int64_t>(L, 0));
  std::vector<std::vector<Acc>> data;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::vector<int64_t> strides = strides_of(in[i].dims());
    for (std::size_t a = 0; a < l.operands[i].size(); ++a) {
      if (in[i].dims()[a] == 1 && size.at(l.operands[i][a]) != 1) continue;  // broadcast
      const auto k = static_cast<std::size_t>(std::find(loop.begin(), loop.end(), l.operands[i][a]) - loop.begin());
      step[i][k] += strides[a];
    }
    data.push_back(values_as<Acc>(in[i]));
  }
  std::vector<int64_t> out_dims(extent.begin(), extent.begin() + static_cast<std::ptrdiff_t>(l.output.size()));
  int64_t out_numel = 1, total = 1;
  for (auto d : out_dims) out_numel *= d;
  for (auto d : extent) total *= d;
  std::vector<Acc> out(static_cast<std::size_t>(out_numel), Acc(0));
  if (total > 0) {
    // Odometer over the loop labels; the output index is the outer labels' row-major index, which the
    // loop order makes the flat index divided by the number of summed combinations.
    const int64_t inner = total / out_numel;
    std::vector<int64_t> idx(L, 0), off(in.size(), 0);
    for (int64_t k = 0; k < total; ++k) {
      Acc p = Acc(1);
      for (std::size_t i = 0; i < in.size(); ++i) p *= data[i][static_cast<std::size_t>(off[i])];
      out[static_cast<std::size_t>(k / inner)] += p;
      for (std::size_t d = L; d-- > 0;) {
        ++idx[d];
        for (std::size_t i = 0; i < in.size(); ++i) off[i] += step[i][d];
        if (idx[d] < extent[d]) break;
        for (std::size_t i = 0; i < in.size(); ++i) off[i] -= step[i][d] * idx[d];
        idx[d] = 0;
      }
    }
  }
  Tensor t(in[0].dtype(), out_dims);
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = t.data<T>();
    for (std::size_t i = 0; i < out.size(); ++i) {
      if constexpr (std::is_floating_point_v<Acc>) p[i] = nn::from_double<T>(out[i]);
      else p[i] = static_cast<T>(out[i]);  // wraps as the integer product would
    }
  });
  return t;
}

inline std::vector<Tensor> einsum(const Node& n, const std::vector<Tensor>& in) {
  const spec::Equation eq = spec::parse(n);
  std::vector<std::size_t> ranks;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const Tensor& t = nn::required(n, in, i);
    if (t.dtype() != in[0].dtype())
      throw n.error("inputs #0 and #" + std::to_string(i) + " have different element types (" +
                    std::string(dtype_name(in[0].dtype())) + " and " + std::string(dtype_name(t.dtype())) + ")");
    ranks.push_back(t.rank());
  }
  const spec::Labels l = spec::label(n, eq, ranks);
  if (is_floating(in[0].dtype())) return {contract<double>(n, in, l)};
  if (in[0].dtype() == DType::Bool || in[0].dtype() == DType::String)
    throw n.error("Einsum takes numeric tensors, got " + std::string(dtype_name(in[0].dtype())));
  return {contract<int64_t>(n, in, l)};
}

}  // namespace detail::einsum

inline void register_einsum_kernels(KernelTable& t) { t["Einsum"] = detail::einsum::einsum; }

}  // namespace ondine::reference
