"""Host-side tile reshaping of the Triton engine: 2-D tiles as rows, scale and shift-bit grids.

The kernels see 2-D tiles as the rows of a padded copy holding one tile per row (subtiles
contiguous); these put tensors into that order and back into layout.py's grids.
"""

from __future__ import annotations

import torch

from onnxq.cast.layout import Tiling
from onnxq.cast.triton_plan import _grid_2d, _Plan


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
