"""`cast`, `upcast` and `QTensor`: one contract, several backends (architecture decision 12).

Layouts of a `QTensor` (all fields are numpy arrays):

- ``data``: ``actual`` - element codes of the input's shape, unsigned, the smallest width
  that holds them (two's complement for ints, the bit pattern for floats, table index for
  codebooks); ``compress`` - those codes bit-packed as one uint8 stream in C order
  (packing.py), pruned (N:M) positions left out.
- ``scale`` / ``zero``: codes of the scale and zero-point types in *tile grid* layout - the
  input's axis order with the tiled dims replaced by tile counts (shape (1,) for one scale).
- ``tenscale``: the tensor scale code, shape (1,).
- ``meta``: codebook mapping index or MX shift bit per subtile (per tile for codebooks without
  subtiles), grid layout; packed to ``meta_bits`` each in compress mode.
- ``mask``: N:M sparsity, bool of the input's shape; packed one bit each in compress mode.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import ml_dtypes
import numpy as np

from onnxq.cast import native, reference
from onnxq.cast.packing import pack_bits, unpack_bits
from onnxq.cast.qtensor import QTensor
from onnxq.formats.datatype import DataType, datatype
from onnxq.formats.modes import Backend, CastMode, NanPolicy, RoundMode, ScaleMode, current_defaults

__all__ = ["QTensor", "cast", "upcast"]

_FLOAT_DTYPES = {
    np.dtype(np.float32): "float32",
    np.dtype(np.float16): "float16",
    np.dtype(ml_dtypes.bfloat16): "bfloat16",
}


def _as_datatype(dtype: DataType | str) -> DataType:
    if isinstance(dtype, DataType):
        return dtype
    if isinstance(dtype, str):
        return datatype(dtype)
    raise TypeError(f"dtype must be a DataType or a preset/code string, got {type(dtype).__name__}")


def _is_torch(x: Any) -> bool:
    """True for a torch.Tensor; torch is imported only when the object comes from it."""
    if not type(x).__module__.startswith("torch"):
        return False
    try:
        import torch
    except ImportError:
        return False  # not a real tensor: _check_input names its type
    return isinstance(x, torch.Tensor)


def _check_input(x: Any) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(
            f"cast expects a numpy array of float32, float16 or bfloat16, got {type(x).__name__}"
        )
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"cast expects float32, float16 or bfloat16 data, got {x.dtype}; "
            f"convert first, e.g. x.astype(np.float32)"
        )
    if x.size == 0:
        raise ValueError(f"cannot cast an empty tensor (shape {x.shape})")
    if x.ndim == 0:
        raise ValueError("cannot cast a 0-D scalar; reshape it to (1,)")
    return x


def _pick_backend(backend: Backend) -> Backend:
    if backend is Backend.REFERENCE:
        return Backend.REFERENCE
    if backend is Backend.AUTO:
        if native.available():
            return Backend.NATIVE
        native.warn_unavailable_once()
        return Backend.REFERENCE
    if backend is Backend.NATIVE:
        if not native.available():
            raise NotImplementedError(
                f"backend 'native' is not available: {native.missing_reason()}"
            )
        return Backend.NATIVE
    raise NotImplementedError(
        f"backend {backend.value!r} is not available in this build; use backend='reference' "
        f"(or 'auto')"
    )


def cast(
    x: np.ndarray,
    dtype: DataType | str,
    *,
    mode: CastMode | str | None = None,
    axis: int = -1,
    round_mode: RoundMode | str | None = None,
    scale_mode: ScaleMode | str | None = None,
    nan_policy: NanPolicy | str | None = None,
    seed: int | None = None,
    backend: Backend | str | None = None,
    metric: reference.Metric | None = None,
    int_range: str = "symmetric",
    out: np.ndarray | None = None,
) -> np.ndarray | QTensor:
    """Cast ``x`` to ``dtype``: fake-quantize (``virtual``) or encode (``actual``/``compress``).

    Args:
        x: float32, float16 or bfloat16 numpy array, 1-D or more, not empty.
        dtype: a DataType, a preset name (``"mxfp4"``) or a data type code.
        mode: ``virtual`` (same shape and dtype as ``x``), ``actual`` or ``compress``.
        axis: the axis 1-D tiles run along (2-D tiles: the last two after moving it last).
        round_mode: ``even``, ``away``, ``zero`` or ``stochastic``.
        scale_mode: ``floor``, ``ceil``, ``midmax``, ``option3``, ``topbinade``, ``rceil``,
            ``even`` (power-of-two scales of float elements; ints always use floor).
        nan_policy: ``element`` or ``block`` (docs/architecture.md, decision 5).
        seed: stochastic rounding seed; the same seed gives the same bits on every backend.
        backend: ``auto``, ``reference``, ``native`` or ``triton``.
        metric: codebook mapping error, ``(scaled, quantized) -> error`` per unit (L2 default).
        int_range: ``symmetric`` (+-(2^(N-1)-1)) or ``full`` (allows -2^(N-1), Quark MXINT8).
        out: ``virtual`` only: a C-contiguous, writeable array of ``x``'s shape and dtype that
            receives the result (``x`` itself casts in place); saves allocating and first
            touching a new array on every call.

    Returns:
        The fake-quantized array (``virtual``; ``out`` when given) or a `QTensor`.

    Raises:
        TypeError: ``x`` is not a float32/float16/bfloat16 array, or ``dtype`` has a bad type.
        ValueError: empty input, bad axis, unknown mode or malformed dtype code.
        NotImplementedError: the requested backend or mode cannot do this cast.
    """
    if _is_torch(x):  # torch stays optional: imported only when a tensor comes in
        from onnxq.cast.torch_bridge import cast_torch

        if out is not None:
            raise TypeError("out= takes numpy arrays; for torch tensors assign the result")
        return cast_torch(
            x, _as_datatype(dtype), mode=mode, axis=axis, round_mode=round_mode,
            scale_mode=scale_mode, nan_policy=nan_policy, seed=seed, backend=backend,
            metric=metric, int_range=int_range,
        )  # fmt: skip
    d = current_defaults()
    x = _check_input(x)
    dt = _as_datatype(dtype)
    cast_mode = CastMode.parse(mode if mode is not None else d.mode)
    rmode = RoundMode.parse(round_mode if round_mode is not None else d.round_mode)
    smode = ScaleMode.parse(scale_mode if scale_mode is not None else d.scale_mode)
    policy = NanPolicy.parse(nan_policy if nan_policy is not None else d.nan_policy)
    chosen = _pick_backend(Backend.parse(backend if backend is not None else d.backend))
    if int_range not in ("symmetric", "full"):
        raise ValueError(f"unknown int_range {int_range!r}: expected 'symmetric' or 'full'")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for a {x.ndim}-D tensor of shape {x.shape}")
    axis = int(axis) % x.ndim
    if out is not None:
        _check_out(out, x, cast_mode)
    if chosen is Backend.NATIVE and (lacking := native.unsupported(dt, metric=metric)):
        if Backend.parse(backend if backend is not None else d.backend) is Backend.NATIVE:
            raise NotImplementedError(f"backend 'native' cannot do this cast: {lacking}")
        chosen = Backend.REFERENCE
    engine = native.quantize if chosen is Backend.NATIVE else reference.quantize
    extra: dict[str, Any] = {"values_dtype": x.dtype} if chosen is Backend.NATIVE else {}
    if chosen is Backend.NATIVE and out is not None:
        extra["values_out"] = out
    if chosen is Backend.REFERENCE:
        extra["metric"] = metric
        extra["finite_dtype"] = x.dtype
    enc = engine(
        x if chosen is Backend.NATIVE else x.astype(np.float32),
        dt,
        axis=axis,
        round_mode=rmode,
        scale_mode=smode,
        nan_policy=policy,
        seed=int(seed if seed is not None else d.seed),
        full_int_range=int_range == "full",
        want_codes=cast_mode is not CastMode.VIRTUAL,
        **extra,
    )
    if cast_mode is CastMode.VIRTUAL:
        if out is not None:
            if enc.values is not out:
                np.copyto(out, enc.values.astype(x.dtype, copy=False))
            return out
        return enc.values.astype(x.dtype, copy=False)
    assert enc.codes is not None
    q = QTensor(
        data=enc.codes,
        dtype=dt,
        shape=tuple(x.shape),
        axis=axis,
        mode=cast_mode,
        scale=enc.scale,
        zero=enc.zero,
        tenscale=enc.tenscale,
        meta=enc.meta,
        mask=enc.mask,
    )
    return _compress(q) if cast_mode is CastMode.COMPRESS else q


def _check_out(out: Any, x: np.ndarray, mode: CastMode) -> None:
    """Check the ``out=`` of `cast`: C-contiguous, writeable, x's shape and dtype, virtual."""
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


