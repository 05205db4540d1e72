"""Codebook parsing, implicit patterns and generic mappings (architecture decision 10).

Every golden table below is derived by hand in the comment beside it: natural values ->
compute codes -> number-line indices (index = 2^(bits-1) + code) -> shift -> values.

Decoding rules used in the derivations (code = field << mbits | m):
  e2m2fnuz (bias 1): field 0 -> m/4;  field f >= 1 -> (4 + m) * 2^(f - 3)   [indices 16 + code]
  e2m3fnuz (bias 1): field 0 -> m/8;  field f >= 1 -> (8 + m) * 2^(f - 4)   [indices 32 + code]
  e4m3fnuz (bias 7): field f >= 1 -> (8 + m) * 2^(f - 10)                   [indices 128 + code]
  e4m3fn   (bias 7): as e4m3fnuz, but code 127 (field 15, m 7) is NaN and -0 exists.
"""

from __future__ import annotations

import math

import pytest

from onnxq.formats.codebook import Codebook
from onnxq.formats.number import InfNaN, Kind, number_spec


def mags(code: str) -> tuple[tuple[float, ...], ...]:
    return Codebook.parse(code).magnitudes()


# -- the spec's examples --------------------------------------------------------------------


def test_cb41fi_e2m2fnuz() -> None:
    # compute e2m2fnuz: 5 bits, zero index 16, maxidx 31.
    # f (4 index bits -> e2m1): 0.5 1 1.5 2 3 4 6
    #   codes: 0.5 = f0 m2 -> 2; 1 = f1 m0 -> 4; 1.5 = f1 m2 -> 6; 2 = f2 m0 -> 8;
    #          3 = f2 m2 -> 10; 4 = f3 m0 -> 12; 6 = f3 m2 -> 14
    #   indices 18 20 22 24 26 28 30; shifted to the top: 19 .. 31 (+1);
    #   default offset = 31 - 30 = 1 -> back to 18 .. 30 -> the natural values.
    # i (int4): 1 .. 7
    #   codes: 1 -> 4; 2 -> 8; 3 -> 10; 4 -> 12; 5 = f3 m1 -> 13; 6 -> 14; 7 = f3 m3 -> 15
    #   indices 20 24 26 28 29 30 31: already at the top, default offset 0 -> 1 .. 7.
    cb = Codebook.parse("cb41fi_e2m2fnuz")
    assert cb.magnitudes() == (
        (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0),
        (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0),
    )
    # The compute codes of the magnitudes, from the derivation above.
    assert cb.magnitude_codes() == (
        (0, 2, 4, 6, 8, 10, 12, 14),
        (0, 4, 8, 10, 12, 13, 14, 15),
    )


def test_cb42f1346_e2m3fnuz() -> None:
    # e2m1 in e2m3fnuz: codes 4 8 12 16 20 24 28 -> indices 36 40 .. 60 (the spec's table);
    # shifted to the top: 39 43 47 51 55 59 63; default offset would be 3.
    # offset 1: 38 42 46 50 54 58 62 -> codes 6 10 14 18 22 26 30
    #   6 -> 6/8 = 0.75; 10 = f1 m2 -> 10/8 = 1.25; 14 -> 14/8 = 1.75; 18 = f2 m2 -> 10/4 = 2.5;
    #   22 = f2 m6 -> 14/4 = 3.5; 26 = f3 m2 -> 10/2 = 5; 30 = f3 m6 -> 14/2 = 7
    # offset 3: 36 .. 60 -> natural fp4: 0.5 1 1.5 2 3 4 6 (the spec's "blue pattern")
    # offset 4: 35 39 43 47 51 55 59 -> codes 3 7 11 15 19 23 27
    #   3/8 = 0.375; 7/8 = 0.875; 11/8 = 1.375; 15/8 = 1.875; 19 = f2 m3 -> 11/4 = 2.75;
    #   23 = f2 m7 -> 15/4 = 3.75; 27 = f3 m3 -> 11/2 = 5.5
    # offset 6: 33 37 41 45 49 53 57 -> codes 1 5 9 13 17 21 25
    #   1/8 = 0.125; 5/8 = 0.625; 9/8 = 1.125; 13/8 = 1.625; 17 = f2 m1 -> 9/4 = 2.25;
    #   21 = f2 m5 -> 13/4 = 3.25; 25 = f3 m1 -> 9/2 = 4.5
    assert mags("cb42f1346_e2m3fnuz") == (
        (0.0, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0),
        (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0),
        (0.0, 0.375, 0.875, 1.375, 1.875, 2.75, 3.75, 5.5),
        (0.0, 0.125, 0.625, 1.125, 1.625, 2.25, 3.25, 4.5),
    )
    # An explicit offset 3 equals the default offset in this compute type.
    assert mags("cb40f3_e2m3fnuz") == mags("cb40f_e2m3fnuz")


