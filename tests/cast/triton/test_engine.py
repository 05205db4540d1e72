"""The Triton cast engine against the numpy reference, bit for bit (issue 5).

Without a GPU the kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``, set by
tests/cast/triton/support.py before triton is imported) on small tensors; with one
(``torch.cuda.is_available()``) the same tests run on CUDA tensors, plus larger ones. Values
are compared as bits (NaN payloads included), codes and scales as integers.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.cast.triton.support import (
    DEV,
    GPU,
    assert_same,
    compare,
    skip_overflow_checks,
    to_torch,
    torch,
)

# isort: split
import triton
import triton.language as tl

from onnxq.cast import triton as tk
from onnxq.cast.api import QTensor, cast, upcast
from onnxq.cast.packing import pack_bits
from onnxq.cast.reference import l2_metric
from onnxq.cast.torch_bridge import upcast_triton
from onnxq.cast.triton_device import _float_reach, _int_reach
from onnxq.formats.datatype import DataType, datatype, datatypes

skip_overflow_checks()  # a quarter of this file's time in the interpreter

# numpy (reference and interpreter) warns on NaN/Inf arithmetic that the casts mean to do
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
SUPPORTED = list(datatypes())
# (64-bit scales and exponent scales over 10 bits are refused by the parser: docs/formats.md)
SCALE_MODES = ["floor", "ceil", "midmax", "option3", "topbinade", "rceil", "even"]
ROUND_MODES = ["even", "away", "zero", "stochastic"]


# -- helpers --------------------------------------------------------------------------------
def sample(shape: tuple[int, ...], seed: int = 0, specials: bool = True) -> np.ndarray:
    """Float32 data with a spread of tile magnitudes, ties, zeros, subnormals and NaN/Inf."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-20, 20, size=shape).astype(np.float32)
    flat = x.reshape(-1)
    n = flat.size
    picks = rng.permutation(n)
    k = max(1, n // 16)
    flat[picks[:k]] = rng.integers(-64, 64, size=k).astype(np.float32) / 8  # grid points, ties
    flat[picks[k : 2 * k]] = 0.0
    flat[picks[2 * k : 3 * k]] = rng.standard_normal(k).astype(np.float32) * np.float32(1e-39)
    if specials and n >= 40:
        flat[picks[3 * k]] = np.nan
        flat[picks[3 * k + 1]] = np.inf
        flat[picks[3 * k + 2]] = -np.inf
        flat[picks[3 * k + 3]] = -0.0
        flat[picks[3 * k + 4]] = np.float32(3e38)
    return x


def triton_cast(xt: torch.Tensor, dt: DataType | str, mode: str, **kw):
    """`cast(..., backend="triton")`, as users run it."""
    return cast(xt, dt, mode=mode, backend="triton", **kw)


def triton_upcast(q: QTensor, out: torch.dtype) -> torch.Tensor:
    """`onnxq.upcast` of CUDA data (the Triton dequantize kernels)."""
    return upcast_triton(q, out)


def check(x: np.ndarray, dt: str, dtype: str = "float32", *, modes=("virtual", "actual"), **kw):
    """Compare the Triton engine with the reference for one input, dtype and keyword set."""
    compare(
        x,
        dtype,
        modes,
        lambda xn, mode: cast(xn, dt, mode=mode, backend="reference", **kw),
        lambda xt, mode: triton_cast(xt, dt, mode, **kw),
        triton_upcast,
        ("float32", dtype),
        lambda mode: f"{dt} {dtype} {mode} {kw}",
    )


# -- on a GPU: big tensors first (the GPU check has a time budget) ----------------------------
@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_large_tensors_on_the_gpu() -> None:
    x = sample((1024, 4096), seed=29)
    for name in ("mxfp8e4", "mxfp6e2", "mxfp4", "mxint8", "bfp16", "mx6", "nvfp4"):
        check(x, name, "bfloat16", modes=("virtual", "compress"))
        check(x, name, round_mode="stochastic", seed=9, modes=("virtual",))
    check(sample((64, 1024, 8), seed=31), "mxfp4", axis=1)


# -- presets, dtypes and modes ----------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", SUPPORTED)
def test_every_preset_matches_the_reference(name: str, dtype: str) -> None:
    shape = (4, 96) if not GPU else (64, 1000)
    check(sample(shape, seed=len(name)), name, dtype, modes=("virtual", "actual", "compress"))


@pytest.mark.parametrize("scale_mode", SCALE_MODES)
@pytest.mark.parametrize("name", ["mxfp8e4", "mxfp8e5", "mxfp6e3", "mxfp6e2", "mxfp4", "mxint8"])
def test_every_scale_mode(name: str, scale_mode: str) -> None:
    x = sample((8, 64) if not GPU else (256, 512), seed=3)
    # tiles whose absmax sits on and around the mode thresholds
    x[0, :32] = np.float32(448.0)
    x[1, :32] = np.float32(464.0)
    x[1, 32:] = np.float32(7.75)
    x[2, :32] = np.float32(7.5)
    x[2, 32:] = np.float32(6.0 * 1.0625)
    x[3, :32] = np.float32(np.nextafter(np.float32(480.0), np.float32(0)))
    # on a GPU the codes of each mode only multiply the fast kernel's compiles: values there
    check(x, name, scale_mode=scale_mode, modes=("virtual",) if GPU else ("virtual", "actual"))
    # the threshold tiles along axis 0 take the general kernel (the mode a runtime number);
    # actual mode checks the values too, through upcast
    check(x[:4].T.copy(), name, scale_mode=scale_mode, axis=0, modes=("actual",))


@pytest.mark.parametrize("round_mode", ROUND_MODES)
@pytest.mark.parametrize("name", ["mxfp8e4", "mxfp4", "mxint8", "mx6", "nvfp4", "e5m2"])
def test_every_round_mode(name: str, round_mode: str) -> None:
    x = sample((6, 80) if not GPU else (300, 700), seed=5)
    check(x, name, round_mode=round_mode, seed=12345)
    check(x, name, "bfloat16", modes=("virtual",), round_mode=round_mode, seed=2**40 + 7)


@pytest.mark.parametrize("nan_policy", ["element", "block"])
@pytest.mark.parametrize(
    "name",
    [
        "mxfp8e4",
        "mxfp6e2",
        "mxint8",
        "mx9",
        "nvfp4",
        "int8_channel",
        "uint8_channel",
        "e4m3fn_e8m0_t4n2m4_t8",
    ],
)
def test_nan_policies(name: str, nan_policy: str) -> None:
    x = sample((5, 64), seed=7)
    x[0, 3] = np.nan
    x[1, 40] = -np.inf
    x[2, :32] = np.nan  # a tile of NaN only
    x[3, 5] = np.float32(np.uint32(0xFF800001).view(np.float32))  # a signalling NaN payload
    # on a GPU float16 shares the general kernel's compiles with bfloat16; the interpreter
    # checks it everywhere
    for dtype in ("float32", "bfloat16") if GPU else ("float32", "float16", "bfloat16"):
        check(x, name, dtype, nan_policy=nan_policy)


def test_full_int_range() -> None:
    x = sample((4, 64), seed=9)
    x[0, :4] = [-128.0, 127.0, -127.5, 1.0]
    for name in ("mxint8", "bfp16", "int8_channel", "mx6"):
        check(x, name, int_range="full")


# -- geometry ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shape", "axis"),
    [((37,), 0), ((3, 37, 5), 1), ((3, 37, 5), 0), ((2, 3, 50), -1), ((1, 1), 0), ((33, 7), 0)],
)
@pytest.mark.parametrize("name", ["mxfp4", "mx6", "nvfp4", "int8_channel", "bfp16"])
def test_odd_shapes_and_axes(shape: tuple[int, ...], axis: int, name: str) -> None:
    check(sample(shape, seed=11), name, axis=axis, modes=("virtual", "actual", "compress"))


