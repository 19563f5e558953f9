// SPDX-License-Identifier: Apache-2.0
// ondine/lower/artifact.hpp - `.ondine` artifacts (artifact/artifact.hpp) written from and compiled to oneDNN.
//
//   Graph g = onnx::load_model("model.onnx");
//   lower::prepare_for_passes(g);                   // what compile() does before its passes
//   PassManager pm = make_pass_manager("default");  // `ondine compile -o model.ondine` does these three
//   lower::set_isa_pass_options(pm);
//   pm.run(g);
//   lower::save_artifact(g, "model.ondine", lower::artifact_info(g, "model.onnx", "default", threads));
//   artifact::Artifact a = lower::load_artifact("model.ondine");   // checked for this CPU and oneDNN
//   lower::ShapeCache model(std::move(a.graph), lower::artifact_options(options, a));
//
// Writing stores the optimised graph with the target it was compiled for: oneDNN's ISA, the thread count,
// the precision (int8 when it has int8 layers; bf16, with the nodes kept float32, when compiled so), whether those layers need VNNI (fuse-qdq keeps 8-bit
// weights only where the compiling CPU has it: int8 products would saturate without), and the versions.
// Loading refuses, naming both sides, an artifact whose int8 layers need VNNI on a CPU without it, a bf16
// variant where bf16 is not native, and one written against another oneDNN major.minor (the layout decisions
// stored are that version's). It then runs no ONNX import, no protobuf and no pass: artifact_options() turns
// the pipeline off and sets the variant's precision, and compile()
// only infers shapes (cheap) and lowers. A graph with symbolic dims is specialised per input shape by a
// ShapeCache, which may fold the values shapes depend on (resolve_static_shapes: fold-constants on shape
// values) but runs no pass; a static graph compiles as it is.
// Packed weights: oneDNN 2.6 cannot save a primitive, so the artifact stores what its primitives read,
// the weights packed into the layouts oneDNN chose (make_packings: one compile of the graph, symbolic dims
// bound to the sizes given or 1, at the thread count recorded). Loading preloads them (preload_packings:
// the packed bytes used in place from the mapping, nothing copied) and the lowering takes a stored packing
// wherever it asks for an equal memory descriptor; another ISA, thread count or shape that makes oneDNN
// choose another layout packs that weight again from the plain one, and PackedWeights::packed_here() counts
// those.
// Variants: one file may hold the model compiled for several targets (`ondine compile --target
// avx2,native`: each in its own process, since oneDNN's ISA can be capped only once per process, then
// artifact::combine). Loading picks the best variant this CPU runs (choose_variant: the highest ISA not above
// oneDNN's effective one) and refuses a file with none, naming the ISAs it has and the CPU's. A variant for an
// ISA the compiling CPU lacks (AMX on a Zen 4) was compiled with that ISA's pass options but stores no
// packed weights (Info::unpacked says why): its weights are packed at first load.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <omp.h>

#include "oneapi/dnnl/dnnl.h"

#include "ondine/artifact/artifact.hpp"
#include "ondine/lower/isa.hpp"
#include "ondine/lower/compiler.hpp"

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
    if (key == "ondine.QConv" || key == "ondine.QMatMul" || key == "ondine.QPool" || key == "ondine.DynQMatMul" || key == "ondine.DynQConv" ||
        key == "ondine.QLSTM" || key == "QuantizeLinear" || key == "DynamicQuantizeLinear" || key == "QLinearConv" ||
        key == "QLinearMatMul" || key == "ConvInteger" || key == "MatMulInteger")
      return true;
    for (auto& [attr, sub] : n->subgraphs())
      if (has_int8_layers(*sub)) return true;
  }
  return false;
}

// The precision a variant's float layers compile in: Bf16 for the labels "bf16" and "int8+bf16".
inline Precision artifact_precision(const artifact::Info& info) {
  return info.precision == "bf16" || info.precision == "int8+bf16" ? Precision::Bf16 : Precision::Fp32;
}

