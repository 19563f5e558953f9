// SPDX-License-Identifier: Apache-2.0
// ondine/lower/dynamic.hpp - a model compiled once for its symbolic shapes, run at any shape without compiling
// again (the shape-free plan).
//
//   ondine::lower::DynamicModel model(std::move(graph), options);   // passes and kernels, once
//   auto out = model.run({{"input_ids", ids}, {"attention_mask", mask}});   // any batch, any length
//
// Why: a plan compiled per input shape (compile(), ShapeCache) pays passes, shape inference and the
// creation of every primitive for each new shape: tens of milliseconds for a small encoder, so a stream of
// sentences of mixed lengths spends most of its time compiling and a decoder with a KV cache, whose past
// grows by one at every token, compiles at every token. Here everything that does not depend on the sizes
// happens once: import checks, the pass pipeline (fusions run on the symbolic graph), the choice of kernel
// per node, weight layouts. A call then only runs the nodes in order; each kernel reads the sizes of the
// tensors it is given (lower/detail/dynamic_kernels.hpp: oneDNN matmul with run-time rows, sgemm, Ondine's
// row loops), so a new shape costs no compile, no shape inference and no weight repacking. The values
// live in tensors from a pool (runtime/buffer_pool.hpp) that grows to the largest shapes seen and is reused
// from call to call; each value is released after its last reader.
//
// It is the plan for models whose work is matrix products, attention, normalisations and elementwise ops
// (transformer encoders and decoders): ShapeCache takes it for such a model when its inputs have symbolic
// dims (ShapeCache::Mode). A convolutional or recurrent network keeps one compiled plan per shape, whose
// primitives are made for the shape (a CNN at a fixed size must not slow down); `covers()` says which.
//
// Every value is computed as the reference executor would compute it at that shape, within float32
// rounding (tests/test_dynamic.cpp checks the corpus at several shapes against the reference and a
// compile per shape). Thread-safe: any number of threads may call run() at once.
#pragma once

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "ondine/ir/graph.hpp"
#include "ondine/ir/shape_inference.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/control_flow.hpp"
#include "ondine/lower/detail/dynamic_kernels.hpp"
#include "ondine/lower/pass_pipeline.hpp"
#include "ondine/reference/executor.hpp"
#include "ondine/runtime/buffer_pool.hpp"
#include "ondine/runtime/compiled_model.hpp"
#include "ondine/runtime/kv_cache.hpp"
#include "ondine/runtime/output_binding.hpp"

