#!/usr/bin/python3
"""Ondine against ONNX Runtime on workloads whose input shapes change from call to call.

Usage (Debian's Python with numpy; needs the Python module built, build/python/ondine*.so, node with
bench/node_modules, and the two models of `/usr/bin/python3 scripts/make_models.py --torch-bench --which
hf_bert_pt,gpt2_kv_pt`):
    /usr/bin/python3 bench/dynamic_shapes.py [--build build] [--models-dir models] [--threads 2] [--rounds 3]
        [--workload encoder,decode] [--requests 200] [--prompt 32] [--steps 64] [--repeats 3]
        [--cache-size N] [--kv cache|feed] [--decode-model NAME|PATH] [--timeout S] [--json FILE]

Two workloads, batch 1, the same for both engines (the driver writes them as a JSON spec that both read):
  encoder  models/torch/hf_bert_pt (MiniLM-sized, inputs input_ids and attention_mask [1, L]): a stream of
           --requests requests, L_r = numpy.random.default_rng(0).integers(8, 257, size=200)[r] (the first
           --requests of them), input_ids[0, j] = 1 + (r * 131 + j * 7) % 7999, the mask all ones; 2 warm-up
           requests of length 64 first, not counted. Reported: the stream's total seconds, p50 and p99 latency,
           and the latency per token of requests whose length is new in the stream against lengths seen before
           (64 counts as seen: the warm-up), which shows what a new shape costs.
  decode   models/torch/gpt2_kv_pt (distilgpt2-like with a KV cache): a --prompt token prompt (ids
           1 + (j * 7) % 7999) with zero-length pasts [1, 12, 0, 64], then --steps steps of one token each, fed the
           previous step's presents as its pasts, the token the argmax of the last logits row; the whole decode
           --repeats times, none as warm-up. Reported: prompt ms, per-token p50 and p90, and the step at past
           lengths prompt, 2 * prompt and prompt + steps - 1 (32, 64, 95), as the median over the repeats, and
           each repeat by itself (the first one pays for every new shape). --decode-model runs another decoder
           (a name under models/torch, or an .onnx file): past_key_i <- present_key_i or Optimum's
           past_key_values.i.key <- present.i.key, with attention_mask (ones) and position_ids (arange(past,
           past + seq)) fed where the model has them (models/torch/llama_kv_pt, and its weight-only quantized
           copies from `ondine quantize --weights`).
Each round runs Ondine (this script again with --engine ondine: ondine.compile(model, threads=T) and m.run, in
its own process) and then ONNX Runtime (bench/ort_stream.mjs: onnxruntime-node, intraOpNumThreads T,
interOpNumThreads 1, graph optimization 'all', presents passed on as ORT tensors), never both at once. A
number is the median over rounds; a ratio is ONNX Runtime's time / Ondine's (>1: Ondine faster), the median of
the rounds' own ratios, as bench/peers.py does. Latencies are each run call alone (inputs made before it, the
argmax after it). Ondine's compile time (the ondine.compile call) and ONNX Runtime's session creation are
reported apart and counted in nothing else; a shape compiled on first use is counted in the run that uses it.
Correctness, in the first round: the encoder output of request 0 against ONNX Runtime's (written by
bench/ort_run.mjs), max |diff|, and the decode tokens of every repeat of both engines compared.
--kv cache (default) decodes with Ondine's KV cache (Model.kv_cache(prompt + steps): the pasts stay in its
buffers, each step appends its positions in place); --kv feed feeds the presents back as pasts, as ONNX
Runtime is run. --weight-only fp32 runs a weight-only quantized decoder's products with float32 activations in both
engines (Ondine's exact_weight_only=True, ONNX Runtime's session.qdq_matmulnbits_accuracy_level 0, the file's own
arithmetic); the default int8 leaves both at their defaults, which quantize those activations to int8 per block
(ONNX Runtime's accuracy level 4). --requests 20 --steps 8 make a short run; --cache-size passes ondine.compile's cache_size (default: the
module's); --timeout ends an engine's run after S seconds (it is then reported as failed); --json FILE writes
every measurement.
"""

