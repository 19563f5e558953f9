// SPDX-License-Identifier: Apache-2.0
// ondine/impl/model_compile.hpp - the definition of Model::compile (ondine/model.hpp): the ONNX import, the one
// Model part that needs protobuf. Compiled once per program in one source file (the library ondine::compiled is
// that file: src/compiled.cpp; header-only, ondine/model_impl.hpp); the lowering is Model::from_graph's, in
// ondine::runtime.
#pragma once

#include <string>

#include "ondine/ir/graph.hpp"
#include "ondine/model.hpp"
#include "ondine/onnx/import.hpp"

namespace ondine {

Model Model::compile(const std::string& onnx_path, const lower::CompileOptions& options) {
  return from_graph(onnx::load_model(onnx_path), options);
}

}  // namespace ondine
