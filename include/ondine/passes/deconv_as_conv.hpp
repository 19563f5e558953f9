// SPDX-License-Identifier: Apache-2.0
// ondine/passes/deconv_as_conv.hpp - deconv-as-conv: a ConvTranspose whose kernel equals its stride (each
// input pixel writes its own b x b block of the output, no overlap) as a 1x1 Conv to C*b*b channels and a
// DepthToSpace of block b.
//
// Rewrites (x [N, Cin, H, W]; W [Cin, C, b, b]; B [C], optional):
//   ConvTranspose(x, W, B)       -> DepthToSpace(Conv(x, W', B'), blocksize b, mode CRD)
//                                     W'[c*b*b + i*b + j, ci, 0, 0] = W[ci, c, i, j];  B'[c*b*b + i*b + j] = B[c]
//   act(ConvTranspose(x, W, B))  -> DepthToSpace(act(Conv(x, W', B')))
//                                   for an element-wise activation (Relu, Sigmoid, ...; Clip with constant
//                                   bounds) that alone reads the ConvTranspose's output: it commutes with
//                                   the permutation, and before the DepthToSpace `fuse` makes it the Conv's
//                                   post-op.
// Why: oneDNN 2.6 runs such deconvolutions (jit:avx512_core, a backward-data convolution) at a few percent
// of peak: 400 ms of a DBNet-like text detector's 500 ms at 640x640 for 0.5 GFLOP (two 2x2 stride-2 layers,
// 24 channels and 1). A 1x1 convolution is a dense matrix product, DepthToSpace one copy at memory speed.
// Preconditions: x float32 of rank 4; group 1; kernel_shape (W's spatial dims) == strides == [b, b]; pads
// zero, dilations 1, output_padding zero, auto_pad NOTSET (or absent), no output_shape; W constant float32
// (B constant float32 when present). Anything else is left alone.
// Names: the DepthToSpace output takes the name of the value it replaces; new values and nodes are named
// after the ConvTranspose.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ondine/passes/pass.hpp"
#include "ondine/passes/rewrite.hpp"

