#!/usr/bin/env bash
# The test suite under sanitizers, in build folders of its own (not part of .ci/run: it takes longer than
# CI's budget allows; docs/reliability.md gives its duration and result).
#   scripts/sanitize.sh [asan|tsan|all]   (default all)
# asan: AddressSanitizer + UndefinedBehaviorSanitizer (any UB report fails), the unit tests, the ONNX
#       conformance suite in both engines and the CLI tests; LeakSanitizer on.
# tsan: ThreadSanitizer on the thread tests (tests/test_threads.cpp).
# Not run under sanitizers: the Python module (its interpreter is not instrumented) and the packaging tests
# (they build other projects against an install).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
jobs=${SANITIZE_JOBS:-$(nproc)}  # SANITIZE_JOBS: build and test jobs (default: every core)
supp=$PWD/scripts/sanitize

configure() {  # dir, flags
  cmake -S . -B "$1" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DONDINE_PYTHON=OFF \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g -fno-omit-frame-pointer $2" \
    -DCMAKE_EXE_LINKER_FLAGS="$2" >/dev/null
}

if [[ $mode == asan || $mode == all ]]; then
  start=$(date +%s)
  configure build-asan "-fsanitize=address,undefined -fno-sanitize-recover=undefined"
  cmake --build build-asan -j"$jobs" --target ondine_tests ondine_conformance ondine_cli \
    fuzz_replay_onnx_loader fuzz_replay_npy fuzz_replay_artifact
  # oneDNN's JIT kernels are not instrumented (they are generated at run time): ASan sees their effects on
  # memory only through the C++ code around them. detect_leaks: the suite must not leak.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:check_initialization_order=1 \
  LSAN_OPTIONS=suppressions=$supp/lsan.supp:print_suppressions=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan -j"$jobs" --output-on-failure \
      -E 'python_module|find_package|runtime_host|example_models|package'
  echo "asan+ubsan: passed in $(( $(date +%s) - start )) s"
fi

if [[ $mode == tsan || $mode == all ]]; then
  start=$(date +%s)
  # The thread tests alone (one translation unit): TSan slows the whole suite 5-15x for nothing it checks.
  mkdir -p build-tsan/tmp
  g++ -std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=thread -fopenmp -DONNX_ML=1 -DONNX_NAMESPACE=onnx \
    -DONDINE_TEST_DATA_DIR="\"$PWD/tests/data\"" -DONDINE_TEST_TMP_DIR="\"$PWD/build-tsan/tmp\"" -Iinclude -Itests \
    tests/test_threads.cpp -o build-tsan/test_threads /usr/lib/libCatch2WithMain.a -lonnx_proto -lprotobuf -ldnnl -lxxhash
  # libgomp (OpenMP, under oneDNN) is not built with TSan: its barriers and thread pool look like races.
  # The suppressions name only libgomp's frames (scripts/sanitize/tsan.supp says why).
  TSAN_OPTIONS="suppressions=$supp/tsan.supp halt_on_error=1 second_deadlock_stack=1" build-tsan/test_threads
  echo "tsan: passed in $(( $(date +%s) - start )) s"
fi
