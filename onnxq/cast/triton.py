"""Triton engine: the reference's casts on torch tensors, bit for bit (architecture decision 12).

The host side of the general engine: `quantize`, `dequantize`, `upcast` and `to_qtensor`
prepare the tensors and launch the kernels. What selects code or block shapes is
``tl.constexpr`` (scale kind, element float/int, tile layout, stochastic rounding, float32 or
16-bit data); format numbers (exponent ranges, biases, thresholds, codes, the round mode, the
NaN policy, bfloat16 vs float16, which outputs are wanted) are runtime arguments kept out of
Triton's int specialisation, so one compile serves many formats and modes. The modules:

- `triton_plan`: `plan` (support checks, geometry) and the format numbers the kernels take;
- `triton_quant_kernel`: `_quant_kernel`, the cast itself, in named phases;
- `triton_kernels`: `_stats_kernel`, `_dequant_kernel`, `_prune_kernel`;
- `triton_device`: the `@triton.jit` helpers they share (integer rounding on float32 bits);
- `triton_tiles`: 2-D tiles as rows of a copy, scale and shift-bit grids;
- `triton_bits`: signed views and the packed bit stream (`pack_bits`, `unpack_bits`).

The kernels are launched through this module's names (`onnxq.cast.aot` records the launches by
replacing them here). Floating-point operations appear only where the reference itself computes
in float32 (float scales: ``amax / maxfloat``, ``x / scale``, ``q * scale``, zero points), use
correctly rounded division, and are launched with fused multiply-add off.

Geometry (layout.py, 1-D tiles): the input is seen as ``(outer, C, inner)`` with ``C`` the
tiled axis. A *tile instance* is ``(o, j, i)`` - tile ``j`` of row ``(o, i)`` - numbered in the
order of the scale grid, so the grid index of a tile is its instance number. A non-last
axis is read with strided loads (stride ``inner``); no transposed copy is made.
Non-contiguous inputs are copied to contiguous memory first (the stochastic index is the
element's flat C-order index, which needs that order anyway). 2-D tiles are cast as the rows
of a padded copy holding one tile per row (subtiles contiguous), with the flat input index
alongside for stochastic rounding.

Element codes over 16 bits, and float codes whose values float32 does not all hold (e9m14,
e5m26, e4m3b150), decode without the 2^bits tables of the others: ints by sign extension,
floats from their fields (`_float_fields`), and q * 2^k rounds once from the exact value
(`_make_f32`; int32's full-range -2^31 is carried as a wrapped 2^31). Scale and zero-point
codes over 16 bits become float32 bits first (`triton_bits.float32_bits`). Float scales,
zero points and tensor scales saturate at the largest value float32 holds (`_scale_fmt`).

Not implemented here (`NotImplementedError` names them): codebooks (triton_codebook.py) and
exponent scales over 10 bits (the parser refuses them; the reference's float64 powers
overflow beyond, and native stops there too).
"""

# Tile geometry keeps layout.py's names (C, TC, nC).
# ruff: noqa: N803

from __future__ import annotations

import functools
import math
import os
from typing import Any

import numpy as np
import torch
import triton

from onnxq.cast.elements import _table, nan_code
from onnxq.cast.triton_bits import (
    _flat_codes,
    _int_view,
    _signed,
    _to_code,
    float32_bits,
    pack_bits,
    unpack_bits,
)
from onnxq.cast.triton_kernels import _dequant_kernel, _stats_kernel
from onnxq.cast.triton_plan import (
    _BLOCK,
    _FINITE,
    _IN_KIND,
    _ROUND,
    _bump_threshold,
    _code_torch_dtype,
    _float32_like,
    _float32_subset,
    _hash_key,
    _Plan,
    _store_dtype,
    plan,
)
from onnxq.cast.triton_quant_kernel import _QUANT_RUNTIME, _quant_kernel
from onnxq.cast.triton_tiles import (
    _from_tile_rows,
    _sub_grid,
    _sub_ungrid,
    _tile_grid,
    _tile_ungrid,
    _to_tile_rows,
    prune,
)
from onnxq.formats.datatype import DataType
from onnxq.formats.modes import CastMode, NanPolicy, RoundMode, ScaleMode
from onnxq.formats.number import InfNaN, NumberSpec

