#!/usr/bin/env bash
# Installs the built package into a scratch prefix and builds + runs the examples a user would write
# against it with find_package(ondine CONFIG REQUIRED): examples/host (the IR, ONNX, the reference
# executor), examples/model (ondine/model.hpp and the prebuilt ondine::compiled: a PyTorch export compiled and
# checked against PyTorch's output), examples/generate (a greedy decode of the Llama-style export, its tokens
# PyTorch's), examples/custom_pass (a user pass in a pipeline with the built-ins) and examples/runtime
# (ondine::runtime: artifacts without ONNX or protobuf; built here, run by runtime_test.sh) and examples/aot
# (ondine_add_model: a model compiled into the build, from its file and embedded, through typed headers). Both are
# configured as one project, so the package is found and the compiler probed once.
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
mkdir -p "$work/examples"
cat >"$work/examples/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.18)
project(ondine_package_examples LANGUAGES CXX ASM)
add_subdirectory("$src/examples/host" host)
add_subdirectory("$src/examples/model" model)
add_subdirectory("$src/examples/generate" generate)
add_subdirectory("$src/examples/custom_pass" custom_pass)
add_subdirectory("$src/examples/runtime" runtime)
add_subdirectory("$src/examples/aot" aot)
CMAKE
# -O1: these programs check that the package works, not how fast (at -O3 their four builds were 13 of a
# 30-minute CI run on a 2-core Zen 3).
cmake -S "$work/examples" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" >/dev/null
# find_package(ondine COMPONENTS runtime) never looks for ONNX or protobuf: configuring the runtime host
# with both made unfindable succeeds.
cmake -S "$src/examples/runtime" -B "$work/runtime_only" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_DISABLE_FIND_PACKAGE_ONNX=ON -DCMAKE_DISABLE_FIND_PACKAGE_Protobuf=ON >/dev/null
cmake --build "$work/build" -j2 >/dev/null
"$work/build/host/ondine_host"
"$work/build/custom_pass/ondine_custom_pass"
gpt=$src/tests/data/torch/gpt_decoder
"$work/build/model/ondine_model_host" "$gpt/model.onnx" input_ids="$gpt/case0.input_ids.npy" \
  --expect logits="$gpt/case0.out.logits.npy"
"$work/build/aot/ondine_aot"
llama=$src/tests/data/torch/llama_kv
"$work/build/generate/ondine_generate" "$llama/model.onnx" --prompt "$llama/decode.prompt.npy" --tokens 33 \
  --expect "$llama/decode.tokens.npy"
if ldd "$work/build/runtime/ondine_runtime_host" | grep -qE 'protobuf|onnx'; then
  echo "FAIL: ondine::runtime links protobuf or ONNX"
  exit 1
fi
