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
echo "$((checks - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
