// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/context.hpp - the Lowering state shared by the per-op lowerings: it maps graph values to
// slots and layouts while the program is built (memory descriptors: detail/descriptors.hpp; the step types and
// the oneDNN backend: detail/steps.hpp).
//
// Layout policy: each value is produced in the layout its producer chose (conv/matmul pick theirs
// through format_tag::any; layout-agnostic ops inherit their input's). A consumer that needs another
// layout asks Lowering::slot_in(value, desc), which inserts one reorder per (value, layout) and reuses it.
// Row-major-equivalent layouts (e.g. NHWC and NCHW of a [N,C,1,1] tensor) are recognised as the same
// bytes, so no reorder is inserted for them.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "oneapi/dnnl/dnnl_debug.h"
#include "ondine/ir/graph.hpp"
#include "ondine/lower/detail/descriptors.hpp"
#include "ondine/lower/detail/layout_name.hpp"
#include "ondine/lower/detail/steps.hpp"
#include "ondine/lower/options.hpp"
#include "ondine/lower/packed_weights.hpp"
#include "ondine/reference/executor.hpp"
#include "ondine/runtime/compiled_model.hpp"

namespace ondine::lower {

namespace detail {

using dnnl::memory;
using runtime::SlotId;
using runtime::SlotKind;
using Dims = std::vector<std::int64_t>;

// --- the lowering state ---------------------------------------------------------------------------

struct ValueState {
  SlotId slot = 0;
  bool has_md = false;
  memory::desc md;  // its layout in `slot` (for dtypes oneDNN knows)
  std::vector<std::pair<memory::desc, SlotId>> copies;  // the same value reordered into other layouts
  // Set for a strided view not copied yet (Lowering::define_strided_view): `md` reads another value's
  // bytes through strides and an offset. The first reader that needs the value in a layout of its own
  // gets it copied by one reorder, labelled with this node.
  const Node* view_of = nullptr;
};

struct ConcatHost;  // shape_ops.hpp

class Lowering {
 public:
  Lowering(const Graph& graph, const CompileOptions& options, std::shared_ptr<Library> library,
           runtime::Program& program)
      : graph(graph), options(options), library(std::move(library)), program(program) {
    for (Value* v : graph.outputs()) {
      if (output_slot_.count(v)) continue;
      std::size_t index = program.outputs.size();
      SlotId slot = add_slot(slot_for(v, SlotKind::Output, index));
      program.outputs.push_back({v->name(), v->dtype(), v->shape().sizes(), slot});
      output_slot_[v] = slot;
      output_order_.push_back(v);
    }
    for (Value* v : graph.inputs()) {
      std::size_t index = program.inputs.size();
      SlotId slot = add_slot(slot_for(v, SlotKind::Input, index));
      program.inputs.push_back({v->name(), v->dtype(), v->shape().sizes(), slot});
      define_plain(v, slot);
    }
  }

  const Graph& graph;
  const CompileOptions& options;
  std::shared_ptr<Library> library;
  runtime::Program& program;
  std::vector<std::unique_ptr<runtime::Step>> steps;
  std::size_t scratchpad_bytes = 0;
  std::size_t constant_bytes = 0;
  std::set<const Node*> fused;  // nodes folded into an earlier primitive (post-ops); not lowered again
  CompileFn compile_body = nullptr;  // compiles control-flow subgraphs: the driver (lower/compiler.hpp)
  const Node* current = nullptr;  // the node being lowered (names the step in PackedWeights::repacks())
  // Concats that share one buffer (shape_ops.hpp), by member node.
  std::map<const Node*, std::shared_ptr<ConcatHost>> concat_hosts;

  const dnnl::engine& engine() const { return library->engine; }

  // Attributes every primitive gets: the scratchpad is the context's (user mode), so that concurrent
  // runs of one primitive never share library-owned scratch memory.
  static dnnl::primitive_attr base_attr() {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return attr;
  }

