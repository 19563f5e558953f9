#!/usr/bin/python3
"""Write Ondine's test models (ONNX, opset 13) with seeded random weights.

Usage (Debian's Python, which has python3-onnx and python3-numpy):
    /usr/bin/python3 scripts/make_models.py --out models [--which resnet50,mobilenetv2,bert]
        [--seed 0] [--inputs [--batch 1,8]] [--verify]
        [--bert-layers 4] [--bert-hidden 256] [--bert-heads 4] [--bert-seq 128] [--bert-vocab 8000]

Models (batch dimension symbolic, named "batch"):
  resnet50.onnx     torchvision ResNet-50 v1.5 layout; "input" f32 [batch,3,224,224] -> "logits" [batch,1000]
  mobilenetv2.onnx  torchvision MobileNetV2 (width 1.0), same input/output
  bert.onnx         BERT-style encoder; "input_ids" i64 [batch,seq] -> "last_hidden_state" [batch,seq,hidden];
                    LayerNorm and Gelu decomposed into primitive ops the way opset-13 exporters write them.

Node and initializer names follow torchvision / HuggingFace module paths ("layer1.0.conv1",
"layer1.0.bn1.running_var", "encoder.layer.0.attention.self.query.weight").

The weights are random but scaled so that activations stay well-conditioned through every layer: He
initialization for convolutions, BatchNorm gamma ~U(0.5, 1.5) except the last BN of each residual branch,
~U(0.1, 0.3), so the residual stream does not grow block after block; running var ~U(0.5, 1.5),
running mean ~N(0, 0.1). The logits come out with magnitudes of order 1 (see --verify), so a relative
comparison against another runtime is meaningful.

Each model draws from its own generator seeded by (--seed, model name): generating a subset with --which
gives the same weights as generating all of them.

--inputs writes a seeded random input per model and batch size: <model>.input.npy for batch 1 and
<model>.input.b<N>.npy otherwise (float32 image-like inputs, see make_input; int64 token ids in [0, vocab)).

--verify (needs --inputs, node and bench/node_modules) runs each model with ONNX Runtime through
bench/ort_run.mjs and checks that the outputs are finite and of sensible magnitude.
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13
BATCH = "batch"
BN_EPSILON = 1e-5
LN_EPSILON = 1e-12

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class GraphBuilder:
    """Collects nodes and initializers; every node's output value is named after the node."""

    def __init__(self, rng):
        self.rng = rng
        self.nodes = []
        self.initializers = []
        self.param_count = 0

    # -- initializers -----------------------------------------------------------------------------
    def add_initializer(self, name, array):
        self.initializers.append(numpy_helper.from_array(array, name))
        self.param_count += array.size
        return name

    def normal(self, name, shape, std, mean=0.0):
        return self.add_initializer(name, self.rng.normal(mean, std, size=shape).astype(np.float32))

    def uniform(self, name, shape, low, high):
        return self.add_initializer(name, self.rng.uniform(low, high, size=shape).astype(np.float32))

    def constant(self, name, values, dtype=np.float32):
        return self.add_initializer(name, np.asarray(values, dtype=dtype))

    # -- nodes --------------------------------------------------------------------------------------
    def node(self, op_type, name, inputs, **attrs):
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    def conv(self, name, x, in_channels, out_channels, kernel, stride=1, group=1, bias=False):
        """Conv with He-initialized weights (fan-in), 'same'-style padding kernel // 2."""
        fan_in = in_channels // group * kernel * kernel
        weight = self.normal(f"{name}.weight", (out_channels, in_channels // group, kernel, kernel),
                             math.sqrt(2.0 / fan_in))
        inputs = [x, weight]
        if bias:
            inputs.append(self.normal(f"{name}.bias", (out_channels,), 0.01))
        pad = kernel // 2
        return self.node("Conv", name, inputs, kernel_shape=[kernel, kernel], strides=[stride, stride],
                         pads=[pad] * 4, dilations=[1, 1], group=group)

    def batch_norm(self, name, x, channels, gamma_range=(0.5, 1.5)):
        gamma = self.uniform(f"{name}.weight", (channels,), *gamma_range)
        beta_std = 0.1 if gamma_range[0] >= 0.5 else 0.02
        beta = self.normal(f"{name}.bias", (channels,), beta_std)
        mean = self.normal(f"{name}.running_mean", (channels,), 0.1)
        var = self.uniform(f"{name}.running_var", (channels,), 0.5, 1.5)
        return self.node("BatchNormalization", name, [x, gamma, beta, mean, var],
                         epsilon=BN_EPSILON, momentum=0.9)

    def classifier(self, name, x, in_features, out_features, output="logits"):
        """The final torch.nn.Linear, as exporters write it for 2-D input: Gemm(x, W[out,in], b, transB=1).

        Pooled features of a random network on random input are mostly input-independent positive means;
        rows of W with zero mean cancel part of that constant, so the logits depend more on the input.
        """
        weight = self.rng.normal(0.0, 1.0 / math.sqrt(in_features), size=(out_features, in_features))
        weight = self.add_initializer(f"{name}.weight",
                                      (weight - weight.mean(axis=1, keepdims=True)).astype(np.float32))
        bias = self.normal(f"{name}.bias", (out_features,), 0.01)
        self.nodes.append(helper.make_node("Gemm", [x, weight, bias], [output], name=name,
                                           alpha=1.0, beta=1.0, transB=1))
        return output

    def matmul_add(self, name, x, in_features, out_features):
        """torch.nn.Linear on N-D input as exporters write it: MatMul(x, W^T[in,out]) + b."""
        weight = self.normal(f"{name}.weight", (in_features, out_features), 1.0 / math.sqrt(in_features))
        bias = self.normal(f"{name}.bias", (out_features,), 0.01)
        y = self.node("MatMul", f"{name}.matmul", [x, weight])
        return self.node("Add", f"{name}.add", [y, bias])

    def layer_norm(self, name, x, hidden):
        """LayerNorm over the last axis, decomposed as opset-13 exporters write it."""
        mean = self.node("ReduceMean", f"{name}.mean", [x], axes=[-1], keepdims=1)
        centered = self.node("Sub", f"{name}.sub", [x, mean])
        squared = self.node("Pow", f"{name}.pow", [centered, self.constant(f"{name}.two", 2.0)])
        variance = self.node("ReduceMean", f"{name}.var", [squared], axes=[-1], keepdims=1)
        var_eps = self.node("Add", f"{name}.add_eps", [variance, self.constant(f"{name}.eps", LN_EPSILON)])
        std = self.node("Sqrt", f"{name}.sqrt", [var_eps])
        normalized = self.node("Div", f"{name}.div", [centered, std])
        scaled = self.node("Mul", f"{name}.mul", [normalized, self.uniform(f"{name}.weight", (hidden,), 0.8, 1.2)])
        return self.node("Add", name, [scaled, self.normal(f"{name}.bias", (hidden,), 0.1)])

    def gelu(self, name, x):
        """Exact Gelu, x * 0.5 * (1 + erf(x / sqrt(2))), in the exporters' operation order."""
        scaled = self.node("Div", f"{name}.div", [x, self.constant(f"{name}.sqrt2", math.sqrt(2.0))])
        erf = self.node("Erf", f"{name}.erf", [scaled])
        one_plus = self.node("Add", f"{name}.add", [erf, self.constant(f"{name}.one", 1.0)])
        product = self.node("Mul", f"{name}.mul", [x, one_plus])
        return self.node("Mul", name, [product, self.constant(f"{name}.half", 0.5)])

    # -- model --------------------------------------------------------------------------------------
    def make_model(self, graph_name, inputs, outputs, doc):
        graph = helper.make_graph(self.nodes, graph_name, inputs, outputs, initializer=self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="ondine-make_models", producer_version="0.1")
        model.doc_string = doc
        return model


# -------------------------------------------------------------------------------------------------
# ResNet-50 v1.5 (torchvision.models.resnet50)
# -------------------------------------------------------------------------------------------------
def build_resnet50(rng, args):
    b = GraphBuilder(rng)
    x = b.conv("conv1", "input", 3, 64, 7, stride=2)
    x = b.batch_norm("bn1", x, 64)
    x = b.node("Relu", "relu", [x])
    x = b.node("MaxPool", "maxpool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])

    in_channels = 64
    for stage, (blocks, width, stride) in enumerate([(3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)], 1):
        for block in range(blocks):
            p = f"layer{stage}.{block}"
            block_stride = stride if block == 0 else 1
            out_channels = width * 4
            identity = x
            y = b.conv(f"{p}.conv1", x, in_channels, width, 1)
            y = b.batch_norm(f"{p}.bn1", y, width)
            y = b.node("Relu", f"{p}.relu", [y])
            # v1.5: the stride sits on the 3x3 convolution, not on the first 1x1.
            y = b.conv(f"{p}.conv2", y, width, width, 3, stride=block_stride)
            y = b.batch_norm(f"{p}.bn2", y, width)
            y = b.node("Relu", f"{p}.relu_1", [y])
            y = b.conv(f"{p}.conv3", y, width, out_channels, 1)
            # A small gamma on the branch's last BN keeps the residual stream from growing block after block.
            y = b.batch_norm(f"{p}.bn3", y, out_channels, gamma_range=(0.1, 0.3))
            if block == 0:
                identity = b.conv(f"{p}.downsample.0", x, in_channels, out_channels, 1, stride=block_stride)
                identity = b.batch_norm(f"{p}.downsample.1", identity, out_channels)
            y = b.node("Add", f"{p}.add", [y, identity])
            x = b.node("Relu", f"{p}.relu_2", [y])
            in_channels = out_channels

    x = b.node("GlobalAveragePool", "avgpool", [x])
    x = b.node("Flatten", "flatten", [x], axis=1)
    b.classifier("fc", x, 2048, 1000)
    return b, b.make_model(
        "resnet50",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [BATCH, 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [BATCH, 1000])],
        "ResNet-50 v1.5 (torchvision layout) with seeded random weights, written by scripts/make_models.py")


# -------------------------------------------------------------------------------------------------
# MobileNetV2 (torchvision.models.mobilenet_v2, width_mult 1.0)
# -------------------------------------------------------------------------------------------------
def build_mobilenetv2(rng, args):
    b = GraphBuilder(rng)
    # ReLU6 is exported as Clip; at opset 13 its bounds are (optional) inputs, shared by every Clip here.
    clip_min = b.constant("relu6.min", 0.0)
    clip_max = b.constant("relu6.max", 6.0)

    def conv_bn_relu6(prefix, x, cin, cout, kernel, stride=1, group=1):
        y = b.conv(f"{prefix}.0", x, cin, cout, kernel, stride=stride, group=group)
        y = b.batch_norm(f"{prefix}.1", y, cout)
        return b.node("Clip", f"{prefix}.2", [y, clip_min, clip_max])

    x = conv_bn_relu6("features.0", "input", 3, 32, 3, stride=2)
    in_channels = 32
    index = 1
    # (expand ratio t, output channels c, repeats n, first stride s), as in the MobileNetV2 paper.
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            p = f"features.{index}.conv"
            hidden = in_channels * t
            use_residual = stride == 1 and in_channels == c
            layer = 0
            y = x
            if t != 1:
                y = conv_bn_relu6(f"{p}.{layer}", y, in_channels, hidden, 1)
                layer += 1
            y = conv_bn_relu6(f"{p}.{layer}", y, hidden, hidden, 3, stride=stride, group=hidden)
            y = b.conv(f"{p}.{layer + 1}", y, hidden, c, 1)
            y = b.batch_norm(f"{p}.{layer + 2}", y, c, gamma_range=(0.1, 0.3) if use_residual else (0.5, 1.5))
            if use_residual:
                y = b.node("Add", f"features.{index}.add", [x, y])
            x = y
            in_channels = c
            index += 1

    x = conv_bn_relu6(f"features.{index}", x, in_channels, 1280, 1)
    x = b.node("GlobalAveragePool", "avgpool", [x])
    x = b.node("Flatten", "flatten", [x], axis=1)
    # classifier.0 is Dropout, which exporters drop in inference mode.
    b.classifier("classifier.1", x, 1280, 1000)
    return b, b.make_model(
        "mobilenetv2",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [BATCH, 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [BATCH, 1000])],
        "MobileNetV2 1.0 (torchvision layout) with seeded random weights, written by scripts/make_models.py")


