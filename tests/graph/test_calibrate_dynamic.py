"""Calibrated tensor-scale activations on models with symbolic batch and sequence dims.

Calibration samples of different sizes feed one observation per tensor; the static
QuantizeLinear/DequantizeLinear pair needs no shape, so the quantized model (both targets) runs
on shapes that calibration never saw.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxq.graph.quantize import quantize_model

_SIZES = [(1, 3), (2, 7), (4, 1), (1, 129)]


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((16, 32)).astype(np.float32)
    w2 = rng.standard_normal((32, 8)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")]
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _samples(seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((b, s, 16)).astype(np.float32)} for b, s in _SIZES]


@pytest.mark.parametrize("target", ["onnxq", "standard"])
@pytest.mark.parametrize("method", ["minmax", "percentile"])
@pytest.mark.parametrize("fmt", ["int8_tensor", "fp8e4_tensor", "uint8_tensor"])
def test_samples_of_different_sizes_calibrate_a_symbolic_model(
    fmt: str, method: str, target: str
) -> None:
    samples = _samples(1)
    q = quantize_model(
        _model(),
        weights="mxfp8",
        activations=fmt,
        calibration=samples,
        calibration_method=method,
        target=target,
    )
    meta = {p.key: p.value for p in q.metadata_props}
    assert json.loads(meta["onnxq_quantized"]) == {"weights": 2, "activations": 2}
    record = json.loads(meta["onnxq_calibration"])
    assert record["samples"] == len(_SIZES)
    # max |x| over every sample, whatever its size (an independent numpy reduction).
    want = max(float(np.abs(s["x"]).max()) for s in samples)
    assert record["tensors"]["x"]["observed_amax"] == want
    ops = [n.op_type for n in q.graph.node]
    assert "QuantizeMX" not in ops and ops.count("QuantizeLinear") == 2  # static, shapeless
    q.graph.output.append(helper.make_tensor_value_info("x__dqx", TensorProto.FLOAT, None))
    session = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    entry = record["tensors"]["x"]
    scale = np.float32(entry["scale"])
    zero = entry.get("zero_point", 0)
    for batch, seq in [(1, 1), (3, 5), (2, 200)]:  # shapes calibration never saw
        x = rng.standard_normal((batch, seq, 16)).astype(np.float32)
        y, xq = session.run(None, {"x": x})
        assert y.shape == (batch, seq, 8) and xq.shape == x.shape
        inside = np.abs(x) <= np.float32(entry["amax"])
        if "zero_point" in entry:  # the calibrated [min, max] range
            inside = (x >= np.float32(entry["min"])) & (x <= np.float32(entry["max"]))
        if fmt != "fp8e4_tensor":  # integer grids: a multiple of the scale within half a step
            steps = xq / scale + zero
            np.testing.assert_allclose(steps, np.rint(steps), atol=1e-3)
            err = np.abs(xq - x)[inside]
            assert err.max() <= scale * 0.5001
        cos = np.dot(xq.ravel(), x.ravel()) / np.linalg.norm(xq) / np.linalg.norm(x)
        assert cos > 0.99


def test_npz_samples_of_different_sizes(tmp_path: Path) -> None:
    for k, sample in enumerate(_samples(3)):
        np.savez(tmp_path / f"s{k}.npz", **sample)
    q = quantize_model(_model(), activations="int8_tensor", calibration=tmp_path)
    record = json.loads({p.key: p.value for p in q.metadata_props}["onnxq_calibration"])
    assert record["samples"] == len(_SIZES)
    session = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": np.ones((5, 2, 16), np.float32)})
    assert y.shape == (5, 2, 8)
