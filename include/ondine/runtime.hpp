// SPDX-License-Identifier: Apache-2.0
// ondine/runtime.hpp - loading and running compiled artifacts (`ondine compile MODEL -o MODEL.ondine`) from a host
// program: Model, Tensor and .npy files behind a light header, over the library ondine::runtime (oneDNN and
// OpenMP; no ONNX, no protobuf), which holds the lowering compiled once (src/runtime.cpp).
//
//   #include <ondine/runtime.hpp>
//
//   ondine::lower::CompileOptions options;
//   options.threads = 2;
//   ondine::Model model = ondine::Model::load("model.ondine", options);   // checked for this CPU, mapped
//   auto outputs = model.run({{"input", ondine::load_npy("input.npy")}});
//
// An artifact with symbolic dims is specialised per input shape from its stored graph (shape inference and
// the lowering; its passes ran when it was written). Header-only instead: one source file of the program
// includes ondine/impl/model_runtime.hpp (tests/runtime_test.sh builds a host both ways).
#pragma once

#include "ondine/error.hpp"
#include "ondine/ir/npy.hpp"
#include "ondine/ir/tensor.hpp"
#include "ondine/ir/typed_tensor.hpp"
#include "ondine/model.hpp"
