"""Tile geometry read at run time: the fallbacks of tensors whose dims are not all known.

A static body (`body`) bakes every size into its reshapes. When some dim is unknown (only
the rank is known), the body reads X's shape at run time (``Shape`` for QuantizeMX, the
``Shape`` input of DequantizeMX) and works in a *tiled layout*: the tiled axis ``a`` is padded
with zeros to whole tiles and split, so X of shape ``[pre..., C, post...]`` is seen as
``[pre..., nC, U, S, post...]`` with ``nC = ceil(C / T)`` tiles, ``U`` subtiles of ``S``
elements each (``U = 1, S = T`` without subtiles). Per-tile values then have the shape
``[pre..., nC, 1, 1, post...]`` and per-subtile values ``[pre..., nC, U, 1, post...]``, so they
broadcast over the elements without any ``Expand``; the padding is cut off again on the way
back. One scale per tensor flattens X to one dim first; a whole-axis tile (``t0``) has
``nC = U = 1`` and ``S = C``. 2-D tiles are weights and have no run-time form here.

Only 1-D tiles and tensor scales are covered; the codes are packed and unpacked with counts
computed at run time (``_pack_dynamic``, ``_unpack_dynamic``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from onnx import TensorProto

from onnxq.formats.datatype import DataType
from onnxq.graph.functions.body import _Body


def dynamic_dims(shape: Sequence[int | None] | None) -> bool:
    """True when ``shape`` has a rank but some dim is unknown (None, or negative like -1).

    A dim of 0 is known: a tensor with no elements, which no body quantizes.
    """
    return shape is not None and len(shape) > 0 and any(d is None or int(d) < 0 for d in shape)


def check_rank(shape: Sequence[int | None], axis: int, what: str) -> tuple[int, int]:
    """(rank, axis in [0, rank)) of a shape with unknown dims.

    Raises:
        ValueError: rank 0 or ``axis`` out of range.
    """
    rank = len(shape)
    if rank < 1:
        raise ValueError(f"{what}: X needs a rank of at least 1")
    if not -rank <= axis < rank:
        raise ValueError(f"{what}: axis {axis} is out of range for rank {rank}")
    return rank, axis % rank


def _take(body: _Body, vec: str, start: int, end: int) -> str:
    """``vec[start:end]`` of a 1-D tensor (static bounds)."""
    return body.op("Slice", vec, body.ints([start]), body.ints([end]), body.ints([0]))


class Layout:
    """The tiled layout of one tensor whose shape is the int64 tensor ``shape`` (run time)."""

    def __init__(self, body: _Body, dt: DataType, shape: str, rank: int, axis: int) -> None:
        s = dt.sspec
        if s is None:
            raise NotImplementedError(f"{dt.name}: unscaled data types need no tile layout")
        if len(s.tiles) != 1 and not s.is_tensor:
            raise NotImplementedError(
                f"{dt.name}: 2-D tiles on a tensor with unknown dims (2-D tiles are for "
                "weights, whose shapes are static)"
            )
        if s.sparsity[1]:
            raise NotImplementedError(f"{dt.name}: N:M sparsity on a tensor with unknown dims")
        self.body, self.shape = body, shape
        self.tensor = s.is_tensor
        self.subtiled = bool(not s.is_tensor and s.tiles[0].subtile)
        if self.tensor:  # one scale: X flattened to one dim, one whole tile
            self.rank, self.axis, self.T, self.S = 1, 0, 0, 0
            self.dims = body.op("ReduceProd", shape, keepdims=1)
        else:
            tile = s.tiles[0]
            self.rank, self.axis = rank, axis
            self.T, self.S = tile.size, tile.subtile or tile.size
            self.dims = shape
        a = self.axis
        self.pre = _take(body, self.dims, 0, a)
        self.post = _take(body, self.dims, a + 1, self.rank)
        self.C = _take(body, self.dims, a, a + 1)  # [1]
        self.count = body.op("ReduceProd", shape, keepdims=1)  # [1]: X's element count
        if self.T:
            t = body.ints([self.T])
            self.nC = body.op("Div", body.op("Add", self.C, body.ints([self.T - 1])), t)
            self.pad = body.op("Sub", body.op("Mul", self.nC, t), self.C)
        else:
            self.nC, self.pad = body.ints([1]), None
        self.U = self.T // self.S if self.T else 1

    def _shape(self, *middle: str | Sequence[int]) -> str:
        parts = [m if isinstance(m, str) else self.body.ints(m) for m in middle]
        return self.body.op("Concat", self.pre, *parts, self.post, axis=0)

    def to_tiles(self, x: str, fill: float | int = 0.0, dtype: object = np.float32) -> str:
        """``x`` (X's shape) -> ``[pre, nC, U, S, post]``, the tail padded with ``fill``."""
        body = self.body
        if self.tensor:
            x = body.reshape(x, [-1])
        if self.pad is not None:
            onehot = np.zeros(2 * self.rank, dtype=np.int64)
            onehot[self.rank + self.axis] = 1
            pads = body.op("Mul", body.const(onehot, hint="pads"), self.pad)
            x = body.op("Pad", x, pads, body.const(fill, dtype))
        if self.T:
            middle: list[str | Sequence[int]] = [[-1, self.U, self.S]]
        else:  # a whole-axis tile
            middle = [[1, 1], self.C]
        return body.op("Reshape", x, self._shape(*middle))

    def from_tiles(self, t: str) -> str:
        """Inverse of `to_tiles` (the padding cut off): X's shape."""
        body = self.body
        y = body.op("Reshape", t, self._shape([-1]))
        if self.pad is not None:
            y = body.op("Slice", y, body.ints([0]), self.C, body.ints([self.axis]), body.ints([1]))
        if self.tensor:
            y = body.op("Reshape", y, self.shape)
        return y

    def tile_max(self, t: str) -> str:
        """Per-tile maximum of tiled values: ``[pre, nC, 1, 1, post]``."""
        a = self.axis
        return self.body.op("ReduceMax", t, self.body.ints([a + 1, a + 2]), keepdims=1)

    def subtile_max(self, t: str) -> str:
        """Per-subtile maximum of tiled values: ``[pre, nC, U, 1, post]``."""
        return self.body.op("ReduceMax", t, self.body.ints([self.axis + 2]), keepdims=1)

    def grid_shape(self) -> str:
        """The tile grid (the Scale output's shape): X's dims with C replaced by nC."""
        if self.tensor:
            return self.body.ints([1])
        return self._shape(self.nC)

    def tile_values(self, grid: str) -> str:
        """A tile-grid tensor (any shape with the grid's element count) -> per-tile layout."""
        if self.tensor:
            return self.body.reshape(grid, [1, 1, 1])
        return self.body.op("Reshape", grid, self._shape([-1, 1, 1]))

    def grid_of(self, per_tile: str) -> str:
        """Per-tile layout -> the tile grid (Scale's shape)."""
        return self.body.op("Reshape", per_tile, self.grid_shape())

    def subtiles_held(self) -> str:
        """[1] int64: subtiles along the axis that hold elements, ``ceil(C / S)``."""
        s = self.body.ints([self.S])
        return self.body.op("Div", self.body.op("Add", self.C, self.body.ints([self.S - 1])), s)

    def meta_of(self, per_sub: str) -> str:
        """Per-subtile layout -> the subtile grid in X's axis order, padding-only ones dropped."""
        body = self.body
        flat = body.op("Reshape", per_sub, self._shape([-1]))
        ends, axes = self.subtiles_held(), body.ints([self.axis])
        return body.op("Slice", flat, body.ints([0]), ends, axes, body.ints([1]))

    def subtile_values(self, grid: str) -> str:
        """A subtile grid (flat, ``meta_of``'s order) -> per-subtile layout (dropped ones 0)."""
        body = self.body
        held = body.op("Reshape", grid, self._shape(self.subtiles_held()))
        all_subs = body.op("Mul", self.nC, body.ints([self.U]))
        gap = body.op("Sub", all_subs, self.subtiles_held())
        onehot = np.zeros(2 * self.rank, dtype=np.int64)
        onehot[self.rank + self.axis] = 1
        pads = body.op("Mul", body.const(onehot, hint="pads"), gap)
        held = body.op("Pad", held, pads, body.const(0, np.int64))
        return body.op("Reshape", held, self._shape([-1, self.U, 1]))

    def meta_count(self) -> str:
        """[1] int64: how many subtiles hold elements (Meta's unit count)."""
        body = self.body
        rest = body.op("Div", self.count, self.C)
        return body.op("Mul", rest, self.subtiles_held())


def _bytes_for(body: _Body, count: str, bits: int) -> str:
    """[1] int64: the bytes that ``count`` codes of ``bits`` bits fill, ``ceil(count*bits/8)``."""
    total = body.op("Add", body.op("Mul", count, body.ints([bits])), body.ints([7]))
    return body.op("Div", total, body.ints([8]))


def _pack_dynamic(body: _Body, codes: str, bits: int, out: str) -> str:
    """Pack int64 codes ``[n]`` (n known at run time) into the uint8 stream of packing.py."""
    if bits == 8:
        return body.op("Cast", codes, out=out, to=TensorProto.UINT8)
    if not 1 <= bits < 8:
        raise NotImplementedError(f"packing {bits}-bit codes in a function body")
    count = body.op("Shape", codes)
    groups = body.op("Div", body.op("Add", count, body.ints([7])), body.ints([8]))
    gap = body.op("Sub", body.op("Mul", groups, body.ints([8])), count)
    codes = body.op("Pad", codes, body.op("Concat", body.ints([0]), gap, axis=0))
    grid = body.reshape(codes, [-1, 8])
    weights = body.const(np.array([1 << (k * bits) for k in range(8)], dtype=np.int64))
    word = body.op("ReduceSum", body.op("Mul", grid, weights), body.ints([1]), keepdims=1)
    word = body.cast(word, TensorProto.UINT64)
    shifts = body.const(np.array([8 * j for j in range(bits)], dtype=np.uint64))
    parts = body.op("BitShift", word, shifts, direction="RIGHT")
    parts = body.op("BitwiseAnd", parts, body.const(0xFF, np.uint64))
    stream = body.reshape(body.cast(parts, TensorProto.UINT8), [-1])
    need = _bytes_for(body, count, bits)
    return body.op("Slice", stream, body.ints([0]), need, out=out)


def _unpack_dynamic(body: _Body, packed: str, bits: int, count: str) -> str:
    """The first ``count`` ([1] int64, run time) codes of a packed uint8 stream, as int64."""
    if bits == 8:
        return body.cast(body.op("Slice", packed, body.ints([0]), count), TensorProto.INT64)
    if bits == 16:
        pairs = body.op("Slice", packed, body.ints([0]), body.op("Mul", count, body.ints([2])))
        wide = body.cast(body.reshape(pairs, [-1, 2]), TensorProto.UINT32)
        lo = body.op("Gather", wide, body.ints([0]), axis=1)
        hi = body.op("Gather", wide, body.ints([1]), axis=1)
        hi = body.op("BitShift", hi, body.const(8, np.uint32), direction="LEFT")
        return body.cast(body.reshape(body.op("BitwiseOr", lo, hi), [-1]), TensorProto.INT64)
    if not 1 <= bits < 8:
        raise NotImplementedError(f"unpacking {bits}-bit codes in a function body")
    groups = body.op("Div", body.op("Add", count, body.ints([7])), body.ints([8]))
    need = _bytes_for(body, count, bits)
    stream = body.op("Slice", packed, body.ints([0]), need)
    gap = body.op("Sub", body.op("Mul", groups, body.ints([bits])), need)
    stream = body.op("Pad", stream, body.op("Concat", body.ints([0]), gap, axis=0))
    grid = body.cast(body.reshape(stream, [-1, bits]), TensorProto.UINT32)
    starts = [k * bits for k in range(8)]
    lo = body.op("Gather", grid, body.ints([s // 8 for s in starts]), axis=1)
    hi = body.op("Gather", grid, body.ints([min(s // 8 + 1, bits - 1) for s in starts]), axis=1)
    hi = body.op("BitShift", hi, body.const(8, np.uint32), direction="LEFT")
    word = body.op("BitwiseOr", lo, hi)
    offsets = body.const(np.array([s % 8 for s in starts], dtype=np.uint32))
    word = body.op("BitShift", word, offsets, direction="RIGHT")
    codes = body.op("BitwiseAnd", word, body.const((1 << bits) - 1, np.uint32))
    codes = body.op("Slice", body.reshape(codes, [-1]), body.ints([0]), count)
    return body.cast(codes, TensorProto.INT64)
