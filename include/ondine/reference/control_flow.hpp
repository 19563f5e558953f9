// SPDX-License-Identifier: Apache-2.0
// ondine/reference/control_flow.hpp - reference kernels of If, Loop, Scan (ONNX opsets 9-17) and
// SequenceMap: each
// runs its subgraph on the reference executor, the subgraph's captures bound to the node's implicit
// inputs by name. reference/executor.hpp puts them in its kernel table.
//
// A Loop that would run past max_loop_iterations() (default 10 million; `ondine run
// --max-loop-iterations`) stops with an error naming the node: a loop whose condition never turns
// false is a bug in the model or its inputs, not a reason to hang.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ondine/reference/interpreter.hpp"

namespace ondine::reference {

inline std::atomic<std::int64_t>& max_loop_iterations_setting() {
  static std::atomic<std::int64_t> limit{10'000'000};
  return limit;
}
// The most iterations a Loop may run before it fails (any engine: the compiled one runs Loop here too).
inline std::int64_t max_loop_iterations() { return max_loop_iterations_setting().load(); }
inline void set_max_loop_iterations(std::int64_t n) { max_loop_iterations_setting().store(n > 0 ? n : 1); }

namespace detail_control_flow {

// The node's implicit inputs (after its formal ones), looked up by the captured name.
inline std::function<Tensor(const std::string&)> captures_of(const Node& n, const std::vector<Tensor>& args) {
  return [&n, &args](const std::string& name) -> Tensor {
    const auto& names = n.captured_names();
    for (std::size_t k = 0; k < names.size(); ++k)
      if (names[k] == name) return args.at(n.num_formal_inputs() + k);
    throw n.error("its subgraph reads '" + name + "', which the node does not pass in");
  };
}

// How a subgraph runs, when not on the reference executor (a compiled engine passes its compiled
// bodies): the body, its formal inputs and a lookup of its captures -> its outputs.
using BodyRunner = std::function<std::vector<Tensor>(const Graph& body, const std::vector<Tensor>& inputs,
                                                    const std::function<Tensor(const std::string&)>& capture)>;

// Runs `body` through `runner`, or on one reference executor made at the first call.
class Body {
 public:
  Body(const Graph& body, const BodyRunner* runner, std::function<Tensor(const std::string&)> capture)
      : body_(body), runner_(runner), capture_(std::move(capture)) {}
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs) {
    if (runner_ && *runner_) return (*runner_)(body_, inputs, capture_);
    if (!exec_) exec_.emplace(body_);
    return exec_->run_body(inputs, capture_);
  }

 private:
  const Graph& body_;
  const BodyRunner* runner_;
  std::function<Tensor(const std::string&)> capture_;
  std::optional<ReferenceExecutor> exec_;
};

inline bool scalar_truth(const Node& n, const Tensor& t, const char* what) {
  if (t.numel() != 1)
    throw n.error(std::string(what) + " has " + std::to_string(t.numel()) + " elements; it must have exactly one");
  return t.at_double(0) != 0;
}

// Element `i` of `t` along `axis` (the axis removed).
inline Tensor take(const Tensor& t, std::size_t axis, std::int64_t i) {
  std::vector<std::int64_t> dims = t.dims();
  std::int64_t outer = 1, inner = 1;
  for (std::size_t a = 0; a < axis; ++a) outer *= dims[a];
  for (std::size_t a = axis + 1; a < dims.size(); ++a) inner *= dims[a];
  const std::int64_t steps = dims[axis];
  dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(axis));
  Tensor out(t.dtype(), dims);
  const std::size_t row = static_cast<std::size_t>(inner) * dtype_size(t.dtype());
  const auto* src = static_cast<const unsigned char*>(t.raw());
  auto* dst = static_cast<unsigned char*>(out.raw());
  for (std::int64_t o = 0; o < outer; ++o)
    std::memcpy(dst + static_cast<std::size_t>(o) * row, src + static_cast<std::size_t>(o * steps + i) * row, row);
  return out;
}