def test_long_channel_tiles_take_two_passes() -> None:
    x = sample((3, 1500), seed=13)
    for name in ("int8_channel", "fp8e4_channel", "int8_e8m0_t0", "int8_tensor", "nvfp4"):
        check(x, name)
    check(x.T.copy(), "int4_channel", axis=0)


@pytest.mark.parametrize(
    "code",
    [
        "e4m3fn",
        "e5m2",
        "e3m2fnuz",
        "e2m1fnuz",
        "float16",
        "bfloat16",
        "binary8p3",
        "e4m3b8fnuz",
        "e5m2b16fnuz",
        "float32",
    ],
)
def test_unscaled_casts(code: str) -> None:
    x = sample((3, 70), seed=17)
    x[0, :6] = [65504.0, 65520.0, 1e-8, -1e-8, 57344.0, 61440.0]
    for dtype in ("float32", "float16", "bfloat16"):
        check(x, code, dtype)
    check(x, code, round_mode="stochastic", seed=3)


@pytest.mark.parametrize(
    "code",
    [
        "int4_e8m0_t16",
        "e2m3fnuz_e8m0_t64",
        "e4m3fn_bfloat16_t32",
        "int8_float16_t32",
        "e2m1fnuz_e4m3fn_float32_t32",
        "e2m1fnuz_e8m0_t2",
        "int8_e8m0_t16s4",
        "e5m2_float32_t0",
    ],
)
def test_other_codes(code: str) -> None:
    check(sample((4, 70), seed=19), code, modes=("virtual", "actual", "compress"))
    check(sample((5, 64, 3), seed=19), code, axis=1)


# zero points (int and float), N:M sparsity (1-D, 2-D along either dim, with zero points and
# MX shifts), 2-D tiles (subtiles, a channel dim, float and tensor scales), exponent scales
# over 8 bits, float32 and int elements over 16 bits (int24: three bytes per code);
# subtiles in tiles over 1024 elements: the test after
NEW_CODES = [
    "uint4_bfloat16_bfloat16_t32",
    "uint4_float16_float16_t0",
    "int8_e8m0_t16n2m4",
    "e2m1fnuz_e8m0_t32n1m2",
    "e4m3fn_float16_t16n2m4",
    "int5_e8m0_t16s2n2m4",
    "uint8_float32_uint8_t0n2m4",
    "e4m3fn_e8m0_t2_t32",
    "int8_e8m0_t4s2_t16s4",
    "e2m1fnuz_e4m3fn_float32_t4_t4",
    "int8_float32_t0_t16",
    "uint4_float16_uint8_t8_t0",
    "e4m3fn_e8m0_t4n2m4_t8",
    "uint8_float32_uint8_t32_t0n1m2",
    "int8_e10m0_t32",
    "e4m3fn_e10m0_t16",
    "float32_e8m0_t32",
    "float32_float32_t16",
    "int23_e8m0_t32",
    "int24_e8m0_t32",
    "int20_float32_t0",
]
# one geometry per dtype and round mode: odd sizes, every axis, 2-D tiles on both layouts
NEW_GEOMETRY = [
    ((4, 70), -1, "float32", "even"),
    ((5, 64, 3), 1, "bfloat16", "stochastic"),
    ((3, 37, 5), 0, "float16", "away"),
    ((2, 3, 50), -1, "float32", "zero"),
    ((33, 7), 0, "float32", "stochastic"),
]
if GPU:  # each dtype / round mode / layout is a compile: the interpreter covers the product
    NEW_GEOMETRY = [((64, 70), -1, "float32", "even"), ((5, 64, 3), 1, "float32", "stochastic")]


