// SPDX-License-Identifier: Apache-2.0
// `ondine compile MODEL`: the pipeline with per-pass summary, dumps, ONNX export and --check, and compiled
// artifacts (.ondine) with one variant per --target, each compiled in a process capped at its ISA.
#pragma once

#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ondine/lower/artifact.hpp"
#include "ondine/lower/lower.hpp"
#include "ondine/lower/tune.hpp"
#include "common.hpp"
#include "engine.hpp"
#include "progress.hpp"
#include "quantize.hpp"

extern char** environ;  // run_capped passes it on, less the ISA cap

namespace ondine::cli {

struct CompileArgs {
  std::string passes = "default";
  bool print_passes = false;
  std::vector<std::string> dump_before, dump_after;
  bool dot = false;
  std::string out_file;
  bool check = false;
  std::vector<std::string> dims;
  std::uint64_t seed = 0;
  std::optional<double> tolerance;         // --check's relative bound; unset: by model kind (check_bound)
  std::size_t stop_after = 0;              // > 0: stop after that many pass runs (bisecting)
  std::vector<std::string> pass_options;   // KEY=VALUE for PassContext::options
  int threads = 0;                         // recorded in an artifact (0: OpenMP's default)
  std::vector<std::string> targets;        // an artifact's variants (default: native, avx2)
  bool as_variant = false;                 // a child compiling one variant of a parent's --target list
  std::string source;                      // the artifact's source (a child compiling the parent's quantized copy)
};

// The ISAs --target names, in order, "native" as this CPU's (oneDNN's effective ISA), each once.
inline std::vector<lower::IsaInfo> resolve_targets(const std::vector<std::string>& names) {
  static const std::set<std::string> known = {"native", "avx2", "avx512_core", "avx512_core_vnni", "avx512_core_bf16",
                                              "avx512_core_amx"};
  std::vector<lower::IsaInfo> out;
  for (const std::string& name : names.empty() ? std::vector<std::string>{"native", "avx2"} : names) {
    if (!known.count(name))
      throw UsageError("--target " + name + ": expected native, avx2, avx512_core, avx512_core_vnni, avx512_core_bf16 "
                       "or avx512_core_amx");
    lower::IsaInfo isa = name == "native" ? lower::effective_isa() : lower::isa_info(lower::isa_from_name(name));
    bool seen = false;
    for (const lower::IsaInfo& o : out) seen = seen || o.isa == isa.isa;
    if (!seen) out.push_back(isa);
  }
  return out;
}

// Runs this program again as `args` with oneDNN capped at `isa` (DNNL_MAX_CPU_ISA) and its standard output
// going to ours; an Error when it fails.
inline void run_capped(const std::vector<std::string>& args, const lower::IsaInfo& isa) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "DNNL_MAX_CPU_ISA=", 17) != 0 && std::strncmp(*e, "ONEDNN_MAX_CPU_ISA=", 19) != 0)
      env_strings.emplace_back(*e);
  env_strings.push_back("DNNL_MAX_CPU_ISA=" + lower::max_cpu_isa_env(isa.isa));
  std::vector<char*> env, argv;
  for (std::string& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  std::vector<std::string> arg_strings = args;
  for (std::string& a : arg_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  pid_t pid = 0;
  if (int rc = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), env.data()); rc != 0)
    throw Error("cannot start a process to compile the " + isa.name + " variant: " + std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error("compiling the " + isa.name + " variant failed (its process said why above)");
}

inline int cmd_compile(const std::string& path, const CompileArgs& args);

