"""Scale mode ``search`` (onnxq/cast/scale_search.py): per tile, the least-error candidate.

The numpy reference is the oracle; the native kernels must give its bits for every family.
The properties compare the search's per-tile squared error with that of floor and of the
rounding-up scale, each computed here with plain numpy from decoded values.
"""

from __future__ import annotations

import numpy as np
import pytest

import onnxq
from onnxq.cast import backends, native
from onnxq.cast.request import resolve
from onnxq.cast.scale_search import float_step
from onnxq.formats import number
from onnxq.formats.modes import ScaleMode

FAMILIES = [
    "mxfp8",  # e4m3 elements, E8M0 scales
    "mxfp8e5",  # e5m2
    "mxfp6",
    "mxfp6e3",
    "mxfp4",
    "mxint8",
    "bfp16",
    "int8_e8m0_t8",  # BFP16 with block 8
    "mx9",
    "mx6",
    "mx4",
    "nvfp4",  # E4M3 tile scales over a float32 tensor scale
    "e2m1_e4m3_t16",  # float tile scales, no tensor scale
    "int8_float32_t0",  # int elements, float channel scales
    "int4_bfloat16_t32",
    "e4m3_e8m0",  # one exponent scale for the tensor
    "e2m1_e8m0_t4_t8",  # 2-D tiles
    "e2m1_e8m0_t16n2m4",  # N:M sparsity
    "cb51ie_e2m3_mx6_e8m0_t16s2",  # implicit codebook, mapping per pair
    "uint4_bfloat16_bfloat16_t32",  # zero point: no search, the ordinary rule
]
# float scales whose grid is finer than float32's: over 23 mantissa bits everywhere (e5m26),
# below 2^-135 (e9m14, on tiny data); both saturate where float32 holds their values
FINE_SCALES = ["e4m3fn_e5m26_t32", "int4_e9m14_t8", "e2m1_e4m3_e5m26_t16"]


