"""What a backend is asked (`CastRequest`) and what it answers (`Encoded`).

`resolve` is the one place where `cast`'s keyword arguments meet the `onnxq.defaults` in force
and are validated; numpy and torch inputs both go through it, and every backend reads the
frozen request it returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from onnxq.formats.datatype import DataType, datatype
from onnxq.formats.modes import Backend, CastMode, NanPolicy, RoundMode, ScaleMode, current_defaults

__all__ = ["CastRequest", "Encoded", "Metric", "as_datatype", "resolve"]

# A codebook error metric: (scaled values, their quantized values), both (..., unit) -> (...).
Metric = Callable[[np.ndarray, np.ndarray], np.ndarray]

INT_RANGES = ("symmetric", "full")


@dataclasses.dataclass(frozen=True)
class CastRequest:
    """One cast's settings, defaults applied and validated (built by `resolve`)."""

    dtype: DataType
    axis: int  # non-negative, < the input's rank
    mode: CastMode
    round_mode: RoundMode
    scale_mode: ScaleMode
    nan_policy: NanPolicy
    seed: int
    int_range: str  # "symmetric" or "full"
    backend: Backend  # as asked for: auto may still become any engine
    metric: Metric | None = None

    @property
    def full_int_range(self) -> bool:
        """Ints may use -2^(N-1) (Quark MXINT8)."""
        return self.int_range == "full"

    @property
    def want_codes(self) -> bool:
        """The cast returns a QTensor, so the backend must return codes."""
        return self.mode is not CastMode.VIRTUAL


@dataclasses.dataclass
class Encoded:
    """A backend's answer: unpacked codes in the layouts of layout.py (numpy or torch arrays).

    Every field but ``values`` is None unless the request wants codes (``mask``: sparse
    formats); ``values`` is None only when a backend was asked for codes alone.
    """

    values: Any  # input shape: the virtual (fake-quantized) result
    codes: Any = None  # element codes, input shape (uint)
    scale: Any = None  # scale codes, tile grid
    zero: Any = None  # zero point codes, tile grid
    tenscale: Any = None  # tensor scale code, shape (1,)
    meta: Any = None  # mapping index / shift bit, subtile (or tile) grid
    mask: Any = None  # bool, input shape: kept by N:M sparsity
    packed: bool = False  # codes and meta are already packing.py's byte streams


def as_datatype(dtype: DataType | str) -> DataType:
    """A `DataType` from a DataType or a preset/code string.

    Raises:
        TypeError: ``dtype`` is neither.
    """
    if isinstance(dtype, DataType):
        return dtype
    if isinstance(dtype, str):
        return datatype(dtype)
    raise TypeError(f"dtype must be a DataType or a preset/code string, got {type(dtype).__name__}")


def resolve(
    dtype: DataType | str,
    shape: tuple[int, ...],
    *,
    mode: CastMode | str | None = None,
    axis: Any = -1,
    round_mode: RoundMode | str | None = None,
    scale_mode: ScaleMode | str | None = None,
    nan_policy: NanPolicy | str | None = None,
    seed: int | None = None,
    backend: Backend | str | None = None,
    metric: Metric | None = None,
    int_range: str = "symmetric",
) -> CastRequest:
    """Apply the defaults in force to `cast`'s arguments and check them, for input ``shape``.

    Raises:
        TypeError: ``dtype`` or ``axis`` has a bad type.
        ValueError: an unknown mode name, int_range, malformed dtype code or bad axis.
    """
    d = current_defaults()
    dt = as_datatype(dtype)
    request = CastRequest(
        dtype=dt,
        axis=0,
        mode=CastMode.parse(mode if mode is not None else d.mode),
        round_mode=RoundMode.parse(round_mode if round_mode is not None else d.round_mode),
        scale_mode=ScaleMode.parse(scale_mode if scale_mode is not None else d.scale_mode),
        nan_policy=NanPolicy.parse(nan_policy if nan_policy is not None else d.nan_policy),
        seed=int(seed if seed is not None else d.seed),
        int_range=int_range,
        backend=Backend.parse(backend if backend is not None else d.backend),
        metric=metric,
    )
    if int_range not in INT_RANGES:
        raise ValueError(f"unknown int_range {int_range!r}: expected 'symmetric' or 'full'")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    ndim = len(shape)
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for a {ndim}-D tensor of shape {shape}")
    return dataclasses.replace(request, axis=int(axis) % ndim)
