#!/usr/bin/env bash
# The `ondine` tool end to end: good runs, and every kind of bad input giving a clear error on stderr
# with a non-zero exit code (never a crash).
set -uo pipefail
ondine=$1 data=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The int8 estimates below were written against one core's reference rates; pinned, they do not follow this
# machine's measured ones (nor the load of tests running beside this one).
export ONDINE_PEAK_RATES=fp32=186,int8=850
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
# Whether oneDNN's ISA here has VNNI (int8 expectations differ without it; DNNL_MAX_CPU_ISA counts).
isa=$("$ondine" run "$relu" --runs 1 2>&1 | grep -oE 'isa=[a-z0-9_]+' | head -1)
isa=${isa#isa=}
case $isa in
  *vnni* | *bf16* | *amx*) vnni=1 ;;
  *) vnni=0 ;;
esac
conv=$data/node/test_basic_conv_with_padding/model.onnx
det=$data/node/test_adagrad/model.onnx  # ai.onnx.preview.training.Adagrad: a training op, outside inference

expect 0 'Relu +1' -- "$ondine" inspect "$relu"
expect 0 'slow paths: none' -- "$ondine" inspect "$relu" --compiled
expect 0 '"ops"' -- "$ondine" inspect "$relu" --json
expect 0 'unsupported ops \(1\)' -- "$ondine" inspect "$det"
expect 0 'y: float32\[3,4,5\]' -- "$ondine" run "$relu" --output-dir "$work/out"
expect 0 'benchmark: engine=reference' -- "$ondine" run "$relu" --runs 2 --reference
expect 0 'benchmark: engine=compiled isa=' -- "$ondine" run "$relu" --runs 2
expect 0 'check: y max_abs_err .* ok' -- "$ondine" run "$conv" --check --threads 1
expect 0 'check: tolerance 1e-4 of max \|reference\| \(float model' -- "$ondine" run "$conv" --check --threads 1
expect 0 'check: tolerance 1\.00e-03 of max \|reference\| \(--tolerance\)' -- "$ondine" run "$conv" --check --tolerance 1e-3
expect 2 '--tolerance' -- "$ondine" run "$conv" --check --tolerance -1
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
expect 1 "unsupported op.*Adagrad" -- "$ondine" run "$det"

# Wrong input shape / name / dim binding.
expect 1 "input 'x' has shape \[3,4,5\], the model expects \[1,1,5,5\]" -- "$ondine" run "$conv" --input x="$work/out/y.npy"
expect 1 "no input of that name" -- "$ondine" run "$relu" --input nope="$work/out/y.npy"
expect 1 "NAME=SIZE" -- "$ondine" run "$relu" --dim batch
expect 1 "no input dim named 'batch'" -- "$ondine" run "$relu" --dim batch=2
expect 1 "not a .npy" -- "$ondine" run "$relu" --input x="$relu"

# ondine bench: a model with static shapes measures its own batch only; --json writes valid JSON.
expect 0 'batch +median ms.*samples/s' -- "$ondine" bench "$conv" --runs 3 --warmup 1 --threads 1 --json "$work/bench.json"
expect 0 '"samples_per_s"' -- /usr/bin/python3 -m json.tool "$work/bench.json"
expect 0 'batch 1 profile: .* per run' -- "$ondine" bench "$conv" --runs 3 --warmup 1 --threads 1 --profile
expect 0 'slowest nodes:' -- "$ondine" bench "$conv" --runs 3 --warmup 1 --threads 1 --profile
expect 0 'profile: .* per run \(mean of 2 runs\)' -- "$ondine" run "$conv" --runs 2 --threads 1 --profile
expect 1 "--batch 8: the model has no symbolic dim, its batch is fixed at 1" -- "$ondine" bench "$conv" --batch 1,8
expect 1 "no symbolic dim of that name" -- "$ondine" bench "$relu" --dim batch
# bench --streams: N streams with their share of the threads; throughput, latency percentiles, --json; --hint.
expect 0 'streams: 2 x 1 thread .*20 requests' -- "$ondine" bench "$conv" --streams 2 --threads 2 --requests 20 --warmup 1
expect 0 'latency: +p50 [0-9.]+ ms, p90 [0-9.]+ ms, p99 [0-9.]+ ms' -- "$ondine" bench "$conv" --streams 2 --threads 2 --requests 8
expect 0 '"threads_per_stream": 1' -- "$ondine" bench "$conv" --hint throughput --threads 2 --requests 8 --json /dev/stdout
expect 0 'streams: 1 x 2 threads .*hint latency' -- "$ondine" bench "$conv" --hint latency --threads 2 --requests 4
expect 2 '--requests applies to --streams or --hint' -- "$ondine" bench "$conv" --requests 4
expect 2 'not combined with --reference' -- "$ondine" bench "$conv" --streams 2 --reference

# ondine compile: the pass pipeline, its summary, dumps, export and the check against the imported model.
# A Conv -> Relu -> Add(., x) model, so the default pipeline creates Ondine's own fused ops.
/usr/bin/python3 - "$work/convrelu.onnx" <<'PY'
import sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper, save
rng = np.random.default_rng(0)
w = numpy_helper.from_array(rng.uniform(-0.5, 0.5, (4, 4, 3, 3)).astype(np.float32), "w")
b = numpy_helper.from_array(rng.uniform(-0.5, 0.5, (4,)).astype(np.float32), "b")
nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Relu", ["c"], ["r"], name="relu"),
         helper.make_node("Add", ["r", "x"], ["y"], name="add")]
io = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 4, 8, 8])
graph = helper.make_graph(nodes, "convrelu", [io("x")], [io("y")], [w, b])
save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), sys.argv[1])
PY
cr=$work/convrelu.onnx
expect 0 'pipeline: widen-float16,qoperator-to-qdq,remove-identity,.*fuse' -- "$ondine" compile "$cr" --print-passes
expect 0 'fuse +[0-9.]+ +[0-9]+ -> [0-9]+ +[1-9]' -- "$ondine" compile "$cr" --print-passes
expect 0 'ondine\.FusedConv +0 +1' -- "$ondine" compile "$cr" --print-passes
expect 0 'Relu +1 +0' -- "$ondine" compile "$cr" --print-passes
expect 0 'passes:  none: 0 pass runs, 3 -> 3 nodes' -- "$ondine" compile "$cr" --passes none
expect 0 'check: y max_abs_err .* ok' -- "$ondine" compile "$cr" --check --seed 3
expect 0 'check: y max_abs_err .* ok' -- "$ondine" compile "$conv" --check --passes 'fold-constants*,dce'
expect 0 "graph after pass 'fuse'" -- "$ondine" compile "$cr" --dump-after fuse
expect 0 "%r = ondine\.FusedConv\(%x, %w, %b\)" -- "$ondine" compile "$cr" --dump-after fuse
expect 0 'digraph' -- "$ondine" compile "$cr" --dump-before fuse --dot
# --stop-after bisects: after one pass run (qoperator-to-qdq) nothing is fused yet.
expect 0 'passes:  default: 1 pass runs, 3 -> 3 nodes' -- "$ondine" compile "$cr" --stop-after 1
expect 0 'layout +[0-9.]+ +[0-9]+ -> [0-9]+' -- "$ondine" compile "$cr" --print-passes --pass-option layout=plain
expect 2 '--pass-option layout: expected KEY=VALUE' -- "$ondine" compile "$cr" --pass-option layout
# -o: the optimised model (with the "ondine" domain) loads back, runs compiled and on the reference.
expect 0 "wrote: .*opt\.onnx \([0-9]+ nodes\)" -- "$ondine" compile "$cr" -o "$work/opt.onnx"
expect 0 'ondine\.FusedConv +1' -- "$ondine" inspect "$work/opt.onnx"
expect 0 'check: y max_abs_err .* ok' -- "$ondine" run "$work/opt.onnx" --check --dim batch=2 --passes none
expect 0 'check: y max_abs_err .* ok' -- "$ondine" run "$work/opt.onnx" --check
# The pipeline on the other commands.
expect 0 'passes: +widen-float16,qoperator-to-qdq.*\(3 -> [0-9]+ nodes\)' -- "$ondine" inspect "$cr" --passes default
expect 0 'ondine\.FusedConv +1' -- "$ondine" inspect "$cr" --passes default
expect 0 'Conv +1' -- "$ondine" inspect "$cr"
expect 0 'benchmark: .*passes=none' -- "$ondine" run "$cr" --passes none
expect 0 'benchmark: .*passes=default' -- "$ondine" run "$cr"
expect 0 'engine: +compiled.*passes none' -- "$ondine" bench "$cr" --passes none --runs 2 --warmup 0
# Bad pipelines are command-line mistakes: exit 2, naming the pass and the known ones.
expect 2 "unknown pass 'frobnicate' \(known passes: .*fold-bn" -- "$ondine" compile "$cr" --passes dce,frobnicate
expect 2 "empty entry" -- "$ondine" run "$cr" --passes 'dce,,fuse'
expect 2 "--dump-after layout: the pipeline has no pass of that name" -- "$ondine" compile "$cr" --passes dce --dump-after layout
expect 2 "unknown pass" -- "$ondine" bench "$cr" --passes nope

# compare: two models on the same inputs, per output and per layer (tests/data/mnist, real digits).
mn=$(dirname "$0")/data/mnist
mm=$mn/mnist_cnn.onnx
imgs=$mn/test_images.npy
expect 0 'logits +0\.000e\+00 +1\.000000 +inf +\[1000,10\] +argmax agree 100\.00%' -- "$ondine" compare "$mm" "$mm" --input "$imgs"
expect 0 'inputs: input\[1,1,28,28\] random \(seed 4\)' -- "$ondine" compare "$mm" "$mm" --seed 4
expect 0 'engine: compiled' -- "$ondine" compare "$mm" "$mm" --input "input=$imgs" --compiled --passes none
expect 0 '"sqnr_db": "inf"' -- "$ondine" compare "$mm" "$mm" --input "$imgs" --json
"$ondine" compile "$mm" --passes fold-bn -o "$work/mnist_folded.onnx" >/dev/null
expect 0 'logits .* 1\.000000 +1[0-9][0-9]\.[0-9]+ ' -- "$ondine" compare "$mm" "$work/mnist_folded.onnx" --input "$imgs"
expect 0 'per-layer, worst SQNR first \([0-9]+ values in both' -- "$ondine" compare "$mm" "$work/mnist_folded.onnx" --per-layer
# A QDQ copy of a Conv -> Relu model: the quantized conv output (its DequantizeLinear) is matched to A's
# "c" and ranked first; SQNR of 8-bit rounding is far below the float rows.
/usr/bin/python3 - "$work/cr_a.onnx" "$work/cr_b.onnx" <<'PY'
import sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper, save
rng = np.random.default_rng(0)
w = numpy_helper.from_array(rng.uniform(-0.5, 0.5, (4, 4, 3, 3)).astype(np.float32), "w")
qp = [numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(np.array(128, np.uint8), "z")]
io = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 4, 8, 8])
conv = helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv")
a = helper.make_graph([conv, helper.make_node("Relu", ["c"], ["y"], name="relu")], "a", [io("x")], [io("y")], [w])
b = helper.make_graph([conv, helper.make_node("QuantizeLinear", ["c", "s", "z"], ["c_q"], name="q"),
                       helper.make_node("DequantizeLinear", ["c_q", "s", "z"], ["c_dq"], name="dq"),
                       helper.make_node("Relu", ["c_dq"], ["y"], name="relu")], "b", [io("x")], [io("y")], [w] + qp)
