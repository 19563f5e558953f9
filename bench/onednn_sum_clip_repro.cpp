// onednn_sum_clip_repro - a standalone check (dnnl.hpp only) of oneDNN int8 convolution post-op chains
// of the form Ondine uses for a quantized residual (include/ondine/lower/detail/quantized.hpp):
//
//   dst = saturate(round( post_ops( oscale[c] * (acc + bias[c]) ) ))
//   post_ops e.g. round, clip(lo, hi), linear(mid_scale, 0), sum(scale, zp), [relu], linear(1, y_zp)
//
// against a naive computation of the documented oneDNN 2.x semantics (output scale first, then the
// post-ops in order, each eltwise as scale * alg(alpha, beta); the sum adds scale * (dst_old - zp);
// rounding and saturation to the dst type at the end). One line per case: the implementation and how
// many of the 2048 outputs differ by more than one (ties of x.5 may round either way).
//
// What it shows on oneDNN 2.6: every jit implementation (brgconv, jit_int8, jit_uni_int8; 1x1 and 3x3;
// all ISAs) computes a chain with two eltwise post-ops of the same algorithm but different alpha, beta
// or scale with the first one's parameters for both: the post-ops injector keeps one eltwise injector
// per algorithm kind. The sum, its zero point, round and clip are innocent; the reference
// implementation (--nchw gives ref_int8:any) agrees with the naive computation everywhere.
//
//   onednn_sum_clip_repro [--verbose] [--nchw]   (DNNL_MAX_CPU_ISA=AVX512_CORE / AVX2 for other kernels)
//   --verbose  print the first differing elements of each case; --nchw  the activations in nchw
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <dnnl.hpp>

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using alg = dnnl::algorithm;

// One post-op: an eltwise (scale * alg(alpha, beta)) or, with is_sum, sum(scale = alpha, zero point = beta).
struct Op {
  alg a = alg::undef;
  float scale = 1, alpha = 0, beta = 0;
  bool is_sum = false;
};
Op elt(alg a, float alpha = 0, float beta = 0, float scale = 1) { return {a, scale, alpha, beta, false}; }
Op sum(float scale, int zp) { return {alg::undef, 1, scale, static_cast<float>(zp), true}; }

struct Case {
  std::string label;
  std::vector<Op> ops;
  int k = 1;  // kernel size (1 or 3, padded to keep 8x8)
  int ic = 32, oc = 32, hw = 8;
  dt dst = dt::u8;
  dt sum_dt = dt::undef;  // undef: the dst type
  bool per_channel = true;
  std::string name() const;
};

const char* dt_name(dt t) { return t == dt::u8 ? "u8" : t == dt::s8 ? "s8" : "?"; }

std::string Case::name() const {
  std::string s = std::to_string(k) + "x" + std::to_string(k) + " " + dt_name(dst) + (per_channel ? "" : " common-scale");
  if (sum_dt != dt::undef && sum_dt != dst) s += std::string(" sum:") + dt_name(sum_dt);
  s += " ";
  for (const Op& o : ops) {
    char b[96];
    if (o.is_sum) std::snprintf(b, sizeof b, "sum(%g,zp %g)", o.alpha, o.beta);
    else if (o.a == alg::eltwise_round) std::snprintf(b, sizeof b, "round");
    else {
      const char* n = o.a == alg::eltwise_linear ? "linear" : o.a == alg::eltwise_clip ? "clip" : o.a == alg::eltwise_clip_v2 ? "clip_v2" : o.a == alg::eltwise_relu ? "relu" : "?";
      if (o.scale != 1) std::snprintf(b, sizeof b, "%g*%s(%g,%g)", o.scale, n, o.alpha, o.beta);
      else std::snprintf(b, sizeof b, "%s(%g,%g)", n, o.alpha, o.beta);
    }
    s += b;
    s += ",";
  }
  s.pop_back();
  return s;
}

float lowest(dt t) { return t == dt::u8 ? 0.f : -128.f; }
float highest(dt t) { return t == dt::u8 ? 255.f : 127.f; }

