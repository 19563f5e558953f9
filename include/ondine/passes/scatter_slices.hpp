// SPDX-License-Identifier: Apache-2.0
// ondine/passes/scatter_slices.hpp - scatter-slices: a ScatterND that writes a box (PyTorch's sliced
// assignment, `x[:, :, 1:, 1:] = y` or `+=`) as Slices of the data around the update, joined by Concats.
//
// Rewrites (data [n_0, ..., n_r-1]; indices [s_0, ..., s_K-1, K]; updates [s_0, ..., s_K-1, n_K, ..., n_r-1]):
//   ScatterND(data, indices, updates)  with indices[i_0, ..., i_K-1, k] = b_k + i_k for every k
//     -> the box [b_k, b_k + s_k) of the first K axes replaced by updates, built axis by axis from the
//        last boxed axis out: Concat(Slice(data, before the box), inner, Slice(data, after the box)) along
//        that axis, each Slice restricted to the box on the axes before it (empty pieces left out).
// How the indices are known: a constant, or (too big to fold: 8 bytes per updated element and K of them)
// Concat over the last axis of K components, each Unsqueeze(Expand(G)) or Unsqueeze(G) or a constant
// [s..., 1], with G a constant that broadcasts to [s_0, ..., s_K-1]. PyTorch exports a sliced assignment as
// exactly that: per axis a Range (or a Slice of one) reshaped onto its axis and expanded to the box.
// Why: torchvision's MViT-V2 adds its relative positions with `attn[:, :, 1:, 1:] += ...`: indices of
// [1, 2, 6272, 1568, 4] int64 (627 MB) built at every run on reference kernels, then a scatter one element
// at a time: 2.4 s of one block's attention. Slices are views and Concats copy at memory speed.
// Preconditions: static shapes; reduction none (opset 16+; others accumulate); component k varies along
// box axis k only, by +1 per step, and the box lies inside data (negative starts count from the end, and
// a box may not straddle 0); a box axis of size > 1 whose component does not vary would write one element
// several times: left alone, as is every other ScatterND.
// Names: the result takes the ScatterND output's name; new nodes are named after the ScatterND. The index
// computation left without readers is dce's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ondine/passes/pass.hpp"
#include "ondine/passes/rewrite.hpp"

