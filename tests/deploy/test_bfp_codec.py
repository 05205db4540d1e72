"""The shared BFP int8 codec (onnxq.deploy.bfp_codec) against values worked by hand.

Format rules (docs/layouts.md, "bfp-int8"): a block of m-bit mantissas shares
``shared_exp = floor(log2 max|x|) + 1``; each mantissa is ``round(x * 2^(m - 1 - shared_exp))``
(ties to even) clamped to +-(2^(m-1) - 1); value = ``mantissa * 2^(shared_exp - (m - 1))``;
an all-zero block stores -126; onnxq's E8M0 code is ``shared_exp + 126``; the packed layout
is ``[exponents..., mantissas...]`` (int8, mantissas sign-extended two's complement).
"""

from __future__ import annotations

import numpy as np
import pytest

import onnxq
from onnxq.deploy import bfp_codec, layouts


def test_shared_exponents_and_scale_codes() -> None:
    codes = np.array([127, 128, 0, 253], dtype=np.uint8)
    # E8M0 code - 126: 127 -> 1 (2^0 scale, blocks in [1, 2)), 128 -> 2, 0 -> -126 (the
    # smallest scale, an all-zero block), 253 -> 127 (the largest that fits int8).
    want = np.array([1, 2, -126, 127], dtype=np.int8)
    got = bfp_codec.shared_exponents(codes)
    assert got.dtype == np.int8 and got.tolist() == want.tolist()
    back = bfp_codec.scale_codes(want)
    assert back.dtype == np.uint8 and back.tolist() == codes.tolist()
    assert bfp_codec.MAX_SCALE_CODE == 253  # 127 + 126


def test_mantissas_sign_extend_twos_complement_codes() -> None:
    # 4-bit codes: 0b0111 = 7; 0b1001 = 9 - 16 = -7; 0b1111 = 15 - 16 = -1; 0b1000 = 8 - 16 = -8.
    four = np.array([7, 9, 15, 8, 0], dtype=np.uint8)
    assert bfp_codec.mantissas(four, 4).tolist() == [7, -7, -1, -8, 0]
    # 8-bit codes: 0x30 = 48; 0xE8 = 232 - 256 = -24; 0x80 = 128 - 256 = -128.
    eight = np.array([0x30, 0xE8, 0x80], dtype=np.uint8)
    assert bfp_codec.mantissas(eight, 8).tolist() == [48, -24, -128]
    # Back to codes: -7 & 0b1111 = 9, -1 & 0b1111 = 15; -24 & 0xFF = 232.
    assert bfp_codec.element_codes(np.array([7, -7, -1], np.int8), 4).tolist() == [7, 9, 15]
    assert bfp_codec.element_codes(np.array([48, -24], np.int8), 8).tolist() == [48, 232]


def test_values_pack_and_unpack() -> None:
    mants = np.array([48, -24, 3, 96], dtype=np.int8)
    exps = np.full(4, 2, dtype=np.int8)
    # bits 8: step 2^(2 - 7) = 1/32: 48/32 = 1.5, -24/32 = -0.75, 3/32 = 0.09375, 96/32 = 3.
    assert bfp_codec.values(mants, exps, 8).tolist() == [1.5, -0.75, 0.09375, 3.0]
    # bits 4: step 2^(2 - 3) = 1/2: 3/2 = 1.5.
    assert bfp_codec.values(np.array([3], np.int8), np.array([2], np.int8), 4).tolist() == [1.5]
    packed = bfp_codec.pack(np.array([2], np.int8), mants)
    assert packed.dtype == np.int8 and packed.tolist() == [2, 48, -24, 3, 96]
    e, m = bfp_codec.unpack(packed, 1)
    assert e.tolist() == [2] and m.tolist() == [48, -24, 3, 96]


CASES = {
    # name: (data, mantissa bits, shared exponents, mantissas, decoded values); blocks of 4
    "m8": (
        [1.0, -0.5, 0.25, 3.0],
        8,
        # max 3.0: floor(log2 3) = 1, shared_exp = 2; x * 2^(7 - 2) = x * 32.
        [2],
        [32, -16, 8, 96],
        [1.0, -0.5, 0.25, 3.0],
    ),
    "doc example": (
        [1.5, -0.75, 0.1, 3.0],
        8,
        # shared_exp 2 again; 0.1 * 32 = 3.2 (3.2000000476... from float32 0.1) rounds to 3.
        [2],
        [48, -24, 3, 96],
        [1.5, -0.75, 0.09375, 3.0],
    ),
    "m4 ties to even": (
        [1.5, 0.375, -0.125, 0.625],
        4,
        # max 1.5: floor(log2 1.5) = 0, shared_exp = 1; x * 2^(3 - 1) = x * 4 =
        # [6, 1.5, -0.5, 2.5]: ties go to the even integer: 6, 2, 0 (-0), 2.
        [1],
        [6, 2, 0, 2],
        [1.5, 0.5, 0.0, 0.5],  # mantissa * 2^(1 - 3)
    ),
    "m4 clamps": (
        [1.9375, 0.0, -1.9375, 0.5],
        4,
        # max 1.9375 (exact in float32): shared_exp 1; x * 4 = [7.75, 0, -7.75, 2] rounds to
        # [8, 0, -8, 2]; +-8 passes +-(2^3 - 1) = +-7, so it clamps to [7, 0, -7, 2].
        [1],
        [7, 0, -7, 2],
        [1.75, 0.0, -1.75, 0.5],
    ),
    "zero block": (
        [0.0, 0.0, 0.0, 0.0, 0.75, -0.375, 0.1875, 0.0],
        8,
        # block 1 all zero: -126. Block 2: max 0.75, floor(log2 0.75) = -1, shared_exp = 0;
        # x * 2^(7 - 0) = x * 128 = [96, -48, 24, 0].
        [-126, 0],
        [0, 0, 0, 0, 96, -48, 24, 0],
        [0.0, 0.0, 0.0, 0.0, 0.75, -0.375, 0.1875, 0.0],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bfp_api_writes_the_hand_worked_layout(case: str) -> None:
    data, bits, exps, mants, decoded = CASES[case]
    x = np.array(data, dtype=np.float32)
    m, e, meta = onnxq.bfp.fp32_to_bfp(x, block_size=4, mantissa_bits=bits)
    assert e.dtype == np.int8 and e.tolist() == exps
    assert m.dtype == np.int8 and m.tolist() == mants
    assert meta["num_blocks"] == len(exps)
    back = onnxq.bfp.bfp_to_fp32(m, e, block_size=4, mantissa_bits=bits)
    assert back.tolist() == decoded
    if bits == 8:  # the packed layout of onnxq.bfp.quantize: [exponents..., mantissas...]
        packed, meta = onnxq.bfp.quantize(x, "bfp16", block_size=4)
        assert packed.tolist() == exps + mants
        assert onnxq.bfp.dequantize(packed, meta).tolist() == decoded


def test_exporter_reads_the_doc_example_with_the_same_codec() -> None:
    # The bfp-int8 layout of one row of one 4-value block (docs/layouts.md's example).
    packed = np.array([2, 48, -24, 3, 96], dtype=np.int8)
    entry = {"rows": 1, "blocks_per_row": 1, "block_size": 4, "mantissa_bits": 8}
    fields = layouts._decode_bfp(entry, packed)
    assert fields["values"].tolist() == [[1.5, -0.75, 0.09375, 3.0]]
    assert fields["codes"].tolist() == [[48, 232, 3, 96]]  # -24 as an 8-bit code: 256 - 24
    assert fields["scales"].tolist() == [[128]]  # E8M0 code = shared exponent 2 + 126
