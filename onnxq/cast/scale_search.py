"""Scale mode ``search``: the pieces the reference's per-tile scale search is made of (numpy).

A stored weight's scale is chosen by the quantizer, not by hardware, so it may be the one that
decodes closest to the input. Each tile tries a few candidate scales, quantizes and decodes
itself with each, and keeps the candidate with the least squared error (docs/formats.md,
"Scale modes"):

- exponent (E8M0) scales: the ``floor`` exponent, one above it, one below it (clamped to the
  scale's range);
- float scales (NVFP4's E4M3, channel and tile float scales): the scale the ordinary rule
  gives (``absmax / maxfloat`` rounded to the scale type), the next scale code above it and the
  next below it.

`STEPS` lists the candidates in tie-break order: a later candidate wins only with a strictly
smaller error, so ties keep the ordinary rule's scale. The error of a tile is the sum over its
finite input elements of ``(float64(y) - float64(x))^2``, y the decoded float32 value, added in
float64 one tile position at a time from the first (`tile_sq_error`): the native kernels add
in the same order, so near-ties resolve the same on every backend.
"""

from __future__ import annotations

import numpy as np

from onnxq.cast.elements import floor_log2, pow2
from onnxq.formats.number import NumberSpec

__all__ = ["STEPS", "float_step", "select", "tile_sq_error"]

# Candidates relative to the ordinary rule's scale, in tie-break order (docs/formats.md).
STEPS = (0, 1, -1)


def tile_sq_error(y: np.ndarray, xt: np.ndarray) -> np.ndarray:
    """Squared error of every tile (``(..., tile_elems)`` -> ``(...)``), float64.

    Non-finite inputs count zero (their scale-independent outcome: NaN stays NaN, Inf
    saturates). Added position by position, vectorized across tiles, never with `np.sum`,
    whose pairwise order the native kernels could not follow.
    """
    x64 = xt.astype(np.float64)
    y64 = np.asarray(y).astype(np.float32).astype(np.float64)
    with np.errstate(invalid="ignore"):
        d = np.where(np.isfinite(x64), y64 - x64, 0.0)
    sq = d * d
    err = np.zeros(sq.shape[:-1], dtype=np.float64)
    for i in range(sq.shape[-1]):
        err += sq[..., i]
    return err


def float_step(sc: np.ndarray, spec: NumberSpec, step: int) -> np.ndarray:
    """The float scale one step above (+1) or below (-1) ``sc``, among the values a scale can be.

    Those are ``spec``'s values that float32 holds (up to `NumberSpec.float32_max`); ``sc``
    holds some of them. Where ``spec``'s grid is no finer than float32's (every format up to
    16 bits but a few with large biases) the step is one code; where it is finer (over 23
    mantissa bits, or below 2^-126), it is the next float32 number, which is on the grid. Up
    from `float32_max` stays there; down from the smallest positive value gives 0 (a zero
    scale: the tile decodes to zeros, a candidate that never wins a tile with a nonzero value).
    """
    if step == 0:
        return sc
    s64 = sc.astype(np.float64)
    e = np.maximum(floor_log2(np.where(s64 > 0, s64, 1.0)), spec.emin)
    ulp = pow2(e - spec.mbits)
    f32 = sc.astype(np.float32)
    if step > 0:
        grid = np.where(s64 > 0, s64 + ulp, pow2(spec.emin - spec.mbits))
        near = np.nextafter(f32, np.float32(np.inf)).astype(np.float64)
        out = np.minimum(np.maximum(grid, near), spec.float32_max)
    else:
        # Below a power of two (not the smallest normal) the grid step is half as big.
        at_pow2 = (s64 == pow2(e)) & (e > spec.emin)
        grid = np.where(s64 > 0, s64 - np.where(at_pow2, ulp * 0.5, ulp), 0.0)
        out = np.minimum(grid, np.nextafter(f32, np.float32(0)).astype(np.float64))
    return out.astype(np.float32)


def select(better: np.ndarray, new: np.ndarray | None, old: np.ndarray | None) -> np.ndarray | None:
    """``new`` where a tile's ``better`` holds, else ``old`` (per tile or per element/unit)."""
    if new is None or old is None:
        return old
    b = better.reshape(better.shape + (1,) * (np.ndim(new) - better.ndim))
    return np.where(b, new, old)