for g, f in ((a, sys.argv[1]), (b, sys.argv[2])):
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), f)
PY
expect 0 '1 +c +[0-9.e+-]+ +0\.99[0-9]+ +[0-9.]+ +\[1,4,8,8\] +\(B: c_dq\)' -- "$ondine" compare "$work/cr_a.onnx" "$work/cr_b.onnx" --per-layer
expect 0 '"b_name": "c_dq"' -- "$ondine" compare "$work/cr_a.onnx" "$work/cr_b.onnx" --per-layer --json --dim batch=2
expect 1 "model B does not take model A's inputs" -- "$ondine" compare "$mm" "$work/cr_b.onnx"
expect 1 'no input .nope.' -- "$ondine" compare "$mm" "$mm" --input nope=x.npy
expect 1 'cannot open' -- "$ondine" compare "$mm" "$work/missing.onnx"
expect 1 '--dim expects NAME=SIZE with a size >= 0' -- "$ondine" compare "$mm" "$mm" --dim batch=-1
expect 1 'batch.*must be bound to a size >= 0' -- "$ondine" run "$mm" --dim batch=-1
expect 2 'excludes' -- "$ondine" compare "$mm" "$mm" --compiled --per-layer
if "$ondine" quantize --help >/dev/null 2>&1; then  # with `ondine quantize`: the real QDQ model
  "$ondine" quantize "$mm" --calib "$mn/calib" -o "$work/mnist_qdq.onnx" >/dev/null
  expect 0 'logits .* argmax agree (99\.[0-9]+|100\.00)%' -- "$ondine" compare "$mm" "$work/mnist_qdq.onnx" --input "$imgs"
  expect 0 '^  1 .*\(B: [a-z0-9]+_dequantized\)' -- "$ondine" compare "$mm" "$work/mnist_qdq.onnx" --per-layer --top 3 --input "$imgs"
  # Compiled int8 against the reference's QDQ semantics: --check's int8 bound; every layer int8.
  expect 0 'check: tolerance 10% of max \|reference\| \(int8 model, [0-9]+ quantized nodes' -- "$ondine" run "$work/mnist_qdq.onnx" --check --input "input=$imgs"
  expect 0 'check: logits max_abs_err .* ok' -- "$ondine" run "$work/mnist_qdq.onnx" --check --input "input=$imgs"
  # --precision int8: a quantized model's int8 layers (said so); a float model is refused, naming ondine quantize.
  expect 0 'precision: int8 in [0-9]+ steps? \(the model.s [0-9]+ quantized nodes\), fp32 elsewhere' -- "$ondine" run "$work/mnist_qdq.onnx" --precision int8
  if [ "$vnni" = 0 ]; then  # without VNNI: --precision int8 requantizes 8-bit weights to 7 bits (said); by default they run fp32
    expect 0 'precision: int8 in 5 steps .*8-bit weights requantized to 7 bits for avx2' -- "$ondine" run "$work/mnist_qdq.onnx" --precision int8
    expect 0 'check: logits max_abs_err .* ok' -- "$ondine" run "$work/mnist_qdq.onnx" --precision int8 --check --input "input=$imgs"
    # where int8 pays (rates pinned), 8-bit weights are requantized and every layer runs int8
    expect 0 'int8: 5 int8 steps' -- env ONDINE_PEAK_RATES=fp32=186,int8=850 "$ondine" inspect "$work/mnist_qdq.onnx" --compiled
  fi
  expect 0 '"precision": "int8"' -- "$ondine" bench "$work/mnist_qdq.onnx" --precision int8 --runs 2 --warmup 1 --json /dev/stdout
  expect 1 'precision int8: the model has no quantized layers .*--calib DIR.*ondine quantize' -- "$ondine" run "$mm" --precision int8
  # ... unless --calib DIR quantizes it first (as ondine quantize): calibrated, int8, checked against the QDQ reference.
  expect 0 'calibration: [0-9]+ sample\(s\) from' -- "$ondine" run "$mm" --precision int8 --calib "$mn/calib"
  # ... with weights this CPU multiplies exactly (7-bit without VNNI), so every quantized layer runs int8
  out=$("$ondine" run "$mm" --precision int8 --calib "$mn/calib" 2>&1)
  if ! grep -qE 'precision: int8 in [1-9][0-9]* steps? \(the model.s [0-9]+ quantized nodes\), fp32 elsewhere$' <<<"$out" ||
    { [ "$vnni" = 0 ] && ! grep -q 'int8: *7-bit weights for avx2' <<<"$out"; }; then
    echo "FAIL: run --precision int8 --calib: not int8 in every quantized layer:"; echo "$out" | tail -5; fails=$((fails + 1))
  else
    passes=$((passes + 1))
  fi
  expect 0 'check: logits max_abs_err .* ok' -- "$ondine" run "$mm" --precision int8 --calib "$mn/calib" --check --input "input=$imgs"
  expect 0 'max error: +[0-9.e-]+ <= 0\.5' -- "$ondine" run "$mm" --precision int8 --calib "$mn/calib" --max-error 0.5
  expect 0 '"precision": "int8"' -- "$ondine" bench "$mm" --precision int8 --calib "$mn/calib" --runs 2 --warmup 1 --json /dev/stdout
  expect 0 'wrote: .*mnist_int8\.ondine \(artifact' -- "$ondine" compile "$mm" -o "$work/mnist_int8.ondine" --precision int8 --calib "$mn/calib"
  expect 0 'compiled from .*mnist_cnn\.onnx' -- "$ondine" run "$work/mnist_int8.ondine"
  # Two targets: calibrated once, each variant compiled from that copy in a process of its own, the copy removed.
  expect 0 'wrote: .*mnist_int8v\.ondine \(artifact, 2 variants: avx2 avx512_core' -- "$ondine" compile "$mm" -o "$work/mnist_int8v.ondine" --precision int8 --calib "$mn/calib" --target avx2,avx512_core
  expect 0 'compiled from .*mnist_cnn\.onnx' -- "$ondine" run "$work/mnist_int8v.ondine"
  [ -e "$work/mnist_int8v.ondine.int8.onnx" ] && { echo "FAIL: compile left its quantized copy"; fails=$((fails + 1)); }
  expect 0 'quantized already: --calib .* not used' -- "$ondine" run "$work/mnist_qdq.onnx" --precision int8 --calib "$mn/calib"
  expect 2 'calib quantizes an ONNX model; .* is compiled already' -- "$ondine" run "$work/mnist_int8.ondine" --precision int8 --calib "$mn/calib"
  expect 2 'calib quantizes a float model for --precision int8' -- "$ondine" run "$mm" --calib "$mn/calib"
  expect 2 'max-error with --precision int8 .* give --calib' -- "$ondine" bench "$mm" --precision int8 --max-error 0.1
  expect 2 'keep-fp32 names bf16.s fp32 nodes' -- "$ondine" run "$mm" --precision int8 --calib "$mn/calib" --keep-fp32 x
  if [ "$vnni" = 1 ]; then
    expect 0 'no fp32 island; the model in fp32 .*x faster' -- "$ondine" inspect "$work/mnist_qdq.onnx" --compiled
  else  # without VNNI, layers with 8-bit weights stay float (passes/fuse_qdq.hpp) and show as islands
    expect 0 "fp32 island 2: 1 float step \(FusedConv 'conv2'\)" -- "$ondine" inspect "$work/mnist_qdq.onnx" --compiled --exact-int8-weights
    # where int8 gains nothing (Zen 2: rates pinned), those layers run float by default, as with the flag
    expect 0 "fp32 island 2: 1 float step \(FusedConv 'conv2'\)" -- env ONDINE_PEAK_RATES=fp32=37,int8=38 "$ondine" inspect "$work/mnist_qdq.onnx" --compiled
  fi
