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

Values leave the kernel as ``q * 2^sexp`` in float64 (exact: the table is float64, so compute
values float32 does not hold, e5m26's or e4m3b150's, are exact too) rounded once to float32
(as the reference's float64 -> float32 cast), then to float16 / bfloat16 as numpy's
``astype`` does.

Tiles up to 1024 elements: BT whole tiles per program, loaded once (`_cb_quant_kernel`).
Longer tiles (channel ``t0``, a tensor scale, ``t2048``...): one program per tile, in chunks
(the same kernel with ``LONG``): a statistics pass, then with subtiles one pass choosing and
writing, and without (the tile is the unit) one pass adding every mapping's errors (margin
2^-50 * n, n the tile length) and one writing - the tile is read 2-3 times (from L2 when it
fits). Its near-tie pass adds 512 elements per step one at a time (slow, and rare). Subtiles
over 1024 elements are cast as tiles of their own (`_unit_geom`), each unit's elements in
the same order (so the same sums and mapping), with their tile's statistics computed first
(`_tile_stats`, torch reductions; ``PRE``) so that each unit gets its tile's scale.

2-D tiles are cast as the 1-D tiles of a copy holding one tile per row, each subtile
contiguous (`triton_tiles._to_tile_rows`): the reference's tile and subtile order, so the same
sums and choices; results go back to the input layout and layout.py's grids. N:M sparsity
prunes the input first (`triton_tiles.prune`, as the reference) and zeroes pruned values.

Supported: 1-D and 2-D tiles on any axis and tensor scales, with or without subtiles (of any
size), N:M sparsity, exponent scales of any width the formats have (up to 10 bits: 16-bit
scale codes), every compute type, every scale mode (``search`` through
`onnxq.cast.triton_search`, one pass per candidate). Not here (`supports` says why): custom
metrics (the reference only), stochastic rounding (no backend has it).

This module is the host side; the kernels are in `onnxq.cast.triton_codebook_kernels`, their
device helpers in `onnxq.cast.triton_codebook_device`.
"""

# The geometry keeps layout.py's names (C, TC, nC).
# ruff: noqa: N815

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any

import numpy as np
import torch
import triton

from onnxq.cast.layout import Tiling
from onnxq.cast.triton_bits import _int_view, _signed
from onnxq.cast.triton_codebook_kernels import _cb_dequant_kernel, _cb_quant_kernel
from onnxq.cast.triton_plan import (
    _IN_KIND,
    _bump_threshold,
    _code_torch_dtype,
    _elem_fmt,
    _grid_2d,
    _store_dtype,
    block_warps,
)
from onnxq.cast.triton_tiles import (
    _from_tile_rows,
    _rows_grid,
    _rows_ungrid,
    _sub_grid,
    _sub_ungrid,
    _to_tile_rows,
    prune,
)
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


def _config() -> tuple[int, int]:
    """(elements, warps) per program of the whole-tile kernels.

    ``ONNXQ_TRITON_CB_CONFIG=1024:8`` overrides them (``benchmarks/gpu.py --sweep`` times a
    few; the bits do not change).
    """
    text = os.environ.get("ONNXQ_TRITON_CB_CONFIG", "")
    if not text:
        return _BLOCK, _NUM_WARPS
    return block_warps("ONNXQ_TRITON_CB_CONFIG", text, 32, 8192, (1, 2, 4, 8, 16), "512:4")


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
    if not n.is_populated:
        return f"{name}: the generic codebook has no mappings yet (add_mappings)"
    if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        return f"the Triton codebook engine needs a non-empty shape, got {shape}"
    if not -len(shape) <= axis < len(shape):
        return f"axis {axis} is out of range for shape {shape}"
    Tiling.build(tuple(shape), axis, s)  # the reference's geometry errors (2-D tiles on 1-D)
    return None


def meta_shape(dt: DataType, shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """Shape of the unpacked meta grid (what a compress-mode meta stream unpacks to)."""
    assert dt.sspec is not None
    t = Tiling.build(tuple(shape), int(axis) % len(shape), dt.sspec)
    if t.kind == "2d":
        return _grid_2d(t, *t.sub_counts) if t.Sc else _grid_2d(t, t.nR, t.nC)
    return _geom_of(t).meta_shape


def _row_tiling(t: Tiling) -> Tiling:
    """2-D tiles as the 1-D tiles of their rows copy, which the kernels cast.

    `_to_tile_rows` puts a tile per row, each subtile contiguous: the reference's elements in
    the reference's order (`to_tiles`, `to_subtiles`), so the same sums and choices.
    """
    n, e = t.B * t.nR * t.nC, t.tile_elems
    unit = t.Sr * t.Sc
    return Tiling((n, e), 1, 1, n, e, 1, e, 1 if unit else 0, unit, "1d")


def _geom_of(tiling: Tiling) -> _Geom:
    """The kernels' geometry of a 1-D or tensor tiling."""
    shape, a = tiling.shape, tiling.axis
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


