// SPDX-License-Identifier: Apache-2.0
// ondine/quant.hpp - post-training int8 quantization: observers and calibration, Q/DQ insertion (and
// ondine.QLSTM for LSTMs), dynamic quantization of matrix products, and the error metrics that compare a
// quantized model with its float original (docs/quantization.md).
//
// Kept out of ondine/ondine.hpp so that a program that only loads, inspects or runs models does not parse
// it (it is a third of that header's compile time). The passes "quantize" and "quantize-dynamic" are
// registered with the pipeline by ondine/lower/lower.hpp, which includes what they need.
#pragma once

#include "ondine/ondine.hpp"
#include "ondine/quant/calibration.hpp"
#include "ondine/quant/metrics.hpp"
#include "ondine/quant/qdq.hpp"
#include "ondine/quant/quantize_dynamic.hpp"
#include "ondine/quant/weight_only.hpp"
