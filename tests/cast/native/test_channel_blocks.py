"""The channel kernels' lean blocks and overlapping last vector, native against the reference.

ops/src/fast_channels.inc casts values-only tiles with exponent scales and no subtiles in
blocks of 4 vectors (64 inner positions with AVX-512, 32 with 8 lanes) read channel row by
channel row, takes the inner positions left after the blocks one vector at a time, and the
last few (fewer than a vector) as one vector that overlaps the positions before it; the driver
(fast_channels.cc) gives the last work item of each outer index the remainder of P. The shapes
here sit on and next to those boundaries, include a row stride (112 * 112 floats) whose channel
rows share few cache sets, and work items whose remainder is shorter than a vector.
"""

from __future__ import annotations

import numpy as np
import pytest

from onnxq.cast import native
from onnxq.formats.datatype import datatype
from tests.cast.edge_data import edge_data
from tests.cast.native.test_nchw_tiles import _check, _tiled

pytestmark = pytest.mark.needs_native

# The lean path's element kinds (float with and without -0, int, the full int range with
# two tops) and, beside them, the paths it leaves alone (subtiles, float scales).
FORMATS = ["mxfp8", "mxfp8e5", "mxfp6", "mxfp4", "e2m1fnuz_e8m0_t32", "mxint8", "bfp16", "mx6"]
SIMD = ["base", "avx2", "avx512"]
# Inner sizes around one vector (8, 16), one block (32, 64) and two blocks (128), C on and off
# the tile of 32, two outer indices.
BOUNDARY_SHAPES = [
    (2, 33, 7),
    (1, 32, 15),
    (2, 32, 17),
    (1, 40, 31),
    (2, 32, 33),
    (1, 32, 63),
    (2, 33, 64),
    (1, 32, 65),
    (1, 64, 127),
    (2, 32, 129),
]


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("kind", ["tiled", "random", "special", "subnormal", "zeros", "huge"])
def test_block_boundaries_equal_reference(
    name: str, kind: str, simd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i, shape in enumerate(BOUNDARY_SHAPES):
        x = _tiled(shape, 1, 40 + i) if kind == "tiled" else edge_data(shape, kind, 40 + i)
        _check(x, name, 1, simd, monkeypatch)
        if name == "mxint8":
            _check(x, name, 1, simd, monkeypatch, full_int_range=True)


def _one_lane_off(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Normal data with, in a few tiles, one NaN, Inf, huge or all-zero lane inside a block."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    c, p = shape[1], shape[2]
    for v, at in ((np.nan, 3), (np.inf, 17), (2.0**120, 40), (-(2.0**-140), 70)):
        if at < p:
            x[0, rng.integers(0, c), at] = v
    if p > 100:
        x[0, :, 100] = 0.0
        x[0, ::2, 100] = -0.0
    return x


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("name", ["mxfp8", "mxfp4", "mxint8", "bfp16"])
def test_a_block_with_one_lane_off_the_lean_path(
    name: str, simd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One lane's tile in a block needs the full path (NaN, Inf, a binade the lean magic add
    # cannot raise) or is all zero: the block's other lanes must not change.
    for shape in ((1, 32, 128), (2, 45, 150)):
        _check(_one_lane_off(shape, 7), name, 1, simd, monkeypatch)


@pytest.mark.parametrize("name", ["mxfp8", "mxint8"])
def test_aliasing_stride_and_work_items(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # 112 * 112 floats between channel rows (their cache lines share 4 sets in 64); C = 96
    # cuts P into work items of 320 positions with a last one of 384; C = 512 into items of
    # 64 with a remainder of 5 (P = 197), shorter than a vector. Several threads, same bits.
    dt = datatype(name)
    for shape in ((1, 96, 112, 112), (2, 512, 197)):
        x = _tiled(shape, 1, 11)
        _check(x, name, 1, "avx512", monkeypatch)
        one = native.quantize(x, dt, axis=1, want_codes=False, nthreads=1).values
        many = native.quantize(x, dt, axis=1, want_codes=False, nthreads=4).values
        assert np.array_equal(one.view(np.uint32), many.view(np.uint32)), shape
