"""NumberSpec: every code form, its fields and range, and its values against ml_dtypes and gfloat.

Golden values are worked by hand from the field layout (the derivation is written beside each
value) or taken at test time from independent libraries (ml_dtypes, gfloat). Nothing here is
copied from onnxq's own output.
"""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import sys

import gfloat
import ml_dtypes
import numpy as np
import pytest
from gfloat import formats as gf

from onnxq.formats import InfNaN, Kind, NumberSpec, number, number_spec


@dataclasses.dataclass(frozen=True)
class Case:
    """A number code and its properties, each worked by hand."""

    code: str
    name: str  # canonical code
    kind: Kind
    bits: int
    ebits: int
    mbits: int
    bias: int
    emax: int
    emin: int
    maxfloat: float
    midmax: float | None  # None: not defined for the kind (exponent scale types)
    smallest_normal: float
    smallest_subnormal: float
    eps: float
    infnan: InfNaN | None = None


CASES = (
    # OCP E4M3 written bare is e4m3fn (no Inf; NaN = S.1111.111).
    # bias 2^(4-1)-1 = 7; field 15, mantissa 110 -> 2^(15-7) * 1.75 = 448 (111 is NaN)
    # emin 1-7 = -6; subnormal 2^(-6-3) = 2^-9; eps 2^-3; midmax 448 + 2^(8-3-1) = 464
    Case(
        "e4m3",
        "e4m3fn",
        Kind.FLOAT,
        8,
        4,
        3,
        7,
        8,
        -6,
        448.0,
        464.0,
        2**-6,
        2**-9,
        2**-3,
        InfNaN.FN,
    ),
    Case(
        "e4m3fn",
        "e4m3fn",
        Kind.FLOAT,
        8,
        4,
        3,
        7,
        8,
        -6,
        448.0,
        464.0,
        2**-6,
        2**-9,
        2**-3,
        InfNaN.FN,
    ),
    # Architecture decision 9: bare e4m3fnuz has the default bias 7. Every code but 0x80 is finite:
    # field 15, mantissa 111 -> 2^(15-7) * 1.875 = 480; midmax 480 + 2^(8-3-1) = 496
    Case(
        "e4m3fnuz",
        "e4m3fnuz",
        Kind.FLOAT,
        8,
        4,
        3,
        7,
        8,
        -6,
        480.0,
        496.0,
        2**-6,
        2**-9,
        2**-3,
        InfNaN.FNUZ,
    ),
    # torch's float8_e4m3fnuz has bias 8: field 15, mantissa 111 -> 2^(15-8) * 1.875 = 240
    # emin 1-8 = -7; subnormal 2^(-7-3) = 2^-10; midmax 240 + 2^(7-3-1) = 248
    Case(
        "float8_e4m3fnuz",
        "e4m3b8fnuz",
        Kind.FLOAT,
        8,
        4,
        3,
        8,
        7,
        -7,
        240.0,
        248.0,
        2**-7,
        2**-10,
        2**-3,
        InfNaN.FNUZ,
    ),
    # torch's float8_e5m2fnuz has bias 16: field 31, mantissa 11 -> 2^(31-16) * 1.75 = 57344
    # emin 1-16 = -15; subnormal 2^(-15-2) = 2^-17; midmax 57344 + 2^(15-2-1) = 61440
    Case(
        "float8_e5m2fnuz",
        "e5m2b16fnuz",
        Kind.FLOAT,
        8,
        5,
        2,
        16,
        15,
        -15,
        57344.0,
        61440.0,
        2**-15,
        2**-17,
        2**-2,
        InfNaN.FNUZ,
    ),
    # OCP E5M2 is IEEE-like (field 31 = Inf/NaN): field 30, mantissa 11 -> 2^(30-15)*1.75 = 57344
    # emin 1-15 = -14; subnormal 2^(-14-2) = 2^-16; midmax 57344 + 2^(15-2-1) = 61440
    Case(
        "e5m2",
        "e5m2",
        Kind.FLOAT,
        8,
        5,
        2,
        15,
        15,
        -14,
        57344.0,
        61440.0,
        2**-14,
        2**-16,
        2**-2,
        InfNaN.IEEE,
    ),
    # OCP FP4 E2M1 (no NaN/Inf; the value set of e2m1fnuz): bias 1; field 3, mantissa 1 ->
    # 2^(3-1) * 1.5 = 6; emin 0; subnormal 2^(0-1) = 0.5; midmax 6 + 2^(2-1-1) = 7
    Case("e2m1", "e2m1fnuz", Kind.FLOAT, 4, 2, 1, 1, 2, 0, 6.0, 7.0, 1.0, 0.5, 0.5, InfNaN.FNUZ),
    # OCP FP6 E2M3: bias 1; field 3, mantissa 111 -> 2^2 * 1.875 = 7.5; subnormal 2^-3;
    # midmax 7.5 + 2^(2-3-1) = 7.75
    Case(
        "e2m3", "e2m3fnuz", Kind.FLOAT, 6, 2, 3, 1, 2, 0, 7.5, 7.75, 1.0, 2**-3, 2**-3, InfNaN.FNUZ
    ),
    # OCP FP6 E3M2: bias 3; field 7, mantissa 11 -> 2^(7-3) * 1.75 = 28; emin -2;
    # subnormal 2^(-2-2) = 2^-4; midmax 28 + 2^(4-2-1) = 30
    Case(
        "e3m2",
        "e3m2fnuz",
        Kind.FLOAT,
        6,
        3,
        2,
        3,
        4,
        -2,
        28.0,
        30.0,
        2**-2,
        2**-4,
        2**-2,
        InfNaN.FNUZ,
    ),
    # OCP E8M0: value 2^(code - 127), 255 = NaN. Largest: code 254 -> 2^127; smallest:
    # code 0 -> 2^-127 (no subnormals); the value after 1 is 2, so eps = 1
    Case(
        "e8m0",
        "e8m0",
        Kind.EXPONENT,
        8,
        8,
        0,
        127,
        127,
        -127,
        2.0**127,
        None,
        2.0**-127,
        2.0**-127,
        1.0,
    ),
    # int8 is symmetric (architecture decision 6): +-127; emax floor(log2 127) = 6 = N - 2;
    # the step is always 1 (emin 0, smallest 1, eps 1); midmax 127 + 1/2
    Case("int8", "int8", Kind.INT, 8, 0, 7, 0, 6, 0, 127.0, 127.5, 1.0, 1.0, 1.0),
    # uint4: 0..15; emax floor(log2 15) = 3; midmax 15 + 1/2
    Case("uint4", "uint4", Kind.UINT, 4, 0, 4, 0, 3, 0, 15.0, 15.5, 1.0, 1.0, 1.0),
    # IEEE binary16: field 30, mantissa all ones -> 2^15 * (2 - 2^-10) = 65504; emin -14;
    # subnormal 2^(-14-10) = 2^-24; midmax 65504 + 2^(15-10-1) = 65520
    Case(
        "float16",
        "float16",
        Kind.FLOAT,
        16,
        5,
        10,
        15,
        15,
        -14,
        65504.0,
        65520.0,
        2**-14,
        2**-24,
        2**-10,
        InfNaN.IEEE,
    ),
    # bfloat16: 2^127 * (2 - 2^-7); emin -126; subnormal 2^(-126-7) = 2^-133;
    # midmax = max + 2^(127-7-1) = 2^128 - 2^120 + 2^119 = 2^128 - 2^119
    Case(
        "bfloat16",
        "bfloat16",
        Kind.FLOAT,
        16,
        8,
        7,
        127,
        127,
        -126,
        2.0**127 * (2 - 2**-7),
        2.0**128 - 2.0**119,
        2.0**-126,
        2.0**-133,
        2**-7,
        InfNaN.IEEE,
    ),
    # IEEE binary32: 2^127 * (2 - 2^-23); subnormal 2^(-126-23) = 2^-149;
    # midmax = 2^128 - 2^104 + 2^103 = 2^128 - 2^103
    Case(
        "float32",
        "float32",
        Kind.FLOAT,
        32,
        8,
        23,
        127,
        127,
        -126,
        2.0**127 * (2 - 2**-23),
        2.0**128 - 2.0**103,
        2.0**-126,
        2.0**-149,
        2**-23,
        InfNaN.IEEE,
    ),
    # IEEE binary64: 2^1023 * (2 - 2^-52); subnormal 2^(-1022-52) = 2^-1074;
    # midmax = 2^1024 - 2^971 + 2^970 = 2^1024 - 2^970 overflows a float, so it is not checked
    Case(
        "float64",
        "float64",
        Kind.FLOAT,
        64,
        11,
        52,
        1023,
        1023,
        -1022,
        2.0**1023 * (2 - 2**-52),
        None,
        2.0**-1022,
        2.0**-1074,
        2**-52,
        InfNaN.IEEE,
    ),
    # P3109 binary8p3: e(8-3)m(3-1) = e5m2, bias 2^(7-3) = 16, +-Inf at 0x7f/0xff, NaN at 0x80.
    # Largest finite 0x7e: field 31, mantissa 10 -> 2^(31-16) * 1.5 = 49152; emin -15;
    # subnormal 2^(-15-2) = 2^-17; midmax 49152 + 2^(15-2-1) = 53248
    Case(
        "binary8p3",
        "e5m2b16inuz",
        Kind.FLOAT,
        8,
        5,
        2,
        16,
        15,
        -15,
        49152.0,
        53248.0,
        2**-15,
        2**-17,
        2**-2,
        InfNaN.INUZ,
    ),
    # binary8p4: e4m3, bias 2^(7-4) = 8; 0x7e: field 15, mantissa 110 -> 2^7 * 1.75 = 224;
    # emin -7; subnormal 2^-10; midmax 224 + 2^(7-3-1) = 232
    Case(
        "binary8p4",
        "e4m3b8inuz",
        Kind.FLOAT,
        8,
        4,
        3,
        8,
        7,
        -7,
        224.0,
        232.0,
        2**-7,
        2**-10,
        2**-3,
        InfNaN.INUZ,
    ),
    # Graphcore e4m3b11fnuz: field 15, mantissa 111 -> 2^(15-11) * 1.875 = 30; emin -10;
    # subnormal 2^(-10-3) = 2^-13; midmax 30 + 2^(4-3-1) = 31
    Case(
        "e4m3b11fnuz",
        "e4m3b11fnuz",
        Kind.FLOAT,
        8,
        4,
        3,
        11,
        4,
        -10,
        30.0,
        31.0,
        2**-10,
        2**-13,
        2**-3,
        InfNaN.FNUZ,
    ),
)


