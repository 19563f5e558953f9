#!/usr/bin/env bash
# CTest python_module_install: `cmake --install BUILD --component python` into a scratch prefix, then
# `import ondine` from there (not from the build tree) in a fresh Debian python3 and one run of the MNIST CNN.
#
#   install_test.sh BUILD_DIR PYTHON INSTALL_DIR(relative to the prefix) TEST_DATA_DIR
set -euo pipefail
build=$1 python=$2 dir=$3 data=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --component python --prefix "$work/prefix" >/dev/null
cd "$work"
PYTHONPATH="$work/prefix/$dir" PYTHONDONTWRITEBYTECODE=1 "$python" - "$work/prefix/$dir" "$data" <<'PY'
import os, sys
import numpy as np
import ondine
assert os.path.dirname(ondine.__file__) == sys.argv[1], ondine.__file__
m = ondine.compile(os.path.join(sys.argv[2], "mnist", "mnist_cnn.onnx"))
x = np.load(os.path.join(sys.argv[2], "mnist", "test_images.npy"))[:8]
want = np.load(os.path.join(sys.argv[2], "mnist", "test_predictions.npy"))[:8]
got = m.run({"input": x})["logits"].argmax(axis=1)
assert (got == want).all(), (got, want)
print("installed module:", ondine.__file__, "ok")
PY
