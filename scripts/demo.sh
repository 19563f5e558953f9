#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: dependencies, build the `ondine` tool, write the bundled
# example model (ResNet-50 with seeded weights, no download), inspect it, compile it to oneDNN primitives for
# this CPU, run it (checked against the reference executor) and print a benchmark line.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target ondine_cli
[ -f models/resnet50.onnx ] || /usr/bin/python3 scripts/make_models.py --out models --which resnet50
./build/examples/ondine inspect models/resnet50.onnx
./build/examples/ondine run models/resnet50.onnx --dim batch=1 --threads "$(nproc)" --runs 20 --check
