"""QTensor: a quantized tensor's codes and everything needed to upcast them.

Fields and their layouts (actual and compress mode) are described in `onnxq.cast.api`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from onnxq.formats.datatype import DataType
from onnxq.formats.modes import CastMode

__all__ = ["QTensor"]


@dataclasses.dataclass
class QTensor:
    """A quantized tensor: codes plus what is needed to upcast them (see module doc)."""

    data: np.ndarray
    dtype: DataType
    shape: tuple[int, ...]
    axis: int
    mode: CastMode
    scale: np.ndarray | None = None
    zero: np.ndarray | None = None
    tenscale: np.ndarray | None = None
    meta: np.ndarray | None = None
    mask: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of every stored field (what the quantized tensor costs)."""
        fields = (self.data, self.scale, self.zero, self.tenscale, self.meta, self.mask)
        return sum(f.nbytes for f in fields if f is not None)