def _ids(cases: tuple[Case, ...]) -> list[str]:
    return [c.code for c in cases]


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_each_code_form_parses_to_the_hand_worked_fields(case: Case) -> None:
    spec = number(case.code)
    assert spec.name == case.name
    assert str(spec) == case.name
    assert spec.kind is case.kind
    assert (spec.bits, spec.ebits, spec.mbits, spec.bias) == (
        case.bits,
        case.ebits,
        case.mbits,
        case.bias,
    )
    assert spec.infnan is case.infnan


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_each_code_form_has_the_hand_worked_range(case: Case) -> None:
    spec = number(case.code)
    assert spec.maxfloat == case.maxfloat
    assert spec.emax == case.emax
    assert spec.emin == case.emin
    assert spec.smallest_normal == case.smallest_normal
    assert spec.smallest_subnormal == case.smallest_subnormal
    assert spec.eps == case.eps
    if case.midmax is not None:
        assert spec.midmax == case.midmax


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_kind_predicates_match_the_kind(case: Case) -> None:
    spec = number(case.code)
    assert spec.is_float == (case.kind is Kind.FLOAT)
    assert spec.is_int == (case.kind is Kind.INT)
    assert spec.is_uint == (case.kind is Kind.UINT)
    assert spec.is_exponent == (case.kind is Kind.EXPONENT)
    assert not spec.is_codebook
    # floats and ints carry a sign; uints and exponent scales do not
    assert spec.signed == (case.kind in (Kind.FLOAT, Kind.INT))


