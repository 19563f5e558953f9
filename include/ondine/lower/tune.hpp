// SPDX-License-Identifier: Apache-2.0
// ondine/lower/tune.hpp - the tuner: which of the compiler's alternatives is fastest for this model on this
// CPU, measured rather than assumed. The lowering's built-in choices (Winograd where enough tiles and
// channels, blocked conv layouts, Linear layers as 1x1 convolutions on AVX2, bf16 where native) were each
// measured on a few CPUs; the tuner times them on the one the model runs on.
//
//   lower::TuneResult t = lower::tune(graph, options);   // options.precision Auto: fp32 and bf16 are candidates
//   CompiledModel m = lower::compile(graph, t.options);  // what tune() found fastest
//   t.text()                                              // each knob: the value kept, the timings, why
//
// How: coordinate descent over the knobs that apply to the model (threads: the plan on all of them or fewer,
// conv_layout, conv_algorithm, matmul_kernel, precision fp32/bf16, int8 weights 7-bit/exact without VNNI),
// in that order, starting from the built-in heuristics. Each alternative is compiled and timed against the
// best so far, interleaved on the same seeded inputs (median of `runs`); it is kept only when faster by `min_gain`
// and, for bf16, when its outputs are within `max_error` of the float32 compile's (max |a - b| / max |b|
// per output). A knob the caller set (not Auto) is the caller's: it is not tuned, and neither is the
// precision unless it is Auto. The budget bounds the whole search; knobs not reached keep the heuristic.
// Then per step, where the model-wide value is not the best for every node: each 3x3 convolution's algorithm
// (a plan with Winograd wherever it applies and one with none, profiled node by node) and, in a tuned bf16
// plan, which layers stay float32; the mixed plan is kept when it beats the best by min_gain. Per-step
// decisions read "conv_algorithm@NODE=winograd", "precision@NODE=fp32" (NODE percent-encoded).
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
#include <memory>
#include <optional>
#include <random>
#include <set>
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
#include "ondine/lower/packed_weights.hpp"
#include "ondine/lower/tune_cache.hpp"

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
  // Keep the packed weights of the plan kept (TuneResult::packed), for an artifact (lower::save_artifact).
  bool keep_packings = false;
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
  // TuneOptions::keep_packings: the weights the kept plan's compile packed (null when from the cache: no
  // plan was compiled).
  std::shared_ptr<PackedWeights> packed;

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

// The cache key: the model, the CPU, its ISA, the thread count, and the settings the caller fixed (decisions
// made with the precision free do not hold for a caller's --precision fp32, and the other way round).
inline std::string cache_key(const Graph& g, int threads, const std::vector<TuneDecision>& fixed = {}) {
  std::string key = "model=" + fingerprint(g) + ";cpu=" + cpu_brand() + ";isa=" + effective_isa().name +
                    ";threads=" + std::to_string(threads > 0 ? threads : omp_get_max_threads());
  for (const TuneDecision& d : fixed) key += ";" + d.knob + "=" + d.value;
  return key;
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
  // First the thread split, which changes every other timing: all of `threads`, or 1 (and half of them from
  // 4): a small model spends more waking threads for each step than they save. A value names the count it
  // was measured at ("1/2": one of two), which is the only count it applies to (lower::apply_tuned).
  const int threads = base.threads > 0 ? base.threads : omp_get_max_threads();
  auto split = [threads](int n) { return std::to_string(n) + "/" + std::to_string(threads); };
  if (threads >= 2 && base.plan_threads <= 0) {
    Knob k{"threads",
           {{"all", [](CompileOptions& o) { o.plan_threads = 0; }}},
           [split](const CompileOptions& o) { return o.plan_threads > 0 ? split(o.plan_threads) : std::string("all"); }};
    for (int n : threads >= 4 ? std::vector<int>{threads / 2, 1} : std::vector<int>{1})
      k.values.push_back({split(n), [n](CompileOptions& o) { o.plan_threads = n; }});
    knobs.push_back(std::move(k));
  } else if (threads >= 2) {
    fixed.push_back({"threads", split(base.plan_threads), "set by the caller"});
  }
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
                       [](const CompileOptions& o) {
                         return std::string(o.int8_7bit_weights.value_or(int8_7bit_weights_by_default()) ? "7bit" : "exact");
                       }});
    else
      fixed.push_back({"int8_weights", base.int8_7bit_weights.value_or(true) ? "7bit" : "exact", "set by the caller"});
  }
  return knobs;
}

