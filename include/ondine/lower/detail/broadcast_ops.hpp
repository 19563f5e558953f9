// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/broadcast_ops.hpp - Expand, Where, the comparisons (Equal, Less, Greater,
// LessOrEqual, GreaterOrEqual) and Cast as Ondine's own loops, for the dtypes oneDNN has no primitive for:
// masks, indices, counts.
//
// PyTorch's nn.TransformerEncoder with a key padding mask exports Equal(ids, pad) -> Expand -> Where(mask,
// -inf, scores) per layer, on bool and int64 tensors: small, but on reference kernels each step allocated
// its tensors (9 steps, 0.8% of BERT's run at batch 1), and `bench --profile` named them as slow paths.
// Here each is one pass over the output with numpy broadcasting: the output's rows (all dims but the last)
// in order, each input read with stride 0 along the dims it broadcasts. Bit-exact with the reference
// kernels (copies and IEEE comparisons: NaN compares unequal). Cast converts element by element with the
// reference kernel's own conversion (reference::detail::math::cast_element: saturating float -> integer,
// nonzero -> true), between the dtypes of dispatch_compared: torchvision's RoIAlign casts its box batch
// index float -> int64 so. Declined (reference kernel): dtypes other than those below, and shapes not static.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ondine/lower/detail/context.hpp"
#include "ondine/reference/math.hpp"

