// onednn_matmul_offset_repro: oneDNN 2.6's matmul with weights read through a view that starts at an offset
// (memory::desc offset0), as attention reads V out of a fused QKV projection. For a reduction of 1 (sequence
// length 1: probabilities [4,1,1,1] x V [4,1,1,64]) oneDNN picks brg:avx512_core, which ignores offset0 and
// reads from the start of the buffer (Q instead of V); gemm:jit, picked for 2, honours it. Why Ondine moves a
// view's offset into the memory's address instead (lower::detail::without_offset).
//   build/bench/onednn_matmul_offset_repro   (prints "ok" or "WRONG" per case)
#include <cstdio>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"

int main() {
  using namespace dnnl;
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  int failures = 0;
  for (memory::dim k : {1, 2}) {
    // A [1 x k] row of 768 floats per position: Q at 0, K at 256, V at 512; 4 heads of 64.
    std::vector<float> qkv(static_cast<std::size_t>(k) * 768), probs(static_cast<std::size_t>(4 * k), 1.0f / static_cast<float>(k)), y(4 * 64);
    for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(i);
    // (For one row the row stride does not matter; Ondine writes the one a dense layout has, as here.)
    memory::desc v_md({4, 1, k, 64}, memory::data_type::f32, memory::dims{64, 64, k == 1 ? 64 : 768, 1});
    v_md.data.offset0 = 512;
    memory::desc p_md({4, 1, 1, k}, memory::data_type::f32, memory::format_tag::abcd);
    memory::desc y_md({4, 1, 1, 64}, memory::data_type::f32, memory::format_tag::abcd);
    matmul::primitive_desc pd(matmul::desc(p_md, v_md, y_md), eng);
    matmul(pd).execute(s, {{DNNL_ARG_SRC, memory(p_md, eng, probs.data())},
                           {DNNL_ARG_WEIGHTS, memory(v_md, eng, qkv.data())},
                           {DNNL_ARG_DST, memory(y_md, eng, y.data())}});
    s.wait();
    // y[h][n] = mean over rows r of qkv[512 + r*768 + h*64 + n]
    const double want = 512.0 + 64.0 + 768.0 * static_cast<double>(k - 1) / 2.0;  // head 1, n 0
    const bool ok = y[64] == static_cast<float>(want);
    failures += !ok;
    std::printf("reduction %lld: %s, y[1][0] = %g (want %g): %s\n", static_cast<long long>(k), pd.impl_info_str(),
                static_cast<double>(y[64]), want, ok ? "ok" : "WRONG");
  }
  return failures ? 1 : 0;
}
