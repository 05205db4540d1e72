"""onnxq: an ONNX graph quantizer and bit-exact cast engine for block-scaled number formats."""

from typing import Any

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

__version__ = "0.1.0"

# The cast engine needs numpy; the format language does not. Import the engine on first use so
# that `import onnxq.formats` works on a machine without numpy.
_LAZY = {"QTensor": "onnxq.cast", "cast": "onnxq.cast", "upcast": "onnxq.cast", "bfp": "onnxq.bfp"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name])
        value = module if name == "bfp" else getattr(module, name)
        globals()[name] = value
        return value
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
    "register",
    "scale",
    "upcast",
]
