"""Tile geometry (onnxq.cast.layout.Tiling): sizes, tile and subtile views, grid layout.

Every expected value is worked by hand in the comment beside it, from the module's rules:
the tiled axis is moved last and the moved array is seen as ``(B, R, C)``; tensor scale
``B = R = 1``; 1-D tiles ``B = 1``, ``R`` = the other elements, tiles ``(1, T)``; 2-D tiles
``B`` = the leading dims, ``(R, C)`` = the last two, tiles ``(Tr, Tc)``. ``R`` and ``C`` are
zero-padded to whole tiles; a tile's elements are listed row by row; subtiles are listed row
of subtiles by row, each subtile's elements row by row. Per-tile arrays come back in "grid"
layout: the input's axis order with the tiled dims replaced by tile counts.
"""

from __future__ import annotations

import numpy as np
import pytest

from onnxq.cast.layout import Tiling
from onnxq.formats.scale import scale


def _tiling(shape: tuple[int, ...], axis: int, code: str | None) -> Tiling:
    return Tiling.build(shape, axis, None if code is None else scale(code))


def _fields(t: Tiling) -> tuple:
    return (t.axis, t.B, t.R, t.C, t.Tr, t.Tc, t.Sr, t.Sc, t.kind)


# -- build: the geometry ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shape", "axis", "code", "want"),
    [
        # no scale spec, or a tensor scale: one tile of all 3*5 = 15 elements
        ((3, 5), -1, None, (1, 1, 1, 15, 1, 15, 0, 0, "tensor")),
        ((3, 5), 0, "e8m0", (0, 1, 1, 15, 1, 15, 0, 0, "tensor")),
        # 1-D t4 on the last axis of (2, 6): R = 12 / 6 = 2 rows, C = 6, tiles (1, 4)
        ((2, 6), -1, "e8m0_t4", (1, 1, 2, 6, 1, 4, 0, 0, "1d")),
        # on axis 0 of (6, 2): moved shape (2, 6), the same R and C
        ((6, 2), 0, "e8m0_t4", (0, 1, 2, 6, 1, 4, 0, 0, "1d")),
        # channel tile t0: the tile is the whole axis, Tc = C = 5; axis -2 of (3, 5) is axis 0,
        # moved shape (5, 3): R = 5, C = Tc = 3
        ((3, 5), -1, "e8m0_t0", (1, 1, 3, 5, 1, 5, 0, 0, "1d")),
        ((3, 5), -2, "e8m0_t0", (0, 1, 5, 3, 1, 3, 0, 0, "1d")),
        # 1-D subtiles t8s2: a subtile is one row of 2 elements (Sr = 1, Sc = 2)
        ((2, 10), -1, "e8m0_t8s2", (1, 1, 2, 10, 1, 8, 1, 2, "1d")),
        # 2-D t2_t2 on (2, 3, 4): B = 2 leading, (R, C) = (3, 4), tiles (2, 2)
        ((2, 3, 4), -1, "e8m0_t2_t2", (2, 2, 3, 4, 2, 2, 0, 0, "2d")),
        # 2-D on axis 0 of (6, 3): moved shape (3, 6), so R = 3 (input dim 1), C = 6 (dim 0)
        ((6, 3), 0, "e8m0_t2_t2", (0, 1, 3, 6, 2, 2, 0, 0, "2d")),
        # a channel row tile t0_t4: Tr = R = 3 (all rows), Tc = 4
        ((3, 8), -1, "e8m0_t0_t4", (1, 1, 3, 8, 3, 4, 0, 0, "2d")),
        # 2-D subtiles t4s2_t4s2: subtiles of (2, 2)
        ((4, 4), -1, "e8m0_t4s2_t4s2", (1, 1, 4, 4, 4, 4, 2, 2, "2d")),
    ],
)
def test_build_gives_the_geometry(shape, axis, code, want) -> None:
    assert _fields(_tiling(shape, axis, code)) == want


