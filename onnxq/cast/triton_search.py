"""Scale mode ``search`` on the Triton engine: the reference's per-tile candidate search.

Each candidate of `scale_search.STEPS` (the floor scale, one scale code up, one down) is one
pass of the general quantize kernel (its ``s_step`` argument), decoded to float32 by the
dequantize kernel: the reference scores ``decode(q) * scale`` rounded to float32, the same
product. A tile's score is the sum of ``(y - x)^2`` over its finite inputs, in float64, and a
later candidate wins a tile only with a strictly smaller score (reference `_searched`).

The reference adds a tile's squares left to right; torch adds them in its own order. Both sums
are within ``(n - 1) * 2^-53`` (relative) of the exact one, so a tile is decided here when the
candidates' sums differ by more than ``n * 2^-50`` of the larger, or when two candidates
decode the tile identically (the same terms: equal sums in any order, a tie). Other tiles
(near-ties, rare) are scored again with the reference's own `tile_sq_error` on the host.

A tile marked NaN (NaN policy) decodes to NaN under every candidate and its outputs (NaN
values, code 0, the NaN scale code) do not depend on the choice; shift bits (MX9/6/4), the
tensor scale and the N:M mask do not depend on the scale either, so they come from the first
candidate. Codebooks are not searched here (`backends.triton_gap` sends them to the CPU).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from onnxq.cast import triton as tk
from onnxq.cast.layout import Tiling
from onnxq.cast.scale_search import STEPS, tile_sq_error
from onnxq.cast.triton_bits import _signed
from onnxq.formats.datatype import DataType
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode

__all__ = ["quantize"]

_FORCE_EXACT = False  # tests: score every tile with the reference's ordered sums


def _tiles(t: torch.Tensor, g: Tiling) -> torch.Tensor:
    """layout.py `to_tiles` on a torch tensor, as ``(tiles, elements)``, zero padded."""
    m = t.movedim(g.axis, -1).reshape(g.B, g.R, g.C)
    m = torch.nn.functional.pad(m, (0, g.nC * g.Tc - g.C, 0, g.nR * g.Tr - g.R))
    m = m.reshape(g.B, g.nR, g.Tr, g.nC, g.Tc)
    if g.Tr > 1:
        m = m.permute(0, 1, 3, 2, 4)
    return m.reshape(g.B * g.nR * g.nC, g.Tr * g.Tc)


def _untiles(t: torch.Tensor, g: Tiling) -> torch.Tensor:
    """Inverse of `_tiles` (drops the padding)."""
    m = t.reshape(g.B, g.nR, g.nC, g.Tr, g.Tc)
    if g.Tr > 1:
        m = m.permute(0, 1, 3, 2, 4)
    m = m.reshape(g.B, g.nR * g.Tr, g.nC * g.Tc)[:, : g.R, : g.C]
    return m.reshape(g.moved_shape).movedim(-1, g.axis).contiguous()


def _grid(per_tile: torch.Tensor, g: Tiling) -> torch.Tensor:
    """layout.py `tile_grid` on a torch tensor."""
    if g.kind == "tensor":
        return per_tile.reshape(1)
    rows = () if g.kind == "1d" else (g.nR,)
    lead = g.moved_shape[:-1] if g.kind == "1d" else g.moved_shape[:-2]
    return per_tile.reshape(*lead, *rows, g.nC).movedim(-1, g.axis).contiguous()


# The canonical quiet NaN of each narrow type (the reference's float32 NaN, rounded by
# ml_dtypes / numpy); torch's own conversion gives other payloads (0xFFFF on the CPU).
_NAN_BITS = {torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}


def _narrow(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Float32 values as ``dtype`` (round-half-even), NaN as the canonical NaN."""
    if dtype == torch.float32:
        return y
    bits = y.to(dtype).view(torch.int16)
    return bits.masked_fill_(torch.isnan(y), _NAN_BITS[dtype]).view(dtype)


def _scores(y: torch.Tensor, x: torch.Tensor, g: Tiling) -> torch.Tensor:
    """Per-tile squared error in float64, summed in torch's order."""
    x64, y64 = _tiles(x, g).double(), _tiles(y, g).double()
    d = torch.where(torch.isfinite(x64), y64 - x64, torch.zeros_like(x64))
    return (d * d).sum(dim=1)


