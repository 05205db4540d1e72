"""The graph writer of the function fallbacks: a body's nodes, bit streams and tile geometry.

`_Body` collects the nodes of one function body; the helpers here unpack and pack the codes of
a uint8 stream and move values between a tile grid and the input's shape with standard ops.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxq.cast.layout import Tiling


# -- a tiny graph writer ----------------------------------------------------------------------
class _Body:
    """Collects the nodes of one function body with unique value names."""

    def __init__(self, label: str) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self._count = 0
        self._label = label

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, value: np.ndarray | float | int, dtype: Any = None, hint: str = "c") -> str:
        """A Constant node holding ``value`` (numpy dtype ``dtype`` when given)."""
        arr = np.asarray(value, dtype=dtype)
        name = self._name(hint)
        self.nodes.append(
            helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr, name=name))
        )
        return name

    def ints(self, values: Sequence[int]) -> str:
        """A 1-D int64 constant (shapes, axes, pads)."""
        return self.const(np.asarray(list(values), dtype=np.int64), hint="shape")

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        """Append one single-output node and return its output name."""
        name = out or self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], **attrs))
        return name

    # -- helpers built from standard ops ----------------------------------------------------
    def cast(self, x: str, to: int) -> str:
        return self.op("Cast", x, to=to)

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        return self.op("Reshape", x, self.ints(shape))

    def slice(self, x: str, ends: Sequence[int], axes: Sequence[int]) -> str:
        return self.op("Slice", x, self.ints([0] * len(ends)), self.ints(ends), self.ints(axes))

    def gather(self, table: np.ndarray, index: str, hint: str = "table") -> str:
        return self.op("Gather", self.const(table, hint=hint), index, axis=0)

    def where(self, cond: str, a: str, b: str) -> str:
        return self.op("Where", cond, a, b)


# -- bit streams ------------------------------------------------------------------------------
def _unpack(body: _Body, packed: str, bits: int, count: int) -> str:
    """The first ``count`` codes of ``bits`` bits of a packed uint8 stream, as int64 ``[count]``.

    The stream is read in groups of ``bits`` bytes (8 codes): code k of a group starts at bit
    ``k * bits``, so it lies in bytes ``k*bits // 8`` and the next one, both gathered as uint32
    (onnxruntime implements BitShift for uint8/32/64; uint16 only from late 2026).
    """
    if bits == 8:
        return body.cast(body.slice(packed, [count], [0]), TensorProto.INT64)
    if bits == 16:
        pairs = body.reshape(body.slice(packed, [2 * count], [0]), [count, 2])
        wide = body.cast(pairs, TensorProto.UINT32)
        lo = body.op("Gather", wide, body.ints([0]), axis=1)
        hi = body.op("Gather", wide, body.ints([1]), axis=1)
        hi = body.op("BitShift", hi, body.const(8, np.uint32), direction="LEFT")
        word = body.op("BitwiseOr", lo, hi)
        return body.cast(body.reshape(word, [count]), TensorProto.INT64)
    if not 1 <= bits < 8:
        raise NotImplementedError(f"unpacking {bits}-bit codes in a function body")
    groups = -(-count // 8)
    need = (count * bits + 7) // 8
    stream = body.slice(packed, [need], [0])
    if groups * bits > need:
        stream = body.op(
            "Pad", stream, body.ints([0, groups * bits - need]), body.const(0, np.uint8)
        )
    grid = body.cast(body.reshape(stream, [groups, bits]), TensorProto.UINT32)
    starts = [k * bits for k in range(8)]
    lo_idx = [s // 8 for s in starts]
    hi_idx = [min(s // 8 + 1, bits - 1) for s in starts]
    lo = body.op("Gather", grid, body.ints(lo_idx), axis=1)
    hi = body.op("Gather", grid, body.ints(hi_idx), axis=1)
    hi = body.op("BitShift", hi, body.const(8, np.uint32), direction="LEFT")
    word = body.op("BitwiseOr", lo, hi)
    offsets = body.const(np.array([s % 8 for s in starts], dtype=np.uint32))
    word = body.op("BitShift", word, offsets, direction="RIGHT")
    codes = body.op("BitwiseAnd", word, body.const((1 << bits) - 1, np.uint32))
    codes = body.reshape(codes, [groups * 8])
    if groups * 8 != count:
        codes = body.slice(codes, [count], [0])
    return body.cast(codes, TensorProto.INT64)


def _pack(body: _Body, codes: str, bits: int, count: int, out: str) -> str:
    """Pack int64 codes ``[count]`` (each < 2^bits) into the uint8 stream of packing.py."""
    if bits == 8:
        return body.op("Cast", codes, out=out, to=TensorProto.UINT8)
    if not 1 <= bits < 8:
        raise NotImplementedError(f"packing {bits}-bit codes in a function body")
    groups = -(-count // 8)
    if groups * 8 != count:
        codes = body.op("Pad", codes, body.ints([0, groups * 8 - count]), body.const(0, np.int64))
    grid = body.reshape(codes, [groups, 8])
    weights = body.const(np.array([1 << (k * bits) for k in range(8)], dtype=np.int64))
    word = body.op("ReduceSum", body.op("Mul", grid, weights), body.ints([1]), keepdims=1)
    word = body.cast(word, TensorProto.UINT64)
    shifts = body.const(np.array([8 * j for j in range(bits)], dtype=np.uint64))
    parts = body.op("BitShift", word, shifts, direction="RIGHT")
    parts = body.op("BitwiseAnd", parts, body.const(0xFF, np.uint64))
    stream = body.reshape(body.cast(parts, TensorProto.UINT8), [groups * bits])
    need = (count * bits + 7) // 8
    if need != groups * bits:
        stream = body.slice(stream, [need], [0])
    return body.op("Identity", stream, out=out)


# -- geometry: grids in the input's axis order ------------------------------------------------
def _tiled_dims(tiling: Tiling, rows: int, cols: int) -> dict[int, int]:
    """Dim -> tile extent along it, in the input's axis order (empty for one tensor scale)."""
    ndim = len(tiling.shape)
    if tiling.kind == "tensor":
        return {}
    if tiling.kind == "1d":
        return {tiling.axis: cols}
    row_dim = ndim - 2 if tiling.axis == ndim - 1 else ndim - 1
    return {row_dim: rows, tiling.axis: cols}


