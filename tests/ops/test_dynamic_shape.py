"""DequantizeMX's Shape input (X's shape at run time) and zero-size tensors (docs/ops.md).

A QuantizeMX -> DequantizeMX pair whose DequantizeMX takes ``Shape(X)`` instead of the ``shape``
attribute runs whatever shape X has at run time: the same bits as the attribute, as
``onnxq.cast`` on the reference backend (the oracle), for every non-codebook family. Hostile
Shape values give one-line ``[DequantizeMX]`` errors, never a crash; a zero dim gives empty
outputs.
"""

from __future__ import annotations

import os
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxq
from onnxq import runtime
from onnxq.graph import schemas
from onnxq.graph.schemas import infer_shapes, output_types, register_schemas

pytestmark = pytest.mark.needs_custom_ops
ort = pytest.importorskip("onnxruntime")

from tests.ops.test_inputs import encoded, op_error, run_op  # noqa: E402 - after the skips

_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16,
}
_Q_OUT = ("q", "scale", "zero", "tenscale", "meta", "mask")
# Every family but the codebooks (CodebookLookup has no Shape input): MX floats and ints, BFP,
# shared-microexponent MX, NVFP4 (tensor scale), ints with zero points, a 2-D tile and N:M.
FAMILIES = [
    "mxfp8e4", "mxfp8e5", "mxfp6e2", "mxfp6e3", "mxfp4", "mxint8", "mxint4", "bfp16", "bfp8",
    "mx9", "mx6", "mx4", "nvfp4", "uint4_block32", "uint8_channel", "int8_tensor", "e4m3fn",
    "int8_e8m0_t8_t4", "e2m1fnuz_e8m0_t32n2m4",
]  # fmt: skip
_OPSETS = [helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]


def _pair(
    dt: str, dims: list[int | str], axis: int, xtype: int, with_attr: bool
) -> onnx.ModelProto:
    """QuantizeMX -> DequantizeMX fed Shape(x) (``y``); with_attr adds a DequantizeMX that takes
    the attribute instead (``y_attr``, static dims only)."""
    types = output_types("QuantizeMX", {"dtype": dt, "axis": axis})
    names = [n if elem else "" for n, (elem, _) in zip(_Q_OUT, types, strict=True)]
    nodes = [
        helper.make_node("QuantizeMX", ["x"], names, domain="onnxq", dtype=dt, axis=axis),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node(
            "DequantizeMX", [*names, "x_shape"], ["y"], domain="onnxq", dtype=dt, axis=axis,
            output_type=xtype,
        ),
    ]  # fmt: skip
    outputs = [helper.make_tensor_value_info("y", xtype, None)]
    if with_attr:
        nodes.append(
            helper.make_node(
                "DequantizeMX", names, ["y_attr"], domain="onnxq", dtype=dt, axis=axis,
                shape=[int(d) for d in dims], output_type=xtype,
            )
        )  # fmt: skip
        outputs.append(helper.make_tensor_value_info("y_attr", xtype, None))
    graph = helper.make_graph(
        nodes, "pair", [helper.make_tensor_value_info("x", xtype, dims)], outputs
    )
    return helper.make_model(graph, opset_imports=_OPSETS)


def _run(sess: Any, x: np.ndarray, names: list[str]) -> list[np.ndarray]:
    """The outputs as numpy arrays; bfloat16 through uint16 buffers (numpy has no bfloat16 for
    onnxruntime)."""
    if x.dtype != ml_dtypes.bfloat16:
        return sess.run(names, {"x": x})
    binding = sess.io_binding()
    binding.bind_ortvalue_input(
        "x",
        ort.OrtValue.ortvalue_from_numpy_with_onnx_type(x.view(np.uint16), TensorProto.BFLOAT16),
    )
    outs = [np.empty(x.shape, np.uint16) for _ in names]  # every output here is X-shaped
    for name, out in zip(names, outs, strict=True):
        binding.bind_ortvalue_output(
            name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(out, TensorProto.BFLOAT16)
        )
    sess.run_with_iobinding(binding)
    return outs


def _bits(a: Any) -> np.ndarray:
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _data(shape: tuple[int, ...], seed: int, dtype: Any = np.float32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-6, 6, shape))).astype(np.float32)
    flat = x.reshape(-1)
    if flat.size > 8:
        flat[1], flat[3], flat[6] = np.nan, -np.inf, 0.0
        flat[7] = np.float32(1e-40)  # a subnormal
    return x.astype(dtype)