fi
# Dynamic quantization (the MNIST Gemm): written as ONNX, compiled to DynamicQuantizeLinear + DynQMatMul,
# right within --check's int8 bound, predictions as the float model's.
expect 0 'quantize-dynamic: 1 pass runs, .* 1 rewrites' -- "$ondine" compile "$mm" --passes quantize-dynamic -o "$work/mnist_dyn.onnx"
expect 0 'check: logits max_abs_err .* ok' -- "$ondine" run "$work/mnist_dyn.onnx" --check --input "input=$imgs"
expect 0 'DynQMatMul' -- "$ondine" inspect "$work/mnist_dyn.onnx" --compiled
expect 0 'logits .* argmax agree (99\.[0-9]+|100\.00)%' -- "$ondine" compare "$mm" "$work/mnist_dyn.onnx" --input "$imgs" --compiled
# The float model fails a bound below float rounding, naming the file and the bound.
expect 1 'mnist_cnn\.onnx: compiled outputs differ .* by more than 1\.00e-12 of max' -- "$ondine" run "$mm" --check --tolerance 1e-12

# ondine quantize: calibrate on a folder of .npy samples, write a QDQ model (Conv and the residual Add
# quantized), and every bad calibration input named with its file.
/usr/bin/python3 - "$work" <<'PY'
import os, sys
import numpy as np
rng = np.random.default_rng(1)
def save(name, a):
    os.makedirs(os.path.dirname(name), exist_ok=True)
    np.save(name, a)
for i in range(4):
    save(f"{sys.argv[1]}/calib/s{i}.npy", rng.standard_normal((1, 4, 8, 8)).astype(np.float32))
save(f"{sys.argv[1]}/calib_shape/bad_shape.npy", np.zeros((1, 3, 8, 8), np.float32))
save(f"{sys.argv[1]}/calib_dtype/f64.npy", np.zeros((1, 4, 8, 8), np.float64))
nan = np.zeros((1, 4, 8, 8), np.float32); nan[0, 1, 2, 3] = np.nan
save(f"{sys.argv[1]}/calib_nan/has_nan.npy", nan)
os.makedirs(f"{sys.argv[1]}/calib_empty")
PY
q=$work/q.onnx
expect 0 'quantized 2 of 2 quantizable nodes \(Add 1, Conv 1\)' -- "$ondine" quantize "$cr" --calib "$work/calib" -o "$q"
expect 0 'calibration: 4 sample\(s\) from' -- "$ondine" quantize "$cr" --calib "$work/calib" -o "$q"
expect 0 'wrote: .*q\.onnx' -- "$ondine" quantize "$cr" --calib "$work/calib" -o "$q"
# --check on the QDQ model: the int8 default bound, compiled (run) and through the passes (compile).
expect 0 'check: tolerance 10% of max \|reference\| \(int8 model, 6 quantized nodes' -- "$ondine" run "$q" --check
expect 0 'check: y max_abs_err .* ok' -- "$ondine" run "$q" --check --dim batch=2
expect 0 'check: y max_abs_err .* ok' -- "$ondine" compile "$q" --check
expect 0 'check: tolerance 1\.00e-01 of max \|reference\| \(--tolerance\)' -- "$ondine" run "$q" --check --tolerance 0.1
# The Add stays float (its skip input is the float x): one fp32 island, predicted slower than fp32.
if [ "$vnni" = 1 ]; then
  expect 0 "fp32 island 1: 1 float step \(Add 'add'\), 3 Q/DQ \(Q 'x_QuantizeLinear', DQ 'x_DequantizeLinear', DQ 'r_DequantizeLinear'\): [0-9.]+ KFLOP, [0-9.]+ KB, est\. " -- "$ondine" inspect "$q" --compiled
else  # the Conv stays float too without VNNI
  expect 0 "fp32 island 1: .*float step.*: [0-9.]+ KFLOP, [0-9.]+ KB, est\. " -- "$ondine" inspect "$q" --compiled
fi
expect 0 'int8 estimate \(one core, roofline: int8 [0-9]+ GOP/s, fp32 [0-9]+ GFLOP/s' -- "$ondine" inspect "$q" --compiled
expect 0 'int8 estimate \(one core, roofline: int8 850 GOP/s, fp32 186 GFLOP/s \(ONDINE_PEAK_RATES\)' -- "$ondine" inspect "$q" --compiled
expect 0 "warning: ONDINE_PEAK_RATES='fast' is not" -- env ONDINE_PEAK_RATES=fast "$ondine" inspect "$q" --compiled
expect 0 'warning: int8 plan predicted slower than fp32: .* against .*; 1 fp32 island cost' -- "$ondine" inspect "$q" --compiled
# An output made by DequantizeLinear: the int8 bound also allows 2 steps of its scale (a coarse 0.3 here,
# so 2 steps are more than 10% of the Sigmoid's max).
/usr/bin/python3 - "$work/sig_qdq.onnx" <<'PY'
import sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper, save
qp = [numpy_helper.from_array(np.array(v, t), n) for v, t, n in ((0.05, np.float32, "s"), (128, np.uint8, "z"),
                                                                (0.3, np.float32, "s2"), (0, np.uint8, "z2"))]
nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
         helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq"),
         helper.make_node("Sigmoid", ["xd"], ["g"], name="sigmoid"),
         helper.make_node("QuantizeLinear", ["g", "s2", "z2"], ["gq"], name="q2"),
         helper.make_node("DequantizeLinear", ["gq", "s2", "z2"], ["y"], name="dq2")]
io = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4, 8, 8])
save(helper.make_model(helper.make_graph(nodes, "sig", [io("x")], [io("y")], qp),
                       opset_imports=[helper.make_opsetid("", 13)]), sys.argv[1])
