// examples/cli/compare.hpp - `ondine compare A.onnx B.onnx`: how far model B's numbers are from model A's
// on the same inputs (B is typically a quantized or otherwise optimised copy of A).
//
//   ondine compare A.onnx B.onnx [--input [NAME=]FILE.npy]... [--seed N] [--dim NAME=SIZE]...
//                  [--per-layer [--top N]] [--json] [--compiled [--passes P] [--threads N]]
//
// Per output (matched by name, else by position): max abs error, cosine similarity and SQNR (dB) of B
// against A (ondine/quant/metrics.hpp), and for [N, C] outputs the share of rows whose argmax agrees.
// --per-layer: the same for every float32 value that both graphs compute with the same shape, worst
// SQNR first: a sensitivity ranking. When B is a QDQ model, the quantized form of a value X is the
// output of DequantizeLinear(QuantizeLinear(X)); that output is what is compared with A's X, so each row
// includes X's own quantization error. Graph inputs are not ranked; "only in B" leaves out B's
// DequantizeLinear outputs (dequantized weights and activations).
// Inputs: .npy files (a bare FILE goes to the next input not named), the rest seeded random N(0, 1)
// (integers in [0, 100)); symbolic dims bind from the files, --dim, else 1. Both models get the same
// tensors, so B must have A's inputs. The reference executor runs both unless --compiled (outputs only:
// the compiled model keeps no intermediates).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ondine/lower/artifact.hpp"
#include "ondine/lower/lower.hpp"
#include "ondine/ondine.hpp"
#include "ondine/quant/metrics.hpp"
#include "inputs.hpp"

