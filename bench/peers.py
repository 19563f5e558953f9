#!/usr/bin/python3
"""Ondine against its peers on this machine: ONNX Runtime (bench/ort_run.mjs) and PyTorch eager.

Usage (Debian's Python; needs a build with the examples, node with bench/node_modules, and models/):
    /usr/bin/python3 bench/peers.py [--threads 2] [--rounds 3] [--runs 10] [--warmup 3]
        [--models resnet50,mobilenetv2,bert] [--batches 1,8] [--build build] [--models-dir models]

For every model and batch size, each round runs Ondine (`ondine bench --json`), ONNX Runtime (intraOpNumThreads
= --threads, graph optimization 'all') and PyTorch eager (bench/torch_models.py: the same architectures with
random weights, torch.set_num_threads, inference_mode; --no-torch leaves it out) one after the other, so that
load changes on the machine hit every engine alike; a rate is the median over rounds of each round's median
latency, and a ratio (Ondine / ONNX Runtime) is the median of the rounds' own ratios, each from two measurements
taken side by side (a load change between rounds moves both engines of the round, not the ratio; the "range"
column gives the lowest and highest round). Ondine's fraction of peak is FLOPs/sample x samples/s / the fp32
matmul GFLOP/s that oneDNN reaches at the same thread count (ondine_peak). Without torch the PyTorch column is
skipped.
With --no-passes-column, Ondine also runs with its pass pipeline off (--passes none) in the same rounds.
With --int8, the QDQ int8 models of bench/check_qdq_vs_ort.sh (out/qdq/<model>/<model>.qdq.onnx: Ondine's own
export) get rows too ("resnet50-int8", Ondine with --precision int8: on a CPU without VNNI its 8-bit weights
requantized to 7 bits, as ONNX Runtime runs them with saturating u8 x s8 pairs there), and BERT and gru_pt their dynamically quantized forms (out/qdq/M/M.dynamic.onnx,
written here by `ondine compile --passes quantize-dynamic` when missing): Ondine and ONNX Runtime run the very
same model; their % of peak is
against oneDNN's u8 x s8 matmul GOP/s (ondine_peak --int8), and a line per batch gives int8 against ONNX
Runtime's fp32 of the same model. PyTorch and the passes-off column skip those rows. lstm_pt's int8 row is
its static int8 form (two ondine.QLSTM: out/qdq/lstm_pt/lstm_pt.qlstm.onnx, written here by `ondine quantize`
on 8 seeded token sequences when missing), which ONNX Runtime cannot run: its line compares with ONNX
Runtime's fp32 only.
With --dynamic, the workloads whose shapes change from call to call follow (bench/dynamic_shapes.py with the
same --threads and --rounds: a stream of mixed-length encoder requests, a decode with a KV cache).
With --throughput, the same models follow at batch 1 as requests served at once (bench/throughput.py: --threads
streams of one thread against as many concurrent ONNX Runtime sessions of one thread).
With --plot FILE.png, the Ondine / ONNX Runtime ratios are also drawn as a bar chart (matplotlib: Debian's
python3-matplotlib).

With --bf16, Ondine also runs each model with --precision bf16 ("resnet50-bf16": convolutions in bfloat16, on
CPUs with native bf16); ONNX Runtime has no bf16 on CPU and runs the same file in fp32, and a line per batch
gives bf16 against ONNX Runtime's fp32 and Ondine's fp32.
The PyTorch exports bert_pt, gpt_pt, vit_pt, lstm_pt, gru_pt, stream_pt, roihead_pt, ... (no PyTorch column) come from
/usr/bin/python3 scripts/make_models.py --torch-bench; token models run at their sequence length (INPUTS).
Make the models with: /usr/bin/python3 scripts/make_models.py --out models (and bench/check_qdq_vs_ort.sh)
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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# model -> (input name, input kind, sequence length for token inputs). The *_pt models are PyTorch exports
# (scripts/make_models.py --torch-bench, in <models-dir>/torch/<name>/model.onnx) with symbolic batch and seq.
INPUTS = {"resnet50": ("input", "image", 128), "mobilenetv2": ("input", "image", 128), "bert": ("input_ids", "tokens", 128),
          "bert_pt": ("input_ids", "tokens", 128), "gpt_pt": ("input_ids", "tokens", 256),
          "vit_pt": ("pixels", "image", 0), "lstm_pt": ("input_ids", "tokens", 128),
          "gru_pt": ("input_ids", "tokens", 128), "stream_pt": ("frame", "stream", 0),
          "ssd_pt": ("image", "detector", 0), "gated_pt": ("audio", "gated", 0),
          "textdet_pt": ("image", "text", 640), "efficientnet_pt": ("image", "image", 0),
          "mobilenetv2_pt": ("image", "image", 0), "convnext_pt": ("image", "image", 0),
          "lraspp_pt": ("image", "segment", 512), "deeplab_pt": ("image", "segment", 512),
          "roihead_pt": ("image", "roi", 800), "resnet18_pt": ("image", "image", 0),
          "unet_pt": ("image", "mask", 256), "unet_fp16_pt": ("image", "mask", 256),
          "unet_dynq_pt": ("image", "mask", 256), "faceembed_pt": ("face", "face", 112),
          "bird_classifier": ("audio", "audio", 160000)}
# Models of the test corpus (tests/data/torch/<name>/model.onnx), small enough to be committed.
CORPUS = {"bird_classifier"}


def model_path(models_dir, model):
    if model in CORPUS:
        return os.path.join(REPO, "tests", "data", "torch", model, "model.onnx")
    return os.path.join(models_dir, "torch", model, "model.onnx") if model.endswith("_pt") else \
        os.path.join(models_dir, f"{model}.onnx")


def run_json(cmd):
    """Runs cmd and returns its stdout's last line as JSON; a failure prints its stderr and exits."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"peers: failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_gflops(peak_exe, threads, int8=False, bf16=False):
    flags = ["--int8"] if int8 else ["--bf16"] if bf16 else []
    out = subprocess.run([peak_exe, "--threads", str(threads)] + flags, capture_output=True,
                         text=True, check=True).stdout
    unit = " GOP/s" if int8 else " GFLOP/s"
    return float(out.split("best ")[1].split(unit)[0]), out.strip()