# -------------------------------------------------------------------------------------------------
# BERT-style encoder
# -------------------------------------------------------------------------------------------------
def build_bert(rng, args):
    hidden, heads, seq, vocab = args.bert_hidden, args.bert_heads, args.bert_seq, args.bert_vocab
    if hidden % heads:
        raise SystemExit(f"--bert-hidden ({hidden}) must be divisible by --bert-heads ({heads})")
    head_dim = hidden // heads
    ffn = 4 * hidden
    b = GraphBuilder(rng)

    words = b.node("Gather", "embeddings.word_embeddings",
                   [b.normal("embeddings.word_embeddings.weight", (vocab, hidden), 0.02), "input_ids"], axis=0)
    x = b.node("Add", "embeddings.add_position",
               [words, b.normal("embeddings.position_embeddings.weight", (seq, hidden), 0.02)])
    x = b.layer_norm("embeddings.LayerNorm", x, hidden)

    split_heads = b.constant("shape.split_heads", [0, 0, heads, head_dim], np.int64)
    merge_heads = b.constant("shape.merge_heads", [0, 0, hidden], np.int64)
    for layer in range(args.bert_layers):
        p = f"encoder.layer.{layer}"
        a = f"{p}.attention.self"

        def project_heads(kind, perm):
            y = b.matmul_add(f"{a}.{kind}", x, hidden, hidden)
            y = b.node("Reshape", f"{a}.{kind}.split_heads", [y, split_heads])
            return b.node("Transpose", f"{a}.{kind}.transpose", [y], perm=perm)

        q = project_heads("query", [0, 2, 1, 3])  # [batch, heads, seq, head_dim]
        k = project_heads("key", [0, 2, 3, 1])    # [batch, heads, head_dim, seq]: K already transposed
        v = project_heads("value", [0, 2, 1, 3])  # [batch, heads, seq, head_dim]
        scores = b.node("MatMul", f"{a}.scores", [q, k])
        scores = b.node("Div", f"{a}.scale", [scores, b.constant(f"{a}.sqrt_head_dim", math.sqrt(head_dim))])
        probs = b.node("Softmax", f"{a}.softmax", [scores], axis=-1)
        context = b.node("MatMul", f"{a}.context", [probs, v])
        context = b.node("Transpose", f"{a}.context.transpose", [context], perm=[0, 2, 1, 3])
        context = b.node("Reshape", f"{a}.context.merge_heads", [context, merge_heads])
        attention = b.matmul_add(f"{p}.attention.output.dense", context, hidden, hidden)
        attention = b.node("Add", f"{p}.attention.output.residual", [attention, x])
        x = b.layer_norm(f"{p}.attention.output.LayerNorm", attention, hidden)

        h = b.matmul_add(f"{p}.intermediate.dense", x, hidden, ffn)
        h = b.gelu(f"{p}.intermediate.gelu", h)
        h = b.matmul_add(f"{p}.output.dense", h, ffn, hidden)
        h = b.node("Add", f"{p}.output.residual", [h, x])
        x = b.layer_norm(f"{p}.output.LayerNorm", h, hidden)

    b.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="last_hidden_state"))
    return b, b.make_model(
        "bert",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [BATCH, seq])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [BATCH, seq, hidden])],
        f"BERT-style encoder ({args.bert_layers} layers, hidden {hidden}, {heads} heads, seq {seq}, vocab {vocab}) "
        "with seeded random weights, written by scripts/make_models.py")


