#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: dependencies, build, unit tests, the ONNX
# conformance suite and a host project built against the installed package (all through CTest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
