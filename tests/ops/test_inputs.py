"""Hostile inputs to QuantizeMX, DequantizeMX and CodebookLookup: each gives an error, no crash.

docs/ops.md states every input's type and shape. The kernels check them all (not only element
counts), refuse an input the data type does not have, and keep size arithmetic inside int64
(`shape=[2^40, 2^40]` once overflowed). Every error is one onnxruntime error line that starts
with the op name in brackets and names the input. Each case starts from a valid model and
inputs (checked to run) and breaks one thing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxq
from onnxq import runtime

pytestmark = pytest.mark.needs_custom_ops
ort = pytest.importorskip("onnxruntime")

SHAPE = (4, 64)
_NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.uint16): TensorProto.UINT16,
    np.dtype(np.uint32): TensorProto.UINT32,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int64): TensorProto.INT64,
}
# Input positions per op (docs/ops.md).
SLOTS = {
    "DequantizeMX": ("Q", "Scale", "Zero", "TenScale", "Meta", "Mask", "Shape"),
    "CodebookLookup": ("Q", "Meta", "Scale", "Table"),
}
Q_OUT = ("Q", "Scale", "Zero", "TenScale", "Meta", "Mask")


def session_options() -> Any:
    """Plain session options with the library, honouring ONNXQ_ORT_ARENA like runtime.session."""
    options = ort.SessionOptions()
    options.register_custom_ops_library(runtime.library_path())
    options.log_severity_level = 4  # the refusals are expected: keep onnxruntime's log quiet
    if os.environ.get("ONNXQ_ORT_ARENA") == "0":
        options.enable_cpu_mem_arena = False
    return options


def op_model(
    op: str,
    feeds: dict[str, np.ndarray | None],
    attrs: dict[str, Any],
    outputs: list[tuple[str, int]],
) -> onnx.ModelProto:
    """One node of `op`; feeds by input name (None or missing: left out), shapes dynamic."""
    slots = SLOTS.get(op, ("X",))
    names = [name if feeds.get(name) is not None else "" for name in slots]
    while names and not names[-1]:
        names.pop()
    empty = [k for k, v in attrs.items() if isinstance(v, list) and not v]
    node = helper.make_node(
        op,
        names,
        [n for n, _ in outputs],
        domain="onnxq",
        **{k: v for k, v in attrs.items() if k not in empty},
    )
    for k in empty:  # helper.make_node cannot type an empty list
        node.attribute.append(onnx.AttributeProto(name=k, type=onnx.AttributeProto.INTS))
    inputs = [
        helper.make_tensor_value_info(n, _NP_TO_ONNX[np.asarray(feeds[n]).dtype], None)
        for n in names
        if n
    ]
    graph = helper.make_graph(
        [node], "op", inputs, [helper.make_tensor_value_info(n, t, None) for n, t in outputs]
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )


def run_op(
    op: str,
    feeds: dict[str, np.ndarray | None],
    attrs: dict[str, Any],
    outputs: list[tuple[str, int]],
) -> list[np.ndarray] | str:
    """The outputs, or the error message (onnxruntime raises its own exception types)."""
    model = op_model(op, feeds, attrs, outputs)
    try:
        sess = ort.InferenceSession(
            model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"]
        )
        return sess.run(None, {k: v for k, v in feeds.items() if v is not None})
    except Exception as err:  # onnxruntime raises its own exception types
        return str(err)


# onnxruntime's own refusal of an input type that no registration of the op declares (checked
# before any kernel runs); the cases that may get it say so.
ORT_TYPE_ERROR = "Type Error: Type (tensor("


def op_error(op: str, result: list[np.ndarray] | str, ort_may_refuse: bool = False) -> str:
    """The op's own message (from "[Op]" on), checked to be one line."""
    assert isinstance(result, str), f"{op} accepted the input"
    at = result.find(f"[{op}]")
    if at < 0 and ort_may_refuse and "[ONNXRuntimeError]" in result:
        return result  # the test checks which refusal
    assert at >= 0, result
    message = result[at:].strip()
    assert "\n" not in message, message
    return message


