// SPDX-License-Identifier: Apache-2.0
// ondine/lower/int8_plan.hpp - where a compiled quantized model leaves int8, and what that is predicted to
// cost: every Q/DQ left unfused, every fp32 island with its FLOPs, bytes and estimated time, and the
// predicted time of the whole int8 plan against the same model in fp32, with a warning when int8 is
// predicted slower (`ondine inspect --compiled`, the compile log).
//
// An fp32 island is a connected run (through the data the steps pass) of float steps, float moves and
// Q/DQ conversions, that contains a float compute step or sits between int8 steps (a DQ -> Q pair that
// fuse-qdq could not fold). The Q of the graph input and the DQ of a graph output are the model's float
// interface, not islands; their cost is in the totals.
//
// The estimate is a per-step roofline for one core: time = max(FLOPs / peak, bytes / bandwidth), with
// the int8 peak for QConv/QMatMul/QPool, the fp32 peak for other oneDNN steps, a plain-loop rate for
// reference kernels and nothing for zero-copy views; bytes are the step's activations read and written
// plus its node's constant inputs. The fp32 prediction costs the same steps with 4-byte elements, the
// int8 layers at the fp32 peak (as oneDNN fp32 layers) and no Q/DQ. It ranks plans, it does not time
// them: caches, threads and per-primitive efficiency are left out. Against measurements at one thread
// (AMD EPYC, avx512_core_bf16, README "Int8 quantization"): ResNet-50 is predicted at 44.6 ms fp32 and
// 9.8 ms int8 (its QDQ model), measured 43 ms and 11.8 ms; with AMX (Intel Xeon, avx512_core_amx) 4.1 ms
// int8, measured 5.5 ms (fp32 43.0 ms).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <tuple>
#include <utility>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ondine/ir/stats.hpp"
#include "ondine/lower/detail/quantized.hpp"
#include "ondine/lower/isa.hpp"
#include "ondine/lower/tune_cache.hpp"
#include "ondine/runtime/compiled_model.hpp"

