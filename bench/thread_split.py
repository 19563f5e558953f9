#!/usr/bin/env python3
"""Latency of each test-corpus model (tests/data/torch, its case0 inputs) compiled for 2 threads and for 1,
interleaved: where the fork and join of every step costs more than the second thread saves (the tuner's
`threads` knob, docs/performance.md "Small models: fewer threads").

    PYTHONPATH=build/python /usr/bin/python3 bench/thread_split.py [--rounds 3] [--runs 30] [--models a,b]
"""
import argparse
import glob
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def median_ms(model, feed, runs):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        model.run(feed)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--models", default="", help="comma-separated names (default: every corpus model)")
    ap.add_argument("--corpus", default=os.path.join(ROOT, "tests", "data", "torch"))
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "build", "python"))
    import ondine

    names = args.models.split(",") if args.models else sorted(os.listdir(args.corpus))
    print("| model | 2 threads ms | 1 thread ms | 1 thread faster by |")
    print("|---|---|---|---|")
    for name in names:
        d = os.path.join(args.corpus, name)
        feed = {os.path.basename(f)[len("case0."):-len(".npy")]: np.load(f)
                for f in glob.glob(os.path.join(d, "case0.*.npy")) if ".out." not in f}
        try:
            models = {t: ondine.compile(os.path.join(d, "model.onnx"), threads=t) for t in (2, 1)}
            for m in models.values():
                m.run(feed)
            times = {2: [], 1: []}
            for _ in range(args.rounds):
                for t in (2, 1):
                    times[t].append(median_ms(models[t], feed, args.runs))
        except ondine.Error as e:
            print(f"| {name} | skipped: {str(e)[:80]} | | |")
            continue
        two, one = statistics.median(times[2]), statistics.median(times[1])
        print(f"| {name} | {two:.3f} | {one:.3f} | {two / one:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
