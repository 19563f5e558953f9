// SPDX-License-Identifier: Apache-2.0
// ondine/onnx/import.hpp - ONNX model and tensor import (ModelProto -> Graph).
//
// Every Error thrown here carries the file it came from; errors about one node also carry the node's
// name and op. Models up to protobuf's 2 GB limit load in one read; larger weights must be external data
// (side files next to the model, resolved relative to the model's directory and never outside it). Over the
// prebuilt libraries (ondine/config.hpp) the import is compiled once, in ondine::compiled, and files that include
// this header do not parse protobuf's.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <stdexcept>
#include <utility>
#include <string>
#include <vector>

#include "ondine/config.hpp"
#include "ondine/error.hpp"
#include "ondine/ir/graph.hpp"
#include "ondine/ir/limits.hpp"

namespace onnx {
class TensorProto;  // protobuf's generated class (onnx/onnx_pb.h), named here without parsing protobuf
}  // namespace onnx

namespace ondine::onnx {

struct ImportOptions {
  bool infer_shapes = true;  // run ondine::infer_shapes after import
};

// Opsets of the default ONNX domain that Ondine implements: 7 to 21 as targeted, and the older ones
// too, since the kernels honour the pre-7 semantics (legacy broadcast=1/axis, PRelu per channel,
// Clip's attributes) and every opset 1-6 case of the backend suite passes. Opsets 19-21 mostly add
// element types (float8, int4/uint4, 16-bit quantization), which are refused by name (an initializer,
// graph input or Cast target of such a type); their semantic changes are implemented (AveragePool
// dilations, Pad wrap, Resize half_pixel_symmetric, Cast-19's rounding to bfloat16, Gelu, DFT's axis
// input, GridSample's N-D modes, ReduceMax/Min of bool, AffineGrid, GroupNormalization-21's
// per-channel scale, QuantizeLinear-21's output_dtype) or refused naming node and attribute (block_size).
inline constexpr int kMinOpset = 1;
inline constexpr int kMaxOpset = 21;

// A TensorProto as a Tensor. Data comes from raw_data, the typed fields, or an external file looked up
// relative to `base_dir`. String tensors keep their strings (Tensor::from_strings).
ONDINE_ONNX_FUNC Tensor tensor_from_proto(const ::onnx::TensorProto& tp, const std::string& base_dir = "");

// Loads an ONNX model from memory. External data is looked up in `base_dir`; `display_name` is the
// file named in errors.
ONDINE_ONNX_FUNC Graph load_model_from_memory(const void* data, std::size_t size, const std::string& base_dir,
                                              const std::string& display_name, const ImportOptions& opts = {});

// Loads an ONNX model file; external data is looked up next to it.
ONDINE_ONNX_FUNC Graph load_model(const std::string& path, const ImportOptions& opts = {});

// Loads a serialized TensorProto (the backend tests' input_0.pb / output_0.pb).
ONDINE_ONNX_FUNC Tensor load_tensor(const std::string& pb_path);

}  // namespace ondine::onnx

// The definitions: in every file of a header-only program, in ondine::compiled alone otherwise.
#if !ONDINE_ONNX_DECLARATIONS_ONLY
#include "ondine/ir/shape_inference.hpp"
#include "ondine/onnx/contrib_ops.hpp"
#include "ondine/onnx/detail/proto.hpp"

