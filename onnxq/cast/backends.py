"""The backend table: every engine as ``quantize(x, request) -> Encoded``, and which one runs.

`BACKENDS` is the one table `cast` dispatches through, for numpy arrays and torch tensors
alike. The reference and native engines take numpy arrays, Triton torch tensors; the adapters
here give them one signature and one result type (the Triton engines' dicts become `Encoded`).
`choose_for_array` and `choose_for_tensor` turn the requested backend (``auto`` included) into
the engine that runs (docs/architecture.md, decision 12).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from onnxq.cast import native, reference
from onnxq.cast.request import CastRequest, Encoded
from onnxq.formats.modes import Backend, CastMode, ScaleMode

__all__ = ["BACKENDS", "Quantize", "choose_for_array", "choose_for_tensor", "triton_gap"]

# x (numpy for reference/native, torch for triton), the request; ``out``: where a backend that
# can may write the values (native only; the others ignore it and the caller copies).
Quantize = Callable[..., Encoded]

_warned: set[str] = set()


def _reference(x: np.ndarray, request: CastRequest, out: np.ndarray | None = None) -> Encoded:
    """The numpy reference on a numpy array (values come back float32)."""
    return reference.quantize(
        x.astype(np.float32),
        request.dtype,
        axis=request.axis,
        round_mode=request.round_mode,
        scale_mode=request.scale_mode,
        nan_policy=request.nan_policy,
        seed=request.seed,
        metric=request.metric,
        full_int_range=request.full_int_range,
        want_codes=request.want_codes,
        finite_dtype=x.dtype,
    )


def _native(x: np.ndarray, request: CastRequest, out: np.ndarray | None = None) -> Encoded:
    """The C++ kernels on a numpy array (values come back in x's dtype, into ``out`` if given)."""
    return native.quantize(
        x,
        request.dtype,
        axis=request.axis,
        round_mode=request.round_mode,
        scale_mode=request.scale_mode,
        nan_policy=request.nan_policy,
        seed=request.seed,
        full_int_range=request.full_int_range,
        want_codes=request.want_codes,
        values_dtype=x.dtype,
        values_out=out,
    )


def _triton(x: Any, request: CastRequest, out: Any = None) -> Encoded:
    """The Triton engines on a torch tensor (fast path, general engine or codebook engine).

    Values come back only for virtual casts, codes only otherwise.
    """
    from onnxq.cast import triton as tk
    from onnxq.cast import triton_codebook as tcb
    from onnxq.cast import triton_fast as tf
    from onnxq.cast import triton_search as tsearch

    dt, virtual = request.dtype, not request.want_codes
    book = dt.nspec.is_codebook
    searched = request.scale_mode is ScaleMode.SEARCH  # general kernel, once per candidate
    fp = None
    if not (book or searched):
        fp = tf.fast_plan(tuple(x.shape), dt, request.axis, request.round_mode)
    # the fast kernel packs codes of tiles along the last axis (others: packed afterwards)
    packed = fp is not None and fp.inner == 1 and request.mode is CastMode.COMPRESS
    if fp is not None:
        res = tf.quantize(
            x.detach(),
            dt,
            fp,
            scale_mode=request.scale_mode,
            nan_policy=request.nan_policy,
            full_int_range=request.full_int_range,
            want_values=virtual,
            want_codes=not virtual,
            packed=packed,
        )
    else:
        engine = tsearch if searched else (tcb if book else tk)
        res = engine.quantize(
            x.detach(),
            dt,
            axis=request.axis,
            round_mode=request.round_mode,
            scale_mode=request.scale_mode,
            nan_policy=request.nan_policy,
            seed=request.seed,
            full_int_range=request.full_int_range,
            want_values=virtual,
            want_codes=not virtual,
        )
    return Encoded(**{"values": None, **res}, packed=packed)


BACKENDS: dict[Backend, Quantize] = {
    Backend.REFERENCE: _reference,
    Backend.NATIVE: _native,
    Backend.TRITON: _triton,
}


def choose_for_array(request: CastRequest) -> Backend:
    """The engine that casts a numpy array: native or reference (auto prefers native).

    Raises:
        NotImplementedError: the asked-for backend is missing or cannot do this cast.
    """
    asked = request.backend
    if asked is Backend.AUTO:
        if not native.available():
            native.warn_unavailable_once()
            return Backend.REFERENCE
    elif asked is Backend.NATIVE:
        if not native.available():
            raise NotImplementedError(
                f"backend 'native' is not available: {native.missing_reason()}"
            )
    elif asked is not Backend.REFERENCE:
        raise NotImplementedError(
            f"backend {asked.value!r} is not available in this build; use backend='reference' "
            f"(or 'auto')"
        )
    if asked is Backend.REFERENCE:
        return Backend.REFERENCE
    if lacking := native.unsupported(request.dtype, metric=request.metric):
        if asked is Backend.NATIVE:
            raise NotImplementedError(f"backend 'native' cannot do this cast: {lacking}")
        return Backend.REFERENCE
    return Backend.NATIVE


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def warn_once(message: str, stacklevel: int = 2) -> None:
    """Warn once per process per message (``stacklevel`` counted from the caller)."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)


def choose_for_tensor(x: Any, request: CastRequest) -> Backend:
    """The engine that casts a torch tensor: triton (CUDA, or asked for) or reference.

    ``auto`` on a CUDA tensor falls back to the reference, with one warning, for what Triton
    does not implement.

    Raises:
        NotImplementedError: backend ``native``, or ``triton`` for a cast it cannot do.
        ValueError: ``triton`` for a CPU tensor outside TRITON_INTERPRET=1.
    """
    asked = request.backend
    if asked is Backend.NATIVE:
        raise NotImplementedError(
            "backend 'native' is not available in this build; use backend='reference' or 'auto'"
        )
    if asked is Backend.TRITON and not x.is_cuda and not _interpreting():
        raise ValueError(
            f"backend='triton' needs a CUDA tensor, got one on {x.device}; move it with "
            f"x.cuda(), use backend='reference', or set TRITON_INTERPRET=1 to run the "
            f"kernels in Triton's CPU interpreter"
        )
    if asked is Backend.TRITON or (asked is Backend.AUTO and x.is_cuda):
        why = triton_gap(tuple(x.shape), request)
        if why is None:
            return Backend.TRITON
        if asked is Backend.TRITON:
            raise NotImplementedError(why)
        # stack: warn_once <- here <- cast_torch <- onnxq.cast <- the user's call
        warn_once(f"{why}; falling back to the numpy reference for this cast", stacklevel=4)
    return Backend.REFERENCE


def triton_gap(shape: tuple[int, ...], request: CastRequest) -> str | None:
    """Why Triton cannot do this cast, or None."""
    try:
        from onnxq.cast import triton as tk
    except ImportError as err:  # pragma: no cover - depends on the environment
        return f"the Triton engine needs triton ({err})"
    if request.metric is not None:
        return "the Triton engine does not implement custom codebook metrics"
    dt = request.dtype
    searched = request.scale_mode is ScaleMode.SEARCH
    if dt.nspec.is_codebook:
        from onnxq.cast import triton_codebook as tcb

        return tcb.supports(dt, shape, request.axis)
    from onnxq.cast import triton_fast

    if not searched and triton_fast.fast_plan(shape, dt, request.axis, request.round_mode):
        return None
    try:
        tk.plan(shape, dt, request.axis)
    except NotImplementedError as err:
        return str(err)
    return None
