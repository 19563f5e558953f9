#!/usr/bin/python3
"""Write seeded synthetic "field recordings": 16-bit mono PCM WAV files at 32 kHz.

They are input data for examples/python/dask_batch.py (which cuts each .wav into 5-second windows and scores
them with the bird classifier of scripts/make_models.py, tests/data/torch/bird_classifier/model.onnx: raw
32 kHz audio in, logits per window out) and for the streams benchmark of that classifier: files of different
lengths give batches of different sizes (2 to 8 windows, the last one zero-padded).

Usage (Debian's Python with python3-numpy; the WAV files are written with the standard library's wave module):
    /usr/bin/python3 scripts/make_recordings.py --out DIR [--count 16] [--seed 0]
        [--min-seconds 10] [--max-seconds 40] [--sample-rate 32000]

writes DIR/rec_000.wav, DIR/rec_001.wav, ... Each recording has a length drawn uniformly from
[--min-seconds, --max-seconds] and is a mixture of:
  - background noise: white noise through a first-order low-pass (wind-like), at a random level;
  - "calls": linear or exponential frequency sweeps (chirps, 1-12 kHz) with a smooth envelope, some repeated
    in short trills;
  - harmonic tones: a 0.5-4 kHz fundamental with 2-5 harmonics of decreasing amplitude and a slow vibrato;
  - noise bursts: white noise band-limited (FFT mask) to a random band, with a sharp attack and a decay;
then scaled so the peak is 0.5-0.9 of full scale and written as 16-bit PCM. Recording K draws from its own
generator seeded by (--seed, K): a larger --count keeps the files of a smaller one. Only .wav files are
written (dask_batch.py takes every .npy and .wav in the folder as an input).
"""

import argparse
import math
import os
import sys
import wave

import numpy as np


def fast_length(n):
    """The next power of two from n: numpy's FFT of a length with a large prime factor is slow."""
    return 1 << max(0, int(n - 1).bit_length())


def envelope(rng, n):
    """A smooth attack-sustain-release window of n samples."""
    attack = max(1, int(n * rng.uniform(0.05, 0.3)))
    release = max(1, int(n * rng.uniform(0.1, 0.5)))
    env = np.ones(n)
    env[:attack] = np.sin(0.5 * math.pi * np.arange(attack) / attack) ** 2
    env[n - release:] *= np.cos(0.5 * math.pi * np.arange(release) / release) ** 2
    return env


def chirp(rng, n, sample_rate):
    """A linear or exponential sweep between two frequencies in 1-12 kHz."""
    t = np.arange(n) / sample_rate
    duration = n / sample_rate
    f0, f1 = rng.uniform(1000.0, 12000.0, size=2)
    if rng.random() < 0.5:
        phase = 2 * math.pi * (f0 * t + 0.5 * (f1 - f0) * t * t / duration)
    else:
        k = math.log(f1 / f0) / duration
        phase = 2 * math.pi * f0 * (np.exp(k * t) - 1.0) / k
    return np.sin(phase) * envelope(rng, n)


def harmonic_tone(rng, n, sample_rate):
    """A fundamental with a few harmonics (amplitude 1/h) and a slow vibrato, below the Nyquist frequency."""
    t = np.arange(n) / sample_rate
    f0 = rng.uniform(500.0, 4000.0)
    vibrato = rng.uniform(0.0, 0.03) * np.sin(2 * math.pi * rng.uniform(3.0, 12.0) * t)
    phase = 2 * math.pi * f0 * np.cumsum(1.0 + vibrato) / sample_rate
    out = np.zeros(n)
    for h in range(1, int(rng.integers(2, 6)) + 1):
        if h * f0 * 1.05 < sample_rate / 2:
            out += np.sin(h * phase + rng.uniform(0, 2 * math.pi)) / h
    return out * envelope(rng, n)


