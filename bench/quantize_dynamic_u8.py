#!/usr/bin/env python3
"""Dynamically quantizes a model's MatMul layers as ONNX Runtime's quantize_dynamic(weight_type=QuantType.QUInt8)
writes them: DynamicQuantizeLinear on each activation, MatMulInteger with uint8 weights and a per-tensor zero point,
Cast, and the product times x_scale * w_scale (scripts/make_models.py's quantize_dynamic_layers, which also writes
the ConvInteger corpus models). PyPI's onnxruntime is not reachable here, so this stands in for its quantizer
(uint8-weight MatMulInteger files: the form Ondine shifts into int8 with VNNI, docs/quantization.md).

    /usr/bin/python3 bench/quantize_dynamic_u8.py models/bert.onnx /tmp/bert_u8.onnx
"""
import os
import sys

import onnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from make_models import quantize_dynamic_layers  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    m = onnx.load(sys.argv[1])
    count = quantize_dynamic_layers(m, "MatMul")
    onnx.checker.check_model(m)
    onnx.save(m, sys.argv[2])
    print(f"{sys.argv[2]}: {count} MatMulInteger layers with uint8 weights")