namespace ondine::lower {

namespace detail {

// The ops the shape-free plan runs well: its own kernels, and ops that only move or compute small tensors
// (shape arithmetic, masks, views, embedding lookups) on their reference kernels. A model made of these
// alone is taken by ShapeCache's Auto mode.
inline bool cheap_on_reference(const std::string& op) {
  static const std::set<std::string> ops{
      "Shape", "Size", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity",
      "Dropout", "Cast", "CastLike", "Constant", "ConstantOfShape", "Range", "Equal", "Less", "Greater",
      "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Where", "Expand", "Trilu", "Neg", "Split", "Min", "Max",
      "Floor", "Ceil", "Mod", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "Tile", "CumSum", "Abs",
      "Erf", "Pow", "Sqrt", "ReduceMean", "Reciprocal", "Sign", "Clip", "ArgMax", "Sin", "Cos"};
  return ops.count(op) > 0;
}

using dyn::host_exp;

using DynFactory = std::unique_ptr<dyn::Kernel> (*)(const Node& n, const dnnl::engine& engine);

inline const std::map<std::string, DynFactory>& dynamic_kernel_table() {
  static const std::map<std::string, DynFactory> table = [] {
    using namespace dyn;
    std::map<std::string, DynFactory> t;
    DynFactory matmul = [](const Node& n, const dnnl::engine& e) -> std::unique_ptr<Kernel> {
      if (auto spec = dense_spec(n)) return std::make_unique<DenseMatMulKernel>(n, std::move(*spec), e);
      if (n.op_type() == "MatMul" && n.input(0)->dtype() == DType::Float32 && n.input(1)->dtype() == DType::Float32)
        return std::make_unique<BatchedMatMulKernel>(n);
      return nullptr;
    };
    for (const char* op : {"MatMul", "Gemm", "ondine.FusedMatMul", "ondine.FusedGemm"}) t[op] = matmul;
    t["Expand"] = [](const Node& n, const dnnl::engine&) -> std::unique_ptr<Kernel> {
      return std::make_unique<ExpandKernel>(n);
    };
    t["Pow"] = [](const Node& n, const dnnl::engine&) -> std::unique_ptr<Kernel> {
      const Value* e = n.num_inputs() > 1 ? n.input(1) : nullptr;
      if (!e || !e->is_constant() || e->constant().numel() != 1 || e->constant().at_double(0) != 2.0) return nullptr;
      return std::make_unique<SquareKernel>(n);
    };
    t["ondine.WeightOnlyMatMul"] = [](const Node& n, const dnnl::engine&) -> std::unique_ptr<Kernel> {
      const weight_only::Kernel kernel = weight_only::choose_kernel(n.attr_int("int8_activations", 0) != 0);
      auto packed = weight_only::pack_node(n, kernel);
      if (!packed) return nullptr;
      return std::make_unique<WeightOnlyMatMulKernel>(n, std::move(*packed), kernel);
    };
    t["ondine.Attention"] = [](const Node& n, const dnnl::engine&) -> std::unique_ptr<Kernel> {
      return std::make_unique<AttentionKernel>(n, host_exp());
    };
    t["ondine.Rotary"] = [](const Node& n, const dnnl::engine&) -> std::unique_ptr<Kernel> {
      return std::make_unique<RotaryKernel>(n);
    };
    t["ondine.RMSNorm"] = [](const Node& n, const dnnl::engine&) -> std::unique_ptr<Kernel> {
      return std::make_unique<LayerNormKernel>(n, true);
    };
    t["LayerNormalization"] = [](const Node& n, const dnnl::engine&) -> std::unique_ptr<Kernel> {
      for (std::size_t i = 1; i < n.num_outputs(); ++i)
        if (n.output(i) && (n.output(i)->has_uses() || n.output(i)->is_graph_output())) return nullptr;
      return std::make_unique<LayerNormKernel>(n);
    };
    for (const char* op : {"Softmax", "LogSoftmax"})
      t[op] = [](const Node& n, const dnnl::engine&) -> std::unique_ptr<Kernel> {
        return std::make_unique<SoftmaxKernel>(n, host_exp());
      };
    t["Add"] = [](const Node& n, const dnnl::engine&) -> std::unique_ptr<Kernel> {
      return std::make_unique<BinaryKernel>(n, BinaryOp::Add);
    };
    t["Sub"] = [](const Node& n, const dnnl::engine&) -> std::unique_ptr<Kernel> {
      return std::make_unique<BinaryKernel>(n, BinaryOp::Sub);
    };
    t["Mul"] = [](const Node& n, const dnnl::engine&) -> std::unique_ptr<Kernel> {
      return std::make_unique<BinaryKernel>(n, BinaryOp::Mul);
    };
    t["Div"] = [](const Node& n, const dnnl::engine&) -> std::unique_ptr<Kernel> {
      return std::make_unique<BinaryKernel>(n, BinaryOp::Div);
    };
    DynFactory unary = [](const Node& n, const dnnl::engine& e) -> std::unique_ptr<Kernel> {
      auto spec = eltwise_algorithms(n);
      if (!spec) return nullptr;
      return std::make_unique<EltwiseKernel>(n, *spec, e);
    };
    for (const char* op : {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Exp", "Log", "Softplus", "HardSwish",
                           "HardSigmoid", "Gelu", "ondine.Gelu", "ondine.FakeQuant"})
      t[op] = unary;
    t["Transpose"] = [](const Node& n, const dnnl::engine&) -> std::unique_ptr<Kernel> {
      return std::make_unique<TransposeKernel>(n);
    };
    t["Concat"] = [](const Node& n, const dnnl::engine&) -> std::unique_ptr<Kernel> {
      if (n.opset() < 4) return nullptr;  // axis optional before opset 4: the reference kernel's rule
      return std::make_unique<ConcatKernel>(n);
    };
    t["Split"] = [](const Node& n, const dnnl::engine&) -> std::unique_ptr<Kernel> {
      return std::make_unique<SplitKernel>(n);
    };
    t["Gather"] = [](const Node& n, const dnnl::engine&) -> std::unique_ptr<Kernel> {
      if (n.attr_int("axis", 0) != 0) return nullptr;
      return std::make_unique<GatherRowsKernel>(n);
    };
    return t;
  }();
  return table;
}

}  // namespace detail

class DynamicModel {
 public:
  // Runs options.passes on the symbolic graph (CompileOptions::passes: lower/pass_pipeline.hpp) and makes one
  // kernel per node. Computes in float32 (the precision
  // options of the per-shape compiler do not apply). Throws naming the node for an unsupported op.
  explicit DynamicModel(Graph graph, const CompileOptions& options = {}) : threads_(plan_thread_count(options)) {
    auto g = std::make_shared<Graph>(std::move(graph));
    g->verify();
    check_supported(*g);
    infer_shapes(*g);
    if (!options.passes.empty() && options.passes != "none" && detail::run_pipeline(*g, options.passes, options, true))
      infer_shapes(*g);
    detail::inline_constant_captures(*g);
    graph_ = g;
    // oneDNN fixes a primitive's work split when it is created: create them for the threads that run them.
    detail::ThreadCountScope threads(threads_);
    build(options);
  }

