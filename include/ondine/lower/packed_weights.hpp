// ondine/lower/packed_weights.hpp - constants reordered into oneDNN's layouts, shared between the
// models compiled from one graph (the specialisations of a ShapeCache, one per input shape).
//
//   auto shared = std::make_shared<ondine::lower::PackedWeights>();
//   options.packed_weights = shared;           // every compile() with these options shares packings
//
// A packing is keyed by the constant's bytes (dtype, dims and content: each compile clones and folds
// the graph again, so equal weights need not be the same buffer) and by the oneDNN memory descriptor
// it is packed into. Matmul weights get one descriptor whatever the batch or sequence length, so every
// shape reuses the first packing; convolution weights may be blocked differently for another spatial
// size or thread count, and each distinct layout is stored once. Policy: packings live as long as the
// PackedWeights (the ShapeCache's lifetime); none is dropped when a compiled model is evicted, since
// the next shape usually wants the same ones. Thread-safe: concurrent compiles may share one. The
// source bytes are not kept (a folded weight would stay alive twice): two independent 64-bit hashes
// of them stand in for a comparison.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "oneapi/dnnl/dnnl.hpp"
#include "ondine/ir/tensor.hpp"

namespace ondine::lower {

class PackedWeights {
 public:
  // The engine the packings live on: every compile sharing them runs on it too (oneDNN wants a
  // primitive's memory on the primitive's engine).
  const dnnl::engine& engine() const { return engine_; }

  // The packing of `source` into `want`: the one stored for equal bytes and an equal descriptor, else
  // `pack()`'s result, stored.
  dnnl::memory get(const Tensor& source, const dnnl::memory::desc& want, const std::function<dnnl::memory()>& pack) {
    const Key key = key_of(source);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (dnnl::memory* found = find(key, want)) {
        ++hits_;
        return *found;
      }
    }
    dnnl::memory packed = pack();  // outside the lock: packing a large weight takes a while
    std::lock_guard<std::mutex> lock(mutex_);
    if (dnnl::memory* found = find(key, want)) return *found;  // another compile packed it meanwhile
    entries_.emplace(key.first, Entry{key.second, want, packed});
    bytes_ += want.get_size();
    return packed;
  }

  // Bytes of all packings held, their number, and how many requests found one already packed.
  std::size_t bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return bytes_;
  }
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }
  std::size_t hits() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return hits_;
  }

 private:
  // (hash one, hash two): std::hash of the bytes, and a word-wise multiply-xorshift hash with the dims.
  using Key = std::pair<std::size_t, std::uint64_t>;
  struct Entry {
    std::uint64_t check;
    dnnl::memory::desc md;
    dnnl::memory packed;
  };

  static Key key_of(const Tensor& t) {
    const auto bytes = static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype());
    const char* p = static_cast<const char*>(t.raw());
    std::size_t h1 = std::hash<std::string_view>()(std::string_view(p, bytes));
    std::uint64_t h2 = 0x9e3779b97f4a7c15ull ^ static_cast<std::uint64_t>(t.dtype());
    auto mix = [&h2](std::uint64_t w) {
      h2 = (h2 ^ w) * 0xff51afd7ed558ccdull;
      h2 ^= h2 >> 33;
    };
    for (auto d : t.dims()) mix(static_cast<std::uint64_t>(d));
    std::size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
      std::uint64_t w;
      std::memcpy(&w, p + i, 8);
      mix(w);
    }
    std::uint64_t tail = 0;
    std::memcpy(&tail, p + i, bytes - i);
    mix(tail ^ bytes);
    return {h1, h2};
  }
  dnnl::memory* find(const Key& key, const dnnl::memory::desc& want) {
    auto range = entries_.equal_range(key.first);
    for (auto it = range.first; it != range.second; ++it)
      if (it->second.check == key.second && it->second.md == want) return &it->second.packed;
    return nullptr;
  }

  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  mutable std::mutex mutex_;
  std::unordered_multimap<std::size_t, Entry> entries_;
  std::size_t bytes_ = 0, hits_ = 0;
};

}  // namespace ondine::lower