def test_float64_has_the_ieee_range_without_hanging() -> None:
    # Run apart with a time limit: a maxfloat search that steps through the 2^52 NaN codes of
    # the top binade one at a time never returns, and would hang the whole suite.
    # IEEE binary64: field 2046, mantissa all ones -> 2^1023 * (2 - 2^-52); emax 1023
    probe = (
        "from onnxq.formats import number; s = number('float64'); "
        "print(repr(s.maxfloat), s.emax, s.emin, repr(s.smallest_subnormal))"
    )
    try:
        run = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=20, check=True
        )
    except subprocess.TimeoutExpired:
        pytest.fail("number('float64').maxfloat did not return within 20 s")
    # emin 1 - 1023 = -1022; smallest subnormal 2^(-1022-52) = 2^-1074
    want = f"{2.0**1023 * (2 - 2**-52)!r} 1023 -1022 {2.0**-1074!r}"
    assert run.stdout.strip() == want


# Each alias and the code it must equal: torch / ml_dtypes names, case, whitespace, suffixes.
ALIASES = (
    ("float8_e4m3fn", "e4m3fn"),
    ("torch.float8_e4m3fn", "e4m3fn"),
    ("E4M3FN", "e4m3"),
    ("  e4m3  ", "e4m3fn"),
    ("float8_e5m2", "e5m2ieee"),
    ("float8_e4m3", "e4m3ieee"),
    ("float8_e3m4", "e3m4ieee"),
    ("float8_e4m3fnuz", "e4m3b8fnuz"),
    ("float8_e5m2fnuz", "e5m2b16fnuz"),
    ("float8_e4m3b11fnuz", "e4m3b11fnuz"),
    ("float8_e8m0fnu", "e8m0"),
    ("e8m0fnu", "e8m0"),
    ("e8m0b127", "e8m0"),
    ("float4_e2m1fn", "e2m1fnuz"),
    ("float4_e2m1fn_x2", "e2m1"),
    ("float6_e2m3fn", "e2m3fnuz"),
    ("float6_e3m2fn", "e3m2"),
    ("float16", "e5m10"),
    ("half", "e5m10ieee"),
    ("bfloat16", "e8m7"),
    ("float32", "e8m23"),
    ("float", "e8m23b127ieee"),
    ("float64", "e11m52"),
    ("double", "e11m52"),
    ("e4m3b7fn", "e4m3fn"),
    ("binary8p3", "e5m2b16inuz"),
    ("binary8p4", "e4m3b8inuz"),
    ("binary8p5", "e3m4b4inuz"),
)