def test_derived_sizes() -> None:
    # (2, 6) in t4: nR = 2 rows, nC = ceil(6 / 4) = 2, 1 * 4 = 4 elements a tile, no subtiles
    t = _tiling((2, 6), -1, "e8m0_t4")
    assert (t.nR, t.nC, t.tile_elems, t.n_sub) == (2, 2, 4, 0)
    # (2, 3, 4) in t2_t2: nR = ceil(3 / 2) = 2, nC = 4 / 2 = 2, 2 * 2 = 4 elements a tile
    t = _tiling((2, 3, 4), -1, "e8m0_t2_t2")
    assert (t.nR, t.nC, t.tile_elems) == (2, 2, 4)
    # t8s2: 8 / 2 = 4 subtiles a tile; t4s2_t4s2: (4 / 2) * (4 / 2) = 4
    assert _tiling((2, 10), -1, "e8m0_t8s2").n_sub == 4
    assert _tiling((4, 4), -1, "e8m0_t4s2_t4s2").n_sub == 4
    # the axis moved last: (6, 2, 5) on axis 0 -> (2, 5, 6)
    assert _tiling((6, 2, 5), 0, "e8m0_t4").moved_shape == (2, 5, 6)


@pytest.mark.parametrize("axis", [2, -3])
def test_an_axis_out_of_range_is_refused(axis: int) -> None:
    with pytest.raises(ValueError, match=rf"axis {axis} is out of range for a 2-D tensor"):
        _tiling((3, 4), axis, "e8m0_t4")


def test_2d_tiles_on_a_1d_tensor_are_refused() -> None:
    with pytest.raises(ValueError, match="need a tensor of at least 2 dims, got shape"):
        _tiling((8,), 0, "e8m0_t2_t2")


# -- element views ------------------------------------------------------------------------------
def test_tensor_scale_is_one_tile_in_moved_order() -> None:
    x = np.arange(6).reshape(2, 3)
    # axis 1 is already last: the tile is x row by row
    assert _tiling((2, 3), 1, "e8m0").to_tiles(x).tolist() == [[[[0, 1, 2, 3, 4, 5]]]]
    # axis 0 moved last: x.T = [[0, 3], [1, 4], [2, 5]] row by row
    assert _tiling((2, 3), 0, "e8m0").to_tiles(x).tolist() == [[[[0, 3, 1, 4, 2, 5]]]]


def test_1d_tiles_on_the_last_axis_pad_the_last_tile() -> None:
    x = np.arange(12).reshape(2, 6)
    t = _tiling((2, 6), -1, "e8m0_t4")
    # rows [0..5] and [6..11], padded to 8 columns, cut into tiles of 4
    assert t.to_tiles(x).tolist() == [
        [[[0, 1, 2, 3], [4, 5, 0, 0]], [[6, 7, 8, 9], [10, 11, 0, 0]]]
    ]
    assert t.from_tiles(t.to_tiles(x)).tolist() == x.tolist()


def test_1d_tiles_on_axis_0_run_down_the_columns() -> None:
    x = np.arange(12).reshape(6, 2)
    t = _tiling((6, 2), 0, "e8m0_t4")
    # moved rows are the columns of x: [0, 2, 4, 6, 8, 10] and [1, 3, 5, 7, 9, 11]
    assert t.to_tiles(x).tolist() == [
        [[[0, 2, 4, 6], [8, 10, 0, 0]], [[1, 3, 5, 7], [9, 11, 0, 0]]]
    ]
    assert t.from_tiles(t.to_tiles(x)).tolist() == x.tolist()


def test_channel_tiles_are_whole_rows() -> None:
    x = np.arange(6).reshape(2, 3)
    # t0 on the last axis: one tile per row, no padding
    assert _tiling((2, 3), -1, "e8m0_t0").to_tiles(x).tolist() == [[[[0, 1, 2]], [[3, 4, 5]]]]
    # on axis 0: one tile per column, [0, 3], [1, 4], [2, 5]
    assert _tiling((2, 3), 0, "e8m0_t0").to_tiles(x).tolist() == [[[[0, 3]], [[1, 4]], [[2, 5]]]]


def test_2d_tiles_list_each_tile_row_by_row() -> None:
    x = np.arange(12).reshape(3, 4)
    t = _tiling((3, 4), -1, "e8m0_t2_t2")
    # x = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]] padded with a row of zeros; tile (0, 0)
    # holds rows 0-1, cols 0-1 = [0, 1, 4, 5]; (0, 1) = [2, 3, 6, 7]; (1, 0) = [8, 9, 0, 0]
    # (row 3 is padding); (1, 1) = [10, 11, 0, 0]
    assert t.to_tiles(x).tolist() == [
        [[[0, 1, 4, 5], [2, 3, 6, 7]], [[8, 9, 0, 0], [10, 11, 0, 0]]]
    ]
    assert t.from_tiles(t.to_tiles(x)).tolist() == x.tolist()