# -- DequantizeMX / CodebookLookup ----------------------------------------------------------


def encoded(dt: str, shape: tuple[int, ...] = SHAPE, axis: int = -1) -> dict[str, np.ndarray]:
    """The inputs QuantizeMX makes for a seeded tensor (onnxq.cast compress mode)."""
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    q = onnxq.cast(x, dt, axis=axis, mode="compress", backend="reference")
    fields = {
        "Q": q.data,
        "Scale": q.scale,
        "Zero": q.zero,
        "TenScale": q.tenscale,
        "Meta": q.meta,
        "Mask": q.mask,
    }
    return {k: np.ascontiguousarray(v) for k, v in fields.items() if v is not None}


def dequant(
    dt: str, feeds: dict[str, np.ndarray | None], op: str = "DequantizeMX", **attrs: Any
) -> list[np.ndarray] | str:
    attrs = {"dtype": dt, "shape": list(SHAPE), **attrs}
    return run_op(op, feeds, attrs, [("Y", TensorProto.FLOAT)])


@pytest.mark.parametrize(("op", "dt"), [
    ("DequantizeMX", "mxfp4"), ("DequantizeMX", "mx6"), ("DequantizeMX", "nvfp4"),
    ("DequantizeMX", "uint4_block32"), ("DequantizeMX", "e2m1fnuz_e8m0_t32n2m4"),
    ("DequantizeMX", "e4m3fn"), ("CodebookLookup", "cb41fi_e2m2fnuz_e8m0_t8s4"),
])  # fmt: skip
def test_valid_inputs_run(op: str, dt: str) -> None:
    """The unbroken inputs the cases below start from decode as the reference does."""
    fields = encoded(dt)
    got = dequant(dt, fields, op)
    assert not isinstance(got, str), got
    x = np.random.default_rng(7).standard_normal(SHAPE).astype(np.float32)
    want = onnxq.cast(x, dt, backend="reference")
    assert np.array_equal(got[0].view(np.uint32), np.asarray(want).view(np.uint32))


def _with(dt: str, **changes: Any) -> dict[str, np.ndarray | None]:
    return {**encoded(dt), **changes}


