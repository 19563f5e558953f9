// SPDX-License-Identifier: Apache-2.0
// ondine/onnx/export.hpp - ONNX model and tensor export (Graph -> ModelProto).
//
// The exported model re-imports to the same graph: constants become initializers (inline raw_data, or an
// external side file for large ones), nodes are written in topological order, and every value whose type
// is known carries it (graph inputs and outputs, value_info for intermediates). Over the prebuilt libraries
// (ondine/config.hpp) the export is compiled once, in ondine::compiled.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ondine/config.hpp"
#include "ondine/error.hpp"
#include "ondine/ir/graph.hpp"

namespace ondine::onnx {

struct ExportOptions {
  // 0: every tensor inline. Otherwise tensors of at least this many bytes go to the side file.
  std::size_t external_data_threshold = 0;
  // The side file, relative to the model's directory; empty means "<model file name>.data".
  std::string external_data_file;
};

// Writes `g` as an ONNX model file, optionally with large tensors in a side file next to it.
ONDINE_ONNX_FUNC void save_model(const Graph& g, const std::string& path, const ExportOptions& opts = {});

// The model as serialized ModelProto bytes, every tensor inline.
ONDINE_ONNX_FUNC std::string serialize_model(const Graph& g);

// Writes one tensor as a serialized TensorProto (the format of the backend tests' .pb files).
ONDINE_ONNX_FUNC void save_tensor(const Tensor& t, const std::string& pb_path, const std::string& name = "");

}  // namespace ondine::onnx

// The definitions: in every file of a header-only program, in ondine::compiled alone otherwise.
#if !ONDINE_ONNX_DECLARATIONS_ONLY
#include "ondine/onnx/detail/proto.hpp"

namespace ondine::onnx {

namespace detail {

inline void set_value_type(::onnx::ValueInfoProto* vi, const Value* v) {
  vi->set_name(v->name());
  // Nothing known (e.g. a map-typed value of an unsupported op): no type rather than a bogus one.
  if (v->is_tensor() && v->dtype() == DType::Undefined && !v->shape().rank_known()) return;
  // A sequence or optional wraps the tensor type of its elements (ValueKind, ir/graph.hpp).
  ::onnx::TypeProto* type = vi->mutable_type();
  if (is_optional_kind(v->kind())) type = type->mutable_optional_type()->mutable_elem_type();
  if (is_sequence_kind(v->kind())) type = type->mutable_sequence_type()->mutable_elem_type();
  auto* tt = type->mutable_tensor_type();
  tt->set_elem_type(dtype_to_onnx(v->dtype()));
  if (!v->shape().rank_known()) return;
  auto* shape = tt->mutable_shape();  // present even for scalars: rank 0 is known
  for (const Dim& d : v->shape().dims()) {
    auto* dim = shape->add_dim();
    if (d.is_static()) dim->set_dim_value(d.value);
    else if (!d.symbol.empty()) dim->set_dim_param(d.symbol);
  }
}

// Name, type and dims of a tensor; the data is written by the caller.
inline void tensor_header(const Tensor& t, const std::string& name, ::onnx::TensorProto* tp) {
  if (t.dtype() == DType::Undefined) throw Error("cannot export tensor '" + name + "' of undefined element type");
  tp->set_name(name);
  tp->set_data_type(dtype_to_onnx(t.dtype()));
  for (std::int64_t d : t.dims()) tp->add_dims(d);
}

// Tensor with inline data. Every numeric type goes to raw_data (little-endian, as ONNX specifies);
// String tensors write their strings (a placeholder without strings: empty ones).
inline void tensor_to_proto_inline(const Tensor& t, const std::string& name, ::onnx::TensorProto* tp) {
  tensor_header(t, name, tp);
  if (t.dtype() == DType::String) {
    for (std::int64_t i = 0; i < t.numel(); ++i)
      tp->add_string_data(t.has_strings() ? t.strings()[static_cast<std::size_t>(i)] : std::string());
    return;
  }
  if (is_int4(t.dtype())) tp->set_raw_data(pack_int4(static_cast<const std::uint8_t*>(t.raw()), static_cast<std::uint64_t>(t.numel())));
  else tp->set_raw_data(static_cast<const char*>(t.raw()), t.nbytes());
}

// Appends tensors to the external-data side file, each at a 4 KiB-aligned offset (mmap friendly).
class ExternalDataWriter {
 public:
  ExternalDataWriter(std::string path, std::string location)
      : path_(std::move(path)), location_(std::move(location)) {}