def test_cb41f01_e2m2fnuz() -> None:
    # e2m1 in e2m2fnuz: indices 18 20 .. 30 (see cb41fi); top-shifted: 19 21 .. 31.
    # offset 0: codes 3 5 7 9 11 13 15 -> 3/4 = 0.75; f1 m1 -> 5/4 = 1.25; f1 m3 -> 7/4 = 1.75;
    #   f2 m1 -> 5/2 = 2.5; f2 m3 -> 7/2 = 3.5; f3 m1 -> 5; f3 m3 -> 7  ("trailing 1")
    # offset 1: 18 .. 30 -> natural fp4 0.5 .. 6                         ("trailing 0")
    cb = Codebook.parse("cb41f01_e2m2fnuz")
    assert cb.magnitudes() == (
        (0.0, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0),
        (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0),
    )
    # "All but one of the values of fp5": e2m2fnuz's positive values less 0.25.
    fp5 = [v for v in number_spec("e2m2fnuz").values() if v > 0]
    union = sorted({m for row in cb.magnitudes() for m in row if m > 0})
    assert union == [v for v in fp5 if v != 0.25]


@pytest.mark.parametrize("code", ["cb51ie_e2m3_mx6", "cb51ie01_e2m3_mx6"])
def test_mx6_codebooks(code: str) -> None:
    # e2m3 written bare is e2m3fnuz (OCP FP6). int5 = k/2, k = 1 .. 15: 0.5 1 .. 7.5.
    #   codes: 0.5 -> 4; 1 -> 8; 1.5 = f1 m4 -> 12; 2 -> 16; 2.5 -> 18; 3 -> 20; 3.5 -> 22;
    #          4 -> 24; 4.5 -> 25; 5 -> 26; 5.5 -> 27; 6 -> 28; 6.5 -> 29; 7 -> 30; 7.5 -> 31
    #   indices 36 40 44 48 50 .. 56 57 .. 63: top is 63, default offset 0 -> the int5 values.
    # e = e01: eoffset 0 is the pattern itself, eoffset 1 is its half: k/4, k = 1 .. 15
    #   (0.25 = 2/8, 0.75 = 6/8, 1.25 = 10/8, 2.25 = f2 m1, 3.75 = f2 m7 ... all exact).
    cb = Codebook.parse(code)
    assert cb.compute == number_spec("e2m3fnuz")
    assert cb.label == "mx6"
    assert cb.magnitudes() == (
        tuple(k / 2 for k in range(16)),
        tuple(k / 4 for k in range(16)),
    )
    assert cb.name == code.replace("e2m3", "e2m3fnuz")


def test_mx6_spellings_differ_only_in_name() -> None:
    a, b = Codebook.parse("cb51ie_e2m3_mx6"), Codebook.parse("cb51ie01_e2m3_mx6")
    assert a.table() == b.table()
    assert a != b  # the description is part of the identity