@pytest.mark.parametrize("code", NEW_CODES)
def test_zero_points_sparsity_and_2d_tiles(code: str) -> None:
    for k, (shape, axis, dtype, round_mode) in enumerate(NEW_GEOMETRY):
        modes = ("virtual", "actual", "compress") if k < 2 else ("virtual", "compress")
        x = sample(shape, seed=41 + k)
        check(x, code, dtype, modes=modes, axis=axis, round_mode=round_mode, seed=k)


def test_long_tiles_with_subtiles_zero_points_and_2d() -> None:
    x = sample((3, 2100), seed=43)
    for code in ("int5_e8m0_t4096s2", "uint8_channel", "uint4_float16_float16_t0"):
        check(x, code)
    check(x, "uint8_tensor", nan_policy="block")
    check(sample((1100, 3), seed=45), "e4m3fn_e8m0_t0_t2", axis=1)


def test_float_zero_points_of_zero_minima() -> None:
    # A tile whose minimum is zero takes the sign of its last zero as the zero point (+0 and
    # -0 are equal; np.minimum takes the later one), and a negative value that rounds to 0 is
    # -0, so with a -0 zero point it decodes to -0. Short tiles, a partial last tile (its
    # padding, +0, comes last) and two-chunk tiles (the statistics pass).
    x = np.array([[0.0, -0.0, -0.0, 0.0, -0.0, -0.0, 0.0, 0.0, 0.1275, -3.1e-4, -1e-39, 0.5]])
    for code in ("uint4_float16_e4m3fn_t2", "uint4_float16_e4m3fn_t4", "uint8_float16_e4m3fn_t8"):
        check(x.astype(np.float32), code, modes=("virtual", "actual"))
    long = np.full((3, 5000), 2.0, np.float32)
    long[0, [100, 4500, 4999]] = [0.0, 0.0, -0.0]  # the last zero in the second chunk
    long[1, [5, 4100, 4200]] = [-0.0, 0.0, -0.0]
    long[2, [5, 4100, 4999]] = [-0.0, -0.0, 0.0]
    check(long, "uint4_float16_e4m3fn_t0", modes=("actual",), axis=1)


# zero points over 16 bits, decoded without a table: float32 (its bits), unsigned and signed
# ints of any width to 32
WIDE_ZERO_CODES = [
    "uint4_float32_float32_t32",
    "uint8_float32_float32_t0",
    "uint4_float32_uint32_t32",
    "uint8_float32_int32_t16",
    "uint4_float16_uint20_t8",
    "uint8_bfloat16_int17_t0",
    "uint20_float16_uint20_t16",  # uint elements over 16 bits: decoded without a table
]


@pytest.mark.parametrize("code", WIDE_ZERO_CODES)
def test_wide_zero_points(code: str) -> None:
    check(sample((4, 70), seed=47), code, modes=("virtual", "actual", "compress"))
    check(sample((5, 64, 3), seed=48), code, "bfloat16", axis=1, round_mode="stochastic", seed=3)


@pytest.mark.parametrize(
    ("code", "zeros"),
    [
        # codes no cast writes: past the element range, over 2^24 (rounded to float32) and
        # 2^31 (unsigned), negative (signed: sign-extended from the format's width)
        ("uint4_float32_uint32_t32", [0, 15, 2**24 + 1, 2**31 + 3, 2**32 - 1]),
        ("uint8_float32_int32_t16", [0, 255, 2**31, 2**31 - 1, 2**32 - 5]),
        ("uint8_bfloat16_int17_t0", [0, 2**16 - 1, 2**16, 2**17 - 1, 2**16 + 7]),
        # float32 bits: -0, 1.5, the largest finite value, -Inf, a NaN with a payload
        ("uint4_float32_float32_t32", [0x80000000, 0x3FC00000, 0x7F7FFFFF, 0xFF800000, 0x7FA00001]),
    ],
)
def test_wide_zero_codes_decode_as_the_reference(code: str, zeros: list[int]) -> None:
    from onnxq.cast import reference

    dt = datatype(code)
    x = sample((5, 64), seed=49)
    q = cast(x, dt, mode="actual", backend="reference")
    zero = np.resize(np.asarray(zeros, np.uint64), q.zero.shape).astype(np.uint32)
    want = reference.dequantize(dt, x.shape, -1, q.data, q.scale, zero)
    got = tk.dequantize(
        dt,
        x.shape,
        -1,
        torch.from_numpy(q.data.astype(np.int32)).to(DEV),
        torch.from_numpy(q.scale.astype(np.int32)).to(DEV),
        zero=torch.from_numpy(zero.view(np.int32)).to(DEV),
    )
    assert_same(got, want, code)


