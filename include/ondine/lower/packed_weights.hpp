// SPDX-License-Identifier: Apache-2.0
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
// Artifacts (lower/artifact.hpp) store the packings a compile made and preload them here: by the
// address of their source constant in the mapped file (found without hashing it), or by the two hashes
// for sources the lowering derived (transposed, gate-reordered); a preloaded packing is used only for an
// equal descriptor, else the weight is packed again, which packed_here() counts and repacks() explains
// (the step, and the layout stored beside the one oneDNN chose here, or that none was stored).
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "ondine/ir/tensor.hpp"
#include "ondine/lower/detail/layout_name.hpp"

namespace ondine::lower {

class PackedWeights {
 public:
  // The engine the packings live on: every compile sharing them runs on it too (oneDNN wants a
  // primitive's memory on the primitive's engine).
  const dnnl::engine& engine() const { return engine_; }

  // The packing of `source` into `want`: the one stored for equal bytes and an equal descriptor, else
  // `pack()`'s result, stored. `layout` tells apart two readings of the same bytes (0: row-major; a
  // transposed constant read through strides: another value).
  // `step` names the step asking (for repacks()).
  dnnl::memory get(const Tensor& source, const dnnl::memory::desc& want, const std::function<dnnl::memory()>& pack,
                   std::uint64_t layout = 0, const std::string& step = "") {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto range = by_address_.equal_range(source.raw());
      for (auto it = range.first; it != range.second; ++it)
        if (it->second.bytes == source.nbytes() && it->second.layout == layout && it->second.md == want) {
          ++hits_;
          ++preloaded_hits_;
          return it->second.packed;
        }
    }
    Key key = key_of(source);
    key.second ^= layout * 0x9e3779b97f4a7c15ull;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (Entry* found = find(key, want)) {
        ++hits_;
        if (found->preloaded) ++preloaded_hits_;
        return found->packed;
      }
    }
    dnnl::memory packed = pack();  // outside the lock: packing a large weight takes a while
    std::lock_guard<std::mutex> lock(mutex_);
    if (Entry* found = find(key, want)) return found->packed;  // another compile packed it meanwhile
    if (preloaded_ || expect_stored_) repacks_.push_back({step, repack_reason(source, key, want, layout)});
    entries_.emplace(key.first, Entry{key.second, want, packed, source.raw(), source.nbytes(), layout, false});
    bytes_ += want.get_size();
    ++packed_here_;
    return packed;
  }

  // A weight an artifact did not answer for: the step that packed it, and why ("stored as aBcd16b, oneDNN
  // chose ABcd16b16a here", or "not stored").
  struct Repack {
    std::string step, reason;
  };
  std::vector<Repack> repacks() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return repacks_;
  }
  // Records repacks() even with nothing preloaded (an artifact variant written without packed weights).
  void expect_stored() {
    std::lock_guard<std::mutex> lock(mutex_);
    expect_stored_ = true;
  }

  // The layout a repack names: data type and oneDNN's notation ("f32:ABcd16b16a", "bf16:ab").
  static std::string layout_text(const dnnl::memory::desc& md) {
    std::string name = detail::layout_name(md);
    if (auto colon = name.find(':'); colon != std::string::npos) name.erase(colon);
    switch (md.data.data_type) {
      case dnnl_f32: return "f32:" + name;
      case dnnl_bf16: return "bf16:" + name;
      case dnnl_s8: return "s8:" + name;
      case dnnl_u8: return "u8:" + name;
      case dnnl_s32: return "s32:" + name;
      default: return name;
    }
  }
  // One packing, as an artifact stores it: its source's address (when the lowering packed a constant as
  // it is) and hashes, the descriptor, the packed memory.
  struct Record {
    const void* source = nullptr;
    std::size_t source_bytes = 0;
    std::uint64_t layout = 0;
    std::size_t hash = 0;
    std::uint64_t check = 0;
    dnnl::memory::desc md;
    dnnl::memory packed;
  };
  std::vector<Record> records() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Record> out;
    for (const auto& [hash, e] : entries_) out.push_back({e.source, e.source_bytes, e.layout, hash, e.check, e.md, e.packed});
    return out;
  }
  // Preloads a packing of the constant whose bytes are at `source` (`bytes` long), found by address.
  void preload_by_address(const void* source, std::size_t bytes, std::uint64_t layout, const dnnl::memory::desc& md,
                          dnnl::memory packed) {
    std::lock_guard<std::mutex> lock(mutex_);
    by_address_.emplace(source, AddressEntry{bytes, layout, md, packed});
    preloaded_ += 1;
  }
  // Preloads a packing of a derived source, found by its hashes.
  void preload_by_hash(std::size_t hash, std::uint64_t check, const dnnl::memory::desc& md, dnnl::memory packed) {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.emplace(hash, Entry{check, md, packed, nullptr, 0, 0, true});
    preloaded_ += 1;
  }
  // Keeps `owner` (the mapped file preloaded packings point into) alive as long as these packings.
  void keep_alive(std::shared_ptr<void> owner) {
    std::lock_guard<std::mutex> lock(mutex_);
    owners_.push_back(std::move(owner));
  }
  // Preloaded packings, how many requests one of them answered, and how many weights were packed here.
  std::size_t preloaded() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return preloaded_;
  }
  std::size_t preloaded_hits() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return preloaded_hits_;
  }
  std::size_t packed_here() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return packed_here_;
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
    const void* source;  // the bytes it was packed from when packed here (for records())
    std::size_t source_bytes;
    std::uint64_t layout;
    bool preloaded;
  };
  struct AddressEntry {
    std::size_t bytes;
    std::uint64_t layout;
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
  // Why `source` (hashes `key`) was packed here for `want`: a stored packing of it in another layout, or none.
  std::string repack_reason(const Tensor& source, const Key& key, const dnnl::memory::desc& want, std::uint64_t layout) const {
    std::string stored;
    auto range = by_address_.equal_range(source.raw());
    for (auto it = range.first; it != range.second && stored.empty(); ++it)
      if (it->second.bytes == source.nbytes() && it->second.layout == layout) stored = layout_text(it->second.md);
    auto hashed = entries_.equal_range(key.first);
    for (auto it = hashed.first; it != hashed.second && stored.empty(); ++it)
      if (it->second.preloaded && it->second.check == key.second) stored = layout_text(it->second.md);
    if (stored.empty()) return "not stored (" + layout_text(want) + " here)";
    return "stored as " + stored + ", oneDNN chose " + layout_text(want) + " here";
  }
  Entry* find(const Key& key, const dnnl::memory::desc& want) {
    auto range = entries_.equal_range(key.first);
    for (auto it = range.first; it != range.second; ++it)
      if (it->second.check == key.second && it->second.md == want) return &it->second;
    return nullptr;
  }

 public:
  // The hashes that key a source's bytes (what records() gives for a derived source).
  static std::pair<std::size_t, std::uint64_t> hashes(const Tensor& t) { return key_of(t); }

 private:

  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  mutable std::mutex mutex_;
  std::unordered_multimap<std::size_t, Entry> entries_;
  std::unordered_multimap<const void*, AddressEntry> by_address_;
  std::vector<std::shared_ptr<void>> owners_;
  std::vector<Repack> repacks_;
  bool expect_stored_ = false;
  std::size_t bytes_ = 0, hits_ = 0, preloaded_ = 0, preloaded_hits_ = 0, packed_here_ = 0;
};

}  // namespace ondine::lower