@pytest.mark.parametrize(("alias", "code"), ALIASES)
def test_aliases_parse_to_the_same_spec(alias: str, code: str) -> None:
    assert number(alias) == number(code)


def test_a_bias_or_suffix_makes_a_different_spec() -> None:
    assert number("e4m3fnuz") != number("float8_e4m3fnuz")  # bias 7 vs 8 (architecture decision 9)
    assert number("e4m3fn") != number("e4m3fnuz")
    assert number("e4m3fn") != number("e4m3ieee")
    assert number("e5m2") != number("e5m2fnuz")
    assert number("int4") != number("uint4")


# -- round trip ----------------------------------------------------------------------------
_SWEEP = (
    tuple(
        f"e{e}m{m}{b}{s}"
        for e in range(1, 9)
        for m in range(1, 8)
        for b in ("", "b3")
        for s in ("", "fn", "fnuz", "inuz", "ieee")
    )
    + tuple(f"{u}int{n}" for u in ("", "u") for n in range(2, 33))
    + ("uint1", "e5m0", "e8m0b100")
)

_P3109 = tuple(f"binary8p{p}" for p in range(1, 8))


@pytest.mark.parametrize("code", [c.code for c in CASES] + [a for a, _ in ALIASES] + list(_SWEEP))
def test_the_canonical_name_parses_back_to_the_same_spec(code: str) -> None:
    spec = number(code)
    assert number(str(spec)) == spec
    assert number(spec.name.upper()) == spec


