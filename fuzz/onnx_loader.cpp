// fuzz/onnx_loader.cpp - an ONNX file through import, shape inference and the reference executor.
//
// The bytes are parsed as a ModelProto and imported with shape inference (onnx/import.hpp); when that
// succeeds, the graph runs once on the reference executor with small inputs (symbolic dims bound to 1,
// at most 4096 elements per input). Every failure must be an ondine::Error: any other exception, a
// crash or a sanitizer report is a finding. Limits are lowered (64 KiB per tensor, 1 MiB files, 8
// subgraph levels, 64 loop iterations) so that a run stays fast and memory stays small; what those
// limits stop is exactly what they are for.
#include <cstdint>
#include <map>
#include <string>

#include "ondine/onnx/import.hpp"
#include "ondine/reference/executor.hpp"
#include "replay_main.hpp"

namespace {

bool small_inputs(const ondine::Graph& g, std::map<std::string, ondine::Tensor>& inputs) {
  using namespace ondine;
  for (Value* in : g.inputs()) {
    if (in->dtype() == DType::Undefined || in->dtype() == DType::String || !in->shape().rank_known()) return false;
    std::vector<std::int64_t> dims;
    std::int64_t n = 1;
    for (const Dim& d : in->shape().dims()) {
      dims.push_back(d.is_static() ? d.value : 1);
      n *= std::max<std::int64_t>(dims.back(), 1);
      if (dims.back() > 4096 || n > 4096) return false;
    }
    Tensor t(in->dtype(), dims);
    dispatch_dtype(t.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* p = static_cast<T*>(t.raw());
      for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(static_cast<float>(i % 5));
    });
    inputs[in->name()] = t;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool init = [] {
    ondine::Limits l;
    l.max_model_bytes = 1 << 20;
    l.max_tensor_bytes = 64 << 10;
    l.max_subgraph_depth = 8;
    ondine::set_limits(l);
    ondine::reference::set_max_loop_iterations(64);
    return true;
  }();
  (void)init;
  try {
    ondine::Graph g = ondine::onnx::load_model_from_memory(data, size, "/nonexistent-fuzz-dir", "fuzz.onnx");
    std::map<std::string, ondine::Tensor> inputs;
    if (!small_inputs(g, inputs)) return 0;
    ondine::ReferenceExecutor ex(g);
    ex.run(inputs);
  } catch (const ondine::Error&) {
  }
  return 0;
}
