"""What the whole suite shares: skips for a machine without the native library, written once.

Markers (registered in pyproject.toml):

- ``needs_native``: the native library (libonnxq_ops) is built and loads (`onnxq.cast.native`);
- ``needs_custom_ops``: that library also holds the onnxruntime custom ops (`onnxq.runtime`).

Mark a module with ``pytestmark = pytest.mark.needs_native`` or a test with
``@pytest.mark.needs_custom_ops``; a marked test is skipped, with the reason, where the library
is missing, and the skip is reported at the test's own line. Each check runs once per process,
after collection and only when a collected test carries its marker.
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
    return native.missing_reason() or "the native library does not load"


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests whose ``needs_*`` marker names something this machine lacks."""
    for marker, missing in NEEDS.items():
        for item in items:
            if item.get_closest_marker(marker) is not None and (reason := missing()):
                item.add_marker(pytest.mark.skip(reason=reason))