@pytest.mark.parametrize(
    "code",
    [c for c in _P3109],
)
def test_every_p3109_binary8_format_round_trips(code: str) -> None:
    spec = number(code)
    assert number(str(spec)) == spec


# -- against gfloat --------------------------------------------------------------------------
# (onnxq code, gfloat FormatInfo, codes where the two are known to differ and why)
# OCP FP4/FP6 in gfloat have -0 at the sign-only code; onnxq spells them fnuz (same finite value
# set, NaN at that code, never produced from finite input: number.py module doc).
GFLOAT = (
    ("e4m3", gf.format_info_ocp_e4m3, ()),
    ("e5m2", gf.format_info_ocp_e5m2, ()),
    ("e2m1", gf.format_info_ocp_e2m1, (0x8,)),
    ("e2m3", gf.format_info_ocp_e2m3, (0x20,)),
    ("e3m2", gf.format_info_ocp_e3m2, (0x20,)),
    ("e8m0", gf.format_info_ocp_e8m0, ()),
    ("int8", gf.format_info_ocp_int8, ()),  # MX int8: codes scaled by 2^-6, -128 included
    ("float16", gf.format_info_binary16, ()),
    ("bfloat16", gf.format_info_bfloat16, ()),
    *((f"binary8p{p}", gf.format_info_p3109(8, p), ()) for p in range(1, 8)),
)


@pytest.mark.parametrize(("code", "fi", "skip"), GFLOAT, ids=[g[0] for g in GFLOAT])
def test_range_matches_gfloat(code: str, fi: gfloat.FormatInfo, skip: tuple[int, ...]) -> None:
    spec = number(code)
    if code == "int8":
        # gfloat's OCP int8 is the MX fixed-point element (scaled by 2^-6): max 127/64.
        # onnxq keeps integer codes and puts the 2^-6 in emax = N - 2 = 6.
        assert spec.maxfloat * 2.0**-spec.emax == fi.max
        return
    assert spec.maxfloat == fi.max
    assert spec.emax == fi.emax
    if fi.has_subnormals:
        assert spec.smallest_subnormal == fi.smallest_subnormal
        assert spec.smallest_normal == fi.smallest_normal
    if spec.is_float:
        assert spec.eps == fi.eps


# gfloat decodes one code at a time; the 16-bit formats are checked against ml_dtypes below.
GFLOAT_8BIT = tuple(g for g in GFLOAT if g[0] not in ("float16", "bfloat16"))


@pytest.mark.parametrize(("code", "fi", "skip"), GFLOAT_8BIT, ids=[g[0] for g in GFLOAT_8BIT])
def test_every_code_decodes_like_gfloat(
    code: str, fi: gfloat.FormatInfo, skip: tuple[int, ...]
) -> None:
    spec = number(code)
    scale = 2.0**spec.emax if code == "int8" else 1.0  # gfloat int8 is scaled by 2^-6
    for c in range(1 << spec.bits):
        if c in skip:
            continue
        want = gfloat.decode_float(fi, c).fval * scale
        got = spec.decode(c)
        if math.isnan(want):
            assert math.isnan(got), f"code {c:#x}"
        else:
            assert got == want, f"code {c:#x}"
            assert math.copysign(1.0, got) == math.copysign(1.0, want), f"sign of code {c:#x}"


