// fuzz/artifact.cpp - the .ondine artifact reader (artifact/artifact.hpp) on arbitrary bytes.
//
// The header carries an XXH3 checksum of the schema part; a mutated input would almost always fail it,
// so the target writes the right checksum into the header first (when the header's offsets are inside
// the input), and the FlatBuffers verifier, the enum and range checks and the graph rebuild get the
// mutations. The rebuilt graph then goes through shape inference. Every failure must be an
// ondine::Error; anything else is a finding.
#include <cstdint>
#include <cstring>
#include <vector>

#include "ondine/artifact/artifact.hpp"
#include "ondine/ir/shape_inference.hpp"
#include "replay_main.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool init = [] {
    ondine::Limits l;
    l.max_tensor_bytes = 1 << 20;
    l.max_subgraph_depth = 8;
    ondine::set_limits(l);
    return true;
  }();
  (void)init;
  if (size > (std::size_t{1} << 26)) return 0;  // far beyond -max_len; also bounds the copy below
  // An 8-aligned copy (a mapped file is page-aligned), with the schema checksum made right.
  std::vector<std::uint64_t> buffer((size + 7) / 8 + 1);
  auto* p = reinterpret_cast<unsigned char*>(buffer.data());
  if (size) std::memcpy(p, data, size);
  if (size >= ondine::artifact::kHeaderBytes) {
    namespace d = ondine::artifact::detail;
    const std::uint64_t off = d::get_u64(p + 16), len = d::get_u64(p + 24);
    if (off <= size && len <= size - off) d::put_u64(p + 48, XXH3_64bits(p + off, len));
  }
  try {
    ondine::artifact::Artifact a = ondine::artifact::read_memory(p, size, "fuzz.ondine");
    ondine::infer_shapes(a.graph);
  } catch (const ondine::Error&) {
  }
  return 0;
}
