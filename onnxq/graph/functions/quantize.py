"""The QuantizeMX fallback: exponent scales found by search, elements rounded by table."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto

from onnxq.cast.elements import nan_code
from onnxq.cast.layout import Tiling
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode
from onnxq.formats.number import NumberSpec
from onnxq.formats.scale import ScaleSpec
from onnxq.graph.functions.body import (
    _Body,
    _expand,
    _grid_shape,
    _pack,
    _reduce_tiles,
    _tiled_dims,
)
from onnxq.graph.functions.signature import _as_dtype, _check_geometry, _function, overload_name
from onnxq.graph.functions.values import _F32_MAX_EXP, _F32_MIN_EXP, _pow2_f32
from onnxq.graph.schemas import output_names


def _count_below(body: _Body, a: str, table: np.ndarray, *, strict: bool) -> str:
    """int64 count of entries of ascending ``table`` that are < ``a`` (or <= when not strict).

    A binary search: ``table`` is padded with +inf to a power of two, so NaN and +inf inputs
    are handled (NaN counts 0, +inf counts the finite entries).
    """
    size = 1 << max(len(table).bit_length(), 1)
    padded = np.full(size, np.inf, dtype=np.float32)
    padded[: len(table)] = table
    compare = "Less" if strict else "LessOrEqual"
    pos: str | None = None
    step = size // 2
    while step:
        cand = (
            body.const(step, np.int64)
            if pos is None
            else body.op("Add", pos, body.const(step, np.int64))
        )
        index = body.op("Sub", cand, body.const(1, np.int64))
        cond = body.op(compare, body.gather(padded, index), a)
        pos = body.where(cond, cand, body.const(0, np.int64) if pos is None else pos)
        step //= 2
    assert pos is not None
    return pos


def _max_finite_like(body: _Body, x: str) -> str:
    """The largest finite value of ``x``'s float type, as a float32 scalar.

    Each type's maximum cast to that type and back: the others come back Inf (or, truncating
    to bfloat16, not above its maximum), so the largest finite one is the type's own.
    """
    tops = np.array([np.finfo(np.float32).max, 2.0**128 - 2.0**120, 65504.0], np.float32)
    back = body.cast(body.op("CastLike", body.const(tops), x), TensorProto.FLOAT)
    finite = body.where(body.op("IsInf", back), body.const(np.float32(0.0)), back)
    return body.op("ReduceMax", finite, keepdims=0)


def _signbit(body: _Body, v: str) -> str:
    """True for negative values and -0 (1 / -0 = -inf)."""
    zero = body.const(np.float32(0.0))
    negative = body.op("Less", v, zero)
    neg_zero = body.op(
        "And",
        body.op("Equal", v, zero),
        body.op("Less", body.op("Div", body.const(np.float32(1.0)), v), zero),
    )
    return body.op("Or", negative, neg_zero)


def _magnitudes(spec: NumberSpec, full_range: bool, what: str) -> np.ndarray:
    """Non-negative finite values in code order; magnitude code = position (checked)."""
    if spec.is_int:
        top = (1 << (spec.bits - 1)) - (0 if full_range else 1)
        return np.arange(top + 1, dtype=np.float32)
    count = 0
    values: list[float] = []
    while count < 1 << (spec.bits - 1) and math.isfinite(spec.decode(count)):
        values.append(spec.decode(count))
        count += 1
    table = np.array(values, dtype=np.float32)
    if np.any(np.diff(table) <= 0) or not np.array_equal(table, np.array(values)):
        raise NotImplementedError(f"{what}: magnitude codes are not ordered float32 values")
    return table


def _quantize_support(
    dt: DataType, rmode: RoundMode, smode: ScaleMode, dims: tuple[int, ...]
) -> None:
    n, s = dt.nspec, dt.sspec
    name = dt.name
    if s is None:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: unscaled casts")
    if isinstance(n, Codebook):
        raise NotImplementedError(f"QuantizeMX fallback for {name}: codebook mapping selection")
    if not s.scale.is_exponent:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: float scales (only E8M0)")
    if s.sparsity[1]:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: N:M sparsity")
    if rmode is RoundMode.STOCHASTIC:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: stochastic rounding")
    if smode is ScaleMode.SEARCH:  # a quantizer-time choice for stored weights, not a rule
        raise NotImplementedError(f"QuantizeMX fallback for {name}: scale mode 'search'")
    if n.is_float and smode not in (ScaleMode.FLOOR, ScaleMode.CEIL):
        raise NotImplementedError(
            f"QuantizeMX fallback for {name}: scale mode {smode.value!r} (floor and ceil only)"
        )
    if n.bits > 8 or s.scale.bits > 8:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: codes over 8 bits")
    if n.is_float and n.emin - n.mbits - 1 <= -126:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: elements finer than float32")
    del dims


def quantize_mx_function(
    dtype: DataType | str,
    axis: int,
    shape: Sequence[int],
    *,
    round_mode: RoundMode | str = "even",
    scale_mode: ScaleMode | str = "floor",
    nan_policy: NanPolicy | str = "element",
    seed: int = 0,
    int_range: str = "symmetric",
    num_outputs: int = 6,
) -> onnx.FunctionProto:
    """The QuantizeMX body (compress-mode outputs) for exponent-scaled float and int elements.

    Covers the OCP MX presets, mxint8/mxint4, bfp and MX9/6/4 (shift bits in ``Meta``) with
    round modes even/away/zero, either NaN policy and either int range; float elements with
    scale modes floor and ceil (int elements always use floor). ``Zero``, ``TenScale`` and
    ``Mask`` (and ``Meta`` without subtiles) are zero-size uint8 tensors. ``num_outputs``
    (2..6) is the node's output count: onnxruntime needs a function with exactly as many
    outputs as the node that calls it, so it is part of the overload when below 6.

    Raises:
        NotImplementedError: anything else, naming the format and what is missing.
        ValueError: bad shape, axis or attribute value.
    """
    dt = _as_dtype(dtype)
    dims, ax = _check_geometry(shape, axis)
    rmode, smode = RoundMode.parse(round_mode), ScaleMode.parse(scale_mode)
    policy = NanPolicy.parse(nan_policy)
    if int_range not in ("symmetric", "full"):
        raise ValueError(f"unknown int_range {int_range!r}: expected 'symmetric' or 'full'")
    _quantize_support(dt, rmode, smode, dims)
    if not 2 <= num_outputs <= 6:
        raise ValueError(f"QuantizeMX has 2 to 6 outputs (Q, Scale, ...), not {num_outputs}")
    n, s = dt.nspec, dt.sspec
    assert s is not None
    attrs = {
        "dtype": dt.code,
        "axis": ax,
        "round_mode": rmode.value,
        "scale_mode": smode.value,
        "nan_policy": policy.value,
        "seed": seed,
        "int_range": int_range,
        "num_outputs": num_outputs,
    }
    body = _Body("q")
    tiling = Tiling.build(dims, ax, s)
    tiles = _tiled_dims(tiling, tiling.Tr, tiling.Tc)
    x = body.cast("X", TensorProto.FLOAT)
    isnan = body.op("IsNaN", x)
    nonfinite = body.op("Or", isnan, body.op("IsInf", x))
    absx = body.where(nonfinite, body.const(np.float32(0.0)), body.op("Abs", x))
    amax = _reduce_tiles(body, absx, dims, tiles, "ReduceMax")
    stored, top_power, positive = _scale_exponent(body, n, s, smode, amax)

    # v = x * 2^-stored * 2^(frac + shift): the first product is exact unless it falls below
    # 2^-126, where the element rounds to zero either way (the caller checked the formats).
    frac = n.int_fraction_bits
    low, high = -s.scale.bias, (1 << s.scale.ebits) - 2 - s.scale.bias
    inverse = np.array([_pow2_f32(-k) for k in range(low, high + 1)], dtype=np.float32)
    factor = body.gather(inverse, body.op("Sub", stored, body.const(low, np.int64)))
    v = body.op("Mul", x, _expand(body, factor, dims, tiles))
    shift = meta_out = None
    if tiling.Sc:
        shift, meta_out = _subtile_shifts(
            body, absx, dims, tiling, tiles, positive, top_power, num_outputs
        )
    v = _times_shift(body, v, frac, shift)

    # Elements: the nearest magnitude, ties by the round mode (even: the even code).
    full = int_range == "full" and n.is_int
    mags = _magnitudes(n, full, dt.name)
    idx = _nearest(body, v, mags, rmode)
    # Saturation (docs/ops.md): no element decodes past X's largest finite value. The
    # magnitude of v-units that decodes to it is that value times the exact powers of two
    # that scaled x (Inf where it passes float32: no bound); the index of the largest table
    # magnitude at most that caps the element's (ints' full range included).
    reach = body.op("Mul", _max_finite_like(body, "X"), _expand(body, factor, dims, tiles))
    reach = _times_shift(body, reach, frac, shift)
    cap = body.op("Sub", _count_below(body, reach, mags, strict=False), body.const(1, np.int64))
    idx = body.op("Min", idx, cap)
    codes = _signed_codes(body, n, v, idx, full)

    # NaN tiles: scale code all ones, element codes 0 (docs/architecture.md, decision 5).
    scale_code = body.op("Add", stored, body.const(s.scale.bias, np.int64))
    bad = isnan if policy is NanPolicy.ELEMENT else nonfinite
    if policy is NanPolicy.BLOCK or not n.is_float:
        flagged = _reduce_tiles(body, body.cast(bad, TensorProto.FLOAT), dims, tiles, "ReduceMax")
        nan_tile = body.op("Greater", flagged, body.const(np.float32(0.0)))
        scale_code = body.where(
            nan_tile, body.const((1 << s.scale.ebits) - 1, np.int64), scale_code
        )
        codes = body.where(_expand(body, nan_tile, dims, tiles), body.const(0, np.int64), codes)
    _pack(body, body.reshape(codes, [-1]), n.bits, math.prod(dims), "Q")
    body.op(
        "Cast",
        body.reshape(scale_code, _grid_shape(dims, tiles)),
        out="Scale",
        to=TensorProto.UINT8,
    )
    empty = np.zeros(0, dtype=np.uint8)
    for name in output_names("QuantizeMX")[2:num_outputs]:
        if name == "Meta" and meta_out is not None:
            continue
        body.op("Identity", body.const(empty), out=name)
    overload = overload_name("QuantizeMX", attrs, dims)
    return _function("QuantizeMX", overload, body, num_outputs)


def _scale_exponent(
    body: _Body, n: NumberSpec, s: ScaleSpec, smode: ScaleMode, amax: str
) -> tuple[str, str, str]:
    """The stored scale exponent of each tile (int64), 2^maxexp and amax > 0 (grid layout)."""
    # Scale: maxexp = floor(log2(amax)) by search on 2^-149 .. 2^127
    # (docs/architecture.md, decision 1).
    powers = np.array([_pow2_f32(k) for k in range(_F32_MIN_EXP, _F32_MAX_EXP + 1)])
    count = _count_below(body, amax, powers, strict=False)  # = maxexp + 150 for amax > 0
    top_index = body.op(
        "Max", body.op("Sub", count, body.const(1, np.int64)), body.const(0, np.int64)
    )
    top_power = body.gather(powers, top_index)  # 2^maxexp (amax > 0)
    maxexp = body.op("Sub", count, body.const(1 - _F32_MIN_EXP, np.int64))
    if n.is_float and smode is ScaleMode.CEIL:
        bump = body.cast(body.op("Greater", amax, top_power), TensorProto.INT64)
        maxexp = body.op("Add", maxexp, bump)
    frac = n.int_fraction_bits
    low, high = -s.scale.bias, (1 << s.scale.ebits) - 2 - s.scale.bias
    stored = body.op("Add", maxexp, body.const(frac - n.emax, np.int64))
    stored = body.op("Clip", stored, body.const(low, np.int64), body.const(high, np.int64))
    positive = body.op("Greater", amax, body.const(np.float32(0.0)))
    stored = body.where(positive, stored, body.const(low, np.int64))
    return stored, top_power, positive


def _subtile_shifts(
    body: _Body,
    absx: str,
    dims: tuple[int, ...],
    tiling: Tiling,
    tiles: Mapping[int, int],
    positive: str,
    top_power: str,
    num_outputs: int,
) -> tuple[str, str | None]:
    """MX9/6/4: shift a subtile whose magnitudes all lie below 2^maxexp.

    ``positive`` (amax > 0) and ``top_power`` (2^maxexp) are per tile, in grid layout.
    Returns the shift bit of each element (int64, X's shape) and the packed ``Meta`` output
    (None when the node does not have it).
    """
    sub_tiles = _tiled_dims(tiling, tiling.Sr, tiling.Sc)
    sub_shape = _grid_shape(dims, sub_tiles)
    sub_max = _reduce_tiles(body, absx, dims, sub_tiles, "ReduceMax")
    limit = body.where(positive, top_power, body.const(np.float32(0.0)))
    ratio = {d: tiles[d] // sub_tiles[d] for d in tiles}
    limit = _expand(body, limit, sub_shape, ratio)
    below = body.cast(body.op("Less", sub_max, limit), TensorProto.INT64)
    meta_out = None
    if num_outputs >= 5:
        meta_out = _pack(body, body.reshape(below, [-1]), 1, math.prod(sub_shape), "Meta")
    return _expand(body, below, dims, sub_tiles), meta_out


def _times_shift(body: _Body, value: str, frac: int, shift: str | None) -> str:
    """``value * 2^(frac + shift)`` (the shift of MX9/6/4 subtiles, 0 without subtiles)."""
    if shift is not None:
        step = np.array([_pow2_f32(frac), _pow2_f32(frac + 1)], dtype=np.float32)
        return body.op("Mul", value, body.gather(step, shift))
    if frac:
        return body.op("Mul", value, body.const(_pow2_f32(frac)))
    return value


def _nearest(body: _Body, v: str, mags: np.ndarray, rmode: RoundMode) -> str:
    """Index in ``mags`` of the magnitude nearest ``|v|``, ties by the round mode."""
    a = body.op("Abs", v)
    below_count = _count_below(body, a, mags, strict=True)
    hi = body.op("Clip", below_count, body.const(1, np.int64), body.const(len(mags) - 1, np.int64))
    lo = body.op("Sub", hi, body.const(1, np.int64))
    d_lo = body.op("Sub", a, body.gather(mags, lo))
    d_hi = body.op("Sub", body.gather(mags, hi), a)
    closer = body.op("Less", d_hi, d_lo)
    tie = body.op("Equal", d_hi, d_lo)
    if rmode is RoundMode.EVEN:
        odd = body.op("BitwiseAnd", hi, body.const(1, np.int64))
        tie = body.op("And", tie, body.op("Equal", odd, body.const(0, np.int64)))
    elif rmode is RoundMode.ZERO:
        tie = body.op("And", tie, body.const(False, np.bool_))
    return body.where(body.op("Or", closer, tie), hi, lo)


def _signed_codes(body: _Body, n: NumberSpec, v: str, idx: str, full: bool) -> str:
    """Element codes: magnitude index ``idx`` with the sign of ``v`` (NaN code for NaN)."""
    if n.is_int:
        negative = body.op("Less", v, body.const(np.float32(0.0)))
        if full:
            top = body.const((1 << (n.bits - 1)) - 1, np.int64)
            idx = body.where(negative, idx, body.op("Min", idx, top))
        wrapped = body.op("Sub", body.const(1 << n.bits, np.int64), idx)
        wrapped = body.op("BitwiseAnd", wrapped, body.const((1 << n.bits) - 1, np.int64))
        return body.where(negative, wrapped, idx)
    negative = _signbit(body, v)
    if not n.has_negative_zero:
        negative = body.op("And", negative, body.op("Greater", idx, body.const(0, np.int64)))
    sign = body.op(
        "Mul", body.cast(negative, TensorProto.INT64), body.const(1 << (n.bits - 1), np.int64)
    )
    codes = body.op("Add", idx, sign)
    return body.where(body.op("IsNaN", v), body.const(nan_code(n), np.int64), codes)
