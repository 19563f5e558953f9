// SPDX-License-Identifier: Apache-2.0
// ondine/ir/typed_tensor.hpp - TypedTensor<T, Rank>: a Tensor whose element type and rank are part of its C++
// type, the accessor the headers generated for compiled models (`ondine header`, ondine_add_model) hand out.
//
//   ondine::TypedTensor<float, 4> image({1, 3, 224, 224});   // zero-filled
//   image(0, 2, 10, 10) = 0.5f;                              // row-major, unchecked
//   image.at(0, 3, 0, 0);                                    // checked: throws ondine::Error
//   for (float& x : image) x = 1.0f;
//
// It shares storage with the Tensor it wraps (copies are shallow, as Tensor's are); tensor() gives that Tensor
// back for the untyped API. Wrapping a Tensor checks its dtype and rank once, so the accessors need not.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/dtype.hpp"
#include "ondine/ir/tensor.hpp"

namespace ondine {

template <typename T, std::size_t Rank>
class TypedTensor {
 public:
  using value_type = T;
  static constexpr std::size_t rank = Rank;

  TypedTensor() = default;
  // Zero-filled storage of these dims.
  explicit TypedTensor(const std::array<std::int64_t, Rank>& dims)
      : TypedTensor(Tensor(dtype_v<T>, std::vector<std::int64_t>(dims.begin(), dims.end()))) {}
  // A view of `t` (shared storage), which must hold T and have rank Rank.
  explicit TypedTensor(Tensor t) : tensor_(std::move(t)) {
    if (tensor_.dtype() != dtype_v<T> || tensor_.rank() != Rank)
      throw Error("expected a tensor of " + std::string(dtype_name(dtype_v<T>)) + " and rank " + std::to_string(Rank) +
                  ", got " + std::string(dtype_name(tensor_.dtype())) + dims_str(tensor_.dims()));
    std::int64_t stride = 1;
    for (std::size_t k = Rank; k-- > 0;) {
      dims_[k] = tensor_.dims()[k];
      strides_[k] = stride;
      stride *= dims_[k];
    }
  }

  const std::array<std::int64_t, Rank>& dims() const { return dims_; }
  std::int64_t dim(std::size_t k) const { return dims_.at(k); }
  std::int64_t size() const { return tensor_.numel(); }
  bool empty() const { return tensor_.empty(); }

  T* data() { return static_cast<T*>(tensor_.raw()); }
  const T* data() const { return static_cast<const T*>(tensor_.raw()); }
  T* begin() { return data(); }
  T* end() { return data() + size(); }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size(); }

  // Element (i0, i1, ...) in row-major order; no bounds check.
  template <typename... Index>
  T& operator()(Index... index) { return data()[offset(index...)]; }
  template <typename... Index>
  const T& operator()(Index... index) const { return data()[offset(index...)]; }
  // The same, with every index checked against its dim.
  template <typename... Index>
  T& at(Index... index) { return data()[checked_offset(index...)]; }
  template <typename... Index>
  const T& at(Index... index) const { return data()[checked_offset(index...)]; }

  // The untyped tensor this views (shared storage), for the API that takes ondine::Tensor.
  const Tensor& tensor() const { return tensor_; }

 private:
  template <typename... Index>
  std::int64_t offset(Index... index) const {
    static_assert(sizeof...(Index) == Rank, "TypedTensor: one index per dim");
    static_assert((std::is_integral_v<Index> && ...), "TypedTensor: integer indices");
    const std::array<std::int64_t, Rank> i{static_cast<std::int64_t>(index)...};
    std::int64_t o = 0;
    for (std::size_t k = 0; k < Rank; ++k) o += i[k] * strides_[k];
    return o;
  }
  template <typename... Index>
  std::int64_t checked_offset(Index... index) const {
    const std::array<std::int64_t, sizeof...(Index)> i{static_cast<std::int64_t>(index)...};
    for (std::size_t k = 0; k < i.size(); ++k)
      if (i[k] < 0 || i[k] >= dims_[k]) {
        std::string where;
        for (std::size_t j = 0; j < i.size(); ++j) where += (j ? ", " : "") + std::to_string(i[j]);
        throw Error("index (" + where + ") is outside a tensor of shape " + dims_str(tensor_.dims()));
      }
    return offset(index...);
  }

  Tensor tensor_;
  std::array<std::int64_t, Rank> dims_{};
  std::array<std::int64_t, Rank> strides_{};
};

}  // namespace ondine