// The Info of an artifact of `optimised` (the graph after `passes`, run with the pass options of `target`:
// set_isa_pass_options) compiled for `target`, by default this CPU's ISA. `precision` is the float layers':
// Bf16 needs a target with native bf16 (an Error names it otherwise), Auto means Bf16 where the target's bf16
// is native and faster than fp32 (IsaInfo::bf16_faster) and Fp32 elsewhere. The label: "fp32", "bf16",
// "int8" (int8 layers), "int8+bf16".
inline artifact::Info artifact_info(const Graph& optimised, const std::string& source, const std::string& passes,
                                    int threads, const IsaInfo& target = effective_isa(),
                                    Precision precision = Precision::Fp32) {
  if (precision == Precision::Auto) precision = target.bf16_faster ? Precision::Bf16 : Precision::Fp32;
  if (precision == Precision::Bf16 && !target.bf16_native)
    throw Error("precision bf16 needs a target with native bf16 (avx512_core_bf16 or avx512_core_amx); " + target.name +
                " would emulate it, slower than fp32: compile that target in fp32 (or with precision auto)");
  artifact::Info info;
  info.onednn_version = onednn_version();
  info.source = source;
  info.isa = target.name;
  info.threads = threads;
  const bool int8 = has_int8_layers(optimised), bf16 = precision == Precision::Bf16;
  info.precision = int8 ? (bf16 ? "int8+bf16" : "int8") : (bf16 ? "bf16" : "fp32");
  info.passes = passes;
  // fuse-qdq keeps 8-bit weights only where the target has VNNI (run_passes); where it does not, the
  // pipeline limited them to 7 bits and any CPU runs the layers exactly.
  info.requires_vnni = int8 && target.int8_vnni;
  return info;
}

// The variant of an artifact this CPU runs best: the one for the highest ISA that oneDNN's effective ISA
// here contains (isa_runs_on; the first of equals). An Error naming the variants' ISAs and the CPU's when
// none fits.
inline std::size_t choose_variant(const std::vector<artifact::Info>& variants) {
  const IsaInfo here = effective_isa();
  std::size_t best = variants.size();
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const CpuIsa isa = isa_from_name(variants[i].isa);
    if (!isa_runs_on(isa, here.isa)) continue;
    const CpuIsa best_isa = best < variants.size() ? isa_from_name(variants[best].isa) : CpuIsa::Unknown;
    const bool higher = best_isa != isa && isa_runs_on(best_isa, isa);
    if (best == variants.size() || higher) best = i;
  }
  if (best < variants.size()) return best;
  std::string have;
  for (const artifact::Info& v : variants) have += (have.empty() ? "" : ", ") + v.isa;
  throw Error("no variant this CPU runs: the artifact was compiled for " + have + "; this CPU has " + here.name +
              " (oneDNN's ISA here" + std::string(std::getenv("DNNL_MAX_CPU_ISA") ? ", capped by DNNL_MAX_CPU_ISA" : "") +
              "): recompile with --target " + here.name + " or --target avx2");
}

// What compile() does to a graph before its passes, for any shapes: infer them, and make the weights that
// subgraphs capture from the enclosing graph constants of the subgraph (so passes fuse and pack inside
// If branches and loop bodies). An artifact's graph is prepared so, then run through the passes.
inline void prepare_for_passes(Graph& g) {
  infer_shapes(g);
  detail::inline_constant_captures(g);
}

// Sets the kernel choices an artifact stores (Info::tuned: "conv_layout=any,conv_algorithm=direct", what
// lower::tune decided when it was compiled) on `options`, where the caller left them Auto: a caller's
// setting wins. Names of other decisions (precision: the variant's own) are skipped; a value this version
// does not know is an Error, as a target ISA it does not know is. A thread split ("threads=1/2": one of two)
// applies where `options` runs the count it was measured at, not at another.
inline void apply_tuned(const std::string& tuned, CompileOptions& options) {
  std::size_t begin = 0;
  while (begin < tuned.size()) {
    std::size_t end = tuned.find(',', begin);
    if (end == std::string::npos) end = tuned.size();
    const std::string item = tuned.substr(begin, end - begin);
    begin = end + 1;
    const std::size_t eq = item.find('=');
    const std::string knob = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    auto bad = [&] { return Error("tuned kernel choice '" + item + "' is not one this Ondine knows"); };
    if (knob.find('@') != std::string::npos) {  // per node: the caller's model-wide setting does not override it
      if (!detail::tune::apply_node_decision(knob, value, options)) throw bad();
      continue;
    }
    auto mark = [&] { options.choice_origins[knob] = value == "auto" ? "heuristic, kept by the tuner" : "tuned"; };
    if (knob == "conv_layout") {
      const ConvLayout l = value == "auto" ? ConvLayout::Auto : value == "any" ? ConvLayout::Any
                           : value == "blocked" ? ConvLayout::ChannelBlocked : throw bad();
      if (options.conv_layout == ConvLayout::Auto) options.conv_layout = l, mark();
    } else if (knob == "conv_algorithm") {
      const ConvAlgorithm a = value == "auto" ? ConvAlgorithm::Auto : value == "direct" ? ConvAlgorithm::Direct
                              : value == "winograd" ? ConvAlgorithm::Winograd : throw bad();
      if (options.conv_algorithm == ConvAlgorithm::Auto) options.conv_algorithm = a, mark();
    } else if (knob == "matmul_kernel") {
      const MatMulKernel k = value == "auto" ? MatMulKernel::Auto : value == "gemm" ? MatMulKernel::Gemm
                             : value == "conv1x1" ? MatMulKernel::Conv1x1 : throw bad();
      if (options.matmul_kernel == MatMulKernel::Auto) options.matmul_kernel = k, mark();
    } else if (knob == "threads") {
      int n = 0, of = 0;
      if (value != "all" && (std::sscanf(value.c_str(), "%d/%d", &n, &of) != 2 || n < 1 || of <= n ||
                             std::to_string(n) + "/" + std::to_string(of) != value))
        throw bad();
      const int here = options.threads > 0 ? options.threads : omp_get_max_threads();
      if (options.plan_threads <= 0 && n > 0 && here == of) options.plan_threads = n, mark();
    } else if (knob != "precision" && knob != "int8_weights") {
      throw bad();
    }
  }
}