// `ondine compile MODEL -o OUT.ondine --target A,B,..`: each target compiled by this program in a process of
// its own, capped at that ISA (a target above this CPU's is not capped: it runs with the target's pass
// options and stores no packed weights), into OUT.ondine.A.tmp ...; then one artifact with every variant.
inline int compile_variants(const std::string& path, const CompileArgs& args,
                            const std::vector<lower::IsaInfo>& targets) {
  std::vector<std::string> parts;
  struct Remove {
    std::vector<std::string>* files;
    ~Remove() {
      for (const std::string& f : *files) std::remove(f.c_str());
    }
  } remove_parts{&parts};
  if (g_precision == lower::Precision::Bf16 &&
      std::none_of(targets.begin(), targets.end(), [](const lower::IsaInfo& t) { return t.bf16_native; }))
    throw UsageError("--precision bf16: none of the targets has native bf16 (avx512_core_bf16, avx512_core_amx); "
                     "use --precision auto for bf16 where a target has it");
  // --precision int8 --calib DIR: calibrated once, here; Q/DQ with 8-bit weights for the targets with VNNI,
  // 7-bit for the others (quantize_for_int8); each child compiles its QDQ copy.
  std::map<bool, std::string> quantized_copy;  // 7-bit? -> the QDQ file
  std::vector<std::string> copies;
  Remove remove_copies{&copies};
  Graph g;
  if (g_int8 && !g_calib_dir.empty()) {
    g = ondine::onnx::load_model(path);
    check_supported(g);
  }
  if (needs_quantizing(g, path)) {
    ondine::cli::QuantizeArgs q = int8_quantize_args(path);
    std::unique_ptr<ondine::cli::CalibratedGraph> calibrated;
    try {
      calibrated = ondine::cli::calibrate_graph(std::move(g), q);
      for (const lower::IsaInfo& isa : targets) {
        q.reduce_range = !isa.int8_vnni;
        if (quantized_copy.count(q.reduce_range)) continue;
        say_weight_width(isa);
        const std::string copy = args.out_file + (q.reduce_range ? ".int8r.onnx" : ".int8.onnx");
        copies.push_back(copy);
        ondine::onnx::save_model(ondine::cli::insert_qdq(*calibrated, q), copy);
        quantized_copy[q.reduce_range] = copy;
      }
    } catch (const ondine::cli::QuantizeUsageError& e) {
      throw UsageError(e.message());
    }
  }
  for (const lower::IsaInfo& isa : targets) {
    const std::string model = quantized_copy.count(!isa.int8_vnni) ? quantized_copy[!isa.int8_vnni] : path;
    std::vector<std::string> argv = {"ondine", "compile", model, "-o", args.out_file + "." + isa.name + ".ondine",
                                     "--target", isa.name, "--as-variant", "--passes", args.passes,
                                     "--threads", std::to_string(args.threads), "--source",
                                     args.source.empty() ? path : args.source};
    for (const std::string& d : args.dims) argv.insert(argv.end(), {"--dim", d});
    for (const std::string& o : args.pass_options) argv.insert(argv.end(), {"--pass-option", o});
    if (args.print_passes) argv.push_back("--print-passes");
    for (const std::string& d : args.dump_before) argv.insert(argv.end(), {"--dump-before", d});
    for (const std::string& d : args.dump_after) argv.insert(argv.end(), {"--dump-after", d});
    if (args.dot) argv.push_back("--dot");
    if (args.stop_after) argv.insert(argv.end(), {"--stop-after", std::to_string(args.stop_after)});
    if (args.check) argv.insert(argv.end(), {"--check", "--seed", std::to_string(args.seed)});
    if (args.check && args.tolerance) argv.insert(argv.end(), {"--tolerance", std::to_string(*args.tolerance)});
    // bf16 where the target has it natively: a bf16 list gives the others fp32 (auto resolves per target itself).
    const lower::Precision precision =
        g_precision == lower::Precision::Bf16 && !isa.bf16_native ? lower::Precision::Fp32 : g_precision;
    if (g_precision_given)
      argv.insert(argv.end(), {"--precision", g_int8 ? std::string("int8") : std::string(lower::precision_name(precision))});
    if (g_exact_int8_weights) argv.push_back("--exact-int8-weights");
    if (g_exact_weight_only) argv.push_back("--exact-weight-only");
    if (g_tune) argv.push_back("--tune");  // each variant timed here, under its ISA
    if (precision != lower::Precision::Fp32) {
      for (const std::string& k : g_keep_fp32) argv.insert(argv.end(), {"--keep-fp32", k});
      if (g_max_error) {
        std::ostringstream e;
        e << std::setprecision(17) << *g_max_error;
        argv.insert(argv.end(), {"--max-error", e.str()});
      }
    }
    parts.push_back(argv[4]);
    std::cout << "[" << isa.name << "]" << (precision != g_precision ? " fp32: no native bf16 for --precision bf16" : "")
              << "\n";
    run_capped(argv, isa);
  }
  artifact::combine(parts, args.out_file);
  std::cout << "wrote:   " << args.out_file << " (artifact, " << targets.size() << " variants:";
  for (const lower::IsaInfo& isa : targets) std::cout << " " << isa.name;
  std::cout << "; " << std::filesystem::file_size(args.out_file) << " bytes)\n";
  return 0;
}

