"""The GatherMX fusion: an embedding lookup on a packed table decodes only the gathered rows.

A ``DequantizeMX`` (or ``CodebookLookup``) node of the main graph whose inputs are all
initializers (not graph inputs, which a caller may override) and whose output is read only as
the data input of ``Gather`` nodes with ``axis=0`` is removed; each of those Gathers becomes a
``GatherMX`` node on the packed inputs (docs/ops.md), which decodes only the rows its indices
name and keeps the table packed. The bits are those of the decode followed by the Gather.

Left as they are:

- a decoded table that something else also reads (a graph output, a subgraph, a Transpose
  or MatMul that `fuse_matmul` could not take). The decode stays for that reader, so the table
  is decoded (or, with constant decoding, kept decoded) anyway, and a Gather on it only copies
  rows: a GatherMX would add decoding work and save no memory. Tied embeddings whose output
  projection ``MatMul(h, Transpose(E))`` `fuse_matmul` turned into ``MatMulMX(trans_b=1)``
  (it runs first in ``FUSIONS``) are fused here: the Gathers are then the table's only readers,
  so GatherMX and MatMulMX read the one packed initializer and the DequantizeMX goes;
- N:M sparse formats (GatherMX does not take them), and tables tiled along dim 0 in groups of
  more than `MAX_GROUP_ROWS` rows (GatherMX decodes every row group its indices touch: a tile
  of 32 rows along dim 0 costs 32 rows per index, a tile spanning the whole dim the whole
  table).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from onnxq.cast.layout import Tiling
from onnxq.formats.datatype import datatype
from onnxq.graph.schemas import DOMAIN, input_names
from onnxq.graph.walk import node_attrs, node_subgraphs, walk_graphs

__all__ = ["MAX_GROUP_ROWS", "fuse_gather", "rows_per_group"]

# The most rows one tile may span along dim 0 for the fusion to apply.
MAX_GROUP_ROWS = 64
_DECODERS = ("DequantizeMX", "CodebookLookup")
_STANDARD = ("", "ai.onnx")


def rows_per_group(dtype: str, axis: int, shape: list[int]) -> int:
    """How many consecutive table rows GatherMX decodes together: the tiles' extent on dim 0.

    Raises:
        ValueError: a bad data type, axis or shape.
    """
    dt = datatype(dtype)
    tiling = Tiling.build(tuple(shape), axis, dt.sspec)
    if tiling.kind == "tensor":
        return 1
    ndim = len(shape)
    ax = axis % ndim
    if ax == 0:
        return min(tiling.Tc, shape[0])
    rows_dim = ndim - 2 if ax == ndim - 1 else ndim - 1
    if tiling.kind == "2d" and rows_dim == 0:
        return min(tiling.Tr, shape[0])
    return 1


def _covered(node: onnx.NodeProto) -> dict | None:
    """The decoder's attributes when GatherMX decodes its table well, else None."""
    attrs = node_attrs(node)
    shape = [int(d) for d in attrs.get("shape", [])]
    if not shape or not isinstance(attrs.get("dtype"), str):
        return None
    try:
        dt = datatype(attrs["dtype"])
        group = rows_per_group(attrs["dtype"], int(attrs.get("axis", -1)), shape)
    except ValueError:
        return None
    if dt.sspec is not None and dt.sspec.sparsity[1]:
        return None
    if group > MAX_GROUP_ROWS:
        return None
    return attrs


def _gather_inputs(node: onnx.NodeProto) -> list[str] | None:
    """GatherMX's packed inputs (after Indices) from the decoder's, None if one has no slot."""
    named = dict(zip(input_names(node.op_type), node.input, strict=False))
    slots = input_names("GatherMX")[1:]
    if any(value and name not in slots for name, value in named.items()):
        return None  # an input GatherMX does not take (say a run-time Shape)
    inputs = [named.get(name, "") for name in slots]
    while inputs and not inputs[-1]:
        inputs.pop()
    return inputs


def _readers(graph: onnx.GraphProto) -> dict[str, int]:
    """How many times each name is read: node inputs (subgraphs included) and graph outputs."""
    count: dict[str, int] = {}
    for node in graph.node:
        names = list(node.input)
        for sub in node_subgraphs(node):
            for g in walk_graphs(sub):
                names += [i for n in g.node for i in n.input]
        for name in names:
            if name:
                count[name] = count.get(name, 0) + 1
    for out in graph.output:
        count[out.name] = count.get(out.name, 0) + 1
    return count


def _is_row_gather(node: onnx.NodeProto, table: str) -> bool:
    axis = node_attrs(node).get("axis", 0)
    return (
        node.op_type == "Gather"
        and node.domain in _STANDARD
        and len(node.input) == 2
        and node.input[0] == table
        and node.input[1] != table
        and axis == 0
    )


def _static_dims(graph: onnx.GraphProto, name: str) -> list[int] | None:
    for info in (*graph.input, *graph.value_info, *graph.output):
        if info.name == name and info.type.tensor_type.HasField("shape"):
            dims = info.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                return [d.dim_value for d in dims]
    for init in graph.initializer:
        if init.name == name:
            return list(init.dims)
    return None


def _declare(graph: onnx.GraphProto, node: onnx.NodeProto, attrs: dict) -> None:
    """Y's type in value_info (onnxruntime cannot infer a custom op's output type)."""
    name = node.output[0]
    elem = int(attrs.get("output_type", TensorProto.FLOAT))
    for info in (*graph.value_info, *graph.output):
        if info.name == name and info.type.tensor_type.elem_type:
            return
    indices = _static_dims(graph, node.input[0])
    shape = None if indices is None else [*indices, *[int(d) for d in attrs["shape"]][1:]]
    graph.value_info.append(helper.make_tensor_value_info(name, elem, shape))


def fuse_gather(model: onnx.ModelProto) -> int:
    """Turn the Gathers of packed tables into GatherMX nodes, in place; how many were made."""
    graph = model.graph
    inits = {t.name for t in graph.initializer} - {i.name for i in graph.input}
    readers = _readers(graph)
    replace: dict[int, onnx.NodeProto] = {}  # node position -> its GatherMX
    drop: set[int] = set()
    for pos, dec in enumerate(graph.node):
        if dec.domain != DOMAIN or dec.op_type not in _DECODERS or len(dec.output) != 1:
            continue
        table = dec.output[0]
        if not table or not all(i in inits for i in dec.input if i):
            continue
        gathers = [i for i, n in enumerate(graph.node) if _is_row_gather(n, table)]
        if not gathers or readers.get(table, 0) != len(gathers):
            continue  # no Gather, or the table is read elsewhere too (kept decoded)
        attrs = _covered(dec)
        packed = _gather_inputs(dec)
        if attrs is None or packed is None:
            continue
        for i in gathers:
            old = graph.node[i]
            fused = helper.make_node(
                "GatherMX",
                [old.input[1], *packed],
                list(old.output),
                name=old.name or f"{table}__gather_mx_{i}",
                domain=DOMAIN,
                **{k: attrs[k] for k in ("dtype", "axis", "shape", "output_type") if k in attrs},
            )
            replace[i] = fused
        drop.add(pos)
    if not replace:
        return 0
    dropped = {graph.node[i].output[0] for i in drop}
    nodes = [replace.get(i, n) for i, n in enumerate(graph.node) if i not in drop]
    del graph.node[:]
    graph.node.extend(nodes)
    keep = [v for v in graph.value_info if v.name not in dropped]
    del graph.value_info[:]
    graph.value_info.extend(keep)
    for node in replace.values():
        _declare(graph, node, node_attrs(node))
    return len(replace)