  // --- slots ---
  SlotId add_slot(runtime::Slot s) {
    program.slots.push_back(std::move(s));
    return static_cast<SlotId>(program.slots.size() - 1);
  }
  static runtime::Slot slot_for(const Value* v, SlotKind kind, std::size_t index) {
    runtime::Slot s;
    s.name = v->name();
    s.dtype = v->dtype();
    s.dims = v->shape().sizes();
    s.bytes = static_cast<std::size_t>(v->shape().numel().value_or(0)) * dtype_size(v->dtype());
    s.layout = plain_layout_name(s.dims.size());
    s.kind = kind;
    s.index = index;
    return s;
  }
  SlotId root(SlotId id) const {
    const runtime::Slot& s = program.slots[id];
    return s.kind == SlotKind::Alias ? static_cast<SlotId>(s.index) : id;
  }
  // A slot for `v` sharing `src`'s bytes from their start: an Alias of src's root at src's offset.
  runtime::Slot alias_slot(const Value* v, SlotId src) const {
    runtime::Slot s = slot_for(v, SlotKind::Alias, root(src));
    if (program.slots[src].kind == SlotKind::Alias) s.offset = program.slots[src].offset;
    return s;
  }
  bool is_output_slot_of(const Value* v, SlotId slot) const {
    auto it = output_slot_.find(v);
    return it != output_slot_.end() && it->second == slot;
  }

  // A slot for value `v` produced in layout `md` (row-major when `md` is null). A graph output in a
  // row-major layout is written straight into the caller's output tensor.
  SlotId new_plain_slot(const Value* v) { return new_value_slot(v, nullptr); }
  SlotId new_value_slot(const Value* v, const memory::desc& md) { return new_value_slot(v, &md); }
  SlotId new_value_slot(const Value* v, const memory::desc* md) {
    bool row_major = !md || is_row_major(*md);
    auto it = output_slot_.find(v);
    if (row_major && it != output_slot_.end() && !output_taken_.count(v)) {
      output_taken_.insert(v);
      return it->second;
    }
    runtime::Slot s = slot_for(v, SlotKind::Arena, 0);
    if (md && !row_major) {
      s.bytes = md->get_size();
      s.layout = layout_name(*md);
    }
    return add_slot(std::move(s));
  }

  // --- values ---
  bool known(const Value* v) const { return values_.count(v) != 0; }
  void define(const Value* v, SlotId slot, const memory::desc& md) {
    ValueState st;
    st.slot = slot;
    st.has_md = true;
    st.md = md;
    values_[v] = st;
  }
  void define_plain(const Value* v, SlotId slot) {
    ValueState st;
    st.slot = slot;
    memory::data_type dt;
    if (dnnl_dtype(v->dtype(), dt)) {
      st.has_md = true;
      st.md = plain_md(v->shape().sizes(), dt);
    }
    values_[v] = st;
  }
  ValueState& state(const Value* v) {
    auto it = values_.find(v);
    if (it != values_.end()) {
      if (it->second.view_of) materialize(v, it->second);
      return it->second;
    }
    if (v->is_constant()) {  // constants read through slots (by reference kernels, views, copies)
      std::size_t index = program.constants.size();
      program.constants.push_back(v->constant());
      define_plain(v, add_slot(slot_for(v, SlotKind::Constant, index)));
      return values_.at(v);
    }
    throw Error("internal: value '" + v->name() + "' is used before it is computed");
  }
  // A value's bytes as an unblocked, possibly strided layout over a slot, without a copy: a strided
  // view not copied yet, or a value its producer wrote row-major or strided. Empty for a blocked
  // layout or a dtype oneDNN does not know.
  std::optional<std::pair<SlotId, memory::desc>> strided_source(const Value* v) {
    auto it = values_.find(v);
    const ValueState& st = it != values_.end() ? it->second : state(v);
    const dnnl_memory_desc_t& d = st.md.data;
    if (!st.has_md || d.format_kind != dnnl_blocked || d.format_desc.blocking.inner_nblks != 0 || d.extra.flags != 0)
      return std::nullopt;
    for (int i = 0; i < d.ndims; ++i)
      if (d.padded_dims[i] != d.dims[i]) return std::nullopt;
    return std::make_pair(st.slot, st.md);
  }