// Whether this CPU and this oneDNN may run the artifact `a` (read from `path`): an Error naming it if not.
inline void check_loadable(const artifact::Artifact& a, const std::string& path) {
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
  if (artifact_precision(a.info) == Precision::Bf16 && !effective_isa().bf16_native)
    throw Error("its variant " + a.info.isa + " runs in bf16, which needs native bf16; this CPU has " +
                effective_isa().name + ": recompile the model with precision fp32 or auto")
        .in_file(path);
  try {
    CompileOptions probe;
    apply_tuned(a.info.tuned, probe);
  } catch (Error& e) {
    throw e.in_file(path);
  }
}
// The artifact at `path`, read, checked (artifact::read), its best variant for this CPU chosen
// (choose_variant) and checked against this CPU and this oneDNN. WeightCheck::Background: the weights'
// checksum runs while the caller compiles; it calls Artifact::wait_checked() before running.
inline artifact::Artifact load_artifact(const std::string& path,
                                        artifact::WeightCheck check = artifact::WeightCheck::Now) {
  artifact::Artifact a = artifact::read(path, choose_variant, check);
  check_loadable(a, path);
  return a;
}
// The same for an artifact linked into the program (artifact::read_memory; `name` names it in errors).
inline artifact::Artifact load_artifact_memory(const void* data, std::size_t size, const std::string& name,
                                               artifact::WeightCheck check = artifact::WeightCheck::Now) {
  artifact::Artifact a = artifact::read_memory(data, size, name, choose_variant, check);
  check_loadable(a, name);
  return a;
}

// The packings `packed` recorded, as an artifact stores them (their bytes stay in `packed`'s memory).
inline std::vector<artifact::Packing> packings_of(const PackedWeights& packed) {
  std::vector<artifact::Packing> out;
  for (const PackedWeights::Record& r : packed.records()) {
    artifact::Packing p;
    p.source = r.source;
    p.source_bytes = r.source_bytes;
    p.source_layout = r.layout;
    p.hash = r.hash;
    p.check = r.check;
    p.md.assign(reinterpret_cast<const char*>(&r.md.data), sizeof(r.md.data));
    p.data = r.packed.get_data_handle();
    p.bytes = r.md.get_size();
    out.push_back(std::move(p));
  }
  return out;
}

// The bindings an artifact of `optimised` packs at: each of its symbolic dims as `dims` gives it, else 1.
inline std::map<std::string, std::int64_t> packing_dims(const Graph& optimised,
                                                        const std::map<std::string, std::int64_t>& dims) {
  std::map<std::string, std::int64_t> used;
  for (const std::string& symbol : symbolic_dims(optimised)) {
    auto it = dims.find(symbol);
    used[symbol] = it != dims.end() ? it->second : 1;
  }
  return used;
}

