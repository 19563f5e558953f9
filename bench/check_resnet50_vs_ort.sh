#!/usr/bin/env bash
# check_resnet50_vs_ort.sh - check that Ondine's reference executor matches ONNX Runtime on ResNet-50:
# same seeded weights and input, outputs within 1e-4 relative (max|A-B| / max|B|, see bench/compare_npy.py).
#
# Usage (from anywhere; paths are relative to the repository root):
#   bench/check_resnet50_vs_ort.sh [--ort-only]
# Environment:
#   ONDINE_BIN  the Ondine CLI (default ./build/examples/ondine; build it with
#               cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && make -C build ondine_cli)
#   PYTHON      Python with numpy and onnx (default /usr/bin/python3, Debian's)
#   RTOL        tolerance (default 1e-4)
#   ORT_THREADS intra-op threads for ONNX Runtime (default: its own choice)
# --ort-only runs everything except Ondine (to check the models, inputs and ONNX Runtime setup).
# Steps: make model + input -> ONNX Runtime -> Ondine reference executor -> compare. Exit 0 only on a match.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ONDINE_BIN=${ONDINE_BIN:-./build/examples/ondine}
PYTHON=${PYTHON:-/usr/bin/python3}
RTOL=${RTOL:-1e-4}
ORT_ONLY=0
case "${1:-}" in
  "") ;;
  --ort-only) ORT_ONLY=1 ;;
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  *) echo "check_resnet50_vs_ort: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac

die() { echo "check_resnet50_vs_ort: $*" >&2; exit 1; }
step() { echo "== $*"; }

# Fail before the slow steps when a tool is missing.
if [[ $ORT_ONLY == 0 && ! -x $ONDINE_BIN ]]; then
  die "Ondine CLI not found or not executable at '$ONDINE_BIN'. Build it first
  (cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && make -C build ondine_cli), or set ONDINE_BIN."
fi
command -v node >/dev/null || die "node not found (Node.js runs ONNX Runtime through bench/ort_run.mjs)"
"$PYTHON" -c 'import numpy, onnx' 2>/dev/null || die "$PYTHON lacks numpy/onnx (apt-get install python3-onnx python3-numpy)"
if [[ ! -d bench/node_modules/onnxruntime-node ]]; then
  step "installing onnxruntime-node (CPU) into bench/node_modules"
  (cd bench && npm ci --onnxruntime-node-install=skip) ||
    die "npm ci failed; run: cd bench && npm ci --onnxruntime-node-install=skip"
fi

step "making models/resnet50.onnx and models/resnet50.input.npy"
"$PYTHON" scripts/make_models.py --out models --which resnet50 --inputs

ORT_ARGS=()
[[ -n ${ORT_THREADS:-} ]] && ORT_ARGS+=(--threads "$ORT_THREADS")
step "ONNX Runtime -> out/ort/logits.npy"
rm -rf out/ort
node bench/ort_run.mjs models/resnet50.onnx --input input=models/resnet50.input.npy --output-dir out/ort \
  "${ORT_ARGS[@]}" || die "ONNX Runtime run failed"
"$PYTHON" -c 'import numpy as np, sys; y = np.load(sys.argv[1]); assert np.isfinite(y).all(), "non-finite";
print(f"   ORT logits {list(y.shape)}: min {y.min():.4g} max {y.max():.4g} std {y.std():.4g}")' out/ort/logits.npy

if [[ $ORT_ONLY == 1 ]]; then
  echo "ORT part OK (--ort-only: Ondine not run)"
  exit 0
fi

step "Ondine reference executor -> out/ondine/logits.npy"
rm -rf out/ondine
"$ONDINE_BIN" run models/resnet50.onnx --reference --input input=models/resnet50.input.npy --output-dir out/ondine ||
  die "Ondine failed (exit status $?)"
[[ -f out/ondine/logits.npy ]] || die "Ondine wrote no out/ondine/logits.npy"

step "comparing (rtol $RTOL relative to max|ORT|)"
if "$PYTHON" bench/compare_npy.py out/ondine/logits.npy out/ort/logits.npy --rtol "$RTOL"; then
  echo "OK: Ondine's reference executor matches ONNX Runtime on ResNet-50"
else
  die "MISMATCH: Ondine's reference executor differs from ONNX Runtime on ResNet-50"
fi
