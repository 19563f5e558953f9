#!/usr/bin/python3
"""Every torchvision model through Ondine, as a user would bring it: a robustness sweep, not a test.

Usage (Debian's Python with python3-torch and python3-torchvision; needs a build with the `ondine` tool):
    /usr/bin/python3 scripts/sweep_torchvision.py [--which resnet18,swin_t,...] [--opset 16] [--out out/sweep]
        [--build build] [--tolerance 1e-3] [--timeout 900] [--peers RUNS]

Each model is built with random weights (torch.manual_seed per model; nothing is downloaded), put in eval
mode and exported as users export it: torch.onnx.export with input/output names and a dynamic batch axis
(detectors: one image, no batch axis), default settings otherwise. The script then runs the file with
`ondine run --input ... --output-dir` (the compiled engine) on the very input PyTorch saw and compares every
output with PyTorch's: max |ondine - torch| / max |torch| against --tolerance. One line per model: export
failed (a PyTorch limitation, not Ondine's), compile/run failed (the first error line: an Ondine bug or a
missing op), wrong numbers, or ok with the error and the run time. Detector outputs whose length depends on
the data (boxes after NMS) are compared only when their shapes agree; detectors are built without a score
threshold, so that random weights still detect (the best boxes after NMS, up to detections_per_img), and
where random weights tie scores (which tied boxes survive is arbitrary) only the distinct score values
must agree.
With --peers RUNS, each file is also timed on ONNX Runtime and on Ondine (one after the other, 2 threads)
and the line ends with the ratio of the medians: a quick screen for slow paths, not bench/peers.py's
interleaved rounds.
"""

import argparse
import os
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (input shape, kind): "classify" (batch axis), "segment" (dict output 'out'), "detect" (list of
# images in, list of dicts out: no batch axis), "video" (N, C, T, H, W), "flow" (two images).
MODELS = {
    "alexnet": ((1, 3, 224, 224), "classify"),
    "resnet18": ((1, 3, 224, 224), "classify"),
    "resnet34": ((1, 3, 224, 224), "classify"),
    "vgg11_bn": ((1, 3, 224, 224), "classify"),
    "squeezenet1_1": ((1, 3, 224, 224), "classify"),
    "shufflenet_v2_x1_0": ((1, 3, 224, 224), "classify"),
    "googlenet": ((1, 3, 224, 224), "classify"),
    "inception_v3": ((1, 3, 299, 299), "classify"),
    "densenet121": ((1, 3, 224, 224), "classify"),
    "mnasnet1_0": ((1, 3, 224, 224), "classify"),
    "mobilenet_v3_small": ((1, 3, 224, 224), "classify"),
    "regnet_y_400mf": ((1, 3, 224, 224), "classify"),
    "resnext50_32x4d": ((1, 3, 224, 224), "classify"),
    "wide_resnet50_2": ((1, 3, 224, 224), "classify"),
    "efficientnet_v2_s": ((1, 3, 224, 224), "classify"),
    "convnext_small": ((1, 3, 224, 224), "classify"),
    "vit_b_32": ((1, 3, 224, 224), "classify"),
    "swin_t": ((1, 3, 224, 224), "classify"),
    "swin_v2_t": ((1, 3, 256, 256), "classify"),
    "maxvit_t": ((1, 3, 224, 224), "classify"),
    "fcn_resnet50": ((1, 3, 256, 256), "segment"),
    "deeplabv3_resnet50": ((1, 3, 256, 256), "segment"),
    "r3d_18": ((1, 3, 8, 112, 112), "video"),
    "mc3_18": ((1, 3, 8, 112, 112), "video"),
    "r2plus1d_18": ((1, 3, 8, 112, 112), "video"),
    "s3d": ((1, 3, 16, 224, 224), "video"),
    "mvit_v2_s": ((1, 3, 16, 224, 224), "video"),
    "fasterrcnn_mobilenet_v3_large_320_fpn": ((3, 320, 320), "detect"),
    "retinanet_resnet50_fpn": ((3, 320, 320), "detect"),
    "fcos_resnet50_fpn": ((3, 320, 320), "detect"),
    "ssd300_vgg16": ((3, 300, 300), "detect"),
    "maskrcnn_resnet50_fpn": ((3, 320, 320), "detect"),
    "keypointrcnn_resnet50_fpn": ((3, 320, 320), "detect"),
    "raft_small": ((1, 3, 128, 128), "flow"),
}


SCORE_THRESHOLD = {
    "fasterrcnn_mobilenet_v3_large_320_fpn": {"box_score_thresh": 0.0},
    "maskrcnn_resnet50_fpn": {"box_score_thresh": 0.0},
    "keypointrcnn_resnet50_fpn": {"box_score_thresh": 0.0},
    "retinanet_resnet50_fpn": {"score_thresh": 0.0},
    "fcos_resnet50_fpn": {"score_thresh": 0.0},
    "ssd300_vgg16": {"score_thresh": 0.0},
}


class Wrap:
    """Outputs as a flat tuple of tensors (segmenters return a dict, detectors a list of dicts)."""

    def __init__(self, torch, model, kind):
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, *x):
                if kind == "detect":
                    out = self.m([x[0]])[0]
                    return tuple(out[k] for k in sorted(out))
                if kind == "flow":
                    return self.m(x[0], x[1], num_flow_updates=4)[-1]
                y = self.m(*x)
                if isinstance(y, dict):
                    return y["out"]
                return y

        self.module = M().eval()