  // The outputs for `inputs` (checked as the reference executor checks them: names, dtypes, ranks, static
  // dims, one size per symbol).
  // With `times` (a profiled run), adds each step's time to it.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs,
                                    runtime::StageTimes* times = nullptr) const {
    return run(inputs, {}, times);
  }

  // The same, with outputs written into the caller's buffers (runtime/output_binding.hpp): each entry of
  // `bound` names an output and holds the tensor its values go into (its dtype, at least as many elements;
  // the returned output is a view of the buffer's first elements with the output's dims). The step that
  // computes a bound output writes it there directly where its kernel can (the KV cache's Concat, the
  // logits' matmul), else it is copied there. The other outputs come from the model's pool as run() gives
  // them.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs,
                                    const std::map<std::string, Tensor>& bound,
                                    runtime::StageTimes* times = nullptr) const {
    return run(inputs, bound, nullptr, times);
  }

  // The same with a KV cache (runtime/kv_cache.hpp, from make_kv_cache()): the cache gives the past inputs
  // (its first length() positions; `inputs` must not hold them), each pair's Concat writes only the new
  // positions into the cache's buffer, the attention reads keys and values there, and on success the cache
  // grows by the step's positions. The present outputs stay in the cache (not in the result; not bound).
  // A step whose new positions do not fit is an Error naming the output; the cache is then as before.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs,
                                    const std::map<std::string, Tensor>& bound, runtime::KvCache* cache,
                                    runtime::StageTimes* times = nullptr) const {
    const std::map<std::string, Tensor>* feeds = &inputs;
    std::map<std::string, Tensor> with_cache;
    std::vector<detail::Dims> cache_strides;
    if (cache) {
      check_cache(*cache, inputs, bound);
      with_cache = inputs;
      for (std::size_t i = 0; i < kv_slots_.size(); ++i) {
        with_cache[kv_slots_[i].pair.past] = cache->view(i, cache->length());
        cache_strides.push_back(detail::row_major_strides(cache->buffer(i).dims()));
      }
      feeds = &with_cache;
    }
    check_inputs(*graph_, *feeds);
    runtime::check_output_bindings(*graph_, *feeds, bound);
    std::unordered_map<int, std::pair<const Tensor*, const std::string*>> bound_ids;
    for (auto& [name, id] : output_ids_)
      if (auto it = bound.find(name); it != bound.end()) bound_ids.emplace(id, std::make_pair(&it->second, &it->first));
    detail::ThreadCountScope threads(threads_);
    dnnl::stream stream(engine_);
    detail::dyn::RunContext ctx{*pool_, stream, {}, {}};
    std::vector<Tensor> values(values_.size());
    // With a cache: the strides of the values that are views into it (the pasts, then the presents).
    std::vector<const detail::Dims*> value_strides(cache ? values_.size() : 0, nullptr);
    std::vector<std::int64_t> appended(kv_slots_.size(), -1);
    for (std::size_t i = 0; cache && i < kv_slots_.size(); ++i)
      value_strides[static_cast<std::size_t>(kv_slots_[i].past_id)] = &cache_strides[i];
    for (std::size_t i = 0; i < constants_.size(); ++i) values[constants_[i].first] = constants_[i].second;
    for (auto& [name, id] : input_ids_) values[id] = feeds->at(name);
    std::vector<Tensor> args;
    std::string key;
    for (const Step& s : steps_) {
      args.clear();
      ctx.strides.clear();
      for (int id : s.inputs) {
        if (id < 0) {
          args.emplace_back();
          continue;
        }
        if (values[static_cast<std::size_t>(id)].empty() && !is_none(values_[static_cast<std::size_t>(id)]))
          throw s.node->error("input '" + values_[static_cast<std::size_t>(id)]->name() + "' has no value");
        args.push_back(values[static_cast<std::size_t>(id)]);
        if (cache && value_strides[static_cast<std::size_t>(id)]) {
          ctx.strides.resize(s.inputs.size(), nullptr);
          ctx.strides[args.size() - 1] = value_strides[static_cast<std::size_t>(id)];
        }
      }
      if (cache && s.kv >= 0) {  // the pair's Concat: the new positions into the cache, nothing else moves
        const auto slot = static_cast<std::size_t>(s.kv);
        appended[slot] = append_to_cache(*cache, slot, args);
        values[static_cast<std::size_t>(kv_slots_[slot].present_id)] =
            cache->view(slot, cache->length() + appended[slot]);
        value_strides[static_cast<std::size_t>(kv_slots_[slot].present_id)] = &cache_strides[slot];
        continue;
      }
      std::vector<Tensor> outs;
      ctx.bound.clear();
      if (!bound_ids.empty())
        for (std::size_t i = 0; i < s.outputs.size(); ++i) {
          auto it = bound_ids.find(s.outputs[i]);
          if (it == bound_ids.end()) continue;
          ctx.bound.resize(s.outputs.size(), {nullptr, nullptr});
          ctx.bound[i] = it->second;
        }
      const auto start = times ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
      const bool memoised = s.memo && ctx.bound.empty() && Memo::key_of(s.node->op_type(), args, key);
      if (memoised) {
        std::lock_guard<std::mutex> lock(s.memo->mutex);
        if (key == s.memo->key) outs = s.memo->outputs;
      }
      if (!outs.empty()) {  // the memo's: the same inputs as last time
        for (std::size_t i = 0; i < s.outputs.size(); ++i)
          if (s.outputs[i] >= 0) values[static_cast<std::size_t>(s.outputs[i])] = outs[i];
        for (int id : s.release) values[static_cast<std::size_t>(id)] = Tensor();
        if (times) times->add(s.node->op_type(), "memoised", s.node->name(), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        continue;
      }
      try {
        outs = s.kernel ? s.kernel->run(ctx, args) : s.reference(*s.node, args);
      } catch (const dnnl::error& e) {
        throw s.node->error(std::string("oneDNN: ") + e.what());
      } catch (Error& e) {
        if (e.node().empty() && e.op().empty()) e.at_node(s.node->name(), s.node->op_type());
        throw;
      } catch (const std::exception& e) {
        throw s.node->error(e.what());
      }
      if (outs.size() < s.outputs.size())
        throw s.node->error("kernel returned " + std::to_string(outs.size()) + " outputs, expected " +
                            std::to_string(s.outputs.size()));
      if (memoised && !outs.empty()) {
        // Kept in memory of their own: an output that is a view (a Reshape's of a pooled value) must not
        // hold the pool's buffer.
        std::vector<Tensor> kept;
        for (const Tensor& t : outs) {
          if (t.kind() != Tensor::Kind::Dense || !t.nbytes() || t.is_sole_owner()) {
            kept.push_back(t);
            continue;
          }
          Tensor own(t.dtype(), t.dims());
          std::memcpy(own.raw(), t.raw(), t.nbytes());
          kept.push_back(std::move(own));
        }
        std::lock_guard<std::mutex> lock(s.memo->mutex);
        s.memo->key = key;
        s.memo->outputs = std::move(kept);
      }
      for (std::size_t i = 0; i < s.outputs.size(); ++i) {
        if (s.outputs[i] < 0) continue;
        if (i < ctx.bound.size() && ctx.bound[i].first) {  // into the caller's buffer (there already, or copied)
          try {
            outs[i] = runtime::write_output(outs[i], *ctx.bound[i].first, *ctx.bound[i].second);
          } catch (Error& e) {
            if (e.node().empty()) e.at_node(s.node->name(), s.node->op_type());
            throw;
          }
        }
        values[static_cast<std::size_t>(s.outputs[i])] = std::move(outs[i]);
      }
      for (int id : s.release) values[static_cast<std::size_t>(id)] = Tensor();
      if (times)
        times->add(s.node->op_type(), s.kernel ? s.kernel->implementation() : "reference", s.node->name(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    if (cache) {  // every pair grew by the same positions (a decoder's layers see the same tokens)
      for (std::size_t i = 1; i < appended.size(); ++i)
        if (appended[i] != appended[0])
          throw Error("KV cache: '" + kv_slots_[i].pair.present + "' grew by " + std::to_string(appended[i]) +
                      " positions and '" + kv_slots_[0].pair.present + "' by " + std::to_string(appended[0]) +
                      "; a cache keeps one length for all its pairs");
      if (!appended.empty()) cache->advance(appended[0]);
    }
    std::map<std::string, Tensor> result;
    for (auto& [name, id] : output_ids_) {
      if (cache && is_kv_present(id)) continue;  // it stays in the cache
      Tensor& t = values[static_cast<std::size_t>(id)];
      if (t.empty() && t.kind() == Tensor::Kind::Dense && !values_[static_cast<std::size_t>(id)]->is_graph_input())
        throw Error("graph output '" + name + "' was not computed");
      auto it = bound.find(name);
      // A bound output no step wrote (a graph input or a constant passed through): copied into its buffer.
      result[name] = it == bound.end() || t.raw() == it->second.raw() ? t : runtime::write_output(t, it->second, name);
    }
    values.clear();
    // Every unbound output in memory of its own, as a compiled plan gives it: one that is an input, a
    // weight or a view of either (a reference kernel's Identity or Reshape) is copied, so that the caller
    // may write to it (the Python module hands out writeable arrays only for such outputs).
    for (auto& [name, t] : result)
      if (!bound.count(name) && t.kind() == Tensor::Kind::Dense && t.dtype() != DType::String && t.nbytes() &&
          !t.is_sole_owner()) {
        Tensor own = pool_->tensor(t.dtype(), t.dims());
        std::memcpy(own.raw(), t.raw(), t.nbytes());
        t = own;
      }
    return result;
  }

  // One line per step: the node, its op and what runs it.
  std::vector<runtime::StepInfo> steps() const {
    std::vector<runtime::StepInfo> out;
    for (const Step& s : steps_)
      out.push_back({s.node->name(), s.node->op_type(), s.kernel ? s.kernel->implementation() : "reference", ""});
    return out;
  }
  std::string to_text() const {
    std::ostringstream os;
    std::size_t i = 0;
    for (const auto& s : steps()) os << "[" << i++ << "] " << s.op << " '" << s.name << "': " << s.implementation << "\n";
    os << steps_.size() << " steps, " << reference_steps() << " on reference kernels; any shape, compiled once\n";
    return os.str();
  }
  std::size_t reference_steps() const {
    std::size_t n = 0;
    for (const Step& s : steps_) n += s.kernel ? 0 : 1;
    return n;
  }
  // True when every step runs a kernel of its own or an op that is cheap on its reference kernel
  // (detail::cheap_on_reference): the model's work is what this plan runs fast.
  bool covers() const {
    for (const Step& s : steps_)
      if (!s.kernel && !detail::cheap_on_reference(s.node->op_key())) return false;
    return true;
  }
  // The ops that keep covers() false.
  std::set<std::string> uncovered_ops() const {
    std::set<std::string> ops;
    for (const Step& s : steps_)
      if (!s.kernel && !detail::cheap_on_reference(s.node->op_key())) ops.insert(s.node->op_key());
    return ops;
  }
  const Graph& graph() const { return *graph_; }

  // The past/present pairs a KV cache can hold (runtime/kv_cache.hpp): a past input that only a Concat (as
  // its first operand) and Shape read, the Concat's result a graph output that only attention and Shape
  // read. Empty for a model without such pairs.
  std::vector<runtime::KvPair> kv_pairs() const {
    std::vector<runtime::KvPair> pairs;
    for (const KvSlot& s : kv_slots_) pairs.push_back(s.pair);
    return pairs;
  }

  // A cache for `capacity` positions of every pair: each buffer has the past's dims with `capacity` on the
  // pair's axis, and for a symbolic dim (the batch) its size in `dims`, else 1.
  runtime::KvCache make_kv_cache(std::int64_t capacity, const std::map<std::string, std::int64_t>& dims = {}) const {
    if (kv_slots_.empty())
      throw Error("the model has no KV cache pairs: a past input read only by a Concat (and Shape) whose "
                  "result is an output read only by attention (and Shape)");
    if (capacity <= 0) throw Error("a KV cache needs a capacity of at least one position");
    std::vector<std::vector<std::int64_t>> shapes;
    DType dtype = DType::Undefined;
    for (const KvSlot& s : kv_slots_) {
      const Value* past = values_[static_cast<std::size_t>(s.past_id)];
      std::vector<std::int64_t> d;
      for (std::size_t i = 0; i < past->shape().rank(); ++i) {
        const Dim& dim = past->shape()[i];
        if (i == s.pair.axis) d.push_back(capacity);
        else if (dim.is_static()) d.push_back(dim.value);
        else if (dim.symbol.empty())
          throw Error("input '" + past->name() + "' has an unnamed dim " + std::to_string(i) +
                      ": a KV cache cannot size it");
        else {
          auto it = dims.find(dim.symbol);
          if (it != dims.end() && it->second <= 0)
            throw Error("KV cache: dim '" + dim.symbol + "' must be positive");
          d.push_back(it == dims.end() ? 1 : it->second);
        }
      }
      shapes.push_back(std::move(d));
      dtype = past->dtype();
    }
    return runtime::KvCache(kv_pairs(), shapes, dtype, capacity);
  }

  // The pool the values live in: bytes() grows to the largest shapes' working set, then stays.
  const runtime::BufferPool& pool() const { return *pool_; }

 private:
  // A shape-arithmetic step (Shape, Gather, Unsqueeze, Concat, ... on a few integers) gives the same outputs
  // for the same inputs: its last inputs and outputs are kept, so that a decode, whose shape values repeat
  // from token to token, skips the reference kernels of most of them. The key is what the outputs depend
  // on: the dims of Shape's and Size's input, the values of the other inputs (integers or booleans, at most
  // kMaxValues each); a step with any other input is run every time.
  struct Memo {
    static constexpr std::int64_t kMaxValues = 16;
    std::mutex mutex;
    std::string key;
    std::vector<Tensor> outputs;
    // The key of `args` for `op` (types, dims and the values' bytes), or false when an input does not qualify.
    static bool key_of(const std::string& op, const std::vector<Tensor>& args, std::string& key) {
      key.clear();
      const bool dims_only = op == "Shape" || op == "Size";
      auto put = [&](std::int64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
      for (const Tensor& t : args) {
        if (t.kind() != Tensor::Kind::Dense) return false;
        put(static_cast<std::int64_t>(t.dtype()));
        put(static_cast<std::int64_t>(t.rank()));
        for (std::int64_t d : t.dims()) put(d);
        if (dims_only || t.nbytes() == 0) continue;
        if (t.numel() > kMaxValues || !(is_integer(t.dtype()) || t.dtype() == DType::Bool)) return false;
        key.append(static_cast<const char*>(t.raw()), t.nbytes());
      }
      return true;
    }
  };

  struct Step {
    const Node* node = nullptr;
    std::unique_ptr<detail::dyn::Kernel> kernel;  // null: the reference kernel
    reference::Kernel reference;
    std::vector<int> inputs, outputs, release;
    int kv = -1;  // a KV pair's Concat: its index in kv_slots_
    std::unique_ptr<Memo> memo;  // shape arithmetic on the reference kernel (Memo)
  };
  struct KvSlot {
    runtime::KvPair pair;
    int past_id = -1, present_id = -1;
  };

  bool is_kv_present(int id) const {
    for (const KvSlot& s : kv_slots_)
      if (s.present_id == id) return true;
    return false;
  }

  // The cache fits this model and the call: its pairs are this model's, the call gives no past input and
  // binds no present output.
  void check_cache(const runtime::KvCache& cache, const std::map<std::string, Tensor>& inputs,
                   const std::map<std::string, Tensor>& bound) const {
    const auto& pairs = cache.pairs();
    bool same = pairs.size() == kv_slots_.size();
    for (std::size_t i = 0; same && i < pairs.size(); ++i)
      same = pairs[i].past == kv_slots_[i].pair.past && pairs[i].present == kv_slots_[i].pair.present &&
             pairs[i].axis == kv_slots_[i].pair.axis &&
             cache.buffer(i).dtype() == values_[static_cast<std::size_t>(kv_slots_[i].past_id)]->dtype();
    if (!same) throw Error("this KV cache was made for another model (make it with this model's make_kv_cache)");
    for (const KvSlot& s : kv_slots_) {
      if (inputs.count(s.pair.past))
        throw Error("input '" + s.pair.past + "' comes from the KV cache: leave it out of the inputs");
      if (bound.count(s.pair.present))
        throw Error("output '" + s.pair.present + "' stays in the KV cache: it cannot be bound to a buffer");
    }
  }

  // Writes the new positions of pair `slot` (the Concat's operands after the past) after the cache's
  // length() positions; returns how many. Nothing is written when they do not fit.
  std::int64_t append_to_cache(runtime::KvCache& cache, std::size_t slot, const std::vector<Tensor>& args) const {
    const KvSlot& kv = kv_slots_[slot];
    Tensor buffer = cache.buffer(slot);  // shares the storage: written below
    const std::size_t axis = kv.pair.axis;
    const Node& concat = *steps_[kv_step_[slot]].node;
    std::int64_t added = 0;
    for (std::size_t i = 1; i < args.size(); ++i) {
      const Tensor& t = args[i];
      if (t.kind() != Tensor::Kind::Dense || t.dtype() != buffer.dtype() || t.rank() != buffer.rank())
        throw concat.error("operand " + std::to_string(i) + " is " + std::string(dtype_name(t.dtype())) +
                           dims_str(t.dims()) + "; the KV cache for '" + kv.pair.present + "' holds " +
                           std::string(dtype_name(buffer.dtype())) + dims_str(buffer.dims()));
      for (std::size_t d = 0; d < t.rank(); ++d)
        if (d != axis && t.dims()[d] != buffer.dims()[d])
          throw concat.error("operand " + std::to_string(i) + " is " + dims_str(t.dims()) + "; the KV cache for '" +
                             kv.pair.present + "' was made for " + dims_str(buffer.dims()) + " (dim " +
                             std::to_string(d) + " differs: make the cache with that size)");
      added += t.dims()[axis];
    }
    const std::int64_t length = cache.length(), capacity = cache.capacity();
    if (added > capacity - length)
      throw concat.error("the KV cache for '" + kv.pair.present + "' holds " + std::to_string(capacity) +
                         " positions: " + std::to_string(length) + " cached and " + std::to_string(added) +
                         " new do not fit (make the cache with a larger capacity)");
    const detail::Dims& dims = buffer.dims();
    std::int64_t outer = 1, inner = 1;  // positions before the axis; elements of one position
    for (std::size_t d = 0; d < dims.size(); ++d) {
      if (d < axis) outer *= dims[d];
      else if (d > axis) inner *= dims[d];
    }
    const std::size_t position = static_cast<std::size_t>(inner) * dtype_size(buffer.dtype());
    char* base = static_cast<char*>(buffer.raw());
    std::int64_t at = length;
    for (std::size_t i = 1; i < args.size(); ++i) {
      const std::int64_t n = args[i].dims()[axis];
      const char* src = static_cast<const char*>(args[i].raw());
      const std::size_t bytes = static_cast<std::size_t>(n) * position;
      if (bytes)
        detail::dyn::parallel_rows(outer, static_cast<std::int64_t>(bytes / 4), [&](std::int64_t b, std::int64_t e) {
          for (std::int64_t o = b; o < e; ++o)
            std::memcpy(base + (static_cast<std::size_t>(o * capacity + at)) * position,
                        src + static_cast<std::size_t>(o) * bytes, bytes);
        });
      at += n;
    }
    return added;
  }

  // Finds the KV pairs (kv_pairs()) among the steps as they run (after the attention absorbed its Transposes).
  void find_kv_pairs() {
    std::unordered_map<int, std::vector<std::pair<std::size_t, std::size_t>>> readers;  // id -> (step, operand)
    for (std::size_t i = 0; i < steps_.size(); ++i)
      for (std::size_t k = 0; k < steps_[i].inputs.size(); ++k)
        if (steps_[i].inputs[k] >= 0) readers[steps_[i].inputs[k]].emplace_back(i, k);
    std::map<int, int> output_count;
    for (auto& [name, id] : output_ids_) ++output_count[id];
    std::set<int> graph_inputs;
    for (auto& [name, id] : input_ids_) graph_inputs.insert(id);
    auto op_of = [&](std::size_t step) { return steps_[step].node->op_key(); };
    for (std::size_t c = 0; c < steps_.size(); ++c) {
      Step& s = steps_[c];
      if (op_of(c) != "Concat" || !dynamic_cast<detail::dyn::ConcatKernel*>(s.kernel.get()) || s.inputs.size() < 2 ||
          s.outputs.size() != 1)
        continue;
      const int past = s.inputs[0], present = s.outputs[0];
      if (past < 0 || present < 0 || !graph_inputs.count(past) || output_count[present] != 1 ||
          output_count.count(past))
        continue;
      const Value* pv = values_[static_cast<std::size_t>(past)];
      if (pv->dtype() != DType::Float32 || !pv->shape().rank_known() || pv->shape().rank() == 0) continue;
      const auto rank = static_cast<std::int64_t>(pv->shape().rank());
      std::int64_t axis = s.node->attr_int("axis", 1);
      if (axis < 0) axis += rank;
      if (axis < 0 || axis >= rank) continue;
      bool ok = true;
      for (auto [step, operand] : readers[past])
        ok = ok && ((step == c && operand == 0) || op_of(step) == "Shape");
      for (std::size_t k = 1; k < s.inputs.size(); ++k) ok = ok && s.inputs[k] != past && s.inputs[k] >= 0;
      for (auto [step, operand] : readers[present]) {
        const bool attention = dynamic_cast<detail::dyn::AttentionKernel*>(steps_[step].kernel.get()) != nullptr;
        ok = ok && (op_of(step) == "Shape" || (attention && (operand == 1 || operand == 2)));
      }
      if (!ok) continue;
      s.kv = static_cast<int>(kv_slots_.size());
      const std::string present_name = values_[static_cast<std::size_t>(present)]->name();
      kv_slots_.push_back({{pv->name(), present_name, static_cast<std::size_t>(axis)}, past, present});
      kv_step_.push_back(c);
    }
  }

  static bool is_none(const Value*) { return false; }

  void build(const CompileOptions& options) {
    const Graph& g = *graph_;
    std::unordered_map<const Value*, int> ids;
    auto id_of = [&](const Value* v) {
      auto [it, fresh] = ids.emplace(v, static_cast<int>(values_.size()));
      if (fresh) values_.push_back(v);
      return it->second;
    };
    for (Value* in : g.inputs()) input_ids_.emplace_back(in->name(), id_of(in));
    const auto& table = detail::dynamic_kernel_table();
    const auto& kernels = reference::kernel_table();
    for (Node* n : g.topo_order()) {
      Step s;
      s.node = n;
      for (std::size_t i = 0; i < n->num_inputs(); ++i) {
        const Value* v = n->input(i);
        if (!v) {
          s.inputs.push_back(-1);
          continue;
        }
        const bool fresh = !ids.count(v);
        const int id = id_of(v);
        if (fresh && v->is_constant()) constants_.emplace_back(id, v->constant());
        s.inputs.push_back(id);
      }
      for (std::size_t i = 0; i < n->num_outputs(); ++i) s.outputs.push_back(n->output(i) ? id_of(n->output(i)) : -1);
      if (!options.reference_ops.count(n->op_key()))
        if (auto it = table.find(n->op_key()); it != table.end()) {
          try {
            s.kernel = it->second(*n, engine_);
          } catch (const dnnl::error&) {
            s.kernel = nullptr;  // oneDNN has no primitive for it here: the reference kernel runs it
          }
        }
      if (!s.kernel) s.reference = kernels.at(n->op_key());
      if (!s.kernel && n->domain().empty() && n->subgraphs().empty() &&
          (n->op_type() == "Shape" || detail::cheap_on_reference(n->op_type())))
        s.memo = std::make_unique<Memo>();
      steps_.push_back(std::move(s));
    }
    for (Value* out : g.outputs()) {
      const bool fresh = !ids.count(out);
      const int id = id_of(out);
      if (fresh && out->is_constant()) constants_.emplace_back(id, out->constant());
      output_ids_.emplace_back(out->name(), id);
    }
    absorb_attention_transposes();
    find_kv_pairs();
    dnnl::stream stream(engine_);
    for (const Step& s : steps_)
      if (s.kernel) s.kernel->warm_up(stream);
    // Each value goes back to the pool after its last reader; the graph's outputs are kept.
    std::unordered_map<int, std::size_t> last_use;
    for (std::size_t i = 0; i < steps_.size(); ++i)
      for (int id : steps_[i].inputs)
        if (id >= 0) last_use[id] = i;
    std::set<int> keep;
    for (auto& [name, id] : output_ids_) keep.insert(id);
    for (auto& [id, step] : last_use) {
      const Value* v = values_[static_cast<std::size_t>(id)];
      if (!keep.count(id) && !v->is_graph_input() && !v->is_constant()) steps_[step].release.push_back(id);
    }
    // A value nobody reads (an unused optional output) is dropped right after it is made.
    for (std::size_t i = 0; i < steps_.size(); ++i)
      for (int id : steps_[i].outputs)
        if (id >= 0 && !last_use.count(id) && !keep.count(id)) steps_[i].release.push_back(id);
  }

  // The Transposes around each ondine.Attention that only it reads (Q, K^T, V split into heads; the
  // output merged back) become strides its kernel reads and writes with: their copies are not made
  // (dyn::AttentionKernel::absorb_input / absorb_output).
  void absorb_attention_transposes() {
    std::unordered_map<int, std::size_t> producer;
    std::unordered_map<int, int> readers;
    for (std::size_t i = 0; i < steps_.size(); ++i) {
      for (int id : steps_[i].outputs)
        if (id >= 0) producer[id] = i;
      for (int id : steps_[i].inputs)
        if (id >= 0) ++readers[id];
    }
    for (auto& [name, id] : output_ids_) readers[id] += 2;  // an output is read by the caller: never absorbed
    auto transpose_perm = [&](const Step& t) -> std::optional<std::vector<std::int64_t>> {
      if (t.node->op_key() != "Transpose" || t.inputs.empty() || t.inputs[0] < 0) return std::nullopt;
      const Value* x = values_[static_cast<std::size_t>(t.inputs[0])];
      if (!x->shape().rank_known()) return std::nullopt;
      std::vector<std::int64_t> perm;
      if (t.node->has_attr("perm")) perm = t.node->attr_ints("perm");
      else
        for (std::size_t i = x->shape().rank(); i-- > 0;) perm.push_back(static_cast<std::int64_t>(i));
      if (perm.size() != x->shape().rank()) return std::nullopt;
      return perm;
    };
    std::set<std::size_t> absorbed;
    for (std::size_t i = 0; i < steps_.size(); ++i) {
      Step& s = steps_[i];
      auto* attention = dynamic_cast<detail::dyn::AttentionKernel*>(s.kernel.get());
      if (!attention) continue;
      for (std::size_t k = 0; k < 3 && k < s.inputs.size(); ++k) {
        const int id = s.inputs[k];
        if (id < 0 || readers[id] != 1 || !producer.count(id)) continue;
        const std::size_t t = producer.at(id);
        auto perm = transpose_perm(steps_[t]);
        if (!perm || absorbed.count(t) || !attention->absorb_input(k, *steps_[t].node, *perm)) continue;
        s.inputs[k] = steps_[t].inputs[0];
        absorbed.insert(t);
      }
      const int out = s.outputs.empty() ? -1 : s.outputs[0];
      if (out < 0 || readers[out] != 1) continue;
      for (std::size_t t = i + 1; t < steps_.size(); ++t) {
        if (steps_[t].inputs.empty() || steps_[t].inputs[0] != out) continue;
        auto perm = transpose_perm(steps_[t]);
        if (perm && !absorbed.count(t) && attention->absorb_output(*steps_[t].node, *perm)) {
          s.outputs[0] = steps_[t].outputs[0];
          absorbed.insert(t);
        }
        break;
      }
    }
    if (absorbed.empty()) return;
    std::vector<Step> kept;
    for (std::size_t i = 0; i < steps_.size(); ++i)
      if (!absorbed.count(i)) kept.push_back(std::move(steps_[i]));
    steps_ = std::move(kept);
  }

  std::shared_ptr<const Graph> graph_;
  int threads_ = 0;
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  std::shared_ptr<runtime::BufferPool> pool_ = runtime::BufferPool::make();
  std::vector<const Value*> values_;
  std::vector<std::pair<int, Tensor>> constants_;
  std::vector<std::pair<std::string, int>> input_ids_, output_ids_;
  std::vector<Step> steps_;
  std::vector<KvSlot> kv_slots_;
  std::vector<std::size_t> kv_step_;  // the step of each slot's Concat
};

}  // namespace ondine::lower
