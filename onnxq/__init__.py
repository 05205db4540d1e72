"""onnxq: an ONNX graph quantizer and bit-exact cast engine for block-scaled number formats."""

from typing import Any

from onnxq._version import __version__
from onnxq.formats import (
    Codebook,
    DataType,
    NumberSpec,
    ScaleSpec,
    current_defaults,
    datatype,
    datatypes,
    defaults,
    number,
    register,
    scale,
)

# The cast engine needs numpy; the format language does not. Import the engine eagerly when
# numpy is there: binding `cast` here, after the subpackage `onnxq.cast` has loaded, keeps the
# name pointing at the function even when `onnxq.cast.<module>` is imported later.
try:
    import numpy as _numpy  # noqa: F401
except ImportError:  # pragma: no cover - exercised by a subprocess test
    _HAVE_NUMPY = False
else:
    _HAVE_NUMPY = True
    from onnxq.cast import QTensor, cast, upcast
    from onnxq.deploy import bfp


def __getattr__(name: str) -> Any:
    if name == "quantize_model":  # lazy: the graph pass imports onnx only when asked for
        from onnxq.graph.quantize import quantize_model

        return quantize_model
    if name == "tune":  # lazy, as quantize_model; the package is onnxq.tuning
        from onnxq.tuning import tune

        return tune
    if name in ("QTensor", "cast", "upcast", "bfp"):
        raise ImportError(f"onnxq.{name} needs numpy: pip install numpy")
    raise AttributeError(f"module 'onnxq' has no attribute {name!r}")


__all__ = [
    "Codebook",
    "DataType",
    "NumberSpec",
    "QTensor",
    "ScaleSpec",
    "__version__",
    "bfp",
    "cast",
    "current_defaults",
    "datatype",
    "datatypes",
    "defaults",
    "number",
    "quantize_model",
    "register",
    "scale",
    "tune",
    "upcast",
]