def export(torch, tv, name, shape, kind, opset, path):
    torch.manual_seed(sum(map(ord, name)))
    kwargs = {"weights": None}
    if name in ("googlenet", "inception_v3"):
        kwargs.update(aux_logits=False, init_weights=True)
    if kind in ("detect", "segment"):
        kwargs.update(weights_backbone=None)  # else torchvision downloads the ImageNet backbone
    if kind == "detect":
        # Random weights score every box low: with the default thresholds (0.05, 0.2 for FCOS and
        # RetinaNet) nothing survives and the outputs are empty. No score threshold keeps the best
        # detections_per_img boxes after NMS, so the boxes, scores and labels are really compared.
        kwargs.update(SCORE_THRESHOLD.get(name, {}))
    model = tv.models.get_model(name, **kwargs).eval()
    wrap = Wrap(torch, model, kind).module
    rng = np.random.default_rng(0)
    if kind == "detect":
        xs = [rng.uniform(0, 1, shape).astype(np.float32)]
    elif kind == "flow":
        xs = [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(2)]
    else:
        xs = [rng.standard_normal(shape).astype(np.float32)]
    names = [f"x{i}" for i in range(len(xs))]
    with torch.no_grad():
        ys = wrap(*[torch.from_numpy(x) for x in xs])
    ys = [ys] if isinstance(ys, torch.Tensor) else list(ys)
    out_names = [f"y{i}" for i in range(len(ys))]
    dynamic = None if kind == "detect" else {n: {0: "batch"} for n in names + out_names}
    if kind == "detect":
        # torchvision 0.14 exports MultiScaleRoIAlign's roi_align(aligned=False) without a
        # coordinate_transformation_mode, which RoiAlign-16 reads as half_pixel (aligned=True): at opset 16
        # the file is not the PyTorch model (ONNX Runtime agrees with Ondine, not with PyTorch). torchvision
        # documents its detectors' export at opset 11.
        opset = min(opset, 11)
    torch.onnx.export(wrap, tuple(torch.from_numpy(x) for x in xs), path, input_names=names, output_names=out_names,
                      dynamic_axes=dynamic, opset_version=opset)
    return dict(zip(names, xs)), dict(zip(out_names, [y.numpy() for y in ys]))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--which", default=",".join(MODELS))
    p.add_argument("--opset", type=int, default=16)
    p.add_argument("--out", default=os.path.join(REPO, "out", "sweep"))
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--tolerance", type=float, default=1e-3)
    p.add_argument("--timeout", type=int, default=900, help="seconds per ondine run")
    p.add_argument("--peers", type=int, default=0, metavar="RUNS",
                   help="also time ONNX Runtime (bench/ort_run.mjs) and Ondine on the file, RUNS runs each, 2 threads, "
                        "one engine at a time, and print ORT median / Ondine median (needs bench/node_modules)")
    a = p.parse_args()
    import torch
    import torchvision as tv
    torch.set_num_threads(2)
    ondine = os.path.join(a.build, "examples", "ondine")
    os.makedirs(a.out, exist_ok=True)
    for name in [n for n in a.which.split(",") if n]:
        if name not in MODELS:
            sys.exit(f"sweep: unknown model '{name}' (known: {', '.join(MODELS)})")
        shape, kind = MODELS[name]
        d = os.path.join(a.out, name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "model.onnx")
        try:
            t0 = time.time()
            inputs, want = export(torch, tv, name, shape, kind, a.opset, path)
            export_s = time.time() - t0
        except Exception as e:  # noqa: BLE001 - a PyTorch export limit is a result of the sweep
            print(f"{name:40s} export failed: {str(e).splitlines()[0][:160]}", flush=True)
            continue
        cmd = [ondine, "run", path, "--output-dir", os.path.join(d, "got")]
        for n, x in inputs.items():
            np.save(os.path.join(d, f"{n}.npy"), x)
            cmd += ["--input", f"{n}={os.path.join(d, n + '.npy')}"]
        t0 = time.time()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            print(f"{name:40s} ondine run: timed out after {a.timeout} s", flush=True)
            continue
        run_s = time.time() - t0
        if done.returncode != 0:
            err = [ln for ln in (done.stderr + done.stdout).splitlines() if "error" in ln.lower()] or \
                (done.stderr + done.stdout).splitlines()[-1:]
            print(f"{name:40s} ondine run failed (exit {done.returncode}): {err[0][:300] if err else '?'}", flush=True)
            continue
        worst, notes = 0.0, []
        for n, y in want.items():
            got_path = os.path.join(d, "got", f"{n}.npy")
            if not os.path.exists(got_path):
                notes.append(f"{n} missing")
                continue
            g = np.load(got_path)
            if g.shape != y.shape:
                notes.append(f"{n} shape {list(g.shape)} vs torch {list(y.shape)}")
                continue
            if y.size == 0:
                continue
            scale = max(float(np.abs(y.astype(np.float64)).max()), 1e-30)
            worst = max(worst, float(np.abs(g.astype(np.float64) - y.astype(np.float64)).max()) / scale)
        status = "ok" if worst <= a.tolerance and not notes else "WRONG"
        if status == "WRONG" and kind == "detect" and not notes:
            status = tied_detections(want, d, a.tolerance) or status
        bench = [ln for ln in done.stdout.splitlines() if ln.startswith("benchmark:")]
        median = bench[0].split("median=")[1].split()[0] if bench else "?"
        peers = ""
        if a.peers:
            peers = "; " + time_peers(ondine, path, inputs, d, a.peers, a.timeout)
        print(f"{name:40s} {status}: max err {worst:.2e} of max|torch|{'; ' + ', '.join(notes) if notes else ''} "
              f"(export {export_s:.0f} s, ondine run {run_s:.1f} s, median {median} ms{peers})", flush=True)


