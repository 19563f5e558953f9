// SPDX-License-Identifier: Apache-2.0
// ondine/quant/qdq.hpp - quantize: inserts ONNX QuantizeLinear/DequantizeLinear pairs (the QDQ format
// ONNX Runtime's quantizer writes) from a calibration result, turning an fp32 graph into an int8 one
// that any ONNX runtime, Ondine's reference executor included, runs with int8 numerics.
//
//   auto calib = quant::calibrate(g, samples);              // on this same graph (names must match)
//   quant::QuantizeQDQ pass(calib, {/*include, exclude, keep_fp32_ends, activations*/});
//   PassContext ctx;
//   pass.run(g, ctx);
//   std::cout << pass.report().to_text();
// In a pipeline ("fold-bn,quantize"), a default-constructed pass reads its options from the context:
//   quantize.calibration = FILE      a CalibrationResult::to_text() file (required)
//   quantize.include / quantize.exclude = comma-separated node names or op types
//   quantize.keep-fp32-ends = 1      quantize.activations = u8 | s8
//
// Quantized ops: Conv, ConvTranspose, MatMul, Gemm, Add with two non-constant inputs (the residual add),
// Concat, MaxPool, AveragePool, GlobalAveragePool, and LSTM, which becomes ondine.QLSTM instead of
// taking Q/DQ pairs (quant/qlstm.hpp says why and how). For each of the others:
//   activation input x  -> DQ(Q(x, s, zp), s, zp), per tensor, u8 asymmetric (default) or s8. A value
//                          read by several quantized ops gets one Q/DQ pair; readers kept fp32 still read
//                          the float value, as do graph outputs.
//   constant weight W   -> DQ(W_q, w_s[C], 0, axis) with W_q an int8 constant quantized here, per channel
//                          symmetric (Conv: axis 0, ConvTranspose: 1, Gemm: 1, or 0 with transB, MatMul:
//                          the last); the calibration's weight params when int8 with zero point 0,
//                          otherwise computed from W. Needs opset 13 (per-axis DQ); an older model is
//                          raised to 13 when no op in it changed meaning at 13, else an Error.
//   constant bias B     -> DQ(B_q, x_s * w_s[C], 0, axis 0), B_q int32 (Conv, ConvTranspose with group
//                          1, Gemm with a 1-D C and alpha = beta = 1). That is what ONNX Runtime's QDQ
//                          Conv/Gemm fusion requires, and what an int8 oneDNN convolution adds to its s32
//                          accumulator. A bias that would overflow int32 (or QuantizeOptions::int32_bias
//                          off) stays float: correct, but ORT then runs that node in float.
// Outputs are quantized where their reader is: Conv -> Relu -> Conv puts Q/DQ after the Relu (Relu
// and Clip pass the range through; the calibrated range of the Relu output is the one used), and
// Conv -> Conv puts it on the Conv output. A quantized MaxPool's output reuses its input's params
// (max of values on one grid is on that grid: no second rounding).
//
// Kept fp32 (each listed in report() with the reason): not in `include` (when given), in `exclude`,
// the first and last weight layer with keep_fp32_ends, QuantizeOptions::keep_fp32 saying so (the
// error-bound fallback, quant/fallback.hpp), an input without calibration or not float32,
// a non-constant Conv weight, an Add with a constant input, a MaxPool with an indices output, an input
// already dequantized (the pass ran before).
// Params: calibration params of a value whose type differs from the chosen activation type are
// recomputed from its range. A zero range (constant zero tensor) has scale 1, zero point 0 from the
// observers: it quantizes to an exact 0. Params with a non-positive, NaN or Inf scale or an out-of-
// range zero point (a hand-made CalibrationResult) are an Error naming the value.
// Names: new values are "<value>_quantized"/"<value>_dequantized", "<value>_scale", "<value>_zero_point"
// (made unique); every original value keeps its name; Q/DQ nodes are scheduled before their first reader.
// Run it on the fp32 graph before fusion (after fold-constants/fold-bn), on the graph calibrated, and
// do not run fold-constants afterwards: it would fold the weight DequantizeLinear back to float.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/graph.hpp"
#include "ondine/passes/pass.hpp"
#include "ondine/passes/pipeline.hpp"
#include "ondine/quant/calibration.hpp"
#include "ondine/quant/observers.hpp"
#include "ondine/quant/qlstm.hpp"

