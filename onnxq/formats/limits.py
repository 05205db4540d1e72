"""The limits of the format language, shared by every parser entry point (docs/formats.md).

The C++ parser (ops/src/parse.cc, ops/src/number.cc) enforces the same numbers; both are
tested against tests/formats/format_codes.tsv. Every check here runs before any arithmetic on the
code's numbers, so a hostile code costs microseconds, never a big-integer power or a loop.
"""

from __future__ import annotations

__all__ = [
    "FLOAT32_TILE_REACH",
    "MAX_CODE_LENGTH",
    "MAX_DIGITS",
    "MAX_ELEMENT_BITS",
    "MAX_EXPONENT_TYPE_BITS",
    "MAX_FLOAT_EXPONENT_BITS",
    "MAX_MANTISSA_BITS",
    "MAX_NUMBER_BITS",
    "MAX_SCALE_BITS",
    "MAX_SPARSE_M",
    "MAX_TILE",
    "MAX_VALUE_EXPONENT",
    "MIN_SCALE_STEP_EXPONENT",
    "MIN_VALUE_EXPONENT",
    "digits",
    "normalize",
]

MAX_CODE_LENGTH = 128  # characters, surrounding whitespace included
MAX_DIGITS = 5  # per number field (eX, mY, bZ, intN, tT, sS, nN, mM, binary8pP)
MAX_FLOAT_EXPONENT_BITS = 11  # float64's exponent field
MAX_MANTISSA_BITS = 52  # float64's mantissa: every value is exact in float64
MAX_NUMBER_BITS = 64  # a number code (float64 is a valid number, not a valid element)
MAX_EXPONENT_TYPE_BITS = 10  # eXm0 exponent (scale) types: 5 <= X <= 10
MAX_ELEMENT_BITS = 32  # element codes (a codebook's compute type counts as its element)
MAX_SCALE_BITS = 32  # scales, zero points and tensor scales
MAX_TILE = 65536  # tile size per dimension (a power of two, 2..65536; t0 = channel)
MAX_SPARSE_M = 16  # N:M sparsity block
MAX_VALUE_EXPONENT = 1023  # every finite value of a format is below 2^1024 (float64 range)
MIN_VALUE_EXPONENT = -1074  # and its smallest step is at least 2^-1074 (float64 subnormal)
# Under an exponent scale, the element grid's steps where a float32 tile reaches (a float
# element's, a codebook compute type's) and the scale's smallest grid step, 2^-(bias + an int
# element's fraction bits), are normal float64 numbers: the engines scale and round with exact
# powers of two built from float64 exponent bits.
MIN_SCALE_STEP_EXPONENT = -1022
# How far below a float element's emax a float32 tile under an exponent scale puts values:
# 2^-149 under the largest scale its amax can take, 2^(127 + 1 - emax) and one search step up.
# (Where the scale clamps at its bottom instead, values stay above 2^-149.)
FLOAT32_TILE_REACH = 278

# Only these characters may appear in a code (checked after lowercasing ASCII letters).
_ALLOWED = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.-")
_ASCII_SPACE = " \t\n\r\v\f"


def _shown(code: str) -> str:
    """The code for a one-line message: repr (escapes controls), long ones cut."""
    return repr(code) if len(code) <= 40 else f"{code[:40]!r}... ({len(code)} characters)"


def normalize(code: str) -> str:
    """Check the length, strip surrounding ASCII whitespace, check characters, lowercase.

    Raises:
        ValueError: the code is longer than MAX_CODE_LENGTH or holds a character outside
            ASCII letters, digits, '_', '.' and '-' (inner whitespace, NUL, NBSP, non-ASCII
            digits are all refused).
    """
    if len(code) > MAX_CODE_LENGTH:  # surrounding whitespace counts: messages echo the code
        raise ValueError(
            f"{_shown(code)}: a data type code has at most {MAX_CODE_LENGTH} characters"
        )
    text = code.strip(_ASCII_SPACE)
    lowered = text.lower() if text.isascii() else text
    for pos, char in enumerate(lowered):
        if char not in _ALLOWED:
            raise ValueError(
                f"{_shown(code)}: unexpected character {char!r} at position {pos}; codes use "
                f"ASCII letters, digits, '_', '.' and '-' only"
            )
    return lowered


def digits(text: str, what: str, code: str) -> int:
    """Convert an ASCII digit run of a number field, refusing more than MAX_DIGITS digits.

    Raises:
        ValueError: the run is longer than MAX_DIGITS (checked before converting).
    """
    if len(text) > MAX_DIGITS:
        raise ValueError(
            f"{_shown(code)}: {what} has {len(text)} digits; at most {MAX_DIGITS} are allowed"
        )
    return int(text)
