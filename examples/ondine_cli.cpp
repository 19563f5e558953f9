// ondine - the command-line tool.
//
//   ondine inspect MODEL [--dim batch=1] [--json] [--graph] [--dot FILE]
//   ondine run MODEL [--input NAME=FILE.npy]... [--dim batch=8] [--output-dir DIR] [--seed N] [--runs N]
//
// Errors go to stderr with exit code 1 (2 for bad command lines).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ondine/ir/stats.hpp"
#include "ondine/ondine.hpp"

namespace fs = std::filesystem;
using namespace ondine;

namespace {

std::map<std::string, std::int64_t> parse_dims(const std::vector<std::string>& specs) {
  std::map<std::string, std::int64_t> out;
  for (auto& s : specs) {
    auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) throw Error("--dim expects NAME=SIZE, got '" + s + "'");
    try {
      out[s.substr(0, eq)] = std::stoll(s.substr(eq + 1));
    } catch (const std::exception&) {
      throw Error("--dim expects NAME=SIZE with an integer size, got '" + s + "'");
    }
  }
  return out;
}

std::string human(double v, const char* unit) {
  const char* prefix[] = {"", "K", "M", "G", "T"};
  int i = 0;
  while (std::abs(v) >= 1000 && i < 4) {
    v /= 1000;
    ++i;
  }
  std::ostringstream os;
  os << std::fixed << std::setprecision(i ? 2 : 0) << v << " " << prefix[i] << unit;
  return os.str();
}

// Seeded random input for a graph input with static dims: N(0,1) floats, integers in [0, 100), bools.
Tensor random_input(const Value& in, std::mt19937_64& rng) {
  if (!in.shape().is_static())
    throw Error("input '" + in.name() + "' has shape " + in.shape().str() +
                ": bind its symbolic dims with --dim NAME=SIZE or give it with --input");
  Tensor t(in.dtype(), in.shape().sizes());
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> ints(0, 99);
  dispatch_dtype(in.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = t.data<T>();
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      if constexpr (std::is_same_v<T, bool>) p[i] = ints(rng) % 2;
      else if constexpr (std::is_integral_v<T>) p[i] = static_cast<T>(ints(rng));
      else p[i] = T(static_cast<float>(normal(rng)));
    }
  });
  return t;
}

std::string summary(const Tensor& t) {
  std::ostringstream os;
  os << dtype_name(t.dtype()) << dims_str(t.dims());
  if (t.numel() == 0 || t.dtype() == DType::String) return os.str();
  double lo = INFINITY, hi = -INFINITY, sum = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    double v = t.at_double(static_cast<std::size_t>(i));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
  }
  os << std::setprecision(6) << "  min " << lo << "  max " << hi << "  mean " << sum / static_cast<double>(t.numel())
     << "  first [";
  for (std::int64_t i = 0; i < std::min<std::int64_t>(t.numel(), 5); ++i)
    os << (i ? ", " : "") << t.at_double(static_cast<std::size_t>(i));
  os << (t.numel() > 5 ? ", ...]" : "]");
  return os.str();
}