namespace ondine::lower {

// One core's rates for the roofline estimate.
struct PeakRates {
  double fp32 = 0;           // FLOP/s of oneDNN's fp32 matmul/convolution
  double int8 = 0;           // OP/s of oneDNN's u8 x s8 matmul/convolution (a multiply-add counts 2)
  double reference = 1e9;    // FLOP/s of Ondine's reference kernels (plain loops, one thread): a rough guess
  double bandwidth = 20e9;   // B/s one core streams through (between L2 and DRAM speed): a rough guess
  std::string source;        // where fp32/int8 come from, for the report
};

// Reference rates for an ISA, what measured_peak_rates falls back to. avx512 with VNNI and AMX are measured (`ondine_peak --threads 1 [--int8]`, 2048^3
// matmul; VNNI on an AMD EPYC, avx512_core_bf16; AMX on an Intel Xeon, avx512_core_amx, whose fp32 rate
// was 213 GFLOP/s); the others are scaled from VNNI: half the vector width for avx2; without VNNI a u8 x
// s8 multiply-add takes three instructions per 64 where fp32 takes one FMA per 16, so int8 is 4/3 of
// fp32 at best.
inline PeakRates peak_rates(const IsaInfo& isa) {
  PeakRates r;
  const double avx512_fp32 = 186e9, vnni_int8 = 850e9, amx_int8 = 2190e9;
  switch (isa.isa) {
    case CpuIsa::Avx512CoreVnni:
    case CpuIsa::Avx512CoreBf16:
      r.fp32 = avx512_fp32, r.int8 = vnni_int8, r.source = "measured";
      break;
    case CpuIsa::Avx512CoreAmx:
      r.fp32 = avx512_fp32, r.int8 = amx_int8, r.source = "measured";
      break;
    case CpuIsa::Avx512Core:
    case CpuIsa::Avx512Mic:
    case CpuIsa::Avx512Mic4ops:
      r.fp32 = avx512_fp32, r.int8 = avx512_fp32 * 4 / 3, r.source = "scaled: no VNNI";
      break;
    case CpuIsa::Avx2Vnni:
      r.fp32 = avx512_fp32 / 2, r.int8 = vnni_int8 / 2, r.source = "scaled: half of avx512";
      break;
    case CpuIsa::Avx2:
      r.fp32 = avx512_fp32 / 2, r.int8 = avx512_fp32 / 2 * 4 / 3, r.source = "scaled: half of avx512, no VNNI";
      break;
    default:
      r.fp32 = avx512_fp32 / 4, r.int8 = avx512_fp32 / 4, r.source = "scaled: a quarter of avx512";
      break;
  }
  return r;
}

namespace detail {

// The best of `reps` single-thread runs each of an n x n x n oneDNN matmul in fp32 and in u8 x s8 -> s32, in
// operations per second (a multiply-add counts 2), alternated so that other work on the machine slows both
// alike and their ratio holds; {0, 0} where oneDNN has no such kernels.
inline std::pair<double, double> time_matmul_peaks(dnnl::memory::dim n, int reps) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  ThreadCountScope one(1);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  struct Product {
    dnnl::matmul matmul;
    dnnl::memory a, b, c;
  };
  auto make = [&](bool int8) -> std::optional<Product> {
    const dnnl::memory::desc a({n, n}, int8 ? dt::u8 : dt::f32, tag::ab), c({n, n}, int8 ? dt::s32 : dt::f32, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, dnnl::memory::desc({n, n}, int8 ? dt::s8 : dt::f32, tag::any), c),
                                    dnnl::primitive_attr(), engine, true);
    if (!pd || std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return std::nullopt;
    Product p{dnnl::matmul(pd), dnnl::memory(a, engine), dnnl::memory(pd.weights_desc(), engine), dnnl::memory(c, engine)};
    std::memset(p.a.get_data_handle(), 1, a.get_size());
    std::memset(p.b.get_data_handle(), 1, pd.weights_desc().get_size());
    return p;
  };
  std::optional<Product> f = make(false), q = make(true);
  if (!f || !q) return {0, 0};
  auto seconds = [&](Product& p) {
    const auto t0 = std::chrono::steady_clock::now();
    p.matmul.execute(stream, {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}});
    stream.wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  seconds(*f), seconds(*q);  // warm-up
  double best_f = 1e30, best_q = 1e30;
  for (int i = 0; i < reps; ++i) best_f = std::min(best_f, seconds(*f)), best_q = std::min(best_q, seconds(*q));
  const double ops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  return {ops / best_f, ops / best_q};
}

// Whether the machine looks idle (Linux: the 1-minute load average below the online CPUs less one half): a
// measurement made while other work runs is used but not cached.
inline bool machine_idle() {
  std::ifstream in("/proc/loadavg");
  double load = 0;
  if (!(in >> load)) return true;
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  return load < static_cast<double>(cpus > 0 ? cpus : 1) - 0.5;
}

}  // namespace detail

// One core's fp32 and int8 rates on this CPU as the tune cache file at `path` has them (key
// "peak;cpu=...;isa=...", tune_cache.hpp), else measured (oneDNN matmuls of 768^3 alternated, best of 5 on one
// thread, about 0.1 s) and stored there ("" or "none": not stored) when the machine is idle or `store_under_load`.
// The constants of peak_rates() where nothing can be measured.
inline PeakRates measure_peak_rates(const std::string& path, bool store_under_load = false) {
  const IsaInfo isa = effective_isa();
  PeakRates r = peak_rates(isa);
  const std::string key = "peak;cpu=" + detail::tune::cpu_brand() + ";isa=" + isa.name;
  const bool stored = !path.empty() && path != "none";
  auto quiet = [](const std::string&) {};  // a file that does not parse is measured over and rewritten
  std::map<std::string, std::string> cache;
  if (stored) cache = detail::tune::read_cache(path, quiet);
  double fp32 = 0, int8 = 0;
  if (auto it = cache.find(key); it != cache.end())
    if (std::sscanf(it->second.c_str(), "fp32=%lf,int8=%lf", &fp32, &int8) == 2 && fp32 > 0 && int8 > 0) {
      r.fp32 = fp32 * 1e9, r.int8 = int8 * 1e9, r.source = "measured here, cached in " + path;
      return r;
    }
  const bool idle = detail::machine_idle();
  try {
    std::tie(fp32, int8) = detail::time_matmul_peaks(768, 5);
  } catch (const dnnl::error&) {
    return r;
  }
  if (fp32 <= 0 || int8 <= 0) return r;
  r.fp32 = fp32, r.int8 = int8, r.source = idle ? "measured here" : "measured here under load, not cached";
  if (stored && (idle || store_under_load)) {
    char value[64];
    std::snprintf(value, sizeof value, "fp32=%.1f,int8=%.1f", fp32 / 1e9, int8 / 1e9);
    cache[key] = value;
    detail::tune::write_cache(path, cache, quiet);
  }
  return r;
}

