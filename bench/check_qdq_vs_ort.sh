#!/usr/bin/env bash
# check_qdq_vs_ort.sh - quantize ResNet-50 and MobileNetV2 with `ondine quantize` (QDQ ONNX), then run the QDQ
# model in ONNX Runtime and in Ondine's reference executor, and report how close each is to the fp32 model
# (ONNX Runtime's fp32 output) and to each other.
#
# Usage (from anywhere; paths are relative to the repository root):
#   bench/check_qdq_vs_ort.sh [MODEL...]          (default: resnet50 mobilenetv2)
# Environment:
#   ONDINE_BIN   the Ondine CLI (default ./build/examples/ondine)
#   PYTHON       Python with numpy and onnx (default /usr/bin/python3)
#   N_CALIB      calibration samples (default 16), seeded image-like random inputs (scripts/make_models.py's recipe)
#   N_EVAL       evaluation inputs, other seeds than calibration (default 4)
#   METHOD       calibration method (default minmax; entropy, percentile, mse, moving-average)
#   QUANT_ARGS   more `ondine quantize` arguments (e.g. "--keep-fp32-ends")
#   MIN_COSINE   pass bound on cosine(QDQ output, fp32 output) (default 0.99)
#   MIN_AGREE    pass bound on cosine(Ondine QDQ, ORT QDQ) (default 0.999: same QDQ semantics, ORT's int8
#                kernels round the requantized conv outputs their own way)
#   ORT_THREADS  intra-op threads for ONNX Runtime
# Output: out/qdq/<model>/ (calibration .npy, eval inputs, QDQ model, outputs) and a table per model.
# Exit 0 only when every model passes both bounds.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ONDINE_BIN=${ONDINE_BIN:-./build/examples/ondine}
PYTHON=${PYTHON:-/usr/bin/python3}
N_CALIB=${N_CALIB:-16}
N_EVAL=${N_EVAL:-4}
METHOD=${METHOD:-minmax}
MIN_COSINE=${MIN_COSINE:-0.99}
MIN_AGREE=${MIN_AGREE:-0.999}
read -r -a EXTRA <<<"${QUANT_ARGS:-}"
MODELS=("$@")
[[ ${#MODELS[@]} -eq 0 ]] && MODELS=(resnet50 mobilenetv2)
case "${MODELS[0]}" in
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
esac

die() { echo "check_qdq_vs_ort: $*" >&2; exit 1; }
step() { echo "== $*"; }

[[ -x $ONDINE_BIN ]] || die "Ondine CLI not found at '$ONDINE_BIN' (build the ondine_cli target, or set ONDINE_BIN)"
command -v node >/dev/null || die "node not found (ONNX Runtime runs through bench/ort_run.mjs)"
"$PYTHON" -c 'import numpy, onnx' 2>/dev/null || die "$PYTHON lacks numpy/onnx"
if [[ ! -d bench/node_modules/onnxruntime-node ]]; then
  step "installing onnxruntime-node (CPU) into bench/node_modules"
  (cd bench && npm ci --onnxruntime-node-install=skip) || die "npm ci failed"
fi
ORT_ARGS=()
[[ -n ${ORT_THREADS:-} ]] && ORT_ARGS+=(--threads "$ORT_THREADS")

status=0
for name in "${MODELS[@]}"; do
  model=models/$name.onnx
  dir=out/qdq/$name
  if [[ ! -f $model ]]; then
    step "making $model"
    "$PYTHON" scripts/make_models.py --out models --which "$name"
  fi
  rm -rf "$dir" && mkdir -p "$dir/calib" "$dir/eval"

  step "$name: $N_CALIB calibration and $N_EVAL evaluation inputs (seeded)"
  "$PYTHON" - "$dir" "$N_CALIB" "$N_EVAL" <<'PY'
import sys
import numpy as np
out, n_calib, n_eval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def image(rng):  # scripts/make_models.py's image-like input: brightness, contrast, 8x8 blocks, noise
    offset = rng.normal(0.0, 0.5, size=(1, 3, 1, 1))
    contrast = rng.uniform(0.5, 1.5, size=(1, 1, 1, 1))
    blocks = np.kron(rng.standard_normal((1, 3, 28, 28)), np.ones((8, 8)))
    return (offset + contrast * (0.8 * blocks + 0.6 * rng.standard_normal((1, 3, 224, 224)))).astype(np.float32)
for i in range(n_calib):
    np.save(f"{out}/calib/{i:03d}.npy", image(np.random.default_rng([1, i])))
for i in range(n_eval):
    np.save(f"{out}/eval/{i:03d}.npy", image(np.random.default_rng([2, i])))
PY

  step "$name: ondine quantize (--method $METHOD ${EXTRA[*]:-})"
  "$ONDINE_BIN" quantize "$model" --calib "$dir/calib" -o "$dir/$name.qdq.onnx" --method "$METHOD" \
    --save-calibration "$dir/calibration.txt" "${EXTRA[@]}" | tee "$dir/quantize.txt"
  "$PYTHON" - "$dir/$name.qdq.onnx" <<'PY' || die "$name: the QDQ model is not valid ONNX"
import sys
import onnx
m = onnx.load(sys.argv[1])
onnx.checker.check_model(m, full_check=True)  # full_check: strict shape inference too
ops = [n.op_type for n in m.graph.node]
q, dq = ops.count("QuantizeLinear"), ops.count("DequantizeLinear")
print(f"   onnx.checker: valid (opset {m.opset_import[0].version}, {q} QuantizeLinear, {dq} DequantizeLinear)")
PY

  for f in "$dir"/eval/*.npy; do
    i=$(basename "$f" .npy)
    node bench/ort_run.mjs "$model" --input "input=$f" --output-dir "$dir/ort_fp32/$i" "${ORT_ARGS[@]}" ||
      die "ONNX Runtime failed on $model"
    node bench/ort_run.mjs "$dir/$name.qdq.onnx" --input "input=$f" --output-dir "$dir/ort_qdq/$i" "${ORT_ARGS[@]}" ||
      die "ONNX Runtime failed on the QDQ model"
    "$ONDINE_BIN" run "$dir/$name.qdq.onnx" --reference --input "input=$f" --output-dir "$dir/ondine_qdq/$i" >/dev/null ||
      die "Ondine's reference executor failed on the QDQ model"
    echo "   eval input $i: done"
  done

  step "$name: cosine similarity of the logits"
  "$PYTHON" - "$dir" "$MIN_COSINE" "$MIN_AGREE" <<'PY' || status=1
import glob, os, sys
import numpy as np
sys.path.insert(0, "bench")
from compare_npy import compare
d, min_cos, min_agree = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
print(f"   {'input':>5} {'ORT QDQ vs fp32':>16} {'Ondine QDQ vs fp32':>19} {'Ondine vs ORT QDQ':>18} "
      f"{'rel_to_max':>11} {'top1 (fp32/ORT/Ondine)':>24}")
worst = [1.0, 1.0, 1.0]
for e in sorted(glob.glob(f"{d}/eval/*.npy")):
    i = os.path.basename(e)[:-4]
    fp32, ort, ond = (np.load(f"{d}/{k}/{i}/logits.npy") for k in ("ort_fp32", "ort_qdq", "ondine_qdq"))
    c = [compare(ort, fp32, 1e-3)["cosine"], compare(ond, fp32, 1e-3)["cosine"], compare(ond, ort, 1e-3)]
    rel = c[2]["rel_to_max"]
    c[2] = c[2]["cosine"]
    worst = [min(w, x) for w, x in zip(worst, c)]
    top1 = "/".join(str(int(np.argmax(t))) for t in (fp32, ort, ond))
    print(f"   {i:>5} {c[0]:16.6f} {c[1]:19.6f} {c[2]:18.6f} {rel:11.3g} {top1:>24}")
ok = worst[0] >= min_cos and worst[1] >= min_cos and worst[2] >= min_agree
print(f"   worst: ORT {worst[0]:.6f}, Ondine {worst[1]:.6f} (bound {min_cos}); agreement {worst[2]:.6f} "
      f"(bound {min_agree}): {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
done
exit $status
