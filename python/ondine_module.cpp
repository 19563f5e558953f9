// python/ondine_module.cpp - the Python module `ondine` (pybind11): the C++ API with arrays in and out.
//
//   import ondine
//   m = ondine.compile("model.onnx", precision="fp32", dims={"batch": 1}, threads=2, passes="default")
//   outputs = m.run({"input": x})                  # dict: output name -> numpy array
//   logits, = m.run(["logits"], {"input": x})      # ONNX Runtime's run(output_names, input_feed)
//   m.save("model.ondine"); m = ondine.load("model.ondine")
//   ondine.quantize("model.onnx", calibration=feeds, output="model.int8.onnx", max_error=0.01)
//   ondine.inspect("model.onnx")                   # dict: inputs, outputs, ops, parameters, FLOPs
//
// The binding only converts and calls the C++ API (docs/python.md): a Model is a lower::ShapeCache (one
// compile per input shape, as a C++ host gets it), or, with precision bf16/auto under an error bound, the
// CompiledModel lower::compile_bf16_within returns. save/load are lower::save_artifact/load_artifact,
// quantize is what `ondine quantize` does (examples/cli/quantize.hpp) with the samples from a Python
// iterable, inspect is `ondine inspect --json` as a dict.
//
// Arrays in: read in place through the buffer protocol when C-contiguous, aligned, native byte order and of
// the input's dtype; other layouts (a transposed view, big-endian) are copied once to a C-contiguous array,
// and Python lists and scalars are converted once to the input's dtype. An array of another dtype is
// refused (as ONNX Runtime refuses it), naming the input: no silent float64 -> float32.
// Arrays out: each output Tensor moves into a capsule that the numpy array keeps as its base, no copy. An
// output that shares storage with something else (the model's weights, a mapped artifact, an input) is
// returned read-only, so writing to it cannot change the model or fault on a read-only mapping.
// Threads: the GIL is released while a model compiles or runs; a Model may run on several threads at once
// (ShapeCache is thread-safe, each call has its own ExecContext).
// Errors: ondine::Error becomes ondine.Error (a RuntimeError) with what() as its message and the context
// as attributes (file, node, op, message); argument types wrong for pybind11 are TypeErrors.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "ondine/lower/artifact.hpp"
#include "ondine/lower/lower.hpp"
#include "ondine/lower/shape_cache.hpp"
#include "ondine/ondine.hpp"
#include "ondine/quant/fallback.hpp"
#include "ondine/quant/weight_only.hpp"
#include "ondine/runtime/generate.hpp"
#include "ondine/runtime/streams.hpp"

namespace py = pybind11;
using namespace ondine;

