#!/usr/bin/env python3
"""Dynamically quantizes a model's MatMul layers as ONNX Runtime's quantize_dynamic(weight_type=QuantType.QUInt8)
writes them: DynamicQuantizeLinear on the activation (one per activation), MatMulInteger with uint8 weights and a
per-tensor zero point (asymmetric min/max), Cast, and the product times x_scale * w_scale. PyPI's onnxruntime is not
reachable here, so this stands in for its quantizer (uint8-weight MatMulInteger files: the form Ondine shifts into
int8 with VNNI, docs/quantization.md).

    /usr/bin/python3 bench/quantize_dynamic_u8.py models/bert.onnx /tmp/bert_u8.onnx
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def quantize(model):
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    nodes, quantized = [], {}
    for n in g.node:
        w = inits.get(n.input[1]) if n.op_type == "MatMul" else None
        if w is None or len(w.dims) != 2 or w.data_type != TensorProto.FLOAT:
            nodes.append(n)
            continue
        b = numpy_helper.to_array(w).astype(np.float32)
        lo, hi = min(float(b.min()), 0.0), max(float(b.max()), 0.0)
        scale = np.float32((hi - lo) / 255.0 if hi > lo else 1.0)
        zero = int(np.clip(np.round(-lo / scale), 0, 255))
        wq = np.clip(np.round(b / scale) + zero, 0, 255).astype(np.uint8)
        a = n.input[0]
        if a not in quantized:
            quantized[a] = (a + "_quantized", a + "_scale", a + "_zero_point")
            nodes.append(helper.make_node("DynamicQuantizeLinear", [a], list(quantized[a]), name=a + "_QuantizeLinear"))
        aq, ascale, azero = quantized[a]
        p = n.name or n.output[0]
        g.initializer.extend([numpy_helper.from_array(wq, p + "_W_quantized"),
                              numpy_helper.from_array(np.array(zero, np.uint8), p + "_W_zero_point"),
                              numpy_helper.from_array(np.array(scale, np.float32), p + "_W_scale")])
        nodes += [
            helper.make_node("MatMulInteger", [aq, p + "_W_quantized", azero, p + "_W_zero_point"], [p + "_int32"],
                             name=p + "_MatMulInteger"),
            helper.make_node("Cast", [p + "_int32"], [p + "_float"], to=TensorProto.FLOAT, name=p + "_Cast"),
            helper.make_node("Mul", [ascale, p + "_W_scale"], [p + "_scales"], name=p + "_scales_Mul"),
            helper.make_node("Mul", [p + "_float", p + "_scales"], [n.output[0]], name=p + "_output_Mul"),
        ]
    del g.node[:]
    g.node.extend(nodes)
    used = {i for n in g.node for i in n.input}
    kept = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)
    return sum(n.op_type == "MatMulInteger" for n in g.node)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    m = onnx.load(sys.argv[1])
    count = quantize(m)
    onnx.checker.check_model(m)
    onnx.save(m, sys.argv[2])
    print(f"{sys.argv[2]}: {count} MatMulInteger layers with uint8 weights")
