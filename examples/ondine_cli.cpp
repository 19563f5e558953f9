// ondine - the command-line tool.
//
//   ondine inspect MODEL [--dim batch=1] [--json] [--graph] [--dot FILE] [--compiled]
//   ondine run MODEL [--input NAME=FILE.npy]... [--dim batch=8] [--output-dir DIR] [--seed N] [--runs N]
//              [--threads N] [--reference] [--check]
//
// Errors go to stderr with exit code 1 (2 for bad command lines).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ondine/lower/lower.hpp"
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

// Largest |a-b| over the outputs, absolute and relative to max|b|.
struct Difference {
  double max_abs = 0, max_ref = 0;
  double relative() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
};
Difference difference(const Tensor& a, const Tensor& b) {
  Difference d;
  for (std::int64_t i = 0; i < b.numel(); ++i) {
    double x = a.at_double(static_cast<std::size_t>(i)), y = b.at_double(static_cast<std::size_t>(i));
    d.max_abs = std::max(d.max_abs, std::abs(x - y));
    d.max_ref = std::max(d.max_ref, std::abs(y));
  }
  return d;
}

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

// What compile() made of the model: ISA, every step with oneDNN's implementation, the memory plan.
void print_compiled(const Graph& bound, int threads) {
  auto t0 = std::chrono::steady_clock::now();
  lower::CompileOptions opts;
  opts.threads = threads;
  CompiledModel model = lower::compile(bound, opts);
  double ms = elapsed_ms(t0);
  std::cout << "\ncompiled: isa " << model.isa() << ", " << model.steps().size() << " steps, compile "
            << std::fixed << std::setprecision(1) << ms << " ms\n";
  const auto& mem = model.memory();
  std::cout << "memory:   arena " << human(static_cast<double>(mem.arena_bytes), "B") << " (peak live "
            << human(static_cast<double>(mem.peak_bytes), "B") << ", all activations "
            << human(static_cast<double>(mem.total_bytes), "B") << ")\n";
  std::cout << "implementations:\n";
  for (auto& [impl, n] : model.implementation_histogram())
    std::cout << "  " << std::left << std::setw(40) << impl << std::right << std::setw(6) << n << "\n";
  std::cout << "steps:\n" << model.to_text();
}

int cmd_inspect(const std::string& path, const std::vector<std::string>& dim_specs, bool json, bool print_graph,
                const std::string& dot_file, bool compiled, int threads) {
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
  if (compiled) {
    if (!bad.empty()) throw Error("cannot compile: the model has unsupported ops (listed above)").in_file(path);
    print_compiled(bound, threads);
  }
  return 0;
}

