// SPDX-License-Identifier: Apache-2.0
// ondine/ir/dtype.hpp - element types, 16-bit float storage types and type dispatch.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "ondine/error.hpp"

namespace ondine {

enum class DType : std::uint8_t {
  Undefined,
  Float32,
  Float16,
  BFloat16,
  Float64,
  Int8,
  UInt8,
  Int16,
  UInt16,
  Int32,
  UInt32,
  Int64,
  UInt64,
  Bool,
  String,  // recognised so errors can name it; no kernel computes on strings
  // 4-bit integers (opset 21): held one element per byte in memory (int8 / uint8 storage, values in
  // [-8, 7] / [0, 15]) so every kernel indexes them like bytes; files pack two per byte, low nibble first.
  Int4,
  UInt4,
};

// IEEE half precision, stored as bits; arithmetic happens in float.
struct float16 {
  std::uint16_t bits = 0;
  float16() = default;
  explicit float16(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }

  static float to_float(std::uint16_t h) {
    std::uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, out;
    if (exp == 0) {
      if (mant == 0) {
        out = sign;
      } else {  // subnormal: normalise
        exp = 127 - 15 + 1;
        while (!(mant & 0x400u)) {
          mant <<= 1;
          --exp;
        }
        mant &= 0x3ffu;
        out = sign | (exp << 23) | (mant << 13);
      }
    } else if (exp == 0x1f) {
      out = sign | 0x7f800000u | (mant << 13);
    } else {
      out = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &out, 4);
    return f;
  }
  static std::uint16_t from_float(float f) {
    std::uint32_t x;
    std::memcpy(&x, &f, 4);
    std::uint32_t sign = (x >> 16) & 0x8000u;
    std::uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow -> inf
    if (abs < 0x38800000u) {  // subnormal or zero in half: round to nearest even
      float af;
      std::memcpy(&af, &abs, 4);
      float scaled = af * 16777216.0f;  // 2^24
      auto m = static_cast<std::uint32_t>(scaled);
      float rem = scaled - static_cast<float>(m);
      if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
      return static_cast<std::uint16_t>(sign | m);
    }
    std::uint32_t e = ((abs >> 23) - 127 + 15) << 10;
    std::uint32_t m = (abs >> 13) & 0x3ffu;
    std::uint32_t rest = abs & 0x1fffu;
    std::uint32_t h = e | m;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
};

// bfloat16: the upper half of a float32, rounded to nearest even.
struct bfloat16 {
  std::uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float f) {
    std::uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<std::uint16_t>((x >> 16) | 0x40u);  // keep NaN a NaN
    } else {
      x += 0x7fffu + ((x >> 16) & 1u);
      bits = static_cast<std::uint16_t>(x >> 16);
    }
  }
  operator float() const {
    std::uint32_t x = static_cast<std::uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
  }
};

inline std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32: case DType::Int32: case DType::UInt32: return 4;
    case DType::Float16: case DType::BFloat16: case DType::Int16: case DType::UInt16: return 2;
    case DType::Float64: case DType::Int64: case DType::UInt64: return 8;
    case DType::Int8: case DType::UInt8: case DType::Bool: case DType::Int4: case DType::UInt4: return 1;
    case DType::String: case DType::Undefined: return 0;
  }
  return 0;
}

// Names of the ONNX TensorProto element types Ondine does not represent, for error messages: Debian's
// libonnx (1.12) predates the float8 (opset 19), 4-bit float (opset 23) and later codes, so protobuf's own
// enum cannot name them. Empty for codes with a DType or unknown to ONNX.
inline std::string_view onnx_unsupported_type_name(std::int64_t code) {
  switch (code) {
    case 14: return "COMPLEX64";
    case 15: return "COMPLEX128";
    case 17: return "FLOAT8E4M3FN";
    case 18: return "FLOAT8E4M3FNUZ";
    case 19: return "FLOAT8E5M2";
    case 20: return "FLOAT8E5M2FNUZ";
    case 23: return "FLOAT4E2M1";
    case 24: return "FLOAT8E8M0";
    case 25: return "UINT2";
    case 26: return "INT2";
    default: return "";
  }
}