// The rates the int8 plan uses, once per process: ONDINE_PEAK_RATES ("fp32=186,int8=850", G(FL)OP/s of one
// core) where set, which pins them (reproducible estimates: tests, CI); else measure_peak_rates(tune_cache_path()),
// so the estimate follows the machine it runs on, not constants from the machines Ondine was developed on.
inline PeakRates measured_peak_rates() {
  static const PeakRates rates = [] {
    if (const char* pinned = std::getenv("ONDINE_PEAK_RATES")) {
      PeakRates r = peak_rates(effective_isa());
      double fp32 = 0, int8 = 0;
      if (std::sscanf(pinned, "fp32=%lf,int8=%lf", &fp32, &int8) == 2 && fp32 > 0 && int8 > 0) {
        r.fp32 = fp32 * 1e9, r.int8 = int8 * 1e9, r.source = "ONDINE_PEAK_RATES";
        return r;
      }
      std::fprintf(stderr, "warning: ONDINE_PEAK_RATES='%s' is not 'fp32=G,int8=G' (positive numbers): ignored\n", pinned);
    }
    return measure_peak_rates(tune_cache_path());
  }();
  return rates;
}

// Without VNNI, whether a QDQ layer's 8-bit weights are requantized to 7 bits so that it runs int8 (else it
// stays float, exact): where this CPU's int8 kernels are measurably faster than its fp32 ones. On Zen 2 a u8 x
// s8 multiply-add issues no faster than an FMA (int8 38, fp32 37 G(FL)OP/s per core): there ResNet-50 QDQ runs
// int8 in 110-114 ms and exact in float in 100 ms (2 threads); CPUs whose int8 rate is 4/3 of fp32 or more gain
// from int8 (docs/quantization.md, "Int8 without VNNI").
inline bool int8_7bit_weights_by_default() {
  const PeakRates r = measured_peak_rates();
  return r.int8 >= 1.15 * r.fp32;
}

// One fp32 island: its steps (indices into the compiled steps, in order) and what they cost.
struct Fp32Island {
  std::vector<std::size_t> steps;
  std::vector<std::string> float_steps;  // "Sigmoid 'name'"
  std::vector<std::string> conversions;  // "Q 'name'" / "DQ 'name'"
  double flops = 0, bytes = 0, seconds = 0;
};

struct Int8Plan {
  std::string summary;                // "int8: N int8 steps; M Q/DQ left unfused: ...; K float steps: ..."
  std::size_t int8_steps = 0;
  std::vector<Fp32Island> islands;
  double int8_seconds = 0;            // the whole plan as compiled, predicted
  double fp32_seconds = 0;            // the same model in fp32, predicted
  double island_seconds = 0;          // the islands' share of int8_seconds
  PeakRates rates;
  bool empty() const { return summary.empty(); }
  bool slower() const { return !empty() && int8_seconds > fp32_seconds; }
  std::string text() const;           // the summary, one line per island, the prediction, the warning
};

namespace detail {

// FLOPs of a step's node (Ondine's int8 ops count like the float op they replace: ir/stats.hpp).
inline double step_flops(const Node* n) { return n ? ::ondine::detail::node_flops(*n).value_or(0.0) : 0.0; }

inline std::string si(double v, const char* unit) {
  const char* prefix[] = {"", "K", "M", "G", "T"};
  int i = 0;
  while (v >= 1000 && i < 4) v /= 1000, ++i;
  char buf[48];
  std::snprintf(buf, sizeof buf, i ? "%.2f %s%s" : "%.0f %s%s", v, prefix[i], unit);
  return buf;
}
inline std::string duration(double s) {  // three significant digits: "0.487 us", "44.6 ms"
  char buf[32];
  if (s >= 1e-3) std::snprintf(buf, sizeof buf, "%.3g ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.3g us", s * 1e6);
  return buf;
}
inline std::string name_list(const std::vector<std::string>& v, std::size_t most = 6) {
  std::string out;
  for (std::size_t i = 0; i < v.size() && i < most; ++i) out += (i ? ", " : "") + v[i];
  if (v.size() > most) out += ", ... (" + std::to_string(v.size() - most) + " more)";
  return out;
}

}  // namespace detail