# float formats over 16 bits whose values are float32 numbers, as elements, zero points and
# scales: their codes become float32 bits on the device (triton_bits.float32_bits) before the
# dequantize kernel; every Inf / NaN convention
WIDE_FLOAT_CODES = [
    "e8m15_e8m0_t32",  # IEEE: float32's top 24 bits
    "e5m20_e8m0_t32",
    "e4m19fn_float32_t16",
    "e5m18fnuz_e8m0_t32",
    "e6m17inuz_bfloat16_t0",
    "uint4_float32_e5m20_t32",
    "uint8_bfloat16_e8m15_t0",
    "e4m3fn_e5m20_t32",  # tile scales
    "int8_e8m15_t0",
    "e2m1_e4m3_e5m20_t16",  # a tensor scale
]


@pytest.mark.parametrize("code", WIDE_FLOAT_CODES)
def test_wide_float_elements_and_zero_points(code: str) -> None:
    check(sample((4, 70), seed=50), code, modes=("virtual", "actual", "compress"))
    check(sample((5, 64, 3), seed=51), code, "bfloat16", axis=1, round_mode="away")


def test_wide_codes_decode_without_a_table(monkeypatch: pytest.MonkeyPatch) -> None:
    # a 2^bits decode table of a 26-bit format took two minutes and half a GiB to build
    def no_table(spec: object, device: str) -> None:
        if spec.bits > 16:
            raise AssertionError(f"a 2^{spec.bits} decode table for {spec}")
        return table(spec, device)

    table = tk._decode_table
    monkeypatch.setattr(tk, "_decode_table", no_table)
    for code in WIDE_FLOAT_CODES + WIDE_ZERO_CODES:
        check(sample((2, 32), seed=52), code, modes=("actual",))


# float formats whose values leave float32 (over 2^128, over 24 significant bits, below
# 2^-149): elements decode from their fields without a table, exactly, before the scale;
# scales, zero points and tensor scales saturate where float32 holds them (decision 21) and
# float elements under a float scale are bounded in float64 (far below maxfloat for e9m14)
OUTSIDE_FLOAT32 = [
    "e9m14_e8m0_t32",  # elements up to 2^256, scales down to 2^-127
    "e11m20_e10m0_t16",
    "e5m26_e8m0_t32",  # 27 significant bits
    "e8m23fn_e8m0_t0",  # fn's top binade: up to 2^129
    "e6m25fnuz_float16_t16",
    "e3m28inuz_float32_t32",
    "e4m3b150_e8m0_t32",  # up to 16 bits, a large bias: values below 2^-149
    "e5m10b160",
    "e9m14inuz",
    "e4m3fn_e5m26_t32",  # scales
    "int8_e9m14_t16",
    "e2m1_e6m25fn_t0",
    "e4m3_e5m10b160_t16",
    "uint8_float32_e5m26_t32",  # zero points
    "uint4_bfloat16_e9m14_t16",
    "uint8_e6m25fn_e8m23fn_t0",
    "e2m1_e4m3_e5m26_t16",  # tensor scales
    "e2m1_e4m3_e9m14_t32",
]


@pytest.mark.parametrize("code", OUTSIDE_FLOAT32)
def test_formats_outside_float32(code: str) -> None:
    check(sample((4, 70), seed=56), code, modes=("virtual", "actual", "compress"))
    x = sample((3, 64, 2), seed=57)
    check(x * np.float32(2.0**-120), code, axis=1, round_mode="away")  # tiny tiles
    if GPU:  # each dtype / round mode is a compile there
        return
    check(x * np.float32(2.0**100), code, "bfloat16", axis=1, round_mode="stochastic", seed=2)
    check(x, code, "float16", modes=("virtual", "actual"), round_mode="zero")


@pytest.mark.parametrize("scale_mode", SCALE_MODES)
def test_scale_modes_of_mantissas_over_22_bits(scale_mode: str) -> None:
    # the modes' bump thresholds are fractions of the significand's unit there: floored
    x = sample((4, 64), seed=58)
    x[0, :32] = np.float32(2 - 2.0**-23)
    x[1, :32] = np.float32(1.5)
    x[2, 32:] = np.float32(2 - 2.0**-22)
    for code in ("e5m26_e8m0_t32", "e6m23_e8m0_t32", "e4m24_e8m0_t32"):
        check(x, code, scale_mode=scale_mode, modes=("virtual", "actual"))


def test_float_zero_point_bound_on_float32_data() -> None:
    # tests/cast/test_golden.py's case: the bound's estimate needs float32's real threshold
    # 2^128 - 2^103, not Inf (from qmax, three steps left codes that decoded to Inf)
    x = np.zeros((3, 8), np.float32)
    x[0, :4] = [3.4e38, -3.4e38, 1.0, 0.0]
    x[1] = np.float32(3.3e38) * np.linspace(-1, 1, 8, dtype=np.float32)
    x[2, :2] = [np.finfo(np.float32).max, -np.finfo(np.float32).max]
    for code in ("uint8_float32_bfloat16_t4", "uint4_float32_float32_t8", "uint8_e8m23fn_e9m14_t8"):
        check(x, code, modes=("virtual", "actual"))


