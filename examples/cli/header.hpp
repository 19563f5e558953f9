// examples/cli/header.hpp - `ondine header ARTIFACT --name NAME [-o NAME.hpp] [--embed]`: a typed C++ header
// for a compiled artifact, which `ondine_add_model()` (cmake/ondineAddModel.cmake) generates at build time.
//
// The header declares class NAME over ondine/ir/typed_tensor.hpp alone, so including it costs under a second;
// NAME.cpp, written beside it, implements it over ondine/runtime.hpp (ondine::Model, declarations only: the
// library ondine::runtime holds the compiler), so it too compiles in about a second (ondine_add_model adds it to
// the model's library). The class has a constructor loading the artifact (the file, or
// with --embed the bytes linked into the program by the assembly file ondine_add_model writes), one
// typed, shaped accessor per input and output: `NAME::<input>_t`, an ondine::TypedTensor<element, rank>
// (ir/typed_tensor.hpp), made by `make_<input>(dims...)` (symbolic dims are the arguments, static ones
// fixed), `struct Outputs` with one TypedTensor member per output, and `run(inputs...)` taking the inputs in
// the model's order. A value whose rank is not known when the header is written gets a plain ondine::Tensor.
// ONNX names become C++ identifiers: characters outside [A-Za-z0-9_] become '_', a leading digit or a keyword
// gets a prefix or suffix, and names that collide (with each other or an accessor type) get _2, _3, ...
#pragma once

#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ondine/lower/artifact.hpp"