// The int8 plan of a compiled model; empty() when it has no int8 step and no Q/DQ.
inline Int8Plan int8_plan(const CompiledModel& model, const PeakRates& rates = measured_peak_rates()) {
  using detail::StepKind;
  Int8Plan plan;
  plan.rates = rates;
  plan.summary = detail::int8_report(model.steps());
  if (plan.summary.empty()) return plan;
  const runtime::Program& p = model.program();
  std::map<std::string, const Node*> nodes;
  if (p.graph)
    for (const Node* n : p.graph->nodes()) nodes.emplace(n->name(), n);
  auto root = [&](runtime::SlotId id) {
    return p.slots[id].kind == runtime::SlotKind::Alias ? static_cast<runtime::SlotId>(p.slots[id].index) : id;
  };
  const std::size_t count = p.steps.size();

  // Each step's kind and predicted time in both plans.
  std::vector<StepKind> kind(count);
  std::vector<double> flops(count), bytes(count), t_int8(count);
  for (std::size_t i = 0; i < count; ++i) {
    const runtime::Step& s = *p.steps[i];
    kind[i] = detail::step_kind(s.op());
    auto it = nodes.find(s.name());
    const Node* n = it == nodes.end() ? nullptr : it->second;
    double b = 0, b32 = 0;  // bytes as compiled, and with 4-byte elements
    std::set<runtime::SlotId> touched;
    for (auto* list : {&s.reads(), &s.writes()})
      for (runtime::SlotId id : *list) touched.insert(root(id));
    for (runtime::SlotId id : touched) {
      const runtime::Slot& slot = p.slots[id];
      if (slot.kind == runtime::SlotKind::Constant) continue;  // counted with the node's constants below
      double one = static_cast<double>(slot.bytes);
      b += one;
      b32 += dtype_size(slot.dtype) == 1 ? 4 * one : one;
    }
    if (n)
      for (const Value* v : n->inputs())
        if (v && v->is_constant()) {
          double one = static_cast<double>(v->constant().nbytes());
          b += one;
          b32 += dtype_size(v->dtype()) == 1 ? 4 * one : one;
        }
    flops[i] = detail::step_flops(n);
    bytes[i] = b;
    const bool view = s.implementation() == "view", reference = s.implementation() == "reference";
    const double memory = b / rates.bandwidth, memory32 = b32 / rates.bandwidth;
    double peak = reference ? rates.reference : kind[i] == StepKind::Int8 ? rates.int8 : rates.fp32;
    t_int8[i] = view ? 0 : std::max(flops[i] / peak, memory);
    // In fp32 the int8 layers are oneDNN fp32 layers, and there is nothing to convert.
    double peak32 = reference && kind[i] != StepKind::Int8 ? rates.reference : rates.fp32;
    double t32 = view || kind[i] == StepKind::Conversion ? 0 : std::max(flops[i] / peak32, memory32);
    plan.int8_seconds += t_int8[i];
    plan.fp32_seconds += t32;
    plan.int8_steps += kind[i] == StepKind::Int8;
  }

  // Islands: the float-side steps joined through the slots they pass (union-find).
  auto float_side = [&](std::size_t i) {
    if (kind[i] == StepKind::Float || kind[i] == StepKind::Conversion) return true;
    if (kind[i] != StepKind::Move) return false;
    for (runtime::SlotId id : p.steps[i]->writes())
      if (p.slots[root(id)].dtype == DType::Float32) return true;
    return false;
  };
  std::vector<std::size_t> parent(count);
  for (std::size_t i = 0; i < count; ++i) parent[i] = i;
  auto find = [&](std::size_t i) {
    while (parent[i] != i) i = parent[i] = parent[parent[i]];
    return i;
  };
  std::vector<bool> member(count);
  for (std::size_t i = 0; i < count; ++i) member[i] = float_side(i);
  // Each read joins the step to the last step before it that wrote the slot (a view or an in-place
  // sum writes the slot it reads).
  std::vector<bool> after_int8(count), before_int8(count);  // per step; gathered per island below
  std::map<runtime::SlotId, std::size_t> writer;
  for (std::size_t j = 0; j < count; ++j) {
    for (runtime::SlotId id : p.steps[j]->reads()) {
      auto w = writer.find(root(id));
      if (w == writer.end()) continue;
      std::size_t i = w->second;
      if (member[i] && member[j]) parent[find(i)] = find(j);
      else if (member[j]) after_int8[j] = true;  // reads what an int8 step (or int8 move) wrote
      else if (member[i]) before_int8[i] = true;
    }
    for (runtime::SlotId id : p.steps[j]->writes()) writer[root(id)] = j;
  }
  std::map<std::size_t, std::size_t> island_of;  // union-find root -> index into plan.islands
  std::map<std::size_t, std::pair<bool, bool>> borders;
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < count; ++i) {
    if (!member[i]) continue;
    std::size_t r = find(i);
    auto [it, fresh] = island_of.emplace(r, order.size());
    if (fresh) {
      order.push_back(r);
      plan.islands.emplace_back();
    }
    Fp32Island& island = plan.islands[it->second];
    const runtime::Step& s = *p.steps[i];
    island.steps.push_back(i);
    if (kind[i] == StepKind::Float) island.float_steps.push_back(s.op() + " '" + s.name() + "'");
    if (kind[i] == StepKind::Conversion) island.conversions.push_back(detail::conversion_name(s.op(), s.name()));
    island.flops += flops[i];
    island.bytes += bytes[i];
    island.seconds += t_int8[i];
    borders[r].first = borders[r].first || after_int8[i];
    borders[r].second = borders[r].second || before_int8[i];
  }
  std::vector<Fp32Island> kept;
  for (std::size_t k = 0; k < order.size(); ++k) {
    Fp32Island& island = plan.islands[k];
    bool between = borders[order[k]].first && borders[order[k]].second;
    if (island.float_steps.empty() && !between) continue;  // the model's float interface: input Q, output DQ
    plan.island_seconds += island.seconds;
    kept.push_back(std::move(island));
  }
  plan.islands = std::move(kept);
  return plan;
}

