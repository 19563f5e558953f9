// onednn_postop_cost - what each post-op costs an int8 1x1 convolution in oneDNN (dnnl.hpp only): the
// chains Ondine's int8 lowering builds for a QDQ residual (include/ondine/lower/detail/quantized.hpp:
// round and clip to the mid type, the sum, Relu) and their parts, each timed alone on one shape.
//
//   onednn_postop_cost [MB IC OC HW]   (default 1 64 256 56: ResNet-50's first residual 1x1 convolution)
//
// u8 NHWC source and destination, s8 weights in the layout oneDNN picks, per-channel output scales;
// OMP_NUM_THREADS sets the threads, DNNL_MAX_CPU_ISA the kernel family. One line per chain: oneDNN's
// implementation and the median of 300 runs. With AMX (2 threads) the full chain costs 2.4x the plain
// convolution: 117 us against 48 us at the default shape.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"

int main(int argc, char** argv) {
  using namespace dnnl;
  using tag = memory::format_tag;
  using dt = memory::data_type;
  auto arg = [&](int i, int fallback) { return argc > i ? std::atoi(argv[i]) : fallback; };
  const memory::dim mb = arg(1, 1), ic = arg(2, 64), oc = arg(3, 256), hw = arg(4, 56);
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  auto src_md = memory::desc({mb, ic, hw, hw}, dt::u8, tag::nhwc), dst_md = memory::desc({mb, oc, hw, hw}, dt::u8, tag::nhwc);
  auto wei_md = memory::desc({oc, ic, 1, 1}, dt::s8, tag::any), bia_md = memory::desc({oc}, dt::f32, tag::a);
  // Each chain: its parts in order (round, clip with the mid rescale as its scale, sum, relu, linear).
  const std::vector<std::string> chains = {"",           "relu",           "sum",
                                           "sum+relu",   "round",          "round+clip",
                                           "clip+sum+relu", "round+clip+sum+relu", "round+clip+sum+relu+linear"};
  std::printf("int8 1x1 conv mb%lld ic%lld oc%lld %lldx%lld, u8 nhwc -> u8 nhwc\n", static_cast<long long>(mb),
              static_cast<long long>(ic), static_cast<long long>(oc), static_cast<long long>(hw), static_cast<long long>(hw));
  for (const std::string& chain : chains) {
    auto has = [&](const char* part) {
      std::string c = "+" + chain + "+";
      return c.find(std::string("+") + part + "+") != std::string::npos;
    };
    post_ops po;
    if (has("round")) po.append_eltwise(1.0f, algorithm::eltwise_round, 0, 0);
    if (has("clip")) po.append_eltwise(0.45f, algorithm::eltwise_clip, -125, 130);
    if (has("sum")) po.append_sum(2.0f, 125, dt::u8);
    if (has("relu")) po.append_eltwise(1.0f, algorithm::eltwise_relu, 0, 0);
    if (has("linear")) po.append_eltwise(1.0f, algorithm::eltwise_linear, 1, 3);
    primitive_attr attr;
    attr.set_output_scales(2, std::vector<float>(static_cast<std::size_t>(oc), 0.01f));
    attr.set_post_ops(po);
    attr.set_scratchpad_mode(scratchpad_mode::user);
    auto d = convolution_forward::desc(prop_kind::forward_inference, algorithm::convolution_direct, src_md, wei_md,
                                       bia_md, dst_md, {1, 1}, {0, 0}, {0, 0});
    convolution_forward::primitive_desc pd(d, attr, eng, true);
    if (!pd) {
      std::printf("%-28s unsupported\n", chain.empty() ? "(none)" : chain.c_str());
      continue;
    }
    memory src(src_md, eng), wei(pd.weights_desc(), eng), bia(bia_md, eng), dst(dst_md, eng),
        scratch(pd.scratchpad_desc(), eng);
    std::memset(src.get_data_handle(), 3, src_md.get_size());
    std::memset(wei.get_data_handle(), 1, pd.weights_desc().get_size());
    std::memset(bia.get_data_handle(), 0, bia_md.get_size());
    std::memset(dst.get_data_handle(), 1, dst_md.get_size());
    convolution_forward conv(pd);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_BIAS, bia},
                                         {DNNL_ARG_DST, dst}, {DNNL_ARG_SCRATCHPAD, scratch}};
    std::vector<double> us;
    for (int i = 0; i < 300; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      conv.execute(s, args);
      s.wait();
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::nth_element(us.begin(), us.begin() + 150, us.end());
    std::printf("%-28s %-36s %8.1f us\n", chain.empty() ? "(none)" : chain.c_str(), pd.impl_info_str(), us[150]);
  }
  return 0;
}