def write_input(model, batch, directory):
    """Seeded random inputs as .npy (image N(0,1) floats, token ids in [0, 8000), or a streaming step's
    frame [batch, 512] and LSTM state h, c [2, batch, 64]); returns ["name=file", ...]."""
    name, kind, seq = INPUTS[model]
    rng = np.random.default_rng(batch)
    if kind in ("text", "segment", "mask", "face"):  # [batch, 3, size, size] images in [0, 1] (a page, a street scene)
        arrays = {name: rng.random((batch, 3, seq, seq), dtype=np.float32)}
    elif kind == "detector":  # one [3, 320, 320] image in [0, 1] (torchvision detectors take no batch dim)
        arrays = {name: rng.random((3, 320, 320), dtype=np.float32)}
    elif kind == "roi":  # [batch, 3, 800, 800] images and 300 proposals [k, x1, y1, x2, y2] over them
        corners = np.sort(rng.uniform(0, seq, size=(300, 2, 2)), axis=1)
        boxes = np.stack([corners[:, 0, 0], corners[:, 1, 0], corners[:, 0, 1], corners[:, 1, 1]], axis=1)
        arrays = {name: rng.random((batch, 3, seq, seq), dtype=np.float32),
                  "proposals": np.concatenate([rng.integers(0, batch, size=(300, 1)), boxes], axis=1).astype(np.float32)}
    elif kind == "gated":  # one second of 16 kHz audio per batch item, and the sample rate that picks the branch
        arrays = {name: rng.standard_normal((batch, 1, 16000), dtype=np.float32),
                  "sample_rate": np.array(16000, np.int64)}
    elif kind == "audio":  # [batch, samples]: 5-second windows of 32 kHz audio-like noise in [-1, 1]
        arrays = {name: np.clip(0.2 * rng.standard_normal((batch, seq), dtype=np.float32), -1, 1)}
    elif kind == "stream":
        arrays = {"frame": rng.standard_normal((batch, 512), dtype=np.float32),
                  "h": 0.5 * rng.standard_normal((2, batch, 64), dtype=np.float32),
                  "c": 0.5 * rng.standard_normal((2, batch, 64), dtype=np.float32)}
    else:
        arrays = {name: rng.standard_normal((batch, 3, 224, 224), dtype=np.float32) if kind == "image"
                  else rng.integers(0, 8000, size=(batch, seq), dtype=np.int64)}
    specs = []
    for input_name, array in arrays.items():
        path = os.path.join(directory, f"{model}.{input_name}.b{batch}.npy")
        np.save(path, array)
        specs.append(f"{input_name}={path}")
    return specs


