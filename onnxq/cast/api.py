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

from typing import Any

import numpy as np

from onnxq.cast.backends import choose_for_array
from onnxq.cast.numpy_path import cast_array, check_input, check_out, upcast_array
from onnxq.cast.numpy_path import expand as _expand  # noqa: F401  (tests and tools import it)
from onnxq.cast.qtensor import QTensor
from onnxq.cast.request import Metric, resolve
from onnxq.formats.datatype import DataType
from onnxq.formats.modes import Backend, CastMode, NanPolicy, RoundMode, ScaleMode

__all__ = ["QTensor", "cast", "upcast"]


def _is_torch(x: Any) -> bool:
    """True for a torch.Tensor; torch is imported only when the object comes from it."""
    if not type(x).__module__.startswith("torch"):
        return False
    try:
        import torch
    except ImportError:
        return False  # not a real tensor: check_input names its type
    return isinstance(x, torch.Tensor)


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
    metric: Metric | None = None,
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
            ``even`` (power-of-two scales of float elements; ints always use floor), or
            ``search`` (per tile, the candidate scale with the least squared error, for
            stored weights; CPU backends only; docs/formats.md, "Scale modes").
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
    torch_input = _is_torch(x)
    if torch_input:  # torch stays optional: imported only when a tensor comes in
        from onnxq.cast.torch_bridge import cast_torch, check_tensor

        if out is not None:
            raise TypeError("out= takes numpy arrays; for torch tensors assign the result")
        check_tensor(x)
    else:
        x = check_input(x)
    request = resolve(
        dtype,
        tuple(x.shape),
        mode=mode,
        axis=axis,
        round_mode=round_mode,
        scale_mode=scale_mode,
        nan_policy=nan_policy,
        seed=seed,
        backend=backend,
        metric=metric,
        int_range=int_range,
    )
    if torch_input:
        return cast_torch(x, request)
    chosen = choose_for_array(request)
    if out is not None:
        check_out(out, x, request.mode)
    return cast_array(x, request, chosen, out)


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
    return upcast_array(q, dtype)
