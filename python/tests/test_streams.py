"""Throughput from Python (CTest's `python_module`): Model.run_many from streams of threads of their own, and a
Model pickled as its compiled artifact, as Dask sends it to workers (python/tests/test_dask.py runs the cluster).

Needs PYTHONPATH to hold the built module and ONDINE_TEST_DATA_DIR the repository's tests/data (CTest sets both).
"""
import os
import pickle
import threading

import numpy as np
import pytest

import ondine

DATA = os.environ.get("ONDINE_TEST_DATA_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data"))
MNIST = os.path.join(DATA, "mnist", "mnist_cnn.onnx")
GPT = os.path.join(DATA, "torch", "gpt_decoder")


def feeds_of(images, sizes):
    out, at = [], 0
    for n in sizes:
        out.append({"input": images[at:at + n]})
        at += n
    return out


@pytest.fixture(scope="module")
def images():
    return np.load(os.path.join(DATA, "mnist", "test_images.npy"))[:40]


def test_run_many_equals_run_in_order(images):
    model = ondine.compile(MNIST, threads=1)
    feeds = feeds_of(images, [1, 3, 2, 1, 4, 1, 2, 6, 1, 3])
    many = model.run_many(feeds, streams=2, threads=2)
    assert len(many) == len(feeds)
    for feed, got in zip(feeds, many):
        assert np.array_equal(got["logits"], model.run(feed)["logits"])
    # Streams of another thread count than the model's run plans of their own, equal within float rounding.
    two = ondine.compile(MNIST, threads=2)
    for feed, got in zip(feeds, two.run_many(feeds, streams=2, threads=2)):
        np.testing.assert_allclose(got["logits"], model.run(feed)["logits"], rtol=0, atol=1e-5)
    assert model.run_many([], streams=2) == []


def test_run_many_releases_the_gil(images):
    model = ondine.compile(MNIST, threads=1)
    feeds = feeds_of(images, [8] * 5) * 100  # a few hundred ms of runs
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)
            stop.wait(0.001)

    t = threading.Thread(target=tick)
    t.start()
    model.run_many(feeds, streams=2, threads=2)
    stop.set()
    t.join()
    assert len(ticks) > 10  # the other Python thread ran while the streams did


def test_run_many_errors_raise_or_return(images):
    model = ondine.compile(MNIST, threads=1)
    feeds = feeds_of(images, [1, 2, 1, 1])
    feeds[2] = {"input": np.zeros((1, 1, 27, 28), np.float32)}
    with pytest.raises(ondine.Error, match="request 2 of 4"):
        model.run_many(feeds, streams=2, threads=2)
    results = model.run_many(feeds, streams=2, threads=2, errors="return")
    assert isinstance(results[2], ondine.Error) and "request 2 of 4" in str(results[2])
    assert "mnist_cnn.onnx" in results[2].file
    for i in (0, 1, 3):
        assert np.array_equal(results[i]["logits"], model.run(feeds[i])["logits"])
    with pytest.raises(ValueError, match="errors"):
        model.run_many(feeds, errors="ignore")
    with pytest.raises(ondine.Error, match="not an input"):
        model.run_many([{"image": images[:1]}])


def test_pickle_is_the_artifact(images, tmp_path):
    model = ondine.compile(MNIST, threads=1)
    clone = pickle.loads(pickle.dumps(model))
    assert clone.source.endswith("mnist_cnn.onnx (pickled)")
    assert clone.threads == 1
    assert np.array_equal(clone.run({"input": images[:5]})["logits"], model.run({"input": images[:5]})["logits"])
    # A model loaded from an artifact pickles that artifact's bytes.
    path = str(tmp_path / "mnist.ondine")
    model.save(path)
    loaded = ondine.load(path, threads=1)
    data = pickle.dumps(loaded)
    assert len(data) >= os.path.getsize(path)
    again = pickle.loads(data)
    assert np.array_equal(again.run({"input": images[:3]})["logits"], loaded.run({"input": images[:3]})["logits"])
    # A transformer with symbolic dims keeps running any length after the round trip.
    gpt = ondine.compile(os.path.join(GPT, "model.onnx"), threads=1)
    gpt2 = pickle.loads(pickle.dumps(gpt))
    for case in ("case0", "case1"):
        ids = np.load(os.path.join(GPT, f"{case}.input_ids.npy"))
        np.testing.assert_allclose(gpt2.run({"input_ids": ids})["logits"], gpt.run({"input_ids": ids})["logits"],
                                   rtol=0, atol=1e-5)


def unpickle(state):
    """What pickle.loads does with a Model's state."""
    m = ondine.Model.__new__(ondine.Model)
    m.__setstate__(state)
    return m


def test_unpickling_damaged_bytes_is_an_error_naming_the_model():
    model = ondine.compile(MNIST, threads=1)
    state = model.__getstate__()
    data = bytearray(state[0])
    data[len(data) // 2] ^= 0xFF
    with pytest.raises(ondine.Error, match=r"mnist_cnn\.onnx \(pickled\)"):
        unpickle((bytes(data),) + state[1:])
    with pytest.raises(ondine.Error, match=r"\(pickled\)"):
        unpickle((b"not an artifact",) + state[1:])


def test_pickled_artifact_for_an_isa_the_machine_lacks_is_refused(tmp_path):
    """A Dask worker on a lesser CPU refuses the model with the artifact's error, not a crash: here a process
    with oneDNN capped below this CPU's ISA (DNNL_MAX_CPU_ISA=SSE41, below every ISA Ondine compiles for)."""
    import subprocess
    import sys

    path = tmp_path / "mnist.pickle"
    path.write_bytes(pickle.dumps(ondine.compile(MNIST, threads=1)))
    env = dict(os.environ, DNNL_MAX_CPU_ISA="SSE41")
    done = subprocess.run([sys.executable, "-c", f"import pickle; pickle.loads(open({str(path)!r}, 'rb').read())"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr  # an exception, not a signal
    assert "ondine.Error" in done.stderr and "(pickled)" in done.stderr, done.stderr