namespace ondine::quant {

struct QuantizeOptions {
  // Node names or op types ("Conv", "ondine.FusedConv" style keys too). Empty include: every candidate.
  // exclude wins over include.
  std::vector<std::string> include, exclude;
  // Keep the first and the last weight layer (Conv, ConvTranspose, MatMul, Gemm) in fp32: they are
  // often the most sensitive (raw pixels in, logits out).
  bool keep_fp32_ends = false;
  // Activation type: UInt8 (oneDNN's preferred u8 source for s8 weights) or Int8.
  DType activations = DType::UInt8;
  // 7-bit weights ([-64, 64]): what int8 kernels without VNNI compute exactly (they add u8 x s8 products
  // in pairs into int16); the compiler keeps 8-bit-weight layers in float on such CPUs.
  bool reduce_range_weights = false;
  // Bias of Conv/Gemm as int32 with scale x_scale * w_scale (see the header comment); false: float.
  bool int32_bias = true;
  // Asked last, for each node that would be quantized: a reason to keep it fp32 instead, or nullopt.
  // Unlike exclude it can name one node exactly (node names may repeat or be an op type);
  // quant/fallback.hpp keeps the layers it picked this way, by their first output.
  std::function<std::optional<std::string>(const Node&)> keep_fp32;
};

// What the pass decided for one node of a quantizable op type.
struct QuantizeDecision {
  std::string node, op;
  bool quantized = false;
  std::string reason;  // why it stayed fp32 (empty when quantized)
};

struct QuantizeReport {
  std::vector<QuantizeDecision> nodes;  // in topological order
  std::size_t activations = 0;          // values given a Q/DQ pair
  std::size_t weights = 0;              // weight constants quantized to int8
  std::size_t int32_biases = 0, float_biases = 0;
  std::size_t q_nodes = 0, dq_nodes = 0;
  int opset_raised_from = 0;  // > 0: the model's opset was raised to 13 from this

  std::size_t quantized() const {
    return static_cast<std::size_t>(std::count_if(nodes.begin(), nodes.end(), [](auto& d) { return d.quantized; }));
  }
  std::size_t kept() const { return nodes.size() - quantized(); }
  // Quantized nodes per op type.
  std::map<std::string, std::size_t> quantized_by_op() const {
    std::map<std::string, std::size_t> h;
    for (auto& d : nodes)
      if (d.quantized) ++h[d.op];
    return h;
  }
  std::string to_text() const {
    std::ostringstream os;
    os << "quantized " << quantized() << " of " << nodes.size() << " quantizable nodes";
    std::string ops;
    for (auto& [op, n] : quantized_by_op()) ops += (ops.empty() ? "" : ", ") + op + " " + std::to_string(n);
    if (!ops.empty()) os << " (" << ops << ")";
    os << "\ninserted " << q_nodes << " QuantizeLinear, " << dq_nodes << " DequantizeLinear: " << activations
       << " activations, " << weights << " int8 weights, " << int32_biases << " int32 biases"
       << (float_biases ? ", " + std::to_string(float_biases) + " float biases" : std::string()) << "\n";
    if (opset_raised_from) os << "opset raised from " << opset_raised_from << " to 13 (per-axis DequantizeLinear)\n";
    os << "kept fp32: " << kept() << "\n";
    for (auto& d : nodes)
      if (!d.quantized) os << "  " << d.node << " (" << d.op << "): " << d.reason << "\n";
    return os.str();
  }
};

namespace detail::qdq {

// "a,b,,c" -> {"a", "b", "c"} (blanks trimmed).
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  for (auto& item : quant::detail::split(s, ',')) {
    auto first = item.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    out.push_back(item.substr(first, item.find_last_not_of(" \t") - first + 1));
  }
  return out;
}

inline DType parse_activation_type(const std::string& s) {
  if (s == "u8" || s == "uint8") return DType::UInt8;
  if (s == "s8" || s == "int8") return DType::Int8;
  throw Error("activation type must be u8 or s8, got '" + s + "'");
}

// The path goes into the message itself: the pass manager keeps only a pass error's message.
inline CalibrationResult read_calibration(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open the calibration file '" + path + "' (pass option quantize.calibration)");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return CalibrationResult::from_text(ss.str());
  } catch (const Error& e) {
    throw Error("calibration file '" + path + "': " + e.message());
  }
}

