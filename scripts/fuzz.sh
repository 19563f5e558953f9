#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS] [TARGET...] - builds the fuzz targets (fuzz/*.cpp) with clang's libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer, and runs each for SECONDS (default 60), one after
# the other. The committed seeds (fuzz/corpus/<target>/) are read, never written: what a run finds
# goes to $FUZZ_WORK/corpus/<target>/ (default build-fuzz/), crashes to $FUZZ_WORK/crashes/<target>/.
# A crash is fixed and its input copied to fuzz/regressions/<target>/, which CTest replays (fuzz/CMakeLists.txt).
# Needs clang (Debian: clang-14, libclang-rt-14-dev). FUZZ_JOBS: parallel jobs per target (default 1).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(onnx_loader npy artifact)
work=${FUZZ_WORK:-$root/build-fuzz}
cxx=${FUZZ_CXX:-$(command -v clang++-14 || command -v clang++)}
mkdir -p "$work"

flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -DONDINE_LIBFUZZER -DONNX_ML=1 -DONNX_NAMESPACE=onnx
       -I"$root/include" -I"$root/fuzz")
declare -A libs=([onnx_loader]="-lonnx_proto -lprotobuf" [npy]="" [artifact]="")
declare -A max_len=([onnx_loader]=65536 [npy]=8192 [artifact]=65536)

for t in "${targets[@]}"; do
  bin=$work/fuzz_$t
  if [ ! -x "$bin" ] || [ -n "$(find "$root/include" "$root/fuzz" -newer "$bin" -name '*.?pp' -print -quit)" ]; then
    echo "== building $t"
    # shellcheck disable=SC2086
    "$cxx" "${flags[@]}" "$root/fuzz/$t.cpp" -o "$bin" ${libs[$t]}
  fi
done

status=0
for t in "${targets[@]}"; do
  mkdir -p "$work/corpus/$t" "$work/crashes/$t"
  dict=()
  [ -f "$root/fuzz/$t.dict" ] && dict=(-dict="$root/fuzz/$t.dict")
  [ "$t" = onnx_loader ] && dict=(-dict="$root/fuzz/onnx.dict")
  jobs=()
  [ "${FUZZ_JOBS:-1}" -gt 1 ] && jobs=(-jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS")
  echo "== fuzzing $t for ${seconds}s"
  start=$(date +%s)
  set +e
  "$work/fuzz_$t" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 \
    -max_len="${max_len[$t]}" -print_final_stats=1 -artifact_prefix="$work/crashes/$t/" "${jobs[@]}" "${dict[@]}" \
    "$work/corpus/$t" "$root/fuzz/corpus/$t" >"$work/$t.log" 2>&1
  rc=$?
  set -e
  grep -E '^#[0-9]+.*DONE|==ERROR|SUMMARY|stat::number_of_executed_units|Test unit written' "$work/$t.log" || true
  echo "== $t: exit $rc after $(( $(date +%s) - start ))s; log $work/$t.log; crashes in $work/crashes/$t/"
  [ "$rc" -ne 0 ] && status=1
done
exit $status