namespace {

// ---- conversions ----

// The numpy dtype of an Ondine dtype. numpy has no bfloat16 and Ondine computes no strings: those values
// cannot cross.
py::dtype numpy_dtype(DType t, const std::string& what) {
  switch (t) {
    case DType::Float32: return py::dtype::of<float>();
    case DType::Float64: return py::dtype::of<double>();
    case DType::Int8: return py::dtype::of<std::int8_t>();
    case DType::UInt8: return py::dtype::of<std::uint8_t>();
    case DType::Int16: return py::dtype::of<std::int16_t>();
    case DType::UInt16: return py::dtype::of<std::uint16_t>();
    case DType::Int32: return py::dtype::of<std::int32_t>();
    case DType::UInt32: return py::dtype::of<std::uint32_t>();
    case DType::Int64: return py::dtype::of<std::int64_t>();
    case DType::UInt64: return py::dtype::of<std::uint64_t>();
    case DType::Bool: return py::dtype::of<bool>();
    case DType::Float16: return py::dtype("float16");
    default: throw Error(what + " has dtype " + std::string(dtype_name(t)) + ", which numpy has no type for");
  }
}

// Whether an array's dtype is `t`, by numpy's kind and item size (int64 is 'i', 8 whether numpy calls it
// long or longlong), without a Python call.
bool same_dtype(const py::dtype& dt, DType t) {
  const char kind = dt.kind();
  const py::ssize_t size = dt.itemsize();
  if (kind == 'f') return (t == DType::Float32 && size == 4) || (t == DType::Float64 && size == 8) || (t == DType::Float16 && size == 2);
  if (kind == 'b') return t == DType::Bool && size == 1;
  if (kind != 'i' && kind != 'u') return false;
  const bool is_signed = kind == 'i';
  switch (t) {
    case DType::Int8: return is_signed && size == 1;
    case DType::Int16: return is_signed && size == 2;
    case DType::Int32: return is_signed && size == 4;
    case DType::Int64: return is_signed && size == 8;
    case DType::UInt8: return !is_signed && size == 1;
    case DType::UInt16: return !is_signed && size == 2;
    case DType::UInt32: return !is_signed && size == 4;
    case DType::UInt64: return !is_signed && size == 8;
    default: return false;
  }
}

// A value's shape as Python sees it: ints, symbolic dims as their names or expressions ("batch",
// "(frames - 1)/2 + 1"), None for a dim nothing is known about; None for an unknown rank.
py::object shape_list(const Shape& s) {
  if (!s.rank_known()) return py::none();
  py::list out;
  for (const Dim& d : s.dims()) {
    if (d.is_static()) out.append(d.value);
    else if (!d.symbol.empty()) out.append(d.symbol);
    else out.append(py::none());
  }
  return std::move(out);
}

// (name, dtype, shape) per value, as Model.inputs / outputs and inspect() list them.
py::list signature(const std::vector<Value*>& values) {
  py::list out;
  for (const Value* v : values) out.append(py::make_tuple(v->name(), std::string(dtype_name(v->dtype())), shape_list(v->shape())));
  return out;
}

std::string names_of(const std::vector<Value*>& values) {
  std::string out;
  for (const Value* v : values) out += (out.empty() ? "" : ", ") + v->name();
  return out;
}

// `obj` as a Tensor of the graph input `in`, read in place where numpy's layout allows (header comment).
// The Tensor keeps the array alive; releasing it takes the GIL, wherever the last reference goes.
Tensor to_tensor(const Value& in, py::handle obj) {
  const std::string what = "input '" + in.name() + "'";
  const py::dtype want = numpy_dtype(in.dtype(), what);
  py::array arr;
  if (py::isinstance<py::array>(obj)) {
    arr = py::reinterpret_borrow<py::array>(obj);
    if (!same_dtype(arr.dtype(), in.dtype()))
      throw Error(what + " has dtype " + std::string(py::str(arr.dtype())) + ", the model expects " +
                  std::string(dtype_name(in.dtype())) + " (convert it with .astype(numpy." +
                  std::string(dtype_name(in.dtype())) + "))");
    const bool in_place = (arr.flags() & py::array::c_style) && (arr.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_) &&
                          arr.dtype().byteorder() != '>';
    if (!in_place) arr = py::module_::import("numpy").attr("ascontiguousarray")(arr, want);  // the one copy
  } else {
    try {
      arr = py::module_::import("numpy").attr("ascontiguousarray")(obj, want);
    } catch (py::error_already_set& e) {
      throw Error(what + ": cannot convert a " + std::string(py::str(obj.get_type().attr("__name__"))) + " to a " +
                  std::string(dtype_name(in.dtype())) + " array: " + e.what());
    }
  }
  std::vector<std::int64_t> dims(arr.shape(), arr.shape() + arr.ndim());
  auto* keep = new py::object(arr);
  std::shared_ptr<void> owner(keep, [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
  return Tensor(in.dtype(), std::move(dims), const_cast<void*>(arr.data()), std::move(owner));
}

// A feed dict {input name: array} as the tensors the C++ API takes. Names are checked here (an unknown
// one is named with the model's inputs); shapes, missing inputs and consistent symbols by check_inputs
// when the model runs.
std::map<std::string, Tensor> to_feeds(const Graph& g, py::handle feeds) {
  if (!py::isinstance<py::dict>(feeds))
    throw py::type_error("the input feed must be a dict {input name: array}, got " +
                         std::string(py::str(feeds.get_type().attr("__name__"))));
  std::map<std::string, Tensor> out;
  for (auto [key, value] : py::reinterpret_borrow<py::dict>(feeds)) {
    if (!py::isinstance<py::str>(key))
      throw py::type_error("input names must be str, got " + std::string(py::str(key.get_type().attr("__name__"))));
    const std::string name = key.cast<std::string>();
    const Value* v = g.find_value(name);
    if (!v || !v->is_graph_input())
      throw Error("'" + name + "' is not an input of the model (inputs: " + names_of(g.inputs()) + ")");
    out[name] = to_tensor(*v, value);
  }
  return out;
}

// `t` as a numpy array that owns it (no copy): the capsule holds the Tensor and with it its storage.
py::array to_array(Tensor t, const std::string& name) {
  const py::dtype dt = numpy_dtype(t.dtype(), "output '" + name + "'");
  std::vector<py::ssize_t> shape(t.dims().begin(), t.dims().end());
  if (t.nbytes() == 0) return py::array(dt, std::move(shape));  // no bytes to share (its pointer may be null)
  const bool own = t.is_sole_owner();
  auto* keep = new Tensor(std::move(t));
  py::capsule base(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  py::array arr(dt, std::move(shape), keep->raw(), base);
  if (!own) arr.attr("setflags")(py::arg("write") = false);  // shared storage: see the header comment
  return arr;
}

// "int8" is fp32 for the float layers: a quantized model's int8 layers run int8 whatever the precision.
lower::Precision parse_precision(const std::string& p) {
  if (p == "fp32" || p == "int8") return lower::Precision::Fp32;
  if (p == "bf16") return lower::Precision::Bf16;
  if (p == "auto") return lower::Precision::Auto;
  throw Error("precision must be 'fp32', 'bf16', 'int8' or 'auto', got '" + p + "'");
}

// precision='int8' names what a quantized model runs anyway; a float model is refused rather than run in
// fp32 unnoticed (as `ondine run --precision int8` without --calib).
void check_int8_model(const Graph& g, const std::string& path) {
  if (lower::has_int8_layers(g)) return;
  throw Error("precision='int8': the model has no quantized layers (no Q/DQ pairs, QLinear or integer ops); "
              "quantize it first: ondine.quantize(path, calibration=[feed, ...], output='model.int8.onnx'), then "
              "ondine.compile('model.int8.onnx', precision='int8')").in_file(path);
}

// ---- Model ----

// A compiled model: its signature graph, and what runs it.
struct Model {
  std::string source;                         // the file compiled or loaded
  Graph graph;                                // ONNX: the imported graph, dims bound; artifact: its graph
  lower::CompileOptions options;              // threads, passes, precision as compiled
  std::map<std::string, std::int64_t> dims;   // as given to compile(), for save()'s packings
  std::optional<artifact::Info> artifact;     // loaded from an artifact: its variant
  std::unique_ptr<lower::ShapeCache> cache;   // the usual engine
  std::shared_ptr<const CompiledModel> fixed; // bf16 under an error bound (static shapes)
  py::dict bound;                             // what the error bound did ({} without one)
  std::vector<std::string> bound_kept;        // the nodes the bound kept fp32 (save() stores them)
  bool bound_chose_fp32 = false;              // auto under the bound chose fp32
  bool int8 = false;                          // precision='int8': a quantized model, float layers fp32
  std::string tuned;                          // tune=True: the tuner's decisions (lower::TuneResult::text)
  std::string tuned_choices;                  // ... as an artifact stores them (save() writes them)

  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) const {
    if (fixed) {
      check_inputs(graph, inputs);
      return fixed->run(inputs);
    }
    return cache->run(inputs);
  }

  // With outputs written into the caller's buffers (runtime/output_binding.hpp), and with a KV cache
  // (runtime/kv_cache.hpp) where one is given.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs,
                                    const std::map<std::string, Tensor>& bound, runtime::KvCache* kv = nullptr) const {
    if (kv) {
      if (fixed || !cache) throw Error("a KV cache needs the shape-free plan; this model runs one fixed plan");
      return cache->run(inputs, bound, *kv);
    }
    if (fixed) {
      check_inputs(graph, inputs);
      runtime::check_output_bindings(graph, inputs, bound);
      std::map<std::string, Tensor> outputs = fixed->run(inputs);
      for (auto& [name, buffer] : bound) outputs[name] = runtime::write_output(outputs.at(name), buffer, name);
      return outputs;
    }
    return cache->run(inputs, bound);
  }

  std::string precision() const { return int8 ? "int8" : lower::precision_name(options.precision); }
};

// The KvCache given as kv_cache=, or null for None.
runtime::KvCache* kv_cache_of(py::handle kv) {
  if (kv.is_none()) return nullptr;
  if (!py::isinstance<runtime::KvCache>(kv))
    throw py::type_error("kv_cache must be an ondine.KvCache (Model.kv_cache(capacity)), got " +
                         std::string(py::str(kv.get_type().attr("__name__"))));
  return kv.cast<runtime::KvCache*>();
}

// An output a KV cache keeps (not returned by a run with that cache).
bool kept_in_cache(const runtime::KvCache* kv, const std::string& name) {
  if (!kv) return false;
  for (const auto& p : kv->pairs())
    if (p.present == name) return true;
  return false;
}

// Runs with the GIL released; the outputs in the model's order (name, array); with a KV cache, those it
// keeps are left out.
std::vector<std::pair<std::string, py::array>> run_model(const Model& m, py::handle feeds, py::handle kv_cache = py::none()) {
  runtime::KvCache* kv = kv_cache_of(kv_cache);
  std::map<std::string, Tensor> inputs = to_feeds(m.graph, feeds);
  std::map<std::string, Tensor> outputs;
  {
    py::gil_scoped_release release;
    try {
      outputs = kv ? m.run(inputs, {}, kv) : m.run(inputs);
    } catch (Error& e) {
      e.in_file(m.source);
      throw;
    }
  }
  std::vector<std::pair<std::string, py::array>> out;
  for (const Value* o : m.graph.outputs()) {
    if (kept_in_cache(kv, o->name())) continue;
    auto it = outputs.find(o->name());
    if (it == outputs.end()) throw Error("the compiled model has no output '" + o->name() + "'").in_file(m.source);
    out.emplace_back(o->name(), to_array(std::move(it->second), o->name()));
  }
  return out;
}

// run_into(feeds, {output name: array}): the bound outputs written into the caller's arrays, which must be
// C-contiguous, writeable and of the output's dtype, with at least as many elements as the output (a
// larger one holds it in its first elements: a KV cache allocated for the longest sequence). Returns every
// output; the bound ones as views of the given arrays with the output's shape.
py::dict run_into(const Model& m, py::handle feeds, py::handle buffers, py::handle kv_cache) {
  runtime::KvCache* kv = kv_cache_of(kv_cache);
  if (!py::isinstance<py::dict>(buffers))
    throw py::type_error("the output buffers must be a dict {output name: array}, got " +
                         std::string(py::str(buffers.get_type().attr("__name__"))));
  std::map<std::string, Tensor> inputs = to_feeds(m.graph, feeds);
  std::map<std::string, Tensor> bound;
  std::map<std::string, py::array> arrays;
  for (auto [key, value] : py::reinterpret_borrow<py::dict>(buffers)) {
    if (!py::isinstance<py::str>(key))
      throw py::type_error("output names must be str, got " + std::string(py::str(key.get_type().attr("__name__"))));
    const std::string name = key.cast<std::string>();
    const Value* v = m.graph.find_value(name);
    if (!v || !v->is_graph_output())
      throw Error("'" + name + "' is not an output of the model (outputs: " + names_of(m.graph.outputs()) + ")");
    if (!py::isinstance<py::array>(value))
      throw py::type_error("the buffer for output '" + name + "' must be a numpy array, got " +
                           std::string(py::str(value.get_type().attr("__name__"))));
    py::array arr = py::reinterpret_borrow<py::array>(value);
    if (!same_dtype(arr.dtype(), v->dtype()))
      throw Error("the buffer for output '" + name + "' has dtype " + std::string(py::str(arr.dtype())) +
                  "; the output is " + std::string(dtype_name(v->dtype())));
    if (!(arr.flags() & py::array::c_style) || !arr.writeable() || arr.dtype().byteorder() == '>')
      throw Error("the buffer for output '" + name + "' must be a C-contiguous, writeable array in native byte order");
    std::vector<std::int64_t> dims(arr.shape(), arr.shape() + arr.ndim());
    auto* keep = new py::object(arr);
    std::shared_ptr<void> owner(keep, [](void* p) {
      py::gil_scoped_acquire gil;
      delete static_cast<py::object*>(p);
    });
    bound[name] = Tensor(v->dtype(), std::move(dims), arr.mutable_data(), std::move(owner));
    arrays[name] = arr;
  }
  std::map<std::string, Tensor> outputs;
  {
    py::gil_scoped_release release;
    try {
      outputs = m.run(inputs, bound, kv);
    } catch (Error& e) {
      e.in_file(m.source);
      throw;
    }
  }
  py::dict out;
  for (const Value* o : m.graph.outputs()) {
    if (kept_in_cache(kv, o->name())) continue;
    auto it = outputs.find(o->name());
    if (it == outputs.end()) throw Error("the compiled model has no output '" + o->name() + "'").in_file(m.source);
    if (auto a = arrays.find(o->name()); a != arrays.end()) {
      const Tensor& t = it->second;
      py::tuple shape(t.rank());
      for (std::size_t d = 0; d < t.rank(); ++d) shape[d] = t.dims()[d];
      py::object flat = a->second.attr("reshape")(-1);
      out[py::str(o->name())] = flat[py::slice(0, t.numel(), 1)].attr("reshape")(shape);
    } else {
      out[py::str(o->name())] = to_array(std::move(it->second), o->name());
    }
  }
  return out;
}

// The module's ondine.Error type (set when the module loads), for errors returned rather than raised.
py::handle g_error_type;

// `e` as an ondine.Error object, with its context as attributes (as raised errors have).
py::object error_object(const Error& e) {
  py::object err = g_error_type(e.what());
  err.attr("message") = e.message();
  err.attr("file") = e.file();
  err.attr("node") = e.node();
  err.attr("op") = e.op();
  return err;
}

// run_many(feeds, streams=, threads=): every feed run from `streams` streams of threads of their own
// (runtime/streams.hpp; each stream runs plans compiled for its share of `threads`), the GIL released while
// they run; the outputs as dicts in feed order. errors='raise': the first failing request stops the others and
// its error is raised, naming it ("request 3 of 10: ..."); 'return': its entry is the ondine.Error instead and
// the others complete.
py::list run_many(const Model& m, py::iterable feeds, int streams, int threads, bool pin, const std::string& errors) {
  if (errors != "raise" && errors != "return")
    throw py::value_error("errors must be 'raise' or 'return', got '" + errors + "'");
  std::vector<std::map<std::string, Tensor>> inputs;
  for (py::handle f : feeds) inputs.push_back(to_feeds(m.graph, f));
  runtime::StreamOptions so;
  so.streams = streams;
  so.threads = threads > 0 ? threads : m.options.threads;
  so.pin = pin;
  const std::size_t n = inputs.size();
  std::vector<std::map<std::string, Tensor>> outputs;
  std::vector<std::optional<Error>> failed(n);
  {
    py::gil_scoped_release release;
    const runtime::StreamPlan plan = runtime::plan_streams(so, n);
    lower::PlanCache* cache = m.fixed ? nullptr : &m.cache->for_threads(plan.threads_per_stream);
    outputs = runtime::run_streams<std::map<std::string, Tensor>>(n, plan, [&](std::size_t i, int) {
      try {
        if (!cache) {
          check_inputs(m.graph, inputs[i]);
          return m.fixed->run(inputs[i]);
        }
        return cache->run(inputs[i]);
      } catch (const Error& e) {
        Error named = runtime::request_error(e, i, n);
        named.in_file(m.source);
        if (errors == "raise") throw named;
        failed[i] = named;
        return std::map<std::string, Tensor>{};
      }
    });
  }
  py::list out;
  for (std::size_t i = 0; i < n; ++i) {
    if (failed[i]) {
      out.append(error_object(*failed[i]));
      continue;
    }
    py::dict d;
    for (const Value* o : m.graph.outputs()) {
      auto it = outputs[i].find(o->name());
      if (it == outputs[i].end()) throw Error("the compiled model has no output '" + o->name() + "'").in_file(m.source);
      d[py::str(o->name())] = to_array(std::move(it->second), o->name());
    }
    out.append(d);
  }
  return out;
}

py::dict run_dict(const Model& m, py::handle feeds, py::handle kv_cache) {
  py::dict out;
  for (auto& [name, arr] : run_model(m, feeds, kv_cache)) out[py::str(name)] = arr;
  return out;
}

// run(output_names, input_feed) as onnxruntime.InferenceSession.run: None means every output. All
// outputs are computed either way (the compiled plan is the whole graph).
py::list run_list(const Model& m, py::object output_names, py::handle feeds) {
  std::vector<std::string> names;
  if (output_names.is_none()) {
    for (const Value* o : m.graph.outputs()) names.push_back(o->name());
  } else {
    if (py::isinstance<py::str>(output_names))
      throw py::type_error("output_names must be a list of names or None, got a str (write ['" +
                           output_names.cast<std::string>() + "'])");
    for (py::handle h : output_names) {
      if (!py::isinstance<py::str>(h))
        throw py::type_error("output names must be str, got " + std::string(py::str(h.get_type().attr("__name__"))));
      names.push_back(h.cast<std::string>());
    }
    for (const std::string& name : names) {
      const Value* v = m.graph.find_value(name);
      if (!v || !v->is_graph_output())
        throw Error("'" + name + "' is not an output of the model (outputs: " + names_of(m.graph.outputs()) + ")");
    }
  }
  std::map<std::string, py::array> by_name;
  for (auto& [name, arr] : run_model(m, feeds)) by_name.emplace(name, arr);
  py::list out;
  for (const std::string& name : names) out.append(by_name.at(name));
  return out;
}

// The samples of a bf16 error bound or a quantization fallback: a list of feed dicts.
std::vector<std::map<std::string, Tensor>> to_samples(const Graph& g, py::handle samples, const std::string& what) {
  std::vector<std::map<std::string, Tensor>> out;
  for (py::handle s : samples) {
    try {
      out.push_back(to_feeds(g, s));
    } catch (Error& e) {
      throw Error(what + " " + std::to_string(out.size() + 1) + ": " + e.what());
    }
  }
  return out;
}

std::shared_ptr<Model> load(const std::string& path, int threads, const std::optional<std::string>& precision,
                            std::size_t cache_size, const std::string& shape_plan);

// shape_plan='auto' | 'per-shape' | 'shape-free' (lower::ShapePlan, docs/shapes.md).
lower::ShapePlan parse_shape_plan(const std::string& s) {
  if (s == "auto") return lower::ShapePlan::Auto;
  if (s == "per-shape") return lower::ShapePlan::PerShape;
  if (s == "shape-free") return lower::ShapePlan::ShapeFree;
  throw Error("shape_plan must be 'auto', 'per-shape' or 'shape-free', got '" + s + "'");
}

std::shared_ptr<Model> compile(const std::string& path, const std::optional<std::string>& precision_given,
                               std::optional<std::map<std::string, std::int64_t>> dims, int threads,
                               const std::string& passes, std::optional<double> max_error, py::object samples,
                               std::size_t cache_size, const std::string& shape_plan, bool tune,
                               bool exact_weight_only) {
  const lower::Precision p = parse_precision(precision_given.value_or("fp32"));
  const lower::ShapePlan plan = parse_shape_plan(shape_plan);
  make_pass_manager(passes);  // a bad pipeline is an error now, not at the first run
  if (artifact::is_artifact(path)) {
    // The artifact's passes ran when it was written (as `ondine run model.ondine` says).
    if (passes != "default" && passes != "none")
      throw Error("passes='" + passes + "': an artifact's passes ran when it was compiled; compile the ONNX model "
                  "with other passes instead").in_file(path);
    if (dims || max_error || !samples.is_none())
      throw Error("dims, max_error and samples are for ONNX models; an artifact keeps its symbolic dims and "
                  "specialises per call").in_file(path);
    if (tune)
      throw Error("tune=True is for ONNX models; an artifact keeps the choices it was compiled with "
                  "(`ondine compile MODEL.onnx --tune -o MODEL.ondine` tunes them)").in_file(path);
    if (exact_weight_only)
      throw Error("exact_weight_only=True is for ONNX models; an artifact's weight-only layers keep the activations "
                  "they were compiled with (`ondine compile MODEL.onnx --exact-weight-only -o MODEL.ondine`)").in_file(path);
    return load(path, threads, precision_given, cache_size, shape_plan);
  }
  auto m = std::make_shared<Model>();
  m->source = path;
  m->options.threads = threads;
  m->options.shape_plan = plan;
  m->options.passes = passes;
  m->options.precision = p;
  m->int8 = precision_given == "int8";
  m->options.weight_only_int8_activations = !exact_weight_only;
  // Without VNNI: precision="int8" runs 8-bit-weight layers int8 (7-bit weights); else this CPU's int8 and fp32
  // rates decide (lower::int8_7bit_weights_by_default), as in the CLI.
  if (m->int8) m->options.int8_7bit_weights = true;
  if (dims) m->dims = *dims;
  {
    py::gil_scoped_release release;
    m->graph = ondine::onnx::load_model(path);
    try {
      bind_dims(m->graph, m->dims);
    } catch (Error& e) {
      e.in_file(path);
      throw;
    }
  }
  if (m->int8) check_int8_model(m->graph, path);
  const bool bounded = max_error || !samples.is_none();
  if (bounded && tune) throw Error("tune=True and max_error bound the precision two ways: give one").in_file(path);
  if (bounded) {
    // lower::compile_bf16_within: bf16, nodes kept fp32 worst first until the outputs on the samples are
    // within max_error of fp32 (`ondine run --precision bf16 --max-error E` does the same on its inputs).
    if (p == lower::Precision::Fp32)
      throw Error("max_error and samples bound the bf16 error: give precision='bf16' or 'auto'").in_file(path);
    if (samples.is_none()) throw Error("max_error needs samples=[feed dict, ...] to measure the error on").in_file(path);
    if (!symbolic_dims(m->graph).empty())
      throw Error("the bf16 error bound compiles one shape: bind the symbolic dims with dims={...}").in_file(path);
    auto feeds = to_samples(m->graph, samples, "sample");
    lower::Bf16BoundOptions bo;
    bo.max_error = max_error ? *max_error : 0.01;
    lower::Bf16BoundResult r;
    {
      py::gil_scoped_release release;
      try {
        check_supported(m->graph);
        r = lower::compile_bf16_within(m->graph, m->options, feeds, bo);
      } catch (Error& e) {
        e.in_file(path);
        throw;
      }
    }
    m->fixed = std::make_shared<const CompiledModel>(std::move(r.model));
    m->bound["max_error"] = bo.max_error;
    m->bound["error"] = r.error;
    m->bound["initial_error"] = r.initial_error;
    m->bound["met"] = r.met;
    m->bound["kept_fp32"] = r.kept;
    m->bound_kept = r.kept;
    m->bound_chose_fp32 = r.chose_fp32;
    return m;
  }
  py::gil_scoped_release release;
  try {
    if (tune) {  // lower/tune.hpp: the compiler's alternatives timed here; the precision too unless given
      if (!precision_given) m->options.precision = lower::Precision::Auto;
      // The tuner times one shape: dims the caller left symbolic at 1 (as an artifact packs them). Its choices
      // are the model's, so every shape the Model then runs compiles with them.
      Graph timed = m->graph.clone();
      std::map<std::string, std::int64_t> at;
      for (const std::string& symbol : symbolic_dims(timed)) at[symbol] = 1;
      bind_dims(timed, at);
      std::string bound;
      for (auto& [symbol, size] : at) bound += (bound.empty() ? "" : ", ") + symbol + "=1";
      lower::TuneResult r;
      try {
        r = lower::tune(timed, m->options);
      } catch (Error& e) {
        if (at.empty()) throw;
        Error with_hint(e.message() + " (tune=True timed the model at " + bound +
                        "; bind the symbolic dims to the shape to tune with dims={...})");
        if (!e.node().empty() || !e.op().empty()) with_hint.at_node(e.node(), e.op());
        throw with_hint;
      }
      m->options = r.options;
      m->tuned = r.text();
      for (const lower::TuneDecision& d : r.decisions)
        if (d.knob != "precision" && d.why != "set by the caller")
          m->tuned_choices += (m->tuned_choices.empty() ? "" : ",") + d.knob + "=" + d.value;
      if (!at.empty()) m->tuned = "timed at " + bound + " (dims left symbolic); its choices apply to every shape\n" + m->tuned;
    }
    m->cache = std::make_unique<lower::ShapeCache>(m->graph.clone(), m->options, cache_size);
    // Static shapes compile now, so compile() reports what cannot compile (ONNX Runtime's sessions do the
    // same); symbolic ones compile per input shape on first use.
    if (symbolic_dims(m->graph).empty() && m->cache->shape_input_names().empty()) m->cache->get(lower::ShapeCache::Binding{});
  } catch (Error& e) {
    e.in_file(path);
    throw;
  }
  return m;
}

// precision: the artifact's own (its variant's, with the nodes it keeps fp32) unless given.
std::shared_ptr<Model> load(const std::string& path, int threads, const std::optional<std::string>& precision,
                            std::size_t cache_size, const std::string& shape_plan) {
  const lower::ShapePlan plan = parse_shape_plan(shape_plan);
  auto m = std::make_shared<Model>();
  m->source = path;
  m->options.threads = threads;
  // (a plain pair, not std::optional: GCC 12 warns falsely that the optional's value may be uninitialized)
  const bool precision_given = precision.has_value();
  const lower::Precision given = precision_given ? parse_precision(*precision) : lower::Precision::Fp32;
  py::gil_scoped_release release;
  // The weights' checksum runs while the graph compiles; a damaged file is reported as such.
  artifact::Artifact a = lower::load_artifact(path, artifact::WeightCheck::Background);
  m->artifact = a.info;
  m->dims = a.packing_dims;
  m->graph = a.graph.clone();
  m->options = lower::artifact_options(m->options, a);
  if (precision_given) m->options.precision = given;
  m->options.shape_plan = plan;
  m->int8 = precision == "int8";
  if (m->int8) check_int8_model(a.graph, path);
  try {
    m->cache = std::make_unique<lower::ShapeCache>(std::move(a.graph), m->options, cache_size);
    if (symbolic_dims(m->graph).empty() && m->cache->shape_input_names().empty()) m->cache->get(lower::ShapeCache::Binding{});
  } catch (Error& e) {
    a.wait_checked();
    e.in_file(path);
    throw;
  }
  a.wait_checked();
  return m;
}

// An artifact of the model (docs/artifacts.md): the graph prepared and run through the pipeline with the
// pass options of this CPU's ISA, as `ondine compile MODEL -o OUT.ondine` writes it, in the model's precision
// (bf16: with the nodes kept fp32, by keep_fp32 or by the error bound; auto: what it chose).
void save(const Model& m, const std::string& path) {
  lower::Precision precision = lower::resolved_precision(m.options.precision);
  std::vector<std::string> keep_fp32 = m.options.keep_fp32;
  if (m.fixed) {
    if (m.bound_chose_fp32) precision = lower::Precision::Fp32;
    keep_fp32.insert(keep_fp32.end(), m.bound_kept.begin(), m.bound_kept.end());
  }
  if (precision == lower::Precision::Fp32) keep_fp32.clear();
  py::gil_scoped_release release;
  Graph g = m.graph.clone();
  std::string pipeline = "none";
  if (!m.artifact) {
    lower::prepare_for_passes(g);
    PassManager pm = make_pass_manager(m.options.passes);
    lower::set_isa_pass_options(pm, lower::effective_isa(),
                                m.options.int8_7bit_weights.value_or(lower::int8_7bit_weights_by_default()));
    try {
      pm.run(g);
    } catch (Error& e) {
      e.in_file(m.source);
      throw;
    }
    if (pm.size()) pipeline = pm.pipeline();
  } else {
    pipeline = m.artifact->passes;
  }
  artifact::Info info = lower::artifact_info(g, m.artifact ? m.artifact->source : m.source, pipeline, m.options.threads,
                                             lower::effective_isa(), precision);
  info.keep_fp32 = keep_fp32;
  info.ondine_version = ondine::version;
  info.tuned = m.artifact ? m.artifact->tuned : m.tuned_choices;  // the kernels chose here, applied at load
  lower::save_artifact(g, path, info, m.dims);
}

// ---- pickling ----

// A Model pickles as its compiled artifact (the bytes of the artifact it was loaded from, else save()'s), so
// that it can travel to other processes (Dask workers): unpickling loads it, checked for that CPU and oneDNN.
std::string temp_artifact_path() {
  static std::atomic<unsigned> counter{0};
  return (std::filesystem::temp_directory_path() /
          ("ondine-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".ondine"))
      .string();
}

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read the artifact to pickle").in_file(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

py::tuple model_state(const Model& m) {
  std::string bytes;
  if (m.artifact && std::filesystem::exists(m.source) && !m.fixed) {
    bytes = read_file_bytes(m.source);
  } else {
    const std::string tmp = temp_artifact_path();
    try {
      save(m, tmp);
      bytes = read_file_bytes(tmp);
    } catch (...) {
      std::filesystem::remove(tmp);
      throw;
    }
    std::filesystem::remove(tmp);
  }
  const std::string plan = m.options.shape_plan == lower::ShapePlan::PerShape    ? "per-shape"
                           : m.options.shape_plan == lower::ShapePlan::ShapeFree ? "shape-free"
                                                                                  : "auto";
  return py::make_tuple(py::bytes(bytes), m.source, m.options.threads, plan);
}

// The artifact bytes written to a file of this process's own, loaded (mapped) and the file removed: the
// mapping keeps the bytes. Errors name the model's source with "(pickled)".
std::shared_ptr<Model> model_from_state(const py::tuple& state) {
  if (state.size() != 4) throw Error("a pickled ondine.Model holds 4 fields, this one " + std::to_string(state.size()));
  const py::bytes data = state[0].cast<py::bytes>();
  const std::string source = state[1].cast<std::string>();
  const int threads = state[2].cast<int>();
  const std::string shape_plan = state[3].cast<std::string>();
  const std::string tmp = temp_artifact_path();
  {
    std::string_view view = data;
    std::ofstream out(tmp, std::ios::binary);
    out.write(view.data(), static_cast<std::streamsize>(view.size()));
    if (!out) throw Error("cannot write a temporary file to load the pickled artifact from").in_file(tmp);
  }
  try {
    std::shared_ptr<Model> m = load(tmp, threads, std::nullopt, 8, shape_plan);
    m->source = source + " (pickled)";
    std::filesystem::remove(tmp);
    return m;
  } catch (Error& e) {
    std::filesystem::remove(tmp);
    Error named(e.message());
    if (!e.node().empty() || !e.op().empty()) named.at_node(e.node(), e.op());
    throw named.in_file(source + " (pickled)");
  }
}

// ---- generate ----

// ondine.generate: runtime/generate.hpp's loop on a compiled decoder, the GIL released while it runs (an
// on_token callback takes it back for each token).
py::dict generate_tokens(const Model& m, py::handle input_ids, std::int64_t max_new_tokens, float temperature,
                  std::int64_t top_k, float top_p, std::uint64_t seed, std::optional<std::int64_t> eos_token_id,
                  py::object on_token) {
  std::vector<std::string> names, shapes, outputs;
  for (const Value* v : m.graph.inputs()) {
    names.push_back(v->name());
    shapes.push_back(v->shape().str());
  }
  for (const Value* v : m.graph.outputs()) outputs.push_back(v->name());
  DecoderSignature sig = decoder_signature(names, shapes, outputs);
  py::array_t<std::int64_t, py::array::c_style | py::array::forcecast> ids(py::reinterpret_borrow<py::object>(input_ids));
  if (ids.ndim() > 2 || (ids.ndim() == 2 && ids.shape(0) != 1))
    throw Error("generate: input_ids must be 1-D or [1, n] (one sequence)");
  std::vector<std::int64_t> prompt(ids.data(), ids.data() + ids.size());
  GenerateOptions o;
  o.max_new_tokens = max_new_tokens;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.seed = seed;
  o.eos_token_id = eos_token_id;
  if (!on_token.is_none())
    o.on_token = [&on_token](std::int64_t token) {
      py::gil_scoped_acquire gil;
      py::object keep = on_token(token);
      return keep.is_none() || keep.cast<bool>();
    };
  GenerateResult r;
  {
    py::gil_scoped_release release;
    try {
      r = ondine::generate([&](const std::map<std::string, Tensor>& feeds) { return m.run(feeds); }, sig, prompt, o);
    } catch (Error& e) {
      e.in_file(m.source);
      throw;
    }
  }
  py::dict out;
  out["tokens"] = py::array_t<std::int64_t>(static_cast<py::ssize_t>(r.tokens.size()), r.tokens.data());
  out["prompt_ms"] = r.prompt_s * 1e3;
  std::vector<double> ms;
  for (double s : r.step_s) ms.push_back(s * 1e3);
  out["token_ms"] = ms;
  out["tokens_per_s"] = r.tokens_per_s();
  return out;
}

// ---- quantize ----

// `ondine quantize` with its calibration samples from a Python iterable (examples/cli/quantize.hpp):
// fp32 pre-passes, calibration on the reference executor, QDQ, and with max_error the fallback that keeps
// layers fp32, worst first, until the bound holds (quant::quantize_with_fallback) on the first
// `max_error_samples` samples. Not met: an Error, nothing written.
py::dict quantize(const std::string& model, py::object calibration, const std::string& output,
                  std::optional<double> max_error, const std::string& method, const std::string& activations,
                  std::size_t max_samples, const std::vector<std::string>& include,
                  const std::vector<std::string>& exclude, bool keep_fp32_ends, bool reduce_range,
                  const std::string& passes, std::size_t max_error_samples, std::size_t max_fallback,
                  std::optional<std::string> weights, std::int64_t block_size, bool symmetric, bool lm_head,
                  bool embeddings) {
  if (weights) {  // weight-only: no calibration (quant/weight_only.hpp)
    if (!calibration.is_none() || max_error || keep_fp32_ends || reduce_range || !include.empty())
      throw Error("weights= quantizes weights only, without calibration: calibration, max_error, keep_fp32_ends, "
                  "reduce_range and include do not apply");
    if (*weights != "int4" && *weights != "int8") throw Error("weights must be 'int4' or 'int8', not '" + *weights + "'");
    quant::WeightOnlyOptions o;
    o.bits = *weights == "int4" ? 4 : 8;
    o.block_size = block_size;
    o.symmetric = symmetric;
    o.lm_head = lm_head;
    o.embeddings = embeddings;
    o.exclude = exclude;
    quant::WeightOnlyReport report;
    {
      py::gil_scoped_release release;
      Graph g = ondine::onnx::load_model(model);
      check_supported(g);
      try {
        report = quant::quantize_weights(g, o);
      } catch (Error& e) {
        e.in_file(model);
        throw;
      }
      if (report.quantized.empty())
        throw Error("no MatMul with float32 constant weights of at least block_size rows to quantize; nothing written")
            .in_file(model);
      ondine::onnx::save_model(g, output);
    }
    py::list layers, skipped;
    for (const auto& l : report.quantized)
      layers.append(py::dict(py::arg("node") = l.node, py::arg("op") = l.op, py::arg("shape") = py::make_tuple(l.rows, l.cols),
                             py::arg("bytes_before") = l.bytes_before, py::arg("bytes_after") = l.bytes_after));
    for (const auto& [node, why] : report.skipped) skipped.append(py::make_tuple(node, why));
    py::dict out;
    out["quantized"] = layers;
    out["skipped"] = skipped;
    out["bytes_before"] = report.bytes_before();
    out["bytes_after"] = report.bytes_after();
    return out;
  }
  if (calibration.is_none()) throw Error("calibration= is required (or weights='int4'|'int8': weight-only)");
  quant::CalibrationOptions copts;
  quant::QuantizeOptions qopts;
  copts.activations.method = quant::parse_range_method(method);
  qopts.activations = quant::detail::qdq::parse_activation_type(activations);
  PassManager pm = make_pass_manager(passes);
  for (auto& entry : PassManager::parse_pipeline(expand_pipeline(passes)))
    if (entry.first == "quantize" || entry.first == "fuse" || entry.first == "layout")
      throw Error("passes '" + passes + "': pass '" + entry.first + "' does not belong before calibration "
                  "(quantization wants the fp32 graph with plain Conv/Relu/Add)");
  if (max_error && (!(*max_error >= 0) || !std::isfinite(*max_error)))
    throw Error("max_error must be a finite number >= 0, got " + std::to_string(*max_error));
  if (max_error && max_error_samples == 0) throw Error("max_error_samples must be at least 1");
  copts.activation_scheme.dtype = qopts.activations;
  copts.max_samples = max_samples;
  qopts.include = include;
  qopts.exclude = exclude;
  qopts.keep_fp32_ends = keep_fp32_ends;
  qopts.reduce_range_weights = reduce_range;

  py::iterator samples = py::iter(calibration);  // a TypeError when it is not iterable
  Graph g;
  quant::CalibrationResult calib;
  std::vector<quant::Sample> kept;  // the first samples, for the error bound
  std::size_t drawn = 0;
  {
    py::gil_scoped_release release;
    g = ondine::onnx::load_model(model);
    check_supported(g);
    try {
      pm.run(g);
    } catch (Error& e) {
      e.in_file(model);
      throw;
    }
    // Each sample: a feed dict, or an array for a model with one input.
    quant::SampleSource next = [&]() -> std::optional<quant::Sample> {
      py::gil_scoped_acquire gil;
      py::object item = py::reinterpret_steal<py::object>(PyIter_Next(samples.ptr()));
      if (!item) {
        if (PyErr_Occurred()) throw py::error_already_set();
        return std::nullopt;
      }
      quant::Sample s;
      try {
        if (!py::isinstance<py::dict>(item) && g.inputs().size() == 1) s[g.inputs()[0]->name()] = to_tensor(*g.inputs()[0], item);
        else s = to_feeds(g, item);
      } catch (Error& e) {
        throw Error("calibration sample " + std::to_string(drawn + 1) + ": " + e.what());
      }
      ++drawn;
      if (max_error && kept.size() < max_error_samples) kept.push_back(s);
      return s;
    };
    try {
      calib = quant::calibrate(g, next, copts);
    } catch (Error& e) {
      e.in_file(model);
      throw;
    }
  }
  py::dict out;
  quant::QuantizeReport report;
  {
    py::gil_scoped_release release;
    try {
      if (max_error) {
        quant::FallbackOptions fo;
        fo.max_error = *max_error;
        fo.max_fallbacks = max_fallback;
        quant::FallbackResult r = quant::quantize_with_fallback(g, calib, qopts, kept, fo);
        if (!r.met)
          throw Error("max_error " + std::to_string(*max_error) + " not met: the error is still " +
                      std::to_string(r.error) + " with " + std::to_string(r.steps.size()) + " layer(s) kept fp32. " +
                      "Nothing written");
        g = std::move(r.graph);
        report = r.report;
        py::gil_scoped_acquire gil;
        out["error"] = r.error;
        out["initial_error"] = r.initial_error;
        py::list fp32;
        for (const quant::FallbackStep& s : r.steps) fp32.append(s.layer.node);
        out["kept_fp32"] = fp32;
      } else {
        report = quant::quantize_qdq(g, calib, qopts);
      }
    } catch (Error& e) {
      e.in_file(model);
      throw;
    }
    ondine::onnx::save_model(g, output);
  }
  out["output"] = output;
  out["samples"] = calib.samples;
  out["nodes"] = g.num_nodes();
  out["quantized"] = report.quantized();
  py::list fp32;
  for (const quant::QuantizeDecision& d : report.nodes)
    if (!d.quantized) fp32.append(py::make_tuple(d.node, d.op, d.reason));
  out["fp32_nodes"] = fp32;
  out["report"] = report.to_text();
  return out;
}

// ---- inspect ----

// What `ondine inspect --json MODEL` reports (examples/cli/inspect.hpp, cmd_inspect), as a dict. FLOPs need
// numbers: symbolic dims not in `dims` count as 1, and "defaulted_dims" names them.
py::dict inspect(const std::string& path, std::map<std::string, std::int64_t> dims) {
  Graph g;
  std::optional<artifact::Info> info;
  GraphStats stats;
  std::vector<std::string> defaulted;
  std::map<std::string, std::vector<std::string>> unsupported;
  {
    py::gil_scoped_release release;
    if (artifact::is_artifact(path)) {
      artifact::Artifact a = lower::load_artifact(path);
      info = a.info;
      g = std::move(a.graph);
    } else {
      g = ondine::onnx::load_model(path);
    }
    for (const std::string& sym : symbolic_dims(g))
      if (dims.emplace(sym, 1).second) defaulted.push_back(sym);
    Graph bound = g.clone();
    try {
      bind_dims(bound, dims);
    } catch (Error& e) {
      e.in_file(path);
      throw;
    }
    stats = graph_stats(bound);
    for (const Node* n : unsupported_nodes(g)) unsupported[n->op_key()].push_back(n->name());
  }
  std::map<std::string, std::size_t> ops;
  for (const Node* n : g.nodes()) ++ops[n->op_key()];
  py::dict out;
  out["model"] = path;
  out["opset"] = g.opset();
  out["nodes"] = g.num_nodes();
  out["inputs"] = signature(g.inputs());
  out["outputs"] = signature(g.outputs());
  out["ops"] = ops;
  out["parameters"] = stats.parameters;
  out["parameter_bytes"] = stats.parameter_bytes;
  out["flops"] = stats.flops ? py::object(py::float_(*stats.flops)) : py::object(py::none());
  out["flops_by_op"] = stats.flops_by_op;
  out["dims"] = dims;
  out["defaulted_dims"] = defaulted;
  out["symbolic_dims"] = symbolic_dims(g);
  out["unsupported_ops"] = unsupported;
  if (info) {
    py::dict a;
    a["source"] = info->source;
    a["isa"] = info->isa;
    a["precision"] = info->precision;
    a["keep_fp32"] = info->keep_fp32;
    a["tuned"] = info->tuned;
    a["passes"] = info->passes;
    a["threads"] = info->threads;
    a["onednn_version"] = info->onednn_version;
    a["ondine_version"] = info->ondine_version;
    out["artifact"] = a;
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(ondine, mod) {
  mod.doc() = "Ondine: an ONNX graph compiler for CPU inference on oneDNN (docs/python.md)";
  mod.attr("__version__") = ondine::version;
  ondine::lower::register_quantization_passes();  // pipelines the module parses may name quantize(-dynamic)

  // ondine::Error -> ondine.Error(what()), with the context as attributes. The type lives as long as the
  // module (pybind11's documented pattern for a custom exception).
  static py::exception<Error> error_type(mod, "Error", PyExc_RuntimeError);
  g_error_type = error_type;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object err = py::handle(error_type.ptr())(e.what());
      err.attr("message") = e.message();
      err.attr("file") = e.file();
      err.attr("node") = e.node();
      err.attr("op") = e.op();
      PyErr_SetObject(error_type.ptr(), err.ptr());
    }
  });

  py::class_<runtime::KvCache>(mod, "KvCache",
                               "A decoder's past/present tensors in buffers of a fixed capacity (Model.kv_cache): "
                               "each run with it appends the step's positions in place")
      .def_property_readonly("length", &runtime::KvCache::length, "positions held (the next step's past length)")
      .def_property_readonly("capacity", &runtime::KvCache::capacity, "positions it can hold")
      .def_property_readonly("pairs", [](const runtime::KvCache& c) {
             py::list out;
             for (const auto& p : c.pairs()) out.append(py::make_tuple(p.past, p.present));
             return out;
           }, "[(past input, present output)]")
      .def("reset", &runtime::KvCache::reset, "forget the sequence: the next run starts with empty pasts")
      .def("present", [](const runtime::KvCache& c, const std::string& name) {
             return to_array(c.present(name), name);
           }, py::arg("name"), "a copy of a present output (or past input) as the model computes it: length positions")
      .def("__repr__", [](const runtime::KvCache& c) {
        return "<ondine.KvCache " + std::to_string(c.pairs().size()) + " pairs, " + std::to_string(c.length()) + "/" +
               std::to_string(c.capacity()) + " positions>";
      });
  py::class_<Model, std::shared_ptr<Model>>(mod, "Model",
                                            "A compiled model: compile() or load() make one. Thread-safe: run it "
                                            "from several threads at once.")
      .def_property_readonly("inputs", [](const Model& m) { return signature(m.graph.inputs()); },
                             "[(name, dtype, shape)]: symbolic dims as str")
      .def_property_readonly("outputs", [](const Model& m) { return signature(m.graph.outputs()); },
                             "[(name, dtype, shape)]: symbolic dims as str")
      .def_property_readonly("source", [](const Model& m) { return m.source; })
      .def_property_readonly("precision", &Model::precision)
      .def_property_readonly("threads", [](const Model& m) { return m.options.threads; })
      .def_property_readonly("compilations",
                             [](const Model& m) { return m.cache ? m.cache->compilations() : std::size_t{1}; },
                             "how many input shapes were compiled so far (0 with the shape-free plan)")
      .def_property_readonly("shape_plan",
                             [](const Model& m) { return m.cache ? m.cache->shape_plan_reason() : std::string("one shape"); },
                             "how shapes are run: 'shape-free: ...' (compiled once for any shape) or 'one plan per shape: "
                             "<why>'")
      .def_property_readonly("tuned", [](const Model& m) { return m.tuned; },
                             "compile(..., tune=True): each kernel choice the tuner kept, with its timings ('' without)")
      .def_property_readonly("error_bound", [](const Model& m) { return m.bound; },
                             "precision bf16/auto with max_error: the error, and the nodes kept fp32")
      .def("run", &run_dict, py::arg("input_feed"), py::kw_only(), py::arg("kv_cache") = py::none(),
           "run({name: array}) -> {output name: array}; kv_cache=Model.kv_cache(...): the cache gives the past_* "
           "inputs and keeps the present_* outputs (not returned), each step appending its positions in place")
      .def("run", &run_list, py::arg("output_names"), py::arg("input_feed"),
           "run(output_names, {name: array}) -> [array], in that order; None: every output")
      .def("kv_cache", [](const Model& m, std::int64_t capacity, py::object dims) {
             if (m.fixed || !m.cache) throw Error("a KV cache needs the shape-free plan; this model runs one fixed plan");
             std::map<std::string, std::int64_t> d;
             if (!dims.is_none()) d = dims.cast<std::map<std::string, std::int64_t>>();
             try {
               return m.cache->make_kv_cache(capacity, d);
             } catch (Error& e) {
               e.in_file(m.source);
               throw;
             }
           }, py::arg("capacity"), py::kw_only(), py::arg("dims") = py::none(),
           "kv_cache(capacity, dims={'batch': 1}) -> KvCache: buffers of `capacity` positions for the model's "
           "past/present pairs (a decoder's KV cache), for run(..., kv_cache=) and run_into(..., kv_cache=)")
      .def("run_into", &run_into, py::arg("input_feed"), py::arg("outputs"), py::kw_only(),
           py::arg("kv_cache") = py::none(),
           "run_into({name: array}, {output name: array}) -> {output name: array}: the named outputs written into "
           "the given arrays (C-contiguous, writeable, the output's dtype, at least its size; returned as views of "
           "them with the output's shape), as ONNX Runtime's IOBinding")
      .def("run_reference", [](const Model& m, py::handle feeds) {
             // The oracle: the graph as imported (dims bound) on the reference executor, no passes.
             std::map<std::string, Tensor> inputs = to_feeds(m.graph, feeds);
             std::map<std::string, Tensor> outputs;
             {
               py::gil_scoped_release release;
               try {
                 outputs = ReferenceExecutor(m.graph).run(inputs);
               } catch (Error& e) {
                 e.in_file(m.source);
                 throw;
               }
             }
             py::dict out;
             for (const Value* o : m.graph.outputs()) out[py::str(o->name())] = to_array(std::move(outputs.at(o->name())), o->name());
             return out;
           }, py::arg("input_feed"), "the same run on Ondine's reference executor (slow; the oracle of its tests)")
      .def("save", &save, py::arg("path"), "write a compiled artifact (.ondine) that ondine.load() reads")
      .def("run_many", &run_many, py::arg("feeds"), py::kw_only(), py::arg("streams") = 0, py::arg("threads") = 0,
           py::arg("pin") = true, py::arg("errors") = "raise",
           "run_many([{name: array}, ...], streams=N, threads=T) -> [{output name: array}, ...] in order: the feeds "
           "run from N streams (0: one per thread) sharing T threads (0: the model's, else every core), each pinned "
           "to cores of its own, the GIL released. errors='raise' (the first failure, naming its request) or "
           "'return' (a failed feed's entry is its ondine.Error; the others complete)")
      .def(py::pickle(&model_state, &model_from_state))  // as its compiled artifact, checked where unpickled
      .def("_time_native", [](const Model& m, py::handle feeds, int runs) {
             // The C++ call alone, for bench/python_overhead.py: `runs` calls of the same run, no conversion.
             std::map<std::string, Tensor> inputs = to_feeds(m.graph, feeds);
             std::vector<double> ms;
             py::gil_scoped_release release;
             for (int i = 0; i < runs; ++i) {
               auto t0 = std::chrono::steady_clock::now();
               m.run(inputs);
               ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
             }
             return ms;
           }, py::arg("input_feed"), py::arg("runs"))
      .def("__repr__", [](const Model& m) {
        return "<ondine.Model '" + m.source + "' " + m.precision() + ", inputs: " + names_of(m.graph.inputs()) +
               "; outputs: " + names_of(m.graph.outputs()) + ">";
      });

  mod.def("compile", &compile, py::arg("path"), py::kw_only(), py::arg("precision") = py::none(),
          py::arg("dims") = py::none(), py::arg("threads") = 0, py::arg("passes") = "default",
          py::arg("max_error") = py::none(), py::arg("samples") = py::none(), py::arg("cache_size") = 8,
          py::arg("shape_plan") = "auto", py::arg("tune") = false, py::arg("exact_weight_only") = false,
          "Compile an ONNX model (or load an artifact). precision: 'fp32' (default; an artifact: its own), 'bf16' "
          "(native bf16 CPUs), 'auto', or 'int8' (a quantized model, ondine.quantize: its int8 layers, fp32 "
          "elsewhere; a float model is refused); "
          "dims binds symbolic dims (others specialise per call); threads 0: OpenMP's default; passes: a "
          "pipeline string. max_error with samples=[feed, ...]: bf16 with nodes kept fp32 until within the bound. "
          "shape_plan: 'auto' (symbolic dims of a transformer: compiled once for any shape), 'per-shape', 'shape-free'. "
          "tune=True: time the compiler's alternatives on this CPU (dims left symbolic at 1) and keep the fastest (Model.tuned "
          "says what), cached per model and machine (ONDINE_TUNE_CACHE). exact_weight_only=True: weight-only "
          "quantized layers (4- or 8-bit weights) multiply float32 activations, the file's own arithmetic (ONNX "
          "Runtime's MatMulNBits accuracy level 0), instead of int8 ones per block (the default, level 4).");
  mod.def("load", &load, py::arg("path"), py::kw_only(), py::arg("threads") = 0, py::arg("precision") = py::none(),
          py::arg("cache_size") = 8, py::arg("shape_plan") = "auto",
          "Load a compiled artifact (Model.save, `ondine compile -o MODEL.ondine`); precision: the artifact's own "
          "unless given ('fp32', 'bf16', 'auto': its weights are packed again; 'int8': a quantized artifact's own).");
  mod.def("quantize", &quantize, py::arg("model"), py::kw_only(), py::arg("calibration") = py::none(), py::arg("output"),
          py::arg("max_error") = py::none(), py::arg("method") = "minmax", py::arg("activations") = "u8",
          py::arg("max_samples") = 0, py::arg("include") = std::vector<std::string>{},
          py::arg("exclude") = std::vector<std::string>{}, py::arg("keep_fp32_ends") = false,
          py::arg("reduce_range") = false, py::arg("passes") = "remove-identity,fold-constants,dce,fold-bn",
          py::arg("max_error_samples") = 8, py::arg("max_fallback") = 0, py::arg("weights") = py::none(),
          py::arg("block_size") = 32, py::arg("symmetric") = true, py::arg("lm_head") = true, py::arg("embeddings") = false,
          "Post-training int8: calibrate on an iterable of feed dicts (or arrays, one-input models), write a QDQ "
          "ONNX model; max_error keeps layers fp32 until every output is within it. weights='int4'|'int8': weight-only "
          "quantization of the MatMul weights in blocks of block_size along K, no calibration, written in opset 21. "
          "Returns a report dict.");
  mod.def("generate", &generate_tokens, py::arg("model"), py::arg("input_ids"), py::kw_only(), py::arg("max_new_tokens") = 32,
          py::arg("temperature") = 0.0f, py::arg("top_k") = 0, py::arg("top_p") = 1.0f, py::arg("seed") = 0,
          py::arg("eos_token_id") = py::none(), py::arg("on_token") = py::none(),
          "Generate token ids with a compiled decoder (input_ids, attention_mask, position_ids, past_*/present_*, "
          "logits): the prompt, then one token per run. temperature 0: greedy; else sampled within top_k and top_p "
          "(seeded). on_token(id) is called per token; returning False stops. Returns {'tokens', 'prompt_ms', "
          "'token_ms', 'tokens_per_s'}.");
  mod.def("inspect", &inspect, py::arg("path"), py::kw_only(),
          py::arg("dims") = std::map<std::string, std::int64_t>{},
          "Inputs, outputs, op histogram, parameter count and FLOPs of a model (ONNX or artifact), as a dict.");
}
