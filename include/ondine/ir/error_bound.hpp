// SPDX-License-Identifier: Apache-2.0
// ondine/ir/error_bound.hpp - what the error bounds of reduced precision share: the output error of one
// run of a graph against another (int8 against fp32 in quant/fallback.hpp, bf16 against fp32 in
// lower/error_bound.hpp), and the loop that keeps the worst parts at full precision one at a time until
// the bound holds.
//
// output_error: for each float output, max |q - f| over every element of every sample, divided by max |f|
// over the same; the largest over the outputs. A bound of 0.02 thus means no output element is off by more
// than 2% of that output's largest magnitude on these samples. NaN anywhere counts as +inf; an output
// that is all zero in the reference counts 0 when the test matches it exactly, else +inf.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/graph.hpp"

namespace ondine {

// Graph outputs, one map per sample.
using SampleOutputs = std::vector<std::map<std::string, Tensor>>;

// The error of `test` against `reference` on g's float outputs (see the header comment).
inline double output_error(const Graph& g, const SampleOutputs& reference, const SampleOutputs& test) {
  if (reference.size() != test.size() || reference.empty())
    throw Error("output_error: " + std::to_string(reference.size()) + " reference runs and " +
                std::to_string(test.size()) + " test runs");
  constexpr double inf = std::numeric_limits<double>::infinity();
  double worst = 0.0;
  bool any = false;
  for (Value* out : g.outputs()) {
    double diff = 0.0, peak = 0.0;
    bool floating = true;
    for (std::size_t s = 0; s < reference.size() && floating; ++s) {
      auto get = [&](const std::map<std::string, Tensor>& run, const char* which) -> const Tensor& {
        auto it = run.find(out->name());
        if (it == run.end())
          throw Error("output_error: the " + std::string(which) + " run " + std::to_string(s + 1) + " lacks output '" +
                      out->name() + "'");
        return it->second;
      };
      const Tensor& f = get(reference[s], "reference");
      const Tensor& q = get(test[s], "test");
      floating = is_floating(f.dtype()) && is_floating(q.dtype());
      if (!floating) break;
      if (f.dims() != q.dims())
        throw Error("output_error: output '" + out->name() + "' has shape " + dims_str(q.dims()) + ", expected " +
                    dims_str(f.dims()));
      for (std::int64_t i = 0; i < f.numel(); ++i) {
        auto k = static_cast<std::size_t>(i);
        double a = f.at_double(k), b = q.at_double(k), d = std::abs(b - a);
        if (std::isnan(d)) diff = inf;
        else diff = std::max(diff, d);
        peak = std::max(peak, std::abs(a));
      }
    }
    if (!floating) continue;
    any = true;
    worst = std::max(worst, diff == 0.0 ? 0.0 : peak > 0.0 ? diff / peak : inf);
  }
  if (!any) throw Error("output_error: graph '" + g.name + "' has no float output to measure the error on");
  return worst;
}

// Keeps candidates 0, 1, ... (ranked worst first) at full precision one at a time while `error` exceeds
// `bound` and fewer than `max_steps` (0: no limit) were kept. keep(i) keeps candidate i (with those
// before it) and returns the error measured then, which becomes `error`; step(i, before, after) reports
// each step. A step counts even when the error did not drop (a max over noisy differences can rise a
// little), so the steps are monotone and end, at the latest, with every candidate kept. Returns the
// number of steps.
template <class Keep, class Step>
std::size_t keep_worst_first(std::size_t candidates, double bound, std::size_t max_steps, double& error, Keep keep,
                             Step step) {
  if (!(bound >= 0.0) || !std::isfinite(bound))
    throw Error("the error bound must be a finite number >= 0, got " + std::to_string(bound));
  std::size_t steps = 0;
  for (std::size_t i = 0; i < candidates; ++i) {
    if (error <= bound || (max_steps && steps >= max_steps)) break;
    const double before = error;
    error = keep(i);
    ++steps;
    step(i, before, error);
  }
  return steps;
}

}  // namespace ondine
