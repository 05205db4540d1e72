"""NumberSpec: an unscaled number format, parsed from a code string (pure Python).

Codes (case-insensitive):

- ``eXmY[bZ][fn|fnuz|inuz|ieee]``: a float with X exponent bits, Y mantissa bits, bias Z
  (default 2^(X-1) - 1). Suffixes: ``ieee`` - the top exponent holds Inf and NaN; ``fn`` - no
  Inf, NaN is the all-ones code (OCP E4M3); ``fnuz`` - no Inf, NaN is the negative-zero code and
  every other code is finite; ``inuz`` - like fnuz with +-Inf on the largest codes (P3109).
  Bare, the OCP convention of each width: ``ieee`` when X >= 5 (E5M2, float16, bfloat16),
  ``fn`` for other 8-bit and wider codes (E4M3 = e4m3fn), ``fnuz`` below 8 bits (OCP FP6/FP4
  have no NaN; fnuz has their value set and onnxq never writes its NaN code for finite input).
- ``eXm0`` with X >= 5: an unsigned exponent (scale) type; ``e8m0`` is OCP E8M0 (255 = NaN).
- ``intN`` (N >= 2), ``uintN`` (N >= 1): integers; as MX elements ints are fixed point with one
  integer bit, which is the same as exponent scaling with ``emax = N - 2``.
- ``float16/32/64``, ``bfloat16``, ``binary8pP`` (P3109: e(8-P)m(P-1), bias 2^(7-P), inuz), and
  torch / ml_dtypes names (``float8_e4m3fnuz`` has bias 8, ``float8_e5m2fnuz`` bias 16:
  docs/architecture.md, decision 9).

``str(spec)`` is the canonical code and ``number(str(spec)) == spec``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from enum import Enum

from onnxq.formats import limits

__all__ = ["InfNaN", "Kind", "NumberSpec", "number_spec"]


class Kind(str, Enum):
    """The category of a number format."""

    FLOAT = "float"  # sign, exponent, mantissa, implicit bit, subnormals
    INT = "int"  # two's complement code; symmetric range in casts (architecture decision 6)
    UINT = "uint"
    EXPONENT = "exponent"  # unsigned power of two (E8M0): value 2^(code - bias)
    CODEBOOK = "codebook"  # index into a lookup table of compute values (codebook.py)


class InfNaN(str, Enum):
    """Which float codes are Inf and NaN."""

    IEEE = "ieee"  # top exponent field: mantissa 0 = Inf, else NaN
    FN = "fn"  # no Inf; NaN = exponent and mantissa all ones (either sign)
    FNUZ = "fnuz"  # no Inf; NaN = the negative-zero code; no -0
    INUZ = "inuz"  # +-Inf = the largest codes; NaN = the negative-zero code; no -0


_TORCH_NAMES = {
    "float8_e4m3fn": "e4m3fn",
    "float8_e4m3": "e4m3ieee",
    "float8_e5m2": "e5m2",
    "float8_e4m3fnuz": "e4m3b8fnuz",
    "float8_e5m2fnuz": "e5m2b16fnuz",
    "float8_e4m3b11fnuz": "e4m3b11fnuz",
    "float8_e3m4": "e3m4ieee",
    "float8_e8m0fnu": "e8m0",
    "float4_e2m1fn": "e2m1fnuz",
    "float4_e2m1fn_x2": "e2m1fnuz",
    "float6_e2m3fn": "e2m3fnuz",
    "float6_e3m2fn": "e3m2fnuz",
    "float16": "e5m10",
    "half": "e5m10",
    "bfloat16": "e8m7",
    "float32": "e8m23",
    "float": "e8m23",
    "float64": "e11m52",
    "double": "e11m52",
}
# Canonical names for the common IEEE types, the inverse of the table above.
_FLOAT_ALIASES = {"e5m10": "float16", "e8m7": "bfloat16", "e8m23": "float32", "e11m52": "float64"}

_FORMS = (
    "expected eXmY[bZ][fn|fnuz|inuz|ieee], eXm0 (exponent, X >= 5), intN, uintN, "
    "float16/32/64, bfloat16, binary8pP or a torch float8 name"
)
# [0-9], not \d: \d also matches digits of other scripts, which int() would accept.
_FLOAT_RE = re.compile(r"e([0-9]+)m([0-9]+)(?:b([0-9]+))?(fn|fnuz|inuz|ieee|fnu)?")
_INT_RE = re.compile(r"(u?)int([0-9]+)")
_P3109_RE = re.compile(r"binary8p([0-9]+)")


def _bare_infnan(ebits: int, bits: int) -> InfNaN:
    """The OCP convention for a float code written without a suffix (see module doc)."""
    if ebits >= 5:
        return InfNaN.IEEE
    return InfNaN.FN if bits >= 8 else InfNaN.FNUZ


def _float_max_code(ebits: int, mbits: int, infnan: InfNaN | None) -> int:
    """The code of the largest finite value of a float format, in closed form."""
    sign_bit = 1 << (ebits + mbits)
    match infnan:
        case InfNaN.IEEE:  # below the Inf/NaN binade
            return (((1 << ebits) - 1) << mbits) - 1
        case InfNaN.FNUZ:  # every magnitude is finite
            return sign_bit - 1
        case _:  # fn: the all-ones magnitude is NaN; inuz: it is Inf
            return sign_bit - 2


def _check_range(kind: Kind, ebits: int, mbits: int, bias: int, infnan: InfNaN | None) -> None:
    """Refuse float and exponent formats outside the limits (widths first, then the range).

    Every finite value must be a normal or subnormal float64, so decoding never overflows
    and the largest value needs no search (ops/src/number.cc checks the same).
    """
    where = f"'e{ebits}m{mbits}b{bias}'" if abs(bias) < 10**9 else f"'e{ebits}m{mbits}'"
    if kind is Kind.EXPONENT:
        if not 1 <= ebits <= limits.MAX_EXPONENT_TYPE_BITS:
            raise ValueError(
                f"{where}: exponent (scale) types have at most "
                f"{limits.MAX_EXPONENT_TYPE_BITS} bits (e5m0 .. e10m0), got {ebits}"
            )
        top, step = (1 << ebits) - 2 - bias, -bias
    else:
        if not 1 <= ebits <= limits.MAX_FLOAT_EXPONENT_BITS:
            raise ValueError(
                f"{where}: floats have 1 to {limits.MAX_FLOAT_EXPONENT_BITS} exponent bits, "
                f"got {ebits}"
            )
        if mbits > limits.MAX_MANTISSA_BITS:
            raise ValueError(
                f"{where}: floats have at most {limits.MAX_MANTISSA_BITS} mantissa bits, "
                f"got {mbits}"
            )
        top = max(_float_max_code(ebits, mbits, infnan) >> mbits, 1) - bias
        step = 1 - bias - mbits
    if top > limits.MAX_VALUE_EXPONENT:
        raise ValueError(
            f"{where}: the largest value reaches 2^{top}, beyond float64's 2^"
            f"{limits.MAX_VALUE_EXPONENT}; use a larger bias"
        )
    if step < limits.MIN_VALUE_EXPONENT:
        raise ValueError(
            f"{where}: the smallest step 2^{step} is below float64's 2^"
            f"{limits.MIN_VALUE_EXPONENT}; use a smaller bias"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class NumberSpec:
    """An unscaled number format. Build one with `onnxq.number(code)`."""

    kind: Kind
    ebits: int  # exponent bits (0 for ints)
    mbits: int  # stored mantissa bits (magnitude bits for ints, 0 for exponents)
    bias: int  # exponent bias (0 for ints)
    infnan: InfNaN | None = None  # floats only

    def __post_init__(self) -> None:
        if self.kind is Kind.FLOAT:
            if self.ebits < 1 or self.mbits < 0 or self.infnan is None:
                raise ValueError(f"invalid float format {self!r}")
        if self.kind in (Kind.FLOAT, Kind.EXPONENT):
            _check_range(self.kind, self.ebits, self.mbits, self.bias, self.infnan)
        if self.bits > limits.MAX_NUMBER_BITS:
            raise ValueError(f"{self.name}: at most 64 bits are supported, got {self.bits}")

    # -- identity -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The canonical code: ``number(spec.name) == spec``."""
        match self.kind:
            case Kind.INT:
                return f"int{self.bits}"
            case Kind.UINT:
                return f"uint{self.bits}"
            case Kind.EXPONENT:
                return f"e{self.ebits}m0" + (
                    f"b{self.bias}" if self.bias != self._default_bias else ""
                )
            case Kind.FLOAT:
                base = f"e{self.ebits}m{self.mbits}"
                bias = f"b{self.bias}" if self.bias != self._default_bias else ""
                assert self.infnan is not None
                if not bias and self.infnan is InfNaN.IEEE and base in _FLOAT_ALIASES:
                    return _FLOAT_ALIASES[base]
                bare = _bare_infnan(self.ebits, self.bits)
                # A bare eXm0 with X >= 5 would read back as an exponent type: keep the suffix.
                implicit = self.infnan is bare is InfNaN.IEEE and not (
                    self.mbits == 0 and self.ebits >= 5
                )
                suffix = "" if implicit else self.infnan.value
                return base + bias + suffix
            case _:
                raise AssertionError(self.kind)

    def __str__(self) -> str:
        return self.name

    @property
    def _default_bias(self) -> int:
        return 2 ** (self.ebits - 1) - 1 if self.ebits else 0

    @property
    def bits(self) -> int:
        """Total bits per code."""
        match self.kind:
            case Kind.FLOAT:
                return 1 + self.ebits + self.mbits
            case Kind.INT:
                return self.mbits + 1
            case Kind.UINT:
                return self.mbits
            case Kind.EXPONENT:
                return self.ebits
            case _:
                raise AssertionError(self.kind)

    @property
    def signed(self) -> bool:
        """True for floats and ints."""
        return self.kind in (Kind.FLOAT, Kind.INT)

    @property
    def is_float(self) -> bool:
        """True for floating-point formats."""
        return self.kind is Kind.FLOAT

    @property
    def is_int(self) -> bool:
        """True for signed integers."""
        return self.kind is Kind.INT

    @property
    def int_fraction_bits(self) -> int:
        """Fraction bits of an int element read as fixed point with one integer bit (int8: 6).

        0 for every other kind. The scale of an int tile counts from this point: the stored
        exponent is the grid step's exponent plus these bits.
        """
        return self.bits - 2 if self.is_int else 0

    @property
    def is_uint(self) -> bool:
        """True for unsigned integers."""
        return self.kind is Kind.UINT

    @property
    def is_exponent(self) -> bool:
        """True for power-of-two scale types (E8M0)."""
        return self.kind is Kind.EXPONENT

    @property
    def is_codebook(self) -> bool:
        """True for `Codebook` (a lookup-table format)."""
        return False

    @property
    def compute_spec(self) -> NumberSpec:
        """The format element arithmetic runs in: itself (a codebook's compute type)."""
        return self

    @property
    def has_inf(self) -> bool:
        """True when some code decodes to infinity."""
        return self.infnan in (InfNaN.IEEE, InfNaN.INUZ)

    @property
    def has_nan(self) -> bool:
        """True when some code decodes to NaN."""
        return self.kind in (Kind.FLOAT, Kind.EXPONENT)

    @property
    def has_negative_zero(self) -> bool:
        """True when -0 has its own code (ieee and fn floats)."""
        return self.infnan in (InfNaN.IEEE, InfNaN.FN)

    # -- codes ----------------------------------------------------------------------------
    def decode(self, code: int) -> float:
        """Return the value of one code (NaN and +-inf as Python floats).

        Raises:
            ValueError: ``code`` is outside 0 .. 2^bits - 1.
        """
        if not 0 <= code < 1 << self.bits:
            raise ValueError(f"{self.name}: code {code} is outside 0..{(1 << self.bits) - 1}")
        match self.kind:
            case Kind.INT:
                return float(code - (1 << self.bits) if code >> (self.bits - 1) else code)
            case Kind.UINT:
                return float(code)
            case Kind.EXPONENT:
                if code == (1 << self.ebits) - 1:
                    return math.nan
                return math.ldexp(1.0, code - self.bias)
            case Kind.FLOAT:
                return self._decode_float(code)
            case _:
                raise AssertionError(self.kind)

    def _decode_float(self, code: int) -> float:
        sign_bit = 1 << (self.bits - 1)
        negative = bool(code & sign_bit)
        magnitude = code & (sign_bit - 1)
        field = magnitude >> self.mbits
        mant = magnitude & ((1 << self.mbits) - 1)
        top_field = (1 << self.ebits) - 1
        top_mant = (1 << self.mbits) - 1
        match self.infnan:
            case InfNaN.IEEE if field == top_field:
                return math.nan if mant else (-math.inf if negative else math.inf)
            case InfNaN.FN if field == top_field and mant == top_mant:
                return math.nan
            case InfNaN.FNUZ | InfNaN.INUZ if code == sign_bit:
                return math.nan
            case InfNaN.INUZ if magnitude == sign_bit - 1:
                return -math.inf if negative else math.inf
            case _:
                pass
        if field == 0:
            value = math.ldexp(mant, 1 - self.bias - self.mbits)
        else:
            value = math.ldexp((1 << self.mbits) + mant, field - self.bias - self.mbits)
        return -value if negative else value

    @functools.cached_property
    def _max_code(self) -> int:
        """The code of the largest finite value."""
        match self.kind:
            case Kind.INT:
                return (1 << (self.bits - 1)) - 1
            case Kind.UINT:
                return (1 << self.bits) - 1
            case Kind.EXPONENT:
                return (1 << self.ebits) - 2
            case Kind.FLOAT:
                return _float_max_code(self.ebits, self.mbits, self.infnan)
            case _:
                raise AssertionError(self.kind)

    def values(self) -> list[float]:
        """Every finite representable value, sorted ascending (-0 and +0 counted once).

        Raises:
            ValueError: the format has more than 16 bits.
        """
        if self.bits > 16:
            raise ValueError(f"{self.name}: values() lists formats of at most 16 bits")
        found = {self.decode(c) for c in range(1 << self.bits)}
        return sorted(v for v in found if math.isfinite(v))

    # -- range ----------------------------------------------------------------------------
    @property
    def maxfloat(self) -> float:
        """The largest finite value (for ints: the largest symmetric magnitude 2^(N-1) - 1)."""
        return self.decode(self._max_code)

    @property
    def float32_max(self) -> float:
        """The largest finite value that is also a float32 number (floats; others: maxfloat).

        Float scales and zero points are used as float32 numbers, so they saturate here, not
        at maxfloat (architecture decision 21): equal to maxfloat but for formats whose top
        values leave float32 (over 2^128, or over 24 significant bits, such as e9m14, e5m26).
        """
        top = self.maxfloat
        if not self.is_float:
            return top
        f32_max = math.ldexp(2.0 - 2.0**-23, 127)
        if top > f32_max:  # the largest grid value at or below float32's largest
            e = max(math.frexp(f32_max)[1] - 1, self.emin) - self.mbits
            top = math.floor(math.ldexp(f32_max, -e)) * 2.0**e
        # 24 significant bits, steps of at least 2^-149: a grid finer there keeps the result
        e = max(math.frexp(top)[1] - 1 - 23, -149)
        return math.floor(math.ldexp(top, -e)) * 2.0**e

    @property
    def minint(self) -> int:
        """The smallest integer code value (-2^(N-1) for int, 0 for uint)."""
        return -(1 << (self.bits - 1)) if self.is_int else 0

    @property
    def emax(self) -> int:
        """floor(log2(maxfloat)): the exponent of the top binade with a finite value."""
        return math.frexp(self.maxfloat)[1] - 1

    @property
    def emin(self) -> int:
        """The exponent of the smallest normal value (0 for ints: the step is always 1)."""
        match self.kind:
            case Kind.FLOAT:
                return 1 - self.bias
            case Kind.EXPONENT:
                return -self.bias
            case _:
                return 0

    @property
    def midmax(self) -> float:
        """Maxfloat plus half an ulp of the top binade: where rounding starts to clip."""
        half_ulp = math.ldexp(1.0, self.emax - self.mbits - 1) if self.is_float else 0.5
        return self.maxfloat + half_ulp

    @property
    def smallest_normal(self) -> float:
        """2^emin (1 for ints)."""
        return math.ldexp(1.0, self.emin)

    @property
    def smallest_subnormal(self) -> float:
        """The smallest positive value."""
        if self.kind is Kind.FLOAT:
            return math.ldexp(1.0, self.emin - self.mbits)
        return self.smallest_normal

    @property
    def eps(self) -> float:
        """The distance from 1 to the next value (ints and exponents: 1)."""
        return math.ldexp(1.0, -self.mbits) if self.kind is Kind.FLOAT else 1.0

    @property
    def step_shift(self) -> int:
        """Element grid step is 2^(max(floor(log2|x|), emin) - step_shift); ints use 2^0."""
        return self.mbits if self.kind is Kind.FLOAT else 0


