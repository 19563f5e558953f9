// examples/cli/quantize.hpp - `ondine quantize MODEL --calib DIR -o OUT.onnx`: post-training int8
// quantization to a QDQ ONNX model (QuantizeLinear/DequantizeLinear pairs, ONNX Runtime's format).
//
//   ondine quantize MODEL --calib DIR -o OUT.onnx [--method minmax|entropy|percentile|mse|moving-average]
//                   [--max-samples N] [--exclude NAME_OR_OP,...] [--include NAME_OR_OP,...] [--keep-fp32-ends]
//                   [--activations u8|s8] [--save-calibration FILE] [--passes P]
//
// Steps: load MODEL, run the fp32 pre-passes (--passes, default "remove-identity,fold-constants,dce,
// fold-bn": no fusion, the QDQ pass wants plain Conv/Relu/Add), calibrate on the .npy samples of DIR
// (quant::scan_calibration_folder: DIR/<sample>.npy for a one-input model, DIR/<sample>/<input>.npy
// otherwise) on the reference executor, insert Q/DQ (quant::QuantizeQDQ), write OUT.onnx, print what
// was quantized and what stayed fp32 and why. Progress goes to stderr.
// Errors name the sample file (wrong shape or dtype, NaN/Inf, unreadable .npy) and exit 1; command-line
// mistakes (bad --method, --activations, --passes) exit 2.
#pragma once

#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ondine/ondine.hpp"
#include "ondine/quant/calibration.hpp"
#include "ondine/quant/qdq.hpp"