def test_cb41p1p2_e2m3fnuz_raises() -> None:
    # Spec snippet: index_i = maxidx - offset - incr, incr += interval * (i + 1).
    # p1, maxidx 63: incr 0 1 3 6 10 15 21 -> 63 62 60 57 53 48 42 (fine).
    # p2: incr 0 2 6 12 20 30 42 -> 63 61 57 51 43 33 21; 21 <= 32 (the zero index of e2m3fnuz)
    # so the spec's own example cannot be represented and must raise.
    with pytest.raises(ValueError, match=r"clause 'p2' offset 0 reaches index 21"):
        Codebook.parse("cb41p1p2_e2m3fnuz")
    # p1 alone is representable: codes 10 16 21 25 28 30 31
    #   10 = f1 m2 -> 10/8 = 1.25; 16 = f2 m0 -> 2; 21 = f2 m5 -> 13/4 = 3.25;
    #   25 = f3 m1 -> 9/2 = 4.5; 28 = f3 m4 -> 6; 30 -> 7; 31 -> 7.5
    assert mags("cb40p1_e2m3fnuz") == ((0.0, 1.25, 2.0, 3.25, 4.5, 6.0, 7.0, 7.5),)


def test_cb41p1p2_e4m3fnuz() -> None:
    # 8-bit compute: zero index 128, maxidx 255.
    # p1: 255 254 252 249 245 240 234 -> codes 127 126 124 121 117 112 106
    #   127 = f15 m7 -> 15*32 = 480; 126 = f15 m6 -> 14*32 = 448; 124 = f15 m4 -> 12*32 = 384;
    #   121 = f15 m1 -> 9*32 = 288; 117 = f14 m5 -> 13*16 = 208; 112 = f14 m0 -> 8*16 = 128;
    #   106 = f13 m2 -> 10*8 = 80
    # p2: 255 253 249 243 235 225 213 -> codes 127 125 121 115 107 97 85
    #   480; 125 = f15 m5 -> 13*32 = 416; 288; 115 = f14 m3 -> 11*16 = 176;
    #   107 = f13 m3 -> 11*8 = 88; 97 = f12 m1 -> 9*4 = 36; 85 = f10 m5 -> 13*1 = 13
    cb = Codebook.parse("cb41p1p2_e4m3fnuz")
    assert cb.magnitudes() == (
        (0.0, 80.0, 128.0, 208.0, 288.0, 384.0, 448.0, 480.0),
        (0.0, 13.0, 36.0, 88.0, 176.0, 288.0, 416.0, 480.0),
    )
    assert cb.magnitude_codes() == (
        (0, 106, 112, 117, 121, 124, 126, 127),
        (0, 85, 97, 107, 115, 121, 125, 127),
    )
    # Bare p is p10: same as p1.
    assert mags("cb40p_e4m3fnuz") == (cb.magnitudes()[0],)


def test_static_patterns() -> None:
    # s (= s10): 63 62 .. 57 -> codes 25 .. 31 -> 4.5 5 5.5 6 6.5 7 7.5
    # s2: 63 61 59 57 55 53 51 -> codes 31 29 27 25 23 21 19
    #   -> 7.5 6.5 5.5 4.5; 23 = f2 m7 -> 3.75; 21 -> 3.25; 19 = f2 m3 -> 2.75
    # s335 (interval 3, offsets 3 and 5):
    #   offset 3: 60 57 54 51 48 45 42 -> codes 28 25 22 19 16 13 10
    #     -> 6 4.5 3.5 2.75 2; 13 = f1 m5 -> 13/8 = 1.625; 10 -> 1.25
    #   offset 5: 58 55 52 49 46 43 40 -> codes 26 23 20 17 14 11 8
    #     -> 5 3.75 3; 17 = f2 m1 -> 2.25; 14 -> 1.75; 11 -> 1.375; 8 -> 1
    assert mags("cb42ss2s335_e2m3fnuz") == (
        (0.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0, 7.5),
        (0.0, 2.75, 3.25, 3.75, 4.5, 5.5, 6.5, 7.5),
        (0.0, 1.25, 1.625, 2.0, 2.75, 3.5, 4.5, 6.0),
        (0.0, 1.0, 1.375, 1.75, 2.25, 3.0, 3.75, 5.0),
    )


# -- base patterns and other f/i details ----------------------------------------------------

