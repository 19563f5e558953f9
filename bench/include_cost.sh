#!/usr/bin/env bash
# Include cost: seconds to compile (g++ -O2 -c) a translation unit that includes one of Ondine's entry
# headers and uses nothing, median of N runs (default 3). Goals: ondine/ondine.hpp under 8 s,
# ondine/runtime.hpp under 3 s on the 2-core build machines. Run it on a quiet machine.
#   bench/include_cost.sh [RUNS] [ONDINE]
# With ONDINE (the built tool, e.g. build/examples/ondine) it also measures the header `ondine header` generates
# for the MNIST example (what a program using ondine_add_model includes) and its implementation file.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
ondine=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=(-O2 -std=c++17 -fopenmp -DONNX_ML=1 -DONNX_NAMESPACE=onnx -Iinclude -c)

measure() {  # name, headers... (or a .cpp file to compile as it is)
  local name=$1; shift
  if [[ ${1:-} == *.cpp ]]; then
    cp "$1" "$tmp/tu.cpp"
  else
    : > "$tmp/tu.cpp"
    for h in "$@"; do echo "#include \"$h\"" >> "$tmp/tu.cpp"; done
    echo "int main() { return 0; }" >> "$tmp/tu.cpp"
  fi
  local times=()
  for ((i = 0; i < runs; ++i)); do
    local t0 t1
    t0=$(date +%s.%N)
    g++ "${flags[@]}" -I"$tmp" "$tmp/tu.cpp" -o "$tmp/tu.o"
    t1=$(date +%s.%N)
    times+=("$(echo "$t1 - $t0" | bc)")
  done
  local median
  median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n "$(( (runs + 1) / 2 ))p")
  printf '%-44s %6.2f s  (runs: %s)\n' "$name" "$median" "${times[*]}"
}

measure "empty TU (the compiler's own start)"
measure "ondine/ondine.hpp" ondine/ondine.hpp
measure "ondine/ondine.hpp + ondine/lower/lower.hpp" ondine/ondine.hpp ondine/lower/lower.hpp
measure "ondine/runtime.hpp" ondine/runtime.hpp
if [[ -n $ondine ]]; then
  "$ondine" compile tests/data/mnist/mnist_cnn.onnx -o "$tmp/mnist.ondine" >/dev/null
  "$ondine" header "$tmp/mnist.ondine" --name mnist -o "$tmp/mnist.hpp" >/dev/null
  measure "generated mnist.hpp (ondine_add_model)" "$tmp/mnist.hpp"
  cp "$tmp/mnist.cpp" "$tmp/mnist_impl.cpp"
  measure "its mnist.cpp (compiled once)" "$tmp/mnist_impl.cpp"
fi
