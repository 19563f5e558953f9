// SPDX-License-Identifier: Apache-2.0
// ondine/lower/isa.hpp - the CPU instruction set oneDNN will use here, and what it allows.
//
// oneDNN dispatches on the "effective" ISA: the best the CPU has, capped by DNNL_MAX_CPU_ISA or
// dnnl_set_max_cpu_isa(). The precision choices of the compiler follow from it: int8 is only fast with
// VNNI, bf16 primitives need at least avx512_core (and are emulated below avx512_core_bf16; native but no
// faster than fp32 on an Intel core whose AMX is hidden), AMX tiles need avx512_core_amx. Uses oneDNN's C API only, so it is cheap to include.
#pragma once

#include <cstring>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "oneapi/dnnl/dnnl.h"

namespace ondine::lower {

// oneDNN 2.6's ISA levels for x86-64, in the library's own order of capability.
enum class CpuIsa {
  Unknown,
  Sse41,
  Avx,
  Avx2,
  Avx2Vnni,
  Avx512Mic,
  Avx512Mic4ops,
  Avx512Core,
  Avx512CoreVnni,
  Avx512CoreBf16,
  Avx512CoreAmx,
};

struct IsaInfo {
  CpuIsa isa = CpuIsa::Unknown;
  std::string name;           // oneDNN's spelling: "avx512_core_vnni", "avx2", ...
  bool avx512 = false;        // avx512_core or better (the brgemm kernels)
  bool int8_vnni = false;     // u8 x s8 dot products in one instruction (VNNI, AVX-VNNI or AMX)
  bool bf16_supported = false;  // bf16 primitives can be created (avx512_core and better)
  bool bf16_native = false;     // bf16 arithmetic in hardware (avx512_core_bf16 / AMX), not emulated
  // bf16 arithmetic faster than fp32, what Precision::Auto goes by: AMX, or AVX512_BF16 where its dot product
  // runs at twice the fp32 rate (AMD Zen 4 and 5). Not on Intel cores of the Sapphire Rapids generation and
  // later whose AMX is hidden (a VM that does not pass it through): their AVX512_BF16 dot product issues on one
  // port, and oneDNN's bf16 matmul reaches half its fp32 rate there (ondine_peak --bf16). An ISA named without
  // a CPU (isa_info, a compile target) assumes its bf16 pays where it is native.
  bool bf16_faster = false;
  bool amx = false;             // AMX tiles (int8 and bf16)
};

inline IsaInfo isa_info(CpuIsa isa) {
  IsaInfo info;
  info.isa = isa;
  switch (isa) {
    case CpuIsa::Sse41: info.name = "sse41"; break;
    case CpuIsa::Avx: info.name = "avx"; break;
    case CpuIsa::Avx2: info.name = "avx2"; break;
    case CpuIsa::Avx2Vnni: info.name = "avx2_vnni"; break;
    case CpuIsa::Avx512Mic: info.name = "avx512_mic"; break;
    case CpuIsa::Avx512Mic4ops: info.name = "avx512_mic_4ops"; break;
    case CpuIsa::Avx512Core: info.name = "avx512_core"; break;
    case CpuIsa::Avx512CoreVnni: info.name = "avx512_core_vnni"; break;
    case CpuIsa::Avx512CoreBf16: info.name = "avx512_core_bf16"; break;
    case CpuIsa::Avx512CoreAmx: info.name = "avx512_core_amx"; break;
    case CpuIsa::Unknown: info.name = "unknown"; break;
  }
  bool core = isa == CpuIsa::Avx512Core || isa == CpuIsa::Avx512CoreVnni || isa == CpuIsa::Avx512CoreBf16 ||
              isa == CpuIsa::Avx512CoreAmx;
  info.avx512 = core;
  info.int8_vnni = isa == CpuIsa::Avx512CoreVnni || isa == CpuIsa::Avx512CoreBf16 || isa == CpuIsa::Avx512CoreAmx ||
                   isa == CpuIsa::Avx2Vnni;
  info.bf16_supported = core;
  info.bf16_native = isa == CpuIsa::Avx512CoreBf16 || isa == CpuIsa::Avx512CoreAmx;
  info.bf16_faster = info.bf16_native;
  info.amx = isa == CpuIsa::Avx512CoreAmx;
  return info;
}

namespace detail {
inline bool intel_bf16_without_amx();  // below, after cpu_vendor()
}  // namespace detail

// The ISA oneDNN dispatches to in this process (after DNNL_MAX_CPU_ISA and set_max_cpu_isa caps).
inline IsaInfo effective_isa() {
  CpuIsa isa = CpuIsa::Unknown;
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: isa = CpuIsa::Sse41; break;
    case dnnl_cpu_isa_avx: isa = CpuIsa::Avx; break;
    case dnnl_cpu_isa_avx2: isa = CpuIsa::Avx2; break;
    case dnnl_cpu_isa_avx2_vnni: isa = CpuIsa::Avx2Vnni; break;
    case dnnl_cpu_isa_avx512_mic: isa = CpuIsa::Avx512Mic; break;
    case dnnl_cpu_isa_avx512_mic_4ops: isa = CpuIsa::Avx512Mic4ops; break;
    case dnnl_cpu_isa_avx512_core: isa = CpuIsa::Avx512Core; break;
    case dnnl_cpu_isa_avx512_core_vnni: isa = CpuIsa::Avx512CoreVnni; break;
    case dnnl_cpu_isa_avx512_core_bf16: isa = CpuIsa::Avx512CoreBf16; break;
    case dnnl_cpu_isa_avx512_core_amx: isa = CpuIsa::Avx512CoreAmx; break;
    default: break;
  }
  IsaInfo info = isa_info(isa);
  if (isa == CpuIsa::Avx512CoreBf16 && detail::intel_bf16_without_amx()) info.bf16_faster = false;
  return info;
}

