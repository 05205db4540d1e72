"""QuantizeDequantizeMX and the QuantizeMX -> DequantizeMX pair on NCHW activations tiled along
their channels (axis 1), the channel kernels' case (ops/src/fast_channels.inc), against the
reference cast bit for bit, on one and on several intra-op threads.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from onnxq import runtime

pytestmark = pytest.mark.needs_custom_ops
ort = pytest.importorskip("onnxruntime")

from tests.ops.test_quant_dequant import _data, _model, _run, _want  # noqa: E402 - after skips

FORMATS = ["mxfp8e4", "mxfp8e5", "mxfp6e3", "mxfp4", "mxint8", "bfp16", "mx9", "mx6", "nvfp4"]
SHAPES = [(1, 96, 7, 7), (2, 33, 5, 9), (3, 5, 40), (2, 40, 1, 1), (1, 70, 23, 29)]


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("dt", FORMATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_channel_axis_matches_cast_and_the_pair(
    dt: str, shape: tuple[int, ...], threads: int
) -> None:
    x = _data(shape, sum(shape) + len(dt))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    model = _model(dt, list(shape), TensorProto.FLOAT, True, axis=1)
    sess = runtime.session(model, sess_options=so)
    y, y_pair = _run(sess, x, ["y", "y_pair"])
    assert np.array_equal(y, _want(x, dt, axis=1)), dt
    assert np.array_equal(y, y_pair), dt