def _build(code: str, **fields: object) -> NumberSpec:
    """Construct a parsed float or exponent spec; a limit error names the code as given."""
    try:
        return NumberSpec(**fields)  # type: ignore[arg-type]
    except ValueError as err:
        raise ValueError(f"{code!r}: {str(err).split(': ', 1)[-1]}") from None


def _parse(code: str) -> NumberSpec:
    text = limits.normalize(code)
    if text.startswith("torch."):
        text = text[len("torch.") :]
    text = _TORCH_NAMES.get(text, text)
    if m := _FLOAT_RE.fullmatch(text):
        ebits = limits.digits(m[1], "the exponent width", code)
        mbits = limits.digits(m[2], "the mantissa width", code)
        if ebits < 1:
            raise ValueError(f"{code!r}: a float needs at least 1 exponent bit (eXmY with X >= 1)")
        if 1 + ebits + mbits > limits.MAX_NUMBER_BITS:
            raise ValueError(f"{code!r}: at most 64 bits are supported")
        exponent_type = mbits == 0 and ebits >= 5 and m[4] in (None, "fnu")
        if ebits > limits.MAX_FLOAT_EXPONENT_BITS and not exponent_type:
            raise ValueError(
                f"{code!r}: at most {limits.MAX_FLOAT_EXPONENT_BITS} exponent bits are "
                f"supported (eXmY with X <= {limits.MAX_FLOAT_EXPONENT_BITS}), got {ebits}"
            )
        bias = limits.digits(m[3], "the bias", code) if m[3] is not None else 2 ** (ebits - 1) - 1
        if mbits == 0 and ebits >= 5 and m[4] in ("fn", "fnuz", "ieee"):
            raise ValueError(
                f"{code!r}: e{ebits}m0 is the exponent (scale) type and takes no suffix; "
                f"write e{ebits}m0 (only 'inuz', P3109 binary8p1, makes a mantissa-less float)"
            )
        if exponent_type:
            # Bare eXm0 (X >= 5) is an exponent type; with inuz it is a float (binary8p1).
            return _build(code, kind=Kind.EXPONENT, ebits=ebits, mbits=0, bias=bias)
        if m[4] == "fnu":
            raise ValueError(f"{code!r}: 'fnu' is only for exponent types such as e8m0fnu")
        infnan = InfNaN(m[4]) if m[4] else _bare_infnan(ebits, 1 + ebits + mbits)
        return _build(code, kind=Kind.FLOAT, ebits=ebits, mbits=mbits, bias=bias, infnan=infnan)
    if m := _INT_RE.fullmatch(text):
        unsigned, bits = m[1] == "u", limits.digits(m[2], "the width", code)
        low = 1 if unsigned else 2
        if not low <= bits <= 32:
            raise ValueError(
                f"{code!r}: {'uint' if unsigned else 'int'}N needs {low} <= N <= 32, got {bits}"
            )
        if unsigned:
            return NumberSpec(kind=Kind.UINT, ebits=0, mbits=bits, bias=0)
        return NumberSpec(kind=Kind.INT, ebits=0, mbits=bits - 1, bias=0)
    if m := _P3109_RE.fullmatch(text):
        precision = limits.digits(m[1], "the precision", code)
        if not 1 <= precision <= 7:
            raise ValueError(f"{code!r}: binary8pP needs 1 <= P <= 7, got {precision}")
        return NumberSpec(
            kind=Kind.FLOAT,
            ebits=8 - precision,
            mbits=precision - 1,
            bias=2 ** (7 - precision),
            infnan=InfNaN.INUZ,
        )
    raise ValueError(f"{code!r} is not a number format: {_FORMS}")


@functools.lru_cache(maxsize=512)
def number_spec(code: str) -> NumberSpec:
    """Parse a number code that is not a codebook (see the module doc for the forms).

    Raises:
        ValueError: the code is malformed; the message names the part and the expected form.
    """
    if not isinstance(code, str):
        raise TypeError(f"a number code must be a str, got {type(code).__name__}")
    return _parse(code)