// The ops whose meaning changed at opset 13 (attributes became inputs, Softmax's axis): a model that
// has one cannot simply be relabelled opset 13.
inline bool changed_at_13(const std::string& op) {
  static const std::set<std::string> ops{"Softmax", "LogSoftmax", "Hardmax", "Split", "Squeeze", "Unsqueeze",
                                         "ReduceSum"};
  return ops.count(op) != 0;
}

// Where an op's inputs sit: the activations to quantize per tensor, the weight, the bias.
struct Roles {
  std::vector<std::size_t> activations;
  std::optional<std::size_t> weight, bias;
  std::int64_t weight_axis = 0;
  bool weight_layer = false;  // Conv, ConvTranspose, MatMul, Gemm (keep_fp32_ends counts these)
  bool recurrent = false;     // LSTM: replaced by ondine.QLSTM (quant/qlstm.hpp), no Q/DQ pairs
};

inline bool quantizable_op(const Node& n) {
  static const std::set<std::string> ops{"Conv", "ConvTranspose", "MatMul", "Gemm", "Add", "Concat",
                                         "MaxPool", "AveragePool", "GlobalAveragePool", "LSTM"};
  return n.domain().empty() && ops.count(n.op_type()) != 0;
}

// The roles of n's inputs, or the reason it cannot be quantized.
inline std::optional<std::string> roles_of(const Node& n, Roles& r) {
  const std::string& op = n.op_type();
  auto constant = [&](std::size_t i) { return n.input(i) && n.input(i)->is_constant(); };
  if (op == "Conv" || op == "ConvTranspose") {
    r.weight_layer = true;
    if (!constant(1)) return std::string("its weight is not a constant");
    r.activations = {0};
    r.weight = 1;
    r.weight_axis = op == "Conv" ? 0 : 1;
    if (n.input(2)) r.bias = 2;
    return std::nullopt;
  }
  if (op == "Gemm" || op == "MatMul") {
    r.weight_layer = true;
    r.activations = {0};
    if (constant(0)) return std::string("its first input is a constant");
    if (!constant(1)) {
      r.activations.push_back(1);  // activation x activation (attention): both per tensor
    } else {
      r.weight = 1;
      auto rank = static_cast<std::int64_t>(n.input(1)->constant().rank());
      if (op == "Gemm") r.weight_axis = n.attr_int("transB", 0) ? 0 : 1;
      else r.weight_axis = rank - 1;
      if (op == "Gemm" && n.input(2)) r.bias = 2;
    }
    return std::nullopt;
  }
  if (op == "LSTM") {
    r.recurrent = true;
    return qlstm::blocker(n);
  }
  if (op == "Add") {
    if (constant(0) || constant(1)) return std::string("an input is a constant (not a residual add)");
    r.activations = {0, 1};
    return std::nullopt;
  }
  if (op == "Concat") {
    for (std::size_t i = 0; i < n.num_inputs(); ++i)
      if (n.input(i) && !constant(i)) r.activations.push_back(i);
    if (r.activations.empty()) return std::string("every input is a constant");
    return std::nullopt;
  }
  if (op == "MaxPool" && n.num_outputs() > 1 && n.output(1) && (n.output(1)->has_uses() || n.output(1)->is_graph_output()))
    return std::string("its indices output is used");
  r.activations = {0};  // MaxPool, AveragePool, GlobalAveragePool
  return std::nullopt;
}

