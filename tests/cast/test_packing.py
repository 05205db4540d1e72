"""Bit packing (architecture "Packing"): round trips, hand-worked byte layouts, compress sizes.

The layout: code i occupies stream bits [i*b, (i+1)*b), least significant bit first, and
stream bit k is bit (k % 8) of byte k // 8. Every expected byte below is derived by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import onnxq
from onnxq.cast.api import QTensor, cast, upcast
from onnxq.cast.packing import code_dtype, pack_bits, packed_nbytes, unpack_bits

pytestmark = pytest.mark.filterwarnings("ignore:.*native library.*:RuntimeWarning")


@pytest.mark.parametrize("bits", [*range(1, 17), 24, 32, 40, 48, 56, 64])
@pytest.mark.parametrize("count", [1, 3, 7, 8, 13, 33, 101])
def test_pack_unpack_round_trip(bits: int, count: int) -> None:
    rng = np.random.default_rng(bits * 1000 + count)
    codes = rng.integers(0, 1 << bits, count, dtype=np.uint64, endpoint=False)
    codes[0] = (1 << bits) - 1  # the largest code: all ones
    packed = pack_bits(codes.astype(code_dtype(bits)), bits)
    assert packed.dtype == np.uint8
    assert packed.size == packed_nbytes(count, bits) == (count * bits + 7) // 8
    back = unpack_bits(packed, bits, count)
    assert back.dtype == code_dtype(bits)
    assert back.tolist() == codes.tolist()


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    bits=st.integers(1, 16),
    codes=st.lists(st.integers(0, 2**16 - 1), min_size=1, max_size=80),
)
def test_pack_unpack_round_trip_hypothesis(bits: int, codes: list[int]) -> None:
    arr = np.array([c % (1 << bits) for c in codes], dtype=np.uint64)
    packed = pack_bits(arr, bits)
    assert unpack_bits(packed, bits, arr.size).tolist() == arr.tolist()
    # The stream is exactly the codes' bits, LSB first: rebuild it with Python integers.
    stream = sum(int(c) << (i * bits) for i, c in enumerate(arr))
    assert int.from_bytes(packed.tobytes(), "little") == stream


@pytest.mark.parametrize(
    ("bits", "codes", "expected"),
    [
        # 1-bit: codes 1,0,1,1,0,0,0,0 -> byte bits b0..b7 = 1 0 1 1 0 0 0 0 = 0b00001101;
        # the ninth code (1) is bit 0 of byte 1.
        (1, [1, 0, 1, 1, 0, 0, 0, 0, 1], [0x0D, 0x01]),
        # 2-bit: 1 | 2<<2 | 3<<4 | 0<<6 = 1 + 8 + 48 = 57 = 0x39; then 3 alone.
        (2, [1, 2, 3, 0, 3], [0x39, 0x03]),
        # 3-bit: 0b101 at bits 0-2, 0b011 at 3-5, 0b110 at 6-8:
        #   byte 0 = b0..b7 = 1 0 1 | 1 1 0 | 0 1 -> 0b10011101 = 0x9D; byte 1 = b8 = 1 -> 0x01
        (3, [0b101, 0b011, 0b110], [0x9D, 0x01]),
        # 4-bit: first code in the low nibble: 0x1 | 0x2 << 4 = 0x21; 0x3 alone = 0x03.
        (4, [0x1, 0x2, 0x3], [0x21, 0x03]),
        # 5-bit: 31 | 0 << 5 | 1 << 10 = 0x41F -> bytes 0x1F, 0x04.
        (5, [31, 0, 1], [0x1F, 0x04]),
        # 6-bit: 0b000001 at bits 0-5, 0b111111 at 6-11:
        #   byte 0 = b0..b7 = 1 0 0 0 0 0 | 1 1 -> 0b11000001 = 0xC1; byte 1 = b8..b11 = 1111
        (6, [0b000001, 0b111111], [0xC1, 0x0F]),
        # 6-bit, four codes fill three bytes: 0x3F | 0 << 6 | 0x2A << 12 | 0x15 << 18
        #   = 0x3F + 0x2A000 + 0x540000 = 0x56A03F -> 0x3F, 0xA0, 0x56
        (6, [0x3F, 0x00, 0x2A, 0x15], [0x3F, 0xA0, 0x56]),
        # 8-bit: one byte each.
        (8, [0x00, 0x7F, 0x80, 0xFF], [0x00, 0x7F, 0x80, 0xFF]),
        # 12-bit: 0xABC | 0x123 << 12 = 0x123ABC -> 0xBC, 0x3A, 0x12.
        (12, [0xABC, 0x123], [0xBC, 0x3A, 0x12]),
        # 16-bit: little-endian bytes of each code.
        (16, [0x1234, 0xBEEF], [0x34, 0x12, 0xEF, 0xBE]),
        # 24-bit (int24, e8m15: no numpy dtype): the low three bytes of each, little-endian.
        (24, [0x123456, 0xABCDEF], [0x56, 0x34, 0x12, 0xEF, 0xCD, 0xAB]),
        # 40-bit: five bytes each: 0x0102030405 -> 05 04 03 02 01.
        (40, [0x0102030405], [0x05, 0x04, 0x03, 0x02, 0x01]),
    ],
)
def test_hand_worked_byte_layouts(bits: int, codes: list[int], expected: list[int]) -> None:
    arr = np.array(codes, dtype=code_dtype(bits))
    assert pack_bits(arr, bits).tolist() == expected
    assert unpack_bits(np.array(expected, np.uint8), bits, len(codes)).tolist() == codes


def test_pack_keeps_c_order_of_a_2d_array() -> None:
    codes = np.array([[0x1, 0x2], [0x3, 0x4]], dtype=np.uint8)
    assert pack_bits(codes, 4).tolist() == [0x21, 0x43]
    assert pack_bits(np.asfortranarray(codes), 4).tolist() == [0x21, 0x43]


@pytest.mark.parametrize(("bits", "code"), [(1, 2), (3, 8), (4, 16), (6, 64), (8, 256), (12, 4096)])
def test_a_code_that_does_not_fit_is_a_value_error(bits: int, code: int) -> None:
    with pytest.raises(ValueError, match=rf"code {code} does not fit in {bits} bits"):
        pack_bits(np.array([0, code], dtype=np.uint64), bits)


def test_unpacking_a_short_stream_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"packed stream has 1 bytes; 3 codes of 6 bits need 3"):
        unpack_bits(np.zeros(1, np.uint8), 6, 3)


@pytest.mark.parametrize("bits", [0, 65])
def test_code_widths_outside_1_to_64_are_value_errors(bits: int) -> None:
    with pytest.raises(ValueError, match=rf"code width {bits} is outside 1..64 bits"):
        code_dtype(bits)


# -- what compress mode stores ---------------------------------------------------------------------

X = np.random.default_rng(0).standard_normal(1024).astype(np.float32)


@pytest.mark.parametrize(
    ("name", "data", "scale", "meta", "mask"),
    [
        # 1024 x 4 bits = 512 bytes; 1024 / 32 = 32 E8M0 scales of one byte: 4.25 bits/value
        ("mxfp4", 512, 32, None, None),
        # 1024 x 6 bits = 768 bytes (a bit stream, not one code per byte): 6.25 bits/value
        ("mxfp6", 768, 32, None, None),
        ("mxfp6e3", 768, 32, None, None),
        ("mxfp8", 1024, 32, None, None),
        ("mxint8", 1024, 32, None, None),
        # MX6: int5 = 640 bytes, 64 scales per 16, one shift bit per pair: 512 bits = 64 bytes
        ("mx6", 640, 64, 64, None),
        ("mx4", 384, 64, 64, None),
        # codebook: 4-bit indices, 1 meta bit per tile of 32: 32 bits = 4 bytes
        ("cb41fi_e2m2fnuz_e8m0_t32", 512, 32, 4, None),
        # 2:4: 512 kept bytes, 64 scales per 16, 1024 mask bits = 128 bytes
        ("e4m3fn_e8m0_t16n2m4", 512, 64, None, 128),
    ],
)
def test_compress_stores_the_packed_sizes(
    name: str, data: int, scale: int, meta: int | None, mask: int | None
) -> None:
    q = cast(X, name, mode="compress")
    assert isinstance(q, QTensor)
    assert q.data.dtype == np.uint8 and q.data.size == data
    assert q.scale is not None and q.scale.nbytes == scale
    assert (None if q.meta is None else q.meta.nbytes) == meta
    assert (None if q.mask is None else q.mask.nbytes) == mask
    assert q.nbytes == data + scale + (meta or 0) + (mask or 0)
    # ... which is the data type's advertised bits per value
    assert q.nbytes * 8 / X.size == onnxq.datatype(name).bits_per_value
    assert np.array_equal(upcast(q), cast(X, name))


def test_mxfp4_costs_4_25_bits_per_value() -> None:
    q = cast(X, "mxfp4", mode="compress")
    assert isinstance(q, QTensor)
    assert (q.data.nbytes, q.scale.nbytes) == (512, 32)
    assert q.nbytes * 8 / 1024 == 4.25
    # and its bytes are the actual codes, two per byte, the first in the low nibble
    a = cast(X, "mxfp4", mode="actual")
    assert isinstance(a, QTensor)
    assert np.array_equal(q.data, (a.data[0::2] | (a.data[1::2] << 4)).astype(np.uint8))


def test_mxfp6_costs_6_25_bits_per_value() -> None:
    q = cast(X, "mxfp6", mode="compress")
    assert isinstance(q, QTensor)
    assert (q.data.nbytes, q.scale.nbytes) == (768, 32)
    assert q.nbytes * 8 / 1024 == 6.25
    # four 6-bit codes per three bytes, LSB first
    a = cast(X, "mxfp6", mode="actual")
    assert isinstance(a, QTensor)
    c = a.data[:4].astype(np.int64)
    word = int(c[0] | c[1] << 6 | c[2] << 12 | c[3] << 18)
    assert q.data[:3].tolist() == [word & 0xFF, (word >> 8) & 0xFF, word >> 16]


def test_zero_width_codes_take_no_bytes() -> None:
    # A codebook with a single mapping has 0 meta bits: its meta stream is empty.
    assert pack_bits(np.zeros(7, np.uint8), 0).size == 0
    assert unpack_bits(np.zeros(0, np.uint8), 0, 7).tolist() == [0] * 7
    with pytest.raises(ValueError, match="does not fit"):
        pack_bits(np.ones(3, np.uint8), 0)


def test_compress_of_a_codebook_without_meta_bits_round_trips() -> None:
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    q = onnxq.cast(x, "cb40f_e2m3fnuz_e8m0_t64", mode="compress")
    assert q.meta is not None and q.meta.size == 0
    assert np.array_equal(onnxq.upcast(q).view(np.uint32), onnxq.cast(x, q.dtype).view(np.uint32))


@pytest.mark.parametrize("backend", ["reference", "auto"])
@pytest.mark.parametrize("name", ["int24_e8m0_t32", "e8m15_e8m0_t32"])
def test_compress_of_24_bit_codes_round_trips(name: str, backend: str) -> None:
    # 24-bit codes are three bytes each (numpy has no 3-byte dtype to view them through)
    q = cast(X, name, mode="compress", backend=backend)
    assert isinstance(q, QTensor)
    assert q.data.size == 3 * X.size
    assert np.array_equal(upcast(q), cast(X, name, backend=backend))
