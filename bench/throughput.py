#!/usr/bin/python3
"""Throughput of N streams against ONNX Runtime run from N concurrent sessions, on this machine's cores.

Usage (Debian's Python; a build with the examples, node with bench/node_modules, and models/):
    /usr/bin/python3 bench/throughput.py [--threads 2] [--rounds 3] [--requests 200]
        [--models mobilenetv2,resnet50,bird_classifier] [--batch 1] [--build build] [--models-dir models] [--json FILE]

For every model, each round runs, one after the other (so that load changes hit every engine alike):
  ondine 1x1   `ondine bench --streams 1 --threads 1`: one stream of one thread (the unit of the goal)
  ondine 1xT   `--streams 1 --threads T`: every thread on one request at a time (the latency hint)
  ondine Tx1   `--streams T --threads T`: T streams of one thread, pinned to cores of their own
  ort Tx1      bench/ort_run.mjs --concurrent T --threads 1: T sessions of one intra-op thread, each on a
               worker thread of its own, taking requests from one counter (ONNX Runtime's way to serve
               requests at once; onnxruntime-node runs a session on the JavaScript thread)
  ort 1xT      one session of T intra-op threads, one request at a time
Rates are medians over rounds; "streams/ideal" is ondine Tx1 over T times ondine 1x1 (1.0: streams as
independent as separate machines); "vs ort" is the median of the rounds' own Tx1 ratios. The last column is
the peak RSS of T streams and of one (the weights are packed once whatever the streams).
peers.py --throughput runs this with its --threads, --rounds and --models.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (model paths, seeded inputs, JSON from a command's last line)

REPO = peers.REPO


def ondine_run(exe, model, inputs_dir, streams, threads, requests, batch, dims=()):
    out = os.path.join(inputs_dir, "ondine.json")
    cmd = [exe, "bench", model, "--streams", str(streams), "--threads", str(threads), "--requests", str(requests),
           "--warmup", "5", "--json", out] + list(dims)
    if batch > 1:
        cmd += ["--batch", str(batch)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"throughput: failed: {' '.join(cmd)}\n{done.stderr.strip()}")
    with open(out) as f:
        return json.load(f)


def ort_run(model, specs, concurrent, threads, requests):
    cmd = ["node", os.path.join(REPO, "bench", "ort_run.mjs"), model, "--threads", str(threads),
           "--iterations", str(requests), "--warmup", "5"]
    for s in specs:
        cmd += ["--input", s]
    if concurrent > 1:
        cmd += ["--concurrent", str(concurrent)]
        return peers.run_json(cmd)["requests_per_s"]
    return 1000.0 / peers.run_json(cmd)["median_ms"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2, help="T: the cores used, by the streams or one run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=200, help="requests per measurement of T streams")
    p.add_argument("--models", default="mobilenetv2,resnet50,bird_classifier")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--models-dir", default=os.path.join(REPO, "models"))
    p.add_argument("--json", help="also write the table as JSON to this file")
    a = p.parse_args()
    exe = os.path.join(a.build, "examples", "ondine")
    if not os.access(exe, os.X_OK):
        sys.exit(f"throughput: {exe} missing; build the target ondine_cli in {a.build}")
    if not shutil.which("node"):
        sys.exit("throughput: node not found (ONNX Runtime runs through bench/ort_run.mjs)")
    t = a.threads
    tmp = tempfile.mkdtemp(prefix="ondine-throughput-")
    rows = []
    try:
        for m in [m for m in a.models.split(",") if m]:
            if m not in peers.INPUTS:
                sys.exit(f"throughput: unknown model '{m}' (known: {', '.join(peers.INPUTS)})")
            path = peers.model_path(a.models_dir, m)
            if not os.path.exists(path):
                sys.exit(f"throughput: {path} missing; run /usr/bin/python3 scripts/make_models.py --out models")
            specs = peers.write_input(m, a.batch, tmp)
            _, kind, seq = peers.INPUTS[m]
            dims = ["--dim", "batch", "--dim", f"samples={seq}"] if kind == "audio" else []
            per = {k: [] for k in ("1x1", "1xT", "Tx1", "ort Tx1", "ort 1xT", "ratio")}
            rss = {}
            for r in range(a.rounds):
                one = ondine_run(exe, path, tmp, 1, 1, max(a.requests // t, 20), a.batch, dims)
                per["1x1"].append(one["samples_per_s"])
                rss[1] = one["peak_rss_mib"]
                per["1xT"].append(ondine_run(exe, path, tmp, 1, t, max(a.requests // t, 20), a.batch, dims)["samples_per_s"])
                streams = ondine_run(exe, path, tmp, t, t, a.requests, a.batch, dims)
                per["Tx1"].append(streams["samples_per_s"])
                rss[t] = streams["peak_rss_mib"]
                ort = ort_run(path, specs, t, 1, a.requests) * a.batch
                per["ort Tx1"].append(ort)
                per["ort 1xT"].append(ort_run(path, specs, 1, t, max(a.requests // t, 20)) * a.batch)
                per["ratio"].append(streams["samples_per_s"] / ort)
                print(f"  {m} round {r + 1}: ondine {t}x1 {streams['samples_per_s']:.1f}/s, ort {t}x1 {ort:.1f}/s",
                      file=sys.stderr)
            med = {k: statistics.median(v) for k, v in per.items()}
            rows.append({"model": m, "batch": a.batch, "threads": t, **{k + "_per_s": v for k, v in med.items()
                                                                          if k != "ratio"},
                         "streams_over_ideal": med["Tx1"] / (t * med["1x1"]), "vs_ort": med["ratio"],
                         "vs_ort_range": [min(per["ratio"]), max(per["ratio"])], "rss_mib": rss})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"| model (batch {a.batch}) | ondine 1x1 | ondine 1x{t} | ondine {t}x1 streams | streams/ideal | "
          f"ort {t}x1 sessions | ondine/ort ({t}x1) | ort 1x{t} | peak RSS 1 / {t} streams |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['1x1_per_s']:.1f}/s | {r['1xT_per_s']:.1f}/s | {r['Tx1_per_s']:.1f}/s | "
              f"{r['streams_over_ideal']:.2f} | {r['ort Tx1_per_s']:.1f}/s | {r['vs_ort']:.2f}x "
              f"({r['vs_ort_range'][0]:.2f}-{r['vs_ort_range'][1]:.2f}) | {r['ort 1xT_per_s']:.1f}/s | "
              f"{r['rss_mib'].get(1, 0):.0f} / {r['rss_mib'].get(t, 0):.0f} MiB |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