// A bf16 artifact, checked where it can be: on a CPU with native bf16, the optimised graph compiled in bf16
// and in fp32 on seeded inputs (symbolic dims at --dim, else 1), the error max |bf16 - fp32| / max |fp32|
// printed; with --max-error, nodes are kept fp32, worst first, until it holds (an Error when it cannot:
// nothing is written); `requested` auto also times both and keeps the faster. Returns the precision to store;
// `keep_fp32` gets the nodes kept, `packed` the weights of the compile kept (the artifact stores them).
inline lower::Precision check_bf16_artifact(const Graph& optimised, const std::string& path, const CompileArgs& args,
                                            lower::Precision requested, std::vector<std::string>& keep_fp32,
                                            std::shared_ptr<lower::PackedWeights>& packed) {
  const lower::IsaInfo here = lower::effective_isa();
  if (!here.bf16_native) {
    std::cout << "bf16:    not checked (this CPU runs " << here.name << ", no native bf16): check the artifact where "
              << "it runs, `ondine run MODEL.ondine --check`\n";
    return lower::Precision::Bf16;
  }
  Graph bound = optimised.clone();
  std::map<std::string, std::int64_t> dims = parse_dims(args.dims);
  for (const std::string& sym : symbolic_dims(bound)) dims.emplace(sym, 1);
  bind_dims(bound, dims);
  std::map<std::string, Tensor> inputs;
  fill_random_inputs(bound, inputs, args.seed);
  lower::CompileOptions options;
  options.threads = args.threads;
  options.passes = "none";
  options.precision = requested;
  options.keep_fp32 = keep_fp32;
  lower::Bf16BoundOptions bo;
  bo.max_error = g_max_error ? *g_max_error : std::numeric_limits<double>::max();  // no bound: measure only
  bo.progress = bf16_bound_progress();
  bo.keep_packings = true;
  lower::Bf16BoundResult r;
  try {
    r = lower::compile_bf16_within(bound, options, {inputs}, bo);
  } catch (Error& e) {
    throw e.in_file(path);
  }
  bo.progress = nullptr;  // its progress line is cleared before the result prints
  std::string at;
  for (auto& [k, v] : dims) at += (at.empty() ? " at " : ", ") + k + "=" + std::to_string(v);
  std::cout << std::scientific << std::setprecision(2) << "bf16:    error " << r.error << " of max |fp32| on seeded inputs"
            << at << " (seed " << args.seed << ")";
  if (g_max_error) {
    std::cout << ", bound " << *g_max_error << ", all bf16 " << r.initial_error << ", " << r.kept.size()
              << " node(s) kept fp32 for it";
    for (const std::string& name : r.kept) std::cout << " '" << name << "'";
  }
  std::cout << std::defaultfloat << "\n";
  if (g_max_error && !r.met)
    throw Error("bf16 misses --max-error " + std::to_string(*g_max_error) + ": error " + std::to_string(r.error) +
                " with " + std::to_string(r.kept.size()) + " node(s) kept fp32; nothing written (compile it in fp32)")
        .in_file(path);
  keep_fp32.insert(keep_fp32.end(), r.kept.begin(), r.kept.end());
  packed = r.packed;
  if (requested == lower::Precision::Auto) {
    std::cout << std::fixed << std::setprecision(2) << "precision: auto chose " << (r.chose_fp32 ? "fp32" : "bf16")
              << " (median of 7 runs: bf16 " << r.bf16_ms << " ms, fp32 " << r.fp32_ms << " ms)" << std::defaultfloat << "\n";
    if (r.chose_fp32) return lower::Precision::Fp32;
  }
  return lower::Precision::Bf16;
}

