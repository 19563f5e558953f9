// ondine_peak - the fp32 GFLOP/s (or, with --int8, the int8 GOP/s; with --bf16, the bf16 GFLOP/s) that
// oneDNN's matmul reaches on this machine: the practical peak that model throughput is compared against
// (bench/peers.py).
//
//   ondine_peak [--threads N] [--size N] [--reps N] [--int8 | --bf16]
//
// --int8 times a u8 x s8 -> s32 matmul, the form of oneDNN's VNNI/AMX int8 kernels (one multiply-add
// counts as two operations, as for fp32). --bf16 times bf16 x bf16 -> f32: whether bf16 pays on this CPU
// (twice the fp32 rate on AMD Zen 4/5 and with AMX; about the fp32 rate on Intel cores whose bf16 is
// AVX512_BF16 alone, where it is a single-port instruction).

// Times `reps` runs of an N x N x N fp32 matmul (default 2048, 10 reps) after one warm-up run and prints
// the best and median GFLOP/s as one line, e.g. "peak: 2048x2048x2048 fp32 matmul, threads 2, isa ...,
// best 180.3 GFLOP/s, median 176.0 GFLOP/s".
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <omp.h>

#include <dnnl.hpp>

namespace {

int parse_positive(const char* flag, const char* text) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (!*text || *end || v <= 0 || v > 1 << 20) {
    std::cerr << "ondine_peak: " << flag << " expects a positive integer, got '" << text << "'\n";
    std::exit(2);
  }
  return static_cast<int>(v);
}

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0, size = 2048, reps = 10;
  bool int8 = false, bf16 = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--int8" || arg == "--bf16") {
      (arg == "--int8" ? int8 : bf16) = true;
    } else if ((arg == "--threads" || arg == "--size" || arg == "--reps") && i + 1 < argc) {
      int v = parse_positive(arg.c_str(), argv[++i]);
      (arg == "--threads" ? threads : arg == "--size" ? size : reps) = v;
    } else {
      std::cerr << "usage: ondine_peak [--threads N] [--size N] [--reps N] [--int8 | --bf16]\n";
      return arg == "-h" || arg == "--help" ? 0 : 2;
    }
  }
  if (int8 && bf16) {
    std::cerr << "ondine_peak: --int8 and --bf16 exclude each other\n";
    return 2;
  }
  if (threads > 0) omp_set_num_threads(threads);

  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const dnnl::memory::dim n = size;
  const dt src_dt = int8 ? dt::u8 : bf16 ? dt::bf16 : dt::f32, wei_dt = int8 ? dt::s8 : bf16 ? dt::bf16 : dt::f32,
           dst_dt = int8 ? dt::s32 : dt::f32;
  dnnl::memory::desc src_md({n, n}, src_dt, tag::ab), dst_md({n, n}, dst_dt, tag::ab);
  // Weights in the layout the primitive prefers, as a compiler would lay out constants once.
  dnnl::memory::desc wei_any({n, n}, wei_dt, tag::any);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_any, dst_md), engine);
  dnnl::matmul matmul(pd);

  dnnl::memory src(src_md, engine), wei(pd.weights_desc(), engine), dst(dst_md, engine);
  for (auto* m : {&src, &wei}) {
    if (int8) {
      // Small values: the s32 sums stay far from overflow.
      auto* p = static_cast<std::uint8_t*>(m->get_data_handle());
      std::size_t count = m->get_desc().get_size();
      for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<std::uint8_t>((i * 7919) % 7);
      continue;
    }
    if (bf16) {
      // bf16 is the upper half of a float's bits: k/8 - 0.5 for small k is exact.
      auto* p = static_cast<std::uint16_t*>(m->get_data_handle());
      std::size_t count = m->get_desc().get_size() / sizeof(std::uint16_t);
      for (std::size_t i = 0; i < count; ++i) {
        float v = static_cast<float>((i * 7919) % 9) / 8.0f - 0.5f;
        std::uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        p[i] = static_cast<std::uint16_t>(bits >> 16);
      }
      continue;
    }
    auto* p = static_cast<float*>(m->get_data_handle());
    std::size_t count = m->get_desc().get_size() / sizeof(float);
    for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<float>((i * 7919) % 97) / 97.0f - 0.5f;
  }
  auto run = [&] {
    matmul.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    stream.wait();
  };
  run();  // warm-up: first-touch pages, JIT caches
  std::vector<double> seconds;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  const char* unit = int8 ? " GOP/s" : " GFLOP/s";
  std::cout << "peak: " << n << "x" << n << "x" << n << (int8 ? " u8*s8->s32" : bf16 ? " bf16*bf16->f32" : " fp32") << " matmul, threads "
            << (threads > 0 ? threads : omp_get_max_threads()) << ", isa " << isa_name(dnnl::get_effective_cpu_isa())
            << ", impl " << pd.impl_info_str() << ", best " << flops / seconds.front() / 1e9 << unit << ", median "
            << flops / seconds[seconds.size() / 2] / 1e9 << unit << "\n";
  return 0;
}
