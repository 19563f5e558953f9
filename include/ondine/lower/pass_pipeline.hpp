// SPDX-License-Identifier: Apache-2.0
// ondine/lower/pass_pipeline.hpp - how compiling runs CompileOptions::passes: the pass layer's pipeline
// (passes/pipeline.hpp) with the quantization passes (quant/) and the limits this CPU's int8 kernels need.
//
// The compiler calls the pass layer directly, in one direction (import -> passes -> shapes -> lowering); a
// pipeline that names an unknown pass is an Error listing the known ones.
#pragma once

#include <sstream>
#include <string>

#include "ondine/ir/graph.hpp"
#include "ondine/lower/int8_plan.hpp"
#include "ondine/lower/isa.hpp"
#include "ondine/lower/options.hpp"
#include "ondine/passes/pipeline.hpp"
#include "ondine/quant/qdq.hpp"
#include "ondine/quant/quantize_dynamic.hpp"

namespace ondine::lower {

// Adds the quantization passes ("quantize", "quantize-dynamic") to pass_registry(), once; compiling does
// it itself. A program that builds its own PassManager with them, without compiling first, calls it.
inline void register_quantization_passes() {
  static const bool registered = (quant::register_quantize_pass(), register_quantize_dynamic_pass(), true);
  (void)registered;
}

// The pass options the target ISA (by default this CPU's) needs (true when it set some): without VNNI,
// fuse-qdq leaves int8 layers with 8-bit weights in float (or, `int8_7bit_weights`, requantizes them). Also,
// whatever the ISA, dft-conv-as-stft is off in a build without KissFFT.
// compile() sets them itself; whoever runs a pipeline for a compiled model outside compile() (`ondine compile
// -o MODEL.ondine --target ...`) sets them with this.
inline bool set_isa_pass_options(PassManager& pm, const IsaInfo& target = effective_isa(),
                                 bool int8_7bit_weights = true) {
#if !(defined(ONDINE_HAVE_KISSFFT) && __has_include(<kissfft/kiss_fft.h>))
  // STFT would run the reference kernel (lower/detail/signal.hpp): a DFT convolution stays a convolution.
  pm.context().options.emplace("dft-conv-as-stft.off", "1");
#endif
  if (target.int8_vnni) return false;
  limit_int8_fusion(pm, int8_7bit_weights);
  return true;
}

namespace detail {

// Runs `pipeline` on `g` and returns whether a pass changed it. With `isa_limits`, the int8 limits of this
// CPU apply (set_isa_pass_options); `options.log` gets what the passes did, unless `quiet`.
inline bool run_pipeline(Graph& g, const std::string& pipeline, const CompileOptions& options, bool isa_limits,
                         bool quiet = false) {
  register_quantization_passes();
  PassManager pm = make_pass_manager(pipeline);
  if (pm.size() == 0) return false;
  if (!options.weight_only_int8_activations) pm.context().options.emplace("fuse-weight-only.activations", "float32");
  const bool log = options.log && !quiet;
  // The rates are measured (once per process, then cached) only when nobody chose.
  const bool seven_bit = isa_limits && !effective_isa().int8_vnni &&
                         (options.int8_7bit_weights ? *options.int8_7bit_weights : int8_7bit_weights_by_default());
  if (isa_limits && set_isa_pass_options(pm, effective_isa(), seven_bit) && log)
    options.log(seven_bit
                    ? "int8: no VNNI on this CPU: QDQ Conv/MatMul/Gemm int8 weights beyond +-64 requantized to 7 "
                      "bits (w/2 rounded to even, scales doubled); layers reading s8 activations stay float"
                    : "int8: no VNNI on this CPU: QDQ Conv/MatMul/Gemm layers with int8 weights beyond +-64 or s8 "
                      "activations stay float");
  const bool changed = pm.run(g);
  if (log) {
    options.log("passes: " + pm.pipeline());
    std::istringstream summary(pm.summary_text());
    for (std::string line; std::getline(summary, line);) options.log(line);
  }
  return changed;
}

}  // namespace detail
}  // namespace ondine::lower
