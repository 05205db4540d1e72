"""Differential fuzzing of the two data type parsers (Python onnxq.datatype, C++ parse_dtype).

Codes are built from the grammar's tokens (docs/formats.md) mixed with hostile characters:
digits of other scripts, Unicode spaces, NUL and other controls, very long numbers and long
repetitions. Both parsers must accept or refuse alike, read accepted codes into the same
fields, and refuse with a one-line ValueError. Seeded and bounded (derandomize, max_examples).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import onnxq
from onnxq.cast import native

pytestmark = pytest.mark.needs_native

FUZZ = settings(
    derandomize=True,
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

GRAMMAR = [
    "e", "m", "b", "fn", "fnuz", "inuz", "ieee", "fnu", "int", "uint", "binary8p", "float16",
    "float32", "float64", "bfloat16", "half", "float", "double", "torch.", "float8_",
    "float8_e4m3fn", "float8_e5m2fnuz", "float4_e2m1fn_x2", "cb", "f", "i", "p", "s", "t", "n",
    "_", "_", "_", "x2", "mx", "mxfp4", "nvfp4", "mx6", "uint8_tensor", "e8m0", "e4m3fn",
    "e2m1fnuz", "float32", "_t32", "_t0", "_t", "s2", "n2m4", "E", "M", "T", "-", ".",
]  # fmt: skip
HOSTILE = [
    "\x00", "\xa0", "\u3000", "\u2007", "\u200b", "\ufeff", " ", "\t", "\n", "\x1c", "\x85",
    "\u0662", "\u0664", "\uff18", "\u0968", "\u2074", "\u00b2", "\u212a", "\u0130", "\u017f",
    "'", "\\", "%s", "{}", "\U0001d7d8",
]  # fmt: skip
NUMBERS = st.one_of(
    st.integers(0, 70).map(str),
    st.sampled_from(["0", "00", "1023", "1024", "1074", "1075", "65536", "131072", "00032"]),
    st.integers(0, 10**30).map(str),
    st.integers(1, 400).map(lambda k: "9" * k),
    st.integers(1, 12).map(lambda k: "0" * k + "8"),
)
TOKEN = st.one_of(
    st.sampled_from(GRAMMAR), NUMBERS, st.sampled_from(HOSTILE), st.sampled_from("0123456789")
)
SOUP = st.lists(TOKEN, max_size=14).map("".join)

SUFFIX = st.sampled_from(["", "", "", "fn", "fnuz", "inuz", "ieee", "fnu"])
SMALL = st.integers(0, 12).map(str) | st.sampled_from(["20", "23", "52", "1023", "1055", "99999"])
FLOAT = st.builds(
    lambda e, m, b, sfx: f"e{e}m{m}{'' if b is None else 'b' + b}{sfx}",
    SMALL,
    SMALL,
    st.none() | st.none() | SMALL,
    SUFFIX,
)
NUMBER = st.one_of(
    FLOAT,
    st.builds(lambda u, n: f"{u}int{n}", st.sampled_from(["", "u"]), SMALL | st.just("32")),
    st.builds(lambda p: f"binary8p{p}", SMALL),
    st.sampled_from(["float16", "float32", "float64", "bfloat16", "float8_e4m3fnuz", "e8m23"]),
)
SCALE_NUMBER = st.one_of(
    st.sampled_from(["e8m0", "e5m0", "e10m0", "e11m0", "e12m0", "e8m0b100", "e10m0b1075"]),
    st.sampled_from(["e4m3fn", "float32", "float16", "bfloat16", "float64", "uint8", "int8"]),
    NUMBER,
)
TILE = st.builds(
    lambda t, s, nm: f"t{t}{'' if s is None else 's' + s}{nm}",
    st.sampled_from(["", "0", "2", "8", "16", "32", "65536", "131072", "3", "000016"]),
    st.none() | st.none() | st.sampled_from(["2", "4", "8", "3", "64"]),
    st.sampled_from(["", "", "", "n2m4", "n1m2", "n4m4", "n2m32", "n15m16"]),
)
STRUCTURED = st.builds(
    lambda elem, scales, tiles: "_".join([elem, *scales, *tiles]),
    NUMBER,
    st.lists(SCALE_NUMBER, min_size=1, max_size=3),
    st.lists(TILE, max_size=3),
)
# Valid codes with one number field replaced: the limits' edges, from both sides.
VALID = [
    "e2m1fnuz_e8m0_t32", "int8_e8m0_t16s2", "e4m3fn", "e11m20", "e11m20b1055", "e5m2_e8m0_t32",
    "uint4_float16_uint8_t32", "e2m1fnuz_e4m3fn_float32_t16", "int8_e10m0b1016_t32",
    "e2m1fnuz_e8m0_t32n2m4", "int8_e8m0_t8_t4", "e4m3fn_e8m0_t65536", "e11m0inuz_e8m0_t32",
    "int32_e8m0_t32", "e8m23_e8m0_t32", "binary8p3_e8m0_t32", "cb41fi_e2m2fnuz_e8m0_t8s4",
]  # fmt: skip
EDGE = st.one_of(
    st.integers(0, 70).map(str),
    st.sampled_from(["1016", "1017", "1022", "1023", "1024", "1054", "1055", "1056", "1074"]),
    st.sampled_from(["1075", "65536"]),
    st.sampled_from(["131072", "32768", "00032", "000032", "99999", "100000"]),
)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    code = draw(st.sampled_from(VALID))
    runs = [m.span() for m in re.finditer("[0-9]+", code)]
    start, end = draw(st.sampled_from(runs))
    return code[:start] + draw(EDGE) + code[end:]


CODEBOOK = st.builds(
    lambda ib, mb, desc, compute, rest: f"cb{ib}{mb}{desc}_{compute}_{rest}",
    st.integers(0, 9),
    st.integers(0, 5),
    st.sampled_from(["", "f", "i", "fi", "f0e", "ie", "p1", "s335", "f01", "q"]),
    NUMBER,
    st.sampled_from(["e8m0_t8s4", "e8m0_t32", "e8m0", "lab_e8m0_t16s2", "float32_t8"]),
)


def _python(code: str) -> dict[str, int] | str:
    try:
        dt = onnxq.datatype(code)
    except ValueError as err:
        return str(err)
    return native.format_fields(dt)


def _cpp(code: str) -> dict[str, int] | str:
    try:
        return native.parse_dtype(code)
    except ValueError as err:
        return str(err)


def _agree(code: str) -> None:
    py, cpp = _python(code), _cpp(code)
    if isinstance(py, str) or isinstance(cpp, str):
        assert isinstance(py, str) and isinstance(cpp, str), (code, py, cpp)
        for message in (py, cpp):
            assert message and "\n" not in message and "\r" not in message, (code, message)
    else:
        assert py == cpp, code


@FUZZ
@given(SOUP)
def test_token_soup(code: str) -> None:
    _agree(code)


@FUZZ
@given(st.one_of(STRUCTURED, CODEBOOK, mutated()))
def test_structured_codes(code: str) -> None:
    _agree(code)


@FUZZ
@given(
    st.one_of(STRUCTURED, st.sampled_from(sorted(onnxq.datatypes()))),
    st.sampled_from(HOSTILE),
    st.integers(0, 200),
    st.integers(1, 3),
)
def test_hostile_character_anywhere(code: str, hostile: str, at: int, count: int) -> None:
    pos = at % (len(code) + 1)
    _agree(code[:pos] + hostile * count + code[pos:])


@settings(derandomize=True, max_examples=40, deadline=None)
@given(STRUCTURED, st.integers(2, 20_000), st.sampled_from(["_t32", "9", " ", "e8m0_", "\x00"]))
def test_huge_repetition(code: str, times: int, piece: str) -> None:
    _agree(code + piece * times)
