"""Finite input always decodes to a finite value (docs/ops.md, "Saturation").

A scale that sends a tile's top element values past the float type's range (ceil-like scale
modes, the E8M0 clamp at 2^127, the full int range, float scales rounded up) lowers the element
clamp to the largest element value whose decoded value is still finite. The golden cases below
are worked by hand; the property runs every preset, scale mode and round mode on near-max data.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import onnxq

_ = onnxq.cast  # resolve the lazy attribute before importing the subpackage (test_native.py)
from onnxq.cast import native  # noqa: E402
from onnxq.cast.api import cast  # noqa: E402
from onnxq.formats.modes import RoundMode, ScaleMode  # noqa: E402

FLT_MAX = float(np.finfo(np.float32).max)  # (2 - 2^-23) * 2^127
BACKENDS = ["reference", *(["native"] if native.available() else [])]
DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


def _tile(first: float, n: int = 32, dtype=np.float32) -> np.ndarray:
    x = np.zeros(n, dtype=np.float32)
    x[0] = first
    return x.astype(dtype)


# (data type, scale mode, int range, input, expected value of element 0, element code, scale code)
GOLDEN = [
    # mxfp4 rceil, amax 3.4e38 = 1.998 * 2^127: floor exponent 127, bumped (amax > 6 * 2^125)
    # to 128, so the scale is 2^(128 - emax 2) = 2^126. 3.4e38 / 2^126 = 7.99 rounds to e2m1's
    # top 6, and 6 * 2^126 = 1.5 * 2^128 overflows. Bound: FLT_MAX / 2^126 = 3.99999976, whose
    # e2m1 floor is 3: 3 * 2^126. e2m1fnuz 3 = 1.5 * 2^1 = code 0b0101; scale code 126 + 127.
    ("mxfp4", "rceil", "symmetric", 3.4e38, 3 * 2.0**126, 0b0101, 253),
    # mxint8, full range, -3.4e38: floor exponent 127 - emax 6 + 6 fraction bits = 127 (the
    # E8M0 top), so the grid step is 2^121 and -3.4e38 / 2^121 = -127.9 rounds to -128 (allowed
    # by the full range), but -128 * 2^121 = -2^128 overflows. Bound: FLT_MAX / 2^121 =
    # 127.99999 -> 127: -127 * 2^121, code 0x81; scale code 127 + 127.
    ("mxint8", "floor", "full", -3.4e38, -127 * 2.0**121, 0x81, 254),
    # mxfp8 (e4m3fn) ceil: 3.4e38 > 2^127 bumps the exponent to 128, scale 2^(128 - 8) = 2^120;
    # 3.4e38 / 2^120 = 255.99 rounds up to 256 (e4m3 step 16 below 256), 2^128 overflows.
    # Bound: FLT_MAX / 2^120 = 255.99998 -> the top of binade 2^7 on e4m3's grid, 240:
    # 240 * 2^120. e4m3fn 240 = 1.875 * 2^7: exponent field 7 + 7 = 14, mantissa 7 -> 0x77.
    ("mxfp8", "ceil", "symmetric", 3.4e38, 240 * 2.0**120, 0x77, 247),
    # A codebook (mappings {0, .5, 1, 1.5, 2, 3, 4, 6} and {0, 1, ..., 7}, compute e2m2fnuz with
    # emax 2), rceil: 3.4e38 > 7 * 2^125 bumps to 128, scale 2^126, v = 7.996. Bound on the
    # compute grid: FLT_MAX / 2^126 = 3.99999976 -> 3.5; each mapping keeps to entries <= 3.5,
    # so both give 3 with the same error and mapping 0 (the first) is kept: index 5, 3 * 2^126.
    ("cb41fi_e2m2fnuz_e8m0_t32", "rceil", "symmetric", 3.4e38, 3 * 2.0**126, 5, 253),
    # Inf saturates to the same bound (NaN policy "element"): the scale comes from the finite
    # absmax 3.4e38 (2^126 as above) and +Inf rounds to e2m1's top 6, lowered to 3.
    ("mxfp4", "ceil", "symmetric", np.inf, 3 * 2.0**126, 0b0101, 253),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("name", "smode", "int_range", "first", "value", "code", "scode"), GOLDEN)
def test_golden_overflow_saturates(backend, name, smode, int_range, first, value, code, scode):
    x = _tile(first)
    if first == np.inf:
        x[1] = 3.4e38
    kw = dict(scale_mode=smode, int_range=int_range, backend=backend)
    y = cast(x, name, **kw)
    assert y[0] == np.float32(value)
    q = cast(x, name, mode="actual", **kw)
    assert int(q.data[0]) == code and int(q.scale.reshape(-1)[0]) == scode


@pytest.mark.parametrize("backend", BACKENDS)
def test_golden_float16_input_bounds_by_float16(backend):
    # float16 65504 = 1.999 * 2^15, mxfp4 ceil: exponent 16, scale 2^14; 65504 / 2^14 = 3.998
    # rounds to 4, and 4 * 2^14 = 65536 is Inf in float16 (finite in float32: the float16 range
    # is what bounds a float16 cast). Bound: 65504 / 2^14 = 3.998 -> e2m1 floor 3: 49152.
    y = cast(_tile(65504.0, dtype=np.float16), "mxfp4", scale_mode="ceil", backend=backend)
    assert y.dtype == np.float16 and y[0] == 49152.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_golden_float_scale_rounding_up(backend):
    # int8_tensor: scale = float32(FLT_MAX / 127), rounded up, so 127 * scale rounds to Inf in
    # float32 (checked below with numpy's own float32 arithmetic); the largest finite multiple
    # is 126 * scale.
    sc = np.float32(FLT_MAX) / np.float32(127)
    with np.errstate(over="ignore"):
        assert np.isinf(np.float32(127) * sc)
    y = cast(np.array([FLT_MAX, 1.0], np.float32), "int8_tensor", backend=backend)
    assert y[0] == np.float32(126) * sc


@pytest.mark.parametrize("backend", BACKENDS)
def test_golden_unscaled_wide_format(backend):
    # e11m10 has 11 exponent bits: FLT_MAX = (2 - 2^-23) * 2^127 rounds to 2^128 on its grid,
    # Inf as a float32. Bound: the e11m10 floor of FLT_MAX, (2^11 - 1) * 2^117 = (2 - 2^-10) *
    # 2^127. Inf itself stays Inf (the format has Inf).
    y = cast(np.array([FLT_MAX, -FLT_MAX, np.inf], np.float32), "e11m10", backend=backend)
    top = np.float32((2 - 2.0**-10) * 2.0**127)
    np.testing.assert_array_equal(y, [top, -top, np.inf])


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_overflow_no_change(backend):
    # A tile whose top value decodes below the range keeps the element's own clamp: mxfp4 ceil
    # of 1.0 gives the scale 2^-2 (exponent 0 - emax 2; 1.0 is a power of two, no bump) and 1.0
    # is e2m1's 4 * 2^-2; mxint8 full range keeps -128 where -128 * 2^s is finite:
    # -1.0 -> floor exponent 0 - 6 + 6 = 0, step 2^-6, -64 * 2^-6 (no saturation at all);
    # -1.99 -> -127.36 -> -127; -2^126 * 1.999 -> step 2^120, -127.9 -> -128 (finite: -2^127).
    assert cast(_tile(1.0), "mxfp4", scale_mode="ceil", backend=backend)[0] == 1.0
    x = _tile(-(2.0**126) * 1.999)
    y = cast(x, "mxint8", int_range="full", backend=backend)
    assert y[0] == -(2.0**127)


def _near_max(dtype, seed: int) -> np.ndarray:
    """Tiles of 32 with values within a factor 2 of the type's largest finite value, both
    signs, a lone max, and +-Inf among them."""
    fmax = float(ml_dtypes.finfo(dtype).max)
    rng = np.random.default_rng(seed)
    x = fmax * rng.uniform(0.5, 1.0, (4, 32)) * rng.choice([-1.0, 1.0], (4, 32))
    x[0] = 0.0
    x[0, 0] = fmax
    x[1, :] = -fmax * rng.uniform(0.97, 1.0, 32)
    x[2, 3] = np.inf
    x[3, 5] = -np.inf
    return x.astype(dtype)


PRESETS = [
    *onnxq.datatypes(),
    "cb41fi_e2m2fnuz_e8m0_t32",
    "cb42fi012_e2m2fnuz_e8m0_t16s4",
    "e11m10",
    "e8m10",
    "e5m2",
]


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # stochastic rounding of Inf
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("smode", [m.value for m in ScaleMode])
def test_finite_in_finite_out(dtype, smode):
    x = _near_max(dtype, 7)
    finite = np.isfinite(x.astype(np.float32))
    for name, rmode, int_range in itertools.product(
        PRESETS, [m.value for m in RoundMode], ["symmetric", "full"]
    ):
        if rmode == "stochastic" and name.startswith("cb"):
            continue  # codebooks round to the nearest entry only
        if int_range == "full" and not onnxq.datatype(name).nspec.is_int:
            continue  # the full range only changes int elements
        outs = []
        for backend in BACKENDS:
            kw = dict(scale_mode=smode, round_mode=rmode, int_range=int_range, seed=3)
            y = np.asarray(cast(x, name, backend=backend, **kw)).astype(np.float32)
            assert np.isfinite(y[finite]).all(), (name, rmode, int_range, backend)
            outs.append(y.view(np.uint32))
        for other in outs[1:]:
            np.testing.assert_array_equal(outs[0], other, err_msg=f"{name} {rmode} {int_range}")


# -- the standard-ONNX function fallback (no custom-op library) -------------------------------
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from onnxq.graph import functions as fallback  # noqa: E402

_ONNX_TYPES = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
}


def _fallback_model(name: str, x: np.ndarray, attrs: dict) -> tuple[onnx.ModelProto, bool]:
    """QuantizeMX of X (its own dtype) backed by its standard-ONNX function only."""
    probe = cast(np.ones(x.shape, np.float32), name, mode="compress", backend="reference")
    has_meta = probe.meta is not None
    outs = ["Q", "S", "", "", "M" if has_meta else "", ""]
    node = helper.make_node("QuantizeMX", ["X"], outs, domain="onnxq", dtype=name, **attrs)
    outputs = [
        helper.make_tensor_value_info("Q", TensorProto.UINT8, list(probe.data.shape)),
        helper.make_tensor_value_info("S", TensorProto.UINT8, list(probe.scale.shape)),
    ]
    if has_meta:
        outputs.append(
            helper.make_tensor_value_info("M", TensorProto.UINT8, list(probe.meta.shape))
        )
    x_info = helper.make_tensor_value_info("X", _ONNX_TYPES[np.dtype(x.dtype).name], list(x.shape))
    graph = helper.make_graph([node], "g", [x_info], outputs)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    fallback.embed_functions(model)
    return model, has_meta


FALLBACK_CASES = [
    (name, smode, int_range)
    for name in [
        "mxfp4",
        "mxfp6e2",
        "mxfp6e3",
        "mxfp8",
        "mxfp8e5",
        "mxint8",
        "mxint4",
        "bfp8",
        "mx9",
        "mx6",
        "mx4",
    ]
    for smode in (["floor", "ceil"] if not onnxq.datatype(name).nspec.is_int else ["floor"])
    for int_range in (["symmetric", "full"] if onnxq.datatype(name).nspec.is_int else ["symmetric"])
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
def test_function_fallback_saturates_like_the_reference(dtype):
    # onnxruntime runs the fallback bodies (no library registered): the codes must be the
    # reference's, which decode to finite values. (onnxruntime's Python API takes no
    # bfloat16 arrays: bfloat16 goes through onnx's evaluator below.)
    x = _near_max(dtype, 11)
    for k, (name, smode, int_range) in enumerate(FALLBACK_CASES):
        for rmode in [("even", "away", "zero")[k % 3]]:
            attrs = dict(scale_mode=smode, int_range=int_range, round_mode=rmode)
            model, has_meta = _fallback_model(name, x, attrs)
            session = ort.InferenceSession(
                model.SerializeToString(), providers=["CPUExecutionProvider"]
            )
            got = session.run(None, {"X": x})
            q = cast(x, name, mode="compress", backend="reference", **attrs)
            label = f"{name} {attrs}"
            np.testing.assert_array_equal(got[0], q.data, err_msg=label)
            np.testing.assert_array_equal(got[1], q.scale, err_msg=label)
            if has_meta:
                np.testing.assert_array_equal(got[2], q.meta, err_msg=label)
            y = onnxq.upcast(q, np.float32)
            assert np.isfinite(y[np.isfinite(x.astype(np.float32))]).all(), label


@pytest.mark.parametrize(
    ("name", "attrs", "dtype", "first", "code"),
    [
        ("mxint8", dict(int_range="full"), np.float32, -3.4e38, 0x81),  # -127, see GOLDEN
        # bfloat16 max (2 - 2^-7) * 2^127, mxfp8 ceil: exponent 128, scale 2^120; the value
        # 255.0 rounds to e4m3's 256 and 2^128 overflows; bound: bf16max / 2^120 = 255 -> 240.
        ("mxfp8", dict(scale_mode="ceil"), ml_dtypes.bfloat16, 2.0**128 - 2.0**120, 0x77),
    ],
)
def test_function_fallback_reference_evaluator(name, attrs, dtype, first, code):
    # onnx's own evaluator on the inlined body agrees with the hand-derived code.
    x = _tile(first, dtype=dtype)
    model, _ = _fallback_model(name, x, attrs)
    got = ReferenceEvaluator(fallback.inline_for_reference(model)).run(None, {"X": x})
    assert int(np.asarray(got[0]).reshape(-1)[0]) == code
    assert int(cast(x, name, mode="actual", backend="reference", **attrs).data[0]) == code


@pytest.mark.parametrize("bits", [25, 26, 31, 32])
@pytest.mark.parametrize("out", ["float16", "bfloat16", "float32"])
def test_wide_int_bound_holds_after_float32_rounding(bits: int, out: str) -> None:
    # The decoder computes float32(float32(b) * scale), then the output type; from 25 bits
    # float32(b) rounds, possibly up. For scales around amax_max / 2^(bits - 1) (every float16
    # or bfloat16 number there) the bound is worked out here with exact rationals: e, the
    # largest integer <= top whose exact product stays below the limit, kept when float32(e)
    # decodes finite, else the largest integer whose float32 value lies below float32(e)'s.
    # Every bound must decode finite under numpy's float32 arithmetic.
    import math
    from fractions import Fraction

    from onnxq.cast.elements import PRODUCT_LIMIT
    from onnxq.cast.reference import _product_bound
    from onnxq.formats import number

    n = number(f"int{bits}")
    top = int(n.maxfloat)
    typ = np.dtype(ml_dtypes.bfloat16) if out == "bfloat16" else np.dtype(out)
    center = float(ml_dtypes.finfo(typ).max) / float(np.float32(top))
    grid = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)
    if out != "float16":  # bfloat16 numbers, where float16's range cannot reach
        grid = (np.arange(0, 0x7F80, dtype=np.uint32) << 16).view(np.float32)
    sc = grid[(grid > center * 0.98) & (grid < center * 1.02)]
    assert sc.size > 3
    got = _product_bound(sc, n, float(top), typ)
    limit = Fraction(PRODUCT_LIMIT[typ.name])

    def decodes_finite(q: int, s: np.float32) -> bool:
        with np.errstate(over="ignore"):
            return bool(np.isfinite(np.float32(np.float32(q) * s).astype(typ).astype(np.float32)))

    for s, b in zip(sc, got, strict=True):
        e = min(top, math.ceil(limit / Fraction(float(s))) - 1)
        want = e
        if Fraction(float(np.float32(e))) * Fraction(float(s)) >= limit:
            f = int(np.float32(e))  # rounded up: the largest integer rounding below it
            want = max(q for q in range(f - 300, f) if int(np.float32(q)) < f)
        assert b == want, (bits, out, float(s))
        assert decodes_finite(int(b), s), (bits, out, float(s))
