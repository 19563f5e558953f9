#!/usr/bin/python3
"""Compare an output against a reference output, both .npy files.

Usage (Debian's Python with python3-numpy):
    /usr/bin/python3 bench/compare_npy.py ACTUAL.npy EXPECTED.npy [--rtol 1e-4] [--metric max|elementwise]
        [--atol-floor 1e-3]

B (EXPECTED) is the reference, e.g. ONNX Runtime's output; A (ACTUAL) is the output under test.
Both are compared in float64. Printed metrics:
  max_abs_err      max |A - B|
  rel_to_max       max |A - B| / max |B|: the error relative to the output's scale (the default
                   pass/fail criterion, "--metric max"). It is not inflated by elements of B near zero.
  max_elem_rel     max over elements of |A - B| / max(|B|, floor), floor = --atol-floor * max |B|: the
                   elementwise relative error, with an absolute floor so that elements near zero do
                   not dominate ("--metric elementwise" makes this the criterion).
  cosine           cosine similarity of A and B flattened (1 for parallel).
The comparison fails (exit status 1) when the chosen metric exceeds --rtol, when the shapes differ, or
when A and B disagree on where NaN/Inf values are. Exit status 2: a file cannot be read.
"""

import argparse
import sys

import numpy as np


def compare(actual, expected, atol_floor):
    a = actual.astype(np.float64).ravel()
    b = expected.astype(np.float64).ravel()
    finite = np.isfinite(a) & np.isfinite(b)
    # Non-finite values must match exactly (same NaN positions, same infinities).
    nonfinite_mismatch = int(np.sum(~finite & ~((np.isnan(a) & np.isnan(b)) | (a == b))))
    a, b = a[finite], b[finite]
    if a.size == 0:
        return {"elements": 0, "nonfinite_mismatch": nonfinite_mismatch, "max_abs_err": 0.0, "max_abs_ref": 0.0,
                "rel_to_max": 0.0, "max_elem_rel": 0.0, "worst": "-", "cosine": 1.0}
    diff = np.abs(a - b)
    max_abs_ref = float(np.abs(b).max())
    scale = max_abs_ref if max_abs_ref > 0 else 1.0
    elem_rel = diff / np.maximum(np.abs(b), atol_floor * scale)
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    cosine = float(np.dot(a, b) / norms) if norms > 0 else (1.0 if not diff.any() else 0.0)
    worst = int(np.argmax(diff))
    return {
        "elements": int(a.size),
        "nonfinite_mismatch": nonfinite_mismatch,
        "max_abs_err": float(diff.max()),
        "max_abs_ref": max_abs_ref,
        "rel_to_max": float(diff.max()) / scale,
        "max_elem_rel": float(elem_rel.max()),
        "worst": "at {}: A {:.6g} B {:.6g}".format(
            tuple(int(i) for i in np.unravel_index(np.flatnonzero(finite)[worst], expected.shape)),
            a[worst], b[worst]),
        "cosine": cosine,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("actual", help="A: the output under test")
    parser.add_argument("expected", help="B: the reference output")
    parser.add_argument("--rtol", type=float, default=1e-4, help="tolerance for the chosen metric (default 1e-4)")
    parser.add_argument("--metric", choices=["max", "elementwise"], default="max",
                        help="max: rel_to_max (default); elementwise: max_elem_rel")
    parser.add_argument("--atol-floor", type=float, default=1e-3,
                        help="floor of the elementwise denominator, as a fraction of max|B| (default 1e-3)")
    args = parser.parse_args()

    try:
        actual, expected = np.load(args.actual), np.load(args.expected)
    except (OSError, ValueError) as e:
        print(f"compare_npy: {e}", file=sys.stderr)
        return 2

    print(f"A {args.actual}: {list(actual.shape)} {actual.dtype}")
    print(f"B {args.expected}: {list(expected.shape)} {expected.dtype}")
    if actual.shape != expected.shape:
        print(f"FAIL: shapes differ, {list(actual.shape)} vs {list(expected.shape)}")
        return 1
    if actual.dtype != expected.dtype:
        print(f"note: dtypes differ ({actual.dtype} vs {expected.dtype}); comparing as float64")

    r = compare(actual, expected, args.atol_floor)
    print(f"max_abs_err  {r['max_abs_err']:.6g}   (max|B| {r['max_abs_ref']:.6g}; worst {r['worst']})")
    print(f"rel_to_max   {r['rel_to_max']:.6g}   (max|A-B| / max|B|)")
    print(f"max_elem_rel {r['max_elem_rel']:.6g}   (|A-B| / max(|B|, {args.atol_floor:g}*max|B|))")
    print(f"cosine       {r['cosine']:.9f}")

    metric = "rel_to_max" if args.metric == "max" else "max_elem_rel"
    problems = []
    if r["nonfinite_mismatch"]:
        problems.append(f"{r['nonfinite_mismatch']} elements differ in NaN/Inf")
    if not r[metric] <= args.rtol:  # also catches a NaN metric
        problems.append(f"{metric} {r[metric]:.3g} > rtol {args.rtol:g}")
    if problems:
        print("FAIL: " + "; ".join(problems))
        return 1
    print(f"PASS: {metric} {r[metric]:.3g} <= rtol {args.rtol:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
