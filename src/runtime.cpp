// SPDX-License-Identifier: Apache-2.0
// The library ondine::runtime: all of Model but Model::compile (ondine/model.hpp, ondine/runtime.hpp) compiled once,
// with oneDNN and no ONNX or protobuf; and the core tables that ondine/ondine.hpp declares for programs built over
// the libraries (ondine/config.hpp: this file defines ONDINE_IMPLEMENT_CORE).
#include "ondine/impl/model_runtime.hpp"
#include "ondine/ir/shape_inference.hpp"
#include "ondine/passes/pipeline.hpp"
#include "ondine/reference/executor.hpp"

#if ONDINE_CORE_DECLARATIONS_ONLY
#error "src/runtime.cpp defines the core tables: build it with ONDINE_IMPLEMENT_CORE"
#endif
