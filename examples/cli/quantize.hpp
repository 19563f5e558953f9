// examples/cli/quantize.hpp - `ondine quantize MODEL --calib DIR -o OUT.onnx`: post-training int8
// quantization to a QDQ ONNX model (QuantizeLinear/DequantizeLinear pairs, ONNX Runtime's format).
//
//   ondine quantize MODEL --weights int4|int8 -o OUT.onnx [--block-size N] [--asymmetric] [--no-lm-head]
//                   [--embeddings] [--exclude NAME,...]
//   ondine quantize MODEL --calib DIR -o OUT.onnx [--method minmax|entropy|percentile|mse|moving-average]
//                   [--max-samples N] [--exclude NAME_OR_OP,...] [--include NAME_OR_OP,...] [--keep-fp32-ends]
//                   [--activations u8|s8] [--reduce-range] [--save-calibration FILE] [--passes P]
//                   [--max-error E [--max-error-samples N] [--max-fallback N]]
//
// --weights: weight-only quantization (quant/weight_only.hpp) of the MatMul weights to 4 or 8 bits in blocks
// along K, no calibration; the file is written in opset 21 (blocked DequantizeLinear), as ONNX Runtime runs it.
// Steps (calibrated int8): load MODEL, run the fp32 pre-passes (--passes, default "remove-identity,fold-constants,dce,
// fold-bn": no fusion, the QDQ pass wants plain Conv/Relu/Add), calibrate on the .npy samples of DIR
// (quant::scan_calibration_folder: DIR/<sample>.npy for a one-input model, DIR/<sample>/<input>.npy
// otherwise) on the reference executor, insert Q/DQ (quant::QuantizeQDQ), write OUT.onnx, print what
// was quantized and what stayed fp32 and why. Progress goes to stderr.
// --max-error E: measure the QDQ model against fp32 on the first N calibration samples (relative max abs
// error of each output, quant/fallback.hpp) and keep layers fp32, worst first, until it is <= E; the
// layers kept and the error at each step are printed. Not met within --max-fallback layers: exit 1,
// nothing written.
// Errors name the sample file (wrong shape or dtype, NaN/Inf, unreadable .npy) and exit 1; command-line
// mistakes (bad --method, --activations, --passes) exit 2.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ondine/ondine.hpp"
#include "ondine/quant/calibration.hpp"
#include "ondine/quant/fallback.hpp"
#include "ondine/quant/qdq.hpp"
#include "ondine/quant/weight_only.hpp"
#include "progress.hpp"