# int and uint elements over 24 bits: float32(q) rounds, so the kernels round q * 2^k
# once from the integer (`_make_f32`), clamp float-scaled ones in float64 as the reference does
# (`_int_product_bound`), and hold int32's -2^31 (full range) as a wrapped 2^31
WIDE_INT_CODES = [
    "int25_e8m0_t32",
    "int32_e8m0_t32",
    "int28_e8m0_t16",
    "int26_float32_t32",
    "int32_float16_t0",
    "int30_bfloat16_t16",
    "int27_e10m0_t32",  # scales down to 2^-536: shifts past 31 bits
    "int31_e4m3fn_float32_t16",  # a tensor scale
    # uint elements with zero points: int64 codes from the rounding on (uint32's reach
    # 2^32 - 1), and the bounds are the reference's float64 ones
    "uint25_float32_uint25_t32",
    "uint32_float32_uint32_t32",
    "uint32_bfloat16_float32_t0",
    "uint31_float32_uint31_t16",
    "uint26_float16_uint26_t0",
    "uint28_bfloat16_float32_t32",
    "uint31_float32_e5m20_t16",
]


# the formats whose float16 / bfloat16 cases also run on a GPU (the interpreter runs them all):
# an exponent scale, a float scale, int and float zero points
WIDE_ON_GPU = [
    "int32_e8m0_t32",
    "int32_float16_t0",
    "int32_float16_t16",
    "uint32_float32_uint32_t32",
    "uint28_bfloat16_float32_t32",
    "uint31_float16_uint31_t16",
]


@pytest.mark.parametrize("code", WIDE_INT_CODES)
def test_wide_int_elements(code: str) -> None:
    check(sample((4, 70), seed=53), code, modes=("virtual", "actual", "compress"))
    if GPU and code not in WIDE_ON_GPU:  # each dtype / round mode is a compile there
        return
    x = sample((5, 64, 3), seed=54) * np.float32(2.0**100)  # tiles near float32's top
    check(x, code, "float16", axis=1, round_mode="stochastic", seed=5)
    check(x, code, "bfloat16", modes=("virtual", "actual"), round_mode="away")


@pytest.mark.parametrize(
    "code",
    [
        "int32_e8m0_t32",
        "int25_e8m0_t32",
        "int32_float32_t16",
        "int32_float16_t16",
        "uint31_float16_uint31_t16",
        "uint32_float16_uint32_t16",
        "uint26_float16_float32_t16",
    ],
)
def test_wide_int_edges(code: str) -> None:
    # subnormal tiles (the scale clamps at 2^-157 for int32: q over 2^24 times 2^-150 and
    # below is subnormal, rounded once), the full range's -2^31 and -2^(N-1), ties, and Inf
    # saturating in tiles at the top of float32 (the wrapped 2^31 must still be bounded) and
    # of float16 (a float16 scale rounds up: the float64 product bound binds)
    x = np.zeros((7, 32), np.float32)
    x[0] = np.float32(1e-40) * np.arange(1, 33, dtype=np.float32)
    x[1] = np.float32(-(2.0**-149)) * np.arange(0, 32, dtype=np.float32)
    x[2, :4] = [-(2.0**30), 2.0**30 - 64, -(2.0**30) + 0.5, 3.0]
    x[3] = np.float32(65504.0) * np.linspace(-1, 1, 32, dtype=np.float32)
    x[3, [1, 30]] = [-np.inf, np.inf]
    x[4] = np.float32(1.0) + np.float32(2.0**-23) * np.arange(32, dtype=np.float32)
    x[5, ::3] = -np.inf
    x[6] = np.float32(3.3e38) * np.linspace(-1, 1, 32, dtype=np.float32)
    x[6, [1, 30]] = [-np.inf, np.inf]
    for int_range in ("symmetric", "full"):
        check(x, code, int_range=int_range, modes=("virtual", "actual", "compress"))
        if not GPU or code in WIDE_ON_GPU:
            check(x, code, "float16", int_range=int_range, modes=("virtual", "actual"))


def test_zero_point_bounds_bind() -> None:
    # float16 outputs of tiles whose scale rounds up, so the top codes would decode past
    # 65504: the bounds move them toward the zero point (reference `_product_bound`,
    # `_zero_float_top`). Worked: uint4_float16_uint8: scale 65504 / 15 -> 4368 (float16),
    # zero 15, reach floor(65520 / 4368) = 14, so -65504 takes code 1, not 0.
    # uint4_float16_float32: scale 131008 / 15 -> 8736, 15 * 8736 - 65504 = 65536: 65504 and
    # Inf take 14, not 15. uint26_bfloat16_float32: scale 65504 / 2^26 -> 2^-10 (bfloat16);
    # the bound steps q from floor(65520 * 2^10) + 1 = 67092481 (float32 67092480) to the
    # largest integer below that float32's rounding, 67092477 (tests/cast/test_golden.py)
    x = np.zeros((3, 16), np.float32)
    x[0, :2] = [-65504.0, 0.0]
    x[1, :3] = [-65504.0, 65504.0, np.inf]
    x[2, :3] = [0.0, 65504.0, np.inf]
    for code in ("uint4_float16_uint8_t16", "uint4_float16_float32_t16"):
        check(x[:2], code, "float16")
    check(x[2:], "uint26_bfloat16_float32_t16", "float16")


