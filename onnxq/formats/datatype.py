"""DataType = NumberSpec + ScaleSpec, and the registry of named presets.

A data type code is the element code followed by the scale code: ``e2m1fnuz_e8m0_t32``,
``cb41fi_e2m2fnuz_e8m0_t32``, or a preset name (``mxfp4``). ``str(dt)`` is the canonical code.
"""

from __future__ import annotations

import dataclasses
import re

from onnxq.formats import limits
from onnxq.formats.codebook import Codebook
from onnxq.formats.number import NumberSpec, number_spec
from onnxq.formats.scale import ScaleSpec

__all__ = ["DataType", "datatype", "datatypes", "register"]


def _number(code: str) -> NumberSpec:
    return Codebook.parse(code) if limits.normalize(code).startswith("cb") else number_spec(code)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataType:
    """An element format and how it is scaled. Equality ignores the preset name."""

    nspec: NumberSpec
    sspec: ScaleSpec | None = None
    preset: str | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        n, s = self.nspec, self.sspec
        where = f"data type {self.code!r}"
        if not n.is_codebook and n.bits > limits.MAX_ELEMENT_BITS:
            raise ValueError(
                f"{where}: element codes have at most {limits.MAX_ELEMENT_BITS} bits; "
                f"{n} has {n.bits}"
            )
        if s is None:
            if not n.is_float:
                raise ValueError(
                    f"{where}: only float formats can be unscaled; add a scale such as "
                    f"{n.name}_float32 or {n.name}_e8m0_t32"
                )
            return
        if n.is_exponent:
            raise ValueError(f"{where}: an exponent type ({n}) is a scale, not an element format")
        if n.is_uint and s.zero is None:
            raise ValueError(
                f"{where}: uint data is asymmetric and needs a zero point "
                f"({n.name}_float32_{n.name} or {n.name}_float16_int8_t32)"
            )
        if s.zero is not None and not n.is_uint:
            raise ValueError(f"{where}: a zero point is only for uint data, not {n}")
        if s.zero is not None and (s.zero.is_int or s.zero.is_uint):
            low, high = s.zero.minint, s.zero.maxfloat
            if low > 0 or high < n.maxfloat:
                raise ValueError(
                    f"{where}: zero point {s.zero} cannot hold every {n} code 0..{n.maxfloat:g}; "
                    f"use a wider zero type"
                )
        if s.zero is not None and s.scale.is_exponent:
            raise ValueError(f"{where}: zero points need a float scale, not {s.scale}")
        grid = n.compute if n.is_codebook else n
        if s.scale.is_exponent and grid.is_float:
            # The grid steps of the smallest values a float32 tile reaches must be normal
            # float64 numbers, like every step the engines round to.
            reach = limits.FLOAT32_TILE_REACH
            low = max(grid.emax - reach, grid.emin)
            if low - grid.mbits < limits.MIN_SCALE_STEP_EXPONENT:
                top_field = grid.emax + grid.bias
                most = -limits.MIN_SCALE_STEP_EXPONENT - grid.mbits + max(1, top_field - reach)
                raise ValueError(
                    f"{where}: under an exponent scale, {grid} rounds values down to 2^{low} "
                    f"on steps of 2^{low - grid.mbits}, below float64's normal range "
                    f"(2^{limits.MIN_SCALE_STEP_EXPONENT}); use a bias of at most {most}"
                )
        if s.scale.is_exponent:
            frac = 0 if n.is_codebook else n.int_fraction_bits
            if -s.scale.bias - frac < limits.MIN_SCALE_STEP_EXPONENT:
                raise ValueError(
                    f"{where}: exponent scale {s.scale} gives {n} grid steps down to "
                    f"2^{-s.scale.bias - frac}, below float64's normal range "
                    f"(2^{limits.MIN_SCALE_STEP_EXPONENT}); use a bias of at most "
                    f"{-limits.MIN_SCALE_STEP_EXPONENT - frac}"
                )
        _sub_rows, sub_cols = s.subtile
        if sub_cols:
            if n.is_codebook:
                pass  # the mapping is chosen per subtile
            elif not (n.is_int and s.scale.is_exponent):
                raise ValueError(
                    f"{where}: a subtile is a codebook's mapping unit or the shared microexponent "
                    f"of int elements with an exponent scale (mx6 = int5_e8m0_t16s2); "
                    f"{n} with {s.scale} has neither"
                )
        if n.is_codebook and not s.scale.is_exponent:
            raise ValueError(f"{where}: codebooks need an exponent scale such as e8m0")

    # -- identity -------------------------------------------------------------------------
    @property
    def code(self) -> str:
        """The canonical code: element code, then the scale code."""
        return self.nspec.name if self.sspec is None else f"{self.nspec.name}_{self.sspec.name}"

    @property
    def name(self) -> str:
        """The preset name when built from one, else the canonical code."""
        return self.preset or self.code

    def __str__(self) -> str:
        return self.name

    # -- size -----------------------------------------------------------------------------
    @property
    def meta_bits(self) -> int:
        """Bits of one meta code: a codebook's selector width, else 1 (an MX microexponent)."""
        return self.nspec.meta_bits if self.nspec.is_codebook else 1

    @property
    def bits_per_value(self) -> float:
        """Storage bits per element with scales, zero points, meta and masks amortised.

        Tensor-wide scalars (tensor scales, channel scales) count as zero: they do not grow
        with the tile count.
        """
        n, s = self.nspec, self.sspec
        if s is None:
            return float(n.bits)
        sparse_n, sparse_m, _ = s.sparsity
        density = sparse_n / sparse_m if sparse_m else 1.0
        bits = n.bits * density + (1.0 if sparse_m else 0.0)
        tile = 1
        for t in s.tiles:
            tile *= t.size  # 0 for a channel: amortised over the whole axis
        if tile and s.tiles:  # a tile's size counts element positions, kept or pruned
            bits += s.scale.bits / tile
            if s.zero is not None:
                bits += s.zero.bits / tile
        sub_rows, sub_cols = s.subtile
        if sub_cols:
            bits += self.meta_bits / (sub_rows * sub_cols)
        elif n.is_codebook and tile:
            bits += self.meta_bits / tile
        return bits

    @classmethod
    def parse(cls, code: str) -> DataType:
        """Parse a data type code (not a preset name).

        Raises:
            ValueError: malformed code, naming the part and the expected form.
        """
        text = limits.normalize(code)
        segments = text.split("_")
        if text.startswith("cb"):
            if len(segments) < 2:
                raise ValueError(
                    f"{code!r}: a codebook data type is cb<I><M>[desc]_<compute>[_label]_<scale>"
                )
            take = 2
            if len(segments) > 2 and not _looks_like_scale_start(segments[2]):
                take = 3  # a label
            nspec: NumberSpec = _number("_".join(segments[:take]))
        else:
            # Torch names hold underscores (float8_e4m3fnuz, float4_e2m1fn_x2): take the longest
            # run of leading segments that is a number code.
            take = next(
                (
                    k
                    for k in range(min(3, len(segments)), 1, -1)
                    if _is_number("_".join(segments[:k]))
                ),
                1,
            )
            nspec = _number("_".join(segments[:take]))
        rest = "_".join(segments[take:])
        sspec = ScaleSpec.parse(rest, nspec if not nspec.is_codebook else None) if rest else None
        return cls(nspec=nspec, sspec=sspec)


