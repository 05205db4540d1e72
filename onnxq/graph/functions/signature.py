"""Naming and declaring one fallback function: its overload string and its FunctionProto."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx
from onnx import TensorProto, helper

from onnxq.formats.datatype import DataType, datatype
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode
from onnxq.graph.functions.body import _Body
from onnxq.graph.schemas import DOMAIN, OPS, input_names, output_names

OPSET = 21
OP_TYPES = tuple(OPS)

_OUTPUT_TYPES = {TensorProto.FLOAT: "f32", TensorProto.FLOAT16: "f16", TensorProto.BFLOAT16: "bf16"}


def _as_dtype(dtype: DataType | str) -> DataType:
    return dtype if isinstance(dtype, DataType) else datatype(dtype)


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
    so equal nodes share one function. Only ``[a-z0-9_]`` characters are used.
    """
    dt = _as_dtype(attrs.get("dtype", ""))
    dims, axis = _check_geometry(shape, int(attrs.get("axis", -1)))
    parts = [dt.code, f"a{axis}", "s" + "x".join(str(d) for d in dims)]
    if op_type == "QuantizeMX":
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
    text = "_".join(parts).lower()
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in text)


def _output_type(value: Any) -> int:
    out = int(value)
    if out not in _OUTPUT_TYPES:
        raise ValueError(f"output_type {out}: expected 1 (float), 10 (float16) or 16 (bfloat16)")
    return out


def _function(
    op_type: str, overload: str, body: _Body, num_outputs: int | None = None
) -> onnx.FunctionProto:
    fn = helper.make_function(
        DOMAIN,
        op_type,
        list(input_names(op_type)),
        list(output_names(op_type)[:num_outputs]),
        body.nodes,
        [helper.make_opsetid("", OPSET)],
        list(OPS[op_type].attributes),
        doc_string=f"onnxq {op_type} for {overload}: standard-ONNX fallback",
    )
    fn.overload = overload
    return fn