# (id, op, dtype, feeds, extra attributes, needle in the message)
DEQUANT_CASES: list[
    tuple[str, str, str, Callable[[], dict[str, Any]], dict[str, Any], str | tuple[str, ...]]
] = [
    ("q-short", "DequantizeMX", "mxfp4",
     lambda: _with("mxfp4", Q=encoded("mxfp4")["Q"][:-1]), {}, "input Q is uint8 of shape (127,)"),
    ("q-long", "DequantizeMX", "mxfp4",
     lambda: _with("mxfp4", Q=np.zeros(129, np.uint8)), {}, "need uint8 of shape (128,)"),
    ("q-2d-right-count", "DequantizeMX", "mxfp4",
     lambda: _with("mxfp4", Q=encoded("mxfp4")["Q"].reshape(2, 64)), {},
     "input Q is uint8 of shape (2, 64)"),
    ("q-empty", "DequantizeMX", "mxfp4",
     lambda: _with("mxfp4", Q=np.zeros(0, np.uint8)), {}, "input Q is uint8 of shape (0,)"),
    ("q-int8", "DequantizeMX", "mxfp4",
     lambda: _with("mxfp4", Q=encoded("mxfp4")["Q"].view(np.int8)), {}, "input Q is int8"),
    ("q-missing", "DequantizeMX", "mxfp4",
     lambda: _with("mxfp4", Q=None), {}, ("input Q is required", "is marked single")),
    ("scale-flat", "DequantizeMX", "mxfp4",
     lambda: _with("mxfp4", Scale=encoded("mxfp4")["Scale"].reshape(-1)), {},
     "input Scale is uint8 of shape (8,)"),
    ("scale-transposed", "DequantizeMX", "mxfp4",
     lambda: _with("mxfp4", Scale=np.ascontiguousarray(encoded("mxfp4")["Scale"].T)), {},
     "need uint8 of shape (4, 2)"),
    ("scale-count", "DequantizeMX", "mxfp4",
     lambda: _with("mxfp4", Scale=np.zeros((4, 3), np.uint8)), {},
     "input Scale is uint8 of shape (4, 3)"),
    ("scale-type", "DequantizeMX", "mxfp4",
     lambda: _with("mxfp4", Scale=encoded("mxfp4")["Scale"].astype(np.uint16)), {},
     "input Scale is uint16"),
    ("scale-missing", "DequantizeMX", "mxfp4",
     lambda: _with("mxfp4", Scale=None), {}, "input Scale is required"),
    ("scale-on-unscaled", "DequantizeMX", "e4m3fn",
     lambda: _with("e4m3fn", Scale=np.full((4, 2), 127, np.uint8)), {},
     "input Scale (4, 2) is given but dtype 'e4m3fn' has no scale"),
    ("zero-on-mxfp4", "DequantizeMX", "mxfp4",
     lambda: _with("mxfp4", Zero=np.zeros((4, 2), np.uint8)), {}, "has no zero point"),
    ("tenscale-on-mxfp4", "DequantizeMX", "mxfp4",
     lambda: _with("mxfp4", TenScale=np.zeros(1, np.uint32)), {}, "has no tensor scale"),
    ("meta-on-mxfp4", "DequantizeMX", "mxfp4",
     lambda: _with("mxfp4", Meta=np.zeros(4, np.uint8)), {}, "has no meta bits"),
    ("mask-on-mxfp4", "DequantizeMX", "mxfp4",
     lambda: _with("mxfp4", Mask=np.zeros(32, np.uint8)), {}, "has no N:M sparsity"),
    ("zero-missing", "DequantizeMX", "uint4_block32",
     lambda: _with("uint4_block32", Zero=None), {}, "input Zero is required"),
    ("zero-shape", "DequantizeMX", "uint4_block32",
     lambda: _with("uint4_block32", Zero=np.zeros(8, np.uint8)), {},
     "input Zero is uint8 of shape (8,)"),
    ("tenscale-missing", "DequantizeMX", "nvfp4",
     lambda: _with("nvfp4", TenScale=None), {}, "input TenScale is required"),
    ("tenscale-2d", "DequantizeMX", "nvfp4",
     lambda: _with("nvfp4", TenScale=encoded("nvfp4")["TenScale"].reshape(1, 1)), {},
     "input TenScale is uint32 of shape (1, 1)"),
    ("tenscale-type", "DequantizeMX", "nvfp4",
     lambda: _with("nvfp4", TenScale=np.zeros(1, np.uint8)), {}, "input TenScale is uint8"),
    ("meta-missing", "DequantizeMX", "mx6",
     lambda: _with("mx6", Meta=None), {}, "input Meta is required"),
    ("meta-short", "DequantizeMX", "mx6",
     lambda: _with("mx6", Meta=encoded("mx6")["Meta"][:-1]), {}, "input Meta is uint8 of shape"),
    ("mask-missing", "DequantizeMX", "e2m1fnuz_e8m0_t32n2m4",
     lambda: _with("e2m1fnuz_e8m0_t32n2m4", Mask=None), {}, "input Mask is required"),
    ("mask-short", "DequantizeMX", "e2m1fnuz_e8m0_t32n2m4",
     lambda: _with("e2m1fnuz_e8m0_t32n2m4", Mask=np.zeros(31, np.uint8)), {},
     "input Mask is uint8 of shape (31,)"),
    ("mask-all-kept", "DequantizeMX", "e2m1fnuz_e8m0_t32n2m4",
     lambda: _with("e2m1fnuz_e8m0_t32n2m4", Mask=np.full(32, 255, np.uint8)), {},
     "256 codes of 4 bits"),
    ("shape-huge-overflow", "DequantizeMX", "mxfp4",
     lambda: encoded("mxfp4"), {"shape": [2**40, 2**40]}, "attribute 'shape'"),
    ("shape-huge-product", "DequantizeMX", "mxfp4",
     lambda: encoded("mxfp4"), {"shape": [2**21] * 3}, "at most 2^40 elements"),
    ("shape-int64-wrap", "DequantizeMX", "mxfp4",
     lambda: encoded("mxfp4"), {"shape": [2**32, 2**32, 4]}, "attribute 'shape'"),
    ("shape-negative", "DequantizeMX", "mxfp4",
     lambda: encoded("mxfp4"), {"shape": [-4, 64]}, "positive dims"),
    ("shape-zero", "DequantizeMX", "mxfp4",
     lambda: encoded("mxfp4"), {"shape": [0, 64]}, "positive dims"),
    ("shape-empty", "DequantizeMX", "mxfp4",
     lambda: encoded("mxfp4"), {"shape": []}, "attribute 'shape'"),
    ("shape-wrong-but-valid", "DequantizeMX", "mxfp4",
     lambda: encoded("mxfp4"), {"shape": [8, 64]}, "input Q is uint8 of shape (128,)"),
    ("huge-shape-sparse", "DequantizeMX", "e2m1fnuz_e8m0_t32n2m4",
     lambda: encoded("e2m1fnuz_e8m0_t32n2m4"), {"shape": [2**20, 2**20]}, "input Mask is uint8"),
    ("axis-out-of-range", "DequantizeMX", "mxfp4",
     lambda: encoded("mxfp4"), {"axis": 2}, "axis 2 is out of range"),
    ("axis-negative-out", "DequantizeMX", "mxfp4",
     lambda: encoded("mxfp4"), {"axis": -3}, "axis -3 is out of range"),
    ("output-type", "DequantizeMX", "mxfp4",
     lambda: encoded("mxfp4"), {"output_type": 6}, "output_type' 6"),
    ("2d-tile-on-1d", "DequantizeMX", "int8_e8m0_t8_t4",
     lambda: {"Q": np.zeros(64, np.uint8), "Scale": np.zeros(8, np.uint8)}, {"shape": [64]},
     "2-D tiles need"),
    ("cb-not-codebook", "CodebookLookup", "mxfp4",
     lambda: encoded("mxfp4"), {}, "is not a codebook"),
    ("cb-meta-missing", "CodebookLookup", "cb41fi_e2m2fnuz_e8m0_t8s4",
     lambda: _with("cb41fi_e2m2fnuz_e8m0_t8s4", Meta=None), {}, "input Meta is required"),
    # a dtype with a line break around it parses (as onnxq.datatype); the message quotes
    # the code without it: one line
    ("cb-meta-missing-dtype-spaced", "CodebookLookup", "\n cb41fi_e2m2fnuz_e8m0_t8s4 \r\n",
     lambda: _with("cb41fi_e2m2fnuz_e8m0_t8s4", Meta=None), {},
     "input Meta is required for dtype 'cb41fi_e2m2fnuz_e8m0_t8s4', shape"),
    ("cb-meta-2d", "CodebookLookup", "cb41fi_e2m2fnuz_e8m0_t8s4",
     lambda: _with("cb41fi_e2m2fnuz_e8m0_t8s4",
                   Meta=encoded("cb41fi_e2m2fnuz_e8m0_t8s4")["Meta"].reshape(2, 4)), {},
     "input Meta is uint8 of shape (2, 4)"),
    ("cb-scale-flat", "CodebookLookup", "cb41fi_e2m2fnuz_e8m0_t8s4",
     lambda: _with("cb41fi_e2m2fnuz_e8m0_t8s4",
                   Scale=encoded("cb41fi_e2m2fnuz_e8m0_t8s4")["Scale"].reshape(-1)), {},
     "input Scale is uint8 of shape (32,)"),
    ("cb-generic-no-table", "CodebookLookup", "cb41_e2m2fnuz_e8m0_t8s4",
     lambda: encoded("cb41fi_e2m2fnuz_e8m0_t8s4"), {}, "the Table input"),
    ("cb-table-shape", "CodebookLookup", "cb41_e2m2fnuz_e8m0_t8s4",
     lambda: _with("cb41fi_e2m2fnuz_e8m0_t8s4", Table=np.zeros((2, 8), np.float32)), {},
     "input Table has shape (2, 8)"),
    ("cb-table-type", "CodebookLookup", "cb41_e2m2fnuz_e8m0_t8s4",
     lambda: _with("cb41fi_e2m2fnuz_e8m0_t8s4", Table=np.zeros((2, 16), np.float64)), {},
     "input Table must be float"),
    ("cb-huge-shape", "CodebookLookup", "cb41fi_e2m2fnuz_e8m0_t8s4",
     lambda: encoded("cb41fi_e2m2fnuz_e8m0_t8s4"), {"shape": [2**40, 2**40]}, "attribute 'shape'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("op", "dt", "make", "attrs", "needle"),
    [c[1:] for c in DEQUANT_CASES],
    ids=[c[0] for c in DEQUANT_CASES],
)
def test_hostile_decode_inputs(
    op: str,
    dt: str,
    make: Callable[[], dict[str, Any]],
    attrs: dict[str, Any],
    needle: str | tuple[str, ...],
) -> None:
    message = op_error(op, dequant(dt, make(), op, **attrs), ort_may_refuse=True)
    needles = needle if isinstance(needle, tuple) else (needle,)
    assert any(n in message for n in (*needles, ORT_TYPE_ERROR)), message


def test_zero_size_input_for_a_field_the_type_lacks_is_accepted() -> None:
    """QuantizeMX writes a zero-size tensor for an output the data type does not have; wired
    into DequantizeMX it is accepted as "not given" (docs/ops.md)."""
    got = dequant("mxfp4", _with("mxfp4", Zero=np.zeros(0, np.uint8)))
    assert not isinstance(got, str), got


def test_missing_attributes() -> None:
    feeds: dict[str, np.ndarray | None] = dict(encoded("mxfp4"))
    no_shape = run_op("DequantizeMX", feeds, {"dtype": "mxfp4"}, [("Y", TensorProto.FLOAT)])
    assert "attribute 'shape'" in op_error("DequantizeMX", no_shape)
    no_dtype = run_op("DequantizeMX", feeds, {"shape": list(SHAPE)}, [("Y", TensorProto.FLOAT)])
    assert "attribute 'dtype'" in op_error("DequantizeMX", no_dtype)


# -- QuantizeMX ------------------------------------------------------------------------------


def quant(
    x: np.ndarray, dt: str, outputs: list[tuple[str, int]] | None = None, **attrs: Any
) -> list[np.ndarray] | str:
    outs = outputs or [("Q", TensorProto.UINT8), ("Scale", TensorProto.UINT8)]
    return run_op("QuantizeMX", {"X": x}, {"dtype": dt, **attrs}, outs)


_X = np.ones(SHAPE, np.float32)
QUANT_CASES: list[tuple[str, np.ndarray, str, dict[str, Any], str]] = [
    ("x-int32", _X.astype(np.int32), "mxfp4", {}, "input X must be float"),
    ("x-double", _X.astype(np.float64), "mxfp4", {}, "input X must be float"),
    ("x-uint8", _X.astype(np.uint8), "mxfp4", {}, "got uint8"),
    # An X with a zero dim is not an error: empty outputs (tests/ops/test_dynamic_shape.py).
    ("x-scalar", np.array(1.0, np.float32), "mxfp4", {}, "0-D scalar"),
    ("axis-out-of-range", _X, "mxfp4", {"axis": 2}, "axis 2 is out of range"),
    ("axis-huge", _X, "mxfp4", {"axis": 2**62}, "is out of range"),
    ("axis-negative", _X, "mxfp4", {"axis": -2**62}, "is out of range"),
    ("2d-tile-on-1d", np.ones(64, np.float32), "int8_e8m0_t8_t4", {}, "2-D tiles need"),
    ("generic-codebook", _X, "cb41_e2m2fnuz_e8m0_t8", {}, "generic codebook"),
    ("stochastic-codebook", _X, "cb41fi_e2m2fnuz_e8m0_t8", {"round_mode": "stochastic"},
     "stochastic"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("x", "dt", "attrs", "needle"), [c[1:] for c in QUANT_CASES], ids=[c[0] for c in QUANT_CASES]
)
def test_hostile_quantize_inputs(
    x: np.ndarray, dt: str, attrs: dict[str, Any], needle: str
) -> None:
    message = op_error("QuantizeMX", quant(x, dt, **attrs), ort_may_refuse=True)
    needles = needle if isinstance(needle, tuple) else (needle,)
    assert any(n in message for n in (*needles, ORT_TYPE_ERROR)), message


def test_quantize_output_declared_with_the_wrong_type() -> None:
    outs = [("Q", TensorProto.UINT8), ("Scale", TensorProto.UINT16)]
    message = op_error("QuantizeMX", quant(_X, "mxfp4", outs))
    assert "output Scale is declared uint16" in message, message


def test_quantize_every_output_of_a_sparse_type() -> None:
    """The valid case of the model above: every output the data type has, right bits."""
    dt = "e2m1fnuz_e8m0_t32n2m4"
    x = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)
    outs = [(n, TensorProto.UINT8) for n in Q_OUT]
    got = quant(x, dt, outs)
    assert not isinstance(got, str), got
    ref = onnxq.cast(x, dt, mode="compress", backend="reference")
    assert np.array_equal(got[0], ref.data) and np.array_equal(got[5], ref.mask)
    assert got[2].size == 0 and got[3].size == 0 and got[4].size == 0


# -- NaN payloads ----------------------------------------------------------------------------

NAN_BITS = [0x7F800001, 0x7FBFFFFF, 0x7FC00000, 0x7FC00001, 0x7FFFFFFF, 0xFFFFFFFF, 0xFFC12345]


@pytest.mark.parametrize(
    "dt",
    [
        "mxfp4",
        "mxfp6",
        "mxfp8",
        "mxint8",
        "mx6",
        "mx9",
        "nvfp4",
        "bfp16",
        "cb41fi_e2m2fnuz_e8m0_t8s4",
        "e4m3fn",
    ],
)
@pytest.mark.parametrize("policy", ["element", "block"])
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
def test_nan_payloads_match_reference(dt: str, policy: str) -> None:
    """NaNs of every payload, alone in a tile and filling tiles: the rounding of the fast row
    kernels once added to a NaN's payload with signed overflow (UBSan in .ci/sanitize); the
    bits must be the reference's."""
    x = np.random.default_rng(5).standard_normal((8, 64)).astype(np.float32)
    bits = x.view(np.uint32)
    for i, b in enumerate(NAN_BITS):
        bits[i, 3 * i] = b  # one NaN in a tile of finite values
    bits[7, :] = np.resize(np.array(NAN_BITS, np.uint32), 64)  # a row of NaNs only
    native = onnxq.cast(x, dt, backend="native", nan_policy=policy)
    want = onnxq.cast(x, dt, backend="reference", nan_policy=policy)
    assert np.array_equal(np.asarray(native).view(np.uint32), np.asarray(want).view(np.uint32))
    got = run_op(
        "QuantizeMX", {"X": x}, {"dtype": dt, "nan_policy": policy}, [("Q", TensorProto.UINT8)]
    )
    assert not isinstance(got, str), got
    ref = onnxq.cast(x, dt, mode="compress", backend="reference", nan_policy=policy)
    assert np.array_equal(got[0], ref.data)
