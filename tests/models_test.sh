#!/usr/bin/env bash
# The bundled example models: written by scripts/make_models.py (seeded, no download), then inspected,
# optimised by the default pass pipeline (`ondine compile --check`: the imported and the optimised model
# on the reference executor), compiled and run by the `ondine` tool at batch 1 and 2, each compiled run
# checked against the reference executor (--check, 1e-4 relative to max |reference|). Checks that the
# symbolic batch binds, that no op is unsupported, and that the outputs have the expected shapes and are
# finite. Then MobileNetV2 quantized to int8, checked with the int8 bound.
set -euo pipefail
ondine=$1 src=$2 out=$3
mkdir -p "$out"
[ -f "$out/bert.onnx" ] || /usr/bin/python3 "$src/scripts/make_models.py" --out "$out" >/dev/null

check() {  # check MODEL DIMS PATTERN [TOLERANCE]: runs the model and greps its output summary
  local log tolerance=(--tolerance "${4:-1e-4}")
  [ "${4:-}" = default ] && tolerance=()
  log=$("$ondine" run "$out/$1.onnx" --dim "$2" --check "${tolerance[@]}" 2>&1) || { echo "FAIL: ondine run $1 --dim $2"; echo "$log"; exit 1; }
  grep -qE -- "check: .* ok" <<<"$log" || { echo "FAIL: $1: no passing check line"; echo "$log"; exit 1; }
  grep -qE -- "$3" <<<"$log" || { echo "FAIL: $1 --dim $2: output does not match /$3/"; echo "$log"; exit 1; }
  if grep -qiE 'nan|inf' <<<"$log"; then echo "FAIL: $1 produced non-finite values"; echo "$log"; exit 1; fi
  echo "ok: $1 $2: $(head -1 <<<"$log")"
  passed=$((passed + 1))
}
passed=0

for m in resnet50 mobilenetv2 bert; do
  "$ondine" inspect "$out/$m.onnx" | grep -q 'unsupported ops: none' || { echo "FAIL: $m has unsupported ops"; exit 1; }
  passed=$((passed + 1))
done
"$ondine" inspect "$out/resnet50.onnx" | grep -qE 'FLOPs: +8\.[0-9]+ GFLOP at batch=1' || { echo "FAIL: ResNet-50 FLOPs"; exit 1; }
passed=$((passed + 1))
# The pass pipeline alone: the imported and the optimised model on the reference executor, batch 1.
for m in resnet50 mobilenetv2 bert; do
  log=$("$ondine" compile "$out/$m.onnx" --check --tolerance 1e-4 2>&1) || { echo "FAIL: ondine compile $m --check"; echo "$log"; exit 1; }
  echo "ok: compile $m: $(grep '^passes:' <<<"$log")"
  passed=$((passed + 1))
done
check resnet50 batch=1 'logits: float32\[1,1000\]'
check resnet50 batch=2 'logits: float32\[2,1000\]'
check mobilenetv2 batch=2 'logits: float32\[2,1000\]'
check bert batch=2 'last_hidden_state: float32\[2,128,256\]'
# Int8: MobileNetV2 quantized by `ondine quantize` on 4 seeded N(0,1) inputs, compiled to int8 primitives and
# checked with --check's default for int8 models (10% of max |reference|; about 2% here).
if [ ! -f "$out/mobilenetv2.int8.onnx" ]; then
  /usr/bin/python3 -c 'import sys, os, numpy as np
rng = np.random.default_rng(0); os.makedirs(sys.argv[1], exist_ok=True)
for i in range(4): np.save(f"{sys.argv[1]}/s{i}.npy", rng.standard_normal((1, 3, 224, 224)).astype(np.float32))' "$out/calib"
  "$ondine" quantize "$out/mobilenetv2.onnx" --calib "$out/calib" -o "$out/mobilenetv2.int8.onnx" >/dev/null 2>&1 ||
    { echo "FAIL: ondine quantize mobilenetv2"; exit 1; }
fi
check mobilenetv2.int8 batch=2 'check: tolerance 10% of max \|reference\| \(int8 model' default
echo "$passed passed, 0 failed"