namespace ondine::cli {

struct CompareArgs {
  std::string model_a, model_b;
  std::vector<std::string> inputs;  // [NAME=]FILE.npy
  std::vector<std::string> dims;    // NAME=SIZE
  std::uint64_t seed = 0;
  bool per_layer = false, json = false, compiled = false;
  std::size_t top = 0;  // per-layer rows printed (0: all)
  std::string passes = "default";
  int threads = 0;
};

namespace compare_detail {

// One compared value: A's name, the value of B it was compared with, the metrics.
struct Row {
  std::string name, b_name;
  std::vector<std::int64_t> dims;
  std::string dtype;
  quant::TensorMetrics m;
  double argmax_agreement = -1;  // [N, C] outputs only; -1: not applicable
};

// An ONNX model or a compiled artifact (whose passes already ran: compiled with the pipeline off).
inline Graph load(const std::string& path) {
  Graph g = artifact::is_artifact(path) ? lower::load_artifact(path).graph : ondine::onnx::load_model(path);
  try {
    check_supported(g);
  } catch (Error& e) {
    e.in_file(path);
    throw;
  }
  return g;
}

// --input specs -> tensors keyed by A's input names.
inline std::map<std::string, Tensor> read_inputs(const Graph& a, const std::vector<std::string>& specs,
                                                 const std::string& path) {
  std::map<std::string, Tensor> out;
  std::vector<std::string> bare;
  std::set<std::string> names;
  for (Value* in : a.inputs()) names.insert(in->name());
  for (auto& spec : specs) {
    auto eq = spec.find('=');
    if (eq != std::string::npos && eq > 0 && names.count(spec.substr(0, eq))) {
      out[spec.substr(0, eq)] = load_npy(spec.substr(eq + 1));
    } else if (eq != std::string::npos && eq > 0 && spec.size() > 4 && spec.compare(spec.size() - 4, 4, ".npy") == 0 &&
               spec.substr(0, eq).find('/') == std::string::npos) {
      std::string list;
      for (auto& n : names) list += (list.empty() ? "" : ", ") + n;
      throw Error("--input " + spec + ": the model has no input '" + spec.substr(0, eq) + "' (inputs: " + list + ")")
          .in_file(path);
    } else {
      bare.push_back(spec);
    }
  }
  for (auto& file : bare) {
    Value* next = nullptr;
    for (Value* in : a.inputs())
      if (!out.count(in->name())) {
        next = in;
        break;
      }
    if (!next) throw Error("--input " + file + ": every input of the model already has a file").in_file(path);
    out[next->name()] = load_npy(file);
  }
  return out;
}

// Binds g's symbolic dims: --dim first, then the given input tensors' sizes, the rest 1.
inline void bind_symbolic_dims(Graph& g, const std::map<std::string, std::int64_t>& requested,
                 const std::map<std::string, Tensor>& inputs) {
  auto symbols = symbolic_dims(g);
  std::map<std::string, std::int64_t> b;
  for (auto& [k, v] : requested)
    if (std::find(symbols.begin(), symbols.end(), k) != symbols.end()) b[k] = v;
  for (Value* in : g.inputs())
    if (auto it = inputs.find(in->name()); it != inputs.end() && in->shape().rank_known() &&
                                           in->shape().rank() == it->second.rank())
      for (std::size_t d = 0; d < in->shape().rank(); ++d)
        if (!in->shape()[d].is_static() && !in->shape()[d].symbol.empty())
          b.emplace(in->shape()[d].symbol, it->second.dims()[d]);
  for (auto& s : symbols) b.emplace(s, 1);
  bind_dims(g, b);
}

inline std::map<std::string, Tensor> run_model(const Graph& g, const std::map<std::string, Tensor>& inputs,
                                               const CompareArgs& args, const std::string& path) {
  try {
    if (!args.compiled) return ReferenceExecutor(g).run(inputs, /*keep_all=*/args.per_layer);
    lower::CompileOptions opts;
    opts.passes = artifact::is_artifact(path) ? std::string("none") : args.passes;
    opts.threads = args.threads;
    return lower::compile(g, opts).run(inputs);
  } catch (Error& e) {
    e.in_file(path);
    throw;
  }
}

// Metrics of any two same-shaped tensors (integers compare as doubles).
inline Row compare_values(const std::string& name, const std::string& b_name, const Tensor& a, const Tensor& b,
                          bool argmax = false) {
  if (a.dims() != b.dims())
    throw Error("'" + name + "' has shape " + dims_str(a.dims()) + " in A but " + dims_str(b.dims()) + " in B");
  Row r{name, b_name, a.dims(), std::string(dtype_name(a.dtype())), {}, -1};
  if (is_floating(a.dtype()) && is_floating(b.dtype())) {
    r.m = quant::compare(a, b);
  } else {
    r.m = quant::detail::metrics::accumulate(static_cast<std::size_t>(a.numel()), [&](std::size_t i) {
      return std::pair<double, double>(a.at_double(i), b.at_double(i));
    });
  }
  if (argmax && a.rank() == 2 && a.dims()[1] > 1 && a.dims()[0] > 0) {
    std::int64_t rows = a.dims()[0], cols = a.dims()[1], agree = 0;
    for (std::int64_t i = 0; i < rows; ++i) {
      std::int64_t ia = 0, ib = 0;
      for (std::int64_t j = 1; j < cols; ++j) {
        auto k = static_cast<std::size_t>(i * cols);
        if (a.at_double(k + j) > a.at_double(k + ia)) ia = j;
        if (b.at_double(k + j) > b.at_double(k + ib)) ib = j;
      }
      agree += ia == ib;
    }
    r.argmax_agreement = static_cast<double>(agree) / static_cast<double>(rows);
  }
  return r;
}

// B's quantized form of each float value: X -> DequantizeLinear(QuantizeLinear(X))'s output name.
inline std::map<std::string, std::string> dequantized_names(const Graph& b) {
  std::map<std::string, std::string> out;
  for (Node* dq : b.topo_order()) {
    if (dq->op_key() != "DequantizeLinear" || !dq->input(0) || !dq->output(0)) continue;
    Node* q = dq->input(0)->producer();
    if (!q || q->op_key() != "QuantizeLinear" || !q->input(0)) continue;
    out.emplace(q->input(0)->name(), dq->output(0)->name());
  }
  return out;
}

inline std::vector<Row> per_layer(const Graph& a, const Graph& b, const std::map<std::string, Tensor>& ra,
                                  const std::map<std::string, Tensor>& rb, std::size_t& only_a, std::size_t& only_b) {
  auto dq = dequantized_names(b);
  std::vector<Row> rows;
  std::set<std::string> matched_b;
  only_a = 0;
  for (Node* n : a.topo_order())
    for (Value* v : n->outputs()) {
      if (!v) continue;
      auto ia = ra.find(v->name());
      if (ia == ra.end() || ia->second.dtype() != DType::Float32) continue;
      std::string b_name = v->name();
      if (auto d = dq.find(b_name); d != dq.end() && rb.count(d->second)) b_name = d->second;
      auto ib = rb.find(b_name);
      if (ib == rb.end() || ib->second.dtype() != DType::Float32 || ib->second.dims() != ia->second.dims()) {
        ++only_a;
        continue;
      }
      matched_b.insert(v->name());
      matched_b.insert(b_name);
      rows.push_back(compare_values(v->name(), b_name, ia->second, ib->second));
    }
  // Not counted: DequantizeLinear outputs (B's dequantized activations and weights, artifacts of QDQ).
  only_b = 0;
  for (auto& [name, t] : rb) {
    Value* v = b.find_value(name);
    bool dq_output = v && v->producer() && v->producer()->op_key() == "DequantizeLinear";
    if (t.dtype() == DType::Float32 && v && !v->is_graph_input() && !matched_b.count(name) && !dq_output) ++only_b;
  }
  // Worst first; NaN (a non-finite value somewhere) before everything, ties keep graph order.
  auto key = [](const Row& r) { return std::isnan(r.m.sqnr_db) ? -std::numeric_limits<double>::infinity() : r.m.sqnr_db; };
  std::stable_sort(rows.begin(), rows.end(), [&](const Row& x, const Row& y) { return key(x) < key(y); });
  return rows;
}

inline std::string fmt_db(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << v;
  return os.str();
}

inline std::string fmt_sci(double v) {
  std::ostringstream os;
  os << std::scientific << std::setprecision(3) << v;
  return os.str();
}

inline std::string fmt_fixed(double v, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

// JSON has no inf/NaN: those go as strings.
inline nlohmann::json json_number(double v) {
  if (std::isfinite(v)) return v;
  return fmt_db(v);
}

inline nlohmann::json to_json(const Row& r) {
  nlohmann::json j{{"name", r.name},
                   {"b_name", r.b_name},
                   {"shape", r.dims},
                   {"dtype", r.dtype},
                   {"max_abs", json_number(r.m.max_abs)},
                   {"cosine", json_number(r.m.cosine)},
                   {"sqnr_db", json_number(r.m.sqnr_db)}};
  if (r.argmax_agreement >= 0) j["argmax_agreement"] = r.argmax_agreement;
  return j;
}

inline void print_rows(const std::vector<Row>& rows, bool ranked, std::size_t limit) {
  std::size_t width = 4;
  for (auto& r : rows) width = std::max(width, r.name.size());
  width = std::min<std::size_t>(width, 40);
  std::cout << "  " << (ranked ? "rank  " : "") << std::left << std::setw(static_cast<int>(width)) << "name"
            << std::right << std::setw(12) << "max_abs" << std::setw(11) << "cosine" << std::setw(10) << "SQNR dB"
            << "  shape\n";
  std::size_t shown = 0;
  for (auto& r : rows) {
    if (limit && shown == limit) break;
    ++shown;
    std::cout << "  ";
    if (ranked) std::cout << std::left << std::setw(6) << shown;
    std::cout << std::left << std::setw(static_cast<int>(width)) << r.name << std::right << std::setw(12)
              << fmt_sci(r.m.max_abs) << std::setw(11) << fmt_fixed(r.m.cosine, 6) << std::setw(10)
              << fmt_db(r.m.sqnr_db) << "  " << dims_str(r.dims);
    if (r.b_name != r.name) std::cout << "  (B: " << r.b_name << ")";
    if (r.argmax_agreement >= 0)
      std::cout << "  argmax agree " << fmt_fixed(100.0 * r.argmax_agreement, 2) << "%";
    std::cout << "\n";
  }
  if (shown < rows.size()) std::cout << "  ... " << rows.size() - shown << " more (--top 0 shows all)\n";
}

}  // namespace compare_detail

inline CLI::App* add_compare_command(CLI::App& app, CompareArgs& a) {
  auto* c = app.add_subcommand("compare",
                               "run two models on the same inputs and compare their outputs (max abs error, cosine, "
                               "SQNR); --per-layer ranks every shared value, worst first");
  c->add_option("model_a", a.model_a, "reference ONNX model (e.g. the float model)")->required();
  c->add_option("model_b", a.model_b, "ONNX model compared with it (e.g. its QDQ-quantized copy)")->required();
  c->add_option("--input,--inputs", a.inputs,
                "[NAME=]FILE.npy (repeatable; a bare FILE goes to the next input); inputs not given are random");
  c->add_option("--dim", a.dims, "bind a symbolic dim, NAME=SIZE (repeatable; default: from the files, else 1)");
  c->add_option("--seed", a.seed, "seed of the random inputs");
  auto* layers = c->add_flag("--per-layer", a.per_layer,
                             "also compare every float32 value both graphs compute (same name and shape; in a QDQ "
                             "model B a value's DequantizeLinear output), worst SQNR first");
  c->add_option("--top", a.top, "--per-layer: print only the N worst (default: all)");
  c->add_flag("--json", a.json, "print as JSON (SQNR of identical values: \"inf\")");
  auto* compiled = c->add_flag("--compiled", a.compiled, "run both compiled (oneDNN) instead of on the reference executor");
  c->add_option("--passes", a.passes, "--compiled: the pipeline compile runs (default: 'default')");
  c->add_option("--threads", a.threads, "--compiled: oneDNN threads (default: OpenMP's)");
  compiled->excludes(layers);
  return c;
}

inline int cmd_compare(const CompareArgs& args) {
  using namespace compare_detail;
  if (args.compiled) make_pass_manager(args.passes);  // a bad pipeline fails before any model is read
  Graph a = load(args.model_a), b = load(args.model_b);
  auto inputs = read_inputs(a, args.inputs, args.model_a);
  std::map<std::string, std::int64_t> dims;
  for (auto& s : args.dims) {
    auto eq = s.find('=');
    std::int64_t v = -1;
    try {
      v = eq == std::string::npos || eq == 0 ? -1 : std::stoll(s.substr(eq + 1));
    } catch (const std::exception&) {
    }
    if (v < 0) throw Error("--dim expects NAME=SIZE with a size >= 0, got '" + s + "'");
    dims[s.substr(0, eq)] = v;
  }
  for (auto& [k, v] : dims) {
    (void)v;
    auto sa = symbolic_dims(a), sb = symbolic_dims(b);
    if (std::find(sa.begin(), sa.end(), k) == sa.end() && std::find(sb.begin(), sb.end(), k) == sb.end())
      throw Error("--dim " + k + ": neither model has an input dim named '" + k + "'");
  }
  bind_symbolic_dims(a, dims, inputs);
  std::mt19937_64 rng(args.seed);
  std::map<std::string, std::string> source;
  for (Value* in : a.inputs()) {
    if (inputs.count(in->name())) {
      source[in->name()] = "file";
      continue;
    }
    inputs[in->name()] = random_input(*in, rng);
    source[in->name()] = "random";
  }
  bind_symbolic_dims(b, dims, inputs);
  try {
    check_inputs(a, inputs);
  } catch (Error& e) {
    e.in_file(args.model_a);
    throw;
  }
  try {
    check_inputs(b, inputs);
  } catch (Error& e) {
    throw Error("model B does not take model A's inputs: " + e.message()).in_file(args.model_b);
  }

  auto ra = run_model(a, inputs, args, args.model_a);
  auto rb = run_model(b, inputs, args, args.model_b);

  std::vector<Row> outputs;
  for (std::size_t i = 0; i < a.outputs().size(); ++i) {
    const std::string& name = a.outputs()[i]->name();
    std::string b_name = name;
    bool in_b = false;
    for (Value* o : b.outputs()) in_b = in_b || o->name() == name;
    if (!in_b) {
      if (a.outputs().size() != b.outputs().size())
        throw Error("model B has no output '" + name + "' and a different number of outputs (" +
                    std::to_string(b.outputs().size()) + " vs " + std::to_string(a.outputs().size()) + ")")
            .in_file(args.model_b);
      b_name = b.outputs()[i]->name();  // same count, other names: by position
    }
    outputs.push_back(compare_values(name, b_name, ra.at(name), rb.at(b_name), /*argmax=*/true));
  }
  std::vector<Row> layers;
  std::size_t only_a = 0, only_b = 0;
  if (args.per_layer) layers = per_layer(a, b, ra, rb, only_a, only_b);

  if (args.json) {
    nlohmann::json j;
    j["model_a"] = args.model_a;
    j["model_b"] = args.model_b;
    j["engine"] = args.compiled ? "compiled" : "reference";
    j["seed"] = args.seed;
    j["inputs"] = source;
    j["outputs"] = nlohmann::json::array();
    for (auto& r : outputs) j["outputs"].push_back(to_json(r));
    if (args.per_layer) {
      j["layers"] = nlohmann::json::array();
      for (auto& r : layers) j["layers"].push_back(to_json(r));
      j["only_in_a"] = only_a;
      j["only_in_b"] = only_b;
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::string in_text;
  for (auto& [name, src] : source)
    in_text += (in_text.empty() ? "" : ", ") + name + dims_str(inputs.at(name).dims()) + " " + src;
  std::cout << "A: " << args.model_a << "\nB: " << args.model_b << "\nengine: "
            << (args.compiled ? "compiled, passes " + args.passes : std::string("reference")) << "\ninputs: " << in_text
            << (std::any_of(source.begin(), source.end(), [](auto& s) { return s.second == "random"; })
                    ? " (seed " + std::to_string(args.seed) + ")"
                    : "")
            << "\noutputs:\n";
  print_rows(outputs, false, 0);
  if (args.per_layer) {
    std::cout << "per-layer, worst SQNR first (" << layers.size() << " values in both; " << only_a
              << " only in A, " << only_b << " only in B):\n";
    print_rows(layers, true, args.top);
  }
  return 0;
}

}  // namespace ondine::cli
