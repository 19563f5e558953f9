// examples/cli/ops.hpp - `ondine ops`: the operator coverage table, built from the code's own tables.
//
// Each op of ONNX's default domain (the installed ONNX library's schemas, opsets kMinOpset..kMaxOpset) and
// each op Ondine's passes create, with: shape inference (infer_table), reference kernel
// (reference::kernel_table), how the compiled engine runs it (lower::detail::lowering_table: oneDNN or an
// Ondine kernel, and when that lowering declines a node so it runs the reference kernel inside the plan),
// what int8 kernel a quantized model gets (FuseQdq::int8_ops) and whether it computes in bfloat16 under
// --precision bf16 (the lowering table's bf16 flag). `--markdown` prints docs/operators.md; CTest test
// `operators_doc` fails when that file differs from this output.
#pragma once

#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ondine/lower/compiler.hpp"
#include "ondine/onnx/schemas.hpp"
#include "ondine/passes/fuse_qdq.hpp"
#include "ondine/reference/executor.hpp"

namespace ondine::cli {

struct OpsArgs {
  bool markdown = false;
  bool missing = false;
};

inline CLI::App* add_ops_command(CLI::App& app, OpsArgs& args) {
  auto* ops = app.add_subcommand(
      "ops", "operator coverage: each ONNX op with shape inference, reference kernel, compiled kernel, int8, bf16");
  ops->add_flag("--markdown", args.markdown, "print docs/operators.md (a Markdown table and its summary)");
  ops->add_flag("--missing", args.missing, "list only the ONNX ops Ondine does not run");
  return ops;
}

namespace ops_detail {

struct Row {
  std::string op, versions;
  bool deprecated = false, onnx = true, infer = false, reference = false;
  std::string compiled, declines, int8, bf16;
  bool runs() const { return infer && reference; }
};

// Ops with no float form that the int8 path still takes, through the passes that rewrite them.
inline const std::map<std::string, std::string>& int8_rewrites() {
  static const std::map<std::string, std::string> t{
      {"QLinearConv", "ondine.QConv (qoperator-to-qdq, then fuse-qdq)"},
      {"QLinearMatMul", "ondine.QMatMul (qoperator-to-qdq, then fuse-qdq)"},
      {"MatMulInteger", "ondine.DynQMatMul (fuse-dynamic-qmatmul), else reference"},
      {"ConvInteger", "ondine.DynQConv (fuse-dynamic-qconv), else reference"},
      {"DynamicQuantizeLinear", "Ondine's quantize kernel"},
      {"QuantizeLinear", "oneDNN reorder"},
      {"DequantizeLinear", "oneDNN reorder"}};
  return t;
}

inline std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

inline Row make_row(const std::string& key) {
  Row r;
  r.op = key;
  r.infer = infer_table().count(key) > 0;
  r.reference = reference::kernel_table().count(key) > 0;
  const auto& lowering = lower::detail::lowering_table();
  if (auto it = lowering.find(key); it != lowering.end()) {
    r.compiled = it->second.kernel;
    r.declines = it->second.declines;
    r.bf16 = it->second.bf16 ? "bf16" : "fp32";
  } else if (r.runs()) {
    // Ops that make or read sequences, optionals or strings: the plan has no slot for those values, so
    // the model is staged and these run on their reference kernels after the compiled part.
    static const std::set<std::string> outside_plan = {
        "SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceAt", "SequenceErase", "SequenceLength",
        "SplitToSequence", "ConcatFromSequence", "SequenceMap", "Optional", "OptionalHasElement",
        "OptionalGetElement", "StringNormalizer"};
    r.compiled = key == "If" || key == "Loop" || key == "Scan" ? "subgraphs compiled, the op steps them"
                 : outside_plan.count(key)                    ? "reference kernel, staged after the compiled part"
                                                               : "reference kernel (a step of the plan)";
    r.bf16 = "fp32";
  }
  const auto& int8 = FuseQdq::int8_ops();
  if (auto it = int8.find(key); it != int8.end()) r.int8 = it->second;
  else if (auto q = int8_rewrites().find(key); q != int8_rewrites().end()) r.int8 = q->second;
  return r;
}

inline std::vector<Row> onnx_rows() {
  std::vector<Row> rows;
  std::set<std::string> seen;
  for (const auto& [name, schema] : onnx::default_domain_schemas()) {
    Row r = make_row(name);
    r.versions = join(schema.since);
    r.deprecated = schema.deprecated;
    rows.push_back(r);
    seen.insert(name);
  }
  // Ops Ondine runs that the installed ONNX library does not define (newer opsets).
  for (const auto& [key, kernel] : reference::kernel_table())
    if (key.find('.') == std::string::npos && !seen.count(key)) {
      Row r = make_row(key);
      r.onnx = false;
      r.versions = "newer than this ONNX library";
      rows.push_back(r);
    }
  return rows;
}

inline std::vector<Row> ondine_rows() {
  std::vector<Row> rows;
  for (const auto& [key, kernel] : reference::kernel_table())
    if (key.rfind("ondine.", 0) == 0) rows.push_back(make_row(key));
  return rows;
}

inline std::string yes(bool b) { return b ? "yes" : "-"; }
inline std::string cell(const std::string& s) { return s.empty() ? "-" : s; }

inline void print_markdown(std::ostream& out) {
  std::vector<Row> rows = onnx_rows();
  std::size_t runs = 0, onednn = 0, int8 = 0, bf16 = 0;
  for (const Row& r : rows) {
    runs += r.runs();
    onednn += r.runs() && lower::detail::lowering_table().count(r.op);
    int8 += !r.int8.empty();
    bf16 += r.bf16 == "bf16";
  }
  const int library_opset = onnx::onnx_library_max_opset();
  out << "# Operators\n\n"
      << "<!-- Generated by `ondine ops --markdown > docs/operators.md`; CTest test `operators_doc` fails when it is stale. -->\n\n"
      << "Every operator of ONNX's default domain up to opset " << library_opset
      << " (the schemas of the installed ONNX library), the newer ones Ondine implements (it reads opsets "
      << onnx::kMinOpset << " to " << onnx::kMaxOpset << "; those Ondine lacks from opsets " << library_opset + 1
      << " to " << onnx::kMaxOpset << " are listed in [limits.md](limits.md)), and what Ondine does with each. "
      << "Ondine runs **" << runs << " of " << rows.size() << "**: each has shape inference and a reference kernel (the oracle), and the compiled engine runs "
      << "every one of them, " << onednn << " on their own kernels (oneDNN primitives or Ondine's) and the rest as a "
      << "reference kernel inside the compiled plan (the compile log and `ondine inspect --compiled` list those steps). "
      << int8 << " have int8 kernels in a quantized model, " << bf16 << " compute in bfloat16 under `--precision bf16`.\n\n"
      << "- **Versions**: the opsets at which ONNX introduced or changed the op; Ondine reads every one listed "
         "(older semantics included, e.g. pre-7 broadcasting). *deprecated*: ONNX deprecated it.\n"
      << "- **Compiled**: what runs the op in a compiled model. **Reference when**: the cases in which that "
         "lowering declines a node, which then runs its reference kernel inside the plan, still correct.\n"
      << "- **int8**: the kernel a quantized (QDQ or QOperator) model gets ([quantization.md](quantization.md)); "
         "other ops run in float32 between DequantizeLinear and QuantizeLinear.\n"
      << "- **bf16**: `bf16`: computes in bfloat16 under `--precision bf16` on a CPU with native bf16; `fp32`: stays "
         "float32 there ([performance.md](performance.md)).\n\n"
      << "A model with an op marked `-` in *Shape inference* and *Reference* fails to load with an error that lists "
         "every such op with one of its nodes ([limits.md](limits.md)).\n\n"
      << "| Op | Versions | Shape inference | Reference | Compiled | Reference when | int8 | bf16 |\n"
      << "|---|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows)
    out << "| " << r.op << " | " << r.versions << (r.deprecated ? " *deprecated*" : "") << " | " << yes(r.infer)
        << " | " << yes(r.reference) << " | " << cell(r.compiled) << " | " << cell(r.declines) << " | "
        << cell(r.int8) << " | " << cell(r.bf16) << " |\n";
  out << "\n## Ondine's own ops\n\n"
      << "The passes create these (domain `ondine`; [passes.md](passes.md)); a model may not contain them.\n\n"
      << "| Op | Compiled | Reference when | bf16 |\n|---|---|---|---|\n";
  for (const Row& r : ondine_rows())
    out << "| " << r.op << " | " << cell(r.compiled) << " | " << cell(r.declines) << " | " << cell(r.bf16) << " |\n";
}

inline void print_text(std::ostream& out, bool missing_only) {
  std::vector<Row> rows = onnx_rows();
  std::size_t width = 4;
  for (const Row& r : rows) width = std::max(width, r.op.size());
  std::size_t runs = 0;
  for (const Row& r : rows) {
    runs += r.runs();
    if (missing_only && r.runs()) continue;
    std::string line = r.op + std::string(width + 2 - r.op.size(), ' ');
    if (!r.runs()) {
      line += std::string("not supported") + (r.infer ? " (shape inference only)" : "") +
              (r.reference ? " (reference kernel only)" : "");
    } else {
      line += r.compiled;
      if (!r.int8.empty()) line += "; int8: " + r.int8;
      if (r.bf16 == "bf16") line += "; bf16";
    }
    out << line << "\n";
  }
  out << runs << " of " << rows.size() << " ONNX ops (opsets " << onnx::kMinOpset << "-" << onnx::kMaxOpset
      << ") run; details: ondine ops --markdown (docs/operators.md)\n";
}

}  // namespace ops_detail

inline int cmd_ops(const OpsArgs& args) {
  if (args.markdown) ops_detail::print_markdown(std::cout);
  else ops_detail::print_text(std::cout, args.missing);
  return 0;
}

}  // namespace ondine::cli