int cmd_run(const std::string& path, const std::vector<std::string>& input_specs,
            const std::vector<std::string>& dim_specs, const std::string& output_dir, std::uint64_t seed, int runs,
            bool use_reference, int threads, bool check, double check_tolerance) {
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

  check_inputs(g, inputs);  // one message for a wrong name, dtype or shape, whichever engine runs

  // The engine: the oneDNN-compiled model by default, or the reference executor (the oracle).
  std::function<std::map<std::string, Tensor>()> engine;
  std::optional<ReferenceExecutor> reference_exec;
  std::optional<CompiledModel> compiled;
  std::optional<ExecContext> context;
  double compile_ms = 0;
  if (use_reference) {
    reference_exec.emplace(g);
    engine = [&] { return reference_exec->run(inputs); };
  } else {
    auto t0 = std::chrono::steady_clock::now();
    lower::CompileOptions opts;
    opts.threads = threads;
    compiled = lower::compile(g, opts);
    compile_ms = elapsed_ms(t0);
    context.emplace(compiled->make_context());
    engine = [&] { return compiled->run(*context, inputs); };
  }
  std::map<std::string, Tensor> outputs;
  std::vector<double> ms;
  for (int r = 0; r < std::max(runs, 1); ++r) {
    auto t0 = std::chrono::steady_clock::now();
    try {
      outputs = engine();
    } catch (Error& e) {
      e.in_file(path);
      throw;
    }
    ms.push_back(elapsed_ms(t0));
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
  std::cout << std::fixed << std::setprecision(1) << "benchmark: engine=" << (use_reference ? "reference" : "compiled")
            << (use_reference ? "" : " isa=" + compiled->isa()) << " " << (at.empty() ? "" : at + " ")
            << "threads=" << (threads > 0 ? std::to_string(threads) : std::string("default")) << " runs=" << ms.size()
            << " median=" << ms[ms.size() / 2] << " ms min=" << ms.front() << " ms";
  if (!use_reference) std::cout << " compile=" << compile_ms << " ms";
  std::cout << "\n";
  if (check && !use_reference) {
    // Every optimisation is checked against the oracle: same inputs through the reference executor.
    auto expected = ReferenceExecutor(g).run(inputs);
    bool ok = true;
    for (Value* o : g.outputs()) {
      Difference d = difference(outputs.at(o->name()), expected.at(o->name()));
      ok = ok && d.relative() <= check_tolerance;
      std::cout << std::scientific << std::setprecision(2) << "check: " << o->name() << " max_abs_err " << d.max_abs
                << " rel_to_max " << d.relative() << (d.relative() <= check_tolerance ? " ok" : " FAILED") << "\n";
    }
    if (!ok) throw Error("compiled outputs differ from the reference executor by more than " +
                         std::to_string(check_tolerance) + " relative").in_file(path);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ondine: a graph compiler for CPU inference (ONNX in, fast CPU code out)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(ondine::version));

  std::string model, output_dir, dot_file;
  std::vector<std::string> dims, input_specs;
  bool json = false, print_graph = false, reference = false, compiled = false, check = false;
  std::uint64_t seed = 0;
  int runs = 1, threads = 0;
  double tolerance = 1e-4;

  auto* inspect = app.add_subcommand("inspect", "ops histogram, parameters, FLOPs, inputs/outputs, unsupported ops");
  inspect->add_option("model", model, "ONNX model file")->required();
  inspect->add_option("--dim", dims, "bind a symbolic dim for the FLOP count, NAME=SIZE (default: 1)");
  inspect->add_flag("--json", json, "print as JSON");
  inspect->add_flag("--graph", print_graph, "also print the graph as text");
  inspect->add_option("--dot", dot_file, "write the graph as Graphviz DOT to this file");
  inspect->add_flag("--compiled", compiled, "compile it and show the ISA, each step's oneDNN implementation, the memory plan");
  inspect->add_option("--threads", threads, "threads for --compiled (default: OpenMP's)");

  auto* run = app.add_subcommand("run", "run a model on .npy or seeded random inputs");
  run->add_option("model", model, "ONNX model file")->required();
  run->add_option("--input", input_specs, "NAME=FILE.npy (repeatable); inputs not given are random");
  run->add_option("--dim", dims, "bind a symbolic dim, NAME=SIZE (repeatable; default 1)");
  run->add_option("--output-dir", output_dir, "write each output as DIR/NAME.npy");
  run->add_option("--seed", seed, "seed of the random inputs");
  run->add_option("--runs", runs, "timed runs for the benchmark line")->check(CLI::PositiveNumber);
  run->add_option("--threads", threads, "oneDNN threads (default: OpenMP's, i.e. OMP_NUM_THREADS or all cores)");
  run->add_flag("--reference", reference, "run on the reference executor instead of the compiled model");
  run->add_flag("--check", check, "also run the reference executor and compare (fails past --tolerance)");
  run->add_option("--tolerance", tolerance, "--check's bound on max|compiled-reference| / max|reference|");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) ? 2 : 0;
  }
  try {
    if (*inspect) return cmd_inspect(model, dims, json, print_graph, dot_file, compiled, threads);
    if (*run) return cmd_run(model, input_specs, dims, output_dir, seed, runs, reference, threads, check, tolerance);
  } catch (const std::exception& e) {
    std::cerr << "ondine: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
