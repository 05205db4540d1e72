"""What one general Triton cast needs: format parameters, geometry and the support checks.

The host side of `onnxq.cast.triton` (architecture decision 12): `plan` refuses what the kernels
do not implement and works out the tile geometry (layout.py, 1-D tiles; 2-D tiles as the rows of
a padded copy), `_ElemFmt` the numbers of an element or scale format the kernels take.
"""

# The plan's geometry fields keep layout.py's names (C, TC, nC).
# ruff: noqa: N815

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import torch
import triton

from onnxq.cast.elements import nan_code
from onnxq.cast.layout import Tiling
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.formats.modes import RoundMode, ScaleMode
from onnxq.formats.number import InfNaN, NumberSpec

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


@functools.lru_cache(maxsize=16)
def block_warps(
    knob: str, text: str, smallest: int, largest: int, warps: tuple[int, ...], example: str
) -> tuple[int, int]:
    """``BLOCK:WARPS`` from an environment knob's ``text``.

    BLOCK must be a power of two in [smallest, largest], WARPS one of ``warps``.

    Raises:
        ValueError: anything else, with the knob's name and an example.
    """
    try:
        block, count = (int(v) for v in text.split(":"))
    except ValueError:
        block = count = 0
    if not smallest <= block <= largest or block & (block - 1) or count not in warps:
        raise ValueError(
            f"{knob}={text!r}: expected BLOCK:WARPS, BLOCK a power of two from {smallest} to "
            f"{largest} and WARPS one of {', '.join(map(str, warps))}, e.g. {example}"
        )
    return block, count


def _elem_fmt(spec: NumberSpec, top: float | None = None) -> _ElemFmt:
    """The format's numbers for the kernels.

    ``top``: a float's saturation value other than its maxfloat (`_scale_fmt`), given as
    ``emax`` (its binade) and ``maxm`` (its grid multiple there).
    """
    if spec.is_float:
        top = spec.maxfloat if top is None else top
        emax = math.frexp(top)[1] - 1
        maxm = int(top / 2.0 ** (emax - spec.mbits))
        nan = nan_code(spec)
        inf = 0
        if spec.has_inf:
            inf = (
                ((1 << spec.ebits) - 1) << spec.mbits
                if spec.infnan is InfNaN.IEEE
                else (1 << (spec.bits - 1)) - 1
            )
        return _ElemFmt(
            True,
            spec.mbits,
            spec.emin,
            emax,
            maxm,
            spec.bits,
            spec.has_negative_zero,
            spec.has_inf,
            nan,
            inf,
        )
    return _ElemFmt(False, 0, 0, spec.emax, int(spec.maxfloat), spec.bits, False, False, 0, 0)


def _scale_fmt(spec: NumberSpec) -> _ElemFmt:
    """A float scale's, tensor scale's or zero point's numbers.

    They saturate at the largest value float32 holds (`NumberSpec.float32_max`; the
    reference's `_cast_scale`).
    """
    return _elem_fmt(spec, spec.float32_max)


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
    """Codes that are float32 bits (IEEE e8m23: float32 itself)."""
    return n.is_float and n.bits == 32 and n.ebits == 8 and n.infnan is InfNaN.IEEE


def _float32_subset(n: NumberSpec) -> bool:
    """A float format whose every value is a float32 number (a float32 table decodes it)."""
    return (
        n.is_float
        and n.mbits <= 23
        and n.maxfloat <= float(np.finfo(np.float32).max)
        and n.emin - n.mbits >= -149
    )


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
    if s is not None and s.scale.is_exponent and s.scale.ebits > 10:
        raise NotImplementedError(missing.format("exponent scales over 10 bits (as native)"))
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
        sfmt = _scale_fmt(s.scale)
        if s.tenscale is not None:
            tfmt = _scale_fmt(s.tenscale)
        if skind == 4:
            zfmt = _scale_fmt(s.zero)
    # one scale per tensor always takes two passes: no compile per tensor size
    single = (
        skind != 0 and tiling.kind != "tensor" and triton.next_power_of_2(TC) <= _MAX_SINGLE_TILE
    )
    return _Plan(
        dt,
        tiling,
        outer,
        inner,
        C,
        TC,
        nC,
        outer * nC * inner,
        skind,
        single,
        nsub,
        sub,
        sub_cols,
        _elem_fmt(n),
        sfmt,
        tfmt,
        zfmt,
    )


def _hash_key(seed: int) -> int:
    """mix32(lo32(seed) ^ 0x9E3779B9) as a signed int32 (elements.py `stochastic_bits`)."""
    x = (seed & 0xFFFFFFFF) ^ 0x9E3779B9
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    x ^= x >> 16
    return x - (1 << 32) if x >= 1 << 31 else x


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
        # (over 22 / 23 mantissa bits the threshold is not an integer: its floor, as the
        # significand is one)
        case 2:  # midmax
            return (2 * e.maxm + 1) << (22 - m) if m <= 22 else (2 * e.maxm + 1) >> (m - 22)
        case 3:  # topbinade / rceil
            return e.maxm << (23 - m) if m <= 23 else e.maxm >> (m - 23)
        case 4:  # option3 / even: rounding to mbits+1 bits carries into the next binade
            return (1 << 24) - (1 << (22 - m)) - 1 if m < 23 else never
    return never
