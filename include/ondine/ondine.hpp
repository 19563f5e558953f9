// ondine/ondine.hpp - the one entry header of Ondine.
//
// Including it brings the whole library: IR, ONNX import/export, shape inference and the reference
// executor. Code that only needs the IR includes "ondine/ir/graph.hpp" and does not pay for
// protobuf's or oneDNN's headers.
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
#include "ondine/quant/calibration.hpp"
#include "ondine/quant/metrics.hpp"
#include "ondine/quant/qdq.hpp"
#include "ondine/quant/quantize_dynamic.hpp"
#include "ondine/reference/executor.hpp"

namespace ondine {
inline constexpr const char* version = "0.1.0";
}  // namespace ondine
