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
candidate. A virtual cast's values are the chosen codes decoded by the kernel in the input's
type (its rounding and canonical NaN).

Codebooks run the codebook kernel once per candidate (`triton_codebook.quantize`'s
``scale_step``) and each unit (subtile, else tile) keeps the mapping its tile's winner chose.
Their NaN tiles do depend on the choice: the reference scores a tile before marking it, so the
winner's mapping is the meta the NaN tile keeps. The trials leave NaN tiles unmarked
(``mark_nan_tiles=False``), the choice scores their finite values, and `_mark_nan_tiles`
marks them afterwards (code 0, the NaN scale code).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from onnxq.cast import triton as tk
from onnxq.cast import triton_codebook as tcb
from onnxq.cast.layout import Tiling
from onnxq.cast.scale_search import STEPS, tile_sq_error
from onnxq.cast.triton_bits import _signed
from onnxq.cast.triton_tiles import _from_tile_rows, _rows_grid, _to_tile_rows
from onnxq.formats.datatype import DataType
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode

__all__ = ["quantize"]

_FORCE_EXACT = False  # tests: score every tile with the reference's ordered sums


def _choose(ys: list[torch.Tensor], x: torch.Tensor, g: Tiling) -> torch.Tensor:
    """The winning candidate's index per tile (int64), as the reference's ordered sums pick."""
    n = g.tile_elems
    xt = _to_tile_rows(x, g, subtiles=False)  # the reference's order (layout.py `to_tiles`)
    yts = [_to_tile_rows(y, g, subtiles=False) for y in ys]
    finite_x = torch.isfinite(xt)
    errs = []
    for yt in yts:
        d = torch.where(finite_x, yt.double() - xt.double(), 0.0)
        errs.append((d * d).sum(dim=1))  # float64, in torch's order
    margin = n * 2.0**-50
    unsure = torch.zeros_like(errs[0], dtype=torch.bool)
    for a in range(len(ys)):
        for b in range(a + 1, len(ys)):
            ea, eb = errs[a], errs[b]
            same = (yts[a].view(torch.int32) == yts[b].view(torch.int32)).all(dim=1)
            apart = (ea - eb).abs() > torch.maximum(ea, eb) * margin
            finite = torch.isfinite(ea) & torch.isfinite(eb)  # NaN: a NaN tile, moot
            unsure |= finite & ~same & (~apart | _FORCE_EXACT)
    if bool(unsure.any()):
        # near-ties: the reference's own left-to-right float64 sums, on the host
        pick = unsure.nonzero().reshape(-1)
        x_near = xt[pick].cpu().numpy()
        for k, yt in enumerate(yts):
            exact = tile_sq_error(yt[pick].cpu().numpy(), x_near)
            errs[k][pick] = torch.from_numpy(np.ascontiguousarray(exact)).to(errs[k].device)
    best = errs[0]
    choice = torch.zeros_like(best, dtype=torch.int64)
    for k in range(1, len(ys)):
        better = errs[k] < best  # strictly: ties keep the earlier candidate
        best = torch.where(better, errs[k], best)
        choice = torch.where(better, k, choice)
    return choice


def _per_subtile(per_elem: torch.Tensor, g: Tiling) -> torch.Tensor:
    """An element map's value at each subtile's first element, in layout.py's `sub_grid`."""
    rows, cols = g.sub_counts
    m = per_elem.movedim(g.axis, -1).reshape(g.B, g.R, g.C)[:, :: g.Sr, :: g.Sc]
    lead = g.moved_shape[:-1] if g.kind == "1d" else (*g.moved_shape[:-2], rows)
    return m.reshape(*lead, cols).movedim(-1, g.axis).contiguous()