@pytest.mark.parametrize(
    ("code", "scales"),
    [("int32_e8m0_t4", [0, 10, 224, 254]), ("int32_e10m0_t4", [361, 360, 362, 0])],
)
def test_wide_int_codes_decode_as_the_reference(code: str, scales: list[int]) -> None:
    # codes no cast writes: -2^31, 2^31 - 1, 2^30 + 1 and +-(2^25 + 129), whose float32
    # rounding (2^25 + 128) would make a tie of the subnormal grid: q * 2^k rounds once. The
    # scales make them subnormal (e8m0 code 0: 2^-157; e10m0 codes 360-362: shifts of 30-32
    # bits past 2^-149), normal and overflowing
    from onnxq.cast import reference

    dt = datatype(code)
    tile = [2**31, 2**31 - 1, 2**30 + 1, 2**25 + 129, 2**32 - 2**25 - 129]
    codes = np.array(tile[:4] * 2 + tile[1:] * 2, np.uint32)
    scale = np.array(scales, np.uint32)
    want = reference.dequantize(dt, (16,), -1, codes, scale)
    got = tk.dequantize(
        dt,
        (16,),
        -1,
        torch.from_numpy(codes.view(np.int32)).to(DEV),
        torch.from_numpy(scale.astype(np.int32)).to(DEV),
    )
    assert_same(got, want, code)


# (and formats whose values leave float32: rounded once, Inf past 2^128, 0 below 2^-150)
@pytest.mark.parametrize(
    "name",
    [
        *("e8m15", "e5m20", "e4m19fn", "e5m18fnuz", "e6m17inuz", "e9m14", "e5m26", "e11m20"),
        *("e8m23fn", "e3m28inuz", "e10m21fnuz", "e9m14inuz"),
    ],
)
def test_wide_float_codes_become_their_float32_bits(name: str) -> None:
    # every special code of each convention, subnormals and random codes, against the
    # reference's decode (tests/cast/test_oracles.py checks that one independently)
    from onnxq.cast.elements import decode_codes
    from onnxq.cast.triton_bits import float32_bits
    from onnxq.formats import number

    n = number(name)
    top = 1 << (n.bits - 1)
    inf = ((1 << n.ebits) - 1) << n.mbits
    rng = np.random.default_rng(n.bits)
    special = [0, 1, (1 << n.mbits) - 1, 1 << n.mbits, top, top + 1, top - 1, 2 * top - 1, inf]
    codes = np.concatenate([rng.integers(0, 2 * top, 2000), special, np.add(special, top)])
    codes = codes.astype(np.int64) % (2 * top)
    got = float32_bits(torch.from_numpy(codes).to(DEV), n).cpu().numpy().view(np.float32)
    want = decode_codes(codes.astype(np.uint64), n).astype(np.float32)
    number_ = ~np.isnan(want)
    assert np.array_equal(np.isnan(got), ~number_), name
    assert np.array_equal(got[number_].view(np.int32), want[number_].view(np.int32)), name


@pytest.mark.parametrize(
    "code",
    [
        *("e9m14_e8m0_t4", "e11m20_e10m0_t4", "e5m26_float32_t4", "e4m3b150_e8m0_t4"),
        *("e4m3_e9m14_t4", "uint8_float32_e10m21fnuz_t4", "e5m10b160_float16_t4"),
        "e5m10b160fnuz_e8m0_t4",  # 16-bit codes: int16 storage, masked
    ],
)
def test_float_codes_outside_float32_decode_as_the_reference(code: str) -> None:
    # random codes, most of which no cast writes (huge and tiny values, every special code),
    # for the elements, the scale and the zero point: the exact value, scaled, rounded once
    from onnxq.cast import reference

    dt = datatype(code)
    s = dt.sspec
    rng = np.random.default_rng(len(code))

    def codes(spec: object, count: int) -> np.ndarray:
        sign = 1 << (spec.bits - 1)  # and the codes each convention makes special
        special = [0, 1, sign, sign + 1, sign - 1, 2 * sign - 1, max(sign - (1 << spec.mbits), 0)]
        drawn = rng.integers(0, 1 << spec.bits, count - len(special), dtype=np.uint64)
        return np.concatenate([np.array(special, np.uint64), drawn]).astype(np.uint32)

    data, scale = codes(dt.nspec, 64), codes(s.scale, 16)
    zero = codes(s.zero, 16) if s.zero is not None else None
    want = reference.dequantize(dt, (64,), -1, data, scale, zero)

    def dev(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.view(np.int32) if a.itemsize == 4 else a.astype(np.int32)).to(DEV)

    extra = {} if zero is None else {"zero": dev(zero)}
    got = tk.dequantize(dt, (64,), -1, dev(data), dev(scale), **extra)
    assert_same(got, want, code)


