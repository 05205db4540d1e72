"""Triton engine: the reference's casts on torch tensors, bit for bit (architecture decision 12).

Four kernels serve every supported data type. What selects code or block shapes is
``tl.constexpr`` (scale kind, element float/int, tile layout, stochastic rounding, float32 or
16-bit data); format numbers (exponent ranges, biases, thresholds, codes, the round mode, the
NaN policy, bfloat16 vs float16, which outputs are wanted) are runtime arguments kept out of
Triton's int specialisation, so one compile serves many formats and modes:

- `_quant_kernel`: tile statistics (or precomputed ones), the scale (exponent, float, float
  with a tensor scale, float with an int or float zero point), element rounding, values
  (virtual), element codes, scale and zero-point codes, MX shift bits, the tensor-scale code.
- `_stats_kernel`: per-chunk finite absmax, NaN/Inf flags and (zero points) min/max, for
  tiles too long for one program (over 1024 elements, tensor scales, NVFP4's tensor amax).
- `_dequant_kernel`: codes + scales (+ zero points, shift bits, tensor scale) -> values.
- `_prune_kernel`: N:M sparsity, a pruned copy of the input and the keep mask.

Element rounding is integer arithmetic on the float32 bits (never a float8 conversion, whose
rounding and saturation differ), with the reference's stochastic rule. Floating-point
operations appear only where the reference itself computes in float32 (float scales:
``amax / maxfloat``, ``x / scale``, ``q * scale``, zero points), use correctly rounded
division, and are launched with fused multiply-add off.

Geometry (layout.py, 1-D tiles): the input is seen as ``(outer, C, inner)`` with ``C`` the
tiled axis. A *tile instance* is ``(o, j, i)`` - tile ``j`` of row ``(o, i)`` - numbered in the
order of the scale grid, so the grid index of a tile is its instance number. A non-last
axis is read with strided loads (stride ``inner``); no transposed copy is made.
Non-contiguous inputs are copied to contiguous memory first (the stochastic index is the
element's flat C-order index, which needs that order anyway). 2-D tiles are cast as the rows
of a padded copy holding one tile per row (subtiles contiguous), with the flat input index
alongside for stochastic rounding.

Not implemented here (`NotImplementedError` names them): codebooks (triton_codebook.py),
element formats over 16 bits other than float32 and ints up to 24 bits (the integer rounding
holds 25-bit magnitudes; the reference decodes no other wide floats), float scales wider than
float32, zero points over 16 bits, exponent scales over 10 bits (the reference's float64
powers overflow beyond; native stops there too).
"""

# Kernel constexprs are upper case (Triton's convention), runtime format numbers lower case; tile
# geometry keeps layout.py's names (C, TC, nC).
# ruff: noqa: N803, N815

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from onnxq.cast.elements import _table, nan_code
from onnxq.cast.layout import Tiling
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.formats.modes import CastMode, NanPolicy, RoundMode, ScaleMode
from onnxq.formats.number import InfNaN, NumberSpec

__all__ = ["dequantize", "pack_bits", "plan", "quantize", "to_qtensor", "unpack_bits", "upcast"]

_ROUND = {RoundMode.EVEN: 0, RoundMode.AWAY: 1, RoundMode.ZERO: 2, RoundMode.STOCHASTIC: 3}
_SMODE = {
    ScaleMode.FLOOR: 0,
    ScaleMode.CEIL: 1,
    ScaleMode.MIDMAX: 2,
    ScaleMode.TOPBINADE: 3,
    ScaleMode.RCEIL: 3,
    ScaleMode.OPTION3: 4,
    ScaleMode.EVEN: 4,
}
_IN_KIND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# The data type's top exponent and mantissa bits (its largest finite value, which bounds the
# element clamp) and the float32 magnitude from which rounding to it gives Inf.
_FINITE = {
    torch.float32: (127, 23, float("inf"), float(np.finfo(np.float32).max)),
    torch.float16: (15, 10, 65520.0, 65504.0),
    torch.bfloat16: (127, 7, float(2**128 - 2**119), float(2**128 - 2**120)),
}
_MAX_SINGLE_TILE = 1024  # longer tiles take two passes (statistics, then the cast)
_BLOCK = 4096  # elements per program


# -- format parameters ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _ElemFmt:
    """Constexpr parameters of an element (or float scale) format."""

    is_float: bool
    mbits: int
    emin: int
    emax: int
    maxm: int  # floats: maxfloat / 2^(emax - mbits); ints: the largest magnitude
    bits: int
    negzero: bool
    has_inf: bool
    nan_code: int
    inf_code: int


def _elem_fmt(spec: NumberSpec) -> _ElemFmt:
    if spec.is_float:
        maxm = int(spec.maxfloat / 2.0 ** (spec.emax - spec.mbits))
        nan = nan_code(spec)
        inf = 0
        if spec.has_inf:
            inf = (
                ((1 << spec.ebits) - 1) << spec.mbits
                if spec.infnan is InfNaN.IEEE
                else (1 << (spec.bits - 1)) - 1
            )
        return _ElemFmt(
            True, spec.mbits, spec.emin, spec.emax, maxm, spec.bits,
            spec.has_negative_zero, spec.has_inf, nan, inf,
        )  # fmt: skip
    return _ElemFmt(False, 0, 0, spec.emax, int(spec.maxfloat), spec.bits, False, False, 0, 0)


def _code_torch_dtype(bits: int) -> torch.dtype:
    if bits <= 8:
        return torch.uint8
    if bits <= 16:
        return torch.uint16
    return torch.uint32


