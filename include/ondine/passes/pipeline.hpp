// SPDX-License-Identifier: Apache-2.0
// ondine/passes/pipeline.hpp - the graph passes built in, the process-wide pass registry, and the default
// pipeline that `ondine compile` and lower::compile run. The built-in passes are compiled once in ondine::runtime
// when the program is built over the prebuilt libraries (ondine/config.hpp); their headers then stay out of the
// files that include this one (include a pass's own header to use its class).
//
//   Graph g = onnx::load_model("resnet50.onnx");
//   PassManager pm = make_pass_manager();           // the default pipeline
//   pm.run(g);
//
//   pass_registry().add<MyPass>();                    // a user pass becomes nameable in pipelines
//   PassManager custom = make_pass_manager("fold-bn,my-pass,fuse");
#pragma once

#include <istream>
#include <sstream>
#include <string>

#include "ondine/config.hpp"
#include "ondine/passes/pass_manager.hpp"

namespace ondine {

// The pipeline for inference: clean up, fold, fuse into what oneDNN runs as one primitive, then
// decide layouts. Order matters: widen-float16 runs first, so that every later pass and the lowering see a
// float16 model in float32 (and remove-identity drops the Casts it leaves as identities); BN folds into a Conv before the Conv takes its post-ops (and into a
// ConvTranspose before deconv-as-conv turns it into a Conv, whose activation fuse then takes); Gelu and
// LayerNorm are recognised before post-op fusion so MatMul+Add+Gelu can fuse (GroupNorm there too, before
// fuse could take its affine Mul/Add); fuse-qdq runs before
// fold-constants, which would fold the weights' DequantizeLinear into float32 constants (as does
// fuse-weight-only, for 4- and 8-bit weights under float activations);
// qoperator-to-qdq runs first so that fuse-qdq sees QLinearConv/QLinearMatMul models in the QDQ form;
// fuse-dynamic-qmatmul and fuse-dynamic-qconv find dynamically quantized matrix products and
// convolutions (ONNX Runtime's quantize_dynamic, or "quantize-dynamic,default") after fuse-gelu, so
// that they take their Gelu too, and before fuse, which would take their bias Add; fuse-attention runs
// after fold-constants (a causal mask built from the sequence length is a constant by then) and before
// fuse, which would otherwise take the scores' scale or mask as post-ops of a plain MatMul;
// pointwise-as-conv runs after fuse-gelu and fuse-layernorm (its detours are LayerNorm, MatMul, Gelu) and
// before fuse, which then gives the 1x1 Convs it makes their activations and residual sums; unroll-loops
// runs between two fold-constants: a trip count computed from shapes is folded first, and the unrolled
// iterations' reads of the iteration number, and the sequence elements they build, fold after;
// dft-conv-as-stft runs before fold-pad and fuse, which would give the DFT's Conv pads or post-ops.
inline const char* default_pipeline() {
  return "widen-float16,qoperator-to-qdq,remove-identity,fuse-qdq,fake-quant,fuse-weight-only,fold-constants*,unroll-loops,fold-constants*,dce,fold-bn,dft-conv-as-stft,fold-pad,deconv-as-conv,scatter-rows,scatter-slices,fuse-gelu,fuse-layernorm,fuse-rmsnorm,fuse-rotary,fuse-groupnorm,pointwise-as-conv,fuse-attention,fuse-dynamic-qmatmul,fuse-dynamic-qconv,fuse,cancel-transposes,layout,dce";
}

// The process-wide registry: every built-in pass, plus whatever the program adds.
ONDINE_CORE_FUNC PassRegistry& pass_registry();

// The pipeline with each "default" entry spelled out ("fold-bn,default" -> "fold-bn,remove-identity,...");
// "none" and "" are no passes.
inline std::string expand_pipeline(const std::string& pipeline) {
  std::string out;
  for (auto& [name, repeat] : PassManager::parse_pipeline(pipeline)) {
    if (name == "default" && repeat) throw Error("pipeline '" + pipeline + "': 'default' cannot be repeated");
    out += (out.empty() ? "" : ",") + (name == "default" ? std::string(default_pipeline()) : name + (repeat ? "*" : ""));
  }
  return out;
}

inline PassManager make_pass_manager(const std::string& pipeline = default_pipeline(),
                                     PassManager::Options options = {}) {
  PassManager pm(std::move(options));
  pm.add_pipeline(expand_pipeline(pipeline), pass_registry());
  return pm;
}

// The limits CPUs without VNNI need (passes/fuse_qdq.hpp: their int8 kernels saturate past 7-bit weights,
// so fuse-qdq leaves layers with 8-bit weights, or reading s8 activations, in float; with `halve_weights`
// it requantizes 8-bit weights to 7 bits instead, CompileOptions::int8_7bit_weights).
inline void limit_int8_fusion(PassManager& pm, bool halve_weights = false) {
  pm.context().options.emplace("fuse-qdq.max-abs-weight", "64");
  pm.context().options.emplace("fuse-qdq.u8-only", "1");
  if (halve_weights) pm.context().options.emplace("fuse-qdq.halve-weights", "1");
}

}  // namespace ondine

