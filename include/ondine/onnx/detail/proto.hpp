// SPDX-License-Identifier: Apache-2.0
// ondine/onnx/detail/proto.hpp - internals shared by the ONNX importer and exporter.
//
// This directory is the only place in Ondine that sees protobuf. Note that namespace ondine::onnx
// shadows protobuf's ::onnx, so the generated classes are always spelled ::onnx::ModelProto etc.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "onnx/onnx_pb.h"
#include "ondine/error.hpp"
#include "ondine/ir/dtype.hpp"
#include "ondine/ir/limits.hpp"
#include "ondine/ir/shape.hpp"

namespace ondine::onnx::detail {

// protobuf's parser and serializer take an int size: a message cannot exceed 2 GB - 1.
inline constexpr std::uint64_t kMaxProtoBytes = static_cast<std::uint64_t>(INT_MAX);

// TensorProto codes newer than Debian's libonnx (1.12) enum: the 4-bit integers of opset 21.
inline constexpr int kOnnxUInt4 = 21;
inline constexpr int kOnnxInt4 = 22;

// ONNX TensorProto::DataType -> DType; nullopt for types Ondine does not represent (complex, ...).
inline std::optional<DType> dtype_from_onnx(int elem_type) {
  using TP = ::onnx::TensorProto;
  switch (elem_type) {
    case TP::FLOAT: return DType::Float32;
    case TP::UINT8: return DType::UInt8;
    case TP::INT8: return DType::Int8;
    case TP::UINT16: return DType::UInt16;
    case TP::INT16: return DType::Int16;
    case TP::INT32: return DType::Int32;
    case TP::INT64: return DType::Int64;
    case TP::STRING: return DType::String;
    case TP::BOOL: return DType::Bool;
    case TP::FLOAT16: return DType::Float16;
    case TP::DOUBLE: return DType::Float64;
    case TP::UINT32: return DType::UInt32;
    case TP::UINT64: return DType::UInt64;
    case TP::BFLOAT16: return DType::BFloat16;
    case kOnnxUInt4: return DType::UInt4;
    case kOnnxInt4: return DType::Int4;
    default: return std::nullopt;
  }
}

inline int dtype_to_onnx(DType t) {
  using TP = ::onnx::TensorProto;
  switch (t) {
    case DType::Undefined: return TP::UNDEFINED;
    case DType::Float32: return TP::FLOAT;
    case DType::Float16: return TP::FLOAT16;
    case DType::BFloat16: return TP::BFLOAT16;
    case DType::Float64: return TP::DOUBLE;
    case DType::Int8: return TP::INT8;
    case DType::UInt8: return TP::UINT8;
    case DType::Int16: return TP::INT16;
    case DType::UInt16: return TP::UINT16;
    case DType::Int32: return TP::INT32;
    case DType::UInt32: return TP::UINT32;
    case DType::Int64: return TP::INT64;
    case DType::UInt64: return TP::UINT64;
    case DType::Bool: return TP::BOOL;
    case DType::String: return TP::STRING;
    case DType::Int4: return kOnnxInt4;
    case DType::UInt4: return kOnnxUInt4;
  }
  return TP::UNDEFINED;
}

// 4-bit tensors in files: two elements per byte, the first in the low nibble (ONNX's packing for raw_data,
// int32_data and external data alike); in memory one per byte (DType::Int4).
inline std::uint64_t file_bytes(DType t, std::uint64_t numel) {
  return is_int4(t) ? (numel + 1) / 2 : numel * dtype_size(t);
}
inline std::string pack_int4(const std::uint8_t* values, std::uint64_t numel) {
  std::string packed((numel + 1) / 2, '\0');
  for (std::uint64_t i = 0; i < numel; ++i)
    packed[i / 2] = static_cast<char>(static_cast<std::uint8_t>(packed[i / 2]) | ((values[i] & 0xfu) << (4 * (i & 1))));
  return packed;
}
// Unpacks t's first (numel + 1) / 2 bytes over its whole storage, from the back so it works in place;
// Int4 values are sign-extended.
inline void unpack_int4_in_place(DType t, std::uint8_t* bytes, std::uint64_t numel) {
  for (std::uint64_t i = numel; i-- > 0;) {
    unsigned nibble = (bytes[i / 2] >> (4 * (i & 1))) & 0xfu;
    bytes[i] = static_cast<std::uint8_t>(t == DType::Int4 && nibble >= 8 ? nibble | 0xf0u : nibble);
  }
}

// RAII FILE* (iostreams cannot report a short read of a multi-GB file as cheaply).
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

inline FilePtr open_file(const std::string& path, const char* mode) { return FilePtr(std::fopen(path.c_str(), mode)); }

// Size of a regular file; nullopt when it does not exist or is not a regular file.
inline std::optional<std::uint64_t> regular_file_size(const std::string& path) {
  std::error_code ec;
  auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::is_regular_file(status)) return std::nullopt;
  auto size = std::filesystem::file_size(path, ec);
  if (ec) return std::nullopt;
  return static_cast<std::uint64_t>(size);
}