namespace ondine::cli {

struct QuantizeArgs {
  std::string model, calib_dir, out_file, method = "minmax", activations = "u8", save_calibration;
  std::string passes = "remove-identity,fold-constants,dce,fold-bn";
  std::size_t max_samples = 0;
  std::vector<std::string> include, exclude;
  bool keep_fp32_ends = false;
  bool reduce_range = false;
  std::optional<double> max_error;
  std::size_t max_error_samples = 8, max_fallback = 0;
  std::string weights;  // int4 | int8: weight-only quantization
  std::int64_t block_size = 32;
  bool asymmetric = false, no_lm_head = false, embeddings = false;
};

inline CLI::App* add_quantize_command(CLI::App& app, QuantizeArgs& a) {
  auto* c = app.add_subcommand("quantize", "post-training int8 quantization: calibrate on .npy samples, write a QDQ ONNX model");
  c->add_option("model", a.model, "ONNX model file (fp32)")->required();
  c->add_option("--calib", a.calib_dir,
                "folder of calibration samples: DIR/<sample>.npy (one-input model) or DIR/<sample>/<input>.npy "
                "(required unless --weights)");
  c->add_option("--weights", a.weights, "weight-only quantization, no calibration: int4 or int8 MatMul weights in "
                                        "blocks along K (a language model's linear layers)");
  c->add_option("--block-size", a.block_size, "--weights: elements of K per scale (default 32)");
  c->add_flag("--asymmetric", a.asymmetric, "--weights: unsigned with a zero point per block (default: symmetric)");
  c->add_flag("--no-lm-head", a.no_lm_head, "--weights: keep a MatMul that writes a graph output (the LM head) float32");
  c->add_flag("--embeddings", a.embeddings, "--weights: quantize Gather tables (token embeddings) too");
  c->add_option("-o,--output", a.out_file, "the QDQ ONNX model to write")->required();
  c->add_option("--method", a.method, "activation range: minmax (default), entropy, percentile, mse, moving-average");
  c->add_option("--max-samples", a.max_samples, "calibrate on at most N samples (default: all)");
  c->add_option("--exclude", a.exclude, "keep these nodes fp32: node names or op types, comma-separated")->delimiter(',');
  c->add_option("--include", a.include, "quantize only these nodes: node names or op types, comma-separated")
      ->delimiter(',');
  c->add_flag("--keep-fp32-ends", a.keep_fp32_ends, "keep the first and last weight layer (Conv/MatMul/Gemm) in fp32");
  c->add_flag("--reduce-range", a.reduce_range,
              "7-bit weights [-64, 64]: int8 that CPUs without VNNI run exactly (else those layers stay fp32 there)");
  c->add_option("--activations", a.activations, "activation type: u8 (default; oneDNN's u8 x s8) or s8");
  c->add_option("--save-calibration", a.save_calibration, "also write the calibration result as text (a cache for "
                                                          "the pass option quantize.calibration)");
  c->add_option("--passes", a.passes, "fp32 passes before calibration (default remove-identity,fold-constants,dce,fold-bn)");
  auto* max_error = c->add_option("--max-error", a.max_error,
                                  "keep layers fp32, worst first, until every output is within E of fp32: max |int8 - "
                                  "fp32| / max |fp32| per output, on calibration samples (e.g. 0.02)");
  c->add_option("--max-error-samples", a.max_error_samples,
                "--max-error: measure on the first N calibration samples (default 8)")
      ->needs(max_error);
  c->add_option("--max-fallback", a.max_fallback, "--max-error: keep at most N layers fp32 (default: no limit)")
      ->needs(max_error);
  return c;
}

namespace quantize_detail {

inline std::string fmt_error(double e) {
  std::ostringstream os;
  os << std::setprecision(3) << e;
  return os.str();
}

// --max-error: quantize, then keep layers fp32 until the bound holds; progress to stderr.
inline quant::FallbackResult run_fallback(const Graph& g, const quant::CalibrationResult& calib,
                                          const quant::QuantizeOptions& qopts, const quant::CalibrationFolder& folder,
                                          const quant::CalibrationOptions& copts, const QuantizeArgs& args) {
  std::vector<quant::Sample> samples;
  for (std::size_t i = 0; i < std::min(args.max_error_samples, folder.size()); ++i) samples.push_back(folder.load(i));
  std::cerr << "max-error: measuring int8 against fp32 on " << samples.size() << " sample(s), bound "
            << fmt_error(*args.max_error) << "\n";
  quant::FallbackOptions fo;
  fo.max_error = *args.max_error;
  fo.max_fallbacks = args.max_fallback;
  fo.sample_label = copts.sample_label;
  fo.progress = [](std::size_t i, const quant::FallbackStep& s) {
    std::cerr << "fallback " << i << ": keeping '" << s.layer.node << "' (" << s.layer.op << ") fp32: error "
              << fmt_error(s.error_before) << " -> " << fmt_error(s.error_after) << "\n";
  };
  return quant::quantize_with_fallback(g, calib, qopts, samples, fo);
}

inline void print_fallback(const quant::FallbackResult& r, double bound, std::size_t samples, double seconds) {
  std::cout << "max error:   " << fmt_error(r.error) << " <= " << fmt_error(bound)
            << " (max |int8 - fp32| / max |fp32| per output, " << samples << " calibration sample(s); int8 everywhere: " << fmt_error(r.initial_error)
            << ")\n";
  std::cout << "fallback:    " << r.steps.size() << " layer(s) kept fp32, worst first (" << std::fixed
            << std::setprecision(1) << seconds << " s)\n";
  for (std::size_t i = 0; i < r.steps.size(); ++i) {
    const auto& s = r.steps[i];
    std::cout << "  " << i + 1 << ". " << s.layer.node << " (" << s.layer.op << "; alone int8: output SQNR "
              << s.layer.sqnr_db << " dB): error " << fmt_error(s.error_before) << " -> " << fmt_error(s.error_after)
              << "\n";
  }
  std::cout << std::defaultfloat;
}

}  // namespace quantize_detail

// A mistake in QuantizeArgs (bad --method, --activations, --passes, --max-error): exit code 2 in cmd_quantize.
struct QuantizeUsageError : Error {
  using Error::Error;
};

// The options args names, checked (QuantizeUsageError) before any model is read.
struct QuantizePlan {
  quant::CalibrationOptions calibration;
  quant::QuantizeOptions quantize;
  PassManager passes;
};

// --weights: the options, checked (QuantizeUsageError).
inline quant::WeightOnlyOptions plan_weight_only(const QuantizeArgs& args) {
  if (args.weights != "int4" && args.weights != "int8")
    throw QuantizeUsageError("--weights must be int4 or int8, not '" + args.weights + "'");
  if (!args.calib_dir.empty() || args.max_error || args.keep_fp32_ends || args.reduce_range || !args.include.empty())
    throw QuantizeUsageError("--weights quantizes weights only, without calibration: --calib, --max-error, "
                             "--keep-fp32-ends, --reduce-range and --include do not apply");
  if (args.block_size < 2 || args.block_size % 2 != 0)
    throw QuantizeUsageError("--block-size must be even and at least 2, not " + std::to_string(args.block_size));
  quant::WeightOnlyOptions o;
  o.bits = args.weights == "int4" ? 4 : 8;
  o.block_size = args.block_size;
  o.symmetric = !args.asymmetric;
  o.lm_head = !args.no_lm_head;
  o.embeddings = args.embeddings;
  o.exclude = args.exclude;
  return o;
}

inline QuantizePlan plan_quantize(const QuantizeArgs& args) {
  using namespace quantize_detail;
  QuantizePlan plan;
  if (args.calib_dir.empty()) throw QuantizeUsageError("--calib is required: a folder of calibration samples (or --weights int4|int8 for weight-only quantization)");
  std::vector<std::pair<std::string, bool>> entries;
  try {
    plan.calibration.activations.method = quant::parse_range_method(args.method);
    plan.quantize.activations = quant::detail::qdq::parse_activation_type(args.activations);
    plan.passes = make_pass_manager(args.passes);
    entries = PassManager::parse_pipeline(expand_pipeline(args.passes));
  } catch (const Error& e) {
    throw QuantizeUsageError(e.message());
  }
  if (args.max_error && (!(*args.max_error >= 0) || !std::isfinite(*args.max_error)))
    throw QuantizeUsageError("--max-error must be a finite number >= 0, got " + fmt_error(*args.max_error));
  if (args.max_error && args.max_error_samples == 0) throw QuantizeUsageError("--max-error-samples must be at least 1");
  for (auto& entry : entries)
    if (entry.first == "quantize" || entry.first == "fuse" || entry.first == "layout")
      throw QuantizeUsageError("--passes '" + args.passes + "': pass '" + entry.first + "' does not belong before "
                               "calibration (quantization wants the fp32 graph with plain Conv/Relu/Add)");
  // The activation scheme follows --activations (calibration stores params in that type).
  plan.calibration.activation_scheme.dtype = plan.quantize.activations;
  plan.calibration.max_samples = args.max_samples;
  plan.quantize.include = args.include;
  plan.quantize.exclude = args.exclude;
  plan.quantize.keep_fp32_ends = args.keep_fp32_ends;
  plan.quantize.reduce_range_weights = args.reduce_range;
  return plan;
}

// A float graph after the pre-passes, calibrated: Q/DQ can go in at any weight width (insert_qdq), so
// variants for CPUs with and without VNNI share one calibration.
struct CalibratedGraph {
  Graph graph;
  QuantizePlan plan;
  quant::CalibrationFolder folder;
  quant::CalibrationResult calibration;
};

namespace quantize_detail {
// Samples are named by their file (one input) or their folder, so an error points at what to fix.
inline std::function<std::string(std::size_t)> sample_labels(const quant::CalibrationFolder& folder) {
  return [&folder](std::size_t i) {
    const auto& files = folder.files.at(i);
    if (files.size() == 1) return files.begin()->second;
    return (std::filesystem::path(folder.dir) / folder.labels.at(i)).string();
  };
}
}  // namespace quantize_detail

// The fp32 pre-passes and calibration on args.calib_dir's samples (progress on stderr); prints the model
// and calibration lines.
inline std::unique_ptr<CalibratedGraph> calibrate_graph(Graph g, const QuantizeArgs& args) {
  using namespace quantize_detail;
  auto c = std::make_unique<CalibratedGraph>();
  c->plan = plan_quantize(args);
  quant::CalibrationOptions& copts = c->plan.calibration;
  PassManager& pm = c->plan.passes;

  auto t0 = std::chrono::steady_clock::now();
  std::size_t imported_nodes = g.num_nodes();
  try {
    pm.run(g);
  } catch (Error& e) {
    e.in_file(args.model);
    throw;
  }

  c->folder = quant::scan_calibration_folder(args.calib_dir, quant::input_names(g));
  copts.sample_label = sample_labels(c->folder);
  copts.expected_samples = c->folder.size();
  ProgressLine progress("calibrating");
  copts.progress = [&](std::size_t done, std::optional<std::size_t> total) { progress.update(done, total); };
  std::size_t total = args.max_samples ? std::min(args.max_samples, c->folder.size()) : c->folder.size();
  std::cerr << "calibrating " << args.model << " on " << total << " sample(s) from " << args.calib_dir << " ("
            << args.method << ")\n";
  c->calibration = quant::calibrate(g, c->folder.source(), copts);
  progress.clear();
  copts.progress = nullptr;
  double calib_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (!args.save_calibration.empty()) {
    std::ofstream out(args.save_calibration, std::ios::binary);
    if (!out || !(out << c->calibration.to_text()) || !out.flush())
      throw Error("cannot write the calibration file").in_file(args.save_calibration);
  }
  std::cout << "model:       " << args.model << " (" << imported_nodes << " nodes; after '" << pm.pipeline() << "': "
            << g.num_nodes() << ")\n";
  std::cout << "calibration: " << c->calibration.samples << " sample(s) from " << args.calib_dir << ", method "
            << args.method << ", activations " << (c->plan.quantize.activations == DType::UInt8 ? "u8" : "s8") << " ("
            << std::fixed << std::setprecision(1) << calib_s << " s)\n" << std::defaultfloat;
  c->graph = std::move(g);
  return c;
}

// Q/DQ into a copy of c's graph with weights of args.reduce_range's width (with args.max_error: the
// fallback, worst layer first); prints what was quantized and what stayed fp32.
inline Graph insert_qdq(const CalibratedGraph& c, const QuantizeArgs& args) {
  using namespace quantize_detail;
  quant::QuantizeOptions qopts = c.plan.quantize;
  qopts.reduce_range_weights = args.reduce_range;
  quant::CalibrationOptions copts = c.plan.calibration;
  copts.sample_label = sample_labels(c.folder);
  Graph g = c.graph.clone();
  auto t0 = std::chrono::steady_clock::now();
  quant::QuantizeReport report;
  std::optional<quant::FallbackResult> fallback;
  try {
    if (args.max_error) {
      fallback = run_fallback(g, c.calibration, qopts, c.folder, copts, args);
      g = std::move(fallback->graph);
      report = fallback->report;
    } else {
      report = quant::quantize_qdq(g, c.calibration, qopts);
    }
  } catch (Error& e) {
    e.in_file(args.model);
    throw;
  }
  double fallback_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (fallback && !fallback->met) {
    bool limit = args.max_fallback && fallback->steps.size() == args.max_fallback;
    throw Error("--max-error " + fmt_error(*args.max_error) + " not met: the error is still " +
                fmt_error(fallback->error) + " with " + std::to_string(fallback->steps.size()) + " layer(s) kept fp32 " +
                (limit ? "(the --max-fallback limit); raise --max-fallback or the bound"
                       : "(all of them: the fp32 model's own outputs are not finite)") +
                ". Nothing written")
        .in_file(args.model);
  }
  std::cout << "weights s8 per channel" << (qopts.reduce_range_weights ? ", 7-bit ([-64, 64])" : "") << "\n";
  std::cout << report.to_text();
  if (fallback)
    print_fallback(*fallback, *args.max_error, std::min(args.max_error_samples, c.folder.size()), fallback_s);
  if (!args.save_calibration.empty()) std::cout << "calibration written to " << args.save_calibration << "\n";
  return g;
}

// Quantizes the float graph g in place (loaded from args.model; args.out_file unused): calibrate_graph,
// then insert_qdq. `ondine quantize` writes the result as ONNX; run, bench and compile with
// --precision int8 --calib DIR compile it.
inline void quantize_graph(Graph& g, const QuantizeArgs& args) {
  auto c = calibrate_graph(std::move(g), args);
  g = insert_qdq(*c, args);
}

// `ondine quantize --weights`: prints each layer and the bytes before and after.
inline int cmd_quantize_weights(const QuantizeArgs& args) {
  const quant::WeightOnlyOptions o = plan_weight_only(args);
  Graph g = onnx::load_model(args.model);
  check_supported(g);
  quant::WeightOnlyReport report;
  try {
    report = quant::quantize_weights(g, o);
  } catch (Error& e) {
    e.in_file(args.model);
    throw;
  }
  auto mib = [](std::uint64_t b) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(1) << static_cast<double>(b) / (1 << 20) << " MiB";
    return os.str();
  };
  std::cout << "weights:     " << args.weights << (o.symmetric ? " symmetric" : " asymmetric (zero points)") << ", blocks of "
            << o.block_size << " along K, float32 scales\n";
  for (const auto& l : report.quantized)
    std::cout << "  " << l.node << " (" << l.op << " [" << l.rows << "," << l.cols << "]): " << mib(l.bytes_before) << " -> "
              << mib(l.bytes_after) << "\n";
  for (const auto& [node, why] : report.skipped) std::cout << "  " << node << ": kept float32 (" << why << ")\n";
  std::cout << "quantized:   " << report.quantized.size() << " layer(s), " << mib(report.bytes_before()) << " -> "
            << mib(report.bytes_after()) << "\n";
  if (report.quantized.empty())
    throw Error("no MatMul with float32 constant weights of at least --block-size rows to quantize; nothing written")
        .in_file(args.model);
  onnx::save_model(g, args.out_file);
  std::cout << "wrote: " << args.out_file << " (" << g.num_nodes() << " nodes, opset " << g.opset() << ")\n";
  return 0;
}

// Returns the exit code: 0 done, 1 error (an ondine::Error propagates to main), 2 command-line mistake.
inline int cmd_quantize(const QuantizeArgs& args) {
  try {
    if (!args.weights.empty()) return cmd_quantize_weights(args);
    plan_quantize(args);  // command-line mistakes before the model is read
    Graph g = onnx::load_model(args.model);
    check_supported(g);
    quantize_graph(g, args);
    onnx::save_model(g, args.out_file);
    std::cout << "wrote: " << args.out_file << " (" << g.num_nodes() << " nodes, opset " << g.opset() << ")\n";
  } catch (const QuantizeUsageError& e) {
    std::cerr << "ondine: error: " << e.message() << "\n";
    return 2;
  }
  return 0;
}

}  // namespace ondine::cli