inline Tensor scale_tensor(const QuantParams& p) {
  if (p.per_channel()) return Tensor::from_vector<float>({static_cast<std::int64_t>(p.scale.size())}, p.scale);
  return Tensor::scalar<float>(p.scale[0]);
}

inline Tensor zero_point_tensor(const QuantParams& p) {
  std::vector<std::int64_t> dims;
  if (p.per_channel()) dims.push_back(static_cast<std::int64_t>(p.zero_point.size()));
  Tensor t(p.dtype, dims);
  for (std::size_t i = 0; i < p.zero_point.size(); ++i) {
    if (p.dtype == DType::UInt8) t.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(p.zero_point[i]);
    else t.data<std::int8_t>()[i] = static_cast<std::int8_t>(p.zero_point[i]);
  }
  return t;
}

}  // namespace detail::qdq

class QuantizeQDQ {
 public:
  static constexpr const char* name = "quantize";

  // In a pipeline: the calibration and options come from the PassContext (see the header comment).
  QuantizeQDQ() = default;
  explicit QuantizeQDQ(CalibrationResult calibration, QuantizeOptions options = {})
      : calibration_(std::move(calibration)), options_(std::move(options)) {}

  const QuantizeReport& report() const { return report_; }

  bool run(Graph& g, PassContext& ctx) {
    if (!calibration_) load_from_context(ctx);
    const CalibrationResult& calib = *calibration_;
    if (options_.activations != DType::UInt8 && options_.activations != DType::Int8)
      throw Error("quantize: activations must be uint8 or int8, not " + std::string(dtype_name(options_.activations)));
    report_ = QuantizeReport{};
    std::vector<Node*> order = g.topo_order();

    // 1. Decide, without editing: which nodes are quantized, and the roles of their inputs.
    std::set<std::string> include(options_.include.begin(), options_.include.end());
    std::set<std::string> exclude(options_.exclude.begin(), options_.exclude.end());
    auto listed = [](const std::set<std::string>& s, const Node& n) {
      return s.count(n.name()) || s.count(n.op_type()) || s.count(n.op_key());
    };
    struct Candidate {
      Node* node = nullptr;
      detail::qdq::Roles roles;
      std::string reason;  // empty: quantize
    };
    std::vector<Candidate> cands;
    for (Node* n : order) {
      if (!detail::qdq::quantizable_op(*n)) continue;
      Candidate c;
      c.node = n;
      if (auto why = detail::qdq::roles_of(*n, c.roles)) c.reason = *why;
      if (c.reason.empty() && !include.empty() && !listed(include, *n)) c.reason = "not in the include list";
      if (c.reason.empty() && listed(exclude, *n)) c.reason = "in the exclude list";
      if (c.reason.empty()) c.reason = check_inputs(*n, c.roles, calib);
      cands.push_back(std::move(c));
    }
    if (options_.keep_fp32_ends) {
      Candidate* first = nullptr;
      Candidate* last = nullptr;
      for (auto& c : cands)
        if (c.roles.weight_layer && c.reason.empty()) {
          if (!first) first = &c;
          last = &c;
        }
      if (first) first->reason = "first weight layer (keep fp32 ends)";
      if (last && last != first) last->reason = "last weight layer (keep fp32 ends)";
    }
    if (options_.keep_fp32)
      for (auto& c : cands)
        if (c.reason.empty())
          if (auto why = options_.keep_fp32(*c.node)) c.reason = *why;

    bool any_per_axis = false;
    for (auto& c : cands)
      if (c.reason.empty() && c.roles.weight && c.node->input(*c.roles.weight)->constant().rank() >= 2)
        any_per_axis = true;
    if (any_per_axis) ensure_opset_13(g);

    // 2. Edit: Q/DQ per activation value (shared), int8 weights, int32 biases.
    std::unordered_map<const Value*, Value*> dequantized;         // activation -> its DQ output
    std::unordered_map<const Value*, QuantParams> params_memo;
    std::unordered_set<const Node*> quantized_nodes;
    for (auto& c : cands)
      if (c.reason.empty()) quantized_nodes.insert(c.node);
    std::unordered_map<const Node*, std::vector<Node*>> schedule;
    std::map<std::pair<const Value*, std::int64_t>, std::pair<Value*, QuantParams>> weight_memo;

    // The params of an activation value: a quantized MaxPool's output takes its input's.
    std::function<QuantParams(const Value*)> act_params = [&](const Value* v) -> QuantParams {
      if (auto it = params_memo.find(v); it != params_memo.end()) return it->second;
      QuantParams p;
      Node* prod = v->producer();
      if (prod && prod->op_type() == "MaxPool" && quantized_nodes.count(prod) && v == prod->output(0))
        p = act_params(original_input_.at(prod));
      else
        p = activation_params(calib.at(v->name()), v->name());
      params_memo[v] = p;
      return p;
    };

    for (auto& c : cands) {
      Node* n = c.node;
      report_.nodes.push_back({n->name(), n->op_type(), c.reason.empty(), c.reason});
      if (!c.reason.empty()) {
        ctx.remark("kept '" + n->name() + "' (" + n->op_type() + ") in fp32: " + c.reason);
        continue;
      }
      if (n->op_type() == "MaxPool") original_input_[n] = n->input(0);
    }
    bool replaced_recurrent = false;
    for (auto& c : cands) {
      if (!c.reason.empty()) continue;
      Node* n = c.node;
      if (c.roles.recurrent) {
        const std::string name = n->name();
        detail::qlstm::replace(g, n, calib, options_.reduce_range_weights);
        replaced_recurrent = true;
        report_.weights += 2;
        ctx.rewrite("quantized '" + name + "' (LSTM -> ondine.QLSTM)");
        continue;
      }
      auto& pending = schedule[n];
      std::optional<QuantParams> x_params;
      for (std::size_t i : c.roles.activations) {
        Value* x = n->input(i);
        QuantParams p = act_params(x);
        if (i == 0) x_params = p;
        auto it = dequantized.find(x);
        if (it == dequantized.end()) {
          Value* dq = insert_qdq(g, x, p, pending);
          it = dequantized.emplace(x, dq).first;
          ++report_.activations;
        }
        n->set_input(i, it->second);
      }
      QuantParams w_params;
      if (c.roles.weight) {
        Value* w = n->input(*c.roles.weight);
        auto key = std::make_pair(static_cast<const Value*>(w), c.roles.weight_axis);
        auto it = weight_memo.find(key);
        if (it == weight_memo.end()) {
          QuantParams p = weight_params(calib, *w, c.roles.weight_axis, options_.reduce_range_weights);
          it = weight_memo.emplace(key, std::make_pair(insert_weight(g, w, p, pending), p)).first;
          ++report_.weights;
        }
        n->set_input(*c.roles.weight, it->second.first);
        w_params = it->second.second;
      }
      if (c.roles.bias && x_params) quantize_bias(g, *n, *c.roles.bias, *x_params, w_params, pending, ctx);
      ctx.rewrite("quantized '" + n->name() + "' (" + n->op_type() + ")");
    }
    original_input_.clear();
    if (!ctx.rewrites() && quantized_nodes.empty()) return false;

    // 3. Schedule each new node right before the node it was made for.
    std::vector<Node*> new_order;
    std::unordered_set<const Node*> added;
    for (auto& [n, nodes] : schedule)
      for (Node* m : nodes) added.insert(m);
    for (Node* n : g.nodes()) {
      if (added.count(n)) continue;
      if (auto it = schedule.find(n); it != schedule.end()) new_order.insert(new_order.end(), it->second.begin(), it->second.end());
      new_order.push_back(n);
    }
    g.set_node_order(new_order);
    if (replaced_recurrent) g.set_node_order(g.topo_order());  // a QLSTM was added last
    return !quantized_nodes.empty();
  }

