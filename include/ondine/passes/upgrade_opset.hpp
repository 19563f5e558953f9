// SPDX-License-Identifier: Apache-2.0
// ondine/passes/upgrade_opset.hpp - upgrade_opset(g, target): restates every default-domain node (and
// those of subgraphs) in the form opset `target` gives it, then sets the graph's opset import to
// `target`. A pass that adds an op of a newer opset (blocked DequantizeLinear, opset 21) calls it so
// the file it writes is standard ONNX, as ONNX's version converter would.
//
// Rewrites (node opset below the version where the op changed):
//   ReduceSum (13), ReduceMean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare (18), Squeeze and
//   Unsqueeze (13): the `axes` attribute becomes a constant int64 input;
//   Split (13): the `split` attribute becomes an input; (18) without sizes: num_outputs = its outputs;
//   GridSample (20): mode bilinear/bicubic -> linear/cubic.
// Refused, naming the node (Ondine does not restate them): ops whose older form differs in a way not
// listed above (Softmax/LogSoftmax/Hardmax before 13, Upsample, Resize/Pad/Clip before 11, Slice/TopK
// before 10, Scan before 9, DFT before 20). A target below a node's opset is refused too.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ondine/ir/graph.hpp"

namespace ondine {
namespace detail::upgrade_opset {

// The opset from which each refused op's form is the current one.
inline const std::map<std::string, int>& restated_from() {
  static const std::map<std::string, int> ops{{"Softmax", 13}, {"LogSoftmax", 13}, {"Hardmax", 13}, {"Resize", 11},
                                              {"Pad", 11},     {"Clip", 11},       {"Slice", 10},   {"TopK", 10},
                                              {"Scan", 9},     {"DFT", 20}};
  return ops;
}

inline void axes_to_input(Graph& g, Node* n, const char* attr, std::size_t input_index) {
  if (!n->has_attr(attr)) return;
  std::vector<std::int64_t> axes = n->attr_ints(attr, {});
  Tensor t(DType::Int64, {static_cast<std::int64_t>(axes.size())});
  for (std::size_t i = 0; i < axes.size(); ++i) t.data<std::int64_t>()[i] = axes[i];
  Value* c = g.add_constant(g.unique_name(n->name() + "." + attr), std::move(t));
  while (n->num_inputs() < input_index) n->add_input(nullptr);
  if (n->num_inputs() == input_index) n->add_input(c);
  else n->set_input(input_index, c);
  n->remove_attr(attr);
}

inline void upgrade_node(Graph& g, Node* n, int target) {
  const int from = n->opset();
  const std::string& op = n->op_type();
  if (from > target)
    throw n->error("opset " + std::to_string(from) + " is newer than the target opset " + std::to_string(target));
  if (op == "Upsample" && target >= 10) throw n->error("Upsample (removed in opset 10) cannot be restated; use Resize");
  if (auto it = restated_from().find(op); it != restated_from().end() && from < it->second && target >= it->second)
    throw n->error("the opset " + std::to_string(from) + " form of " + op + " cannot be restated in opset " +
                   std::to_string(target));
  static const std::set<std::string> reduce18{"ReduceMean", "ReduceMax",    "ReduceMin",       "ReduceProd",
                                              "ReduceL1",   "ReduceL2",     "ReduceLogSum",    "ReduceLogSumExp",
                                              "ReduceSumSquare"};
  if ((reduce18.count(op) && from < 18 && target >= 18) || (op == "ReduceSum" && from < 13 && target >= 13) ||
      ((op == "Squeeze" || op == "Unsqueeze") && from < 13 && target >= 13))
    axes_to_input(g, n, "axes", 1);
  if (op == "Split") {
    if (from < 13 && target >= 13) axes_to_input(g, n, "split", 1);
    if (from < 18 && target >= 18 && (n->num_inputs() < 2 || !n->input(1)))
      n->set_attr("num_outputs", Attribute(static_cast<std::int64_t>(n->num_outputs())));
  }
  if (op == "GridSample" && from < 20 && target >= 20) {
    std::string mode = n->attr_string("mode", "bilinear");
    n->set_attr("mode", Attribute(std::string(mode == "bilinear" ? "linear" : mode == "bicubic" ? "cubic" : mode)));
  }
  n->set_opset(target);
}

}  // namespace detail::upgrade_opset

inline void upgrade_opset(Graph& g, int target) {
  for (Node* n : g.nodes()) {
    if (!n->domain().empty()) continue;
    for (auto& [name, sub] : n->subgraphs()) {
      (void)name;
      upgrade_opset(*sub, target);
    }
    detail::upgrade_opset::upgrade_node(g, n, target);
  }
  g.opsets[""] = target;
}

}  // namespace ondine
