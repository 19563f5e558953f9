// SPDX-License-Identifier: Apache-2.0
// ondine/runtime.hpp - loading and running compiled artifacts (`ondine compile MODEL -o MODEL.ondine`) with
// oneDNN alone: no ONNX, no protobuf, no pass layer in the translation unit (tests/runtime_test.sh checks the
// headers it pulls in; CMake target ondine::runtime links oneDNN and OpenMP only).
//
//   #include <ondine/runtime.hpp>
//
//   ondine::artifact::Artifact a = ondine::lower::load_artifact("model.ondine");  // checked, mapped
//   ondine::lower::CompileOptions options;
//   options.threads = 2;
//   ondine::lower::ShapeCache model(std::move(a.graph), ondine::lower::artifact_options(options, a));
//   auto outputs = model.run({{"input", ondine::load_npy("input.npy")}});
//
// An artifact with symbolic dims is specialised per input shape from its stored graph (shape inference and
// the lowering; the passes ran when it was written). What the runtime cannot do: import ONNX or run a pass
// pipeline (CompileOptions::passes must be "none", which artifact_options() sets).
#pragma once

#include "ondine/artifact/artifact.hpp"
#include "ondine/error.hpp"
#include "ondine/ir/graph.hpp"
#include "ondine/ir/npy.hpp"
#include "ondine/ir/stats.hpp"
#include "ondine/ir/typed_tensor.hpp"
#include "ondine/lower/artifact.hpp"
#include "ondine/lower/compiler.hpp"
#include "ondine/lower/shape_cache.hpp"
#include "ondine/runtime/compiled_model.hpp"
