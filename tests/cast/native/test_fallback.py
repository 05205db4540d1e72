"""Backend dispatch when the native library is missing (docs/architecture.md, decision 12)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import onnxq

_ = onnxq.cast  # resolve the lazy attribute before importing the subpackage
from onnxq.cast import native  # noqa: E402
from onnxq.cast.api import cast  # noqa: E402


@pytest.fixture
def no_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "_candidates", lambda: [Path("/nonexistent/libonnxq_ops.so")])
    monkeypatch.setattr(native, "_warned", False)
    native._load.cache_clear()
    yield
    native._load.cache_clear()


def test_explicit_native_without_the_library_names_what_is_missing(no_library: None) -> None:
    with pytest.raises(NotImplementedError, match=r"libonnxq_ops.so is not built"):
        cast(np.ones((2, 32), np.float32), "mxfp4", backend="native")


def test_auto_without_the_library_warns_once_and_uses_the_reference(no_library: None) -> None:
    x = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = cast(x, "mxfp4")
        b = cast(x, "mxfp4")
    messages = [str(w.message) for w in caught if "reference engine" in str(w.message)]
    assert len(messages) == 1, messages
    assert "not built" in messages[0]
    assert np.array_equal(a, b)
    assert np.array_equal(a, cast(x, "mxfp4", backend="reference"))
