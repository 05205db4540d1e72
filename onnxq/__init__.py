"""onnxq: an ONNX graph quantizer and bit-exact cast engine for block-scaled number formats."""

from onnxq import bfp
from onnxq.cast import QTensor, cast, upcast
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
