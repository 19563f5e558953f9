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

Models exported from PyTorch (--torch-corpus; needs torch 1.13 and torchvision 0.14, imported only then):
    /usr/bin/python3 scripts/make_models.py --torch-corpus [DIR] [--which bert_encoder,...] [--seed 0] [--verify]
writes, per model NAME, DIR/NAME/model.onnx (default DIR: tests/data/torch, committed as test data) and, for two
cases with different dynamic sizes, the inputs and PyTorch's outputs: caseK.<input name>.npy and
caseK.out.<output name>.npy, named after the graph's inputs and outputs. The modules are small nn.Modules with
weights seeded by torch.manual_seed (per seed and model), exported in eval mode as users do it:
torch.onnx.export with input_names, output_names and dynamic_axes, default settings otherwise (constant
folding on); the file is kept exactly as PyTorch writes it (no optimizer, symbolic dims as exported).
  bert_encoder     opset 14  "input_ids" i64 [batch,seq] -> "hidden" [batch,seq,64]; token + learned position
                   embeddings (torch.arange of the runtime length: Shape/Gather/Range), nn.TransformerEncoder
                   (2 layers, d 64, 4 heads, ff 128, gelu, padding mask input_ids == 0), LayerNorm.
                   Cases [1,7] and [2,12] (the second sample of case 1 ends in 3 pad tokens).
  gpt_decoder      opset 14  "input_ids" i64 [batch,seq] -> "logits" [batch,seq,100]; hand-written GPT (2 pre-LN
                   blocks, d 64, 4 heads, attention as Hugging Face writes it with a triu causal mask from the
                   runtime length -> Trilu/Where, GELU MLP, LM head tied to the embedding). Cases [1,7], [2,12].
  hf_bert          opset 14  "input_ids", "attention_mask" i64 [batch,seq] -> "last_hidden_state" [batch,seq,64];
                   Hugging Face-style BERT from torch.nn (2 layers, d 64, 4 heads, ff 128, vocab 100): word + token type +
                   position embeddings, the ids sliced from registered buffers ([:, :seq]: Slice), embedding
                   LayerNorm, BertSelfAttention written out (view + permute, q @ k^T / sqrt(d) + (1 - mask) *
                   float32 min, softmax, @ v), erf GELU. Cases [1,7], [2,12] (the second sample's last 4 tokens
                   padded: id 0, mask 0), [1,33]; bench copy hf_bert_pt: MiniLM-like, 6 layers, d 384, 12 heads.
  gpt2_kv          opset 14  "input_ids" i64 [batch,seq], per layer i "past_key_i", "past_value_i" f32
                   [batch,4,past,16] -> "logits" [batch,seq,100], "present_key_i", "present_value_i" [batch,4,total,16]
                   (= cat(past, new) on axis 2): GPT-2-style decoder with a KV cache (2 pre-LN blocks, d 64, c_attn
                   split into q, k, v, tanh GELU, tied LM head); positions arange(past, past + seq) with past read
                   from past_key_0's shape (Range), causal mask ones(seq, past + seq).triu(past + 1) (Trilu) filled
                   with float32 min. Traced with a non-zero past. Cases (batch, seq, past) (2,3,5), (1,7,0) (a zero-
                   length past: the first step of a decode), (1,1,7), their pasts the presents of the module run on
                   earlier tokens; decode.{prompt,tokens,logits}.npy: a greedy decode (see write_greedy_decode).
                   Bench copy gpt2_kv_pt: distilgpt2-like, 6 layers, d 768, 12 heads, vocab 8000.
  llama_kv         opset 14  "input_ids" i64 [batch,seq], "attention_mask" i64 [batch,total], "position_ids" i64
                   [batch,seq], per layer i "past_key_values.i.key", "past_key_values.i.value" f32 [batch,2,past,16] ->
                   "logits" [batch,seq,128], "present.i.key", "present.i.value" [batch,2,total,16] (Hugging Face
                   Optimum's names): a Llama decoder with a KV cache written as LlamaForCausalLM does it (2 pre-norm
                   blocks, d 64, 4 query heads and 2 KV heads: grouped-query attention, the presents = cat(past, new) of
                   the rotated keys with 2 heads, repeated after by repeat_kv's expand + reshape (Expand, Reshape);
                   RMSNorm weight * x * rsqrt(mean(x^2) + 1e-6), weights spread (Pow, ReduceMean, Add, Sqrt, Div of 1,
                   Mul); rotary embeddings of position_ids (cos, sin of position_ids * inv_freq: Cos, Sin; rotate_half:
                   Slice, Neg, Concat); SwiGLU MLP 176 (SiLU: Sigmoid, Mul); no biases; LM head tied). The additive mask
                   [batch,1,seq,total] is _prepare_4d_causal_attention_mask's: causal (torch.full of float32 min,
                   masked_fill by arange < arange + 1: Range, Less, Where; zeros for the past, Concat, Expand) and
                   float32 min where attention_mask is 0 (Sub, Cast, Where); softmax in float32. Cases (batch, seq,
                   past) (2,3,5) (the second sample left-padded: attention_mask 0 and id 0 on its first 2 positions,
                   position_ids cumsum(mask) - 1 clipped at 0, the new tokens' slice), (1,7,0), (1,1,7), pasts the
                   presents of the module run on earlier tokens; decode.{prompt,tokens,logits}.npy as gpt2_kv's, each
                   step also fed attention_mask ones [1,past+seq] and position_ids arange(past, past+seq) [1,seq]. Bench
                   copy llama_kv_pt: 24 layers, d 1024, 16 query and 4 KV heads, MLP 2816, vocab 32000, LM head untied
                   (336 M parameters, one 1.35 GB file).
  vit_small        opset 14  "pixels" f32 [batch,3,32,32] -> "logits" [batch,10]; torchvision VisionTransformer
                   (patch 8, 2 layers, 4 heads, hidden 64, mlp 128). Dynamic batch only: cases batch 1 and 3.
  audio_encoder    opset 14  "mel" f32 [batch,16,frames] -> "features" [batch,time,64]; Whisper-like Conv1d +
                   GELU, Conv1d stride 2 + GELU, sinusoidal positions sliced to the runtime length (Slice),
                   2 nn.TransformerEncoderLayer, LayerNorm. Cases [1,16,20] and [2,16,34] (time 10 and 17).
  bird_classifier  opset 17  "audio" f32 [batch,samples] (32 kHz; 160000 = 5 s in use) -> "logits" [batch,24]; BirdCLEF-
                   style: a log-mel front end in the graph (reflect Pad of 512 as torch.stft(center=True) pads; the
                   STFT as a Conv1d, n_fft 1024 = kernel, hop 320 = stride, of fixed Hann-windowed cos/-sin DFT
                   kernels [1026,1,1024], since torch 1.13 exports no aten::stft at any opset; re^2 + im^2; MatMul by
                   a [513,64] HTK mel filterbank (Slaney area norm, 50 Hz-16 kHz); log(x + 1e-6)), 4 Conv 3x3 + BN
                   + ReLU + MaxPool 2 blocks (16 to 128 channels) over [batch,1,64,frames], mean over frequency and
                   time, Linear. 4.5 MiB (the DFT kernels: 4 MiB). Cases [1,16000], [2,9600] (51 and 31 frames).
  seq2seq          opset 14  "src_ids" i64 [batch,src_seq], "tgt_ids" i64 [batch,tgt_seq] -> "logits"
                   [batch,tgt_seq,50]; nn.Transformer (1 encoder + 1 decoder layer, d 64, 4 heads, ff 128) with
                   a causal tgt mask from generate_square_subsequent_mask(tgt length). Cases src/tgt [1,7]/[1,5]
                   and [2,12]/[2,9].
  paddle_reshape   opset 13  "x" f32 [batch,3,height,width] -> "out" [batch,4,height,width]; Conv, then
                   reshape(b, c, h*w) and reshape(b, -1, h, w) from x.shape (Shape -> Gather -> Mul ->
                   Unsqueeze -> Concat -> Reshape) around a Linear, Conv. Cases 16x16 (batch 1), 24x20 (batch 2).
  pad_shape_arith  opset 13  "image" f32 [batch,3,height,width] -> "out" same shape; pads H, W up to a multiple
                   of 8 with pads from shape arithmetic (Mod/Sub -> Concat -> ... -> Pad), Conv stride 2, nearest
                   Resize x2, crop back to [:h, :w] (Slice), Conv 1x1 + input. Cases 13x21 (batch 1), 16x16
                   (batch 2).
  lstm_tagger      opset 14  "input_ids" i64 [batch,seq] -> "tags" [batch,seq,10]; Embedding(100, 32), nn.LSTM (2 layers,
                   hidden 48, bidirectional, batch_first, zero initial states), Linear(96, 10). Cases [1,9], [3,16].
  gru_tagger       opset 14  the same with nn.GRU (exported with linear_before_reset=1, as PyTorch's GRU is).
  lstm_stream      opset 14  "frame" f32 [batch,512], "h" [2,batch,64], "c" [2,batch,64] -> "speech" [batch,1],
                   "h_out", "c_out": a VAD-like streaming step on one 32 ms frame at 16 kHz: Linear(512, 64) +
                   ReLU, a 2-layer LSTM over that one step with the state passed in and returned, Linear + Sigmoid.
                   Cases batch 1 and 4.
  roi_box_head     opset 16  "image" f32 [batch,3,height,width], "proposals" f32 [rois,5] -> "scores" [rois,5],
                   "deltas" [rois,20]: 4 Conv to 32 channels at stride 16, torchvision.ops.RoIAlign (7x7, ratio 2,
                   aligned), Flatten, two Linear + ReLU, class softmax and box deltas. Cases 64x64 with 20
                   proposals, batch 2 of 96x128 with 33 (bench copy roihead_pt: resnet18 to layer3, 800x800, 300).
  fpn_box_head     opset 13  "image" f32 [1,3,height,width], "proposals" f32 [rois,4] -> "scores" [rois,5], "deltas"
                   [rois,20]: convs to two levels (strides 4, 8; 16 channels), torchvision.ops.MultiScaleRoIAlign
                   (LevelMapper, NonZero per level, RoiAlign, levels merged by ScatterElements of an expanded
                   index), box head. Cases 160x192 with 24 proposals on both levels, 128x128 with 11 small ones
                   (the stride-8 level gets none: an empty tensor at run time).
  norm_head        opset 13  "image" f32 [batch,3,height,width] -> "maps" [batch,4,height/2,width/2]: an FCOS-like
                   tower (Conv 3x3 -> nn.GroupNorm(8, 32) -> ReLU, twice), a diffusion-style block (GroupNorm(4, 32)
                   -> SiLU -> Conv) and a style-transfer block (InstanceNorm2d(affine) -> ReLU -> Conv 1x1); torch
                   writes GroupNorm as Reshape -> InstanceNormalization -> Reshape -> Mul -> Add. Cases 64x80
                   (batch 1), 48x48 (batch 2).
  convnext_blocks  opset 13  "image" f32 [batch,3,height,width] -> "logits" [batch,10]: torchvision's ConvNeXt with
                   two small stages (20 and 40 channels, 2 + 1 blocks: depthwise 7x7, LayerNorm over channels
                   and a Linear-GELU-Linear MLP through permutes, layer scale, residual; LayerNorm2d before
                   the downsampling conv and the head); torch writes each LayerNorm as ReduceMean / Sub /
                   Pow / Sqrt / Div. LayerNorm and layer-scale parameters spread. Cases 64x64 (batch 1),
                   48x80 (batch 2).
  token_pool       opset 16  "image" f32 [batch,3,height,width] -> "tokens" [batch,tokens,32]: MViT-style pooled
                   attention (patch embedding + class token; K and V split from the class token by
                   torch.tensor_split, which PyTorch exports as SequenceEmpty + Loop { Slice, SequenceInsert } +
                   SequenceAt, pooled by a strided depthwise conv, LayerNorm), softmax attention, projection +
                   residual. Cases 32x32 (batch 1), 24x40 (batch 2).
  unet             opset 13  "image" f32 [batch,3,height,width] -> "mask" [batch,2,height,width]: a U-Net from torch.nn
                   (3 levels of 8 to 32 channels and a 64-channel bottleneck: Conv 3x3 + BatchNorm + ReLU pairs,
                   MaxPool 2x2, ConvTranspose 2x2 stride 2, the skip Concat, a 1x1 head). Cases 32x32 (batch 1),
                   48x64 (batch 2); bench copy unet_pt: 4 levels of 32 to 256 channels, 512 at the bottom, 256x256.
  unet_fp16        the unet (its own seed) converted to float16 after export as packages ship such models
                   (to_float16: float16 weights and activations, float32 "image" and "mask" behind Casts, as
                   onnxconverter-common's keep_io_types writes); PyTorch's float32 outputs saved, within 2e-2.
                   Bench copy unet_fp16_pt at unet_pt's size.
  unet_dynq        the unet (its own seed) with its convolutions dynamically quantized as ONNX Runtime's
                   quantize_dynamic writes CNNs (quantize_dynamic_convs: DynamicQuantizeLinear, ConvInteger with
                   uint8 weights and zero points, Cast, Mul by the scales, the bias Add); PyTorch's float32 outputs
                   saved, within 0.1 (8-bit rounding). Bench copy unet_dynq_pt.
Each model is checked with check() (onnx.checker on the file, strict shape inference that must keep the
declared output dims), then exported a second time from case 1's inputs, which must give the same graph (no
size of the tracing example baked in as a constant). onnx.reference runs the model on every case when the
installed onnx has it (1.12 does not);
--verify also runs ONNX Runtime through bench/ort_run.mjs. PyTorch's outputs must be finite with
0.1 <= max|x| <= 100. One summary per model: opset, nodes, size, inputs and outputs, op_type counts.
"""

import argparse
import io
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


def verify_with_ort(path, input_files, output_names):
    """Run ONNX Runtime through bench/ort_run.mjs on {input name: .npy file}; return {output name: array}."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["node", os.path.join(REPO_ROOT, "bench", "ort_run.mjs"), path, "--output-dir", tmp]
        for input_name, input_file in input_files.items():
            cmd += ["--input", f"{input_name}={input_file}"]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"ONNX Runtime failed on {path}:\n{result.stderr}")
        return {name: np.load(os.path.join(tmp, f"{name}.npy")) for name in output_names}


def describe(array):
    a = array.astype(np.float64)
    return (f"shape {list(array.shape)} {array.dtype}: min {a.min():.4g} max {a.max():.4g} "
            f"mean {a.mean():.4g} std {a.std():.4g} max|x| {np.abs(a).max():.4g}")


# -------------------------------------------------------------------------------------------------
# Models exported from PyTorch (--torch-corpus): torch is imported lazily, only by this group.
# -------------------------------------------------------------------------------------------------
TORCH_CORPUS_DIR = os.path.join(REPO_ROOT, "tests", "data", "torch")


class TorchSpec:
    """What one --torch-corpus builder returns: the module (eval mode) and how to export and feed it."""

    def __init__(self, module, opset, input_names, output_names, dynamic_axes, cases, doc):
        self.module = module
        self.opset = opset
        self.input_names = input_names
        self.output_names = output_names
        self.dynamic_axes = dynamic_axes
        self.cases = cases  # one {input name: numpy array} per case; case 0 is also the tracing example
        self.doc = doc
        self.script = False  # export torch.jit.script(module): control flow becomes Loop/If, not unrolled
        self.nms_inputs = None  # a module whose batched_nms' inputs are saved as case<K>.nms.*.npy
        self.peak_range = (0.1, 100.0)  # plausible max |output| of a seeded model (catches dead or exploding ones)
        self.after_export = None  # f(module, model, model_dir) -> ok: more test data beside the cases
        self.float16 = False  # the export converted to float16 as packages ship it (to_float16), float32 I/O kept
        self.dynamic_quant = False  # the export's convolutions dynamically quantized (quantize_dynamic_convs)
        self.tolerance = 1e-4  # max error / max |output| a runtime may have against PyTorch (--verify)


def to_float16(model):
    """The model in float16 as onnxconverter-common's convert_float_to_float16(model, keep_io_types=True) writes
    it (the converter packages such as background removers and web demos ship): float32 initializers, Constant
    values and ConstantOfShape values become float16, Cast to float32 becomes Cast to float16, every float32
    value_info float16, and the graph's float32 inputs and outputs stay float32 behind a Cast. Inputs that ONNX
    types as float32 whatever the data (Resize's scales) keep float32."""
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    keep32 = set()
    for node in g.node:
        if node.op_type in ("Resize", "Upsample") and len(node.input) > 2:
            keep32.add(node.input[2] if node.op_type == "Resize" else node.input[1])

    def narrow(tensor):
        return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float16), tensor.name)

    for i, init in enumerate(g.initializer):
        if init.data_type == TensorProto.FLOAT and init.name not in keep32:
            g.initializer[i].CopyFrom(narrow(init))
    for node in g.node:
        for attr in node.attribute:
            if attr.name == "value" and attr.t.data_type == TensorProto.FLOAT and \
                    not any(o in keep32 for o in node.output):
                attr.t.CopyFrom(narrow(attr.t))
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.FLOAT16
    for vi in g.value_info:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT and vi.name not in keep32:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    def rename(names, old, new):
        for k, name in enumerate(names):
            if name == old:
                names[k] = new

    casts = []
    for inp in g.input:
        if inp.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        narrow_name = inp.name + "_float16"
        for node in g.node:
            rename(node.input, inp.name, narrow_name)
        casts.append(helper.make_node("Cast", [inp.name], [narrow_name], name=inp.name + "_cast16",
                                      to=TensorProto.FLOAT16))
    for out in g.output:
        if out.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        narrow_name = out.name + "_float16"
        for node in g.node:
            rename(node.output, out.name, narrow_name)
            rename(node.input, out.name, narrow_name)
        g.node.append(helper.make_node("Cast", [narrow_name], [out.name], name=out.name + "_cast32",
                                       to=TensorProto.FLOAT))
    for k, cast in enumerate(casts):
        g.node.insert(k, cast)
    return model