// Runs the pipeline on the model (symbolic dims stay symbolic unless bound with --dim), reports what
// each pass did, optionally writes the optimised model and checks it against the imported one on the
// reference executor (symbolic dims bound to 1 for the check).
inline int cmd_compile(const std::string& path, const CompileArgs& args) {
  PassManager::Options options;
  options.dump_before.insert(args.dump_before.begin(), args.dump_before.end());
  options.dump_after.insert(args.dump_after.begin(), args.dump_after.end());
  options.dump_dot = args.dot;
  options.stop_after = args.stop_after;
  options.dump = [](const std::string& title, const std::string& graph) { std::cout << title << "\n" << graph << "\n"; };
  PassManager pm = pipeline_for(args.passes, options);
  for (auto& kv : args.pass_options) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) throw UsageError("--pass-option " + kv + ": expected KEY=VALUE (e.g. layout=nhwc)");
    pm.context().options[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  std::set<std::string> in_pipeline;
  for (auto& [name, repeat] : PassManager::parse_pipeline(pm.pipeline())) in_pipeline.insert(name);
  for (auto* list : {&args.dump_before, &args.dump_after})
    for (auto& name : *list)
      if (!in_pipeline.count(name))
        throw UsageError(std::string(list == &args.dump_before ? "--dump-before " : "--dump-after ") + name +
                         ": the pipeline has no pass of that name (pipeline: " +
                         (pm.size() ? pm.pipeline() : std::string("none")) + ")");

  // -o MODEL.ondine: a compiled artifact (lower/artifact.hpp): the graph prepared as compile() prepares it,
  // with the pass options of its target ISA, then the pipeline; one variant per --target.
  const bool to_artifact = fs::path(args.out_file).extension() == ".ondine";
  if (!to_artifact && !args.targets.empty()) throw UsageError("--target is for artifacts: -o MODEL.ondine");
  if (!to_artifact && g_precision_given)
    throw UsageError("--precision is for artifacts (-o MODEL.ondine); run and bench take it for ONNX models");
  const lower::IsaInfo here = lower::effective_isa();
  std::vector<lower::IsaInfo> targets;
  if (to_artifact) targets = resolve_targets(args.targets);
  // One target this process can compile for (its own ISA, or one above it, whose weights it cannot pack):
  // here. Else each target in a process of its own with oneDNN capped at it (oneDNN's ISA is fixed once
  // per process), its variant combined into one file.
  if (targets.size() > 1 || (targets.size() == 1 && targets[0].isa != here.isa && lower::isa_runs_on(targets[0].isa, here.isa))) {
    if (args.as_variant)
      throw Error("oneDNN runs " + here.name + " here although DNNL_MAX_CPU_ISA caps it at " + targets[0].name);
    return compile_variants(path, args, targets);
  }
  const lower::IsaInfo target = targets.empty() ? here : targets[0];
  // 7-bit weights without VNNI unless --exact-int8-weights, or, compiling for this CPU, its rates say int8 gains nothing.
  if (to_artifact)
    lower::set_isa_pass_options(pm, target,
                                !g_exact_int8_weights && (target.isa != here.isa || lower::int8_7bit_weights_by_default()));
  if (g_exact_weight_only) pm.context().options.emplace("fuse-weight-only.activations", "float32");
  Graph g = ondine::onnx::load_model(path);
  check_supported(g);
  quantize_for_int8(g, path, target);
  bind_dims(g, parse_dims(args.dims));
  if (to_artifact) lower::prepare_for_passes(g);
  // Only --check needs the original graph: a clone shares the weights, so fold-bn would then have to
  // copy them instead of scaling them in place (that copy is most of the pass time).
  std::optional<Graph> original;
  if (args.check) original = g.clone();
  auto before = op_key_histogram(g);
  const std::size_t nodes_before = g.num_nodes();
  const int opset = g.opset();
  auto t0 = std::chrono::steady_clock::now();
  try {
    pm.run(g);
  } catch (Error& e) {
    e.in_file(path);
    throw;
  }
  double ms = elapsed_ms(t0);

  std::size_t rewrites = 0;
  for (auto& r : pm.records()) rewrites += r.rewrites;
  std::cout << "model:   " << path << " (opset " << opset << ", " << nodes_before << " nodes)\n";
  std::cout << "passes:  " << passes_label(args.passes) << ": " << pm.records().size() << " pass runs, "
            << nodes_before << " -> " << g.num_nodes() << " nodes, " << rewrites << " rewrites, " << std::fixed
            << std::setprecision(1) << ms << " ms\n";
  if (args.print_passes) {
    std::cout << "pipeline: " << (pm.size() ? pm.pipeline() : std::string("none")) << "\n" << pm.summary_text();
    auto after = op_key_histogram(g);
    std::map<std::string, std::pair<std::size_t, std::size_t>> ops;
    for (auto& [op, n] : before) ops[op].first = n;
    for (auto& [op, n] : after) ops[op].second = n;
    std::cout << std::left << std::setw(28) << "ops" << std::right << std::setw(8) << "before" << std::setw(8)
              << "after" << "\n";
    for (auto& [op, counts] : ops)
      std::cout << "  " << std::left << std::setw(26) << op << std::right << std::setw(8) << counts.first
                << std::setw(8) << counts.second << "\n";
  }
  if (to_artifact) {
    lower::Precision precision = g_precision;
    if (precision == lower::Precision::Auto) precision = target.bf16_faster ? lower::Precision::Bf16 : lower::Precision::Fp32;
    std::vector<std::string> keep_fp32 = g_keep_fp32;
    // The packings of a compile already done with the artifact's settings (the bf16 check's, the tuner's):
    // stored as they are; without one, save_artifact compiles once to pack.
    std::shared_ptr<lower::PackedWeights> compiled;
    if (precision == lower::Precision::Bf16) {
      if (!target.bf16_native)
        throw UsageError("--precision bf16: the target " + target.name + " has no native bf16 (avx512_core_bf16, "
                         "avx512_core_amx); compile it in fp32 or with --precision auto");
      precision = check_bf16_artifact(g, path, args, g_precision, keep_fp32, compiled);
    } else {
      keep_fp32.clear();
    }
    artifact::Info info = lower::artifact_info(g, args.source.empty() ? path : args.source,
                                               pm.size() ? pm.pipeline() : std::string("none"), args.threads, target,
                                               precision);
    info.keep_fp32 = keep_fp32;
    info.ondine_version = ondine::version;
    // oneDNN packs for the ISA it runs: a target above this CPU's gets its weights packed at first load.
    const bool can_pack = lower::isa_runs_on(target.isa, here.isa);
    if (g_tune && target.isa == here.isa) {  // --tune: this CPU's kernel choices, stored and applied at load
      Graph bound = g.clone();
      std::map<std::string, std::int64_t> dims = parse_dims(args.dims);
      for (const std::string& symbol : symbolic_dims(bound)) dims.emplace(symbol, 1);
      bind_dims(bound, dims);
      lower::CompileOptions opts;
      opts.threads = args.threads;
      opts.passes = "none";
      opts.precision = precision;
      opts.keep_fp32 = keep_fp32;
      opts.conv_layout = g_conv_layout;
      opts.conv_algorithm = g_conv_algorithm;
      opts.matmul_kernel = g_matmul_kernel;
      lower::TuneOptions t;
      t.tune_int8_weights = false;  // the graph's int8 layers are fused already
      t.keep_packings = true;
      auto line = std::make_shared<ondine::cli::ProgressLine>("tuning");
      t.progress = [line](const std::string& what) { line->update(0, std::nullopt, what); };
      lower::TuneResult r = lower::tune(bound, opts, t);
      line->clear();
      bool forced = false;  // a knob set by an option: not stored, so the tuner's packings may not match at load
      for (const lower::TuneDecision& d : r.decisions) {
        if (d.knob != "precision" && d.why != "set by the caller")
          info.tuned += (info.tuned.empty() ? "" : ",") + d.knob + "=" + d.value;
        forced |= d.knob != "precision" && d.why == "set by the caller";
      }
      compiled = forced ? nullptr : r.packed;  // from the cache: none (save_artifact compiles)
      std::cout << r.text();
    } else if (g_tune) {
      std::cout << "tune:    not for " << target.name << " (it runs here as " << here.name << "): its built-in choices\n";
    }
    if (!can_pack)
      info.unpacked = "compiled on a CPU without " + target.name + " (it had " + here.name + ")";
    const std::string not_packed = lower::save_artifact(g, args.out_file, info, parse_dims(args.dims), can_pack, compiled);
    if (!not_packed.empty()) std::cout << "note:    weights not packed: " << not_packed << "\n";
    std::cout << (args.as_variant ? "variant: " : "wrote:   ") << (args.as_variant ? target.name : args.out_file)
              << " (artifact: " << g.num_nodes() << " nodes, " << info.precision
              << (info.keep_fp32.empty() ? "" : " (" + std::to_string(info.keep_fp32.size()) + " kept fp32)") << ", " << info.isa
              << (info.requires_vnni ? ", needs VNNI" : "");
    if (!args.as_variant) std::cout << ", " << std::filesystem::file_size(args.out_file) << " bytes";
    std::cout << ")\n";
  } else if (!args.out_file.empty()) {
    ondine::onnx::save_model(g, args.out_file);
    std::cout << "wrote:   " << args.out_file << " (" << g.num_nodes() << " nodes)\n";
  }
  if (args.check) {
    // The oracle: the imported model and the optimised one on the reference executor, same inputs.
    std::map<std::string, std::int64_t> ones;
    for (auto& sym : symbolic_dims(*original)) ones[sym] = 1;
    Graph want_graph = original->clone(), got_graph = g.clone();
    bind_dims(want_graph, ones);
    bind_dims(got_graph, ones);
    std::map<std::string, Tensor> inputs;
    fill_random_inputs(want_graph, inputs, args.seed);
    auto want = ReferenceExecutor(want_graph).run(inputs);
    auto got = ReferenceExecutor(got_graph).run(inputs);
    check_outputs(*original, got, want, check_bound(*original, args.tolerance), path,
                  "the optimised graph's outputs differ from the imported graph's (reference executor)");
  }
  return 0;
}

}  // namespace ondine::cli