def _compress(q: QTensor) -> QTensor:
    codes = q.data if q.mask is None else q.data[q.mask]
    return dataclasses.replace(
        q,
        data=pack_bits(codes, q.dtype.nspec.bits),
        meta=None if q.meta is None else pack_bits(q.meta, q.dtype.meta_bits),
        mask=None if q.mask is None else pack_bits(q.mask.astype(np.uint8), 1),
    )


def _expand(q: QTensor) -> tuple[np.ndarray, np.ndarray | None]:
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
        from onnxq.cast.layout import Tiling

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


def upcast(q: QTensor, dtype: Any = np.float32) -> np.ndarray:
    """Decode a `QTensor` from `cast` (actual or compress) to a float array.

    ``upcast(cast(x, dt, mode="compress"), x.dtype)`` equals ``cast(x, dt)`` bit for bit.

    Raises:
        TypeError: ``q`` is not a QTensor or ``dtype`` is not float32/float16/bfloat16.
    """
    if not isinstance(q, QTensor):
        raise TypeError(
            "upcast expects a QTensor from cast(..., mode='actual'|'compress'), "
            f"got {type(q).__name__}"
        )
    if _is_torch(q.data):
        from onnxq.cast.torch_bridge import upcast_torch

        return upcast_torch(q, dtype)
    out = np.dtype(dtype)
    if out not in _FLOAT_DTYPES:
        raise TypeError(f"upcast returns float32, float16 or bfloat16, not {out}")
    if q.mode is CastMode.COMPRESS:
        codes, meta = _expand(q)
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


def _warn_once(message: str) -> None:  # pragma: no cover - used by later backends
    warnings.warn(message, RuntimeWarning, stacklevel=3)