def test_2d_tiles_with_a_leading_dim_tile_each_matrix() -> None:
    x = np.arange(8).reshape(2, 2, 2)
    # B = 2 matrices of (2, 2), one t2_t2 tile each: [0, 1, 2, 3] and [4, 5, 6, 7]
    assert _tiling((2, 2, 2), -1, "e8m0_t2_t2").to_tiles(x).tolist() == [
        [[[0, 1, 2, 3]]],
        [[[4, 5, 6, 7]]],
    ]


def test_a_channel_row_tile_spans_every_row() -> None:
    x = np.arange(24).reshape(3, 8)
    t = _tiling((3, 8), -1, "e8m0_t0_t4")
    # tiles of all 3 rows by 4 columns: cols 0-3 = [0..3, 8..11, 16..19], cols 4-7 = +4
    assert t.to_tiles(x).tolist() == [
        [[[0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19], [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23]]]
    ]


def test_1d_subtiles_are_pairs_of_neighbours() -> None:
    x = np.arange(20).reshape(2, 10)
    t = _tiling((2, 10), -1, "e8m0_t8s2")
    s = t.to_subtiles(t.to_tiles(x))
    assert s.shape == (1, 2, 2, 4, 2)  # (B, nR, nC, n_sub, Sr * Sc)
    # row 0: tile 0 = 0..7 in pairs; tile 1 = [8, 9] then padding
    assert s[0, 0].tolist() == [[[0, 1], [2, 3], [4, 5], [6, 7]], [[8, 9], [0, 0], [0, 0], [0, 0]]]
    assert t.from_subtiles(s).tolist() == t.to_tiles(x).tolist()


