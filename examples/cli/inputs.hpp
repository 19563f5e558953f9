// examples/cli/inputs.hpp - seeded random inputs for the commands that run a model without given ones.
#pragma once

#include <cstdint>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "ondine/ondine.hpp"

namespace ondine::cli {

// Seeded random tensor: N(0,1) floats, integers in [0, 100), bools.
inline Tensor random_tensor(DType dtype, std::vector<std::int64_t> dims, std::mt19937_64& rng) {
  Tensor t(dtype, std::move(dims));
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> ints(0, 99);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = t.data<T>();
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      if constexpr (std::is_same_v<T, bool>) p[i] = ints(rng) % 2;
      else if constexpr (std::is_integral_v<T>) p[i] = static_cast<T>(ints(rng));
      else p[i] = T(static_cast<float>(normal(rng)));
    }
  });
  return t;
}

// Seeded random input for a graph input with static dims (random_tensor).
inline Tensor random_input(const Value& in, std::mt19937_64& rng) {
  if (!in.shape().is_static())
    throw Error("input '" + in.name() + "' has shape " + in.shape().str() +
                ": bind its symbolic dims with --dim NAME=SIZE or give it with --input");
  return random_tensor(in.dtype(), in.shape().sizes(), rng);
}

}  // namespace ondine::cli