struct Result {
  std::string impl;
  long over1 = 0, any = 0, total = 0;
  double max_diff = 0;
  bool ok = false;
};

// The documented semantics, in double.
double eltwise_ref(alg a, float alpha, float beta, double v) {
  switch (a) {
    case alg::eltwise_round: return std::nearbyint(v);
    case alg::eltwise_clip:
    case alg::eltwise_clip_v2: return std::min<double>(std::max<double>(v, alpha), beta);
    case alg::eltwise_linear: return alpha * v + beta;
    case alg::eltwise_relu: return v > 0 ? v : alpha * v;
    default: return v;
  }
}

Result run_case(const Case& c, dnnl::engine& eng, dnnl::stream& s, bool verbose, tag layout) {
  Result r;
  const int N = 1, pad = c.k / 2;
  const dt sum_dt = c.sum_dt == dt::undef ? c.dst : c.sum_dt;
  std::mt19937 rng(1234);
  std::vector<std::uint8_t> src(static_cast<std::size_t>(N * c.hw * c.hw * c.ic));
  std::vector<std::int8_t> wei(static_cast<std::size_t>(c.oc * c.ic * c.k * c.k));  // oihw
  std::vector<float> bias(static_cast<std::size_t>(c.oc)), scales(c.per_channel ? c.oc : 1);
  std::vector<std::uint8_t> dst_old(static_cast<std::size_t>(N * c.hw * c.hw * c.oc));
  for (auto& v : src) v = static_cast<std::uint8_t>(rng() % 256);
  // Weights within +-63: the non-VNNI kernels (vpmaddubsw) saturate pairs of u8 * s8 products at s16
  // with full-range weights, a documented oneDNN limitation that this check is not about.
  for (auto& v : wei) v = static_cast<std::int8_t>(static_cast<int>(rng() % 127) - 63);
  for (auto& v : bias) v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000);
  // acc is ~ N(0, 148*36*sqrt(ic*k*k)); scale it to ~ +-250 so that the clip bites on a share of elements.
  double acc_sd = 128.0 * 36.0 * std::sqrt(double(c.ic * c.k * c.k)) * 0.6;
  for (std::size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<float>(150.0 / acc_sd * (0.8 + 0.05 * (i % 9)));
  for (auto& v : dst_old) {
    int x = static_cast<int>(rng() % 256);
    v = static_cast<std::uint8_t>(sum_dt == dt::s8 ? static_cast<std::uint8_t>(static_cast<std::int8_t>(x - 128)) : x);
  }

  dnnl::post_ops p;
  for (const Op& o : c.ops)
    if (o.is_sum) p.append_sum(o.alpha, static_cast<int>(o.beta), sum_dt == c.dst ? dt::undef : sum_dt);
    else p.append_eltwise(o.scale, o.a, o.alpha, o.beta);

  dnnl::primitive_attr attr;
  attr.set_output_scales(c.per_channel ? 1 << 1 : 0, scales);
  attr.set_post_ops(p);
  dnnl::memory::dims sd{N, c.ic, c.hw, c.hw}, wd{c.oc, c.ic, c.k, c.k}, dd{N, c.oc, c.hw, c.hw};
  // The data is nhwc (src_user, dst_user); the primitive's activations are in `layout`.
  dnnl::memory::desc src_user(sd, dt::u8, tag::nhwc), dst_user(dd, c.dst, tag::nhwc);
  dnnl::memory::desc src_md(sd, dt::u8, layout), wei_any(wd, dt::s8, tag::any), bias_md({c.oc}, dt::f32, tag::x),
      dst_md(dd, c.dst, layout);
  dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference, alg::convolution_direct, src_md, wei_any, bias_md,
                                       dst_md, {1, 1}, {0, 0}, {pad, pad}, {pad, pad});
  dnnl::convolution_forward::primitive_desc pd(desc, attr, eng, true);
  if (!pd) {
    r.impl = "(none)";
    return r;
  }
  r.impl = pd.impl_info_str();
  dnnl::memory src_u(src_user, eng, src.data()), dst_u(dst_user, eng), src_m(src_md, eng), bias_m(bias_md, eng, bias.data()),
      dst_m(dst_md, eng);
  dnnl::memory wei_plain({wd, dt::s8, tag::oihw}, eng, wei.data()), wei_m(pd.weights_desc(), eng);
  dnnl::reorder(wei_plain, wei_m).execute(s, wei_plain, wei_m);
  dnnl::reorder(src_u, src_m).execute(s, src_u, src_m);
  std::memcpy(dst_u.get_data_handle(), dst_old.data(), dst_old.size());  // the sum operand, read through dst
  dnnl::reorder(dst_u, dst_m).execute(s, dst_u, dst_m);
  dnnl::memory scratch(pd.scratchpad_desc(), eng);
  dnnl::convolution_forward(pd).execute(s, {{DNNL_ARG_SRC, src_m}, {DNNL_ARG_WEIGHTS, wei_m}, {DNNL_ARG_BIAS, bias_m},
                                            {DNNL_ARG_DST, dst_m}, {DNNL_ARG_SCRATCHPAD, scratch}});
  dnnl::reorder(dst_m, dst_u).execute(s, dst_m, dst_u);
  s.wait();
  const auto* got = static_cast<const std::uint8_t*>(dst_u.get_data_handle());

  int shown = 0;
  for (int h = 0; h < c.hw; ++h)
    for (int w = 0; w < c.hw; ++w)
      for (int o = 0; o < c.oc; ++o) {
        std::int64_t acc = 0;
        for (int kh = 0; kh < c.k; ++kh)
          for (int kw = 0; kw < c.k; ++kw) {
            int ih = h + kh - pad, iw = w + kw - pad;
            if (ih < 0 || iw < 0 || ih >= c.hw || iw >= c.hw) continue;
            for (int i = 0; i < c.ic; ++i)
              acc += static_cast<std::int64_t>(src[static_cast<std::size_t>((ih * c.hw + iw) * c.ic + i)]) *
                     wei[static_cast<std::size_t>(((o * c.ic + i) * c.k + kh) * c.k + kw)];
          }
        std::size_t at = static_cast<std::size_t>((h * c.hw + w) * c.oc + o);
        double old = sum_dt == dt::s8 ? static_cast<std::int8_t>(dst_old[at]) : dst_old[at];
        double v = static_cast<double>(scales[c.per_channel ? o : 0]) * (static_cast<double>(acc) + bias[o]);
        double pre = v;
        for (const Op& op : c.ops)
          v = op.is_sum ? v + op.alpha * (old - op.beta) : op.scale * eltwise_ref(op.a, op.alpha, op.beta, v);
        double want = std::nearbyint(std::min<double>(std::max<double>(v, lowest(c.dst)), highest(c.dst)));
        double g = c.dst == dt::s8 ? static_cast<std::int8_t>(got[at]) : got[at];
        double d = std::abs(g - want);
        ++r.total;
        r.any += d > 0;
        r.over1 += d > 1;
        r.max_diff = std::max(r.max_diff, d);
        if (verbose && d > 1 && shown++ < 6)
          std::printf("    [h%d w%d c%d] scaled %.3f old %.0f -> want %.0f got %.0f\n", h, w, o, pre, old, want, g);
      }
  r.ok = r.over1 == 0;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  bool verbose = false;
  tag layout = tag::nhwc;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--verbose") == 0) verbose = true;
    else if (std::strcmp(argv[i], "--nchw") == 0) layout = tag::nchw;
    else {
      std::fprintf(stderr, "usage: onednn_sum_clip_repro [--verbose] [--nchw]\n");
      return 2;
    }
  }
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  // Ondine's linear-bottleneck residual in units of the output scale: mid round + clip to the mid
  // type's range (less its zero point), rescale to y units, sum, y zero point.
  const float lo = -100, hi = 120, mid = 0.7f;
  const Op round = elt(alg::eltwise_round), clip2 = elt(alg::eltwise_clip_v2, lo, hi), clip1 = elt(alg::eltwise_clip, lo, hi),
           lin_mid = elt(alg::eltwise_linear, mid, 0), the_sum = sum(0.6f, 30), y_zp = elt(alg::eltwise_linear, 1, 100),
           relu = elt(alg::eltwise_relu), act_clip = elt(alg::eltwise_clip_v2, -50, 90);
  const Op clip2_mid = elt(alg::eltwise_clip_v2, lo, hi, mid), clip1_mid = elt(alg::eltwise_clip, lo, hi, mid);
  const std::vector<std::pair<std::string, std::vector<Op>>> chains{
      {"Ondine's chain (before the workaround)", {round, clip2, lin_mid, the_sum, y_zp}},
      {"no round", {clip2, lin_mid, the_sum, y_zp}},
      {"clip (v1)", {round, clip1, lin_mid, the_sum, y_zp}},
      {"no clip", {round, lin_mid, the_sum, y_zp}},
      {"sum zero point 0", {round, clip2, lin_mid, sum(0.6f, 0), y_zp}},
      {"no y zero point", {round, clip2, lin_mid, the_sum}},
      {"relu after the sum", {round, clip2, lin_mid, the_sum, relu, y_zp}},
      {"relu, no y zero point (ResNet-50)", {round, clip2, lin_mid, the_sum, relu}},
      {"no mid rescale", {round, clip2, the_sum, y_zp}},
      {"two linears, no sum", {lin_mid, y_zp}},
      {"two linears, equal parameters", {lin_mid, the_sum, lin_mid}},
      {"two clip_v2", {clip2, the_sum, act_clip}},
      {"clip then clip_v2", {clip1, the_sum, act_clip}},
      {"relu then leaky relu", {relu, the_sum, elt(alg::eltwise_relu, 0.1f)}},
      {"fix: mid rescale as the clip's scale", {round, clip2_mid, the_sum, y_zp}},
      {"Ondine's chain (fixed)", {round, clip1_mid, the_sum, y_zp}},
      {"fix, relu after the sum", {round, clip2_mid, the_sum, relu, y_zp}},
      {"fix, Clip after the sum (mid clip v1)", {round, clip1_mid, the_sum, act_clip, y_zp}},
      {"alt: y zero point in the mid linear", {round, clip2, elt(alg::eltwise_linear, mid, 100), the_sum}},
  };
  std::vector<Case> cases;
  for (int k : {1, 3})
    for (dt d : {dt::u8, dt::s8}) {
      for (const auto& ch : chains) {
        Case c;
        c.label = ch.first;
        c.ops = ch.second;
        c.k = k;
        c.dst = d;
        cases.push_back(c);
      }
      for (int fixed : {0, 1}) {  // other scale and sum types
        Case c;
        c.label = fixed ? "Ondine's chain (fixed), common scale" : "Ondine's chain, common scale";
        c.ops = chains[fixed ? 15 : 0].second;
        c.k = k;
        c.dst = d;
        c.per_channel = false;
        cases.push_back(c);
        c.label = fixed ? "Ondine's chain (fixed), other sum type" : "Ondine's chain, other sum type";
        c.per_channel = true;
        c.sum_dt = d == dt::u8 ? dt::s8 : dt::u8;
        cases.push_back(c);
      }
    }
  int bad = 0;
  for (const Case& c : cases) {
    Result r = run_case(c, eng, s, verbose, layout);
    bad += !r.ok;
    std::printf("%-5s %-28s %-40s diff>1 %4ld/%ld (any %4ld, max %3g)  %s\n", r.ok ? "ok" : "WRONG", r.impl.c_str(),
                c.label.c_str(), r.over1, r.total, r.any, r.max_diff, c.name().c_str());
  }
  std::printf("%d of %zu cases wrong\n", bad, cases.size());
  return 0;
}