# The spec's tables "scaled to (-2, 2)", as printed; our base patterns are these values times 4.
# fmt: off
SPEC_E2M1 = (0.125, 0.25, 0.375, 0.5, 0.75, 1.0, 1.5)
SPEC_E2M2 = (0.0625, 0.125, 0.1875, 0.25, 0.3125, 0.375, 0.4375, 0.5, 0.625, 0.75, 0.875, 1.0,
             1.25, 1.5, 1.75)
SPEC_INT4 = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75)
SPEC_INT5 = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0, 1.125, 1.25, 1.375, 1.5, 1.625,
             1.75, 1.875)
# fmt: on


@pytest.mark.parametrize(
    ("code", "spec_row"),
    [
        ("cb40f_e2m3fnuz", SPEC_E2M1),
        ("cb50f_e2m3fnuz", SPEC_E2M2),
        ("cb40i_e2m3fnuz", SPEC_INT4),
        ("cb50i_e2m3fnuz", SPEC_INT5),
    ],
)
def test_default_offset_gives_the_natural_values(code: str, spec_row: tuple[float, ...]) -> None:
    assert mags(code) == ((0.0, *(4 * v for v in spec_row)),)


def test_int3_follows_the_int4_int5_rule() -> None:
    # Decision: the spec lists int3 as 0.25 0.5 1.0 (that is e2m0), which breaks the k/2^(N-2)
    # rule of its int4/int5 rows; we use the rule: int3 = k/2 scaled by 4 = 2 4 6.
    # 2 -> code 16, 4 -> 24, 6 = f3 m4 -> 28: indices 48 56 60, default offset 63 - 60 = 3.
    assert mags("cb30i_e2m3fnuz") == ((0.0, 2.0, 4.0, 6.0),)
    # f with 3 bits is e2m0 (bias 1): 1 2 4 -> codes 8 16 24 -> indices 40 48 56.
    assert mags("cb30f_e2m3fnuz") == ((0.0, 1.0, 2.0, 4.0),)
    # f0: top-shifted by 7: 47 55 63 -> codes 15 23 31 -> 15/8 = 1.875, 15/4 = 3.75, 7.5
    assert mags("cb30f0_e2m3fnuz") == ((0.0, 1.875, 3.75, 7.5),)


def test_e_modifier_order_offsets_outer() -> None:
    # e2m1 in e4m3fnuz: 0.5 -> f6 m0 = 48, 1 -> 56, 1.5 -> 60, 2 -> 64, 3 -> 68, 4 -> 72,
    # 6 -> 76; indices 176 184 188 192 196 200 204; top-shifted (+51): 227 235 .. 255.
    # offset 0: codes 99 107 111 115 119 123 127
    #   99 = f12 m3 -> 11*4 = 44; 107 = f13 m3 -> 88; 111 = f13 m7 -> 15*8 = 120;
    #   115 = f14 m3 -> 176; 119 = f14 m7 -> 240; 123 = f15 m3 -> 352; 127 -> 480
    # offset 1: codes 98 106 110 114 118 122 126
    #   98 = f12 m2 -> 40; 106 -> 80; 110 = f13 m6 -> 112; 114 -> 160; 118 -> 224;
    #   122 -> 320; 126 -> 448
    # e01 halves each; mappings come (o0,e0) (o0,e1) (o1,e0) (o1,e1).
    assert mags("cb42f01e01_e4m3fnuz") == (
        (0.0, 44.0, 88.0, 120.0, 176.0, 240.0, 352.0, 480.0),
        (0.0, 22.0, 44.0, 60.0, 88.0, 120.0, 176.0, 240.0),
        (0.0, 40.0, 80.0, 112.0, 160.0, 224.0, 320.0, 448.0),
        (0.0, 20.0, 40.0, 56.0, 80.0, 112.0, 160.0, 224.0),
    )
    # f3e2: natural e2m1 / 4 = 0.125 .. 1.5, all on the e2m3fnuz grid (step 1/8).
    assert mags("cb40f3e2_e2m3fnuz") == ((0.0, 0.125, 0.25, 0.375, 0.5, 0.75, 1.0, 1.5),)


