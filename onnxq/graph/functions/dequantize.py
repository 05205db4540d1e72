"""The DequantizeMX and CodebookLookup fallbacks: codes, scales and tables to float values."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto

from onnxq.cast.layout import Tiling
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.graph.functions.body import _Body, _expand, _grid_shape, _tiled_dims, _unpack
from onnxq.graph.functions.signature import (
    _as_dtype,
    _check_geometry,
    _function,
    _output_type,
    overload_name,
)
from onnxq.graph.functions.values import _decode, _exponent_table


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
    order = body.op(
        "CumSum", body.cast(kept, TensorProto.INT64), body.const(0, np.int64), exclusive=1
    )
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
    overload = overload_name("DequantizeMX", attrs, dims)
    return _function("DequantizeMX", overload, body)


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
        body,
        body.cast(body.reshape("Scale", gshape), TensorProto.INT64),
        s.scale,
        f"{dt.name} scale",
    )
    q = _decode(body, codes, n, f"{dt.name} element")
    if s.zero is not None:
        zp = _decode(
            body,
            body.cast(body.reshape("Zero", gshape), TensorProto.INT64),
            s.zero,
            f"{dt.name} zero point",
        )
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
                body,
                body.cast(body.reshape("TenScale", [1]), TensorProto.INT64),
                s.tenscale,
                f"{dt.name} tensor scale",
            )
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
