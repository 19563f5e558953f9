// ondine/lower/tune.hpp - the tuner: which of the compiler's alternatives is fastest for this model on this
// CPU, measured rather than assumed. The lowering's built-in choices (Winograd where enough tiles and
// channels, blocked conv layouts, Linear layers as 1x1 convolutions on AVX2, bf16 where native) were each
// measured on a few CPUs; the tuner times them on the one the model runs on.
//
//   lower::TuneResult t = lower::tune(graph, options);   // options.precision Auto: fp32 and bf16 are candidates
//   CompiledModel m = lower::compile(graph, t.options);  // what tune() found fastest (t.model is that compile)
//   t.text()                                              // each knob: the value kept, the timings, why
//
// How: coordinate descent over the knobs that apply to the model (conv_layout, conv_algorithm,
// matmul_kernel, precision fp32/bf16, int8 weights 7-bit/exact without VNNI), in that order, starting
// from the built-in heuristics. Each alternative is compiled and timed against the best so far,
// interleaved on the same seeded inputs (median of `runs`); it is kept only when faster by `min_gain`
// and, for bf16, when its outputs are within `max_error` of the float32 compile's (max |a - b| / max |b|
// per output). A knob the caller set (not Auto) is the caller's: it is not tuned, and neither is the
// precision unless it is Auto. The budget bounds the whole search; knobs not reached keep the heuristic.
//
// Decisions are kept in a small per-machine cache file (tune_cache_path(): ONDINE_TUNE_CACHE, else
// $XDG_CACHE_HOME/ondine/tune.txt, else ~/.cache/ondine/tune.txt), keyed by the model's fingerprint (ops,
// names, input shapes, constants' bytes), the CPU's brand string, the ISA and the thread count, so the
// second tune of a model on a machine compiles once and times nothing. An entry for another CPU, ISA or
// thread count never matches; a cache file that does not parse is ignored with a warning naming it, and
// rewritten when the tune ends.
#pragma once

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "ondine/error.hpp"
#include "ondine/ir/graph.hpp"
#include "ondine/lower/compiler.hpp"
#include "ondine/lower/isa.hpp"

namespace ondine::lower {

struct TuneOptions {
  double budget_seconds = 60;  // the whole search; knobs not reached keep the heuristic
  int runs = 5;                // timed runs per comparison, interleaved (median)
  double min_gain = 0.03;      // an alternative must be this much faster to replace the best so far
  double max_error = 0.01;     // bf16: max |bf16 - fp32| / max |fp32| per output
  bool tune_int8_weights = true;  // without VNNI: 7-bit requantized vs exact 8-bit weights (a caller's flag: false)
  // The cache file: "" for tune_cache_path(), "none" for none.
  std::string cache_path;
  // Inputs to time on (each graph input by name); missing ones are seeded random values.
  std::map<std::string, Tensor> inputs;
  // Long work shows progress: "conv_algorithm: winograd 12.1 ms against direct 13.0 ms", "cache hit", ...
  std::function<void(const std::string&)> progress;
  // Warnings (a cache file ignored): stderr when null.
  std::function<void(const std::string&)> warn;
};

struct TuneDecision {
  std::string knob, value;   // "conv_algorithm", "winograd"
  std::string why;           // "tuned: 12.1 ms against 13.0 ms for direct", "set by the caller", "cached", ...
};

struct TuneResult {
  CompileOptions options;               // the caller's options with the tuned knobs set
  std::vector<TuneDecision> decisions;  // one per knob that applies to the model
  std::string key;                      // the cache key
  bool from_cache = false;
  double seconds = 0;  // the search's time
  double best_ms = 0;  // the kept plan's median time (0 when from the cache)

