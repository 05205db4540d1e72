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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.inliner
from onnx import TensorProto, helper, numpy_helper

from onnxq.cast.elements import nan_code
from onnxq.cast.layout import Tiling
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType, datatype
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode
from onnxq.formats.number import InfNaN, Kind, NumberSpec

__all__ = [
    "DOMAIN",
    "OPSET",
    "OP_TYPES",
    "build_function",
    "codebook_lookup_function",
    "dequantize_mx_function",
    "embed_functions",
    "inline_for_reference",
    "overload_name",
    "quantize_mx_function",
]

DOMAIN = "onnxq"
OPSET = 21
OP_TYPES = ("QuantizeMX", "DequantizeMX", "CodebookLookup")

_OUTPUT_TYPES = {TensorProto.FLOAT: "f32", TensorProto.FLOAT16: "f16", TensorProto.BFLOAT16: "bf16"}
_INPUTS = {
    "DequantizeMX": ["Q", "Scale", "Zero", "TenScale", "Meta", "Mask"],
    "CodebookLookup": ["Q", "Meta", "Scale", "Table"],
    "QuantizeMX": ["X"],
}
_OUTPUTS = {
    "DequantizeMX": ["Y"],
    "CodebookLookup": ["Y"],
    "QuantizeMX": ["Q", "Scale", "Zero", "TenScale", "Meta", "Mask"],
}
_ATTRIBUTES = {
    "DequantizeMX": ["dtype", "axis", "shape", "output_type"],
    "CodebookLookup": ["dtype", "axis", "shape", "output_type"],
    "QuantizeMX": [
        "dtype",
        "axis",
        "round_mode",
        "scale_mode",
        "nan_policy",
        "seed",
        "int_range",
    ],
}
_F32_MIN_EXP = -149  # 2^-149: the smallest float32 subnormal
_F32_MAX_EXP = 127


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


# -- exact value helpers ----------------------------------------------------------------------
def _pow2_f32(k: int) -> np.float32:
    if not _F32_MIN_EXP <= k <= _F32_MAX_EXP:
        raise ValueError(k)
    return np.float32(math.ldexp(1.0, k))


def _value_table(spec: NumberSpec) -> np.ndarray:
    """float32 values of every code of ``spec`` (<= 8 bits; NaN codes read as quiet NaN)."""
    values = np.array([spec.decode(c) for c in range(1 << spec.bits)], dtype=np.float64)
    table = values.astype(np.float32)
    finite = np.isfinite(values)
    if not np.array_equal(table[finite].astype(np.float64), values[finite]):
        raise NotImplementedError(f"{spec}: values not exact in float32")
    return table


def _decode(body: _Body, codes: str, spec: NumberSpec, what: str) -> str:
    """Exact float32 values of int64 ``codes`` of ``spec`` (same shape)."""
    if spec.bits <= 8:
        return body.gather(_value_table(spec), codes)
    if spec.kind in (Kind.INT, Kind.UINT) and spec.bits <= 24:
        if spec.kind is Kind.INT:
            negative = body.op("GreaterOrEqual", codes, body.const(1 << (spec.bits - 1), np.int64))
            wrapped = body.op("Sub", codes, body.const(1 << spec.bits, np.int64))
            codes = body.where(negative, wrapped, codes)
        return body.cast(codes, TensorProto.FLOAT)
    if spec.kind is Kind.FLOAT and spec.bits <= 32 and spec.mbits <= 23:
        return _decode_float_fields(body, codes, spec, what)
    raise NotImplementedError(f"{what} {spec}: decoding {spec.bits}-bit codes in a function body")