def test_tiny_and_huge_tiles() -> None:
    x = np.zeros((6, 64), np.float32)
    x[0] = np.float32(1e-40) * np.arange(64, dtype=np.float32)  # subnormal tile
    x[1] = np.float32(2.0**-140)
    x[2] = np.float32(3.3e38)
    x[3, ::2] = np.float32(-(2.0**-149))
    x[4] = np.float32(1.5) * np.float32(2.0) ** np.arange(-32, 32, dtype=np.float32)
    for name in ("mxfp8e4", "mxfp8e5", "mxfp4", "mxint8", "mx4", "nvfp4", "int8_channel"):
        for scale_mode in ("floor", "ceil"):
            check(x, name, scale_mode=scale_mode)
    check(x, "mxfp8e5", "float16")


def test_all_zero_input() -> None:
    for name in ("mxfp4", "mx9", "nvfp4", "int8_tensor"):
        check(np.zeros((2, 48), np.float32), name)
        check(-np.zeros((2, 48), np.float32), name)


def test_device_packing_equals_packing_py() -> None:
    rng = np.random.default_rng(21)
    for b in (1, 2, 3, 4, 5, 6, 7, 8, 16, 17, 20, 31, 32):
        for count in (1, 7, 8, 9, 77):
            width = np.uint8 if b <= 8 else (np.uint16 if b <= 16 else np.uint32)
            codes = rng.integers(0, 1 << b, size=count).astype(width)
            t = torch.from_numpy(codes).to(DEV)
            packed = tk.pack_bits(t, b)
            want = pack_bits(codes, b)
            assert packed.cpu().numpy().tobytes() == want.tobytes(), (b, count)
            back = tk.unpack_bits(packed, b, count)
            assert np.array_equal(back.cpu().numpy().astype(np.int64), codes.astype(np.int64))


# -- the torch side of the API -----------------------------------------------------------------
def test_auto_and_reference_backends_on_torch_tensors() -> None:
    x = sample((4, 64), seed=23)
    xt = torch.from_numpy(x)  # a CPU tensor: auto = reference, returns torch
    got = cast(xt, "mxfp4")
    assert isinstance(got, torch.Tensor)
    assert_same(got, cast(x, "mxfp4"), "auto on CPU")
    q = cast(to_torch(x, "bfloat16"), "mx6", mode="compress")
    assert isinstance(q.data, torch.Tensor) and q.data.dtype == torch.uint8
    back = upcast(q, ml_dtypes.bfloat16)
    assert back.dtype == torch.bfloat16
    assert_same(back, cast(x.astype(ml_dtypes.bfloat16), "mx6"), "upcast of a torch QTensor")


def test_custom_codebook_metrics_raise_for_triton() -> None:
    # what the Triton engine leaves to the reference: Python callables as codebook metrics
    # (every format runs there)
    x = to_torch(sample((2, 64), seed=25), "float32")
    with pytest.raises(NotImplementedError, match="custom codebook metrics"):
        cast(x, "cb41fi_e2m2fnuz_e8m0_t32", backend="triton", metric=l2_metric)


def test_bad_inputs() -> None:
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        cast(torch.ones(4, 32, dtype=torch.float64, device=DEV), "mxfp4", backend="triton")
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        cast(torch.ones(4, 32, dtype=torch.int32, device=DEV), "mxfp4")
    with pytest.raises(ValueError, match="empty"):
        cast(torch.ones(0, 32, device=DEV), "mxfp4", backend="triton")
    with pytest.raises(ValueError, match="out of range"):
        cast(torch.ones(4, 32, device=DEV), "mxfp4", axis=2, backend="triton")
    # a non-contiguous tensor is handled (copied), with the reference's flat indices
    x = sample((64, 6), seed=27)
    xt = torch.from_numpy(x).to(DEV).t()
    want = cast(np.ascontiguousarray(x.T), "mxfp4", round_mode="stochastic", seed=1)
    got = cast(xt, "mxfp4", round_mode="stochastic", seed=1, backend="triton")
    assert_same(got, want, "non-contiguous")


def test_cpu_tensor_with_triton_backend_needs_a_gpu_or_the_interpreter(monkeypatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs a CUDA tensor"):
        cast(torch.ones(4, 32), "mxfp4", backend="triton")


@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_auto_falls_back_with_one_warning_on_the_gpu() -> None:
    x = to_torch(sample((4, 64), seed=33), "float32")
    with pytest.warns(RuntimeWarning, match="falling back"):
        got = cast(x, "int32_e8m0_t32")
    assert got.is_cuda
    assert_same(got, cast(x.cpu().numpy(), "int32_e8m0_t32"), "fallback")


def test_datatype_objects_are_accepted() -> None:
    x = sample((2, 64), seed=35)
    check(x, datatype("e4m3fn", "e8m0_t32"))


@triton.jit
def _reach_kernel(sc_ptr, out_ptr, n, top, f_emax, f_mbits, block: tl.constexpr):
    i = tl.arange(0, block)
    sc = tl.load(sc_ptr + i, mask=i < n, other=0.0).to(tl.float64)
    tl.store(out_ptr + i, _int_reach(sc, top.to(tl.float64), f_emax, f_mbits), mask=i < n)


@pytest.mark.parametrize("bits", [25, 31, 32])
@pytest.mark.parametrize("out", ["float16", "bfloat16", "float32"])
def test_int_reach_is_the_reference_product_bound(bits: int, out: str) -> None:
    # `_int_reach` (float-scaled ints, int zero points) against the reference's
    # `_product_bound` for every float16 / bfloat16 scale near the limit, where float32(b)
    # can round past it (tests/cast/test_finite.py checks the reference with exact rationals)
    from onnxq.cast.reference import _product_bound
    from onnxq.cast.triton_plan import _FINITE
    from onnxq.formats import number

    n = number(f"uint{bits}")
    top = float(n.maxfloat)
    typ = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[out]
    f_emax, f_mbits = _FINITE[getattr(torch, out)][:2]
    center = float(ml_dtypes.finfo(typ).max) / float(np.float32(top))
    grid = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)
    if out != "float16":
        grid = (np.arange(0, 0x7F80, dtype=np.uint32) << 16).view(np.float32)
    sc = np.concatenate([grid[(grid > center * 0.98) & (grid < center * 1.02)], [0.0]])
    sc = sc.astype(np.float32)
    want = _product_bound(sc, n, top, typ)
    got = torch.zeros(sc.size, dtype=torch.float64, device=DEV)
    block = triton.next_power_of_2(sc.size)
    _reach_kernel[(1,)](
        torch.from_numpy(sc).to(DEV), got, sc.size, int(top), f_emax, f_mbits, block
    )
    assert np.array_equal(got.cpu().numpy(), want), (bits, out)


