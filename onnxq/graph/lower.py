"""Export to standard ONNX (``target="standard"``): quantized weights with no custom op.

`lower_weight` turns one float weight into initializers and ai.onnx opset-21 nodes that
produce, bit for bit, ``onnxq.cast(weight, dtype, axis=...)`` (the dequantized weight of the
``onnxq`` target), so the model runs in a plain onnxruntime or the onnx reference evaluator.
Two encodings are written (`lowering` says which one a data type gets):

- ``DequantizeLinear``: element codes stored as an ONNX type with the same values
  (float8e4m3fn, float8e5m2, int8, int4), one float32 scale per tile (``block_size`` = the
  tile length along ``axis``; a 0-D scale for one scale per tensor). An E8M0 scale becomes the
  float32 2^(code - bias - fraction bits), which is exact; int elements are fixed point with
  one integer bit, so their fraction bits move into the scale. Used for 1-D (or tensor) tiles
  with an exponent or plain float scale and no zero point, subtile, tensor scale or sparsity:
  MXFP8, MXINT8, BFP, ``int8_float32``, ``int4_e8m0_t32`` and so on.
- ``Gather``: element codes stored unpacked (one uint8, or uint16 when the index needs more
  than 8 bits), ``Cast`` to int32 and looked up in a float32 value table, then multiplied by
  a float32 factor per tile, stored in the grid layout of `onnxq.cast` and repeated over each
  tile with ``Expand`` (the helpers of `onnxq.graph.functions`). MX9/MX6/MX4 fold the shift bit
  into the table index (values times 1/2, exact); codebooks index the table by
  ``mapping * 2^index_bits + code``; NVFP4-style data types multiply by the float32 product
  of the block scale and the tensor scale, rounded once in float32, exactly as the reference;
  zero points subtract (int) or add (float) as the reference. Everything else: FP6, FP4,
  2-D tiles, codebooks.

Exactness: each value is one float32 multiplication of two exact float32 numbers, which
rounds once, like the reference's exact float64 product rounded to float32 (subnormal
results included). Element formats wider than 8 bits are stored as the ONNX type with the
same values (float16, bfloat16, int16, uint16) and ``Cast`` to float32; other wide formats
raise `NotImplementedError`, as do scale factors that are not float32 numbers.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from onnxq.cast.api import QTensor, cast
from onnxq.cast.elements import decode_codes
from onnxq.cast.layout import Tiling
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType, datatype
from onnxq.formats.number import InfNaN, NumberSpec
from onnxq.graph.functions import (
    _Body,
    _expand,
    _exponent_table,
    _grid_shape,
    _tiled_dims,
    _value_table,
)

__all__ = ["lower_weight", "lowering"]

_OUTPUT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
# ONNX element types DequantizeLinear-21 takes (checked in onnxruntime 1.32, blocked scales).
_DQ_TYPES: tuple[tuple[int, int, bool, np.dtype], ...] = (
    (TensorProto.FLOAT8E4M3FN, 8, False, np.dtype(ml_dtypes.float8_e4m3fn)),
    (TensorProto.FLOAT8E5M2, 8, False, np.dtype(ml_dtypes.float8_e5m2)),
    (TensorProto.INT8, 8, True, np.dtype(np.int8)),
    (TensorProto.INT4, 4, True, np.dtype(ml_dtypes.int4)),
)
# ONNX types that hold every value of a wide element format: stored as is, Cast to float32
# (ints of up to 16 bits are sign-extended, so int12 is stored as int16).
_WIDE_TYPES: tuple[tuple[int, bool, np.dtype], ...] = (
    (16, False, np.dtype(np.float16)),
    (16, False, np.dtype(ml_dtypes.bfloat16)),
    (32, False, np.dtype(np.float32)),
    (16, True, np.dtype(np.int16)),
    (16, False, np.dtype(np.uint16)),
)


class _Writer(_Body):
    """A `_Body` that names values with a model-wide unique-name allocator."""

    def __init__(self, fresh: Callable[[str], str], prefix: str) -> None:
        super().__init__(prefix)
        self._fresh = fresh
        self._prefix = prefix

    def _name(self, hint: str) -> str:
        return self._fresh(f"{self._prefix}__{hint}")


def _as_dtype(dtype: DataType | str) -> DataType:
    return dtype if isinstance(dtype, DataType) else datatype(dtype)


def _values_of(codes: np.ndarray, typ: np.dtype, signed: bool, bits: int) -> np.ndarray:
    """Unsigned codes (two's complement or bit patterns) as an array of ONNX-typed values."""
    c = codes.astype(np.int64)
    if signed:
        return np.where(c >= 1 << (bits - 1), c - (1 << bits), c).astype(typ)
    if typ.kind in "iu":
        return c.astype(typ)
    return c.astype({1: np.uint8, 2: np.uint16, 4: np.uint32}[typ.itemsize]).view(typ)


def _same_values(spec: NumberSpec, typ: np.dtype, signed: bool, bits: int) -> bool:
    """Whether codes of ``spec`` read as ``typ`` give exactly the values of ``spec``."""
    if spec.bits != bits or isinstance(spec, Codebook):
        return False
    codes = np.arange(1 << bits, dtype=np.int64)
    want = decode_codes(codes, spec)
    with np.errstate(invalid="ignore"):
        got = _values_of(codes, typ, signed, bits).astype(np.float64)
    both_nan = np.isnan(want) & np.isnan(got)
    return bool(np.all(both_nan | (want == got)))


def _dq_type(spec: NumberSpec) -> tuple[int, bool, np.dtype] | None:
    for onnx_type, bits, signed, typ in _DQ_TYPES:
        if _same_values(spec, typ, signed, bits):
            return onnx_type, signed, typ
    return None


def lowering(dtype: DataType | str, shape: tuple[int, ...] | None = None, axis: int = -1) -> str:
    """Which standard encoding `lower_weight` writes for ``dtype``.

    Args:
        dtype: a DataType, preset name or data type code.
        shape: the weight's shape (2-D tiles on a 1-D weight cannot use DequantizeLinear).
        axis: the tile axis.

    Returns:
        ``"DequantizeLinear"``, ``"Gather"`` (a value table) or ``"Cast"`` (elements wider
        than 8 bits stored as a same-valued ONNX type).
    """
    dt = _as_dtype(dtype)
    n, s = dt.nspec, dt.sspec
    table = "Gather" if n.bits <= 8 or isinstance(n, Codebook) else "Cast"
    if s is None or isinstance(n, Codebook) or s.zero is not None or s.tenscale is not None:
        return table
    if s.sparsity[1] or (not s.is_tensor and len(s.tiles) != 1):
        return table
    if shape is not None and Tiling.build(tuple(shape), axis, s).Sc:
        return table
    if not s.is_tensor and s.tiles[0].subtile:
        return table
    return "DequantizeLinear" if _dq_type(n) is not None else table


def _scale_factors(dt: DataType, q: QTensor, gshape: tuple[int, ...]) -> np.ndarray:
    """float32 factor per tile (grid layout): 2^(exponent - fraction bits) or the float scale.

    Raises:
        NotImplementedError: a factor that is not a float32 number.
    """
    n, s = dt.nspec, dt.sspec
    assert s is not None and q.scale is not None
    codes = np.asarray(q.scale).astype(np.int64).reshape(gshape)
    if s.scale.is_exponent:
        frac = 0 if isinstance(n, Codebook) else n.int_fraction_bits
        return _exponent_table(s.scale, frac, 1, dt.name)[codes]
    sc = decode_codes(codes, s.scale).astype(np.float32)
    if s.tenscale is not None:
        assert q.tenscale is not None
        ts = decode_codes(np.asarray(q.tenscale).reshape(-1)[:1], s.tenscale).astype(np.float32)
        sc = (sc * ts[0]).astype(np.float32)
    return sc


def _per_element(units: np.ndarray, tiling: Tiling) -> np.ndarray:
    """A per-subtile (or per-tile) grid of `onnxq.cast` -> one entry per element, X's shape."""
    if tiling.Sc:
        t = np.repeat(tiling.sub_ungrid(units)[..., None], tiling.Sr * tiling.Sc, axis=-1)
        t = tiling.from_subtiles(t)
    else:
        t = np.repeat(tiling.tile_ungrid(units)[..., None], tiling.tile_elems, axis=-1)
    return tiling.from_tiles(t)


def _lookup(dt: DataType, q: QTensor, tiling: Tiling | None) -> tuple[np.ndarray, np.ndarray]:
    """(index per element, float32 table): ``table[index]`` is the element value.

    Raises:
        NotImplementedError: values not exact in float32.
    """
    n = dt.nspec
    codes = np.asarray(q.data).astype(np.int64)
    if isinstance(n, Codebook):
        values = np.asarray(n.table(), dtype=np.float64)
        table = values.astype(np.float32)
        if not np.array_equal(table.astype(np.float64), values):
            raise NotImplementedError(f"{dt.name}: codebook values not exact in float32")
        assert tiling is not None and q.meta is not None
        meta = _per_element(np.asarray(q.meta).astype(np.int64), tiling)
        return meta * (1 << n.index_bits) + codes, table.reshape(-1)
    table = _value_table(n)
    if tiling is not None and tiling.Sc:  # MX9/6/4: the shift bit halves the value
        assert q.meta is not None
        half = (table.astype(np.float64) * 0.5).astype(np.float32)
        finite = np.isfinite(table)
        if not np.array_equal(half[finite].astype(np.float64), table[finite] * 0.5):
            raise NotImplementedError(f"{dt.name}: shifted values not exact in float32")
        shift = _per_element(np.asarray(q.meta).astype(np.int64), tiling)
        return shift * (1 << n.bits) + codes, np.concatenate([table, half])
    return codes, table


def _wide_type(spec: NumberSpec) -> tuple[bool, np.dtype] | None:
    for bits, signed, typ in _WIDE_TYPES:
        width = spec.bits if typ.kind in "iu" and spec.bits <= bits else bits
        if spec.bits <= 16 and not _same_values(spec, typ, signed, width):
            continue
        ieee_wide = spec.infnan is InfNaN.IEEE and spec.ebits == 8 and typ.kind == "f"
        if spec.bits > 16 and (spec.bits != bits or not ieee_wide):
            continue
        return signed, typ
    return None


def lower_weight(
    name: str,
    array: np.ndarray,
    dtype: DataType | str,
    axis: int = -1,
    *,
    round_mode: str | None = None,
    scale_mode: str | None = None,
    output_type: int = TensorProto.FLOAT,
    fresh: Callable[[str], str] | None = None,
) -> tuple[list[TensorProto], list[onnx.NodeProto]]:
    """Standard-ONNX initializers and nodes whose output ``name`` is the quantized weight.

    The output equals ``onnxq.cast(array, dtype, axis=axis, round_mode=..., scale_mode=...)``
    bit for bit (in ``output_type``). See the module doc for the encodings.

    Args:
        name: the output name (the weight's name in the graph).
        array: the float weight (float32, float16 or bfloat16).
        dtype: the data type (DataType, preset name or code).
        axis: the axis 1-D tiles run along.
        round_mode: the cast's round mode (None: the current default).
        scale_mode: the cast's scale mode (None: the current default).
        output_type: a TensorProto float type: FLOAT, FLOAT16 or BFLOAT16.
        fresh: makes a unique value/node name from a hint (default: ``name`` + the hint).

    Returns:
        The new initializers and nodes (nodes in topological order).

    Raises:
        NotImplementedError: a format this export cannot reproduce exactly (elements wider
            than 8 bits with no same-valued ONNX type, factors outside float32).
        ValueError: a bad output type, axis or data type.
    """
    if output_type not in _OUTPUT_TYPES:
        raise ValueError(f"output_type {output_type}: expected FLOAT, FLOAT16 or BFLOAT16")
    dt = _as_dtype(dtype)
    dims = tuple(int(d) for d in array.shape)
    if not -len(dims) <= axis < len(dims):
        raise ValueError(f"axis {axis} is out of range for weight {name!r} of shape {list(dims)}")
    axis %= len(dims)
    if fresh is None:
        used: set[str] = set()

        def fresh(hint: str) -> str:
            out, k = hint, 0
            while out in used:
                k += 1
                out = f"{hint}_{k}"
            used.add(out)
            return out

    q = cast(array, dt, axis=axis, mode="actual", round_mode=round_mode, scale_mode=scale_mode)
    assert isinstance(q, QTensor)
    body = _Writer(fresh, name)
    inits: list[TensorProto] = []

    def init(value: np.ndarray, hint: str) -> str:
        tensor = numpy_helper.from_array(np.ascontiguousarray(value), fresh(f"{name}__{hint}"))
        inits.append(tensor)
        return tensor.name

    n, s = dt.nspec, dt.sspec
    tiling = Tiling.build(dims, axis, s) if s is not None else None
    if lowering(dt, dims, axis) == "DequantizeLinear":
        assert s is not None and tiling is not None
        found = _dq_type(n)
        assert found is not None
        _, signed, typ = found
        x = init(_values_of(np.asarray(q.data), typ, signed, n.bits), "q")
        tiles = _tiled_dims(tiling, tiling.Tr, tiling.Tc)
        gshape = _grid_shape(dims, tiles)
        factors = _scale_factors(dt, q, gshape)
        if factors.size > 1:  # onnxruntime reads a one-element scale as per-tensor
            sc = init(factors, "scale")
            y = body.op("DequantizeLinear", x, sc, axis=axis, block_size=tiling.Tc)
        else:
            y = body.op("DequantizeLinear", x, init(factors.reshape(()), "scale"))
    else:
        y = _gather_path(body, init, dt, q, tiling, dims)
    if output_type == TensorProto.FLOAT:
        body.op("Identity", y, out=name)
    else:
        body.op("Cast", y, out=name, to=output_type)
    return inits, body.nodes


def _gather_path(
    body: _Writer,
    init: Callable[[np.ndarray, str], str],
    dt: DataType,
    q: QTensor,
    tiling: Tiling | None,
    dims: tuple[int, ...],
) -> str:
    """Values by table lookup (or Cast of a same-valued wide type) times the tile factors."""
    n, s = dt.nspec, dt.sspec
    if n.bits <= 8 or isinstance(n, Codebook):
        index, table = _lookup(dt, q, tiling)
        stored = index.astype(np.uint8 if int(index.max(initial=0)) < 256 else np.uint16)
        codes = body.cast(init(stored, "q"), TensorProto.INT32)
        values = body.op("Gather", init(table, "table"), codes, axis=0)
    else:
        wide = _wide_type(n)
        if wide is None:
            raise NotImplementedError(
                f"{dt.name}: {n.bits}-bit elements have no same-valued ONNX type, so "
                "target='standard' cannot store them; use target='onnxq'"
            )
        signed, typ = wide
        stored = _values_of(np.asarray(q.data), typ, signed, n.bits)
        values = body.cast(init(stored, "q"), TensorProto.FLOAT)
    y = values
    if s is not None:
        assert tiling is not None
        tiles = _tiled_dims(tiling, tiling.Tr, tiling.Tc)
        gshape = _grid_shape(dims, tiles)
        if s.zero is not None:
            assert q.scale is not None and q.zero is not None
            sc = decode_codes(np.asarray(q.scale).astype(np.int64), s.scale).astype(np.float32)
            zp = decode_codes(np.asarray(q.zero).astype(np.int64), s.zero).astype(np.float32)
            sc_el = _expand(body, init(sc.reshape(gshape), "scale"), dims, tiles)
            zp_el = _expand(body, init(zp.reshape(gshape), "zero"), dims, tiles)
            if s.zero.is_float:
                y = body.op("Add", body.op("Mul", values, sc_el), zp_el)
            else:
                y = body.op("Mul", body.op("Sub", values, zp_el), sc_el)
        else:
            factors = _scale_factors(dt, q, gshape)
            y = body.op("Mul", values, _expand(body, init(factors, "scale"), dims, tiles))
    if q.mask is not None:  # N:M sparsity: pruned positions are zero
        keep = init(np.asarray(q.mask).astype(bool), "mask")
        y = body.where(keep, y, body.const(np.float32(0.0)))
    return y