def tied_detections(want, d, tolerance):
    """For a detector whose rows differ from PyTorch's: "ok (...)" when the difference is only the order or
    choice among tied or near-tied scores, else None. Random weights give many boxes the same score, or
    scores a float rounding apart (1e-5 relative: the order of a convolution's sums), and which of them
    survive NMS and the top-k, and in which order, is arbitrary (ONNX Runtime picks others again). With
    ties in PyTorch's scores (the last output; values within 1e-6 of the scale are one) it is enough that
    the distinct values agree; else the scores sorted must agree, and every row that differs must have a
    score within 1e-4 of the scale of another row's."""
    names = list(want)
    scores_torch = want[names[-1]].astype(np.float64).ravel()
    scores_got = np.load(os.path.join(d, "got", f"{names[-1]}.npy")).astype(np.float64).ravel()
    if scores_got.shape != scores_torch.shape or scores_torch.size == 0:
        return None
    scale = max(float(np.abs(scores_torch).max()), 1e-30)

    def distinct(v):  # the sorted values, those within 1e-6 of the scale of the previous one merged (float jitter)
        v = np.sort(v)
        return v[np.concatenate([[True], np.diff(v) > 1e-6 * scale])]

    distinct_torch, distinct_got = distinct(scores_torch), distinct(scores_got)
    if len(distinct_torch) < scores_torch.size:  # ties: which tied boxes survive is arbitrary
        if distinct_got.shape == distinct_torch.shape and \
                float(np.abs(distinct_got - distinct_torch).max()) / scale <= tolerance:
            return f"ok (tied: {len(distinct_torch)} distinct scores; boxes differ among tied ones)"
    if float(np.abs(np.sort(scores_got) - np.sort(scores_torch)).max()) / scale > tolerance:
        return None
    rows = scores_torch.size
    differing = np.zeros(rows, dtype=bool)
    for n, y in want.items():
        g = np.load(os.path.join(d, "got", f"{n}.npy"))
        if g.shape != y.shape or y.shape[:1] != (rows,):
            return None
        y_scale = max(float(np.abs(y.astype(np.float64)).max()), 1e-30)
        err = np.abs(g.astype(np.float64) - y.astype(np.float64)).reshape(rows, -1).max(axis=1) / y_scale
        differing |= err > tolerance
    order = np.sort(scores_torch)
    gaps = np.diff(order)
    near = np.zeros(rows, dtype=bool)  # per sorted position: a neighbour within 1e-4 of the scale
    near[:-1] |= gaps <= 1e-4 * scale
    near[1:] |= gaps <= 1e-4 * scale
    near_tied = near[np.searchsorted(order, scores_torch)]
    if not np.all(near_tied[differing]):
        return None
    return f"ok (near-tied scores: {int(differing.sum())} of {rows} rows ordered differently)"


def time_peers(ondine, path, inputs, d, runs, timeout):
    """Ondine's and ONNX Runtime's median latency on the file (2 threads each, one after the other)."""
    feeds = []
    for n in inputs:
        feeds += ["--input", f"{n}={os.path.join(d, n + '.npy')}"]
    try:
        done = subprocess.run([ondine, "run", path, "--threads", "2", "--runs", str(runs)] + feeds,
                              capture_output=True, text=True, timeout=timeout)
        line = [ln for ln in done.stdout.splitlines() if ln.startswith("benchmark:")]
        ours = float(line[0].split("median=")[1].split()[0])
        done = subprocess.run(["node", os.path.join(REPO, "bench", "ort_run.mjs"), path, "--threads", "2",
                               "--iterations", str(runs), "--warmup", "3", "--output-dir", os.path.join(d, "ort")] + feeds,
                              capture_output=True, text=True, timeout=timeout)
        theirs = float(done.stdout.split('"median_ms":')[1].split(",")[0])
    except (subprocess.TimeoutExpired, IndexError, ValueError) as e:
        return f"peers: timing failed ({type(e).__name__})"
    return f"ORT {theirs:.1f} ms, Ondine {ours:.1f} ms: {theirs / ours:.2f}x"


if __name__ == "__main__":
    main()
