// SPDX-License-Identifier: Apache-2.0
// ondine/ir/shape.hpp - shapes whose dims are static numbers or named symbols ("batch").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ondine {

// One dimension: a known size, a named symbol, or unknown (no value, no name).
struct Dim {
  std::int64_t value = -1;  // >= 0 when static
  std::string symbol;       // set for named symbolic dims

  Dim() = default;
  Dim(std::int64_t v) : value(v) {}  // NOLINT: implicit on purpose, shapes read as {1, 3, 224, 224}
  static Dim named(std::string s) {
    Dim d;
    d.symbol = std::move(s);
    return d;
  }
  bool is_static() const { return value >= 0; }
  bool operator==(const Dim& o) const { return value == o.value && symbol == o.symbol; }
  bool operator!=(const Dim& o) const { return !(*this == o); }
  std::string str() const { return is_static() ? std::to_string(value) : (symbol.empty() ? "?" : symbol); }
};

// A shape of known rank, or a shape whose rank is unknown (Shape::unknown()).
class Shape {
 public:
  Shape() = default;  // rank 0: a scalar
  Shape(std::initializer_list<Dim> dims) : dims_(dims) {}
  explicit Shape(std::vector<Dim> dims) : dims_(std::move(dims)) {}
  static Shape from(const std::vector<std::int64_t>& dims) {
    return Shape(std::vector<Dim>(dims.begin(), dims.end()));
  }
  static Shape unknown() {
    Shape s;
    s.rank_known_ = false;
    return s;
  }

  bool rank_known() const { return rank_known_; }
  std::size_t rank() const { return dims_.size(); }
  const std::vector<Dim>& dims() const { return dims_; }
  std::vector<Dim>& dims() { return dims_; }
  const Dim& operator[](std::size_t i) const { return dims_[i]; }
  Dim& operator[](std::size_t i) { return dims_[i]; }

  bool is_static() const {
    if (!rank_known_) return false;
    for (auto& d : dims_)
      if (!d.is_static()) return false;
    return true;
  }
  // Static dims as numbers; only valid when is_static().
  std::vector<std::int64_t> sizes() const {
    std::vector<std::int64_t> out;
    for (auto& d : dims_) out.push_back(d.value);
    return out;
  }
  std::optional<std::int64_t> numel() const {
    if (!is_static()) return std::nullopt;
    std::int64_t n = 1;
    for (auto& d : dims_) n *= d.value;
    return n;
  }
  bool operator==(const Shape& o) const { return rank_known_ == o.rank_known_ && dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return !(*this == o); }

  std::string str() const {
    if (!rank_known_) return "[*]";
    std::string s = "[";
    for (std::size_t i = 0; i < dims_.size(); ++i) s += (i ? "," : "") + dims_[i].str();
    return s + "]";
  }

 private:
  std::vector<Dim> dims_;
  bool rank_known_ = true;
};

inline std::string dims_str(const std::vector<std::int64_t>& dims) { return Shape::from(dims).str(); }

}  // namespace ondine