def test_2d_subtiles_are_listed_row_of_subtiles_first() -> None:
    x = np.arange(16).reshape(4, 4)
    t = _tiling((4, 4), -1, "e8m0_t4s2_t4s2")
    s = t.to_subtiles(t.to_tiles(x))
    # one tile (the whole of x); subtile (0, 0) = rows 0-1, cols 0-1 = [0, 1, 4, 5];
    # (0, 1) = [2, 3, 6, 7]; (1, 0) = [8, 9, 12, 13]; (1, 1) = [10, 11, 14, 15]
    assert s.tolist() == [[[[[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]]]]
    assert t.from_subtiles(s).tolist() == t.to_tiles(x).tolist()


@pytest.mark.parametrize(
    ("shape", "axis", "code"),
    [
        ((7,), 0, "e8m0_t4"),
        ((3, 5, 7), 1, "e8m0_t4"),
        ((3, 5, 7), -1, "e8m0_t0"),
        ((2, 5, 7), -1, "e8m0_t2_t4"),
        ((5, 3, 6), 0, "e8m0_t4_t2"),
        ((5, 9), -1, "e8m0_t8s4"),
        ((6, 10), -1, "e8m0_t4s2_t4s2"),
        ((4, 6), 0, "e8m0"),
    ],
)
def test_views_round_trip(shape: tuple[int, ...], axis: int, code: str) -> None:
    x = np.arange(1, int(np.prod(shape)) + 1).reshape(shape)
    t = _tiling(shape, axis, code)
    tiles = t.to_tiles(x)
    assert tiles.shape == (t.B, t.nR, t.nC, t.tile_elems)
    # padding adds zeros only: the tiles hold every element once (x holds no zero)
    assert sorted(v for v in tiles.ravel().tolist() if v) == x.ravel().tolist()
    assert np.array_equal(t.from_tiles(tiles), x)
    if t.n_sub:
        assert np.array_equal(t.from_subtiles(t.to_subtiles(tiles)), tiles)


# -- grid layout ----------------------------------------------------------------------------------
def test_tensor_scale_grid_is_one_value() -> None:
    t = _tiling((3, 5), -1, "e8m0")
    assert t.tile_grid(np.array([[[7]]])).tolist() == [7]
    assert t.tile_ungrid(np.array([7])).tolist() == [[[7]]]


def test_1d_grid_on_the_last_axis_counts_tiles_there() -> None:
    t = _tiling((2, 6), -1, "e8m0_t4")
    per_tile = np.array([[[10, 11], [20, 21]]])  # (B, nR, nC): row r, tile c -> 10 * (r + 1) + c
    # grid shape (2, ceil(6 / 4) = 2), the input's axis order
    assert t.tile_grid(per_tile).tolist() == [[10, 11], [20, 21]]
    assert t.tile_ungrid(t.tile_grid(per_tile)).tolist() == per_tile.tolist()


def test_1d_grid_on_axis_0_counts_tiles_along_axis_0() -> None:
    t = _tiling((6, 2), 0, "e8m0_t4")
    per_tile = np.array([[[10, 11], [20, 21]]])  # moved row = input column c, tile k
    # grid shape (ceil(6 / 4) = 2 tiles, 2 columns): grid[k][c] = per_tile[0][c][k]
    assert t.tile_grid(per_tile).tolist() == [[10, 20], [11, 21]]
    assert t.tile_ungrid(t.tile_grid(per_tile)).tolist() == per_tile.tolist()


def test_2d_grid_keeps_leading_dims_and_the_axis_order() -> None:
    # (2, 3, 4) in t2_t2: grid (2, ceil(3 / 2) = 2, 4 / 2 = 2), the same as (B, nR, nC)
    t = _tiling((2, 3, 4), -1, "e8m0_t2_t2")
    per_tile = np.arange(8).reshape(2, 2, 2)
    assert t.tile_grid(per_tile).tolist() == per_tile.tolist()
    # (6, 3) on axis 0: moved (3, 6), (nR, nC) = (2, 3); the moved last dim (input dim 0) goes
    # back first, so the grid is (3, 2): grid[i][j] = per_tile[0][j][i]
    t = _tiling((6, 3), 0, "e8m0_t2_t2")
    per_tile = np.array([[[0, 1, 2], [3, 4, 5]]])
    assert t.tile_grid(per_tile).tolist() == [[0, 3], [1, 4], [2, 5]]
    assert t.tile_ungrid(t.tile_grid(per_tile)).tolist() == per_tile.tolist()


def test_a_grid_of_the_wrong_size_is_refused() -> None:
    t = _tiling((2, 6), -1, "e8m0_t4")
    with pytest.raises(ValueError, match=r"scale has 3 entries; shape \(2, 6\) .* needs 4"):
        t.tile_ungrid(np.zeros((1, 3)))


def test_1d_subtile_grid_drops_padding_only_subtiles() -> None:
    t = _tiling((2, 10), -1, "e8m0_t8s2")
    # real subtiles per row: ceil(10 / 2) = 5 of the 2 tiles * 4 = 8
    assert t.sub_counts == (2, 5)
    per_sub = np.arange(16).reshape(1, 2, 2, 4)  # (B, nR, nC, n_sub)
    # row 0: tile 0 [0, 1, 2, 3] + tile 1 [4, ...] -> the first 5; row 1 likewise from 8
    assert t.sub_grid(per_sub).tolist() == [[0, 1, 2, 3, 4], [8, 9, 10, 11, 12]]
    # back again, the dropped subtiles as 0
    assert t.sub_ungrid(t.sub_grid(per_sub)).tolist() == [
        [[[0, 1, 2, 3], [4, 0, 0, 0]], [[8, 9, 10, 11], [12, 0, 0, 0]]]
    ]


def test_2d_subtile_grid_drops_padding_rows() -> None:
    t = _tiling((2, 4), -1, "e8m0_t4s2_t4s2")
    # R = 2 of a 4-row tile: ceil(2 / 2) = 1 subtile row holds data, ceil(4 / 2) = 2 columns
    assert t.sub_counts == (1, 2)
    per_sub = np.array([[[[5, 6, 7, 8]]]])  # subtiles (0, 0), (0, 1), (1, 0), (1, 1)
    assert t.sub_grid(per_sub).tolist() == [[5, 6]]
    assert t.sub_ungrid(np.array([[5, 6]])).tolist() == [[[[5, 6, 0, 0]]]]


def test_a_subtile_grid_of_the_wrong_size_is_refused() -> None:
    t = _tiling((2, 10), -1, "e8m0_t8s2")
    with pytest.raises(ValueError, match=r"meta has 9 entries; shape \(2, 10\) needs 10"):
        t.sub_ungrid(np.zeros((1, 9)))