def _is_number(code: str) -> bool:
    try:
        number_spec(code)
    except ValueError:
        return False
    return True


def _looks_like_scale_start(segment: str) -> bool:
    return segment.startswith("t") or _is_number(segment)


# -- the registry -------------------------------------------------------------------------
_PRESETS: dict[str, DataType] = {}
_PRESET_RE = re.compile(r"[a-z][a-z0-9_\-]*")


def register(name: str, dtype: DataType | str, *, description: str = "") -> DataType:
    """Register a named data type. Re-registering the same meaning is a no-op.

    Raises:
        ValueError: the name is taken by a different data type (no silent aliasing), or is
            not a lowercase identifier.
    """
    key = limits.normalize(name)
    if not _PRESET_RE.fullmatch(key):
        raise ValueError(f"preset name {name!r}: expected a lowercase identifier (mxfp4, my_fp6)")
    dt = dtype if isinstance(dtype, DataType) else DataType.parse(dtype)
    existing = _PRESETS.get(key)
    if existing is not None and existing != dt:
        raise ValueError(
            f"preset {key!r} already means {existing.code}; refusing to redefine it as {dt.code}"
        )
    named = dataclasses.replace(dt, preset=key)
    _PRESETS[key] = named
    return named


def datatype(nspec: NumberSpec | str, sspec: ScaleSpec | str | None = None) -> DataType:
    """Build a DataType from a preset name, a data type code, or a number and a scale spec.

    Example:
        >>> datatype("mxfp4").code
        'e2m1fnuz_e8m0_t32'
        >>> datatype("e4m3fn", "e8m0_t32") == datatype("mxfp8e4")
        True

    Raises:
        ValueError: unknown preset or malformed code, naming the part and the expected form.
    """
    if isinstance(nspec, str) and sspec is None:
        key = limits.normalize(nspec)
        if key in _PRESETS:
            return _PRESETS[key]
        try:
            return DataType.parse(nspec)
        except ValueError as err:
            if "_" in key or key.startswith(
                ("e", "int", "uint", "float", "bfloat", "binary", "cb")
            ):
                raise
            raise ValueError(
                f"{nspec!r} is neither a preset ({', '.join(sorted(_PRESETS))}) "
                f"nor a data type code: {err}"
            ) from None
    if not isinstance(nspec, (str, NumberSpec)):
        raise TypeError(
            f"datatype expects a preset name, a code or a NumberSpec, got {type(nspec).__name__}"
        )
    if sspec is not None and not isinstance(sspec, (str, ScaleSpec)):
        raise TypeError(f"datatype expects a scale code or a ScaleSpec, got {type(sspec).__name__}")
    n = _number(nspec) if isinstance(nspec, str) else nspec
    if isinstance(sspec, str):
        s: ScaleSpec | None = ScaleSpec.parse(sspec, n if not n.is_codebook else None)
    else:
        s = sspec
    return DataType(nspec=n, sspec=s)


