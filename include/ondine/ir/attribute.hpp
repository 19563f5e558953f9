// ondine/ir/attribute.hpp - node attributes (the ONNX attribute kinds Ondine supports).
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "ondine/ir/tensor.hpp"

namespace ondine {

using Attribute = std::variant<std::int64_t, float, std::string, Tensor, std::vector<std::int64_t>,
                               std::vector<float>, std::vector<std::string>>;

inline std::string attribute_str(const Attribute& a) {
  struct Printer {
    std::string operator()(std::int64_t v) const { return std::to_string(v); }
    std::string operator()(float v) const {
      std::string s = std::to_string(v);
      return s;
    }
    std::string operator()(const std::string& v) const { return "\"" + v + "\""; }
    std::string operator()(const Tensor& t) const {
      return "tensor<" + std::string(dtype_name(t.dtype())) + dims_str(t.dims()) + ">";
    }
    std::string operator()(const std::vector<std::int64_t>& v) const {
      std::string s = "[";
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
      return s + "]";
    }
    std::string operator()(const std::vector<float>& v) const {
      std::string s = "[";
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
      return s + "]";
    }
    std::string operator()(const std::vector<std::string>& v) const {
      std::string s = "[";
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ",\"" : "\"") + v[i] + "\"";
      return s + "]";
    }
  };
  return std::visit(Printer{}, a);
}

}  // namespace ondine
