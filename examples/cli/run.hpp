// SPDX-License-Identifier: Apache-2.0
// `ondine run MODEL`: one model on .npy or seeded random inputs, its outputs, a benchmark line, and with
// --check the comparison against the reference executor.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ondine/lower/lower.hpp"
#include "common.hpp"
#include "engine.hpp"

namespace ondine::cli {

inline int cmd_run(const std::string& path, const std::vector<std::string>& input_specs,
                   const std::vector<std::string>& dim_specs, const std::string& output_dir, std::uint64_t seed,
                   int runs, bool use_reference, int threads, bool check, std::optional<double> check_tolerance,
                   const std::string& passes, bool passes_given, bool profile) {
  pipeline_for(passes);
  // An artifact's weight checksum runs while the model compiles (awaited below, counted in compile=).
  ModelFile file = load_model_file(path, false, artifact::WeightCheck::Background);
  adopt_artifact_precision(file);
  const std::string pipeline = pipeline_of(file, passes, passes_given);
  if (file.artifact) std::cout << artifact_summary(*file.artifact, file.variants.size()) << "\n";
  Graph g = std::move(file.graph);
  check_supported(g);  // every unsupported op at once, before anything runs
  name_unknown_input_dims(g);  // `?` dims (no dim_param) bind from the input files like named ones
  if (file.artifact && !g_calib_dir.empty()) throw UsageError("--calib quantizes an ONNX model; " + path + " is compiled already");
  quantize_for_int8(g, path, lower::effective_isa());
  std::map<std::string, Tensor> inputs;
  for (auto& spec : input_specs) {
    auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) throw Error("--input expects NAME=FILE.npy, got '" + spec + "'");
    std::string name = spec.substr(0, eq);
    Value* v = g.find_value(name);
    if (!v || !v->is_graph_input()) {
      std::string names;
      for (Value* in : g.inputs()) names += (names.empty() ? "" : ", ") + in->name();
      throw Error("--input " + name + ": the model has no input of that name (inputs: " + names + ")").in_file(path);
    }
    inputs[name] = load_npy(spec.substr(eq + 1));
  }
  // Symbolic dims: bound by --dim, or by the shapes of the given input files.
  auto bindings = parse_dims(dim_specs);
  for (Value* in : g.inputs())
    if (auto it = inputs.find(in->name()); it != inputs.end() && in->shape().rank_known() &&
                                           in->shape().rank() == it->second.rank())
      for (std::size_t d = 0; d < in->shape().rank(); ++d)
        if (!in->shape()[d].is_static() && !in->shape()[d].symbol.empty())
          bindings.emplace(in->shape()[d].symbol, it->second.dims()[d]);
  for (auto& sym : symbolic_dims(g)) bindings.emplace(sym, 1);
  bind_dims(g, bindings);
  fill_random_inputs(g, inputs, seed);

  check_inputs(g, inputs);  // one message for a wrong name, dtype or shape, whichever engine runs

  // The engine: the oneDNN-compiled model by default, or the reference executor (the oracle).
  Engine engine;
  try {
    engine = make_engine(g, use_reference, threads, pipeline, passes_given || file.artifact.has_value(), file.packed,
                         &inputs);
  } catch (...) {
    double waited = 0;
    file.wait_checked(waited);  // a damaged file is reported as such, even where it made the compile fail
    throw;
  }
  file.wait_checked(engine.compile_ms);
  if (file.packed && !use_reference) {
    std::cout << "packed weights: " << file.packings << " stored, " << file.packed->preloaded_hits()
              << " used as stored, " << file.packed->packed_here() << " packed at load\n";
    print_repacks(*file.packed);
  }
  std::map<std::string, Tensor> outputs;
  std::vector<double> ms = time_runs(engine, inputs, std::max(runs, 1), path, "", &outputs);
  for (Value* o : g.outputs()) std::cout << o->name() << ": " << summary(outputs.at(o->name())) << "\n";
  if (!output_dir.empty()) {
    fs::create_directories(output_dir);
    for (auto& [name, t] : outputs) {
      std::string safe = name;
      std::replace_if(safe.begin(), safe.end(), [](char c) { return c == '/' || c == '\\' || c == ':'; }, '_');
      save_npy(t, (fs::path(output_dir) / (safe + ".npy")).string());
    }
    std::cout << "wrote " << outputs.size() << " output(s) to " << output_dir << "\n";
  }
  std::sort(ms.begin(), ms.end());
  std::string at;
  for (auto& [k, v] : bindings) at += (at.empty() ? "" : ",") + k + "=" + std::to_string(v);
  std::cout << std::fixed << std::setprecision(1) << "benchmark: engine=" << (use_reference ? "reference" : "compiled")
            << (use_reference ? "" : " isa=" + engine.isa + " precision=" + precision_label()) << " "
            << (at.empty() ? "" : at + " ")
            << "threads=" << (threads > 0 ? std::to_string(threads) : std::string("default"))
            << ((use_reference && !passes_given) ? "" : " passes=" + passes_label(pipeline)) << " runs=" << ms.size()
            << " median=" << ms[ms.size() / 2] << " ms min=" << ms.front() << " ms load=" << file.load_ms << " ms";
  if (!use_reference) std::cout << " compile=" << engine.compile_ms << " ms";
  std::cout << "\n";
  if (!engine.precision.empty()) std::cout << engine.precision << "\n";
  if (profile && engine.profile)  // after the timed runs, so profiling cannot slow them
    std::cout << engine.profile(inputs, std::max(runs, 1));
  if (check && !use_reference) {
    // Every optimisation (passes and lowering) is checked against the oracle: the imported graph on
    // the reference executor, same inputs.
    auto expected = ReferenceExecutor(g).run(inputs);
    check_outputs(g, outputs, expected, check_bound(g, check_tolerance), path,
                  "compiled outputs differ from the reference executor's");
  }
  return 0;
}

}  // namespace ondine::cli
