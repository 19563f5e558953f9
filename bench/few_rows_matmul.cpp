// few_rows_matmul: a decoder's token times its weight matrices (one row, weights far beyond the caches),
// by oneDNN's brgemm on packed weights, oneDNN's matmul with run-time rows on plain weights, and Ondine's
// weight-streaming loop (lower/detail/gemv.hpp) on plain weights; the read bandwidth each reaches. Why the
// shape-free plan takes its own loop for fewer than 8 rows: docs/shapes.md.
//
//   build/bench/few_rows_matmul [THREADS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include <omp.h>

#include "oneapi/dnnl/dnnl.hpp"
#include "ondine/lower/detail/gemv.hpp"

namespace {
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int main(int argc, char** argv) {
  using namespace dnnl;
  using tag = memory::format_tag;
  using dt = memory::data_type;
  const int threads = argc > 1 ? std::atoi(argv[1]) : omp_get_max_threads();
  omp_set_num_threads(threads);
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const auto rows = ondine::lower::detail::gemv::rows_kernel();
  std::printf("threads %d; each matrix repeated to ~200 MB so that every call reads from memory\n", threads);
  for (auto [K, N] : std::vector<std::pair<long, long>>{{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}, {768, 8000}}) {
    const long copies = std::max<long>(2, 200000000 / (K * N * 4));
    std::vector<std::vector<float>> W(static_cast<std::size_t>(copies), std::vector<float>(static_cast<std::size_t>(K * N), 0.01f));
    std::vector<float> x(static_cast<std::size_t>(K), 1.0f), y(static_cast<std::size_t>(N)),
        partials(static_cast<std::size_t>(N * threads));
    const memory::desc src({1, K}, dt::f32, tag::ab), dst({1, N}, dt::f32, tag::ab), plain({K, N}, dt::f32, tag::ab);
    matmul::primitive_desc packed_pd(matmul::desc(src, memory::desc({K, N}, dt::f32, tag::any), dst), eng);
    matmul::primitive_desc runtime_pd(
        matmul::desc(memory::desc({DNNL_RUNTIME_DIM_VAL, K}, dt::f32, tag::ab), plain,
                     memory::desc({DNNL_RUNTIME_DIM_VAL, N}, dt::f32, tag::ab)), eng);
    matmul packed_mm(packed_pd), runtime_mm(runtime_pd);
    std::vector<memory> packed, plains;
    for (auto& w : W) {
      memory p(plain, eng, w.data()), m(packed_pd.weights_desc(), eng);
      reorder(p, m).execute(s, p, m);
      plains.push_back(p);
      packed.push_back(m);
    }
    s.wait();
    memory xs(src, eng, x.data()), yd(dst, eng, y.data());
    double best[3] = {1e9, 1e9, 1e9};
    for (int rep = 0; rep < 5; ++rep) {
      double t0 = now_ms();
      for (auto& m : packed) packed_mm.execute(s, {{DNNL_ARG_SRC, xs}, {DNNL_ARG_WEIGHTS, m}, {DNNL_ARG_DST, yd}});
      s.wait();
      best[0] = std::min(best[0], (now_ms() - t0) / static_cast<double>(copies));
      t0 = now_ms();
      for (auto& m : plains) runtime_mm.execute(s, {{DNNL_ARG_SRC, xs}, {DNNL_ARG_WEIGHTS, m}, {DNNL_ARG_DST, yd}});
      s.wait();
      best[1] = std::min(best[1], (now_ms() - t0) / static_cast<double>(copies));
      t0 = now_ms();
      for (auto& w : W) {
        std::fill(y.begin(), y.end(), 0.0f);
        ondine::lower::detail::gemv::multiply_add(rows, x.data(), w.data(), 1, K, N, y.data(), partials.data(), threads);
      }
      best[2] = std::min(best[2], (now_ms() - t0) / static_cast<double>(copies));
    }
    const double mb = static_cast<double>(K * N * 4) / 1e6;
    std::printf("%5ld x %-5ld brgemm packed (%s) %.3f ms %5.1f GB/s | run-time rows (%s) %.3f ms %5.1f GB/s | "
                "Ondine loop %.3f ms %5.1f GB/s\n",
                K, N, packed_pd.impl_info_str(), best[0], mb / best[0], runtime_pd.impl_info_str(), best[1],
                mb / best[1], best[2], mb / best[2]);
  }
}