def test_e_modifier_unrepresentable_raises() -> None:
    # Natural e2m1 / 8 starts at 0.0625, below e2m3fnuz's smallest subnormal 0.125.
    with pytest.raises(ValueError, match=r"clause 'fe0123' offset 3 eoffset 3: 0.0625"):
        Codebook.parse("cb42fe0123_e2m3fnuz")


def test_pattern_outside_the_number_line_raises() -> None:
    # f9 in e2m2fnuz: 19 21 .. 31 minus 9 = 10 12 .. 22; 10 <= the zero index 16.
    with pytest.raises(ValueError, match=r"clause 'f9' offset 9 reaches index 10"):
        Codebook.parse("cb40f9_e2m2fnuz")
    # e4m3fn: the top index 255 is code 127, NaN.
    with pytest.raises(ValueError, match=r"clause 'f0' offset 0 lands on index 255, which is nan"):
        Codebook.parse("cb40f0_e4m3fn")
    # Its default offset still gives the natural values (6.0 = f9 m4 -> code 76 < 127).
    assert mags("cb40f_e4m3fn") == ((0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0),)
    # e3m0fnuz (bias 3) holds only powers of two: fp4's 1.5 is not on its number line.
    with pytest.raises(ValueError, match=r"pattern value 1.5 is not representable in e3m0"):
        Codebook.parse("cb40f_e3m0fnuz")


# -- identity, NumberSpec view, table ---------------------------------------------------------

ROUND_TRIP = [
    "cb41fi_e2m2fnuz",
    "cb42f1346_e2m3fnuz",
    "cb41f01_e2m2fnuz",
    "cb51ie_e2m3fnuz_mx6",
    "cb41p1p2_e4m3fnuz",
    "cb42ss2s335_e2m3fnuz",
    "cb42_e4m3fn_mine",
    "cb44_e4m3fn",
    "cb80_e4m3fn",
    "cb20_e2m1fnuz_tiny",
]


@pytest.mark.parametrize("code", ROUND_TRIP)
def test_round_trip(code: str) -> None:
    cb = Codebook.parse(code)
    assert cb.name == code == str(cb)
    again = Codebook.parse(cb.name)
    assert again == cb and hash(again) == hash(cb)


def test_case_insensitive_and_fields() -> None:
    cb = Codebook.parse(" CB51IE_E2M3_MX6 ")
    assert cb == Codebook.parse("cb51ie_e2m3fnuz_mx6")
    assert (cb.index_bits, cb.meta_bits, cb.desc, cb.label) == (5, 1, "ie", "mx6")
    assert cb.kind is Kind.CODEBOOK and cb.is_codebook and cb.is_implicit
    e2m3 = number_spec("e2m3fnuz")
    assert (cb.ebits, cb.mbits, cb.bias, cb.infnan) == (2, 3, 1, InfNaN.FNUZ)
    assert cb.bits == 5
    # The tile scale uses the compute type's range: e2m3fnuz max 7.5, emax 2.
    assert (cb.maxfloat, cb.emax) == (7.5, 2) == (e2m3.maxfloat, e2m3.emax)
    assert not number_spec("e4m3fn").is_codebook