__all__ = ["dequantize", "pack_bits", "plan", "quantize", "to_qtensor", "unpack_bits", "upcast"]


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
        lo = torch.empty(n_units, dtype=torch.int64, device=x.device)  # `_lo_key`s
        hi = torch.empty_like(amax)
    _stats_kernel[_programs(n_units, 1)](
        _int_view(x),
        amax,
        flags,
        lo,
        hi,
        n_units,
        n_chunks,
        C,
        tc,
        inner,
        nc,
        _bf16(x.dtype),
        HALF=x.dtype != torch.float32,
        LAST=inner == 1,
        TILE=tile,
        BT=1,
        MINMAX=minmax,
    )
    if n_chunks > 1:
        amax = amax.view(n_inst, n_chunks).amax(dim=1)
        flags = flags.view(n_inst, n_chunks).amax(dim=1)
        if minmax:
            lo = lo.view(n_inst, n_chunks).amin(dim=1)
            hi = hi.view(n_inst, n_chunks).amax(dim=1)
    return amax, flags, lo, hi


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
    scale_step: int = 0,
) -> dict[str, Any]:
    """Quantize a float32/float16/bfloat16 torch tensor (reference `quantize`, bit for bit).

    Scale mode ``search`` is `onnxq.cast.triton_search`, which calls this once per candidate
    scale, ``scale_step`` codes away from the floor scale.

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
    s = dt.sspec
    if scale_mode is ScaleMode.SEARCH:
        raise ValueError("scale mode 'search' runs in onnxq.cast.triton_search, not here")
    x = x.contiguous()
    dev = x.device
    e = p.elem
    out: dict[str, Any] = {}
    mask = None
    if s is not None and s.sparsity[1]:
        x, mask = prune(x, p.tiling, s.sparsity)
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
    codes, scale, zero, meta = _code_buffers(p, xk.shape, want_codes, dev)
    dummy_i32 = torch.zeros(1, dtype=torch.int32, device=dev)
    ts_code = amax = lo = hi = dummy_i32
    flags = torch.zeros(1, dtype=torch.int8, device=dev)
    top = torch.zeros(1, dtype=torch.float32, device=dev)
    nums = _quant_numbers(p, x.dtype, round_mode, scale_mode, nan_policy, full_int_range)
    nums.update(want_y=int(want_values), want_codes=int(want_codes), s_step=scale_step)
    if s is not None:
        if not p.single:
            amax, flags, lo, hi = _stats(
                xk, p.TC, p.n_inst, p.nC, p.inner, p.C, minmax=p.skind >= 3
            )
        if s.tenscale is not None:
            size = x.numel()
            top_bits, _, _, _ = _stats(x, size, 1, 1, 1, size, minmax=False)
            top = top_bits.view(torch.float32).reshape(1)
            ts_code = torch.zeros(1, dtype=torch.int32, device=dev)
    _quant_kernel[_programs(n_units, bt)](
        _int_view(xk),
        _int_view(y),
        codes,
        scale,
        meta,
        zero,
        amax,
        flags,
        lo,
        hi,
        top,
        ts_code,
        dummy_i32 if idx is None else idx,
        n_units,
        n_chunks,
        p.C,
        p.TC,
        p.inner,
        p.nC,
        max(p.sub_cols, 1),
        _hash_key(seed),
        **nums,
        HALF=x.dtype != torch.float32,
        PRE=not p.single,
        LAST=p.inner == 1,
        TILE=tile,
        NSUB=nsub,
        SUB=sub,
        BT=bt,
        SKIND=p.skind,
        SHIFT=bool(p.sub),
        STOCH=stoch,
        E_FLOAT=e.is_float,
        TS=p.tfmt is not None,
        IDX=idx is not None,
        enable_fp_fusion=False,
    )
    if want_values:
        if p.rows:
            y = _from_tile_rows(y, p.tiling)
        if mask is not None:  # pruned positions read as zero whatever the zero point
            y = y.masked_fill_(~mask, 0)
        out["values"] = y
    if want_codes:
        out.update(_code_outputs(p, codes, scale, zero, meta, ts_code))
    return out


def _code_buffers(
    p: _Plan, shape: tuple[int, ...], want_codes: bool, dev: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The codes, scale, zero-point and shift-bit buffers `_quant_kernel` writes.

    Unwanted outputs are 1-element stand-ins of the same dtypes (the same compile).
    """
    n, s = p.dt.nspec, p.dt.sspec
    codes = torch.empty(shape if want_codes else 1, dtype=_store_dtype(n.bits), device=dev)
    scale = zero = torch.zeros(1, dtype=torch.int32, device=dev)
    meta = torch.zeros(1, dtype=torch.uint8, device=dev)
    if s is None:
        return codes, scale, zero, meta
    size, alloc = (p.n_inst, torch.empty) if want_codes else (1, torch.zeros)
    scale = alloc(size, dtype=_store_dtype(s.scale.bits), device=dev)
    if s.zero is not None:
        zero = alloc(size, dtype=_store_dtype(s.zero.bits), device=dev)
    if want_codes and p.sub:
        meta_size = p.n_inst * p.nsub if p.rows else math.prod(p.meta_shape)
        meta = torch.empty(meta_size, dtype=torch.uint8, device=dev)
    return codes, scale, zero, meta


