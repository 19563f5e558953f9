// SPDX-License-Identifier: Apache-2.0
// ondine/quant/calibration.hpp - post-training calibration: run a float model on sample inputs and
// choose quantization parameters for its activations and weights.
//
//   ondine::quant::CalibrationOptions opts;                       // activations: MinMax, uint8 asymmetric
//   opts.activations.method = ondine::quant::RangeMethod::Entropy;  // or Percentile, Mse, MovingAverage
//   auto folder = ondine::quant::scan_calibration_folder("calib/", input_names(g));
//   opts.sample_label = [&](std::size_t i) { return folder.labels[i]; };
//   auto result = ondine::quant::calibrate(g, folder.source(), opts);   // or an iterator range, a vector
//   std::cout << result.to_text();
//
// The graph runs on the ReferenceExecutor with keep_all, so every intermediate float32 value is seen.
// Activations: by default every float32 value that is not a constant (graph inputs and node outputs);
// CalibrationOptions::filter narrows that. Weights: the constant float32 weight of Conv, ConvTranspose,
// MatMul, Gemm and their fused forms (ondine.FusedConv/FusedMatMul/FusedGemm), observed once, per channel
// on the output-channel axis (Conv: 0, ConvTranspose: 1, MatMul: the last, Gemm: 1, or 0 with transB).
//
// Errors are ondine::Error with the sample number (1-based, and its label when sample_label is set):
// an empty calibration set, an input of the wrong name, shape or dtype (the reference executor's
// check_inputs), NaN/Inf in an input (naming it) or in a computed value (naming the value).
#pragma once

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/graph.hpp"
#include "ondine/ir/npy.hpp"
#include "ondine/quant/observers.hpp"
#include "ondine/reference/executor.hpp"

namespace ondine::quant {

// One calibration sample: graph input name -> tensor.
using Sample = std::map<std::string, Tensor>;
// A sequence of samples as a callback: the next sample, or nullopt at the end.
using SampleSource = std::function<std::optional<Sample>()>;

struct CalibrationOptions {
  // Activations: per-tensor (an axis here is rejected), uint8 asymmetric by default, the source type
  // oneDNN's u8*s8 int8 convolutions prefer.
  ObserverConfig activations;
  QuantScheme activation_scheme{DType::UInt8, /*symmetric=*/false, /*reduce_range=*/false};
  // Weights: int8 symmetric, per channel unless per_channel_weights is false.
  bool weights = true;
  bool per_channel_weights = true;
  QuantScheme weight_scheme{DType::Int8, /*symmetric=*/true, /*reduce_range=*/false};
  // Which values to observe (activations and weights); default all that qualify.
  std::function<bool(const Value&)> filter;
  // At most this many samples are drawn from the source (0: all).
  std::size_t max_samples = 0;
  // Called after each sample with the number done and the total when known (a sized range, capped
  // by max_samples; for a callback source: expected_samples).
  std::function<void(std::size_t done, std::optional<std::size_t> total)> progress;
  std::optional<std::size_t> expected_samples;
  // Names sample i (0-based) in error messages, e.g. its file or folder.
  std::function<std::string(std::size_t index)> sample_label;
};

// What calibration found for one value.
struct TensorCalibration {
  bool is_weight = false;
  float observed_min = 0.0f, observed_max = 0.0f;  // over every element seen
  Range range;                                     // the range the params come from (clipped, per channel)
  QuantParams params;
};

struct CalibrationResult {
  std::size_t samples = 0;
  std::map<std::string, TensorCalibration> tensors;

  bool contains(const std::string& name) const { return tensors.count(name) != 0; }
  const TensorCalibration& at(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw Error("no calibration for value '" + name + "'");
    return it->second;
  }
  const QuantParams& params(const std::string& name) const { return at(name).params; }