PY
expect 0 'check: tolerance 10% of max \|reference\| or 2 output quantization steps \(int8 model, 4 quantized' -- "$ondine" run "$work/sig_qdq.onnx" --check
expect 0 'check: y max_abs_err .* \(bound: 2 output steps, 6\.00e-01\) ok' -- "$ondine" run "$work/sig_qdq.onnx" --check
# No int8 layer: both Q/DQ pairs run float as ondine.FakeQuant (passes/fake_quant.hpp), no Q/DQ step left.
expect 0 "FakeQuant 'dq2': " -- "$ondine" inspect "$work/sig_qdq.onnx" --compiled
expect 0 'QuantizeLinear +2' -- "$ondine" inspect "$q"
expect 0 'DequantizeLinear +4' -- "$ondine" inspect "$q"
expect 0 'y: float32\[1,4,8,8\]' -- "$ondine" run "$q" --reference --dim batch=1
expect 0 'calibration: 2 sample' -- "$ondine" quantize "$cr" --calib "$work/calib" -o "$q" --max-samples 2 --method entropy
# --reduce-range: 7-bit weights, which CPUs without VNNI run in int8 (checked there with the ISA capped)
expect 0 'weights s8 per channel, 7-bit' -- "$ondine" quantize "$cr" --calib "$work/calib" -o "$work/q7.onnx" --reduce-range
DNNL_MAX_CPU_ISA=AVX2 expect 0 'int8: 1 int8 steps' -- "$ondine" inspect "$work/q7.onnx" --compiled
DNNL_MAX_CPU_ISA=AVX2 expect 0 'check: .* ok' -- "$ondine" run "$work/q7.onnx" --check
expect 0 'add \(Add\): in the exclude list' -- "$ondine" quantize "$cr" --calib "$work/calib" -o "$q" --exclude Add
expect 0 'quantized 0 of 2.*' -- "$ondine" quantize "$cr" --calib "$work/calib" -o "$q" --exclude conv,add
expect 0 'conv \(Conv\): first weight layer' -- "$ondine" quantize "$cr" --calib "$work/calib" -o "$q" --keep-fp32-ends
expect 0 'quantized 1 of 2' -- "$ondine" quantize "$cr" --calib "$work/calib" -o "$q" --include Conv --activations s8
expect 0 'calibration written to' -- "$ondine" quantize "$cr" --calib "$work/calib" -o "$q" --save-calibration "$work/cal.txt"
expect 0 '^ondine-calibration 1' -- head -1 "$work/cal.txt"
expect 1 "needs a calibration.*quantize\.calibration" -- "$ondine" compile "$cr" --passes quantize
expect 2 "--calib is required" -- "$ondine" quantize "$cr" -o "$q"
expect 2 "method" -- "$ondine" quantize "$cr" --calib "$work/calib" -o "$q" --method frobnicate
expect 2 "u8 or s8" -- "$ondine" quantize "$cr" --calib "$work/calib" -o "$q" --activations u4
expect 2 "pass 'fuse' does not belong before calibration" -- "$ondine" quantize "$cr" --calib "$work/calib" -o "$q" --passes default
expect 1 "calib_empty.*no \.npy files" -- "$ondine" quantize "$cr" --calib "$work/calib_empty" -o "$q"
expect 1 "not a directory" -- "$ondine" quantize "$cr" --calib "$work/nope" -o "$q"
expect 1 "bad_shape\.npy.*has shape \[1,3,8,8\]" -- "$ondine" quantize "$cr" --calib "$work/calib_shape" -o "$q"
expect 1 "f64\.npy.*dtype float64" -- "$ondine" quantize "$cr" --calib "$work/calib_dtype" -o "$q"
expect 1 "has_nan\.npy.*NaN" -- "$ondine" quantize "$cr" --calib "$work/calib_nan" -o "$q"
# --max-error: layers kept fp32, worst first, until max |int8 - fp32| / max |fp32| on the first calibration
# samples is within the bound (MNIST int8 everywhere: 0.0067; both convs fp32: 0.0049).
mq=$work/mnist_fb.onnx
expect 0 'fallback 2: keeping .conv[12]. \(Conv\) fp32: error' -- "$ondine" quantize "$mm" --calib "$mn/calib" -o "$mq" --max-error 0.006
expect 0 'max error: +0\.00[0-5][0-9]* <= 0\.006 \(.*8 calibration sample\(s\); int8 everywhere: 0\.00[6-9]' -- "$ondine" quantize "$mm" --calib "$mn/calib" -o "$mq" --max-error 0.006
expect 0 'conv1 \(Conv\): kept fp32 for the error bound \(fallback [12]\)' -- "$ondine" quantize "$mm" --calib "$mn/calib" -o "$mq" --max-error 0.006
expect 0 'quantized 3 of 5 quantizable nodes \(Gemm 1, MaxPool 2\)' -- "$ondine" quantize "$mm" --calib "$mn/calib" -o "$mq" --max-error 0.006
expect 0 'logits .* argmax agree (99\.[0-9]+|100\.00)%' -- "$ondine" compare "$mm" "$mq" --input "$imgs"
expect 0 'fallback: +0 layer\(s\) kept fp32' -- "$ondine" quantize "$mm" --calib "$mn/calib" -o "$mq" --max-error 0.5 --max-error-samples 2
expect 0 '2 calibration sample\(s\)' -- "$ondine" quantize "$mm" --calib "$mn/calib" -o "$mq" --max-error 0.5 --max-error-samples 2
expect 1 "--max-error 0 not met: the error is still 0\.00[0-9]+ with 1 layer\(s\) kept fp32 .*Nothing written" -- "$ondine" quantize "$mm" --calib "$mn/calib" -o "$work/never.onnx" --max-error 0 --max-fallback 1
expect 0 '' -- test ! -e "$work/never.onnx"
expect 2 '--max-error must be a finite number >= 0, got -1' -- "$ondine" quantize "$mm" --calib "$mn/calib" -o "$mq" --max-error -1
expect 2 '--max-error-samples must be at least 1' -- "$ondine" quantize "$mm" --calib "$mn/calib" -o "$mq" --max-error 0.1 --max-error-samples 0
expect 2 '--max-fallback requires --max-error' -- "$ondine" quantize "$mm" --calib "$mn/calib" -o "$mq" --max-fallback 2
expect 2 'max-error' -- "$ondine" quantize "$mm" --calib "$mn/calib" -o "$mq" --max-error lots

# Models exported from PyTorch with dynamic axes (tests/data/torch): symbolic shapes in inspect, the dims it
# counted as 1 said, and run binding the dims from .npy inputs at two sequence lengths.
torch_dir=$(cd "$(dirname "$0")" && pwd)/data/torch
expect 0 'features +float32\[batch,\(frames - 1\)/2 \+ 1,64\]' -- "$ondine" inspect "$torch_dir/audio_encoder/model.onnx"
expect 0 'batch, frames not given with --dim: counted as 1' -- "$ondine" inspect "$torch_dir/audio_encoder/model.onnx"
expect 0 'shapes: +every shape follows from the input dims' -- "$ondine" inspect "$torch_dir/gpt_decoder/model.onnx"
for k in 0 1; do
  expect 0 'check: logits max_abs_err .* ok' -- "$ondine" run "$torch_dir/gpt_decoder/model.onnx" \
    --input input_ids="$torch_dir/gpt_decoder/case$k.input_ids.npy" --check --threads 1 --passes none
done

# bench through one shape cache: a stream of shapes (--dim NAME=LO:HI) on the shape-free plan, and a decode
# with a KV cache (--decode); a model without past/present pairs is refused naming what was looked for.
bert=$torch_dir/hf_bert/model.onnx kv=$torch_dir/gpt2_kv/model.onnx
expect 0 'plan: +shape-free: compiled once for any shape' -- "$ondine" bench "$bert" --dim seq=4:20 --runs 12 --threads 1
expect 0 'runs: +12 runs, [0-9]+ distinct shapes, [0-9.]+ s in all; p50 [0-9.]+ ms, p99 [0-9.]+ ms' -- \
  "$ondine" bench "$bert" --dim seq=4:20 --runs 12 --threads 1
