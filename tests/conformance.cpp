// The ONNX backend conformance suite (Debian's libonnx-testdata) on the reference executor.
//
//   ondine_conformance DATA_DIR [--filter REGEX] [--verbose] [--exceptions FILE] [--compiled]
//
// Every case under DATA_DIR/{node,pytorch-converted,pytorch-operator,simple} whose ops are all
// supported is imported, run on every test_data_set_*, and compared with the expected outputs
// (ONNX's backend tolerances: rtol 1e-3, atol 1e-7; integers and bools exact; NaN equals NaN).
// The inferred output shapes must also agree with what the kernels produce. A case with an
// unsupported op or opset is skipped. Known exceptions (a file of "case_name  # reason" lines) still
// run; they are reported as skipped-known when they fail, and as an error when they start passing
// (except those whose reason says "random output": a random op's draw may match by chance). With an
// exceptions file, every skipped case must be listed in it too, with its reason (the training ops of
// ai.onnx.preview.training): a skip not listed is an error, and a listed one that starts passing is too.
// Exit status 1 when any case fails.
//
// --compiled runs each case on the compiled engine (ondine::lower::compile, oneDNN where a lowering
// takes the node) instead of the reference executor, with the graph's symbolic dims bound from each
// data set's inputs, and the inputs that decide shapes (a Reshape's shape given as a graph input) bound to
// their values, as lower::ShapeCache does; a case whose shapes still depend on data fails (and is listed in
// the compiled exceptions file, with its reason).
// With --verbose it lists each passing case's steps as op=implementation.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "onnx/onnx_pb.h"
#include "ondine/onnx/data.hpp"
#include "ondine/lower/lower.hpp"
#include "ondine/ondine.hpp"

namespace fs = std::filesystem;
using namespace ondine;

namespace {

struct Options {
  fs::path root;
  std::string filter;
  bool verbose = false;
  fs::path exceptions;
  bool compiled = false;  // run on lower::compile's engine instead of the reference executor
};

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// A stored value, read as the kind `like` declares (a TensorProto, SequenceProto or OptionalProto).
NamedTensor read_pb(const fs::path& path, const Value* like) {
  NamedTensor t;
  t.tensor = ondine::onnx::read_value_pb(path.string(), like ? like->kind() : ValueKind::Tensor,
                                         like ? like->dtype() : DType::Undefined, &t.name);
  return t;
}

// Empty string when equal, else what differs; sequences element by element.
std::string compare(const Tensor& got, const Tensor& want, double rtol, double atol) {
  if (got.kind() != want.kind() || got.is_none())
    return got.kind() == want.kind() ? "" : "a different kind of value (tensor, sequence or none)";
  if (got.is_sequence()) {
    if (got.items().size() != want.items().size())
      return std::to_string(got.items().size()) + " elements, expected " + std::to_string(want.items().size());
    for (std::size_t i = 0; i < got.items().size(); ++i)
      if (std::string d = compare(got.items()[i], want.items()[i], rtol, atol); !d.empty())
        return "element #" + std::to_string(i) + ": " + d;
    return "";
  }
  if (got.dtype() != want.dtype())
    return "dtype " + std::string(dtype_name(got.dtype())) + ", expected " + std::string(dtype_name(want.dtype()));
  if (got.dims() != want.dims()) return "shape " + dims_str(got.dims()) + ", expected " + dims_str(want.dims());
  if (got.dtype() == DType::String) {
    for (std::size_t i = 0; i < got.strings().size(); ++i)
      if (got.strings()[i] != want.strings()[i])
        return "element " + std::to_string(i) + ": got '" + got.strings()[i] + "', expected '" + want.strings()[i] + "'";
    return "";
  }
  bool exact = !is_floating(got.dtype());
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    double a = got.at_double(static_cast<std::size_t>(i)), b = want.at_double(static_cast<std::size_t>(i));
    if (std::isnan(a) && std::isnan(b)) continue;
    if (exact ? a != b : !(std::abs(a - b) <= atol + rtol * std::abs(b)) && a != b)
      return "element " + std::to_string(i) + ": got " + std::to_string(a) + ", expected " + std::to_string(b);
  }
  return "";
}

