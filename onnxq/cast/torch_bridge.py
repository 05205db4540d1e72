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
from typing import Any

import ml_dtypes
import numpy as np
import torch

from onnxq.cast.backends import BACKENDS, choose_for_tensor, warn_once
from onnxq.cast.numpy_path import cast_array, upcast_array
from onnxq.cast.request import CastRequest
from onnxq.formats.modes import Backend, CastMode

__all__ = ["cast_torch", "upcast_torch"]

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


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


def check_tensor(x: torch.Tensor) -> None:
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


def cast_torch(x: torch.Tensor, request: CastRequest) -> Any:
    """`onnxq.cast` for a checked torch tensor and its resolved request (module doc: backends).

    Raises:
        ValueError: a CPU tensor with ``backend="triton"``.
        NotImplementedError: ``backend="triton"`` for a cast Triton does not implement.
    """
    chosen = choose_for_tensor(x, request)
    if chosen is Backend.TRITON:
        from onnxq.cast import triton as tk

        enc = BACKENDS[chosen](x, request)
        if request.mode is CastMode.VIRTUAL:
            return enc.values
        fields = {f.name: getattr(enc, f.name) for f in dataclasses.fields(enc)}
        return tk.to_qtensor(
            fields, x, request.dtype, request.axis, request.mode, packed=enc.packed
        )
    result = cast_array(_to_numpy(x), request, chosen)
    if isinstance(result, np.ndarray):
        out = _to_torch(result, x.device)
        assert out is not None
        return out
    fields = {
        f: _to_torch(getattr(result, f), x.device)
        for f in ("data", "scale", "zero", "tenscale", "meta", "mask")
    }
    return dataclasses.replace(result, **fields)


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
    out = _torch_dtype(dtype)
    device = q.data.device
    if device.type == "cuda":
        try:
            from onnxq.cast import triton as tk

            if q.dtype.nspec.is_codebook:
                from onnxq.cast import triton_codebook as tcb

                if (why := tcb.supports(q.dtype, q.shape, q.axis)) is not None:
                    raise NotImplementedError(why)
            else:
                tk.plan(q.shape, q.dtype, q.axis)
        except (ImportError, NotImplementedError) as err:
            # stack: warn_once <- here <- onnxq.upcast <- the user's call
            warn_once(f"{err}; falling back to the numpy reference for this upcast", stacklevel=3)
        else:
            return upcast_triton(q, out)
    fields = {
        f: None if getattr(q, f) is None else _to_numpy(getattr(q, f))
        for f in ("data", "scale", "zero", "tenscale", "meta", "mask")
    }
    npq = dataclasses.replace(q, **fields)
    np_out = {torch.float32: np.float32, torch.float16: np.float16}.get(out, ml_dtypes.bfloat16)
    result = _to_torch(upcast_array(npq, np_out), device)
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

    if not q.dtype.nspec.is_codebook:
        return tk.upcast(q, out)
    codes, mask = tk.unpacked_codes(q)
    meta = q.meta
    if q.mode is CastMode.COMPRESS and meta is not None:
        grid = tcb.meta_shape(q.dtype, q.shape, q.axis)
        meta = tk.unpack_bits(meta, q.dtype.meta_bits, math.prod(grid))
    # pruned positions read as zero (numpy_path.upcast_array)
    return tcb.dequantize(
        q.dtype, q.shape, q.axis, codes, q.scale, q.tenscale, meta, out_dtype=out, mask=mask
    )