expect 0 'new shape: first run [-+][0-9.]+ ms over steady .*; compilations 0' -- "$ondine" bench "$bert" --dim seq=4:20 --runs 12 --threads 1
expect 0 'new shape: .*; compilations [1-9]' -- "$ondine" bench "$bert" --dim seq=4:8 --runs 4 --warmup 1 --shape-plan per-shape
expect 0 '"new_shape_overhead_ms"' -- "$ondine" bench "$bert" --dim seq=4:20 --runs 6 --warmup 1 --json /dev/stdout
expect 0 'prompt: +[0-9.]+ ms \(6 tokens\)' -- "$ondine" bench "$kv" --decode 5 --dim seq=6 --threads 1
expect 0 'tokens: +p50 [0-9.]+ ms, p90 [0-9.]+ ms' -- "$ondine" bench "$kv" --decode 5 --dim seq=6 --threads 1
expect 0 'steps: +first .*\(past 6\), middle .*\(past 8\), last .*\(past 10\)' -- "$ondine" bench "$kv" --decode 5 --dim seq=6
expect 0 'next token: argmax of .logits.' -- "$ondine" bench "$kv" --decode 2 --dim seq=3 --batch 2 --runs 2 --warmup 0
expect 0 '"token_p90_ms"' -- "$ondine" bench "$kv" --decode 3 --dim seq=4 --json /dev/stdout
expect 0 'KV cache: .* in place \(capacity 9\)' -- "$ondine" bench "$kv" --decode 5 --dim seq=4 --threads 1
expect 0 'KV cache: .* fed back' -- "$ondine" bench "$kv" --decode 3 --dim seq=4 --kv-cache feed
expect 1 '--kv-cache in-place: the model compiles one plan per shape' -- \
  "$ondine" bench "$kv" --decode 2 --dim seq=4 --kv-cache in-place --shape-plan per-shape
expect 2 '--kv-cache applies to --decode' -- "$ondine" bench "$bert" --dim seq=4:8 --kv-cache feed
expect 1 'hf_bert/model\.onnx: --decode needs a model with a KV cache: inputs named past_\*' -- "$ondine" bench "$bert" --decode 3
expect 2 'NAME=LO:HI' -- "$ondine" bench "$bert" --dim seq=9:4
expect 2 '--batch is not combined with a --dim range' -- "$ondine" bench "$bert" --dim seq=4:8 --batch 2
expect 2 '--shape-plan applies to' -- "$ondine" bench "$bert" --dim seq=8 --shape-plan per-shape
expect 1 'no symbolic dim of that name' -- "$ondine" bench "$bert" --dim len=4:8

# Unnamed dims ('?', no dim_param: what some exporters write) bind from the input files like named ones.
/usr/bin/python3 - "$torch_dir/hf_bert/model.onnx" "$work/unnamed_dims.onnx" <<'PY'
import sys, onnx
m = onnx.load(sys.argv[1])
for v in list(m.graph.input) + list(m.graph.output):
    for d in v.type.tensor_type.shape.dim:
        d.ClearField("dim_param")
onnx.save(m, sys.argv[2])
PY
expect 0 'check: last_hidden_state max_abs_err .* ok' -- "$ondine" run "$work/unnamed_dims.onnx" --input input_ids="$torch_dir/hf_bert/case1.input_ids.npy" \
  --input attention_mask="$torch_dir/hf_bert/case1.attention_mask.npy" --check --threads 1

# inspect describes a model whose dims cannot all be 1 (a U-Net's pooling stack at 1x1 pixels): symbolic
# shapes, FLOPs once the dims are given.
expect 0 'FLOPs: +not counted: give --dim batch=N --dim height=N --dim width=N .*MaxPool' -- \
  "$ondine" inspect "$torch_dir/unet/model.onnx"
expect 0 'input: +image +float32\[batch,3,height,width\]' -- "$ondine" inspect "$torch_dir/unet/model.onnx"
expect 0 'FLOPs: +[0-9.]+ [KMG]FLOP at batch=1, height=64, width=64' -- \
  "$ondine" inspect "$torch_dir/unet/model.onnx" --dim height=64 --dim width=64

# Compiled artifacts (docs/artifacts.md): written by compile -o *.ondine, taken by run/bench/inspect with the
# passes off; the same outputs as the ONNX file; bad artifacts name the file.
gpt=$torch_dir/gpt_decoder
expect 0 'wrote: .*gpt\.ondine \(artifact' -- "$ondine" compile "$gpt/model.onnx" -o "$work/gpt.ondine"
expect 0 'compiled: artifact format [0-9]+, compiled from .*gpt_decoder/model\.onnx' -- "$ondine" inspect "$work/gpt.ondine"
expect 0 'packed: +[1-9][0-9]* weights packed by oneDNN for .* at batch=1, seq=1' -- "$ondine" inspect "$work/gpt.ondine"
expect 0 '"artifact"' -- "$ondine" inspect "$work/gpt.ondine" --json
expect 0 'check: logits max_abs_err .* ok' -- "$ondine" run "$work/gpt.ondine" --input input_ids="$gpt/case1.input_ids.npy" --check
expect 0 'passes=none .* load=' -- "$ondine" run "$work/gpt.ondine" --input input_ids="$gpt/case0.input_ids.npy" --output-dir "$work/art"
"$ondine" run "$gpt/model.onnx" --input input_ids="$gpt/case0.input_ids.npy" --output-dir "$work/onnx" >/dev/null 2>&1
if cmp -s "$work/art/logits.npy" "$work/onnx/logits.npy"; then passes=$((passes + 1)); else
  echo "FAIL: the artifact's logits differ from the ONNX file's"; fails=$((fails + 1)); fi
expect 0 'samples/s' -- "$ondine" bench "$work/gpt.ondine" --dim batch --dim seq=16 --runs 2 --warmup 1
expect 1 'passes ran when it was compiled' -- "$ondine" run "$work/gpt.ondine" --passes default
expect 0 'logits .* 1\.000000' -- "$ondine" compare "$gpt/model.onnx" "$work/gpt.ondine" --input "$gpt/case0.input_ids.npy" --compiled
# --tune: the tuner's choices (the thread split among them) stored with its kept plan's packings, applied by run.
expect 0 'threads = (all|1/2) ' -- env ONDINE_TUNE_CACHE="$work/tune.txt" "$ondine" compile "$gpt/model.onnx" -o "$work/tuned.ondine" --tune --target native --threads 2
expect 0 'packed weights: [1-9][0-9]* stored, [1-9][0-9]* used as stored, 0 packed at load' -- "$ondine" run "$work/tuned.ondine" --threads 2