  void write(const Tensor& t, const std::string& name, ::onnx::TensorProto* tp) {
    if (!file_) {
      std::error_code ec;  // a location like "weights/model.bin" may name a directory that does not exist yet
      std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ec);
      file_ = open_file(path_, "wb");
      if (!file_) throw Error("cannot create external data file '" + path_ + "'");
    }
    constexpr std::uint64_t kAlign = 4096;
    std::uint64_t aligned = (offset_ + kAlign - 1) / kAlign * kAlign;
    static const char zeros[kAlign] = {};
    if (aligned > offset_ && std::fwrite(zeros, 1, aligned - offset_, file_.get()) != aligned - offset_)
      throw Error("cannot write external data file '" + path_ + "'");
    offset_ = aligned;
    const std::string packed =
        is_int4(t.dtype()) ? pack_int4(static_cast<const std::uint8_t*>(t.raw()), static_cast<std::uint64_t>(t.numel())) : "";
    const void* data = is_int4(t.dtype()) ? static_cast<const void*>(packed.data()) : t.raw();
    const std::uint64_t n = is_int4(t.dtype()) ? packed.size() : t.nbytes();
    if (n && std::fwrite(data, 1, n, file_.get()) != n)
      throw Error("cannot write external data file '" + path_ + "'");
    tensor_header(t, name, tp);
    tp->set_data_location(::onnx::TensorProto::EXTERNAL);
    auto add = [&](const char* key, const std::string& value) {
      auto* e = tp->add_external_data();
      e->set_key(key);
      e->set_value(value);
    };
    add("location", location_);
    add("offset", std::to_string(offset_));
    add("length", std::to_string(n));
    offset_ += n;
  }

  void close() {
    if (file_ && std::fflush(file_.get()) != 0) throw Error("cannot write external data file '" + path_ + "'");
    file_.reset();
  }

 private:
  std::string path_, location_;
  FilePtr file_;
  std::uint64_t offset_ = 0;
};

inline void build_graph(const Graph& g, ::onnx::GraphProto* gp, ExternalDataWriter* external, std::size_t threshold);

inline void attribute_to_proto(const std::string& name, const Attribute& attr, ::onnx::AttributeProto* a) {
  using A = ::onnx::AttributeProto;
  a->set_name(name);
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::int64_t>) {
          a->set_type(A::INT);
          a->set_i(v);
        } else if constexpr (std::is_same_v<T, float>) {
          a->set_type(A::FLOAT);
          a->set_f(v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          a->set_type(A::STRING);
          a->set_s(v);
        } else if constexpr (std::is_same_v<T, Tensor>) {
          a->set_type(A::TENSOR);
          tensor_to_proto_inline(v, "", a->mutable_t());
        } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
          a->set_type(A::INTS);
          for (auto x : v) a->add_ints(x);
        } else if constexpr (std::is_same_v<T, std::vector<float>>) {
          a->set_type(A::FLOATS);
          for (auto x : v) a->add_floats(x);
        } else if constexpr (std::is_same_v<T, GraphAttr>) {
          if (!v) throw Error("attribute '" + name + "' holds no graph");
          a->set_type(A::GRAPH);
          build_graph(*v, a->mutable_g(), nullptr, 0);  // subgraph tensors inline
        } else {
          static_assert(std::is_same_v<T, std::vector<std::string>>);
          a->set_type(A::STRINGS);
          for (const auto& x : v) a->add_strings(x);
        }
      },
      attr);
}

// The ONNX IR version a model with these opsets needs (IR 8 came with opset 15).
inline std::int64_t ir_version_for(const Graph& g) {
  std::int64_t ir = std::max<std::int64_t>(g.ir_version, 7);
  if (g.opset() >= 15) ir = std::max<std::int64_t>(ir, 8);
  return ir;
}

// Graph -> ModelProto. With `external` set, tensors of at least `threshold` bytes go to its side file.
inline void build_model(const Graph& g, ::onnx::ModelProto& model, ExternalDataWriter* external = nullptr,
                        std::size_t threshold = 0) {
  g.verify();

  model.set_ir_version(ir_version_for(g));
  model.set_producer_name("ondine");
  if (!g.doc_string.empty()) model.set_doc_string(g.doc_string);

  // Every domain a node uses (subgraphs' nodes too) needs an opset import; Graph API users may not
  // have declared one.
  std::vector<const Node*> all;
  std::function<void(const Graph&)> collect = [&](const Graph& sub) {
    for (const Node* n : sub.nodes()) {
      all.push_back(n);
      for (auto& [attr, body] : n->subgraphs()) collect(*body);
    }
  };
  collect(g);
  std::map<std::string, int> opsets = g.opsets;
  for (const Node* n : all)
    if (!opsets.count(n->domain())) opsets[n->domain()] = 0;
  for (auto& [domain, version] : opsets) {
    if (version > 0) continue;
    int used = 0;
    for (const Node* n : all)
      if (n->domain() == domain) used = std::max(used, n->opset());
    version = used > 0 ? used : (domain.empty() ? 17 : 1);
  }
  for (const auto& [domain, version] : opsets) {
    auto* op = model.add_opset_import();
    op->set_domain(domain);
    op->set_version(version);
  }

  build_graph(g, model.mutable_graph(), external, threshold);
}