  // Defines `y` (not a graph output) as `md` over `src`'s bytes, copying nothing: a zero-copy alias when
  // `md` is row-major, else a strided view that readers able to take strides read as it is (attention,
  // Transpose, Slice, Reshape) and any other reader gets copied once (state()).
  void define_strided_view(const Node& n, const Value* y, SlotId src, const memory::desc& md, const std::string& detail) {
    if (output_slot_.count(y)) throw Error("internal: graph output '" + y->name() + "' defined as a strided view");
    SlotId view = add_slot(alias_slot(y, src));
    add_step(std::make_unique<ViewStep>(runtime::StepInfo{n.name(), n.op_type(), "view", detail}, src, view));
    ValueState st;
    st.slot = view;
    st.has_md = true;
    st.md = is_row_major(md) ? plain_md(y->shape().sizes(), md.data_type()) : md;
    if (!is_row_major(md)) st.view_of = &n;
    values_[y] = st;
  }

  // The layout of a value (its producer's choice).
  memory::desc md_of(const Value* v) { return state(v).md; }

  // The value in layout `want`, reordering (once per layout) when its layout differs. A strided view not
  // copied yet is reordered from its strides straight into `want` when that is another layout or dtype
  // (a bf16 matmul source: one pass, not a row-major copy and then a conversion).
  SlotId slot_in(const Value* v, const memory::desc& want) {
    auto view = values_.find(v);
    const bool direct = view != values_.end() && view->second.view_of &&
                        !(is_row_major(want) && want.data_type() == view->second.md.data_type());
    ValueState& st = direct ? view->second : state(v);
    if (!st.has_md) throw Error("internal: value '" + v->name() + "' has no oneDNN layout");
    if (same_layout(st.md, want)) return st.slot;
    for (auto& [md, slot] : st.copies)
      if (same_layout(md, want)) return slot;
    runtime::Slot s = slot_for(v, SlotKind::Arena, 0);
    s.name = v->name() + "." + layout_name(want);
    s.bytes = want.get_size();
    s.layout = is_row_major(want) ? plain_layout_name(s.dims.size()) : layout_name(want);
    SlotId slot = add_slot(std::move(s));
    add_reorder(v->name(), st.slot, st.md, slot, want);
    st.copies.emplace_back(want, slot);
    return slot;
  }
  // The value as row-major bytes (any dtype).
  // A float32 value held in bfloat16 (Precision::Bf16) is converted back: row-major readers (the
  // reference kernels, copies) read the value's own dtype.
  SlotId row_major_slot(const Value* v) {
    ValueState& st = state(v);
    memory::data_type dt = st.md.data_type();
    if (st.has_md && dt == memory::data_type::bf16 && v->dtype() == DType::Float32) dt = memory::data_type::f32;
    if (!st.has_md || (is_row_major(st.md) && dt == st.md.data_type())) return st.slot;
    return slot_in(v, plain_md(v->shape().sizes(), dt));
  }

  // Whether conv/matmul `n`, which could compute in bfloat16 (`eligible`: float32 with constant weights),
  // does: runs_bf16(n). Under Precision::Bf16 the choice is recorded for the plan's precision summary.
  bool choose_bf16(const Node& n, bool eligible) {
    if (options.precision != Precision::Bf16 || !eligible) return false;
    const bool bf16 = runs_bf16(n);
    std::vector<const Node*>& list = bf16 ? bf16_nodes : kept_fp32_nodes;
    if (std::find(list.begin(), list.end(), &n) == list.end()) list.push_back(&n);  // once per node (retries)
    return bf16;
  }
  std::vector<const Node*> bf16_nodes, kept_fp32_nodes;
  // A node choose_bf16 counted as bf16 that runs in float32 after all (oneDNN has no fast bf16 primitive
  // for it): the plan lists it with the nodes kept float32.
  void record_fp32_fallback(const Node& n) {
    bf16_nodes.erase(std::remove(bf16_nodes.begin(), bf16_nodes.end(), &n), bf16_nodes.end());
    if (std::find(kept_fp32_nodes.begin(), kept_fp32_nodes.end(), &n) == kept_fp32_nodes.end())
      kept_fp32_nodes.push_back(&n);
  }

  // Whether node `n` computes in bfloat16: Precision::Bf16 and not kept float32 (CompileOptions::keep_fp32).
  bool runs_bf16(const Node& n) const {
    if (options.precision != Precision::Bf16 || options.fp32_nodes.count(n.name())) return false;
    for (const std::string& pattern : options.keep_fp32)
      if (glob_match(pattern, n.name())) return false;
    return true;
  }

