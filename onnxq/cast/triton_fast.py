"""The Triton engine's fast path: dense tiles along the last axis, round-half-even, one pass.

`onnxq.cast.triton` serves every layout with integer arithmetic on float32 bits, which is
exact everywhere but costs about a hundred integer operations per element: on an H100 that
bounds a cast at a fifth of memory speed. This module serves the common case - tiles of a
power-of-two length that divide the last axis, round-half-even, exponent (MX, BFP, MX9/6/4)
or float (NVFP4) scales, elements of at most 8 bits - with float arithmetic that gives the
same bits in about fifteen operations per element:

- scaling by ``2^-sexp`` is a float32 multiply. It is exact except where the product falls
  below 2^-126; such values lie far below half the element grid's smallest step
  (`_supported` checks that margin), so they round to zero either way.
- rounding to the element grid is the "magic number" addition: ``(a + M) - M`` with
  ``M = 2^(e - mbits + 23)``, ``e = max(exponent(a), emin)``, rounds ``a`` to a multiple of
  ``2^(e - mbits)`` half-to-even, because the sum's last mantissa bit has that weight.
  Inputs are clamped to twice the largest element first, so Inf and huge values saturate.
- element codes are the float32 bits of the rounded value moved so that the element format's
  smallest normal exponent lands on float32's (float32 subnormals are linear, like the
  element format's), shifted right by ``23 - mbits``.
- compress mode packs the codes inside the kernel (groups of 8/gcd(8, b) codes make whole
  bytes), so the codes never go through memory unpacked.

The program loads ``BT`` whole tiles as one contiguous block (vectorised loads), computes
tile statistics, the scale, the values or codes, and stores once. NVFP4's tensor amax is one
reduction pass before the cast. Fused multiply-add contraction is off: every float operation
is rounded as written. Everything else goes to `onnxq.cast.triton`.
"""

# Kernel parameters are tl.constexpr and upper case (Triton's convention).
# ruff: noqa: N803

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

from onnxq.cast.elements import nan_code
from onnxq.cast.triton_bits import _int_view
from onnxq.cast.triton_device import _load_bits, _scale_exp
from onnxq.cast.triton_plan import _IN_KIND, _SMODE, _elem_fmt
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode

__all__ = ["FastPlan", "fast_plan", "quantize", "why_not_fast"]

_BLOCK, _WARPS = 4096, 8  # elements and warps per program (benchmarks/gpu.py --sweep)
_AMAX_BLOCK, _AMAX_PROGRAMS = 4096, 1056  # the tensor-amax pass: 8 programs per H100 SM


def _pack3d() -> bool:
    """Whether float-scale (NVFP4) compress packs from a 3-D block, groups innermost.

    Measured on an H100 (8192^2 and 16384^2, CUDA graphs, x copy): NVFP4 0.31-0.44 flat,
    0.35-0.51 in 3-D; but MXFP4 0.62-0.92 flat against 0.57-0.71, and MXFP6 0.58-0.87
    against 0.15-0.26, so exponent-scale formats keep the flattened block.
    ``ONNXQ_TRITON_PACK3D=0`` turns it off.
    """
    return os.environ.get("ONNXQ_TRITON_PACK3D", "1") != "0"


def _config() -> tuple[int, int]:
    """(elements, warps) per program; ``ONNXQ_TRITON_FAST_CONFIG=8192:16`` overrides them."""
    text = os.environ.get("ONNXQ_TRITON_FAST_CONFIG", "")
    if not text:
        return _BLOCK, _WARPS
    try:
        block, warps = (int(v) for v in text.split(":"))
    except ValueError:
        block = warps = 0
    if block < 1024 or block & (block - 1) or warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(
            f"ONNXQ_TRITON_FAST_CONFIG={text!r}: expected BLOCK:WARPS, BLOCK a power of two "
            f">= 1024 and WARPS one of 1, 2, 4, 8, 16, 32, e.g. 4096:8"
        )
    return block, warps


@dataclasses.dataclass(frozen=True)
class FastPlan:
    """Geometry of one fast cast: ``n_tiles`` tiles of ``tc`` elements, ``bt`` a program."""

    n_tiles: int
    tc: int
    nsub: int
    sub: int
    bt: int
    warps: int


