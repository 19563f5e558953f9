// SPDX-License-Identifier: Apache-2.0
// ondine/runtime/output_binding.hpp - outputs written into memory the caller provides (ONNX Runtime's
// IOBinding).
//
// Why: a program that runs one model call after call (a server, a decoding loop with a KV cache) can keep
// its output buffers from call to call instead of receiving fresh ones: the engine writes each bound output
// into the caller's buffer, where the step that computes it writes its result directly when it can
// (lower/dynamic.hpp). A buffer is checked before anything is written into it: a short one, a wrong dtype, or
// one whose memory an input of the same call reads is an Error naming the output, never a write past its
// end or over an input.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/graph.hpp"
#include "ondine/ir/tensor.hpp"

namespace ondine::runtime {

// `buffer`'s storage seen as the output `name` of `dtype` and `dims` (its first elements; the buffer may be
// larger, e.g. a KV cache allocated for the longest sequence).
inline Tensor output_view(const Tensor& buffer, DType dtype, const std::vector<std::int64_t>& dims,
                          const std::string& name) {
  if (buffer.kind() != Tensor::Kind::Dense || buffer.dtype() != dtype)
    throw Error("output '" + name + "' is " + std::string(dtype_name(dtype)) + "; the buffer bound to it holds " +
                (buffer.kind() == Tensor::Kind::Dense ? std::string(dtype_name(buffer.dtype())) : "no dense tensor"));
  std::int64_t need = 1;
  for (std::int64_t d : dims) need *= d;
  if (need > buffer.numel())
    throw Error("output '" + name + "' is " + dims_str(dims) + " (" + std::to_string(need) +
                " elements); the buffer bound to it holds " + dims_str(buffer.dims()) + " (" +
                std::to_string(buffer.numel()) + ")");
  return buffer.prefix_view(dims);
}

// `value` in the caller's `buffer` (copied there unless a step wrote it there already).
inline Tensor write_output(const Tensor& value, const Tensor& buffer, const std::string& name) {
  if (value.kind() != Tensor::Kind::Dense || value.dtype() == DType::String)
    throw Error("output '" + name + "' is not a dense tensor: it cannot be written into a bound buffer");
  Tensor view = output_view(buffer, value.dtype(), value.dims(), name);
  if (view.raw() != value.raw() && value.nbytes()) std::memcpy(view.raw(), value.raw(), value.nbytes());
  return view;
}

namespace detail {
inline bool bytes_overlap(const Tensor& a, const Tensor& b) {
  if (a.kind() != Tensor::Kind::Dense || b.kind() != Tensor::Kind::Dense || !a.nbytes() || !b.nbytes()) return false;
  const char* pa = static_cast<const char*>(a.raw());
  const char* pb = static_cast<const char*>(b.raw());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}
}  // namespace detail

// Checks the bound buffers of a call: each names an output of `g`, is a dense tensor, and shares no memory
// with an input of the call or with another bound buffer (an output written over the memory a step still
// reads would be wrong silently). A decoding loop that feeds a step's present_* back as the next past_*
// swaps two sets of buffers.
inline void check_output_bindings(const Graph& g, const std::map<std::string, Tensor>& inputs,
                                  const std::map<std::string, Tensor>& bound) {
  for (auto& [name, buffer] : bound) {
    const Value* v = g.find_value(name);
    if (!v || !v->is_graph_output()) {
      std::string outs;
      for (const Value* o : g.outputs()) outs += (outs.empty() ? "" : ", ") + o->name();
      throw Error("a buffer is bound to '" + name + "', which is not an output of the model (outputs: " + outs + ")");
    }
    if (buffer.kind() != Tensor::Kind::Dense || buffer.empty())
      throw Error("the buffer bound to output '" + name + "' is not a dense tensor");
    for (auto& [in, t] : inputs)
      if (detail::bytes_overlap(buffer, t))
        throw Error("the buffer bound to output '" + name + "' shares memory with input '" + in +
                    "' of the same call; give the output a buffer of its own (a decoding loop swaps two "
                    "sets of buffers between steps)");
    for (auto& [other, t] : bound)
      if (other < name && detail::bytes_overlap(buffer, t))
        throw Error("the buffers bound to outputs '" + other + "' and '" + name + "' share memory");
  }
}

}  // namespace ondine::runtime