inline std::string Int8Plan::text() const {
  using detail::duration;
  using detail::si;
  if (empty()) return "";
  std::string out = summary + "\n";
  for (std::size_t k = 0; k < islands.size(); ++k) {
    const Fp32Island& is = islands[k];
    out += "fp32 island " + std::to_string(k + 1) + ": " + std::to_string(is.float_steps.size()) + " float step" +
           (is.float_steps.size() == 1 ? "" : "s") + (is.float_steps.empty() ? "" : " (" + detail::name_list(is.float_steps) + ")") +
           ", " + std::to_string(is.conversions.size()) + " Q/DQ" +
           (is.conversions.empty() ? "" : " (" + detail::name_list(is.conversions) + ")") + ": " + si(is.flops, "FLOP") +
           ", " + si(is.bytes, "B") + ", est. " + duration(is.seconds) + "\n";
  }
  char rate[160];
  std::snprintf(rate, sizeof rate, "one core, roofline: int8 %.0f GOP/s, fp32 %.0f GFLOP/s (%s), %.0f GB/s",
                rates.int8 / 1e9, rates.fp32 / 1e9, rates.source.c_str(), rates.bandwidth / 1e9);
  out += "int8 estimate (" + std::string(rate) + "): int8 plan " + duration(int8_seconds) +
         (islands.empty() ? ", no fp32 island" : " (fp32 islands " + duration(island_seconds) + ")") +
         "; the model in fp32 " + duration(fp32_seconds);
  if (int8_seconds > 0 && !slower()) {
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, ": %.1fx faster", fp32_seconds / int8_seconds);
    out += ratio;
  }
  out += "\n";
  if (slower())
    out += "warning: int8 plan predicted slower than fp32: " + duration(int8_seconds) + " against " +
           duration(fp32_seconds) + "; " + std::to_string(islands.size()) + " fp32 island" +
           (islands.size() == 1 ? "" : "s") + " cost " + duration(island_seconds) + " of it\n";
  return out;
}

}  // namespace ondine::lower
