// SPDX-License-Identifier: Apache-2.0
// ondine/runtime/memory_plan.hpp - a static memory plan: every intermediate buffer gets an offset in
// one arena, and buffers whose lifetimes do not overlap share bytes.
//
// Lifetimes are closed intervals of step indices [first, last]: the step that writes the buffer up to
// the last step that reads it. Two buffers live at the same step never overlap in memory, so a step's
// inputs and outputs are always distinct. Placement is "greedy by size, best fit" (as in TFLite's arena
// planner): the largest buffers are placed first, each in the smallest gap left between the buffers
// already placed that it overlaps in time, or above all of them. Every size is rounded up to the
// alignment and every offset is a multiple of it. No library dependency.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "ondine/error.hpp"

namespace ondine::runtime {

struct BufferLifetime {
  std::size_t bytes = 0;
  std::size_t first = 0;  // step that writes it
  std::size_t last = 0;   // last step that reads it (>= first)
};

struct MemoryPlan {
  std::vector<std::size_t> offsets;  // one per buffer, in the order given
  std::size_t alignment = 64;
  std::size_t arena_bytes = 0;  // the arena's size: max over buffers of offset + aligned size
  std::size_t peak_bytes = 0;   // max over steps of the aligned bytes live at that step (a lower bound)
  std::size_t total_bytes = 0;  // sum of all aligned sizes: what one buffer per value would need
};

inline std::size_t align_up(std::size_t n, std::size_t alignment) { return (n + alignment - 1) / alignment * alignment; }

inline bool lifetimes_overlap(const BufferLifetime& a, const BufferLifetime& b) {
  return a.first <= b.last && b.first <= a.last;
}

inline MemoryPlan plan_memory(const std::vector<BufferLifetime>& buffers, std::size_t alignment = 64) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    throw Error("memory plan: alignment " + std::to_string(alignment) + " is not a power of two");
  for (std::size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i].last < buffers[i].first)
      throw Error("memory plan: buffer #" + std::to_string(i) + " ends (step " + std::to_string(buffers[i].last) +
                  ") before it starts (step " + std::to_string(buffers[i].first) + ")");
  MemoryPlan plan;
  plan.alignment = alignment;
  plan.offsets.assign(buffers.size(), 0);
  std::vector<std::size_t> size(buffers.size());
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    size[i] = align_up(buffers[i].bytes, alignment);
    plan.total_bytes += size[i];
  }

  // Largest first; ties by earlier start so the result does not depend on the sort's stability.
  std::vector<std::size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (size[a] != size[b]) return size[a] > size[b];
    return buffers[a].first < buffers[b].first;
  });
  std::vector<std::size_t> placed;  // buffer indices, kept sorted by offset
  for (std::size_t i : order) {
    if (size[i] == 0) continue;  // takes no space; offset 0
    std::size_t best = std::numeric_limits<std::size_t>::max(), best_gap = best, top = 0;
    for (std::size_t p : placed) {
      if (!lifetimes_overlap(buffers[i], buffers[p])) continue;
      std::size_t gap_begin = top, gap_end = plan.offsets[p];
      if (gap_end > gap_begin) {
        std::size_t gap = gap_end - gap_begin;
        if (gap >= size[i] && gap < best_gap) {
          best_gap = gap;
          best = gap_begin;
        }
      }
      top = std::max(top, plan.offsets[p] + size[p]);
    }
    plan.offsets[i] = best != std::numeric_limits<std::size_t>::max() ? best : top;
    plan.arena_bytes = std::max(plan.arena_bytes, plan.offsets[i] + size[i]);
    placed.insert(std::upper_bound(placed.begin(), placed.end(), i,
                                   [&](std::size_t a, std::size_t b) { return plan.offsets[a] < plan.offsets[b]; }),
                  i);
  }

  // Peak: sweep the step axis with +size at `first` and -size after `last`.
  std::vector<std::pair<std::size_t, std::int64_t>> events;  // (position, delta); frees sort before allocs
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (!size[i]) continue;
    events.emplace_back(2 * buffers[i].first + 1, static_cast<std::int64_t>(size[i]));
    events.emplace_back(2 * (buffers[i].last + 1), -static_cast<std::int64_t>(size[i]));
  }
  std::sort(events.begin(), events.end());
  std::int64_t live = 0;
  for (auto& [pos, delta] : events) {
    (void)pos;
    live += delta;
    plan.peak_bytes = std::max(plan.peak_bytes, static_cast<std::size_t>(live));
  }
  return plan;
}

}  // namespace ondine::runtime