 private:
  void load_from_context(PassContext& ctx) {
    std::string path = ctx.option("quantize.calibration");
    if (path.empty())
      throw Error("the quantize pass needs a calibration: set the pass option quantize.calibration=FILE (a "
                  "calibration text, e.g. from `ondine quantize --save-calibration FILE`), or construct "
                  "quant::QuantizeQDQ with a CalibrationResult");
    calibration_ = detail::qdq::read_calibration(path);
    options_.include = detail::qdq::split_list(ctx.option("quantize.include"));
    options_.exclude = detail::qdq::split_list(ctx.option("quantize.exclude"));
    std::string ends = ctx.option("quantize.keep-fp32-ends", "0");
    options_.keep_fp32_ends = ends == "1" || ends == "true";
    options_.activations = detail::qdq::parse_activation_type(ctx.option("quantize.activations", "u8"));
  }

  // Why n's inputs cannot be quantized, or "".
  std::string check_inputs(const Node& n, const detail::qdq::Roles& r, const CalibrationResult& calib) const {
    if (r.recurrent) return detail::qlstm::missing_calibration(n, calib);
    for (std::size_t i : r.activations) {
      const Value* x = n.input(i);
      if (!x) return "input " + std::to_string(i) + " is omitted";
      if (x->producer() && x->producer()->op_type() == "DequantizeLinear")
        return "input '" + x->name() + "' is already dequantized";
      if (x->dtype() != DType::Float32 && x->dtype() != DType::Undefined)
        return "input '" + x->name() + "' is " + std::string(dtype_name(x->dtype())) + ", not float32";
      if (!calib.contains(x->name())) return "no calibration for input '" + x->name() + "'";
      const TensorCalibration& t = calib.at(x->name());
      if (t.params.per_channel()) return "input '" + x->name() + "' has per-channel calibration";
    }
    if (r.weight) {
      const Value* w = n.input(*r.weight);
      if (w->constant().dtype() != DType::Float32)
        return "weight '" + w->name() + "' is " + std::string(dtype_name(w->constant().dtype())) + ", not float32";
      auto rank = static_cast<std::int64_t>(w->constant().rank());
      if (rank >= 1 && (r.weight_axis < 0 || r.weight_axis >= rank))
        return "weight '" + w->name() + "' has rank " + std::to_string(rank);
    }
    return "";
  }

