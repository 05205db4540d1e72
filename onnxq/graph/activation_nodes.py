"""The nodes that quantize one activation at run time, whatever its shape.

`activation_nodes` turns one planned activation (`onnxq.graph.plan.ActivationPlan`) into the
onnxq nodes that compute its quantized values, and the value_info their outputs need
(onnxruntime cannot infer the types of custom-op outputs):

- ``fuse=True``: one ``QuantizeDequantizeMX`` node, ``Y = DequantizeMX(QuantizeMX(X))`` in one
  pass, ``Y`` of X's shape and type;
- ``fuse=False``: ``QuantizeMX -> DequantizeMX``. DequantizeMX learns X's shape from its
  ``shape`` attribute when every dim is known and positive before run time, and otherwise
  from its ``Shape`` input, fed by a ``Shape(X)`` node (docs/ops.md), so symbolic, ``-1``,
  unknown and zero dims all work.

The outputs are declared with X's dims, symbolic names kept, so shape inference downstream
sees what it saw before the rewrite.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import TensorProto, helper

from onnxq.formats.codebook import Codebook
from onnxq.graph.plan import ActivationPlan
from onnxq.graph.schemas import DOMAIN, OPS, input_index, output_types

__all__ = ["activation_nodes"]

Nodes = tuple[list[onnx.NodeProto], list[onnx.ValueInfoProto], str]


def _keys(names: tuple[str, ...]) -> tuple[str, ...]:
    """The op contract's names as tensor-name suffixes: ``Scale?`` -> ``scale``."""
    return tuple(n.rstrip("?").lower() for n in names)


def activation_nodes(entry: ActivationPlan, fresh: Callable[[str], str], fuse: bool) -> Nodes:
    """The nodes that quantize ``entry``'s tensor, their outputs' value_info, and the output.

    Args:
        entry: the planned activation (its rank is known; its dims need not be).
        fresh: returns an unused tensor or node name from a base name.
        fuse: one QuantizeDequantizeMX node instead of the QuantizeMX -> DequantizeMX pair.

    Returns:
        ``(nodes in execution order, value_info of their outputs, the dequantized tensor)``.

    Raises:
        ValueError: a codebook format (codebooks are for weights).
    """
    if isinstance(entry.dtype.nspec, Codebook):
        raise ValueError(
            f"activation {entry.tensor!r}: codebook formats ({entry.dtype.name}) are for "
            "weights; choose a non-codebook activation format"
        )
    base = entry.tensor
    attrs = {
        "dtype": entry.dtype.code,
        "axis": entry.axis,
        "round_mode": entry.round_mode,
        "scale_mode": entry.scale_mode,
    }
    dims = list(entry.dims if entry.dims is not None else entry.shape or [])
    y = fresh(f"{base}__dqx")
    y_info = helper.make_tensor_value_info(y, entry.elem_type, dims)
    if fuse:
        node = helper.make_node(
            "QuantizeDequantizeMX", [base], [y], name=fresh(f"{base}__qdq"), domain=DOMAIN, **attrs
        )
        return [node], [y_info], y
    static = tuple(int(d) for d in entry.shape or ()) if entry.static else None
    types = output_types("QuantizeMX", attrs, static)
    outs = [
        fresh(f"{base}__{k}") if elem else ""
        for k, (elem, _) in zip(_keys(OPS["QuantizeMX"].outputs), types, strict=True)
    ]
    infos = [
        helper.make_tensor_value_info(name, elem, shape)
        for name, (elem, shape) in zip(outs, types, strict=True)
        if name
    ]
    while not outs[-1]:
        outs.pop()
    qx = helper.make_node(
        "QuantizeMX", [base], outs, name=fresh(f"{base}__qx"), domain=DOMAIN, **attrs
    )
    dq_attrs = {"dtype": entry.dtype.code, "axis": entry.axis, "output_type": entry.elem_type}
    nodes = [qx]
    if static is not None:
        dq_attrs["shape"] = list(static)
    else:  # X's shape at run time, through DequantizeMX's Shape input
        shape_out = fresh(f"{base}__shape")
        nodes.append(helper.make_node("Shape", [base], [shape_out], name=fresh(f"{base}__shp")))
        infos.append(helper.make_tensor_value_info(shape_out, TensorProto.INT64, [len(dims)]))
        at = input_index("DequantizeMX", "Shape")
        outs = [*outs, *[""] * (at - len(outs)), shape_out]
    nodes.append(
        helper.make_node(
            "DequantizeMX", outs, [y], name=fresh(f"{base}__dqa"), domain=DOMAIN, **dq_attrs
        )
    )
    return nodes, [*infos, y_info], y
