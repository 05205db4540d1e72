"""The numpy reference cast engine: the oracle every faster backend is tested against.

`quantize` turns a float32 array into element codes, scales, zero points, meta and masks
(and the dequantized values, which are what a virtual cast returns); `dequantize` turns the
codes back into float32. The order of operations mirrors docs/architecture.md:

1. N:M sparsity (keep the N largest magnitudes of every M along the sparse axis).
2. Tiles (layout.py), each tile's absmax over finite values (NaN policy: decision 5).
3. The scale: exponent (scale-mode rules, decisions 2-3), float (absmax / maxfloat
   cast to the scale type, over an optional tensor scale), or float scale + zero point.
   Scale mode ``search`` casts each tile with a few candidate scales and keeps the one with
   the least squared error (scale_search.py).
4. The elements: scaled, rounded (elements.py), clamped; codebooks pick a mapping per tile
   or subtile by error; MX9/6/4 shift a subtile by one when all its exponents are below the
   tile's (the MX9/MX6/MX4 document, decision 10).
"""

from __future__ import annotations

import math

import numpy as np

from onnxq.cast.elements import (
    MAX_FINITE,
    OVERFLOW,
    PRODUCT_LIMIT,
    decode_codes,
    encode_values,
    finite_bound,
    floor_log2,
    pow2,
    quantize_values,
    round_magnitude,
    stochastic_bits,
)
from onnxq.cast.layout import Tiling
from onnxq.cast.request import Encoded, Metric
from onnxq.cast.scale_search import STEPS, float_step, select, tile_sq_error
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode
from onnxq.formats.number import NumberSpec

__all__ = ["Encoded", "Metric", "dequantize", "quantize"]