  // Calibration params in the chosen activation type (recomputed from the range when the type differs).
  QuantParams activation_params(const TensorCalibration& t, const std::string& value) const {
    QuantParams p = t.params;
    if (p.dtype != options_.activations)
      p = compute_params(t.range, QuantScheme{options_.activations, t.params.symmetric, false});
    try {
      check_params(p, value);
    } catch (const Error& e) {
      throw Error("calibration of '" + value + "': " + e.message());
    }
    return p;
  }

  // Int8 symmetric weight params along `axis`: the calibration's when they fit, else from the data
  // (always from the data for 7-bit weights).
  static QuantParams weight_params(const CalibrationResult& calib, const Value& w, std::int64_t axis, bool reduce_range) {
    const Tensor& t = w.constant();
    auto rank = static_cast<std::int64_t>(t.rank());
    if (!reduce_range && calib.contains(w.name())) {
      const QuantParams& p = calib.params(w.name());
      bool fits = p.dtype == DType::Int8 &&
                  std::all_of(p.zero_point.begin(), p.zero_point.end(), [](std::int32_t z) { return z == 0; });
      if (p.per_channel()) {
        std::int64_t a = *p.axis < 0 ? *p.axis + rank : *p.axis;
        fits = fits && a == axis && a >= 0 && a < rank && t.dims()[a] == static_cast<std::int64_t>(p.scale.size());
      }
      if (fits) {
        QuantParams out = p;
        if (out.axis) out.axis = axis;
        try {
          check_params(out, w.name());
        } catch (const Error& e) {
          throw Error("calibration of weight '" + w.name() + "': " + e.message());
        }
        return out;
      }
    }
    QuantScheme scheme{DType::Int8, true, reduce_range};
    if (rank < 2) {  // a vector (MatMul with a 1-D B) has no output channels: per tensor
      MinMaxObserver obs(w.name());
      obs.observe(t);
      return compute_params(obs.range(scheme), scheme);
    }
    PerChannelMinMaxObserver obs(w.name(), axis);
    obs.observe(t);
    return compute_params(obs.range(scheme), scheme);
  }