def _decode(
    dt: DataType,
    shape: tuple[int, ...],
    axis: int,
    fields: dict[str, Any],
    out_dtype: torch.dtype,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """Values of a trial's (or the pick's) codes, decoded by the engine's kernel."""
    engine = tcb if dt.nspec.is_codebook else tk
    codes, scale, meta = fields["codes"], fields.get("scale"), fields.get("meta")
    tenscale = fields.get("tenscale")
    return engine.dequantize(dt, shape, axis, codes, scale, tenscale, meta, out_dtype, mask=mask)


def _pick(
    trials: list[dict[str, Any]], choice: torch.Tensor, g: Tiling, book: bool
) -> dict[str, Any]:
    """Codes, scales and (codebooks) each unit's mapping from its tile's winning candidate.

    Other meta (MX shift bits), the tensor scale and the N:M mask do not depend on the scale:
    the first candidate's.
    """
    first = trials[0]
    per_elem = _from_tile_rows(choice[:, None].expand(-1, g.tile_elems), g, subtiles=False)
    per_tile = _rows_grid(choice, g)
    per_unit = (_per_subtile(per_elem, g) if g.Sc else per_tile) if book else None
    # signed views: torch's uint16 / uint32 lack CUDA ops
    codes, scale, meta = _signed(first["codes"]), _signed(first["scale"]), first.get("meta")
    for k in range(1, len(trials)):
        codes = torch.where(per_elem == k, _signed(trials[k]["codes"]), codes)
        scale = torch.where(per_tile == k, _signed(trials[k]["scale"]), scale)
        if book:
            meta = torch.where(per_unit == k, trials[k]["meta"], meta)
    out: dict[str, Any] = {k: v for k, v in first.items() if k in ("tenscale", "mask")}
    if meta is not None:
        out["meta"] = meta
    out["codes"] = codes.view(first["codes"].dtype)
    out["scale"] = scale.view(first["scale"].dtype)
    return out


def _mark_nan_tiles(
    out: dict[str, Any], xf: torch.Tensor, g: Tiling, dt: DataType, nan_policy: NanPolicy
) -> None:
    """A codebook's NaN tiles after the choice: code 0, the NaN scale code (the reference).

    Codebooks have no NaN code: a NaN (block policy: any NaN or Inf) marks its tile. The
    trials left them unmarked, so that the choice (and its mapping) scored their values.
    """
    xt = _to_tile_rows(xf, g, subtiles=False)
    bad = ~torch.isfinite(xt) if nan_policy is NanPolicy.BLOCK else torch.isnan(xt)
    nan_tile = bad.any(dim=1)
    if not bool(nan_tile.any()):
        return
    per_elem = _from_tile_rows(nan_tile[:, None].expand(-1, g.tile_elems), g, subtiles=False)
    out["codes"] = out["codes"].masked_fill(per_elem, 0)
    assert dt.sspec is not None
    nan_code = (1 << dt.sspec.scale.ebits) - 1
    scale = _signed(out["scale"]).masked_fill(_rows_grid(nan_tile, g), nan_code)
    out["scale"] = scale.view(out["scale"].dtype)


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
    """`triton.quantize` (`triton_codebook.quantize` for codebooks) with scale mode ``search``.

    ``scale_mode`` is accepted for the engines' common signature: it is ``search``.

    Zero-point formats keep their min/max rule and unscaled casts have no scale, as in the
    reference: they are cast once with the floor rule.

    Returns:
        The dict the engine's quantize returns (values of the input dtype when asked).
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
    book = dt.nspec.is_codebook
    engine, unmarked = (tcb, {"mark_nan_tiles": False}) if book else (tk, {})
    shape = tuple(x.shape)
    g = Tiling.build(shape, axis, dt.sspec)
    trials = [
        engine.quantize(
            x,
            dt,
            scale_mode=ScaleMode.FLOOR,
            want_values=False,
            want_codes=True,
            scale_step=step,
            **unmarked,
            **kw,
        )
        for step in STEPS
    ]
    mask = trials[0].get("mask")
    xf = x.float()
    if mask is not None:  # the reference scores the pruned input
        xf = xf.masked_fill(~mask, 0)
    ys = [_decode(dt, shape, axis, t, torch.float32, mask) for t in trials]
    out = _pick(trials, _choose(ys, xf, g), g, book)
    if book:
        _mark_nan_tiles(out, xf, g, dt, nan_policy)
    if want_values:
        # decoded by the kernel in the input's type: its rounding and canonical NaN, as a
        # virtual cast's values are the decoded codes (upcast of actual == virtual)
        out["values"] = _decode(dt, shape, axis, out, x.dtype, mask)
    if not want_codes:
        return {k: v for k, v in out.items() if k in ("values", "mask")}
    return out
