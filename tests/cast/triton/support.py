"""What the Triton engine tests share: device setup, data conversion and bitwise comparison.

Import it before anything imports triton: without a GPU it sets ``TRITON_INTERPRET=1`` first
(Triton reads it at import), so the kernels run in Triton's CPU interpreter; with one
(``torch.cuda.is_available()``) the tests run on CUDA tensors. A module importing this one is
skipped where torch or triton is missing, or where triton was imported without the interpreter.
It also binds the lazy ``onnxq.cast`` function, so the onnxq.cast.* submodules can follow it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterable

import numpy as np
import pytest

torch = pytest.importorskip("torch")

GPU = torch.cuda.is_available()
if not GPU:
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton was imported without TRITON_INTERPRET=1", allow_module_level=True)
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

import ml_dtypes  # noqa: E402

import onnxq  # noqa: E402

# Bind the lazy `onnxq.cast` function before importing onnxq.cast.* submodules: importing a
# submodule first leaves `onnxq.cast` bound to the package (onnxq/__init__.py's lazy import).
assert callable(onnxq.cast)

from onnxq.cast.api import QTensor, upcast  # noqa: E402

DEV = "cuda" if GPU else "cpu"
TORCH_DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
NP_DT = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def skip_overflow_checks() -> None:
    """Interpreter only: stop computing integer overflow checks.

    They only assert in debug mode (off, as on a GPU), but the interpreter still computes
    them: a quarter of test_engine.py's time.
    """
    if GPU:
        return
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


def to_torch(x: np.ndarray, dtype: str) -> torch.Tensor:
    """``x`` as a ``dtype`` tensor on the test device (bfloat16 through its bits)."""
    a = np.ascontiguousarray(x.astype(NP_DT[dtype]))
    if dtype == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(DEV)
    return torch.from_numpy(a).to(DEV)


def bits(a: np.ndarray | torch.Tensor) -> np.ndarray:
    """Integer view of a float array or tensor (what the comparisons use), as int64."""
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu()
        if a.dtype in (torch.bfloat16, torch.float16):
            return a.view(torch.int16).numpy().astype(np.int64)
        if a.dtype == torch.float32:
            return a.view(torch.int32).numpy().astype(np.int64)
        if a.dtype == torch.uint32:
            return a.view(torch.int32).numpy().astype(np.int64) & 0xFFFFFFFF
        if a.dtype == torch.uint16:
            return a.view(torch.int16).numpy().astype(np.int64) & 0xFFFF
        return a.numpy().astype(np.int64)
    a = np.asarray(a)
    if a.dtype == np.float32:
        return a.view(np.int32).astype(np.int64)
    if a.dtype in (np.float16, np.dtype(ml_dtypes.bfloat16)):
        return a.view(np.int16).astype(np.int64)
    return a.astype(np.int64)


def assert_same(got: torch.Tensor | None, want: np.ndarray | None, what: str) -> None:
    """``got`` and ``want`` are both None, or hold the same bits in the same shape."""
    if want is None:
        assert got is None, what
        return
    assert got is not None, f"{what}: missing"
    g, w = bits(got), bits(want)
    assert g.shape == w.shape, f"{what}: shape {g.shape}, want {w.shape}"
    bad = np.nonzero(g.reshape(-1) != w.reshape(-1))[0]
    assert bad.size == 0, (
        f"{what}: {bad.size} of {w.size} differ, first at flat {bad[:5].tolist()}: "
        f"got {g.reshape(-1)[bad[:5]].tolist()}, want {w.reshape(-1)[bad[:5]].tolist()}"
    )


QFIELDS = ("data", "scale", "zero", "tenscale", "meta", "mask")


def assert_same_qtensor(got, want, label: str) -> None:
    """Every field of two QTensors (the engine's, the reference's), bit for bit."""
    for field in QFIELDS:
        assert_same(getattr(got, field), getattr(want, field), f"{label} {field}")


def compare(
    x: np.ndarray,
    dtype: str,
    modes: Iterable[str],
    reference: Callable[[np.ndarray, str], object],
    engine: Callable[[torch.Tensor, str], object],
    engine_upcast: Callable[[QTensor, torch.dtype], torch.Tensor],
    outs: Iterable[str],
    label: Callable[[str], str],
) -> None:
    """An engine's casts of ``x`` (as ``dtype``) against the reference's, bit for bit.

    For each mode, ``reference(x as numpy dtype, mode)`` and ``engine(x as tensor, mode)``:
    values of the input dtype in virtual mode, else QTensors compared field by field and
    upcast (``engine_upcast``, the reference's `upcast`) to each dtype of ``outs``.
    """
    xn = x.astype(NP_DT[dtype])
    xt = to_torch(x, dtype)
    for mode in modes:
        want = reference(xn, mode)
        got = engine(xt, mode)
        what = label(mode)
        if mode == "virtual":
            assert isinstance(got, torch.Tensor) and got.dtype == xt.dtype, what
            assert_same(got, want, what + " values")
            continue
        assert isinstance(got, QTensor) and isinstance(want, QTensor)
        assert_same_qtensor(got, want, what)
        for out in dict.fromkeys(outs):
            assert_same(
                engine_upcast(got, TORCH_DT[out]),
                upcast(want, NP_DT[out]),
                f"{what} upcast to {out}",
            )
