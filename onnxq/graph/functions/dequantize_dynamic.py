"""DequantizeMX on unknown dims: the body reads X's shape from its ``Shape`` input at run time.

The ``Shape`` input (int64, 1-D: X's shape; docs/ops.md) gives the element count to unpack and
the tile geometry (`onnxq.graph.functions.dynamic.Layout`). The codes are decoded as the
static body decodes them (the same tables, one multiplication by an exact power of two, the
same float-scale products), so the bits are the same for every shape.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto

from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.graph.functions.body import _Body
from onnxq.graph.functions.dequantize import _finish
from onnxq.graph.functions.dynamic import Layout, _unpack_dynamic, check_rank
from onnxq.graph.functions.signature import _as_dtype, _function, _output_type, overload_name
from onnxq.graph.functions.values import _decode, _exponent_table


def dequantize_mx_dynamic(
    dtype: DataType | str,
    axis: int,
    shape: Sequence[int | None],
    output_type: int = TensorProto.FLOAT,
) -> onnx.FunctionProto:
    """The DequantizeMX body for X of known rank (``len(shape)``) whose dims come at run time.

    Covers what the static body covers except 2-D tiles and N:M sparsity (weights, static).

    Raises:
        NotImplementedError: the format cannot be decoded bit-exactly, 2-D tiles, N:M sparsity.
        ValueError: a codebook data type, rank 0, bad axis or output type.
    """
    dt = _as_dtype(dtype)
    rank, ax = check_rank(shape, axis, "DequantizeMX")
    out = _output_type(output_type)
    n, s = dt.nspec, dt.sspec
    if isinstance(n, Codebook):
        raise ValueError(f"{dt.name} is a codebook data type: upcast it with CodebookLookup")
    bits = n.bits
    if not (1 <= bits <= 8 or bits == 16):
        raise NotImplementedError(f"{dt.name}: {bits}-bit element codes in a function body")
    body = _Body("dqd")
    count = body.op("ReduceProd", "Shape", keepdims=1)
    codes = body.op("Reshape", _unpack_dynamic(body, "Q", bits, count), "Shape")
    if s is None:
        y = _decode(body, codes, n, f"{dt.name} element")
    else:
        lay = Layout(body, dt, "Shape", rank, ax)
        ct = lay.to_tiles(codes, 0, np.int64)
        if s.scale.is_exponent:
            yt = _exponent_tiles(body, dt, lay, ct)
        else:
            yt = _float_scale_tiles(body, dt, lay, ct)
        y = lay.from_tiles(yt)
    _finish(body, y, out)
    attrs = {"dtype": dt.code, "axis": ax, "output_type": out}
    return _function("DequantizeMX", overload_name("DequantizeMX", attrs, list(shape)), body)


def _scale_codes(body: _Body, lay: Layout, name: str) -> str:
    return body.cast(lay.tile_values(name), TensorProto.INT64)


def _exponent_tiles(body: _Body, dt: DataType, lay: Layout, codes: str) -> str:
    """Q * 2^(scale - bias - frac [- shift]) in tiled layout (one multiplication)."""
    n, s = dt.nspec, dt.sspec
    assert s is not None
    frac = n.int_fraction_bits
    q = _decode(body, codes, n, f"{dt.name} element")
    scale = _scale_codes(body, lay, "Scale")
    if lay.subtiled:  # MX9/6/4: the shift bit joins the scale code in one table index
        meta = _unpack_dynamic(body, "Meta", 1, lay.meta_count())
        shift = lay.subtile_values(meta)
        index = body.op("Add", body.op("Mul", scale, body.const(2, np.int64)), shift)
        factor = body.gather(_exponent_table(s.scale, frac, 2, dt.name), index)
    else:
        factor = body.gather(_exponent_table(s.scale, frac, 1, dt.name), scale)
    return body.op("Mul", q, factor)


def _float_scale_tiles(body: _Body, dt: DataType, lay: Layout, codes: str) -> str:
    """Float tile scales (NVFP4, int blocks with zero points...) in tiled layout."""
    n, s = dt.nspec, dt.sspec
    assert s is not None
    sc = _decode(body, _scale_codes(body, lay, "Scale"), s.scale, f"{dt.name} scale")
    q = _decode(body, codes, n, f"{dt.name} element")
    if s.zero is not None:
        zp = _decode(body, _scale_codes(body, lay, "Zero"), s.zero, f"{dt.name} zero point")
        if s.zero.is_float:
            y = body.op("Add", body.op("Mul", q, sc), zp)
        else:
            y = body.op("Mul", body.op("Sub", q, zp), sc)
    else:
        eff = sc
        if s.tenscale is not None:
            ten = body.cast(body.reshape("TenScale", [1]), TensorProto.INT64)
            ts = _decode(body, ten, s.tenscale, f"{dt.name} tensor scale")
            eff = body.op("Mul", sc, ts)
        y = body.op("Mul", q, eff)
    return body.where(body.op("IsNaN", sc), body.const(np.float32(np.nan)), y)