  // What decided knob `knob` (a CompileOptions field, by its tuner name) for StepInfo::choice: "tuned" /
  // "heuristic" as CompileOptions::choice_origins says, else "option" where the caller set it (`set`), else
  // "heuristic".
  std::string choice_origin(const std::string& knob, bool set) const {
    auto it = options.choice_origins.find(knob);
    if (it != options.choice_origins.end()) return it->second;
    return set ? "option" : "heuristic";
  }
  // A 3x3 convolution's algorithm: its own (the tuner's, per node) or the model-wide one; and what decided it.
  ConvAlgorithm conv_algorithm_for(const Node& n) const {
    auto it = options.conv_algorithm_per_node.find(n.name());
    return it != options.conv_algorithm_per_node.end() ? it->second : options.conv_algorithm;
  }
  std::string conv_algorithm_origin(const Node& n) const {
    if (options.conv_algorithm_per_node.count(n.name())) return "tuned";
    return choice_origin("conv_algorithm", options.conv_algorithm != ConvAlgorithm::Auto);
  }
  // "bf16 (option)", "fp32 (keep_fp32)": the precision node `n` computes in, where the model runs bf16; ""
  // in a float32 compile (nothing was chosen per step).
  std::string precision_choice(const Node& n) const {
    if (options.precision != Precision::Bf16) return "";
    if (options.fp32_nodes.count(n.name())) return "fp32 (tuned)";
    if (!runs_bf16(n)) return "fp32 (keep_fp32)";
    return "bf16 (" + choice_origin("precision", true) + ")";
  }

  // The ops that only re-label or re-stride their input's bytes (shape_ops.hpp), whose output keeps the
  // input's dtype as held.
  static bool is_view_op(const Node& n) {
    const std::string& key = n.op_key();
    if (key == "Slice") {  // constant parameters only: the view's strides and offset are known
      for (std::size_t i = 1; i < n.num_inputs(); ++i)
        if (n.input(i) && !n.input(i)->is_constant()) return false;
      return true;
    }
    return n.num_outputs() == 1 && (key == "Transpose" || key == "Reshape" || key == "Flatten" || key == "Squeeze" ||
                                    key == "Unsqueeze" || key == "Identity");
  }
  // Whether `v` may be held in bfloat16: Precision::Bf16, float32, not a graph output, and every reader takes
  // it in bf16 as it is (reads_bf16), so its producer writes bf16 and no reader converts it.
  bool bf16_activation(const Value* v) const {
    if (options.precision != Precision::Bf16 || !v || v->dtype() != DType::Float32 || v->is_graph_output() ||
        !v->has_uses())
      return false;
    for (const Use& u : v->uses())
      if (!reads_bf16(u)) return false;
    return true;
  }
  // Whether reader `u` computes in bf16 on its operand as bf16: a convolution's source (or a FusedConv's Sum),
  // or the source of a matrix product with constant float32 weights (emit_matmul's condition for bf16).
  bool reads_bf16(const Use& u) const {
    const std::string& key = u.node->op_key();
    if (options.reference_ops.count(key)) return false;
    // A view (Slice, Transpose, Reshape, ...) carries bf16 bytes as they are (shape_ops.hpp) to readers that
    // all take bf16: a fused QKV projection's slices and head transposes on their way to attention.
    if (u.index == 0 && is_view_op(*u.node)) return bf16_activation(u.node->output(0));
    if (!runs_bf16(*u.node)) return false;
    // Attention reads Q, K and V in bf16 (attention.hpp: bf16 products, float32 scores and softmax).
    if (key == "ondine.Attention") return u.index <= 2;
    if (key == "Conv" || key == "ondine.FusedConv") return u.index == 0 || (key == "ondine.FusedConv" && u.index == 3);
    if (key == "MatMul" || key == "Gemm" || key == "ondine.FusedMatMul" || key == "ondine.FusedGemm") {
      const Value* w = u.node->input(1);
      return u.index == 0 && w && w->is_constant() && w->dtype() == DType::Float32;
    }
    return false;
  }

  void add_reorder(const std::string& what, SlotId from, const memory::desc& from_md, SlotId to,
                   const memory::desc& to_md) {
    dnnl::primitive_attr attr = base_attr();
    dnnl::reorder::primitive_desc pd(engine(), from_md, engine(), to_md, attr);
    runtime::StepInfo info{"reorder:" + what, "Reorder", pd.impl_info_str(),
                           layout_name(from_md) + " -> " + layout_name(to_md)};
    add_primitive(std::move(info), nullptr, dnnl::reorder(pd), pd.scratchpad_desc(),
                  {{DNNL_ARG_SRC, from, from_md}, {DNNL_ARG_DST, to, to_md}}, {});
  }