class Ondine:
    """Ondine with its default pass pipeline, or with passes="none" (the pipeline's effect, same run)."""

    def __init__(self, exe, args, tmp, passes=None):
        self.name = "ondine" if passes is None else f"ondine-{passes}"
        self.exe, self.args, self.passes = exe, args, passes
        self.json = os.path.join(tmp, self.name + ".json")
        self.flops = {}

    def measure(self, model, path, batch, input_spec):
        a = self.args
        if self.passes is not None and model.endswith("-int8"):
            return None
        if self.passes is not None and model.endswith("-bf16"):
            return None
        extra = ["--passes", self.passes] if self.passes is not None else []
        if model.endswith("-bf16"):
            extra += ["--precision", "bf16"]
        if model.endswith("-int8"):  # int8 wherever the CPU can (without VNNI: 7-bit weights, said by Ondine)
            extra += ["--precision", "int8"]
        if INPUTS[model.split("-")[0]][1] in ("detector", "gated", "roi"):
            # The detections (the work after NMS), the branch taken, or the proposals depend on the inputs: Ondine runs
            # on the same .npy as ONNX Runtime (`ondine run`: the median of --runs runs; the first one, which
            # also compiles the stages whose shapes depend on data, is among them).
            inputs = [arg for spec in input_spec for arg in ("--input", spec)]
            done = subprocess.run([self.exe, "run", path, "--threads", str(a.threads), "--runs", str(a.runs)] + inputs +
                                  extra, capture_output=True, text=True, check=True)
            self.flops[model], self.isa = None, done.stdout.split("isa=")[1].split()[0]
            return float(done.stdout.split("median=")[1].split()[0])
        if model.split("-")[0].endswith("_pt") and INPUTS[model.split("-")[0]][1] == "tokens":
            extra += ["--dim", "batch", "--dim", f"seq={INPUTS[model.split('-')[0]][2]}"]
        if INPUTS[model.split("-")[0]][1] in ("text", "mask"):  # exported with symbolic height and width
            size = INPUTS[model.split("-")[0]][2]
            extra += ["--dim", "batch", "--dim", f"height={size}", "--dim", f"width={size}"]
        subprocess.run([self.exe, "bench", path, "--batch", str(batch), "--threads", str(a.threads), "--warmup",
                        str(a.warmup), "--runs", str(a.runs), "--json", self.json] + extra, check=True,
                       stdout=subprocess.DEVNULL)
        with open(self.json) as f:
            j = json.load(f)
        self.flops[model] = j["flops_per_sample"]
        self.isa = j["isa"]
        return j["results"][0]["median_ms"]


# int8 forms in Ondine's own ops (ondine.QLSTM), which ONNX Runtime cannot load.
ONDINE_ONLY = {"lstm_pt-int8"}


class OnnxRuntime:
    name = "ort"

    def __init__(self, args):
        self.args = args

    def measure(self, model, path, batch, input_spec):
        a = self.args
        if model in ONDINE_ONLY:
            return None
        inputs = [arg for spec in input_spec for arg in ("--input", spec)]
        j = run_json(["node", os.path.join(REPO, "bench", "ort_run.mjs"), path] + inputs + ["--threads",
                      str(a.threads), "--opt-level", "all", "--iterations", str(a.runs), "--warmup", str(a.warmup)])
        return j["median_ms"]


class PyTorch:
    name = "torch"

    def __init__(self, args):
        import torch  # noqa: F401  (ImportError: the caller skips PyTorch)
        sys.path.insert(0, os.path.join(REPO, "bench"))
        import torch_models
        self.torch, self.models, self.args = torch, torch_models, args
        torch.set_num_threads(args.threads)
        self.cache = {}

    def measure(self, model, path, batch, input_spec):
        torch, a = self.torch, self.args
        if model.endswith("-int8") or model.endswith("-bf16") or model.endswith("_pt"):
            return None  # (the *_pt models: no eager counterpart in torch_models.py)
        if model not in self.cache:
            torch.manual_seed(0)
            self.cache[model] = self.models.make(model)
        net, make_input = self.cache[model]
        x = make_input(batch)
        times = []
        with torch.inference_mode():
            for i in range(a.warmup + a.runs):
                t0 = time.perf_counter()
                net(x)
                if i >= a.warmup:
                    times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times)