// Reads `size` bytes at `offset` of an open file into `dst`; false on a short read.
inline bool read_at(std::FILE* f, std::uint64_t offset, void* dst, std::uint64_t size) {
  if (fseeko(f, static_cast<off_t>(offset), SEEK_SET) != 0) return false;
  auto* p = static_cast<char*>(dst);
  while (size > 0) {
    std::size_t chunk = static_cast<std::size_t>(std::min<std::uint64_t>(size, 1u << 30));
    std::size_t got = std::fread(p, 1, chunk, f);
    if (got != chunk) return false;
    p += got;
    size -= got;
  }
  return true;
}

// A model file over Limits::max_model_bytes is refused before it is read.
inline void check_model_size(std::uint64_t size) {
  const std::uint64_t cap = limits().max_model_bytes;
  if (size > cap)
    throw Error("file is " + std::to_string(size) + " bytes, over the limit of " + std::to_string(cap) +
                " bytes (ondine::Limits::max_model_bytes)");
}

// The whole content of a file for protobuf parsing, in one read. Throws "cannot open file",
// "empty file" or a size error; the caller adds the file name.
inline std::vector<char> read_proto_file(const std::string& path) {
  auto size = regular_file_size(path);
  FilePtr f = size ? open_file(path, "rb") : nullptr;
  if (!f) throw Error("cannot open file");
  if (*size == 0) throw Error("empty file");
  if (*size > kMaxProtoBytes)
    throw Error("file is " + std::to_string(*size) +
                " bytes; protobuf cannot parse a message larger than 2 GB (store large tensors as external data)");
  check_model_size(*size);
  std::vector<char> bytes(static_cast<std::size_t>(*size));
  if (!read_at(f.get(), 0, bytes.data(), *size)) throw Error("cannot read file");
  return bytes;
}

// External-data locations must stay inside the model's directory: relative, no "..", no NUL byte
// (the C library would cut the name there).
inline bool is_safe_relative_path(const std::string& location) {
  if (location.empty() || location.find('\0') != std::string::npos) return false;
  std::filesystem::path p(location);
  if (p.is_absolute() || p.has_root_name() || p.has_root_directory()) return false;
  for (const auto& part : p)
    if (part == "..") return false;
  return true;
}

// Whether the existing file `path`, with every symbolic link resolved, lies inside the folder `dir`
// (itself resolved): a link inside the model's folder must not lead out of it.
inline bool resolves_inside(const std::string& path, const std::string& dir) {
  std::error_code ec1, ec2;
  std::filesystem::path file = std::filesystem::canonical(path, ec1);
  std::filesystem::path folder = std::filesystem::canonical(dir, ec2);
  if (ec1 || ec2) return false;
  auto f = file.begin();
  for (auto d = folder.begin(); d != folder.end(); ++d, ++f)
    if (f == file.end() || *f != *d) return false;
  return f != file.end();
}

inline std::string join_path(const std::string& dir, const std::string& file) {
  if (dir.empty()) return file;
  return (std::filesystem::path(dir) / file).string();
}

inline std::string parent_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

}  // namespace ondine::onnx::detail
