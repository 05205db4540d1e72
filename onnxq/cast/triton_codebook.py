"""Triton codebook casts: the reference's `_codebook_select` on torch tensors, bit for bit.

A codebook element is the nearest entry of one of 2^meta_bits mappings (lookup tables); the
mapping of each unit (subtile, else tile) is the one with the least L2 error, the errors
added in float64 left to right (reference `l2_metric`), ties to the earlier mapping. The tile
scale is an exponent (E8M0-like) computed from the compute type, as for float elements.

One kernel pass per cast: each program loads whole tiles once and writes values (virtual) or
codes, scales and meta (actual / compress). The per-element arithmetic replays the
reference's float64 operations (scaled value, neighbour distances, squared error), which are
exact IEEE operations on both the GPU (launched with ``enable_fp_fusion=False``: no fused
multiply-adds) and the interpreter. Only the order of the per-unit sum differs: the kernel
adds with a tree (`tl.sum`), whose result is within ``(n - 1) * 2^-53`` (relative) of the
left-to-right sum. A mapping is chosen on the tree sums when they differ by more than a
margin well above that bound, or when the two candidates quantize the unit identically
(equal terms give equal sums in any order), or when the sums are NaN or Inf (a NaN or Inf
element makes every mapping's sum so, in any order: a tie). Otherwise (a near-tie), the
program redoes the choice with the sums in the reference's order - rare, and decided on the
device (no host synchronisation).

Values leave the kernel as ``q * 2^sexp`` rounded once to float32 with integer bit
arithmetic (as the reference's float64 -> float32 cast), then to float16 / bfloat16 as
numpy's ``astype`` does.

Tiles up to 1024 elements: BT whole tiles per program, loaded once (`_cb_quant_kernel`).
Longer tiles (channel ``t0``, a tensor scale, ``t2048``...): one program per tile, in chunks
(the same kernel with ``LONG``): a statistics pass, then with subtiles one pass choosing and
writing, and without (the tile is the unit) one pass adding every mapping's errors (margin
2^-50 * n, n the tile length) and one writing - the tile is read 2-3 times (from L2 when it
fits). Its near-tie pass adds 512 elements per step one at a time (slow, and rare).

Supported: 1-D tiles on any axis and tensor scales, with or without subtiles (up to 1024
elements each), exponent scales up to 8 bits, compute types up to 16 bits (table values are
float32 numbers). Not here (`supports` says why): 2-D tiles, N:M sparsity, custom metrics (the
reference only), stochastic rounding (no backend has it).
"""

# Layout, mode and codebook-shape parameters are tl.constexpr and upper case (Triton's
# convention); the format's numbers are runtime arguments (fewer compiles).
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

from onnxq.cast.layout import Tiling
from onnxq.cast.triton_bits import _int_view
from onnxq.cast.triton_device import _ldexp_bits, _load_bits, _scale_exp_t, _store_values
from onnxq.cast.triton_plan import _IN_KIND, _bump_threshold, _elem_fmt
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode

__all__ = ["dequantize", "meta_shape", "quantize", "supports"]

_ROUND = {RoundMode.EVEN: 0, RoundMode.AWAY: 1, RoundMode.ZERO: 2}
_MAX_TILE = 1024  # a tile (or a whole-tensor scale's tensor) must fit one program
_BLOCK = 512  # elements per program (float64 work: about 100 registers per thread at 4 warps)
_NUM_WARPS = 4
_CHUNK = 512  # elements per step of a long tile's program
_FORCE_ORDERED = False  # tests: take the reference-order pass in every program


# -- geometry --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Geom:
    """Tile geometry: the input seen as (outer, C, inner), C tiled in tiles of TC."""

    tiling: Tiling
    outer: int
    inner: int
    C: int
    TC: int
    nC: int
    n_inst: int
    nsub: int  # subtiles per tile (1 without subtiles)
    sub: int  # elements per subtile (TC without subtiles)
    sub_cols: int  # subtiles along the axis that hold data (meta grid)
    tensor: bool  # one tile: the whole tensor, in the reference's moved order

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """Scale (and per-tile meta) grid layout (layout.py `tile_grid`)."""
        if self.tensor:
            return (1,)
        s, a = self.tiling.shape, self.tiling.axis
        return (*s[:a], self.nC, *s[a + 1 :])

    @property
    def meta_shape(self) -> tuple[int, ...]:
        """Meta grid layout: per subtile (layout.py `sub_grid`), else per tile."""
        if not self.tiling.Sc:
            return self.grid_shape
        s, a = self.tiling.shape, self.tiling.axis
        return (*s[:a], self.sub_cols, *s[a + 1 :])


def supports(dt: DataType, shape: tuple[int, ...], axis: int) -> str | None:
    """None when this module can cast ``shape`` to codebook ``dt``, else the reason why not."""
    n, s = dt.nspec, dt.sspec
    name = dt.name
    if not isinstance(n, Codebook):
        return f"{name} is not a codebook format"
    if s is None or not s.scale.is_exponent:
        return f"the Triton codebook engine needs an exponent scale ({name})"
    if s.is_2d:
        return f"the Triton codebook engine does not implement 2-D tiles ({name})"
    if s.sparsity[1]:
        return f"the Triton codebook engine does not implement N:M sparsity ({name})"
    if s.scale.ebits > 8:
        return f"the Triton codebook engine does not implement exponent scales over 8 bits ({name})"
    if n.compute.bits > 16:
        return f"the Triton codebook engine needs a compute type of at most 16 bits ({name})"
    if not n.is_populated:
        return f"{name}: the generic codebook has no mappings yet (add_mappings)"
    if not _float32_table(n, n.magnitudes()):
        return f"the Triton codebook engine needs table values that are float32 numbers ({name})"
    if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        return f"the Triton codebook engine needs a non-empty shape, got {shape}"
    if not -len(shape) <= axis < len(shape):
        return f"axis {axis} is out of range for shape {shape}"
    tiling = Tiling.build(tuple(shape), axis, s)
    if tiling.Sc > _MAX_TILE:
        return (
            f"the Triton codebook engine does not implement subtiles over {_MAX_TILE} "
            f"elements ({name})"
        )
    return None


