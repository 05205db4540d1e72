"""The quantizer's default weight scale mode (``search``) and what keeps the old rules."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxq
from onnxq.graph.recipe import DEFAULT_WEIGHT_SCALE_MODE
from onnxq.graph.walk import node_attrs


def _model(w: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, w.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, w.shape[1]])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _weight() -> np.ndarray:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 8)).astype(np.float32)
    w[:32, 0] = 0.0
    w[0, 0] = 1.875  # a tile floor clips (1.875 * 2^8 = 480 > 448) and search keeps
    return w


def _stored(model: onnx.ModelProto) -> np.ndarray:
    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "w"))


def test_default_weights_use_search() -> None:
    assert DEFAULT_WEIGHT_SCALE_MODE == "search"
    w = _weight()
    q = onnxq.quantize_model(_model(w), weights="mxfp8", weight_storage="fake")
    # MatMul's weight is reduced along axis 0; the expected values come from the reference
    searched = onnxq.cast(w, "mxfp8", axis=0, scale_mode="search", backend="reference")
    floor = onnxq.cast(w, "mxfp8", axis=0, scale_mode="floor", backend="reference")
    assert np.array_equal(_stored(q), searched)
    assert not np.array_equal(searched, floor) and searched[0, 0] == 1.875


@pytest.mark.parametrize(
    ("recipe", "mode"),
    [
        ({"weights": "mxfp8", "scale_mode": "floor"}, "floor"),
        ({"weights": "mxfp8", "weight_scale_mode": "rceil"}, "rceil"),
        ({"weights": "mxfp8", "scale_mode": "search"}, "search"),
    ],
)
def test_explicit_scale_mode_wins(recipe: dict, mode: str) -> None:
    w = _weight()
    q = onnxq.quantize_model(_model(w), recipe=recipe, weight_storage="fake")
    assert np.array_equal(
        _stored(q), onnxq.cast(w, "mxfp8", axis=0, scale_mode=mode, backend="reference")
    )


def test_activations_keep_the_run_time_rule() -> None:
    w = _weight()
    for recipe in (
        {"weights": "mxfp8", "activations": "mxfp8"},
        {"weights": "mxfp8", "activations": "mxfp8", "scale_mode": "search"},
    ):
        q = onnxq.quantize_model(_model(w), recipe=recipe, weight_storage="fake")
        activation_ops = ("QuantizeMX", "QuantizeDequantizeMX")  # fused by default
        quant = [n for n in q.graph.node if n.op_type in activation_ops]
        assert quant, "the activation is quantized"
        assert all(node_attrs(n).get("scale_mode", "floor") == "floor" for n in quant)


def test_packed_weights_decode_the_searched_codes() -> None:
    pytest.importorskip("onnxruntime")
    w = _weight()
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    packed = onnxq.quantize_model(_model(w), weights="mxfp8")
    fake = onnxq.quantize_model(_model(w), weights="mxfp8", weight_storage="fake")
    import onnxruntime as ort

    def run(m: onnx.ModelProto) -> np.ndarray:
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, {"x": x})[0]

    # without the custom-op library: the DequantizeMX function fallback decodes them
    assert np.array_equal(run(packed), run(fake))
