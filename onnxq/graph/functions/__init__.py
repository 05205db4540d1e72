"""Standard-ONNX function bodies for the onnxq ops (the fallback when no library is loaded).

Every ``onnxq`` node (`docs/ops.md`) can be backed by a model-local `FunctionProto` of the same
domain and name whose body uses only ai.onnx opset 21 and gives the reference engine's bits.
A body is specialized for one node: its data type, axis, static shape and output type decide
the tables, reshapes and bit offsets, so two nodes of the same op with different attributes
need two functions.

Specialization uses the ``overload`` field of ONNX IR 10 (`FunctionProto.overload` and
`NodeProto.overload`): each function is named ``(onnxq, op_type, overload)`` with the overload
string from `overload_name`, and `embed_functions` sets the same string on each node.
onnxruntime (checked with 1.32) resolves a node to the function with its overload. The onnx
reference evaluator does not: it keys functions by ``(domain, name)`` only (the last one wins)
and it also refuses a call with fewer inputs than the function declares. Run such a model
through `inline_for_reference` first (``onnx.inliner.inline_local_functions``, which honours
overloads) and the reference evaluator computes the same bits. onnxruntime also needs a
function to declare exactly as many outputs as its node, so a QuantizeMX function declares the
first ``len(node.output)`` outputs (part of the overload when fewer than six); DequantizeMX
and CodebookLookup nodes may omit trailing optional inputs.

Exactness rules the bodies follow:

- element codes decode by a ``Gather`` on a table of all ``2^bits`` values (float32 holds each
  value of every format of at most 8 bits exactly), or, for 16-bit codes, from their sign,
  exponent and mantissa fields with a power-of-two table, never with ``Pow``;
- a scale is applied with one multiplication by an exactly representable float32 power of two
  (E8M0 and the MX shift bit are folded into one table index), so the one rounding of the
  product is the reference's one rounding of its exact float64 product;
- exponents are found by binary search on power-of-two tables and element rounding by a
  nearest-value search on the element's value table, with ties decided on the code (even),
  so no float ``log2``, ``Pow`` or division is involved.

What the builders refuse (`NotImplementedError` naming the format): QuantizeMX for float
scales, zero points, codebooks, N:M sparsity, unscaled casts, stochastic rounding and the
scale modes midmax/option3/topbinade/rceil/even for float elements; element or scale codes of
more than 16 bits other than IEEE float32 scales. One documented limitation of the
float32-scale decode (there is no bit cast in opset 21): a float32 tensor scale or zero point
whose bits are a NaN with a payload other than the quiet NaN decodes to the quiet NaN of the
same sign; `onnxq.cast` never writes such codes.

Modules: `body` (the graph writer, bit streams, tile geometry), `values` (exact decoding of
codes and power-of-two tables), `signature` (overload names, the FunctionProto of an op, its
inputs and outputs read from `onnxq.graph.schemas.OPS`), `dequantize` (DequantizeMX,
CodebookLookup), `quantize` (QuantizeMX) and `embed` (whole models).
"""

# The body writer and table helpers stay importable from here: onnxq.graph.lower builds its
# standard-ONNX lowerings with them.
from onnxq.graph.functions.body import _Body as _Body
from onnxq.graph.functions.body import _expand as _expand
from onnxq.graph.functions.body import _grid_shape as _grid_shape
from onnxq.graph.functions.body import _tiled_dims as _tiled_dims
from onnxq.graph.functions.dequantize import codebook_lookup_function, dequantize_mx_function
from onnxq.graph.functions.embed import (
    build_function,
    embed_functions,
    fallback_shape,
    inline_for_reference,
)
from onnxq.graph.functions.quantize import quantize_mx_function
from onnxq.graph.functions.signature import OP_TYPES, OPSET, overload_name
from onnxq.graph.functions.values import _exponent_table as _exponent_table
from onnxq.graph.functions.values import _value_table as _value_table
from onnxq.graph.schemas import DOMAIN

__all__ = [
    "DOMAIN",
    "OPSET",
    "OP_TYPES",
    "build_function",
    "codebook_lookup_function",
    "dequantize_mx_function",
    "embed_functions",
    "fallback_shape",
    "inline_for_reference",
    "overload_name",
    "quantize_mx_function",
]
