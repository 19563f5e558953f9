"""PyTorch (eager) counterparts of scripts/make_models.py's models, for bench/peers.py.

Same architectures and shapes as the ONNX files, built from torch.nn with random weights: latency does
not depend on the weight values, and this avoids needing torchvision or an ONNX-to-torch converter.
  resnet50     ResNet-50 v1.5 (torchvision layout)      float32 [batch,3,224,224] -> [batch,1000]
  mobilenetv2  MobileNetV2 1.0 (torchvision layout)     float32 [batch,3,224,224] -> [batch,1000]
  bert         BERT-style encoder (4 layers, hidden 256, 4 heads, seq 128, vocab 8000; nn.LayerNorm, exact GELU)
               int64 [batch,128] -> [batch,128,256]
"""

import math

import torch
from torch import nn


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)  # v1.5: stride on the 3x3
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return torch.relu(y + (self.downsample(x) if self.downsample is not None else x))


def resnet50():
    layers = [nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
              nn.MaxPool2d(3, stride=2, padding=1)]
    cin = 64
    for blocks, width, stride in [(3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)]:
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers)


def conv_bn_relu6(cin, cout, kernel, stride=1, groups=1):
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6())


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        layers = [conv_bn_relu6(cin, hidden, 1)] if expand != 1 else []
        layers += [conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.conv(x) if self.residual else self.conv(x)


def mobilenetv2():
    layers = [conv_bn_relu6(3, 32, 3, stride=2)]
    cin = 32
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
            cin = c
    layers += [conv_bn_relu6(cin, 1280, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, 1000)]
    return nn.Sequential(*layers)


class EncoderLayer(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attention_output = nn.Linear(hidden, hidden)
        self.attention_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, 4 * hidden)
        self.output = nn.Linear(4 * hidden, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x):
        batch, seq, hidden = x.shape
        split = lambda y: y.view(batch, seq, self.heads, self.head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.head_dim), dim=-1)
        context = (probs @ v).transpose(1, 2).reshape(batch, seq, hidden)
        x = self.attention_norm(self.attention_output(context) + x)
        h = self.output(nn.functional.gelu(self.intermediate(x)))
        return self.output_norm(h + x)


class Bert(nn.Module):
    def __init__(self, layers=4, hidden=256, heads=4, seq=128, vocab=8000):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Parameter(torch.randn(seq, hidden) * 0.02)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(EncoderLayer(hidden, heads) for _ in range(layers))

    def forward(self, input_ids):
        x = self.norm(self.word_embeddings(input_ids) + self.position_embeddings)
        for layer in self.layers:
            x = layer(x)
        return x


BUILDERS = {"resnet50": resnet50, "mobilenetv2": mobilenetv2, "bert": Bert}


def make(name):
    """The model in eval mode, and a function making its input for a batch size."""
    model = BUILDERS[name]().eval()
    if name == "bert":
        return model, lambda batch: torch.randint(0, 8000, (batch, 128), dtype=torch.int64)
    return model, lambda batch: torch.randn(batch, 3, 224, 224)
