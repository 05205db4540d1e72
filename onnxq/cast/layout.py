"""Where tiles lie: moving the tile axis, padding, and the tile/subtile views (numpy).

Every backend uses the same geometry. The axis named by ``axis`` is moved last; the moved
array is seen as ``(B, R, C)``:

- tensor scale: ``B = R = 1``, ``C`` = all elements, one tile;
- 1-D tiles: ``B = 1``, ``R`` = all other elements, ``C`` = the axis, tiles of ``(1, T)``;
- 2-D tiles: ``B`` = the leading dims, ``(R, C)`` = the last two dims, tiles of ``(Tr, Tc)``.

``R`` and ``C`` are padded with zeros to whole tiles (docs/architecture.md, decision 7); the
padding is never stored. Per-tile and per-subtile arrays are returned to users in "grid" layout: the
input's axis order with the tiled dims replaced by tile (or subtile) counts.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from onnxq.formats.scale import ScaleSpec

__all__ = ["Tiling"]


@dataclasses.dataclass(frozen=True)
class Tiling:
    """The tile geometry of one tensor shape under one scale spec and axis."""

    shape: tuple[int, ...]
    axis: int
    B: int
    R: int
    C: int
    Tr: int
    Tc: int
    Sr: int  # subtile rows (0 = no subtiles)
    Sc: int
    kind: str  # "tensor", "1d" or "2d"

    @classmethod
    def build(cls, shape: tuple[int, ...], axis: int, sspec: ScaleSpec | None) -> Tiling:
        """Compute the geometry.

        Raises:
            ValueError: ``axis`` out of range, or 2-D tiles on a 1-D tensor.
        """
        ndim = len(shape)
        if not -ndim <= axis < ndim:
            raise ValueError(f"axis {axis} is out of range for a {ndim}-D tensor of shape {shape}")
        axis %= ndim
        moved = shape[:axis] + shape[axis + 1 :] + (shape[axis],)
        size = math.prod(shape)
        if sspec is None or sspec.is_tensor:
            return cls(shape, axis, 1, 1, size, 1, size, 0, 0, "tensor")
        if len(sspec.tiles) == 1:
            tile = sspec.tiles[0]
            C = moved[-1]
            Tc = tile.size or C
            Sc = tile.subtile
            return cls(shape, axis, 1, size // C if C else 0, C, 1, Tc, 1 if Sc else 0, Sc, "1d")
        if ndim < 2:
            raise ValueError(
                f"2-D tiles {sspec.name!r} need a tensor of at least 2 dims, got shape {shape}"
            )
        rows, cols = sspec.tiles
        R, C = moved[-2], moved[-1]
        Tr, Tc = rows.size or R, cols.size or C
        Sr, Sc = sspec.subtile
        return cls(shape, axis, math.prod(moved[:-2]), R, C, Tr, Tc, Sr, Sc, "2d")

    # -- derived sizes ------------------------------------------------------------------
    @property
    def moved_shape(self) -> tuple[int, ...]:
        """The input shape with the axis moved last."""
        s, a = self.shape, self.axis
        return s[:a] + s[a + 1 :] + (s[a],)

    @property
    def nR(self) -> int:
        """Tile rows."""
        return -(-self.R // self.Tr)

    @property
    def nC(self) -> int:
        """Tile columns."""
        return -(-self.C // self.Tc)

    @property
    def tile_elems(self) -> int:
        """Elements per (padded) tile."""
        return self.Tr * self.Tc

    @property
    def n_sub(self) -> int:
        """Subtiles per tile."""
        return (self.Tr // self.Sr) * (self.Tc // self.Sc) if self.Sc else 0

    # -- element arrays -----------------------------------------------------------------
    def to_tiles(self, x: np.ndarray) -> np.ndarray:
        """Input-shaped array -> ``(B, nR, nC, Tr*Tc)``, zero padded."""
        m = np.moveaxis(x, self.axis, -1).reshape(self.B, self.R, self.C)
        pad_r, pad_c = self.nR * self.Tr - self.R, self.nC * self.Tc - self.C
        if pad_r or pad_c:
            m = np.pad(m, ((0, 0), (0, pad_r), (0, pad_c)))
        t = m.reshape(self.B, self.nR, self.Tr, self.nC, self.Tc)
        if self.Tr > 1:
            t = t.transpose(0, 1, 3, 2, 4)
        return t.reshape(self.B, self.nR, self.nC, self.Tr * self.Tc)

    def from_tiles(self, t: np.ndarray) -> np.ndarray:
        """Inverse of `to_tiles` (drops the padding)."""
        t = t.reshape(self.B, self.nR, self.nC, self.Tr, self.Tc)
        if self.Tr > 1:
            t = t.transpose(0, 1, 3, 2, 4)
        m = t.reshape(self.B, self.nR * self.Tr, self.nC * self.Tc)[:, : self.R, : self.C]
        return np.moveaxis(m.reshape(self.moved_shape), -1, self.axis)

    def to_subtiles(self, t: np.ndarray) -> np.ndarray:
        """``(B, nR, nC, Tr*Tc)`` -> ``(B, nR, nC, n_sub, Sr*Sc)``."""
        s = t.reshape(
            self.B, self.nR, self.nC, self.Tr // self.Sr, self.Sr, self.Tc // self.Sc, self.Sc
        )
        s = s.transpose(0, 1, 2, 3, 5, 4, 6)
        return s.reshape(self.B, self.nR, self.nC, self.n_sub, self.Sr * self.Sc)

    def from_subtiles(self, s: np.ndarray) -> np.ndarray:
        """Inverse of `to_subtiles`."""
        s = s.reshape(
            self.B, self.nR, self.nC, self.Tr // self.Sr, self.Tc // self.Sc, self.Sr, self.Sc
        )
        return s.transpose(0, 1, 2, 3, 5, 4, 6).reshape(self.B, self.nR, self.nC, self.Tr * self.Tc)

    # -- per-tile and per-subtile arrays in grid layout -------------------------------------
    def _grid_shape(self, rows: int, cols: int) -> tuple[int, ...]:
        moved = self.moved_shape
        if self.kind == "tensor":
            return (1,)
        if self.kind == "1d":
            return (*moved[:-1], cols)
        return (*moved[:-2], rows, cols)

    def tile_grid(self, per_tile: np.ndarray) -> np.ndarray:
        """``(B, nR, nC)`` -> grid layout (input axis order, tiled dims = tile counts)."""
        g = per_tile.reshape(self._grid_shape(self.nR, self.nC))
        return g if self.kind == "tensor" else np.moveaxis(g, -1, self.axis)

    def tile_ungrid(self, grid: np.ndarray) -> np.ndarray:
        """Inverse of `tile_grid`.

        Raises:
            ValueError: ``grid`` has the wrong number of entries.
        """
        g = grid if self.kind == "tensor" else np.moveaxis(grid, self.axis, -1)
        if g.size != self.B * self.nR * self.nC:
            raise ValueError(
                f"scale has {g.size} entries; shape {self.shape} with tiles "
                f"{self.Tr}x{self.Tc} on axis {self.axis} needs {self.B * self.nR * self.nC}"
            )
        return g.reshape(self.B, self.nR, self.nC)

    @property
    def sub_counts(self) -> tuple[int, int]:
        """Subtile rows and columns that hold real elements."""
        return (-(-self.R // self.Sr), -(-self.C // self.Sc))

    def sub_grid(self, per_sub: np.ndarray) -> np.ndarray:
        """``(B, nR, nC, n_sub)`` -> grid layout of subtiles, padding-only subtiles dropped."""
        tr, tc = self.Tr // self.Sr, self.Tc // self.Sc
        s = per_sub.reshape(self.B, self.nR, self.nC, tr, tc).transpose(0, 1, 3, 2, 4)
        s = s.reshape(self.B, self.nR * tr, self.nC * tc)
        rows, cols = self.sub_counts
        s = s[:, :rows, :cols]
        return np.moveaxis(s.reshape(self._grid_shape(rows, cols)), -1, self.axis)

    def sub_ungrid(self, grid: np.ndarray) -> np.ndarray:
        """Inverse of `sub_grid` (dropped subtiles come back as 0).

        Raises:
            ValueError: ``grid`` has the wrong number of entries.
        """
        rows, cols = self.sub_counts
        g = np.moveaxis(grid, self.axis, -1)
        if g.size != self.B * rows * cols:
            raise ValueError(
                f"meta has {g.size} entries; shape {self.shape} needs {self.B * rows * cols}"
            )
        g = g.reshape(self.B, rows, cols)
        tr, tc = self.Tr // self.Sr, self.Tc // self.Sc
        full = np.zeros((self.B, self.nR * tr, self.nC * tc), dtype=g.dtype)
        full[:, :rows, :cols] = g
        s = full.reshape(self.B, self.nR, tr, self.nC, tc).transpose(0, 1, 3, 2, 4)
        return s.reshape(self.B, self.nR, self.nC, tr * tc)
