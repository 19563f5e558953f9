// SPDX-License-Identifier: Apache-2.0
// ondine - the command-line tool: argument parsing (CLI11), the options the subcommands share, dispatch.
// The subcommands live in the headers beside this file, all included here: one translation unit, since
// each one that includes the compiler headers takes minutes to build.
//
//   ondine inspect MODEL [--dim batch=1] [--json] [--graph] [--dot FILE] [--compiled] [--passes P]
//   ondine compile MODEL [--passes P] [--print-passes] [--dump-after NAME] [--dot] [-o OUT.onnx] [--check]
//                  [--dim batch=1] [--seed N] [--tolerance T] [--target native,avx2 (with -o OUT.ondine)]
//   ondine run MODEL [--input NAME=FILE.npy]... [--dim batch=8] [--output-dir DIR] [--seed N] [--runs N]
//              [--threads N] [--reference] [--check] [--tolerance T] [--passes P]
//              [--precision fp32|bf16 [--keep-fp32 GLOB]... [--max-error E]] [--profile]
//   ondine bench MODEL [--batch 1,8] [--dim NAME] [--threads N] [--warmup N] [--runs N] [--json FILE] [--reference]
//                [--passes P] [--precision fp32|bf16 [--keep-fp32 GLOB]... [--max-error E]] [--profile]
//   ondine bench MODEL --dim NAME=LO:HI [--dim NAME=SIZE]... [--shape-plan auto|per-shape|shape-free] ...
//   ondine bench MODEL --decode STEPS [--dim SEQ=N] [--batch B] [--shape-plan ...] ...
//   ondine bench MODEL --streams N | --hint latency|throughput [--requests M] [--threads T] [--batch B] ...
//   ondine compare A.onnx B.onnx [--input FILE.npy]... [--seed N] [--per-layer] [--json] [--compiled]
//   ondine quantize MODEL --calib DIR -o OUT.onnx [--method M] [--max-samples N] [--exclude ..] [--include ..]
//                   [--keep-fp32-ends] [--activations u8|s8] [--save-calibration FILE] [--passes P]
//
// P is a pipeline string: "default" (the default pipeline), "none", or pass names ("fold-bn,fuse*").
// Errors go to stderr with exit code 1 (2 for bad command lines, a bad pipeline included), as one line
// of printable text first ("ondine: error: ...", names from the file escaped as \xNN); an exception
// that escapes everything else (one thrown on a worker thread) exits with 70, never through abort.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ondine/ondine.hpp"
#include "bench.hpp"
#include "compare.hpp"
#include "compile.hpp"
#include "header.hpp"
#include "inspect.hpp"
#include "ops.hpp"
#include "progress.hpp"
#include "quantize.hpp"
#include "run.hpp"

using namespace ondine;
using namespace ondine::cli;

// The last resort: an exception std::terminate sees (thrown where no handler can catch it, e.g. in an
// OpenMP region) still gives one line and an exit code below 128, not SIGABRT (134).
[[noreturn]] void terminate_handler() {
  std::string what = "unknown exception";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = x.what();
    } catch (...) {
    }
  } else {
    what = "std::terminate called";
  }
  std::fprintf(stderr, "ondine: error: internal error: %s\n", ondine::detail::escape_text(what).c_str());
  std::fflush(stdout);
  std::_Exit(70);  // EX_SOFTWARE
}

