"""A folder of finished trials, so a repeated or widened search runs only what is new.

One small JSON file per (trial, split), named by a sha256 of everything its result depends
on: the float model's bytes, the assignment (layer -> format), the settings (starting recipe,
weights-only or not, onnxq version), the metric's name and the split's input samples. A file
is written to a temporary name in the folder and renamed into place, so a search interrupted
at any point (Ctrl-C, kill) leaves only whole entries; leftover temporary files are ignored
and removed, after an hour, by a later search. An unreadable entry counts as missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["TrialCache", "key_of"]

_TMP = ".tmp"
_STALE_S = 3600.0


def key_of(parts: Mapping[str, Any]) -> str:
    """The sha256 of ``parts`` as canonical JSON."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _encode(value: float) -> Any:
    return value if math.isfinite(value) else repr(value)  # JSON has no inf/nan


def _decode(value: Any) -> float:
    return float(value)


class TrialCache:
    """Trial results on disk (``None`` folder: a cache that keeps nothing)."""

    def __init__(self, folder: str | os.PathLike[str] | None) -> None:
        """Use (and create) ``folder``.

        Raises:
            ValueError: the folder cannot be created or is not a folder.
        """
        self.folder = None if folder is None else Path(folder)
        if self.folder is None:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ValueError(
                f"cache folder {str(self.folder)!r} cannot be created ({err.strerror or err})"
            ) from None
        if not self.folder.is_dir():
            raise ValueError(f"cache {str(self.folder)!r} is not a folder")
        now = time.time()
        for stale in self.folder.glob(f"*/.*{_TMP}"):  # what interrupted writers left
            with contextlib.suppress(OSError):
                if now - stale.stat().st_mtime > _STALE_S:  # not a live writer's
                    stale.unlink()

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> float | None:
        """The stored metric of ``key``, or None."""
        if self.folder is None:
            return None
        try:
            data = json.loads(self._path(key).read_text(encoding="utf-8"))
            return _decode(data["metric"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, value: float, about: Mapping[str, Any]) -> None:
        """Store ``value`` under ``key`` (atomically; ``about`` is kept for people reading)."""
        if self.folder is None:
            return
        path = self._path(key)
        path.parent.mkdir(exist_ok=True)
        temp = path.parent / f".{path.name}.{secrets.token_hex(4)}{_TMP}"
        text = json.dumps({"metric": _encode(value), **about}, sort_keys=True, default=str)
        try:
            temp.write_text(text + "\n", encoding="utf-8")
            os.replace(temp, path)
        except OSError:
            pass  # a full or read-only disk: the search goes on, that trial is not kept
        finally:
            with contextlib.suppress(OSError):
                temp.unlink()
