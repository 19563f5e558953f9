// A host program: builds a small graph with Ondine's IR, saves it as ONNX, loads it back and runs it.
#include <cstdio>
#include <filesystem>

#include "ondine/ondine.hpp"

int main() {
  using namespace ondine;
  Graph g;
  g.name = "host_example";
  Value* x = g.add_input("x", DType::Float32, Shape{Dim::named("batch"), 3});
  Value* w = g.add_constant("w", Tensor::from_vector<float>({3, 2}, {1, 2, 3, 4, 5, 6}));
  Value* y = g.add_op("Relu", {g.add_op("MatMul", {x, w})}, {}, "y");
  g.add_output(y);

  std::string path = (std::filesystem::temp_directory_path() / "ondine_host_example.onnx").string();
  ondine::onnx::save_model(g, path);
  Graph loaded = ondine::onnx::load_model(path);

  ReferenceExecutor exec(loaded);
  auto out = exec.run({{"x", Tensor::from_vector<float>({1, 3}, {1, -1, 2})}});
  const float* v = out.at("y").data<float>();
  std::printf("ondine %s: y = [%g, %g]\n", ondine::version, v[0], v[1]);  // [1-3+10, 2-4+12] = [8, 10]
  std::filesystem::remove(path);
  return v[0] == 8.0f && v[1] == 10.0f ? 0 : 1;
}