// The backend data stores bfloat16 tensors as their uint16 bits (numpy has no bfloat16): reinterpret
// them when the model says bfloat16.
Tensor as_bfloat16_if_bits(const Tensor& t, DType expected) {
  if (expected != DType::BFloat16 || t.dtype() != DType::UInt16) return t;
  Tensor out(DType::BFloat16, t.dims());
  if (t.nbytes()) std::memcpy(out.raw(), t.raw(), t.nbytes());
  return out;
}

// Op types of a model read straight from protobuf, for cases the importer rejects; a model whose
// graph inputs or outputs are strings reports the pseudo-op "string-tensors".
std::set<std::string> model_ops(const fs::path& model) {
  std::ifstream f(model, std::ios::binary);
  ::onnx::ModelProto proto;
  std::set<std::string> ops;
  if (!f || !proto.ParseFromIstream(&f)) return ops;
  for (auto& n : proto.graph().node())
    ops.insert((n.domain().empty() || n.domain() == "ai.onnx" ? "" : n.domain() + ".") + n.op_type());
  for (const auto* list : {&proto.graph().input(), &proto.graph().output()})
    for (auto& v : *list)
      if (v.type().tensor_type().elem_type() == ::onnx::TensorProto::STRING) ops.insert("string-tensors");
  return ops;
}

enum class Outcome { Pass, Fail, Skip };

struct CaseResult {
  Outcome outcome;
  std::string reason;  // failure reason, or the unsupported ops for a skip
  std::string steps;   // --compiled: the steps as op=implementation
};

// The graph compiled for one data set: its symbolic dims bound from the inputs' shapes.
CompiledModel compile_for(const Graph& g, const std::map<std::string, Tensor>& inputs) {
  std::map<std::string, std::int64_t> binding;
  for (Value* in : g.inputs()) {
    auto it = inputs.find(in->name());
    if (it == inputs.end() || !in->shape().rank_known() || in->shape().rank() != it->second.rank()) continue;
    for (std::size_t d = 0; d < in->shape().rank(); ++d)
      if (!in->shape()[d].is_static() && !in->shape()[d].symbol.empty())
        binding[in->shape()[d].symbol] = it->second.dims()[d];
  }
  Graph bound = g.clone();
  bind_dims(bound, binding);
  bind_shape_inputs(bound, inputs);  // a Reshape's shape given as an input: compiled for this value
  return lower::compile(bound);
}