def _decode_float_fields(body: _Body, codes: str, spec: NumberSpec, what: str) -> str:
    """Sign, exponent field and mantissa -> float32, exactly (values must fit float32).

    Value = (mantissa + implicit bit) * 2^-mbits * 2^(max(field, 1) - bias): the first product
    is exact (mbits + 1 <= 24 bits), the second is exact because the value is a float32.
    """
    emask, mmask = (1 << spec.ebits) - 1, (1 << spec.mbits) - 1
    exponents = [max(f, 1) - spec.bias for f in range(emask)]
    if min(exponents) - spec.mbits < _F32_MIN_EXP or max(exponents) > _F32_MAX_EXP:
        raise NotImplementedError(f"{what} {spec}: values outside float32")
    powers = np.array([_pow2_f32(k) for k in exponents] + [np.float32(1.0)], dtype=np.float32)
    field = body.op("Div", codes, body.const(1 << spec.mbits, np.int64))
    field = body.op("BitwiseAnd", field, body.const(emask, np.int64))
    mant = body.op("BitwiseAnd", codes, body.const(mmask, np.int64))
    negative = body.op("GreaterOrEqual", codes, body.const(1 << (spec.bits - 1), np.int64))
    normal = body.cast(body.op("Greater", field, body.const(0, np.int64)), TensorProto.INT64)
    implicit = body.op("Mul", normal, body.const(1 << spec.mbits, np.int64))
    sig = body.cast(body.op("Add", mant, implicit), TensorProto.FLOAT)
    sig = body.op("Mul", sig, body.const(_pow2_f32(-spec.mbits)))
    mag = body.op("Mul", sig, body.gather(powers, field))
    special = _float_specials(body, codes, field, mant, spec)
    signed = body.where(negative, body.op("Neg", mag), mag)
    return body.where(special[0], special[1], signed) if special else signed


def _float_specials(
    body: _Body, codes: str, field: str, mant: str, spec: NumberSpec
) -> tuple[str, str] | None:
    """(is_special, value) for the Inf/NaN codes of ``spec`` (None when it has none)."""
    emask, mmask = (1 << spec.ebits) - 1, (1 << spec.mbits) - 1
    sign_bit = 1 << (spec.bits - 1)
    nan = body.const(np.float32(np.nan))
    negative = body.op("GreaterOrEqual", codes, body.const(sign_bit, np.int64))
    inf = body.where(negative, body.const(np.float32(-np.inf)), body.const(np.float32(np.inf)))
    top = body.op("Equal", field, body.const(emask, np.int64))
    zero_mant = body.op("Equal", mant, body.const(0, np.int64))
    match spec.infnan:
        case InfNaN.IEEE:
            neg_nan = body.op("Neg", nan)
            nan_val = body.where(negative, neg_nan, nan)
            return top, body.where(zero_mant, inf, nan_val)
        case InfNaN.FN:
            full = body.op("Equal", mant, body.const(mmask, np.int64))
            return body.op("And", top, full), nan
        case InfNaN.FNUZ:
            return body.op("Equal", codes, body.const(sign_bit, np.int64)), nan
        case InfNaN.INUZ:
            is_nan = body.op("Equal", codes, body.const(sign_bit, np.int64))
            mag = body.op("BitwiseAnd", codes, body.const(sign_bit - 1, np.int64))
            is_inf = body.op("Equal", mag, body.const(sign_bit - 1, np.int64))
            return body.op("Or", is_nan, is_inf), body.where(is_nan, nan, inf)
    return None


def _exponent_table(scale: NumberSpec, offset: int, shifts: int, what: str) -> np.ndarray:
    """Entry ``code * shifts + s`` = 2^(code - bias - offset - s); the top code is NaN."""
    top = (1 << scale.ebits) - 1
    entries = []
    for code in range(top + 1):
        for s in range(shifts):
            if code == top:
                entries.append(np.float32(np.nan))
                continue
            k = code - scale.bias - offset - s
            if not _F32_MIN_EXP <= k <= _F32_MAX_EXP:
                raise NotImplementedError(
                    f"{what}: scale factor 2^{k} is not a float32 value, so one multiplication "
                    f"cannot reproduce the reference rounding"
                )
            entries.append(_pow2_f32(k))
    return np.array(entries, dtype=np.float32)