def noise_burst(rng, n, sample_rate):
    """White noise kept to a random band (FFT mask), with a sharp attack and an exponential decay."""
    size = fast_length(n)
    spectrum = np.fft.rfft(rng.standard_normal(size))
    freqs = np.fft.rfftfreq(size, 1.0 / sample_rate)
    low = rng.uniform(200.0, 10000.0)
    high = min(low * rng.uniform(1.3, 4.0), sample_rate / 2)
    spectrum[(freqs < low) | (freqs > high)] = 0.0
    burst = np.fft.irfft(spectrum, size)[:n]
    burst /= np.abs(burst).max() + 1e-12
    decay = np.exp(-np.arange(n) / (n * rng.uniform(0.1, 0.5)))
    attack = np.minimum(1.0, np.arange(n) / max(1.0, 0.005 * sample_rate))
    return burst * decay * attack


def background(rng, n, sample_rate):
    """Wind-like noise: white noise through a first-order low-pass (corner 100-2000 Hz, applied as an FFT
    mask), normalised to unit peak."""
    size = fast_length(n)
    spectrum = np.fft.rfft(rng.standard_normal(size))
    corner = rng.uniform(100.0, 2000.0)
    spectrum /= np.sqrt(1.0 + (np.fft.rfftfreq(size, 1.0 / sample_rate) / corner) ** 2)
    out = np.fft.irfft(spectrum, size)[:n]
    return out / (np.abs(out).max() + 1e-12)


def recording(rng, samples, sample_rate):
    """One synthetic recording as float64 in [-1, 1]."""
    audio = rng.uniform(0.01, 0.1) * background(rng, samples, sample_rate)
    seconds = samples / sample_rate
    events = int(rng.integers(max(2, int(seconds / 4)), max(3, int(seconds)) + 1))
    for _ in range(events):
        kind = rng.choice(["chirp", "tone", "burst"], p=[0.45, 0.35, 0.2])
        if kind == "chirp":
            length = int(rng.uniform(0.05, 0.6) * sample_rate)
            repeats = int(rng.integers(1, 7))  # a trill: the same call a few times with short gaps
            gap = int(rng.uniform(0.02, 0.15) * sample_rate)
            call = chirp(rng, length, sample_rate)
            event = np.concatenate([np.concatenate([call, np.zeros(gap)]) for _ in range(repeats)])
        elif kind == "tone":
            event = harmonic_tone(rng, int(rng.uniform(0.2, 2.5) * sample_rate), sample_rate)
        else:
            event = noise_burst(rng, int(rng.uniform(0.05, 0.8) * sample_rate), sample_rate)
        event = event[:samples]
        start = int(rng.integers(0, samples - event.size + 1))
        audio[start:start + event.size] += rng.uniform(0.1, 1.0) * event
    return audio * (rng.uniform(0.5, 0.9) / (np.abs(audio).max() + 1e-12))


def write_wav(path, audio, sample_rate):
    pcm = np.clip(np.round(audio * 32767.0), -32768, 32767).astype("<i2")
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm.tobytes())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", required=True, help="folder to write rec_NNN.wav into (created if missing)")
    parser.add_argument("--count", type=int, default=16, help="number of recordings (default 16)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-seconds", type=float, default=10.0)
    parser.add_argument("--max-seconds", type=float, default=40.0)
    parser.add_argument("--sample-rate", type=int, default=32000, help="Hz (default 32000, the classifier's)")
    args = parser.parse_args()
    if args.count < 0:
        parser.error("--count must be 0 or more")
    if not 0 < args.min_seconds <= args.max_seconds:
        parser.error("need 0 < --min-seconds <= --max-seconds")
    if args.sample_rate < 8000:
        parser.error("--sample-rate must be at least 8000 Hz")

    os.makedirs(args.out, exist_ok=True)
    total = 0.0
    for index in range(args.count):
        rng = np.random.default_rng([args.seed, index])
        seconds = rng.uniform(args.min_seconds, args.max_seconds)
        samples = int(round(seconds * args.sample_rate))
        audio = recording(rng, samples, args.sample_rate)
        path = os.path.join(args.out, f"rec_{index:03d}.wav")
        write_wav(path, audio, args.sample_rate)
        total += seconds
        print(f"{path}: {seconds:.2f} s, {samples} samples, peak {np.abs(audio).max():.2f}, "
              f"rms {np.sqrt(np.mean(audio ** 2)):.3f}")
    print(f"{args.count} recordings, {total:.1f} s of audio at {args.sample_rate} Hz in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