CaseResult run_case(const fs::path& dir, bool compiled) {
  Graph g;
  try {
    g = ondine::onnx::load_model((dir / "model.onnx").string());
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.find("unsupported opset") != std::string::npos) return {Outcome::Skip, "opset"};
    for (const auto& op : model_ops(dir / "model.onnx"))
      if (op.find('.') != std::string::npos || op == "string-tensors" || !is_supported_op("", op))
        return {Outcome::Skip, op};
    return {Outcome::Fail, "import: " + msg};
  }
  if (auto bad = unsupported_nodes(g); !bad.empty()) {
    std::set<std::string> ops;
    for (auto* n : bad) ops.insert((n->domain().empty() ? "" : n->domain() + ".") + n->op_type());
    std::string s;
    for (auto& op : ops) s += (s.empty() ? "" : ",") + op;
    return {Outcome::Skip, s};
  }
  // A tensor of unknown element type cannot be read (a sequence or optional may have an element type that
  // only its data tells).
  for (const auto* list : {&g.inputs(), &g.outputs()})
    for (Value* v : *list)
      if (v->dtype() == DType::Undefined && v->is_tensor()) return {Outcome::Skip, "non-numeric-types"};
  std::vector<fs::path> sets;
  for (auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) return {Outcome::Fail, "no test_data_set_* folders"};
  std::string steps;
  try {
    ReferenceExecutor exec(g);
    for (auto& set : sets) {
      std::map<std::string, Tensor> inputs;
      for (std::size_t i = 0; fs::exists(set / ("input_" + std::to_string(i) + ".pb")); ++i) {
        NamedTensor t = read_pb(set / ("input_" + std::to_string(i) + ".pb"),
                                i < g.inputs().size() ? g.inputs()[i] : nullptr);
        Value* by_name = t.name.empty() ? nullptr : g.find_value(t.name);
        std::string name = by_name && by_name->is_graph_input() ? t.name
                           : i < g.inputs().size()               ? g.inputs()[i]->name()
                                                                 : t.name;
        Value* declared = g.find_value(name);
        inputs[name] = as_bfloat16_if_bits(t.tensor, declared ? declared->dtype() : DType::Undefined);
      }
      std::map<std::string, Tensor> outputs;
      if (compiled) {
        std::optional<CompiledModel> model;
        try {
          model.emplace(compile_for(g, inputs));
        } catch (const Error& e) {
          // Shapes that depend on data: a failure like any other, to be listed with its reason.
          return {Outcome::Fail, std::string("not compilable: ") + e.what()};
        }
        outputs = model->run(inputs);
        steps.clear();
        for (auto& s : model->steps()) steps += " " + s.op + "=" + s.implementation;
      } else {
        outputs = exec.run(inputs);
      }
      for (std::size_t i = 0; fs::exists(set / ("output_" + std::to_string(i) + ".pb")); ++i) {
        if (i >= g.outputs().size()) return {Outcome::Fail, "more expected outputs than graph outputs"};
        Value* out = g.outputs()[i];
        NamedTensor want = read_pb(set / ("output_" + std::to_string(i) + ".pb"), out);
        const Tensor& got = outputs.at(out->name());
        std::string diff = compare(got, as_bfloat16_if_bits(want.tensor, got.dtype()), 1e-3, 1e-7);
        if (!diff.empty()) return {Outcome::Fail, set.filename().string() + " output '" + out->name() + "': " + diff};
        // Shape inference must agree with the kernels wherever it claims to know a dim (of a sequence:
        // every element's).
        const Shape& inferred = out->shape();
        std::vector<Tensor> produced = got.is_sequence() ? got.items() : std::vector<Tensor>{got};
        if (got.is_none()) produced.clear();
        for (const Tensor& p : produced) {
          if (!inferred.rank_known()) break;
          bool ok = inferred.rank() == p.rank();
          for (std::size_t d = 0; ok && d < inferred.rank(); ++d)
            ok = !inferred[d].is_static() || inferred[d].value == p.dims()[d];
          if (!ok)
            return {Outcome::Fail, "shape inference gave " + inferred.str() + " for '" + out->name() +
                                       "', the kernel produced " + dims_str(p.dims())};
        }
        if (!out->is_tensor() && (got.is_sequence() ? !is_sequence_kind(out->kind()) : got.is_none() && !is_optional_kind(out->kind())))
          return {Outcome::Fail, "type inference gave " + Graph::value_type_str(out) + " for '" + out->name() + "'"};
        if (out->dtype() != DType::Undefined && !got.is_none() && out->dtype() != got.dtype())
          return {Outcome::Fail, "type inference gave " + std::string(dtype_name(out->dtype())) + " for '" +
                                     out->name() + "', the kernel produced " + std::string(dtype_name(got.dtype()))};
      }
    }
  } catch (const std::exception& e) {
    return {Outcome::Fail, e.what()};
  }
  return {Outcome::Pass, "", steps};
}

