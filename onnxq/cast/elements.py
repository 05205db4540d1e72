"""Element rounding, encoding and decoding in numpy: the reference for every backend.

Values are float64 arrays: a float32 input scaled by a power of two is exact in float64, so
each step below is exact except the one rounding it is meant to do.
"""

from __future__ import annotations

import functools

import numpy as np

from onnxq.formats.modes import RoundMode
from onnxq.formats.number import InfNaN, NumberSpec

__all__ = [
    "MAX_FINITE",
    "OVERFLOW",
    "PRODUCT_LIMIT",
    "decode_codes",
    "encode_values",
    "finite_bound",
    "floor_log2",
    "nan_code",
    "pow2",
    "quantize_values",
    "round_magnitude",
    "stochastic_bits",
]

_GOLDEN = np.uint32(0x9E3779B9)

# The largest finite value of each float type a cast reads and writes: the elements of a tile
# are clamped so that their decoded values stay at or below it (`finite_bound`).
MAX_FINITE = {
    "float32": float(np.finfo(np.float32).max),  # (2 - 2^-23) * 2^127
    "float16": 65504.0,  # (2 - 2^-10) * 2^15
    "bfloat16": float(2**128 - 2**120),  # (2 - 2^-7) * 2^127
}
# A float-scaled element decodes as float32(q * scale), then rounds to the data type: finite
# exactly when the exact product is below this (float32 ties round to even; the bfloat16 and
# float16 bounds are the float32 midpoints below their overflow thresholds 2^128 - 2^119, 65520).
# The magnitudes from which rounding to the type gives Inf: 2^emax * (2 - 2^-(mbits+1)), ties
# rounding to even (float32 compares its own values with it as with Inf).
OVERFLOW = {
    "float32": float(2**128 - 2**103),
    "float16": 65520.0,
    "bfloat16": float(2**128 - 2**119),
}
PRODUCT_LIMIT = {
    "float32": float(2**128 - 2**103),
    "float16": 65520.0 - 2.0**-9,
    "bfloat16": float(2**128 - 2**119 - 2**103),
}


