// Helpers the tests share to build ONNX protobufs by hand (malformed models need exactly that); the error a
// call throws is support.hpp's error_of. Header-only, in ondine::test, like support.hpp.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "ondine/onnx/import.hpp"
#include "support.hpp"

namespace ondine::test {

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

inline void add_value_info(::onnx::ValueInfoProto* vi, const std::string& name, int elem_type,
                           const std::vector<std::int64_t>& dims) {
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem_type);
  auto* shape = tt->mutable_shape();
  for (auto d : dims) shape->add_dim()->set_dim_value(d);
}

inline ::onnx::NodeProto* add_node(::onnx::GraphProto* g, const std::string& op, const std::vector<std::string>& inputs,
                                   const std::vector<std::string>& outputs, const std::string& name = "",
                                   const std::string& domain = "") {
  auto* n = g->add_node();
  n->set_op_type(op);
  if (!name.empty()) n->set_name(name);
  if (!domain.empty()) n->set_domain(domain);
  for (auto& i : inputs) n->add_input(i);
  for (auto& o : outputs) n->add_output(o);
  return n;
}

}  // namespace ondine::test