def test_table_layout_without_negative_zero() -> None:
    # index = sign << 3 | magnitude index; e2m2fnuz has no -0, so entry 8 is +0.0.
    cb = Codebook.parse("cb41fi_e2m2fnuz")
    f_row, i_row = cb.table()
    assert f_row == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1, -1.5, -2, -3, -4, -6)
    assert i_row == (0, 1, 2, 3, 4, 5, 6, 7, 0, -1, -2, -3, -4, -5, -6, -7)
    assert math.copysign(1.0, f_row[8]) == 1.0
    assert cb.decode(0b1011, meta=1) == -3.0 and cb.decode(0b0111) == 6.0
    # values(): distinct values of both mappings, 0 once.
    positive = [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert cb.values() == [-v for v in reversed(positive)] + [0.0, *positive]


# -- generic codebooks ------------------------------------------------------------------------

# e4m3fn (bias 7) codes: 1 = f7 m0 -> 56; 2 -> 64; 3 = f8 m4 -> 68; 4 -> 72; 6 -> 76; 8 -> 80;
# 448 = f15 m6 -> 126 (the largest finite, 127 is NaN); 0.5 -> 48; 1.5 -> 60; 0.25 -> 40;
# 0.75 = f6 m4 -> 52; 12 = f10 m4 -> 84; 16 -> 88; 0.125 -> 32.
# fmt: off
M0 = (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 448.0)
M1_FULL = (0.5, -0.5, 0.0, -0.0, 0.25, 1.5, -1.5, -0.25, 3.0, -3.0, 12.0, -12.0, 16.0, -16.0, 0.125,
           -0.125)
M1 = (0.0, 0.125, 0.25, 0.5, 1.5, 3.0, 12.0, 16.0)
# fmt: on


def test_generic_codebook_populated_in_two_calls() -> None:
    cb = Codebook.parse("cb42_e4m3fn_mine")
    assert not cb.is_implicit and not cb.is_populated
    with pytest.raises(ValueError, match=r"has 0 of 4 mappings"):
        cb.magnitudes()
    empty = cb
    cb = cb.add_mappings([M0, M1_FULL])
    assert not empty.is_populated and empty.mappings == ()  # codebooks are values
    with pytest.raises(ValueError, match=r"has 2 of 4 mappings"):
        cb.table()
    cb = cb.add_mappings([list(M0), [0, 1, 2, 3, 4, 6, 8, 16]])  # ints are fine
    assert cb.is_populated
    assert cb.magnitudes() == (M0, M1, M0, (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0))
    assert cb.magnitude_codes()[:2] == (
        (0, 56, 64, 68, 72, 76, 80, 126),
        (0, 32, 40, 48, 60, 68, 84, 88),
    )
    # e4m3fn has -0: entry 8 (sign 1, magnitude 0) is -0.0.
    row = cb.table()[0]
    assert row[:8] == M0 and row[9:] == tuple(-m for m in M0[1:])
    assert row[8] == 0.0 and math.copysign(1.0, row[8]) == -1.0
    # Mappings are part of identity: a filled codebook is not the empty one.
    assert cb != Codebook.parse("cb42_e4m3fn_mine")
    assert cb == Codebook.parse("cb42_e4m3fn_mine").add_mappings(cb.mappings)
    with pytest.raises(ValueError, match=r"'cb42_e4m3fn_mine' mapping 4: one too many"):
        cb.add_mappings([M0])


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        # 1.0625 = 1 + 1/16 needs 4 mantissa bits.
        ((0, 1, 1.0625, 2, 3, 4, 6, 8), r"mapping 0: 1.0625 is not a finite value of e4m3fn"),
        # 480 would be code 127, the NaN code of e4m3fn.
        ((0, 1, 2, 3, 4, 6, 8, 480), r"mapping 0: 480.0 is not a finite value"),
        ((0, 1, 2, 3, 4, 6, 8, math.inf), r"mapping 0: inf is not a finite value"),
        ((1, 2, 3, 4, 6, 8, 12, 16), r"mapping 0: magnitudes must start with 0.0, got 1.0"),
        ((0, 1, 2, 3, 6, 4, 8, 16), r"mapping 0: magnitudes must be strictly ascending, got 4.0"),
        ((0, 1, 1, 3, 4, 6, 8, 16), r"strictly ascending, got 1.0 after 1.0"),
        ((0, 1, -2, 3, 4, 6, 8, 16), r"magnitudes must be non-negative, got -2.0"),
        ((0, 1, 2), r"mapping 0: expected 8 magnitudes or 16 values, got 3"),
        # -0.125 replaced: 0.125 loses its partner, -0.25 appears twice.
        ((*M1_FULL[:-1], -0.25), r"mapping 0: not symmetric: 0.125 has no -0.125"),
        ((*M1_FULL[:-1], -0.0625), r"mapping 0: not symmetric: -0.0625 has no 0.0625"),
        ((*M1_FULL[:-2], 0.25, -0.25), r"mapping 0: value 0.25 appears more than once"),
        ((*M1_FULL[:2], 1.0, -1.0, *M1_FULL[4:]), r"holds 0 twice \(\+0 and -0\), got 0"),
    ],
)
def test_add_mappings_validation(mapping: tuple[float, ...], message: str) -> None:
    cb = Codebook.parse("cb42_e4m3fn_mine")
    with pytest.raises(ValueError, match=message):
        cb.add_mappings([mapping])
    assert not cb.is_populated