namespace ondine {

namespace detail::scatter_slices {

using Dims = std::vector<std::int64_t>;

inline bool static_dims(const Value* v) { return v && v->shape().rank_known() && v->shape().is_static(); }

inline bool is_int(DType t) { return t == DType::Int64 || t == DType::Int32; }

// The constant generator of one index component: values and dims, broadcast right-aligned to the box.
struct Generator {
  Dims dims;
  std::vector<std::int64_t> values;
};

inline std::optional<Generator> generator_of_constant(const Tensor& t, std::size_t drop_last_one) {
  if (!is_int(t.dtype())) return std::nullopt;
  Generator g;
  g.dims = t.dims();
  if (drop_last_one) {
    if (g.dims.empty() || g.dims.back() != 1) return std::nullopt;
    g.dims.pop_back();
  }
  g.values = t.to_int64s();
  return g;
}

// The Unsqueeze of `n` adds exactly the last axis (of a result of rank `rank`).
inline bool unsqueezes_last(const Node& n, std::size_t rank) {
  std::vector<std::int64_t> axes;
  if (n.num_inputs() >= 2 && n.input(1)) {
    if (!n.input(1)->is_constant()) return false;
    axes = n.input(1)->constant().to_int64s();
  } else {
    axes = n.attr_ints("axes", {});
  }
  return axes.size() == 1 && (axes[0] == -1 || axes[0] == static_cast<std::int64_t>(rank) - 1);
}

// Component `c` ([s..., 1]) of a Concat of components, as a constant generator.
inline std::optional<Generator> generator_of_component(const Value* c) {
  if (!c) return std::nullopt;
  if (c->is_constant()) return generator_of_constant(c->constant(), 1);
  const Node* u = c->producer();
  if (!u || u->op_type() != "Unsqueeze" || !u->domain().empty() || !static_dims(c)) return std::nullopt;
  if (!unsqueezes_last(*u, c->shape().rank())) return std::nullopt;
  const Value* x = u->input(0);
  if (!x) return std::nullopt;
  if (x->is_constant()) return generator_of_constant(x->constant(), 0);
  const Node* e = x->producer();
  if (!e || e->op_type() != "Expand" || !e->domain().empty() || !e->input(0) || !e->input(0)->is_constant())
    return std::nullopt;
  return generator_of_constant(e->input(0)->constant(), 0);
}

// The K generators of `indices` ([s..., K]), or nullopt.
inline std::optional<std::vector<Generator>> generators(const Value* indices, std::size_t K) {
  std::vector<Generator> out;
  if (indices->is_constant()) {
    const Tensor& t = indices->constant();
    if (!is_int(t.dtype())) return std::nullopt;
    const std::vector<std::int64_t> all = t.to_int64s();
    Dims grid(t.dims().begin(), t.dims().end() - 1);
    for (std::size_t k = 0; k < K; ++k) {
      Generator g;
      g.dims = grid;
      for (std::size_t i = k; i < all.size(); i += K) g.values.push_back(all[i]);
      out.push_back(std::move(g));
    }
    return out;
  }
  const Node* cat = indices->producer();
  if (!cat || cat->op_type() != "Concat" || !cat->domain().empty() || cat->num_inputs() != K) return std::nullopt;
  const auto rank = static_cast<std::int64_t>(indices->shape().rank());
  const std::int64_t axis = cat->attr_int("axis", 0);
  if (axis != -1 && axis != rank - 1) return std::nullopt;
  for (std::size_t k = 0; k < K; ++k) {
    auto g = generator_of_component(cat->input(k));
    if (!g) return std::nullopt;
    out.push_back(std::move(*g));
  }
  return out;
}

// Where component `k` (generator `g`) starts when it is b + i_k over the box `grid`: b, else nullopt.
inline std::optional<std::int64_t> box_start(const Generator& g, const Dims& grid, std::size_t k) {
  const std::size_t q = grid.size();
  if (g.dims.size() > q || g.values.empty()) return std::nullopt;
  const std::size_t offset = q - g.dims.size();
  std::int64_t count = 1;
  for (std::size_t j = 0; j < g.dims.size(); ++j) {
    if (g.dims[j] != 1 && g.dims[j] != grid[offset + j]) return std::nullopt;
    count *= g.dims[j];
  }
  if (count != static_cast<std::int64_t>(g.values.size())) return std::nullopt;
  const bool varies = k >= offset && g.dims[k - offset] > 1;
  if (grid[k] > 1 && !varies) return std::nullopt;  // one element written several times
  // Stride of axis k in the generator's row-major order.
  std::int64_t stride = 1, extent = 1;
  if (varies) {
    extent = g.dims[k - offset];
    for (std::size_t j = k - offset + 1; j < g.dims.size(); ++j) stride *= g.dims[j];
  }
  const std::int64_t b = g.values[0];
  for (std::int64_t f = 0; f < count; ++f) {
    const std::int64_t i_k = varies ? (f / stride) % extent : 0;
    if (g.values[static_cast<std::size_t>(f)] != b + i_k) return std::nullopt;
  }
  return b;
}

struct Box {
  Dims begin, end;  // over the first K axes of data
};

// The box ScatterND `n` writes, or nullopt when it does not write one (see the header's preconditions).
inline std::optional<Box> written_box(const Node& n) {
  if (n.op_type() != "ScatterND" || !n.domain().empty() || n.num_inputs() != 3 || n.num_outputs() != 1) return std::nullopt;
  if (n.attr_string("reduction", "none") != "none") return std::nullopt;
  const Value *data = n.input(0), *indices = n.input(1), *updates = n.input(2);
  if (!static_dims(data) || !static_dims(indices) || !static_dims(updates) || !static_dims(n.output(0))) return std::nullopt;
  const Dims d = data->shape().sizes(), idx = indices->shape().sizes(), upd = updates->shape().sizes();
  if (idx.empty() || idx.back() < 1 || idx.back() > static_cast<std::int64_t>(d.size())) return std::nullopt;
  const auto K = static_cast<std::size_t>(idx.back());
  const Dims grid(idx.begin(), idx.end() - 1);
  if (grid.size() != K) return std::nullopt;  // one box axis per data axis it indexes
  Dims want = grid;
  want.insert(want.end(), d.begin() + static_cast<std::ptrdiff_t>(K), d.end());
  if (upd != want) return std::nullopt;
  for (std::int64_t s : grid)
    if (s < 1) return std::nullopt;
  auto gens = generators(indices, K);
  if (!gens) return std::nullopt;
  Box box;
  for (std::size_t k = 0; k < K; ++k) {
    auto b = box_start((*gens)[k], grid, k);
    if (!b) return std::nullopt;
    std::int64_t begin = *b;
    if (begin < 0) {
      if (begin + grid[k] > 0) return std::nullopt;  // straddles 0: not one box
      begin += d[k];
    }
    if (begin < 0 || begin + grid[k] > d[k]) return std::nullopt;
    box.begin.push_back(begin);
    box.end.push_back(begin + grid[k]);
  }
  return box;
}

inline Value* int64s(Graph& g, const std::string& name, const Dims& v) {
  return g.add_constant(g.unique_name(name), Tensor::from_vector<std::int64_t>({static_cast<std::int64_t>(v.size())}, v));
}

// data restricted to the box on the axes before `axis` and to [from, to) on `axis`.
inline Value* slice_around(Graph& g, const Node& n, Value* data, const Box& box, std::size_t axis, std::int64_t from,
                           std::int64_t to) {
  Dims starts, ends, axes;
  const Dims d = data->shape().sizes();
  for (std::size_t a = 0; a < axis; ++a)
    if (box.begin[a] != 0 || box.end[a] != d[a]) {
      starts.push_back(box.begin[a]);
      ends.push_back(box.end[a]);
      axes.push_back(static_cast<std::int64_t>(a));
    }
  starts.push_back(from);
  ends.push_back(to);
  axes.push_back(static_cast<std::int64_t>(axis));
  const std::string base = n.name() + "/box_slice";
  Value* y = g.add_node("Slice", {data, int64s(g, base + "/starts", starts), int64s(g, base + "/ends", ends), int64s(g, base + "/axes", axes)},
                        {g.unique_name(base)}, {}, g.unique_name(base))
                 ->output(0);
  Dims shape = d;
  for (std::size_t a = 0; a < axis; ++a) shape[a] = box.end[a] - box.begin[a];
  shape[axis] = to - from;
  y->set_dtype(data->dtype());
  y->set_shape(Shape::from(shape));
  return y;
}

// The data with the box replaced by updates, restricted to the box on the axes before `axis`.
inline Value* assemble(Graph& g, const Node& n, const Box& box, std::size_t axis) {
  Value *data = n.input(0), *updates = n.input(2);
  if (axis == box.begin.size()) return updates;
  Value* inner = assemble(g, n, box, axis + 1);
  const Dims d = data->shape().sizes();
  if (box.begin[axis] == 0 && box.end[axis] == d[axis]) return inner;
  std::vector<Value*> pieces;
  if (box.begin[axis] > 0) pieces.push_back(slice_around(g, n, data, box, axis, 0, box.begin[axis]));
  pieces.push_back(inner);
  if (box.end[axis] < d[axis]) pieces.push_back(slice_around(g, n, data, box, axis, box.end[axis], d[axis]));
  const std::string base = n.name() + "/box_concat";
  Value* y = g.add_node("Concat", pieces, {g.unique_name(base)}, {{"axis", static_cast<std::int64_t>(axis)}}, g.unique_name(base))
                 ->output(0);
  Dims shape = d;
  for (std::size_t a = 0; a < axis; ++a) shape[a] = box.end[a] - box.begin[a];
  y->set_dtype(data->dtype());
  y->set_shape(Shape::from(shape));
  return y;
}

}  // namespace detail::scatter_slices

struct ScatterSlices {
  static constexpr const char* name = "scatter-slices";

  bool run(Graph& g, PassContext& ctx) {
    namespace d = detail::scatter_slices;
    std::vector<Node*> done;
    for (Node* n : g.topo_order()) {
      auto box = d::written_box(*n);
      if (!box) continue;
      Value* result = d::assemble(g, *n, *box, 0);
      rewrite::replace_value(g, n->output(0), result);
      ctx.rewrite("wrote '" + n->name() + "' (ScatterND of a box) as Slices and Concats");
      done.push_back(n);
    }
    if (done.empty()) return false;
    rewrite::erase_if_dead(g, done);  // the index grids they read are left for dce
    return true;
  }
};

}  // namespace ondine