def l2_metric(v: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Sum of squared errors over the last axis (the default codebook metric).

    Added left to right in float64, one position at a time across every unit: the order
    decides near-ties between mappings, and numpy's own reductions (sum, einsum) add in an
    order that depends on how numpy was built, which the native kernels could not follow.
    """
    d = v - q
    sq = d * d
    err = sq[..., 0].copy()
    for i in range(1, sq.shape[-1]):
        err += sq[..., i]
    return err


# -- step 1: sparsity --------------------------------------------------------------------------
def _prune(
    x: np.ndarray, tiling: Tiling, n_keep: int, m: int, tile_index: int
) -> tuple[np.ndarray, np.ndarray]:
    """Zero all but the N largest magnitudes of each group of M along the sparse dimension."""
    moved = np.moveaxis(x, tiling.axis, -1).reshape(tiling.B, tiling.R, tiling.C)
    along_rows = tiling.kind == "2d" and tile_index == 0
    work = moved.transpose(0, 2, 1) if along_rows else moved
    length = work.shape[-1]
    pad = -length % m
    key = np.abs(work)
    key = np.where(np.isnan(key), np.inf, key)  # NaN is kept, to be seen by the NaN policy
    if pad:
        key = np.pad(key, ((0, 0), (0, 0), (0, pad)), constant_values=-1.0)
    groups = key.reshape(*key.shape[:-1], -1, m)
    order = np.argsort(-groups, axis=-1, kind="stable")  # ties: lower index first
    keep = np.zeros(groups.shape, dtype=bool)
    np.put_along_axis(keep, order[..., :n_keep], True, axis=-1)
    keep = keep.reshape(*key.shape[:-1], -1)[..., :length]
    if along_rows:
        keep = keep.transpose(0, 2, 1)
    keep_in = np.moveaxis(keep.reshape(tiling.moved_shape), -1, tiling.axis)
    return np.where(keep_in, x, np.float32(0)), keep_in


# -- step 3: exponent scales -------------------------------------------------------------------
def _scale_exponent(amax: np.ndarray, spec: NumberSpec, mode: ScaleMode) -> np.ndarray:
    """Maxexp' - emax of architecture decision 3, before clamping (int64; zero tiles arbitrary)."""
    a = amax.astype(np.float64)
    maxexp = floor_log2(np.where(a > 0, a, 1.0))
    if spec.is_float:
        bump: np.ndarray | None
        match mode:
            case ScaleMode.FLOOR:
                bump = None
            case ScaleMode.CEIL:
                bump = a > np.ldexp(1.0, maxexp)
            case ScaleMode.MIDMAX:
                bump = a > np.ldexp(spec.midmax, maxexp - spec.emax)
            case ScaleMode.TOPBINADE | ScaleMode.RCEIL:
                bump = a > np.ldexp(spec.maxfloat, maxexp - spec.emax)
            case ScaleMode.OPTION3:
                bump = np.rint(np.ldexp(a, spec.mbits - maxexp)) >= 2.0 ** (spec.mbits + 1)
            case ScaleMode.EVEN:
                bump = np.floor(np.ldexp(a, spec.mbits - maxexp) + 0.5) >= 2.0 ** (spec.mbits + 1)
            case _:
                raise ValueError(f"unknown scale mode {mode!r}")
        if bump is not None:
            maxexp = maxexp + bump
    return maxexp - spec.emax


def _codebook_select(
    v: np.ndarray,
    book: Codebook,
    tiling: Tiling,
    mode: RoundMode,
    metric: Metric,
    bound: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nearest entry of every mapping, then the mapping with the least error per unit.

    ``bound`` (per tile) caps the magnitudes: each mapping uses only its entries <= bound
    (magnitudes above its largest such entry are first lowered to it).

    Returns (quantized values, magnitude index, mapping index per unit), units being subtiles
    when the scale has them, else tiles.
    """
    if mode is RoundMode.STOCHASTIC:
        raise NotImplementedError(
            "codebooks round to the nearest table entry; stochastic is not supported"
        )
    a = np.abs(v)
    per_unit = (lambda t: tiling.to_subtiles(t)) if tiling.Sc else (lambda t: t[..., None, :])
    best_err = best_q = best_idx = best_map = None
    for index, (mags, codes) in enumerate(
        zip(book.magnitudes(), book.magnitude_codes(), strict=True)
    ):
        table = np.asarray(mags, dtype=np.float64)
        even = np.asarray(codes) % 2 == 0
        # The mapping's largest entry within the tile's bound (entry 0 is 0.0 <= any bound).
        cap = table[np.searchsorted(table, bound, side="right") - 1]
        a = np.minimum(np.abs(v), cap[..., None])
        hi = np.clip(np.searchsorted(table, a, side="left"), 1, len(table) - 1)
        lo = hi - 1
        d_lo, d_hi = a - table[lo], table[hi] - a
        match mode:
            case RoundMode.EVEN:
                tie_hi = even[hi]
            case RoundMode.AWAY:
                tie_hi = np.ones_like(d_lo, dtype=bool)
            case RoundMode.ZERO:
                tie_hi = np.zeros_like(d_lo, dtype=bool)
            case _:
                raise ValueError(f"unknown round mode {mode!r}")
        pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & tie_hi)
        idx = np.where(pick_hi, hi, lo)
        q = np.copysign(table[idx], v)
        if not book.compute.has_negative_zero:
            q += 0.0  # the table's sign-and-zero entry is +0 (codebook.py `table`)
        err = metric(per_unit(v), per_unit(q))
        if best_err is None:
            best_err, best_q, best_idx = err, q, idx
            best_map = np.zeros(err.shape, dtype=np.int64)
        else:
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_map = np.where(better, index, best_map)
            wide = (
                tiling.from_subtiles(
                    np.broadcast_to(better[..., None], (*better.shape, tiling.Sr * tiling.Sc))
                )
                if tiling.Sc
                else np.broadcast_to(better, q.shape)
            )
            best_q = np.where(wide, q, best_q)
            best_idx = np.where(wide, idx, best_idx)
    assert best_q is not None and best_idx is not None and best_map is not None
    return best_q, best_idx, (best_map if tiling.Sc else best_map[..., 0])


def _scale_units(t: np.ndarray, factor: np.ndarray, tiling: Tiling) -> np.ndarray:
    """Multiply each subtile of tile-layout ``t`` by its ``factor`` (exact powers of two)."""
    return tiling.from_subtiles(tiling.to_subtiles(t) * factor[..., None])


def _expand_units(per_unit: np.ndarray, tiling: Tiling) -> np.ndarray:
    """Per-subtile (or per-tile) array -> per-element, in tile layout."""
    if tiling.Sc:
        return tiling.from_subtiles(np.repeat(per_unit[..., None], tiling.Sr * tiling.Sc, axis=-1))
    return np.repeat(per_unit[..., None], tiling.tile_elems, axis=-1)


# -- the cast ----------------------------------------------------------------------------------
def quantize(
    x: np.ndarray,
    dt: DataType,
    *,
    axis: int = -1,
    round_mode: RoundMode = RoundMode.EVEN,
    scale_mode: ScaleMode = ScaleMode.FLOOR,
    nan_policy: NanPolicy = NanPolicy.ELEMENT,
    seed: int = 0,
    metric: Metric | None = None,
    full_int_range: bool = False,
    want_codes: bool = True,
    finite_dtype: str | np.dtype = "float32",
) -> Encoded:
    """Quantize a float32 array (any shape, non-empty) to ``dt``.

    ``finite_dtype`` (float32, float16 or bfloat16: the caller's data type) bounds the
    element clamp: finite input never decodes to a value past that type's largest finite one.

    Raises:
        ValueError: geometry problems (axis, 2-D tiles on 1-D data).
        NotImplementedError: a mode the format cannot do (stochastic codebooks).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    max_finite = MAX_FINITE[np.dtype(finite_dtype).name]
    n, s = dt.nspec, dt.sspec
    tiling = Tiling.build(x.shape, axis, s)
    rand = None
    if round_mode is RoundMode.STOCHASTIC:
        rand = stochastic_bits(seed, np.arange(x.size, dtype=np.uint64).reshape(x.shape))
    if s is None:  # an unscaled cast
        limit = finite_bound(np.float64(max_finite), n, n.maxfloat)
        q = quantize_values(x.astype(np.float64), n, round_mode, rand, keep_inf=True, limit=limit)
        return Encoded(
            values=_canonical_nan(q.astype(np.float32)),
            codes=encode_values(q, n).astype(_code_dtype(n)) if want_codes else None,
        )

    mask = None
    sparse_n, sparse_m, sparse_dim = s.sparsity
    if sparse_m:
        x, mask = _prune(x, tiling, sparse_n, sparse_m, sparse_dim)

    xt = tiling.to_tiles(x)
    rt = tiling.to_tiles(rand) if rand is not None else None
    finite = np.isfinite(xt)
    absx = np.where(finite, np.abs(xt), np.float32(0))
    amax = absx.max(axis=-1)
    nonfinite = ~finite.all(axis=-1)
    if nan_policy is NanPolicy.BLOCK:
        nan_tiles = nonfinite
    elif n.is_float:
        nan_tiles = None
    else:  # no NaN code: a NaN poisons its tile through the scale
        nan_tiles = np.isnan(xt).any(axis=-1)
    if nan_tiles is not None and not nan_tiles.any():
        nan_tiles = None

    out = Encoded(values=np.empty(0, np.float32))
    if s.family == "zero":  # the scale and zero are a pair from min/max: no search
        y, codes_t = _zero_point_scaled(xt, rt, n, dt, round_mode, out, want_codes, finite_dtype)
    else:
        common = (xt, absx, amax, rt, n, dt, tiling, round_mode, scale_mode, metric)

        def run(step: int, into: Encoded) -> tuple[np.ndarray, np.ndarray | None]:
            if s.family == "exponent":
                return _exponent_scaled(*common, full_int_range, into, want_codes, max_finite, step)
            return _float_scaled(
                xt,
                amax,
                rt,
                n,
                dt,
                round_mode,
                full_int_range,
                into,
                want_codes,
                finite_dtype,
                step,
            )

        if scale_mode is ScaleMode.SEARCH:
            y, codes_t = _searched(run, xt, out)
        else:
            y, codes_t = run(0, out)

    if nan_tiles is not None:
        y = np.where(nan_tiles[..., None], np.float32(np.nan), y)
        if want_codes:
            assert codes_t is not None and out.scale is not None
            codes_t = np.where(nan_tiles[..., None], 0, codes_t)
            nan_scale = encode_values(np.array([np.nan]), s.scale)[0]
            out.scale = np.where(nan_tiles, nan_scale, out.scale)
    out.values = tiling.from_tiles(_canonical_nan(y.astype(np.float32)))
    if mask is not None:  # pruned positions read as zero whatever the zero point
        out.values = np.where(mask, out.values, np.float32(0))
        out.mask = mask
    if want_codes:
        assert codes_t is not None
        out.codes = tiling.from_tiles(codes_t).astype(_code_dtype(n))
        out.scale = tiling.tile_grid(out.scale.astype(_code_dtype(s.scale)))
        if out.zero is not None:
            out.zero = tiling.tile_grid(out.zero.astype(_code_dtype(s.zero)))
        if out.meta is not None:
            meta_grid = tiling.sub_grid if tiling.Sc else tiling.tile_grid
            out.meta = meta_grid(out.meta).astype(np.uint8)
    return out


def _canonical_nan(values: np.ndarray) -> np.ndarray:
    """Every NaN as the quiet positive NaN 0x7FC00000, whatever its input payload or sign.

    A NaN code carries no payload, so upcast can only give the canonical NaN; virtual casts
    give the same so that both are bit-identical.
    """
    return np.where(np.isnan(values), np.float32(np.nan), values)


def _searched(run, xt: np.ndarray, out: Encoded) -> tuple[np.ndarray, np.ndarray | None]:
    """Scale mode ``search``: every candidate of scale_search.STEPS, the least error per tile."""
    best_err = best_y = best_codes = None
    for step in STEPS:
        trial = Encoded(values=np.empty(0, np.float32))
        y, codes = run(step, trial)
        err = tile_sq_error(y, xt)
        if best_err is None:
            best_err, best_y, best_codes = err, y, codes
            out.scale, out.meta, out.tenscale = trial.scale, trial.meta, trial.tenscale
            continue
        better = err < best_err  # strictly: ties keep the earlier candidate
        best_err = np.where(better, err, best_err)
        best_y = select(better, y, best_y)
        best_codes = select(better, codes, best_codes)
        out.scale = select(better, trial.scale, out.scale)
        out.meta = select(better, trial.meta, out.meta)
    assert best_y is not None
    return best_y, best_codes


def _code_dtype(spec: NumberSpec) -> np.dtype:
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if spec.bits <= np.dtype(dtype).itemsize * 8:
            return np.dtype(dtype)
    raise AssertionError(spec)


def _exponent_scaled(
    xt,
    absx,
    amax,
    rt,
    n,
    dt,
    tiling,
    round_mode,
    scale_mode,
    metric,
    full_int_range,
    out,
    want_codes,
    max_finite,
    step=0,
):
    s = dt.sspec
    book = n if n.is_codebook else None
    elem = n.compute_spec
    # The stored exponent treats ints as fixed point with one integer bit (OCP MXINT8, spec
    # 003); `sexp` is the exponent of the element grid step, `frac` lower. `step`: a
    # candidate of scale mode search, relative to floor.
    frac = elem.int_fraction_bits
    low, high = -s.scale.bias, (1 << s.scale.ebits) - 2 - s.scale.bias
    mode = ScaleMode.FLOOR if scale_mode is ScaleMode.SEARCH else scale_mode
    stored = _scale_exponent(amax, elem, mode) + frac + step
    sexp = np.where(amax > 0, np.clip(stored, low, high), low) - frac
    v = xt.astype(np.float64) * pow2(-sexp)[..., None]
    # The element magnitude whose decoded value is max_finite: the clamp's bound (exact).
    reach = np.ldexp(max_finite, -sexp)
    shift = None
    if book is None and tiling.Sc:  # MX9/6/4: one shift bit per subtile (decision 10)
        # "Both exponents below the block's" == every magnitude below 2^maxexp.
        below = (
            tiling.to_subtiles(absx) < pow2(floor_log2(amax.astype(np.float64)))[..., None, None]
        ).all(axis=-1)
        out.meta = below.astype(np.uint8)
        shift = below
        v = _scale_units(v, np.where(below, 2.0, 1.0), tiling)
    if book is not None:
        bound = finite_bound(reach, elem, elem.maxfloat)
        q, mag_idx, chosen = _codebook_select(
            v, book, tiling, round_mode, metric or l2_metric, bound
        )
        out.meta = chosen.astype(np.uint8)
        codes = None
        if want_codes:
            negative = np.signbit(q) & ((q != 0) | book.compute.has_negative_zero)
            codes = (negative.astype(np.int64) << (book.index_bits - 1)) | mag_idx
    else:
        top = n.maxfloat + 1.0 if full_int_range and n.is_int else n.maxfloat
        limit = finite_bound(reach, n, top)[..., None]
        if shift is not None:  # a shifted subtile decodes at half the scale: twice the reach
            shifted = _expand_units(shift, tiling)
            limit = np.where(shifted, finite_bound(2.0 * reach, n, top)[..., None], limit)
        q = quantize_values(v, n, round_mode, rt, full_int_range=full_int_range, limit=limit)
        codes = None
        if want_codes:  # ints have no NaN code: their NaN tiles are marked by the caller
            codes = encode_values(q if n.is_float else np.nan_to_num(q), n)
    y = q * pow2(sexp)[..., None]
    if shift is not None:
        y = _scale_units(y, np.where(shift, 0.5, 1.0), tiling)
    out.scale = (sexp + frac + s.scale.bias).astype(np.int64)
    return y, codes


def _cast_scale(values: np.ndarray, spec: NumberSpec) -> np.ndarray:
    """Round float32 scale or zero-point values to ``spec`` (round-even), as float32.

    They saturate at the largest value that float32 holds (`NumberSpec.float32_max`), so the
    float32 number the arithmetic uses is the value its code decodes to.
    """
    return quantize_values(
        values.astype(np.float64), spec, RoundMode.EVEN, limit=spec.float32_max
    ).astype(np.float32)


def _tensor_scale(
    xt: np.ndarray, amax: np.ndarray, n: NumberSpec, dt: DataType
) -> tuple[np.float32, np.float32]:
    """NVFP4-style tensor scale: amax / (maxfloat_elem * maxfloat_scale), cast to its type."""
    s = dt.sspec
    top = np.float32(amax.max()) if amax.size else np.float32(0)
    denom = np.float32(n.maxfloat) * np.float32(s.scale.maxfloat)
    ts = _cast_scale(np.array([top / denom], dtype=np.float32), s.tenscale)[0]
    return np.float32(ts), top


def _product_bound(scale: np.ndarray, spec: NumberSpec, top: float, finite_dtype) -> np.ndarray:
    """Largest grid magnitude b of ``spec`` (<= top) with float32(b) * scale finite in the type.

    The decoder rounds b to float32, multiplies in float32 and then rounds to
    ``finite_dtype``: that is finite exactly when float32(b) * scale (exact in float64) is below
    `PRODUCT_LIMIT`. Grid values are float32 numbers but for ints over 24 bits, whose
    float32(b) may round up past the limit: those step down to the float32 number below.
    A zero scale has no bound (``top``).
    """
    limit = PRODUCT_LIMIT[np.dtype(finite_dtype).name]
    sc = scale.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(sc > 0, limit / np.where(sc > 0, sc, 1.0), np.inf)
        b = finite_bound(np.minimum(t, 2.0 * top + 2.0), spec, top)
        # t is rounded: the grid value it lands on may still reach the limit.
        lower = finite_bound(np.nextafter(b, 0.0), spec, top)
        b = np.where((sc > 0) & (b * sc >= limit), lower, b)
        if not spec.is_float:
            f = b.astype(np.float32).astype(np.float64)
            b = np.where((sc > 0) & (f * sc >= limit), _int_below(f), b)
        return b


def _int_below(f: np.ndarray) -> np.ndarray:
    """The largest integer whose float32 value is below ``f`` (float32 integers >= 1, float64).

    Up to 2^24 that is f - 1. Above, the float32 number p below f is an integer, and the
    integers that round to p or lower are those below the midpoint m = (p + f) / 2, and m
    itself when p's mantissa is even (ties round to even).
    """
    p = np.nextafter(f.astype(np.float32), np.float32(0))
    m = (p.astype(np.float64) + f) / 2.0
    even = (p.view(np.uint32) & 1) == 0
    return np.where(f <= 2.0**24, f - 1.0, np.where(even, m, m - 1.0))


def _zero_float_top(sc: np.ndarray, zero: np.ndarray, qmax: float, finite_dtype) -> np.ndarray:
    """Largest q in [0, qmax] whose decoded float32(float32(q * sc) + zero) is finite in the type.

    q = floor((overflow - zero) / sc) + 1 (float64) is at most one step above the answer; up
    to three steps down, each checked with the decoder's float32 arithmetic. A step goes to
    the next float32 number below float32(q) (q - 1 up to 2^24; wider uints round q first).
    """
    over = np.float64(OVERFLOW[np.dtype(finite_dtype).name])
    s64, z64 = sc.astype(np.float64), zero.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t = np.floor((over - z64) / np.where(s64 > 0, s64, 1.0)) + 1.0
        q = np.where(s64 > 0, np.clip(t, 0.0, qmax), qmax)
        for _ in range(3):
            qf = q.astype(np.float32)
            y = (qf * sc).astype(np.float32) + zero
            below = _int_below(np.maximum(qf, np.float32(1)).astype(np.float64))
            q = np.where((np.abs(y) >= over) & (q > 0), below, q)
    return q


def _float_scaled(
    xt, amax, rt, n, dt, round_mode, full_int_range, out, want_codes, finite_dtype, step=0
):
    s = dt.sspec
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        raw = amax / np.float32(n.maxfloat)
        if s.tenscale is not None:
            ts, _ = _tensor_scale(xt, amax, n, dt)
            raw = np.where(ts > 0, raw / ts, np.float32(0)).astype(np.float32)
            out.tenscale = encode_values(np.array([ts], dtype=np.float64), s.tenscale).astype(
                _code_dtype(s.tenscale)
            )
        sc = float_step(_cast_scale(raw, s.scale), s.scale, step)  # step: search's candidate
        eff = (sc * ts).astype(np.float32) if s.tenscale is not None else sc
        # A zero scale (all finite values zero) sends everything to 0, but NaN stays NaN.
        v = np.where(eff[..., None] > 0, xt / eff[..., None], np.where(np.isnan(xt), xt, 0))
        v = v.astype(np.float32)
    top = n.maxfloat + 1.0 if full_int_range and n.is_int else n.maxfloat
    limit = _product_bound(eff, n, top, finite_dtype)[..., None]
    q = quantize_values(
        v.astype(np.float64), n, round_mode, rt, full_int_range=full_int_range, limit=limit
    )
    y = q.astype(np.float32) * eff[..., None]
    out.scale = encode_values(sc.astype(np.float64), s.scale)
    # Ints have no NaN code: their NaN tiles are marked by the caller, so the code is moot.
    codes = encode_values(q if n.is_float else np.nan_to_num(q), n) if want_codes else None
    return y, codes


def _zero_point_scaled(xt, rt, n, dt, round_mode, out, want_codes, finite_dtype):
    s = dt.sspec
    finite = np.isfinite(xt)
    # The scale divides by qmax in float32 (2^N for N > 24 bits); codes clip at the exact
    # 2^N - 1, which float32 cannot hold from 25 bits on.
    qmax, top = np.float32(n.maxfloat), float(n.maxfloat)
    lo = np.where(finite, xt, np.float32(np.inf)).min(axis=-1)
    hi = np.where(finite, xt, np.float32(-np.inf)).max(axis=-1)
    lo = np.where(np.isfinite(lo), lo, np.float32(0))
    hi = np.where(np.isfinite(hi), hi, np.float32(0))
    lo, hi = _later_zeros(xt, finite, lo, hi)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if s.zero.is_float:
            zero = _cast_scale(lo, s.zero)
            raw = np.maximum((hi - zero) / qmax, np.float32(0)).astype(np.float32)
            sc = _cast_scale(raw, s.scale)
            shifted = (xt - zero[..., None]).astype(np.float32)
            v = np.where(sc[..., None] > 0, shifted / sc[..., None], np.float32(0)).astype(
                np.float32
            )
            q_hi = _zero_float_top(sc, zero, top, finite_dtype)[..., None]
            q = np.clip(_round_signed(v, round_mode, rt), 0, top)
            q = np.where(q > q_hi, q_hi, q)  # (-0 and NaN stay as they are)
            y = (q.astype(np.float32) * sc[..., None]).astype(np.float32) + zero[..., None]
            zero_codes = encode_values(zero.astype(np.float64), s.zero)
        else:
            lo, hi = np.minimum(lo, np.float32(0)), np.maximum(hi, np.float32(0))
            raw = ((hi - lo) / qmax).astype(np.float32)
            sc = _cast_scale(raw, s.scale)
            zp = np.where(sc > 0, -lo / sc, np.float32(0)).astype(np.float32)
            zp = np.clip(np.rint(zp).astype(np.float64), 0, top)
            v = np.where(sc[..., None] > 0, xt / sc[..., None], np.float32(0)).astype(np.float32)
            # q - zp decodes to (q - zp) * sc: keep |q - zp| where that stays finite.
            reach = _product_bound(sc, n, top, finite_dtype)
            q_lo = np.maximum(zp - reach, 0)[..., None]
            q_hi = np.minimum(zp + reach, top)[..., None]
            q = np.clip(_round_signed(v, round_mode, rt) + zp[..., None], 0, top)
            q = np.where(q < q_lo, q_lo, np.where(q > q_hi, q_hi, q))
            y = ((q - zp[..., None]).astype(np.float32) * sc[..., None]).astype(np.float32)
            zero_codes = encode_values(zp.astype(np.float64), s.zero)
    # Inf saturated through the clip; NaN tiles get their scale made NaN by the caller.
    q = np.nan_to_num(q)
    out.scale = encode_values(sc.astype(np.float64), s.scale)
    out.zero = zero_codes
    return y, (q.astype(np.int64) if want_codes else None)


def _later_zeros(
    xt: np.ndarray, finite: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A tile's minimum and maximum with equal values taking the later one.

    np.minimum / np.maximum take the later of equal values, so a zero minimum or maximum gets
    the sign of the tile's last zero (the padding, +0, comes last); np.min / np.max
    reductions follow that only on short arrays, so the sign is set here.
    """
    if not (np.any(lo == 0) or np.any(hi == 0)):
        return lo, hi
    zero = finite & (xt == 0)
    last = xt.shape[-1] - 1 - np.argmax(zero[..., ::-1], axis=-1)
    # (a tile without a finite value has no zero: argmax's 0 would name its last element)
    neg = np.signbit(np.take_along_axis(xt, last[..., None], axis=-1)[..., 0]) & zero.any(-1)
    signed = np.where(neg, np.float32(-0.0), np.float32(0.0))
    return np.where(lo == 0, signed, lo), np.where(hi == 0, signed, hi)


def _round_signed(v: np.ndarray, mode: RoundMode, rand: np.ndarray | None) -> np.ndarray:
    v64 = v.astype(np.float64)
    return np.copysign(round_magnitude(np.abs(v64), mode, rand), v64)


# -- the inverse -------------------------------------------------------------------------------
def dequantize(
    dt: DataType,
    shape: tuple[int, ...],
    axis: int,
    codes: np.ndarray,
    scale: np.ndarray | None = None,
    zero: np.ndarray | None = None,
    tenscale: np.ndarray | None = None,
    meta: np.ndarray | None = None,
) -> np.ndarray:
    """Float32 values of unpacked codes (input shape; pruned positions hold code 0).

    Raises:
        ValueError: a missing or mis-shaped scale, zero point or meta tensor.
    """
    n, s = dt.nspec, dt.sspec
    if s is None:
        return _canonical_nan(decode_codes(codes, n).astype(np.float32))
    if scale is None:
        raise ValueError(f"{dt.name}: dequantizing needs the scale tensor")
    tiling = Tiling.build(shape, axis, s)
    ct = tiling.to_tiles(codes.reshape(shape))
    sc_codes = tiling.tile_ungrid(np.asarray(scale))
    if s.family == "exponent":
        sexp = sc_codes.astype(np.int64) - s.scale.bias - n.int_fraction_bits
        nan_tiles = sc_codes.astype(np.int64) == (1 << s.scale.ebits) - 1
        shift = 0
        if n.is_codebook or tiling.Sc:
            if meta is None:
                raise ValueError(f"{dt.name}: dequantizing needs the meta tensor")
            units = (
                tiling.sub_ungrid(np.asarray(meta))
                if tiling.Sc
                else tiling.tile_ungrid(np.asarray(meta))
            )
            per_el = _expand_units(units.astype(np.int64), tiling)
        if n.is_codebook:
            table = np.asarray(n.table(), dtype=np.float64)
            q = table[per_el, ct.astype(np.int64)]
        else:
            q = decode_codes(ct, n)
            if tiling.Sc:
                shift = per_el
        y = q * pow2(np.where(nan_tiles, 0, sexp))[..., None]
        if tiling.Sc and not n.is_codebook:
            y = y * pow2(-shift)
        y = np.where(nan_tiles[..., None], np.nan, y).astype(np.float32)
    else:
        sc = decode_codes(sc_codes, s.scale).astype(np.float32)
        if s.zero is not None:
            if zero is None:
                raise ValueError(f"{dt.name}: dequantizing needs the zero point tensor")
            zp = decode_codes(tiling.tile_ungrid(np.asarray(zero)), s.zero)
            q = decode_codes(ct, n)
            with np.errstate(invalid="ignore"):
                if s.zero.is_float:
                    q, zp = q.astype(np.float32), zp.astype(np.float32)
                    y = (q * sc[..., None]).astype(np.float32) + zp[..., None]
                else:
                    # the exact difference (float64), rounded once, as the cast computes it
                    diff = (q - zp[..., None]).astype(np.float32)
                    y = (diff * sc[..., None]).astype(np.float32)
        else:
            eff = sc
            if s.tenscale is not None:
                if tenscale is None:
                    raise ValueError(f"{dt.name}: dequantizing needs the tensor scale")
                ts = decode_codes(np.asarray(tenscale).reshape(-1)[:1], s.tenscale).astype(
                    np.float32
                )[0]
                eff = (sc * ts).astype(np.float32)
            q = decode_codes(ct, n).astype(np.float32)
            with np.errstate(invalid="ignore"):
                y = q * eff[..., None]
        y = np.where(np.isnan(sc)[..., None], np.float32(np.nan), y).astype(np.float32)
    return tiling.from_tiles(_canonical_nan(y))


def element_count(shape: tuple[int, ...]) -> int:
    """Number of elements of ``shape``."""
    return math.prod(shape)
