"""The native fast paths (float32 tiles along the last axis, bit arithmetic, SIMD) equal the
reference bit for bit.

The fast paths serve virtual casts (values only) of float32 tensors tiled along the last axis
with an exponent scale (MXFP*, MXINT8, BFP, MX6/MX9) or a float scale (NVFP4) and a
deterministic round mode. `ONNXQ_SIMD` picks the instruction set (none = the general path,
base = plain x86-64, avx2, avx512) so every variant is checked on a machine that has them.
"""

from __future__ import annotations

import numpy as np
import pytest

from onnxq.cast import native, reference
from onnxq.formats.datatype import datatype
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode
from tests.cast.edge_data import edge_data

pytestmark = pytest.mark.needs_native

FAST = [
    "bfp16", "bfp8", "int8_e8m0_t8", "mx4", "mx6", "mx9", "mxfp4", "mxfp4e2", "mxfp6",
    "mxfp6e2", "mxfp6e3", "mxfp8", "mxfp8e4", "mxfp8e5", "mxint4", "mxint8", "nvfp4",
    "e3m2_e8m0_t32", "e5m2_e8m0_t32", "int8_e8m0_t8s2", "int16_e8m0_t16", "int24_e8m0_t8",
    "e4m3fn_e8m0_t64", "int8_e8m0_t64s4", "e2m1fnuz_e4m3fn_t16", "int4_e4m3fn_t16",
    "e4m3fn_e5m2_t8", "int8_e8m0", "e4m3fn_e8m0_t2", "e5m2_e8m0_t2048",
    # ints over 24 bits: float32(q) rounds, so these take the general path (q * 2^k rounded
    # once); the fast path's float arithmetic rounded twice
    "int25_e8m0_t32", "int32_e8m0_t8", "int28_float16_t16",
]  # fmt: skip
SIMD = ["base", "avx2", "avx512"]
# (2, 1100): rows of many tiles, which the vector kernels take 8 or 16 tiles at a time.
SHAPES = [(6, 35), (3, 100), (2, 3, 33), (1,), (5, 8), (4, 1), (2, 130), (2, 1100)]


def _check(x: np.ndarray, name: str, simd: str, monkeypatch: pytest.MonkeyPatch, **kw) -> None:
    dt = datatype(name)
    with np.errstate(all="ignore"):
        want = reference.quantize(x, dt, **kw).values.astype(np.float32)
    monkeypatch.setenv("ONNXQ_SIMD", simd)
    got = native.quantize(x, dt, want_codes=False, **kw).values
    w, g = want.view(np.uint32), got.view(np.uint32)
    if not np.array_equal(w, g):
        i = np.flatnonzero(w.reshape(-1) != g.reshape(-1))[:5]
        xs = x.reshape(-1)[i]
        pytest.fail(
            f"{name} {simd} {kw}: {int((w != g).sum())} differ, e.g. x={xs.tolist()} "
            f"want={want.reshape(-1)[i].tolist()} got={got.reshape(-1)[i].tolist()}"
        )


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("name", FAST)
@pytest.mark.parametrize(
    "kind", ["random", "ties", "pow2", "subnormal", "special", "huge", "zeros"]
)
def test_fast_virtual_equals_reference(
    name: str, kind: str, simd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i, shape in enumerate(SHAPES):
        x = edge_data(shape, kind, seed=100 + i)
        for rm in (RoundMode.EVEN, RoundMode.AWAY, RoundMode.ZERO):
            for policy in NanPolicy:
                _check(x, name, simd, monkeypatch, axis=-1, round_mode=rm, nan_policy=policy)


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("name", ["mxfp8e4", "mxfp4", "mxint8", "mx6", "mx9", "nvfp4", "bfp16"])
@pytest.mark.parametrize("sm", list(ScaleMode))
def test_fast_scale_modes_and_full_int_range(
    name: str, sm: ScaleMode, simd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for kind in ("random", "ties", "pow2", "special"):
        x = edge_data((7, 67), kind, seed=7)
        for full in (False, True):
            for rm in (RoundMode.EVEN, RoundMode.AWAY, RoundMode.ZERO):
                _check(
                    x,
                    name,
                    simd,
                    monkeypatch,
                    axis=-1,
                    scale_mode=sm,
                    round_mode=rm,
                    full_int_range=full,
                )


@pytest.mark.parametrize("simd", SIMD)
def test_fast_large_tensor_threads(simd: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x = edge_data((257, 1000), "special", seed=3)
    for name in ("mxfp8e4", "mx6", "nvfp4", "bfp16"):
        _check(x, name, simd, monkeypatch, axis=-1)
        dt = datatype(name)
        monkeypatch.setenv("ONNXQ_SIMD", simd)
        one = native.quantize(x, dt, want_codes=False, nthreads=1).values
        many = native.quantize(x, dt, want_codes=False, nthreads=3).values
        assert np.array_equal(one.view(np.uint32), many.view(np.uint32))


def test_every_element_of_a_binade_rounds_like_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """All float32 values in [1, 4) (two binades, 2^24 values) in tiles whose scale is fixed."""
    mant = np.arange(1 << 23, dtype=np.uint32)
    x = np.concatenate(
        [(mant | (127 << 23)).view(np.float32), (mant | (128 << 23)).view(np.float32)]
    )
    x = x[: x.size // 31 * 31].reshape(-1, 31)
    x = np.concatenate([x, np.full((x.shape[0], 1), 4.0, np.float32)], axis=1)  # amax 4
    x[::2] *= -1
    for name in ("mxfp4", "mxfp6e2", "mxfp8e4", "mxint8"):
        for rm in (RoundMode.EVEN, RoundMode.AWAY, RoundMode.ZERO):
            _check(x, name, "", monkeypatch, axis=-1, round_mode=rm)


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("name", ["mxfp8e4", "mxfp8e5", "mxfp6e2", "mxfp6e3", "mxfp4", "mxint8"])
def test_fast_scale_mode_thresholds(name: str, simd: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiles whose absmax mantissa lies on, just below and just above every point where a
    scale mode moves the exponent up (the fast path reads these from amax's mantissa bits).

    Every threshold of these element formats is a multiple of 2^17 in the float32 mantissa:
    ceil at 0, option3/even at 2^23 - 2^(22 - mbits), midmax/topbinade at the mantissas of
    midmax and maxfloat (448 = 1.75 * 2^8 -> 0x600000, 464 = 1.8125 * 2^8 -> 0x680000, ...).
    """
    rng = np.random.default_rng(11)
    mant = (np.arange(64)[:, None] * (1 << 17) + np.arange(-2, 3)[None, :]).reshape(-1)
    mant = mant[(mant >= 0) & (mant < 1 << 23)].astype(np.uint32)
    rows = mant.size
    exps = rng.integers(100, 160, rows).astype(np.uint32)
    amax = ((exps << 23) | mant).view(np.float32)
    x = (rng.uniform(-1, 1, (rows, 32)) * amax[:, None]).astype(np.float32)
    x[np.arange(rows), rng.integers(0, 32, rows)] = amax * rng.choice([-1, 1], rows)
    wide = np.concatenate([x.reshape(-1), np.zeros((-x.size) % 512, np.float32)])
    for sm in ScaleMode:
        _check(x, name, simd, monkeypatch, axis=-1, scale_mode=sm)
        _check(wide.reshape(-1, 512), name, simd, monkeypatch, axis=-1, scale_mode=sm)