def why_not_fast(
    shape: tuple[int, ...], dt: DataType, axis: int, round_mode: RoundMode
) -> str | None:
    """Why the fast path cannot take this cast, or None."""
    n, s = dt.nspec, dt.sspec
    if round_mode is not RoundMode.EVEN:
        return "round modes other than even"
    if s is None or isinstance(n, Codebook):
        return "unscaled or codebook format"
    if s.is_2d or s.is_tensor or s.sparsity[1] or s.zero is not None:
        return "2-D or tensor tiles, sparsity or zero points"
    if not shape or axis % len(shape) != len(shape) - 1:
        return "tiles not along the last axis"
    if n.bits > 8 or s.scale.bits > 8:
        return "elements or scales over 8 bits"
    tc = s.tiles[0].size
    if tc <= 0 or tc & (tc - 1) or tc > 1024 or shape[-1] % tc:
        return "tile length not a power of two dividing the last axis"
    if s.scale.is_exponent:
        frac = n.int_fraction_bits
        low = -s.scale.bias - frac
        high = (1 << s.scale.ebits) - 2 - s.scale.bias - frac
        # 2^sexp (and 2^(sexp - 1) for MX shifts) must be float32 numbers
        if low - 1 < -149 or high > 127:
            return "scale exponents beyond float32"
        if n.is_float and -(low - bool(s.tiles[0].subtile)) > 127:
            return "float elements whose 2^-scale exceeds float32"
    else:
        for spec in (s.scale, s.tenscale):
            if spec is not None and not (
                spec.is_float and spec.bits <= 32 and spec.mbits <= 23 and spec.emin >= -126
            ):
                return "float scales beyond float32"
    # Underflow below 2^-126 must stay far under half the element grid's smallest step.
    if n.is_float and not (n.emin - n.mbits >= -100 and n.emin <= 20 and n.mbits <= 20):
        return "element format outside float32's exact range"
    return None


def fast_plan(
    shape: tuple[int, ...], dt: DataType, axis: int, round_mode: RoundMode
) -> FastPlan | None:
    """The fast path's plan for this cast, or None when `onnxq.cast.triton` must do it."""
    if os.environ.get("ONNXQ_TRITON_FAST", "1") == "0":
        return None
    return _fast_plan(tuple(shape), dt, axis, round_mode, *_config())


