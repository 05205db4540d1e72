"""The cast engine: `cast`, `upcast` and `QTensor` over the numpy reference and faster backends."""

from onnxq.cast.api import QTensor, cast, upcast

__all__ = ["QTensor", "cast", "upcast"]
