// SPDX-License-Identifier: Apache-2.0
// ondine/ir/attribute.hpp - node attributes (the ONNX attribute kinds Ondine supports).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "ondine/ir/tensor.hpp"

namespace ondine {

class Graph;

// A subgraph attribute: If's branches, Loop's and Scan's bodies. Held by pointer so that Attribute
// does not need the complete Graph; Graph::clone copies subgraphs deeply, so a pass that edits a
// clone's subgraph never touches the original.
using GraphAttr = std::shared_ptr<Graph>;

using Attribute = std::variant<std::int64_t, float, std::string, Tensor, std::vector<std::int64_t>,
                               std::vector<float>, std::vector<std::string>, GraphAttr>;

// The ONNX name of an attribute's kind ("INT", "FLOATS", "GRAPH", ...), for error messages.
inline const char* attribute_kind_name(std::size_t variant_index) {
  static const char* const names[] = {"INT", "FLOAT", "STRING", "TENSOR", "INTS", "FLOATS", "STRINGS", "GRAPH"};
  return variant_index < 8 ? names[variant_index] : "?";
}
inline const char* attribute_kind_name(const Attribute& a) { return attribute_kind_name(a.index()); }
namespace detail {
// The position of T among a variant's alternatives, at compile time (no variant is built: constructing
// one here made GCC 12 warn, falsely, of an uninitialized vector under -O1 and the sanitizers).
template <typename T, typename... Ts>
constexpr std::size_t alternative_index(const std::variant<Ts...>*) {
  std::size_t i = 0;
  const bool found = ((std::is_same_v<T, Ts> || (++i, false)) || ...);
  return found ? i : sizeof...(Ts);
}
}  // namespace detail
template <typename T>
const char* attribute_kind_name() {
  return attribute_kind_name(detail::alternative_index<T>(static_cast<const Attribute*>(nullptr)));
}

// "graph <name> (N nodes)"; defined in graph.hpp, where Graph is complete.
inline std::string subgraph_summary(const Graph& g);

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
    std::string operator()(const GraphAttr& g) const { return g ? subgraph_summary(*g) : "graph <none>"; }
  };
  return std::visit(Printer{}, a);
}

}  // namespace ondine