// Records in r.options which knobs the tuner decided (CompileOptions::choice_origins, for the per-step report): a
// value of its own "tuned", "auto" (the heuristic measured best) "heuristic, kept by the tuner".
inline void mark_tuned(TuneResult& r) {
  for (const TuneDecision& d : r.decisions)
    if (d.why != "set by the caller" && d.knob.find('@') == std::string::npos)
      r.options.choice_origins[d.knob] = d.value == "auto" ? "heuristic, kept by the tuner" : "tuned";
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
    const std::string knob = item.substr(0, eq), value = item.substr(eq + 1);
    if (knob.find('@') != std::string::npos) {  // a per-step decision
      if (!apply_node_decision(knob, value, o)) return false;
      out.push_back({knob, value, "cached"});
      continue;
    }
    want[knob] = value;
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

// Seconds per node in a run of a and of b, the least over `runs` profiled runs, interleaved: each step's time
// goes to the node whose name it carries (a node's own steps, and "NAME:suffix" steps Ondine adds after it, such
// as an in-place PRelu); reorders and other unnamed steps go nowhere.
inline std::pair<std::map<std::string, double>, std::map<std::string, double>> node_times(
    const Graph& g, const CompiledModel& a, const CompiledModel& b, const std::map<std::string, Tensor>& inputs,
    int runs) {
  std::set<std::string> names;
  for (const Node* n : g.nodes()) names.insert(n->name());
  ExecContext ca = a.make_context(), cb = b.make_context();
  a.run(ca, inputs);
  b.run(cb, inputs);
  ca.profile = cb.profile = true;
  auto least = [&](const CompiledModel& m, ExecContext& c, std::map<std::string, double>& best) {
    c.reset_profile();
    m.run(c, inputs);
    std::map<std::string, double> t;
    const std::vector<StepInfo> steps = m.steps();
    for (std::size_t i = 0; i < steps.size() && i < c.step_seconds().size(); ++i) {
      std::string name = steps[i].name;
      if (!names.count(name) && name.find(':') != std::string::npos) name = name.substr(0, name.rfind(':'));
      if (names.count(name)) t[name] += c.step_seconds()[i];
    }
    for (const auto& [name, s] : t) best[name] = best.count(name) ? std::min(best[name], s) : s;
  };
  std::map<std::string, double> ta, tb;
  for (int i = 0; i < runs; ++i) {
    least(a, ca, ta);
    least(b, cb, tb);
  }
  return {ta, tb};
}

// The nodes whose steps report `word` as their choice ("winograd (", "bf16 ("), by name.
inline std::set<std::string> nodes_choosing(const CompiledModel& m, const std::string& word) {
  std::set<std::string> out;
  for (const StepInfo& s : m.steps())
    if (s.choice.find(word) != std::string::npos) out.insert(s.name);
  return out;
}

}  // namespace detail::tune

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
  r.key = cache_key(graph, options.threads, fixed);
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
      mark_tuned(r);
      say("tune: " + r.decisions_str() + " from the cache (" + path + ")");
      return r;
    }
  }

  const std::map<std::string, Tensor> inputs = seeded_inputs(graph, topts.inputs);
  std::size_t step = 0, total = 0;
  for (const Knob& k : knobs) total += k.values.size() - 1;
  // A compile that may become the kept plan: with packings of its own when the caller keeps them.
  auto compile_candidate = [&](CompileOptions o, std::shared_ptr<PackedWeights>& packed) {
    if (topts.keep_packings && !o.packed_weights) o.packed_weights = std::make_shared<PackedWeights>();
    packed = o.packed_weights;
    return compile(graph, o);
  };
  say("tune: compiling the heuristics' plan");
  CompiledModel best = compile_candidate(r.options, r.packed);
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
      std::shared_ptr<PackedWeights> packed;
      try {
        m.emplace(compile_candidate(candidate, packed));
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
        r.packed = packed;
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
  // Per step: which 3x3 convolutions run Winograd, and (a tuned bf16 plan) which layers stay float32. Two plans
  // that differ only there are profiled; each node takes its faster form (by min_gain), and the mixed plan is
  // kept when it beats the best so far by min_gain (bf16: within max_error of the float32 outputs).
  auto per_step = [&](const std::string& knob, const std::string& word, const CompileOptions& one,
                      const CompileOptions& other, const std::string& one_value, const std::string& other_value) {
    if (elapsed() > topts.budget_seconds) return;
    say("tune: " + knob + " per step");
    std::optional<CompiledModel> a, b;
    try {
      a.emplace(compile(graph, one));
      b.emplace(compile(graph, other));
    } catch (const Error&) {
      return;
    }
    std::set<std::string> candidates = nodes_choosing(*a, word);
    for (const std::string& name : nodes_choosing(*b, word)) candidates.insert(name);
    std::map<std::string, int> uses;  // a decision names its node: names the graph repeats are left alone
    for (const Node* n : graph.nodes()) ++uses[n->name()];
    for (auto it = candidates.begin(); it != candidates.end();) it = uses[*it] == 1 ? std::next(it) : candidates.erase(it);
    if (candidates.size() < 2) return;  // one node: the model-wide knob already decided it
    const auto [ta, tb] = node_times(graph, *a, *b, inputs, std::max(5, topts.runs));
    CompileOptions mixed = r.options;
    std::vector<TuneDecision> chosen;
    std::size_t to_one = 0;
    for (const std::string& name : candidates) {
      const double x = ta.count(name) ? ta.at(name) : 0, y = tb.count(name) ? tb.at(name) : 0;
      const bool first = x < y * (1.0 - topts.min_gain);
      to_one += first;
      const std::string value = first ? one_value : other_value;
      if (knob == "precision" && value != "fp32") continue;  // a layer that stays bf16: nothing to store
      char why[120];
      std::snprintf(why, sizeof why, "per step: %.3g ms as %s, %.3g ms as %s", x * 1e3, one_value.c_str(), y * 1e3,
                    other_value.c_str());
      const std::string key = knob + "@" + encode_name(name);
      apply_node_decision(key, value, mixed);
      chosen.push_back({key, value, why});
    }
    if (chosen.empty() || to_one == 0 || to_one == candidates.size()) return;  // the model-wide setting suffices
    std::optional<CompiledModel> m;
    std::shared_ptr<PackedWeights> packed;
    try {
      m.emplace(compile_candidate(mixed, packed));
    } catch (const Error&) {
      return;
    }
    if (mixed.precision == Precision::Bf16 && !fp32_outputs.empty() &&
        relative_error(m->run(inputs), fp32_outputs) > topts.max_error)
      return;
    const auto [cur_ms, alt_ms] = time_pair(best, *m, inputs, topts.runs);
    char line[160];
    std::snprintf(line, sizeof line, "%s per step: %.3g ms against %.3g ms", knob.c_str(), alt_ms, cur_ms);
    say("tune: " + std::string(line) + (alt_ms < cur_ms * (1.0 - topts.min_gain) ? ", kept" : ", not kept"));
    if (alt_ms >= cur_ms * (1.0 - topts.min_gain)) return;
    r.options = mixed;
    best = std::move(*m);
    r.packed = packed;
    best_ms = alt_ms;
    r.decisions.insert(r.decisions.end(), chosen.begin(), chosen.end());
  };
  auto tuned = [&](const char* name) {
    return std::any_of(knobs.begin(), knobs.end(), [&](const Knob& k) { return k.name == name; });
  };
  if (tuned("conv_algorithm") && r.options.precision == Precision::Fp32) {
    CompileOptions w = r.options, d = r.options;
    w.conv_algorithm = ConvAlgorithm::Winograd;
    d.conv_algorithm = ConvAlgorithm::Direct;
    per_step("conv_algorithm", "winograd (", w, d, "winograd", "direct");
  }
  if (tuned("precision") && r.options.precision == Precision::Bf16 && !fp32_outputs.empty()) {
    CompileOptions f = r.options;
    f.precision = Precision::Fp32;
    per_step("precision", "bf16 (", f, r.options, "fp32", "bf16");
  }

  r.decisions.insert(r.decisions.end(), fixed.begin(), fixed.end());
  mark_tuned(r);
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
