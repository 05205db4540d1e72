"""Short reduction axes: conv weights tiled over their whole reduction (``docs/ops.md``).

A Conv weight ``W[M, C/group, kh, kw]`` is tiled along its input channels (axis 1). When that
axis is shorter than the data type's tile (a depthwise conv has ``C/group = 1``), every tile
holds a few values and pays a whole scale for them: "4-bit" MXFP4 costs 12 bits a value.
Such a weight is tiled instead as the 2-D matrix ``[M, C/group * kh * kw]`` along axis 1 (its
whole reduction, contiguous in C order), and the graph restores the conv's shape with a
``Reshape`` after the decoding node (a constant int64 shape initializer). ConvTranspose
(``W[C, M/group, kh, kw]``, tiled along its input channels, axis 0) whose input channels are
fewer than the tile is tiled as ``[C, M/group * kh * kw]``: the weights one input channel
spreads over its outputs, which is what a GEMM + col2im kernel reads as one row.

`flat_shape` decides (the plan calls it), `restore_nodes` writes the Reshape, and
`reshaped_outputs` finds the pattern in a quantized model (``onnxq inspect``, ``onnxq export``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxq.formats.datatype import DataType

__all__ = ["flat_shape", "reshaped_outputs", "restore_nodes"]

# op type -> the weight's default tile axis (its input-channel axis).
_CONV_AXES = {"Conv": 1, "ConvTranspose": 0}


def flat_shape(
    op_type: str, dtype: DataType, shape: Sequence[int], axis: int
) -> tuple[int, int] | None:
    """The 2-D shape a conv weight is tiled in instead of ``shape``, or None to keep it.

    It applies to Conv and ConvTranspose weights with kernel dims (rank >= 3) read at their
    default axis (input channels), under a data type with one tile of a fixed size, when that
    axis is shorter than the tile and the flattened row (the product of ``shape[1:]``) is
    longer than the axis. The result is ``[shape[0], prod(shape[1:])]``, tiled along axis 1.
    """
    if _CONV_AXES.get(op_type) != axis or len(shape) < 3:
        return None
    s = dtype.sspec
    if s is None or len(s.tiles) != 1 or s.tiles[0].is_channel:
        return None
    rest = math.prod(int(d) for d in shape[1:])
    if int(shape[axis]) >= s.tiles[0].size or rest <= int(shape[axis]):
        return None
    return int(shape[0]), rest


def restore_nodes(
    tiled: str, name: str, shape: Sequence[int], fresh: Callable[[str], str]
) -> tuple[TensorProto, onnx.NodeProto]:
    """The shape initializer and the ``Reshape`` that turn the tiled weight into ``name``."""
    target = numpy_helper.from_array(np.asarray(shape, np.int64), fresh(f"{name}__shape"))
    node = helper.make_node("Reshape", [tiled, target.name], [name], name=fresh(f"{name}__reshape"))
    return target, node


def reshaped_outputs(
    graph: onnx.GraphProto, stored: Mapping[str, TensorProto]
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor -> (Reshape output, its shape) for each Reshape of ``graph`` by a stored shape.

    Only shapes of positive dims are read (no 0 or -1, which depend on the input), from
    tensors stored in the model itself (not external data). A tensor that reaches such a
    Reshape through one Identity maps to it too.
    """
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    for node in graph.node:
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx"):
            continue
        if len(node.input) < 2 or not node.output or node.input[1] not in stored:
            continue
        target = stored[node.input[1]]
        if target.data_type != TensorProto.INT64 or target.data_location == TensorProto.EXTERNAL:
            continue
        dims = tuple(int(d) for d in numpy_helper.to_array(target).reshape(-1))
        if dims and all(d > 0 for d in dims):
            found[node.input[0]] = (node.output[0], dims)
    for node in graph.node:  # the standard target's DequantizeLinear -> Identity -> Reshape
        if node.op_type == "Identity" and node.input and node.output[:1]:
            if node.output[0] in found:
                found.setdefault(node.input[0], found[node.output[0]])
    return found
