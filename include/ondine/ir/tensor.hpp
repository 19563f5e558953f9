// SPDX-License-Identifier: Apache-2.0
// ondine/ir/tensor.hpp - a dense, row-major tensor with shared storage.
//
// Copies are shallow (they share storage), like a view; clone() makes a deep copy. Storage is 64-byte
// aligned (large blocks on huge pages: ir/allocate.hpp) so kernels can use aligned loads, and may
// also be borrowed from elsewhere (a mapped file).
//
// A Tensor also carries ONNX's two non-tensor values, so that the executor, the kernel signature and
// every map of named values pass them unchanged: a sequence of tensors (Kind::Sequence: dtype() is the
// element type, items() the elements, no data of its own) and an optional without a value
// (Kind::None). An optional that holds a value is carried as that value. Only the sequence and
// optional ops (reference/sequence.hpp) look inside; a dense-tensor kernel given one fails its checks.
//
// A string tensor (DType::String) keeps its elements in a shared vector of std::string (they vary in
// length, so they are not bytes in the storage): Tensor::from_strings, strings(). Only the ops that take
// strings (StringNormalizer) read them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/allocate.hpp"
#include "ondine/ir/dtype.hpp"
#include "ondine/ir/limits.hpp"
#include "ondine/ir/shape.hpp"

namespace ondine {

class Tensor {
 public:
  Tensor() = default;
  // Allocates zero-filled storage.
  Tensor(DType dtype, std::vector<std::int64_t> dims) : dtype_(dtype), dims_(std::move(dims)) {
    // Reject sizes whose byte count would overflow or pass the memory limit before anything is
    // allocated (a wrapped size would allocate a small buffer and then write past it).
    detail::checked_tensor_bytes(dims_, dtype_size(dtype), "tensor");
    std::size_t bytes = nbytes();
    void* p = bytes ? detail::aligned_allocate(bytes) : nullptr;
    if (p) std::memset(p, 0, bytes);
    storage_ = std::shared_ptr<void>(p, [bytes](void* q) { detail::aligned_release(q, bytes); });
    data_ = p;
    owns_allocation_ = true;
  }
  // Storage left as the allocator returns it, for a tensor its producer writes in full before anyone reads
  // it (a compiled model's outputs): no zero-filling pass over it.
  static Tensor uninitialized(DType dtype, std::vector<std::int64_t> dims) {
    Tensor t;
    t.dtype_ = dtype;
    t.dims_ = std::move(dims);
    detail::checked_tensor_bytes(t.dims_, dtype_size(dtype), "tensor");
    const std::size_t bytes = t.nbytes();
    void* p = bytes ? detail::aligned_allocate(bytes) : nullptr;
    t.storage_ = std::shared_ptr<void>(p, [bytes](void* q) { detail::aligned_release(q, bytes); });
    t.data_ = p;
    t.owns_allocation_ = true;
    return t;
  }
  // Wraps memory owned by `owner` (no copy).
  Tensor(DType dtype, std::vector<std::int64_t> dims, void* data, std::shared_ptr<void> owner)
      : dtype_(dtype), dims_(std::move(dims)), storage_(std::move(owner)), data_(data) {}
  // Wraps a block of writable memory that only this tensor and its copies use, released by `owner`'s
  // deleter (a pool's block: runtime/buffer_pool.hpp): is_sole_owner() can be true, as for allocate.
  static Tensor adopt(DType dtype, std::vector<std::int64_t> dims, void* data, std::shared_ptr<void> owner) {
    Tensor t(dtype, std::move(dims), data, std::move(owner));
    t.owns_allocation_ = true;
    return t;
  }

  // True when no other Tensor shares this storage and the storage is a heap block of its own (not
  // wrapped, possibly read-only memory): the data may then be changed in place without anyone seeing.
  bool is_sole_owner() const { return owns_allocation_ && storage_ && storage_.use_count() == 1; }

  template <typename T>
  static Tensor from_vector(std::vector<std::int64_t> dims, const std::vector<T>& values) {
    Tensor t(dtype_v<T>, std::move(dims));
    detail::check(static_cast<std::size_t>(t.numel()) == values.size(),
                  "from_vector: " + std::to_string(values.size()) + " values for shape " + dims_str(t.dims()));
    if constexpr (std::is_same_v<T, bool>) {
      for (std::size_t i = 0; i < values.size(); ++i) t.data<bool>()[i] = values[i];
    } else {
      if (!values.empty()) std::memcpy(t.raw(), values.data(), values.size() * sizeof(T));
    }
    return t;
  }
  template <typename T>
  static Tensor scalar(T v) { return from_vector<T>({}, std::vector<T>{v}); }

  // A string tensor of `dims` holding `values` (row-major).
  static Tensor from_strings(std::vector<std::int64_t> dims, std::vector<std::string> values) {
    Tensor t(DType::String, std::move(dims));
    detail::check(static_cast<std::size_t>(t.numel()) == values.size(),
                  "from_strings: " + std::to_string(values.size()) + " strings for shape " + dims_str(t.dims()));
    t.strings_ = std::make_shared<const std::vector<std::string>>(std::move(values));
    return t;
  }
  // False for a string placeholder (dims only: a model file's string value Ondine does not compute on).
  bool has_strings() const { return strings_ != nullptr; }
  // A string tensor's elements (shared and immutable, like a sequence's).
  const std::vector<std::string>& strings() const {
    detail::check(dtype_ == DType::String && strings_, "strings() of a tensor that holds no strings");
    return *strings_;
  }