def _want(x: np.ndarray, dt: str, axis: int) -> np.ndarray:
    return _bits(onnxq.cast(x, dt, axis=axis, backend="reference"))


@pytest.mark.parametrize("dt", FAMILIES)
@pytest.mark.parametrize(
    ("shape", "axis"), [((3, 70), -1), ((37, 5), 0), ((2, 33, 3), 1), ((2, 3, 4, 40), -1)]
)
def test_shape_input_equals_the_attribute(dt: str, shape: tuple[int, ...], axis: int) -> None:
    """Same bits from the Shape input as from the attribute and as the reference cast; the
    shapes leave ragged last tiles (70 = 2 x 32 + 6, 33, 37 rows under 2-D tiles)."""
    if dt == "int8_e8m0_t8_t4" and len(shape) < 2:
        pytest.skip("2-D tiles")
    x = _data(shape, sum(shape) + len(dt))
    sess = runtime.session(
        _pair(dt, list(shape), axis, TensorProto.FLOAT, True), decode_weights="run"
    )
    y, y_attr = _run(sess, x, ["y", "y_attr"])
    assert y.shape == shape
    assert np.array_equal(_bits(y), _bits(y_attr)), dt
    assert np.array_equal(_bits(y), _want(x, dt, axis)), dt


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("dt", ["mxfp8e4", "mxfp4", "mx6", "nvfp4", "uint4_block32", "bfp16"])
def test_half_outputs(dt: str, dtype: Any) -> None:
    x = _data((5, 48), 3, dtype)
    sess = runtime.session(
        _pair(dt, [5, 48], -1, _ONNX[np.dtype(dtype)], True), decode_weights="run"
    )
    y, y_attr = _run(sess, x, ["y", "y_attr"])
    assert np.array_equal(_bits(y), _bits(y_attr))
    assert np.array_equal(_bits(y), _want(x, dt, -1))


@pytest.mark.parametrize(
    ("dt", "axis"), [("mxfp8e4", -1), ("mxfp4", 1), ("mx9", -1), ("nvfp4", -1), ("bfp16", 0),
                     ("uint4_block32", -1), ("int8_e8m0_t8_t4", -1)],
)  # fmt: skip
def test_one_session_many_shapes(dt: str, axis: int) -> None:
    """One session from a model with symbolic dims runs every shape it is fed, each as the
    reference casts it."""
    model = _pair(dt, ["batch", "seq", 40], axis, TensorProto.FLOAT, False)
    sess = runtime.session(model, decode_weights="run")
    for i, shape in enumerate([(1, 1, 40), (2, 7, 40), (3, 33, 40), (1, 64, 40), (2, 5, 40)]):
        x = _data(shape, i)
        (y,) = _run(sess, x, ["y"])
        assert y.shape == shape
        assert np.array_equal(_bits(y), _want(x, dt, axis)), (dt, shape)


def test_symbolic_shape_inference() -> None:
    """With the Shape input, inference gives Y X's rank (Shape's static length) and the dims it
    knows; a constant Shape gives every dim; neither shape nor Shape is an error."""
    register_schemas()
    model = _pair("mxfp4", ["batch", 64], -1, TensorProto.FLOAT, False)
    for inferred in (infer_shapes(model), onnx.shape_inference.infer_shapes(model, True, True)):
        y = {v.name: v for v in inferred.graph.output}["y"].type.tensor_type
        assert y.elem_type == TensorProto.FLOAT
        assert len(y.shape.dim) == 2  # Shape(x) has 2 elements: Y has rank 2
        assert y.shape.dim[1].dim_value in (0, 64)  # 64 where data propagation ran
    assert output_types(
        "DequantizeMX", {"dtype": "mxfp4"}, shape_input=True, shape_value=(3, None)
    ) == [(TensorProto.FLOAT, (3, None))]
    assert output_types("DequantizeMX", {"dtype": "mxfp4"}, shape_input=True) == [
        (TensorProto.FLOAT, None)
    ]
    both = {"dtype": "mxfp4", "shape": [3, 64]}
    assert output_types("DequantizeMX", both, shape_input=True, shape_value=(3, 64))[0][1] == (
        3,
        64,
    )
    with pytest.raises(ValueError, match=r"\[DequantizeMX\] attribute 'shape' \[3, 64\] and"):
        output_types("DequantizeMX", both, shape_input=True, shape_value=(4, 64))
    with pytest.raises(ValueError, match=r"\[DequantizeMX\] .*attribute 'shape' or the Shape"):
        output_types("DequantizeMX", {"dtype": "mxfp4"})
    with pytest.raises(ValueError, match=r"\[DequantizeMX\] input Shape .* negative"):
        output_types("DequantizeMX", {"dtype": "mxfp4"}, shape_input=True, shape_value=(-1, 64))
    with pytest.raises(ValueError, match=r"\[CodebookLookup\] X's shape is unknown"):
        output_types("CodebookLookup", {"dtype": "cb41fi_e2m2fnuz_e8m0_t8s4"})