def paired_ratio(ms, x, y):
    """The median over rounds of x's throughput over y's in the same round (x, y: (label, batch, engine) keys of
    the per-round latencies), with the lowest and highest of those ratios; None where either skips the case."""
    xs, ys = ms.get(x), ms.get(y)
    if not xs or not ys or xs[0] is None or ys[0] is None:
        return None
    per_round = sorted(t_y / t_x for t_x, t_y in zip(xs, ys))  # latencies: y's time over x's is x's speed-up
    return statistics.median(per_round), per_round[0], per_round[-1]


def plot_ratios(path, ratios, isa, threads, peak):
    """Ondine / ONNX Runtime per (model, batch) as a bar chart (PNG) beside the table: matplotlib from Debian
    (python3-matplotlib), imported only here."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("peers: --plot needs matplotlib (apt-get install python3-matplotlib)")
    keys = [k for k, r in ratios.items() if r is not None]
    labels = [f"{label}\nbatch {b}" for label, b in keys]
    values = [ratios[k][0] for k in keys]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(keys) + 2), 4.5))
    bars = ax.bar(range(len(keys)), values, color=["#2a7ab9" if v >= 1.0 else "#d9822b" for v in values])
    ax.axhline(1.0, color="black", linewidth=1)
    ax.axhline(0.95, color="grey", linewidth=0.8, linestyle="--", label="0.95 (one interleaved cell's noise)")
    for bar, v in zip(bars, values):
        ax.text(bar.get_x() + bar.get_width() / 2, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.2 * max(values + [1.0]))  # room above the tallest bar for its label and the legend
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("Ondine / ONNX Runtime (throughput, median of rounds)")
    ax.set_title(f"{isa}, {threads} threads, fp32 matmul peak {peak:.0f} GFLOP/s", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def load():
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=10, help="timed runs per engine per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs per engine per round")
    p.add_argument("--models", default="resnet50,mobilenetv2,bert")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--build", default=os.path.join(REPO, "build"), help="the CMake build dir with ondine, ondine_peak")
    p.add_argument("--models-dir", default=os.path.join(REPO, "models"))
    p.add_argument("--no-passes-column", action="store_true",
                   help="also run Ondine with --passes none (shows what the pass pipeline gains)")
    p.add_argument("--no-torch", action="store_true",
                   help="leave PyTorch eager out (with Debian's python3-torch installed it runs too, and slowly)")
    p.add_argument("--int8", action="store_true", help="also the QDQ int8 models (out/qdq/, bench/check_qdq_vs_ort.sh)")
    p.add_argument("--qdq-dir", default=os.path.join(REPO, "out", "qdq"))
    p.add_argument("--bf16", action="store_true",
                   help="also Ondine with --precision bf16 on each model (\"resnet50-bf16\"; ONNX Runtime runs the "
                        "same file in fp32: it has no bf16 on CPU); %% of peak is of the bf16 matmul peak (ondine_peak --bf16)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="also draw Ondine / ONNX Runtime per model and batch as a bar chart (needs python3-matplotlib)")
    p.add_argument("--dynamic", action="store_true",
                   help="also the workloads whose shapes change from call to call (bench/dynamic_shapes.py: a stream "
                        "of 200 mixed-length encoder requests, a 64-token decode with a KV cache), after the rest")
    p.add_argument("--throughput", action="store_true",
                   help="also throughput at batch 1: --threads streams of one thread against as many concurrent ONNX "
                        "Runtime sessions (bench/throughput.py), after the rest")
    a = p.parse_args()
    models = [m for m in a.models.split(",") if m]
    batches = [int(b) for b in a.batches.split(",") if b]
    for m in models:
        if m not in INPUTS:
            sys.exit(f"peers: unknown model '{m}' (known: {', '.join(INPUTS)})")
        if not os.path.exists(model_path(a.models_dir, m)):
            sys.exit(f"peers: {model_path(a.models_dir, m)} missing; run /usr/bin/python3 scripts/make_models.py "
                     f"--out models (and --torch-bench for the *_pt models)")
    # (label, input kind, model file): the fp32 models, then their int8 QDQ forms.
    cases = [(m, m, model_path(a.models_dir, m)) for m in models]
    if a.int8:
        for m in models:
            q = os.path.join(a.qdq_dir, m, f"{m}.qdq.onnx")
            if m == "lstm_pt":  # static int8 LSTM layers (ondine.QLSTM), calibrated on seeded token sequences
                q = os.path.join(a.qdq_dir, m, "lstm_pt.qlstm.onnx")
                if not os.path.exists(q):
                    calib = tempfile.mkdtemp(prefix="ondine-calib-")
                    rng = np.random.default_rng(1234)
                    for i in range(8):
                        np.save(os.path.join(calib, f"s{i}.npy"), rng.integers(0, 8000, (1, 128)).astype(np.int64))
                    os.makedirs(os.path.dirname(q), exist_ok=True)
                    subprocess.run([os.path.join(a.build, "examples", "ondine"), "quantize", model_path(a.models_dir, m),
                                    "--calib", calib, "-o", q], check=True, stdout=subprocess.DEVNULL)
                    shutil.rmtree(calib, ignore_errors=True)
            elif m in ("bert", "gru_pt"):  # no static QDQ form: MatMuls (and GRU input projections) quantize
                q = os.path.join(a.qdq_dir, m, f"{m}.dynamic.onnx")  # dynamically (the pass quantize-dynamic)
                if not os.path.exists(q):
                    os.makedirs(os.path.dirname(q), exist_ok=True)
                    subprocess.run([os.path.join(a.build, "examples", "ondine"), "compile",
                                    model_path(a.models_dir, m), "--passes", "quantize-dynamic", "-o", q],
                                   check=True, stdout=subprocess.DEVNULL)
            elif not os.path.exists(q):
                sys.exit(f"peers: {q} missing; run bench/check_qdq_vs_ort.sh {m}")
            cases.append((m + "-int8", m, q))
    if a.bf16:
        cases += [(m + "-bf16", m, model_path(a.models_dir, m)) for m in models]
    ondine_exe = os.path.join(a.build, "examples", "ondine")
    peak_exe = os.path.join(a.build, "bench", "ondine_peak")
    for exe in (ondine_exe, peak_exe):
        if not os.access(exe, os.X_OK):
            sys.exit(f"peers: {exe} missing; build the targets ondine_cli and ondine_peak in {a.build}")
    if not shutil.which("node"):
        sys.exit("peers: node not found (ONNX Runtime runs through bench/ort_run.mjs)")

    tmp = tempfile.mkdtemp(prefix="ondine-peers-")
    ondine = Ondine(ondine_exe, a, tmp)
    engines = [ondine, OnnxRuntime(a)]
    if a.no_passes_column:
        engines.insert(1, Ondine(ondine_exe, a, tmp, passes="none"))
    notes = []
    try:
        if a.no_torch:
            raise ImportError("--no-torch")
        engines.append(PyTorch(a))
        if "BLAS_INFO=generic" in engines[-1].torch.__config__.show():
            notes.append("note: this PyTorch is built with BLAS_INFO=generic (reference BLAS, as Debian's python3-torch): "
                         "its Linear/MatMul are far slower than a PyPI build's (convolutions use oneDNN either way)")
    except ImportError as e:
        notes.append(f"PyTorch skipped: {e}")

    load_before = load()
    peak, peak_line = peak_gflops(peak_exe, a.threads)
    if a.int8:
        peak_int8, peak_int8_line = peak_gflops(peak_exe, a.threads, int8=True)
    if a.bf16:
        peak_bf16, peak_bf16_line = peak_gflops(peak_exe, a.threads, bf16=True)
    inputs = {(m, b): write_input(m, b, tmp) for m in models for b in batches}
    ms = {}  # (label, batch, engine) -> per-round medians (None: the engine skips that case)
    for r in range(a.rounds):
        for label, m, path in cases:
            for b in batches:
                if INPUTS.get(m, ("", ""))[1] == "detector" and b != 1:
                    continue  # one image per run: no batch dim
                for e in engines:
                    print(f"round {r + 1}/{a.rounds}: {label} batch {b} {e.name}", file=sys.stderr)
                    ms.setdefault((label, b, e.name), []).append(e.measure(label, path, b, inputs[(m, b)]))
    load_after = load()
    shutil.rmtree(tmp, ignore_errors=True)

    have_torch = any(e.name == "torch" for e in engines)
    print(f"threads {a.threads}, {a.rounds} rounds x {a.runs} runs (warmup {a.warmup}), isa {ondine.isa}; "
          f"load average before {load_before}, after {load_after} ({os.cpu_count()} CPUs)")
    print(peak_line)
    if a.int8:
        print(peak_int8_line)
    if a.bf16:
        print(peak_bf16_line)
    have_nopass = any(e.name == "ondine-none" for e in engines)
    cols = ["model", "batch", "ondine/s"] + (["no passes/s"] if have_nopass else []) + ["ort/s"] + \
        (["torch/s"] if have_torch else []) + ["ondine/ort", "range"] + (["ondine/torch"] if have_torch else []) + \
        ["GOP/s", "% of peak"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---" for _ in cols) + "|")
    rates, ort_ratios = {}, {}
    for label, m, _ in cases:
        for b in batches:
            if (label, b, "ondine") not in ms:
                continue
            rate = {e.name: (b * 1000.0 / statistics.median(ms[(label, b, e.name)])
                             if ms[(label, b, e.name)][0] is not None else None) for e in engines}
            rates[(label, b)] = rate
            int8 = label.endswith("-int8")
            gflops = (ondine.flops[label] or 0) * rate["ondine"] / 1e9
            cell = lambda r: "-" if r is None else f"{r:.1f}"  # noqa: E731
            ratio = lambda r: "-" if r is None else f"{r[0]:.2f}"  # noqa: E731
            ort_ratios[(label, b)] = vs_ort = paired_ratio(ms, (label, b, "ondine"), (label, b, "ort"))
            row = [label, str(b), cell(rate["ondine"])]
            row += [cell(rate["ondine-none"])] if have_nopass else []
            row += [cell(rate["ort"])]
            row += [cell(rate["torch"])] if have_torch else []
            row += [ratio(vs_ort), "-" if vs_ort is None else f"{vs_ort[1]:.2f}-{vs_ort[2]:.2f}"]
            row += [ratio(paired_ratio(ms, (label, b, "ondine"), (label, b, "torch")))] if have_torch else []
            row_peak = peak_int8 if int8 else peak_bf16 if label.endswith("-bf16") else peak
            row += [f"{gflops:.1f}", f"{100 * gflops / row_peak:.0f}%"]
            print("| " + " | ".join(row) + " |")
    if a.plot:
        plot_ratios(a.plot, ort_ratios, ondine.isa, a.threads, peak)
    for label, m, _ in cases:
        if label.endswith("-bf16") and m in models:
            for b in batches:
                h, f = rates[(label, b)], rates[(m, b)]
                vs_ort = paired_ratio(ms, (label, b, "ondine"), (m, b, "ort"))
                vs_fp32 = paired_ratio(ms, (label, b, "ondine"), (m, b, "ondine"))
                print(f"{m} batch {b}: Ondine bf16 {h['ondine']:.1f}/s = {vs_ort[0]:.2f}x ONNX Runtime fp32 "
                      f"({f['ort']:.1f}/s; rounds {vs_ort[1]:.2f}-{vs_ort[2]:.2f}), {vs_fp32[0]:.2f}x Ondine fp32")
        if label.endswith("-int8") and m in models:
            for b in batches:
                q, f = rates[(label, b)], rates[(m, b)]
                ort_q = paired_ratio(ms, (label, b, "ort"), (m, b, "ort"))
                ort_int8 = "cannot run it" if ort_q is None else f"= {ort_q[0]:.2f}x its fp32"
                vs_ort = paired_ratio(ms, (label, b, "ondine"), (m, b, "ort"))
                vs_fp32 = paired_ratio(ms, (label, b, "ondine"), (m, b, "ondine"))
                print(f"{m} batch {b}: Ondine int8 {q['ondine']:.1f}/s = {vs_ort[0]:.2f}x ONNX Runtime fp32 "
                      f"({f['ort']:.1f}/s), {vs_fp32[0]:.2f}x Ondine fp32; ONNX Runtime int8 {ort_int8}")
    for n in notes:
        print(n)
    if a.dynamic:  # Python module on both sides there; its own tables, rounds interleaved the same way
        sys.stdout.flush()
        subprocess.run([sys.executable, os.path.join(REPO, "bench", "dynamic_shapes.py"), "--build", a.build,
                        "--models-dir", a.models_dir, "--threads", str(a.threads), "--rounds", str(a.rounds)],
                       check=False)
    if a.throughput:  # requests from N streams against N concurrent ONNX Runtime sessions (bench/throughput.py)
        sys.stdout.flush()
        subprocess.run([sys.executable, os.path.join(REPO, "bench", "throughput.py"), "--build", a.build,
                        "--models-dir", a.models_dir, "--threads", str(a.threads), "--rounds", str(a.rounds),
                        "--models", ",".join(m for m in models if INPUTS[m][1] in ("image", "tokens", "audio"))],
                       check=False)


if __name__ == "__main__":
    main()