def _data(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Magnitudes over many binades, zeros, subnormals, NaN and +-Inf, a whole zero row."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, size=(*shape[:-1], 1)))
    x = x.astype(np.float32)
    flat = x.reshape(-1)
    n = flat.size
    flat[rng.choice(n, n // 7, replace=False)] = 0.0
    flat[rng.choice(n, 3, replace=False)] = np.float32(3e-39)  # float32 subnormals
    flat[rng.choice(n, 2, replace=False)] = np.nan
    flat[rng.choice(n, 1)] = np.inf
    flat[rng.choice(n, 1)] = -np.inf
    x.reshape(-1, shape[-1])[1] = 0.0
    return x


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f":
        return a.shape == b.shape and np.array_equal(
            a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}")
        )
    return a.shape == b.shape and np.array_equal(a, b)


@pytest.mark.needs_native
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize(
    ("shape", "axis"), [((5, 70), -1), ((3, 33, 9), 1), ((2, 5), 0), ((17, 24), 0)]
)
@pytest.mark.parametrize("policy", ["element", "block"])
def test_native_equals_reference(name: str, shape: tuple[int, ...], axis: int, policy: str) -> None:
    if "t4_t8" in name and len(shape) < 2:
        pytest.skip("2-D tiles need 2 dims")
    x = _data(shape, seed=len(name) + sum(shape))
    kw = {"axis": axis, "scale_mode": "search", "nan_policy": policy}
    ref = onnxq.cast(x, name, mode="actual", backend="reference", **kw)
    nat = onnxq.cast(x, name, mode="actual", backend="native", **kw)
    assert _same(ref.data, nat.data), name
    for field in ("scale", "zero", "tenscale", "meta", "mask"):
        a, b = getattr(ref, field, None), getattr(nat, field, None)
        assert (a is None) == (b is None), field
        if a is not None:
            assert _same(a, b), (name, field)
    vr = onnxq.cast(x, name, backend="reference", **kw)
    vn = onnxq.cast(x, name, backend="native", **kw)
    assert _same(vr, vn), name


# A candidate is a value a scale can be: one that float32 holds (scale_search.float_step).
# e4m3fn (grid coarser than float32's): one code, 1 -> 1.125 and, below the power of two where
# the step halves, 1 -> 1 - 2^-4. e5m26: its neighbours 1 +- 2^-26 are not float32 numbers; the
# next float32 numbers 1 + 2^-23 and 1 - 2^-24 are on its grid. Up from its largest float32
# value 2^16 - 2^-8 stays; up from 0 is its smallest, 2^-40 (a float32 number).
# e9m14 (emin -254): up from 0 is 2^-149 (its own smallest, 2^-268, is not a float32 number),
# down from there 0; at 2^-130 its step 2^-144 is coarser than float32's 2^-149 (one code);
# at 2^-140 its step 2^-154 is finer (2^-140 + 2^-149); up from 2^128 - 2^113 stays.
FLOAT_STEPS = [
    ("e4m3fn", 1.0, 1, 1.125),
    ("e4m3fn", 1.0, -1, 1 - 2.0**-4),
    ("e5m26", 1.0, 1, 1 + 2.0**-23),
    ("e5m26", 1.0, -1, 1 - 2.0**-24),
    ("e5m26", 2.0**16 - 2.0**-8, 1, 2.0**16 - 2.0**-8),
    ("e5m26", 0.0, 1, 2.0**-40),
    ("e9m14", 0.0, 1, 2.0**-149),
    ("e9m14", 2.0**-149, -1, 0.0),
    ("e9m14", 2.0**-130, 1, 2.0**-130 + 2.0**-144),
    ("e9m14", 2.0**-140, 1, 2.0**-140 + 2.0**-149),
    ("e9m14", 2.0**128 - 2.0**113, 1, 2.0**128 - 2.0**113),
]


@pytest.mark.parametrize(("code", "sc", "step", "want"), FLOAT_STEPS)
def test_float_step_among_float32_values(code: str, sc: float, step: int, want: float) -> None:
    got = float_step(np.array([sc], np.float32), number(code), step)
    assert got.dtype == np.float32 and float(got[0]) == want


@pytest.mark.needs_native
@pytest.mark.parametrize("name", FINE_SCALES)
@pytest.mark.parametrize("tiny", [False, True])
def test_native_equals_reference_on_scales_finer_than_float32(name: str, tiny: bool) -> None:
    x = _data((6, 64), seed=9)
    if tiny:  # scales below 2^-135, where e9m14's grid is finer than float32's
        x = (x * np.float32(2.0**-125)).astype(np.float32)
    kw = {"scale_mode": "search"}
    ref = onnxq.cast(x, name, mode="actual", backend="reference", **kw)
    nat = onnxq.cast(x, name, mode="actual", backend="native", **kw)
    for field in ("data", "scale", "tenscale"):
        a, b = getattr(ref, field, None), getattr(nat, field, None)
        assert (a is None) == (b is None) and (a is None or _same(a, b)), (name, field)
    vr = onnxq.cast(x, name, backend="reference", **kw)
    assert _same(vr, onnxq.cast(x, name, backend="native", **kw)), name
    assert _same(onnxq.upcast(ref), vr), name


@pytest.mark.needs_native
@pytest.mark.parametrize("name", ["mxfp8", "mxfp4", "mx6", "nvfp4", "bfp16"])
@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_native_equals_reference_half(name: str, dtype: object) -> None:
    import ml_dtypes

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    x = np.nan_to_num(_data((6, 64), seed=3), nan=0, posinf=0, neginf=0)
    x = (x / np.float32(max(np.abs(x).max(), 1)) * 1000).astype(dt)
    for mode in ("virtual", "actual"):
        r = onnxq.cast(x, name, scale_mode="search", mode=mode, backend="reference")
        n = onnxq.cast(x, name, scale_mode="search", mode=mode, backend="native")
        if mode == "virtual":
            assert _same(np.asarray(r), np.asarray(n))
        else:
            assert _same(r.data, n.data) and _same(r.scale, n.scale)


@pytest.mark.needs_native
@pytest.mark.parametrize("rm", ["even", "away", "zero", "stochastic"])
def test_native_equals_reference_round_modes(rm: str) -> None:
    x = _data((9, 96), seed=11)
    for name in ("mxfp4", "mx9", "nvfp4"):
        kw = {"scale_mode": "search", "round_mode": rm, "seed": 5}
        r = onnxq.cast(x, name, backend="reference", **kw)
        n = onnxq.cast(x, name, backend="native", **kw)
        assert _same(r, n), (name, rm)


def _tile_err(y: np.ndarray, x: np.ndarray, tile: int) -> np.ndarray:
    """Per-tile squared error along the last axis over finite inputs (plain numpy)."""
    d = np.where(np.isfinite(x), y.astype(np.float64) - x.astype(np.float64), 0.0)
    return (d * d).reshape(x.shape[0], -1, tile).sum(axis=-1)


def _weights(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # rows of different ranges; tiles of a single value, as a depthwise conv has
    x = rng.standard_normal((48, 128)) * np.exp2(rng.integers(-8, 8, size=(48, 1)))
    x[:8, 1:] = 0.0
    return x.astype(np.float32)


@pytest.mark.parametrize("name", ["mxfp8", "mxfp8e5", "mxfp6", "mxfp4"])
def test_search_no_worse_than_floor_or_ceil_float(name: str) -> None:
    x = _weights(1)
    tile = 32
    search = _tile_err(onnxq.cast(x, name, scale_mode="search", backend="reference"), x, tile)
    for rule in ("floor", "ceil", "rceil"):
        other = _tile_err(onnxq.cast(x, name, scale_mode=rule, backend="reference"), x, tile)
        # the search adds in another order than np.sum: allow that rounding only
        assert np.all(search <= other * (1 + 1e-12)), rule
    floor = _tile_err(onnxq.cast(x, name, scale_mode="floor", backend="reference"), x, tile)
    assert np.any(search < floor * (1 - 1e-6))  # the data has tiles floor clips


def _int_decode(x: np.ndarray, tile: int, qmax: int, frac: int, bump: int) -> np.ndarray:
    """Int elements with one integer bit on E8M0 scales (OCP MXINT8), by hand.

    Scale 2^(floor(log2 absmax) + bump - frac); q = clip(rint(x / scale)); y = q * scale.
    """
    t = x.reshape(x.shape[0], -1, tile).astype(np.float64)
    amax = np.abs(t).max(axis=-1, keepdims=True)
    e = np.floor(np.log2(np.where(amax > 0, amax, 1.0)))
    scale = np.exp2(e + bump - frac)
    y = np.clip(np.rint(t / scale), -qmax, qmax) * scale
    return y.reshape(x.shape).astype(np.float32)


@pytest.mark.parametrize(
    ("name", "tile", "qmax", "frac"),
    [("mxint8", 32, 127, 6), ("bfp16", 16, 127, 6), ("int4_e8m0_t32", 32, 7, 2)],
)
def test_search_no_worse_than_floor_or_up_int(name: str, tile: int, qmax: int, frac: int) -> None:
    x = _weights(2)
    x[8:16] *= np.float32(1.99)  # mantissas near 2: floor clips them
    search = _tile_err(onnxq.cast(x, name, scale_mode="search", backend="reference"), x, tile)
    floor_y = _int_decode(x, tile, qmax, frac, 0)
    assert np.array_equal(floor_y, onnxq.cast(x, name, backend="reference"))  # our oracle
    for bump in (0, 1):
        other = _tile_err(_int_decode(x, tile, qmax, frac, bump), x, tile)
        assert np.all(search <= other * (1 + 1e-12)), bump


def test_search_no_worse_than_rule_nvfp4() -> None:
    x = _weights(3)
    search = _tile_err(onnxq.cast(x, "nvfp4", scale_mode="search", backend="reference"), x, 16)
    rule = _tile_err(onnxq.cast(x, "nvfp4", backend="reference"), x, 16)
    assert np.all(search <= rule * (1 + 1e-12))
    assert np.sum(search) < np.sum(rule)


def test_golden_depthwise_tile_mxfp8() -> None:
    # One value per tile (a depthwise conv's weight along its reduction axis), 1.875.
    # MXFP8 e4m3: emax 8, maxfloat 448 = 1.75 * 2^8, mantissa 3 bits.
    # floor: maxexp = floor(log2 1.875) = 0; scale 2^(0 - 8); 1.875 * 2^8 = 480 > 448, so
    #   the element clips to 448 and decodes to 448 * 2^-8 = 1.75 (error 0.125^2 = 0.015625);
    #   E8M0 code 127 - 8 = 119.
    # floor + 1: scale 2^-7; 1.875 * 2^7 = 240 = 1.111b * 2^7, an e4m3 value: exact (error
    #   0); code 120.  floor - 1: 1.875 * 2^9 = 960 clips to 448 -> 0.875 (worse).
    # The search keeps the least error: code 120 and the value 1.875.
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 1.875
    floor = onnxq.cast(x, "mxfp8", mode="actual", backend="reference")
    assert floor.scale.tolist() == [[119]]
    assert onnxq.cast(x, "mxfp8", backend="reference")[0, 0] == 1.75
    for backend in ("reference", "native") if native.available() else ("reference",):
        q = onnxq.cast(x, "mxfp8", mode="actual", scale_mode="search", backend=backend)
        assert q.scale.tolist() == [[120]], backend
        y = onnxq.cast(x, "mxfp8", scale_mode="search", backend=backend)
        assert y[0, 0] == 1.875 and not np.any(y[0, 1:]), backend
        assert onnxq.upcast(q)[0, 0] == 1.875  # stored in the ordinary format


def test_golden_floor_minus_one_mxfp4() -> None:
    # MXFP4 e2m1 (grid 0, 0.5, 1, 1.5, 2, 3, 4, 6; emax 2). Tile: 1.0 and 31 x 0.0625.
    # floor: scale 2^(0 - 2) = 0.25: 1.0 -> 4 exact; 0.0625 -> 0.25, halfway between 0 and
    #   0.5, ties to even 0: error 31 * 0.0625^2 = 0.12109375; code 125.
    # floor + 1: scale 0.5: 0.0625 -> 0.125 -> 0: the same 0.12109375 (a tie: floor first).
    # floor - 1: scale 0.125: 1.0 -> 8 clips to 6 -> 0.75 (error 0.0625); 0.0625 -> 0.5
    #   exact: error 0.0625^2 = 0.00390625, the least; code 124.
    x = np.full((1, 32), 0.0625, np.float32)
    x[0, 0] = 1.0
    for backend in ("reference", "native") if native.available() else ("reference",):
        q = onnxq.cast(x, "mxfp4", mode="actual", scale_mode="search", backend=backend)
        assert q.scale.tolist() == [[124]], backend
        y = onnxq.cast(x, "mxfp4", scale_mode="search", backend=backend)
        assert y[0, 0] == 0.75 and np.all(y[0, 1:] == 0.0625), backend


def test_zero_and_nan_tiles() -> None:
    x = np.zeros((3, 32), np.float32)
    x[1, 5] = np.nan
    x[2, :] = 1.9
    x[2, 3] = np.nan
    floor = onnxq.cast(x, "mxfp8", mode="actual", backend="reference")
    q = onnxq.cast(x, "mxfp8", mode="actual", scale_mode="search", backend="reference")
    # zero tile: floor's code 0 (decision 2); a tile of zeros and NaN: the same code
    assert q.scale[0, 0] == floor.scale[0, 0] == 0 and q.scale[1, 0] == 0
    y = onnxq.cast(x, "mxfp8", scale_mode="search", backend="reference")
    assert np.isnan(y[1, 5]) and np.isnan(y[2, 3]) and not np.any(y[0])
    assert np.all(y[2, np.arange(32) != 3] == 1.875)  # 1.9 -> 243.2 -> 240 at 2^-7
    blk = onnxq.cast(
        x, "mxfp8", mode="actual", scale_mode="search", nan_policy="block", backend="reference"
    )
    assert blk.scale[1, 0] == blk.scale[2, 0] == 255  # the NaN policy is unchanged


def test_auto_picks_a_cpu_engine_and_triton_takes_every_family() -> None:
    request = resolve("mxfp8", (2, 32), scale_mode="search")
    assert request.scale_mode is ScaleMode.SEARCH
    assert backends.choose_for_array(request).value in ("native", "reference")
    pytest.importorskip("triton")
    # tests/cast/triton/test_search.py compares them with the reference
    for name in ("mxfp8", "cb51ie_e2m3_mx6_e8m0_t16s2", "uint4_bfloat16_bfloat16_t32"):
        assert backends.triton_gap((2, 32), resolve(name, (2, 32), scale_mode="search")) is None
