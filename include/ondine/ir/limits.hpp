// SPDX-License-Identifier: Apache-2.0
// ondine/ir/limits.hpp - the bounds a model must stay within, checked before anything is allocated.
//
// A model file comes from outside (a model hub, a user upload): a corrupt or hostile one must fail with
// an ondine::Error, never exhaust memory, overflow a size computation or recurse without bound. The
// limits are checked where sizes first become known:
//   - the model file's size, before it is read (onnx/import.hpp);
//   - every tensor's byte size: initializers and attribute tensors before their data is copied
//     (onnx/import.hpp), every node output and graph input with a static shape during shape inference
//     (ir/shape_inference.hpp: a 2^60-element ConstantOfShape fails at import or compile, naming the
//     node), and every Tensor allocation (ir/tensor.hpp: shapes only known at run time);
//   - element counts whose product overflows int64 (ignoring zero dims, whose strides still overflow);
//   - how deeply subgraphs (If, Loop, Scan bodies) nest (onnx/import.hpp).
// The limits are process-wide (`set_limits`), read atomically, so that code deep inside a kernel sees
// the same bounds as the importer; a host that runs untrusted models lowers them once at start-up.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#include "ondine/error.hpp"

namespace ondine {

struct Limits {
  // Size of an ONNX file read in one piece; protobuf itself cannot parse more than 2 GB - 1.
  std::uint64_t max_model_bytes = (std::uint64_t{1} << 31) - 1;
  // Bytes of any one tensor: an initializer, a node output of static shape, a run-time allocation.
  // Default: the machine's physical memory (a tensor larger than that cannot be useful).
  std::uint64_t max_tensor_bytes = physical_memory_bytes();
  // Nesting of subgraphs in subgraphs (a model's own graph is depth 0). Real models nest 1-3 deep.
  int max_subgraph_depth = 16;

  // The machine's physical memory in bytes (64 GiB when it cannot be asked).
  static std::uint64_t physical_memory_bytes() {
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
#endif
    return std::uint64_t{64} << 30;
  }
};

namespace detail {
struct LimitsStore {
  std::atomic<std::uint64_t> max_model_bytes, max_tensor_bytes;
  std::atomic<int> max_subgraph_depth;
  LimitsStore() { store(Limits{}); }
  void store(const Limits& l) {
    max_model_bytes.store(l.max_model_bytes, std::memory_order_relaxed);
    max_tensor_bytes.store(l.max_tensor_bytes, std::memory_order_relaxed);
    max_subgraph_depth.store(l.max_subgraph_depth, std::memory_order_relaxed);
  }
};
inline LimitsStore& limits_store() {
  static LimitsStore store;
  return store;
}
}  // namespace detail

// The limits in force.
inline Limits limits() {
  auto& s = detail::limits_store();
  Limits l;
  l.max_model_bytes = s.max_model_bytes.load(std::memory_order_relaxed);
  l.max_tensor_bytes = s.max_tensor_bytes.load(std::memory_order_relaxed);
  l.max_subgraph_depth = s.max_subgraph_depth.load(std::memory_order_relaxed);
  return l;
}
inline void set_limits(const Limits& l) { detail::limits_store().store(l); }
inline std::uint64_t max_tensor_bytes() {
  return detail::limits_store().max_tensor_bytes.load(std::memory_order_relaxed);
}

// Sets limits for a scope and restores the previous ones at its end (tests, a host's one call).
class ScopedLimits {
 public:
  explicit ScopedLimits(const Limits& l) : saved_(limits()) { set_limits(l); }
  ~ScopedLimits() { set_limits(saved_); }
  ScopedLimits(const ScopedLimits&) = delete;
  ScopedLimits& operator=(const ScopedLimits&) = delete;

 private:
  Limits saved_;
};

namespace detail {

inline std::string dims_text(const std::vector<std::int64_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

// The byte size of a tensor of `dims` with elements of `width` bytes, or an Error when a dim is negative,
// the product of the nonzero dims overflows int64, or the size passes Limits::max_tensor_bytes. `what`
// names the tensor in the message ("tensor 'w'", "output 'y'").
inline std::uint64_t checked_tensor_bytes(const std::vector<std::int64_t>& dims, std::size_t width,
                                          const std::string& what) {
  std::uint64_t nonzero = 1;  // product of the nonzero dims: strides are computed from them
  bool zero = false;
  constexpr std::uint64_t kMaxElements = static_cast<std::uint64_t>(INT64_MAX);
  for (std::int64_t d : dims) {
    if (d < 0) throw Error(what + ": negative dimension in shape " + dims_text(dims));
    if (d == 0) {
      zero = true;
      continue;
    }
    if (nonzero > kMaxElements / static_cast<std::uint64_t>(d))
      throw Error(what + ": the element count of shape " + dims_text(dims) + " overflows int64");
    nonzero *= static_cast<std::uint64_t>(d);
  }
  if (zero) return 0;
  const std::uint64_t cap = max_tensor_bytes();
  const std::uint64_t w = width ? width : 1;
  if (nonzero > cap / w)
    throw Error(what + ": shape " + dims_text(dims) + " needs " +
                (nonzero > UINT64_MAX / w ? std::string("more than 2^64") : std::to_string(nonzero * w)) +
                " bytes, over the limit of " + std::to_string(cap) + " bytes per tensor (ondine::Limits)");
  return nonzero * w;
}

}  // namespace detail
}  // namespace ondine
