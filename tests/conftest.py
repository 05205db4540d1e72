"""What the whole suite shares: skips for a machine without the native library, written once.

Markers (registered in pyproject.toml):

- ``needs_native``: the native library (libonnxq_ops) is built and loads (`onnxq.cast.native`);
- ``needs_custom_ops``: that library also holds the onnxruntime custom ops (`onnxq.runtime`).

Mark a module with ``pytestmark = pytest.mark.needs_native`` or a test with
``@pytest.mark.needs_custom_ops``; a marked test is skipped, with the reason, where the library
is missing. Each check runs once per process, when the first marked test is set up, so
collecting the tests never loads the library.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest


@functools.cache
def native_missing() -> str:
    """Why the native library cannot be used here ("" when it can)."""
    from onnxq.cast import native

    if native.available():
        return ""
    return f"the native library is not built: {native.missing_reason()}"


@functools.cache
def custom_ops_missing() -> str:
    """Why the onnxruntime custom ops cannot be used here ("" when they can)."""
    from onnxq import runtime

    if runtime.has_custom_ops():
        return ""
    return "libonnxq_ops is not built with the onnxruntime custom ops"


NEEDS: dict[str, Callable[[], str]] = {
    "needs_native": native_missing,
    "needs_custom_ops": custom_ops_missing,
}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a test whose ``needs_*`` marker names something this machine lacks."""
    for marker, missing in NEEDS.items():
        if item.get_closest_marker(marker) is not None and (reason := missing()):
            pytest.skip(reason)