# ISA variants: one artifact for several targets, each compiled in its own process; the best this CPU runs is
# chosen at load (DNNL_MAX_CPU_ISA caps what "this CPU" has). The avx2 variant under an AVX2 cap equals the
# ONNX path under that cap bit for bit; the variants agree within 1e-5 (relative to the largest output).
# (On an AVX2 CPU "native" is avx2: one variant.)
[ "$isa" = avx2 ] && want_variants='artifact: .*avx2' || want_variants='artifact, 2 variants: avx2'
expect 0 "wrote: .*v\\.ondine \\($want_variants" -- "$ondine" compile "$gpt/model.onnx" -o "$work/v.ondine" --target avx2,native
if [ "$isa" != avx2 ]; then
  expect 0 "variant: avx2 .*fp32, [1-9][0-9]* weights packed$" -- "$ondine" inspect "$work/v.ondine"
  expect 0 "variant: $isa .*runs here \($isa\)" -- "$ondine" inspect "$work/v.ondine"
fi
expect 0 'variant: avx2 .*runs here \(avx2\)' -- env DNNL_MAX_CPU_ISA=AVX2 "$ondine" inspect "$work/v.ondine"
# inspect and run name each weight the load packs again, and why (the avx2 variant's layouts on AVX-512).
if [ "$isa" != avx2 ]; then
  expect 0 'load: .*, 0 weights packed again here' -- "$ondine" inspect "$work/v.ondine"
  expect 0 'repacked: .* \(FusedMatMul\): stored as f32:[a-zA-Z0-9]+, oneDNN chose f32:[a-zA-Z0-9]+ here' -- env DNNL_MAX_CPU_ISA=AVX512_CORE "$ondine" run "$work/v.ondine"
fi
expect 0 '"variants"' -- "$ondine" inspect "$work/v.ondine" --json
expect 0 'running its variant for avx2' -- env DNNL_MAX_CPU_ISA=AVX2 "$ondine" run "$work/v.ondine" --input input_ids="$gpt/case0.input_ids.npy" --output-dir "$work/v_avx2"
DNNL_MAX_CPU_ISA=AVX2 "$ondine" run "$gpt/model.onnx" --input input_ids="$gpt/case0.input_ids.npy" --output-dir "$work/onnx_avx2" >/dev/null 2>&1
if cmp -s "$work/v_avx2/logits.npy" "$work/onnx_avx2/logits.npy"; then passes=$((passes + 1)); else
  echo "FAIL: the avx2 variant's logits differ from the ONNX file's under DNNL_MAX_CPU_ISA=AVX2"; fails=$((fails + 1)); fi
"$ondine" run "$work/v.ondine" --input input_ids="$gpt/case0.input_ids.npy" --output-dir "$work/v_native" >/dev/null 2>&1
if /usr/bin/python3 -c "
import numpy as np, sys
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
sys.exit(0 if np.abs(a - b).max() <= 1e-5 * np.abs(b).max() else 1)" "$work/v_avx2/logits.npy" "$work/v_native/logits.npy"; then
  passes=$((passes + 1)); else echo "FAIL: the avx2 and $isa variants disagree past 1e-5"; fails=$((fails + 1)); fi
# A variant for an ISA this CPU lacks stores no packed weights (packed at first load) and is refused here.
if [ "$isa" != avx512_core_amx ]; then
  expect 0 'weights not packed: compiled on a CPU without avx512_core_amx' -- "$ondine" compile "$gpt/model.onnx" -o "$work/amx.ondine" --target avx512_core_amx
  expect 0 'variant: avx512_core_amx .*packed at first load.*not on this CPU' -- "$ondine" inspect "$work/amx.ondine"
  expect 1 "amx\.ondine: no variant this CPU runs: the artifact was compiled for avx512_core_amx; this CPU has $isa" -- "$ondine" run "$work/amx.ondine"
fi
# A variant's process failing fails the compile, naming the variant, after the process's own error.
if [ "$isa" != avx2 ]; then
  expect 1 'compiling the avx2 variant failed \(its process said why above\)' -- "$ondine" compile "$work/nonexistent.onnx" -o "$work/x.ondine" --target avx2,native
fi
expect 2 '--target avx9: expected native, avx2' -- "$ondine" compile "$gpt/model.onnx" -o "$work/x.ondine" --target avx9
expect 2 '--target is for artifacts' -- "$ondine" compile "$gpt/model.onnx" -o "$work/x.onnx" --target avx2

head -c 1000 "$work/gpt.ondine" >"$work/cut.ondine"
expect 1 'cut\.ondine: not a valid Ondine artifact: .*truncated' -- "$ondine" run "$work/cut.ondine"
expect 1 'cut\.ondine' -- "$ondine" inspect "$work/cut.ondine"

