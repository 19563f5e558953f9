// SPDX-License-Identifier: Apache-2.0
// ondine/ondine.hpp over the prebuilt libraries (ondine/config.hpp), as a host that imports, rewrites and checks
// models uses it: this file sees only the declarations of shape inference, the reference kernels, the built-in
// passes and the ONNX import/export, and links ondine::compiled, which defines them once.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "ondine/model.hpp"
#include "ondine/ondine.hpp"

static_assert(ONDINE_CORE_DECLARATIONS_ONLY && ONDINE_ONNX_DECLARATIONS_ONLY,
              "this file must build over the libraries: it links ondine::compiled (ONDINE_SEPARATE_COMPILATION)");

namespace {

const std::string kMnistModel = std::string(ONDINE_TEST_DATA_DIR) + "/mnist/mnist_cnn.onnx";

ondine::Tensor digit(int seed) {
  ondine::Tensor x(ondine::DType::Float32, {1, 1, 28, 28});
  float* p = x.data<float>();
  for (std::int64_t k = 0; k < x.numel(); ++k) p[k] = static_cast<float>((k * 7 + seed * 13) % 17) / 17.0f;
  return x;
}

double largest_difference(const ondine::Tensor& a, const ondine::Tensor& b) {
  REQUIRE(a.dims() == b.dims());
  double d = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    d = std::max(d, std::fabs(a.at_double(static_cast<std::size_t>(i)) - b.at_double(static_cast<std::size_t>(i))));
  return d;
}

// A user's pass, registered into the library's registry by name.
int relus_seen = 0;
struct CountRelus {
  static constexpr const char* name = "count-relus";
  bool run(ondine::Graph& g, ondine::PassContext&) {
    for (ondine::Node* n : g.nodes()) relus_seen += n->op_type() == "Relu";
    return false;
  }
};

}  // namespace

TEST_CASE("Over the libraries: import, passes, reference executor and export from declarations", "[library]") {
  ondine::Graph g = ondine::onnx::load_model(kMnistModel);
  REQUIRE(g.inputs().size() == 1);
  CHECK(g.inputs()[0]->shape().rank() == 4);  // shape inference ran in the library
  CHECK(ondine::is_supported_op("", "Conv"));
  CHECK(ondine::supported_ops().size() > 150);

  const std::string input = g.inputs()[0]->name();
  const std::string output = g.outputs()[0]->name();
  const ondine::Tensor x = digit(3);
  const ondine::Tensor before = ondine::ReferenceExecutor(g).run({{input, x}}).at(output);

  const std::size_t nodes = g.nodes().size();
  ondine::make_pass_manager().run(g);  // the built-in pipeline, defined in ondine::runtime
  CHECK(g.nodes().size() < nodes);     // BatchNorm and activations folded and fused
  ondine::infer_shapes(g);
  const ondine::Tensor after = ondine::ReferenceExecutor(g).run({{input, x}}).at(output);
  CHECK(largest_difference(before, after) < 1e-4);

  // The model compiled by the library agrees with the reference run of the same file.
  ondine::lower::CompileOptions options;
  options.threads = 1;
  const ondine::Model m = ondine::Model::compile(kMnistModel, options);
  CHECK(largest_difference(m.run({{input, x}}).at(output), before) < 1e-4);

  // A pass of the program's own joins the library's registry and runs in a pipeline by name.
  if (!ondine::pass_registry().contains(CountRelus::name)) ondine::pass_registry().add<CountRelus>();
  ondine::Graph fresh = ondine::onnx::load_model(kMnistModel);
  relus_seen = 0;
  ondine::make_pass_manager("count-relus").run(fresh);
  CHECK(relus_seen > 0);

  // Export and import round trip.
  const std::string path = std::string(ONDINE_TEST_TMP_DIR) + "/library_core_mnist.onnx";
  ondine::onnx::save_model(fresh, path);
  ondine::Graph again = ondine::onnx::load_model(path);
  CHECK(again.nodes().size() == fresh.nodes().size());
  CHECK(!ondine::onnx::serialize_model(again).empty());
  const ondine::Tensor reloaded = ondine::ReferenceExecutor(again).run({{input, x}}).at(output);
  CHECK(largest_difference(reloaded, before) == 0);
  std::remove(path.c_str());
}

TEST_CASE("Over the libraries: a missing model file is an Error naming it", "[library]") {
  const std::string missing = std::string(ONDINE_TEST_TMP_DIR) + "/no_such_model.onnx";
  try {
    ondine::onnx::load_model(missing);
    FAIL("load_model of a missing file did not throw");
  } catch (const ondine::Error& e) {
    CHECK(std::string(e.what()).find("no_such_model.onnx") != std::string::npos);
  }
}
