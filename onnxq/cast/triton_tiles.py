"""Host-side tile work of the Triton engines: 2-D tiles as rows, grids, N:M pruning.

The kernels see 2-D tiles as the rows of a padded copy holding one tile per row (subtiles
contiguous); these put tensors into that order and back into layout.py's grids. `prune` (the
reference's `_prune`) runs before either engine's quantize kernel.
"""

from __future__ import annotations

import math

import torch
import triton

from onnxq.cast.layout import Tiling
from onnxq.cast.triton_bits import _int_view
from onnxq.cast.triton_kernels import _prune_kernel
from onnxq.cast.triton_plan import _grid_2d, _Plan


def _to_tile_rows(x: torch.Tensor, t: Tiling, subtiles: bool = True) -> torch.Tensor:
    """Tiles as rows ``(B*nR*nC, Tr*Tc)``, zero padded, subtiles contiguous.

    The order of layout.py's `to_tiles` then `to_subtiles`; with ``subtiles=False`` that of
    `to_tiles` alone (row by row within a tile: the order of the search's error sums).
    """
    m = x.movedim(t.axis, -1).reshape(t.B, t.R, t.C)
    m = torch.nn.functional.pad(m, (0, t.nC * t.Tc - t.C, 0, t.nR * t.Tr - t.R))
    sr, sc = (t.Sr, t.Sc) if t.Sc and subtiles else (t.Tr, t.Tc)
    m = m.reshape(t.B, t.nR, t.Tr // sr, sr, t.nC, t.Tc // sc, sc)
    return m.permute(0, 1, 4, 2, 5, 3, 6).reshape(-1, t.tile_elems).contiguous()


def _from_tile_rows(r: torch.Tensor, t: Tiling, subtiles: bool = True) -> torch.Tensor:
    """Inverse of `_to_tile_rows` (drops the padding)."""
    sr, sc = (t.Sr, t.Sc) if t.Sc and subtiles else (t.Tr, t.Tc)
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


def _rows_grid(per_tile: torch.Tensor, t: Tiling) -> torch.Tensor:
    """Per-tile values in row order (`_to_tile_rows`: B, nR, nC) -> layout.py `tile_grid`."""
    if t.kind == "tensor":
        return per_tile.reshape(1)
    lead = t.moved_shape[:-1] if t.kind == "1d" else (*t.moved_shape[:-2], t.nR)
    return per_tile.reshape(*lead, t.nC).movedim(-1, t.axis).contiguous()


def _rows_ungrid(grid: torch.Tensor, t: Tiling) -> torch.Tensor:
    """Inverse of `_rows_grid`, flat."""
    return grid.reshape(_grid_2d(t, t.nR, t.nC)).movedim(t.axis, -1).reshape(-1)


def _tile_grid(per_tile: torch.Tensor, p: _Plan) -> torch.Tensor:
    """Per-tile codes in instance order -> the scale grid (layout.py `tile_grid`)."""
    if p.rows:
        return _rows_grid(per_tile, p.tiling)
    return per_tile.reshape(p.grid_shape)


def _tile_ungrid(grid: torch.Tensor, p: _Plan) -> torch.Tensor:
    """Inverse of `_tile_grid`, flat."""
    if p.rows:
        return _rows_ungrid(grid, p.tiling)
    return grid.reshape(-1)


# -- N:M sparsity ----------------------------------------------------------------------------
def _sparse_dim(t: Tiling, index: int) -> int:
    """The input dim that N:M groups run along (reference `_prune`).

    The tiled axis, or for sparsity on the first of 2-D tiles the row dim of (B, R, C).
    """
    if t.kind == "2d" and index == 0:
        ndim = len(t.shape)
        return ndim - 2 if t.axis == ndim - 1 else ndim - 1
    return t.axis


def prune(
    x: torch.Tensor, t: Tiling, sparsity: tuple[int, int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """N:M-pruned copy of contiguous ``x`` and the keep mask (bool, input shape).

    ``sparsity`` is the scale spec's (N, M, tile index).
    """
    n_keep, m, index = sparsity
    d = _sparse_dim(t, index)
    shape = tuple(x.shape)
    L, inner = shape[d], math.prod(shape[d + 1 :])
    ng_l = -(-L // m)
    n_groups = math.prod(shape[:d]) * ng_l * inner
    bg = max(1, 2048 // (m * m))
    y = torch.empty_like(x)
    mask = torch.empty(shape, dtype=torch.uint8, device=x.device)
    _prune_kernel[(triton.cdiv(n_groups, bg),)](
        _int_view(x),
        _int_view(y),
        mask,
        n_groups,
        L,
        inner,
        ng_l,
        n_keep,
        int(x.dtype == torch.bfloat16),
        HALF=x.dtype != torch.float32,
        M=m,
        BG=bg,
    )
    return y, mask.view(torch.bool)