# -- public: names and attributes -------------------------------------------------------------
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
        _INPUTS[op_type],
        _OUTPUTS[op_type][:num_outputs],
        body.nodes,
        [helper.make_opsetid("", OPSET)],
        _ATTRIBUTES[op_type],
        doc_string=f"onnxq {op_type} for {overload}: standard-ONNX fallback",
    )
    fn.overload = overload
    return fn


# -- DequantizeMX / CodebookLookup ------------------------------------------------------------
def _finish(body: _Body, y: str, output_type: int) -> None:
    if output_type == TensorProto.FLOAT:
        body.op("Identity", y, out="Y")
    else:
        body.op("Cast", y, out="Y", to=output_type)


def _kept_count(dt: DataType, dims: tuple[int, ...], axis: int) -> int:
    """How many codes N:M pruning keeps for ``dims`` (it keeps min(N, group length) per group)."""
    s = dt.sspec
    assert s is not None
    n_keep, m, index = s.sparsity
    tiling = Tiling.build(dims, axis, s)
    length = tiling.R if tiling.kind == "2d" and index == 0 else tiling.C
    others = math.prod(dims) // length
    return others * ((length // m) * n_keep + min(n_keep, length % m))


def _element_codes(
    body: _Body, dt: DataType, dims: tuple[int, ...], axis: int
) -> tuple[str, str | None]:
    """Element codes in X's shape (int64) and the N:M mask (bool, X's shape) if any.

    Q stores only kept codes: a kept position reads stored code number (kept positions
    before it), a pruned one reads code 0.
    """
    count = math.prod(dims)
    bits = dt.nspec.bits
    if not (1 <= bits <= 8 or bits == 16):
        raise NotImplementedError(f"{dt.name}: {bits}-bit element codes in a function body")
    s = dt.sspec
    if s is None or not s.sparsity[1]:
        return body.reshape(_unpack(body, "Q", bits, count), dims), None
    nkept = _kept_count(dt, dims, axis)
    stored = _unpack(body, "Q", bits, nkept)
    kept = body.cast(_unpack(body, "Mask", 1, count), TensorProto.BOOL)
    order = body.op("CumSum", body.cast(kept, TensorProto.INT64), body.const(0, np.int64),
                    exclusive=1)  # fmt: skip
    order = body.op("Min", order, body.const(max(nkept - 1, 0), np.int64))
    codes = body.where(kept, body.op("Gather", stored, order, axis=0), body.const(0, np.int64))
    return body.reshape(codes, dims), body.reshape(kept, dims)


def _zero_pruned(body: _Body, y: str, kept: str | None) -> str:
    if kept is None:
        return y
    return body.where(kept, y, body.const(np.float32(0.0)))


def _meta_per_element(
    body: _Body, dt: DataType, tiling: Tiling, dims: tuple[int, ...], meta_bits: int, name: str
) -> str:
    """Meta (subtile or tile grid, packed) -> int64 broadcastable to X."""
    if tiling.Sc:
        tiles = _tiled_dims(tiling, tiling.Sr, tiling.Sc)
    else:
        tiles = _tiled_dims(tiling, tiling.Tr, tiling.Tc)
    gshape = _grid_shape(dims, tiles)
    meta = _unpack(body, name, meta_bits, math.prod(gshape))
    return _expand(body, body.reshape(meta, gshape), dims, tiles)


def dequantize_mx_function(
    dtype: DataType | str,
    axis: int,
    shape: Sequence[int],
    output_type: int = TensorProto.FLOAT,
) -> onnx.FunctionProto:
    """The DequantizeMX body for one data type, axis, shape and output type.

    Raises:
        NotImplementedError: the format cannot be decoded bit-exactly with standard ops.
        ValueError: a codebook data type (use CodebookLookup), bad shape, axis or output type.
    """
    dt = _as_dtype(dtype)
    dims, ax = _check_geometry(shape, axis)
    out = _output_type(output_type)
    n, s = dt.nspec, dt.sspec
    if isinstance(n, Codebook):
        raise ValueError(f"{dt.name} is a codebook data type: upcast it with CodebookLookup")
    attrs = {"dtype": dt.code, "axis": ax, "output_type": out}
    body = _Body("dq")
    codes, kept = _element_codes(body, dt, dims, ax)
    if s is None:
        y = _decode(body, codes, n, f"{dt.name} element")
    elif s.scale.is_exponent:
        y = _dequantize_exponent(body, dt, dims, ax, codes, None)
    else:
        y = _dequantize_float_scale(body, dt, dims, ax, codes)
    y = _zero_pruned(body, y, kept)
    _finish(body, y, out)
    return _function("DequantizeMX", overload_name("DequantizeMX", attrs, dims), body)


def _dequantize_exponent(
    body: _Body,
    dt: DataType,
    dims: tuple[int, ...],
    axis: int,
    codes: str,
    table: np.ndarray | str | None,
) -> str:
    """Q * 2^(scale - bias - frac [- shift]) with one multiplication per element."""
    n, s = dt.nspec, dt.sspec
    assert s is not None
    tiling = Tiling.build(dims, axis, s)
    tiles = _tiled_dims(tiling, tiling.Tr, tiling.Tc)
    gshape = _grid_shape(dims, tiles)
    scale = body.cast(body.reshape("Scale", gshape), TensorProto.INT64)
    if isinstance(n, Codebook):
        meta = _meta_per_element(body, dt, tiling, dims, n.meta_bits, "Meta")
        width = 1 << n.index_bits
        flat = body.op("Add", body.op("Mul", meta, body.const(width, np.int64)), codes)
        if isinstance(table, np.ndarray):
            q = body.gather(table.reshape(-1), flat)
        else:
            q = body.op("Gather", body.reshape("Table", [-1]), flat, axis=0)
        factor_table = _exponent_table(s.scale, 0, 1, dt.name)
        factor = _expand(body, body.gather(factor_table, scale), dims, tiles)
        return body.op("Mul", q, factor)
    frac = n.int_fraction_bits
    q = _decode(body, codes, n, f"{dt.name} element")
    if tiling.Sc:  # MX9/6/4: the shift bit joins the scale code in one table index
        shift = _meta_per_element(body, dt, tiling, dims, 1, "Meta")
        wide = _expand(body, scale, dims, tiles)
        index = body.op("Add", body.op("Mul", wide, body.const(2, np.int64)), shift)
        factor = body.gather(_exponent_table(s.scale, frac, 2, dt.name), index)
    else:
        factor = _expand(
            body, body.gather(_exponent_table(s.scale, frac, 1, dt.name), scale), dims, tiles
        )
    return body.op("Mul", q, factor)


def _dequantize_float_scale(
    body: _Body, dt: DataType, dims: tuple[int, ...], axis: int, codes: str
) -> str:
    n, s = dt.nspec, dt.sspec
    assert s is not None
    tiling = Tiling.build(dims, axis, s)
    tiles = _tiled_dims(tiling, tiling.Tr, tiling.Tc)
    gshape = _grid_shape(dims, tiles)
    sc = _decode(
        body, body.cast(body.reshape("Scale", gshape), TensorProto.INT64), s.scale,
        f"{dt.name} scale",
    )  # fmt: skip
    q = _decode(body, codes, n, f"{dt.name} element")
    if s.zero is not None:
        zp = _decode(
            body, body.cast(body.reshape("Zero", gshape), TensorProto.INT64), s.zero,
            f"{dt.name} zero point",
        )  # fmt: skip
        sc_el = _expand(body, sc, dims, tiles)
        zp_el = _expand(body, zp, dims, tiles)
        if s.zero.is_float:
            y = body.op("Add", body.op("Mul", q, sc_el), zp_el)
        else:
            y = body.op("Mul", body.op("Sub", q, zp_el), sc_el)
    else:
        eff = sc
        if s.tenscale is not None:
            ts = _decode(
                body, body.cast(body.reshape("TenScale", [1]), TensorProto.INT64), s.tenscale,
                f"{dt.name} tensor scale",
            )  # fmt: skip
            eff = body.op("Mul", sc, ts)
        sc_el = _expand(body, sc, dims, tiles)
        y = body.op("Mul", q, _expand(body, eff, dims, tiles))
    return body.where(body.op("IsNaN", sc_el), body.const(np.float32(np.nan)), y)


def codebook_lookup_function(
    dtype: DataType | str,
    axis: int,
    shape: Sequence[int],
    output_type: int = TensorProto.FLOAT,
) -> onnx.FunctionProto:
    """The CodebookLookup body: ``table[meta, code] * 2^(scale - bias)``, NaN tiles NaN.

    Implicit codebooks embed their table as a constant; generic ones read the ``Table`` input.

    Raises:
        ValueError: not a codebook data type, bad shape, axis or output type.
        NotImplementedError: table values or scale factors not exact in float32.
    """
    dt = _as_dtype(dtype)
    dims, ax = _check_geometry(shape, axis)
    out = _output_type(output_type)
    n, s = dt.nspec, dt.sspec
    if not isinstance(n, Codebook) or s is None or not s.scale.is_exponent:
        raise ValueError(f"{dt.name} is not a codebook data type with an exponent scale")
    table: np.ndarray | None = None
    if n.is_implicit:
        values = np.asarray(n.table(), dtype=np.float64)
        table = values.astype(np.float32)
        if not np.array_equal(table.astype(np.float64), values):
            raise NotImplementedError(f"{dt.name}: codebook values not exact in float32")
    attrs = {"dtype": dt.code, "axis": ax, "output_type": out}
    body = _Body("cb")
    codes, kept = _element_codes(body, dt, dims, ax)
    y = _dequantize_exponent(body, dt, dims, ax, codes, table)
    y = _zero_pruned(body, y, kept)
    _finish(body, y, out)
    return _function("CodebookLookup", overload_name("CodebookLookup", attrs, dims), body)


# -- QuantizeMX -------------------------------------------------------------------------------
def _count_below(body: _Body, a: str, table: np.ndarray, *, strict: bool) -> str:
    """int64 count of entries of ascending ``table`` that are < ``a`` (or <= when not strict).

    A binary search: ``table`` is padded with +inf to a power of two, so NaN and +inf inputs
    are handled (NaN counts 0, +inf counts the finite entries).
    """
    size = 1 << max(len(table).bit_length(), 1)
    padded = np.full(size, np.inf, dtype=np.float32)
    padded[: len(table)] = table
    compare = "Less" if strict else "LessOrEqual"
    pos: str | None = None
    step = size // 2
    while step:
        cand = (
            body.const(step, np.int64)
            if pos is None
            else body.op("Add", pos, body.const(step, np.int64))
        )
        index = body.op("Sub", cand, body.const(1, np.int64))
        cond = body.op(compare, body.gather(padded, index), a)
        pos = body.where(cond, cand, body.const(0, np.int64) if pos is None else pos)
        step //= 2
    assert pos is not None
    return pos


def _max_finite_like(body: _Body, x: str) -> str:
    """The largest finite value of ``x``'s float type, as a float32 scalar.

    Each type's maximum cast to that type and back: the others come back Inf (or, truncating
    to bfloat16, not above its maximum), so the largest finite one is the type's own.
    """
    tops = np.array([np.finfo(np.float32).max, 2.0**128 - 2.0**120, 65504.0], np.float32)
    back = body.cast(body.op("CastLike", body.const(tops), x), TensorProto.FLOAT)
    finite = body.where(body.op("IsInf", back), body.const(np.float32(0.0)), back)
    return body.op("ReduceMax", finite, keepdims=0)


def _signbit(body: _Body, v: str) -> str:
    """True for negative values and -0 (1 / -0 = -inf)."""
    zero = body.const(np.float32(0.0))
    negative = body.op("Less", v, zero)
    neg_zero = body.op(
        "And",
        body.op("Equal", v, zero),
        body.op("Less", body.op("Div", body.const(np.float32(1.0)), v), zero),
    )
    return body.op("Or", negative, neg_zero)


def _magnitudes(spec: NumberSpec, full_range: bool, what: str) -> np.ndarray:
    """Non-negative finite values in code order; magnitude code = position (checked)."""
    if spec.is_int:
        top = (1 << (spec.bits - 1)) - (0 if full_range else 1)
        return np.arange(top + 1, dtype=np.float32)
    count = 0
    values: list[float] = []
    while count < 1 << (spec.bits - 1) and math.isfinite(spec.decode(count)):
        values.append(spec.decode(count))
        count += 1
    table = np.array(values, dtype=np.float32)
    if np.any(np.diff(table) <= 0) or not np.array_equal(table, np.array(values)):
        raise NotImplementedError(f"{what}: magnitude codes are not ordered float32 values")
    return table


def _quantize_support(
    dt: DataType, rmode: RoundMode, smode: ScaleMode, dims: tuple[int, ...]
) -> None:
    n, s = dt.nspec, dt.sspec
    name = dt.name
    if s is None:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: unscaled casts")
    if isinstance(n, Codebook):
        raise NotImplementedError(f"QuantizeMX fallback for {name}: codebook mapping selection")
    if not s.scale.is_exponent:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: float scales (only E8M0)")
    if s.sparsity[1]:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: N:M sparsity")
    if rmode is RoundMode.STOCHASTIC:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: stochastic rounding")
    if n.is_float and smode not in (ScaleMode.FLOOR, ScaleMode.CEIL):
        raise NotImplementedError(
            f"QuantizeMX fallback for {name}: scale mode {smode.value!r} (floor and ceil only)"
        )
    if n.bits > 8 or s.scale.bits > 8:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: codes over 8 bits")
    if n.is_float and n.emin - n.mbits - 1 <= -126:
        raise NotImplementedError(f"QuantizeMX fallback for {name}: elements finer than float32")
    del dims


def quantize_mx_function(
    dtype: DataType | str,
    axis: int,
    shape: Sequence[int],
    *,
    round_mode: RoundMode | str = "even",
    scale_mode: ScaleMode | str = "floor",
    nan_policy: NanPolicy | str = "element",
    seed: int = 0,
    int_range: str = "symmetric",
    num_outputs: int = 6,
) -> onnx.FunctionProto:
    """The QuantizeMX body (compress-mode outputs) for exponent-scaled float and int elements.

    Covers the OCP MX presets, mxint8/mxint4, bfp and MX9/6/4 (shift bits in ``Meta``) with
    round modes even/away/zero, either NaN policy and either int range; float elements with
    scale modes floor and ceil (int elements always use floor). ``Zero``, ``TenScale`` and
    ``Mask`` (and ``Meta`` without subtiles) are zero-size uint8 tensors. ``num_outputs``
    (2..6) is the node's output count: onnxruntime needs a function with exactly as many
    outputs as the node that calls it, so it is part of the overload when below 6.

    Raises:
        NotImplementedError: anything else, naming the format and what is missing.
        ValueError: bad shape, axis or attribute value.
    """
    dt = _as_dtype(dtype)
    dims, ax = _check_geometry(shape, axis)
    rmode, smode = RoundMode.parse(round_mode), ScaleMode.parse(scale_mode)
    policy = NanPolicy.parse(nan_policy)
    if int_range not in ("symmetric", "full"):
        raise ValueError(f"unknown int_range {int_range!r}: expected 'symmetric' or 'full'")
    _quantize_support(dt, rmode, smode, dims)
    if not 2 <= num_outputs <= 6:
        raise ValueError(f"QuantizeMX has 2 to 6 outputs (Q, Scale, ...), not {num_outputs}")
    n, s = dt.nspec, dt.sspec
    assert s is not None
    attrs = {
        "dtype": dt.code, "axis": ax, "round_mode": rmode.value, "scale_mode": smode.value,
        "nan_policy": policy.value, "seed": seed, "int_range": int_range,
        "num_outputs": num_outputs,
    }  # fmt: skip
    body = _Body("q")
    tiling = Tiling.build(dims, ax, s)
    tiles = _tiled_dims(tiling, tiling.Tr, tiling.Tc)
    gshape = _grid_shape(dims, tiles)
    x = body.cast("X", TensorProto.FLOAT)
    isnan = body.op("IsNaN", x)
    nonfinite = body.op("Or", isnan, body.op("IsInf", x))
    absx = body.where(nonfinite, body.const(np.float32(0.0)), body.op("Abs", x))
    amax = _reduce_tiles(body, absx, dims, tiles, "ReduceMax")

    # Scale: maxexp = floor(log2(amax)) by search on 2^-149 .. 2^127
    # (docs/architecture.md, decision 1).
    powers = np.array([_pow2_f32(k) for k in range(_F32_MIN_EXP, _F32_MAX_EXP + 1)])
    count = _count_below(body, amax, powers, strict=False)  # = maxexp + 150 for amax > 0
    top_index = body.op("Max", body.op("Sub", count, body.const(1, np.int64)),
                        body.const(0, np.int64))  # fmt: skip
    top_power = body.gather(powers, top_index)  # 2^maxexp (amax > 0)
    maxexp = body.op("Sub", count, body.const(1 - _F32_MIN_EXP, np.int64))
    if n.is_float and smode is ScaleMode.CEIL:
        bump = body.cast(body.op("Greater", amax, top_power), TensorProto.INT64)
        maxexp = body.op("Add", maxexp, bump)
    frac = n.int_fraction_bits
    low, high = -s.scale.bias, (1 << s.scale.ebits) - 2 - s.scale.bias
    stored = body.op("Add", maxexp, body.const(frac - n.emax, np.int64))
    stored = body.op("Clip", stored, body.const(low, np.int64), body.const(high, np.int64))
    positive = body.op("Greater", amax, body.const(np.float32(0.0)))
    stored = body.where(positive, stored, body.const(low, np.int64))

    # v = x * 2^-stored * 2^(frac + shift): the first product is exact unless it falls below
    # 2^-126, where the element rounds to zero either way (the caller checked the formats).
    inverse = np.array([_pow2_f32(-k) for k in range(low, high + 1)], dtype=np.float32)
    factor = body.gather(inverse, body.op("Sub", stored, body.const(low, np.int64)))
    v = body.op("Mul", x, _expand(body, factor, dims, tiles))
    meta_out: str | None = None
    if tiling.Sc:  # MX9/6/4: shift a subtile whose magnitudes all lie below 2^maxexp
        sub_tiles = _tiled_dims(tiling, tiling.Sr, tiling.Sc)
        sub_shape = _grid_shape(dims, sub_tiles)
        sub_max = _reduce_tiles(body, absx, dims, sub_tiles, "ReduceMax")
        limit = body.where(positive, top_power, body.const(np.float32(0.0)))
        ratio = {d: tiles[d] // sub_tiles[d] for d in tiles}
        limit = _expand(body, limit, sub_shape, ratio)
        below = body.cast(body.op("Less", sub_max, limit), TensorProto.INT64)
        if num_outputs >= 5:
            meta_out = _pack(body, body.reshape(below, [-1]), 1, math.prod(sub_shape), "Meta")
        shift = _expand(body, below, dims, sub_tiles)
        step = np.array([_pow2_f32(frac), _pow2_f32(frac + 1)], dtype=np.float32)
        v = body.op("Mul", v, body.gather(step, shift))
    elif frac:
        v = body.op("Mul", v, body.const(_pow2_f32(frac)))

    # Elements: the nearest magnitude, ties by the round mode (even: the even code).
    full = int_range == "full" and n.is_int
    mags = _magnitudes(n, full, dt.name)
    a = body.op("Abs", v)
    below_count = _count_below(body, a, mags, strict=True)
    hi = body.op("Clip", below_count, body.const(1, np.int64),
                 body.const(len(mags) - 1, np.int64))  # fmt: skip
    lo = body.op("Sub", hi, body.const(1, np.int64))
    d_lo = body.op("Sub", a, body.gather(mags, lo))
    d_hi = body.op("Sub", body.gather(mags, hi), a)
    closer = body.op("Less", d_hi, d_lo)
    tie = body.op("Equal", d_hi, d_lo)
    if rmode is RoundMode.EVEN:
        odd = body.op("BitwiseAnd", hi, body.const(1, np.int64))
        tie = body.op("And", tie, body.op("Equal", odd, body.const(0, np.int64)))
    elif rmode is RoundMode.ZERO:
        tie = body.op("And", tie, body.const(False, np.bool_))
    idx = body.where(body.op("Or", closer, tie), hi, lo)
    # Saturation (docs/ops.md): no element decodes past X's largest finite value. The
    # magnitude of v-units that decodes to it is that value times the exact powers of two
    # that scaled x (Inf where it passes float32: no bound); the index of the largest table
    # magnitude at most that caps the element's (ints' full range included).
    reach = body.op("Mul", _max_finite_like(body, "X"), _expand(body, factor, dims, tiles))
    if tiling.Sc:
        reach = body.op("Mul", reach, body.gather(step, shift))
    elif frac:
        reach = body.op("Mul", reach, body.const(_pow2_f32(frac)))
    cap = body.op("Sub", _count_below(body, reach, mags, strict=False), body.const(1, np.int64))
    idx = body.op("Min", idx, cap)
    if n.is_int:
        negative = body.op("Less", v, body.const(np.float32(0.0)))
        if full:
            top = body.const((1 << (n.bits - 1)) - 1, np.int64)
            idx = body.where(negative, idx, body.op("Min", idx, top))
        wrapped = body.op("Sub", body.const(1 << n.bits, np.int64), idx)
        wrapped = body.op("BitwiseAnd", wrapped, body.const((1 << n.bits) - 1, np.int64))
        codes = body.where(negative, wrapped, idx)
    else:
        negative = _signbit(body, v)
        if not n.has_negative_zero:
            negative = body.op("And", negative, body.op("Greater", idx, body.const(0, np.int64)))
        sign = body.op("Mul", body.cast(negative, TensorProto.INT64),
                       body.const(1 << (n.bits - 1), np.int64))  # fmt: skip
        codes = body.op("Add", idx, sign)
        codes = body.where(body.op("IsNaN", v), body.const(nan_code(n), np.int64), codes)

    # NaN tiles: scale code all ones, element codes 0 (docs/architecture.md, decision 5).
    scale_code = body.op("Add", stored, body.const(s.scale.bias, np.int64))
    bad = isnan if policy is NanPolicy.ELEMENT else nonfinite
    if policy is NanPolicy.BLOCK or not n.is_float:
        flagged = _reduce_tiles(body, body.cast(bad, TensorProto.FLOAT), dims, tiles, "ReduceMax")
        nan_tile = body.op("Greater", flagged, body.const(np.float32(0.0)))
        scale_code = body.where(nan_tile, body.const((1 << s.scale.ebits) - 1, np.int64),
                                scale_code)  # fmt: skip
        codes = body.where(_expand(body, nan_tile, dims, tiles), body.const(0, np.int64), codes)
    _pack(body, body.reshape(codes, [-1]), n.bits, math.prod(dims), "Q")
    body.op("Cast", body.reshape(scale_code, gshape), out="Scale", to=TensorProto.UINT8)
    empty = np.zeros(0, dtype=np.uint8)
    for name in _OUTPUTS["QuantizeMX"][2:num_outputs]:
        if name == "Meta" and meta_out is not None:
            continue
        body.op("Identity", body.const(empty), out=name)
    overload = overload_name("QuantizeMX", attrs, dims)
    return _function("QuantizeMX", overload, body, num_outputs)


# -- models -----------------------------------------------------------------------------------
def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        attrs[attr.name] = value.decode() if isinstance(value, bytes) else value
    return attrs


def build_function(
    op_type: str, attrs: Mapping[str, Any], shape: Sequence[int]
) -> onnx.FunctionProto:
    """The function for one node: ``op_type``, its attributes and X's static shape.

    For DequantizeMX and CodebookLookup ``shape`` is the ``shape`` attribute; for QuantizeMX
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
        attrs = _attributes(node)
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