def _grid_shape(shape: Sequence[int], tiles: Mapping[int, int]) -> tuple[int, ...]:
    if not tiles:
        return (1,)
    return tuple(-(-n // tiles[d]) if d in tiles else n for d, n in enumerate(shape))


def _expand(body: _Body, grid: str, shape: Sequence[int], tiles: Mapping[int, int]) -> str:
    """Repeat every grid entry over its tile: grid layout -> a tensor broadcastable to ``shape``.

    Dims whose grid count is 1 are left for broadcasting.
    """
    gshape = _grid_shape(shape, tiles)
    grow = [d for d, t in tiles.items() if gshape[d] > 1 and t > 1]
    if not grow:
        return grid
    split: list[int] = []
    full: list[int] = []
    merged: list[int] = []
    for d, g in enumerate(gshape):
        split.append(g)
        full.append(g)
        if d in grow:
            split.append(1)
            full.append(tiles[d])
            merged.append(g * tiles[d])
        else:
            merged.append(g)
    wide = body.op("Expand", body.reshape(grid, split), body.ints(full))
    wide = body.reshape(wide, merged)
    cut = [d for d in grow if merged[d] != shape[d]]
    if cut:
        wide = body.slice(wide, [shape[d] for d in cut], cut)
    return wide


def _reduce_tiles(
    body: _Body, x: str, shape: Sequence[int], tiles: Mapping[int, int], op: str
) -> str:
    """Reduce each tile of ``x`` (zero padded) with ``op``: result in grid layout."""
    if not tiles:
        return body.reshape(body.op(op, body.reshape(x, [-1]), keepdims=1), [1])
    pads_end = [(-n) % tiles[d] if d in tiles else 0 for d, n in enumerate(shape)]
    if any(pads_end):
        x = body.op("Pad", x, body.ints([0] * len(shape) + pads_end), body.const(0.0, np.float32))
    split: list[int] = []
    axes: list[int] = []
    for d, n in enumerate(shape):
        if d in tiles:
            split += [-(-n // tiles[d]), tiles[d]]
            axes.append(len(split) - 1)
        else:
            split.append(n)
    return body.op(op, body.reshape(x, split), body.ints(axes), keepdims=0)