@functools.lru_cache(maxsize=512)
def _fast_plan(
    shape: tuple[int, ...], dt: DataType, axis: int, round_mode: RoundMode, block: int, warps: int
) -> FastPlan | None:
    if math.prod(shape) == 0 or why_not_fast(shape, dt, axis, round_mode) is not None:
        return None
    s = dt.sspec
    assert s is not None
    tc = s.tiles[0].size
    sub = s.tiles[0].subtile or tc
    return FastPlan(math.prod(shape) // tc, tc, tc // sub, sub, max(1, block // tc), warps)


def _group(bits: int) -> tuple[int, int]:
    """(codes, bytes) of the smallest whole-byte group of ``bits``-bit codes."""
    g = 8 // math.gcd(8, bits)
    return g, g * bits // 8


# -- device helpers ---------------------------------------------------------------------------
@triton.jit
def _pow2(k):
    # 2.0^k as float32 for -149 <= k <= 127 (subnormal powers included)
    b = tl.where(k >= -126, (k + 127) << 23, 1 << tl.minimum(tl.maximum(k + 149, 0), 30))
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _expand(
    t,
    BT: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    TC: tl.constexpr,
    SHIFT: tl.constexpr,
    G3: tl.constexpr,
):
    # a value per unit -> a value per element of the block: (BT, TC), or (BT, TC // G3, G3)
    # when G3 > 1 (compress: groups of G3 codes that pack into whole bytes)
    if SHIFT:
        return tl.reshape(tl.broadcast_to(t[:, :, None], (BT, NSUB, SUB)), (BT, TC))
    elif G3 > 1:
        return tl.broadcast_to(t[:, None, None], (BT, TC // G3, G3))
    else:
        return tl.broadcast_to(t[:, None], (BT, TC))


@triton.jit
def _round_float(a, MBITS: tl.constexpr, EMIN: tl.constexpr, MAXF: tl.constexpr):
    # a >= 0: round half-even onto the grid of a float format with MBITS mantissa bits and
    # smallest normal exponent EMIN, saturating at MAXF. Inf (and NaN, whose lanes are the
    # caller's) make a garbage magic and a NaN sum, which min() turns into MAXF.
    ea = a.to(tl.int32, bitcast=True) >> 23
    magic = ((tl.maximum(ea, EMIN + 127) << 23) + ((23 - MBITS) << 23)).to(tl.float32, bitcast=True)
    return tl.minimum((a + magic) - magic, MAXF)


@triton.jit
def _float_code_of(r, MBITS: tl.constexpr, EMIN: tl.constexpr):
    # magnitude code of a grid value r: its bits with EMIN moved onto float32's -126
    rc = r * _pow2(tl.full(r.shape, -126, tl.int32) - EMIN)
    return rc.to(tl.int32, bitcast=True) >> (23 - MBITS)


@triton.jit
def _pack_store(
    ptr,
    codes,
    pid,
    nbytes,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    BITS: tl.constexpr,
    G: tl.constexpr,
    NB: tl.constexpr,
    GROUPED: tl.constexpr,
):
    # Write this program's ROWS x COLS codes (C order) as packing.py's little-endian bit
    # stream: groups of G codes fill NB whole bytes, and the program's stream starts on a
    # byte. GROUPED: the block is (ROWS, COLS // G, G) already, each group innermost (NVFP4).
    # Otherwise the (ROWS, COLS) block is flattened first: splitting its rows in place
    # instead made 6-bit packing 3x slower on an H100 (0.6-0.8 -> 0.2-0.3 of a copy).
    if GROUPED:
        c = codes
        gidx = tl.arange(0, ROWS)[:, None] * (COLS // G) + tl.arange(0, COLS // G)[None, :]
    else:
        c = tl.reshape(tl.reshape(codes, (ROWS * COLS,)), (ROWS * COLS // G, G))
        gidx = tl.arange(0, ROWS * COLS // G)
    shifts = tl.arange(0, G) * BITS
    if G * BITS > 32:
        word = tl.sum(c.to(tl.int64) << shifts.to(tl.int64), axis=-1)
    else:
        word = tl.sum(c << shifts, axis=-1)
    base = pid.to(tl.int64) * (ROWS * COLS // G * NB)
    for b in tl.static_range(NB):
        byte = ((word >> (8 * b)) & 0xFF).to(tl.uint8)
        pos = base + gidx * NB + b
        tl.store(ptr + pos, byte, mask=pos < nbytes)


@triton.jit
def _tile_any(flag, G3: tl.constexpr):
    # per tile (axis 0): does any element of the block have the flag
    if G3 > 1:
        return tl.max(tl.max(flag.to(tl.int32), axis=2), axis=1) > 0
    else:
        return tl.max(flag.to(tl.int32), axis=1) > 0


@triton.jit
def _amax_kernel(
    x_ptr, top_ptr, numel, IN_KIND: tl.constexpr, BLOCK: tl.constexpr, ROUNDS: tl.constexpr
):
    # Finite absmax of the whole tensor (float32 bits: non-negative, so an integer max).
    # Each program takes ROUNDS blocks (a power of two, so few compiles), then one atomic:
    # thousands of atomics on one word would serialise.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros((BLOCK,), tl.int32)
    for i in range(ROUNDS):
        offs = (pid + i * nprog).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        xb, _raw = _load_bits(x_ptr, offs, offs < numel, IN_KIND)
        ab = xb & 0x7FFFFFFF
        acc = tl.maximum(acc, tl.where(ab < 0x7F800000, ab, 0))
    tl.atomic_max(top_ptr, tl.max(acc, axis=0))


@triton.jit
def _fast_kernel(
    x_ptr,
    y_ptr,
    code_ptr,
    scale_ptr,
    meta_ptr,
    top_ptr,
    ts_code_ptr,
    n_tiles,
    code_nbytes,
    meta_nbytes,
    TC: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    BT: tl.constexpr,
    OUT_KIND: tl.constexpr,
    HW_BF16: tl.constexpr,
    WANT_Y: tl.constexpr,
    WANT_CODES: tl.constexpr,
    PACKED: tl.constexpr,
    G3: tl.constexpr,  # > 1: the block is (BT, TC // G3, G3), packing groups innermost
    NAN_MODE: tl.constexpr,  # 0 element NaNs, 1 a NaN makes the tile NaN, 2 so does an Inf
    SKIND: tl.constexpr,  # 1 exponent scale, 2 float scale
    SHIFT: tl.constexpr,
    SPLIT: tl.constexpr,  # 2^-sexp may exceed float32: scale by two factors
    E_FLOAT: tl.constexpr,
    E_MBITS: tl.constexpr,
    E_EMIN: tl.constexpr,
    E_EMAX: tl.constexpr,
    E_MAXF: tl.constexpr,
    E_BITS: tl.constexpr,
    E_G: tl.constexpr,
    E_NB: tl.constexpr,
    E_NEGZERO: tl.constexpr,
    E_NANCODE: tl.constexpr,
    E_LIM: tl.constexpr,
    FULL_INT: tl.constexpr,
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
    S_MAXF: tl.constexpr,
    TS: tl.constexpr,
    TS_DENOM: tl.constexpr,
    T_ROUND: tl.constexpr,
    T_MBITS: tl.constexpr,
    T_EMIN: tl.constexpr,
    T_MAXF: tl.constexpr,
):
    BLOCK: tl.constexpr = BT * TC
    # The output type's largest finite value, and the float32 bits from which rounding to it
    # gives Inf: no finite input decodes past them (reference `finite_bound`).
    if OUT_KIND == 0:
        F_MAX: tl.constexpr = 3.4028234663852886e38
        F_OVER: tl.constexpr = 0x7F800000
    elif OUT_KIND == 1:
        F_MAX: tl.constexpr = 65504.0
        F_OVER: tl.constexpr = 0x477FF000
    else:
        F_MAX: tl.constexpr = 3.3895313892515355e38
        F_OVER: tl.constexpr = 0x7F7F8000
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * BLOCK
    tile = pid * BT + tl.arange(0, BT)
    t_ok = tile < n_tiles
    if G3 > 1:
        # Compress with sub-byte codes: each packing group lies along the innermost axis,
        # so the bytes come out of an in-register sum, with no reshape of the block
        offs = (
            tl.arange(0, BT)[:, None, None] * TC
            + tl.arange(0, TC // G3)[None, :, None] * G3
            + tl.arange(0, G3)[None, None, :]
        )
        ok = t_ok[:, None, None] & (offs >= 0)
    else:
        offs = tl.arange(0, BT)[:, None] * TC + tl.arange(0, TC)[None, :]
        ok = t_ok[:, None] & (offs >= 0)
    xb, _raw = _load_bits(x_ptr + start, offs, ok, OUT_KIND)
    ab = xb & 0x7FFFFFFF
    a = ab.to(tl.float32, bitcast=True)
    neg = xb < 0
    elem_nan = ab > 0x7F800000
    finite = ab < 0x7F800000
    absf = tl.where(finite, ab, 0)
    if SHIFT:
        sub_max = tl.max(tl.reshape(absf, (BT, NSUB, SUB)), axis=2)
        amax_b = tl.max(sub_max, axis=1)
    elif G3 > 1:
        amax_b = tl.max(tl.max(absf, axis=2), axis=1)
    else:
        amax_b = tl.max(absf, axis=1)
    if NAN_MODE == 1:
        tnan = _tile_any(elem_nan, G3)
    elif NAN_MODE == 2:
        tnan = _tile_any(~finite, G3)
    else:
        tnan = t_ok & False
    tile_nan = _expand(tnan, BT, NSUB, SUB, TC, False, G3) & ok
    if SKIND == 1:
        sexp, maxexp = _scale_exp(
            amax_b, E_FLOAT, E_MBITS, E_EMAX, SMODE, MID_T, TOP_T, S_LOW, S_HIGH
        )
        scode = tl.where(tnan, S_NAN, sexp + S_BIAS)
        # Scale factors per unit (a tile, or an MX subtile whose exponent is one lower), so
        # each element pays a multiply, not the power-of-two arithmetic.
        if SHIFT:
            # MX: a subtile is shifted when all of it is below 2^floor(log2 amax)
            p2 = _pow2(tl.maximum(maxexp, -149)).to(tl.int32, bitcast=True)
            below = (sub_max < p2[:, None]) & (amax_b[:, None] != 0)
            eu = sexp[:, None] - below.to(tl.int32)
        else:
            eu = sexp
        if SPLIT:
            # 2^-eu may exceed float32: scale by 2^-(eu + K) and round onto a grid 2^K finer
            k = tl.maximum(-eu - 127, 0)
        else:
            k = eu * 0
        v = a * _expand(_pow2(-eu - k), BT, NSUB, SUB, TC, SHIFT, G3)
        eff = _expand(_pow2(eu + k), BT, NSUB, SUB, TC, SHIFT, G3)
        if SPLIT:
            kk = _expand(k, BT, NSUB, SUB, TC, SHIFT, G3)
        else:
            kk = 0
        # The element bound per unit: the grid floor of max / 2^eu (Inf: none needed; so
        # is every 2^-eu beyond float32, where SPLIT scales in two steps).
        reach = F_MAX * _pow2(tl.minimum(tl.maximum(-eu, -149), 127))
        reach = tl.where(-eu > 127, float("inf"), reach)
        if E_FLOAT:
            rl = tl.maximum((reach.to(tl.int32, bitcast=True) >> 23) - 127, E_EMIN) - E_MBITS
            gl = tl.floor(reach * _pow2(-rl)) * _pow2(rl)
            bound = tl.where(reach >= E_MAXF, float("inf"), gl)
        else:
            bound = tl.where(reach >= E_LIM + 1.0, float("inf"), tl.floor(reach))
        bound = _expand(bound, BT, NSUB, SUB, TC, SHIFT, G3)
    else:
        # float scale: scale = cast(amax / maxfloat [/ tensor scale]); v = x / scale
        amax_f = amax_b.to(tl.float32, bitcast=True)
        raw_s = tl.div_rn(amax_f, tl.full(amax_f.shape, EL_MAXF, tl.float32))
        if TS:
            top = tl.load(top_ptr).to(tl.float32, bitcast=True)
            tsr = tl.div_rn(top, tl.full(top.shape, TS_DENOM, tl.float32))
            if T_ROUND:
                ts = _round_float(tsr, T_MBITS, T_EMIN, T_MAXF)
            else:
                ts = tsr
            raw_s = tl.where(ts > 0, tl.div_rn(raw_s, tl.broadcast_to(ts, raw_s.shape)), 0.0)
            if T_ROUND:
                tcode = _float_code_of(ts, T_MBITS, T_EMIN)
            else:
                tcode = ts.to(tl.int32, bitcast=True)
            tl.store(ts_code_ptr, tcode, mask=pid == 0)
        sc = _round_float(raw_s, S_MBITS, S_EMIN, S_MAXF)
        scode = tl.where(tnan, S_NAN, _float_code_of(sc, S_MBITS, S_EMIN))
        if TS:
            eff_t = sc * ts
        else:
            eff_t = sc
        eff = _expand(eff_t, BT, NSUB, SUB, TC, False, G3)
        v = tl.where(eff > 0, tl.div_rn(a, eff), 0.0)
        kk = 0
        bound = float("inf")
    if E_FLOAT:
        r = _round_float(v, E_MBITS, E_EMIN, E_MAXF)
    elif SPLIT:
        # v < 2^(22 - K) rounds to a multiple of 2^-K; Inf's NaN sum meets min() below
        magic = ((150 - kk) << 23 | 0x400000).to(tl.float32, bitcast=True)
        r = (v + magic) - magic
        if FULL_INT:
            r = tl.minimum(r, (E_LIM + neg.to(tl.float32)) * _pow2(-kk))
        else:
            r = tl.minimum(r, E_LIM * _pow2(-kk))
    else:
        # v < 2^22 (the scale bounds it) rounds to an integer; Inf's NaN sum meets min()
        r = (v + 12582912.0) - 12582912.0
        if FULL_INT:
            r = tl.minimum(r, E_LIM + neg.to(tl.float32))
        else:
            r = tl.minimum(r, E_LIM)
    r = tl.minimum(r, bound)
    if SKIND == 2:
        # products that round past the output type's range step down the grid (reference
        # `_product_bound`; two steps cover every rounding of the scale)
        for _step in tl.static_range(2):
            bad = ((r * eff).to(tl.int32, bitcast=True) & 0x7FFFFFFF) >= F_OVER
            if E_FLOAT:
                pred = (r.to(tl.int32, bitcast=True) - (1 << (23 - E_MBITS))).to(
                    tl.float32, bitcast=True
                )
            else:
                pred = r - 1.0
            r = tl.where(bad & (r > 0), pred, r)
    sgn = neg & ((r != 0) | E_NEGZERO)
    if WANT_Y:
        # r * eff is finite or Inf: NaN comes only from the input (elements) or the tile
        if E_NEGZERO:
            yb = (r * eff).to(tl.int32, bitcast=True) | (xb & -2147483648)
        else:
            yb = (r * eff).to(tl.int32, bitcast=True) | tl.where(r > 0, xb & -2147483648, 0)
        if E_FLOAT:
            nan = tile_nan | elem_nan
        else:
            nan = tile_nan
        # every NaN is the canonical quiet NaN of the output type (reference._canonical_nan)
        if OUT_KIND == 0:
            out = tl.where(nan, 0x7FC00000, yb)
        elif OUT_KIND == 1:
            h = yb.to(tl.float32, bitcast=True).to(tl.float16).to(tl.int16, bitcast=True)
            out = tl.where(nan, 0x7E00, h).to(tl.int16)
        elif HW_BF16:  # cvt.rn.bf16.f32: one instruction, round half-even, subnormals kept
            h = yb.to(tl.float32, bitcast=True).to(tl.bfloat16).to(tl.int16, bitcast=True)
            out = tl.where(nan, 0x7FC0, h).to(tl.int16)
        else:  # the interpreter's conversion does not round half-even: do it on the bits
            mag = yb & 0x7FFFFFFF
            h = ((mag + 0x7FFF + ((mag >> 16) & 1)) >> 16) | ((yb >> 16) & 0x8000)
            out = tl.where(nan, 0x7FC0, h).to(tl.int16)
        tl.store(y_ptr + start + offs, out, mask=ok)
    if WANT_CODES:
        if E_FLOAT:
            code = _float_code_of(r, E_MBITS, E_EMIN) | (sgn.to(tl.int32) << (E_BITS - 1))
            code = tl.where(elem_nan & ~tile_nan, E_NANCODE, code)
        else:
            if SPLIT:
                n = (r * _pow2(kk)).to(tl.int32)
            else:
                n = r.to(tl.int32)
            code = tl.where(neg, -n, n) & ((1 << E_BITS) - 1)
        code = tl.where(tile_nan, 0, code)
        if PACKED:
            if E_G == 1:
                tl.store(code_ptr + start + offs, code.to(tl.uint8), mask=ok)
            else:
                _pack_store(code_ptr, code, pid, code_nbytes, BT, TC, E_BITS, E_G, E_NB, G3 > 1)
        else:
            tl.store(code_ptr + start + offs, code.to(tl.uint8), mask=ok)
        tl.store(scale_ptr + tile, scode.to(tl.uint8), mask=t_ok)
        if SHIFT:
            bits = below.to(tl.int32) & t_ok[:, None]
            if PACKED:
                _pack_store(meta_ptr, bits, pid, meta_nbytes, BT, NSUB, 1, 8, 1, False)
            else:
                moffs = tile[:, None] * NSUB + tl.arange(0, NSUB)[None, :]
                tl.store(meta_ptr + moffs, bits.to(tl.uint8), mask=t_ok[:, None])


# -- host side ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Launch:
    """What one cast needs beside its tensors: sizes and the kernel's constexpr arguments."""

    grid: tuple[int]
    n_tiles: int
    code_nbytes: int
    meta_count: int
    meta_nbytes: int
    tensor_scale: bool
    consts: dict[str, Any]


@functools.lru_cache(maxsize=512)
def _launch(
    dt: DataType,
    shape: tuple[int, ...],
    in_kind: int,
    fp: FastPlan,
    scale_mode: ScaleMode,
    nan_policy: NanPolicy,
    full_int_range: bool,
    want_values: bool,
    want_codes: bool,
    packed: bool,
    interpreting: bool,
    pack3d: bool,
) -> _Launch:
    # Worked out once per cast signature: the format arithmetic costs more host time than
    # the kernel takes on a 64 MiB tensor.
    n, s = dt.nspec, dt.sspec
    assert s is not None and not isinstance(n, Codebook)
    e = _elem_fmt(n)
    numel = math.prod(shape)
    code_nbytes = (numel * n.bits + 7) // 8 if packed else numel
    meta_count = fp.n_tiles * fp.nsub if s.tiles[0].subtile else 0
    meta_nbytes = (meta_count + 7) // 8 if packed else meta_count
    g, nb = _group(n.bits)
    if n.is_float:
        nan_mode = 2 if nan_policy is NanPolicy.BLOCK else 0
    else:
        nan_mode = 2 if nan_policy is NanPolicy.BLOCK else 1
    consts: dict[str, Any] = dict(
        SMODE=0, MID_T=0, TOP_T=0, S_LOW=0, S_HIGH=0, S_BIAS=0, S_NAN=0, EL_MAXF=1.0,
        S_MBITS=0, S_EMIN=0, S_MAXF=1.0, TS=False, TS_DENOM=1.0, T_ROUND=False, T_MBITS=0,
        T_EMIN=0, T_MAXF=1.0, SPLIT=False,
    )  # fmt: skip
    if s.scale.is_exponent:
        frac = n.int_fraction_bits
        low, high = -s.scale.bias - frac, (1 << s.scale.ebits) - 2 - s.scale.bias - frac
        mid_t = top_t = 0
        if e.is_float:
            mid_t = (2 * e.maxm + 1) << (22 - e.mbits) if e.mbits <= 22 else 0
            top_t = e.maxm << (23 - e.mbits)
        consts.update(
            SKIND=1, SMODE=_SMODE[scale_mode] if e.is_float else 0, MID_T=mid_t, TOP_T=top_t,
            S_LOW=low, S_HIGH=high, S_BIAS=s.scale.bias + frac,
            S_NAN=(1 << s.scale.ebits) - 1,
            SPLIT=-(low - bool(s.tiles[0].subtile)) > 127,
        )  # fmt: skip
    else:
        consts.update(
            SKIND=2, S_NAN=nan_code(s.scale), EL_MAXF=float(np.float32(n.maxfloat)),
            S_MBITS=s.scale.mbits, S_EMIN=s.scale.emin, S_MAXF=float(s.scale.maxfloat),
        )  # fmt: skip
        if s.tenscale is not None:
            t = s.tenscale
            denom = np.float32(n.maxfloat) * np.float32(s.scale.maxfloat)
            consts.update(
                TS=True, TS_DENOM=float(denom), T_ROUND=t.mbits < 23 or t.emin > -126,
                T_MBITS=t.mbits, T_EMIN=t.emin, T_MAXF=float(np.float32(t.maxfloat)),
            )  # fmt: skip
    consts.update(
        TC=fp.tc, NSUB=fp.nsub, SUB=fp.sub, BT=fp.bt, OUT_KIND=in_kind,
        HW_BF16=not interpreting, WANT_Y=want_values, WANT_CODES=want_codes, PACKED=packed,
        G3=g if packed and g > 1 and not s.scale.is_exponent and pack3d else 1,
        NAN_MODE=nan_mode, SHIFT=bool(s.tiles[0].subtile), E_FLOAT=e.is_float,
        E_MBITS=e.mbits, E_EMIN=e.emin, E_EMAX=e.emax, E_MAXF=float(n.maxfloat), E_BITS=n.bits,
        E_G=g, E_NB=nb, E_NEGZERO=e.negzero, E_NANCODE=e.nan_code, E_LIM=float(e.maxm),
        FULL_INT=full_int_range and not e.is_float, num_warps=fp.warps,
        enable_fp_fusion=False,
    )  # fmt: skip
    grid = (triton.cdiv(fp.n_tiles, fp.bt),)
    return _Launch(
        grid, fp.n_tiles, code_nbytes, meta_count, meta_nbytes, s.tenscale is not None, consts
    )


@functools.lru_cache(maxsize=16)
def _placeholder(device: torch.device) -> torch.Tensor:
    """A one-byte tensor for the pointer arguments a cast does not use."""
    return torch.zeros(1, dtype=torch.int32, device=device)


def quantize(
    x: torch.Tensor,
    dt: DataType,
    fp: FastPlan,
    *,
    scale_mode: ScaleMode,
    nan_policy: NanPolicy,
    full_int_range: bool,
    want_values: bool,
    want_codes: bool,
    packed: bool,
) -> dict[str, Any]:
    """`onnxq.cast.triton.quantize` for a cast `fast_plan` accepted, bit for bit.

    Returns:
        The same dict as `onnxq.cast.triton.quantize`; with ``packed``, ``codes`` and
        ``meta`` are packing.py's byte streams (compress mode) instead of unpacked codes.
    """
    x = x.contiguous()
    shape = tuple(x.shape)
    launch = _launch(
        dt, shape, _IN_KIND[x.dtype], fp, scale_mode, nan_policy, full_int_range,
        want_values, want_codes, packed, os.environ.get("TRITON_INTERPRET", "") == "1", _pack3d(),
    )  # fmt: skip
    dev = x.device
    unused = _placeholder(dev)
    u8 = torch.uint8
    y = torch.empty_like(x) if want_values else unused
    codes = scale = meta = top = ts_code = unused
    if want_codes:
        codes = torch.empty(launch.code_nbytes, dtype=u8, device=dev)
        scale = torch.empty(launch.n_tiles, dtype=u8, device=dev)
        if launch.meta_count:
            meta = torch.empty(launch.meta_nbytes, dtype=u8, device=dev)
    x_bits = _int_view(x)
    if launch.tensor_scale:
        top = torch.zeros(1, dtype=torch.int32, device=dev)
        ts_code = torch.empty(1, dtype=torch.int32, device=dev)
        numel = x.numel()
        blocks = triton.cdiv(numel, _AMAX_BLOCK)
        rounds = triton.next_power_of_2(triton.cdiv(blocks, _AMAX_PROGRAMS))
        _amax_kernel[(triton.cdiv(blocks, rounds),)](
            x_bits, top, numel, IN_KIND=_IN_KIND[x.dtype], BLOCK=_AMAX_BLOCK, ROUNDS=rounds,
            num_warps=8,
        )  # fmt: skip
    _fast_kernel[launch.grid](
        x_bits, _int_view(y) if want_values else y, codes, scale, meta, top, ts_code,
        launch.n_tiles, launch.code_nbytes, launch.meta_nbytes, **launch.consts,
    )  # fmt: skip
    out: dict[str, Any] = {}
    if want_values:
        out["values"] = y
    if not want_codes:
        return out
    out["codes"] = codes if packed else codes.view(shape)
    out["scale"] = scale.view(*shape[:-1], shape[-1] // fp.tc)
    if launch.meta_count:
        out["meta"] = meta if packed else meta.view(*shape[:-1], shape[-1] // fp.sub)
    tenscale = dt.sspec.tenscale if dt.sspec is not None else None
    if tenscale is not None:
        if tenscale.bits <= 8:
            out["tenscale"] = ts_code.to(torch.uint8)
        elif tenscale.bits <= 16:
            out["tenscale"] = ts_code.to(torch.int16).view(torch.uint16)
        else:
            out["tenscale"] = ts_code.view(torch.uint32)
    return out
