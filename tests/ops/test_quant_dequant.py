"""QuantizeDequantizeMX: DequantizeMX(QuantizeMX(X)) in one pass (docs/ops.md), bit for bit.

The oracle is ``onnxq.cast`` (virtual mode) on the reference backend; the op is also checked
against the QuantizeMX -> DequantizeMX pair of the same session, over every non-codebook
preset, odd shapes and axes, zeros, subnormals, NaN/Inf, float16/bfloat16 inputs, the cast's
modes, and one session run from 8 threads.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxq
from onnxq import runtime
from onnxq.graph.schemas import infer_shapes, output_types, register_schemas

pytestmark = pytest.mark.needs_custom_ops
ort = pytest.importorskip("onnxruntime")

from tests.ops.test_inputs import op_error, run_op  # noqa: E402 - after the skips

_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16,
}
_Q_OUT = ("q", "scale", "zero", "tenscale", "meta", "mask")
_OPSETS = [helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
# Every preset (none is a codebook) and codes for a 2-D tile, N:M sparsity, an unscaled type.
FORMATS = [*sorted(onnxq.datatypes()), "int8_e8m0_t8_t4", "e2m1fnuz_e8m0_t32n2m4", "e4m3fn"]


def _model(dt: str, dims: list[Any], xtype: int, pair: bool, **attrs: Any) -> onnx.ModelProto:
    """x -> QuantizeDequantizeMX -> y; with ``pair`` also x -> QuantizeMX -> DequantizeMX (fed
    Shape(x)) -> y_pair, the same attributes."""
    attrs = {"dtype": dt, **attrs}
    nodes = [helper.make_node("QuantizeDequantizeMX", ["x"], ["y"], domain="onnxq", **attrs)]
    outputs = [helper.make_tensor_value_info("y", xtype, dims)]
    if pair:
        types = output_types("QuantizeMX", attrs)
        names = [n if elem else "" for n, (elem, _) in zip(_Q_OUT, types, strict=True)]
        dq = {k: v for k, v in attrs.items() if k in ("dtype", "axis")}
        nodes += [
            helper.make_node("QuantizeMX", ["x"], names, domain="onnxq", **attrs),
            helper.make_node("Shape", ["x"], ["x_shape"]),
            helper.make_node(
                "DequantizeMX", [*names, "x_shape"], ["y_pair"], domain="onnxq",
                output_type=xtype, **dq,
            ),
        ]  # fmt: skip
        outputs.append(helper.make_tensor_value_info("y_pair", xtype, None))
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", xtype, dims)], outputs
    )
    return helper.make_model(graph, opset_imports=_OPSETS)


def _run(sess: Any, x: np.ndarray, names: list[str]) -> list[np.ndarray]:
    """The outputs' bits (bfloat16 through uint16 buffers: numpy has none for onnxruntime)."""
    if x.dtype != ml_dtypes.bfloat16:
        return [_bits(y) for y in sess.run(names, {"x": x})]
    binding = sess.io_binding()
    bf16 = TensorProto.BFLOAT16
    binding.bind_ortvalue_input(
        "x", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(x.view(np.uint16), bf16)
    )
    outs = [np.empty(x.shape, np.uint16) for _ in names]
    for name, out in zip(names, outs, strict=True):
        binding.bind_ortvalue_output(
            name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(out, bf16)
        )
    sess.run_with_iobinding(binding)
    return outs