# --precision bf16: convolutions in bfloat16 where the CPU has native bf16 (checked against the reference within
# 3% of the largest logit); refused, saying why, where oneDNN would emulate it.
case $isa in
  *bf16* | *amx*)
    expect 0 'precision=bf16 .*' -- "$ondine" run "$mm" --precision bf16 --dim batch=4
    expect 0 'check: logits .* ok' -- "$ondine" run "$mm" --precision bf16 --dim batch=4 --check
    expect 0 '"precision": "bf16"' -- "$ondine" bench "$mm" --precision bf16 --runs 2 --warmup 1 --json /dev/stdout
    expect 0 'precision: bf16 in [0-9]+ of [0-9]+ .*kept fp32: ' -- "$ondine" run "$mm" --precision bf16 --dim batch=4 --keep-fp32 '*'
    expect 0 'precision: bf16 in [0-9]+ of [0-9]+ convolutions' -- "$ondine" bench "$mm" --precision bf16 --runs 2 --warmup 1
    # --max-error: a loose bound keeps everything bf16; a bound of 0 keeps fp32 what bf16 changes, worst first.
    expect 0 'bf16 error bound 0.5: error .* 0 node\(s\) kept fp32' -- "$ondine" run "$mm" --precision bf16 --max-error 0.5
    expect 0 'bf16 error bound 0: error 0 .* [1-9][0-9]* node\(s\) kept fp32 for it' -- "$ondine" run "$mm" --precision bf16 --max-error 0
    if [[ $isa != *amx* ]] && grep -q GenuineIntel /proc/cpuinfo && grep -qw avx512_fp16 /proc/cpuinfo; then
      # An Intel core whose bf16 engine is AMX, hidden here: AVX512_BF16 at half the fp32 rate. auto is fp32
      # at once, said so; bf16 asked for compiles, with a note.
      expect 0 'precision: auto is fp32 here \(oneDNN runs avx512_core_bf16 on an Intel core whose bf16 engine is AMX' -- "$ondine" run "$mm" --precision auto
      expect 0 'precision: note: bf16 is slower than fp32 on this CPU' -- "$ondine" run "$mm" --precision bf16
    else
      # auto: bf16 here, checked against fp32 with the default bound.
      expect 0 'bf16 error bound 0.01: error ' -- "$ondine" run "$mm" --precision auto
      # ... and timed against fp32: the faster kept, said so.
      expect 0 'precision: auto chose (fp32|bf16) \(median of 7 runs: bf16 ' -- "$ondine" run "$mm" --precision auto
    fi
    # A bf16 artifact: the bf16 weights stored packed, the error against fp32 printed at compile, the nodes a
    # bound keeps fp32 stored; run takes its precision (none packed again), --precision overrides it.
    expect 0 "bf16: +error .* of max \|fp32\| on seeded inputs" -- "$ondine" compile "$mm" --precision bf16 --target native -o "$work/bf16.ondine"
    expect 0 "variant: $isa +bf16, [1-9][0-9]* weights packed" -- "$ondine" inspect "$work/bf16.ondine"
    expect 0 'packed weights: [1-9][0-9]* stored, [1-9][0-9]* used as stored, 0 packed at load' -- "$ondine" run "$work/bf16.ondine"
    expect 0 'precision=bf16 .*' -- "$ondine" run "$work/bf16.ondine" --check
    expect 0 'precision=fp32 .*' -- "$ondine" run "$work/bf16.ondine" --precision fp32
    expect 0 '\(artifact: .*bf16 \([1-9][0-9]* kept fp32\)' -- "$ondine" compile "$mm" --precision bf16 --max-error 0 --target native -o "$work/bf16k.ondine"
    expect 0 'precision: bf16 in [0-9]+ of [0-9]+ .*kept fp32: ' -- "$ondine" run "$work/bf16k.ondine"
    # --target native,avx2: the avx2 variant is fp32 (no native bf16), said so.
    expect 0 '\[avx2\] fp32: no native bf16' -- "$ondine" compile "$mm" --precision bf16 -o "$work/bf16v.ondine"
    expect 1 'no variant this CPU runs' -- env DNNL_MAX_CPU_ISA=AVX512_CORE_VNNI "$ondine" run "$work/bf16.ondine"
    expect 0 'precision: bf16 in [0-9]+ of [0-9]+' -- "$ondine" inspect "$mm" --compiled --precision bf16 ;;
esac
# bf16 artifacts need a target with native bf16; --precision is for artifacts in compile.
# (one target this CPU runs as it is: compiled here, the message names it; else in child processes: all of them)
expect 2 "none of the targets has native bf16|the target avx2 has no native bf16" -- "$ondine" compile "$mm" --precision bf16 --target avx2 -o "$work/x.ondine"
expect 2 '--precision is for artifacts' -- "$ondine" compile "$mm" --precision bf16 -o "$work/x.onnx"
# auto without native bf16 is fp32, said so (no refusal).
expect 0 'precision: auto is fp32 here \(oneDNN runs avx2' -- env DNNL_MAX_CPU_ISA=AVX2 "$ondine" run "$mm" --precision auto
expect 2 'keep-fp32 needs --precision bf16 or auto' -- "$ondine" run "$mm" --keep-fp32 'conv*'
expect 2 'max-error needs --precision bf16 or auto' -- "$ondine" run "$mm" --max-error 0.01
expect 1 'precision bf16 needs a CPU with native bf16' -- env DNNL_MAX_CPU_ISA=AVX512_CORE_VNNI "$ondine" run "$mm" --precision bf16
expect 2 'precision' -- "$ondine" run "$mm" --precision fp16

# Hostile files (issue 19): every failure exits 1 with one line "ondine: error: ..." first, bytes from the
# file escaped (\xNN), sizes bounded before allocating; none reaches std::terminate (134) or a signal.
/usr/bin/python3 - "$work" <<'PY'
import sys
from onnx import helper, TensorProto, numpy_helper
import numpy as np
w = sys.argv[1]
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
def save(nodes, inits, name, inputs=(x,), outputs=(y,)):
    g = helper.make_graph(nodes, "g", list(inputs), list(outputs), initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    open(f"{w}/{name}", "wb").write(m.SerializeToString())
# A node whose name holds an escape sequence, a newline and a byte that is not UTF-8, reading nothing defined.
save([helper.make_node("Add", ["x", "nothing"], ["y"], name="evil\x1b[2J\nname")], [], "rawname.onnx")
m = open(f"{w}/rawname.onnx", "rb").read().replace(b"evil", b"ev\xffl")
open(f"{w}/rawname.onnx", "wb").write(m)
# ConstantOfShape of 2^60 elements.
shape = numpy_helper.from_array(np.array([2**30, 2**30], dtype=np.int64), "shape")
save([helper.make_node("ConstantOfShape", ["shape"], ["y"], name="cos")], [shape], "huge_cos.onnx", inputs=())
PY
out=$("$ondine" inspect "$work/rawname.onnx" 2>&1 >/dev/null)
rc=$?
first=$(head -1 <<<"$out")
if [ "$rc" -ne 1 ] || [ "$(wc -l <<<"$out")" -ne 1 ] || ! grep -qF "node 'ev\\xffl\\x1b[2J\\x0aname' (Add)" <<<"$first" ||
   LC_ALL=C grep -q $'[\x01-\x1f\x7f-\xff]' <<<"$first"; then
  echo "FAIL: raw bytes in a node name: exit $rc (want 1, one escaped line), stderr:"
  echo "$out" | head -5 | cat -v
  fails=$((fails + 1))
else
  passes=$((passes + 1))
fi
expect 1 "^ondine: error: .*huge_cos\.onnx: node 'cos' \(ConstantOfShape\): .*too large" -- "$ondine" run "$work/huge_cos.onnx"
expect 1 "huge_cos\.onnx.*too large" -- "$ondine" inspect "$work/huge_cos.onnx"
head -c 100000 /dev/urandom >"$work/random.onnx"
for cmd in inspect run compile bench; do
  "$ondine" $cmd "$work/random.onnx" >/dev/null 2>"$work/err.txt"
  rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ] || ! head -1 "$work/err.txt" | grep -q '^ondine: error: '; then
    echo "FAIL: ondine $cmd on random bytes: exit $rc, stderr:"; head -3 "$work/err.txt" | cat -v
    fails=$((fails + 1))
  else
    passes=$((passes + 1))
  fi
done

# Command-line mistakes exit with 2.
expect 2 "" -- "$ondine" frobnicate
expect 2 "" -- "$ondine" run

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