namespace ondine::onnx {

namespace detail {

// Element count of `dims`, rejecting negative dims and counts too large to address.
inline std::int64_t checked_numel(const std::vector<std::int64_t>& dims, const std::string& label) {
  constexpr std::int64_t kLimit = std::int64_t{1} << 60;
  std::int64_t n = 1;
  bool zero = false;
  for (std::int64_t d : dims) {
    if (d < 0) throw Error(label + ": negative dimension in shape " + dims_str(dims));
    if (d == 0) {
      zero = true;
      continue;
    }
    if (n > kLimit / d) throw Error(label + ": shape " + dims_str(dims) + " has too many elements");
    n *= d;
  }
  return zero ? 0 : n;
}

inline std::string elem_type_name(int elem_type) {
  if (elem_type == kOnnxInt4) return "INT4";
  if (elem_type == kOnnxUInt4) return "UINT4";
  if (auto name = onnx_unsupported_type_name(elem_type); !name.empty()) return std::string(name);
  if (::onnx::TensorProto::DataType_IsValid(elem_type))
    return ::onnx::TensorProto::DataType_Name(static_cast<::onnx::TensorProto::DataType>(elem_type));
  return std::to_string(elem_type);
}

// bool storage must hold 0/1 only; files may carry any nonzero byte for true.
inline void normalize_bools(Tensor& t) {
  if (t.dtype() != DType::Bool) return;
  auto* bytes = static_cast<unsigned char*>(t.raw());
  for (std::int64_t i = 0; i < t.numel(); ++i) bytes[i] = bytes[i] ? 1 : 0;
}

inline std::uint64_t parse_external_int(const std::string& text, const std::string& key, const std::string& label) {
  bool ok = !text.empty() && text.size() <= 19;
  for (char c : text) ok = ok && c >= '0' && c <= '9';
  if (!ok) throw Error(label + ": external data " + key + " '" + text + "' is not a non-negative integer");
  return std::stoull(text);
}

inline Tensor read_external_tensor(const ::onnx::TensorProto& tp, DType dtype, std::vector<std::int64_t> dims,
                                   std::uint64_t nbytes, const std::string& base_dir, const std::string& label) {
  std::string location;
  std::uint64_t offset = 0;
  std::optional<std::uint64_t> length;
  for (const auto& entry : tp.external_data()) {
    if (entry.key() == "location") location = entry.value();
    else if (entry.key() == "offset") offset = parse_external_int(entry.value(), "offset", label);
    else if (entry.key() == "length") length = parse_external_int(entry.value(), "length", label);
  }
  if (location.empty()) throw Error(label + ": external data has no location");
  if (!is_safe_relative_path(location))
    throw Error(label + ": external data file '" + location +
                "' is not a relative path inside the model's directory");
  const std::string dir = base_dir.empty() ? "." : base_dir;
  std::string path = join_path(dir, location);
  auto size = regular_file_size(path);
  if (!size) throw Error(label + ": cannot open external data file '" + path + "' (missing, or not a regular file)");
  // The name stays inside the folder; the file it resolves to (through symlinks) must too.
  if (!resolves_inside(path, dir))
    throw Error(label + ": external data file '" + location +
                "' resolves (through a symbolic link) to a file outside the model's directory");
  if (length && *length != nbytes)
    throw Error(label + ": external data length " + std::to_string(*length) + " does not match shape " +
                dims_str(dims) + " of " + std::string(dtype_name(dtype)) + " (" + std::to_string(nbytes) +
                " bytes) in '" + path + "'");
  if (offset > *size || nbytes > *size - offset)
    throw Error(label + ": external data at offset " + std::to_string(offset) + " with length " +
                std::to_string(nbytes) + " is beyond the end of '" + path + "' (" + std::to_string(*size) +
                " bytes)");
  Tensor t(dtype, std::move(dims));
  FilePtr f = open_file(path, "rb");
  if (!f) throw Error(label + ": cannot open external data file '" + path + "'");
  if (nbytes && !read_at(f.get(), offset, t.raw(), nbytes))
    throw Error(label + ": cannot read " + std::to_string(nbytes) + " bytes from external data file '" + path + "'");
  normalize_bools(t);
  if (is_int4(dtype)) unpack_int4_in_place(dtype, static_cast<std::uint8_t*>(t.raw()), static_cast<std::uint64_t>(t.numel()));
  return t;
}

// Copies a typed repeated field into t, converting each element with `convert`.
template <typename T, typename Field, typename Convert>
void copy_typed_field(Tensor& t, const Field& field, const char* field_name, const std::string& label,
                      Convert convert) {
  if (static_cast<std::int64_t>(field.size()) != t.numel())
    throw Error(label + ": " + std::to_string(field.size()) + " values in " + field_name + " for shape " +
                dims_str(t.dims()) + " (" + std::to_string(t.numel()) + " elements)");
  T* out = t.data<T>();
  for (int i = 0; i < field.size(); ++i) out[i] = convert(field.Get(i));
}

// The typed field that holds values of `dtype` (ONNX packs the small types into int32_data).
inline std::pair<int, const char*> typed_field_size(const ::onnx::TensorProto& tp, DType dtype) {
  switch (dtype) {
    case DType::Float32: return {tp.float_data_size(), "float_data"};
    case DType::Float64: return {tp.double_data_size(), "double_data"};
    case DType::Int64: return {tp.int64_data_size(), "int64_data"};
    case DType::UInt64: case DType::UInt32: return {tp.uint64_data_size(), "uint64_data"};
    default: return {tp.int32_data_size(), "int32_data"};
  }
}

inline Tensor tensor_from_typed_fields(const ::onnx::TensorProto& tp, DType dtype, std::vector<std::int64_t> dims,
                                       std::int64_t numel, const std::string& label) {
  // Check the count before allocating: a corrupt file may claim a huge shape.
  auto [count, field_name] = typed_field_size(tp, dtype);
  if (is_int4(dtype)) {  // one packed byte (two elements) per int32
    const auto packed = static_cast<std::int64_t>(file_bytes(dtype, static_cast<std::uint64_t>(numel)));
    if (count != packed)
      throw Error(label + ": " + std::to_string(count) + " values in " + field_name + " for shape " + dims_str(dims) +
                  " (" + std::to_string(numel) + " 4-bit elements: " + std::to_string(packed) + " packed bytes)");
    Tensor t(dtype, std::move(dims));
    auto* bytes = static_cast<std::uint8_t*>(t.raw());
    for (std::int64_t i = 0; i < packed; ++i) bytes[i] = static_cast<std::uint8_t>(tp.int32_data(static_cast<int>(i)));
    unpack_int4_in_place(dtype, bytes, static_cast<std::uint64_t>(numel));
    return t;
  }
  if (count != numel)
    throw Error(label + ": " + std::to_string(count) + " values in " + field_name + " for shape " + dims_str(dims) +
                " (" + std::to_string(numel) + " elements)");
  Tensor t(dtype, std::move(dims));
  auto bits16 = [](std::int32_t v) { return static_cast<std::uint16_t>(v); };
  switch (dtype) {
    case DType::Float32:
      copy_typed_field<float>(t, tp.float_data(), "float_data", label, [](float v) { return v; });
      break;
    case DType::Float64:
      copy_typed_field<double>(t, tp.double_data(), "double_data", label, [](double v) { return v; });
      break;
    case DType::Int64:
      copy_typed_field<std::int64_t>(t, tp.int64_data(), "int64_data", label, [](std::int64_t v) { return v; });
      break;
    case DType::UInt64:
      copy_typed_field<std::uint64_t>(t, tp.uint64_data(), "uint64_data", label, [](std::uint64_t v) { return v; });
      break;
    case DType::UInt32:
      copy_typed_field<std::uint32_t>(t, tp.uint64_data(), "uint64_data", label,
                                      [](std::uint64_t v) { return static_cast<std::uint32_t>(v); });
      break;
    case DType::Int32:
      copy_typed_field<std::int32_t>(t, tp.int32_data(), "int32_data", label, [](std::int32_t v) { return v; });
      break;
    case DType::Int16:
      copy_typed_field<std::int16_t>(t, tp.int32_data(), "int32_data", label,
                                     [](std::int32_t v) { return static_cast<std::int16_t>(v); });
      break;
    case DType::UInt16:
      copy_typed_field<std::uint16_t>(t, tp.int32_data(), "int32_data", label, bits16);
      break;
    case DType::Int8:
      copy_typed_field<std::int8_t>(t, tp.int32_data(), "int32_data", label,
                                    [](std::int32_t v) { return static_cast<std::int8_t>(v); });
      break;
    case DType::UInt8:
      copy_typed_field<std::uint8_t>(t, tp.int32_data(), "int32_data", label,
                                     [](std::int32_t v) { return static_cast<std::uint8_t>(v); });
      break;
    case DType::Bool:
      copy_typed_field<bool>(t, tp.int32_data(), "int32_data", label, [](std::int32_t v) { return v != 0; });
      break;
    case DType::Float16:
      copy_typed_field<float16>(t, tp.int32_data(), "int32_data", label, [&](std::int32_t v) {
        float16 h;
        h.bits = bits16(v);
        return h;
      });
      break;
    case DType::BFloat16:
      copy_typed_field<bfloat16>(t, tp.int32_data(), "int32_data", label, [&](std::int32_t v) {
        bfloat16 h;
        h.bits = bits16(v);
        return h;
      });
      break;
    default:
      throw Error(label + ": unsupported element type " + std::string(dtype_name(dtype)));
  }
  return t;
}

}  // namespace detail

ONDINE_ONNX_FUNC Tensor tensor_from_proto(const ::onnx::TensorProto& tp, const std::string& base_dir) {
  using namespace detail;
  const std::string label = "tensor '" + tp.name() + "'";
  auto dtype = dtype_from_onnx(tp.data_type());
  if (!dtype) throw Error(label + ": unsupported element type " + elem_type_name(tp.data_type()));
  std::vector<std::int64_t> dims(tp.dims().begin(), tp.dims().end());
  const std::int64_t numel = checked_numel(dims, label);
  if (tp.has_segment()) throw Error(label + ": segmented tensors are not supported");
  if (*dtype == DType::String) {
    if (tp.string_data_size() == 0 && numel > 0) return Tensor(DType::String, std::move(dims));  // a placeholder
    if (tp.string_data_size() != numel)
      throw Error(label + ": " + std::to_string(tp.string_data_size()) + " strings for shape " + dims_str(dims));
    return Tensor::from_strings(std::move(dims), std::vector<std::string>(tp.string_data().begin(), tp.string_data().end()));
  }
  // Within Limits::max_tensor_bytes, checked before reading or allocating anything; 4-bit types take half
  // a byte per element in the file.
  std::uint64_t nbytes = ondine::detail::checked_tensor_bytes(dims, dtype_size(*dtype), label);
  if (is_int4(*dtype)) nbytes = file_bytes(*dtype, static_cast<std::uint64_t>(numel));

  if (tp.data_location() == ::onnx::TensorProto::EXTERNAL)
    return read_external_tensor(tp, *dtype, std::move(dims), nbytes, base_dir, label);

  if (tp.has_raw_data()) {
    const std::string& raw = tp.raw_data();
    if (raw.size() != nbytes)
      throw Error(label + ": raw_data has " + std::to_string(raw.size()) + " bytes, shape " + dims_str(dims) +
                  " of " + std::string(dtype_name(*dtype)) + " needs " + std::to_string(nbytes));
    Tensor t(*dtype, std::move(dims));
    if (nbytes) std::memcpy(t.raw(), raw.data(), nbytes);
    normalize_bools(t);
    if (is_int4(*dtype)) unpack_int4_in_place(*dtype, static_cast<std::uint8_t*>(t.raw()), static_cast<std::uint64_t>(numel));
    return t;
  }
  return tensor_from_typed_fields(tp, *dtype, std::move(dims), numel, label);
}

namespace detail {

// A value's type as declared in the file (graph input/output or value_info).
struct DeclaredType {
  ValueKind kind = ValueKind::Tensor;
  DType dtype = DType::Undefined;  // of a sequence: its elements'
  Shape shape = Shape::unknown();  // of a sequence: its elements' (when the file states one)
};

// Tensor types give dtype + shape; a sequence or optional gives its kind and its (elements') tensor
// type. Maps and element types Ondine lacks give Undefined / unknown rather than failing the import.
inline DeclaredType type_from_proto(const ::onnx::TypeProto& type) {
  DeclaredType d;
  const ::onnx::TypeProto* t = &type;
  if (t->value_case() == ::onnx::TypeProto::kOptionalType) {
    t = &t->optional_type().elem_type();
    d.kind = ValueKind::OptionalTensor;
  }
  if (t->value_case() == ::onnx::TypeProto::kSequenceType) {
    t = &t->sequence_type().elem_type();
    d.kind = d.kind == ValueKind::OptionalTensor ? ValueKind::OptionalSequence : ValueKind::Sequence;
  }
  if (t->value_case() != ::onnx::TypeProto::kTensorType) return d;  // a map, or a sequence of sequences
  const auto& tt = t->tensor_type();
  d.dtype = dtype_from_onnx(tt.elem_type()).value_or(DType::Undefined);
  if (!tt.has_shape()) return d;
  std::vector<Dim> dims;
  dims.reserve(static_cast<std::size_t>(tt.shape().dim_size()));
  for (const auto& dim : tt.shape().dim()) {
    if (dim.value_case() == ::onnx::TensorShapeProto::Dimension::kDimValue && dim.dim_value() >= 0)
      dims.emplace_back(dim.dim_value());
    else if (dim.value_case() == ::onnx::TensorShapeProto::Dimension::kDimParam && !dim.dim_param().empty())
      dims.push_back(Dim::named(dim.dim_param()));
    else
      dims.emplace_back();
  }
  d.shape = Shape(std::move(dims));
  return d;
}
inline DeclaredType type_from_proto(const ::onnx::ValueInfoProto& vi) {
  return vi.has_type() ? type_from_proto(vi.type()) : DeclaredType{};
}

// Fills what inference left open (undefined dtype, unknown rank or dims) from the declared type.
inline void merge_declared(Value* v, const DeclaredType& d) {
  if (v->is_tensor() && d.kind != ValueKind::Tensor) v->set_kind(d.kind);  // an op inference leaves open
  if (v->dtype() == DType::Undefined) v->set_dtype(d.dtype);
  if (!v->shape().rank_known()) {
    v->set_shape(d.shape);
    return;
  }
  if (!d.shape.rank_known() || d.shape.rank() != v->shape().rank()) return;
  Shape merged = v->shape();
  for (std::size_t i = 0; i < merged.rank(); ++i)
    if (!merged[i].is_static() && merged[i].symbol.empty()) merged[i] = d.shape[i];
  v->set_shape(std::move(merged));
}

inline const char* attribute_type_name(int type) {
  using A = ::onnx::AttributeProto;
  switch (type) {
    case A::GRAPH: return "GRAPH";
    case A::GRAPHS: return "GRAPHS";
    case A::SPARSE_TENSOR: return "SPARSE_TENSOR";
    case A::SPARSE_TENSORS: return "SPARSE_TENSORS";
    case A::TYPE_PROTO: return "TYPE_PROTO";
    case A::TYPE_PROTOS: return "TYPE_PROTOS";
    case A::TENSORS: return "TENSORS";
    default: return "UNDEFINED";
  }
}

// The attribute's kind; old exporters leave `type` unset and only fill the value field.
inline int attribute_type(const ::onnx::AttributeProto& a) {
  using A = ::onnx::AttributeProto;
  if (a.type() != A::UNDEFINED) return a.type();
  if (a.has_f()) return A::FLOAT;
  if (a.has_i()) return A::INT;
  if (a.has_s()) return A::STRING;
  if (a.has_t()) return A::TENSOR;
  if (a.has_g()) return A::GRAPH;
  if (a.has_sparse_tensor()) return A::SPARSE_TENSOR;
  if (a.has_tp()) return A::TYPE_PROTO;
  if (a.floats_size()) return A::FLOATS;
  if (a.ints_size()) return A::INTS;
  if (a.strings_size()) return A::STRINGS;
  if (a.tensors_size()) return A::TENSORS;
  if (a.graphs_size()) return A::GRAPHS;
  if (a.sparse_tensors_size()) return A::SPARSE_TENSORS;
  if (a.type_protos_size()) return A::TYPE_PROTOS;
  return A::UNDEFINED;
}

// The attribute as an ondine::Attribute, or nullopt for kinds Ondine does not represent (subgraphs,
// sparse tensors, type protos): only ops Ondine does not support use those.
inline std::optional<Attribute> attribute_from_proto(const ::onnx::AttributeProto& a, const std::string& base_dir) {
  using A = ::onnx::AttributeProto;
  switch (attribute_type(a)) {
    case A::FLOAT: return Attribute(a.f());
    case A::INT: return Attribute(static_cast<std::int64_t>(a.i()));
    case A::STRING: return Attribute(a.s());
    case A::TENSOR: return Attribute(tensor_from_proto(a.t(), base_dir));
    case A::FLOATS: return Attribute(std::vector<float>(a.floats().begin(), a.floats().end()));
    case A::INTS: return Attribute(std::vector<std::int64_t>(a.ints().begin(), a.ints().end()));
    case A::STRINGS: return Attribute(std::vector<std::string>(a.strings().begin(), a.strings().end()));
    default: return std::nullopt;
  }
}

// The marker attribute that records skipped attribute kinds on a node.
inline constexpr const char* kUnsupportedAttr = "__unsupported_attr";

// The tensor a Constant node stands for.
inline Tensor constant_node_value(const ::onnx::NodeProto& np, const std::string& base_dir) {
  std::optional<Tensor> value;
  auto set = [&](Tensor t) {
    if (value) throw Error("Constant has more than one value attribute");
    value = std::move(t);
  };
  for (const auto& a : np.attribute()) {
    const std::string& n = a.name();
    if (n == "value") set(tensor_from_proto(a.t(), base_dir));
    else if (n == "value_float") set(Tensor::scalar<float>(a.f()));
    else if (n == "value_floats")
      set(Tensor::from_vector<float>({a.floats_size()}, std::vector<float>(a.floats().begin(), a.floats().end())));
    else if (n == "value_int") set(Tensor::scalar<std::int64_t>(a.i()));
    else if (n == "value_ints")
      set(Tensor::from_vector<std::int64_t>({a.ints_size()},
                                            std::vector<std::int64_t>(a.ints().begin(), a.ints().end())));
    else if (n == "value_string") set(Tensor(DType::String, {}));
    else if (n == "value_strings")
      set(Tensor::from_strings({a.strings_size()}, std::vector<std::string>(a.strings().begin(), a.strings().end())));
    else if (n == "sparse_value") throw Error("sparse constant tensors (sparse_value) are not supported");
  }
  if (!value) throw Error("Constant has no value attribute");
  return std::move(*value);
}

// The names a graph proto defines (inputs, initializers, node outputs): what its nodes read locally;
// any other name they read belongs to an enclosing graph.
inline std::set<std::string> defined_names(const ::onnx::GraphProto& gp) {
  std::set<std::string> names;
  for (const auto& init : gp.initializer()) names.insert(init.name());
  for (const auto& in : gp.input()) names.insert(in.name());
  for (const auto& np : gp.node())
    for (const auto& out : np.output())
      if (!out.empty()) names.insert(out);
  return names;
}

// A graph being imported and the scopes around it (a subgraph reads their values through captures).
struct ImportScope {
  Graph* graph = nullptr;
  const ImportScope* outer = nullptr;
  std::set<std::string> names;  // defined_names() of its proto

