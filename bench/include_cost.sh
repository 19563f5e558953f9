#!/usr/bin/env bash
# Include cost: seconds and peak memory to compile (g++ -O2 -c) a translation unit that includes one of Ondine's
# entry headers and uses nothing, and the host programs a user writes, median of N runs (default 3). Goals on the
# 2-core build machines: ondine/runtime.hpp under 3 s, ondine/ondine.hpp over the prebuilt libraries under 6 s, a
# host file that compiles models (ondine/model.hpp, examples/model/main.cpp) under 20 s and 1 GB. "Over the
# libraries" is -DONDINE_SEPARATE_COMPILATION, which the CMake targets ondine::runtime and ondine::compiled set for
# their users (ondine/config.hpp); header-only rows are without it. Run it on a quiet machine.
#   bench/include_cost.sh [RUNS] [ONDINE] [--header-only]
# With ONDINE (the built tool, e.g. build/examples/ondine) it also measures the header `ondine header` generates
# for the MNIST example (what a program using ondine_add_model includes) and its implementation file. With
# --header-only it also measures the header-only alternatives, each compiled once per program: the README's
# host program written on lower/lower.hpp and ShapeCache, and src/runtime.cpp (what the library ondine::runtime
# compiles; minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
ondine=${2:-}
header_only=${3:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=(-O2 -std=c++17 -fopenmp -DONNX_ML=1 -DONNX_NAMESPACE=onnx -Iinclude -c)

measure() {  # name, [-DMACRO...], headers... (or a .cpp file to compile as it is)
  local name=$1; shift
  local defines=()
  while [[ ${1:-} == -D* ]]; do defines+=("$1"); shift; done
  if [[ ${1:-} == *.cpp ]]; then
    cp "$1" "$tmp/tu.cpp"
  else
    : > "$tmp/tu.cpp"
    for h in "$@"; do echo "#include \"$h\"" >> "$tmp/tu.cpp"; done
    echo "int main() { return 0; }" >> "$tmp/tu.cpp"
  fi
  local times=() mems=()
  for ((i = 0; i < runs; ++i)); do
    /usr/bin/time -f "%e %M" -o "$tmp/time" g++ "${flags[@]}" "${defines[@]}" -I"$tmp" "$tmp/tu.cpp" -o "$tmp/tu.o" 2>/dev/null
    read -r t m < "$tmp/time"
    times+=("$t"); mems+=("$m")
  done
  local median mem
  median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n "$(( (runs + 1) / 2 ))p")
  mem=$(printf '%s\n' "${mems[@]}" | sort -n | tail -1)
  printf '%-50s %7.2f s %6d MB  (runs: %s)\n' "$name" "$median" "$((mem / 1024))" "${times[*]}"
}

measure "empty TU (the compiler's own start)"
measure "ondine/runtime.hpp" ondine/runtime.hpp
measure "ondine/model.hpp" ondine/model.hpp
measure "ondine/ondine.hpp over the libraries" -DONDINE_SEPARATE_COMPILATION ondine/ondine.hpp
measure "ondine/ondine.hpp header-only" ondine/ondine.hpp
measure "ondine/ondine.hpp + ondine/lower/lower.hpp" ondine/ondine.hpp ondine/lower/lower.hpp
measure "host program on ondine/model.hpp" -DONDINE_SEPARATE_COMPILATION examples/model/main.cpp
if [[ -n $ondine ]]; then
  "$ondine" compile tests/data/mnist/mnist_cnn.onnx -o "$tmp/mnist.ondine" >/dev/null
  "$ondine" header "$tmp/mnist.ondine" --name mnist -o "$tmp/mnist.hpp" >/dev/null
  measure "generated mnist.hpp (ondine_add_model)" "$tmp/mnist.hpp"
  cp "$tmp/mnist.cpp" "$tmp/mnist_impl.cpp"
  measure "its mnist.cpp (over ondine/runtime.hpp)" "$tmp/mnist_impl.cpp"
fi
if [[ $header_only == --header-only ]]; then
  cat > "$tmp/host_header_only.cpp" <<'CPP'
#include <cstdio>
#include "ondine/ondine.hpp"
#include "ondine/lower/lower.hpp"
int main() {
  ondine::Graph g = ondine::onnx::load_model("model.onnx");
  ondine::lower::CompileOptions options;
  options.threads = 2;
  ondine::lower::ShapeCache model(std::move(g), options);
  auto outputs = model.run({{"input", ondine::load_npy("input.npy")}});
  for (auto& [name, t] : outputs) std::printf("%s: %s\n", name.c_str(), ondine::dims_str(t.dims()).c_str());
}
CPP
  measure "host program on lower/lower.hpp (header-only)" "$tmp/host_header_only.cpp"
  measure "src/runtime.cpp (ondine::runtime, once)" src/runtime.cpp
fi