# -- against ml_dtypes ------------------------------------------------------------------------
# (ml_dtypes type, onnxq code written independently of onnxq's torch-name table, codes that
# differ by design). float4_e2m1fn / float6_* have -0 at the sign-only code where onnxq's fnuz
# value set has NaN (no -0): skip exactly that code.
ML_DTYPES = (
    (ml_dtypes.float8_e4m3fn, "e4m3fn", ()),
    (ml_dtypes.float8_e5m2, "e5m2", ()),
    (ml_dtypes.float8_e4m3fnuz, "e4m3b8fnuz", ()),
    (ml_dtypes.float8_e5m2fnuz, "e5m2b16fnuz", ()),
    (ml_dtypes.float8_e4m3b11fnuz, "e4m3b11fnuz", ()),
    (ml_dtypes.float8_e3m4, "e3m4ieee", ()),
    (ml_dtypes.float8_e4m3, "e4m3ieee", ()),
    (ml_dtypes.float4_e2m1fn, "e2m1fnuz", (0x8,)),
    (ml_dtypes.float6_e2m3fn, "e2m3fnuz", (0x20,)),
    (ml_dtypes.float6_e3m2fn, "e3m2fnuz", (0x20,)),
    (ml_dtypes.float8_e8m0fnu, "e8m0", ()),
    (np.float16, "float16", ()),
    (ml_dtypes.bfloat16, "bfloat16", ()),
    (ml_dtypes.int4, "int4", ()),
    (ml_dtypes.uint4, "uint4", ()),
    (ml_dtypes.int2, "int2", ()),
    (np.int8, "int8", ()),
    (np.uint8, "uint8", ()),
)


def _ml_values(dtype: type, bits: int) -> np.ndarray:
    """Every code of ``bits`` bits viewed as ``dtype``, as float64."""
    store = np.uint16 if bits > 8 else np.uint8
    with np.errstate(invalid="ignore"):  # bfloat16 NaN -> float64 warns
        return np.arange(1 << bits, dtype=store).view(dtype).astype(np.float64)


@pytest.mark.parametrize(("dtype", "code", "skip"), ML_DTYPES, ids=[m[1] for m in ML_DTYPES])
def test_values_are_the_finite_values_of_ml_dtypes(
    dtype: type, code: str, skip: tuple[int, ...]
) -> None:
    spec = number(code)
    ml = _ml_values(dtype, spec.bits)
    want = sorted({float(v) for v in ml if np.isfinite(v)})
    assert spec.values() == want


@pytest.mark.parametrize(("dtype", "code", "skip"), ML_DTYPES, ids=[m[1] for m in ML_DTYPES])
def test_every_code_decodes_like_ml_dtypes_bit_for_bit(
    dtype: type, code: str, skip: tuple[int, ...]
) -> None:
    spec = number(code)
    ml = _ml_values(dtype, spec.bits)
    for c in range(1 << spec.bits):
        if c in skip:
            continue
        want, got = float(ml[c]), spec.decode(c)
        if math.isnan(want):
            assert math.isnan(got), f"code {c:#x}"
        else:
            assert got == want, f"code {c:#x}"
            assert math.copysign(1.0, got) == math.copysign(1.0, want), f"sign of code {c:#x}"


@pytest.mark.parametrize("code", ["e2m1fnuz", "e2m3fnuz", "e3m2fnuz", "e4m3fnuz"])
def test_the_fnuz_negative_zero_code_is_nan(code: str) -> None:
    spec = number(code)
    assert math.isnan(spec.decode(1 << (spec.bits - 1)))
    assert not spec.has_negative_zero


@pytest.mark.parametrize(
    ("dtype", "code"),
    [
        (ml_dtypes.float8_e4m3fn, "e4m3fn"),
        (ml_dtypes.float8_e5m2, "e5m2"),
        (ml_dtypes.float8_e4m3fnuz, "float8_e4m3fnuz"),
        (ml_dtypes.float8_e5m2fnuz, "float8_e5m2fnuz"),
        (ml_dtypes.float8_e4m3b11fnuz, "e4m3b11fnuz"),
        (ml_dtypes.float8_e3m4, "float8_e3m4"),
        (ml_dtypes.float8_e4m3, "float8_e4m3"),
        (ml_dtypes.float4_e2m1fn, "float4_e2m1fn"),
        (ml_dtypes.float6_e2m3fn, "float6_e2m3fn"),
        (ml_dtypes.float6_e3m2fn, "float6_e3m2fn"),
        (ml_dtypes.float8_e8m0fnu, "float8_e8m0fnu"),
        (np.float16, "float16"),
        (ml_dtypes.bfloat16, "bfloat16"),
        (np.float32, "float32"),
        (np.float64, "float64"),
    ],
)
def test_range_matches_ml_dtypes_finfo(dtype: type, code: str) -> None:
    spec = number(code)
    fi = ml_dtypes.finfo(dtype)
    assert spec.bits == fi.bits
    assert spec.maxfloat == float(fi.max)
    assert spec.emax == fi.maxexp - 1  # finfo.maxexp is the first exponent that overflows
    assert spec.emin == fi.minexp
    assert spec.smallest_normal == float(fi.smallest_normal)
    assert spec.smallest_subnormal == float(fi.smallest_subnormal)
    assert spec.eps == float(fi.eps)


