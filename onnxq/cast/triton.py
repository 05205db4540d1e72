"""Triton cast engine: the reference's casts on torch tensors, bit for bit (design.md item 12).

Three kernels serve every supported data type; the format is a set of ``tl.constexpr``
parameters (`_ElemFmt`, `_Plan`), so Triton compiles one specialisation per format and mode:

- `_quant_kernel`: tile statistics (or precomputed ones), the scale, element rounding,
  values (virtual), element codes, scale codes, MX shift bits and the tensor-scale code.
- `_stats_kernel`: per-chunk finite absmax and NaN/Inf flags, for tiles too long for one
  program (channel tiles over 1024 elements, tensor scales, NVFP4's tensor amax).
- `_dequant_kernel`: codes + scales (+ shift bits, tensor scale) -> values.

Element rounding is integer arithmetic on the float32 bits (never a float8 conversion, whose
rounding and saturation differ), with the reference's stochastic rule. Floating-point
operations appear only where the reference itself computes in float32 (float scales:
``amax / maxfloat``, ``x / scale`` and ``q * scale``), and use correctly rounded division.

Geometry (layout.py, 1-D tiles): the input is seen as ``(outer, C, inner)`` with ``C`` the
tiled axis. A *tile instance* is ``(o, j, i)`` - tile ``j`` of row ``(o, i)`` - numbered in the
order of the scale grid, so the grid index of a tile is its instance number. A non-last
axis is read with strided loads (stride ``inner``); no transposed copy is made.
Non-contiguous inputs are copied to contiguous memory first (the stochastic index is the
element's flat C-order index, which needs that order anyway).

Not implemented here (`NotImplementedError` names them, design.md item 12): codebooks,
2-D tiles, N:M sparsity, zero points, element formats over 16 bits.
"""

# Kernel format parameters are tl.constexpr and upper case (Triton's convention); tile geometry
# keeps layout.py's names (C, TC, nC).
# ruff: noqa: N803, N815

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from onnxq.cast import reference
from onnxq.cast.elements import _table, nan_code
from onnxq.cast.layout import Tiling
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode
from onnxq.formats.number import InfNaN, NumberSpec