  enum class Kind : std::uint8_t { Dense, Sequence, None };
  // A sequence of `items`, each of dtype `elem` (checked: ONNX sequences are homogeneous in type).
  static Tensor sequence(DType elem, std::vector<Tensor> items) {
    for (const Tensor& t : items)
      detail::check(t.kind_ == Kind::Dense && t.dtype_ == elem,
                    "sequence of " + std::string(dtype_name(elem)) + " given an element of " +
                        std::string(dtype_name(t.dtype_)));
    Tensor s;
    s.kind_ = Kind::Sequence;
    s.dtype_ = elem;
    s.items_ = std::make_shared<const std::vector<Tensor>>(std::move(items));
    return s;
  }
  // An optional with no value (an empty optional input is still a value, unlike an omitted input).
  static Tensor none() {
    Tensor s;
    s.kind_ = Kind::None;
    return s;
  }
  Kind kind() const { return kind_; }
  bool is_sequence() const { return kind_ == Kind::Sequence; }
  bool is_none() const { return kind_ == Kind::None; }
  // The elements of a sequence (shared, immutable: sequence ops build new sequences).
  const std::vector<Tensor>& items() const {
    detail::check(kind_ == Kind::Sequence, "items() of a value that is not a sequence");
    return *items_;
  }

  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& dims() const { return dims_; }
  std::size_t rank() const { return dims_.size(); }
  Shape shape() const { return Shape::from(dims_); }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : dims_) n *= d;
    return n;
  }
  std::size_t nbytes() const {
    return kind_ == Kind::Dense ? static_cast<std::size_t>(numel()) * dtype_size(dtype_) : 0;
  }
  // An omitted optional input: no value at all (an optional without a value is none(), not empty).
  bool empty() const { return kind_ == Kind::Dense && dtype_ == DType::Undefined; }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  template <typename T> T* data() {
    check_type<T>();
    return static_cast<T*>(data_);
  }
  template <typename T> const T* data() const {
    check_type<T>();
    return static_cast<const T*>(data_);
  }

  // Element i converted to double / int64, whatever the dtype (for shape-like and test code).
  double at_double(std::size_t i) const { return load_as_double(dtype_, data_, i); }
  std::int64_t at_int(std::size_t i) const { return saturate_to_int64(at_double(i)); }
  // All elements as int64 (for shape/axes/indices tensors; integer dtypes are read exactly).
  std::vector<std::int64_t> to_int64s() const {
    std::vector<std::int64_t> out(static_cast<std::size_t>(numel()));
    dispatch_dtype(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* p = static_cast<const T*>(data_);
      for (std::size_t i = 0; i < out.size(); ++i) {
        if constexpr (std::is_integral_v<T>) out[i] = static_cast<std::int64_t>(p[i]);
        else out[i] = saturate_to_int64(static_cast<double>(p[i]));
      }
    });
    return out;
  }
  std::vector<float> to_floats() const {
    std::vector<float> out(static_cast<std::size_t>(numel()));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(at_double(i));
    return out;
  }

  Tensor clone() const {
    // Sequences, none and strings are immutable: sharing them is a copy.
    if (kind_ != Kind::Dense || dtype_ == DType::String) return *this;
    Tensor t(dtype_, dims_);
    if (nbytes()) std::memcpy(t.raw(), data_, nbytes());
    return t;
  }
  // The first elements of this dense tensor's storage seen as `dims`, which may hold fewer elements (an
  // output written into a larger buffer the caller gave: runtime/output_binding.hpp).
  Tensor prefix_view(std::vector<std::int64_t> dims) const {
    Tensor t = *this;
    t.dims_ = std::move(dims);
    detail::check(kind_ == Kind::Dense && t.numel() <= numel(),
                  "a view of " + dims_str(t.dims_) + " within " + dims_str(dims_) + " holds more elements");
    return t;
  }
  // Same storage, new dims with the same element count.
  Tensor reshaped(std::vector<std::int64_t> dims) const {
    Tensor t = *this;
    t.dims_ = std::move(dims);
    detail::check(t.numel() == numel(), "reshape of " + dims_str(dims_) + " to " + dims_str(t.dims_) +
                                            " changes the element count");
    return t;
  }

 private:
  // double -> int64 without undefined behaviour: NaN becomes 0, out-of-range values saturate.
  static std::int64_t saturate_to_int64(double v) {
    if (std::isnan(v)) return 0;
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    return static_cast<std::int64_t>(v);
  }
  template <typename T> void check_type() const {
    if (dtype_v<T> != int4_storage(dtype_))  // 4-bit types are read through their byte storage
      throw Error("tensor of " + std::string(dtype_name(dtype_)) + " accessed as " +
                  std::string(dtype_name(dtype_v<T>)));
  }

  DType dtype_ = DType::Undefined;
  std::vector<std::int64_t> dims_;
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  bool owns_allocation_ = false;  // storage_ is this class's own heap block (not wrapped memory)
  Kind kind_ = Kind::Dense;
  std::shared_ptr<const std::vector<Tensor>> items_;  // Kind::Sequence's elements
  std::shared_ptr<const std::vector<std::string>> strings_;  // DType::String's elements
};

}  // namespace ondine
