"""Random hostile inputs to QuantizeMX, DequantizeMX and CodebookLookup (hypothesis, seeded).

Each example starts from the valid inputs of a data type (as QuantizeMX makes them) and breaks
a few things at random: an input dropped, replaced by a random array (random element type,
shape and bytes), reshaped or cut; the `shape` attribute, `axis` or `output_type` changed,
huge or negative values included. The op must either run (Y then has the `shape` attribute's
shape) or refuse with an onnxruntime error, never crash the interpreter. Tensors stay small and
the hostile sizes are refused before anything is allocated for them, so each case is fast.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto

import onnxq

pytestmark = pytest.mark.needs_custom_ops
pytest.importorskip("onnxruntime")

from tests.ops.test_inputs import SLOTS, run_op  # noqa: E402 - after the skips

DECODE_DTYPES = [
    ("DequantizeMX", "mxfp4"),
    ("DequantizeMX", "mx6"),
    ("DequantizeMX", "nvfp4"),
    ("DequantizeMX", "uint4_block32"),
    ("DequantizeMX", "e2m1fnuz_e8m0_t32n2m4"),
    ("DequantizeMX", "int8_e8m0_t8_t4"),
    ("DequantizeMX", "int8_e8m0_t0"),
    ("DequantizeMX", "e4m3fn"),
    ("CodebookLookup", "cb41fi_e2m2fnuz_e8m0_t8s4"),
    ("CodebookLookup", "cb41_e2m2fnuz_e8m0_t8s4"),  # generic: needs the Table input
]
QUANT_DTYPES = [
    "mxfp4",
    "mx6",
    "nvfp4",
    "uint4_block32",
    "e2m1fnuz_e8m0_t32n2m4",
    "int8_e8m0_t8_t4",
    "e4m3fn",
    "cb41fi_e2m2fnuz_e8m0_t8s4",
]
ELEM_TYPES = [
    np.uint8,
    np.uint16,
    np.uint32,
    np.int8,
    np.int32,
    np.int64,
    np.float32,
    np.float16,
    np.float64,
]
HUGE = [2**31, 2**32, 2**40, 2**62, 2**63 - 1]
FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _dims(draw: Any, max_rank: int = 3) -> list[int]:
    dim = st.one_of(st.integers(0, 70), st.sampled_from([-1, -(2**40), *HUGE]))
    return draw(st.lists(dim, min_size=0, max_size=max_rank))


def _random_array(draw: Any) -> np.ndarray:
    dtype = np.dtype(draw(st.sampled_from(ELEM_TYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=0, max_size=3)))
    raw = draw(st.binary(min_size=0, max_size=64))
    count = int(np.prod(shape, dtype=np.int64))
    data = (raw * (count * dtype.itemsize // max(len(raw), 1) + 1))[: count * dtype.itemsize]
    if len(data) < count * dtype.itemsize:
        data = bytes(count * dtype.itemsize)
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _valid(op: str, dt: str, shape: tuple[int, ...], axis: int) -> dict[str, np.ndarray]:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    real = "cb41fi_e2m2fnuz_e8m0_t8s4" if dt == "cb41_e2m2fnuz_e8m0_t8s4" else dt
    q = onnxq.cast(x, real, axis=axis, mode="compress", backend="reference")
    fields = {
        "Q": q.data,
        "Scale": q.scale,
        "Zero": q.zero,
        "TenScale": q.tenscale,
        "Meta": q.meta,
        "Mask": q.mask,
    }
    feeds = {k: np.ascontiguousarray(v) for k, v in fields.items() if v is not None}
    if dt != real:
        feeds["Table"] = np.linspace(-6, 6, 32, dtype=np.float32).reshape(2, 16)
    return {k: v for k, v in feeds.items() if k in SLOTS[op]}


def _check(op: str, result: list[np.ndarray] | str, shape: Any) -> None:
    if isinstance(result, str):
        assert f"[{op}]" in result or "[ONNXRuntimeError]" in result, result
        return
    if op != "QuantizeMX":
        assert list(result[0].shape) == list(shape), (result[0].shape, shape)


@FUZZ
@given(st.data())
def test_fuzz_decode_ops(data: st.DataObject) -> None:
    op, dt = data.draw(st.sampled_from(DECODE_DTYPES))
    shape = data.draw(st.sampled_from([(4, 64), (3, 32), (2, 4, 32)]))
    feeds: dict[str, np.ndarray | None] = dict(_valid(op, dt, shape, -1))
    attrs: dict[str, Any] = {"dtype": dt, "shape": list(shape)}
    for _ in range(data.draw(st.integers(1, 3))):
        what = data.draw(
            st.sampled_from(
                ["drop", "random", "reshape", "cut", "add", "shape", "axis", "output_type"]
            )
        )
        slot = data.draw(st.sampled_from(SLOTS[op]))
        if what == "drop":
            feeds[slot] = None
        elif what == "random" or (what == "add" and feeds.get(slot) is None):
            feeds[slot] = _random_array(data.draw)
        elif what == "reshape" and feeds.get(slot) is not None:
            a = feeds[slot]
            assert a is not None
            feeds[slot] = a.reshape(data.draw(st.sampled_from([(-1,), (1, -1), (-1, 1)])))
        elif what == "cut" and feeds.get(slot) is not None:
            a = feeds[slot]
            assert a is not None
            feeds[slot] = a.reshape(-1)[: data.draw(st.integers(0, max(a.size - 1, 0)))]
        elif what == "shape":
            attrs["shape"] = _dims(data.draw)
        elif what == "axis":
            attrs["axis"] = data.draw(st.one_of(st.integers(-4, 3), st.sampled_from(HUGE)))
        elif what == "output_type":
            attrs["output_type"] = data.draw(st.sampled_from([0, 1, 2, 7, 10, 16, 2**40]))
    _check(op, run_op(op, feeds, attrs, [("Y", TensorProto.FLOAT)]), attrs["shape"])


@FUZZ
@given(st.data())
def test_fuzz_quantize(data: st.DataObject) -> None:
    dt = data.draw(st.sampled_from(QUANT_DTYPES))
    if data.draw(st.booleans()):
        x = _random_array(data.draw)
    else:  # floats of a random shape, NaN payloads and huge values included
        shape = tuple(data.draw(st.lists(st.integers(0, 40), min_size=0, max_size=3)))
        bits = data.draw(
            st.sampled_from(
                [0x7FC00000, 0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001, 0x7F7FFFFF, 0x00000001, 0x3F800000]
            )
        )
        x = np.full(shape, bits, np.uint32).view(np.float32)
    attrs: dict[str, Any] = {"dtype": dt}
    if data.draw(st.booleans()):
        attrs["axis"] = data.draw(st.one_of(st.integers(-4, 3), st.sampled_from(HUGE)))
    names = ["Q", "Scale", "Zero", "TenScale", "Meta", "Mask"][: data.draw(st.integers(1, 6))]
    kinds = [TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.FLOAT]
    outputs = [
        (n, data.draw(st.sampled_from(kinds)) if n != "Q" else TensorProto.UINT8) for n in names
    ]
    _check("QuantizeMX", run_op("QuantizeMX", {"X": x}, attrs, outputs), None)
