"""ScaleSpec / TileSpec: how a tensor is scaled, parsed from a scale code (docs/formats.md).

A scale code is 1-3 number codes followed by 0-2 tile codes, joined by ``_``:

- number codes: one = the scale; two = (scale, zero) for uint data, else (scale, tensor scale);
  three = (scale, zero, tensor scale) (docs/architecture.md, decision 8). Without the data
  type, a second float code is read as a tensor scale and a second int/uint code as a zero
  point.
- tile codes ``t[T][sS][nNmM]``: tile size T (a power of two; ``t`` or ``t0`` = the whole
  axis, a channel scale), subtile S, N:M sparsity. One tile code runs along the cast's axis; two
  are (dim -2, dim -1) after the axis is moved last. No tile code = one scale for the tensor.

``str(spec)`` is the canonical code and ``scale(str(spec)) == spec``.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from onnxq.formats import limits
from onnxq.formats.number import NumberSpec, number_spec

__all__ = ["ScaleSpec", "TileSpec", "scale"]

_TILE_RE = re.compile(r"t([0-9]*)(?:s([0-9]+))?(?:n([0-9]+)m([0-9]+))?")
_TILE_FORM = "expected t[T][sS][nNmM] with T, S, M powers of two (t or t0 = channel)"


def _is_pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class TileSpec:
    """One tile dimension: size (0 = the whole axis), subtile, N:M sparsity."""

    size: int = 0
    subtile: int = 0
    sparse_n: int = 0
    sparse_m: int = 0

    @property
    def is_channel(self) -> bool:
        """True when the tile spans the whole axis."""
        return self.size == 0

    @property
    def is_sparse(self) -> bool:
        """True when N:M sparsity is applied along this dimension."""
        return self.sparse_m > 0

    @property
    def name(self) -> str:
        """The canonical tile code."""
        text = f"t{self.size}"
        if self.subtile:
            text += f"s{self.subtile}"
        if self.sparse_m:
            text += f"n{self.sparse_n}m{self.sparse_m}"
        return text

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text: str, *, context: str = "") -> TileSpec:
        """Parse one tile code.

        Raises:
            ValueError: malformed code or inconsistent sizes, naming the part.
        """
        where = f"{context!r}: " if context else ""
        m = _TILE_RE.fullmatch(text)
        if m is None:
            hint = ""
            if re.fullmatch(r"t[0-9]+m[0-9]+", text):
                hint = (
                    f"; sparsity is written nNmM (t16n2m4) and a subtile sS - "
                    f"did you mean {text.replace('m', 's')!r}?"
                )
            raise ValueError(f"{where}bad tile {text!r}: {_TILE_FORM}{hint}")
        size = limits.digits(m[1], "the tile size", text) if m[1] else 0
        subtile = limits.digits(m[2], "the subtile", text) if m[2] else 0
        n, mm = (
            (limits.digits(m[3], "sparsity N", text), limits.digits(m[4], "sparsity M", text))
            if m[3]
            else (0, 0)
        )
        if size and (size < 2 or not _is_pow2(size) or size > limits.MAX_TILE):
            raise ValueError(
                f"{where}tile size {size} in {text!r} must be a power of two from 2 to "
                f"{limits.MAX_TILE}"
            )
        if subtile:
            if not _is_pow2(subtile):
                raise ValueError(f"{where}subtile {subtile} in {text!r} must be a power of two")
            if size and subtile >= size:
                raise ValueError(
                    f"{where}subtile {subtile} in {text!r} must be smaller than the tile {size}"
                )
            if not size:
                raise ValueError(
                    f"{where}{text!r}: a channel tile (t0) cannot have a subtile; give a size"
                )
        if mm:
            if not _is_pow2(mm) or mm < 2 or mm > limits.MAX_SPARSE_M:
                raise ValueError(
                    f"{where}sparsity block M={mm} in {text!r}: expected 2, 4, 8 or 16"
                )
            if not 1 <= n < mm:
                raise ValueError(f"{where}sparsity N={n} in {text!r}: expected 1 <= N < M={mm}")
            if size and size % mm:
                raise ValueError(f"{where}sparsity block M={mm} does not divide tile {size}")
        return cls(size=size, subtile=subtile, sparse_n=n, sparse_m=mm)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScaleSpec:
    """Scale, zero point and tensor scale number specs plus 0-2 tile specs."""

    scale: NumberSpec
    zero: NumberSpec | None = None
    tenscale: NumberSpec | None = None
    tiles: tuple[TileSpec, ...] = ()

    def __post_init__(self) -> None:
        where = f"scale {self.name!r}"
        for role, spec in (
            ("scale", self.scale),
            ("zero point", self.zero),
            ("tensor scale", self.tenscale),
        ):
            if spec is not None and not spec.is_codebook and spec.bits > limits.MAX_SCALE_BITS:
                raise ValueError(
                    f"{where}: a {role} has at most {limits.MAX_SCALE_BITS} bits; "
                    f"{spec} has {spec.bits}"
                )
        if not (self.scale.is_float or self.scale.is_exponent):
            raise ValueError(
                f"{where}: the scale must be a float or exponent type, got {self.scale}"
            )
        if self.tenscale is not None:
            if not self.tenscale.is_float:
                raise ValueError(
                    f"{where}: a tensor scale must be a float type, got {self.tenscale}"
                )
            if self.scale.is_exponent:
                raise ValueError(
                    f"{where}: a tensor scale on top of exponent tile scales is not supported; "
                    f"use a float tile scale (e4m3fn_float32_t16)"
                )
            if not self.tiles:
                raise ValueError(f"{where}: a tensor scale on top of a tensor scale needs tiles")
        if self.zero is not None and self.zero.is_codebook:
            raise ValueError(f"{where}: a zero point cannot be a codebook")
        if len(self.tiles) > 2:
            raise ValueError(f"{where}: at most two tile codes (dim -2, dim -1)")
        if len(self.tiles) == 2 and all(t.is_channel for t in self.tiles):
            raise ValueError(f"{where}: a 2-D tile can hold at most one channel (t0) dimension")
        if sum(t.is_sparse for t in self.tiles) > 1:
            raise ValueError(f"{where}: N:M sparsity on at most one tile dimension")

    @property
    def name(self) -> str:
        """The canonical scale code."""
        parts = [str(s) for s in (self.scale, self.zero, self.tenscale) if s is not None]
        parts += [t.name for t in self.tiles]
        return "_".join(parts)

    def __str__(self) -> str:
        return self.name

    @property
    def family(self) -> str:
        """How tile scales are found: ``exponent``, ``zero`` or ``float``.

        ``exponent``: a power of two; ``zero``: a float scale and a zero point; ``float``:
        absmax / maxfloat, optionally over a tensor scale.
        """
        if self.scale.is_exponent:
            return "exponent"
        return "zero" if self.zero is not None else "float"

    @property
    def is_tensor(self) -> bool:
        """One scale for the whole tensor."""
        return not self.tiles

    @property
    def is_multiscale(self) -> bool:
        """A tensor scale on top of tile scales."""
        return self.tenscale is not None

    @property
    def is_2d(self) -> bool:
        """Tiles on the last two dimensions."""
        return len(self.tiles) == 2

    @property
    def subtile(self) -> tuple[int, int]:
        """(rows, cols) of a subtile, 0 when there is none."""
        if not self.tiles or not any(t.subtile for t in self.tiles):
            return (0, 0)
        if len(self.tiles) == 1:
            return (1, self.tiles[0].subtile)
        rows, cols = self.tiles
        return (rows.subtile or rows.size or 1, cols.subtile or cols.size or 1)

    @property
    def sparsity(self) -> tuple[int, int, int]:
        """(N, M, tile index) of the sparse dimension, or (0, 0, -1)."""
        for i, t in enumerate(self.tiles):
            if t.is_sparse:
                return (t.sparse_n, t.sparse_m, i)
        return (0, 0, -1)

    @classmethod
    def parse(cls, code: str, data: NumberSpec | str | None = None) -> ScaleSpec:
        """Parse a scale code; ``data`` (the element spec) resolves a second number code.

        Raises:
            ValueError: malformed code; the message names the part and the expected form.
        """
        if not isinstance(code, str):
            raise TypeError(f"a scale code must be a str, got {type(code).__name__}")
        text = limits.normalize(code)
        segments = text.split("_")
        if not text or any(not s for s in segments):
            raise ValueError(
                f"{code!r}: empty segment; expected 1-3 number codes then 0-2 tile codes "
                f"joined by '_' (e8m0_t32, float16_int8_t16n2m4)"
            )
        if isinstance(data, str):
            data = number_spec(data)
        return cls._parse(code, None if data is None else data.is_uint)

    @classmethod
    def _parse(cls, code: str, data_is_uint: bool | None) -> ScaleSpec:
        text = limits.normalize(code)
        segments = text.split("_")
        specs: list[NumberSpec] = []
        tiles: list[TileSpec] = []
        for seg in segments:
            if seg.startswith("t"):
                tiles.append(TileSpec.parse(seg, context=code))
                continue
            if tiles:
                raise ValueError(
                    f"{code!r}: number code {seg!r} after a tile code; numbers come first"
                )
            try:
                specs.append(number_spec(seg))
            except ValueError as err:
                raise ValueError(
                    f"{code!r}: segment {seg!r} is neither a tile nor a number: {err}"
                ) from None
        if not specs:
            raise ValueError(
                f"{code!r}: a scale code starts with the scale's number code (e8m0_t32)"
            )
        if len(specs) > 3:
            raise ValueError(f"{code!r}: at most three number codes (scale, zero, tensor scale)")
        zero = tenscale = None
        if len(specs) == 3:
            zero, tenscale = specs[1], specs[2]
        elif len(specs) == 2:
            second = specs[1]
            as_zero = second.is_int or second.is_uint if data_is_uint is None else data_is_uint
            zero, tenscale = (second, None) if as_zero else (None, second)
        try:
            return cls(scale=specs[0], zero=zero, tenscale=tenscale, tiles=tuple(tiles))
        except ValueError as err:
            raise ValueError(f"{code!r}: {str(err).split(': ', 1)[-1]}") from None


@functools.lru_cache(maxsize=512)
def _cached(code: str, data_is_uint: bool | None) -> ScaleSpec:
    return ScaleSpec._parse(code, data_is_uint)


def scale(code: str, data: NumberSpec | str | None = None) -> ScaleSpec:
    """Parse a scale code (see the module doc). ``data`` is the element spec, if known.

    Example:
        >>> str(scale("e8m0_t32"))
        'e8m0_t32'
        >>> scale("bfloat16_bfloat16_t0_t32", data="uint4").zero.name
        'bfloat16'

    Raises:
        ValueError: the code is malformed; the message names the part and the expected form.
    """
    if not isinstance(code, str):
        raise TypeError(f"a scale code must be a str, got {type(code).__name__}")
    if isinstance(data, str):
        data = number_spec(data)
    return _cached(code, None if data is None else data.is_uint)