__all__ = ["dequantize", "pack_bits", "plan", "quantize", "unpack_bits"]

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
    """Everything the kernels need to know about one cast, checked for support."""

    dt: DataType
    tiling: Tiling
    outer: int
    inner: int
    C: int
    TC: int  # elements per tile along the axis
    nC: int
    n_inst: int
    skind: int  # 0 unscaled, 1 exponent scale, 2 float scale
    single: bool  # one program holds whole tiles
    nsub: int
    sub: int
    sub_cols: int
    elem: _ElemFmt
    sfmt: _ElemFmt | None
    tfmt: _ElemFmt | None

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """Scale grid layout (layout.py `tile_grid`)."""
        if self.tiling.kind == "tensor":
            return (1,)
        s, a = self.tiling.shape, self.tiling.axis
        return (*s[:a], self.nC, *s[a + 1 :])

    @property
    def meta_shape(self) -> tuple[int, ...]:
        """MX shift-bit grid layout (layout.py `sub_grid`)."""
        s, a = self.tiling.shape, self.tiling.axis
        return (*s[:a], self.sub_cols, *s[a + 1 :])


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
    if n.bits > 16:
        raise NotImplementedError(missing.format("element formats over 16 bits"))
    if s is not None:
        if s.is_2d:
            raise NotImplementedError(missing.format("2-D tiles"))
        if s.sparsity[1]:
            raise NotImplementedError(missing.format("N:M sparsity"))
        if s.zero is not None:
            raise NotImplementedError(missing.format("zero points (uint elements)"))
        if s.scale.is_exponent and s.scale.ebits > 8:
            raise NotImplementedError(missing.format("exponent scales over 8 bits"))
        for extra in (s.scale, s.tenscale):
            if extra is not None and extra.is_float and (extra.bits > 32 or extra.mbits > 23):
                raise NotImplementedError(missing.format("float scales wider than float32"))
    tiling = Tiling.build(tuple(shape), axis, s)
    size = math.prod(shape)
    sfmt = tfmt = None
    nsub, sub, sub_cols = 1, 0, 0
    if s is None or tiling.kind == "tensor":
        outer, inner, C, TC, nC = 1, 1, size, size, 1
        skind = 0 if s is None else (1 if s.scale.is_exponent else 2)
    else:
        a = tiling.axis
        outer, inner, C = math.prod(shape[:a]), math.prod(shape[a + 1 :]), shape[a]
        TC, nC = tiling.Tc, tiling.nC
        skind = 1 if s.scale.is_exponent else 2
        if tiling.Sc:
            sub, nsub = tiling.Sc, tiling.Tc // tiling.Sc
            sub_cols = -(-C // tiling.Sc)
    if skind == 2:
        sfmt = _elem_fmt(s.scale)
        if s.tenscale is not None:
            tfmt = _elem_fmt(s.tenscale)
    single = (
        skind != 0
        and triton.next_power_of_2(TC) <= _MAX_SINGLE_TILE
        and nsub * max(sub, 1) <= _MAX_SINGLE_TILE
    )
    if tiling.Sc and not single:
        raise NotImplementedError(missing.format("subtiles in tiles over 1024 elements"))
    return _Plan(
        dt, tiling, outer, inner, C, TC, nC, outer * nC * inner, skind, single, nsub, sub,
        sub_cols, _elem_fmt(n), sfmt, tfmt,
    )  # fmt: skip


def _int_frac_bits(spec: NumberSpec) -> int:
    """Fraction bits of int elements in the stored E8M0 exponent, as the reference has them.

    The kernels' ``sexp`` is the exponent of the element grid step; the stored scale code is
    ``sexp + frac + bias`` (fixed point with one integer bit), clamped on the stored value.
    """
    fn = getattr(reference, "_int_frac_bits", None)
    return int(fn(spec)) if fn is not None else 0


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
def _round_shift(M, sh, rand, ROUND: tl.constexpr):
    # round(M / 2^sh) for 0 <= M < 2^25 (sh <= 0: exact left shift); shifts clamped: no UB
    shr = tl.minimum(tl.maximum(sh, 0), 30)
    shl = tl.minimum(tl.maximum(-sh, 0), 30)
    fl = M >> shr
    rem = M - (fl << shr)
    half = 1 << tl.maximum(shr - 1, 0)
    if ROUND == 0:
        up = (rem > half) | ((rem == half) & ((fl & 1) == 1))
    elif ROUND == 1:
        up = rem >= half
    elif ROUND == 2:
        up = rem > half
    else:
        # floor(frac * 2^24) with frac = rem / 2^sh, exactly
        thr = tl.where(
            sh <= 24,
            rem << tl.maximum(24 - shr, 0),
            rem >> tl.minimum(tl.maximum(sh - 24, 0), 30),
        )
        up = rand < thr
    return tl.where(sh > 0, fl + up.to(tl.int32), M << shl)


@triton.jit
def _quant_elem(
    xb,
    sexp,
    rand,
    IS_FLOAT: tl.constexpr,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    EMAX: tl.constexpr,
    MAXM: tl.constexpr,
    ROUND: tl.constexpr,
    FULL_INT: tl.constexpr,
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
        s = tl.maximum(flx - sexp, EMIN) - MBITS
    else:
        s = flx * 0 + sexp * 0
    n = _round_shift(M, s + sexp - ex + 23, rand, ROUND)
    if IS_FLOAT:
        top = EMAX - MBITS
        over = (s > top) | ((s == top) & (n > MAXM)) | (E == 255)
        n = tl.where(over, MAXM, n)
        s = tl.where(over, top, s)
    else:
        if FULL_INT:
            lim = MAXM + (xb < 0).to(tl.int32)
        else:
            lim = MAXM + flx * 0
        # |v| >= 2^24 would overflow the shift: it saturates anyway (ints are <= 16 bits)
        n = tl.where((n > lim) | (E == 255) | (flx - sexp >= 24), lim, n)
    return n, s


@triton.jit
def _make_f32(n, pe):
    # float32 bits of n * 2^pe (0 <= n <= 2^24), round-half-even below the subnormal grid
    L = _ilog2(tl.maximum(n, 1))
    field = pe + L + 127
    norm = tl.where(L <= 23, n << tl.maximum(23 - L, 0), n >> tl.maximum(L - 23, 0))
    normal = (field << 23) + (norm & 0x7FFFFF)
    # subnormal bits are linear in the value, so a carry to 2^23 lands on the smallest normal
    sub = _round_shift(n, -149 - pe, 0, 0)
    bits = tl.where(field >= 1, normal, sub)
    bits = tl.where(field >= 255, 0x7F800000, bits)
    return tl.where(n == 0, 0, bits)


@triton.jit
def _float_code(n, s, MBITS: tl.constexpr, EMIN: tl.constexpr):
    # magnitude code of n * 2^s on a float grid (n may be 2^(MBITS+1): the carry is right)
    return tl.where(n == 0, 0, ((s - EMIN + MBITS) << MBITS) + n)


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
    # E8M0 exponent of a tile from its absmax bits (reference `_scale_exponent`)
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
    # Units are (tile instance, chunk); element offsets are int64 (tensors over 2^31)
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
    ok = u_ok[:, None, None] & (pos < TC) & (c < C)
    if LAST:
        off = base[:, None, None] + c
    else:
        off = base[:, None, None] + c * inner
    return u_ok, inst, q, j, o, i, off, ok


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
def _store_values(y_ptr, off, ok, yb, elem_nan, tile_nan, raw, OUT_KIND: tl.constexpr):
    # Convert float32 bits to the output type; every NaN is the canonical quiet NaN
    # (reference._canonical_nan), whatever the input's payload.
    nan = elem_nan | tile_nan | ((yb & 0x7FFFFFFF) > 0x7F800000)
    if OUT_KIND == 0:
        out = tl.where(nan, 0x7FC00000, yb)
    elif OUT_KIND == 1:
        h = yb.to(tl.float32, bitcast=True).to(tl.float16).to(tl.int16, bitcast=True)
        out = tl.where(nan, 0x7E00, h).to(tl.int16)
    else:
        mag = yb & 0x7FFFFFFF
        r = (mag + 0x7FFF + ((mag >> 16) & 1)) >> 16  # round-half-even to bfloat16
        h = r | ((yb >> 16) & 0x8000)
        out = tl.where(nan, 0x7FC0, h).to(tl.int16)
    tl.store(y_ptr + off, out, mask=ok)


# -- kernels ----------------------------------------------------------------------------------
@triton.jit
def _stats_kernel(
    x_ptr,
    amax_ptr,
    flag_ptr,
    n_units,
    n_chunks,
    C,
    TC,
    inner,
    nC,
    IN_KIND: tl.constexpr,
    LAST: tl.constexpr,
    TILE: tl.constexpr,
    BT: tl.constexpr,
):
    pid = tl.program_id(0)
    u_ok, _inst, _q, _j, _o, _i, off, ok = _unit_offsets(
        pid, n_units, n_chunks, C, TC, inner, nC, LAST, TILE, 1, TILE, BT
    )
    xb, _raw = _load_bits(x_ptr, off, ok, IN_KIND)
    ab = xb & 0x7FFFFFFF
    finite = ab < 0x7F800000
    amax = tl.max(tl.max(tl.where(finite, ab, 0), axis=2), axis=1)
    # flags: 2 = some NaN/Inf, 3 = some NaN (NaN implies non-finite, so max() is an OR)
    nf = tl.max(tl.max((~finite & ok).to(tl.int32), axis=2), axis=1)
    isnan = tl.max(tl.max(((ab > 0x7F800000) & ok).to(tl.int32), axis=2), axis=1)
    u = pid.to(tl.int64) * BT + tl.arange(0, BT)
    tl.store(amax_ptr + u, amax, mask=u_ok)
    tl.store(flag_ptr + u, (2 * nf + isnan).to(tl.int8), mask=u_ok)


@triton.jit(do_not_specialize=["key"])
def _quant_kernel(
    x_ptr,
    y_ptr,
    code_ptr,
    scale_ptr,
    meta_ptr,
    amax_ptr,
    flag_ptr,
    top_ptr,
    ts_code_ptr,
    n_units,
    n_chunks,
    C,
    TC,
    inner,
    nC,
    sub_cols,
    key,
    IN_KIND: tl.constexpr,
    WANT_Y: tl.constexpr,
    WANT_CODES: tl.constexpr,
    PRE: tl.constexpr,
    LAST: tl.constexpr,
    TILE: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    BT: tl.constexpr,
    SKIND: tl.constexpr,
    SHIFT: tl.constexpr,
    ROUND: tl.constexpr,
    NAN_BLOCK: tl.constexpr,
    NAN_TILE: tl.constexpr,
    FULL_INT: tl.constexpr,
    KEEP_INF: tl.constexpr,
    E_FLOAT: tl.constexpr,
    E_MBITS: tl.constexpr,
    E_EMIN: tl.constexpr,
    E_EMAX: tl.constexpr,
    E_MAXM: tl.constexpr,
    E_BITS: tl.constexpr,
    E_NEGZERO: tl.constexpr,
    E_NANCODE: tl.constexpr,
    E_INFCODE: tl.constexpr,
    SMODE: tl.constexpr,
    MID_T: tl.constexpr,
    TOP_T: tl.constexpr,
    S_LOW: tl.constexpr,
    S_HIGH: tl.constexpr,
    S_BIAS: tl.constexpr,
    S_NAN: tl.constexpr,
    EL_MAXF: tl.constexpr,
    S_MBITS: tl.constexpr,
    S_EMIN: tl.constexpr,
    S_EMAX: tl.constexpr,
    S_MAXM: tl.constexpr,
    TS: tl.constexpr,
    TS_DENOM: tl.constexpr,
    T_MBITS: tl.constexpr,
    T_EMIN: tl.constexpr,
    T_EMAX: tl.constexpr,
    T_MAXM: tl.constexpr,
):
    pid = tl.program_id(0)
    u_ok, inst, q, j, o, i, off, ok = _unit_offsets(
        pid, n_units, n_chunks, C, TC, inner, nC, LAST, TILE, NSUB, SUB, BT
    )
    xb, raw = _load_bits(x_ptr, off, ok, IN_KIND)
    ab = xb & 0x7FFFFFFF
    finite = ab < 0x7F800000
    rand = off.to(tl.int32) * 0
    if ROUND == 3:
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
        if NAN_BLOCK:
            tnan = tnan | any_nf
        elif NAN_TILE:
            tnan = tnan | any_nan
    tile_nan = ok & tnan[:, None, None]
    if SKIND == 2:
        # float scale: scale = cast(amax / maxfloat [/ tensor scale]); v = x / scale (float32)
        amax_f = amax_b.to(tl.float32, bitcast=True)
        raw_s = tl.div_rn(amax_f, tl.full(amax_f.shape, EL_MAXF, tl.float32))
        if TS:
            top = tl.load(top_ptr)
            tsr = tl.div_rn(top, tl.full(top.shape, TS_DENOM, tl.float32))
            tsr = tsr.to(tl.int32, bitcast=True)
            tn, tsx = _quant_elem(tsr, 0, 0, True, T_MBITS, T_EMIN, T_EMAX, T_MAXM, 0, False)
            ts = _make_f32(tn, tsx).to(tl.float32, bitcast=True)
            raw_s = tl.where(ts > 0, tl.div_rn(raw_s, tl.broadcast_to(ts, raw_s.shape)), 0.0)
            tl.store(ts_code_ptr, _float_code(tn, tsx, T_MBITS, T_EMIN), mask=pid == 0)
        rb = raw_s.to(tl.int32, bitcast=True)
        sn, ssx = _quant_elem(rb, 0, 0, True, S_MBITS, S_EMIN, S_EMAX, S_MAXM, 0, False)
        sc = _make_f32(sn, ssx).to(tl.float32, bitcast=True)
        if TS:
            eff = sc * ts
        else:
            eff = sc
        eff3 = eff[:, None, None]
        xf = xb.to(tl.float32, bitcast=True)
        v = tl.where(eff3 > 0, tl.div_rn(xf, tl.broadcast_to(eff3, xf.shape)), 0.0)
        vb = v.to(tl.int32, bitcast=True)
        n, s = _quant_elem(vb, 0, rand, E_FLOAT, E_MBITS, E_EMIN, E_EMAX, E_MAXM, ROUND, FULL_INT)
        vneg = vb < 0
        # From the input: a zero scale zeroes v, but NaN stays NaN (reference._float_scaled).
        elem_nan = (xb & 0x7FFFFFFF) > 0x7F800000
        sgn = vneg & ((n != 0) | E_NEGZERO)
        qb = _make_f32(n, s) | (sgn.to(tl.int32) << 31)
        yb = (qb.to(tl.float32, bitcast=True) * eff3).to(tl.int32, bitcast=True)
        scode = _float_code(sn, ssx, S_MBITS, S_EMIN)
        scode = tl.where(tnan, S_NAN, scode)
    else:
        if SKIND == 1:
            sexp, maxexp = _scale_exp(
                amax_b, E_FLOAT, E_MBITS, E_EMAX, SMODE, MID_T, TOP_T, S_LOW, S_HIGH
            )
            sexp3 = sexp[:, None, None]
            if SHIFT:
                # MX: a subtile is shifted when all of it is below 2^floor(log2 amax)
                p2 = tl.where(
                    maxexp >= -126,
                    (maxexp + 127) << 23,
                    1 << tl.minimum(tl.maximum(maxexp + 149, 0), 30),
                )
                below = (sub_max < p2[:, None]) & (amax_b[:, None] != 0)
                sexp3 = sexp3 - below[:, :, None].to(tl.int32)
            scode = tl.where(tnan, S_NAN, sexp + S_BIAS)
        else:
            sexp3 = off.to(tl.int32) * 0
        n, s = _quant_elem(
            xb, sexp3, rand, E_FLOAT, E_MBITS, E_EMIN, E_EMAX, E_MAXM, ROUND, FULL_INT
        )
        vneg = neg
        elem_nan = ab > 0x7F800000
        sgn = neg & ((n != 0) | E_NEGZERO)
        yb = _make_f32(n, s + sexp3) | (sgn.to(tl.int32) << 31)
        if KEEP_INF:
            yb = tl.where(ab == 0x7F800000, xb, yb)
    if E_FLOAT:
        elem_nan = elem_nan & ~tile_nan
    else:
        elem_nan = elem_nan & False
    if WANT_Y:
        _store_values(y_ptr, off, ok, yb, elem_nan, tile_nan, raw, IN_KIND)
    if WANT_CODES:
        if E_FLOAT:
            code = _float_code(n, s, E_MBITS, E_EMIN) | (sgn.to(tl.int32) << (E_BITS - 1))
            if KEEP_INF:
                infc = E_INFCODE | (vneg.to(tl.int32) << (E_BITS - 1))
                code = tl.where(ab == 0x7F800000, infc, code)
            code = tl.where(elem_nan, E_NANCODE, code)
        else:
            code = tl.where(vneg, -n, n) & ((1 << E_BITS) - 1)
        code = tl.where(tile_nan, 0, code)
        tl.store(code_ptr + off, code.to(code_ptr.dtype.element_ty), mask=ok)
        if SKIND != 0:
            tl.store(scale_ptr + inst, scode.to(scale_ptr.dtype.element_ty), mask=u_ok & (q == 0))
        if SHIFT:
            sidx = j[:, None] * NSUB + tl.arange(0, NSUB)[None, :]
            if LAST:
                moff = o[:, None] * sub_cols + sidx
            else:
                moff = o[:, None] * sub_cols * inner + sidx * inner + i[:, None]
            tl.store(meta_ptr + moff, below.to(tl.uint8), mask=u_ok[:, None] & (sidx < sub_cols))


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


@triton.jit
def _dequant_kernel(
    code_ptr,
    y_ptr,
    scale_ptr,
    meta_ptr,
    tab_ptr,
    stab_ptr,
    ts_ptr,
    n_units,
    n_chunks,
    C,
    TC,
    inner,
    nC,
    sub_cols,
    OUT_KIND: tl.constexpr,
    LAST: tl.constexpr,
    TILE: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    BT: tl.constexpr,
    SKIND: tl.constexpr,
    SHIFT: tl.constexpr,
    CODE_MASK: tl.constexpr,
    S_BIAS: tl.constexpr,
    S_NAN: tl.constexpr,
    S_MASK: tl.constexpr,
    S_F32: tl.constexpr,
    TS: tl.constexpr,
):
    pid = tl.program_id(0)
    u_ok, inst, _q, j, o, i, off, ok = _unit_offsets(
        pid, n_units, n_chunks, C, TC, inner, nC, LAST, TILE, NSUB, SUB, BT
    )
    c = tl.load(code_ptr + off, mask=ok, other=0).to(tl.int32) & CODE_MASK
    qb = tl.load(tab_ptr + c, mask=ok, other=0)
    tile_nan = ok & False
    if SKIND == 0:
        yb = qb
    elif SKIND == 1:
        sc = tl.load(scale_ptr + inst, mask=u_ok, other=0).to(tl.int32) & S_MASK
        nan_t = sc == S_NAN
        k3 = tl.where(nan_t, 0, sc - S_BIAS)[:, None, None]
        if SHIFT:
            sidx = j[:, None] * NSUB + tl.arange(0, NSUB)[None, :]
            if LAST:
                moff = o[:, None] * sub_cols + sidx
            else:
                moff = o[:, None] * sub_cols * inner + sidx * inner + i[:, None]
            sh = tl.load(meta_ptr + moff, mask=u_ok[:, None] & (sidx < sub_cols), other=0)
            k3 = k3 - sh.to(tl.int32)[:, :, None]
        yb = _ldexp_bits(qb, k3)
        tile_nan = tile_nan | nan_t[:, None, None]
    else:
        sc = tl.load(scale_ptr + inst, mask=u_ok, other=0).to(tl.int32)
        if S_F32:
            scb = sc
        else:
            scb = tl.load(stab_ptr + (sc & S_MASK), mask=u_ok, other=0)
        scf = scb.to(tl.float32, bitcast=True)
        if TS:
            eff = scf * tl.load(ts_ptr)
        else:
            eff = scf
        eff3 = eff[:, None, None]
        qf = qb.to(tl.float32, bitcast=True)
        yb = (qf * eff3).to(tl.int32, bitcast=True)
        qinf = (qb & 0x7FFFFFFF) == 0x7F800000
        yb = tl.where(qinf & (eff3 == 0), 0x7FC00000, yb)  # Inf * 0: the canonical NaN
        yb = tl.where((qb & 0x7FFFFFFF) > 0x7F800000, 0x7FC00000, yb)
        tile_nan = tile_nan | ((scb & 0x7FFFFFFF) > 0x7F800000)[:, None, None]
    _store_values(y_ptr, off, ok, yb, ok & False, tile_nan, yb, OUT_KIND)


# -- host side ---------------------------------------------------------------------------------
def _int_view(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def _programs(n_units: int, bt: int) -> tuple[int]:
    return (triton.cdiv(n_units, bt),)


def _layout(p: _Plan) -> tuple[int, int, int, int, int]:
    """(TILE, NSUB, SUB, n_chunks, BT) of the quantize / dequantize kernels."""
    if p.single:
        tile = triton.next_power_of_2(p.TC)
        nsub, sub = (p.nsub, p.sub) if p.sub else (1, tile)
        return tile, nsub, sub, 1, max(1, _BLOCK // tile)
    tile = min(_BLOCK, triton.next_power_of_2(p.TC))
    return tile, 1, tile, triton.cdiv(p.TC, tile), max(1, _BLOCK // tile)


def _stats(x: torch.Tensor, p: _Plan, tc: int, n_inst: int, nc: int, inner: int, C: int):
    """Per-instance finite absmax (float32 bits) and flags over tiles of ``tc`` elements."""
    tile = min(_BLOCK, triton.next_power_of_2(tc))
    n_chunks = triton.cdiv(tc, tile)
    n_units = n_inst * n_chunks
    bt = max(1, min(_BLOCK // tile, triton.next_power_of_2(n_units)))
    amax = torch.empty(n_units, dtype=torch.int32, device=x.device)
    flags = torch.empty(n_units, dtype=torch.int8, device=x.device)
    _stats_kernel[_programs(n_units, bt)](
        _int_view(x), amax, flags, n_units, n_chunks, C, tc, inner, nc,
        IN_KIND=_IN_KIND[x.dtype], LAST=inner == 1, TILE=tile, BT=bt,
    )  # fmt: skip
    if n_chunks > 1:
        amax = amax.view(n_inst, n_chunks).amax(dim=1)
        flags = flags.view(n_inst, n_chunks).amax(dim=1)
    return amax, flags


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
        element codes, input shape), ``scale`` (grid layout), ``meta`` (MX shift bits, grid
        layout) and ``tenscale`` (shape (1,)), the code fields only when asked.

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
    tile, nsub, sub, n_chunks, bt = _layout(p) if p.skind else _unscaled_layout(p)
    n_units = p.n_inst * n_chunks
    bt = max(1, min(bt, triton.next_power_of_2(n_units)))
    out: dict[str, Any] = {}
    y = torch.empty_like(x) if want_values else torch.empty(1, dtype=x.dtype, device=dev)
    codes = (
        torch.empty(x.shape, dtype=_store_dtype(n.bits), device=dev)
        if want_codes
        else torch.empty(1, dtype=torch.uint8, device=dev)
    )
    dummy_i32 = torch.zeros(1, dtype=torch.int32, device=dev)
    scale = meta = dummy_i32
    ts_code = dummy_i32
    amax = flags = dummy_i32
    top = torch.zeros(1, dtype=torch.float32, device=dev)
    consts: dict[str, Any] = {}
    if s is not None:
        if want_codes:
            scale = torch.empty(p.n_inst, dtype=_store_dtype(s.scale.bits), device=dev)
            if p.sub:
                meta = torch.empty(math.prod(p.meta_shape), dtype=torch.uint8, device=dev)
        if not p.single:
            amax, flags = _stats(x, p, p.TC, p.n_inst, p.nC, p.inner, p.C)
        if s.tenscale is not None:
            size = x.numel()
            top_bits, _ = _stats(x, p, size, 1, 1, 1, size)
            top = top_bits.view(torch.float32).reshape(1)
            ts_code = torch.zeros(1, dtype=torch.int32, device=dev)
        if s.scale.is_exponent:
            mid_t = top_t = 0
            if e.is_float:
                mid_t = (2 * e.maxm + 1) << (22 - e.mbits) if e.mbits <= 22 else 0
                top_t = e.maxm << (23 - e.mbits)
            # clamp(sexp + frac, low, high) - frac == clamp(sexp, low - frac, high - frac)
            frac = _int_frac_bits(n)
            low, high = -s.scale.bias - frac, (1 << s.scale.ebits) - 2 - s.scale.bias - frac
            consts.update(
                SMODE=_SMODE[scale_mode] if e.is_float else 0, MID_T=mid_t, TOP_T=top_t,
                S_LOW=low, S_HIGH=high, S_BIAS=s.scale.bias + frac,
                S_NAN=(1 << s.scale.ebits) - 1,
            )  # fmt: skip
        else:
            sf = p.sfmt
            assert sf is not None
            consts.update(
                S_NAN=nan_code(s.scale), EL_MAXF=float(np.float32(n.maxfloat)),
                S_MBITS=sf.mbits, S_EMIN=sf.emin, S_EMAX=sf.emax, S_MAXM=sf.maxm,
            )  # fmt: skip
            if p.tfmt is not None:
                tf = p.tfmt
                denom = np.float32(n.maxfloat) * np.float32(s.scale.maxfloat)
                consts.update(
                    TS=True, TS_DENOM=float(denom), T_MBITS=tf.mbits, T_EMIN=tf.emin,
                    T_EMAX=tf.emax, T_MAXM=tf.maxm,
                )  # fmt: skip
    defaults = dict(
        SMODE=0, MID_T=0, TOP_T=0, S_LOW=0, S_HIGH=0, S_BIAS=0, S_NAN=0, EL_MAXF=1.0,
        S_MBITS=0, S_EMIN=0, S_EMAX=0, S_MAXM=0, TS=False, TS_DENOM=1.0, T_MBITS=0,
        T_EMIN=0, T_EMAX=0, T_MAXM=0,
    )  # fmt: skip
    defaults.update(consts)
    tile_nan_int = s is not None and not n.is_float
    _quant_kernel[_programs(n_units, bt)](
        _int_view(x), _int_view(y), codes, scale, meta, amax, flags, top, ts_code,
        n_units, n_chunks, p.C, p.TC, p.inner, p.nC, max(p.sub_cols, 1), _hash_key(seed),
        IN_KIND=_IN_KIND[x.dtype], WANT_Y=want_values, WANT_CODES=want_codes,
        PRE=not p.single, LAST=p.inner == 1, TILE=tile, NSUB=nsub, SUB=sub, BT=bt,
        SKIND=p.skind, SHIFT=bool(p.sub), ROUND=_ROUND[round_mode],
        NAN_BLOCK=s is not None and nan_policy is NanPolicy.BLOCK, NAN_TILE=tile_nan_int,
        FULL_INT=full_int_range and not e.is_float, KEEP_INF=s is None and e.has_inf,
        E_FLOAT=e.is_float, E_MBITS=e.mbits, E_EMIN=e.emin, E_EMAX=e.emax, E_MAXM=e.maxm,
        E_BITS=e.bits, E_NEGZERO=e.negzero, E_NANCODE=e.nan_code, E_INFCODE=e.inf_code,
        **defaults,
    )  # fmt: skip
    if want_values:
        out["values"] = y
    if want_codes:
        out["codes"] = codes.view(_code_torch_dtype(n.bits))
        if s is not None:
            out["scale"] = scale.view(_code_torch_dtype(s.scale.bits)).reshape(p.grid_shape)
            if p.sub:
                out["meta"] = meta.reshape(p.meta_shape)
            if s.tenscale is not None:
                t = ts_code.to(torch.int64) if s.tenscale.bits > 16 else ts_code
                out["tenscale"] = _to_code(t, s.tenscale.bits)
    return out


def _to_code(t: torch.Tensor, bits: int) -> torch.Tensor:
    if bits <= 16:
        return t.to(_store_dtype(bits)).view(_code_torch_dtype(bits))
    return t.to(torch.int32).view(torch.uint32)


def _unscaled_layout(p: _Plan) -> tuple[int, int, int, int, int]:
    tile = min(_BLOCK, triton.next_power_of_2(p.TC))
    return tile, 1, tile, triton.cdiv(p.TC, tile), 1


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
) -> torch.Tensor:
    """Values of unpacked codes (reference `dequantize`, bit for bit), as ``out_dtype``.

    Raises:
        NotImplementedError: the format is not implemented in Triton (see `plan`).
        ValueError: a missing scale, tensor scale or meta tensor.
        TypeError: an unsupported output dtype.
    """
    if out_dtype not in _IN_KIND:
        raise TypeError(f"upcast returns float32, float16 or bfloat16, not {out_dtype}")
    p = plan(tuple(shape), dt, axis)
    n, s = dt.nspec, dt.sspec
    dev = codes.device
    if s is not None and scale is None:
        raise ValueError(f"{dt.name}: dequantizing needs the scale tensor")
    if p.sub and meta is None:
        raise ValueError(f"{dt.name}: dequantizing needs the meta tensor")
    if s is not None and s.tenscale is not None and tenscale is None:
        raise ValueError(f"{dt.name}: dequantizing needs the tensor scale")
    tile, nsub, sub, n_chunks, bt = _layout(p) if p.skind else _unscaled_layout(p)
    n_units = p.n_inst * n_chunks
    bt = max(1, min(bt, triton.next_power_of_2(n_units)))
    y = torch.empty(shape, dtype=out_dtype, device=dev)
    dummy = torch.zeros(1, dtype=torch.int32, device=dev)
    c = codes.contiguous().reshape(-1)
    c = c.view(torch.int16) if c.dtype == torch.uint16 else c
    sc = dummy if scale is None else _flat_codes(scale)
    mt = dummy if meta is None else meta.contiguous().reshape(-1)
    stab = dummy
    ts = torch.ones(1, dtype=torch.float32, device=dev)
    s_f32 = False
    consts = dict(S_BIAS=0, S_NAN=0, S_MASK=0, S_F32=False, TS=False)
    if s is not None:
        if s.scale.is_exponent:
            consts.update(
                S_BIAS=s.scale.bias + _int_frac_bits(n), S_NAN=(1 << s.scale.ebits) - 1,
                S_MASK=(1 << s.scale.bits) - 1,
            )  # fmt: skip
        else:
            s_f32 = s.scale.bits == 32
            if not s_f32:
                stab = _decode_table(s.scale, str(dev))
            consts.update(S_MASK=(1 << s.scale.bits) - 1, S_F32=s_f32)
            if s.tenscale is not None:
                assert tenscale is not None
                tcode = tenscale.reshape(-1)[:1].cpu().numpy()
                from onnxq.cast.elements import decode_codes

                tval = decode_codes(tcode.astype(np.uint64), s.tenscale).astype(np.float32)
                ts = torch.from_numpy(tval).to(dev)
                consts.update(TS=True)
    _dequant_kernel[_programs(n_units, bt)](
        c, _int_view(y), sc, mt, _decode_table(n, str(dev)), stab, ts,
        n_units, n_chunks, p.C, p.TC, p.inner, p.nC, max(p.sub_cols, 1),
        OUT_KIND=_IN_KIND[out_dtype], LAST=p.inner == 1, TILE=tile, NSUB=nsub, SUB=sub, BT=bt,
        SKIND=p.skind, SHIFT=bool(p.sub), CODE_MASK=(1 << n.bits) - 1, **consts,
    )  # fmt: skip
    return y


def _flat_codes(t: torch.Tensor) -> torch.Tensor:
    flat = t.contiguous().reshape(-1)
    if flat.dtype == torch.uint16:
        return flat.view(torch.int16)
    if flat.dtype == torch.uint32:
        return flat.view(torch.int32)
    return flat


# -- packing on the device (packing.py's stream, with torch ops) -------------------------------
def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned codes (C order) into packing.py's little-endian uint8 stream.

    Raises:
        NotImplementedError: widths other than 1-8 and 16 bits.
    """
    flat = _flat_codes(codes)
    count = flat.numel()
    nbytes = (count * bits + 7) // 8
    if bits in (8, 16):
        return flat.view(torch.uint8)  # the kernels' code tensor is fresh: no copy needed
    if bits > 8:
        raise NotImplementedError(f"packing {bits}-bit codes on the device")
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
        NotImplementedError: widths other than 1-8 and 16 bits.
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
    if bits > 8:
        raise NotImplementedError(f"unpacking {bits}-bit codes on the device")
    groups = -(-count // 8)
    padded = torch.zeros(groups * bits, dtype=torch.int64, device=stream.device)
    padded[:need] = stream[:need].to(torch.int64)
    byte_shifts = torch.arange(bits, device=stream.device, dtype=torch.int64) * 8
    word = (padded.view(groups, bits) << byte_shifts).sum(dim=1)
    shifts = torch.arange(8, device=stream.device, dtype=torch.int64) * bits
    codes = (word[:, None] >> shifts) & ((1 << bits) - 1)
    return codes.reshape(-1)[:count].to(torch.uint8)
