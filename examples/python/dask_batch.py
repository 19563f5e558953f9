#!/usr/bin/python3
"""Score a folder of inputs with one compiled model on a Dask cluster, and write each file's outputs beside it.

Usage (Debian's Python with python3-distributed, the module on PYTHONPATH: the build tree's python/ folder or an
installed prefix):
    PYTHONPATH=build/python /usr/bin/python3 examples/python/dask_batch.py MODEL INPUT_DIR
        [--scheduler tcp://HOST:8786 | --workers 2 --threads-per-worker 1] [--files-per-task 4]
        [--window-seconds 5 --sample-rate 32000] [--streams N (no Dask)]

MODEL is an ONNX file (compiled here, once) or an artifact (`ondine compile MODEL.onnx -o MODEL.ondine`). The
model travels to the workers as its compiled artifact (a Model pickles as one; a worker refuses an artifact
for an ISA it lacks with the artifact's error) and is loaded once per worker: it is scattered to every
worker, and the tasks that score files take the worker's copy.

Inputs: `*.npy` files, each one feed of the model's single input, and `*.wav` files (16-bit PCM, mono), each
cut into windows of --window-seconds at --sample-rate (the last window zero-padded), each window a request of
[1, samples], the outputs stacked per file (the bird classifier of scripts/make_models.py: raw audio in,
logits per window out).
Each input FILE gets FILE_STEM.OUTPUT.npy beside it (`*.out.*.npy` files are never taken as inputs).

Without --scheduler, a LocalCluster of --workers processes runs here. A worker that dies is replaced and its
files scored again by Dask (tasks are pure: same inputs, same outputs). With --streams N there is no Dask: this
process scores the folder from N streams of one thread each (Model.run_many), the same outputs.
"""
import argparse
import os
import sys
import time
import wave

import numpy as np

import ondine


def list_inputs(folder):
    names = sorted(os.listdir(folder))
    return [os.path.join(folder, n) for n in names
            if (n.endswith(".npy") or n.endswith(".wav")) and ".out." not in n]


def read_wav(path, sample_rate):
    with wave.open(path, "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError(f"{path}: 16-bit mono PCM expected, got {8 * w.getsampwidth()}-bit, "
                             f"{w.getnchannels()} channels")
        if w.getframerate() != sample_rate:
            raise ValueError(f"{path}: sampled at {w.getframerate()} Hz, the model takes {sample_rate} Hz")
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    audio = pcm.astype(np.float32)
    audio *= 1.0 / 32768.0  # in place: Dask's workers return freed memory eagerly, so each allocation costs
    return audio


def feeds_of(model, path, window_seconds, sample_rate):
    """The model's feeds for one input file: the .npy as it is, or each window of the recording as a request of
    batch 1 (every request the same shape: one compiled plan, and requests that spread evenly over streams)."""
    name = model.inputs[0][0]
    if path.endswith(".npy"):
        return [{name: np.load(path)}]
    audio = read_wav(path, sample_rate)
    window = int(window_seconds * sample_rate)
    feeds = [{name: audio[start:start + window][None, :]} for start in range(0, audio.size - window + 1, window)]
    if audio.size % window or not feeds:  # the last window zero-padded (the full ones are views of the audio)
        last = np.zeros((1, window), np.float32)
        rest = audio[len(feeds) * window:]
        last[0, :rest.size] = rest
        feeds.append({name: last})
    return feeds


def output_paths(model, path):
    stem = path[:-4]
    return {name: f"{stem}.out.{name}.npy" for name, _, _ in model.outputs}


def score_files(paths, model, window_seconds=5.0, sample_rate=32000, streams=1):
    """Scores `paths` with `model` (the worker's copy) and writes the outputs beside them; returns the paths."""
    per_file = [feeds_of(model, p, window_seconds, sample_rate) for p in paths]
    # One stream: the requests one after the other with the model's threads (a Dask worker's share of the
    # cores); more: streams of one thread each.
    results = model.run_many([f for feeds in per_file for f in feeds], streams=streams,
                             threads=streams if streams > 1 else 0)
    at = 0
    for path, feeds in zip(paths, per_file):
        parts, at = results[at:at + len(feeds)], at + len(feeds)
        outputs = parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        for name, out_path in output_paths(model, path).items():
            tmp = out_path + ".tmp.npy"
            np.save(tmp, outputs[name])
            os.replace(tmp, out_path)  # a retried task never leaves a half-written file
    return paths


def load_model(path, threads):
    if path.endswith(".ondine"):
        return ondine.load(path, threads=threads)
    return ondine.compile(path, threads=threads)


def score_folder(client, model, inputs, files_per_task=4, window_seconds=5.0, sample_rate=32000, progress=True):
    """Scores `inputs` on the cluster behind `client`; returns the number of files scored."""
    from distributed import as_completed

    model_on_workers = client.scatter(model, broadcast=True)  # pickled once as an artifact, loaded once per worker
    parts = [inputs[i:i + files_per_task] for i in range(0, len(inputs), files_per_task)]
    futures = client.map(score_files, parts, model=model_on_workers, window_seconds=window_seconds,
                         sample_rate=sample_rate, pure=False)
    done = 0
    start = time.perf_counter()
    for future in as_completed(futures):
        done += len(future.result())
        if progress:
            rate = done / max(time.perf_counter() - start, 1e-9)
            print(f"\rscored {done}/{len(inputs)} files ({rate:.1f} files/s)", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return done


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("inputs", help="folder of .npy or .wav inputs")
    parser.add_argument("--scheduler", help="address of a running Dask scheduler (default: a LocalCluster here)")
    parser.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    parser.add_argument("--threads-per-worker", type=int, default=1, help="LocalCluster threads per worker, "
                        "also the model's threads")
    parser.add_argument("--files-per-task", type=int, default=4)
    parser.add_argument("--window-seconds", type=float, default=5.0)
    parser.add_argument("--sample-rate", type=int, default=32000)
    parser.add_argument("--streams", type=int, default=0, help="no Dask: this process, N streams of one thread")
    args = parser.parse_args(argv)

    inputs = list_inputs(args.inputs)
    if not inputs:
        sys.exit(f"dask_batch: no .npy or .wav inputs in {args.inputs}")
    if args.streams > 0:
        model = load_model(args.model, 1)
        start = time.perf_counter()
        score_files(inputs, model, args.window_seconds, args.sample_rate, streams=args.streams)
        seconds = time.perf_counter() - start
        print(f"{len(inputs)} files in {seconds:.2f} s: {len(inputs) / seconds:.2f} files/s on {args.streams} streams")
        return

    from distributed import Client, LocalCluster

    model = load_model(args.model, args.threads_per_worker)
    cluster = None
    if args.scheduler:
        client = Client(args.scheduler)
    else:
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=args.threads_per_worker,
                               processes=True, dashboard_address=None)
        client = Client(cluster)
    try:
        start = time.perf_counter()
        n = score_folder(client, model, inputs, args.files_per_task, args.window_seconds, args.sample_rate)
        seconds = time.perf_counter() - start
        print(f"{n} files in {seconds:.2f} s: {n / seconds:.2f} files/s on "
              f"{len(client.scheduler_info()['workers'])} workers")
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


if __name__ == "__main__":
    main()
