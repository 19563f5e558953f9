#!/usr/bin/env bash
# The `ondine` tool end to end: good runs, and every kind of bad input giving a clear error on stderr
# with a non-zero exit code (never a crash).
set -uo pipefail
ondine=$1 data=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0 passes=0

# expect EXIT_CODE PATTERN -- command...: runs it, checks the exit code and that stdout+stderr match PATTERN.
expect() {
  local code=$1 pattern=$2
  shift 3
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL: $* -> exit $rc (want $code), output:"
    echo "$out" | head -20
    echo "  (wanted /$pattern/)"
    fails=$((fails + 1))
  else
    passes=$((passes + 1))
  fi
}

relu=$data/node/test_relu/model.onnx
conv=$data/node/test_basic_conv_with_padding/model.onnx
lstm=$data/node/test_lstm_defaults/model.onnx

expect 0 'Relu +1' -- "$ondine" inspect "$relu"
expect 0 '"ops"' -- "$ondine" inspect "$relu" --json
expect 0 'unsupported ops \(1\)' -- "$ondine" inspect "$lstm"
expect 0 'y: float32\[3,4,5\]' -- "$ondine" run "$relu" --output-dir "$work/out"
expect 0 'benchmark: engine=reference' -- "$ondine" run "$relu" --runs 2 --reference
expect 0 'benchmark: engine=compiled isa=' -- "$ondine" run "$relu" --runs 2
expect 0 'check: y max_abs_err .* ok' -- "$ondine" run "$conv" --check --threads 1
expect 0 'compiled: isa .* steps' -- "$ondine" inspect "$conv" --compiled

# Bad files: each error names the file.
expect 1 "missing\.onnx.*cannot open" -- "$ondine" run "$work/missing.onnx"
: >"$work/empty.onnx"
expect 1 "empty\.onnx.*empty" -- "$ondine" inspect "$work/empty.onnx"
head -c 200 "$conv" >"$work/truncated.onnx"
expect 1 "truncated\.onnx" -- "$ondine" run "$work/truncated.onnx"
head -c 4096 /dev/urandom >"$work/garbage.onnx"
expect 1 "garbage\.onnx" -- "$ondine" inspect "$work/garbage.onnx"

# Unsupported op: named with its node before anything runs.
expect 1 "unsupported op.*LSTM" -- "$ondine" run "$lstm"

# Wrong input shape / name / dim binding.
expect 1 "input 'x' has shape \[3,4,5\], the model expects \[1,1,5,5\]" -- "$ondine" run "$conv" --input x="$work/out/y.npy"
expect 1 "no input of that name" -- "$ondine" run "$relu" --input nope="$work/out/y.npy"
expect 1 "NAME=SIZE" -- "$ondine" run "$relu" --dim batch
expect 1 "no input dim named 'batch'" -- "$ondine" run "$relu" --dim batch=2
expect 1 "not a .npy" -- "$ondine" run "$relu" --input x="$relu"

# ondine bench: a model with static shapes measures its own batch only; --json writes valid JSON.
expect 0 'batch +median ms.*samples/s' -- "$ondine" bench "$conv" --runs 3 --warmup 1 --threads 1 --json "$work/bench.json"
expect 0 '"samples_per_s"' -- /usr/bin/python3 -m json.tool "$work/bench.json"
expect 1 "--batch 8: the model has no symbolic dim, its batch is fixed at 1" -- "$ondine" bench "$conv" --batch 1,8
expect 1 "no symbolic dim of that name" -- "$ondine" bench "$relu" --dim batch

# Command-line mistakes exit with 2.
expect 2 "" -- "$ondine" frobnicate
expect 2 "" -- "$ondine" run

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
