#!/usr/bin/env bash
# ondine/runtime.hpp is the runtime without ONNX or protobuf: (1) the headers a translation unit including it
# pulls in (g++ -MM) are light: no onnx/, protobuf, oneDNN, lower/, passes/ or quant/ header; (2) a host program
# built with it and the runtime's implementation (src/runtime.cpp, what the library ondine::runtime compiles),
# linked against oneDNN only (examples/runtime/main.cpp), runs an artifact written by `ondine compile -o` and
# gives the outputs `ondine run` gives for the same file (within float32 rounding).
set -uo pipefail
ondine=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0 passes=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

cxx=${CXX:-c++}
deps=$("$cxx" -std=c++17 -fopenmp -I"$src/include" -MM "$src/examples/runtime/main.cpp" 2>&1) || bad "g++ -MM failed: $deps"
heavy=$(tr ' ' '\n' <<<"$deps" | grep -E 'onnx/|google/protobuf|dnnl|ondine/(lower|passes|quant|onnx|reference)/' |
  grep -v 'ondine/lower/options.hpp$')
if [ -n "$heavy" ]; then
  bad "ondine/runtime.hpp pulls in:"; head <<<"$heavy"
else ok; fi

if "$cxx" -std=c++17 -O1 -fopenmp -I"$src/include" "$src/examples/runtime/main.cpp" "$src/src/runtime.cpp" \
  -o "$work/runtime_host" -ldnnl \
  2>"$work/build.log"; then ok; else bad "building the runtime host:"; head -20 "$work/build.log"; fi
if ldd "$work/runtime_host" 2>/dev/null | grep -qE 'protobuf|onnx'; then bad "the runtime host links protobuf or ONNX"; else ok; fi

gpt=$src/tests/data/torch/gpt_decoder
"$ondine" compile "$gpt/model.onnx" -o "$work/gpt.ondine" >/dev/null || bad "ondine compile -o gpt.ondine"
mkdir -p "$work/host" "$work/cli"
if "$work/runtime_host" "$work/gpt.ondine" input_ids="$gpt/case1.input_ids.npy" "$work/host" >"$work/host.log" 2>&1; then ok
else bad "runtime host run:"; cat "$work/host.log"; fi
"$ondine" run "$work/gpt.ondine" --threads 1 --input input_ids="$gpt/case1.input_ids.npy" --output-dir "$work/cli" >/dev/null 2>&1
# Within float32 rounding, not bit for bit: the shape-free plan's own loops (layer norm, softmax) are compiled
# into each program from the headers, and this host is built at -O1 (no vectorised sums), `ondine` at -O3.
if diff=$(/usr/bin/python3 -c '
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
d = float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), 1e-6) if a.shape == b.shape else float("inf")
print(d); sys.exit(0 if d < 1e-5 else 1)' "$work/host/logits.npy" "$work/cli/logits.npy" 2>&1); then ok
else bad "the runtime host's logits differ from ondine run's (relative $diff)"; fi
# A bad artifact: an error naming the file, exit 1.
head -c 300 "$work/gpt.ondine" >"$work/cut.ondine"
out=$("$work/runtime_host" "$work/cut.ondine" input_ids="$gpt/case1.input_ids.npy" "$work/host" 2>&1)
if [ $? -eq 1 ] && grep -q 'cut.ondine: not a valid Ondine artifact' <<<"$out"; then ok; else bad "cut artifact: $out"; fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