def _bits(a: Any) -> np.ndarray:
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _data(shape: tuple[int, ...], seed: int, dtype: Any = np.float32) -> np.ndarray:
    """Normal values over 2^-12..2^12 with NaN, +-Inf, zeros, subnormals and a zero tile."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-12, 12, shape))).astype(np.float32)
    flat = x.reshape(-1)
    if flat.size > 10:
        flat[1], flat[3], flat[5], flat[6] = np.nan, np.inf, -np.inf, 0.0
        flat[7], flat[9] = np.float32(1e-40), np.float32(-3e-39)  # float32 subnormals
    if flat.size > 80:
        flat[-40:] = 0.0  # a zero tile
    x = x.astype(dtype)
    if dtype == np.float16 and flat.size > 12:
        x.reshape(-1)[10] = np.float16(3e-6)  # a float16 subnormal
    return x


def _want(x: np.ndarray, dt: str, **attrs: Any) -> np.ndarray:
    modes = {k: v for k, v in attrs.items() if k != "int_range"}
    return _bits(
        onnxq.cast(
            x, dt, backend="reference", int_range=attrs.get("int_range", "symmetric"), **modes
        )
    )


@pytest.mark.parametrize("dt", FORMATS)
@pytest.mark.parametrize(
    ("shape", "axis"), [((3, 70), -1), ((37, 5), 0), ((2, 33, 3), 1), ((130,), 0)]
)
def test_matches_cast_and_the_pair(dt: str, shape: tuple[int, ...], axis: int) -> None:
    if dt == "int8_e8m0_t8_t4" and len(shape) < 2:
        pytest.skip("2-D tiles need 2 dims")
    x = _data(shape, sum(shape) + len(dt))
    sess = runtime.session(
        _model(dt, list(shape), TensorProto.FLOAT, True, axis=axis), decode_weights="run"
    )
    y, y_pair = _run(sess, x, ["y", "y_pair"])
    assert np.array_equal(y, _want(x, dt, axis=axis)), dt
    assert np.array_equal(y, y_pair), dt


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize(
    "dt", ["mxfp8e4", "mxfp8e5", "mxfp6e3", "mxfp4", "mxint8", "bfp16", "mx9", "mx6", "mx4",
           "nvfp4", "uint4_block32", "int8_tensor", "e4m3fn"],
)  # fmt: skip
def test_half_inputs(dt: str, dtype: Any) -> None:
    """Y is X's type: float16 / bfloat16 in, the same type out, as the cast rounds it."""
    x = _data((5, 96), 3, dtype)
    sess = runtime.session(_model(dt, [5, 96], _ONNX[np.dtype(dtype)], True), decode_weights="run")
    y, y_pair = _run(sess, x, ["y", "y_pair"])
    assert np.array_equal(y, _want(x, dt)), dt
    assert np.array_equal(y, y_pair), dt


@pytest.mark.parametrize(
    ("dt", "attrs"), [
        ("mxfp6", {"round_mode": "stochastic", "seed": 7}), ("mxfp4", {"scale_mode": "ceil"}),
        ("mxfp8", {"scale_mode": "rceil"}), ("mxfp4", {"scale_mode": "even"}),
        ("mxfp6", {"nan_policy": "block"}), ("mxint8", {"round_mode": "away"}),
        ("mxint8", {"int_range": "full"}), ("nvfp4", {"round_mode": "zero"}),
        ("mx6", {"round_mode": "stochastic", "seed": 123}),
    ],
)  # fmt: skip
def test_modes(dt: str, attrs: dict[str, Any]) -> None:
    x = _data((4, 96), 11)
    sess = runtime.session(
        _model(dt, [4, 96], TensorProto.FLOAT, True, **attrs), decode_weights="run"
    )
    y, y_pair = _run(sess, x, ["y", "y_pair"])
    assert np.array_equal(y, _want(x, dt, **attrs)), attrs
    assert np.array_equal(y, y_pair), attrs


