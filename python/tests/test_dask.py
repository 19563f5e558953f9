"""examples/python/dask_batch.py on a 2-worker Dask LocalCluster (CTest's `python_dask`): every output equals a
single-process run bit for bit, and a worker killed mid-batch loses no output. Skipped, saying why, only where
Dask's `distributed` is not installed (scripts/install-deps.sh installs python3-distributed).

Needs PYTHONPATH to hold the built module and ONDINE_TEST_DATA_DIR the repository's tests/data (CTest sets both).
"""
import os
import pickle
import signal
import sys
import threading
import time

import numpy as np
import pytest

import ondine

distributed = pytest.importorskip("distributed", reason="Dask's distributed is not installed (python3-distributed)")
import cloudpickle  # noqa: E402  (distributed depends on it)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DATA = os.environ.get("ONDINE_TEST_DATA_DIR", os.path.join(REPO, "tests", "data"))
MNIST = os.path.join(DATA, "mnist", "mnist_cnn.onnx")

sys.path.insert(0, os.path.join(REPO, "examples", "python"))
import dask_batch  # noqa: E402
# The example is not importable on the workers: its functions travel by value, as a script's do.
cloudpickle.register_pickle_by_value(dask_batch)


def write_inputs(folder, count):
    images = np.load(os.path.join(DATA, "mnist", "test_images.npy"))
    paths = []
    for i in range(count):
        path = os.path.join(folder, f"digits_{i:03d}.npy")
        np.save(path, images[i:i + 1 + i % 3])
        paths.append(path)
    return paths


def check_outputs(model, paths):
    for path in paths:
        want = model.run({"input": np.load(path)})["logits"]
        got = np.load(path[:-4] + ".out.logits.npy")
        assert got.dtype == want.dtype and np.array_equal(got, want), path


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        with distributed.Client(c) as client:
            yield client


def test_folder_scored_on_two_workers_equals_one_process(cluster, tmp_path):
    paths = write_inputs(str(tmp_path), 12)
    model = ondine.compile(MNIST, threads=1)
    assert dask_batch.list_inputs(str(tmp_path)) == paths
    assert dask_batch.score_folder(cluster, model, paths, files_per_task=3, progress=False) == len(paths)
    check_outputs(model, paths)
    # Written outputs are never inputs of the next run.
    assert dask_batch.list_inputs(str(tmp_path)) == paths


def slow_score(paths, model):
    time.sleep(0.4)  # long enough for the test to kill a worker while tasks run
    return dask_batch.score_files(paths, model)


cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_worker_killed_mid_batch_loses_no_output(cluster, tmp_path):
    paths = write_inputs(str(tmp_path), 10)
    model = ondine.compile(MNIST, threads=1)
    on_workers = cluster.scatter(model, broadcast=True)
    futures = cluster.map(slow_score, [[p] for p in paths], model=on_workers, pure=False)
    time.sleep(0.6)  # a task or two done; others running
    pids = cluster.run(os.getpid)
    victim = sorted(pids.values())[0]
    os.kill(victim, signal.SIGKILL)
    done = [f.result(timeout=120) for f in futures]
    assert sorted(p for part in done for p in part) == paths
    check_outputs(model, paths)


def unpickle(state):
    m = ondine.Model.__new__(ondine.Model)
    m.__setstate__(state)
    return m


def test_model_refused_where_unpickled_is_an_error_not_a_crash(cluster):
    state = ondine.compile(MNIST, threads=1).__getstate__()
    damaged = bytearray(state[0])
    damaged[100:108] = b"\xff" * 8
    future = cluster.submit(unpickle, (bytes(damaged),) + state[1:], pure=False)
    with pytest.raises(Exception, match=r"pickled"):
        future.result(timeout=60)


def test_recordings_scored_by_streams_and_by_workers_alike(cluster, tmp_path):
    """The audio example end to end: synthetic recordings cut into 5-second windows, scored by the bird
    classifier from two streams here and on the two workers; both equal per-window runs bit for bit."""
    import subprocess

    folder = tmp_path / "recordings"
    subprocess.run([sys.executable, os.path.join(REPO, "scripts", "make_recordings.py"), "--out", str(folder),
                    "--count", "3", "--min-seconds", "6", "--max-seconds", "12"], check=True,
                   stdout=subprocess.DEVNULL)
    onnx = os.path.join(DATA, "torch", "bird_classifier", "model.onnx")
    inputs = dask_batch.list_inputs(str(folder))
    assert len(inputs) == 3 and all(p.endswith(".wav") for p in inputs)
    model = ondine.compile(onnx, threads=1)
    want = {}
    for p in inputs:
        feeds = dask_batch.feeds_of(model, p, 5.0, 32000)
        assert len(feeds) >= 2 and feeds[0]["audio"].shape == (1, 160000)
        want[p] = np.concatenate([model.run(f)["logits"] for f in feeds])

    def check():
        for p in inputs:
            got = np.load(p[:-4] + ".out.logits.npy")
            assert np.array_equal(got, want[p]), p
            os.remove(p[:-4] + ".out.logits.npy")

    dask_batch.main([onnx, str(folder), "--streams", "2"])
    check()
    assert dask_batch.score_folder(cluster, model, inputs, files_per_task=1, progress=False) == 3
    check()