  // A line-based text form (tab-separated, floats with 9 significant digits so they read back
  // exactly), for a calibration cache and for people:
  //   ondine-calibration 1
  //   samples	8
  //   value	conv1	kind=activation	dtype=uint8	symmetric=0	axis=-	min=..	max=..	range_min=..	range_max=..	scale=..	zero_point=..
  // Per-channel fields are comma-separated lists. Tabs, newlines and backslashes in names are escaped.
  std::string to_text() const;
  static CalibrationResult from_text(const std::string& text);
};

namespace detail {

inline bool is_weight_op(const Node& n, std::int64_t& axis, std::size_t& input) {
  const std::string key = n.op_key();
  input = 1;
  if (key == "Conv" || key == "ondine.FusedConv") axis = 0;
  else if (key == "ConvTranspose") axis = 1;
  else if (key == "MatMul" || key == "ondine.FusedMatMul") axis = -1;
  else if (key == "Gemm" || key == "ondine.FusedGemm") axis = n.attr_int("transB", 0) ? 0 : 1;
  else return false;
  return true;
}

// Rethrows `e` with a prefix on its message, keeping its file and node.
[[noreturn]] inline void rethrow_with_prefix(const Error& e, const std::string& prefix) {
  Error out(prefix + e.message());
  if (!e.node().empty() || !e.op().empty()) out.at_node(e.node(), e.op());
  if (!e.file().empty()) out.in_file(e.file());
  throw out;
}

inline void check_finite_input(const std::string& name, const Tensor& t) {
  auto report = [&](std::size_t i, double v) {
    throw Error("input '" + name + "' contains " + (std::isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf") + " (element " +
                std::to_string(i) + " of " + std::string(dtype_name(t.dtype())) + dims_str(t.dims()) + ")");
  };
  auto n = static_cast<std::size_t>(t.numel());
  if (t.dtype() == DType::Float32) {
    const float* p = t.data<float>();
    for (std::size_t i = 0; i < n; ++i)
      if (!std::isfinite(p[i])) report(i, p[i]);
  } else if (is_floating(t.dtype())) {
    for (std::size_t i = 0; i < n; ++i)
      if (double v = t.at_double(i); !std::isfinite(v)) report(i, v);
  }
}

inline std::string escape_name(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\t') out += "\\t";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else out += c;
  }
  return out;
}
inline std::string unescape_name(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    char c = s[++i];
    out += c == 't' ? '\t' : c == 'n' ? '\n' : c == 'r' ? '\r' : c;
  }
  return out;
}

template <typename T, typename F>
std::string join(const std::vector<T>& v, F&& fmt) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + fmt(v[i]);
  return out;
}

inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, sep)) out.push_back(item);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

inline float parse_float(const std::string& s, const std::string& where) {
  char* end = nullptr;
  float v = std::strtof(s.c_str(), &end);
  if (s.empty() || *end != '\0') throw Error("calibration text: bad number '" + s + "' in " + where);
  return v;
}
inline std::int64_t parse_int(const std::string& s, const std::string& where) {
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0') throw Error("calibration text: bad integer '" + s + "' in " + where);
  return v;
}

// detection of a container with begin()/end() for the range overload of calibrate()
template <typename R, typename = void>
struct is_sample_range : std::false_type {};
template <typename R>
struct is_sample_range<R, std::void_t<decltype(std::begin(std::declval<const R&>())),
                                      decltype(std::end(std::declval<const R&>()))>> : std::true_type {};

}  // namespace detail

inline std::string CalibrationResult::to_text() const {
  auto f = [](float v) { return detail::fmt_float(v); };
  auto i = [](std::int32_t v) { return std::to_string(v); };
  std::string out = "ondine-calibration 1\nsamples\t" + std::to_string(samples) + "\n";
  for (auto& [name, t] : tensors) {
    const QuantParams& p = t.params;
    out += "value\t" + detail::escape_name(name) + "\tkind=" + (t.is_weight ? "weight" : "activation") +
           "\tdtype=" + std::string(dtype_name(p.dtype)) + "\tsymmetric=" + (p.symmetric ? "1" : "0") +
           "\taxis=" + (p.axis ? std::to_string(*p.axis) : "-") + "\tmin=" + f(t.observed_min) +
           "\tmax=" + f(t.observed_max) + "\trange_min=" + detail::join(t.range.min, f) +
           "\trange_max=" + detail::join(t.range.max, f) + "\tscale=" + detail::join(p.scale, f) +
           "\tzero_point=" + detail::join(p.zero_point, i) + "\n";
  }
  return out;
}

