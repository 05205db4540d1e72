"""GatherMX's row copy (onnxq.cast.triton_gather), the kernel the C library launches per packed
stream: rows of any bit length, out of order and repeated, against numpy's own bit unpacking
(an independent oracle: `np.unpackbits` / `np.packbits`, LSB first as packing.py writes).
Interpreter on the CPU, the GPU where there is one."""

from __future__ import annotations

import numpy as np
import pytest

from tests.cast.triton.support import DEV, torch

# isort: split
from onnxq.cast.triton_gather import gather_rows  # after support: the interpreter set first


def _want(src: np.ndarray, rows: list[int], row_bits: int) -> np.ndarray:
    bits = np.unpackbits(src, bitorder="little")
    picked = [bits[r * row_bits : (r + 1) * row_bits] for r in rows]
    return np.packbits(np.concatenate(picked), bitorder="little")


# whole bytes (8, 24: a byte from one byte) and not (1, 3, 12: rows sharing bytes; 13, 100,
# 2051: rows that start anywhere in a byte and span a program's block)
@pytest.mark.parametrize("row_bits", [1, 3, 8, 12, 13, 24, 100, 2051, 8200])
def test_rows_are_copied_bit_for_bit(row_bits: int) -> None:
    rng = np.random.default_rng(row_bits)
    n_rows = 7
    src = rng.integers(0, 256, size=-(-n_rows * row_bits // 8), dtype=np.uint8)
    rows = [3, 0, 6, 6, 1, 5]
    got = gather_rows(
        torch.from_numpy(src).to(DEV), torch.tensor(rows, dtype=torch.int32, device=DEV), row_bits
    )
    # the last byte's bits past the rows are zero, as packbits pads them
    np.testing.assert_array_equal(got.cpu().numpy(), _want(src, rows, row_bits))


def test_no_rows_give_no_bytes() -> None:
    src = torch.zeros(8, dtype=torch.uint8, device=DEV)
    assert gather_rows(src, torch.zeros(0, dtype=torch.int32, device=DEV), 12).numel() == 0


@pytest.mark.parametrize(
    ("src_dtype", "rows", "row_bits", "error"),
    [
        (torch.int8, [0], 8, "src must be uint8"),
        (torch.uint8, [4], 16, r"row indices must lie in \[0, 3\]"),  # 8 bytes: 4 rows of 16
        (torch.uint8, [-1], 16, "row indices must lie"),
        (torch.uint8, [0], 0, "row_bits 0 must be positive"),
    ],
)
def test_bad_arguments_are_refused(
    src_dtype: torch.dtype, rows: list[int], row_bits: int, error: str
) -> None:
    src = torch.zeros(8, dtype=src_dtype, device=DEV)
    with pytest.raises(ValueError, match=error):
        gather_rows(src, torch.tensor(rows, dtype=torch.int32, device=DEV), row_bits)