MODELS = {"resnet50": build_resnet50, "mobilenetv2": build_mobilenetv2, "bert": build_bert}


def model_rng(seed, name, purpose):
    """An independent generator per (seed, model, purpose), stable across runs and --which subsets."""
    return np.random.default_rng([seed, zlib.crc32(name.encode()), zlib.crc32(purpose.encode())])


def make_input(name, batch, seed, args):
    rng = model_rng(seed, name, f"input.b{batch}")
    if name == "bert":
        return "input_ids", rng.integers(0, args.bert_vocab, size=(batch, args.bert_seq), dtype=np.int64)
    # Image-like rather than white noise: white noise is stationary, so after global average pooling every
    # sample gives nearly the same logits. A per-sample brightness and contrast and blocky 8x8-pixel content
    # make the logits depend on the sample (overall mean ~0, std ~1.15).
    offset = rng.normal(0.0, 0.5, size=(batch, 3, 1, 1))
    contrast = rng.uniform(0.5, 1.5, size=(batch, 1, 1, 1))
    blocks = np.kron(rng.standard_normal((batch, 3, 28, 28)), np.ones((8, 8)))
    noise = rng.standard_normal((batch, 3, 224, 224))
    return "input", (offset + contrast * (0.8 * blocks + 0.6 * noise)).astype(np.float32)


