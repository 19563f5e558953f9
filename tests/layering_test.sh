#!/usr/bin/env bash
# The library's layers depend downwards only (README, "Layout"): fails on any include
# that points up, and on oneDNN or protobuf headers outside the one folder allowed to see them.
set -uo pipefail
inc=$(cd "$(dirname "$0")/../include/ondine" && pwd)
fails=0 checks=0
# forbid DIR PATTERN WHY: no header under DIR may include a path matching PATTERN.
forbid() {
  local dir=$1 pattern=$2 why=$3 hits
  checks=$((checks + 1))
  hits=$(grep -rnE "^#include [<\"]($pattern)" "$inc/$dir" 2>/dev/null)
  if [ -n "$hits" ]; then
    echo "FAIL: $dir/ must not include $pattern ($why):"
    echo "$hits" | sed "s|$inc/||"
    fails=$((fails + 1))
  fi
}
forbid ir 'ondine/(onnx|passes|quant|reference|lower|runtime)/' "the IR is the bottom layer"
forbid passes 'ondine/(onnx|quant|lower|runtime)/' "passes sit below quant/ and lower/"
forbid reference 'ondine/(onnx|passes|quant|lower|runtime)/' "the oracle sees only the IR"
forbid quant 'ondine/(onnx|lower|runtime)/' "quantization sits below the lowering"
forbid lower 'ondine/onnx/' "the lowering works on the IR, never on protobuf"
forbid runtime 'ondine/(onnx|passes|quant|lower)/' "running a compiled model needs no importer or passes"
forbid artifact 'ondine/(onnx|passes|quant|reference|lower|runtime)/' "the artifact file format sees only the IR"
for dir in ir passes reference quant runtime onnx artifact; do
  forbid "$dir" 'oneapi/|dnnl' "only lower/ includes oneDNN"
done
for dir in ir passes reference quant runtime lower artifact; do
  forbid "$dir" 'onnx/|google/protobuf' "only onnx/ sees protobuf"
done
for dir in ir passes reference quant runtime onnx artifact; do
  forbid "$dir" 'kissfft/' "only lower/ sees KissFFT (optional: lower/detail/signal.hpp)"
done
# impl/ holds the definitions behind the light headers (ondine/model.hpp), for one source file of a program:
# only ondine/model_impl.hpp and impl/ itself include it.
checks=$((checks + 1))
hits=$(grep -rnE '^#include [<"]ondine/impl/' "$inc" | grep -vE "^$inc/(impl/|model_impl.hpp:)")
if [ -n "$hits" ]; then
  echo "FAIL: only ondine/model_impl.hpp includes ondine/impl/:"
  echo "$hits" | sed "s|$inc/||"
  fails=$((fails + 1))
fi
# No include cycle anywhere: every header's "ondine/..." includes, as edges, sort topologically (tsort names
# the headers of a cycle).
checks=$((checks + 1))
edges=$(cd "$inc/.." && grep -rE '^#include "ondine/[^"]+"' --include='*.hpp' ondine |
  sed -E 's|^([^:]+):#include "([^"]+)".*|\1 \2|')
if ! cycle=$(tsort <<<"$edges" 2>&1 >/dev/null) || [ -n "$cycle" ]; then
  echo "FAIL: include cycle:"
  echo "$cycle" | head -20
  fails=$((fails + 1))
fi
echo "$((checks - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
