#!/usr/bin/env python3
"""weight_only_accuracy.py - how far a weight-only quantized decoder's logits are from its float32 file's, in
Ondine and in ONNX Runtime, on the same prompt.

Usage:
  /usr/bin/python3 bench/weight_only_accuracy.py [--fp32 models/torch/llama_kv_pt/model.onnx]
      [--quantized models/torch/llama_kv_pt/model_int4.onnx] [--prompt 128] [--threads 2] [--build build]

One prompt of --prompt tokens (ids 1 + 7 j mod 7999, as bench/dynamic_shapes.py's decode), empty pasts,
attention_mask ones and position_ids 0..L-1 where the model has them. The reference: ONNX Runtime on the
float32 file. Then the quantized file in ONNX Runtime at its default (the session's
qdq_matmulnbits_accuracy_level, 4: activations int8 per block) and at level 0 (float32 activations), and in
Ondine by default (int8 activations per block) and with exact_weight_only=True (float32 activations).
Reported per run: max |logits - reference| / max |reference| and the share of positions whose argmax is the
reference's. ONNX Runtime runs through bench/ort_run.mjs (onnxruntime-node, one engine at a time).
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def feeds_for(path, prompt):
    m = onnx.load(path, load_external_data=False)
    initializers = {t.name for t in m.graph.initializer}
    feeds = {}
    for i in m.graph.input:
        if i.name in initializers:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
        if i.name == "input_ids":
            feeds[i.name] = (1 + (np.arange(prompt, dtype=np.int64) * 7) % 7999).reshape(1, prompt)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((1, prompt), dtype=np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.arange(prompt, dtype=np.int64).reshape(1, prompt)
        elif "past" in i.name:  # [batch, heads, past, head_dim]: empty past
            feeds[i.name] = np.zeros([1, dims[1], 0, dims[3]], dtype=np.float32)
        else:
            sys.exit(f"weight_only_accuracy: {path}: no value for input '{i.name}'")
    return feeds


def ort_logits(path, feeds, tmp, threads, config=()):
    args = ["node", os.path.join(REPO, "bench", "ort_run.mjs"), path, "--threads", str(threads)]
    for name, value in feeds.items():
        f = os.path.join(tmp, name.replace("/", "_") + ".npy")
        np.save(f, value)
        args += ["--input", f"{name}={f}"]
    out = os.path.join(tmp, "out")
    os.makedirs(out, exist_ok=True)
    args += ["--output-dir", out]
    for c in config:
        args += ["--config", c]
    subprocess.run(args, check=True)
    return np.load(os.path.join(out, "logits.npy"))


def ondine_logits(ondine, path, feeds, threads, **kwargs):
    m = ondine.compile(path, threads=threads, **kwargs)
    return np.asarray(m.run(feeds)["logits"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fp32", default="models/torch/llama_kv_pt/model.onnx")
    p.add_argument("--quantized", default="models/torch/llama_kv_pt/model_int4.onnx")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--build", default="build")
    a = p.parse_args()
    sys.path.insert(0, os.path.join(os.path.abspath(a.build), "python"))
    import ondine

    feeds = feeds_for(a.fp32, a.prompt)
    with tempfile.TemporaryDirectory() as tmp:
        ref = ort_logits(a.fp32, feeds, tmp, a.threads)
        runs = [
            ("ONNX Runtime, default (accuracy level 4: int8 activations)", ort_logits(a.quantized, feeds, tmp, a.threads)),
            ("ONNX Runtime, accuracy level 0 (float32 activations)",
             ort_logits(a.quantized, feeds, tmp, a.threads, ["session.qdq_matmulnbits_accuracy_level=0"])),
        ]
    runs += [
        ("Ondine, default (int8 activations per block)", ondine_logits(ondine, a.quantized, feeds, a.threads)),
        ("Ondine, exact_weight_only=True (float32 activations)",
         ondine_logits(ondine, a.quantized, feeds, a.threads, exact_weight_only=True)),
        ("Ondine, the float32 file", ondine_logits(ondine, a.fp32, feeds, a.threads)),
    ]
    print(f"command: /usr/bin/python3 bench/weight_only_accuracy.py --fp32 {a.fp32} --quantized {a.quantized} "
          f"--prompt {a.prompt} --threads {a.threads}")
    print(f"reference: ONNX Runtime on {a.fp32}; logits {list(ref.shape)}, max |reference| {np.abs(ref).max():.4g}\n")
    print(f"| {os.path.basename(a.quantized)}, prompt of {a.prompt} tokens | max abs error / max abs reference | "
          f"argmax as the reference's |")
    print("|---|---|---|")
    top = ref.argmax(-1)
    for name, got in runs:
        err = np.abs(got - ref).max() / np.abs(ref).max()
        same = float((got.argmax(-1) == top).mean())
        print(f"| {name} | {err:.3e} | {100 * same:.1f}% |")


if __name__ == "__main__":
    main()