// Why Precision::Auto is fp32 on a CPU whose oneDNN ISA is `isa` (bf16_faster false), for a report line.
inline std::string bf16_not_faster_reason(const IsaInfo& isa) {
  if (!isa.bf16_native) return "oneDNN runs " + isa.name + ", no native bf16";
  return "oneDNN runs " + isa.name + " on an Intel core whose bf16 engine is AMX, hidden here: its AVX512_BF16 "
         "runs at about half the fp32 rate";
}

// The ISA oneDNN spells `name` ("avx2", "avx512_core_vnni", ...); Unknown for any other text.
inline CpuIsa isa_from_name(const std::string& name) {
  for (CpuIsa isa : {CpuIsa::Sse41, CpuIsa::Avx, CpuIsa::Avx2, CpuIsa::Avx2Vnni, CpuIsa::Avx512Mic, CpuIsa::Avx512Mic4ops,
                     CpuIsa::Avx512Core, CpuIsa::Avx512CoreVnni, CpuIsa::Avx512CoreBf16, CpuIsa::Avx512CoreAmx})
    if (isa_info(isa).name == name) return isa;
  return CpuIsa::Unknown;
}

// True when code compiled for `target` may run on a CPU whose oneDNN ISA is `cpu`: each level of the chain
// sse41 < avx < avx2 < avx512_core < avx512_core_vnni < avx512_core_bf16 < avx512_core_amx contains the ones
// before it; avx2_vnni sits between avx2 and avx512_core but needs VNNI, which avx512_core lacks; the Xeon
// Phi levels (avx512_mic*) contain avx2 only.
inline bool isa_runs_on(CpuIsa target, CpuIsa cpu) {
  if (target == CpuIsa::Unknown || cpu == CpuIsa::Unknown) return false;
  auto rank = [](CpuIsa isa) {
    switch (isa) {
      case CpuIsa::Sse41: return 1;
      case CpuIsa::Avx: return 2;
      case CpuIsa::Avx2: return 3;
      case CpuIsa::Avx2Vnni: return 4;
      case CpuIsa::Avx512Core: return 5;
      case CpuIsa::Avx512CoreVnni: return 6;
      case CpuIsa::Avx512CoreBf16: return 7;
      case CpuIsa::Avx512CoreAmx: return 8;
      default: return 0;
    }
  };
  if (cpu == CpuIsa::Avx512Mic || cpu == CpuIsa::Avx512Mic4ops) return target == cpu || rank(target) <= 3;
  if (target == CpuIsa::Avx512Mic || target == CpuIsa::Avx512Mic4ops) return target == cpu;
  if (target == CpuIsa::Avx2Vnni) return cpu == CpuIsa::Avx2Vnni || isa_info(cpu).int8_vnni;
  if (cpu == CpuIsa::Avx2Vnni) return rank(target) <= 4;
  return rank(target) <= rank(cpu);
}

// The value of DNNL_MAX_CPU_ISA that caps oneDNN at `isa` ("AVX2", "AVX512_CORE_VNNI", ...).
inline std::string max_cpu_isa_env(CpuIsa isa) {
  std::string name = isa_info(isa).name;
  for (char& c : name) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return name;
}

// The CPU's vendor string from CPUID leaf 0 ("GenuineIntel", "AuthenticAMD", ...); "" elsewhere.
inline std::string cpu_vendor() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return "";
  char v[13] = {};
  std::memcpy(v, &ebx, 4);
  std::memcpy(v + 4, &edx, 4);
  std::memcpy(v + 8, &ecx, 4);
  return v;
#else
  return "";
#endif
}

namespace detail {
// An Intel core with AVX512_FP16 (Sapphire Rapids and later, whose bf16 engine is AMX) where oneDNN sees
// avx512_core_bf16 and not AMX: the hypervisor or the OS hides the tiles. Cooper Lake (AVX512_BF16, no
// AVX512_FP16) is not one of them.
inline bool intel_bf16_without_amx() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool yes = [] {
    if (cpu_vendor() != "GenuineIntel") return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    return ((edx >> 23) & 1u) != 0;  // CPUID.(EAX=7,ECX=0):EDX[23] AVX512_FP16
  }();
  return yes;
#else
  return false;
#endif
}
}  // namespace detail

}  // namespace ondine::lower
