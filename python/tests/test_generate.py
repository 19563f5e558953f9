"""ondine.generate and weight-only quantization from Python (python/ondine_module.cpp), on the exported
Llama-style decoder (tests/data/torch/llama_kv): greedy tokens equal PyTorch's, sampling is seeded and
bounded by top_k/top_p, `ondine.quantize(weights=...)` writes a model that compiles to the weight-only
kernel and stays close to the float one, and bad arguments raise.

Run by CTest's `python_module` (PYTHONPATH holds the built module, ONDINE_TEST_DATA_DIR tests/data).
"""
import os

import numpy as np
import pytest

import ondine

DATA = os.environ.get("ONDINE_TEST_DATA_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data"))
LLAMA = os.path.join(DATA, "torch", "llama_kv")


@pytest.fixture(scope="module")
def llama():
    return ondine.compile(os.path.join(LLAMA, "model.onnx"), threads=2)


def test_greedy_tokens_are_pytorchs(llama):
    prompt, tokens = np.load(os.path.join(LLAMA, "decode.prompt.npy")), np.load(os.path.join(LLAMA, "decode.tokens.npy"))
    seen = []
    r = ondine.generate(llama, prompt, max_new_tokens=len(tokens), on_token=seen.append)
    assert r["tokens"].tolist() == tokens.tolist()
    assert seen == tokens.tolist()
    assert len(r["token_ms"]) == len(tokens) - 1 and r["tokens_per_s"] > 0 and r["prompt_ms"] > 0
    assert llama.compilations == 0  # one shape-free plan for every length


def test_sampling_is_seeded_and_bounded(llama):
    prompt = np.array([3, 17, 29, 41], np.int64)
    a = ondine.generate(llama, prompt, max_new_tokens=12, temperature=1.0, seed=7)["tokens"]
    b = ondine.generate(llama, prompt, max_new_tokens=12, temperature=1.0, seed=7)["tokens"]
    assert a.tolist() == b.tolist()
    greedy = ondine.generate(llama, prompt, max_new_tokens=12)["tokens"]
    assert ondine.generate(llama, prompt, max_new_tokens=12, temperature=0.8, top_k=1, seed=3)["tokens"].tolist() == greedy.tolist()
    assert ondine.generate(llama, prompt, max_new_tokens=12, temperature=0.8, top_p=1e-6, seed=3)["tokens"].tolist() == greedy.tolist()
    stop = ondine.generate(llama, prompt, max_new_tokens=12, on_token=lambda t: False)["tokens"]
    assert len(stop) == 1
    # eos_token_id: the run stops after emitting it (greedy here repeats one token: it stops at once).
    assert ondine.generate(llama, prompt, max_new_tokens=12, eos_token_id=int(greedy[0]))["tokens"].tolist() == greedy[:1].tolist()
    unused = next(t for t in range(128) if t not in greedy.tolist())
    assert ondine.generate(llama, prompt, max_new_tokens=12, eos_token_id=unused)["tokens"].tolist() == greedy.tolist()


def test_weight_only_quantize_compiles_to_the_weight_only_kernel(tmp_path, llama):
    out = str(tmp_path / "llama_int4.onnx")
    report = ondine.quantize(os.path.join(LLAMA, "model.onnx"), weights="int4", block_size=16, output=out)
    assert len(report["quantized"]) >= 8 and report["bytes_after"] * 4 < report["bytes_before"]
    m = ondine.compile(out, threads=2)
    assert m.shape_plan.startswith("shape-free")
    feeds = {os.path.basename(f)[len("case1."):-4]: np.load(f)
             for f in sorted(__import__("glob").glob(os.path.join(LLAMA, "case1.*.npy"))) if ".out." not in f}
    want = np.load(os.path.join(LLAMA, "case1.out.logits.npy"))
    got = m.run(feeds)["logits"]
    assert np.abs(got - want).max() / np.abs(want).max() < 0.3
    assert np.abs(got - want).max() > 0  # quantized: not the float model
    r = ondine.generate(m, np.load(os.path.join(LLAMA, "decode.prompt.npy")), max_new_tokens=8)
    assert len(r["tokens"]) == 8
    # An artifact keeps the 4-bit weights (one per byte) and runs the same.
    m.save(str(tmp_path / "llama_int4.ondine"))
    loaded = ondine.load(str(tmp_path / "llama_int4.ondine"), threads=2)
    assert np.abs(loaded.run(feeds)["logits"] - got).max() <= 1e-5 * np.abs(got).max()
    # exact_weight_only=True: float32 activations, the file's own arithmetic (its DequantizeLinear + MatMul run
    # unfused with passes="none"); the default quantizes them to int8 per block, within its rounding.
    unfused = ondine.compile(out, threads=2, passes="none").run(feeds)["logits"]
    exact = ondine.compile(out, threads=2, exact_weight_only=True).run(feeds)["logits"]
    assert np.abs(exact - unfused).max() <= 1e-5 * np.abs(unfused).max()
    assert 0 < np.abs(got - unfused).max() <= 0.05 * np.abs(unfused).max()
    with pytest.raises(ondine.Error, match="exact_weight_only"):
        ondine.compile(str(tmp_path / "llama_int4.ondine"), exact_weight_only=True)


def test_bad_arguments_raise(tmp_path, llama):
    with pytest.raises(ondine.Error, match="int4 or int8|'int4' or 'int8'"):
        ondine.quantize(os.path.join(LLAMA, "model.onnx"), weights="int3", output=str(tmp_path / "x.onnx"))
    with pytest.raises(ondine.Error, match="without calibration"):
        ondine.quantize(os.path.join(LLAMA, "model.onnx"), weights="int4", calibration=[], output=str(tmp_path / "x.onnx"))
    with pytest.raises(ondine.Error, match="one sequence"):
        ondine.generate(llama, np.zeros((2, 3), np.int64))
    with pytest.raises(ondine.Error, match="top_p"):
        ondine.generate(llama, np.array([1, 2]), top_p=0.0)
    with pytest.raises(ondine.Error, match="prompt is empty"):
        ondine.generate(llama, np.zeros((0,), np.int64))
    mnist = ondine.compile(os.path.join(DATA, "mnist", "mnist_cnn.onnx"))
    with pytest.raises(ondine.Error, match="input_ids|past input|none of"):
        ondine.generate(mnist, np.array([1, 2]))