  void ensure_opset_13(Graph& g) {
    int opset = g.opset();
    if (opset >= 13) return;
    for (Node* n : g.nodes())
      if (n->domain().empty() && detail::qdq::changed_at_13(n->op_type()))
        throw Error("per-channel weights need DequantizeLinear with 'axis' (opset 13); the model is opset " +
                    std::to_string(opset) + " and has " + n->op_type() +
                    ", whose meaning changed at 13: convert it to opset 13 first "
                    "(onnx.version_converter.convert_version(model, 13))")
            .at_node(n->name(), n->op_type());
    g.opsets[""] = 13;
    report_.opset_raised_from = opset;
  }

  Value* constant(Graph& g, const std::string& base, Tensor t) { return g.add_constant(g.unique_name(base), std::move(t)); }

  // x -> DequantizeLinear(QuantizeLinear(x)); returns the DQ output.
  Value* insert_qdq(Graph& g, Value* x, const QuantParams& p, std::vector<Node*>& pending) {
    Value* scale = constant(g, x->name() + "_scale", detail::qdq::scale_tensor(p));
    Value* zp = constant(g, x->name() + "_zero_point", detail::qdq::zero_point_tensor(p));
    Node* q = g.add_node("QuantizeLinear", {x, scale, zp}, {g.unique_name(x->name() + "_quantized")}, {},
                         g.unique_name(x->name() + "_QuantizeLinear"));
    q->output(0)->set_dtype(p.dtype);
    q->output(0)->set_shape(x->shape());
    Node* dq = g.add_node("DequantizeLinear", {q->output(0), scale, zp}, {g.unique_name(x->name() + "_dequantized")},
                          {}, g.unique_name(x->name() + "_DequantizeLinear"));
    dq->output(0)->set_dtype(DType::Float32);
    dq->output(0)->set_shape(x->shape());
    pending.push_back(q);
    pending.push_back(dq);
    ++report_.q_nodes;
    ++report_.dq_nodes;
    return dq->output(0);
  }

  // An int8 constant of W and its DequantizeLinear; returns the DQ output.
  Value* insert_weight(Graph& g, Value* w, const QuantParams& p, std::vector<Node*>& pending) {
    Value* wq = constant(g, w->name() + "_quantized", quantize(w->constant(), p));
    Value* scale = constant(g, w->name() + "_scale", detail::qdq::scale_tensor(p));
    Value* zp = constant(g, w->name() + "_zero_point", detail::qdq::zero_point_tensor(p));
    std::map<std::string, Attribute> attrs;
    if (p.axis) attrs["axis"] = *p.axis;
    Node* dq = g.add_node("DequantizeLinear", {wq, scale, zp}, {g.unique_name(w->name() + "_dequantized")},
                          std::move(attrs), g.unique_name(w->name() + "_DequantizeLinear"));
    dq->output(0)->set_dtype(DType::Float32);
    dq->output(0)->set_shape(w->shape());
    pending.push_back(dq);
    ++report_.dq_nodes;
    return dq->output(0);
  }

