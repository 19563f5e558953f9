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
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace ondine::detail {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

// A block of at least `bytes` (> 0), 64-byte aligned (2 MiB for large blocks); release with std::free.
inline void* aligned_allocate(std::size_t bytes) {
  const std::size_t align = bytes >= kHugePage ? kHugePage : 64;
  const std::size_t size = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, size);
  if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (align == kHugePage) ::madvise(p, size, MADV_HUGEPAGE);  // advice only: failure changes nothing
#endif
  return p;
}

}  // namespace ondine::detail
