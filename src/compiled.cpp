// SPDX-License-Identifier: Apache-2.0
// The library ondine::compiled: Model::compile (ondine/model.hpp) compiled once: the ONNX import;
// the lowering is ondine::runtime's (Model::from_graph).
#include "ondine/impl/model_compile.hpp"