  // --- constants ---
  // The constant's data as a oneDNN memory in layout `want` (reordered now, once). `want` may have
  // other dims with the same element count (grouped conv weights, unsqueezed biases): the tensor is
  // read as the row-major form of `want`'s dims.
  // `source` (optional): how t's bytes are laid out when they are not row-major of want's dims (a
  // transposed constant read through strides, so the constant itself is packed, not a transposed copy).
  // A float32 constant may be packed into a bfloat16 layout (Precision::Bf16 weights): the reorder converts.
  memory constant_memory(const Tensor& t, const memory::desc& want, const std::optional<memory::desc>& source = {}) {
    memory::data_type dt;
    const bool to_bf16 = t.dtype() == DType::Float32 && want.data_type() == memory::data_type::bf16;
    if (!dnnl_dtype(t.dtype(), dt) || (dt != want.data_type() && !to_bf16))
      throw Error("internal: constant of " + std::string(dtype_name(t.dtype())) + " for a oneDNN layout of another type");
    if (t.numel() != md_numel(want))
      throw Error("internal: constant of " + std::to_string(t.numel()) + " elements for a layout of " +
                  std::to_string(md_numel(want)));
    std::uint64_t layout = 0;  // the source strides, hashed: tells the packings of two readings apart
    if (source)
      for (int i = 0; i < source->data.ndims; ++i)
        layout = (layout ^ static_cast<std::uint64_t>(source->data.format_desc.blocking.strides[i] + 1)) * 0x100000001b3ull;
    const memory::desc from = source ? *source : plain_md(want.dims(), dt);
    return packed_constant(t, layout, want, [&] { return reordered(from, t.raw(), want); });
  }
  // A constant computed from the constant `source` by `derive` (Winograd's transformed weights, float32,
  // row-major in `want`'s dims), packed into `want`. The packing is keyed by the source's bytes and `tag`, so a
  // compile that finds it stored (an artifact's packings, another shape of a ShapeCache) does not derive it
  // again: at load that was most of an artifact's start-up.
  memory derived_constant_memory(const Tensor& source, std::uint64_t tag, const std::function<Tensor()>& derive,
                                 const memory::desc& want) {
    return packed_constant(source, tag, want, [&] {
      Tensor t = derive();
      if (t.dtype() != DType::Float32 || t.numel() != md_numel(want))
        throw Error("internal: a derived constant of " + std::to_string(t.numel()) + " elements for a layout of " +
                    std::to_string(md_numel(want)));
      return reordered(plain_md(want.dims()), t.raw(), want);
    });
  }
  // The packing of `source` (`layout` tells two readings of its bytes apart) into `want`: shared through
  // options.packed_weights when there is one, else `pack()`'s own.
  memory packed_constant(const Tensor& source, std::uint64_t layout, const memory::desc& want,
                         const std::function<memory()>& pack) {
    constant_bytes += want.get_size();
    return options.packed_weights
               ? options.packed_weights->get(source, want, pack, layout,
                                             current ? current->name() + " (" + current->op_type() + ")" : std::string())
               : pack();
  }
  // `data`, read as `from`, reordered into new memory of layout `want`.
  memory reordered(const memory::desc& from, const void* data, const memory::desc& want) {
    memory src(from, engine(), const_cast<void*>(data));
    memory dst(want, engine());
    dnnl::stream s(engine());
    dnnl::reorder(src, dst).execute(s, src, dst);
    s.wait();
    return dst;
  }
  memory constant_memory(const std::vector<float>& values, const memory::desc& want) {
    return constant_memory(Tensor::from_vector<float>({static_cast<std::int64_t>(values.size())}, values), want);
  }

  // --- steps ---
  void add_step(std::unique_ptr<runtime::Step> step) { steps.push_back(std::move(step)); }