def input_path(out_dir, name, batch):
    return os.path.join(out_dir, f"{name}.input.npy" if batch == 1 else f"{name}.input.b{batch}.npy")


def check(model, path):
    """onnx.checker on the file (works past protobuf's 2 GB in-memory limit) plus strict shape inference."""
    onnx.checker.check_model(path, full_check=False)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    for output in inferred.graph.output:
        dims = [d.dim_param or d.dim_value for d in output.type.tensor_type.shape.dim]
        expected = [d.dim_param or d.dim_value for d in
                    next(o for o in model.graph.output if o.name == output.name).type.tensor_type.shape.dim]
        if dims != expected:
            raise SystemExit(f"{path}: shape inference gives {output.name} {dims}, declared {expected}")
    return len(inferred.graph.value_info)


def verify_with_ort(path, input_name, input_file, output_names):
    """Run ONNX Runtime through bench/ort_run.mjs; return {output name: array}."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["node", os.path.join(REPO_ROOT, "bench", "ort_run.mjs"), path,
               "--input", f"{input_name}={input_file}", "--output-dir", tmp]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"ONNX Runtime failed on {path}:\n{result.stderr}")
        return {name: np.load(os.path.join(tmp, f"{name}.npy")) for name in output_names}


def describe(array):
    a = array.astype(np.float64)
    return (f"shape {list(array.shape)} {array.dtype}: min {a.min():.4g} max {a.max():.4g} "
            f"mean {a.mean():.4g} std {a.std():.4g} max|x| {np.abs(a).max():.4g}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", default="models", help="output directory (default: models)")
    parser.add_argument("--which", default=",".join(MODELS), help="comma-separated subset of " + ",".join(MODELS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--inputs", action="store_true", help="also write seeded random inputs as .npy")
    parser.add_argument("--batch", default="1", help="comma-separated input batch sizes for --inputs (default 1)")
    parser.add_argument("--verify", action="store_true", help="run ONNX Runtime on the inputs and check the outputs")
    parser.add_argument("--bert-layers", type=int, default=4)
    parser.add_argument("--bert-hidden", type=int, default=256)
    parser.add_argument("--bert-heads", type=int, default=4)
    parser.add_argument("--bert-seq", type=int, default=128)
    parser.add_argument("--bert-vocab", type=int, default=8000)
    args = parser.parse_args()

    names = [n.strip() for n in args.which.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    batches = [int(v) for v in args.batch.split(",")]
    if args.verify and not args.inputs:
        parser.error("--verify needs --inputs")
    os.makedirs(args.out, exist_ok=True)

    failed = False
    for name in names:
        start = time.perf_counter()
        builder, model = MODELS[name](model_rng(args.seed, name, "weights"), args)
        path = os.path.join(args.out, f"{name}.onnx")
        onnx.save(model, path)
        built = time.perf_counter() - start
        value_infos = check(model, path)
        checked = time.perf_counter() - start - built
        print(f"{path}: {len(model.graph.node)} nodes, {builder.param_count / 1e6:.2f} M parameters, "
              f"{os.path.getsize(path) / 2**20:.1f} MiB; built+saved in {built:.2f} s, "
              f"checked (checker + strict shape inference, {value_infos} intermediate shapes) in {checked:.2f} s")

        if not args.inputs:
            continue
        output_names = [o.name for o in model.graph.output]
        for batch in batches:
            input_name, array = make_input(name, batch, args.seed, args)
            in_path = input_path(args.out, name, batch)
            np.save(in_path, array)
            print(f"  {in_path}: {input_name} {describe(array)}")
            if not args.verify:
                continue
            start = time.perf_counter()
            outputs = verify_with_ort(path, input_name, in_path, output_names)
            for out_name, out in outputs.items():
                peak = float(np.abs(out).max()) if out.size else 0.0
                ok = bool(np.isfinite(out).all()) and 1e-2 <= peak <= 1e3
                failed |= not ok
                print(f"  ORT batch {batch} ({time.perf_counter() - start:.2f} s) {out_name} {describe(out)}"
                      f"{'' if ok else '  <-- NOT FINITE OR BADLY SCALED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
