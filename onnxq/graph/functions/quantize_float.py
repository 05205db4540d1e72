"""QuantizeMX steps for float tile scales (NVFP4, tensor and channel scales) in tiled layout.

The reference (`onnxq.cast.reference._float_scaled`) computes, per tile, in float32:
``raw = amax / maxfloat(element)``; with a tensor scale ``ts = max(amax over the whole
tensor) / (maxfloat(element) * maxfloat(scale))`` and ``raw = raw / ts``; the scale ``sc`` is
``raw`` rounded to the scale format (round-half-even, saturating); ``eff = sc * ts``; each
element ``x / eff`` rounds to the nearest element value, clamped so that ``float32(q * eff)``
stays finite in X's type. Every one of those float32 operations is one IEEE operation here
(``Div``, ``Mul``), the roundings are nearest-value searches on the value tables, and the
tensor scale is a reduction over the whole run-time tensor. Scale codes of float32 scales
are the float's bits, computed exactly from its exponent (found by search) and mantissa.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from onnxq.cast.elements import nan_code
from onnxq.formats.datatype import DataType
from onnxq.formats.modes import NanPolicy, RoundMode
from onnxq.formats.number import Kind, NumberSpec
from onnxq.graph.functions.body import _Body
from onnxq.graph.functions.dynamic import Layout
from onnxq.graph.functions.quantize import (
    _count_below,
    _magnitudes,
    _max_finite_like,
    _nearest,
    _signed_codes,
)
from onnxq.graph.functions.values import _F32_MAX_EXP, _F32_MIN_EXP, _pow2_f32

_OVERFLOW_F16 = np.float32(65520.0)  # float16 rounds a float32 at least this to Inf
_OVERFLOW_BF16 = np.float32(2.0**128 - 2.0**119)  # bfloat16's rounding threshold
_MAX_BF16 = np.float32(2.0**128 - 2.0**120)


def _is_f32(spec: NumberSpec) -> bool:
    return spec.kind is Kind.FLOAT and spec.bits == 32 and spec.mbits == 23


def float_scale_support(dt: DataType, round_mode: RoundMode) -> None:
    """Refuse the float-scaled formats these steps cannot reproduce.

    Only formats with a tensor scale (NVFP4) get a body: a float scale per tensor or channel
    stays without one, so that such activations are calibrated into a static QuantizeLinear
    pair (`onnxq.graph.calibrate`) as before. The steps below reproduce those formats too.

    Raises:
        NotImplementedError: naming the format and what is missing.
    """
    s, name = dt.sspec, dt.name
    assert s is not None and not s.scale.is_exponent
    if s.zero is not None:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: zero points")
    if s.tenscale is None:  # a policy, not a limit: calibration gives these a static pair
        raise NotImplementedError(
            f"QuantizeMX fallback for {name}: float scales without a tensor scale (NVFP4-style "
            "formats only; calibrate tensor-scaled activations for a static QuantizeLinear pair)"
        )
    if s.sparsity[1]:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: N:M sparsity")
    if round_mode is RoundMode.STOCHASTIC:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: stochastic rounding")
    if not (_is_f32(s.scale) or (s.scale.is_float and s.scale.bits <= 8)):
        raise NotImplementedError(
            f"QuantizeMX fallback for {name}: {s.scale} scales (float32 or float of at most "
            "8 bits only)"
        )
    if s.tenscale is not None and not _is_f32(s.tenscale):
        raise NotImplementedError(f"QuantizeMX fallback for {name}: {s.tenscale} tensor scales")
    if dt.nspec.bits > 8:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: codes over 8 bits")
    if dt.nspec.is_float and dt.nspec.emin - dt.nspec.mbits - 1 <= -126:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: elements finer than float32")


@dataclass(frozen=True)
class FloatTiled:
    """Codes and scales of a float-scaled quantization in tiled layout."""

    codes: str  # int64 elements [pre, nC, U, S, post]
    scale_code: str  # int64 per tile, NaN code for NaN tiles
    eff: str  # float32 per tile: the decoder's sc * ts
    nan_tile: str | None  # bool per tile, or None when no tile can be a NaN tile
    tenscale: str | None  # float32 [1]


def float32_bits(body: _Body, v: str) -> str:
    """int64 bit pattern of non-negative finite float32 ``v`` (exact: search and scaling)."""
    powers = np.array([_pow2_f32(k) for k in range(_F32_MIN_EXP, _F32_MAX_EXP + 1)])
    count = _count_below(body, v, powers, strict=False)  # floor(log2 v) + 150 for v > 0
    e = body.op("Max", body.op("Sub", count, body.const(150, np.int64)), body.const(-126, np.int64))
    index = body.op("Add", e, body.const(126, np.int64))  # e in [-126, 127]
    ks = range(-126, _F32_MAX_EXP + 1)
    first = np.array([_pow2_f32(-min(k, 126)) for k in ks], dtype=np.float32)
    second = np.array([_pow2_f32(-(k - min(k, 126))) for k in ks], dtype=np.float32)
    m = body.op("Mul", body.op("Mul", v, body.gather(first, index)), body.gather(second, index))
    mant = body.cast(body.op("Mul", m, body.const(_pow2_f32(23))), TensorProto.INT64)
    return body.op("Add", body.op("Mul", index, body.const(1 << 23, np.int64)), mant)


def _overflow_of_x(body: _Body) -> str:
    """float32 scalar: the least float32 that rounds to Inf in X's type (Inf for float32)."""
    top = _max_finite_like(body, "X")
    inf = body.const(np.float32(np.inf))
    bf16 = body.where(body.op("Equal", top, body.const(_MAX_BF16)), body.const(_OVERFLOW_BF16), inf)
    return body.where(
        body.op("Equal", top, body.const(np.float32(65504.0))), body.const(_OVERFLOW_F16), bf16
    )