// The definitions: in every file of a header-only program, in ondine::runtime alone otherwise.
#if !ONDINE_CORE_DECLARATIONS_ONLY
#include "ondine/passes/cancel_transposes.hpp"
#include "ondine/passes/dce.hpp"
#include "ondine/passes/deconv_as_conv.hpp"
#include "ondine/passes/dft_conv_as_stft.hpp"
#include "ondine/passes/fake_quant.hpp"
#include "ondine/passes/fold_batchnorm.hpp"
#include "ondine/passes/fold_constants.hpp"
#include "ondine/passes/fold_pad.hpp"
#include "ondine/passes/fuse_attention.hpp"
#include "ondine/passes/fuse_dynamic_qconv.hpp"
#include "ondine/passes/fuse_dynamic_qmatmul.hpp"
#include "ondine/passes/fuse_gelu.hpp"
#include "ondine/passes/fuse_groupnorm.hpp"
#include "ondine/passes/fuse_layernorm.hpp"
#include "ondine/passes/fuse_rmsnorm.hpp"
#include "ondine/passes/fuse_rotary.hpp"
#include "ondine/passes/fuse_post_ops.hpp"
#include "ondine/passes/fuse_qdq.hpp"
#include "ondine/passes/fuse_weight_only.hpp"
#include "ondine/passes/layout.hpp"
#include "ondine/passes/pointwise_as_conv.hpp"
#include "ondine/passes/qoperator_to_qdq.hpp"
#include "ondine/passes/remove_identity.hpp"
#include "ondine/passes/scatter_rows.hpp"
#include "ondine/passes/scatter_slices.hpp"
#include "ondine/passes/unroll_loops.hpp"
#include "ondine/passes/widen_float16.hpp"

namespace ondine {

ONDINE_CORE_FUNC PassRegistry& pass_registry() {
  static PassRegistry registry = [] {
    PassRegistry r;
    r.add<WidenFloat16>()
        .add<DeadCodeElimination>()
        .add<FoldConstants>()
        .add<RemoveIdentity>()
        .add<UnrollLoops>()
        .add<FoldBatchNorm>()
        .add<FoldPad>()
        .add<DeconvAsConv>()
        .add<DftConvAsStft>()
        .add<ScatterRows>()
        .add<ScatterSlices>()
        .add<FuseGelu>()
        .add<FuseLayerNorm>()
        .add<FuseRmsNorm>()
        .add<FuseRotary>()
        .add<FuseGroupNorm>()
        .add<PointwiseAsConv>()
        .add<FuseAttention>()
        .add<FusePostOps>()
        .add<FuseQdq>()
        .add<FakeQuantPairs>()
        .add<FuseWeightOnly>()
        .add<FuseDynamicQMatMul>()
        .add<FuseDynamicQConv>()
        .add<QOperatorToQdq>()
        .add<CancelTransposes>()
        .add<AssignLayouts>();
    // The quantization passes (quantize, quantize-dynamic) sit a layer up, in quant/: compiling adds them
    // (lower::register_quantization_passes, lower/pass_pipeline.hpp).
    return r;
  }();
  return registry;
}

}  // namespace ondine
#endif  // !ONDINE_CORE_DECLARATIONS_ONLY
