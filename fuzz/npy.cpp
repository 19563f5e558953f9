// fuzz/npy.cpp - the .npy reader (ir/npy.hpp) on arbitrary bytes.
//
// Every failure must be an ondine::Error naming the input; a crash, a sanitizer report, another
// exception, or an allocation past the lowered tensor limit (1 MiB) is a finding.
#include <cstdint>

#include "ondine/ir/npy.hpp"
#include "replay_main.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool init = [] {
    ondine::Limits l;
    l.max_tensor_bytes = 1 << 20;
    ondine::set_limits(l);
    return true;
  }();
  (void)init;
  try {
    ondine::Tensor t = ondine::load_npy_from_memory(data, size, "fuzz.npy");
    if (t.nbytes() > size) __builtin_trap();  // the data came from the input: it cannot be larger
  } catch (const ondine::Error&) {
  }
  return 0;
}