def _choose(ys: list[torch.Tensor], x: torch.Tensor, g: Tiling) -> torch.Tensor:
    """The winning candidate's index per tile (int64), as the reference's ordered sums pick."""
    n = g.Tr * g.Tc
    errs = [_scores(y, x, g) for y in ys]
    bits = [_tiles(y, g).view(torch.int32) for y in ys]
    margin = n * 2.0**-50
    unsure = torch.zeros_like(errs[0], dtype=torch.bool)
    for a in range(len(ys)):
        for b in range(a + 1, len(ys)):
            ea, eb = errs[a], errs[b]
            same = (bits[a] == bits[b]).all(dim=1)
            apart = (ea - eb).abs() > torch.maximum(ea, eb) * margin
            finite = torch.isfinite(ea) & torch.isfinite(eb)  # NaN: a NaN tile, moot
            unsure |= finite & ~same & (~apart | _FORCE_EXACT)
    if bool(unsure.any()):
        # near-ties: the reference's own left-to-right float64 sums, on the host
        pick = unsure.nonzero().reshape(-1)
        xt = _tiles(x, g)[pick].cpu().numpy()
        for k, y in enumerate(ys):
            exact = tile_sq_error(_tiles(y, g)[pick].cpu().numpy(), xt)
            errs[k] = errs[k].clone()
            errs[k][pick] = torch.from_numpy(np.ascontiguousarray(exact)).to(errs[k].device)
    best = errs[0]
    choice = torch.zeros_like(best, dtype=torch.int64)
    for k in range(1, len(ys)):
        better = errs[k] < best  # strictly: ties keep the earlier candidate
        best = torch.where(better, errs[k], best)
        choice = torch.where(better, k, choice)
    return choice


def quantize(
    x: torch.Tensor,
    dt: DataType,
    *,
    axis: int,
    round_mode: RoundMode,
    scale_mode: ScaleMode = ScaleMode.SEARCH,
    nan_policy: NanPolicy,
    seed: int,
    full_int_range: bool,
    want_values: bool,
    want_codes: bool,
) -> dict[str, Any]:
    """`triton.quantize` with scale mode ``search`` (not for codebooks).

    ``scale_mode`` is accepted for the engines' common signature: it is ``search``.

    Zero-point formats keep their min/max rule and unscaled casts have no scale, as in the
    reference: they are cast once with the floor rule.

    Returns:
        The dict `triton.quantize` returns (values of the input dtype when asked).
    """
    kw = dict(
        axis=axis,
        round_mode=round_mode,
        nan_policy=nan_policy,
        seed=seed,
        full_int_range=full_int_range,
    )
    if dt.sspec is None or dt.sspec.family == "zero":
        return tk.quantize(
            x, dt, scale_mode=ScaleMode.FLOOR, want_values=want_values, want_codes=want_codes, **kw
        )
    shape = tuple(x.shape)
    g = Tiling.build(shape, axis, dt.sspec)
    trials = []
    for step in STEPS:
        trials.append(
            tk.quantize(
                x,
                dt,
                scale_mode=ScaleMode.FLOOR,
                want_values=False,
                want_codes=True,
                scale_step=step,
                **kw,
            )
        )
    first = trials[0]
    mask = first.get("mask")
    xf = x.float()
    if mask is not None:  # the reference scores the pruned input
        xf = xf.masked_fill(~mask, 0)
    ys = [
        tk.dequantize(
            dt,
            shape,
            axis,
            t["codes"],
            t.get("scale"),
            t.get("tenscale"),
            t.get("meta"),
            torch.float32,
            mask=mask,
        )
        for t in trials
    ]
    choice = _choose(ys, xf, g)
    per_elem = _untiles(choice[:, None].expand(-1, g.Tr * g.Tc), g)
    per_tile = _grid(choice, g)
    out: dict[str, Any] = {k: v for k, v in first.items() if k in ("meta", "tenscale", "mask")}
    if want_values:
        y = ys[0]
        for k in range(1, len(ys)):
            y = torch.where(per_elem == k, ys[k], y)
        out["values"] = _narrow(y, x.dtype)
    if not want_codes:
        return {k: v for k, v in out.items() if k in ("values", "mask")}
    # signed views: torch's uint16 / uint32 lack CUDA ops
    codes, scale = _signed(first["codes"]), _signed(first["scale"])
    for k in range(1, len(trials)):
        codes = torch.where(per_elem == k, _signed(trials[k]["codes"]), codes)
        scale = torch.where(per_tile == k, _signed(trials[k]["scale"]), scale)
    out["codes"] = codes.view(first["codes"].dtype)
    out["scale"] = scale.view(first["scale"].dtype)
    return out