namespace ondine::cli {

struct HeaderArgs {
  std::string artifact, name, out;
  bool embed = false;
};

namespace header_detail {

inline bool is_keyword(const std::string& s) {
  static const std::set<std::string> words{
      "alignas", "alignof", "and", "asm", "auto", "bool", "break", "case", "catch", "char", "class", "const",
      "constexpr", "continue", "default", "delete", "do", "double", "else", "enum", "explicit", "export", "extern",
      "false", "float", "for", "friend", "goto", "if", "inline", "int", "long", "mutable", "namespace", "new",
      "noexcept", "not", "nullptr", "operator", "or", "private", "protected", "public", "register", "return",
      "short", "signed", "sizeof", "static", "struct", "switch", "template", "this", "throw", "true", "try",
      "typedef", "typename", "union", "unsigned", "using", "virtual", "void", "volatile", "while", "xor",
      "run", "model_", "Outputs", "outputs_", "result_", "Impl", "impl_", "threads", "path",
      "options", "a"};  // and the generated class's own names
  return words.count(s) != 0;
}

// `s` as a C++ identifier, not in `taken` (which gets it).
inline std::string identifier(const std::string& s, std::set<std::string>& taken) {
  std::string id;
  for (char c : s) id += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  if (id.empty() || std::isdigit(static_cast<unsigned char>(id[0]))) id = "v_" + id;
  if (id.rfind("__", 0) == 0) id = "v" + id;  // reserved
  if (is_keyword(id)) id += "_";
  std::string unique = id;
  for (int k = 2; taken.count(unique); ++k) unique = id + "_" + std::to_string(k);
  taken.insert(unique);
  return unique;
}

// The C++ element type of a tensor of `t` in a generated header; empty where there is none (strings).
inline std::string element_type(DType t) {
  switch (t) {
    case DType::Float32: return "float";
    case DType::Float16: return "ondine::float16";
    case DType::BFloat16: return "ondine::bfloat16";
    case DType::Float64: return "double";
    case DType::Int8: return "std::int8_t";
    case DType::UInt8: return "std::uint8_t";
    case DType::Int16: return "std::int16_t";
    case DType::UInt16: return "std::uint16_t";
    case DType::Int32: return "std::int32_t";
    case DType::UInt32: return "std::uint32_t";
    case DType::Int64: return "std::int64_t";
    case DType::UInt64: return "std::uint64_t";
    case DType::Bool: return "bool";
    default: return "";
  }
}

// The accessor type of value `v`: ondine::TypedTensor<element, rank>, or plain ondine::Tensor where the rank
// or the element type is not known when the header is written.
inline std::string accessor_type(const Value* v) {
  const std::string element = element_type(v->dtype());
  if (element.empty() || !v->shape().rank_known()) return "ondine::Tensor";
  return "ondine::TypedTensor<" + element + ", " + std::to_string(v->shape().rank()) + ">";
}

inline std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace header_detail

// The names a generated class uses, computed once for its header and its source.
struct HeaderPlan {
  std::string cls, symbol;
  std::vector<std::string> input_ids, alias_ids, output_ids;
};

inline HeaderPlan plan_header(const Graph& g, const std::string& name) {
  using namespace header_detail;
  HeaderPlan p;
  std::set<std::string> taken;
  p.cls = identifier(name, taken);
  p.symbol = "ondine_model_" + p.cls;
  // The inputs' names first, so that an accessor type never takes the name an input would have.
  for (const Value* v : g.inputs()) p.input_ids.push_back(identifier(v->name(), taken));
  for (const std::string& id : p.input_ids) p.alias_ids.push_back(identifier(id + "_t", taken));
  std::set<std::string> member_names;
  for (const Value* v : g.outputs()) p.output_ids.push_back(identifier(v->name(), member_names));
  return p;
}

inline std::string run_signature(const HeaderPlan& p, const std::string& qualifier) {
  std::string sig = qualifier + "Outputs " + qualifier + "run(";
  for (std::size_t i = 0; i < p.input_ids.size(); ++i)
    sig += (i ? ", " : "") + std::string("const ") + qualifier + p.alias_ids[i] + "& " + p.input_ids[i];
  return sig + ")";
}

// NAME.hpp: the class's declaration over ondine/ir/typed_tensor.hpp alone (under a second to include); the
// runtime (oneDNN's headers, the compiler) is in NAME.cpp, compiled once into the program.
inline std::string generate_header(const Graph& g, const artifact::Info& info, const std::string& name,
                                   const std::string& artifact_path, bool embed) {
  using namespace header_detail;
  const HeaderPlan p = plan_header(g, name);
  const std::string& cls = p.cls;
  std::set<std::string> taken{cls};
  for (const auto& ids : {p.input_ids, p.alias_ids}) taken.insert(ids.begin(), ids.end());
  std::ostringstream h;
  h << "// " << cls << ".hpp - generated by `ondine header` from " << artifact_path << " (compiled from "
    << info.source << " for " << info.isa << ", " << info.precision << "): do not edit.\n"
    << "// Its implementation is " << cls << ".cpp, written beside it: compile it into the program once\n"
    << "// (ondine_add_model does); it includes the runtime, so this header stays light.\n"
    << "#pragma once\n\n#include <cstdint>\n#include <memory>\n#include <string>\n\n"
    << "#include <ondine/ir/typed_tensor.hpp>\n\n";
  h << "class " << cls << " {\n public:\n";
  if (embed) {
    h << "  // The model linked into this program; threads: oneDNN's (0: OpenMP's default).\n"
      << "  explicit " << cls << "(int threads = 0);\n";
  } else {
    h << "  // The model from its artifact file (by default where the build wrote it); threads: oneDNN's.\n"
      << "  explicit " << cls << "(int threads);\n"
      << "  explicit " << cls << "(const std::string& path = " << quoted(artifact_path) << ", int threads = 0);\n";
  }
  h << "  ~" << cls << "();\n  " << cls << "(" << cls << "&&) noexcept;\n  " << cls << "& operator=(" << cls
    << "&&) noexcept;\n\n";

  // Per input: a type alias for its accessor and, where its rank is known, make_<input>(symbolic dims...).
  for (std::size_t i = 0; i < p.input_ids.size(); ++i) {
    const Value* v = g.inputs()[i];
    const std::string& id = p.input_ids[i];
    const std::string type = accessor_type(v);
    h << "  // " << quoted(v->name()) << ": " << Graph::value_type_str(v) << "\n"
      << "  using " << p.alias_ids[i] << " = " << type << ";\n";
    if (type == "ondine::Tensor") continue;  // no dims to make it from
    std::set<std::string> arg_names = taken;  // a dim argument must not hide the class's names
    std::string params, dims;
    const Shape& s = v->shape();
    for (std::size_t d = 0; d < s.rank(); ++d) {
      if (s[d].is_static()) {
        dims += (dims.empty() ? "" : ", ") + std::to_string(s[d].value);
      } else {
        std::string arg = identifier(s[d].symbol.empty() ? "d" + std::to_string(d) : s[d].symbol, arg_names);
        params += (params.empty() ? "std::int64_t " : ", std::int64_t ") + arg;
        dims += (dims.empty() ? "" : ", ") + arg;
      }
    }
    h << "  static " << p.alias_ids[i] << " make_" << id << "(" << params << ") { return " << p.alias_ids[i]
      << "({" << dims << "}); }\n";
  }
  h << "\n  struct Outputs {\n";
  for (std::size_t i = 0; i < p.output_ids.size(); ++i) {
    const Value* v = g.outputs()[i];
    h << "    " << accessor_type(v) << " " << p.output_ids[i] << ";  // " << quoted(v->name()) << ": "
      << Graph::value_type_str(v) << "\n";
  }
  h << "  };\n\n  // Runs the model (any number of threads at once); inputs in the model's order.\n  "
    << run_signature(p, "") << ";\n\n private:\n  struct Impl;\n  std::unique_ptr<Impl> impl_;\n};\n";
  return h.str();
}

// NAME.cpp: loads the artifact into an ondine::Model (ondine/runtime.hpp) and runs it.
inline std::string generate_source(const Graph& g, const std::string& name, const std::string& artifact_path,
                                   bool embed) {
  using namespace header_detail;
  const HeaderPlan p = plan_header(g, name);
  const std::string& cls = p.cls;
  const std::string q = cls + "::";
  std::ostringstream c;
  c << "// " << cls << ".cpp - generated by `ondine header` from " << artifact_path << ": do not edit.\n"
    << "#include \"" << cls << ".hpp\"\n\n#include <map>\n#include <utility>\n\n#include <ondine/runtime.hpp>\n\n";
  if (embed)
    c << "extern \"C\" const unsigned char " << p.symbol << "_data[];\nextern \"C\" const unsigned long long "
      << p.symbol << "_size;\n\n";
  c << "struct " << q << "Impl {\n  explicit Impl(ondine::Model m) : model(std::move(m)) {}\n  ondine::Model model;\n};\n\n"
    << "static ondine::lower::CompileOptions " << p.symbol << "_options(int threads) {\n"
    << "  ondine::lower::CompileOptions options;\n  options.threads = threads;\n  return options;\n}\n\n";
  if (embed) {
    c << q << cls << "(int threads)\n    : impl_(std::make_unique<Impl>(ondine::Model::load_memory(" << p.symbol
      << "_data, " << p.symbol << "_size, " << quoted(name + " (embedded)") << ", " << p.symbol
      << "_options(threads)))) {}\n\n";
  } else {
    c << q << cls << "(int threads) : " << cls << "(" << quoted(artifact_path) << ", threads) {}\n\n"
      << q << cls << "(const std::string& path, int threads)\n    : impl_(std::make_unique<Impl>(ondine::Model::load(path, "
      << p.symbol << "_options(threads)))) {}\n\n";
  }
  c << q << "~" << cls << "() = default;\n"
    << q << cls << "(" << cls << "&&) noexcept = default;\n"
    << cls << "& " << q << "operator=(" << cls << "&&) noexcept = default;\n\n";
  c << run_signature(p, q) << " {\n  std::map<std::string, ondine::Tensor> outputs_ = impl_->model.run({";
  for (std::size_t i = 0; i < p.input_ids.size(); ++i) {
    const bool typed = accessor_type(g.inputs()[i]) != "ondine::Tensor";
    c << (i ? ", " : "") << "{" << quoted(g.inputs()[i]->name()) << ", " << p.input_ids[i]
      << (typed ? ".tensor()" : "") << "}";
  }
  c << "});\n  Outputs result_;\n";
  for (std::size_t i = 0; i < p.output_ids.size(); ++i)
    c << "  result_." << p.output_ids[i] << " = decltype(result_." << p.output_ids[i] << ")(outputs_.at("
      << quoted(g.outputs()[i]->name()) << "));\n";
  c << "  return result_;\n}\n";
  return c.str();
}

// The assembly file that links an artifact into a program, 64-byte aligned (`.incbin`, not a C array).
inline std::string generate_embed_asm(const std::string& cls, const std::string& artifact_path) {
  const std::string symbol = "ondine_model_" + cls;
  std::ostringstream s;
  s << "# " << cls << "_data.S - generated by `ondine header --embed`: the artifact " << artifact_path
    << " in .rodata.\n"
    << "    .section .rodata\n    .balign 64\n    .global " << symbol << "_data\n" << symbol << "_data:\n"
    << "    .incbin " << header_detail::quoted(artifact_path) << "\n" << symbol << "_end:\n"
    << "    .balign 8\n    .global " << symbol << "_size\n" << symbol << "_size:\n"
    << "    .quad " << symbol << "_end - " << symbol << "_data\n"
    << "    .section .note.GNU-stack,\"\",@progbits\n";
  return s.str();
}

inline int cmd_header(const HeaderArgs& args) {
  artifact::Artifact a = artifact::read(args.artifact);  // the checks of the file; no CPU check: build machines differ
  std::set<std::string> taken;
  const std::string cls = header_detail::identifier(args.name, taken);
  const std::string out = args.out.empty() ? cls + ".hpp" : args.out;
  const std::string path = std::filesystem::absolute(args.artifact).string();
  std::ofstream(out) << generate_header(a.graph, a.info, args.name, path, args.embed);
  std::cout << "wrote:   " << out << " (class " << cls << ", " << a.graph.inputs().size() << " input(s), "
            << a.graph.outputs().size() << " output(s))\n";
  const std::string source = (std::filesystem::path(out).parent_path() / (cls + ".cpp")).string();
  std::ofstream(source) << generate_source(a.graph, args.name, path, args.embed);
  std::cout << "wrote:   " << source << " (its implementation: compile it into the program once)\n";
  if (args.embed) {
    const std::string asm_file = (std::filesystem::path(out).parent_path() / (cls + "_data.S")).string();
    std::ofstream(asm_file) << generate_embed_asm(cls, path);
    std::cout << "wrote:   " << asm_file << " (the artifact linked in, .incbin)\n";
  }
  return 0;
}

inline CLI::App* add_header_command(CLI::App& app, HeaderArgs& args) {
  CLI::App* c = app.add_subcommand("header", "a typed C++ header for a compiled artifact (what ondine_add_model runs)");
  c->add_option("artifact", args.artifact, "compiled artifact (.ondine)")->required();
  c->add_option("--name", args.name, "the class name (made a C++ identifier)")->required();
  c->add_option("-o,--output", args.out, "the header to write (default NAME.hpp); its implementation NAME.cpp goes beside it");
  c->add_flag("--embed", args.embed, "also write NAME_data.S beside it, linking the artifact into the program");
  return c;
}

}  // namespace ondine::cli
