// SPDX-License-Identifier: Apache-2.0
// ondine/lower/lower.hpp - the compiler (lower/compiler.hpp) with the pass layer: CompileOptions::passes runs
// the pass pipeline (ondine/passes/pipeline.hpp, registered with the compiler through ir/pipeline_hook.hpp
// when the program starts, as are the passes "quantize" and "quantize-dynamic") on compile's copy of the
// graph before lowering. The registration makes the translation units that include this header generate
// the code of the whole pass layer and the reference kernels (what compiling needs anyway): include it
// where models are compiled, and ondine/ondine.hpp (seconds) elsewhere.
//
//   ondine::CompiledModel model = ondine::lower::compile(graph, {/*threads*/ 4});  // the default pipeline
//
// lower/error_bound.hpp adds bf16 under an error bound (compile_bf16_within). ondine/runtime.hpp is the
// compiler without the pass layer, for artifacts whose passes already ran.
#pragma once

#include "ondine/lower/compiler.hpp"
#include "ondine/lower/error_bound.hpp"
#include "ondine/lower/isa.hpp"
#include "ondine/lower/tune.hpp"
#include "ondine/passes/pipeline.hpp"
#include "ondine/quant/qdq.hpp"
#include "ondine/quant/quantize_dynamic.hpp"

namespace ondine::lower {

namespace detail {
inline const bool pass_layer_registered =
    (register_pipeline_with_compiler(), ::ondine::quant::register_quantize_pass(), register_quantize_dynamic_pass(),
     true);
}  // namespace detail

// The pass options the target ISA (by default this CPU's) needs (true when it set some): without VNNI,
// fuse-qdq leaves int8 layers with 8-bit weights in float (or, `int8_7bit_weights`, requantizes them). compile() sets them itself; whoever runs a
// pipeline for a compiled model outside compile() (`ondine compile -o MODEL.ondine --target ...`) sets
// them with this.
inline bool set_isa_pass_options(PassManager& pm, const IsaInfo& target = effective_isa(),
                                 bool int8_7bit_weights = true) {
  if (target.int8_vnni) return false;
  limit_int8_fusion(pm, int8_7bit_weights);
  return true;
}

}  // namespace ondine::lower
