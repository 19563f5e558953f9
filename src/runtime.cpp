// SPDX-License-Identifier: Apache-2.0
// The library ondine::runtime: all of Model but Model::compile (ondine/model.hpp, ondine/runtime.hpp) compiled once,
// with oneDNN and no ONNX or protobuf.
#include "ondine/impl/model_runtime.hpp"