  bool defines_outside(const std::string& name) const {
    for (const ImportScope* s = outer; s; s = s->outer)
      if (s->names.count(name)) return true;
    return false;
  }
  // The value a node of this graph reads under `name`: its own, or a capture of an enclosing one's.
  Value* resolve(const std::string& name) const {
    if (names.count(name) || !defines_outside(name)) return graph->get_or_create_value(name);
    if (Value* v = graph->find_value(name)) return v;
    return graph->add_capture(name, DType::Undefined, Shape::unknown());
  }
};

inline std::optional<Attribute> attribute_from_proto(const ::onnx::AttributeProto& a, const std::string& base_dir);

// Fills `g` from `gp`: initializers, inputs, nodes (subgraphs imported recursively, their outer reads
// passed in as implicit inputs), outputs; `declared` collects the types the file states for node
// outputs (applied after inference). Errors carry node context where there is one.
inline void import_graph(const ::onnx::GraphProto& gp, Graph& g, const std::string& base_dir, const ImportScope* outer,
                         std::vector<std::pair<Value*, DeclaredType>>& declared_types) {
  int depth = 0;  // subgraph nesting, bounded before recursing (a crafted file could nest thousands deep)
  for (const ImportScope* s = outer; s; s = s->outer) ++depth;
  const int max_depth = limits().max_subgraph_depth;
  if (depth > max_depth)
    throw Error("subgraphs nest more than " + std::to_string(max_depth) +
                " deep (ondine::Limits::max_subgraph_depth)");
  ImportScope scope{&g, outer, defined_names(gp)};
  std::set<std::string> defined;  // every name with a definition so far: a second one is an error
  auto define = [&](const std::string& name, const char* what) {
    if (name.empty()) throw Error(std::string(what) + " with an empty name");
    if (!defined.insert(name).second) throw Error("value '" + name + "' is defined twice");
  };

  if (gp.sparse_initializer_size())
    throw Error("sparse initializer '" + gp.sparse_initializer(0).values().name() + "' is not supported");
  for (const auto& init : gp.initializer()) {
    define(init.name(), "initializer");
    g.add_constant(init.name(), tensor_from_proto(init, base_dir));
  }
  // Older IR versions list initializers among the inputs too; those are constants, not inputs.
  std::set<std::string> initializer_names;
  for (const auto& init : gp.initializer()) initializer_names.insert(init.name());
  for (const auto& in : gp.input()) {
    if (initializer_names.count(in.name())) continue;
    define(in.name(), "graph input");
    // A graph input must be fed, so a type Ondine lacks (float8, int4, ...) is refused here rather than
    // left Undefined for a confusing failure later.
    if (in.has_type() && in.type().value_case() == ::onnx::TypeProto::kTensorType &&
        in.type().tensor_type().elem_type() != ::onnx::TensorProto::UNDEFINED &&
        !dtype_from_onnx(in.type().tensor_type().elem_type()))
      throw Error("graph input '" + in.name() + "' has element type " +
                  elem_type_name(in.type().tensor_type().elem_type()) + ", which Ondine does not support");
    DeclaredType d = type_from_proto(in);
    g.add_input(in.name(), d.dtype, d.shape)->set_kind(d.kind);
  }

  for (int i = 0; i < gp.node_size(); ++i) {
    const ::onnx::NodeProto& np = gp.node(i);
    const std::string& op = np.op_type();
    if (op.empty()) throw Error("node #" + std::to_string(i) + " ('" + np.name() + "') has no op_type");
    // Errors must be able to name every node: unnamed nodes get "<op>_<index>".
    const std::string name = np.name().empty() ? op + "_" + std::to_string(i) : np.name();
    const std::string domain = np.domain() == "ai.onnx" ? "" : np.domain();
    try {
      if (domain.empty() && op == "Constant") {
        if (np.output_size() != 1 || np.output(0).empty()) throw Error("Constant must have exactly one output");
        Tensor value = constant_node_value(np, base_dir);
        define(np.output(0), "node output");
        g.add_constant(np.output(0), std::move(value));
        continue;
      }
      // Empty names are omitted optional inputs; trailing ones are dropped, as the exporter does.
      int input_count = np.input_size();
      while (input_count > 0 && np.input(input_count - 1).empty()) --input_count;
      std::vector<Value*> inputs;
      inputs.reserve(static_cast<std::size_t>(input_count));
      for (int k = 0; k < input_count; ++k)
        inputs.push_back(np.input(k).empty() ? nullptr : scope.resolve(np.input(k)));

      std::map<std::string, Attribute> attrs;
      std::string skipped;
      std::vector<std::string> captured;  // the outer names the node's subgraphs read, first use first
      std::optional<DeclaredType> optional_type;  // Optional's `type`: the type of its output
      for (const auto& a : np.attribute()) {
        if (a.name().empty()) throw Error("attribute with an empty name");
        // A repeated name would replace the first value; for a subgraph that frees a graph whose values the
        // import still holds (found by fuzzing). ONNX's checker refuses duplicates too.
        if (attrs.count(a.name()) || (a.name() == "type" && optional_type))
          throw Error("attribute '" + a.name() + "' given twice");
        if (domain.empty() && op == "Optional" && a.name() == "type" &&
            attribute_type(a) == ::onnx::AttributeProto::TYPE_PROTO) {
          optional_type = type_from_proto(a.tp());
        } else if (attribute_type(a) == ::onnx::AttributeProto::GRAPH) {
          auto sub = std::make_shared<Graph>();
          sub->name = a.g().name().empty() ? name + "." + a.name() : a.g().name();
          sub->opsets = g.opsets;
          sub->ir_version = g.ir_version;
          import_graph(a.g(), *sub, base_dir, &scope, declared_types);
          for (Value* c : sub->captures())
            if (std::find(captured.begin(), captured.end(), c->name()) == captured.end()) captured.push_back(c->name());
          attrs[a.name()] = GraphAttr(std::move(sub));
        } else if (auto attr = attribute_from_proto(a, base_dir)) {
          attrs[a.name()] = std::move(*attr);
        } else {
          skipped += (skipped.empty() ? "" : ",") + a.name() + ":" + attribute_type_name(attribute_type(a));
        }
      }
      if (!skipped.empty()) attrs[kUnsupportedAttr] = skipped;

      std::vector<std::string> outputs(np.output().begin(), np.output().end());
      for (const auto& out : outputs)
        if (!out.empty()) define(out, "node output");
      Node* node = g.add_node(op, inputs, outputs, std::move(attrs), name, domain);
      for (const std::string& c : captured) node->add_implicit_input(scope.resolve(c), c);
      if (optional_type && node->output(0)) {  // an optional of that type (inference keeps it when no input)
        Value* out = node->output(0);
        out->set_dtype(optional_type->dtype);
        out->set_shape(optional_type->shape);
        out->set_kind(optional_type->kind == ValueKind::Sequence ? ValueKind::OptionalSequence
                                                                 : ValueKind::OptionalTensor);
      }
    } catch (Error& e) {
      if (e.node().empty() && e.op().empty()) e.at_node(name, op);
      throw;
    }
  }

  std::map<Value*, DeclaredType> declared;  // node outputs' types as the file states them
  for (const auto& vi : gp.value_info()) {
    Value* v = g.find_value(vi.name());
    if (v && v->producer()) declared[v] = type_from_proto(vi);
  }
  for (const auto& out : gp.output()) {
    Value* v = g.find_value(out.name());
    if (!v || !defined.count(out.name()))
      throw Error("graph output '" + out.name() + "' is not produced by any node, graph input or initializer");
    g.add_output(v);
    if (v->producer()) declared[v] = type_from_proto(out);
  }

  for (Node* n : g.nodes())
    for (Value* v : n->inputs())
      if (v && !v->producer() && !v->is_graph_input() && !v->is_constant() && !v->is_capture())
        throw n->error("input '" + v->name() + "' is not defined (no node, graph input or initializer produces it)");
  g.topo_order();  // throws an Error naming a node on a cycle
  if (!outer) g.verify();  // a subgraph is checked with its node's implicit inputs, by the outer graph
  for (auto& [v, d] : declared) {
    v->set_dtype(d.dtype);
    v->set_shape(d.shape);
    v->set_kind(d.kind);
    declared_types.emplace_back(v, d);
  }
}

// Builds the Graph of a parsed model. Errors carry node context where there is one; the caller adds the file.
inline Graph import_model(const ::onnx::ModelProto& model, const std::string& base_dir, const ImportOptions& opts) {
  if (!model.has_graph()) throw Error("the model has no graph");
  const ::onnx::GraphProto& gp = model.graph();

  Graph g;
  g.name = gp.name().empty() ? "graph" : gp.name();
  g.ir_version = model.ir_version();
  g.producer_name = model.producer_name();
  g.producer_version = model.producer_version();
  g.doc_string = model.doc_string();

  // Opsets first: Graph::add_node stamps each node with its domain's version.
  g.opsets.clear();
  std::optional<std::int64_t> default_opset;
  for (const auto& op : model.opset_import()) {
    std::string domain = op.domain() == "ai.onnx" ? "" : op.domain();
    if (domain.empty()) default_opset = op.version();
    if (op.version() < 0 || op.version() > INT_MAX)
      throw Error("invalid opset version " + std::to_string(op.version()) + " for domain '" + op.domain() + "'");
    g.opsets[domain] = static_cast<int>(op.version());
  }
  if (default_opset) {
    if (*default_opset < kMinOpset || *default_opset > kMaxOpset)
      throw Error("unsupported opset " + std::to_string(*default_opset) + "; Ondine supports opsets " +
                  std::to_string(kMinOpset) + " to " + std::to_string(kMaxOpset));
  } else {
    for (const auto& np : gp.node())
      if (np.domain().empty() || np.domain() == "ai.onnx")
        throw Error("the model imports no opset of the default ONNX domain");
  }

  std::vector<std::pair<Value*, DeclaredType>> declared;
  import_graph(gp, g, base_dir, nullptr, declared);
  rewrite_contrib_ops(g);

  if (opts.infer_shapes) {
    try {
      infer_shapes(g);
    } catch (const Error&) {
      throw;
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {  // a bug in an inference function must still name the file
      throw Error(std::string("shape inference failed: ") + e.what());
    }
    for (auto& [v, d] : declared) merge_declared(v, d);
  }
  return g;
}

inline std::unique_ptr<::onnx::ModelProto> parse_model(const void* data, std::size_t size) {
  if (size == 0) throw Error("empty file");
  if (size > kMaxProtoBytes)
    throw Error("model is " + std::to_string(size) +
                " bytes; protobuf cannot parse a message larger than 2 GB (store large tensors as external data)");
  check_model_size(size);
  auto model = std::make_unique<::onnx::ModelProto>();
  if (!model->ParseFromArray(data, static_cast<int>(size)))
    throw Error("not a valid ONNX model (protobuf parse failed)");
  return model;
}

}  // namespace detail

ONDINE_ONNX_FUNC Graph load_model_from_memory(const void* data, std::size_t size, const std::string& base_dir,
                                              const std::string& display_name, const ImportOptions& opts) {
  try {
    auto model = detail::parse_model(data, size);
    return detail::import_model(*model, base_dir, opts);
  } catch (Error& e) {
    e.in_file(display_name);
    throw;
  } catch (const std::bad_alloc&) {
    throw Error("out of memory while loading the model").in_file(display_name);
  }
}

ONDINE_ONNX_FUNC Graph load_model(const std::string& path, const ImportOptions& opts) {
  try {
    std::unique_ptr<::onnx::ModelProto> model;
    {
      std::vector<char> bytes = detail::read_proto_file(path);  // freed before the tensors are copied out
      model = detail::parse_model(bytes.data(), bytes.size());
    }
    return detail::import_model(*model, detail::parent_dir(path), opts);
  } catch (Error& e) {
    e.in_file(path);
    throw;
  } catch (const std::bad_alloc&) {
    throw Error("out of memory while loading the model").in_file(path);
  }
}

ONDINE_ONNX_FUNC Tensor load_tensor(const std::string& pb_path) {
  try {
    std::vector<char> bytes = detail::read_proto_file(pb_path);
    ::onnx::TensorProto tp;
    if (!tp.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
      throw Error("not a valid ONNX tensor (protobuf parse failed)");
    return tensor_from_proto(tp, detail::parent_dir(pb_path));
  } catch (Error& e) {
    e.in_file(pb_path);
    throw;
  } catch (const std::bad_alloc&) {
    throw Error("out of memory while loading the tensor").in_file(pb_path);
  }
}

}  // namespace ondine::onnx
#endif  // !ONDINE_ONNX_DECLARATIONS_ONLY
