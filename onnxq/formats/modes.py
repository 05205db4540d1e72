"""Closed choices of the cast contract: round, scale, cast and compute modes, NaN policy.

Each member's comment gives its rule; every backend derives its behaviour from these values
(the modes document; docs/architecture.md, decisions 3-5, 12-13).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from enum import Enum
from typing import Any

__all__ = [
    "Backend",
    "CastMode",
    "Defaults",
    "NanPolicy",
    "RoundMode",
    "ScaleMode",
    "current_defaults",
    "defaults",
]


class _Choice(str, Enum):
    """A string-valued enum whose parse error lists the valid values."""

    @classmethod
    def parse(cls, value: str | _Choice) -> Any:
        """Return the member named by ``value`` (a member or its string).

        Raises:
            ValueError: ``value`` names no member; the message lists the valid ones.
        """
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            valid = ", ".join(repr(m.value) for m in cls)
            raise ValueError(f"unknown {cls._label()} {value!r}: expected one of {valid}") from None

    @classmethod
    def _label(cls) -> str:
        return cls.__name__


class RoundMode(_Choice):
    """How a value between two grid points is rounded (the modes document, "Rounding Mode")."""

    EVEN = "even"  # nearest, ties to the even grid point (IEEE default)
    AWAY = "away"  # nearest, ties away from zero
    ZERO = "zero"  # nearest, ties toward zero (not truncation; architecture decision 4)
    # Up with probability equal to the distance from the lower grid point. The random bits are
    # `stochastic_bits(seed, flat_index)`: identical on every backend for the same seed.
    STOCHASTIC = "stochastic"

    @classmethod
    def _label(cls) -> str:
        return "round_mode"


class ScaleMode(_Choice):
    """How a tile's scale is chosen (architecture decision 3).

    The rules pick a power-of-two exponent from the tile's absmax; ``search`` picks among a
    few candidate scales by the tile's error.

    `maxexp` = floor(log2(absmax)) from the float bits; the stored exponent is
    `maxexp' - emax_element` where maxexp' is:
    """

    FLOOR = "floor"  # maxexp (OCP recommended)
    CEIL = "ceil"  # ceil(log2(absmax)): maxexp + 1 unless absmax is a power of two
    MIDMAX = "midmax"  # maxexp + (absmax / 2^maxexp > midmax / 2^emax)
    OPTION3 = "option3"  # floor(log2(absmax rounded half-even to mbits+1 significant bits))
    TOPBINADE = "topbinade"  # maxexp + (absmax / 2^maxexp > maxfloat / 2^emax)
    # 2^ceil(log2(absmax / maxfloat)) (cuBLAS / torchao RCEIL). Computed exactly it equals
    # topbinade; kept as its own name because users look for it.
    RCEIL = "rceil"
    # torchao EVEN: absmax rounded half-away to mbits+1 significant bits, then floor(log2).
    EVEN = "even"
    # Not a rule of absmax: each tile tries a few scales and keeps the one whose decoded tile
    # is nearest the input (least squared error; onnxq/cast/scale_search.py, docs/formats.md
    # "Scale modes"). For stored weights, whose scales the quantizer chooses once; float
    # scales (NVFP4) are searched too. Activations are quantized at run time by a rule.
    SEARCH = "search"

    @classmethod
    def _label(cls) -> str:
        return "scale_mode"


class CastMode(_Choice):
    """What `cast` returns (the modes document, "Cast Mode")."""

    VIRTUAL = "virtual"  # fake quantization: same shape and float dtype as the input
    ACTUAL = "actual"  # QTensor of unpacked codes (one unsigned integer per element)
    COMPRESS = "compress"  # QTensor with codes, meta and masks bit-packed (architecture "Packing")

    @classmethod
    def _label(cls) -> str:
        return "mode"


class NanPolicy(_Choice):
    """Treatment of NaN and Inf inputs (docs/architecture.md, decision 5)."""

    # NaN/Inf are left out of the tile maximum; NaN stays NaN; Inf saturates to the largest
    # finite value (Inf only for unscaled casts to a format that has Inf). Formats with no NaN
    # code (ints, codebooks, uint with zero point) make a tile holding NaN NaN through its scale.
    ELEMENT = "element"
    BLOCK = "block"  # any NaN/Inf makes the tile's scale NaN and the whole tile NaN (OCP strict)

    @classmethod
    def _label(cls) -> str:
        return "nan_policy"


class Backend(_Choice):
    """Which engine runs a cast (docs/architecture.md, decision 12)."""

    AUTO = "auto"  # triton for GPU tensors, native when built, else reference
    REFERENCE = "reference"  # numpy: the oracle
    NATIVE = "native"  # C++ kernels in ops/
    TRITON = "triton"  # GPU

    @classmethod
    def _label(cls) -> str:
        return "backend"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Defaults:
    """Keyword defaults of `cast` (the modes document's `initialize()`)."""

    mode: CastMode = CastMode.VIRTUAL
    round_mode: RoundMode = RoundMode.EVEN
    scale_mode: ScaleMode = ScaleMode.FLOOR
    nan_policy: NanPolicy = NanPolicy.ELEMENT
    seed: int = 0
    backend: Backend = Backend.AUTO


_PARSERS = {
    "mode": CastMode.parse,
    "round_mode": RoundMode.parse,
    "scale_mode": ScaleMode.parse,
    "nan_policy": NanPolicy.parse,
    "backend": Backend.parse,
    "seed": int,
}
# A context variable: each thread and each asyncio task sees the defaults of its own blocks.
_INITIAL = Defaults()  # frozen: safe to share as the context variable's default
_current: contextvars.ContextVar[Defaults] = contextvars.ContextVar(
    "onnxq_defaults", default=_INITIAL
)


def current_defaults() -> Defaults:
    """Return the defaults in force (changed only inside a `defaults` block)."""
    return _current.get()


@contextlib.contextmanager
def defaults(**overrides: Any) -> Iterator[Defaults]:
    """Set cast defaults for a block of code; the previous ones return even if it raises.

    Example:
        >>> import onnxq
        >>> with onnxq.defaults(round_mode="stochastic", seed=7) as d:
        ...     d.round_mode.value
        'stochastic'
        >>> onnxq.current_defaults().round_mode.value
        'even'

    Raises:
        ValueError: an unknown key or value.
    """
    unknown = sorted(set(overrides) - set(_PARSERS))
    if unknown:
        raise ValueError(f"unknown default {unknown[0]!r}: expected one of {sorted(_PARSERS)}")
    parsed = {k: _PARSERS[k](v) for k, v in overrides.items()}
    token = _current.set(dataclasses.replace(_current.get(), **parsed))
    try:
        yield _current.get()
    finally:
        _current.reset(token)