namespace ondine {

namespace detail::deconv_as_conv {

// The block size b of a ConvTranspose the rewrite applies to, or 0.
inline std::int64_t block_size(const Node& n) {
  if (n.op_type() != "ConvTranspose" || !n.domain().empty() || n.num_outputs() != 1) return 0;
  const Value* x = n.input(0);
  const Value* w = n.input(1);
  const Value* b = n.num_inputs() > 2 ? n.input(2) : nullptr;
  if (!x || x->dtype() != DType::Float32 || !x->shape().rank_known() || x->shape().rank() != 4) return 0;
  if (!w || !w->is_constant() || w->constant().dtype() != DType::Float32 || w->constant().rank() != 4) return 0;
  if (b && (!b->is_constant() || b->constant().dtype() != DType::Float32 || b->constant().rank() != 1 ||
            b->constant().dims()[0] != w->constant().dims()[1]))
    return 0;
  const auto& wd = w->constant().dims();
  if (!x->shape()[1].is_static() || x->shape()[1].value != wd[0] || wd[2] != wd[3] || wd[2] < 1) return 0;
  const std::int64_t k = wd[2];
  auto all = [&](const char* attr, std::int64_t want, std::size_t count) {
    return rewrite::ints_attr_all(n, attr, want, count);
  };
  if (n.attr_int("group", 1) != 1 || n.has_attr("output_shape")) return 0;
  if (n.has_attr("auto_pad") && n.attr_string("auto_pad", "NOTSET") != "NOTSET") return 0;
  if (n.has_attr("kernel_shape") && n.attr_ints("kernel_shape") != std::vector<std::int64_t>{k, k}) return 0;
  if (!n.has_attr("strides") || !all("strides", k, 2)) return 0;  // stride 1 (the default) overlaps unless k == 1
  if (!all("pads", 0, 4) || !all("dilations", 1, 2) || !all("output_padding", 0, 2)) return 0;
  return k;
}

// Element-wise activations that commute with DepthToSpace (extra inputs, if any, constant).
inline bool movable_activation(const Node& a) {
  static const std::set<std::string> ops = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Selu", "HardSigmoid",
                                            "HardSwish", "Softplus", "Clip"};
  if (!a.domain().empty() || !ops.count(a.op_type()) || a.num_outputs() != 1) return false;
  for (std::size_t i = 1; i < a.num_inputs(); ++i)
    if (a.input(i) && !a.input(i)->is_constant()) return false;
  return true;
}

// Rewrites `deconv` (block size k); returns the nodes left dead.
inline std::vector<Node*> rewrite(Graph& g, Node& deconv, std::int64_t k) {
  Value* x = deconv.input(0);
  const Tensor& w = deconv.input(1)->constant();
  const Value* b = deconv.num_inputs() > 2 ? deconv.input(2) : nullptr;
  const std::int64_t cin = w.dims()[0], cout = w.dims()[1], kk = k * k;
  const std::string base = deconv.name().empty() ? g.unique_name("deconv") : deconv.name();

  // W' [cout*k*k, cin, 1, 1] and B' [cout*k*k]: output channel c*k*k + i*k + j is the deconvolution's
  // channel c at offset (i, j) of each block.
  Tensor w2(DType::Float32, {cout * kk, cin, 1, 1});
  const float* src = w.data<float>();
  float* dst = w2.data<float>();
  for (std::int64_t ci = 0; ci < cin; ++ci)
    for (std::int64_t c = 0; c < cout; ++c)
      for (std::int64_t ij = 0; ij < kk; ++ij) dst[(c * kk + ij) * cin + ci] = src[(ci * cout + c) * kk + ij];
  std::vector<Value*> inputs{x, g.add_constant(g.unique_name(base + ".W_1x1"), std::move(w2))};
  if (b) {
    Tensor b2(DType::Float32, {cout * kk});
    const float* bs = b->constant().data<float>();
    for (std::int64_t c = 0; c < cout; ++c)
      for (std::int64_t ij = 0; ij < kk; ++ij) b2.data<float>()[c * kk + ij] = bs[c];
    inputs.push_back(g.add_constant(g.unique_name(base + ".B_1x1"), std::move(b2)));
  }
  std::map<std::string, Attribute> attrs{{"kernel_shape", std::vector<std::int64_t>{1, 1}}};
  Node* conv = g.add_node("Conv", inputs, {g.unique_name(base + ".blocks")}, std::move(attrs), base + ".as_conv");
  conv->set_opset(deconv.opset());
  Value* z = conv->output(0);
  z->set_dtype(DType::Float32);
  z->set_shape(Shape{x->shape()[0], Dim(cout * kk), x->shape()[2], x->shape()[3]});

  // An activation that alone reads the deconvolution moves before the DepthToSpace.
  Value* y = deconv.output(0);
  std::vector<Node*> dead{&deconv};
  Value* replaced = y;
  Value* d2s_input = z;
  if (rewrite::single_use(y) && movable_activation(*y->uses().front().node)) {
    Node* act = y->uses().front().node;
    std::vector<Value*> act_inputs{z};
    for (std::size_t i = 1; i < act->num_inputs(); ++i) act_inputs.push_back(act->input(i));
    Node* moved = g.add_node(act->op_type(), act_inputs, {g.unique_name(base + ".blocks_act")}, act->attrs(),
                             act->name().empty() ? base + ".act" : act->name());
    moved->set_opset(act->opset());
    moved->output(0)->set_dtype(DType::Float32);
    moved->output(0)->set_shape(z->shape());
    d2s_input = moved->output(0);
    replaced = act->output(0);
    dead.push_back(act);
  }
  if (k == 1) {
    rewrite::take_over(g, replaced, d2s_input);
    return dead;
  }
  std::map<std::string, Attribute> d2s_attrs{{"blocksize", k}, {"mode", std::string("CRD")}};
  Node* d2s = g.add_node("DepthToSpace", {d2s_input}, {g.unique_name(base + ".out")}, std::move(d2s_attrs),
                         base + ".depth_to_space");
  d2s->set_opset(std::max(deconv.opset(), 11));  // mode CRD: opset 11
  d2s->output(0)->set_dtype(replaced->dtype());
  d2s->output(0)->set_shape(replaced->shape());
  rewrite::take_over(g, replaced, d2s->output(0));
  return dead;
}

}  // namespace detail::deconv_as_conv

struct DeconvAsConv {
  static constexpr const char* name = "deconv-as-conv";

  bool run(Graph& g, PassContext& ctx) {
    namespace d = detail::deconv_as_conv;
    std::vector<Node*> dead;
    for (Node* n : g.topo_order()) {
      const std::int64_t k = d::block_size(*n);
      if (k == 0) continue;
      const std::string label = n->name();
      std::vector<Node*> gone = d::rewrite(g, *n, k);
      ctx.rewrite("'" + label + "' (" + std::to_string(k) + "x" + std::to_string(k) + " stride " + std::to_string(k) +
                  ") as a 1x1 Conv and DepthToSpace" + (gone.size() > 1 ? ", its " + gone[1]->op_type() + " moved before it" : ""));
      dead.insert(dead.end(), gone.begin(), gone.end());
    }
    if (dead.empty()) return false;
    rewrite::erase_if_dead(g, dead);
    return true;
  }
};

}  // namespace ondine
