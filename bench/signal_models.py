#!/usr/bin/env python3
"""Writes the ONNX models of the docs/performance.md timing note on the compiled signal and sampling kernels.

  python3 bench/signal_models.py OUT_DIR    # stft.onnx, gridsample.onnx, roialign.onnx

stft.onnx is what torch.stft(x, n_fft=512, hop_length=160, window=torch.hann_window(512), center=False,
return_complex=False) exports at opset 17: one STFT node on a [1, 16000, 1] signal (1 s of 16 kHz audio),
frame_step 160, a periodic Hann window of 512 points. Written with onnx.helper (Debian 12 packages no PyTorch).
gridsample.onnx: bilinear GridSample of a [1, 64, 64, 64] feature map by a [1, 64, 64, 2] grid (a flow warp).
roialign.onnx: RoiAlign over [1, 256, 50, 50] (a stride-16 map of an 800x800 image), 100 rois, 7x7, ratio 2.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def save(path, node, inputs, inits, output, opset):
    graph = helper.make_graph([node], os.path.basename(path), inputs, [output], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    onnx.save(model, path)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    f32 = TensorProto.FLOAT
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(512) / 512)).astype(np.float32)
    save(os.path.join(out, "stft.onnx"),
         helper.make_node("STFT", ["signal", "step", "window"], ["spectrum"], onesided=1),
         [helper.make_tensor_value_info("signal", f32, [1, 16000, 1])],
         [numpy_helper.from_array(np.array(160, np.int64), "step"), numpy_helper.from_array(window, "window")],
         helper.make_tensor_value_info("spectrum", f32, [1, 97, 257, 2]), 17)
    save(os.path.join(out, "gridsample.onnx"),
         helper.make_node("GridSample", ["x", "grid"], ["y"], mode="bilinear", align_corners=1),
         [helper.make_tensor_value_info("x", f32, [1, 64, 64, 64]), helper.make_tensor_value_info("grid", f32, [1, 64, 64, 2])],
         [], helper.make_tensor_value_info("y", f32, [1, 64, 64, 64]), 16)
    rng = np.random.default_rng(0)
    corners = np.sort(rng.uniform(0, 800, size=(100, 2, 2)), axis=1)  # (x1, x2), (y1, y2) sorted
    rois = np.stack([corners[:, 0, 0], corners[:, 0, 1], corners[:, 1, 0], corners[:, 1, 1]], axis=1).astype(np.float32)
    save(os.path.join(out, "roialign.onnx"),
         helper.make_node("RoiAlign", ["x", "rois", "batch"], ["y"], output_height=7, output_width=7, sampling_ratio=2,
                          spatial_scale=1.0 / 16),
         [helper.make_tensor_value_info("x", f32, [1, 256, 50, 50])],
         [numpy_helper.from_array(rois, "rois"), numpy_helper.from_array(np.zeros(100, np.int64), "batch")],
         helper.make_tensor_value_info("y", f32, [100, 256, 7, 7]), 16)


if __name__ == "__main__":
    main()
