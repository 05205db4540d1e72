"""Row gathering on the device for the C library's CUDA GatherMX (compiled by `onnxq.cast.aot`).

GatherMX decodes only the rows of a packed table that its indices name. On the GPU the library
first copies those rows of each packed stream (codes, scale codes, shift or meta bits) into a
compact table, in index order, with ``_gather_rows_kernel``, then decodes the compact table with
the DequantizeMX / CodebookLookup kernels: it tiles exactly as those rows of the table do, so
every element gets DequantizeMX's bits. Rows are bit strings (4-bit codes of a 33-element row
are 132 bits): a row of whole bytes is copied byte by byte, else each output byte gathers its
8 bits. One image serves every stream and format.
"""

# ruff: noqa: N803

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

__all__ = ["BLOCK", "gather_rows"]

BLOCK = 1024  # output bytes per program


@triton.jit
def _gather_rows_kernel(src_ptr, dst_ptr, rows_ptr, count, row_bits, BLOCK: tl.constexpr):
    # dst row r = src row rows[r], rows of row_bits bits packed LSB first (packing.py's stream)
    # one after the other; count rows. A program writes BLOCK bytes of dst.
    b = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    nbits = count.to(tl.int64) * row_bits
    ok = b * 8 < nbits
    if row_bits % 8 == 0:  # rows of whole bytes: a byte from one byte
        row_bytes = row_bits // 8
        r = b // row_bytes
        src_row = tl.load(rows_ptr + r, mask=ok, other=0).to(tl.int64)
        v = tl.load(src_ptr + src_row * row_bytes + (b - r * row_bytes), mask=ok, other=0)
    else:  # a byte from the 8 bits it holds, each found in its row
        acc = tl.zeros([BLOCK], tl.int32)
        for k in tl.static_range(8):
            bit = b * 8 + k
            has = bit < nbits
            r = bit // row_bits
            src_row = tl.load(rows_ptr + r, mask=has, other=0).to(tl.int64)
            at = src_row * row_bits + (bit - r * row_bits)
            byte = tl.load(src_ptr + at // 8, mask=has, other=0).to(tl.int32)
            acc = acc | (((byte >> (at % 8).to(tl.int32)) & 1) << k)
        v = acc.to(tl.uint8)
    tl.store(dst_ptr + b, v, mask=ok)


def gather_rows(src: Any, rows: Any, row_bits: int) -> Any:
    """Rows ``rows`` (int32) of the bit stream ``src``, in order, packed the same way.

    ``src``: uint8, rows of ``row_bits`` bits packed LSB first, one after the other. Returns a
    torch uint8 tensor of ``ceil(len(rows) * row_bits / 8)`` bytes on ``src``'s device (CUDA,
    or the CPU under ``TRITON_INTERPRET=1``). The launch the C library makes for each packed
    stream of GatherMX's table.

    Raises:
        ValueError: a ``row_bits`` that is not positive, rows that are not int32, or an index
            past the rows ``src`` holds.
    """
    import torch

    if src.dtype != torch.uint8 or rows.dtype != torch.int32:
        raise ValueError(f"src must be uint8 and rows int32, got {src.dtype} and {rows.dtype}")
    if row_bits <= 0 or row_bits >= 2**31:
        raise ValueError(f"row_bits {row_bits} must be positive and under 2^31")
    n_src = src.numel() * 8 // row_bits
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= n_src):
        raise ValueError(f"row indices must lie in [0, {n_src - 1}]")
    nbytes = -(-rows.numel() * row_bits // 8)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=src.device)
    if nbytes:
        grid = (triton.cdiv(nbytes, BLOCK),)
        _gather_rows_kernel[grid](
            src.contiguous(), dst, rows.contiguous(), rows.numel(), row_bits, BLOCK=BLOCK
        )
    return dst