namespace ondine::lower::detail {

namespace broadcast {

constexpr std::size_t kMaxInputs = 3;

// The output's dims and, per input, its element strides over them (0 where the input broadcasts).
struct Plan {
  Dims out;
  std::vector<Dims> strides;  // [input][axis of out]
};

// numpy broadcasting of `inputs` into `out` (the node's inferred output shape); false if they do not fit.
inline bool make_plan(const Dims& out, const std::vector<Dims>& inputs, Plan& plan) {
  plan.out = out;
  plan.strides.clear();
  for (const Dims& in : inputs) {
    if (in.size() > out.size()) return false;
    Dims st(out.size(), 0);
    std::int64_t stride = 1;
    for (std::size_t k = 0; k < in.size(); ++k) {
      const std::size_t i = in.size() - 1 - k, o = out.size() - 1 - k;
      if (in[i] != out[o] && in[i] != 1) return false;
      st[o] = in[i] == 1 ? 0 : stride;
      stride *= in[i];
    }
    plan.strides.push_back(std::move(st));
  }
  return true;
}

// Calls row(out_offset, {input offsets}, inner strides) for each row of the output (the last dim's run).
template <typename Row>
void for_each_row(const Plan& p, Row&& row) {
  const std::size_t rank = p.out.size(), n = p.strides.size();
  std::array<std::int64_t, kMaxInputs> off{}, inner{};
  const std::int64_t len = rank ? p.out.back() : 1;
  for (std::size_t k = 0; k < n; ++k) inner[k] = rank ? p.strides[k].back() : 0;
  std::int64_t rows = 1;
  for (std::size_t a = 0; a + 1 < rank; ++a) rows *= p.out[a];
  Dims index(rank > 0 ? rank - 1 : 0, 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    row(r * len, off, inner, len);
    for (std::size_t a = index.size(); a-- > 0;) {  // next row: carry through the outer dims
      for (std::size_t k = 0; k < n; ++k) off[k] += p.strides[k][a];
      if (++index[a] < p.out[a]) break;
      for (std::size_t k = 0; k < n; ++k) off[k] -= p.strides[k][a] * p.out[a];
      index[a] = 0;
    }
  }
}

// Element copies by size: Expand and Where move bytes, whatever the dtype.
template <std::size_t Bytes>
struct Word;
template <>
struct Word<1> { using type = std::uint8_t; };
template <>
struct Word<2> { using type = std::uint16_t; };
template <>
struct Word<4> { using type = std::uint32_t; };
template <>
struct Word<8> { using type = std::uint64_t; };

template <typename F>
bool dispatch_size(std::size_t bytes, F&& f) {
  switch (bytes) {
    case 1: f(Word<1>{}); return true;
    case 2: f(Word<2>{}); return true;
    case 4: f(Word<4>{}); return true;
    case 8: f(Word<8>{}); return true;
    default: return false;
  }
}

enum class Compare { Equal, Less, Greater, LessOrEqual, GreaterOrEqual };

template <typename T>
bool compare(Compare c, T a, T b) {
  switch (c) {
    case Compare::Equal: return a == b;
    case Compare::Less: return a < b;
    case Compare::Greater: return a > b;
    case Compare::LessOrEqual: return a <= b;
    case Compare::GreaterOrEqual: return a >= b;
  }
  return false;
}

// The dtypes the comparisons read here (C++'s own comparisons give the reference kernel's answers).
template <typename F>
bool dispatch_compared(DType t, F&& f) {
  switch (t) {
    case DType::Float32: f(float{}); return true;
    case DType::Float64: f(double{}); return true;
    case DType::Int64: f(std::int64_t{}); return true;
    case DType::Int32: f(std::int32_t{}); return true;
    case DType::Int8: f(std::int8_t{}); return true;
    case DType::UInt8: f(std::uint8_t{}); return true;
    case DType::Bool: f(bool{}); return true;
    default: return false;
  }
}

}  // namespace broadcast

// One of Expand (input 0 broadcast), Where (cond, x, y) and a comparison (a, b) -> bool.
class BroadcastStep : public runtime::Step {
 public:
  enum class Kind { Expand, Where, Compare };
  BroadcastStep(runtime::StepInfo info, std::vector<SlotId> inputs, SlotId y, Kind kind, broadcast::Plan plan,
                DType dtype, broadcast::Compare compare = broadcast::Compare::Equal)
      : Step(std::move(info), inputs, {y}), inputs_(std::move(inputs)), y_(y), kind_(kind), plan_(std::move(plan)),
        dtype_(dtype), compare_(compare) {}

  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
    std::array<const void*, broadcast::kMaxInputs> in{};
    for (std::size_t k = 0; k < inputs_.size(); ++k) in[k] = ctx.ptr(inputs_[k]);
    void* out = ctx.ptr(y_);
    using Offsets = std::array<std::int64_t, broadcast::kMaxInputs>;
    if (kind_ == Kind::Compare) {
      broadcast::dispatch_compared(dtype_, [&](auto tag) {
        using T = decltype(tag);
        const T* a = static_cast<const T*>(in[0]);
        const T* b = static_cast<const T*>(in[1]);
        bool* y = static_cast<bool*>(out);
        broadcast::for_each_row(plan_, [&](std::int64_t o, const Offsets& off, const Offsets& s, std::int64_t len) {
          for (std::int64_t i = 0; i < len; ++i) y[o + i] = broadcast::compare(compare_, a[off[0] + i * s[0]], b[off[1] + i * s[1]]);
        });
      });
      return;
    }
    broadcast::dispatch_size(dtype_size(dtype_), [&](auto word) {
      using W = typename decltype(word)::type;
      W* y = static_cast<W*>(out);
      if (kind_ == Kind::Expand) {
        const W* x = static_cast<const W*>(in[0]);
        broadcast::for_each_row(plan_, [&](std::int64_t o, const Offsets& off, const Offsets& s, std::int64_t len) {
          if (s[0] == 1) {
            std::memcpy(y + o, x + off[0], static_cast<std::size_t>(len) * sizeof(W));
          } else {
            std::fill(y + o, y + o + len, x[off[0]]);
          }
        });
        return;
      }
      const bool* c = static_cast<const bool*>(in[0]);
      const W* a = static_cast<const W*>(in[1]);
      const W* b = static_cast<const W*>(in[2]);
      broadcast::for_each_row(plan_, [&](std::int64_t o, const Offsets& off, const Offsets& s, std::int64_t len) {
        for (std::int64_t i = 0; i < len; ++i)
          y[o + i] = c[off[0] + i * s[0]] ? a[off[1] + i * s[1]] : b[off[2] + i * s[2]];
      });
    });
  }

 private:
  std::vector<SlotId> inputs_;
  SlotId y_;
  Kind kind_;
  broadcast::Plan plan_;
  DType dtype_;
  broadcast::Compare compare_;
};

// Builds the step for node `n` reading `inputs` (row-major) into its output; false to leave it to the
// reference kernel.
inline bool lower_broadcast_node(Lowering& L, const Node& n, const std::vector<const Value*>& inputs,
                                 BroadcastStep::Kind kind, DType dtype,
                                 broadcast::Compare compare = broadcast::Compare::Equal) {
  const Value* y = n.output(0);
  if (!y || n.num_outputs() != 1 || !y->shape().is_static() || *y->shape().numel() == 0) return false;
  std::vector<Dims> dims;
  for (const Value* v : inputs) {
    if (!v || !v->shape().is_static() || *v->shape().numel() == 0) return false;
    dims.push_back(v->shape().sizes());
  }
  broadcast::Plan plan;
  if (!broadcast::make_plan(y->shape().sizes(), dims, plan)) return false;
  std::vector<SlotId> slots;
  std::string shapes;
  for (const Value* v : inputs) {
    slots.push_back(L.row_major_slot(v));
    shapes += (shapes.empty() ? "" : ", ") + Graph::value_type_str(v);
  }
  SlotId ys = L.new_plain_slot(y);
  L.define_plain(y, ys);
  L.add_step(std::make_unique<BroadcastStep>(
      runtime::StepInfo{n.name(), n.op_type(), "ondine:broadcast", shapes + " -> " + Graph::value_type_str(y)},
      std::move(slots), ys, kind, std::move(plan), dtype, compare));
  return true;
}

