// SPDX-License-Identifier: Apache-2.0
// `ondine inspect MODEL`: ops histogram, parameters, FLOPs, inputs/outputs, unsupported ops, and with
// --compiled what the compiler made of the model.
#pragma once

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ondine/lower/artifact.hpp"
#include "ondine/lower/lower.hpp"
#include "common.hpp"
#include "engine.hpp"

namespace ondine::cli {

// What compile() made of the model: ISA, every step with oneDNN's implementation, the memory plan.
inline void print_compiled(const Graph& bound, int threads, const std::string& passes) {
  auto t0 = std::chrono::steady_clock::now();
  lower::CompileOptions opts = tool_compile_options(threads, passes);
  std::string precision_line;
  opts.log = [&precision_line](const std::string& line) {
    keep_precision_line(precision_line, line);
  };
  CompiledModel model = lower::compile(bound, opts);
  double ms = elapsed_ms(t0);
  std::cout << "\ncompiled: isa " << model.isa() << ", " << model.steps().size() << " steps, compile "
            << std::fixed << std::setprecision(1) << ms << " ms, passes " << (passes.empty() ? "none" : passes) << "\n";
  const auto& mem = model.memory();
  std::cout << "memory:   arena " << human(static_cast<double>(mem.arena_bytes), "B") << " (peak live "
            << human(static_cast<double>(mem.peak_bytes), "B") << ", all activations "
            << human(static_cast<double>(mem.total_bytes), "B") << ")\n";
  std::cout << "implementations:\n";
  for (auto& [impl, n] : model.implementation_histogram())
    std::cout << "  " << std::left << std::setw(40) << impl << std::right << std::setw(6) << n << "\n";
  if (!precision_line.empty()) std::cout << precision_line << "\n";
  std::cout << "steps:\n" << model.to_text();
  // Slow paths: oneDNN's ref implementations and Ondine's reference kernels (bench --profile times them).
  std::vector<StepInfo> slow;
  for (const StepInfo& s : model.steps())
    if (s.slow_path()) slow.push_back(s);
  std::cout << "slow paths: " << (slow.empty() ? std::string("none") : std::to_string(slow.size()) + " step(s) on reference kernels:");
  for (std::size_t i = 0; i < std::min<std::size_t>(slow.size(), 8); ++i)
    std::cout << (i ? ";" : "") << " " << slow[i].op << " '" << slow[i].name << "' (" << slow[i].implementation << ")";
  std::cout << (slow.size() > 8 ? "; ..." : "") << "\n";
  std::cout << lower::int8_plan(model).text();  // Q/DQ left, fp32 islands, predicted int8 vs fp32
}

// The nodes whose output shapes do not follow from the input dims although their inputs' shapes do:
// their shapes depend on data (NonZero, a Reshape fed by one) or the op has no shape inference.
inline std::vector<const Node*> data_dependent_nodes(const Graph& g) {
  auto known = [](const Value* v) {
    if (!v || !v->shape().rank_known()) return v == nullptr;
    for (auto& d : v->shape().dims())
      if (!d.is_static() && d.symbol.empty()) return false;
    return true;
  };
  std::vector<const Node*> out;
  for (Node* n : g.topo_order()) {
    bool inputs_known = std::all_of(n->inputs().begin(), n->inputs().end(), known);
    bool outputs_known = std::all_of(n->outputs().begin(), n->outputs().end(), known);
    if (inputs_known && !outputs_known) out.push_back(n);
  }
  return out;
}

// `passes` ("none" unless given) runs on the graph shown; --compiled compiles the imported graph with
// `compile_passes`, the pipeline `ondine run` would use.
inline int cmd_inspect(const std::string& path, const std::vector<std::string>& dim_specs, bool json, bool print_graph,
                       const std::string& dot_file, bool compiled, int threads, const std::string& passes,
                       const std::string& compile_passes) {
  ModelFile file = load_model_file(path, /*describe_only=*/!compiled);
  if (compiled) adopt_artifact_precision(file);
  if (compiled) check_int8_model(file.graph, path);
  // An artifact's graph is already optimised: no pass runs on it, here or when compiled.
  PassManager pm = pipeline_for(file.artifact ? std::string("none") : passes);
  const std::string compile_pipeline = file.artifact ? std::string("none") : compile_passes;
  pipeline_for(compile_pipeline);
  Graph g = std::move(file.graph);
  Graph imported = g.clone();
  if (pm.size()) {
    check_supported(g);
    pm.run(g);
  }
  auto bindings = parse_dims(dim_specs);
  // FLOPs need numbers: symbolic dims not given with --dim count as 1 (one sample), and the report says so.
  std::vector<std::string> defaulted;
  for (auto& sym : symbolic_dims(g))
    if (bindings.emplace(sym, 1).second) defaulted.push_back(sym);
  // Some models reject 1 for a dim (an image of 1x1 pixels through a pooling stack): then the FLOPs need
  // those dims given, and the rest of the description stays symbolic.
  GraphStats stats;
  std::string flops_need;  // why FLOPs are not counted: the dims to give
  try {
    Graph bound = g.clone();
    bind_dims(bound, bindings);
    stats = graph_stats(bound);
  } catch (const Error& e) {
    if (defaulted.empty()) throw;  // the dims given with --dim are refused: the user's to change
    std::string names, flags;
    for (auto& d : defaulted) {
      names += (names.empty() ? "" : ", ") + d;
      flags += (flags.empty() ? "" : " ") + std::string("--dim ") + d + "=N";
    }
    flops_need = "give " + flags + " (with " + names + " counted as 1 the shapes are refused: " + e.what() + ")";
    for (auto& d : defaulted) bindings.erase(d);
    defaulted.clear();
    stats = graph_stats(g);
    stats.flops.reset();
  }
  std::vector<const Node*> data_dependent = data_dependent_nodes(g);
  auto unsupported = unsupported_nodes(g);
  std::map<std::string, std::vector<std::string>> bad;
  for (auto* n : unsupported) bad[n->op_key()].push_back(n->name());
  // Ops inside subgraphs (If branches, Loop and Scan bodies, nested ones too), counted apart.
  std::map<std::string, std::size_t> inner;
  std::function<void(const Graph&)> count_inner = [&](const Graph& sub) {
    for (Node* n : sub.nodes()) {
      ++inner[n->op_key()];
      for (auto& [attr, body] : n->subgraphs()) count_inner(*body);
    }
  };
  for (Node* n : g.nodes())
    for (auto& [attr, body] : n->subgraphs()) count_inner(*body);

  if (!dot_file.empty()) {
    std::ofstream(dot_file) << g.to_dot();
  }
  if (json) {
    nlohmann::json j;
    j["model"] = path;
    j["opset"] = g.opset();
    j["nodes"] = g.num_nodes();
    j["parameters"] = stats.parameters;
    j["parameter_bytes"] = stats.parameter_bytes;
    j["flops"] = stats.flops ? nlohmann::json(*stats.flops) : nlohmann::json(nullptr);
    if (!flops_need.empty()) j["flops_need"] = flops_need;
    j["dims"] = bindings;
    j["defaulted_dims"] = defaulted;
    j["symbolic_dims"] = symbolic_dims(g);
    for (const Node* n : data_dependent)
      j["data_dependent"].push_back({{"node", n->name()}, {"op", n->op_key()}});
    if (data_dependent.empty()) j["data_dependent"] = nlohmann::json::array();
    for (Value* v : g.inputs()) j["inputs"].push_back({{"name", v->name()}, {"type", Graph::value_type_str(v)}});
    for (Value* v : g.outputs()) j["outputs"].push_back({{"name", v->name()}, {"type", Graph::value_type_str(v)}});
    j["ops"] = op_key_histogram(g);
    j["subgraph_ops"] = inner;
    j["passes"] = passes_label(file.artifact ? std::string("none") : passes);
    j["unsupported_ops"] = bad;
    if (file.artifact) {
      const artifact::Info& a = *file.artifact;
      j["artifact"] = {{"format_version", a.format_version}, {"source", a.source}, {"ondine_version", a.ondine_version},
                       {"onednn_version", a.onednn_version}, {"isa", a.isa}, {"precision", a.precision},
                       {"keep_fp32", a.keep_fp32},
                       {"requires_vnni", a.requires_vnni}, {"threads", a.threads}, {"passes", a.passes},
                       {"file_bytes", a.file_bytes}, {"weight_bytes", a.weight_bytes},
                       {"packed_weights", file.packings}, {"packing_dims", file.packing_dims},
                       {"variant", file.variant}};
      for (const artifact::Info& v : file.variants)
        j["artifact"]["variants"].push_back({{"isa", v.isa}, {"precision", v.precision}, {"keep_fp32", v.keep_fp32},
                                             {"requires_vnni", v.requires_vnni},
                                             {"threads", v.threads}, {"packed_weights", v.packings},
                                             {"unpacked", v.unpacked},
                                             {"runs_here", lower::isa_runs_on(lower::isa_from_name(v.isa), lower::effective_isa().isa)}});
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "model:   " << path << " (opset " << g.opset() << ", " << g.num_nodes() << " nodes, producer '"
            << g.producer_name << "')\n";
  if (file.artifact) {
    std::cout << "compiled: " << artifact_summary(*file.artifact, file.variants.size()) << "\n";
    const lower::IsaInfo here = lower::effective_isa();
    for (std::size_t i = 0; i < file.variants.size(); ++i) {
      const artifact::Info& v = file.variants[i];
      std::cout << "variant: " << std::left << std::setw(17) << v.isa << std::right << v.precision
                << (v.keep_fp32.empty() ? "" : " (" + std::to_string(v.keep_fp32.size()) + " kept fp32)")
                << (v.requires_vnni ? " (needs VNNI)" : "") << ", ";
      if (v.unpacked.empty()) std::cout << v.packings << " weights packed";
      else std::cout << "weights packed at first load (" << v.unpacked << ")";
      const bool runs = lower::isa_runs_on(lower::isa_from_name(v.isa), here.isa);
      std::cout << (!runs ? "   (not on this CPU)" : i == file.variant ? "   <- runs here (" + here.name + ")" : "")
                << "\n";
    }
    std::string at;
    for (auto& [k, v] : file.packing_dims) at += (at.empty() ? " at " : ", ") + k + "=" + std::to_string(v);
    if (file.artifact->unpacked.empty())
      std::cout << "packed:  " << file.packings << " weights packed by oneDNN for " << file.artifact->isa << at
              << ", threads " << (file.artifact->threads > 0 ? std::to_string(file.artifact->threads) : "default")
              << " (used where oneDNN picks the same layout at load)\n";
    // What loading here would pack again: the variant compiled at its packing dims and thread count.
    if (!file.artifact->unpacked.empty())
      std::cout << "packed:  none stored (" << file.artifact->unpacked << "): packed at first load\n";
    if (lower::isa_runs_on(lower::isa_from_name(file.artifact->isa), here.isa)) {
      Graph at_dims = g.clone();
      std::map<std::string, std::int64_t> dims = file.packing_dims;
      for (const std::string& sym : symbolic_dims(at_dims)) dims.emplace(sym, 1);
      bind_dims(at_dims, dims);
      lower::CompileOptions options;
      options.threads = file.artifact->threads;
      options.passes = "none";
      options.packed_weights = file.packed;
      options.precision = lower::artifact_precision(*file.artifact);
      options.keep_fp32 = file.artifact->keep_fp32;
      lower::apply_tuned(file.artifact->tuned, options);
      try {
        lower::compile(std::move(at_dims), options);
        std::cout << "load:    " << file.packed->preloaded_hits() << " weight requests answered by the stored packings, "
                  << file.packed->packed_here() << " weights packed again here (" << here.name << ")\n";
        print_repacks(*file.packed);
      } catch (const Error& e) {
        std::cout << "load:    not compiled here: " << e.what() << "\n";
      }
    }
  }
  if (pm.size()) std::cout << "passes:  " << pm.pipeline() << " (" << imported.num_nodes() << " -> " << g.num_nodes() << " nodes)\n";
  for (Value* v : g.inputs()) std::cout << "input:   " << v->name() << "  " << Graph::value_type_str(v) << "\n";
  for (Value* v : g.outputs()) std::cout << "output:  " << v->name() << "  " << Graph::value_type_str(v) << "\n";
  std::cout << "params:  " << stats.parameters << " (" << human(static_cast<double>(stats.parameter_bytes), "B") << ")\n";
  std::string at;
  for (auto& [k, v] : bindings) at += (at.empty() ? "" : ", ") + k + "=" + std::to_string(v);
  std::cout << "FLOPs:   "
            << (stats.flops ? human(*stats.flops, "FLOP")
                            : flops_need.empty() ? std::string("unknown (dynamic shapes)") : "not counted: " + flops_need)
            << (at.empty() ? "" : " at " + at);
  if (!defaulted.empty()) {
    std::string names;
    for (auto& d : defaulted) names += (names.empty() ? "" : ", ") + d;
    std::cout << " (" << names << " not given with --dim: counted as 1)";
  }
  std::cout << "\n";
  if (data_dependent.empty()) {
    std::cout << "shapes:  " << (symbolic_dims(g).empty() ? "static" : "every shape follows from the input dims") << "\n";
  } else {
    std::cout << "shapes:  data-dependent at " << data_dependent.size() << " node(s):";
    for (std::size_t i = 0; i < std::min<std::size_t>(data_dependent.size(), 5); ++i)
      std::cout << " '" << data_dependent[i]->name() << "' (" << data_dependent[i]->op_key() << ")";
    std::cout << (data_dependent.size() > 5 ? " ..." : "") << "\n";
  }
  std::cout << "ops:\n";
  auto op_counts = op_key_histogram(g);
  std::vector<std::pair<std::string, std::size_t>> hist(op_counts.begin(), op_counts.end());
  std::stable_sort(hist.begin(), hist.end(), [](auto& a, auto& b) { return a.second > b.second; });
  for (auto& [op, n] : hist) {
    double f = stats.flops_by_op.count(op) ? stats.flops_by_op[op] : 0.0;
    std::cout << "  " << std::left << std::setw(24) << op << std::right << std::setw(6) << n;
    if (stats.flops && *stats.flops > 0) std::cout << std::setw(8) << std::fixed << std::setprecision(1) << 100.0 * f / *stats.flops << "% FLOPs";
    std::cout << (bad.count(op) ? "   UNSUPPORTED" : "") << "\n";
  }
  if (!inner.empty()) {
    std::cout << "ops in subgraphs:\n";
    std::vector<std::pair<std::string, std::size_t>> in_hist(inner.begin(), inner.end());
    std::stable_sort(in_hist.begin(), in_hist.end(), [](auto& a, auto& b) { return a.second > b.second; });
    for (auto& [op, n] : in_hist)
      std::cout << "  " << std::left << std::setw(24) << op << std::right << std::setw(6) << n << "   (in a subgraph)"
                << (bad.count(op) ? "   UNSUPPORTED" : "") << "\n";
  }
  if (bad.empty()) {
    std::cout << "unsupported ops: none\n";
  } else {
    std::cout << "unsupported ops (" << bad.size() << "):\n";
    for (auto& [op, names] : bad) {
      std::cout << "  " << op << ": " << names.size() << " node(s):";
      for (std::size_t i = 0; i < std::min<std::size_t>(names.size(), 5); ++i) std::cout << " " << names[i];
      std::cout << (names.size() > 5 ? " ..." : "") << "\n";
    }
  }
  if (print_graph) std::cout << "\n" << g.to_text();
  if (compiled) {
    if (!bad.empty()) throw Error("cannot compile: the model has unsupported ops (listed above)").in_file(path);
    Graph imported_bound = imported.clone();
    bind_dims(imported_bound, bindings);
    print_compiled(imported_bound, threads, compile_pipeline);
  }
  return 0;
}

}  // namespace ondine::cli