// The tensors stacked along a new axis `axis` (all of one dtype and shape; `empty_dims` when none).
inline Tensor stack(const Node& n, const std::vector<Tensor>& parts, std::size_t axis, DType dtype,
                    const std::vector<std::int64_t>& empty_dims) {
  if (parts.empty()) {
    std::vector<std::int64_t> dims = empty_dims;
    dims.insert(dims.begin() + static_cast<std::ptrdiff_t>(std::min(axis, dims.size())), 0);
    return Tensor(dtype, dims);
  }
  const std::vector<std::int64_t> part = parts[0].dims();
  for (const Tensor& p : parts)
    if (p.dims() != part || p.dtype() != parts[0].dtype())
      throw n.error("a scan output changes shape or type between iterations (" + dims_str(part) + " then " +
                    dims_str(p.dims()) + "); ONNX requires them to stay the same");
  std::vector<std::int64_t> dims = part;
  dims.insert(dims.begin() + static_cast<std::ptrdiff_t>(axis), static_cast<std::int64_t>(parts.size()));
  Tensor out(parts[0].dtype(), dims);
  std::int64_t outer = 1, inner = 1;
  for (std::size_t a = 0; a < axis; ++a) outer *= part[a];
  for (std::size_t a = axis; a < part.size(); ++a) inner *= part[a];
  const std::size_t row = static_cast<std::size_t>(inner) * dtype_size(parts[0].dtype());
  auto* dst = static_cast<unsigned char*>(out.raw());
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::size_t k = 0; k < parts.size(); ++k)
      std::memcpy(dst + (static_cast<std::size_t>(o) * parts.size() + k) * row,
                  static_cast<const unsigned char*>(parts[k].raw()) + static_cast<std::size_t>(o) * row, row);
  return out;
}

// The static dims a value was inferred to have, for an output of zero iterations (else none).
inline std::vector<std::int64_t> inferred_part_dims(const Value* v) {
  if (!v || !v->shape().is_static()) return {};
  return v->shape().sizes();
}

inline std::vector<Tensor> if_kernel(const Node& n, const std::vector<Tensor>& in, const BodyRunner* runner = nullptr) {
  bool cond = scalar_truth(n, in.at(0), "its condition");
  const Graph& branch = n.attr_graph(cond ? "then_branch" : "else_branch");
  return Body(branch, runner, captures_of(n, in))({});
}

inline std::vector<Tensor> loop_kernel(const Node& n, const std::vector<Tensor>& in, const BodyRunner* runner = nullptr) {
  const Graph& body = n.attr_graph("body");
  const std::size_t carried = n.num_formal_inputs() - 2;
  const std::size_t scans = body.outputs().size() - 1 - carried;
  const bool has_trip = !in.at(0).empty(), has_cond = !in.at(1).empty();
  if (has_trip && in[0].numel() != 1) throw n.error("its trip count M must have one element");
  const std::int64_t trip = has_trip ? in[0].to_int64s()[0] : 0;  // often INT64_MAX: a while loop
  bool keep_going = has_cond ? scalar_truth(n, in[1], "its condition") : true;
  std::vector<Tensor> state(in.begin() + 2, in.begin() + 2 + static_cast<std::ptrdiff_t>(carried));
  std::vector<std::vector<Tensor>> stacked(scans);
  Body run_body(body, runner, captures_of(n, in));
  const std::int64_t limit = max_loop_iterations();
  for (std::int64_t i = 0; (!has_trip || i < trip) && keep_going; ++i) {
    if (i >= limit)
      throw n.error("the loop has run " + std::to_string(limit) +
                    " iterations without ending (raise the limit with --max-loop-iterations if that is intended)");
    std::vector<Tensor> args{Tensor::scalar<std::int64_t>(i), Tensor::scalar<bool>(keep_going)};
    args.insert(args.end(), state.begin(), state.end());
    std::vector<Tensor> out = run_body(args);
    if (has_cond) keep_going = scalar_truth(n, out[0], "its body's condition output");
    for (std::size_t k = 0; k < carried; ++k) state[k] = std::move(out[1 + k]);
    for (std::size_t k = 0; k < scans; ++k) stacked[k].push_back(std::move(out[1 + carried + k]));
  }
  std::vector<Tensor> result = std::move(state);
  for (std::size_t k = 0; k < scans; ++k) {
    const Value* y = n.output(carried + k);
    DType dtype = body.outputs()[1 + carried + k]->dtype();
    std::vector<std::int64_t> part = inferred_part_dims(body.outputs()[1 + carried + k]);
    result.push_back(stack(n, stacked[k], 0, y && y->dtype() != DType::Undefined ? y->dtype() : dtype, part));
  }
  return result;
}

