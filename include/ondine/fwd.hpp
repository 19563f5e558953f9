// SPDX-License-Identifier: Apache-2.0
// ondine/fwd.hpp - forward declarations of Ondine's main types, for headers that only pass them around.
#pragma once

#include <cstdint>

namespace ondine {
class Error;
enum class DType : std::uint8_t;
struct Dim;
class Shape;
class Tensor;
class Value;
class Node;
class Graph;
class ReferenceExecutor;
}  // namespace ondine