int cmd_inspect(const std::string& path, const std::vector<std::string>& dim_specs, bool json, bool print_graph,
                const std::string& dot_file) {
  Graph g = ondine::onnx::load_model(path);
  auto bindings = parse_dims(dim_specs);
  // FLOPs need static shapes: unbound symbolic dims count as 1 (one sample).
  for (auto& sym : symbolic_dims(g)) bindings.emplace(sym, 1);
  Graph bound = g.clone();
  bind_dims(bound, bindings);
  GraphStats stats = graph_stats(bound);
  auto unsupported = unsupported_nodes(g);
  std::map<std::string, std::vector<std::string>> bad;
  for (auto* n : unsupported) bad[(n->domain().empty() ? "" : n->domain() + ".") + n->op_type()].push_back(n->name());

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
    j["dims"] = bindings;
    for (Value* v : g.inputs()) j["inputs"].push_back({{"name", v->name()}, {"type", Graph::value_type_str(v)}});
    for (Value* v : g.outputs()) j["outputs"].push_back({{"name", v->name()}, {"type", Graph::value_type_str(v)}});
    j["ops"] = g.op_histogram();
    j["unsupported_ops"] = bad;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "model:   " << path << " (opset " << g.opset() << ", " << g.num_nodes() << " nodes, producer '"
            << g.producer_name << "')\n";
  for (Value* v : g.inputs()) std::cout << "input:   " << v->name() << "  " << Graph::value_type_str(v) << "\n";
  for (Value* v : g.outputs()) std::cout << "output:  " << v->name() << "  " << Graph::value_type_str(v) << "\n";
  std::cout << "params:  " << stats.parameters << " (" << human(static_cast<double>(stats.parameter_bytes), "B") << ")\n";
  std::string at;
  for (auto& [k, v] : bindings) at += (at.empty() ? "" : ", ") + k + "=" + std::to_string(v);
  std::cout << "FLOPs:   " << (stats.flops ? human(*stats.flops, "FLOP") : std::string("unknown (dynamic shapes)"))
            << (at.empty() ? "" : " at " + at) << "\n";
  std::cout << "ops:\n";
  auto op_counts = g.op_histogram();
  std::vector<std::pair<std::string, std::size_t>> hist(op_counts.begin(), op_counts.end());
  std::stable_sort(hist.begin(), hist.end(), [](auto& a, auto& b) { return a.second > b.second; });
  for (auto& [op, n] : hist) {
    double f = stats.flops_by_op.count(op) ? stats.flops_by_op[op] : 0.0;
    std::cout << "  " << std::left << std::setw(24) << op << std::right << std::setw(6) << n;
    if (stats.flops && *stats.flops > 0) std::cout << std::setw(8) << std::fixed << std::setprecision(1) << 100.0 * f / *stats.flops << "% FLOPs";
    std::cout << (bad.count(op) ? "   UNSUPPORTED" : "") << "\n";
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
  return 0;
}

int cmd_run(const std::string& path, const std::vector<std::string>& input_specs,
            const std::vector<std::string>& dim_specs, const std::string& output_dir, std::uint64_t seed, int runs) {
  Graph g = ondine::onnx::load_model(path);
  check_supported(g);  // every unsupported op at once, before anything runs
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
  std::mt19937_64 rng(seed);
  for (Value* in : g.inputs())
    if (!inputs.count(in->name())) inputs[in->name()] = random_input(*in, rng);

  ReferenceExecutor exec(g);
  std::map<std::string, Tensor> outputs;
  std::vector<double> ms;
  for (int r = 0; r < std::max(runs, 1); ++r) {
    auto t0 = std::chrono::steady_clock::now();
    try {
      outputs = exec.run(inputs);
    } catch (Error& e) {
      e.in_file(path);
      throw;
    }
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
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
  std::cout << std::fixed << std::setprecision(1) << "benchmark: engine=reference " << (at.empty() ? "" : at + " ")
            << "runs=" << ms.size() << " median=" << ms[ms.size() / 2] << " ms min=" << ms.front() << " ms\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ondine: a graph compiler for CPU inference (ONNX in, fast CPU code out)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(ondine::version));

  std::string model, output_dir, dot_file;
  std::vector<std::string> dims, input_specs;
  bool json = false, print_graph = false, reference = false;
  std::uint64_t seed = 0;
  int runs = 1;

  auto* inspect = app.add_subcommand("inspect", "ops histogram, parameters, FLOPs, inputs/outputs, unsupported ops");
  inspect->add_option("model", model, "ONNX model file")->required();
  inspect->add_option("--dim", dims, "bind a symbolic dim for the FLOP count, NAME=SIZE (default: 1)");
  inspect->add_flag("--json", json, "print as JSON");
  inspect->add_flag("--graph", print_graph, "also print the graph as text");
  inspect->add_option("--dot", dot_file, "write the graph as Graphviz DOT to this file");

  auto* run = app.add_subcommand("run", "run a model on .npy or seeded random inputs");
  run->add_option("model", model, "ONNX model file")->required();
  run->add_option("--input", input_specs, "NAME=FILE.npy (repeatable); inputs not given are random");
  run->add_option("--dim", dims, "bind a symbolic dim, NAME=SIZE (repeatable; default 1)");
  run->add_option("--output-dir", output_dir, "write each output as DIR/NAME.npy");
  run->add_option("--seed", seed, "seed of the random inputs");
  run->add_option("--runs", runs, "timed runs for the benchmark line")->check(CLI::PositiveNumber);
  run->add_flag("--reference", reference, "use the reference executor (the only engine until lowering lands)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) ? 2 : 0;
  }
  try {
    if (*inspect) return cmd_inspect(model, dims, json, print_graph, dot_file);
    if (*run) return cmd_run(model, input_specs, dims, output_dir, seed, runs);
  } catch (const std::exception& e) {
    std::cerr << "ondine: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
