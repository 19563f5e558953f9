#!/usr/bin/env python3
"""Writes tiny_external.onnx (+ tiny_external.bin, test_data_set_0/) with the onnx Python package.

An independent writer for test_onnx.cpp: a symbolic batch dim, an external-data weight at a non-zero
offset, typed-field initializers (float_data, int64_data, float16 in int32_data), a Constant node and an
unnamed node. Regenerate with: /usr/bin/python3 make_tiny_external.py (from this directory).
"""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

w = np.arange(16, dtype=np.float32).reshape(4, 4) / 8.0 - 1.0
bias = np.array([0.5, -0.5, 1.0, -1.0], dtype=np.float32)
scale16 = np.array([1.0, 2.0, 0.5, -1.0], dtype=np.float16)
shape = np.array([-1, 2], dtype=np.int64)

# The weight lives in the side file after 8 bytes of padding: offset 8, length 64.
with open("tiny_external.bin", "wb") as f:
    f.write(b"\0" * 8)
    f.write(w.tobytes())
w_init = TensorProto()
w_init.name = "w"
w_init.data_type = TensorProto.FLOAT
w_init.dims.extend([4, 4])
w_init.data_location = TensorProto.EXTERNAL
for k, v in (("location", "tiny_external.bin"), ("offset", "8"), ("length", "64")):
    e = w_init.external_data.add()
    e.key, e.value = k, v

inits = [
    w_init,
    helper.make_tensor("bias", TensorProto.FLOAT, [4], bias.tolist(), raw=False),       # float_data
    helper.make_tensor("scale16", TensorProto.FLOAT16, [4], scale16.tolist(), raw=False),  # int32_data bits
    helper.make_tensor("shape", TensorProto.INT64, [2], shape.tolist(), raw=False),      # int64_data
]
nodes = [
    helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
    helper.make_node("Add", ["h", "bias"], ["a"], name="add"),
    helper.make_node("Constant", [], ["c"], value_floats=[1.0, 1.0, 1.0, 2.0]),
    helper.make_node("Mul", ["a", "c"], ["m"], name="mul"),
    helper.make_node("Relu", ["m"], ["y"]),  # unnamed: the importer names it Relu_4
    helper.make_node("Reshape", ["y", "shape"], ["z"], name="reshape"),
    helper.make_node("Cast", ["scale16"], ["s32"], name="cast", to=TensorProto.FLOAT),
    helper.make_node("Mul", ["y", "s32"], ["ys"], name="scaled"),
]
graph = helper.make_graph(
    nodes, "tiny_external",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
    [helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 2]),
     helper.make_tensor_value_info("ys", TensorProto.FLOAT, ["batch", 4])],
    initializer=inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="onnx-python")
model.ir_version = 7
onnx.checker.check_model(model)
onnx.save(model, "tiny_external.onnx")

x = np.array([[1, -2, 3, 0.5], [0, 1, -1, 2], [2, 2, -3, 1]], dtype=np.float32)
y = np.maximum((x @ w + bias) * np.array([1, 1, 1, 2], dtype=np.float32), 0)
import os
os.makedirs("test_data_set_0", exist_ok=True)
for name, arr in (("input_0", x), ("output_0", y.reshape(-1, 2)), ("output_1", y * scale16.astype(np.float32))):
    with open(f"test_data_set_0/{name}.pb", "wb") as f:
        f.write(numpy_helper.from_array(arr).SerializeToString())