inline CalibrationResult CalibrationResult::from_text(const std::string& text) {
  CalibrationResult r;
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != "ondine-calibration 1")
    throw Error("not an ondine calibration text (expected the header 'ondine-calibration 1')");
  int line_no = 1;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    const std::string where = "line " + std::to_string(line_no);
    auto fields = detail::split(line, '\t');
    if (fields[0] == "samples" && fields.size() == 2) {
      r.samples = static_cast<std::size_t>(detail::parse_int(fields[1], where));
      continue;
    }
    if (fields[0] != "value" || fields.size() < 3) throw Error("calibration text: unexpected " + where + ": " + line);
    std::string name = detail::unescape_name(fields[1]);
    std::map<std::string, std::string> kv;
    for (std::size_t k = 2; k < fields.size(); ++k) {
      auto eq = fields[k].find('=');
      if (eq == std::string::npos) throw Error("calibration text: field '" + fields[k] + "' without '=' in " + where);
      kv[fields[k].substr(0, eq)] = fields[k].substr(eq + 1);
    }
    auto get = [&](const std::string& key) -> const std::string& {
      auto it = kv.find(key);
      if (it == kv.end()) throw Error("calibration text: " + where + " lacks '" + key + "'");
      return it->second;
    };
    auto floats = [&](const std::string& key) {
      std::vector<float> v;
      for (auto& s : detail::split(get(key), ',')) v.push_back(detail::parse_float(s, where));
      return v;
    };
    TensorCalibration t;
    t.is_weight = get("kind") == "weight";
    const std::string& dt = get("dtype");
    if (dt != "int8" && dt != "uint8") throw Error("calibration text: dtype '" + dt + "' in " + where);
    t.params.dtype = dt == "int8" ? DType::Int8 : DType::UInt8;
    t.params.symmetric = get("symmetric") == "1";
    if (get("axis") != "-") t.params.axis = detail::parse_int(get("axis"), where);
    t.observed_min = detail::parse_float(get("min"), where);
    t.observed_max = detail::parse_float(get("max"), where);
    t.range.min = floats("range_min");
    t.range.max = floats("range_max");
    t.range.axis = t.params.axis;
    t.params.scale = floats("scale");
    for (auto& s : detail::split(get("zero_point"), ','))
      t.params.zero_point.push_back(static_cast<std::int32_t>(detail::parse_int(s, where)));
    try {
      check_params(t.params, name);
    } catch (const Error& e) {
      detail::rethrow_with_prefix(e, "calibration text, " + where + ": ");
    }
    r.tensors[name] = std::move(t);
  }
  return r;
}

// Feeds samples one at a time; result() gives the parameters. Use calibrate() for a whole sequence.
class Calibrator {
 public:
  explicit Calibrator(const Graph& g, CalibrationOptions options = {})
      : graph_(g), options_(std::move(options)), exec_(g) {
    if (options_.activations.axis)
      throw Error("activations are quantized per tensor: CalibrationOptions::activations.axis must be unset");
    quant_bounds(options_.activation_scheme);  // reject a bad type up front
    quant_bounds(options_.weight_scheme);
    auto wanted = [&](const Value& v) { return !options_.filter || options_.filter(v); };
    std::set<const Value*> seen;
    auto add_activation = [&](Value* v) {
      // Undefined dtype (no shape inference): decided when the value arrives (float32 only).
      if (!v || v->is_constant() || !seen.insert(v).second) return;
      if (v->dtype() != DType::Float32 && v->dtype() != DType::Undefined) return;
      if (!wanted(*v)) return;
      activations_.emplace_back(v->name(), make_observer(v->name(), options_.activations));
    };
    for (Value* in : g.inputs()) add_activation(in);
    for (Node* n : g.topo_order())
      for (Value* out : n->outputs()) add_activation(out);
    if (options_.weights) observe_weights();
  }

  // Runs one sample and feeds every observed value. Errors name the sample.
  void add_sample(const Sample& inputs) {
    std::size_t index = samples_;
    std::string prefix = "calibration sample " + std::to_string(index + 1);
    if (options_.sample_label) prefix += " ('" + options_.sample_label(index) + "')";
    prefix += ": ";
    try {
      check_inputs(graph_, inputs);
      for (auto& [name, t] : inputs) detail::check_finite_input(name, t);
      auto values = exec_.run(inputs, /*keep_all=*/true);
      for (auto& [name, obs] : activations_) {
        auto it = values.find(name);
        if (it == values.end() || it->second.dtype() != DType::Float32) continue;
        obs->observe(it->second);
      }
    } catch (const Error& e) {
      detail::rethrow_with_prefix(e, prefix);
    }
    ++samples_;
  }

