"""The native (C++) backend equals the numpy reference bit for bit (architecture decision 12)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import onnxq

# Resolve onnxq's lazy `cast` attribute first: importing the onnxq.cast subpackage before it is
# resolved binds the name `onnxq.cast` to the subpackage (onnxq/__init__.py's lazy import).
_ = onnxq.cast
from onnxq.cast import native, reference  # noqa: E402
from onnxq.cast.api import cast  # noqa: E402
from onnxq.formats.datatype import DataType, datatype  # noqa: E402
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode  # noqa: E402

pytestmark = pytest.mark.needs_native

FIELDS = ("values", "codes", "scale", "zero", "tenscale", "meta", "mask")
EXTRA = [
    "cb41fi_e2m2fnuz_e8m0_t32",
    "cb42fi012_e2m2fnuz_e8m0_t16s4",
    "cb41fi_e2m2fnuz_e8m0",
    "e4m3fn_e8m0_t4_t8",
    "int8_e8m0_t8s2_t8s2",
    "uint4_float16_float16_t32",
    "uint8_bfloat16_int16_t0_t8",
    "e2m1fnuz_e8m0_t16n2m4",
    "int8_e8m0_t8n2m4_t8",
    "e3m2_e8m0_t32",
    "e4m3fnuz_float16_t0",
    "e5m2",
    "e4m3fn",
    "float16",
    "bfloat16",
    # values outside float32: elements, scales (saturating where float32 holds them), zero
    # points, a tensor scale, a large bias
    "e9m14_e8m0_t32",
    "e4m3fn_e5m26_t32",
    "int8_e9m14_t16",
    "uint8_float32_e6m25fn_t32",
    "e2m1_e4m3_e5m26_t16",
    "e4m3b150_e8m0_t32",
    # exponent scales with grid steps down to 2^-1022 (the limit), clamped at their top
    "e2m1_e5m0b1022_t8",
    "int8_e10m0b1016_t8",
    "cb41fi_e2m2fnuz_e5m0b1022_t8",
]
NAMES = [*onnxq.datatypes(), *EXTRA]
SPECIALS = np.array(
    [
        0.0,
        -0.0,
        np.inf,
        -np.inf,
        np.nan,
        -np.nan,
        1.0,
        -1.0,
        2.0**-126,
        2.0**-149,
        -(2.0**-140),
        2.0**127,
        3.4e38,
        6.0,
        5.99,
        448.0,
        0.5,
        1 - 2**-24,
        4 - 2**-22,
        1e-30,
    ],
    dtype=np.float32,
)
SHAPES = [((6, 35), -1), ((4, 7, 19), 1), ((3, 17, 5), 0), ((1,), 0), ((2, 3, 4, 33), 2)]


def _data(shape: tuple[int, ...], kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, shape))).astype(np.float32)
    flat = x.reshape(-1)
    if kind == "special":
        where = rng.integers(0, flat.size, max(1, flat.size // 3))
        flat[where] = rng.choice(SPECIALS, where.size)
    elif kind == "pow2":  # powers of two and the float just below each
        v = np.exp2(rng.integers(-130, 128, flat.size).astype(np.float64)).astype(np.float32)
        below = rng.random(flat.size) < 0.5
        flat[:] = np.where(below, np.nextafter(v, np.float32(0)), v) * rng.choice(
            [-1, 1], flat.size
        )
    elif kind == "zeros":
        flat[:] = 0
    elif kind == "subnormal":
        flat[:] = (rng.standard_normal(flat.size) * 2.0**-135).astype(np.float32)
    return x


def _bits(a: np.ndarray | None) -> np.ndarray | None:
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    if a.dtype == np.bool_:
        return a.view(np.uint8)
    return a.view(f"u{a.dtype.itemsize}")


def _assert_same(ref: object, nat: object, fields: tuple[str, ...], what: str) -> None:
    bad = []
    for name in fields:
        r, n = _bits(getattr(ref, name)), _bits(getattr(nat, name))
        if r is None or n is None:
            if (r is None) != (n is None):
                bad.append(f"{name}: one side is None")
            continue
        if r.shape != n.shape or not np.array_equal(r.astype(np.uint64), n.astype(np.uint64)):
            bad.append(f"{name}: {int((r != n).sum()) if r.shape == n.shape else 'shape'} differ")
    assert not bad, f"{what}: " + "; ".join(bad)


def _both(x: np.ndarray, dt: DataType, out: type = np.float32, **kw: object) -> tuple:
    with np.errstate(all="ignore"):
        # The reference learns the caller's type (it bounds the element clamp) as cast() tells it.
        ref = reference.quantize(x.astype(np.float32), dt, finite_dtype=x.dtype, **kw)
    ref.values = ref.values.astype(out)
    nat = native.quantize(x, dt, values_dtype=np.dtype(out), **kw)
    return ref, nat


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["random", "special", "pow2", "zeros", "subnormal"])
def test_native_equals_reference_for_every_preset(name: str, kind: str) -> None:
    dt = datatype(name)
    two_d = dt.sspec is not None and len(dt.sspec.tiles) == 2
    for i, (shape, axis) in enumerate(SHAPES):
        if two_d and len(shape) < 2:
            continue
        x = _data(shape, kind, seed=i)
        for policy in NanPolicy:
            for rm in (RoundMode.EVEN, RoundMode.STOCHASTIC):
                if rm is RoundMode.STOCHASTIC and name.startswith("cb"):
                    continue
                kw = {"axis": axis % len(shape), "round_mode": rm, "nan_policy": policy, "seed": 3}
                ref, nat = _both(x, dt, **kw)
                _assert_same(ref, nat, FIELDS, f"{name} {kind} {shape} {kw}")


@pytest.mark.parametrize(
    "name", ["mxfp8e4", "mxfp6e2", "mxfp4", "mxfp8e5", "mxint8", "mx6", "nvfp4"]
)
@pytest.mark.parametrize("rm", list(RoundMode))
@pytest.mark.parametrize("sm", list(ScaleMode))
def test_native_equals_reference_for_every_mode(name: str, rm: RoundMode, sm: ScaleMode) -> None:
    dt = datatype(name)
    x = _data((5, 77), "random", seed=11)
    for full in (False, True):
        ref, nat = _both(x, dt, axis=1, round_mode=rm, scale_mode=sm, seed=9, full_int_range=full)
        _assert_same(ref, nat, FIELDS, f"{name} {rm} {sm} full={full}")


@pytest.mark.parametrize("out", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize(
    "name", ["mxfp8e4", "mxfp4", "mx9", "bfp16", "nvfp4", "uint4_block32", "e4m3fn"]
)
def test_native_half_precision_in_and_out(name: str, out: type) -> None:
    dt = datatype(name)
    x = _data((9, 45), "special", seed=5).astype(out)
    ref, nat = _both(x, dt, out=out, axis=0, round_mode=RoundMode.STOCHASTIC, seed=2)
    _assert_same(ref, nat, FIELDS, f"{name} {out}")


@pytest.mark.parametrize("name", NAMES)
def test_native_dequantize_equals_reference(name: str) -> None:
    dt = datatype(name)
    for i, (shape, axis) in enumerate(SHAPES[:3]):
        x = _data(shape, "special", seed=20 + i)
        with np.errstate(all="ignore"):
            ref = reference.quantize(x, dt, axis=axis)
            want = reference.dequantize(
                dt, shape, axis, ref.codes, ref.scale, ref.zero, ref.tenscale, ref.meta
            )
        if ref.mask is not None:
            want = np.where(ref.mask, want, np.float32(0))
        got = native.dequantize(
            dt, shape, axis, ref.codes, ref.scale, ref.zero, ref.tenscale, ref.meta, ref.mask
        )
        assert np.array_equal(want.view(np.uint32), got.view(np.uint32)), (name, shape)


def test_cast_dispatches_to_native_and_matches_reference() -> None:
    x = _data((64, 96), "random", seed=1)
    for name in ("mxfp4", "mx6", "nvfp4"):
        a = cast(x, name, backend="native")
        b = cast(x, name, backend="reference")
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
        qa = cast(x, name, backend="native", mode="compress")
        qb = cast(x, name, backend="reference", mode="compress")
        for field in ("data", "scale", "meta"):
            fa, fb = getattr(qa, field), getattr(qb, field)
            assert (fa is None and fb is None) or np.array_equal(fa, fb), (name, field)


def test_native_refuses_a_custom_metric_by_name() -> None:
    x = _data((4, 32), "random", seed=1)

    def metric(v: np.ndarray, q: np.ndarray) -> np.ndarray:
        return np.abs(v - q).sum(axis=-1)

    with pytest.raises(NotImplementedError, match="custom codebook metric"):
        cast(x, "cb41fi_e2m2fnuz_e8m0_t32", backend="native", metric=metric)
    # auto does the cast with the reference instead
    cast(x, "cb41fi_e2m2fnuz_e8m0_t32", metric=metric)


def test_native_refuses_stochastic_codebooks_by_message() -> None:
    with pytest.raises(NotImplementedError, match="stochastic is not supported"):
        native.quantize(
            np.ones((2, 32), np.float32),
            datatype("cb41fi_e2m2fnuz_e8m0_t32"),
            round_mode=RoundMode.STOCHASTIC,
        )


# formats whose float32_max is not their maxfloat: over 2^128, 24 significant bits, or both
WIDE_NUMBERS = ["e9m14_e5m26_t32", "e8m23fn_e6m25fn_t32", "e11m20_e10m21fn_t32", "e3m28_e7m24_t8"]


@pytest.mark.parametrize("name", [*onnxq.datatypes(), "e5m2_e8m0_t32", *WIDE_NUMBERS])
def test_cpp_number_properties_match_python(name: str) -> None:
    dt = datatype(name)
    specs = [dt.nspec] + ([] if dt.sspec is None else [dt.sspec.scale])
    for spec in specs:
        bits, maxfloat, emax, emin, midmax, f32_max = native.number_info(spec)
        assert (bits, maxfloat, emax, emin, midmax, f32_max) == (
            spec.bits,
            spec.maxfloat,
            spec.emax,
            spec.emin,
            spec.midmax,
            spec.float32_max,
        ), str(spec)


def test_one_element_and_large_tensor_threads_agree() -> None:
    x = _data((300, 257), "special", seed=4)
    dt = datatype("mxfp6e2")
    one = native.quantize(x, dt, nthreads=1, round_mode=RoundMode.STOCHASTIC, seed=1)
    many = native.quantize(x, dt, nthreads=4, round_mode=RoundMode.STOCHASTIC, seed=1)
    _assert_same(one, many, FIELDS, "threads")
    tiny = np.array([3.0], np.float32)
    ref, nat = _both(tiny, dt, axis=0)
    _assert_same(ref, nat, FIELDS, "one element")


def test_bad_arguments_raise_value_error_with_the_shape() -> None:
    with pytest.raises(ValueError, match=r"out of range"):
        native.quantize(np.ones((2, 3), np.float32), datatype("mxfp4"), axis=5)


@pytest.mark.parametrize("out", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("src", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("name", NAMES)
def test_native_half_data_along_the_last_axis(name: str, src: type, out: type) -> None:
    # float16 / bfloat16 tiled along the last axis go through the float32 fast paths (converted
    # exactly first, values rounded afterwards); the bits must stay the reference's.
    dt = datatype(name)
    for kind, seed in (("special", 1), ("random", 2), ("subnormal", 3)):
        x = _data((6, 96), kind, seed=seed).astype(src)
        modes = [RoundMode.EVEN]
        if not name.startswith("cb"):  # codebooks have no stochastic rounding
            modes.append(RoundMode.STOCHASTIC)
        for rm in modes:
            ref, nat = _both(x, dt, out=out, axis=1, round_mode=rm, seed=4)
            _assert_same(ref, nat, FIELDS, f"{name} {kind} {src.__name__}->{out.__name__} {rm}")


@pytest.mark.parametrize("name", ["mxfp8e4", "mx6", "nvfp4", "cb41fi_e2m2fnuz_e8m0_t32"])
def test_native_every_float16_input_and_rounding_to_float16(name: str) -> None:
    # Every float16 bit pattern as input (NaNs, Infs, subnormals, both zeros), and float32
    # results across float16's subnormal and overflow range rounded to float16 (ties included).
    dt = datatype(name)
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).reshape(512, 128)
    ref, nat = _both(every, dt, out=np.float16, axis=1)
    _assert_same(ref, nat, FIELDS, f"{name} every float16")
    rng = np.random.default_rng(8)
    wide = rng.standard_normal((64, 128)) * np.exp2(rng.integers(-40, 20, (64, 128)))
    ref, nat = _both(wide.astype(np.float32), dt, out=np.float16, axis=1)
    _assert_same(ref, nat, FIELDS, f"{name} float32 -> float16 values")


@pytest.mark.parametrize("out", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("src", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("name", NAMES)
def test_native_half_data_along_channels(name: str, src: type, out: type) -> None:
    # float16 / bfloat16 NCHW activations tiled along their channels go through the float32
    # channel kernels (converted exactly first, values rounded afterwards): the reference's
    # bits, with and without codes, for whole and partial tiles and positions that fill no
    # whole vector.
    dt = datatype(name)
    for shape in ((2, 64, 3, 5), (1, 40, 2, 2)):
        for kind, seed in (("special", 1), ("random", 2), ("subnormal", 3)):
            x = _data(shape, kind, seed=seed).astype(src)
            modes = [RoundMode.EVEN]
            if not name.startswith("cb"):
                modes.append(RoundMode.STOCHASTIC)
            for rm in modes:
                what = f"{name} {shape} {kind} {src.__name__}->{out.__name__} {rm}"
                ref, nat = _both(x, dt, out=out, axis=1, round_mode=rm, seed=4)
                _assert_same(ref, nat, FIELDS, what)
                values = native.quantize(
                    x, dt, axis=1, round_mode=rm, seed=4, want_codes=False, values_dtype=out
                ).values
                assert np.array_equal(_bits(values), _bits(ref.values)), what + " values only"


@pytest.mark.parametrize("simd", ["", "base"])
@pytest.mark.parametrize("name", ["mxfp8e4", "mxfp4", "nvfp4"])
def test_native_every_half_through_channels(
    name: str, simd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every float16 and every bfloat16 bit pattern (NaN payloads, Infs, subnormals, both zeros)
    # as the input of a channel-tiled cast, and float32 results across both types' subnormal,
    # overflow and tie cases rounded back: the vector conversions (AVX2 + F16C) and the scalar
    # ones (ONNXQ_SIMD=base) give the reference's bits.
    if simd:
        monkeypatch.setenv("ONNXQ_SIMD", simd)
    dt = datatype(name)
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    for src in (np.float16, ml_dtypes.bfloat16):
        x = every.view(src).reshape(1, 128, 512)
        ref, nat = _both(x, dt, out=src, axis=1)
        _assert_same(ref, nat, FIELDS, f"{name} every {src.__name__}")
    rng = np.random.default_rng(8)
    wide = rng.standard_normal((2, 64, 9, 7)) * np.exp2(rng.integers(-140, 130, (2, 64, 9, 7)))
    for out in (np.float16, ml_dtypes.bfloat16):
        ref, nat = _both(wide.astype(np.float32), dt, out=out, axis=1)
        _assert_same(ref, nat, FIELDS, f"{name} float32 -> {out.__name__} values")


@pytest.mark.parametrize("src", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize(
    "name",
    [
        "mxfp8e4",
        "mxfp4",
        "mxint8",
        "mx6",
        "bfp16",
        "e4m3fnuz_float16_t0",
        "cb41fi_e2m2fnuz_e8m0_t32",
        "e2m1fnuz_e8m0_t16n2m4",
    ],
)
def test_native_half_values_in_work_items(name: str, src: type) -> None:
    # Values-only casts of half data run in work items of about 2^14 elements cut at tile
    # boundaries: several row items; channel items of several tile groups with every
    # position; single groups at runs of positions (with a partial last group and a partial
    # last run); a tile that spans the whole axis. Every cut gives the reference's bits.
    dt = datatype(name)
    for shape, axis in (
        ((400, 96), 1),
        ((2, 96, 10, 20), 1),
        ((1, 40, 600), 1),
        ((3, 200, 90), 1),
        ((2, 2, 48, 300), 2),
    ):
        x = _data(shape, "special", seed=5).astype(src)
        with np.errstate(all="ignore"):
            want = reference.quantize(x.astype(np.float32), dt, axis=axis, finite_dtype=x.dtype)
        got = native.quantize(x, dt, axis=axis, want_codes=False, values_dtype=src).values
        assert np.array_equal(_bits(got), _bits(want.values.astype(src))), (name, shape, axis)