  // bias -> DequantizeLinear(int32 bias_q, x_scale * w_scale, 0, axis 0) where the op allows it.
  void quantize_bias(Graph& g, Node& n, std::size_t index, const QuantParams& x, const QuantParams& w,
                     std::vector<Node*>& pending, PassContext& ctx) {
    Value* b = n.input(index);
    auto keep_float = [&](const std::string& why) {
      ++report_.float_biases;
      if (!why.empty()) ctx.remark("bias of '" + n.name() + "' stays float: " + why);
    };
    if (!options_.int32_bias) return keep_float("");
    if (!b->is_constant() || b->constant().dtype() != DType::Float32) return keep_float("not a float32 constant");
    const Tensor& t = b->constant();
    if (n.op_type() == "ConvTranspose" && n.attr_int("group", 1) != 1) return keep_float("grouped ConvTranspose");
    if (n.op_type() == "Gemm" && (n.attr_float("alpha", 1.0f) != 1.0f || n.attr_float("beta", 1.0f) != 1.0f))
      return keep_float("Gemm alpha or beta is not 1");
    if (t.rank() != 1 || w.scale.empty() || (w.per_channel() && t.numel() != static_cast<std::int64_t>(w.scale.size())))
      return keep_float("its shape " + dims_str(t.dims()) + " is not one value per output channel");
    const float* bp = t.data<float>();
    std::vector<float> scales(static_cast<std::size_t>(t.numel()));
    Tensor q(DType::Int32, t.dims());
    for (std::size_t c = 0; c < scales.size(); ++c) {
      scales[c] = x.scale[0] * w.scale[w.per_channel() ? c : 0];
      double v = std::nearbyint(static_cast<double>(bp[c]) / scales[c]);
      if (!(scales[c] > 0.0f) || !std::isfinite(scales[c]) || !(std::fabs(v) <= 2147483647.0))
        return keep_float("bias / (x_scale * w_scale) overflows int32 in channel " + std::to_string(c));
      q.data<std::int32_t>()[c] = static_cast<std::int32_t>(v);
    }
    bool per_channel = w.per_channel();
    Value* bq = constant(g, b->name() + "_quantized", q);
    Value* scale = constant(g, b->name() + "_quantized_scale",
                            per_channel ? Tensor::from_vector<float>(t.dims(), scales) : Tensor::scalar<float>(scales[0]));
    Value* zp = constant(g, b->name() + "_quantized_zero_point",
                         per_channel ? Tensor(DType::Int32, t.dims()) : Tensor::scalar<std::int32_t>(0));
    std::map<std::string, Attribute> attrs;
    if (per_channel) attrs["axis"] = std::int64_t{0};
    Node* dq = g.add_node("DequantizeLinear", {bq, scale, zp}, {g.unique_name(b->name() + "_dequantized")},
                          std::move(attrs), g.unique_name(b->name() + "_DequantizeLinear"));
    dq->output(0)->set_dtype(DType::Float32);
    dq->output(0)->set_shape(b->shape());
    n.set_input(index, dq->output(0));
    pending.push_back(dq);
    ++report_.dq_nodes;
    ++report_.int32_biases;
  }

  std::optional<CalibrationResult> calibration_;
  QuantizeOptions options_;
  QuantizeReport report_;
  std::unordered_map<const Node*, Value*> original_input_;  // a quantized MaxPool's input before editing
};

// Runs QuantizeQDQ on `g` in place (checked with verify()) and returns its report: what the tool, the Python
// module and the error-bound fallback all do with one calibration.
inline QuantizeReport quantize_qdq(Graph& g, const CalibrationResult& calib, const QuantizeOptions& options) {
  QuantizeQDQ pass(calib, options);
  PassContext ctx;
  ctx.begin_pass(QuantizeQDQ::name);
  pass.run(g, ctx);
  g.verify();
  return pass.report();
}

// Makes "quantize" nameable in pipelines (it needs quantize.calibration, so it is not in the default
// pipeline). Registered from quant/, so passes/ never includes quant/; lower/lower.hpp calls this at
// start-up (a call, not a registration here: see register_pipeline_with_compiler in passes/pipeline.hpp).
inline void register_quantize_pass() {
  if (!pass_registry().contains(QuantizeQDQ::name)) pass_registry().add<QuantizeQDQ>();
}

}  // namespace ondine::quant
