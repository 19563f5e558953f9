// SPDX-License-Identifier: Apache-2.0
// ondine/onnx/data.hpp - ONNX's serialized values beyond TensorProto (onnx-data.proto): SequenceProto
// and OptionalProto as the Tensors that carry sequences and optionals (ir/tensor.hpp), and a .pb file
// read as the kind of value the model declares (the backend test data stores each input and output so).
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "onnx/onnx-data_pb.h"
#include "ondine/onnx/import.hpp"

namespace ondine::onnx {

// `elem` is the element type to give an empty sequence (the proto has no tensor to tell it).
inline Tensor sequence_from_proto(const ::onnx::SequenceProto& sp, DType elem = DType::Undefined,
                                  const std::string& base_dir = "") {
  if (sp.elem_type() != ::onnx::SequenceProto::TENSOR && sp.elem_type() != ::onnx::SequenceProto::UNDEFINED)
    throw Error("sequence '" + sp.name() + "': only sequences of tensors are supported");
  std::vector<Tensor> items;
  for (const auto& tp : sp.tensor_values()) items.push_back(tensor_from_proto(tp, base_dir));
  const DType t = items.empty() ? elem : items[0].dtype();  // read before `items` is moved from
  return Tensor::sequence(t, std::move(items));
}

inline Tensor optional_from_proto(const ::onnx::OptionalProto& op, DType elem = DType::Undefined,
                                  const std::string& base_dir = "") {
  if (op.has_tensor_value()) return tensor_from_proto(op.tensor_value(), base_dir);
  if (op.has_sequence_value()) return sequence_from_proto(op.sequence_value(), elem, base_dir);
  if (op.elem_type() == ::onnx::OptionalProto::UNDEFINED || op.elem_type() == ::onnx::OptionalProto::TENSOR ||
      op.elem_type() == ::onnx::OptionalProto::SEQUENCE)
    return Tensor::none();
  throw Error("optional '" + op.name() + "': only optionals of tensors and sequences are supported");
}

// A serialized value of `kind` (its element type `elem`) from `path`; its stored name in `name`.
inline Tensor read_value_pb(const std::string& path, ValueKind kind, DType elem, std::string* name = nullptr) {
  std::ifstream f(path, std::ios::binary);
  const std::string dir = path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/'));
  auto parse = [&](auto& proto, const char* what) {
    if (!f || !proto.ParseFromIstream(&f)) throw Error(std::string("cannot parse ") + what).in_file(path);
    if (name) *name = proto.name();
  };
  switch (kind) {
    case ValueKind::Tensor: {
      ::onnx::TensorProto p;
      parse(p, "TensorProto");
      return tensor_from_proto(p, dir);
    }
    case ValueKind::Sequence: {
      ::onnx::SequenceProto p;
      parse(p, "SequenceProto");
      return sequence_from_proto(p, elem, dir);
    }
    case ValueKind::OptionalTensor:
    case ValueKind::OptionalSequence: {
      ::onnx::OptionalProto p;
      parse(p, "OptionalProto");
      return optional_from_proto(p, elem, dir);
    }
  }
  return Tensor();
}

}  // namespace ondine::onnx