  std::size_t samples() const { return samples_; }
  // The activations observed, in graph order.
  std::vector<std::string> observed_activations() const {
    std::vector<std::string> out;
    for (auto& a : activations_) out.push_back(a.first);
    return out;
  }

  // The parameters of every observed value. Throws when no sample was added.
  CalibrationResult result() const {
    if (samples_ == 0) throw Error("the calibration set is empty: at least one sample is needed");
    CalibrationResult r;
    r.samples = samples_;
    auto add = [&](const std::string& name, const Observer& obs, const QuantScheme& scheme, bool weight) {
      if (obs.batches() == 0 && !weight) return;  // never produced as float32
      TensorCalibration t;
      t.is_weight = weight;
      t.observed_min = obs.observed_min();
      t.observed_max = obs.observed_max();
      t.range = obs.range(scheme);
      t.params = compute_params(t.range, scheme);
      r.tensors[name] = std::move(t);
    };
    for (auto& [name, obs] : activations_) add(name, *obs, options_.activation_scheme, false);
    for (auto& [name, obs] : weights_) add(name, *obs, options_.weight_scheme, true);
    return r;
  }

 private:
  void observe_weights() {
    std::set<const Value*> seen;
    for (Node* n : graph_.topo_order()) {
      std::int64_t axis = 0;
      std::size_t input = 0;
      if (!detail::is_weight_op(*n, axis, input)) continue;
      Value* w = n->input(input);
      if (!w || !w->is_constant() || w->dtype() != DType::Float32 || !seen.insert(w).second) continue;
      if (options_.filter && !options_.filter(*w)) continue;
      const Tensor& t = w->constant();
      std::unique_ptr<Observer> obs;
      auto rank = static_cast<std::int64_t>(t.rank());
      if (options_.per_channel_weights && rank >= 2) obs = std::make_unique<PerChannelMinMaxObserver>(w->name(), axis);
      else obs = std::make_unique<MinMaxObserver>(w->name());
      obs->observe(t);
      weights_.emplace_back(w->name(), std::move(obs));
    }
  }

  const Graph& graph_;
  CalibrationOptions options_;
  ReferenceExecutor exec_;
  std::vector<std::pair<std::string, std::unique_ptr<Observer>>> activations_, weights_;
  std::size_t samples_ = 0;
};

// Calibrates on the samples a callback returns until it returns nullopt (or max_samples were drawn).
inline CalibrationResult calibrate(const Graph& g, const SampleSource& next, const CalibrationOptions& options = {}) {
  Calibrator cal(g, options);
  std::optional<std::size_t> total = options.expected_samples;
  if (total && options.max_samples) total = std::min(*total, options.max_samples);
  while (!options.max_samples || cal.samples() < options.max_samples) {
    std::optional<Sample> s = next();
    if (!s) break;
    cal.add_sample(*s);
    if (options.progress) options.progress(cal.samples(), total);
  }
  return cal.result();
}

// Calibrates on an iterator range of samples (the total is known for forward iterators).
template <typename It>
CalibrationResult calibrate(const Graph& g, It first, It last, const CalibrationOptions& options = {}) {
  CalibrationOptions opts = options;
  using Category = typename std::iterator_traits<It>::iterator_category;
  if constexpr (std::is_base_of_v<std::forward_iterator_tag, Category>)
    opts.expected_samples = static_cast<std::size_t>(std::distance(first, last));
  SampleSource next = [&]() -> std::optional<Sample> {
    if (first == last) return std::nullopt;
    return Sample(*first++);
  };
  return calibrate(g, next, opts);
}

// Calibrates on a container of samples (a std::vector<Sample>, ...).
template <typename Container, typename = std::enable_if_t<detail::is_sample_range<Container>::value>>
CalibrationResult calibrate(const Graph& g, const Container& samples, const CalibrationOptions& options = {}) {
  return calibrate(g, std::begin(samples), std::end(samples), options);
}

// --- calibration folders -------------------------------------------------------------------------

// The samples of a calibration folder, loaded lazily. Two layouts:
//   DIR/<sample>/<input>.npy   one subfolder per sample, one file per graph input (file stem = input
//                              name); samples in subfolder-name order.
//   DIR/<sample>.npy           a model with one input: each file is one sample of it, in file-name order
//                              (zero-pad numbers: "img_010" sorts after "img_009", "img_10" does not).
//                              For a model with several inputs, a flat folder whose file stems are
//                              exactly the input names is one sample.
// Files not ending in .npy are ignored, as are hidden files and folders (starting with '.').
struct CalibrationFolder {
  std::string dir;
  std::vector<std::string> labels;                        // per sample: its subfolder or file, for messages
  std::vector<std::map<std::string, std::string>> files;  // per sample: input name -> .npy path

