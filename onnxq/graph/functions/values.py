"""Exact float32 values in the function fallbacks: element and scale codes decoded bit for bit.

Codes decode by a ``Gather`` on a table of every value, or from their sign, exponent and
mantissa fields with a power-of-two table; scale factors are exact float32 powers of two.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from onnxq.formats.number import InfNaN, Kind, NumberSpec
from onnxq.graph.functions.body import _Body

_F32_MIN_EXP = -149  # 2^-149: the smallest float32 subnormal
_F32_MAX_EXP = 127


def _pow2_f32(k: int) -> np.float32:
    if not _F32_MIN_EXP <= k <= _F32_MAX_EXP:
        raise ValueError(k)
    return np.float32(math.ldexp(1.0, k))


def _value_table(spec: NumberSpec) -> np.ndarray:
    """float32 values of every code of ``spec`` (<= 8 bits; NaN codes read as quiet NaN)."""
    values = np.array([spec.decode(c) for c in range(1 << spec.bits)], dtype=np.float64)
    table = values.astype(np.float32)
    finite = np.isfinite(values)
    if not np.array_equal(table[finite].astype(np.float64), values[finite]):
        raise NotImplementedError(f"{spec}: values not exact in float32")
    return table


def _decode(body: _Body, codes: str, spec: NumberSpec, what: str) -> str:
    """Exact float32 values of int64 ``codes`` of ``spec`` (same shape)."""
    if spec.bits <= 8:
        return body.gather(_value_table(spec), codes)
    if spec.kind in (Kind.INT, Kind.UINT) and spec.bits <= 24:
        if spec.kind is Kind.INT:
            negative = body.op("GreaterOrEqual", codes, body.const(1 << (spec.bits - 1), np.int64))
            wrapped = body.op("Sub", codes, body.const(1 << spec.bits, np.int64))
            codes = body.where(negative, wrapped, codes)
        return body.cast(codes, TensorProto.FLOAT)
    if spec.kind is Kind.FLOAT and spec.bits <= 32 and spec.mbits <= 23:
        return _decode_float_fields(body, codes, spec, what)
    raise NotImplementedError(f"{what} {spec}: decoding {spec.bits}-bit codes in a function body")


def _decode_float_fields(body: _Body, codes: str, spec: NumberSpec, what: str) -> str:
    """Sign, exponent field and mantissa -> float32, exactly (values must fit float32).

    Value = (mantissa + implicit bit) * 2^-mbits * 2^(max(field, 1) - bias): the first product
    is exact (mbits + 1 <= 24 bits), the second is exact because the value is a float32.
    """
    emask, mmask = (1 << spec.ebits) - 1, (1 << spec.mbits) - 1
    exponents = [max(f, 1) - spec.bias for f in range(emask)]
    if min(exponents) - spec.mbits < _F32_MIN_EXP or max(exponents) > _F32_MAX_EXP:
        raise NotImplementedError(f"{what} {spec}: values outside float32")
    powers = np.array([_pow2_f32(k) for k in exponents] + [np.float32(1.0)], dtype=np.float32)
    field = body.op("Div", codes, body.const(1 << spec.mbits, np.int64))
    field = body.op("BitwiseAnd", field, body.const(emask, np.int64))
    mant = body.op("BitwiseAnd", codes, body.const(mmask, np.int64))
    negative = body.op("GreaterOrEqual", codes, body.const(1 << (spec.bits - 1), np.int64))
    normal = body.cast(body.op("Greater", field, body.const(0, np.int64)), TensorProto.INT64)
    implicit = body.op("Mul", normal, body.const(1 << spec.mbits, np.int64))
    sig = body.cast(body.op("Add", mant, implicit), TensorProto.FLOAT)
    sig = body.op("Mul", sig, body.const(_pow2_f32(-spec.mbits)))
    mag = body.op("Mul", sig, body.gather(powers, field))
    special = _float_specials(body, codes, field, mant, spec)
    signed = body.where(negative, body.op("Neg", mag), mag)
    return body.where(special[0], special[1], signed) if special else signed


def _float_specials(
    body: _Body, codes: str, field: str, mant: str, spec: NumberSpec
) -> tuple[str, str] | None:
    """(is_special, value) for the Inf/NaN codes of ``spec`` (None when it has none)."""
    emask, mmask = (1 << spec.ebits) - 1, (1 << spec.mbits) - 1
    sign_bit = 1 << (spec.bits - 1)
    nan = body.const(np.float32(np.nan))
    negative = body.op("GreaterOrEqual", codes, body.const(sign_bit, np.int64))
    inf = body.where(negative, body.const(np.float32(-np.inf)), body.const(np.float32(np.inf)))
    top = body.op("Equal", field, body.const(emask, np.int64))
    zero_mant = body.op("Equal", mant, body.const(0, np.int64))
    match spec.infnan:
        case InfNaN.IEEE:
            neg_nan = body.op("Neg", nan)
            nan_val = body.where(negative, neg_nan, nan)
            return top, body.where(zero_mant, inf, nan_val)
        case InfNaN.FN:
            full = body.op("Equal", mant, body.const(mmask, np.int64))
            return body.op("And", top, full), nan
        case InfNaN.FNUZ:
            return body.op("Equal", codes, body.const(sign_bit, np.int64)), nan
        case InfNaN.INUZ:
            is_nan = body.op("Equal", codes, body.const(sign_bit, np.int64))
            mag = body.op("BitwiseAnd", codes, body.const(sign_bit - 1, np.int64))
            is_inf = body.op("Equal", mag, body.const(sign_bit - 1, np.int64))
            return body.op("Or", is_nan, is_inf), body.where(is_nan, nan, inf)
    return None


def _exponent_table(scale: NumberSpec, offset: int, shifts: int, what: str) -> np.ndarray:
    """Entry ``code * shifts + s`` = 2^(code - bias - offset - s); the top code is NaN."""
    top = (1 << scale.ebits) - 1
    entries = []
    for code in range(top + 1):
        for s in range(shifts):
            if code == top:
                entries.append(np.float32(np.nan))
                continue
            k = code - scale.bias - offset - s
            if not _F32_MIN_EXP <= k <= _F32_MAX_EXP:
                raise NotImplementedError(
                    f"{what}: scale factor 2^{k} is not a float32 value, so one multiplication "
                    f"cannot reproduce the reference rounding"
                )
            entries.append(_pow2_f32(k))
    return np.array(entries, dtype=np.float32)