def _quant_numbers(
    p: _Plan,
    dtype: torch.dtype,
    round_mode: RoundMode,
    scale_mode: ScaleMode,
    nan_policy: NanPolicy,
    full_int_range: bool,
) -> dict[str, Any]:
    """`_quant_kernel`'s run-time format numbers (unused ones 0) for a cast of ``dtype`` data."""
    n, s, e = p.dt.nspec, p.dt.sspec, p.elem
    nums: dict[str, Any] = dict.fromkeys(_QUANT_RUNTIME[8:], 0)
    nums.update(el_maxf=1.0, ts_denom=1.0)
    f_emax, f_mbits, f_over, f_max = _FINITE[dtype]
    nums.update(
        bf16=_bf16(dtype),
        rmode=0 if round_mode is RoundMode.STOCHASTIC else _ROUND[round_mode],
        nan_nf=int(s is not None and nan_policy is NanPolicy.BLOCK),
        nan_nan=int(s is not None and not n.is_float),
        full_int=int(full_int_range and not e.is_float),
        keep_inf=int(s is None and e.has_inf),
        e_mbits=e.mbits,
        e_emin=e.emin,
        e_emax=e.emax,
        e_maxm=e.maxm,
        e_bits=e.bits,
        e_negzero=int(e.negzero),
        e_nancode=e.nan_code,
        e_infcode=e.inf_code,
        f_emax=f_emax,
        f_mbits=f_mbits,
        f_over=f_over,
        f_max=float(f_max),
    )
    if s is None:
        return nums
    if s.scale.is_exponent:
        # clamp(sexp + frac, low, high) - frac == clamp(sexp, low - frac, high - frac)
        frac = n.int_fraction_bits
        nums.update(
            bump_t=_bump_threshold(e, scale_mode),
            s_low=-s.scale.bias - frac,
            s_high=(1 << s.scale.ebits) - 2 - s.scale.bias - frac,
            s_bias=s.scale.bias + frac,
            s_nan=(1 << s.scale.ebits) - 1,
        )
        return nums
    sf = p.sfmt
    assert sf is not None
    with np.errstate(over="ignore"):  # maxfloats past float32's are Inf there, as in numpy's
        el_maxf = float(np.float32(n.maxfloat))
        denom = np.float32(n.maxfloat) * np.float32(s.scale.maxfloat)
    nums.update(
        s_nan=nan_code(s.scale),
        el_maxf=el_maxf,
        s_mbits=sf.mbits,
        s_emin=sf.emin,
        s_emax=sf.emax,
        s_maxm=sf.maxm,
    )
    if p.tfmt is not None:
        tf = p.tfmt
        nums.update(
            ts_denom=float(denom),
            t_mbits=tf.mbits,
            t_emin=tf.emin,
            t_emax=tf.emax,
            t_maxm=tf.maxm,
        )
    if p.zfmt is not None:
        zf = p.zfmt
        nums.update(
            z_mbits=zf.mbits,
            z_emin=zf.emin,
            z_emax=zf.emax,
            z_maxm=zf.maxm,
            z_bits=zf.bits,
            z_negzero=int(zf.negzero),
        )
    return nums


