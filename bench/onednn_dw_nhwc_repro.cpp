// onednn_dw_nhwc_repro - a standalone (dnnl.hpp only) check of oneDNN 2.6's depthwise post-op (append_dw): a
// 1x1 convolution 16 -> 96 channels at 112x112 followed by a 3x3 stride-2 depthwise, fused, against the same two
// convolutions run one after the other. In nChw16c the fused jit_1x1 kernel matches; in channels-last (nhwc,
// the layout Ondine's convolutions use here) it does not: max |difference| 6 of max |output| 3.6 on an AVX-512
// Zen 4, which is why the lowering fuses 1x1 + depthwise only channel-blocked (docs/performance.md).
// Prints one line per layout; exit status 1 when a fused kernel differs by more than 1e-4.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "oneapi/dnnl/dnnl.hpp"

using namespace dnnl;
using dt = memory::data_type;
using tag = memory::format_tag;

int main() {
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const memory::dim n = 1, ic = 16, oc = 96, hw = 112, out_hw = 56;
  auto fill = [](memory& m, float seed) {
    float* p = static_cast<float*>(m.get_data_handle());
    for (size_t i = 0; i < m.get_desc().get_size() / sizeof(float); ++i) p[i] = 0.5f * std::sin(seed + 0.37f * i);
  };
  memory w1({{oc, ic, 1, 1}, dt::f32, tag::oihw}, eng), wdw({{oc, 1, 1, 3, 3}, dt::f32, tag::goihw}, eng),
      bias({{oc}, dt::f32, tag::a}, eng);
  fill(w1, 3);
  fill(wdw, 4);
  fill(bias, 2);
  bool bad = false;
  for (tag t : {tag::nChw16c, tag::nhwc}) {
    memory::desc src_md({n, ic, hw, hw}, dt::f32, t), mid_md({n, oc, hw, hw}, dt::f32, t),
        out_md({n, oc, out_hw, out_hw}, dt::f32, t);
    memory src(src_md, eng);
    fill(src, 1);
    post_ops relu6;
    relu6.append_eltwise(1.f, algorithm::eltwise_clip_v2, 0.f, 6.f);
    primitive_attr a1;
    a1.set_post_ops(relu6);
    auto conv = [&](const memory::desc& in, const memory::desc& w, const memory::desc& out, memory::dim stride,
                    memory::dim pad, const primitive_attr& attr) {
      return convolution_forward::primitive_desc(
          convolution_forward::desc(prop_kind::forward_inference, algorithm::convolution_direct, in, w,
                                    bias.get_desc(), out, {stride, stride}, {pad, pad}, {pad, pad}),
          attr, eng);
    };
    // Two primitives.
    auto pd1 = conv(src_md, {{oc, ic, 1, 1}, dt::f32, tag::any}, mid_md, 1, 0, a1);
    auto pd2 = conv(mid_md, {{oc, 1, 1, 3, 3}, dt::f32, tag::any}, out_md, 2, 1, a1);
    memory w1a(pd1.weights_desc(), eng), w2a(pd2.weights_desc(), eng), mid(mid_md, eng), want(out_md, eng);
    reorder(w1, w1a).execute(s, w1, w1a);
    reorder(wdw, w2a).execute(s, wdw, w2a);
    convolution_forward(pd1).execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w1a}, {DNNL_ARG_BIAS, bias}, {DNNL_ARG_DST, mid}});
    convolution_forward(pd2).execute(s, {{DNNL_ARG_SRC, mid}, {DNNL_ARG_WEIGHTS, w2a}, {DNNL_ARG_BIAS, bias}, {DNNL_ARG_DST, want}});
    // One primitive with the depthwise as a post-op.
    post_ops fused_ops;
    fused_ops.append_eltwise(1.f, algorithm::eltwise_clip_v2, 0.f, 6.f);
    fused_ops.append_dw(dt::f32, dt::f32, dt::f32, 3, 2, 1, 0, {});
    fused_ops.append_eltwise(1.f, algorithm::eltwise_clip_v2, 0.f, 6.f);
    primitive_attr af;
    af.set_post_ops(fused_ops);
    auto pdf = conv(src_md, {{oc, ic, 1, 1}, dt::f32, tag::any}, mid_md, 1, 0, af);
    memory w1f(pdf.weights_desc(), eng), got(pdf.dst_desc(), eng);
    memory dww(pdf.query_md(query::exec_arg_md, DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS), eng);
    memory dwb(pdf.query_md(query::exec_arg_md, DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS), eng);
    reorder(w1, w1f).execute(s, w1, w1f);
    reorder(wdw, dww).execute(s, wdw, dww);
    std::copy_n(static_cast<float*>(bias.get_data_handle()), oc, static_cast<float*>(dwb.get_data_handle()));
    convolution_forward(pdf).execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w1f}, {DNNL_ARG_BIAS, bias},
                                         {DNNL_ARG_DST, got}, {DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS, dww},
                                         {DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS, dwb}});
    // Both as nchw, compared.
    memory::desc plain({n, oc, out_hw, out_hw}, dt::f32, tag::nchw);
    memory a(plain, eng), b(plain, eng);
    reorder(want, a).execute(s, want, a);
    reorder(got, b).execute(s, got, b);
    s.wait();
    double diff = 0, peak = 0;
    for (size_t i = 0; i < plain.get_size() / sizeof(float); ++i) {
      const float x = static_cast<float*>(a.get_data_handle())[i], y = static_cast<float*>(b.get_data_handle())[i];
      diff = std::max(diff, static_cast<double>(std::fabs(x - y)));
      peak = std::max(peak, static_cast<double>(std::fabs(x)));
    }
    const bool ok = diff <= 1e-4 * peak;
    bad |= !ok;
    std::printf("%s: fused %s, max |fused - separate| %.3g of max |output| %.3g: %s\n", t == tag::nhwc ? "nhwc" : "nChw16c",
                pdf.impl_info_str(), diff, peak, ok ? "ok" : "WRONG");
  }
  return bad ? 1 : 0;
}