namespace ondine::cli {

struct QuantizeArgs {
  std::string model, calib_dir, out_file, method = "minmax", activations = "u8", save_calibration;
  std::string passes = "remove-identity,fold-constants,dce,fold-bn";
  std::size_t max_samples = 0;
  std::vector<std::string> include, exclude;
  bool keep_fp32_ends = false;
};

inline CLI::App* add_quantize_command(CLI::App& app, QuantizeArgs& a) {
  auto* c = app.add_subcommand("quantize", "post-training int8 quantization: calibrate on .npy samples, write a QDQ ONNX model");
  c->add_option("model", a.model, "ONNX model file (fp32)")->required();
  c->add_option("--calib", a.calib_dir,
                "folder of calibration samples: DIR/<sample>.npy (one-input model) or DIR/<sample>/<input>.npy")
      ->required();
  c->add_option("-o,--output", a.out_file, "the QDQ ONNX model to write")->required();
  c->add_option("--method", a.method, "activation range: minmax (default), entropy, percentile, mse, moving-average");
  c->add_option("--max-samples", a.max_samples, "calibrate on at most N samples (default: all)");
  c->add_option("--exclude", a.exclude, "keep these nodes fp32: node names or op types, comma-separated")->delimiter(',');
  c->add_option("--include", a.include, "quantize only these nodes: node names or op types, comma-separated")
      ->delimiter(',');
  c->add_flag("--keep-fp32-ends", a.keep_fp32_ends, "keep the first and last weight layer (Conv/MatMul/Gemm) in fp32");
  c->add_option("--activations", a.activations, "activation type: u8 (default; oneDNN's u8 x s8) or s8");
  c->add_option("--save-calibration", a.save_calibration, "also write the calibration result as text (a cache for "
                                                          "the pass option quantize.calibration)");
  c->add_option("--passes", a.passes, "fp32 passes before calibration (default remove-identity,fold-constants,dce,fold-bn)");
  return c;
}

// Returns the exit code: 0 done, 1 error (an ondine::Error propagates to main), 2 command-line mistake.
inline int cmd_quantize(const QuantizeArgs& args) {
  auto usage = [](const std::string& msg) {
    std::cerr << "ondine: error: " << msg << "\n";
    return 2;
  };
  quant::CalibrationOptions copts;
  quant::QuantizeOptions qopts;
  PassManager pm;
  std::vector<std::pair<std::string, bool>> entries;
  try {
    copts.activations.method = quant::parse_range_method(args.method);
    qopts.activations = quant::detail::qdq::parse_activation_type(args.activations);
    pm = make_pass_manager(args.passes);
    entries = PassManager::parse_pipeline(expand_pipeline(args.passes));
  } catch (const Error& e) {
    return usage(e.message());
  }
  for (auto& entry : entries)
    if (entry.first == "quantize" || entry.first == "fuse" || entry.first == "layout")
      return usage("--passes '" + args.passes + "': pass '" + entry.first + "' does not belong before calibration "
                   "(quantization wants the fp32 graph with plain Conv/Relu/Add)");
  // The activation scheme follows --activations (calibration stores params in that type).
  copts.activation_scheme.dtype = qopts.activations;
  copts.max_samples = args.max_samples;
  qopts.include = args.include;
  qopts.exclude = args.exclude;
  qopts.keep_fp32_ends = args.keep_fp32_ends;

  auto t0 = std::chrono::steady_clock::now();
  Graph g = onnx::load_model(args.model);
  check_supported(g);
  std::size_t imported_nodes = g.num_nodes();
  try {
    pm.run(g);
  } catch (Error& e) {
    e.in_file(args.model);
    throw;
  }

  quant::CalibrationFolder folder = quant::scan_calibration_folder(args.calib_dir, quant::input_names(g));
  // Samples are named by their file (one input) or their folder, so an error points at what to fix.
  copts.sample_label = [&](std::size_t i) {
    const auto& files = folder.files.at(i);
    if (files.size() == 1) return files.begin()->second;
    return (std::filesystem::path(folder.dir) / folder.labels.at(i)).string();
  };
  copts.expected_samples = folder.size();
  auto shown = std::chrono::steady_clock::now();
  copts.progress = [&](std::size_t done, std::optional<std::size_t> total) {
    auto now = std::chrono::steady_clock::now();
    bool last = total && done == *total;
    if (!last && std::chrono::duration<double>(now - shown).count() < 1.0 && done != 1) return;
    shown = now;
    std::cerr << "calibrating: sample " << done << (total ? "/" + std::to_string(*total) : std::string()) << "\n";
  };
  std::size_t total = args.max_samples ? std::min(args.max_samples, folder.size()) : folder.size();
  std::cerr << "calibrating " << args.model << " on " << total << " sample(s) from " << args.calib_dir << " ("
            << args.method << ")\n";
  quant::CalibrationResult calib = quant::calibrate(g, folder.source(), copts);
  double calib_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (!args.save_calibration.empty()) {
    std::ofstream out(args.save_calibration, std::ios::binary);
    if (!out || !(out << calib.to_text()) || !out.flush())
      throw Error("cannot write the calibration file").in_file(args.save_calibration);
  }

  quant::QuantizeQDQ pass(calib, qopts);
  PassContext ctx;
  ctx.begin_pass(quant::QuantizeQDQ::name);
  try {
    pass.run(g, ctx);
    g.verify();
  } catch (Error& e) {
    e.in_file(args.model);
    throw;
  }
  onnx::save_model(g, args.out_file);

  const auto& report = pass.report();
  std::cout << "model:       " << args.model << " (" << imported_nodes << " nodes; after '" << pm.pipeline() << "': "
            << g.num_nodes() - report.q_nodes - report.dq_nodes << ")\n";
  std::cout << "calibration: " << calib.samples << " sample(s) from " << args.calib_dir << ", method " << args.method
            << ", activations " << (qopts.activations == DType::UInt8 ? "u8" : "s8") << ", weights s8 per channel ("
            << std::fixed << std::setprecision(1) << calib_s << " s)\n";
  std::cout << report.to_text();
  if (!args.save_calibration.empty()) std::cout << "calibration written to " << args.save_calibration << "\n";
  std::cout << "wrote: " << args.out_file << " (" << g.num_nodes() << " nodes, opset " << g.opset() << ")\n";
  return 0;
}

}  // namespace ondine::cli
