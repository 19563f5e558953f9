// SPDX-License-Identifier: Apache-2.0
// ondine/runtime/kv_cache.hpp - a decoder's key/value cache in buffers of a maximum length, which each step
// appends to in place (ONNX Runtime GenAI's shared past/present buffer).
//
//   runtime::KvCache cache = model.make_kv_cache(512);            // lower/dynamic.hpp, ShapeCache
//   model.run({{"input_ids", prompt}}, {}, &cache);              // pasts of length 0, the prompt appended
//   model.run({{"input_ids", next_token}}, {}, &cache);          // past = the prompt, one row appended
//
// Why: a decoder exported with a KV cache computes `present = Concat(past, new)` at every token, so run as
// the graph says, each step copies the whole past into a new present and the caller feeds it back: a copy
// that grows with the text (at 512 positions of a GPT-2-sized model, about 19 MB read and written per
// token). With a cache, a pair's past and present are one buffer of `capacity` positions along the Concat's
// axis: the past the model reads is the first length() positions, the step writes only its new positions
// after them, and the attention reads the keys and values where they are. Nothing is copied from step to
// step, and the buffers are allocated once.
//
// The pairs are found in the compiled graph (DynamicModel::kv_pairs): a past input that only a Concat
// (first operand) and Shape read, whose result is a graph output that only attention and Shape read. The
// cache supplies those inputs and keeps those outputs: a call with a cache neither takes the past inputs
// nor returns the present outputs (present() copies one out). One cache belongs to one sequence (batch) at
// a time; reset() starts a new one. Not thread-safe: one call at a time per cache.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/tensor.hpp"

namespace ondine::runtime {

// A past input and the present output computed from it by Concat(past, new...) along `axis`.
struct KvPair {
  std::string past, present;
  std::size_t axis = 0;
};

class KvCache {
 public:
  KvCache() = default;
  // One buffer per pair, of `dims` (the past's dims with `capacity` on the pair's axis), zero-filled.
  KvCache(std::vector<KvPair> pairs, const std::vector<std::vector<std::int64_t>>& dims, DType dtype,
          std::int64_t capacity)
      : pairs_(std::move(pairs)), capacity_(capacity) {
    ondine::detail::check(dims.size() == pairs_.size(), "KvCache: one shape per pair");
    for (std::size_t i = 0; i < pairs_.size(); ++i) {
      ondine::detail::check(pairs_[i].axis < dims[i].size() && dims[i][pairs_[i].axis] == capacity,
                    "KvCache: the capacity lies on each pair's axis");
      buffers_.emplace_back(dtype, dims[i]);
    }
  }

  const std::vector<KvPair>& pairs() const { return pairs_; }
  // Positions the cache holds now (the next step's past length) and at most.
  std::int64_t length() const { return length_; }
  std::int64_t capacity() const { return capacity_; }
  // Forgets the sequence: the next step's past is empty.
  void reset() { length_ = 0; }

  // The buffer of pair `i`: its dims have capacity() on the pair's axis.
  const Tensor& buffer(std::size_t i) const { return buffers_.at(i); }
  // The first `length` positions of pair `i` as a tensor of the past's dims (a view whose dims are right and
  // whose elements are laid out with the buffer's strides: only kernels given those strides read it).
  Tensor view(std::size_t i, std::int64_t length) const {
    std::vector<std::int64_t> dims = buffers_.at(i).dims();
    dims[pairs_[i].axis] = length;
    return buffers_[i].prefix_view(dims);
  }

  // A contiguous copy of the present output `name` as the graph computes it: the first length() positions.
  Tensor present(const std::string& name) const {
    for (std::size_t i = 0; i < pairs_.size(); ++i)
      if (pairs_[i].present == name || pairs_[i].past == name) return copy_out(i);
    std::string names;
    for (const KvPair& p : pairs_) names += (names.empty() ? "" : ", ") + p.present;
    throw Error("the KV cache holds no output '" + name + "' (it holds " + names + ")");
  }

  // Called by the engine after a step appended `added` positions to every pair.
  void advance(std::int64_t added) {
    ondine::detail::check(added >= 0 && length_ + added <= capacity_, "KvCache: advance past the capacity");
    length_ += added;
  }

 private:
  Tensor copy_out(std::size_t i) const {
    const Tensor& b = buffers_[i];
    const std::size_t axis = pairs_[i].axis;
    std::vector<std::int64_t> dims = b.dims();
    dims[axis] = length_;
    Tensor out(b.dtype(), dims);
    std::int64_t outer = 1, inner = 1;
    for (std::size_t d = 0; d < axis; ++d) outer *= dims[d];
    for (std::size_t d = axis + 1; d < dims.size(); ++d) inner *= dims[d];
    const std::size_t width = dtype_size(b.dtype());
    const std::size_t row = static_cast<std::size_t>(inner) * width;
    for (std::int64_t o = 0; o < outer; ++o)
      if (length_ && row)
        std::memcpy(static_cast<char*>(out.raw()) + static_cast<std::size_t>(o * length_) * row,
                    static_cast<const char*>(b.raw()) + static_cast<std::size_t>(o * capacity_) * row,
                    static_cast<std::size_t>(length_) * row);
    return out;
  }

  std::vector<KvPair> pairs_;
  std::vector<Tensor> buffers_;
  std::int64_t capacity_ = 0, length_ = 0;
};

}  // namespace ondine::runtime