def test_constant_shape_input_is_inferred_and_decoded_once() -> None:
    """A Shape initializer: inference writes Y's whole shape, and the node may decode at
    session creation (every input constant) with the same bits."""
    dt, shape = "uint4_block32", (4, 64)
    fields = encoded(dt, shape)
    names = ["Q", "Scale", "Zero"]
    inits = [onnx.numpy_helper.from_array(fields[n], n) for n in names]
    inits.append(onnx.numpy_helper.from_array(np.array(shape, np.int64), "S"))
    node = helper.make_node(
        "DequantizeMX", [*names, "", "", "", "S"], ["y"], domain="onnxq", dtype=dt
    )
    graph = helper.make_graph(
        [node], "c", [], [helper.make_tensor_value_info("y", 1, None)], initializer=inits
    )
    model = helper.make_model(graph, opset_imports=_OPSETS)
    for inferred in (infer_shapes(model), schemas._propagate(model)):
        y = inferred.graph.output[0].type.tensor_type
        assert [d.dim_value for d in y.shape.dim] == list(shape)
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)  # as `encoded`
    want = _want(x, dt, -1)
    # The exporter reads the stored Shape input as the weight's shape (no attribute here).
    from onnxq.deploy.export import quantized_weights

    weight = quantized_weights(model)["y"]
    assert weight.shape == shape
    assert np.array_equal(_bits(onnxq.upcast(weight)), want)
    for mode in ("0", "1"):
        os.environ["ONNXQ_CONST_DECODE"] = mode
        try:
            (y,) = runtime.session(model, decode_weights="run").run(None, {})
        finally:
            del os.environ["ONNXQ_CONST_DECODE"]
        assert np.array_equal(_bits(y), want), mode


# -- hostile Shape values --------------------------------------------------------------------

