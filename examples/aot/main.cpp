// Runs a model compiled into the build by ondine_add_model (examples/aot/CMakeLists.txt) through its generated
// classes: gpt (symbolic batch and seq, artifact file) and gpt_embedded (batch 1, seq 16, linked in). Inputs and
// outputs are typed, shaped accessors (ondine::TypedTensor): gpt::input_ids_t is TypedTensor<std::int64_t, 2>,
// Outputs::logits a TypedTensor<float, 3>.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "gpt.hpp"
#include "gpt_embedded.hpp"

int main() {
  try {
    gpt missing("no-such-model.ondine");
  } catch (const ondine::Error& e) {
    std::printf("a missing artifact is an error naming it: %s\n", e.file().c_str());
  }
  gpt model(1);                                                // symbolic dims: make_input_ids(batch, seq)
  gpt_embedded embedded(1);                                    // fixed dims: make_input_ids()
  gpt::input_ids_t ids = gpt::make_input_ids(1, 16);           // int64 [1, 16]
  gpt_embedded::input_ids_t fixed = gpt_embedded::make_input_ids();
  for (std::int64_t t = 0; t < ids.dim(1); ++t) ids(0, t) = fixed(0, t) = (7 * t + 3) % 100;
  gpt::Outputs a = model.run(ids);
  gpt_embedded::Outputs b = embedded.run(fixed);
  double err = 0, mag = 0;
  for (std::int64_t t = 0; t < a.logits.dim(1); ++t)
    for (std::int64_t v = 0; v < a.logits.dim(2); ++v) {
      err = std::max(err, static_cast<double>(std::fabs(a.logits(0, t, v) - b.logits(0, t, v))));
      mag = std::max(mag, static_cast<double>(std::fabs(b.logits(0, t, v))));
    }
  bool caught = false;
  try {
    a.logits.at(0, a.logits.dim(1), 0);  // one past the sequence: checked access refuses it
  } catch (const ondine::Error& e) {
    caught = true;
    std::printf("checked access: %s\n", e.what());
  }
  std::printf("logits %s, file vs embedded: max |difference| %.3g of max |logit| %.3g\n",
              ondine::dims_str(a.logits.tensor().dims()).c_str(), err, mag);
  return a.logits.dims() == b.logits.dims() && caught && mag > 0 && err <= 1e-4 * mag ? 0 : 1;
}