std::map<std::string, std::string> read_exceptions(const fs::path& file) {
  std::map<std::string, std::string> out;
  if (file.empty()) return out;
  std::ifstream f(file);
  std::string line;
  while (std::getline(f, line)) {
    auto hash = line.find('#');
    std::string name = line.substr(0, line.find_first_of(" \t#"));
    if (!name.empty()) out[name] = hash == std::string::npos ? "" : line.substr(hash + 1);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--filter" && i + 1 < argc) opt.filter = argv[++i];
    else if (a == "--verbose") opt.verbose = true;
    else if (a == "--exceptions" && i + 1 < argc) opt.exceptions = argv[++i];
    else if (a == "--compiled") opt.compiled = true;
    else if (a.rfind("--", 0) == 0) {
      std::cerr << "usage: ondine_conformance DATA_DIR [--filter REGEX] [--verbose] [--exceptions FILE] [--compiled]\n";
      return 2;
    } else opt.root = a;
  }
  if (opt.root.empty() || !fs::is_directory(opt.root)) {
    std::cerr << "ondine_conformance: data folder '" << opt.root.string()
              << "' not found (install Debian's libonnx-testdata)\n";
    return 2;
  }
  if (opt.exceptions.empty()) {
    fs::path beside = fs::path(argv[0]).parent_path() / "conformance_exceptions.txt";
    if (fs::exists(beside)) opt.exceptions = beside;
  }
  auto exceptions = read_exceptions(opt.exceptions);
  std::regex filter(opt.filter.empty() ? ".*" : opt.filter);
  std::size_t passed = 0, failed = 0, skipped = 0, known = 0;
  std::map<std::string, std::size_t> skipped_ops;
  auto start = std::chrono::steady_clock::now();
  for (const char* suite : {"node", "pytorch-converted", "pytorch-operator", "simple"}) {
    fs::path dir = opt.root / suite;
    if (!fs::is_directory(dir)) continue;
    std::vector<fs::path> cases;
    for (auto& e : fs::directory_iterator(dir))
      if (fs::exists(e.path() / "model.onnx") && std::regex_search(e.path().filename().string(), filter))
        cases.push_back(e.path());
    std::sort(cases.begin(), cases.end());
    for (auto& c : cases) {
      std::string name = c.filename().string();
      CaseResult r = run_case(c, opt.compiled);
      bool is_known = exceptions.count(name) != 0;
      switch (r.outcome) {
        case Outcome::Pass:
          if (is_known && exceptions[name].find("random output") != std::string::npos) {
            // A random op's draw can match the expected values by chance: neither a pass nor news.
            ++known;
            if (opt.verbose) std::cout << "known " << suite << "/" << name << " (passed by chance):" << exceptions[name] << "\n";
          } else if (is_known) {
            ++failed;
            std::cout << "UNEXPECTED PASS " << suite << "/" << name << " (listed as a known exception)\n";
          } else {
            ++passed;
            if (opt.verbose) std::cout << "pass " << suite << "/" << name << (r.steps.empty() ? "" : ":") << r.steps << "\n";
          }
          break;
        case Outcome::Fail:
          if (is_known) {
            ++known;
            if (opt.verbose) std::cout << "known " << suite << "/" << name << ":" << exceptions[name] << "\n";
          } else {
            ++failed;
            std::cout << "FAIL " << suite << "/" << name << ": " << r.reason << "\n";
          }
          break;
        case Outcome::Skip:
          // Every skip is listed with its reason: one not listed is a gap nobody has accounted for.
          if (!is_known && !opt.exceptions.empty()) {
            ++failed;
            std::cout << "UNLISTED SKIP " << suite << "/" << name << " (" << r.reason
                      << "): list it in the exceptions file with its reason, or support its op\n";
            break;
          }
          ++skipped;
          ++skipped_ops[r.reason];
          if (opt.verbose) std::cout << "skip " << suite << "/" << name << " (" << r.reason << ")\n";
          break;
      }
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (opt.verbose && !skipped_ops.empty()) {
    std::cout << "skipped, by unsupported op:";
    for (auto& [op, n] : skipped_ops) std::cout << " " << op << "(" << n << ")";
    std::cout << "\n";
  }
  std::cout << "conformance" << (opt.compiled ? " (compiled engine)" : "") << ": " << supported_ops().size() << " supported ops, " << known
            << " known exceptions, " << secs << " s\n";
  std::cout << passed << " passed, " << failed << " failed, " << skipped << " skipped (unsupported op)\n";
  return failed ? 1 : 0;
}
