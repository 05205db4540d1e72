"""Naming and declaring one fallback function: its overload string and its FunctionProto."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx
from onnx import TensorProto, helper

from onnxq.formats.datatype import DataType, datatype
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode
from onnxq.graph.functions.body import _Body
from onnxq.graph.functions.dynamic import check_rank, dynamic_dims
from onnxq.graph.schemas import DOMAIN, OPS, input_names, output_names

OPSET = 21

# The fused activation op and DequantizeMX's run-time Shape input (docs/ops.md). Until the
# op table holds them they are declared here, so their fallbacks exist either way: a plain
# onnxruntime runs a model-local function whatever schema is registered.
_QDQ = "QuantizeDequantizeMX"
_QUANTIZE_ATTRS = ("dtype", "axis", "round_mode", "scale_mode", "nan_policy", "seed", "int_range")
OP_TYPES = tuple(OPS) + (() if _QDQ in OPS else (_QDQ,))

_OUTPUT_TYPES = {TensorProto.FLOAT: "f32", TensorProto.FLOAT16: "f16", TensorProto.BFLOAT16: "bf16"}


def _as_dtype(dtype: DataType | str) -> DataType:
    return dtype if isinstance(dtype, DataType) else datatype(dtype)


def _io(op_type: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The op's input names, output names and attributes (OPS, or the contract above)."""
    if op_type in OPS:
        ins, outs = input_names(op_type), output_names(op_type)
        attrs = tuple(OPS[op_type].attributes)
    else:
        ins, outs, attrs = ("X",), ("Y",), _QUANTIZE_ATTRS
    if op_type == "DequantizeMX" and "Shape" not in ins:
        ins += ("Shape",)
    return ins, outs, attrs


def _check_geometry(shape: Sequence[int], axis: int) -> tuple[tuple[int, ...], int]:
    dims = tuple(int(d) for d in shape)
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"a static, non-empty shape is needed, got {list(shape)}")
    if not -len(dims) <= axis < len(dims):
        raise ValueError(f"axis {axis} is out of range for shape {list(dims)}")
    return dims, axis % len(dims)


def overload_name(op_type: str, attrs: Mapping[str, Any], shape: Sequence[int]) -> str:
    """The overload string that identifies one specialization of ``op_type``.

    It is built from the canonical data type code and every attribute that changes the body,
    so equal nodes share one function: ``s4x64`` names a static shape, ``r3`` a body of rank 3
    that reads X's sizes at run time. Only
    ``[a-z0-9_]`` characters are used.
    """
    dt = _as_dtype(attrs.get("dtype", ""))
    if dynamic_dims(shape):  # the body reads the sizes at run time
        rank, axis = check_rank(list(shape), int(attrs.get("axis", -1)), op_type)
        geometry = f"r{rank}"
    else:
        dims, axis = _check_geometry(shape, int(attrs.get("axis", -1)))
        geometry = "s" + "x".join(str(d) for d in dims)
    parts = [dt.code, f"a{axis}", geometry]
    if op_type in ("QuantizeMX", _QDQ):
        parts += [
            RoundMode.parse(attrs.get("round_mode", "even")).value,
            ScaleMode.parse(attrs.get("scale_mode", "floor")).value,
            NanPolicy.parse(attrs.get("nan_policy", "element")).value,
            f"seed{int(attrs.get('seed', 0))}",
            str(attrs.get("int_range", "symmetric")),
        ]
        if int(attrs.get("num_outputs", 6)) != 6:
            parts.append(f"o{int(attrs['num_outputs'])}")
    else:
        parts.append(_OUTPUT_TYPES[_output_type(attrs.get("output_type", TensorProto.FLOAT))])
    if op_type == "MatMulMX" and int(attrs.get("trans_b", 0)):
        parts.append("tb")  # Q holds W = B^T (a transposed product in the body)
    text = "_".join(parts).lower()
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in text)


def _output_type(value: Any) -> int:
    out = int(value)
    if out not in _OUTPUT_TYPES:
        raise ValueError(f"output_type {out}: expected 1 (float), 10 (float16) or 16 (bfloat16)")
    return out


def _function(
    op_type: str,
    overload: str,
    body: _Body,
    num_outputs: int | None = None,
) -> onnx.FunctionProto:
    """The FunctionProto of ``body``: every input of the op and its first ``num_outputs``."""
    ins, outs, attrs = _io(op_type)
    fn = helper.make_function(
        DOMAIN,
        op_type,
        list(ins),
        list(outs[:num_outputs]),
        body.nodes,
        [helper.make_opsetid("", OPSET)],
        list(attrs),
        doc_string=f"onnxq {op_type} for {overload}: standard-ONNX fallback",
    )
    fn.overload = overload
    return fn