import argparse
import glob
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {"encoder": "hf_bert_pt", "decode": "gpt2_kv_pt"}


def percentile(values, q):
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


def token_ids(length, r):
    return (1 + (r * 131 + np.arange(length, dtype=np.int64) * 7) % 7999).reshape(1, length)


def report_pasts(prompt, steps):
    return sorted({p for p in (prompt, 2 * prompt, prompt + steps - 1) if prompt <= p < prompt + steps})


# ---------------------------------------------------------------------------------------------------------------
# The Ondine side (this script with --engine ondine): the same loops as bench/ort_stream.mjs, one JSON line.

def ondine_encoder(m, spec, save_output):
    lengths = spec["lengths"]
    feeds_of = lambda length, r: {"input_ids": token_ids(length, r),
                                  "attention_mask": np.ones((1, length), dtype=np.int64)}
    warmup_ms = []
    for w in range(2):
        t0 = time.perf_counter()
        m.run(feeds_of(64, w))
        warmup_ms.append((time.perf_counter() - t0) * 1e3)
    compiled_before = m.compilations
    requests = [feeds_of(length, r) for r, length in enumerate(lengths)]
    latencies = []
    start = time.perf_counter()
    for r, feeds in enumerate(requests):
        t0 = time.perf_counter()
        out = m.run(feeds)
        latencies.append((time.perf_counter() - t0) * 1e3)
        if r == 0 and save_output:
            np.save(save_output, out["last_hidden_state"])
    total = time.perf_counter() - start
    return {"requests": len(lengths), "distinct_lengths": len(set(lengths)), "total_s": total,
            "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99), "latencies_ms": latencies,
            "warmup_ms": warmup_ms, "compilations_in_stream": m.compilations - compiled_before}


def kv_pairs(names):
    """(past, present) input/output names of a decoder: past_key_0 <- present_key_0 (GPT-2 style) or
    past_key_values.0.key <- present.0.key (Hugging Face Optimum's)."""
    pairs = []
    for name in names:
        if name.startswith("past_key_values."):
            pairs.append((name, "present." + name[len("past_key_values."):]))
        elif name.startswith("past_"):
            pairs.append((name, "present_" + name[len("past_"):]))
    return pairs


def ondine_decode(m, spec):
    prompt, steps, repeats = spec["prompt"], spec["steps"], spec["repeats"]
    shapes = {name: shape for name, _, shape in m.inputs}
    pairs = kv_pairs(shapes)
    empty = {past: tuple(1 if i == 0 else 0 if i == 2 else d for i, d in enumerate(shapes[past])) for past, _ in pairs}
    pasts = [p for p in spec.get("report_pasts", report_pasts(prompt, steps)) if prompt <= p < prompt + steps]
    kv_cache = m.kv_cache(prompt + steps) if spec.get("kv") == "cache" else None

    def extra(feeds, seq, past):  # attention_mask and position_ids where the model has them
        if "attention_mask" in shapes:
            feeds["attention_mask"] = np.ones((1, past + seq), dtype=np.int64)
        if "position_ids" in shapes:
            feeds["position_ids"] = np.arange(past, past + seq, dtype=np.int64).reshape(1, seq)

    runs = []
    for _ in range(repeats):
        compiled_before = m.compilations
        feeds = {"input_ids": (1 + (np.arange(prompt, dtype=np.int64) * 7) % 7999).reshape(1, prompt)}
        extra(feeds, prompt, 0)
        if kv_cache:
            kv_cache.reset()  # a new sequence; the buffers stay
        else:
            for past, _ in pairs:
                feeds[past] = np.zeros(empty[past], dtype=np.float32)
        t0 = time.perf_counter()
        out = m.run(feeds, kv_cache=kv_cache)
        prompt_ms = (time.perf_counter() - t0) * 1e3
        tokens, token_ms = [], []
        for step in range(steps):
            token = int(np.argmax(out["logits"][0, -1]))
            tokens.append(token)
            feeds["input_ids"] = np.array([[token]], dtype=np.int64)
            extra(feeds, 1, prompt + step)
            if not kv_cache:
                for past, present in pairs:
                    feeds[past] = out[present]
            t0 = time.perf_counter()
            out = m.run(feeds, kv_cache=kv_cache)
            token_ms.append((time.perf_counter() - t0) * 1e3)
        runs.append({"prompt_ms": prompt_ms, "p50_ms": percentile(token_ms, 50), "p90_ms": percentile(token_ms, 90),
                     "at_past_ms": {str(p): token_ms[p - prompt] for p in pasts}, "token_ms": token_ms,
                     "tokens": tokens, "compilations": m.compilations - compiled_before})
    med = lambda key: statistics.median(r[key] for r in runs)
    return {"prompt": prompt, "steps": steps, "repeats": repeats,
            "median": {"prompt_ms": med("prompt_ms"), "p50_ms": med("p50_ms"), "p90_ms": med("p90_ms"),
                       "at_past_ms": {str(p): statistics.median(r["at_past_ms"][str(p)] for r in runs) for p in pasts}},
            "runs": runs}


