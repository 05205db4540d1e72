"""The BFP int8 codec: the BFP document's int8 layout, shared by `onnxq.bfp` and the exporter.

A block of ``m``-bit mantissas shares one exponent: value = ``mantissa * 2^(shared_exp -
(m - 1))``. onnxq holds the same numbers as an int``m`` element with one integer bit and an
E8M0 scale code ``c``, so ``shared_exp = c - 126`` (E8M0's bias 127, less the integer bit).
Each mantissa is the element's ``m``-bit two's complement code, sign-extended to one int8;
the packed layout is one int8 array ``[exponents..., mantissas...]``.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "EXPONENT_OFFSET",
    "MAX_SCALE_CODE",
    "element_codes",
    "mantissas",
    "pack",
    "scale_codes",
    "shared_exponents",
    "unpack",
    "values",
]

EXPONENT_OFFSET = 126  # shared_exp = E8M0 code - 126
MAX_SCALE_CODE = 127 + EXPONENT_OFFSET  # the largest code whose shared exponent fits int8


def shared_exponents(scales: np.ndarray) -> np.ndarray:
    """int8 shared exponents of E8M0 scale codes (the caller refuses codes above 253)."""
    return (np.asarray(scales).astype(np.int16) - EXPONENT_OFFSET).astype(np.int8)


def scale_codes(exponents: np.ndarray) -> np.ndarray:
    """E8M0 scale codes (uint8) of int8 shared exponents."""
    return (np.asarray(exponents).astype(np.int16) + EXPONENT_OFFSET).astype(np.uint8)


def mantissas(codes: np.ndarray, bits: int) -> np.ndarray:
    """int8 mantissas of ``bits``-bit two's complement element codes (sign-extended)."""
    if bits == 8:
        return np.asarray(codes).astype(np.uint8).view(np.int8)
    shift = 16 - bits
    return ((np.asarray(codes).astype(np.int16) << shift).astype(np.int16) >> shift).astype(np.int8)


def element_codes(mants: np.ndarray, bits: int) -> np.ndarray:
    """``bits``-bit two's complement element codes (uint8) of int8 mantissas."""
    return (np.asarray(mants).astype(np.int16) & ((1 << bits) - 1)).astype(np.uint8)


def values(mants: np.ndarray, exponents: np.ndarray, bits: int) -> np.ndarray:
    """float32 ``mantissa * 2^(exponent - (bits - 1))``; ``exponents`` one per mantissa.

    Exact: an int8 times a power of two at or above 2^-135 is a float64 without rounding, and
    the one rounding is to float32.
    """
    step = np.asarray(exponents).astype(np.int64) - (bits - 1)
    return np.ldexp(np.asarray(mants).astype(np.float64), step).astype(np.float32)


def pack(exponents: np.ndarray, mants: np.ndarray) -> np.ndarray:
    """The packed int8 layout ``[exponents..., mantissas...]`` (each flattened in C order)."""
    return np.concatenate([np.asarray(exponents).reshape(-1), np.asarray(mants).reshape(-1)])


def unpack(packed: np.ndarray, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """(exponents, mantissas) of a packed int8 array with ``blocks`` exponents."""
    return packed[:blocks], packed[blocks:]
