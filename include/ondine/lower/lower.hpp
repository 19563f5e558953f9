// SPDX-License-Identifier: Apache-2.0
// ondine/lower/lower.hpp - the compiler: the driver (lower/compiler.hpp: passes, shapes, lowering), ShapeCache for
// symbolic dims, bf16 under an error bound (lower/error_bound.hpp) and the tuner (lower/tune.hpp).
//
//   ondine::CompiledModel model = ondine::lower::compile(graph, {/*threads*/ 4});  // the default pipeline
//
// Including it costs a translation unit the whole compiler's parse (docs/library.md, "Include cost"); a host
// that compiles models from several files includes the light ondine/model.hpp instead.
#pragma once

#include "ondine/lower/compiler.hpp"
#include "ondine/lower/error_bound.hpp"
#include "ondine/lower/isa.hpp"
#include "ondine/lower/pass_pipeline.hpp"
#include "ondine/lower/shape_cache.hpp"
#include "ondine/lower/tune.hpp"