inline std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::Undefined: return "undefined";
    case DType::Float32: return "float32";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float64: return "float64";
    case DType::Int8: return "int8";
    case DType::UInt8: return "uint8";
    case DType::Int16: return "int16";
    case DType::UInt16: return "uint16";
    case DType::Int32: return "int32";
    case DType::UInt32: return "uint32";
    case DType::Int64: return "int64";
    case DType::UInt64: return "uint64";
    case DType::Bool: return "bool";
    case DType::String: return "string";
    case DType::Int4: return "int4";
    case DType::UInt4: return "uint4";
  }
  return "?";
}

inline bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16 || t == DType::Float64;
}
inline bool is_int4(DType t) { return t == DType::Int4 || t == DType::UInt4; }
// The 8-bit integer type that stores a 4-bit one; other types unchanged.
inline DType int4_storage(DType t) {
  return t == DType::Int4 ? DType::Int8 : t == DType::UInt4 ? DType::UInt8 : t;
}
// Arithmetic integers (the 4-bit types are not: only quantization, casts and data movement take them).
inline bool is_integer(DType t) {
  return t == DType::Int8 || t == DType::UInt8 || t == DType::Int16 || t == DType::UInt16 ||
         t == DType::Int32 || t == DType::UInt32 || t == DType::Int64 || t == DType::UInt64;
}

// C++ type <-> DType.
template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::Float32; };
template <> struct dtype_of<float16> { static constexpr DType value = DType::Float16; };
template <> struct dtype_of<bfloat16> { static constexpr DType value = DType::BFloat16; };
template <> struct dtype_of<double> { static constexpr DType value = DType::Float64; };
template <> struct dtype_of<std::int8_t> { static constexpr DType value = DType::Int8; };
template <> struct dtype_of<std::uint8_t> { static constexpr DType value = DType::UInt8; };
template <> struct dtype_of<std::int16_t> { static constexpr DType value = DType::Int16; };
template <> struct dtype_of<std::uint16_t> { static constexpr DType value = DType::UInt16; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::Int32; };
template <> struct dtype_of<std::uint32_t> { static constexpr DType value = DType::UInt32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::Int64; };
template <> struct dtype_of<std::uint64_t> { static constexpr DType value = DType::UInt64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::Bool; };
template <typename T> inline constexpr DType dtype_v = dtype_of<T>::value;

namespace detail {
template <typename T> struct type_tag { using type = T; };
}  // namespace detail

// Calls f(type_tag<T>{}) with T the C++ type of `t`. Kernels write one generic lambda and get every dtype.
// Throws for String/Undefined.
template <typename F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  using detail::type_tag;
  switch (t) {
    case DType::Float32: return f(type_tag<float>{});
    case DType::Float16: return f(type_tag<float16>{});
    case DType::BFloat16: return f(type_tag<bfloat16>{});
    case DType::Float64: return f(type_tag<double>{});
    case DType::Int8: return f(type_tag<std::int8_t>{});
    case DType::UInt8: return f(type_tag<std::uint8_t>{});
    case DType::Int16: return f(type_tag<std::int16_t>{});
    case DType::UInt16: return f(type_tag<std::uint16_t>{});
    case DType::Int32: return f(type_tag<std::int32_t>{});
    case DType::UInt32: return f(type_tag<std::uint32_t>{});
    case DType::Int64: return f(type_tag<std::int64_t>{});
    case DType::UInt64: return f(type_tag<std::uint64_t>{});
    case DType::Bool: return f(type_tag<bool>{});
    case DType::Int4: return f(type_tag<std::int8_t>{});   // storage type (see DType::Int4)
    case DType::UInt4: return f(type_tag<std::uint8_t>{});
    default: break;
  }
  throw Error("unsupported element type " + std::string(dtype_name(t)));
}

// Reads element i of a buffer of dtype t as double (exact for every integer type below 2^53).
inline double load_as_double(DType t, const void* data, std::size_t i) {
  return dispatch_dtype(t, [&](auto tag) -> double {
    using T = typename decltype(tag)::type;
    return static_cast<double>(static_cast<const T*>(data)[i]);
  });
}

}  // namespace ondine