@triton.jit
def _float_reach_kernel(
    sc_ptr, nb_ptr, sb_ptr, n, maxm, emax, mbits, emin, f_emax, f_mbits, block: tl.constexpr
):
    i = tl.arange(0, block)
    sc = tl.load(sc_ptr + i, mask=i < n, other=0.0)
    nb, sb = _float_reach(sc, maxm, emax, mbits, emin, f_emax, f_mbits)
    tl.store(nb_ptr + i, nb, mask=i < n)
    tl.store(sb_ptr + i, sb, mask=i < n)


# `_float_reach` (float elements under a float scale) against the reference's `_product_bound`.
# Its last step (the grid value t = limit / scale lands on reaches the limit) needs scales
# whose quotient is exactly a grid value: the limits factor as float32: 2^103 * 31 * 601 * 1801
# (b = 31 * 2^k, 601 * 2^k, 1801 * 2^k on e5m10's grid: the scale 2^(103-k) * the rest has at
# most 21 bits); bfloat16: 2^103 * 3 * 5 * 11 * 17 * 11939 (b = 3 * 2^k, 15 * 2^k on e4m3fn's
# grid); float16: 2^-9 * 33546239, a prime of 25 bits (b = 33546239 * 2^-9 or 2^-10 on
# e5m26's grid, scales 1 and 2). Also spreads of scales near limit / maxfloat and, for e9m14,
# tiny ones (bounds far below its maxfloat 2^256).
def _limit_scales(limit: int, exp2: int, factors: list[int], mbits: int) -> list[float]:
    out = []
    for f in factors:
        for k in range(-12, 12):
            b = f * 2.0**k
            sc = limit * 2.0**exp2 / b  # exact in float64
            fits = f.bit_length() <= mbits + 1 and b <= 65504 and sc < 2.0**128
            if fits and np.float32(sc) == sc:
                out.append(sc)
    return out


FLOAT_REACH = [
    ("e5m10", "float32", _limit_scales(2**25 - 1, 103, [31, 601, 1801, 31 * 601], 10)),
    ("e4m3fn", "bfloat16", _limit_scales(2**25 - 2**16 - 1, 103, [3, 15, 5, 11], 3)),
    ("e5m26", "float16", [1.0, 2.0, 0.5]),
    ("e9m14", "float32", [2.0**k * 1.375 for k in range(-140, 101, 4)]),
]


@pytest.mark.parametrize(("code", "out", "crafted"), FLOAT_REACH)
def test_float_reach_is_the_reference_product_bound(code: str, out: str, crafted: list) -> None:
    from onnxq.cast.reference import _product_bound
    from onnxq.cast.triton_plan import _FINITE, _elem_fmt
    from onnxq.formats import number

    n = number(code)
    e = _elem_fmt(n)
    typ = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[out]
    f_emax, f_mbits = _FINITE[getattr(torch, out)][:2]
    center = float(ml_dtypes.finfo(typ).max) / n.maxfloat
    rng = np.random.default_rng(len(code))
    spread = center * (1 + rng.uniform(-0.02, 0.02, 200))
    sc = np.concatenate([np.asarray(crafted), spread, [0.0]]).astype(np.float32)
    assert np.all(sc[: len(crafted)].astype(np.float64) == np.asarray(crafted))  # exact
    want = _product_bound(sc, n, n.maxfloat, typ)
    nb = torch.zeros(sc.size, dtype=torch.int32, device=DEV)
    sb = torch.zeros(sc.size, dtype=torch.int32, device=DEV)
    block = triton.next_power_of_2(sc.size)
    args = (e.maxm, e.emax, e.mbits, e.emin, f_emax, f_mbits, block)
    _float_reach_kernel[(1,)](torch.from_numpy(sc).to(DEV), nb, sb, sc.size, *args)
    got = np.ldexp(nb.cpu().numpy().astype(np.float64), sb.cpu().numpy())
    assert np.array_equal(got, want), code
    # the crafted scales take the last step: b = t itself reaches the limit
    limit = _product_bound.__globals__["PRODUCT_LIMIT"][np.dtype(typ).name]
    t = limit / sc[: len(crafted)].astype(np.float64)
    if code != "e9m14":
        assert np.all(want[: len(crafted)] < t), code
