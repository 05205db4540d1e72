"""Fallback functions for whole models: one per node specialization, and inlining them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx
import onnx.inliner
from onnx import TensorProto, helper

from onnxq.formats.datatype import DataType, datatype
from onnxq.graph.functions.dequantize import codebook_lookup_function, dequantize_mx_function
from onnxq.graph.functions.dequantize_dynamic import dequantize_mx_dynamic
from onnxq.graph.functions.dynamic import dynamic_dims
from onnxq.graph.functions.gather import gather_mx_function
from onnxq.graph.functions.matmul import matmul_mx_function
from onnxq.graph.functions.quantize import quantize_mx_function
from onnxq.graph.functions.quantize_dynamic import (
    quantize_dequantize_mx_function,
    quantize_mx_dynamic,
)
from onnxq.graph.functions.signature import OP_TYPES, OPSET
from onnxq.graph.schemas import DOMAIN
from onnxq.graph.walk import node_attrs


def build_function(
    op_type: str, attrs: Mapping[str, Any], shape: Sequence[int | None]
) -> onnx.FunctionProto:
    """The function for one node: ``op_type``, its attributes and X's shape.

    For DequantizeMX, CodebookLookup, MatMulMX (B's, or W's with ``trans_b``) and GatherMX (the
    table's) ``shape`` is the ``shape`` attribute; for QuantizeMX and QuantizeDequantizeMX it is
    the input's shape, and ``attrs`` may hold ``num_outputs`` (a QuantizeMX node's output
    count, not an op attribute). A shape whose rank is known but some dims are not (None) gets
    a body that reads the sizes at run time: from ``Shape(X)`` for QuantizeMX, from the
    ``Shape`` input for DequantizeMX; QuantizeDequantizeMX always reads them. A static shape
    keeps its static body.

    Raises:
        NotImplementedError: the format has no bit-exact standard-ONNX body yet.
        ValueError: unknown op type, missing ``dtype`` or bad attribute values.
    """
    if "dtype" not in attrs:
        raise ValueError(f"{op_type}: the dtype attribute is required")
    axis = int(attrs.get("axis", -1))
    dynamic = dynamic_dims(shape)
    if op_type in ("QuantizeMX", "QuantizeDequantizeMX"):
        return _quantizer(op_type, attrs, shape, dynamic)
    if op_type == "DequantizeMX" and dynamic:
        return dequantize_mx_dynamic(
            attrs["dtype"], axis, shape, int(attrs.get("output_type", TensorProto.FLOAT))
        )
    if op_type == "CodebookLookup" and dynamic:
        raise NotImplementedError(
            "CodebookLookup on unknown dims: codebooks are weight formats, whose shapes are static"
        )
    if op_type == "DequantizeMX":
        return dequantize_mx_function(
            attrs["dtype"], axis, shape, int(attrs.get("output_type", TensorProto.FLOAT))
        )
    if op_type == "CodebookLookup":
        return codebook_lookup_function(
            attrs["dtype"], axis, shape, int(attrs.get("output_type", TensorProto.FLOAT))
        )
    if op_type == "MatMulMX":
        return matmul_mx_function(
            attrs["dtype"],
            axis,
            shape,
            int(attrs.get("output_type", TensorProto.FLOAT)),
            int(attrs.get("trans_b", 0)),
        )
    if op_type == "GatherMX":
        return gather_mx_function(
            attrs["dtype"], axis, shape, int(attrs.get("output_type", TensorProto.FLOAT))
        )
    raise ValueError(f"unknown onnxq op {op_type!r}: expected one of {', '.join(OP_TYPES)}")


def _quantizer(
    op_type: str, attrs: Mapping[str, Any], shape: Sequence[int | None], dynamic: bool
) -> onnx.FunctionProto:
    """QuantizeMX (static or run-time sizes) and QuantizeDequantizeMX (run-time sizes)."""
    modes = {
        "round_mode": attrs.get("round_mode", "even"),
        "scale_mode": attrs.get("scale_mode", "floor"),
        "nan_policy": attrs.get("nan_policy", "element"),
        "seed": int(attrs.get("seed", 0)),
        "int_range": attrs.get("int_range", "symmetric"),
    }
    axis = int(attrs.get("axis", -1))
    if op_type == "QuantizeDequantizeMX":
        return quantize_dequantize_mx_function(attrs["dtype"], axis, shape, **modes)
    outputs = int(attrs.get("num_outputs", 6))
    spec = (
        attrs["dtype"] if isinstance(attrs["dtype"], DataType) else datatype(attrs["dtype"])
    ).sspec
    if dynamic or (spec is not None and not spec.scale.is_exponent):  # float scales: one body
        return quantize_mx_dynamic(attrs["dtype"], axis, shape, num_outputs=outputs, **modes)
    dims = [int(d) for d in shape if d is not None]
    return quantize_mx_function(attrs["dtype"], axis, dims, num_outputs=outputs, **modes)


def _graph_shapes(graph: onnx.GraphProto) -> dict[str, list[int | None]]:
    """Declared shapes of a graph's tensors: None for a dim without a value (rank known)."""
    found: dict[str, list[int | None]] = {}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        if info.type.tensor_type.HasField("shape"):
            dims = info.type.tensor_type.shape.dim
            found[info.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    for init in graph.initializer:
        found[init.name] = list(init.dims)
    return found


def _shape_rank(
    name: str, shapes: Mapping[str, Sequence[int | None]], producers: Mapping[str, onnx.NodeProto]
) -> int | None:
    """The length of the 1-D int64 tensor ``name`` (a shape), or None when unknown.

    It is the ``Shape`` node's slice of its input's rank, or the tensor's own declared length.
    """
    node = producers.get(name)
    if node is not None and node.op_type == "Shape" and node.domain in ("", "ai.onnx"):
        source = shapes.get(node.input[0])
        if source is not None:
            attrs = node_attrs(node)
            return len(range(len(source))[attrs.get("start", 0) : attrs.get("end", None)])
    own = shapes.get(name)
    if own is not None and len(own) == 1 and own[0] is not None:
        return int(own[0])
    return None


def fallback_shape(
    node: onnx.NodeProto,
    shapes: Mapping[str, Sequence[int | None]],
    producers: Mapping[str, onnx.NodeProto],
) -> list[int | None] | None:
    """X's shape for the fallback of one onnxq node (None dims unknown), None when unknown.

    QuantizeMX and QuantizeDequantizeMX: X's shape in ``shapes``. DequantizeMX with a
    ``Shape`` input (the 7th) and no static ``shape`` attribute: one None per dim (the body
    reads them all at run time), the rank from the ``shape`` attribute, the ``Shape`` node
    that feeds it, or that input's declared length. Otherwise the ``shape`` attribute.

    Raises:
        ValueError: a DequantizeMX ``shape`` attribute with unknown (-1) dims and no ``Shape``
            input: no body could learn X's shape.
    """
    if node.op_type in ("QuantizeMX", "QuantizeDequantizeMX"):
        found = shapes.get(node.input[0]) if node.input else None
        return None if found is None else list(found)
    attr = [int(d) for d in node_attrs(node).get("shape", [])]
    static = bool(attr) and all(d > 0 for d in attr)
    if node.op_type == "DequantizeMX" and len(node.input) > 6 and node.input[6] and not static:
        rank = len(attr) if attr else _shape_rank(node.input[6], shapes, producers)
        return None if rank is None else [None] * rank
    if node.op_type == "DequantizeMX" and attr and not static:
        raise ValueError(
            f"DequantizeMX node {node.name!r}: attribute shape {attr} has unknown dims and no "
            "Shape input gives X's shape at run time; feed Shape(X) as its 7th input"
        )
    return attr


def embed_functions(
    model: onnx.ModelProto, shapes: Mapping[str, Sequence[int | None]] | None = None
) -> onnx.ModelProto:
    """Add the fallback function of every onnxq node of the main graph, in place.

    Each node gets the overload of its specialization (`overload_name`); equal nodes share a
    function. The model gets the ``onnxq`` v1 and ai.onnx opset 21 imports if missing and IR
    version 10 at least (the ``overload`` field). Shapes with unknown dims (symbolic, None)
    get bodies that read the sizes at run time (`fallback_shape`).

    Args:
        model: the model to change.
        shapes: shapes of QuantizeMX inputs not declared in the graph (None: unknown dim).

    Returns:
        ``model``.

    Raises:
        NotImplementedError: a node's format has no bit-exact fallback.
        ValueError: a QuantizeMX input of unknown rank, or bad attributes.
    """
    known = _graph_shapes(model.graph)
    known.update({k: list(v) for k, v in (shapes or {}).items()})
    producers = {o: n for n in model.graph.node for o in n.output}
    have = {(f.domain, f.name, f.overload) for f in model.functions}
    for node in model.graph.node:
        if node.domain != DOMAIN or node.op_type not in OP_TYPES:
            continue
        attrs = node_attrs(node)
        shape = fallback_shape(node, known, producers)
        if shape is None:
            raise ValueError(
                f"{node.op_type} node {node.name!r}: the rank of X is unknown; declare "
                f"{node.input[0]!r}'s shape or pass shapes={{...}}"
            )
        if node.op_type == "QuantizeMX":
            attrs["num_outputs"] = len(node.output)
        fn = build_function(node.op_type, attrs, shape)
        node.overload = fn.overload
        key = (fn.domain, fn.name, fn.overload)
        if key not in have:
            model.functions.append(fn)
            have.add(key)
    imports = {op.domain: op for op in model.opset_import}
    if DOMAIN not in imports:
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    if "" not in imports and "ai.onnx" not in imports:
        model.opset_import.append(helper.make_opsetid("", OPSET))
    model.ir_version = max(model.ir_version, 10)
    return model


def inline_for_reference(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with its local functions inlined, for `onnx.reference`.

    The reference evaluator ignores ``overload`` and rejects calls that omit trailing optional
    inputs; the inliner resolves overloads correctly, so the inlined model computes the same
    bits as onnxruntime running the functions.
    """
    return onnx.inliner.inline_local_functions(model)
