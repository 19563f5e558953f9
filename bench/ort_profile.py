#!/usr/bin/python3
"""ONNX Runtime's time per op type and per node, from the profile `node bench/ort_run.mjs --profile PREFIX` writes,
to set beside `ondine bench --profile` (which prints the same for Ondine).

Usage: /usr/bin/python3 bench/ort_profile.py PREFIX_<date>.json [--nodes N]

The trace holds one "model_run" event per run (warm-up runs included) and one "<node>_kernel_time" event per
node and run; times are the mean over the runs after the first (the first one also allocates)."""

import argparse
import collections
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--nodes", type=int, default=10, help="also the N slowest nodes (default 10)")
    args = parser.parse_args()
    with open(args.trace) as f:
        events = json.load(f)
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    if not runs:
        sys.exit(f"{args.trace}: no model_run events (an ONNX Runtime profile from ort_run.mjs --profile?)")
    first_end = runs[0]["ts"] + runs[0]["dur"]
    timed = runs[1:] or runs
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
               and (len(runs) == 1 or e["ts"] >= first_end)]
    per_op, per_node = collections.defaultdict(float), collections.defaultdict(float)
    count = collections.Counter()
    for e in kernels:
        op = e.get("args", {}).get("op_name", "?")
        per_op[op] += e["dur"] / 1000.0 / len(timed)
        node = e["name"][: -len("_kernel_time")]
        per_node[(node, op)] += e["dur"] / 1000.0 / len(timed)
        count[op] += 1
    run_ms = sum(r["dur"] for r in timed) / 1000.0 / len(timed)
    print(f"{args.trace}: {len(timed)} runs, {run_ms:.3f} ms per run (model_run)")
    for op, ms in sorted(per_op.items(), key=lambda kv: -kv[1]):
        print(f"  {op:<24} {count[op] // len(timed):5d} nodes {ms:10.3f} ms {100.0 * ms / run_ms:6.1f}%")
    print(f"  outside nodes {run_ms - sum(per_op.values()):.3f} ms")
    if args.nodes:
        print(f"slowest {args.nodes} nodes:")
        for (node, op), ms in sorted(per_node.items(), key=lambda kv: -kv[1])[: args.nodes]:
            print(f"  {ms:10.3f} ms  {op:<16} {node}")


if __name__ == "__main__":
    main()
