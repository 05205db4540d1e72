"""One model, three runtimes: the custom-op library, the function fallbacks in a plain
onnxruntime, and the onnx reference evaluator - all must give the same bits (issue 3).
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import onnxq
from onnxq.graph.functions import embed_functions, inline_for_reference
from onnxq.graph.schemas import output_types

runtime = pytest.importorskip("onnxq.runtime")
pytestmark = pytest.mark.needs_custom_ops

# Data types whose QuantizeMX has a function fallback (exponent scales).
DTYPES = ["mxfp8e4", "mxfp6e2", "mxfp4", "mxint8", "bfp16", "mx9", "mx6", "mx4"]
_OUT = ("q", "scale", "zero", "tenscale", "meta", "mask")


def _model(dt: str, shape: tuple[int, ...], axis: int) -> onnx.ModelProto:
    types = output_types("QuantizeMX", {"dtype": dt, "axis": axis}, shape)
    names = [n if elem else "" for n, (elem, _) in zip(_OUT, types, strict=True)]
    while not names[-1]:
        names.pop()
    nodes = [
        helper.make_node("QuantizeMX", ["x"], names, domain="onnxq", dtype=dt, axis=axis),
        helper.make_node(
            "DequantizeMX", names, ["y"], domain="onnxq", dtype=dt, axis=axis,
            shape=list(shape), output_type=TensorProto.FLOAT,
        ),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    return embed_functions(model)


def _data(shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-10, 10, shape))).astype(np.float32)
    x.reshape(-1)[:3] = [np.nan, np.inf, -0.0]
    x.reshape(-1)[5:40] = 0.0  # an all-zero tile
    return x


@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("dt", DTYPES)
def test_library_fallback_and_reference_evaluator_agree(dt: str, axis: int) -> None:
    shape = (6, 45)
    x = _data(shape)
    model = _model(dt, shape, axis)
    onnx.checker.check_model(model, full_check=True)
    expected = onnxq.cast(x, dt, axis=axis, backend="reference").view(np.uint32)

    with_library = runtime.session(model).run(["y"], {"x": x})[0]
    plain = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        ["y"], {"x": x}
    )[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        evaluated = ReferenceEvaluator(inline_for_reference(copy.deepcopy(model))).run(
            ["y"], {"x": x}
        )[0]
    for name, got in (("library", with_library), ("fallback", plain), ("evaluator", evaluated)):
        assert np.array_equal(np.asarray(got, np.float32).view(np.uint32), expected), name


def test_a_stochastic_quantize_without_a_fallback_runs_through_the_library() -> None:
    # A stochastic QuantizeMX has no function fallback (embed_functions refuses it): such a
    # model runs only where the library is registered, with the reference's random bits.
    shape = (4, 32)
    names = ["q", "scale"]
    nodes = [
        helper.make_node(
            "QuantizeMX", ["x"], names, domain="onnxq", dtype="mxfp4",
            round_mode="stochastic", seed=3,
        ),
        helper.make_node(
            "DequantizeMX", names, ["y"], domain="onnxq", dtype="mxfp4", shape=list(shape),
            output_type=TensorProto.FLOAT,
        ),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "stochastic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    x = _data(shape)
    y = runtime.session(model).run(["y"], {"x": x})[0]
    expected = onnxq.cast(x, "mxfp4", round_mode="stochastic", seed=3, backend="reference")
    assert np.array_equal(y.view(np.uint32), expected.view(np.uint32))
