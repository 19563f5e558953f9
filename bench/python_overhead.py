#!/usr/bin/python3
"""What a Python call of Model.run costs on top of the C++ call it makes (docs/python.md states the result).

Usage (Debian's Python, the module on PYTHONPATH):
    PYTHONPATH=build/python /usr/bin/python3 bench/python_overhead.py [MODEL.onnx] [--batch 1,8] [--threads 1]
        [--runs 2000] [--rounds 5]

Default model: tests/data/mnist/mnist_cnn.onnx (a small CNN: the call's fixed costs are a visible share of
it). Per batch size and round: `runs` calls of ShapeCache::run timed in C++ (Model._time_native: the same
inputs as tensors already, no Python), then `runs` calls of m.run({...}) and of m.run(None, {...}) timed in
Python with time.perf_counter. The three alternate per round, so load on the machine hits them alike; a
result is the median over rounds of each round's median. The overhead is Python's median minus C++'s: the
feed dict read through the buffer protocol, the GIL released and taken back, the outputs wrapped as numpy
arrays over Ondine's buffers (no copy), the dict or list built.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

import ondine

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_ms(call, runs):
    ms = []
    for _ in range(runs):
        t0 = time.perf_counter()
        call()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default=os.path.join(REPO, "tests", "data", "mnist", "mnist_cnn.onnx"))
    p.add_argument("--batch", default="1,8")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()

    m = ondine.compile(a.model, threads=a.threads)
    if len(m.inputs) != 1 or m.inputs[0][1] != "float32":
        sys.exit("python_overhead: expects a model with one float32 input (batch as its first dim)")
    name, _, shape = m.inputs[0]
    rng = np.random.default_rng(0)
    print(f"model: {a.model}, threads {a.threads}, {a.rounds} rounds x {a.runs} calls, median of round medians")
    print(f"{'batch':>5} {'C++ run':>12} {'run(dict)':>12} {'run(None,)':>12} {'overhead':>10}")
    for batch in (int(b) for b in a.batch.split(",")):
        sizes = [batch if not isinstance(d, int) else d for d in shape]
        feeds = {name: rng.standard_normal(sizes).astype(np.float32)}
        m.run(feeds)  # compiles this shape
        native, as_dict, as_list = [], [], []
        for _ in range(a.rounds):
            native.append(statistics.median(m._time_native(feeds, a.runs)))
            as_dict.append(python_ms(lambda: m.run(feeds), a.runs))
            as_list.append(python_ms(lambda: m.run(None, feeds), a.runs))
        n, d, l = statistics.median(native), statistics.median(as_dict), statistics.median(as_list)
        print(f"{batch:>5} {n * 1e3:>9.1f} us {d * 1e3:>9.1f} us {l * 1e3:>9.1f} us {(d - n) * 1e3:>7.1f} us")


if __name__ == "__main__":
    main()