int main(int argc, char** argv) {
  std::set_terminate(terminate_handler);
  ondine::lower::register_quantization_passes();  // --passes may name quantize / quantize-dynamic
  CLI::App app{"ondine: a graph compiler for CPU inference (ONNX in, fast CPU code out)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(ondine::version));
  app.fallthrough();  // --quiet also after the subcommand
  app.add_flag("-q,--quiet", ondine::cli::progress_quiet(),
               "no progress lines (they are shown only when stderr is a terminal anyway)");

  std::string model, output_dir, dot_file;
  std::vector<std::string> dims, input_specs;
  bool json = false, print_graph = false, reference = false, compiled = false, check = false;
  std::uint64_t seed = 0;
  int runs = 1, threads = 0;
  std::optional<double> tolerance;  // unset: check_bound picks by model kind

  std::string passes = "default", inspect_passes = "none";
  auto* inspect = app.add_subcommand("inspect", "ops histogram, parameters, FLOPs, inputs/outputs, unsupported ops");
  inspect->add_option("model", model, "ONNX model file or compiled artifact (.ondine)")->required();
  inspect->add_option("--dim", dims, "bind a symbolic dim for the FLOP count, NAME=SIZE (default: 1)");
  inspect->add_flag("--json", json, "print as JSON");
  inspect->add_flag("--graph", print_graph, "also print the graph as text");
  inspect->add_option("--dot", dot_file, "write the graph as Graphviz DOT to this file");
  inspect->add_flag("--compiled", compiled, "compile it and show the ISA, each step's oneDNN implementation, the memory plan");
  std::string precision = "fp32";  // --precision of inspect, compile, run, bench
  std::vector<CLI::Option*> precision_opts;
  const std::string exact_weights_help =
      "on a CPU without VNNI, keep a quantized model's layers with 8-bit weights in float, exactly as the file says "
      "(default: where this CPU's int8 rate is well above its fp32 rate, their weights requantized to 7 bits, which "
      "these CPUs' int8 kernels compute exactly, and run int8; else float as with this flag)";

  precision_opts.push_back(inspect->add_option("--precision", precision,
                                               "with --compiled: fp32 (default), bf16 or auto, as run and bench take "
                                               "it (an artifact: its own unless given)")
                               ->check(CLI::IsMember({"fp32", "bf16", "int8", "auto"})));
  inspect->add_option("--keep-fp32", g_keep_fp32, "with --compiled --precision bf16: nodes whose name matches this "
                                                  "glob stay fp32 (repeatable)");
  inspect->add_option("--threads", threads, "threads for --compiled (default: OpenMP's)");
  auto* inspect_passes_opt = inspect->add_option(
      "--passes", inspect_passes,
      "passes to run before showing the model: 'none' (default, the model as imported), 'default', or names "
      "('fold-bn,fuse'); --compiled compiles with these, else with the default pipeline");

  CompileArgs compile_args;
  auto* compile = app.add_subcommand("compile", "run the optimisation passes: per-pass summary, dumps, export, check");
  compile->add_option("model", model, "ONNX model file")->required();
  compile->add_option("--passes", compile_args.passes,
                      "pipeline: 'default' (default), 'none', or pass names, '*' repeats until no change "
                      "('fold-constants*,dce')");
  compile->add_flag("--print-passes", compile_args.print_passes,
                    "print the pipeline, each pass's time, nodes before/after and rewrites, and the op counts before and after");
  compile->add_option("--dump-before", compile_args.dump_before, "print the graph before this pass (repeatable)");
  compile->add_option("--dump-after", compile_args.dump_after, "print the graph after this pass (repeatable)");
  compile->add_flag("--dot", compile_args.dot, "dumps as Graphviz DOT instead of text");
  compile->add_option("-o,--output", compile_args.out_file,
                      "write the optimised model: as ONNX, or with the extension .ondine as a compiled artifact "
                      "that run/bench/inspect load without ONNX import or passes (docs/artifacts.md)");
  compile->add_option("--threads", compile_args.threads, "the thread count recorded in an artifact (default: OpenMP's)");
  compile->add_option("--target", compile_args.targets,
                      "an artifact's variants, one per ISA: native (this CPU's), avx2, avx512_core, avx512_core_vnni, "
                      "avx512_core_bf16, avx512_core_amx; the loader runs the best the CPU has (default: native,avx2)")
      ->delimiter(',');
  compile->add_flag("--as-variant", compile_args.as_variant, "(internal: one variant of a --target list)")
      ->group("");
  compile->add_option("--source", compile_args.source, "(internal: the source file an artifact names)")->group("");
  compile->add_flag("--check", compile_args.check,
                    "run the imported and the optimised model on the reference executor with seeded random inputs "
                    "and compare (fails past --tolerance)");
  compile->add_option("--dim", compile_args.dims, "bind a symbolic dim, NAME=SIZE (repeatable; --check binds the rest to 1)");
  compile->add_option("--seed", compile_args.seed, "seed of --check's random inputs");
  compile->add_option("--stop-after", compile_args.stop_after, "stop after this many pass runs (to bisect a pipeline)");
  compile->add_option("--pass-option", compile_args.pass_options,
                      "KEY=VALUE option for the passes, e.g. layout=nhwc (repeatable)");
  compile->add_option("--tolerance", compile_args.tolerance,
                      "--check's bound on max|optimised-imported| / max|imported| (default 1e-4; a model with "
                      "int8 parts: 10%, or 2 steps of an output's quantization)")
      ->check(CLI::NonNegativeNumber);
  precision_opts.push_back(
      compile->add_option("--precision", precision,
                          "an artifact's float layers: fp32 (default), bf16 (each target with native bf16: "
                          "avx512_core_bf16, AMX; the others fp32), or auto (bf16 where the target has it and it "
                          "is faster here, within --max-error, default 0.01); checked against fp32 on seeded inputs "
                          "where this CPU has native bf16; the loader runs it so; int8: a quantized model's int8 "
                          "layers, fp32 elsewhere (a float model: quantized first with --calib DIR, else refused)")
          ->check(CLI::IsMember({"fp32", "bf16", "int8", "auto"})));
  const std::string calib_help =
      "with --precision int8: calibrate a float model on this folder's .npy samples (DIR/<sample>.npy for a "
      "one-input model, DIR/<sample>/<input>.npy otherwise) and quantize it (static int8, as ondine quantize) before "
      "it compiles";
  compile->add_option("--calib", g_calib_dir, calib_help);
  compile->add_option("--keep-fp32", g_keep_fp32, "with --precision bf16: nodes whose name matches this glob ('*', "
                                                  "'?') stay fp32 (repeatable; stored in the artifact)");
  compile->add_option("--max-error", g_max_error,
                      "with --precision bf16: keep the most sensitive nodes fp32, one at a time, until the outputs "
                      "on seeded inputs are within E (max |bf16 - fp32| / max |fp32| per output) of fp32's; the "
                      "nodes kept are stored; with --precision int8 --calib DIR: layers stay fp32, worst first, "
                      "until the quantized model is within E of fp32 on the samples")
      ->check(CLI::NonNegativeNumber);

  auto* run = app.add_subcommand("run", "run a model on .npy or seeded random inputs");
  run->add_option("model", model, "ONNX model file or compiled artifact (.ondine)")->required();
  run->add_option("--input", input_specs, "NAME=FILE.npy (repeatable); inputs not given are random");
  run->add_option("--dim", dims, "bind a symbolic dim, NAME=SIZE (repeatable; default 1)");
  run->add_option("--output-dir", output_dir, "write each output as DIR/NAME.npy");
  run->add_option("--seed", seed, "seed of the random inputs");
  run->add_option("--runs", runs, "timed runs for the benchmark line")->check(CLI::PositiveNumber);
  run->add_option("--threads", threads, "oneDNN threads (default: OpenMP's, i.e. OMP_NUM_THREADS or all cores)");
  run->add_flag("--reference", reference, "run on the reference executor instead of the compiled model");
  bool run_profile = false;
  run->add_flag("--profile", run_profile,
                "then as many profiled runs on the same inputs: time per op and implementation (as bench --profile)");
  const std::string precision_help =
      "fp32 (default), bf16: convolutions, matrix products with constant weights, attention and recurrent layers (batch 5 and up) "
      "in bfloat16 with float32 "
      "accumulation, bf16 activations between convolutions and between matrix products (needs native bf16: avx512_core_bf16 or AMX), or auto: "
      "bf16 where the CPU has it, checked against fp32 (--max-error, default 0.01), else fp32; int8: a quantized "
      "model's int8 layers, fp32 elsewhere (a float model: quantized first with --calib DIR, else refused)";
  precision_opts.push_back(
      run->add_option("--precision", precision, precision_help + "; an artifact: its own unless given")
          ->check(CLI::IsMember({"fp32", "bf16", "int8", "auto"})));
  const std::string keep_fp32_help =
      "with --precision bf16: nodes whose name matches this glob ('*', '?') stay fp32 (repeatable)";
  run->add_option("--keep-fp32", g_keep_fp32, keep_fp32_help);
  const std::string max_error_help =
      "with --precision bf16: keep the most sensitive nodes fp32, one at a time, until the outputs are within E "
      "(max |bf16 - fp32| / max |fp32| per output) of the fp32 compile's on the run's inputs; with --precision int8 "
      "--calib DIR: layers stay fp32, worst first, until the quantized model is within E of fp32 on the samples";
  run->add_option("--max-error", g_max_error, max_error_help)->check(CLI::NonNegativeNumber);
  run->add_option("--calib", g_calib_dir, calib_help);
  std::string conv_layout = "auto";
  const std::string conv_layout_help =
      "float32 convolutions' activations: auto (default: blocked), any (oneDNN picks: "
      "channels-last on AVX-512), or blocked (channels in blocks of the vector width: nChw16c on AVX-512, nChw8c on AVX2)";
  run->add_option("--conv-layout", conv_layout, conv_layout_help)->check(CLI::IsMember({"auto", "any", "blocked"}));
  std::string conv_algorithm = "auto";
  const std::string conv_algorithm_help =
      "3x3 stride-1 float32 convolutions: auto (default: Winograd F(4x4,3x3) where measured faster: 16 tiles or "
      "more, 32/16 channels in/out on AVX2, 64/64 with AVX-512), direct (oneDNN's direct kernels), or winograd "
      "(wherever it applies)";
  run->add_option("--conv-algorithm", conv_algorithm, conv_algorithm_help)
      ->check(CLI::IsMember({"auto", "direct", "winograd"}));
  std::string matmul_kernel = "auto";
  const std::string matmul_kernel_help =
      "float32 matrix products by constant 2-D weights (Linear layers): auto (default: oneDNN's 1x1 convolution "
      "over the rows where measured faster: AVX2 CPUs without AVX-512, 2 rows or more), gemm (oneDNN's matmul), or "
      "conv1x1 (the convolution wherever oneDNN has its jit kernel)";
  run->add_option("--matmul-kernel", matmul_kernel, matmul_kernel_help)->check(CLI::IsMember({"auto", "gemm", "conv1x1"}));
  run->add_flag("--check", check, "also run the reference executor and compare (fails past --tolerance)");
  run->add_option("--tolerance", tolerance,
                  "--check's bound on max|compiled-reference| / max|reference| (default 1e-4; a model with int8 "
                  "parts: 10%, or 2 steps of an output's quantization)")
      ->check(CLI::NonNegativeNumber);
  std::int64_t max_loop_iterations = ondine::reference::max_loop_iterations();
  run->add_option("--max-loop-iterations", max_loop_iterations,
                  "a Loop that runs more iterations than this fails (default 10000000)")
      ->check(CLI::PositiveNumber);
  auto* run_passes_opt = run->add_option(
      "--passes", passes,
      "passes compile runs: 'default' (default), 'none', or pass names; with --reference, given explicitly, "
      "the reference executor runs the optimised graph");

  std::vector<std::int64_t> batches;
  std::string json_file;
  int warmup = 5, bench_runs = 50;
  auto* bench = app.add_subcommand("bench", "latency and throughput of the compiled model per batch size");
  bench->add_option("model", model, "ONNX model file or compiled artifact (.ondine)")->required();
  bench->add_option("--batch", batches, "batch sizes, e.g. 1,8 (default 1; a model with static shapes: its own)")
      ->delimiter(',')->check(CLI::PositiveNumber);
  bench->add_option("--dim", dims, "NAME: the symbolic dim --batch sets (needed when there are several); "
                                   "NAME=SIZE: fix another symbolic dim (repeatable); NAME=LO:HI: a stream of shapes, "
                                   "each timed run drawing NAME uniformly in [LO, HI] (seeded), through one shape cache");
  bench->add_option("--threads", threads, "oneDNN threads (default: OpenMP's)");
  auto* bench_warmup_opt = bench->add_option("--warmup", warmup,
                                             "untimed runs per batch size first (a stream: at the ranges' midpoints; "
                                             "--decode: whole decodes, default 1)")
                               ->check(CLI::NonNegativeNumber);
  auto* bench_runs_opt = bench->add_option("--runs", bench_runs,
                                           "timed runs per batch size (a stream: its length; --decode: whole decodes, "
                                           "default 1, medians reported)")
                             ->check(CLI::PositiveNumber);
  ShapeBenchArgs shape_bench_args;
  auto* bench_decode_opt = bench->add_option(
      "--decode", shape_bench_args.decode_steps,
      "decode with the model's KV cache (past_* inputs fed by present_* outputs): the prompt (--dim SEQ=N, default "
      "32) with empty pasts, then STEPS runs of one token each; prompt and per-token times");
  bench_decode_opt->check(CLI::PositiveNumber);
  bench->add_option("--kv-cache", shape_bench_args.kv_cache,
                    "with --decode: in-place (the pasts in buffers of prompt + STEPS positions that each step appends "
                    "to: runtime::KvCache), feed (each step's presents fed back as the next pasts), or auto (default: "
                    "in place where the shape-free plan holds every past)")
      ->check(CLI::IsMember({"auto", "in-place", "feed"}));
  std::string shape_plan = "auto";
  auto* bench_shape_plan_opt =
      bench->add_option("--shape-plan", shape_plan,
                        "with a --dim range or --decode: auto (default: the shape-free plan where it covers the model "
                        "at fp32, else one compile per shape), per-shape, or shape-free")
          ->check(CLI::IsMember({"auto", "per-shape", "shape-free"}));
  bench->add_option("--streams", shape_bench_args.throughput.streams,
                    "run requests from N streams at once, each with its share of --threads (--streams 2 --threads 2: "
                    "two streams of one thread), pinned to cores of their own: throughput and latency p50/p90/p99")
      ->check(CLI::PositiveNumber);
  bench->add_option("--requests", shape_bench_args.throughput.requests,
                    "with --streams or --hint: requests timed (default --runs per stream)")
      ->check(CLI::PositiveNumber);
  bench->add_option("--hint", shape_bench_args.throughput.hint,
                    "streams chosen for you: latency (one stream of every thread) or throughput (streams of 1-4 "
                    "threads by the model's FLOPs per request)")
      ->check(CLI::IsMember({"latency", "throughput"}));
  bench->add_option("--seed", seed, "seed of the random inputs");
  bench->add_option("--json", json_file, "also write the results as JSON to this file");
  bench->add_flag("--reference", reference, "measure the reference executor instead of the compiled model");
  precision_opts.push_back(
      bench->add_option("--precision", precision, precision_help + "; an artifact: its own unless given")
          ->check(CLI::IsMember({"fp32", "bf16", "int8", "auto"})));
  bench->add_option("--keep-fp32", g_keep_fp32, keep_fp32_help);
  auto* bench_max_error_opt =
      bench->add_option("--max-error", g_max_error, max_error_help)->check(CLI::NonNegativeNumber);
  bench->add_option("--calib", g_calib_dir, calib_help);
  bench->add_option("--conv-layout", conv_layout, conv_layout_help)->check(CLI::IsMember({"auto", "any", "blocked"}));
  bench->add_option("--conv-algorithm", conv_algorithm, conv_algorithm_help)
      ->check(CLI::IsMember({"auto", "direct", "winograd"}));
  bench->add_option("--matmul-kernel", matmul_kernel, matmul_kernel_help)
      ->check(CLI::IsMember({"auto", "gemm", "conv1x1"}));
  bool bench_profile = false;
  bench->add_flag("--profile", bench_profile,
                  "then as many profiled runs: time per op and implementation, share outside oneDNN (overhead)");
  auto* bench_passes_opt = bench->add_option(
      "--passes", passes, "passes compile runs: 'default' (default), 'none' (to compare), or pass names");

  ondine::cli::CompareArgs compare_args;
  auto* compare = ondine::cli::add_compare_command(app, compare_args);
  ondine::cli::QuantizeArgs quantize_args;
  auto* quantize = ondine::cli::add_quantize_command(app, quantize_args);
  ondine::cli::HeaderArgs header_args;
  auto* header = ondine::cli::add_header_command(app, header_args);
  ondine::cli::OpsArgs ops_args;
  auto* ops = ondine::cli::add_ops_command(app, ops_args);

  try {
    for (CLI::App* sub : {inspect, compile, run, bench})
      sub->add_flag("--exact-int8-weights", g_exact_int8_weights, exact_weights_help);
    for (CLI::App* sub : {inspect, compile, run, bench})
      sub->add_flag("--exact-weight-only", g_exact_weight_only,
                    "weight-only quantized layers (4- or 8-bit weights) multiply float32 activations, the file's own "
                    "arithmetic (ONNX Runtime's MatMulNBits accuracy level 0), instead of int8 ones per block");
    compile->add_flag("--tune", g_tune,
                      "with -o MODEL.ondine: time the kernel alternatives (conv layout and algorithm, Linear kernel) "
                      "for this CPU's variant at the packing dims and store the fastest in the artifact, which its "
                      "loader applies (a --conv-layout, --conv-algorithm or --matmul-kernel given at load wins)");
    for (CLI::App* sub : {run, bench})
      sub->add_flag("--tune", g_tune,
                    "time the compiler's alternatives for this model on this CPU (conv layout and algorithm, Linear "
                    "kernel, the precision unless --precision is given, 7-bit or exact int8 weights without VNNI) and "
                    "keep the fastest; decisions are cached per model and machine (ONDINE_TUNE_CACHE, else "
                    "~/.cache/ondine/tune.txt), so the next --tune compiles once. A --conv-layout, --conv-algorithm or "
                    "--matmul-kernel given is kept");
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) ? 2 : 0;
  }
  for (CLI::Option* o : precision_opts) g_precision_given = g_precision_given || o->count() > 0;
  g_int8 = precision == "int8";
  g_precision = precision == "bf16" ? lower::Precision::Bf16
                : precision == "auto" ? lower::Precision::Auto
                                      : lower::Precision::Fp32;
  g_conv_layout = conv_layout == "blocked" ? lower::ConvLayout::ChannelBlocked
                  : conv_layout == "any"   ? lower::ConvLayout::Any
                                           : lower::ConvLayout::Auto;
  g_conv_algorithm = conv_algorithm == "direct"     ? lower::ConvAlgorithm::Direct
                     : conv_algorithm == "winograd" ? lower::ConvAlgorithm::Winograd
                                                    : lower::ConvAlgorithm::Auto;
  g_matmul_kernel = matmul_kernel == "gemm"      ? lower::MatMulKernel::Gemm
                    : matmul_kernel == "conv1x1" ? lower::MatMulKernel::Conv1x1
                                                 : lower::MatMulKernel::Auto;
  if (g_precision == lower::Precision::Auto && !g_max_error) g_max_error = 0.01;  // auto is verified
  if (!g_calib_dir.empty() && !g_int8) {
    std::cerr << "ondine: error: --calib quantizes a float model for --precision int8 (give it, or leave --calib out)\n";
    return 2;
  }
  if (g_int8 && !g_keep_fp32.empty()) {
    std::cerr << "ondine: error: --keep-fp32 names bf16's fp32 nodes; with --precision int8, `ondine quantize MODEL "
                 "--calib DIR --exclude NAME_OR_OP` keeps layers fp32\n";
    return 2;
  }
  if (g_int8 && g_max_error && g_calib_dir.empty()) {
    std::cerr << "ondine: error: --max-error with --precision int8 bounds the quantization of a float model: give "
                 "--calib DIR too\n";
    return 2;
  }
  if ((!g_keep_fp32.empty() || g_max_error) && g_precision == lower::Precision::Fp32 && !g_int8) {
    std::cerr << "ondine: error: " << (g_max_error ? "--max-error" : "--keep-fp32")
              << " needs --precision bf16 or auto (everything is fp32 already)\n";
    return 2;
  }
  try {
    if (*inspect)
      return cmd_inspect(model, dims, json, print_graph, dot_file, compiled, threads, inspect_passes,
                         inspect_passes_opt->count() ? inspect_passes : std::string("default"));
    if (*compile) return cmd_compile(model, compile_args);
    if (*compare) return ondine::cli::cmd_compare(compare_args);
    if (*quantize) return ondine::cli::cmd_quantize(quantize_args);
    if (*header) return ondine::cli::cmd_header(header_args);
    if (*ops) return ondine::cli::cmd_ops(ops_args);
    if (*bench) {
      shape_bench_args.shape_plan = shape_plan == "per-shape"    ? lower::ShapePlan::PerShape
                                    : shape_plan == "shape-free" ? lower::ShapePlan::ShapeFree
                                                                 : lower::ShapePlan::Auto;
      shape_bench_args.shape_plan_given = bench_shape_plan_opt->count() > 0;
      shape_bench_args.warmup_given = bench_warmup_opt->count() > 0;
      shape_bench_args.runs_given = bench_runs_opt->count() > 0;
      shape_bench_args.max_error_given = bench_max_error_opt->count() > 0;
      return cmd_bench(model, batches, dims, threads, warmup, bench_runs, seed, reference, json_file, passes,
                       bench_passes_opt->count() > 0, bench_profile, shape_bench_args);
    }
    ondine::reference::set_max_loop_iterations(max_loop_iterations);
    if (*run)
      return cmd_run(model, input_specs, dims, output_dir, seed, runs, reference, threads, check, tolerance, passes,
                     run_passes_opt->count() > 0, run_profile);
  } catch (const UsageError& e) {
    std::cerr << "ondine: error: " << e.what() << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "ondine: error: out of memory\n";
    return 1;
  } catch (const std::exception& e) {  // an ondine::Error's what() is escaped already; others may not be
    std::cerr << "ondine: error: " << ondine::detail::escape_text(e.what()) << "\n";
    return 1;
  } catch (...) {
    std::cerr << "ondine: error: internal error: unknown exception\n";
    return 1;
  }
  return 0;
}
