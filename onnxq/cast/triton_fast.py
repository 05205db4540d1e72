"""The Triton engine's fast path: whole tiles along any axis, round-half-even, one pass.

`onnxq.cast.triton` serves every layout with integer arithmetic on float32 bits, which is
exact everywhere but costs about a hundred integer operations per element: on an H100 that
bounds a cast at a fifth of memory speed. This module serves the common case - tiles of a
power-of-two length that divide the tiled axis, round-half-even, exponent (MX, BFP, MX9/6/4)
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
tile statistics, the scale, the values or codes, and stores once. Tiles along an axis with
elements after it (NCHW channels) are taken ``BT`` side by side, one per position after the
axis, so each row of the block is contiguous (coalesced loads); their codes are packed
afterwards, not in the kernel. NVFP4's tensor amax is one
reduction pass before the cast. Fused multiply-add contraction is off: every float operation
is rounded as written. Everything else goes to `onnxq.cast.triton`.

The kernels live in `onnxq.cast.triton_fast_kernel`; they are launched through this module's
names (`onnxq.cast.aot` records the launches by replacing them here).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any

import numpy as np
import torch
import triton

from onnxq.cast.elements import nan_code
from onnxq.cast.triton_bits import _int_view
from onnxq.cast.triton_fast_kernel import _amax_kernel, _fast_kernel
from onnxq.cast.triton_plan import _IN_KIND, _SMODE, _elem_fmt, block_warps
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode

__all__ = ["FastPlan", "fast_plan", "quantize", "why_not_fast"]

_BLOCK, _WARPS = 4096, 8  # elements and warps per program (benchmarks/gpu.py --sweep)
_AMAX_BLOCK, _AMAX_PROGRAMS = 4096, 1056  # the tensor-amax pass: 8 programs per H100 SM


def _pack_layout(bits: int, tile: int, float_scale: bool, itemsize: int) -> tuple[int, int]:
    """(G3, group) of compress casts of ``bits``-bit codes that do not fill whole bytes.

    Codes are packed in groups of ``group`` consecutive codes, each summed in registers and
    written as whole 8- to 64-bit integers (`_units`). G3 > 1: the kernel loads its block as
    (tiles, tile // G3, G3) with a group innermost; G3 = 1: it loads (tiles, tile) and
    flattens the block to groups. Measured on an H100 (8192^2 and 16384^2, CUDA graphs, x
    copy) with the smallest whole-byte group: NVFP4 0.31-0.44 flat, 0.35-0.51 in 3-D; but
    MXFP4 0.62-0.92 flat against 0.57-0.71, and MXFP6 0.58-0.87 against 0.15-0.26, so
    exponent-scale formats keep the flat block. Larger groups (16 6-bit codes are three
    32-bit stores, not twelve byte stores) are not timed on a GPU yet.

    ``ONNXQ_TRITON_PACK_GROUP`` overrides the choice: ``flat`` (the smallest group, flat),
    ``3d`` (the smallest group, 3-D, where a tile holds one), ``load`` (flat groups of the
    codes of one 16-byte load, so a thread sums its own codes: 8 from bfloat16, 4 from
    float32), or N, a power of two: flat groups of N codes; groups are at most a tile (but
    at least the smallest whole-byte group) and at most 128 bits.
    """
    g_min = _group(bits)[0]
    # a 3-D block needs whole groups in a tile (NVFP4-like formats with tiles of 2 or 4
    # 5- or 6-bit codes do not have them)
    three_d = (g_min, g_min) if g_min <= tile else (1, g_min)
    text = os.environ.get("ONNXQ_TRITON_PACK_GROUP", "")
    if not text:
        return three_d if float_scale else (1, g_min)
    if text == "flat":
        return 1, g_min
    if text == "3d":
        return three_d
    if text == "load":
        g = 16 // itemsize
        while g * bits > 128:
            g //= 2
    else:
        try:
            g = int(text)
        except ValueError:
            g = -1
        if g < 1 or g & (g - 1) or g * bits > 128:
            raise ValueError(
                f"ONNXQ_TRITON_PACK_GROUP={text!r}: expected flat, 3d, load or a power of two "
                f"of at most {128 // bits} codes (128 bits of {bits}-bit codes), e.g. 16"
            )
    # Larger groups stay within a tile, so a tensor is whole groups and whole units: the last
    # unit never runs past the stream. The smallest group may span tiles (bytes are masked
    # one by one).
    return 1, max(min(g, tile), g_min)


def _units(bits: int, group: int) -> tuple[int, int]:
    """(bits, count) of the integers that write one group of ``group`` codes."""
    total = bits * group
    unit = 64
    while total % unit:
        unit //= 2
    return unit, total // unit


def _config() -> tuple[int, int]:
    """(elements, warps) per program; ``ONNXQ_TRITON_FAST_CONFIG=8192:16`` overrides them."""
    text = os.environ.get("ONNXQ_TRITON_FAST_CONFIG", "")
    if not text:
        return _BLOCK, _WARPS
    knob = "ONNXQ_TRITON_FAST_CONFIG"
    return block_warps(knob, text, 1024, 1 << 20, (1, 2, 4, 8, 16, 32), "4096:8")


@dataclasses.dataclass(frozen=True)
class FastPlan:
    """Geometry of one fast cast: ``n_tiles`` tiles of ``tc`` elements, ``bt`` a program.

    ``inner`` > 1: the tiles run along ``axis``, which has ``inner`` elements after it (a
    program takes ``bt`` tiles side by side along those elements).
    """

    n_tiles: int
    tc: int
    nsub: int
    sub: int
    bt: int
    warps: int
    inner: int = 1
    axis: int = -1  # the tiled axis (non-negative)

    @property
    def programs(self) -> int:
        """The kernel's grid."""
        if self.inner == 1:
            return triton.cdiv(self.n_tiles, self.bt)
        return self.n_tiles // self.inner * triton.cdiv(self.inner, self.bt)


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
    if not shape:
        return "a 0-D tensor"
    if n.bits > 8 or s.scale.bits > 8:
        return "elements or scales over 8 bits"
    tc = s.tiles[0].size
    if tc <= 0 or tc & (tc - 1) or tc > 1024 or shape[axis % len(shape)] % tc:
        return "tile length not a power of two dividing the tiled axis"
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
    a = axis % len(shape)
    inner = math.prod(shape[a + 1 :])
    n_tiles = math.prod(shape) // tc
    bt = max(1, block // tc)
    return FastPlan(n_tiles, tc, tc // sub, sub, bt, warps, inner, a)


def _group(bits: int) -> tuple[int, int]:
    """(codes, bytes) of the smallest whole-byte group of ``bits``-bit codes."""
    g = 8 // math.gcd(8, bits)
    return g, g * bits // 8


def _pack_consts(bits: int, packed: bool, layout: tuple[int, int]) -> dict[str, int]:
    """The kernel's packing constexprs: block shape (G3), group, and the integers per group."""
    g = _group(bits)[0]
    g3, group = layout if packed and g > 1 else (1, g)
    unit, units = _units(bits, group)
    return dict(E_G=g, G3=g3, P_GROUP=group, P_UNIT=unit, P_UNITS=units)


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
    pack_layout: tuple[int, int],
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
    if n.is_float:
        nan_mode = 2 if nan_policy is NanPolicy.BLOCK else 0
    else:
        nan_mode = 2 if nan_policy is NanPolicy.BLOCK else 1
    consts: dict[str, Any] = dict(
        SMODE=0,
        MID_T=0,
        TOP_T=0,
        S_LOW=0,
        S_HIGH=0,
        S_BIAS=0,
        S_NAN=0,
        EL_MAXF=1.0,
        S_MBITS=0,
        S_EMIN=0,
        S_MAXF=1.0,
        TS=False,
        TS_DENOM=1.0,
        T_ROUND=False,
        T_MBITS=0,
        T_EMIN=0,
        T_MAXF=1.0,
        SPLIT=False,
    )
    if s.scale.is_exponent:
        frac = n.int_fraction_bits
        low, high = -s.scale.bias - frac, (1 << s.scale.ebits) - 2 - s.scale.bias - frac
        mid_t = top_t = 0
        if e.is_float:
            mid_t = (2 * e.maxm + 1) << (22 - e.mbits) if e.mbits <= 22 else 0
            top_t = e.maxm << (23 - e.mbits)
        consts.update(
            SKIND=1,
            SMODE=_SMODE[scale_mode] if e.is_float else 0,
            MID_T=mid_t,
            TOP_T=top_t,
            S_LOW=low,
            S_HIGH=high,
            S_BIAS=s.scale.bias + frac,
            S_NAN=(1 << s.scale.ebits) - 1,
            SPLIT=-(low - bool(s.tiles[0].subtile)) > 127,
        )
    else:
        consts.update(
            SKIND=2,
            S_NAN=nan_code(s.scale),
            EL_MAXF=float(np.float32(n.maxfloat)),
            S_MBITS=s.scale.mbits,
            S_EMIN=s.scale.emin,
            S_MAXF=float(s.scale.maxfloat),
        )
        if s.tenscale is not None:
            t = s.tenscale
            denom = np.float32(n.maxfloat) * np.float32(s.scale.maxfloat)
            consts.update(
                TS=True,
                TS_DENOM=float(denom),
                T_ROUND=t.mbits < 23 or t.emin > -126,
                T_MBITS=t.mbits,
                T_EMIN=t.emin,
                T_MAXF=float(np.float32(t.maxfloat)),
            )
    consts.update(
        TC=fp.tc,
        NSUB=fp.nsub,
        SUB=fp.sub,
        BT=fp.bt,
        OUT_KIND=in_kind,
        HW_BF16=not interpreting,
        WANT_Y=want_values,
        WANT_CODES=want_codes,
        PACKED=packed,
        **_pack_consts(n.bits, packed, pack_layout),
        NAN_MODE=nan_mode,
        SHIFT=bool(s.tiles[0].subtile),
        E_FLOAT=e.is_float,
        E_MBITS=e.mbits,
        E_EMIN=e.emin,
        E_EMAX=e.emax,
        E_MAXF=float(n.maxfloat),
        E_BITS=n.bits,
        E_NEGZERO=e.negzero,
        E_NANCODE=e.nan_code,
        E_LIM=float(e.maxm),
        FULL_INT=full_int_range and not e.is_float,
        INNER=fp.inner > 1,
        num_warps=fp.warps,
        enable_fp_fusion=False,
    )
    grid = (fp.programs,)
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

    Raises:
        ValueError: ``packed`` for tiles along a non-last axis (their codes are not
            contiguous in the stream: the caller packs the unpacked ones).
    """
    if packed and fp.inner > 1:
        raise ValueError("the fast kernel packs codes of tiles along the last axis only")
    x = x.contiguous()
    shape = tuple(x.shape)
    launch = _launch(
        dt,
        shape,
        _IN_KIND[x.dtype],
        fp,
        scale_mode,
        nan_policy,
        full_int_range,
        want_values,
        want_codes,
        packed,
        os.environ.get("TRITON_INTERPRET", "") == "1",
        _pack_layout(dt.nspec.bits, fp.tc, not dt.sspec.scale.is_exponent, x.element_size()),
    )
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
            x_bits,
            top,
            numel,
            IN_KIND=_IN_KIND[x.dtype],
            BLOCK=_AMAX_BLOCK,
            ROUNDS=rounds,
            num_warps=8,
        )
    _fast_kernel[launch.grid](
        x_bits,
        _int_view(y) if want_values else y,
        codes,
        scale,
        meta,
        top,
        ts_code,
        launch.n_tiles,
        launch.code_nbytes,
        launch.meta_nbytes,
        fp.inner,
        **launch.consts,
    )
    out: dict[str, Any] = {}
    if want_values:
        out["values"] = y
    if not want_codes:
        return out
    out["codes"] = codes if packed else codes.view(shape)
    a = fp.axis
    out["scale"] = scale.view(*shape[:a], shape[a] // fp.tc, *shape[a + 1 :])
    if launch.meta_count:
        meta_grid = (*shape[:a], shape[a] // fp.sub, *shape[a + 1 :])
        out["meta"] = meta if packed else meta.view(meta_grid)
    tenscale = dt.sspec.tenscale if dt.sspec is not None else None
    if tenscale is not None:
        if tenscale.bits <= 8:
            out["tenscale"] = ts_code.to(torch.uint8)
        elif tenscale.bits <= 16:
            out["tenscale"] = ts_code.to(torch.int16).view(torch.uint16)
        else:
            out["tenscale"] = ts_code.view(torch.uint32)
    return out
