"""Codebook: a lookup-table number format (generic or implicit), pure Python.

A codebook encodes each element as an ``index_bits``-wide index into one of 2^meta_bits mappings
(lookup tables) of compute values; the mapping is chosen per tile or subtile by ``meta_bits`` of
metadata. Codes (case-insensitive)::

    cb<index_bits><meta_bits>[<desc>]_<compute>[_<label>]

``desc`` empty gives a *generic* codebook; `Codebook.add_mappings` returns it filled.
Otherwise ``desc`` is a sequence of clauses that generate the mappings (an *implicit* codebook):

- ``f[<offsets>][e[<eoffsets>]]``: the positive values of fp<index_bits> (e2m0/e2m1/e2m2, bias 1);
- ``i[<offsets>][e[<eoffsets>]]``: the positive values k * 2^(4 - index_bits) of int<index_bits>;
- ``p<interval>[<offsets>]``: progressive gaps interval, 2*interval, ... on the number line;
- ``s<interval>[<offsets>]``: static gaps of ``interval``.

The compute type is seen as a number line: the non-negative value with code c has index
2^(bits-1) + c, and the top index is 2^bits - 1. A pattern is a set of 2^(index_bits-1) - 1
positive indices; an f/i pattern is first shifted so that its top index is the top of the number
line, then every offset digit lowers it by that many indices (no digit: the offset that gives the
natural values back). ``e`` divides each pattern by 2^eoffset (bare ``e`` = ``e01``). Each
mapping is 0 followed by the pattern's values, mirrored for negatives.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Iterable, Sequence

from onnxq.formats import limits
from onnxq.formats.number import InfNaN, Kind, NumberSpec, number_spec

__all__ = ["Codebook"]

_FORM = (
    "expected cb<index_bits><meta_bits>[f|i[offsets][e[eoffsets]] | p|s<interval>[offsets]]..."
    "_<compute>[_<label>]"
)
_HEAD_RE = re.compile(r"cb([0-9])([0-9])([a-z0-9]*)")
_LABEL_RE = re.compile(r"[a-z0-9]+")
# One clause of a description: f/i with offsets and an optional e modifier, or p/s with digits.
_FI_RE = re.compile(r"([fi])([0-9]*)(?:(e)([0-9]*))?")
_PS_RE = re.compile(r"([ps])([0-9]*)")


@dataclasses.dataclass(frozen=True)
class _Clause:
    """One parsed clause of an implicit description."""

    text: str  # as written, for error messages
    letter: str  # f, i, p or s
    offsets: tuple[int, ...] | None  # None: the f/i default offset
    eoffsets: tuple[int, ...] = (0,)  # f/i only
    interval: int = 1  # p/s only

    @property
    def count(self) -> int:
        """Mappings this clause generates."""
        return (1 if self.offsets is None else len(self.offsets)) * len(self.eoffsets)


def _parse_desc(desc: str, code: str) -> list[_Clause]:
    """Split an implicit description into clauses (see the module doc)."""
    clauses: list[_Clause] = []
    pos = 0
    while pos < len(desc):
        if m := _FI_RE.match(desc, pos):
            letter, digits, has_e, edigits = m[1], m[2], m[3], m[4]
            offsets = tuple(int(d) for d in digits) if digits else None
            eoffsets: tuple[int, ...] = (0,)
            if has_e:
                eoffsets = tuple(int(d) for d in edigits) if edigits else (0, 1)
                if bad := [e for e in eoffsets if e > 3]:
                    raise ValueError(
                        f"{code!r}: eoffset {bad[0]} in clause {m[0]!r} is outside 0..3; {_FORM}"
                    )
            clauses.append(_Clause(m[0], letter, offsets, eoffsets))
        elif m := _PS_RE.match(desc, pos):
            letter, digits = m[1], m[2]
            interval = int(digits[0]) if digits else 1
            if interval == 0:
                raise ValueError(f"{code!r}: interval 0 in clause {m[0]!r} must be 1..9; {_FORM}")
            offsets = tuple(int(d) for d in digits[1:]) or (0,)
            clauses.append(_Clause(m[0], letter, offsets, interval=interval))
        elif desc[pos] == "e":
            after = f" (it follows {clauses[-1].text!r})" if clauses else ""
            raise ValueError(
                f"{code!r}: the 'e' modifier must follow an f or i clause{after}; {_FORM}"
            )
        else:
            raise ValueError(
                f"{code!r}: unexpected {desc[pos:]!r} in description {desc!r}; "
                f"clauses start with f, i, p or s; {_FORM}"
            )
        pos = m.end()
    return clauses


def _code_of(spec: NumberSpec, value: float) -> int | None:
    """Return the code of value >= 0 in float ``spec``, or None if not exact and finite."""
    if not math.isfinite(value) or value < 0:
        return None
    if value == 0:
        return 0
    exp = math.frexp(value)[1] - 1  # value = 1.f * 2^exp
    field = exp + spec.bias
    if field >= 1:
        scaled = math.ldexp(value, spec.mbits - exp)  # 2^mbits + mantissa
        base = 1 << spec.mbits
    else:  # subnormal: value = mantissa * 2^(1 - bias - mbits)
        field = 0
        scaled = math.ldexp(value, spec.mbits - (1 - spec.bias))
        base = 0
    if scaled != math.floor(scaled) or field >= 1 << spec.ebits:
        return None
    code = (field << spec.mbits) | (int(scaled) - base)
    # The decode check rejects codes that are Inf/NaN in this format (ieee, fn, inuz).
    if code >= 1 << (spec.bits - 1) or spec.decode(code) != value:
        return None
    return code


@dataclasses.dataclass(frozen=True, kw_only=True)
class Codebook(NumberSpec):
    """A lookup-table format: 2^meta_bits mappings of 2^index_bits compute values.

    Build one with `Codebook.parse` (or ``onnxq.number("cb...")``). The NumberSpec fields
    (ebits, mbits, bias, infnan) are those of ``compute``; ``kind`` is `Kind.CODEBOOK`.
    Implicit codebooks (``desc`` not empty) generate their mappings on construction; generic
    ones start empty and `add_mappings` returns a filled copy. A Codebook is an immutable value:
    equality and hash cover the mappings, so caches keyed on it tell generic ones apart.
    """

    kind: Kind = dataclasses.field(default=Kind.CODEBOOK, init=False)
    ebits: int = dataclasses.field(default=0, init=False)
    mbits: int = dataclasses.field(default=0, init=False)
    bias: int = dataclasses.field(default=0, init=False)
    infnan: InfNaN | None = dataclasses.field(default=None, init=False)
    index_bits: int
    meta_bits: int
    compute: NumberSpec
    desc: str = ""
    label: str | None = None
    # Magnitudes of each mapping (0.0 first, ascending): generated for implicit codebooks,
    # given (and checked) for generic ones.
    mappings: tuple[tuple[float, ...], ...] = dataclasses.field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not 2 <= self.index_bits <= 8:
            raise ValueError(f"{self._code}: index_bits {self.index_bits} is outside 2..8; {_FORM}")
        if not 0 <= self.meta_bits <= 4:
            raise ValueError(f"{self._code}: meta_bits {self.meta_bits} is outside 0..4; {_FORM}")
        if not isinstance(self.compute, NumberSpec) or not self.compute.is_float:
            raise ValueError(
                f"{self._code}: the compute type must be a float format (eXmY...), "
                f"got {self.compute}; {_FORM}"
            )
        if self.compute.bits > limits.MAX_ELEMENT_BITS:  # the compute code is the element
            raise ValueError(
                f"{self._code}: the compute type has at most {limits.MAX_ELEMENT_BITS} bits, "
                f"got {self.compute.bits}"
            )
        if self.index_bits > self.compute.bits:
            # A symmetric mapping needs 2^(index_bits-1) - 1 distinct positive compute values.
            raise ValueError(
                f"{self._code}: index_bits {self.index_bits} exceeds the {self.compute.bits} "
                f"bits of the compute type {self.compute}"
            )
        if self.label is not None and not _LABEL_RE.fullmatch(self.label):
            raise ValueError(f"{self._code}: label {self.label!r} must be [a-z0-9]+; {_FORM}")
        for name in ("ebits", "mbits", "bias", "infnan"):
            object.__setattr__(self, name, getattr(self.compute, name))
        super().__post_init__()
        if self.desc:
            generated = tuple(self._generate(_parse_desc(self.desc, self._code)))
            if self.mappings and tuple(map(tuple, self.mappings)) != generated:
                raise ValueError(f"{self._code}: an implicit codebook takes no added mappings")
            object.__setattr__(self, "mappings", generated)
        else:
            object.__setattr__(self, "mappings", self._checked(self.mappings, 0))

    @property
    def _code(self) -> str:
        """The code for error messages (works before validation finishes)."""
        label = f"_{self.label}" if self.label else ""
        return repr(f"cb{self.index_bits}{self.meta_bits}{self.desc}_{self.compute}{label}")

    # -- parsing --------------------------------------------------------------------------
    @classmethod
    def parse(cls, code: str) -> Codebook:
        """Parse ``cb<index_bits><meta_bits>[<desc>]_<compute>[_<label>]`` (case-insensitive).

        Args:
            code: the codebook code; ``desc`` empty gives a generic codebook.

        Returns:
            A new Codebook; implicit ones have their mappings already generated.

        Raises:
            ValueError: the code is malformed, or a mapping it describes cannot be represented
                in the compute type; the message names the bad part.
            TypeError: ``code`` is not a string.

        """
        if not isinstance(code, str):
            raise TypeError(f"a codebook code must be a str, got {type(code).__name__}")
        text = limits.normalize(code)
        parts = text.split("_")
        if not text.startswith("cb"):
            raise ValueError(f"{code!r}: a codebook code starts with 'cb'; {_FORM}")
        if len(parts) not in (2, 3):
            raise ValueError(
                f"{code!r}: expected 2 or 3 parts separated by '_' (description, compute type, "
                f"optional label), got {len(parts)}; {_FORM}"
            )
        head = _HEAD_RE.fullmatch(parts[0])
        if head is None:
            raise ValueError(
                f"{code!r}: {parts[0]!r} must be cb, then single digits index_bits and "
                f"meta_bits, then the description; {_FORM}"
            )
        try:
            compute = number_spec(parts[1])
        except ValueError as exc:
            raise ValueError(f"{code!r}: bad compute type {parts[1]!r}: {exc}") from None
        if len(parts) == 3 and not _LABEL_RE.fullmatch(parts[2]):
            raise ValueError(f"{code!r}: label {parts[2]!r} must be [a-z0-9]+; {_FORM}")
        return cls(
            index_bits=int(head[1]),
            meta_bits=int(head[2]),
            compute=compute,
            desc=head[3],
            label=parts[2] if len(parts) == 3 else None,
        )

    # -- implicit mappings ----------------------------------------------------------------
    def _generate(self, clauses: list[_Clause]) -> list[tuple[float, ...]]:
        """Generate the mappings of an implicit description, in clause order."""
        for clause in clauses:
            if clause.letter in "fi" and not 3 <= self.index_bits <= 5:
                raise ValueError(
                    f"{self._code}: clause {clause.text!r} needs 3..5 index bits "
                    f"(fp3/fp4/fp5, int3/int4/int5), got {self.index_bits}"
                )
        given = sum(c.count for c in clauses)
        if given != self.num_mappings:
            raise ValueError(
                f"{self._code}: the description {self.desc!r} gives {given} mapping(s), "
                f"meta_bits {self.meta_bits} asks for {self.num_mappings}"
            )
        mappings: list[tuple[float, ...]] = []
        for clause in clauses:
            if clause.letter in "fi":
                mappings.extend(self._fi_mappings(clause))
            else:
                mappings.extend(self._ps_mappings(clause))
        return mappings

    @property
    def _zero_index(self) -> int:
        return 1 << (self.compute.bits - 1)

    @property
    def _maxidx(self) -> int:
        return (1 << self.compute.bits) - 1

    def _natural_values(self, letter: str) -> list[float]:
        """Return the positive base values of the f or i pattern for this index width."""
        npos = (1 << (self.index_bits - 1)) - 1
        if letter == "f":
            # fp<index_bits> with 2 exponent bits and bias 1: the spec's "scaled to (-2, 2)"
            # values times 4; fnuz so every positive code is finite.
            fp = NumberSpec(
                kind=Kind.FLOAT, ebits=2, mbits=self.index_bits - 3, bias=1, infnan=InfNaN.FNUZ
            )
            return [fp.decode(c) for c in range(1, npos + 1)]
        # int<N> = k * 2^(4 - N): the spec's int4/int5 rows (k / 2^(N-2)) times 4. Its int3 row
        # (0.25, 0.5, 1.0) breaks that rule (it is e2m0); we follow the rule: 2, 4, 6.
        return [math.ldexp(k, 4 - self.index_bits) for k in range(1, npos + 1)]

    def _values_at(self, clause: str, offset: int, indices: list[int]) -> tuple[float, ...]:
        """Return the magnitudes at number-line ``indices`` (ascending), 0.0 first."""
        values = [0.0]
        for idx in indices:
            if idx <= self._zero_index or idx > self._maxidx:
                raise ValueError(
                    f"{self._code}: clause {clause!r} offset {offset} reaches index {idx}, "
                    f"outside the positive indices {self._zero_index + 1}..{self._maxidx} "
                    f"of {self.compute}"
                )
            value = self.compute.decode(idx - self._zero_index)
            if not math.isfinite(value):
                raise ValueError(
                    f"{self._code}: clause {clause!r} offset {offset} lands on index {idx}, "
                    f"which is {value} in {self.compute}"
                )
            values.append(value)
        return tuple(values)

    def _fi_mappings(self, clause: _Clause) -> list[tuple[float, ...]]:
        natural: list[int] = []
        for value in self._natural_values(clause.letter):
            code = _code_of(self.compute, value)
            if code is None:
                raise ValueError(
                    f"{self._code}: clause {clause.text!r}: the pattern value {value} is not "
                    f"representable in {self.compute}"
                )
            natural.append(self._zero_index + code)
        shift = self._maxidx - natural[-1]  # moves the top of the pattern to the top index
        offsets = (shift,) if clause.offsets is None else clause.offsets
        out = []
        for offset in offsets:
            values = self._values_at(clause.text, offset, [i + shift - offset for i in natural])
            for eoff in clause.eoffsets:
                scaled = tuple(math.ldexp(v, -eoff) for v in values)
                for v in scaled:
                    if _code_of(self.compute, v) is None:
                        raise ValueError(
                            f"{self._code}: clause {clause.text!r} offset {offset} eoffset "
                            f"{eoff}: {v} (= {v * 2**eoff} / 2^{eoff}) is not representable "
                            f"in {self.compute}"
                        )
                out.append(scaled)
        return out

    def _ps_mappings(self, clause: _Clause) -> list[tuple[float, ...]]:
        npos = (1 << (self.index_bits - 1)) - 1
        assert clause.offsets is not None
        out = []
        for offset in clause.offsets:
            indices, gap = [], 0
            for i in range(npos):
                indices.append(self._maxidx - offset - gap)
                # Progressive gaps grow by `interval` each step (the spec's snippet); static stay.
                gap += clause.interval * (i + 1 if clause.letter == "p" else 1)
            out.append(self._values_at(clause.text, offset, indices[::-1]))
        return out

    # -- generic mappings -----------------------------------------------------------------
    def add_mappings(self, maplists: Iterable[Sequence[float]]) -> Codebook:
        """A copy of this generic codebook with mappings appended, up to 2^meta_bits in all.

        Args:
            maplists: each mapping is either the 2^(index_bits-1) magnitudes (0.0 first,
                strictly ascending) or the full 2^index_bits values, symmetric: two zeros (any
                sign) and each positive value with its negative, in any order.

        Returns:
            A new Codebook (this one is unchanged: codebooks are immutable values).

        Raises:
            ValueError: the codebook is implicit, there would be more than 2^meta_bits
                mappings, or a mapping is malformed or holds a value that is not exactly
                representable in the compute type (the message names the codebook, the
                mapping number, counted from 0 over the whole codebook, and the value).

        """
        if self.desc:
            raise ValueError(f"{self._code}: an implicit codebook takes no added mappings")
        new = self._checked(maplists, len(self.mappings))
        return dataclasses.replace(self, mappings=(*self.mappings, *new))

    def _checked(
        self, maplists: Iterable[Sequence[float]], first: int
    ) -> tuple[tuple[float, ...], ...]:
        """Validated magnitudes of mappings numbered from ``first`` (see `add_mappings`)."""
        new: list[tuple[float, ...]] = []
        for values in maplists:
            number = first + len(new)
            if number >= self.num_mappings:
                raise ValueError(
                    f"{self._code} mapping {number}: one too many; meta_bits "
                    f"{self.meta_bits} allows {self.num_mappings} mapping(s)"
                )
            new.append(self._check_mapping(number, [float(v) for v in values]))
        return tuple(new)

    def _check_mapping(self, number: int, values: list[float]) -> tuple[float, ...]:
        """Validate one mapping given to add_mappings and return its magnitudes."""
        where = f"{self._code} mapping {number}"
        half = 1 << (self.index_bits - 1)
        for v in values:
            if math.isnan(v) or _code_of(self.compute, abs(v)) is None:
                raise ValueError(f"{where}: {v} is not a finite value of {self.compute}")
        if len(values) == half:
            if values[0] != 0.0:
                raise ValueError(f"{where}: magnitudes must start with 0.0, got {values[0]}")
            if neg := [v for v in values if v < 0]:
                raise ValueError(f"{where}: magnitudes must be non-negative, got {neg[0]}")
            mags = [0.0, *values[1:]]  # -0.0 given first counts as 0.0
            for lo, hi in itertools.pairwise(mags):
                if not hi > lo:
                    raise ValueError(
                        f"{where}: magnitudes must be strictly ascending, got {hi} after {lo}"
                    )
            return tuple(mags)
        if len(values) == 2 * half:
            zeros = sum(1 for v in values if v == 0)
            pos = sorted(v for v in values if v > 0)
            neg = sorted(-v for v in values if v < 0)
            if zeros != 2:
                raise ValueError(
                    f"{where}: a full mapping holds 0 twice (+0 and -0), got {zeros} zero(s)"
                )
            for lo, hi in itertools.pairwise(pos):
                if lo == hi:
                    raise ValueError(f"{where}: value {hi} appears more than once")
            if pos != neg:
                bad = sorted(set(pos).symmetric_difference(neg))[0]
                side = f"{bad} has no {-bad}" if bad in pos else f"{-bad} has no {bad}"
                raise ValueError(f"{where}: not symmetric: {side}")
            return (0.0, *pos)
        raise ValueError(
            f"{where}: expected {half} magnitudes or {2 * half} values, got {len(values)}"
        )

    # -- contents -------------------------------------------------------------------------
    @property
    def num_mappings(self) -> int:
        """2^meta_bits: the number of mappings (lookup tables)."""
        return 1 << self.meta_bits

    @property
    def is_implicit(self) -> bool:
        """True when the description generates the mappings."""
        return bool(self.desc)

    @property
    def is_populated(self) -> bool:
        """True when all 2^meta_bits mappings are present."""
        return len(self.mappings) == self.num_mappings

    def magnitudes(self) -> tuple[tuple[float, ...], ...]:
        """Per mapping, the 2^(index_bits-1) non-negative magnitudes ascending (0.0 first).

        Raises:
            ValueError: a generic codebook is not fully populated.

        """
        if not self.is_populated:
            raise ValueError(
                f"{self._code}: has {len(self.mappings)} of {self.num_mappings} mappings; "
                "fill it with book = book.add_mappings(...)"
            )
        return self.mappings

    def magnitude_codes(self) -> tuple[tuple[int, ...], ...]:
        """Per mapping, the compute-type code of each magnitude (breaks rounding ties: even).

        Raises:
            ValueError: a generic codebook is not fully populated.

        """
        codes = []
        for mags in self.magnitudes():
            row = [_code_of(self.compute, m) for m in mags]
            assert None not in row  # every magnitude was checked when it was added
            codes.append(tuple(c for c in row if c is not None))
        return tuple(codes)

    def table(self) -> tuple[tuple[float, ...], ...]:
        """Return the 2^meta_bits x 2^index_bits lookup table.

        Index code = (sign << (index_bits - 1)) | magnitude_index; the sign-1 zero entry is
        -0.0 when the compute type has a negative zero, else 0.0.

        Raises:
            ValueError: a generic codebook is not fully populated.

        """
        negzero = -0.0 if self.compute.has_negative_zero else 0.0
        rows = []
        for mags in self.magnitudes():
            rows.append((*mags, negzero, *(-m for m in mags[1:])))
        return tuple(rows)

    # -- NumberSpec overrides -------------------------------------------------------------
    @property
    def name(self) -> str:
        """The canonical code ``cb{ib}{mb}{desc}_{compute}[_{label}]``."""
        label = f"_{self.label}" if self.label else ""
        return f"cb{self.index_bits}{self.meta_bits}{self.desc}_{self.compute.name}{label}"

    @property
    def bits(self) -> int:
        """Bits per encoded element: index_bits (the metadata is stored apart)."""
        return self.index_bits

    @property
    def is_codebook(self) -> bool:
        """True."""
        return True

    @property
    def compute_spec(self) -> NumberSpec:
        """The compute type: the format the scale and the element grid are computed in."""
        return self.compute

    @property
    def signed(self) -> bool:
        """True: mappings are symmetric."""
        return True

    @property
    def has_inf(self) -> bool:
        """False: mappings hold finite values only."""
        return False

    def decode(self, code: int, meta: int = 0) -> float:
        """Return the value of index ``code`` in mapping ``meta``.

        Raises:
            ValueError: ``code`` or ``meta`` is out of range, or the codebook is not populated.

        """
        if not 0 <= code < 1 << self.index_bits or not 0 <= meta < self.num_mappings:
            raise ValueError(f"{self._code}: code {code} / meta {meta} is out of range")
        return self.table()[meta][code]

    def values(self) -> list[float]:
        """Every distinct value of all mappings, sorted ascending (0 counted once).

        Raises:
            ValueError: a generic codebook is not fully populated.

        """
        found = {v for mags in self.magnitudes() for m in mags for v in (m, -m)}
        return sorted(found)

    # The tile scale and element grid of a codebook are those of its compute type.
    @property
    def maxfloat(self) -> float:
        """The compute type's largest finite value."""
        return self.compute.maxfloat

    @property
    def emax(self) -> int:
        """The compute type's emax (the scale of a codebook tile is computed with it)."""
        return self.compute.emax

    @property
    def emin(self) -> int:
        """The compute type's emin."""
        return self.compute.emin

    @property
    def midmax(self) -> float:
        """The compute type's midmax."""
        return self.compute.midmax

    @property
    def smallest_normal(self) -> float:
        """The compute type's smallest normal."""
        return self.compute.smallest_normal

    @property
    def smallest_subnormal(self) -> float:
        """The compute type's smallest subnormal."""
        return self.compute.smallest_subnormal

    @property
    def eps(self) -> float:
        """The compute type's eps."""
        return self.compute.eps

    @property
    def step_shift(self) -> int:
        """The compute type's step_shift."""
        return self.compute.step_shift