def _unit_geom(g: _Geom) -> _Geom:
    """Subtiles over 1024 elements as tiles of their own (cast with their tile's statistics).

    A unit's elements, in order, are the same, so the same sums and mapping; its instances
    come in the order of the meta grid (layout.py `sub_grid`), as one tile's subtiles do.
    """
    t = g.tiling
    return _geom_of(Tiling(t.shape, t.axis, t.B, t.R, t.C, t.Tr, t.Sc, 0, 0, "1d"))


def _tile_of_unit(g: _Geom, gu: _Geom) -> torch.Tensor:
    """For each instance of `_unit_geom` ``gu``, the index of its tile's instance in ``g``."""
    o = torch.arange(g.outer)[:, None, None]
    j = torch.arange(gu.nC)[None, :, None] // g.nsub
    return ((o * g.nC + j) * g.inner + torch.arange(g.inner)[None, None, :]).reshape(-1)


def _first_units(g: _Geom, gu: _Geom) -> torch.Tensor:
    """For each tile instance of ``g``, the index of its first unit's instance in ``gu``."""
    o = torch.arange(g.outer)[:, None, None]
    j = torch.arange(g.nC)[None, :, None] * g.nsub
    return ((o * gu.nC + j) * g.inner + torch.arange(g.inner)[None, None, :]).reshape(-1)


def _tile_stats(x: torch.Tensor, g: _Geom) -> torch.Tensor:
    """Per tile instance of ``g``: [finite absmax bits, 2 * any NaN/Inf + any NaN] (int32).

    The statistics `_cb_long_stats` gathers, with torch ops (zeros pad the last tile).
    """
    ab = x.float().reshape(g.outer, g.C, g.inner).view(torch.int32) & 0x7FFFFFFF
    ab = torch.nn.functional.pad(ab, (0, 0, 0, g.nC * g.TC - g.C))
    ab = ab.reshape(g.outer, g.nC, g.TC, g.inner)
    amax = torch.where(ab < 0x7F800000, ab, 0).amax(dim=2)
    flags = 2 * (ab >= 0x7F800000).any(dim=2).int() + (ab > 0x7F800000).any(dim=2).int()
    return torch.stack([amax, flags], dim=-1).reshape(-1, 2).to(torch.int32)