def _code_outputs(
    p: _Plan,
    codes: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    meta: torch.Tensor,
    ts_code: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """The code fields of a quantize result, in the reference's layouts."""
    n, s = p.dt.nspec, p.dt.sspec
    if p.rows:
        codes = _from_tile_rows(codes, p.tiling)
    out = {"codes": codes.view(_code_torch_dtype(n.bits))}
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


@functools.lru_cache(maxsize=64)
def _decode_table(spec: NumberSpec, device: str) -> torch.Tensor:
    values = _table(spec).astype(np.float32).view(np.int32)
    return torch.from_numpy(values.copy()).to(device)


def _field_numbers(n: NumberSpec) -> dict[str, int]:
    """`_float_fields`' numbers (``d_*``) of a float element format (zeros for others)."""
    if not n.is_float:
        return dict(d_bits=0, d_mbits=0, d_emin=0, d_inf=-1, d_nan=-1, d_uznan=0)
    sign_bit = 1 << (n.bits - 1)
    inf = nan = -1
    if n.infnan is InfNaN.IEEE:
        inf = ((1 << n.ebits) - 1) << n.mbits
        nan = inf + 1
    elif n.infnan is InfNaN.FN:
        nan = sign_bit - 1
    elif n.infnan is InfNaN.INUZ:
        inf = sign_bit - 1
    uznan = int(n.infnan in (InfNaN.FNUZ, InfNaN.INUZ))
    return dict(d_bits=n.bits, d_mbits=n.mbits, d_emin=n.emin, d_inf=inf, d_nan=nan, d_uznan=uznan)


def _wide_codes(codes: torch.Tensor, spec: NumberSpec) -> torch.Tensor:
    """Float scale or zero-point codes over 16 bits as float32 bits (values rounded once).

    What the kernels read without a table.
    """
    if spec.bits <= 16 or not spec.is_float or _float32_like(spec):
        return codes
    return float32_bits(codes, spec)


def _tile_codes(grid: torch.Tensor, p: _Plan, spec: NumberSpec) -> torch.Tensor:
    """Scale or zero-point codes in the kernels' instance order (`_wide_codes` applied)."""
    return _wide_codes(_tile_ungrid(_signed(grid.contiguous()), p), spec)


def _zero_decode(z: NumberSpec, nums: dict[str, int], dummy: torch.Tensor) -> torch.Tensor:
    """The zero point's decode numbers for `_zero_value` (into ``nums``) and its table."""
    if z.bits <= 16:
        nums.update(z_mask=(1 << z.bits) - 1, z_shift=-2)
        return _decode_table(z, str(dummy.device))
    # float32 bits (`_wide_codes`) or ints (`plan` refuses the rest)
    nums["z_mask"] = (1 << z.bits) - 1 if z.bits < 32 and not z.is_float else -1
    nums["z_shift"] = -1 if z.is_float else (32 - z.bits if z.is_int else -3)
    return dummy


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
    sc = dummy if scale is None else _tile_codes(scale, p, s.scale)
    zc = dummy if zero is None else _tile_codes(zero, p, s.zero)
    mt = dummy
    if meta is not None:
        mt = _sub_ungrid(meta, p.tiling) if p.rows else meta.contiguous().reshape(-1)
    stab = ztab = dummy
    ts = torch.ones(1, dtype=torch.float32, device=dev)
    s_f32 = False
    # no table for codes over 16 bits, nor for floats whose values float32 does not hold all
    # (large biases): their exact value is scaled before it rounds
    wide = n.bits > 16 or (n.is_float and not _float32_subset(n))
    c_shift = -1 if n.is_float else (32 - n.bits if n.is_int else -2)
    code_mask = (1 << n.bits) - 1 if n.bits < 32 else -1
    nums = dict(
        code_mask=code_mask, c_shift=c_shift, s_bias=0, s_nan=0, s_mask=0, z_mask=0, z_shift=-2
    )
    nums.update(_field_numbers(n), bf16=_bf16(out_dtype))
    if s is not None:
        if s.scale.is_exponent:
            nums.update(
                s_bias=s.scale.bias + n.int_fraction_bits,
                s_nan=(1 << s.scale.ebits) - 1,
                s_mask=(1 << s.scale.bits) - 1,
            )
        else:
            # over 16 bits: float32 bits (`_wide_codes` made them), never a 2^bits table
            s_f32 = s.scale.bits > 16
            if not s_f32:
                stab = _decode_table(s.scale, str(dev))
            nums.update(s_mask=(1 << s.scale.bits) - 1)
            if s.zero is not None:
                ztab = _zero_decode(s.zero, nums, dummy)
            if s.tenscale is not None:
                assert tenscale is not None
                tcode = tenscale.reshape(-1)[:1].cpu().numpy()
                from onnxq.cast.elements import decode_codes

                tval = decode_codes(tcode.astype(np.uint64), s.tenscale).astype(np.float32)
                ts = torch.from_numpy(tval).to(dev)
    _dequant_kernel[_programs(n_units, bt)](
        c,
        _int_view(y),
        sc,
        mt,
        zc,
        dummy if wide else _decode_table(n, str(dev)),
        stab,
        ztab,
        ts,
        n_units,
        n_chunks,
        p.C,
        p.TC,
        p.inner,
        p.nC,
        max(p.sub_cols, 1),
        **nums,
        HALF=out_dtype != torch.float32,
        LAST=p.inner == 1,
        TILE=tile,
        NSUB=nsub,
        SUB=sub,
        BT=bt,
        SKIND=p.skind,
        SHIFT=bool(p.sub),
        WIDE=wide,
        S_F32=s_f32,
        TS=s is not None and s.tenscale is not None,
        enable_fp_fusion=False,
    )
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


def unpacked_codes(q: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A QTensor's element codes (input shape) and N:M keep mask (bool), unpacked.

    A compress-mode stream holds the codes of kept positions only: pruned ones read as 0.
    """
    codes, mask = q.data, q.mask
    if q.mode is not CastMode.COMPRESS:
        return codes, mask
    count = math.prod(q.shape)
    bits = q.dtype.nspec.bits
    if mask is None:
        return unpack_bits(codes, bits, count).reshape(q.shape), None
    mask = unpack_bits(mask, 1, count).to(torch.bool).reshape(q.shape)
    kept = unpack_bits(codes, bits, int(mask.sum()))
    codes = torch.zeros(q.shape, dtype=_signed(kept).dtype, device=kept.device)
    codes[mask] = _signed(kept)
    return codes, mask


def upcast(q: Any, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode a `QTensor` of torch tensors (actual or compress mode) with `dequantize`.

    Raises:
        NotImplementedError: the format is not implemented in Triton (see `plan`).
    """
    codes, mask = unpacked_codes(q)
    meta = q.meta
    if q.mode is CastMode.COMPRESS and meta is not None:
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