def uint8_weight(w):
    """A float weight as quantize_dynamic stores it in uint8: one asymmetric scale and zero point over its range
    widened to hold 0. Returns (weight_uint8, scale, zero_point)."""
    w = np.asarray(w, np.float64)
    lo, hi = min(float(w.min()), 0.0), max(float(w.max()), 0.0)
    scale = (hi - lo) / 255.0 if hi > lo else 1.0
    zero = int(np.clip(round(-lo / scale), 0, 255))
    return np.clip(np.round(w / scale) + zero, 0, 255).astype(np.uint8), scale, zero


def quantize_dynamic_layers(model, op_type):
    """The model's `op_type` layers ("Conv" or "MatMul") with a constant weight, dynamically quantized as ONNX
    Runtime's quantize_dynamic writes them with uint8 weights: per input, DynamicQuantizeLinear (uint8, scale and
    zero point from the run's min and max); per layer, the weight as uint8 (uint8_weight), ConvInteger or
    MatMulInteger(x_q, w_q, x_zp, w_zp) with the layer's attributes, Cast to float, Mul by x_scale * w_scale, and
    a Conv's bias added as [1, C, 1, ...]. Other layers stay float. Returns how many were quantized."""
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    quantized_inputs = {}
    nodes = []
    count = 0
    for node in g.node:
        weight = inits.get(node.input[1]) if node.op_type == op_type and len(node.input) > 1 else None
        if weight is None or weight.data_type != TensorProto.FLOAT or (op_type == "MatMul" and len(weight.dims) != 2):
            nodes.append(node)
            continue
        count += 1
        x = node.input[0]
        if x not in quantized_inputs:
            names = [f"{x}_quantized", f"{x}_scale", f"{x}_zero_point"]
            nodes.append(helper.make_node("DynamicQuantizeLinear", [x], names, name=f"{x}_QuantizeLinear"))
            quantized_inputs[x] = names
        xq, xs, xzp = quantized_inputs[x]
        w = numpy_helper.to_array(weight)
        wq, scale, zero = uint8_weight(w)
        base = node.name or node.output[0]
        g.initializer.extend([numpy_helper.from_array(wq, f"{base}_W_quantized"),
                              numpy_helper.from_array(np.array(scale, np.float32), f"{base}_W_scale"),
                              numpy_helper.from_array(np.array(zero, np.uint8), f"{base}_W_zero_point")])
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        nodes.append(helper.make_node(f"{op_type}Integer", [xq, f"{base}_W_quantized", xzp, f"{base}_W_zero_point"],
                                      [f"{base}_output_quantized"], name=f"{base}_quant", **attrs))
        nodes.append(helper.make_node("Cast", [f"{base}_output_quantized"], [f"{base}_output_cast"],
                                      name=f"{base}_cast", to=TensorProto.FLOAT))
        nodes.append(helper.make_node("Mul", [xs, f"{base}_W_scale"], [f"{base}_scales"], name=f"{base}_scales_mul"))
        biased = op_type == "Conv" and len(node.input) >= 3 and node.input[2]
        scaled = f"{base}_output_scaled" if biased else node.output[0]
        nodes.append(helper.make_node("Mul", [f"{base}_output_cast", f"{base}_scales"], [scaled],
                                      name=f"{base}_output_scale_mul"))
        if biased:
            bias = numpy_helper.to_array(inits[node.input[2]])
            rank = len(w.shape)
            g.initializer.append(numpy_helper.from_array(bias.reshape((1, -1) + (1,) * (rank - 2)), f"{base}_bias_reshaped"))
            nodes.append(helper.make_node("Add", [scaled, f"{base}_bias_reshaped"], [node.output[0]],
                                          name=f"{base}_bias_add"))
    del g.node[:]
    g.node.extend(nodes)
    used = {i for n in g.node for i in n.input}
    kept = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)
    return count


def quantize_dynamic_convs(model):
    """The model's Conv layers dynamically quantized as ONNX Runtime's quantize_dynamic writes them for CNNs (the
    ConvInteger form, quantize_dynamic_layers)."""
    quantize_dynamic_layers(model, "Conv")
    return model


def dynamic_quant_spec(spec):
    """A builder's spec exported, then its convolutions dynamically quantized (quantize_dynamic_convs)."""
    spec.dynamic_quant = True
    spec.tolerance = 0.1  # 8-bit activations and weights of a seeded net: 2.5-4.8% of the largest output
    spec.doc += "; convolutions dynamically quantized (ConvInteger, uint8 weights, as quantize_dynamic writes CNNs)"
    return spec


def float16_spec(spec):
    """A builder's spec exported, then converted to float16 (to_float16)."""
    spec.float16 = True
    spec.tolerance = 2e-2
    spec.doc += "; converted to float16 (float32 inputs and outputs, as onnxconverter-common's keep_io_types)"
    return spec


def token_cases(rng, vocab, shapes, name="input_ids"):
    """Token-id inputs, one per (batch, seq); ids in [1, vocab): 0 is kept free as a padding id."""
    return [{name: rng.integers(1, vocab, size=shape, dtype=np.int64)} for shape in shapes]


def float_cases(rng, name, shapes):
    return [{name: rng.standard_normal(shape).astype(np.float32)} for shape in shapes]


def sinusoid_table(length, dim):
    """The fixed sine/cosine position table of "Attention is all you need" (and Whisper's encoder)."""
    position = np.arange(length)[:, None]
    inv_freq = np.exp(-math.log(10000.0) * np.arange(0, dim, 2) / dim)
    table = np.zeros((length, dim), dtype=np.float32)
    table[:, 0::2] = np.sin(position * inv_freq)
    table[:, 1::2] = np.cos(position * inv_freq)
    return table


def torch_bert_encoder(rng, bench=False):
    import torch
    from torch import nn

    vocab, hidden, heads, ff, layers, max_len = (8000, 256, 4, 1024, 4, 512) if bench else (100, 64, 4, 128, 2, 64)

    class BertEncoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.word_embeddings = nn.Embedding(vocab, hidden)
            self.position_embeddings = nn.Embedding(max_len, hidden)
            layer = nn.TransformerEncoderLayer(hidden, heads, dim_feedforward=ff, dropout=0.0, activation="gelu",
                                               batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, num_layers=layers)
            self.norm = nn.LayerNorm(hidden)

        def forward(self, input_ids):
            # Traced as Shape -> Gather -> Range: the positions follow the runtime sequence length.
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
            x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
            # Padding mask from the pad id 0, as BERT-style exporters write it (Equal -> Where/Add on scores).
            x = self.encoder(x, src_key_padding_mask=input_ids == 0)
            return self.norm(x)

    module = BertEncoder()
    cases = token_cases(rng, vocab, [(1, 128), (8, 128)] if bench else [(1, 7), (2, 12)])
    cases[1]["input_ids"][1, -3:] = 0  # the second sample of case 1 ends in 3 padding tokens
    return TorchSpec(module, 14, ["input_ids"], ["hidden"],
                     {"input_ids": {0: "batch", 1: "seq"}, "hidden": {0: "batch", 1: "seq"}}, cases,
                     "token + learned position embeddings (arange of the runtime length), nn.TransformerEncoder "
                     f"({layers} layers, d {hidden}, {heads} heads, ff {ff}, gelu, padding mask from id 0), LayerNorm")


def torch_gpt_decoder(rng, bench=False):
    import torch
    from torch import nn

    vocab, hidden, heads, layers, max_len = (8000, 256, 4, 4, 512) if bench else (100, 64, 4, 2, 64)
    head_dim = hidden // heads

    class Attention(nn.Module):
        """Causal self-attention written out the way Hugging Face's GPT-style models do it."""

        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(hidden, hidden)
            self.k_proj = nn.Linear(hidden, hidden)
            self.v_proj = nn.Linear(hidden, hidden)
            self.out_proj = nn.Linear(hidden, hidden)

        def forward(self, x):
            b, s, _ = x.shape
            q = self.q_proj(x).view(b, s, heads, head_dim).transpose(1, 2)
            k = self.k_proj(x).view(b, s, heads, head_dim).transpose(1, 2)
            v = self.v_proj(x).view(b, s, heads, head_dim).transpose(1, 2)
            scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)
            # Built at run time from the sequence length: ConstantOfShape -> Trilu -> Cast -> Where.
            causal = torch.triu(torch.ones(s, s, device=x.device), diagonal=1).bool()
            scores = scores.masked_fill(causal, float("-inf"))
            context = torch.softmax(scores, dim=-1) @ v
            return self.out_proj(context.transpose(1, 2).reshape(b, s, hidden))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(hidden)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(hidden)
            self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GptDecoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, hidden)
            self.wpe = nn.Embedding(max_len, hidden)
            self.h = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(hidden)
            self.lm_head = nn.Linear(hidden, vocab, bias=False)
            self.lm_head.weight = self.wte.weight  # tied, as GPT-2 does

        def forward(self, input_ids):
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
            x = self.wte(input_ids) + self.wpe(positions)
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    module = GptDecoder()
    with torch.no_grad():
        module.wte.weight.mul_(0.3)  # N(0, 0.3) embeddings: logits through the tied head of order 1-10
    return TorchSpec(module, 14, ["input_ids"], ["logits"],
                     {"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
                     token_cases(rng, vocab, [(1, 256), (2, 256)] if bench else [(1, 7), (2, 12)]),
                     f"GPT-style decoder written by hand ({layers} pre-LN blocks, d {hidden}, {heads} heads, manual "
                     "attention with a "
                     "triu causal mask built from the runtime length, GELU MLP), LM head tied to the embedding")


def spread_layer_norms(module):
    """LayerNorm weights ~U(0.5, 1.5) and biases ~U(-0.2, 0.2) instead of ones and zeros, so that a runtime that
    drops or swaps gamma and beta shows it."""
    import torch
    from torch import nn

    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)


