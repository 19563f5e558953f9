#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: dependencies, build the `ondine` tool, write the bundled
# example model (ResNet-50 with seeded weights, no download), inspect it, compile it to oneDNN primitives for
# this CPU, run it (checked against the reference executor) and print a benchmark line; then the same
# model quantized to int8.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target ondine_cli
[ -f models/resnet50.onnx ] || /usr/bin/python3 scripts/make_models.py --out models --which resnet50
./build/examples/ondine inspect models/resnet50.onnx
./build/examples/ondine run models/resnet50.onnx --dim batch=1 --threads "$(nproc)" --runs 20 --check
# Int8: quantize it (calibrated on 4 seeded random inputs here; real images calibrate better), show where
# the int8 plan leaves int8 and its predicted time against fp32, and run it compiled with int8 primitives,
# checked against the reference executor with --check's int8 bound.
if [ ! -f models/resnet50.int8.onnx ]; then
  /usr/bin/python3 -c 'import os, numpy as np
rng = np.random.default_rng(0); os.makedirs("models/calib", exist_ok=True)
for i in range(4): np.save(f"models/calib/s{i}.npy", rng.standard_normal((1, 3, 224, 224)).astype(np.float32))'
  ./build/examples/ondine quantize models/resnet50.onnx --calib models/calib -o models/resnet50.int8.onnx
fi
./build/examples/ondine inspect models/resnet50.int8.onnx --compiled | grep -E '^(int8|fp32 island|warning)'
./build/examples/ondine run models/resnet50.int8.onnx --dim batch=1 --threads "$(nproc)" --runs 20 --check