// The weights of `optimised` packed as compile() packs them here, for an artifact: symbolic dims bound to
// `dims` (others to 1), `threads` threads, float layers in `precision` but those `keep_fp32` names (bf16
// weights are packed as bf16), the kernels `tuned` chose (apply_tuned). `dims` gets the bindings used.
inline std::vector<artifact::Packing> make_packings(const Graph& optimised, int threads,
                                                    std::map<std::string, std::int64_t>& dims,
                                                    std::shared_ptr<PackedWeights>& keep,
                                                    Precision precision = Precision::Fp32,
                                                    const std::vector<std::string>& keep_fp32 = {},
                                                    const std::string& tuned = "") {
  Graph bound = optimised.clone();
  dims = packing_dims(optimised, dims);
  bind_dims(bound, dims);
  CompileOptions options;
  options.threads = threads;
  options.passes = "none";
  options.precision = precision;
  options.keep_fp32 = keep_fp32;
  apply_tuned(tuned, options);
  keep = std::make_shared<PackedWeights>();
  options.packed_weights = keep;
  compile(std::move(bound), options);
  return packings_of(*keep);
}

// A PackedWeights holding the artifact's packings (their bytes in place in the mapping). A packing whose
// descriptor does not read back as one of its own size is left out (its weight is packed at load).
inline std::shared_ptr<PackedWeights> preload_packings(const artifact::Artifact& a) {
  auto packed = std::make_shared<PackedWeights>();
  packed->keep_alive(a.mapping);
  packed->expect_stored();
  for (const artifact::Packing& p : a.packings) {
    if (p.md.size() != sizeof(dnnl_memory_desc_t)) continue;
    dnnl::memory::desc md;
    std::memcpy(&md.data, p.md.data(), sizeof(dnnl_memory_desc_t));
    if (md.get_size() != p.bytes) continue;
    dnnl::memory m(md, packed->engine(), const_cast<void*>(p.data));
    if (p.source) packed->preload_by_address(p.source, p.source_bytes, p.source_layout, md, m);
    else packed->preload_by_hash(static_cast<std::size_t>(p.hash), p.check, md, m);
  }
  return packed;
}

// `options` for compiling an artifact's graph: its passes already ran; with `a`, its packed weights preloaded
// and the variant's precision (artifact_precision) and float32 nodes (Info::keep_fp32, added to the caller's):
// a caller that wants another precision sets options.precision after this (its weights are packed again).
inline CompileOptions artifact_options(CompileOptions options) {
  options.passes = "none";
  return options;
}
inline CompileOptions artifact_options(CompileOptions options, const artifact::Artifact& a) {
  options.passes = "none";
  apply_tuned(a.info.tuned, options);  // (check_loadable checked it parses)
  options.packed_weights = preload_packings(a);
  options.precision = artifact_precision(a.info);
  options.keep_fp32.insert(options.keep_fp32.end(), a.info.keep_fp32.begin(), a.info.keep_fp32.end());
  return options;
}

// Writes `optimised` with its weights packed as this CPU packs them (make_packings) for `dims` (symbolic dims
// not given: 1) at info.threads threads; `packed = false` stores the plain weights only (info.unpacked
// should say why). A graph that does not compile at those dims (a size of 1 its shapes reject) is written
// unpacked. Returns why the weights are not stored packed ("" when they are), as stored in the file.
// `compiled`: the packings of a compile the caller already did of `optimised` (options.packed_weights)
// at those dims, threads, precision, keep_fp32 and tuned kernels (the tuner's or the bf16 bound's kept
// plan): stored as they are, without compiling again.
inline std::string save_artifact(const Graph& optimised, const std::string& path, artifact::Info info,
                                 std::map<std::string, std::int64_t> dims = {}, bool packed = true,
                                 const std::shared_ptr<PackedWeights>& compiled = nullptr) {
  std::shared_ptr<PackedWeights> keep;
  std::vector<artifact::Packing> packings;
  if (packed && compiled) {
    dims = packing_dims(optimised, dims);
    packings = packings_of(*compiled);
    info.unpacked.clear();
  } else if (packed) {
    try {
      packings = make_packings(optimised, info.threads, dims, keep, artifact_precision(info), info.keep_fp32, info.tuned);
      info.unpacked.clear();
    } catch (const Error& e) {
      info.unpacked = std::string("compiling at the packing dims failed: ") + e.what();
      dims.clear();
    }
  } else {
    dims.clear();
    if (info.unpacked.empty()) info.unpacked = "written without packed weights";
  }
  artifact::write(optimised, info, path, packings, dims);
  return info.unpacked;
}

}  // namespace ondine::lower