def _round_scale(body: _Body, raw: str, spec: NumberSpec, name: str) -> tuple[str, str]:
    """(value, code) of non-negative ``raw`` rounded to scale format ``spec`` (even, saturating)."""
    if _is_f32(spec):
        return raw, float32_bits(body, raw)
    mags = _magnitudes(spec, False, f"{name} scale")
    code = _nearest(body, raw, mags, RoundMode.EVEN)
    return body.gather(mags, code), code


def float_tiles(
    body: _Body, dt: DataType, lay: Layout, round_mode: RoundMode, policy: NanPolicy, full: bool
) -> FloatTiled:
    """The reference's float-scaled quantization of X, in tiled layout."""
    n, s = dt.nspec, dt.sspec
    assert s is not None
    xt = lay.to_tiles(body.cast("X", TensorProto.FLOAT))
    isnan = body.op("IsNaN", xt)
    nonfinite = body.op("Or", isnan, body.op("IsInf", xt))
    zero = body.const(np.float32(0.0))
    absx = body.where(nonfinite, zero, body.op("Abs", xt))
    amax = lay.tile_max(absx)
    raw = body.op("Div", amax, body.const(np.float32(n.maxfloat)))
    ts = None
    if s.tenscale is not None:  # a reduction over the whole tensor at run time
        top = body.op("ReduceMax", amax, keepdims=0)
        denom = np.float32(n.maxfloat) * np.float32(s.scale.maxfloat)
        ts = body.reshape(body.op("Div", top, body.const(denom)), [1])
        positive = body.op("Greater", ts, zero)
        raw = body.where(positive, body.op("Div", raw, ts), zero)
    sc, scale_code = _round_scale(body, raw, s.scale, dt.name)
    eff = sc if ts is None else body.op("Mul", sc, ts)
    # x / eff; a zero eff sends every non-NaN element to +0 (fixed on the codes below). No
    # Where picks a float here: onnxruntime's Where drops the sign of a -0 it selects.
    zero_eff = body.op("Equal", eff, zero)
    v = body.op("Div", xt, body.where(zero_eff, body.const(np.float32(np.inf)), eff))
    mags = _magnitudes(n, full, dt.name)
    idx = _nearest(body, v, mags, round_mode)
    # The clamp: the largest table magnitude whose decoded float32(m * eff) is finite in X's
    # type (the products ascend with m, so the count of finite ones is the bound's index + 1).
    products = body.op("Mul", body.op("Unsqueeze", eff, body.ints([-1])), body.const(mags))
    finite = body.cast(body.op("Less", products, _overflow_of_x(body)), TensorProto.INT64)
    count = body.op("ReduceSum", finite, body.ints([-1]), keepdims=0)
    cap = body.op("Sub", count, body.const(1, np.int64))
    codes = _signed_codes(body, n, v, body.op("Min", idx, cap), full)
    zeroed = body.op("And", zero_eff, body.op("Not", isnan))
    codes = body.where(zeroed, body.const(0, np.int64), codes)
    nan_tile = None
    if policy is NanPolicy.BLOCK or not n.is_float:
        bad = isnan if policy is NanPolicy.ELEMENT else nonfinite
        flagged = lay.tile_max(body.cast(bad, TensorProto.FLOAT))
        nan_tile = body.op("Greater", flagged, zero)
        scale_code = body.where(nan_tile, body.const(nan_code(s.scale), np.int64), scale_code)
        codes = body.where(nan_tile, body.const(0, np.int64), codes)
    tenscale = None if ts is None else ts
    return FloatTiled(codes, scale_code, eff, nan_tile, tenscale)
