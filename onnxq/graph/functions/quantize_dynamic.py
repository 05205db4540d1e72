"""QuantizeMX on unknown dims, and QuantizeDequantizeMX: bodies that read X's shape at run time.

Both work in the tiled layout of `onnxq.graph.functions.dynamic` and follow the static
QuantizeMX body step for step (the same exponent search, nearest-value rounding, saturation
bound and NaN tiles), so they give its bits. QuantizeDequantizeMX never packs: its codes are
decoded in place exactly as the DequantizeMX body decodes them (the element's table value
times one exact power of two, the MX shift bit folded into the table index), then cast to
X's type as DequantizeMX's ``output_type`` would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto

from onnxq.formats.datatype import DataType
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode
from onnxq.graph.functions.body import _Body
from onnxq.graph.functions.dequantize import dequantize_mx_function
from onnxq.graph.functions.dynamic import Layout, _pack_dynamic, check_rank, dynamic_dims
from onnxq.graph.functions.quantize import (
    _count_below,
    _magnitudes,
    _max_finite_like,
    _nearest,
    _quantize_support,
    _scale_exponent,
    _signed_codes,
    _times_shift,
    quantize_mx_function,
)
from onnxq.graph.functions.signature import _as_dtype, _function, overload_name
from onnxq.graph.functions.values import _decode, _exponent_table, _pow2_f32
from onnxq.graph.schemas import output_names


@dataclass(frozen=True)
class _Modes:
    round_mode: RoundMode
    scale_mode: ScaleMode
    nan_policy: NanPolicy
    seed: int
    int_range: str

    @classmethod
    def parse(
        cls, round_mode: object, scale_mode: object, nan_policy: object, seed: int, int_range: str
    ) -> _Modes:
        if int_range not in ("symmetric", "full"):
            raise ValueError(f"unknown int_range {int_range!r}: expected 'symmetric' or 'full'")
        return cls(
            RoundMode.parse(round_mode),
            ScaleMode.parse(scale_mode),
            NanPolicy.parse(nan_policy),
            int(seed),
            int_range,
        )

    def keywords(self) -> dict[str, object]:
        """The keyword arguments of `quantize_mx_function`."""
        return {
            "round_mode": self.round_mode,
            "scale_mode": self.scale_mode,
            "nan_policy": self.nan_policy,
            "seed": self.seed,
            "int_range": self.int_range,
        }

    def attrs(self, dt: DataType, axis: int) -> dict[str, object]:
        return {
            "dtype": dt.code,
            "axis": axis,
            "round_mode": self.round_mode.value,
            "scale_mode": self.scale_mode.value,
            "nan_policy": self.nan_policy.value,
            "seed": self.seed,
            "int_range": self.int_range,
        }


@dataclass(frozen=True)
class _Tiled:
    """The quantized tensor in tiled layout: element codes, scale codes, MX shift bits."""

    codes: str  # int64 [pre, nC, U, S, post]
    scale_code: str  # int64 [pre, nC, 1, 1, post], all ones for NaN tiles
    shift: str | None  # int64 [pre, nC, U, 1, post] (MX9/6/4), else None


def _quantize_tiles(body: _Body, dt: DataType, lay: Layout, modes: _Modes) -> _Tiled:
    """The static QuantizeMX steps on X in tiled layout (see quantize.quantize_mx_function)."""
    n, s = dt.nspec, dt.sspec
    assert s is not None
    xt = lay.to_tiles(body.cast("X", TensorProto.FLOAT))
    isnan = body.op("IsNaN", xt)
    nonfinite = body.op("Or", isnan, body.op("IsInf", xt))
    absx = body.where(nonfinite, body.const(np.float32(0.0)), body.op("Abs", xt))
    sub_max = lay.subtile_max(absx) if lay.subtiled else None
    amax = lay.tile_max(sub_max if sub_max is not None else absx)
    stored, top_power, positive = _scale_exponent(body, n, s, modes.scale_mode, amax)
    frac = n.int_fraction_bits
    low, high = -s.scale.bias, (1 << s.scale.ebits) - 2 - s.scale.bias
    inverse = np.array([_pow2_f32(-k) for k in range(low, high + 1)], dtype=np.float32)
    factor = body.gather(inverse, body.op("Sub", stored, body.const(low, np.int64)))
    v = body.op("Mul", xt, factor)
    shift = None
    if sub_max is not None:  # MX9/6/4: shift a subtile whose magnitudes all lie below 2^maxexp
        limit = body.where(positive, top_power, body.const(np.float32(0.0)))
        shift = body.cast(body.op("Less", sub_max, limit), TensorProto.INT64)
    v = _times_shift(body, v, frac, shift)
    full = modes.int_range == "full" and n.is_int
    mags = _magnitudes(n, full, dt.name)
    idx = _nearest(body, v, mags, modes.round_mode)
    reach = body.op("Mul", _max_finite_like(body, "X"), factor)  # saturation, docs/ops.md
    reach = _times_shift(body, reach, frac, shift)
    cap = body.op("Sub", _count_below(body, reach, mags, strict=False), body.const(1, np.int64))
    codes = _signed_codes(body, n, v, body.op("Min", idx, cap), full)
    scale_code = body.op("Add", stored, body.const(s.scale.bias, np.int64))
    bad = isnan if modes.nan_policy is NanPolicy.ELEMENT else nonfinite
    if modes.nan_policy is NanPolicy.BLOCK or not n.is_float:
        flagged = lay.tile_max(body.cast(bad, TensorProto.FLOAT))
        nan_tile = body.op("Greater", flagged, body.const(np.float32(0.0)))
        scale_code = body.where(
            nan_tile, body.const((1 << s.scale.ebits) - 1, np.int64), scale_code
        )
        codes = body.where(nan_tile, body.const(0, np.int64), codes)
    return _Tiled(codes, scale_code, shift)


def _setup(
    dtype: DataType | str, axis: int, shape: Sequence[int | None], modes: _Modes, what: str
) -> tuple[DataType, int, _Body, Layout]:
    dt = _as_dtype(dtype)
    rank, ax = check_rank(shape, axis, what)
    _quantize_support(dt, modes.round_mode, modes.scale_mode, ())
    body = _Body("qd")
    lay = Layout(body, dt, body.op("Shape", "X"), rank, ax)
    return dt, ax, body, lay


def quantize_mx_dynamic(
    dtype: DataType | str,
    axis: int,
    shape: Sequence[int | None],
    *,
    round_mode: RoundMode | str = "even",
    scale_mode: ScaleMode | str = "floor",
    nan_policy: NanPolicy | str = "element",
    seed: int = 0,
    int_range: str = "symmetric",
    num_outputs: int = 6,
) -> onnx.FunctionProto:
    """The QuantizeMX body for X of known rank and unknown dims (1-D tiles, tensor scales).

    Covers what the static body covers (`quantize_mx_function`), with the sizes read at run
    time; the overload names the rank (``r3``) instead of the dims.

    Raises:
        NotImplementedError: as the static body, and 2-D tiles or N:M sparsity.
        ValueError: rank 0, bad axis or attribute value.
    """
    modes = _Modes.parse(round_mode, scale_mode, nan_policy, seed, int_range)
    if not 2 <= num_outputs <= 6:
        raise ValueError(f"QuantizeMX has 2 to 6 outputs (Q, Scale, ...), not {num_outputs}")
    dt, ax, body, lay = _setup(dtype, axis, shape, modes, "QuantizeMX")
    tiled = _quantize_tiles(body, dt, lay, modes)
    _pack_dynamic(body, body.reshape(lay.from_tiles(tiled.codes), [-1]), dt.nspec.bits, "Q")
    body.op("Cast", lay.grid_of(tiled.scale_code), out="Scale", to=TensorProto.UINT8)
    empty = np.zeros(0, dtype=np.uint8)
    for name in output_names("QuantizeMX")[2:num_outputs]:
        if name == "Meta" and tiled.shift is not None:
            bits = body.reshape(lay.meta_of(tiled.shift), [-1])
            _pack_dynamic(body, bits, 1, "Meta")
            continue
        body.op("Identity", body.const(empty), out=name)
    attrs = {**modes.attrs(dt, ax), "num_outputs": num_outputs}
    overload = overload_name("QuantizeMX", attrs, list(shape))
    return _function("QuantizeMX", overload, body, num_outputs)


def quantize_dequantize_mx_function(
    dtype: DataType | str,
    axis: int,
    shape: Sequence[int | None],
    *,
    round_mode: RoundMode | str = "even",
    scale_mode: ScaleMode | str = "floor",
    nan_policy: NanPolicy | str = "element",
    seed: int = 0,
    int_range: str = "symmetric",
) -> onnx.FunctionProto:
    """The QuantizeDequantizeMX body: ``DequantizeMX(QuantizeMX(X))`` with no codes packed.

    Only X's rank matters (``shape`` may hold None for unknown dims): the body reads the sizes
    at run time, so one function serves every shape of that rank. 2-D tiles on a static
    shape are the static QuantizeMX body followed by the static DequantizeMX body.

    Raises:
        NotImplementedError: what the QuantizeMX fallback refuses, 2-D tiles, N:M sparsity.
        ValueError: rank 0, bad axis or attribute value.
    """
    modes = _Modes.parse(round_mode, scale_mode, nan_policy, seed, int_range)
    spec = _as_dtype(dtype).sspec
    if spec is not None and len(spec.tiles) == 2 and not dynamic_dims(shape):
        return _composed(_as_dtype(dtype), axis, shape, modes)
    dt, ax, body, lay = _setup(dtype, axis, shape, modes, "QuantizeDequantizeMX")
    n, s = dt.nspec, dt.sspec
    assert s is not None
    tiled = _quantize_tiles(body, dt, lay, modes)
    q = _decode(body, tiled.codes, n, f"{dt.name} element")
    frac = n.int_fraction_bits
    if tiled.shift is not None:  # as DequantizeMX: code * 2 + shift indexes one table
        twice = body.op("Mul", tiled.scale_code, body.const(2, np.int64))
        index = body.op("Add", twice, tiled.shift)
        factor = body.gather(_exponent_table(s.scale, frac, 2, dt.name), index)
    else:
        factor = body.gather(_exponent_table(s.scale, frac, 1, dt.name), tiled.scale_code)
    y = lay.from_tiles(body.op("Mul", q, factor))
    body.op("CastLike", y, "X", out="Y")
    runtime = [None] * len(shape)  # one body for every shape of this rank
    overload = overload_name("QuantizeDequantizeMX", modes.attrs(dt, ax), runtime)
    return _function("QuantizeDequantizeMX", overload, body)


def _composed(
    dt: DataType, axis: int, shape: Sequence[int | None], modes: _Modes
) -> onnx.FunctionProto:
    """QuantizeMX's static body, then DequantizeMX's (float32), then a cast to X's type."""
    dims = [int(d) for d in shape if d is not None]
    quantize = quantize_mx_function(dt, axis, dims, **modes.keywords())
    dequantize = dequantize_mx_function(dt, axis, dims, TensorProto.FLOAT)
    codes = set(output_names("QuantizeMX"))
    body = _Body("qdc")

    def rename(name: str, prefix: str) -> str:
        if not name or name == "X":
            return name
        return ("q_" if name in codes else prefix) + name

    for fn, prefix in ((quantize, "q_"), (dequantize, "d_")):
        for node in fn.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [rename(n, prefix) for n in node.input]
            copy.output[:] = [rename(n, prefix) for n in node.output]
            body.nodes.append(copy)
    body.op("CastLike", "d_Y", "X", out="Y")
    _, ax = check_rank(shape, axis, "QuantizeDequantizeMX")
    overload = overload_name("QuantizeDequantizeMX", modes.attrs(dt, ax), dims)
    return _function("QuantizeDequantizeMX", overload, body)
