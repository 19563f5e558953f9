#!/usr/bin/python3
"""One ONNX model through Ondine's Python module and ONNX Runtime, side by side: latency and max difference.

Usage (Debian's Python, the module on PYTHONPATH: the build tree's python/ folder or an installed prefix):
    PYTHONPATH=build/python /usr/bin/python3 examples/python/compare.py MODEL.onnx
        [--input NAME=FILE.npy]... [--dim NAME=SIZE]... [--threads 2] [--runs 20] [--warmup 3] [--seed 0]

Inputs not given are seeded random (N(0,1) floats, integers in [0, 100)), with symbolic dims from --dim
(else 1). ONNX Runtime: the Python `onnxruntime` package when installed; otherwise the Node.js build through
bench/ort_run.mjs, as bench/peers.py runs it (setup once: cd bench && npm ci --onnxruntime-node-install=skip),
which times its runs inside node. Both engines get --threads intra-op threads; the latency is the median of
--runs calls after --warmup. The difference per output: max |ondine - ort| and that over max |ort|.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import ondine

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_inputs(model, given, dims, seed):
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, dtype, shape in model.inputs:
        if name in given:
            feeds[name] = given[name]
            continue
        if shape is None:
            sys.exit(f"compare: input '{name}' has an unknown rank: give it with --input {name}=FILE.npy")
        sizes = []
        for d in shape:
            if isinstance(d, int):
                sizes.append(d)
            elif d in dims:
                sizes.append(dims[d])
            elif d is not None and d.isidentifier():
                sizes.append(1)
            else:
                sys.exit(f"compare: input '{name}' has a derived dim '{d}': give it with --input {name}=FILE.npy")
        if dtype.startswith("float"):
            feeds[name] = rng.standard_normal(sizes).astype(dtype)
        elif dtype == "bool":
            feeds[name] = rng.integers(0, 2, sizes).astype(bool)
        else:
            feeds[name] = rng.integers(0, 100, sizes).astype(dtype)
    return feeds


def time_calls(call, runs, warmup):
    for _ in range(warmup):
        call()
    ms = []
    for _ in range(runs):
        t0 = time.perf_counter()
        call()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def ort_python(path, feeds, threads, runs, warmup):
    import onnxruntime as ort  # ImportError: the caller falls back to node
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, feeds)))
    return "onnxruntime (Python)", time_calls(lambda: session.run(None, feeds), runs, warmup), outputs


def ort_node(path, feeds, threads, runs, warmup):
    if not shutil.which("node"):
        sys.exit("compare: neither the Python onnxruntime package nor node (bench/ort_run.mjs) is available")
    with tempfile.TemporaryDirectory() as tmp:
        args = ["node", os.path.join(REPO, "bench", "ort_run.mjs"), path, "--output-dir", os.path.join(tmp, "out"),
                "--iterations", str(runs), "--warmup", str(warmup)]
        if threads:
            args += ["--threads", str(threads)]
        for i, (name, arr) in enumerate(feeds.items()):
            f = os.path.join(tmp, f"in{i}.npy")
            np.save(f, np.ascontiguousarray(arr))
            args += ["--input", f"{name}={f}"]
        done = subprocess.run(args, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"compare: ONNX Runtime (node) failed: {done.stderr.strip()}")
        timing = json.loads(done.stdout.strip().splitlines()[-1])
        outputs = {}
        for f in os.listdir(os.path.join(tmp, "out")):
            outputs[f[:-4]] = np.load(os.path.join(tmp, "out", f))
    return "onnxruntime-node (bench/ort_run.mjs)", timing["median_ms"], outputs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    given = {s.split("=", 1)[0]: np.load(s.split("=", 1)[1]) for s in a.input}
    dims = {s.split("=", 1)[0]: int(s.split("=", 1)[1]) for s in a.dim}

    t0 = time.perf_counter()
    model = ondine.compile(a.model, threads=a.threads)
    feeds = make_inputs(model, given, dims, a.seed)
    ours = model.run(feeds)  # the first call compiles a model with symbolic dims for these shapes
    ready_ms = (time.perf_counter() - t0) * 1e3
    ours_ms = time_calls(lambda: model.run(feeds), a.runs, a.warmup)

    try:
        peer, peer_ms, theirs = ort_python(a.model, feeds, a.threads, a.runs, a.warmup)
    except ImportError:
        peer, peer_ms, theirs = ort_node(a.model, feeds, a.threads, a.runs, a.warmup)

    print(f"model:   {a.model}")
    print("inputs:  " + ", ".join(f"{n} {v.dtype}{list(v.shape)}" for n, v in feeds.items()))
    print(f"ondine:  {ours_ms:9.3f} ms median of {a.runs} (threads {a.threads}; compile + first run {ready_ms:.0f} ms)")
    print(f"ort:     {peer_ms:9.3f} ms median of {a.runs} (threads {a.threads}; {peer})")
    worst = 0.0
    for name, _, _ in model.outputs:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
        other = theirs.get(name, theirs.get(safe))
        if other is None:
            print(f"output:  {name}: ONNX Runtime gave no such output")
            continue
        mine = ours[name]
        if mine.shape != other.shape:
            print(f"output:  {name}: shapes differ: ondine {list(mine.shape)}, ort {list(other.shape)}")
            worst = float("inf")
            continue
        diff = float(np.max(np.abs(mine.astype(np.float64) - other.astype(np.float64)))) if mine.size else 0.0
        scale = float(np.max(np.abs(other.astype(np.float64)))) if other.size else 0.0
        rel = diff / scale if scale > 0 else diff
        worst = max(worst, rel)
        print(f"output:  {name} {mine.dtype}{list(mine.shape)}: max |diff| {diff:.3e}, relative to max |ort| {rel:.3e}")
    print(f"speed:   ondine {peer_ms / ours_ms:.2f}x ONNX Runtime" if ours_ms > 0 else "speed:   -")
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