def _mix32(x: np.ndarray) -> np.ndarray:
    """A 32-bit integer hash (Wellons' lowbias32): cheap in numpy, C and Triton alike."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def stochastic_bits(seed: int, index: np.ndarray) -> np.ndarray:
    """24 random bits per element from (seed, flat element index): architecture decision 4.

    ``h = mix32(lo32(i) ^ mix32(hi32(i) ^ mix32(lo32(seed) ^ 0x9E3779B9)))``, bits = h >> 8.
    """
    with np.errstate(over="ignore"):
        key = _mix32(np.array([seed & 0xFFFFFFFF], dtype=np.uint32) ^ _GOLDEN)[0]
        idx = index.astype(np.uint64, copy=False)
        lo = (idx & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        hi = (idx >> np.uint64(32)).astype(np.uint32)
        return _mix32(lo ^ _mix32(hi ^ key)) >> np.uint32(8)


def floor_log2(a: np.ndarray) -> np.ndarray:
    """floor(log2(a)) of positive float64 values from their exponent bits (0 -> -1023).

    Exact for normal float64 (every float32 is one); never uses a float log2
    (docs/architecture.md, decision 1).
    """
    bits = np.ascontiguousarray(a, dtype=np.float64).view(np.int64)
    return ((bits >> 52) & 0x7FF) - 1023


def pow2(k: np.ndarray | int) -> np.ndarray:
    """2.0^k as float64 for integer k in [-1022, 1023], built from the exponent bits.

    Multiplying by it is exact and much cheaper than ``np.ldexp`` with an array of exponents.
    """
    return ((np.asarray(k, dtype=np.int64) + 1023) << 52).view(np.float64)


def finite_bound(t: np.ndarray, spec: NumberSpec, top: float) -> np.ndarray:
    """The largest grid value of ``spec`` that is <= ``t`` (float64, > 0), at most ``top``.

    With t = max_finite / scale, the largest element magnitude whose decoded value stays
    finite: the saturation bound of a tile whose scale would take ``top`` past the float
    type's range (design of the clamp: docs/ops.md, "Saturation").
    """
    t = np.asarray(t, dtype=np.float64)
    if spec.is_float:
        e = np.maximum(floor_log2(t), spec.emin) - spec.mbits
        grid = np.floor(t * pow2(-e)) * pow2(e)
    else:
        grid = np.floor(t)
    return np.where(t >= top, top, grid)


def round_magnitude(t: np.ndarray, mode: RoundMode, rand: np.ndarray | None = None) -> np.ndarray:
    """Round non-negative float64 ``t`` to an integer-valued float64.

    Stochastic: up when ``rand < floor(frac * 2^24)``, with ``rand`` from `stochastic_bits`.
    """
    match mode:
        case RoundMode.EVEN:
            return np.rint(t)
        case RoundMode.AWAY:
            return np.floor(t + 0.5)
        case RoundMode.ZERO:
            return np.ceil(t - 0.5)
        case RoundMode.STOCHASTIC:
            if rand is None:
                raise ValueError("stochastic rounding needs random bits")
            low = np.floor(t)
            threshold = np.floor((t - low) * 16777216.0)
            return low + (rand < threshold)
        case _:
            raise ValueError(f"unknown round mode {mode!r}")


def quantize_values(
    v: np.ndarray,
    spec: NumberSpec,
    mode: RoundMode,
    rand: np.ndarray | None = None,
    *,
    keep_inf: bool = False,
    full_int_range: bool = False,
    limit: np.ndarray | None = None,
) -> np.ndarray:
    """Round scaled values ``v`` (float64) onto the grid of ``spec`` (architecture decision 1).

    Floats: e = max(floor(log2|v|), emin), step 2^(e - mbits); ints: step 1. The result is
    clamped to +-maxfloat (ints: +-(2^(N-1) - 1), or -2^(N-1) with ``full_int_range``).
    NaN stays NaN; Inf saturates unless ``keep_inf`` (unscaled casts to a format with Inf).
    Negative zero becomes +0 in formats without -0. ``limit`` (float64, broadcast against
    ``v``, from `finite_bound`) lowers the clamp of both signs where the scale would make the
    top values overflow the float type.
    """
    a = np.abs(v)
    if spec.is_float:
        with np.errstate(invalid="ignore", over="ignore"):
            # Non-finite a gets a harmless exponent here; it is restored by the clamp below.
            low = max(spec.emin, spec.mbits - 1022)  # keeps pow2 in range for any format
            e = np.clip(floor_log2(a), low, 1022 + spec.mbits) - spec.mbits
            q = round_magnitude(a * pow2(-e), mode, rand) * pow2(e)
    else:
        q = round_magnitude(a, mode, rand)
    top = spec.maxfloat
    with np.errstate(invalid="ignore"):
        if full_int_range and spec.is_int:
            lim = np.where(v < 0, top + 1.0, top)
        else:
            lim = top
        if limit is not None:
            lim = np.minimum(lim, limit)
        clamped = np.minimum(q, lim)
    if keep_inf and spec.has_inf:
        clamped = np.where(np.isinf(a), np.inf, clamped)
    out = np.copysign(clamped, v)
    if not spec.has_negative_zero:
        out += 0.0  # -0 + +0 = +0 under round-to-nearest; every other value is unchanged
    return out


def nan_code(spec: NumberSpec) -> int:
    """The code that decodes to NaN (positive sign where the format has a choice).

    Raises:
        ValueError: the format has no NaN code.
    """
    sign = 1 << (spec.bits - 1)
    match spec.infnan:
        case InfNaN.IEEE:
            return (((1 << spec.ebits) - 1) << spec.mbits) | (1 << max(spec.mbits - 1, 0))
        case InfNaN.FN:
            return sign - 1
        case InfNaN.FNUZ | InfNaN.INUZ:
            return sign
        case _:
            raise ValueError(f"{spec} has no NaN code")


def encode_values(q: np.ndarray, spec: NumberSpec) -> np.ndarray:
    """Codes (uint64) of values already on the grid of ``spec`` (the output of quantize)."""
    if spec.is_int:
        return q.astype(np.int64).astype(np.uint64) & np.uint64((1 << spec.bits) - 1)
    if spec.is_uint:
        return q.astype(np.uint64)
    if spec.is_exponent:
        with np.errstate(invalid="ignore"):
            codes = floor_log2(np.where(q > 0, q, 1.0)) + spec.bias
        return np.where(np.isnan(q), (1 << spec.ebits) - 1, codes).astype(np.uint64)
    if spec.bits == 32 and spec.ebits == 8 and spec.infnan is InfNaN.IEEE:
        return q.astype(np.float32).view(np.uint32).astype(np.uint64)
    a = np.abs(q)
    finite = np.isfinite(a)
    safe = np.where(finite, a, 0.0)
    e = np.maximum(floor_log2(safe), spec.emin)
    normal = safe >= spec.smallest_normal
    scaled = np.ldexp(safe, spec.mbits - e).astype(np.int64)  # exact: q is on the grid
    mant = np.where(normal, scaled - (1 << spec.mbits), scaled)
    field = np.where(normal, e + spec.bias, 0)
    codes = (field << spec.mbits) | mant
    sign = np.signbit(q) & (spec.has_negative_zero | (a != 0))
    codes = codes | (sign.astype(np.int64) << (spec.bits - 1))
    if spec.has_inf:
        top = (
            ((1 << spec.ebits) - 1) << spec.mbits
            if spec.infnan is InfNaN.IEEE
            else (1 << (spec.bits - 1)) - 1
        )
        inf_code = top | (np.signbit(q).astype(np.int64) << (spec.bits - 1))
        codes = np.where(np.isinf(q), inf_code, codes)
    if np.isnan(q).any():
        codes = np.where(np.isnan(q), nan_code(spec), codes)
    return codes.astype(np.uint64)


@functools.lru_cache(maxsize=64)
def _table(spec: NumberSpec) -> np.ndarray:
    return np.array([spec.decode(c) for c in range(1 << spec.bits)], dtype=np.float64)


def decode_codes(codes: np.ndarray, spec: NumberSpec) -> np.ndarray:
    """Values (float64) of codes of ``spec`` (a table up to 16 bits, else arithmetic)."""
    if spec.bits <= 16:
        return _table(spec)[codes.astype(np.intp)]
    if spec.bits == 32 and spec.ebits == 8 and spec.infnan is InfNaN.IEEE:
        return codes.astype(np.uint32).view(np.float32).astype(np.float64)
    if spec.is_int:
        c = codes.astype(np.int64)
        return np.where(c >> (spec.bits - 1), c - (1 << spec.bits), c).astype(np.float64)
    if spec.is_uint:
        return codes.astype(np.float64)
    if spec.is_float:
        return _decode_float_codes(codes, spec)
    raise NotImplementedError(f"decoding {spec} codes (over 16 bits) is not supported")


def _decode_float_codes(codes: np.ndarray, spec: NumberSpec) -> np.ndarray:
    """`NumberSpec.decode` on an array of float codes (formats too wide for a table)."""
    c = codes.astype(np.int64)
    sign_bit = 1 << (spec.bits - 1)
    negative = (c & sign_bit) != 0
    magnitude = c & (sign_bit - 1)
    field = magnitude >> spec.mbits
    mant = magnitude & ((1 << spec.mbits) - 1)
    subnormal = field == 0
    sig = np.where(subnormal, mant, mant + (1 << spec.mbits)).astype(np.float64)
    exp = (np.where(subnormal, 1, field) - spec.bias - spec.mbits).astype(np.int32)
    value = np.ldexp(sig, exp)
    value = np.where(negative, -value, value)
    top_field, top_mant = (1 << spec.ebits) - 1, (1 << spec.mbits) - 1
    match spec.infnan:
        case InfNaN.IEEE:
            inf = np.where(negative, -np.inf, np.inf)
            value = np.where(field == top_field, np.where(mant != 0, np.nan, inf), value)
        case InfNaN.FN:
            value = np.where((field == top_field) & (mant == top_mant), np.nan, value)
        case InfNaN.FNUZ | InfNaN.INUZ:
            if spec.infnan is InfNaN.INUZ:
                inf = np.where(negative, -np.inf, np.inf)
                value = np.where(magnitude == sign_bit - 1, inf, value)
            value = np.where(c == sign_bit, np.nan, value)
    return value
