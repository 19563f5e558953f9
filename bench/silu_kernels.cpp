// silu_kernels: the ns per element and the largest relative error of Ondine's AVX-512 SiLU kernel
// (lower/detail/silu.hpp) in its two forms, exact division and rcp14 + one Newton step, on this CPU; one
// thread, 16 Ki floats (in cache) and 1.2 M floats (EfficientNet-B0's largest activation).
//   build/bench/silu_kernels
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "ondine/lower/detail/silu.hpp"

namespace silu = ondine::lower::detail::silu;

namespace {

template <class Kernel>
double ns_per_element(Kernel kernel, std::size_t n) {
  std::vector<float> src(n), v;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& x : src) x = normal(gen);
  double best = 1e9;
  for (int rep = 0; rep < 200; ++rep) {
    v = src;
    const auto t0 = std::chrono::steady_clock::now();
    kernel(v.data(), n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best / static_cast<double>(n) * 1e9;
}

template <class Kernel>
double max_relative_error(Kernel kernel) {
  std::vector<float> x;
  for (float v = -90.0f; v <= 90.0f; v += 0.0007f) x.push_back(v);
  std::vector<float> y = x;
  kernel(y.data(), y.size());
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double ref = x[i] / (1.0 + std::exp(-static_cast<double>(x[i])));
    if (std::isnan(y[i])) return NAN;
    if (std::fabs(ref) > 1e-30) worst = std::max(worst, std::fabs(y[i] - ref) / std::fabs(ref));
  }
  return worst;
}

}  // namespace

int main() {
#ifdef ONDINE_SILU_X86
  if (!__builtin_cpu_supports("avx512f")) {
    std::printf("no AVX-512 on this CPU\n");
    return 0;
  }
  const auto divide = [](float* p, std::size_t n) { silu::run_avx512_as<true>(p, n, 1.0f); };
  const auto reciprocal = [](float* p, std::size_t n) { silu::run_avx512_as<false>(p, n, 1.0f); };
  std::printf("kernel       max rel err   ns/elem (16 Ki)   ns/elem (1.2 M)\n");
  std::printf("division     %.3g       %.3f             %.3f\n", max_relative_error(divide),
              ns_per_element(divide, 16384), ns_per_element(divide, 1200000));
  std::printf("reciprocal   %.3g       %.3f             %.3f\n", max_relative_error(reciprocal),
              ns_per_element(reciprocal, 16384), ns_per_element(reciprocal, 1200000));
  std::printf("this CPU takes: %s\n", silu::divide_is_fast() ? "division" : "reciprocal");
#endif
  return 0;
}