def torch_hf_bert(rng, bench=False):
    import torch
    from torch import nn

    # Test size, or MiniLM-like (all-MiniLM-L6's shape with a smaller vocabulary) at benchmark size.
    vocab, hidden, heads, ff, layers, max_len = (8000, 384, 12, 1536, 6, 512) if bench else (100, 64, 4, 128, 2, 64)
    head_dim = hidden // heads

    class Embeddings(nn.Module):
        """BertEmbeddings: position and token type ids sliced from registered buffers, as Hugging Face does."""

        def __init__(self):
            super().__init__()
            self.word_embeddings = nn.Embedding(vocab, hidden, padding_idx=0)
            self.position_embeddings = nn.Embedding(max_len, hidden)
            self.token_type_embeddings = nn.Embedding(2, hidden)
            self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
            self.register_buffer("position_ids", torch.arange(max_len).expand((1, -1)))
            self.register_buffer("token_type_ids", torch.zeros((1, max_len), dtype=torch.long))

        def forward(self, input_ids):
            batch, seq = input_ids.size()
            position_ids = self.position_ids[:, :seq]  # Slice of an initializer, end from Shape
            token_type_ids = self.token_type_ids[:, :seq].expand(batch, seq)
            x = (self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids) +
                 self.position_embeddings(position_ids))
            return self.LayerNorm(x)

    class SelfAttention(nn.Module):
        """BertSelfAttention + BertSelfOutput, written out as Hugging Face writes them."""

        def __init__(self):
            super().__init__()
            self.query = nn.Linear(hidden, hidden)
            self.key = nn.Linear(hidden, hidden)
            self.value = nn.Linear(hidden, hidden)
            self.dense = nn.Linear(hidden, hidden)
            self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)

        @staticmethod
        def transpose_for_scores(x):
            return x.view(x.size()[:-1] + (heads, head_dim)).permute(0, 2, 1, 3)

        def forward(self, hidden_states, extended_mask):
            q = self.transpose_for_scores(self.query(hidden_states))
            k = self.transpose_for_scores(self.key(hidden_states))
            v = self.transpose_for_scores(self.value(hidden_states))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(head_dim) + extended_mask
            context = torch.matmul(nn.functional.softmax(scores, dim=-1), v).permute(0, 2, 1, 3).contiguous()
            context = context.view(context.size()[:-2] + (hidden,))
            return self.LayerNorm(self.dense(context) + hidden_states)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = SelfAttention()
            self.intermediate = nn.Linear(hidden, ff)
            self.output = nn.Linear(ff, hidden)
            self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)

        def forward(self, x, extended_mask):
            x = self.attention(x, extended_mask)
            return self.LayerNorm(self.output(nn.functional.gelu(self.intermediate(x))) + x)

    class HfBert(nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = Embeddings()
            self.layer = nn.ModuleList(Layer() for _ in range(layers))

        def forward(self, input_ids, attention_mask):
            # get_extended_attention_mask: [batch, 1, 1, seq], 0 where attended, float32 min where padded.
            extended = attention_mask[:, None, None, :].to(torch.float32)
            extended = (1.0 - extended) * torch.finfo(torch.float32).min
            x = self.embeddings(input_ids)
            for layer in self.layer:
                x = layer(x, extended)
            return x

    module = HfBert()
    spread_layer_norms(module)
    shapes = [(1, 128), (8, 128), (4, 384)] if bench else [(1, 7), (2, 12), (1, 33)]
    cases = token_cases(rng, vocab, shapes)
    for case in cases:
        case["attention_mask"] = np.ones_like(case["input_ids"])
    pad = 40 if bench else 4
    cases[1]["input_ids"][1, -pad:] = 0  # the second sample of case 1 is padded at the end, as tokenizers pad
    cases[1]["attention_mask"][1, -pad:] = 0
    return TorchSpec(module, 14, ["input_ids", "attention_mask"], ["last_hidden_state"],
                     {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                      "last_hidden_state": {0: "batch", 1: "seq"}}, cases,
                     f"Hugging Face-style BERT from torch.nn ({layers} layers, d {hidden}, {heads} heads, ff {ff}, "
                     "position and token type ids sliced from buffers, additive mask (1 - mask) * float32 min, "
                     "attention written out as BertSelfAttention, erf GELU)")


def torch_gpt2_kv(rng, bench=False):
    import torch
    from torch import nn

    # Test size, or distilgpt2-like (its shape with an 8000-token vocabulary) at benchmark size.
    vocab, hidden, heads, layers, max_len = (8000, 768, 12, 6, 1024) if bench else (100, 64, 4, 2, 128)
    head_dim = hidden // heads

    class Attention(nn.Module):
        """GPT2Attention with a KV cache: c_attn split into q, k, v; the new keys and values appended to the past."""

        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(hidden, 3 * hidden)
            self.c_proj = nn.Linear(hidden, hidden)

        def forward(self, x, past_key, past_value, causal):
            b, s, _ = x.shape
            q, k, v = self.c_attn(x).split(hidden, dim=2)
            q, k, v = (t.view(b, s, heads, head_dim).permute(0, 2, 1, 3) for t in (q, k, v))
            key = torch.cat((past_key, k), dim=2)
            value = torch.cat((past_value, v), dim=2)
            scores = torch.matmul(q, key.transpose(-1, -2)) / math.sqrt(head_dim)
            scores = scores.masked_fill(causal, torch.finfo(torch.float32).min)
            context = torch.matmul(torch.softmax(scores, dim=-1), value)
            return self.c_proj(context.permute(0, 2, 1, 3).reshape(b, s, hidden)), key, value

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(hidden)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(hidden)
            self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(approximate="tanh"),
                                     nn.Linear(4 * hidden, hidden))

        def forward(self, x, past_key, past_value, causal):
            a, key, value = self.attn(self.ln_1(x), past_key, past_value, causal)
            x = x + a
            return x + self.mlp(self.ln_2(x)), key, value

    class Gpt2Kv(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, hidden)
            self.wpe = nn.Embedding(max_len, hidden)
            self.h = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(hidden)
            self.lm_head = nn.Linear(hidden, vocab, bias=False)
            self.lm_head.weight = self.wte.weight  # tied, as GPT-2 does

        def forward(self, input_ids, *past):  # past: past_key_0, past_value_0, past_key_1, ...
            seq = input_ids.shape[1]
            past_len = past[0].shape[2]  # traced as Shape -> Gather of past_key_0
            positions = torch.arange(past_len, past_len + seq, device=input_ids.device)  # Range
            # Query i (at position past_len + i) sees keys 0 .. past_len + i: ConstantOfShape -> Trilu -> Cast.
            causal = torch.ones(seq, past_len + seq, device=input_ids.device).triu(diagonal=past_len + 1).bool()
            x = self.wte(input_ids) + self.wpe(positions)
            presents = []
            for i, block in enumerate(self.h):
                x, key, value = block(x, past[2 * i], past[2 * i + 1], causal)
                presents += [key, value]
            return (self.lm_head(self.ln_f(x)), *presents)

    module = Gpt2Kv()
    spread_layer_norms(module)
    with torch.no_grad():  # N(0, 2.4 / sqrt(hidden)) embeddings: logits through the tied head of order 1-10
        module.wte.weight.mul_(2.4 / math.sqrt(hidden))
    module.eval()

    def empty_past(batch):
        return [torch.zeros(batch, heads, 0, head_dim) for _ in range(2 * layers)]

    def case(batch, seq, past_len):
        """input_ids [batch, seq] after a real cache: the presents of the module run on past_len earlier tokens."""
        past = empty_past(batch)
        if past_len:
            with torch.no_grad():
                past = list(module(torch.from_numpy(rng.integers(1, vocab, (batch, past_len), dtype=np.int64)),
                                   *past)[1:])
        c = {"input_ids": rng.integers(1, vocab, (batch, seq), dtype=np.int64)}
        for i in range(layers):
            c[f"past_key_{i}"], c[f"past_value_{i}"] = past[2 * i].numpy(), past[2 * i + 1].numpy()
        return c

    # Case 0 (the tracing example) has a non-zero past, so nothing specialises on an empty one; case 1 is the
    # first step of a decode (the prompt, a zero-length past), case 2 one decode step.
    shapes = [(1, 1, 127), (1, 128, 0), (4, 1, 255)] if bench else [(2, 3, 5), (1, 7, 0), (1, 1, 7)]
    cases = [case(*shape) for shape in shapes]
    past_names = [f"past_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]
    present_names = [f"present_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]
    axes = {"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    axes.update({n: {0: "batch", 2: "past"} for n in past_names})
    axes.update({n: {0: "batch", 2: "total"} for n in present_names})
    spec = TorchSpec(module, 14, ["input_ids"] + past_names, ["logits"] + present_names, axes, cases,
                     f"GPT-2-style decoder with a KV cache from torch.nn ({layers} pre-LN blocks, d {hidden}, {heads} "
                     "heads, c_attn split into q, k, v, presents = cat(past, new), positions arange(past, past + seq), "
                     "causal mask ones(seq, past + seq).triu(past + 1), tanh GELU MLP, tied LM head)")
    if not bench:
        spec.after_export = lambda module, model, model_dir: write_greedy_decode(module, model, model_dir, layers,
                                                                                 empty_past, rng)
    return spec


def torch_llama_kv(rng, bench=False):
    import torch
    from torch import nn

    # Test size, or a 0.34 B-parameter Llama at benchmark size (TinyLlama's layout with hidden 1024, 24 layers).
    vocab, hidden, layers, heads, kv_heads, intermediate = (32000, 1024, 24, 16, 4, 2816) if bench else \
        (128, 64, 2, 4, 2, 176)
    head_dim, n_rep, eps = hidden // heads, heads // kv_heads, 1e-6
    min_value = torch.finfo(torch.float32).min

    class RMSNorm(nn.Module):
        """LlamaRMSNorm as Hugging Face writes it."""

        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden))
            self.variance_epsilon = eps

        def forward(self, hidden_states):
            input_dtype = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
            return self.weight * hidden_states.to(input_dtype)

    class RotaryEmbedding(nn.Module):
        """LlamaRotaryEmbedding: cos and sin of the run-time position_ids times inv_freq."""

        def __init__(self):
            super().__init__()
            inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
            self.register_buffer("inv_freq", inv_freq, persistent=False)

        def forward(self, position_ids):
            freqs = position_ids[..., None].float() * self.inv_freq  # [batch, seq, head_dim / 2]
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos(), emb.sin()

    def rotate_half(x):
        x1 = x[..., : x.shape[-1] // 2]
        x2 = x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def apply_rotary_pos_emb(q, k, cos, sin):
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [batch, 1, seq, head_dim], broadcast over the heads
        return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)

    def repeat_kv(hidden_states, rep):
        batch, num_key_value_heads, slen, dim = hidden_states.shape
        hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, rep, slen, dim)
        return hidden_states.reshape(batch, num_key_value_heads * rep, slen, dim)

    class Attention(nn.Module):
        """LlamaAttention with a KV cache and grouped-query attention (eager attention, as Hugging Face writes it)."""

        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
            self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
            self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
            self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

        def forward(self, hidden_states, attention_mask, cos, sin, past_key, past_value):
            bsz, q_len, _ = hidden_states.size()
            query_states = self.q_proj(hidden_states).view(bsz, q_len, heads, head_dim).transpose(1, 2)
            key_states = self.k_proj(hidden_states).view(bsz, q_len, kv_heads, head_dim).transpose(1, 2)
            value_states = self.v_proj(hidden_states).view(bsz, q_len, kv_heads, head_dim).transpose(1, 2)
            query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
            # The cache (DynamicCache.update): the rotated keys, kv_heads heads, before the repetition.
            key_states = torch.cat((past_key, key_states), dim=2)
            value_states = torch.cat((past_value, value_states), dim=2)
            present = (key_states, value_states)
            key_states, value_states = repeat_kv(key_states, n_rep), repeat_kv(value_states, n_rep)
            attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(head_dim)
            attn_weights = attn_weights + attention_mask
            attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
            attn_output = torch.matmul(attn_weights, value_states)
            attn_output = attn_output.transpose(1, 2).contiguous().reshape(bsz, q_len, hidden)
            return self.o_proj(attn_output), present

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
            self.up_proj = nn.Linear(hidden, intermediate, bias=False)
            self.down_proj = nn.Linear(intermediate, hidden, bias=False)
            self.act_fn = nn.SiLU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    class DecoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = Attention()
            self.mlp = MLP()
            self.input_layernorm = RMSNorm()
            self.post_attention_layernorm = RMSNorm()

        def forward(self, hidden_states, attention_mask, cos, sin, past_key, past_value):
            residual = hidden_states
            hidden_states, present = self.self_attn(self.input_layernorm(hidden_states), attention_mask, cos, sin,
                                                    past_key, past_value)
            hidden_states = residual + hidden_states
            residual = hidden_states
            hidden_states = residual + self.mlp(self.post_attention_layernorm(hidden_states))
            return hidden_states, present

    def causal_4d_mask(attention_mask, batch, seq, past_len):
        """_prepare_4d_causal_attention_mask (AttentionMaskConverter.to_4d): the causal mask [seq, past + seq]
        (_make_causal_mask) expanded to [batch, 1, seq, past + seq], float32 min wherever the 2-d mask is 0
        (_expand_mask's inverted mask). Hugging Face skips the zeros for the past when past is 0 and the causal
        part when seq is 1 (Python conditions a trace would bake in); the empty cat and an all-zero causal part
        give the same mask, so they are always written."""
        mask = torch.full((seq, seq), min_value)
        mask_cond = torch.arange(mask.size(-1))
        mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)
        mask = torch.cat([torch.zeros(seq, past_len), mask], dim=-1)
        causal = mask[None, None, :, :].expand(batch, 1, seq, seq + past_len)
        src_len = attention_mask.shape[1]
        expanded = attention_mask[:, None, None, :].expand(batch, 1, seq, src_len).to(torch.float32)
        inverted = 1.0 - expanded
        inverted = inverted.masked_fill(inverted.to(torch.bool), min_value)
        return causal.masked_fill(inverted.bool(), min_value)

    class LlamaModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, hidden)
            self.layers = nn.ModuleList(DecoderLayer() for _ in range(layers))
            self.norm = RMSNorm()
            self.rotary_emb = RotaryEmbedding()

        def forward(self, input_ids, attention_mask, position_ids, past):
            batch, seq = input_ids.shape
            past_len = past[0].shape[2]  # Shape -> Gather of past_key_values.0.key
            mask = causal_4d_mask(attention_mask, batch, seq, past_len)
            hidden_states = self.embed_tokens(input_ids)
            cos, sin = self.rotary_emb(position_ids)
            presents = []
            for i, layer in enumerate(self.layers):
                hidden_states, present = layer(hidden_states, mask, cos, sin, past[2 * i], past[2 * i + 1])
                presents += present
            return self.norm(hidden_states), presents

    class LlamaForCausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = LlamaModel()
            self.lm_head = nn.Linear(hidden, vocab, bias=False)
            if not bench:
                self.lm_head.weight = self.model.embed_tokens.weight  # tie_word_embeddings

        # past: past_key_values.0.key, past_key_values.0.value, past_key_values.1.key, ...
        def forward(self, input_ids, attention_mask, position_ids, *past):
            hidden_states, presents = self.model(input_ids, attention_mask, position_ids, past)
            return (self.lm_head(hidden_states), *presents)

    module = LlamaForCausalLM()
    with torch.no_grad():
        # Variance-preserving projections (std 1 / sqrt(fan in): q, k of order 1, attention far from uniform), the
        # residual branches' last projections scaled by 1 / sqrt(2 * layers) so that the residual stream ends near
        # rms 1 after any depth; N(0, 2.4 / sqrt(hidden)) embeddings (and untied head): logits of order 1-10.
        # RMSNorm weights ~U(0.5, 1.5), so that a runtime dropping or misplacing them shows it.
        for name, m in module.named_modules():
            if isinstance(m, nn.Linear) and m is not module.lm_head:
                scale = 1.0 / math.sqrt(2 * layers) if name.endswith(("o_proj", "down_proj")) else 1.0
                m.weight.normal_(0.0, scale / math.sqrt(m.in_features))
            elif isinstance(m, RMSNorm):
                m.weight.uniform_(0.5, 1.5)
        module.model.embed_tokens.weight.normal_(0.0, 2.4 / math.sqrt(hidden))
        if bench:
            module.lm_head.weight.normal_(0.0, 2.4 / math.sqrt(hidden))
    module.eval()

    def empty_past(batch):
        return [torch.zeros(batch, kv_heads, 0, head_dim) for _ in range(2 * layers)]

    def case(batch, seq, past_len, left_pad=0):
        """input_ids [batch, seq] after a real cache (the presents of the module run on past_len earlier tokens);
        the last sample's first left_pad positions are padding (id 0, mask 0), positions as Hugging Face's
        generate derives them from the mask (cumsum - 1, here clipped at 0 in the padding)."""
        mask = np.ones((batch, past_len + seq), dtype=np.int64)
        mask[-1, :left_pad] = 0
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        past = empty_past(batch)
        if past_len:
            ids = rng.integers(1, vocab, (batch, past_len), dtype=np.int64)
            ids[mask[:, :past_len] == 0] = 0
            with torch.no_grad():
                feed = (ids, mask[:, :past_len], np.ascontiguousarray(positions[:, :past_len]))
                past = list(module(*(torch.from_numpy(a) for a in feed), *past)[1:])
        c = {"input_ids": rng.integers(1, vocab, (batch, seq), dtype=np.int64), "attention_mask": mask,
             "position_ids": np.ascontiguousarray(positions[:, past_len:])}
        for i in range(layers):
            c[f"past_key_values.{i}.key"] = past[2 * i].numpy()
            c[f"past_key_values.{i}.value"] = past[2 * i + 1].numpy()
        return c

    # Case 0 (the tracing example) has a non-zero past and a left-padded second sample (its first 2 positions,
    # in the past); case 1 is the first step of a decode (the prompt, a zero-length past), case 2 one decode step.
    cases = [case(1, 1, 127), case(1, 128, 0), case(1, 1, 255)] if bench else \
        [case(2, 3, 5, left_pad=2), case(1, 7, 0), case(1, 1, 7)]
    past_names = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    present_names = [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"},
            "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    axes.update({n: {0: "batch", 2: "past"} for n in past_names})
    axes.update({n: {0: "batch", 2: "total"} for n in present_names})
    spec = TorchSpec(module, 14, ["input_ids", "attention_mask", "position_ids"] + past_names,
                     ["logits"] + present_names, axes, cases,
                     f"Llama-style decoder with a KV cache from torch.nn ({layers} pre-norm blocks, d {hidden}, "
                     f"{heads} query heads, {kv_heads} KV heads (GQA, repeat_kv by expand + reshape), head_dim "
                     f"{head_dim}, RMSNorm, rotary embeddings of position_ids, SwiGLU MLP {intermediate}, no biases, "
                     "4-d mask from attention_mask and causality filled with float32 min, "
                     f"{'untied' if bench else 'tied'} LM head)")
    if not bench:
        def step_inputs(seq, past_len):
            return [np.ones((1, past_len + seq), dtype=np.int64),
                    np.arange(past_len, past_len + seq, dtype=np.int64).reshape(1, seq)]
        spec.after_export = lambda module, model, model_dir: write_greedy_decode(module, model, model_dir, layers,
                                                                                 empty_past, rng,
                                                                                 step_inputs=step_inputs)
    return spec


def write_greedy_decode(module, model, model_dir, layers, empty_past, rng, prompt_len=8, steps=32, step_inputs=None):
    """A whole greedy decode of the KV-cache decoder, run by the PyTorch module, for a runtime to replay:
      decode.prompt.npy  int64 [1, prompt_len]       the prompt's token ids
      decode.tokens.npy  int64 [steps + 1]            tokens[0] = argmax of the prompt step's last logits;
                                                      tokens[i] (1 <= i <= steps) = argmax of step i's logits
      decode.logits.npy  float32 [steps + 1, vocab]   logits[0] = the prompt step's logits at its last position;
                                                      logits[i] = step i's logits (its only position)
    The prompt step feeds decode.prompt with zero-length pasts ([1, heads, 0, head_dim]); step i (1 .. steps)
    feeds input_ids [[tokens[i - 1]]] with step i - 1's presents as its pasts (the presents in output order as
    the pasts in input order: present_key_L -> past_key_L, present_value_L -> past_value_L for gpt2_kv,
    present.L.key -> past_key_values.L.key, present.L.value -> past_key_values.L.value for llama_kv), so the past
    of step i has prompt_len + i - 1 positions. tokens[steps] is chosen but never fed. A model with more inputs
    than the ids and the pasts gets them from step_inputs(seq, past) -> [int64 arrays], fed in graph order
    between input_ids and the pasts (llama_kv: attention_mask ones [1, past + seq], position_ids
    arange(past, past + seq) as [1, seq]). The vocabulary is read from module.lm_head. Returns False if the
    logits are not finite or badly scaled."""
    import torch

    vocab = module.lm_head.weight.shape[0]
    prompt = rng.integers(1, vocab, (1, prompt_len), dtype=np.int64)
    step_inputs = step_inputs or (lambda seq, past: [])
    tokens, logits = [], []
    with torch.no_grad():
        ids, past, past_len = torch.from_numpy(prompt), empty_past(1), 0
        for _ in range(steps + 1):
            extra = [torch.from_numpy(a) for a in step_inputs(ids.shape[1], past_len)]
            outputs = module(ids, *extra, *past)
            last = outputs[0][0, -1]
            logits.append(last.numpy().copy())
            tokens.append(int(last.argmax()))
            past_len += ids.shape[1]
            ids, past = torch.tensor([[tokens[-1]]], dtype=torch.int64), list(outputs[1:])
    tokens, logits = np.array(tokens, dtype=np.int64), np.stack(logits).astype(np.float32)
    np.save(os.path.join(model_dir, "decode.prompt.npy"), prompt)
    np.save(os.path.join(model_dir, "decode.tokens.npy"), tokens)
    np.save(os.path.join(model_dir, "decode.logits.npy"), logits)
    top2 = np.sort(logits, axis=1)[:, -2:]
    peak = float(np.abs(logits).max())
    scaled = bool(np.isfinite(logits).all()) and 0.1 <= peak <= 100.0
    good = scaled
    try:
        from onnx.reference import ReferenceEvaluator
    except ImportError:
        ReferenceEvaluator = None
    if ReferenceEvaluator is not None:  # the same decode through the exported file, fed the recorded tokens
        evaluator = ReferenceEvaluator(model)
        pasts = [p.numpy() for p in empty_past(1)]
        error = 0.0
        for step in range(steps + 1):
            ids = prompt if step == 0 else tokens[step - 1:step].reshape(1, 1)
            past_len = 0 if step == 0 else prompt_len + step - 1
            names = [i.name for i in model.graph.input]
            outputs = evaluator.run(None, dict(zip(names, [ids] + step_inputs(ids.shape[1], past_len) + pasts)))
            error = max(error, float(np.abs(outputs[0][0, -1] - logits[step]).max() / np.abs(logits).max()))
            pasts = outputs[1:]
        good &= error <= 1e-4
        print(f"  decode onnx.reference: max error / max|x| {error:.2g}{'' if error <= 1e-4 else '  <-- MISMATCH'}")
    print(f"  decode: prompt {prompt[0].tolist()} -> tokens {tokens.tolist()}; logits {describe(logits)}, "
          f"smallest top-1 - top-2 margin {float((top2[:, 1] - top2[:, 0]).min()):.3g}"
          f"{'' if scaled else '  <-- NOT FINITE OR BADLY SCALED'}")
    return good


def torch_vit_small(rng, bench=False):
    import torch
    import torchvision

    # bench: ViT-S/16 (DeiT-S) at 224x224, 1000 classes.
    image, patch, layers, heads, hidden, mlp, classes = \
        (224, 16, 12, 6, 384, 1536, 1000) if bench else (32, 8, 2, 4, 64, 128, 10)
    module = torchvision.models.VisionTransformer(image_size=image, patch_size=patch, num_layers=layers,
                                                  num_heads=heads, hidden_dim=hidden, mlp_dim=mlp, num_classes=classes)
    with torch.no_grad():
        # torchvision zero-initializes the classification head: logits would be all zero.
        module.heads.head.weight.normal_(0.0, 1.0 / math.sqrt(hidden))
        module.heads.head.bias.normal_(0.0, 0.01)
    return TorchSpec(module, 14, ["pixels"], ["logits"], {"pixels": {0: "batch"}, "logits": {0: "batch"}},
                     float_cases(rng, "pixels", [(1, 3, image, image), (3 if not bench else 2, 3, image, image)]),
                     f"torchvision.models.VisionTransformer (image {image}, patch {patch}, {layers} layers, {heads} "
                     f"heads, hidden {hidden}, mlp {mlp}, {classes} classes)")


def torch_audio_encoder(rng):
    import torch
    from torch import nn

    n_mels, hidden, max_frames = 16, 64, 256

    class AudioEncoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv1d(n_mels, hidden, 3, padding=1)
            self.conv2 = nn.Conv1d(hidden, hidden, 3, stride=2, padding=1)
            self.register_buffer("pos", torch.from_numpy(sinusoid_table(max_frames // 2, hidden)))
            layer = nn.TransformerEncoderLayer(hidden, 4, dim_feedforward=128, dropout=0.0, activation="gelu",
                                               batch_first=True)
            self.layers = nn.TransformerEncoder(layer, num_layers=2)
            self.ln_post = nn.LayerNorm(hidden)

        def forward(self, mel):
            x = nn.functional.gelu(self.conv1(mel))
            x = nn.functional.gelu(self.conv2(x))
            x = x.transpose(1, 2)  # [batch, frames / 2, hidden]
            x = x + self.pos[: x.shape[1]]  # Slice whose end is read from the runtime shape
            return self.ln_post(self.layers(x))

    return TorchSpec(AudioEncoder(), 14, ["mel"], ["features"],
                     {"mel": {0: "batch", 2: "frames"}, "features": {0: "batch", 1: "time"}},
                     float_cases(rng, "mel", [(1, n_mels, 20), (2, n_mels, 34)]),
                     "Whisper-like: Conv1d(16->64, k3) GELU, Conv1d(64->64, k3, stride 2) GELU, + sinusoidal "
                     "positions sliced to the runtime length, 2 nn.TransformerEncoderLayer (gelu), LayerNorm")


def mel_filterbank(sample_rate, n_fft, n_mels, fmin, fmax):
    """Triangular mel filters as a [n_fft // 2 + 1, n_mels] float32 matrix (power spectrum @ filters = mel
    energies): HTK mel scale (2595 log10(1 + f / 700)), n_mels + 2 points evenly spaced in mel from fmin to
    fmax, each filter rising from one point to the next and falling to the one after, on the frequencies of
    the rfft bins; Slaney-style area normalization (each triangle scaled by 2 / its width in Hz), as
    librosa.filters.mel(htk=True, norm="slaney") computes it."""
    def hz_to_mel(f):
        return 2595.0 * np.log10(1.0 + np.asarray(f, np.float64) / 700.0)

    def mel_to_hz(m):
        return 700.0 * (10.0 ** (np.asarray(m, np.float64) / 2595.0) - 1.0)

    bins = np.arange(n_fft // 2 + 1) * sample_rate / n_fft
    edges = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - lower) / (centre - lower)
    falling = (upper - bins[None, :]) / (upper - centre)
    filters = np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (upper - lower))
    return filters.T.astype(np.float32)


def torch_bird_classifier(rng):
    import torch
    from torch import nn

    # A BirdCLEF-style clip classifier on raw 32 kHz audio (5-second windows, 160000 samples, in real use): a
    # log-mel front end computed in the graph (STFT n_fft 1024, hop 320, periodic Hann window, centred with
    # reflect padding as torch.stft(center=True) pads; power spectrum; 64 mel filters from 50 Hz to 16 kHz by
    # MatMul; log(x + 1e-6)), then a small CNN over the [batch, 1, 64, frames] image (4 blocks of Conv 3x3 +
    # BatchNorm + ReLU + MaxPool 2, 16 to 128 channels), the mean over frequency and time, a Linear to 24
    # classes. torch 1.13 has no ONNX symbolic for aten::stft at any opset (UnsupportedOperatorError at opset 17),
    # so the STFT is written as audio repositories write it for export (torchlibrosa, nnAudio): a Conv1d, stride
    # = hop, whose 1026 fixed kernels are the Hann-windowed cos and -sin rows of the DFT (513 real and 513
    # imaginary bins). The kernel is 1026 x 1024 float32: 4 MiB of the model's size.
    sample_rate, n_fft, hop, n_mels, classes = 32000, 1024, 320, 64, 24
    widths = (16, 32, 64, 128)

    class BirdClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            n = np.arange(n_fft)
            k = np.arange(n_fft // 2 + 1)[:, None]
            window = 0.5 - 0.5 * np.cos(2.0 * math.pi * n / n_fft)  # torch.hann_window(n_fft), periodic
            phase = 2.0 * math.pi * ((k * n) % n_fft) / n_fft
            kernels = np.concatenate([np.cos(phase) * window, -np.sin(phase) * window])[:, None, :]
            self.stft = nn.Conv1d(1, 2 * (n_fft // 2 + 1), n_fft, stride=hop, bias=False)
            self.stft.weight.data = torch.from_numpy(kernels.astype(np.float32))
            self.stft.weight.requires_grad_(False)
            self.register_buffer("mel_filters", torch.from_numpy(mel_filterbank(sample_rate, n_fft, n_mels,
                                                                                50.0, sample_rate / 2)))
            blocks = []
            for cin, cout in zip((1,) + widths[:-1], widths):
                blocks += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                           nn.MaxPool2d(2)]
            self.features = nn.Sequential(*blocks)
            self.head = nn.Linear(widths[-1], classes)

        def spectrogram(self, audio):
            """|STFT|^2 [batch, 513, frames], as torch.stft(audio, n_fft, hop, window=hann, center=True)."""
            x = nn.functional.pad(audio.unsqueeze(1), (n_fft // 2, n_fft // 2), mode="reflect")
            spec = self.stft(x)
            real, imag = spec[:, : n_fft // 2 + 1], spec[:, n_fft // 2 + 1:]
            return real * real + imag * imag

        def forward(self, audio):
            power = self.spectrogram(audio).transpose(1, 2)  # [batch, frames, 513]
            mel = torch.log(torch.matmul(power, self.mel_filters) + 1e-6)  # [batch, frames, 64]
            x = self.features(mel.transpose(1, 2).unsqueeze(1))  # [batch, 128, 64 / 16, frames / 16]
            return self.head(x.mean(dim=(2, 3)))

    module = BirdClassifier()
    spread_init(module.features, (nn.Conv2d,))

    def recording(samples):
        """Audio-like input in [-1, 1]: a rising chirp, a harmonic tone and background noise."""
        t = np.arange(samples) / sample_rate
        f0, f1 = rng.uniform(1000.0, 3000.0), rng.uniform(4000.0, 8000.0)
        chirp = np.sin(2 * math.pi * (f0 * t + (f1 - f0) * t * t / (2 * t[-1])))
        tone = sum(np.sin(2 * math.pi * h * rng.uniform(500.0, 1500.0) * t) / h for h in (1, 2, 3))
        return 0.3 * chirp + 0.1 * tone + 0.05 * rng.standard_normal(samples)

    cases = [{"audio": np.stack([recording(samples) for _ in range(batch)]).astype(np.float32)}
             for batch, samples in ((1, 16000), (2, 9600))]
    # The Conv1d is the STFT: check it against torch.stft on case 0.
    audio = torch.from_numpy(cases[0]["audio"])
    with torch.no_grad():
        expected = torch.stft(audio, n_fft, hop_length=hop, window=torch.hann_window(n_fft), center=True,
                              pad_mode="reflect", return_complex=True).abs() ** 2
        error = float((module.spectrogram(audio) - expected).abs().max() / expected.abs().max())
    assert error < 1e-5, f"the Conv1d STFT differs from torch.stft: {error:.3g}"
    return TorchSpec(module, 17, ["audio"], ["logits"], {"audio": {0: "batch", 1: "samples"}, "logits": {0: "batch"}},
                     cases, f"BirdCLEF-style: log-mel front end (STFT as a Conv1d of Hann-windowed DFT kernels, "
                            f"n_fft {n_fft}, hop {hop}, reflect-padded; power; {n_mels} mel filters by MatMul; log), "
                            f"CNN of 4 Conv-BN-ReLU-MaxPool blocks ({widths[0]} to {widths[-1]} channels), mean "
                            f"over frequency and time, Linear to {classes} classes; Conv1d STFT matches torch.stft "
                            f"to {error:.1g}")


def torch_seq2seq(rng):
    from torch import nn

    src_vocab, tgt_vocab, hidden = 50, 50, 64

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.src_embed = nn.Embedding(src_vocab, hidden)
            self.tgt_embed = nn.Embedding(tgt_vocab, hidden)
            self.transformer = nn.Transformer(hidden, nhead=4, num_encoder_layers=1, num_decoder_layers=1,
                                              dim_feedforward=128, dropout=0.0, batch_first=True)
            self.generator = nn.Linear(hidden, tgt_vocab)

        def forward(self, src_ids, tgt_ids):
            # -inf above the diagonal, from tgt's runtime length: ConstantOfShape -> Trilu.
            tgt_mask = nn.Transformer.generate_square_subsequent_mask(tgt_ids.shape[1])
            x = self.transformer(self.src_embed(src_ids), self.tgt_embed(tgt_ids), tgt_mask=tgt_mask)
            return self.generator(x)

    module = Seq2Seq()
    src = token_cases(rng, src_vocab, [(1, 7), (2, 12)], "src_ids")
    tgt = token_cases(rng, tgt_vocab, [(1, 5), (2, 9)], "tgt_ids")
    return TorchSpec(module, 14, ["src_ids", "tgt_ids"], ["logits"],
                     {"src_ids": {0: "batch", 1: "src_seq"}, "tgt_ids": {0: "batch", 1: "tgt_seq"},
                      "logits": {0: "batch", 1: "tgt_seq"}},
                     [{**s, **t} for s, t in zip(src, tgt)],
                     "nn.Transformer (d 64, 4 heads, 1 encoder + 1 decoder layer, ff 128) with src/tgt embeddings, "
                     "causal tgt mask from generate_square_subsequent_mask(tgt length), Linear to vocab 50")


def torch_paddle_reshape(rng):
    from torch import nn

    class PaddleReshape(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv_in = nn.Conv2d(3, 16, 3, padding=1)
            self.mix = nn.Linear(16, 16)
            self.conv_out = nn.Conv2d(16, 4, 3, padding=1)

        def forward(self, x):
            x = nn.functional.relu(self.conv_in(x))
            b, c, h, w = x.shape  # Shape -> Gather per dimension
            x = x.reshape(b, c, h * w).transpose(1, 2)  # Mul(h, w) -> Unsqueeze -> Concat -> Reshape
            x = self.mix(x)
            x = x.transpose(1, 2).reshape(b, -1, h, w)
            return self.conv_out(x)

    return TorchSpec(PaddleReshape(), 13, ["x"], ["out"],
                     {"x": {0: "batch", 2: "height", 3: "width"}, "out": {0: "batch", 2: "height", 3: "width"}},
                     float_cases(rng, "x", [(1, 3, 16, 16), (2, 3, 24, 20)]),
                     "Conv(3->16) ReLU, reshape(b, c, h*w) from the runtime shape, transpose, Linear(16), "
                     "transpose, reshape(b, -1, h, w), Conv(16->4)")


def torch_pad_shape_arith(rng):
    from torch import nn

    class PadShapeArith(nn.Module):
        def __init__(self):
            super().__init__()
            self.down = nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.head = nn.Conv2d(8, 3, 1)

        def forward(self, x):
            h, w = x.shape[-2:]
            ph = (8 - h % 8) % 8  # traced as Shape -> Gather -> Mod -> Sub -> Mod
            pw = (8 - w % 8) % 8
            y = nn.functional.pad(x, (0, pw, 0, ph))  # Pad whose pads come from a Concat
            y = nn.functional.relu(self.down(y))
            y = nn.functional.interpolate(y, scale_factor=2.0, mode="nearest")  # Resize
            y = y[..., :h, :w]  # Slice ends from the runtime shape
            return self.head(y) + x

    return TorchSpec(PadShapeArith(), 13, ["image"], ["out"],
                     {"image": {0: "batch", 2: "height", 3: "width"}, "out": {0: "batch", 2: "height", 3: "width"}},
                     float_cases(rng, "image", [(1, 3, 13, 21), (2, 3, 16, 16)]),
                     "pads H and W up to a multiple of 8 with pads from shape arithmetic, Conv(3->8, stride 2) "
                     "ReLU, nearest Resize x2, crop back to [:h, :w], Conv 1x1(8->3) + input")


def torch_rnn_tagger(rng, cell, bench=False):
    import torch
    from torch import nn

    vocab, embed, hidden, tags = (8000, 128, 256, 32) if bench else (100, 32, 48, 10)

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, embed)
            self.rnn = getattr(nn, cell)(embed, hidden, num_layers=2, bidirectional=True, batch_first=True)
            self.head = nn.Linear(2 * hidden, tags)

        def forward(self, input_ids):  # noqa: D102
            y, _ = self.rnn(self.embed(input_ids))  # no initial state: exported as zeros from Shape -> Gather
            return self.head(y)

    return TorchSpec(Tagger(), 14, ["input_ids"], ["tags"],
                     {"input_ids": {0: "batch", 1: "seq"}, "tags": {0: "batch", 1: "seq"}},
                     token_cases(rng, vocab, [(1, 128), (16, 128)] if bench else [(1, 9), (3, 16)]),
                     f"Embedding({vocab}, {embed}), nn.{cell} (2 layers, hidden {hidden}, bidirectional, batch_first), "
                     f"Linear({2 * hidden}, {tags})")


def torch_lstm_stream(rng, bench=False):
    import torch
    from torch import nn

    class Stream(nn.Module):
        """One step of a streaming voice-activity model: the LSTM state comes in and goes out."""

        def __init__(self):
            super().__init__()
            self.front = nn.Linear(512, 64)
            self.lstm = nn.LSTM(64, 64, num_layers=2, batch_first=True)
            self.head = nn.Linear(64, 1)

        def forward(self, frame, h, c):
            x = torch.relu(self.front(frame)).unsqueeze(1)
            y, (h_out, c_out) = self.lstm(x, (h, c))
            return torch.sigmoid(self.head(y[:, -1])), h_out, c_out

    cases = []
    for batch in (1, 4):
        cases.append({"frame": rng.standard_normal((batch, 512)).astype(np.float32),
                      "h": (0.5 * rng.standard_normal((2, batch, 64))).astype(np.float32),
                      "c": (0.5 * rng.standard_normal((2, batch, 64))).astype(np.float32)})
    return TorchSpec(Stream(), 14, ["frame", "h", "c"], ["speech", "h_out", "c_out"],
                     {"frame": {0: "batch"}, "h": {1: "batch"}, "c": {1: "batch"}, "speech": {0: "batch"},
                      "h_out": {1: "batch"}, "c_out": {1: "batch"}}, cases,
                     "streaming VAD step: Linear(512, 64) + ReLU, 2-layer LSTM(64) on one step with state in and out, "
                     "Linear(64, 1) + Sigmoid")


def torch_scripted_loop(rng):
    import torch
    from torch import nn

    class Refine(nn.Module):
        """Iterative refinement as users script it: a data-dependent number of steps, then a branch on a
        tensor value. torch.jit.script exports the loop as Loop (trip count from the `steps` input, a
        condition from the residual) and the branch as If; tracing would unroll the loop for the example."""

        def __init__(self):
            super().__init__()
            self.step = nn.Linear(16, 16)
            self.head = nn.Linear(16, 4)

        def forward(self, x, steps):
            h = x
            i = 0
            while i < int(steps) and float(h.abs().mean()) < 10.0:
                h = torch.tanh(self.step(h)) + h
                i += 1
            if bool(h.sum() > 0):
                out = self.head(h) * 2.0
            else:
                out = -self.head(h)
            return out

    cases = []
    for batch, steps in ((2, 3), (5, 7)):
        cases.append({"x": rng.standard_normal((batch, 16)).astype(np.float32), "steps": np.array(steps, np.int64)})
    # The module is scripted by write_torch_model (TorchSpec.script), after the seeded weights exist.
    spec = TorchSpec(Refine(), 14, ["x", "steps"], ["y"], {"x": {0: "batch"}, "y": {0: "batch"}}, cases,
                     "torch.jit.script: a while loop (Loop, trip count from the int64 input `steps`, stops early on "
                     "a residual test) of Linear(16, 16) + tanh + residual, then an If on the sign of the sum "
                     "choosing between two Linear(16, 4) heads")
    spec.script = True
    return spec


def torch_gated_encoder(rng, bench=False):
    import torch
    from torch import nn

    width = 128 if bench else 16

    def encoder(stride):
        return nn.Sequential(nn.Conv1d(1, width, 9, stride=stride, padding=4), nn.ReLU(),
                             nn.Conv1d(width, width, 5, padding=2), nn.ReLU(),
                             nn.Conv1d(width, width, 5, stride=2, padding=2), nn.ReLU())

    class GatedEncoder(nn.Module):
        """A speech front end as voice-activity models ship it: the sample rate is an input and chooses
        the encoder (torch.jit.script exports the choice as an If whose branches hold the convolutions),
        then a shared head scores each frame."""

        def __init__(self):
            super().__init__()
            self.enc16 = encoder(4)
            self.enc8 = encoder(2)
            self.head = nn.Conv1d(width, 1, 1)

        def forward(self, audio, sample_rate):
            if int(sample_rate) == 16000:
                features = self.enc16(audio)
            else:
                features = self.enc8(audio)
            return torch.sigmoid(self.head(features))

    samples = 16000 if bench else 512
    cases = [{"audio": rng.standard_normal((2, 1, samples)).astype(np.float32), "sample_rate": np.array(16000, np.int64)},
             {"audio": rng.standard_normal((3, 1, samples // 2)).astype(np.float32), "sample_rate": np.array(8000, np.int64)}]
    spec = TorchSpec(GatedEncoder(), 14, ["audio", "sample_rate"], ["speech"],
                     {"audio": {0: "batch", 2: "samples"}, "speech": {0: "batch", 2: "frames"}}, cases,
                     "torch.jit.script: an If on the int64 input `sample_rate` choosing one of two Conv1d encoders "
                     f"(3 convs, {width} channels), then a shared 1x1 conv head and a sigmoid per frame")
    spec.script = True
    return spec


def spread_init(net, conv_types):
    """He-initialised convolutions (of conv_types) and batch norms with spread statistics, in module order:
    with torchvision's own init (normal(0, 0.03), unit batch norms) a seeded CNN's signal fades through a
    deep backbone, and every input gives nearly the same output."""
    import torch
    from torch import nn

    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, conv_types):
                nn.init.kaiming_normal_(module.weight, a=0.5)
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.1, 0.1)


def torch_ssdlite_detector(rng, bench=False):
    import torch
    import torchvision
    from torch import nn
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large

    # torchvision's own builder, weights=None. The corpus copy is narrow (width_mult 0.25, 4 classes +
    # background: 2.6 MB instead of 14) and keeps only confident detections; the benchmark copy is the
    # full model with its defaults (91 classes, 300 detections).
    options = {} if bench else {"num_classes": 5, "width_mult": 0.25, "score_thresh": 0.2, "detections_per_img": 50,
                                "topk_candidates": 4000}
    net = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, **options)
    # The builder's init (normal(0, 0.03), zero biases, unit batch norms) lets the signal fade through the
    # backbone: every image gets the same, nearly uniform scores. He-initialised convs and spread batch
    # norms and class logits give detections that depend on the image and NMS decisions that mean something.
    spread_init(net, (nn.Conv2d,))
    with torch.no_grad():
        for block in net.head.classification_head.module_list:
            [c for c in block.modules() if isinstance(c, nn.Conv2d)][-1].weight.mul_(0.2)

    class Detector(nn.Module):
        """The detector on one image tensor (torchvision takes a list of them): same graph."""

        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, image):
            found = self.net([image])[0]
            return found["boxes"], found["scores"], found["labels"]

    shapes = [(3, 320, 320), (3, 240, 400)]
    cases = [{"image": rng.random(shape, dtype=np.float32)} for shape in shapes]
    spec = TorchSpec(Detector(), 14, ["image"], ["boxes", "scores", "labels"],
                     {"image": {1: "height", 2: "width"}, "boxes": {0: "detections"}, "scores": {0: "detections"},
                      "labels": {0: "detections"}}, cases,
                     "torchvision ssdlite320_mobilenet_v3_large(weights=None" +
                     ("" if bench else ", width_mult=0.25, 5 classes") + "): resize to 320x320, MobileNetV3 + "
                     "SSDLite heads, per-class score threshold / TopK / NonZero / GatherND, batched NMS inside an If, "
                     "boxes scaled back to the image")
    # The inputs of batched_nms in PyTorch's run (the candidates NMS chooses from), saved as
    # case<K>.nms.<boxes|scores|labels>.npy: tests compare those at 1e-4 and judge the detections after NMS
    # with a rule that tolerates near-tied scores (tests/test_detector.cpp).
    spec.nms_inputs = torchvision.ops.boxes
    spec.peak_range = (0.01, 1000.0)  # box corners in pixels; 91-class softmax scores
    return spec


def torch_text_detector(rng, bench=False):
    import torch
    import torchvision
    from torch import nn
    from torch.nn import functional as F

    # A DBNet-like text detector, as OCR pipelines ship them: torchvision's MobileNetV3-Large backbone
    # (width 0.5, 0.25 in the corpus; weights=None, seeded), an FPN over its stride 4/8/16/32 features, the four levels
    # upsampled to 1/4 and concatenated, and DBNet's probability head: conv 3x3 + BN + ReLU, two 2x2
    # ConvTranspose (each but the last with BN + ReLU) back to full resolution, Sigmoid. Corpus: 64x64 and
    # 96x128 images; benchmark: 640x640.
    width, inner = (0.5, 96) if bench else (0.25, 32)
    backbone = torchvision.models.mobilenet_v3_large(weights=None, width_mult=width).features

    class TextDetector(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = backbone
            self.taps = [3, 6, 12, 16]  # the last block of stride 4, 8, 16 and 32
            with torch.no_grad():
                x, channels = torch.zeros(1, 3, 64, 64), []
                for i, block in enumerate(self.backbone):
                    x = block(x)
                    if i in self.taps:
                        channels.append(x.shape[1])
            self.lateral = nn.ModuleList(nn.Conv2d(c, inner, 1, bias=False) for c in channels)
            self.smooth = nn.ModuleList(nn.Conv2d(inner, inner // 4, 3, padding=1, bias=False) for _ in channels)
            self.head = nn.Sequential(
                nn.Conv2d(inner, inner // 4, 3, padding=1, bias=False), nn.BatchNorm2d(inner // 4), nn.ReLU(),
                nn.ConvTranspose2d(inner // 4, inner // 4, 2, stride=2), nn.BatchNorm2d(inner // 4), nn.ReLU(),
                nn.ConvTranspose2d(inner // 4, 1, 2, stride=2), nn.Sigmoid())

        def forward(self, image):
            features, x = [], image
            for i, block in enumerate(self.backbone):
                x = block(x)
                if i in self.taps:
                    features.append(x)
            laterals = [conv(f) for conv, f in zip(self.lateral, features)]
            for i in range(len(laterals) - 1, 0, -1):  # top-down: upsample and add
                laterals[i - 1] = laterals[i - 1] + F.interpolate(laterals[i], scale_factor=2.0, mode="nearest")
            levels = [conv(l) for conv, l in zip(self.smooth, laterals)]
            levels = [levels[0]] + [F.interpolate(l, scale_factor=2.0 ** i, mode="nearest")
                                    for i, l in enumerate(levels[1:], 1)]
            return self.head(torch.cat(levels, dim=1))

    module = TextDetector()
    spread_init(module, (nn.Conv2d, nn.ConvTranspose2d))
    shapes = [(1, 3, 640, 640), (1, 3, 480, 640)] if bench else [(1, 3, 64, 64), (2, 3, 96, 128)]
    cases = [{"image": rng.random(shape, dtype=np.float32)} for shape in shapes]
    spec = TorchSpec(module, 14, ["image"], ["probability"],
                     {"image": {0: "batch", 2: "height", 3: "width"}, "probability": {0: "batch", 2: "height", 3: "width"}},
                     cases, f"DBNet-like text detector: torchvision mobilenet_v3_large(width_mult={width}, weights=None) "
                            f"features, FPN ({inner} channels), ConvTranspose probability head")
    spec.peak_range = (0.5, 1.0)  # a sigmoid map
    return spec


def torch_unet(rng, bench=False):
    import torch
    from torch import nn

    # The original U-Net's shape (Ronneberger et al.), as segmentation tutorials write it from torch.nn: per level
    # two Conv 3x3 (no bias) + BatchNorm + ReLU, MaxPool 2x2 down, ConvTranspose 2x2 stride 2 up, the skip
    # concatenated before the up path's double conv, a 1x1 head to 2 classes. Benchmark: 4 levels of 32 to 256
    # channels + a 512-channel bottleneck, 256x256 images; corpus: 3 levels of 8 to 32 channels.
    widths = (32, 64, 128, 256, 512) if bench else (8, 16, 32, 64)

    def double_conv(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                             nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.down = nn.ModuleList([double_conv(3, widths[0])] +
                                      [double_conv(a, b) for a, b in zip(widths[:-1], widths[1:])])
            self.pool = nn.MaxPool2d(2)
            self.up = nn.ModuleList(nn.ConvTranspose2d(b, a, 2, stride=2) for a, b in zip(widths[:-1], widths[1:]))
            self.merge = nn.ModuleList(double_conv(2 * a, a) for a in widths[:-1])
            self.head = nn.Conv2d(widths[0], 2, 1)

        def forward(self, image):
            skips, x = [], image
            for i, block in enumerate(self.down):
                x = block(x if i == 0 else self.pool(x))
                skips.append(x)
            x = skips.pop()
            for up, merge in zip(reversed(self.up), reversed(self.merge)):
                x = merge(torch.cat([skips.pop(), up(x)], dim=1))
            return self.head(x)

    module = UNet()
    spread_init(module, (nn.Conv2d, nn.ConvTranspose2d))
    shapes = [(1, 3, 256, 256), (1, 3, 192, 256)] if bench else [(1, 3, 32, 32), (2, 3, 48, 64)]
    cases = [{"image": rng.random(shape, dtype=np.float32)} for shape in shapes]
    return TorchSpec(module, 13, ["image"], ["mask"],
                     {"image": {0: "batch", 2: "height", 3: "width"}, "mask": {0: "batch", 2: "height", 3: "width"}},
                     cases, f"U-Net from torch.nn ({len(widths) - 1} levels, {widths[0]} to {widths[-1]} channels): "
                            "Conv-BN-ReLU pairs, MaxPool, ConvTranspose 2x2, skip Concat, 1x1 head")


def torch_face_embedding(rng, bench=False):
    import torch
    from torch import nn

    # MobileFaceNet (Chen et al. 2018), the shape face-recognition packages ship: Conv-BN-PReLU with one PReLU
    # slope per channel, inverted-residual bottlenecks (1x1 expand + PReLU, depthwise 3x3 + PReLU, linear 1x1
    # projection), a global depthwise 7x7 conv instead of pooling, a linear 1x1 to the embedding. Benchmark: the
    # paper's widths on 112x112 faces (0.23 GFLOP); corpus: a quarter of them on 56x56.
    k = 1 if bench else 4
    size = 112 if bench else 56
    # (expansion, channels, repeats, stride) per stage, the paper's table 1
    stages = [(2, 64, 5, 2), (4, 128, 1, 2), (2, 128, 6, 1), (4, 128, 1, 2), (2, 128, 2, 1)]
    if not bench:
        stages = [(t, c, min(n, 2), s) for t, c, n, s in stages]

    def conv_bn(cin, cout, kernel, stride=1, groups=1, prelu=True):
        layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2 if kernel == 3 else 0, groups=groups, bias=False),
                  nn.BatchNorm2d(cout)]
        return nn.Sequential(*(layers + [nn.PReLU(cout)] if prelu else layers))

    class Bottleneck(nn.Module):
        def __init__(self, cin, cout, expansion, stride):
            super().__init__()
            mid = cin * expansion
            self.residual = stride == 1 and cin == cout
            self.body = nn.Sequential(conv_bn(cin, mid, 1), conv_bn(mid, mid, 3, stride, groups=mid),
                                      conv_bn(mid, cout, 1, prelu=False))

        def forward(self, x):
            return x + self.body(x) if self.residual else self.body(x)

    class FaceEmbedding(nn.Module):
        def __init__(self):
            super().__init__()
            width = 64 // k
            layers = [conv_bn(3, width, 3, 2), conv_bn(width, width, 3, groups=width)]
            for t, c, n, s in stages:
                for i in range(n):
                    layers.append(Bottleneck(width, c // k, t, s if i == 0 else 1))
                    width = c // k
            layers.append(conv_bn(width, 512 // k, 1))
            self.features = nn.Sequential(*layers)
            side = -(-size // 16)  # four stride-2 layers, each rounding up
            self.gdc = conv_bn(512 // k, 512 // k, side, groups=512 // k, prelu=False)  # global depthwise
            self.embed = nn.Sequential(nn.Conv2d(512 // k, 128 // k, 1, bias=False), nn.BatchNorm2d(128 // k))

        def forward(self, face):
            return torch.flatten(self.embed(self.gdc(self.features(face))), 1)

    module = FaceEmbedding()
    spread_init(module, (nn.Conv2d,))
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.PReLU):  # slopes per channel around PReLU's 0.25, as trained ones are
                m.weight.copy_(torch.from_numpy(rng.uniform(0.05, 0.5, m.weight.shape).astype(np.float32)))
            if isinstance(m, Bottleneck) and m.residual:  # small residual branches, as trained ones start
                m.body[-1][1].weight.uniform_(0.1, 0.3)
    shapes = [(1, 3, size, size), (4, 3, size, size)]
    cases = [{"face": rng.random(shape, dtype=np.float32)} for shape in shapes]
    return TorchSpec(module, 13, ["face"], ["embedding"], {"face": {0: "batch"}, "embedding": {0: "batch"}},
                     cases, f"MobileFaceNet-style face embedding ({size}x{size}): Conv-BN-PReLU per channel, "
                            "inverted residuals, global depthwise conv, linear embedding")


def torch_roi_box_head(rng, bench=False):
    import torch
    import torchvision
    from torch import nn

    # A two-stage detector's second stage, as Faster R-CNN runs it: a backbone's stride-16 feature map,
    # torchvision.ops.RoIAlign (7x7 bins, sampling_ratio 2, aligned: RoiAlign-16 with half_pixel) over the
    # proposals, then the box head (flatten, two Linear + ReLU, class scores and box deltas). Proposals come
    # in as torchvision takes them, [K, 5] rows of (batch index, x1, y1, x2, y2); K is dynamic. Benchmark:
    # torchvision resnet18's layers to stride 16 (256 channels), a 800x800 image, 300 proposals; corpus:
    # three convolutions to 32 channels, 64x64 and 96x128 images.
    if bench:
        r = torchvision.models.resnet18(weights=None)
        backbone = nn.Sequential(r.conv1, r.bn1, r.relu, r.maxpool, r.layer1, r.layer2, r.layer3)
        channels, hidden, classes = 256, 256, 5
    else:
        backbone = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 24, 3, 2, 1), nn.ReLU(),
                                 nn.Conv2d(24, 24, 3, 2, 1), nn.ReLU(), nn.Conv2d(24, 32, 3, 2, 1))
        channels, hidden, classes = 32, 64, 5

    class BoxHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = backbone
            self.pool = torchvision.ops.RoIAlign(output_size=7, spatial_scale=1.0 / 16, sampling_ratio=2, aligned=True)
            self.fc = nn.Sequential(nn.Flatten(), nn.Linear(channels * 49, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                    nn.ReLU())
            self.scores = nn.Linear(hidden, classes)
            self.deltas = nn.Linear(hidden, classes * 4)

        def forward(self, image, proposals):
            x = self.fc(self.pool(self.backbone(image), proposals))
            return self.scores(x).softmax(-1), self.deltas(x)

    module = BoxHead()
    spread_init(module, (nn.Conv2d,))

    def proposals(count, batch, height, width):
        corners = np.sort(rng.uniform(-0.05, 1.05, size=(count, 2, 2)), axis=1)  # partly outside the image
        boxes = np.stack([corners[:, 0, 0] * width, corners[:, 1, 0] * height, corners[:, 0, 1] * width,
                          corners[:, 1, 1] * height], axis=1)
        return np.concatenate([rng.integers(0, batch, size=(count, 1)), boxes], axis=1).astype(np.float32)

    shapes = [(1, 800, 800, 300), (1, 640, 800, 200)] if bench else [(1, 64, 64, 20), (2, 96, 128, 33)]
    cases = [{"image": rng.random((b, 3, h, w), dtype=np.float32), "proposals": proposals(k, b, h, w)}
             for b, h, w, k in shapes]
    spec = TorchSpec(module, 16, ["image", "proposals"], ["scores", "deltas"],
                     {"image": {0: "batch", 2: "height", 3: "width"}, "proposals": {0: "rois"},
                      "scores": {0: "rois"}, "deltas": {0: "rois"}}, cases,
                     "Faster R-CNN-like box head: " + ("torchvision resnet18 to stride 16" if bench else "4 convs to 32 channels") +
                     ", torchvision.ops.RoIAlign 7x7 (ratio 2, aligned) over [K, 5] proposals, two-Linear box head")
    spec.peak_range = (0.1, 1000.0)
    return spec


def torch_fpn_box_head(rng, bench=False):
    import torch
    import torchvision
    from torch import nn

    # Faster R-CNN's second stage over a feature pyramid, as torchvision exports it: two levels (strides 4
    # and 8), torchvision.ops.MultiScaleRoIAlign (7x7, ratio 2) mapping each proposal to a level by its size
    # (LevelMapper: floor(4 + log2(sqrt(area) / 224)), clamped: under 112 pixels level 2, else 3), NonZero per
    # level, RoiAlign there, and the levels merged back in proposal order (a ScatterElements along axis 0
    # of an expanded index); then a box head as roi_box_head's. Proposals [K, 4] (x1, y1, x2, y2) of one
    # image, K dynamic. Case 0 maps proposals to both levels; case 1 has only small ones, so at run time
    # the stride-8 level gets no proposal (an empty tensor through a later stage).
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.c2 = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 16, 3, 2, 1))
            self.c3 = nn.Sequential(nn.ReLU(), nn.Conv2d(16, 16, 3, 2, 1))
            self.pool = torchvision.ops.MultiScaleRoIAlign(["p2", "p3"], output_size=7, sampling_ratio=2)
            self.fc = nn.Sequential(nn.Flatten(), nn.Linear(16 * 49, 64), nn.ReLU())
            self.scores = nn.Linear(64, 5)
            self.deltas = nn.Linear(64, 20)

        def forward(self, image, proposals):
            p2 = self.c2(image)
            p3 = self.c3(p2)
            x = self.pool({"p2": p2, "p3": p3}, [proposals], [(image.shape[-2], image.shape[-1])])
            x = self.fc(x)
            return self.scores(x).softmax(-1), self.deltas(x)

    module = Head()
    spread_init(module, (nn.Conv2d,))

    def proposals(count, height, width, smallest, largest):
        size = rng.uniform(smallest, largest, size=(count, 2))
        x1 = rng.uniform(0, width - size[:, 0])
        y1 = rng.uniform(0, height - size[:, 1])
        return np.stack([x1, y1, x1 + size[:, 0], y1 + size[:, 1]], axis=1).astype(np.float32)

    cases = [{"image": rng.random((1, 3, 160, 192), dtype=np.float32), "proposals": proposals(24, 160, 192, 16, 150)},
             {"image": rng.random((1, 3, 128, 128), dtype=np.float32), "proposals": proposals(11, 128, 128, 8, 90)}]
    # Opset 13: torchvision 0.14 exports roi_align(aligned=False) (MultiScaleRoIAlign's) without a
    # coordinate_transformation_mode, which from RoiAlign-16 on defaults to half_pixel, i.e. aligned=True:
    # at opset 16 the file disagrees with PyTorch (ONNX Runtime and Ondine agree with each other). RoiAlign-10
    # has only PyTorch's aligned=False behaviour.
    spec = TorchSpec(module, 13, ["image", "proposals"], ["scores", "deltas"],
                     {"image": {2: "height", 3: "width"}, "proposals": {0: "rois"}, "scores": {0: "rois"},
                      "deltas": {0: "rois"}}, cases,
                     "Faster R-CNN-like FPN box head: 3 convs to levels p2, p3 (16 channels), "
                     "torchvision.ops.MultiScaleRoIAlign 7x7 over [K, 4] proposals, two-Linear box head")
    spec.peak_range = (0.1, 1000.0)
    return spec


def torch_norm_head(rng, bench=False):
    import torch
    from torch import nn

    # The normalisations torch exports through InstanceNormalization: nn.GroupNorm (before opset 18, as
    # Reshape [N, G, -1] -> InstanceNormalization(ones, zeros) -> Reshape(Shape(x)) -> Mul -> Add) after a
    # conv and before ReLU as torchvision's FCOS/RetinaNet heads have it, before SiLU as diffusion U-Nets
    # have it, and nn.InstanceNorm2d(affine=True) as style-transfer nets have it.
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 32, 3, 2, 1)
            tower = []
            for _ in range(2):
                tower += [nn.Conv2d(32, 32, 3, 1, 1), nn.GroupNorm(8, 32), nn.ReLU()]
            self.tower = nn.Sequential(*tower)
            self.diffusion = nn.Sequential(nn.GroupNorm(4, 32), nn.SiLU(), nn.Conv2d(32, 16, 3, 1, 1))
            self.style = nn.Sequential(nn.InstanceNorm2d(16, affine=True), nn.ReLU(), nn.Conv2d(16, 4, 1))

        def forward(self, image):
            return self.style(self.diffusion(self.tower(self.stem(image))))

    module = Head()
    spread_init(module, (nn.Conv2d,))
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.GroupNorm, nn.InstanceNorm2d)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    cases = [{"image": rng.random((1, 3, 64, 80), dtype=np.float32)},
             {"image": rng.random((2, 3, 48, 48), dtype=np.float32)}]
    spec = TorchSpec(module, 13, ["image"], ["maps"],
                     {"image": {0: "batch", 2: "height", 3: "width"}, "maps": {0: "batch", 2: "h2", 3: "w2"}}, cases,
                     "GroupNorm + ReLU tower (FCOS-like), GroupNorm + SiLU, InstanceNorm2d(affine) + ReLU")
    return spec


def torch_convnext_blocks(rng, bench=False):
    import torch
    from torch import nn
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    # 20 channels: not a multiple of 8, so channel-blocked activations carry padding; 40: of 8, not of 16.
    module = ConvNeXt([CNBlockConfig(20, 40, 2), CNBlockConfig(40, None, 1)], num_classes=10)
    spread_init(module, (nn.Conv2d,))
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("layer_scale"):  # 1e-6 at init: the blocks would add nothing measurable
                param.uniform_(0.5, 1.5)
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    cases = [{"image": rng.random((1, 3, 64, 64), dtype=np.float32)},
             {"image": rng.random((2, 3, 48, 80), dtype=np.float32)}]
    return TorchSpec(module, 13, ["image"], ["logits"],
                     {"image": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}}, cases,
                     "torchvision ConvNeXt, stages of 20 and 40 channels (2 + 1 blocks), 10 classes")


def torch_token_pool(rng):
    import torch
    from torch import nn

    class TokenPool(nn.Module):
        """MViT-style pooled attention: a class token beside a grid of patch tokens, K and V pooled on the
        grid. As torchvision's MViT writes it, torch.tensor_split(t, indices=(1,), dim=1) separates the class
        token; PyTorch exports that split into a Python list as SequenceEmpty + Loop { Slice; SequenceInsert }
        + SequenceAt (opset 13 and later), so the pooled shapes pass through a Loop and a sequence."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Conv2d(3, 32, 4, stride=4)
            self.cls = nn.Parameter(0.5 * torch.randn(1, 1, 32))
            self.qkv = nn.Linear(32, 96)
            self.pool = nn.Conv2d(32, 32, 3, stride=2, padding=1, groups=32, bias=False)
            self.norm = nn.LayerNorm(32)
            self.proj = nn.Linear(32, 32)

        def forward(self, image):
            t = self.embed(image)
            b, c, h, w = t.shape
            x = torch.cat((self.cls.expand(b, -1, -1), t.flatten(2).transpose(1, 2)), dim=1)
            q, k, v = self.qkv(x).chunk(3, dim=-1)

            def pool(u):
                cls, grid = torch.tensor_split(u, indices=(1,), dim=1)
                grid = self.pool(grid.transpose(1, 2).reshape(b, c, h, w)).flatten(2).transpose(1, 2)
                return self.norm(torch.cat((cls, grid), dim=1))

            k, v = pool(k), pool(v)
            a = torch.softmax(q @ k.transpose(1, 2) / c ** 0.5, dim=-1)
            return x + self.proj(a @ v)

    cases = [{"image": rng.random((1, 3, 32, 32), dtype=np.float32)},
             {"image": rng.random((2, 3, 24, 40), dtype=np.float32)}]
    return TorchSpec(TokenPool(), 16, ["image"], ["tokens"],
                     {"image": {0: "batch", 2: "height", 3: "width"}, "tokens": {0: "batch", 1: "tokens"}}, cases,
                     "MViT-style pooled attention: patch embedding + class token, K and V pooled on the grid after "
                     "torch.tensor_split (SequenceEmpty + Loop + SequenceInsert + SequenceAt), LayerNorm, softmax "
                     "attention, projection + residual")

def torch_vision_net(arch, rng, bench=False):
    """torchvision's own builders, weights=None, seeded: the light CNNs and segmenters of bench/peers.py
    (efficientnet_b0, mobilenet_v2, convnext_tiny, resnet18: ImageNet classifiers at 224x224; lraspp_mobilenet_v3_large,
    deeplabv3_mobilenet_v3_large: 21-class segmenters at 512x512). Benchmark size only: their weights (9 to
    110 MB) stay out of the repository's corpus."""
    import torch
    import torchvision
    from torch import nn

    segmenter = arch.startswith(("lraspp", "deeplabv3"))
    if segmenter:
        net = getattr(torchvision.models.segmentation, arch)(weights=None, weights_backbone=None, num_classes=21)
    else:
        net = getattr(torchvision.models, arch)(weights=None)
    spread_init(net, (nn.Conv2d,))

    class Segmenter(nn.Module):
        """The segmentation map alone (torchvision returns a dict {"out": ...})."""

        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, image):
            return self.net(image)["out"]

    module = Segmenter() if segmenter else net
    size = 512 if segmenter else 224
    shapes = [(1, 3, size, size), (2, 3, size, size)]
    cases = [{"image": rng.random(shape, dtype=np.float32)} for shape in shapes]
    output = "scores" if segmenter else "logits"
    axes = {"image": {0: "batch"}, output: {0: "batch"}}
    spec = TorchSpec(module, 14, ["image"], [output], axes, cases,
                     f"torchvision {arch}(weights=None), seeded He init, {size}x{size}")
    return spec


VISION_NETS = {"efficientnet_b0": "efficientnet_pt", "mobilenet_v2": "mobilenetv2_pt", "convnext_tiny": "convnext_pt",
               "lraspp_mobilenet_v3_large": "lraspp_pt", "deeplabv3_mobilenet_v3_large": "deeplab_pt",
               "resnet18": "resnet18_pt"}


TORCH_MODELS = {
    "bert_encoder": torch_bert_encoder,
    "gpt_decoder": torch_gpt_decoder,
    "hf_bert": torch_hf_bert,
    "gpt2_kv": torch_gpt2_kv,
    "llama_kv": torch_llama_kv,
    "vit_small": torch_vit_small,
    "audio_encoder": torch_audio_encoder,
    "bird_classifier": torch_bird_classifier,
    "seq2seq": torch_seq2seq,
    "paddle_reshape": torch_paddle_reshape,
    "pad_shape_arith": torch_pad_shape_arith,
    "lstm_tagger": lambda rng, bench=False: torch_rnn_tagger(rng, "LSTM", bench),
    "gru_tagger": lambda rng, bench=False: torch_rnn_tagger(rng, "GRU", bench),
    "lstm_stream": torch_lstm_stream,
    "scripted_loop": torch_scripted_loop,
    "ssdlite_detector": torch_ssdlite_detector,
    "gated_encoder": torch_gated_encoder,
    "text_detector": torch_text_detector,
    "roi_box_head": torch_roi_box_head,
    "fpn_box_head": torch_fpn_box_head,
    "norm_head": torch_norm_head,
    "convnext_blocks": torch_convnext_blocks,
    "token_pool": torch_token_pool,
    "unet": torch_unet,
    "face_embedding": torch_face_embedding,
    "unet_fp16": lambda rng, bench=False: float16_spec(torch_unet(rng, bench)),
    "unet_dynq": lambda rng, bench=False: dynamic_quant_spec(torch_unet(rng, bench)),
}


# --torch-bench: the same builders at benchmark size (bench/peers.py rows); the streaming LSTM step is the
# corpus model itself.
TORCH_BENCH = {"bert_pt": "bert_encoder", "gpt_pt": "gpt_decoder", "vit_pt": "vit_small", "lstm_pt": "lstm_tagger",
               "gru_pt": "gru_tagger", "stream_pt": "lstm_stream", "ssd_pt": "ssdlite_detector",
               "gated_pt": "gated_encoder", "textdet_pt": "text_detector", "roihead_pt": "roi_box_head",
               "unet_pt": "unet", "hf_bert_pt": "hf_bert", "gpt2_kv_pt": "gpt2_kv", "llama_kv_pt": "llama_kv",
               "unet_fp16_pt": "unet_fp16", "unet_dynq_pt": "unet_dynq", "faceembed_pt": "face_embedding"}
TORCH_BENCH.update({bench_name: arch for arch, bench_name in VISION_NETS.items()})


def torch_seed(seed, name):
    """torch.manual_seed value per (seed, model): stable across runs and --which subsets."""
    return int(model_rng(seed, name, "torch.weights").integers(2**31))


def torch_outputs(module, tensors):
    """The module's outputs as numpy arrays, computed with autograd on (see the note in write_torch_model)."""
    outputs = module(*tensors)
    if not isinstance(outputs, (tuple, list)):
        outputs = (outputs,)
    return [o.detach().numpy() for o in outputs]


def op_counts(model):
    counts = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return " ".join(f"{op}:{n}" for op, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def value_signature(value):
    dims = [d.dim_param or str(d.dim_value) for d in value.type.tensor_type.shape.dim]
    dtype = TensorProto.DataType.Name(value.type.tensor_type.elem_type).lower()
    return f"{value.name} {dtype}[{','.join(dims)}]"


def write_torch_model(name, out_dir, seed, verify, bench=False):
    """Export one TORCH_MODELS (or, bench, TORCH_BENCH) entry to out_dir/name/ with its cases; return False if a
    check fails."""
    import torch

    torch.manual_seed(torch_seed(seed, name))
    if bench and TORCH_BENCH[name] in VISION_NETS:
        arch = TORCH_BENCH[name]
        builder = lambda rng, bench: torch_vision_net(arch, rng, bench)  # noqa: E731
    else:
        builder = TORCH_MODELS[TORCH_BENCH[name]] if bench else TORCH_MODELS[name]
    spec = builder(model_rng(seed, name, "inputs"), bench=True) if bench else builder(model_rng(seed, name, "inputs"))
    module = spec.module.eval()
    model_dir = os.path.join(out_dir, name)
    os.makedirs(model_dir, exist_ok=True)
    for stale in os.listdir(model_dir):
        if stale.startswith(("case", "decode.")) and stale.endswith(".npy"):
            os.remove(os.path.join(model_dir, stale))
    path = os.path.join(model_dir, "model.onnx")

    # Exported and run with autograd ON, on purpose: in eval mode under torch.no_grad() torch 1.13 sends
    # nn.TransformerEncoder(Layer) and nn.MultiheadAttention (so torchvision's ViT too) to their fused "fast
    # path", which has no ONNX symbolic: export fails with UnsupportedOperatorError on
    # aten::_transformer_encoder_layer_fwd (audio_encoder), aten::_native_multi_head_attention (vit_small)
    # or aten::logical_not (bert_encoder: the nested-tensor path taken for a padding mask). With parameters
    # requiring grad the fast path is skipped and the ordinary ops are traced; the saved outputs take the
    # same path (torch_outputs).
    if spec.script:
        module = torch.jit.script(module)
    example = tuple(torch.from_numpy(spec.cases[0][n]) for n in spec.input_names)
    start = time.perf_counter()
    torch.onnx.export(module, example, path, input_names=spec.input_names, output_names=spec.output_names,
                      dynamic_axes=spec.dynamic_axes, opset_version=spec.opset)
    exported = time.perf_counter() - start

    model = onnx.load(path)
    onnx.checker.check_model(model)
    # No runtime here to run the export on case 1 (onnx 1.12 has no onnx.reference), so check instead that
    # tracing with case 1's shapes writes the same graph: nothing that depends on the example's batch,
    # length or spatial size (a Python int the tracer did not see through) was baked in as a constant.
    # A scripted module does not depend on the example (and its exports differ in generated names), so
    # it skips the check.
    retraced = io.BytesIO()
    if not spec.script:
        torch.onnx.export(module, tuple(torch.from_numpy(spec.cases[1][n]) for n in spec.input_names), retraced,
                          input_names=spec.input_names, output_names=spec.output_names,
                          dynamic_axes=spec.dynamic_axes, opset_version=spec.opset)
        retraced = onnx.load_from_string(retraced.getvalue())
    for field in ("node", "initializer", "input", "output") if not spec.script else ():
        if [v.SerializeToString() for v in getattr(model.graph, field)] != \
                [v.SerializeToString() for v in getattr(retraced.graph, field)]:
            print(f"{path}: graph.{field} changes when traced with case 1's shapes: the export is not dynamic")
            return False
    if spec.float16:
        model = to_float16(model)
        onnx.save(model, path)
    if spec.dynamic_quant:
        model = quantize_dynamic_convs(model)
        onnx.save(model, path)
    inferred = check(model, path)  # onnx.checker on the file and strict shape inference, declared outputs kept
    print(f"{path}: opset {spec.opset}, {len(model.graph.node)} nodes, {os.path.getsize(path) / 1024:.0f} KiB, "
          f"exported in {exported:.1f} s, checker ok, "
          f"{'scripted' if spec.script else 'same graph traced with case 1'}, "
          f"{inferred} inferred shapes; "
          f"{' '.join(value_signature(v) for v in model.graph.input)} -> "
          f"{' '.join(value_signature(v) for v in model.graph.output)}")
    print(f"  {spec.doc}")
    print(f"  ops {op_counts(model)}")

    try:
        from onnx.reference import ReferenceEvaluator
    except ImportError:
        ReferenceEvaluator = None
    ok = True
    for index, case in enumerate(spec.cases):
        prefix = os.path.join(model_dir, f"case{index}")
        files = {}
        for input_name in spec.input_names:
            files[input_name] = f"{prefix}.{input_name}.npy"
            np.save(files[input_name], case[input_name])
        recorded = []
        if spec.nms_inputs is not None:
            original = spec.nms_inputs.batched_nms

            def recording(boxes, scores, idxs, iou_threshold):
                recorded.append((boxes.detach().numpy(), scores.detach().numpy(), idxs.detach().numpy()))
                return original(boxes, scores, idxs, iou_threshold)
            spec.nms_inputs.batched_nms = recording
        try:
            outputs = torch_outputs(module, [torch.from_numpy(case[n]) for n in spec.input_names])
        finally:
            if spec.nms_inputs is not None:
                spec.nms_inputs.batched_nms = original
        for boxes, scores, labels in recorded:
            for kind, array in (("boxes", boxes), ("scores", scores), ("labels", labels)):
                np.save(f"{prefix}.nms.{kind}.npy", array)
            print(f"  case{index}: {len(scores)} candidates into NMS")
        dims = " ".join(f"{n}{list(case[n].shape)}" for n in spec.input_names)
        for output_name, out in zip(spec.output_names, outputs):
            np.save(f"{prefix}.out.{output_name}.npy", out)
            peak = float(np.abs(out).max())
            good = bool(np.isfinite(out).all()) and spec.peak_range[0] <= peak <= spec.peak_range[1]
            ok &= good
            print(f"  case{index} {dims}: {output_name} {describe(out)}"
                  f"{'' if good else '  <-- NOT FINITE OR BADLY SCALED'}")
        checks = []
        if ReferenceEvaluator is not None:
            checks.append(("onnx.reference", dict(zip(spec.output_names,
                                                      ReferenceEvaluator(model).run(None, dict(case))))))
        if verify:
            checks.append(("ONNX Runtime", verify_with_ort(path, files, spec.output_names)))
        for runtime, results in checks:
            if spec.nms_inputs is not None:
                found = results[spec.output_names[1]]
                print(f"  case{index} {runtime}: {len(found)} detections (PyTorch {len(outputs[1])}); after NMS, "
                      "near-tied scores may differ (judged in tests/test_detector.cpp)")
                continue
            for output_name, expected in zip(spec.output_names, outputs):
                got = results[output_name]
                error = (float(np.abs(got.astype(np.float64) - expected).max() / np.abs(expected).max())
                         if got.shape == expected.shape else float("inf"))
                good = error <= spec.tolerance
                ok &= good
                print(f"  case{index} {runtime} {output_name} shape {list(got.shape)}: max error / max|x| "
                      f"{error:.2g}{'' if good else '  <-- MISMATCH'}")
    if spec.after_export is not None:
        ok &= spec.after_export(module, model, model_dir)
    if ReferenceEvaluator is None:
        print(f"  (onnx.reference is not in onnx {onnx.__version__}: the exported model was not run)"
              if not verify else f"  (onnx.reference is not in onnx {onnx.__version__}; ran ONNX Runtime)")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", default="models", help="output directory (default: models)")
    parser.add_argument("--which", help="comma-separated subset of " + ",".join(MODELS) + " (default: all), or "
                        "with --torch-corpus of " + ",".join(TORCH_MODELS))
    parser.add_argument("--torch-corpus", nargs="?", const=TORCH_CORPUS_DIR, metavar="DIR",
                        help="write the models exported from PyTorch instead, one folder each under DIR "
                        f"(default: {os.path.relpath(TORCH_CORPUS_DIR)}); --out, --inputs, --batch are ignored")
    parser.add_argument("--torch-bench", nargs="?", const=os.path.join("models", "torch"), metavar="DIR",
                        help="write the benchmark-size PyTorch exports (" + ",".join(TORCH_BENCH) + ") to "
                        "DIR/NAME/model.onnx (default: models/torch), for bench/peers.py")
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

    if args.torch_bench:
        names = [n.strip() for n in (args.which or ",".join(TORCH_BENCH)).split(",") if n.strip()]
        if any(n not in TORCH_BENCH for n in names):
            parser.error(f"unknown model(s) {names}; choose from {list(TORCH_BENCH)}")
        os.makedirs(args.torch_bench, exist_ok=True)
        failed = [n for n in names if not write_torch_model(n, args.torch_bench, args.seed, args.verify, bench=True)]
        if failed:
            print(f"FAILED: {', '.join(failed)}")
        return 1 if failed else 0
    group = TORCH_MODELS if args.torch_corpus else MODELS
    names = [n.strip() for n in (args.which or ",".join(group)).split(",") if n.strip()]
    unknown = [n for n in names if n not in group]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {list(group)}")
    if args.torch_corpus:
        os.makedirs(args.torch_corpus, exist_ok=True)
        failed = [name for name in names if not write_torch_model(name, args.torch_corpus, args.seed, args.verify)]
        if failed:
            print(f"FAILED: {', '.join(failed)}")
        return 1 if failed else 0
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
            outputs = verify_with_ort(path, {input_name: in_path}, output_names)
            for out_name, out in outputs.items():
                peak = float(np.abs(out).max()) if out.size else 0.0
                ok = bool(np.isfinite(out).all()) and 1e-2 <= peak <= 1e3
                failed |= not ok
                print(f"  ORT batch {batch} ({time.perf_counter() - start:.2f} s) {out_name} {describe(out)}"
                      f"{'' if ok else '  <-- NOT FINITE OR BADLY SCALED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
