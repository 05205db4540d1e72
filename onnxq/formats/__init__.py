"""The format language: number, scale and data type specifications (no numpy needed)."""

from __future__ import annotations

from onnxq.formats import limits
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType, datatype, datatypes, register
from onnxq.formats.modes import (
    Backend,
    CastMode,
    NanPolicy,
    RoundMode,
    ScaleMode,
    current_defaults,
    defaults,
)
from onnxq.formats.number import InfNaN, Kind, NumberSpec, number_spec
from onnxq.formats.scale import ScaleSpec, TileSpec, scale

__all__ = [
    "Backend",
    "CastMode",
    "Codebook",
    "DataType",
    "InfNaN",
    "Kind",
    "NanPolicy",
    "NumberSpec",
    "RoundMode",
    "ScaleMode",
    "ScaleSpec",
    "TileSpec",
    "current_defaults",
    "datatype",
    "datatypes",
    "defaults",
    "number",
    "register",
    "scale",
]


def number(code: str) -> NumberSpec:
    """Parse a number code: a `Codebook` when it starts with ``cb``, else a `NumberSpec`.

    Raises:
        ValueError: the code is malformed; the message names the part and the expected form.
        TypeError: ``code`` is not a string.
    """
    if not isinstance(code, str):
        raise TypeError(f"a number code must be a str, got {type(code).__name__}")
    if limits.normalize(code).startswith("cb"):
        return Codebook.parse(code)
    return number_spec(code)
