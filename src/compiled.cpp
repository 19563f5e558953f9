// SPDX-License-Identifier: Apache-2.0
// The library ondine::compiled: Model::compile (ondine/model.hpp) compiled once: the ONNX import and export, the
// parts that need protobuf (ondine/config.hpp: this file defines ONDINE_IMPLEMENT_ONNX); the lowering is
// ondine::runtime's (Model::from_graph).
#include "ondine/impl/model_compile.hpp"
#include "ondine/onnx/export.hpp"
#include "ondine/onnx/import.hpp"

#if ONDINE_ONNX_DECLARATIONS_ONLY
#error "src/compiled.cpp defines the ONNX import and export: build it with ONDINE_IMPLEMENT_ONNX"
#endif
