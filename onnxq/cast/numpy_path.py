"""The numpy side of `cast` and `upcast`: arrays to values or QTensors, and back.

A resolved request on a numpy array becomes values or a `QTensor` (api.py describes the
layouts); a numpy `QTensor` decodes back to floats.

Both `onnxq.cast.api` and the torch bridge (its CPU fallback) use these, so neither imports the
other for them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np

from onnxq.cast import reference
from onnxq.cast.backends import BACKENDS
from onnxq.cast.layout import Tiling
from onnxq.cast.packing import pack_bits, unpack_bits
from onnxq.cast.qtensor import QTensor
from onnxq.cast.request import CastRequest
from onnxq.formats.modes import Backend, CastMode

__all__ = ["FLOAT_DTYPES", "cast_array", "check_input", "check_out", "expand", "upcast_array"]

FLOAT_DTYPES = {
    np.dtype(np.float32): "float32",
    np.dtype(np.float16): "float16",
    np.dtype(ml_dtypes.bfloat16): "bfloat16",
}


def check_input(x: Any) -> np.ndarray:
    """``x`` if it is a castable numpy array.

    Raises:
        TypeError: not a float32/float16/bfloat16 numpy array.
        ValueError: empty or 0-D.
    """
    if not isinstance(x, np.ndarray):
        raise TypeError(
            f"cast expects a numpy array of float32, float16 or bfloat16, got {type(x).__name__}"
        )
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"cast expects float32, float16 or bfloat16 data, got {x.dtype}; "
            f"convert first, e.g. x.astype(np.float32)"
        )
    if x.size == 0:
        raise ValueError(f"cannot cast an empty tensor (shape {x.shape})")
    if x.ndim == 0:
        raise ValueError("cannot cast a 0-D scalar; reshape it to (1,)")
    return x


def check_out(out: Any, x: np.ndarray, mode: CastMode) -> None:
    """Check the ``out=`` of `cast`: C-contiguous, writeable, x's shape and dtype, virtual.

    Raises:
        TypeError: ``out`` is not a numpy array.
        ValueError: a non-virtual cast, or ``out`` does not fit.
    """
    if mode is not CastMode.VIRTUAL:
        raise ValueError(f"out= is for virtual casts; a {mode.value} cast returns a QTensor")
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(
            f"out has shape {out.shape} and dtype {out.dtype}; the cast writes "
            f"shape {x.shape}, dtype {x.dtype}"
        )
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be C-contiguous and writeable (np.empty_like(x) is)")


def cast_array(
    x: np.ndarray, request: CastRequest, backend: Backend, out: np.ndarray | None = None
) -> np.ndarray | QTensor:
    """Cast checked numpy ``x`` with ``backend`` (reference or native): values or a QTensor."""
    enc = BACKENDS[backend](x, request, out)
    if request.mode is CastMode.VIRTUAL:
        if out is not None:
            if enc.values is not out:
                np.copyto(out, enc.values.astype(x.dtype, copy=False))
            return out
        return enc.values.astype(x.dtype, copy=False)
    assert enc.codes is not None
    q = QTensor(
        data=enc.codes,
        dtype=request.dtype,
        shape=tuple(x.shape),
        axis=request.axis,
        mode=request.mode,
        scale=enc.scale,
        zero=enc.zero,
        tenscale=enc.tenscale,
        meta=enc.meta,
        mask=enc.mask,
    )
    return compress(q) if request.mode is CastMode.COMPRESS else q


def compress(q: QTensor) -> QTensor:
    """The compress-mode QTensor of an actual-mode one (codes, meta and mask bit-packed)."""
    codes = q.data if q.mask is None else q.data[q.mask]
    return dataclasses.replace(
        q,
        data=pack_bits(codes, q.dtype.nspec.bits),
        meta=None if q.meta is None else pack_bits(q.meta, q.dtype.meta_bits),
        mask=None if q.mask is None else pack_bits(q.mask.astype(np.uint8), 1),
    )


def expand(q: QTensor) -> tuple[np.ndarray, np.ndarray | None]:
    """Unpacked codes (input shape) and meta (grid) of a compress-mode QTensor."""
    count = int(np.prod(q.shape))
    if q.mask is not None:
        mask = unpack_bits(q.mask, 1, count).astype(bool).reshape(q.shape)
        kept = unpack_bits(q.data, q.dtype.nspec.bits, int(mask.sum()))
        codes = np.zeros(q.shape, dtype=kept.dtype)
        codes[mask] = kept
    else:
        codes = unpack_bits(q.data, q.dtype.nspec.bits, count).reshape(q.shape)
    meta = None
    if q.meta is not None:
        tiling = Tiling.build(q.shape, q.axis, q.dtype.sspec)
        if tiling.Sc:
            rows, cols = tiling.sub_counts
            meta_count = tiling.B * rows * cols
            grid = tiling.sub_grid(
                np.zeros((tiling.B, tiling.nR, tiling.nC, tiling.n_sub), np.uint8)
            )
        else:
            meta_count = tiling.B * tiling.nR * tiling.nC
            grid = tiling.tile_grid(np.zeros((tiling.B, tiling.nR, tiling.nC), np.uint8))
        meta = unpack_bits(q.meta, q.dtype.meta_bits, meta_count).reshape(grid.shape)
    return codes, meta


def upcast_array(q: QTensor, dtype: Any = np.float32) -> np.ndarray:
    """Decode a QTensor of numpy arrays with the reference.

    Raises:
        TypeError: ``dtype`` is not float32/float16/bfloat16.
    """
    out = np.dtype(dtype)
    if out not in FLOAT_DTYPES:
        raise TypeError(f"upcast returns float32, float16 or bfloat16, not {out}")
    if q.mode is CastMode.COMPRESS:
        codes, meta = expand(q)
    else:
        codes, meta = q.data, q.meta
    values = reference.dequantize(
        q.dtype, q.shape, q.axis, codes, q.scale, q.zero, q.tenscale, meta
    )
    if q.mask is not None and q.mode is not CastMode.COMPRESS:
        values = np.where(q.mask, values, np.float32(0))
    elif q.mask is not None:
        mask = unpack_bits(q.mask, 1, int(np.prod(q.shape))).astype(bool).reshape(q.shape)
        values = np.where(mask, values, np.float32(0))
    return values.astype(out)