def datatypes() -> dict[str, DataType]:
    """Every registered preset by name (each has ``code`` and ``bits_per_value``)."""
    return dict(sorted(_PRESETS.items()))


# Presets: OCP MX v1.0 (block 32, E8M0), BFP and shared-microexponent MX (docs/architecture.md,
# decisions 10-11),
# NVFP4 (E2M1, E4M3 scale per 16, FP32 tensor scale) and common tensor/channel types.
_BUILTIN = {
    "mxfp8e5": "e5m2_e8m0_t32",
    "mxfp8e4": "e4m3fn_e8m0_t32",
    "mxfp8": "e4m3fn_e8m0_t32",
    "mxfp6e3": "e3m2fnuz_e8m0_t32",
    "mxfp6e2": "e2m3fnuz_e8m0_t32",
    "mxfp6": "e2m3fnuz_e8m0_t32",
    "mxfp4e2": "e2m1fnuz_e8m0_t32",
    "mxfp4": "e2m1fnuz_e8m0_t32",
    "mxint8": "int8_e8m0_t32",
    "mxint4": "int4_e8m0_t32",
    "bfp16": "int8_e8m0_t16",
    "bfp8": "int4_e8m0_t32",
    "mx9": "int8_e8m0_t16s2",
    "mx6": "int5_e8m0_t16s2",
    "mx4": "int3_e8m0_t16s2",
    "nvfp4": "e2m1fnuz_e4m3fn_float32_t16",
    "int8_tensor": "int8_float32",
    "int8_channel": "int8_float32_t0",
    "int4_channel": "int4_float32_t0",
    "uint8_tensor": "uint8_float32_uint8",
    "uint8_channel": "uint8_float32_uint8_t0",
    "uint4_block32": "uint4_float16_uint8_t32",
    "fp8e4_tensor": "e4m3fn_float32",
    "fp8e4_channel": "e4m3fn_float32_t0",
    "fp8e5_tensor": "e5m2_float32",
}
for _name, _code in _BUILTIN.items():
    register(_name, _code)
