"""Bit packing on the device for the C library's CUDA path (compiled by `onnxq.cast.aot`).

``_pack_kernel`` writes `onnxq.cast.packing`'s stream - ``BITS``-bit codes (one byte each in)
packed LSB first - one output byte per lane, gathering the at most ``ceil(8 / BITS) + 1`` codes
that overlap it; ``_unpack_kernel`` is its inverse, one code per lane from the two bytes that
hold it. The onnxruntime CUDA ops use them for ``Q`` and ``Meta`` of formats under 8 bits.
"""

# ruff: noqa: N803

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["BLOCK"]

BLOCK = 1024  # bytes (pack) or codes (unpack) per program


@triton.jit
def _pack_kernel(src_ptr, dst_ptr, count, nbytes, BITS: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = b < nbytes
    first = (b * 8) // BITS
    acc = tl.zeros([BLOCK], tl.int32)
    for i in tl.static_range((8 + BITS - 1) // BITS + 1):
        k = first + i
        sh = (k * BITS - b * 8).to(tl.int32)  # where code k starts, from the byte's bit 0
        c = tl.load(src_ptr + k, mask=ok & (k < count), other=0).to(tl.int32) & ((1 << BITS) - 1)
        part = tl.where(sh >= 0, c << tl.maximum(sh, 0), c >> tl.maximum(-sh, 0))
        acc = acc | tl.where(sh < 8, part, 0)
    tl.store(dst_ptr + b, (acc & 0xFF).to(tl.uint8), mask=ok)


@triton.jit
def _unpack_kernel(src_ptr, dst_ptr, count, nbytes, BITS: tl.constexpr, BLOCK: tl.constexpr):
    k = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = k < count
    bit = k * BITS
    byte = bit // 8
    lo = tl.load(src_ptr + byte, mask=ok, other=0).to(tl.int32)
    hi = tl.load(src_ptr + byte + 1, mask=ok & (byte + 1 < nbytes), other=0).to(tl.int32)
    word = lo | (hi << 8)
    code = (word >> (bit - byte * 8).to(tl.int32)) & ((1 << BITS) - 1)
    tl.store(dst_ptr + k, code.to(tl.uint8), mask=ok)
