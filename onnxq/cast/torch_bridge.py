"""Torch tensors in `onnxq.cast` / `onnxq.upcast` (imported only when one is passed in).

- CUDA tensors run the Triton kernels (`backend` ``auto`` or ``triton``); ``auto`` falls
  back to the reference, with one warning, for what Triton does not implement.
- CPU tensors run the numpy reference and come back as torch tensors (bfloat16 travels as
  its bits). ``backend="triton"`` on a CPU tensor is an error, except under
  ``TRITON_INTERPRET=1``, where Triton's interpreter runs the same kernels (how the tests
  prove them on a machine without a GPU).
- A `QTensor` built from a torch tensor holds torch tensors (on the input's device).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

import ml_dtypes
import numpy as np
import torch

from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.formats.modes import Backend, CastMode, NanPolicy, RoundMode, ScaleMode, current_defaults

__all__ = ["cast_torch", "upcast_torch"]

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_warned: set[str] = set()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _to_torch(a: np.ndarray | None, device: torch.device) -> torch.Tensor | None:
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)
    if a.dtype == np.bool_:
        return torch.from_numpy(a).to(device)
    return torch.from_numpy(a).to(device)


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def _check(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"cast expects a numpy array or a torch tensor, got {type(x).__name__}")
    if x.dtype not in _FLOATS:
        raise TypeError(
            f"cast expects float32, float16 or bfloat16 data, got {x.dtype}; "
            f"convert first, e.g. x.float()"
        )
    if x.numel() == 0:
        raise ValueError(f"cannot cast an empty tensor (shape {tuple(x.shape)})")
    if x.dim() == 0:
        raise ValueError("cannot cast a 0-D scalar; reshape it to (1,)")


def _use_triton(x: torch.Tensor, backend: Backend) -> bool:
    if backend is Backend.NATIVE:
        raise NotImplementedError(
            "backend 'native' is not available in this build; use backend='reference' or 'auto'"
        )
    if backend is Backend.TRITON:
        if not x.is_cuda and not _interpreting():
            raise ValueError(
                f"backend='triton' needs a CUDA tensor, got one on {x.device}; move it with "
                f"x.cuda(), use backend='reference', or set TRITON_INTERPRET=1 to run the "
                f"kernels in Triton's CPU interpreter"
            )
        return True
    return backend is Backend.AUTO and x.is_cuda


def cast_torch(
    x: torch.Tensor,
    dt: DataType,
    *,
    mode: CastMode | str | None,
    axis: int,
    round_mode: RoundMode | str | None,
    scale_mode: ScaleMode | str | None,
    nan_policy: NanPolicy | str | None,
    seed: int | None,
    backend: Backend | str | None,
    metric: Any,
    int_range: str,
) -> Any:
    """`onnxq.cast` for a torch tensor (see the module doc for the backend rules).

    Raises:
        TypeError: an unsupported dtype.
        ValueError: empty input, bad axis, a CPU tensor with ``backend="triton"``.
        NotImplementedError: ``backend="triton"`` for a cast Triton does not implement.
    """
    from onnxq.cast import api

    _check(x)
    d = current_defaults()
    cast_mode = CastMode.parse(mode if mode is not None else d.mode)
    rmode = RoundMode.parse(round_mode if round_mode is not None else d.round_mode)
    smode = ScaleMode.parse(scale_mode if scale_mode is not None else d.scale_mode)
    policy = NanPolicy.parse(nan_policy if nan_policy is not None else d.nan_policy)
    chosen = Backend.parse(backend if backend is not None else d.backend)
    seed = int(seed if seed is not None else d.seed)
    if int_range not in ("symmetric", "full"):
        raise ValueError(f"unknown int_range {int_range!r}: expected 'symmetric' or 'full'")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    if not -x.dim() <= axis < x.dim():
        raise ValueError(
            f"axis {axis} is out of range for a {x.dim()}-D tensor of shape {tuple(x.shape)}"
        )
    axis = int(axis) % x.dim()
    if _use_triton(x, chosen):
        why = _triton_gap(x, dt, axis, rmode, metric)
        if why is None:
            return _cast_triton(x, dt, cast_mode, axis, rmode, smode, policy, seed, int_range)
        if chosen is Backend.TRITON:
            raise NotImplementedError(why)
        _warn_once(f"{why}; falling back to the numpy reference for this cast")
    result = api.cast(
        _to_numpy(x),
        dt,
        mode=cast_mode,
        axis=axis,
        round_mode=rmode,
        scale_mode=smode,
        nan_policy=policy,
        seed=seed,
        backend=Backend.REFERENCE,
        metric=metric,
        int_range=int_range,
    )
    if isinstance(result, np.ndarray):
        out = _to_torch(result, x.device)
        assert out is not None
        return out
    fields = {
        f: _to_torch(getattr(result, f), x.device)
        for f in ("data", "scale", "zero", "tenscale", "meta", "mask")
    }
    return dataclasses.replace(result, **fields)


def _triton_gap(
    x: torch.Tensor, dt: DataType, axis: int, rmode: RoundMode, metric: Any
) -> str | None:
    """Why Triton cannot do this cast, or None."""
    try:
        from onnxq.cast import triton as tk
    except ImportError as err:  # pragma: no cover - depends on the environment
        return f"the Triton engine needs triton ({err})"
    if metric is not None:
        return "the Triton engine does not implement custom codebook metrics"
    if isinstance(dt.nspec, Codebook):
        from onnxq.cast import triton_codebook as tcb

        return tcb.supports(dt, tuple(x.shape), axis)
    from onnxq.cast import triton_fast

    if triton_fast.fast_plan(tuple(x.shape), dt, axis, rmode) is not None:
        return None
    try:
        tk.plan(tuple(x.shape), dt, axis)
    except NotImplementedError as err:
        return str(err)
    return None


def _cast_triton(
    x: torch.Tensor,
    dt: DataType,
    cast_mode: CastMode,
    axis: int,
    rmode: RoundMode,
    smode: ScaleMode,
    policy: NanPolicy,
    seed: int,
    int_range: str,
) -> Any:
    from onnxq.cast import triton as tk
    from onnxq.cast import triton_codebook as tcb
    from onnxq.cast import triton_fast as tf

    virtual = cast_mode is CastMode.VIRTUAL
    book = isinstance(dt.nspec, Codebook)
    fp = None if book else tf.fast_plan(tuple(x.shape), dt, axis, rmode)
    if fp is not None:
        res = tf.quantize(
            x.detach(),
            dt,
            fp,
            scale_mode=smode,
            nan_policy=policy,
            full_int_range=int_range == "full",
            want_values=virtual,
            want_codes=not virtual,
            packed=cast_mode is CastMode.COMPRESS,
        )
    else:
        res = (tcb if book else tk).quantize(
            x.detach(),
            dt,
            axis=axis,
            round_mode=rmode,
            scale_mode=smode,
            nan_policy=policy,
            seed=seed,
            full_int_range=int_range == "full",
            want_values=virtual,
            want_codes=not virtual,
        )
    if virtual:
        return res["values"]
    return tk.to_qtensor(res, x, dt, axis, cast_mode, packed=fp is not None)


def _torch_dtype(dtype: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in _FLOATS:
            raise TypeError(f"upcast returns float32, float16 or bfloat16, not {dtype}")
        return dtype
    npd = np.dtype(dtype)
    table = {
        np.dtype(np.float32): torch.float32,
        np.dtype(np.float16): torch.float16,
        np.dtype(ml_dtypes.bfloat16): torch.bfloat16,
    }
    if npd not in table:
        raise TypeError(f"upcast returns float32, float16 or bfloat16, not {npd}")
    return table[npd]


def upcast_torch(q: Any, dtype: Any = np.float32) -> torch.Tensor:
    """`onnxq.upcast` for a QTensor of torch tensors: Triton on CUDA, else the reference.

    Raises:
        TypeError: an unsupported output dtype.
        NotImplementedError: never for CUDA data: unsupported formats use the reference.
    """
    from onnxq.cast import api

    out = _torch_dtype(dtype)
    device = q.data.device
    if device.type == "cuda":
        try:
            from onnxq.cast import triton as tk

            if isinstance(q.dtype.nspec, Codebook):
                from onnxq.cast import triton_codebook as tcb

                if (why := tcb.supports(q.dtype, q.shape, q.axis)) is not None:
                    raise NotImplementedError(why)
            else:
                tk.plan(q.shape, q.dtype, q.axis)
        except (ImportError, NotImplementedError) as err:
            _warn_once(f"{err}; falling back to the numpy reference for this upcast")
        else:
            return upcast_triton(q, out)
    fields = {
        f: None if getattr(q, f) is None else _to_numpy(getattr(q, f))
        for f in ("data", "scale", "zero", "tenscale", "meta", "mask")
    }
    npq = dataclasses.replace(q, **fields)
    np_out = {torch.float32: np.float32, torch.float16: np.float16}.get(out, ml_dtypes.bfloat16)
    result = _to_torch(api.upcast(npq, np_out), device)
    assert result is not None
    return result


def upcast_triton(q: Any, out: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode a torch QTensor with the Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1).

    Raises:
        NotImplementedError: the format is not implemented in Triton.
    """
    import math

    from onnxq.cast import triton as tk
    from onnxq.cast import triton_codebook as tcb

    if not isinstance(q.dtype.nspec, Codebook):
        return tk.upcast(q, out)
    codes, meta = q.data, q.meta
    if q.mode is CastMode.COMPRESS:
        codes = tk.unpack_bits(codes, q.dtype.nspec.bits, math.prod(q.shape)).reshape(q.shape)
        if meta is not None:
            grid = tcb.meta_shape(q.dtype, q.shape, q.axis)
            meta = tk.unpack_bits(meta, q.dtype.meta_bits, math.prod(grid))
    return tcb.dequantize(q.dtype, q.shape, q.axis, codes, q.scale, q.tenscale, meta, out_dtype=out)
