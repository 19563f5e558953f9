#!/usr/bin/env bash
# Include cost: seconds to compile (g++ -O2 -c) a translation unit that includes one of Ondine's entry
# headers and uses nothing, median of N runs (default 3). Goals (issue 20): ondine/ondine.hpp under 8 s,
# ondine/runtime.hpp under 3 s on the 2-core build machines. Run it on a quiet machine.
#   bench/include_cost.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=(-O2 -std=c++17 -fopenmp -DONNX_ML=1 -DONNX_NAMESPACE=onnx -Iinclude -c)

measure() {  # name, headers...
  local name=$1; shift
  : > "$tmp/tu.cpp"
  for h in "$@"; do echo "#include \"$h\"" >> "$tmp/tu.cpp"; done
  echo "int main() { return 0; }" >> "$tmp/tu.cpp"
  local times=()
  for ((i = 0; i < runs; ++i)); do
    local t0 t1
    t0=$(date +%s.%N)
    g++ "${flags[@]}" "$tmp/tu.cpp" -o "$tmp/tu.o"
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