// Expand(x, shape): the shape input is only read by shape inference (the output's static dims).
inline bool lower_expand(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!x || !y || x->dtype() != y->dtype() || x->dtype() == DType::String) return false;
  if (dtype_size(x->dtype()) == 0 || dtype_size(x->dtype()) > 8) return false;
  return lower_broadcast_node(L, n, {x}, BroadcastStep::Kind::Expand, x->dtype());
}

inline bool lower_where(Lowering& L, const Node& n) {
  const Value* c = n.input(0);
  const Value* a = n.input(1);
  const Value* b = n.input(2);
  const Value* y = n.output(0);
  if (!c || !a || !b || !y || c->dtype() != DType::Bool || a->dtype() != b->dtype() || y->dtype() != a->dtype())
    return false;
  if (a->dtype() == DType::String || dtype_size(a->dtype()) == 0 || dtype_size(a->dtype()) > 8) return false;
  return lower_broadcast_node(L, n, {c, a, b}, BroadcastStep::Kind::Where, a->dtype());
}

inline bool lower_compare(Lowering& L, const Node& n) {
  const Value* a = n.input(0);
  const Value* b = n.input(1);
  const Value* y = n.output(0);
  if (!a || !b || !y || a->dtype() != b->dtype() || y->dtype() != DType::Bool) return false;
  if (!broadcast::dispatch_compared(a->dtype(), [](auto) {})) return false;
  if (n.opset() < 7) return false;  // pre-7 broadcasting (axis, broadcast attributes): the reference kernel
  const std::string& op = n.op_type();
  broadcast::Compare c = op == "Equal"            ? broadcast::Compare::Equal
                         : op == "Less"           ? broadcast::Compare::Less
                         : op == "Greater"        ? broadcast::Compare::Greater
                         : op == "LessOrEqual"    ? broadcast::Compare::LessOrEqual
                                                  : broadcast::Compare::GreaterOrEqual;
  if (a->dtype() == DType::Bool && c != broadcast::Compare::Equal) return false;
  return lower_broadcast_node(L, n, {a, b}, BroadcastStep::Kind::Compare, a->dtype(), c);
}

// Cast between two of the dtypes of broadcast::dispatch_compared.
class CastStep : public runtime::Step {
 public:
  CastStep(runtime::StepInfo info, SlotId x, SlotId y, DType from, DType to, std::int64_t count)
      : Step(std::move(info), {x}, {y}), x_(x), y_(y), from_(from), to_(to), count_(count) {}

  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
    const void* x = ctx.ptr(x_);
    void* y = ctx.ptr(y_);
    broadcast::dispatch_compared(from_, [&](auto from_tag) {
      using From = decltype(from_tag);
      broadcast::dispatch_compared(to_, [&](auto to_tag) {
        using To = decltype(to_tag);
        const From* px = static_cast<const From*>(x);
        To* py = static_cast<To*>(y);
        for (std::int64_t i = 0; i < count_; ++i) py[i] = reference::detail::math::cast_element<To>(px[i]);
      });
    });
  }

 private:
  SlotId x_, y_;
  DType from_, to_;
  std::int64_t count_;
};

// Cast: a float32 -> float32 (or same-dtype) Cast is an alias elsewhere (passes remove it); here the
// conversions between float32/64, int8/32/64, uint8 and bool.
inline bool lower_cast(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!x || !y || n.num_outputs() != 1 || !x->shape().is_static() || !y->shape().is_static()) return false;
  if (!broadcast::dispatch_compared(x->dtype(), [](auto) {}) || !broadcast::dispatch_compared(y->dtype(), [](auto) {}))
    return false;
  const std::int64_t count = *x->shape().numel();
  if (count == 0 || x->shape() != y->shape()) return false;
  SlotId xs = L.row_major_slot(x), ys = L.new_plain_slot(y);
  L.define_plain(y, ys);
  L.add_step(std::make_unique<CastStep>(
      runtime::StepInfo{n.name(), n.op_type(), "ondine:cast", Graph::value_type_str(x) + " -> " + Graph::value_type_str(y)},
      xs, ys, x->dtype(), y->dtype(), count));
  return true;
}

}  // namespace ondine::lower::detail