def meta_shape(dt: DataType, shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """Shape of the unpacked meta grid (what a compress-mode meta stream unpacks to)."""
    return _geom(tuple(shape), dt, int(axis) % len(shape)).meta_shape


def _geom(shape: tuple[int, ...], dt: DataType, axis: int) -> _Geom:
    s = dt.sspec
    assert s is not None
    tiling = Tiling.build(tuple(shape), axis, s)
    a = tiling.axis
    size = math.prod(shape)
    outer, inner, C = math.prod(shape[:a]), math.prod(shape[a + 1 :]), shape[a]
    if tiling.kind == "tensor":
        return _Geom(tiling, outer, inner, C, size, 1, 1, 1, size, 0, True)
    TC, nC = tiling.Tc, tiling.nC
    if triton.next_power_of_2(TC) > _MAX_TILE and C < TC:
        # one long tile, mostly padding: its zeros add nothing to any sum (nor meta, whose
        # padding-only subtiles are dropped), so it is as long as the axis (whole subtiles)
        step = tiling.Sc or 1
        TC = -(-C // step) * step
    nsub, sub, sub_cols = 1, TC, 0
    if tiling.Sc:
        nsub, sub, sub_cols = TC // tiling.Sc, tiling.Sc, -(-C // tiling.Sc)
    return _Geom(tiling, outer, inner, C, TC, nC, outer * nC * inner, nsub, sub, sub_cols, False)


def _is_long(g: _Geom) -> bool:
    """Tiles over 1024 elements: one program per tile, in chunks of `_CHUNK` (or a subtile)."""
    return triton.next_power_of_2(g.TC) > _MAX_TILE


def _launch(g: _Geom) -> tuple[int, int, int, int]:
    """(NSUB, SUB, BT, n_chunks): power-of-two block sizes, tiles per program, chunks."""
    if _is_long(g):
        if g.tiling.Sc:
            chunk = max(_CHUNK, g.sub)
            return chunk // g.sub, g.sub, 1, triton.cdiv(g.TC, chunk)
        return 1, _CHUNK, 1, triton.cdiv(g.TC, _CHUNK)
    nsub_p, sub_p = triton.next_power_of_2(g.nsub), triton.next_power_of_2(g.sub)
    bt = max(1, _BLOCK // (nsub_p * sub_p))  # not capped by n_inst: fewer compiles
    return nsub_p, sub_p, bt, 1


@functools.lru_cache(maxsize=64)
def _tables(
    book: Codebook, mags: tuple[tuple[float, ...], ...], device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Device tables: magnitudes (float64 and float32 bits), even-code flags, full table bits.

    Keyed on the mappings too: a Codebook's equality and hash leave them out.
    """
    m64 = np.asarray(mags, dtype=np.float64).reshape(-1)
    m32 = m64.astype(np.float32).view(np.int32)
    codes = book.magnitude_codes()
    even = (np.asarray(codes, dtype=np.int64).reshape(-1) % 2 == 0).astype(np.int8)
    tab = np.asarray(book.table(), dtype=np.float32).view(np.int32).reshape(-1)
    return tuple(
        torch.from_numpy(np.ascontiguousarray(t)).to(device) for t in (m64, m32, even, tab)
    )  # type: ignore[return-value]


def _book_tables(book: Codebook, device: torch.device) -> tuple[torch.Tensor, ...]:
    return _tables(book, book.magnitudes(), str(device))


@functools.lru_cache(maxsize=256)
def _float32_table(book: Codebook, mags: tuple[tuple[float, ...], ...]) -> bool:
    return all(float(np.float32(m)) == m for row in mags for m in row)


def _scale_args(book: Codebook, dt: DataType, scale_mode: ScaleMode) -> list[int]:
    """bump_t .. s_nan of the kernel (reference `_scale_exponent` on the compute type)."""
    s = dt.sspec
    assert s is not None
    e = book.compute
    low, high = -s.scale.bias, (1 << s.scale.ebits) - 2 - s.scale.bias
    return [
        _bump_threshold(_elem_fmt(e), scale_mode), e.emax, low, high, s.scale.bias,
        (1 << s.scale.ebits) - 1,
    ]  # fmt: skip


# -- device helpers (and triton.py's _load_bits, _store_values, _ldexp_bits, _scale_exp_t) ----
@triton.jit
def _cb_offsets(
    pid,
    n_inst,
    C,
    TC,
    inner,
    nC,
    nsub,
    sub,
    p0,
    LAST: tl.constexpr,
    TENSOR: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    BT: tl.constexpr,
):
    # BT tile instances per program, each (NSUB, SUB): subtile s, position k (tile position
    # p0 + s * sub + k); element offsets are int64 (tensors over 2^31 elements)
    inst = pid.to(tl.int64) * BT + tl.arange(0, BT).to(tl.int64)
    u_ok = inst < n_inst
    sk = tl.arange(0, NSUB)[:, None]
    kk = tl.arange(0, SUB)[None, :]
    pos = (p0 + sk * sub + kk).to(tl.int64)[None, :, :]
    in_tile = ((sk < nsub) & (kk < sub))[None, :, :] & (pos < TC)
    if TENSOR:
        # the whole tensor is one tile, in the reference's order: the axis moved last
        r = pos // C
        c = pos - r * C
        oo = r // inner
        ii = r - oo * inner
        off = oo * C * inner + c * inner + ii + inst[:, None, None] * 0
        ok = u_ok[:, None, None] & in_tile
        j = inst * 0
        o = inst * 0
        i = inst * 0
    else:
        if LAST:
            o = inst // nC
            j = inst - o * nC
            i = inst * 0
            base = o * C
        else:
            i = inst % inner
            t = inst // inner
            j = t % nC
            o = t // nC
            base = o * C * inner + i
        c = j[:, None, None] * TC + pos
        ok = u_ok[:, None, None] & in_tile & (c < C)
        if LAST:
            off = base[:, None, None] + c
        else:
            off = base[:, None, None] + c * inner
    return u_ok, inst, j, o, i, off, ok


@triton.jit
def _cb_meta_offsets(
    u_ok,
    inst,
    j,
    o,
    i,
    nsub,
    s0,
    sub_cols,
    inner,
    LAST: tl.constexpr,
    SUBT: tl.constexpr,
    NSUB: tl.constexpr,
):
    # meta grid offsets and mask, (BT, NSUB): per subtile (layout.py `sub_grid`; subtiles
    # s0 + s of the tile's nsub) or per tile
    s = tl.arange(0, NSUB)[None, :]
    if SUBT:
        sidx = j[:, None] * nsub + s0 + s
        if LAST:
            moff = o[:, None] * sub_cols + sidx
        else:
            moff = o[:, None] * sub_cols * inner + sidx * inner + i[:, None]
        mok = u_ok[:, None] & (s0 + s < nsub) & (sidx < sub_cols)
    else:
        moff = inst[:, None] + s * 0
        mok = u_ok[:, None] & (s < 1)
    return moff, mok


@triton.jit
def _cb_bound(sexp3, c_emin, c_mbits, c_maxf, IN_KIND: tl.constexpr):
    # The largest compute-grid magnitude whose value times 2^sexp is at most the input type's
    # largest finite value (reference `finite_bound`), float64; Inf where none is needed.
    if IN_KIND == 0:
        fmax = 3.4028234663852886e38
    elif IN_KIND == 1:
        fmax = 65504.0
    else:
        fmax = 3.3895313892515355e38
    p2 = ((1023 - sexp3).to(tl.int64) << 52).to(tl.float64, bitcast=True)
    reach = p2 * fmax
    fl = ((reach.to(tl.int64, bitcast=True) >> 52) - 1023).to(tl.int32)
    e = tl.maximum(fl, c_emin) - c_mbits
    grid = tl.floor(reach * ((1023 - e).to(tl.int64) << 52).to(tl.float64, bitcast=True))
    grid = grid * ((1023 + e).to(tl.int64) << 52).to(tl.float64, bitcast=True)
    return tl.where(reach >= c_maxf, float("inf"), grid)


@triton.jit
def _cb_nearest(a, bound, mag_ptr, even_ptr, base, K: tl.constexpr, LOG2K: tl.constexpr, rmode):
    # Nearest entry of one mapping (reference `_codebook_select`): hi = searchsorted(left)
    # clipped to [1, K-1], distances in float64, ties by the round mode; magnitudes above
    # the tile's bound are lowered to it first and no entry above it is picked.
    a_in = a
    a = tl.where(a > bound, bound, a)
    cnt = (a != a).to(tl.int32) * 0
    if K <= 8:
        for t in range(K):
            cnt += (tl.load(mag_ptr + base + t) < a).to(tl.int32)
    else:
        # branchless lower bound (K a power of two); it stops at K - 1, which clips alike
        for r in tl.static_range(LOG2K):
            probe = tl.load(mag_ptr + base + cnt + ((K >> (r + 1)) - 1))
            cnt = tl.where(probe < a, cnt + (K >> (r + 1)), cnt)
    hi = tl.minimum(tl.maximum(cnt, 1), K - 1)
    lo = hi - 1
    t_hi = tl.load(mag_ptr + base + hi)
    t_lo = tl.load(mag_ptr + base + lo)
    d_lo = a - t_lo
    d_hi = t_hi - a
    tie = hi < 0  # zero: ties to the smaller magnitude
    if rmode == 0:
        tie = tl.load(even_ptr + base + hi) != 0  # even: to the even compute code
    elif rmode == 1:
        tie = hi >= 0  # away: to the larger magnitude
    pick = (d_hi < d_lo) | ((d_hi == d_lo) & tie)
    pick = pick & ~(t_hi > bound)  # rounded up past the bound: the entry below
    # the reference's error term v - q is +-(a - t): a - t_lo or -(t_hi - a) (IEEE
    # subtraction is sign-symmetric), so its square is the same bits
    return (
        tl.where(pick, hi, lo),
        tl.where(pick, t_hi, t_lo),
        tl.where(pick, t_hi - a_in, a_in - t_lo),
    )


@triton.jit
def _cb_scaled(xb, sexp3):
    # |x| * 2^-sexp in float64, exactly (mantissa times a power of two); NaN and Inf kept
    ab = xb & 0x7FFFFFFF
    E = ab >> 23
    F = ab & 0x7FFFFF
    Mi = tl.where(E > 0, F | 0x800000, F)
    k = tl.where(E > 0, E - 127, -126) - 23 - sexp3
    p2 = ((k + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)
    a = Mi.to(tl.float64) * p2
    nan64 = (xb.to(tl.int64) * 0 + 0x7FF8000000000000).to(tl.float64, bitcast=True)
    inf64 = (xb.to(tl.int64) * 0 + 0x7FF0000000000000).to(tl.float64, bitcast=True)
    return tl.where(ab < 0x7F800000, a, tl.where(ab > 0x7F800000, nan64, inf64))


@triton.jit
def _cb_compare(err, best_err, same, delta):
    # Whether a mapping's error sum is surely below the best one's, and whether that is
    # undecided (the sums, both within ``delta`` relative of the exact ones, too close), given
    # whether the two mappings quantize the unit identically (``same``: a tie). A NaN or Inf
    # in a unit makes every mapping's sum NaN or Inf, in any order: a tie, never undecided.
    sure_better = err < best_err - best_err * delta
    sure_worse = best_err < err - err * delta
    err_finite = (err - err) == 0.0
    return (~same) & sure_better, err_finite & (~same) & (~sure_better) & (~sure_worse)


@triton.jit
def _cb_select(
    a,
    bound,
    mag_ptr,
    even_ptr,
    rmode,
    BT: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    K: tl.constexpr,
    LOG2K: tl.constexpr,
    NMAP: tl.constexpr,
    FORCE: tl.constexpr,
):
    # The mapping of each unit (BT, NSUB) of SUB elements and each element's entry index.
    # Pass 1: every mapping, unit errors summed as a tree; decide where that is safe.
    best_idx = (a != a).to(tl.int32) * 0
    best_tq = tl.zeros([BT, NSUB, SUB], tl.float64)
    best_err = tl.zeros([BT, NSUB], tl.float64)
    best_map = tl.zeros([BT, NSUB], tl.int32)
    if FORCE:
        amb = best_map == 0
    else:
        amb = best_map != 0
    for m in range(NMAP):
        idx, tq, d = _cb_nearest(a, bound, mag_ptr, even_ptr, m * K, K, LOG2K, rmode)
        err = tl.sum(d * d, axis=2)
        first = m == 0
        later = m != 0
        # equal entries: equal terms, equal sums in any order (a tie: the earlier stays)
        same = tl.min((tq == best_tq).to(tl.int32), axis=2) > 0
        # tree and ordered sums are both within 2^-43 (relative) of the exact sum: 2^-36
        sure, unsure = _cb_compare(err, best_err, same, 1.4551915228366852e-11)
        better = first | sure
        amb = amb | (later & unsure)
        best_err = tl.where(better, err, best_err)
        best_map = tl.where(better, m, best_map)
        best_idx = tl.where(better[:, :, None], idx, best_idx)
        best_tq = tl.where(better[:, :, None], tq, best_tq)

    # Pass 2 (a near-tie in these units): every choice again, the reference's order.
    if tl.max(tl.max(amb.to(tl.int32), axis=1), axis=0) > 0:
        kpos = tl.arange(0, SUB)[None, None, :]
        for m in range(NMAP):
            idx, _tq, d = _cb_nearest(a, bound, mag_ptr, even_ptr, m * K, K, LOG2K, rmode)
            sq = d * d
            err = tl.zeros([BT, NSUB], tl.float64)
            for kk in range(SUB):
                err = err + tl.sum(tl.where(kpos == kk, sq, 0.0), axis=2)
            better = (m == 0) | (err < best_err)
            best_err = tl.where(better, err, best_err)
            best_map = tl.where(better, m, best_map)
            best_idx = tl.where(better[:, :, None], idx, best_idx)
    return best_idx, best_map


@triton.jit
def _cb_write(
    y_ptr,
    code_ptr,
    magb_ptr,
    off,
    ok,
    xb,
    best_idx,
    map3,
    sexp3,
    tile_nan,
    negzero,
    IN_KIND: tl.constexpr,
    WANT_Y: tl.constexpr,
    WANT_CODES: tl.constexpr,
    IB: tl.constexpr,
    K: tl.constexpr,
):
    # values (q * 2^sexp, rounded once to float32, then to the input type) or index codes
    sgn = (xb < 0) & ((best_idx != 0) | (negzero != 0))
    if WANT_Y:
        magb = tl.load(magb_ptr + map3 * K + best_idx)
        yb = _ldexp_bits(magb, sexp3) | (sgn.to(tl.int32) << 31)
        _store_values(y_ptr, off, ok, yb, tile_nan, tile_nan, IN_KIND != 0, IN_KIND == 2)
    if WANT_CODES:
        code = (sgn.to(tl.int32) << (IB - 1)) | best_idx
        code = tl.where(tile_nan, 0, code)
        tl.store(code_ptr + off, code.to(code_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _cb_tile_flags(xb):
    # per tile (BT,): finite absmax bits, any NaN/Inf, any NaN
    ab = xb & 0x7FFFFFFF
    finite = ab < 0x7F800000
    amax_b = tl.max(tl.max(tl.where(finite, ab, 0), axis=2), axis=1)
    any_nf = tl.max(tl.max((~finite).to(tl.int32), axis=2), axis=1)
    any_nan = tl.max(tl.max((ab > 0x7F800000).to(tl.int32), axis=2), axis=1)
    return amax_b, any_nf, any_nan


# -- kernels ---------------------------------------------------------------------------------
# Format numbers are runtime arguments (not specialised): one compile per layout and mode.
_FMT_ARGS = (
    "rmode", "nan_block", "bump_t", "e_emax", "s_low", "s_high", "s_bias", "s_nan", "negzero",
    "c_emin", "c_mbits",
)  # fmt: skip


@triton.jit
def _cb_chunk(
    x_ptr,
    pid,
    q,
    n_inst,
    C,
    TC,
    inner,
    nC,
    IN_KIND: tl.constexpr,
    LAST: tl.constexpr,
    TENSOR: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
):
    # chunk q (NSUB * SUB elements) of the one tile of program pid: offsets and input bits
    u_ok, inst, j, o, i, off, ok = _cb_offsets(
        pid, n_inst, C, TC, inner, nC, NSUB, SUB, q * (NSUB * SUB), LAST, TENSOR, NSUB, SUB, 1
    )
    xb, _raw = _load_bits(x_ptr, off, ok, IN_KIND)
    return u_ok, inst, j, o, i, off, ok, xb


# fmt: off
@triton.jit
def _cb_units(
    y_ptr, code_ptr, meta_ptr, mag_ptr, magb_ptr, even_ptr, xb, off, ok, u_ok, inst, j, o, i,
    sexp3, bound, tnan, s0, nsub, sub_cols, inner, rmode, negzero, IN_KIND: tl.constexpr,
    WANT_Y: tl.constexpr, WANT_CODES: tl.constexpr, LAST: tl.constexpr, SUBT: tl.constexpr,
    BT: tl.constexpr, NSUB: tl.constexpr, SUB: tl.constexpr, IB: tl.constexpr,
    K: tl.constexpr, LOG2K: tl.constexpr, NMAP: tl.constexpr, FORCE: tl.constexpr,
):
    # BT whole tiles, or subtiles s0 .. s0 + NSUB of one tile (BT = 1), loaded as xb: each
    # unit's mapping chosen, the values or codes written, and (WANT_CODES) the unit meta
    a = _cb_scaled(xb, sexp3)
    best_idx, best_map = _cb_select(
        a, bound, mag_ptr, even_ptr, rmode, BT, NSUB, SUB, K, LOG2K, NMAP, FORCE
    )
    _cb_write(
        y_ptr, code_ptr, magb_ptr, off, ok, xb, best_idx, best_map[:, :, None], sexp3,
        ok & tnan[:, None, None], negzero, IN_KIND, WANT_Y, WANT_CODES, IB, K,
    )
    if WANT_CODES:
        moff, mok = _cb_meta_offsets(
            u_ok, inst, j, o, i, nsub, s0, sub_cols, inner, LAST, SUBT, NSUB
        )
        tl.store(meta_ptr + moff, best_map.to(tl.uint8), mask=mok)
# fmt: on


@triton.jit
def _cb_error(errs, ar, m):
    # mapping m's entry of the per-mapping errors, as a (1,) tensor
    return tl.zeros([1], tl.float64) + tl.sum(tl.where(ar == m, errs, 0.0))


@triton.jit(do_not_specialize=(*_FMT_ARGS, "n_chunks", "delta"))
def _cb_quant_kernel(
    x_ptr,
    y_ptr,
    code_ptr,
    scale_ptr,
    meta_ptr,
    mag_ptr,
    magb_ptr,
    even_ptr,
    n_inst,
    C,
    TC,
    inner,
    nC,
    nsub,
    sub,
    sub_cols,
    n_chunks,
    delta,
    rmode,
    nan_block,
    bump_t,
    e_emax,
    s_low,
    s_high,
    s_bias,
    s_nan,
    negzero,
    c_emin,
    c_mbits,
    c_maxf,
    IN_KIND: tl.constexpr,
    WANT_Y: tl.constexpr,
    WANT_CODES: tl.constexpr,
    LAST: tl.constexpr,
    TENSOR: tl.constexpr,
    SUBT: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    BT: tl.constexpr,
    IB: tl.constexpr,
    K: tl.constexpr,
    LOG2K: tl.constexpr,
    NMAP: tl.constexpr,
    NMAP_P: tl.constexpr,
    FORCE: tl.constexpr,
    LONG: tl.constexpr,
):
    # Not LONG: BT whole tiles per program, loaded once. LONG: one tile over 1024 elements
    # per program (BT = 1), in n_chunks chunks of NSUB * SUB: statistics first, then
    # (subtiles) the chunk's units chosen and written, or (the tile is the unit) the
    # mappings' errors added over the chunks, the choice, and the chunks written.
    pid = tl.program_id(0)
    if LONG:
        amax_b = tl.zeros([1], tl.int32)
        any_nf = tl.zeros([1], tl.int32)
        any_nan = tl.zeros([1], tl.int32)
        q = 0
        while q < n_chunks:
            u_ok, inst, j, o, i, off, ok, xb = _cb_chunk(
                x_ptr, pid, q, n_inst, C, TC, inner, nC, IN_KIND, LAST, TENSOR, NSUB, SUB
            )
            cmax, cnf, cnan = _cb_tile_flags(xb)
            amax_b = tl.maximum(amax_b, cmax)
            any_nf = tl.maximum(any_nf, cnf)
            any_nan = tl.maximum(any_nan, cnan)
            q += 1
        u_ok, inst, j, o, i, off, ok, xb = _cb_chunk(
            x_ptr, pid, 0, n_inst, C, TC, inner, nC, IN_KIND, LAST, TENSOR, NSUB, SUB
        )
    else:
        u_ok, inst, j, o, i, off, ok = _cb_offsets(
            pid, n_inst, C, TC, inner, nC, nsub, sub, 0, LAST, TENSOR, NSUB, SUB, BT
        )
        xb, _raw = _load_bits(x_ptr, off, ok, IN_KIND)
        amax_b, any_nf, any_nan = _cb_tile_flags(xb)
    # codebooks have no NaN code: a NaN (block policy: any NaN/Inf) makes its tile NaN
    tnan = tl.where(nan_block != 0, any_nf, any_nan) > 0
    sexp, _maxexp = _scale_exp_t(amax_b, bump_t, e_emax, s_low, s_high)
    sexp3 = sexp[:, None, None]
    bound = _cb_bound(sexp3, c_emin, c_mbits, c_maxf, IN_KIND)
    if WANT_CODES:
        scode = tl.where(tnan, s_nan, sexp + s_bias)
        tl.store(scale_ptr + inst, scode.to(scale_ptr.dtype.element_ty), mask=u_ok)
    if not LONG:
        _cb_units(
            y_ptr, code_ptr, meta_ptr, mag_ptr, magb_ptr, even_ptr, xb, off, ok, u_ok, inst, j,
            o, i, sexp3, bound, tnan, 0, nsub, sub_cols, inner, rmode, negzero, IN_KIND, WANT_Y,
            WANT_CODES, LAST, SUBT, BT, NSUB, SUB, IB, K, LOG2K, NMAP, FORCE,
        )  # fmt: skip
    elif SUBT:
        q = 0
        while q < n_chunks:
            u_ok, inst, j, o, i, off, ok, xb = _cb_chunk(
                x_ptr, pid, q, n_inst, C, TC, inner, nC, IN_KIND, LAST, TENSOR, NSUB, SUB
            )
            _cb_units(
                y_ptr, code_ptr, meta_ptr, mag_ptr, magb_ptr, even_ptr, xb, off, ok, u_ok, inst,
                j, o, i, sexp3, bound, tnan, q * NSUB, nsub, sub_cols, inner, rmode, negzero,
                IN_KIND, WANT_Y, WANT_CODES, LAST, SUBT, 1, NSUB, SUB, IB, K, LOG2K, NMAP, FORCE,
            )  # fmt: skip
            q += 1
    else:
        # errors of every mapping over the whole tile (chunk trees added in order), and
        # whether each mapping's entries equal mapping 0's everywhere
        ar = tl.arange(0, NMAP_P)
        errs = tl.zeros([NMAP_P], tl.float64)
        same0 = tl.full([NMAP_P], 1, tl.int32)
        q = 0
        while q < n_chunks:
            u_ok, inst, j, o, i, off, ok, xb = _cb_chunk(
                x_ptr, pid, q, n_inst, C, TC, inner, nC, IN_KIND, LAST, TENSOR, NSUB, SUB
            )
            a = _cb_scaled(xb, sexp3)
            _idx0, tq0, d0 = _cb_nearest(a, bound, mag_ptr, even_ptr, 0, K, LOG2K, rmode)
            errs = errs + tl.where(ar == 0, tl.sum(d0 * d0), 0.0)
            for m in range(1, NMAP):
                _idx, tq, d = _cb_nearest(a, bound, mag_ptr, even_ptr, m * K, K, LOG2K, rmode)
                errs = errs + tl.where(ar == m, tl.sum(d * d), 0.0)
                sm = tl.min((tq == tq0).to(tl.int32))
                same0 = tl.where(ar == m, tl.minimum(same0, sm), same0)
            q += 1
        best_err = _cb_error(errs, ar, 0)
        chosen = tl.zeros([1], tl.int32)
        if FORCE:
            amb = chosen == 0
        else:
            amb = chosen != 0
        for m in range(1, NMAP):
            err = _cb_error(errs, ar, m)
            same = (chosen + tl.sum(tl.where(ar == m, same0, 0)) > 0) & (chosen == 0)
            same = same | ((err == 0.0) & (best_err == 0.0))  # all terms zero in both
            better, unsure = _cb_compare(err, best_err, same, delta)
            amb = amb | unsure
            best_err = tl.where(better, err, best_err)
            chosen = tl.where(better, m, chosen)
        if tl.max(amb.to(tl.int32)) > 0:
            # near-tie: the errors again, added in the reference's order
            kpos = tl.arange(0, SUB)[None, None, :]
            errs = tl.zeros([NMAP_P], tl.float64)
            q = 0
            while q < n_chunks:
                u_ok, inst, j, o, i, off, ok, xb = _cb_chunk(
                    x_ptr, pid, q, n_inst, C, TC, inner, nC, IN_KIND, LAST, TENSOR, NSUB, SUB
                )
                a = _cb_scaled(xb, sexp3)
                n_valid = tl.minimum(TC - q * (NSUB * SUB), NSUB * SUB)
                for m in range(NMAP):
                    _idx, _tq, d = _cb_nearest(a, bound, mag_ptr, even_ptr, m * K, K, LOG2K, rmode)
                    sq = d * d
                    err = tl.sum(tl.where(ar == m, errs, 0.0))
                    kk = 0
                    while kk < n_valid:
                        err = err + tl.sum(tl.where(kpos == kk, sq, 0.0))
                        kk += 1
                    errs = tl.where(ar == m, err, errs)
                q += 1
            best_err = _cb_error(errs, ar, 0)
            chosen = tl.zeros([1], tl.int32)
            for m in range(1, NMAP):
                err = _cb_error(errs, ar, m)
                better = err < best_err
                best_err = tl.where(better, err, best_err)
                chosen = tl.where(better, m, chosen)
        q = 0
        while q < n_chunks:
            u_ok, inst, j, o, i, off, ok, xb = _cb_chunk(
                x_ptr, pid, q, n_inst, C, TC, inner, nC, IN_KIND, LAST, TENSOR, NSUB, SUB
            )
            a = _cb_scaled(xb, sexp3)
            map3 = chosen[:, None, None]
            best_idx, _tq, _d = _cb_nearest(a, bound, mag_ptr, even_ptr, map3 * K, K, LOG2K, rmode)
            _cb_write(
                y_ptr, code_ptr, magb_ptr, off, ok, xb, best_idx, map3, sexp3,
                ok & tnan[:, None, None], negzero, IN_KIND, WANT_Y, WANT_CODES, IB, K,
            )  # fmt: skip
            q += 1
        if WANT_CODES:
            tl.store(meta_ptr + inst, chosen.to(tl.uint8), mask=u_ok)


@triton.jit(do_not_specialize=("n_chunks", "s_bias", "s_nan", "s_mask", "ib", "nmap"))
def _cb_dequant_kernel(
    code_ptr,
    y_ptr,
    scale_ptr,
    meta_ptr,
    tab_ptr,
    n_inst,
    C,
    TC,
    inner,
    nC,
    nsub,
    sub,
    sub_cols,
    n_chunks,
    s_bias,
    s_nan,
    s_mask,
    ib,
    nmap,
    OUT_KIND: tl.constexpr,
    LAST: tl.constexpr,
    TENSOR: tl.constexpr,
    SUBT: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    BT: tl.constexpr,
    CHUNKED: tl.constexpr,
):
    # BT whole tiles per program, or (CHUNKED, BT = 1) chunk q of tile t per program
    pid = tl.program_id(0)
    if CHUNKED:
        t = pid // n_chunks
        q = pid - t * n_chunks
        u_ok, inst, j, o, i, off, ok = _cb_offsets(
            t, n_inst, C, TC, inner, nC, NSUB, SUB, q * NSUB * SUB, LAST, TENSOR, NSUB, SUB, BT
        )
        s0 = q * NSUB
        nsub_t = nsub
    else:
        u_ok, inst, j, o, i, off, ok = _cb_offsets(
            pid, n_inst, C, TC, inner, nC, nsub, sub, 0, LAST, TENSOR, NSUB, SUB, BT
        )
        s0 = 0
        nsub_t = nsub
    c = tl.load(code_ptr + off, mask=ok, other=0).to(tl.int32) & ((1 << ib) - 1)
    moff, mok = _cb_meta_offsets(u_ok, inst, j, o, i, nsub_t, s0, sub_cols, inner, LAST, SUBT, NSUB)
    mt = tl.load(meta_ptr + moff, mask=mok, other=0).to(tl.int32) & (nmap - 1)
    if not SUBT:
        mt = tl.max(mt, axis=1)[:, None]  # one meta per tile: broadcast over the tile
    qb = tl.load(tab_ptr + (mt[:, :, None] << ib) + c, mask=ok, other=0)
    sc = tl.load(scale_ptr + inst, mask=u_ok, other=0).to(tl.int32) & s_mask
    nan_t = sc == s_nan
    k3 = tl.where(nan_t, 0, sc - s_bias)[:, None, None]
    yb = _ldexp_bits(qb, k3)
    nan = ok & nan_t[:, None, None]
    _store_values(y_ptr, off, ok, yb, nan, nan, OUT_KIND != 0, OUT_KIND == 2)


# -- host side -------------------------------------------------------------------------------
def _common(g: _Geom, nsub_p: int, sub_p: int, bt: int) -> dict[str, Any]:
    return dict(
        LAST=g.inner == 1, TENSOR=g.tensor, SUBT=bool(g.tiling.Sc), NSUB=nsub_p, SUB=sub_p,
        BT=bt,
    )  # fmt: skip


def _check_book(dt: DataType, shape: tuple[int, ...], axis: int) -> Codebook:
    why = supports(dt, shape, axis)
    if why is not None:
        raise NotImplementedError(f"{why}; use backend='reference'")
    assert isinstance(dt.nspec, Codebook)
    return dt.nspec


def quantize(
    x: torch.Tensor,
    dt: DataType,
    *,
    axis: int,
    round_mode: RoundMode,
    scale_mode: ScaleMode,
    nan_policy: NanPolicy,
    seed: int = 0,
    full_int_range: bool = False,
    want_values: bool = True,
    want_codes: bool = False,
) -> dict[str, Any]:
    """Quantize a float32/float16/bfloat16 tensor to codebook ``dt`` (reference, bit for bit).

    ``seed`` and ``full_int_range`` are accepted for the engines' common signature and have
    no effect on codebooks.

    Returns:
        A dict with ``values`` (input dtype and shape, when asked), ``codes`` (uint8 table
        indices, input shape), ``scale`` (exponent codes, grid layout) and ``meta`` (uint8
        mapping index per subtile, else per tile, grid layout), the code fields only when asked.

    Raises:
        NotImplementedError: stochastic rounding, or a cast `supports` refuses.
        TypeError: an unsupported input dtype.
    """
    if round_mode is RoundMode.STOCHASTIC:
        raise NotImplementedError(
            "codebooks round to the nearest table entry; stochastic is not supported"
        )
    if x.dtype not in _IN_KIND:
        raise TypeError(f"the Triton engine casts float32, float16 or bfloat16, not {x.dtype}")
    book = _check_book(dt, tuple(x.shape), axis)
    s = dt.sspec
    assert s is not None
    g = _geom(tuple(x.shape), dt, axis)
    x = x.contiguous()
    dev = x.device
    nsub_p, sub_p, bt, n_chunks = _launch(g)
    m64, m32, even, _tab = _book_tables(book, dev)
    y = torch.empty_like(x) if want_values else torch.empty(1, dtype=x.dtype, device=dev)
    if want_codes:
        codes = torch.empty(x.shape, dtype=torch.uint8, device=dev)
        scale = torch.empty(g.n_inst, dtype=torch.uint8, device=dev)
        meta = torch.empty(math.prod(g.meta_shape), dtype=torch.uint8, device=dev)
    else:
        codes = scale = meta = torch.empty(1, dtype=torch.uint8, device=dev)
    ib = book.index_bits
    fmt = (
        _ROUND[round_mode], int(nan_policy is NanPolicy.BLOCK),
        *_scale_args(book, dt, scale_mode), int(book.compute.has_negative_zero),
        book.compute.emin, book.compute.mbits, float(book.compute.maxfloat),
    )  # fmt: skip
    consts = dict(
        IN_KIND=_IN_KIND[x.dtype], WANT_Y=want_values, WANT_CODES=want_codes, IB=ib,
        K=1 << (ib - 1), LOG2K=ib - 1, NMAP=book.num_mappings, FORCE=_FORCE_ORDERED,
        LAST=g.inner == 1, TENSOR=g.tensor, SUBT=bool(g.tiling.Sc), NSUB=nsub_p, SUB=sub_p,
        num_warps=_NUM_WARPS, enable_fp_fusion=False,
    )  # fmt: skip
    ptrs = (_int_view(x), _int_view(y), codes, scale, meta, m64, m32, even)
    long = _is_long(g)
    # the tree sums of a long tile's n elements are within n * 2^-53 of the ordered ones
    delta = 2.0 ** (math.ceil(math.log2(g.TC)) - 50) if long else 0.0
    _cb_quant_kernel[(triton.cdiv(g.n_inst, bt),)](
        *ptrs, g.n_inst, g.C, g.TC, g.inner, g.nC, g.nsub, g.sub, max(g.sub_cols, 1), n_chunks,
        delta, *fmt, BT=bt, NMAP_P=triton.next_power_of_2(book.num_mappings), LONG=long,
        **consts,
    )  # fmt: skip
    out: dict[str, Any] = {}
    if want_values:
        out["values"] = y
    if want_codes:
        out["codes"] = codes
        out["scale"] = scale.reshape(g.grid_shape)
        out["meta"] = meta.reshape(g.meta_shape)
    return out


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
    """Values of unpacked codebook codes (reference `dequantize`, bit for bit), as ``out_dtype``.

    ``tenscale`` is accepted for the engines' common signature (codebooks have none).

    Raises:
        NotImplementedError: a cast `supports` refuses.
        ValueError: a missing scale or meta tensor.
        TypeError: an unsupported output dtype.
    """
    if out_dtype not in _IN_KIND:
        raise TypeError(f"upcast returns float32, float16 or bfloat16, not {out_dtype}")
    shape = tuple(int(d) for d in shape)
    book = _check_book(dt, shape, axis)
    s = dt.sspec
    assert s is not None
    if scale is None:
        raise ValueError(f"{dt.name}: dequantizing needs the scale tensor")
    if meta is None:
        raise ValueError(f"{dt.name}: dequantizing needs the meta tensor")
    g = _geom(shape, dt, int(axis) % len(shape))
    dev = codes.device
    nsub_p, sub_p, bt, n_chunks = _launch(g)
    tab = _book_tables(book, dev)[3]
    y = torch.empty(shape, dtype=out_dtype, device=dev)
    c = codes.contiguous().reshape(-1)
    sc = scale.contiguous().reshape(-1)
    mt = meta.contiguous().reshape(-1)
    long = _is_long(g)
    _cb_dequant_kernel[(g.n_inst * n_chunks if long else triton.cdiv(g.n_inst, bt),)](
        c, _int_view(y), sc, mt, tab,
        g.n_inst, g.C, g.TC, g.inner, g.nC, g.nsub, g.sub, max(g.sub_cols, 1), n_chunks,
        s.scale.bias, (1 << s.scale.ebits) - 1, (1 << s.scale.bits) - 1, book.index_bits,
        book.num_mappings, OUT_KIND=_IN_KIND[out_dtype], CHUNKED=long, num_warps=_NUM_WARPS,
        **_common(g, nsub_p, sub_p, bt),
    )  # fmt: skip
    return y