def run_ondine_engine(a):
    with open(a.spec) as f:
        spec = json.load(f)
    sys.path.insert(0, os.path.join(os.path.abspath(a.build), "python"))
    try:
        import ondine
    except ImportError as e:
        sys.exit(f"dynamic_shapes: cannot import ondine from {a.build}/python ({e}); "
                 "build it: cmake --build build --target ondine_python")
    kwargs = {"threads": a.threads}
    if a.cache_size is not None:
        kwargs["cache_size"] = a.cache_size
    if spec.get("weight_only") == "fp32":
        kwargs["exact_weight_only"] = True
    t0 = time.perf_counter()
    m = ondine.compile(spec["model"], **kwargs)
    compile_s = time.perf_counter() - t0
    result = ondine_encoder(m, spec, a.save_output) if spec["mode"] == "encoder" else ondine_decode(m, spec)
    print(json.dumps({"engine": "ondine", "version": ondine.__version__, "mode": spec["mode"], "model": spec["model"],
                      "threads": a.threads, "compile_s": compile_s, "compilations": m.compilations, **result}))


# ---------------------------------------------------------------------------------------------------------------
# The driver.

def run_json(name, cmd, timeout):
    """Runs cmd; returns its stdout's last line as JSON, or None (after printing why) when it fails."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"dynamic_shapes: {name} ran past --timeout {timeout} s: {shlex.join(cmd)}", file=sys.stderr)
        return None
    if done.returncode != 0 or not done.stdout.strip():
        print(f"dynamic_shapes: {name} failed ({done.returncode}): {shlex.join(cmd)}\n{done.stderr.strip()[-3000:]}",
              file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def new_vs_seen(lengths, latencies):
    """ms per token of the requests whose length is new in the stream (64, the warm-up's, counts as seen) and of
    those whose length came before: (median new, median seen, count new, count seen)."""
    seen, new, old = {64}, [], []
    for length, ms in zip(lengths, latencies):
        (old if length in seen else new).append(ms / length)
        seen.add(length)
    return (percentile(new, 50), percentile(old, 50), len(new), len(old))


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(rounds, key):
    """Median over rounds of ORT / Ondine, each round's pair side by side."""
    return med([o[key] / d[key] for d, o in rounds if d and o and d.get(key) and o.get(key) is not None])


def fmt(v, digits=2):
    return "failed" if v is None else f"{v:.{digits}f}"


def table(rows, rounds):
    lines = ["| | Ondine | ONNX Runtime | ORT / Ondine |", "|---|---|---|---|"]
    for label, key, digits in rows:
        cells = []
        for side in (0, 1):
            ran = [r[side] for r in rounds if r[side]]
            v = med([r.get(key) for r in ran])
            cells.append("failed" if not ran else "n/a" if v is None else fmt(v, digits))
        x = ratio(rounds, key)
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {'-' if x is None else f'{x:.2f}x'} |")
    return "\n".join(lines)


def flatten_encoder(j, lengths):
    if j is None:
        return None
    new, old, n_new, n_old = new_vs_seen(lengths, j["latencies_ms"])
    return {"total_s": j["total_s"], "p50_ms": j["p50_ms"], "p99_ms": j["p99_ms"], "new_ms_tok": new,
            "seen_ms_tok": old, "n_new": n_new, "n_seen": n_old}


def flatten_decode(j):
    if j is None:
        return None
    flat = {"prompt_ms": j["median"]["prompt_ms"], "p50_ms": j["median"]["p50_ms"], "p90_ms": j["median"]["p90_ms"]}
    for p, ms in j["median"]["at_past_ms"].items():
        flat[f"past{p}"] = ms
    for k, run in enumerate(j["runs"]):
        flat[f"rep{k}_prompt_ms"], flat[f"rep{k}_p50_ms"], flat[f"rep{k}_p90_ms"] = \
            run["prompt_ms"], run["p50_ms"], run["p90_ms"]
    return flat


def check_encoder(a, spec, ondine_out, tmp):
    """Request 0 through bench/ort_run.mjs; returns Ondine's and ONNX Runtime's max |diff| as text."""
    if not os.path.exists(ondine_out):
        return "not checked (Ondine failed)"
    length = spec["lengths"][0]
    ids, mask = os.path.join(tmp, "check.input_ids.npy"), os.path.join(tmp, "check.attention_mask.npy")
    np.save(ids, token_ids(length, 0))
    np.save(mask, np.ones((1, length), dtype=np.int64))
    out_dir = os.path.join(tmp, "ort_check")
    done = subprocess.run(["node", os.path.join(REPO, "bench", "ort_run.mjs"), spec["model"], "--input",
                           f"input_ids={ids}", "--input", f"attention_mask={mask}", "--output-dir", out_dir,
                           "--threads", str(a.threads)], capture_output=True, text=True)
    if done.returncode != 0:
        return f"not checked (ort_run.mjs failed: {done.stderr.strip()})"
    mine, theirs = np.load(ondine_out), np.load(os.path.join(out_dir, "last_hidden_state.npy"))
    if mine.shape != theirs.shape:
        return f"shapes differ: Ondine {list(mine.shape)}, ONNX Runtime {list(theirs.shape)}"
    diff = float(np.max(np.abs(mine.astype(np.float64) - theirs)))
    return (f"request 0 (length {length}), last_hidden_state {list(mine.shape)}: max |diff| {diff:.3e}, "
            f"relative to max |ort| {diff / float(np.max(np.abs(theirs))):.3e}")


def check_decode(rounds):
    lines = []
    for k, (d, o) in enumerate(rounds):
        if not d or not o:
            lines.append(f"round {k + 1}: not checked (an engine failed)")
            continue
        ref = o["runs"][0]["tokens"]
        for name, j in (("Ondine", d), ("ONNX Runtime", o)):
            for rep, run in enumerate(j["runs"]):
                same = sum(x == y for x, y in zip(run["tokens"], ref))
                if name == "ONNX Runtime" and rep == 0:
                    continue
                lines.append(f"round {k + 1}: {name} repeat {rep + 1}: {same}/{len(ref)} tokens as ONNX Runtime's "
                             f"repeat 1" + ("" if same == len(ref) else
                                            f" (first difference at step {next(i for i, (x, y) in enumerate(zip(run['tokens'], ref)) if x != y)})"))
    first = next(((d, o) for d, o in rounds if d and o), None)
    if first:
        lines.append(f"tokens (ONNX Runtime): {first[1]['runs'][0]['tokens']}")
        lines.append(f"tokens (Ondine):       {first[0]['runs'][0]['tokens']}")
    return "\n".join(lines)


def machine():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--models-dir", default="models")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workload", default="encoder,decode")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cache-size", type=int, default=None)
    p.add_argument("--kv", choices=["cache", "feed"], default="cache")
    p.add_argument("--weight-only", choices=["int8", "fp32"], default="int8")
    p.add_argument("--decode-model", default=None,
                   help="the decode workload's model: a name under MODELS_DIR/torch or an .onnx path (default gpt2_kv_pt)")
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--engine", choices=["ondine"], help=argparse.SUPPRESS)  # one engine run: the driver's child
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--save-output", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.engine:
        return run_ondine_engine(a)

    workloads = [w.strip() for w in a.workload.split(",") if w.strip()]
    for w in workloads:
        if w not in MODELS:
            sys.exit(f"dynamic_shapes: unknown workload '{w}' (encoder, decode)")
    if not 1 <= a.requests <= 200:
        sys.exit("dynamic_shapes: --requests must be within 1..200")
    if a.steps < 1 or a.prompt < 1 or a.repeats < 1 or a.rounds < 1:
        sys.exit("dynamic_shapes: --prompt, --steps, --repeats and --rounds must be at least 1")
    if not glob.glob(os.path.join(a.build, "python", "ondine*.so")):
        sys.exit(f"dynamic_shapes: no Python module in {a.build}/python; build it: "
                 "cmake --build build --target ondine_python")
    if not os.path.isdir(os.path.join(REPO, "bench", "node_modules", "onnxruntime-node")):
        sys.exit("dynamic_shapes: onnxruntime-node is not installed: cd bench && npm ci --onnxruntime-node-install=skip")
    if subprocess.run(["pgrep", "-x", "cc1plus"], capture_output=True).returncode == 0:
        print("dynamic_shapes: warning: a compiler (cc1plus) is running: the numbers are taken on a busy machine",
              file=sys.stderr)

    print(f"command: {shlex.join(['/usr/bin/python3'] + sys.argv)}")
    print(f"machine: {machine()}; threads {a.threads}; {a.rounds} round(s); {time.strftime('%Y-%m-%d %H:%M')}")
    everything = {"args": vars(a), "workloads": {}}
    with tempfile.TemporaryDirectory(prefix="dynamic_shapes.") as tmp:
        for w in workloads:
            model = os.path.abspath(os.path.join(a.models_dir, "torch", MODELS[w], "model.onnx"))
            if w == "decode" and a.decode_model:
                model = os.path.abspath(a.decode_model if a.decode_model.endswith(".onnx") else
                                        os.path.join(a.models_dir, "torch", a.decode_model, "model.onnx"))
            if not os.path.exists(model):
                sys.exit(f"dynamic_shapes: {model}: no such file; make it with: /usr/bin/python3 "
                         f"scripts/make_models.py --torch-bench --which hf_bert_pt,gpt2_kv_pt")
            if w == "encoder":
                lengths = np.random.default_rng(0).integers(8, 257, size=200).tolist()[:a.requests]
                spec = {"mode": "encoder", "model": model, "lengths": lengths}
            else:
                spec = {"mode": "decode", "model": model, "prompt": a.prompt, "steps": a.steps, "repeats": a.repeats,
                        "report_pasts": report_pasts(a.prompt, a.steps), "kv": a.kv, "weight_only": a.weight_only}
                if a.weight_only == "fp32":  # both engines multiply the weight-only layers in float32
                    spec["session_config"] = {"session": {"qdq_matmulnbits_accuracy_level": "0"}}
            spec_path = os.path.join(tmp, f"{w}.spec.json")
            with open(spec_path, "w") as f:
                json.dump(spec, f)
            raw = []
            check = None
            ondine_out = os.path.join(tmp, "ondine.request0.npy")
            for k in range(a.rounds):
                cmd = [sys.executable, os.path.abspath(__file__), "--engine", "ondine", "--spec", spec_path, "--build",
                       a.build, "--threads", str(a.threads)]
                if a.cache_size is not None:
                    cmd += ["--cache-size", str(a.cache_size)]
                if w == "encoder" and k == 0:
                    cmd += ["--save-output", ondine_out]
                d = run_json("ondine", cmd, a.timeout)
                o = run_json("onnxruntime", ["node", os.path.join(REPO, "bench", "ort_stream.mjs"), "--spec", spec_path,
                                             "--threads", str(a.threads)], a.timeout)
                raw.append((d, o))
                print(f"  {w} round {k + 1}/{a.rounds}: ondine {'ok' if d else 'FAILED'}, "
                      f"onnxruntime {'ok' if o else 'FAILED'}", file=sys.stderr)
                if w == "encoder" and k == 0:
                    check = check_encoder(a, spec, ondine_out, tmp)
            everything["workloads"][w] = {"spec": spec, "rounds": [{"ondine": d, "onnxruntime": o} for d, o in raw]}
            ondine_runs = [d for d, _ in raw if d]
            ort_runs = [o for _, o in raw if o]
            compile_s = med([d["compile_s"] for d in ondine_runs])
            load_s = med([o["load_s"] for o in ort_runs])
            print()
            if w == "encoder":
                rounds = [(flatten_encoder(d, lengths), flatten_encoder(o, lengths)) for d, o in raw]
                new, seen = new_vs_seen(lengths, [0] * len(lengths))[2:]
                print(f"### encoder stream: hf_bert_pt, batch 1, {len(lengths)} requests of lengths "
                      f"{min(lengths)}..{max(lengths)} ({len(set(lengths))} distinct), threads {a.threads}, "
                      f"median of {a.rounds} round(s)\n")
                print(table([(f"total, {len(lengths)} requests (s)", "total_s", 3), ("p50 latency (ms)", "p50_ms", 2),
                             ("p99 latency (ms)", "p99_ms", 2),
                             (f"ms per token, new lengths ({new} requests)", "new_ms_tok", 4),
                             (f"ms per token, lengths seen before ({seen} requests)", "seen_ms_tok", 4)], rounds))
                print()
                comp = med([d["compilations_in_stream"] for d in ondine_runs])
                warm = med([d["warmup_ms"][0] for d in ondine_runs])
                print(f"Ondine: ondine.compile {fmt(compile_s, 3)} s (not in the totals); first warm-up request "
                      f"(length 64) {fmt(warm)} ms; {fmt(comp, 0)} shape compilation(s) during the stream; "
                      f"version {ondine_runs[0]['version'] if ondine_runs else '?'}")
                print(f"ONNX Runtime: session creation {fmt(load_s, 3)} s (not in the totals); onnxruntime-node "
                      f"{ort_runs[0]['version'] if ort_runs else '?'}")
                print(f"check: {check}")
            else:
                rounds = [(flatten_decode(d), flatten_decode(o)) for d, o in raw]
                pasts = spec["report_pasts"]
                label = os.path.relpath(model, os.path.join(a.models_dir, "torch")) if a.decode_model else MODELS[w]
                print(f"### decode: {label}, batch 1, prompt {a.prompt} tokens then {a.steps} steps of one token, "
                      f"Ondine's KV cache {'in place (Model.kv_cache)' if a.kv == 'cache' else 'fed back as pasts'}, "
                      f"threads {a.threads}; per round the median of {a.repeats} decode(s), then the median of "
                      f"{a.rounds} round(s)\n")
                print(table([(f"prompt ({a.prompt} tokens, empty past) (ms)", "prompt_ms", 2),
                             ("per token p50 (ms)", "p50_ms", 2), ("per token p90 (ms)", "p90_ms", 2)] +
                            [(f"token at past {p} (ms)", f"past{p}", 2) for p in pasts], rounds))
                print("\nEach decode by itself (median over rounds):\n")
                rows = []
                for rep in range(a.repeats):
                    rows += [(f"decode {rep + 1}: prompt (ms)", f"rep{rep}_prompt_ms", 2),
                             (f"decode {rep + 1}: per token p50 (ms)", f"rep{rep}_p50_ms", 2),
                             (f"decode {rep + 1}: per token p90 (ms)", f"rep{rep}_p90_ms", 2)]
                print(table(rows, rounds))
                print()
                comps = [[run["compilations"] for run in d["runs"]] for d in ondine_runs]
                print(f"Ondine: ondine.compile {fmt(compile_s, 3)} s (not in the times); shape compilations per decode "
                      f"(round 1): {comps[0] if comps else '?'}; version "
                      f"{ondine_runs[0]['version'] if ondine_runs else '?'}")
                print(f"ONNX Runtime: session creation {fmt(load_s, 3)} s (not in the times); onnxruntime-node "
                      f"{ort_runs[0]['version'] if ort_runs else '?'}")
                print("check: decode tokens\n" + check_decode(raw[:1]))
            print()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(everything, f)
        print(f"measurements: {a.json}")


if __name__ == "__main__":
    main()
