"""The GatherMX fallback: the table's DequantizeMX (or CodebookLookup) body, then ``Gather``.

The body decodes the whole table exactly as the DequantizeMX fallback does and gathers its rows
with a standard ``Gather`` on axis 0 (negative indices count from the end, as GatherMX's), so
it has the bits of DequantizeMX followed by Gather, which the native kernel also gives.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import TensorProto, helper

from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.graph.functions.body import _Body
from onnxq.graph.functions.dequantize import codebook_lookup_function, dequantize_mx_function
from onnxq.graph.functions.signature import (
    _as_dtype,
    _check_geometry,
    _function,
    _output_type,
    overload_name,
)

_TABLE = "gmx_table"  # the decoded table inside the body (the DequantizeMX body's "Y")


def gather_mx_function(
    dtype: DataType | str,
    axis: int,
    shape: Sequence[int],
    output_type: int = TensorProto.FLOAT,
) -> onnx.FunctionProto:
    """The GatherMX body for one data type, tile axis, table shape and output type.

    Raises:
        NotImplementedError: the table's format has no bit-exact standard-ONNX decode.
        ValueError: an N:M sparse data type (GatherMX does not take one), bad shape, axis or
            output type.
    """
    dt = _as_dtype(dtype)
    dims, ax = _check_geometry(shape, axis)
    out = _output_type(output_type)
    if dt.sspec is not None and dt.sspec.sparsity[1]:
        raise ValueError(f"{dt.name}: GatherMX does not take N:M sparse tables")
    if isinstance(dt.nspec, Codebook):
        table_fn = codebook_lookup_function(dt, ax, dims, out)
    else:
        table_fn = dequantize_mx_function(dt, ax, dims, out)
    body = _Body("gmx")
    for node in table_fn.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.output[:] = [_TABLE if o == "Y" else o for o in copy.output]
        body.nodes.append(copy)
    body.nodes.append(helper.make_node("Gather", [_TABLE, "Indices"], ["Y"], axis=0))
    attrs = {"dtype": dt.code, "axis": ax, "output_type": out}
    return _function("GatherMX", overload_name("GatherMX", attrs, dims), body)