@pytest.mark.parametrize(
    ("code", "has_inf", "has_nan"),
    [
        ("e5m2", True, True),  # IEEE: field 31
        ("float16", True, True),
        ("e4m3fn", False, True),  # fn: only S.1111.111 is NaN
        ("e4m3fnuz", False, True),  # fnuz: 0x80 is NaN
        ("binary8p3", True, True),  # P3109: 0x7f/0xff are +-Inf, 0x80 NaN
        ("e8m0", False, True),  # 255 is NaN
        ("int8", False, False),
        ("uint4", False, False),
    ],
)
def test_inf_and_nan_codes_follow_the_suffix(code: str, has_inf: bool, has_nan: bool) -> None:
    spec = number(code)
    decoded = [spec.decode(c) for c in range(1 << spec.bits)]
    assert spec.has_inf == has_inf == any(math.isinf(v) for v in decoded)
    assert spec.has_nan == has_nan == any(math.isnan(v) for v in decoded)


def test_values_refuses_formats_wider_than_16_bits() -> None:
    with pytest.raises(ValueError, match="float32"):
        number("float32").values()


@pytest.mark.parametrize(
    ("code", "bad"), [("e4m3", 256), ("e4m3", -1), ("e2m1", 16), ("int8", 256)]
)
def test_decode_rejects_a_code_outside_the_format(code: str, bad: int) -> None:
    with pytest.raises(ValueError, match=re.escape(str(bad))):
        number(code).decode(bad)


def test_number_and_number_spec_agree_on_non_codebook_codes() -> None:
    for case in CASES:
        assert number_spec(case.code) == number(case.code)
    assert isinstance(number("e4m3"), NumberSpec)


# -- malformed codes -------------------------------------------------------------------------
MALFORMED = (
    ("e4m", "'e4m'"),  # no mantissa width
    ("int0", r"int0.*2 <= N"),
    ("int1", r"int1.*2 <= N"),  # a signed int needs a sign and a magnitude bit
    ("uint0", r"uint0.*1 <= N"),
    ("int33", r"int33.*N <= 32"),
    ("uint33", r"uint33.*N <= 32"),
    ("e0m3", r"e0m3.*exponent bit"),
    ("e4m3x", "'e4m3x'"),
    ("e4m3fnu", r"e4m3fnu.*fnu"),  # fnu is for exponent types only
    ("binary8p9", r"binary8p9.*1 <= P <= 7"),
    ("binary8p0", r"binary8p0.*1 <= P <= 7"),
    ("e8m0fn", r"e8m0fn.*no suffix"),
    ("e5m0ieee", r"e5m0ieee.*no suffix"),
    ("floaty", "'floaty'"),
    ("float8_e4m3fnuzz", "'float8_e4m3fnuzz'"),
    ("e60m10", r"e60m10.*64 bits"),
    ("", "''"),
    ("   ", "'   '"),
)


@pytest.mark.parametrize(("code", "message"), MALFORMED, ids=[m[0] or "empty" for m in MALFORMED])
def test_a_malformed_number_code_raises_naming_it(code: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        number(code)
    with pytest.raises(ValueError, match=message):
        number_spec(code)


@pytest.mark.parametrize("code", [5, None, b"e4m3", 1.5])
def test_a_number_code_that_is_not_a_string_raises_type_error(code: object) -> None:
    with pytest.raises(TypeError, match=type(code).__name__):
        number(code)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=type(code).__name__):
        number_spec(code)  # type: ignore[arg-type]
