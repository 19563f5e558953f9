// Runs a model compiled into the build by ondine_add_model (examples/aot/CMakeLists.txt) through its generated
// classes: gpt (symbolic batch and seq, artifact file) and gpt_embedded (batch 1, seq 16, linked in).
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
  gpt model(1);                   // symbolic dims: make_input_ids(batch, seq)
  gpt_embedded embedded(1);       // fixed dims: make_input_ids()
  ondine::Tensor ids = gpt::make_input_ids(1, 16);
  ondine::Tensor fixed = gpt_embedded::make_input_ids();
  for (int i = 0; i < 16; ++i) ids.data<std::int64_t>()[i] = fixed.data<std::int64_t>()[i] = (7 * i + 3) % 100;
  gpt::Outputs a = model.run(ids);
  gpt_embedded::Outputs b = embedded.run(fixed);
  double err = 0, mag = 0;
  for (std::int64_t i = 0; i < a.logits.numel(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(a.logits.data<float>()[i] - b.logits.data<float>()[i])));
    mag = std::max(mag, static_cast<double>(std::fabs(b.logits.data<float>()[i])));
  }
  std::printf("logits %s, file vs embedded: max |difference| %.3g of max |logit| %.3g\n",
              ondine::dims_str(a.logits.dims()).c_str(), err, mag);
  return a.logits.dims() == b.logits.dims() && mag > 0 && err <= 1e-4 * mag ? 0 : 1;
}
