"""Agreement with AMD Quark's onnxruntime CPU ops, configured the way Quark computes (issue 3).

Quark's `BFPQuantizeDequantize` (bfp16 = block 8 `to_bfp`; MX6/MX9 = `to_bfp_prime`, block 16,
sub-block 2, shift 1) and `MXQuantizeDequantize` (MXFP8/6/4 and MXINT8, block 32) are compared
with onnxq bit for bit. Each difference is a test of its own showing the input and why.
Skipped where `amd-quark` cannot be imported (it is not a test dependency: it needs torch).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxq

custom_ops = pytest.importorskip("quark.onnx.operators.custom_ops")

_PRIME = {
    "bfp_method": "to_bfp_prime",
    "block_size": 16,
    "sub_block_size": 2,
    "sub_block_shift_bits": 1,
}
# onnxq data type -> (Quark op, attributes); rounding_mode 2 is Quark's round half to even.
QUARK: dict[str, tuple[str, dict[str, Any]]] = {
    "int8_e8m0_t8": (
        "BFPQuantizeDequantize",
        {"bfp_method": "to_bfp", "bit_width": 16, "block_size": 8},
    ),
    "mx9": ("BFPQuantizeDequantize", {**_PRIME, "bit_width": 16}),
    "mx6": ("BFPQuantizeDequantize", {**_PRIME, "bit_width": 13}),
    "mxfp8e4": ("MXQuantizeDequantize", {"element_dtype": "fp8_e4m3", "block_size": 32}),
    "mxfp6e2": ("MXQuantizeDequantize", {"element_dtype": "fp6_e2m3", "block_size": 32}),
    "mxfp4": ("MXQuantizeDequantize", {"element_dtype": "fp4_e2m1", "block_size": 32}),
    "mxint8": ("MXQuantizeDequantize", {"element_dtype": "int8", "block_size": 32}),
}


def quark(name: str, x: np.ndarray) -> np.ndarray:
    """Run Quark's op for ``name`` on a 2-D float32 array, blocks along axis 1."""
    op, attrs = QUARK[name]
    node = helper.make_node(
        op, ["x"], ["y"], domain="com.amd.quark", axis=1, rounding_mode=2, **attrs
    )
    shape = list(x.shape)
    graph = helper.make_graph(
        [node],
        "quark",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.amd.quark", 1)]
    )
    options = ort.SessionOptions()
    options.register_custom_ops_library(custom_ops.get_library_path("CPU"))
    sess = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return sess.run(None, {"x": x})[0]


def _row(values: list[float], n: int) -> np.ndarray:
    x = np.zeros((1, n), np.float32)
    x[0, : len(values)] = values
    return x


@pytest.mark.parametrize("name", list(QUARK))
def test_random_tensors_are_bit_identical(name: str) -> None:
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((64, 256)) * np.exp2(rng.integers(-12, 12, (64, 256)))).astype(
        np.float32
    )
    x[3, :40] = 0.0  # an all-zero block
    x[5, 7] = 2.0**-140  # a float32 subnormal
    x[7, ::3] = np.round(x[7, ::3] * 4) / 4  # grid points and ties
    ours = onnxq.cast(x, name, axis=1, backend="reference")
    theirs = quark(name, x)
    assert np.array_equal(ours, theirs)  # every value equal (-0 == +0) ...
    differ = ours.view(np.uint32) != theirs.view(np.uint32)
    assert (ours[differ] == 0).all()  # ... and bits differ only in the sign of zero (below)


ZERO_SIGNS = [
    # (data type, input next to a 1.0, onnxq's zero is -0, Quark's zero is -0)
    ("mxfp8e4", -(2.0**-20), True, False),  # e4m3fn has -0: onnxq keeps the sign, Quark not
    ("mx9", -(2.0**-20), False, True),  # ints have no -0: onnxq +0, Quark's BFP prime keeps -0
    ("mxint8", -0.0, False, True),  # Quark passes an input -0 through; underflow gives +0
    ("int8_e8m0_t8", -0.0, False, True),
]