  // "conv_layout=blocked,conv_algorithm=winograd": what the cache and artifacts store.
  std::string decisions_str() const {
    std::string s;
    for (const TuneDecision& d : decisions) s += (s.empty() ? "" : ",") + d.knob + "=" + d.value;
    return s;
  }
  std::string text() const {
    std::ostringstream os;
    os << "tuned" << (from_cache ? " (from the cache)" : "") << ":";
    if (decisions.empty()) os << " nothing to tune in this model";
    os << "\n";
    for (const TuneDecision& d : decisions) os << "  " << d.knob << " = " << d.value << "  (" << d.why << ")\n";
    return os.str();
  }
};

namespace detail::tune {

// The CPU's brand string (CPUID 0x80000002-4), e.g. "AMD EPYC 9R14 96-Core Processor"; the vendor elsewhere.
inline std::string cpu_brand() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned regs[12] = {};
  unsigned max = __get_cpuid_max(0x80000000u, nullptr);
  if (max >= 0x80000004u) {
    for (unsigned i = 0; i < 3; ++i) __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    char s[49] = {};
    std::memcpy(s, regs, 48);
    std::string b(s);
    b.erase(0, b.find_first_not_of(' '));
    while (!b.empty() && b.back() == ' ') b.pop_back();
    if (!b.empty()) return b;
  }
#endif
  return cpu_vendor();
}

inline std::uint64_t fnv(std::uint64_t h, const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}
inline std::uint64_t fnv(std::uint64_t h, const std::string& s) { return fnv(h, s.data(), s.size() + 1); }

// The model's fingerprint: its ops, node names, inputs with their shapes, and its constants' bytes.
inline std::string fingerprint(const Graph& g) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const Value* in : g.inputs()) h = fnv(fnv(h, in->name()), Graph::value_type_str(in));
  for (const Node* n : g.topo_order()) {
    h = fnv(fnv(h, n->op_key()), n->name());
    for (const Value* v : n->inputs())
      if (v && v->is_constant()) h = fnv(h, v->constant().raw(), v->constant().nbytes());
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

inline std::string cache_key(const Graph& g, int threads) {
  return "model=" + fingerprint(g) + ";cpu=" + cpu_brand() + ";isa=" + effective_isa().name +
         ";threads=" + std::to_string(threads > 0 ? threads : omp_get_max_threads());
}

constexpr const char* kCacheHeader = "ondine-tune 1";

// The cache file's entries, key -> decisions; empty (and a warning) when it does not parse.
inline std::map<std::string, std::string> read_cache(const std::string& path, const std::function<void(const std::string&)>& warn) {
  std::map<std::string, std::string> entries;
  std::ifstream in(path);
  if (!in) return entries;
  std::string line;
  if (!std::getline(in, line) || line != kCacheHeader) {
    warn("tune cache '" + path + "' is not an Ondine tune cache (first line '" + line.substr(0, 40) +
         "', expected '" + kCacheHeader + "'): ignored, and rewritten when this tune ends");
    return entries;
  }
  std::size_t number = 1;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    const std::size_t tab = line.find('\t');
    if (tab == std::string::npos || line.compare(0, 6, "model=") != 0) {
      warn("tune cache '" + path + "' line " + std::to_string(number) + " does not parse: the file is ignored, and "
           "rewritten when this tune ends");
      return {};
    }
    entries[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return entries;
}

inline void write_cache(const std::string& path, const std::map<std::string, std::string>& entries,
                        const std::function<void(const std::string&)>& warn) {
  const std::size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    for (std::size_t i = 1; i <= dir.size(); ++i)  // mkdir -p, one level at a time
      if (i == dir.size() || dir[i] == '/') (void)::mkdir(dir.substr(0, i).c_str(), 0755);
  }
  const std::string tmp = path + ".tmp" + std::to_string(static_cast<long long>(::getpid()));
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kCacheHeader << "\n";
    for (const auto& [k, v] : entries) out << k << "\t" << v << "\n";
    if (!out) {
      warn("tune cache '" + path + "' could not be written: the decisions are not kept");
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    warn("tune cache '" + path + "' could not be replaced: the decisions are not kept");
    std::remove(tmp.c_str());
  }
}

// Seeded inputs for the graph's (static) inputs: floats uniform in [-1, 1], integers and booleans 0 (a
// valid index for any Gather, an empty mask).
inline std::map<std::string, Tensor> seeded_inputs(const Graph& g, std::map<std::string, Tensor> given) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const Value* in : g.inputs()) {
    if (given.count(in->name())) continue;
    if (!in->shape().is_static())
      throw Error("tune: input '" + in->name() + "' has shape " + in->shape().str() +
                  "; bind its symbolic dims (the shapes being compiled) before tuning");
    Tensor t(in->dtype(), in->shape().sizes());
    if (in->dtype() == DType::Float32)  // (a new tensor is zeros)
      for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
    given[in->name()] = std::move(t);
  }
  return given;
}

