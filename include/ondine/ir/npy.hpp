// SPDX-License-Identifier: Apache-2.0
// ondine/ir/npy.hpp - read and write tensors as NumPy .npy files (format versions 1.0 to 3.0).
// Reading checks every header field and the data's size before allocating (fuzzed: fuzz/npy.cpp).
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <istream>
#include <string>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/tensor.hpp"

namespace ondine {

namespace detail {
inline std::string npy_descr(DType t) {
  switch (t) {
    case DType::Float32: return "<f4";
    case DType::Float16: return "<f2";
    case DType::Float64: return "<f8";
    case DType::Int8: return "|i1";
    case DType::UInt8: return "|u1";
    case DType::Int16: return "<i2";
    case DType::UInt16: return "<u2";
    case DType::Int32: return "<i4";
    case DType::UInt32: return "<u4";
    case DType::Int64: return "<i8";
    case DType::UInt64: return "<u8";
    case DType::Bool: return "|b1";
    default: throw Error("dtype " + std::string(dtype_name(t)) + " cannot be stored in .npy");
  }
}
inline DType npy_dtype(const std::string& d, const std::string& file) {
  static const std::pair<const char*, DType> table[] = {
      {"f4", DType::Float32}, {"f2", DType::Float16}, {"f8", DType::Float64}, {"i1", DType::Int8},
      {"u1", DType::UInt8},   {"i2", DType::Int16},   {"u2", DType::UInt16},  {"i4", DType::Int32},
      {"u4", DType::UInt32},  {"i8", DType::Int64},   {"u8", DType::UInt64},  {"b1", DType::Bool}};
  if (d.size() == 3 && (d[0] == '<' || d[0] == '|' || d[0] == '='))
    for (auto& [k, t] : table)
      if (d.compare(1, 2, k) == 0) return t;
  throw Error("unsupported .npy dtype '" + d + "' (little-endian numeric and bool only)").in_file(file);
}
}  // namespace detail

namespace detail {

// The value text of `key` in a .npy header dict: a quoted string, a parenthesised tuple or a bare word.
inline std::string npy_field(const std::string& header, const std::string& key, const std::string& file) {
  auto missing = [&] { return Error(".npy header lacks '" + key + "'").in_file(file); };
  auto k = header.find("'" + key + "'");
  if (k == std::string::npos) throw missing();
  auto colon = header.find(':', k);
  if (colon == std::string::npos) throw missing();
  std::size_t s = header.find_first_not_of(' ', colon + 1);
  if (s == std::string::npos) throw missing();
  auto until = [&](std::size_t from, const char* stops) {
    std::size_t e = header.find_first_of(stops, from);
    if (e == std::string::npos) throw Error(".npy header: unterminated value of '" + key + "'").in_file(file);
    return header.substr(from, e - from);
  };
  if (header[s] == '\'') return until(s + 1, "'");
  if (header[s] == '(') return until(s + 1, ")");
  return until(s, ",}");
}

// Reads a .npy from `f`; `file` names it in errors. The data's size is checked against what is left of
// the stream (and the tensor against ondine::Limits) before the tensor is allocated.
inline Tensor load_npy_stream(std::istream& f, const std::string& file) {
  char magic[8];
  if (!f.read(magic, 8) || std::string(magic, 6) != "\x93NUMPY") throw Error("not a .npy file").in_file(file);
  std::uint32_t header_len = 0;
  if (magic[6] == 1) {
    unsigned char b[2];
    if (!f.read(reinterpret_cast<char*>(b), 2)) throw Error("truncated .npy header").in_file(file);
    header_len = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    if (!f.read(reinterpret_cast<char*>(b), 4)) throw Error("truncated .npy header").in_file(file);
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<std::uint32_t>(b[3]) << 24);
  }
  if (header_len > (1u << 20)) throw Error("implausible .npy header length").in_file(file);
  std::string header(header_len, '\0');
  if (!f.read(header.data(), header_len)) throw Error("truncated .npy header").in_file(file);
  DType dtype = npy_dtype(npy_field(header, "descr", file), file);
  if (npy_field(header, "fortran_order", file) != "False")
    throw Error("Fortran-order .npy is not supported").in_file(file);
  std::vector<std::int64_t> dims;
  std::stringstream ss(npy_field(header, "shape", file));
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.find_first_not_of(' ') == std::string::npos) continue;
    std::size_t used = 0;
    try {
      dims.push_back(std::stoll(item, &used));
    } catch (const std::exception&) {
      throw Error("bad shape in .npy header").in_file(file);
    }
    if (item.find_first_not_of(' ', used) != std::string::npos) throw Error("bad shape in .npy header").in_file(file);
  }
  std::uint64_t nbytes;
  try {
    nbytes = checked_tensor_bytes(dims, dtype_size(dtype), ".npy data");
  } catch (Error& e) {
    throw e.in_file(file);
  }
  const auto here = f.tellg();
  if (here >= 0 && f.seekg(0, std::ios::end)) {
    const auto end = f.tellg();
    f.seekg(here);
    if (end >= here && static_cast<std::uint64_t>(end - here) < nbytes)
      throw Error("truncated .npy data: expected " + std::to_string(nbytes) + " bytes, the file has " +
                  std::to_string(static_cast<std::uint64_t>(end - here)))
          .in_file(file);
  }
  f.clear();
  Tensor t(dtype, dims);
  if (t.nbytes() && !f.read(static_cast<char*>(t.raw()), static_cast<std::streamsize>(t.nbytes())))
    throw Error("truncated .npy data: expected " + std::to_string(t.nbytes()) + " bytes").in_file(file);
  if (dtype == DType::Bool) {  // bool storage holds 0/1 only
    auto* b = static_cast<unsigned char*>(t.raw());
    for (std::int64_t i = 0; i < t.numel(); ++i) b[i] = b[i] ? 1 : 0;
  }
  return t;
}

}  // namespace detail

inline Tensor load_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open file").in_file(path);
  return detail::load_npy_stream(f, path);
}

// A .npy held in memory; `name` is what errors call it.
inline Tensor load_npy_from_memory(const void* data, std::size_t size, const std::string& name) {
  std::istringstream f(std::string(static_cast<const char*>(data), size), std::ios::binary);
  return detail::load_npy_stream(f, name);
}

inline void save_npy(const Tensor& t, const std::string& path) {
  std::string shape = "(";
  for (std::size_t i = 0; i < t.rank(); ++i) shape += std::to_string(t.dims()[i]) + (t.rank() == 1 || i + 1 < t.rank() ? "," : "");
  shape += ")";
  std::string header = "{'descr': '" + detail::npy_descr(t.dtype()) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  std::size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error("cannot write file").in_file(path);
  f.write("\x93NUMPY\x01\x00", 8);
  unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff), static_cast<unsigned char>(header.size() >> 8)};
  f.write(reinterpret_cast<const char*>(len), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
  if (!f) throw Error("write failed").in_file(path);
}

}  // namespace ondine
