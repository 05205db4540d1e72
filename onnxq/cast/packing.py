"""Bit packing for compress mode (docs/architecture.md, "Packing").

Codes of b bits are one little-endian bit stream: code i occupies stream bits
[i*b, (i+1)*b), least significant bit first, and stream bit k is bit (k % 8) of byte k // 8.
For b in 1, 2, 4 this is 8/b codes per byte with the first code in the low bits; for b = 8 it
is one byte per code; 3-, 5- and 6-bit codes straddle bytes, so MXFP6 costs exactly 6 bits.
"""

from __future__ import annotations

import numpy as np

__all__ = ["code_dtype", "pack_bits", "packed_nbytes", "unpack_bits"]


def code_dtype(bits: int) -> np.dtype:
    """The smallest unsigned dtype that holds a code of ``bits`` bits."""
    if not 1 <= bits <= 64:
        raise ValueError(f"code width {bits} is outside 1..64 bits")
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if bits <= np.dtype(dtype).itemsize * 8:
            return np.dtype(dtype)
    raise AssertionError(bits)


def packed_nbytes(count: int, bits: int) -> int:
    """Bytes needed for ``count`` codes of ``bits`` bits."""
    return (count * bits + 7) // 8


def pack_bits(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned codes (any shape, C order) into a uint8 stream.

    Raises:
        ValueError: a code does not fit in ``bits`` bits.
    """
    flat = np.ascontiguousarray(codes).reshape(-1)
    if flat.size and bits < 64 and int(flat.max()) >> bits:
        raise ValueError(f"code {int(flat.max())} does not fit in {bits} bits")
    if bits == 0:  # zero-width codes (a codebook with one mapping: no meta bits) take no bytes
        return np.zeros(0, dtype=np.uint8)
    if bits % 8 == 0:
        # Whole bytes: the low bits // 8 bytes of each code, little-endian (24-bit codes too,
        # which no numpy dtype holds)
        wide = flat.astype("<u8").view(np.uint8).reshape(-1, 8)
        return np.ascontiguousarray(wide[:, : bits // 8]).reshape(-1)
    if 8 % bits == 0:
        per_byte = 8 // bits
        padded = np.zeros(-(-flat.size // per_byte) * per_byte, dtype=np.uint8)
        padded[: flat.size] = flat
        lanes = padded.reshape(-1, per_byte)
        shifts = (np.arange(per_byte, dtype=np.uint8) * bits).astype(np.uint8)
        return np.bitwise_or.reduce(lanes << shifts, axis=1).astype(np.uint8)
    # General widths: expand to a bit matrix, then let packbits gather 8 bits per byte.
    shifts = np.arange(bits, dtype=np.uint64)
    bit_matrix = ((flat.astype(np.uint64)[:, None] >> shifts) & 1).astype(np.uint8)
    return np.packbits(bit_matrix.reshape(-1), bitorder="little")


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Inverse of `pack_bits`: the first ``count`` codes, in the smallest unsigned dtype.

    Raises:
        ValueError: ``packed`` is too short for ``count`` codes.
    """
    stream = np.ascontiguousarray(packed, dtype=np.uint8).reshape(-1)
    need = packed_nbytes(count, bits)
    if stream.size < need:
        raise ValueError(
            f"packed stream has {stream.size} bytes; {count} codes of {bits} bits need {need}"
        )
    if bits == 0:
        return np.zeros(count, dtype=np.uint8)
    out_dtype = code_dtype(bits)
    if bits % 8 == 0:
        wide = np.zeros((count, 8), dtype=np.uint8)
        wide[:, : bits // 8] = stream[:need].reshape(count, bits // 8)
        return wide.view("<u8").reshape(-1).astype(out_dtype)
    if 8 % bits == 0:
        per_byte = 8 // bits
        shifts = (np.arange(per_byte, dtype=np.uint8) * bits).astype(np.uint8)
        lanes = (stream[:need, None] >> shifts) & np.uint8((1 << bits) - 1)
        return lanes.reshape(-1)[:count].astype(out_dtype)
    bit_stream = np.unpackbits(stream[:need], bitorder="little")[: count * bits]
    weights = (np.uint64(1) << np.arange(bits, dtype=np.uint64)).astype(np.uint64)
    values = bit_stream.reshape(count, bits).astype(np.uint64) @ weights
    return values.astype(out_dtype)