def _store_dtype(bits: int) -> torch.dtype:
    """What the kernels write (signed types of the same width; viewed unsigned after)."""
    if bits <= 8:
        return torch.uint8
    if bits <= 16:
        return torch.int16
    return torch.int32


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything the kernels need to know about one cast, checked for support.

    2-D tiles are cast as rows of a padded copy that holds one tile per row, in subtile
    order (`_to_tile_rows`): the geometry fields then describe that copy.
    """

    dt: DataType
    tiling: Tiling
    outer: int
    inner: int
    C: int
    TC: int  # elements per tile along the axis
    nC: int
    n_inst: int
    skind: int  # 0 unscaled, 1 exponent scale, 2 float scale, 3/4 float scale + int/float zero
    single: bool  # one program holds whole tiles
    nsub: int
    sub: int
    sub_cols: int
    elem: _ElemFmt
    sfmt: _ElemFmt | None
    tfmt: _ElemFmt | None
    zfmt: _ElemFmt | None

    @property
    def rows(self) -> bool:
        """2-D tiles: the kernels see one tile per row of a copy."""
        return self.tiling.kind == "2d"

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """Scale grid layout (layout.py `tile_grid`)."""
        t = self.tiling
        if t.kind == "tensor":
            return (1,)
        if t.kind == "2d":
            return _grid_2d(t, t.nR, t.nC)
        s, a = t.shape, t.axis
        return (*s[:a], self.nC, *s[a + 1 :])

    @property
    def meta_shape(self) -> tuple[int, ...]:
        """MX shift-bit grid layout (layout.py `sub_grid`)."""
        t = self.tiling
        if t.kind == "2d":
            return _grid_2d(t, *t.sub_counts)
        s, a = t.shape, t.axis
        return (*s[:a], self.sub_cols, *s[a + 1 :])


def _grid_2d(t: Tiling, rows: int, cols: int) -> tuple[int, ...]:
    g = (*t.moved_shape[:-2], rows, cols)
    return (*g[: t.axis], g[-1], *g[t.axis : -1])  # moveaxis(-1, axis)


def _float32_like(n: NumberSpec) -> bool:
    """Codes that are float32 bits (the reference's only float elements over 16 bits)."""
    return n.is_float and n.bits == 32 and n.ebits == 8 and n.infnan is InfNaN.IEEE


def plan(shape: tuple[int, ...], dt: DataType, axis: int) -> _Plan:
    """Check that the Triton engine can do this cast and work out its geometry.

    Raises:
        NotImplementedError: the format or layout is not implemented in Triton (the message
            names what is missing).
    """
    n, s = dt.nspec, dt.sspec
    missing = f"the Triton engine does not implement {{}} ({dt.name}); use backend='reference'"
    if isinstance(n, Codebook):
        raise NotImplementedError(missing.format("codebook formats"))
    if n.bits > 16 and not (_float32_like(n) or (not n.is_float and n.bits <= 24)):
        raise NotImplementedError(
            missing.format("element formats over 16 bits other than float32 and ints up to 24")
        )
    if s is not None:
        for extra in (s.scale, s.tenscale):
            if extra is not None and extra.is_float and (extra.bits > 32 or extra.mbits > 23):
                raise NotImplementedError(missing.format("float scales wider than float32"))
        if s.scale.is_exponent and s.scale.ebits > 10:
            raise NotImplementedError(missing.format("exponent scales over 10 bits (as native)"))
        if s.zero is not None and s.zero.bits > 16:
            raise NotImplementedError(missing.format("zero points over 16 bits"))
    tiling = Tiling.build(tuple(shape), axis, s)
    size = math.prod(shape)
    sfmt = tfmt = zfmt = None
    nsub, sub, sub_cols = 1, 0, 0
    if s is None:
        skind = 0
    elif s.scale.is_exponent:
        skind = 1
    elif s.zero is None:
        skind = 2
    else:
        skind = 4 if s.zero.is_float else 3
    if s is None or tiling.kind == "tensor":
        outer, inner, C, TC, nC = 1, 1, size, size, 1
    elif tiling.kind == "2d":
        t = tiling
        outer, inner, C, nC = t.B * t.nR * t.nC, 1, t.tile_elems, 1
        TC = C
        if t.Sc:
            sub, nsub, sub_cols = t.Sr * t.Sc, t.n_sub, t.n_sub
    else:
        a = tiling.axis
        outer, inner, C = math.prod(shape[:a]), math.prod(shape[a + 1 :]), shape[a]
        TC, nC = tiling.Tc, tiling.nC
        if tiling.Sc:
            sub, nsub = tiling.Sc, tiling.Tc // tiling.Sc
            sub_cols = -(-C // tiling.Sc)
    if skind >= 2:
        sfmt = _elem_fmt(s.scale)
        if s.tenscale is not None:
            tfmt = _elem_fmt(s.tenscale)
        if skind == 4:
            zfmt = _elem_fmt(s.zero)
    # one scale per tensor always takes two passes: no compile per tensor size
    single = (
        skind != 0 and tiling.kind != "tensor" and triton.next_power_of_2(TC) <= _MAX_SINGLE_TILE
    )
    return _Plan(
        dt, tiling, outer, inner, C, TC, nC, outer * nC * inner, skind, single, nsub, sub,
        sub_cols, _elem_fmt(n), sfmt, tfmt, zfmt,
    )  # fmt: skip


def _hash_key(seed: int) -> int:
    """mix32(lo32(seed) ^ 0x9E3779B9) as a signed int32 (elements.py `stochastic_bits`)."""
    x = (seed & 0xFFFFFFFF) ^ 0x9E3779B9
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    x ^= x >> 16
    return x - (1 << 32) if x >= 1 << 31 else x


# -- device helpers ---------------------------------------------------------------------------
@triton.jit
def _ilog2(n):
    # floor(log2 n) for 1 <= n <= 2^24: the exponent of n's float32 value (exact conversion)
    f = n.to(tl.float32).to(tl.int32, bitcast=True)
    return ((f >> 23) & 0xFF) - 127


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _rand24(idx, key):
    # 24 random bits of (seed, flat index): elements.py `stochastic_bits`
    lo = (idx & 0xFFFFFFFF).to(tl.uint32)
    hi = (idx >> 32).to(tl.uint32)
    h = _mix32(lo ^ _mix32(hi ^ key.to(tl.uint32)))
    return (h >> 8).to(tl.int32)


@triton.jit
def _round_bits(M, sh, rand, rmode, STOCH: tl.constexpr):
    # round(M / 2^sh) for 0 <= M < 2^25 (sh <= 0: exact left shift); shifts clamped: no UB.
    # rmode (runtime) 0 even, 1 away, 2 zero; STOCH: the reference's stochastic rule.
    shr = tl.minimum(tl.maximum(sh, 0), 30)
    shl = tl.minimum(tl.maximum(-sh, 0), 30)
    fl = M >> shr
    rem = M - (fl << shr)
    half = 1 << tl.maximum(shr - 1, 0)
    if STOCH:
        # floor(frac * 2^24) with frac = rem / 2^sh, exactly
        thr = tl.where(
            sh <= 24,
            rem << tl.maximum(24 - shr, 0),
            rem >> tl.minimum(tl.maximum(sh - 24, 0), 30),
        )
        up = rand < thr
    else:
        tie_up = (((fl & 1) == 1) & (rmode == 0)) | (rmode == 1)
        up = (rem > half) | ((rem == half) & tie_up)
    return tl.where(sh > 0, fl + up.to(tl.int32), M << shl)


@triton.jit
def _quant_elem(
    xb,
    sexp,
    rand,
    IS_FLOAT: tl.constexpr,
    mbits,
    emin,
    emax,
    maxm,
    rmode,
    full_int,
    STOCH: tl.constexpr,
):
    # Round |xb| * 2^-sexp onto the element grid (elements.py `quantize_values`), saturating
    # (Inf lanes too; NaN lanes are the caller's). Returns (n, s): magnitude n * 2^s.
    ab = xb & 0x7FFFFFFF
    E = ab >> 23
    F = ab & 0x7FFFFF
    M = tl.where(E > 0, F | 0x800000, F)
    ex = tl.where(E > 0, E - 127, -126)
    flx = _ilog2(tl.maximum(M, 1)) + ex - 23
    if IS_FLOAT:
        s = tl.maximum(flx - sexp, emin) - mbits
    else:
        s = flx * 0 + sexp * 0
    n = _round_bits(M, s + sexp - ex + 23, rand, rmode, STOCH)
    if IS_FLOAT:
        top = emax - mbits
        # zeros never saturate (exponent scales over 8 bits can make flx - sexp huge)
        over = ((s > top) | ((s == top) & (n > maxm)) | (E == 255)) & (ab != 0)
        n = tl.where(over, maxm, n)
        s = tl.where(over, top, s)
    else:
        lim = maxm + ((xb < 0) & (full_int != 0)).to(tl.int32)
        # |v| >= 2^24 would overflow the shift: it saturates anyway (ints are <= 16 bits)
        n = tl.where((n > lim) | (E == 255) | ((flx - sexp >= 24) & (ab != 0)), lim, n)
    return n, s


@triton.jit
def _finite_clamp(n, s, k, IS_FLOAT: tl.constexpr, mbits, emax, maxm, f_emax, f_mbits):
    # Lower magnitude n * 2^s (element units, decoded as n * 2^(s + k)) to the largest grid
    # value whose decoded value is at most the data type's largest finite value
    # (2^(f_mbits + 1) - 1) * 2^(f_emax - f_mbits): reference `finite_bound`.
    if IS_FLOAT:
        # the top of binade f_emax - k, on the element grid (its mantissa or the type's, the
        # coarser), not above maxfloat
        m2 = tl.minimum(mbits, f_mbits)
        sb = f_emax - mbits - k
        nb = ((2 << m2) - 1) << (mbits - m2)
        nb = tl.where(sb == emax - mbits, tl.minimum(nb, maxm), nb)
        over = ((s > sb) | ((s == sb) & (n > nb))) & (n != 0)
        return tl.where(over, nb, n), tl.where(over, sb, s)
    else:
        sh = f_emax - f_mbits - k
        big = sh + f_mbits + 1 > 24  # the bound exceeds every int element (<= 24 bits)
        up = ((2 << f_mbits) - 1) << tl.minimum(tl.maximum(sh, 0), 24)
        down = ((2 << f_mbits) - 1) >> tl.minimum(tl.maximum(-sh, 0), 31)
        nb = tl.where(sh >= 0, up, down)
        return tl.where(big, n, tl.minimum(n, nb)), s


@triton.jit
def _float_pred(n, s, IS_FLOAT: tl.constexpr, mbits, emin):
    # the grid value just below n * 2^s (n > 0)
    if IS_FLOAT:
        wrap = (n == (1 << mbits)) & (s > emin - mbits)
        return tl.where(wrap, (2 << mbits) - 1, n - 1), tl.where(wrap, s - 1, s)
    else:
        return n - 1, s


@triton.jit
def _make_f32(n, pe):
    # float32 bits of n * 2^pe (0 <= n <= 2^24), round-half-even below the subnormal grid
    L = _ilog2(tl.maximum(n, 1))
    field = pe + L + 127
    norm = tl.where(L <= 23, n << tl.maximum(23 - L, 0), n >> tl.maximum(L - 23, 0))
    normal = (field << 23) + (norm & 0x7FFFFF)
    # subnormal bits are linear in the value, so a carry to 2^23 lands on the smallest normal
    sub = _round_bits(n, -149 - pe, 0, 0, False)
    bits = tl.where(field >= 1, normal, sub)
    bits = tl.where(field >= 255, 0x7F800000, bits)
    return tl.where(n == 0, 0, bits)


@triton.jit
def _float_code(n, s, mbits, emin):
    # magnitude code of n * 2^s on a float grid (n may be 2^(mbits+1): the carry is right)
    return tl.where(n == 0, 0, ((s - emin + mbits) << mbits) + n)


@triton.jit
def _scale_exp(
    amax_b,
    IS_FLOAT: tl.constexpr,
    MBITS: tl.constexpr,
    EMAX: tl.constexpr,
    SMODE: tl.constexpr,
    MID_T: tl.constexpr,
    TOP_T: tl.constexpr,
    LOW: tl.constexpr,
    HIGH: tl.constexpr,
):
    # E8M0 exponent of a tile from its absmax bits (reference `_scale_exponent`); constexpr
    # form (triton_fast.py), the same as `_scale_exp_t` with `_bump_threshold`
    E = amax_b >> 23
    F = amax_b & 0x7FFFFF
    M = tl.where(E > 0, F | 0x800000, F)
    lg = _ilog2(tl.maximum(M, 1))
    maxexp = lg + tl.where(E > 0, E - 127, -126) - 23
    sig = M << tl.maximum(23 - lg, 0)  # significand normalised to [2^23, 2^24)
    bump = maxexp * 0
    if IS_FLOAT:
        if SMODE == 1:
            bump = (sig > 0x800000).to(tl.int32)
        elif SMODE == 2:
            bump = (sig > MID_T).to(tl.int32)
        elif SMODE == 3:
            bump = (sig > TOP_T).to(tl.int32)
        elif SMODE == 4:
            if MBITS < 23:
                low = sig & ((1 << (23 - MBITS)) - 1)
                ones = (sig >> (23 - MBITS)) == (1 << (MBITS + 1)) - 1
                bump = (ones & (low >= (1 << (22 - MBITS)))).to(tl.int32)
    sexp = tl.minimum(tl.maximum(maxexp + bump - EMAX, LOW), HIGH)
    return tl.where(amax_b == 0, LOW, sexp), maxexp


@triton.jit
def _scale_exp_t(amax_b, bump_t, emax, low, high):
    # `_scale_exp` with runtime numbers: every scale mode bumps when the normalised
    # significand exceeds a threshold (`_bump_threshold`), so one compile serves them all
    E = amax_b >> 23
    F = amax_b & 0x7FFFFF
    M = tl.where(E > 0, F | 0x800000, F)
    lg = _ilog2(tl.maximum(M, 1))
    maxexp = lg + tl.where(E > 0, E - 127, -126) - 23
    sig = M << tl.maximum(23 - lg, 0)
    bump = (sig > bump_t).to(tl.int32)
    sexp = tl.minimum(tl.maximum(maxexp + bump - emax, low), high)
    return tl.where(amax_b == 0, low, sexp), maxexp


@triton.jit
def _unit_offsets(
    pid,
    n_units,
    n_chunks,
    C,
    TC,
    inner,
    nC,
    LAST: tl.constexpr,
    TILE: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    BT: tl.constexpr,
):
    # Units are (tile instance, chunk of TILE elements); offsets are int64 (tensors over
    # 2^31). `intile`: lanes of the padded tile (zeros past the axis end count, as in the
    # reference's padding; lanes past the tile do not).
    u = pid.to(tl.int64) * BT + tl.arange(0, BT).to(tl.int64)
    u_ok = u < n_units
    inst = u // n_chunks
    q = u - inst * n_chunks
    if LAST:
        row = inst // nC
        j = inst - row * nC
        base = row * C
        i = row * 0
        o = row
    else:
        i = inst % inner
        t = inst // inner
        j = t % nC
        o = t // nC
        base = o * C * inner + i
    kk = tl.arange(0, NSUB)[:, None] * SUB + tl.arange(0, SUB)[None, :]
    pos = q[:, None, None] * TILE + kk[None, :, :]
    c = j[:, None, None] * TC + pos
    intile = u_ok[:, None, None] & (pos < TC)
    ok = intile & (c < C)
    if LAST:
        off = base[:, None, None] + c
    else:
        off = base[:, None, None] + c * inner
    return u_ok, inst, q, j, o, i, off, ok, intile


@triton.jit
def _meta_offsets(
    u_ok,
    q,
    j,
    o,
    i,
    TC,
    sub_cols,
    inner,
    LAST: tl.constexpr,
    TILE: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
):
    # grid offsets of a unit's NSUB subtiles (layout.py `sub_grid`); padding-only ones masked
    sidx = (j[:, None] * TC + q[:, None] * TILE) // SUB + tl.arange(0, NSUB)[None, :]
    if LAST:
        moff = o[:, None] * sub_cols + sidx
    else:
        moff = o[:, None] * sub_cols * inner + sidx * inner + i[:, None]
    return moff, u_ok[:, None] & (sidx < sub_cols)


@triton.jit
def _load_bits(x_ptr, off, ok, IN_KIND: tl.constexpr):
    # float32 bits of the input (exact widening of float16 / bfloat16) and the raw bits
    raw = tl.load(x_ptr + off, mask=ok, other=0)
    if IN_KIND == 0:
        xb = raw
    elif IN_KIND == 1:
        xb = raw.to(tl.float16, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True)
    else:
        xb = raw.to(tl.int32) << 16
    return xb, raw


@triton.jit
def _load_any(x_ptr, off, ok, HALF: tl.constexpr, bf16):
    # float32 bits of the input (exact widening of float16 / bfloat16) and the raw bits;
    # 16-bit data picks its type at run time (one compile for both)
    raw = tl.load(x_ptr + off, mask=ok, other=0)
    if HALF:
        hf = raw.to(tl.float16, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True)
        xb = tl.where(bf16 != 0, raw.to(tl.int32) << 16, hf)
    else:
        xb = raw
    return xb, raw


@triton.jit
def _store_values(y_ptr, off, ok, yb, elem_nan, tile_nan, HALF: tl.constexpr, bf16):
    # Convert float32 bits to the output type; every NaN is the canonical quiet NaN
    # (reference._canonical_nan), whatever the input's payload.
    nan = elem_nan | tile_nan | ((yb & 0x7FFFFFFF) > 0x7F800000)
    if HALF:
        h = yb.to(tl.float32, bitcast=True).to(tl.float16).to(tl.int16, bitcast=True)
        f16 = tl.where(nan, 0x7E00, h.to(tl.int32))
        mag = yb & 0x7FFFFFFF
        r = (mag + 0x7FFF + ((mag >> 16) & 1)) >> 16  # round-half-even to bfloat16
        b16 = tl.where(nan, 0x7FC0, r | ((yb >> 16) & 0x8000))
        out = tl.where(bf16 != 0, b16, f16).to(tl.int16)
    else:
        out = tl.where(nan, 0x7FC00000, yb)
    tl.store(y_ptr + off, out, mask=ok)


@triton.jit
def _okey(b):
    # float bits -> an int32 ordered like the floats (-0 just below +0); an involution
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def _zswap(k):
    # swap the keys of -0 and +0: for the minimum, +0 below -0 (numpy's min keeps the last of
    # equal values, and a tile's zero padding, +0, comes last)
    return tl.where((k == 0) | (k == -1), ~k, k)


# -- kernels ----------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["n_units", "n_chunks", "C", "TC", "inner", "nC", "bf16"])
def _stats_kernel(
    x_ptr,
    amax_ptr,
    flag_ptr,
    lo_ptr,
    hi_ptr,
    n_units,
    n_chunks,
    C,
    TC,
    inner,
    nC,
    bf16,
    HALF: tl.constexpr,
    LAST: tl.constexpr,
    TILE: tl.constexpr,
    BT: tl.constexpr,
    MINMAX: tl.constexpr,
):
    pid = tl.program_id(0)
    u_ok, _inst, _q, _j, _o, _i, off, ok, intile = _unit_offsets(
        pid, n_units, n_chunks, C, TC, inner, nC, LAST, TILE, 1, TILE, BT
    )
    xb, _raw = _load_any(x_ptr, off, ok, HALF, bf16)
    ab = xb & 0x7FFFFFFF
    finite = ab < 0x7F800000
    amax = tl.max(tl.max(tl.where(finite, ab, 0), axis=2), axis=1)
    # flags: 2 = some NaN/Inf, 3 = some NaN (NaN implies non-finite, so max() is an OR)
    nf = tl.max(tl.max((~finite & ok).to(tl.int32), axis=2), axis=1)
    isnan = tl.max(tl.max(((ab > 0x7F800000) & ok).to(tl.int32), axis=2), axis=1)
    u = pid.to(tl.int64) * BT + tl.arange(0, BT)
    tl.store(amax_ptr + u, amax, mask=u_ok)
    tl.store(flag_ptr + u, (2 * nf + isnan).to(tl.int8), mask=u_ok)
    if MINMAX:
        # ordered keys of the finite min and max (the host reduces chunks with min / max)
        fin = finite & intile
        lo = tl.min(tl.min(tl.where(fin, _zswap(_okey(xb)), 0x7FFFFFFF), axis=2), axis=1)
        hi = tl.max(tl.max(tl.where(fin, _okey(xb), -0x7FFFFFFF - 1), axis=2), axis=1)
        tl.store(lo_ptr + u, lo, mask=u_ok)
        tl.store(hi_ptr + u, hi, mask=u_ok)


# Format numbers are runtime arguments (one compile serves every format of a kind);
# Triton would still specialise ints equal to 1 or divisible by 16, hence do_not_specialize.
_QUANT_RUNTIME = [
    "n_units", "n_chunks", "C", "TC", "inner", "nC", "sub_cols", "key", "bf16", "want_y",
    "want_codes", "rmode", "nan_nf",
    "nan_nan", "full_int", "keep_inf", "e_mbits", "e_emin", "e_emax", "e_maxm", "e_bits",
    "e_negzero", "e_nancode", "e_infcode", "bump_t", "s_low", "s_high", "s_bias", "s_nan",
    "s_mbits", "s_emin", "s_emax", "s_maxm", "t_mbits", "t_emin", "t_emax", "t_maxm",
    "z_mbits", "z_emin", "z_emax", "z_maxm", "z_bits", "z_negzero", "f_emax", "f_mbits",
]  # fmt: skip


@triton.jit(do_not_specialize=_QUANT_RUNTIME)
def _quant_kernel(
    x_ptr,
    y_ptr,
    code_ptr,
    scale_ptr,
    meta_ptr,
    zero_ptr,
    amax_ptr,
    flag_ptr,
    lo_ptr,
    hi_ptr,
    top_ptr,
    ts_code_ptr,
    idx_ptr,
    n_units,
    n_chunks,
    C,
    TC,
    inner,
    nC,
    sub_cols,
    key,
    bf16,
    want_y,
    want_codes,
    rmode,
    nan_nf,
    nan_nan,
    full_int,
    keep_inf,
    e_mbits,
    e_emin,
    e_emax,
    e_maxm,
    e_bits,
    e_negzero,
    e_nancode,
    e_infcode,
    bump_t,
    s_low,
    s_high,
    s_bias,
    s_nan,
    el_maxf,
    s_mbits,
    s_emin,
    s_emax,
    s_maxm,
    ts_denom,
    t_mbits,
    t_emin,
    t_emax,
    t_maxm,
    z_mbits,
    z_emin,
    z_emax,
    z_maxm,
    z_bits,
    z_negzero,
    f_emax,
    f_mbits,
    f_over,
    f_max,
    HALF: tl.constexpr,
    PRE: tl.constexpr,
    LAST: tl.constexpr,
    TILE: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    BT: tl.constexpr,
    SKIND: tl.constexpr,  # 0 none, 1 exponent, 2 float (TS: tensor scale), 3/4 int/float zero
    SHIFT: tl.constexpr,
    STOCH: tl.constexpr,
    E_FLOAT: tl.constexpr,
    TS: tl.constexpr,
    IDX: tl.constexpr,  # stochastic index from idx_ptr (2-D tiles: rows of a copy)
):
    pid = tl.program_id(0)
    u_ok, inst, q, j, o, i, off, ok, intile = _unit_offsets(
        pid, n_units, n_chunks, C, TC, inner, nC, LAST, TILE, NSUB, SUB, BT
    )
    xb, _raw = _load_any(x_ptr, off, ok, HALF, bf16)
    ab = xb & 0x7FFFFFFF
    finite = ab < 0x7F800000
    rand = off.to(tl.int32) * 0
    if STOCH:
        if IDX:
            rand = _rand24(tl.load(idx_ptr + off, mask=ok, other=0), key)
        else:
            rand = _rand24(off, key)
    neg = xb < 0
    tnan = u_ok & False
    if SKIND != 0:
        if PRE:
            amax_b = tl.load(amax_ptr + inst, mask=u_ok, other=0)
            flags = tl.load(flag_ptr + inst, mask=u_ok, other=0).to(tl.int32)
            any_nf = flags >= 2
            any_nan = flags == 3
        else:
            absf = tl.where(finite, ab, 0)
            sub_max = tl.max(absf, axis=2)
            amax_b = tl.max(sub_max, axis=1)
            nf3 = (~finite).to(tl.int32)
            any_nf = tl.max(tl.max(nf3, axis=2), axis=1) > 0
            any_nan = tl.max(tl.max((ab > 0x7F800000).to(tl.int32), axis=2), axis=1) > 0
        tnan = tnan | (any_nf & (nan_nf != 0)) | (any_nan & (nan_nan != 0))
    tile_nan = ok & tnan[:, None, None]
    xf = xb.to(tl.float32, bitcast=True)
    if SKIND >= 2:
        # float scale: scale = cast(amax / maxfloat [/ tensor scale]); v = x / scale (float32)
        amax_f = amax_b.to(tl.float32, bitcast=True)
        if SKIND == 2:
            raw_s = tl.div_rn(amax_f, tl.zeros_like(amax_f) + el_maxf)
        else:
            # zero point: the scale spans [min, max] of the finite values (with 0 for ints)
            if PRE:
                lo_k = tl.load(lo_ptr + inst, mask=u_ok, other=0)
                hi_k = tl.load(hi_ptr + inst, mask=u_ok, other=0)
            else:
                fin = finite & intile
                lo_k = tl.min(tl.min(tl.where(fin, _zswap(_okey(xb)), 0x7FFFFFFF), axis=2), axis=1)
                hi_k = tl.max(tl.max(tl.where(fin, _okey(xb), -0x7FFFFFFF - 1), axis=2), axis=1)
            lo_b = tl.where(lo_k == 0x7FFFFFFF, 0, _okey(_zswap(lo_k)))
            hi_b = tl.where(hi_k == -0x7FFFFFFF - 1, 0, _okey(hi_k))
            lo = lo_b.to(tl.float32, bitcast=True)
            hi = hi_b.to(tl.float32, bitcast=True)
            if SKIND == 3:
                lo = tl.minimum(lo, 0.0)
                hi = tl.maximum(hi, 0.0)
                raw_s = tl.div_rn(hi - lo, tl.zeros_like(hi) + el_maxf)
            else:
                zn, zs = _quant_elem(lo_b, 0, 0, True, z_mbits, z_emin, z_emax, z_maxm, 0, 0, False)
                zsgn = (lo_b < 0) & ((zn != 0) | (z_negzero != 0))
                zf = (_make_f32(zn, zs) | (zsgn.to(tl.int32) << 31)).to(tl.float32, bitcast=True)
                d = tl.div_rn(hi - zf, tl.zeros_like(hi) + el_maxf)
                raw_s = tl.where(d > 0, d, 0.0)
        if TS:
            top = tl.load(top_ptr)
            tsr = tl.div_rn(top, tl.zeros_like(top) + ts_denom)
            tsr = tsr.to(tl.int32, bitcast=True)
            tn, tsx = _quant_elem(tsr, 0, 0, True, t_mbits, t_emin, t_emax, t_maxm, 0, 0, False)
            ts = _make_f32(tn, tsx).to(tl.float32, bitcast=True)
            raw_s = tl.where(ts > 0, tl.div_rn(raw_s, tl.broadcast_to(ts, raw_s.shape)), 0.0)
            tl.store(ts_code_ptr, _float_code(tn, tsx, t_mbits, t_emin), mask=pid == 0)
        rb = raw_s.to(tl.int32, bitcast=True)
        sn, ssx = _quant_elem(rb, 0, 0, True, s_mbits, s_emin, s_emax, s_maxm, 0, 0, False)
        sc = _make_f32(sn, ssx).to(tl.float32, bitcast=True)
        scode = tl.where(tnan, s_nan, _float_code(sn, ssx, s_mbits, s_emin))
        if TS:
            eff = sc * ts
        else:
            eff = sc
        eff3 = eff[:, None, None]
        # From the input: a zero scale zeroes v, but NaN stays NaN (reference._float_scaled).
        elem_nan = ab > 0x7F800000
        if SKIND == 2:
            v = tl.where(eff3 > 0, tl.div_rn(xf, tl.broadcast_to(eff3, xf.shape)), 0.0)
            vb = v.to(tl.int32, bitcast=True)
            n, s = _quant_elem(
                vb, 0, rand, E_FLOAT, e_mbits, e_emin, e_emax, e_maxm, rmode, full_int, STOCH
            )
            vneg = vb < 0
            # products that round past the data type's range step down the grid (reference
            # `_product_bound`; two steps cover every rounding of the scale)
            for _step in tl.static_range(2):
                yt = _make_f32(n, s).to(tl.float32, bitcast=True) * eff3
                bad = (yt >= f_over) & (n != 0)
                pn, ps = _float_pred(n, s, E_FLOAT, e_mbits, e_emin)
                n = tl.where(bad, pn, n)
                s = tl.where(bad, ps, s)
            sgn = vneg & ((n != 0) | (e_negzero != 0))
            qb = _make_f32(n, s) | (sgn.to(tl.int32) << 31)
            yb = (qb.to(tl.float32, bitcast=True) * eff3).to(tl.int32, bitcast=True)
        else:
            # uint elements: q = clip(round(v) [+ zp], 0, qmax) (reference._zero_point_scaled)
            if SKIND == 3:
                z = tl.where(sc > 0, tl.div_rn(-lo, sc), 0.0).to(tl.int32, bitcast=True)
                zp, _zs = _quant_elem(z, 0, 0, False, 0, 0, 0, e_maxm, 0, 0, False)
                zcode = zp
                num = xf
            else:
                zcode = _float_code(zn, zs, z_mbits, z_emin) | (zsgn.to(tl.int32) << (z_bits - 1))
                zp = zn * 0
                num = xf - zf[:, None, None]
            v = tl.where(eff3 > 0, tl.div_rn(num, tl.broadcast_to(eff3, xf.shape)), 0.0)
            vb = v.to(tl.int32, bitcast=True)
            rn, _rs = _quant_elem(vb, 0, rand, False, 0, 0, 0, 1 << 24, rmode, 0, STOCH)
            zp3 = zp[:, None, None]
            n = tl.minimum(tl.maximum(tl.where(vb < 0, -rn, rn) + zp3, 0), e_maxm)
            # decoded values past the data type's range move toward the zero point (reference
            # `_product_bound` / `_zero_float_top`)
            if SKIND == 3:
                # |q - zp| <= B, the largest B with float32(B * scale) finite in the type:
                # floor(max / scale) within one of it, then checked both ways
                bq = tl.floor(tl.div_rn(tl.zeros_like(sc) + f_max, tl.where(sc > 0, sc, 1.0)))
                bq = tl.where((sc > 0) & (bq < e_maxm), bq, e_maxm * 1.0).to(tl.int32)
                for _step in tl.static_range(2):
                    bq = tl.where((bq > 0) & (bq.to(tl.float32) * sc >= f_over), bq - 1, bq)
                up = (bq < e_maxm) & ((bq + 1).to(tl.float32) * sc < f_over)
                bq = tl.where(up, bq + 1, bq)[:, None, None]
                n = tl.minimum(tl.maximum(n, zp3 - bq), zp3 + bq)
            else:
                for _step in tl.static_range(2):
                    yt = tl.abs(n.to(tl.float32) * eff3 + zf[:, None, None])
                    bad = (yt >= f_over) & (n > 0)
                    n = tl.where(bad, n - 1, n)
            qf = (n - zp3).to(tl.float32)
            if SKIND == 3:
                yb = (qf * eff3).to(tl.int32, bitcast=True)
            else:
                yb = (qf * eff3 + zf[:, None, None]).to(tl.int32, bitcast=True)
            vneg = vb < 0
            sgn = vneg & False
    else:
        if SKIND == 1:
            sexp, maxexp = _scale_exp_t(amax_b, bump_t, e_emax, s_low, s_high)
            sexp3 = sexp[:, None, None]
            if SHIFT:
                # MX: a subtile is shifted when all of it is below 2^floor(log2 amax)
                p2 = tl.where(
                    maxexp >= -126,
                    (maxexp + 127) << 23,
                    1 << tl.minimum(tl.maximum(maxexp + 149, 0), 30),
                )
                if PRE:
                    sub_max = tl.max(tl.where(finite, ab, 0), axis=2)
                below = (sub_max < p2[:, None]) & (amax_b[:, None] != 0)
                sexp3 = sexp3 - below[:, :, None].to(tl.int32)
            scode = tl.where(tnan, s_nan, sexp + s_bias)
        else:
            sexp3 = off.to(tl.int32) * 0
        n, s = _quant_elem(
            xb, sexp3, rand, E_FLOAT, e_mbits, e_emin, e_emax, e_maxm, rmode, full_int, STOCH
        )
        n, s = _finite_clamp(n, s, sexp3, E_FLOAT, e_mbits, e_emax, e_maxm, f_emax, f_mbits)
        vneg = neg
        elem_nan = ab > 0x7F800000
        sgn = neg & ((n != 0) | (e_negzero != 0))
        yb = _make_f32(n, s + sexp3) | (sgn.to(tl.int32) << 31)
        yb = tl.where((ab == 0x7F800000) & (keep_inf != 0), xb, yb)
    if E_FLOAT:
        elem_nan = elem_nan & ~tile_nan
    else:
        elem_nan = elem_nan & False
    # virtual and actual casts share one compile: the unwanted stores are masked off
    _store_values(y_ptr, off, ok & (want_y != 0), yb, elem_nan, tile_nan, HALF, bf16)
    if SKIND >= 3:
        code = n
    elif E_FLOAT:
        code = _float_code(n, s, e_mbits, e_emin) | (sgn.to(tl.int32) << (e_bits - 1))
        infc = e_infcode | (vneg.to(tl.int32) << (e_bits - 1))
        code = tl.where((ab == 0x7F800000) & (keep_inf != 0), infc, code)
        code = tl.where(elem_nan, e_nancode, code)
    else:
        code = tl.where(vneg, -n, n) & ((1 << e_bits) - 1)
    code = tl.where(tile_nan, 0, code)
    wc = want_codes != 0
    tl.store(code_ptr + off, code.to(code_ptr.dtype.element_ty), mask=ok & wc)
    if SKIND != 0:
        first = u_ok & (q == 0) & wc
        tl.store(scale_ptr + inst, scode.to(scale_ptr.dtype.element_ty), mask=first)
    if SKIND >= 3:
        tl.store(zero_ptr + inst, zcode.to(zero_ptr.dtype.element_ty), mask=first)
    if SHIFT:
        moff, mok = _meta_offsets(u_ok, q, j, o, i, TC, sub_cols, inner, LAST, TILE, NSUB, SUB)
        tl.store(meta_ptr + moff, below.to(tl.uint8), mask=mok & wc)


@triton.jit
def _ldexp_bits(qb, k):
    # float32 bits of value(qb) * 2^k, rounded once (finite lanes; others pass through)
    ab = qb & 0x7FFFFFFF
    E = ab >> 23
    F = ab & 0x7FFFFF
    M = tl.where(E > 0, F | 0x800000, F)
    ex = tl.where(E > 0, E - 127, -126)
    out = _make_f32(M, ex - 23 + k) | (qb & -2147483648)
    return tl.where(E == 255, qb, out)


@triton.jit(
    do_not_specialize=[
        "n_units", "n_chunks", "C", "TC", "inner", "nC", "sub_cols", "code_mask", "c_shift",
        "s_bias", "s_nan", "s_mask", "z_mask", "bf16",
    ]
)  # fmt: skip
def _dequant_kernel(
    code_ptr,
    y_ptr,
    scale_ptr,
    meta_ptr,
    zero_ptr,
    tab_ptr,
    stab_ptr,
    ztab_ptr,
    ts_ptr,
    n_units,
    n_chunks,
    C,
    TC,
    inner,
    nC,
    sub_cols,
    code_mask,
    c_shift,
    s_bias,
    s_nan,
    s_mask,
    z_mask,
    bf16,
    HALF: tl.constexpr,
    LAST: tl.constexpr,
    TILE: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    BT: tl.constexpr,
    SKIND: tl.constexpr,
    SHIFT: tl.constexpr,
    WIDE: tl.constexpr,  # codes over 16 bits: float32 bits (c_shift < 0) or ints, no table
    S_F32: tl.constexpr,
    TS: tl.constexpr,
):
    pid = tl.program_id(0)
    u_ok, inst, q, j, o, i, off, ok, _intile = _unit_offsets(
        pid, n_units, n_chunks, C, TC, inner, nC, LAST, TILE, NSUB, SUB, BT
    )
    c = tl.load(code_ptr + off, mask=ok, other=0).to(tl.int32) & code_mask
    if WIDE:
        si = (c << tl.maximum(c_shift, 0)) >> tl.maximum(c_shift, 0)  # sign-extended ints
        qb = tl.where(c_shift < 0, c, si.to(tl.float32).to(tl.int32, bitcast=True))
    else:
        qb = tl.load(tab_ptr + c, mask=ok, other=0)
    tile_nan = ok & False
    if SKIND == 0:
        yb = qb
    elif SKIND == 1:
        sc = tl.load(scale_ptr + inst, mask=u_ok, other=0).to(tl.int32) & s_mask
        nan_t = sc == s_nan
        k3 = tl.where(nan_t, 0, sc - s_bias)[:, None, None]
        if SHIFT:
            moff, mok = _meta_offsets(u_ok, q, j, o, i, TC, sub_cols, inner, LAST, TILE, NSUB, SUB)
            sh = tl.load(meta_ptr + moff, mask=mok, other=0)
            k3 = k3 - sh.to(tl.int32)[:, :, None]
        yb = _ldexp_bits(qb, k3)
        tile_nan = tile_nan | nan_t[:, None, None]
    else:
        sc = tl.load(scale_ptr + inst, mask=u_ok, other=0).to(tl.int32)
        if S_F32:
            scb = sc
        else:
            scb = tl.load(stab_ptr + (sc & s_mask), mask=u_ok, other=0)
        scf = scb.to(tl.float32, bitcast=True)
        if TS:
            eff = scf * tl.load(ts_ptr)
        else:
            eff = scf
        eff3 = eff[:, None, None]
        qf = qb.to(tl.float32, bitcast=True)
        if SKIND == 2:
            yb = (qf * eff3).to(tl.int32, bitcast=True)
            qinf = (qb & 0x7FFFFFFF) == 0x7F800000
            yb = tl.where(qinf & (eff3 == 0), 0x7FC00000, yb)  # Inf * 0: the canonical NaN
            yb = tl.where((qb & 0x7FFFFFFF) > 0x7F800000, 0x7FC00000, yb)
        else:
            zc = tl.load(zero_ptr + inst, mask=u_ok, other=0).to(tl.int32) & z_mask
            zf = tl.load(ztab_ptr + zc, mask=u_ok, other=0).to(tl.float32, bitcast=True)
            if SKIND == 3:
                yb = ((qf - zf[:, None, None]) * eff3).to(tl.int32, bitcast=True)
            else:
                yb = (qf * eff3 + zf[:, None, None]).to(tl.int32, bitcast=True)
        tile_nan = tile_nan | ((scb & 0x7FFFFFFF) > 0x7F800000)[:, None, None]
    _store_values(y_ptr, off, ok, yb, ok & False, tile_nan, HALF, bf16)


@triton.jit(do_not_specialize=["n_groups", "L", "inner", "ng_l", "n_keep", "bf16"])
def _prune_kernel(
    x_ptr,
    y_ptr,
    mask_ptr,
    n_groups,
    L,
    inner,
    ng_l,
    n_keep,
    bf16,
    HALF: tl.constexpr,
    M: tl.constexpr,
    BG: tl.constexpr,
):
    # N:M sparsity (reference `_prune`): keep the n_keep largest magnitudes of each group of M
    # along a dim of length L (stride inner); NaN counts as Inf, ties keep the lower index,
    # positions past the end count as -1. Writes the pruned input and the keep mask.
    g = tl.program_id(0).to(tl.int64) * BG + tl.arange(0, BG).to(tl.int64)
    g_ok = g < n_groups
    i = g % inner
    t = g // inner
    gl = t % ng_l
    o = t // ng_l
    k = tl.arange(0, M)
    pos = gl[:, None] * M + k[None, :]
    ok = g_ok[:, None] & (pos < L)
    off = o[:, None] * L * inner + pos * inner + i[:, None]
    xb, raw = _load_any(x_ptr, off, ok, HALF, bf16)
    ab = xb & 0x7FFFFFFF
    key = tl.where(ok, tl.minimum(ab, 0x7F800000), -1)
    kk = key[:, :, None]  # this element
    kj = key[:, None, :]  # the others of its group
    earlier = (k[None, :] < k[:, None])[None, :, :]
    beats = (kj > kk) | ((kj == kk) & earlier)
    keep = tl.sum(beats.to(tl.int32), axis=2) < n_keep
    tl.store(y_ptr + off, tl.where(keep, raw, 0).to(raw.dtype), mask=ok)
    tl.store(mask_ptr + off, keep.to(tl.uint8), mask=ok)


# -- host side ---------------------------------------------------------------------------------
def _int_view(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def _bf16(dtype: torch.dtype) -> int:
    return int(dtype == torch.bfloat16)


def _programs(n_units: int, bt: int) -> tuple[int]:
    return (triton.cdiv(n_units, bt),)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def _layout(p: _Plan) -> tuple[int, int, int, int, int]:
    """(TILE, NSUB, SUB, n_chunks, BT) of the quantize / dequantize kernels.

    On a GPU, BT and TILE depend on the tile length only, not on the tensor size: each
    distinct set of constexprs is a compile. The interpreter compiles nothing but pays for
    idle lanes, so there they shrink to small tensors.
    """
    if not p.skind:
        tile = _BLOCK
        if _interpreting():
            tile = min(tile, triton.next_power_of_2(p.TC))
        return tile, 1, tile, triton.cdiv(p.TC, tile), 1
    if p.single:
        # tiles of 2-8 elements (and short channels) share the 16-lane compile
        tile = triton.next_power_of_2(p.TC) if p.sub else max(16, triton.next_power_of_2(p.TC))
        nsub, sub = (p.nsub, p.sub) if p.sub else (1, tile)
        bt = max(1, _BLOCK // tile)
        if _interpreting():
            bt = min(bt, triton.next_power_of_2(p.n_inst))
        return tile, nsub, sub, 1, bt
    # long tiles: chunks of whole subtiles, statistics from `_stats`
    nsub, sub = (_BLOCK // p.sub, p.sub) if p.sub else (1, _BLOCK)
    return _BLOCK, nsub, sub, triton.cdiv(p.TC, _BLOCK), 1


def _stats(x: torch.Tensor, tc: int, n_inst: int, nc: int, inner: int, C: int, minmax: bool):
    """Per-instance finite absmax (float32 bits), flags and (``minmax``) ordered-key min/max."""
    tile = min(_BLOCK, triton.next_power_of_2(tc)) if _interpreting() else _BLOCK
    n_chunks = triton.cdiv(tc, tile)
    n_units = n_inst * n_chunks
    amax = torch.empty(n_units, dtype=torch.int32, device=x.device)
    flags = torch.empty(n_units, dtype=torch.int8, device=x.device)
    lo = hi = amax
    if minmax:
        lo, hi = torch.empty_like(amax), torch.empty_like(amax)
    _stats_kernel[_programs(n_units, 1)](
        _int_view(x), amax, flags, lo, hi, n_units, n_chunks, C, tc, inner, nc, _bf16(x.dtype),
        HALF=x.dtype != torch.float32, LAST=inner == 1, TILE=tile, BT=1, MINMAX=minmax,
    )  # fmt: skip
    if n_chunks > 1:
        amax = amax.view(n_inst, n_chunks).amax(dim=1)
        flags = flags.view(n_inst, n_chunks).amax(dim=1)
        if minmax:
            lo = lo.view(n_inst, n_chunks).amin(dim=1)
            hi = hi.view(n_inst, n_chunks).amax(dim=1)
    return amax, flags, lo, hi


def _bump_threshold(e: _ElemFmt, mode: ScaleMode) -> int:
    """`_scale_exp_t`'s threshold (reference `_scale_exponent`).

    The exponent goes up when the normalised 24-bit significand of the tile absmax exceeds it.
    """
    never = 1 << 24
    if not e.is_float:
        return never
    m = e.mbits
    match _SMODE[mode]:
        case 1:  # ceil: anything above a power of two
            return 0x800000
        case 2:  # midmax
            return (2 * e.maxm + 1) << (22 - m) if m <= 22 else e.maxm
        case 3:  # topbinade / rceil
            return e.maxm << (23 - m)
        case 4:  # option3 / even: rounding to mbits+1 bits carries into the next binade
            return (1 << 24) - (1 << (22 - m)) - 1 if m < 23 else never
    return never


def _sparse_dim(p: _Plan) -> int:
    """The input dim that N:M groups run along (reference `_prune`)."""
    t, (_n, _m, index) = p.tiling, p.dt.sspec.sparsity
    if t.kind == "2d" and index == 0:
        ndim = len(t.shape)
        return ndim - 2 if t.axis == ndim - 1 else ndim - 1
    return t.axis


def _prune(x: torch.Tensor, p: _Plan) -> tuple[torch.Tensor, torch.Tensor]:
    """N:M-pruned copy of ``x`` and the keep mask (bool, input shape)."""
    n_keep, m, _ = p.dt.sspec.sparsity
    d = _sparse_dim(p)
    shape = tuple(x.shape)
    L, inner = shape[d], math.prod(shape[d + 1 :])
    ng_l = -(-L // m)
    n_groups = math.prod(shape[:d]) * ng_l * inner
    bg = max(1, 2048 // (m * m))
    y = torch.empty_like(x)
    mask = torch.empty(shape, dtype=torch.uint8, device=x.device)
    _prune_kernel[_programs(n_groups, bg)](
        _int_view(x), _int_view(y), mask, n_groups, L, inner, ng_l, n_keep, _bf16(x.dtype),
        HALF=x.dtype != torch.float32, M=m, BG=bg,
    )  # fmt: skip
    return y, mask.view(torch.bool)


def _to_tile_rows(x: torch.Tensor, t: Tiling) -> torch.Tensor:
    """2-D tiles as rows ``(B*nR*nC, Tr*Tc)``, zero padded, subtiles contiguous.

    The order of layout.py's `to_tiles` then `to_subtiles`.
    """
    m = x.movedim(t.axis, -1).reshape(t.B, t.R, t.C)
    m = torch.nn.functional.pad(m, (0, t.nC * t.Tc - t.C, 0, t.nR * t.Tr - t.R))
    sr, sc = (t.Sr, t.Sc) if t.Sc else (t.Tr, t.Tc)
    m = m.reshape(t.B, t.nR, t.Tr // sr, sr, t.nC, t.Tc // sc, sc)
    return m.permute(0, 1, 4, 2, 5, 3, 6).reshape(-1, t.tile_elems).contiguous()


def _from_tile_rows(r: torch.Tensor, t: Tiling) -> torch.Tensor:
    """Inverse of `_to_tile_rows` (drops the padding)."""
    sr, sc = (t.Sr, t.Sc) if t.Sc else (t.Tr, t.Tc)
    m = r.reshape(t.B, t.nR, t.nC, t.Tr // sr, t.Tc // sc, sr, sc).permute(0, 1, 3, 5, 2, 4, 6)
    m = m.reshape(t.B, t.nR * t.Tr, t.nC * t.Tc)[:, : t.R, : t.C]
    return m.reshape(t.moved_shape).movedim(-1, t.axis).contiguous()


def _sub_grid(per_sub: torch.Tensor, t: Tiling) -> torch.Tensor:
    """``(B*nR*nC, n_sub)`` -> layout.py `sub_grid` (padding-only subtiles dropped)."""
    tr, tc = t.Tr // t.Sr, t.Tc // t.Sc
    s = per_sub.reshape(t.B, t.nR, t.nC, tr, tc).permute(0, 1, 3, 2, 4)
    rows, cols = t.sub_counts
    s = s.reshape(t.B, t.nR * tr, t.nC * tc)[:, :rows, :cols]
    return s.reshape(*t.moved_shape[:-2], rows, cols).movedim(-1, t.axis).contiguous()


def _sub_ungrid(grid: torch.Tensor, t: Tiling) -> torch.Tensor:
    """Inverse of `_sub_grid` (dropped subtiles come back as 0), flat."""
    tr, tc = t.Tr // t.Sr, t.Tc // t.Sc
    rows, cols = t.sub_counts
    g = grid.reshape(_grid_2d(t, rows, cols)).movedim(t.axis, -1).reshape(t.B, rows, cols)
    full = torch.zeros((t.B, t.nR * tr, t.nC * tc), dtype=g.dtype, device=g.device)
    full[:, :rows, :cols] = g
    return full.reshape(t.B, t.nR, tr, t.nC, tc).permute(0, 1, 3, 2, 4).reshape(-1)


def _tile_grid(per_tile: torch.Tensor, p: _Plan) -> torch.Tensor:
    """Per-tile codes in instance order -> the scale grid (layout.py `tile_grid`)."""
    if p.rows:
        t = p.tiling
        g = per_tile.reshape(*t.moved_shape[:-2], t.nR, t.nC)
        return g.movedim(-1, t.axis).contiguous()
    return per_tile.reshape(p.grid_shape)


def _tile_ungrid(grid: torch.Tensor, p: _Plan) -> torch.Tensor:
    """Inverse of `_tile_grid`, flat."""
    if p.rows:
        return grid.reshape(p.grid_shape).movedim(p.tiling.axis, -1).reshape(-1)
    return grid.reshape(-1)


def quantize(
    x: torch.Tensor,
    dt: DataType,
    *,
    axis: int,
    round_mode: RoundMode,
    scale_mode: ScaleMode,
    nan_policy: NanPolicy,
    seed: int,
    full_int_range: bool,
    want_values: bool,
    want_codes: bool,
) -> dict[str, Any]:
    """Quantize a float32/float16/bfloat16 torch tensor (reference `quantize`, bit for bit).

    Returns:
        A dict with ``values`` (input dtype and shape, when asked), ``codes`` (unpacked
        element codes, input shape), ``scale`` and ``zero`` (grid layout), ``meta`` (MX shift
        bits, grid layout) and ``tenscale`` (shape (1,)), the code fields only when asked,
        and ``mask`` (bool, input shape) for N:M sparsity.

    Raises:
        NotImplementedError: the format is not implemented in Triton (see `plan`).
        TypeError: an unsupported input dtype.
    """
    if x.dtype not in _IN_KIND:
        raise TypeError(f"the Triton engine casts float32, float16 or bfloat16, not {x.dtype}")
    p = plan(tuple(x.shape), dt, axis)
    x = x.contiguous()
    n, s = dt.nspec, dt.sspec
    dev = x.device
    e = p.elem
    out: dict[str, Any] = {}
    mask = None
    if s is not None and s.sparsity[1]:
        x, mask = _prune(x, p)
        out["mask"] = mask
    stoch = round_mode is RoundMode.STOCHASTIC
    idx = None
    xk = x
    if p.rows:
        xk = _to_tile_rows(x, p.tiling)
        if stoch:  # the stochastic bits follow the element's flat index in the input
            flat = torch.arange(x.numel(), dtype=torch.int64, device=dev).reshape(x.shape)
            idx = _to_tile_rows(flat, p.tiling)
    tile, nsub, sub, n_chunks, bt = _layout(p)
    n_units = p.n_inst * n_chunks
    y = torch.empty_like(xk) if want_values else torch.empty(1, dtype=x.dtype, device=dev)
    # unwanted outputs are 1-element stand-ins of the same dtypes (the same compile)
    codes = torch.empty(xk.shape if want_codes else 1, dtype=_store_dtype(n.bits), device=dev)
    dummy_i32 = torch.zeros(1, dtype=torch.int32, device=dev)
    scale = zero = dummy_i32
    meta = torch.zeros(1, dtype=torch.uint8, device=dev)
    if s is not None:
        scale = torch.zeros(1, dtype=_store_dtype(s.scale.bits), device=dev)
        if s.zero is not None:
            zero = torch.zeros(1, dtype=_store_dtype(s.zero.bits), device=dev)
    ts_code = amax = lo = hi = dummy_i32
    flags = torch.zeros(1, dtype=torch.int8, device=dev)
    top = torch.zeros(1, dtype=torch.float32, device=dev)
    nums = dict.fromkeys(_QUANT_RUNTIME[8:], 0)
    nums.update(el_maxf=1.0, ts_denom=1.0)
    nums.update(
        bf16=_bf16(x.dtype), want_y=int(want_values), want_codes=int(want_codes),
        rmode=0 if stoch else _ROUND[round_mode],
        nan_nf=int(s is not None and nan_policy is NanPolicy.BLOCK),
        nan_nan=int(s is not None and not n.is_float),
        full_int=int(full_int_range and not e.is_float),
        keep_inf=int(s is None and e.has_inf),
        e_mbits=e.mbits, e_emin=e.emin, e_emax=e.emax, e_maxm=e.maxm, e_bits=e.bits,
        e_negzero=int(e.negzero), e_nancode=e.nan_code, e_infcode=e.inf_code,
        f_emax=_FINITE[x.dtype][0], f_mbits=_FINITE[x.dtype][1], f_over=_FINITE[x.dtype][2],
        f_max=float(_FINITE[x.dtype][3]),
    )  # fmt: skip
    if s is not None:
        if want_codes:
            scale = torch.empty(p.n_inst, dtype=_store_dtype(s.scale.bits), device=dev)
            if p.sub:
                meta = torch.empty(
                    p.n_inst * p.nsub if p.rows else math.prod(p.meta_shape),
                    dtype=torch.uint8,
                    device=dev,
                )
            if s.zero is not None:
                zero = torch.empty(p.n_inst, dtype=_store_dtype(s.zero.bits), device=dev)
        if not p.single:
            amax, flags, lo, hi = _stats(
                xk, p.TC, p.n_inst, p.nC, p.inner, p.C, minmax=p.skind >= 3
            )
        if s.tenscale is not None:
            size = x.numel()
            top_bits, _, _, _ = _stats(x, size, 1, 1, 1, size, minmax=False)
            top = top_bits.view(torch.float32).reshape(1)
            ts_code = torch.zeros(1, dtype=torch.int32, device=dev)
        if s.scale.is_exponent:
            # clamp(sexp + frac, low, high) - frac == clamp(sexp, low - frac, high - frac)
            frac = n.int_fraction_bits
            nums.update(
                bump_t=_bump_threshold(e, scale_mode), s_low=-s.scale.bias - frac,
                s_high=(1 << s.scale.ebits) - 2 - s.scale.bias - frac,
                s_bias=s.scale.bias + frac, s_nan=(1 << s.scale.ebits) - 1,
            )  # fmt: skip
        else:
            sf = p.sfmt
            assert sf is not None
            nums.update(
                s_nan=nan_code(s.scale), el_maxf=float(np.float32(n.maxfloat)),
                s_mbits=sf.mbits, s_emin=sf.emin, s_emax=sf.emax, s_maxm=sf.maxm,
            )  # fmt: skip
            if p.tfmt is not None:
                tf = p.tfmt
                denom = np.float32(n.maxfloat) * np.float32(s.scale.maxfloat)
                nums.update(
                    ts_denom=float(denom), t_mbits=tf.mbits, t_emin=tf.emin, t_emax=tf.emax,
                    t_maxm=tf.maxm,
                )  # fmt: skip
            if p.zfmt is not None:
                zf = p.zfmt
                nums.update(
                    z_mbits=zf.mbits, z_emin=zf.emin, z_emax=zf.emax, z_maxm=zf.maxm,
                    z_bits=zf.bits, z_negzero=int(zf.negzero),
                )  # fmt: skip
    _quant_kernel[_programs(n_units, bt)](
        _int_view(xk), _int_view(y), codes, scale, meta, zero, amax, flags, lo, hi, top,
        ts_code, dummy_i32 if idx is None else idx, n_units, n_chunks, p.C, p.TC, p.inner,
        p.nC, max(p.sub_cols, 1), _hash_key(seed), **nums,
        HALF=x.dtype != torch.float32,
        PRE=not p.single, LAST=p.inner == 1, TILE=tile, NSUB=nsub, SUB=sub, BT=bt,
        SKIND=p.skind, SHIFT=bool(p.sub), STOCH=stoch, E_FLOAT=e.is_float,
        TS=p.tfmt is not None, IDX=idx is not None, enable_fp_fusion=False,
    )  # fmt: skip
    if want_values:
        if p.rows:
            y = _from_tile_rows(y, p.tiling)
        if mask is not None:  # pruned positions read as zero whatever the zero point
            y = y.masked_fill_(~mask, 0)
        out["values"] = y
    if want_codes:
        if p.rows:
            codes = _from_tile_rows(codes, p.tiling)
        out["codes"] = codes.view(_code_torch_dtype(n.bits))
        if s is not None:
            out["scale"] = _tile_grid(scale, p).view(_code_torch_dtype(s.scale.bits))
            if s.zero is not None:
                out["zero"] = _tile_grid(zero, p).view(_code_torch_dtype(s.zero.bits))
            if p.sub:
                out["meta"] = _sub_grid(meta, p.tiling) if p.rows else meta.reshape(p.meta_shape)
            if s.tenscale is not None:
                t = ts_code.to(torch.int64) if s.tenscale.bits > 16 else ts_code
                out["tenscale"] = _to_code(t, s.tenscale.bits)
    return out


def _to_code(t: torch.Tensor, bits: int) -> torch.Tensor:
    if bits <= 16:
        return t.to(_store_dtype(bits)).view(_code_torch_dtype(bits))
    return t.to(torch.int32).view(torch.uint32)


@functools.lru_cache(maxsize=64)
def _decode_table(spec: NumberSpec, device: str) -> torch.Tensor:
    values = _table(spec).astype(np.float32).view(np.int32)
    return torch.from_numpy(values.copy()).to(device)


def dequantize(
    dt: DataType,
    shape: tuple[int, ...],
    axis: int,
    codes: torch.Tensor,
    scale: torch.Tensor | None = None,
    tenscale: torch.Tensor | None = None,
    meta: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
    *,
    zero: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Values of unpacked codes (reference `dequantize`, bit for bit), as ``out_dtype``.

    ``mask`` (N:M sparsity, bool of ``shape``) makes pruned positions read as zero.

    Raises:
        NotImplementedError: the format is not implemented in Triton (see `plan`).
        ValueError: a missing scale, zero point, tensor scale or meta tensor.
        TypeError: an unsupported output dtype.
    """
    if out_dtype not in _IN_KIND:
        raise TypeError(f"upcast returns float32, float16 or bfloat16, not {out_dtype}")
    p = plan(tuple(shape), dt, axis)
    n, s = dt.nspec, dt.sspec
    dev = codes.device
    if s is not None and scale is None:
        raise ValueError(f"{dt.name}: dequantizing needs the scale tensor")
    if s is not None and s.zero is not None and zero is None:
        raise ValueError(f"{dt.name}: dequantizing needs the zero point tensor")
    if p.sub and meta is None:
        raise ValueError(f"{dt.name}: dequantizing needs the meta tensor")
    if s is not None and s.tenscale is not None and tenscale is None:
        raise ValueError(f"{dt.name}: dequantizing needs the tensor scale")
    tile, nsub, sub, n_chunks, bt = _layout(p)
    n_units = p.n_inst * n_chunks
    dummy = torch.zeros(1, dtype=torch.int32, device=dev)
    # signed views first: torch's unsigned 16/32-bit types lack most CUDA ops
    c = _signed(codes.contiguous()).reshape(shape)
    if p.rows:
        c = _to_tile_rows(c, p.tiling)
    c = _flat_codes(c)
    y = torch.empty(c.shape, dtype=out_dtype, device=dev)
    sc = dummy if scale is None else _tile_ungrid(_signed(scale.contiguous()), p)
    zc = dummy if zero is None else _tile_ungrid(_signed(zero.contiguous()), p)
    mt = dummy
    if meta is not None:
        mt = _sub_ungrid(meta, p.tiling) if p.rows else meta.contiguous().reshape(-1)
    stab = ztab = dummy
    ts = torch.ones(1, dtype=torch.float32, device=dev)
    s_f32 = False
    wide = n.bits > 16
    c_shift = -1 if n.is_float else (32 - n.bits if n.is_int else 0)
    code_mask = (1 << n.bits) - 1 if n.bits < 32 else -1
    nums = dict(code_mask=code_mask, c_shift=c_shift, s_bias=0, s_nan=0, s_mask=0, z_mask=0)
    nums.update(bf16=_bf16(out_dtype))
    if s is not None:
        if s.scale.is_exponent:
            nums.update(
                s_bias=s.scale.bias + n.int_fraction_bits, s_nan=(1 << s.scale.ebits) - 1,
                s_mask=(1 << s.scale.bits) - 1,
            )  # fmt: skip
        else:
            s_f32 = s.scale.bits == 32
            if not s_f32:
                stab = _decode_table(s.scale, str(dev))
            nums.update(s_mask=(1 << s.scale.bits) - 1)
            if s.zero is not None:
                ztab = _decode_table(s.zero, str(dev))
                nums.update(z_mask=(1 << s.zero.bits) - 1)
            if s.tenscale is not None:
                assert tenscale is not None
                tcode = tenscale.reshape(-1)[:1].cpu().numpy()
                from onnxq.cast.elements import decode_codes

                tval = decode_codes(tcode.astype(np.uint64), s.tenscale).astype(np.float32)
                ts = torch.from_numpy(tval).to(dev)
    _dequant_kernel[_programs(n_units, bt)](
        c, _int_view(y), sc, mt, zc, dummy if wide else _decode_table(n, str(dev)), stab, ztab, ts,
        n_units, n_chunks, p.C, p.TC, p.inner, p.nC, max(p.sub_cols, 1), **nums,
        HALF=out_dtype != torch.float32, LAST=p.inner == 1, TILE=tile, NSUB=nsub, SUB=sub, BT=bt,
        SKIND=p.skind, SHIFT=bool(p.sub), WIDE=wide, S_F32=s_f32, TS=s is not None and s.tenscale
        is not None, enable_fp_fusion=False,
    )  # fmt: skip
    if p.rows:
        y = _from_tile_rows(y.reshape(-1, p.C), p.tiling)
    y = y.reshape(shape)
    if mask is not None:
        y = y.masked_fill_(~mask.reshape(shape).to(torch.bool), 0)
    return y


def to_qtensor(
    res: dict[str, Any],
    x: torch.Tensor,
    dt: DataType,
    axis: int,
    mode: CastMode,
    *,
    packed: bool = False,
) -> Any:
    """The `QTensor` of a quantize result (actual or compress mode; api.py's layouts).

    Compress mode packs the codes of kept (N:M) positions only, the meta bits and the mask,
    unless ``packed`` says the kernel wrote them packed already (`triton_fast.quantize`).
    """
    from onnxq.cast.qtensor import QTensor

    codes, meta, mask = res["codes"], res.get("meta"), res.get("mask")
    if mode is CastMode.COMPRESS and not packed:
        codes = pack_bits(codes if mask is None else _signed(codes)[mask], dt.nspec.bits)
        meta = None if meta is None else pack_bits(meta, dt.meta_bits)
        mask = None if mask is None else pack_bits(mask.to(torch.uint8), 1)
    return QTensor(
        data=codes,
        dtype=dt,
        shape=tuple(x.shape),
        axis=axis,
        mode=mode,
        scale=res.get("scale"),
        zero=res.get("zero"),
        tenscale=res.get("tenscale"),
        meta=meta,
        mask=mask,
    )


def upcast(q: Any, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode a `QTensor` of torch tensors (actual or compress mode) with `dequantize`.

    Raises:
        NotImplementedError: the format is not implemented in Triton (see `plan`).
    """
    codes, meta, mask = q.data, q.meta, q.mask
    count = math.prod(q.shape)
    if q.mode is CastMode.COMPRESS:
        bits = q.dtype.nspec.bits
        if mask is not None:
            mask = unpack_bits(mask, 1, count).to(torch.bool).reshape(q.shape)
            kept = unpack_bits(codes, bits, int(mask.sum()))
            codes = torch.zeros(q.shape, dtype=_signed(kept).dtype, device=kept.device)
            codes[mask] = _signed(kept)
        else:
            codes = unpack_bits(codes, bits, count).reshape(q.shape)
        if meta is not None:
            p = plan(q.shape, q.dtype, q.axis)
            meta = unpack_bits(meta, q.dtype.meta_bits, math.prod(p.meta_shape))
    return dequantize(
        q.dtype,
        q.shape,
        q.axis,
        codes,
        q.scale,
        q.tenscale,
        meta,
        out_dtype,
        zero=q.zero,
        mask=mask,
    )


def _signed(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.uint16:
        return t.view(torch.int16)
    if t.dtype == torch.uint32:
        return t.view(torch.int32)
    return t


def _flat_codes(t: torch.Tensor) -> torch.Tensor:
    return _signed(t.contiguous().reshape(-1))


# -- packing on the device (packing.py's stream, with torch ops) -------------------------------
def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned codes (C order) into packing.py's little-endian uint8 stream.

    Raises:
        NotImplementedError: widths over 32 bits.
    """
    flat = _flat_codes(codes)
    count = flat.numel()
    nbytes = (count * bits + 7) // 8
    if bits in (8, 16, 32):
        return flat.view(torch.uint8)  # the kernels' code tensor is fresh: no copy needed
    if bits > 32:
        raise NotImplementedError(f"packing {bits}-bit codes on the device")
    if bits > 8:  # rare widths: one byte per bit, then eight bits per byte
        lane = torch.arange(bits, device=flat.device, dtype=torch.int64)
        bit = ((flat.to(torch.int64)[:, None] >> lane) & 1).reshape(-1)
        bit = torch.nn.functional.pad(bit, (0, nbytes * 8 - bit.numel()))
        weight = 1 << torch.arange(8, device=flat.device, dtype=torch.int64)
        return (bit.view(nbytes, 8) * weight).sum(dim=1).to(torch.uint8)
    # `per` codes fill `bits * per / 8` whole bytes; gather them into one word, then split it
    per = 8 // math.gcd(8, bits)
    wide = torch.int32 if per * bits <= 31 else torch.int64
    groups = -(-count // per)
    if groups * per != count:
        padded = torch.zeros(groups * per, dtype=torch.uint8, device=flat.device)
        padded[:count] = flat
        flat = padded
    lanes = flat.view(groups, per)
    if per * bits == 8:  # 1, 2, 4 bits: the word is the byte
        word = lanes[:, 0].clone()
        for k in range(1, per):
            word |= lanes[:, k] << (k * bits)
        return word[:nbytes]
    word = lanes[:, 0].to(wide)
    for k in range(1, per):
        word |= lanes[:, k].to(wide) << (k * bits)
    out = torch.empty(groups, per * bits // 8, dtype=torch.uint8, device=flat.device)
    for b in range(per * bits // 8):
        out[:, b] = (word >> (8 * b)) & 0xFF
    return out.view(-1)[:nbytes]


def unpack_bits(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Inverse of `pack_bits`: the first ``count`` codes.

    Raises:
        NotImplementedError: widths over 32 bits.
        ValueError: the stream is too short.
    """
    need = (count * bits + 7) // 8
    stream = packed.contiguous().reshape(-1)
    if stream.numel() < need:
        raise ValueError(
            f"packed stream has {stream.numel()} bytes; {count} codes of {bits} bits need {need}"
        )
    if bits == 8:
        return stream[:count].clone()
    if bits == 16:
        return stream[: 2 * count].clone().view(torch.int16).view(torch.uint16)
    if bits == 32:
        return stream[: 4 * count].clone().view(torch.int32).view(torch.uint32)
    if bits > 32:
        raise NotImplementedError(f"unpacking {bits}-bit codes on the device")
    if bits > 8:  # rare widths: the bits of each code from its bytes, as int32
        lane = torch.arange(8, device=stream.device, dtype=torch.int64)
        bit = ((stream[:need].to(torch.int64)[:, None] >> lane) & 1).reshape(-1)
        bit = bit[: count * bits].view(count, bits)
        weight = 1 << torch.arange(bits, device=stream.device, dtype=torch.int64)
        return (bit * weight).sum(dim=1).to(torch.int32).view(torch.uint32)
    groups = -(-count // 8)
    padded = torch.zeros(groups * bits, dtype=torch.int64, device=stream.device)
    padded[:need] = stream[:need].to(torch.int64)
    byte_shifts = torch.arange(bits, device=stream.device, dtype=torch.int64) * 8
    word = (padded.view(groups, bits) << byte_shifts).sum(dim=1)
    shifts = torch.arange(8, device=stream.device, dtype=torch.int64) * bits
    codes = (word[:, None] >> shifts) & ((1 << bits) - 1)
    return codes.reshape(-1)[:count].to(torch.uint8)