  std::size_t size() const { return files.size(); }
  // Reads sample i (an Error naming the file when one cannot be read).
  Sample load(std::size_t i) const {
    Sample s;
    for (auto& [input, path] : files.at(i)) s.emplace(input, load_npy(path));
    return s;
  }
  // A source yielding the samples in order; the folder must outlive it.
  SampleSource source() const {
    return [this, i = std::size_t{0}]() mutable -> std::optional<Sample> {
      if (i >= files.size()) return std::nullopt;
      return load(i++);
    };
  }
};

inline std::vector<std::string> input_names(const Graph& g) {
  std::vector<std::string> out;
  for (Value* v : g.inputs()) out.push_back(v->name());
  return out;
}

inline CalibrationFolder scan_calibration_folder(const std::string& dir, const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  auto fail = [&](const std::string& msg) { return Error("calibration folder: " + msg).in_file(dir); };
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw fail("not a directory");
  auto hidden = [](const fs::path& p) { return p.filename().string().rfind('.', 0) == 0; };
  auto is_npy = [&](const fs::directory_entry& e) {
    return !hidden(e.path()) && e.path().extension() == ".npy" && e.is_regular_file();
  };
  auto list = [&](const fs::path& d) {
    std::vector<fs::directory_entry> entries;
    fs::directory_iterator it(d, ec), end;
    if (ec) throw Error("calibration folder: cannot list (" + ec.message() + ")").in_file(d.string());
    for (; it != end; it.increment(ec)) {
      if (ec) throw Error("calibration folder: cannot list (" + ec.message() + ")").in_file(d.string());
      entries.push_back(*it);
    }
    std::sort(entries.begin(), entries.end(),
              [](const auto& a, const auto& b) { return a.path().filename().string() < b.path().filename().string(); });
    return entries;
  };

  CalibrationFolder folder;
  folder.dir = dir;
  std::vector<fs::directory_entry> flat, subdirs;
  for (auto& e : list(dir)) {
    if (is_npy(e)) flat.push_back(e);
    else if (!hidden(e.path()) && e.is_directory()) subdirs.push_back(e);
  }
  if (!subdirs.empty()) {
    if (!flat.empty())
      throw fail("mixes .npy files ('" + flat.front().path().filename().string() + "') with sample subfolders ('" +
                 subdirs.front().path().filename().string() + "'): use one layout");
    for (auto& d : subdirs) {
      std::map<std::string, std::string> sample;
      for (auto& e : list(d.path()))
        if (is_npy(e)) sample[e.path().stem().string()] = e.path().string();
      if (sample.empty())
        throw fail("sample folder '" + d.path().filename().string() + "' has no .npy file (expected " +
                   (inputs.empty() ? std::string("<input>.npy") : inputs.front() + ".npy") + ")");
      folder.labels.push_back(d.path().filename().string());
      folder.files.push_back(std::move(sample));
    }
    return folder;
  }
  if (flat.empty())
    throw fail("no .npy files found (expected DIR/<sample>.npy for a one-input model, or DIR/<sample>/<input>.npy)");
  std::set<std::string> stems, wanted(inputs.begin(), inputs.end());
  for (auto& e : flat) stems.insert(e.path().stem().string());
  if (inputs.size() == 1) {
    for (auto& e : flat) {
      folder.labels.push_back(e.path().filename().string());
      folder.files.push_back({{inputs.front(), e.path().string()}});
    }
    return folder;
  }
  if (stems == wanted) {
    std::map<std::string, std::string> sample;
    for (auto& e : flat) sample[e.path().stem().string()] = e.path().string();
    folder.labels.push_back(fs::path(dir).filename().string());
    folder.files.push_back(std::move(sample));
    return folder;
  }
  std::string names;
  for (auto& n : inputs) names += (names.empty() ? "" : ", ") + n;
  throw fail("holds " + std::to_string(flat.size()) + " .npy files at top level but the model has " +
             std::to_string(inputs.size()) + " inputs (" + names +
             "): put each sample in its own subfolder, DIR/<sample>/<input>.npy");
}

}  // namespace ondine::quant