// One graph (the model's, or a subgraph: its captures are plain outer names in ONNX, and its nodes'
// implicit inputs are not written).
inline void build_graph(const Graph& g, ::onnx::GraphProto* gp, ExternalDataWriter* external, std::size_t threshold) {
  std::vector<Node*> order = g.topo_order();
  gp->set_name(g.name);
  for (const Value* v : g.inputs()) set_value_type(gp->add_input(), v);
  for (const Value* v : g.constants()) {
    const Tensor& t = v->constant();
    if (external && t.dtype() != DType::String && t.nbytes() >= threshold)
      external->write(t, v->name(), gp->add_initializer());
    else
      tensor_to_proto_inline(t, v->name(), gp->add_initializer());
  }
  for (const Node* n : order) {
    ::onnx::NodeProto* np = gp->add_node();
    np->set_op_type(n->op_type());
    if (!n->name().empty()) np->set_name(n->name());
    if (!n->domain().empty()) np->set_domain(n->domain());
    // Omitted optional inputs are "", trailing ones are dropped.
    std::size_t count = n->num_formal_inputs();
    while (count > 0 && !n->input(count - 1)) --count;
    for (std::size_t i = 0; i < count; ++i) np->add_input(n->input(i) ? n->input(i)->name() : std::string());
    for (const Value* out : n->outputs()) np->add_output(out->name());
    for (const auto& [name, attr] : n->attrs()) attribute_to_proto(name, attr, np->add_attribute());
  }
  for (const Value* v : g.outputs()) set_value_type(gp->add_output(), v);
  for (const Node* n : order)
    for (const Value* v : n->outputs())
      if (!v->is_graph_output() && (v->dtype() != DType::Undefined || v->shape().rank_known()))
        set_value_type(gp->add_value_info(), v);
}

inline void check_serializable(const ::onnx::ModelProto& model) {
  std::size_t size = model.ByteSizeLong();
  if (size > kMaxProtoBytes)
    throw Error("the model is " + std::to_string(size) +
                " bytes inline; protobuf cannot write more than 2 GB (use ExportOptions::external_data_threshold)");
}

inline void write_proto_file(const ::google::protobuf::MessageLite& message, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error("cannot create file");
  if (!message.SerializeToOstream(&out)) throw Error("cannot serialize the model");
  out.close();
  if (!out) throw Error("cannot write file");
}

}  // namespace detail

ONDINE_ONNX_FUNC void save_model(const Graph& g, const std::string& path, const ExportOptions& opts) {
  try {
    ::onnx::ModelProto model;
    std::optional<detail::ExternalDataWriter> external;
    if (opts.external_data_threshold > 0) {
      std::string location = opts.external_data_file.empty()
                                 ? std::filesystem::path(path).filename().string() + ".data"
                                 : opts.external_data_file;
      if (!detail::is_safe_relative_path(location))
        throw Error("external data file '" + location + "' must be a relative path inside the model's directory");
      external.emplace(detail::join_path(detail::parent_dir(path), location), location);
    }
    detail::build_model(g, model, external ? &*external : nullptr, opts.external_data_threshold);
    if (external) external->close();
    detail::check_serializable(model);
    detail::write_proto_file(model, path);
  } catch (Error& e) {
    e.in_file(path);
    throw;
  }
}

ONDINE_ONNX_FUNC std::string serialize_model(const Graph& g) {
  ::onnx::ModelProto model;
  detail::build_model(g, model);
  detail::check_serializable(model);
  std::string bytes;
  if (!model.SerializeToString(&bytes)) throw Error("cannot serialize the model");
  return bytes;
}

ONDINE_ONNX_FUNC void save_tensor(const Tensor& t, const std::string& pb_path, const std::string& name) {
  try {
    ::onnx::TensorProto tp;
    detail::tensor_to_proto_inline(t, name, &tp);
    if (tp.ByteSizeLong() > detail::kMaxProtoBytes) throw Error("tensor is larger than protobuf's 2 GB limit");
    detail::write_proto_file(tp, pb_path);
  } catch (Error& e) {
    e.in_file(pb_path);
    throw;
  }
}

}  // namespace ondine::onnx
#endif  // !ONDINE_ONNX_DECLARATIONS_ONLY
