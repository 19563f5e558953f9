// SPDX-License-Identifier: Apache-2.0
// ondine/ir/allocate.hpp - aligned heap blocks for tensors and arenas, on huge pages when large.
//
// Why: on the virtual machines Ondine is measured on, a 4 KiB page fault costs ~30 us, so touching a
// fresh 100 MB block (ResNet-50's weights, once on import and again for each weight a pass rewrites)
// costs ~0.8 s in faults alone; with 2 MiB pages it is ~20 ms. Blocks of 2 MiB and more are therefore
// 2 MiB aligned and advised as huge pages (Linux transparent huge pages in "madvise" mode, the Debian
// default). Elsewhere, or when the kernel declines, they are ordinary aligned blocks.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace ondine::detail {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

// Large blocks released by aligned_release, kept for the next request of the same size: a compiled model's
// outputs are allocated for each run and freed by the caller, and a fresh block pays its page faults and the
// kernel's zeroing again (LR-ASPP's 22.7 MB of scores at batch 1: ~2 ms a run). At most kLimit bytes are kept,
// the oldest returned to the heap first. Never destroyed (tensors may be freed during static destruction).
class BlockCache {
 public:
  static constexpr std::size_t kLimit = std::size_t{256} << 20;
  static BlockCache& instance() {
    static BlockCache* cache = new BlockCache();
    return *cache;
  }
  void* take(std::size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t i = blocks_.size(); i-- > 0;)
      if (blocks_[i].first == size) {
        void* p = blocks_[i].second;
        blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
        bytes_ -= size;
        return p;
      }
    return nullptr;
  }
  void give(void* p, std::size_t size) {
    if (size > kLimit) return std::free(p);
    std::lock_guard<std::mutex> lock(mutex_);
    while (bytes_ + size > kLimit && !blocks_.empty()) {
      std::free(blocks_.front().second);
      bytes_ -= blocks_.front().first;
      blocks_.erase(blocks_.begin());
    }
    blocks_.emplace_back(size, p);
    bytes_ += size;
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<std::size_t, void*>> blocks_;  // (size, block), the most recently released last
  std::size_t bytes_ = 0;
};

inline std::size_t block_size(std::size_t bytes, std::size_t align) { return (bytes + align - 1) / align * align; }

// A block of at least `bytes` (> 0), 64-byte aligned (2 MiB for large blocks); release with aligned_release
// (or std::free, which skips the cache).
inline void* aligned_allocate(std::size_t bytes) {
  const std::size_t align = bytes >= kHugePage ? kHugePage : 64;
  const std::size_t size = block_size(bytes, align);
  if (align == kHugePage)
    if (void* cached = BlockCache::instance().take(size)) return cached;
  void* p = std::aligned_alloc(align, size);
  if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (align == kHugePage) ::madvise(p, size, MADV_HUGEPAGE);  // advice only: failure changes nothing
#endif
  return p;
}

// Releases a block of aligned_allocate(bytes): a large one into the BlockCache, others to the heap.
inline void aligned_release(void* p, std::size_t bytes) {
  if (!p) return;
  if (bytes >= kHugePage) return BlockCache::instance().give(p, block_size(bytes, kHugePage));
  std::free(p);
}

}  // namespace ondine::detail