inline double run_ms(const CompiledModel& m, ExecContext& c, const std::map<std::string, Tensor>& inputs) {
  const auto t0 = std::chrono::steady_clock::now();
  m.run(c, inputs);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Median ms of a and b, runs interleaved after a warm-up each: at least `runs` each, more for a fast
// model (about 0.3 s of each, at most 50), so that a few-millisecond model is not judged on noise.
inline std::pair<double, double> time_pair(const CompiledModel& a, const CompiledModel& b,
                                           const std::map<std::string, Tensor>& inputs, int runs) {
  ExecContext ca = a.make_context(), cb = b.make_context();
  a.run(ca, inputs);
  b.run(cb, inputs);
  const double once = run_ms(a, ca, inputs);
  runs = std::max(runs, std::min(50, static_cast<int>(300.0 / std::max(once, 1e-3))));
  std::vector<double> ta, tb;
  for (int i = 0; i < std::max(1, runs); ++i) {
    ta.push_back(run_ms(a, ca, inputs));
    tb.push_back(run_ms(b, cb, inputs));
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

// max |a - b| / max |b| over the outputs (worst output).
inline double relative_error(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  double worst = 0;
  for (const auto& [name, tb] : b) {
    auto it = a.find(name);
    if (it == a.end() || tb.dtype() != DType::Float32 || it->second.numel() != tb.numel()) continue;
    double diff = 0, top = 0;
    for (std::int64_t i = 0; i < tb.numel(); ++i) {
      diff = std::max(diff, static_cast<double>(std::abs(it->second.data<float>()[i] - tb.data<float>()[i])));
      top = std::max(top, static_cast<double>(std::abs(tb.data<float>()[i])));
    }
    worst = std::max(worst, top > 0 ? diff / top : diff);
  }
  return worst;
}

// One knob: its name, its alternatives as they set the options, and the value a CompileOptions holds.
struct Knob {
  std::string name;
  std::vector<std::pair<std::string, std::function<void(CompileOptions&)>>> values;
  std::function<std::string(const CompileOptions&)> current;
};

inline bool has_op(const Graph& g, std::initializer_list<const char*> ops) {
  for (const Node* n : g.nodes())
    for (const char* op : ops)
      if (n->op_type() == op) return true;
  return false;
}
inline bool has_3x3_conv(const Graph& g) {
  for (const Node* n : g.nodes())
    if (n->op_type() == "Conv" && n->input(1) && n->input(1)->shape().rank_known() && n->input(1)->shape().rank() == 4) {
      const Shape& s = n->input(1)->shape();
      if (s[2].is_static() && s[3].is_static() && s[2].value == 3 && s[3].value == 3) return true;
    }
  return false;
}
inline bool has_constant_matmul(const Graph& g) {
  for (const Node* n : g.nodes())
    if ((n->op_type() == "MatMul" || n->op_type() == "Gemm") && n->input(1) && n->input(1)->is_constant()) return true;
  return false;
}

// The knobs that apply to `g` and that the caller left to the compiler, in the order they are tried.
inline std::vector<Knob> knobs_for(const Graph& g, const CompileOptions& base, const TuneOptions& t,
                                   std::vector<TuneDecision>& fixed) {
  std::vector<Knob> knobs;
  const bool convs = has_op(g, {"Conv", "ConvTranspose"});
  if (convs) {
    if (base.conv_layout == ConvLayout::Auto)
      knobs.push_back({"conv_layout",  // auto is blocked (ConvLayout)
                       {{"auto", [](CompileOptions& o) { o.conv_layout = ConvLayout::Auto; }},
                        {"any", [](CompileOptions& o) { o.conv_layout = ConvLayout::Any; }}},
                       [](const CompileOptions& o) { return std::string(conv_layout_name(o.conv_layout)); }});
    else
      fixed.push_back({"conv_layout", conv_layout_name(base.conv_layout), "set by the caller"});
  }
  if (has_3x3_conv(g)) {
    if (base.conv_algorithm == ConvAlgorithm::Auto)
      knobs.push_back({"conv_algorithm",
                       {{"auto", [](CompileOptions& o) { o.conv_algorithm = ConvAlgorithm::Auto; }},
                        {"direct", [](CompileOptions& o) { o.conv_algorithm = ConvAlgorithm::Direct; }},
                        {"winograd", [](CompileOptions& o) { o.conv_algorithm = ConvAlgorithm::Winograd; }}},
                       [](const CompileOptions& o) { return std::string(conv_algorithm_name(o.conv_algorithm)); }});
    else
      fixed.push_back({"conv_algorithm", conv_algorithm_name(base.conv_algorithm), "set by the caller"});
  }
  if (has_constant_matmul(g)) {
    if (base.matmul_kernel == MatMulKernel::Auto)
      knobs.push_back({"matmul_kernel",
                       {{"auto", [](CompileOptions& o) { o.matmul_kernel = MatMulKernel::Auto; }},
                        {"gemm", [](CompileOptions& o) { o.matmul_kernel = MatMulKernel::Gemm; }},
                        {"conv1x1", [](CompileOptions& o) { o.matmul_kernel = MatMulKernel::Conv1x1; }}},
                       [](const CompileOptions& o) { return std::string(matmul_kernel_name(o.matmul_kernel)); }});
    else
      fixed.push_back({"matmul_kernel", matmul_kernel_name(base.matmul_kernel), "set by the caller"});
  }
  if (base.precision == Precision::Auto && effective_isa().bf16_native && (convs || has_constant_matmul(g)))
    knobs.push_back({"precision",
                     {{"fp32", [](CompileOptions& o) { o.precision = Precision::Fp32; }},
                      {"bf16", [](CompileOptions& o) { o.precision = Precision::Bf16; }}},
                     [](const CompileOptions& o) { return std::string(precision_name(o.precision)); }});
  else if (base.precision != Precision::Auto)
    fixed.push_back({"precision", precision_name(base.precision), "set by the caller"});
  if (!effective_isa().int8_vnni && has_op(g, {"DequantizeLinear", "QLinearConv", "QLinearMatMul"})) {
    if (t.tune_int8_weights)
      knobs.push_back({"int8_weights",
                       {{"7bit", [](CompileOptions& o) { o.int8_7bit_weights = true; }},
                        {"exact", [](CompileOptions& o) { o.int8_7bit_weights = false; }}},
                       [](const CompileOptions& o) { return std::string(o.int8_7bit_weights ? "7bit" : "exact"); }});
    else
      fixed.push_back({"int8_weights", base.int8_7bit_weights ? "7bit" : "exact", "set by the caller"});
  }
  return knobs;
}

// Sets `o`'s knobs from a decisions string ("conv_layout=any,precision=bf16"); false when one does not parse.
inline bool apply(const std::string& decisions, const std::vector<Knob>& knobs, CompileOptions& o,
                  std::vector<TuneDecision>& out) {
  std::istringstream in(decisions);
  std::string item;
  std::map<std::string, std::string> want;
  while (std::getline(in, item, ',')) {
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) return false;
    want[item.substr(0, eq)] = item.substr(eq + 1);
  }
  for (const Knob& k : knobs) {
    auto it = want.find(k.name);
    if (it == want.end()) return false;
    auto v = std::find_if(k.values.begin(), k.values.end(), [&](const auto& p) { return p.first == it->second; });
    if (v == k.values.end()) return false;
    v->second(o);
    out.push_back({k.name, v->first, "cached"});
  }
  return true;
}

}  // namespace detail::tune

// Where the tune cache lives: ONDINE_TUNE_CACHE, else $XDG_CACHE_HOME/ondine/tune.txt, else
// $HOME/.cache/ondine/tune.txt ("" when none of them is set).
inline std::string tune_cache_path() {
  if (const char* p = std::getenv("ONDINE_TUNE_CACHE")) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/ondine/tune.txt";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/ondine/tune.txt";
  return "";
}

// Tunes `graph` (static shapes: the shapes being compiled) for this CPU; see the header comment.
inline TuneResult tune(const Graph& graph, const CompileOptions& options, const TuneOptions& topts = {}) {
  using namespace detail::tune;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  auto say = [&](const std::string& s) {
    if (topts.progress) topts.progress(s);
  };
  auto warn = topts.warn ? topts.warn : [](const std::string& s) { std::fprintf(stderr, "warning: %s\n", s.c_str()); };

  TuneResult r;
  r.options = options;
  std::vector<TuneDecision> fixed;
  const std::vector<Knob> knobs = knobs_for(graph, options, topts, fixed);
  // The heuristics' starting point: Auto precision starts in fp32 (bf16 is a candidate).
  if (r.options.precision == Precision::Auto) r.options.precision = Precision::Fp32;
  r.key = cache_key(graph, options.threads);
  const std::string path = topts.cache_path.empty() ? tune_cache_path() : topts.cache_path == "none" ? "" : topts.cache_path;
  std::map<std::string, std::string> cache = path.empty() ? std::map<std::string, std::string>() : read_cache(path, warn);
  if (auto hit = cache.find(r.key); hit != cache.end()) {
    CompileOptions o = r.options;
    std::vector<TuneDecision> cached;
    if (apply(hit->second, knobs, o, cached)) {
      r.options = o;
      r.decisions = std::move(cached);
      r.decisions.insert(r.decisions.end(), fixed.begin(), fixed.end());
      r.from_cache = true;
      r.seconds = elapsed();
      say("tune: " + r.decisions_str() + " from the cache (" + path + ")");
      return r;
    }
  }

  const std::map<std::string, Tensor> inputs = seeded_inputs(graph, topts.inputs);
  std::size_t step = 0, total = 0;
  for (const Knob& k : knobs) total += k.values.size() - 1;
  say("tune: compiling the heuristics' plan");
  CompiledModel best = compile(graph, r.options);
  std::map<std::string, Tensor> fp32_outputs;  // the float32 plan's outputs: the bf16 candidates' reference
  if (r.options.precision == Precision::Fp32) fp32_outputs = best.run(inputs);
  double best_ms = 0;
  for (const Knob& k : knobs) {
    const std::string heuristic = k.current(r.options);
    TuneDecision d{k.name, heuristic, ""};
    std::string tried;  // the alternatives that lost, and why
    char buf[200];
    for (const auto& [value, set] : k.values) {
      if (value == heuristic) continue;
      ++step;
      if (elapsed() > topts.budget_seconds) {
        tried += "; the " + std::to_string(static_cast<int>(topts.budget_seconds)) + " s budget ran out before " + value;
        break;
      }
      say("tune " + std::to_string(step) + "/" + std::to_string(total) + ": " + k.name + " = " + value);
      CompileOptions candidate = r.options;
      set(candidate);
      std::optional<CompiledModel> m;
      try {
        m.emplace(compile(graph, candidate));
      } catch (const Error&) {
        tried += "; " + value + " does not compile here";
        continue;
      }
      if (candidate.precision == Precision::Bf16 && !fp32_outputs.empty()) {
        const double err = relative_error(m->run(inputs), fp32_outputs);
        if (err > topts.max_error) {
          std::snprintf(buf, sizeof buf, "; bf16 error %.2g over the bound %.2g", err, topts.max_error);
          tried += buf;
          continue;
        }
      }
      const auto [cur_ms, alt_ms] = time_pair(best, *m, inputs, topts.runs);
      best_ms = cur_ms;
      if (alt_ms < cur_ms * (1.0 - topts.min_gain)) {
        std::snprintf(buf, sizeof buf, "%.3g ms against %.3g ms for %s", alt_ms, cur_ms, k.current(r.options).c_str());
        d.value = value;
        d.why = buf;
        r.options = candidate;
        best = std::move(*m);
        best_ms = alt_ms;
      } else {
        std::snprintf(buf, sizeof buf, "; %s %.3g ms against %.3g ms", value.c_str(), alt_ms, cur_ms);
        tried += buf;
      }
    }
    d.why = d.value != heuristic ? "tuned: " + d.why + tried : "heuristic kept" + tried;
    say("tune: " + k.name + " = " + d.value + " (" + d.why + ")");
    r.decisions.push_back(d);
  }
  r.decisions.insert(r.decisions.end(), fixed.begin(), fixed.end());
  r.best_ms = best_ms;
  r.seconds = elapsed();
  if (!path.empty()) {
    std::string decided;
    for (const TuneDecision& d : r.decisions)
      if (d.why != "set by the caller") decided += (decided.empty() ? "" : ",") + d.knob + "=" + d.value;
    cache[r.key] = decided;
    write_cache(path, cache, warn);
  }
  return r;
}

}  // namespace ondine::lower