def test_symbolic_dims_and_inference() -> None:
    """One session from a model with symbolic dims runs every shape; inference gives Y X's
    type and shape, symbolic dims included."""
    register_schemas()
    model = _model("mxfp8", ["batch", "seq", 48], TensorProto.FLOAT16, False)
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT16, None))
    inferred = infer_shapes(model)
    y = inferred.graph.output[0].type.tensor_type
    assert y.elem_type == TensorProto.FLOAT16
    dims = [d.dim_param or d.dim_value for d in y.shape.dim]
    assert dims == ["batch", "seq", 48]
    assert output_types("QuantizeDequantizeMX", {"dtype": "mxfp4"}, (2, 32), input_type=16) == [
        (16, (2, 32))
    ]
    sess = runtime.session(model, decode_weights="run")
    for i, shape in enumerate([(1, 1, 48), (2, 9, 48), (3, 40, 48)]):
        x = _data(shape, i, np.float16)
        (y_bits,) = _run(sess, x, ["y"])
        assert np.array_equal(y_bits, _want(x, "mxfp8")), shape


@pytest.mark.parametrize("shape", [(0, 64), (4, 0), (2, 0, 32)])
def test_empty_x_gives_empty_y(shape: tuple[int, ...]) -> None:
    sess = runtime.session(
        _model("mxfp4", ["a"] * len(shape), TensorProto.FLOAT, True), decode_weights="run"
    )
    y, y_pair = sess.run(["y", "y_pair"], {"x": np.zeros(shape, np.float32)})
    assert y.shape == shape and y.dtype == np.float32 and y_pair.shape == shape


def test_one_session_many_threads() -> None:
    """8 threads share one session: each result is the serial one, the reference's bits."""
    sess = runtime.session(_model("mx6", ["n", 96], TensorProto.FLOAT, False), decode_weights="run")
    xs = [_data((8 + seed, 96), seed) for seed in range(16)]
    want = [_want(x, "mx6") for x in xs]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for _ in range(3):
            got = list(pool.map(lambda x: _run(sess, x, ["y"])[0], xs))
            for g, w in zip(got, want, strict=True):
                assert np.array_equal(g, w)


# -- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "attrs", "needle"),
    [
        (np.ones((4, 64), np.float32), {"dtype": "cb41fi_e2m2fnuz_e8m0_t8s4"}, "is a codebook"),
        (np.ones((4, 64), np.float32), {"dtype": "cb41_e2m2fnuz_e8m0_t8"}, "is a codebook"),
        (np.ones((4, 64), np.float32), {"dtype": "mxfp99"}, "dtype"),
        (np.ones((4, 64), np.float32), {"dtype": "mxfp4", "axis": 2}, "axis 2 is out of range"),
        (np.ones((4, 64), np.float32), {"dtype": "mxfp4", "axis": -(2**62)}, "out of range"),
        (np.ones((4, 64), np.float32), {"dtype": "mxfp4", "round_mode": "up"}, "round_mode"),
        (np.ones(64, np.float32), {"dtype": "int8_e8m0_t8_t4"}, "2-D tiles need"),
        (np.array(1.0, np.float32), {"dtype": "mxfp4"}, "0-D scalar"),
        (np.ones((4, 64), np.int32), {"dtype": "mxfp4"}, "input X must be float"),
        (np.ones((4, 64), np.float64), {"dtype": "mxfp4"}, "input X must be float"),
    ],
    ids=["codebook", "generic-codebook", "bad-dtype", "axis", "axis-huge", "round-mode",
         "2d-tile-on-1d", "scalar", "int32", "double"],
)  # fmt: skip
def test_bad_input(x: np.ndarray, attrs: dict[str, Any], needle: str) -> None:
    result = run_op("QuantizeDequantizeMX", {"X": x}, attrs, [("Y", TensorProto.FLOAT)])
    message = op_error("QuantizeDequantizeMX", result, ort_may_refuse=True)
    assert needle in message or "Type Error: Type (tensor(" in message, message


def test_schema_refuses_a_codebook() -> None:
    with pytest.raises(ValueError, match=r"\[QuantizeDequantizeMX\] dtype .* is a codebook"):
        output_types("QuantizeDequantizeMX", {"dtype": "cb41fi_e2m2fnuz_e8m0_t8s4"})