def test_add_mappings_names_the_mapping_and_is_atomic() -> None:
    cb = Codebook.parse("cb42_e4m3fn_mine")
    cb = cb.add_mappings([M0])
    with pytest.raises(ValueError, match=r"'cb42_e4m3fn_mine' mapping 2: 1.0625 is not"):
        cb.add_mappings([M0, (0, 1, 1.0625, 2, 3, 4, 6, 8)])
    # Nothing of the failed call was kept.
    cb = cb.add_mappings([M1, M0, M1])
    assert cb.magnitudes() == (M0, M1, M0, M1)


def test_add_mappings_on_implicit_codebook_raises() -> None:
    with pytest.raises(ValueError, match=r"an implicit codebook takes no added mappings"):
        Codebook.parse("cb41fi_e2m2fnuz").add_mappings([(0, 1, 2, 3, 4, 5, 6, 7)])


# -- malformed codes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("cb4", r"expected 2 or 3 parts separated by '_'"),
        ("cb4_e2m3", r"'cb4' must be cb, then single digits index_bits and meta_bits"),
        ("cbx1_e2m3", r"'cbx1' must be cb, then single digits"),
        ("xb41_e2m3", r"starts with 'cb'"),
        ("cb41q_e2m3fnuz", r"unexpected 'q' in description 'q'.*expected cb<index_bits>"),
        ("cb41fq_e2m3fnuz", r"unexpected 'q' in description 'fq'"),
        ("cb41f_int8", r"compute type must be a float format .* got int8"),
        ("cb41f_e8m0", r"compute type must be a float format"),
        ("cb41f_e2m3zz", r"bad compute type 'e2m3zz'"),
        ("cb41fe5_e2m3fnuz", r"eoffset 5 in clause 'fe5' is outside 0..3"),
        ("cb42fi_e2m3fnuz", r"'fi' gives 2 mapping\(s\), meta_bits 2 asks for 4"),
        ("cb41pe_e2m3fnuz", r"'e' modifier must follow an f or i clause \(it follows 'p'\)"),
        ("cb41e_e2m3fnuz", r"'e' modifier must follow an f or i clause;"),
        ("cb91f_e2m3fnuz", r"index_bits 9 is outside 2..8"),
        ("cb11_e2m3fnuz", r"index_bits 1 is outside 2..8"),
        ("cb45_e2m3fnuz", r"meta_bits 5 is outside 0..4"),
        ("cb41f_e2m3fnuz_bad-label", r"label 'bad-label' must be \[a-z0-9\]\+"),
        ("cb41f_e2m3fnuz_a_b", r"expected 2 or 3 parts.*got 4"),
        ("cb41f_e2m3fnuz_", r"label '' must be"),
        ("cb61f_e2m3fnuz", r"clause 'f' needs 3..5 index bits"),
        ("cb20i_e2m3fnuz", r"clause 'i' needs 3..5 index bits"),
        ("cb41p0_e2m3fnuz", r"interval 0 in clause 'p0' must be 1..9"),
        ("cb70_e2m3fnuz", r"index_bits 7 exceeds the 6 bits of the compute type e2m3fnuz"),
        ("cb4a_e2m3fnuz", r"'cb4a' must be cb, then single digits"),
    ],
)
def test_malformed_codes(code: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Codebook.parse(code)


def test_generic_is_fine_and_type_checked() -> None:
    cb = Codebook.parse("cb41_e2m3")
    assert cb.name == "cb41_e2m3fnuz" and cb.desc == "" and cb.label is None
    with pytest.raises(TypeError, match="must be a str"):
        Codebook.parse(41)  # type: ignore[arg-type]
