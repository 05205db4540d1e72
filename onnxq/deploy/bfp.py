"""Block floating point with the BFP document's API and int8 layout (docs/layouts.md).

A block of ``block_size`` values shares ``shared_exp = floor(log2(max|x|)) + 1``; each value
keeps ``round(x * 2^(m - 1 - shared_exp))`` clamped to +-(2^(m-1) - 1). That is exactly an
int``m`` fixed-point element (one integer bit) with an E8M0 scale of ``2^(shared_exp - 1)``,
so this module is a thin
layer over `onnxq.cast` (the presets ``bfp16`` = int8 / block 16, ``bfp8`` = int4 / block
32) that converts to the document's packed layout ``[exponents..., mantissas...]`` (int8,
written by `onnxq.deploy.bfp_codec`, which the exporter's ``bfp-int8`` layout shares).
Blocks run over the flattened (C order) data. An all-zero block stores the exponent of the
smallest scale, -127 + 1 = -126.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxq.cast.api import QTensor, cast
from onnxq.deploy import bfp_codec
from onnxq.formats.datatype import DataType, datatype

__all__ = ["bfp_to_fp32", "dequantize", "fp32_to_bfp", "quantize"]

_FORMATS = {"bfp16": (16, 8), "bfp8": (32, 4)}


def _datatype(block_size: int, mantissa_bits: int) -> DataType:
    if not 2 <= mantissa_bits <= 8:
        raise ValueError(f"mantissa_bits={mantissa_bits}: the int8 layout holds 2..8 bits")
    if block_size < 2 or block_size & (block_size - 1):
        raise ValueError(
            f"block_size={block_size}: expected a power of two >= 2 (4, 8, 16, 32, 64)"
        )
    return datatype(f"int{mantissa_bits}", f"e8m0_t{block_size}")


def fp32_to_bfp(
    data: Any, block_size: int = 16, mantissa_bits: int = 8
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Quantize to BFP: (mantissas int8 per value, shared exponents int8 per block, meta).

    Raises:
        ValueError: bad block size or mantissa width, empty or non-finite data, or a block
            whose exponent does not fit in int8 (|x| >= 2^127).
    """
    x = np.asarray(data, dtype=np.float32)
    if x.size == 0:
        raise ValueError("cannot quantize an empty array to BFP")
    if not np.isfinite(x).all():
        raise ValueError("BFP has no NaN or Inf: the data must be finite")
    dt = _datatype(block_size, mantissa_bits)
    q = cast(x.reshape(-1), dt, mode="actual")
    assert isinstance(q, QTensor) and q.scale is not None
    # E8M0 code c = floor(log2 max) + 127 (ints are fixed point, OCP MXINT8), so
    # shared_exp = floor(log2 max) + 1 = c - 126.
    if int(q.scale.max()) > bfp_codec.MAX_SCALE_CODE:
        raise ValueError(
            "a block maximum of 2^127 or more needs a shared exponent above int8's 127"
        )
    shared = bfp_codec.shared_exponents(q.scale)
    mantissas = bfp_codec.mantissas(q.data, mantissa_bits)
    meta = {
        "format": "bfp",
        "block_size": block_size,
        "mantissa_bits": mantissa_bits,
        "num_blocks": int(shared.size),
        "shape": list(x.shape),
    }
    return mantissas, shared, meta


def bfp_to_fp32(
    mantissas: Any,
    shared_exps: Any,
    block_size: int = 16,
    mantissa_bits: int = 8,
    original_shape: tuple[int, ...] | None = None,
) -> np.ndarray:
    """Dequantize: ``mantissa * 2^(shared_exp - (m - 1))`` per block, float32.

    Raises:
        ValueError: the exponent count does not match the mantissas.
    """
    m = np.asarray(mantissas, dtype=np.int8).reshape(-1)
    e = np.asarray(shared_exps, dtype=np.int8).reshape(-1)
    blocks = -(-m.size // block_size)
    if e.size != blocks:
        raise ValueError(
            f"{m.size} mantissas in blocks of {block_size} need {blocks} exponents, got {e.size}"
        )
    out = bfp_codec.values(m, np.repeat(e, block_size)[: m.size], mantissa_bits)
    return out.reshape(original_shape) if original_shape is not None else out


def quantize(
    data: Any, fmt: str = "bfp16", block_size: int | None = None
) -> tuple[np.ndarray, dict[str, Any]]:
    """Quantize to the packed int8 layout ``[exponents..., mantissas...]``.

    Raises:
        ValueError: unknown format (``bfp16``, ``bfp8``) or bad data.
    """
    key = fmt.strip().lower()
    if key not in _FORMATS:
        raise ValueError(f"unknown BFP format {fmt!r}: expected one of {sorted(_FORMATS)}")
    default_block, mantissa_bits = _FORMATS[key]
    mantissas, exps, meta = fp32_to_bfp(data, block_size or default_block, mantissa_bits)
    meta["name"] = key
    return bfp_codec.pack(exps, mantissas), meta


def dequantize(packed: Any, meta: dict[str, Any]) -> np.ndarray:
    """Inverse of `quantize`.

    Raises:
        ValueError: the packed array's length does not match ``meta``.
    """
    p = np.asarray(packed, dtype=np.int8).reshape(-1)
    blocks = int(meta["num_blocks"])
    count = int(np.prod(meta["shape"]))
    if p.size != blocks + count:
        raise ValueError(
            f"packed BFP has {p.size} bytes; meta says {blocks} exponents + {count} mantissas"
        )
    exps, mantissas = bfp_codec.unpack(p, blocks)
    return bfp_to_fp32(
        mantissas,
        exps,
        int(meta["block_size"]),
        int(meta["mantissa_bits"]),
        tuple(meta["shape"]),
    )