@pytest.mark.parametrize(("name", "value", "ours_negative", "theirs_negative"), ZERO_SIGNS)
def test_the_sign_of_a_zero_result_differs(
    name: str, value: float, ours_negative: bool, theirs_negative: bool
) -> None:
    # The value rounds to zero in a tile whose max is 1.0. onnxq writes the element format's
    # zero: e4m3fn has a -0 code, so the sign stays; ints have no -0, so +0.0 (the code has no
    # sign to keep). Quark's float emulation carries the sign by other rules.
    n = 8 if name == "int8_e8m0_t8" else 32
    x = _row([1.0, value], n)
    ours, theirs = onnxq.cast(x, name)[0, 1], quark(name, x)[0, 1]
    assert ours == 0 and theirs == 0
    assert bool(np.signbit(ours)) is ours_negative
    assert bool(np.signbit(theirs)) is theirs_negative


def test_mxint8_minus_128_is_quarks_range_and_onnxqs_full_int_range() -> None:
    # -1.9990234375 in a tile with exponent 0: -127.9375 steps of 2^-6 -> -128. Quark's MXINT8
    # keeps -128 (-2.0); onnxq is symmetric by default (architecture decision 6: -127 -> -1.984375)
    # and matches Quark with int_range="full".
    x = _row([-1.9990234375, 1.0], 32)
    theirs = quark("mxint8", x)
    assert theirs[0, 0] == -2.0
    assert onnxq.cast(x, "mxint8")[0, 0] == np.float32(-1.984375)
    assert np.array_equal(onnxq.cast(x, "mxint8", int_range="full"), theirs)


@pytest.mark.parametrize("name", ["int8_e8m0_t8", "mx6", "mx9"])
def test_quarks_bfp_is_symmetric_so_full_int_range_differs(name: str) -> None:
    # Quark's to_bfp / to_bfp_prime clamp to +-(2^m - 1): the symmetric default equals it,
    # the full range (-2^m allowed) does not. -1.9990234375 in int8 (tile exponent 0) is
    # -127.9375 steps -> -128 with the full range, -127 symmetric.
    n = 8 if name == "int8_e8m0_t8" else 16
    x = _row([-1.9990234375, 1.0], n)
    theirs = quark(name, x)
    assert np.array_equal(onnxq.cast(x, name), theirs)
    assert not np.array_equal(onnxq.cast(x, name, int_range="full"), theirs)


@pytest.mark.parametrize("name", ["mxfp8e4", "mxfp4", "mxint8"])
def test_quark_keeps_inf_where_onnxq_saturates(name: str) -> None:
    # Architecture decision 5 (nan_policy="element"): Inf is left out of the tile maximum and
    # saturates to maxfloat * scale. Quark lets Inf through. Tile [inf, 1]: max 1 -> scale
    # 2^(0 - emax); mxfp4 saturates to 6 * 2^-2 = 1.5, mxfp8e4 to 448 * 2^-8 = 1.75, mxint8
    # to 127 * 2^-6 = 1.984375.
    x = _row([np.inf, 1.0], 32)
    theirs = quark(name, x)
    ours = onnxq.cast(x, name)
    assert np.isinf(theirs[0, 0])
    assert ours[0, 0] == {"mxfp8e4": 1.75, "mxfp4": 1.5, "mxint8": 1.984375}[name]
    assert np.array_equal(ours[0, 1:], theirs[0, 1:])


@pytest.mark.parametrize("name", ["mxint8", "int8_e8m0_t8"])
def test_a_nan_poisons_an_int_tile_in_onnxq_but_not_in_quark(name: str) -> None:
    # An int element has no NaN code, so onnxq makes the tile's scale NaN (README design
    # notes: "Formats without a NaN code"): the whole tile reads NaN. Quark's float emulation
    # keeps NaN in its element and quantizes the others.
    n = 8 if name == "int8_e8m0_t8" else 32
    x = _row([np.nan, 1.0], n)
    theirs = quark(name, x)
    ours = onnxq.cast(x, name)
    assert np.isnan(ours).all()
    assert np.isnan(theirs[0, 0]) and theirs[0, 1] == 1.0