def _geom_args(g: _Geom) -> tuple[int, ...]:
    """The kernels' geometry arguments, ``n_inst`` .. ``sub_cols``."""
    return (g.n_inst, g.C, g.TC, g.inner, g.nC, g.nsub, g.sub, max(g.sub_cols, 1))


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
    bt = max(1, _config()[0] // (nsub_p * sub_p))  # not capped by n_inst: fewer compiles
    return nsub_p, sub_p, bt, 1


@functools.lru_cache(maxsize=64)
def _tables(
    book: Codebook, mags: tuple[tuple[float, ...], ...], device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Device tables: magnitudes (float64), even-code flags, the full signed table (float64).

    Float64 holds every compute value (float32 need not: e5m26, e11m20, e4m3b150...); the
    kernels round each value times its scale to float32 once. Keyed on the mappings too: a
    Codebook's equality and hash leave them out.
    """
    m64 = np.asarray(mags, dtype=np.float64).reshape(-1)
    codes = book.magnitude_codes()
    even = (np.asarray(codes, dtype=np.int64).reshape(-1) % 2 == 0).astype(np.int8)
    tab = np.asarray(book.table(), dtype=np.float64).reshape(-1)
    m64_d, even_d, tab_d = (
        torch.from_numpy(np.ascontiguousarray(t)).to(device) for t in (m64, even, tab)
    )
    return m64_d, even_d, tab_d


def _book_tables(book: Codebook, device: torch.device) -> tuple[torch.Tensor, ...]:
    return _tables(book, book.magnitudes(), str(device))


def _scale_args(book: Codebook, dt: DataType, scale_mode: ScaleMode, step: int) -> list[int]:
    """bump_t .. s_nan of the kernel (reference `_scale_exponent` on the compute type).

    ``step``: scale search's candidate, added to the stored exponent before the clamp (the
    element emax lowered by it).
    """
    s = dt.sspec
    assert s is not None
    e = book.compute
    low, high = -s.scale.bias, (1 << s.scale.ebits) - 2 - s.scale.bias
    return [
        _bump_threshold(_elem_fmt(e), scale_mode),
        e.emax - step,
        low,
        high,
        s.scale.bias,
        (1 << s.scale.ebits) - 1,
    ]


def _format_args(
    book: Codebook,
    dt: DataType,
    round_mode: RoundMode,
    nan_block: int,
    scale_mode: ScaleMode,
    step: int,
) -> tuple[Any, ...]:
    """The quantize kernel's format numbers, ``rmode`` .. ``c_maxf``.

    ``nan_block``: 0 a NaN marks its tile, 1 any NaN or Inf does, 2 none is marked.
    """
    c = book.compute
    return (
        _ROUND[round_mode],
        nan_block,
        *_scale_args(book, dt, scale_mode, step),
        int(c.has_negative_zero),
        c.emin,
        c.mbits,
        _maxfloat_bits(c.maxfloat),
    )


def _maxfloat_bits(maxfloat: float) -> int:
    """The compute type's maxfloat as float64 bits (an int64 argument: a float one is float32).

    At least 2^32 (a float64 below 2^-1041), so that Triton types it int64 for every format:
    the kernel's bound compares it with reach >= 2^-1008 (65504 / 2^1023), so raising a smaller
    maxfloat there changes nothing.
    """
    return max(int(np.float64(maxfloat).view(np.int64)), 1 << 32)


# -- host side -------------------------------------------------------------------------------
def _common(g: _Geom, nsub_p: int, sub_p: int, bt: int) -> dict[str, Any]:
    return dict(
        LAST=g.inner == 1,
        TENSOR=g.tensor,
        SUBT=bool(g.tiling.Sc),
        NSUB=nsub_p,
        SUB=sub_p,
        BT=bt,
    )


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
    scale_step: int = 0,
    mark_nan_tiles: bool = True,
) -> dict[str, Any]:
    """Quantize a float32/float16/bfloat16 tensor to codebook ``dt`` (reference, bit for bit).

    ``seed`` and ``full_int_range`` are accepted for the engines' common signature and have
    no effect on codebooks. Scale mode ``search`` is `onnxq.cast.triton_search`, which calls
    this once per candidate: the floor scale ``scale_step`` codes up, with
    ``mark_nan_tiles=False`` (a tile holding NaN is cast as the others; the caller marks it
    after the choice, which scores the unmarked values, as the reference).

    Returns:
        A dict with ``values`` (input dtype and shape, when asked), ``codes`` (uint8 table
        indices, input shape), ``scale`` (exponent codes, grid layout) and ``meta`` (uint8
        mapping index per subtile, else per tile, grid layout), the code fields only when asked.

    Raises:
        NotImplementedError: stochastic rounding, or a cast `supports` refuses.
        TypeError: an unsupported input dtype.
        ValueError: scale mode ``search`` (`onnxq.cast.triton_search` runs it).
    """
    if scale_mode is ScaleMode.SEARCH:
        raise ValueError("scale mode 'search' runs in onnxq.cast.triton_search, not here")
    if round_mode is RoundMode.STOCHASTIC:
        raise NotImplementedError(
            "codebooks round to the nearest table entry; stochastic is not supported"
        )
    if x.dtype not in _IN_KIND:
        raise TypeError(f"the Triton engine casts float32, float16 or bfloat16, not {x.dtype}")
    book = _check_book(dt, tuple(x.shape), axis)
    s = dt.sspec
    assert s is not None
    tiling = Tiling.build(tuple(x.shape), axis, s)
    x = x.contiguous()
    out: dict[str, Any] = {}
    mask = None
    if s.sparsity[1]:  # as the reference: prune first, then tile the pruned tensor
        x, mask = prune(x, tiling, s.sparsity)
        out["mask"] = mask
    rows = tiling.kind == "2d"
    if rows:
        x = _to_tile_rows(x, tiling)
    g = _geom_of(_row_tiling(tiling) if rows else tiling)
    nan_block = 2 if not mark_nan_tiles else int(nan_policy is NanPolicy.BLOCK)
    fmt = _format_args(book, dt, round_mode, nan_block, scale_mode, scale_step)
    y, codes, scale, meta = _run_quant(x, g, book, s.scale.bits, fmt, want_values, want_codes)
    if want_values:
        if rows:
            y = _from_tile_rows(y, tiling)
        if mask is not None:  # pruned positions read as zero, NaN tiles included
            y = y.masked_fill_(~mask, 0)
        out["values"] = y
    if want_codes:
        out.update(_code_fields(codes, scale, meta, g, tiling, s.scale.bits))
    return out


def _run_quant(
    x: torch.Tensor,
    g: _Geom,
    book: Codebook,
    scale_bits: int,
    fmt: tuple[int | float, ...],
    want_values: bool,
    want_codes: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the quantize kernel on ``x`` (tiled as ``g``): values, codes, scales, meta."""
    dev = x.device
    # subtiles over 1024 elements: cast as tiles of their own, with their tile's statistics
    big = bool(g.tiling.Sc) and g.sub > _MAX_TILE
    gk = _unit_geom(g) if big else g
    stats = torch.zeros(2, dtype=torch.int32, device=dev)  # (read only with PRE)
    if big:
        stats = _tile_stats(x, g)[_tile_of_unit(g, gk).to(dev)]
    nsub_p, sub_p, bt, n_chunks = _launch(gk)
    m64, even, _tab = _book_tables(book, dev)
    y = torch.empty_like(x) if want_values else torch.empty(1, dtype=x.dtype, device=dev)
    if want_codes:
        codes = torch.empty(x.shape, dtype=torch.uint8, device=dev)
        # scale codes over 8 bits: int16 (torch's uint16 lacks CUDA ops), uint16 out
        scale = torch.empty(gk.n_inst, dtype=_store_dtype(scale_bits), device=dev)
        meta = torch.empty(math.prod(g.meta_shape), dtype=torch.uint8, device=dev)
    else:
        codes = scale = meta = torch.empty(1, dtype=torch.uint8, device=dev)
    ib = book.index_bits
    consts = dict(
        IN_KIND=_IN_KIND[x.dtype],
        WANT_Y=want_values,
        WANT_CODES=want_codes,
        IB=ib,
        K=1 << (ib - 1),
        LOG2K=ib - 1,
        NMAP=book.num_mappings,
        FORCE=_FORCE_ORDERED,
        LAST=gk.inner == 1,
        TENSOR=gk.tensor,
        SUBT=bool(gk.tiling.Sc),
        NSUB=nsub_p,
        SUB=sub_p,
        num_warps=_config()[1],
        enable_fp_fusion=False,
    )
    ptrs = (_int_view(x), _int_view(y), codes, scale, meta, m64, even, stats)
    long = _is_long(gk)
    # the tree sums of a long tile's n elements are within n * 2^-53 of the ordered ones
    delta = 2.0 ** (math.ceil(math.log2(gk.TC)) - 50) if long else 0.0
    _cb_quant_kernel[(triton.cdiv(gk.n_inst, bt),)](
        *ptrs,
        *_geom_args(gk),
        n_chunks,
        delta,
        *fmt,
        BT=bt,
        NMAP_P=triton.next_power_of_2(book.num_mappings),
        LONG=long,
        PRE=big,
        **consts,
    )
    if big and want_codes:  # one scale per tile: its first unit's
        scale = scale[_first_units(g, gk).to(dev)]
    return y, codes, scale, meta


def _code_fields(
    codes: torch.Tensor,
    scale: torch.Tensor,
    meta: torch.Tensor,
    g: _Geom,
    tiling: Tiling,
    scale_bits: int,
) -> dict[str, torch.Tensor]:
    """The kernel's codes, scales and meta in the reference's layouts.

    2-D tiles come back from the rows copy to the input and layout.py's grids; scale codes
    over 8 bits as uint16.
    """
    scale_type = _code_torch_dtype(scale_bits)
    if tiling.kind == "2d":
        return {
            "codes": _from_tile_rows(codes, tiling),
            "scale": _rows_grid(scale, tiling).view(scale_type),
            "meta": _sub_grid(meta, tiling) if tiling.Sc else _rows_grid(meta, tiling),
        }
    return {
        "codes": codes,
        "scale": scale.reshape(g.grid_shape).view(scale_type),
        "meta": meta.reshape(g.meta_shape),
    }


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
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Values of unpacked codebook codes (reference `dequantize`, bit for bit), as ``out_dtype``.

    ``tenscale`` is accepted for the engines' common signature (codebooks have none).
    ``mask`` (N:M sparsity, bool of ``shape``) makes pruned positions read as zero.

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
    tiling = Tiling.build(shape, int(axis) % len(shape), s)
    rows = tiling.kind == "2d"
    g = _geom_of(_row_tiling(tiling) if rows else tiling)
    dev = codes.device
    big = bool(g.tiling.Sc) and g.sub > _MAX_TILE  # units of their own (`_unit_geom`)
    gk = _unit_geom(g) if big else g
    nsub_p, sub_p, bt, n_chunks = _launch(gk)
    tab = _book_tables(book, dev)[2]
    c = codes.contiguous().reshape(shape)
    scale = _signed(scale.contiguous())  # 16-bit codes: torch's uint16 lacks CUDA ops
    if rows:
        c = _to_tile_rows(c, tiling)
        sc = _rows_ungrid(scale, tiling)
        mt = _sub_ungrid(meta, tiling) if tiling.Sc else _rows_ungrid(meta.contiguous(), tiling)
    else:
        sc = scale.reshape(-1)
        mt = meta.contiguous().reshape(-1)
    if big:  # each unit's tile's scale
        sc = sc[_tile_of_unit(g, gk).to(dev)]
    y = torch.empty(c.shape, dtype=out_dtype, device=dev)
    c = c.reshape(-1)
    long = _is_long(gk)
    _cb_dequant_kernel[(gk.n_inst * n_chunks if long else triton.cdiv(gk.n_inst, bt),)](
        c,
        _int_view(y),
        sc,
        mt,
        tab,
        *_geom_args(gk),
        n_chunks,
        s.scale.bias,
        (1 << s.scale.ebits) - 1,
        (1 << s.scale.bits) - 1,
        book.index_bits,
        book.num_mappings,
        OUT_KIND=_IN_KIND[out_dtype],
        CHUNKED=long,
        num_warps=_config()[1],
        **_common(gk, nsub_p, sub_p, bt),
    )
    y = _from_tile_rows(y, tiling) if rows else y
    return y if mask is None else y.masked_fill_(~mask.reshape(shape).to(torch.bool), 0)
