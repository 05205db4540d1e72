"""Fuzz: both Triton kernels equal the reference on format codes assembled at random.

The presets and hand-picked codes of the other Triton tests missed corners that random
combinations of element, scale, zero-point and tile grammar reached: float-scale formats whose
tiles are shorter than a packing group, zero float scales under a format with -0, and zero
minima of float zero points. A fixed seed draws a bounded number of codes per kernel; each
runs in float32 and bfloat16 on values with zeros of both signs, NaN, Inf and tile magnitudes
far apart, in virtual and compress mode (and, for the fast path, in every packing layout).
Generic codebooks take random values of compute types narrow and wide.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

import tests.cast.triton.support  # noqa: F401  (first: it sets up Triton's interpreter)

# isort: split
from tests.cast.triton.test_codebook import check as check_book
from tests.cast.triton.test_engine import check as check_general
from tests.cast.triton.test_fast import check as check_fast

# isort: split
from onnxq.cast import triton_fast as tf
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import datatype
from onnxq.formats.modes import RoundMode

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

ELEMENTS = ["e1m1fnuz", "e2m1fnuz", "e2m2fnuz", "e2m3fnuz", "e3m2fnuz", "e4m3fn", "e5m2", "e3m4"]
ELEMENTS += ["e2m1fn", "int2", "int3", "int4", "int5", "int7", "int8"]
SCALES = ["e8m0", "e4m3fn", "e5m2", "e4m3fn_float32", "e6m0", "e5m0"]
TILES = ["t2", "t4", "t8", "t16", "t32", "t64", "t16s2", "t8s2", "t32s4", "t4s2"]
ZERO_POINTS = ["uint4_float16_e4m3fn", "uint8_float16_e4m3fn", "uint4_float16_uint8"]
ZERO_POINTS += ["uint4_bfloat16_e5m2", "uint8_e4m3fn_uint8"]
ZERO_TILES = ["t2", "t4", "t16", "t4_t8", "t2_t2", "t0"]


def draw(codes: list[str], count: int, keep, seed: int) -> list[str]:
    """``count`` codes the data-type grammar accepts and ``keep`` keeps, in a seeded order."""
    random.Random(seed).shuffle(codes)
    out = []
    for code in codes:
        try:
            dt = datatype(code)
        except ValueError:
            continue
        if keep(dt):
            out.append(code)
        if len(out) == count:
            break
    return out


def values(shape: tuple[int, int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-20, 20, size=shape).astype(np.float32)
    x[0, :4] = [np.nan, -np.inf, -0.0, 0.0]
    x[1, : shape[1] // 2] = -0.0  # a tile of zeros of both signs
    x[1, 1 : shape[1] // 2 : 3] = 0.0
    x[2, -1] = -(2.0**-140)  # a tiny negative value: -0 where it rounds to 0
    return x


def fast_ok(dt) -> bool:
    tile = dt.sspec.tiles[0].size
    return tf.why_not_fast((3, 4 * tile), dt, 1, RoundMode.EVEN) is None


FAST_CODES = draw(
    [f"{e}_{s}_{t}" for e, s, t in itertools.product(ELEMENTS, SCALES, TILES)],
    24,
    fast_ok,
    5,
)
GENERAL_CODES = draw(
    [f"{z}_{t}" for z, t in itertools.product(ZERO_POINTS, ZERO_TILES)], 10, lambda dt: True, 6
)


@pytest.mark.parametrize("code", FAST_CODES)
def test_fast_path(code: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tile = datatype(code).sspec.tiles[0].size
    x = values((3, 4 * tile), seed=len(code))
    for dtype in ("float32", "bfloat16"):
        check_fast(x, code, dtype, modes=("virtual", "compress"))
    for layout in ("3d", "load", "16"):
        monkeypatch.setenv("ONNXQ_TRITON_PACK_GROUP", layout)
        check_fast(x, code, "float32", modes=("compress",))


@pytest.mark.parametrize("code", GENERAL_CODES)
def test_general_kernel(code: str) -> None:
    x = values((4, 32), seed=len(code))
    for dtype in ("float32", "bfloat16"):
        check_general(x, code, dtype, modes=("virtual", "actual", "compress"))


# Generic codebooks: random grid values of compute types narrow and wide (values past 2^128,
# below 2^-149, over 24 significant bits: the float64 tables), under scales down to 2^-1022.
BOOK_COMPUTES = ["e2m3", "e4m3fn", "e5m2", "e5m26", "e11m20", "e4m3b150", "e8m7b250", "e6m25fnuz"]
BOOK_SCALES = ["e8m0_t16", "e5m0b1022_t8", "e10m0_t8s4", "e8m0b200_t4_t8", "e10m0b1000_t16n2m4"]


def generic_books(count: int, seed: int) -> list[tuple[str, tuple[tuple[float, ...], ...], str]]:
    """(codebook code, mappings, scale code): sorted random positive values after 0."""
    rng = random.Random(seed)
    out = []
    for compute, scale in itertools.product(BOOK_COMPUTES, BOOK_SCALES):
        spec = datatype(compute).nspec
        index_bits, meta_bits = rng.choice([(3, 1), (4, 0), (2, 2)])
        rows = []
        for _ in range(1 << meta_bits):
            picked: set[float] = set()
            while len(picked) < (1 << (index_bits - 1)) - 1:
                v = spec.decode(rng.randrange(1, 1 << (spec.bits - 1)))
                if np.isfinite(v) and v > 0:
                    picked.add(v)
            rows.append((0.0, *sorted(picked)))
        out.append((f"cb{index_bits}{meta_bits}_{compute}_fz", tuple(rows), scale))
    rng.shuffle(out)
    return out[:count]


@pytest.mark.parametrize(("book", "mappings", "scale"), generic_books(8, 7))
def test_generic_codebooks(book: str, mappings: tuple[tuple[float, ...], ...], scale: str) -> None:
    dt = datatype(Codebook.parse(book).add_mappings(list(mappings)), scale)
    x = values((8, 32), seed=len(book) + len(scale))
    for dtype in ("float32", "bfloat16"):
        check_book(x, dt, dtype, modes=("virtual", "actual", "compress"))