  void add_primitive(runtime::StepInfo info, const Node* node, dnnl::primitive prim, const memory::desc& scratchpad,
                     std::vector<SlotArg> slot_args, std::vector<std::pair<int, memory>> const_args) {
    scratchpad_bytes = std::max(scratchpad_bytes, scratchpad.get_size());
    add_step(std::make_unique<PrimitiveStep>(std::move(info), node, engine(), std::move(prim), std::move(slot_args),
                                             std::move(const_args), scratchpad));
  }

  // Defines `out` as a zero-copy view (same bytes, new dims) of `in`'s row-major bytes, or as a copy
  // when `out` is a graph output (those live in the caller's tensor).
  void define_view(const Node& n, const Value* in, const Value* out, const char* op) {
    SlotId src = row_major_slot(in);
    if (output_slot_.count(out) && !output_taken_.count(out)) {
      SlotId dst = new_plain_slot(out);
      add_step(std::make_unique<CopyStep>(runtime::StepInfo{n.name(), op, "memcpy", "copy into the output tensor"},
                                          src, dst, program.slots[dst].bytes));
      define_plain(out, dst);
      return;
    }
    runtime::Slot s = alias_slot(out, src);
    SlotId dst = add_slot(std::move(s));
    add_step(std::make_unique<ViewStep>(runtime::StepInfo{n.name(), op, "view", "zero-copy alias of '" + in->name() + "'"},
                                        src, dst));
    define_plain(out, dst);
  }

  // Defines `out` as the same bytes and layout as `in` (Identity, Dropout at inference).
  void define_alias(const Node& n, const Value* in, const Value* out) {
    ValueState st = state(in);
    if (output_slot_.count(out) && !output_taken_.count(out)) {
      if (st.has_md && !is_row_major(st.md)) {
        SlotId dst = new_plain_slot(out);
        add_reorder(out->name(), st.slot, st.md, dst, plain_md(out->shape().sizes(), st.md.data_type()));
        define_plain(out, dst);
        return;
      }
      define_view(n, in, out, n.op_type().c_str());
      return;
    }
    runtime::Slot s = program.slots[st.slot];
    s.name = out->name();
    s.kind = SlotKind::Alias;
    s.index = root(st.slot);
    SlotId dst = add_slot(std::move(s));
    add_step(std::make_unique<ViewStep>(
        runtime::StepInfo{n.name(), n.op_type(), "view", "zero-copy alias of '" + in->name() + "'"}, st.slot, dst));
    ValueState copy;
    copy.slot = dst;
    copy.has_md = st.has_md;
    copy.md = st.md;
    values_[out] = copy;
  }

  // Makes sure every graph output ends in its output slot (row-major, the caller's tensor).
  void finish_outputs() {
    for (const Value* v : output_order_) {
      SlotId slot = output_slot_.at(v);
      if (output_taken_.count(v)) continue;
      ValueState& st = state(v);
      if (st.has_md && !is_row_major(st.md)) {
        add_reorder(v->name(), st.slot, st.md, slot, plain_md(v->shape().sizes(), st.md.data_type()));
      } else {
        add_step(std::make_unique<CopyStep>(runtime::StepInfo{"output:" + v->name(), "Copy", "memcpy", ""}, st.slot,
                                            slot, program.slots[slot].bytes));
      }
      output_taken_.insert(v);
    }
  }

  void log(const std::string& line) const {
    if (options.log) options.log(line);
  }

 private:
  // Copies a strided view into row-major bytes of its own, for a reader that needs them.
  void materialize(const Value* v, ValueState& st) {
    const Node& n = *st.view_of;
    const memory::desc from = st.md, plain = plain_md(v->shape().sizes(), st.md.data_type());
    SlotId dst = new_value_slot(v, plain);
    dnnl::reorder::primitive_desc pd(engine(), from, engine(), plain, base_attr());
    add_primitive({n.name(), n.op_type(), pd.impl_info_str(), "copy of the strided view " + strided_str(from)}, &n,
                  dnnl::reorder(pd), pd.scratchpad_desc(), {{DNNL_ARG_SRC, st.slot, from}, {DNNL_ARG_DST, dst, plain}}, {});
    st.slot = dst;
    st.md = plain;
    st.view_of = nullptr;
  }

  std::unordered_map<const Value*, ValueState> values_;
  std::unordered_map<const Value*, SlotId> output_slot_;
  std::vector<const Value*> output_order_;
  std::set<const Value*> output_taken_;
};

}  // namespace detail
}  // namespace ondine::lower