_ENC = encoded("mxfp4", (4, 64))  # Q (128,), Scale (4, 2)
SHAPE_CASES: list[tuple[str, Any, dict[str, Any], str]] = [
    ("negative", np.array([-4, 64], np.int64), {}, "dims >= 0"),
    ("minus-one", np.array([4, -1], np.int64), {}, "dims >= 0"),
    ("huge", np.array([2**40, 2**40], np.int64), {}, "at most 2^40"),
    ("int64-wrap", np.array([2**32, 2**32, 4], np.int64), {}, "at most 2^40"),
    ("huge-beside-zero", np.array([0, 2**62], np.int64), {}, "at most 2^40"),
    ("max-int64", np.array([2**63 - 1], np.int64), {}, "at most 2^40"),
    ("2-d", np.array([[4, 64]], np.int64), {}, "must be a 1-D int64"),
    ("0-d", np.array(256, np.int64), {}, "must be a 1-D int64"),
    ("empty", np.zeros(0, np.int64), {}, "has 0 dims"),
    ("rank-65", np.ones(65, np.int64), {}, "has 65 dims"),
    ("int32", np.array([4, 64], np.int32), {}, "int32"),
    ("float", np.array([4, 64], np.float32), {}, "float"),
    ("product-not-q", np.array([8, 64], np.int64), {}, "input Q is uint8 of shape (128,)"),
    ("same-count-other-grid", np.array([2, 128], np.int64), {}, "input Scale is uint8 of shape"),
    ("rank-not-axis", np.array([256], np.int64), {"axis": 1}, "axis 1 is out of range"),
    ("disagrees-with-attr", np.array([4, 64], np.int64), {"shape": [2, 128]},
     "attribute 'shape' (2, 128) and input Shape (4, 64) disagree"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("shape", "attrs", "needle"), [c[1:] for c in SHAPE_CASES], ids=[c[0] for c in SHAPE_CASES]
)
def test_hostile_shape_input(shape: np.ndarray, attrs: dict[str, Any], needle: str) -> None:
    result = run_op(
        "DequantizeMX",
        {**_ENC, "Shape": shape},
        {"dtype": "mxfp4", **attrs},
        [("Y", TensorProto.FLOAT)],
    )
    message = op_error("DequantizeMX", result, ort_may_refuse=True)
    # int32 / float: onnxruntime may refuse the type itself before the kernel runs.
    assert needle in message or "Type Error: Type (tensor(" in message, message


def test_valid_shape_input_alone() -> None:
    """The case the hostile ones break: the right Shape and no attribute decodes."""
    result = run_op(
        "DequantizeMX",
        {**_ENC, "Shape": np.array([4, 64], np.int64)},
        {"dtype": "mxfp4"},
        [("Y", TensorProto.FLOAT)],
    )
    assert not isinstance(result, str), result
    x = np.random.default_rng(7).standard_normal((4, 64)).astype(np.float32)
    assert np.array_equal(_bits(result[0]), _want(x, "mxfp4", -1))


def test_neither_shape_nor_shape_input() -> None:
    result = run_op("DequantizeMX", _ENC, {"dtype": "mxfp4"}, [("Y", TensorProto.FLOAT)])
    assert "attribute 'shape' (X's dims) or the Shape input" in op_error("DequantizeMX", result)


# -- zero-size dims ---------------------------------------------------------------------------


@pytest.mark.parametrize("dt", FAMILIES)
@pytest.mark.parametrize(("shape", "axis"), [((0, 64), -1), ((5, 0), -1), ((3, 0, 40), 0)])
def test_zero_size_runs_empty(dt: str, shape: tuple[int, ...], axis: int) -> None:
    """QuantizeMX of an X with a zero dim gives empty outputs (Q of 0 bytes), and the pair
    gives an empty Y of X's shape; the same session then runs a non-empty X."""
    model = _pair(dt, ["a", "b"] if len(shape) == 2 else ["a", "b", 40], axis, 1, False)
    fields = [n for n in model.graph.node[0].output if n]
    model.graph.output.extend(helper.make_tensor_value_info(n, 0, None) for n in fields)
    sess = runtime.session(model, decode_weights="run")
    names = ["y", *fields]
    got = dict(zip(names, sess.run(names, {"x": np.zeros(shape, np.float32)}), strict=True))
    assert got["y"].shape == shape and got["y"].dtype == np.float32
    assert got["q"].shape == (0,)
    c = onnxq.cast(np.ones((2, 32, 40) if len(shape) == 3 else (2, 64), np.float32), dt,
                   axis=axis, mode="compress")  # fmt: skip
    # The schema types an empty X's Q (0 bytes) and leaves the grid shapes open.
    static = output_types("QuantizeMX", {"dtype": dt, "axis": axis}, shape)
    assert static[0][1] == (0,) and static[1][1] is None and static[2][1] is None
    for name in ("scale", "zero", "tenscale", "meta", "mask"):
        field = getattr(c, name)
        assert (name in got) == (field is not None), name
        if name in got:
            assert got[name].dtype == np.asarray(field).dtype, name
            assert np.all(got[name] == 0), name  # a tensor-wide field: code 0, read by none
    x = _data((2, 64) if len(shape) == 2 else (2, 3, 40), 5)
    assert np.array_equal(_bits(sess.run(["y"], {"x": x})[0]), _want(x, dt, axis))


def test_zero_dim_shape_with_fields() -> None:
    """DequantizeMX alone, Shape (0, 64): empty Q and a (0, 2) Scale decode to an empty Y; a
    Scale of the wrong grid is refused even so."""
    feeds = {
        "Q": np.zeros(0, np.uint8),
        "Scale": np.zeros((0, 2), np.uint8),
        "Shape": np.array([0, 64], np.int64),
    }
    result = run_op("DequantizeMX", feeds, {"dtype": "mxfp4"}, [("Y", TensorProto.FLOAT)])
    assert not isinstance(result, str), result
    assert result[0].shape == (0, 64)
    feeds["Scale"] = np.zeros((0, 3), np.uint8)
    result = run_op("DequantizeMX", feeds, {"dtype": "mxfp4"}, [("Y", TensorProto.FLOAT)])
    assert "input Scale is uint8 of shape (0, 3)" in op_error("DequantizeMX", result)
