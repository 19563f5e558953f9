// ondine/passes/fold_batchnorm.hpp - fold-bn: folds BatchNormalization into the preceding Conv/ConvTranspose/Gemm/MatMul, or turns a lone BN into Mul+Add.
// (stub: being written)
#pragma once

#include "ondine/passes/pass.hpp"

namespace ondine {

struct FoldBatchNorm {
  static constexpr const char* name = "fold-bn";
  bool run(Graph&, PassContext&) { return false; }
};

}  // namespace ondine
