"""Fallback functions for whole models: one per node specialization, and inlining them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx
import onnx.inliner
from onnx import TensorProto, helper

from onnxq.graph.functions.dequantize import codebook_lookup_function, dequantize_mx_function
from onnxq.graph.functions.gather import gather_mx_function
from onnxq.graph.functions.quantize import quantize_mx_function
from onnxq.graph.functions.signature import OP_TYPES, OPSET
from onnxq.graph.schemas import DOMAIN
from onnxq.graph.walk import node_attrs


def build_function(
    op_type: str, attrs: Mapping[str, Any], shape: Sequence[int]
) -> onnx.FunctionProto:
    """The function for one node: ``op_type``, its attributes and X's static shape.

    For DequantizeMX, CodebookLookup and GatherMX ``shape`` is the ``shape`` attribute (the
    table's shape for GatherMX); for QuantizeMX
    it is the input's shape, and ``attrs`` may hold ``num_outputs`` (the node's output count,
    not an op attribute).

    Raises:
        NotImplementedError: the format has no bit-exact standard-ONNX body yet.
        ValueError: unknown op type, missing ``dtype`` or bad attribute values.
    """
    if "dtype" not in attrs:
        raise ValueError(f"{op_type}: the dtype attribute is required")
    axis = int(attrs.get("axis", -1))
    if op_type == "DequantizeMX":
        return dequantize_mx_function(
            attrs["dtype"], axis, shape, int(attrs.get("output_type", TensorProto.FLOAT))
        )
    if op_type == "CodebookLookup":
        return codebook_lookup_function(
            attrs["dtype"], axis, shape, int(attrs.get("output_type", TensorProto.FLOAT))
        )
    if op_type == "GatherMX":
        return gather_mx_function(
            attrs["dtype"], axis, shape, int(attrs.get("output_type", TensorProto.FLOAT))
        )
    if op_type == "QuantizeMX":
        return quantize_mx_function(
            attrs["dtype"],
            axis,
            shape,
            round_mode=attrs.get("round_mode", "even"),
            scale_mode=attrs.get("scale_mode", "floor"),
            nan_policy=attrs.get("nan_policy", "element"),
            seed=int(attrs.get("seed", 0)),
            int_range=attrs.get("int_range", "symmetric"),
            num_outputs=int(attrs.get("num_outputs", 6)),
        )
    raise ValueError(f"unknown onnxq op {op_type!r}: expected one of {', '.join(OP_TYPES)}")


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    graph = model.graph
    for info in [*graph.input, *graph.value_info, *graph.output]:
        dims = info.type.tensor_type.shape.dim
        if info.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            found[info.name] = [d.dim_value for d in dims]
    for init in graph.initializer:
        found[init.name] = list(init.dims)
    return found


def embed_functions(
    model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None = None
) -> onnx.ModelProto:
    """Add the fallback function of every onnxq node of the main graph, in place.

    Each node gets the overload of its specialization (`overload_name`); equal nodes share a
    function. The model gets the ``onnxq`` v1 and ai.onnx opset 21 imports if missing and IR
    version 10 at least (the ``overload`` field).

    Args:
        model: the model to change.
        shapes: static shapes of QuantizeMX inputs not declared in the graph.

    Returns:
        ``model``.

    Raises:
        NotImplementedError: a node's format has no bit-exact fallback.
        ValueError: a QuantizeMX input without a static shape, or bad attributes.
    """
    known = _static_shapes(model)
    known.update({k: list(v) for k, v in (shapes or {}).items()})
    have = {(f.domain, f.name, f.overload) for f in model.functions}
    for node in model.graph.node:
        if node.domain != DOMAIN or node.op_type not in OP_TYPES:
            continue
        attrs = node_attrs(node)
        if node.op_type == "QuantizeMX":
            if node.input[0] not in known:
                raise ValueError(
                    f"QuantizeMX node {node.name!r}: input {node.input[0]!r} has no static "
                    f"shape; pass shapes={{...}}"
                )
            shape = known[node.input[0]]
        else:
            shape = list(attrs.get("shape", []))
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