// Opset 8: inputs sequence_lens?, N states [B, ...], M scan inputs [B, T, ...] (attribute `directions`);
// each batch item is scanned over its first sequence_lens[b] steps, scan outputs padded with zeros to T.
inline std::vector<Tensor> scan8_kernel(const Node& n, const std::vector<Tensor>& in, const BodyRunner* runner) {
  const Graph& body = n.attr_graph("body");
  const auto m = static_cast<std::size_t>(n.attr_int("num_scan_inputs"));
  const std::size_t states = n.num_formal_inputs() - 1 - m, outs = body.outputs().size() - states;
  auto dirs = n.attr_ints("directions", std::vector<std::int64_t>(m, 0));
  if (dirs.size() != m) throw n.error("directions has the wrong length");
  const Tensor& first = in.at(1 + states);
  if (first.rank() < 2) throw n.error("its scan inputs need a batch and a sequence axis");
  const std::int64_t batch = first.dims()[0], steps = first.dims()[1];
  std::vector<std::int64_t> lens(static_cast<std::size_t>(batch), steps);
  if (!in[0].empty()) {
    lens = in[0].to_int64s();
    if (static_cast<std::int64_t>(lens.size()) != batch) throw n.error("sequence_lens has the wrong length");
    for (auto l : lens)
      if (l < 0 || l > steps) throw n.error("sequence_lens holds " + std::to_string(l) + ", outside [0, " + std::to_string(steps) + "]");
  }
  Body run_body(body, runner, captures_of(n, in));
  std::vector<std::vector<Tensor>> final_states(states), outputs(outs);
  for (std::int64_t b = 0; b < batch; ++b) {
    std::vector<Tensor> state;
    for (std::size_t i = 0; i < states; ++i) state.push_back(take(in[1 + i], 0, b));
    std::vector<Tensor> rows_of_b(m);
    for (std::size_t j = 0; j < m; ++j) rows_of_b[j] = take(in[1 + states + j], 0, b);
    std::vector<std::vector<Tensor>> stacked(outs);
    const std::int64_t len = lens[static_cast<std::size_t>(b)];
    for (std::int64_t t = 0; t < len; ++t) {
      std::vector<Tensor> args = state;
      for (std::size_t j = 0; j < m; ++j) args.push_back(take(rows_of_b[j], 0, dirs[j] ? len - 1 - t : t));
      std::vector<Tensor> out = run_body(args);
      for (std::size_t k = 0; k < states; ++k) state[k] = std::move(out[k]);
      for (std::size_t k = 0; k < outs; ++k) stacked[k].push_back(std::move(out[states + k]));
    }
    for (std::size_t k = 0; k < states; ++k) final_states[k].push_back(state[k]);
    for (std::size_t k = 0; k < outs; ++k) {
      std::vector<std::int64_t> part = stacked[k].empty() ? inferred_part_dims(body.outputs()[states + k]) : stacked[k][0].dims();
      DType dt = stacked[k].empty() ? body.outputs()[states + k]->dtype() : stacked[k][0].dtype();
      while (static_cast<std::int64_t>(stacked[k].size()) < steps) {  // padding past this item's length
        Tensor zero(dt, part);
        if (zero.nbytes()) std::memset(zero.raw(), 0, zero.nbytes());
        stacked[k].push_back(zero);
      }
      outputs[k].push_back(stack(n, stacked[k], 0, dt, part));
    }
  }
  std::vector<Tensor> result;
  for (std::size_t k = 0; k < states; ++k) result.push_back(stack(n, final_states[k], 0, in[1 + k].dtype(), {}));
  for (std::size_t k = 0; k < outs; ++k) result.push_back(stack(n, outputs[k], 0, body.outputs()[states + k]->dtype(), {}));
  return result;
}

