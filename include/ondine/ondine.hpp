// SPDX-License-Identifier: Apache-2.0
// ondine/ondine.hpp - the one entry header of Ondine.
//
// Including it brings the core of the library: IR, ONNX import/export, shape inference, the pass layer
// and the reference executor. Two parts are opt-in, each one include away: "ondine/quant.hpp"
// (calibration, Q/DQ insertion, dynamic quantization, error metrics) and "ondine/lower/lower.hpp" (the
// compiler onto oneDNN). Code that only needs the IR includes "ondine/ir/graph.hpp" and does not pay for
// protobuf's or oneDNN's headers; code that only compiles and runs models includes "ondine/model.hpp"
// (declarations; the compiler is the prebuilt library ondine::compiled).
#pragma once

#include "ondine/error.hpp"
#include "ondine/fwd.hpp"
#include "ondine/ir/graph.hpp"
#include "ondine/ir/npy.hpp"
#include "ondine/ir/shape_inference.hpp"
#include "ondine/ir/stats.hpp"
#include "ondine/ir/typed_tensor.hpp"
#include "ondine/onnx/export.hpp"
#include "ondine/onnx/import.hpp"
#include "ondine/passes/pattern.hpp"
#include "ondine/passes/pipeline.hpp"
#include "ondine/passes/rewrite.hpp"
#include "ondine/reference/executor.hpp"

namespace ondine {
inline constexpr const char* version = "0.1.0";
}  // namespace ondine
