// ondine/lower/artifact.hpp - `.ondine` artifacts (artifact/artifact.hpp) written from and compiled to oneDNN.
//
//   Graph g = onnx::load_model("model.onnx");
//   lower::prepare_for_passes(g);                   // what compile() does before its passes
//   PassManager pm = make_pass_manager("default");  // `ondine compile -o model.ondine` does these three
//   lower::set_isa_pass_options(pm);
//   pm.run(g);
//   lower::save_artifact(g, "model.ondine", lower::artifact_info(g, "model.onnx", "default", threads));
//   artifact::Artifact a = lower::load_artifact("model.ondine");   // checked for this CPU and oneDNN
//   lower::ShapeCache model(std::move(a.graph), lower::artifact_options(options));
//
// Writing stores the optimised graph with the target it was compiled for: oneDNN's ISA, the thread count,
// the precision (int8 when it has int8 layers), whether those layers need VNNI (fuse-qdq keeps 8-bit
// weights only where the compiling CPU has it: int8 products would saturate without), and the versions.
// Loading refuses, naming both sides, an artifact whose int8 layers need VNNI on a CPU without it, and one
// written against another oneDNN major.minor (the layout decisions stored are that version's). It then
// runs no ONNX import, no protobuf and no pass: artifact_options() turns the pipeline off, and compile()
// only infers shapes (cheap) and lowers. A graph with symbolic dims is specialised per input shape by a
// ShapeCache, which may fold the values shapes depend on (resolve_static_shapes: fold-constants on shape
// values) but runs no pass; a static graph compiles as it is.
// What this version does not store yet: oneDNN's packed weights (2.6 cannot save a primitive; the weights
// are packed at load from the mapped plain ones), and variants for several ISAs.
#pragma once

#include <string>

#include "oneapi/dnnl/dnnl.h"

#include "ondine/artifact/artifact.hpp"
#include "ondine/lower/isa.hpp"
#include "ondine/lower/lower.hpp"

namespace ondine::lower {

// "2.6.3"
inline std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

// True when `g` (or a subgraph) has int8 compute layers.
inline bool has_int8_layers(const Graph& g) {
  for (const Node* n : g.nodes()) {
    const std::string& key = n->op_key();
    if (key == "ondine.QConv" || key == "ondine.QMatMul" || key == "ondine.QPool" || key == "ondine.DynQMatMul" ||
        key == "ondine.QLSTM" || key == "QuantizeLinear" || key == "DynamicQuantizeLinear" || key == "QLinearConv" ||
        key == "QLinearMatMul" || key == "ConvInteger" || key == "MatMulInteger")
      return true;
    for (auto& [attr, sub] : n->subgraphs())
      if (has_int8_layers(*sub)) return true;
  }
  return false;
}

// The Info of an artifact of `optimised` (the graph after `passes`) compiled on this CPU now.
inline artifact::Info artifact_info(const Graph& optimised, const std::string& source, const std::string& passes,
                                    int threads) {
  artifact::Info info;
  info.onednn_version = onednn_version();
  info.source = source;
  info.isa = effective_isa().name;
  info.threads = threads;
  info.precision = has_int8_layers(optimised) ? "int8" : "fp32";
  info.passes = passes;
  // fuse-qdq keeps 8-bit weights only where this CPU has VNNI (run_passes); where it does not, the
  // pipeline limited them to 7 bits and any CPU runs the layers exactly.
  info.requires_vnni = info.precision == "int8" && effective_isa().int8_vnni;
  return info;
}

// What compile() does to a graph before its passes, for any shapes: infer them, and make the weights that
// subgraphs capture from the enclosing graph constants of the subgraph (so passes fuse and pack inside
// If branches and loop bodies). An artifact's graph is prepared so, then run through the passes.
inline void prepare_for_passes(Graph& g) {
  infer_shapes(g);
  detail::inline_constant_captures(g);
}

inline void save_artifact(const Graph& optimised, const std::string& path, const artifact::Info& info) {
  artifact::write(optimised, info, path);
}

// The artifact at `path`, read, checked (artifact::read) and checked against this CPU and this oneDNN.
inline artifact::Artifact load_artifact(const std::string& path) {
  artifact::Artifact a = artifact::read(path);
  const std::string here = onednn_version();
  auto major_minor = [](const std::string& v) { return v.substr(0, v.find('.', v.find('.') + 1)); };
  if (major_minor(a.info.onednn_version) != major_minor(here))
    throw Error("written against oneDNN " + a.info.onednn_version + ", this program runs oneDNN " + here +
                ": recompile the model (ondine compile ... -o ...)")
        .in_file(path);
  if (a.info.requires_vnni && !effective_isa().int8_vnni)
    throw Error("its int8 layers need VNNI (compiled on " + a.info.isa + "); this CPU has " + effective_isa().name +
                ", without VNNI: recompile the model here (8-bit weights stay fp32 then) or quantize with "
                "--reduce-range")
        .in_file(path);
  return a;
}

// `options` for compiling an artifact's graph: its passes already ran.
inline CompileOptions artifact_options(CompileOptions options) {
  options.passes = "none";
  return options;
}

}  // namespace ondine::lower
