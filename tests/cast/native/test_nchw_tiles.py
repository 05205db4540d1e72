"""Tiles along a non-last axis (NCHW activations tiled along their channels), native against the
reference bit for bit.

The channel kernels (ops/src/fast_channels.inc) take float32 tensors tiled along an axis with
inner positions after it: SIMD lanes run across the inner positions, one tile per lane. They
serve values (QuantizeDequantizeMX, the virtual cast) and codes with scales (QuantizeMX, no MX
shift bits), every element format, scale mode, round mode and NaN policy the row kernels take;
lanes they refuse fall back to the row kernels' tile function and then to the general path.
`ONNXQ_SIMD` picks the instruction set (none: the general path throughout).
"""

from __future__ import annotations

import numpy as np
import pytest

from onnxq.cast import native, reference
from onnxq.formats.datatype import datatype
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode
from tests.cast.edge_data import edge_data

pytestmark = pytest.mark.needs_native

FORMATS = [
    "mxfp8", "mxfp8e5", "mxfp6", "mxfp6e2", "mxfp4", "mxint8", "mxint4", "bfp16", "bfp8",
    "mx6", "mx9", "mx4", "nvfp4", "int8_e8m0_t8", "e4m3fn_e8m0_t64", "int8_e8m0_t64s4",
    "e5m2_e8m0_t128", "e2m1fnuz_e4m3fn_t16",
]  # fmt: skip
SIMD = ["base", "avx2", "avx512"]
# (shape, axis): C below, at and off the tile; inner 1 (a last axis after all), 7, 33, 1000;
# batches; a middle axis of a 5-D tensor.
SHAPES = [
    ((1, 96, 7, 7), 1),
    ((2, 33, 33), 1),
    ((3, 5, 16), 1),
    ((1, 40, 1000), 1),
    ((2, 64, 1, 1), 1),
    ((4, 7), 0),
    ((2, 3, 20, 4, 5), 2),
]


def _tiled(shape: tuple[int, ...], axis: int, seed: int) -> np.ndarray:
    """Normal data with a scale of its own per (tile position, 8-channel group)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, shape))
    groups = np.exp2(rng.integers(-60, 60, shape)).astype(np.float64)
    x[rng.random(shape) < 0.1] = 0.0
    return (x * groups).astype(np.float32)


def _check(x: np.ndarray, name: str, axis: int, simd: str, mp: pytest.MonkeyPatch, **kw) -> None:
    dt = datatype(name)
    with np.errstate(all="ignore"):
        want = reference.quantize(x, dt, axis=axis, **kw)
    mp.setenv("ONNXQ_SIMD", simd)
    got = native.quantize(x, dt, axis=axis, want_codes=False, **kw).values
    w, g = want.values.astype(np.float32).view(np.uint32), got.view(np.uint32)
    if not np.array_equal(w, g):
        i = np.flatnonzero(w.reshape(-1) != g.reshape(-1))[:5]
        pytest.fail(
            f"{name} {simd} axis={axis} {x.shape} {kw}: {int((w != g).sum())} differ, e.g. "
            f"x={x.reshape(-1)[i].tolist()} want={want.values.reshape(-1)[i].tolist()} "
            f"got={got.reshape(-1)[i].tolist()}"
        )
    enc = native.quantize(x, dt, axis=axis, **kw)
    assert np.array_equal(enc.codes, want.codes), f"{name} {simd} {x.shape} {kw}: codes differ"
    assert np.array_equal(enc.scale, want.scale), f"{name} {simd} {x.shape} {kw}: scales differ"


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize(
    "kind", ["tiled", "random", "ties", "pow2", "subnormal", "special", "huge", "zeros"]
)
def test_channel_tiles_equal_reference(
    name: str, kind: str, simd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i, (shape, axis) in enumerate(SHAPES):
        x = _tiled(shape, axis, 10 + i) if kind == "tiled" else edge_data(shape, kind, 10 + i)
        for rm in (RoundMode.EVEN, RoundMode.AWAY, RoundMode.ZERO):
            for policy in NanPolicy:
                _check(x, name, axis, simd, monkeypatch, round_mode=rm, nan_policy=policy)


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("name", ["mxfp8", "mxfp4", "mxint8", "mx6", "nvfp4", "bfp16"])
@pytest.mark.parametrize("sm", list(ScaleMode))
def test_channel_tiles_scale_modes(
    name: str, sm: ScaleMode, simd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for kind in ("tiled", "ties", "pow2", "special"):
        shape = (2, 37, 45)
        x = _tiled(shape, 1, 3) if kind == "tiled" else edge_data(shape, kind, 3)
        for full in (False, True):
            _check(x, name, 1, simd, monkeypatch, scale_mode=sm, full_int_range=full)


def test_channel_tiles_stochastic_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    # Stochastic rounding stays on the general path; threads split the inner runs.
    x = _tiled((2, 50, 300), 1, 5)
    _check(x, "mxfp8", 1, "avx512", monkeypatch, round_mode=RoundMode.STOCHASTIC, seed=3)
    dt = datatype("mxfp8")
    one = native.quantize(x, dt, axis=1, want_codes=False, nthreads=1).values
    many = native.quantize(x, dt, axis=1, want_codes=False, nthreads=4).values
    assert np.array_equal(one.view(np.uint32), many.view(np.uint32))


@pytest.mark.parametrize("name", ["mxfp8", "mxfp4", "mx9"])
def test_channel_tiles_large(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A run of many vectors per work item, a ragged last run and a ragged last tile.
    x = _tiled((1, 70, 61, 67), 1, 9)
    _check(x, name, 1, "avx512", monkeypatch)
    _check(x, name, 1, "base", monkeypatch)
