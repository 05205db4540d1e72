"""Progress on long work: a one-line bar on a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """A one-line progress bar on a terminal; silent when the stream is not a TTY.

    Called as ``bar(done, total, what)``, the signature `onnxq.quantize_model` reports with.
    """

    def __init__(self, stream: TextIO | None = None, width: int = 28, always: bool = False) -> None:
        """Draw on ``stream`` (default stderr) when it is a terminal.

        Args:
            stream: where to draw.
            width: the bar's width in characters.
            always: draw on any stream (``quantize_model(progress=True)`` asked for it).
        """
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = always or bool(isatty and isatty())
        self.width = width
        self._last = 0.0
        self._drawn = 0

    def __call__(self, done: int, total: int, what: str = "") -> None:
        """Redraw the bar (at most ten times a second, and always at the end)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if done < total and now - self._last < 0.1:
            return
        self._last = now
        frac = min(max(done / total, 0.0), 1.0) if total > 0 else 0.0
        fill = round(frac * self.width)
        label = what if len(what) <= 32 else "..." + what[-29:]
        text = f"[{'#' * fill}{'.' * (self.width - fill)}] {done}/{total} {label}"
        self.stream.write("\r" + text.ljust(self._drawn))
        self.stream.flush()
        self._drawn = len(text)

    def close(self) -> None:
        """Erase the bar."""
        if self.enabled and self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()
            self._drawn = 0