inline std::vector<Tensor> scan_kernel(const Node& n, const std::vector<Tensor>& in, const BodyRunner* runner = nullptr) {
  if (n.opset() < 9) return scan8_kernel(n, in, runner);
  const Graph& body = n.attr_graph("body");
  const std::size_t formal = n.num_formal_inputs();
  const auto m = static_cast<std::size_t>(n.attr_int("num_scan_inputs"));
  const std::size_t states = formal - m, outs = body.outputs().size() - states;
  auto in_axes = n.attr_ints("scan_input_axes", std::vector<std::int64_t>(m, 0));
  auto in_dirs = n.attr_ints("scan_input_directions", std::vector<std::int64_t>(m, 0));
  auto out_axes = n.attr_ints("scan_output_axes", std::vector<std::int64_t>(outs, 0));
  auto out_dirs = n.attr_ints("scan_output_directions", std::vector<std::int64_t>(outs, 0));
  if (in_dirs.size() != m || out_dirs.size() != outs) throw n.error("scan directions have the wrong length");
  std::vector<std::size_t> axes(m);
  std::int64_t trip = -1;
  for (std::size_t j = 0; j < m; ++j) {
    const Tensor& x = in.at(states + j);
    axes[j] = static_cast<std::size_t>(detail::normalize_axis(n, in_axes[j], static_cast<std::int64_t>(x.rank())));
    std::int64_t steps = x.dims()[axes[j]];
    if (trip >= 0 && steps != trip)
      throw n.error("its scan inputs have " + std::to_string(trip) + " and " + std::to_string(steps) + " steps");
    trip = steps;
  }
  std::vector<Tensor> state(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(states));
  std::vector<std::vector<Tensor>> stacked(outs);
  Body run_body(body, runner, captures_of(n, in));
  for (std::int64_t t = 0; t < trip; ++t) {
    std::vector<Tensor> args = state;
    for (std::size_t j = 0; j < m; ++j)
      args.push_back(take(in[states + j], axes[j], in_dirs[j] ? trip - 1 - t : t));
    std::vector<Tensor> out = run_body(args);
    for (std::size_t k = 0; k < states; ++k) state[k] = std::move(out[k]);
    for (std::size_t k = 0; k < outs; ++k) stacked[k].push_back(std::move(out[states + k]));
  }
  std::vector<Tensor> result = std::move(state);
  for (std::size_t k = 0; k < outs; ++k) {
    if (out_dirs[k]) std::reverse(stacked[k].begin(), stacked[k].end());
    std::vector<std::int64_t> part = inferred_part_dims(body.outputs()[states + k]);
    auto r = static_cast<std::int64_t>(stacked[k].empty() ? part.size() : stacked[k][0].rank()) + 1;
    auto axis = static_cast<std::size_t>(detail::normalize_axis(n, out_axes[k], r));
    result.push_back(stack(n, stacked[k], axis, body.outputs()[states + k]->dtype(), part));
  }
  return result;
}

// SequenceMap: the body once per element of the first input (a sequence); each further input gives the
// body its element i when it is a sequence (of the same length), itself when it is a tensor. Output k
// collects the body's output k of every iteration into a sequence.
inline std::vector<Tensor> sequence_map_kernel(const Node& n, const std::vector<Tensor>& in) {
  const Graph& body = n.attr_graph("body");
  const std::size_t formal = n.num_formal_inputs();
  if (in.empty() || !in[0].is_sequence()) throw n.error("input #0 must be a sequence");
  const std::size_t len = in[0].items().size();
  for (std::size_t j = 1; j < formal; ++j)
    if (in[j].is_sequence() && in[j].items().size() != len)
      throw n.error("input #" + std::to_string(j) + " has " + std::to_string(in[j].items().size()) +
                    " elements, input #0 has " + std::to_string(len));
  Body run(body, nullptr, captures_of(n, in));
  std::vector<std::vector<Tensor>> collected(body.outputs().size());
  for (std::size_t i = 0; i < len; ++i) {
    std::vector<Tensor> args;
    for (std::size_t j = 0; j < formal; ++j) args.push_back(in[j].is_sequence() ? in[j].items()[i] : in[j]);
    std::vector<Tensor> results = run(args);
    for (std::size_t k = 0; k < collected.size(); ++k) collected[k].push_back(results.at(k));
  }
  std::vector<Tensor> out;
  for (std::size_t k = 0; k < collected.size(); ++k) {
    const DType t = collected[k].empty() ? body.outputs()[k]->dtype() : collected[k][0].dtype();
    out.push_back(Tensor::sequence(t, std::move(collected[k])));
  }
  return out;
}

}  // namespace detail_control_flow

inline void register_control_flow_kernels(KernelTable& t) {
  t["If"] = [](const Node& n, const std::vector<Tensor>& in) { return detail_control_flow::if_kernel(n, in); };
  t["Loop"] = [](const Node& n, const std::vector<Tensor>& in) { return detail_control_flow::loop_kernel(n, in); };
  t["Scan"] = [](const Node& n, const std::vector<Tensor>& in) { return detail_control_flow::scan_kernel(n, in); };
  t["SequenceMap"] = detail_control_flow::sequence_map_kernel;
}

}  // namespace ondine::reference
