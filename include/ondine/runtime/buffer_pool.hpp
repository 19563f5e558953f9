// SPDX-License-Identifier: Apache-2.0
// ondine/runtime/buffer_pool.hpp - tensors whose storage returns to a pool when the last reference drops.
//
// Why: a model run at shapes that change from call to call (lower/dynamic.hpp) cannot place its values
// in one arena planned ahead; allocating each value afresh would pay the allocator and, for large
// blocks, the page faults of fresh memory on every call. The pool keeps released blocks and hands the
// smallest one that fits (at most twice the request, so a short sequence does not pin a long one's
// block) to the next request: after a few calls at the longest shapes a workload uses, runs allocate
// nothing. It grows to the largest working set seen and never shrinks (trim() empties it).
//
// Thread-safe: blocks may be taken by one thread and released by another (an output the caller drops
// later). The pool outlives every tensor it handed out (each holds a reference to it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "ondine/ir/allocate.hpp"
#include "ondine/ir/tensor.hpp"

namespace ondine::runtime {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static std::shared_ptr<BufferPool> make() { return std::shared_ptr<BufferPool>(new BufferPool()); }
  ~BufferPool() { trim(); }
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A tensor of `dtype` and `dims` whose contents are undefined (its producer writes all of it).
  Tensor tensor(DType dtype, std::vector<std::int64_t> dims) {
    const std::size_t bytes = ondine::detail::checked_tensor_bytes(dims, dtype_size(dtype), "tensor");
    if (bytes == 0) return Tensor(dtype, std::move(dims));
    auto [p, capacity] = take(bytes);
    std::shared_ptr<BufferPool> self = shared_from_this();
    std::shared_ptr<void> owner(p, [self, capacity = capacity](void* q) { self->give(q, capacity); });
    return Tensor::adopt(dtype, std::move(dims), p, std::move(owner));
  }

  // Bytes held by the pool, in use and idle.
  std::size_t bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return bytes_;
  }
  std::size_t idle_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t n = 0;
    for (auto& [size, p] : idle_) n += size;
    return n;
  }
  // Returns the idle blocks to the heap.
  void trim() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, p] : idle_) {
      ondine::detail::aligned_release(p, size);
      bytes_ -= size;
    }
    idle_.clear();
  }

 private:
  BufferPool() = default;

  std::pair<void*, std::size_t> take(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = idle_.lower_bound(bytes);
      if (it != idle_.end() && it->first <= 2 * bytes + 4096) {
        std::pair<void*, std::size_t> block{it->second, it->first};
        idle_.erase(it);
        return block;
      }
    }
    const std::size_t capacity = size_class(bytes);
    void* p = ondine::detail::aligned_allocate(capacity);
    std::lock_guard<std::mutex> lock(mutex_);
    bytes_ += capacity;
    return {p, capacity};
  }
  void give(void* p, std::size_t capacity) {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.emplace(capacity, p);
  }

  // The capacity of a fresh block for `bytes`: small ones rounded to 64 bytes, up to 64 KiB to pages, up to
  // 1 MiB to one of four sizes per doubling (at most 25% more), larger ones to whole huge pages (2 MiB, which
  // aligned_allocate asks the kernel to back with huge pages: one page fault per 2 MiB instead of 512). A
  // value that grows a little at every call (a decoder's KV cache, one row per token) then fits the block it
  // had for a run of calls instead of needing a fresh, page-faulting one each time; blocks of nearby sizes
  // serve each other.
  static std::size_t size_class(std::size_t bytes) {
    if (bytes <= 4096) return (bytes + 63) / 64 * 64;
    if (bytes <= 65536) return (bytes + 4095) / 4096 * 4096;
    if (bytes > (std::size_t(1) << 20)) return (bytes + ondine::detail::kHugePage - 1) / ondine::detail::kHugePage * ondine::detail::kHugePage;
    std::size_t power = 65536;
    while (power * 2 < bytes) power *= 2;  // power < bytes <= 2 * power
    const std::size_t step = power / 4;
    return (bytes + step - 1) / step * step;
  }

  mutable std::mutex mutex_;
  std::multimap<std::size_t, void*> idle_;  // capacity -> block
  std::size_t bytes_ = 0;
};

}  // namespace ondine::runtime
